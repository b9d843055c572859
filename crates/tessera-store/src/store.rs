//! The [`ChatStore`] trait: everything the engine persists about a chat.
//!
//! WHY a trait: it is the seam between the engine/server and the database. Only
//! [`crate::SqliteStore`] exists today; a `PostgresStore` for multi-node deployments will
//! implement the same trait later without touching callers. Every method returns a
//! `'static` boxed future so the server can hold an `Arc<dyn ChatStore>` and spawn the calls.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::{
    ChatRecord, ChatState, PendingUiRecord, StoreError, StoredChat, StoredEvent, StoredMessage,
    ToolClaim,
};

/// A boxed, `'static`, `Send` store future.
pub type StoreFuture<T> = BoxFuture<'static, Result<T, StoreError>>;

/// Durable chat persistence: chats and their state, transcripts, the replayable event log,
/// pending UI calls and exactly-once tool invocation records.
///
/// Secrets: no method ever receives a secret in clear; callers strip them from contexts,
/// messages and events before saving, and the vault methods take sealed bytes only.
pub trait ChatStore: Send + Sync + 'static {
    /// Persist a new chat; its state starts as `awaiting_user`, turn 0, empty context.
    /// A chat id that already exists is a [`StoreError::Conflict`].
    fn create_chat(&self, record: ChatRecord) -> StoreFuture<()>;

    /// Replace the chat's state. Unknown chat: [`StoreError::ChatNotFound`].
    fn save_state(&self, chat_id: &str, state: ChatState) -> StoreFuture<()>;

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

    /// Append transcript messages in one transaction. An `idx` that already exists fails the
    /// whole batch with [`StoreError::Conflict`]; nothing is overwritten.
    fn append_messages(&self, chat_id: &str, messages: Vec<StoredMessage>) -> StoreFuture<()>;

    /// Up to `limit` messages with `idx >= offset`, ordered by idx (idx is the 0-based
    /// position, so this is ordinary offset paging).
    fn messages(&self, chat_id: &str, offset: u64, limit: u32) -> StoreFuture<Vec<StoredMessage>>;

    /// The whole transcript, ordered by idx.
    fn all_messages(&self, chat_id: &str) -> StoreFuture<Vec<StoredMessage>>;

    /// Append events in one transaction. A `seq` that already exists fails the whole batch
    /// with [`StoreError::Conflict`] and leaves the log unchanged.
    fn append_events(&self, chat_id: &str, events: Vec<StoredEvent>) -> StoreFuture<()>;

    /// Up to `limit` events with `seq > after_seq`, ordered by seq.
    fn events_after(
        &self,
        chat_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> StoreFuture<Vec<StoredEvent>>;

    /// Highest stored seq of the chat, 0 when the log is empty.
    fn last_seq(&self, chat_id: &str) -> StoreFuture<u64>;

    /// Record (or replace, same `corr`) a pending UI call.
    fn put_pending_ui(&self, chat_id: &str, record: PendingUiRecord) -> StoreFuture<()>;

    /// Forget a pending UI call; `true` when it existed.
    fn remove_pending_ui(&self, chat_id: &str, corr: &str) -> StoreFuture<bool>;

    /// The chat's pending UI calls, oldest first.
    fn pending_ui(&self, chat_id: &str) -> StoreFuture<Vec<PendingUiRecord>>;

    /// Atomically claim a tool invocation before running it. Exactly one caller, across
    /// tasks and processes, ever gets [`ToolClaim::Claimed`] for a (chat, key).
    fn claim_tool(&self, chat_id: &str, invocation_key: &str) -> StoreFuture<ToolClaim>;

    /// Record the result of a claimed invocation. Not claimed, or already completed:
    /// [`StoreError::Conflict`].
    fn complete_tool(&self, chat_id: &str, invocation_key: &str, result: &Value)
    -> StoreFuture<()>;

    /// Delete the chat and everything hanging off it; `true` when it existed.
    fn delete_chat(&self, chat_id: &str) -> StoreFuture<bool>;

    /// Applies one chat's queued writes (messages, events, pending UI calls, state) in that
    /// order. Stores should make it one transaction; this default applies them one by one.
    ///
    /// Shared (`Arc`) so a caller can keep the batch to retry it after a transient failure
    /// without copying it up front.
    fn apply_batch(&self, chat_id: &str, batch: Arc<crate::ChatWriteBatch>) -> StoreFuture<()> {
        let batch = Arc::unwrap_or_clone(batch);
        let steps: Vec<StoreFuture<()>> = {
            let mut steps: Vec<StoreFuture<()>> = Vec::new();
            if !batch.messages.is_empty() {
                steps.push(self.append_messages(chat_id, batch.messages));
            }
            if !batch.events.is_empty() {
                steps.push(self.append_events(chat_id, batch.events));
            }
            for record in batch.put_pending {
                steps.push(self.put_pending_ui(chat_id, record));
            }
            for corr in &batch.remove_pending {
                let remove = self.remove_pending_ui(chat_id, corr);
                steps.push(Box::pin(async move { remove.await.map(|_| ()) }));
            }
            if let Some(state) = batch.state {
                steps.push(self.save_state(chat_id, state));
            }
            steps
        };
        Box::pin(async move {
            for step in steps {
                step.await?;
            }
            Ok(())
        })
    }

    /// Keep the chat's sealed (already encrypted) secret vault, replacing any previous one.
    /// The default keeps nothing: secrets then do not survive a restart.
    fn put_secrets(&self, chat_id: &str, sealed: Vec<u8>) -> StoreFuture<()> {
        let _ = (chat_id, sealed);
        Box::pin(async { Ok(()) })
    }

    /// The chat's sealed secret vault, if one is kept.
    fn load_secrets(&self, chat_id: &str) -> StoreFuture<Option<Vec<u8>>> {
        let _ = chat_id;
        Box::pin(async { Ok(None) })
    }

    /// Forget the chat's sealed secret vault; `true` when one existed.
    fn delete_secrets(&self, chat_id: &str) -> StoreFuture<bool> {
        let _ = chat_id;
        Box::pin(async { Ok(false) })
    }
}
