//! What only the SQLite store has: its WAL, its throwaway in-memory databases, and files
//! written by older schema versions.

mod common;

use std::sync::Arc;

use common::{TestDb, event, message, record};
use tessera_store::{ChatState, ChatStore, ChatWriteBatch, SqliteStore, StoreError, ToolClaim};

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

/// The writer runs a group of jobs without savepoints first and, when one fails, runs the
/// group again with a savepoint per job: whatever the failing batch wrote before its conflict
/// is gone, and the writes queued with it are stored.
#[tokio::test]
async fn a_failing_write_rolls_back_only_itself_and_the_writes_queued_with_it_are_stored() {
    let store = SqliteStore::in_memory().await.unwrap();
    for chat in ["a", "b", "c"] {
        store
            .create_chat(record(chat, "acme", "u", 1))
            .await
            .unwrap();
    }
    store.append_events("b", vec![event(1)]).await.unwrap();
    let batch = |messages, events| {
        Arc::new(ChatWriteBatch {
            messages,
            events,
            ..ChatWriteBatch::default()
        })
    };
    // Each call queues its job when called: the three are queued back to back.
    let before = store.apply_batch("a", batch(vec![message(0)], vec![event(1)]));
    // Its message and event 2 are written before event 1 conflicts.
    let failing = store.apply_batch("b", batch(vec![message(0)], vec![event(2), event(1)]));
    let after = store.apply_batch("c", batch(vec![message(0)], vec![event(1)]));
    let (before, failing, after) = futures::join!(before, failing, after);
    assert!(before.is_ok() && after.is_ok(), "{before:?} {after:?}");
    assert!(
        matches!(failing, Err(StoreError::Conflict(_))),
        "{failing:?}"
    );
    assert_eq!(store.last_seq("b").await.unwrap(), 1);
    assert!(store.all_messages("b").await.unwrap().is_empty());
    for chat in ["a", "c"] {
        assert_eq!(store.last_seq(chat).await.unwrap(), 1);
        assert_eq!(store.all_messages(chat).await.unwrap().len(), 1);
    }
}

