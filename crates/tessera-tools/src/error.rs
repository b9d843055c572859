//! Errors a tool call can end in, with stable machine-readable codes.
//!
//! WHY: the engine turns these into tool-result messages for the model and `chat.error`
//! events for the client; both need a code that does not change when the wording does.

use std::time::Duration;

/// Why a tool call did not produce a result. A tool's *business* failure (for example
/// "Task not found.") is not an error: it is an `Ok` result with `"status": "error"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The arguments failed strict validation; one short message per problem.
    #[error("invalid arguments: {}", .0.join("; "))]
    InvalidArgs(Vec<String>),
    /// The model asked for a tool that is not registered for it.
    #[error("unknown tool '{0}'")]
    UnknownTool(String),
    /// The tool did not finish within its time limit.
    #[error("tool timed out after {}ms", .0.as_millis())]
    Timeout(Duration),
    /// The tool itself failed (bad response, store failure, ...).
    #[error("tool failed: {0}")]
    Failed(String),
    /// An HTTP tool got an error status (or none, when the transport failed).
    #[error("http tool error{}: {message}", .status.map(|s| format!(" (status {s})")).unwrap_or_default())]
    Http {
        /// The HTTP status, when a response arrived.
        status: Option<u16>,
        /// Short description; never a full response body.
        message: String,
    },
    /// The call was cancelled (user cancel, chat closed, shutdown).
    #[error("tool call cancelled")]
    Cancelled,
}

impl ToolError {
    /// Stable snake_case code for logs, metrics and client-facing error payloads.
    pub fn code(&self) -> &'static str {
        match self {
            ToolError::InvalidArgs(_) => "invalid_args",
            ToolError::UnknownTool(_) => "unknown_tool",
            ToolError::Timeout(_) => "timeout",
            ToolError::Failed(_) => "tool_failed",
            ToolError::Http { .. } => "http_error",
            ToolError::Cancelled => "cancelled",
        }
    }

    /// This error as the result the model and the client read.
    pub fn to_result(&self) -> serde_json::Value {
        ToolErrorResult::new(Some(self.code()), &self.to_string()).to_value()
    }

    /// [`ToolError::to_result`] as JSON text.
    pub fn to_result_text(&self) -> String {
        ToolErrorResult::new(Some(self.code()), &self.to_string()).to_text()
    }
}

/// The result of a tool call that failed: `{"status": "error", "code"?, "message"}`. The one
/// place this shape is written, whether a tool returns it, the engine reports a failed call
/// with it, or the model reads it as text.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct ToolErrorResult<'a> {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'a str>,
    message: &'a str,
}

impl<'a> ToolErrorResult<'a> {
    /// A failure with a stable `code` (or none, for a tool's own business failure).
    pub fn new(code: Option<&'a str>, message: &'a str) -> Self {
        Self {
            status: "error",
            code,
            message,
        }
    }

    /// As a JSON value.
    pub fn to_value(&self) -> serde_json::Value {
        // Plain strings cannot fail to serialize.
        serde_json::to_value(self).unwrap_or_default()
    }

    /// As JSON text, `status` first (what the model reads).
    pub fn to_text(&self) -> String {
        // Plain strings cannot fail to serialize.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A storage backend failure (task or artifact store).
///
/// WHY separate from [`ToolError`]: stores are implemented by another crate against
/// SQL databases; they report backend trouble, and the tool decides how it surfaces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store error: {0}")]
pub struct StoreError(pub String);

impl From<StoreError> for ToolError {
    fn from(e: StoreError) -> Self {
        ToolError::Failed(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_failed_call_reads_the_same_as_text_and_as_value() {
        let err = ToolError::Failed("bad \"quote\"".into());
        assert_eq!(
            err.to_result_text(),
            r#"{"status":"error","code":"tool_failed","message":"tool failed: bad \"quote\""}"#
        );
        assert_eq!(
            err.to_result(),
            json!({"status": "error", "code": "tool_failed", "message": "tool failed: bad \"quote\""})
        );
        assert_eq!(
            ToolErrorResult::new(None, "nope").to_value(),
            json!({"status": "error", "message": "nope"})
        );
    }
}
