//! TodoAssistant end to end against a mock OpenAI-compatible server over real HTTP: two users
//! of one tenant add and list tasks through the model's tool calls and never see each other's.

use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::wsclient::WsClient;
use serde_json::{Value, json};
use wiremock::matchers::{body_string_contains, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn completion(message: Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "cmpl-1", "object": "chat.completion", "model": "mock-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    }))
}

fn tool_call(name: &str, args: Value) -> ResponseTemplate {
    completion(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": format!("call_{name}"), "type": "function", "function": {"name": name, "arguments": args.to_string()}}
    ]}))
}

/// Answers by the request's content: after a tool result, a final text; else the tool the
/// user's message names.
async fn mock_llm() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_string_contains("\"role\":\"tool\""))
        .respond_with(completion(json!({"role": "assistant", "content": "Done."})))
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_string_contains("please add"))
        .respond_with(tool_call("add_task", json!({"title": "CANARY-ALICE-42"})))
        .with_priority(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_string_contains("please list"))
        .respond_with(tool_call("list_tasks", json!({})))
        .with_priority(2)
        .mount(&server)
        .await;
    server
}

async fn turn(server: &TestServer, user: &str, message: &str) -> (Value, Vec<Value>) {
    let chat = server.create_chat("TodoAssistant", user).await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), user).await;
    let session = ws.until("chat.session").await;
    assert_eq!(
        session["data"]["demo"], false,
        "a configured endpoint is not the demo model"
    );
    ws.until("chat.input_request").await;
    ws.say(message).await;
    let result = ws.until("chat.tool_response").await;
    let answer = ws
        .until_match("chat.text", |e| e["data"]["role"] == "assistant")
        .await;
    assert_eq!(answer["data"]["content"], "Done.");
    let events = ws.events.clone();
    (result, events)
}

fn with_llm(llm: &MockServer) -> ServerOptions {
    ServerOptions {
        env: vec![
            ("OPENAI_BASE_URL".into(), format!("{}/v1", llm.uri())),
            ("OPENAI_API_KEY".into(), "sk-test-not-a-secret".into()),
            ("TESSERA_STREAM".into(), "false".into()),
        ],
        ..Default::default()
    }
}

#[tokio::test]
async fn two_users_never_see_each_others_tasks() {
    let llm = mock_llm().await;
    two_users(&llm, TestServer::start(with_llm(&llm)).await).await;
}

/// The same with the tasks (and chats, and tool claims) in PostgreSQL.
#[tokio::test]
async fn on_postgres_two_users_never_see_each_others_tasks() {
    let llm = mock_llm().await;
    let Some((options, _schema)) = with_llm(&llm).on_postgres("two_users").await else {
        return;
    };
    two_users(&llm, TestServer::start(options).await).await;
}

async fn two_users(llm: &MockServer, server: TestServer) {
    let (added, _) = turn(&server, "alice", "please add milk").await;
    assert_eq!(added["data"]["tool_name"], "add_task");
    assert_eq!(added["data"]["success"], true);

    let (listed, bob_events) = turn(&server, "bob", "please list my tasks").await;
    assert_eq!(listed["data"]["tool_name"], "list_tasks");
    assert_eq!(listed["data"]["success"], true);
    let bob_saw = serde_json::to_string(&bob_events).unwrap_or_default();
    assert!(
        !bob_saw.contains("CANARY-ALICE-42"),
        "bob's list shows alice's task"
    );

    let (mine, _) = turn(&server, "alice", "please list my tasks").await;
    assert!(
        mine["data"]["payload"]
            .to_string()
            .contains("CANARY-ALICE-42"),
        "alice sees her own task: {mine}"
    );

    // The model was given only the agent's tools, and the tool result, never another user's data.
    let requests = llm.received_requests().await.unwrap_or_default();
    assert!(requests.len() >= 6);
    for request in &requests {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
        let tools: Vec<&str> = body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        assert_eq!(
            tools,
            vec!["add_task", "list_tasks", "complete_task", "delete_task"]
        );
    }
}
