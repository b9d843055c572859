//! End-to-end chats against the real `tessera serve` binary over real HTTP and WebSocket,
//! with the offline demo model. Each test asserts the events the client sees.

use integration_tests::copy_dir;
use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::wsclient::WsClient;
use serde_json::{Value, json};

const CANARY: &str = "sk-CANARY-7c1d2e3f4a5b6c7d";

fn answer(corr: &str, status: &str, data: Value) -> Value {
    json!({"type": "chat.tool_response", "data": {"corr": corr, "status": status, "action": "submit", "data": data}})
}

fn corr_of(call: &Value) -> String {
    call["data"]["corr"].as_str().unwrap_or_default().to_owned()
}

/// Opens a Generator chat and walks it to the ActionPlan artifact.
async fn generator_at_action_plan(server: &TestServer, user: &str) -> (String, WsClient, Value) {
    let chat = server.create_chat("Generator", user).await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), user).await;
    let session = ws.until("chat.session").await;
    assert_eq!(session["data"]["workflow"], "Generator");
    assert_eq!(
        session["data"]["demo"], true,
        "the demo model is labelled as such"
    );
    let greeting = ws
        .until_match("chat.text", |e| e["data"]["agent"] == "InterviewAgent")
        .await;
    assert!(
        greeting["data"]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("automate")
    );
    ws.until("chat.input_request").await;
    ws.say("Automate my weekly social media posts").await;
    let token = ws
        .until_match("chat.text", |e| e["data"]["agent"] == "InterviewAgent")
        .await;
    assert_eq!(token["data"]["content"], "NEXT");
    assert_eq!(token["data"]["ui_hidden"], true);
    let handoff = ws.until("chat.handoff").await;
    assert_eq!(handoff["data"]["to"], "ContextAgent");
    ws.until("chat.structured_output_ready").await;
    let auto = ws.until("chat.tool_call").await;
    assert_eq!(auto["data"]["awaiting_response"], false);
    assert_eq!(auto["data"]["payload"]["interaction_type"], "auto_tool");
    let plan = ws.until_ui_call().await;
    assert_eq!(plan["data"]["component_type"], "ActionPlan");
    assert_eq!(plan["data"]["display"], "artifact");
    if ws.of("chat.ack").is_empty() {
        ws.until("chat.ack").await;
    }
    assert_eq!(ws.of("chat.ack")[0]["seq"], 0, "acks are connection-scoped");
    (chat, ws, plan)
}

#[tokio::test]
async fn generator_runs_end_to_end_through_every_ui_tool() {
    generator_end_to_end(TestServer::start(ServerOptions::default()).await).await;
}

/// The same on a server whose store is PostgreSQL: chats, events, the UI calls, the sealed
/// API key and the generated bundle (an artifact) all go through `PgStore`.
#[tokio::test]
async fn on_postgres_generator_runs_end_to_end_through_every_ui_tool() {
    let Some((options, _schema)) = ServerOptions::default()
        .on_postgres("generator_end_to_end")
        .await
    else {
        return;
    };
    generator_end_to_end(TestServer::start(options).await).await;
}

