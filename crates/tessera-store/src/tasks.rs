//! SQL for the `tasks` table: the todo lists behind the task built-ins.
//!
//! Isolation: every statement filters on (tenant, user_id) as well as the id, so another
//! owner's task id behaves exactly like an unknown id.

use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqlitePool};
use tessera_tools::{Task, TaskFilter};

use crate::StoreError;
use crate::convert::{now_ms, sql_to_u64};

/// Create a task for (tenant, user).
pub(crate) async fn add(
    pool: &SqlitePool,
    tenant: &str,
    user: &str,
    title: &str,
    description: Option<&str>,
) -> Result<Task, StoreError> {
    let id = format!("t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let created = now_ms();
    sqlx::query(
        "INSERT INTO tasks (id, tenant, user_id, title, description, completed, created_at_ms) \
         VALUES (?, ?, ?, ?, ?, 0, ?)",
    )
    .bind(&id)
    .bind(tenant)
    .bind(user)
    .bind(title)
    .bind(description)
    .bind(created)
    .execute(pool)
    .await?;
    Ok(Task {
        id,
        title: title.to_owned(),
        description: description.map(str::to_owned),
        completed: false,
        created_at_ms: sql_to_u64(created, "task created_at_ms")?,
    })
}

/// The owner's tasks matching `filter`, oldest first.
pub(crate) async fn list(
    pool: &SqlitePool,
    tenant: &str,
    user: &str,
    filter: TaskFilter,
) -> Result<Vec<Task>, StoreError> {
    let completed: Option<bool> = match filter {
        TaskFilter::All => None,
        TaskFilter::Pending => Some(false),
        TaskFilter::Completed => Some(true),
    };
    let rows = sqlx::query(
        "SELECT id, title, description, completed, created_at_ms FROM tasks \
         WHERE tenant = ? AND user_id = ? AND (?3 IS NULL OR completed = ?3) \
         ORDER BY created_at_ms, rowid",
    )
    .bind(tenant)
    .bind(user)
    .bind(completed)
    .fetch_all(pool)
    .await?;
    rows.iter().map(decode).collect()
}

/// Mark the owner's task completed; `None` when the owner has no such task.
pub(crate) async fn complete(
    pool: &SqlitePool,
    tenant: &str,
    user: &str,
    id: &str,
) -> Result<Option<Task>, StoreError> {
    let row = sqlx::query(
        "UPDATE tasks SET completed = 1 WHERE id = ? AND tenant = ? AND user_id = ? \
         RETURNING id, title, description, completed, created_at_ms",
    )
    .bind(id)
    .bind(tenant)
    .bind(user)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(decode).transpose()
}

/// Delete the owner's task; returns it, or `None` when the owner has no such task.
pub(crate) async fn delete(
    pool: &SqlitePool,
    tenant: &str,
    user: &str,
    id: &str,
) -> Result<Option<Task>, StoreError> {
    let row = sqlx::query(
        "DELETE FROM tasks WHERE id = ? AND tenant = ? AND user_id = ? \
         RETURNING id, title, description, completed, created_at_ms",
    )
    .bind(id)
    .bind(tenant)
    .bind(user)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(decode).transpose()
}

fn decode(row: &SqliteRow) -> Result<Task, StoreError> {
    Ok(Task {
        id: row.try_get("id")?,
        title: row.try_get("title")?,
        description: row.try_get("description")?,
        completed: row.try_get("completed")?,
        created_at_ms: sql_to_u64(row.try_get("created_at_ms")?, "task created_at_ms")?,
    })
}
