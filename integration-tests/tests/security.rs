//! Multi-tenant security and hostile input, against the real `tessera serve` binary over real
//! HTTP and WebSocket. Every test tries an attack and checks that it fails (see SECURITY.md).
//!
//! Servers here are started with a temporary TOML config passed with `--config`, their stderr
//! goes to a file so tests can grep the log, and their data dir is a temp dir so tests can grep
//! the raw SQLite bytes.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use integration_tests::{copy_dir, tessera_bin, workspace_root};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

const KEY_A: &str = "tk_tenant_a_4f0c2b9e8d7a6f5e";
const KEY_B: &str = "tk_tenant_b_9a8b7c6d5e4f3a2b";
const JWT_SECRET: &str = "jwt-hs256-test-secret-5d6e7f8091a2b3c4";
const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "tessera";
/// Upper bound on any single wait, so a broken test fails instead of hanging.
const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// A server under test

struct Srv {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
    data: PathBuf,
    log: PathBuf,
    http: reqwest::Client,
}

#[derive(Default, Clone)]
struct Opts {
    /// TOML after the generated `data_dir`/`workflows_dir` lines.
    toml: String,
    env: Vec<(String, String)>,
    workflows: Option<PathBuf>,
    /// Reuse a data dir (restart tests).
    data: Option<PathBuf>,
    rust_log: Option<String>,
}

impl Srv {
    async fn start(opts: Opts) -> Srv {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let data = opts.data.clone().unwrap_or_else(|| dir.path().join("data"));
        let workflows = opts
            .workflows
            .clone()
            .unwrap_or_else(|| workspace_root().join("workflows"));
        let config = dir.path().join("tessera.toml");
        let text = format!(
            "data_dir = {:?}\nworkflows_dir = {:?}\n{}",
            data.display().to_string(),
            workflows.display().to_string(),
            opts.toml
        );
        std::fs::write(&config, text).unwrap_or_else(|e| panic!("write config: {e}"));
        let log = dir.path().join("stderr.log");
        let log_file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("log: {e}"));
        let mut command = Command::new(tessera_bin());
        command
            .args(["serve", "--bind", "127.0.0.1:0", "--config"])
            .arg(&config)
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("TESSERA_DATA_DIR")
            .env_remove("TESSERA_WORKFLOWS_DIR")
            .env("RUST_LOG", opts.rust_log.as_deref().unwrap_or("info"))
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        for (k, v) in &opts.env {
            command.env(k, v);
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start tessera: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let mut lines = BufReader::new(stdout).lines();
        let base = tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix("tessera listening on ") {
                    return Some(url.trim().to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            panic!(
                "tessera did not start:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Srv {
            child,
            base,
            dir,
            data,
            log,
            http: reqwest::Client::new(),
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn ws_url(&self, chat: &str) -> String {
        format!(
            "{}/api/v1/chats/{chat}/ws",
            self.base.replacen("http", "ws", 1)
        )
    }

    /// A request with `headers`; returns (status, JSON body or Null).
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        headers: &[(&str, String)],
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        for (k, v) in headers {
            request = request.header(*k, v);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        match request.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap_or(Value::Null))
            }
            Err(e) => panic!("request failed: {e}"),
        }
    }

    async fn get(&self, path: &str, who: &[(&str, String)]) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, who, None).await
    }

    async fn post(&self, path: &str, who: &[(&str, String)], body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, who, Some(body))
            .await
    }

    async fn text(&self, path: &str) -> (u16, String) {
        match self.http.get(format!("{}{path}", self.base)).send().await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(e) => panic!("request failed: {e}"),
        }
    }

    async fn create_chat(&self, workflow: &str, who: &[(&str, String)]) -> String {
        let (status, body) = self
            .post("/api/v1/chats", who, json!({"workflow": workflow}))
            .await;
        assert_eq!(status, 201, "create chat: {body}");
        body["chat_id"].as_str().unwrap_or_default().to_owned()
    }

    /// A metric's value from `/metrics`.
    async fn metric(&self, name: &str) -> i64 {
        let (_, text) = self.text("/metrics").await;
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(-1)
    }

    /// Waits (bounded) until `metric` satisfies `pred`.
    async fn until_metric(&self, name: &str, pred: impl Fn(i64) -> bool) -> i64 {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let value = self.metric(name).await;
            if pred(value) {
                return value;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} stayed at {value}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every byte of the SQLite files in the data dir (db, -wal, -shm).
    fn database_bytes(&self) -> Vec<(String, Vec<u8>)> {
        std::fs::read_dir(&self.data)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("tessera.db"))
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap_or_default(),
                )
            })
            .collect()
    }

    async fn kill(mut self) -> tempfile::TempDir {
        let _ = self.child.kill().await;
        self.dir
    }
}

fn contains_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn fixture(name: &str) -> PathBuf {
    workspace_root()
        .join("integration-tests/tests/fixtures")
        .join(name)
}

/// Two tenants with API keys, plus JWTs (HS256 and RS256) and one allowed browser origin.
fn tenants_toml(extra: &str) -> String {
    format!(
        r#"
[auth]
allowed_origins = ["https://app.example"]
ticket_ttl_s = 30

[auth.jwt]
hs256_secret = "{JWT_SECRET}"
rs256_public_key_file = {pubkey:?}
issuer = "{ISSUER}"
audience = "{AUDIENCE}"

[[tenants]]
id = "tenant-a"
api_key_sha256 = ["{a}"]

[[tenants]]
id = "tenant-b"
api_key_sha256 = ["{b}"]

{extra}
"#,
        pubkey = fixture("jwt_rs256_public.pem").display().to_string(),
        a = sha256_hex(KEY_A.as_bytes()),
        b = sha256_hex(KEY_B.as_bytes()),
    )
}

/// Headers of an API-key caller.
fn key(key: &str, user: &str) -> Vec<(&'static str, String)> {
    vec![
        ("authorization", format!("Bearer {key}")),
        ("x-user-id", user.to_owned()),
    ]
}

fn bearer(token: &str) -> Vec<(&'static str, String)> {
    vec![("authorization", format!("Bearer {token}"))]
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn claims(tenant: &str, sub: &str) -> Value {
    json!({"sub": sub, "tenant": tenant, "iss": ISSUER, "aud": AUDIENCE, "exp": now_s() + 600})
}

fn hs256(claims: &Value, secret: &[u8]) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret),
    )
    .unwrap_or_else(|e| panic!("encode: {e}"))
}

fn rs256(claims: &Value) -> String {
    let pem = std::fs::read(fixture("jwt_rs256_private.pem")).unwrap_or_default();
    let key = EncodingKey::from_rsa_pem(&pem).unwrap_or_else(|e| panic!("rsa key: {e}"));
    jsonwebtoken::encode(&Header::new(Algorithm::RS256), claims, &key)
        .unwrap_or_else(|e| panic!("encode: {e}"))
}

// ---------------------------------------------------------------------------------------------
// A WebSocket client that also sees close frames and handshake headers

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

struct Ws {
    socket: Socket,
    events: Vec<Value>,
    /// Handshake response headers (lowercase name, value).
    headers: Vec<(String, String)>,
}

enum Next {
    Event(Value),
    Closed(Option<u16>, String),
}

/// Connects with extra request headers; `Err(status)` when the upgrade was refused.
async fn ws_connect(url: &str, headers: &[(&str, String)]) -> Result<Ws, u16> {
    let mut request = url
        .into_client_request()
        .unwrap_or_else(|e| panic!("url: {e}"));
    for (k, v) in headers {
        let value = v.parse().unwrap_or_else(|_| panic!("header {k}"));
        let name: tokio_tungstenite::tungstenite::http::HeaderName =
            k.parse().unwrap_or_else(|_| panic!("header name {k}"));
        request.headers_mut().insert(name, value);
    }
    match connect_async(request).await {
        Ok((socket, response)) => Ok(Ws {
            socket,
            events: Vec::new(),
            headers: response
                .headers()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_ascii_lowercase(),
                        v.to_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect(),
        }),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            Err(response.status().as_u16())
        }
        Err(e) => panic!("websocket connect failed: {e}"),
    }
}

async fn ws(url: &str, headers: &[(&str, String)]) -> Ws {
    match ws_connect(url, headers).await {
        Ok(ws) => ws,
        Err(status) => panic!("websocket refused with {status}"),
    }
}

impl Ws {
    async fn send(&mut self, frame: Value) {
        self.send_raw(Message::text(frame.to_string())).await;
    }

    async fn send_raw(&mut self, message: Message) {
        if let Err(e) = self.socket.send(message).await {
            panic!("send failed: {e}");
        }
    }

    /// Sends and reports whether the socket took it (false once the server closed).
    async fn try_send(&mut self, message: Message) -> bool {
        self.socket.send(message).await.is_ok()
    }

    async fn say(&mut self, content: &str) {
        self.send(json!({"type": "chat.user_message", "data": {"content": content}}))
            .await;
    }

    async fn next(&mut self) -> Next {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let item = match tokio::time::timeout_at(deadline, self.socket.next()).await {
                Ok(item) => item,
                Err(_) => panic!("no event within {WAIT:?}; got {:?}", self.types()),
            };
            match item {
                Some(Ok(Message::Text(text))) => {
                    let event: Value = serde_json::from_str(&text)
                        .unwrap_or_else(|e| panic!("server sent non-JSON: {e}"));
                    self.events.push(event.clone());
                    return Next::Event(event);
                }
                Some(Ok(Message::Close(frame))) => {
                    let (code, reason) = frame.map_or((None, String::new()), |f: CloseFrame| {
                        (Some(u16::from(f.code)), f.reason.to_string())
                    });
                    return Next::Closed(code, reason);
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return Next::Closed(None, String::new()),
            }
        }
    }

