//! SQL for the `artifacts` table: tool-produced files, stored as blobs in the database.
//!
//! WHY blobs rather than files next to the database: one file to back up, writes are atomic
//! with the metadata, and deleting a chat removes its files in the same transaction. The
//! files are small (workflow bundles). `PgStore` keeps them the same way (`BYTEA`); object
//! storage would suit large files better.
//!
//! Isolation: reads filter on (tenant, user_id, chat_id) as well as the id.

use bytes::Bytes;
use rusqlite::{Connection, params};
use sha2::{Digest, Sha256};
use sqlx::SqlitePool;
use tessera_tools::{ArtifactRef, StoredArtifact};

use crate::StoreError;
use crate::convert::now_ms;

/// Store a file under a new id.
pub(crate) fn put(
    conn: &Connection,
    tenant: &str,
    user: &str,
    chat_id: &str,
    file_name: &str,
    bytes: &Bytes,
) -> Result<ArtifactRef, StoreError> {
    let NewArtifact {
        id,
        size,
        size_sql,
        sha256,
    } = NewArtifact::of(bytes)?;
    conn.prepare_cached(
        "INSERT INTO artifacts (id, tenant, user_id, chat_id, file_name, size, sha256, bytes, \
         created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )?
    .execute(params![
        id,
        tenant,
        user,
        chat_id,
        file_name,
        size_sql,
        sha256,
        bytes.as_ref(),
        now_ms()
    ])?;
    Ok(ArtifactRef {
        id,
        file_name: file_name.to_owned(),
        size,
        sha256: Some(sha256),
    })
}

/// Fetch a file; `None` unless it belongs to exactly this (tenant, user, chat).
pub(crate) async fn get(
    pool: &SqlitePool,
    tenant: &str,
    user: &str,
    chat_id: &str,
    id: &str,
) -> Result<Option<StoredArtifact>, StoreError> {
    let row = sqlx::query(
        "SELECT id, file_name, size, sha256, bytes FROM artifacts \
         WHERE id = ? AND tenant = ? AND user_id = ? AND chat_id = ?",
    )
    .bind(id)
    .bind(tenant)
    .bind(user)
    .bind(chat_id)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(crate::rows::artifact).transpose()
}

/// What a new artifact row is stored under, the same for every backend.
pub(crate) struct NewArtifact {
    pub(crate) id: String,
    pub(crate) size: u64,
    pub(crate) size_sql: i64,
    pub(crate) sha256: String,
}

impl NewArtifact {
    pub(crate) fn of(bytes: &Bytes) -> Result<Self, StoreError> {
        let size = u64::try_from(bytes.len())
            .map_err(|_| StoreError::InvalidInput("artifact too large".to_owned()))?;
        let size_sql = i64::try_from(size)
            .map_err(|_| StoreError::InvalidInput("artifact too large".to_owned()))?;
        Ok(Self {
            id: format!("art_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]),
            size,
            size_sql,
            sha256: hex(&Sha256::digest(bytes)),
        })
    }
}

fn hex(digest: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(digest.len() * 2);
    for b in digest {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}