async fn generator_end_to_end(server: TestServer) {
    let (chat, mut ws, plan) = generator_at_action_plan(&server, "alice").await;
    assert!(plan["data"]["payload"]["ActionPlan"]["workflow"]["phases"].is_array());
    ws.send(answer(
        &corr_of(&plan),
        "success",
        json!({"approved": true}),
    ))
    .await;
    let done = ws
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "action_plan"
        })
        .await;
    assert_eq!(done["data"]["success"], true);

    let key = ws.until_ui_call().await;
    assert_eq!(key["data"]["component_type"], "AgentAPIKeyInput");
    assert_eq!(key["data"]["display"], "inline");
    assert_eq!(key["data"]["payload"]["service"], "openai");
    ws.send(answer(
        &corr_of(&key),
        "success",
        json!({"service": "openai", "apiKey": CANARY, "keyLength": CANARY.len()}),
    ))
    .await;
    let done = ws
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "request_api_key"
        })
        .await;
    assert_eq!(done["data"]["success"], true);

    let download = ws.until_ui_call().await;
    assert_eq!(download["data"]["component_type"], "FileDownloadCenter");
    let files = download["data"]["payload"]["files"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(files.len(), 1, "{download}");
    let path = files[0]["download_path"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let (status, bytes) = server.get_bytes(&path, "alice").await;
    assert_eq!(status, 200);
    assert!(bytes.starts_with(b"PK"), "the bundle is a zip");
    // The zip stores its files uncompressed: the approved plan is readable in its bytes.
    let raw = String::from_utf8_lossy(&bytes);
    for part in [
        "action_plan.json",
        "Phase 1: Research",
        "Phase 3: Review and schedule",
        "SchedulerAgent",
    ] {
        assert!(
            raw.contains(part),
            "the bundle holds the approved plan ({part})"
        );
    }
    assert!(
        !raw.contains("\"phases\": []"),
        "the bundle's phases are not empty"
    );
    let (status, _) = server.get_bytes(&path, "mallory").await;
    assert_eq!(status, 404, "only the chat's owner can download");
    ws.send(answer(
        &corr_of(&download),
        "success",
        json!({"downloaded": true}),
    ))
    .await;
    let complete = ws.until("chat.run_complete").await;
    assert_eq!(complete["data"]["reason"], "terminate");

    let everything = serde_json::to_string(&ws.events).unwrap_or_default();
    assert!(!everything.contains(CANARY), "the API key reached an event");
    let (_, transcript) = server
        .get(&format!("/api/v1/chats/{chat}/messages?limit=500"), "alice")
        .await;
    assert!(
        !transcript.to_string().contains(CANARY),
        "the API key reached the transcript"
    );
    let hidden: Vec<&Value> = transcript["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["ui_hidden"] == true).collect())
        .unwrap_or_default();
    assert!(
        hidden.iter().any(|m| m["content"] == "NEXT"),
        "the NEXT token is kept but flagged hidden"
    );
    let (_, snapshot) = server.get(&format!("/api/v1/chats/{chat}"), "alice").await;
    assert_eq!(snapshot["status"], "completed");
    assert_eq!(snapshot["context"]["interview_complete"], true);
}

#[tokio::test]
async fn reconnect_mid_ui_wait_replays_once_and_the_answer_is_accepted_once() {
    let server = TestServer::start(ServerOptions::default()).await;
    let (chat, ws, plan) = generator_at_action_plan(&server, "bob").await;
    let seen = ws.last_seq;
    ws.close().await;

    let mut again = WsClient::connect(&server.ws_url(&chat, 2), "bob").await;
    again.last_seq = 2;
    let session = again.until("chat.session").await;
    assert_eq!(session["data"]["last_seq"], seen);
    assert_eq!(
        session["data"]["pending_ui_calls"][0]["corr"],
        plan["data"]["corr"]
    );
    let boundary = again.until("chat.resume_boundary").await;
    assert_eq!(boundary["data"]["from_seq"], 2);
    assert_eq!(boundary["data"]["last_seq"], seen);
    assert_eq!(
        again.last_seq, seen,
        "every event after last_seq was replayed once, in order"
    );
    assert_eq!(
        boundary["data"]["pending_ui_calls"][0]["corr"],
        plan["data"]["corr"]
    );

    let corr = corr_of(&plan);
    again.send(answer(&corr, "success", json!({}))).await;
    let ack = again.until("chat.ack").await;
    assert_eq!(ack["data"]["kind"], "tool_response");
    // The tool's response comes from the agent's side and the ack from the socket's: either
    // may arrive first, so wait for the response before answering again.
    let plan_response = |e: &Value| e["data"]["tool_name"] == "action_plan";
    if !again
        .of("chat.tool_response")
        .into_iter()
        .any(plan_response)
    {
        again.until_match("chat.tool_response", plan_response).await;
    }
    again.send(answer(&corr, "success", json!({}))).await;
    let refused = again.until("chat.error").await;
    assert_eq!(refused["data"]["code"], "unknown_correlation");
    assert_eq!(
        again
            .of("chat.tool_response")
            .into_iter()
            .filter(|e| plan_response(e))
            .count(),
        1
    );
}

#[tokio::test]
async fn bad_frames_get_clear_errors_and_the_chat_stays_usable() {
    let server = TestServer::start(ServerOptions {
        env: vec![("TESSERA_MAX_FRAME_BYTES".into(), "2000".into())],
        ..Default::default()
    })
    .await;
    let (_chat, mut ws, plan) = generator_at_action_plan(&server, "carol").await;
    let cases: Vec<(String, &str)> = vec![
        ("this is not json".into(), "malformed_frame"),
        ("[1,2,3]".into(), "malformed_frame"),
        (json!({"type": "chat.explode"}).to_string(), "unknown_type"),
        (
            json!({"type": "chat.user_message", "data": {"content": 42}}).to_string(),
            "invalid_field",
        ),
        (
            json!({"type": "chat.user_message", "data": {"content": "x".repeat(3000)}}).to_string(),
            "frame_too_large",
        ),
        (
            answer("ui_forged0123456789", "success", json!({})).to_string(),
            "unknown_correlation",
        ),
        (
            answer(&corr_of(&plan), "maybe", json!({})).to_string(),
            "invalid_tool_response",
        ),
        (
            json!({"type": "chat.user_message", "data": {"content": "hello?"}}).to_string(),
            "not_accepting_input",
        ),
    ];
    for (frame, code) in cases {
        ws.send_text(frame).await;
        let error = ws.until("chat.error").await;
        assert_eq!(error["data"]["code"], code);
        assert_eq!(error["data"]["recoverable"], true);
    }
    // The pending call is untouched and still answerable.
    ws.send(answer(&corr_of(&plan), "success", json!({}))).await;
    let done = ws
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "action_plan"
        })
        .await;
    assert_eq!(done["data"]["success"], true);
}

