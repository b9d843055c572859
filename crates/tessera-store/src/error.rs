//! The one error type of the store, the same for every backend.
//!
//! WHY backend-neutral variants: the engine decides whether to retry a write, and the server
//! whether a chat exists, from the variant alone. A backend (SQLite or PostgreSQL)
//! classifies its own driver errors into these variants at its edge (`sqlite_error.rs`,
//! `pg_error.rs`), so no caller ever sees a
//! driver type and a new backend plugs in without touching them.

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend failed in a way that trying the same call again can cure (I/O, lock
    /// timeout, lost connection, failed commit). Nothing of the call was stored.
    #[error("store temporarily unavailable: {0}")]
    Transient(String),
    /// A write collided with existing data that must never be overwritten (duplicate event
    /// seq, duplicate message idx, chat id already taken, tool completed twice, ...). The
    /// whole call was rolled back; the same call will fail again.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The chat does not exist (or was deleted).
    #[error("chat '{0}' not found")]
    NotFound(String),
    /// A stored value does not decode into the expected shape (hand-edited or corrupted data).
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// A caller-supplied value cannot be stored (for example a u64 above i64::MAX).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A write would take a tenant over its storage quota; nothing was written.
    #[error("quota exceeded: {0}")]
    QuotaExceeded(String),
    /// The store was closed; nothing was written.
    #[error("the store is closed")]
    Closed,
    /// The write carried a lease epoch (multi-node ownership) that is no longer the chat's:
    /// another node took the chat over. Nothing of the write was stored, and it must never be
    /// retried: this node no longer owns the chat.
    #[error("chat '{0}' is fenced: its lease moved to a newer epoch")]
    Fenced(String),
    /// The store cannot be opened or its schema brought up to date (files, permissions,
    /// migrations): an operator must act; retrying the call does not help.
    #[error("store setup failed: {0}")]
    Setup(String),
}

impl StoreError {
    /// Stable snake_case code for logs, metrics and client-facing error payloads.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Transient(_) => "store_unavailable",
            StoreError::Conflict(_) => "store_conflict",
            StoreError::NotFound(_) => "chat_not_found",
            StoreError::Corrupt(_) => "store_corrupt",
            StoreError::InvalidInput(_) => "store_invalid_input",
            StoreError::QuotaExceeded(_) => "quota_exceeded",
            StoreError::Closed => "store_closed",
            StoreError::Fenced(_) => "store_fenced",
            StoreError::Setup(_) => "store_setup",
        }
    }

    /// True when the same call may succeed if tried again later: the one question the engine
    /// asks before retrying a write.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Transient(_))
    }
}

/// WHY: the tool crate's `TaskStore` / `ArtifactStore` traits report a plain message.
impl From<StoreError> for tessera_tools::StoreError {
    fn from(e: StoreError) -> Self {
        tessera_tools::StoreError(e.to_string())
    }
}
