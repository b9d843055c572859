//! The chat writes of [`crate::PgStore`], each one job of the group-commit writer
//! (`writer.rs`) and, where it can, ONE statement: a round trip to the server is the cost that
//! counts, so a whole [`ChatWriteBatch`] (messages, events, pending UI calls, state and the
//! fencing check) is a single statement of data-modifying CTEs over `UNNEST`ed arrays.
//!
//! Fencing: a write that carries an epoch first takes the chat's lease row `FOR SHARE` at that
//! epoch. The lock lasts until the group's COMMIT, so a takeover (which updates the row) waits
//! for the write to be durable, and a write after a takeover finds no row at its epoch and
//! changes nothing: [`StoreError::Fenced`].
//!
//! The chat's own rows have no foreign key to `chats` (migration 7: PostgreSQL would check it
//! with a query per inserted row). A write that adds rows to a chat takes the chat's row
//! `FOR KEY SHARE` instead, once (the lock the foreign key took), and finds an unknown chat
//! [`StoreError::NotFound`]; a concurrent [`Write::DeleteChat`] waits for the write's COMMIT,
//! then deletes the chat's rows itself.

use std::sync::Arc;

use sqlx::{PgConnection, Row};

use crate::convert::{json_from_sql, now_ms, u64_to_sql};
use crate::pg_error::on_chat;
use crate::{ChatRecord, ChatState, ChatWriteBatch, STATUS_COMPLETED, StoreError, ToolClaim};

/// The lease check every fenced write starts with (`$1` the chat, `$2` the writer's epoch):
/// `fence` holds the chat's lease row at that epoch, locked `FOR SHARE`; `allowed` is true
/// when no epoch was given or the row is there. A macro so statements stay `&'static str`.
macro_rules! with_fence {
    () => {
        "WITH fence AS (SELECT epoch FROM chat_leases WHERE chat_id = $1 AND epoch = $2 \
         FOR SHARE), allowed AS (SELECT ($2::BIGINT IS NULL OR EXISTS (SELECT 1 FROM fence)) \
         AS ok), "
    };
}

/// The chat's row (`$1`), locked `FOR KEY SHARE` until COMMIT: empty when the chat does not
/// exist. It stands for the foreign key the chat's rows do not have (see the module docs).
macro_rules! with_chat {
    () => {
        "WITH chat AS (SELECT 1 FROM chats WHERE chat_id = $1 FOR KEY SHARE) "
    };
}

/// `with_fence!` and the chat's row locked as in `with_chat!`: `go` is true when the
/// write may add rows (its lease holds and its chat exists). A macro for the same reason.
macro_rules! with_fence_and_chat {
    () => {
        concat!(
            with_fence!(),
            "chat AS (SELECT 1 FROM chats WHERE chat_id = $1 FOR KEY SHARE), \
             go AS (SELECT (SELECT ok FROM allowed) AND EXISTS (SELECT 1 FROM chat) AS ok), "
        )
    };
}

/// One queued write.
#[derive(Debug)]
pub(crate) enum Write {
    CreateChat(ChatRecord),
    Batch {
        chat_id: String,
        batch: Arc<ChatWriteBatch>,
    },
    ClaimTool {
        chat_id: String,
        key: String,
        epoch: Option<i64>,
    },
    CompleteTool {
        chat_id: String,
        key: String,
        result: String,
        epoch: Option<i64>,
    },
    PutSecrets {
        chat_id: String,
        sealed: Vec<u8>,
    },
    DeleteSecrets {
        chat_id: String,
    },
    RemovePending {
        chat_id: String,
        corr: String,
    },
    DeleteChat {
        chat_id: String,
    },
}

impl Write {
    /// True for a write nobody waits on for anything a user sees: a tool's completion (the
    /// engine does not wait for it) and a chat's flush on a single node (no lease epoch: its
    /// events reached clients before it). In a cluster a flush is hurried: its events are
    /// shown, and the client's input acknowledged, only once it is durable.
    pub(crate) fn is_unhurried(&self) -> bool {
        match self {
            Write::CompleteTool { .. } => true,
            Write::Batch { batch, .. } => batch.epoch.is_none(),
            _ => false,
        }
    }
}

