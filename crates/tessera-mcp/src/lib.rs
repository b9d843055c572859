//! tessera-mcp
//!
//! One connection to an MCP (Model Context Protocol) server, over stdio (a child process) or
//! Streamable HTTP, on the official `rmcp` SDK: list the server's tools and call one. Failures
//! become [`ToolError`]s the model can read: a server that died mid-call ends the call with an
//! error at once instead of leaving it waiting. Bounding a hanging call is the caller's tool
//! timeout.
//!
//! Secrets in a manifest's header and env values are `${env:NAME}` references, resolved here
//! ([`McpEndpoint::resolve`]) when a connection is made; `Debug` of an endpoint shows only
//! their names. Per-node supervision (restarts, the `tools/list` cache) is the engine's
//! `McpHub`.

#![warn(missing_docs)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, RequestMetaObject,
};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Map, Value, json};
pub use tessera_manifest::McpTransport;
use tessera_tools::ToolError;

/// How to reach an MCP server, with secret references resolved.
#[derive(Clone, PartialEq)]
pub enum McpEndpoint {
    /// A child process speaking MCP over its stdin/stdout.
    Stdio {
        /// The program to run.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Extra environment variables.
        env: BTreeMap<String, String>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// The MCP endpoint URL (e.g. `http://127.0.0.1:8000/mcp`).
        url: String,
        /// Headers sent with every request (from configuration or the secret vault).
        headers: BTreeMap<String, String>,
    },
}

/// Why a connection could not be made or a listing failed.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The child process could not be started.
    #[error("could not start the MCP server {command:?}: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A configured header is not a valid HTTP header.
    #[error("invalid header {0:?}")]
    Header(String),
    /// The MCP handshake failed.
    #[error("MCP handshake failed: {0}")]
    Handshake(String),
    /// A request to the server failed.
    #[error("MCP request failed: {0}")]
    Request(#[from] ServiceError),
    /// A `${env:NAME}` reference names an unset variable.
    #[error("the secret reference ${{env:{0}}} names an unset environment variable")]
    MissingSecret(String),
}

