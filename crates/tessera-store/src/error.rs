//! The one error type of the store.
//!
//! WHY an enum with a few coarse variants: callers (the engine, the server) branch on "the
//! chat does not exist" and "that key is already taken" (a duplicate event seq, a duplicate
//! message idx), and treat everything else as backend trouble to log and surface.

use std::path::PathBuf;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The SQL backend failed (I/O, lock timeout, constraint not covered below, ...).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The write connection failed (I/O, lock timeout, constraint not covered below, ...).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The transaction that carried this write failed to commit; nothing of it was stored.
    #[error("database commit failed: {0}")]
    Commit(String),
    /// The store was closed; nothing was written.
    #[error("the store is closed")]
    Closed,
    /// A filesystem operation around the database file failed.
    #[error("cannot prepare {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A value could not be encoded to or decoded from JSON.
    #[error("json error: {0}")]
    Json(#[from] serde_json::Error),
    /// The chat does not exist (or was deleted).
    #[error("chat '{0}' not found")]
    ChatNotFound(String),
    /// A write collided with existing data that must never be overwritten (duplicate event
    /// seq, duplicate message idx, chat id already taken, tool completed twice, ...). The
    /// whole call was rolled back.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A caller-supplied value cannot be stored (for example a u64 above i64::MAX).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A stored row does not decode into the expected shape (hand-edited or corrupted file).
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// The schema could not be brought up to date.
    #[error("migration failed: {0}")]
    Migration(String),
}

impl StoreError {
    /// Stable snake_case code for logs, metrics and client-facing error payloads.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Database(_) | StoreError::Sqlite(_) | StoreError::Commit(_) => {
                "store_database"
            }
            StoreError::Closed => "store_closed",
            StoreError::Io { .. } => "store_io",
            StoreError::Json(_) => "store_json",
            StoreError::ChatNotFound(_) => "chat_not_found",
            StoreError::Conflict(_) => "store_conflict",
            StoreError::InvalidInput(_) => "store_invalid_input",
            StoreError::Corrupt(_) => "store_corrupt",
            StoreError::Migration(_) => "store_migration",
        }
    }

    /// Classify an error from an INSERT: a unique/primary-key collision becomes
    /// [`StoreError::Conflict`], a missing parent chat becomes [`StoreError::ChatNotFound`].
    pub(crate) fn from_write(err: rusqlite::Error, chat_id: &str, what: &str) -> Self {
        use rusqlite::ffi;
        let extended = match &err {
            rusqlite::Error::SqliteFailure(e, _) => e.extended_code,
            _ => 0,
        };
        match extended {
            ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                StoreError::Conflict(format!("{what} already exists in chat '{chat_id}'"))
            }
            ffi::SQLITE_CONSTRAINT_FOREIGNKEY => StoreError::ChatNotFound(chat_id.to_owned()),
            _ => StoreError::Sqlite(err),
        }
    }
}

/// WHY: the tool crate's `TaskStore` / `ArtifactStore` traits report a plain message.
impl From<StoreError> for tessera_tools::StoreError {
    fn from(e: StoreError) -> Self {
        tessera_tools::StoreError(e.to_string())
    }
}
