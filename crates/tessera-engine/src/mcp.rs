//! MCP tools: the per-node [`McpHub`] (one session per declared server, restarted with
//! back-off when it dies, its `tools/list` cached), the [`McpCatalog`] a workflow is compiled
//! with, and [`McpTool`], the agent tool that calls through the hub.
//!
//! WHY a hub: a stdio server is a process; starting one per chat or per call would be slow and
//! would multiply processes. The hub owns every session; a call asks it for the current one
//! and then talks to the server directly (an rmcp session is a channel to its own task), so a
//! slow call never blocks the hub or another call. Bounding a hanging call is the runner's
//! tool timeout, like any tool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tessera_manifest::{McpTransport, Workflow};
use tessera_mcp::{McpConnection, McpEndpoint, McpToolInfo};
use tessera_tools::{Tool, ToolContext, ToolError};
use tokio::sync::oneshot;

/// Longest wait for a server to start and finish the MCP handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest wait for a server's `tools/list` when a workflow is compiled.
const LIST_TIMEOUT: Duration = Duration::from_secs(20);
/// First restart delay after a server died young or failed to start; doubles per failure.
const BACKOFF_BASE: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A session that lived this long before dying resets the back-off.
const HEALTHY_UPTIME: Duration = Duration::from_secs(30);
/// How often the hub looks for sessions that ended (a stdio server exited) to restart them.
const LIVENESS_CHECK: Duration = Duration::from_secs(1);

type Waiter = oneshot::Sender<Result<McpConnection, String>>;
/// A server's `tools/list`, or why it could not be had.
pub type ToolListing = Result<Arc<[McpToolInfo]>, String>;

enum SlotState {
    Up {
        conn: McpConnection,
        since: Instant,
    },
    /// A connect is running or scheduled; callers wait for it.
    Connecting {
        waiters: Vec<Waiter>,
    },
    /// The last start failed; the next call after `retry_at` tries again, earlier ones fail.
    Down {
        retry_at: Instant,
        error: String,
    },
}

struct Slot {
    /// The manifest's name of the server (for logs and errors).
    name: Arc<str>,
    state: SlotState,
    /// Consecutive failed starts and early deaths (the back-off exponent).
    failures: u32,
    /// The server answered once: a failure to start it again is news (logged as a warning);
    /// before that, the load's one warning said it (`McpCatalog::discover`).
    ever_up: bool,
    tools: Option<Arc<[McpToolInfo]>>,
}

/// Owns this node's MCP sessions, keyed by declaration (the same declaration in two workflows
/// shares one server).
pub struct McpHub {
    /// Pooled client of every HTTP session.
    http: reqwest::Client,
    slots: HashMap<McpTransport, Slot>,
}

impl McpHub {
    pub fn new(http: reqwest::Client) -> Self {
        Self {
            http,
            slots: HashMap::new(),
        }
    }

    fn backoff(failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        BACKOFF_BASE
            .saturating_mul(1u32 << (failures - 1).min(16))
            .min(BACKOFF_MAX)
    }

