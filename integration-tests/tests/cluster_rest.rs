//! The REST API and AG-UI on a cluster: any node serves any route of any chat. Real processes
//! (two `tessera serve` nodes), one PostgreSQL schema and NATS. A chat created on node A is
//! driven entirely through node B (B forwards to A over NATS); another user is refused through
//! B exactly as through A; with A killed, B answers a clear retryable error in bounded time
//! until A's lease expires, then takes the chat over; a chat idle on A leaves its memory with
//! its lease parked, and the node a client reaches next claims it. Needs `TESSERA_TEST_DATABASE_URL` and
//! `TESSERA_TEST_NATS_URL` (skipped with a message without them, failing under `CI=true`).

use std::time::{Duration, Instant};

use integration_tests::cluster::{Cluster, ONE_CLUSTER_AT_A_TIME, wait_until};
use integration_tests::server::TestServer;
use serde_json::{Value, json};
use tessera_store::ChatStore;

/// One REST answer: status, `Retry-After` (if any) and JSON body.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: Value,
}

/// A request to `node` as `user` (the dev-mode `x-user-id` credential).
async fn call(
    node: &TestServer,
    method: reqwest::Method,
    path: &str,
    user: &str,
    body: Option<Value>,
) -> Answer {
    let client = reqwest::Client::new();
    let mut request = client
        .request(method, format!("{}{path}", node.base))
        .header("x-user-id", user)
        .timeout(Duration::from_secs(60));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.json::<Value>().await.unwrap_or(Value::Null);
    Answer {
        status,
        retry_after,
        body,
    }
}

async fn get(node: &TestServer, path: &str, user: &str) -> Answer {
    call(node, reqwest::Method::GET, path, user, None).await
}

async fn post(node: &TestServer, path: &str, user: &str, body: Value) -> Answer {
    call(node, reqwest::Method::POST, path, user, Some(body)).await
}

/// The user's approval of the Generator's action plan (UI call `corr`).
fn ui_answer(corr: &str) -> Value {
    json!({"corr": corr, "status": "success", "action": "submit", "data": {"approved": true}})
}

/// Waits, reading the chat through `node`, until `ready` holds for `GET /chats/{id}`.
async fn chat_through(
    node: &TestServer,
    chat: &str,
    user: &str,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let path = format!("/api/v1/chats/{chat}");
    let mut last = Value::Null;
    wait_until(what, Duration::from_secs(30), async || {
        let answer = get(node, &path, user).await;
        assert_eq!(answer.status, 200, "{what}: {}", answer.body);
        last = answer.body;
        ready(&last)
    })
    .await;
    last
}

