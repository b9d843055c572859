//! One chat's queued writes applied as one transaction with multi-row inserts: the engine
//! flushes a chat's events, transcript, pending UI calls and state together, and every
//! statement is a round trip to SQLite's worker thread, so fewer statements is what matters.

use sqlx::{QueryBuilder, Sqlite, SqlitePool};

use crate::convert::u64_to_sql;
use crate::{ChatState, PendingUiRecord, StoreError, StoredEvent, StoredMessage};

/// Rows per INSERT statement (keeps bound parameters far below SQLite's limit).
const ROWS_PER_STATEMENT: usize = 100;

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

/// Applies `batch` in one transaction; any failure rolls all of it back.
pub(crate) async fn apply(
    pool: SqlitePool,
    chat_id: String,
    batch: ChatWriteBatch,
) -> Result<(), StoreError> {
    // Encode everything before taking the write lock.
    let mut messages = Vec::with_capacity(batch.messages.len());
    for m in batch.messages {
        let raw = serde_json::to_string(&m.raw)?;
        messages.push((u64_to_sql(m.idx, "message idx")?, m, raw));
    }
    let mut events = Vec::with_capacity(batch.events.len());
    for e in batch.events {
        events.push((u64_to_sql(e.seq, "event seq")?, e));
    }
    let mut pending = Vec::with_capacity(batch.put_pending.len());
    for p in batch.put_pending {
        let call = serde_json::to_string(&p.call)?;
        pending.push((p, call));
    }
    let state = match batch.state {
        Some(state) => Some((serde_json::to_string(&state.context)?, state)),
        None => None,
    };

    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    for chunk in messages.chunks(ROWS_PER_STATEMENT) {
        let mut q: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO messages (chat_id, idx, message_id, role, agent, content, ui_hidden, raw) ",
        );
        q.push_values(chunk, |mut row, (idx, m, raw)| {
            row.push_bind(&chat_id)
                .push_bind(*idx)
                .push_bind(&m.message_id)
                .push_bind(&m.role)
                .push_bind(&m.agent)
                .push_bind(&m.content)
                .push_bind(m.ui_hidden)
                .push_bind(raw);
        });
        q.build()
            .execute(&mut *tx)
            .await
            .map_err(|e| StoreError::from_write(e, &chat_id, "messages"))?;
    }
    for chunk in events.chunks(ROWS_PER_STATEMENT) {
        let mut q: QueryBuilder<Sqlite> =
            QueryBuilder::new("INSERT INTO events (chat_id, seq, event_type, json) ");
        q.push_values(chunk, |mut row, (seq, e)| {
            row.push_bind(&chat_id)
                .push_bind(*seq)
                .push_bind(&e.event_type)
                .push_bind(&e.json);
        });
        q.build()
            .execute(&mut *tx)
            .await
            .map_err(|e| StoreError::from_write(e, &chat_id, "events"))?;
    }
    for (record, call) in &pending {
        sqlx::query(
            "INSERT INTO pending_ui (chat_id, corr, turn_key, call, created_at_ms, timeout_at_ms) \
             VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (chat_id, corr) DO UPDATE SET turn_key = excluded.turn_key, \
             call = excluded.call, created_at_ms = excluded.created_at_ms, \
             timeout_at_ms = excluded.timeout_at_ms",
        )
        .bind(&chat_id)
        .bind(&record.corr)
        .bind(&record.turn_key)
        .bind(call)
        .bind(record.created_at_ms)
        .bind(record.timeout_at_ms)
        .execute(&mut *tx)
        .await
        .map_err(|e| StoreError::from_write(e, &chat_id, "pending ui call"))?;
    }
    for corr in &batch.remove_pending {
        sqlx::query("DELETE FROM pending_ui WHERE chat_id = ? AND corr = ?")
            .bind(&chat_id)
            .bind(corr)
            .execute(&mut *tx)
            .await?;
    }
    if let Some((context, state)) = state {
        let done = sqlx::query(
            "UPDATE chats SET status = ?, current_agent = ?, turn = ?, consecutive = ?, \
             context = ?, updated_at_ms = ? WHERE chat_id = ?",
        )
        .bind(&state.status)
        .bind(&state.current_agent)
        .bind(i64::from(state.turn))
        .bind(i64::from(state.consecutive))
        .bind(context)
        .bind(state.updated_at_ms)
        .bind(&chat_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::ChatNotFound(chat_id));
        }
    }
    tx.commit().await?;
    Ok(())
}