    async fn until_match(&mut self, kind: &str, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            match self.next().await {
                Next::Event(e) if e["type"] == kind && pred(&e) => return e,
                Next::Event(_) => {}
                Next::Closed(code, reason) => panic!(
                    "closed ({code:?} {reason}) while waiting for {kind}; got {:?}",
                    self.types()
                ),
            }
        }
    }

    async fn until(&mut self, kind: &str) -> Value {
        self.until_match(kind, |_| true).await
    }

    async fn until_ui_call(&mut self) -> Value {
        self.until_match("chat.tool_call", |e| e["data"]["awaiting_response"] == true)
            .await
    }

    /// Reads until the server closes; returns the close code and reason.
    async fn until_closed(&mut self) -> (Option<u16>, String) {
        loop {
            if let Next::Closed(code, reason) = self.next().await {
                return (code, reason);
            }
        }
    }

    fn types(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|e| e["type"].as_str().unwrap_or("?").to_owned())
            .collect()
    }

    fn all_text(&self) -> String {
        serde_json::to_string(&self.events).unwrap_or_default()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn answer(call: &Value, status: &str, data: Value) -> Value {
    json!({"type": "chat.tool_response", "data": {
        "corr": call["data"]["corr"], "status": status, "action": "submit", "data": data,
    }})
}

/// Walks a Generator demo chat to its ActionPlan UI call.
async fn generator_at_action_plan(srv: &Srv, who: &[(&str, String)]) -> (String, Ws, Value) {
    let chat = srv.create_chat("Generator", who).await;
    let mut socket = ws(&srv.ws_url(&chat), who).await;
    socket.until("chat.input_request").await;
    socket.say("Automate my weekly report").await;
    let plan = socket.until_ui_call().await;
    assert_eq!(plan["data"]["component_type"], "ActionPlan");
    (chat, socket, plan)
}

/// A copy of the shipped workflows, to tweak one manifest in a test.
fn workflows_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_dir(&workspace_root().join("workflows"), dir.path());
    dir
}

// ---------------------------------------------------------------------------------------------
// Auth

#[tokio::test]
async fn every_api_route_and_the_websocket_demand_a_valid_credential() {
    let srv = Srv::start(Opts {
        toml: tenants_toml(""),
        ..Opts::default()
    })
    .await;
    // Open endpoints carry no tenant data.
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(srv.text(path).await.0, 200, "{path} stays open");
    }
    let chat = srv.create_chat("TodoAssistant", &key(KEY_A, "alice")).await;

    // No credential, a wrong key, and forged/expired/misaddressed JWTs are all refused.
    let mut expired = claims("tenant-a", "alice");
    expired["exp"] = json!(now_s() - 3600);
    let mut wrong_aud = claims("tenant-a", "alice");
    wrong_aud["aud"] = json!("someone-else");
    let mut wrong_iss = claims("tenant-a", "alice");
    wrong_iss["iss"] = json!("https://evil.test");
    let mut unknown_tenant = claims("tenant-z", "alice");
    unknown_tenant["tenant"] = json!("tenant-z");
    let public_pem = std::fs::read(fixture("jwt_rs256_public.pem")).unwrap_or_default();
    let refused: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("no credential", vec![("x-user-id", "alice".to_owned())]),
        ("unknown API key", key("tk_guessed_key", "alice")),
        (
            "a key digest instead of the key",
            key(&sha256_hex(KEY_A.as_bytes()), "alice"),
        ),
        (
            "JWT signed with another secret",
            bearer(&hs256(&claims("tenant-a", "alice"), b"not-the-secret")),
        ),
        (
            "expired JWT",
            bearer(&hs256(&expired, JWT_SECRET.as_bytes())),
        ),
        (
            "wrong audience",
            bearer(&hs256(&wrong_aud, JWT_SECRET.as_bytes())),
        ),
        (
            "wrong issuer",
            bearer(&hs256(&wrong_iss, JWT_SECRET.as_bytes())),
        ),
        (
            "tenant not configured",
            bearer(&hs256(&unknown_tenant, JWT_SECRET.as_bytes())),
        ),
        (
            "RS256/HS256 confusion (public key as HMAC secret)",
            bearer(&hs256(&claims("tenant-a", "alice"), &public_pem)),
        ),
        (
            "alg none",
            bearer(&format!(
                "{}.{}.",
                b64url(br#"{"alg":"none","typ":"JWT"}"#),
                b64url(claims("tenant-a", "alice").to_string().as_bytes())
            )),
        ),
    ];
    let routes = [
        ("GET", "/api/v1/workflows".to_owned()),
        ("GET", "/api/v1/chats".to_owned()),
        ("GET", format!("/api/v1/chats/{chat}")),
        ("GET", format!("/api/v1/chats/{chat}/messages")),
        ("POST", format!("/api/v1/chats/{chat}/cancel")),
        ("POST", "/api/v1/ws-ticket".to_owned()),
    ];
    for (name, headers) in &refused {
        for (method, path) in &routes {
            let method: reqwest::Method = method.parse().unwrap_or(reqwest::Method::GET);
            let body = (method == reqwest::Method::POST).then(|| json!({"chat_id": chat}));
            let (status, body) = srv.call(method, path, headers, body).await;
            assert_eq!(status, 401, "{name} on {path}: {body}");
            assert!(!body.to_string().contains(KEY_A));
        }
        assert_eq!(
            ws_connect(&srv.ws_url(&chat), headers).await.err(),
            Some(401),
            "{name} on the websocket"
        );
    }

    // Valid credentials: API key, HS256 and RS256 JWTs (user from `sub`).
    assert_eq!(
        srv.get("/api/v1/workflows", &key(KEY_A, "alice")).await.0,
        200
    );
    let jwt = hs256(&claims("tenant-a", "alice"), JWT_SECRET.as_bytes());
    let (status, list) = srv.get("/api/v1/chats", &bearer(&jwt)).await;
    assert_eq!(status, 200);
    assert_eq!(
        list["chats"][0]["chat_id"],
        chat.as_str(),
        "same tenant and user"
    );
    let rsa = rs256(&claims("tenant-a", "alice"));
    assert_eq!(
        srv.get(&format!("/api/v1/chats/{chat}"), &bearer(&rsa))
            .await
            .0,
        200
    );

    // Browsers: the token rides in the subprotocol; only `tessera.v1` is echoed, and no
    // extension (permessage-deflate) is ever negotiated.
    let mut browser = ws(
        &srv.ws_url(&chat),
        &[
            (
                "sec-websocket-protocol",
                format!("tessera.v1, bearer.{jwt}"),
            ),
            (
                "sec-websocket-extensions",
                "permessage-deflate; client_max_window_bits".to_owned(),
            ),
            ("origin", "https://app.example".to_owned()),
        ],
    )
    .await;
    assert_eq!(browser.header("sec-websocket-protocol"), Some("tessera.v1"));
    assert_eq!(browser.header("sec-websocket-extensions"), None);
    browser.until("chat.session").await;

    // A foreign origin is refused on REST and on the upgrade; no Origin (non-browser) passes.
    let mut evil = key(KEY_A, "alice");
    evil.push(("origin", "https://evil.example".to_owned()));
    assert_eq!(srv.get("/api/v1/chats", &evil).await.0, 403);
    assert_eq!(ws_connect(&srv.ws_url(&chat), &evil).await.err(), Some(403));

    // Tickets: single use, bound to their chat, never the key in the URL.
    let (status, body) = srv
        .post(
            "/api/v1/ws-ticket",
            &key(KEY_A, "alice"),
            json!({"chat_id": chat}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["expires_in_s"], 30);
    let ticket = body["ticket"].as_str().unwrap_or_default().to_owned();
    assert!(!ticket.contains(KEY_A));
    let with_ticket = format!("{}?ticket={ticket}", srv.ws_url(&chat));
    let mut first = ws(&with_ticket, &[]).await;
    first.until("chat.session").await;
    assert_eq!(
        ws_connect(&with_ticket, &[]).await.err(),
        Some(401),
        "a ticket is single use"
    );
    let other = srv.create_chat("TodoAssistant", &key(KEY_A, "alice")).await;
    let (_, body) = srv
        .post(
            "/api/v1/ws-ticket",
            &key(KEY_A, "alice"),
            json!({"chat_id": chat}),
        )
        .await;
    let ticket = body["ticket"].as_str().unwrap_or_default();
    assert_eq!(
        ws_connect(&format!("{}?ticket={ticket}", srv.ws_url(&other)), &[])
            .await
            .err(),
        Some(401),
        "a ticket opens only the chat it was issued for"
    );
    let (status, _) = srv
        .post(
            "/api/v1/ws-ticket",
            &key(KEY_B, "alice"),
            json!({"chat_id": chat}),
        )
        .await;
    assert_eq!(status, 404, "no ticket for another tenant's chat");
    assert!(!srv.log_text().contains(KEY_A), "keys never reach the log");
}

