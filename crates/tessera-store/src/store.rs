//! The [`ChatStore`] trait: everything the engine persists about a chat.
//!
//! WHY a trait: it is the seam between the engine/server and the database:
//! [`crate::SqliteStore`] (embedded, one node) and [`crate::PgStore`] (shared, several nodes)
//! implement it, and callers never know which one they hold. Every method returns a
//! `'static` boxed future so the server can hold an `Arc<dyn ChatStore>` and spawn the calls.

use std::sync::Arc;

use crate::{
    ChatRecord, ChatWriteBatch, PendingUiRecord, StoreError, StoredChat, StoredEvent,
    StoredMessage, ToolClaim,
};
use futures::future::BoxFuture;

/// A boxed, `'static`, `Send` store future.
pub type StoreFuture<T> = BoxFuture<'static, Result<T, StoreError>>;

/// What a write handed over with a `…_then` method calls with its outcome, once, on
/// whichever thread finished it. It must be quick (a message to an actor, a log line).
pub type Completion<T> = Box<dyn FnOnce(Result<T, StoreError>) + Send>;

/// The default of the `…_then` methods: awaits `write` on a task of the current tokio runtime,
/// then hands its outcome to `done`.
fn answer_when_done<T: Send + 'static>(write: StoreFuture<T>, done: Completion<T>) {
    tokio::spawn(async move { done(write.await) });
}

