//! SQL for the `pending_ui` table: UI tool calls waiting for the user, re-sent on reconnect.

use rusqlite::Connection;
use sqlx::SqlitePool;

use crate::{PendingUiRecord, StoreError};

/// Remove one; `true` when it existed.
pub(crate) fn remove(conn: &Connection, chat_id: &str, corr: &str) -> Result<bool, StoreError> {
    let removed = conn
        .prepare_cached("DELETE FROM pending_ui WHERE chat_id = ? AND corr = ?")?
        .execute([chat_id, corr])?;
    Ok(removed > 0)
}

/// The chat's pending calls, oldest first.
pub(crate) async fn list(
    pool: SqlitePool,
    chat_id: String,
) -> Result<Vec<PendingUiRecord>, StoreError> {
    let rows = sqlx::query(
        "SELECT corr, turn_key, call, created_at_ms, timeout_at_ms FROM pending_ui \
         WHERE chat_id = ? ORDER BY created_at_ms, corr",
    )
    .bind(&chat_id)
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::pending_ui).collect()
}
