//! `run` and `idle`: many concurrent chats against a real server over REST and WebSocket.
//!
//! Every chat is one task: create it (`POST /api/v1/chats`), connect its socket from the next
//! source address, wait for `chat.resume_boundary`, then drive K turns (send a user message,
//! wait for the live `chat.input_request`), answering every UI tool at once. Every event is
//! checked: consecutive `seq`s (no gap, no duplicate), each agent/auto tool call answered by
//! exactly one `chat.tool_response`, each UI call announced (and answered) once.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::IsTerminal;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::report::{
    ErrorCounts, Latency, PeerUsage, Samples, ServerUsage, print_table, proc_status_number,
};

/// Options shared by `run` and `idle`.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// Server root, e.g. http://127.0.0.1:8080 (loopback only).
    #[arg(long)]
    pub url: String,
    /// Open the chats' sockets on this server root instead of `--url`'s: another node of a
    /// cluster, which then follows and drives chats its peer created (and owns).
    #[arg(long)]
    pub ws_url: Option<String>,
    /// Concurrent chats.
    #[arg(long, default_value_t = 100)]
    pub chats: usize,
    /// Workflow of every chat.
    #[arg(long, default_value = "LoadTest")]
    pub workflow: String,
    /// Spread chat starts over this many seconds.
    #[arg(long, default_value_t = 0.0)]
    pub ramp: f64,
    /// Source addresses bound round-robin, e.g. 127.0.0.2-127.0.0.9 or 127.0.0.2,127.0.0.3.
    #[arg(long)]
    pub source_ips: Option<String>,
    /// The server's pid, to read its memory from /proc/<pid>/status.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Extra context variables of every chat (a JSON object).
    #[arg(long)]
    pub context: Option<String>,
    /// Hard limit of the whole run, in seconds.
    #[arg(long, default_value_t = 600)]
    pub max_seconds: u64,
    /// Chats being created or connected at once.
    #[arg(long, default_value_t = 64)]
    pub connect_concurrency: usize,
    /// Runtime worker threads of the load generator.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// Options of `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: Common,
    /// Turns (user messages) per chat.
    #[arg(long, default_value_t = 5)]
    pub turns: u32,
    /// Follow every turn with a UI round trip (LoadTest: sets context `ui_round_trip`).
    #[arg(long)]
    pub ui: bool,
    /// Longest wait for any one event before the chat counts as stuck, in seconds.
    #[arg(long, default_value_t = 60)]
    pub event_timeout_s: u64,
    /// Mean think time of a simulated user before each next message, in milliseconds (each
    /// wait is spread over 0.5x-1.5x so chats do not move in lockstep). 0 sends at once,
    /// which saturates the server; a think time offers a fixed load instead, to measure
    /// latency (for example the UI round trip) below saturation.
    #[arg(long, default_value_t = 0)]
    pub think_ms: u64,
    /// Also write the JSON summary here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Processes of this name (e.g. `postgres`, `nats-server`: services on the same machine),
    /// found when all chats have connected: their CPU time and disk writes over the same
    /// window as the server's are reported in `peer_usage.NAME`. Repeatable.
    #[arg(long)]
    pub peer_comm: Vec<String>,
}

/// Options of `idle`.
#[derive(Debug, Clone, clap::Args)]
pub struct IdleArgs {
    #[command(flatten)]
    pub common: Common,
    /// Seconds to hold the chats open after all connected (memory is read after `settle_s`).
    #[arg(long, default_value_t = 5)]
    pub hold_s: u64,
    /// Seconds to wait after the last connection before reading the server's memory.
    #[arg(long, default_value_t = 2)]
    pub settle_s: u64,
    /// Also write the JSON summary here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// What every chat task shares.
struct Shared {
    /// Where the sockets go (`--url`'s server unless `--ws-url`).
    ws_server: SocketAddr,
    base: String,
    ws_base: String,
    workflow: String,
    context: Value,
    sources: Vec<Ipv4Addr>,
    http: reqwest::Client,
    gate: Semaphore,
    deadline: tokio::time::Instant,
    progress: Progress,
    /// Origin of the turn-end times in [`ChatOutcome::turn_ends`].
    origin: Instant,
}

#[derive(Default)]
struct Progress {
    connected: AtomicU64,
    finished: AtomicU64,
    failed: AtomicU64,
    turns: AtomicU64,
    /// Failures to open a chat printed so far (see [`Shared::open_failed`]).
    reported: AtomicU64,
}

/// Failures to open a chat printed with their cause; later ones are only counted.
const REPORTED_FAILURES: u64 = 20;

impl Shared {
    /// `code`, after printing why chat `i` could not be opened: the error's causes and the time
    /// since `since`, the failed step's start (the handshake's is the connect's end). Only the
    /// first [`REPORTED_FAILURES`] are printed, so that a server that refuses everything does
    /// not flood the terminal.
    fn open_failed(
        &self,
        i: usize,
        code: &'static str,
        since: Instant,
        why: &dyn std::error::Error,
    ) -> &'static str {
        if self.progress.reported.fetch_add(1, Ordering::Relaxed) < REPORTED_FAILURES {
            let mut text = why.to_string();
            let mut cause = why.source();
            while let Some(next) = cause {
                text.push_str(": ");
                text.push_str(&next.to_string());
                cause = next.source();
            }
            let ms = since.elapsed().as_secs_f64() * 1e3;
            eprintln!("chat {i}: {code} after {ms:.1} ms: {text}");
        }
        code
    }
}

