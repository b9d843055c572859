//! `ChatSession`: one actor per chat. It owns the transcript, context variables, current
//! agent, turn counter and event log; assigns every event its `seq`; and applies what follows
//! each turn. This file is the actor's state, the messages it receives and its handlers; what
//! follows a turn is decided by the pure functions of `session/routing.rs`, and rebuilding a
//! chat after a restart lives in `session/restore.rs`.

mod restore;
mod routing;
mod variables;
mod visibility;

use std::sync::Arc;

use actix::prelude::*;
use serde_json::{Map, Value};
use tessera_llm::{Message, Role};
use tessera_protocol::{ErrorCode, PendingUiCall, ServerEvent, ToolCallEvent};
use tessera_store::StoredEvent;
use tessera_tools::ToolContext;

use crate::auto_tool::{AutoToolOutcome, InvokeAutoTool};
use crate::correlator::{
    CancelUiCalls, ChatDisconnected, CorrelationError, ListPendingUiCalls, ReleaseUiCalls,
    ResolveUiCall,
};
use crate::dedup::{CompleteKey, ToolKey};
use crate::envelope::{ChatIdJson, EventLog, envelope_json, envelope_seq};
pub use crate::events::Publish;
use crate::ids;
use crate::persist::{FlushOutcome, NextFlush, StateRow, TranscriptRow, WriteBehind, store_error};
use crate::runner::{
    AgentRunner, CancelTurn, LoggedToolEvents, RunnerParts, TurnFinished, message_id,
};
use crate::secrets::SecretVault;
use crate::shard::Shard;
pub use crate::status::{ChatIdentity, ChatStatus};
use crate::transcript::Transcript;
use crate::turn::{TurnFailure, TurnLimits, TurnOutput};
use crate::{EngineConfig, EngineError, plan::CompiledWorkflow};
use routing::Route;
use visibility::{HeldEvent, HeldEvents};

/// Events, each serialized once, on their way to a subscriber, in seq order: one batch per
/// burst (what the chat published while working through its mailbox), so a burst costs one
/// message and one socket write rather than one per event.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Deliver(pub Vec<Arc<str>>);

impl Deliver {
    /// A batch of one event.
    pub fn one(text: Arc<str>) -> Self {
        Self(vec![text])
    }
}

/// Attach a subscriber; it receives `chat.session`, every logged event after `after_seq`,
/// then `chat.resume_boundary`, then live events.
#[derive(Message)]
#[rtype(result = "u64")]
pub struct Subscribe {
    pub recipient: Recipient<Deliver>,
    pub after_seq: u64,
}

/// A [`Subscribe`] without its `chat.session` and `chat.resume_boundary`: for a client that
/// has them already, from another node that fed it the chat until the chat moved here.
#[derive(Message)]
#[rtype(result = "u64")]
pub struct SubscribeQuietly {
    pub recipient: Recipient<Deliver>,
    pub after_seq: u64,
}

/// The logged events after `after_seq` that clients may see, as a subscriber's replay gives
/// them (memory, and the store for those that left it), at most `max_events` of them and about
/// `max_bytes`: for a node that feeds a client of a chat another node owns (in a cluster the
/// store holds no streamed delta; the owner's memory does while its message streams).
#[derive(Message)]
#[rtype(result = "Result<Replayed, EngineError>")]
pub struct ReplayEvents {
    pub after_seq: u64,
    pub max_events: usize,
    pub max_bytes: usize,
    /// Also the `chat.session` event a subscriber gets before its replay.
    pub with_session: bool,
}

/// What [`ReplayEvents`] answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    /// The `chat.session` envelope, when asked for.
    pub session: Option<Arc<str>>,
    /// The events' envelopes, by ascending seq.
    pub events: Vec<Arc<str>>,
    /// The replay is whole up to this seq: a seq up to here that is not among `events` has no
    /// event for clients (a delta of a message now final, or a seq marked taken).
    pub through: u64,
    /// More events follow `through` than the limits let in: ask again after it (or, when
    /// `events` is empty, read the next from the store: it is too big for the limits).
    pub more: bool,
}

/// A published event, typed, for in-process watchers (see [`Watch`]), with its seq in the
/// chat's log (so a watcher can tell events before and after a point, and report resume
/// positions).
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Observed(pub ServerEvent, pub u64);

/// Attach an in-process watcher: it receives every event published from now on as typed
/// data (no replay, no serialization). Detach it with [`Unsubscribe`].
#[derive(Message)]
#[rtype(result = "u64")]
pub struct Watch(pub Recipient<Observed>);

/// Detach subscriber or watcher `id` (returned by [`Subscribe`] or [`Watch`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Unsubscribe(pub u64);

/// The user typed something.
#[derive(Message)]
#[rtype(result = "Result<(), EngineError>")]
pub struct UserInput {
    pub content: String,
    pub client_msg_id: Option<String>,
}

/// [`UserInput`] from a caller with a W3C trace context: the turn's `invoke_workflow` span
/// becomes its child.
#[derive(Message)]
#[rtype(result = "Result<(), EngineError>")]
pub struct TracedInput {
    pub input: UserInput,
    pub parent: tessera_telemetry::RemoteParent,
}

/// The browser answered a UI tool call.
#[derive(Message)]
#[rtype(result = "Result<(), EngineError>")]
pub struct ToolAnswer {
    pub corr: String,
    pub response: Value,
}

/// Stop the running turn (and any UI wait) and hand control back to the user.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CancelRun;

/// End the chat for good because it is being deleted: cancel the running turn and any UI wait,
/// drop writes not yet flushed, and stop the actor. Nothing more is published or stored.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopChat;
/// This node lost the chat (in a cluster, its lease moved to another node): stop at once and
/// write nothing more; the new owner continues from the store. The running turn and any UI
/// wait are dropped and subscribers are detached (their sockets resume on the new owner).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Relinquish;

/// Leave memory now, if the chat could leave it idle (see `IdleCheck`) but for the time:
/// nobody here is subscribed (but for subscriber `but_for`) or watching, every write is
/// stored, and it waits only on its user or on UI calls without a timeout. Answers whether it
/// left. In a cluster, the owner does this when a client's socket reaches another node, which
/// then claims the chat and serves that socket as its own (the store alone carries the chat
/// across); `but_for` is the owner's relay, subscribed for that socket's node.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct LeaveForAnotherNode {
    pub but_for: Option<u64>,
}

/// Resolves once every write the chat has queued so far is in the store (at once without a
/// store). The server sends it to every chat on shutdown, before closing the store: a flush
/// answered by the store's last commit may leave writes queued behind it that would
/// otherwise never be sent.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WhenStored;

/// A read-only view of the chat, for REST.
#[derive(Debug, Clone)]
pub struct ChatSnapshot {
    pub chat_id: Arc<str>,
    pub workflow: String,
    pub status: ChatStatus,
    pub current_agent: Arc<str>,
    pub turn: u32,
    /// The last seq clients can see (in a cluster: the last durable one).
    pub last_seq: u64,
    /// The last seq logged, visible yet or not: every event after it was caused by what the
    /// chat handles after this snapshot (in a cluster it can be ahead of `last_seq`).
    pub logged_seq: u64,
    /// Highest seq the store holds (`None` without a store).
    pub persisted_seq: Option<u64>,
    /// Context variables the manifest lets clients see.
    pub visible_context: Map<String, Value>,
    pub pending_ui_calls: Vec<PendingUiCall>,
    /// (message id, role, agent, content, ui_hidden)
    pub transcript: Vec<TranscriptEntry>,
}

/// One transcript message as clients see it.
#[derive(Debug, Clone)]
pub struct TranscriptEntry {
    pub message_id: String,
    pub role: &'static str,
    pub agent: Option<String>,
    pub content: String,
    pub ui_hidden: bool,
}

/// Ask for a [`ChatSnapshot`].
#[derive(Message)]
#[rtype(result = "ChatSnapshot")]
pub struct GetSnapshot;

/// Ask for every context variable, hidden ones included (for `tessera test`, which checks
/// the final values; clients see only [`ChatSnapshot::visible_context`]).
#[derive(Message)]
#[rtype(result = "Map<String, Value>")]
pub struct GetContext;

