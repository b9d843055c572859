//! Refusing a SQLite database from a newer build (the retention query and the file quota are
//! in the conformance suite, on both backends).

mod common;

use common::{TestDb, open, record};
use tessera_store::SqliteStore;

#[tokio::test]
async fn a_database_from_a_newer_build_is_refused_with_a_clear_message() {
    let db = TestDb::sqlite();
    let TestDb::Sqlite { path, .. } = &db else {
        unreachable!()
    };
    let path = path.clone();
    let store = open(&db).await;
    store
        .create_chat(record("kept", "acme", "u1", 1))
        .await
        .unwrap();
    let newer = SqliteStore::latest_schema_version() + 1;
    store.close().await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO schema_version (version, name, applied_at_ms) VALUES (?1, 'from_the_future', 0)",
        [newer],
    )
    .unwrap();
    drop(conn);

    let err = match SqliteStore::open(&path).await {
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
    let conn = rusqlite::Connection::open(&path).unwrap();
    let n: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM chats WHERE chat_id = 'kept'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1);
}
