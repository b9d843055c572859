//! Chats, state, transcript, events and pending UI calls, against real SQLite files.

mod common;

use std::sync::Arc;

use common::{event, message, open, record, temp_db};
use serde_json::json;
use tessera_store::{
    ChatState, ChatStore, PendingUiRecord, STATUS_AWAITING_USER, STATUS_COMPLETED, SqliteStore,
    StoreError,
};

fn state(status: &str, turn: u32) -> ChatState {
    let mut context = serde_json::Map::new();
    context.insert("customer".to_owned(), json!({"name": "Ada", "tier": 2}));
    ChatState {
        status: status.to_owned(),
        current_agent: "billing".to_owned(),
        turn,
        consecutive: 1,
        context,
        updated_at_ms: 5_000 + i64::from(turn),
    }
}

#[tokio::test]
async fn create_load_list_and_state_round_trip() {
    let db = temp_db();
    let store = open(&db).await;

    store
        .create_chat(record("c1", "acme", "u1", 1_000))
        .await
        .unwrap();
    store
        .create_chat(record("c2", "acme", "u1", 2_000))
        .await
        .unwrap();
    store
        .create_chat(record("c3", "acme", "u1", 3_000))
        .await
        .unwrap();
    store
        .create_chat(record("other-user", "acme", "u2", 4_000))
        .await
        .unwrap();
    store
        .create_chat(record("other-tenant", "beta", "u1", 5_000))
        .await
        .unwrap();

    let loaded = store.load_chat("c1").await.unwrap().expect("c1 exists");
    assert_eq!(loaded.record, record("c1", "acme", "u1", 1_000));
    assert_eq!(loaded.state, ChatState::initial(1_000));
    assert_eq!(loaded.state.status, STATUS_AWAITING_USER);
    assert_eq!(loaded.state.turn, 0);

    let saved = state("running", 3);
    store.save_state("c1", saved.clone()).await.unwrap();
    assert_eq!(store.load_chat("c1").await.unwrap().unwrap().state, saved);

    assert!(store.load_chat("nope").await.unwrap().is_none());
    assert!(matches!(
        store.save_state("nope", saved.clone()).await,
        Err(StoreError::NotFound(id)) if id == "nope"
    ));
    assert!(matches!(
        store.create_chat(record("c1", "acme", "u1", 9)).await,
        Err(StoreError::Conflict(_))
    ));

    let ids = |v: Vec<tessera_store::StoredChat>| -> Vec<String> {
        v.into_iter().map(|c| c.record.chat_id).collect()
    };
    assert_eq!(
        ids(store.list_chats("acme", "u1", 10, 0).await.unwrap()),
        ["c3", "c2", "c1"]
    );
    assert_eq!(
        ids(store.list_chats("acme", "u1", 2, 0).await.unwrap()),
        ["c3", "c2"]
    );
    assert_eq!(
        ids(store.list_chats("acme", "u1", 2, 2).await.unwrap()),
        ["c1"]
    );
    assert_eq!(
        ids(store.list_chats("acme", "u2", 10, 0).await.unwrap()),
        ["other-user"]
    );
    assert_eq!(
        ids(store.list_chats("beta", "u1", 10, 0).await.unwrap()),
        ["other-tenant"]
    );
    assert!(
        store
            .list_chats("gamma", "u1", 10, 0)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn usable_as_dyn_chat_store() {
    let db = temp_db();
    let store: Arc<dyn ChatStore> = Arc::new(open(&db).await);
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    // The futures are 'static: they can be spawned.
    let s = Arc::clone(&store);
    let loaded = tokio::spawn(async move { s.load_chat("c1").await })
        .await
        .unwrap()
        .unwrap();
    assert!(loaded.is_some());
}

#[tokio::test]
async fn everything_survives_reopening_the_file() {
    let db = temp_db();
    {
        let store = open(&db).await;
        store
            .create_chat(record("c1", "acme", "u1", 1_000))
            .await
            .unwrap();
        store.save_state("c1", state("running", 2)).await.unwrap();
        store
            .append_messages("c1", (0..4).map(message).collect())
            .await
            .unwrap();
        store
            .append_events("c1", (1..=5).map(event).collect())
            .await
            .unwrap();
        store
            .put_pending_ui(
                "c1",
                PendingUiRecord {
                    corr: "corr-1".to_owned(),
                    turn_key: "t2:call_1".to_owned(),
                    call: json!({"component": "confirm", "props": {"text": "Sure?"}}),
                    created_at_ms: 1_500,
                    timeout_at_ms: Some(61_500),
                },
            )
            .await
            .unwrap();
        assert_eq!(
            store.claim_tool("c1", "t2:call_0").await.unwrap(),
            tessera_store::ToolClaim::Claimed
        );
        store
            .complete_tool_with_result("c1", "t2:call_0", &json!({"ok": true}))
            .await
            .unwrap();
        // Dropped without close(): committed data must not depend on an orderly shutdown.
        drop(store);
    }
    let store = open(&db).await;
    let chat = store.load_chat("c1").await.unwrap().expect("chat survives");
    assert_eq!(chat.state, state("running", 2));
    assert_eq!(
        store.all_messages("c1").await.unwrap(),
        (0..4).map(message).collect::<Vec<_>>()
    );
    assert_eq!(
        store.events_after("c1", 0, 100).await.unwrap(),
        (1..=5).map(event).collect::<Vec<_>>()
    );
    assert_eq!(store.last_seq("c1").await.unwrap(), 5);
    let pending = store.pending_ui("c1").await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].timeout_at_ms, Some(61_500));
    assert_eq!(
        store.claim_tool("c1", "t2:call_0").await.unwrap(),
        tessera_store::ToolClaim::AlreadyCompleted(Some(json!({"ok": true})))
    );
    assert_eq!(store.list_open_chats().await.unwrap().len(), 1);
}

