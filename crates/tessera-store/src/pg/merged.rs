//! The fast path of a group commit: the whole group's chat writes as ONE call of the
//! `tessera_commit_group` function (migrations/postgres/0009_commit_group.sql, and its overload
//! in 0011_seqs_taken.sql that also marks seqs taken), which runs one statement per table over
//! arrays of every job's rows (`UNNEST`ed), as its own transaction.
//!
//! WHY: a turn sends the writer 4-5 jobs (flushes, a tool claim, its completion). Run one by
//! one, each job costs PostgreSQL a statement of its own (executor start-up, a round trip, a
//! commit-group share) and Tessera an encode and a decode; merged, a group of hundreds of
//! jobs costs a handful of statements, each inserting many rows. And as one call, a group
//! costs one round trip instead of up to ten (BEGIN, a statement per table, COMMIT): at light
//! load a group is one turn, and each round trip wakes a PostgreSQL backend and the writer.
//!
//! Same outcome as the jobs one by one, or nothing: [`run`] answers `Ok(None)` (or the call
//! fails, and nothing of it is kept) when any job would fail on its own (a stale epoch, an
//! unknown chat, a duplicate row, a completion without its claim), and the writer then re-runs
//! the group job by job, so that job alone fails with its precise error (`writer.rs`). Groups
//! with other kinds of jobs (chat creation, secrets, deletes) always run job by job: they are
//! rare and their order against a chat's other writes matters.

use std::collections::{BTreeSet, HashMap, HashSet};

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::writes::{Done, Write, claim_of_record};
use crate::convert::{now_ms, u64_to_sql};
use crate::{ChatState, ChatWriteBatch, PendingUiRecord, STATUS_COMPLETED, StoreError, ToolClaim};

/// Whether [`run`] can take `group`: only batches, claims and completions, and no
/// invocation claimed or completed twice (their order within a group would matter).
pub(crate) fn fits<'a>(group: impl IntoIterator<Item = &'a Write>) -> bool {
    let mut invocations = HashSet::new();
    group.into_iter().all(|write| match write {
        Write::Batch { .. } => true,
        Write::ClaimTool { chat_id, key, .. } | Write::CompleteTool { chat_id, key, .. } => {
            invocations.insert((chat_id.as_str(), key.as_str()))
        }
        _ => false,
    })
}

/// SQLSTATE the function raises when a job of the group would fail on its own.
const JOB_WOULD_FAIL: &str = "TS001";