#[tokio::test]
async fn the_wal_stays_bounded_under_steady_writes() {
    let (_db, path) = temp_db();
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .create_chat(record("big", "acme", "u", 1))
        .await
        .unwrap();
    // 60 MiB of events, 8 batches (512 KiB) at a time: far more than the WAL may hold
    // (the writer pauses for a catch-up checkpoint at 4,000 pages, 16 MiB).
    let payload = "x".repeat(64 * 1024);
    for first in (1..=960u64).step_by(8) {
        let batches = (first..first + 8).map(|seq| {
            let event = tessera_store::StoredEvent {
                seq,
                event_type: "chat.text".into(),
                json: payload.clone().into(),
            };
            let batch = ChatWriteBatch {
                events: vec![event],
                ..ChatWriteBatch::default()
            };
            store.apply_batch("big", Arc::new(batch))
        });
        for stored in futures::future::join_all(batches).await {
            stored.unwrap();
        }
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
    assert_eq!(
        store.schema_version().await.unwrap(),
        SqliteStore::latest_schema_version()
    );
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

#[tokio::test]
async fn a_schema_3_file_keeps_its_logs_transcripts_and_claims_in_the_write_ordered_layout() {
    // Two chats as schema 3 left them (tables clustered by chat id), written without the store.
    let (_db, path) = temp_db();
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        for sql in [
            include_str!("../migrations/0001_init.sql"),
            include_str!("../migrations/0002_chat_secrets.sql"),
            include_str!("../migrations/0003_chat_workflow_version.sql"),
        ] {
            conn.execute_batch(sql).unwrap();
        }
        conn.execute_batch(
            "CREATE TABLE schema_version (version INTEGER NOT NULL PRIMARY KEY, \
             name TEXT NOT NULL, applied_at_ms INTEGER NOT NULL) STRICT;
             INSERT INTO schema_version VALUES (1, 'init', 0), (2, 'chat_secrets', 0), \
             (3, 'chat_workflow_version', 0);
             INSERT INTO chats (chat_id, tenant, user_id, workflow, created_at_ms, status, \
             current_agent, turn, consecutive, context, updated_at_ms) VALUES \
             ('a', 'acme', 'u1', 'support', 1, 'awaiting_user', '', 1, 0, '{}', 1), \
             ('b', 'acme', 'u1', 'support', 2, 'awaiting_user', '', 1, 0, '{}', 2);
             INSERT INTO events (chat_id, seq, event_type, json) VALUES \
             ('b', 1, 'chat.text', '{\"b\":1}'), ('a', 1, 'chat.text', '{\"a\":1}'), \
             ('a', 2, 'chat.text', '{\"a\":2}');
             INSERT INTO messages (chat_id, idx, message_id, role, agent, content, ui_hidden, raw) \
             VALUES ('a', 0, 'm0', 'user', NULL, 'hi', 0, '{}'), \
             ('a', 1, 'm1', 'assistant', 'triage', 'hello', 0, '{}');
             INSERT INTO tool_invocations (chat_id, invocation_key, status, result, started_at_ms, \
             completed_at_ms) VALUES ('a', 'done', 'completed', '{\"ok\":true}', 1, 2), \
             ('a', 'running', 'started', NULL, 3, NULL);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        SqliteStore::latest_schema_version()
    );

    // Everything written under schema 3 reads back, per chat and in order.
    let seqs = |events: Vec<tessera_store::StoredEvent>| -> Vec<(u64, String)> {
        events
            .into_iter()
            .map(|e| (e.seq, e.json.to_string()))
            .collect()
    };
    assert_eq!(
        seqs(store.events_after("a", 0, 10).await.unwrap()),
        vec![(1, r#"{"a":1}"#.to_owned()), (2, r#"{"a":2}"#.to_owned())]
    );
    assert_eq!(
        seqs(store.events_after("b", 0, 10).await.unwrap()),
        vec![(1, r#"{"b":1}"#.to_owned())]
    );
    let transcript = store.all_messages("a").await.unwrap();
    assert_eq!(
        transcript.iter().map(|m| &*m.content).collect::<Vec<_>>(),
        vec!["hi", "hello"]
    );
    assert!(store.all_messages("b").await.unwrap().is_empty());
    assert_eq!(
        store.claim_tool("a", "done", None).await.unwrap(),
        ToolClaim::AlreadyCompleted(Some(serde_json::json!({"ok": true})))
    );
    assert_eq!(
        store.claim_tool("a", "running", None).await.unwrap(),
        ToolClaim::AlreadyStarted
    );

    // The migrated keys still refuse duplicates, and new writes follow the old rows.
    assert!(matches!(
        store.append_events("a", vec![event(2)]).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store.append_messages("a", vec![message(1)]).await,
        Err(StoreError::Conflict(_))
    ));
    store.append_events("a", vec![event(3)]).await.unwrap();
    assert_eq!(store.last_seq("a").await.unwrap(), 3);
    assert_eq!(store.last_seq("b").await.unwrap(), 1);
    assert_eq!(
        (
            store.last_seq_taken("a").await.unwrap(),
            store.last_seq_taken("b").await.unwrap()
        ),
        (3, 1),
        "no seq marked taken beyond the logs"
    );

    // A chat created after the migration gets its own number and rows.
    store
        .create_chat(record("c", "acme", "u1", 3))
        .await
        .unwrap();
    store.append_events("c", vec![event(1)]).await.unwrap();
    assert_eq!(
        store.claim_tool("c", "done", None).await.unwrap(),
        ToolClaim::Claimed
    );
    assert_eq!(store.last_seq("c").await.unwrap(), 1);

    // Deleting a migrated chat still removes everything kept for it, and only that.
    assert!(store.delete_chat("a").await.unwrap());
    assert!(store.events_after("a", 0, 10).await.unwrap().is_empty());
    assert!(store.all_messages("a").await.unwrap().is_empty());
    assert_eq!(store.events_after("b", 0, 10).await.unwrap().len(), 1);
    assert_eq!(store.events_after("c", 0, 10).await.unwrap().len(), 1);
}

#[tokio::test]
async fn each_flush_appends_one_log_row_in_write_order_and_nothing_indexes_the_log() {
    let (_db, path) = temp_db();
    let store = SqliteStore::open(&path).await.unwrap();
    for (n, chat) in ["a", "b"].into_iter().enumerate() {
        store
            .create_chat(record(chat, "acme", "u1", n as i64))
            .await
            .unwrap();
    }
    // Three turns of two chats, interleaved: each flush 3 events and 2 messages.
    for turn in 0..3u64 {
        for chat in ["a", "b"] {
            store
                .apply_batch(
                    chat,
                    Arc::new(ChatWriteBatch {
                        events: (turn * 3 + 1..=turn * 3 + 3).map(event).collect(),
                        messages: (turn * 2..turn * 2 + 2).map(message).collect(),
                        ..ChatWriteBatch::default()
                    }),
                )
                .await
                .unwrap();
        }
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    let owners: Vec<String> = conn
        .prepare(
            "SELECT n.chat_id FROM chat_log l JOIN chat_numbers n ON n.chat_no = l.chat_no \
             ORDER BY l.rowid",
        )
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(owners, ["a", "b", "a", "b", "a", "b"]);
    let indexes: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'chat_log'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(indexes, 0, "a flush writes no per-chat index entry");

    // The chain reads back each chat's own rows, in order, from any point.
    let seqs: Vec<u64> = store
        .events_after("a", 2, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, (3..=9).collect::<Vec<_>>());
    assert_eq!(store.events_after("b", 7, 1).await.unwrap(), vec![event(8)]);
    assert_eq!(
        store.all_messages("b").await.unwrap(),
        (0..6).map(message).collect::<Vec<_>>()
    );
    let page: Vec<u64> = store
        .messages("a", 3, 2)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.idx)
        .collect();
    assert_eq!(page, [3, 4]);

    // An open chat's state goes to the log, not to its wide `chats` row; completion writes
    // it there once, for the listing and retention queries.
    let stored_status = |conn: &rusqlite::Connection| -> String {
        conn.query_row("SELECT status FROM chats WHERE chat_id = 'a'", [], |row| {
            row.get(0)
        })
        .unwrap()
    };
    let mut running = ChatState::initial(5);
    running.status = "running".to_owned();
    running.turn = 3;
    store.save_state("a", running.clone()).await.unwrap();
    assert_eq!(stored_status(&conn), "awaiting_user");
    assert_eq!(store.load_chat("a").await.unwrap().unwrap().state, running);
    let mut done = running;
    done.status = tessera_store::STATUS_COMPLETED.to_owned();
    store.save_state("a", done.clone()).await.unwrap();
    assert_eq!(stored_status(&conn), "completed");
    assert_eq!(store.load_chat("a").await.unwrap().unwrap().state, done);
    assert!(
        store
            .list_open_chats()
            .await
            .unwrap()
            .iter()
            .all(|c| c.record.chat_id != "a")
    );
}

#[tokio::test]
async fn a_log_row_that_does_not_parse_is_reported_as_corrupt() {
    let (_db, path) = temp_db();
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .create_chat(record("a", "acme", "u1", 1))
        .await
        .unwrap();
    store.append_events("a", vec![event(1)]).await.unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("UPDATE chat_log SET events = CAST('5:1' AS BLOB)", [])
        .unwrap();
    assert!(matches!(
        store.events_after("a", 0, 10).await,
        Err(StoreError::Corrupt(_))
    ));
}

#[tokio::test]
async fn claims_are_found_before_and_after_their_keys_are_indexed_and_go_with_their_chat() {
    let (_db, path) = temp_db();
    let store = SqliteStore::open(&path).await.unwrap();
    for (n, chat) in ["a", "b"].into_iter().enumerate() {
        store
            .create_chat(record(chat, "acme", "u1", n as i64))
            .await
            .unwrap();
    }
    // 40 claims: two full chains of 16 indexed, 8 still chained; even ones completed.
    for i in 0..40 {
        let key = format!("turn_a:s{i}:0");
        assert_eq!(
            store.claim_tool("a", &key, None).await.unwrap(),
            ToolClaim::Claimed
        );
        if i % 2 == 0 {
            store
                .complete_tool_with_result("a", &key, &serde_json::json!({ "i": i }))
                .await
                .unwrap();
        }
    }
    store.claim_tool("b", "turn_a:s0:0", None).await.unwrap();
    for i in 0..40 {
        let expected = if i % 2 == 0 {
            ToolClaim::AlreadyCompleted(Some(serde_json::json!({ "i": i })))
        } else {
            ToolClaim::AlreadyStarted
        };
        let key = format!("turn_a:s{i}:0");
        assert_eq!(
            store.claim_tool("a", &key, None).await.unwrap(),
            expected,
            "{key}"
        );
    }
    // An odd (started) claim completes once, indexed or chained; an even one is done.
    for i in [1, 39] {
        let key = format!("turn_a:s{i}:0");
        store
            .complete_tool_with_result("a", &key, &serde_json::Value::Null)
            .await
            .unwrap();
        assert_completion_refused(&store, "a", &key).await;
    }
    assert_completion_refused(&store, "a", "never").await;

    let conn = rusqlite::Connection::open(&path).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |row| row.get(0)).unwrap() };
    assert_eq!(count("SELECT COUNT(*) FROM tool_invocation_keys"), 32);
    assert_eq!(count("SELECT COUNT(*) FROM tool_invocations"), 41);
    assert!(store.delete_chat("a").await.unwrap());
    assert_eq!(count("SELECT COUNT(*) FROM tool_invocation_keys"), 0);
    assert_eq!(
        count("SELECT COUNT(*) FROM tool_invocations"),
        1,
        "b's claim stays"
    );
    assert_eq!(
        store.claim_tool("b", "turn_a:s0:0", None).await.unwrap(),
        ToolClaim::AlreadyStarted
    );
}

#[tokio::test]
async fn a_chain_of_claims_longer_than_its_count_is_still_walked_to_its_end() {
    let (_db, path) = temp_db();
    let store = open_with_chat(&path).await;
    assert_claims(&store, 0..8, ToolClaim::Claimed).await;
    // A write of its own commits the journaled claims to the database (a claim is found
    // in the journal until then).
    store
        .create_chat(record("c2", "acme", "u1", 2))
        .await
        .unwrap();
    store.close().await;
    // A damaged count: the chat's chain is 8 claims long but counted as none, so 12 more
    // claims stay chained too. The chain is then 20 long with a count of 12: its oldest
    // claims lie beyond both the count and the 16 a chain holds.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("UPDATE chat_heads SET unindexed_claims = 0", [])
        .map(|updated| assert_eq!(updated, 2))
        .unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    assert_claims(&store, 8..20, ToolClaim::Claimed).await;
    store
        .create_chat(record("c3", "acme", "u1", 3))
        .await
        .unwrap();
    assert_claims(&store, [0, 7, 8, 19], ToolClaim::AlreadyStarted).await;
    store.close().await;
}

/// `chain_filter` of each claim row of chat "c1", oldest first.
fn chain_filters(path: &std::path::Path) -> Vec<Option<i64>> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut statement = conn
        .prepare(
            "SELECT t.chain_filter FROM tool_invocations t JOIN chat_numbers n \
             ON n.chat_no = t.chat_no WHERE n.chat_id = 'c1' ORDER BY t.rowid",
        )
        .unwrap();
    statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test]
async fn a_chain_begun_without_filters_is_walked_until_it_is_indexed() {
    let (_db, path) = temp_db();
    let store = open_with_chat(&path).await;
    assert_claims(&store, 0..5, ToolClaim::Claimed).await;
    // A write of its own commits the journaled claims.
    store
        .create_chat(record("c2", "acme", "u1", 2))
        .await
        .unwrap();
    store.close().await;
    let filters = chain_filters(&path);
    assert_eq!(filters.len(), 5);
    assert!(
        filters.iter().all(Option::is_some),
        "a chain begun now has filters"
    );
    // Each filter holds its predecessor's bits.
    for pair in filters.windows(2) {
        let (older, newer) = (pair[0].unwrap(), pair[1].unwrap());
        assert_eq!(newer & older, older);
    }
    // As a chain begun before migration 10 stands: no filters.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("UPDATE tool_invocations SET chain_filter = NULL", [])
        .unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    assert_claims(&store, 5..8, ToolClaim::Claimed).await;
    store
        .create_chat(record("c3", "acme", "u1", 3))
        .await
        .unwrap();
    assert_claims(&store, 0..8, ToolClaim::AlreadyStarted).await;
    store.close().await;
    assert_eq!(
        chain_filters(&path),
        vec![None; 8],
        "claims chained after a row without a filter get none"
    );
    // Claims 8..16 fill the chain (16 keys), which is indexed; claim 16 begins a new one.
    let store = SqliteStore::open(&path).await.unwrap();
    assert_claims(&store, 8..17, ToolClaim::Claimed).await;
    store
        .create_chat(record("c4", "acme", "u1", 4))
        .await
        .unwrap();
    assert_claims(&store, [0, 7, 15, 16], ToolClaim::AlreadyStarted).await;
    store.close().await;
    let filters = chain_filters(&path);
    assert_eq!(filters.len(), 17);
    assert!(filters[..16].iter().all(Option::is_none));
    assert!(filters[16].is_some(), "the new chain has a filter");
}

#[tokio::test]
async fn the_heads_filter_decides_whether_the_chain_is_walked() {
    let (_db, path) = temp_db();
    let store = open_with_chat(&path).await;
    for i in 0..4 {
        store.claim_tool("c1", &step_key(i), None).await.unwrap();
    }
    store
        .complete_tool_with_result("c1", &step_key(1), &serde_json::json!("one"))
        .await
        .unwrap();
    store
        .create_chat(record("c2", "acme", "u1", 2))
        .await
        .unwrap();
    store.close().await;
    let set_head_filter = |filter: i64| {
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute(
                "UPDATE tool_invocations SET chain_filter = ?1 WHERE rowid = \
                 (SELECT h.claims_head FROM chat_heads h JOIN chat_numbers n \
                  ON n.chat_no = h.chat_no WHERE n.chat_id = 'c1')",
                [filter],
            )
            .unwrap()
    };
    // Every bit set: every key may be in the chain, so each is walked for and found, or not.
    assert_eq!(set_head_filter(-1), 1);
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        store.claim_tool("c1", &step_key(0), None).await.unwrap(),
        ToolClaim::AlreadyStarted
    );
    assert_eq!(
        store.claim_tool("c1", &step_key(1), None).await.unwrap(),
        ToolClaim::AlreadyCompleted(Some(serde_json::json!("one")))
    );
    assert_eq!(
        store.claim_tool("c1", &step_key(9), None).await.unwrap(),
        ToolClaim::Claimed
    );
    store.close().await;
    // No bit set at the head: the walk stops there, so an older chained key reads as never
    // claimed. (Which is why every claim row's filter holds its predecessor's bits.)
    assert_eq!(set_head_filter(0), 1);
    let store = SqliteStore::open(&path).await.unwrap();
    assert_completion_refused(&store, "c1", &step_key(2)).await;
    // The head's own key is still found: its key is compared before its filter.
    store
        .complete_tool_with_result("c1", &step_key(9), &serde_json::Value::Null)
        .await
        .unwrap();
    store.close().await;
}

/// A completion of the chat's newest claim, or of the one before it (the next turn claimed
/// first), is written by row at once, with the heads as the writer keeps them or as read
/// after a restart; one of an older claim (parallel tool calls) is looked for. Each result
/// lands on its own key's row, and no path completes a claim twice.
#[tokio::test]
async fn completions_of_the_newest_and_of_older_claims_each_land_on_their_own_key() {
    let (_db, path) = temp_db();
    let store = open_with_chat(&path).await;
    let completed = |i: usize| ToolClaim::AlreadyCompleted(Some(serde_json::json!(step_key(i))));
    assert_claims(&store, 0..4, ToolClaim::Claimed).await;
    // The one before the newest, with the heads the writer keeps.
    complete_with_its_key(&store, 2).await;
    assert_claims(&store, [2], completed(2)).await;
    // Its neighbours are not completed by its result.
    assert_claims(&store, [0, 1, 3], ToolClaim::AlreadyStarted).await;
    // An older one, looked for.
    complete_with_its_key(&store, 0).await;
    assert_claims(&store, [0], completed(0)).await;
    assert_claims(&store, [1, 3], ToolClaim::AlreadyStarted).await;
    store.close().await;

    // After a restart: an older one again, then a new claim.
    let store = SqliteStore::open(&path).await.unwrap();
    assert_completion_refused(&store, "c1", &step_key(2)).await;
    complete_with_its_key(&store, 1).await;
    assert_claims(&store, [1], completed(1)).await;
    assert_claims(&store, [4], ToolClaim::Claimed).await;
    store.close().await;

    // After another, with the heads read from the database: the one before the newest, then
    // the newest.
    let store = SqliteStore::open(&path).await.unwrap();
    complete_with_its_key(&store, 3).await;
    assert_claims(&store, [3], completed(3)).await;
    assert_claims(&store, [4], ToolClaim::AlreadyStarted).await;
    complete_with_its_key(&store, 4).await;
    // No completion lands twice, and each result is its own key's.
    for i in 0..5 {
        assert_completion_refused(&store, "c1", &step_key(i)).await;
        assert_claims(&store, [i], completed(i)).await;
    }
    assert_completion_refused(&store, "c1", "never").await;
    store.close().await;
}

/// The key [`assert_claims`] claims for step `i` of chat "c1".
fn step_key(i: usize) -> String {
    format!("turn_c1:s{i}:0")
}

/// Completes step `i`'s claim of chat "c1" with its own key as the result.
async fn complete_with_its_key(store: &SqliteStore, i: usize) {
    store
        .complete_tool_with_result("c1", &step_key(i), &serde_json::json!(step_key(i)))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_chain_head_pointing_at_no_claim_ends_the_walk_without_an_error() {
    let (_db, path) = temp_db();
    let store = open_with_chat(&path).await;
    store.claim_tool("c1", "turn_c1:s0:0", None).await.unwrap();
    store
        .create_chat(record("c2", "acme", "u1", 2))
        .await
        .unwrap();
    store.close().await;
    // A damaged head: the claim it names is gone.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE chat_heads SET claims_head = claims_head + 1000 WHERE claims_head IS NOT NULL",
            [],
        )
        .map(|updated| assert_eq!(updated, 1))
        .unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        store.claim_tool("c1", "turn_c1:s1:0", None).await.unwrap(),
        ToolClaim::Claimed
    );
    assert_completion_refused(&store, "c1", "never").await;
    store.close().await;
}

/// A completion of `key` refused as a conflict (completed already, or never claimed).
async fn assert_completion_refused(store: &SqliteStore, chat_id: &str, key: &str) {
    let completed = store
        .complete_tool_with_result(chat_id, key, &serde_json::Value::Null)
        .await;
    assert!(
        matches!(completed, Err(StoreError::Conflict(_))),
        "{chat_id}/{key}: {completed:?}"
    );
}

/// Claims `turn_c1:s{i}:0` of chat "c1" for every `i` of `steps`, asserting each answer.
async fn assert_claims(
    store: &SqliteStore,
    steps: impl IntoIterator<Item = usize>,
    expected: ToolClaim,
) {
    for i in steps {
        let key = step_key(i);
        assert_eq!(
            store.claim_tool("c1", &key, None).await.unwrap(),
            expected,
            "{key}"
        );
    }
}

/// The store on `path`, holding chat "c1".
async fn open_with_chat(path: &std::path::Path) -> SqliteStore {
    let store = SqliteStore::open(path).await.unwrap();
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    store
}

/// Holds the database's write lock from a connection of its own until dropped: the store's
/// writer cannot commit meanwhile, so what a claim wrote is in its journal only.
struct WriteLock(rusqlite::Connection);

impl WriteLock {
    fn take(path: &std::path::Path) -> Self {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        Self(conn)
    }
}

impl Drop for WriteLock {
    fn drop(&mut self) {
        let _ = self.0.execute_batch("ROLLBACK");
    }
}

/// `db`'s companion file with `suffix` (`-wal`, `-claims`).
fn beside(db: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    std::path::PathBuf::from(name)
}

/// The files of the database at `from` as they are now (a crash's leftovers), copied to
/// `to`: the database, its WAL and the claims journal.
fn copy_files(from: &std::path::Path, to: &std::path::Path) {
    for suffix in ["", "-wal", "-claims"] {
        if beside(from, suffix).exists() {
            std::fs::copy(beside(from, suffix), beside(to, suffix)).unwrap();
        }
    }
}

/// A store with chat "c1" whose claim of `key` is in the claims journal only, and the path
/// of a copy of its files taken right then (`crashed.db`: what a crash would leave).
async fn crashed_after_a_journaled_claim(key: &str) -> (TestDb, SqliteStore, std::path::PathBuf) {
    let (db, path) = temp_db();
    let store = open_with_chat(&path).await;
    let crashed = path.with_file_name("crashed.db");
    {
        let _lock = WriteLock::take(&path);
        assert_eq!(
            store.claim_tool("c1", key, None).await.unwrap(),
            ToolClaim::Claimed
        );
        copy_files(&path, &crashed);
    }
    assert_eq!(
        stored_claims(&crashed),
        0,
        "the copy's database lacks the claim"
    );
    (db, store, crashed)
}

fn stored_claims(path: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT COUNT(*) FROM tool_invocations", [], |row| {
        row.get(0)
    })
    .unwrap()
}

