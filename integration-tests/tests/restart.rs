//! Durability of the real server: SIGKILL while a chat waits on a UI tool, start again on the
//! same data dir, and the chat is still there, the pending call answerable once, the event log
//! continuous, and no tool has run twice. The `on_postgres_` tests run the same on a server
//! whose `store.url` is PostgreSQL.

use std::time::Duration;

use integration_tests::mock_llm::MockLlm;
use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::wsclient::WsClient;
use serde_json::{Value, json};
use tessera_store::testing::PgTestSchema;
use tessera_store::{ChatStore, PgStore, SqliteStore};

fn answer(corr: &str) -> Value {
    json!({"type": "chat.tool_response", "data": {"corr": corr, "status": "success", "action": "submit", "data": {}}})
}

/// Options for a server that restarts on the same data: a data dir that outlives it, and,
/// on PostgreSQL, the test's schema (kept alive by the returned guard).
async fn restartable(
    test: &str,
    postgres: bool,
) -> Option<(ServerOptions, tempfile::TempDir, Option<PgTestSchema>)> {
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = ServerOptions {
        data_dir: Some(data.path().to_path_buf()),
        ..Default::default()
    };
    if !postgres {
        return Some((options, data, None));
    }
    let (options, schema) = options.on_postgres(test).await?;
    Some((options, data, Some(schema)))
}

/// A server on `options`, and a Generator chat of alice's that was told `message`, with its
/// socket.
async fn generator_chat_told(
    options: ServerOptions,
    message: &str,
) -> (TestServer, String, WsClient) {
    let server = TestServer::start(options).await;
    let chat = server.create_chat("Generator", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    ws.until("chat.input_request").await;
    ws.say(message).await;
    (server, chat, ws)
}

/// Polls alice's chat `chat` (`GET /api/v1/chats/{chat}`) until `reached` holds for it; fails
/// the test, naming `what`, after 10 s. Writes go to the store behind the session, so a test
/// that kills the server waits here for what it needs stored.
async fn until_snapshot(
    server: &TestServer,
    chat: &str,
    what: &str,
    reached: impl Fn(&Value) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, snap) = server.get(&format!("/api/v1/chats/{chat}"), "alice").await;
        if reached(&snap) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "chat never reached: {what}: {snap}"
        );
        tokio::task::yield_now().await;
    }
}

/// On PostgreSQL nothing may have gone to a SQLite file in the data dir.
fn assert_no_sqlite_file(data: &tempfile::TempDir, schema: &Option<PgTestSchema>) {
    if schema.is_some() {
        assert!(
            !data.path().join("tessera.db").exists(),
            "store.url = postgres:// must not write the SQLite file"
        );
    }
}

#[tokio::test]
async fn sigkill_during_a_ui_wait_then_restart_resumes_the_chat_exactly_once() {
    sigkill_during_a_ui_wait(false).await;
}

#[tokio::test]
async fn on_postgres_sigkill_during_a_ui_wait_then_restart_resumes_the_chat_exactly_once() {
    sigkill_during_a_ui_wait(true).await;
}

async fn sigkill_during_a_ui_wait(postgres: bool) {
    let Some((options, data, schema)) = restartable("sigkill_during_a_ui_wait", postgres).await
    else {
        return;
    };
    let (server, chat, mut ws) = generator_chat_told(options.clone(), "Automate my invoices").await;
    let plan = ws.until_ui_call().await;
    let corr = plan["data"]["corr"].as_str().unwrap_or_default().to_owned();
    let seen = ws.last_seq;
    // Writes go to the store behind the session; wait until it holds the whole log
    // (the state is written in the same batch, after the events).
    until_snapshot(
        &server,
        &chat,
        "awaiting_tool with its whole log stored",
        |snap| {
            snap["status"] == "awaiting_tool"
                && snap["persisted_seq"] == snap["last_seq"]
                && snap["last_seq"] == seen
        },
    )
    .await;
    let _ = server.kill().await;

    let server = TestServer::start(options).await;
    let (status, snap) = server.get(&format!("/api/v1/chats/{chat}"), "alice").await;
    assert_eq!(status, 200, "the chat survived the crash: {snap}");
    assert_eq!(snap["status"], "awaiting_tool");
    assert_eq!(snap["pending_ui_calls"][0]["corr"], corr.as_str());
    assert_eq!(snap["last_seq"], seen);
    let (status, _) = server
        .get(&format!("/api/v1/chats/{chat}"), "mallory")
        .await;
    assert_eq!(status, 404, "ownership survives the restart");

    let mut again = WsClient::connect(&server.ws_url(&chat, seen), "alice").await;
    again.last_seq = seen;
    let boundary = again.until("chat.resume_boundary").await;
    assert_eq!(
        boundary["data"]["pending_ui_calls"][0]["corr"],
        corr.as_str()
    );
    again.send(answer(&corr)).await;
    let done = again
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "action_plan"
        })
        .await;
    assert_eq!(done["data"]["success"], true);
    assert_eq!(
        done["seq"],
        seen + 1,
        "the log continues with no gap and no reused seq"
    );
    let next = again.until_ui_call().await;
    assert_eq!(
        next["data"]["component_type"], "AgentAPIKeyInput",
        "the workflow continues after the restart"
    );
    again.send(answer(&corr)).await;
    let refused = again.until("chat.error").await;
    assert_eq!(
        refused["data"]["code"], "unknown_correlation",
        "the answer is accepted once"
    );

    // The full log, replayed from the start, shows each tool announced and answered once.
    let mut full = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    full.until("chat.resume_boundary").await;
    let calls = full
        .of("chat.tool_call")
        .iter()
        .filter(|e| e["data"]["tool_name"] == "action_plan")
        .count();
    let responses = full
        .of("chat.tool_response")
        .iter()
        .filter(|e| e["data"]["tool_name"] == "action_plan")
        .count();
    assert_eq!(
        (calls, responses),
        (2, 1),
        "one auto-tool announcement + one UI call, one response"
    );
    assert_no_sqlite_file(&data, &schema);
}