/// Commits every write of `group` (which [`fits`]) as one call in its own transaction: one
/// answer per write in order, or `Ok(None)` when some write would fail on its own and nothing
/// was written (see the module docs). Run outside a transaction: the call is one.
pub(crate) async fn run(
    conn: &mut PgConnection,
    group: &[&Write],
) -> Result<Option<Vec<Result<Done, StoreError>>>, StoreError> {
    let rows = GroupRows::of(group)?;
    let settled = match rows.commit(conn).await {
        Ok(settled) => settled,
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(JOB_WOULD_FAIL) => {
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    // Committed: from here on every job has its answer, whatever it is (never `Err` or
    // `None`, which would make the writer run the group again).
    let mut claims: Vec<Option<Result<ToolClaim, StoreError>>> =
        group.iter().map(|_| None).collect();
    let read = read_claims(&settled, group, &mut claims);
    let answers = group
        .iter()
        .zip(claims)
        .map(|(write, claim)| match write {
            Write::ClaimTool { chat_id, .. } => match (&read, claim) {
                // Unreadable answers: the tool must not run on a guess.
                (Err(e), _) => Err(StoreError::Corrupt(format!("tool claim answer: {e}"))),
                (Ok(()), Some(claim)) => claim.map(Done::Claim),
                // Its record vanished between the insert and the read: the chat was deleted.
                (Ok(()), None) => Err(StoreError::NotFound(chat_id.clone())),
            },
            _ => Ok(Done::Unit),
        })
        .collect();
    Ok(Some(answers))
}

/// Puts each settled claim's answer from the call's `rows` at its write's place in `claims`.
fn read_claims(
    rows: &[PgRow],
    group: &[&Write],
    claims: &mut [Option<Result<ToolClaim, StoreError>>],
) -> Result<(), StoreError> {
    let place: HashMap<(&str, &str), usize> = group
        .iter()
        .enumerate()
        .filter_map(|(i, write)| match write {
            Write::ClaimTool { chat_id, key, .. } => Some(((chat_id.as_str(), key.as_str()), i)),
            _ => None,
        })
        .collect();
    for row in rows {
        let chat_id: &str = row.try_get("claim_chat")?;
        let key: &str = row.try_get("claim_key")?;
        let Some(&i) = place.get(&(chat_id, key)) else {
            continue;
        };
        claims[i] = Some(if row.try_get("won")? {
            Ok(ToolClaim::Claimed)
        } else {
            let status: Option<&str> = row.try_get("claim_status")?;
            let result: Option<&str> = row.try_get("claim_result")?;
            claim_of_record(key, status.unwrap_or_default(), result)
        });
    }
    Ok(())
}

/// Every row the group writes, by table.
#[derive(Default)]
struct GroupRows<'a> {
    fence: Fence<'a>,
    chats: Chats<'a>,
    messages: Messages<'a>,
    events: Events<'a>,
    pending: Pending<'a>,
    states: States<'a>,
    claims: Claims<'a>,
    completions: Completions<'a>,
    /// Each chat's last mark of seqs taken in the group.
    taken: Taken<'a>,
}

impl<'a> GroupRows<'a> {
    fn of(group: &[&'a Write]) -> Result<Self, StoreError> {
        let mut rows = GroupRows::default();
        // A chat's later batch overrides its earlier ones (state; a UI call put, then removed).
        let mut states: HashMap<&'a str, &'a ChatState> = HashMap::new();
        let mut pending: HashMap<(&'a str, &'a str), Option<&'a PendingUiRecord>> = HashMap::new();
        let mut taken: HashMap<&'a str, i64> = HashMap::new();
        for write in group {
            match write {
                Write::Batch { chat_id, batch } => {
                    rows.fence.add(chat_id, batch.epoch);
                    if !(batch.messages.is_empty()
                        && batch.events.is_empty()
                        && batch.put_pending.is_empty())
                    {
                        rows.chats.adds_rows.insert(chat_id);
                    }
                    rows.messages.add(chat_id, batch)?;
                    rows.events.add(chat_id, batch)?;
                    // As one batch alone: a call put and removed in the same batch is removed
                    // (never stored), and of several puts of one corr the last wins.
                    for record in &batch.put_pending {
                        if !batch.remove_pending.contains(&record.corr) {
                            pending.insert((chat_id, &record.corr), Some(record));
                        }
                    }
                    for corr in &batch.remove_pending {
                        pending.insert((chat_id, corr), None);
                    }
                    if let Some(state) = &batch.state {
                        states.insert(chat_id, state);
                    }
                    if let Some(seq) = batch.seqs_taken_through {
                        taken.insert(chat_id, u64_to_sql(seq, "event seq")?);
                    }
                }
                Write::ClaimTool {
                    chat_id,
                    key,
                    epoch,
                } => {
                    rows.fence.add(chat_id, *epoch);
                    rows.chats.adds_rows.insert(chat_id);
                    rows.claims.chat_id.push(chat_id);
                    rows.claims.key.push(key);
                }
                Write::CompleteTool {
                    chat_id,
                    key,
                    result,
                    epoch,
                } => {
                    rows.fence.add(chat_id, *epoch);
                    rows.completions.chat_id.push(chat_id);
                    rows.completions.key.push(key);
                    rows.completions.result.push(result);
                }
                // `fits` let no other kind through; refusing keeps the group's outcome exact.
                _ => {
                    return Err(StoreError::Corrupt(
                        "unmergeable write in a merged group".into(),
                    ));
                }
            }
        }
        let mut pending: Vec<_> = pending.into_iter().collect();
        // Rows in key order, as a job-by-job group would touch them (no lock-order surprises).
        pending.sort_unstable_by_key(|(key, _)| *key);
        for ((chat_id, corr), record) in pending {
            match record {
                Some(record) => rows.pending.put(chat_id, record)?,
                None => {
                    rows.pending.removed_chat_id.push(chat_id);
                    rows.pending.removed_corr.push(corr);
                }
            }
        }
        let mut states: Vec<_> = states.into_iter().collect();
        states.sort_unstable_by_key(|(chat_id, _)| *chat_id);
        for (chat_id, state) in states {
            // Its state update locks the chat's row, and finds an unknown chat.
            rows.chats.adds_rows.remove(chat_id);
            rows.states.add(chat_id, state)?;
        }
        let mut taken: Vec<_> = taken.into_iter().collect();
        taken.sort_unstable_by_key(|(chat_id, _)| *chat_id);
        (rows.taken.chat_id, rows.taken.seq) = taken.into_iter().unzip();
        Ok(rows)
    }

    /// Calls `tessera_commit_group` with every row: one row per claim it settled (see the
    /// migration), or the error that rolled all of it back.
    async fn commit(&self, conn: &mut PgConnection) -> Result<Vec<PgRow>, sqlx::Error> {
        let adds_rows: Vec<&str> = self.chats.adds_rows.iter().copied().collect();
        let (m, e, p, s) = (&self.messages, &self.events, &self.pending, &self.states);
        sqlx::query(
            "SELECT claim_chat, claim_key, won, claim_status, claim_result \
             FROM tessera_commit_group($1::TEXT[], $2::BIGINT[], $3::TEXT[], \
             $4::TEXT[], $5::BIGINT[], $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::TEXT[], \
             $10::BOOLEAN[], $11::TEXT[], \
             $12::TEXT[], $13::BIGINT[], $14::TEXT[], $15::TEXT[], \
             $16::TEXT[], $17::TEXT[], $18::TEXT[], $19::TEXT[], $20::BIGINT[], $21::BIGINT[], \
             $22::TEXT[], $23::TEXT[], \
             $24::TEXT[], $25::TEXT[], $26::TEXT[], $27::BIGINT[], $28::BIGINT[], $29::TEXT[], \
             $30::BIGINT[], $31, \
             $32::TEXT[], $33::TEXT[], \
             $34::TEXT[], $35::TEXT[], $36::TEXT[], \
             $37, $38::TEXT[], $39::BIGINT[])",
        )
        .bind(&self.fence.chat_id)
        .bind(&self.fence.epoch)
        .bind(&adds_rows)
        .bind(&m.chat_id)
        .bind(&m.idx)
        .bind(&m.message_id)
        .bind(&m.role)
        .bind(&m.agent)
        .bind(&m.content)
        .bind(&m.ui_hidden)
        .bind(&m.raw)
        .bind(&e.chat_id)
        .bind(&e.seq)
        .bind(&e.event_type)
        .bind(&e.json)
        .bind(&p.chat_id)
        .bind(&p.corr)
        .bind(&p.turn_key)
        .bind(&p.call)
        .bind(&p.created_at_ms)
        .bind(&p.timeout_at_ms)
        .bind(&p.removed_chat_id)
        .bind(&p.removed_corr)
        .bind(&s.chat_id)
        .bind(&s.status)
        .bind(&s.current_agent)
        .bind(&s.turn)
        .bind(&s.consecutive)
        .bind(&s.context)
        .bind(&s.updated_at_ms)
        .bind(STATUS_COMPLETED)
        .bind(&self.claims.chat_id)
        .bind(&self.claims.key)
        .bind(&self.completions.chat_id)
        .bind(&self.completions.key)
        .bind(&self.completions.result)
        .bind(now_ms())
        .bind(&self.taken.chat_id)
        .bind(&self.taken.seq)
        .fetch_all(conn)
        .await
    }
}

/// The `(chat, epoch)` leases the group's fenced writes need (the call locks their rows
/// `FOR SHARE` until COMMIT, in chat id order like a renewal: a takeover waits for the group
/// to be durable).
#[derive(Default)]
struct Fence<'a> {
    chat_id: Vec<&'a str>,
    epoch: Vec<i64>,
    seen: HashSet<(&'a str, i64)>,
}

impl<'a> Fence<'a> {
    fn add(&mut self, chat_id: &'a str, epoch: Option<i64>) {
        if let Some(epoch) = epoch
            && self.seen.insert((chat_id, epoch))
        {
            self.chat_id.push(chat_id);
            self.epoch.push(epoch);
        }
    }
}

/// The chats the group adds rows to without updating their state (the state update locks
/// the row and counts the chats it found): they must exist, and stay until COMMIT (the call
/// locks them `FOR KEY SHARE`, the lock a foreign key takes: a concurrent delete waits).
#[derive(Default)]
struct Chats<'a> {
    adds_rows: BTreeSet<&'a str>,
}

#[derive(Default)]
struct Messages<'a> {
    chat_id: Vec<&'a str>,
    idx: Vec<i64>,
    message_id: Vec<&'a str>,
    role: Vec<&'a str>,
    agent: Vec<Option<&'a str>>,
    content: Vec<&'a str>,
    ui_hidden: Vec<bool>,
    raw: Vec<&'a str>,
}