impl std::fmt::Debug for McpEndpoint {
    /// Header and env values may be secrets: only their names are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stdio { command, args, env } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.keys().collect::<Vec<_>>())
                .finish(),
            Self::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl McpEndpoint {
    /// The endpoint of a manifest declaration, its `${env:NAME}` references replaced by the
    /// variables' values (read now).
    pub fn resolve(transport: &McpTransport) -> Result<Self, McpError> {
        let resolve_map = |map: &BTreeMap<String, String>| {
            map.iter()
                .map(|(k, v)| {
                    Ok((
                        k.clone(),
                        resolve_references(v, |name| std::env::var(name).ok())?,
                    ))
                })
                .collect::<Result<BTreeMap<_, _>, McpError>>()
        };
        Ok(match transport {
            McpTransport::Stdio { command, args, env } => Self::Stdio {
                command: command.clone(),
                args: args.clone(),
                env: resolve_map(env)?,
            },
            McpTransport::Http { url, headers } => Self::Http {
                url: url.clone(),
                headers: resolve_map(headers)?,
            },
        })
    }
}

/// `value` with each `${env:NAME}` replaced by `lookup(NAME)`.
fn resolve_references(
    value: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, McpError> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${env:") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "${env:".len()..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let name = &after[..end];
        out.push_str(&lookup(name).ok_or_else(|| McpError::MissingSecret(name.to_owned()))?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A tool the server lists.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolInfo {
    /// The server's name for the tool.
    pub name: String,
    /// Its description, if any.
    pub description: Option<String>,
    /// JSON Schema of its arguments.
    pub input_schema: Value,
}

/// One live session with an MCP server. Cheap to share: calls may run concurrently.
#[derive(Clone)]
pub struct McpConnection {
    service: Arc<RunningService<RoleClient, ClientConfig>>,
}

impl std::fmt::Debug for McpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpConnection").finish_non_exhaustive()
    }
}

fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("tessera", env!("CARGO_PKG_VERSION")),
    )
}

impl McpConnection {
    /// Starts (stdio) or opens (HTTP) a session and completes the MCP handshake. `http` is the
    /// process-wide pooled client, used for HTTP endpoints.
    pub async fn connect(endpoint: &McpEndpoint, http: &reqwest::Client) -> Result<Self, McpError> {
        let service = match endpoint {
            McpEndpoint::Stdio { command, args, env } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).envs(env).kill_on_drop(true);
                let (transport, _stderr) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::inherit())
                    .spawn()
                    .map_err(|source| McpError::Spawn {
                        command: command.clone(),
                        source,
                    })?;
                client_config()
                    .serve(transport)
                    .await
                    .map_err(|e| McpError::Handshake(e.to_string()))?
            }
            McpEndpoint::Http { url, headers } => {
                let mut custom = HashMap::new();
                for (name, value) in headers {
                    let name = http::HeaderName::try_from(name.as_str())
                        .map_err(|_| McpError::Header(name.clone()))?;
                    let value = http::HeaderValue::try_from(value.as_str())
                        .map_err(|_| McpError::Header(name.to_string()))?;
                    custom.insert(name, value);
                }
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.custom_headers = custom;
                config.retry_config = Arc::new(stream_retry());
                let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
                client_config()
                    .serve(transport)
                    .await
                    .map_err(|e| McpError::Handshake(e.to_string()))?
            }
        };
        Ok(Self {
            service: Arc::new(service),
        })
    }

    /// The server's tools (`tools/list`, every page).
    pub async fn list_tools(&self) -> Result<Vec<McpToolInfo>, McpError> {
        let tools = self.service.list_all_tools().await?;
        Ok(tools
            .into_iter()
            .map(|t| McpToolInfo {
                name: t.name.to_string(),
                description: t.description.map(|d| d.to_string()),
                input_schema: Value::Object((*t.input_schema).clone()),
            })
            .collect())
    }

    /// Calls tool `name`. A tool-level failure (`isError`) is an `Ok` result with
    /// `"status": "error"` the model reads; a failed transport (the server died, the session
    /// closed) is an `Err`.
    pub async fn call(&self, name: &str, args: Map<String, Value>) -> Result<Value, ToolError> {
        self.call_with_meta(name, args, None).await
    }

    /// [`Self::call`] with a request `_meta` object (e.g. the caller's identity, which never
    /// comes from the model's arguments).
    pub async fn call_with_meta(
        &self,
        name: &str,
        args: Map<String, Value>,
        meta: Option<Map<String, Value>>,
    ) -> Result<Value, ToolError> {
        let mut params = CallToolRequestParams::new(name.to_owned()).with_arguments(args);
        params.meta = meta.map(RequestMetaObject::from);
        let result = self.service.call_tool(params).await.map_err(|e| {
            ToolError::Failed(format!("the MCP server did not answer: {}", short(&e)))
        })?;
        let raw = serde_json::to_value(&result)
            .map_err(|e| ToolError::Failed(format!("unreadable MCP result: {e}")))?;
        Ok(tool_result_value(&raw))
    }

    /// Whether `other` is a handle on this very session.
    pub fn same_session(&self, other: &McpConnection) -> bool {
        Arc::ptr_eq(&self.service, &other.service)
    }

    /// True once the session has ended (the process exited, the connection closed).
    pub fn is_closed(&self) -> bool {
        self.service.is_closed()
    }
}

/// What `tessera validate` found out about one declared server.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerCheck {
    /// The server could not be started or reached, or did not list its tools in time.
    Unreachable(String),
    /// The server listed its tools.
    Listed {
        /// How many tools it lists.
        listed: usize,
        /// Allow-listed tools it does not list.
        missing: Vec<String>,
        /// Allow-listed tools whose input schema cannot be used for strict validation.
        unusable: Vec<(String, String)>,
    },
}