/// A claim is answered once it is in the claims journal, before any commit, and a crash
/// right then loses it no more than a crash after a commit would: the copy of the files
/// taken while the database could not be written holds the claim in the journal alone, and
/// the store opened on that copy knows it (and writes it into the database).
#[tokio::test]
async fn a_claim_answered_from_the_journal_survives_a_crash_before_any_commit() {
    let (_db, store, crashed) = crashed_after_a_journaled_claim("k1").await;
    let reopened = SqliteStore::open(&crashed).await.unwrap();
    assert_eq!(
        stored_claims(&crashed),
        1,
        "recovery wrote it into the database"
    );
    assert_eq!(
        reopened.claim_tool("c1", "k1", None).await.unwrap(),
        ToolClaim::AlreadyStarted
    );
    assert_eq!(
        reopened.claim_tool("c1", "k2", None).await.unwrap(),
        ToolClaim::Claimed
    );
    // The original store commits its claim once the lock is gone, and completes it.
    store
        .complete_tool_with_result("c1", "k1", &serde_json::json!("done"))
        .await
        .unwrap();
    assert_eq!(
        store.claim_tool("c1", "k1", None).await.unwrap(),
        ToolClaim::AlreadyCompleted(Some(serde_json::json!("done")))
    );
}

/// Two stores on one file (two processes, or two nodes sharing a disk) see each other's
/// journaled claims: a key one of them claimed, not yet in the database, is refused to the
/// other; and of many concurrent claims of one key across both, exactly one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_grant_a_key_once() {
    let (_db, path) = temp_db();
    let first = SqliteStore::open(&path).await.unwrap();
    let second = SqliteStore::open(&path).await.unwrap();
    first
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    {
        let _lock = WriteLock::take(&path);
        assert_eq!(
            first.claim_tool("c1", "k", None).await.unwrap(),
            ToolClaim::Claimed
        );
        assert_eq!(
            second.claim_tool("c1", "k", None).await.unwrap(),
            ToolClaim::AlreadyStarted
        );
        assert_eq!(stored_claims(&path), 0, "refused from the journal alone");
    }

    let claims = (0..40).map(|i| {
        let store = if i % 2 == 0 { &first } else { &second };
        store.claim_tool("c1", "contended", None)
    });
    let outcomes = futures::future::join_all(claims).await;
    let won = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(ToolClaim::Claimed)))
        .count();
    assert_eq!(won, 1, "{outcomes:?}");
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
}

