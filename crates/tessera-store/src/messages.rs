//! SQL for the `messages` table: the transcript, one row per message, keyed by (chat number,
//! idx) and stored in write order (see migration 5).

use sqlx::SqlitePool;

use crate::{StoreError, StoredMessage};

/// Up to `limit` messages from position `offset`, ordered by idx.
pub(crate) async fn page(
    pool: SqlitePool,
    chat_id: String,
    offset: u64,
    limit: u32,
) -> Result<Vec<StoredMessage>, StoreError> {
    // An offset beyond i64::MAX cannot match anything.
    let Ok(from) = i64::try_from(offset) else {
        return Ok(Vec::new());
    };
    let rows = sqlx::query(
        "SELECT idx, message_id, role, agent, content, ui_hidden, raw FROM messages \
         WHERE chat_no = (SELECT chat_no FROM chat_numbers WHERE chat_id = ?) AND idx >= ? \
         ORDER BY idx LIMIT ?",
    )
    .bind(&chat_id)
    .bind(from)
    .bind(i64::from(limit))
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::message).collect()
}

/// The whole transcript, ordered by idx.
pub(crate) async fn all(
    pool: SqlitePool,
    chat_id: String,
) -> Result<Vec<StoredMessage>, StoreError> {
    let rows = sqlx::query(
        "SELECT idx, message_id, role, agent, content, ui_hidden, raw FROM messages \
         WHERE chat_no = (SELECT chat_no FROM chat_numbers WHERE chat_id = ?) ORDER BY idx",
    )
    .bind(&chat_id)
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::message).collect()
}
