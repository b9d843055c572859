//! `OpenAiClient` against a mock server over real HTTP.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_llm::openai::{OpenAiClient, OpenAiConfig};
use tessera_llm::{
    ChatModel, ChatRequest, DeltaSink, LlmError, Message, Role, ToolCall, ToolChoice, ToolSpec,
};
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY: &str = "sk-test-secret-0123456789";

fn config(server: &MockServer) -> OpenAiConfig {
    OpenAiConfig {
        base_url: format!("{}/v1", server.uri()),
        api_key: Some(KEY.to_owned()),
        default_model: "test-model".to_owned(),
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        max_attempts: 3,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        delta_interval: Duration::ZERO,
    }
}

fn client(server: &MockServer) -> OpenAiClient {
    OpenAiClient::new(config(server)).expect("valid config")
}

fn request() -> ChatRequest {
    ChatRequest::new(
        "Writer",
        vec![
            Message::text(Role::System, "You write."),
            Message::text(Role::User, "Say hi"),
        ],
    )
}

fn completion(message: Value) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "test-model-2024",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    })
}

fn sse(events: &[Value]) -> String {
    let mut body = String::new();
    for e in events {
        body.push_str(&format!("data: {e}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    body
}

fn sse_response(body: String) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

fn recording_sink() -> (DeltaSink, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink_seen = Arc::clone(&seen);
    (
        Box::new(move |d: &str| sink_seen.lock().expect("lock").push(d.to_owned())),
        seen,
    )
}

async fn request_count(server: &MockServer) -> usize {
    server
        .received_requests()
        .await
        .expect("recording enabled")
        .len()
}

/// Answers the first request with `first`, and every later one with `then`.
async fn fail_once_then(server: &MockServer, first: ResponseTemplate, then: ResponseTemplate) {
    Mock::given(method("POST"))
        .respond_with(first)
        .up_to_n_times(1)
        .with_priority(1)
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .respond_with(then)
        .with_priority(2)
        .mount(server)
        .await;
}

#[tokio::test]
async fn plain_completion() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", format!("Bearer {KEY}").as_str()))
        .and(header("content-type", "application/json"))
        .and(body_partial_json(json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "You write."},
                {"role": "user", "content": "Say hi"},
            ],
        })))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(completion(json!({"role": "assistant", "content": "Hi!"}))),
        )
        .expect(1)
        .mount(&server)
        .await;

    let response = client(&server)
        .complete(request(), None)
        .await
        .expect("completion");
    assert_eq!(response.message.role, Role::Assistant);
    assert_eq!(response.message.content.as_deref(), Some("Hi!"));
    assert_eq!(response.message.name.as_deref(), Some("Writer"));
    assert!(response.message.tool_calls.is_empty());
    assert_eq!(response.usage.prompt_tokens, 12);
    assert_eq!(response.usage.completion_tokens, 3);
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.model, "test-model-2024");

    let requests = server.received_requests().await.expect("recording");
    let body: Value = serde_json::from_slice(&requests[0].body).expect("json body");
    assert!(body.get("stream").is_none());
    assert!(body.get("tools").is_none());
}

#[tokio::test]
async fn request_model_overrides_default_and_options_are_sent() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(body_partial_json(json!({
            "model": "other-model",
            "temperature": 0.25,
            "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "lookup", "description": "Look up", "parameters": {"type": "object"}}}],
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(completion(json!({"content": "ok"}))))
        .expect(1)
        .mount(&server)
        .await;
    let mut req = request();
    req.model = Some("other-model".to_owned());
    req.temperature = Some(0.25);
    req.tool_choice = Some(ToolChoice::Required);
    req.tools = vec![ToolSpec {
        name: "lookup".into(),
        description: "Look up".into(),
        parameters: json!({"type": "object"}),
    }]
    .into();
    client(&server)
        .complete(req, None)
        .await
        .expect("completion");
}

#[tokio::test]
async fn tool_calls_are_parsed_and_null_content_is_none() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"rust\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "fetch", "arguments": "{\"url\":\"x\"}"}},
                ],
            }}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2},
        })))
        .mount(&server)
        .await;

    let response = client(&server)
        .complete(request(), None)
        .await
        .expect("completion");
    assert_eq!(response.message.content, None);
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.message.tool_calls,
        vec![
            ToolCall {
                id: "call_1".into(),
                name: "search".into(),
                arguments: "{\"q\":\"rust\"}".into()
            },
            ToolCall {
                id: "call_2".into(),
                name: "fetch".into(),
                arguments: "{\"url\":\"x\"}".into()
            },
        ]
    );
}

