//! SQL for the `tool_invocations` table: the exactly-once gate for tool side effects (rows
//! in write order, keyed by chat number and invocation key; see migration 5).
//!
//! Protocol: `claim` writes a 'started' row BEFORE the tool runs, `complete` marks it
//! 'completed' with the result after. The claim is one `INSERT ... ON CONFLICT DO NOTHING`,
//! atomic in SQLite across connections and processes, so at most one caller ever inserts the
//! row; everyone else reads the existing row. A row still 'started' after a crash means the
//! call was interrupted and must not be re-run.

use rusqlite::{Connection, OptionalExtension, params};

use crate::convert::{json_from_sql, now_ms};
use crate::{StoreError, ToolClaim};

/// Claim (chat, key), or report who has it.
pub(crate) fn claim(conn: &Connection, chat_id: &str, key: &str) -> Result<ToolClaim, StoreError> {
    let chat_no = crate::chats::number(conn, chat_id)?;
    let inserted = conn
        .prepare_cached(
            "INSERT INTO tool_invocations (chat_no, invocation_key, status, started_at_ms) \
             VALUES (?, ?, 'started', ?) ON CONFLICT (chat_no, invocation_key) DO NOTHING",
        )?
        .execute(params![chat_no, key, now_ms()])
        .map_err(|e| crate::sqlite_error::from_write(e, chat_id, "tool invocation"))?;
    if inserted == 1 {
        return Ok(ToolClaim::Claimed);
    }
    // Rows are never deleted except with their chat, so the row we collided with exists.
    let (status, result): (String, Option<String>) = conn
        .prepare_cached(
            "SELECT status, result FROM tool_invocations WHERE chat_no = ? AND invocation_key = ?",
        )?
        .query_row(params![chat_no, key], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?
        .ok_or_else(|| StoreError::NotFound(chat_id.to_owned()))?;
    match status.as_str() {
        "started" => Ok(ToolClaim::AlreadyStarted),
        "completed" => {
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

/// Mark a claimed invocation completed with its result (JSON text).
pub(crate) fn complete(
    conn: &Connection,
    chat_id: &str,
    key: &str,
    result: &str,
) -> Result<(), StoreError> {
    // An unknown chat has no claims: "never claimed" (NULL matches no row).
    let chat_no = match crate::chats::number(conn, chat_id) {
        Ok(number) => Some(number),
        Err(StoreError::NotFound(_)) => None,
        Err(other) => return Err(other),
    };
    let done = conn
        .prepare_cached(
            "UPDATE tool_invocations SET status = 'completed', result = ?, completed_at_ms = ? \
             WHERE chat_no = ? AND invocation_key = ? AND status = 'started'",
        )?
        .execute(params![result, now_ms(), chat_no, key])?;
    if done == 1 {
        return Ok(());
    }
    let status: Option<String> = conn
        .prepare_cached(
            "SELECT status FROM tool_invocations WHERE chat_no = ? AND invocation_key = ?",
        )?
        .query_row(params![chat_no, key], |row| row.get(0))
        .optional()?;
    Err(match status {
        None => StoreError::Conflict(format!(
            "tool invocation '{key}' of chat '{chat_id}' was never claimed"
        )),
        Some(_) => StoreError::Conflict(format!(
            "tool invocation '{key}' of chat '{chat_id}' is already completed"
        )),
    })
}
