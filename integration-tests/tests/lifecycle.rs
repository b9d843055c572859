//! Data lifecycle against the real `tessera serve` binary: an owner deletes a chat (everything
//! stored for it goes), retention purges old completed chats, the per-tenant quota on
//! generated files, and a database written by a newer build is refused at start.

use std::process::Stdio;
use std::time::Duration;

use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::tessera_bin;
use integration_tests::wsclient::WsClient;
use serde_json::{Value, json};

const KEY: &str = "sk-LIFECYCLE-CANARY-0123456789";

fn answer(call: &Value, data: Value) -> Value {
    json!({"type": "chat.tool_response", "data": {
        "corr": call["data"]["corr"], "status": "success", "action": "submit", "data": data}})
}

/// Walks a Generator chat through the plan and the API key (which fills the chat's vault)
/// to the moment its bundle is generated.
async fn generator_past_the_key(server: &TestServer, user: &str) -> (String, WsClient) {
    let chat = server.create_chat("Generator", user).await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), user).await;
    ws.until("chat.input_request").await;
    ws.say("Automate my weekly social media posts").await;
    let plan = ws.until_ui_call().await;
    ws.send(answer(&plan, json!({"approved": true}))).await;
    let key = ws.until_ui_call().await;
    assert_eq!(key["data"]["component_type"], "AgentAPIKeyInput");
    ws.send(answer(
        &key,
        json!({"service": "openai", "apiKey": KEY, "keyLength": KEY.len()}),
    ))
    .await;
    (chat, ws)
}

/// Rows kept for `chat_id` in each table of the server's database, and (as
/// "chat_log of no chat") log rows whose chat is gone.
fn stored_rows(db: &std::path::Path, chat_id: &str) -> Vec<(&'static str, i64)> {
    let conn = rusqlite::Connection::open(db).unwrap_or_else(|e| panic!("{e}"));
    let count = |what: &str, query: &str| -> i64 {
        conn.query_row(query, [chat_id], |r| r.get(0))
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    };
    let mut rows: Vec<(&'static str, i64)> = [
        "chats",
        "chat_log",
        "pending_ui",
        "tool_invocations",
        "chat_secrets",
        "artifacts",
    ]
    .into_iter()
    .map(|table| {
        // The write-ordered tables are keyed by the chat's number, not its id.
        let query = if matches!(table, "chat_log" | "tool_invocations") {
            format!(
                "SELECT COUNT(*) FROM {table} WHERE chat_no = \
                 (SELECT chat_no FROM chat_numbers WHERE chat_id = ?1)"
            )
        } else {
            format!("SELECT COUNT(*) FROM {table} WHERE chat_id = ?1")
        };
        (table, count(table, &query))
    })
    .collect();
    // A deleted chat's number is gone too, so its log rows would count as no one's.
    rows.push((
        "chat_log of no chat",
        count(
            "orphans",
            "SELECT COUNT(*) FROM chat_log WHERE ?1 IS NOT NULL \
             AND chat_no NOT IN (SELECT chat_no FROM chat_numbers)",
        ),
    ));
    rows
}

