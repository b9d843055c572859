//! What only the PostgreSQL store has: its chat rows without foreign keys (the store checks
//! and deletes them itself, schema version 7) and databases written by older schema versions.
//! Each test skips without `TESSERA_TEST_DATABASE_URL` (fails under `CI=true`).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TestDb, event, message, record};
use futures::future::join_all;
use serde_json::json;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tessera_store::testing::PgTestSchema;
use tessera_store::{
    ChatState, ChatStore, ChatWriteBatch, PendingUiRecord, PgStore, STATUS_COMPLETED, StoreError,
    ToolClaim,
};

/// The tables holding a chat's rows (besides `chats`).
const CHAT_TABLES: [&str; 7] = [
    "messages",
    "events",
    "pending_ui",
    "tool_invocations",
    "chat_secrets",
    "artifacts",
    "chat_leases",
];

async fn schema(test: &str) -> Option<PgTestSchema> {
    match TestDb::postgres(test).await? {
        TestDb::Postgres(schema) => Some(*schema),
        TestDb::Sqlite { .. } => unreachable!("TestDb::postgres is PostgreSQL"),
    }
}

async fn connect(options: &PgConnectOptions) -> PgConnection {
    PgConnection::connect_with(options)
        .await
        .expect("connect to the test schema")
}

/// Rows of `chat_id` in each of [`CHAT_TABLES`], in that order.
async fn rows_of(conn: &mut PgConnection, chat_id: &str) -> Vec<i64> {
    let mut counts = Vec::new();
    for table in CHAT_TABLES {
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE chat_id = $1");
        counts.push(
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(chat_id)
                .fetch_one(&mut *conn)
                .await
                .expect("count rows"),
        );
    }
    counts
}

fn pending(corr: &str) -> PendingUiRecord {
    PendingUiRecord {
        corr: corr.to_owned(),
        turn_key: format!("t1:{corr}"),
        call: json!({"component": "form", "corr": corr}),
        created_at_ms: 7,
        timeout_at_ms: None,
    }
}

/// A row in every table a chat has rows in.
async fn fill(store: &PgStore, chat_id: &str) {
    store
        .apply_batch(
            chat_id,
            Arc::new(ChatWriteBatch {
                messages: vec![message(0)],
                events: vec![event(1)],
                put_pending: vec![pending("p")],
                ..ChatWriteBatch::default()
            }),
        )
        .await
        .unwrap();
    assert_eq!(
        store.claim_tool(chat_id, "k", None).await.unwrap(),
        ToolClaim::Claimed
    );
    store.put_secrets(chat_id, vec![1, 2, 3]).await.unwrap();
    tessera_tools::ArtifactStore::put(store, "acme", "u1", chat_id, "f.txt", "x".into())
        .await
        .unwrap();
    tessera_store::LeaseStore::acquire_lease(store, chat_id, "n1", 60_000)
        .await
        .unwrap()
        .expect("a free lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_chat_removes_every_row_of_it_and_no_other() {
    let Some(schema) = schema("deleting_a_chat_removes_every_row_of_it_and_no_other").await else {
        return;
    };
    let store = PgStore::connect_with(schema.options()).await.unwrap();
    let mut conn = connect(&schema.options()).await;
    for id in ["c1", "c2"] {
        store
            .create_chat(record(id, "acme", "u1", 1))
            .await
            .unwrap();
        fill(&store, id).await;
        assert_eq!(rows_of(&mut conn, id).await, [1; 7], "{id} filled");
    }

    assert!(store.delete_chat("c1").await.unwrap());
    assert_eq!(rows_of(&mut conn, "c1").await, [0; 7]);
    assert_eq!(rows_of(&mut conn, "c2").await, [1; 7]);
}

/// A write to a chat that does not exist is refused whether it runs alone or merged with
/// other chats' writes, and leaves no row behind; the writes queued with it are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_an_unknown_chat_are_refused_and_leave_no_row() {
    let Some(schema) = schema("writes_to_an_unknown_chat_are_refused_and_leave_no_row").await
    else {
        return;
    };
    let store = PgStore::connect_with(schema.options()).await.unwrap();
    let ids: Vec<String> = (0..16).map(|i| format!("c{i:02}")).collect();
    for id in &ids {
        store
            .create_chat(record(id, "acme", "u1", 1))
            .await
            .unwrap();
    }
    let batch = |seq| {
        Arc::new(ChatWriteBatch {
            messages: vec![message(seq)],
            events: vec![event(seq)],
            ..ChatWriteBatch::default()
        })
    };
    // Queued together, so most land in merged groups with the good writes.
    let good = join_all(ids.iter().map(|id| store.apply_batch(id, batch(1))));
    let ghosts = join_all((0..4).map(|i| store.apply_batch(&format!("ghost{i}"), batch(1))));
    let ghost_claims = join_all((0..4).map(|i| store.claim_tool(&format!("ghost{i}"), "k", None)));
    let ghost_pending = store.apply_batch(
        "ghost0",
        Arc::new(ChatWriteBatch {
            put_pending: vec![pending("p")],
            ..ChatWriteBatch::default()
        }),
    );
    let ghost_secrets = store.put_secrets("ghost1", vec![1]);
    let (good, ghosts, ghost_claims, ghost_pending, ghost_secrets) =
        futures::join!(good, ghosts, ghost_claims, ghost_pending, ghost_secrets);

    for result in good {
        result.expect("a write to an existing chat is stored");
    }
    for result in ghosts {
        assert!(matches!(result, Err(StoreError::NotFound(_))), "{result:?}");
    }
    for result in ghost_claims {
        assert!(matches!(result, Err(StoreError::NotFound(_))), "{result:?}");
    }
    assert!(
        matches!(ghost_pending, Err(StoreError::NotFound(_))),
        "{ghost_pending:?}"
    );
    assert!(
        matches!(ghost_secrets, Err(StoreError::NotFound(_))),
        "{ghost_secrets:?}"
    );
    let mut conn = connect(&schema.options()).await;
    for i in 0..4 {
        assert_eq!(rows_of(&mut conn, &format!("ghost{i}")).await, [0; 7]);
    }
    for id in &ids {
        assert_eq!(store.last_seq(id).await.unwrap(), 1);
        assert_eq!(store.all_messages(id).await.unwrap().len(), 1);
    }
}

