//! The lease manager against an in-memory lease store that follows the `LeaseStore` contract
//! (expiry by the store's clock, epoch bumped on takeover). The PostgreSQL implementation is
//! exercised by the multi-node tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use tessera_cluster::{
    AcquireLease, Claim, ClaimLease, ClusterMetrics, Drain, HeldLeases, LeaseManager,
    LeaseManagerConfig, OwnershipChange, ParkLeases, ReleaseLease,
};
use tessera_store::{Lease, LeaseStore, PARKED_NODE, StoreError, StoreFuture};

struct MemoryLeases {
    rows: Mutex<HashMap<String, (String, i64, Instant)>>,
    /// Chats that are open (candidates for orphan takeover).
    open: Mutex<Vec<String>>,
    /// While set, every call fails as if the database were unreachable.
    down: AtomicBool,
    /// The store's clock origin (`expires_at_ms` counts from it).
    origin: Instant,
}

impl MemoryLeases {
    fn new(open: &[&str]) -> Arc<Self> {
        Arc::new(Self {
            rows: Mutex::default(),
            open: Mutex::new(open.iter().map(|s| s.to_string()).collect()),
            down: AtomicBool::new(false),
            origin: Instant::now(),
        })
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Transient("database down".into()));
        }
        Ok(())
    }

    fn owner(&self, chat: &str) -> Option<(String, i64)> {
        let rows = self.rows.lock().unwrap();
        rows.get(chat).map(|(n, e, _)| (n.clone(), *e))
    }
}

impl LeaseStore for MemoryLeases {
    fn acquire_lease(&self, chat_id: &str, node: &str, ttl_ms: i64) -> StoreFuture<Option<Lease>> {
        let result = self.check().map(|()| {
            let now = Instant::now();
            let expires = now + Duration::from_millis(ttl_ms as u64);
            let mut rows = self.rows.lock().unwrap();
            let row = rows.entry(chat_id.to_owned());
            let mut was_parked = false;
            let (owner, epoch, until) = match row {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert((node.to_owned(), 1, expires)).clone()
                }
                std::collections::hash_map::Entry::Occupied(mut o) => {
                    let (owner, epoch, until) = o.get().clone();
                    was_parked = owner == PARKED_NODE;
                    if owner == node && until > now {
                        (owner, epoch, until)
                    } else if until <= now {
                        o.insert((node.to_owned(), epoch + 1, expires));
                        o.get().clone()
                    } else {
                        return None;
                    }
                }
            };
            Some(Lease {
                chat_id: chat_id.to_owned(),
                node: owner,
                epoch,
                expires_at_ms: until.duration_since(self.origin).as_millis() as i64,
                was_parked,
            })
        });
        Box::pin(async move { result })
    }

    fn renew_leases(
        &self,
        node: &str,
        held: &[(String, i64)],
        ttl_ms: i64,
    ) -> StoreFuture<Vec<String>> {
        let result = self.check().map(|()| {
            let now = Instant::now();
            let mut rows = self.rows.lock().unwrap();
            let mut lost = Vec::new();
            for (chat, epoch) in held {
                match rows.get_mut(chat) {
                    Some(row) if row.0 == node && row.1 == *epoch && row.2 > now => {
                        row.2 = now + Duration::from_millis(ttl_ms as u64);
                    }
                    _ => lost.push(chat.clone()),
                }
            }
            lost
        });
        Box::pin(async move { result })
    }

    fn release_lease(&self, chat_id: &str, node: &str, epoch: i64) -> StoreFuture<()> {
        let result = self.check().map(|()| {
            let mut rows = self.rows.lock().unwrap();
            if let Some(row) = rows.get_mut(chat_id)
                && row.0 == node
                && row.1 == epoch
            {
                row.2 = Instant::now();
            }
        });
        Box::pin(async move { result })
    }

    fn park_leases(&self, node: &str, held: &[(String, i64)]) -> StoreFuture<()> {
        let result = self.check().map(|()| {
            let mut rows = self.rows.lock().unwrap();
            for (chat, epoch) in held {
                if let Some(row) = rows.get_mut(chat)
                    && row.0 == node
                    && row.1 == *epoch
                {
                    *row = (PARKED_NODE.to_owned(), *epoch, Instant::now());
                }
            }
        });
        Box::pin(async move { result })
    }

    fn orphaned_chats(&self, limit: i64) -> StoreFuture<Vec<String>> {
        let result = self.check().map(|()| {
            let now = Instant::now();
            let rows = self.rows.lock().unwrap();
            self.open
                .lock()
                .unwrap()
                .iter()
                .filter(|c| {
                    rows.get(*c)
                        .is_none_or(|r| r.2 <= now && r.0 != PARKED_NODE)
                })
                .take(limit as usize)
                .cloned()
                .collect()
        });
        Box::pin(async move { result })
    }
}