impl<'a> Messages<'a> {
    fn add(&mut self, chat_id: &'a str, batch: &'a ChatWriteBatch) -> Result<(), StoreError> {
        for message in &batch.messages {
            self.chat_id.push(chat_id);
            self.idx.push(u64_to_sql(message.idx, "message idx")?);
            self.message_id.push(&message.message_id);
            self.role.push(&message.role);
            self.agent.push(message.agent.as_deref());
            self.content.push(&message.content);
            self.ui_hidden.push(message.ui_hidden);
            self.raw.push(message.raw.get());
        }
        Ok(())
    }
}

#[derive(Default)]
struct Events<'a> {
    chat_id: Vec<&'a str>,
    seq: Vec<i64>,
    event_type: Vec<&'a str>,
    json: Vec<&'a str>,
}

impl<'a> Events<'a> {
    fn add(&mut self, chat_id: &'a str, batch: &'a ChatWriteBatch) -> Result<(), StoreError> {
        for event in &batch.events {
            self.chat_id.push(chat_id);
            self.seq.push(u64_to_sql(event.seq, "event seq")?);
            self.event_type.push(&event.event_type);
            self.json.push(&event.json);
        }
        Ok(())
    }
}

/// Pending UI calls: the group's net effect per `(chat, corr)`, put or removed.
#[derive(Default)]
struct Pending<'a> {
    chat_id: Vec<&'a str>,
    corr: Vec<&'a str>,
    turn_key: Vec<&'a str>,
    call: Vec<String>,
    created_at_ms: Vec<i64>,
    timeout_at_ms: Vec<Option<i64>>,
    removed_chat_id: Vec<&'a str>,
    removed_corr: Vec<&'a str>,
}

