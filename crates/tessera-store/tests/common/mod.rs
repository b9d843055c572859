//! Shared fixtures for the store tests: one [`TestDb`] per test, on SQLite (a temp file) or
//! PostgreSQL (a schema of its own in `TESSERA_TEST_DATABASE_URL`, created for the test and
//! dropped after it, so tests run in parallel), and [`conformance!`], which runs each test
//! against both.

#![allow(dead_code, unused_macros)]

use std::ops::Deref;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tessera_store::testing::PgTestSchema;
use tessera_store::{
    ChatRecord, ChatState, ChatStore, ChatWriteBatch, JsonText, PendingUiRecord, PgStore,
    SqliteStore, StoreError, StoredEvent, StoredMessage,
};
use tessera_tools::{ArtifactRef, ArtifactStore, StoredArtifact, Task, TaskFilter, TaskStore};

/// Runs each named `async fn(TestDb)` as a test on SQLite (always) and on PostgreSQL (when
/// `TESSERA_TEST_DATABASE_URL` is set: otherwise it prints that it is skipped, and fails under
/// `CI=true`). A second list, after `postgres_only:`, runs on PostgreSQL alone.
macro_rules! conformance {
    ($($name:ident),* $(,)? ; postgres_only: $($pg_name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::common::TestDb::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(db) = crate::common::TestDb::postgres(stringify!($name)).await {
                        super::$name(db).await;
                    }
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $pg_name() {
                    if let Some(db) = crate::common::TestDb::postgres(stringify!($pg_name)).await {
                        super::$pg_name(db).await;
                    }
                }
            )*
        }
    };
}

/// Where a test's data lives. Dropping it removes the file or drops the schema.
pub enum TestDb {
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Postgres(Box<PgTestSchema>),
}

impl TestDb {
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        // A nested path checks that `open` creates missing parent directories.
        let path = dir.path().join("data").join("nested").join("tessera.db");
        TestDb::Sqlite { _dir: dir, path }
    }

    /// A fresh schema, or `None` when no database is configured (see `PgTestSchema`).
    pub async fn postgres(test: &str) -> Option<Self> {
        PgTestSchema::create(test)
            .await
            .map(|schema| TestDb::Postgres(Box::new(schema)))
    }
}

/// A store on the test's database (a second `open` gives a second store on the same data,
/// as a restarted process or a second node would have).
pub async fn open(db: &TestDb) -> TestStore {
    match db {
        TestDb::Sqlite { path, .. } => {
            TestStore::Sqlite(SqliteStore::open(path).await.expect("open store"))
        }
        TestDb::Postgres(schema) => TestStore::Pg(
            PgStore::connect_with(schema.options())
                .await
                .expect("open store"),
        ),
    }
}

/// Either backend, as the tests use it: its [`ChatStore`] (by `Deref`), its task and artifact
/// stores, and a few finer-grained operations.
#[derive(Clone)]
pub enum TestStore {
    Sqlite(SqliteStore),
    Pg(PgStore),
}

impl Deref for TestStore {
    type Target = dyn ChatStore;

    fn deref(&self) -> &Self::Target {
        match self {
            TestStore::Sqlite(s) => s,
            TestStore::Pg(s) => s,
        }
    }
}

impl TestStore {
    pub fn shared(&self) -> Arc<dyn ChatStore> {
        match self {
            TestStore::Sqlite(s) => Arc::new(s.clone()),
            TestStore::Pg(s) => Arc::new(s.clone()),
        }
    }

    /// The PostgreSQL store (lease and fencing tests run on it alone).
    pub fn pg(&self) -> &PgStore {
        match self {
            TestStore::Pg(s) => s,
            TestStore::Sqlite(_) => panic!("a PostgreSQL-only test ran on SQLite"),
        }
    }

    fn batch(
        &self,
        chat_id: &str,
        batch: ChatWriteBatch,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.apply_batch(chat_id, Arc::new(batch))
    }

    pub fn save_state(
        &self,
        chat_id: &str,
        state: ChatState,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.batch(
            chat_id,
            ChatWriteBatch {
                state: Some(Arc::new(state)),
                ..ChatWriteBatch::default()
            },
        )
    }

    pub fn append_messages(
        &self,
        chat_id: &str,
        messages: Vec<StoredMessage>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.batch(
            chat_id,
            ChatWriteBatch {
                messages,
                ..ChatWriteBatch::default()
            },
        )
    }

    pub fn append_events(
        &self,
        chat_id: &str,
        events: Vec<StoredEvent>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.batch(
            chat_id,
            ChatWriteBatch {
                events,
                ..ChatWriteBatch::default()
            },
        )
    }

    pub fn put_pending_ui(
        &self,
        chat_id: &str,
        record: PendingUiRecord,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.batch(
            chat_id,
            ChatWriteBatch {
                put_pending: vec![record],
                ..ChatWriteBatch::default()
            },
        )
    }

