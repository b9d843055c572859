//! The claims journal: a tool claim is durable once it is appended to a small file beside the
//! database (`<db>-claims`), and reaches the database with the next group commit.
//!
//! WHY: a claim must be durable before its tool runs, and waits for no one. As a commit of
//! its own it rewrote whole 4 KiB pages (the tables' tails, the chat's heads page, the file
//! header) for a row of ~100 bytes: at light load (~420 turns/s) 1.1 commits per turn, and
//! 41.5 KiB written per turn to keep 6. Appended here it costs ~100 bytes and one `pwrite`,
//! and commits are left to the unhurried writes, which share them. It is the same durability
//! as a commit on this store: `synchronous=NORMAL` does not sync the WAL at commit either, so
//! both survive a process crash and both may lose the last instants to a power loss.
//!
//! Exactly once across stores and processes on one database: every claim takes the
//! journal's file lock, reads what other writers appended since it last looked, and looks the
//! key up in the database and in the journal, all under the lock; a key is appended only when
//! absent from both. A claim leaves the journal only when the file is reset, and the file is
//! reset only under the lock, after every claim in it is in the database.
//!
//! Format: a 16-byte header (`TSCJ`, format version, generation: a reset bumps it, so a
//! reader can tell its offset no longer applies), then records: payload length (u32 LE),
//! FNV-1a of the payload (u32 LE), payload = chat id and key (each u32 LE length, then
//! UTF-8), `started_at_ms` (i64 LE). Reading stops at the first record that is incomplete or
//! fails its checksum (a write torn by a power loss); the next append overwrites it.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use rusqlite::Connection;
use tracing::{error, info};

use crate::convert::now_ms;
use crate::db::{Db, Held};
use crate::tools::{self, Lookup};
use crate::{StoreError, ToolClaim};

const MAGIC: &[u8; 4] = b"TSCJ";
const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: u64 = 16;
/// Record prefix: payload length and checksum.
const RECORD_PREFIX: usize = 8;
/// Largest payload a reader accepts; anything larger is taken for garbage.
const MAX_PAYLOAD: usize = 1 << 20;
/// File size past which the journal is reset after a commit: resets are rare, and the file
/// (and the keys held for it) stay small.
const RESET_AFTER_BYTES: u64 = 256 * 1024;

/// Keys the journal holds, by chat (hashed per claim: foldhash, not SipHash).
type ClaimKeys =
    HashMap<Box<str>, HashSet<Box<str>, foldhash::fast::RandomState>, foldhash::fast::RandomState>;

/// One journaled claim.
#[derive(Debug, Clone, PartialEq)]
struct Claim {
    chat_id: Box<str>,
    key: Box<str>,
    started_at_ms: i64,
}

/// The journal of one writer thread (see the module docs).
pub(crate) struct ClaimsJournal {
    file: File,
    path: PathBuf,
    /// The generation of the file this journal has read.
    generation: u64,
    /// Where the valid records read or written so far end.
    end: u64,
    /// The keys of `uncommitted` and `others`, by chat: claims the database may not hold yet.
    /// WHY not every key in the file: a chat deleted and created again under the same id
    /// starts with no claims, and the database says so for the claims it holds.
    keys: ClaimKeys,
    /// Claims other writers appended to this generation. They may not be in the database
    /// yet, so they count as claimed here until a reset (which puts them in the database).
    others: Vec<Claim>,
    /// Claims this journal appended that no commit has put in the database yet.
    uncommitted: Vec<Claim>,
    /// The file's generation when the first of `uncommitted` was appended (see
    /// [`ClaimsJournal::insert_uncommitted`]).
    uncommitted_generation: u64,
}

impl std::fmt::Debug for ClaimsJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimsJournal")
            .field("path", &self.path)
            .field("generation", &self.generation)
            .field("end", &self.end)
            .field("uncommitted", &self.uncommitted.len())
            .finish_non_exhaustive()
    }
}

/// The journal's path for the database at `db`.
pub(crate) fn path_for(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-claims");
    PathBuf::from(name)
}

