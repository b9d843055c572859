//! [`PgStore`]: the PostgreSQL implementation of [`ChatStore`], [`LeaseStore`],
//! [`TaskStore`] and [`ArtifactStore`], for deployments of several nodes on one database.
//!
//! WHY a runtime of its own: the pool's sockets belong to the tokio runtime that opened them.
//! The engine runs on many single-threaded actix arbiters; if a socket opened on one arbiter
//! were awaited on another, its wake-ups would wait for the first arbiter's loop. All of the
//! store's I/O runs on a small runtime owned by the store ("tessera-store-pg" threads), and
//! callers on any runtime (or none) await a channel.
//!
//! Writes go to the group-commit writer (`pg/writer.rs`, `pg/merged.rs`), reads to the pool. Every statement
//! is prepared once per connection (sqlx caches them); the `sqlx` macros are not used, so
//! builds need no database.

mod merged;
mod migrate;
mod reads;
mod writer;
mod writes;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::Value;
use sqlx::PgPool;
use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tessera_tools::{ArtifactRef, ArtifactStore, StoredArtifact, Task, TaskFilter, TaskStore};

use crate::artifacts::{NewArtifact, within_quota};
use crate::convert::{now_ms, sql_to_u64};
use crate::store::StoreFuture;
use crate::{
    ChatRecord, ChatStore, ChatWriteBatch, Lease, LeaseStore, PendingUiRecord, StoreError,
    StoredChat, StoredEvent, StoredMessage, ToolClaim,
};
use writer::Writer;
use writes::{Done, Write};

/// Connections of the group-commit writer (`pg/writer.rs`: one, on purpose).
const WRITER_CONNECTIONS: u32 = 1;
/// Connections for reads, leases, tasks and artifacts, besides the writer's.
const OTHER_CONNECTIONS: u32 = 6;
/// How long a call waits for a free (or new) connection before failing as transient.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a statement may run (a lock held by a hung peer, say) before it fails as
/// transient and is retried.
const STATEMENT_TIMEOUT: &str = "30s";
/// Threads of the store's runtime.
const RUNTIME_THREADS: usize = 2;

/// Durable store on a PostgreSQL database (or one schema of it). Cheap to clone.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    writer: Writer,
    runtime: Arc<StoreRuntime>,
    /// Most bytes of generated files (artifacts) one tenant may keep; `None` = no limit.
    tenant_file_quota: Option<u64>,
}

