//! Several real `tessera serve` nodes as one service: one PostgreSQL schema (chats and leases)
//! and one NATS server (routing), each test under its own subject prefix. Needs
//! `TESSERA_TEST_DATABASE_URL` and `TESSERA_TEST_NATS_URL`; without them the tests say they are
//! skipped, and under `CI=true` they fail instead.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::cluster::{
    Cluster, LEASE_TTL_S, ONE_CLUSTER_AT_A_TIME, assert_view_matches_store, stored_events,
    wait_until,
};
use integration_tests::mock_llm::MockLlm;
use integration_tests::wsclient::WsClient;
use serde_json::{Value, json};
use tessera_store::ChatStore;

/// Lease TTL of the 300-chat test: long enough that a node starved of CPU on a loaded CI
/// machine still renews in time (a lease lost to a slow renewal moves a running chat early).
const BUSY_LEASE_TTL_S: u64 = 6;

fn ws_url(base: &str, chat_id: &str, last_seq: u64) -> String {
    format!(
        "{}/api/v1/chats/{chat_id}/ws?last_seq={last_seq}",
        base.replacen("http", "ws", 1)
    )
}

fn answer(corr: &str) -> Value {
    json!({"type": "chat.tool_response", "data": {"corr": corr, "status": "success", "action": "submit",
        "data": {"approved": true, "service": "openai", "apiKey": "sk-cluster-test", "keyLength": 15, "downloaded": true}}})
}

fn corr_of(call: &Value) -> String {
    call["data"]["corr"].as_str().unwrap_or_default().to_owned()
}

/// What one client saw of one chat, over every socket it opened.
#[derive(Debug, Default)]
struct ChatRun {
    /// Every logged event the client got (seq > 0), in the order it got them, over all its
    /// sockets.
    seen: Vec<(u64, Value)>,
    reconnects: u32,
    completed: bool,
    /// The last events' types (for the failure message).
    tail: Vec<String>,
}

/// The workflow of the kill test: `EchoAgent` calls the backend tool `echo` (an HTTP tool at
/// `tool_url`, the side-effect server) and answers; then `FormAgent`'s structured output
/// opens a UI call (`confirm_form`); its answer ends the chat. The mock LLM answers each
/// request from the request alone (see `tessera-loadgen mock-llm`).
fn write_failover_workflow(dir: &std::path::Path, tool_url: &str) {
    let files = [
        (
            "workflow.json",
            json!({"name": "Failover", "description": "A backend tool, then a UI round trip.",
                   "initial_agent": "EchoAgent", "max_turns": 40,
                   "human_in_the_loop": true, "startup_mode": "UserDriven"}),
        ),
        (
            "agents.json",
            json!({"agents": {
                "EchoAgent": {"system_message": "Call echo once with the message, then answer.",
                              "max_consecutive_auto_reply": 4},
                "FormAgent": {"system_message": "Answer with the JSON object only.",
                              "max_consecutive_auto_reply": 4, "auto_tool_mode": true,
                              "structured_outputs_required": true}}}),
        ),
        (
            "structured_outputs.json",
            json!({"structured_outputs": {
                "models": {"FormRequest": {"type": "model", "fields": {
                    "agent_message": {"type": "str", "description": "Shown with the form"},
                    "count": {"type": "int", "description": "How many"}}}},
                "registry": {"FormAgent": "FormRequest"}}}),
        ),
        (
            "handoffs.json",
            json!({"handoff_rules": [
                {"source_agent": "EchoAgent", "target_agent": "FormAgent",
                 "handoff_type": "after_work"},
                {"source_agent": "FormAgent", "target_agent": "terminate",
                 "handoff_type": "after_work"}]}),
        ),
        (
            "tools.json",
            json!({"tools": [
                {"agent": "EchoAgent", "function": "echo", "description": "Echo a message",
                 "tool_type": "Agent_Tool", "ui": null,
                 "impl": {"kind": "http", "url": tool_url},
                 "parameters": {"type": "object",
                     "properties": {"message": {"type": "string", "minLength": 1}},
                     "required": ["message"]},
                 "timeout_s": 20},
                {"agent": "FormAgent", "function": "confirm_form",
                 "description": "Show a small form and wait for the answer",
                 "tool_type": "UI_Tool", "ui": {"component": "FailoverForm", "mode": "inline"},
                 "timeout_s": 300}]}),
        ),
    ];
    write_workflow(dir, "Failover", &files);
}

/// The side-effect server behind the `echo` tool: a real HTTP server that keeps every request
/// it receives (its side-effect log: chat and invocation key, logged on arrival) and answers
/// after a delay that differs per chat (0.1 to 1.5 s), so that at any moment chats are in
/// different steps of their turns.
struct SlowEcho;

impl wiremock::Respond for SlowEcho {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let chat = body["context"]["chat_id"].as_str().unwrap_or_default();
        let spread = chat
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        wiremock::ResponseTemplate::new(200)
            .set_body_json(json!({"status": "success", "echoed": body["args"]["message"]}))
            .set_delay(Duration::from_millis(100 + spread % 1400))
    }
}

/// One entry of the side-effect log: (chat, invocation key).
type SideEffect = (String, String);

/// The side-effect log: every `echo` request the server received.
async fn side_effects(server: &wiremock::MockServer) -> Vec<SideEffect> {
    let requests = server.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .map(|request| {
            let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
            let chat = body["context"]["chat_id"].as_str().unwrap_or_default();
            // `Idempotency-Key` is the invocation key and a hash of the arguments.
            let key = request
                .headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .and_then(|k| k.rsplit_once(':'))
                .map(|(invocation, _)| invocation.to_owned())
                .unwrap_or_default();
            (chat.to_owned(), key)
        })
        .collect()
}

