//! A [`ChatModel`] for any OpenAI-compatible chat-completions endpoint (OpenAI, Ollama, vLLM,
//! llama.cpp server, LiteLLM, ...).
//!
//! One [`OpenAiClient`] is shared by every chat; each thread that calls it keeps idle
//! connections of its own (see `Inner::send`), which reach the endpoint directly or through
//! the proxy the environment names for it (`transport`), and carry one HTTP/1.1 exchange at a
//! time (`h1`). Transient
//! failures (connect errors, timeouts, 408/409/429/5xx) are retried with jittered exponential
//! backoff, honouring `Retry-After`; a streamed answer is retried only while none of its body
//! has been read, so deltas are never delivered twice. The API key is sent as a bearer token
//! and never appears in `Debug` output, logs or errors.

mod delta_window;
mod h1;
mod sse;
mod transport;
mod wire;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use http::header::HeaderValue;
use hyper_util::client::proxy::matcher::Matcher;

use self::delta_window::DeltaWindow;
use self::h1::{ExchangeError, ModelConnection, ModelResponse};
pub use self::sse::{MAX_EVENT_BYTES, SseParser};
use self::transport::{Connector, IDLE_TIMEOUT, RequestHead, Route, describe, transport_error};
use self::wire::{
    RequestBody, StreamAssembler, encode_request, parse_completion, provider_error_message,
};
use crate::error::{BODY_EXCERPT_CHARS, is_retryable_status, truncate_chars};
use crate::{ChatModel, ChatRequest, ChatResponse, DeltaSink, LlmError};

/// Largest non-streamed response body accepted; a chat completion is far smaller, so anything
/// bigger is a misbehaving endpoint, not an answer worth buffering.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How much of an error response body is read to build the excerpt.
const MAX_ERROR_BODY_BYTES: usize = 8 * 1024;

/// What replaces the API key wherever it could show up in text.
const REDACTED: &str = "[redacted]";

/// Settings of an [`OpenAiClient`]. Build one with [`OpenAiConfig::default`] or
/// [`OpenAiConfig::from_env`] and adjust the public fields.
#[derive(Clone, PartialEq)]
pub struct OpenAiConfig {
    /// Endpoint root up to and including the version, e.g. `https://api.openai.com/v1` or
    /// `http://localhost:11434/v1`; `/chat/completions` is appended.
    pub base_url: String,
    /// Sent as `Authorization: Bearer ...` when set. Local servers usually need none.
    pub api_key: Option<String>,
    /// Model used when a request does not name one; also the client's user-visible label.
    pub default_model: String,
    /// Limit for one attempt: until the whole body for a plain request; until the headers and
    /// then between two chunks for a streamed one, so that long generations are not cut off.
    pub request_timeout: Duration,
    /// Limit for establishing a connection.
    pub connect_timeout: Duration,
    /// Attempts per request, including the first (at least 1).
    pub max_attempts: u32,
    /// Delay before the first retry; doubles with each further retry.
    pub backoff_base: Duration,
    /// Upper bound of the backoff delay; `Retry-After` is honoured up to four times this.
    pub backoff_max: Duration,
    /// A streamed answer's text goes on at most this often: its first text at once, later text
    /// joined and passed on with the first read this long after the last, and no text held
    /// longer than this. Zero passes on what each read brought as soon as it is parsed. See
    /// `delta_window`.
    pub delta_interval: Duration,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".to_owned(),
            api_key: None,
            default_model: "gpt-4o-mini".to_owned(),
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            max_attempts: 4,
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(8),
            delta_interval: Duration::ZERO,
        }
    }
}

/// Redacts the API key: configs get logged and printed in diagnostics.
impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| REDACTED))
            .field("default_model", &self.default_model)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_attempts", &self.max_attempts)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("delta_interval", &self.delta_interval)
            .finish()
    }
}

