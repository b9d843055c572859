//! [`SqliteStore`]: the SQLite implementation of [`ChatStore`], [`TaskStore`] and
//! [`ArtifactStore`].
//!
//! WHY SQLite: a single-node deployment gets durable chats with no extra service. The file
//! runs in WAL mode (readers never block the writer) with `synchronous=NORMAL` (a committed
//! transaction survives a process crash; a power loss can lose the last few commits but never
//! corrupts the file), foreign keys on, and a busy timeout so several connections, or several
//! processes, on one file wait for the write lock instead of failing. Write transactions
//! use `BEGIN IMMEDIATE` to take the write lock up front, which avoids SQLite's
//! read-then-upgrade `SQLITE_BUSY` failures.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use rusqlite::Connection;
use serde_json::Value;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tessera_tools::{ArtifactRef, ArtifactStore, StoredArtifact, Task, TaskFilter, TaskStore};

use crate::db::Db;
use crate::store::{Completion, StoreFuture};
use crate::writer::{Answer, Writer};
use crate::{
    ChatRecord, ChatState, ChatStore, ChatWriteBatch, PendingUiRecord, StoreError, StoredChat,
    StoredEvent, StoredMessage, ToolClaim, artifacts, batch, chats, log, migrate, pending, secrets,
    tasks, tools,
};

/// How long a connection waits for another writer's lock before failing with "busy".
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections per store on a file: SQLite has one writer at a time, extra connections
/// serve concurrent reads.
const MAX_CONNECTIONS: u32 = 8;

/// Durable store on one SQLite file. Cheap to clone (shares the connection pools).
///
/// Writes go to `writer`, one thread with the only write connection that group-commits the
/// writes of all chats (see the `writer` module). Reads use `pool` and, in WAL mode, never
/// wait for the writer.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writer: Writer,
    /// Most bytes of generated files (artifacts) one tenant may keep; `None` = no limit.
    tenant_file_quota: Option<u64>,
    /// Set for [`SqliteStore::in_memory`]: removes the throwaway file with the last clone.
    _scratch: Option<Arc<ScratchFile>>,
}

impl SqliteStore {
    /// Open (creating the parent directory and the file if missing) and migrate the
    /// database at `path`. Safe to call on an up-to-date database, and from several
    /// processes on the same file.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|source| crate::sqlite_error::setup_io(parent, source))?;
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
            .connect_with(options)
            .await?;
        migrate::run(&pool).await?;
        let writer = Writer::start(path, BUSY_TIMEOUT)?;
        Ok(Self {
            pool,
            writer,
            tenant_file_quota: None,
            _scratch: None,
        })
    }

    /// Caps the bytes of generated files each tenant may keep (0 = no limit): a file that
    /// would go over is refused with [`StoreError::QuotaExceeded`], checked and stored in one
    /// writer step so concurrent files cannot overshoot together.
    pub fn with_tenant_file_quota(mut self, max_bytes: u64) -> Self {
        self.tenant_file_quota = (max_bytes > 0).then_some(max_bytes);
        self
    }

    /// A private throwaway database, for tests and throwaway runs: a fresh file in the
    /// system temp directory, removed when the last clone of the store is dropped.
    ///
    /// WHY a file and not `:memory:`: the writer thread and the read pool are separate
    /// connections, and every connection to `:memory:` is a database of its own.
    pub async fn in_memory() -> Result<Self, StoreError> {
        let path = std::env::temp_dir().join(format!(
            "tessera-scratch-{}.sqlite3",
            uuid::Uuid::new_v4().simple()
        ));
        let scratch = Arc::new(ScratchFile(path.clone()));
        let mut store = Self::open(&path).await?;
        store._scratch = Some(scratch);
        Ok(store)
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

/// A throwaway database file (and its WAL/shared-memory companions), deleted on drop.
#[derive(Debug)]
struct ScratchFile(PathBuf);

impl Drop for ScratchFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-claims"] {
            let mut name = self.0.clone().into_os_string();
            name.push(suffix);
            // Best effort: a leftover temp file is harmless.
            let _ = std::fs::remove_file(name);
        }
    }
}