impl PgStore {
    /// Connect to `url` (`postgres://user[:password]@host[:port]/database[?options]`; a
    /// schema other than `public` via `?options=-c%20search_path%3Dname`) and bring the schema
    /// up to date. Failing to connect or migrate is [`StoreError::Setup`]; the error never
    /// contains the password.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Setup(format!("invalid PostgreSQL url: {e}")))?;
        Self::connect_with(options).await
    }

    /// [`PgStore::connect`] with options built in code.
    pub async fn connect_with(options: PgConnectOptions) -> Result<Self, StoreError> {
        let runtime = Arc::new(StoreRuntime::start()?);
        let options = options.options([("statement_timeout", STATEMENT_TIMEOUT)]);
        let handle = runtime.handle();
        let (pool, writer) = handle
            .spawn(async move {
                let pool = PgPoolOptions::new()
                    .max_connections(WRITER_CONNECTIONS + OTHER_CONNECTIONS)
                    .acquire_timeout(ACQUIRE_TIMEOUT)
                    .connect_with(options)
                    .await
                    .map_err(|e| StoreError::Setup(format!("cannot connect to PostgreSQL: {e}")))?;
                migrate::run(&pool).await?;
                let writer = Writer::start(&pool);
                Ok::<_, StoreError>((pool, writer))
            })
            .await
            .map_err(|e| StoreError::Setup(format!("store runtime failed: {e}")))??;
        Ok(Self {
            pool,
            writer,
            runtime,
            tenant_file_quota: None,
        })
    }

    /// Caps the bytes of generated files each tenant may keep (0 = no limit): a file that
    /// would go over is refused with [`StoreError::QuotaExceeded`]. The check and the insert
    /// run in one transaction holding a per-tenant advisory lock, so concurrent files (from
    /// any node) cannot overshoot together.
    pub fn with_tenant_file_quota(mut self, max_bytes: u64) -> Self {
        self.tenant_file_quota = (max_bytes > 0).then_some(max_bytes);
        self
    }

    /// The schema version recorded in the database (for diagnostics and tests).
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        let pool = self.pool.clone();
        self.on_runtime(async move { migrate::current_version(&pool).await })
            .await
    }

    /// The newest schema version this build can open.
    pub fn latest_schema_version() -> i64 {
        migrate::LATEST_VERSION
    }

    /// Commit every queued write, then close every connection; for orderly shutdown (a crash
    /// without it loses nothing committed). Later calls fail with [`StoreError::Closed`].
    pub async fn close(&self) {
        let (writer, pool) = (self.writer.clone(), self.pool.clone());
        let _ = self
            .on_runtime(async move {
                writer.close().await;
                pool.close().await;
                Ok(())
            })
            .await;
    }

    /// Runs `work` on the store's runtime (see the module docs).
    fn on_runtime<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> StoreFuture<T> {
        let task = self.runtime.handle().spawn(work);
        Box::pin(async move { task.await.unwrap_or(Err(StoreError::Closed)) })
    }

    /// Queues a write (in call order, per chat) and maps its answer.
    fn write<T: Send + 'static>(
        &self,
        write: Write,
        answer: fn(Done) -> Option<T>,
    ) -> StoreFuture<T> {
        let done = self.writer.submit(write);
        Box::pin(async move {
            answer(done.await?).ok_or_else(|| {
                StoreError::Corrupt("the store writer answered a different kind of write".into())
            })
        })
    }

    fn write_unit(&self, write: Write) -> StoreFuture<()> {
        self.write(write, |done| matches!(done, Done::Unit).then_some(()))
    }

    fn write_existed(&self, write: Write) -> StoreFuture<bool> {
        self.write(write, |done| match done {
            Done::Existed(existed) => Some(existed),
            _ => None,
        })
    }
}

/// The store's own tokio runtime, shut down (without blocking) with the last clone.
#[derive(Debug)]
struct StoreRuntime(Option<tokio::runtime::Runtime>);

impl StoreRuntime {
    fn start() -> Result<Self, StoreError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("tessera-store-pg")
            .enable_all()
            .build()
            .map(|runtime| Self(Some(runtime)))
            .map_err(|e| StoreError::Setup(format!("cannot start the store runtime: {e}")))
    }

    fn handle(&self) -> tokio::runtime::Handle {
        match &self.0 {
            Some(runtime) => runtime.handle().clone(),
            // Only `drop` takes the runtime out, and nothing runs after it.
            None => unreachable!("the store runtime is alive until dropped"),
        }
    }
}

impl Drop for StoreRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            // Dropping a runtime may not block inside another runtime (tests, actix).
            runtime.shutdown_background();
        }
    }
}

impl ChatStore for PgStore {
    fn create_chat(&self, record: ChatRecord) -> StoreFuture<()> {
        self.write_unit(Write::CreateChat(record))
    }

    fn apply_batch(&self, chat_id: &str, batch: Arc<ChatWriteBatch>) -> StoreFuture<()> {
        self.write_unit(Write::Batch {
            chat_id: chat_id.to_owned(),
            batch,
        })
    }

    fn load_chat(&self, chat_id: &str) -> StoreFuture<Option<StoredChat>> {
        self.on_runtime(reads::load_chat(self.pool.clone(), chat_id.to_owned()))
    }

    fn list_chats(
        &self,
        tenant: &str,
        user_id: &str,
        limit: u32,
        offset: u32,
    ) -> StoreFuture<Vec<StoredChat>> {
        self.on_runtime(reads::list_chats(
            self.pool.clone(),
            tenant.to_owned(),
            user_id.to_owned(),
            limit,
            offset,
        ))
    }

    fn list_open_chats(&self) -> StoreFuture<Vec<StoredChat>> {
        self.on_runtime(reads::list_open_chats(self.pool.clone()))
    }

