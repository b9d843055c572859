//! The lease manager on the real `PgStore` (`TESSERA_TEST_DATABASE_URL`, a schema per test),
//! two managers standing for two nodes, each with its own store connection: a dead node's
//! chat is taken over with a new epoch soon after its lease expires, and the dead node's
//! writes at the old epoch are fenced.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tessera_cluster::{
    AcquireLease, ClusterMetrics, LeaseManager, LeaseManagerConfig, OwnershipChange,
};
use tessera_store::testing::PgTestSchema;
use tessera_store::{ChatRecord, ChatState, ChatStore, ChatWriteBatch, PgStore, StoreError};

#[derive(Default)]
struct Node(Vec<OwnershipChange>);
impl Actor for Node {
    type Context = Context<Self>;
}
impl Handler<OwnershipChange> for Node {
    type Result = ();
    fn handle(&mut self, msg: OwnershipChange, _: &mut Self::Context) {
        self.0.push(msg);
    }
}
#[derive(Message)]
#[rtype(result = "Vec<OwnershipChange>")]
struct Changes;
impl Handler<Changes> for Node {
    type Result = MessageResult<Changes>;
    fn handle(&mut self, _: Changes, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.0.clone())
    }
}

const TTL: Duration = Duration::from_millis(1500);

fn config(node: &str) -> LeaseManagerConfig {
    LeaseManagerConfig {
        node_id: node.into(),
        ttl: TTL,
        takeover_batch: 100,
    }
}

#[actix_rt::test]
async fn a_dead_nodes_chat_is_taken_over_on_postgres_and_its_old_epoch_is_fenced() {
    let Some(schema) = PgTestSchema::create("a_dead_nodes_chat_is_taken_over_on_postgres").await
    else {
        return;
    };
    let store_a = Arc::new(
        PgStore::connect_with(schema.options())
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let store_b = Arc::new(
        PgStore::connect_with(schema.options())
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    );
    store_a
        .create_chat(ChatRecord {
            chat_id: "c1".into(),
            tenant: "t".into(),
            user_id: "u".into(),
            workflow: "W".into(),
            workflow_version: String::new(),
            created_at_ms: 0,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // Node a on its own arbiter, stopped below as a killed process stops.
    let arbiter = Arbiter::new();
    let a_recorder = Node::default().start();
    let lease_store_a = store_a.clone();
    let a = LeaseManager::start_in_arbiter(&arbiter.handle(), move |_| {
        LeaseManager::new(
            lease_store_a,
            config("a"),
            a_recorder.recipient(),
            Arc::new(ClusterMetrics::default()),
        )
    });
    let epoch = a
        .send(AcquireLease {
            chat_id: "c1".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(epoch, Some(1));
    let b_recorder = Node::default().start();
    let b_metrics = Arc::new(ClusterMetrics::default());
    let b = LeaseManager::new(
        store_b.clone(),
        config("b"),
        b_recorder.clone().recipient(),
        b_metrics.clone(),
    )
    .start();
    assert_eq!(
        b.send(AcquireLease {
            chat_id: "c1".into()
        })
        .await
        .ok()
        .and_then(Result::ok),
        Some(None),
        "a live lease of another node is not taken"
    );
    // Several TTLs of renewals: b never takes it while a lives.
    tokio::time::sleep(TTL * 2).await;
    assert!(
        b_recorder
            .send(Changes)
            .await
            .unwrap_or_default()
            .is_empty()
    );

    arbiter.stop();
    let died = Instant::now();
    let taken = OwnershipChange::TakenOver {
        chat_id: "c1".into(),
        epoch: 2,
    };
    loop {
        if b_recorder
            .send(Changes)
            .await
            .unwrap_or_default()
            .contains(&taken)
        {
            break;
        }
        assert!(died.elapsed() < Duration::from_secs(20), "never taken over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = died.elapsed();
    eprintln!("takeover {took:?} after the owner died (lease ttl {TTL:?})");
    // Expiry comes at most one TTL after a's last renewal; the scan at most TTL/3 later.
    assert!(
        took < TTL + TTL / 3 + Duration::from_secs(2),
        "took {took:?}"
    );
    assert_eq!(
        b_metrics
            .takeovers
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // The dead node's write-behind still holding a batch at epoch 1: refused.
    let stale = ChatWriteBatch {
        state: Some(Arc::new(ChatState::initial(1))),
        epoch: Some(1),
        ..ChatWriteBatch::default()
    };
    let refused = store_a.apply_batch("c1", Arc::new(stale)).await;
    assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");
    let current = ChatWriteBatch {
        state: Some(Arc::new(ChatState::initial(2))),
        epoch: Some(2),
        ..ChatWriteBatch::default()
    };
    assert!(store_b.apply_batch("c1", Arc::new(current)).await.is_ok());
}
