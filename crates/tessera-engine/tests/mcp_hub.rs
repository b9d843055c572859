//! The `McpHub` with a server that cannot start: a call gets a clear error at once (never a
//! wait), and so does the next one, during or after the back-off. Restarts of a live server
//! that dies are tested end to end in `integration-tests/tests/mcp_tools.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_engine::mcp::{McpCatalog, McpSession};
use tessera_manifest::McpTransport;

#[actix_rt::test]
async fn a_server_that_cannot_start_is_a_clear_error_each_time() {
    let hub = McpCatalog::start_hub().unwrap_or_else(|e| panic!("{e}"));
    let missing = McpTransport::Stdio {
        command: "/nonexistent/mcp-server".to_owned(),
        args: Vec::new(),
        env: BTreeMap::new(),
    };
    for attempt in 0..2 {
        let session = hub
            .send(McpSession {
                server: missing.clone(),
                name: Arc::from("ghost"),
            })
            .await
            .unwrap_or_else(|e| panic!("hub: {e}"));
        match session {
            Err(message) => assert!(
                message.contains("MCP server \"ghost\" is unavailable")
                    && message.contains("could not start"),
                "attempt {attempt}: {message}"
            ),
            Ok(_) => panic!("attempt {attempt}: a missing program gave a session"),
        }
    }
}
