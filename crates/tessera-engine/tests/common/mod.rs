//! Test harness: the fixture workflow, an in-process fake model, a counting tool, and a
//! subscriber that turns delivered events into a channel the test can read.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tessera_engine::session::{Deliver, Subscribe};
use tessera_engine::{ChatHandle, Engine, EngineConfig, NewChat};
use tessera_llm::{
    ChatModel, ChatRequest, ChatResponse, DeltaSink, LlmError, Message, Role, ToolCall, Usage,
};
use tessera_tools::{
    BuiltinRegistry, InMemoryArtifactStore, InMemoryTaskStore, Tool, ToolContext, ToolError,
    ToolServices,
};
use tokio::sync::mpsc;

/// How the fake model answers one request.
pub type Script = dyn Fn(&ChatRequest) -> Reply + Send + Sync;

/// A fake reply.
pub enum Reply {
    Text(String),
    /// A text sent word by word through the delta sink first, as a streaming model sends it.
    Streamed(String),
    Tools(Vec<(&'static str, Value)>),
    Fail,
    /// Never answers (until cancelled).
    Hang,
}

/// An in-process model driven by a closure; counts its calls.
pub struct FakeModel {
    pub script: Box<Script>,
    pub calls: AtomicUsize,
}

impl ChatModel for FakeModel {
    fn complete(
        &self,
        request: ChatRequest,
        deltas: Option<DeltaSink>,
    ) -> BoxFuture<'static, Result<ChatResponse, LlmError>> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let reply = (self.script)(&request);
        Box::pin(async move {
            let message = match reply {
                Reply::Text(text) => Message::text(Role::Assistant, text),
                Reply::Streamed(text) => {
                    if let Some(mut sink) = deltas {
                        for word in text.split_inclusive(' ') {
                            sink(word);
                        }
                    }
                    Message::text(Role::Assistant, text)
                }
                Reply::Tools(calls) => Message {
                    role: Role::Assistant,
                    content: None,
                    name: None,
                    tool_calls: calls
                        .into_iter()
                        .enumerate()
                        .map(|(i, (name, args))| ToolCall {
                            id: format!("call_{n}_{i}"),
                            name: name.into(),
                            arguments: args.to_string(),
                        })
                        .collect(),
                    tool_call_id: None,
                    wire: Default::default(),
                },
                Reply::Fail => return Err(LlmError::InvalidResponse("garbage".into())),
                Reply::Hang => futures::future::pending().await,
            };
            Ok(ChatResponse {
                message,
                usage: Usage {
                    prompt_tokens: 10,
                    completion_tokens: 5,
                },
                finish_reason: None,
                model: "fake".into(),
            })
        })
    }

    fn label(&self) -> &str {
        "fake"
    }
}

/// The last user message of a request, or "".
pub fn last_user(request: &ChatRequest) -> &str {
    request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map_or("", |m| m.content_str())
}

/// True when the request's last message is a tool result (native or json mode).
pub fn after_tool(request: &ChatRequest) -> bool {
    request
        .messages
        .last()
        .is_some_and(|m| m.role == Role::Tool || m.content_str().starts_with("Tool "))
}

/// An `echo` that counts its executions.
pub struct CountingEcho(pub Arc<AtomicUsize>);

impl Tool for CountingEcho {
    fn invoke(
        &self,
        args: Map<String, Value>,
        _ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            Ok(
                json!({"status": "success", "echoed": args.get("message").cloned().unwrap_or(Value::Null)}),
            )
        })
    }
}

pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/EngineTest")
}

/// A running engine over the fixture with the given model script.
pub struct Harness {
    pub engine: Engine,
    pub model: Arc<FakeModel>,
    pub echo_runs: Arc<AtomicUsize>,
}

pub fn harness(
    config: EngineConfig,
    script: impl Fn(&ChatRequest) -> Reply + Send + Sync + 'static,
) -> Harness {
    harness_with_hooks(config, tessera_engine::EngineHooks::default(), script)
}

/// Helper says NEXT, the planner emits a valid plan: reaches the UI tool in one message.
pub fn default_plan_script(req: &ChatRequest) -> Reply {
    match req.agent.as_str() {
        "PlannerAgent" => Reply::Text(json!({"Plan": "p", "agent_message": "review"}).to_string()),
        _ => Reply::Text("NEXT".into()),
    }
}

/// A harness whose engine has `hooks` (e.g. a store).
pub fn harness_with_hooks(
    config: EngineConfig,
    hooks: tessera_engine::EngineHooks,
    script: impl Fn(&ChatRequest) -> Reply + Send + Sync + 'static,
) -> Harness {
    harness_custom(config, hooks, None, |_| {}, script)
}

/// A harness whose engine has `hooks` and streams answers ([`Reply::Streamed`] then publishes
/// `chat.text_delta` events); the others do not stream.
#[allow(dead_code)]
pub fn harness_streaming(
    config: EngineConfig,
    hooks: tessera_engine::EngineHooks,
    script: impl Fn(&ChatRequest) -> Reply + Send + Sync + 'static,
) -> Harness {
    build_harness(config, hooks, None, |_| {}, script, true)
}