/// The store's tool records: (chat, invocation key) → status (`started` or `completed`).
async fn tool_records(url: &str) -> BTreeMap<SideEffect, String> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot read the tool records: {e}"));
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT chat_id, invocation_key, status FROM tool_invocations")
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("cannot read the tool records: {e}"));
    rows.into_iter()
        .map(|(chat, key, status)| ((chat, key), status))
        .collect()
}

const SAY: &str = "please echo this";

fn form_answer(corr: &str) -> Value {
    json!({"type": "chat.tool_response", "data": {"corr": corr, "status": "success",
        "action": "submit", "data": {"approved": true}}})
}

/// Drives a Failover chat to its end like a browser: says something whenever the chat asks
/// for input, answers every UI call, and on a closed socket reconnects to another node and
/// resumes by seq. Acknowledgements are durable (in a cluster the owner acks only once the
/// input or answer is in the store), so what was acked is never sent again; what was not
/// acked goes again on the next socket (the owner refuses a duplicate). `first` picks the
/// first node; reconnects go round the others. The first message waits `start_after`
/// (spreading the chats over the turn's steps).
async fn drive_failover_chat(
    bases: Arc<Vec<String>>,
    chat: String,
    user: String,
    first: usize,
    start_after: Duration,
) -> ChatRun {
    let mut run = ChatRun::default();
    let mut last_seq = 0;
    // Input the chat asked for and the owner has not acked yet.
    let mut input_due = false;
    // UI calls announced or listed as pending, and those whose answer was acked.
    let mut calls: Vec<String> = Vec::new();
    let mut acked: HashSet<String> = HashSet::new();
    let mut started = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut attempt = first;
    while Instant::now() < deadline {
        let base = &bases[attempt % bases.len()];
        attempt += 1;
        let Ok(mut ws) = WsClient::try_connect(&ws_url(base, &chat, last_seq), &user).await else {
            run.reconnects += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        ws.last_seq = last_seq;
        let mut alive = true;
        if input_due {
            alive &= ws
                .try_send(json!({"type": "chat.user_message", "data": {"content": SAY}}))
                .await;
        }
        for corr in calls.iter().filter(|c| !acked.contains(*c)) {
            alive &= ws.try_send(form_answer(corr)).await;
        }
        while alive {
            let Some(event) = ws.next().await else {
                break;
            };
            let seq = event["seq"].as_u64().unwrap_or(0);
            if seq > 0 {
                run.seen.push((seq, event.clone()));
                last_seq = seq;
            }
            run.tail
                .push(format!("{}#{seq}", event["type"].as_str().unwrap_or("?")));
            if run.tail.len() > 10 {
                run.tail.remove(0);
            }
            match event["type"].as_str().unwrap_or_default() {
                "chat.input_request" => {
                    if !started {
                        tokio::time::sleep(start_after).await;
                        started = true;
                    }
                    input_due = true;
                    alive = ws
                        .try_send(json!({"type": "chat.user_message", "data": {"content": SAY}}))
                        .await;
                }
                "chat.tool_call" if event["data"]["awaiting_response"] == true => {
                    let corr = corr_of(&event);
                    if !calls.contains(&corr) {
                        calls.push(corr.clone());
                    }
                    alive = ws.try_send(form_answer(&corr)).await;
                }
                // Pending calls, also one announced by a node that died before this client
                // got its answer acked: answered (again).
                "chat.resume_boundary" => {
                    let pending = event["data"]["pending_ui_calls"].as_array().cloned();
                    for call in pending.unwrap_or_default() {
                        let corr = call["corr"].as_str().unwrap_or_default().to_owned();
                        if !calls.contains(&corr) {
                            calls.push(corr.clone());
                        }
                        acked.remove(&corr);
                        alive &= ws.try_send(form_answer(&corr)).await;
                    }
                }
                "chat.ack" if event["data"]["kind"] == "user_message" => input_due = false,
                "chat.ack" if event["data"]["kind"] == "tool_response" => {
                    if let Some(corr) = event["data"]["client_msg_id"].as_str() {
                        acked.insert(corr.to_owned());
                    }
                }
                // The owner has input already (a resend of input it had taken).
                "chat.error" if event["data"]["code"] == "not_accepting_input" => {
                    input_due = false;
                }
                // A command whose node died before answering: reconnect and send it again.
                "chat.error" if seq == 0 && event["data"]["code"] == "internal" => break,
                "chat.run_complete" if event["data"]["reason"] == "terminate" => {
                    run.completed = true;
                    ws.close().await;
                    return run;
                }
                _ => {}
            }
        }
        run.reconnects += 1;
    }
    run
}

/// A socket's logged events (seq > 0), as `(seq, event)`.
fn logged(events: &[Value]) -> Vec<(u64, &Value)> {
    events
        .iter()
        .filter_map(|e| Some((e["seq"].as_u64().filter(|s| *s > 0)?, e)))
        .collect()
}

/// How a chat's tools ran, from the store's log and tool records and the side-effect log.
#[derive(Debug, Default)]
struct ToolTally {
    /// `echo` calls that ran to completion (stored result, one side effect each).
    completed: usize,
    /// `echo` calls left `started` by the killed node and reported interrupted.
    interrupted: usize,
    /// UI round trips answered.
    ui_answers: usize,
}

/// Every tool ran exactly once: each `echo` invocation's side effect at most once; a
/// completed one exactly once, with exactly one successful `chat.tool_response` in the log
/// and every call announced once;
/// one left `started` (interrupted by the kill) never answered in the log; no side effect
/// without a durable claim; each UI call's answer stored once.
fn assert_each_tool_ran_once(
    chat: &str,
    stored: &[tessera_store::StoredEvent],
    records: &BTreeMap<SideEffect, String>,
    effects: &BTreeMap<SideEffect, usize>,
) -> ToolTally {
    let mut responses: BTreeMap<(String, String), u32> = BTreeMap::new();
    for event in stored
        .iter()
        .filter(|e| e.event_type == "chat.tool_response")
    {
        let value: Value = serde_json::from_str(&event.json).unwrap_or(Value::Null);
        assert_eq!(
            value["data"]["success"], true,
            "chat {chat}: a tool failed: {value}"
        );
        let tool = value["data"]["tool_name"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        let corr = value["data"]["corr"].as_str().unwrap_or("?").to_owned();
        *responses.entry((tool, corr)).or_default() += 1;
    }
    for ((tool, corr), count) in &responses {
        assert_eq!(
            *count, 1,
            "chat {chat}: {tool} {corr} answered {count} times in the log"
        );
    }
    // A call is announced once too: a turn re-run after the kill does not announce again a
    // call whose `chat.tool_call` the log already holds.
    let mut calls: BTreeMap<String, u32> = BTreeMap::new();
    for event in stored.iter().filter(|e| e.event_type == "chat.tool_call") {
        let value: Value = serde_json::from_str(&event.json).unwrap_or(Value::Null);
        let corr = value["data"]["corr"].as_str().unwrap_or("?").to_owned();
        *calls.entry(corr).or_default() += 1;
    }
    for (corr, count) in &calls {
        assert_eq!(
            *count, 1,
            "chat {chat}: call {corr} announced {count} times in the log"
        );
    }
    let mut tally = ToolTally::default();
    for ((record_chat, key), status) in records.range((chat.to_owned(), String::new())..) {
        if record_chat != chat {
            break;
        }
        let ran = effects
            .get(&(chat.to_owned(), key.clone()))
            .copied()
            .unwrap_or(0);
        let answered = responses.contains_key(&("echo".to_owned(), key.clone()));
        let is_echo = key.contains(":s");
        match (is_echo, status.as_str()) {
            (true, "completed") => {
                assert_eq!(
                    ran, 1,
                    "chat {chat}: echo {key} completed, side effects: {ran}"
                );
                assert!(
                    answered,
                    "chat {chat}: echo {key} completed but not in the log"
                );
                tally.completed += 1;
            }
            (true, _) => {
                assert!(
                    ran <= 1,
                    "chat {chat}: echo {key} interrupted, side effects: {ran}"
                );
                assert!(
                    !answered,
                    "chat {chat}: echo {key} interrupted yet answered"
                );
                tally.interrupted += 1;
            }
            (false, "completed") => {
                let answers = responses
                    .get(&("confirm_form".to_owned(), key.clone()))
                    .copied()
                    .unwrap_or(0);
                assert_eq!(
                    answers, 1,
                    "chat {chat}: UI call of {key} answered {answers} times"
                );
                tally.ui_answers += 1;
            }
            (false, _) => {}
        }
    }
    for ((effect_chat, key), count) in effects.range((chat.to_owned(), String::new())..) {
        if effect_chat != chat {
            break;
        }
        assert!(
            records.contains_key(&(chat.to_owned(), key.clone())),
            "chat {chat}: echo {key} ran {count} times without a durable claim"
        );
    }
    assert!(
        tally.completed + tally.interrupted >= 1,
        "chat {chat}: echo never ran"
    );
    assert!(tally.ui_answers >= 1, "chat {chat}: no UI answer stored");
    tally
}

#[tokio::test]
async fn a_chat_created_on_one_node_is_driven_through_another() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    // The socket on B is served over NATS, not handed the chat.
    let remote = integration_tests::server::ServerOptions {
        env: vec![("TESSERA_HAND_OVER_SOCKETS".into(), "false".into())],
        ..Default::default()
    };
    let Some(cluster) = Cluster::start_with("cluster_two_nodes", 2, LEASE_TTL_S, remote).await
    else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));
    let chat = a.create_chat("Generator", "alice").await;

    let mut ws = WsClient::connect(&b.ws_url(&chat, 0), "alice").await;
    ws.until("chat.input_request").await;
    ws.say("Automate my weekly social media posts").await;
    let ack = ws.until("chat.ack").await;
    assert_eq!(
        ack["data"]["kind"], "user_message",
        "input forwarded to the owner"
    );
    let plan = ws.until_ui_call().await;
    assert_eq!(plan["data"]["component_type"], "ActionPlan");
    ws.send(answer(&corr_of(&plan))).await;
    let done = ws
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "action_plan"
        })
        .await;
    assert_eq!(
        done["data"]["success"], true,
        "the UI round trip went through node B"
    );
    let key = ws.until_ui_call().await;
    assert_eq!(key["data"]["component_type"], "AgentAPIKeyInput");

    // Node B's view is the owner's: every event once, in order, the stored ones as the store
    // holds them (the deltas are live only). A client of the owner that joins now sees the
    // same, but for the deltas of messages now final.
    let store = cluster.store().await;
    let seen = ws.last_seq;
    let stored = stored_events(&store, &chat, seen, "the store to hold what B relayed").await;
    let relayed: Vec<(u64, &Value)> = logged(&ws.events);
    assert_view_matches_store(&chat, 0, &relayed, &stored);
    let mut on_a = WsClient::connect(&a.ws_url(&chat, 0), "alice").await;
    on_a.until("chat.resume_boundary").await;
    let owners = logged(&on_a.events);
    assert!(
        owners.iter().all(|event| relayed.contains(event)),
        "B saw every event the owner replays, as the owner replays it"
    );

    // Another user cannot reach the chat through either node.
    assert!(
        WsClient::try_connect(&b.ws_url(&chat, 0), "mallory")
            .await
            .is_err()
    );
}