#[tokio::test]
async fn ui_wait_times_out_and_the_agent_is_told() {
    // The per-tool timeout of the manifest is what users configure: set it on a copy.
    let workflows = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_dir(
        &integration_tests::workspace_root().join("workflows"),
        workflows.path(),
    );
    let tools_path = workflows.path().join("Generator/tools.json");
    let mut tools: Value =
        serde_json::from_str(&std::fs::read_to_string(&tools_path).unwrap_or_default())
            .unwrap_or_default();
    for tool in tools["tools"].as_array_mut().into_iter().flatten() {
        if tool["function"] == "action_plan" {
            tool["timeout_s"] = json!(0.3);
        }
    }
    std::fs::write(&tools_path, tools.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let options = ServerOptions {
        workflows_dir: Some(workflows.path().to_path_buf()),
        ..Default::default()
    };
    let server = TestServer::start(options).await;
    let (_chat, mut ws, _plan) = generator_at_action_plan(&server, "dave").await;
    let timed_out = ws
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "action_plan"
        })
        .await;
    assert_eq!(timed_out["data"]["success"], false);
    assert_eq!(timed_out["data"]["payload"]["code"], "ui_timeout");
    let waiting = ws.until("chat.input_request").await;
    assert_eq!(waiting["data"]["agent"], "ContextAgent");
}

#[tokio::test]
async fn cancel_during_a_ui_wait_ends_the_turn_and_keeps_the_chat() {
    let server = TestServer::start(ServerOptions::default()).await;
    let (chat, mut ws, plan) = generator_at_action_plan(&server, "erin").await;
    ws.send(json!({"type": "chat.cancel"})).await;
    let complete = ws.until("chat.run_complete").await;
    assert_eq!(complete["data"]["reason"], "cancelled");
    ws.until("chat.input_request").await;
    ws.send(answer(&corr_of(&plan), "success", json!({}))).await;
    let refused = ws.until("chat.error").await;
    assert_eq!(
        refused["data"]["code"], "unknown_correlation",
        "a cancelled call cannot be answered"
    );
    let (_, snapshot) = server.get(&format!("/api/v1/chats/{chat}"), "erin").await;
    assert_eq!(snapshot["status"], "awaiting_user");
    assert_eq!(snapshot["pending_ui_calls"], json!([]));
}