impl ClaimsJournal {
    /// Opens (creating) the journal of the database `db`, and first moves into the database
    /// (on `conn`) every claim a crashed writer left in it.
    pub(crate) fn open(db: &Path, conn: &Connection) -> Result<Self, StoreError> {
        let path = path_for(db);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| crate::sqlite_error::setup_io(&path, e))?;
        let mut journal = Self {
            file,
            path,
            generation: 0,
            end: HEADER_LEN,
            keys: ClaimKeys::default(),
            others: Vec::new(),
            uncommitted: Vec::new(),
            uncommitted_generation: 0,
        };
        journal.lock()?;
        let recovered = journal.recover(&Db::new(conn));
        journal.unlock();
        recovered?;
        Ok(journal)
    }

    /// Under the lock: puts every claim in the file into the database and resets the file.
    fn recover(&mut self, db: &Db<'_>) -> Result<(), StoreError> {
        let len = self.file_len()?;
        if len < HEADER_LEN {
            // New, or its creation was cut short: it cannot hold a claim.
            return self.reset(1);
        }
        let generation = self.read_generation()?;
        let (claims, _) = self.read_records(HEADER_LEN, len)?;
        if !claims.is_empty() {
            info!(claims = claims.len(), path = %self.path.display(), "claims journal: recovering claims");
            insert_all_absent(db, &claims)?;
        }
        self.reset(generation.wrapping_add(1))
    }

    /// Claims (chat, key) if no one has, with the claim durable in the journal on return.
    /// `None`: the database has no such chat (yet: its creation may be queued behind this
    /// claim), so the caller claims inside a transaction instead.
    pub(crate) fn claim(
        &mut self,
        db: &Db<'_>,
        chat_id: &str,
        key: &str,
    ) -> Result<Option<ToolClaim>, StoreError> {
        self.lock()?;
        let claimed = self.claim_locked(db, chat_id, key);
        self.unlock();
        claimed
    }

    fn claim_locked(
        &mut self,
        db: &Db<'_>,
        chat_id: &str,
        key: &str,
    ) -> Result<Option<ToolClaim>, StoreError> {
        self.catch_up()?;
        // Looked up under the lock: a claim leaves the journal only for the database, and
        // only under the lock, so between the two nothing is missed.
        match in_transaction(db, Held::Begin, |db| tools::lookup(db, chat_id, key))? {
            Lookup::UnknownChat => return Ok(None),
            Lookup::Found(answer) => return Ok(Some(answer)),
            Lookup::Absent(_) => {}
        }
        if self.holds(chat_id, key) {
            return Ok(Some(ToolClaim::AlreadyStarted));
        }
        let claim = Claim {
            chat_id: chat_id.into(),
            key: key.into(),
            started_at_ms: now_ms(),
        };
        let record = encode(&claim);
        write_all_at(&self.file, &record, self.end)
            .map_err(|e| self.io_error("append a claim to", e))?;
        self.end += record.len() as u64;
        remember(&mut self.keys, &claim);
        if self.uncommitted.is_empty() {
            self.uncommitted_generation = self.generation;
        }
        self.uncommitted.push(claim);
        Ok(Some(ToolClaim::Claimed))
    }

    /// True when claims wait for a commit to reach the database.
    pub(crate) fn has_uncommitted(&self) -> bool {
        !self.uncommitted.is_empty()
    }

    /// Inside a group transaction: writes the claims appended since the last commit into the
    /// database (those already there, or of a chat deleted since, are skipped). Only a
    /// transient error fails the transaction (the claims wait for the next one). Any other
    /// means the database holds the key in some form already (a row with a status it cannot
    /// read, an index entry): logged and skipped, rather than failing every later commit.
    ///
    /// Each claim was looked up and found absent when it was journaled, under the lock, and
    /// only a reset of the file puts another writer's journaled claims in the database. So
    /// when no writer has reset the file since the first of them was appended, they are
    /// written without a second look-up (a chat deleted since is still skipped).
    pub(crate) fn insert_uncommitted(&self, db: &Db<'_>) -> Result<(), StoreError> {
        let unreset =
            !self.uncommitted.is_empty() && self.unreset_since(self.uncommitted_generation);
        for claim in &self.uncommitted {
            let inserted = if unreset {
                insert_unless_chat_gone(db, claim)
            } else {
                insert_if_absent(db, claim)
            };
            match inserted {
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => error!(
                    error = %e,
                    chat_id = %claim.chat_id,
                    "journaled tool claim not written: the database holds its key already"
                ),
                Ok(()) => {}
            }
        }
        Ok(())
    }

    /// After a group transaction that ran [`ClaimsJournal::insert_uncommitted`] committed;
    /// resets the file once it is large (see [`RESET_AFTER_BYTES`]).
    pub(crate) fn committed(&mut self, db: &Db<'_>) {
        if !self.uncommitted.is_empty() {
            self.uncommitted.clear();
            // The database holds this writer's claims now; the others' still count.
            self.keys.clear();
            for claim in &self.others {
                remember(&mut self.keys, claim);
            }
        }
        if self.end >= RESET_AFTER_BYTES
            && let Err(e) = self.reset_when_stored(db)
        {
            // Nothing is lost: the file keeps its claims and the next commit tries again.
            error!(error = %e, path = %self.path.display(), "claims journal reset failed");
        }
    }

    /// Under the lock, outside any transaction: puts the other writers' claims in the
    /// database (this writer's are there already) and starts a new generation.
    fn reset_when_stored(&mut self, db: &Db<'_>) -> Result<(), StoreError> {
        self.lock()?;
        let reset = self.catch_up().and_then(|()| {
            if !self.others.is_empty() {
                insert_all_absent(db, &self.others)?;
            }
            self.reset(self.generation.wrapping_add(1))
        });
        self.unlock();
        reset
    }

    /// Reads what other writers appended since this journal last looked.
    fn catch_up(&mut self) -> Result<(), StoreError> {
        let generation = self.read_generation()?;
        let len = self.file_len()?;
        if generation != self.generation || len < self.end {
            // Another writer reset the file: every claim it held is in the database now.
            // (Shorter under the same generation only if it was cut down by hand: read it
            // again from the start.)
            self.generation = generation;
            self.end = HEADER_LEN;
            self.keys.clear();
            self.others.clear();
            // This writer's claims count until its next commit, whatever the file says.
            for claim in &self.uncommitted {
                remember(&mut self.keys, claim);
            }
        }
        if len > self.end {
            let (claims, end) = self.read_records(self.end, len)?;
            self.end = end;
            for claim in claims {
                remember(&mut self.keys, &claim);
                self.others.push(claim);
            }
        }
        Ok(())
    }

    /// Empties the file under a new `generation` (under the lock).
    fn reset(&mut self, generation: u64) -> Result<(), StoreError> {
        let mut header = [0u8; HEADER_LEN as usize];
        header[..4].copy_from_slice(MAGIC);
        header[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        header[8..].copy_from_slice(&generation.to_le_bytes());
        // The new generation first: cut short after it, the file still holds its old claims
        // (all in the database, so reading them again is harmless); cut short after the
        // truncation instead, another writer would see an old generation and a file shorter
        // than what it had read.
        write_all_at(&self.file, &header, 0)
            .and_then(|()| self.file.set_len(HEADER_LEN))
            .map_err(|e| self.io_error("reset", e))?;
        self.generation = generation;
        self.end = HEADER_LEN;
        self.keys.clear();
        self.others.clear();
        Ok(())
    }

    /// True when no writer has reset the file since `generation`. Read under the lock, taken
    /// without waiting: a writer holding it may be resetting (it writes the new generation
    /// after its claims are in the database), and then the answer is no.
    fn unreset_since(&self, generation: u64) -> bool {
        if self.file.try_lock().is_err() {
            return false;
        }
        let unreset = self
            .read_generation()
            .is_ok_and(|current| current == generation);
        self.unlock();
        unreset
    }

    /// True when another writer's journaled claim holds `key` (read by the last claim's
    /// catch-up): no job of this writer can complete it, so its "started" is final here.
    pub(crate) fn held_by_another_writer(&self, chat_id: &str, key: &str) -> bool {
        self.others
            .iter()
            .any(|claim| &*claim.chat_id == chat_id && &*claim.key == key)
    }

    fn holds(&self, chat_id: &str, key: &str) -> bool {
        self.keys
            .get(chat_id)
            .is_some_and(|keys| keys.contains(key))
    }

    fn read_generation(&self) -> Result<u64, StoreError> {
        let mut header = [0u8; HEADER_LEN as usize];
        read_exact_at(&self.file, &mut header, 0)
            .map_err(|e| self.io_error("read the header of", e))?;
        if &header[..4] != MAGIC
            || u32::from_le_bytes([header[4], header[5], header[6], header[7]]) != FORMAT_VERSION
        {
            return Err(StoreError::Setup(format!(
                "{} is not a claims journal of this version; it is kept beside the database \
                 by Tessera and must not be replaced",
                self.path.display()
            )));
        }
        let mut generation = [0u8; 8];
        generation.copy_from_slice(&header[8..]);
        Ok(u64::from_le_bytes(generation))
    }

    /// The valid records in `from..to`, and where they end.
    fn read_records(&self, from: u64, to: u64) -> Result<(Vec<Claim>, u64), StoreError> {
        let len = usize::try_from(to - from)
            .map_err(|_| StoreError::Corrupt(format!("{} is too large", self.path.display())))?;
        let mut bytes = vec![0u8; len];
        read_exact_at(&self.file, &mut bytes, from).map_err(|e| self.io_error("read", e))?;
        let (claims, used) = decode_all(&bytes);
        Ok((claims, from + used as u64))
    }

    fn file_len(&self) -> Result<u64, StoreError> {
        Ok(self
            .file
            .metadata()
            .map_err(|e| self.io_error("stat", e))?
            .len())
    }

    fn lock(&self) -> Result<(), StoreError> {
        self.file.lock().map_err(|e| self.io_error("lock", e))
    }

    fn unlock(&self) {
        // Closing the file would release it too; an unlock that fails leaves nothing to undo.
        if let Err(e) = self.file.unlock() {
            error!(error = %e, path = %self.path.display(), "claims journal unlock failed");
        }
    }

    fn io_error(&self, what: &str, e: std::io::Error) -> StoreError {
        let message = format!(
            "cannot {what} the claims journal {}: {e}",
            self.path.display()
        );
        match e.kind() {
            ErrorKind::NotFound | ErrorKind::PermissionDenied => StoreError::Setup(message),
            _ => StoreError::Transient(message),
        }
    }
}