/// Records what a lease manager told its node.
#[derive(Default)]
struct Node {
    changes: Vec<OwnershipChange>,
}
impl Actor for Node {
    type Context = Context<Self>;
}
impl Handler<OwnershipChange> for Node {
    type Result = ();
    fn handle(&mut self, msg: OwnershipChange, _: &mut Self::Context) {
        self.changes.push(msg);
    }
}
#[derive(Message)]
#[rtype(result = "Vec<OwnershipChange>")]
struct Changes;
impl Handler<Changes> for Node {
    type Result = MessageResult<Changes>;
    fn handle(&mut self, _: Changes, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.changes.clone())
    }
}

const TTL: Duration = Duration::from_millis(300);

fn manager(
    store: &Arc<MemoryLeases>,
    node: &str,
) -> (Addr<LeaseManager>, Addr<Node>, Arc<ClusterMetrics>) {
    let recorder = Node::default().start();
    let metrics = Arc::new(ClusterMetrics::default());
    let config = LeaseManagerConfig {
        node_id: node.to_owned(),
        ttl: TTL,
        takeover_batch: 100,
    };
    let addr = LeaseManager::new(
        store.clone(),
        config,
        recorder.clone().recipient(),
        metrics.clone(),
    )
    .start();
    (addr, recorder, metrics)
}

/// Has `manager` acquire each of `chats` (each must be free or its own).
async fn acquire_all(manager: &Addr<LeaseManager>, chats: &[&str]) {
    for chat in chats {
        let acquired = manager
            .send(AcquireLease {
                chat_id: (*chat).into(),
            })
            .await
            .unwrap()
            .unwrap();
        assert!(acquired.is_some(), "{chat} is another node's");
    }
}