/// A harness whose `echo` tool is `echo` (the counting echo when `None`) and whose fixture
/// workflow is changed by `tweak` before the engine compiles it.
pub fn harness_custom(
    config: EngineConfig,
    hooks: tessera_engine::EngineHooks,
    echo: Option<Arc<dyn Tool>>,
    tweak: impl FnOnce(&mut tessera_manifest::Workflow),
    script: impl Fn(&ChatRequest) -> Reply + Send + Sync + 'static,
) -> Harness {
    build_harness(config, hooks, echo, tweak, script, false)
}

fn build_harness(
    config: EngineConfig,
    hooks: tessera_engine::EngineHooks,
    echo: Option<Arc<dyn Tool>>,
    tweak: impl FnOnce(&mut tessera_manifest::Workflow),
    script: impl Fn(&ChatRequest) -> Reply + Send + Sync + 'static,
    stream: bool,
) -> Harness {
    let mut workflow = match tessera_manifest::load_workflow(&fixture_dir()) {
        Ok(w) => w,
        Err(e) => panic!("fixture must load: {e}"),
    };
    tweak(&mut workflow);
    let model = Arc::new(FakeModel {
        script: Box::new(script),
        calls: AtomicUsize::new(0),
    });
    let services = ToolServices {
        tasks: Arc::new(InMemoryTaskStore::default()),
        artifacts: Arc::new(InMemoryArtifactStore::default()),
    };
    let mut builtins = BuiltinRegistry::with_defaults(services);
    let echo_runs = Arc::new(AtomicUsize::new(0));
    let echo_params = builtins
        .entry("echo")
        .map(|e| e.parameters.clone())
        .unwrap_or(Value::Null);
    builtins.register(
        "echo",
        "counting echo",
        echo_params,
        echo.unwrap_or_else(|| Arc::new(CountingEcho(echo_runs.clone()))),
    );
    let engine = match Engine::start(
        vec![(workflow, model.clone() as Arc<dyn ChatModel>)],
        &builtins,
        EngineConfig {
            arbiters: 2,
            stream,
            ..config
        },
        hooks,
    ) {
        Ok(e) => e,
        Err(e) => panic!("engine must start: {e}"),
    };
    Harness {
        engine,
        model,
        echo_runs,
    }
}

/// Collects delivered events into a channel.
pub struct Collector(pub mpsc::UnboundedSender<Value>);

impl Actor for Collector {
    type Context = Context<Self>;
}

impl Handler<Deliver> for Collector {
    type Result = ();
    fn handle(&mut self, Deliver(batch): Deliver, _: &mut Self::Context) {
        for text in batch {
            if let Ok(v) = serde_json::from_str(&text) {
                let _ = self.0.send(v);
            }
        }
    }
}

/// A subscribed client of one chat.
pub struct Client {
    pub chat: ChatHandle,
    pub rx: mpsc::UnboundedReceiver<Value>,
    pub seen: Vec<Value>,
}

impl Client {
    /// Waits for the next event of `kind`, keeping every event seen. The timeout only stops a
    /// broken test from hanging; no assertion depends on timing.
    pub async fn until(&mut self, kind: &str) -> Value {
        loop {
            match tokio::time::timeout(Duration::from_secs(10), self.rx.recv()).await {
                Ok(Some(event)) => {
                    self.seen.push(event.clone());
                    if event["type"] == kind {
                        return event;
                    }
                }
                Ok(None) => panic!("event stream closed while waiting for {kind}"),
                Err(_) => panic!("no {kind} event; saw {:#?}", self.types()),
            }
        }
    }

    /// Waits for the next `chat.text` written by `agent`.
    pub async fn until_match_agent(&mut self, agent: &str) -> Value {
        loop {
            let text = self.until("chat.text").await;
            if text["data"]["agent"] == agent {
                return text;
            }
        }
    }

    /// The types of the events seen so far.
    pub fn types(&self) -> Vec<String> {
        self.seen
            .iter()
            .map(|e| e["type"].as_str().unwrap_or("?").to_owned())
            .collect()
    }

    /// Events of `kind` seen so far.
    pub fn of(&self, kind: &str) -> Vec<&Value> {
        self.seen.iter().filter(|e| e["type"] == kind).collect()
    }
}

pub async fn connect(h: &Harness, tenant: &str) -> Client {
    subscribe(start(h, tenant).await, 0).await
}

/// A new chat of the fixture workflow for `tenant`, not subscribed to.
pub async fn start(h: &Harness, tenant: &str) -> ChatHandle {
    match h
        .engine
        .start_chat(NewChat {
            tenant: tenant.into(),
            user: "u1".into(),
            workflow: "EngineTest".into(),
            context: Map::new(),
            chat_id: None,
        })
        .await
    {
        Ok(c) => c,
        Err(e) => panic!("chat must start: {e}"),
    }
}

pub async fn subscribe(chat: ChatHandle, after_seq: u64) -> Client {
    let (tx, rx) = mpsc::unbounded_channel();
    let collector = Collector(tx).start();
    let sent = chat
        .addr
        .send(Subscribe {
            recipient: collector.recipient(),
            after_seq,
        })
        .await;
    assert!(sent.is_ok(), "subscribe must reach the session");
    Client {
        chat,
        rx,
        seen: Vec::new(),
    }
}