/// Unpadded base64url, enough to forge an `alg: none` token.
fn b64url(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ABC[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Isolation

#[tokio::test]
async fn tenants_never_see_each_others_chats_files_tasks_or_metrics() {
    const CANARY_A: &str = "CANARY-tenant-a-5e1f9c";
    let srv = Srv::start(Opts {
        toml: tenants_toml(""),
        rust_log: Some("debug".into()),
        ..Opts::default()
    })
    .await;
    let a = key(KEY_A, "alice");
    // Same user name in the other tenant: isolation is by tenant, not only by user.
    let b = key(KEY_B, "alice");
    let b_jwt = bearer(&hs256(&claims("tenant-b", "alice"), JWT_SECRET.as_bytes()));

    // Tenant A plants a canary as a todo task and builds a Generator bundle.
    let todo = srv.create_chat("TodoAssistant", &a).await;
    let mut socket = ws(&srv.ws_url(&todo), &a).await;
    socket.until("chat.input_request").await;
    socket.say(CANARY_A).await;
    let added = socket.until("chat.tool_response").await;
    assert_eq!(added["data"]["payload"]["task"]["title"], CANARY_A);
    socket.until("chat.input_request").await;
    let (generator, mut gen_ws, plan) = generator_at_action_plan(&srv, &a).await;
    gen_ws
        .send(answer(&plan, "success", json!({"approved": true})))
        .await;
    let key_call = gen_ws.until_ui_call().await;
    gen_ws
        .send(answer(
            &key_call,
            "success",
            json!({"apiKey": "sk-x-1234567"}),
        ))
        .await;
    let download = gen_ws.until_ui_call().await;
    let path = download["data"]["payload"]["files"][0]["download_path"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(path.starts_with("/api/v1/chats/"), "{download}");
    let (status, _) = srv.get(&path, &a).await;
    assert_eq!(status, 200, "the owner downloads the bundle");

    // Tenant B (API key or JWT) reaches none of it: every answer is a plain 404.
    for who in [&b, &b_jwt, &key(KEY_A, "mallory")] {
        let (status, list) = srv.get("/api/v1/chats", who).await;
        assert_eq!(status, 200);
        assert!(!list.to_string().contains(&todo) && !list.to_string().contains(&generator));
        for chat in [&todo, &generator] {
            for (method, route, body) in [
                ("GET", format!("/api/v1/chats/{chat}"), None),
                ("GET", format!("/api/v1/chats/{chat}/messages"), None),
                (
                    "POST",
                    format!("/api/v1/chats/{chat}/cancel"),
                    Some(json!({})),
                ),
                (
                    "POST",
                    format!("/api/v1/chats/{chat}/input"),
                    Some(json!({"content": "hi"})),
                ),
                (
                    "POST",
                    format!("/api/v1/chats/{chat}/tool-responses"),
                    Some(json!({"corr": download["data"]["corr"], "status": "success"})),
                ),
                (
                    "POST",
                    "/api/v1/ws-ticket".to_owned(),
                    Some(json!({"chat_id": chat})),
                ),
            ] {
                let method: reqwest::Method = method.parse().unwrap_or(reqwest::Method::GET);
                let (status, body) = srv.call(method, &route, who, body).await;
                assert_eq!(status, 404, "{route}: {body}");
                assert!(!body.to_string().contains(CANARY_A));
            }
            assert_eq!(ws_connect(&srv.ws_url(chat), who).await.err(), Some(404));
        }
        let (status, _) = srv.get(&path, who).await;
        assert_eq!(status, 404, "the bundle's download path is owner-only");
    }

    // Tenant B's own tools see only B's tasks.
    let b_todo = srv.create_chat("TodoAssistant", &b).await;
    let mut b_ws = ws(&srv.ws_url(&b_todo), &b).await;
    b_ws.until("chat.input_request").await;
    b_ws.say("b's own task").await;
    b_ws.until("chat.input_request").await;
    assert!(
        !b_ws.all_text().contains(CANARY_A),
        "nothing of A reached B"
    );

    // A's chats are still A's: they kept working and their data is intact.
    let (status, messages) = srv.get(&format!("/api/v1/chats/{todo}/messages"), &a).await;
    assert_eq!(status, 200);
    assert!(messages.to_string().contains(CANARY_A));

    // Metrics carry no chat or content; tenant ids only as the token-usage series' label.
    let (_, metrics) = srv.text("/metrics").await;
    for needle in [CANARY_A, todo.as_str(), generator.as_str()] {
        assert!(!metrics.contains(needle), "/metrics leaks {needle}");
    }
    for line in metrics.lines().filter(|l| l.contains("tenant-")) {
        assert!(
            line.starts_with("tessera_gen_ai_client_token_usage_total{tenant="),
            "/metrics names a tenant outside the usage series: {line}"
        );
    }
    // Keys never reach the log; chat content is not logged.
    let log = srv.log_text();
    for needle in [KEY_A, KEY_B, CANARY_A] {
        assert!(!log.contains(needle), "the log contains {needle}");
    }
}

// ---------------------------------------------------------------------------------------------
// Correlation ids

#[tokio::test]
async fn replayed_forged_and_foreign_correlation_ids_are_refused_and_never_logged() {
    const PAYLOAD_CANARY: &str = "CANARY-corr-payload-0b7d1e";
    let srv = Srv::start(Opts {
        toml: tenants_toml(""),
        rust_log: Some("debug".into()),
        ..Opts::default()
    })
    .await;
    let a = key(KEY_A, "alice");
    let b = key(KEY_B, "alice");
    let (a_chat, mut a_ws, a_plan) = generator_at_action_plan(&srv, &a).await;
    let (_b_chat, mut b_ws, b_plan) = generator_at_action_plan(&srv, &b).await;
    assert_ne!(a_plan["data"]["corr"], b_plan["data"]["corr"]);

    // B answers A's call over its own socket: refused, A's call stays pending.
    b_ws.send(answer(&a_plan, "success", json!({"note": PAYLOAD_CANARY})))
        .await;
    let refused = b_ws.until("chat.error").await;
    assert_eq!(refused["data"]["code"], "unknown_correlation");
    // ... and over REST, through B's chat and directly at A's chat.
    let body = json!({"corr": a_plan["data"]["corr"], "status": "success", "data": {"note": PAYLOAD_CANARY}});
    let (status, _) = srv
        .post(
            &format!("/api/v1/chats/{_b_chat}/tool-responses"),
            &b,
            body.clone(),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = srv
        .post(&format!("/api/v1/chats/{a_chat}/tool-responses"), &b, body)
        .await;
    assert_eq!(status, 404);

    // A forged corr is refused.
    let mut forged = a_plan.clone();
    forged["data"]["corr"] = json!("corr_00000000000000000000000000000000");
    a_ws.send(answer(&forged, "success", json!({"note": PAYLOAD_CANARY})))
        .await;
    let refused = a_ws.until("chat.error").await;
    assert_eq!(refused["data"]["code"], "unknown_correlation");

    // The real answer still works, once; its replay is refused.
    let (_, snapshot) = srv.get(&format!("/api/v1/chats/{a_chat}"), &a).await;
    assert_eq!(
        snapshot["pending_ui_calls"][0]["corr"],
        a_plan["data"]["corr"]
    );
    a_ws.send(answer(&a_plan, "success", json!({"approved": true})))
        .await;
    let ack = a_ws
        .until_match("chat.ack", |e| e["data"]["kind"] == "tool_response")
        .await;
    assert_eq!(ack["data"]["client_msg_id"], a_plan["data"]["corr"]);
    a_ws.send(answer(&a_plan, "success", json!({"note": PAYLOAD_CANARY})))
        .await;
    let refused = a_ws.until("chat.error").await;
    assert_eq!(refused["data"]["code"], "unknown_correlation");

    let log = srv.log_text();
    assert!(
        !log.contains(PAYLOAD_CANARY),
        "a refused answer's payload reached the log"
    );
    assert!(!b_ws.all_text().contains(PAYLOAD_CANARY));
}

// ---------------------------------------------------------------------------------------------
// LLM output is untrusted

/// Answers OpenAI chat completions from a script, in order; records every request body.
struct Script {
    replies: Mutex<VecDeque<Value>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl wiremock::Respond for Script {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        if let Ok(mut seen) = self.requests.lock() {
            seen.push(String::from_utf8_lossy(&request.body).into_owned());
        }
        let message = self
            .replies
            .lock()
            .ok()
            .and_then(|mut r| r.pop_front())
            .unwrap_or_else(|| json!({"role": "assistant", "content": "ok"}));
        let finish = if message.get("tool_calls").is_some() {
            "tool_calls"
        } else {
            "stop"
        };
        wiremock::ResponseTemplate::new(200).set_body_json(json!({
            "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "mock",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }))
    }
}

fn tool_calls(calls: &[(&str, Value)]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    json!({"role": "assistant", "content": null, "tool_calls": calls})
}

fn text_reply(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}

#[tokio::test]
async fn model_calls_to_foreign_tools_and_injected_arguments_never_run() {
    const BOB_CANARY: &str = "CANARY-bob-task-8c2a4f";
    let mock = wiremock::MockServer::start().await;
    let requests = Arc::new(Mutex::new(Vec::new()));
    let bob = vec![("x-user-id", "bob".to_owned())];
    let alice = vec![("x-user-id", "alice".to_owned())];
    let script = Script {
        replies: Mutex::new(VecDeque::from(vec![
            // bob: add a task
            tool_calls(&[("add_task", json!({"title": BOB_CANARY}))]),
            text_reply("added"),
        ])),
        requests: requests.clone(),
    };
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/chat/completions"))
        .respond_with(script)
        .mount(&mock)
        .await;
    let srv = Srv::start(Opts {
        env: vec![
            ("OPENAI_BASE_URL".into(), format!("{}/v1", mock.uri())),
            ("OPENAI_API_KEY".into(), "sk-test".into()),
            ("TESSERA_STREAM".into(), "0".into()),
        ],
        ..Opts::default()
    })
    .await;

    let bob_chat = srv.create_chat("TodoAssistant", &bob).await;
    let mut bob_ws = ws(&srv.ws_url(&bob_chat), &bob).await;
    bob_ws.until("chat.resume_boundary").await;
    bob_ws.say("remember this").await;
    let added = bob_ws.until("chat.tool_response").await;
    let bob_task = added["data"]["payload"]["task"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!bob_task.is_empty(), "{added}");
    bob_ws.until("chat.input_request").await;

    // alice's model: a tool TodoAgent does not own, and a delete of bob's task with injected
    // identity fields; then a plain answer.
    mock.reset().await;
    let script = Script {
        replies: Mutex::new(VecDeque::from(vec![
            tool_calls(&[
                (
                    "generate_and_download",
                    json!({"ActionPlan": {"name": "pwn"}}),
                ),
                (
                    "delete_task",
                    json!({"task_id": bob_task, "user_id": "bob", "app_id": "dev", "chat_id": bob_chat}),
                ),
            ]),
            text_reply("done"),
            // bob: list the tasks afterwards
            tool_calls(&[("list_tasks", json!({"status": "all"}))]),
            text_reply("listed"),
        ])),
        requests: requests.clone(),
    };
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/chat/completions"))
        .respond_with(script)
        .mount(&mock)
        .await;
    let alice_chat = srv.create_chat("TodoAssistant", &alice).await;
    let mut alice_ws = ws(&srv.ws_url(&alice_chat), &alice).await;
    alice_ws.until("chat.resume_boundary").await;
    alice_ws.say("do something").await;
    alice_ws.until("chat.input_request").await;

    for event in alice_ws.events.iter() {
        let data = &event["data"];
        if event["type"] == "chat.tool_response" && data["tool_name"] == "generate_and_download" {
            assert_eq!(
                data["success"], false,
                "a foreign tool never succeeds: {event}"
            );
        }
        if event["type"] == "chat.tool_response" && data["tool_name"] == "delete_task" {
            assert_eq!(data["success"], false, "bob's task is not alice's: {event}");
        }
        assert!(
            !(event["type"] == "chat.tool_call" && data["awaiting_response"] == true),
            "no UI tool was started: {event}"
        );
    }
    assert!(
        !alice_ws.all_text().contains("download_path"),
        "no bundle was built"
    );
    let (_, files) = srv
        .get(
            &format!("/api/v1/chats/{alice_chat}/files/anything"),
            &alice,
        )
        .await;
    assert_eq!(files["code"], "not_found");

    // bob's task survived, and alice's model context never saw it.
    bob_ws.say("what is on my list").await;
    let listed = bob_ws
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "list_tasks"
        })
        .await;
    assert!(listed.to_string().contains(BOB_CANARY), "{listed}");
    let seen = requests.lock().map(|r| r.clone()).unwrap_or_default();
    let alice_requests: Vec<&String> = seen.iter().filter(|r| r.contains("do something")).collect();
    assert!(
        alice_requests.len() >= 2,
        "the refusal went back to the model"
    );
    assert!(alice_requests.iter().all(|r| !r.contains(BOB_CANARY)));
    assert!(
        alice_requests
            .iter()
            .all(|r| !r.contains("\"name\":\"generate_and_download\",\"parameters\"")),
        "TodoAgent is never offered generate_and_download"
    );
}

// ---------------------------------------------------------------------------------------------
// Limits

#[tokio::test]
async fn oversize_frames_get_an_error_then_a_1009_close() {
    let srv = Srv::start(Opts {
        toml: "[limits]\nmax_frame_bytes = 1000\n".into(),
        ..Opts::default()
    })
    .await;
    let who = vec![("x-user-id", "frames".to_owned())];
    let chat = srv.create_chat("TodoAssistant", &who).await;
    let mut socket = ws(&srv.ws_url(&chat), &who).await;
    socket.until("chat.resume_boundary").await;
    socket.say(&"x".repeat(1500)).await;
    let error = socket.until("chat.error").await;
    assert_eq!(error["data"]["code"], "frame_too_large");
    socket.send(json!({"type": "chat.ping"})).await;
    socket
        .until_match("chat.ack", |e| e["data"]["kind"] == "pong")
        .await;
    socket.say(&"x".repeat(5000)).await;
    let (code, _) = socket.until_closed().await;
    assert_eq!(
        code,
        Some(1009),
        "beyond 4x the soft limit the socket closes"
    );
}

#[tokio::test]
async fn message_budgets_per_connection_and_per_tenant_refuse_then_close_with_1008() {
    let srv = Srv::start(Opts {
        toml: tenants_toml(""),
        env: vec![
            ("TESSERA_MESSAGES_PER_MINUTE".into(), "5".into()),
            ("TESSERA_MESSAGES_PER_MINUTE_PER_TENANT".into(), "8".into()),
            ("TESSERA_RATE_LIMIT_STRIKES".into(), "3".into()),
        ],
        ..Opts::default()
    })
    .await;
    let a = key(KEY_A, "alice");
    let ping = json!({"type": "chat.ping"});
    let chat = srv.create_chat("TodoAssistant", &a).await;

    // Per connection: 5 pass, then rate_limited, then 1008.
    let mut flood = ws(&srv.ws_url(&chat), &a).await;
    flood.until("chat.resume_boundary").await;
    for _ in 0..5 {
        flood.send(ping.clone()).await;
        flood
            .until_match("chat.ack", |e| e["data"]["kind"] == "pong")
            .await;
    }
    flood.send(ping.clone()).await;
    let limited = flood.until("chat.error").await;
    assert_eq!(limited["data"]["code"], "rate_limited");
    for _ in 0..5 {
        if !flood.try_send(Message::text(ping.to_string())).await {
            break;
        }
    }
    let (code, reason) = flood.until_closed().await;
    assert_eq!(code, Some(1008), "{reason}");

    // Per tenant: tenant A has used 8+ of its 8; a fresh connection of A is refused at once,
    // while tenant B is unaffected.
    let mut again = ws(&srv.ws_url(&chat), &a).await;
    again.until("chat.resume_boundary").await;
    again.send(ping.clone()).await;
    let limited = again.until("chat.error").await;
    assert_eq!(
        limited["data"]["code"], "rate_limited",
        "the tenant budget is shared"
    );
    let b = key(KEY_B, "bob");
    let b_chat = srv.create_chat("TodoAssistant", &b).await;
    let mut other = ws(&srv.ws_url(&b_chat), &b).await;
    other.until("chat.resume_boundary").await;
    other.send(ping).await;
    other
        .until_match("chat.ack", |e| e["data"]["kind"] == "pong")
        .await;
    assert!(srv.metric("tessera_ws_rate_limited_total").await >= 2);
}

#[tokio::test]
async fn open_chats_per_tenant_are_capped_with_429() {
    let srv = Srv::start(Opts {
        toml: tenants_toml(""),
        env: vec![("TESSERA_MAX_OPEN_CHATS_PER_TENANT".into(), "2".into())],
        ..Opts::default()
    })
    .await;
    let a = key(KEY_A, "alice");
    srv.create_chat("TodoAssistant", &a).await;
    srv.create_chat("TodoAssistant", &key(KEY_A, "carol")).await;
    let (status, body) = srv
        .post("/api/v1/chats", &a, json!({"workflow": "TodoAssistant"}))
        .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "too_many_chats");
    let (status, _) = srv
        .post(
            "/api/v1/run",
            &a,
            json!({"workflow": "TodoAssistant", "message": "x"}),
        )
        .await;
    assert_eq!(status, 429, "the run endpoint counts too");
    srv.create_chat("TodoAssistant", &key(KEY_B, "bob")).await;
}

/// A server with a 1 s idle timeout (a beat every 500 ms; a client quiet for 250 ms is
/// pinged), and a socket of `user`'s to a new chat on it.
async fn socket_with_a_short_idle_timeout(user: &str) -> (Srv, Ws) {
    let srv = Srv::start(Opts {
        env: vec![("TESSERA_IDLE_TIMEOUT_S".into(), "1".into())],
        ..Opts::default()
    })
    .await;
    let who = vec![("x-user-id", user.to_owned())];
    let chat = srv.create_chat("TodoAssistant", &who).await;
    let socket = ws(&srv.ws_url(&chat), &who).await;
    (srv, socket)
}

#[tokio::test]
async fn a_silent_client_is_closed_by_the_idle_timeout() {
    // Never read: the client answers no ping, so the server hears nothing.
    let (srv, mut silent) = socket_with_a_short_idle_timeout("idle").await;
    srv.until_metric("tessera_ws_connections", |v| v == 1).await;
    srv.until_metric("tessera_ws_connections", |v| v == 0).await;
    let (code, reason) = silent.until_closed().await;
    assert_eq!(code, Some(1001), "{reason}");
    assert_eq!(reason, "idle timeout");
}

#[tokio::test]
async fn a_quiet_client_that_answers_pings_is_pinged_and_stays_open() {
    let (srv, mut quiet) = socket_with_a_short_idle_timeout("quiet").await;
    // The client only reads: reading answers each ping with a pong (tungstenite flushes it on
    // the next read). Four pings take two idle timeouts, so without the pongs the server
    // would have closed the socket before the fourth.
    let deadline = tokio::time::Instant::now() + WAIT;
    while srv.metric("tessera_ws_pings_total").await < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "fewer than 4 pings within {WAIT:?}"
        );
        match tokio::time::timeout(Duration::from_millis(50), quiet.socket.next()).await {
            Err(_) | Ok(Some(Ok(Message::Text(_) | Message::Ping(_)))) => {}
            Ok(other) => panic!("the quiet client's socket ended: {other:?}"),
        }
    }
    assert_eq!(srv.metric("tessera_ws_connections").await, 1);
}

#[tokio::test]
async fn a_client_that_never_reads_is_cut_off_and_its_backlog_dropped() {
    // A workflow that never runs out of turns, so the flood can go on as long as needed.
    let workflows = workflows_copy();
    let path = workflows.path().join("TextToolkit/workflow.json");
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
    manifest["max_turns"] = json!(100_000);
    std::fs::write(&path, manifest.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let srv = Srv::start(Opts {
        workflows: Some(workflows.path().to_path_buf()),
        // Room for one whole turn's events (~27) queued at once, so that the reading client
        // is never cut off while the test process is slow to read (it was, once, at 8); the
        // stalled client still passes it within a few rounds once its socket is full.
        env: vec![
            ("TESSERA_OUTBOUND_QUEUE".into(), "64".into()),
            ("TESSERA_MESSAGES_PER_MINUTE".into(), "100000".into()),
            (
                "TESSERA_MESSAGES_PER_MINUTE_PER_TENANT".into(),
                "100000".into(),
            ),
            ("TESSERA_MAX_FRAME_BYTES".into(), "200000".into()),
        ],
        ..Opts::default()
    })
    .await;
    let who = vec![("x-user-id", "flood".to_owned())];
    let chat = srv.create_chat("TextToolkit", &who).await;
    let mut stalled = ws(&srv.ws_url(&chat), &who).await;
    let mut driver = ws(&srv.ws_url(&chat), &who).await;
    driver.until("chat.input_request").await;
    // ~128 KiB per message, echoed in several events: the stalled socket's buffers fill fast.
    let big = "\u{1F642}".repeat(32_000);
    // ~60 rounds push well over any loopback socket buffers; after that the stalled
    // connection's queue only has to stay over its limit.
    for _ in 0..60 {
        if srv.metric("tessera_ws_slow_consumers_total").await >= 1 {
            break;
        }
        driver.say(&big).await;
        driver.until("chat.input_request").await;
    }
    srv.until_metric("tessera_ws_slow_consumers_total", |v| v >= 1)
        .await;
    let published = driver
        .events
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .max()
        .unwrap_or(0);
    // The healthy client is unaffected; the stalled one gets what was already in flight, then
    // a 1008 close — not the whole backlog.
    driver.say("still alive").await;
    driver.until("chat.input_request").await;
    let (code, reason) = stalled.until_closed().await;
    assert_eq!(code, Some(1008), "{reason}");
    assert!(reason.contains("does not read"), "{reason}");
    let received = stalled
        .events
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .max()
        .unwrap_or(0);
    assert!(
        received < published,
        "the backlog was dropped ({received} of {published} events delivered)"
    );
}

// ---------------------------------------------------------------------------------------------
// Secrets

#[tokio::test]
async fn collected_secrets_are_encrypted_at_rest_survive_a_restart_and_leak_nowhere() {
    const SECRET: &str = "sk-CANARY-secret-3f9b7d1c5e";
    let key_hex = "5a".repeat(32);
    let toml = format!("[secrets]\nkey_hex = \"{key_hex}\"\n");
    let opts = Opts {
        toml: toml.clone(),
        rust_log: Some("debug".into()),
        ..Opts::default()
    };
    let srv = Srv::start(opts.clone()).await;
    let who = vec![("x-user-id", "alice".to_owned())];
    let (chat, mut socket, plan) = generator_at_action_plan(&srv, &who).await;
    socket
        .send(answer(&plan, "success", json!({"approved": true})))
        .await;
    let key_call = socket.until_ui_call().await;
    assert_eq!(key_call["data"]["tool_name"], "request_api_key");
    // The user gives the key but does not confirm yet (status error): the chat then waits for
    // the user, with the key in its vault.
    socket
        .send(answer(
            &key_call,
            "error",
            json!({"service": "openai", "apiKey": SECRET}),
        ))
        .await;
    socket.until("chat.input_request").await;
    // The snapshot is answered after the vault write (the session waits for it).
    let (_, snapshot) = srv.get(&format!("/api/v1/chats/{chat}"), &who).await;
    assert_eq!(snapshot["status"], "awaiting_user");
    // Kill only once the store holds the whole event log and state.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, snap) = srv.get(&format!("/api/v1/chats/{chat}"), &who).await;
        if snap["persisted_seq"] == snap["last_seq"] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store never caught up: {snap}"
        );
        tokio::task::yield_now().await;
    }
    let mut seen = socket.all_text();
    let mut logs = srv.log_text();
    let data_dir = srv.data.clone();
    let first = srv.kill().await;

    // Restart on the same data dir and key: the chat comes back, and so does its vault.
    let srv = Srv::start(Opts {
        data: Some(data_dir),
        ..opts
    })
    .await;
    let mut socket = ws(&srv.ws_url(&chat), &who).await;
    socket.until("chat.resume_boundary").await;
    socket.say("ok, use the key I gave").await;
    let key_call = socket.until_ui_call().await;
    socket
        .send(answer(&key_call, "success", json!({"service": "openai"})))
        .await;
    let download = socket.until_ui_call().await;
    assert_eq!(download["data"]["tool_name"], "generate_and_download");
    assert_eq!(
        download["data"]["payload"]["api_key_provided"], true,
        "the tool that declares uses_secrets saw the key collected before the restart"
    );
    let path = download["data"]["payload"]["files"][0]["download_path"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let bundle = match srv
        .http
        .get(format!("{}{path}", srv.base))
        .header("x-user-id", "alice")
        .send()
        .await
    {
        Ok(r) => r.bytes().await.map(|b| b.to_vec()).unwrap_or_default(),
        Err(e) => panic!("download: {e}"),
    };
    assert!(bundle.starts_with(b"PK"));
    assert!(
        contains_bytes(&bundle, b"API key: provided"),
        "the bundle records that a key was given"
    );
    assert!(
        !contains_bytes(&bundle, SECRET.as_bytes()),
        "but not the key"
    );

    // While pending, the database holds the vault only encrypted.
    for (file, bytes) in srv.database_bytes() {
        assert!(
            !contains_bytes(&bytes, SECRET.as_bytes()),
            "{file} holds the secret in clear"
        );
    }
    socket
        .send(answer(&download, "success", json!({"downloaded": true})))
        .await;
    socket.until("chat.run_complete").await;

    seen.push_str(&socket.all_text());
    let (_, messages) = srv
        .get(&format!("/api/v1/chats/{chat}/messages?limit=500"), &who)
        .await;
    let (_, snapshot) = srv.get(&format!("/api/v1/chats/{chat}"), &who).await;
    let (_, metrics) = srv.text("/metrics").await;
    logs.push_str(&srv.log_text());
    assert!(logs.contains("DEBUG"), "the log ran at debug level");
    for (what, text) in [
        ("events", seen),
        ("messages", messages.to_string()),
        ("snapshot", snapshot.to_string()),
        ("metrics", metrics),
        ("server log", logs),
    ] {
        assert!(!text.contains(SECRET), "the secret reached the {what}");
    }
    for (file, bytes) in srv.database_bytes() {
        assert!(
            !contains_bytes(&bytes, SECRET.as_bytes()),
            "{file} holds the secret in clear"
        );
    }
    drop(first);
}

// ---------------------------------------------------------------------------------------------
// Fuzzing over the wire

/// Random and malformed frames generated by proptest (deterministic seed, test-sized).
fn hostile_frames(cases: usize) -> Vec<Message> {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let json_leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,40}".prop_map(Value::from),
    ];
    let json_value = json_leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    let kinds = prop_oneof![
        Just("chat.user_message"),
        Just("chat.tool_response"),
        Just("chat.resume"),
        Just("chat.cancel"),
        Just("chat.ping"),
        Just("chat.nope"),
    ];
    let typed = (kinds, json_value.clone())
        .prop_map(|(kind, data)| Message::text(json!({"type": kind, "data": data}).to_string()));
    let strategy = prop_oneof![
        typed,
        json_value.prop_map(|v| Message::text(v.to_string())),
        ".{0,200}".prop_map(Message::text),
        prop::collection::vec(any::<u8>(), 0..300).prop_map(Message::binary),
    ];
    let mut runner = TestRunner::deterministic();
    (0..cases)
        .filter_map(|_| strategy.new_tree(&mut runner).ok().map(|t| t.current()))
        .collect()
}

