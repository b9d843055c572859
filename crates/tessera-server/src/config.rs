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
    /// Where the SQLite database (unless `store.url` says otherwise) and generated files live.
    pub data_dir: PathBuf,
    /// Which database keeps the chats.
    pub store: StoreConfig,
    /// Folder of workflow folders.
    pub workflows_dir: PathBuf,
    /// Check the workflows dir for changed files this often, in seconds, and reload them as
    /// on SIGHUP; 0 (the default) leaves reloading to SIGHUP alone.
    pub workflows_watch_s: f64,
    pub llm: LlmConfig,
    pub limits: Limits,
    /// Tenants and their API keys; empty (and no JWT) means dev mode (one tenant, no key).
    pub tenants: Vec<TenantConfig>,
    /// HTTP (and WebSocket) worker threads; 0 means one per core.
    pub http_workers: usize,
    /// Engine threads (actix arbiters) the chats are spread over; 0 means one per core.
    pub engine_threads: usize,
    /// JWTs, browser origins and WebSocket tickets.
    pub auth: AuthConfig,
    /// The key that encrypts the chats' secret vaults at rest.
    pub secrets: SecretsConfig,
    /// How long finished chats are kept.
    pub retention: RetentionConfig,
    /// Several nodes as one service (absent `nats_url`: one node, no leases, no NATS).
    pub cluster: ClusterConfig,
}

/// Purging of finished chats (transcript, events, vault, files, tool records).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Completed chats not updated for this many days are deleted; 0 (the default) keeps
    /// them forever. Fractions are allowed (0.5 = twelve hours).
    pub completed_chat_days: f64,
    /// How often the purge runs, in seconds.
    pub sweep_interval_s: f64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            completed_chat_days: 0.0,
            sweep_interval_s: 3600.0,
        }
    }
}

/// Cluster mode: chats owned by leases in PostgreSQL, routed between nodes over NATS. See
/// ARCHITECTURE.md, "Several nodes".
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// NATS server (`TESSERA_NATS_URL`); `None` = single node, today's behaviour.
    pub nats_url: Option<String>,
    /// This node's id in lease rows (`TESSERA_NODE_ID`); default: host name + random suffix.
    pub node_id: Option<String>,
    /// Lease time to live in seconds; renewed every third of it, taken over after expiry.
    pub lease_ttl_s: u64,
    /// First token of every NATS subject of the deployment (`TESSERA_NATS_PREFIX`), so
    /// deployments sharing one NATS server never see each other's traffic.
    pub subject_prefix: String,
    /// A client's socket that reaches a node other than its chat's owner takes the chat over
    /// when nobody on the owner watches it and it waits on its user
    /// (`TESSERA_HAND_OVER_SOCKETS`): the chat then runs where its socket is, instead of
    /// crossing NATS for every event and command. Off: the socket is served over NATS.
    pub hand_over_sockets: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            nats_url: None,
            node_id: None,
            lease_ttl_s: 10,
            subject_prefix: "tessera".to_owned(),
            hand_over_sockets: true,
        }
    }
}

impl RetentionConfig {
    /// The age after which a completed chat is purged (`None` = kept forever).
    pub fn max_age(&self) -> Option<Duration> {
        (self.completed_chat_days > 0.0)
            .then(|| Duration::from_secs_f64(self.completed_chat_days * 86_400.0))
    }
}

impl ClusterConfig {
    /// True when several nodes share the work.
    pub fn enabled(&self) -> bool {
        self.nats_url.is_some()
    }

    /// The configured node id, or the host name plus a random suffix (unique per process, so
    /// a restarted node never mistakes its predecessor's leases for its own). An empty id is
    /// not taken: it is what a parked lease names (`tessera_store::PARKED_NODE`).
    pub fn node_id(&self) -> String {
        let configured = self.node_id.clone().filter(|id| !id.trim().is_empty());
        configured.unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .ok()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "node".to_owned());
            let suffix = uuid::Uuid::new_v4().simple().to_string();
            format!("{host}-{}", &suffix[..8])
        })
    }

    /// The lease TTL (at least one second).
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_s.max(1))
    }
}