struct Subscriber {
    id: u64,
    recipient: Recipient<Deliver>,
    /// Published since the burst began, sent at its end ([`EndOfBurst`]).
    pending: Vec<Arc<str>>,
}

/// The chat actor.
pub struct ChatSession {
    id: ChatIdentity,
    /// `id.chat_id` escaped once for every event envelope.
    chat_id_json: ChatIdJson,
    wf: Arc<CompiledWorkflow>,
    shard: Arc<Shard>,
    config: Arc<EngineConfig>,
    history: Transcript,
    /// Parallel to `history`: message id and hidden flag of each visible-kind message.
    meta: Vec<(String, bool)>,
    context: variables::ContextVars,
    current_agent: Arc<str>,
    turn: u32,
    /// Turns the current agent took in a row since the user last spoke.
    consecutive: u32,
    status: ChatStatus,
    runner: Option<Addr<AgentRunner>>,
    log: EventLog,
    /// Resumes reading older events from the store: until they are done, memory keeps every
    /// event it holds (they replay the rest from it).
    store_replays: u32,
    subscribers: Vec<Subscriber>,
    /// In-process watchers of typed events.
    watchers: Vec<(u64, Recipient<Observed>)>,
    next_subscriber: u64,
    secrets: SecretVault,
    /// Durable writes, when the engine has a store.
    persist: Option<WriteBehind>,
    flush_requested: bool,
    /// The requested flush starts at the end of the burst (not after a back-off).
    flush_at_burst_end: bool,
    /// An [`EndOfBurst`] is in the mailbox.
    burst_end_sent: bool,
    /// Answered once the write-behind queue is idle (see [`WhenStored`]).
    stored_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Set once the actor has started.
    own: Option<OwnAddress>,
    /// Set for a chat rebuilt from the store: `started` resumes instead of starting.
    restored: Option<restore::RestoredWork>,
    /// For the re-run of a turn interrupted by a restart: the turn's tool events the log
    /// holds already (taken by the next `start_turn`).
    logged_tools: LoggedToolEvents,
    /// `invoke_workflow`: open from a user input (or resumed run) until the chat waits for
    /// the user again or ends; disabled when traces are not exported.
    workflow_span: tracing::Span,
    /// The lease epoch every durable write carries in a cluster (`None` on a single node).
    epoch: Option<i64>,
    /// In a cluster (with a store), events wait here until they are durable: clients never
    /// see an event the next owner could not replay (see `session/visibility.rs`).
    held: Option<HeldEvents>,
    /// Last event, subscription change or read: an open chat idle for the engine's
    /// `idle_evict` leaves memory (see [`IdleCheck`]).
    last_active: std::time::Instant,
}

/// The session's own address in the forms its turns and flushes hand out, made once: actix
/// allocates a sender's parking state for every `ctx.address()` and every clone of an `Addr`
/// or a `Recipient` (~20 allocations a turn before), and an `Arc` clone allocates nothing.
struct OwnAddress {
    addr: Arc<Addr<ChatSession>>,
    publish: Arc<Recipient<Publish>>,
    report: Arc<Recipient<TurnFinished>>,
}

impl OwnAddress {
    fn of(ctx: &Context<ChatSession>) -> Self {
        let addr = ctx.address();
        Self {
            publish: Arc::new(addr.clone().recipient()),
            report: Arc::new(addr.clone().recipient()),
            addr: Arc::new(addr),
        }
    }
}

/// The end of a burst, sent to self by its first event or write, so it arrives after the
/// messages already waiting: each subscriber gets what the burst published as one batch, and
/// what it queued for the store starts its flush (writes batch per mailbox turn).
#[derive(Message)]
#[rtype(result = "()")]
struct EndOfBurst;

/// Flush queued durable writes: a retry after a failed flush's back-off.
#[derive(Message)]
#[rtype(result = "()")]
struct FlushWrites;

impl ChatSession {
    /// A new chat of workflow `wf`; `context` overrides initial context variables.
    pub fn new(
        id: ChatIdentity,
        wf: Arc<CompiledWorkflow>,
        shard: Arc<Shard>,
        config: Arc<EngineConfig>,
        context_overrides: Map<String, Value>,
    ) -> Self {
        let mut context = wf.workflow.initial_context();
        for (key, value) in context_overrides {
            // Only declared variables may be set by the creator of a chat.
            if context.contains_key(&key) {
                context.insert(key, value);
            }
        }
        let current_agent = Arc::from(wf.workflow.initial_agent.as_str());
        Self {
            wf,
            config,
            history: Transcript::default(),
            meta: Vec::new(),
            context: variables::ContextVars::new(Arc::new(context)),
            current_agent,
            turn: 0,
            consecutive: 0,
            status: ChatStatus::AwaitingUser,
            runner: None,
            log: EventLog::default(),
            store_replays: 0,
            subscribers: Vec::new(),
            watchers: Vec::new(),
            next_subscriber: 1,
            secrets: SecretVault::default(),
            persist: shard
                .store
                .clone()
                .map(|store| WriteBehind::new(store, id.chat_id.clone())),
            flush_requested: false,
            flush_at_burst_end: false,
            burst_end_sent: false,
            stored_waiters: Vec::new(),
            own: None,
            restored: None,
            logged_tools: LoggedToolEvents::default(),
            workflow_span: tracing::Span::none(),
            epoch: None,
            held: None,
            last_active: std::time::Instant::now(),
            chat_id_json: ChatIdJson::new(&id.chat_id),
            id,
            shard,
        }
    }

    /// Fences every durable write of the chat (flushes, tool claims and completions) with
    /// the lease `epoch` this node holds in a cluster: the store refuses them once another
    /// node took the chat over, and the session then relinquishes it.
    pub fn with_epoch(mut self, epoch: Option<i64>) -> Self {
        self.epoch = epoch;
        if let Some(persist) = &mut self.persist {
            persist.set_epoch(epoch);
            let durable = persist.persisted_seq();
            self.held = epoch.map(|_| HeldEvents::after(durable));
        }
        self
    }

    fn last_seq(&self) -> u64 {
        self.log.last_seq()
    }

    /// The last seq clients may see: the last logged one, or in a cluster the last durable one.
    fn visible_seq(&self) -> u64 {
        let last = self.last_seq();
        self.held
            .as_ref()
            .map_or(last, |held| held.visible_seq(last))
    }

    /// Lets the events the store holds leave memory, but for the last few (a resume from
    /// further back reads the store).
    fn forget_stored_events(&mut self) {
        if self.store_replays > 0 {
            return;
        }
        if let Some(stored) = self
            .persist
            .as_ref()
            .and_then(WriteBehind::log_stored_through)
        {
            self.log
                .forget_through(stored, self.config.events_in_memory);
        }
    }

    /// Assigns the next seq, logs the event, and fans it out.
    fn publish(&mut self, event: ServerEvent) {
        if let Some(observe) = &self.shard.observer {
            observe(&self.id, &event);
        }
        let text = self.log.publish(&self.chat_id_json, &event);
        let seq = self.last_seq();
        self.last_active = std::time::Instant::now();
        if self.persist.is_some() {
            self.persist_event(seq, &event, Arc::clone(&text));
        }
        if let Some(held) = &mut self.held {
            let typed = (!self.watchers.is_empty()).then(|| event.clone());
            let (mut ui_call, mut ends_ui_call) = (None, None);
            match &event {
                ServerEvent::ToolCall(ToolCallEvent::AwaitingUi(call)) => {
                    ui_call = Some(Box::from(call.corr.as_str()));
                }
                ServerEvent::ToolResponse(response) => {
                    ends_ui_call = response.ended_ui_call.as_deref();
                }
                _ => {}
            }
            held.hold(
                HeldEvent {
                    seq,
                    text,
                    typed,
                    ui_call,
                },
                ends_ui_call,
            );
            if matches!(event, ServerEvent::TextDelta { .. }) {
                // A delta under the store's mark waits for no write.
                self.release_durable();
            }
            return;
        }
        self.fan_out(seq, &text, Some(&event));
    }