#[tokio::test]
async fn hostile_frames_never_take_the_server_down() {
    let srv = Srv::start(Opts {
        env: vec![
            ("TESSERA_MESSAGES_PER_MINUTE".into(), "100000".into()),
            (
                "TESSERA_MESSAGES_PER_MINUTE_PER_TENANT".into(),
                "100000".into(),
            ),
        ],
        ..Opts::default()
    })
    .await;
    let who = vec![("x-user-id", "fuzz".to_owned())];
    let chat = srv.create_chat("Generator", &who).await;
    let url = srv.ws_url(&chat);
    let mut socket = ws(&url, &who).await;

    let mut frames = hostile_frames(256);
    // Hand-made nasties: deep nesting, huge numbers, wrong types, lone surrogates in JSON.
    frames.push(Message::text(format!(
        "{{\"type\":\"chat.user_message\",\"data\":{}{}}}",
        "[".repeat(20_000),
        "]".repeat(20_000)
    )));
    frames.push(Message::text(
        r#"{"type":"chat.user_message","data":{"content":"\ud800"}}"#,
    ));
    frames.push(Message::text(
        r#"{"type":"chat.resume","data":{"last_seq":1e999}}"#,
    ));
    frames.push(Message::text(
        r#"{"type":"chat.resume","data":{"last_seq":-1}}"#,
    ));
    frames.push(Message::text(
        r#"{"type":"chat.tool_response","data":{"corr":{"$gt":""},"status":"success"}}"#,
    ));
    frames.push(Message::text("\u{0}\u{FEFF}{}"));
    for frame in frames {
        if !socket.try_send(frame.clone()).await {
            // The server may close a socket that broke the protocol; open another.
            socket = ws(&url, &who).await;
            let _ = socket.try_send(frame).await;
        }
    }
    // Invalid UTF-8 in a text frame closes that socket (1007, see the test below).
    let raw = tokio_tungstenite::tungstenite::protocol::frame::Frame::message(
        vec![0xff, 0xfe, 0x80],
        tokio_tungstenite::tungstenite::protocol::frame::coding::OpCode::Data(
            tokio_tungstenite::tungstenite::protocol::frame::coding::Data::Text,
        ),
        true,
    );
    let mut broken = ws(&url, &who).await;
    let _ = broken.try_send(Message::Frame(raw)).await;
    let (code, _) = broken.until_closed().await;
    assert_ne!(code, Some(1000), "invalid UTF-8 is not a normal close");
    // A flood on one socket.
    let mut flood = ws(&url, &who).await;
    for _ in 0..2000 {
        if !flood
            .try_send(Message::text(r#"{"type":"chat.ping"}"#))
            .await
        {
            break;
        }
    }
    drop(flood);

    // The server is up and a canary chat still runs end to end.
    assert_eq!(srv.text("/healthz").await.0, 200);
    let canary = srv.create_chat("TodoAssistant", &who).await;
    let mut check = ws(&srv.ws_url(&canary), &who).await;
    check.until("chat.input_request").await;
    check.say("CANARY-after-fuzz").await;
    let added = check.until("chat.tool_response").await;
    assert_eq!(added["data"]["success"], true);
    let text = check
        .until_match("chat.text", |e| e["data"]["agent"] == "TodoAgent")
        .await;
    assert!(text.to_string().contains("CANARY-after-fuzz"));
    check.until("chat.input_request").await;
}

// ---------------------------------------------------------------------------------------------
// Frames an attacker announces but never finishes (raw TCP: a client library would not send them)

/// The reading half of a WebSocket opened on a raw TCP socket (see [`RawWs::open`]).
struct RawWs {
    reader: tokio::net::tcp::OwnedReadHalf,
    /// Bytes read but not yet parsed into frames.
    buf: Vec<u8>,
}

impl RawWs {
    /// Opens a WebSocket on a raw TCP socket, for frames no client library would send;
    /// returns the reading half and the raw writing half.
    async fn open(
        srv: &Srv,
        chat: &str,
        who: &[(&str, String)],
    ) -> (RawWs, tokio::net::tcp::OwnedWriteHalf) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let host = srv.base.trim_start_matches("http://").to_owned();
        let tcp = TcpStream::connect(&host)
            .await
            .unwrap_or_else(|e| panic!("connect: {e}"));
        let (mut reader, mut writer) = tcp.into_split();
        let mut request = format!(
            "GET /api/v1/chats/{chat}/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n"
        );
        for (k, v) in who {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str("\r\n");
        writer
            .write_all(request.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("handshake: {e}"));
        let mut buf = Vec::new();
        let end = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    return at + 4;
                }
                let mut chunk = [0u8; 4096];
                match reader.read(&mut chunk).await {
                    Ok(0) | Err(_) => panic!("the server closed during the handshake"),
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no handshake answer"));
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        assert!(head.starts_with("HTTP/1.1 101"), "upgrade refused: {head}");
        buf.drain(..end);
        (RawWs { reader, buf }, writer)
    }

    /// The next frame from the server: (opcode, payload); `None` once the connection ended.
    async fn next_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        use tokio::io::AsyncReadExt;
        loop {
            if let Some((opcode, payload, used)) = parse_server_frame(&self.buf) {
                self.buf.drain(..used);
                return Some((opcode, payload));
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.reader.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads frames until a close frame: its code; `None` when the connection ended without one.
    async fn close_code(&mut self) -> Option<u16> {
        while let Some((opcode, payload)) = self.next_frame().await {
            if opcode == 0x8 {
                return payload.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]]));
            }
        }
        None
    }
}