/// The journal is emptied once it grows past its limit and every claim in it is in the
/// database; the claims stay claimed, before and after reopening.
#[tokio::test]
async fn the_claims_journal_is_emptied_once_its_claims_are_in_the_database() {
    let (_db, path) = temp_db();
    let store = open_with_chat(&path).await;
    let journal = beside(&path, "-claims");
    // ~80 bytes a record: past the 256 KiB limit.
    let keys: Vec<String> = (0..4_500)
        .map(|i| format!("turn_{i:04}:call_{i:08}_0123456789abcdef:0"))
        .collect();
    let mut largest = 0;
    for key in &keys {
        assert_eq!(
            store.claim_tool("c1", key, None).await.unwrap(),
            ToolClaim::Claimed
        );
        largest = largest.max(std::fs::metadata(&journal).unwrap().len());
    }
    // A write that waits for its commit: the journal is reset after it.
    store.append_events("c1", vec![event(1)]).await.unwrap();
    let len = std::fs::metadata(&journal).unwrap().len();
    assert!(largest > 256 * 1024, "the journal grew to {largest} bytes");
    assert!(len < 256 * 1024, "the journal was reset: {len} bytes");
    for key in [&keys[0], &keys[4_499]] {
        assert_eq!(
            store.claim_tool("c1", key, None).await.unwrap(),
            ToolClaim::AlreadyStarted
        );
    }
    store.close().await;
    let reopened = SqliteStore::open(&path).await.unwrap();
    assert_eq!(stored_claims(&path), 4_500);
    assert_eq!(
        reopened.claim_tool("c1", &keys[2_000], None).await.unwrap(),
        ToolClaim::AlreadyStarted
    );
}

