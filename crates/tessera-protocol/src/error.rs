//! Stable error codes shared by the protocol and the engine.

use serde::Serialize;

/// A stable, machine-readable error code sent in `chat.error`. Clients switch on these, so a
/// variant is never renamed; new ones may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame is not a JSON object.
    MalformedFrame,
    /// The frame's `type` is not one we know.
    UnknownType,
    /// A field is missing or has the wrong type.
    InvalidField,
    /// The frame is larger than the configured limit.
    FrameTooLarge,
    /// A tool response names a correlation id this chat is not waiting on.
    UnknownCorrelation,
    /// A tool response does not follow the response contract.
    InvalidToolResponse,
    /// The chat is busy (e.g. a user message while an agent runs) or finished.
    NotAcceptingInput,
    /// The model failed (after retries) or answered garbage.
    LlmError,
    /// Structured output still failed validation after the correction attempt.
    StructuredOutputInvalid,
    /// A tool failed or was refused.
    ToolError,
    /// A UI tool was not answered in time.
    UiTimeout,
    /// The run hit `max_turns`.
    MaxTurns,
    /// Too many messages.
    RateLimited,
    /// Anything else; a bug on our side.
    Internal,
}

impl ErrorCode {
    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MalformedFrame => "malformed_frame",
            Self::UnknownType => "unknown_type",
            Self::InvalidField => "invalid_field",
            Self::FrameTooLarge => "frame_too_large",
            Self::UnknownCorrelation => "unknown_correlation",
            Self::InvalidToolResponse => "invalid_tool_response",
            Self::NotAcceptingInput => "not_accepting_input",
            Self::LlmError => "llm_error",
            Self::StructuredOutputInvalid => "structured_output_invalid",
            Self::ToolError => "tool_error",
            Self::UiTimeout => "ui_timeout",
            Self::MaxTurns => "max_turns",
            Self::RateLimited => "rate_limited",
            Self::Internal => "internal",
        }
    }

    /// The code of its wire name (a refusal relayed from another node); `None` if unknown.
    pub fn from_wire(code: &str) -> Option<Self> {
        [
            Self::MalformedFrame,
            Self::UnknownType,
            Self::InvalidField,
            Self::FrameTooLarge,
            Self::UnknownCorrelation,
            Self::InvalidToolResponse,
            Self::NotAcceptingInput,
            Self::LlmError,
            Self::StructuredOutputInvalid,
            Self::ToolError,
            Self::UiTimeout,
            Self::MaxTurns,
            Self::RateLimited,
            Self::Internal,
        ]
        .into_iter()
        .find(|c| c.as_str() == code)
    }
}

/// Why an inbound frame was refused. The connection stays usable; the client gets a
/// `chat.error` with [`FrameError::code`] and this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame is not valid JSON: {0}")]
    NotJson(String),
    #[error("frame must be a JSON object with a string \"type\"")]
    NotAnObject,
    #[error("unknown message type {0:?}")]
    UnknownType(String),
    #[error("field {field}: {problem}")]
    InvalidField {
        field: &'static str,
        problem: String,
    },
    #[error("frame of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
}

impl FrameError {
    /// The wire code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotJson(_) | Self::NotAnObject => ErrorCode::MalformedFrame,
            Self::UnknownType(_) => ErrorCode::UnknownType,
            Self::InvalidField { .. } => ErrorCode::InvalidField,
            Self::TooLarge { .. } => ErrorCode::FrameTooLarge,
        }
    }
}
