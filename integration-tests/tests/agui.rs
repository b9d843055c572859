//! The AG-UI endpoint driven by the official TypeScript client (`@ag-ui/client`, whose event
//! verifier rejects streams out of protocol order) over real HTTP with the machine's Node,
//! against the real `tessera serve` binary. Skipped with a message when Node or npm is
//! missing, except under `CI=true`, where that fails.

use std::time::Duration;

use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::workspace_root;
use serde_json::{Value, json};
use tokio::process::Command;

/// Whether Node and the pinned client packages are ready (installing them if needed).
async fn node_client_ready() -> bool {
    let why = match Command::new("node").arg("--version").output().await {
        Ok(out) if out.status.success() => {
            let script = workspace_root().join("scripts/agui-client.sh");
            match Command::new("bash").arg(script).status().await {
                Ok(status) if status.success() => return true,
                other => format!("scripts/agui-client.sh failed: {other:?}"),
            }
        }
        other => format!("node is not available: {other:?}"),
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("the AG-UI client tests cannot run under CI=true: {why}");
    }
    eprintln!("SKIPPED: AG-UI client tests: {why}");
    false
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The `TOOL_CALL_START` of `tool` in a run's events.
fn tool_call_id(events: &[Value], tool: &str) -> String {
    of_type(events, "TOOL_CALL_START")
        .into_iter()
        .find(|e| e["toolCallName"] == tool)
        .and_then(|e| e["toolCallId"].as_str())
        .unwrap_or_else(|| panic!("no TOOL_CALL_START of {tool}: {events:?}"))
        .to_owned()
}

fn finished(events: &[Value]) -> &Value {
    let last = events.last().unwrap_or_else(|| panic!("no events"));
    assert_eq!(last["type"], "RUN_FINISHED", "{events:?}");
    last
}

#[tokio::test]
async fn the_official_client_round_trips_ui_tools_as_interrupts_and_resumes() {
    if !node_client_ready().await {
        return;
    }
    let server = TestServer::start(ServerOptions::default()).await;
    let answer = json!({"status": "success", "action": "submit", "data": {"approved": true}});
    let script = workspace_root().join("integration-tests/agui-client/round_trip.mjs");
    let run = Command::new("node")
        .arg(script)
        .args([
            server.base.as_str(),
            "Generator",
            "alice",
            "Automate my weekly social media posts",
            &answer.to_string(),
        ])
        .current_dir(workspace_root().join("integration-tests/agui-client"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .unwrap_or_else(|_| panic!("the AG-UI client did not finish in 120 s"))
        .unwrap_or_else(|e| panic!("node: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the client failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("client output is not JSON ({e}): {stderr}"));
    let runs = report["runs"].as_array().cloned().unwrap_or_default();
    assert_eq!(runs.len(), 3, "{report}");
    let events = |i: usize| runs[i]["events"].as_array().cloned().unwrap_or_default();

    // Run 1: the user's message, the agents' answers, then the ActionPlan UI tool as a
    // frontend tool call that ends the run with an interrupt.
    let first = events(0);
    assert_eq!(first[0]["type"], "RUN_STARTED");
    assert!(!of_type(&first, "STATE_SNAPSHOT").is_empty(), "{first:?}");
    assert!(
        !of_type(&first, "TEXT_MESSAGE_CONTENT").is_empty(),
        "the agents' messages stream as text: {first:?}"
    );
    let plan = tool_call_id(&first, "action_plan");
    let outcome = &finished(&first)["outcome"];
    assert_eq!(outcome["type"], "interrupt", "{outcome}");
    assert_eq!(outcome["interrupts"][0]["id"], plan.as_str());
    assert_eq!(outcome["interrupts"][0]["toolCallId"], plan.as_str());
    assert_eq!(
        outcome["interrupts"][0]["metadata"]["componentType"],
        "ActionPlan"
    );
    let chat_id = finished(&first)["metadata"]["tessera"]["chatId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let first_seq = finished(&first)["metadata"]["tessera"]["lastSeq"]
        .as_u64()
        .unwrap_or_default();
    assert!(first_seq > 0, "the run reports the chat's seq");

    // Run 2 resumes the interrupt with the component's answer: the chat goes on to the next
    // UI tool, which interrupts again.
    let second = events(1);
    let key = tool_call_id(&second, "request_api_key");
    assert_ne!(key, plan);
    let outcome = &finished(&second)["outcome"];
    assert_eq!(outcome["type"], "interrupt", "{outcome}");
    assert_eq!(outcome["interrupts"][0]["id"], key.as_str());
    assert!(
        finished(&second)["metadata"]["tessera"]["lastSeq"]
            .as_u64()
            .unwrap_or_default()
            > first_seq
    );

    // The chat behind the thread is an ordinary chat of alice's: the answer reached it once
    // and the next UI call is pending.
    let (status, chat) = server
        .get(&format!("/api/v1/chats/{chat_id}"), "alice")
        .await;
    assert_eq!(status, 200, "{chat}");
    assert_eq!(chat["pending_ui_calls"][0]["corr"], key.as_str(), "{chat}");
    let (status, _) = server.get(&format!("/api/v1/chats/{chat_id}"), "bob").await;
    assert_eq!(status, 404, "another user cannot see the thread's chat");

    // Run 3: a fresh client on the thread with nothing new is told the same interrupt, and
    // nothing is sent to the chat twice.
    let third = events(2);
    assert!(
        of_type(&third, "TEXT_MESSAGE_START").is_empty(),
        "{third:?}"
    );
    assert_eq!(tool_call_id(&third, "request_api_key"), key);
    let outcome = &finished(&third)["outcome"];
    assert_eq!(outcome["interrupts"][0]["id"], key.as_str(), "{outcome}");
    assert_eq!(runs[2]["interrupts"][0]["id"], key.as_str());
}

/// Reads one run's SSE body with a plain HTTP client: (status, events, SSE ids).
async fn raw_run(server: &TestServer, user: &str, body: Value) -> (u16, Vec<Value>, Vec<u64>) {
    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/agui/Generator", server.base))
        .header("x-user-id", user)
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("request: {e}"));
    let status = response.status().as_u16();
    let text = tokio::time::timeout(Duration::from_secs(60), response.text())
        .await
        .unwrap_or_else(|_| panic!("the run did not end in 60 s"))
        .unwrap_or_default();
    let mut events = Vec::new();
    let mut ids = Vec::new();
    for line in text.lines() {
        if let Some(data) = line.strip_prefix("data: ") {
            events.push(serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}")));
        } else if let Some(id) = line.strip_prefix("id: ") {
            ids.push(id.parse().unwrap_or_else(|e| panic!("{e}: {id}")));
        }
    }
    if status != 200 {
        events.push(serde_json::from_str(&text).unwrap_or(Value::String(text)));
    }
    (status, events, ids)
}

#[tokio::test]
async fn threads_are_per_user_and_a_first_run_without_a_message_streams_the_greeting() {
    let server = TestServer::start(ServerOptions::default()).await;
    let input = json!({"threadId": "shared-thread", "runId": "r1", "messages": []});
    let (status, alice, _) = raw_run(&server, "alice", input.clone()).await;
    assert_eq!(status, 200, "{alice:?}");
    assert_eq!(alice[0]["type"], "RUN_STARTED");
    let greeting: String = of_type(&alice, "TEXT_MESSAGE_CONTENT")
        .iter()
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert!(greeting.contains("automate"), "{alice:?}");
    assert_eq!(finished(&alice)["outcome"]["type"], "success");
    let greeted_seq = finished(&alice)["metadata"]["tessera"]["lastSeq"]
        .as_u64()
        .unwrap_or_default();

    let said = json!({"threadId": "shared-thread", "runId": "r2", "messages": [
        {"id": "m1", "role": "user", "content": "Automate my weekly social media posts"}
    ]});
    let (status, next, ids) = raw_run(&server, "alice", said).await;
    assert_eq!(status, 200, "{next:?}");
    assert_eq!(finished(&next)["outcome"]["type"], "interrupt");
    assert!(
        !ids.is_empty() && ids.windows(2).all(|w| w[0] <= w[1]) && ids[0] > greeted_seq,
        "SSE ids are the chat's seqs, in order, after the previous run's: {ids:?}"
    );

    let (_, bob, _) = raw_run(&server, "bob", input).await;
    let chat = |events: &[Value]| finished(events)["metadata"]["tessera"]["chatId"].clone();
    assert_ne!(
        chat(&alice),
        chat(&bob),
        "one thread id, two users, two chats"
    );

    let (status, body, _) = raw_run(
        &server,
        "alice",
        json!({"threadId": "", "runId": "r2", "messages": []}),
    )
    .await;
    assert_eq!(status, 400, "{body:?}");
    let (status, body, _) = raw_run(
        &server,
        "alice",
        json!({"threadId": "t", "runId": "r3", "messages": [], "resume": [{"interruptId": "ui_x", "status": "maybe"}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body.last().map(|e| e["type"].clone()),
        Some(json!("RUN_ERROR")),
        "an invalid resume ends the run with RUN_ERROR: {body:?}"
    );
}