    fn all_messages(&self, chat_id: &str) -> StoreFuture<Vec<StoredMessage>> {
        self.on_runtime(reads::messages(
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
        self.on_runtime(reads::events_after(
            self.pool.clone(),
            chat_id.to_owned(),
            after_seq,
            limit,
        ))
    }

    fn last_seq_taken(&self, chat_id: &str) -> StoreFuture<u64> {
        self.on_runtime(reads::last_seq_taken(self.pool.clone(), chat_id.to_owned()))
    }

    fn pending_ui(&self, chat_id: &str) -> StoreFuture<Vec<PendingUiRecord>> {
        self.on_runtime(reads::pending_ui(self.pool.clone(), chat_id.to_owned()))
    }

    fn claim_tool(
        &self,
        chat_id: &str,
        invocation_key: &str,
        epoch: Option<i64>,
    ) -> StoreFuture<ToolClaim> {
        self.write(
            Write::ClaimTool {
                chat_id: chat_id.to_owned(),
                key: invocation_key.to_owned(),
                epoch,
            },
            |done| match done {
                Done::Claim(claim) => Some(claim),
                _ => None,
            },
        )
    }

    fn complete_tool(
        &self,
        chat_id: &str,
        invocation_key: &str,
        epoch: Option<i64>,
    ) -> StoreFuture<()> {
        self.complete_tool_with_result(chat_id, invocation_key, &Value::Null, epoch)
    }

    fn complete_tool_recording(
        &self,
        chat_id: &str,
        invocation_key: &str,
        result: &Value,
        epoch: Option<i64>,
    ) -> StoreFuture<()> {
        self.complete_tool_with_result(chat_id, invocation_key, result, epoch)
    }

    fn put_secrets(&self, chat_id: &str, sealed: Vec<u8>) -> StoreFuture<()> {
        self.write_unit(Write::PutSecrets {
            chat_id: chat_id.to_owned(),
            sealed,
        })
    }

    fn load_secrets(&self, chat_id: &str) -> StoreFuture<Option<Vec<u8>>> {
        self.on_runtime(reads::load_secrets(self.pool.clone(), chat_id.to_owned()))
    }

    fn delete_secrets(&self, chat_id: &str) -> StoreFuture<bool> {
        self.write_existed(Write::DeleteSecrets {
            chat_id: chat_id.to_owned(),
        })
    }

    /// Deletes the lease too, so a recreated chat starts from epoch 1.
    fn delete_chat(&self, chat_id: &str) -> StoreFuture<bool> {
        self.write_existed(Write::DeleteChat {
            chat_id: chat_id.to_owned(),
        })
    }

    fn completed_chats_before(&self, before_ms: i64, limit: u32) -> StoreFuture<Vec<String>> {
        self.on_runtime(reads::completed_chats_before(
            self.pool.clone(),
            before_ms,
            limit,
        ))
    }

    fn count_open_chats(&self, tenant: &str) -> StoreFuture<u64> {
        self.on_runtime(reads::count_open_chats(
            self.pool.clone(),
            tenant.to_owned(),
        ))
    }
}

impl crate::WorkflowVersionStore for PgStore {
    fn put_workflow_version(&self, version: crate::WorkflowVersion) -> StoreFuture<bool> {
        self.on_runtime(crate::workflow_versions::pg_put(self.pool.clone(), version))
    }

    fn workflow_versions(&self) -> StoreFuture<Vec<crate::WorkflowVersion>> {
        self.on_runtime(crate::workflow_versions::pg_all(self.pool.clone()))
    }
}

/// Finer-grained operations than [`ChatStore`] offers, as on [`crate::SqliteStore`].
impl PgStore {
    /// Up to `limit` messages with `idx >= offset`, ordered by idx.
    pub fn messages(
        &self,
        chat_id: &str,
        offset: u64,
        limit: u32,
    ) -> StoreFuture<Vec<StoredMessage>> {
        self.on_runtime(reads::messages(
            self.pool.clone(),
            chat_id.to_owned(),
            offset,
            Some(limit),
        ))
    }

    /// Highest stored seq of the chat, 0 when the log is empty.
    pub fn last_seq(&self, chat_id: &str) -> StoreFuture<u64> {
        self.on_runtime(reads::last_seq(self.pool.clone(), chat_id.to_owned()))
    }

    /// Forget a pending UI call; `true` when it existed.
    pub fn remove_pending_ui(&self, chat_id: &str, corr: &str) -> StoreFuture<bool> {
        self.write_existed(Write::RemovePending {
            chat_id: chat_id.to_owned(),
            corr: corr.to_owned(),
        })
    }

    /// Record the result of a claimed invocation (the engine records agent tools' results: see
    /// [`ChatStore::complete_tool_recording`]). Not claimed, or already completed:
    /// [`StoreError::Conflict`]; a stale `epoch`: [`StoreError::Fenced`].
    pub fn complete_tool_with_result(
        &self,
        chat_id: &str,
        invocation_key: &str,
        result: &Value,
        epoch: Option<i64>,
    ) -> StoreFuture<()> {
        let result = match serde_json::to_string(result) {
            Ok(text) => text,
            Err(e) => return Box::pin(std::future::ready(Err(e.into()))),
        };
        self.write_unit(Write::CompleteTool {
            chat_id: chat_id.to_owned(),
            key: invocation_key.to_owned(),
            result,
            epoch,
        })
    }
}

/// Lease rows: see [`LeaseStore`]. Each call is one autocommitted statement on the pool (not
/// in a writer's group: `now()` is the time of the statement, and a lease change is durable
/// when it returns). Time is the database's: `now()`, never the node's clock.
impl LeaseStore for PgStore {
    fn acquire_lease(&self, chat_id: &str, node: &str, ttl_ms: i64) -> StoreFuture<Option<Lease>> {
        let (pool, chat_id, node) = (self.pool.clone(), chat_id.to_owned(), node.to_owned());
        self.on_runtime(async move {
            // Insert epoch 1; or keep the epoch when `node` holds a live lease; or bump it
            // when the lease has expired (whoever held it). A live lease of another node is
            // left alone and nothing is returned.
            // `before` is the row as the statement found it (whether it was parked).
            let row = sqlx::query(
                "WITH before AS (SELECT node FROM chat_leases WHERE chat_id = $1) \
                 INSERT INTO chat_leases AS l (chat_id, node, epoch, expires_at) \
                 VALUES ($1, $2, 1, now() + $3 * INTERVAL '1 millisecond') \
                 ON CONFLICT (chat_id) DO UPDATE SET node = EXCLUDED.node, \
                    epoch = l.epoch + CASE WHEN l.node = EXCLUDED.node AND l.expires_at > now() \
                        THEN 0 ELSE 1 END, \
                    expires_at = EXCLUDED.expires_at \
                 WHERE l.expires_at <= now() OR l.node = EXCLUDED.node \
                 RETURNING chat_id, node, epoch, \
                    (EXTRACT(EPOCH FROM expires_at) * 1000)::BIGINT AS expires_at_ms, \
                    COALESCE((SELECT node FROM before) = $4, false) AS was_parked",
            )
            .bind(&chat_id)
            .bind(&node)
            .bind(ttl_ms)
            .bind(crate::lease::PARKED_NODE)
            .fetch_optional(&pool)
            .await?;
            row.map(|row| {
                Ok(Lease {
                    chat_id: row.try_get("chat_id")?,
                    node: row.try_get("node")?,
                    epoch: row.try_get("epoch")?,
                    expires_at_ms: row.try_get("expires_at_ms")?,
                    was_parked: row.try_get("was_parked")?,
                })
            })
            .transpose()
        })
    }

    fn renew_leases(
        &self,
        node: &str,
        held: &[(String, i64)],
        ttl_ms: i64,
    ) -> StoreFuture<Vec<String>> {
        let pool = self.pool.clone();
        let node = node.to_owned();
        let (chat_ids, epochs): (Vec<String>, Vec<i64>) = held.iter().cloned().unzip();
        self.on_runtime(async move {
            if chat_ids.is_empty() {
                return Ok(Vec::new());
            }
            let renewed: Vec<String> = sqlx::query(
                // Rows locked in chat id order, as fenced write groups lock them (no
                // deadlock between a renewal and a group).
                "WITH held AS (SELECT l.chat_id FROM chat_leases AS l \
                    JOIN UNNEST($2::TEXT[], $3::BIGINT[]) AS h(chat_id, epoch) \
                    ON l.chat_id = h.chat_id AND l.epoch = h.epoch AND l.node = $1 \
                    ORDER BY l.chat_id FOR UPDATE OF l) \
                 UPDATE chat_leases AS l SET expires_at = now() + $4 * INTERVAL '1 millisecond' \
                 FROM held WHERE l.chat_id = held.chat_id \
                 RETURNING l.chat_id",
            )
            .bind(&node)
            .bind(&chat_ids)
            .bind(&epochs)
            .bind(ttl_ms)
            .fetch_all(&pool)
            .await?
            .iter()
            .map(|row| row.try_get("chat_id"))
            .collect::<Result<_, _>>()?;
            Ok(chat_ids
                .into_iter()
                .filter(|id| !renewed.contains(id))
                .collect())
        })
    }

    fn release_lease(&self, chat_id: &str, node: &str, epoch: i64) -> StoreFuture<()> {
        let (pool, chat_id, node) = (self.pool.clone(), chat_id.to_owned(), node.to_owned());
        self.on_runtime(async move {
            sqlx::query(
                "UPDATE chat_leases SET expires_at = now() \
                 WHERE chat_id = $1 AND node = $2 AND epoch = $3",
            )
            .bind(&chat_id)
            .bind(&node)
            .bind(epoch)
            .execute(&pool)
            .await?;
            Ok(())
        })
    }

    fn park_leases(&self, node: &str, held: &[(String, i64)]) -> StoreFuture<()> {
        let pool = self.pool.clone();
        let node = node.to_owned();
        let (chat_ids, epochs): (Vec<String>, Vec<i64>) = held.iter().cloned().unzip();
        self.on_runtime(async move {
            if chat_ids.is_empty() {
                return Ok(());
            }
            sqlx::query(
                // Rows locked in chat id order, as renewals and fenced write groups lock them.
                "WITH held AS (SELECT l.chat_id FROM chat_leases AS l \
                    JOIN UNNEST($2::TEXT[], $3::BIGINT[]) AS h(chat_id, epoch) \
                    ON l.chat_id = h.chat_id AND l.epoch = h.epoch AND l.node = $1 \
                    ORDER BY l.chat_id FOR UPDATE OF l) \
                 UPDATE chat_leases AS l SET node = $4, expires_at = now() \
                 FROM held WHERE l.chat_id = held.chat_id",
            )
            .bind(&node)
            .bind(&chat_ids)
            .bind(&epochs)
            .bind(crate::lease::PARKED_NODE)
            .execute(&pool)
            .await?;
            Ok(())
        })
    }

    fn orphaned_chats(&self, limit: i64) -> StoreFuture<Vec<String>> {
        let pool = self.pool.clone();
        self.on_runtime(async move {
            let rows = sqlx::query(
                "SELECT c.chat_id FROM chats c LEFT JOIN chat_leases l ON l.chat_id = c.chat_id \
                 WHERE c.is_open AND (l.chat_id IS NULL OR (l.expires_at <= now() AND l.node <> $2)) \
                 ORDER BY c.created_at_ms, c.row_no LIMIT $1",
            )
            .bind(limit)
            .bind(crate::lease::PARKED_NODE)
            .fetch_all(&pool)
            .await?;
            Ok(rows
                .iter()
                .map(|row| row.try_get("chat_id"))
                .collect::<Result<_, _>>()?)
        })
    }
}

/// Tasks are not chat writes: each is one autocommitted statement on the pool.
impl TaskStore for PgStore {
    fn add<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        title: &'a str,
        description: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Task, tessera_tools::StoreError>> {
        let pool = self.pool.clone();
        let (tenant, user, title) = (tenant.to_owned(), user.to_owned(), title.to_owned());
        let description = description.map(str::to_owned);
        let added = self.on_runtime(async move {
            let id = crate::tasks::new_task_id();
            let created = now_ms();
            sqlx::query(
                "INSERT INTO tasks (id, tenant, user_id, title, description, completed, \
                 created_at_ms) VALUES ($1, $2, $3, $4, $5, FALSE, $6)",
            )
            .bind(&id)
            .bind(&tenant)
            .bind(&user)
            .bind(&title)
            .bind(&description)
            .bind(created)
            .execute(&pool)
            .await?;
            Ok(Task {
                id,
                title,
                description,
                completed: false,
                created_at_ms: sql_to_u64(created, "task created_at_ms")?,
            })
        });
        Box::pin(async move { Ok(added.await?) })
    }

    fn list<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        filter: TaskFilter,
    ) -> BoxFuture<'a, Result<Vec<Task>, tessera_tools::StoreError>> {
        let listed = self.on_runtime(reads::list_tasks(
            self.pool.clone(),
            tenant.to_owned(),
            user.to_owned(),
            filter,
        ));
        Box::pin(async move { Ok(listed.await?) })
    }

