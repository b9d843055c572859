//! The real `tessera-loadgen mock-llm`: an OpenAI-compatible server on a random port that
//! calls the first tool offered, then answers (streamed).

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::loadgen_bin;
use crate::server::ServerOptions;

/// A running `tessera-loadgen mock-llm --port 0`, killed when dropped.
pub struct MockLlm {
    _child: Child,
    /// The OpenAI-compatible base URL (`http://ADDR/v1`).
    pub base_url: String,
}

impl MockLlm {
    /// Starts the mock (streaming, no added latency) and waits for its address.
    pub async fn start() -> MockLlm {
        Self::start_with_latency(0).await
    }

    /// Starts the mock answering every request after `latency_ms` (a timer in the mock), so
    /// that a test can catch chats in the middle of a model call.
    pub async fn start_with_latency(latency_ms: u64) -> MockLlm {
        Self::start_with(&["--latency-ms", &latency_ms.to_string()]).await
    }

    /// Starts the mock streaming its answers one word every `interval_ms`, as a model that
    /// streams token by token does.
    pub async fn start_paced(interval_ms: u64) -> MockLlm {
        Self::start_with(&["--token-interval-ms", &interval_ms.to_string()]).await
    }

    /// Starts the mock streaming an answer of `words` words (`--answer-words`) one word every
    /// `interval_ms`: a stream long enough to catch in the middle.
    pub async fn start_paced_answer(interval_ms: u64, words: u32) -> MockLlm {
        let interval = interval_ms.to_string();
        let words = words.to_string();
        Self::start_with(&["--token-interval-ms", &interval, "--answer-words", &words]).await
    }

    /// Starts the streaming mock with these options of `mock-llm` added.
    async fn start_with(options: &[&str]) -> MockLlm {
        let mut child = Command::new(loadgen_bin())
            .args(["mock-llm", "--port", "0", "--stream"])
            .args(options)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the mock LLM: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let mut lines = BufReader::new(stdout).lines();
        let base = tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix("mock-llm listening on ") {
                    return Some(url.trim().to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("the mock LLM did not report its address"));
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        MockLlm {
            _child: child,
            base_url: format!("{base}/v1"),
        }
    }

    /// Server options pointing `tessera serve` at this mock.
    pub fn options(&self) -> ServerOptions {
        ServerOptions {
            env: vec![
                ("OPENAI_BASE_URL".into(), self.base_url.clone()),
                ("OPENAI_API_KEY".into(), "test".into()),
            ],
            ..Default::default()
        }
    }
}
