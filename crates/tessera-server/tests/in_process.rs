//! The server as a library: started in-process on port 0 with `tessera_server::run`, used
//! over real HTTP, and stopped by its shutdown future (the real-binary tests live in
//! `integration-tests`).

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_server::ServerConfig;

#[actix::test]
async fn a_server_started_in_process_serves_runs_and_stops_on_its_shutdown_future() {
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let mut config =
        ServerConfig::load(None, |_| None).unwrap_or_else(|e| panic!("default config: {e}"));
    config.data_dir = data.path().to_path_buf();
    config.workflows_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workflows");
    config.llm.demo = true;
    config.http_workers = 1;
    let listener = tessera_server::bind("127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let base = format!(
        "http://{}",
        listener
            .local_addr()
            .unwrap_or_else(|e| panic!("local addr: {e}"))
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = actix::spawn(tessera_server::run(listener, config, async move {
        let _ = stopped.await;
    }));

    let http = reqwest::Client::new();
    let run = http
        .post(format!("{base}/api/v1/run"))
        .header("X-User-Id", "alice")
        .json(&json!({"workflow": "TodoAssistant", "message": "Buy milk"}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /run: {e}"));
    assert_eq!(run.status(), 200);
    let run: Value = run.json().await.unwrap_or_default();
    assert_eq!(run["tools_used"], json!(["add_task"]), "{run}");
    assert!(
        run["response"]
            .as_str()
            .unwrap_or_default()
            .contains("Buy milk"),
        "{run}"
    );

    let _ = stop.send(());
    let finished = tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .unwrap_or_else(|_| panic!("the server did not stop on its shutdown future"));
    assert!(
        matches!(finished, Ok(Ok(()))),
        "run ended with {finished:?}"
    );
    let refused = http.get(format!("{base}/healthz")).send().await;
    assert!(refused.is_err(), "the listener is closed after shutdown");
}
