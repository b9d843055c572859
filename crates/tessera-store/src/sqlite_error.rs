//! How the SQLite backend's writer errors (rusqlite) map onto the backend-neutral
//! [`StoreError`]. Its read pool's sqlx errors are classified in `sqlx_error.rs`.

use crate::StoreError;

/// A writer-connection error outside an INSERT: decoding failures mean corrupt data, anything
/// else (busy, locked, I/O, full disk) may pass.
impl From<rusqlite::Error> for StoreError {
    fn from(err: rusqlite::Error) -> Self {
        match err {
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::Utf8Error(..) => StoreError::Corrupt(err.to_string()),
            other => StoreError::Transient(other.to_string()),
        }
    }
}

/// Encoding a value the caller handed in (JSON text for a column).
impl From<serde_json::Error> for StoreError {
    fn from(err: serde_json::Error) -> Self {
        StoreError::InvalidInput(format!("cannot encode as JSON: {err}"))
    }
}

/// Classifies an error from an INSERT: a unique/primary-key collision becomes
/// [`StoreError::Conflict`], a missing parent chat becomes [`StoreError::NotFound`].
pub(crate) fn from_write(err: rusqlite::Error, chat_id: &str, what: &str) -> StoreError {
    use rusqlite::ffi;
    let extended = match &err {
        rusqlite::Error::SqliteFailure(e, _) => e.extended_code,
        _ => 0,
    };
    match extended {
        ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
            StoreError::Conflict(format!("{what} already exists in chat '{chat_id}'"))
        }
        ffi::SQLITE_CONSTRAINT_FOREIGNKEY => StoreError::NotFound(chat_id.to_owned()),
        _ => StoreError::from(err),
    }
}

/// A filesystem operation around the database file failed (at open: not worth retrying).
pub(crate) fn setup_io(path: &std::path::Path, source: std::io::Error) -> StoreError {
    StoreError::Setup(format!("cannot prepare {}: {source}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_become_neutral_variants() {
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        assert!(StoreError::from(busy).is_transient());
        let duplicate = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY),
            None,
        );
        assert!(matches!(
            from_write(duplicate, "c1", "events"),
            StoreError::Conflict(_)
        ));
        let undecodable =
            rusqlite::Error::InvalidColumnType(0, "seq".into(), rusqlite::types::Type::Text);
        let undecodable = StoreError::from(undecodable);
        assert!(matches!(undecodable, StoreError::Corrupt(_)));
        assert!(!undecodable.is_transient());
    }
}