    fn complete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Task>, tessera_tools::StoreError>> {
        self.change_task(
            "UPDATE tasks SET completed = TRUE WHERE id = $1 AND tenant = $2 AND user_id = $3 \
             RETURNING id, title, description, completed, created_at_ms",
            tenant,
            user,
            task_id,
        )
    }

    fn delete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Task>, tessera_tools::StoreError>> {
        self.change_task(
            "DELETE FROM tasks WHERE id = $1 AND tenant = $2 AND user_id = $3 \
             RETURNING id, title, description, completed, created_at_ms",
            tenant,
            user,
            task_id,
        )
    }
}

impl PgStore {
    /// A write to one owner's task whose `RETURNING` clause yields the task, if the owner
    /// has it.
    fn change_task<'a>(
        &self,
        sql: &'static str,
        tenant: &str,
        user: &str,
        task_id: &str,
    ) -> BoxFuture<'a, Result<Option<Task>, tessera_tools::StoreError>> {
        let pool = self.pool.clone();
        let (tenant, user, id) = (tenant.to_owned(), user.to_owned(), task_id.to_owned());
        let changed = self.on_runtime(async move {
            let row = sqlx::query(sql)
                .bind(&id)
                .bind(&tenant)
                .bind(&user)
                .fetch_optional(&pool)
                .await?;
            row.as_ref().map(crate::rows::task).transpose()
        });
        Box::pin(async move { Ok(changed.await?) })
    }
}

