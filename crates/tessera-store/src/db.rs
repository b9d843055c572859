//! The SQLite writer's connection, with the statements every flush runs held prepared.
//!
//! WHY: rusqlite's `prepare_cached` hashes the statement's text, copies it into a new
//! `Arc<str>` key and moves the statement out of its LRU and back on every call. A turn's
//! flush and tool claims made ~16 such calls; holding those statements instead cut 13.6
//! allocations and 1.4% of the server's instructions per turn (docs/performance-log.md, issue 14,
//! twenty-third session). A statement held here is prepared once for the connection's life
//! and found by its [`Held`] name.
//!
//! Everything else still goes through `prepare_cached` on the same connection: a [`Db`]
//! derefs to its `Connection`, so a store function that is not on the hot path keeps taking
//! `&Connection`.
//!
//! A [`Db`] also keeps the chats' `chat_heads` rows it has read or written, for the
//! transactions it begins itself ([`Db::begin`]). WHY: a turn looked its chat's heads up ~4
//! times (a tool claim, its row, its completion, each flush), at ~7,300 instructions a
//! look-up through the chat-id index: 6-7% of a turn's instructions (docs/performance-log.md,
//! twenty-seventh session). The rows stay right because every change to them on this
//! connection goes through [`Db::remember_heads`] or [`Db::forget_heads`], a rollback forgets
//! them all, and a transaction that finds another connection's commit since the last one
//! (`PRAGMA data_version`, which counts only other connections' commits) forgets them too.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ops::Deref;

use rusqlite::{Connection, Statement};

use crate::StoreError;
use crate::log::Heads;

/// Chats whose heads a [`Db`] keeps; one more forgets them all. WHY a plain map emptied when
/// full rather than an LRU: a look-up then touches no list, and a busy server's active chats
/// (10,000 in the load runs) fit many times over; past this many the rows are read again.
const HEADS_KEPT: usize = 65_536;

/// The statements a [`Db`] holds prepared. Their SQL stays beside the code that runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// `log::heads`: a chat's `chat_heads` row by its id.
    ChatHeads,
    /// `log::append`: a new `chat_log` row.
    AppendLog,
    /// `log::append`: the chat's heads moved to that row.
    MoveLogHead,
    /// `tools::find`: one claim of a chat's chain.
    ClaimInChain,
    /// `tools::find`: a claim by the index of older keys.
    ClaimByIndex,
    /// `tools::insert`: a new 'started' claim.
    InsertClaim,
    /// `tools::insert`: the chat's chain of claims moved to it.
    MoveClaimsHead,
    /// `tools::complete`: a claim completed with its result.
    CompleteClaim,
    /// `tools::complete`: the chat's newest claim, or the one before it, completed if it is
    /// the key's.
    CompleteRecentClaim,
    /// [`Db::begin`]: a read transaction's start (a claim's look-up in `claims_journal`).
    Begin,
    /// [`Db::begin`]: a write transaction's start (the writer's group, recovered claims).
    BeginImmediate,
    /// [`Db::commit`]: either's end.
    Commit,
    /// [`Db::begin`]: whether another connection committed since this one last looked.
    DataVersion,
}

impl Held {
    const COUNT: usize = Self::DataVersion as usize + 1;

    fn sql(self) -> &'static str {
        match self {
            Self::ChatHeads => crate::log::HEADS_SQL,
            Self::AppendLog => crate::log::APPEND_SQL,
            Self::MoveLogHead => crate::log::MOVE_HEAD_SQL,
            Self::ClaimInChain => crate::tools::CLAIM_IN_CHAIN_SQL,
            Self::ClaimByIndex => crate::tools::CLAIM_BY_INDEX_SQL,
            Self::InsertClaim => crate::tools::INSERT_CLAIM_SQL,
            Self::MoveClaimsHead => crate::tools::MOVE_CLAIMS_HEAD_SQL,
            Self::CompleteClaim => crate::tools::COMPLETE_CLAIM_SQL,
            Self::CompleteRecentClaim => crate::tools::COMPLETE_RECENT_CLAIM_SQL,
            Self::Begin => "BEGIN",
            Self::BeginImmediate => "BEGIN IMMEDIATE",
            Self::Commit => "COMMIT",
            Self::DataVersion => "PRAGMA data_version",
        }
    }
}

