//! OpenTelemetry traces end to end: the real `tessera serve`, the real mock LLM over HTTP, an
//! HTTP tool, and a real OTLP/HTTP receiver whose protobuf `ExportTraceServiceRequest`s are
//! decoded here. Checks the GenAI span names, their parentage under the WebSocket upgrade's
//! `traceparent`, their attributes, that no message content is exported, and that the tool's
//! HTTP request carries the trace context (and none when export is off).

use std::collections::HashMap;
use std::path::Path;

use integration_tests::mock_llm::MockLlm;
use integration_tests::server::TestServer;
use integration_tests::wsclient::WsClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// The caller's trace context: trace id and span id the workflow span must hang under.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN_ID: &str = "00f067aa0ba902b7";
/// What the user types: must never appear in an exported span.
const USER_TEXT: &str = "look up the secret-ish word zebra-4711";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{CALLER_SPAN_ID}-01")
}

/// A workflow with one agent whose only tool is an HTTP endpoint at `tool_url`.
fn write_workflow(dir: &Path, tool_url: &str) {
    let wf = dir.join("Lookup");
    std::fs::create_dir_all(&wf).unwrap_or_else(|e| panic!("{e}"));
    let files = [
        (
            "workflow.json",
            json!({"name": "Lookup", "description": "Looks a word up over HTTP.",
                   "initial_agent": "LookupAgent", "max_turns": 10,
                   "human_in_the_loop": true, "startup_mode": "UserDriven"}),
        ),
        (
            "agents.json",
            json!({"agents": {"LookupAgent": {
                "system_message": "Look words up with the lookup tool, then answer briefly.",
                "max_consecutive_auto_reply": 4}}}),
        ),
        (
            "handoffs.json",
            json!({"handoff_rules": [{"source_agent": "LookupAgent", "target_agent": "user",
                                      "handoff_type": "after_work"}]}),
        ),
        (
            "tools.json",
            json!({"tools": [{"agent": "LookupAgent", "function": "lookup",
                "description": "Look a word up", "tool_type": "Agent_Tool", "ui": null,
                "impl": {"kind": "http", "url": tool_url},
                "parameters": {"type": "object",
                    "properties": {"word": {"type": "string", "minLength": 1}},
                    "required": ["word"]},
                "timeout_s": 5}]}),
        ),
    ];
    for (name, body) in files {
        std::fs::write(wf.join(name), body.to_string()).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// An HTTP tool endpoint that answers every call and records it.
async fn tool_server() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/lookup"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"meaning": "a striped horse"})),
        )
        .mount(&server)
        .await;
    server
}

/// The OTLP/HTTP receiver: accepts every export and keeps the requests.
async fn otlp_receiver() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/traces"))
        .respond_with(
            ResponseTemplate::new(200).insert_header("content-type", "application/x-protobuf"),
        )
        .mount(&server)
        .await;
    server
}

/// Runs one chat turn through the tool, with `traceparent` on the WebSocket upgrade.
async fn chat_once(server: &TestServer) -> String {
    let chat = server.create_chat("Lookup", "alice").await;
    let parent = traceparent();
    let mut ws = WsClient::try_connect_with(
        &server.ws_url(&chat, 0),
        "alice",
        &[("traceparent", parent.as_str())],
    )
    .await
    .unwrap_or_else(|e| panic!("websocket connect failed: {e}"));
    ws.until("chat.resume_boundary").await;
    ws.say(USER_TEXT).await;
    let response = ws.until("chat.tool_response").await;
    assert_eq!(response["data"]["success"], true, "{response}");
    ws.until("chat.input_request").await;
    ws.close().await;
    chat
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn str_attr<'a>(span: &'a Span, key: &str) -> &'a str {
    match attr(span, key) {
        Some(AnyValue::StringValue(s)) => s,
        other => panic!("span {:?}: {key} is {other:?}", span.name),
    }
}

fn int_attr(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(AnyValue::IntValue(i)) => *i,
        other => panic!("span {:?}: {key} is {other:?}", span.name),
    }
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(
        found.len(),
        1,
        "exactly one span {name:?} in {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    found[0]
}

/// What the OTLP receiver got from one traced chat turn (flushed at shutdown).
struct Exported {
    chat: String,
    spans: Vec<Span>,
    /// The raw protobuf bodies, to look for text anywhere in them.
    bodies: Vec<Vec<u8>>,
}

impl Exported {
    fn contains(&self, text: &str) -> bool {
        self.bodies
            .iter()
            .any(|b| String::from_utf8_lossy(b).contains(text))
    }
}