/// The result of one chat.
#[derive(Default)]
struct ChatOutcome {
    turns: Samples,
    /// When each turn ended, as time since [`Shared::origin`] (for `steady_turns_per_s`).
    turn_ends: Samples,
    ui: Samples,
    errors: ErrorCounts,
    turns_done: u32,
    connected: bool,
    first_send: Option<Instant>,
    last_end: Option<Instant>,
}

impl ChatOutcome {
    fn error(&mut self, code: &str) {
        *self.errors.entry(code.to_owned()).or_default() += 1;
    }
}

type Socket = WebSocketStream<TcpStream>;

/// Parses `127.0.0.2-127.0.0.9` or a comma list; only loopback addresses are allowed.
fn parse_sources(spec: Option<&str>) -> anyhow::Result<Vec<Ipv4Addr>> {
    let Some(spec) = spec else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let a: Ipv4Addr = a
                    .trim()
                    .parse()
                    .with_context(|| format!("bad address {a}"))?;
                let b: Ipv4Addr = b
                    .trim()
                    .parse()
                    .with_context(|| format!("bad address {b}"))?;
                let (a, b) = (u32::from(a), u32::from(b));
                if b < a || b - a > 65_536 {
                    bail!("bad address range {part}");
                }
                out.extend((a..=b).map(Ipv4Addr::from));
            }
            None => out.push(
                part.parse()
                    .with_context(|| format!("bad address {part}"))?,
            ),
        }
    }
    if let Some(bad) = out.iter().find(|ip| !ip.is_loopback()) {
        bail!("source address {bad} is not in 127.0.0.0/8");
    }
    Ok(out)
}

/// A server root's `host:port` and address: loopback only.
async fn loopback_root(root: &str) -> anyhow::Result<(String, SocketAddr)> {
    let authority = root
        .trim_end_matches('/')
        .strip_prefix("http://")
        .with_context(|| format!("{root} must start with http://"))?;
    let server = tokio::net::lookup_host(authority)
        .await
        .with_context(|| format!("cannot resolve {authority}"))?
        .next()
        .with_context(|| format!("{authority} resolves to nothing"))?;
    if !server.ip().is_loopback() {
        bail!("the load generator only talks to 127.0.0.0/8; {server} is not loopback");
    }
    Ok((authority.to_owned(), server))
}

async fn shared(common: &Common) -> anyhow::Result<Arc<Shared>> {
    let base = common.url.trim_end_matches('/').to_owned();
    let (authority, server) = loopback_root(&base).await?;
    let (ws_authority, ws_server) = match &common.ws_url {
        Some(root) => loopback_root(root).await?,
        None => (authority.clone(), server),
    };
    let context = match &common.context {
        Some(text) => serde_json::from_str::<Value>(text).context("--context is not JSON")?,
        None => json!({}),
    };
    if !context.is_object() {
        bail!("--context must be a JSON object");
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(common.connect_concurrency)
        .timeout(Duration::from_secs(60))
        .build()
        .context("cannot build the HTTP client")?;
    Ok(Arc::new(Shared {
        ws_server,
        ws_base: format!("ws://{ws_authority}"),
        base,
        workflow: common.workflow.clone(),
        context,
        sources: parse_sources(common.source_ips.as_deref())?,
        http,
        gate: Semaphore::new(common.connect_concurrency.max(1)),
        deadline: tokio::time::Instant::now() + Duration::from_secs(common.max_seconds.max(1)),
        progress: Progress::default(),
        origin: Instant::now(),
    }))
}

/// Turns per second between the 10th and the 90th percentile of turn ends: the run without
/// its ramp-up and its tail. WHY: `turns_per_s` spans first send to last turn, and in a
/// closed-loop run with model latency the last chats finish their turns one model wait after
/// another once the others are done, so a run's tail is bound by latency, not CPU, however
/// cheap the server is (measured: 2-7% of a 3,000 x 10 run at 100 ms, docs/performance-log.md).
/// `None` with too few turns to tell, or when the 90th percentile lies past what the histogram
/// keeps.
fn steady_turns_per_s(turn_ends: &Latency) -> Option<f64> {
    let (from, to) = (turn_ends.quantile_us(0.10)?, turn_ends.quantile_us(0.90)?);
    if to >= Latency::MAX_US {
        return None;
    }
    let span_s = to.checked_sub(from).filter(|&us| us > 0)? as f64 / 1e6;
    (turn_ends.count() >= 100).then(|| turn_ends.count() as f64 * 0.8 / span_s)
}

fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("cannot start the runtime")
}

