//! The HTTP transport of [`super::OpenAiClient`]: hyper's pooled HTTP/1.1 client over rustls
//! (aws-lc-rs, the platform's certificate verifier), with the request's head built once per
//! client and cloned per request.
//!
//! WHY hyper directly and not reqwest: on every request reqwest turned the URL into a string
//! and parsed it again three times (into the request's `Uri`, for its redirect policy, and for
//! the response's URL), merged its default headers, and passed the request through retry and
//! redirect layers that a chat completion never uses. That was ~5% of the server's CPU per
//! turn at 100 chats and ~7.5% at 10,000 (README, nineteenth session). Retries, timeouts and
//! error bodies are this client's own anyway.

use std::future::poll_fn;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, Uri};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::wire::{BodyParts, RequestBody};
use crate::LlmError;

/// How long an unused pooled connection stays open.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// TCP keep-alive probes on idle pooled connections (what reqwest sent).
const TCP_KEEPALIVE: Duration = Duration::from_secs(15);

/// A pooled client; cloning shares the pool.
pub(super) type HttpClient = Client<HttpsConnector<HttpConnector>, BodyParts>;

/// A client for `http` and `https` endpoints that gives up connecting after `connect_timeout`.
pub(super) fn client(connect_timeout: Duration) -> Result<HttpClient, LlmError> {
    let mut tcp = HttpConnector::new();
    // `https` URLs pass through the TCP connector to the TLS layer around it.
    tcp.enforce_http(false);
    // A request's head and body pieces go out at once, not after the peer's delayed ACK.
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(connect_timeout));
    tcp.set_keepalive(Some(TCP_KEEPALIVE));
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_platform_verifier(rustls::crypto::aws_lc_rs::default_provider())
        .map_err(|e| LlmError::Config(format!("cannot set up TLS: {e}")))?
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(tls))
}

/// Where requests go and the headers every one carries, built once.
pub(super) struct RequestHead {
    uri: Uri,
    /// The headers of a request for a plain answer and of one for a streamed answer.
    plain: HeaderMap,
    stream: HeaderMap,
}

impl RequestHead {
    /// Requests to `endpoint` with `authorization` (sensitive: never shown by `Debug`).
    pub(super) fn new(
        endpoint: &url::Url,
        authorization: Option<HeaderValue>,
    ) -> Result<Self, LlmError> {
        let uri = Uri::try_from(endpoint.as_str()).map_err(|e| {
            LlmError::Config(format!("invalid endpoint {:?}: {e}", endpoint.as_str()))
        })?;
        let mut plain = HeaderMap::with_capacity(4);
        if let Some(mut value) = authorization {
            value.set_sensitive(true);
            plain.insert(header::AUTHORIZATION, value);
        }
        plain.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("tessera-llm/", env!("CARGO_PKG_VERSION"))),
        );
        plain.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let mut stream = plain.clone();
        plain.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        stream.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        Ok(Self { uri, plain, stream })
    }

    /// A POST of `body`, asking for a streamed answer or not. The length of the body is known,
    /// so it goes out with a `Content-Length`.
    pub(super) fn post(&self, body: &RequestBody, stream: bool) -> Request<BodyParts> {
        let mut request = Request::new(body.to_http());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = if stream {
            self.stream.clone()
        } else {
            self.plain.clone()
        };
        // The caller's `chat` span, when traces are exported: the provider can join the trace.
        for (name, value) in tessera_telemetry::outgoing_headers() {
            if let Ok(value) = HeaderValue::try_from(value) {
                request.headers_mut().insert(name, value);
            }
        }
        request
    }
}

/// The next piece of `response`'s body (trailers are skipped), or `None` at its end.
pub(super) async fn next_chunk(
    response: &mut Response<Incoming>,
) -> Result<Option<Bytes>, hyper::Error> {
    loop {
        let body = response.body_mut();
        match poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
            None => return Ok(None),
            Some(Err(e)) => return Err(e),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// A failed exchange before any of a successful body was used: a connect that timed out is a
/// [`LlmError::Timeout`] (reported with the request's `timeout`), anything else
/// [`LlmError::Http`] with the error and its causes on one line.
pub(super) fn transport_error(
    error: &(dyn std::error::Error + 'static),
    timeout: Duration,
) -> LlmError {
    if timed_out(error) {
        LlmError::Timeout(timeout)
    } else {
        LlmError::Http(describe(error))
    }
}

/// Whether an I/O timeout is among `error` and its causes.
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(cause) = next {
        if cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        next = cause.source();
    }
    false
}

/// The error and its causes on one line, each cause once.
pub(super) fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_that_timed_out_is_a_timeout_and_other_failures_are_http_errors() {
        let limit = Duration::from_secs(3);
        let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
        assert_eq!(transport_error(&timed_out, limit), LlmError::Timeout(limit));
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            transport_error(&refused, limit),
            LlmError::Http("refused".to_owned())
        );
    }

    #[test]
    fn the_authorization_header_is_sensitive_and_the_accept_header_follows_the_mode() {
        let endpoint = url::Url::parse("http://127.0.0.1:9/v1/chat/completions").unwrap();
        let head =
            RequestHead::new(&endpoint, Some(HeaderValue::from_static("Bearer sk-1"))).unwrap();
        let body = RequestBody::for_tests(b"{}");
        let plain = head.post(&body, false);
        let stream = head.post(&body, true);
        assert_eq!(plain.method(), Method::POST);
        assert_eq!(plain.uri(), "http://127.0.0.1:9/v1/chat/completions");
        assert!(plain.headers()[header::AUTHORIZATION].is_sensitive());
        assert_eq!(plain.headers()[header::ACCEPT], "application/json");
        assert_eq!(stream.headers()[header::ACCEPT], "text/event-stream");
        assert_eq!(stream.headers()[header::CONTENT_TYPE], "application/json");
    }
}