/// Waits (up to 5 s) until `node` has been told `change`; returns how long it took.
async fn told(node: &Addr<Node>, change: &OwnershipChange) -> Duration {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if node.send(Changes).await.unwrap().contains(change) {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never told {change:?}");
}

#[actix_rt::test]
async fn a_held_lease_is_renewed_and_never_taken() {
    let store = MemoryLeases::new(&["c1"]);
    let (a, _, metrics) = manager(&store, "a");
    assert_eq!(
        a.send(AcquireLease {
            chat_id: "c1".into()
        })
        .await
        .unwrap()
        .unwrap(),
        Some(1)
    );
    let (b, b_node, _) = manager(&store, "b");
    assert_eq!(
        b.send(AcquireLease {
            chat_id: "c1".into()
        })
        .await
        .unwrap()
        .unwrap(),
        None
    );
    // Several TTLs: renewals keep it, and b's orphan scans never take it.
    let until = Instant::now() + TTL * 5;
    while Instant::now() < until {
        assert_eq!(store.owner("c1"), Some(("a".into(), 1)));
        tokio::time::sleep(TTL / 10).await;
    }
    assert!(b_node.send(Changes).await.unwrap().is_empty());
    assert_eq!(a.send(HeldLeases).await.unwrap(), vec![("c1".into(), 1)]);
    assert_eq!(metrics.owned_chats.load(Ordering::Relaxed), 1);
}

#[actix_rt::test]
async fn a_dead_nodes_chats_are_taken_over_with_a_new_epoch() {
    let store = MemoryLeases::new(&["c1", "c2"]);
    // a runs on its own arbiter (thread), stopped below as a killed process stops.
    let arbiter = Arbiter::new();
    let recorder = Node::default().start();
    let config = LeaseManagerConfig {
        node_id: "a".into(),
        ttl: TTL,
        takeover_batch: 100,
    };
    let a_store = store.clone();
    let a = LeaseManager::start_in_arbiter(&arbiter.handle(), move |_| {
        LeaseManager::new(
            a_store,
            config,
            recorder.recipient(),
            Arc::new(ClusterMetrics::default()),
        )
    });
    acquire_all(&a, &["c1", "c2"]).await;
    arbiter.stop();
    let died = Instant::now();
    let (_b, b_node, b_metrics) = manager(&store, "b");
    for chat in ["c1", "c2"] {
        told(
            &b_node,
            &OwnershipChange::TakenOver {
                chat_id: chat.into(),
                epoch: 2,
            },
        )
        .await;
    }
    let took = died.elapsed();
    // Expiry is at most TTL after a's last renewal; one scan period (TTL/3) later b has it.
    assert!(took >= TTL / 2, "not before the lease expired ({took:?})");
    assert_eq!(store.owner("c1"), Some(("b".into(), 2)));
    assert_eq!(b_metrics.takeovers.load(Ordering::Relaxed), 2);
}

#[actix_rt::test]
async fn a_node_cut_off_from_the_store_drops_its_chats_and_the_other_takes_them() {
    let store = MemoryLeases::new(&["c1"]);
    let (a, a_node, a_metrics) = manager(&store, "a");
    a.send(AcquireLease {
        chat_id: "c1".into(),
    })
    .await
    .unwrap()
    .unwrap();
    store.down.store(true, Ordering::SeqCst);
    told(
        &a_node,
        &OwnershipChange::Lost {
            chat_id: "c1".into(),
            epoch: 1,
        },
    )
    .await;
    assert!(a_metrics.lease_renew_failures.load(Ordering::Relaxed) >= 1);
    assert!(a.send(HeldLeases).await.unwrap().is_empty());
    store.down.store(false, Ordering::SeqCst);
    let (_b, b_node, _) = manager(&store, "b");
    // a (recovered) races b for the orphan; the store gives it to exactly one of them, and
    // only that one is told to start it.
    let started = Instant::now();
    while store.owner("c1").is_none_or(|(_, epoch)| epoch < 2) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (winner, epoch) = store.owner("c1").unwrap();
    assert_eq!(epoch, 2);
    let taken = OwnershipChange::TakenOver {
        chat_id: "c1".into(),
        epoch: 2,
    };
    let (winner_node, loser_node) = if winner == "a" {
        (&a_node, &b_node)
    } else {
        (&b_node, &a_node)
    };
    told(winner_node, &taken).await;
    assert!(!loser_node.send(Changes).await.unwrap().contains(&taken));
}

#[actix_rt::test]
async fn a_lease_taken_while_paused_is_reported_lost_on_the_next_renewal() {
    let store = MemoryLeases::new(&[]);
    let (a, a_node, _) = manager(&store, "a");
    a.send(AcquireLease {
        chat_id: "c1".into(),
    })
    .await
    .unwrap()
    .unwrap();
    // Another node took it over (as after a's pause past the TTL).
    store
        .rows
        .lock()
        .unwrap()
        .insert("c1".into(), ("b".into(), 2, Instant::now() + TTL * 100));
    told(
        &a_node,
        &OwnershipChange::Lost {
            chat_id: "c1".into(),
            epoch: 1,
        },
    )
    .await;
}

#[actix_rt::test]
async fn drain_hands_chats_over_without_waiting_for_expiry() {
    let store = MemoryLeases::new(&["c1", "c2"]);
    let (a, _, _) = manager(&store, "a");
    acquire_all(&a, &["c1", "c2"]).await;
    let mut released = a.send(Drain).await.unwrap();
    released.sort();
    assert_eq!(released, vec!["c1".to_string(), "c2".to_string()]);
    assert_eq!(
        a.send(AcquireLease {
            chat_id: "c3".into()
        })
        .await
        .unwrap()
        .unwrap(),
        None,
        "a draining node takes nothing"
    );
    // Immediately acquirable elsewhere, well before a TTL has passed.
    let (b, _, _) = manager(&store, "b");
    let started = Instant::now();
    assert_eq!(
        b.send(AcquireLease {
            chat_id: "c1".into()
        })
        .await
        .unwrap()
        .unwrap(),
        Some(2)
    );
    assert!(started.elapsed() < TTL);
    a.send(ReleaseLease {
        chat_id: "c2".into(),
    })
    .await
    .unwrap();
}

#[actix_rt::test]
async fn a_parked_lease_is_taken_over_by_no_scan_and_claimed_on_demand() {
    // c1 is a's, then parked; c2 stays a's.
    let store = MemoryLeases::new(&["c1", "c2"]);
    let (a, a_node, metrics) = manager(&store, "a");
    acquire_all(&a, &["c1", "c2"]).await;
    a.send(ParkLeases {
        chat_ids: vec!["c1".into(), "not-held".into()],
    })
    .await
    .unwrap();
    // Answered after the park's store call (it holds the mailbox until done).
    assert_eq!(a.send(HeldLeases).await.unwrap(), vec![("c2".into(), 1)]);
    assert_eq!(store.owner("c1"), Some((PARKED_NODE.into(), 1)));
    assert_eq!(metrics.leases_parked.load(Ordering::Relaxed), 1);
    assert_eq!(metrics.owned_chats.load(Ordering::Relaxed), 1);

    // A chat opened now with no lease is an orphan: the scan that takes it over finds every
    // orphan, and leaves the parked c1 alone.
    store.open.lock().unwrap().push("c3".into());
    let c3 = OwnershipChange::TakenOver {
        chat_id: "c3".into(),
        epoch: 1,
    };
    told(&a_node, &c3).await;
    assert_eq!(a_node.send(Changes).await.unwrap(), vec![c3]);
    assert_eq!(store.owner("c1"), Some((PARKED_NODE.into(), 1)));
    // A client asking b for c1 claims it, under the next epoch, and b learns it was parked
    // (nobody follows it).
    let (b, _, _) = manager(&store, "b");
    assert_eq!(
        b.send(ClaimLease {
            chat_id: "c1".into()
        })
        .await
        .unwrap()
        .unwrap(),
        Some(Claim {
            epoch: 2,
            was_parked: true
        })
    );
    assert_eq!(store.owner("c1"), Some(("b".into(), 2)));
}

#[actix_rt::test]
async fn a_park_the_store_refuses_is_not_counted_as_parked() {
    let store = MemoryLeases::new(&["c1"]);
    let (a, _, metrics) = manager(&store, "a");
    acquire_all(&a, &["c1"]).await;
    store.down.store(true, Ordering::SeqCst);
    a.send(ParkLeases {
        chat_ids: vec!["c1".into()],
    })
    .await
    .unwrap();
    // The metric says parked only of leases the next claim finds free: this one stays a's
    // until it expires.
    assert_eq!(a.send(HeldLeases).await.unwrap(), vec![]);
    assert_eq!(metrics.leases_parked.load(Ordering::Relaxed), 0);
    store.down.store(false, Ordering::SeqCst);
    assert_eq!(store.owner("c1"), Some(("a".into(), 1)));
}
