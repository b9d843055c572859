//! The fast path of a group commit: the whole group's chat writes as ONE statement per table
//! (arrays of every job's rows, `UNNEST`ed), instead of one statement per job.
//!
//! WHY: a turn sends the writer 4-5 jobs (flushes, a tool claim, its completion). Run one by
//! one, each job costs PostgreSQL a statement of its own (executor start-up, a round trip, a
//! commit-group share) and Tessera an encode and a decode; merged, a group of hundreds of
//! jobs costs a handful of statements, each inserting many rows.
//!
//! Same outcome as the jobs one by one, or nothing: [`run`] answers `Ok(None)` (or a statement
//! fails) when any job would fail on its own (a stale epoch, an unknown chat, a duplicate row,
//! a completion without its claim), and the writer then rolls back and re-runs the group job
//! by job, so that job alone fails with its precise error (`writer.rs`). Groups with other
//! kinds of jobs (chat creation, secrets, deletes) always run job by job: they are rare and
//! their order against a chat's other writes matters.

use std::collections::{BTreeSet, HashMap, HashSet};

use sqlx::{PgConnection, Row};

use super::writes::{Done, Write, existing_claim};
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

/// Runs every write of `group` (which [`fits`]) inside the open transaction: one answer per
/// write in order, or `None` when some write would fail on its own (see the module docs).
pub(crate) async fn run(
    conn: &mut PgConnection,
    group: &[&Write],
) -> Result<Option<Vec<Done>>, StoreError> {
    let rows = GroupRows::of(group)?;
    if !rows.fence.holds(conn).await? || !rows.chats.exist(conn).await? {
        return Ok(None);
    }
    rows.messages.insert(conn).await?;
    rows.events.insert(conn).await?;
    rows.pending.write(conn).await?;
    if !rows.states.update(conn).await? {
        return Ok(None);
    }
    let Some(claims) = rows.claims.insert(conn).await? else {
        return Ok(None);
    };
    if !rows.completions.update(conn).await? {
        return Ok(None);
    }
    let mut claims = claims.into_iter();
    let mut answers = Vec::with_capacity(group.len());
    for write in group {
        answers.push(match write {
            Write::ClaimTool { .. } => match claims.next() {
                Some(claim) => Done::Claim(claim),
                None => return Ok(None),
            },
            _ => Done::Unit,
        });
    }
    Ok(Some(answers))
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
}

impl<'a> GroupRows<'a> {
    fn of(group: &[&'a Write]) -> Result<Self, StoreError> {
        let mut rows = GroupRows::default();
        // A chat's later batch overrides its earlier ones (state; a UI call put, then removed).
        let mut states: HashMap<&'a str, &'a ChatState> = HashMap::new();
        let mut pending: HashMap<(&'a str, &'a str), Option<&'a PendingUiRecord>> = HashMap::new();
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
        Ok(rows)
    }
}

/// The `(chat, epoch)` leases the group's fenced writes need.
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

    /// Locks every needed lease row `FOR SHARE` (until COMMIT: a takeover waits for the group
    /// to be durable), in chat id order like a renewal; true when all are there.
    async fn holds(&self, conn: &mut PgConnection) -> Result<bool, StoreError> {
        if self.chat_id.is_empty() {
            return Ok(true);
        }
        let locked = sqlx::query(
            "SELECT l.chat_id FROM chat_leases AS l \
             JOIN UNNEST($1::TEXT[], $2::BIGINT[]) AS f(chat_id, epoch) \
             ON l.chat_id = f.chat_id AND l.epoch = f.epoch \
             ORDER BY l.chat_id FOR SHARE OF l",
        )
        .bind(&self.chat_id)
        .bind(&self.epoch)
        .fetch_all(conn)
        .await?;
        Ok(locked.len() == self.chat_id.len())
    }
}

/// The chats the group adds rows to without updating their state (the state update locks
/// the row and counts the chats it found): they must exist, and stay until COMMIT.
#[derive(Default)]
struct Chats<'a> {
    adds_rows: BTreeSet<&'a str>,
}

