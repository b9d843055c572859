//! The HTTP transport of [`super::OpenAiClient`]: hyper's pooled HTTP/1.1 client over rustls
//! (aws-lc-rs, the platform's certificate verifier), with the request's head built once per
//! client and cloned per request. The endpoint is reached directly, or through the proxy that
//! `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` name for it unless `NO_PROXY` exempts it (read
//! as curl and reqwest read them): an `https` endpoint through a CONNECT tunnel, an `http` one
//! by requests to the proxy that name the whole URL.
//!
//! WHY hyper directly and not reqwest: on every request reqwest turned the URL into a string
//! and parsed it again three times (into the request's `Uri`, for its redirect policy, and for
//! the response's URL), merged its default headers, and passed the request through retry and
//! redirect layers that a chat completion never uses. That was ~5% of the server's CPU per
//! turn at 100 chats and ~7.5% at 10,000 (docs/performance-log.md, nineteenth session). Retries,
//! timeouts and error bodies are this client's own anyway.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, Uri};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::wire::{BodyParts, RequestBody};
use crate::LlmError;

/// How long an unused pooled connection stays open.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// TCP keep-alive probes on idle pooled connections (what reqwest sent).
const TCP_KEEPALIVE: Duration = Duration::from_secs(15);

/// A pooled client; cloning shares the pool.
pub(super) type HttpClient = Client<HttpsConnector<Route>, BodyParts>;

/// The TLS settings of every connection of a client: aws-lc-rs, safe default protocol
/// versions, the platform's certificate verifier.
///
/// WHY made once and cloned into each thread's client: the verifier reads and parses the
/// platform's root certificates when it is made (~18 million instructions on Debian's set),
/// and a clone shares it.
pub(super) fn tls_config() -> Result<rustls::ClientConfig, LlmError> {
    use hyper_rustls::ConfigBuilderExt as _;
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|builder| builder.try_with_platform_verifier())
    .map_err(|e| LlmError::Config(format!("cannot set up TLS: {e}")))?
    .with_no_client_auth())
}

/// A client whose connections take `route`, with `tls` (from [`tls_config`]).
pub(super) fn client(route: &Route, tls: &rustls::ClientConfig) -> HttpClient {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.clone())
        .https_or_http()
        .enable_http1()
        .wrap_connector(route.clone());
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector)
}

/// How connections reach the endpoint.
#[derive(Clone, Debug)]
pub(super) enum Route {
    Direct(HttpConnector),
    /// An `https` endpoint through a proxy's CONNECT tunnel (TLS runs end to end inside it).
    Tunnel(Tunnel<HttpConnector>),
    /// An `http` endpoint through a forwarding proxy, to which every connection goes.
    Forward {
        tcp: HttpConnector,
        proxy: Uri,
    },
}

impl Route {
    /// The route to `endpoint` that `proxies` choose, with connects that give up after
    /// `connect_timeout`, and the `Proxy-Authorization` that a forwarding proxy needs on each
    /// request. Only `http://` proxies are supported.
    pub(super) fn to(
        endpoint: &Uri,
        proxies: &Matcher,
        connect_timeout: Duration,
    ) -> Result<(Self, Option<HeaderValue>), LlmError> {
        let mut tcp = HttpConnector::new();
        // `https` URLs pass through the TCP connector to the TLS layer around it.
        tcp.enforce_http(false);
        // A request's head and body pieces go out at once, not after the peer's delayed ACK.
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(connect_timeout));
        tcp.set_keepalive(Some(TCP_KEEPALIVE));
        let Some(proxy) = proxies.intercept(endpoint) else {
            return Ok((Self::Direct(tcp), None));
        };
        if proxy.uri().scheme_str() != Some("http") {
            return Err(LlmError::Config(format!(
                "the proxy for the model endpoint must be an http:// URL, not {}://",
                proxy.uri().scheme_str().unwrap_or("?")
            )));
        }
        let auth = proxy.basic_auth().cloned();
        if endpoint.scheme_str() == Some("https") {
            let mut tunnel = Tunnel::new(proxy.uri().clone(), tcp);
            if let Some(auth) = auth {
                // Marked sensitive by the tunnel.
                tunnel = tunnel.with_auth(auth);
            }
            return Ok((Self::Tunnel(tunnel), None));
        }
        let proxy = proxy.uri().clone();
        Ok((Self::Forward { tcp, proxy }, auth))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Route {
    type Response = RouteStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<RouteStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Every variant is always ready: each call is a connection attempt of its own.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, endpoint: Uri) -> Self::Future {
        match self {
            Self::Direct(tcp) => {
                let connect = tcp.call(endpoint);
                Box::pin(async move { Ok(RouteStream::new(connect.await?, false)) })
            }
            Self::Tunnel(tunnel) => {
                let connect = tunnel.call(endpoint);
                Box::pin(async move { Ok(RouteStream::new(connect.await?, false)) })
            }
            Self::Forward { tcp, proxy } => {
                let connect = tcp.call(proxy.clone());
                Box::pin(async move { Ok(RouteStream::new(connect.await?, true)) })
            }
        }
    }
}