/// What a write answers.
#[derive(Debug)]
pub(crate) enum Done {
    Unit,
    Claim(ToolClaim),
    /// Whether the removed row existed.
    Existed(bool),
}

impl Write {
    /// The chat the write belongs to: writes of one chat go to one writer, in order.
    pub(crate) fn chat_id(&self) -> &str {
        match self {
            Write::CreateChat(record) => &record.chat_id,
            Write::Batch { chat_id, .. }
            | Write::ClaimTool { chat_id, .. }
            | Write::CompleteTool { chat_id, .. }
            | Write::PutSecrets { chat_id, .. }
            | Write::DeleteSecrets { chat_id }
            | Write::RemovePending { chat_id, .. }
            | Write::DeleteChat { chat_id } => chat_id,
        }
    }

    /// Runs the write inside the writer's open transaction. May run twice (see `writer.rs`):
    /// it reads its inputs only.
    pub(crate) async fn run(&self, conn: &mut PgConnection) -> Result<Done, StoreError> {
        match self {
            Write::CreateChat(record) => create_chat(conn, record).await.map(|()| Done::Unit),
            Write::Batch { chat_id, batch } => {
                apply_batch(conn, chat_id, batch).await.map(|()| Done::Unit)
            }
            Write::ClaimTool {
                chat_id,
                key,
                epoch,
            } => claim_tool(conn, chat_id, key, *epoch)
                .await
                .map(Done::Claim),
            Write::CompleteTool {
                chat_id,
                key,
                result,
                epoch,
            } => complete_tool(conn, chat_id, key, result, *epoch)
                .await
                .map(|()| Done::Unit),
            Write::PutSecrets { chat_id, sealed } => {
                let stored = sqlx::query(concat!(
                    with_chat!(),
                    "INSERT INTO chat_secrets (chat_id, sealed, updated_at_ms) \
                     SELECT $1, $2, $3 FROM chat \
                     ON CONFLICT (chat_id) DO UPDATE SET sealed = EXCLUDED.sealed, \
                     updated_at_ms = EXCLUDED.updated_at_ms"
                ))
                .bind(chat_id)
                .bind(sealed)
                .bind(now_ms())
                .execute(conn)
                .await
                .map_err(|e| on_chat(e, chat_id, "sealed secrets"))?;
                if stored.rows_affected() == 0 {
                    return Err(StoreError::NotFound(chat_id.clone()));
                }
                Ok(Done::Unit)
            }
            Write::DeleteSecrets { chat_id } => {
                let deleted = sqlx::query("DELETE FROM chat_secrets WHERE chat_id = $1")
                    .bind(chat_id)
                    .execute(conn)
                    .await?;
                Ok(Done::Existed(deleted.rows_affected() > 0))
            }
            Write::RemovePending { chat_id, corr } => {
                let deleted =
                    sqlx::query("DELETE FROM pending_ui WHERE chat_id = $1 AND corr = $2")
                        .bind(chat_id)
                        .bind(corr)
                        .execute(conn)
                        .await?;
                Ok(Done::Existed(deleted.rows_affected() > 0))
            }
            Write::DeleteChat { chat_id } => {
                // The chat's row first: that waits for every write holding it (see the module
                // docs), and each later statement sees what those writes committed.
                let deleted = sqlx::query("DELETE FROM chats WHERE chat_id = $1")
                    .bind(chat_id)
                    .execute(&mut *conn)
                    .await?;
                for sql in [
                    "DELETE FROM messages WHERE chat_id = $1",
                    "DELETE FROM events WHERE chat_id = $1",
                    "DELETE FROM pending_ui WHERE chat_id = $1",
                    "DELETE FROM tool_invocations WHERE chat_id = $1",
                    "DELETE FROM chat_secrets WHERE chat_id = $1",
                    "DELETE FROM artifacts WHERE chat_id = $1",
                    "DELETE FROM chat_leases WHERE chat_id = $1",
                ] {
                    sqlx::query(sql).bind(chat_id).execute(&mut *conn).await?;
                }
                Ok(Done::Existed(deleted.rows_affected() > 0))
            }
        }
    }
}