impl ArtifactStore for PgStore {
    fn put<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        chat_id: &'a str,
        file_name: &'a str,
        bytes: Bytes,
    ) -> BoxFuture<'a, Result<ArtifactRef, tessera_tools::StoreError>> {
        let pool = self.pool.clone();
        let (tenant, user) = (tenant.to_owned(), user.to_owned());
        let (chat_id, file_name) = (chat_id.to_owned(), file_name.to_owned());
        let quota = self.tenant_file_quota;
        let stored = self.on_runtime(async move {
            let new = NewArtifact::of(&bytes)?;
            let mut tx = pool.begin().await?;
            if let Some(max) = quota {
                // Serialises the tenant's file writes until commit; other tenants don't wait.
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                    .bind(&tenant)
                    .execute(&mut *tx)
                    .await?;
                let used: i64 = sqlx::query_scalar(
                    "SELECT COALESCE(SUM(size), 0)::BIGINT FROM artifacts WHERE tenant = $1",
                )
                .bind(&tenant)
                .fetch_one(&mut *tx)
                .await?;
                within_quota(used, bytes.len(), max)?;
            }
            sqlx::query(
                "INSERT INTO artifacts (id, tenant, user_id, chat_id, file_name, size, sha256, \
                 bytes, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(&new.id)
            .bind(&tenant)
            .bind(&user)
            .bind(&chat_id)
            .bind(&file_name)
            .bind(new.size_sql)
            .bind(&new.sha256)
            .bind(bytes.as_ref())
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(ArtifactRef {
                id: new.id,
                file_name,
                size: new.size,
                sha256: Some(new.sha256),
            })
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
        let got = self.on_runtime(reads::get_artifact(
            self.pool.clone(),
            tenant.to_owned(),
            user.to_owned(),
            chat_id.to_owned(),
            id.to_owned(),
        ));
        Box::pin(async move { Ok(got.await?) })
    }
}
