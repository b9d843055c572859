//! tessera-mcp
//!
//! One connection to an MCP (Model Context Protocol) server, over stdio (a child process) or
//! Streamable HTTP, on the official `rmcp` SDK: list the server's tools and call one. Failures
//! become [`ToolError`]s the model can read: a server that died mid-call ends the call with an
//! error at once instead of leaving it waiting. Bounding a hanging call is the caller's tool
//! timeout.
//!
//! Not here yet: manifest declarations, per-node supervision with restarts, and wiring into
//! the engine's agent tools.

#![warn(missing_docs)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Map, Value, json};
use tessera_tools::ToolError;

/// How to reach an MCP server.
#[derive(Debug, Clone, PartialEq)]
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
        let params = CallToolRequestParams::new(name.to_owned()).with_arguments(args);
        let result = self.service.call_tool(params).await.map_err(|e| {
            ToolError::Failed(format!("the MCP server did not answer: {}", short(&e)))
        })?;
        let raw = serde_json::to_value(&result)
            .map_err(|e| ToolError::Failed(format!("unreadable MCP result: {e}")))?;
        Ok(tool_result_value(&raw))
    }

    /// True once the session has ended (the process exited, the connection closed).
    pub fn is_closed(&self) -> bool {
        self.service.is_closed()
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