#[tokio::test]
async fn tool_history_is_encoded_in_openai_shape() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(body_partial_json(json!({"messages": [
            {"role": "user", "content": "Say hi"},
            {"role": "assistant", "content": null, "name": "Research_Bot",
             "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
            {"role": "tool", "content": "found", "tool_call_id": "c9"},
        ]})))
        .respond_with(ResponseTemplate::new(200).set_body_json(completion(json!({"content": "done"}))))
        .expect(1)
        .mount(&server)
        .await;
    let mut call = Message::assistant("Research Bot", "");
    call.content = None;
    call.tool_calls = vec![ToolCall {
        id: "c9".into(),
        name: "search".into(),
        arguments: "{}".into(),
    }];
    let req = ChatRequest::new(
        "Research Bot",
        vec![
            Message::text(Role::User, "Say hi"),
            call,
            Message::tool_result("c9", "found"),
        ],
    );
    client(&server)
        .complete(req, None)
        .await
        .expect("completion");
}

#[tokio::test]
async fn streamed_text_reaches_the_sink_in_order() {
    let server = MockServer::start().await;
    let pieces = ["The", " quick", " brown", " fox", " — done ✓"];
    let mut events = vec![
        json!({"model": "stream-model", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
    ];
    events.extend(
        pieces
            .iter()
            .map(|p| json!({"choices": [{"index": 0, "delta": {"content": p}}]})),
    );
    events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
    events.push(json!({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 5}}));
    Mock::given(method("POST"))
        .and(header("accept", "text/event-stream"))
        .and(body_partial_json(
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ))
        .respond_with(sse_response(sse(&events)))
        .expect(1)
        .mount(&server)
        .await;

    let (sink, seen) = recording_sink();
    let mut req = request();
    req.stream = true;
    let response = client(&server)
        .complete(req, Some(sink))
        .await
        .expect("completion");
    let seen = seen.lock().expect("lock").clone();
    // The events of one read come as one delta (tests/openai_connections.rs shows both cases);
    // how the body is cut into reads is up to the network.
    assert_eq!(seen.concat(), pieces.concat());
    assert!(seen.iter().all(|delta| !delta.is_empty()), "{seen:?}");
    assert_eq!(
        response.message.content.as_deref(),
        Some(pieces.concat().as_str())
    );
    assert_eq!(response.usage.prompt_tokens, 20);
    assert_eq!(response.usage.completion_tokens, 5);
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.model, "stream-model");
}

#[tokio::test]
async fn streamed_parallel_tool_calls_are_assembled_from_fragments() {
    let server = MockServer::start().await;
    let frag = |index: u32, id: Option<&str>, name: Option<&str>, args: &str| {
        let mut function = json!({"arguments": args});
        if let Some(name) = name {
            function["name"] = json!(name);
        }
        let mut call = json!({"index": index, "function": function});
        if let Some(id) = id {
            call["id"] = json!(id);
            call["type"] = json!("function");
        }
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    };
    let events = vec![
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null}}]}),
        frag(0, Some("call_a"), Some("search"), ""),
        frag(0, None, None, "{\"que"),
        frag(1, Some("call_b"), Some("weather"), "{\"city\""),
        frag(0, None, None, "ry\": \"rust "),
        frag(1, None, None, ": \"Paris\"}"),
        frag(0, None, None, "sse\"}"),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9}}),
    ];
    Mock::given(method("POST"))
        .respond_with(sse_response(sse(&events)))
        .mount(&server)
        .await;

    let (sink, seen) = recording_sink();
    let mut req = request();
    req.stream = true;
    let response = client(&server)
        .complete(req, Some(sink))
        .await
        .expect("completion");
    assert!(
        seen.lock().expect("lock").is_empty(),
        "tool arguments are not text deltas"
    );
    assert_eq!(response.message.content, None);
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.message.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "search".into(),
                arguments: "{\"query\": \"rust sse\"}".into()
            },
            ToolCall {
                id: "call_b".into(),
                name: "weather".into(),
                arguments: "{\"city\": \"Paris\"}".into()
            },
        ]
    );
    assert_eq!(response.usage.total(), 16);
}

#[tokio::test]
async fn stream_cut_before_completion_is_a_stream_error() {
    let server = MockServer::start().await;
    let body = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": "partial"}}]})
    );
    Mock::given(method("POST"))
        .respond_with(sse_response(body))
        .mount(&server)
        .await;
    let mut req = request();
    req.stream = true;
    let err = client(&server)
        .complete(req, None)
        .await
        .expect_err("must fail");
    assert!(matches!(err, LlmError::Stream(_)), "{err:?}");
    assert_eq!(
        request_count(&server).await,
        1,
        "a stream that delivered bytes is not retried"
    );
}