async fn create_chat(conn: &mut PgConnection, record: &ChatRecord) -> Result<(), StoreError> {
    let state = ChatState::initial(record.created_at_ms);
    sqlx::query(
        "INSERT INTO chats (chat_id, tenant, user_id, workflow, workflow_version, \
         created_at_ms, status, current_agent, turn, consecutive, context, updated_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(&record.chat_id)
    .bind(&record.tenant)
    .bind(&record.user_id)
    .bind(&record.workflow)
    .bind(&record.workflow_version)
    .bind(record.created_at_ms)
    .bind(&state.status)
    .bind(&state.current_agent)
    .bind(i64::from(state.turn))
    .bind(i64::from(state.consecutive))
    .bind(serde_json::to_string(&state.context)?)
    .bind(state.updated_at_ms)
    .execute(conn)
    .await
    .map_err(|e| on_chat(e, &record.chat_id, "chat"))?;
    Ok(())
}

async fn apply_batch(
    conn: &mut PgConnection,
    chat_id: &str,
    batch: &ChatWriteBatch,
) -> Result<(), StoreError> {
    let mut m = MessageColumns::default();
    for message in &batch.messages {
        m.idx.push(u64_to_sql(message.idx, "message idx")?);
        m.message_id.push(&message.message_id);
        m.role.push(&message.role);
        m.agent.push(message.agent.as_deref());
        m.content.push(&message.content);
        m.ui_hidden.push(message.ui_hidden);
        m.raw.push(message.raw.get());
    }
    let mut e = EventColumns::default();
    for event in &batch.events {
        e.seq.push(u64_to_sql(event.seq, "event seq")?);
        e.event_type.push(&event.event_type);
        e.json.push(&event.json);
    }
    // A call that started and ended within the batch is not stored at all, and of several
    // puts of one corr the last wins (as the SQLite store's statement-by-statement upserts
    // leave it): one statement may not touch a row twice.
    let mut p = PendingColumns::default();
    for (i, record) in batch.put_pending.iter().enumerate() {
        let superseded = batch.put_pending[i + 1..]
            .iter()
            .any(|later| later.corr == record.corr);
        if superseded || batch.remove_pending.contains(&record.corr) {
            continue;
        }
        p.corr.push(&record.corr);
        p.turn_key.push(&record.turn_key);
        p.call.push(serde_json::to_string(&record.call)?);
        p.created_at_ms.push(record.created_at_ms);
        p.timeout_at_ms.push(record.timeout_at_ms);
    }
    let state = batch.state.as_deref();
    let context = state
        .map(|s| serde_json::to_string(&s.context))
        .transpose()?;
    // Statement parameters: $1 chat, $2 epoch, $3-$9 messages, $10-$12 events, $13-$17 UI
    // calls put, $18 removed, $19-$24 state, $25 the completed status, $26 the seqs taken
    // (set with the state when there is one: one statement may not update a row twice).
    const SQL: &str = concat!(
        with_fence_and_chat!(),
        "new_messages AS (INSERT INTO messages \
            (chat_id, idx, message_id, role, agent, content, ui_hidden, raw) \
            SELECT $1, m.* FROM UNNEST($3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::TEXT[], \
            $7::TEXT[], $8::BOOLEAN[], $9::TEXT[]) AS m WHERE (SELECT ok FROM go) \
            RETURNING 1), \
         new_events AS (INSERT INTO events (chat_id, seq, event_type, json) \
            SELECT $1, e.* FROM UNNEST($10::BIGINT[], $11::TEXT[], $12::TEXT[]) AS e \
            WHERE (SELECT ok FROM go) RETURNING 1), \
         put_pending AS (INSERT INTO pending_ui \
            (chat_id, corr, turn_key, call, created_at_ms, timeout_at_ms) \
            SELECT $1, p.* FROM UNNEST($13::TEXT[], $14::TEXT[], $15::TEXT[], $16::BIGINT[], \
            $17::BIGINT[]) AS p WHERE (SELECT ok FROM go) \
            ON CONFLICT (chat_id, corr) DO UPDATE SET turn_key = EXCLUDED.turn_key, \
            call = EXCLUDED.call, created_at_ms = EXCLUDED.created_at_ms, \
            timeout_at_ms = EXCLUDED.timeout_at_ms RETURNING 1), \
         removed AS (DELETE FROM pending_ui WHERE chat_id = $1 AND corr = ANY($18::TEXT[]) \
            AND (SELECT ok FROM allowed) RETURNING 1), \
         new_state AS (UPDATE chats SET status = $19, current_agent = $20, turn = $21, \
            consecutive = $22, context = $23, updated_at_ms = $24, \
            is_open = is_open AND $19 <> $25, \
            seqs_taken = COALESCE($26::BIGINT, seqs_taken) \
            WHERE chat_id = $1 AND $19::TEXT IS NOT NULL AND (SELECT ok FROM go) \
            RETURNING 1), \
         taken AS (UPDATE chats SET seqs_taken = $26 WHERE chat_id = $1 \
            AND $19::TEXT IS NULL AND seqs_taken <> $26::BIGINT AND (SELECT ok FROM allowed) \
            RETURNING 1) \
         SELECT (SELECT ok FROM allowed) AS allowed, EXISTS (SELECT 1 FROM chat) AS found, \
            (SELECT count(*) FROM new_state) AS state_rows, \
            (SELECT count(*) FROM new_messages) + (SELECT count(*) FROM new_events) \
            + (SELECT count(*) FROM put_pending) + (SELECT count(*) FROM removed) \
            + (SELECT count(*) FROM taken) AS rows"
    );
    let row = sqlx::query(SQL)
        .bind(chat_id)
        .bind(batch.epoch)
        .bind(&m.idx)
        .bind(&m.message_id)
        .bind(&m.role)
        .bind(&m.agent)
        .bind(&m.content)
        .bind(&m.ui_hidden)
        .bind(&m.raw)
        .bind(&e.seq)
        .bind(&e.event_type)
        .bind(&e.json)
        .bind(&p.corr)
        .bind(&p.turn_key)
        .bind(&p.call)
        .bind(&p.created_at_ms)
        .bind(&p.timeout_at_ms)
        .bind(&batch.remove_pending)
        .bind(state.map(|s| s.status.as_str()))
        .bind(state.map(|s| s.current_agent.as_str()))
        .bind(state.map(|s| i64::from(s.turn)))
        .bind(state.map(|s| i64::from(s.consecutive)))
        .bind(context)
        .bind(state.map(|s| s.updated_at_ms))
        .bind(STATUS_COMPLETED)
        .bind(
            batch
                .seqs_taken_through
                .map(|seq| u64_to_sql(seq, "event seq"))
                .transpose()?,
        )
        .fetch_one(conn)
        .await
        .map_err(|err| on_chat(err, chat_id, "message idx or event seq"))?;
    if !row.try_get::<bool, _>("allowed")? {
        return Err(StoreError::Fenced(chat_id.to_owned()));
    }
    // Removing UI calls needs no chat (nothing is added); anything else does.
    let adds = state.is_some() || !m.idx.is_empty() || !e.seq.is_empty() || !p.corr.is_empty();
    if adds && !row.try_get::<bool, _>("found")? {
        return Err(StoreError::NotFound(chat_id.to_owned()));
    }
    if state.is_some() && row.try_get::<i64, _>("state_rows")? == 0 {
        return Err(StoreError::NotFound(chat_id.to_owned()));
    }
    Ok(())
}

#[derive(Default)]
struct MessageColumns<'a> {
    idx: Vec<i64>,
    message_id: Vec<&'a str>,
    role: Vec<&'a str>,
    agent: Vec<Option<&'a str>>,
    content: Vec<&'a str>,
    ui_hidden: Vec<bool>,
    raw: Vec<&'a str>,
}

