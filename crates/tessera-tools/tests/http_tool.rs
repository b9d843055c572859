//! HttpTool against a real HTTP server (wiremock).

mod common;

use std::time::{Duration, Instant};

use common::ctx;
use serde_json::{Map, Value, json};
use tessera_tools::{HttpTool, Tool, ToolError};
use wiremock::matchers::{body_json, header_exists, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn args() -> Map<String, Value> {
    match json!({"platform": "x", "content": "hello"}) {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

fn tool(server: &MockServer, timeout: Duration) -> HttpTool {
    HttpTool::new(
        format!("{}/tool", server.uri()),
        timeout,
        reqwest::Client::new(),
    )
}

#[tokio::test]
async fn success_posts_args_and_context() {
    let server = MockServer::start().await;
    let c = ctx("tenantA", "alice", "chat1");
    Mock::given(method("POST"))
        .and(path("/tool"))
        .and(header_exists("idempotency-key"))
        .and(body_json(json!({"args": args(), "context": c.to_json()})))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"status": "success", "post_id": 7})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let result = tool(&server, Duration::from_secs(5))
        .invoke(args(), c)
        .await;
    assert_eq!(result, Ok(json!({"status": "success", "post_id": 7})));
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(422).set_body_json(json!({"message": "content too long"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let err = tool(&server, Duration::from_secs(5))
        .invoke(args(), ctx("t", "u", "c"))
        .await
        .expect_err("422 is an error");
    match err {
        ToolError::Http {
            status: Some(422),
            message,
        } => assert!(message.contains("content too long"), "{message}"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn service_unavailable_is_retried_with_the_same_idempotency_key() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(1)
        .with_priority(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"ok": true})))
        .expect(1)
        .mount(&server)
        .await;
    let result = tool(&server, Duration::from_secs(5))
        .invoke(args(), ctx("t", "u", "c"))
        .await;
    assert_eq!(result, Ok(json!({"ok": true})));
    let requests = server.received_requests().await.expect("recording on");
    assert_eq!(requests.len(), 2);
    let keys: Vec<_> = requests
        .iter()
        .map(|r| {
            r.headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .collect();
    assert!(
        keys[0]
            .as_deref()
            .is_some_and(|k| k.starts_with("c:turn-1:")),
        "{keys:?}"
    );
    assert_eq!(keys[0], keys[1]);
}

#[tokio::test]
async fn retries_are_bounded() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(502))
        .expect(3) // first attempt + 2 retries
        .mount(&server)
        .await;
    let err = tool(&server, Duration::from_secs(5))
        .invoke(args(), ctx("t", "u", "c"))
        .await
        .expect_err("always 502");
    assert!(
        matches!(
            err,
            ToolError::Http {
                status: Some(502),
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn gateway_timeout_and_server_errors_are_not_retried() {
    for status in [504u16, 500] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(status).set_body_string("upstream slow"))
            .expect(1)
            .mount(&server)
            .await;
        let err = tool(&server, Duration::from_secs(5))
            .invoke(args(), ctx("t", "u", "c"))
            .await
            .expect_err("error status");
        assert!(
            matches!(err, ToolError::Http { status: Some(s), .. } if s == status),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn slow_tool_times_out_without_retry() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({}))
                .set_delay(Duration::from_secs(3)),
        )
        .expect(1)
        .mount(&server)
        .await;
    let started = Instant::now();
    let err = tool(&server, Duration::from_millis(200))
        .invoke(args(), ctx("t", "u", "c"))
        .await
        .expect_err("times out");
    assert_eq!(err, ToolError::Timeout(Duration::from_millis(200)));
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn non_json_success_body_is_a_failure() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_string("<html>ok</html>"))
        .mount(&server)
        .await;
    let err = tool(&server, Duration::from_secs(5))
        .invoke(args(), ctx("t", "u", "c"))
        .await
        .expect_err("not JSON");
    assert!(matches!(err, ToolError::Failed(_)), "{err:?}");
}

#[tokio::test]
async fn oversized_body_is_refused() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"blob": "x".repeat(10_000)})))
        .mount(&server)
        .await;
    let err = tool(&server, Duration::from_secs(5))
        .with_max_body_bytes(1000)
        .invoke(args(), ctx("t", "u", "c"))
        .await
        .expect_err("too large");
    assert!(
        matches!(err, ToolError::Failed(ref m) if m.contains("too large")),
        "{err:?}"
    );
}

#[tokio::test]
async fn connection_refused_is_retried_then_reported() {
    // A port nobody listens on: bind, read the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let t = HttpTool::new(
        format!("http://127.0.0.1:{port}/tool"),
        Duration::from_secs(2),
        reqwest::Client::new(),
    );
    let started = Instant::now();
    let err = t
        .invoke(args(), ctx("t", "u", "c"))
        .await
        .expect_err("refused");
    assert!(
        matches!(err, ToolError::Http { status: None, .. }),
        "{err:?}"
    );
    // Two backoffs (100ms + 200ms) happened.
    assert!(started.elapsed() >= Duration::from_millis(300));
}