/// Creates chat `i` and connects its socket; returns the socket after `chat.resume_boundary`
/// has not yet been read (the caller reads everything).
async fn open_chat(shared: &Shared, i: usize) -> Result<Socket, &'static str> {
    let _permit = shared.gate.acquire().await.map_err(|_| "closed")?;
    let started = Instant::now();
    let user = format!("loadgen-{i}");
    let response = shared
        .http
        .post(format!("{}/api/v1/chats", shared.base))
        .header("x-user-id", &user)
        .json(&json!({"workflow": shared.workflow, "context": shared.context}))
        .send()
        .await
        .map_err(|e| shared.open_failed(i, "create_failed", started, &e))?;
    if !response.status().is_success() {
        return Err(if response.status().as_u16() == 429 {
            "create_rate_limited"
        } else {
            "create_refused"
        });
    }
    let body: Value = response
        .json()
        .await
        .map_err(|e| shared.open_failed(i, "create_bad_body", started, &e))?;
    let path = body["ws_url"].as_str().ok_or("create_bad_body")?;
    let url = format!("{}{path}?last_seq=0", shared.ws_base);
    let socket = if shared.ws_server.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|e| shared.open_failed(i, "socket_failed", started, &e))?;
    if !shared.sources.is_empty() && shared.ws_server.is_ipv4() {
        let ip = shared.sources[i % shared.sources.len()];
        socket
            .bind(SocketAddr::new(IpAddr::V4(ip), 0))
            .map_err(|e| shared.open_failed(i, "bind_failed", started, &e))?;
    }
    let stream = socket
        .connect(shared.ws_server)
        .await
        .map_err(|e| shared.open_failed(i, "connect_failed", started, &e))?;
    let connected = Instant::now();
    let _ = stream.set_nodelay(true);
    let mut request = url.into_client_request().map_err(|_| "bad_url")?;
    let header = user.parse().map_err(|_| "bad_user")?;
    request.headers_mut().insert("x-user-id", header);
    let config = WebSocketConfig::default()
        .read_buffer_size(8 * 1024)
        .write_buffer_size(0);
    let (socket, _) = tokio_tungstenite::client_async_with_config(request, stream, Some(config))
        .await
        .map_err(|e| shared.open_failed(i, "handshake_failed", connected, &e))?;
    Ok(socket)
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    seq: u64,
    #[serde(default, borrow)]
    data: Option<EventData<'a>>,
}

#[derive(Deserialize, Default)]
struct EventData<'a> {
    #[serde(default)]
    awaiting_response: bool,
    #[serde(default, borrow)]
    corr: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    code: Option<Cow<'a, str>>,
    #[serde(default)]
    recoverable: Option<bool>,
    #[serde(default, borrow)]
    interaction_type: Option<Cow<'a, str>>,
    /// `chat.resume_boundary`: the events its replay sent.
    #[serde(default)]
    replayed: Option<u64>,
    /// `chat.resume_boundary`: the seq live events go on from.
    #[serde(default)]
    last_seq: Option<u64>,
}

/// `mean` scaled by a factor in [0.5, 1.5) that differs per chat and turn (a cheap
/// deterministic hash: runs are repeatable).
fn think_time(mean: Duration, chat: usize, turn: u32) -> Duration {
    let h = (chat as u64)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(u64::from(turn).wrapping_mul(40_503));
    mean.mul_f64(0.5 + (h % 1000) as f64 / 1000.0)
}