/// An idle chat leaves its owner's memory with its lease parked; the node its user's socket
/// reaches next claims it and serves the socket as the chat's own node, from where the user
/// left off.
#[tokio::test]
async fn a_chat_parked_idle_is_claimed_by_the_node_its_socket_reaches_next() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let idle = integration_tests::server::ServerOptions {
        env: vec![("TESSERA_IDLE_CHAT_EVICT_S".into(), "1".into())],
        ..Default::default()
    };
    let Some(cluster) = Cluster::start_with("cluster_parked_ws", 2, LEASE_TTL_S, idle).await else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));
    let chat = a.create_chat("Generator", "alice").await;
    let mut on_a = WsClient::connect(&a.ws_url(&chat, 0), "alice").await;
    on_a.until("chat.input_request").await;
    let seen = on_a.last_seq;
    on_a.close().await;

    // Nobody connected: after a second idle the chat leaves A, its lease parked.
    wait_until(
        "A parks the idle chat",
        Duration::from_secs(30),
        async || a.metric("tessera_cluster_leases_parked_total").await == 1,
    )
    .await;
    assert_eq!(a.metric("tessera_chats_in_memory").await, 0);

    // The user comes back through B: B claims the chat and its socket is a local one there
    // (the seq checks of `WsClient` hold across the move).
    let mut on_b = WsClient::connect(&b.ws_url(&chat, seen), "alice").await;
    on_b.until("chat.resume_boundary").await;
    assert_eq!(b.metric("tessera_cluster_owned_chats").await, 1);
    on_b.say("Automate my weekly social media posts").await;
    let plan = on_b.until_ui_call().await;
    assert_eq!(plan["data"]["component_type"], "ActionPlan");
    on_b.send(answer(&corr_of(&plan))).await;
    let done = on_b
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "action_plan"
        })
        .await;
    assert_eq!(done["data"]["success"], true);
    assert!(on_b.last_seq > seen);
    // Served where its socket is: nothing crossed NATS for it.
    assert_eq!(a.metric("tessera_cluster_owned_chats").await, 0);
    assert_eq!(
        b.metric("tessera_cluster_live_events_published_total")
            .await,
        0
    );
}

