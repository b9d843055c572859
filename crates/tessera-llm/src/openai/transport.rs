//! The connections of [`super::OpenAiClient`]: TCP, then rustls (aws-lc-rs, the platform's
//! certificate verifier) for an `https` endpoint, reached directly or through the proxy that
//! `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` name for it unless `NO_PROXY` exempts it (read
//! as curl and reqwest read them): an `https` endpoint through a CONNECT tunnel, an `http` one
//! by requests to the proxy that name the whole URL. The exchanges on them are
//! [`super::h1`]'s; the request's head is built once per client.
//!
//! WHY not reqwest: on every request reqwest turned the URL into a string and parsed it again
//! three times (into the request's `Uri`, for its redirect policy, and for the response's URL),
//! merged its default headers, and passed the request through retry and redirect layers that a
//! chat completion never uses. That was ~5% of the server's CPU per turn at 100 chats and ~7.5%
//! at 10,000 (docs/performance-log.md, nineteenth session). Retries, timeouts and error bodies
//! are this client's own anyway.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http::header::HeaderValue;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service as _;

use super::h1::{ExchangeError, ModelConnection};
use crate::LlmError;

/// How long an unused connection stays open.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// TCP keep-alive probes on idle connections (what reqwest sent).
const TCP_KEEPALIVE: Duration = Duration::from_secs(15);

/// The TLS settings of every connection of a client: aws-lc-rs, safe default protocol
/// versions, the platform's certificate verifier.
///
/// WHY made once per client: the verifier reads and parses the platform's root certificates
/// when it is made (~18 million instructions on Debian's set).
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

/// Opens connections along a [`Route`], with TLS for an `https` endpoint. Cloning shares it.
#[derive(Clone)]
pub(super) struct Connector(HttpsConnector<Route>);

impl Connector {
    /// Connections along `route`, with `tls` (from [`tls_config`]).
    pub(super) fn new(route: Route, tls: rustls::ClientConfig) -> Self {
        Self(
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_or_http()
                .enable_http1()
                .wrap_connector(route),
        )
    }

    /// A new connection to `endpoint` (its TLS handshake done).
    pub(super) async fn connect(&self, endpoint: &Uri) -> Result<ModelConnection, ExchangeError> {
        let mut connector = self.0.clone();
        poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(ExchangeError::Connect)?;
        let stream = connector
            .call(endpoint.clone())
            .await
            .map_err(ExchangeError::Connect)?;
        Ok(ModelConnection::new(Box::new(TokioIo::new(stream))))
    }
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
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Every variant is always ready: each call is a connection attempt of its own.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, endpoint: Uri) -> Self::Future {
        match self {
            Self::Direct(tcp) => {
                let connect = tcp.call(endpoint);
                Box::pin(async move { Ok(connect.await?) })
            }
            Self::Tunnel(tunnel) => {
                let connect = tunnel.call(endpoint);
                Box::pin(async move { Ok(connect.await?) })
            }
            Self::Forward { tcp, proxy } => {
                let connect = tcp.call(proxy.clone());
                Box::pin(async move { Ok(connect.await?) })
            }
        }
    }
}

/// Where requests go and the head every one starts with, built once.
pub(super) struct RequestHead {
    uri: Uri,
    /// The request line and headers of a request for a plain answer and of one for a streamed
    /// answer, up to the per-request ones (`h1::head_tail`). They hold the API key: never
    /// shown (`Debug` shows the URI only), never logged.
    plain: Bytes,
    stream: Bytes,
}

impl std::fmt::Debug for RequestHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestHead")
            .field("uri", &self.uri)
            .finish_non_exhaustive()
    }
}