    /// Starts a connect for `key` after `delay`; its outcome comes back as [`Connected`].
    fn start_connect(&mut self, key: McpTransport, delay: Duration, ctx: &mut Context<Self>) {
        let http = self.http.clone();
        let name = self
            .slots
            .get(&key)
            .map_or_else(|| Arc::from(""), |s| s.name.clone());
        let transport = key.clone();
        let connect = async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let endpoint = McpEndpoint::resolve(&transport).map_err(|e| e.to_string())?;
            if let McpEndpoint::Http { url, .. } = &endpoint {
                listening(url).await?;
            }
            match tokio::time::timeout(CONNECT_TIMEOUT, McpConnection::connect(&endpoint, &http))
                .await
            {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(_) => Err(format!(
                    "no MCP handshake within {}s",
                    CONNECT_TIMEOUT.as_secs()
                )),
            }
        };
        tracing::info!(mcp_server = %name, delay_ms = delay.as_millis() as u64, "starting MCP session");
        ctx.spawn(
            connect
                .into_actor(self)
                .map(move |result, act, ctx| act.connected(key, result, ctx)),
        );
    }

    fn connected(
        &mut self,
        key: McpTransport,
        result: Result<McpConnection, String>,
        _ctx: &mut Context<Self>,
    ) {
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        let waiters = match std::mem::replace(
            &mut slot.state,
            SlotState::Connecting {
                waiters: Vec::new(),
            },
        ) {
            SlotState::Connecting { waiters } => waiters,
            _ => Vec::new(),
        };
        match result {
            Ok(conn) => {
                tracing::info!(mcp_server = %slot.name, "MCP session up");
                slot.ever_up = true;
                // A restarted server may be a new version with other tools.
                slot.tools = None;
                for waiter in waiters {
                    let _ = waiter.send(Ok(conn.clone()));
                }
                slot.state = SlotState::Up {
                    conn,
                    since: Instant::now(),
                };
            }
            Err(error) => {
                slot.failures = slot.failures.saturating_add(1);
                let wait = Self::backoff(slot.failures);
                if slot.ever_up {
                    tracing::warn!(mcp_server = %slot.name, failures = slot.failures, retry_in_ms = wait.as_millis() as u64, %error, "MCP server could not be started");
                } else {
                    tracing::debug!(mcp_server = %slot.name, failures = slot.failures, retry_in_ms = wait.as_millis() as u64, %error, "MCP server could not be started");
                }
                let message = format!("the MCP server \"{}\" is unavailable: {error}", slot.name);
                for waiter in waiters {
                    let _ = waiter.send(Err(message.clone()));
                }
                slot.state = SlotState::Down {
                    retry_at: Instant::now() + wait,
                    error,
                };
            }
        }
    }

    /// The session ended: restart it, at once after a long life, else after the back-off.
    fn died(&mut self, key: &McpTransport, ctx: &mut Context<Self>) {
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        let SlotState::Up { since, .. } = &slot.state else {
            return;
        };
        if since.elapsed() >= HEALTHY_UPTIME {
            slot.failures = 0;
        } else {
            slot.failures = slot.failures.saturating_add(1);
        }
        let delay = Self::backoff(slot.failures);
        tracing::warn!(mcp_server = %slot.name, restart_in_ms = delay.as_millis() as u64, "MCP session ended; restarting");
        slot.state = SlotState::Connecting {
            waiters: Vec::new(),
        };
        self.start_connect(key.clone(), delay, ctx);
    }

    /// The current session of `key`, starting it when needed.
    fn session(
        &mut self,
        key: McpTransport,
        name: &str,
        ctx: &mut Context<Self>,
    ) -> oneshot::Receiver<Result<McpConnection, String>> {
        let (tx, rx) = oneshot::channel();
        let slot = self.slots.entry(key.clone()).or_insert_with(|| Slot {
            name: Arc::from(name),
            state: SlotState::Down {
                retry_at: Instant::now(),
                error: String::new(),
            },
            failures: 0,
            ever_up: false,
            tools: None,
        });
        if let SlotState::Up { conn, .. } = &slot.state
            && conn.is_closed()
        {
            self.died(&key, ctx);
        }
        let Some(slot) = self.slots.get_mut(&key) else {
            let _ = tx.send(Err("the MCP hub lost the server".to_owned()));
            return rx;
        };
        match &mut slot.state {
            SlotState::Up { conn, .. } => {
                let _ = tx.send(Ok(conn.clone()));
            }
            SlotState::Connecting { waiters } => waiters.push(tx),
            SlotState::Down { retry_at, error } => {
                if Instant::now() < *retry_at {
                    let _ = tx.send(Err(format!(
                        "the MCP server \"{}\" is unavailable (retrying in {} ms): {error}",
                        slot.name,
                        retry_at
                            .saturating_duration_since(Instant::now())
                            .as_millis()
                    )));
                } else {
                    slot.state = SlotState::Connecting { waiters: vec![tx] };
                    self.start_connect(key, Duration::ZERO, ctx);
                }
            }
        }
        rx
    }
}