/// No store holds a streamed delta (each seq is marked taken instead): a client that joins
/// through a node that does not own the chat while a message streams gets the deltas streamed
/// so far from the owner's memory, then the rest live, as a client of the owner would.
#[tokio::test]
async fn a_client_joining_another_node_in_mid_stream_gets_the_deltas_so_far_from_the_owner() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    // 60 words, one every 50 ms: three seconds of stream to join in.
    let mock = MockLlm::start_paced_answer(50, 60).await;
    let Some(cluster) =
        Cluster::start_with("cluster_mid_stream_join", 2, LEASE_TTL_S, mock.options()).await
    else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));
    let chat = a.create_chat("TodoAssistant", "alice").await;
    let mut on_a = WsClient::connect(&a.ws_url(&chat, 0), "alice").await;
    on_a.until("chat.resume_boundary").await;
    on_a.say("Buy milk").await;
    let first = on_a.until("chat.text_delta").await;
    let message = first["data"]["message_id"].clone();
    for _ in 0..3 {
        on_a.until("chat.text_delta").await;
    }

    let mut on_b = WsClient::connect(&b.ws_url(&chat, 0), "alice").await;
    on_b.until("chat.resume_boundary").await;
    let replayed = on_b
        .of("chat.text_delta")
        .iter()
        .filter(|d| d["data"]["message_id"] == message)
        .count();
    assert!(
        replayed >= 4,
        "B's replay has the deltas streamed before it joined ({replayed})"
    );
    let text = on_b
        .until_match("chat.text", |e| e["data"]["message_id"] == message)
        .await;
    on_a.until_match("chat.text", |e| e["data"]["message_id"] == message)
        .await;
    let deltas: String = on_b
        .of("chat.text_delta")
        .iter()
        .filter(|d| d["data"]["message_id"] == message)
        .filter_map(|d| d["data"]["delta"].as_str())
        .collect();
    assert_eq!(
        deltas.split_whitespace().collect::<Vec<_>>(),
        text["data"]["content"]
            .as_str()
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>(),
        "B got every delta of the message"
    );
    // From the message's first delta on, B saw what the owner's client saw.
    let from = first["seq"].as_u64().unwrap_or(0);
    let since = |events: &[Value]| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["seq"].as_u64().is_some_and(|s| s >= from))
            .filter(|e| e["seq"].as_u64() <= text["seq"].as_u64())
            .cloned()
            .collect()
    };
    assert_eq!(since(&on_b.events), since(&on_a.events));
    let store = cluster.store().await;
    let stored = stored_events(&store, &chat, on_b.last_seq, "the message's text stored").await;
    assert!(
        stored.iter().all(|e| e.event_type != "chat.text_delta"),
        "no delta is stored"
    );
    assert_view_matches_store(&chat, 0, &logged(&on_b.events), &stored);
}

/// A node shows a streamed delta only once the store marks its seq taken: killed while the
/// model streams, the chat's next owner continues above every seq a client saw (through
/// either node), and the re-run turn reaches a client that resumes after that seq.
#[tokio::test]
async fn a_node_killed_in_mid_stream_leaves_no_seq_a_client_saw_to_its_successor() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    // 60 words, one every 50 ms: three seconds of stream to kill the owner in.
    let mock = MockLlm::start_paced_answer(50, 60).await;
    let Some(mut cluster) =
        Cluster::start_with("cluster_kill_mid_stream", 2, LEASE_TTL_S, mock.options()).await
    else {
        return;
    };
    let chat = cluster.node(0).create_chat("TodoAssistant", "alice").await;
    let mut on_a = WsClient::connect(&cluster.node(0).ws_url(&chat, 0), "alice").await;
    on_a.until("chat.resume_boundary").await;
    let mut on_b = WsClient::connect(&cluster.node(1).ws_url(&chat, 0), "alice").await;
    on_b.until("chat.resume_boundary").await;
    on_a.say("Buy milk").await;
    for _ in 0..3 {
        on_a.until("chat.text_delta").await;
    }
    on_b.until("chat.text_delta").await;
    let victim = cluster.nodes[0]
        .take()
        .unwrap_or_else(|| panic!("node 0 missing"));
    let _ = victim.kill().await;
    let seen = on_a.last_seq.max(on_b.last_seq);
    assert!(
        on_a.of("chat.text")
            .iter()
            .all(|t| t["data"]["agent"] != "TodoAgent"),
        "the owner must die in mid-stream: {:?}",
        on_a.types()
    );
    drop((on_a, on_b));
    wait_until(
        "node 1 to take the chat over",
        Duration::from_secs(20),
        async || cluster.log(1).contains("serving a chat taken over"),
    )
    .await;
    let mut again = WsClient::connect(&cluster.node(1).ws_url(&chat, seen), "alice").await;
    again.last_seq = seen;
    let words = again.until_turn_run_again_above(seen, "TodoAgent").await;
    assert_eq!(words, 60, "the re-run turn's whole answer");
}