    /// Sends a logged event to every subscriber (with the rest of its burst) and, when typed,
    /// to every watcher (at once).
    fn fan_out(&mut self, seq: u64, text: &Arc<str>, event: Option<&ServerEvent>) {
        self.subscribers.retain(|s| s.recipient.connected());
        if !self.subscribers.is_empty() {
            for subscriber in &mut self.subscribers {
                subscriber.pending.push(Arc::clone(text));
            }
            self.end_burst_soon();
        }
        if let Some(event) = event
            && !self.watchers.is_empty()
        {
            self.watchers.retain(|(_, w)| w.connected());
            for (_, watcher) in &self.watchers {
                watcher.do_send(Observed(event.clone(), seq));
            }
        }
    }

    /// The UI calls clients may be told are pending: in a cluster, only those whose
    /// announcement is durable (an answer to a call the next owner never saw would be lost).
    fn visible_ui_calls(&self, mut pending: Vec<PendingUiCall>) -> Vec<PendingUiCall> {
        if let Some(held) = &self.held {
            pending.retain(|call| !held.hides_ui_call(&call.corr));
        }
        pending
    }

    /// Resolves once the event with `seq` is durable: at once on a single node; in a cluster
    /// after its flush (an error if the chat stops first).
    fn when_durable(
        &mut self,
        seq: u64,
    ) -> futures::future::BoxFuture<'static, Result<(), EngineError>> {
        match &mut self.held {
            None => Box::pin(std::future::ready(Ok(()))),
            Some(held) => {
                let durable = held.when_durable(seq);
                Box::pin(async move { durable.await.map_err(|_| EngineError::Unavailable) })
            }
        }
    }

    /// Fans out the held events that may be shown now (a cluster's chat, after a flush or
    /// a delta the store's mark covers; see [`WriteBehind::settled_through`]).
    fn release_durable(&mut self) {
        let (Some(held), Some(persist)) = (&mut self.held, &self.persist) else {
            return;
        };
        for event in held.take_durable(persist.settled_through()) {
            self.fan_out(event.seq, &event.text, event.typed.as_ref());
        }
    }

    /// Sends a connection-scoped event (seq 0: not part of the chat log, never replayed) to a
    /// recipient that is not (yet) a subscriber, so nothing of its own is pending.
    fn send_direct(&self, recipient: &Recipient<Deliver>, event: &ServerEvent) {
        recipient.do_send(Deliver::one(envelope_json(0, &self.chat_id_json, event)));
    }

    /// Sends each subscriber the events published since the burst began.
    fn deliver_pending(&mut self) {
        for subscriber in &mut self.subscribers {
            if !subscriber.pending.is_empty() {
                let batch = std::mem::take(&mut subscriber.pending);
                subscriber.recipient.do_send(Deliver(batch));
            }
        }
    }

    /// Makes sure an [`EndOfBurst`] is on its way (before the actor runs, delivers at once).
    fn end_burst_soon(&mut self) {
        if self.burst_end_sent {
            return;
        }
        match &self.own {
            Some(own) => {
                self.burst_end_sent = true;
                own.addr.do_send(EndOfBurst);
            }
            None => self.deliver_pending(),
        }
    }

    /// Room for `n` more messages in the transcript and its ids, with headroom
    /// ([`crate::transcript::reserve_with_headroom`]).
    fn reserve_messages(&mut self, n: usize) {
        self.history.reserve(n);
        crate::transcript::reserve_with_headroom(&mut self.meta, n);
    }

    fn push_message(&mut self, message: Message, message_id: String, hidden: bool) {
        if let Some(persist) = &mut self.persist {
            persist.queue_message(TranscriptRow {
                idx: self.history.len() as u64,
                message: &message,
                message_id: &message_id,
                ui_hidden: hidden,
            });
            self.request_flush();
        }
        self.history.push(message);
        self.meta.push((message_id, hidden));
    }

    /// Queues an event (and its pending-UI bookkeeping) for the store.
    fn persist_event(&mut self, seq: u64, event: &ServerEvent, text: Arc<str>) {
        let Some(persist) = &mut self.persist else {
            return;
        };
        let (chat_id, agent, turn) = (&self.id.chat_id, &self.current_agent, self.turn);
        persist.queue_event(seq, event, text, || turn_key(chat_id, agent, turn));
        self.request_flush();
    }

    fn request_flush(&mut self) {
        if !self.flush_requested && self.own.is_some() {
            self.flush_requested = true;
            self.flush_at_burst_end = true;
            self.end_burst_soon();
        }
    }

    fn tool_ctx(&self, agent: &Arc<str>) -> ToolContext {
        ToolContext {
            chat_id: self.id.chat_id.clone(),
            app_id: self.id.tenant.clone(),
            user_id: self.id.user.clone(),
            workflow_name: Arc::clone(&self.wf.name),
            turn_idempotency_key: Arc::from(turn_key(&self.id.chat_id, agent, self.turn)),
            agent_name: agent.clone(),
            secrets: self.secrets.view(),
        }
    }

    /// The session's own address (made when it started; a handler always runs after that).
    fn own(&mut self, ctx: &Context<Self>) -> &OwnAddress {
        self.own.get_or_insert_with(|| OwnAddress::of(ctx))
    }

    fn start_turn(&mut self, agent: Arc<str>, ctx: &mut Context<Self>) {
        if self.turn >= self.wf.workflow.max_turns {
            self.complete("max_turns", ctx);
            return;
        }
        let Some(plan) = self.wf.agent(&agent).cloned() else {
            self.publish(ServerEvent::error(
                ErrorCode::Internal,
                format!("agent {agent} does not exist"),
                false,
            ));
            self.complete("error", ctx);
            return;
        };
        self.turn += 1;
        self.current_agent = agent.clone();
        self.status = ChatStatus::Running;
        if self.workflow_span.is_disabled() {
            self.workflow_span =
                tessera_telemetry::workflow_span(&self.wf.name, &self.id.chat_id, None);
        }
        self.publish(ServerEvent::RunStart {
            agent: agent.to_string(),
            turn: self.turn,
        });
        let limits = TurnLimits {
            max_tool_steps: self.config.max_tool_steps,
            tool_result_max_chars: self.config.tool_result_max_chars,
            structured_output_corrections: self.config.structured_output_corrections,
            json_mode_corrections: self.config.json_mode_corrections,
            stream: self.config.stream && plan.output.is_none(),
            max_tokens: self.config.max_tokens,
            model_call_deadline: self.config.model_call_deadline,
        };
        let own = self.own(ctx);
        let (publish, report) = (Arc::clone(&own.publish), Arc::clone(&own.report));
        let parts = RunnerParts {
            publish,
            report,
            dedup: Arc::clone(&self.shard.dedup),
            model: self.wf.model.clone(),
            tool_ctx: self.tool_ctx(&agent),
            turn: self.turn,
            workflow_name: Arc::clone(&self.wf.name),
            workflow_span: self.workflow_span.clone(),
            logged_tools: std::mem::take(&mut self.logged_tools),
        };
        tracing::debug!(chat_id = %self.id.chat_id, tenant = %self.id.tenant, turn = self.turn, agent = %agent, "turn started");
        let runner =
            AgentRunner::new(plan, &mut self.history, self.context.get(), limits, parts).start();
        self.runner = Some(runner);
    }

    fn await_user(&mut self) {
        self.workflow_span = tracing::Span::none();
        self.status = ChatStatus::AwaitingUser;
        self.consecutive = 0;
        self.publish(ServerEvent::InputRequest {
            agent: self.current_agent.to_string(),
        });
    }

    fn complete(&mut self, reason: &str, ctx: &mut Context<Self>) {
        self.workflow_span = tracing::Span::none();
        self.status = ChatStatus::Completed(reason.to_owned());
        self.secrets.wipe();
        if let Some(forget) = crate::secrets::forget(self.shard.store.as_ref(), &self.id.chat_id) {
            // A task of its own: it must finish even when the chat leaves memory first.
            actix::spawn(forget);
        }
        self.publish(ServerEvent::RunComplete {
            reason: reason.to_owned(),
            agent: self.current_agent.to_string(),
        });
        self.schedule_retire(ctx);
    }

    fn on_turn_output(&mut self, output: TurnOutput, ctx: &mut Context<Self>) {
        let agent = self.current_agent.clone();
        let hidden = routing::apply_derived(
            &self.wf.workflow,
            &agent,
            &output.final_text,
            &mut self.context,
        );
        let final_id = message_id(&turn_key(&self.id.chat_id, &agent, self.turn));
        let count = output.new_messages.len();
        self.reserve_messages(count);
        for (i, message) in output.new_messages.into_iter().enumerate() {
            let is_final = i + 1 == count;
            let id = if is_final {
                final_id.clone()
            } else {
                ids::join(&[&final_id, "_", ids::digits().format(i)])
            };
            self.push_message(message, id, is_final && hidden);
        }
        let plan = self.wf.agent(&agent).cloned();
        match (output.structured, plan) {
            (Some(data), Some(plan)) => {
                let model_name = plan
                    .output
                    .as_ref()
                    .map(|o| o.model_name.to_string())
                    .unwrap_or_default();
                let tool_ctx = self.tool_ctx(&agent);
                self.publish(ServerEvent::StructuredOutputReady {
                    agent_name: agent.to_string(),
                    model_name,
                    structured_data: data.clone(),
                    auto_tool_mode: plan.auto_tool_mode,
                    turn_idempotency_key: tool_ctx.turn_idempotency_key.to_string(),
                });
                if plan.auto_tool_mode {
                    self.invoke_auto_tool(tool_ctx, data, ctx);
                    return;
                }
                self.publish_text(&final_id, &agent, &output.final_text, hidden);
            }
            _ => self.publish_text(&final_id, &agent, &output.final_text, hidden),
        }
        self.route(ctx);
    }

    fn publish_text(&mut self, message_id: &str, agent: &str, content: &str, hidden: bool) {
        self.publish(ServerEvent::Text {
            message_id: message_id.to_owned(),
            agent: agent.to_owned(),
            role: "assistant".to_owned(),
            content: content.to_owned(),
            ui_hidden: hidden,
        });
    }

    fn invoke_auto_tool(&mut self, tool_ctx: ToolContext, data: Value, ctx: &mut Context<Self>) {
        self.status = ChatStatus::AwaitingTool;
        let request = self.shard.auto_tools.send(InvokeAutoTool {
            workflow: self.wf.clone(),
            tool_ctx,
            structured_data: data,
            publish: ctx.address().recipient(),
            span: tessera_telemetry::auto_tool_span(
                &self.workflow_span,
                &self.current_agent,
                &self.id.chat_id,
            ),
        });
        self.await_auto_tool(
            async move {
                request.await.unwrap_or_else(|_| {
                    AutoToolOutcome::Invalid("the auto-tool handler stopped".into())
                })
            },
            ctx,
        );
    }

    /// Waits for an auto tool's outcome (fresh, or resumed after a restart) and hands it to
    /// [`ChatSession::on_auto_tool`] by message, not mapped in this context: the tool's
    /// `chat.tool_response` is a `Publish` ahead of it in this mailbox, and must be logged
    /// before whatever the outcome leads to.
    fn await_auto_tool(
        &mut self,
        outcome: impl Future<Output = AutoToolOutcome> + 'static,
        ctx: &mut Context<Self>,
    ) {
        let (turn, addr) = (self.turn, Arc::clone(&self.own(ctx).addr));
        actix::spawn(async move {
            let outcome = outcome.await;
            addr.do_send(AutoToolDone { turn, outcome });
        });
    }

    fn on_auto_tool(&mut self, turn: u32, outcome: AutoToolOutcome, ctx: &mut Context<Self>) {
        if turn != self.turn || self.status != ChatStatus::AwaitingTool {
            tracing::debug!(chat_id = %self.id.chat_id, turn, "stale auto-tool outcome ignored");
            return;
        }
        match outcome {
            AutoToolOutcome::Completed {
                tool_name,
                result,
                ui_response,
                secrets,
                ..
            } => {
                let collected = !secrets.is_empty();
                self.secrets.store(secrets);
                if collected
                    && let Some(save) = crate::secrets::save(
                        self.shard.store.as_ref(),
                        self.config.vault_key.as_deref(),
                        &self.id.chat_id,
                        &self.secrets,
                    )
                {
                    // Waited for, so a later `complete` cannot delete before this write.
                    ctx.wait(save.into_actor(self));
                }
                let text = format!("[{tool_name} result] {result}");
                let id = format!("msg_tool_{}", self.turn);
                self.push_message(Message::text(Role::User, text), id, true);
                if let Some(response) = ui_response {
                    routing::apply_ui_response(
                        &self.wf.workflow,
                        &tool_name,
                        &response,
                        &mut self.context,
                    );
                }
                self.route(ctx);
            }
            AutoToolOutcome::Duplicate(crate::dedup::ClaimOutcome::Interrupted) => {
                // Started by a process that died (a crash, or a node whose chat was taken
                // over) before its UI call reached the store: reported, never re-run, as
                // when a restored chat finds it (`restore.rs`).
                tracing::warn!(chat_id = %self.id.chat_id, "auto tool interrupted; not re-run");
                self.publish(ServerEvent::error(
                    ErrorCode::ToolError,
                    "the server restarted while a tool was starting; it was not re-run",
                    true,
                ));
                self.await_user();
            }
            AutoToolOutcome::Duplicate(claim) => {
                tracing::warn!(chat_id = %self.id.chat_id, ?claim, "auto tool already ran for this turn");
                self.route(ctx);
            }
            AutoToolOutcome::NoBinding => {
                self.publish(ServerEvent::error(
                    ErrorCode::ToolError,
                    "the agent has no UI tool bound to its output",
                    true,
                ));
                self.await_user();
            }
            // The chat is leaving memory (see `IdleCheck`); its rebuild waits again.
            AutoToolOutcome::Released => {}
            AutoToolOutcome::Invalid(errors) => {
                self.publish(ServerEvent::error(
                    ErrorCode::StructuredOutputInvalid,
                    errors,
                    true,
                ));
                self.await_user();
            }
        }
    }

    /// Applies what follows the current agent's turn (see [`routing::route`]).
    fn route(&mut self, ctx: &mut Context<Self>) {
        let agent = self.current_agent.clone();
        match routing::route(
            &self.wf.workflow,
            &agent,
            self.context.get(),
            self.consecutive,
        ) {
            Route::Terminate { reason } => {
                self.publish(ServerEvent::Handoff {
                    from: agent.to_string(),
                    to: "terminate".into(),
                    reason,
                });
                self.complete("terminate", ctx);
            }
            Route::User => self.await_user(),
            Route::ReplyLimit { next } => {
                tracing::info!(chat_id = %self.id.chat_id, agent = %next, "max_consecutive_auto_reply reached; asking the user");
                self.await_user();
            }
            Route::Agent {
                next,
                reason,
                in_a_row,
            } => {
                self.consecutive = in_a_row;
                if *next != *agent {
                    self.publish(ServerEvent::Handoff {
                        from: agent.to_string(),
                        to: next.clone(),
                        reason,
                    });
                }
                self.start_turn(Arc::from(next.as_str()), ctx);
            }
        }
    }

    fn refuse_input(&self) -> EngineError {
        match &self.status {
            ChatStatus::Completed(reason) => {
                EngineError::NotAcceptingInput(format!("the chat has ended ({reason})"))
            }
            ChatStatus::Running => {
                EngineError::NotAcceptingInput("an agent is still answering".into())
            }
            ChatStatus::AwaitingTool => {
                EngineError::NotAcceptingInput("answer the open UI tool first".into())
            }
            ChatStatus::AwaitingUser => {
                EngineError::NotAcceptingInput("not accepting input".into())
            }
        }
    }
}