impl Actor for McpHub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(LIVENESS_CHECK, |act, ctx| {
            let dead: Vec<McpTransport> = act
                .slots
                .iter()
                .filter(|(_, s)| matches!(&s.state, SlotState::Up { conn, .. } if conn.is_closed()))
                .map(|(k, _)| k.clone())
                .collect();
            for key in dead {
                act.died(&key, ctx);
            }
        });
    }
}

/// Variables that send this process's HTTP through a proxy (which the MCP client honours).
const PROXY_VARIABLES: [&str; 6] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// Whether something listens at `url`'s host and port. WHY: the MCP client's transport worker
/// logs a refused connection as an ERROR before it reports it; asking first makes a server
/// that is simply not there one clear line. With a proxy configured the server may be
/// reachable only through it, so nothing is asked.
async fn listening(url: &str) -> Result<(), String> {
    if PROXY_VARIABLES
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return Ok(());
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("bad MCP url {url:?}: {e}"))?;
    let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
        return Err(format!("the MCP url {url:?} names no host and port"));
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("nothing answers at {host}:{port} ({e})")),
        Err(_) => Err(format!(
            "no connection to {host}:{port} within {}s",
            CONNECT_TIMEOUT.as_secs()
        )),
    }
}

/// The live session of a server (started when needed). `Err` is a message for the model.
#[derive(Message)]
#[rtype(result = "Result<McpConnection, String>")]
pub struct McpSession {
    pub server: McpTransport,
    pub name: Arc<str>,
}

impl Handler<McpSession> for McpHub {
    type Result = ResponseFuture<Result<McpConnection, String>>;

    fn handle(&mut self, msg: McpSession, ctx: &mut Self::Context) -> Self::Result {
        let rx = self.session(msg.server, &msg.name, ctx);
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err("the MCP hub stopped".to_owned()))
        })
    }
}

/// A call on `conn` failed in transport (the server died or the session closed): the hub
/// replaces the session, unless it already did.
#[derive(Message)]
#[rtype(result = "()")]
pub struct McpSessionFailed {
    pub server: McpTransport,
    pub conn: McpConnection,
}

impl Handler<McpSessionFailed> for McpHub {
    type Result = ();

    fn handle(&mut self, msg: McpSessionFailed, ctx: &mut Self::Context) {
        let current = matches!(
            self.slots.get(&msg.server).map(|s| &s.state),
            Some(SlotState::Up { conn, .. }) if conn.same_session(&msg.conn)
        );
        if current {
            self.died(&msg.server, ctx);
        }
    }
}

/// The server's tools (`tools/list`), cached after the first answer until the session is
/// replaced; `fresh` asks the server again (a reload: its tools may have changed).
#[derive(Message)]
#[rtype(result = "Result<Arc<[McpToolInfo]>, String>")]
pub struct McpListTools {
    pub server: McpTransport,
    pub name: Arc<str>,
    pub fresh: bool,
}

impl Handler<McpListTools> for McpHub {
    type Result = ResponseActFuture<Self, Result<Arc<[McpToolInfo]>, String>>;

    fn handle(&mut self, msg: McpListTools, ctx: &mut Self::Context) -> Self::Result {
        if !msg.fresh
            && let Some(tools) = self.slots.get(&msg.server).and_then(|s| s.tools.clone())
        {
            return Box::pin(fut::ready(Ok(tools)));
        }
        let rx = self.session(msg.server.clone(), &msg.name, ctx);
        let list = async move {
            let conn = rx
                .await
                .unwrap_or_else(|_| Err("the MCP hub stopped".to_owned()))?;
            match tokio::time::timeout(LIST_TIMEOUT, conn.list_tools()).await {
                Ok(Ok(tools)) => Ok(Arc::<[McpToolInfo]>::from(tools)),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!(
                    "tools/list got no answer within {}s",
                    LIST_TIMEOUT.as_secs()
                )),
            }
        };
        Box::pin(list.into_actor(self).map(move |result, act, _| {
            if let (Ok(tools), Some(slot)) = (&result, act.slots.get_mut(&msg.server)) {
                slot.tools = Some(tools.clone());
            }
            result
        }))
    }
}