fn user_message(chat: usize, turn: u32) -> Message {
    Message::text(
        json!({"type": "chat.user_message", "data": {"content": format!("load test message {turn} of chat {chat}")}})
            .to_string(),
    )
}

fn tool_answer(corr: &str) -> Message {
    Message::text(
        json!({"type": "chat.tool_response", "data": {"corr": corr, "status": "success", "action": "submit", "data": {"status": "success", "confirmed": true}}})
            .to_string(),
    )
}

/// Checks the seq of a logged event; updates `last`. A replay (`in_replay`: before its
/// `chat.resume_boundary`) skips the deltas of messages final by then, so its seqs may jump
/// (docs/protocol.md; its boundary counts what it sent); live events never do.
fn check_seq(last: &mut u64, seq: u64, in_replay: bool, out: &mut ChatOutcome) {
    if seq == 0 {
        return;
    }
    if seq == *last + 1 || (in_replay && seq > *last) {
        *last = seq;
    } else if seq <= *last {
        out.error("seq_duplicate");
    } else {
        out.error("seq_gap");
        *last = seq;
    }
}

/// Drives one chat through `turns` turns.
async fn drive_chat(
    shared: Arc<Shared>,
    i: usize,
    turns: u32,
    think: Duration,
    event_timeout: Duration,
    mut start: watch::Receiver<bool>,
) -> ChatOutcome {
    let mut out = ChatOutcome::default();
    let mut ws = match open_chat(&shared, i).await {
        Ok(ws) => ws,
        Err(code) => {
            out.error(code);
            shared.progress.failed.fetch_add(1, Ordering::Relaxed);
            return out;
        }
    };
    out.connected = true;
    shared.progress.connected.fetch_add(1, Ordering::Relaxed);
    // Turns start together once every chat is connected (or failed): N chats really run
    // concurrently, however long creating them took. Events meanwhile stay in the socket.
    let go = matches!(
        tokio::time::timeout_at(shared.deadline, start.wait_for(|go| *go)).await,
        Ok(Ok(_))
    );
    if !go {
        out.error("never_started");
        shared.progress.failed.fetch_add(1, Ordering::Relaxed);
        return out;
    }
    let mut last_seq = 0;
    let mut ready = false;
    // Events of the replay, before its `chat.resume_boundary`.
    let mut replayed = 0;
    // The chat's first `chat.input_request` (its invitation to type) has been seen.
    let mut invited = false;
    let mut turn_started: Option<Instant> = None;
    let mut open_calls: HashSet<String> = HashSet::new();
    let mut ui_seen: HashSet<String> = HashSet::new();
    let mut ui_sent: Option<Instant> = None;
    // TESSERA_LOADGEN_TRACE=1 prints every event of chat 0 with its arrival time.
    let trace = i == 0 && std::env::var_os("TESSERA_LOADGEN_TRACE").is_some();
    let origin = Instant::now();
    let result: Result<(), &'static str> = async {
        // Server pings do not count as progress: the wait is measured from the last event.
        let mut last_event = tokio::time::Instant::now();
        loop {
            let wait = shared.deadline.min(last_event + event_timeout);
            let frame = match tokio::time::timeout_at(wait, ws.next()).await {
                Err(_) => return Err("timeout"),
                Ok(None) | Ok(Some(Err(_))) => return Err("socket_closed"),
                Ok(Some(Ok(frame))) => frame,
            };
            let text = match frame {
                Message::Text(text) => {
                    last_event = tokio::time::Instant::now();
                    text
                }
                Message::Close(_) => return Err("socket_closed"),
                _ => continue,
            };
            if trace {
                eprintln!(
                    "{:>10.3} ms <- {}",
                    origin.elapsed().as_secs_f64() * 1e3,
                    &*text
                );
            }
            let Ok(event) = serde_json::from_str::<Event<'_>>(&text) else {
                out.error("bad_event");
                continue;
            };
            check_seq(&mut last_seq, event.seq, !ready, &mut out);
            if !ready && event.seq > 0 {
                replayed += 1;
            }
            let data = event.data.unwrap_or_default();
            let mut send = None;
            match &*event.kind {
                "chat.resume_boundary" => {
                    if !ready && data.replayed != Some(replayed) {
                        out.error("seq_replay_count");
                    }
                    // Live events go on from its `last_seq` (docs/protocol.md): the seqs up
                    // to it that the replay skipped have no event for clients.
                    last_seq = last_seq.max(data.last_seq.unwrap_or(0));
                    ready = true;
                }
                // The invitation, in the replay or after it: a cluster shows an event only
                // once it is durable, so a socket on another node may connect before the
                // chat's first `chat.input_request` is visible. Counting it as the end of a
                // first turn sent while it was on its way had the second message refused.
                "chat.input_request"
                    if !ready || (out.turns_done == 0 && turn_started.is_none()) =>
                {
                    invited = true;
                }
                "chat.input_request" if ready && turn_started.is_some() => {
                    let now = Instant::now();
                    if let Some(start) = turn_started.take() {
                        out.turns.record(now - start);
                    }
                    out.turn_ends.record(now - shared.origin);
                    out.last_end = Some(now);
                    if !open_calls.is_empty() {
                        out.error("tool_call_unanswered");
                        open_calls.clear();
                    }
                    out.turns_done += 1;
                    shared.progress.turns.fetch_add(1, Ordering::Relaxed);
                    if out.turns_done >= turns {
                        return Ok(());
                    }
                    if !think.is_zero() {
                        tokio::time::sleep(think_time(think, i, out.turns_done)).await;
                    }
                    send = Some(user_message(i, out.turns_done + 1));
                }
                "chat.run_complete" if ready => {
                    if turn_started.take().is_some() {
                        out.turns_done += 1;
                        shared.progress.turns.fetch_add(1, Ordering::Relaxed);
                    }
                    return if out.turns_done >= turns {
                        Ok(())
                    } else {
                        Err("chat_completed_early")
                    };
                }
                "chat.tool_call" => {
                    let corr = data.corr.as_deref().unwrap_or_default();
                    if data.awaiting_response {
                        if ui_seen.insert(corr.to_owned()) {
                            send = Some(tool_answer(corr));
                            ui_sent = Some(Instant::now());
                        } else {
                            out.error("ui_call_repeated");
                        }
                    } else if !open_calls.insert(corr.to_owned()) {
                        out.error("tool_call_duplicate");
                    }
                }
                "chat.tool_response" => {
                    let corr = data.corr.as_deref().unwrap_or_default();
                    if !open_calls.remove(corr) {
                        out.error("tool_response_unmatched");
                    }
                    if data.interaction_type.as_deref() == Some("auto_tool")
                        && let Some(sent) = ui_sent.take()
                    {
                        out.ui.record(sent.elapsed());
                    }
                }
                "chat.error" => {
                    out.error(data.code.as_deref().unwrap_or("error_without_code"));
                    if data.recoverable == Some(false) {
                        return Err("fatal_chat_error");
                    }
                }
                _ => {}
            }
            // The first message once the replay is over and the chat has invited it (only the
            // boundary or the invitation can make this true, and the send below starts the turn).
            if ready && invited && out.turns_done == 0 && turn_started.is_none() {
                // Offered load: first messages are spread too, not one burst.
                if !think.is_zero() {
                    tokio::time::sleep(think_time(think, i, 0)).await;
                }
                send = Some(user_message(i, 1));
            }
            if let Some(message) = send {
                if matches!(
                    event.kind.as_ref(),
                    "chat.resume_boundary" | "chat.input_request"
                ) {
                    let now = Instant::now();
                    turn_started = Some(now);
                    out.first_send.get_or_insert(now);
                }
                if trace {
                    eprintln!(
                        "{:>10.3} ms -> {message}",
                        origin.elapsed().as_secs_f64() * 1e3
                    );
                }
                match tokio::time::timeout_at(wait, ws.send(message)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Err("send_failed"),
                    Err(_) => return Err("send_timeout"),
                }
            }
        }
    }
    .await;
    if let Err(code) = result {
        out.error(code);
        shared.progress.failed.fetch_add(1, Ordering::Relaxed);
    } else {
        shared.progress.finished.fetch_add(1, Ordering::Relaxed);
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(None)).await;
    shared.progress.connected.fetch_sub(1, Ordering::Relaxed);
    out
}

