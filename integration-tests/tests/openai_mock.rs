//! The real `tessera serve` against the real `tessera-loadgen mock-llm` over real HTTP: the
//! OpenAI client, its streaming, tool calling and structured output, end to end.

use integration_tests::mock_llm::MockLlm;
use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::wsclient::WsClient;
use integration_tests::{copy_dir, workspace_root};
use serde_json::{Value, json};

fn answer(call: &Value, data: Value) -> Value {
    json!({"type": "chat.tool_response", "data": {
        "corr": call["data"]["corr"], "status": "success", "action": "submit", "data": data,
    }})
}

#[tokio::test]
async fn todo_assistant_calls_its_tool_then_answers_through_the_mock() {
    let mock = MockLlm::start().await;
    let server = TestServer::start(mock.options()).await;
    let chat = server.create_chat("TodoAssistant", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    let session = ws.until("chat.session").await;
    assert_eq!(session["data"]["demo"], false, "the real client is in use");
    ws.until("chat.resume_boundary").await;

    ws.say("Buy milk").await;
    let call = ws.until("chat.tool_call").await;
    assert_eq!(
        call["data"]["tool_name"], "add_task",
        "the first tool is called"
    );
    assert_eq!(call["data"]["awaiting_response"], false);
    assert_eq!(call["data"]["payload"]["interaction_type"], "agent_tool");
    assert_eq!(
        call["data"]["payload"]["tool_args"]["title"], "mock",
        "arguments are generated from the tool's schema"
    );
    let result = ws.until("chat.tool_response").await;
    assert_eq!(result["data"]["corr"], call["data"]["corr"]);
    assert_eq!(result["data"]["success"], true, "{result}");
    let text = ws
        .until_match("chat.text", |e| e["data"]["agent"] == "TodoAgent")
        .await;
    assert_eq!(
        text["data"]["content"],
        "Done: the tool returned its result."
    );
    assert!(
        !ws.of("chat.text_delta").is_empty(),
        "the answer was streamed over SSE"
    );
    ws.until("chat.input_request").await;
    let usage = ws.of("chat.usage");
    assert_eq!(usage.len(), 2, "two model calls, each with its usage");
    assert!(
        usage
            .iter()
            .all(|u| u["data"]["total_tokens"].as_u64() > Some(0))
    );

    let (status, snapshot) = server.get(&format!("/api/v1/chats/{chat}"), "alice").await;
    assert_eq!(status, 200);
    assert_eq!(snapshot["status"], "awaiting_user");
}

/// The deltas of the message `text` (a `chat.text`), in order.
fn deltas_of(ws: &WsClient, text: &Value) -> Vec<String> {
    ws.of("chat.text_delta")
        .iter()
        .filter(|d| d["data"]["message_id"] == text["data"]["message_id"])
        .map(|d| d["data"]["delta"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Runs TodoAssistant's first turn against a mock that streams a word every 50 ms; returns the
/// answer's text and its deltas.
async fn paced_answer(env: &[(&str, &str)]) -> (String, Vec<String>) {
    let mock = MockLlm::start_paced(50).await;
    let mut options = mock.options();
    options
        .env
        .extend(env.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())));
    let server = TestServer::start(options).await;
    let chat = server.create_chat("TodoAssistant", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    ws.until("chat.resume_boundary").await;
    ws.say("Buy milk").await;
    let text = ws
        .until_match("chat.text", |e| e["data"]["agent"] == "TodoAgent")
        .await;
    let content = text["data"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    (content, deltas_of(&ws, &text))
}

#[tokio::test]
async fn a_delta_interval_joins_a_paced_stream_s_later_tokens_and_keeps_its_first() {
    // Without the setting each read of the stream is a delta: the six words, 50 ms apart,
    // make more than the two below (unless the server stalled for most of the stream).
    let (content, deltas) = paced_answer(&[]).await;
    assert_eq!(content, "Done: the tool returned its result.");
    assert_eq!(deltas.concat(), content);
    assert!(deltas.len() > 2, "{deltas:?}");

    // With an interval longer than the whole stream: the first token at once, the rest as one
    // delta before the message.
    let (content, deltas) = paced_answer(&[("TESSERA_DELTA_INTERVAL_MS", "60000")]).await;
    assert_eq!(deltas.concat(), content);
    assert_eq!(
        deltas,
        ["Done:", " the tool returned its result."],
        "{deltas:?}"
    );
}

/// A copy of the shipped workflows in which the Generator starts at its first structured
/// agent: the stateless mock never says the interview's hidden `NEXT` token.
fn generator_from_context_agent() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_dir(&workspace_root().join("workflows"), dir.path());
    let path = dir.path().join("Generator/workflow.json");
    let mut workflow: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_default())
            .unwrap_or_else(|e| panic!("Generator/workflow.json: {e}"));
    workflow["initial_agent"] = json!("ContextAgent");
    std::fs::write(&path, workflow.to_string()).unwrap_or_else(|e| panic!("{e}"));
    dir
}

#[tokio::test]
async fn generator_structured_agents_get_schema_valid_output_and_reach_their_ui_tools() {
    let mock = MockLlm::start().await;
    let workflows = generator_from_context_agent();
    let server = TestServer::start(ServerOptions {
        workflows_dir: Some(workflows.path().to_path_buf()),
        ..mock.options()
    })
    .await;
    let chat = server.create_chat("Generator", "bob").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "bob").await;

    let expected = [
        ("ContextAgent", "action_plan", "ActionPlan"),
        ("APIKeyAgent", "request_api_key", "AgentAPIKeyInput"),
        (
            "DownloadAgent",
            "generate_and_download",
            "FileDownloadCenter",
        ),
    ];
    for (agent, tool, component) in expected {
        let ready = ws
            .until_match("chat.structured_output_ready", |e| {
                e["data"]["agent_name"] == agent
            })
            .await;
        let data = &ready["data"]["structured_data"];
        assert!(
            data["agent_message"].is_string(),
            "{agent}: schema-valid output from the mock: {data}"
        );
        if agent == "ContextAgent" {
            assert!(
                data["ActionPlan"]["workflow"]["phases"].is_array(),
                "{data}"
            );
        }
        let ui = ws.until_ui_call().await;
        assert_eq!(ui["data"]["tool_name"], tool);
        assert_eq!(ui["data"]["component_type"], component);
        ws.send(answer(&ui, json!({"status": "success"}))).await;
        let done = ws
            .until_match("chat.tool_response", |e| e["data"]["tool_name"] == tool)
            .await;
        assert_eq!(done["data"]["success"], true, "{done}");
    }
    let complete = ws.until("chat.run_complete").await;
    assert_eq!(complete["data"]["reason"], "terminate");
    assert!(
        ws.of("chat.error").is_empty(),
        "no errors: {:?}",
        ws.of("chat.error")
    );
}