/// A connection of a [`Route`]. One to a forwarding proxy says so, so that the requests on it
/// name the whole URL.
pub(super) struct RouteStream {
    io: TokioIo<TcpStream>,
    forwarded: bool,
}

impl RouteStream {
    fn new(io: TokioIo<TcpStream>, forwarded: bool) -> Self {
        Self { io, forwarded }
    }
}

impl Connection for RouteStream {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.forwarded)
    }
}

impl Read for RouteStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl Write for RouteStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    // Vectored, as the socket is: a body's pieces go out in one `writev`, not joined first.
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

/// Where requests go and the headers every one carries, built once.
pub(super) struct RequestHead {
    uri: Uri,
    /// The headers of a request for a plain answer and of one for a streamed answer.
    plain: HeaderMap,
    stream: HeaderMap,
}

impl RequestHead {
    /// Requests to `uri` with `authorization` and `proxy_authorization` (both sensitive:
    /// never shown by `Debug`).
    pub(super) fn new(
        uri: Uri,
        authorization: Option<HeaderValue>,
        proxy_authorization: Option<HeaderValue>,
    ) -> Self {
        let mut plain = HeaderMap::with_capacity(5);
        for (name, value) in [
            (header::AUTHORIZATION, authorization),
            (header::PROXY_AUTHORIZATION, proxy_authorization),
        ] {
            if let Some(mut value) = value {
                value.set_sensitive(true);
                plain.insert(name, value);
            }
        }
        plain.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("tessera-llm/", env!("CARGO_PKG_VERSION"))),
        );
        plain.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        // WHY here: hyper's client otherwise builds it for every request (a `format!` and a
        // header-value check, ~2,600 instructions; docs/performance-log.md, twenty-seventh
        // session), as it does when the request has none: the host, and the port unless it
        // is the scheme's default.
        if let Some(host) = host_header(&uri) {
            plain.insert(header::HOST, host);
        }
        let mut stream = plain.clone();
        plain.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        stream.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        Self { uri, plain, stream }
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

