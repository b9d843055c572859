//! The single writer thread: many callers' writes share one transaction, each caller is
//! answered only after that transaction commits, and one caller's failing write rolls back
//! only its own part.

mod common;

use std::sync::Arc;

use common::{event, message, open, record, temp_db};
use futures::future::join_all;
use tessera_store::{ChatStore, ChatWriteBatch, StoreError, ToolClaim};

fn events_batch(from: u64, n: u64) -> ChatWriteBatch {
    ChatWriteBatch {
        events: (from..from + n).map(event).collect(),
        ..ChatWriteBatch::default()
    }
}

#[tokio::test]
async fn concurrent_writes_of_many_chats_are_all_durable() {
    let db = temp_db();
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
    let claims = join_all((0..chats).map(|i| store.claim_tool(&format!("c{i}"), "turn-1/echo")));
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
            reopened.claim_tool(&id, "turn-1/echo").await,
            Ok(ToolClaim::AlreadyStarted)
        ));
    }
}

#[tokio::test]
async fn a_failing_write_rolls_back_only_itself() {
    let db = temp_db();
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

#[tokio::test]
async fn writes_after_close_fail_cleanly() {
    let db = temp_db();
    let store = open(&db).await;
    store
        .create_chat(record("a", "acme", "u", 1))
        .await
        .unwrap();
    store.close().await;
    let late = store.apply_batch("a", Arc::new(events_batch(1, 1))).await;
    assert!(matches!(late, Err(StoreError::Closed)), "{late:?}");
}

#[tokio::test]
async fn the_wal_stays_bounded_under_steady_writes() {
    let db = temp_db();
    let store = open(&db).await;
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
    let mut wal = db.path.clone().into_os_string();
    wal.push("-wal");
    let wal_bytes = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert!(
        wal_bytes <= 20 * 1024 * 1024,
        "WAL grew to {wal_bytes} bytes"
    );
    assert_eq!(store.last_seq("big").await.unwrap(), 960);
}
