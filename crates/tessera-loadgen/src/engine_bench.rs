//! `engine-bench`: the engine alone, in process. N chats of the LoadTest workflow each run K
//! turns; a turn is model call → one `echo` tool call → the tool runs → model call → final
//! answer, with an in-process [`ChatModel`] (no HTTP, no sockets). Prints one JSON line.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::Context as _;
use futures::future::BoxFuture;
use serde_json::{Map, json};
use tessera_engine::session::{Deliver, Subscribe, UserInput};
use tessera_engine::{ChatHandle, Engine, EngineConfig, EngineHooks, NewChat};
use tessera_llm::{ChatModel, ChatRequest, ChatResponse, DeltaSink, LlmError, Message, Role};
use tessera_llm::{ToolCall, Usage};
use tessera_tools::{BuiltinRegistry, InMemoryArtifactStore, InMemoryTaskStore, ToolServices};
use tokio::sync::mpsc;

use crate::report::{proc_status_number, process_cpu_seconds};
use crate::turn_gate::{Acquire, Permit, Release, TurnGate};

/// Options of `engine-bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineBenchArgs {
    /// Concurrent chats.
    #[arg(long, default_value_t = 1000)]
    pub chats: usize,
    /// Turns per chat.
    #[arg(long, default_value_t = 5)]
    pub turns: u32,
    /// Engine arbiters (threads); 0 means one per core.
    #[arg(long, default_value_t = 0)]
    pub arbiters: usize,
    /// Folder of workflow folders (must hold LoadTest).
    #[arg(long)]
    pub workflows: Option<PathBuf>,
    /// Hard limit of the run, in seconds.
    #[arg(long, default_value_t = 300)]
    pub max_seconds: u64,
    /// At most this many turns in flight at once on each engine thread (0: every chat's turn
    /// at once). See `turn_gate.rs`.
    #[arg(long, default_value_t = 0)]
    pub active: usize,
}

/// The in-process model: a call of the first offered tool after a user message, a final
/// answer after a tool result.
pub struct BenchModel {
    calls: AtomicU64,
    args: Arc<str>,
}

impl BenchModel {
    /// A model whose tool calls carry `args` (JSON text).
    pub fn new(args: &str) -> Self {
        Self {
            calls: AtomicU64::new(0),
            args: Arc::from(args),
        }
    }
}

