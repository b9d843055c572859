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

#[actix_rt::test]
async fn an_http_server_nobody_listens_for_is_one_clear_error() {
    let hub = McpCatalog::start_hub().unwrap_or_else(|e| panic!("{e}"));
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let absent = McpTransport::Http {
        url: format!("http://127.0.0.1:{port}/mcp"),
        headers: BTreeMap::new(),
    };
    let session = hub
        .send(McpSession {
            server: absent,
            name: Arc::from("absent"),
        })
        .await
        .unwrap_or_else(|e| panic!("hub: {e}"));
    match session {
        Err(message) => assert!(
            message.contains("MCP server \"absent\" is unavailable")
                && message.contains(&format!("nothing answers at 127.0.0.1:{port}")),
            "{message}"
        ),
        Ok(_) => panic!("a closed port gave a session"),
    }
}