#[tokio::test]
async fn messages_are_ordered_paged_and_never_overwritten() {
    let db = temp_db();
    let store = open(&db).await;
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    // Appended out of order, in two batches.
    store
        .append_messages("c1", vec![message(2), message(0), message(1)])
        .await
        .unwrap();
    store
        .append_messages("c1", (3..10).map(message).collect())
        .await
        .unwrap();
    let all = store.all_messages("c1").await.unwrap();
    assert_eq!(all, (0..10).map(message).collect::<Vec<_>>());
    assert!(all[3].ui_hidden);
    assert_eq!(all[1].agent.as_deref(), Some("triage"));
    assert_eq!(all[0].agent, None);

    let page: Vec<u64> = store
        .messages("c1", 4, 3)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.idx)
        .collect();
    assert_eq!(page, [4, 5, 6]);
    assert!(store.messages("c1", 10, 3).await.unwrap().is_empty());
    assert!(store.messages("c1", u64::MAX, 3).await.unwrap().is_empty());

    // A batch with one duplicate idx is rejected as a whole.
    let mut dup = message(5);
    dup.content = "overwrite attempt".to_owned();
    assert!(matches!(
        store.append_messages("c1", vec![message(10), dup]).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.all_messages("c1").await.unwrap(), all);

    // Messages need an existing chat.
    assert!(matches!(
        store.append_messages("ghost", vec![message(0)]).await,
        Err(StoreError::NotFound(_))
    ));
}

