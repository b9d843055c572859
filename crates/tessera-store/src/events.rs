//! SQL for the `events` table: the per-chat, append-only event log replayed on reconnect
//! (rows in write order, found by the chat's number; see migration 5).

use sqlx::{Row, SqlitePool};

use crate::convert::sql_to_u64;
use crate::{StoreError, StoredEvent};

/// Up to `limit` events with seq > `after_seq`, ordered by seq.
pub(crate) async fn after(
    pool: SqlitePool,
    chat_id: String,
    after_seq: u64,
    limit: u32,
) -> Result<Vec<StoredEvent>, StoreError> {
    let Ok(after) = i64::try_from(after_seq) else {
        return Ok(Vec::new());
    };
    let rows = sqlx::query(
        "SELECT seq, event_type, json FROM events \
         WHERE chat_no = (SELECT chat_no FROM chat_numbers WHERE chat_id = ?) AND seq > ? \
         ORDER BY seq LIMIT ?",
    )
    .bind(&chat_id)
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::event).collect()
}

/// Highest seq, 0 for an empty log.
pub(crate) async fn last_seq(pool: SqlitePool, chat_id: String) -> Result<u64, StoreError> {
    let v: i64 = sqlx::query(
        "SELECT COALESCE(MAX(seq), 0) AS s FROM events \
         WHERE chat_no = (SELECT chat_no FROM chat_numbers WHERE chat_id = ?)",
    )
    .bind(&chat_id)
    .fetch_one(&pool)
    .await?
    .try_get("s")?;
    sql_to_u64(v, "event seq")
}