/// A connection and its [`Held`] statements, each prepared on first use.
pub(crate) struct Db<'c> {
    conn: &'c Connection,
    /// Indexed by `Held as usize`. A `RefCell` each, so a statement in use further up the
    /// stack is never handed out twice (the second user gets one from rusqlite's cache).
    held: [RefCell<Option<Statement<'c>>>; Held::COUNT],
    /// Chats' heads as this connection last read or wrote them, by chat id.
    heads: RefCell<HashMap<Box<str>, Heads, foldhash::fast::RandomState>>,
    /// `PRAGMA data_version` at the start of the last transaction [`Db::begin`] began.
    data_version: Cell<Option<i64>>,
    /// True between [`Db::begin`] and its commit or rollback: only then are the kept heads
    /// known to be current.
    in_checked_transaction: Cell<bool>,
}

impl<'c> Db<'c> {
    /// `conn` with no statement prepared yet.
    pub(crate) fn new(conn: &'c Connection) -> Self {
        Self {
            conn,
            held: std::array::from_fn(|_| RefCell::new(None)),
            heads: RefCell::new(HashMap::default()),
            data_version: Cell::new(None),
            in_checked_transaction: Cell::new(false),
        }
    }

    /// Begins a transaction with `begin` (`Held::Begin` or `Held::BeginImmediate`), and
    /// forgets the kept heads when another connection has committed since the last one.
    /// WHY the check inside the transaction: its first read fixes the snapshot the heads
    /// must match, and `data_version` is that read.
    pub(crate) fn begin(&self, begin: Held) -> Result<(), StoreError> {
        self.with(begin, |statement| Ok(statement.execute([])?))?;
        let version = self.with(Held::DataVersion, |statement| {
            Ok(statement.query_row([], |row| row.get::<_, i64>(0))?)
        });
        let version = match version {
            Ok(version) => version,
            Err(e) => {
                let _ = self.rollback();
                return Err(e);
            }
        };
        if self.data_version.replace(Some(version)) != Some(version) {
            self.heads.borrow_mut().clear();
        }
        self.in_checked_transaction.set(true);
        Ok(())
    }

    /// Commits the transaction [`Db::begin`] began. On failure the caller rolls back.
    pub(crate) fn commit(&self) -> Result<(), StoreError> {
        self.in_checked_transaction.set(false);
        self.with(Held::Commit, |statement| {
            Ok(statement.execute([]).map(|_| ())?)
        })
        .inspect_err(|_| self.heads.borrow_mut().clear())
    }

    /// Rolls the open transaction back, and forgets the kept heads, which may hold its
    /// changes (whether or not the rollback succeeds).
    pub(crate) fn rollback(&self) -> Result<(), StoreError> {
        self.in_checked_transaction.set(false);
        self.heads.borrow_mut().clear();
        Ok(self.conn.execute_batch("ROLLBACK")?)
    }

    /// After a rollback to a savepoint: the kept heads may hold what it undid.
    pub(crate) fn forget_all_heads(&self) {
        self.heads.borrow_mut().clear();
    }

    /// The heads of `chat_id` as last read or written, inside a transaction [`Db::begin`]
    /// began; `None` when not kept (or outside one).
    pub(crate) fn kept_heads(&self, chat_id: &str) -> Option<Heads> {
        if !self.in_checked_transaction.get() {
            return None;
        }
        self.heads.borrow().get(chat_id).copied()
    }

