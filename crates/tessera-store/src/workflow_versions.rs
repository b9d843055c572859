//! Workflow versions kept in the store: every version a node served, with its manifest files,
//! so any node sharing the store (and a restarted one) can compile the version a stored chat
//! started with. A version is a content hash of its files, so it is written once and never
//! changes; writing it again is a no-op.

use std::collections::BTreeMap;

use rusqlite::{Connection, params};
use sqlx::{PgPool, Row, SqlitePool};

use crate::convert::now_ms;
use crate::{StoreError, StoreFuture};

/// One version of one workflow: its manifest files by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowVersion {
    /// The workflow's name.
    pub name: String,
    /// Its version (a content hash of the files).
    pub version: String,
    /// Manifest file name (`workflow.json`, `demo.json`, …) → its text.
    pub files: BTreeMap<String, String>,
}

/// Where workflow versions are kept (implemented by both stores).
pub trait WorkflowVersionStore: Send + Sync + 'static {
    /// Keep `version` unless one with its name and version is kept already; `true` when it
    /// was new.
    fn put_workflow_version(&self, version: WorkflowVersion) -> StoreFuture<bool>;

    /// Every kept version, by name then version.
    fn workflow_versions(&self) -> StoreFuture<Vec<WorkflowVersion>>;
}

fn encode(files: &BTreeMap<String, String>) -> Result<String, StoreError> {
    serde_json::to_string(files).map_err(|e| StoreError::InvalidInput(e.to_string()))
}

fn decode(name: String, version: String, files: &str) -> Result<WorkflowVersion, StoreError> {
    let files = serde_json::from_str(files).map_err(|e| {
        StoreError::Corrupt(format!("files of workflow {name} version {version}: {e}"))
    })?;
    Ok(WorkflowVersion {
        name,
        version,
        files,
    })
}

/// SQLite: insert unless present (on the writer's connection).
pub(crate) fn sqlite_put(conn: &Connection, v: &WorkflowVersion) -> Result<bool, StoreError> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO workflow_versions (name, version, files, created_at_ms) \
             VALUES (?, ?, ?, ?) ON CONFLICT (name, version) DO NOTHING",
        )?
        .execute(params![v.name, v.version, encode(&v.files)?, now_ms()])?;
    Ok(inserted > 0)
}

/// SQLite: every version.
pub(crate) async fn sqlite_all(pool: SqlitePool) -> Result<Vec<WorkflowVersion>, StoreError> {
    let rows =
        sqlx::query("SELECT name, version, files FROM workflow_versions ORDER BY name, version")
            .fetch_all(&pool)
            .await?;
    rows.into_iter()
        .map(|row| {
            let files: String = row.try_get("files")?;
            decode(row.try_get("name")?, row.try_get("version")?, &files)
        })
        .collect()
}

/// PostgreSQL: insert unless present (one statement; nodes racing on one version are fine).
pub(crate) async fn pg_put(pool: PgPool, v: WorkflowVersion) -> Result<bool, StoreError> {
    let inserted = sqlx::query(
        "INSERT INTO workflow_versions (name, version, files, created_at_ms) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (name, version) DO NOTHING",
    )
    .bind(&v.name)
    .bind(&v.version)
    .bind(encode(&v.files)?)
    .bind(now_ms())
    .execute(&pool)
    .await?;
    Ok(inserted.rows_affected() > 0)
}

/// PostgreSQL: every version.
pub(crate) async fn pg_all(pool: PgPool) -> Result<Vec<WorkflowVersion>, StoreError> {
    let rows =
        sqlx::query("SELECT name, version, files FROM workflow_versions ORDER BY name, version")
            .fetch_all(&pool)
            .await?;
    rows.into_iter()
        .map(|row| {
            let files: String = row.try_get("files")?;
            decode(row.try_get("name")?, row.try_get("version")?, &files)
        })
        .collect()
}