/// Without foreign keys, the store's own lock must keep a delete from leaving rows behind: a
/// write that holds the chat (as a writer's group does until COMMIT) makes `delete_chat`
/// wait, and the delete then removes what the write committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_waits_for_a_write_holding_the_chat_and_leaves_none_of_its_rows() {
    let Some(schema) =
        schema("a_delete_waits_for_a_write_holding_the_chat_and_leaves_none_of_its_rows").await
    else {
        return;
    };
    let store = PgStore::connect_with(schema.options()).await.unwrap();
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    store
        .create_chat(record("c2", "acme", "u1", 1))
        .await
        .unwrap();
    // Another node's write group, mid-transaction: it holds c1 and has added an event.
    let mut writer = connect(&schema.options()).await;
    sqlx::raw_sql(
        "BEGIN; \
         SELECT chat_id FROM chats WHERE chat_id = 'c1' FOR KEY SHARE; \
         INSERT INTO events (chat_id, seq, event_type, json) VALUES ('c1', 1, 't', '{}');",
    )
    .execute(&mut writer)
    .await
    .unwrap();

    let delete = tokio::spawn(store.delete_chat("c1"));
    // The delete's connection waits for the writer's lock (a state, polled: no sleep-and-hope).
    let mut watcher = connect(&schema.options()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = $1 \
             AND wait_event_type = 'Lock'",
        )
        .bind(&schema.name)
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            !delete.is_finished(),
            "the delete did not wait for the write"
        );
        assert!(Instant::now() < deadline, "the delete never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sqlx::raw_sql("COMMIT").execute(&mut writer).await.unwrap();

    assert!(delete.await.unwrap().unwrap());
    assert_eq!(rows_of(&mut watcher, "c1").await, [0; 7]);
    // And a write after the delete is refused.
    assert!(matches!(
        store
            .apply_batch(
                "c1",
                Arc::new(ChatWriteBatch {
                    events: vec![event(2)],
                    ..ChatWriteBatch::default()
                })
            )
            .await,
        Err(StoreError::NotFound(_))
    ));
    assert!(store.load_chat("c2").await.unwrap().is_some());
}

/// Schema version 6 as the previous release left it (migrations 1, 4 and 6).
const V6: [(i64, &str, &str); 3] = [
    (
        1,
        "init",
        include_str!("../migrations/postgres/0001_init.sql"),
    ),
    (
        4,
        "workflow_versions",
        include_str!("../migrations/postgres/0004_workflow_versions.sql"),
    ),
    (
        6,
        "open_chats_by_tenant",
        include_str!("../migrations/postgres/0006_open_chats_by_tenant.sql"),
    ),
];

