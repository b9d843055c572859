//! The real `tessera-loadgen mock-llm` over real HTTP: its routes, its answers to bad requests,
//! and its latency with more requests waiting at once than its server pools request objects
//! for (the mock drops each request before it waits; see `tessera-loadgen` `mock`).

use std::time::{Duration, Instant};

use futures::future::join_all;
use integration_tests::mock_llm::MockLlm;
use serde_json::{Value, json};

fn origin(mock: &MockLlm) -> &str {
    mock.base_url.trim_end_matches("/v1")
}

#[tokio::test]
async fn routes_answer_and_unknown_paths_are_not_found() {
    let mock = MockLlm::start().await;
    let http = reqwest::Client::new();
    let base = origin(&mock);

    let health = http.get(format!("{base}/healthz")).send().await;
    let health = health.unwrap_or_else(|e| panic!("healthz: {e}"));
    assert_eq!(health.status(), 200);

    let models: Value = http
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("models: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("models body: {e}"));
    assert_eq!(models["data"][0]["id"], "mock");

    let missing = http.get(format!("{base}/v1/nothing")).send().await;
    assert_eq!(missing.map(|r| r.status().as_u16()).ok(), Some(404));
    // A completions path with the wrong method is not a completion either.
    let wrong_method = http.get(format!("{base}/v1/chat/completions")).send().await;
    assert_eq!(wrong_method.map(|r| r.status().as_u16()).ok(), Some(404));
}

#[tokio::test]
async fn a_malformed_body_gets_a_400_with_an_openai_style_error() {
    let mock = MockLlm::start().await;
    let response = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.base_url))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap_or_else(|e| panic!("post: {e}"));
    assert_eq!(response.status(), 400);
    let body: Value = response
        .json()
        .await
        .unwrap_or_else(|e| panic!("error body: {e}"));
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("invalid JSON body"), "{message}");
}

#[tokio::test]
async fn with_latency_every_waiting_request_is_answered_after_it() {
    const LATENCY: Duration = Duration::from_millis(200);
    // More than actix-web's pool of 128 request objects, all waiting at once.
    const REQUESTS: usize = 300;
    let mock = MockLlm::start_with_latency(LATENCY.as_millis() as u64).await;
    let http = reqwest::Client::new();
    let url = format!("{}/chat/completions", mock.base_url);
    let started = Instant::now();
    let answers = join_all((0..REQUESTS).map(|i| {
        let request = http.post(&url).json(&json!({
            "model": "m",
            "messages": [{"role": "user", "content": format!("request {i}")}],
        }));
        async move {
            let sent = Instant::now();
            let response = request.send().await.unwrap_or_else(|e| panic!("post: {e}"));
            let status = response.status();
            let body: Value = response
                .json()
                .await
                .unwrap_or_else(|e| panic!("answer body: {e}"));
            (status, body, sent.elapsed())
        }
    }))
    .await;
    for (status, body, waited) in &answers {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(body["choices"][0]["message"]["content"], "OK, noted.");
        assert!(
            *waited >= LATENCY,
            "answered after {waited:?}, before the latency"
        );
    }
    assert!(started.elapsed() >= LATENCY);
}