impl OpenAiConfig {
    /// Defaults overridden by the conventional variables `OPENAI_BASE_URL` (or the older
    /// `OPENAI_API_BASE`), `OPENAI_API_KEY` and `OPENAI_MODEL`, so that pointing Tessera at
    /// Ollama, vLLM, llama.cpp or LiteLLM needs no Tessera-specific settings. Empty values
    /// count as unset.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`OpenAiConfig::from_env`] but reading variables through `lookup`, so that callers
    /// and tests can supply them without touching the process environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut config = Self::default();
        if let Some(url) = get("OPENAI_BASE_URL").or_else(|| get("OPENAI_API_BASE")) {
            config.base_url = url;
        }
        config.api_key = get("OPENAI_API_KEY");
        if let Some(model) = get("OPENAI_MODEL") {
            config.default_model = model;
        }
        config
    }
}

/// A [`ChatModel`] over HTTP. Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct OpenAiClient {
    inner: Arc<Inner>,
}

struct Inner {
    /// Opens the connections: directly or through the environment's proxy, TLS for https.
    connector: Connector,
    /// The endpoint and the head every request starts with (the API key: never shown).
    head: RequestHead,
    endpoint: url::Url,
    config: OpenAiConfig,
}

thread_local! {
    /// This thread's idle connections, per live [`OpenAiClient`] (usually exactly one), the
    /// most recently used last.
    static THREAD_IDLE: RefCell<Vec<(Weak<Inner>, VecDeque<ModelConnection>)>> =
        const { RefCell::new(Vec::new()) };
}

impl Inner {
    /// Sends `body` and reads the response's head, on an idle connection of the calling
    /// thread when one is usable, else on a new one.
    ///
    /// WHY per thread: the engine runs chats on several single-threaded arbiters, each with
    /// its own I/O driver; a connection opened on one arbiter and used on another would have
    /// its readiness reported to the wrong thread. Keeping each thread's connections apart
    /// keeps a call on one thread.
    async fn send(
        self: &Arc<Self>,
        body: &RequestBody,
        stream: bool,
    ) -> Result<ModelResponse, ExchangeError> {
        let head = self.head.for_body(body.len(), stream);
        let mut idle = self.take_idle();
        loop {
            let connection = match idle.take() {
                Some(connection) => connection,
                None => self.connector.connect(self.head.uri()).await?,
            };
            let reused = connection.reused();
            match connection.exchange(&head, body.parts()).await {
                Ok(response) => return Ok(response),
                // The peer closed the idle connection as the request went out: once more, on a
                // new connection (the attempt has not failed).
                Err(e) if reused && e.before_response() => {
                    tracing::debug!(error = %describe(&e), "an idle model connection was closed; reconnecting");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The calling thread's most recently used idle connection that is still usable.
    fn take_idle(self: &Arc<Self>) -> Option<ModelConnection> {
        THREAD_IDLE.with(|pools| {
            let mut pools = pools.borrow_mut();
            let me = Arc::as_ptr(self);
            let (_, idle) = pools.iter_mut().find(|(owner, _)| owner.as_ptr() == me)?;
            close_expired(idle);
            while let Some(mut connection) = idle.pop_back() {
                if connection.still_usable(IDLE_TIMEOUT) {
                    return Some(connection);
                }
            }
            None
        })
    }

    /// Puts `response`'s connection back among the calling thread's idle ones, if its body
    /// has ended and it can carry another request; otherwise it closes.
    fn keep(self: &Arc<Self>, response: ModelResponse) {
        let Some(connection) = response.into_idle() else {
            return;
        };
        THREAD_IDLE.with(|pools| {
            let mut pools = pools.borrow_mut();
            let me = Arc::as_ptr(self);
            let idle = match pools.iter().position(|(owner, _)| owner.as_ptr() == me) {
                Some(at) => &mut pools[at].1,
                None => {
                    // Connections of dropped `OpenAiClient`s (a reloaded configuration) go here.
                    pools.retain(|(owner, _)| owner.strong_count() > 0);
                    pools.push((Arc::downgrade(self), VecDeque::new()));
                    let last = pools.len() - 1;
                    &mut pools[last].1
                }
            };
            close_expired(idle);
            idle.push_back(connection);
        });
    }
}

/// Closes the connections of `idle` (the oldest first) that have been idle too long.
///
/// WHY on every use of a thread's idle list: no task watches idle connections, so one that
/// the peer closed stays open on this side until its list is next used.
fn close_expired(idle: &mut VecDeque<ModelConnection>) {
    while idle
        .front()
        .is_some_and(|oldest| !oldest.idle_within(IDLE_TIMEOUT))
    {
        idle.pop_front();
    }
}

impl fmt::Debug for OpenAiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiClient")
            .field("endpoint", &self.inner.endpoint.as_str())
            .field("config", &self.inner.config)
            .finish()
    }
}

impl OpenAiClient {
    /// Validate `config` and build the pooled HTTP client. Fails with `LlmError::Config` for an
    /// unusable base URL, zero attempts or timeouts, or an API key that cannot be a header.
    pub fn new(config: OpenAiConfig) -> Result<Self, LlmError> {
        let endpoint = endpoint_url(&config.base_url)?;
        if config.max_attempts == 0 {
            return Err(LlmError::Config(
                "max_attempts must be at least 1".to_owned(),
            ));
        }
        if config.request_timeout.is_zero() || config.connect_timeout.is_zero() {
            return Err(LlmError::Config(
                "timeouts must be greater than zero".to_owned(),
            ));
        }
        let authorization = match config.api_key.as_deref().filter(|k| !k.is_empty()) {
            Some(key) => Some(
                HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                    LlmError::Config(
                        "the API key contains characters not allowed in a header".to_owned(),
                    )
                })?,
            ),
            None => None,
        };
        let uri = http::Uri::try_from(endpoint.as_str())
            .map_err(|e| LlmError::Config(format!("invalid endpoint {endpoint}: {e}")))?;
        let (route, proxy_authorization) =
            Route::to(&uri, &Matcher::from_env(), config.connect_timeout)?;
        let head = RequestHead::new(uri, authorization, proxy_authorization, &route);
        let connector = Connector::new(route, transport::tls_config()?);
        Ok(Self {
            inner: Arc::new(Inner {
                connector,
                head,
                endpoint,
                config,
            }),
        })
    }

