//! Server configuration: one TOML file plus `TESSERA_*` environment overrides. Every field has
//! a default, so `tessera serve` runs with no file at all.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    pub bind: SocketAddr,
    /// Where the SQLite database and generated files live.
    pub data_dir: PathBuf,
    /// Folder of workflow folders.
    pub workflows_dir: PathBuf,
    pub llm: LlmConfig,
    pub limits: Limits,
    /// Tenants and their API keys; empty means dev mode (one default tenant, no key).
    pub tenants: Vec<TenantConfig>,
    /// HTTP worker threads; 0 means one per core.
    pub http_workers: usize,
}

/// Which model chats use.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// OpenAI-compatible base URL; `OPENAI_BASE_URL` overrides it.
    pub base_url: Option<String>,
    /// Default model name; `OPENAI_MODEL` overrides it.
    pub model: Option<String>,
    /// Force the offline scripted demo model even when an endpoint is configured.
    pub demo: bool,
    /// Stream tokens to clients.
    pub stream: bool,
    /// Request timeout in seconds.
    pub timeout_s: f64,
}

/// Protective limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest text frame a client may send, in bytes; larger ones get `frame_too_large`.
    pub max_frame_bytes: usize,
    /// Client messages per minute per connection.
    pub messages_per_minute: u32,
    /// Default wait for a UI tool answer, in seconds (0 waits until cancelled).
    pub ui_timeout_s: f64,
    /// Events queued for one slow WebSocket client before it is disconnected.
    pub outbound_queue: usize,
    /// Seconds without a pong before a WebSocket is closed.
    pub idle_timeout_s: u64,
    /// Agent tool time limit in seconds.
    pub tool_timeout_s: f64,
}

/// One tenant.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub id: String,
    /// SHA-256 hex digests of the tenant's API keys (never the keys themselves).
    #[serde(default)]
    pub api_key_sha256: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("data"),
            workflows_dir: PathBuf::from("workflows"),
            llm: LlmConfig::default(),
            limits: Limits::default(),
            tenants: Vec::new(),
            http_workers: 0,
        }
    }
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            base_url: None,
            model: None,
            demo: false,
            stream: true,
            timeout_s: 60.0,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 64 * 1024,
            messages_per_minute: 120,
            ui_timeout_s: 900.0,
            outbound_queue: 1024,
            idle_timeout_s: 60,
            tool_timeout_s: 12.0,
        }
    }
}

impl Limits {
    /// The UI wait as a duration (`None` = no timeout).
    pub fn ui_timeout(&self) -> Option<Duration> {
        (self.ui_timeout_s > 0.0).then(|| Duration::from_secs_f64(self.ui_timeout_s))
    }
}

impl ServerConfig {
    /// Reads `path` (if given) and applies `TESSERA_*` overrides from `env`.
    pub fn load(path: Option<&Path>, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let mut config = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read config file {}", path.display()))?;
                toml::from_str(&text)
                    .with_context(|| format!("invalid config file {}", path.display()))?
            }
            None => Self::default(),
        };
        if let Some(v) = env("TESSERA_BIND") {
            config.bind = v.parse().with_context(|| {
                format!("TESSERA_BIND={v:?} is not an address like 127.0.0.1:8080")
            })?;
        }
        if let Some(v) = env("TESSERA_DATA_DIR") {
            config.data_dir = PathBuf::from(v);
        }
        if let Some(v) = env("TESSERA_WORKFLOWS_DIR") {
            config.workflows_dir = PathBuf::from(v);
        }
        if let Some(v) = env("TESSERA_DEMO") {
            config.llm.demo = matches!(v.as_str(), "1" | "true" | "yes");
        }
        if let Some(v) = env("TESSERA_STREAM") {
            config.llm.stream = matches!(v.as_str(), "1" | "true" | "yes");
        }
        if let Some(v) = env("TESSERA_UI_TIMEOUT_S") {
            config.limits.ui_timeout_s = v
                .parse()
                .with_context(|| format!("TESSERA_UI_TIMEOUT_S={v:?} is not a number"))?;
        }
        if let Some(v) = env("TESSERA_MAX_FRAME_BYTES") {
            config.limits.max_frame_bytes = v
                .parse()
                .with_context(|| format!("TESSERA_MAX_FRAME_BYTES={v:?} is not a number"))?;
        }
        if let Some(v) = env("TESSERA_MESSAGES_PER_MINUTE") {
            config.limits.messages_per_minute = v
                .parse()
                .with_context(|| format!("TESSERA_MESSAGES_PER_MINUTE={v:?} is not a number"))?;
        }
        if let Some(v) = env("TESSERA_HTTP_WORKERS") {
            config.http_workers = v
                .parse()
                .with_context(|| format!("TESSERA_HTTP_WORKERS={v:?} is not a number"))?;
        }
        if let Some(v) = env("OPENAI_BASE_URL") {
            config.llm.base_url = Some(v);
        }
        if let Some(v) = env("OPENAI_MODEL") {
            config.llm.model = Some(v);
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_then_env_overrides() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("tessera-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("tessera.toml");
        std::fs::write(
            &path,
            "bind = \"127.0.0.1:9000\"\n[limits]\nmax_frame_bytes = 100\n",
        )?;
        let config = ServerConfig::load(Some(&path), |k| {
            (k == "TESSERA_BIND").then(|| "127.0.0.1:9001".to_owned())
        })?;
        assert_eq!(config.bind.port(), 9001);
        assert_eq!(config.limits.max_frame_bytes, 100);
        assert_eq!(config.limits.messages_per_minute, 120);
        Ok(())
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let bad = ServerConfig::load(None, |k| (k == "TESSERA_BIND").then(|| "nope".to_owned()));
        assert!(bad.is_err());
        let parsed: Result<ServerConfig, _> = toml::from_str("bindd = \"x\"");
        assert!(parsed.is_err());
    }
}