/// The corr of the pending UI call of `component`, once the chat waits on it.
async fn pending_call(node: &TestServer, chat: &str, user: &str, component: &str) -> String {
    let view = chat_through(node, chat, user, component, |c| {
        c["pending_ui_calls"][0]["component_type"] == component
    })
    .await;
    view["pending_ui_calls"][0]["corr"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_chat_created_on_node_a_is_driven_entirely_by_rest_through_node_b() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let Some(cluster) = Cluster::start("cluster_rest_drive", 2).await else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));
    let chat = a.create_chat("Generator", "alice").await;
    let chat_path = format!("/api/v1/chats/{chat}");

    // Reads and input through B.
    let view = chat_through(b, &chat, "alice", "the greeting", |c| {
        c["status"] == "awaiting_user"
    })
    .await;
    assert_eq!(view["chat_id"], chat.as_str());
    assert_eq!(view["workflow"], "Generator");
    let input = post(
        b,
        &format!("{chat_path}/input"),
        "alice",
        json!({"content": "Automate my weekly social media posts", "client_msg_id": "m1"}),
    )
    .await;
    assert_eq!(input.status, 202, "{}", input.body);

    // The UI tool round trip through B.
    let plan = pending_call(b, &chat, "alice", "ActionPlan").await;
    let answered = post(
        b,
        &format!("{chat_path}/tool-responses"),
        "alice",
        ui_answer(&plan),
    )
    .await;
    assert_eq!(answered.status, 202, "{}", answered.body);
    let key = pending_call(b, &chat, "alice", "AgentAPIKeyInput").await;
    assert_ne!(key, plan);

    // While the chat waits on its UI call (and has stored all it wrote behind), both nodes
    // show the same chat and transcript.
    chat_through(b, &chat, "alice", "the chat's writes stored", |c| {
        c["persisted_seq"] == c["last_seq"]
    })
    .await;
    let (on_a, on_b) = (
        get(a, &chat_path, "alice").await,
        get(b, &chat_path, "alice").await,
    );
    assert_eq!(on_a.status, 200);
    assert_eq!(on_a.body, on_b.body, "B shows the owner's view");
    let messages = format!("{chat_path}/messages?offset=0&limit=100");
    let (on_a, on_b) = (
        get(a, &messages, "alice").await,
        get(b, &messages, "alice").await,
    );
    assert_eq!(on_b.status, 200, "{}", on_b.body);
    assert_eq!(on_a.body, on_b.body, "B pages the owner's transcript");
    assert!(
        on_b.body["messages"]
            .as_array()
            .is_some_and(|m| m
                .iter()
                .any(|m| m["content"] == "Automate my weekly social media posts"
                    && m["role"] == "user")),
        "{}",
        on_b.body
    );
    let page = get(
        b,
        &format!("{chat_path}/messages?offset=1&limit=1"),
        "alice",
    )
    .await;
    assert_eq!(page.body["messages"].as_array().map(Vec::len), Some(1));
    assert_eq!(page.body["total"], on_a.body["total"]);

    // Refusals are the owner's, status and body: an answer to no call, input while a UI call
    // waits, a malformed answer (refused on B before forwarding, as on A).
    for (path, body) in [
        (
            format!("{chat_path}/tool-responses"),
            ui_answer("no-such-corr"),
        ),
        (
            format!("{chat_path}/input"),
            json!({"content": "are you there?"}),
        ),
        (
            format!("{chat_path}/tool-responses"),
            json!({"corr": key, "status": "maybe"}),
        ),
    ] {
        let (on_a, on_b) = (
            post(a, &path, "alice", body.clone()).await,
            post(b, &path, "alice", body).await,
        );
        assert!(on_a.status >= 400, "{path}: {}", on_a.body);
        assert_eq!(
            (on_b.status, &on_b.body),
            (on_a.status, &on_a.body),
            "{path}"
        );
    }

    // Another user, through either node: every route answers 404 like an unknown chat.
    for node in [a, b] {
        for answer in [
            get(node, &chat_path, "mallory").await,
            get(node, &format!("{chat_path}/messages"), "mallory").await,
            post(
                node,
                &format!("{chat_path}/input"),
                "mallory",
                json!({"content": "hi"}),
            )
            .await,
            post(
                node,
                &format!("{chat_path}/tool-responses"),
                "mallory",
                ui_answer(&key),
            )
            .await,
            post(node, &format!("{chat_path}/cancel"), "mallory", json!({})).await,
            call(node, reqwest::Method::DELETE, &chat_path, "mallory", None).await,
        ] {
            assert_eq!(answer.status, 404, "{}", answer.body);
            assert_eq!(answer.body["code"], "not_found");
        }
    }
    assert_eq!(
        get(b, "/api/v1/chats/no-such-chat", "alice").await.status,
        404
    );

    // Cancel through B ends the run waiting on the key: the chat waits for its user again.
    let cancelled = post(b, &format!("{chat_path}/cancel"), "alice", json!({})).await;
    assert_eq!(cancelled.status, 202, "{}", cancelled.body);
    let view = chat_through(b, &chat, "alice", "the cancel", |c| {
        c["status"] == "awaiting_user"
    })
    .await;
    assert_eq!(view["pending_ui_calls"], json!([]));
    let store = cluster.store().await;
    wait_until(
        "the cancelled run in the store",
        Duration::from_secs(10),
        async || {
            store.events_after(&chat, 0, u32::MAX).await.is_ok_and(|e| {
                e.iter().any(|e| {
                    e.event_type == "chat.run_complete" && e.json.contains("\"cancelled\"")
                })
            })
        },
    )
    .await;
    let events = store
        .events_after(&chat, 0, u32::MAX)
        .await
        .unwrap_or_default();
    let plan_answers = events
        .iter()
        .filter(|e| e.event_type == "chat.tool_response" && e.json.contains("\"action_plan\""))
        .count();
    assert_eq!(plan_answers, 1, "the plan was answered once");
    // REST through B follows no live event, so the owner published none on NATS.
    assert_eq!(
        a.metric("tessera_cluster_live_events_published_total")
            .await,
        0
    );

    // Delete through B: the owner stops the chat, and it is gone on both nodes.
    let deleted = call(b, reqwest::Method::DELETE, &chat_path, "alice", None).await;
    assert_eq!(deleted.status, 204, "{}", deleted.body);
    assert_eq!(get(a, &chat_path, "alice").await.status, 404);
    assert_eq!(get(b, &chat_path, "alice").await.status, 404);
    assert!(matches!(store.load_chat(&chat).await, Ok(None)));
    // Nothing of it is written again (a late write would have recreated rows or failed).
    assert!(
        store
            .events_after(&chat, 0, u32::MAX)
            .await
            .is_ok_and(|e| e.is_empty())
    );
}

