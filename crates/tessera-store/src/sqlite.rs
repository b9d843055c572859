//! [`SqliteStore`]: the SQLite implementation of [`ChatStore`], [`TaskStore`] and
//! [`ArtifactStore`].
//!
//! WHY SQLite: a single-node deployment gets durable chats with no extra service. The file
//! runs in WAL mode (readers never block the writer) with `synchronous=NORMAL` (a committed
//! transaction survives a process crash; a power loss can lose the last few commits but never
//! corrupts the file), foreign keys on, and a busy timeout so several connections, or several
//! processes, on one file wait for the write lock instead of failing. Multi-statement writes
//! use `BEGIN IMMEDIATE` to take the write lock up front, which avoids SQLite's
//! read-then-upgrade `SQLITE_BUSY` failures.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::Value;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tessera_tools::{ArtifactRef, ArtifactStore, StoredArtifact, Task, TaskFilter, TaskStore};

use crate::store::StoreFuture;
use crate::{
    ChatRecord, ChatState, ChatStore, PendingUiRecord, StoreError, StoredChat, StoredEvent,
    StoredMessage, ToolClaim, artifacts, chats, events, messages, migrate, pending, secrets, tasks,
    tools,
};

/// How long a connection waits for another writer's lock before failing with "busy".
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections per store on a file: SQLite has one writer at a time, extra connections
/// serve concurrent reads.
const MAX_CONNECTIONS: u32 = 8;

/// Durable store on one SQLite file. Cheap to clone (shares the connection pools).
///
/// Writes go through `writer`, a pool of exactly one connection: SQLite admits one writer at
/// a time, and several connections racing for the write lock spend their time in the busy
/// handler's sleeps. One writer connection turns that contention into an async queue.
/// Reads use `pool` and, in WAL mode, never wait for the writer.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writer: SqlitePool,
}

impl SqliteStore {
    /// Open (creating the parent directory and the file if missing) and migrate the
    /// database at `path`. Safe to call on an up-to-date database, and from several
    /// processes on the same file.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::Io {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .connect_with(options.clone())
            .await?;
        migrate::run(&pool).await?;
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .connect_with(options)
            .await?;
        Ok(Self { pool, writer })
    }

    /// A private in-memory database, for tests and throwaway runs. Nothing survives the
    /// store being dropped.
    pub async fn in_memory() -> Result<Self, StoreError> {
        // Every SQLite connection to `:memory:` is a separate database, so the pool holds
        // exactly one connection and never retires it.
        let options = SqliteConnectOptions::new()
            .in_memory(true)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await?;
        Self::migrated(pool).await
    }

    async fn migrated(pool: SqlitePool) -> Result<Self, StoreError> {
        migrate::run(&pool).await?;
        Ok(Self {
            writer: pool.clone(),
            pool,
        })
    }

    /// The schema version recorded in the database (for diagnostics and tests).
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        migrate::current_version(&self.pool).await
    }

    /// The newest schema version this build can open.
    pub fn latest_schema_version() -> i64 {
        migrate::LATEST_VERSION
    }

    /// Close every connection, waiting for in-flight queries; for orderly shutdown (a crash
    /// without it loses nothing committed).
    pub async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }
}

impl ChatStore for SqliteStore {
    fn apply_batch(&self, chat_id: &str, batch: crate::ChatWriteBatch) -> StoreFuture<()> {
        Box::pin(crate::batch::apply(
            self.writer.clone(),
            chat_id.to_owned(),
            batch,
        ))
    }

    fn create_chat(&self, record: ChatRecord) -> StoreFuture<()> {
        Box::pin(chats::create(self.writer.clone(), record))
    }

    fn save_state(&self, chat_id: &str, state: ChatState) -> StoreFuture<()> {
        Box::pin(chats::save_state(
            self.writer.clone(),
            chat_id.to_owned(),
            state,
        ))
    }

    fn load_chat(&self, chat_id: &str) -> StoreFuture<Option<StoredChat>> {
        Box::pin(chats::load(self.pool.clone(), chat_id.to_owned()))
    }

    fn list_chats(
        &self,
        tenant: &str,
        user_id: &str,
        limit: u32,
        offset: u32,
    ) -> StoreFuture<Vec<StoredChat>> {
        Box::pin(chats::list(
            self.pool.clone(),
            tenant.to_owned(),
            user_id.to_owned(),
            limit,
            offset,
        ))
    }

    fn list_open_chats(&self) -> StoreFuture<Vec<StoredChat>> {
        Box::pin(chats::list_open(self.pool.clone()))
    }

    fn append_messages(&self, chat_id: &str, messages: Vec<StoredMessage>) -> StoreFuture<()> {
        Box::pin(messages::append(
            self.writer.clone(),
            chat_id.to_owned(),
            messages,
        ))
    }