/// Connects to `transport`, lists its tools and checks `allowed` against them, all within
/// `deadline`.
pub async fn check_server(
    transport: &McpTransport,
    allowed: &[String],
    deadline: Duration,
) -> ServerCheck {
    let listed = tokio::time::timeout(deadline, async {
        let endpoint = McpEndpoint::resolve(transport)?;
        let conn = McpConnection::connect(&endpoint, &reqwest::Client::new()).await?;
        conn.list_tools().await
    })
    .await;
    let tools = match listed {
        Ok(Ok(tools)) => tools,
        Ok(Err(e)) => return ServerCheck::Unreachable(e.to_string()),
        Err(_) => {
            return ServerCheck::Unreachable(format!(
                "no answer within {}s",
                deadline.as_secs_f64()
            ));
        }
    };
    let mut missing = Vec::new();
    let mut unusable = Vec::new();
    for name in allowed {
        match tools.iter().find(|t| &t.name == name) {
            None => missing.push(name.clone()),
            Some(tool) => {
                if let Err(e) = tessera_tools::ArgSchema::new(&tool.input_schema) {
                    unusable.push((name.clone(), e));
                }
            }
        }
    }
    ServerCheck::Listed {
        listed: tools.len(),
        missing,
        unusable,
    }
}

/// A dropped response stream is resumed a couple of times, quickly; rmcp's default retries
/// forever, which would leave a call to a dead server waiting for its whole tool timeout.
fn stream_retry() -> ExponentialBackoff {
    let mut retry = ExponentialBackoff::default();
    retry.max_times = Some(2);
    retry.base_duration = Duration::from_millis(200);
    retry.max_delay = Some(Duration::from_secs(1));
    retry
}

/// Maps an MCP `CallToolResult` (as JSON) to the engine's tool result shape.
fn tool_result_value(raw: &Value) -> Value {
    let text: Vec<&str> = raw
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|c| c.get("text").and_then(Value::as_str))
        .collect();
    let text = text.join("\n");
    if raw.get("isError").and_then(Value::as_bool) == Some(true) {
        return json!({"status": "error", "message": text});
    }
    match raw.get("structuredContent") {
        Some(structured) if !structured.is_null() => {
            json!({"status": "success", "result": structured})
        }
        _ => json!({"status": "success", "result": text}),
    }
}

fn short(e: &ServiceError) -> String {
    e.to_string().chars().take(160).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_references_are_resolved_and_never_shown() {
        let lookup = |name: &str| (name == "TOKEN").then(|| "sk-canary-7".to_owned());
        let resolved = resolve_references("Bearer ${env:TOKEN}!", lookup);
        assert_eq!(resolved.ok().as_deref(), Some("Bearer sk-canary-7!"));
        let missing = resolve_references("${env:NOPE}", lookup);
        assert!(matches!(missing, Err(McpError::MissingSecret(n)) if n == "NOPE"));
        let endpoint = McpEndpoint::Http {
            url: "http://x/mcp".to_owned(),
            headers: BTreeMap::from([(
                "Authorization".to_owned(),
                "Bearer sk-canary-7".to_owned(),
            )]),
        };
        let shown = format!("{endpoint:?}");
        assert!(
            shown.contains("Authorization") && !shown.contains("sk-canary-7"),
            "{shown}"
        );
    }

    #[test]
    fn tool_errors_and_structured_results_are_mapped() {
        let error = json!({"content": [{"type": "text", "text": "no such city"}], "isError": true});
        assert_eq!(
            tool_result_value(&error),
            json!({"status": "error", "message": "no such city"})
        );
        let structured = json!({"content": [], "structuredContent": {"sum": 3}});
        assert_eq!(
            tool_result_value(&structured),
            json!({"status": "success", "result": {"sum": 3}})
        );
        let text =
            json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(
            tool_result_value(&text),
            json!({"status": "success", "result": "a\nb"})
        );
    }
}
