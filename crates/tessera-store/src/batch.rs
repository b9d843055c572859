//! One chat's queued writes applied together: the engine flushes a chat's events,
//! transcript, pending UI calls and state as one unit, and the writer thread commits many
//! chats' units in one transaction (see `writer`).

use std::sync::Arc;

use rusqlite::params;

use crate::db::Db;
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
    /// Every seq of the chat up to this one is taken, whether or not its event is stored: the
    /// store keeps the latest mark it was given ([`crate::ChatStore::last_seq_taken`]), so a
    /// chat rebuilt after a crash continues above it and reuses no seq a client saw. A single
    /// node sends streamed deltas live only and marks their seqs taken ahead, in steps,
    /// instead of storing them, then moves the mark back to its next stored event. Events of
    /// this or a later batch may have seqs at or below it.
    pub seqs_taken_through: Option<u64>,
    /// The chat's latest state, if it changed. Shared: the engine keeps the state it sent to
    /// tell whether the next one changed, and copying a state copies its context.
    pub state: Option<Arc<ChatState>>,
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
            && self.seqs_taken_through.is_none()
            && self.state.is_none()
    }
}

/// Applies `batch` on the writer connection (inside the writer's savepoint, so any failure
/// rolls all of it back).
pub(crate) fn apply(db: &Db<'_>, chat_id: &str, batch: &ChatWriteBatch) -> Result<(), StoreError> {
    if !(batch.messages.is_empty() && batch.events.is_empty() && batch.state.is_none()) {
        crate::log::append(
            db,
            chat_id,
            &batch.events,
            &batch.messages,
            batch.state.as_deref(),
        )?;
    }
    if !batch.put_pending.is_empty() {
        let mut upsert = db.prepare_cached(
            "INSERT INTO pending_ui (chat_id, corr, turn_key, call, created_at_ms, timeout_at_ms) \
             VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (chat_id, corr) DO UPDATE SET turn_key = excluded.turn_key, \
             call = excluded.call, created_at_ms = excluded.created_at_ms, \
             timeout_at_ms = excluded.timeout_at_ms",
        )?;
        for record in &batch.put_pending {
            let call = tessera_json::to_string(&record.call)?;
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
        crate::pending::remove(db, chat_id, corr)?;
    }
    if let Some(seq) = batch.seqs_taken_through {
        crate::log::take_seqs_through(db, chat_id, seq)?;
    }
    Ok(())
}