#[tokio::test]
async fn stream_error_event_is_reported() {
    let server = MockServer::start().await;
    let body = "data: {\"error\": {\"message\": \"model overloaded\"}}\n\n".to_owned();
    Mock::given(method("POST"))
        .respond_with(sse_response(body))
        .mount(&server)
        .await;
    let mut req = request();
    req.stream = true;
    let err = client(&server)
        .complete(req, None)
        .await
        .expect_err("must fail");
    assert!(
        matches!(&err, LlmError::Stream(m) if m.contains("model overloaded")),
        "{err:?}"
    );
}

#[tokio::test]
async fn server_ignoring_stream_flag_still_works() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(completion(json!({"content": "all at once"}))),
        )
        .mount(&server)
        .await;
    let (sink, seen) = recording_sink();
    let mut req = request();
    req.stream = true;
    let response = client(&server)
        .complete(req, Some(sink))
        .await
        .expect("completion");
    assert_eq!(response.message.content.as_deref(), Some("all at once"));
    assert_eq!(*seen.lock().expect("lock"), vec!["all at once".to_owned()]);
}

#[tokio::test]
async fn rate_limit_with_retry_after_then_success() {
    let server = MockServer::start().await;
    fail_once_then(
        &server,
        ResponseTemplate::new(429)
            .insert_header("retry-after", "1")
            .set_body_string("slow down"),
        ResponseTemplate::new(200).set_body_json(completion(json!({"content": "finally"}))),
    )
    .await;

    // backoff_max is 50 ms, so only an honoured Retry-After can explain a wait near 1 s
    // (the cap is 4 × backoff_max = 200 ms, so raise backoff_max for this test).
    let config = OpenAiConfig {
        backoff_max: Duration::from_secs(1),
        ..config(&server)
    };
    let started = Instant::now();
    let response = OpenAiClient::new(config)
        .expect("config")
        .complete(request(), None)
        .await
        .expect("completion");
    assert_eq!(response.message.content.as_deref(), Some("finally"));
    assert_eq!(request_count(&server).await, 2);
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "Retry-After was not honoured: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn rate_limited_after_retries_exhausted() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "0"))
        .mount(&server)
        .await;
    let err = client(&server)
        .complete(request(), None)
        .await
        .expect_err("must fail");
    assert_eq!(
        err,
        LlmError::RateLimited {
            retry_after: Some(Duration::ZERO)
        }
    );
    assert_eq!(err.code(), "llm_rate_limited");
    assert_eq!(request_count(&server).await, 3);
}

#[tokio::test]
async fn server_error_then_success() {
    let server = MockServer::start().await;
    fail_once_then(
        &server,
        ResponseTemplate::new(500).set_body_string("oops"),
        ResponseTemplate::new(200).set_body_json(completion(json!({"content": "recovered"}))),
    )
    .await;
    let response = client(&server)
        .complete(request(), None)
        .await
        .expect("completion");
    assert_eq!(response.message.content.as_deref(), Some("recovered"));
    assert_eq!(request_count(&server).await, 2);
}

#[tokio::test]
async fn streamed_request_is_retried_before_any_body_byte() {
    let server = MockServer::start().await;
    let events =
        [json!({"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]})];
    fail_once_then(
        &server,
        ResponseTemplate::new(503),
        sse_response(sse(&events)),
    )
    .await;
    let (sink, seen) = recording_sink();
    let mut req = request();
    req.stream = true;
    let response = client(&server)
        .complete(req, Some(sink))
        .await
        .expect("completion");
    assert_eq!(response.message.content.as_deref(), Some("ok"));
    assert_eq!(*seen.lock().expect("lock"), vec!["ok".to_owned()]);
    assert_eq!(request_count(&server).await, 2);
}

#[tokio::test]
async fn server_error_forever_gives_status_after_max_attempts() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(502)
                .set_body_json(json!({"error": {"message": "bad gateway upstream"}})),
        )
        .mount(&server)
        .await;
    let err = client(&server)
        .complete(request(), None)
        .await
        .expect_err("must fail");
    assert_eq!(
        err,
        LlmError::Status {
            status: 502,
            body_excerpt: "bad gateway upstream".into()
        }
    );
    assert_eq!(err.code(), "llm_http_status");
    assert!(err.is_retryable());
    assert_eq!(request_count(&server).await, 3);
}

#[tokio::test]
async fn client_error_is_not_retried() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(400).set_body_string("x".repeat(10_000)))
        .mount(&server)
        .await;
    let err = client(&server)
        .complete(request(), None)
        .await
        .expect_err("must fail");
    match &err {
        LlmError::Status {
            status: 400,
            body_excerpt,
        } => assert!(body_excerpt.chars().count() < 400),
        other => panic!("{other:?}"),
    }
    assert!(!err.is_retryable());
    assert_eq!(request_count(&server).await, 1);
}