/// An unmasked server frame at the start of `buf`: (opcode, payload, bytes used).
fn parse_server_frame(buf: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    let (&b0, &b1) = (buf.first()?, buf.get(1)?);
    let (len, at) = match b1 & 0x7f {
        126 => (
            usize::from(u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?])),
            4,
        ),
        127 => {
            let bytes: [u8; 8] = buf.get(2..10)?.try_into().ok()?;
            (usize::try_from(u64::from_be_bytes(bytes)).ok()?, 10)
        }
        n => (usize::from(n), 2),
    };
    let payload = buf.get(at..at + len)?.to_vec();
    Some((b0 & 0x0f, payload, at + len))
}

/// A masked client frame header announcing `len` payload bytes (mask key all zero, so the
/// payload goes out as is).
fn client_frame_header(opcode: u8, len: u64) -> Vec<u8> {
    let mut header = vec![0x80 | opcode, 0x80 | 127];
    header.extend_from_slice(&len.to_be_bytes());
    header.extend_from_slice(&[0, 0, 0, 0]);
    header
}

/// The resident memory of process `pid` in KiB (`VmRSS` of `/proc/PID/status`).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS for pid {pid}"))
}

#[tokio::test]
async fn a_frame_announced_huge_is_refused_with_1009_before_its_payload_is_buffered() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    // Several attackers at once, each announcing 1 GiB and streaming up to 64 MiB of it.
    const CONNECTIONS: usize = 4;
    const ANNOUNCED: u64 = 1 << 30;
    const SEND_CAP: usize = 64 << 20;
    let srv = Srv::start(Opts::default()).await; // max_frame_bytes 64 KiB: hard limit 256 KiB
    let pid = srv.child.id().unwrap_or_else(|| panic!("no server pid"));
    let who = vec![("x-user-id", "bigframe".to_owned())];
    let chat = srv.create_chat("TodoAssistant", &who).await;
    let baseline = rss_kib(pid);

    let mut attacks = Vec::new();
    for _ in 0..CONNECTIONS {
        let (mut reader, mut writer) = RawWs::open(&srv, &chat, &who).await;
        let sent = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (sent_w, stop_w) = (sent.clone(), stop.clone());
        let writing = tokio::spawn(async move {
            if writer
                .write_all(&client_frame_header(0x1, ANNOUNCED))
                .await
                .is_err()
            {
                return;
            }
            let chunk = vec![b'a'; 64 * 1024];
            while !stop_w.load(Ordering::Relaxed) && sent_w.load(Ordering::Relaxed) < SEND_CAP {
                if writer.write_all(&chunk).await.is_err() {
                    return;
                }
                sent_w.fetch_add(chunk.len(), Ordering::Relaxed);
            }
        });
        let reading = tokio::spawn(async move {
            let code = tokio::time::timeout(Duration::from_secs(20), reader.close_code())
                .await
                .ok()
                .flatten();
            let sent_at_close = sent.load(Ordering::Relaxed);
            stop.store(true, Ordering::Relaxed);
            (code, sent_at_close)
        });
        attacks.push((reading, writing));
    }
    // Peak server memory while the attacks run.
    let mut peak = baseline;
    let mut outcomes = Vec::new();
    for (mut reading, writing) in attacks {
        let outcome = loop {
            tokio::select! {
                done = &mut reading => break done.unwrap_or((None, 0)),
                _ = tokio::time::sleep(Duration::from_millis(20)) => peak = peak.max(rss_kib(pid)),
            }
        };
        writing.abort();
        outcomes.push(outcome);
    }
    peak = peak.max(rss_kib(pid));
    for (code, sent_at_close) in &outcomes {
        assert_eq!(
            *code,
            Some(1009),
            "an announced-huge frame must close with 1009 early ({sent_at_close} bytes sent)"
        );
        // The server read 256 KiB (the hard limit); the rest is in the kernel's socket
        // buffers (up to tens of MiB on loopback), never in the server's memory.
        assert!(
            *sent_at_close < SEND_CAP / 2,
            "the close came only after {sent_at_close} bytes"
        );
    }
    let grown_mib = peak.saturating_sub(baseline) / 1024;
    println!(
        "bytes sent before each 1009: {:?}; server RSS {baseline} KiB -> peak {peak} KiB",
        outcomes.iter().map(|o| o.1).collect::<Vec<_>>()
    );
    assert!(
        grown_mib < 32,
        "server RSS grew by {grown_mib} MiB ({baseline} KiB -> {peak} KiB) under {CONNECTIONS} attacks"
    );
    // The server is fine.
    let mut check = ws(&srv.ws_url(&chat), &who).await;
    check.until("chat.resume_boundary").await;
}

