//! Hot reload with the real binary: after SIGHUP a valid change serves new chats while a
//! running chat keeps its version, an invalid change is refused and logged, and after a
//! restart each stored chat runs the version it started with.

use std::fs;
use std::path::Path;
use std::time::Duration;

use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::wsclient::WsClient;
use integration_tests::{copy_dir, workspace_root};

const V1_REPLY: &str = "Echoed your message.";
const V2_REPLY: &str = "Echoed by version two.";

fn sighup(server: &TestServer) {
    server.signal("-HUP");
}

/// Waits (with a deadline) until the log has `count` lines containing `needle`.
async fn wait_for_log(log: &Path, needle: &str, count: usize) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = fs::read_to_string(log).unwrap_or_default();
        if text.lines().filter(|l| l.contains(needle)).count() >= count {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {count}x {needle:?} in the server log:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `text` and returns EchoAgent's answer (the chat must be waiting for the user).
async fn echo(ws: &mut WsClient, text: &str) -> String {
    ws.say(text).await;
    let reply = ws
        .until_match("chat.text", |e| e["data"]["agent"] == "EchoAgent")
        .await;
    ws.until("chat.input_request").await;
    reply["data"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn open_chat(server: &TestServer, chat: &str) -> WsClient {
    let mut ws = WsClient::connect(&server.ws_url(chat, 0), "alice").await;
    ws.until("chat.resume_boundary").await;
    ws
}

#[tokio::test]
async fn sighup_reloads_valid_changes_for_new_chats_only_and_refuses_invalid_ones() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = tmp.path().join("workflows");
    let live = root.join("LoadTest");
    copy_dir(&workspace_root().join("workflows/LoadTest"), &live);
    let data = tmp.path().join("data");
    let log = tmp.path().join("server.log");
    let options = ServerOptions {
        workflows_dir: Some(root.clone()),
        data_dir: Some(data.clone()),
        stderr_file: Some(log.clone()),
        env: vec![("RUST_LOG".into(), "info,actix_server=warn".into())],
        ..Default::default()
    };
    let server = TestServer::start(options.clone()).await;

    let first = server.create_chat("LoadTest", "alice").await;
    let mut ws_first = open_chat(&server, &first).await;
    assert_eq!(echo(&mut ws_first, "one").await, V1_REPLY);

    // A valid change: the demo model answers differently.
    let demo = live.join("demo.json");
    let text = fs::read_to_string(&demo).unwrap_or_else(|e| panic!("{e}"));
    assert!(text.contains(V1_REPLY));
    fs::write(&demo, text.replace(V1_REPLY, V2_REPLY)).unwrap_or_else(|e| panic!("{e}"));
    sighup(&server);
    let logged = wait_for_log(&log, "workflow reload done", 1).await;
    assert!(logged.contains("workflow reloaded"), "{logged}");

    let second = server.create_chat("LoadTest", "alice").await;
    let mut ws_second = open_chat(&server, &second).await;
    assert_eq!(
        echo(&mut ws_second, "one").await,
        V2_REPLY,
        "a new chat gets v2"
    );
    assert_eq!(
        echo(&mut ws_first, "two").await,
        V1_REPLY,
        "the running chat keeps v1"
    );

    // An invalid change is refused, logged with its errors, and v2 stays.
    let agents = live.join("agents.json");
    let valid_agents = fs::read_to_string(&agents).unwrap_or_else(|e| panic!("{e}"));
    fs::write(&agents, "{ \"agents\": ").unwrap_or_else(|e| panic!("{e}"));
    sighup(&server);
    let logged = wait_for_log(&log, "workflow reload done", 2).await;
    assert!(logged.contains("workflow change refused"), "{logged}");
    assert!(
        logged.contains("agents.json"),
        "the errors are logged: {logged}"
    );
    let third = server.create_chat("LoadTest", "alice").await;
    let mut ws_third = open_chat(&server, &third).await;
    assert_eq!(echo(&mut ws_third, "one").await, V2_REPLY);

    // Restart on the same data dir (the live folder valid again, still v2): each stored chat
    // runs the version it started with.
    fs::write(&agents, valid_agents).unwrap_or_else(|e| panic!("{e}"));
    ws_first.close().await;
    ws_second.close().await;
    ws_third.close().await;
    assert!(server.terminate().await, "the server stops cleanly");
    let server = TestServer::start(options).await;
    let mut ws_first = open_chat(&server, &first).await;
    assert_eq!(
        echo(&mut ws_first, "three").await,
        V1_REPLY,
        "after a restart the first chat still runs v1"
    );
    let mut ws_second = open_chat(&server, &second).await;
    assert_eq!(echo(&mut ws_second, "two").await, V2_REPLY);
    let fresh = server.create_chat("LoadTest", "alice").await;
    let mut ws_fresh = open_chat(&server, &fresh).await;
    assert_eq!(echo(&mut ws_fresh, "one").await, V2_REPLY);
    ws_first.close().await;
    ws_second.close().await;
    ws_fresh.close().await;
    assert!(server.terminate().await);
}

#[tokio::test]
async fn with_a_watch_interval_a_saved_change_is_reloaded_without_a_signal() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = tmp.path().join("workflows");
    let live = root.join("LoadTest");
    copy_dir(&workspace_root().join("workflows/LoadTest"), &live);
    let log = tmp.path().join("server.log");
    let server = TestServer::start(ServerOptions {
        workflows_dir: Some(root),
        stderr_file: Some(log.clone()),
        env: vec![
            ("RUST_LOG".into(), "info,actix_server=warn".into()),
            ("TESSERA_WORKFLOWS_WATCH_S".into(), "0.1".into()),
        ],
        ..Default::default()
    })
    .await;
    let before = server.create_chat("LoadTest", "alice").await;
    let mut ws_before = open_chat(&server, &before).await;
    assert_eq!(echo(&mut ws_before, "one").await, V1_REPLY);

    let demo = live.join("demo.json");
    let text = fs::read_to_string(&demo).unwrap_or_else(|e| panic!("{e}"));
    fs::write(&demo, text.replace(V1_REPLY, V2_REPLY)).unwrap_or_else(|e| panic!("{e}"));
    let logged = wait_for_log(&log, "workflow reload done", 1).await;
    assert!(logged.contains("workflow files changed"), "{logged}");

    let after = server.create_chat("LoadTest", "alice").await;
    let mut ws_after = open_chat(&server, &after).await;
    assert_eq!(echo(&mut ws_after, "one").await, V2_REPLY);
    assert_eq!(echo(&mut ws_before, "two").await, V1_REPLY);
    ws_before.close().await;
    ws_after.close().await;
    assert!(server.terminate().await);
}
