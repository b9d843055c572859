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