#[tokio::test]
async fn an_idle_chat_leaves_its_owner_and_the_node_its_next_request_reaches_claims_it() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let idle = integration_tests::server::ServerOptions {
        env: vec![("TESSERA_IDLE_CHAT_EVICT_S".into(), "1".into())],
        ..Default::default()
    };
    let Some(cluster) = Cluster::start_with(
        "cluster_rest_idle",
        2,
        integration_tests::cluster::LEASE_TTL_S,
        idle,
    )
    .await
    else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));
    let chat = a.create_chat("Generator", "alice").await;
    let chat_path = format!("/api/v1/chats/{chat}");
    let greeted = chat_through(a, &chat, "alice", "the greeting", |c| {
        c["status"] == "awaiting_user"
    })
    .await;

    // Idle for a second, with nobody watching: it leaves A's memory, and A parks its lease.
    wait_until(
        "A parks the idle chat",
        Duration::from_secs(30),
        async || a.metric("tessera_cluster_leases_parked_total").await == 1,
    )
    .await;
    assert_eq!(a.metric("tessera_cluster_owned_chats").await, 0);
    let store = cluster.store().await;
    use tessera_store::LeaseStore;
    assert!(
        store.orphaned_chats(10).await.is_ok_and(|o| o.is_empty()),
        "a parked chat is no orphan: no node's scan takes it over"
    );

    // The next request reaches B: B claims the chat and carries it on from the store.
    let view = chat_through(b, &chat, "alice", "the chat through B", |c| {
        c["status"] == "awaiting_user"
    })
    .await;
    assert_eq!(view["messages"], greeted["messages"]);
    assert_eq!(b.metric("tessera_cluster_owned_chats").await, 1);
    let input = post(
        b,
        &format!("{chat_path}/input"),
        "alice",
        json!({"content": "Automate my weekly social media posts", "client_msg_id": "m1"}),
    )
    .await;
    assert_eq!(input.status, 202, "{}", input.body);
    pending_call(b, &chat, "alice", "ActionPlan").await;
    assert_eq!(a.metric("tessera_cluster_owned_chats").await, 0);
    // Read through A now, it is B's: forwarded, and the same chat.
    let through_a = get(a, &chat_path, "alice").await;
    assert_eq!(through_a.status, 200, "{}", through_a.body);
    assert_eq!(
        through_a.body["pending_ui_calls"][0]["component_type"],
        "ActionPlan"
    );
}

