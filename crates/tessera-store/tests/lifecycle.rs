//! Data lifecycle: the retention query and refusing a database from a newer build.

mod common;

use common::{open, record, temp_db};
use tessera_store::{ChatState, ChatStore, STATUS_COMPLETED, SqliteStore};

fn state_at(status: &str, updated_at_ms: i64) -> ChatState {
    ChatState {
        status: status.to_owned(),
        ..ChatState::initial(updated_at_ms)
    }
}

#[tokio::test]
async fn completed_chats_before_lists_only_old_completed_chats_oldest_first() {
    let db = temp_db();
    let store = open(&db).await;
    for (id, status, updated) in [
        ("old-done-2", STATUS_COMPLETED, 200),
        ("old-done-1", STATUS_COMPLETED, 100),
        ("old-open", "awaiting_user", 50),
        ("new-done", STATUS_COMPLETED, 5_000),
    ] {
        store
            .create_chat(record(id, "acme", "u1", 1))
            .await
            .unwrap();
        store
            .save_state(id, state_at(status, updated))
            .await
            .unwrap();
    }
    let due = store.completed_chats_before(1_000, 10).await.unwrap();
    assert_eq!(due, ["old-done-1", "old-done-2"]);
    let first = store.completed_chats_before(1_000, 1).await.unwrap();
    assert_eq!(first, ["old-done-1"], "the limit caps one purge round");
}

#[tokio::test]
async fn a_database_from_a_newer_build_is_refused_with_a_clear_message() {
    let db = temp_db();
    let store = open(&db).await;
    store
        .create_chat(record("kept", "acme", "u1", 1))
        .await
        .unwrap();
    let newer = SqliteStore::latest_schema_version() + 1;
    store.close().await;
    let conn = rusqlite::Connection::open(&db.path).unwrap();
    conn.execute(
        "INSERT INTO schema_version (version, name, applied_at_ms) VALUES (?1, 'from_the_future', 0)",
        [newer],
    )
    .unwrap();
    drop(conn);

    let err = match SqliteStore::open(&db.path).await {
        Ok(_) => panic!("a newer schema must be refused"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&format!("schema version {newer}")), "{err}");
    assert!(err.contains("newer than this build"), "{err}");
    assert!(
        err.contains("upgrade"),
        "the message says what to do: {err}"
    );

    // Nothing was lost: the chat is still there for a newer binary.
    let conn = rusqlite::Connection::open(&db.path).unwrap();
    let n: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM chats WHERE chat_id = 'kept'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn generated_files_over_the_tenant_quota_are_refused_and_nothing_is_stored() {
    use tessera_tools::ArtifactStore as _;
    let db = temp_db();
    let store = open(&db).await.with_tenant_file_quota(100);
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    store
        .put("acme", "u1", "c1", "a.zip", vec![b'x'; 60].into())
        .await
        .unwrap();
    let refused = store
        .put("acme", "u2", "c1", "b.zip", vec![b'x'; 41].into())
        .await
        .expect_err("60 + 41 bytes is over the 100-byte quota");
    assert!(refused.0.contains("quota"), "{}", refused.0);
    assert!(refused.0.contains("101 bytes"), "{}", refused.0);
    // Another tenant has its own quota; this tenant can still use what is left.
    store
        .put("other", "u1", "c9", "c.zip", vec![b'x'; 100].into())
        .await
        .unwrap();
    store
        .put("acme", "u1", "c1", "d.zip", vec![b'x'; 40].into())
        .await
        .unwrap();
    // Deleting the chat frees its files' share.
    assert!(store.delete_chat("c1").await.unwrap());
    store
        .put("acme", "u1", "c2", "e.zip", vec![b'x'; 100].into())
        .await
        .unwrap();
}