#[derive(Default)]
struct EventColumns<'a> {
    seq: Vec<i64>,
    event_type: Vec<&'a str>,
    json: Vec<&'a str>,
}

#[derive(Default)]
struct PendingColumns<'a> {
    corr: Vec<&'a str>,
    turn_key: Vec<&'a str>,
    call: Vec<String>,
    created_at_ms: Vec<i64>,
    timeout_at_ms: Vec<Option<i64>>,
}

async fn claim_tool(
    conn: &mut PgConnection,
    chat_id: &str,
    key: &str,
    epoch: Option<i64>,
) -> Result<ToolClaim, StoreError> {
    const SQL: &str = concat!(
        with_fence_and_chat!(),
        "claimed AS (INSERT INTO tool_invocations \
            (chat_id, invocation_key, status, started_at_ms) \
            SELECT $1, $3, 'started', $4 WHERE (SELECT ok FROM go) \
            ON CONFLICT (chat_id, invocation_key) DO NOTHING RETURNING 1) \
         SELECT (SELECT ok FROM allowed) AS allowed, EXISTS (SELECT 1 FROM chat) AS found, \
            EXISTS (SELECT 1 FROM claimed) AS claimed"
    );
    let row = sqlx::query(SQL)
        .bind(chat_id)
        .bind(epoch)
        .bind(key)
        .bind(now_ms())
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| on_chat(e, chat_id, "tool invocation"))?;
    if !row.try_get::<bool, _>("allowed")? {
        return Err(StoreError::Fenced(chat_id.to_owned()));
    }
    if !row.try_get::<bool, _>("found")? {
        return Err(StoreError::NotFound(chat_id.to_owned()));
    }
    if row.try_get::<bool, _>("claimed")? {
        return Ok(ToolClaim::Claimed);
    }
    existing_claim(conn, chat_id, key).await
}