#[tokio::test]
async fn sigkill_in_mid_stream_then_restart_reuses_no_seq_a_client_saw() {
    sigkill_in_mid_stream(false).await;
}

#[tokio::test]
async fn on_postgres_sigkill_in_mid_stream_then_restart_reuses_no_seq_a_client_saw() {
    sigkill_in_mid_stream(true).await;
}

/// A single node stores no streamed delta, only a mark of the seqs they take: killed while
/// the model streams, the chat comes back above every seq its client saw, and the re-run
/// turn's events reach the resumed client with higher seqs (a client skips seqs it has seen,
/// so a reused one would hide the answer).
async fn sigkill_in_mid_stream(postgres: bool) {
    let Some((options, data, schema)) = restartable("sigkill_in_mid_stream", postgres).await else {
        return;
    };
    // 60 words, one every 50 ms: three seconds of stream to kill the server in.
    let mock = MockLlm::start_paced_answer(50, 60).await;
    let mut options = options;
    options.env.extend(mock.options().env);
    let server = TestServer::start(options.clone()).await;
    let chat = server.create_chat("TodoAssistant", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    ws.until("chat.resume_boundary").await;
    ws.say("Buy milk").await;
    let first = ws.until("chat.text_delta").await;
    let first_seq = first["seq"].as_u64().unwrap_or(u64::MAX);
    ws.until("chat.text_delta").await;
    let seen = ws.last_seq;
    // The mark that covers the stream's seqs left with the first flush after its first delta;
    // the store holds it once it has caught up to that delta.
    until_snapshot(
        &server,
        &chat,
        "the store caught up with the stream",
        |snap| snap["persisted_seq"].as_u64().unwrap_or(0) >= first_seq,
    )
    .await;
    let _ = server.kill().await;
    assert!(
        ws.of("chat.text")
            .iter()
            .all(|t| t["data"]["agent"] != "TodoAgent"),
        "the server must die in mid-stream: {:?}",
        ws.types()
    );

    let server = TestServer::start(options).await;
    let (status, snap) = server.get(&format!("/api/v1/chats/{chat}"), "alice").await;
    assert_eq!(status, 200, "the chat survived the crash: {snap}");
    assert!(
        snap["last_seq"].as_u64().unwrap_or(0) >= seen,
        "the rebuilt chat continues above seq {seen}: {snap}"
    );
    let mut again = WsClient::connect(&server.ws_url(&chat, seen), "alice").await;
    again.last_seq = seen;
    let words = again.until_turn_run_again_above(seen, "TodoAgent").await;
    assert_eq!(words, 60, "the re-run turn's whole answer");
    assert_no_sqlite_file(&data, &schema);
}

#[tokio::test]
async fn a_completed_chat_stays_readable_after_a_restart() {
    completed_chat_after_a_restart(false).await;
}

#[tokio::test]
async fn on_postgres_a_completed_chat_stays_readable_after_a_restart() {
    completed_chat_after_a_restart(true).await;
}

async fn completed_chat_after_a_restart(postgres: bool) {
    let Some((options, data, schema)) =
        restartable("completed_chat_after_a_restart", postgres).await
    else {
        return;
    };
    let (server, chat, mut ws) =
        generator_chat_told(options.clone(), "Automate my garden watering").await;
    for _ in 0..3 {
        let call = ws.until_ui_call().await;
        ws.send(answer(call["data"]["corr"].as_str().unwrap_or_default()))
            .await;
    }
    let complete = ws.until("chat.run_complete").await;
    assert_eq!(complete["data"]["reason"], "terminate");
    until_snapshot(
        &server,
        &chat,
        "completed with its whole log stored",
        |snap| snap["status"] == "completed" && snap["persisted_seq"] == snap["last_seq"],
    )
    .await;
    let _ = server.kill().await;

    // Completed chats are not rehydrated at start; they are rebuilt when their owner asks.
    let server = TestServer::start(options).await;
    // ...but they are listed from the store, before anyone asks for them.
    let (status, list) = server.get("/api/v1/chats", "alice").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["chats"][0]["chat_id"], chat.as_str(), "{list}");
    assert_eq!(list["chats"][0]["status"], "completed", "{list}");
    assert_eq!(list["chats"][0]["workflow"], "Generator", "{list}");
    let (_, others) = server.get("/api/v1/chats", "mallory").await;
    assert_eq!(others["chats"], json!([]), "{others}");
    let (status, _) = server
        .get(&format!("/api/v1/chats/{chat}/messages"), "mallory")
        .await;
    assert_eq!(status, 404, "ownership holds for restored chats too");
    let (status, messages) = server
        .get(&format!("/api/v1/chats/{chat}/messages?limit=500"), "alice")
        .await;
    assert_eq!(status, 200, "{messages}");
    assert!(
        messages.to_string().contains("Automate my garden watering"),
        "{messages}"
    );
    let (_, snap) = server.get(&format!("/api/v1/chats/{chat}"), "alice").await;
    assert_eq!(snap["status"], "completed");
    assert_no_sqlite_file(&data, &schema);
}