    pub fn last_seq(&self, chat_id: &str) -> BoxFuture<'static, Result<u64, StoreError>> {
        match self {
            TestStore::Sqlite(s) => s.last_seq(chat_id),
            TestStore::Pg(s) => s.last_seq(chat_id),
        }
    }

    pub fn messages(
        &self,
        chat_id: &str,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'static, Result<Vec<StoredMessage>, StoreError>> {
        match self {
            TestStore::Sqlite(s) => s.messages(chat_id, offset, limit),
            TestStore::Pg(s) => s.messages(chat_id, offset, limit),
        }
    }

    pub fn remove_pending_ui(
        &self,
        chat_id: &str,
        corr: &str,
    ) -> BoxFuture<'static, Result<bool, StoreError>> {
        match self {
            TestStore::Sqlite(s) => s.remove_pending_ui(chat_id, corr),
            TestStore::Pg(s) => s.remove_pending_ui(chat_id, corr),
        }
    }

    /// The same store with a per-tenant cap on generated files.
    pub fn with_tenant_file_quota(self, max_bytes: u64) -> Self {
        match self {
            TestStore::Sqlite(s) => TestStore::Sqlite(s.with_tenant_file_quota(max_bytes)),
            TestStore::Pg(s) => TestStore::Pg(s.with_tenant_file_quota(max_bytes)),
        }
    }

    pub fn delete_chat(&self, chat_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        match self {
            TestStore::Sqlite(s) => s.delete_chat(chat_id),
            TestStore::Pg(s) => s.delete_chat(chat_id),
        }
    }

    pub fn complete_tool_with_result(
        &self,
        chat_id: &str,
        key: &str,
        result: &Value,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        match self {
            TestStore::Sqlite(s) => s.complete_tool_with_result(chat_id, key, result),
            TestStore::Pg(s) => s.complete_tool_with_result(chat_id, key, result, None),
        }
    }

    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        match self {
            TestStore::Sqlite(s) => s.schema_version().await,
            TestStore::Pg(s) => s.schema_version().await,
        }
    }

    pub fn latest_schema_version(&self) -> i64 {
        match self {
            TestStore::Sqlite(_) => SqliteStore::latest_schema_version(),
            TestStore::Pg(_) => PgStore::latest_schema_version(),
        }
    }

    pub async fn close(&self) {
        match self {
            TestStore::Sqlite(s) => s.close().await,
            TestStore::Pg(s) => s.close().await,
        }
    }

    fn tasks(&self) -> &dyn TaskStore {
        match self {
            TestStore::Sqlite(s) => s,
            TestStore::Pg(s) => s,
        }
    }

    fn artifacts(&self) -> &dyn ArtifactStore {
        match self {
            TestStore::Sqlite(s) => s,
            TestStore::Pg(s) => s,
        }
    }
}

type ToolsResult<'a, T> = BoxFuture<'a, Result<T, tessera_tools::StoreError>>;

impl TaskStore for TestStore {
    fn add<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        title: &'a str,
        description: Option<&'a str>,
    ) -> ToolsResult<'a, Task> {
        self.tasks().add(tenant, user, title, description)
    }
    fn list<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        filter: TaskFilter,
    ) -> ToolsResult<'a, Vec<Task>> {
        self.tasks().list(tenant, user, filter)
    }
    fn complete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> ToolsResult<'a, Option<Task>> {
        self.tasks().complete(tenant, user, task_id)
    }
    fn delete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> ToolsResult<'a, Option<Task>> {
        self.tasks().delete(tenant, user, task_id)
    }
}

impl ArtifactStore for TestStore {
    fn put<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        chat_id: &'a str,
        file_name: &'a str,
        bytes: Bytes,
    ) -> ToolsResult<'a, ArtifactRef> {
        self.artifacts()
            .put(tenant, user, chat_id, file_name, bytes)
    }
    fn get<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        chat_id: &'a str,
        id: &'a str,
    ) -> ToolsResult<'a, Option<StoredArtifact>> {
        self.artifacts().get(tenant, user, chat_id, id)
    }
}

pub fn record(chat_id: &str, tenant: &str, user: &str, created_at_ms: i64) -> ChatRecord {
    ChatRecord {
        chat_id: chat_id.to_owned(),
        tenant: tenant.to_owned(),
        user_id: user.to_owned(),
        workflow: "support".to_owned(),
        workflow_version: "v1".to_owned(),
        created_at_ms,
    }
}

pub fn message(idx: u64) -> StoredMessage {
    StoredMessage {
        idx,
        message_id: format!("m{idx}"),
        role: if idx.is_multiple_of(2) {
            "user"
        } else {
            "assistant"
        }
        .into(),
        agent: (idx % 2 == 1).then(|| "triage".into()),
        content: format!("message {idx}").into(),
        ui_hidden: idx == 3,
        raw: JsonText::new(&json!({"role": "user", "content": format!("message {idx}")})).unwrap(),
    }
}

pub fn event(seq: u64) -> StoredEvent {
    StoredEvent {
        seq,
        event_type: "chat.text".into(),
        json: format!(r#"{{"type":"chat.text","seq":{seq}}}"#).into(),
    }
}
