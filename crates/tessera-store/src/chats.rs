//! SQL for the `chats` table: identity plus the latest state of each chat.

use rusqlite::{Connection, OptionalExtension, params};
use sqlx::{Row, SqlitePool};

use crate::{ChatRecord, ChatState, STATUS_COMPLETED, StoreError, StoredChat};

/// Insert a new chat in its initial state.
pub(crate) fn create(conn: &Connection, record: &ChatRecord) -> Result<(), StoreError> {
    let state = ChatState::initial(record.created_at_ms);
    let context = serde_json::to_string(&state.context)?;
    conn.prepare_cached(
        "INSERT INTO chats (chat_id, tenant, user_id, workflow, workflow_version, \
         created_at_ms, status, current_agent, turn, consecutive, context, updated_at_ms) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )?
    .execute(params![
        record.chat_id,
        record.tenant,
        record.user_id,
        record.workflow,
        record.workflow_version,
        record.created_at_ms,
        state.status,
        state.current_agent,
        i64::from(state.turn),
        i64::from(state.consecutive),
        context,
        state.updated_at_ms
    ])
    .map_err(|e| crate::sqlite_error::from_write(e, &record.chat_id, "chat"))?;
    conn.prepare_cached("INSERT INTO chat_numbers (chat_id) VALUES (?)")?
        .execute([&record.chat_id])
        .map_err(|e| crate::sqlite_error::from_write(e, &record.chat_id, "chat"))?;
    Ok(())
}

/// The chat's number, the key of its rows in the tables laid out in write order (the chat
/// log and the tool invocations; see migrations 5 and 8). Unknown chat: [`StoreError::NotFound`].
pub(crate) fn number(conn: &Connection, chat_id: &str) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT chat_no FROM chat_numbers WHERE chat_id = ?")?
        .query_row([chat_id], |row| row.get(0))
        .optional()?
        .ok_or_else(|| StoreError::NotFound(chat_id.to_owned()))
}

/// One chat, or `None`.
pub(crate) async fn load(
    pool: SqlitePool,
    chat_id: String,
) -> Result<Option<StoredChat>, StoreError> {
    let row = sqlx::query(
        "SELECT chat_id, tenant, user_id, workflow, workflow_version, created_at_ms, status, current_agent, \
         turn, consecutive, context, updated_at_ms FROM chats WHERE chat_id = ?",
    )
    .bind(&chat_id)
    .fetch_optional(&pool)
    .await?;
    row.as_ref().map(crate::rows::chat).transpose()
}

/// One page of an owner's chats, newest first.
pub(crate) async fn list(
    pool: SqlitePool,
    tenant: String,
    user_id: String,
    limit: u32,
    offset: u32,
) -> Result<Vec<StoredChat>, StoreError> {
    let rows = sqlx::query(
        "SELECT chat_id, tenant, user_id, workflow, workflow_version, created_at_ms, status, current_agent, \
         turn, consecutive, context, updated_at_ms FROM chats \
         WHERE tenant = ? AND user_id = ? \
         ORDER BY created_at_ms DESC, rowid DESC LIMIT ? OFFSET ?",
    )
    .bind(&tenant)
    .bind(&user_id)
    .bind(i64::from(limit))
    .bind(i64::from(offset))
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::chat).collect()
}

/// Every chat not completed (`is_open`, cleared when a chat completes), oldest first.
pub(crate) async fn list_open(pool: SqlitePool) -> Result<Vec<StoredChat>, StoreError> {
    let rows = sqlx::query(
        "SELECT chat_id, tenant, user_id, workflow, workflow_version, created_at_ms, status, current_agent, \
         turn, consecutive, context, updated_at_ms FROM chats \
         WHERE is_open = 1 ORDER BY created_at_ms, rowid",
    )
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::chat).collect()
}

/// Ids of completed chats last updated before `before_ms`, oldest first (retention).
pub(crate) async fn completed_before(
    pool: SqlitePool,
    before_ms: i64,
    limit: u32,
) -> Result<Vec<String>, StoreError> {
    let rows = sqlx::query(
        "SELECT chat_id FROM chats WHERE status = ? AND updated_at_ms < ? \
         ORDER BY updated_at_ms, rowid LIMIT ?",
    )
    .bind(STATUS_COMPLETED)
    .bind(before_ms)
    .bind(i64::from(limit))
    .fetch_all(&pool)
    .await?;
    rows.iter()
        .map(|row| row.try_get("chat_id").map_err(StoreError::from))
        .collect()
}

/// How many of `tenant`'s chats have not completed (index `chats_open_by_tenant`).
pub(crate) async fn count_open(pool: SqlitePool, tenant: String) -> Result<u64, StoreError> {
    let count: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM chats WHERE tenant = ? AND is_open = 1")
            .bind(&tenant)
            .fetch_one(&pool)
            .await?;
    Ok(u64::try_from(count).unwrap_or(0))
}

/// Replace the chat's state; with `log`, also move its log head to (row, last seq, next idx)
/// in the same update. Unknown chat: [`StoreError::NotFound`].
pub(crate) fn save_state(
    conn: &Connection,
    chat_id: &str,
    state: &ChatState,
    log: Option<(i64, i64, i64)>,
) -> Result<(), StoreError> {
    let context = serde_json::to_string(&state.context)?;
    let (status, agent, turn) = (&state.status, &state.current_agent, i64::from(state.turn));
    let consecutive = i64::from(state.consecutive);
    let changed = match log {
        None => conn
            .prepare_cached(
                "UPDATE chats SET status = ?, current_agent = ?, turn = ?, consecutive = ?, \
                 context = ?, updated_at_ms = ? WHERE chat_id = ?",
            )?
            .execute(params![
                status,
                agent,
                turn,
                consecutive,
                context,
                state.updated_at_ms,
                chat_id
            ])?,
        Some((head, last_seq, next_idx)) => conn
            .prepare_cached(
                "UPDATE chats SET status = ?, current_agent = ?, turn = ?, consecutive = ?, \
                 context = ?, updated_at_ms = ?, log_head = ?, last_seq = ?, next_idx = ? \
                 WHERE chat_id = ?",
            )?
            .execute(params![
                status,
                agent,
                turn,
                consecutive,
                context,
                state.updated_at_ms,
                head,
                last_seq,
                next_idx,
                chat_id
            ])?,
    };
    if changed == 0 {
        return Err(StoreError::NotFound(chat_id.to_owned()));
    }
    // Apart from `status`: the open-chat indexes key on `is_open`, and setting it on every
    // state change would rewrite their entries each time (migration 7).
    if state.status == STATUS_COMPLETED {
        conn.prepare_cached("UPDATE chats SET is_open = 0 WHERE chat_id = ? AND is_open = 1")?
            .execute([chat_id])?;
    }
    Ok(())
}

/// Delete a chat; its log rows explicitly (they hang off `chats.log_head`), rows of the child tables (and through `chat_numbers`, of the tables keyed
/// by chat number) go by `ON DELETE CASCADE`, artifacts explicitly.
pub(crate) fn delete(conn: &Connection, chat_id: &str) -> Result<bool, StoreError> {
    conn.prepare_cached("DELETE FROM artifacts WHERE chat_id = ?")?
        .execute([chat_id])?;
    crate::log::delete(conn, chat_id)?;
    let deleted = conn
        .prepare_cached("DELETE FROM chats WHERE chat_id = ?")?
        .execute([chat_id])?;
    Ok(deleted > 0)
}