/// The `Host` header of requests to `uri`, as hyper's client would write it; `None` without a
/// host (the client then reports the URI).
fn host_header(uri: &Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let default_port = match uri.scheme_str() {
        Some("http") => Some(80),
        Some("https") => Some(443),
        _ => None,
    };
    let value = match uri.port_u16() {
        Some(port) if Some(port) != default_port => {
            HeaderValue::from_str(&format!("{host}:{port}"))
        }
        _ => HeaderValue::from_str(host),
    };
    value.ok()
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const MODEL_HTTP: &str = "http://model.invalid/v1/chat/completions";
    const MODEL_HTTPS: &str = "https://model.invalid/v1/chat/completions";
    /// `user:pw`, as a proxy URL's credentials become a `Proxy-Authorization` header.
    const BASIC_USER_PW: &str = "Basic dXNlcjpwdw==";

    fn route(endpoint: &str, proxies: &Matcher) -> Result<(Route, Option<HeaderValue>), LlmError> {
        Route::to(
            &Uri::try_from(endpoint).unwrap(),
            proxies,
            Duration::from_secs(5),
        )
    }

    /// A one-connection "proxy" on 127.0.0.1 that hands back the head of the first request it
    /// reads, after answering it with `answer`.
    async fn proxy(answer: String) -> (String, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://user:pw@{}", listener.local_addr().unwrap());
        let seen = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut chunk = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = socket.write_all(answer.as_bytes()).await;
            String::from_utf8_lossy(&head).to_ascii_lowercase()
        });
        (url, seen)
    }

    #[test]
    fn the_environments_proxy_is_taken_unless_no_proxy_exempts_the_endpoint() {
        let none = Matcher::builder().build();
        assert!(matches!(
            route(MODEL_HTTPS, &none),
            Ok((Route::Direct(_), None))
        ));

        let proxies = Matcher::builder()
            .http("http://user:pw@proxy.invalid:3128")
            .https("http://user:pw@proxy.invalid:3128")
            .build();
        assert!(matches!(
            route(MODEL_HTTPS, &proxies),
            Ok((Route::Tunnel(_), None))
        ));
        match route(MODEL_HTTP, &proxies) {
            Ok((Route::Forward { proxy, .. }, Some(auth))) => {
                assert_eq!(proxy.host(), Some("proxy.invalid"));
                assert_eq!(auth, BASIC_USER_PW);
            }
            other => panic!("expected a forwarding proxy with credentials, got {other:?}"),
        }

        let exempt = Matcher::builder()
            .https("http://proxy.invalid:3128")
            .no("model.invalid")
            .build();
        assert!(matches!(
            route(MODEL_HTTPS, &exempt),
            Ok((Route::Direct(_), None))
        ));

        let socks = Matcher::builder()
            .all("socks5://proxy.invalid:1080")
            .build();
        match route(MODEL_HTTPS, &socks) {
            Err(LlmError::Config(text)) => assert!(text.contains("socks5://"), "{text}"),
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    /// A request for `endpoint` sent through a one-connection proxy that answers `answer`:
    /// the outcome, the head the proxy read (lowercase), and the `Proxy-Authorization` the
    /// route puts on each request.
    async fn through_proxy(
        endpoint: &'static str,
        answer: String,
    ) -> (
        Result<Response<Incoming>, hyper_util::client::legacy::Error>,
        String,
        Option<HeaderValue>,
    ) {
        let (url, seen) = proxy(answer).await;
        let (route, auth) = route(endpoint, &Matcher::builder().all(url).build()).unwrap();
        let head = RequestHead::new(Uri::from_static(endpoint), None, auth.clone());
        let outcome = client(&route, &tls_config().unwrap())
            .request(head.post(&RequestBody::for_tests(b"{}"), false))
            .await;
        (outcome, seen.await.unwrap(), auth)
    }

    fn assert_carries_the_credentials(head: &str) {
        let expected = format!("proxy-authorization: {BASIC_USER_PW}").to_ascii_lowercase();
        assert!(head.contains(&expected), "{head}");
    }

    #[tokio::test]
    async fn an_http_endpoint_behind_a_proxy_is_asked_for_in_absolute_form_with_credentials() {
        let body = r#"{"ok":true}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let (outcome, head, _) = through_proxy(MODEL_HTTP, answer).await;
        let mut response = outcome.expect("the proxy answers");
        assert_eq!(response.status(), 200);
        assert_eq!(
            next_chunk(&mut response).await.unwrap().as_deref(),
            Some(body.as_bytes())
        );
        assert!(
            head.starts_with("post http://model.invalid/v1/chat/completions http/1.1\r\n"),
            "{head}"
        );
        assert_carries_the_credentials(&head);
    }

    #[tokio::test]
    async fn an_https_endpoint_behind_a_proxy_is_reached_through_a_connect_tunnel() {
        let refusal = "HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n".to_owned();
        let (outcome, head, auth) = through_proxy(MODEL_HTTPS, refusal).await;
        assert!(outcome.is_err(), "a refused tunnel is an error");
        assert!(
            auth.is_none(),
            "the tunnel carries the credentials, not each request"
        );
        assert!(
            head.starts_with("connect model.invalid:443 http/1.1\r\n"),
            "{head}"
        );
        assert_carries_the_credentials(&head);
    }

    #[test]
    fn a_connect_that_timed_out_is_a_timeout_and_other_failures_are_http_errors() {
        /// An error with a cause, as hyper's wrap the connector's I/O error.
        #[derive(Debug)]
        struct Wrapped(io::Error);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error (Connect)")
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }

        let limit = Duration::from_secs(3);
        let timed_out = Wrapped(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
        assert_eq!(transport_error(&timed_out, limit), LlmError::Timeout(limit));
        let refused = Wrapped(io::Error::new(io::ErrorKind::ConnectionRefused, "refused"));
        assert_eq!(
            transport_error(&refused, limit),
            LlmError::Http("client error (Connect): refused".to_owned())
        );
    }

    #[test]
    fn the_authorization_header_is_sensitive_and_the_accept_header_follows_the_mode() {
        let endpoint = Uri::from_static("http://127.0.0.1:9/v1/chat/completions");
        let head = RequestHead::new(
            endpoint,
            Some(HeaderValue::from_static("Bearer sk-1")),
            None,
        );
        let body = RequestBody::for_tests(b"{}");
        let plain = head.post(&body, false);
        let stream = head.post(&body, true);
        assert_eq!(plain.method(), Method::POST);
        assert_eq!(plain.uri(), "http://127.0.0.1:9/v1/chat/completions");
        assert!(plain.headers()[header::AUTHORIZATION].is_sensitive());
        assert_eq!(plain.headers()[header::ACCEPT], "application/json");
        assert_eq!(stream.headers()[header::ACCEPT], "text/event-stream");
        assert_eq!(stream.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(plain.headers()[header::HOST], "127.0.0.1:9");
        assert_eq!(stream.headers()[header::HOST], "127.0.0.1:9");
    }

    #[test]
    fn the_host_header_carries_the_port_only_when_it_is_not_the_schemes_default() {
        for (uri, host) in [
            (
                "https://api.openai.com/v1/chat/completions",
                "api.openai.com",
            ),
            ("https://api.example.com:443/v1", "api.example.com"),
            ("http://example.com:80/v1", "example.com"),
            ("http://example.com/v1", "example.com"),
            ("http://example.com:443/v1", "example.com:443"),
            ("https://example.com:80/v1", "example.com:80"),
            ("http://127.0.0.1:8080/v1", "127.0.0.1:8080"),
            ("http://[::1]:8080/v1", "[::1]:8080"),
            ("https://[::1]/v1", "[::1]"),
        ] {
            let value = host_header(&Uri::from_static(uri));
            assert_eq!(
                value.as_ref().and_then(|v| v.to_str().ok()),
                Some(host),
                "{uri}"
            );
        }
        assert_eq!(host_header(&Uri::from_static("/v1/chat/completions")), None);
    }
}