/// Waits (bounded by the deadline) until every chat is connected or has failed.
async fn wait_connected(shared: &Shared, chats: usize) {
    loop {
        let p = &shared.progress;
        let settled = p.connected.load(Ordering::Relaxed) + p.failed.load(Ordering::Relaxed);
        if settled >= chats as u64 || tokio::time::Instant::now() >= shared.deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints a progress line to stderr every second until `stop` flips.
fn spawn_progress(
    shared: Arc<Shared>,
    total_chats: usize,
    total_turns: u64,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let started = Instant::now();
        let tty = std::io::stderr().is_terminal();
        let (mut last_turns, mut last_elapsed) = (0, 0);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => break,
            }
            let p = &shared.progress;
            let turns = p.turns.load(Ordering::Relaxed);
            let elapsed = started.elapsed().as_secs();
            if !tty && !elapsed.is_multiple_of(10) {
                continue;
            }
            eprint!(
                "{}[{:>4}s] open {:>6}  done {:>6}/{total_chats}  failed {:>5}  turns {:>8}/{total_turns} ({:>6}/s)   ",
                if tty { "\r" } else { "\n" },
                elapsed,
                p.connected.load(Ordering::Relaxed),
                p.finished.load(Ordering::Relaxed),
                p.failed.load(Ordering::Relaxed),
                turns,
                (turns - last_turns) / elapsed.saturating_sub(last_elapsed).max(1),
            );
            last_turns = turns;
            last_elapsed = elapsed;
            if tokio::time::Instant::now() >= shared.deadline {
                break;
            }
        }
        eprintln!();
    })
}