/// A server exporting to a fresh OTLP receiver (plus `extra_env`), with the mock LLM and the
/// `Lookup` workflow's HTTP tool; dropping it stops them all.
struct Traced {
    server: TestServer,
    otlp: MockServer,
    tool: MockServer,
    _mock: MockLlm,
    _workflows: tempfile::TempDir,
}

async fn traced_server(extra_env: &[(&str, &str)]) -> Traced {
    let otlp = otlp_receiver().await;
    let tool = tool_server().await;
    let mock = MockLlm::start().await;
    let workflows = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_workflow(workflows.path(), &format!("{}/lookup", tool.uri()));
    let mut options = mock.options();
    options.workflows_dir = Some(workflows.path().to_path_buf());
    options.env.extend([
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), otlp.uri()),
        ("OTEL_SERVICE_NAME".into(), "tessera-otel-test".into()),
        // Nothing is exported on a timer during the test: what arrives was flushed at shutdown.
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "600000".into()),
    ]);
    options.env.extend(
        extra_env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    Traced {
        server: TestServer::start(options).await,
        otlp,
        tool,
        _mock: mock,
        _workflows: workflows,
    }
}

/// Runs one chat turn with export on (plus `extra_env`), stops the server, and decodes what
/// the receiver got.
async fn traced_chat(extra_env: &[(&str, &str)]) -> Exported {
    let traced = traced_server(extra_env).await;
    let chat = chat_once(&traced.server).await;
    assert!(
        traced.server.terminate().await,
        "tessera exits cleanly on SIGTERM"
    );
    decode(&traced.otlp, chat).await
}

/// Decodes every export `otlp` received.
async fn decode(otlp: &MockServer, chat: String) -> Exported {
    let requests = otlp.received_requests().await.unwrap_or_default();
    assert!(!requests.is_empty(), "the spans were flushed on shutdown");
    let mut spans = Vec::new();
    let mut bodies = Vec::new();
    for request in requests {
        assert_eq!(
            request
                .headers
                .get("content-type")
                .map(|v| v.to_str().unwrap_or_default()),
            Some("application/x-protobuf")
        );
        let export = ExportTraceServiceRequest::decode(request.body.as_slice())
            .unwrap_or_else(|e| panic!("not an ExportTraceServiceRequest: {e}"));
        for resource in export.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
                .and_then(|v| v.value.clone());
            assert_eq!(
                service,
                Some(AnyValue::StringValue("tessera-otel-test".into()))
            );
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        bodies.push(request.body);
    }
    Exported {
        chat,
        spans,
        bodies,
    }
}