// ---------------------------------------------------------------------------------------------
// REST inputs spend the same budgets

/// POSTs `body` to `path` as `who`: (status, `Retry-After` header).
async fn post_with_retry_after(
    srv: &Srv,
    path: &str,
    who: &[(&str, String)],
    body: Value,
) -> (u16, Option<u64>) {
    let mut request = srv.http.post(format!("{}{path}", srv.base)).json(&body);
    for (k, v) in who {
        request = request.header(*k, v);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("request failed: {e}"));
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (response.status().as_u16(), retry_after)
}

/// POSTs a user message to `chat` over REST: (status, `Retry-After`).
async fn post_input(
    srv: &Srv,
    chat: &str,
    who: &[(&str, String)],
    content: &str,
) -> (u16, Option<u64>) {
    let path = format!("/api/v1/chats/{chat}/input");
    post_with_retry_after(srv, &path, who, json!({"content": content})).await
}

#[tokio::test]
async fn rest_inputs_spend_a_per_caller_budget_and_the_tenant_budget_then_get_429() {
    let srv = Srv::start(Opts {
        toml: tenants_toml(""),
        env: vec![
            ("TESSERA_REST_INPUTS_PER_MINUTE".into(), "4".into()),
            ("TESSERA_MESSAGES_PER_MINUTE_PER_TENANT".into(), "6".into()),
        ],
        ..Opts::default()
    })
    .await;
    let alice = key(KEY_A, "alice");
    let chat = srv.create_chat("TodoAssistant", &alice).await;
    // Alice's own budget: 4 inputs pass the limiter (each may still be refused by the chat
    // with 409 while a turn runs), the fifth is refused with 429 and a Retry-After.
    for i in 0..4 {
        let (status, _) = post_input(&srv, &chat, &alice, &format!("task {i}")).await;
        assert!(matches!(status, 202 | 409), "input {i}: {status}");
    }
    let (status, retry_after) = post_input(&srv, &chat, &alice, "one too many").await;
    assert_eq!(status, 429, "the fifth input of a caller in a minute");
    assert!(
        retry_after.is_some_and(|s| (1..=60).contains(&s)),
        "Retry-After: {retry_after:?}"
    );
    let (status, retry_after) = post_with_retry_after(
        &srv,
        "/api/v1/run",
        &alice,
        json!({"workflow": "TodoAssistant", "message": "x"}),
    )
    .await;
    assert_eq!(status, 429, "/run spends the same budget");
    assert!(retry_after.is_some());

    // The tenant's budget (6 a minute) is now spent by Alice: Carol of the same tenant is
    // refused too, on REST and on a WebSocket, while tenant B is not.
    let carol = key(KEY_A, "carol");
    let carol_chat = srv.create_chat("TodoAssistant", &carol).await;
    let (status, _) = post_input(&srv, &carol_chat, &carol, "hello").await;
    assert_eq!(status, 429, "the tenant budget is shared by its callers");
    let mut socket = ws(&srv.ws_url(&carol_chat), &carol).await;
    socket.until("chat.resume_boundary").await;
    socket.send(json!({"type": "chat.ping"})).await;
    let limited = socket.until("chat.error").await;
    assert_eq!(limited["data"]["code"], "rate_limited");
    let bob = key(KEY_B, "bob");
    let bob_chat = srv.create_chat("TodoAssistant", &bob).await;
    let (status, _) = post_input(&srv, &bob_chat, &bob, "hello").await;
    assert_eq!(status, 202, "tenant B has its own budget");
}

// ---------------------------------------------------------------------------------------------
// A model that never stops talking

/// What the never-ending mock model saw.
#[derive(Default)]
struct Trickle {
    /// Request bodies, in arrival order.
    bodies: Vec<Value>,
    /// Streams the client hung up on.
    dropped: usize,
}

/// An OpenAI-compatible endpoint over real HTTP that answers every chat completion with an SSE
/// stream of one token a second, forever (until the client hangs up). Returns its base URL.
async fn trickle_model(seen: Arc<Mutex<Trickle>>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e}"));
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                // The request: headers, then Content-Length bytes of JSON.
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let (head_end, length) = loop {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..at]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (at + 4, length);
                    }
                };
                while buf.len() < head_end + length {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let body = serde_json::from_slice(&buf[head_end..head_end + length])
                    .unwrap_or(Value::Null);
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .bodies
                    .push(body);
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                            transfer-encoding: chunked\r\n\r\n";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                loop {
                    let event = format!(
                        "data: {}\n\n",
                        json!({"id": "c1", "object": "chat.completion.chunk", "model": "trickle",
                               "choices": [{"index": 0, "delta": {"content": "tick "}, "finish_reason": null}]})
                    );
                    let frame = format!("{:x}\r\n{event}\r\n", event.len());
                    if socket.write_all(frame.as_bytes()).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                seen.lock().unwrap_or_else(|p| p.into_inner()).dropped += 1;
            });
        }
    });
    format!("http://{addr}/v1")
}

