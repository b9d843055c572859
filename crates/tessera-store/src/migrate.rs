//! Embedded schema migrations, applied in order and recorded in `schema_version`.
//!
//! WHY plain SQL files instead of `sqlx::migrate!`: no build-time dependency on the macro
//! crate, and the whole check-and-apply runs in one `BEGIN IMMEDIATE` transaction, so two
//! processes opening the same file at once cannot both apply a migration, and opening an
//! up-to-date database is a single read.

use sqlx::{Row, SqlitePool};

use crate::StoreError;
use crate::convert::now_ms;

/// (version, name, SQL), ascending by version. Append only.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../migrations/0001_init.sql")),
    (
        2,
        "chat_secrets",
        include_str!("../migrations/0002_chat_secrets.sql"),
    ),
    (
        3,
        "chat_workflow_version",
        include_str!("../migrations/0003_chat_workflow_version.sql"),
    ),
    (
        4,
        "workflow_versions",
        include_str!("../migrations/0004_workflow_versions.sql"),
    ),
    (
        5,
        "append_order",
        include_str!("../migrations/0005_append_order.sql"),
    ),
    (
        6,
        "open_chats_by_tenant",
        include_str!("../migrations/0006_open_chats_by_tenant.sql"),
    ),
    (
        7,
        "open_flag",
        include_str!("../migrations/0007_open_flag.sql"),
    ),
    (
        8,
        "chat_log",
        include_str!("../migrations/0008_chat_log.sql"),
    ),
    // 9 is PostgreSQL's group commit function: numbers stay aligned across the backends.
    (
        10,
        "chain_filter",
        include_str!("../migrations/0010_chain_filter.sql"),
    ),
    (
        11,
        "seqs_taken",
        include_str!("../migrations/0011_seqs_taken.sql"),
    ),
];

/// Highest schema version this build knows.
pub(crate) const LATEST_VERSION: i64 = 11;

/// Bring the schema up to [`LATEST_VERSION`]; a no-op when it already is.
pub(crate) async fn run(pool: &SqlitePool) -> Result<(), StoreError> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS schema_version (
            version       INTEGER NOT NULL PRIMARY KEY,
            name          TEXT    NOT NULL,
            applied_at_ms INTEGER NOT NULL
        ) STRICT",
    )
    .execute(&mut *tx)
    .await?;
    let current: i64 = sqlx::query("SELECT COALESCE(MAX(version), 0) AS v FROM schema_version")
        .fetch_one(&mut *tx)
        .await?
        .try_get("v")?;
    if current > LATEST_VERSION {
        return Err(StoreError::Setup(format!(
            "database schema version {current} is newer than this build supports \
             ({LATEST_VERSION}): it was written by a newer Tessera; upgrade this binary or \
             restore a backup taken before the upgrade (migrations only go forward)"
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
        sqlx::query("INSERT INTO schema_version (version, name, applied_at_ms) VALUES (?, ?, ?)")
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

/// The schema version recorded in the database.
pub(crate) async fn current_version(pool: &SqlitePool) -> Result<i64, StoreError> {
    let v: i64 = sqlx::query("SELECT COALESCE(MAX(version), 0) AS v FROM schema_version")
        .fetch_one(pool)
        .await?
        .try_get("v")?;
    Ok(v)
}