impl<'a> Pending<'a> {
    fn put(&mut self, chat_id: &'a str, record: &'a PendingUiRecord) -> Result<(), StoreError> {
        self.chat_id.push(chat_id);
        self.corr.push(&record.corr);
        self.turn_key.push(&record.turn_key);
        self.call.push(serde_json::to_string(&record.call)?);
        self.created_at_ms.push(record.created_at_ms);
        self.timeout_at_ms.push(record.timeout_at_ms);
        Ok(())
    }
}

/// Each chat's latest state in the group.
#[derive(Default)]
struct States<'a> {
    chat_id: Vec<&'a str>,
    status: Vec<&'a str>,
    current_agent: Vec<&'a str>,
    turn: Vec<i64>,
    consecutive: Vec<i64>,
    context: Vec<String>,
    updated_at_ms: Vec<i64>,
}

impl<'a> States<'a> {
    fn add(&mut self, chat_id: &'a str, state: &'a ChatState) -> Result<(), StoreError> {
        self.chat_id.push(chat_id);
        self.status.push(&state.status);
        self.current_agent.push(&state.current_agent);
        self.turn.push(i64::from(state.turn));
        self.consecutive.push(i64::from(state.consecutive));
        self.context.push(serde_json::to_string(&state.context)?);
        self.updated_at_ms.push(state.updated_at_ms);
        Ok(())
    }
}

#[derive(Default)]
struct Claims<'a> {
    chat_id: Vec<&'a str>,
    key: Vec<&'a str>,
}

#[derive(Default)]
struct Completions<'a> {
    chat_id: Vec<&'a str>,
    key: Vec<&'a str>,
    result: Vec<&'a str>,
}

#[derive(Default)]
struct Taken<'a> {
    chat_id: Vec<&'a str>,
    seq: Vec<i64>,
}