/// A database of schema version 6 with open and completed chats opens at the latest version
/// with every row kept: open chats listed and counted from the new flag, no foreign key left,
/// and a delete still removing the chat's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_6_database_upgrades_keeping_its_chats_and_rows() {
    let Some(schema) = schema("a_version_6_database_upgrades_keeping_its_chats_and_rows").await
    else {
        return;
    };
    let mut conn = connect(&schema.options()).await;
    sqlx::raw_sql(
        "CREATE TABLE schema_version (version BIGINT NOT NULL PRIMARY KEY, \
         name TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    for (version, name, sql) in V6 {
        sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
        sqlx::query("INSERT INTO schema_version VALUES ($1, $2, 0)")
            .bind(version)
            .bind(name)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    // Rows as a version-6 store wrote them: an open chat, a completed one, each with rows.
    sqlx::raw_sql(
        "INSERT INTO chats (chat_id, tenant, user_id, workflow, workflow_version, created_at_ms, \
            status, current_agent, turn, consecutive, context, updated_at_ms) VALUES \
            ('open', 'acme', 'u1', 'support', 'v1', 1, 'running', 'triage', 2, 0, '{}', 5), \
            ('done', 'acme', 'u1', 'support', 'v1', 2, 'completed', 'triage', 3, 0, '{}', 6); \
         INSERT INTO events (chat_id, seq, event_type, json) VALUES \
            ('open', 1, 'chat.text', '{}'), ('open', 2, 'chat.text', '{}'), \
            ('done', 1, 'chat.text', '{}'); \
         INSERT INTO messages (chat_id, idx, message_id, role, agent, content, ui_hidden, raw) \
            VALUES ('open', 0, 'm0', 'user', NULL, 'hi', FALSE, '{}'), \
            ('done', 0, 'm0', 'user', NULL, 'bye', FALSE, '{}'); \
         INSERT INTO tool_invocations (chat_id, invocation_key, status, result, started_at_ms, \
            completed_at_ms) VALUES ('open', 'k', 'completed', '42', 3, 4); \
         INSERT INTO chat_secrets (chat_id, sealed, updated_at_ms) VALUES ('done', '\\x01', 1);",
    )
    .execute(&mut conn)
    .await
    .unwrap();

    let store = PgStore::connect_with(schema.options()).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), 11);
    assert_eq!(PgStore::latest_schema_version(), 11);
    let open: Vec<String> = store
        .list_open_chats()
        .await
        .unwrap()
        .into_iter()
        .map(|chat| chat.record.chat_id)
        .collect();
    assert_eq!(open, ["open"]);
    assert_eq!(store.count_open_chats("acme").await.unwrap(), 1);
    assert_eq!(store.last_seq("open").await.unwrap(), 2);
    assert_eq!(
        store.last_seq_taken("open").await.unwrap(),
        2,
        "no seq marked taken beyond the log"
    );
    assert_eq!(
        &*store.all_messages("done").await.unwrap()[0].content,
        "bye"
    );
    assert_eq!(
        store.claim_tool("open", "k", None).await.unwrap(),
        ToolClaim::AlreadyCompleted(Some(json!(42)))
    );
    assert_eq!(store.load_secrets("done").await.unwrap(), Some(vec![1]));
    let foreign_keys: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_constraint WHERE contype = 'f' \
         AND connamespace = current_schema()::regnamespace",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(foreign_keys, 0);

    // The flag follows completion, and a delete still takes every row of the chat.
    store
        .apply_batch(
            "open",
            Arc::new(ChatWriteBatch {
                state: Some(Arc::new(ChatState {
                    status: STATUS_COMPLETED.to_owned(),
                    ..ChatState::initial(9)
                })),
                ..ChatWriteBatch::default()
            }),
        )
        .await
        .unwrap();
    assert!(store.list_open_chats().await.unwrap().is_empty());
    assert_eq!(store.count_open_chats("acme").await.unwrap(), 0);
    assert!(store.delete_chat("done").await.unwrap());
    assert_eq!(rows_of(&mut conn, "done").await, [0; 7]);
    assert_eq!(rows_of(&mut conn, "open").await, [1, 2, 0, 1, 0, 0, 0]);
}