/// What workflows are compiled with: the hub and each declared server's tools as listed when
/// the workflows were loaded (`Err`: the server was unreachable then).
#[derive(Clone)]
pub struct McpCatalog {
    pub hub: Addr<McpHub>,
    pub listed: Arc<HashMap<McpTransport, ToolListing>>,
}

impl std::fmt::Debug for McpCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpCatalog")
            .field("servers", &self.listed.len())
            .finish_non_exhaustive()
    }
}

impl McpCatalog {
    /// Starts a hub on the current arbiter.
    pub fn start_hub() -> Result<Addr<McpHub>, crate::EngineError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| {
                crate::EngineError::Workflow(format!("cannot build the MCP HTTP client: {e}"))
            })?;
        Ok(McpHub::new(http).start())
    }

    /// Lists the tools of every server `workflows` grant to an agent (all at once; each bounded
    /// by the list timeout; `fresh`: not from the cache). An unreachable server is logged; its
    /// tools are left out of the agents' plans until the workflow is loaded again.
    pub async fn discover(hub: Addr<McpHub>, workflows: &[&Workflow], fresh: bool) -> Self {
        let mut servers: HashMap<McpTransport, Arc<str>> = HashMap::new();
        for workflow in workflows {
            for grant in &workflow.mcp.grants {
                if let Some(server) = workflow.mcp.server(&grant.server) {
                    servers
                        .entry(server.transport.clone())
                        .or_insert_with(|| Arc::from(server.name.as_str()));
                }
            }
        }
        let lists = servers.into_iter().map(|(server, name)| {
            let hub = hub.clone();
            async move {
                let listed = hub
                    .send(McpListTools {
                        server: server.clone(),
                        name: name.clone(),
                        fresh,
                    })
                    .await
                    .unwrap_or_else(|_| Err("the MCP hub stopped".to_owned()));
                if let Err(error) = &listed {
                    tracing::warn!(mcp_server = %name, %error, "MCP server unreachable: its tools are not offered until the workflow is loaded again (SIGHUP)");
                }
                (server, listed)
            }
        });
        let listed = futures::future::join_all(lists).await.into_iter().collect();
        Self {
            hub,
            listed: Arc::new(listed),
        }
    }
}

/// One allow-listed tool of an MCP server, as an agent tool.
pub struct McpTool {
    pub hub: Addr<McpHub>,
    pub server: McpTransport,
    pub server_name: Arc<str>,
    /// The server's name of the tool (the model may see it prefixed).
    pub tool: Arc<str>,
}

impl Tool for McpTool {
    fn invoke(
        &self,
        args: Map<String, Value>,
        ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        let hub = self.hub.clone();
        let server = self.server.clone();
        let name = self.server_name.clone();
        let tool = self.tool.clone();
        Box::pin(async move {
            let conn = hub
                .send(McpSession {
                    server: server.clone(),
                    name,
                })
                .await
                .map_err(|_| ToolError::Failed("the MCP hub stopped".to_owned()))?
                .map_err(ToolError::Failed)?;
            // Who the call is for comes from the chat, never from the model's arguments.
            let mut meta = Map::new();
            meta.insert("tessera/tenant".into(), json!(&*ctx.app_id));
            meta.insert("tessera/user".into(), json!(&*ctx.user_id));
            meta.insert("tessera/chat_id".into(), json!(&*ctx.chat_id));
            meta.insert(
                "tessera/invocation_key".into(),
                json!(&*ctx.turn_idempotency_key),
            );
            // The caller's `execute_tool` span, when traces are exported: W3C trace context in
            // `_meta` (`traceparent`, `tracestate`), as MCP carries it.
            for (name, value) in tessera_telemetry::outgoing_headers() {
                meta.insert(name.into(), Value::String(value));
            }
            let result = conn.call_with_meta(&tool, args, Some(meta)).await;
            if result.is_err() {
                hub.do_send(McpSessionFailed { server, conn });
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_cap() {
        assert_eq!(McpHub::backoff(0), Duration::ZERO);
        assert_eq!(McpHub::backoff(1), BACKOFF_BASE);
        assert_eq!(McpHub::backoff(3), BACKOFF_BASE * 4);
        assert_eq!(McpHub::backoff(40), BACKOFF_MAX);
    }
}
