//! Exactly-once tool invocation records.

mod common;

use common::{open, record, temp_db};
use serde_json::json;
use tessera_store::{ChatStore, StoreError, ToolClaim};

#[tokio::test]
async fn claim_then_complete() {
    let db = temp_db();
    let store = open(&db).await;
    store
        .create_chat(record("c1", "acme", "u1", 1))
        .await
        .unwrap();

    assert_eq!(
        store.claim_tool("c1", "t1:call_a").await.unwrap(),
        ToolClaim::Claimed
    );
    assert_eq!(
        store.claim_tool("c1", "t1:call_a").await.unwrap(),
        ToolClaim::AlreadyStarted
    );
    // Keys are per chat and per key.
    assert_eq!(
        store.claim_tool("c1", "t1:call_b").await.unwrap(),
        ToolClaim::Claimed
    );

    let result = json!({"status": "ok", "items": [1, 2, 3]});
    store
        .complete_tool_with_result("c1", "t1:call_a", &result)
        .await
        .unwrap();
    assert_eq!(
        store.claim_tool("c1", "t1:call_a").await.unwrap(),
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
        store.claim_tool("c1", "t1:call_a").await.unwrap(),
        ToolClaim::AlreadyCompleted(Some(result))
    );
    assert!(matches!(
        store.claim_tool("ghost", "k").await,
        Err(StoreError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_from_two_stores_have_one_winner() {
    let db = temp_db();
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
                store.claim_tool("c1", &key).await
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

#[tokio::test]
async fn a_claim_left_started_survives_a_restart_as_interrupted() {
    let db = temp_db();
    {
        let store = open(&db).await;
        store
            .create_chat(record("c1", "acme", "u1", 1))
            .await
            .unwrap();
        assert_eq!(
            store.claim_tool("c1", "t3:call_pay").await.unwrap(),
            ToolClaim::Claimed
        );
        // "Crash": the tool never completes and the store is dropped.
    }
    let store = open(&db).await;
    assert_eq!(
        store.claim_tool("c1", "t3:call_pay").await.unwrap(),
        ToolClaim::AlreadyStarted
    );
}
