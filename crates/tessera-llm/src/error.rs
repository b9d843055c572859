//! Errors of a model call.
//!
//! Each variant tells the engine *what kind* of failure happened so that it can decide (retry
//! later, fail the turn, report a configuration problem) and show a stable [`LlmError::code`] to
//! users. Errors carry only owned strings — never a `reqwest::Error`, a request or a header —
//! so they are cheap to clone and cannot leak the API key.

use std::time::Duration;

/// Longest body excerpt kept in [`LlmError::Status`], in characters. Provider error bodies can
/// be large HTML pages; the first few hundred characters are enough to diagnose.
pub(crate) const BODY_EXCERPT_CHARS: usize = 300;

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlmError {
    /// The endpoint could not be reached or the connection broke (DNS, refused, reset, TLS).
    #[error("could not reach the model endpoint: {0}")]
    Http(String),

    /// No answer within the configured request timeout (or connect timeout).
    #[error("the model endpoint did not answer within {0:?}")]
    Timeout(Duration),

    /// The endpoint answered with a non-success HTTP status. `body_excerpt` is a short,
    /// key-redacted excerpt of the answer so that users can see the provider's reason.
    #[error("the model endpoint returned HTTP {status}: {body_excerpt}")]
    Status {
        /// The HTTP status code.
        status: u16,
        /// Start of the response body (or the provider's `error.message`), truncated.
        body_excerpt: String,
    },

    /// The provider kept rate-limiting (HTTP 429) until the retries were exhausted.
    #[error("the model endpoint is rate limiting requests{}", retry_hint(.retry_after))]
    RateLimited {
        /// How long the provider asked us to wait, when it said so.
        retry_after: Option<Duration>,
    },

    /// The endpoint answered 200 but the body is not a chat completion (not JSON, no choices,
    /// wrong field types).
    #[error("the model endpoint sent an invalid response: {0}")]
    InvalidResponse(String),

    /// A streamed answer broke off or contained an error event after it had started.
    #[error("the model's streamed answer failed: {0}")]
    Stream(String),

    /// The client is misconfigured (bad base URL, unusable settings).
    #[error("model client configuration error: {0}")]
    Config(String),

    /// The scripted demo model cannot answer (bad `demo.json`, unknown agent).
    #[error("demo script error: {0}")]
    Script(String),
}

fn retry_hint(retry_after: &Option<Duration>) -> String {
    match retry_after {
        Some(d) => format!(" (retry after {}s)", d.as_secs_f64().ceil()),
        None => String::new(),
    }
}

impl LlmError {
    /// A stable snake_case code for logs, events and UIs; unlike the message, it never changes
    /// wording, so clients can match on it.
    pub fn code(&self) -> &'static str {
        match self {
            LlmError::Http(_) => "llm_http",
            LlmError::Timeout(_) => "llm_timeout",
            LlmError::Status { .. } => "llm_http_status",
            LlmError::RateLimited { .. } => "llm_rate_limited",
            LlmError::InvalidResponse(_) => "llm_invalid_response",
            LlmError::Stream(_) => "llm_stream",
            LlmError::Config(_) => "llm_config",
            LlmError::Script(_) => "llm_script",
        }
    }

    /// True when the same request may succeed if sent again later (transport trouble, timeouts,
    /// rate limits, server-side errors). The HTTP client already retries these internally; this
    /// tells the engine whether retrying the whole turn later is worth it.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Http(_) | LlmError::Timeout(_) | LlmError::RateLimited { .. } => true,
            LlmError::Status { status, .. } => is_retryable_status(*status),
            LlmError::InvalidResponse(_)
            | LlmError::Stream(_)
            | LlmError::Config(_)
            | LlmError::Script(_) => false,
        }
    }
}

/// HTTP statuses worth retrying: request timeout, conflict, rate limit, and server errors.
pub(crate) fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429 | 500..=599)
}

/// Cut `text` to at most `max_chars` characters (on a char boundary), marking the cut.
pub(crate) fn truncate_chars(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_and_distinct() {
        let all = [
            LlmError::Http(String::new()),
            LlmError::Timeout(Duration::from_secs(1)),
            LlmError::Status {
                status: 500,
                body_excerpt: String::new(),
            },
            LlmError::RateLimited { retry_after: None },
            LlmError::InvalidResponse(String::new()),
            LlmError::Stream(String::new()),
            LlmError::Config(String::new()),
            LlmError::Script(String::new()),
        ];
        let codes: std::collections::HashSet<_> = all.iter().map(LlmError::code).collect();
        assert_eq!(codes.len(), all.len());
        assert_eq!(all[1].code(), "llm_timeout");
        assert_eq!(all[2].code(), "llm_http_status");
        assert_eq!(all[3].code(), "llm_rate_limited");
        assert_eq!(all[4].code(), "llm_invalid_response");
    }

    #[test]
    fn retryable_classification() {
        assert!(LlmError::Http("reset".into()).is_retryable());
        assert!(LlmError::Timeout(Duration::from_secs(1)).is_retryable());
        assert!(LlmError::RateLimited { retry_after: None }.is_retryable());
        for status in [408, 409, 429, 500, 502, 503, 599] {
            assert!(
                LlmError::Status {
                    status,
                    body_excerpt: String::new()
                }
                .is_retryable()
            );
        }
        for status in [400, 401, 403, 404, 422] {
            assert!(
                !LlmError::Status {
                    status,
                    body_excerpt: String::new()
                }
                .is_retryable()
            );
        }
        assert!(!LlmError::InvalidResponse("x".into()).is_retryable());
        assert!(!LlmError::Script("x".into()).is_retryable());
    }

    #[test]
    fn rate_limited_message_mentions_delay() {
        let e = LlmError::RateLimited {
            retry_after: Some(Duration::from_secs(3)),
        };
        assert!(e.to_string().contains("retry after 3s"), "{e}");
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_chars("héllo", 2), "hé…");
        assert_eq!(truncate_chars("hi", 5), "hi");
        assert_eq!(truncate_chars("", 0), "");
    }
}
