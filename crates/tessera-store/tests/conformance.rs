//! The store conformance suite: every test here runs against SQLite (always) and PostgreSQL
//! (when `TESSERA_TEST_DATABASE_URL` is set; skipped with a message otherwise, failing under
//! `CI=true`), each on a database of its own, so both backends are held to one behaviour.
//! Lease and fencing tests run on PostgreSQL alone (SQLite is single-node: it has no leases).

#[macro_use]
mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{TestDb, TestStore, event, message, open, record};
use futures::future::join_all;
use serde_json::json;
use tessera_store::{
    ChatState, ChatStore, ChatWriteBatch, Completion, LeaseStore, PendingUiRecord,
    STATUS_AWAITING_USER, STATUS_COMPLETED, StoreError, ToolClaim, WorkflowVersion,
    WorkflowVersionStore,
};
use tessera_tools::{ArtifactStore, TaskFilter, TaskStore};

async fn create_load_list_and_state_round_trip(db: TestDb) {
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

async fn usable_as_dyn_chat_store(db: TestDb) {
    let store: Arc<dyn ChatStore> = open(&db).await.shared();
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

async fn everything_survives_reopening_the_file(db: TestDb) {
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
            store.claim_tool("c1", "t2:call_0", None).await.unwrap(),
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
        store.claim_tool("c1", "t2:call_0", None).await.unwrap(),
        tessera_store::ToolClaim::AlreadyCompleted(Some(json!({"ok": true})))
    );
    assert_eq!(store.list_open_chats().await.unwrap().len(), 1);
}

async fn messages_are_ordered_paged_and_never_overwritten(db: TestDb) {
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
    dup.content = "overwrite attempt".into();
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

async fn events_after_is_ordered_and_pages(db: TestDb) {
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

async fn duplicate_seq_is_an_error_and_leaves_the_log_unchanged(db: TestDb) {
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
    clash.json = r#"{"overwritten":true}"#.into();
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

async fn pending_ui_put_list_remove(db: TestDb) {
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

async fn list_open_chats_excludes_completed(db: TestDb) {
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

async fn delete_chat_cascades(db: TestDb) {
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
        store.claim_tool(id, "k", None).await.unwrap();
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
        store.claim_tool("c1", "k", None).await.unwrap(),
        tessera_store::ToolClaim::Claimed
    );
    // The other chat is untouched.
    assert_eq!(store.all_messages("c2").await.unwrap().len(), 1);
    assert_eq!(store.last_seq("c2").await.unwrap(), 1);
}

// ---- data lifecycle: retention and the per-tenant file quota

async fn completed_chats_before_lists_only_old_completed_chats_oldest_first(db: TestDb) {
    let store = open(&db).await;
    for (id, status, updated) in [
        ("old-done-2", STATUS_COMPLETED, 200),
        ("old-done-1", STATUS_COMPLETED, 100),
        ("old-open", STATUS_AWAITING_USER, 50),
        ("new-done", STATUS_COMPLETED, 5_000),
    ] {
        store
            .create_chat(record(id, "acme", "u1", 1))
            .await
            .unwrap();
        let state = ChatState {
            status: status.to_owned(),
            ..ChatState::initial(updated)
        };
        store.save_state(id, state).await.unwrap();
    }
    let due = store.completed_chats_before(1_000, 10).await.unwrap();
    assert_eq!(due, ["old-done-1", "old-done-2"]);
    let first = store.completed_chats_before(1_000, 1).await.unwrap();
    assert_eq!(first, ["old-done-1"], "the limit caps one purge round");
}

async fn count_open_chats_counts_a_tenants_chats_not_completed(db: TestDb) {
    let store = open(&db).await;
    assert_eq!(store.count_open_chats("acme").await.unwrap(), 0);
    for (id, tenant, status) in [
        ("a-open-1", "acme", None),
        ("a-open-2", "acme", Some(STATUS_AWAITING_USER)),
        ("a-done", "acme", Some(STATUS_COMPLETED)),
        ("b-open", "beta", None),
    ] {
        store
            .create_chat(record(id, tenant, "u1", 1))
            .await
            .unwrap();
        if let Some(status) = status {
            let state = ChatState {
                status: status.to_owned(),
                ..ChatState::initial(2)
            };
            store.save_state(id, state).await.unwrap();
        }
    }
    assert_eq!(
        store.count_open_chats("acme").await.unwrap(),
        2,
        "a just-created chat counts, a completed one does not"
    );
    assert_eq!(store.count_open_chats("beta").await.unwrap(), 1);
    assert!(store.delete_chat("a-open-1").await.unwrap());
    assert_eq!(store.count_open_chats("acme").await.unwrap(), 1);
}

async fn generated_files_over_the_tenant_quota_are_refused_and_nothing_is_stored(db: TestDb) {
    let store = open(&db).await.with_tenant_file_quota(100);
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    ArtifactStore::put(&store, "acme", "u1", "c1", "a.zip", vec![b'x'; 60].into())
        .await
        .unwrap();
    let refused = ArtifactStore::put(&store, "acme", "u2", "c1", "b.zip", vec![b'x'; 41].into())
        .await
        .expect_err("60 + 41 bytes is over the 100-byte quota");
    assert!(refused.0.contains("quota"), "{}", refused.0);
    assert!(refused.0.contains("101 bytes"), "{}", refused.0);
    // Another tenant has its own quota; this tenant can still use what is left, which shows
    // the refused file was not stored.
    ArtifactStore::put(&store, "other", "u1", "c9", "c.zip", vec![b'x'; 100].into())
        .await
        .unwrap();
    ArtifactStore::put(&store, "acme", "u1", "c1", "d.zip", vec![b'x'; 40].into())
        .await
        .unwrap();
    ArtifactStore::put(&store, "acme", "u1", "c1", "e.zip", vec![b'x'; 1].into())
        .await
        .expect_err("the quota is full");
    // Deleting the chat frees its files' share.
    assert!(store.delete_chat("c1").await.unwrap());
    ArtifactStore::put(&store, "acme", "u1", "c2", "f.zip", vec![b'x'; 100].into())
        .await
        .unwrap();
}

async fn concurrent_files_cannot_overshoot_the_tenant_quota_together(db: TestDb) {
    // Two stores on the same data (two nodes, or a restart) racing ten 30-byte files at a
    // 100-byte quota: exactly three fit.
    let first = open(&db).await.with_tenant_file_quota(100);
    let second = open(&db).await.with_tenant_file_quota(100);
    let puts = (0..10).map(|i| {
        let store = if i % 2 == 0 { &first } else { &second };
        ArtifactStore::put(store, "acme", "u1", "c1", "f.zip", vec![b'x'; 30].into())
    });
    let stored = join_all(puts)
        .await
        .into_iter()
        .filter(|r| r.is_ok())
        .count();
    assert_eq!(stored, 3);
}

async fn migrations_are_idempotent(db: TestDb) {
    let first = open(&db).await;
    first
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();
    assert_eq!(
        first.schema_version().await.unwrap(),
        first.latest_schema_version()
    );
    // A second store on the same file while the first is still open, then a third after.
    let second = open(&db).await;
    assert_eq!(
        second.schema_version().await.unwrap(),
        first.latest_schema_version()
    );
    first.close().await;
    second.close().await;
    let third = open(&db).await;
    assert_eq!(
        third.schema_version().await.unwrap(),
        first.latest_schema_version()
    );
    assert!(third.load_chat("c1").await.unwrap().is_some());
}

fn versions_of(store: &common::TestStore) -> Arc<dyn WorkflowVersionStore> {
    match store {
        common::TestStore::Sqlite(s) => Arc::new(s.clone()),
        common::TestStore::Pg(s) => Arc::new(s.clone()),
    }
}

fn workflow_version(name: &str, version: &str, agents: &str) -> WorkflowVersion {
    WorkflowVersion {
        name: name.into(),
        version: version.into(),
        files: [
            (
                "workflow.json".to_owned(),
                format!("{{\"name\": \"{name}\"}}"),
            ),
            ("agents.json".to_owned(), agents.to_owned()),
        ]
        .into_iter()
        .collect(),
    }
}

async fn workflow_versions_are_kept_once_and_seen_by_every_store(db: TestDb) {
    let first = open(&db).await;
    let versions = versions_of(&first);
    assert!(versions.workflow_versions().await.unwrap().is_empty());
    let v1 = workflow_version("support", "v1", "{\"a\": \"ünïcode ✓\"}");
    let v2 = workflow_version("support", "v2", "{}");
    let other = workflow_version("billing", "v1", "{}");
    assert!(versions.put_workflow_version(v1.clone()).await.unwrap());
    assert!(versions.put_workflow_version(v2.clone()).await.unwrap());
    assert!(versions.put_workflow_version(other.clone()).await.unwrap());
    // A version is a content hash: written again (by another node, or after a restart) it
    // is kept as first written.
    let changed = workflow_version("support", "v1", "{\"changed\": true}");
    assert!(!versions.put_workflow_version(changed).await.unwrap());
    assert_eq!(
        versions.workflow_versions().await.unwrap(),
        [other.clone(), v1.clone(), v2.clone()]
    );
    // Another store on the same database (another node, or this one after a restart).
    first.close().await;
    let second = open(&db).await;
    assert_eq!(
        versions_of(&second).workflow_versions().await.unwrap(),
        [other, v1, v2]
    );
}

fn state(status: &str, turn: u32) -> ChatState {
    let mut context = serde_json::Map::new();
    context.insert("customer".to_owned(), json!({"name": "Ada", "tier": 2}));
    ChatState {
        status: status.to_owned(),
        current_agent: "billing".to_owned(),
        turn,
        consecutive: 1,
        context: context.into(),
        updated_at_ms: 5_000 + i64::from(turn),
    }
}

async fn concurrent_writes_of_many_chats_are_all_durable(db: TestDb) {
    let store = open(&db).await;
    let chats = 200u64;
    // Submit everything before awaiting anything, so the writer sees a deep queue and
    // groups it.
    let created =
        join_all((0..chats).map(|i| store.create_chat(record(&format!("c{i}"), "acme", "u", 1))));
    for r in created.await {
        r.expect("create");
    }
    let mut writes = Vec::new();
    for i in 0..chats {
        let id = format!("c{i}");
        writes.push(store.apply_batch(&id, Arc::new(events_batch(1, 3))));
        writes.push(store.append_messages(&id, vec![message(0), message(1)]));
    }
    let claims =
        join_all((0..chats).map(|i| store.claim_tool(&format!("c{i}"), "turn-1/echo", None)));
    for r in join_all(writes).await {
        r.expect("write");
    }
    for r in claims.await {
        assert!(matches!(r, Ok(ToolClaim::Claimed)), "{r:?}");
    }
    store.close().await;

    // Everything acknowledged is in the file.
    let reopened = open(&db).await;
    for i in 0..chats {
        let id = format!("c{i}");
        assert_eq!(reopened.last_seq(&id).await.unwrap(), 3, "{id}");
        assert_eq!(reopened.all_messages(&id).await.unwrap().len(), 2, "{id}");
        assert!(matches!(
            reopened.claim_tool(&id, "turn-1/echo", None).await,
            Ok(ToolClaim::AlreadyStarted)
        ));
    }
}

async fn a_failing_write_rolls_back_only_itself(db: TestDb) {
    let store = open(&db).await;
    store
        .create_chat(record("a", "acme", "u", 1))
        .await
        .unwrap();
    store
        .create_chat(record("b", "acme", "u", 1))
        .await
        .unwrap();
    store
        .apply_batch("a", Arc::new(events_batch(1, 2)))
        .await
        .unwrap();

    // Queued together: a good batch for b, a batch for a whose second event collides
    // (seq 2 exists) after its first (seq 3) was inserted, and a batch for a chat that
    // does not exist.
    let good = store.apply_batch("b", Arc::new(events_batch(1, 5)));
    let bad = store.apply_batch(
        "a",
        Arc::new(ChatWriteBatch {
            events: vec![event(3), event(2)],
            messages: vec![message(0)],
            ..ChatWriteBatch::default()
        }),
    );
    let orphan = store.apply_batch("ghost", Arc::new(events_batch(1, 1)));
    let (good, bad, orphan) = futures::join!(good, bad, orphan);

    good.expect("b's batch is unaffected by its neighbours");
    assert!(matches!(bad, Err(StoreError::Conflict(_))), "{bad:?}");
    assert!(matches!(orphan, Err(StoreError::NotFound(_))), "{orphan:?}");
    assert_eq!(store.last_seq("b").await.unwrap(), 5);
    // Nothing of a's failed batch stayed: not seq 3, not the message.
    assert_eq!(store.last_seq("a").await.unwrap(), 2);
    assert!(store.all_messages("a").await.unwrap().is_empty());
}

/// What a turn sends the store, for many chats at once (so the writers group them): each
/// chat's two flushes, a new tool claim, a re-claim of a completed tool and the completion
/// of a claimed one. Whatever the grouping, the outcome is that of the writes one by one:
/// the later flush's state wins, a UI call put then removed is gone, the one put later
/// stays; one chat's colliding flush fails alone.
async fn a_group_of_turn_writes_ends_as_the_writes_one_by_one(db: TestDb) {
    let store = open(&db).await;
    let chats = 60u64;
    let ids: Vec<String> = (0..chats).map(|i| format!("c{i}")).collect();
    let pending = |corr: &str| PendingUiRecord {
        corr: corr.to_owned(),
        turn_key: format!("t1:{corr}"),
        call: json!({"component": "form", "corr": corr}),
        created_at_ms: 7,
        timeout_at_ms: Some(70),
    };
    for r in join_all(
        ids.iter()
            .map(|id| store.create_chat(record(id, "acme", "u", 1))),
    )
    .await
    {
        r.expect("create");
    }
    for id in &ids {
        assert_eq!(
            store.claim_tool(id, "t0:done", None).await.unwrap(),
            ToolClaim::Claimed
        );
        store
            .complete_tool_with_result(id, "t0:done", &json!({"n": 1}))
            .await
            .unwrap();
        assert_eq!(
            store.claim_tool(id, "t0:running", None).await.unwrap(),
            ToolClaim::Claimed
        );
    }
    let mut firsts = Vec::new();
    let mut seconds = Vec::new();
    let mut claims = Vec::new();
    let mut reclaims = Vec::new();
    let mut completions = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        firsts.push(store.apply_batch(
            id,
            Arc::new(ChatWriteBatch {
                messages: vec![message(0), message(1)],
                events: (1..=4).map(event).collect(),
                put_pending: vec![pending("a"), pending("b")],
                state: Some(Arc::new(state("running", 1))),
                ..ChatWriteBatch::default()
            }),
        ));
        claims.push(store.claim_tool(id, "t1:echo", None));
        reclaims.push(store.claim_tool(id, "t0:done", None));
        completions.push(store.complete_tool_with_result(id, "t0:running", &json!("ok")));
        // Chat 7's second flush repeats seq 4: it alone must fail, and leave nothing.
        let from = if i == 7 { 4 } else { 5 };
        seconds.push(store.apply_batch(
            id,
            Arc::new(ChatWriteBatch {
                messages: vec![message(2)],
                events: (from..=8).map(event).collect(),
                put_pending: vec![pending("c")],
                remove_pending: vec!["a".to_owned()],
                state: Some(Arc::new(state(STATUS_AWAITING_USER, 2))),
                ..ChatWriteBatch::default()
            }),
        ));
    }
    let (firsts, seconds, claims, reclaims, completions) = futures::join!(
        join_all(firsts),
        join_all(seconds),
        join_all(claims),
        join_all(reclaims),
        join_all(completions)
    );
    for (i, id) in ids.iter().enumerate() {
        firsts[i].as_ref().expect("first flush");
        assert_eq!(claims[i].as_ref().unwrap(), &ToolClaim::Claimed, "{id}");
        assert_eq!(
            reclaims[i].as_ref().unwrap(),
            &ToolClaim::AlreadyCompleted(Some(json!({"n": 1}))),
            "{id}"
        );
        completions[i].as_ref().expect("completion");
        assert_eq!(
            store.claim_tool(id, "t0:running", None).await.unwrap(),
            ToolClaim::AlreadyCompleted(Some(json!("ok")))
        );
        let mut corrs: Vec<String> = store
            .pending_ui(id)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.corr)
            .collect();
        corrs.sort();
        let loaded = store.load_chat(id).await.unwrap().expect("chat");
        if i == 7 {
            assert!(
                matches!(seconds[i], Err(StoreError::Conflict(_))),
                "{:?}",
                seconds[i]
            );
            assert_eq!(store.last_seq(id).await.unwrap(), 4);
            assert_eq!(store.all_messages(id).await.unwrap().len(), 2);
            assert_eq!(corrs, ["a", "b"]);
            assert_eq!(loaded.state, state("running", 1));
        } else {
            seconds[i].as_ref().expect("second flush");
            assert_eq!(store.last_seq(id).await.unwrap(), 8, "{id}");
            assert_eq!(store.all_messages(id).await.unwrap().len(), 3, "{id}");
            assert_eq!(corrs, ["b", "c"], "{id}");
            assert_eq!(loaded.state, state(STATUS_AWAITING_USER, 2), "{id}");
        }
    }
}

async fn writes_after_close_fail_cleanly(db: TestDb) {
    let store = open(&db).await;
    store
        .create_chat(record("a", "acme", "u", 1))
        .await
        .unwrap();
    store.close().await;
    let late = store.apply_batch("a", Arc::new(events_batch(1, 1))).await;
    assert!(matches!(late, Err(StoreError::Closed)), "{late:?}");
}

fn events_batch(from: u64, n: u64) -> ChatWriteBatch {
    ChatWriteBatch {
        events: (from..from + n).map(event).collect(),
        ..ChatWriteBatch::default()
    }
}

async fn claim_then_complete(db: TestDb) {
    let store = open(&db).await;
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();

    assert_eq!(
        store.claim_tool("c1", "t1:call_a", None).await.unwrap(),
        ToolClaim::Claimed
    );
    assert_eq!(
        store.claim_tool("c1", "t1:call_a", None).await.unwrap(),
        ToolClaim::AlreadyStarted
    );
    // Keys are per chat and per key.
    assert_eq!(
        store.claim_tool("c1", "t1:call_b", None).await.unwrap(),
        ToolClaim::Claimed
    );

    let result = json!({"status": "ok", "items": [1, 2, 3]});
    store
        .complete_tool_with_result("c1", "t1:call_a", &result)
        .await
        .unwrap();
    assert_eq!(
        store.claim_tool("c1", "t1:call_a", None).await.unwrap(),
        ToolClaim::AlreadyCompleted(Some(result.clone()))
    );

    // Completing twice, or without a claim, is a conflict and changes nothing.
    assert!(matches!(
        store
            .complete_tool_with_result("c1", "t1:call_a", &json!("other"))
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store
            .complete_tool_with_result("c1", "never", &json!(null))
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        store.claim_tool("c1", "t1:call_a", None).await.unwrap(),
        ToolClaim::AlreadyCompleted(Some(result))
    );
    assert!(matches!(
        store.claim_tool("ghost", "k", None).await,
        Err(StoreError::NotFound(_))
    ));
}

/// A store opened on `db`, shared as the engine holds it, with chat `chat_id` created.
async fn shared_with_chat(db: &TestDb, chat_id: &str) -> (TestStore, Arc<dyn ChatStore>) {
    let store = open(db).await;
    let shared = store.shared();
    shared
        .create_chat(record(chat_id, "acme", "u1", 1))
        .await
        .unwrap();
    (store, shared)
}

/// Through the trait's future (the engine hands completions over with `complete_tool_then`,
/// tested below): a completion records the tool's result, and a later claim of the key
/// returns it (a turn re-run after a crash reuses it).
async fn a_completion_through_the_trait_records_the_result(db: TestDb) {
    let (_store, shared) = shared_with_chat(&db, "c1").await;
    assert_eq!(
        shared.claim_tool("c1", "t1:s1:0", None).await.unwrap(),
        ToolClaim::Claimed
    );
    let result = json!({"status": "success", "echoed": "hi"});
    shared
        .complete_tool_recording("c1", "t1:s1:0", &result, None)
        .await
        .unwrap();
    assert_eq!(
        shared.claim_tool("c1", "t1:s1:0", None).await.unwrap(),
        ToolClaim::AlreadyCompleted(Some(result))
    );
    assert!(matches!(
        shared
            .complete_tool_recording("c1", "t1:s1:0", &json!("again"), None)
            .await,
        Err(StoreError::Conflict(_))
    ));
}

/// The outcome of a write handed over with a `…_then` method, awaited here.
async fn outcome_of<T: Send + 'static>(
    hand_over: impl FnOnce(Completion<T>),
) -> Result<T, StoreError> {
    let (reply, outcome) = futures::channel::oneshot::channel();
    hand_over(Box::new(move |result| {
        let _ = reply.send(result);
    }));
    outcome.await.expect("the store called done")
}

/// Writes and claims handed over with `apply_batch_then` / `claim_tool_then` /
/// `complete_tool_then` (what the engine calls) report what their futures would: done once
/// the write is durable, the same answers and errors, `Closed` once the store is closed.
async fn writes_and_claims_handed_over_with_then_report_as_their_futures_would(db: TestDb) {
    let (store, shared) = shared_with_chat(&db, "c1").await;

    let batch = |events: Vec<u64>| {
        Arc::new(ChatWriteBatch {
            events: events.into_iter().map(event).collect(),
            ..ChatWriteBatch::default()
        })
    };
    outcome_of(|done| shared.apply_batch_then("c1", batch(vec![1, 2, 3]), done))
        .await
        .expect("a good batch is written");
    assert_eq!(store.last_seq("c1").await.unwrap(), 3, "durable when done");
    let collides = outcome_of(|done| shared.apply_batch_then("c1", batch(vec![4, 2]), done)).await;
    assert!(
        matches!(collides, Err(StoreError::Conflict(_))),
        "{collides:?}"
    );
    let orphan = outcome_of(|done| shared.apply_batch_then("ghost", batch(vec![1]), done)).await;
    assert!(matches!(orphan, Err(StoreError::NotFound(_))), "{orphan:?}");
    assert_eq!(
        store.last_seq("c1").await.unwrap(),
        3,
        "the collision left nothing"
    );

    for key in ["t1:kept", "t1:bare"] {
        let claimed = outcome_of(|done| shared.claim_tool_then("c1", key, None, done)).await;
        assert_eq!(claimed.unwrap(), ToolClaim::Claimed, "{key}");
    }
    let again = outcome_of(|done| shared.claim_tool_then("c1", "t1:kept", None, done)).await;
    assert_eq!(again.unwrap(), ToolClaim::AlreadyStarted);
    let ghost = outcome_of(|done| shared.claim_tool_then("ghost", "k", None, done)).await;
    assert!(matches!(ghost, Err(StoreError::NotFound(_))), "{ghost:?}");
    let result = json!({"status": "success", "n": 3});
    outcome_of(|done| shared.complete_tool_then("c1", "t1:kept", Some(&result), None, done))
        .await
        .expect("a claimed key completes");
    let completed = outcome_of(|done| shared.claim_tool_then("c1", "t1:kept", None, done)).await;
    assert_eq!(
        completed.unwrap(),
        ToolClaim::AlreadyCompleted(Some(result))
    );
    outcome_of(|done| shared.complete_tool_then("c1", "t1:bare", None, None, done))
        .await
        .expect("a claimed key completes without a result");
    assert!(matches!(
        shared.claim_tool("c1", "t1:bare", None).await.unwrap(),
        ToolClaim::AlreadyCompleted(_)
    ));
    let unclaimed =
        outcome_of(|done| shared.complete_tool_then("c1", "never", None, None, done)).await;
    assert!(
        matches!(unclaimed, Err(StoreError::Conflict(_))),
        "{unclaimed:?}"
    );

    store.close().await;
    let late = outcome_of(|done| shared.apply_batch_then("c1", batch(vec![4]), done)).await;
    assert!(matches!(late, Err(StoreError::Closed)), "{late:?}");
    let late = outcome_of(|done| shared.claim_tool_then("c1", "t1:late", None, done)).await;
    assert!(matches!(late, Err(StoreError::Closed)), "{late:?}");
}

async fn concurrent_claims_from_two_stores_have_one_winner(db: TestDb) {
    let a = open(&db).await;
    let b = open(&db).await;
    a.create_chat(record("c1", "acme", "u1", 1)).await.unwrap();

    for round in 0..3 {
        let key = format!("t{round}:call_x");
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
        let mut handles = Vec::new();
        for i in 0..20 {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let key = key.clone();
            let barrier = std::sync::Arc::clone(&barrier);
            handles.push(tokio::spawn(async move {
                barrier.wait().await;
                store.claim_tool("c1", &key, None).await
            }));
        }
        let mut claimed = 0;
        let mut started = 0;
        for h in handles {
            match h.await.unwrap().unwrap() {
                ToolClaim::Claimed => claimed += 1,
                ToolClaim::AlreadyStarted => started += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!((claimed, started), (1, 19), "round {round}");
    }
}

async fn a_claim_left_started_survives_a_restart_as_interrupted(db: TestDb) {
    {
        let store = open(&db).await;
        store
            .create_chat(record("c1", "acme", "u1", 1))
            .await
            .unwrap();
        assert_eq!(
            store.claim_tool("c1", "t3:call_pay", None).await.unwrap(),
            ToolClaim::Claimed
        );
        // "Crash": the tool never completes and the store is dropped.
    }
    let store = open(&db).await;
    assert_eq!(
        store.claim_tool("c1", "t3:call_pay", None).await.unwrap(),
        ToolClaim::AlreadyStarted
    );
}

async fn tasks_are_isolated_by_tenant_and_user(db: TestDb) {
    let store = open(&db).await;

    let mine = store
        .add("acme", "u1", "write report", Some("by friday"))
        .await
        .unwrap();
    let second = store.add("acme", "u1", "call bob", None).await.unwrap();
    let same_user_other_tenant = store.add("beta", "u1", "beta task", None).await.unwrap();
    let other_user = store.add("acme", "u2", "u2 task", None).await.unwrap();
    assert!(mine.id.starts_with("t_") && mine.id.len() == 14);
    assert!(!mine.completed);

    let titles =
        |v: Vec<tessera_tools::Task>| -> Vec<String> { v.into_iter().map(|t| t.title).collect() };
    assert_eq!(
        titles(store.list("acme", "u1", TaskFilter::All).await.unwrap()),
        ["write report", "call bob"]
    );
    assert_eq!(
        titles(store.list("beta", "u1", TaskFilter::All).await.unwrap()),
        ["beta task"]
    );
    assert_eq!(
        titles(store.list("acme", "u2", TaskFilter::All).await.unwrap()),
        ["u2 task"]
    );

    // Another owner's id behaves like an unknown id, for complete and delete.
    for (tenant, user) in [("beta", "u1"), ("acme", "u2"), ("acme", "u3")] {
        assert_eq!(store.complete(tenant, user, &mine.id).await.unwrap(), None);
        assert_eq!(store.delete(tenant, user, &mine.id).await.unwrap(), None);
    }
    assert_eq!(
        store.complete("acme", "u1", &other_user.id).await.unwrap(),
        None
    );
    assert_eq!(
        store
            .delete("acme", "u1", &same_user_other_tenant.id)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .list("acme", "u1", TaskFilter::Completed)
            .await
            .unwrap(),
        vec![]
    );

    let done = store
        .complete("acme", "u1", &mine.id)
        .await
        .unwrap()
        .expect("own task");
    assert!(done.completed);
    assert_eq!(done.description.as_deref(), Some("by friday"));
    assert_eq!(
        titles(
            store
                .list("acme", "u1", TaskFilter::Completed)
                .await
                .unwrap()
        ),
        ["write report"]
    );
    assert_eq!(
        titles(store.list("acme", "u1", TaskFilter::Pending).await.unwrap()),
        ["call bob"]
    );

    let deleted = store
        .delete("acme", "u1", &second.id)
        .await
        .unwrap()
        .expect("own task");
    assert_eq!(deleted.id, second.id);
    assert_eq!(store.delete("acme", "u1", &second.id).await.unwrap(), None);

    // The others' tasks are untouched, and everything survives a reopen.
    drop(store);
    let store = open(&db).await;
    assert_eq!(
        titles(store.list("acme", "u1", TaskFilter::All).await.unwrap()),
        ["write report"]
    );
    assert_eq!(
        store.list("beta", "u1", TaskFilter::All).await.unwrap(),
        vec![same_user_other_tenant]
    );
    assert_eq!(
        store.list("acme", "u2", TaskFilter::Pending).await.unwrap(),
        vec![other_user]
    );
}

async fn artifacts_are_isolated_by_tenant_user_and_chat(db: TestDb) {
    let store = open(&db).await;
    let content = Bytes::from_static(b"PK\x03\x04 zip bytes \x00\xff");
    let art = store
        .put("acme", "u1", "c1", "bundle.zip", content.clone())
        .await
        .unwrap();
    assert!(art.id.starts_with("art_") && art.id.len() == 20);
    assert_eq!(art.size, content.len() as u64);
    let sha = art.sha256.clone().expect("sha256 computed");
    assert_eq!(sha.len(), 64);

    let got = store
        .get("acme", "u1", "c1", &art.id)
        .await
        .unwrap()
        .expect("owner reads");
    assert_eq!(got.bytes, content);
    assert_eq!(got.meta, art);

    for (tenant, user, chat) in [
        ("beta", "u1", "c1"),
        ("acme", "u2", "c1"),
        ("acme", "u1", "c2"),
    ] {
        assert!(
            store
                .get(tenant, user, chat, &art.id)
                .await
                .unwrap()
                .is_none(),
            "{tenant}/{user}/{chat}"
        );
    }
    assert!(
        store
            .get("acme", "u1", "c1", "art_unknown")
            .await
            .unwrap()
            .is_none()
    );

    // Empty files and reopening.
    let empty = store
        .put("acme", "u1", "c1", "empty.txt", Bytes::new())
        .await
        .unwrap();
    drop(store);
    let store = open(&db).await;
    assert_eq!(
        store
            .get("acme", "u1", "c1", &art.id)
            .await
            .unwrap()
            .unwrap()
            .bytes,
        content
    );
    let e = store
        .get("acme", "u1", "c1", &empty.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((e.meta.size, e.bytes.len()), (0, 0));
    assert_eq!(
        e.meta.sha256.as_deref(),
        Some("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    );
}

// ---- leases (PostgreSQL only)

const TTL_MS: i64 = 60_000;

async fn lease_acquire_renew_and_release(db: TestDb) {
    let store = open(&db).await;
    let leases = store.pg();
    let first = leases
        .acquire_lease("c1", "n1", TTL_MS)
        .await
        .unwrap()
        .expect("a chat without a lease is free");
    assert_eq!(
        (first.chat_id.as_str(), first.node.as_str(), first.epoch),
        ("c1", "n1", 1)
    );
    // The holder gets its live lease back, same epoch; another node gets nothing.
    let again = leases
        .acquire_lease("c1", "n1", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.epoch, 1);
    assert!(again.expires_at_ms >= first.expires_at_ms);
    assert_eq!(
        leases.acquire_lease("c1", "n2", TTL_MS).await.unwrap(),
        None
    );

    // Renewal: only the holder, only at its epoch.
    let held = vec![("c1".to_owned(), 1)];
    assert!(
        leases
            .renew_leases("n1", &held, TTL_MS)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        leases.renew_leases("n2", &held, TTL_MS).await.unwrap(),
        ["c1"]
    );
    assert_eq!(
        leases
            .renew_leases("n1", &[("c1".to_owned(), 2)], TTL_MS)
            .await
            .unwrap(),
        ["c1"]
    );
    assert!(
        leases
            .renew_leases("n1", &[], TTL_MS)
            .await
            .unwrap()
            .is_empty()
    );

    // Releasing someone else's lease (or a stale epoch) does nothing.
    leases.release_lease("c1", "n2", 1).await.unwrap();
    leases.release_lease("c1", "n1", 7).await.unwrap();
    assert_eq!(
        leases.acquire_lease("c1", "n2", TTL_MS).await.unwrap(),
        None
    );

    // Released: another node takes it at once, under the next epoch, and the old holder's
    // renewal reports it lost.
    leases.release_lease("c1", "n1", 1).await.unwrap();
    let taken = leases
        .acquire_lease("c1", "n2", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((taken.node.as_str(), taken.epoch), ("n2", 2));
    assert_eq!(
        leases.renew_leases("n1", &held, TTL_MS).await.unwrap(),
        ["c1"]
    );
    assert!(
        leases
            .renew_leases("n2", &[("c1".to_owned(), 2)], TTL_MS)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn an_expired_lease_is_taken_over_with_the_next_epoch(db: TestDb) {
    let store = open(&db).await;
    let leases = store.pg();
    let short = leases
        .acquire_lease("c1", "n1", 1_500)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(short.epoch, 1);
    assert_eq!(
        leases.acquire_lease("c1", "n2", TTL_MS).await.unwrap(),
        None,
        "a live lease is not taken over"
    );
    // Wait (bounded) for the database clock to pass the expiry.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let taken = loop {
        if let Some(lease) = leases.acquire_lease("c1", "n2", TTL_MS).await.unwrap() {
            break lease;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the lease never expired"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!((taken.node.as_str(), taken.epoch), ("n2", 2));
    assert!(taken.expires_at_ms > short.expires_at_ms);
    // The old holder has lost it for good: renewal fails, acquiring finds a live lease.
    assert_eq!(
        leases
            .renew_leases("n1", &[("c1".to_owned(), 1)], TTL_MS)
            .await
            .unwrap(),
        ["c1"]
    );
    assert_eq!(
        leases.acquire_lease("c1", "n1", TTL_MS).await.unwrap(),
        None
    );
}

async fn orphaned_chats_are_open_chats_without_a_live_lease(db: TestDb) {
    let store = open(&db).await;
    for (i, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
        let created = i64::try_from(i).unwrap();
        store
            .create_chat(record(id, "acme", "u", created))
            .await
            .unwrap();
    }
    store
        .save_state("c", state(STATUS_COMPLETED, 1))
        .await
        .unwrap();
    let leases = store.pg();
    leases
        .acquire_lease("a", "n1", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    let b = leases
        .acquire_lease("b", "n1", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    leases.release_lease("b", "n1", b.epoch).await.unwrap();
    // a: live lease; b: expired (released); c: completed; d: never leased.
    assert_eq!(leases.orphaned_chats(10).await.unwrap(), ["b", "d"]);
    assert_eq!(leases.orphaned_chats(1).await.unwrap(), ["b"]);
}

async fn a_parked_lease_is_no_orphan_and_the_next_claim_moves_its_epoch_on(db: TestDb) {
    let store = open(&db).await;
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        store
            .create_chat(record(id, "acme", "u", i64::try_from(i).unwrap()))
            .await
            .unwrap();
    }
    let leases = store.pg();
    let mut held = Vec::new();
    for id in ["a", "b", "c"] {
        let lease = leases
            .acquire_lease(id, "n1", TTL_MS)
            .await
            .unwrap()
            .unwrap();
        held.push((id.to_owned(), lease.epoch));
    }
    // Another node's park, and a park at a stale epoch, change nothing.
    leases
        .park_leases("n2", &[("a".to_owned(), 1)])
        .await
        .unwrap();
    leases
        .park_leases("n1", &[("b".to_owned(), 7)])
        .await
        .unwrap();
    assert!(
        leases
            .renew_leases("n1", &held, TTL_MS)
            .await
            .unwrap()
            .is_empty()
    );

    leases.park_leases("n1", &held[..2]).await.unwrap();
    leases.park_leases("n1", &[]).await.unwrap();
    // Parked: no longer n1's, yet nobody's orphan; c's lease is still live.
    assert_eq!(
        leases.renew_leases("n1", &held, TTL_MS).await.unwrap(),
        ["a", "b"]
    );
    assert!(leases.orphaned_chats(10).await.unwrap().is_empty());
    // Claimed on demand by any node, under the next epoch, and then live again.
    let claimed = leases
        .acquire_lease("a", "n2", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (claimed.node.as_str(), claimed.epoch, claimed.was_parked),
        ("n2", 2, true)
    );
    assert_eq!(leases.acquire_lease("a", "n1", TTL_MS).await.unwrap(), None);
    let again = leases
        .acquire_lease("a", "n2", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (again.epoch, again.was_parked),
        (2, false),
        "its holder's own, live"
    );
    let back = leases
        .acquire_lease("b", "n1", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (back.epoch, back.was_parked),
        (2, true),
        "the node that parked it claims it at the next epoch too"
    );
    // Once that claim expires (released here), the chat is an orphan as any other, and its
    // next taker finds no parked lease.
    leases.release_lease("a", "n2", 2).await.unwrap();
    assert_eq!(leases.orphaned_chats(10).await.unwrap(), ["a"]);
    let taken = leases
        .acquire_lease("a", "n1", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((taken.epoch, taken.was_parked), (3, false));
}

// ---- fencing (PostgreSQL only)

fn events_at(epoch: Option<i64>, seqs: std::ops::RangeInclusive<u64>) -> Arc<ChatWriteBatch> {
    Arc::new(ChatWriteBatch {
        events: seqs.map(event).collect(),
        state: Some(Arc::new(state("running", 2))),
        epoch,
        ..ChatWriteBatch::default()
    })
}

async fn a_write_with_a_stale_epoch_is_fenced_and_changes_nothing(db: TestDb) {
    let store = open(&db).await;
    store
        .create_chat(record("c1", "acme", "u", 1))
        .await
        .unwrap();
    let leases = store.pg();
    let mine = leases
        .acquire_lease("c1", "n1", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    store
        .apply_batch("c1", events_at(Some(mine.epoch), 1..=1))
        .await
        .unwrap();
    assert_eq!(
        store
            .claim_tool("c1", "k1", Some(mine.epoch))
            .await
            .unwrap(),
        ToolClaim::Claimed
    );

    // Another node takes the chat over.
    leases.release_lease("c1", "n1", mine.epoch).await.unwrap();
    let theirs = leases
        .acquire_lease("c1", "n2", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(theirs.epoch, mine.epoch + 1);
    let before = store.load_chat("c1").await.unwrap().unwrap();

    // Every durable write of the old owner is refused, and nothing of it is stored.
    let batch = store
        .apply_batch("c1", events_at(Some(mine.epoch), 2..=4))
        .await;
    assert!(
        matches!(batch, Err(StoreError::Fenced(ref id)) if id == "c1"),
        "{batch:?}"
    );
    let claim = store.claim_tool("c1", "k2", Some(mine.epoch)).await;
    assert!(matches!(claim, Err(StoreError::Fenced(_))), "{claim:?}");
    let complete = store.complete_tool("c1", "k1", Some(mine.epoch)).await;
    assert!(
        matches!(complete, Err(StoreError::Fenced(_))),
        "{complete:?}"
    );
    assert!(
        !batch.unwrap_err().is_transient(),
        "a fenced write is never retried"
    );
    assert_eq!(store.last_seq("c1").await.unwrap(), 1);
    assert_eq!(store.load_chat("c1").await.unwrap().unwrap(), before);
    assert_eq!(
        store
            .claim_tool("c1", "k2", Some(theirs.epoch))
            .await
            .unwrap(),
        ToolClaim::Claimed,
        "the fenced claim claimed nothing"
    );
    assert_eq!(
        store
            .claim_tool("c1", "k1", Some(theirs.epoch))
            .await
            .unwrap(),
        ToolClaim::AlreadyStarted,
        "the fenced completion completed nothing"
    );

    // The new owner writes on; a write without an epoch (single node) is not checked; a
    // chat with no lease at all fences any epoch.
    store
        .apply_batch("c1", events_at(Some(theirs.epoch), 2..=3))
        .await
        .unwrap();
    store
        .complete_tool("c1", "k2", Some(theirs.epoch))
        .await
        .unwrap();
    store
        .apply_batch("c1", events_at(None, 4..=4))
        .await
        .unwrap();
    assert_eq!(store.last_seq("c1").await.unwrap(), 4);
    store
        .create_chat(record("unleased", "acme", "u", 2))
        .await
        .unwrap();
    assert!(matches!(
        store
            .apply_batch("unleased", events_at(Some(1), 1..=1))
            .await,
        Err(StoreError::Fenced(_))
    ));
}

async fn a_fenced_write_fails_alone_in_its_group(db: TestDb) {
    let store = open(&db).await;
    for id in ["old", "fine"] {
        store.create_chat(record(id, "acme", "u", 1)).await.unwrap();
        store
            .pg()
            .acquire_lease(id, "n1", TTL_MS)
            .await
            .unwrap()
            .unwrap();
    }
    store.pg().release_lease("old", "n1", 1).await.unwrap();
    store
        .pg()
        .acquire_lease("old", "n2", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    // Submitted together, so the writer runs them in one group.
    let writes: Vec<_> = (0..20u64)
        .map(|i| {
            let chat = if i % 2 == 0 { "fine" } else { "old" };
            store.apply_batch(chat, events_at(Some(1), i / 2 + 1..=i / 2 + 1))
        })
        .collect();
    for (i, result) in join_all(writes).await.into_iter().enumerate() {
        if i % 2 == 0 {
            result.expect("the live owner's writes commit");
        } else {
            assert!(matches!(result, Err(StoreError::Fenced(_))), "{result:?}");
        }
    }
    assert_eq!(store.last_seq("fine").await.unwrap(), 10);
    assert_eq!(store.last_seq("old").await.unwrap(), 0);
}

// ---- recovery (PostgreSQL only)

async fn the_store_reconnects_after_its_connections_are_killed(db: TestDb) {
    let store = open(&db).await;
    store
        .create_chat(record("c1", "acme", "u", 1))
        .await
        .unwrap();
    store.append_events("c1", vec![event(1)]).await.unwrap();
    let TestDb::Postgres(schema) = &db else {
        unreachable!("PostgreSQL only")
    };
    let killed = schema.kill_connections().await;
    assert!(killed > 0, "the store had connections to kill");
    // The first writes after the kill may fail as transient (never otherwise); a retry, as
    // the engine's, succeeds once the store has reconnected.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    for seq in 2..=4 {
        loop {
            match store.append_events("c1", vec![event(seq)]).await {
                Ok(()) => break,
                Err(e) => {
                    assert!(e.is_transient(), "{e:?}");
                    assert!(
                        std::time::Instant::now() < deadline,
                        "never reconnected: {e}"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
    let read = loop {
        match store.last_seq("c1").await {
            Ok(seq) => break seq,
            Err(e) => {
                assert!(e.is_transient(), "{e:?}");
                assert!(
                    std::time::Instant::now() < deadline,
                    "reads never recovered: {e}"
                );
            }
        }
    };
    assert_eq!(read, 4);
}

/// A batch can mark a chat's seqs taken without storing their events: the chat's last taken
/// seq is the latest mark or its last event's seq, whichever is higher; events below the
/// mark are still accepted; a mark travels alone, with events, or with a state; a later mark
/// replaces an earlier one, also within one group commit; an unknown chat has nothing to
/// mark.
async fn seqs_marked_taken_count_without_their_events(db: TestDb) {
    let store = open(&db).await;
    store
        .create_chat(record("c1", "acme", "u1", 1_000))
        .await
        .unwrap();
    let mark = |events: Vec<u64>, seq: u64, with_state: bool| {
        Arc::new(ChatWriteBatch {
            events: events.into_iter().map(event).collect(),
            seqs_taken_through: Some(seq),
            state: with_state.then(|| Arc::new(state("running", 1))),
            ..ChatWriteBatch::default()
        })
    };
    assert_eq!(store.last_seq_taken("c1").await.unwrap(), 0);
    store
        .apply_batch("c1", mark(vec![1, 2], 130, false))
        .await
        .unwrap();
    assert_eq!(store.last_seq_taken("c1").await.unwrap(), 130);
    assert_eq!(
        store.last_seq("c1").await.unwrap(),
        2,
        "no event stored for the mark"
    );
    store.append_events("c1", vec![event(3)]).await.unwrap();
    assert_eq!(store.last_seq_taken("c1").await.unwrap(), 130);
    store
        .apply_batch("c1", mark(vec![4], 4, true))
        .await
        .unwrap();
    assert_eq!(
        store.last_seq_taken("c1").await.unwrap(),
        4,
        "the mark came back"
    );
    store
        .apply_batch("c1", mark(vec![], 300, false))
        .await
        .unwrap();
    assert_eq!(store.last_seq_taken("c1").await.unwrap(), 300);
    store
        .apply_batch("c1", mark(vec![], 5, true))
        .await
        .unwrap();
    assert_eq!(store.last_seq_taken("c1").await.unwrap(), 5);
    store.append_events("c1", vec![event(9)]).await.unwrap();
    assert_eq!(
        store.last_seq_taken("c1").await.unwrap(),
        9,
        "an event above the mark"
    );
    let seqs: Vec<u64> = store
        .events_after("c1", 0, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 9]);
    store
        .apply_batch("nope", mark(vec![], 7, false))
        .await
        .unwrap();
    assert_eq!(store.last_seq_taken("nope").await.unwrap(), 0);

    // Many chats at once (PostgreSQL merges them into one group commit): each chat's later
    // mark wins. Chat 8's second write repeats a seq and fails alone, which makes PostgreSQL
    // write its group again job by job (the other statement path).
    let ids: Vec<String> = (0..32).map(|i| format!("g{i}")).collect();
    for id in &ids {
        store
            .create_chat(record(id, "acme", "u1", 2_000))
            .await
            .unwrap();
    }
    let mut writes = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let second = if i == 8 { vec![1] } else { vec![] };
        writes.push(store.apply_batch(id, mark(vec![1], 200, false)));
        writes.push(store.apply_batch(id, mark(second, 150, false)));
        writes.push(store.apply_batch(id, mark(vec![2], 2, true)));
        writes.push(store.apply_batch(id, mark(vec![], 140, false)));
    }
    for (n, written) in join_all(writes).await.into_iter().enumerate() {
        if n == 8 * 4 + 1 {
            assert!(
                matches!(written, Err(StoreError::Conflict(_))),
                "{written:?}"
            );
        } else {
            written.unwrap();
        }
    }
    for id in &ids {
        assert_eq!(store.last_seq_taken(id).await.unwrap(), 140, "{id}");
    }
}

conformance!(
    create_load_list_and_state_round_trip,
    usable_as_dyn_chat_store,
    everything_survives_reopening_the_file,
    messages_are_ordered_paged_and_never_overwritten,
    events_after_is_ordered_and_pages,
    duplicate_seq_is_an_error_and_leaves_the_log_unchanged,
    pending_ui_put_list_remove,
    list_open_chats_excludes_completed,
    delete_chat_cascades,
    completed_chats_before_lists_only_old_completed_chats_oldest_first,
    count_open_chats_counts_a_tenants_chats_not_completed,
    generated_files_over_the_tenant_quota_are_refused_and_nothing_is_stored,
    concurrent_files_cannot_overshoot_the_tenant_quota_together,
    migrations_are_idempotent,
    concurrent_writes_of_many_chats_are_all_durable,
    a_failing_write_rolls_back_only_itself,
    a_group_of_turn_writes_ends_as_the_writes_one_by_one,
    seqs_marked_taken_count_without_their_events,
    writes_after_close_fail_cleanly,
    claim_then_complete,
    a_completion_through_the_trait_records_the_result,
    writes_and_claims_handed_over_with_then_report_as_their_futures_would,
    concurrent_claims_from_two_stores_have_one_winner,
    a_claim_left_started_survives_a_restart_as_interrupted,
    tasks_are_isolated_by_tenant_and_user,
    artifacts_are_isolated_by_tenant_user_and_chat,
    workflow_versions_are_kept_once_and_seen_by_every_store;
    postgres_only:
    lease_acquire_renew_and_release,
    an_expired_lease_is_taken_over_with_the_next_epoch,
    orphaned_chats_are_open_chats_without_a_live_lease,
    a_parked_lease_is_no_orphan_and_the_next_claim_moves_its_epoch_on,
    a_write_with_a_stale_epoch_is_fenced_and_changes_nothing,
    a_fenced_write_fails_alone_in_its_group,
    the_store_reconnects_after_its_connections_are_killed,
);
