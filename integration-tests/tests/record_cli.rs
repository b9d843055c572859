//! `tessera record`: a Generator chat that collected an API key through the vault, recorded
//! from the real server's store, gives a test file without the key that replays green.

use std::fs;
use std::process::Command;

use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::wsclient::WsClient;
use integration_tests::{copy_dir, tessera_bin, workspace_root};
use serde_json::{Value, json};

const SECRET: &str = "sk-RECORD-CANARY-91f3a2b4c5d6";

fn answer(call: &Value, data: Value) -> Value {
    json!({"type": "chat.tool_response", "data": {
        "corr": call["data"]["corr"], "status": "success", "action": "submit", "data": data}})
}

#[tokio::test]
async fn a_recorded_chat_with_a_secret_replays_without_it() {
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let server = TestServer::start(ServerOptions {
        data_dir: Some(data.path().to_path_buf()),
        ..Default::default()
    })
    .await;
    let chat = server.create_chat("Generator", "alice").await;
    let mut ws = WsClient::connect(&server.ws_url(&chat, 0), "alice").await;
    ws.until("chat.input_request").await;
    ws.say("Automate my weekly social media posts").await;
    let plan = ws.until_ui_call().await;
    ws.send(answer(&plan, json!({"approved": true}))).await;
    let key = ws.until_ui_call().await;
    assert_eq!(key["data"]["tool_name"], "request_api_key");
    ws.send(answer(&key, json!({"service": "openai", "apiKey": SECRET})))
        .await;
    let download = ws.until_ui_call().await;
    assert_eq!(download["data"]["tool_name"], "generate_and_download");
    ws.close().await;
    assert!(server.terminate().await, "the server stops cleanly");

    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let workflow = tmp.path().join("Generator");
    copy_dir(&workspace_root().join("workflows/Generator"), &workflow);
    let out = workflow.join("tests/recorded.json");
    let recorded = Command::new(tessera_bin())
        .args(["record", &chat, "--out"])
        .arg(&out)
        .env("TESSERA_DATA_DIR", data.path())
        .env("TESSERA_WORKFLOWS_DIR", workspace_root().join("workflows"))
        .env_remove("TESSERA_CONFIG")
        .output()
        .unwrap_or_else(|e| panic!("cannot run tessera: {e}"));
    assert!(
        recorded.status.success(),
        "{}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    let text = fs::read_to_string(&out).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        !text.contains(SECRET),
        "the secret leaked into the test file"
    );
    assert!(!text.contains("RECORD-CANARY"), "part of the secret leaked");
    let test: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    let steps = test["steps"].as_array().cloned().unwrap_or_default();
    assert_eq!(steps.len(), 3, "{text}");
    assert_eq!(steps[0]["user"], "Automate my weekly social media posts");
    assert_eq!(steps[2]["answer"]["tool"], "request_api_key");
    assert_eq!(
        steps[2]["answer"]["data"]["apiKey"],
        "*".repeat(SECRET.len()),
        "the secret is a placeholder of the same length"
    );
    assert_eq!(test["expect"]["status"], "awaiting_tool");
    assert!(test["model"]["agents"]["ContextAgent"].is_array(), "{text}");

    // The recorded chat replays through the engine and matches what the server did.
    let replay = Command::new(tessera_bin())
        .arg("test")
        .arg(&workflow)
        .output()
        .unwrap_or_else(|e| panic!("cannot run tessera: {e}"));
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert!(replay.status.success(), "{stdout}");
    assert!(
        stdout.contains("PASS     Generator/tests/recorded.json"),
        "{stdout}"
    );

    // Recording over an existing file is refused.
    let again = Command::new(tessera_bin())
        .args(["record", &chat, "--out"])
        .arg(&out)
        .env("TESSERA_DATA_DIR", data.path())
        .env("TESSERA_WORKFLOWS_DIR", workspace_root().join("workflows"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run tessera: {e}"));
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
}