    /// The configuration this client was built with.
    pub fn config(&self) -> &OpenAiConfig {
        &self.inner.config
    }

    /// The full chat-completions URL requests are posted to.
    pub fn endpoint(&self) -> &str {
        self.inner.endpoint.as_str()
    }
}

impl ChatModel for OpenAiClient {
    fn complete(
        &self,
        request: ChatRequest,
        deltas: Option<DeltaSink>,
    ) -> BoxFuture<'static, Result<ChatResponse, LlmError>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let result = inner.run(request, deltas).await;
            result.map_err(|e| redact_error(e, inner.config.api_key.as_deref()))
        })
    }

    fn label(&self) -> &str {
        &self.inner.config.default_model
    }

    fn provider_name(&self) -> &'static str {
        "openai"
    }
}

/// `{base_url}/chat/completions`, validated.
fn endpoint_url(base_url: &str) -> Result<url::Url, LlmError> {
    let base = base_url.trim().trim_end_matches('/');
    let url = url::Url::parse(&format!("{base}/chat/completions"))
        .map_err(|e| LlmError::Config(format!("invalid base URL {base:?}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(LlmError::Config(format!(
            "base URL {base:?} must use http or https"
        )));
    }
    Ok(url)
}

/// A failed attempt and whether another attempt may help.
struct Failure {
    error: LlmError,
    retry: bool,
    retry_after: Option<Duration>,
}

impl Failure {
    fn retry(error: LlmError) -> Self {
        Self {
            error,
            retry: true,
            retry_after: None,
        }
    }

    fn fatal(error: LlmError) -> Self {
        Self {
            error,
            retry: false,
            retry_after: None,
        }
    }
}