impl ChatModel for BenchModel {
    fn complete(
        &self,
        request: ChatRequest,
        _deltas: Option<DeltaSink>,
    ) -> BoxFuture<'static, Result<ChatResponse, LlmError>> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let after_tool = request
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Tool);
        let message = match request.tools.first() {
            Some(tool) if !after_tool => Message {
                role: Role::Assistant,
                content: None,
                name: None,
                tool_calls: vec![ToolCall {
                    id: format!("call_{n}"),
                    name: tool.name.clone(),
                    arguments: self.args.to_string(),
                }],
                tool_call_id: None,
                wire: Default::default(),
            },
            _ => Message::text(Role::Assistant, "Done: the tool returned its result."),
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

/// Drives one chat: each `chat.input_request` ends a turn and starts the next.
struct Driver {
    chat: ChatHandle,
    index: usize,
    requests_seen: u32,
    turns: u32,
    done: mpsc::UnboundedSender<usize>,
    go: bool,
    /// With `--active`: this thread's gate, and this driver as the gate's permit recipient.
    gate: Option<(Addr<TurnGate>, Recipient<Permit>)>,
}

/// Start the first turn (sent once every chat is ready).
#[derive(Message)]
#[rtype(result = "()")]
struct Go;

impl Actor for Driver {
    type Context = Context<Self>;
}

impl Driver {
    /// Starts the next turn, once the gate (if any) admits it.
    fn next_turn(&self) {
        match &self.gate {
            Some((gate, me)) => gate.do_send(Acquire(me.clone())),
            None => self.send_input(),
        }
    }

    fn send_input(&self) {
        self.chat.addr.do_send(UserInput {
            content: format!(
                "bench message {} of chat {}",
                self.requests_seen, self.index
            ),
            client_msg_id: None,
        });
    }

    /// A `chat.input_request` arrived: the next message, or done after the last turn.
    fn input_requested(&mut self) {
        self.requests_seen += 1;
        // The first input request is the chat's initial one (replayed on subscribe).
        if self.requests_seen == 1 {
            if self.go {
                self.next_turn();
            }
            return;
        }
        // Every later one ends a turn.
        if let Some((gate, _)) = &self.gate {
            gate.do_send(Release);
        }
        if self.requests_seen > self.turns {
            let _ = self.done.send(self.index);
        } else {
            self.next_turn();
        }
    }
}

impl Handler<Deliver> for Driver {
    type Result = ();

    fn handle(&mut self, Deliver(batch): Deliver, _: &mut Self::Context) {
        for text in batch {
            if text.starts_with("{\"type\":\"chat.input_request\"") {
                self.input_requested();
            }
        }
    }
}

impl Handler<Go> for Driver {
    type Result = ();

    fn handle(&mut self, _: Go, _: &mut Self::Context) {
        self.go = true;
        if self.requests_seen >= 1 {
            self.next_turn();
        }
    }
}

impl Handler<Permit> for Driver {
    type Result = ();

    fn handle(&mut self, _: Permit, _: &mut Self::Context) {
        self.send_input();
    }
}

fn workflows_dir(given: Option<PathBuf>) -> PathBuf {
    given.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../workflows"))
}

/// Runs the benchmark and prints its JSON line.
pub fn run(args: EngineBenchArgs) -> anyhow::Result<()> {
    let dir = workflows_dir(args.workflows.clone()).join("LoadTest");
    let workflow = tessera_manifest::load_workflow(&dir)
        .map_err(|e| anyhow::anyhow!("cannot load {}: {e}", dir.display()))?;
    let system = actix::System::new();
    let result = system.block_on(bench(args, workflow));
    System::current().stop();
    let line = result?;
    println!("{line}");
    Ok(())
}

async fn bench(
    args: EngineBenchArgs,
    workflow: tessera_manifest::Workflow,
) -> anyhow::Result<String> {
    let services = ToolServices {
        tasks: Arc::new(InMemoryTaskStore::default()),
        artifacts: Arc::new(InMemoryArtifactStore::default()),
    };
    let builtins = BuiltinRegistry::with_defaults(services);
    let model: Arc<dyn ChatModel> = Arc::new(BenchModel::new(r#"{"message":"hello"}"#));
    let engine = Engine::start(
        vec![(workflow, model)],
        &builtins,
        EngineConfig {
            stream: false,
            arbiters: args.arbiters,
            ..EngineConfig::default()
        },
        EngineHooks::default(),
    )
    .map_err(|e| anyhow::anyhow!("engine: {e}"))?;

    let (active, in_flight_peak) = (args.active, Arc::new(AtomicU64::new(0)));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut drivers = Vec::with_capacity(args.chats);
    for index in 0..args.chats {
        let chat = engine
            .start_chat(NewChat {
                tenant: "bench".into(),
                user: format!("u{index}"),
                workflow: "LoadTest".into(),
                context: Map::new(),
                chat_id: None,
            })
            .await
            .map_err(|e| anyhow::anyhow!("start chat: {e}"))?;
        let addr = chat.addr.clone();
        // On the chat's own arbiter, like the chat's helpers: every delivered event and every
        // input is then a same-thread mailbox send, so the run measures the engine rather than
        // cross-thread wake-ups between the harness and the engine.
        let arbiter = chat.arbiter.clone();
        let (turns, done, in_flight_peak) =
            (args.turns, done_tx.clone(), Arc::clone(&in_flight_peak));
        let driver = Driver::start_in_arbiter(&arbiter, move |ctx| Driver {
            chat,
            index,
            requests_seen: 0,
            turns,
            done,
            go: false,
            gate: (active > 0).then(|| {
                let gate = TurnGate::of_this_thread(active, &in_flight_peak);
                (gate, ctx.address().recipient())
            }),
        });
        addr.send(Subscribe {
            recipient: driver.clone().recipient(),
            after_seq: 0,
        })
        .await
        .context("subscribe")?;
        drivers.push(driver);
    }
    drop(done_tx);

    let cpu_start = process_cpu_seconds();
    let started = Instant::now();
    for driver in &drivers {
        driver.do_send(Go);
    }
    let deadline = Duration::from_secs(args.max_seconds.max(1));
    let mut finished = 0;
    while finished < args.chats {
        match tokio::time::timeout(deadline.saturating_sub(started.elapsed()), done_rx.recv()).await
        {
            Ok(Some(_)) => finished += 1,
            Ok(None) => break,
            Err(_) => anyhow::bail!(
                "only {finished} of {} chats finished within {}s",
                args.chats,
                args.max_seconds
            ),
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu_start;
    let turns = args.chats as f64 * f64::from(args.turns);
    let peak = proc_status_number("self", "VmHWM").map_or(0.0, |k| k as f64 / 1024.0);
    let round = |v: f64, digits: i32| {
        let f = 10f64.powi(digits);
        (v * f).round() / f
    };
    Ok(json!({
        "framework": "tessera",
        "N": args.chats,
        "K": args.turns,
        "turns_per_s": round(turns / wall, 0),
        "cpu_ms_per_turn": round(cpu * 1000.0 / turns, 4),
        "peak_rss_MiB": round(peak, 1),
        "active": (active > 0).then_some(active),
        "peak_in_flight_per_thread": (active > 0).then(|| in_flight_peak.load(Ordering::Relaxed)),
    })
    .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One run of the benchmark on one engine thread.
    fn bench_once(chats: usize, turns: u32, active: usize) -> anyhow::Result<serde_json::Value> {
        let dir = workflows_dir(None).join("LoadTest");
        let workflow = tessera_manifest::load_workflow(&dir)
            .map_err(|e| anyhow::anyhow!("cannot load {}: {e}", dir.display()))?;
        let args = EngineBenchArgs {
            chats,
            turns,
            arbiters: 1,
            workflows: None,
            max_seconds: 60,
            active,
        };
        let line = actix::System::new().block_on(bench(args, workflow))?;
        Ok(serde_json::from_str(&line)?)
    }

    #[test]
    fn a_gate_keeps_its_limit_of_turns_in_flight_and_every_chat_finishes() -> anyhow::Result<()> {
        // `bench` fails unless every chat finishes all its turns.
        let gated = bench_once(8, 3, 2)?;
        assert_eq!(gated["active"], 2);
        // Eight chats ask at once; exactly two turns run at a time.
        assert_eq!(gated["peak_in_flight_per_thread"], 2);

        let ungated = bench_once(8, 3, 0)?;
        assert!(ungated["active"].is_null());
        assert!(ungated["peak_in_flight_per_thread"].is_null());
        Ok(())
    }
}
