//! `McpConnection` against a real MCP server (this crate's `tessera-mcp-testserver`, built on
//! rmcp's server side) over both transports: stdio (a child process) and Streamable HTTP.
//! Each transport: list and call; a server that crashes mid-call gives an error, not a wait;
//! a hanging call is bounded by the caller's timeout and the session stays usable.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tessera_mcp::{McpConnection, McpEndpoint};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const SERVER: &str = env!("CARGO_BIN_EXE_tessera-mcp-testserver");
/// Only reached when something is broken; no assertion depends on it.
const DEADLINE: Duration = Duration::from_secs(15);

fn stdio() -> McpEndpoint {
    McpEndpoint::Stdio {
        command: SERVER.to_owned(),
        args: vec!["--stdio".to_owned()],
        env: BTreeMap::new(),
    }
}

/// The HTTP test server process (killed when dropped) and its endpoint.
struct HttpServer {
    _child: Child,
    endpoint: McpEndpoint,
}

async fn http_server() -> HttpServer {
    let mut child = Command::new(SERVER)
        .arg("--http")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start the test server: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
        .unwrap_or_else(|| panic!("the test server printed no address"));
    let url = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    HttpServer {
        _child: child,
        endpoint: McpEndpoint::Http {
            url,
            headers: BTreeMap::from([("X-Test".to_owned(), "1".to_owned())]),
        },
    }
}

async fn connect(endpoint: &McpEndpoint) -> McpConnection {
    match tokio::time::timeout(
        DEADLINE,
        McpConnection::connect(endpoint, &reqwest::Client::new()),
    )
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => panic!("connect: {e}"),
        Err(_) => panic!("connect timed out"),
    }
}

fn args(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

async fn lists_and_calls(endpoint: &McpEndpoint) {
    let conn = connect(endpoint).await;
    let tools = conn
        .list_tools()
        .await
        .unwrap_or_else(|e| panic!("tools/list: {e}"));
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["echo", "crash", "hang"]);
    assert_eq!(tools[0].input_schema["required"], json!(["message"]));
    let echoed = conn.call("echo", args(json!({"message": "hi"}))).await;
    assert_eq!(
        echoed.ok(),
        Some(json!({"status": "success", "result": "hi"}))
    );
}

async fn crash_is_an_error_not_a_wait(endpoint: &McpEndpoint) {
    let conn = connect(endpoint).await;
    let result = tokio::time::timeout(DEADLINE, conn.call("crash", Map::new())).await;
    match result {
        Ok(Err(e)) => assert!(e.to_string().contains("did not answer"), "{e}"),
        Ok(Ok(v)) => panic!("a crashed server produced a result: {v}"),
        Err(_) => panic!("the call waited on a dead server"),
    }
}

async fn hang_is_bounded_and_the_session_stays_usable(endpoint: &McpEndpoint) {
    let conn = connect(endpoint).await;
    let hung =
        tokio::time::timeout(Duration::from_millis(200), conn.call("hang", Map::new())).await;
    assert!(hung.is_err(), "the hanging tool never answers");
    let echoed = tokio::time::timeout(
        DEADLINE,
        conn.call("echo", args(json!({"message": "still here"}))),
    )
    .await;
    assert_eq!(
        echoed.ok().and_then(Result::ok),
        Some(json!({"status": "success", "result": "still here"}))
    );
}

#[tokio::test]
async fn stdio_lists_and_calls_tools() {
    lists_and_calls(&stdio()).await;
}

#[tokio::test]
async fn stdio_server_that_crashes_mid_call_gives_an_error() {
    crash_is_an_error_not_a_wait(&stdio()).await;
}

#[tokio::test]
async fn stdio_hanging_call_is_bounded_and_the_session_stays_usable() {
    hang_is_bounded_and_the_session_stays_usable(&stdio()).await;
}

#[tokio::test]
async fn http_lists_and_calls_tools() {
    let server = http_server().await;
    lists_and_calls(&server.endpoint).await;
}

#[tokio::test]
async fn http_server_that_crashes_mid_call_gives_an_error() {
    let server = http_server().await;
    crash_is_an_error_not_a_wait(&server.endpoint).await;
}

#[tokio::test]
async fn http_hanging_call_is_bounded_and_the_session_stays_usable() {
    let server = http_server().await;
    hang_is_bounded_and_the_session_stays_usable(&server.endpoint).await;
}

#[tokio::test]
async fn a_server_that_cannot_start_is_a_clear_error() {
    let missing = McpEndpoint::Stdio {
        command: "/nonexistent/mcp-server".to_owned(),
        args: Vec::new(),
        env: BTreeMap::new(),
    };
    let err = McpConnection::connect(&missing, &reqwest::Client::new()).await;
    assert!(
        matches!(&err, Err(e) if e.to_string().contains("could not start")),
        "{err:?}"
    );
}

#[tokio::test]
async fn check_server_reports_missing_tools_of_a_reachable_server() {
    let transport = tessera_mcp::McpTransport::Stdio {
        command: SERVER.to_owned(),
        args: vec!["--stdio".to_owned()],
        env: BTreeMap::new(),
    };
    let allowed = ["echo".to_owned(), "nope".to_owned()];
    let check = tessera_mcp::check_server(&transport, &allowed, DEADLINE).await;
    assert_eq!(
        check,
        tessera_mcp::ServerCheck::Listed {
            listed: 3,
            missing: vec!["nope".to_owned()],
            unusable: Vec::new(),
        }
    );
}

#[tokio::test]
async fn check_server_reports_an_unreachable_server_and_a_missing_secret() {
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let down = tessera_mcp::McpTransport::Http {
        url: format!("http://127.0.0.1:{port}/mcp"),
        headers: BTreeMap::new(),
    };
    let check = tessera_mcp::check_server(&down, &["echo".to_owned()], DEADLINE).await;
    assert!(
        matches!(check, tessera_mcp::ServerCheck::Unreachable(_)),
        "{check:?}"
    );
    let unset = tessera_mcp::McpTransport::Http {
        url: format!("http://127.0.0.1:{port}/mcp"),
        headers: BTreeMap::from([(
            "Authorization".to_owned(),
            "Bearer ${env:TESSERA_MCP_TEST_SURELY_UNSET}".to_owned(),
        )]),
    };
    let check = tessera_mcp::check_server(&unset, &[], DEADLINE).await;
    assert!(
        matches!(&check, tessera_mcp::ServerCheck::Unreachable(why) if why.contains("TESSERA_MCP_TEST_SURELY_UNSET")),
        "{check:?}"
    );
}