#[tokio::test]
async fn genai_spans_are_exported_under_the_callers_trace_without_message_content() {
    let exported = traced_chat(&[]).await;
    assert!(
        !exported.contains("zebra-4711"),
        "the user's message is not exported"
    );
    assert!(
        !exported.contains("striped horse"),
        "the tool's result is not exported"
    );
    assert!(
        !exported.contains("Done: the tool returned"),
        "the model's answer is not exported"
    );
    let (chat, spans) = (&exported.chat, &exported.spans);

    let workflow = one(spans, "invoke_workflow Lookup");
    let agent = one(spans, "invoke_agent LookupAgent");
    let tool_span = one(spans, "execute_tool lookup");
    let chats: Vec<_> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert_eq!(
        chats.len(),
        2,
        "a model call for the tool, one for the answer"
    );

    // Parentage: caller ⊃ workflow ⊃ agent ⊃ {chat, execute_tool}, all in the caller's trace.
    for span in spans {
        assert_eq!(hex(&span.trace_id), TRACE_ID, "span {:?}", span.name);
    }
    assert_eq!(hex(&workflow.parent_span_id), CALLER_SPAN_ID);
    assert_eq!(agent.parent_span_id, workflow.span_id);
    assert_eq!(tool_span.parent_span_id, agent.span_id);
    for chat_span in &chats {
        assert_eq!(chat_span.parent_span_id, agent.span_id);
    }

    // Attributes (OpenTelemetry GenAI semantic conventions).
    assert_eq!(
        str_attr(workflow, "gen_ai.operation.name"),
        "invoke_workflow"
    );
    assert_eq!(str_attr(workflow, "gen_ai.conversation.id"), chat.as_str());
    assert_eq!(str_attr(agent, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(str_attr(agent, "gen_ai.agent.name"), "LookupAgent");
    for chat_span in &chats {
        assert_eq!(chat_span.kind, SpanKind::Client as i32);
        assert_eq!(str_attr(chat_span, "gen_ai.operation.name"), "chat");
        assert_eq!(str_attr(chat_span, "gen_ai.provider.name"), "openai");
        let model = str_attr(chat_span, "gen_ai.request.model");
        assert_eq!(chat_span.name, format!("chat {model}"));
        assert_eq!(str_attr(chat_span, "gen_ai.conversation.id"), chat.as_str());
        assert!(int_attr(chat_span, "gen_ai.usage.input_tokens") > 0);
        assert!(int_attr(chat_span, "gen_ai.usage.output_tokens") > 0);
        match attr(chat_span, "gen_ai.response.finish_reasons") {
            Some(AnyValue::ArrayValue(list)) => assert_eq!(list.values.len(), 1),
            other => panic!("finish reasons: {other:?}"),
        }
        match attr(chat_span, "gen_ai.response.time_to_first_chunk") {
            Some(AnyValue::DoubleValue(secs)) => assert!(*secs >= 0.0),
            other => panic!("time to first chunk: {other:?}"),
        }
    }
    let finish: Vec<String> = chats
        .iter()
        .filter_map(|s| match attr(s, "gen_ai.response.finish_reasons") {
            Some(AnyValue::ArrayValue(list)) => list.values.first().and_then(|v| match &v.value {
                Some(AnyValue::StringValue(s)) => Some(s.clone()),
                _ => None,
            }),
            _ => None,
        })
        .collect();
    assert_eq!(finish, ["tool_calls", "stop"]);
    assert_eq!(str_attr(tool_span, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(str_attr(tool_span, "gen_ai.tool.name"), "lookup");
    assert!(!str_attr(tool_span, "gen_ai.tool.call.id").is_empty());

    // No other span made it out: logs stay logs.
    let names: HashMap<&str, usize> = spans.iter().fold(HashMap::new(), |mut m, s| {
        *m.entry(s.name.as_str()).or_default() += 1;
        m
    });
    assert_eq!(names.len(), 4, "{names:?}");
}

#[tokio::test]
async fn message_content_is_exported_only_when_the_operator_opts_in() {
    let exported =
        traced_chat(&[("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")]).await;
    let chats: Vec<_> = exported
        .spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert!(
        chats
            .iter()
            .any(|s| str_attr(s, "gen_ai.input.messages").contains("zebra-4711")),
        "the user's message is on a chat span"
    );
    assert!(
        chats
            .iter()
            .any(|s| str_attr(s, "gen_ai.output.messages").contains("Done: the tool returned")),
        "the model's answer is on a chat span"
    );
    let tool_span = one(&exported.spans, "execute_tool lookup");
    assert!(str_attr(tool_span, "gen_ai.tool.call.result").contains("striped horse"));
    assert!(str_attr(tool_span, "gen_ai.tool.call.arguments").contains("word"));
}

#[tokio::test]
async fn an_http_tool_call_carries_the_traceparent_of_its_span() {
    let traced = traced_server(&[]).await;
    let (otlp, tool) = (&traced.otlp, &traced.tool);
    chat_once(&traced.server).await;
    assert!(traced.server.terminate().await);

    let calls = tool.received_requests().await.unwrap_or_default();
    assert_eq!(calls.len(), 1);
    let header = calls[0]
        .headers
        .get("traceparent")
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .unwrap_or_else(|| panic!("the tool call has no traceparent"));
    let parts: Vec<&str> = header.split('-').collect();
    assert_eq!(parts.len(), 4, "{header}");
    assert_eq!(parts[0], "00");
    assert_eq!(
        parts[1], TRACE_ID,
        "the caller's trace continues into the tool"
    );
    assert_eq!(parts[3], "01", "sampled");

    // Its parent id is the exported `execute_tool` span.
    let mut tool_span_ids = Vec::new();
    for request in otlp.received_requests().await.unwrap_or_default() {
        let export = ExportTraceServiceRequest::decode(request.body.as_slice())
            .unwrap_or_else(|e| panic!("{e}"));
        for resource in export.resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    if span.name == "execute_tool lookup" {
                        tool_span_ids.push(hex(&span.span_id));
                    }
                }
            }
        }
    }
    assert_eq!(tool_span_ids, [parts[2].to_owned()]);
}

#[tokio::test]
async fn without_otel_variables_nothing_is_propagated() {
    let tool = tool_server().await;
    let mock = MockLlm::start().await;
    let workflows = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_workflow(workflows.path(), &format!("{}/lookup", tool.uri()));
    let mut options = mock.options();
    options.workflows_dir = Some(workflows.path().to_path_buf());
    let server = TestServer::start(options).await;
    chat_once(&server).await;
    assert!(server.terminate().await);

    let calls = tool.received_requests().await.unwrap_or_default();
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0].headers.get("traceparent").is_none(),
        "export is off by default: the incoming traceparent is not passed on"
    );
}

