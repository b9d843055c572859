//! Runs test files through the real engine.
//!
//! Each case gets its own actix `System` on a current-thread tokio runtime whose clock starts
//! paused, and the engine runs every actor on that one thread
//! ([`Engine::start_on_current_arbiter`]). Nothing in a case waits on another thread (no
//! store: tool claims stay in the dedup cache; tasks and artifacts are in memory; the scripted
//! model answers at once), so whenever every task is waiting the runtime is truly idle and
//! tokio moves the clock straight to the next timer. That gives the runner two things:
//!
//! - **settling**: a step runs once no event has arrived for [`QUIET`] of virtual time, which
//!   can only pass when the chat has nothing left to do but wait (for the user or a UI answer);
//! - **timeouts in no time**: a `timeout` step just waits, and the UI call's own timer (15
//!   minutes or a tool's `timeout_s`) fires at once in virtual time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use serde_json::{Map, Value};
use tessera_engine::session::{
    CancelRun, ChatSnapshot, Deliver, GetContext, GetSnapshot, Subscribe, ToolAnswer, UserInput,
};
use tessera_engine::{ChatHandle, Engine, EngineConfig, EngineHooks, NewChat};
use tessera_llm::ChatModel;
use tessera_llm::scripted::ScriptedModel;
use tessera_manifest::{ToolImpl, Workflow};
use tessera_tools::{BuiltinRegistry, InMemoryArtifactStore, InMemoryTaskStore, ToolServices};
use tokio::sync::mpsc;

use crate::diff::{self, Mismatch};
use crate::format::{Expect, ExpectedEvent, IGNORED_EVENTS, Step, TestFile, expected_from};

/// Virtual time without an event after which the chat counts as settled. Timers shorter than
/// this (none of the engine's defaults are) would fire while the runner waits.
pub const QUIET: Duration = Duration::from_millis(1);

/// Virtual time a `timeout` step waits for the UI call's timer before giving up (a call with
/// no timeout would otherwise wait forever).
const TIMEOUT_GUARD: Duration = Duration::from_secs(30 * 24 * 3600);

/// The chat id every case uses, so turn keys in events are the same on every run.
pub const TEST_CHAT_ID: &str = "chat_test";

/// Why a case could not run to its end (as opposed to running and not matching).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaseError {
    /// The test file is not valid JSON or not in the format.
    #[error("not a valid test file: {0}")]
    Format(String),
    /// The model script (the test's `model` or the workflow's `demo.json`) is unusable.
    #[error("model script: {0}")]
    Model(String),
    /// The workflow cannot run in a test.
    #[error("{0}")]
    Unsupported(String),
    /// The engine refused something.
    #[error("engine: {0}")]
    Engine(String),
    /// A step does not fit where the chat stands.
    #[error("step {index} ({step}): {problem}")]
    Step {
        /// 0-based index into `steps`.
        index: usize,
        /// The step's kind.
        step: &'static str,
        /// What is wrong.
        problem: String,
    },
}