fn server_memory(pid: Option<u32>) -> Value {
    let Some(pid) = pid.map(|p| p.to_string()) else {
        return Value::Null;
    };
    let mib = |kib: Option<u64>| kib.map(|k| (k as f64 / 1024.0 * 10.0).round() / 10.0);
    json!({
        "peak_rss_MiB": mib(proc_status_number(&pid, "VmHWM")),
        "rss_MiB": mib(proc_status_number(&pid, "VmRSS")),
    })
}

fn write_json(path: Option<&PathBuf>, summary: &Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(summary)?;
    println!("{}", serde_json::to_string(summary)?);
    if let Some(path) = path {
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Runs `run`; returns whether the protocol checks all passed.
pub fn run(args: RunArgs) -> anyhow::Result<bool> {
    let mut common = args.common.clone();
    if args.ui {
        let mut context: Value = match &common.context {
            Some(text) => serde_json::from_str(text).context("--context is not JSON")?,
            None => json!({}),
        };
        if let Value::Object(map) = &mut context {
            map.insert("ui_round_trip".into(), Value::Bool(true));
        }
        common.context = Some(context.to_string());
    }
    let rt = runtime(common.threads)?;
    rt.block_on(async move {
        let shared = shared(&common).await?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let total_turns = common.chats as u64 * u64::from(args.turns);
        let progress = spawn_progress(shared.clone(), common.chats, total_turns, stop_rx);
        let event_timeout = Duration::from_secs(args.event_timeout_s.max(1));
        let started = Instant::now();
        let (go_tx, go_rx) = watch::channel(false);
        let mut tasks = Vec::with_capacity(common.chats);
        for i in 0..common.chats {
            let shared = shared.clone();
            let go = go_rx.clone();
            let offset = if common.chats > 1 {
                Duration::from_secs_f64(common.ramp.max(0.0) * i as f64 / common.chats as f64)
            } else {
                Duration::ZERO
            };
            let turns = args.turns;
            let think = Duration::from_millis(args.think_ms);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(offset).await;
                drive_chat(shared, i, turns, think, event_timeout, go).await
            }));
        }
        wait_connected(&shared, common.chats).await;
        let server_pid = common.server_pid.map(|p| p.to_string());
        let usage_at_start = server_pid.as_deref().and_then(ServerUsage::read);
        let peers_at_start: Vec<(&String, PeerUsage)> = args
            .peer_comm
            .iter()
            .map(|comm| (comm, PeerUsage::named(comm)))
            .collect();
        let _ = go_tx.send(true);
        let mut turns = Latency::new();
        let mut turn_ends = Latency::new();
        let mut ui = Latency::new();
        let mut errors = ErrorCounts::new();
        let (mut connections, mut completed, mut turns_done) = (0u64, 0u64, 0u64);
        let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
        for task in tasks {
            let Ok(outcome) = task.await else {
                *errors.entry("task_panicked".into()).or_default() += 1;
                continue;
            };
            turns.merge_samples(&outcome.turns);
            turn_ends.merge_samples(&outcome.turn_ends);
            ui.merge_samples(&outcome.ui);
            for (code, n) in outcome.errors {
                *errors.entry(code).or_default() += n;
            }
            connections += u64::from(outcome.connected);
            completed += u64::from(outcome.turns_done >= args.turns);
            turns_done += u64::from(outcome.turns_done);
            if let Some(t) = outcome.first_send {
                first = Some(first.map_or(t, |f| f.min(t)));
            }
            if let Some(t) = outcome.last_end {
                last = Some(last.map_or(t, |l| l.max(t)));
            }
        }
        let usage_at_end = server_pid.as_deref().and_then(ServerUsage::read);
        let peer_usage: serde_json::Map<String, Value> = peers_at_start
            .iter()
            .map(|(comm, start)| ((*comm).clone(), start.again().since(start, turns_done)))
            .collect();
        let _ = stop_tx.send(true);
        let _ = progress.await;
        let server_usage = match (&usage_at_start, &usage_at_end) {
            (Some(start), Some(end)) => end.since(start, turns_done),
            _ => Value::Null,
        };
        let window = match (first, last) {
            (Some(f), Some(l)) if l > f => (l - f).as_secs_f64(),
            _ => started.elapsed().as_secs_f64(),
        };
        let violations: u64 = errors
            .iter()
            .filter(|(code, _)| {
                code.starts_with("seq_")
                    || code.starts_with("tool_")
                    || code.as_str() == "ui_call_repeated"
            })
            .map(|(_, n)| n)
            .sum();
        let summary = json!({
            "workflow": common.workflow,
            "chats": common.chats,
            "turns_per_chat": args.turns,
            "ui_round_trips": args.ui,
            "connections": connections,
            "chats_completed": completed,
            "turns_completed": turns_done,
            "window_s": (window * 1000.0).round() / 1000.0,
            "turns_per_s": (turns_done as f64 / window.max(1e-9)).round(),
            "steady_turns_per_s": steady_turns_per_s(&turn_ends).map(f64::round),
            "turn_latency": turns.summary(),
            "ui_round_trip": ui.summary(),
            "errors": errors,
            "protocol_violations": violations,
            "server": server_memory(common.server_pid),
            "server_usage": server_usage,
            "peer_usage": peer_usage,
        });
        print_table(&summary);
        write_json(args.json.as_ref(), &summary)?;
        Ok(violations == 0 && completed == common.chats as u64)
    })
}

