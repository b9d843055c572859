//! SQL for the `chats` table: identity, and the state at creation and at completion (an open
//! chat's later states are in its log; see `log`).

use rusqlite::{Connection, params};
use sqlx::{Row, SqlitePool};

use crate::db::Db;
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
    conn.prepare_cached(
        "INSERT INTO chat_heads (chat_no, log_head, state_row, last_seq, next_idx) \
         VALUES (?, NULL, NULL, 0, 0)",
    )?
    .execute([conn.last_insert_rowid()])?;
    Ok(())
}

/// The columns [`chat`] decodes, from `chats c` with the packed latest state `s.state` (NULL
/// before the chat's first flush with a state).
macro_rules! select_chats {
    ($rest:literal) => {
        concat!(
            "SELECT c.chat_id, c.tenant, c.user_id, c.workflow, c.workflow_version, ",
            "c.created_at_ms, c.status, c.current_agent, c.turn, c.consecutive, c.context, ",
            "c.updated_at_ms, s.state AS packed_state FROM chats c ",
            "JOIN chat_numbers n ON n.chat_id = c.chat_id ",
            "LEFT JOIN chat_heads h ON h.chat_no = n.chat_no ",
            "LEFT JOIN chat_log s ON s.rowid = h.state_row ",
            $rest
        )
    };
}

/// A chat as [`select_chats`] reads it: the `chats` row holds the state at creation (and at
/// completion); a later state is the one packed in the log.
fn chat(row: &sqlx::sqlite::SqliteRow) -> Result<StoredChat, StoreError> {
    let mut chat = crate::rows::chat(row)?;
    let packed: Option<&[u8]> = row.try_get("packed_state")?;
    if let Some(packed) = packed {
        chat.state = crate::log::unpack_state(packed)?;
    }
    Ok(chat)
}

/// One chat, or `None`.
pub(crate) async fn load(
    pool: SqlitePool,
    chat_id: String,
) -> Result<Option<StoredChat>, StoreError> {
    let row = sqlx::query(select_chats!("WHERE c.chat_id = ?"))
        .bind(&chat_id)
        .fetch_optional(&pool)
        .await?;
    row.as_ref().map(chat).transpose()
}

/// One page of an owner's chats, newest first.
pub(crate) async fn list(
    pool: SqlitePool,
    tenant: String,
    user_id: String,
    limit: u32,
    offset: u32,
) -> Result<Vec<StoredChat>, StoreError> {
    let rows = sqlx::query(select_chats!(
        "WHERE c.tenant = ? AND c.user_id = ? \
         ORDER BY c.created_at_ms DESC, c.rowid DESC LIMIT ? OFFSET ?"
    ))
    .bind(&tenant)
    .bind(&user_id)
    .bind(i64::from(limit))
    .bind(i64::from(offset))
    .fetch_all(&pool)
    .await?;
    rows.iter().map(chat).collect()
}

/// Every chat not completed (`is_open`, cleared when a chat completes), oldest first.
pub(crate) async fn list_open(pool: SqlitePool) -> Result<Vec<StoredChat>, StoreError> {
    let rows = sqlx::query(select_chats!(
        "WHERE c.is_open = 1 ORDER BY c.created_at_ms, c.rowid"
    ))
    .fetch_all(&pool)
    .await?;
    rows.iter().map(chat).collect()
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

/// Write a completed chat's final `state` to its `chats` row and mark it closed: done once per
/// chat (the state of an open chat lives in its log; see [`crate::log::append`]), in one
/// update, `is_open` included (the open-chat indexes key on it, migration 7). Unknown chat:
/// [`StoreError::NotFound`].
pub(crate) fn save_completed_state(
    conn: &Connection,
    chat_id: &str,
    state: &ChatState,
) -> Result<(), StoreError> {
    let context = serde_json::to_string(&state.context)?;
    let changed = conn
        .prepare_cached(
            "UPDATE chats SET status = ?, current_agent = ?, turn = ?, consecutive = ?, \
             context = ?, updated_at_ms = ?, is_open = 0 WHERE chat_id = ?",
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
    Ok(())
}

/// Delete a chat; its log rows and tool claims explicitly (they hang off its `chat_heads` row
/// and index), rows of the child tables (and through `chat_numbers`, of the tables keyed
/// by chat number) go by `ON DELETE CASCADE`, artifacts explicitly.
pub(crate) fn delete(db: &Db<'_>, chat_id: &str) -> Result<bool, StoreError> {
    db.prepare_cached("DELETE FROM artifacts WHERE chat_id = ?")?
        .execute([chat_id])?;
    crate::log::delete(db, chat_id)?;
    crate::tools::delete(db, chat_id)?;
    let deleted = db
        .prepare_cached("DELETE FROM chats WHERE chat_id = ?")?
        .execute([chat_id])?;
    // Its heads went with it; a chat created again under this id gets new ones.
    db.forget_heads(chat_id);
    Ok(deleted > 0)
}