/// Why a test directory could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum TestError {
    /// The directory is not a workflow folder or a folder of them.
    #[error(transparent)]
    Dir(#[from] tessera_manifest::WorkflowDirError),
    /// A test file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// What one case did, in the shape of its expectations.
#[derive(Debug, Clone, PartialEq)]
pub struct Actual {
    /// Every event but [`IGNORED_EVENTS`], as `--update` would write it.
    pub events: Vec<ExpectedEvent>,
    /// The same events with their full data (for checking subsets against).
    pub raw_events: Vec<(String, Value)>,
    /// Every context variable at the end.
    pub context: Map<String, Value>,
    /// `"From -> To"` of each handoff.
    pub handoffs: Vec<String>,
    /// Tool names of each call, in order.
    pub tool_calls: Vec<String>,
    /// Final status.
    pub status: String,
    /// Broken exactly-once guarantees (always checked).
    pub exactly_once: Vec<String>,
}

/// The result of one test file.
#[derive(Debug)]
pub struct CaseReport {
    /// The test file.
    pub file: PathBuf,
    /// Its workflow folder's name.
    pub workflow: String,
    /// What happened.
    pub outcome: CaseOutcome,
}

/// Pass, fail, or could not run.
#[derive(Debug)]
pub enum CaseOutcome {
    /// Every expectation held.
    Passed,
    /// `--update`: the expectations were rewritten from this run.
    Updated,
    /// Some expectations did not hold.
    Failed(Vec<Mismatch>),
    /// The case could not run (bad file, step out of place, workflow invalid, …).
    Error(String),
}

impl CaseOutcome {
    /// True for `Passed` and `Updated`.
    pub fn ok(&self) -> bool {
        matches!(self, Self::Passed | Self::Updated)
    }
}

/// Collects a chat's events into a channel.
struct Collector(mpsc::UnboundedSender<Arc<str>>);

impl Actor for Collector {
    type Context = Context<Self>;
}

impl Handler<Deliver> for Collector {
    type Result = ();
    fn handle(&mut self, Deliver(batch): Deliver, _: &mut Self::Context) {
        for text in batch {
            let _ = self.0.send(text);
        }
    }
}

/// The test files of a workflow folder (`tests/*.json`), sorted.
pub fn test_files(workflow_dir: &Path) -> Result<Vec<PathBuf>, TestError> {
    let dir = workflow_dir.join("tests");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(TestError::Io { path: dir, source }),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// Runs the tests of every workflow in `dir` (a workflow folder or a folder of them). An
/// invalid workflow is reported as one failed case per test file (or one for the folder).
pub fn run_dir(dir: &Path, update: bool) -> Result<Vec<CaseReport>, TestError> {
    let mut reports = Vec::new();
    for (name, loaded) in tessera_manifest::load_workflow_dir(dir)? {
        let folder = if dir.join("workflow.json").is_file() {
            dir.to_path_buf()
        } else {
            dir.join(&name)
        };
        let files = test_files(&folder)?;
        match loaded {
            Ok(workflow) => {
                for file in files {
                    let outcome = run_file(&workflow, &file, update)?;
                    reports.push(CaseReport {
                        file,
                        workflow: name.clone(),
                        outcome,
                    });
                }
            }
            Err(errors) if !files.is_empty() => reports.push(CaseReport {
                file: folder,
                workflow: name,
                outcome: CaseOutcome::Error(format!("the workflow is invalid:\n{errors}")),
            }),
            Err(_) => {}
        }
    }
    Ok(reports)
}

/// Runs one test file; with `update`, rewrites its expectations from the run.
pub fn run_file(workflow: &Workflow, file: &Path, update: bool) -> Result<CaseOutcome, TestError> {
    let io = |source| TestError::Io {
        path: file.to_path_buf(),
        source,
    };
    let text = std::fs::read_to_string(file).map_err(io)?;
    let test: TestFile = match serde_json::from_str(&text) {
        Ok(t) => t,
        Err(e) => {
            return Ok(CaseOutcome::Error(
                CaseError::Format(e.to_string()).to_string(),
            ));
        }
    };
    let actual = match run_case(workflow, &test) {
        Ok(actual) => actual,
        Err(e) => return Ok(CaseOutcome::Error(e.to_string())),
    };
    if update {
        let mut updated = test;
        updated.expect = snapshot(&actual);
        std::fs::write(file, to_pretty(&updated)).map_err(io)?;
        if !actual.exactly_once.is_empty() {
            return Ok(CaseOutcome::Failed(exactly_once_mismatches(&actual)));
        }
        return Ok(CaseOutcome::Updated);
    }
    let mismatches = check(&test.expect, &actual);
    Ok(if mismatches.is_empty() {
        CaseOutcome::Passed
    } else {
        CaseOutcome::Failed(mismatches)
    })
}

/// A test file as written to disk: pretty JSON with a final newline.
pub fn to_pretty(test: &TestFile) -> String {
    let mut text = serde_json::to_string_pretty(test).unwrap_or_default();
    text.push('\n');
    text
}

/// Every expectation, taken from a run (what `--update` writes).
pub fn snapshot(actual: &Actual) -> Expect {
    Expect {
        events: Some(actual.events.clone()),
        context: Some(actual.context.clone()),
        handoffs: Some(actual.handoffs.clone()),
        tool_calls: Some(actual.tool_calls.clone()),
        status: Some(actual.status.clone()),
    }
}

fn exactly_once_mismatches(actual: &Actual) -> Vec<Mismatch> {
    actual
        .exactly_once
        .iter()
        .map(|problem| Mismatch {
            path: "tool_calls (exactly once)".into(),
            expected: None,
            actual: None,
            note: Some(problem.clone()),
        })
        .collect()
}

/// Every difference between `expect` and the run.
pub fn check(expect: &Expect, actual: &Actual) -> Vec<Mismatch> {
    let mut out = exactly_once_mismatches(actual);
    if let Some(events) = &expect.events {
        // Data subsets are checked against the full event data, not the trimmed snapshot.
        let full: Vec<ExpectedEvent> = actual
            .events
            .iter()
            .zip(&actual.raw_events)
            .map(|(e, (_, data))| ExpectedEvent {
                data: Some(data.clone()),
                ..e.clone()
            })
            .collect();
        diff::events(events, &full, &mut out);
    }
    if let Some(context) = &expect.context {
        diff::subset(
            &Value::Object(context.clone()),
            &Value::Object(actual.context.clone()),
            "context",
            &mut out,
        );
    }
    let list = |name: &str, e: &Vec<String>, a: &Vec<String>, out: &mut Vec<Mismatch>| {
        if e != a {
            out.push(Mismatch {
                path: name.to_owned(),
                expected: Some(e.clone().into()),
                actual: Some(a.clone().into()),
                note: None,
            });
        }
    };
    if let Some(handoffs) = &expect.handoffs {
        list("handoffs", handoffs, &actual.handoffs, &mut out);
    }
    if let Some(tools) = &expect.tool_calls {
        list("tool_calls", tools, &actual.tool_calls, &mut out);
    }
    if let Some(status) = &expect.status
        && *status != actual.status
    {
        out.push(Mismatch {
            path: "status".into(),
            expected: Some(status.clone().into()),
            actual: Some(actual.status.clone().into()),
            note: None,
        });
    }
    out
}

/// The model a case uses: its own script, else the workflow's `demo.json`.
fn model_for(workflow: &Workflow, test: &TestFile) -> Result<ScriptedModel, CaseError> {
    let model = match &test.model {
        Some(script) => ScriptedModel::from_json(script),
        None => ScriptedModel::from_file(&workflow.dir.join("demo.json")),
    };
    model.map_err(|e| CaseError::Model(e.to_string()))
}

/// Runs one case to its end and reports what happened.
pub fn run_case(workflow: &Workflow, test: &TestFile) -> Result<Actual, CaseError> {
    if let Some(tool) = workflow
        .tools
        .iter()
        .find(|t| matches!(t.implementation, Some(ToolImpl::Http { .. })))
    {
        // A real network call would leave the runtime idle, and the virtual clock would jump
        // past the tool's timeout while the request is in flight.
        return Err(CaseError::Unsupported(format!(
            "tool {} is an HTTP tool; `tessera test` runs only built-in and UI tools (time is virtual)",
            tool.function
        )));
    }
    let model: Arc<dyn ChatModel> = Arc::new(model_for(workflow, test)?);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| CaseError::Engine(format!("cannot build a runtime: {e}")))?;
    let system = actix::System::with_tokio_rt(move || runtime);
    let workflow = workflow.clone();
    system.block_on(async move {
        let services = ToolServices {
            tasks: Arc::new(InMemoryTaskStore::default()),
            artifacts: Arc::new(InMemoryArtifactStore::default()),
        };
        let builtins = BuiltinRegistry::with_defaults(services);
        let name = workflow.name.clone();
        let config = EngineConfig {
            stream: false,
            ..EngineConfig::default()
        };
        let engine = Engine::start_on_current_arbiter(
            vec![(workflow, model)],
            &builtins,
            config,
            EngineHooks::default(),
        )
        .map_err(|e| CaseError::Engine(e.to_string()))?;
        drive(&engine, &name, test).await
    })
}

/// A chat under test and the events it has published so far.
struct Driven {
    chat: ChatHandle,
    rx: mpsc::UnboundedReceiver<Arc<str>>,
    events: Vec<(String, Value)>,
}

impl Driven {
    fn take(&mut self, text: &str) {
        if let Ok(mut v) = serde_json::from_str::<Value>(text)
            && let Some(kind) = v.get("type").and_then(Value::as_str).map(str::to_owned)
            && !IGNORED_EVENTS.contains(&kind.as_str())
        {
            let data = v.get_mut("data").map(Value::take).unwrap_or(Value::Null);
            self.events.push((kind, data));
        }
    }

    /// Reads events until the chat is quiet, then says where it stands.
    async fn settle(&mut self) -> Result<ChatSnapshot, CaseError> {
        loop {
            match tokio::time::timeout(QUIET, self.rx.recv()).await {
                Ok(Some(text)) => self.take(&text),
                Ok(None) => return Err(CaseError::Engine("the chat stopped".into())),
                Err(_) => break,
            }
        }
        self.chat
            .addr
            .send(GetSnapshot)
            .await
            .map_err(|e| CaseError::Engine(e.to_string()))
    }

    /// Waits (in virtual time) for the next event: the pending UI call's timeout.
    async fn wait_for_timeout(&mut self) -> Result<(), String> {
        match tokio::time::timeout(TIMEOUT_GUARD, self.rx.recv()).await {
            Ok(Some(text)) => {
                self.take(&text);
                Ok(())
            }
            Ok(None) => Err("the chat stopped".into()),
            Err(_) => Err(
                "nothing happened within 30 days of virtual time: the call has no timeout".into(),
            ),
        }
    }
}

fn step_name(step: &Step) -> &'static str {
    match step {
        Step::User(_) => "user",
        Step::Answer(_) => "answer",
        Step::Timeout(_) => "timeout",
        Step::Cancel(_) => "cancel",
    }
}