#[tokio::test]
async fn a_model_that_streams_forever_is_cut_off_at_the_call_deadline_with_max_tokens_sent() {
    let seen = Arc::new(Mutex::new(Trickle::default()));
    let base_url = trickle_model(seen.clone()).await;
    // TodoAgent gets its own deadline (2 s) and token cap, under a long server default.
    let workflows = workflows_copy();
    let path = workflows.path().join("TodoAssistant/agents.json");
    let mut agents: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
    agents["agents"]["TodoAgent"]["call_deadline_s"] = json!(2);
    agents["agents"]["TodoAgent"]["max_tokens"] = json!(77);
    std::fs::write(&path, agents.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let srv = Srv::start(Opts {
        toml: "[llm]\ncall_deadline_s = 600\n".into(),
        workflows: Some(workflows.path().to_path_buf()),
        env: vec![
            ("OPENAI_BASE_URL".into(), base_url),
            ("OPENAI_API_KEY".into(), "test-key".into()),
        ],
        ..Opts::default()
    })
    .await;
    let who = vec![("x-user-id", "trickle".to_owned())];
    let chat = srv.create_chat("TodoAssistant", &who).await;
    let mut socket = ws(&srv.ws_url(&chat), &who).await;
    socket.until("chat.input_request").await;
    let started = tokio::time::Instant::now();
    socket.say("add a task").await;
    // Tokens keep coming (each well within the per-chunk timeout), yet the call ends.
    socket
        .until_match("chat.text_delta", |e| e["data"]["delta"] == "tick ")
        .await;
    let error = socket.until("chat.error").await;
    assert_eq!(error["data"]["code"], "llm_error", "{error}");
    assert!(
        error["data"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("2s") || m.contains("deadline")),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "cut off at the 2 s deadline, not {:?}",
        started.elapsed()
    );
    // The chat goes on: it waits for the user again.
    socket.until("chat.input_request").await;
    // The model call was cancelled (the server hung up on the stream) and asked for max_tokens.
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.lock().unwrap_or_else(|p| p.into_inner()).dropped == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream was never hung up on"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bodies = std::mem::take(&mut seen.lock().unwrap_or_else(|p| p.into_inner()).bodies);
    assert!(!bodies.is_empty());
    for body in &bodies {
        assert_eq!(body["max_tokens"], 77, "{body}");
        assert_eq!(body["stream"], true);
    }
}

// ---------------------------------------------------------------------------------------------
// Hidden coordination text

#[tokio::test]
async fn ui_hidden_text_never_reaches_a_client_not_even_as_a_streamed_delta() {
    let srv = Srv::start(Opts::default()).await;
    let who = vec![("x-user-id", "hidden".to_owned())];
    let (chat, socket, _plan) = generator_at_action_plan(&srv, &who).await;
    // InterviewAgent's second reply is the hidden trigger NEXT (Generator's demo script).
    let check = |events: &[Value]| {
        let hidden = events
            .iter()
            .find(|e| e["type"] == "chat.text" && e["data"]["ui_hidden"] == true)
            .unwrap_or_else(|| panic!("no hidden chat.text"));
        assert_eq!(hidden["data"]["content"], "NEXT");
        let hidden_id = &hidden["data"]["message_id"];
        let leaked: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "chat.text_delta")
            .filter(|e| e["data"]["message_id"] == *hidden_id || e["data"]["delta"] == "NEXT")
            .collect();
        assert!(leaked.is_empty(), "hidden text streamed: {leaked:?}");
    };
    check(&socket.events);
    // A client that resumes from the start is told the same.
    let mut replay = ws(&format!("{}?last_seq=0", srv.ws_url(&chat)), &who).await;
    replay.until("chat.resume_boundary").await;
    check(&replay.events);
    // Visible replies on this server do stream.
    let todo = srv.create_chat("TodoAssistant", &who).await;
    let mut visible = ws(&srv.ws_url(&todo), &who).await;
    visible.until("chat.input_request").await;
    visible.say("add a task to water the plants").await;
    visible.until("chat.text_delta").await;
}

// ---------------------------------------------------------------------------------------------
// One server per data dir