/// Durable chat persistence: chats and their state, transcripts, the replayable event log,
/// pending UI calls and exactly-once tool invocation records.
///
/// Only what the engine and server call: every chat write goes through
/// [`ChatStore::apply_batch`]; finer-grained reads and writes a backend offers (for tests and
/// tools) are its own inherent methods.
///
/// Secrets: no method ever receives a secret in clear; callers strip them from contexts,
/// messages and events before saving, and the vault methods take sealed bytes only.
pub trait ChatStore: Send + Sync + 'static {
    /// Persist a new chat; its state starts as `awaiting_user`, turn 0, empty context.
    /// A chat id that already exists is a [`StoreError::Conflict`].
    fn create_chat(&self, record: ChatRecord) -> StoreFuture<()>;

    /// Applies one chat's queued writes (messages, events, pending UI calls, state) in that
    /// order, as one transaction: all of it is stored or none. An event `seq` or message
    /// `idx` that already exists is a [`StoreError::Conflict`]; an unknown chat is
    /// [`StoreError::NotFound`]; a batch whose [`ChatWriteBatch::epoch`] is no longer the
    /// chat's lease epoch is [`StoreError::Fenced`].
    ///
    /// Shared (`Arc`) so a caller can keep the batch to retry it after a
    /// [`StoreError::Transient`] failure without copying it up front.
    fn apply_batch(&self, chat_id: &str, batch: Arc<ChatWriteBatch>) -> StoreFuture<()>;

    /// [`ChatStore::apply_batch`] whose outcome goes to `done` instead of to a future.
    ///
    /// WHY: the engine awaits every flush only to tell its chat how it went. A store that
    /// finishes writes on a thread of its own (SQLite's writer) calls `done` there, and no
    /// task per flush is spawned to wait. The default awaits [`ChatStore::apply_batch`] on a
    /// task of the current tokio runtime (so it must be called inside one).
    fn apply_batch_then(&self, chat_id: &str, batch: Arc<ChatWriteBatch>, done: Completion<()>) {
        answer_when_done(self.apply_batch(chat_id, batch), done);
    }

    /// The chat and its state, or `None` when it does not exist.
    fn load_chat(&self, chat_id: &str) -> StoreFuture<Option<StoredChat>>;

    /// One page of a user's chats, newest first.
    fn list_chats(
        &self,
        tenant: &str,
        user_id: &str,
        limit: u32,
        offset: u32,
    ) -> StoreFuture<Vec<StoredChat>>;

    /// Every chat whose status is not `completed` (for rehydration after a restart),
    /// oldest first.
    fn list_open_chats(&self) -> StoreFuture<Vec<StoredChat>>;

    /// The whole transcript, ordered by idx.
    fn all_messages(&self, chat_id: &str) -> StoreFuture<Vec<StoredMessage>>;

    /// Up to `limit` events with `seq > after_seq`, ordered by seq.
    fn events_after(
        &self,
        chat_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> StoreFuture<Vec<StoredEvent>>;

    /// The chat's highest taken seq: its last stored event's, or a higher one a batch marked
    /// taken ([`ChatWriteBatch::seqs_taken_through`]); 0 for an unknown chat. A chat rebuilt
    /// after a restart continues above it.
    fn last_seq_taken(&self, chat_id: &str) -> StoreFuture<u64>;

    /// The chat's pending UI calls, oldest first.
    fn pending_ui(&self, chat_id: &str) -> StoreFuture<Vec<PendingUiRecord>>;

    /// Atomically claim a tool invocation before running it. Exactly one caller, across
    /// tasks and processes, ever gets [`ToolClaim::Claimed`] for a (chat, key).
    ///
    /// `epoch`: the caller's lease epoch in a cluster (see [`crate::LeaseStore`]); when it is
    /// no longer the chat's, nothing is claimed and the answer is [`StoreError::Fenced`].
    /// `None` (single node) checks nothing.
    fn claim_tool(
        &self,
        chat_id: &str,
        invocation_key: &str,
        epoch: Option<i64>,
    ) -> StoreFuture<ToolClaim>;

    /// [`ChatStore::claim_tool`] whose answer goes to `done`, as for
    /// [`ChatStore::apply_batch_then`]: a store that answers claims on a thread of its own
    /// (SQLite's writer) calls `done` there, and the caller's reply needs no task.
    fn claim_tool_then(
        &self,
        chat_id: &str,
        invocation_key: &str,
        epoch: Option<i64>,
        done: Completion<ToolClaim>,
    ) {
        answer_when_done(self.claim_tool(chat_id, invocation_key, epoch), done);
    }

    /// Mark a claimed invocation completed. Not claimed, or already completed:
    /// [`StoreError::Conflict`]; a stale `epoch`: [`StoreError::Fenced`], as for
    /// [`ChatStore::claim_tool`].
    fn complete_tool(
        &self,
        chat_id: &str,
        invocation_key: &str,
        epoch: Option<i64>,
    ) -> StoreFuture<()>;

    /// [`ChatStore::complete_tool`] that also records the tool's `result`, which a later claim
    /// of the same key returns ([`ToolClaim::AlreadyCompleted`]): a turn re-run after a crash
    /// or a takeover reuses it instead of running the tool again. The default records none.
    fn complete_tool_recording(
        &self,
        chat_id: &str,
        invocation_key: &str,
        result: &serde_json::Value,
        epoch: Option<i64>,
    ) -> StoreFuture<()> {
        let _ = result;
        self.complete_tool(chat_id, invocation_key, epoch)
    }

    /// [`ChatStore::complete_tool_recording`] (with a `result`) or
    /// [`ChatStore::complete_tool`] (without), whose outcome goes to `done`, as for
    /// [`ChatStore::apply_batch_then`].
    fn complete_tool_then(
        &self,
        chat_id: &str,
        invocation_key: &str,
        result: Option<&serde_json::Value>,
        epoch: Option<i64>,
        done: Completion<()>,
    ) {
        let write = match result {
            Some(result) => self.complete_tool_recording(chat_id, invocation_key, result, epoch),
            None => self.complete_tool(chat_id, invocation_key, epoch),
        };
        answer_when_done(write, done);
    }

    /// Keep the chat's sealed (already encrypted) secret vault, replacing any previous one.
    fn put_secrets(&self, chat_id: &str, sealed: Vec<u8>) -> StoreFuture<()>;

    /// The chat's sealed secret vault, if one is kept.
    fn load_secrets(&self, chat_id: &str) -> StoreFuture<Option<Vec<u8>>>;

    /// Forget the chat's sealed secret vault; `true` when one existed.
    fn delete_secrets(&self, chat_id: &str) -> StoreFuture<bool>;

    /// Delete the chat and everything kept for it (transcript, events, pending UI calls, tool
    /// records, vault, artifacts); `true` when it existed.
    fn delete_chat(&self, chat_id: &str) -> StoreFuture<bool>;

    /// Ids of up to `limit` completed chats last updated before `before_ms` (Unix ms), oldest
    /// first: what the retention task purges.
    fn completed_chats_before(&self, before_ms: i64, limit: u32) -> StoreFuture<Vec<String>>;

    /// How many of `tenant`'s chats have not completed (the open-chat quota counts these, in
    /// memory or not).
    fn count_open_chats(&self, tenant: &str) -> StoreFuture<u64>;
}
