//! MCP tools end to end: the real `tessera serve`, the mock OpenAI server over HTTP, and the
//! real `tessera-mcp-testserver` over stdio (started by tessera) or Streamable HTTP. The mock
//! model calls the first tool it is offered, then answers once it reads a tool result.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use integration_tests::mock_llm::MockLlm;
use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::wsclient::WsClient;
use integration_tests::{mcp_testserver_bin, tessera_bin, workspace_root};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const FINAL_TEXT: &str = "Done: the tool returned its result.";

/// A workflow folder `McpDemo` whose one agent may call `tool` of the server `test`.
fn workflow(root: &Path, server: Value, tool: &str) -> PathBuf {
    workflow_allowing(root, server, &[tool])
}

fn workflow_allowing(root: &Path, server: Value, tools: &[&str]) -> PathBuf {
    let dir = root.join("McpDemo");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let write = |name: &str, v: Value| {
        std::fs::write(dir.join(name), v.to_string()).unwrap_or_else(|e| panic!("{e}"))
    };
    write(
        "workflow.json",
        json!({"name": "McpDemo", "description": "MCP tools", "initial_agent": "McpAgent",
               "max_turns": 20, "human_in_the_loop": true, "startup_mode": "UserDriven"}),
    );
    write(
        "agents.json",
        json!({"agents": {"McpAgent": {"system_message": "Use the tools.", "max_consecutive_auto_reply": 5}}}),
    );
    write(
        "handoffs.json",
        json!({"handoff_rules": [{"source_agent": "McpAgent", "target_agent": "user", "handoff_type": "after_work"}]}),
    );
    write(
        "mcp.json",
        json!({"servers": {"test": server}, "agents": {"McpAgent": {"test": tools}}}),
    );
    root.to_path_buf()
}

fn stdio_server(env: Value) -> Value {
    json!({"command": mcp_testserver_bin().display().to_string(), "args": ["--stdio"],
           "env": env, "tool_prefix": "test_", "timeout_s": 2})
}

/// The calls the test server logged (one JSON line each).
fn logged_calls(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("log line {l:?}: {e}")))
        .collect()
}

/// One user message: the model calls `tool`, reads the result and answers. Returns the
/// `chat.tool_response`.
async fn one_turn(ws: &mut WsClient, tool: &str) -> Value {
    ws.say("go").await;
    let call = ws.until("chat.tool_call").await;
    assert_eq!(call["data"]["tool_name"], tool, "{call}");
    let response = ws.until("chat.tool_response").await;
    assert_eq!(response["data"]["corr"], call["data"]["corr"]);
    let text = ws
        .until_match("chat.text", |e| e["data"]["agent"] == "McpAgent")
        .await;
    assert_eq!(
        text["data"]["content"], FINAL_TEXT,
        "the model read the result"
    );
    ws.until("chat.input_request").await;
    response
}

async fn open_chat(server: &TestServer) -> WsClient {
    let chat = server.create_chat("McpDemo", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    ws.until("chat.resume_boundary").await;
    ws
}

#[tokio::test]
async fn a_stdio_mcp_tool_runs_exactly_once_and_its_result_reaches_the_model() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = tmp.path().join("calls.log");
    let root = workflow(
        &tmp.path().join("workflows"),
        stdio_server(json!({"TESSERA_MCP_TESTSERVER_LOG": log.display().to_string()})),
        "echo",
    );
    let mock = MockLlm::start().await;
    let server = TestServer::start(ServerOptions {
        workflows_dir: Some(root),
        ..mock.options()
    })
    .await;
    let mut ws = open_chat(&server).await;
    let response = one_turn(&mut ws, "test_echo").await;
    assert_eq!(response["data"]["success"], true, "{response}");
    assert_eq!(
        response["data"]["payload"]["result"], "mock",
        "the server echoed the model's argument: {response}"
    );
    let calls = logged_calls(&log);
    assert_eq!(calls.len(), 1, "exactly one call: {calls:?}");
    assert_eq!(calls[0]["tool"], "echo");
    assert_eq!(calls[0]["arguments"], json!({"message": "mock"}));
    assert_eq!(
        calls[0]["meta"]["tessera/user"], "alice",
        "identity from the session: {calls:?}"
    );
    assert!(calls[0]["meta"]["tessera/tenant"].is_string(), "{calls:?}");
}

#[tokio::test]
async fn a_stdio_server_that_crashes_mid_call_gives_a_tool_error_and_is_restarted() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = tmp.path().join("calls.log");
    let marker = tmp.path().join("crashed");
    let root = workflow(
        &tmp.path().join("workflows"),
        stdio_server(json!({
            "TESSERA_MCP_TESTSERVER_LOG": log.display().to_string(),
            "TESSERA_MCP_TESTSERVER_CRASH_ONCE": marker.display().to_string(),
        })),
        "crash",
    );
    let mock = MockLlm::start().await;
    let server = TestServer::start(ServerOptions {
        workflows_dir: Some(root),
        ..mock.options()
    })
    .await;
    let mut ws = open_chat(&server).await;
    let crashed = one_turn(&mut ws, "test_crash").await;
    assert_eq!(crashed["data"]["success"], false, "{crashed}");
    assert!(
        crashed["data"]["payload"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("MCP server")),
        "a clear tool error: {crashed}"
    );
    assert!(marker.exists(), "the server really crashed");
    // The next call reaches a restarted server.
    let recovered = one_turn(&mut ws, "test_crash").await;
    assert_eq!(recovered["data"]["success"], true, "{recovered}");
    assert_eq!(recovered["data"]["payload"]["result"], "recovered");
    assert_eq!(logged_calls(&log).len(), 2, "one call per turn");
}

