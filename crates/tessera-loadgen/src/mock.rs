//! `tessera-loadgen mock-llm`: a stateless OpenAI-compatible chat-completions server.
//!
//! Each answer is decided from the request alone, so concurrent chats never interfere:
//! - last message from the user and tools offered → a call of the first tool, with minimal
//!   schema-valid arguments;
//! - last message a tool result → a short final answer;
//! - `response_format.json_schema` present → a schema-valid JSON instance;
//! - otherwise → a short text.
//!
//! Generated arguments and instances are cached by the hash of the schema text, and the request
//! is parsed into borrowed fields only, so a request costs one parse and one small write.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::convert::Infallible;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_http::body::{BodyStream, BoxBody, EitherBody};
use actix_http::header::CONTENT_TYPE;
use actix_http::{HttpService, Method, Request as HttpRequest, Response, StatusCode};
use anyhow::Context as _;
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::schema;

/// Options of `mock-llm`.
#[derive(Debug, Clone, clap::Args)]
pub struct MockArgs {
    /// Port to listen on (127.0.0.1); 0 picks a free one and prints it.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Delay of every answer, in milliseconds (a timer, not a blocking sleep).
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Split streamed text into one SSE chunk per word (default: one content chunk). Requests
    /// with `"stream": true` always get SSE.
    #[arg(long)]
    pub stream: bool,
    /// With `--stream`: the time between two events of a streamed answer, as a model's pace
    /// of tokens (the first comes after `--latency-ms`); 0 sends the whole answer at once.
    #[arg(long, default_value_t = 0)]
    pub token_interval_ms: u64,
    /// Words of the answer to a tool's result, as long as a model's answers are (streamed one
    /// word per event): "Done: the tool returned its result." and then filler. At most the
    /// default's six words give the default.
    #[arg(long, default_value_t = 6)]
    pub answer_words: usize,
    /// Worker threads (1 is plenty: the mock must never be the bottleneck, nor steal cores).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Exit by itself after this many seconds.
    #[arg(long, default_value_t = 4 * 3600)]
    pub exit_after_s: u64,
}

#[derive(Clone)]
struct Settings {
    latency: Duration,
    split_words: bool,
    token_interval: Duration,
    /// The answer to a tool's result (`--answer-words`).
    final_text: Arc<str>,
    hasher: RandomState,
}

/// Pending connections the mock's socket queues.
const LISTEN_BACKLOG: i32 = 4096;

/// A listening socket on 127.0.0.1:`port` with room for [`LISTEN_BACKLOG`] pending connections.
///
/// WHY: `std`'s `bind` listens with a backlog of 128, and the builder's `backlog` applies only
/// to sockets it binds itself. At 100 ms model latency a server opens thousands of model
/// connections within a second; a full queue dropped 133 of them in a 3,000-chat run, and each
/// such call waited a second for its connection to be retried.
fn listen(port: u16) -> anyhow::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))
        .with_context(|| format!("cannot listen on 127.0.0.1:{port}"))?;
    // Listening again on a listening socket sets its backlog.
    socket2::SockRef::from(&listener)
        .listen(LISTEN_BACKLOG)
        .context("cannot set the listen backlog")?;
    Ok(listener)
}

/// Runs the mock until killed (or `exit_after_s`).
///
/// WHY actix-http and not an actix-web `App`: with model latency, thousands of requests wait
/// on their timers at once, and an actix-web handler keeps its `HttpRequest` until it returns;
/// past the 128 requests actix-web pools, every request allocated and freed its own. Here the
/// request is dropped before the wait, and no router runs: the mock, whose CPU sits on the
/// cores the server is measured on, costs ~15% less per turn at 0 ms and ~20% less at 100 ms
/// (docs/performance-log.md, fifth session). Each answer at latency is still a wake-up and a write
/// of its own.
pub fn run(args: MockArgs) -> anyhow::Result<()> {
    let settings = Arc::new(Settings {
        latency: Duration::from_millis(args.latency_ms),
        split_words: args.stream,
        token_interval: Duration::from_millis(args.token_interval_ms),
        final_text: final_text(args.answer_words),
        hasher: RandomState::new(),
    });
    let listener = listen(args.port)?;
    let addr = listener.local_addr().context("listener address")?;
    let system = actix_rt::System::new();
    system.block_on(async move {
        let server = actix_server::Server::build()
            .workers(args.workers.max(1))
            .max_concurrent_connections(100_000)
            .listen("mock-llm", listener, move || {
                let settings = Arc::clone(&settings);
                HttpService::build()
                    .keep_alive(Duration::from_secs(300))
                    .h1(move |request: HttpRequest| serve(Arc::clone(&settings), request))
                    .tcp()
            })
            .context("cannot serve the listener")?
            .run();
        println!("mock-llm listening on http://{addr}");
        let handle = server.handle();
        let limit = Duration::from_secs(args.exit_after_s.max(1));
        actix_rt::spawn(async move {
            actix_rt::time::sleep(limit).await;
            handle.stop(false).await;
        });
        server.await.context("mock server failed")
    })
}