/// The deterministic idempotency key of a chat's agent turn.
pub fn turn_key(chat_id: &str, agent: &str, turn: u32) -> String {
    ids::join(&[
        "turn_",
        chat_id,
        "_",
        agent,
        "_",
        ids::digits().format(turn),
    ])
}

impl Actor for ChatSession {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.shard
            .chats_in_memory
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.own = Some(OwnAddress::of(ctx));
        if self.epoch.is_some() {
            // Before any turn starts, so every tool claim of the chat carries the epoch.
            self.shard.dedup.do_send(crate::dedup::FenceChat {
                chat_id: self.id.chat_id.clone(),
                epoch: self.epoch,
            });
        }
        if self.persist.as_ref().is_some_and(|p| p.has_queued()) {
            self.request_flush();
        }
        if let (Some(idle), Some(_)) = (self.config.idle_evict, &self.persist) {
            ctx.notify_later(IdleCheck, idle);
        }
        if let Some(work) = self.restored.take() {
            self.start_restored(work, ctx);
            return;
        }
        let wf = self.wf.workflow.clone();
        let initial = self.current_agent.clone();
        match wf.startup_mode {
            tessera_manifest::StartupMode::AgentDriven => {
                if let Some(message) = &wf.initial_message {
                    self.push_message(
                        Message::text(Role::User, message.as_str()),
                        "msg_initial".into(),
                        true,
                    );
                }
                self.start_turn(initial, ctx);
            }
            tessera_manifest::StartupMode::UserDriven => {
                if let Some(greeting) = &wf.initial_message {
                    self.push_message(
                        Message::assistant(initial.clone(), greeting.as_str()),
                        "msg_greeting".into(),
                        false,
                    );
                    self.publish_text("msg_greeting", &initial, greeting, false);
                }
                self.await_user();
            }
        }
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        // A burst cut short by the stop (its `EndOfBurst` is never handled).
        self.deliver_pending();
        self.shard
            .chats_in_memory
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if self.epoch.is_some() {
            self.shard.dedup.do_send(crate::dedup::FenceChat {
                chat_id: self.id.chat_id.clone(),
                epoch: None,
            });
        }
        self.secrets.wipe();
    }
}

