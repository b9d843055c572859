//! One chat's queued writes applied together: the engine flushes a chat's events,
//! transcript, pending UI calls and state as one unit, and the writer thread commits many
//! chats' units in one transaction (see `writer`).

use rusqlite::{Connection, params};

use crate::convert::u64_to_sql;
use crate::{ChatState, PendingUiRecord, StoreError, StoredEvent, StoredMessage};

/// Writes of one chat that belong together.
#[derive(Debug, Default, Clone)]
pub struct ChatWriteBatch {
    /// Transcript messages to append.
    pub messages: Vec<StoredMessage>,
    /// Events to append to the log.
    pub events: Vec<StoredEvent>,
    /// UI calls that started waiting.
    pub put_pending: Vec<PendingUiRecord>,
    /// Correlation ids of UI calls that ended.
    pub remove_pending: Vec<String>,
    /// The chat's latest state, if it changed.
    pub state: Option<ChatState>,
    /// The writer's lease epoch in a cluster: the batch is refused with
    /// [`StoreError::Fenced`] once the chat's lease has a newer one. `None` (single node, and
    /// always on SQLite) checks nothing. Not a write: [`ChatWriteBatch::is_empty`] ignores it.
    pub epoch: Option<i64>,
}

impl ChatWriteBatch {
    /// True when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.events.is_empty()
            && self.put_pending.is_empty()
            && self.remove_pending.is_empty()
            && self.state.is_none()
    }
}

/// Applies `batch` on the writer connection (inside the writer's savepoint, so any failure
/// rolls all of it back).
pub(crate) fn apply(
    conn: &Connection,
    chat_id: &str,
    batch: &ChatWriteBatch,
) -> Result<(), StoreError> {
    let chat_no = if batch.messages.is_empty() && batch.events.is_empty() {
        None
    } else {
        Some(crate::chats::number(conn, chat_id)?)
    };
    if !batch.messages.is_empty() {
        let mut insert = conn.prepare_cached(
            "INSERT INTO messages (chat_no, idx, message_id, role, agent, content, ui_hidden, raw) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )?;
        for m in &batch.messages {
            let raw = serde_json::to_string(&m.raw)?;
            insert
                .execute(params![
                    chat_no,
                    u64_to_sql(m.idx, "message idx")?,
                    m.message_id,
                    m.role,
                    m.agent,
                    m.content,
                    m.ui_hidden,
                    raw
                ])
                .map_err(|e| crate::sqlite_error::from_write(e, chat_id, "messages"))?;
        }
    }
    if !batch.events.is_empty() {
        let mut insert = conn.prepare_cached(
            "INSERT INTO events (chat_no, seq, event_type, json) VALUES (?, ?, ?, ?)",
        )?;
        for e in &batch.events {
            insert
                .execute(params![
                    chat_no,
                    u64_to_sql(e.seq, "event seq")?,
                    e.event_type,
                    e.json
                ])
                .map_err(|err| crate::sqlite_error::from_write(err, chat_id, "events"))?;
        }
    }
    if !batch.put_pending.is_empty() {
        let mut upsert = conn.prepare_cached(
            "INSERT INTO pending_ui (chat_id, corr, turn_key, call, created_at_ms, timeout_at_ms) \
             VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (chat_id, corr) DO UPDATE SET turn_key = excluded.turn_key, \
             call = excluded.call, created_at_ms = excluded.created_at_ms, \
             timeout_at_ms = excluded.timeout_at_ms",
        )?;
        for record in &batch.put_pending {
            let call = serde_json::to_string(&record.call)?;
            upsert
                .execute(params![
                    chat_id,
                    record.corr,
                    record.turn_key,
                    call,
                    record.created_at_ms,
                    record.timeout_at_ms
                ])
                .map_err(|e| crate::sqlite_error::from_write(e, chat_id, "pending ui call"))?;
        }
    }
    for corr in &batch.remove_pending {
        crate::pending::remove(conn, chat_id, corr)?;
    }
    if let Some(state) = &batch.state {
        let context = serde_json::to_string(&state.context)?;
        let changed = conn
            .prepare_cached(
                "UPDATE chats SET status = ?, current_agent = ?, turn = ?, consecutive = ?, \
                 context = ?, updated_at_ms = ? WHERE chat_id = ?",
            )?
            .execute(params![
                state.status,
                state.current_agent,
                i64::from(state.turn),
                i64::from(state.consecutive),
                context,
                state.updated_at_ms,
                chat_id
            ])?;
        if changed == 0 {
            return Err(StoreError::NotFound(chat_id.to_owned()));
        }
        // Apart from `status`: the open-chat indexes key on `is_open`, and setting it on every
        // state change would rewrite their entries each time (migration 7).
        if state.status == crate::STATUS_COMPLETED {
            conn.prepare_cached("UPDATE chats SET is_open = 0 WHERE chat_id = ? AND is_open = 1")?
                .execute([chat_id])?;
        }
    }
    Ok(())
}