/// 200 chats created on node 0 and driven through node 1's sockets at once by the real load
/// generator, 3 turns each (it checks every event: seqs in order, tool calls answered, each
/// turn ending with `chat.input_request`); sockets take their chat over when `hand_over`.
/// The cluster, for its metrics, and the load generator's report.
async fn driven_through_the_other_node(name: &str, hand_over: bool) -> Option<(Cluster, Value)> {
    driven_through_the_other_node_with(name, hand_over, MockLlm::start().await, None).await
}

/// [`driven_through_the_other_node`] with `mock` as the model, and the chats of `workflow`
/// (a folder of workflows, and the workflow's name) instead of LoadTest.
async fn driven_through_the_other_node_with(
    name: &str,
    hand_over: bool,
    mock: MockLlm,
    workflow: Option<(&std::path::Path, &str)>,
) -> Option<(Cluster, Value)> {
    let mut options = mock.options();
    options.workflows_dir = workflow.map(|(dir, _)| dir.to_path_buf());
    // One tenant opens 200 chats at once: above the default open-chat quota and rate.
    options.env.extend(
        [
            ("TESSERA_MAX_OPEN_CHATS_PER_TENANT", "0"),
            ("TESSERA_MESSAGES_PER_MINUTE", "100000000"),
            (
                "TESSERA_HAND_OVER_SOCKETS",
                if hand_over { "true" } else { "false" },
            ),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    let cluster = Cluster::start_with(name, 2, LEASE_TTL_S, options).await?;
    let summary = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("{e}"));
    let status = tokio::process::Command::new(integration_tests::loadgen_bin())
        .args([
            "run",
            "--url",
            &cluster.node(0).base,
            "--ws-url",
            &cluster.node(1).base,
        ])
        .args([
            "--chats",
            "200",
            "--turns",
            "3",
            "--max-seconds",
            "120",
            "--workflow",
            workflow.map_or("LoadTest", |(_, name)| name),
            "--json",
        ])
        .arg(summary.path())
        .kill_on_drop(true)
        .status()
        .await
        .unwrap_or_else(|e| panic!("cannot run the load generator: {e}"));
    let report: Value = serde_json::from_slice(
        &std::fs::read(summary.path()).unwrap_or_else(|e| panic!("no summary: {e}")),
    )
    .unwrap_or_else(|e| panic!("summary is not JSON: {e}"));
    assert!(status.success(), "the load generator failed: {report}");
    assert_eq!(report["turns_completed"], 600, "{report}");
    assert_eq!(report["protocol_violations"], 0, "{report}");
    assert_eq!(report["errors"], json!({}), "{report}");
    Some((cluster, report))
}

/// Chats driven through the node that does not own them, which serves their sockets over
/// NATS (hand-overs off): every forwarded message is taken, and every event arrives once and
/// in order, with the owner's store written behind them.
#[tokio::test]
async fn chats_created_on_one_node_and_driven_through_another_see_every_event_in_order() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let Some((cluster, _)) = driven_through_the_other_node("cluster_cross_load", false).await
    else {
        return;
    };
    // Node 1's sockets follow every chat, so their owner published each turn's events.
    let published = cluster
        .node(0)
        .metric("tessera_cluster_live_events_published_total")
        .await;
    assert!(published >= 600, "{published} live events published");
    assert_eq!(
        cluster
            .node(0)
            .metric("tessera_cluster_chats_handed_over_total")
            .await,
        0
    );
}

/// Chats whose agent speaks first (`AgentDriven`): their first turn runs from the moment
/// node 0 creates them, and a model that takes 300 ms a call keeps it running while their
/// sockets connect to node 1, so node 0 keeps them then. Each moves to node 1 with its user's
/// first message, and every event still arrives once and in order.
#[tokio::test]
async fn chats_whose_agent_speaks_first_move_to_their_socket_s_node_with_the_first_message() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let workflows = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_agent_first_workflow(workflows.path());
    let mock = MockLlm::start_with_latency(300).await;
    let Some((cluster, _)) = driven_through_the_other_node_with(
        "cluster_cross_agent_first",
        true,
        mock,
        Some((workflows.path(), "AgentFirst")),
    )
    .await
    else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));
    assert_eq!(
        a.metric("tessera_cluster_chats_handed_over_total").await,
        200
    );
    assert_eq!(a.metric("tessera_cluster_owned_chats").await, 0);
    assert_eq!(b.metric("tessera_cluster_owned_chats").await, 200);
}