/// The chat store: `url` is `sqlite://PATH` (embedded, one node; the default is
/// `sqlite://<data_dir>/tessera.db`) or `postgres://user[:password]@host[:port]/database`
/// (shared by several nodes).
#[derive(Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `TESSERA_STORE_URL` overrides it.
    pub url: Option<String>,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &self.url.as_deref().map(redact_url))
            .finish()
    }
}

/// Where the chats are stored, from `store.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database; the URL as given (it may hold a password: log
    /// [`redact_url`] of it, never the URL).
    Postgres(String),
}

/// `url` with any password replaced by `***`, for logs and errors.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{path}")
        }
        _ => url.to_owned(),
    }
}

/// Authentication beyond tenant API keys. See `SECURITY.md`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Accept JWTs (in addition to API keys); `None` accepts API keys only.
    pub jwt: Option<JwtConfig>,
    /// Origins (`scheme://host[:port]`, exact match) browsers may call from. Same-origin
    /// requests and requests without `Origin` (non-browser clients) are always allowed; dev
    /// mode does not check origins.
    pub allowed_origins: Vec<String>,
    /// Lifetime of a single-use WebSocket ticket from `POST /api/v1/ws-ticket`, in seconds.
    pub ticket_ttl_s: u64,
}

/// How JWTs are verified: HS256 with a shared secret and/or RS256 with a public key. Only
/// the configured algorithms are accepted; `exp`, `iss` and `aud` are always checked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// HS256 shared secret (`TESSERA_JWT_SECRET` overrides it; prefer the variable).
    #[serde(default)]
    pub hs256_secret: Option<String>,
    /// PEM file with the RS256 public key.
    #[serde(default)]
    pub rs256_public_key_file: Option<PathBuf>,
    /// Required `iss`.
    pub issuer: String,
    /// Required `aud`.
    pub audience: String,
    /// Claim that names the tenant (the user is always `sub`).
    #[serde(default = "default_tenant_claim")]
    pub tenant_claim: String,
    /// Clock skew tolerated on `exp`/`nbf`, in seconds.
    #[serde(default = "default_leeway")]
    pub leeway_s: u64,
}

fn default_tenant_claim() -> String {
    "tenant".to_owned()
}

fn default_leeway() -> u64 {
    30
}

/// The vault key. Without one, a random key is made per process and secrets do not survive
/// a restart.
#[derive(Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecretsConfig {
    /// 32 bytes as 64 hex characters (`TESSERA_SECRET_KEY` overrides it).
    pub key_hex: Option<String>,
}

impl std::fmt::Debug for SecretsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsConfig")
            .field("key_hex", &self.key_hex.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl SecretsConfig {
    /// The configured key, if any; an invalid one is an error (never silently replaced).
    pub fn key(&self) -> anyhow::Result<Option<[u8; 32]>> {
        let Some(text) = &self.key_hex else {
            return Ok(None);
        };
        let text = text.trim();
        let bytes = (0..text.len())
            .step_by(2)
            .map(|i| {
                text.get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            })
            .collect::<Option<Vec<u8>>>();
        match bytes.and_then(|b| <[u8; 32]>::try_from(b).ok()) {
            Some(key) => Ok(Some(key)),
            None => anyhow::bail!("secrets.key_hex / TESSERA_SECRET_KEY must be 64 hex characters"),
        }
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            jwt: None,
            allowed_origins: Vec::new(),
            ticket_ttl_s: 30,
        }
    }
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
    /// Timeout of one attempt in seconds: the whole answer of a plain call; the headers, then
    /// each gap between two chunks, of a streamed one.
    pub timeout_s: f64,
    /// Total seconds one model call may take, retries and the whole stream included; an
    /// agent's `call_deadline_s` wins.
    pub call_deadline_s: f64,
    /// `max_tokens` sent with every model call; an agent's `max_tokens` wins.
    pub max_tokens: u32,
    /// A streamed message's text goes to clients at most this often, in milliseconds: its first
    /// text at once, later text joined, none held longer than this. 0: what each read of the
    /// model's stream brought.
    pub delta_interval_ms: u64,
}