    /// `heads` are what `chat_id`'s `chat_heads` row now holds, read or just written on this
    /// connection. Outside a transaction [`Db::begin`] began they are not kept, and what was
    /// kept is forgotten (it may be older).
    pub(crate) fn remember_heads(&self, chat_id: &str, heads: Heads) {
        let mut kept = self.heads.borrow_mut();
        if !self.in_checked_transaction.get() {
            kept.remove(chat_id);
            return;
        }
        if let Some(slot) = kept.get_mut(chat_id) {
            *slot = heads;
            return;
        }
        if kept.len() >= HEADS_KEPT {
            kept.clear();
        }
        kept.insert(chat_id.into(), heads);
    }

    /// `chat_id`'s heads row is gone or about to change in a way not remembered (deletion).
    pub(crate) fn forget_heads(&self, chat_id: &str) {
        self.heads.borrow_mut().remove(chat_id);
    }

    /// Runs `run` with the statement `which`. Its bindings are cleared afterwards, as
    /// rusqlite's cache does, so a held statement does not keep the last bound text alive.
    pub(crate) fn with<R>(
        &self,
        which: Held,
        run: impl FnOnce(&mut Statement<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let Ok(mut slot) = self.held[which as usize].try_borrow_mut() else {
            return run(&mut *self.conn.prepare_cached(which.sql())?);
        };
        let statement = match &mut *slot {
            Some(statement) => statement,
            empty @ None => empty.insert(self.conn.prepare(which.sql())?),
        };
        let result = run(statement);
        statement.clear_bindings();
        result
    }

    /// How many statements are prepared and held.
    #[cfg(test)]
    fn prepared(&self) -> usize {
        self.held
            .iter()
            .filter(|slot| slot.borrow().is_some())
            .count()
    }
}

impl Deref for Db<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> Connection {
        let conn = Connection::open_in_memory().expect("in-memory database");
        conn.execute_batch("CREATE TABLE t (x INTEGER NOT NULL)")
            .expect("table");
        conn
    }

    /// `Held::Begin` and `Held::Commit` stand in for any statement: what is tested is the
    /// holding.
    #[test]
    fn a_statement_is_prepared_once_and_reused() {
        let conn = scratch();
        let db = Db::new(&conn);
        assert_eq!(db.prepared(), 0);
        for _ in 0..3 {
            db.with(Held::Begin, |s| Ok(s.execute([])?)).expect("begin");
            conn.execute("INSERT INTO t (x) VALUES (1)", [])
                .expect("insert");
            db.with(Held::Commit, |s| Ok(s.execute([])?))
                .expect("commit");
        }
        assert_eq!(db.prepared(), 2);
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("count");
        assert_eq!(rows, 3, "each use ran the statement");
    }

    #[test]
    fn a_statement_in_use_is_not_handed_out_twice() {
        let conn = scratch();
        let db = Db::new(&conn);
        let nested = db
            .with(Held::Begin, |outer| {
                outer.execute([])?;
                // The same statement asked for again while `outer` is in use: a second one.
                db.with(Held::Begin, |inner| {
                    assert_ne!(
                        std::ptr::from_mut(inner).cast::<()>(),
                        std::ptr::from_mut(outer).cast::<()>()
                    );
                    Ok(())
                })
            })
            .and_then(|()| db.with(Held::Commit, |s| Ok(s.execute([])?)));
        assert!(nested.is_ok(), "{nested:?}");
    }

    #[test]
    fn a_failed_statement_stays_usable() {
        let conn = scratch();
        let db = Db::new(&conn);
        // COMMIT outside a transaction fails...
        assert!(db.with(Held::Commit, |s| Ok(s.execute([])?)).is_err());
        // ...and is reset: the held statement runs again once there is one.
        db.with(Held::Begin, |s| Ok(s.execute([])?)).expect("begin");
        db.with(Held::Commit, |s| Ok(s.execute([])?))
            .expect("commit after a failed commit");
        assert_eq!(db.prepared(), 2);
    }
}