/// Reads `buf.len()` bytes at `offset`: one `pread` on Unix; elsewhere a seek, then a read
/// (the writer thread owns the handle, so the position is its own).
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = file;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buf)
    }
}

/// Writes `buf` at `offset`, as [`read_exact_at`] reads.
fn write_all_at(file: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = file;
        file.seek(SeekFrom::Start(offset))?;
        file.write_all(buf)
    }
}

/// Adds `claim`'s key to `keys`.
fn remember(keys: &mut ClaimKeys, claim: &Claim) {
    keys.entry(claim.chat_id.clone())
        .or_default()
        .insert(claim.key.clone());
}

/// Writes `claim` unless the database holds its key already or does not know its chat.
fn insert_if_absent(db: &Db<'_>, claim: &Claim) -> Result<(), StoreError> {
    if let Lookup::Absent(heads) = tools::lookup(db, &claim.chat_id, &claim.key)? {
        tools::insert(db, &claim.chat_id, &heads, &claim.key, claim.started_at_ms)?;
    }
    Ok(())
}

/// Writes `claim`, known to be absent from the database, unless its chat is gone.
fn insert_unless_chat_gone(db: &Db<'_>, claim: &Claim) -> Result<(), StoreError> {
    match crate::log::heads(db, &claim.chat_id)? {
        Some(heads) => tools::insert(db, &claim.chat_id, &heads, &claim.key, claim.started_at_ms),
        None => Ok(()),
    }
}