impl RequestHead {
    /// Requests to `uri` along `route` with `authorization` and `proxy_authorization`, naming
    /// the whole URL when they go to a forwarding proxy, else only its path and query.
    pub(super) fn new(
        uri: Uri,
        authorization: Option<HeaderValue>,
        proxy_authorization: Option<HeaderValue>,
        route: &Route,
    ) -> Self {
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(b"POST ");
        if matches!(route, Route::Forward { .. }) {
            head.extend_from_slice(uri.to_string().as_bytes());
        } else {
            let target = uri.path_and_query().map_or("/", |pq| pq.as_str());
            head.extend_from_slice(target.as_bytes());
        }
        head.extend_from_slice(b" HTTP/1.1\r\n");
        let mut header = |name: &str, value: &[u8]| {
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n");
        };
        if let Some(host) = host_header(&uri) {
            header("host", host.as_bytes());
        }
        for (name, value) in [
            ("authorization", authorization),
            ("proxy-authorization", proxy_authorization),
        ] {
            if let Some(value) = value {
                header(name, value.as_bytes());
            }
        }
        header(
            "user-agent",
            concat!("tessera-llm/", env!("CARGO_PKG_VERSION")).as_bytes(),
        );
        header("content-type", b"application/json");
        let mut stream = head.clone();
        head.extend_from_slice(b"accept: application/json\r\n");
        stream.extend_from_slice(b"accept: text/event-stream\r\n");
        Self {
            uri,
            plain: head.into(),
            stream: stream.into(),
        }
    }

    /// Where requests go.
    pub(super) fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The whole head of a POST of `body_len` bytes, asking for a streamed answer or not,
    /// with the caller's trace headers.
    pub(super) fn for_body(&self, body_len: u64, stream: bool) -> Vec<u8> {
        let start = if stream { &self.stream } else { &self.plain };
        let mut head = Vec::with_capacity(start.len() + 128);
        head.extend_from_slice(start);
        // The caller's `chat` span, when traces are exported: the provider can join the trace.
        super::h1::head_tail(&mut head, body_len, &tessera_telemetry::outgoing_headers());
        head
    }
}

/// The `Host` header of requests to `uri`, as hyper's client wrote it; `None` without a host
/// (connecting then fails and reports the URI).
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

    use std::io;

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
        Result<super::super::h1::ModelResponse, ExchangeError>,
        String,
        Option<HeaderValue>,
    ) {
        let (url, seen) = proxy(answer).await;
        let (route, auth) = route(endpoint, &Matcher::builder().all(url).build()).unwrap();
        let head = RequestHead::new(Uri::from_static(endpoint), None, auth.clone(), &route);
        let connector = Connector::new(route, tls_config().unwrap());
        let outcome = async {
            let connection = connector.connect(head.uri()).await?;
            connection
                .exchange(&head.for_body(2, false), &[Bytes::from_static(b"{}")])
                .await
        }
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
            response.next_chunk().await.unwrap().as_deref(),
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
    fn the_head_carries_the_key_unshown_and_the_accept_header_follows_the_mode() {
        let endpoint = Uri::from_static("http://127.0.0.1:9/v1/chat/completions?x=1");
        let head = RequestHead::new(
            endpoint,
            Some(HeaderValue::from_static("Bearer sk-1")),
            None,
            &Route::Direct(HttpConnector::new()),
        );
        let text = |stream| String::from_utf8(head.for_body(2, stream)).unwrap();
        let (plain, stream) = (text(false), text(true));
        for head in [&plain, &stream] {
            assert!(
                head.starts_with("POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:9\r\n"),
                "{head}"
            );
            assert!(
                head.contains("\r\nauthorization: Bearer sk-1\r\n"),
                "{head}"
            );
            assert!(
                head.contains("\r\ncontent-type: application/json\r\n"),
                "{head}"
            );
            assert!(head.ends_with("\r\ncontent-length: 2\r\n\r\n"), "{head}");
        }
        assert!(
            plain.contains("\r\naccept: application/json\r\n"),
            "{plain}"
        );
        assert!(
            stream.contains("\r\naccept: text/event-stream\r\n"),
            "{stream}"
        );
        let shown = format!("{head:?}");
        assert!(!shown.contains("sk-1"), "{shown}");
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
