//! `DedupCache`: turn idempotency. A [`ToolKey`] is a chat and its turn idempotency key (or,
//! for agent tools, the invocation key), and a tool may run only after its key was claimed.
//!
//! The original runtime checks the key before running the tool and records it only after, so
//! two concurrent duplicates both run. Here the claim *is* the check: one message, handled
//! atomically by this actor, marks the key in flight before anything awaits. The LRU bounds
//! memory; a [`DedupRecordStore`] (the store's durable records) can stand behind it so a claim
//! survives restarts.

use std::num::NonZeroUsize;
use std::sync::Arc;

use actix::dev::{MessageResponse, OneshotSender};
use actix::prelude::*;
use lru::LruCache;
use serde_json::Value;

/// What a tool invocation is claimed under: its chat, and the turn idempotency key (auto
/// tools) or invocation key (agent tools) within it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ToolKey {
    pub chat_id: Arc<str>,
    pub invocation: Arc<str>,
}

impl ToolKey {
    /// The key of `invocation` in chat `chat_id`.
    pub fn new(chat_id: Arc<str>, invocation: impl Into<Arc<str>>) -> Self {
        Self {
            chat_id,
            invocation: invocation.into(),
        }
    }

    /// The key of the turn a tool context belongs to (its turn idempotency key).
    pub fn of_turn(ctx: &tessera_tools::ToolContext) -> Self {
        Self::new(ctx.chat_id.clone(), ctx.turn_idempotency_key.clone())
    }
}

impl std::fmt::Display for ToolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.chat_id, self.invocation)
    }
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// The caller owns the key and must run the tool, then send [`CompleteKey`].
    Claimed,
    /// Another invocation holds the key and is still running.
    InFlight,
    /// The key already ran to completion; with the result its durable record holds (agent
    /// tools record theirs), which a turn re-run after a crash reuses instead of running the
    /// tool again.
    Completed(Option<Value>),
    /// A durable record says the tool started but never completed (a crash): it must be
    /// reported as interrupted, never silently re-run.
    Interrupted,
}

impl ClaimOutcome {
    /// True when the caller may run the tool.
    pub fn is_claimed(&self) -> bool {
        *self == Self::Claimed
    }
}

/// Where a durable claim's answer goes ([`DedupRecordStore::claim`]).
pub type ClaimDone = Box<dyn FnOnce(Result<ClaimOutcome, String>) + Send>;

/// A durable record of tool invocations behind the cache (the store implements it).
///
/// `epoch` is the chat's lease epoch in a cluster (`None` on a single node): a record store
/// that fences refuses the write once another node took the chat over (an error, so the tool
/// does not run).
pub trait DedupRecordStore: Send + Sync + 'static {
    /// Inserts the record `started` unless one exists, and tells `done` which (on whichever
    /// thread the store answered).
    fn claim(&self, key: &ToolKey, epoch: Option<i64>, done: ClaimDone);
    /// Marks the record completed, with the tool's `result` when it has one to keep. Nobody
    /// waits for it (a failure is logged): a completion lost to a crash leaves the record
    /// `started`, and the re-run turn reports the tool as interrupted instead of running it
    /// twice.
    fn complete(&self, key: &ToolKey, result: Option<&Value>, epoch: Option<i64>);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyState {
    InFlight,
    Completed,
}

/// Claim `key` before running a tool.
#[derive(Message)]
#[rtype(result = "ClaimOutcome")]
pub struct ClaimKey(pub ToolKey);

/// The tool of `key` finished (whatever its result).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CompleteKey {
    pub key: ToolKey,
    /// The result to record with the durable completion (an agent tool's), reused by a turn
    /// re-run after a crash; `None` records nothing. Shared with the `chat.tool_response`.
    pub result: Option<Arc<Value>>,
}

impl CompleteKey {
    /// `key` finished; no result is recorded.
    pub fn new(key: ToolKey) -> Self {
        Self { key, result: None }
    }
}

/// The lease epoch the durable records of `chat_id` are written under from now on (`None`:
/// forget it, the chat left this node). A session sends it when it starts, before any of its
/// tools can be claimed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FenceChat {
    pub chat_id: Arc<str>,
    pub epoch: Option<i64>,
}

/// Marks `key` as claimed by this process without a new durable claim: used when resuming a
/// tool whose durable record this chat already holds from before a restart.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AdoptKey(pub ToolKey);

/// The bounded idempotency cache actor.
pub struct DedupCache {
    /// Bounded by `capacity` in [`DedupCache::remember`], not by `LruCache::new`, which would
    /// allocate the table for the full capacity up front (megabytes per arbiter, mostly unused).
    keys: LruCache<ToolKey, KeyState>,
    capacity: NonZeroUsize,
    durable: Option<Arc<dyn DedupRecordStore>>,
    /// Lease epochs of this arbiter's chats in a cluster (see [`FenceChat`]).
    epochs: std::collections::HashMap<Arc<str>, i64>,
}

impl DedupCache {
    /// A cache remembering up to `capacity` keys, optionally backed by durable records.
    pub fn new(capacity: usize, durable: Option<Arc<dyn DedupRecordStore>>) -> Self {
        Self {
            keys: LruCache::unbounded(),
            capacity: NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN),
            durable,
            epochs: std::collections::HashMap::new(),
        }
    }

    /// Sets `key` to `state` (most recently used), evicting the least recently used key when
    /// the cache is over capacity.
    fn remember(&mut self, key: ToolKey, state: KeyState) {
        self.keys.put(key, state);
        if self.keys.len() > self.capacity.get() {
            self.keys.pop_lru();
        }
    }
}

impl Actor for DedupCache {
    type Context = Context<Self>;
}

impl Handler<ClaimKey> for DedupCache {
    type Result = ClaimReply;