#[tokio::test]
async fn run_and_ag_ui_work_through_any_node() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let Some(cluster) = Cluster::start("cluster_rest_agui", 2).await else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));

    // `/run` through B: the whole run and its answer.
    let run = post(
        b,
        "/api/v1/run",
        "alice",
        json!({"workflow": "TodoAssistant", "message": "Buy milk"}),
    )
    .await;
    assert_eq!(run.status, 200, "{}", run.body);
    assert_eq!(run.body["tools_used"], json!(["add_task"]));
    assert!(
        run.body["response"]
            .as_str()
            .is_some_and(|r| r.contains("Buy milk"))
    );

    // An AG-UI thread started on A, its interrupt resumed through B (which runs the run on A
    // and relays its stream).
    let first = agui(
        a,
        "alice",
        json!({"threadId": "thread-1", "runId": "run-1", "messages": [
            {"id": "u1", "role": "user", "content": "Automate my weekly social media posts"}]}),
    )
    .await;
    let (chat_id, plan) = interrupted(&first, "ActionPlan");
    let second = agui(
        b,
        "alice",
        json!({"threadId": "thread-1", "runId": "run-2", "messages": [
            {"id": "u1", "role": "user", "content": "Automate my weekly social media posts"}],
            "resume": [{"interruptId": plan, "status": "resolved",
                "payload": {"approved": true}}]}),
    )
    .await;
    assert_eq!(second[0]["type"], "RUN_STARTED", "{second:?}");
    assert_eq!(second[0]["runId"], "run-2");
    let (same_chat, key) = interrupted(&second, "AgentAPIKeyInput");
    assert_eq!(same_chat, chat_id, "the same thread, run on its owner");
    assert_ne!(key, plan);
    assert!(
        second
            .iter()
            .any(|e| e["type"] == "TOOL_CALL_RESULT" || e["type"] == "TOOL_CALL_END"),
        "the plan's answer streamed through B: {second:?}"
    );
    assert!(
        b.metric("tessera_cluster_commands_forwarded_total").await >= 1,
        "B forwarded the run to the thread's owner"
    );
    assert!(
        !cluster.log(1).contains("serving a chat taken over"),
        "B did not take the thread over"
    );

    // The thread of another workflow through B: the owner's 409.
    let wrong = post(
        b,
        "/api/v1/agui/TodoAssistant",
        "alice",
        json!({"threadId": "thread-1", "runId": "run-3", "messages": []}),
    )
    .await;
    assert_eq!(wrong.status, 409, "{}", wrong.body);
    assert_eq!(wrong.body["code"], "thread_of_other_workflow");

    // Another user naming the same thread id gets a thread of their own (ids are per user),
    // never alice's chat.
    let mallory = agui(
        b,
        "mallory",
        json!({"threadId": "thread-1", "runId": "run-m", "messages": []}),
    )
    .await;
    let mallory_chat = mallory
        .iter()
        .find(|e| e["type"] == "RUN_FINISHED")
        .and_then(|e| e["metadata"]["tessera"]["chatId"].as_str())
        .unwrap_or_default();
    assert_ne!(mallory_chat, chat_id);
}

/// Runs one AG-UI run of the Generator through `node`; its events, in order.
async fn agui(node: &TestServer, user: &str, input: Value) -> Vec<Value> {
    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/agui/Generator", node.base))
        .header("x-user-id", user)
        .timeout(Duration::from_secs(60))
        .json(&input)
        .send()
        .await
        .unwrap_or_else(|e| panic!("agui: {e}"));
    assert_eq!(response.status().as_u16(), 200);
    let text = response
        .text()
        .await
        .unwrap_or_else(|e| panic!("agui stream: {e}"));
    text.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}")))
        .collect()
}

