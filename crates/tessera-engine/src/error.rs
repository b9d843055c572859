//! Errors the engine reports to its callers (the server maps them to HTTP and `chat.error`).

use tessera_protocol::ErrorCode;

use crate::correlator::CorrelationError;

/// An engine-level failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("unknown workflow {0:?}")]
    UnknownWorkflow(String),
    #[error("workflow cannot run: {0}")]
    Workflow(String),
    #[error("{0}")]
    NotAcceptingInput(String),
    #[error(transparent)]
    Correlation(#[from] CorrelationError),
    #[error("invalid tool response: {0}")]
    InvalidToolResponse(String),
    #[error("the chat is no longer running")]
    Unavailable,
    #[error("storage failed: {0}")]
    Store(String),
}

impl EngineError {
    /// The `chat.error` code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::UnknownWorkflow(_) | Self::Workflow(_) => ErrorCode::InvalidField,
            Self::NotAcceptingInput(_) => ErrorCode::NotAcceptingInput,
            Self::Correlation(_) => ErrorCode::UnknownCorrelation,
            Self::InvalidToolResponse(_) => ErrorCode::InvalidToolResponse,
            Self::Unavailable | Self::Store(_) => ErrorCode::Internal,
        }
    }
}
