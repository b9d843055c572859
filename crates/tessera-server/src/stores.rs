//! The store the server runs on, chosen by `store.url`: SQLite (embedded, one node) or
//! PostgreSQL (shared by several nodes). The rest of the server sees only the traits.

use std::sync::Arc;

use anyhow::Context as _;
use tessera_store::{ChatStore, LeaseStore, PgStore, SqliteStore, WorkflowVersionStore};
use tessera_tools::{ArtifactStore, TaskStore};

use crate::config::{StoreLocation, redact_url};

/// The opened store.
#[derive(Clone)]
pub enum Stores {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

impl Stores {
    /// Opens (creating and migrating as needed) the store at `location`, capping each
    /// tenant's generated files at `tenant_file_quota` bytes (0 = no limit).
    pub async fn open(location: &StoreLocation, tenant_file_quota: u64) -> anyhow::Result<Self> {
        match location {
            StoreLocation::Sqlite(path) => {
                let store = SqliteStore::open(path)
                    .await
                    .with_context(|| format!("cannot open {}", path.display()))?
                    .with_tenant_file_quota(tenant_file_quota);
                tracing::info!(path = %path.display(), "store: SQLite");
                Ok(Self::Sqlite(store))
            }
            StoreLocation::Postgres(url) => {
                let shown = redact_url(url);
                let store = PgStore::connect(url)
                    .await
                    .with_context(|| format!("cannot open the PostgreSQL store {shown}"))?
                    .with_tenant_file_quota(tenant_file_quota);
                tracing::info!(url = %shown, "store: PostgreSQL");
                Ok(Self::Postgres(store))
            }
        }
    }

    pub fn chats(&self) -> Arc<dyn ChatStore> {
        match self {
            Self::Sqlite(s) => Arc::new(s.clone()),
            Self::Postgres(s) => Arc::new(s.clone()),
        }
    }

    pub fn tasks(&self) -> Arc<dyn TaskStore> {
        match self {
            Self::Sqlite(s) => Arc::new(s.clone()),
            Self::Postgres(s) => Arc::new(s.clone()),
        }
    }

    pub fn artifacts(&self) -> Arc<dyn ArtifactStore> {
        match self {
            Self::Sqlite(s) => Arc::new(s.clone()),
            Self::Postgres(s) => Arc::new(s.clone()),
        }
    }

    pub fn workflow_versions(&self) -> Arc<dyn WorkflowVersionStore> {
        match self {
            Self::Sqlite(s) => Arc::new(s.clone()),
            Self::Postgres(s) => Arc::new(s.clone()),
        }
    }

    /// Chat leases, on a store several nodes can share (PostgreSQL) only.
    pub fn leases(&self) -> Option<Arc<dyn LeaseStore>> {
        match self {
            Self::Sqlite(_) => None,
            Self::Postgres(s) => Some(Arc::new(s.clone())),
        }
    }

    /// Commits what is queued and closes the connections.
    pub async fn close(&self) {
        match self {
            Self::Sqlite(s) => s.close().await,
            Self::Postgres(s) => s.close().await,
        }
    }
}