impl Chats<'_> {
    /// Locks every such chat's row `FOR KEY SHARE` (the lock a foreign key takes: a
    /// concurrent delete waits for COMMIT), in chat id order; true when all exist.
    async fn exist(&self, conn: &mut PgConnection) -> Result<bool, StoreError> {
        if self.adds_rows.is_empty() {
            return Ok(true);
        }
        let ids: Vec<&str> = self.adds_rows.iter().copied().collect();
        let locked = sqlx::query(
            "SELECT chat_id FROM chats WHERE chat_id = ANY($1::TEXT[]) \
             ORDER BY chat_id FOR KEY SHARE",
        )
        .bind(&ids)
        .fetch_all(conn)
        .await?;
        Ok(locked.len() == ids.len())
    }
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

    async fn insert(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        if self.chat_id.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO messages (chat_id, idx, message_id, role, agent, content, ui_hidden, raw) \
             SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], \
             $6::TEXT[], $7::BOOLEAN[], $8::TEXT[])",
        )
        .bind(&self.chat_id)
        .bind(&self.idx)
        .bind(&self.message_id)
        .bind(&self.role)
        .bind(&self.agent)
        .bind(&self.content)
        .bind(&self.ui_hidden)
        .bind(&self.raw)
        .execute(conn)
        .await?;
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

    async fn insert(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        if self.chat_id.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO events (chat_id, seq, event_type, json) \
             SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[])",
        )
        .bind(&self.chat_id)
        .bind(&self.seq)
        .bind(&self.event_type)
        .bind(&self.json)
        .execute(conn)
        .await?;
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

    async fn write(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        if !self.chat_id.is_empty() {
            sqlx::query(
                "INSERT INTO pending_ui \
                 (chat_id, corr, turn_key, call, created_at_ms, timeout_at_ms) \
                 SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], \
                 $5::BIGINT[], $6::BIGINT[]) \
                 ON CONFLICT (chat_id, corr) DO UPDATE SET turn_key = EXCLUDED.turn_key, \
                 call = EXCLUDED.call, created_at_ms = EXCLUDED.created_at_ms, \
                 timeout_at_ms = EXCLUDED.timeout_at_ms",
            )
            .bind(&self.chat_id)
            .bind(&self.corr)
            .bind(&self.turn_key)
            .bind(&self.call)
            .bind(&self.created_at_ms)
            .bind(&self.timeout_at_ms)
            .execute(&mut *conn)
            .await?;
        }
        if !self.removed_chat_id.is_empty() {
            sqlx::query(
                "DELETE FROM pending_ui AS p USING UNNEST($1::TEXT[], $2::TEXT[]) AS r(chat_id, corr) \
                 WHERE p.chat_id = r.chat_id AND p.corr = r.corr",
            )
            .bind(&self.removed_chat_id)
            .bind(&self.removed_corr)
            .execute(conn)
            .await?;
        }
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

    /// True when every chat's row was there to update.
    async fn update(&self, conn: &mut PgConnection) -> Result<bool, StoreError> {
        if self.chat_id.is_empty() {
            return Ok(true);
        }
        let updated = sqlx::query(
            "UPDATE chats AS c SET status = s.status, current_agent = s.current_agent, \
             turn = s.turn, consecutive = s.consecutive, context = s.context, \
             updated_at_ms = s.updated_at_ms, is_open = c.is_open AND s.status <> $8 \
             FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::BIGINT[], \
             $6::TEXT[], $7::BIGINT[]) \
             AS s(chat_id, status, current_agent, turn, consecutive, context, updated_at_ms) \
             WHERE c.chat_id = s.chat_id",
        )
        .bind(&self.chat_id)
        .bind(&self.status)
        .bind(&self.current_agent)
        .bind(&self.turn)
        .bind(&self.consecutive)
        .bind(&self.context)
        .bind(&self.updated_at_ms)
        .bind(STATUS_COMPLETED)
        .execute(conn)
        .await?;
        Ok(updated.rows_affected() == self.chat_id.len() as u64)
    }
}

#[derive(Default)]
struct Claims<'a> {
    chat_id: Vec<&'a str>,
    key: Vec<&'a str>,
}

impl Claims<'_> {
    /// One answer per claim, in order; `None` when a claim is of an unknown chat.
    async fn insert(&self, conn: &mut PgConnection) -> Result<Option<Vec<ToolClaim>>, StoreError> {
        if self.chat_id.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let claimed: HashSet<(String, String)> = sqlx::query(
            "INSERT INTO tool_invocations (chat_id, invocation_key, status, started_at_ms) \
             SELECT c.chat_id, c.key, 'started', $3 \
             FROM UNNEST($1::TEXT[], $2::TEXT[]) AS c(chat_id, key) \
             ON CONFLICT (chat_id, invocation_key) DO NOTHING \
             RETURNING chat_id, invocation_key",
        )
        .bind(&self.chat_id)
        .bind(&self.key)
        .bind(now_ms())
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|row| Ok((row.try_get("chat_id")?, row.try_get("invocation_key")?)))
        .collect::<Result<_, StoreError>>()?;
        let mut answers = Vec::with_capacity(self.chat_id.len());
        for (chat_id, key) in self.chat_id.iter().zip(&self.key) {
            let won = claimed.contains(&((*chat_id).to_owned(), (*key).to_owned()));
            // Claimed before (a re-run after a restart, another node): rare, one read each.
            answers.push(if won {
                ToolClaim::Claimed
            } else {
                match existing_claim(conn, chat_id, key).await {
                    Ok(claim) => claim,
                    Err(StoreError::NotFound(_)) => return Ok(None),
                    Err(other) => return Err(other),
                }
            });
        }
        Ok(Some(answers))
    }
}

#[derive(Default)]
struct Completions<'a> {
    chat_id: Vec<&'a str>,
    key: Vec<&'a str>,
    result: Vec<&'a str>,
}

impl Completions<'_> {
    /// True when every completed invocation was claimed and not completed yet.
    async fn update(&self, conn: &mut PgConnection) -> Result<bool, StoreError> {
        if self.chat_id.is_empty() {
            return Ok(true);
        }
        let done = sqlx::query(
            "UPDATE tool_invocations AS t SET status = 'completed', result = c.result, \
             completed_at_ms = $4 \
             FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[]) AS c(chat_id, key, result) \
             WHERE t.chat_id = c.chat_id AND t.invocation_key = c.key AND t.status = 'started'",
        )
        .bind(&self.chat_id)
        .bind(&self.key)
        .bind(&self.result)
        .bind(now_ms())
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == self.chat_id.len() as u64)
    }
}