impl Inner {
    async fn run(
        self: &Arc<Self>,
        request: ChatRequest,
        deltas: Option<DeltaSink>,
    ) -> Result<ChatResponse, LlmError> {
        let model = request
            .model
            .clone()
            .unwrap_or_else(|| self.config.default_model.clone());
        let body = encode_request(&request, &model)
            .map_err(|e| LlmError::Config(format!("cannot encode the request: {e}")))?;
        let mut sink = deltas;
        let mut on_delta = |text: &str| {
            if let Some(sink) = sink.as_mut() {
                sink(text);
            }
        };

        let mut attempt = 1;
        loop {
            let started = Instant::now();
            let result = if request.stream {
                self.attempt_stream(&body, &model, &mut on_delta).await
            } else {
                self.attempt_plain(&body, &model).await
            };
            let latency_ms = started.elapsed().as_millis() as u64;
            let failure = match result {
                Ok(mut response) => {
                    // The message is the requesting agent's turn; say so, as the scripted model does.
                    response.message.name = Some(request.agent.as_str().into());
                    tracing::debug!(
                        agent = %request.agent, model = %response.model, attempt, latency_ms,
                        stream = request.stream, status = 200u16,
                        prompt_tokens = response.usage.prompt_tokens,
                        completion_tokens = response.usage.completion_tokens,
                        "chat completion succeeded"
                    );
                    return Ok(response);
                }
                Err(failure) => failure,
            };
            let status = match &failure.error {
                LlmError::Status { status, .. } => Some(*status),
                LlmError::RateLimited { .. } => Some(429),
                _ => None,
            };
            if !failure.retry || attempt >= self.config.max_attempts {
                tracing::debug!(
                    agent = %request.agent, model = %model, attempt, latency_ms, stream = request.stream,
                    status, error = failure.error.code(), "chat completion failed"
                );
                return Err(failure.error);
            }
            let delay = match failure.retry_after {
                Some(wait) => wait.min(self.config.backoff_max.saturating_mul(4)),
                None => backoff_delay(&self.config, attempt),
            };
            tracing::debug!(
                agent = %request.agent, model = %model, attempt, latency_ms, stream = request.stream,
                status, error = failure.error.code(), retry_in_ms = delay.as_millis() as u64,
                "chat completion attempt failed; retrying"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// One non-streamed attempt; the timeout covers connect, headers and the whole body.
    async fn attempt_plain(
        self: &Arc<Self>,
        body: &RequestBody,
        model: &str,
    ) -> Result<ChatResponse, Failure> {
        let timeout = self.config.request_timeout;
        let exchange = async {
            let response = self
                .send(body, false)
                .await
                .map_err(|e| Failure::retry(transport_error(&e, timeout)))?;
            let mut response = self.check_status(response).await?;
            // Nothing has been delivered to anyone yet, so a broken body is safe to retry.
            let read = read_capped(&mut response, MAX_RESPONSE_BYTES)
                .await
                .map_err(|e| Failure::retry(transport_error(&e, timeout)))?;
            self.keep(response);
            Ok(read)
        };
        let (bytes, truncated) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| Failure::retry(LlmError::Timeout(timeout)))??;
        if truncated {
            return Err(Failure::fatal(LlmError::InvalidResponse(format!(
                "response body exceeds {MAX_RESPONSE_BYTES} bytes"
            ))));
        }
        parse_completion(&bytes, model).map_err(Failure::fatal)
    }

    /// One streamed attempt. Retryable only until the first byte of a successful body arrives.
    async fn attempt_stream(
        self: &Arc<Self>,
        body: &RequestBody,
        model: &str,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<ChatResponse, Failure> {
        let timeout = self.config.request_timeout;
        let mut response = tokio::time::timeout(timeout, self.send(body, true))
            .await
            .map_err(|_| Failure::retry(LlmError::Timeout(timeout)))?
            .map_err(|e| Failure::retry(transport_error(&e, timeout)))?;
        response = tokio::time::timeout(timeout, self.check_status(response))
            .await
            .map_err(|_| Failure::retry(LlmError::Timeout(timeout)))??;

        let is_event_stream = response.header("content-type").is_some_and(|ct| {
            ct.get(..17)
                .is_some_and(|start| start.eq_ignore_ascii_case("text/event-stream"))
        });
        if !is_event_stream {
            // Some servers ignore `stream: true` and answer with a plain completion.
            let (bytes, truncated) =
                tokio::time::timeout(timeout, read_capped(&mut response, MAX_RESPONSE_BYTES))
                    .await
                    .map_err(|_| Failure::retry(LlmError::Timeout(timeout)))?
                    .map_err(|e| Failure::retry(transport_error(&e, timeout)))?;
            self.keep(response);
            if truncated {
                return Err(Failure::fatal(LlmError::InvalidResponse(format!(
                    "response body exceeds {MAX_RESPONSE_BYTES} bytes"
                ))));
            }
            let completion = parse_completion(&bytes, model).map_err(Failure::fatal)?;
            if let Some(text) = completion
                .message
                .content
                .as_deref()
                .filter(|t| !t.is_empty())
            {
                on_delta(text);
            }
            return Ok(completion);
        }

        let mut window = DeltaWindow::new(self.config.delta_interval);
        let result = self
            .read_event_stream(response, model, &mut window, on_delta)
            .await;
        // What the window holds goes on before the answer, or before the error that ends it:
        // text that was read is passed on, as it is without a window.
        window.flush(tokio::time::Instant::now(), on_delta);
        result
    }

    /// Reads a streamed answer's events, passing its text on through `window`.
    async fn read_event_stream(
        self: &Arc<Self>,
        mut response: ModelResponse,
        model: &str,
        window: &mut DeltaWindow,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<ChatResponse, Failure> {
        let timeout = self.config.request_timeout;
        let mut parser = SseParser::new();
        let mut assembler = StreamAssembler::default();
        // The text of one read's events, passed on as one delta (see below).
        let mut read_text = String::new();
        let mut started = false;
        let mut done = false;
        let sent_at = Instant::now();
        // One timer for the whole stream, moved on before each read. WHY: a timeout per read
        // put an entry in the runtime's timer wheel and took it out again for every token
        // (~1.8% of the server's CPU with a model that streams at a pace), where moving a
        // waiting timer later only updates its deadline.
        let read_timer = tokio::time::sleep(timeout);
        let mut read_timer = std::pin::pin!(read_timer);
        while !done {
            let read = {
                let deadline = tokio::time::Instant::now() + timeout;
                read_timer.as_mut().reset(deadline);
                let mut next = std::pin::pin!(response.next_chunk());
                match window.due().filter(|&due| due < deadline) {
                    // Text is held: it goes on when it is due, while the read goes on waiting.
                    Some(due) => match tokio::time::timeout_at(due, next.as_mut()).await {
                        Ok(read) => Some(read),
                        Err(_) => {
                            window.flush(due, on_delta);
                            before_timer(next, read_timer.as_mut()).await
                        }
                    },
                    None => before_timer(next, read_timer.as_mut()).await,
                }
            };
            let chunk = match read {
                None => {
                    let error = LlmError::Timeout(timeout);
                    return Err(if started {
                        Failure::fatal(error)
                    } else {
                        Failure::retry(error)
                    });
                }
                Some(Err(e)) => return Err(body_failure(&e, started, timeout)),
                Some(Ok(None)) => break,
                Some(Ok(Some(chunk))) => chunk,
            };
            // The events of one read reach the sink as one delta: each delta becomes an event
            // for the chat's clients (logged, sent, stored), and when the reader falls behind
            // the provider (under load, or a provider that sends tokens in batches) this
            // publishes one event per read instead of one per token. Nothing waits for it: the
            // text goes on as soon as what was read is parsed. A chunked body's chunks that
            // came in the same read are taken here too (`next_buffered_chunk`).
            let mut invalid = None;
            let mut too_large = None;
            let mut broken = None;
            let mut next = Some(chunk);
            while let Some(piece) = next.take() {
                if !started && !piece.is_empty() {
                    started = true;
                    tracing::Span::current().record(
                        tessera_telemetry::TIME_TO_FIRST_CHUNK,
                        sent_at.elapsed().as_secs_f64(),
                    );
                }
                let parsed = parser.push_each(&piece, |data| {
                    if data.trim() == "[DONE]" {
                        return ControlFlow::Break(());
                    }
                    match assembler.apply(data, &mut |text| read_text.push_str(text)) {
                        Ok(()) => ControlFlow::Continue(()),
                        Err(error) => {
                            invalid = Some(error);
                            ControlFlow::Break(())
                        }
                    }
                });
                match parsed {
                    Ok(ControlFlow::Continue(())) => {}
                    Ok(ControlFlow::Break(())) => {
                        done = true;
                        break;
                    }
                    Err(error) => {
                        too_large = Some(error);
                        break;
                    }
                }
                match response.next_buffered_chunk() {
                    Ok(more) => next = more,
                    Err(error) => broken = Some(error),
                }
            }
            // What was read before a broken event still goes out, as it did event by event.
            if !read_text.is_empty() {
                window.push(&read_text, tokio::time::Instant::now(), on_delta);
                read_text.clear();
            }
            if let Some(error) = too_large.or(invalid) {
                return Err(Failure::fatal(error));
            }
            if let Some(error) = broken {
                return Err(body_failure(&error, started, timeout));
            }
        }
        // Kept even when the loop stopped at `[DONE]` before the body's end: the rest is read
        // before the connection's next request (`h1::ModelConnection::still_usable`).
        self.keep(response);
        if !done && let Some(data) = parser.finish() {
            if data.trim() == "[DONE]" {
                done = true;
            } else {
                assembler
                    .apply(&data, &mut |text| read_text.push_str(text))
                    .map_err(Failure::fatal)?;
                window.push(&read_text, tokio::time::Instant::now(), on_delta);
            }
        }
        if !done && !assembler.has_finished() {
            let error =
                LlmError::Stream("the stream ended before the answer was complete".to_owned());
            return Err(if started {
                Failure::fatal(error)
            } else {
                Failure::retry(error)
            });
        }
        assembler.finish(model).map_err(Failure::fatal)
    }

    /// Pass a success through; turn anything else into a failure carrying a body excerpt.
    async fn check_status(
        self: &Arc<Self>,
        mut response: ModelResponse,
    ) -> Result<ModelResponse, Failure> {
        let status = response.status();
        if (200..300).contains(&status) {
            return Ok(response);
        }
        let retry_after = retry_after(|name| response.header(name));
        // The excerpt is the best effort: a body that cannot be read leaves it empty.
        let body = match read_capped(&mut response, MAX_ERROR_BODY_BYTES).await {
            Ok((body, truncated)) => {
                if !truncated {
                    self.keep(response);
                }
                body
            }
            Err(_) => Vec::new(),
        };
        let error = if status == 429 {
            LlmError::RateLimited { retry_after }
        } else {
            LlmError::Status {
                status,
                body_excerpt: error_excerpt(&body),
            }
        };
        Err(Failure {
            error,
            retry: is_retryable_status(status),
            retry_after,
        })
    }
}

/// `read`'s output, or `None` when `timer` goes off first.
async fn before_timer<F: Future>(
    read: F,
    mut timer: Pin<&mut tokio::time::Sleep>,
) -> Option<F::Output> {
    let mut read = std::pin::pin!(read);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = read.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// A streamed body that broke off: before its first byte another attempt may help; after it,
/// the caller has had part of the answer, so the call fails.
fn body_failure(error: &ExchangeError, started: bool, timeout: Duration) -> Failure {
    if started {
        Failure::fatal(LlmError::Stream(format!(
            "connection lost: {}",
            describe(error)
        )))
    } else {
        Failure::retry(transport_error(error, timeout))
    }
}

/// Read at most `cap` bytes of the body; the flag says whether more was left.
async fn read_capped(
    response: &mut ModelResponse,
    cap: usize,
) -> Result<(Vec<u8>, bool), ExchangeError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.next_chunk().await? {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// The provider's `error.message` when the body is an OpenAI-style error, else the raw text;
/// truncated either way.
fn error_excerpt(body: &[u8]) -> String {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(provider_error_message));
    let text = match message {
        Some(message) => message,
        None => String::from_utf8_lossy(body).trim().to_owned(),
    };
    if text.is_empty() {
        "<empty body>".to_owned()
    } else {
        truncate_chars(&text, BODY_EXCERPT_CHARS)
    }
}

/// `Retry-After` in seconds (HTTP dates are ignored), or OpenAI's `retry-after-ms`, from a
/// response's `header` values.
fn retry_after<'h>(header: impl Fn(&str) -> Option<&'h str>) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let value: f64 = header(name)?.trim().parse().ok()?;
        (value.is_finite() && value >= 0.0).then_some(value)
    };
    // Clamp before converting: absurd values must not overflow `Duration`.
    const DAY_SECS: f64 = 86_400.0;
    if let Some(ms) = number("retry-after-ms") {
        return Duration::try_from_secs_f64((ms / 1000.0).min(DAY_SECS)).ok();
    }
    number("retry-after").and_then(|s| Duration::try_from_secs_f64(s.min(DAY_SECS)).ok())
}

/// Exponential backoff after failed attempt number `attempt` (1-based), with "equal jitter":
/// half of the delay is fixed, half random, so that many chats hitting the same limit spread out.
fn backoff_delay(config: &OpenAiConfig, attempt: u32) -> Duration {
    let exponent = attempt.saturating_sub(1).min(20);
    let delay = config
        .backoff_base
        .saturating_mul(1 << exponent)
        .min(config.backoff_max);
    let half = delay / 2;
    half + half.mul_f64(jitter())
}

/// A number in `[0, 1)` that differs between calls. Uses std's randomly keyed hasher, which is
/// plenty for spreading retries and needs no extra dependency.
fn jitter() -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    hasher.write_u128(nanos);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Remove every occurrence of the API key from the error's text, whatever its origin.
fn redact_error(error: LlmError, key: Option<&str>) -> LlmError {
    let Some(key) = key.filter(|k| k.len() >= 4) else {
        return error;
    };
    let scrub = |text: String| {
        if text.contains(key) {
            text.replace(key, REDACTED)
        } else {
            text
        }
    };
    match error {
        LlmError::Http(t) => LlmError::Http(scrub(t)),
        LlmError::Status {
            status,
            body_excerpt,
        } => LlmError::Status {
            status,
            body_excerpt: scrub(body_excerpt),
        },
        LlmError::InvalidResponse(t) => LlmError::InvalidResponse(scrub(t)),
        LlmError::Stream(t) => LlmError::Stream(scrub(t)),
        LlmError::Config(t) => LlmError::Config(scrub(t)),
        LlmError::Script(t) => LlmError::Script(scrub(t)),
        other @ (LlmError::Timeout(_) | LlmError::RateLimited { .. }) => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_lookup_reads_the_usual_variables() {
        let vars = |name: &str| match name {
            "OPENAI_BASE_URL" => Some("http://localhost:11434/v1/".to_owned()),
            "OPENAI_API_KEY" => Some("  ".to_owned()),
            "OPENAI_MODEL" => Some("llama3.2".to_owned()),
            _ => None,
        };
        let config = OpenAiConfig::from_lookup(vars);
        assert_eq!(config.base_url, "http://localhost:11434/v1/");
        assert_eq!(config.api_key, None);
        assert_eq!(config.default_model, "llama3.2");
        let client = OpenAiClient::new(config).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            client.endpoint(),
            "http://localhost:11434/v1/chat/completions"
        );
        assert_eq!(client.label(), "llama3.2");

        let legacy = OpenAiConfig::from_lookup(|name| {
            (name == "OPENAI_API_BASE").then(|| "http://x/v1".to_owned())
        });
        assert_eq!(legacy.base_url, "http://x/v1");
        assert_eq!(OpenAiConfig::from_lookup(|_| None), OpenAiConfig::default());
    }

    #[test]
    fn debug_output_redacts_the_key() {
        let config = OpenAiConfig {
            api_key: Some("sk-very-secret".to_owned()),
            ..OpenAiConfig::default()
        };
        let client = OpenAiClient::new(config.clone()).unwrap_or_else(|e| panic!("{e}"));
        for text in [format!("{config:?}"), format!("{client:?}")] {
            assert!(!text.contains("sk-very-secret"), "{text}");
            assert!(text.contains(REDACTED), "{text}");
        }
    }

    #[test]
    fn bad_configs_are_rejected() {
        for config in [
            OpenAiConfig {
                base_url: "not a url".into(),
                ..OpenAiConfig::default()
            },
            OpenAiConfig {
                base_url: "ftp://host/v1".into(),
                ..OpenAiConfig::default()
            },
            OpenAiConfig {
                max_attempts: 0,
                ..OpenAiConfig::default()
            },
            OpenAiConfig {
                request_timeout: Duration::ZERO,
                ..OpenAiConfig::default()
            },
            OpenAiConfig {
                api_key: Some("bad\nkey".into()),
                ..OpenAiConfig::default()
            },
        ] {
            let err = OpenAiClient::new(config).err();
            assert!(matches!(err, Some(LlmError::Config(_))), "{err:?}");
            assert!(!format!("{err:?}").contains("bad\nkey"));
        }
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let config = OpenAiConfig {
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
            ..OpenAiConfig::default()
        };
        for attempt in 1..40 {
            let full = Duration::from_millis(100)
                .saturating_mul(1 << (attempt - 1).min(20))
                .min(Duration::from_secs(1));
            let d = backoff_delay(&config, attempt);
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
        }
        let samples: std::collections::HashSet<_> =
            (0..20).map(|_| backoff_delay(&config, 5)).collect();
        assert!(samples.len() > 1, "jitter should vary");
    }

    #[test]
    fn retry_after_headers() {
        let with = |pairs: &[(&'static str, &'static str)]| {
            let pairs = pairs.to_vec();
            retry_after(move |name| {
                pairs
                    .iter()
                    .find(|(key, _)| key.eq_ignore_ascii_case(name))
                    .map(|(_, value)| *value)
            })
        };
        assert_eq!(with(&[]), None);
        assert_eq!(with(&[("Retry-After", "2")]), Some(Duration::from_secs(2)));
        assert_eq!(
            with(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")]),
            None
        );
        assert_eq!(
            with(&[("retry-after", "1e300")]),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(with(&[("retry-after", "-1")]), None);
        assert_eq!(
            with(&[("retry-after", "-1"), ("retry-after-ms", "1500")]),
            Some(Duration::from_millis(1500))
        );
    }

    #[test]
    fn error_excerpts_prefer_the_provider_message_and_are_short() {
        assert_eq!(
            error_excerpt(br#"{"error":{"message":"bad model"}}"#),
            "bad model"
        );
        assert_eq!(error_excerpt(b""), "<empty body>");
        let long = "x".repeat(5000);
        assert!(error_excerpt(long.as_bytes()).chars().count() <= BODY_EXCERPT_CHARS + 1);
    }

    #[test]
    fn redaction_covers_every_text_variant() {
        let key = Some("sk-secret-123");
        let e = redact_error(
            LlmError::Status {
                status: 401,
                body_excerpt: "Incorrect API key provided: sk-secret-123".into(),
            },
            key,
        );
        assert!(!e.to_string().contains("sk-secret-123"));
        let e = redact_error(LlmError::Http("x sk-secret-123".into()), key);
        assert_eq!(e, LlmError::Http(format!("x {REDACTED}")));
    }
}