/// Largest request body accepted (a long transcript is a few MB at most).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One request: route, read the body, answer; the latency is waited out after the request
/// (and its body) are dropped.
async fn serve(
    settings: Arc<Settings>,
    mut request: HttpRequest,
) -> Result<Response<EitherBody<Vec<u8>>>, Infallible> {
    let is_post = request.method() == Method::POST;
    match (is_post, request.path()) {
        (true, "/v1/chat/completions" | "/chat/completions") => {}
        (false, "/v1/models") => {
            return Ok(with_type(
                StatusCode::OK,
                "application/json",
                MODELS.as_bytes().to_vec(),
            ));
        }
        (false, "/healthz") => return Ok(with_type(StatusCode::OK, "text/plain", Vec::new())),
        _ => {
            return Ok(with_type(
                StatusCode::NOT_FOUND,
                "text/plain",
                b"not found".to_vec(),
            ));
        }
    }
    let mut payload = request.take_payload();
    drop(request);
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        match chunk {
            Ok(chunk) if body.len() + chunk.len() <= MAX_BODY => body.extend_from_slice(&chunk),
            Ok(_) => return Ok(bad_request("request body too large")),
            Err(e) => return Ok(bad_request(&format!("cannot read the request body: {e}"))),
        }
    }
    drop(payload);
    let (content_type, out) = match completions(&settings, &body) {
        Ok(answer) => answer,
        Err(message) => return Ok(bad_request(&message)),
    };
    drop(body);
    if !settings.latency.is_zero() {
        actix_rt::time::sleep(settings.latency).await;
    }
    if content_type == EVENT_STREAM && !settings.token_interval.is_zero() {
        return Ok(paced(out, settings.token_interval));
    }
    Ok(with_type(StatusCode::OK, content_type, out))
}

const EVENT_STREAM: &str = "text/event-stream";

/// An event stream sent one event at a time, `interval` apart (chunked), as a model streams
/// its tokens. The events are the body's `\n\n`-terminated parts (its JSON has no raw line
/// breaks).
fn paced(body: Vec<u8>, interval: Duration) -> Response<EitherBody<Vec<u8>>> {
    let body = Bytes::from(body);
    let mut ends: Vec<usize> = body
        .windows(2)
        .enumerate()
        .filter(|(_, pair)| *pair == b"\n\n")
        .map(|(at, _)| at + 2)
        .collect();
    if ends.last() != Some(&body.len()) {
        ends.push(body.len());
    }
    let events = futures::stream::unfold((0, 0), move |(index, start)| {
        let body = body.clone();
        let end = ends.get(index).copied();
        async move {
            let end = end?;
            if index > 0 {
                actix_rt::time::sleep(interval).await;
            }
            Some((
                Ok::<_, Infallible>(body.slice(start..end)),
                (index + 1, end),
            ))
        }
    });
    Response::build(StatusCode::OK)
        .insert_header((CONTENT_TYPE, EVENT_STREAM))
        .message_body(EitherBody::<Vec<u8>>::right(BoxBody::new(BodyStream::new(
            events,
        ))))
        // Only a builder holding a bad header fails, and this one holds none.
        .unwrap_or_else(|_| bad_request("cannot build the event stream"))
}

fn with_type(
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
) -> Response<EitherBody<Vec<u8>>> {
    Response::build(status)
        .insert_header((CONTENT_TYPE, content_type))
        .body(body)
}

const MODELS: &str =
    r#"{"object":"list","data":[{"id":"mock","object":"model","owned_by":"tessera-loadgen"}]}"#;

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    messages: Vec<WireMessage<'a>>,
    #[serde(borrow, default)]
    tools: Vec<&'a RawValue>,
    #[serde(borrow, default)]
    response_format: Option<&'a RawValue>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct WireMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct ToolDef {
    function: FunctionDef,
}