#[tokio::test]
async fn users_never_reach_each_others_chats() {
    let server = TestServer::start(ServerOptions::default()).await;
    let chat = server.create_chat("TodoAssistant", "alice").await;
    for path in [
        format!("/api/v1/chats/{chat}"),
        format!("/api/v1/chats/{chat}/messages"),
    ] {
        let (status, body) = server.get(&path, "bob").await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(body["code"], "not_found");
    }
    let (status, _) = server
        .post(
            &format!("/api/v1/chats/{chat}/input"),
            "bob",
            json!({"content": "hi"}),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = server
        .post(&format!("/api/v1/chats/{chat}/cancel"), "bob", json!({}))
        .await;
    assert_eq!(status, 404);
    assert!(
        WsClient::try_connect(&server.ws_url(&chat, 0), "bob")
            .await
            .is_err(),
        "the socket upgrade is refused"
    );
    let (_, mine) = server.get("/api/v1/chats", "bob").await;
    assert_eq!(mine["chats"], json!([]));
    let (_, theirs) = server.get("/api/v1/chats", "alice").await;
    assert_eq!(theirs["chats"][0]["chat_id"], chat.as_str());
}

#[tokio::test]
async fn todo_assistant_runs_its_tools_over_the_http_fallback_and_run_endpoint() {
    let server = TestServer::start(ServerOptions::default()).await;
    let (status, run) = server
        .post(
            "/api/v1/run",
            "alice",
            json!({"workflow": "TodoAssistant", "message": "Buy milk"}),
        )
        .await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["tools_used"], json!(["add_task"]));
    assert!(
        run["response"]
            .as_str()
            .unwrap_or_default()
            .contains("Buy milk")
    );
    assert!(run["usage"]["total_tokens"].as_u64().unwrap_or(0) > 0);

    let chat = server.create_chat("TodoAssistant", "alice").await;
    let (status, _) = server
        .post(
            &format!("/api/v1/chats/{chat}/input"),
            "alice",
            json!({"content": "Walk the dog"}),
        )
        .await;
    assert_eq!(status, 202);
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    let call = ws.until("chat.tool_call").await;
    assert_eq!(call["data"]["tool_name"], "add_task");
    assert_eq!(
        call["data"]["payload"]["tool_args"]["title"],
        "Walk the dog"
    );
    let result = ws.until("chat.tool_response").await;
    assert_eq!(result["data"]["success"], true);

    let (status, metrics) = server.get_bytes("/metrics", "alice").await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&metrics);
    assert!(text.contains("tessera_turns_total"), "{text}");
    assert!(!text.contains(&chat), "metrics carry no chat ids");
}

#[tokio::test]
async fn unlisted_workflows_are_not_offered_but_start_by_name() {
    let server = TestServer::start(ServerOptions::default()).await;
    let (status, body) = server.get("/api/v1/workflows", "alice").await;
    assert_eq!(status, 200, "{body}");
    let names: Vec<&str> = body["workflows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["Generator", "McpEverything", "TextToolkit", "TodoAssistant"]
    );
    // LoadTest says `"listed": false`; the load generator still starts it by name.
    server.create_chat("LoadTest", "alice").await;
}