/// Where a settled chat stands, for messages about misplaced steps.
fn describe(snapshot: &ChatSnapshot) -> String {
    match snapshot.pending_ui_calls.first() {
        Some(call) => format!("the chat waits for an answer to UI tool {}", call.tool_name),
        None => format!("the chat is {}", snapshot.status.as_str()),
    }
}

async fn drive(engine: &Engine, workflow: &str, test: &TestFile) -> Result<Actual, CaseError> {
    let chat = engine
        .start_chat(NewChat {
            tenant: "test".into(),
            user: "author".into(),
            workflow: workflow.to_owned(),
            context: test.context.clone(),
            chat_id: Some(TEST_CHAT_ID.into()),
        })
        .await
        .map_err(|e| CaseError::Engine(e.to_string()))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let collector = Collector(tx).start();
    chat.addr
        .send(Subscribe {
            recipient: collector.recipient(),
            after_seq: 0,
        })
        .await
        .map_err(|e| CaseError::Engine(e.to_string()))?;
    let mut driven = Driven {
        chat,
        rx,
        events: Vec::new(),
    };
    let mut state = driven.settle().await?;
    for (index, step) in test.steps.iter().enumerate() {
        let fail = |problem: String| CaseError::Step {
            index,
            step: step_name(step),
            problem,
        };
        let pending = state.pending_ui_calls.first().cloned();
        match step {
            Step::User(content) => {
                let sent = driven
                    .chat
                    .addr
                    .send(UserInput {
                        content: content.clone(),
                        client_msg_id: None,
                    })
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                sent.map_err(|e| fail(format!("{e} ({})", describe(&state))))?;
            }
            Step::Answer(answer) => {
                let Some(call) = pending else {
                    return Err(fail(format!("no UI call to answer: {}", describe(&state))));
                };
                if let Some(tool) = &answer.tool
                    && *tool != call.tool_name
                {
                    return Err(fail(format!(
                        "expected a call of {tool}, but {} is waiting",
                        call.tool_name
                    )));
                }
                let sent = driven
                    .chat
                    .addr
                    .send(ToolAnswer {
                        corr: call.corr.clone(),
                        response: answer.response(&call.corr),
                    })
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                sent.map_err(|e| fail(e.to_string()))?;
            }
            Step::Timeout(tool) => {
                match &pending {
                    Some(call) if call.tool_name == *tool => {}
                    _ => {
                        return Err(fail(format!(
                            "expected {tool} to be waiting, but {}",
                            describe(&state)
                        )));
                    }
                }
                driven.wait_for_timeout().await.map_err(fail)?;
            }
            Step::Cancel(_) => {
                if pending.is_none() {
                    return Err(fail(format!("nothing to cancel: {}", describe(&state))));
                }
                driven
                    .chat
                    .addr
                    .send(CancelRun)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
            }
        }
        state = driven.settle().await?;
    }
    if state.status.as_str() == "running" {
        return Err(CaseError::Engine(
            "the chat is still running with nothing left to wait for (a model that never answers?)"
                .into(),
        ));
    }
    let context = driven
        .chat
        .addr
        .send(GetContext)
        .await
        .map_err(|e| CaseError::Engine(e.to_string()))?;
    Ok(summarize(driven.events, context, &state))
}