/// Protective limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest text frame a client may send, in bytes; larger ones get `frame_too_large` and
    /// the connection stays open. Frames over 4× this break the protocol: close 1009.
    pub max_frame_bytes: usize,
    /// Client messages per minute per connection.
    pub messages_per_minute: u32,
    /// Client messages per minute over all connections of one tenant.
    pub messages_per_minute_per_tenant: u32,
    /// Frames refused as `rate_limited` in one minute before the socket is closed with 1008.
    pub rate_limit_strikes: u32,
    /// REST inputs (`/chats/{id}/input`, `/tool-responses`, `/run`) per minute per caller;
    /// each also spends the tenant's `messages_per_minute_per_tenant`. Over either: 429.
    pub rest_inputs_per_minute: u32,
    /// Chats of one tenant that may be open (not completed) at once; 0 = no limit.
    pub max_open_chats_per_tenant: usize,
    /// Default wait for a UI tool answer, in seconds (0 waits until cancelled).
    pub ui_timeout_s: f64,
    /// Events queued for one slow WebSocket client: a queue over this at two checks a second
    /// apart disconnects the client with 1008.
    pub outbound_queue: usize,
    /// Seconds without a pong before a WebSocket is closed.
    pub idle_timeout_s: u64,
    /// Agent tool time limit in seconds.
    pub tool_timeout_s: f64,
    /// Bytes of generated files (downloads made by tools) one tenant may keep; a tool whose
    /// file would go over fails with a quota error the model sees. 0 = no limit.
    pub max_file_bytes_per_tenant: u64,
    /// Seconds an open chat stays in memory while idle (nobody subscribed, no turn running,
    /// waiting on the user or on a UI call without a timeout); then it leaves memory and is
    /// rebuilt from the store on its next lookup. 0 = open chats stay in memory.
    pub idle_chat_evict_s: f64,
}

/// One tenant.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant id: scopes every chat, task and file.
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
            store: StoreConfig::default(),
            workflows_dir: PathBuf::from("workflows"),
            workflows_watch_s: 0.0,
            llm: LlmConfig::default(),
            limits: Limits::default(),
            tenants: Vec::new(),
            http_workers: 0,
            engine_threads: 0,
            auth: AuthConfig::default(),
            secrets: SecretsConfig::default(),
            retention: RetentionConfig::default(),
            cluster: ClusterConfig::default(),
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
            call_deadline_s: 300.0,
            max_tokens: 4096,
            delta_interval_ms: 0,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 64 * 1024,
            messages_per_minute: 120,
            messages_per_minute_per_tenant: 1200,
            rate_limit_strikes: 10,
            rest_inputs_per_minute: 60,
            max_open_chats_per_tenant: 1000,
            ui_timeout_s: 900.0,
            outbound_queue: 1024,
            idle_timeout_s: 60,
            tool_timeout_s: 12.0,
            max_file_bytes_per_tenant: 1024 * 1024 * 1024,
            idle_chat_evict_s: 600.0,
        }
    }
}

impl Limits {
    /// The UI wait as a duration (`None` = no timeout).
    pub fn ui_timeout(&self) -> Option<Duration> {
        (self.ui_timeout_s > 0.0).then(|| Duration::from_secs_f64(self.ui_timeout_s))
    }

    /// How long an idle open chat stays in memory (`None`: it stays).
    pub fn idle_chat_evict(&self) -> Option<Duration> {
        (self.idle_chat_evict_s > 0.0).then(|| Duration::from_secs_f64(self.idle_chat_evict_s))
    }
}

