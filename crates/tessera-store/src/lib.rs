//! Durable persistence for Tessera chats, so they survive reconnects, restarts and crashes.
//!
//! What is stored, per chat: its identity and latest state ([`ChatRecord`], [`ChatState`]),
//! the transcript ([`StoredMessage`]), the replayable event log ([`StoredEvent`]), UI calls
//! waiting for the user ([`PendingUiRecord`]) and exactly-once tool invocation records
//! ([`ToolClaim`]). Besides that, both stores implement the tool crate's
//! [`tessera_tools::TaskStore`] and [`tessera_tools::ArtifactStore`].
//!
//! The [`ChatStore`] trait is the seam: the server holds an `Arc<dyn ChatStore>`, either a
//! [`SqliteStore`] (embedded, one node) or a [`PgStore`] (PostgreSQL, shared by several
//! nodes, which also implements [`LeaseStore`]: chat ownership by lease, and fencing).
//!
//! Secrets: nothing in this crate ever receives a secret in clear. Callers strip secrets from
//! contexts, messages and events before saving; the one place secrets are kept is the
//! `chat_secrets` table, which holds only vaults the engine sealed (encrypted) itself.

#![warn(missing_docs)]

mod artifacts;
mod batch;
mod chats;
mod claims_journal;
mod convert;
mod db;
mod error;
mod lease;
mod log;
mod migrate;
mod model;
mod pending;
mod pg;
mod pg_error;
mod rows;
mod secrets;
mod sqlite;
mod sqlite_error;
mod sqlx_error;
mod store;
mod tasks;
#[cfg(feature = "testing")]
pub mod testing;
mod tools;
mod workflow_versions;
mod writer;

pub use error::StoreError;
pub use lease::{Lease, LeaseStore, PARKED_NODE};
pub use model::{
    ChatRecord, ChatState, JsonText, PendingUiRecord, STATUS_AWAITING_USER, STATUS_COMPLETED,
    StoredChat, StoredEvent, StoredMessage, ToolClaim,
};
pub use pg::PgStore;
pub use sqlite::SqliteStore;
pub use store::{ChatStore, Completion, StoreFuture};
pub use workflow_versions::{WorkflowVersion, WorkflowVersionStore};

pub use batch::ChatWriteBatch;