/// A journal whose tail was torn (a power loss mid-append) keeps the claims before the tear;
/// a file that is no claims journal is refused with a clear error.
#[tokio::test]
async fn a_torn_journal_keeps_its_whole_records_and_a_foreign_file_is_refused() {
    let (_db, _store, crashed) = crashed_after_a_journaled_claim("whole").await;
    let journal = beside(&crashed, "-claims");
    let mut bytes = std::fs::read(&journal).unwrap();
    // Half of a second record, as a power loss may leave it.
    bytes.extend_from_slice(&[40, 0, 0, 0, 1, 2, 3, 4, 2, 0, 0, 0, b'c']);
    std::fs::write(&journal, &bytes).unwrap();
    let reopened = SqliteStore::open(&crashed).await.unwrap();
    assert_eq!(
        reopened.claim_tool("c1", "whole", None).await.unwrap(),
        ToolClaim::AlreadyStarted
    );
    assert_eq!(
        reopened.claim_tool("c1", "next", None).await.unwrap(),
        ToolClaim::Claimed
    );
    reopened.close().await;

    std::fs::write(&journal, b"not a claims journal at all").unwrap();
    let refused = SqliteStore::open(&crashed).await.unwrap_err();
    assert!(matches!(refused, StoreError::Setup(_)), "{refused}");
    assert!(refused.to_string().contains("claims journal"), "{refused}");
}

