//! A small MCP server for tests, built on rmcp's server side. Tools: `echo` (returns its
//! `message`), `crash` (the process exits mid-call), `hang` (never answers).
//!
//! With `TESSERA_MCP_TESTSERVER_LOG=FILE` every `tools/call` appends one JSON line (tool,
//! arguments, `_meta`) to FILE, so a test can count calls and see the caller's identity. With
//! `TESSERA_MCP_TESTSERVER_CRASH_ONCE=FILE`, `crash` exits only when FILE does not exist yet
//! (creating it), and answers `recovered` afterwards: a restarted server then succeeds.
//!
//! `tessera-mcp-testserver --stdio` serves MCP on stdin/stdout;
//! `tessera-mcp-testserver --http` serves Streamable HTTP on 127.0.0.1 (port 0) at `/mcp` and
//! prints `listening on http://ADDR/mcp` on stdout.

use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rmcp::ErrorData;
use rmcp::ServerHandler;
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, RequestMetaObject, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde_json::{Map, Value, json};

#[derive(Clone, Default)]
struct TestServer;

fn schema(value: Value) -> Arc<Map<String, Value>> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(Map::new()),
    }
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let message = json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]});
        let empty = json!({"type": "object", "properties": {}});
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("echo", "Echo a message", schema(message)),
            Tool::new(
                "crash",
                "Exit the server process mid-call",
                schema(empty.clone()),
            ),
            Tool::new("hang", "Never answer", schema(empty)),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        log_call(&request, &context.meta);
        match &*request.name {
            "echo" => {
                let message = request
                    .arguments
                    .as_ref()
                    .and_then(|a| a.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                Ok(CallToolResponse::Complete(CallToolResult::success(vec![
                    ContentBlock::text(message),
                ])))
            }
            "crash" => {
                if let Ok(marker) = std::env::var("TESSERA_MCP_TESTSERVER_CRASH_ONCE")
                    && std::path::Path::new(&marker).exists()
                {
                    return Ok(CallToolResponse::Complete(CallToolResult::success(vec![
                        ContentBlock::text("recovered"),
                    ])));
                }
                if let Ok(marker) = std::env::var("TESSERA_MCP_TESTSERVER_CRASH_ONCE") {
                    let _ = std::fs::write(marker, b"crashed");
                }
                std::process::exit(3)
            }
            "hang" => futures::future::pending().await,
            other => Ok(CallToolResponse::Complete(CallToolResult::error(vec![
                ContentBlock::text(format!("unknown tool {other}")),
            ]))),
        }
    }
}

fn log_call(request: &CallToolRequestParams, meta: &RequestMetaObject) {
    let Ok(path) = std::env::var("TESSERA_MCP_TESTSERVER_LOG") else {
        return;
    };
    let line = json!({
        "tool": &*request.name,
        "arguments": request.arguments,
        "meta": meta,
    });
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes()));
    if let Err(e) = appended {
        eprintln!("tessera-mcp-testserver: cannot log the call: {e}");
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("--stdio") => {
            let running = TestServer.serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
        }
        Some("--http") => {
            let service = TowerToHyperService::new(StreamableHttpService::new(
                || Ok(TestServer),
                LocalSessionManager::default().into(),
                Default::default(),
            ));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            println!("listening on http://{}/mcp", listener.local_addr()?);
            loop {
                let (stream, _) = listener.accept().await?;
                let service = service.clone();
                tokio::spawn(async move {
                    let _ = Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
        _ => anyhow::bail!("usage: tessera-mcp-testserver --stdio | --http"),
    }
    Ok(())
}