#[tokio::test]
async fn a_ui_tool_has_an_execute_tool_span_holding_the_wait_for_the_browser() {
    let otlp = otlp_receiver().await;
    // The shipped Generator workflow on the demo model: no LLM needed.
    let server = TestServer::start(integration_tests::server::ServerOptions {
        env: vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), otlp.uri()),
            ("OTEL_SERVICE_NAME".into(), "tessera-otel-test".into()),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "600000".into()),
        ],
        ..Default::default()
    })
    .await;
    let chat = server.create_chat("Generator", "alice").await;
    let parent = traceparent();
    let mut ws = WsClient::try_connect_with(
        &server.ws_url(&chat, 0),
        "alice",
        &[("traceparent", parent.as_str())],
    )
    .await
    .unwrap_or_else(|e| panic!("websocket connect failed: {e}"));
    ws.until("chat.input_request").await;
    ws.say("Automate my weekly social media posts").await;
    let plan = ws.until_ui_call().await;
    let corr = plan["data"]["corr"].as_str().unwrap_or_default().to_owned();
    ws.send(json!({"type": "chat.tool_response", "data": {
        "corr": corr, "status": "success", "action": "submit", "data": {"approved": true}}}))
        .await;
    ws.until_match("chat.tool_response", |e| {
        e["data"]["tool_name"] == "action_plan"
    })
    .await;
    // The next UI tool asks for an API key: cancel it, so the run (and its workflow span) ends.
    ws.until_ui_call().await;
    ws.send(json!({"type": "chat.cancel"})).await;
    ws.until("chat.input_request").await;
    ws.close().await;
    assert!(server.terminate().await);

    let exported = decode(&otlp, chat).await;
    let spans = &exported.spans;
    let wait = one(spans, "await_ui_response action_plan");
    let tool = one(spans, "execute_tool action_plan");
    assert_eq!(wait.parent_span_id, tool.span_id);
    assert_eq!(str_attr(wait, "gen_ai.tool.call.id"), corr);
    assert_eq!(str_attr(wait, "tessera.ui.outcome"), "answered");
    assert_eq!(str_attr(tool, "gen_ai.tool.name"), "action_plan");
    let workflow = spans
        .iter()
        .find(|s| s.span_id == tool.parent_span_id)
        .unwrap_or_else(|| panic!("the UI tool's span has no parent span"));
    assert_eq!(workflow.name, "invoke_workflow Generator");
    assert_eq!(hex(&workflow.parent_span_id), CALLER_SPAN_ID);
    assert_eq!(hex(&wait.trace_id), TRACE_ID);
    // The demo model's calls are `chat` spans too, under their agents.
    let chat_span = spans
        .iter()
        .find(|s| s.name.starts_with("chat "))
        .unwrap_or_else(|| panic!("no chat span"));
    assert_eq!(
        str_attr(chat_span, "gen_ai.provider.name"),
        "tessera.scripted"
    );
    assert!(
        !exported.contains("weekly social media"),
        "no content by default"
    );
}

/// A REST input's `traceparent` is the parent of the turn's workflow span (the WebSocket that
/// follows the chat sends none).
#[tokio::test]
async fn a_rest_input_continues_the_callers_trace() {
    let traced = traced_server(&[]).await;
    let server = &traced.server;
    let chat = server.create_chat("Lookup", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    ws.until("chat.resume_boundary").await;
    let sent = reqwest::Client::new()
        .post(format!("{}/api/v1/chats/{chat}/input", server.base))
        .header("x-user-id", "alice")
        .header("traceparent", traceparent())
        .json(&json!({"content": USER_TEXT}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST input: {e}"));
    assert!(sent.status().is_success(), "{}", sent.status());
    let response = ws.until("chat.tool_response").await;
    assert_eq!(response["data"]["success"], true, "{response}");
    ws.until("chat.input_request").await;
    ws.close().await;
    assert!(
        traced.server.terminate().await,
        "tessera exits cleanly on SIGTERM"
    );

    let exported = decode(&traced.otlp, chat).await;
    let workflow = one(&exported.spans, "invoke_workflow Lookup");
    assert_eq!(hex(&workflow.trace_id), TRACE_ID);
    assert_eq!(hex(&workflow.parent_span_id), CALLER_SPAN_ID);
    let agent = one(&exported.spans, "invoke_agent LookupAgent");
    assert_eq!(agent.parent_span_id, workflow.span_id);
}
