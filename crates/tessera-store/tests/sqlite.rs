//! What only the SQLite store has: its WAL, its throwaway in-memory databases, and files
//! written by older schema versions.

mod common;

use std::sync::Arc;

use common::{TestDb, event, record};
use tessera_store::{ChatStore, ChatWriteBatch, SqliteStore};

fn temp_db() -> (TestDb, std::path::PathBuf) {
    let db = TestDb::sqlite();
    let TestDb::Sqlite { path, .. } = &db else {
        unreachable!()
    };
    let path = path.clone();
    (db, path)
}

#[tokio::test]
async fn in_memory_store_works() {
    let store = SqliteStore::in_memory().await.unwrap();
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    store
        .apply_batch(
            "c1",
            Arc::new(ChatWriteBatch {
                events: vec![event(1), event(2)],
                ..ChatWriteBatch::default()
            }),
        )
        .await
        .unwrap();
    assert_eq!(store.last_seq("c1").await.unwrap(), 2);
    // Each in-memory store is its own database.
    let other = SqliteStore::in_memory().await.unwrap();
    assert!(other.load_chat("c1").await.unwrap().is_none());
}

#[tokio::test]
async fn the_wal_stays_bounded_under_steady_writes() {
    let (_db, path) = temp_db();
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .create_chat(record("big", "acme", "u", 1))
        .await
        .unwrap();
    // 60 MiB of events, written one batch at a time: far more than the WAL may hold
    // (the writer pauses for a catch-up checkpoint at 4,000 pages, 16 MiB).
    let payload = "x".repeat(64 * 1024);
    for seq in 1..=960u64 {
        let event = tessera_store::StoredEvent {
            seq,
            event_type: "chat.text".to_owned(),
            json: payload.clone(),
        };
        let batch = ChatWriteBatch {
            events: vec![event],
            ..ChatWriteBatch::default()
        };
        store.apply_batch("big", Arc::new(batch)).await.unwrap();
    }
    let mut wal = path.into_os_string();
    wal.push("-wal");
    let wal_bytes = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert!(
        wal_bytes <= 20 * 1024 * 1024,
        "WAL grew to {wal_bytes} bytes"
    );
    assert_eq!(store.last_seq("big").await.unwrap(), 960);
}

#[tokio::test]
async fn the_workflow_version_round_trips_and_older_chats_get_an_empty_one() {
    // A database as schema 2 left it, with one chat, written without the store.
    let (_db, path) = temp_db();
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(include_str!("../migrations/0001_init.sql"))
            .unwrap();
        conn.execute_batch(include_str!("../migrations/0002_chat_secrets.sql"))
            .unwrap();
        conn.execute_batch(
            "CREATE TABLE schema_version (version INTEGER NOT NULL PRIMARY KEY, \
             name TEXT NOT NULL, applied_at_ms INTEGER NOT NULL) STRICT;
             INSERT INTO schema_version VALUES (1, 'init', 0), (2, 'chat_secrets', 0);
             INSERT INTO chats (chat_id, tenant, user_id, workflow, created_at_ms, status, \
             current_agent, turn, consecutive, context, updated_at_ms) \
             VALUES ('old', 'acme', 'u1', 'support', 1, 'awaiting_user', '', 0, 0, '{}', 1);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), 4);
    let old = store
        .load_chat("old")
        .await
        .unwrap()
        .expect("old chat kept");
    assert_eq!(old.record.workflow_version, "");
    let mut new = record("new", "acme", "u1", 2);
    new.workflow_version = "0123456789abcdef".into();
    store.create_chat(new).await.unwrap();
    let loaded = store.load_chat("new").await.unwrap().expect("new chat");
    assert_eq!(loaded.record.workflow_version, "0123456789abcdef");
    let open_chats = store.list_open_chats().await.unwrap();
    assert!(
        open_chats
            .iter()
            .any(|c| c.record.workflow_version == "0123456789abcdef")
    );
}