/// The chat id and interrupt id of a run that ended waiting on `component`.
fn interrupted(events: &[Value], component: &str) -> (String, String) {
    let last = events.last().unwrap_or_else(|| panic!("no events"));
    assert_eq!(last["type"], "RUN_FINISHED", "{events:?}");
    let interrupt = &last["outcome"]["interrupts"][0];
    assert_eq!(
        interrupt["metadata"]["componentType"], component,
        "{events:?}"
    );
    (
        last["metadata"]["tessera"]["chatId"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        interrupt["id"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Lease TTL of the takeover test: well over the REST forwarding patience (5 s) plus a
/// renewal period, so a request right after the kill meets a live lease of a dead node.
const TAKEOVER_TTL_S: u64 = 10;

#[tokio::test]
async fn with_the_owner_killed_rest_answers_a_retryable_error_then_takes_the_chat_over() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let Some(mut cluster) = Cluster::start_with_ttl("cluster_rest_kill", 2, TAKEOVER_TTL_S).await
    else {
        return;
    };
    let chat = cluster.node(0).create_chat("Generator", "alice").await;
    let chat_path = format!("/api/v1/chats/{chat}");
    {
        let b = cluster.node(1);
        chat_through(b, &chat, "alice", "the greeting", |c| {
            c["status"] == "awaiting_user"
        })
        .await;
        let input = post(
            b,
            &format!("{chat_path}/input"),
            "alice",
            json!({"content": "Automate my weekly social media posts"}),
        )
        .await;
        assert_eq!(input.status, 202, "{}", input.body);
    }
    let plan = pending_call(cluster.node(1), &chat, "alice", "ActionPlan").await;
    let store = cluster.store().await;
    wait_until(
        "the UI call in the store",
        Duration::from_secs(10),
        async || store.pending_ui(&chat).await.is_ok_and(|p| !p.is_empty()),
    )
    .await;

    let a = cluster.nodes[0]
        .take()
        .unwrap_or_else(|| panic!("node A missing"));
    let _ = a.kill().await;
    let killed_at = Instant::now();
    let b = cluster.node(1);

    // A's lease is still live: B cannot reach the chat, and says so in bounded time.
    let asked_at = Instant::now();
    let early = get(b, &chat_path, "alice").await;
    let waited = asked_at.elapsed();
    eprintln!(
        "owner killed: B answered {} after {:.2} s ({:.2} s after the kill)",
        early.status,
        waited.as_secs_f64(),
        killed_at.elapsed().as_secs_f64()
    );
    assert_eq!(early.status, 503, "{}", early.body);
    assert_eq!(early.body["code"], "owner_unavailable");
    assert!(
        early
            .retry_after
            .as_deref()
            .is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s > 0)),
        "503 with Retry-After"
    );
    assert!(
        waited < Duration::from_secs(8),
        "no hang: bounded by the forwarding patience ({waited:?})"
    );

    // After the lease expired, the same request through B works: B took the chat over. A
    // request that gives up before the lease expires answers the same retryable 503 (the
    // lease was renewed up to a third of its TTL before the kill), so the client retries.
    let mut view = Value::Null;
    wait_until(
        "B to take the chat over",
        Duration::from_secs(30),
        async || {
            let answer = get(b, &chat_path, "alice").await;
            if answer.status == 503 && answer.body["code"] == "owner_unavailable" {
                return false;
            }
            assert_eq!(
                answer.status, 200,
                "B to take the chat over: {}",
                answer.body
            );
            view = answer.body;
            view["pending_ui_calls"][0]["corr"] == plan.as_str()
        },
    )
    .await;
    let took = killed_at.elapsed();
    eprintln!(
        "B served the chat {:.2} s after the kill (lease TTL {TAKEOVER_TTL_S} s)",
        took.as_secs_f64()
    );
    assert_eq!(view["pending_ui_calls"][0]["component_type"], "ActionPlan");
    let answered = post(
        b,
        &format!("{chat_path}/tool-responses"),
        "alice",
        ui_answer(&plan),
    )
    .await;
    assert_eq!(answered.status, 202, "{}", answered.body);
    pending_call(b, &chat, "alice", "AgentAPIKeyInput").await;
    assert!(
        took < Duration::from_secs(TAKEOVER_TTL_S + 10),
        "taken over within 10 s of lease expiry ({took:?})"
    );
}

/// Lease TTL of the pause test: the pause (the 5 s forwarding timeout) stays well within the
/// lease (renewed every 5 s), so the chat does not move while its owner is paused.
const PAUSE_TTL_S: u64 = 15;

#[tokio::test]
async fn with_the_owner_paused_rest_answers_a_timeout_it_can_retry_and_then_works_again() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let Some(cluster) = Cluster::start_with_ttl("cluster_rest_pause", 2, PAUSE_TTL_S).await else {
        return;
    };
    let (a, b) = (cluster.node(0), cluster.node(1));
    let chat = a.create_chat("Generator", "alice").await;
    let chat_path = format!("/api/v1/chats/{chat}");
    chat_through(b, &chat, "alice", "the greeting", |c| {
        c["status"] == "awaiting_user"
    })
    .await;
    let signal = |name: &str| a.signal(name);

    // A paused owner still holds its NATS subscription: the request reaches it and gets no
    // answer; B says so (the owner may have carried it out) instead of waiting.
    signal("-STOP");
    let asked_at = Instant::now();
    let paused = post(
        b,
        &format!("{chat_path}/input"),
        "alice",
        json!({"content": "Automate my weekly social media posts"}),
    )
    .await;
    let waited = asked_at.elapsed();
    signal("-CONT");
    eprintln!(
        "owner paused: B answered {} after {:.2} s",
        paused.status,
        waited.as_secs_f64()
    );
    assert_eq!(paused.status, 503, "{}", paused.body);
    assert_eq!(paused.body["code"], "owner_timeout");
    assert!(paused.retry_after.is_some(), "503 with Retry-After");
    assert!(
        waited < Duration::from_secs(8),
        "bounded by the forwarding timeout ({waited:?})"
    );

    // Awake again, A carried the input out when it got it (or refuses a second one): the
    // client checks the chat, as the error told it to, and goes on.
    let plan = pending_call(b, &chat, "alice", "ActionPlan").await;
    let answered = post(
        b,
        &format!("{chat_path}/tool-responses"),
        "alice",
        ui_answer(&plan),
    )
    .await;
    assert_eq!(answered.status, 202, "{}", answered.body);
    pending_call(b, &chat, "alice", "AgentAPIKeyInput").await;
}