impl Handler<EndOfBurst> for ChatSession {
    type Result = ();

    fn handle(&mut self, _: EndOfBurst, ctx: &mut Self::Context) {
        self.burst_end_sent = false;
        self.deliver_pending();
        if std::mem::take(&mut self.flush_at_burst_end) {
            self.flush_writes(ctx);
        }
    }
}

impl Handler<FlushWrites> for ChatSession {
    type Result = ();

    fn handle(&mut self, _: FlushWrites, ctx: &mut Self::Context) {
        self.flush_writes(ctx);
    }
}

impl ChatSession {
    /// Hands the store what the write-behind queue holds (one flush at a time).
    fn flush_writes(&mut self, ctx: &mut Context<Self>) {
        self.flush_requested = false;
        // The state goes with each flush, built once here rather than on every event.
        if let Some(persist) = self.persist.as_mut() {
            persist.queue_state(StateRow {
                status: &self.status,
                current_agent: &self.current_agent,
                turn: self.turn,
                consecutive: self.consecutive,
                context: self.context.shared(),
                context_changes: self.context.changes(),
            });
        }
        // The store reports the outcome by message, not through a future of this context:
        // `ctx.wait` (e.g. for the vault write) pauses the context's futures, and a paused
        // flush holding the store's writer connection would deadlock it.
        let addr = Arc::clone(&self.own(ctx).addr);
        let started = self.persist.as_mut().is_some_and(|persist| {
            persist.start_flush(move |outcome| addr.do_send(FlushDone(outcome)))
        });
        if !started {
            // Nothing to write (or a flush still running, whose end answers them).
            self.answer_stored_waiters();
        }
    }
}

/// A flush finished.
#[derive(Message)]
#[rtype(result = "()")]
struct FlushDone(FlushOutcome);

impl Handler<FlushDone> for ChatSession {
    type Result = ();

    fn handle(&mut self, FlushDone(outcome): FlushDone, ctx: &mut Self::Context) {
        if outcome == FlushOutcome::Fenced {
            // Another node owns the chat: nothing more of ours may reach the store.
            ctx.notify(Relinquish);
            return;
        }
        if outcome == FlushOutcome::Dropped && self.held.is_some() {
            // In a cluster the store is the chat: events it refused for good must never be
            // shown, and the log behind them would differ from the store's. The chat leaves
            // this node and is rebuilt from the store (the orphan scan).
            ctx.notify(Relinquish);
            return;
        }
        let next = self.persist.as_mut().map(|p| p.flush_done(outcome));
        self.release_durable();
        self.forget_stored_events();
        match next {
            Some(NextFlush::Now) => self.request_flush(),
            Some(NextFlush::After(delay)) => {
                // Marked requested so new events do not retry before the back-off is over.
                self.flush_requested = true;
                self.flush_at_burst_end = false;
                ctx.notify_later(FlushWrites, delay);
            }
            Some(NextFlush::Idle) | None => self.answer_stored_waiters(),
        }
    }
}

impl ChatSession {
    /// Every write queued so far is in the store (none queued, none in flight or due).
    fn all_stored(&self) -> bool {
        !self.flush_requested && self.persist.as_ref().is_none_or(WriteBehind::is_idle)
    }

    /// Answers the [`WhenStored`] waiters if every queued write is stored.
    fn answer_stored_waiters(&mut self) {
        if self.all_stored() {
            for waiter in self.stored_waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
    }
}

impl Handler<WhenStored> for ChatSession {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: WhenStored, _ctx: &mut Self::Context) -> Self::Result {
        if self.all_stored() {
            return Box::pin(std::future::ready(()));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.stored_waiters.push(tx);
        if !self.flush_requested && self.persist.as_ref().is_some_and(WriteBehind::has_queued) {
            self.request_flush();
        }
        Box::pin(async move {
            // A chat that stops first drops the sender: nothing more will be stored anyway.
            let _ = rx.await;
        })
    }
}

/// An auto tool's outcome (see [`ChatSession::await_auto_tool`]).
#[derive(Message)]
#[rtype(result = "()")]
struct AutoToolDone {
    turn: u32,
    outcome: AutoToolOutcome,
}

impl Handler<AutoToolDone> for ChatSession {
    type Result = ();

    fn handle(&mut self, done: AutoToolDone, ctx: &mut Self::Context) {
        self.on_auto_tool(done.turn, done.outcome, ctx);
    }
}

/// How often a completed chat checks whether it may leave memory.
const RETIRE_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// A completed chat leaves memory once nobody is subscribed and the store holds all of it:
/// the server rebuilds it from the store when its owner asks again (as after a restart), so
/// a long-running server does not keep every chat it ever ran. Checked every
/// [`RETIRE_CHECK`] while the chat is completed.
#[derive(Message)]
#[rtype(result = "()")]
struct Retire;

impl ChatSession {
    /// Starts the [`Retire`] checks of a completed chat.
    fn schedule_retire(&self, ctx: &mut Context<Self>) {
        ctx.notify_later(Retire, RETIRE_CHECK);
    }
}

impl Handler<Retire> for ChatSession {
    type Result = ();

    fn handle(&mut self, _: Retire, ctx: &mut Self::Context) {
        // Without a store the chat could not be rebuilt: it stays.
        let Some(persist) = &self.persist else {
            return;
        };
        if !matches!(self.status, ChatStatus::Completed(_)) {
            return;
        }
        if self.unobserved_and_stored(persist.is_idle(), None) {
            tracing::debug!(chat_id = %self.id.chat_id, "completed chat leaves memory");
            ctx.stop();
        } else {
            ctx.notify_later(Retire, RETIRE_CHECK);
        }
    }
}

impl ChatSession {
    /// Nobody is subscribed (but for subscriber `but_for`) or watching and every write is
    /// stored (`stored`: the write-behind queue is idle): the store alone can rebuild the chat.
    fn unobserved_and_stored(&mut self, stored: bool, but_for: Option<u64>) -> bool {
        self.subscribers.retain(|s| s.recipient.connected());
        self.watchers.retain(|(_, w)| w.connected());
        self.subscribers.iter().all(|s| Some(s.id) == but_for)
            && self.watchers.is_empty()
            && stored
            && !self.flush_requested
    }
}

/// Is this open chat idle enough to leave memory? It leaves when it has been idle (no event,
/// subscription change or read) for the engine's `idle_evict`, nobody is subscribed or
/// watching, its writes are all stored, and it waits only on someone outside the process:
/// the user (`AwaitingUser`), or a UI call without a timeout (`AwaitingTool`; a timed wait
/// needs this process to end it on time, so the chat stays until it does). A running turn
/// keeps it. The server rebuilds it from the store on the next lookup, as after a restart.
#[derive(Message)]
#[rtype(result = "()")]
struct IdleCheck;

impl ChatSession {
    /// The idle time left before the chat may leave memory (`None`: it is due).
    fn idle_left(&self, idle: std::time::Duration) -> Option<std::time::Duration> {
        idle.checked_sub(self.last_active.elapsed())
            .filter(|left| !left.is_zero())
    }