/// A socket on node B of an `AgentDriven` chat node A created finds it running (its greeting
/// waits on a model that takes 300 ms), so it is served over NATS. As soon as the greeting
/// asks the user, B asks for the chat, before the user types anything; the user's message
/// then runs on B, and the socket sees every event once, in order.
#[tokio::test]
async fn a_socket_takes_its_chat_as_soon_as_the_chat_asks_its_user() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let workflows = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_agent_first_workflow(workflows.path());
    let mock = MockLlm::start_with_latency(300).await;
    let mut options = mock.options();
    options.workflows_dir = Some(workflows.path().to_path_buf());
    let Some(cluster) =
        Cluster::start_with("cluster_moves_when_asked", 2, LEASE_TTL_S, options).await
    else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));
    let chat = a.create_chat("AgentFirst", "alice").await;
    let mut ws = WsClient::connect(&b.ws_url(&chat, 0), "alice").await;
    let asked = ws.until("chat.input_request").await["seq"]
        .as_u64()
        .unwrap_or_default();
    wait_until("B serves the chat", Duration::from_secs(10), async || {
        b.metric("tessera_cluster_owned_chats").await == 1
    })
    .await;
    assert_eq!(a.metric("tessera_cluster_chats_handed_over_total").await, 1);
    ws.say("hello").await;
    ws.until_match("chat.input_request", |e| e["seq"].as_u64() > Some(asked))
        .await;
    let seqs: Vec<u64> = ws
        .events
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|s| *s > 0)
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "in order, once: {seqs:?}"
    );
    assert_eq!(ws.of("chat.session").len(), 1, "{:?}", ws.types());
    assert_eq!(ws.of("chat.resume_boundary").len(), 1, "{:?}", ws.types());
}

/// `AgentFirst`: one agent that greets the user first, then answers each message.
fn write_agent_first_workflow(dir: &std::path::Path) {
    let files = [
        (
            "workflow.json",
            json!({"name": "AgentFirst", "description": "The agent speaks first.",
                   "initial_agent": "GreetAgent", "max_turns": 40,
                   "human_in_the_loop": true, "startup_mode": "AgentDriven"}),
        ),
        (
            "agents.json",
            json!({"agents": {"GreetAgent": {"system_message": "Greet, then answer.",
                                             "max_consecutive_auto_reply": 4}}}),
        ),
    ];
    write_workflow(dir, "AgentFirst", &files);
}

/// Writes workflow `name`'s manifest `files` (file name, JSON) into its folder under `dir`.
fn write_workflow(dir: &std::path::Path, name: &str, files: &[(&str, Value)]) {
    let wf = dir.join(name);
    std::fs::create_dir_all(&wf).unwrap_or_else(|e| panic!("{e}"));
    for (file, body) in files {
        std::fs::write(wf.join(file), body.to_string()).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The same chats with hand-overs on: each socket that reaches node 1 finds its chat waiting
/// on its user with nobody on node 0, so node 0 hands the chat over and node 1 serves it as
/// its own. Every event still arrives once and in order, and none crosses NATS.
#[tokio::test]
async fn chats_whose_sockets_reach_another_node_move_there_and_see_every_event_in_order() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let Some((cluster, _)) = driven_through_the_other_node("cluster_cross_hand_over", true).await
    else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));
    assert_eq!(
        a.metric("tessera_cluster_chats_handed_over_total").await,
        200
    );
    // Every chat runs on B: A owns none, and B's sockets drove them locally.
    assert_eq!(a.metric("tessera_cluster_owned_chats").await, 0);
    for node in [a, b] {
        assert_eq!(
            node.metric("tessera_cluster_live_events_published_total")
                .await,
            0
        );
    }
}