    fn messages(&self, chat_id: &str, offset: u64, limit: u32) -> StoreFuture<Vec<StoredMessage>> {
        Box::pin(messages::page(
            self.pool.clone(),
            chat_id.to_owned(),
            offset,
            limit,
        ))
    }

    fn all_messages(&self, chat_id: &str) -> StoreFuture<Vec<StoredMessage>> {
        Box::pin(messages::all(self.pool.clone(), chat_id.to_owned()))
    }

    fn append_events(&self, chat_id: &str, events: Vec<StoredEvent>) -> StoreFuture<()> {
        Box::pin(events::append(
            self.writer.clone(),
            chat_id.to_owned(),
            events,
        ))
    }

    fn events_after(
        &self,
        chat_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> StoreFuture<Vec<StoredEvent>> {
        Box::pin(events::after(
            self.pool.clone(),
            chat_id.to_owned(),
            after_seq,
            limit,
        ))
    }

    fn last_seq(&self, chat_id: &str) -> StoreFuture<u64> {
        Box::pin(events::last_seq(self.pool.clone(), chat_id.to_owned()))
    }

    fn put_pending_ui(&self, chat_id: &str, record: PendingUiRecord) -> StoreFuture<()> {
        Box::pin(pending::put(
            self.writer.clone(),
            chat_id.to_owned(),
            record,
        ))
    }

    fn remove_pending_ui(&self, chat_id: &str, corr: &str) -> StoreFuture<bool> {
        Box::pin(pending::remove(
            self.writer.clone(),
            chat_id.to_owned(),
            corr.to_owned(),
        ))
    }

    fn pending_ui(&self, chat_id: &str) -> StoreFuture<Vec<PendingUiRecord>> {
        Box::pin(pending::list(self.pool.clone(), chat_id.to_owned()))
    }

    fn claim_tool(&self, chat_id: &str, invocation_key: &str) -> StoreFuture<ToolClaim> {
        Box::pin(tools::claim(
            self.writer.clone(),
            chat_id.to_owned(),
            invocation_key.to_owned(),
        ))
    }

    fn complete_tool(
        &self,
        chat_id: &str,
        invocation_key: &str,
        result: &Value,
    ) -> StoreFuture<()> {
        Box::pin(tools::complete(
            self.writer.clone(),
            chat_id.to_owned(),
            invocation_key.to_owned(),
            serde_json::to_string(result),
        ))
    }

    fn delete_chat(&self, chat_id: &str) -> StoreFuture<bool> {
        Box::pin(chats::delete(self.writer.clone(), chat_id.to_owned()))
    }

    fn put_secrets(&self, chat_id: &str, sealed: Vec<u8>) -> StoreFuture<()> {
        Box::pin(secrets::put(
            self.writer.clone(),
            chat_id.to_owned(),
            sealed,
        ))
    }

    fn load_secrets(&self, chat_id: &str) -> StoreFuture<Option<Vec<u8>>> {
        Box::pin(secrets::load(self.pool.clone(), chat_id.to_owned()))
    }

    fn delete_secrets(&self, chat_id: &str) -> StoreFuture<bool> {
        Box::pin(secrets::delete(self.writer.clone(), chat_id.to_owned()))
    }
}

impl TaskStore for SqliteStore {
    fn add<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        title: &'a str,
        description: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Task, tessera_tools::StoreError>> {
        Box::pin(
            async move { Ok(tasks::add(&self.writer, tenant, user, title, description).await?) },
        )
    }

    fn list<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        filter: TaskFilter,
    ) -> BoxFuture<'a, Result<Vec<Task>, tessera_tools::StoreError>> {
        Box::pin(async move { Ok(tasks::list(&self.pool, tenant, user, filter).await?) })
    }

    fn complete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Task>, tessera_tools::StoreError>> {
        Box::pin(async move { Ok(tasks::complete(&self.writer, tenant, user, task_id).await?) })
    }

    fn delete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Task>, tessera_tools::StoreError>> {
        Box::pin(async move { Ok(tasks::delete(&self.writer, tenant, user, task_id).await?) })
    }
}

impl ArtifactStore for SqliteStore {
    fn put<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        chat_id: &'a str,
        file_name: &'a str,
        bytes: Bytes,
    ) -> BoxFuture<'a, Result<ArtifactRef, tessera_tools::StoreError>> {
        Box::pin(async move {
            Ok(artifacts::put(&self.writer, tenant, user, chat_id, file_name, bytes).await?)
        })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        chat_id: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredArtifact>, tessera_tools::StoreError>> {
        Box::pin(async move { Ok(artifacts::get(&self.pool, tenant, user, chat_id, id).await?) })
    }
}