/// What an invocation that was claimed before answers a new claim; [`StoreError::NotFound`]
/// when it has no row. A statement of its own, so a claim another transaction committed
/// meanwhile is visible.
pub(super) async fn existing_claim(
    conn: &mut PgConnection,
    chat_id: &str,
    key: &str,
) -> Result<ToolClaim, StoreError> {
    let existing = sqlx::query(
        "SELECT status, result FROM tool_invocations WHERE chat_id = $1 AND invocation_key = $2",
    )
    .bind(chat_id)
    .bind(key)
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| StoreError::NotFound(chat_id.to_owned()))?;
    claim_of_record(
        key,
        existing.try_get("status")?,
        existing.try_get("result")?,
    )
}

/// The answer to a claim of `key` whose record already exists with `status` and `result`.
pub(super) fn claim_of_record(
    key: &str,
    status: &str,
    result: Option<&str>,
) -> Result<ToolClaim, StoreError> {
    match status {
        "started" => Ok(ToolClaim::AlreadyStarted),
        "completed" => {
            let result = result
                .map(|text| json_from_sql(text, "tool result"))
                .transpose()?;
            Ok(ToolClaim::AlreadyCompleted(result))
        }
        other => Err(StoreError::Corrupt(format!(
            "tool invocation '{key}' has status '{other}'"
        ))),
    }
}

async fn complete_tool(
    conn: &mut PgConnection,
    chat_id: &str,
    key: &str,
    result: &str,
    epoch: Option<i64>,
) -> Result<(), StoreError> {
    const SQL: &str = concat!(
        with_fence!(),
        "done AS (UPDATE tool_invocations SET status = 'completed', result = $4, \
            completed_at_ms = $5 \
            WHERE chat_id = $1 AND invocation_key = $3 AND status = 'started' \
            AND (SELECT ok FROM allowed) RETURNING 1) \
         SELECT (SELECT ok FROM allowed) AS allowed, EXISTS (SELECT 1 FROM done) AS done, \
            (SELECT status FROM tool_invocations WHERE chat_id = $1 AND invocation_key = $3) \
            AS status"
    );
    let row = sqlx::query(SQL)
        .bind(chat_id)
        .bind(epoch)
        .bind(key)
        .bind(result)
        .bind(now_ms())
        .fetch_one(conn)
        .await?;
    if !row.try_get::<bool, _>("allowed")? {
        return Err(StoreError::Fenced(chat_id.to_owned()));
    }
    if row.try_get::<bool, _>("done")? {
        return Ok(());
    }
    let status: Option<String> = row.try_get("status")?;
    Err(match status {
        None => StoreError::Conflict(format!(
            "tool invocation '{key}' of chat '{chat_id}' was never claimed"
        )),
        Some(_) => StoreError::Conflict(format!(
            "tool invocation '{key}' of chat '{chat_id}' is already completed"
        )),
    })
}