#[tokio::test]
async fn slow_server_times_out() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(completion(json!({"content": "too late"})))
                .set_delay(Duration::from_secs(2)),
        )
        .mount(&server)
        .await;
    let config = OpenAiConfig {
        request_timeout: Duration::from_millis(200),
        max_attempts: 2,
        ..config(&server)
    };
    let err = OpenAiClient::new(config)
        .expect("config")
        .complete(request(), None)
        .await
        .expect_err("must fail");
    assert_eq!(err, LlmError::Timeout(Duration::from_millis(200)));
    assert_eq!(err.code(), "llm_timeout");
    assert_eq!(request_count(&server).await, 2, "timeouts are retried");
}

#[tokio::test]
async fn slow_streaming_server_times_out() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(sse_response(sse(&[])).set_delay(Duration::from_secs(2)))
        .mount(&server)
        .await;
    let config = OpenAiConfig {
        request_timeout: Duration::from_millis(200),
        max_attempts: 1,
        ..config(&server)
    };
    let mut req = request();
    req.stream = true;
    let err = OpenAiClient::new(config)
        .expect("config")
        .complete(req, None)
        .await
        .expect_err("must fail");
    assert!(matches!(err, LlmError::Timeout(_)), "{err:?}");
}

#[tokio::test]
async fn garbage_bodies_are_invalid_responses() {
    for body in [
        ResponseTemplate::new(200).set_body_string("<html>not json</html>"),
        ResponseTemplate::new(200).set_body_json(json!({"id": "x", "object": "chat.completion"})),
        ResponseTemplate::new(200).set_body_json(json!({"choices": []})),
        ResponseTemplate::new(200)
            .set_body_json(json!({"choices": [{"message": {"content": 42}}]})),
        ResponseTemplate::new(200),
    ] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(body)
            .mount(&server)
            .await;
        let err = client(&server)
            .complete(request(), None)
            .await
            .expect_err("must fail");
        assert!(matches!(err, LlmError::InvalidResponse(_)), "{err:?}");
        assert_eq!(err.code(), "llm_invalid_response");
        assert_eq!(
            request_count(&server).await,
            1,
            "invalid responses are not retried"
        );
    }
}

#[tokio::test]
async fn api_key_never_leaks_into_errors() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("authorization", format!("Bearer {KEY}").as_str()))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({
            "error": {"message": format!("Incorrect API key provided: {KEY}."), "type": "invalid_request_error"}
        })))
        .expect(1)
        .mount(&server)
        .await;
    let client = client(&server);
    let err = client
        .complete(request(), None)
        .await
        .expect_err("must fail");
    assert!(
        matches!(err, LlmError::Status { status: 401, .. }),
        "{err:?}"
    );
    for text in [
        err.to_string(),
        format!("{err:?}"),
        format!("{client:?}"),
        format!("{:?}", client.config()),
    ] {
        assert!(!text.contains(KEY), "key leaked: {text}");
    }
    assert!(err.to_string().contains("Incorrect API key provided"));
}

#[tokio::test]
async fn no_key_means_no_authorization_header() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(completion(json!({"content": "local"}))),
        )
        .mount(&server)
        .await;
    let config = OpenAiConfig {
        api_key: None,
        ..config(&server)
    };
    OpenAiClient::new(config)
        .expect("config")
        .complete(request(), None)
        .await
        .expect("completion");
    let requests = server.received_requests().await.expect("recording");
    assert!(!requests[0].headers.contains_key("authorization"));
}

#[tokio::test]
async fn unreachable_endpoint_is_an_http_error_after_retries() {
    // Bind and drop a listener to get a port that refuses connections.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let config = OpenAiConfig {
        base_url: format!("http://127.0.0.1:{port}/v1"),
        api_key: Some(KEY.to_owned()),
        max_attempts: 2,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(10),
        ..OpenAiConfig::default()
    };
    let err = OpenAiClient::new(config)
        .expect("config")
        .complete(request(), None)
        .await
        .expect_err("must fail");
    assert!(matches!(err, LlmError::Http(_)), "{err:?}");
    assert!(err.is_retryable());
    assert!(!err.to_string().contains(KEY));
}