#[tokio::test]
async fn events_after_is_ordered_and_pages() {
    let db = temp_db();
    let store = open(&db).await;
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    store
        .create_chat(record("c2", "acme", "u1", 2))
        .await
        .unwrap();
    assert_eq!(store.last_seq("c1").await.unwrap(), 0);
    assert!(store.events_after("c1", 0, 10).await.unwrap().is_empty());

    store
        .append_events("c1", vec![event(3), event(1), event(2)])
        .await
        .unwrap();
    store
        .append_events("c1", (4..=25).map(event).collect())
        .await
        .unwrap();
    store.append_events("c2", vec![event(1)]).await.unwrap();
    store.append_events("c1", Vec::new()).await.unwrap();

    let seqs =
        |v: Vec<tessera_store::StoredEvent>| -> Vec<u64> { v.into_iter().map(|e| e.seq).collect() };
    assert_eq!(
        seqs(store.events_after("c1", 0, 5).await.unwrap()),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(
        seqs(store.events_after("c1", 5, 5).await.unwrap()),
        [6, 7, 8, 9, 10]
    );
    assert_eq!(
        seqs(store.events_after("c1", 22, 10).await.unwrap()),
        [23, 24, 25]
    );
    assert!(store.events_after("c1", 25, 10).await.unwrap().is_empty());
    assert!(
        store
            .events_after("c1", u64::MAX, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Paging to the end visits every event exactly once.
    let mut after = 0;
    let mut seen = Vec::new();
    loop {
        let page = store.events_after("c1", after, 7).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        seen.extend(page.into_iter().map(|e| e.seq));
    }
    assert_eq!(seen, (1..=25).collect::<Vec<_>>());

    assert_eq!(store.last_seq("c1").await.unwrap(), 25);
    assert_eq!(store.last_seq("c2").await.unwrap(), 1);
    assert_eq!(store.events_after("c1", 0, 1).await.unwrap()[0], event(1));
}

#[tokio::test]
async fn duplicate_seq_is_an_error_and_leaves_the_log_unchanged() {
    let db = temp_db();
    let store = open(&db).await;
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    store
        .append_events("c1", (1..=3).map(event).collect())
        .await
        .unwrap();
    let before = store.events_after("c1", 0, 100).await.unwrap();

    let mut clash = event(2);
    clash.json = r#"{"overwritten":true}"#.to_owned();
    // New seqs before and after the clash must not be kept either.
    let err = store
        .append_events("c1", vec![event(4), clash, event(5)])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    assert_eq!(store.events_after("c1", 0, 100).await.unwrap(), before);
    assert_eq!(store.last_seq("c1").await.unwrap(), 3);

    // A duplicate inside one batch too.
    assert!(matches!(
        store.append_events("c1", vec![event(4), event(4)]).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.events_after("c1", 0, 100).await.unwrap(), before);

    // The same seq in another chat is fine.
    store
        .create_chat(record("c2", "acme", "u1", 2))
        .await
        .unwrap();
    store.append_events("c2", vec![event(2)]).await.unwrap();
}

#[tokio::test]
async fn pending_ui_put_list_remove() {
    let db = temp_db();
    let store = open(&db).await;
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    let rec = |corr: &str, at: i64| PendingUiRecord {
        corr: corr.to_owned(),
        turn_key: format!("t1:{corr}"),
        call: json!({"component": "form", "corr": corr}),
        created_at_ms: at,
        timeout_at_ms: None,
    };
    store.put_pending_ui("c1", rec("b", 20)).await.unwrap();
    store.put_pending_ui("c1", rec("a", 10)).await.unwrap();
    assert_eq!(
        store.pending_ui("c1").await.unwrap(),
        vec![rec("a", 10), rec("b", 20)]
    );

    // Same corr replaces.
    let mut replaced = rec("b", 20);
    replaced.timeout_at_ms = Some(99);
    store.put_pending_ui("c1", replaced.clone()).await.unwrap();
    assert_eq!(
        store.pending_ui("c1").await.unwrap(),
        vec![rec("a", 10), replaced]
    );

    assert!(store.remove_pending_ui("c1", "a").await.unwrap());
    assert!(!store.remove_pending_ui("c1", "a").await.unwrap());
    assert_eq!(store.pending_ui("c1").await.unwrap().len(), 1);
    assert!(store.pending_ui("c2").await.unwrap().is_empty());
    assert!(matches!(
        store.put_pending_ui("ghost", rec("x", 1)).await,
        Err(StoreError::NotFound(_))
    ));
}

#[tokio::test]
async fn list_open_chats_excludes_completed() {
    let db = temp_db();
    let store = open(&db).await;
    for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
        store
            .create_chat(record(
                id,
                "acme",
                &format!("u{i}"),
                i64::try_from(i).unwrap(),
            ))
            .await
            .unwrap();
    }
    store
        .save_state("b", state(STATUS_COMPLETED, 4))
        .await
        .unwrap();
    store.save_state("c", state("running", 1)).await.unwrap();
    store
        .save_state("d", state(STATUS_COMPLETED, 2))
        .await
        .unwrap();
    let open_ids: Vec<String> = store
        .list_open_chats()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.record.chat_id)
        .collect();
    assert_eq!(open_ids, ["a", "c"]);
}

#[tokio::test]
async fn delete_chat_cascades() {
    let db = temp_db();
    let store = open(&db).await;
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    store
        .create_chat(record("c2", "acme", "u1", 2))
        .await
        .unwrap();
    for id in ["c1", "c2"] {
        store.append_messages(id, vec![message(0)]).await.unwrap();
        store.append_events(id, vec![event(1)]).await.unwrap();
        store.claim_tool(id, "k").await.unwrap();
    }
    let art = tessera_tools::ArtifactStore::put(&store, "acme", "u1", "c1", "f.zip", "x".into())
        .await
        .unwrap();

    assert!(store.delete_chat("c1").await.unwrap());
    assert!(!store.delete_chat("c1").await.unwrap());
    assert!(store.load_chat("c1").await.unwrap().is_none());
    assert!(store.all_messages("c1").await.unwrap().is_empty());
    assert!(store.events_after("c1", 0, 10).await.unwrap().is_empty());
    assert!(
        tessera_tools::ArtifactStore::get(&store, "acme", "u1", "c1", &art.id)
            .await
            .unwrap()
            .is_none()
    );
    // A recreated chat starts from scratch, claims included.
    store
        .create_chat(record("c1", "acme", "u1", 3))
        .await
        .unwrap();
    assert_eq!(
        store.claim_tool("c1", "k").await.unwrap(),
        tessera_store::ToolClaim::Claimed
    );
    // The other chat is untouched.
    assert_eq!(store.all_messages("c2").await.unwrap().len(), 1);
    assert_eq!(store.last_seq("c2").await.unwrap(), 1);
}

#[tokio::test]
async fn migrations_are_idempotent() {
    let db = temp_db();
    let first = open(&db).await;
    first
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    assert_eq!(
        first.schema_version().await.unwrap(),
        SqliteStore::latest_schema_version()
    );
    // A second store on the same file while the first is still open, then a third after.
    let second = open(&db).await;
    assert_eq!(
        second.schema_version().await.unwrap(),
        SqliteStore::latest_schema_version()
    );
    first.close().await;
    second.close().await;
    let third = open(&db).await;
    assert_eq!(
        third.schema_version().await.unwrap(),
        SqliteStore::latest_schema_version()
    );
    assert!(third.load_chat("c1").await.unwrap().is_some());
}

#[tokio::test]
async fn in_memory_store_works() {
    let store = SqliteStore::in_memory().await.unwrap();
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    store
        .append_events("c1", vec![event(1), event(2)])
        .await
        .unwrap();
    assert_eq!(store.last_seq("c1").await.unwrap(), 2);
    // Each in-memory store is its own database.
    let other = SqliteStore::in_memory().await.unwrap();
    assert!(other.load_chat("c1").await.unwrap().is_none());
}

#[tokio::test]
async fn the_workflow_version_round_trips_and_older_chats_get_an_empty_one() {
    // A database as schema 2 left it, with one chat, written without the store.
    let db = temp_db();
    if let Some(parent) = db.path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    {
        let conn = rusqlite::Connection::open(&db.path).unwrap();
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
    let store = open(&db).await;
    assert_eq!(store.schema_version().await.unwrap(), 3);
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