#[tokio::test]
async fn sigterm_shuts_down_cleanly() {
    let server = TestServer::start(ServerOptions::default()).await;
    let chat = server.create_chat("TodoAssistant", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    ws.until("chat.input_request").await;
    assert!(server.terminate().await, "tessera exits 0 on SIGTERM");
    // The socket is closed by the server (going away), not left hanging.
    let mut closed = false;
    for _ in 0..50 {
        if ws.next().await.is_none() {
            closed = true;
            break;
        }
    }
    assert!(closed, "the socket was closed on shutdown");
}

#[tokio::test]
async fn sigterm_stores_every_event_clients_saw_before_exiting() {
    sigterm_stores_what_clients_saw(false).await;
}

#[tokio::test]
async fn on_postgres_sigterm_stores_every_event_clients_saw_before_exiting() {
    sigterm_stores_what_clients_saw(true).await;
}

/// A clean shutdown right after a burst of events (no waiting for the store, unlike the
/// SIGKILL test): the chat's writes queued behind its last flush reach the store before the
/// process exits, so the store holds every event the client saw.
async fn sigterm_stores_what_clients_saw(postgres: bool) {
    let Some((options, data, schema)) =
        restartable("sigterm_stores_what_clients_saw", postgres).await
    else {
        return;
    };
    let (server, chat, mut ws) = generator_chat_told(options, "Automate my invoices").await;
    // Through three UI calls: the last one is announced while the flush before it is still
    // on its way to the store (the case a shutdown used to lose).
    let plan = ws.until_ui_call().await;
    ws.send(answer(plan["data"]["corr"].as_str().unwrap_or_default()))
        .await;
    let key = ws.until_ui_call().await;
    let corr = key["data"]["corr"].clone();
    ws.send(
        json!({"type": "chat.tool_response", "data": {"corr": corr, "status": "success",
        "action": "submit", "data": {"service": "openai", "apiKey": "sk-test-0123456789"}}}),
    )
    .await;
    let last = ws.until_ui_call().await;
    assert_eq!(last["data"]["tool_name"], "generate_and_download");
    let seen = ws.last_seq;
    ws.close().await;
    assert!(server.terminate().await, "tessera exits 0 on SIGTERM");

    // Read the store itself: a restarted server would re-run the interrupted turn and
    // announce the call again, hiding a lost event.
    let store: Box<dyn ChatStore> = match &schema {
        Some(schema) => Box::new(
            PgStore::connect_with(schema.options())
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        ),
        None => Box::new(
            SqliteStore::open(&data.path().join("tessera.db"))
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        ),
    };
    let stored = store
        .events_after(&chat, 0, u32::MAX)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let last_stored = stored.last().map(|e| (e.seq, &*e.event_type));
    assert_eq!(
        last_stored,
        Some((seen, "chat.tool_call")),
        "the store holds every event the client saw, the last UI call included"
    );
    let json: Value =
        serde_json::from_str(&stored[stored.len() - 1].json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(json["data"]["corr"], last["data"]["corr"]);
    drop(store);
    assert_no_sqlite_file(&data, &schema);
}