#[tokio::test]
async fn a_second_server_on_the_same_data_dir_refuses_to_start() {
    let first = Srv::start(Opts::default()).await;
    let who = vec![("x-user-id", "lock".to_owned())];
    first.create_chat("TodoAssistant", &who).await;
    let config = first.dir.path().join("second.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nworkflows_dir = {:?}\n",
            first.data.display().to_string(),
            workspace_root().join("workflows").display().to_string()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let second = Command::new(tessera_bin())
        .args(["serve", "--bind", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("TESSERA_DATA_DIR")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(WAIT, second)
        .await
        .unwrap_or_else(|_| panic!("the second server kept running on the same data dir"))
        .unwrap_or_else(|e| panic!("cannot run tessera: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the second server must fail");
    assert!(
        stderr.contains("another tessera process") && stderr.contains("tessera.lock"),
        "the refusal says why: {stderr}"
    );
    // The first server is unaffected; once it is gone the data dir is free again.
    assert_eq!(first.text("/healthz").await.0, 200);
    let data = first.data.clone();
    let dir = first.kill().await;
    let again = Srv::start(Opts {
        data: Some(data),
        ..Opts::default()
    })
    .await;
    assert_eq!(again.text("/healthz").await.0, 200);
    drop(dir);
}

#[tokio::test]
async fn binary_and_oversize_frames_spend_the_budget_and_a_flood_of_them_is_closed() {
    let srv = Srv::start(Opts {
        env: vec![
            ("TESSERA_MESSAGES_PER_MINUTE".into(), "5".into()),
            ("TESSERA_RATE_LIMIT_STRIKES".into(), "3".into()),
        ],
        ..Opts::default()
    })
    .await;
    let who = vec![("x-user-id", "flooder".to_owned())];
    let chat = srv.create_chat("TodoAssistant", &who).await;
    // Binary frames (refused as malformed) and 100 KiB text frames (over the 64 KiB soft limit,
    // under the 256 KiB hard one): each spends the budget like a good frame.
    let floods = [
        Message::binary(vec![0u8; 100]),
        Message::text("x".repeat(100 * 1024)),
    ];
    for flood in floods {
        let mut socket = ws(&srv.ws_url(&chat), &who).await;
        socket.until("chat.resume_boundary").await;
        for _ in 0..20 {
            if !socket.try_send(flood.clone()).await {
                break;
            }
        }
        let (code, reason) = socket.until_closed().await;
        let codes: Vec<&Value> = socket.events.iter().map(|e| &e["data"]["code"]).collect();
        assert!(
            codes.iter().any(|c| *c == "rate_limited"),
            "refused once over budget: {codes:?}"
        );
        assert_eq!(code, Some(1008), "{reason}");
    }
}

#[tokio::test]
async fn a_jwt_not_valid_yet_is_refused() {
    let srv = Srv::start(Opts {
        toml: tenants_toml(""),
        ..Opts::default()
    })
    .await;
    // Ten minutes ahead is far beyond the 30 s leeway; 5 s ahead is within it; a token that
    // became valid a minute ago is fine.
    for (nbf_offset_s, expected) in [(600, 401), (5, 200), (-60, 200)] {
        let mut token = claims("tenant-a", "alice");
        token["nbf"] = json!(now_s() + nbf_offset_s);
        let (status, body) = srv
            .get(
                "/api/v1/workflows",
                &bearer(&hs256(&token, JWT_SECRET.as_bytes())),
            )
            .await;
        assert_eq!(status, expected, "nbf now + {nbf_offset_s} s: {body}");
    }
}

#[tokio::test]
async fn invalid_utf8_in_a_text_frame_closes_with_1007() {
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    let srv = Srv::start(Opts::default()).await;
    let who = vec![("x-user-id", "utf8".to_owned())];
    let chat = srv.create_chat("TodoAssistant", &who).await;
    // A lone continuation byte, an overlong encoding, and a sequence cut off at the end.
    for bad in [
        vec![0x80],
        vec![b'{', 0xc0, 0xaf, b'}'],
        vec![b'a', 0xe2, 0x82],
    ] {
        let mut socket = ws(&srv.ws_url(&chat), &who).await;
        socket.until("chat.resume_boundary").await;
        let frame = Frame::message(bad.clone(), OpCode::Data(Data::Text), true);
        let _ = socket.try_send(Message::Frame(frame)).await;
        let (code, reason) = socket.until_closed().await;
        assert_eq!(code, Some(1007), "{bad:?}: {reason}");
    }
}

// ---------------------------------------------------------------------------------------------
// Memory that only grows

#[tokio::test]
async fn completed_chats_leave_memory_and_are_rebuilt_from_the_store_on_demand() {
    let srv = Srv::start(Opts::default()).await;
    let who = vec![("x-user-id", "finisher".to_owned())];
    let mut chats = Vec::new();
    for i in 0..20 {
        let (status, body) = srv
            .post(
                "/api/v1/chats",
                &who,
                json!({"workflow": "LoadTest", "context": {"finish_after_turn": true}}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let chat = body["chat_id"].as_str().unwrap_or_default().to_owned();
        let (status, body) = srv
            .post(
                &format!("/api/v1/chats/{chat}/input"),
                &who,
                json!({"content": format!("finish me {i}")}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        chats.push(chat);
    }
    // Every chat runs to its end, then leaves memory.
    srv.until_metric("tessera_chats_in_memory", |n| n == 0)
        .await;
    // Its owner still reads it whole: rebuilt from the store on demand.
    let (status, body) = srv.get(&format!("/api/v1/chats/{}", chats[0]), &who).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "completed");
    let (_, messages) = srv
        .get(&format!("/api/v1/chats/{}/messages", chats[0]), &who)
        .await;
    assert!(messages.to_string().contains("finish me 0"), "{messages}");
    let mut replay = ws(&srv.ws_url(&chats[1]), &who).await;
    replay
        .until_match("chat.run_complete", |e| e["data"]["reason"] == "terminate")
        .await;
    replay.until("chat.resume_boundary").await;
    // Anyone else still gets 404, exactly as before it left memory.
    let (status, _) = srv
        .get(
            &format!("/api/v1/chats/{}", chats[2]),
            &[("x-user-id", "mallory".to_owned())],
        )
        .await;
    assert_eq!(status, 404);
    // Once its reader is gone, the rebuilt chat leaves memory again.
    drop(replay);
    srv.until_metric("tessera_chats_in_memory", |n| n == 0)
        .await;
}

// ---------------------------------------------------------------------------------------------
// Streamed deltas do not pile up in memory

#[tokio::test]
async fn streamed_deltas_leave_the_in_memory_log_once_their_message_is_final() {
    const TURNS: usize = 4;
    const WORDS: usize = 16_000;
    let srv = Srv::start(Opts {
        env: vec![
            ("TESSERA_MAX_FRAME_BYTES".into(), "100000".into()),
            // 16,000 deltas a turn: room for all of them, so that a test client slowed by a
            // loaded machine is never cut off as a slow consumer (that limit has its own test).
            ("TESSERA_OUTBOUND_QUEUE".into(), "1000000".into()),
        ],
        ..Opts::default()
    })
    .await;
    let pid = srv.child.id().unwrap_or_else(|| panic!("no server pid"));
    let who = vec![("x-user-id", "deltas".to_owned())];
    let chat = srv.create_chat("TextToolkit", &who).await;
    let mut live = ws(&srv.ws_url(&chat), &who).await;
    live.until("chat.input_request").await;
    let before = rss_kib(pid);
    // The demo model streams its JSON tool call word by word, and that call quotes the user's
    // message: ~16,000 deltas per turn.
    let words = "w ".repeat(WORDS);
    for _ in 0..TURNS {
        live.say(&words).await;
        live.until("chat.input_request").await;
    }
    let grown_kib = rss_kib(pid).saturating_sub(before);
    let deltas: Vec<&Value> = live
        .events
        .iter()
        .filter(|e| e["type"] == "chat.text_delta")
        .collect();
    assert!(deltas.len() >= TURNS * WORDS, "{} deltas", deltas.len());
    // For the record only: RSS also moves with SQLite's caches and the allocator, so the
    // proof that the log drops deltas is the replay below (it is served from that log).
    println!(
        "{} deltas streamed; server RSS grew {grown_kib} KiB",
        deltas.len()
    );

    // What a resuming client receives: each message's final chat.text, not its deltas; the
    // other events all, with their seqs.
    let live_kept: Vec<u64> = live
        .events
        .iter()
        .filter(|e| e["seq"].as_u64() > Some(0) && e["type"] != "chat.text_delta")
        .filter_map(|e| e["seq"].as_u64())
        .collect();
    let check_replay = |replay: &Ws, boundary: &Value| {
        let replayed: Vec<&Value> = replay
            .events
            .iter()
            .filter(|e| e["seq"].as_u64() > Some(0))
            .collect();
        assert!(
            replayed.iter().all(|e| e["type"] != "chat.text_delta"),
            "deltas replayed"
        );
        let seqs: Vec<u64> = replayed.iter().filter_map(|e| e["seq"].as_u64()).collect();
        assert_eq!(seqs, live_kept, "every other event, in order, same seqs");
        assert_eq!(boundary["data"]["replayed"], json!(seqs.len()));
        let finals = replayed
            .iter()
            .filter(|e| e["type"] == "chat.text" && e["data"]["agent"] == "ToolkitAgent")
            .count();
        assert_eq!(finals, TURNS, "one final chat.text per turn");
    };
    let mut replay = ws(&format!("{}?last_seq=0", srv.ws_url(&chat)), &who).await;
    let boundary = replay.until("chat.resume_boundary").await;
    check_replay(&replay, &boundary);

    // The same after a restart, when the log is rebuilt from the store.
    let data = srv.data.clone();
    drop(replay);
    drop(live);
    let first = srv.kill().await;
    let srv = Srv::start(Opts {
        data: Some(data),
        ..Opts::default()
    })
    .await;
    let mut replay = ws(&format!("{}?last_seq=0", srv.ws_url(&chat)), &who).await;
    let boundary = replay.until("chat.resume_boundary").await;
    check_replay(&replay, &boundary);
    drop(first);
}

// ---------------------------------------------------------------------------------------------
// Idle open chats leave memory

/// A server that evicts idle open chats after `idle_s`, whose LoadTest form (`confirm_form`)
/// waits for its answer without a timeout (a timed wait keeps its chat in memory).
async fn evicting_server(idle_s: f64, toml: &str) -> (Srv, tempfile::TempDir) {
    let workflows = workflows_copy();
    let tools = workflows.path().join("LoadTest/tools.json");
    let text = std::fs::read_to_string(&tools).unwrap_or_else(|e| panic!("{e}"));
    let untimed = text.replace(
        "\"mode\": \"inline\" },\n      \"timeout_s\": 120",
        "\"mode\": \"inline\" }",
    );
    assert_ne!(text, untimed, "the form's timeout_s was not found");
    std::fs::write(&tools, untimed).unwrap_or_else(|e| panic!("{e}"));
    let srv = Srv::start(Opts {
        toml: format!("[limits]\nidle_chat_evict_s = {idle_s}\nui_timeout_s = 0.0\n{toml}"),
        workflows: Some(workflows.path().to_path_buf()),
        ..Opts::default()
    })
    .await;
    (srv, workflows)
}

/// The seqs of the chat's logged events (seq > 0) a socket received, in order.
fn logged_seqs(socket: &Ws) -> Vec<u64> {
    socket
        .events
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|seq| *seq > 0)
        .collect()
}

#[tokio::test]
async fn idle_open_chats_leave_memory_and_resume_exactly_where_they_stopped() {
    let (srv, _workflows) = evicting_server(2.0, "").await;
    let who = vec![("x-user-id", "idler".to_owned())];

    // Chat 1 waits for its user; chat 2 waits on a UI call nobody answers yet.
    let talk = srv.create_chat("LoadTest", &who).await;
    let mut socket = ws(&srv.ws_url(&talk), &who).await;
    socket.say("first words").await;
    socket.until("chat.run_start").await;
    socket.until("chat.input_request").await;
    let seen = logged_seqs(&socket);
    let last_before = seen.last().copied().unwrap_or(0);
    drop(socket);
    let (status, body) = srv
        .post(
            "/api/v1/chats",
            &who,
            json!({"workflow": "LoadTest", "context": {"ui_round_trip": true}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let form = body["chat_id"].as_str().unwrap_or_default().to_owned();
    let mut socket = ws(&srv.ws_url(&form), &who).await;
    socket.say("show me the form").await;
    let call = socket.until_ui_call().await;
    drop(socket);

    // Nobody connected, nothing running: both leave memory.
    srv.until_metric("tessera_chats_in_memory", |n| n == 0)
        .await;

    // Many lookups of the evicted chat at once (REST reads and sockets resuming mid-log):
    // exactly one session is rebuilt.
    let resume_from = last_before.saturating_sub(3);
    let url = format!("{}?last_seq={resume_from}", srv.ws_url(&talk));
    let path = format!("/api/v1/chats/{talk}");
    let reads = (0..8).map(|_| srv.get(&path, &who));
    let (reads, (first, second)) = tokio::join!(futures::future::join_all(reads), async {
        tokio::join!(ws(&url, &who), ws(&url, &who))
    });
    for (status, body) in &reads {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(body["status"], "awaiting_user");
        assert_eq!(body["last_seq"], json!(last_before));
    }
    assert_eq!(
        srv.metric("tessera_chats_in_memory").await,
        1,
        "one session for the rebuilt chat, none for the other"
    );

    // Resumed by seq with no gap, and the chat goes on from there on both sockets.
    for mut resumed in [first, second] {
        let boundary = resumed.until("chat.resume_boundary").await;
        assert_eq!(boundary["data"]["last_seq"], json!(last_before));
        let replayed = logged_seqs(&resumed);
        let expected: Vec<u64> = seen
            .iter()
            .copied()
            .filter(|seq| *seq > resume_from)
            .collect();
        assert_eq!(replayed, expected, "the missed events, in order, no gap");
        drop(resumed);
    }
    let mut socket = ws(
        &format!("{}?last_seq={last_before}", srv.ws_url(&talk)),
        &who,
    )
    .await;
    socket.until("chat.resume_boundary").await;
    socket.say("more words").await;
    socket.until("chat.run_start").await;
    socket.until("chat.input_request").await;
    let after = logged_seqs(&socket);
    let continued: Vec<u64> = (last_before + 1..=last_before + after.len() as u64).collect();
    assert_eq!(after, continued, "new events continue the seqs");
    drop(socket);

    // The UI call pending when its chat left memory is offered again under the same corr,
    // and answering it works exactly once.
    let corr = call["data"]["corr"].clone();
    let mut socket = ws(&srv.ws_url(&form), &who).await;
    let session = socket.until("chat.session").await;
    assert_eq!(session["data"]["status"], "awaiting_tool");
    assert_eq!(session["data"]["pending_ui_calls"][0]["corr"], corr);
    socket.until("chat.resume_boundary").await;
    let reply = answer(
        &call,
        "success",
        json!({"status": "success", "confirmed": true}),
    );
    socket.send(reply.clone()).await;
    socket
        .until_match("chat.tool_response", |e| {
            e["data"]["tool_name"] == "confirm_form"
        })
        .await;
    socket.until("chat.input_request").await;
    drop(socket);
    let (status, body) = srv
        .post(
            &format!("/api/v1/chats/{form}/tool-responses"),
            &who,
            reply["data"].clone(),
        )
        .await;
    assert_eq!(status, 404, "a second answer is refused: {body}");
    let mut replay = ws(&format!("{}?last_seq=0", srv.ws_url(&form)), &who).await;
    replay.until("chat.resume_boundary").await;
    let responses = replay
        .events
        .iter()
        .filter(|e| e["type"] == "chat.tool_response" && e["data"]["tool_name"] == "confirm_form")
        .count();
    assert_eq!(responses, 1, "{:?}", replay.types());
}

#[tokio::test]
async fn the_open_chat_quota_counts_chats_that_left_memory() {
    let (srv, _workflows) = evicting_server(1.0, "max_open_chats_per_tenant = 2\n").await;
    let who = vec![("x-user-id", "hoarder".to_owned())];
    for _ in 0..2 {
        srv.create_chat("LoadTest", &who).await;
    }
    srv.until_metric("tessera_chats_in_memory", |n| n == 0)
        .await;
    let (status, body) = srv
        .post("/api/v1/chats", &who, json!({"workflow": "LoadTest"}))
        .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "too_many_chats", "{body}");
}