#[derive(Deserialize)]
struct FunctionDef {
    name: String,
    #[serde(default)]
    parameters: serde_json::Value,
}

#[derive(Deserialize)]
struct Format {
    #[serde(default)]
    json_schema: Option<JsonSchema>,
}

#[derive(Deserialize)]
struct JsonSchema {
    #[serde(default)]
    schema: serde_json::Value,
}

/// What the mock answers, decided from the request alone.
#[derive(Clone)]
enum Answer {
    Text(Arc<str>),
    ToolCall { name: Arc<str>, arguments: Arc<str> },
}

thread_local! {
    /// schema-text hash → answer (tool-call arguments or JSON instance).
    static CACHE: RefCell<HashMap<u64, Answer>> = RefCell::new(HashMap::new());
    static COUNTER: Cell<u64> = const { Cell::new(0) };
}

const CACHE_LIMIT: usize = 4096;
const FINAL_TEXT: &str = "Done: the tool returned its result.";
const SHORT_TEXT: &str = "OK, noted.";

/// [`FINAL_TEXT`] with filler words after it up to `words` words.
fn final_text(words: usize) -> Arc<str> {
    const FILLER: [&str; 6] = ["It", "says", "what", "was", "asked", "for."];
    let mut text = FINAL_TEXT.to_owned();
    for word in FILLER
        .iter()
        .cycle()
        .take(words.saturating_sub(FINAL_TEXT.split(' ').count()))
    {
        text.push(' ');
        text.push_str(word);
    }
    Arc::from(text)
}

fn cached(settings: &Settings, raw: &str, make: impl FnOnce() -> Answer) -> Answer {
    let key = settings.hasher.hash_one(raw);
    if let Some(found) = CACHE.with(|c| c.borrow().get(&key).cloned()) {
        return found;
    }
    let answer = make();
    CACHE.with(|c| {
        let mut cache = c.borrow_mut();
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(key, answer.clone());
    });
    answer
}

/// Decides the answer (see the module docs); `Err` is a 400 message.
fn decide(settings: &Settings, request: &Request<'_>) -> Result<Answer, String> {
    let last = request.messages.last().map(|m| m.role.as_ref());
    if last == Some("user")
        && let Some(first) = request.tools.first()
    {
        let raw = first.get();
        return Ok(cached(settings, raw, || {
            match serde_json::from_str::<ToolDef>(raw) {
                Ok(tool) => {
                    let args = schema::instance(&tool.function.parameters);
                    Answer::ToolCall {
                        name: Arc::from(tool.function.name),
                        arguments: Arc::from(args.to_string()),
                    }
                }
                Err(_) => Answer::Text(Arc::from(SHORT_TEXT)),
            }
        }));
    }
    if last == Some("tool") {
        return Ok(Answer::Text(Arc::clone(&settings.final_text)));
    }
    if let Some(format) = request.response_format {
        let raw = format.get();
        let parsed: Format =
            serde_json::from_str(raw).map_err(|e| format!("bad response_format: {e}"))?;
        if let Some(js) = parsed.json_schema {
            return Ok(cached(settings, raw, || {
                Answer::Text(Arc::from(schema::instance(&js.schema).to_string()))
            }));
        }
    }
    Ok(Answer::Text(Arc::from(SHORT_TEXT)))
}

/// The answer to one completions request body: its content type and bytes; `Err` is a 400
/// message.
fn completions(settings: &Settings, body: &[u8]) -> Result<(&'static str, Vec<u8>), String> {
    let request: Request<'_> =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let answer = decide(settings, &request)?;
    let n = COUNTER.with(|c| {
        let n = c.get() + 1;
        c.set(n);
        n
    });
    let meta = Meta {
        id: n,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: request.model.as_deref().unwrap_or("mock"),
        prompt_tokens: body.len() as u64 / 4,
    };
    let (content_type, out) = if request.stream {
        let usage = request
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage);
        (
            EVENT_STREAM,
            stream_body(&meta, &answer, usage, settings.split_words),
        )
    } else {
        ("application/json", plain_body(&meta, &answer))
    };
    Ok((content_type, out))
}