impl ServerConfig {
    /// Where the chats are stored: `store.url`, or the SQLite file in `data_dir`.
    pub fn store_location(&self) -> anyhow::Result<StoreLocation> {
        let Some(url) = &self.store.url else {
            return Ok(StoreLocation::Sqlite(self.data_dir.join("tessera.db")));
        };
        if let Some(path) = url.strip_prefix("sqlite://") {
            anyhow::ensure!(
                !path.is_empty(),
                "store.url {url:?} names no file: use sqlite://PATH"
            );
            return Ok(StoreLocation::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(StoreLocation::Postgres(url.clone()));
        }
        anyhow::bail!(
            "store.url / TESSERA_STORE_URL {:?} must start with sqlite:// or postgres://",
            redact_url(url)
        )
    }

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
        if let Some(v) = env("TESSERA_STORE_URL") {
            config.store.url = Some(v);
        }
        if let Some(v) = env("TESSERA_WORKFLOWS_DIR") {
            config.workflows_dir = PathBuf::from(v);
        }
        if let Some(v) = env("TESSERA_WORKFLOWS_WATCH_S") {
            config.workflows_watch_s = v
                .parse()
                .with_context(|| format!("TESSERA_WORKFLOWS_WATCH_S={v:?} is not a number"))?;
        }
        if let Some(v) = env("TESSERA_DEMO") {
            config.llm.demo = matches!(v.as_str(), "1" | "true" | "yes");
        }
        if let Some(v) = env("TESSERA_STREAM") {
            config.llm.stream = matches!(v.as_str(), "1" | "true" | "yes");
        }
        if let Some(v) = parsed_var(&env, "TESSERA_LLM_CALL_DEADLINE_S")? {
            config.llm.call_deadline_s = v;
        }
        if let Some(v) = parsed_var(&env, "TESSERA_LLM_MAX_TOKENS")? {
            config.llm.max_tokens = v;
        }
        if let Some(v) = parsed_var(&env, "TESSERA_DELTA_INTERVAL_MS")? {
            config.llm.delta_interval_ms = v;
        }
        if let Some(v) = env("TESSERA_UI_TIMEOUT_S") {
            config.limits.ui_timeout_s = v
                .parse()
                .with_context(|| format!("TESSERA_UI_TIMEOUT_S={v:?} is not a number"))?;
        }
        if let Some(v) = env("TESSERA_IDLE_CHAT_EVICT_S") {
            config.limits.idle_chat_evict_s = v
                .parse()
                .with_context(|| format!("TESSERA_IDLE_CHAT_EVICT_S={v:?} is not a number"))?;
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
        let number = |name: &str| -> anyhow::Result<Option<u64>> {
            env(name)
                .map(|v| {
                    v.parse()
                        .with_context(|| format!("{name}={v:?} is not a number"))
                })
                .transpose()
        };
        if let Some(v) = number("TESSERA_MESSAGES_PER_MINUTE_PER_TENANT")? {
            config.limits.messages_per_minute_per_tenant = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(v) = number("TESSERA_REST_INPUTS_PER_MINUTE")? {
            config.limits.rest_inputs_per_minute = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(v) = number("TESSERA_RATE_LIMIT_STRIKES")? {
            config.limits.rate_limit_strikes = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(v) = number("TESSERA_MAX_OPEN_CHATS_PER_TENANT")? {
            config.limits.max_open_chats_per_tenant = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = number("TESSERA_OUTBOUND_QUEUE")? {
            config.limits.outbound_queue = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = number("TESSERA_IDLE_TIMEOUT_S")? {
            config.limits.idle_timeout_s = v;
        }
        if let Some(v) = number("TESSERA_MAX_FILE_BYTES_PER_TENANT")? {
            config.limits.max_file_bytes_per_tenant = v;
        }
        if let Some(v) = env("TESSERA_RETENTION_COMPLETED_CHAT_DAYS") {
            config.retention.completed_chat_days = v.parse().with_context(|| {
                format!("TESSERA_RETENTION_COMPLETED_CHAT_DAYS={v:?} is not a number")
            })?;
        }
        if let Some(v) = env("TESSERA_RETENTION_SWEEP_INTERVAL_S") {
            config.retention.sweep_interval_s = v.parse().with_context(|| {
                format!("TESSERA_RETENTION_SWEEP_INTERVAL_S={v:?} is not a number")
            })?;
        }
        if let Some(v) = env("TESSERA_SECRET_KEY") {
            config.secrets.key_hex = Some(v);
        }
        if let Some(v) = env("TESSERA_JWT_SECRET")
            && let Some(jwt) = &mut config.auth.jwt
        {
            jwt.hs256_secret = Some(v);
        }
        if let Some(v) = env("TESSERA_HTTP_WORKERS") {
            config.http_workers = v
                .parse()
                .with_context(|| format!("TESSERA_HTTP_WORKERS={v:?} is not a number"))?;
        }
        if let Some(v) = env("TESSERA_ENGINE_THREADS") {
            config.engine_threads = v
                .parse()
                .with_context(|| format!("TESSERA_ENGINE_THREADS={v:?} is not a number"))?;
        }
        if let Some(v) = env("TESSERA_NATS_URL").filter(|v| !v.is_empty()) {
            config.cluster.nats_url = Some(v);
        }
        if let Some(v) = env("TESSERA_NODE_ID").filter(|v| !v.is_empty()) {
            config.cluster.node_id = Some(v);
        }
        if let Some(v) = env("TESSERA_NATS_PREFIX").filter(|v| !v.is_empty()) {
            config.cluster.subject_prefix = v;
        }
        if let Some(v) = number("TESSERA_LEASE_TTL_S")? {
            config.cluster.lease_ttl_s = v;
        }
        if let Some(v) = env("TESSERA_HAND_OVER_SOCKETS") {
            config.cluster.hand_over_sockets = match v.as_str() {
                "1" | "true" | "yes" => true,
                "0" | "false" | "no" => false,
                _ => anyhow::bail!("TESSERA_HAND_OVER_SOCKETS={v:?} is not true or false"),
            };
        }
        if let Some(v) = env("OPENAI_BASE_URL") {
            config.llm.base_url = Some(v);
        }
        if let Some(v) = env("OPENAI_MODEL") {
            config.llm.model = Some(v);
        }
        if !(config.llm.call_deadline_s > 0.0 && config.llm.call_deadline_s <= 86_400.0) {
            anyhow::bail!(
                "llm.call_deadline_s must be a number of seconds from 0 to 86400 (exclusive of 0)"
            );
        }
        if config.llm.max_tokens == 0 {
            anyhow::bail!("llm.max_tokens must be at least 1");
        }
        Ok(config)
    }
}

/// Variable `name` parsed as a number, if set.
fn parsed_var<T: std::str::FromStr>(
    env: &impl Fn(&str) -> Option<String>,
    name: &str,
) -> anyhow::Result<Option<T>> {
    env(name)
        .map(|v| {
            v.parse()
                .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a number"))
        })
        .transpose()
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
    fn store_url_selects_the_backend_and_never_shows_a_password() -> anyhow::Result<()> {
        let none = |_: &str| None;
        let default = ServerConfig::load(None, none)?;
        assert_eq!(
            default.store_location()?,
            StoreLocation::Sqlite(PathBuf::from("data").join("tessera.db"))
        );
        let env = |url: &'static str| {
            move |name: &str| (name == "TESSERA_STORE_URL").then(|| url.to_owned())
        };
        let sqlite = ServerConfig::load(None, env("sqlite:///var/lib/tessera/chats.db"))?;
        assert_eq!(
            sqlite.store_location()?,
            StoreLocation::Sqlite(PathBuf::from("/var/lib/tessera/chats.db"))
        );
        let pg_url = "postgres://tessera:hunter2@db.internal:5432/tessera";
        let pg = ServerConfig::load(None, env(pg_url))?;
        assert_eq!(
            pg.store_location()?,
            StoreLocation::Postgres(pg_url.to_owned())
        );
        let shown = format!("{pg:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("postgres://tessera:***@db.internal:5432/tessera"),
            "{shown}"
        );
        let bad = ServerConfig::load(None, env("mysql://root:hunter2@db/x"))?;
        let err = bad.store_location().unwrap_err().to_string();
        assert!(
            err.contains("sqlite:// or postgres://") && !err.contains("hunter2"),
            "{err}"
        );
        assert!(
            ServerConfig::load(None, env("sqlite://"))?
                .store_location()
                .is_err()
        );
        Ok(())
    }

    #[test]
    fn cluster_mode_is_off_unless_a_nats_url_is_given() -> anyhow::Result<()> {
        let single = ServerConfig::load(None, |_| None)?;
        assert!(!single.cluster.enabled());
        assert_eq!(single.cluster.lease_ttl(), Duration::from_secs(10));
        let parsed: ServerConfig =
            toml::from_str("[cluster]\nnats_url = \"nats://n:4222\"\nlease_ttl_s = 6\n")?;
        assert!(parsed.cluster.enabled());
        assert_eq!(parsed.cluster.lease_ttl_s, 6);
        let from_env = ServerConfig::load(None, |k| match k {
            "TESSERA_NATS_URL" => Some("nats://127.0.0.1:4222".to_owned()),
            "TESSERA_NODE_ID" => Some("node-a".to_owned()),
            _ => None,
        })?;
        assert_eq!(
            from_env.cluster.nats_url.as_deref(),
            Some("nats://127.0.0.1:4222")
        );
        assert_eq!(from_env.cluster.node_id(), "node-a");
        assert!(from_env.cluster.hand_over_sockets, "on by default");
        let hand_over = |v: &'static str| {
            ServerConfig::load(None, move |k| {
                (k == "TESSERA_HAND_OVER_SOCKETS").then(|| v.to_owned())
            })
        };
        assert!(!hand_over("false")?.cluster.hand_over_sockets);
        assert!(hand_over("1")?.cluster.hand_over_sockets);
        assert!(hand_over("maybe").is_err());
        let mut blank = ServerConfig::default();
        blank.cluster.node_id = Some("  ".into());
        assert!(
            !blank.cluster.node_id().trim().is_empty(),
            "a blank node id would name parked leases"
        );
        let a = ServerConfig::default().cluster.node_id();
        assert_ne!(
            a,
            ServerConfig::default().cluster.node_id(),
            "a fresh id per process"
        );
        Ok(())
    }

    #[test]
    fn thread_counts_come_from_the_file_or_the_environment() -> anyhow::Result<()> {
        let parsed: ServerConfig = toml::from_str("http_workers = 3\nengine_threads = 2")?;
        assert_eq!((parsed.http_workers, parsed.engine_threads), (3, 2));
        let config = ServerConfig::load(None, |k| {
            (k == "TESSERA_ENGINE_THREADS").then(|| "1".to_owned())
        })?;
        assert_eq!((config.http_workers, config.engine_threads), (0, 1));
        let bad = ServerConfig::load(None, |k| {
            (k == "TESSERA_ENGINE_THREADS").then(|| "two".to_owned())
        });
        assert!(bad.is_err_and(|e| e.to_string().contains("TESSERA_ENGINE_THREADS")));
        Ok(())
    }

    #[test]
    fn the_delta_interval_comes_from_the_file_or_the_environment() -> anyhow::Result<()> {
        assert_eq!(ServerConfig::load(None, |_| None)?.llm.delta_interval_ms, 0);
        let parsed: ServerConfig = toml::from_str("[llm]\ndelta_interval_ms = 25")?;
        assert_eq!(parsed.llm.delta_interval_ms, 25);
        let config = ServerConfig::load(None, |k| {
            (k == "TESSERA_DELTA_INTERVAL_MS").then(|| "40".to_owned())
        })?;
        assert_eq!(config.llm.delta_interval_ms, 40);
        let bad = ServerConfig::load(None, |k| {
            (k == "TESSERA_DELTA_INTERVAL_MS").then(|| "30ms".to_owned())
        });
        assert!(bad.is_err_and(|e| e.to_string().contains("TESSERA_DELTA_INTERVAL_MS")));
        Ok(())
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let bad = ServerConfig::load(None, |k| (k == "TESSERA_BIND").then(|| "nope".to_owned()));
        assert!(bad.is_err());
        let parsed: Result<ServerConfig, _> = toml::from_str("bindd = \"x\"");
        assert!(parsed.is_err());
    }

    #[test]
    fn auth_and_secret_key_parse_and_bad_keys_are_refused() -> anyhow::Result<()> {
        let parsed: ServerConfig = toml::from_str(
            "[auth]\nallowed_origins = [\"https://app.example\"]\n[auth.jwt]\nissuer = \"i\"\naudience = \"a\"\n[secrets]\nkey_hex = \"00\"\n",
        )?;
        assert_eq!(parsed.auth.ticket_ttl_s, 30);
        assert_eq!(
            parsed.auth.jwt.as_ref().map(|j| j.tenant_claim.as_str()),
            Some("tenant")
        );
        assert!(parsed.secrets.key().is_err(), "a short key is an error");
        assert!(!format!("{:?}", parsed.secrets).contains("00\""));
        let good = SecretsConfig {
            key_hex: Some("ab".repeat(32)),
        };
        assert_eq!(good.key()?, Some([0xab; 32]));
        Ok(())
    }
}