/// Sends `text` and returns the agent's answer and the tools it ran, once the turn ends.
async fn exchange(ws: &mut WsClient, text: &str) -> (String, Vec<Value>) {
    let from = ws.events.len();
    ws.say(text).await;
    ws.until("chat.input_request").await;
    let turn = &ws.events[from..];
    let answer = turn
        .iter()
        .rev()
        .find(|e| e["type"] == "chat.text" && e["data"]["role"] != "user")
        .map(|e| e["data"]["content"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    let tools = turn
        .iter()
        .filter(|e| e["type"] == "chat.tool_response")
        .cloned()
        .collect();
    (answer, tools)
}

fn tool_names(tools: &[Value]) -> Vec<&str> {
    tools
        .iter()
        .map(|t| t["data"]["tool_name"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn the_demo_model_does_what_the_user_asks() {
    let server = TestServer::start(ServerOptions::default()).await;
    let chat = server.create_chat("TodoAssistant", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    ws.until("chat.input_request").await;
    for (said, title) in [
        ("add Buy milk", "Buy milk"),
        ("Walk the dog", "Walk the dog"),
    ] {
        let (answer, tools) = exchange(&mut ws, said).await;
        assert_eq!(tool_names(&tools), ["add_task"]);
        assert_eq!(answer, format!("Added \"{title}\" to your list."));
    }
    let (answer, tools) = exchange(&mut ws, "List my tasks").await;
    assert_eq!(tool_names(&tools), ["list_tasks"], "listing adds nothing");
    assert_eq!(answer, "You have 2 task(s): Buy milk, Walk the dog.");
    let (answer, tools) = exchange(&mut ws, "complete milk").await;
    assert_eq!(tool_names(&tools), ["list_tasks", "complete_task"]);
    assert_eq!(answer, "Task 'Buy milk' completed.");
    let (_, tools) = exchange(&mut ws, "show my tasks").await;
    let tasks = &tools[0]["data"]["payload"];
    let done: Vec<(&str, bool)> = tasks["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["title"].as_str().unwrap_or_default(),
                t["completed"] == true,
            )
        })
        .collect();
    assert_eq!(
        done,
        [("Buy milk", true), ("Walk the dog", false)],
        "{tasks}"
    );
    let (answer, _) = exchange(&mut ws, "complete taxes").await;
    assert_eq!(answer, "Task not found.");

    let chat = server.create_chat("TextToolkit", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    ws.until("chat.input_request").await;
    let (answer, tools) = exchange(&mut ws, "Count the words in the quick brown fox").await;
    assert_eq!(tool_names(&tools), ["word_count"]);
    assert_eq!(
        answer,
        "\"the quick brown fox\" has 4 word(s) and 19 character(s)."
    );
    let (answer, tools) = exchange(&mut ws, "echo hello there").await;
    assert_eq!(tool_names(&tools), ["echo"]);
    assert_eq!(answer, "Echo: hello there");
    let (answer, _) = exchange(&mut ws, "one two three").await;
    assert!(answer.starts_with("Your message has 3 word(s)"), "{answer}");
}

/// The kernel's thread names of process `pid` (`/proc/PID/task/*/comm`).
fn thread_names(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        panic!("the server's threads must be listed");
    };
    tasks
        .filter_map(|task| task.ok())
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .map(|name| name.trim_end().to_owned())
        .collect()
}

/// A CPU split by thread (`top -H`, `perf --sort comm`, the load generator's
/// `cpu_percent_by_thread`) tells the HTTP workers from the engine's arbiters: actix names
/// both `actix-rt|system` as the kernel shows it.
#[tokio::test]
async fn http_workers_and_engine_threads_carry_their_own_names() {
    let server = TestServer::start(ServerOptions::default()).await;
    // Once a chat has run, every worker and arbiter has started and named itself.
    let chat = server.create_chat("TodoAssistant", "u1").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "u1").await;
    ws.until("chat.input_request").await;
    let Some(pid) = server.pid() else {
        panic!("the server runs");
    };
    let names = thread_names(pid);
    assert!(
        names.iter().any(|n| n == "tessera-http"),
        "an HTTP worker: {names:?}"
    );
    assert!(
        names.iter().any(|n| n == "tessera-engine"),
        "an engine arbiter: {names:?}"
    );
    assert!(
        !names.iter().any(|n| n == "actix-rt|system"),
        "no thread left under actix's name: {names:?}"
    );
}
