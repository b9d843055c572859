//! `UiCorrelator`: the spec's `use_ui_tool` plus the transport's pending futures, as an actor.
//!
//! A UI call is registered under an unguessable correlation id (`corr`), announced to the
//! browser with `chat.tool_call` (`awaiting_response: true`), and ended by exactly one of: the
//! matching answer, its timeout, a cancel, or (by policy) a disconnect. An answer for an
//! unknown or already-resolved corr, or one arriving on another chat, changes nothing.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use lru::LruCache;
use serde_json::Value;
use tessera_protocol::{PendingUiCall, ServerEvent, ToolCallEvent};
use tokio::sync::oneshot;

use crate::config::DisconnectPolicy;
use crate::events::Publish;

/// How a UI wait ended.
#[derive(Debug, Clone, PartialEq)]
pub enum UiOutcome {
    /// The browser answered (the response object, contract-checked).
    Answered(Value),
    /// Nobody answered in time.
    TimedOut(Duration),
    /// The chat cancelled the call.
    Cancelled,
    /// The client went away and the policy says fail.
    Disconnected,
    /// The chat left memory while waiting (see [`ReleaseUiCalls`]): the call is not over; the
    /// store keeps it, and the rebuilt chat waits for it again under the same corr.
    Released,
}

impl UiOutcome {
    /// A short stable name of how the wait ended (no content), for traces.
    pub fn kind(&self) -> &'static str {
        match self {
            UiOutcome::Answered(_) => "answered",
            UiOutcome::TimedOut(_) => "timed_out",
            UiOutcome::Cancelled => "cancelled",
            UiOutcome::Disconnected => "disconnected",
            UiOutcome::Released => "released",
        }
    }
}

/// Why an answer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CorrelationError {
    #[error("no UI call is waiting under this correlation id")]
    Unknown,
    #[error("this UI call was already answered")]
    AlreadyResolved,
    /// Reported to the client exactly like `Unknown`, so ids of other chats cannot be probed.
    #[error("no UI call is waiting under this correlation id")]
    ForeignChat,
    #[error("invalid tool response: {0}")]
    InvalidResponse(String),
}

/// Register a UI call and wait for its end. Resolves when the call ends.
#[derive(Message)]
#[rtype(result = "UiOutcome")]
pub struct AwaitUiResponse {
    pub chat_id: Arc<str>,
    pub call: PendingUiCall,
    pub timeout: Option<Duration>,
    /// Where `chat.tool_call` is published (the chat's session).
    pub publish: Recipient<Publish>,
    /// Publish the `chat.tool_call` (false when resuming a call already in the log).
    pub announce: bool,
}

/// A browser's answer to `corr`, received on chat `chat_id`.
#[derive(Message)]
#[rtype(result = "Result<(), CorrelationError>")]
pub struct ResolveUiCall {
    pub chat_id: Arc<str>,
    pub corr: String,
    pub response: Value,
}

/// End every pending call of a chat with `Cancelled`.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct CancelUiCalls {
    pub chat_id: Arc<str>,
}

/// The chat leaves memory: forget its pending calls without ending them (no answer, no
/// timeout, not remembered as resolved). Their waiters get [`UiOutcome::Released`].
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ReleaseUiCalls {
    pub chat_id: Arc<str>,
}

/// The chat's last client went away.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ChatDisconnected {
    pub chat_id: Arc<str>,
}

/// The pending UI calls of a chat, oldest first.
#[derive(Message)]
#[rtype(result = "Vec<PendingUiCall>")]
pub struct ListPendingUiCalls {
    pub chat_id: Arc<str>,
}

struct Pending {
    chat_id: Arc<str>,
    call: PendingUiCall,
    reply: oneshot::Sender<UiOutcome>,
    /// The timeout, a task of its own that sends [`UiCallTimedOut`] (not a future of this
    /// actor's context: actix polls every such future on each wake-up of the context, so
    /// one timer per waiting chat made every message cost more as chats were added).
    timer: Option<tokio::task::JoinHandle<()>>,
    order: u64,
}

/// The timeout of the UI call `corr` (registered as number `order`) ran out.
#[derive(Message)]
#[rtype(result = "()")]
struct UiCallTimedOut {
    corr: String,
    order: u64,
    after: Duration,
}

/// Owns every UI wait of the chats on its arbiter.
pub struct UiCorrelator {
    pending: HashMap<String, Pending>,
    /// Recently resolved ids, to tell "already answered" from "never existed".
    resolved: LruCache<String, Arc<str>>,
    policy: DisconnectPolicy,
    counter: u64,
}

impl UiCorrelator {
    /// A correlator with the given disconnect policy.
    pub fn new(policy: DisconnectPolicy) -> Self {
        let capacity = NonZeroUsize::new(4096).unwrap_or(NonZeroUsize::MIN);
        Self {
            pending: HashMap::new(),
            resolved: LruCache::new(capacity),
            policy,
            counter: 0,
        }
    }

    /// A fresh, unguessable correlation id (122 random bits).
    pub fn new_corr() -> String {
        format!("ui_{}", uuid::Uuid::new_v4().simple())
    }

    fn finish(&mut self, corr: &str, outcome: UiOutcome) -> bool {
        let Some(pending) = self.pending.remove(corr) else {
            return false;
        };
        if let Some(timer) = pending.timer {
            timer.abort();
        }
        self.resolved.put(corr.to_owned(), pending.chat_id);
        // The waiter may be gone (its turn was cancelled); nothing else to do then.
        let _ = pending.reply.send(outcome);
        true
    }

