//! SQL for the `tool_invocations` table: the exactly-once gate for tool side effects.
//!
//! Protocol: `claim` writes a 'started' row BEFORE the tool runs, `complete` marks it
//! 'completed' with the result after. The claim is one `INSERT ... ON CONFLICT DO NOTHING`,
//! atomic in SQLite across connections and processes, so at most one caller ever inserts the
//! row; everyone else reads the existing row. A row still 'started' after a crash means the
//! call was interrupted and must not be re-run.

use sqlx::{Row, SqlitePool};

use crate::convert::{json_from_sql, now_ms};
use crate::{StoreError, ToolClaim};

/// Claim (chat, key), or report who has it.
pub(crate) async fn claim(
    pool: SqlitePool,
    chat_id: String,
    key: String,
) -> Result<ToolClaim, StoreError> {
    let inserted = sqlx::query(
        "INSERT INTO tool_invocations (chat_id, invocation_key, status, started_at_ms) \
         VALUES (?, ?, 'started', ?) ON CONFLICT (chat_id, invocation_key) DO NOTHING",
    )
    .bind(&chat_id)
    .bind(&key)
    .bind(now_ms())
    .execute(&pool)
    .await
    .map_err(|e| StoreError::from_write(e, &chat_id, "tool invocation"))?;
    if inserted.rows_affected() == 1 {
        return Ok(ToolClaim::Claimed);
    }
    // Rows are never deleted except with their chat, so the row we collided with exists.
    let row = sqlx::query(
        "SELECT status, result FROM tool_invocations WHERE chat_id = ? AND invocation_key = ?",
    )
    .bind(&chat_id)
    .bind(&key)
    .fetch_optional(&pool)
    .await?
    .ok_or_else(|| StoreError::ChatNotFound(chat_id.clone()))?;
    let status: String = row.try_get("status")?;
    match status.as_str() {
        "started" => Ok(ToolClaim::AlreadyStarted),
        "completed" => {
            let result: Option<String> = row.try_get("result")?;
            let result = result
                .map(|text| json_from_sql(&text, "tool result"))
                .transpose()?;
            Ok(ToolClaim::AlreadyCompleted(result))
        }
        other => Err(StoreError::Corrupt(format!(
            "tool invocation '{key}' has status '{other}'"
        ))),
    }
}

/// Mark a claimed invocation completed with its result.
pub(crate) async fn complete(
    pool: SqlitePool,
    chat_id: String,
    key: String,
    result: Result<String, serde_json::Error>,
) -> Result<(), StoreError> {
    let result = result?;
    let done = sqlx::query(
        "UPDATE tool_invocations SET status = 'completed', result = ?, completed_at_ms = ? \
         WHERE chat_id = ? AND invocation_key = ? AND status = 'started'",
    )
    .bind(result)
    .bind(now_ms())
    .bind(&chat_id)
    .bind(&key)
    .execute(&pool)
    .await?;
    if done.rows_affected() == 1 {
        return Ok(());
    }
    let status: Option<String> = sqlx::query_scalar(
        "SELECT status FROM tool_invocations WHERE chat_id = ? AND invocation_key = ?",
    )
    .bind(&chat_id)
    .bind(&key)
    .fetch_optional(&pool)
    .await?;
    Err(match status {
        None => StoreError::Conflict(format!(
            "tool invocation '{key}' of chat '{chat_id}' was never claimed"
        )),
        Some(_) => StoreError::Conflict(format!(
            "tool invocation '{key}' of chat '{chat_id}' is already completed"
        )),
    })
}