    /// Leaves memory; a UI wait is released (not ended) first.
    fn evict(&mut self, ctx: &mut Context<Self>) {
        tracing::debug!(chat_id = %self.id.chat_id, tenant = %self.id.tenant, status = self.status.as_str(), "idle open chat leaves memory");
        if self.status == ChatStatus::AwaitingTool {
            self.shard.correlator.do_send(ReleaseUiCalls {
                chat_id: self.id.chat_id.clone(),
            });
        }
        ctx.stop();
    }
}

/// Whether an open chat leaves memory now (see [`ChatSession::leave_if_only_outside_waits`]).
enum Leaving {
    /// Decided: it left (`true`) or stays.
    Decided(bool),
    /// It waits on UI calls: it leaves once they are known to have no timeout and nothing
    /// changed meanwhile; the future says whether it left.
    AfterUiCheck(std::pin::Pin<Box<dyn ActorFuture<ChatSession, Output = bool>>>),
}

impl ChatSession {
    /// Leaves memory if nobody here is subscribed (but for subscriber `but_for`) or watching,
    /// every write is stored and the chat waits only on someone outside the process (see
    /// [`IdleCheck`]); the caller has checked the idle time, if it asks for one.
    fn leave_if_only_outside_waits(
        &mut self,
        but_for: Option<u64>,
        ctx: &mut Context<Self>,
    ) -> Leaving {
        let Some(persist) = &self.persist else {
            return Leaving::Decided(false);
        };
        let stored = persist.is_idle();
        let may_leave = self.unobserved_and_stored(stored, but_for);
        match self.status {
            ChatStatus::AwaitingUser if may_leave => {
                self.evict(ctx);
                Leaving::Decided(true)
            }
            ChatStatus::AwaitingTool if may_leave => {
                let pending = self.shard.correlator.send(ListPendingUiCalls {
                    chat_id: self.id.chat_id.clone(),
                });
                let checked_at = self.last_active;
                Leaving::AfterUiCheck(Box::pin(pending.into_actor(self).map(
                    move |pending, act, ctx| {
                        let untimed = pending.as_ref().is_ok_and(|calls| {
                            !calls.is_empty() && calls.iter().all(|c| c.timeout_s.is_none())
                        });
                        let still_idle = act.last_active == checked_at
                            && act.status == ChatStatus::AwaitingTool
                            && act.persist.as_ref().is_some_and(WriteBehind::is_idle)
                            && act.unobserved_and_stored(true, but_for);
                        if untimed && still_idle {
                            act.evict(ctx);
                        }
                        untimed && still_idle
                    },
                )))
            }
            _ => Leaving::Decided(false),
        }
    }
}

impl Handler<IdleCheck> for ChatSession {
    type Result = ();

    fn handle(&mut self, _: IdleCheck, ctx: &mut Self::Context) {
        let (Some(idle), Some(_)) = (self.config.idle_evict, &self.persist) else {
            return;
        };
        if let Some(left) = self.idle_left(idle) {
            ctx.notify_later(IdleCheck, left);
            return;
        }
        // Completed chats retire on their own (see `Retire`).
        if matches!(self.status, ChatStatus::Completed(_)) {
            return;
        }
        match self.leave_if_only_outside_waits(None, ctx) {
            Leaving::Decided(true) => {}
            Leaving::Decided(false) => {
                ctx.notify_later(IdleCheck, idle);
            }
            Leaving::AfterUiCheck(check) => ctx.wait(check.map(move |left, _, ctx| {
                if !left {
                    ctx.notify_later(IdleCheck, idle);
                }
            })),
        }
    }
}

impl Handler<LeaveForAnotherNode> for ChatSession {
    type Result = ActorResponse<Self, bool>;

    fn handle(&mut self, msg: LeaveForAnotherNode, ctx: &mut Self::Context) -> Self::Result {
        match self.leave_if_only_outside_waits(msg.but_for, ctx) {
            Leaving::Decided(left) => ActorResponse::reply(left),
            // Answered in the same poll that stops the actor, before its context goes.
            Leaving::AfterUiCheck(check) => ActorResponse::r#async(check),
        }
    }
}

impl Handler<Publish> for ChatSession {
    type Result = ();

    fn handle(&mut self, Publish(event): Publish, _ctx: &mut Self::Context) {
        self.publish(event);
    }
}

impl Handler<Subscribe> for ChatSession {
    type Result = ResponseActFuture<Self, u64>;

    fn handle(&mut self, msg: Subscribe, _ctx: &mut Self::Context) -> Self::Result {
        self.subscribe(msg.recipient, msg.after_seq, true)
    }
}

impl Handler<SubscribeQuietly> for ChatSession {
    type Result = ResponseActFuture<Self, u64>;

    fn handle(&mut self, msg: SubscribeQuietly, _ctx: &mut Self::Context) -> Self::Result {
        self.subscribe(msg.recipient, msg.after_seq, false)
    }
}

impl ChatSession {
    /// Attaches `recipient` after `after_seq`; with `greet`, its replay opens with
    /// `chat.session` and ends with `chat.resume_boundary`.
    fn subscribe(
        &mut self,
        recipient: Recipient<Deliver>,
        after_seq: u64,
        greet: bool,
    ) -> ResponseActFuture<Self, u64> {
        self.last_active = std::time::Instant::now();
        let id = self.next_subscriber;
        self.next_subscriber += 1;
        let pending = self.shard.correlator.send(ListPendingUiCalls {
            chat_id: self.id.chat_id.clone(),
        });
        Box::pin(
            pending
                .into_actor(self)
                .then(move |pending, act, _ctx| {
                    let from = after_seq.min(act.visible_seq());
                    let older = act.read_forgotten_events(from, u32::MAX);
                    async move {
                        let older = match older {
                            Some((upto, read)) => Some((upto, read.await)),
                            None => None,
                        };
                        (pending, from, older)
                    }
                    .into_actor(act)
                })
                .map(move |(pending, from, older), act, _ctx| {
                    let pending = act.visible_ui_calls(pending.unwrap_or_default());
                    if greet {
                        act.send_direct(&recipient, &act.session_event(pending.clone()));
                    }
                    // In a cluster, up to the last durable event: the held ones follow live.
                    let visible = act.visible_seq();
                    let (replay, from_seq) = act.resume_replay(from, visible, older, &recipient);
                    let replayed = replay.len() as u64;
                    if !replay.is_empty() {
                        recipient.do_send(Deliver(replay));
                    }
                    if greet {
                        act.send_direct(
                            &recipient,
                            &ServerEvent::ResumeBoundary {
                                from_seq,
                                last_seq: visible,
                                replayed,
                                pending_ui_calls: pending,
                            },
                        );
                    }
                    act.subscribers.push(Subscriber {
                        id,
                        recipient,
                        pending: Vec::new(),
                    });
                    id
                }),
        )
    }
}

impl ChatSession {
    /// The replay of a resume from seq `from` up to `visible`, and the seq it starts after:
    /// the store's part (`older`, when one was read) then memory's. Without the store's part
    /// it is memory's alone, from where memory starts; a failed read is logged and reported to
    /// `recipient`, and the boundary never claims more than was replayed.
    fn resume_replay(
        &mut self,
        from: u64,
        visible: u64,
        older: Option<(u64, Result<Vec<StoredEvent>, tessera_store::StoreError>)>,
        recipient: &Recipient<Deliver>,
    ) -> (Vec<Arc<str>>, u64) {
        if older.is_some() {
            self.store_replays -= 1;
        }
        match older {
            Some((upto, Ok(events))) => {
                (self.replay_with_stored(from, upto, visible, &events), from)
            }
            failed => {
                if let Some((_, Err(error))) = failed {
                    tracing::warn!(chat_id = %self.id.chat_id, tenant = %self.id.tenant, %error, "reading older events for a resume failed; replaying those in memory");
                    self.send_direct(
                        recipient,
                        &ServerEvent::error(
                            ErrorCode::Internal,
                            "the chat's earlier events could not be read; resume again to get them",
                            true,
                        ),
                    );
                }
                let from = from.max(self.log.forgotten());
                let replay = self
                    .log
                    .replay_until(from, visible, &self.chat_id_json)
                    .collect();
                (replay, from)
            }
        }
    }

