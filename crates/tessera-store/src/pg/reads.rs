//! The reads of [`crate::PgStore`], on the pool (never queued behind the writer): the same
//! queries as the SQLite store's, decoded by the shared `rows` decoders.

use sqlx::{PgPool, Row};
use tessera_tools::{StoredArtifact, Task, TaskFilter};

use crate::convert::sql_to_u64;
use crate::{
    PendingUiRecord, STATUS_COMPLETED, StoreError, StoredChat, StoredEvent, StoredMessage,
};

/// The columns `rows::chat` decodes. A macro so statements stay `&'static str`.
macro_rules! select_chats {
    () => {
        "SELECT chat_id, tenant, user_id, workflow, workflow_version, created_at_ms, status, current_agent, turn, \
         consecutive, context, updated_at_ms FROM chats "
    };
}

pub(crate) async fn load_chat(
    pool: PgPool,
    chat_id: String,
) -> Result<Option<StoredChat>, StoreError> {
    let row = sqlx::query(concat!(select_chats!(), "WHERE chat_id = $1"))
        .bind(&chat_id)
        .fetch_optional(&pool)
        .await?;
    row.as_ref().map(crate::rows::chat).transpose()
}

pub(crate) async fn list_chats(
    pool: PgPool,
    tenant: String,
    user_id: String,
    limit: u32,
    offset: u32,
) -> Result<Vec<StoredChat>, StoreError> {
    let rows = sqlx::query(concat!(
        select_chats!(),
        "WHERE tenant = $1 AND user_id = $2 ORDER BY created_at_ms DESC, row_no DESC \
         LIMIT $3 OFFSET $4"
    ))
    .bind(&tenant)
    .bind(&user_id)
    .bind(i64::from(limit))
    .bind(i64::from(offset))
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::chat).collect()
}

/// Ids of completed chats last updated before `before_ms`, oldest first (retention).
pub(crate) async fn completed_chats_before(
    pool: PgPool,
    before_ms: i64,
    limit: u32,
) -> Result<Vec<String>, StoreError> {
    let rows = sqlx::query(
        "SELECT chat_id FROM chats WHERE status = $1 AND updated_at_ms < $2 \
         ORDER BY updated_at_ms, row_no LIMIT $3",
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

/// Every chat not completed (`is_open`, cleared when a chat completes), oldest first.
pub(crate) async fn list_open_chats(pool: PgPool) -> Result<Vec<StoredChat>, StoreError> {
    let rows = sqlx::query(concat!(
        select_chats!(),
        "WHERE is_open ORDER BY created_at_ms, row_no"
    ))
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::chat).collect()
}

/// How many of `tenant`'s chats have not completed (index `chats_open_by_tenant`).
pub(crate) async fn count_open_chats(pool: PgPool, tenant: String) -> Result<u64, StoreError> {
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM chats WHERE tenant = $1 AND is_open")
        .bind(&tenant)
        .fetch_one(&pool)
        .await?;
    Ok(u64::try_from(count).unwrap_or(0))
}

pub(crate) async fn messages(
    pool: PgPool,
    chat_id: String,
    offset: u64,
    limit: Option<u32>,
) -> Result<Vec<StoredMessage>, StoreError> {
    // An offset beyond i64::MAX cannot match anything.
    let Ok(from) = i64::try_from(offset) else {
        return Ok(Vec::new());
    };
    let rows = sqlx::query(
        "SELECT idx, message_id, role, agent, content, ui_hidden, raw FROM messages \
         WHERE chat_id = $1 AND idx >= $2 ORDER BY idx LIMIT $3",
    )
    .bind(&chat_id)
    .bind(from)
    .bind(limit.map(i64::from))
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::message).collect()
}

pub(crate) async fn events_after(
    pool: PgPool,
    chat_id: String,
    after_seq: u64,
    limit: u32,
) -> Result<Vec<StoredEvent>, StoreError> {
    let Ok(after) = i64::try_from(after_seq) else {
        return Ok(Vec::new());
    };
    let rows = sqlx::query(
        "SELECT seq, event_type, json FROM events WHERE chat_id = $1 AND seq > $2 \
         ORDER BY seq LIMIT $3",
    )
    .bind(&chat_id)
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::event).collect()
}

pub(crate) async fn last_seq(pool: PgPool, chat_id: String) -> Result<u64, StoreError> {
    let v: i64 = sqlx::query("SELECT COALESCE(MAX(seq), 0) AS s FROM events WHERE chat_id = $1")
        .bind(&chat_id)
        .fetch_one(&pool)
        .await?
        .try_get("s")?;
    sql_to_u64(v, "event seq")
}

/// See [`crate::ChatStore::last_seq_taken`]: the last event's seq, or the chat's
/// `seqs_taken` mark (migration 11) when higher.
pub(crate) async fn last_seq_taken(pool: PgPool, chat_id: String) -> Result<u64, StoreError> {
    let v: i64 = sqlx::query(
        "SELECT GREATEST((SELECT COALESCE(MAX(seq), 0) FROM events WHERE chat_id = $1), \
         (SELECT COALESCE(MAX(seqs_taken), 0) FROM chats WHERE chat_id = $1)) AS s",
    )
    .bind(&chat_id)
    .fetch_one(&pool)
    .await?
    .try_get("s")?;
    sql_to_u64(v, "event seq")
}

pub(crate) async fn pending_ui(
    pool: PgPool,
    chat_id: String,
) -> Result<Vec<PendingUiRecord>, StoreError> {
    let rows = sqlx::query(
        "SELECT corr, turn_key, call, created_at_ms, timeout_at_ms FROM pending_ui \
         WHERE chat_id = $1 ORDER BY created_at_ms, corr",
    )
    .bind(&chat_id)
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::pending_ui).collect()
}

pub(crate) async fn load_secrets(
    pool: PgPool,
    chat_id: String,
) -> Result<Option<Vec<u8>>, StoreError> {
    let row = sqlx::query("SELECT sealed FROM chat_secrets WHERE chat_id = $1")
        .bind(&chat_id)
        .fetch_optional(&pool)
        .await?;
    Ok(match row {
        Some(row) => Some(row.try_get("sealed")?),
        None => None,
    })
}

pub(crate) async fn list_tasks(
    pool: PgPool,
    tenant: String,
    user: String,
    filter: TaskFilter,
) -> Result<Vec<Task>, StoreError> {
    let completed: Option<bool> = match filter {
        TaskFilter::All => None,
        TaskFilter::Pending => Some(false),
        TaskFilter::Completed => Some(true),
    };
    let rows = sqlx::query(
        "SELECT id, title, description, completed, created_at_ms FROM tasks \
         WHERE tenant = $1 AND user_id = $2 AND ($3::BOOLEAN IS NULL OR completed = $3) \
         ORDER BY created_at_ms, row_no",
    )
    .bind(&tenant)
    .bind(&user)
    .bind(completed)
    .fetch_all(&pool)
    .await?;
    rows.iter().map(crate::rows::task).collect()
}

pub(crate) async fn get_artifact(
    pool: PgPool,
    tenant: String,
    user: String,
    chat_id: String,
    id: String,
) -> Result<Option<StoredArtifact>, StoreError> {
    let row = sqlx::query(
        "SELECT id, file_name, size, sha256, bytes FROM artifacts \
         WHERE id = $1 AND tenant = $2 AND user_id = $3 AND chat_id = $4",
    )
    .bind(&id)
    .bind(&tenant)
    .bind(&user)
    .bind(&chat_id)
    .fetch_optional(&pool)
    .await?;
    row.as_ref().map(crate::rows::artifact).transpose()
}