impl ChatStore for SqliteStore {
    /// The batch's `epoch` is ignored: a SQLite file has one node, so there is no lease to
    /// fence.
    fn apply_batch(&self, chat_id: &str, batch: Arc<ChatWriteBatch>) -> StoreFuture<()> {
        let chat_id = chat_id.to_owned();
        // Unhurried: on one node a flush is write-behind (clients already have its events).
        Box::pin(
            self.writer
                .call_unhurried(move |conn| batch::apply(conn, &chat_id, &batch)),
        )
    }

    /// Answered by the writer thread itself, after the commit.
    fn apply_batch_then(&self, chat_id: &str, batch: Arc<ChatWriteBatch>, done: Completion<()>) {
        let chat_id = chat_id.to_owned();
        self.writer.call_unhurried_then(
            move |conn| batch::apply(conn, &chat_id, &batch),
            Answer::to(done),
        );
    }

    fn create_chat(&self, record: ChatRecord) -> StoreFuture<()> {
        Box::pin(self.writer.call(move |conn| chats::create(conn, &record)))
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

    fn delete_chat(&self, chat_id: &str) -> StoreFuture<bool> {
        let chat_id = chat_id.to_owned();
        Box::pin(self.writer.call(move |conn| chats::delete(conn, &chat_id)))
    }

    fn completed_chats_before(&self, before_ms: i64, limit: u32) -> StoreFuture<Vec<String>> {
        Box::pin(chats::completed_before(self.pool.clone(), before_ms, limit))
    }

    fn count_open_chats(&self, tenant: &str) -> StoreFuture<u64> {
        Box::pin(chats::count_open(self.pool.clone(), tenant.to_owned()))
    }

    fn all_messages(&self, chat_id: &str) -> StoreFuture<Vec<StoredMessage>> {
        Box::pin(log::messages_from(
            self.pool.clone(),
            chat_id.to_owned(),
            0,
            None,
        ))
    }

    fn events_after(
        &self,
        chat_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> StoreFuture<Vec<StoredEvent>> {
        Box::pin(log::events_after(
            self.pool.clone(),
            chat_id.to_owned(),
            after_seq,
            limit,
        ))
    }

    fn last_seq_taken(&self, chat_id: &str) -> StoreFuture<u64> {
        Box::pin(log::last_seq_taken(self.pool.clone(), chat_id.to_owned()))
    }

    fn pending_ui(&self, chat_id: &str) -> StoreFuture<Vec<PendingUiRecord>> {
        Box::pin(pending::list(self.pool.clone(), chat_id.to_owned()))
    }

    /// `epoch` is ignored: a SQLite file has one node, so there is no lease to fence.
    fn complete_tool(
        &self,
        chat_id: &str,
        invocation_key: &str,
        _epoch: Option<i64>,
    ) -> StoreFuture<()> {
        self.complete_tool_with_result(chat_id, invocation_key, &Value::Null)
    }

    /// `epoch` is ignored, as for [`ChatStore::complete_tool`].
    fn complete_tool_recording(
        &self,
        chat_id: &str,
        invocation_key: &str,
        result: &Value,
        _epoch: Option<i64>,
    ) -> StoreFuture<()> {
        self.complete_tool_with_result(chat_id, invocation_key, result)
    }

    /// Answered by the writer thread itself; `epoch` is ignored, as for
    /// [`ChatStore::complete_tool`].
    fn complete_tool_then(
        &self,
        chat_id: &str,
        invocation_key: &str,
        result: Option<&Value>,
        _epoch: Option<i64>,
        done: Completion<()>,
    ) {
        match Self::completion_job(chat_id, invocation_key, result.unwrap_or(&Value::Null)) {
            Ok(work) => self.writer.call_unhurried_then(work, Answer::to(done)),
            Err(error) => done(Err(error)),
        }
    }

    /// `epoch` is ignored, as for [`ChatStore::complete_tool`].
    fn claim_tool(
        &self,
        chat_id: &str,
        invocation_key: &str,
        _epoch: Option<i64>,
    ) -> StoreFuture<ToolClaim> {
        Box::pin(
            self.writer
                .claim(chat_id.to_owned(), invocation_key.to_owned()),
        )
    }

    /// Answered by the writer thread itself; `epoch` is ignored, as for
    /// [`ChatStore::complete_tool`].
    fn claim_tool_then(
        &self,
        chat_id: &str,
        invocation_key: &str,
        _epoch: Option<i64>,
        done: Completion<ToolClaim>,
    ) {
        self.writer.claim_then(
            chat_id.to_owned(),
            invocation_key.to_owned(),
            Answer::to(done),
        );
    }

    fn put_secrets(&self, chat_id: &str, sealed: Vec<u8>) -> StoreFuture<()> {
        let chat_id = chat_id.to_owned();
        Box::pin(
            self.writer
                .call(move |conn| secrets::put(conn, &chat_id, &sealed)),
        )
    }

    fn load_secrets(&self, chat_id: &str) -> StoreFuture<Option<Vec<u8>>> {
        Box::pin(secrets::load(self.pool.clone(), chat_id.to_owned()))
    }

    fn delete_secrets(&self, chat_id: &str) -> StoreFuture<bool> {
        let chat_id = chat_id.to_owned();
        Box::pin(
            self.writer
                .call(move |conn| secrets::delete(conn, &chat_id)),
        )
    }
}

impl crate::WorkflowVersionStore for SqliteStore {
    fn put_workflow_version(&self, version: crate::WorkflowVersion) -> StoreFuture<bool> {
        Box::pin(
            self.writer
                .call(move |conn| crate::workflow_versions::sqlite_put(conn, &version)),
        )
    }

    fn workflow_versions(&self) -> StoreFuture<Vec<crate::WorkflowVersion>> {
        Box::pin(crate::workflow_versions::sqlite_all(self.pool.clone()))
    }
}

/// Finer-grained operations than [`ChatStore`] offers: each is one write or read of its own.
impl SqliteStore {
    /// Replace the chat's state. Unknown chat: [`StoreError::NotFound`].
    pub fn save_state(&self, chat_id: &str, state: ChatState) -> StoreFuture<()> {
        self.apply_batch(
            chat_id,
            Arc::new(ChatWriteBatch {
                state: Some(Arc::new(state)),
                ..ChatWriteBatch::default()
            }),
        )
    }

    /// Append transcript messages in one transaction. An `idx` that already exists fails the
    /// whole batch with [`StoreError::Conflict`]; nothing is overwritten.
    pub fn append_messages(&self, chat_id: &str, messages: Vec<StoredMessage>) -> StoreFuture<()> {
        self.apply_batch(
            chat_id,
            Arc::new(ChatWriteBatch {
                messages,
                ..ChatWriteBatch::default()
            }),
        )
    }

    /// Up to `limit` messages with `idx >= offset`, ordered by idx.
    pub fn messages(
        &self,
        chat_id: &str,
        offset: u64,
        limit: u32,
    ) -> StoreFuture<Vec<StoredMessage>> {
        Box::pin(log::messages_from(
            self.pool.clone(),
            chat_id.to_owned(),
            offset,
            Some(limit),
        ))
    }

    /// Append events in one transaction. A `seq` that already exists fails the whole batch
    /// with [`StoreError::Conflict`] and leaves the log unchanged.
    pub fn append_events(&self, chat_id: &str, events: Vec<StoredEvent>) -> StoreFuture<()> {
        self.apply_batch(
            chat_id,
            Arc::new(ChatWriteBatch {
                events,
                ..ChatWriteBatch::default()
            }),
        )
    }

    /// Highest stored seq of the chat, 0 when the log is empty.
    pub fn last_seq(&self, chat_id: &str) -> StoreFuture<u64> {
        Box::pin(log::last_seq(self.pool.clone(), chat_id.to_owned()))
    }

    /// Record (or replace, same `corr`) a pending UI call.
    pub fn put_pending_ui(&self, chat_id: &str, record: PendingUiRecord) -> StoreFuture<()> {
        self.apply_batch(
            chat_id,
            Arc::new(ChatWriteBatch {
                put_pending: vec![record],
                ..ChatWriteBatch::default()
            }),
        )
    }

    /// Forget a pending UI call; `true` when it existed.
    pub fn remove_pending_ui(&self, chat_id: &str, corr: &str) -> StoreFuture<bool> {
        let (chat_id, corr) = (chat_id.to_owned(), corr.to_owned());
        Box::pin(
            self.writer
                .call(move |conn| pending::remove(conn, &chat_id, &corr)),
        )
    }

    /// Record the result of a claimed invocation (the engine records agent tools' results: see
    /// [`ChatStore::complete_tool_recording`]). Not claimed, or already completed: [`StoreError::Conflict`].
    pub fn complete_tool_with_result(
        &self,
        chat_id: &str,
        invocation_key: &str,
        result: &Value,
    ) -> StoreFuture<()> {
        match Self::completion_job(chat_id, invocation_key, result) {
            // Unhurried: the engine does not wait on a completion (see `DedupCache`).
            Ok(work) => Box::pin(self.writer.call_unhurried(work)),
            Err(error) => Box::pin(std::future::ready(Err(error))),
        }
    }

    /// The writer's job that completes `invocation_key` with `result` (`null`: none).
    fn completion_job(
        chat_id: &str,
        invocation_key: &str,
        result: &Value,
    ) -> Result<impl Fn(&Db<'_>) -> Result<(), StoreError> + Send + 'static, StoreError> {
        let result = tessera_json::to_string(result)?;
        let (chat_id, key) = (chat_id.to_owned(), invocation_key.to_owned());
        Ok(move |db: &Db<'_>| tools::complete(db, &chat_id, &key, &result))
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
        let (tenant, user, title) = (tenant.to_owned(), user.to_owned(), title.to_owned());
        let description = description.map(str::to_owned);
        let added = self
            .writer
            .call(move |conn| tasks::add(conn, &tenant, &user, &title, description.as_deref()));
        Box::pin(async move { Ok(added.await?) })
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
        self.change_task(tenant, user, task_id, tasks::complete)
    }

    fn delete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Task>, tessera_tools::StoreError>> {
        self.change_task(tenant, user, task_id, tasks::delete)
    }
}

/// A write to one owner's task that returns the task, if the owner has it.
type TaskChange = fn(&Connection, &str, &str, &str) -> Result<Option<Task>, StoreError>;

impl SqliteStore {
    fn change_task<'a>(
        &self,
        tenant: &str,
        user: &str,
        task_id: &str,
        change: TaskChange,
    ) -> BoxFuture<'a, Result<Option<Task>, tessera_tools::StoreError>> {
        let (tenant, user, id) = (tenant.to_owned(), user.to_owned(), task_id.to_owned());
        let changed = self
            .writer
            .call(move |conn| change(conn, &tenant, &user, &id));
        Box::pin(async move { Ok(changed.await?) })
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
        let (tenant, user) = (tenant.to_owned(), user.to_owned());
        let (chat_id, file_name) = (chat_id.to_owned(), file_name.to_owned());
        let quota = self.tenant_file_quota;
        let stored = self.writer.call(move |conn| {
            if let Some(max) = quota {
                artifacts::check_quota(conn, &tenant, bytes.len(), max)?;
            }
            artifacts::put(conn, &tenant, &user, &chat_id, &file_name, &bytes)
        });
        Box::pin(async move { Ok(stored.await?) })
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
