//! Several real `tessera serve` nodes as one service: one PostgreSQL schema (chats and leases)
//! and one NATS server (routing), each test under its own subject prefix. Needs
//! `TESSERA_TEST_DATABASE_URL` and `TESSERA_TEST_NATS_URL`; without them the tests say they are
//! skipped, and under `CI=true` they fail instead.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::cluster::{
    Cluster, LEASE_TTL_S, ONE_CLUSTER_AT_A_TIME, stored_events, wait_until,
};
use integration_tests::wsclient::WsClient;
use serde_json::{Value, json};
use tessera_store::{ChatStore, PgStore};

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
    /// Every logged event's seq, in the order the client got them, over all its sockets.
    seqs: Vec<u64>,
    reconnects: u32,
    completed: bool,
    /// The last events' types (for the failure message).
    tail: Vec<String>,
}

/// Drives a Generator chat to its end like a browser: says what the interview asks, answers
/// every UI tool call, and on a closed socket reconnects to another node and resumes by seq.
/// `first` picks the first node; reconnects go round the others. With `hold`, the first UI
/// call is answered only once `hold` says go (then over a fresh socket).
async fn drive_generator(
    bases: Arc<Vec<String>>,
    chat: String,
    user: String,
    first: usize,
    mut hold: Option<tokio::sync::watch::Receiver<bool>>,
) -> ChatRun {
    let mut run = ChatRun::default();
    let mut last_seq = 0;
    let mut said = false;
    let mut said_acked = false;
    let (mut errors_seen, mut errors_retried) = (0u32, 0u32);
    let mut answered: HashSet<String> = HashSet::new();
    let mut seen_calls: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
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
        // Commands the previous node may not have carried out go again; the owner refuses a
        // second one (not_accepting_input, unknown_correlation).
        if said && !said_acked {
            ws.say("Automate my weekly social media posts").await;
        }
        for corr in seen_calls.iter().filter(|c| !answered.contains(*c)) {
            ws.send(answer(corr)).await;
        }
        loop {
            let Some(event) = ws.next().await else {
                break;
            };
            let seq = event["seq"].as_u64().unwrap_or(0);
            if seq > 0 {
                run.seqs.push(seq);
                last_seq = seq;
            }
            let kind = format!("{}#{seq}", event["type"].as_str().unwrap_or("?"));
            run.tail.push(kind);
            if run.tail.len() > 8 {
                run.tail.remove(0);
            }
            match event["type"].as_str().unwrap_or_default() {
                "chat.input_request" if !said => {
                    ws.say("Automate my weekly social media posts").await;
                    said = true;
                }
                // A turn that failed (e.g. a tool interrupted by the node's death is reported,
                // never re-run) hands back to the user, who says it again.
                "chat.input_request" if errors_seen > errors_retried => {
                    errors_retried = errors_seen;
                    ws.say("Please continue").await;
                }
                "chat.tool_call" if event["data"]["awaiting_response"] == true => {
                    let corr = corr_of(&event);
                    seen_calls.push(corr.clone());
                    if let Some(mut go) = hold.take() {
                        let _ = go.wait_for(|go| *go).await;
                        break;
                    }
                    ws.send(answer(&corr)).await;
                }
                "chat.ack" if event["data"]["kind"] == "user_message" => said_acked = true,
                "chat.run_start" => said_acked = true,
                "chat.ack" if event["data"]["kind"] == "tool_response" => {
                    if let Some(corr) = event["data"]["client_msg_id"].as_str() {
                        answered.insert(corr.to_owned());
                    }
                }
                "chat.tool_response" => {
                    if let Some(corr) = event["data"]["corr"].as_str() {
                        answered.insert(corr.to_owned());
                    }
                }
                "chat.error" if event["data"]["code"] == "unknown_correlation" => {}
                // A command whose node died before answering: reconnect and send it again
                // (the owner refuses a duplicate).
                "chat.error" if seq == 0 && event["data"]["code"] == "internal" => break,
                "chat.error" => errors_seen += 1,
                // A resumed socket lists the UI calls still waiting, also one whose
                // announcement this client missed (published live by a node that died before
                // storing it, then announced again under an already-seen seq).
                "chat.resume_boundary" => {
                    let pending = event["data"]["pending_ui_calls"].as_array().cloned();
                    for call in pending.unwrap_or_default() {
                        let corr = call["corr"].as_str().unwrap_or_default().to_owned();
                        if !answered.contains(&corr) && !seen_calls.contains(&corr) {
                            seen_calls.push(corr.clone());
                            ws.send(answer(&corr)).await;
                        }
                    }
                }
                "chat.run_complete" => {
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

/// Asserts a client's view of a chat: seqs strictly one after the other from 1, across
/// reconnects (no gap, no duplicate).
fn assert_contiguous(chat: &str, run: &ChatRun) {
    for (i, seq) in run.seqs.iter().enumerate() {
        assert_eq!(
            *seq,
            i as u64 + 1,
            "chat {chat}: seq gap or duplicate in the client's view at position {i}: {:?}",
            run.seqs
        );
    }
}

/// Reads a chat's stored event log and counts each tool's responses: every tool ran once.
async fn assert_each_tool_ran_once(store: &PgStore, chat: &str) {
    let events = store
        .events_after(chat, 0, u32::MAX)
        .await
        .unwrap_or_else(|e| panic!("cannot read {chat}'s events: {e}"));
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, expected, "chat {chat}: the stored log has no gap");
    let mut responses: BTreeMap<String, u32> = BTreeMap::new();
    for event in events
        .iter()
        .filter(|e| e.event_type == "chat.tool_response")
    {
        let value: Value = serde_json::from_str(&event.json).unwrap_or(Value::Null);
        let tool = value["data"]["tool_name"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        *responses.entry(tool).or_default() += 1;
        assert_ne!(
            value["data"]["success"], false,
            "chat {chat}: a tool failed or was interrupted: {value}"
        );
    }
    assert!(!responses.is_empty(), "chat {chat}: no tool ran");
    for (tool, count) in &responses {
        assert_eq!(*count, 1, "chat {chat}: tool {tool} answered {count} times");
    }
}

#[tokio::test]
async fn a_chat_created_on_one_node_is_driven_through_another() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let Some(cluster) = Cluster::start("cluster_two_nodes", 2).await else {
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

    // Node B's view is the owner's: the same events, seq contiguous (checked by the client
    // on every event), and everything it saw is in the store in the same order.
    let store = cluster.store().await;
    let seen = ws.last_seq;
    let stored = stored_events(&store, &chat, seen, "the store to hold what B relayed").await;
    let relayed: Vec<u64> = ws
        .events
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|s| *s > 0)
        .collect();
    let expected: Vec<u64> = (1..=seen).collect();
    assert_eq!(relayed, expected, "B relayed every event once, in order");
    for event in ws
        .events
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap_or(0) > 0)
    {
        let seq = event["seq"].as_u64().unwrap_or(0) as usize;
        let stored: Value = serde_json::from_str(&stored[seq - 1].json).unwrap_or(Value::Null);
        assert_eq!(
            stored["type"], event["type"],
            "seq {seq} is the owner's event"
        );
    }

    // Another user cannot reach the chat through either node.
    assert!(
        WsClient::try_connect(&b.ws_url(&chat, 0), "mallory")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn chats_survive_a_node_killed_mid_run() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    const CHATS: usize = 300;
    let Some(mut cluster) = Cluster::start_with_ttl("cluster_kill_node", 3, BUSY_LEASE_TTL_S).await
    else {
        return;
    };
    let bases = Arc::new(cluster.bases());
    let mut chats = Vec::new();
    for i in 0..CHATS {
        let chat = cluster
            .node(i % 3)
            .create_chat("Generator", &format!("user{i}"))
            .await;
        chats.push((chat, format!("user{i}")));
    }
    // Clients connect to random nodes (here: a fixed spread, so each node serves remote and
    // local sockets); a client whose node dies reconnects to the next. The chats node 2 owns
    // wait at their first UI call (stored) when it is killed; the others keep running.
    let (go, held) = tokio::sync::watch::channel(false);
    let mut drivers = Vec::new();
    for (i, (chat, user)) in chats.iter().enumerate() {
        drivers.push(tokio::spawn(drive_generator(
            bases.clone(),
            chat.clone(),
            user.clone(),
            (i * 7 + 1) % 3,
            (i % 3 == 2).then(|| held.clone()),
        )));
    }
    let store = cluster.store().await;
    wait_until(
        "node 2's chats to wait for their first UI answer",
        Duration::from_secs(60),
        async || {
            for (chat, _) in chats.iter().skip(2).step_by(3) {
                if store.pending_ui(chat).await.map_or(true, |p| p.is_empty()) {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let victim = cluster.nodes[2]
        .take()
        .unwrap_or_else(|| panic!("node 2 missing"));
    let killed_at = Instant::now();
    let _ = victim.kill().await;
    let _ = go.send(true);
    // The victim's chats still running at the kill, with their stored log length then.
    let mut orphans = Vec::new();
    for (chat, _) in chats.iter().skip(2).step_by(3) {
        let events = store
            .events_after(chat, 0, u32::MAX)
            .await
            .unwrap_or_default();
        if !events.iter().any(|e| e.event_type == "chat.run_complete") {
            orphans.push((chat.clone(), events.len() as u64));
        }
    }
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
    let incomplete: Vec<(&String, &ChatRun)> = chats
        .iter()
        .zip(&runs)
        .filter(|(_, run)| !run.completed)
        .map(|((chat, _), run)| (chat, run))
        .collect();
    assert!(
        incomplete.is_empty(),
        "{} chats did not complete: {incomplete:?}",
        incomplete.len()
    );
    for ((chat, _), run) in chats.iter().zip(&runs) {
        assert_contiguous(chat, run);
        assert_each_tool_ran_once(&store, chat).await;
    }
    let reconnects: u32 = runs.iter().map(|r| r.reconnects).sum();
    let after_expiry = all_continued.saturating_sub(Duration::from_secs(BUSY_LEASE_TTL_S));
    eprintln!(
        "{CHATS} chats on 3 nodes, node 2 killed with {} chats running: all of them continued on another node {:.2} s after the kill ({:.2} s after lease expiry); {reconnects} client reconnects",
        orphans.len(),
        all_continued.as_secs_f64(),
        after_expiry.as_secs_f64(),
    );
    assert!(!orphans.is_empty(), "the kill came mid-run");
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
    let pid = a
        .pid()
        .unwrap_or_else(|| panic!("node A has no pid"))
        .to_string();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "kill {name} {pid}");
    };
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
    let on_b_seqs: Vec<u64> = on_b
        .events
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|s| *s > 0)
        .collect();
    for seq in on_b_seqs {
        let stored: Value =
            serde_json::from_str(&after[seq as usize - 1].json).unwrap_or(Value::Null);
        let live = on_b
            .events
            .iter()
            .find(|e| e["seq"] == seq)
            .cloned()
            .unwrap_or(Value::Null);
        assert_eq!(
            stored["type"], live["type"],
            "seq {seq} in the store is B's event"
        );
    }
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
