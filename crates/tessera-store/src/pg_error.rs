//! How PostgreSQL's errors map onto the backend-neutral [`StoreError`], by SQLSTATE
//! (<https://www.postgresql.org/docs/current/errcodes-appendix.html>).
//!
//! WHY it matters: the engine retries exactly the [`StoreError::Transient`] writes, so a lost
//! connection, a server restarting, a serialization failure, a deadlock or a statement
//! timeout must land there, and a duplicate key must not (it would fail forever).

use crate::StoreError;

/// The error PostgreSQL reported with `code` (SQLSTATE) and `message`.
pub(crate) fn from_sqlstate(code: &str, message: &str) -> StoreError {
    let class = code.get(..2).unwrap_or("");
    match (code, class) {
        ("23505", _) => StoreError::Conflict(message.to_owned()),
        // A row of a chat that does not exist; callers that know the chat say which.
        ("23503", _) => StoreError::NotFound(message.to_owned()),
        // serialization_failure, deadlock_detected, lock_not_available, query_canceled
        // (statement timeout)
        ("40001" | "40P01" | "55P03" | "57014", _) => StoreError::Transient(message.to_owned()),
        // Other integrity violations and bad data: the caller's value cannot be stored.
        (_, "22" | "23") => StoreError::InvalidInput(message.to_owned()),
        // data_corrupted, index_corrupted
        ("XX001" | "XX002", _) => StoreError::Corrupt(message.to_owned()),
        // connection exceptions, insufficient resources, operator intervention (shutdown,
        // restart, cannot connect now), system errors (I/O): all pass.
        (_, "08" | "53" | "57" | "58") => StoreError::Transient(message.to_owned()),
        // Undefined table or column, invalid schema, insufficient privilege: the schema or
        // the role is wrong, an operator must act.
        (_, "42" | "3F" | "28") => StoreError::Setup(message.to_owned()),
        _ => StoreError::Transient(message.to_owned()),
    }
}

/// An error of a write to chat `chat_id`: a duplicate key is a [`StoreError::Conflict`]
/// naming `what`, a missing parent chat [`StoreError::NotFound`] naming the chat.
pub(crate) fn on_chat(err: sqlx::Error, chat_id: &str, what: &str) -> StoreError {
    match StoreError::from(err) {
        StoreError::Conflict(_) => {
            StoreError::Conflict(format!("{what} already exists in chat '{chat_id}'"))
        }
        StoreError::NotFound(_) => StoreError::NotFound(chat_id.to_owned()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_become_neutral_variants() {
        let kind = |code| from_sqlstate(code, "m");
        assert!(matches!(kind("23505"), StoreError::Conflict(_)));
        assert!(matches!(kind("23503"), StoreError::NotFound(_)));
        assert!(matches!(kind("23502"), StoreError::InvalidInput(_)));
        assert!(matches!(kind("22P02"), StoreError::InvalidInput(_)));
        for transient in [
            "40001", "40P01", "57P01", "57P03", "08006", "53300", "57014",
        ] {
            assert!(kind(transient).is_transient(), "{transient}");
        }
        assert!(matches!(kind("42P01"), StoreError::Setup(_)));
        assert!(matches!(kind("XX001"), StoreError::Corrupt(_)));
    }
}
