//! SQL for the `chat_secrets` table: one sealed (encrypted) secret vault per chat.
//!
//! The store never sees a secret in clear: the engine seals the vault before calling
//! [`put`] and opens it after [`load`].

use rusqlite::{Connection, params};
use sqlx::{Row, SqlitePool};

use crate::StoreError;
use crate::convert::now_ms;

/// Insert or replace the chat's sealed vault.
pub(crate) fn put(conn: &Connection, chat_id: &str, sealed: &[u8]) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO chat_secrets (chat_id, sealed, updated_at_ms) VALUES (?, ?, ?) \
         ON CONFLICT (chat_id) DO UPDATE SET sealed = excluded.sealed, \
         updated_at_ms = excluded.updated_at_ms",
    )?
    .execute(params![chat_id, sealed, now_ms()])
    .map_err(|e| crate::sqlite_error::from_write(e, chat_id, "sealed secrets"))?;
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
pub(crate) fn delete(conn: &Connection, chat_id: &str) -> Result<bool, StoreError> {
    let deleted = conn
        .prepare_cached("DELETE FROM chat_secrets WHERE chat_id = ?")?
        .execute([chat_id])?;
    Ok(deleted > 0)
}
