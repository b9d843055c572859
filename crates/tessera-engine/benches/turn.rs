//! The cost of one full agent turn through the actors: user input → model call → one `echo`
//! tool call → the tool runs → model call → final answer → `chat.input_request`, with an
//! in-process model (no HTTP) over the test fixture workflow.
//!
//! Run with `cargo bench -p tessera-engine --bench turn`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use criterion::{Criterion, criterion_group, criterion_main};
use futures::future::BoxFuture;
use serde_json::Map;
use tessera_engine::session::{Deliver, Subscribe, UserInput};
use tessera_engine::{Engine, EngineConfig, EngineHooks, NewChat};
use tessera_llm::{
    ChatModel, ChatRequest, ChatResponse, DeltaSink, LlmError, Message, Role, ToolCall, Usage,
};
use tessera_tools::{BuiltinRegistry, InMemoryArtifactStore, InMemoryTaskStore, ToolServices};
use tokio::sync::mpsc;

/// Turns run on one chat before a fresh one is started (the fixture allows 20).
const TURNS_PER_CHAT: u64 = 10;

/// Calls the first offered tool after a user message; answers after a tool result.
struct InProcessModel(AtomicU64);

impl ChatModel for InProcessModel {
    fn complete(
        &self,
        request: ChatRequest,
        _deltas: Option<DeltaSink>,
    ) -> BoxFuture<'static, Result<ChatResponse, LlmError>> {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        let after_tool = request
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Tool);
        let message = match request.tools.iter().find(|t| t.name == "echo") {
            Some(tool) if !after_tool => Message {
                role: Role::Assistant,
                content: None,
                name: None,
                tool_calls: vec![ToolCall {
                    id: format!("call_{n}"),
                    name: tool.name.clone(),
                    arguments: r#"{"message":"hello"}"#.to_owned(),
                }],
                tool_call_id: None,
                wire: Default::default(),
            },
            _ => Message::text(Role::Assistant, "Done."),
        };
        Box::pin(futures::future::ready(Ok(ChatResponse {
            message,
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
            },
            finish_reason: None,
            model: "bench".into(),
        })))
    }

    fn label(&self) -> &str {
        "bench"
    }
}

/// Forwards only `chat.input_request` events (the end of a turn).
struct TurnEnds(mpsc::UnboundedSender<()>);

impl Actor for TurnEnds {
    type Context = Context<Self>;
}

impl Handler<Deliver> for TurnEnds {
    type Result = ();

    fn handle(&mut self, Deliver(batch): Deliver, _: &mut Self::Context) {
        for text in batch {
            if text.starts_with("{\"type\":\"chat.input_request\"") {
                let _ = self.0.send(());
            }
        }
    }
}

fn engine() -> Engine {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/EngineTest");
    let workflow = match tessera_manifest::load_workflow(&dir) {
        Ok(w) => w,
        Err(e) => panic!("the fixture must load: {e}"),
    };
    let services = ToolServices {
        tasks: Arc::new(InMemoryTaskStore::default()),
        artifacts: Arc::new(InMemoryArtifactStore::default()),
    };
    let builtins = BuiltinRegistry::with_defaults(services);
    let model: Arc<dyn ChatModel> = Arc::new(InProcessModel(AtomicU64::new(0)));
    match Engine::start(
        vec![(workflow, model)],
        &builtins,
        EngineConfig {
            stream: false,
            arbiters: 1,
            ..EngineConfig::default()
        },
        EngineHooks::default(),
    ) {
        Ok(e) => e,
        Err(e) => panic!("the engine must start: {e}"),
    }
}

/// Runs `iters` turns; returns the time spent inside turns only (chat setup excluded).
async fn turns(engine: &Engine, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let chat = match engine
            .start_chat(NewChat {
                tenant: "bench".into(),
                user: "u".into(),
                workflow: "EngineTest".into(),
                context: Map::new(),
                chat_id: None,
            })
            .await
        {
            Ok(c) => c,
            Err(e) => panic!("chat must start: {e}"),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let ends = TurnEnds(tx).start();
        if chat
            .addr
            .send(Subscribe {
                recipient: ends.recipient(),
                after_seq: 0,
            })
            .await
            .is_err()
        {
            panic!("subscribe must reach the session");
        }
        // The chat's initial input request (replayed on subscribe).
        let _ = rx.recv().await;
        let batch = TURNS_PER_CHAT.min(iters - done);
        for i in 0..batch {
            let started = Instant::now();
            chat.addr.do_send(UserInput {
                content: format!("message {i}"),
                client_msg_id: None,
            });
            if rx.recv().await.is_none() {
                panic!("the chat stopped");
            }
            total += started.elapsed();
        }
        done += batch;
    }
    total
}

fn bench_turn(c: &mut Criterion) {
    let system = System::new();
    let engine = system.block_on(async { engine() });
    c.bench_function("turn_with_one_tool_call", |b| {
        b.iter_custom(|iters| system.block_on(turns(&engine, iters)))
    });
}

criterion_group!(benches, bench_turn);
criterion_main!(benches);
