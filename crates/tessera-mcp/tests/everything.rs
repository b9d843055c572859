//! Interop with the MCP reference server `@modelcontextprotocol/server-everything` (the
//! TypeScript SDK's) over stdio, installed by `scripts/install-mcp-everything.sh`. Without it
//! the test prints that it is skipped, and fails under `CI=true`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, json};
use tessera_mcp::{McpConnection, McpEndpoint};

fn everything_entry() -> Option<PathBuf> {
    let entry = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
        "../../target/mcp-everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    );
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    (node && entry.is_file()).then_some(entry)
}

#[tokio::test]
async fn the_reference_everything_server_lists_and_echoes_over_stdio() {
    let Some(entry) = everything_entry() else {
        let message =
            "SKIPPED: node or server-everything missing; run scripts/install-mcp-everything.sh";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}");
        eprintln!("{message}");
        return;
    };
    let endpoint = McpEndpoint::Stdio {
        command: "node".to_owned(),
        args: vec![entry.display().to_string(), "stdio".to_owned()],
        env: BTreeMap::new(),
    };
    let deadline = Duration::from_secs(30);
    let conn = tokio::time::timeout(
        deadline,
        McpConnection::connect(&endpoint, &reqwest::Client::new()),
    )
    .await
    .unwrap_or_else(|_| panic!("connect timed out"))
    .unwrap_or_else(|e| panic!("connect: {e}"));
    let tools = tokio::time::timeout(deadline, conn.list_tools())
        .await
        .unwrap_or_else(|_| panic!("tools/list timed out"))
        .unwrap_or_else(|e| panic!("tools/list: {e}"));
    let echo = tools
        .iter()
        .find(|t| t.name == "echo")
        .unwrap_or_else(|| panic!("no echo tool in {tools:?}"));
    assert_eq!(echo.input_schema["type"], "object");
    let mut args = Map::new();
    args.insert("message".to_owned(), json!("hello from tessera"));
    let result = tokio::time::timeout(deadline, conn.call("echo", args))
        .await
        .unwrap_or_else(|_| panic!("tools/call timed out"))
        .unwrap_or_else(|e| panic!("tools/call: {e}"));
    assert_eq!(result["status"], "success", "{result}");
    assert!(
        result["result"]
            .as_str()
            .is_some_and(|t: &str| t.contains("hello from tessera")),
        "{result}"
    );
}