/// Opens chats and holds them: returns once they are closed again.
async fn hold_chat(
    shared: Arc<Shared>,
    i: usize,
    mut release: watch::Receiver<bool>,
) -> Result<(), &'static str> {
    let mut ws = match open_chat(&shared, i).await {
        Ok(ws) => ws,
        Err(code) => {
            shared.progress.failed.fetch_add(1, Ordering::Relaxed);
            return Err(code);
        }
    };
    let mut ready = false;
    let result = loop {
        tokio::select! {
            frame = ws.next() => match frame {
                Some(Ok(Message::Text(text))) => {
                    if !ready && text.starts_with("{\"type\":\"chat.resume_boundary\"") {
                        ready = true;
                        shared.progress.connected.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break Err("socket_closed"),
                Some(Ok(_)) => {}
            },
            _ = release.changed() => break Ok(()),
            _ = tokio::time::sleep_until(shared.deadline) => break Ok(()),
        }
    };
    if result.is_err() {
        shared.progress.failed.fetch_add(1, Ordering::Relaxed);
    }
    if ready {
        shared.progress.connected.fetch_sub(1, Ordering::Relaxed);
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(None)).await;
    result
}

/// Runs `idle`: prints the server's memory per idle chat.
pub fn idle(args: IdleArgs) -> anyhow::Result<bool> {
    let common = args.common.clone();
    let rt = runtime(common.threads)?;
    rt.block_on(async move {
        let shared = shared(&common).await?;
        let pid = common.server_pid.map(|p| p.to_string());
        let before = pid.as_deref().and_then(|p| proc_status_number(p, "VmRSS"));
        let (release_tx, release_rx) = watch::channel(false);
        let mut tasks = Vec::with_capacity(common.chats);
        for i in 0..common.chats {
            let shared = shared.clone();
            let release = release_rx.clone();
            let offset = if common.chats > 1 {
                Duration::from_secs_f64(common.ramp.max(0.0) * i as f64 / common.chats as f64)
            } else {
                Duration::ZERO
            };
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(offset).await;
                hold_chat(shared, i, release).await
            }));
        }
        // Wait (bounded by the deadline) until every chat is connected or has failed.
        let started = Instant::now();
        let mut last_print = Instant::now();
        loop {
            let p = &shared.progress;
            let (open, failed) = (
                p.connected.load(Ordering::Relaxed),
                p.failed.load(Ordering::Relaxed),
            );
            if last_print.elapsed() >= Duration::from_secs(1) {
                eprint!(
                    "\r[{:>4}s] connected {open:>6}/{}  failed {failed:>5}   ",
                    started.elapsed().as_secs(),
                    common.chats
                );
                last_print = Instant::now();
            }
            if open + failed >= common.chats as u64
                || tokio::time::Instant::now() >= shared.deadline
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!();
        tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
        let connected = shared.progress.connected.load(Ordering::Relaxed);
        let after = pid.as_deref().and_then(|p| proc_status_number(p, "VmRSS"));
        let per_chat = match (before, after) {
            (Some(b), Some(a)) if connected > 0 => {
                Some(((a.saturating_sub(b)) as f64 / connected as f64 * 100.0).round() / 100.0)
            }
            _ => None,
        };
        let remaining = Duration::from_secs(args.hold_s.saturating_sub(args.settle_s));
        tokio::time::sleep(remaining).await;
        let _ = release_tx.send(true);
        let mut errors = ErrorCounts::new();
        for task in tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(code)) => *errors.entry(code.to_owned()).or_default() += 1,
                Err(_) => *errors.entry("task_panicked".into()).or_default() += 1,
            }
        }
        let summary = json!({
            "workflow": common.workflow,
            "chats": common.chats,
            "connected": connected,
            "server_rss_before_KiB": before,
            "server_rss_after_KiB": after,
            "KiB_per_idle_chat": per_chat,
            "errors": errors,
            "server": server_memory(common.server_pid),
        });
        print_table(&summary);
        write_json(args.json.as_ref(), &summary)?;
        Ok(connected == common.chats as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_rate_leaves_out_a_slow_tail() {
        let mut ends = Latency::new();
        // 1,000 turns, one every 10 ms (100 turns/s), then 100 more over a 10 s tail.
        for i in 1..=1_000u64 {
            ends.record(Duration::from_millis(10 * i));
        }
        for i in 1..=100u64 {
            ends.record(Duration::from_millis(10_000 + 100 * i));
        }
        let steady = steady_turns_per_s(&ends).unwrap_or_default();
        // The 10th to 90th percentile lie in the steady part (hdrhistogram keeps 3 digits).
        assert!((steady - 100.0).abs() < 2.0, "steady rate {steady}");
        // Over the whole window the same run did 1,100 turns in 20 s.
        let whole = 1_100.0 / 20.0;
        assert!(steady > whole * 1.5);

        let mut few = Latency::new();
        few.record(Duration::from_millis(5));
        assert_eq!(steady_turns_per_s(&few), None, "too few turns to tell");
    }

    #[test]
    fn source_ranges_are_loopback_only() {
        let ips = parse_sources(Some("127.0.0.2-127.0.0.4,127.0.0.9")).unwrap_or_default();
        assert_eq!(ips.len(), 4);
        assert!(parse_sources(Some("10.0.0.1")).is_err());
        assert!(parse_sources(Some("127.0.0.9-127.0.0.2")).is_err());
    }

    #[test]
    fn seq_checks_find_gaps_and_duplicates() {
        let mut out = ChatOutcome::default();
        let mut last = 0;
        for seq in [1, 2, 0, 3, 3, 5] {
            check_seq(&mut last, seq, false, &mut out);
        }
        assert_eq!(out.errors.get("seq_duplicate"), Some(&1));
        assert_eq!(out.errors.get("seq_gap"), Some(&1));
    }

    #[test]
    fn a_replay_may_skip_seqs_but_never_repeat_one() {
        let mut out = ChatOutcome::default();
        let mut last = 0;
        for seq in [1, 3, 4, 4] {
            check_seq(&mut last, seq, true, &mut out);
        }
        assert_eq!(out.errors.get("seq_gap"), None);
        assert_eq!(out.errors.get("seq_duplicate"), Some(&1));
    }

    #[test]
    fn think_times_spread_over_half_to_one_and_a_half_the_mean() {
        let mean = Duration::from_millis(1000);
        let waits: Vec<Duration> = (0..200).map(|chat| think_time(mean, chat, 3)).collect();
        assert!(waits.iter().all(|w| *w >= mean / 2 && *w < mean * 3 / 2));
        let shortest = waits.iter().min().copied().unwrap_or_default();
        let longest = waits.iter().max().copied().unwrap_or_default();
        assert!(longest - shortest > mean / 2, "{shortest:?}..{longest:?}");
    }
}
