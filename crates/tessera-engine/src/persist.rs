//! Durability: a chat's writes to the [`ChatStore`] and the durable tool-invocation records
//! behind every `DedupCache`.
//!
//! A session never awaits the database inside a handler. It queues writes in a
//! [`WriteBehind`] and one flush at a time runs as a spawned future, so a chat's writes reach
//! the store in order (chat → messages → events → pending UI calls → state) and batch
//! naturally under load.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tessera_store::{ChatStore, ChatWriteBatch, ToolClaim};

use crate::dedup::{ClaimOutcome, DedupRecordStore};

/// Writes queued since the last flush (the store's batch type).
pub type PendingWrites = ChatWriteBatch;

/// A chat's write-behind queue.
pub struct WriteBehind {
    store: Arc<dyn ChatStore>,
    chat_id: Arc<str>,
    queued: PendingWrites,
    flushing: bool,
    /// The batch under way (shared with the store's job, not copied), put back at the head
    /// of the queue if the write fails for a reason a retry can cure: a failed flush must
    /// not lose the chat's history.
    in_flight: Option<Arc<PendingWrites>>,
    /// Wait before the next retry; doubles up to [`MAX_RETRY_DELAY`], reset by a success.
    retry_delay: Duration,
    /// Highest event seq of the flush under way.
    in_flight_seq: u64,
    /// Highest event seq known to be in the store.
    persisted_seq: u64,
}

impl WriteBehind {
    /// A queue writing chat `chat_id` to `store`.
    pub fn new(store: Arc<dyn ChatStore>, chat_id: Arc<str>) -> Self {
        Self {
            store,
            chat_id,
            queued: PendingWrites::default(),
            flushing: false,
            in_flight: None,
            retry_delay: FIRST_RETRY_DELAY,
            in_flight_seq: 0,
            persisted_seq: 0,
        }
    }

    /// Highest event seq the store is known to hold: clients and operators can tell how far
    /// durability has caught up with the live log.
    pub fn persisted_seq(&self) -> u64 {
        self.persisted_seq
    }

    /// Starts counting from `seq` (a chat restored from the store already holds its log).
    pub fn set_persisted_seq(&mut self, seq: u64) {
        self.persisted_seq = seq;
        self.in_flight_seq = seq;
    }

    /// True when writes wait for a flush.
    pub fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// The queued writes, to add to.
    pub fn queue(&mut self) -> &mut PendingWrites {
        &mut self.queued
    }

    /// Takes the queued writes and returns the future that performs them, unless a flush is
    /// already running (then the writes wait for the next one) or nothing is queued.
    pub fn start_flush(&mut self) -> Option<BoxFuture<'static, FlushOutcome>> {
        if self.flushing || self.queued.is_empty() {
            return None;
        }
        self.flushing = true;
        let batch = Arc::new(std::mem::take(&mut self.queued));
        self.in_flight_seq = batch.events.last().map_or(self.persisted_seq, |e| e.seq);
        self.in_flight = Some(batch.clone());
        let store = self.store.clone();
        let chat_id = self.chat_id.clone();
        Some(Box::pin(async move {
            match store.apply_batch(&chat_id, batch).await {
                Ok(()) => FlushOutcome::Written,
                Err(error) if error.is_transient() => {
                    tracing::warn!(chat_id = %chat_id, %error, "persisting chat failed; will retry");
                    FlushOutcome::Retry
                }
                Err(error) => {
                    // A conflict or a deleted chat: the same batch would fail again.
                    tracing::error!(chat_id = %chat_id, %error, "persisting chat failed; batch dropped");
                    FlushOutcome::Dropped
                }
            }
        }))
    }

    /// The flush finished: what to do next.
    pub fn flush_done(&mut self, outcome: FlushOutcome) -> NextFlush {
        self.flushing = false;
        let failed = self.in_flight.take();
        match outcome {
            FlushOutcome::Written => {
                self.persisted_seq = self.in_flight_seq;
                self.retry_delay = FIRST_RETRY_DELAY;
            }
            FlushOutcome::Retry => {
                if let Some(failed) = failed {
                    // The store's job has finished with its share; a copy only if not.
                    let failed = Arc::unwrap_or_clone(failed);
                    let newer = std::mem::take(&mut self.queued);
                    self.queued = prepend(failed, newer);
                }
                let delay = self.retry_delay;
                self.retry_delay = (delay * 2).min(MAX_RETRY_DELAY);
                return NextFlush::After(delay);
            }
            FlushOutcome::Dropped => {}
        }
        if self.queued.is_empty() {
            NextFlush::Idle
        } else {
            NextFlush::Now
        }
    }
}

/// How a flush ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushOutcome {
    /// The batch is in the store.
    Written,
    /// The store failed in a way a retry can cure (I/O, lock timeout, failed commit): the
    /// batch goes back to the head of the queue.
    Retry,
    /// The store refused the batch for good (conflict, chat deleted): logged and dropped.
    Dropped,
}

/// What the session should do after a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextFlush {
    /// Nothing is queued.
    Idle,
    /// More writes are queued: flush now.
    Now,
    /// The flush failed: try again after this delay (backing off).
    After(Duration),
}

/// First retry delay after a failed flush.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(50);
/// Longest retry delay.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// `first`'s writes followed by `then`'s, as one batch (the newest state wins).
fn prepend(mut first: PendingWrites, then: PendingWrites) -> PendingWrites {
    first.messages.extend(then.messages);
    first.events.extend(then.events);
    first.put_pending.extend(then.put_pending);
    first.remove_pending.extend(then.remove_pending);
    if then.state.is_some() {
        first.state = then.state;
    }
    first
}

/// The store's tool-invocation records as the `DedupCache`'s durable layer. Keys are
/// `{chat_id}:{invocation_key}`.
pub struct StoreDedup(pub Arc<dyn ChatStore>);

fn split(key: &str) -> (&str, &str) {
    key.split_once(':').unwrap_or((key, ""))
}

impl DedupRecordStore for StoreDedup {
    fn claim(&self, key: &str) -> BoxFuture<'static, Result<ClaimOutcome, String>> {
        let (chat_id, invocation) = split(key);
        let claim = self.0.claim_tool(chat_id, invocation);
        Box::pin(async move {
            match claim.await {
                Ok(ToolClaim::Claimed) => Ok(ClaimOutcome::Claimed),
                Ok(ToolClaim::AlreadyStarted) => Ok(ClaimOutcome::Interrupted),
                Ok(ToolClaim::AlreadyCompleted(_)) => Ok(ClaimOutcome::Completed),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    fn complete(&self, key: &str) -> BoxFuture<'static, Result<(), String>> {
        let (chat_id, invocation) = split(key);
        let done = self.0.complete_tool(chat_id, invocation);
        Box::pin(async move { done.await.map_err(|e| e.to_string()) })
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