/// Polls `check` until it returns true or `what` times out.
async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_owner_deletes_a_running_chat_with_everything_stored_for_it() {
    let server = TestServer::start(ServerOptions::default()).await;
    let (chat, mut ws) = generator_past_the_key(&server, "alice").await;
    let download = ws.until_ui_call().await;
    assert_eq!(download["data"]["component_type"], "FileDownloadCenter");
    let path = download["data"]["payload"]["files"][0]["download_path"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let (other, _other_ws) = generator_past_the_key(&server, "alice").await;
    let db = server.data_path().join("tessera.db");
    wait_for(
        "the chat's vault, file and tool records are stored",
        async || {
            let rows = stored_rows(&db, &chat);
            [
                "chat_secrets",
                "artifacts",
                "chat_log",
                "tool_invocations",
                "pending_ui",
            ]
            .iter()
            .all(|t| rows.iter().any(|(n, c)| n == t && *c > 0))
        },
    )
    .await;

    let (status, _) = server
        .delete(&format!("/api/v1/chats/{chat}"), "mallory")
        .await;
    assert_eq!(status, 404, "another user cannot delete the chat");
    let (status, _) = server.get(&format!("/api/v1/chats/{chat}"), "alice").await;
    assert_eq!(status, 200, "a refused delete deletes nothing");

    let (status, _) = server
        .delete(&format!("/api/v1/chats/{chat}"), "alice")
        .await;
    assert_eq!(status, 204);
    let (status, _) = server.get(&format!("/api/v1/chats/{chat}"), "alice").await;
    assert_eq!(status, 404);
    let (status, _) = server.get_bytes(&path, "alice").await;
    assert_eq!(status, 404, "the generated file is gone");
    let (status, _) = server
        .delete(&format!("/api/v1/chats/{chat}"), "alice")
        .await;
    assert_eq!(status, 404, "a second delete finds nothing");
    let (_, list) = server.get("/api/v1/chats", "alice").await;
    let listed: Vec<&str> = list["chats"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["chat_id"].as_str())
        .collect();
    assert!(!listed.contains(&chat.as_str()), "{list}");
    assert!(listed.contains(&other.as_str()), "other chats stay: {list}");
    for (table, n) in stored_rows(&db, &chat) {
        assert_eq!(n, 0, "{table} still holds rows of the deleted chat");
    }
    // Answering the stopped chat's UI call changes nothing and brings nothing back.
    ws.send(answer(&download, json!({"downloaded": true})))
        .await;
    let (status, _) = server.get(&format!("/api/v1/chats/{chat}"), "alice").await;
    assert_eq!(status, 404);
    let (status, _) = server.get(&format!("/api/v1/chats/{other}"), "alice").await;
    assert_eq!(status, 200, "the other chat is untouched");
    let (_, metrics) = server.get_bytes("/metrics", "alice").await;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("tessera_chats_deleted_total 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn retention_purges_completed_chats_and_keeps_open_ones() {
    let server = TestServer::start(ServerOptions {
        env: vec![
            // About a second: completed chats older than that are purged.
            (
                "TESSERA_RETENTION_COMPLETED_CHAT_DAYS".into(),
                "0.00001".into(),
            ),
            ("TESSERA_RETENTION_SWEEP_INTERVAL_S".into(), "0.2".into()),
        ],
        ..Default::default()
    })
    .await;
    let open = server.create_chat("TodoAssistant", "alice").await;
    let (done, mut ws) = generator_past_the_key(&server, "alice").await;
    let download = ws.until_ui_call().await;
    ws.send(answer(&download, json!({"downloaded": true})))
        .await;
    let complete = ws.until("chat.run_complete").await;
    assert_eq!(complete["data"]["reason"], "terminate");

    wait_for("the completed chat is purged", async || {
        server
            .get(&format!("/api/v1/chats/{done}"), "alice")
            .await
            .0
            == 404
    })
    .await;
    for (table, n) in stored_rows(&server.data_path().join("tessera.db"), &done) {
        assert_eq!(n, 0, "{table} still holds rows of the purged chat");
    }
    let (status, snap) = server.get(&format!("/api/v1/chats/{open}"), "alice").await;
    assert_eq!(status, 200, "an open chat is never purged: {snap}");
}

#[tokio::test]
async fn a_generated_file_over_the_tenant_quota_fails_the_tool_with_a_clear_error() {
    let server = TestServer::start(ServerOptions {
        env: vec![("TESSERA_MAX_FILE_BYTES_PER_TENANT".into(), "100".into())],
        ..Default::default()
    })
    .await;
    let (chat, mut ws) = generator_past_the_key(&server, "alice").await;
    let response = ws
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "generate_and_download"
        })
        .await;
    assert_eq!(response["data"]["success"], false, "{response}");
    let text = response["data"].to_string();
    assert!(
        text.contains("quota of 100 bytes"),
        "the model is told why: {text}"
    );
    let (status, snap) = server.get(&format!("/api/v1/chats/{chat}"), "alice").await;
    assert_eq!(status, 200, "the chat stays up: {snap}");
    let rows = stored_rows(&server.data_path().join("tessera.db"), &chat);
    assert!(
        rows.contains(&("artifacts", 0)),
        "nothing was stored: {rows:?}"
    );
}

#[tokio::test]
async fn serve_refuses_a_database_from_a_newer_build_with_a_clear_message() {
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = ServerOptions {
        data_dir: Some(data.path().to_path_buf()),
        ..Default::default()
    };
    let server = TestServer::start(options).await;
    let chat = server.create_chat("TodoAssistant", "alice").await;
    assert!(server.terminate().await, "clean shutdown");
    let db = data.path().join("tessera.db");
    let conn = rusqlite::Connection::open(&db).unwrap_or_else(|e| panic!("{e}"));
    conn.execute(
        "INSERT INTO schema_version (version, name, applied_at_ms) \
         SELECT MAX(version) + 1, 'from_a_newer_build', 0 FROM schema_version",
        [],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    drop(conn);

    let out = tokio::process::Command::new(tessera_bin())
        .args(["serve", "--bind", "127.0.0.1:0"])
        .env("TESSERA_DATA_DIR", data.path())
        .env(
            "TESSERA_WORKFLOWS_DIR",
            integration_tests::workspace_root().join("workflows"),
        )
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .unwrap_or_else(|_| panic!("serve did not exit on a newer database"))
        .unwrap_or_else(|e| panic!("{e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "serve must refuse to start: {stderr}"
    );
    assert!(
        stderr.contains("is newer than this build supports"),
        "{stderr}"
    );
    assert!(stderr.contains("upgrade this binary"), "{stderr}");
    let conn = rusqlite::Connection::open(&db).unwrap_or_else(|e| panic!("{e}"));
    let kept: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM chats WHERE chat_id = ?1",
            [&chat],
            |r| r.get(0),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(kept, 1, "refusing touches no data");
}