#[tokio::test]
async fn chats_survive_a_node_killed_mid_turn() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    const CHATS: usize = 300;
    // The mock LLM answers after this long: a kill lands in model calls as well as in tool
    // calls and UI waits.
    const LLM_LATENCY_MS: u64 = 300;
    let tools = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/echo"))
        .respond_with(SlowEcho)
        .mount(&tools)
        .await;
    let workflows = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_failover_workflow(workflows.path(), &format!("{}/echo", tools.uri()));
    let llm = MockLlm::start_with_latency(LLM_LATENCY_MS).await;
    let mut options = llm.options();
    options.workflows_dir = Some(workflows.path().to_path_buf());
    // Whole answers, no token deltas: a resumed client skips the deltas of a message that
    // is final by then (see docs/protocol.md), which is not what this test is about.
    options.env.push(("TESSERA_STREAM".into(), "false".into()));
    let Some(mut cluster) =
        Cluster::start_with("cluster_kill_mid_turn", 3, BUSY_LEASE_TTL_S, options).await
    else {
        return;
    };
    let bases = Arc::new(cluster.bases());
    let mut chats = Vec::new();
    for i in 0..CHATS {
        let chat = cluster
            .node(i % 3)
            .create_chat("Failover", &format!("user{i}"))
            .await;
        chats.push((chat, format!("user{i}")));
    }
    // Node 2 owns every third chat (it created them). Clients connect to other nodes too,
    // and a client whose node dies reconnects to the next.
    let victims: HashSet<String> = chats
        .iter()
        .skip(2)
        .step_by(3)
        .map(|(c, _)| c.clone())
        .collect();
    let mut drivers = Vec::new();
    for (i, (chat, user)) in chats.iter().enumerate() {
        drivers.push(tokio::spawn(drive_failover_chat(
            bases.clone(),
            chat.clone(),
            user.clone(),
            (i * 7 + 1) % 3,
            Duration::from_millis((i as u64 % 25) * 80),
        )));
    }
    // Kill node 2 once half of its chats have called the backend tool: the others are before
    // or in their first model call, and those that called it are in the tool, in the model
    // call after it, or in the UI round trip.
    wait_until(
        "half of node 2's chats to call the backend tool",
        Duration::from_secs(60),
        async || {
            let effects = side_effects(&tools).await;
            let callers: HashSet<&String> = effects
                .iter()
                .map(|(chat, _)| chat)
                .filter(|chat| victims.contains(*chat))
                .collect();
            callers.len() >= victims.len() / 2
        },
    )
    .await;
    let victim = cluster.nodes[2]
        .take()
        .unwrap_or_else(|| panic!("node 2 missing"));
    let killed_at = Instant::now();
    let _ = victim.kill().await;
    let store = cluster.store().await;
    // Where node 2's chats stood at the kill, by stored status, with their stored log length.
    let mut at_kill: BTreeMap<String, usize> = BTreeMap::new();
    let mut orphans = Vec::new();
    let mut answered_at_kill: HashSet<SideEffect> = HashSet::new();
    for chat in &victims {
        let status = match store.load_chat(chat).await {
            Ok(Some(stored)) => stored.state.status,
            _ => "missing".to_owned(),
        };
        *at_kill.entry(status.clone()).or_default() += 1;
        if status != "completed" {
            let events = store
                .events_after(chat, 0, u32::MAX)
                .await
                .unwrap_or_default();
            for event in events
                .iter()
                .filter(|e| e.event_type == "chat.tool_response")
            {
                let value: Value = serde_json::from_str(&event.json).unwrap_or(Value::Null);
                let corr = value["data"]["corr"].as_str().unwrap_or_default();
                answered_at_kill.insert((chat.clone(), corr.to_owned()));
            }
            orphans.push((chat.clone(), events.len() as u64));
        }
    }
    let records_at_kill = tool_records(&cluster.schema.url()).await;
    let echo_in_flight = records_at_kill
        .iter()
        .filter(|((chat, key), status)| {
            victims.contains(chat) && key.contains(":s") && status.as_str() == "started"
        })
        .count();
    // Completed before the kill but not yet answered in the log: the new owner reuses the
    // recorded result.
    let echo_to_reuse = records_at_kill
        .iter()
        .filter(|(record, status)| {
            victims.contains(&record.0)
                && record.1.contains(":s")
                && status.as_str() == "completed"
                && !answered_at_kill.contains(*record)
        })
        .count();
    // Taken over = a new event of each of them in the store (written by its new owner).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut waiting: Vec<(String, u64)> = orphans.clone();
    while !waiting.is_empty() && Instant::now() < deadline {
        let mut still = Vec::new();
        for (chat, at_kill) in waiting {
            if !store
                .events_after(&chat, at_kill, 1)
                .await
                .is_ok_and(|e| !e.is_empty())
            {
                still.push((chat, at_kill));
            }
        }
        waiting = still;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all_continued = killed_at.elapsed();
    let mut runs = Vec::new();
    for driver in drivers {
        runs.push(
            driver
                .await
                .unwrap_or_else(|e| panic!("driver panicked: {e}")),
        );
    }
    for i in 0..2 {
        let log = cluster.log(i);
        eprintln!(
            "node{i}: leases lost {}, renewals failed {}, chats taken over {}",
            log.matches("lease lost").count(),
            log.matches("lease renewal failed").count(),
            log.matches("serving a chat taken over").count()
        );
    }
    let incomplete: Vec<(&String, &Vec<String>)> = chats
        .iter()
        .zip(&runs)
        .filter(|(_, run)| !run.completed)
        .map(|((chat, _), run)| (chat, &run.tail))
        .collect();
    assert!(
        incomplete.is_empty(),
        "{} chats did not complete: {incomplete:?}",
        incomplete.len()
    );
    let records = tool_records(&cluster.schema.url()).await;
    let mut effects: BTreeMap<SideEffect, usize> = BTreeMap::new();
    for effect in side_effects(&tools).await {
        *effects.entry(effect).or_default() += 1;
    }
    let mut total = ToolTally::default();
    for ((chat, _), run) in chats.iter().zip(&runs) {
        let stored = store
            .events_after(chat, 0, u32::MAX)
            .await
            .unwrap_or_else(|e| panic!("cannot read {chat}'s events: {e}"));
        let seqs: Vec<u64> = stored.iter().map(|e| e.seq).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "chat {chat}: the stored log has a seq twice or out of order: {seqs:?}"
        );
        let seen: Vec<(u64, &Value)> = run.seen.iter().map(|(seq, e)| (*seq, e)).collect();
        assert_view_matches_store(chat, 0, &seen, &stored);
        let tally = assert_each_tool_ran_once(chat, &stored, &records, &effects);
        total.completed += tally.completed;
        total.interrupted += tally.interrupted;
        total.ui_answers += tally.ui_answers;
    }
    let reconnects: u32 = runs.iter().map(|r| r.reconnects).sum();
    let after_expiry = all_continued.saturating_sub(Duration::from_secs(BUSY_LEASE_TTL_S));
    eprintln!(
        "{CHATS} chats on 3 nodes; node 2 killed with its {} chats by stored status {at_kill:?} ({echo_in_flight} backend tool calls in flight, {echo_to_reuse} completed but not yet in the log); all {} open ones continued on another node {:.2} s after the kill ({:.2} s after lease expiry); {reconnects} client reconnects; echo ran {} times, {} reported interrupted, {} UI answers stored",
        victims.len(),
        orphans.len(),
        all_continued.as_secs_f64(),
        after_expiry.as_secs_f64(),
        total.completed,
        total.interrupted,
        total.ui_answers,
    );
    assert!(
        at_kill.get("running").copied().unwrap_or(0) > 0,
        "the kill came mid-turn: {at_kill:?}"
    );
    assert!(
        waiting.is_empty(),
        "chats that did not continue after the kill: {waiting:?}"
    );
    assert!(
        after_expiry < Duration::from_secs(10),
        "takeover within 10 s of lease expiry (took {after_expiry:?})"
    );
    assert!(reconnects > 0, "some clients were on the killed node");
}

