//! The SQLite backup recipe of `deploy/README.md` (`deploy/backup-sqlite.sh`): back up a
//! running server's data dir while chats write to it, start a fresh server on the restored
//! copy, and the chats resume where the backup caught them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::workspace_root;
use integration_tests::wsclient::WsClient;
use serde_json::json;

/// `true` when the `sqlite3` command is there; otherwise says the test is skipped, and fails
/// under `CI=true`.
fn have_sqlite3() -> bool {
    let found = std::process::Command::new("sqlite3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "sqlite3 is missing (apt-get install sqlite3)"
        );
        eprintln!("SKIPPED: sqlite3 is not installed");
    }
    found
}

#[tokio::test]
async fn backup_under_load_restores_into_a_fresh_data_dir_and_chats_resume() {
    if !have_sqlite3() {
        return;
    }
    let server = TestServer::start(ServerOptions::default()).await;
    // A chat waiting on a UI tool when the backup is taken.
    let waiting = server.create_chat("Generator", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&waiting, 0), "alice").await;
    ws.until("chat.input_request").await;
    ws.say("Automate my invoices").await;
    let plan = ws.until_ui_call().await;
    let corr = plan["data"]["corr"].as_str().unwrap_or_default().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, snap) = server
            .get(&format!("/api/v1/chats/{waiting}"), "alice")
            .await;
        if snap["status"] == "awaiting_tool" && snap["persisted_seq"] == snap["last_seq"] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never persisted: {snap}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Load: chats keep being created and written to while the backup runs.
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicUsize::new(0));
    let load = {
        let (base, stop, writes) = (server.base.clone(), stop.clone(), writes.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            while !stop.load(Ordering::Relaxed) {
                let created = http
                    .post(format!("{base}/api/v1/chats"))
                    .header("x-user-id", "loader")
                    .json(&json!({"workflow": "TodoAssistant"}))
                    .send()
                    .await;
                let Ok(created) = created else { continue };
                let body: serde_json::Value = created.json().await.unwrap_or_default();
                let Some(chat) = body["chat_id"].as_str() else {
                    continue;
                };
                let _ = http
                    .post(format!("{base}/api/v1/chats/{chat}/input"))
                    .header("x-user-id", "loader")
                    .json(&json!({"content": "Buy milk"}))
                    .send()
                    .await;
                writes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while writes.load(Ordering::Relaxed) < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the load never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let backups = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let restored = backups.path().join("restored");
    let out = tokio::process::Command::new("bash")
        .arg(workspace_root().join("deploy/backup-sqlite.sh"))
        .arg(server.data_path())
        .arg(&restored)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let during = writes.load(Ordering::Relaxed);
    assert!(
        out.status.success(),
        "backup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Keep writing a little after the backup, then stop: those writes are not in it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while writes.load(Ordering::Relaxed) < during + 3 {
        assert!(tokio::time::Instant::now() < deadline, "the load stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = load.await;
    drop(ws);
    let _ = server.kill().await;

    let server = TestServer::start(ServerOptions {
        data_dir: Some(restored.clone()),
        ..Default::default()
    })
    .await;
    let (status, snap) = server
        .get(&format!("/api/v1/chats/{waiting}"), "alice")
        .await;
    assert_eq!(status, 200, "the chat is in the backup: {snap}");
    assert_eq!(snap["status"], "awaiting_tool");
    assert_eq!(snap["pending_ui_calls"][0]["corr"], corr.as_str());
    let (_, list) = server.get("/api/v1/chats?limit=500", "loader").await;
    let loaded = list["chats"].as_array().map_or(0, Vec::len);
    assert!(
        loaded >= 5,
        "the chats written before the backup are there: {list}"
    );

    // The chat resumes: answering the restored UI call moves it on to the next step.
    let mut again = WsClient::connect(&server.ws_url(&waiting, 0), "alice").await;
    again
        .send(json!({"type": "chat.tool_response", "data": {
            "corr": corr, "status": "success", "action": "submit", "data": {"approved": true}}}))
        .await;
    let done = again
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "action_plan"
        })
        .await;
    assert_eq!(done["data"]["success"], true);
    let next = again.until_ui_call().await;
    assert_eq!(next["data"]["component_type"], "AgentAPIKeyInput");
}
