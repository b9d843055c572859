//! How sqlx errors, of either backend, map onto the backend-neutral [`StoreError`].
//!
//! Errors the database reports are classified by the backend that raised them (PostgreSQL's
//! SQLSTATE in `pg_error.rs`); the rest are the driver's own: decoding failures mean corrupt
//! data, a closed pool a closed store, and anything else (I/O, a pool timeout, a lost
//! connection) may pass.

use crate::StoreError;

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        if let Some(pg) = err
            .as_database_error()
            .and_then(|db| db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>())
        {
            return crate::pg_error::from_sqlstate(pg.code(), pg.message());
        }
        match err {
            sqlx::Error::Decode(_)
            | sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::TypeNotFound { .. } => StoreError::Corrupt(err.to_string()),
            sqlx::Error::PoolClosed => StoreError::Closed,
            sqlx::Error::Configuration(_) => StoreError::Setup(err.to_string()),
            other => StoreError::Transient(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_become_neutral_variants() {
        assert!(StoreError::from(sqlx::Error::PoolTimedOut).is_transient());
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(StoreError::from(sqlx::Error::Io(io)).is_transient());
        assert!(matches!(
            StoreError::from(sqlx::Error::PoolClosed),
            StoreError::Closed
        ));
        assert!(matches!(
            StoreError::from(sqlx::Error::ColumnNotFound("seq".into())),
            StoreError::Corrupt(_)
        ));
    }
}