    fn corrs_of(&self, chat_id: &str) -> Vec<String> {
        let mut corrs: Vec<(u64, &String)> = self
            .pending
            .iter()
            .filter(|(_, p)| &*p.chat_id == chat_id)
            .map(|(c, p)| (p.order, c))
            .collect();
        corrs.sort_unstable();
        corrs.into_iter().map(|(_, c)| c.clone()).collect()
    }
}

impl Actor for UiCorrelator {
    type Context = Context<Self>;
}

/// The `chat.tool_call` a browser renders (UI form, `ui_tool_pipeline.md` phase 3).
pub fn ui_tool_call_event(call: &PendingUiCall) -> ServerEvent {
    ServerEvent::ToolCall(ToolCallEvent::AwaitingUi(call.clone()))
}

impl Handler<AwaitUiResponse> for UiCorrelator {
    type Result = ResponseFuture<UiOutcome>;

    fn handle(&mut self, msg: AwaitUiResponse, ctx: &mut Self::Context) -> Self::Result {
        let (reply, wait) = oneshot::channel();
        let corr = msg.call.corr.clone();
        self.counter += 1;
        let order = self.counter;
        let timer = msg.timeout.map(|after| {
            let (corr, me) = (corr.clone(), ctx.address());
            actix::spawn(async move {
                tokio::time::sleep(after).await;
                me.do_send(UiCallTimedOut { corr, order, after });
            })
        });
        if msg.announce {
            msg.publish.do_send(Publish(ui_tool_call_event(&msg.call)));
        }
        self.pending.insert(
            corr,
            Pending {
                chat_id: msg.chat_id,
                call: msg.call,
                reply,
                timer,
                order,
            },
        );
        // A dropped sender (actor stopped) reads as a cancel.
        Box::pin(async move { wait.await.unwrap_or(UiOutcome::Cancelled) })
    }
}

impl Handler<UiCallTimedOut> for UiCorrelator {
    type Result = ();

    fn handle(&mut self, msg: UiCallTimedOut, _ctx: &mut Self::Context) {
        // Only the wait that started this timer: the call may have ended, and a resumed call
        // may be waiting again under the same corr, since the timer fired.
        if self
            .pending
            .get(&msg.corr)
            .is_some_and(|p| p.order == msg.order)
        {
            tracing::info!(corr = %msg.corr, "UI tool wait timed out");
            self.finish(&msg.corr, UiOutcome::TimedOut(msg.after));
        }
    }
}

impl Handler<ResolveUiCall> for UiCorrelator {
    type Result = Result<(), CorrelationError>;

    fn handle(&mut self, msg: ResolveUiCall, _ctx: &mut Self::Context) -> Self::Result {
        let Some(pending) = self.pending.get(&msg.corr) else {
            return match self.resolved.get(&msg.corr) {
                Some(owner) if *owner == msg.chat_id => Err(CorrelationError::AlreadyResolved),
                Some(_) => {
                    tracing::warn!(chat_id = %msg.chat_id, "tool response names a corr of another chat");
                    Err(CorrelationError::ForeignChat)
                }
                None => Err(CorrelationError::Unknown),
            };
        };
        if pending.chat_id != msg.chat_id {
            // Logged without the payload: it may carry another user's secret.
            tracing::warn!(chat_id = %msg.chat_id, "tool response names a corr of another chat");
            return Err(CorrelationError::ForeignChat);
        }
        let response = tessera_tools::normalize_ui_response(&msg.response)
            .map_err(CorrelationError::InvalidResponse)?;
        self.finish(&msg.corr, UiOutcome::Answered(response));
        Ok(())
    }
}

impl Handler<CancelUiCalls> for UiCorrelator {
    type Result = usize;

    fn handle(&mut self, msg: CancelUiCalls, _ctx: &mut Self::Context) -> usize {
        let corrs = self.corrs_of(&msg.chat_id);
        corrs
            .iter()
            .filter(|corr| self.finish(corr, UiOutcome::Cancelled))
            .count()
    }
}

impl Handler<ReleaseUiCalls> for UiCorrelator {
    type Result = usize;

    fn handle(&mut self, msg: ReleaseUiCalls, _ctx: &mut Self::Context) -> usize {
        let corrs = self.corrs_of(&msg.chat_id);
        for corr in &corrs {
            if let Some(pending) = self.pending.remove(corr) {
                if let Some(timer) = pending.timer {
                    timer.abort();
                }
                let _ = pending.reply.send(UiOutcome::Released);
            }
        }
        corrs.len()
    }
}

impl Handler<ChatDisconnected> for UiCorrelator {
    type Result = ();

    fn handle(&mut self, msg: ChatDisconnected, _ctx: &mut Self::Context) {
        if self.policy == DisconnectPolicy::Fail {
            for corr in self.corrs_of(&msg.chat_id) {
                self.finish(&corr, UiOutcome::Disconnected);
            }
        }
    }
}

impl Handler<ListPendingUiCalls> for UiCorrelator {
    type Result = MessageResult<ListPendingUiCalls>;

    fn handle(&mut self, msg: ListPendingUiCalls, _ctx: &mut Self::Context) -> Self::Result {
        let calls = self
            .corrs_of(&msg.chat_id)
            .iter()
            .filter_map(|corr| self.pending.get(corr).map(|p| p.call.clone()))
            .collect();
        MessageResult(calls)
    }
}