/// Writes every claim of `claims` the database lacks, in one write transaction.
fn insert_all_absent(db: &Db<'_>, claims: &[Claim]) -> Result<(), StoreError> {
    in_transaction(db, Held::BeginImmediate, |db| {
        claims
            .iter()
            .try_for_each(|claim| insert_if_absent(db, claim))
    })
}

/// Runs `work` between `begin` (`BEGIN` for reads, `BEGIN IMMEDIATE` for writes) and a
/// `COMMIT`; when either fails the transaction is rolled back, so the writer's connection never
/// stays inside one. WHY reads in a transaction too: outside one each statement takes and
/// releases a WAL read lock of its own (`fcntl` calls on the shared-memory file), and a
/// look-up is up to three statements.
fn in_transaction<T>(
    db: &Db<'_>,
    begin: Held,
    work: impl FnOnce(&Db<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    db.begin(begin)?;
    let result = work(db).and_then(|value| {
        db.commit()?;
        Ok(value)
    });
    if result.is_err() {
        let _ = db.rollback();
    }
    result
}

/// FNV-1a, 32 bits: catches a torn or zero-filled tail, which is all it is for.
fn checksum(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

fn encode(claim: &Claim) -> Vec<u8> {
    let payload_len = 4 + claim.chat_id.len() + 4 + claim.key.len() + 8;
    let mut record = Vec::with_capacity(RECORD_PREFIX + payload_len);
    record.extend_from_slice(&(payload_len as u32).to_le_bytes());
    record.extend_from_slice(&[0; 4]);
    for text in [&claim.chat_id, &claim.key] {
        record.extend_from_slice(&(text.len() as u32).to_le_bytes());
        record.extend_from_slice(text.as_bytes());
    }
    record.extend_from_slice(&claim.started_at_ms.to_le_bytes());
    let sum = checksum(&record[RECORD_PREFIX..]);
    record[4..8].copy_from_slice(&sum.to_le_bytes());
    record
}

/// The valid records at the start of `bytes`, and how many bytes they take.
fn decode_all(bytes: &[u8]) -> (Vec<Claim>, usize) {
    let mut claims = Vec::new();
    let mut at = 0;
    while let Some((claim, used)) = decode(&bytes[at..]) {
        claims.push(claim);
        at += used;
    }
    (claims, at)
}

fn decode(bytes: &[u8]) -> Option<(Claim, usize)> {
    let u32_at = |at: usize| -> Option<u32> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let payload_len = u32_at(0)? as usize;
    if payload_len == 0 || payload_len > MAX_PAYLOAD {
        return None;
    }
    let payload = bytes.get(RECORD_PREFIX..RECORD_PREFIX + payload_len)?;
    if checksum(payload) != u32_at(4)? {
        return None;
    }
    let mut at = 0;
    let mut text = || -> Option<Box<str>> {
        let b = payload.get(at..at + 4)?;
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let text = std::str::from_utf8(payload.get(at + 4..at + 4 + len)?).ok()?;
        at += 4 + len;
        Some(text.into())
    };
    let chat_id = text()?;
    let key = text()?;
    let started = payload.get(at..at + 8)?;
    let mut started_at_ms = [0u8; 8];
    started_at_ms.copy_from_slice(started);
    if at + 8 != payload.len() {
        return None;
    }
    Some((
        Claim {
            chat_id,
            key,
            started_at_ms: i64::from_le_bytes(started_at_ms),
        },
        RECORD_PREFIX + payload_len,
    ))
}

/// A migrated database at `path` with chat "c1", through the store itself (tests of the
/// journal and of the writer; call it outside any async runtime).
#[cfg(test)]
pub(crate) fn database_with_a_chat(path: &Path) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use crate::ChatStore;
        let store = crate::SqliteStore::open(path).await.unwrap();
        store
            .create_chat(crate::ChatRecord {
                chat_id: "c1".into(),
                tenant: "t".into(),
                user_id: "u".into(),
                workflow: "w".into(),
                workflow_version: "v".into(),
                created_at_ms: 1,
            })
            .await
            .unwrap();
        store.close().await;
    });
}

