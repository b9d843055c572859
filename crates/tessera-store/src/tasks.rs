//! SQL for the `tasks` table: the todo lists behind the task built-ins.
//!
//! Isolation: every statement filters on (tenant, user_id) as well as the id, so another
//! owner's task id behaves exactly like an unknown id.

use rusqlite::{Connection, OptionalExtension, params};
use sqlx::SqlitePool;
use tessera_tools::{Task, TaskFilter};

use crate::StoreError;
use crate::convert::{now_ms, sql_to_u64};

/// Create a task for (tenant, user).
pub(crate) fn add(
    conn: &Connection,
    tenant: &str,
    user: &str,
    title: &str,
    description: Option<&str>,
) -> Result<Task, StoreError> {
    let id = new_task_id();
    let created = now_ms();
    conn.prepare_cached(
        "INSERT INTO tasks (id, tenant, user_id, title, description, completed, created_at_ms) \
         VALUES (?, ?, ?, ?, ?, 0, ?)",
    )?
    .execute(params![id, tenant, user, title, description, created])?;
    Ok(Task {
        id,
        title: title.to_owned(),
        description: description.map(str::to_owned),
        completed: false,
        created_at_ms: sql_to_u64(created, "task created_at_ms")?,
    })
}

/// A new task's id, the same shape for every backend.
pub(crate) fn new_task_id() -> String {
    format!("t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
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
    rows.iter().map(crate::rows::task).collect()
}

/// Mark the owner's task completed; `None` when the owner has no such task.
pub(crate) fn complete(
    conn: &Connection,
    tenant: &str,
    user: &str,
    id: &str,
) -> Result<Option<Task>, StoreError> {
    returning_task(
        conn,
        "UPDATE tasks SET completed = 1 WHERE id = ? AND tenant = ? AND user_id = ? \
         RETURNING id, title, description, completed, created_at_ms",
        [id, tenant, user],
    )
}

/// Delete the owner's task; returns it, or `None` when the owner has no such task.
pub(crate) fn delete(
    conn: &Connection,
    tenant: &str,
    user: &str,
    id: &str,
) -> Result<Option<Task>, StoreError> {
    returning_task(
        conn,
        "DELETE FROM tasks WHERE id = ? AND tenant = ? AND user_id = ? \
         RETURNING id, title, description, completed, created_at_ms",
        [id, tenant, user],
    )
}

/// Run a write whose `RETURNING` clause yields at most one task row.
fn returning_task(
    conn: &Connection,
    sql: &str,
    params: [&str; 3],
) -> Result<Option<Task>, StoreError> {
    let row = conn
        .prepare_cached(sql)?
        .query_row(params, |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, bool>(3)?,
                row.get::<_, i64>(4)?,
            ))
        })
        .optional()?;
    row.map(|(id, title, description, completed, created)| {
        Ok(Task {
            id,
            title,
            description,
            completed,
            created_at_ms: sql_to_u64(created, "task created_at_ms")?,
        })
    })
    .transpose()
}