/// `tessera-mcp-testserver --http` (killed when dropped) and its endpoint URL.
struct HttpMcpServer {
    _child: Child,
    url: String,
}

async fn http_mcp_server() -> HttpMcpServer {
    let mut child = Command::new(mcp_testserver_bin())
        .arg("--http")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start the MCP test server: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
        .unwrap_or_else(|| panic!("the MCP test server printed no address"));
    let url = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    HttpMcpServer { _child: child, url }
}

#[tokio::test]
async fn a_hanging_http_mcp_tool_times_out_and_the_turn_completes() {
    let mcp = http_mcp_server().await;
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = workflow(
        &tmp.path().join("workflows"),
        json!({"url": mcp.url, "headers": {"X-Client": "tessera"}, "timeout_s": 1}),
        "hang",
    );
    let mock = MockLlm::start().await;
    let server = TestServer::start(ServerOptions {
        workflows_dir: Some(root),
        ..mock.options()
    })
    .await;
    let mut ws = open_chat(&server).await;
    let hung = one_turn(&mut ws, "hang").await;
    assert_eq!(hung["data"]["success"], false, "{hung}");
    assert_eq!(hung["data"]["payload"]["code"], "timeout", "{hung}");
}

#[tokio::test]
async fn an_http_mcp_tool_is_called_over_streamable_http() {
    let mcp = http_mcp_server().await;
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = workflow(
        &tmp.path().join("workflows"),
        json!({"url": mcp.url, "tool_prefix": "remote_"}),
        "echo",
    );
    let mock = MockLlm::start().await;
    let server = TestServer::start(ServerOptions {
        workflows_dir: Some(root),
        ..mock.options()
    })
    .await;
    let mut ws = open_chat(&server).await;
    let response = one_turn(&mut ws, "remote_echo").await;
    assert_eq!(response["data"]["success"], true, "{response}");
    assert_eq!(response["data"]["payload"]["result"], "mock");
}

fn validate(dir: &Path) -> (bool, String) {
    let out = std::process::Command::new(tessera_bin())
        .arg("validate")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run tessera: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn validate_checks_allow_listed_tools_against_a_reachable_server() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = workflow_allowing(
        &tmp.path().join("workflows"),
        stdio_server(json!({})),
        &["echo", "nope"],
    );
    let (ok, stdout) = validate(&root);
    assert!(!ok, "a missing tool fails validation:\n{stdout}");
    assert!(
        stdout.contains("mcp:      test (stdio): 3 tools listed, allowed: echo, nope"),
        "{stdout}"
    );
    assert!(
        stdout.contains("tool \"nope\" is allowed but MCP server \"test\" does not list it"),
        "{stdout}"
    );
}

#[test]
fn the_shipped_mcp_workflow_validates_with_or_without_its_server() {
    let (ok, stdout) = validate(&workspace_root().join("workflows/McpEverything"));
    assert!(ok, "{stdout}");
    assert!(
        stdout.contains("warning: MCP server \"everything\" (http) is unreachable")
            || stdout.contains("mcp:      everything (http):"),
        "{stdout}"
    );
}

/// With traces exported, an MCP call carries the W3C trace context of its `execute_tool` span
/// in `_meta` (`traceparent`), under the trace of the WebSocket upgrade's `traceparent`.
#[tokio::test]
async fn an_mcp_tool_call_carries_the_traceparent_of_its_span() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message as _;
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    let otlp = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/traces"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&otlp)
        .await;
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = tmp.path().join("calls.log");
    let root = workflow(
        &tmp.path().join("workflows"),
        stdio_server(json!({"TESSERA_MCP_TESTSERVER_LOG": log.display().to_string()})),
        "echo",
    );
    let mock = MockLlm::start().await;
    let mut options = ServerOptions {
        workflows_dir: Some(root),
        ..mock.options()
    };
    options
        .env
        .push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), otlp.uri()));
    let server = TestServer::start(options).await;
    let chat = server.create_chat("McpDemo", "alice").await;
    let parent = format!("00-{TRACE_ID}-00f067aa0ba902b7-01");
    let mut ws = WsClient::try_connect_with(
        &server.ws_url(&chat, 0),
        "alice",
        &[("traceparent", parent.as_str())],
    )
    .await
    .unwrap_or_else(|e| panic!("websocket connect failed: {e}"));
    ws.until("chat.resume_boundary").await;
    one_turn(&mut ws, "test_echo").await;
    ws.close().await;
    assert!(server.terminate().await, "tessera exits cleanly on SIGTERM");

    let calls = logged_calls(&log);
    assert_eq!(calls.len(), 1, "exactly one call: {calls:?}");
    let header = calls[0]["meta"]["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("the MCP call has no traceparent: {calls:?}"))
        .to_owned();
    let parts: Vec<&str> = header.split('-').collect();
    assert_eq!(parts.len(), 4, "{header}");
    assert_eq!(
        parts[1], TRACE_ID,
        "the caller's trace continues into the MCP call"
    );
    // Its parent id is the exported `execute_tool` span of the call.
    let mut tool_span_ids = Vec::new();
    for request in otlp.received_requests().await.unwrap_or_default() {
        let export = ExportTraceServiceRequest::decode(request.body.as_slice())
            .unwrap_or_else(|e| panic!("{e}"));
        for resource in export.resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    if span.name == "execute_tool test_echo" {
                        tool_span_ids.push(
                            span.span_id
                                .iter()
                                .map(|b| format!("{b:02x}"))
                                .collect::<String>(),
                        );
                    }
                }
            }
        }
    }
    assert_eq!(tool_span_ids, [parts[2].to_owned()]);
}