    /// The `chat.session` event that opens a subscriber's replay.
    fn session_event(&self, pending_ui_calls: Vec<PendingUiCall>) -> ServerEvent {
        ServerEvent::Session {
            workflow: self.wf.workflow.name.clone(),
            status: self.status.as_str().to_owned(),
            current_agent: self.current_agent.to_string(),
            last_seq: self.visible_seq(),
            pending_ui_calls,
            model: self.wf.model.label().to_owned(),
            demo: self.wf.model.is_demo(),
        }
    }

    /// The replay after seq `from` up to `visible`: `events`, read from the store up to `upto`,
    /// then memory's.
    fn replay_with_stored(
        &self,
        from: u64,
        upto: u64,
        visible: u64,
        events: &[StoredEvent],
    ) -> Vec<Arc<str>> {
        let later: Vec<Arc<str>> = self
            .log
            .replay_until(upto, visible, &self.chat_id_json)
            .collect();
        let mut replay = stored_replay(events, from, upto, &later, &self.chat_id_json);
        replay.extend(later);
        replay
    }

    /// When a resume from seq `from` needs events that left memory: the seq the store's part
    /// of the replay goes up to (what the store holds, at most what clients may see), and the
    /// read of those events. Memory keeps what it holds until the read is done, so the two
    /// parts meet.
    /// At most `max` events are read.
    fn read_forgotten_events(
        &mut self,
        from: u64,
        max: u32,
    ) -> Option<(u64, tessera_store::StoreFuture<Vec<StoredEvent>>)> {
        if from >= self.log.forgotten() {
            return None;
        }
        let store = self.shard.store.as_ref()?;
        // The store holds every forgotten event, and past them all it is known to hold (none
        // more once a batch was dropped and its log has a gap).
        let stored = self
            .persist
            .as_ref()
            .and_then(WriteBehind::log_stored_through)
            .unwrap_or(0)
            .max(self.log.forgotten());
        let upto = stored.min(self.visible_seq());
        let limit = u32::try_from(upto.saturating_sub(from))
            .unwrap_or(u32::MAX)
            .min(max);
        self.store_replays += 1;
        Some((upto, store.events_after(&self.id.chat_id, from, limit)))
    }
}

/// The replay of the stored events after seq `from` up to seq `upto`, as memory would give it:
/// deltas of a message whose final text is among them, or among the `later` events that follow
/// them in the replay, are left out.
fn stored_replay(
    events: &[StoredEvent],
    from: u64,
    upto: u64,
    later: &[Arc<str>],
    chat_id: &ChatIdJson,
) -> Vec<Arc<str>> {
    let mut log = EventLog::after(from);
    for event in events.iter().filter(|e| e.seq > from && e.seq <= upto) {
        log.push_stored(event.seq, &event.json);
    }
    for text in later {
        log.finalized_later(text);
    }
    log.replay_until(from, upto, chat_id).collect()
}

impl Handler<ReplayEvents> for ChatSession {
    type Result = ResponseActFuture<Self, Result<Replayed, EngineError>>;

    fn handle(&mut self, msg: ReplayEvents, _ctx: &mut Self::Context) -> Self::Result {
        let pending = msg.with_session.then(|| {
            self.shard.correlator.send(ListPendingUiCalls {
                chat_id: self.id.chat_id.clone(),
            })
        });
        let from = msg.after_seq.min(self.visible_seq());
        // No more of the store than a page holds: a long chat replayed page by page would
        // otherwise read its whole rest for every page.
        let max_read = u32::try_from(msg.max_events).unwrap_or(u32::MAX);
        let older = self.read_forgotten_events(from, max_read);
        let read = async move {
            let pending = match pending {
                Some(pending) => Some(pending.await.unwrap_or_default()),
                None => None,
            };
            let older = match older {
                Some((upto, read)) => Some((upto, read.await)),
                None => None,
            };
            (pending, older)
        };
        Box::pin(
            read.into_actor(self)
                .map(move |(pending, older), act, _ctx| {
                    if older.is_some() {
                        act.store_replays -= 1;
                    }
                    let session = pending.map(|pending| {
                        let event = act.session_event(act.visible_ui_calls(pending));
                        envelope_json(0, &act.chat_id_json, &event)
                    });
                    let mut visible = act.visible_seq();
                    let mut events = match older {
                        // The read stopped at the page's size: the page ends with it.
                        Some((_, Ok(events))) if events.len() >= msg.max_events => {
                            visible = events.last().map_or(from, |e| e.seq);
                            stored_replay(&events, from, visible, &[], &act.chat_id_json)
                        }
                        Some((upto, Ok(events))) => {
                            act.replay_with_stored(from, upto, visible, &events)
                        }
                        Some((_, Err(e))) => return Err(store_error(e)),
                        None => act
                            .log
                            .replay_until(from.max(act.log.forgotten()), visible, &act.chat_id_json)
                            .collect(),
                    };
                    let mut bytes = 0;
                    let fits = events
                        .iter()
                        .take(msg.max_events)
                        .take_while(|text| {
                            bytes += text.len();
                            bytes <= msg.max_bytes
                        })
                        .count();
                    let more = events.len() > fits || visible < act.visible_seq();
                    let through = match events.get(fits) {
                        // An event too big for any answer ends the page before it (the
                        // asker reads it from the store: only deltas are in none, and a
                        // delta is small).
                        Some(next) => envelope_seq(next.as_bytes()).saturating_sub(1),
                        None => visible,
                    };
                    events.truncate(fits);
                    Ok(Replayed {
                        session,
                        events,
                        through,
                        more,
                    })
                }),
        )
    }
}

impl Handler<Watch> for ChatSession {
    type Result = u64;

    fn handle(&mut self, Watch(recipient): Watch, _ctx: &mut Self::Context) -> u64 {
        self.last_active = std::time::Instant::now();
        let id = self.next_subscriber;
        self.next_subscriber += 1;
        self.watchers.push((id, recipient));
        id
    }
}

impl Handler<Unsubscribe> for ChatSession {
    type Result = ();

    fn handle(&mut self, Unsubscribe(id): Unsubscribe, _ctx: &mut Self::Context) {
        self.last_active = std::time::Instant::now();
        // What the leaving subscriber was due before it left, as if sent at once.
        self.deliver_pending();
        self.subscribers
            .retain(|s| s.id != id && s.recipient.connected());
        self.watchers.retain(|(w, r)| *w != id && r.connected());
        if self.subscribers.is_empty() {
            self.shard.correlator.do_send(ChatDisconnected {
                chat_id: self.id.chat_id.clone(),
            });
        }
    }
}

impl Handler<UserInput> for ChatSession {
    /// Accepted input is acknowledged once the user's message is durable (see
    /// [`ChatSession::when_durable`]).
    type Result = ResponseFuture<Result<(), EngineError>>;