#[tokio::test]
async fn one_client_serves_concurrent_chats() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(completion(json!({"content": "hi"}))),
        )
        .mount(&server)
        .await;
    let client: Arc<dyn ChatModel> = Arc::new(client(&server));
    let calls = (0..8).map(|_| client.complete(request(), None));
    for result in futures::future::join_all(calls).await {
        assert_eq!(
            result.expect("completion").message.content.as_deref(),
            Some("hi")
        );
    }
    assert_eq!(request_count(&server).await, 8);
}

/// A chat's transcript over many turns, each turn's request built on the last one's head (as
/// a chat session does), goes out in pieces: each request arrives as one JSON body with its
/// exact `Content-Length` and every message in order.
#[tokio::test]
async fn a_transcript_sent_in_pieces_arrives_whole_with_its_length() {
    use tessera_llm::{Messages, WirePrefix};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(completion(json!({"content": "ok"}))),
        )
        .mount(&server)
        .await;
    let client = client(&server);
    let mut head = vec![Message::text(Role::System, "You write.")];
    let mut prefix = WirePrefix::default();
    // More turns than a head keeps pieces, so pieces are also joined on the way.
    let turns = 30;
    for turn in 0..turns {
        head.push(Message::text(
            Role::User,
            format!("question {turn} \"quoted\""),
        ));
        prefix = prefix.extended();
        let messages = Messages::new(Arc::new(head.clone()), prefix.clone(), Arc::default());
        let response = client
            .complete(ChatRequest::new("Writer", messages), None)
            .await
            .expect("completion");
        head.push(Message::assistant("Writer", format!("answer {turn}")));
        assert_eq!(response.message.content.as_deref(), Some("ok"));
    }
    let requests = server.received_requests().await.expect("recording");
    assert_eq!(requests.len(), turns);
    for (turn, request) in requests.iter().enumerate() {
        let length = request
            .headers
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        assert_eq!(length, Some(request.body.len()), "turn {turn}");
        assert!(request.headers.get("transfer-encoding").is_none());
        let body: Value = serde_json::from_slice(&request.body).expect("json body");
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        // The system message, then `turn` questions and answers, then this turn's question.
        assert_eq!(messages.len(), 2 + 2 * turn, "turn {turn}");
        for (i, message) in messages.iter().enumerate().skip(1) {
            let expected = if i % 2 == 1 {
                json!({"role": "user", "content": format!("question {} \"quoted\"", i / 2)})
            } else {
                json!({"role": "assistant", "content": format!("answer {}", i / 2 - 1), "name": "Writer"})
            };
            assert_eq!(message, &expected, "turn {turn}, message {i}");
        }
    }
}

/// A body in pieces is sent whole again when its first attempt fails.
#[tokio::test]
async fn a_retried_request_sends_the_same_body_in_pieces() {
    use tessera_llm::{Messages, WirePrefix};
    let server = MockServer::start().await;
    let first = WirePrefix::default();
    let mut head = vec![
        Message::text(Role::System, "You write."),
        Message::text(Role::User, "one"),
    ];
    let client = client(&server);
    // Turn 1 encodes the head; turn 2's head is in two pieces (turn 1's, then its own).
    let one = Messages::new(Arc::new(head.clone()), first.clone(), Arc::default());
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(completion(json!({"content": "ok"}))),
        )
        .mount(&server)
        .await;
    client
        .complete(ChatRequest::new("Writer", one), None)
        .await
        .expect("turn 1");
    server.reset().await;
    fail_once_then(
        &server,
        ResponseTemplate::new(500).set_body_string("oops"),
        ResponseTemplate::new(200).set_body_json(completion(json!({"content": "ok"}))),
    )
    .await;
    head.push(Message::assistant("Writer", "ok"));
    head.push(Message::text(Role::User, "two"));
    let two = Messages::new(Arc::new(head), first.extended(), Arc::default());
    client
        .complete(ChatRequest::new("Writer", two), None)
        .await
        .expect("turn 2, after one retry");
    let requests = server.received_requests().await.expect("recording");
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body, requests[1].body);
    let body: Value = serde_json::from_slice(&requests[1].body).expect("json body");
    assert_eq!(
        body["messages"][3],
        json!({"role": "user", "content": "two"})
    );
}