/// The rows of claim `key` in the database of `conn` (tests of the journal and of the writer).
#[cfg(test)]
pub(crate) fn claim_rows(conn: &Connection, key: &str) -> i64 {
    conn.query_row(
        "SELECT COUNT(*) FROM tool_invocations WHERE invocation_key = ?",
        [key],
        |row| row.get(0),
    )
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(chat: &str, key: &str) -> Claim {
        Claim {
            chat_id: chat.into(),
            key: key.into(),
            started_at_ms: 1_700_000_000_123,
        }
    }

    /// Two writers on one file, driven step by step: one resets the journal while the
    /// other's claims are only in it. The reset puts them in the database first, the other
    /// notices the new generation (it appends at the new start, not at its old offset), and
    /// its own later insert of those claims writes no second row.
    #[test]
    fn a_reset_by_another_writer_keeps_its_claims_and_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        database_with_a_chat(&db);
        let (open_a, open_b) = (
            Connection::open(&db).unwrap(),
            Connection::open(&db).unwrap(),
        );
        let mut a = ClaimsJournal::open(&db, &open_a).unwrap();
        let mut b = ClaimsJournal::open(&db, &open_b).unwrap();
        let (conn_a, conn_b) = (Db::new(&open_a), Db::new(&open_b));

        assert_eq!(
            b.claim(&conn_b, "c1", "b-early").unwrap(),
            Some(ToolClaim::Claimed)
        );
        let keys: Vec<String> = (0..3_000)
            .map(|i| format!("a-{i:06}-{}", "x".repeat(60)))
            .collect();
        for key in &keys {
            assert_eq!(
                a.claim(&conn_a, "c1", key).unwrap(),
                Some(ToolClaim::Claimed)
            );
        }
        // b reads all of a's claims: its offset is now past 256 KiB.
        assert_eq!(
            b.claim(&conn_b, "c1", "b-late").unwrap(),
            Some(ToolClaim::Claimed)
        );
        assert_eq!(
            b.claim(&conn_b, "c1", &keys[7]).unwrap(),
            Some(ToolClaim::AlreadyStarted)
        );
        assert!(b.end > RESET_AFTER_BYTES);

        // a commits its claims, then resets: b's claims go into the database with it.
        in_transaction(&conn_a, Held::BeginImmediate, |conn| {
            a.insert_uncommitted(conn)
        })
        .unwrap();
        a.committed(&conn_a);
        assert_eq!(a.file_len().unwrap(), HEADER_LEN, "reset");
        assert_eq!(claim_rows(&conn_a, "b-early"), 1);
        assert_eq!(claim_rows(&conn_a, "b-late"), 1);

        assert_eq!(
            b.claim(&conn_b, "c1", "b-after").unwrap(),
            Some(ToolClaim::Claimed)
        );
        assert!(
            b.end < 1_024,
            "appended at the new generation's start: {}",
            b.end
        );
        assert_eq!(
            b.claim(&conn_b, "c1", &keys[2_999]).unwrap(),
            Some(ToolClaim::AlreadyStarted)
        );
        assert_eq!(
            a.claim(&conn_a, "c1", "b-after").unwrap(),
            Some(ToolClaim::AlreadyStarted)
        );

        in_transaction(&conn_b, Held::BeginImmediate, |conn| {
            b.insert_uncommitted(conn)
        })
        .unwrap();
        b.committed(&conn_b);
        for key in ["b-early", "b-late", "b-after", keys[0].as_str()] {
            assert_eq!(claim_rows(&conn_b, key), 1, "{key}");
        }
    }

    #[test]
    fn records_read_back_as_written() {
        let written = [claim("c1", "turn-1:call-a"), claim("chät-2", "ключ")];
        let bytes: Vec<u8> = written.iter().flat_map(encode).collect();
        let (read, used) = decode_all(&bytes);
        assert_eq!(read, written);
        assert_eq!(used, bytes.len());
    }

    #[test]
    fn reading_stops_before_a_torn_or_zeroed_tail() {
        let first = encode(&claim("c1", "k1"));
        let second = encode(&claim("c1", "k2"));
        for cut in 1..second.len() {
            let mut bytes = first.clone();
            bytes.extend_from_slice(&second[..cut]);
            let (read, used) = decode_all(&bytes);
            assert_eq!(read, [claim("c1", "k1")], "cut at {cut}");
            assert_eq!(used, first.len());
        }
        let mut zeroed = first.clone();
        zeroed.extend_from_slice(&[0; 64]);
        assert_eq!(decode_all(&zeroed).1, first.len());
        let mut flipped = first.clone();
        flipped.extend_from_slice(&second);
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(
            decode_all(&flipped).0.len(),
            1,
            "a changed byte fails the checksum"
        );
    }
}
