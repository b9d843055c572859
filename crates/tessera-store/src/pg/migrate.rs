//! Embedded PostgreSQL schema migrations, applied in order and recorded in `schema_version`.
//!
//! Forward only, as on SQLite: each shipped file is applied once, never edited. The whole
//! check-and-apply runs in one transaction holding a transaction-scoped advisory lock keyed
//! by the schema, so several nodes starting at once apply each migration exactly once (the
//! lock ends with the transaction, unlike a session lock tied to one pooled connection).

use sqlx::{PgPool, Row};

use crate::StoreError;
use crate::convert::now_ms;

/// (version, name, SQL), ascending by version. Append only.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../../migrations/postgres/0001_init.sql"),
    ),
    // 2 and 3 are SQLite's catch-up to what PostgreSQL's 0001 already has, and 5 is SQLite's
    // write-ordered layout; numbers stay aligned so one schema version means the same tables
    // on both backends.
    (
        4,
        "workflow_versions",
        include_str!("../../migrations/postgres/0004_workflow_versions.sql"),
    ),
    (
        6,
        "open_chats_by_tenant",
        include_str!("../../migrations/postgres/0006_open_chats_by_tenant.sql"),
    ),
    (
        7,
        "open_flag",
        include_str!("../../migrations/postgres/0007_open_flag.sql"),
    ),
    // 8 is SQLite's chat log, 10 its filter on the chain of tool claims.
    (
        9,
        "commit_group",
        include_str!("../../migrations/postgres/0009_commit_group.sql"),
    ),
    (
        11,
        "seqs_taken",
        include_str!("../../migrations/postgres/0011_seqs_taken.sql"),
    ),
];

/// Highest schema version this build knows.
pub(crate) const LATEST_VERSION: i64 = 11;

/// Bring the schema up to [`LATEST_VERSION`]; a no-op when it already is.
pub(crate) async fn run(pool: &PgPool) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('tessera-migrate:' || current_schema()))")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS schema_version (
            version       BIGINT NOT NULL PRIMARY KEY,
            name          TEXT   NOT NULL,
            applied_at_ms BIGINT NOT NULL
        )",
    )
    .execute(&mut *tx)
    .await?;
    let current = current_version_in(&mut tx).await?;
    if current > LATEST_VERSION {
        return Err(StoreError::Setup(format!(
            "database schema version {current} is newer than this build supports ({LATEST_VERSION})"
        )));
    }
    for &(version, name, sql) in MIGRATIONS {
        if version <= current {
            continue;
        }
        sqlx::raw_sql(sql)
            .execute(&mut *tx)
            .await
            .map_err(|e| StoreError::Setup(format!("migration {version} ({name}): {e}")))?;
        sqlx::query(
            "INSERT INTO schema_version (version, name, applied_at_ms) VALUES ($1, $2, $3)",
        )
        .bind(version)
        .bind(name)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tracing::info!(version, name, "applied store migration");
    }
    tx.commit().await?;
    Ok(())
}

async fn current_version_in(conn: &mut sqlx::PgConnection) -> Result<i64, StoreError> {
    Ok(
        sqlx::query("SELECT COALESCE(MAX(version), 0) AS v FROM schema_version")
            .fetch_one(conn)
            .await?
            .try_get("v")?,
    )
}

/// The schema version recorded in the database.
pub(crate) async fn current_version(pool: &PgPool) -> Result<i64, StoreError> {
    let mut conn = pool.acquire().await?;
    current_version_in(&mut conn).await
}
