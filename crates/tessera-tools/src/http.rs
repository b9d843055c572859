//! Tools implemented by an HTTP endpoint.
//!
//! WHY: workflow authors implement tools as small web services; the engine POSTs the
//! validated arguments and the call context and takes the JSON response as the result.
//!
//! Retry policy. A tool call may have side effects (send an e-mail, charge a card), so a
//! request is retried only when the server almost certainly did not act on it:
//! - connect errors (DNS, refused, TLS handshake): the request was never sent;
//! - 502 Bad Gateway and 503 Service Unavailable: the proxy could not reach the tool, or the
//!   server refused the request because it is overloaded or down for maintenance. A buggy
//!   server *could* send 503 after acting, so every attempt carries the same
//!   `Idempotency-Key` header (turn key + hash of the arguments) for the server to dedupe on.
//!
//! Not retried: 504 Gateway Timeout (the upstream most likely received the request and may
//! still be running it; a retry would probably run it twice), client-side timeouts (same
//! reason), any other 5xx and all 4xx. At most [`MAX_RETRIES`] retries, with a short backoff.

use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::StatusCode;
use serde_json::{Map, Value};

use crate::args::truncate_chars;
use crate::{Tool, ToolContext, ToolError};

/// Retries after the first attempt, for the retryable failures only.
pub const MAX_RETRIES: u32 = 2;
/// Backoff before retry n (1-based) is `n * BASE_BACKOFF`.
const BASE_BACKOFF: Duration = Duration::from_millis(100);
/// Response bodies larger than this are refused (a tool result is summarized to ~1 KB anyway).
const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// How much of an error body goes into the error message.
const ERROR_BODY_PREVIEW_CHARS: usize = 200;

/// A tool that POSTs `{"args": {...}, "context": {...}}` to `url` and returns the JSON body.
#[derive(Debug, Clone)]
pub struct HttpTool {
    url: String,
    timeout: Duration,
    client: reqwest::Client,
    max_body_bytes: usize,
}

impl HttpTool {
    /// `client` should be the process-wide pooled client (cloning a `reqwest::Client` shares
    /// its pool). `timeout` bounds each attempt, from sending to the full body.
    pub fn new(url: impl Into<String>, timeout: Duration, client: reqwest::Client) -> Self {
        Self {
            url: url.into(),
            timeout,
            client,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }

    /// Override the largest accepted response body (default 4 MiB).
    pub fn with_max_body_bytes(mut self, max: usize) -> Self {
        self.max_body_bytes = max;
        self
    }

    /// The endpoint this tool calls.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Tool for HttpTool {
    fn invoke(
        &self,
        args: Map<String, Value>,
        ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        let this = self.clone();
        Box::pin(async move { this.call(args, ctx).await })
    }
}

/// What one attempt ended in.
enum Attempt {
    Done(Result<Value, ToolError>),
    Retry(ToolError),
}

impl HttpTool {
    async fn call(&self, args: Map<String, Value>, ctx: ToolContext) -> Result<Value, ToolError> {
        let args = Value::Object(args);
        let idempotency_key = format!(
            "{}:{:016x}",
            ctx.turn_idempotency_key,
            fnv1a(args.to_string().as_bytes())
        );
        let body = serde_json::json!({ "args": args, "context": ctx.to_json() });
        let mut retries = 0;
        loop {
            match self.attempt(&body, &idempotency_key).await {
                Attempt::Done(result) => return result,
                Attempt::Retry(err) if retries < MAX_RETRIES => {
                    retries += 1;
                    tracing::warn!(
                        url = %self.url,
                        retry = retries,
                        code = err.code(),
                        "retrying http tool call"
                    );
                    tokio::time::sleep(BASE_BACKOFF * retries).await;
                }
                Attempt::Retry(err) => return Err(err),
            }
        }
    }

    async fn attempt(&self, body: &Value, idempotency_key: &str) -> Attempt {
        let mut request = self
            .client
            .post(&self.url)
            .timeout(self.timeout)
            .header("Idempotency-Key", idempotency_key);
        // The caller's `execute_tool` span, when traces are exported.
        for (name, value) in tessera_telemetry::outgoing_headers() {
            request = request.header(name, value);
        }
        let sent = request.json(body).send().await;
        let response = match sent {
            Ok(r) => r,
            Err(e) if e.is_timeout() => {
                return Attempt::Done(Err(ToolError::Timeout(self.timeout)));
            }
            Err(e) if e.is_connect() => {
                return Attempt::Retry(ToolError::Http {
                    status: None,
                    message: format!("could not connect: {}", truncate_chars(&e.to_string(), 120)),
                });
            }
            Err(e) => {
                return Attempt::Done(Err(ToolError::Http {
                    status: None,
                    message: truncate_chars(&e.to_string(), 120),
                }));
            }
        };
        let status = response.status();
        let body = match self.read_body(response).await {
            Ok(b) => b,
            Err(e) => return Attempt::Done(Err(e)),
        };
        if status.is_success() {
            return Attempt::Done(serde_json::from_slice::<Value>(&body).map_err(|_| {
                ToolError::Failed(format!(
                    "tool endpoint returned a non-JSON body (status {status})"
                ))
            }));
        }
        let err = ToolError::Http {
            status: Some(status.as_u16()),
            message: error_message(status, &body),
        };
        if status == StatusCode::BAD_GATEWAY || status == StatusCode::SERVICE_UNAVAILABLE {
            Attempt::Retry(err)
        } else {
            Attempt::Done(Err(err))
        }
    }

    /// Read the whole body, refusing bodies over `max_body_bytes` without buffering them.
    async fn read_body(&self, mut response: reqwest::Response) -> Result<Vec<u8>, ToolError> {
        if response
            .content_length()
            .is_some_and(|len| len > self.max_body_bytes as u64)
        {
            return Err(ToolError::Failed("tool response body too large".to_owned()));
        }
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > self.max_body_bytes {
                        return Err(ToolError::Failed("tool response body too large".to_owned()));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => return Ok(body),
                Err(e) if e.is_timeout() => return Err(ToolError::Timeout(self.timeout)),
                Err(e) => {
                    return Err(ToolError::Http {
                        status: None,
                        message: format!(
                            "reading response failed: {}",
                            truncate_chars(&e.to_string(), 120)
                        ),
                    });
                }
            }
        }
    }
}

/// `"<reason>: <body preview>"`, preferring a JSON body's `message`/`error` string.
fn error_message(status: StatusCode, body: &[u8]) -> String {
    let reason = status.canonical_reason().unwrap_or("error");
    let detail = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            ["message", "error", "detail"]
                .iter()
                .find_map(|k| v.get(k).and_then(Value::as_str).map(str::to_owned))
        })
        .unwrap_or_else(|| {
            // Only the start of a (possibly huge) non-JSON body is looked at.
            let head = &body[..body.len().min(4 * ERROR_BODY_PREVIEW_CHARS)];
            String::from_utf8_lossy(head).trim().to_owned()
        });
    if detail.is_empty() {
        reason.to_owned()
    } else {
        format!(
            "{reason}: {}",
            truncate_chars(&detail, ERROR_BODY_PREVIEW_CHARS)
        )
    }
}

/// 64-bit FNV-1a; stable across processes (unlike `DefaultHasher`), which an idempotency key
/// needs.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