#[tokio::test]
async fn a_node_paused_past_its_lease_cannot_write_and_drops_its_chats() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let Some(cluster) = Cluster::start("cluster_sigstop", 2).await else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));
    let store = cluster.store().await;
    let chat = a.create_chat("Generator", "alice").await;
    let mut ws = WsClient::connect(&a.ws_url(&chat, 0), "alice").await;
    ws.until("chat.input_request").await;
    ws.say("Automate my weekly social media posts").await;
    let plan = ws.until_ui_call().await;
    let corr = corr_of(&plan);
    wait_until(
        "the UI call in the store",
        Duration::from_secs(10),
        async || store.pending_ui(&chat).await.is_ok_and(|p| !p.is_empty()),
    )
    .await;
    let seen = ws.last_seq;

    // Pause A past its lease: B takes the chat over and the user goes on there.
    let signal = |name: &str| a.signal(name);
    signal("-STOP");
    let paused_at = Instant::now();
    // B's orphan scan takes the chat over once A's lease expired.
    wait_until(
        "B to take the chat over",
        Duration::from_secs(20),
        async || {
            // The only chat of the test (the log may colour its fields).
            cluster.log(1).contains("serving a chat taken over")
        },
    )
    .await;
    let taken_over_after = paused_at.elapsed();
    let mut on_b = WsClient::connect(&b.ws_url(&chat, seen), "alice").await;
    on_b.last_seq = seen;
    on_b.send(answer(&corr)).await;
    let done = on_b
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "action_plan"
        })
        .await;
    assert_eq!(done["data"]["success"], true);
    assert_eq!(done["seq"], seen + 1, "B continues the log with no gap");
    let key = on_b.until_ui_call().await;
    assert_eq!(key["data"]["component_type"], "AgentAPIKeyInput");
    assert!(
        taken_over_after >= Duration::from_secs(LEASE_TTL_S) - Duration::from_millis(1500),
        "B took the chat only once A's lease expired (A renewed it at most TTL/3 before the pause)"
    );
    let log_before_wake = store
        .events_after(&chat, 0, u32::MAX)
        .await
        .unwrap_or_default();

    // Wake A. Its session still holds the old UI call: answering it there is either refused
    // (A already dropped the chat and forwards to B, which answered it) or carried out by
    // the stale session, whose writes the store refuses (fenced).
    signal("-CONT");
    if let Ok(mut stale) = WsClient::try_connect(&a.ws_url(&chat, seen), "alice").await {
        stale.last_seq = seen;
        stale.send(answer(&corr)).await;
        // Whatever A answers (an ack, an error), it must not reach the store.
        let _ = tokio::time::timeout(Duration::from_secs(2), stale.next()).await;
    }
    wait_until("A to drop the chat", Duration::from_secs(10), async || {
        cluster.log(0).contains("chat relinquished")
    })
    .await;
    let a_log = cluster.log(0);
    eprintln!(
        "B took the chat over {:.2} s after A paused; node A after waking: fenced writes: {}, leases lost: {}",
        taken_over_after.as_secs_f64(),
        a_log.matches("write fenced").count(),
        a_log.matches("lease lost").count()
    );

    // The store holds B's log only: what it held before A woke, then B's own events.
    on_b.send(answer(&corr_of(&key))).await;
    on_b.until_match("chat.tool_response", |e| {
        e["data"]["tool_name"] == "request_api_key"
    })
    .await;
    let b_seen = on_b.last_seq;
    let after = stored_events(&store, &chat, b_seen, "B's events in the store").await;
    assert!(a_log.contains("write fenced") || a_log.contains("lease lost"));
    for (before, now) in log_before_wake.iter().zip(&after) {
        assert_eq!(before.json, now.json, "seq {} was rewritten", before.seq);
    }
    assert_view_matches_store(&chat, seen, &logged(&on_b.events), &after);
    let plan_answers = after
        .iter()
        .filter(|e| e.event_type == "chat.tool_response" && e.json.contains("\"action_plan\""))
        .count();
    assert_eq!(
        plan_answers, 1,
        "the plan was answered once (B's), never by the paused node"
    );
}

#[tokio::test]
async fn sigterm_hands_the_chats_over_before_their_lease_expires() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let Some(mut cluster) = Cluster::start("cluster_drain", 2).await else {
        return;
    };
    let chat = cluster.node(0).create_chat("Generator", "alice").await;
    let mut ws = WsClient::connect(&cluster.node(0).ws_url(&chat, 0), "alice").await;
    ws.until("chat.input_request").await;
    ws.say("Automate my weekly social media posts").await;
    let plan = ws.until_ui_call().await;
    let store = cluster.store().await;
    wait_until(
        "the UI call in the store",
        Duration::from_secs(10),
        async || store.pending_ui(&chat).await.is_ok_and(|p| !p.is_empty()),
    )
    .await;
    let seen = ws.last_seq;

    let a = cluster.nodes[0]
        .take()
        .unwrap_or_else(|| panic!("node A missing"));
    let stopping = Instant::now();
    assert!(a.terminate().await, "node A exits cleanly on SIGTERM");
    assert!(ws.next().await.is_none(), "A closed the socket");
    // Released, not left to expire: B takes the chat on its next scan (a third of the TTL).
    wait_until(
        "B to take the chat over",
        Duration::from_secs(20),
        async || cluster.log(1).contains("serving a chat taken over"),
    )
    .await;
    let handed_over = stopping.elapsed();
    eprintln!(
        "SIGTERM on A: B serves its chat {:.2} s later",
        handed_over.as_secs_f64()
    );
    assert!(
        handed_over < Duration::from_secs(LEASE_TTL_S),
        "handed over before the lease would have expired ({handed_over:?})"
    );
    let mut on_b = WsClient::connect(&cluster.node(1).ws_url(&chat, seen), "alice").await;
    on_b.last_seq = seen;
    let boundary = on_b.until("chat.resume_boundary").await;
    assert_eq!(
        boundary["data"]["pending_ui_calls"][0]["corr"],
        corr_of(&plan).as_str()
    );
    on_b.send(answer(&corr_of(&plan))).await;
    let done = on_b
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "action_plan"
        })
        .await;
    assert_eq!(done["seq"], seen + 1, "the log goes on with no gap");
}