    fn handle(&mut self, msg: UserInput, ctx: &mut Self::Context) -> Self::Result {
        match self.take_input(msg, ctx) {
            Ok(seq) => self.when_durable(seq),
            Err(refused) => Box::pin(std::future::ready(Err(refused))),
        }
    }
}

impl ChatSession {
    /// Logs the user's message and starts the agent's turn; returns the message's seq.
    fn take_input(&mut self, msg: UserInput, ctx: &mut Context<Self>) -> Result<u64, EngineError> {
        if self.status != ChatStatus::AwaitingUser {
            return Err(self.refuse_input());
        }
        let id = ids::join(&["msg_user_", ids::digits().format(self.history.len())]);
        self.publish(ServerEvent::Text {
            message_id: id.clone(),
            agent: "user".into(),
            role: "user".into(),
            content: msg.content.clone(),
            ui_hidden: false,
        });
        let seq = self.last_seq();
        self.reserve_messages(1);
        self.push_message(Message::text(Role::User, msg.content), id, false);
        self.consecutive = 1;
        let agent = self.current_agent.clone();
        self.start_turn(agent, ctx);
        Ok(seq)
    }
}

impl Handler<TracedInput> for ChatSession {
    type Result = ResponseFuture<Result<(), EngineError>>;

    fn handle(&mut self, msg: TracedInput, ctx: &mut Self::Context) -> Self::Result {
        if self.status != ChatStatus::AwaitingUser {
            return Box::pin(std::future::ready(Err(self.refuse_input())));
        }
        self.workflow_span =
            tessera_telemetry::workflow_span(&self.wf.name, &self.id.chat_id, Some(&msg.parent));
        <Self as Handler<UserInput>>::handle(self, msg.input, ctx)
    }
}

impl Handler<ToolAnswer> for ChatSession {
    /// In a cluster, an accepted answer is acknowledged once the `chat.tool_response` that
    /// ends its call is durable: an acknowledged answer is never lost to a failover.
    type Result = ResponseFuture<Result<(), EngineError>>;

    fn handle(&mut self, msg: ToolAnswer, _ctx: &mut Self::Context) -> Self::Result {
        // Asked before resolving: the call's end may be logged before the reply comes back.
        let durable = self
            .held
            .as_mut()
            .map(|held| held.when_ui_answer_durable(&msg.corr));
        let resolve = self.shard.correlator.send(ResolveUiCall {
            chat_id: self.id.chat_id.clone(),
            corr: msg.corr,
            response: msg.response,
        });
        Box::pin(async move {
            match resolve.await {
                Ok(Ok(())) => match durable {
                    Some(durable) => durable.await.map_err(|_| EngineError::Unavailable),
                    None => Ok(()),
                },
                Ok(Err(CorrelationError::InvalidResponse(why))) => {
                    Err(EngineError::InvalidToolResponse(why))
                }
                Ok(Err(err)) => Err(EngineError::Correlation(err)),
                Err(_) => Err(EngineError::Unavailable),
            }
        })
    }
}

impl Handler<StopChat> for ChatSession {
    type Result = ();

    fn handle(&mut self, _: StopChat, ctx: &mut Self::Context) {
        if let Some(runner) = self.runner.take() {
            runner.do_send(CancelTurn);
        }
        self.shard.correlator.do_send(CancelUiCalls {
            chat_id: self.id.chat_id.clone(),
        });
        // Queued writes would only be refused: the store row is about to go.
        self.persist = None;
        ctx.stop();
    }
}

impl Handler<CancelRun> for ChatSession {
    type Result = ();

    fn handle(&mut self, _: CancelRun, _ctx: &mut Self::Context) {
        match self.status {
            ChatStatus::Running => {
                if let Some(runner) = &self.runner {
                    runner.do_send(CancelTurn);
                }
            }
            ChatStatus::AwaitingTool => {
                self.shard.correlator.do_send(CancelUiCalls {
                    chat_id: self.id.chat_id.clone(),
                });
                // The auto tool's late outcome is ignored: the turn is over.
                self.status = ChatStatus::AwaitingUser;
                self.publish(ServerEvent::RunComplete {
                    reason: "cancelled".into(),
                    agent: self.current_agent.to_string(),
                });
                self.await_user();
            }
            ChatStatus::AwaitingUser | ChatStatus::Completed(_) => {}
        }
    }
}

impl Handler<Relinquish> for ChatSession {
    type Result = ();

    fn handle(&mut self, _: Relinquish, ctx: &mut Self::Context) {
        tracing::warn!(chat_id = %self.id.chat_id, turn = self.turn, "chat relinquished: another node owns it now");
        // First, so nothing below can queue a write.
        self.persist = None;
        if let Some(runner) = self.runner.take() {
            runner.do_send(CancelTurn);
        }
        self.shard.correlator.do_send(CancelUiCalls {
            chat_id: self.id.chat_id.clone(),
        });
        // Published (durable, in a cluster) before the move: the subscribers get it here.
        self.deliver_pending();
        self.subscribers.clear();
        self.watchers.clear();
        ctx.stop();
    }
}

impl Handler<TurnFinished> for ChatSession {
    type Result = ();

    fn handle(&mut self, msg: TurnFinished, ctx: &mut Self::Context) {
        if msg.turn != self.turn || self.status != ChatStatus::Running {
            return;
        }
        self.runner = None;
        match msg.result {
            Ok(output) => self.on_turn_output(output, ctx),
            Err(failure) => {
                for (i, message) in msg.partial.into_iter().enumerate() {
                    self.push_message(message, format!("msg_partial_{}_{i}", self.turn), true);
                }
                let (code, reason) = match &failure {
                    TurnFailure::Cancelled => (None, "cancelled"),
                    TurnFailure::Model { .. } => (Some(ErrorCode::LlmError), "error"),
                    TurnFailure::StructuredOutputInvalid { .. } => {
                        (Some(ErrorCode::StructuredOutputInvalid), "error")
                    }
                    TurnFailure::InvalidToolJson { .. } | TurnFailure::ToolStepsExhausted(_) => {
                        (Some(ErrorCode::ToolError), "error")
                    }
                };
                if let TurnFailure::StructuredOutputInvalid { .. } = failure {
                    // Register the turn so no replay of it runs its tool (no loop).
                    let turn = turn_key(&self.id.chat_id, &self.current_agent, self.turn);
                    let key = ToolKey::new(self.id.chat_id.clone(), turn);
                    self.shard.dedup.do_send(CompleteKey::new(key));
                }
                match code {
                    Some(code) => self.publish(ServerEvent::error(code, failure.to_string(), true)),
                    None => self.publish(ServerEvent::RunComplete {
                        reason: reason.into(),
                        agent: self.current_agent.to_string(),
                    }),
                }
                self.await_user();
            }
        }
    }
}

impl Handler<GetSnapshot> for ChatSession {
    type Result = ResponseActFuture<Self, ChatSnapshot>;

    fn handle(&mut self, _: GetSnapshot, _ctx: &mut Self::Context) -> Self::Result {
        self.last_active = std::time::Instant::now();
        let pending = self.shard.correlator.send(ListPendingUiCalls {
            chat_id: self.id.chat_id.clone(),
        });
        Box::pin(pending.into_actor(self).map(|pending, act, _| {
            let visible: Map<String, Value> = act
                .context
                .get()
                .iter()
                .filter(|(k, _)| routing::client_visible(&act.wf.workflow, k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let transcript = act
                .history
                .messages()
                .iter()
                .zip(&act.meta)
                .filter(|(m, _)| {
                    matches!(m.role, Role::User | Role::Assistant) && m.tool_calls.is_empty()
                })
                .map(|(m, (id, hidden))| TranscriptEntry {
                    message_id: id.clone(),
                    role: if m.role == Role::User {
                        "user"
                    } else {
                        "assistant"
                    },
                    agent: m.name.as_deref().map(str::to_owned),
                    content: m.content_str().to_owned(),
                    ui_hidden: *hidden,
                })
                .collect();
            ChatSnapshot {
                chat_id: act.id.chat_id.clone(),
                workflow: act.wf.workflow.name.clone(),
                status: act.status.clone(),
                current_agent: act.current_agent.clone(),
                turn: act.turn,
                last_seq: act.visible_seq(),
                logged_seq: act.last_seq(),
                persisted_seq: act.persist.as_ref().map(WriteBehind::persisted_seq),
                visible_context: visible,
                pending_ui_calls: act.visible_ui_calls(pending.unwrap_or_default()),
                transcript,
            }
        }))
    }
}

impl Handler<GetContext> for ChatSession {
    type Result = MessageResult<GetContext>;

    fn handle(&mut self, _: GetContext, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.context.get().clone())
    }
}
