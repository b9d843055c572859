//! A real `tessera serve` process on a random port, killed when dropped (pass or fail).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tessera_store::testing::PgTestSchema;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{tessera_bin, workspace_root};

/// A running server.
pub struct TestServer {
    child: Child,
    pub base: String,
    pub data_dir: tempfile::TempDir,
    http: reqwest::Client,
}

/// Extra settings for a server under test.
#[derive(Debug, Default, Clone)]
pub struct ServerOptions {
    pub env: Vec<(String, String)>,
    pub workflows_dir: Option<PathBuf>,
    /// Reuse this data dir (for restart tests).
    pub data_dir: Option<PathBuf>,
    /// A `tessera.toml` to pass with `--config` (e.g. tenants and JWT settings).
    pub config_toml: Option<String>,
    /// Append the server's log (stderr) to this file instead of the test's stderr, for tests
    /// that wait for a log line.
    pub stderr_file: Option<PathBuf>,
}

impl ServerOptions {
    /// These options with the chat store on a PostgreSQL schema of the test's own
    /// (`TESSERA_STORE_URL`); keep the schema alive while the server runs (it is dropped with
    /// it). `None` when no test database is configured: the test prints that it is skipped
    /// (and fails under `CI=true`).
    pub async fn on_postgres(mut self, test: &str) -> Option<(Self, PgTestSchema)> {
        let schema = PgTestSchema::create(test).await?;
        self.env.push(("TESSERA_STORE_URL".into(), schema.url()));
        Some((self, schema))
    }
}

impl TestServer {
    /// Starts `tessera serve --bind 127.0.0.1:0` with the shipped workflows and the demo model.
    pub async fn start(options: ServerOptions) -> TestServer {
        let data_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let data_path = options
            .data_dir
            .clone()
            .unwrap_or_else(|| data_dir.path().to_path_buf());
        let workflows = options
            .workflows_dir
            .clone()
            .unwrap_or_else(|| workspace_root().join("workflows"));
        let mut command = Command::new(tessera_bin());
        command
            .args(["serve", "--bind", "127.0.0.1:0"])
            .env("TESSERA_DATA_DIR", &data_path)
            .env("TESSERA_WORKFLOWS_DIR", &workflows)
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(path) = &options.stderr_file {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
            command.stderr(file);
        }
        for (k, v) in &options.env {
            command.env(k, v);
        }
        if let Some(toml) = &options.config_toml {
            let path = data_dir.path().join("tessera.toml");
            std::fs::write(&path, toml).unwrap_or_else(|e| panic!("write config: {e}"));
            command.arg("--config").arg(&path);
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start tessera: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let mut lines = BufReader::new(stdout).lines();
        let base = tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix("tessera listening on ") {
                    return Some(url.trim().to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("tessera did not report its address"));
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        TestServer {
            child,
            base,
            data_dir,
            http: reqwest::Client::new(),
        }
    }

    /// The server's process id (to send it signals).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends the signal `name` (`"-STOP"`, `"-CONT"`, `"-HUP"`, ...) to the server process;
    /// fails the test if it cannot be sent.
    pub fn signal(&self, name: &str) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("the server has no pid"))
            .to_string();
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "kill {name} {pid}");
    }

    /// The data dir in use (for restart tests).
    pub fn data_path(&self) -> &Path {
        self.data_dir.path()
    }

    /// `ws://…` URL of a chat's socket.
    pub fn ws_url(&self, chat_id: &str, last_seq: u64) -> String {
        format!(
            "{}/api/v1/chats/{chat_id}/ws?last_seq={last_seq}",
            self.base.replacen("http", "ws", 1)
        )
    }

    /// POST JSON as `user`; returns (status, body).
    pub async fn post(&self, path: &str, user: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header("x-user-id", user)
            .json(&body)
            .send()
            .await;
        read(response).await
    }

    /// GET as `user`; returns (status, body).
    pub async fn get(&self, path: &str, user: &str) -> (u16, Value) {
        read(
            self.http
                .get(format!("{}{path}", self.base))
                .header("x-user-id", user)
                .send()
                .await,
        )
        .await
    }

    /// DELETE as `user`; returns (status, body).
    pub async fn delete(&self, path: &str, user: &str) -> (u16, Value) {
        read(
            self.http
                .delete(format!("{}{path}", self.base))
                .header("x-user-id", user)
                .send()
                .await,
        )
        .await
    }

    /// The value of the counter or gauge `name` in `/metrics` (0 when absent).
    pub async fn metric(&self, name: &str) -> u64 {
        let (_, metrics) = self.get_bytes("/metrics", "metrics-reader").await;
        String::from_utf8_lossy(&metrics)
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// GET raw bytes as `user`.
    pub async fn get_bytes(&self, path: &str, user: &str) -> (u16, Vec<u8>) {
        match self
            .http
            .get(format!("{}{path}", self.base))
            .header("x-user-id", user)
            .send()
            .await
        {
            Ok(r) => (
                r.status().as_u16(),
                r.bytes().await.map(|b| b.to_vec()).unwrap_or_default(),
            ),
            Err(e) => panic!("request failed: {e}"),
        }
    }

    /// Creates a chat of `workflow` for `user`; returns its id.
    pub async fn create_chat(&self, workflow: &str, user: &str) -> String {
        let (status, body) = self
            .post(
                "/api/v1/chats",
                user,
                serde_json::json!({"workflow": workflow}),
            )
            .await;
        assert_eq!(status, 201, "create chat: {body}");
        body["chat_id"].as_str().unwrap_or_default().to_owned()
    }

    /// Sends SIGKILL and waits for the process to die.
    pub async fn kill(mut self) -> tempfile::TempDir {
        let _ = self.child.kill().await;
        self.data_dir
    }

    /// Sends SIGTERM and waits (bounded) for a clean exit; returns the exit success.
    pub async fn terminate(mut self) -> bool {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        matches!(tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await, Ok(Ok(s)) if s.success())
    }
}

async fn read(response: Result<reqwest::Response, reqwest::Error>) -> (u16, Value) {
    match response {
        Ok(r) => {
            let status = r.status().as_u16();
            let body = r.json::<Value>().await.unwrap_or(Value::Null);
            (status, body)
        }
        Err(e) => panic!("request failed: {e}"),
    }
}
