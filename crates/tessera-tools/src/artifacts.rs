//! Storage for files the tools produce (workflow bundles) and the download endpoint serves.
//!
//! WHY a trait: the store crate implements it against SQLite/PostgreSQL (or object storage);
//! every method is scoped by tenant, user and chat, so a download link never works for anyone
//! but the owner of the chat it was made in.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::StoreError;

/// Metadata of a stored file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRef {
    /// Opaque id (`art_` + 16 hex chars), unique across owners.
    pub id: String,
    /// Download file name.
    pub file_name: String,
    /// Size in bytes.
    pub size: u64,
    /// Hex SHA-256 of the content, when the store computes one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// A stored file with its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredArtifact {
    /// Its metadata.
    pub meta: ArtifactRef,
    /// Its bytes (cheap to clone).
    pub bytes: Bytes,
}

/// File storage scoped by (tenant, user, chat). An id of another owner or chat must behave
/// exactly like an unknown id.
pub trait ArtifactStore: Send + Sync {
    /// Store `bytes` under a new id.
    fn put<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        chat_id: &'a str,
        file_name: &'a str,
        bytes: Bytes,
    ) -> BoxFuture<'a, Result<ArtifactRef, StoreError>>;

    /// Fetch a file; `None` when this owner and chat have no such file.
    fn get<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        chat_id: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredArtifact>, StoreError>>;
}

type Key = (String, String, String, String);

/// Process-local [`ArtifactStore`] for tests and development.
#[derive(Debug, Default)]
pub struct InMemoryArtifactStore {
    // A std Mutex is fine: this is a data store, not engine state, and the lock is never held
    // across an await (every method finishes its work before returning a ready future).
    files: Mutex<HashMap<Key, StoredArtifact>>,
}

impl InMemoryArtifactStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl ArtifactStore for InMemoryArtifactStore {
    fn put<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        chat_id: &'a str,
        file_name: &'a str,
        bytes: Bytes,
    ) -> BoxFuture<'a, Result<ArtifactRef, StoreError>> {
        let meta = ArtifactRef {
            id: format!("art_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]),
            file_name: file_name.to_owned(),
            size: bytes.len() as u64,
            sha256: None,
        };
        let result = self
            .files
            .lock()
            .map_err(|_| StoreError("artifact store lock poisoned".to_owned()))
            .map(|mut files| {
                let key = (
                    tenant.to_owned(),
                    user.to_owned(),
                    chat_id.to_owned(),
                    meta.id.clone(),
                );
                files.insert(
                    key,
                    StoredArtifact {
                        meta: meta.clone(),
                        bytes,
                    },
                );
                meta
            });
        Box::pin(std::future::ready(result))
    }

    fn get<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        chat_id: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredArtifact>, StoreError>> {
        let key = (
            tenant.to_owned(),
            user.to_owned(),
            chat_id.to_owned(),
            id.to_owned(),
        );
        let result = self
            .files
            .lock()
            .map_err(|_| StoreError("artifact store lock poisoned".to_owned()))
            .map(|files| files.get(&key).cloned());
        Box::pin(std::future::ready(result))
    }
}