/// A claim submitted after its key's completion (still waiting for its commit) is answered
/// after that completion: "already completed" with the result, not "started".
#[tokio::test]
async fn a_claim_behind_its_keys_pending_completion_sees_the_completion() {
    let (_db, path) = temp_db();
    let store = open_with_chat(&path).await;
    assert_eq!(
        store.claim_tool("c1", "k", None).await.unwrap(),
        ToolClaim::Claimed
    );
    // Both submitted now, in this order (a store call submits when called).
    let completed = store.complete_tool_with_result("c1", "k", &serde_json::json!(7));
    let again = store.claim_tool("c1", "k", None);
    assert_eq!(
        again.await.unwrap(),
        ToolClaim::AlreadyCompleted(Some(serde_json::json!(7)))
    );
    completed.await.unwrap();
}

/// A claim submitted right behind its chat's creation is answered after that creation.
#[tokio::test]
async fn a_claim_right_behind_its_chats_creation_is_granted() {
    let (_db, path) = temp_db();
    let store = SqliteStore::open(&path).await.unwrap();
    let created = store.create_chat(record("c1", "acme", "u1", 1));
    let claimed = store.claim_tool("c1", "k", None);
    assert_eq!(claimed.await.unwrap(), ToolClaim::Claimed);
    created.await.unwrap();
    assert_eq!(
        store.claim_tool("c1", "k", None).await.unwrap(),
        ToolClaim::AlreadyStarted
    );
}