fn bad_request(message: &str) -> Response<EitherBody<Vec<u8>>> {
    let body = serde_json::json!({"error": {"message": message, "type": "invalid_request_error"}});
    with_type(
        StatusCode::BAD_REQUEST,
        "application/json",
        body.to_string().into_bytes(),
    )
}

struct Meta<'a> {
    id: u64,
    created: u64,
    model: &'a str,
    prompt_tokens: u64,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

impl Meta<'_> {
    fn usage(&self, completion: &str) -> Usage {
        let completion_tokens = completion.len() as u64 / 4 + 1;
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens,
            total_tokens: self.prompt_tokens + completion_tokens,
        }
    }
}

#[derive(Serialize)]
struct Completion<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    usage: Usage,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    message: OutMessage<'a>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct OutMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutToolCall<'a>>,
}

#[derive(Serialize)]
struct OutToolCall<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u32>,
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutFunction<'a>,
}

#[derive(Serialize)]
struct OutFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

fn call_id(meta: &Meta<'_>) -> String {
    format!("call_mock_{}", meta.id)
}

fn plain_body(meta: &Meta<'_>, answer: &Answer) -> Vec<u8> {
    let (content, tool_calls, finish, completion) = match answer {
        Answer::Text(text) => (Some(&**text), Vec::new(), "stop", &**text),
        Answer::ToolCall { name, arguments } => (
            None,
            vec![OutToolCall {
                index: None,
                id: call_id(meta),
                kind: "function",
                function: OutFunction { name, arguments },
            }],
            "tool_calls",
            &**arguments,
        ),
    };
    let body = Completion {
        id: format!("chatcmpl-mock-{}", meta.id),
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices: [Choice {
            index: 0,
            message: OutMessage {
                role: "assistant",
                content,
                tool_calls,
            },
            finish_reason: finish,
        }],
        usage: meta.usage(completion),
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutToolCall<'a>>,
}

fn stream_body(meta: &Meta<'_>, answer: &Answer, include_usage: bool, split: bool) -> Vec<u8> {
    let id = format!("chatcmpl-mock-{}", meta.id);
    let mut out = Vec::with_capacity(1024);
    let mut push = |choices: Vec<ChunkChoice<'_>>, usage: Option<Usage>| {
        let chunk = Chunk {
            id: &id,
            object: "chat.completion.chunk",
            created: meta.created,
            model: meta.model,
            choices,
            usage,
        };
        out.extend_from_slice(b"data: ");
        if serde_json::to_writer(&mut out, &chunk).is_err() {
            out.extend_from_slice(b"{}");
        }
        out.extend_from_slice(b"\n\n");
    };
    fn delta<'d>(delta: Delta<'d>, finish: Option<&'static str>) -> ChunkChoice<'d> {
        ChunkChoice {
            index: 0,
            delta,
            finish_reason: finish,
        }
    }
    push(
        vec![delta(
            Delta {
                role: Some("assistant"),
                content: Some(""),
                ..Delta::default()
            },
            None,
        )],
        None,
    );
    let (finish, completion) = match answer {
        Answer::Text(text) => {
            if split {
                let mut rest: &str = text;
                while !rest.is_empty() {
                    let cut = rest[1..].find(' ').map_or(rest.len(), |i| i + 1);
                    let (piece, tail) = rest.split_at(cut);
                    push(
                        vec![delta(
                            Delta {
                                content: Some(piece),
                                ..Delta::default()
                            },
                            None,
                        )],
                        None,
                    );
                    rest = tail;
                }
            } else {
                push(
                    vec![delta(
                        Delta {
                            content: Some(text),
                            ..Delta::default()
                        },
                        None,
                    )],
                    None,
                );
            }
            ("stop", &**text)
        }
        Answer::ToolCall { name, arguments } => {
            push(
                vec![delta(
                    Delta {
                        tool_calls: vec![OutToolCall {
                            index: Some(0),
                            id: call_id(meta),
                            kind: "function",
                            function: OutFunction { name, arguments },
                        }],
                        ..Delta::default()
                    },
                    None,
                )],
                None,
            );
            ("tool_calls", &**arguments)
        }
    };
    push(vec![delta(Delta::default(), Some(finish))], None);
    if include_usage {
        push(Vec::new(), Some(meta.usage(completion)));
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn settings() -> Settings {
        Settings {
            latency: Duration::ZERO,
            split_words: true,
            token_interval: Duration::ZERO,
            final_text: final_text(6),
            hasher: RandomState::new(),
        }
    }

    /// The streamed answer "a b c", word by word, with its usage.
    fn streamed_words() -> Vec<u8> {
        let meta = Meta {
            id: 7,
            created: 0,
            model: "m",
            prompt_tokens: 3,
        };
        stream_body(&meta, &Answer::Text(Arc::from("a b c")), true, true)
    }

    #[tokio::test]
    async fn a_paced_stream_sends_one_event_at_a_time_an_interval_apart() {
        use actix_http::body::MessageBody as _;
        let body = streamed_words();
        let interval = Duration::from_millis(20);
        let mut stream = std::pin::pin!(paced(body.clone(), interval).into_body());
        let mut pieces = Vec::new();
        let mut arrivals = Vec::new();
        while let Some(piece) = futures::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
            pieces.push(piece.map_err(|e| e.to_string()).expect("a piece"));
            arrivals.push(tokio::time::Instant::now());
        }
        // The role, "a", " b", " c", the finish, the usage and `[DONE]`, one at a time.
        assert_eq!(pieces.len(), 7);
        assert!(
            pieces
                .iter()
                .all(|p| p.starts_with(b"data: ") && p.ends_with(b"\n\n"))
        );
        assert_eq!(pieces.concat(), body);
        for pair in arrivals.windows(2) {
            assert!(pair[1] - pair[0] >= interval, "sent before its time");
        }
    }

    #[test]
    fn the_listener_queues_a_burst_of_connections_nobody_accepts_yet() -> anyhow::Result<()> {
        // std's backlog of 128 would leave the 130th connect waiting for a retried SYN.
        let listener = listen(0)?;
        let addr = listener.local_addr()?;
        let mut clients = Vec::new();
        for i in 0..600 {
            let client = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500))
                .with_context(|| format!("connection {i} was not queued"))?;
            clients.push(client);
        }
        assert_eq!(clients.len(), 600);
        Ok(())
    }

    fn answer_for(body: &Value) -> Answer {
        let text = body.to_string();
        let request: Request<'_> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        decide(&settings(), &request).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn user_with_tools_gets_a_call_of_the_first_tool() {
        let body = json!({
            "model": "m",
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "add_task", "description": "", "parameters": {"type": "object", "properties": {"title": {"type": "string", "minLength": 1}}, "required": ["title"]}}}]
        });
        match answer_for(&body) {
            Answer::ToolCall { name, arguments } => {
                assert_eq!(&*name, "add_task");
                assert_eq!(&*arguments, r#"{"title":"mock"}"#);
            }
            Answer::Text(t) => panic!("expected a tool call, got {t}"),
        }
    }

    #[test]
    fn tool_result_gets_final_text_and_schema_gets_json() {
        let body = json!({"messages": [{"role": "user"}, {"role": "assistant", "content": null}, {"role": "tool", "content": "x", "tool_call_id": "c"}], "tools": [{"function": {"name": "t"}}]});
        assert!(matches!(answer_for(&body), Answer::Text(t) if &*t == FINAL_TEXT));
        let body = json!({"messages": [{"role": "system", "content": "s"}], "response_format": {"type": "json_schema", "json_schema": {"name": "X", "schema": {"type": "object", "properties": {"p": {"enum": ["a", "b"]}}, "required": ["p"]}}}});
        assert!(matches!(answer_for(&body), Answer::Text(t) if &*t == r#"{"p":"a"}"#));
    }

    #[test]
    fn the_answer_to_a_tool_result_has_the_words_asked_for() {
        assert_eq!(&*final_text(6), FINAL_TEXT);
        assert_eq!(
            &*final_text(0),
            FINAL_TEXT,
            "never shorter than the default"
        );
        let long = final_text(100);
        assert!(long.starts_with(FINAL_TEXT));
        assert_eq!(long.split(' ').count(), 100);
        assert!(long.split(' ').all(|word| !word.is_empty()));
    }

    #[test]
    fn stream_body_is_sse_with_usage_and_done() {
        let body = streamed_words();
        let text = String::from_utf8_lossy(&body);
        assert_eq!(text.matches("data: ").count(), 7, "{text}");
        assert!(text.contains("\"usage\""));
        assert!(text.ends_with("data: [DONE]\n\n"));
    }
}