/// Builds the [`Actual`] of a run from its events.
pub fn summarize(
    raw_events: Vec<(String, Value)>,
    context: Map<String, Value>,
    state: &ChatSnapshot,
) -> Actual {
    let still_waiting: Vec<&str> = state
        .pending_ui_calls
        .iter()
        .map(|c| c.tool_name.as_str())
        .collect();
    summarize_with(raw_events, context, state.status.as_str(), &still_waiting)
}

/// [`summarize`] from plain values (also used by `tessera record` on stored events).
pub fn summarize_with(
    raw_events: Vec<(String, Value)>,
    context: Map<String, Value>,
    status: &str,
    still_waiting: &[&str],
) -> Actual {
    let events = raw_events
        .iter()
        .map(|(kind, data)| expected_from(kind, data))
        .collect();
    let str_of = |data: &Value, key: &str| data.get(key).and_then(Value::as_str).map(str::to_owned);
    let mut handoffs = Vec::new();
    let mut tool_calls = Vec::new();
    // corr -> (tool, announcements, responses)
    let mut calls: Vec<(String, String, usize, usize)> = Vec::new();
    for (kind, data) in &raw_events {
        match kind.as_str() {
            "chat.handoff" => handoffs.push(format!(
                "{} -> {}",
                str_of(data, "from").unwrap_or_default(),
                str_of(data, "to").unwrap_or_default()
            )),
            "chat.tool_call" if data.get("awaiting_response") != Some(&Value::Bool(true)) => {
                let tool = str_of(data, "tool_name").unwrap_or_default();
                let corr = str_of(data, "corr").unwrap_or_default();
                tool_calls.push(tool.clone());
                match calls.iter_mut().find(|c| c.0 == corr) {
                    Some(c) => c.2 += 1,
                    None => calls.push((corr, tool, 1, 0)),
                }
            }
            "chat.tool_response" => {
                let corr = str_of(data, "corr").unwrap_or_default();
                match calls.iter_mut().find(|c| c.0 == corr) {
                    Some(c) => c.3 += 1,
                    None => calls.push((corr, str_of(data, "tool_name").unwrap_or_default(), 0, 1)),
                }
            }
            _ => {}
        }
    }
    let mut exactly_once = Vec::new();
    for (corr, tool, announced, answered) in &calls {
        let pending_at_end = *answered == 0 && still_waiting.contains(&tool.as_str());
        if *announced != 1 || (*answered != 1 && !pending_at_end) {
            exactly_once.push(format!(
                "tool {tool} (call {corr}) was announced {announced} times and answered {answered} times; each call must be both exactly once"
            ));
        }
    }
    Actual {
        events,
        raw_events,
        context,
        handoffs,
        tool_calls,
        status: status.to_owned(),
        exactly_once,
    }
}
