//! SQL for the `chat_secrets` table: one sealed (encrypted) secret vault per chat.
//!
//! The store never sees a secret in clear: the engine seals the vault before calling
//! [`put`] and opens it after [`load`].

use sqlx::{Row, SqlitePool};

use crate::StoreError;
use crate::convert::now_ms;

/// Insert or replace the chat's sealed vault.
pub(crate) async fn put(
    pool: SqlitePool,
    chat_id: String,
    sealed: Vec<u8>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO chat_secrets (chat_id, sealed, updated_at_ms) VALUES (?, ?, ?) \
         ON CONFLICT (chat_id) DO UPDATE SET sealed = excluded.sealed, \
         updated_at_ms = excluded.updated_at_ms",
    )
    .bind(&chat_id)
    .bind(sealed)
    .bind(now_ms())
    .execute(&pool)
    .await
    .map_err(|e| StoreError::from_write(e, &chat_id, "sealed secrets"))?;
    Ok(())
}

/// The chat's sealed vault, if any.
pub(crate) async fn load(pool: SqlitePool, chat_id: String) -> Result<Option<Vec<u8>>, StoreError> {
    let row = sqlx::query("SELECT sealed FROM chat_secrets WHERE chat_id = ?")
        .bind(&chat_id)
        .fetch_optional(&pool)
        .await?;
    Ok(match row {
        Some(row) => Some(row.try_get("sealed")?),
        None => None,
    })
}

/// Delete the chat's sealed vault; `true` when it existed.
pub(crate) async fn delete(pool: SqlitePool, chat_id: String) -> Result<bool, StoreError> {
    let done = sqlx::query("DELETE FROM chat_secrets WHERE chat_id = ?")
        .bind(&chat_id)
        .execute(&pool)
        .await?;
    Ok(done.rows_affected() > 0)
}