    fn handle(&mut self, ClaimKey(key): ClaimKey, _ctx: &mut Self::Context) -> Self::Result {
        if let Some(state) = self.keys.get(&key) {
            let outcome = match state {
                KeyState::InFlight => ClaimOutcome::InFlight,
                KeyState::Completed => ClaimOutcome::Completed(None),
            };
            tracing::warn!(key = %key, ?outcome, "duplicate tool invocation suppressed");
            return ClaimReply::Now(outcome);
        }
        // Claimed here, synchronously: a duplicate handled after this line sees InFlight.
        self.remember(key.clone(), KeyState::InFlight);
        match &self.durable {
            None => ClaimReply::Now(ClaimOutcome::Claimed),
            Some(store) => ClaimReply::Durable {
                epoch: self.epochs.get(&key.chat_id).copied(),
                store: Arc::clone(store),
                key,
            },
        }
    }
}

/// The answer to a [`ClaimKey`]: known at once, or the durable record store's.
///
/// WHY not a `ResponseFuture`: actix spawns a task to await each one. The store's answer
/// instead goes from where the store gives it (SQLite's writer thread) straight into the
/// asker's reply channel.
pub enum ClaimReply {
    Now(ClaimOutcome),
    Durable {
        store: Arc<dyn DedupRecordStore>,
        key: ToolKey,
        epoch: Option<i64>,
    },
}

impl MessageResponse<DedupCache, ClaimKey> for ClaimReply {
    fn handle(self, _ctx: &mut Context<DedupCache>, tx: Option<OneshotSender<ClaimOutcome>>) {
        let reply = move |outcome| {
            if let Some(tx) = tx {
                // The asker may have stopped waiting; that is fine.
                let _ = tx.send(outcome);
            }
        };
        match self {
            ClaimReply::Now(outcome) => reply(outcome),
            ClaimReply::Durable { store, key, epoch } => {
                let asked = key.clone();
                store.claim(
                    &asked,
                    epoch,
                    Box::new(move |claimed| {
                        reply(claimed.unwrap_or_else(|error| {
                            // Refuse rather than risk a second execution.
                            tracing::error!(key = %key, %error, "durable dedup claim failed");
                            ClaimOutcome::InFlight
                        }))
                    }),
                );
            }
        }
    }
}

impl Handler<CompleteKey> for DedupCache {
    type Result = ();

    fn handle(&mut self, CompleteKey { key, result }: CompleteKey, _ctx: &mut Self::Context) {
        // Only a key this cache claimed has a durable record to complete.
        let claimed_here = self.keys.peek(&key) == Some(&KeyState::InFlight);
        if let (true, Some(store)) = (claimed_here, &self.durable) {
            let epoch = self.epochs.get(&key.chat_id).copied();
            // Not a future of this context: actix polls every future of a context on each
            // of its wake-ups, so with one pending completion per active chat each message
            // cost grew with the number of chats. Nor a task awaiting it: the store logs
            // how it went where it finishes it.
            store.complete(&key, result.as_deref(), epoch);
        }
        self.remember(key, KeyState::Completed);
    }
}

impl Handler<FenceChat> for DedupCache {
    type Result = ();

    fn handle(&mut self, msg: FenceChat, _ctx: &mut Self::Context) {
        match msg.epoch {
            Some(epoch) => {
                self.epochs.insert(msg.chat_id, epoch);
            }
            None => {
                self.epochs.remove(&msg.chat_id);
            }
        }
    }
}

impl Handler<AdoptKey> for DedupCache {
    type Result = ();

    fn handle(&mut self, AdoptKey(key): AdoptKey, _ctx: &mut Self::Context) {
        self.remember(key, KeyState::InFlight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(invocation: &str) -> ToolKey {
        ToolKey::new(Arc::from("c"), invocation)
    }

    #[actix::test]
    async fn second_claim_of_a_key_is_refused() {
        let cache = DedupCache::new(8, None).start();
        assert_eq!(
            cache.send(ClaimKey(key("c:t1"))).await.ok(),
            Some(ClaimOutcome::Claimed)
        );
        assert_eq!(
            cache.send(ClaimKey(key("c:t1"))).await.ok(),
            Some(ClaimOutcome::InFlight)
        );
        cache.do_send(CompleteKey::new(key("c:t1")));
        assert_eq!(
            cache.send(ClaimKey(key("c:t1"))).await.ok(),
            Some(ClaimOutcome::Completed(None))
        );
        assert_eq!(
            cache.send(ClaimKey(key("c:t2"))).await.ok(),
            Some(ClaimOutcome::Claimed)
        );
    }

    #[actix::test]
    async fn concurrent_claims_yield_exactly_one_owner() {
        let cache = DedupCache::new(8, None).start();
        let claims: Vec<_> = (0..50)
            .map(|_| cache.send(ClaimKey(key("c:same"))))
            .collect();
        let outcomes = futures::future::join_all(claims).await;
        let owners = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(ClaimOutcome::Claimed)))
            .count();
        assert_eq!(owners, 1);
    }

    #[actix::test]
    async fn capacity_bounds_memory_by_evicting_oldest() {
        let cache = DedupCache::new(2, None).start();
        for name in ["a", "b", "c"] {
            assert_eq!(
                cache.send(ClaimKey(key(name))).await.ok(),
                Some(ClaimOutcome::Claimed)
            );
        }
        // "a" was evicted, so it can be claimed again; "c" is still remembered.
        assert_eq!(
            cache.send(ClaimKey(key("a"))).await.ok(),
            Some(ClaimOutcome::Claimed)
        );
        assert_eq!(
            cache.send(ClaimKey(key("c"))).await.ok(),
            Some(ClaimOutcome::InFlight)
        );
    }
}
