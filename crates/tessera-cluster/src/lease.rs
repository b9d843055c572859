//! `LeaseManager`: the actor that holds this node's chat leases.
//!
//! - [`AcquireLease`] takes a chat's lease (a new chat, or one a client asked for).
//! - Every `ttl / 3` it renews every held lease in ONE batched store call; leases the store
//!   did not renew are lost. If no renewal has succeeded for a whole TTL (store unreachable),
//!   every lease is considered lost too: another node may have taken the chats over by then,
//!   and the store would refuse this node's writes anyway (fencing by epoch).
//! - On the same tick it asks the store for orphaned chats (expired lease, or none) and takes
//!   them over; the store's atomic acquire lets exactly one node win each chat.
//! - [`ParkLeases`] parks the leases of chats that left memory idle: no scan takes them over,
//!   the next node a client asks claims them.
//! - [`Drain`] releases every lease (expires it now) so other nodes take the chats at once.
//!
//! It tells the node about every change through a `Recipient<OwnershipChange>`: the node
//! starts a taken-over chat from the store and stops a lost one.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tessera_store::{LeaseStore, StoreError};

use crate::ClusterMetrics;

/// The lease manager's settings.
#[derive(Debug, Clone)]
pub struct LeaseManagerConfig {
    /// This node's id (the lease rows' `node`).
    pub node_id: String,
    /// Lease time to live; renewed every third of it.
    pub ttl: Duration,
    /// Orphaned chats taken over per tick at most (bounds the burst of restores).
    pub takeover_batch: i64,
}

/// What the node must do about a chat.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub enum OwnershipChange {
    /// This node took the chat over at `epoch` (its previous owner's lease expired): start it
    /// from the store; its durable writes carry `epoch`.
    TakenOver {
        /// The chat.
        chat_id: String,
        /// The new epoch.
        epoch: i64,
    },
    /// This node no longer owns the chat: stop its session without writing anything more.
    Lost {
        /// The chat.
        chat_id: String,
        /// The epoch it held.
        epoch: i64,
    },
}

/// Take `chat_id`'s lease; the epoch, or `None` when another node holds it.
#[derive(Message, Debug)]
#[rtype(result = "Result<Option<i64>, StoreError>")]
pub struct AcquireLease {
    /// The chat.
    pub chat_id: String,
}

/// Take `chat_id`'s lease for a client that asked for the chat, as [`AcquireLease`] does; also
/// says whether the lease was parked.
#[derive(Message, Debug)]
#[rtype(result = "Result<Option<Claim>, StoreError>")]
pub struct ClaimLease {
    /// The chat.
    pub chat_id: String,
}

/// A lease taken by [`ClaimLease`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The epoch the node now holds.
    pub epoch: i64,
    /// The lease was parked: the chat left its last owner's memory idle, with no reader on
    /// another node following it.
    pub was_parked: bool,
}

/// Give one chat's lease up (the chat completed, or was handed over).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ReleaseLease {
    /// The chat.
    pub chat_id: String,
}

/// Park the leases of chats that left this node's memory of their own accord (idle, waiting
/// only on a client): no node takes them over by scanning; the next node a client asks
/// claims one ([`ClaimLease`]). One store call for all of them. Later messages wait for it,
/// so a claim of a chat parked here finds it parked, never half-way. Answered once done:
/// `false` when the store refused (the leases then expire by themselves).
#[derive(Message, Debug)]
#[rtype(result = "bool")]
pub struct ParkLeases {
    /// The chats.
    pub chat_ids: Vec<String>,
}

/// Graceful drain: stop taking chats over and release every lease; the released chat ids.
#[derive(Message, Debug)]
#[rtype(result = "Vec<String>")]
pub struct Drain;

/// The leases held now (chat id, epoch).
#[derive(Message, Debug)]
#[rtype(result = "Vec<(String, i64)>")]
pub struct HeldLeases;

/// See the module docs.
pub struct LeaseManager {
    store: Arc<dyn LeaseStore>,
    config: LeaseManagerConfig,
    owner: Recipient<OwnershipChange>,
    metrics: Arc<ClusterMetrics>,
    held: HashMap<String, i64>,
    /// When the last successful renewal was sent (local clock): the store's expiry is at least
    /// this plus the TTL, so until then no other node can hold our chats.
    last_renewed: Instant,
    renewing: bool,
    scanning: bool,
    draining: bool,
}

impl LeaseManager {
    /// A manager for `config.node_id` that reports to `owner`.
    pub fn new(
        store: Arc<dyn LeaseStore>,
        config: LeaseManagerConfig,
        owner: Recipient<OwnershipChange>,
        metrics: Arc<ClusterMetrics>,
    ) -> Self {
        Self {
            store,
            config,
            owner,
            metrics,
            held: HashMap::new(),
            last_renewed: Instant::now(),
            renewing: false,
            scanning: false,
            draining: false,
        }
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.config.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    fn set_owned_gauge(&self) {
        self.metrics.owned_chats.store(
            i64::try_from(self.held.len()).unwrap_or(i64::MAX),
            Ordering::Relaxed,
        );
    }

    fn lose(&mut self, chat_id: &str) {
        if let Some(epoch) = self.held.remove(chat_id) {
            self.metrics.leases_lost.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(chat_id, epoch, node = %self.config.node_id, "lease lost");
            self.owner.do_send(OwnershipChange::Lost {
                chat_id: chat_id.to_owned(),
                epoch,
            });
        }
    }

    fn renew(&mut self, ctx: &mut Context<Self>) {
        if self.renewing || self.held.is_empty() {
            if self.held.is_empty() {
                self.last_renewed = Instant::now();
            }
            return;
        }
        self.renewing = true;
        let sent_at = Instant::now();
        let batch: Vec<(String, i64)> = self.held.iter().map(|(c, e)| (c.clone(), *e)).collect();
        let store = self.store.clone();
        let node = self.config.node_id.clone();
        let ttl_ms = self.ttl_ms();
        let call = async move { store.renew_leases(&node, &batch, ttl_ms).await };
        ctx.spawn(call.into_actor(self).map(move |result, act, _| {
            act.renewing = false;
            match result {
                Ok(lost) => {
                    act.last_renewed = sent_at;
                    for chat_id in lost {
                        act.lose(&chat_id);
                    }
                }
                Err(e) => {
                    act.metrics
                        .lease_renew_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(node = %act.config.node_id, error = %e, "lease renewal failed");
                    // Past a whole TTL without a renewal the leases may have been taken
                    // over: stop the chats before they try to write (they would be fenced).
                    if act.last_renewed.elapsed() >= act.config.ttl {
                        let all: Vec<String> = act.held.keys().cloned().collect();
                        for chat_id in all {
                            act.lose(&chat_id);
                        }
                    }
                }
            }
            act.set_owned_gauge();
        }));
    }

    fn take_over_orphans(&mut self, ctx: &mut Context<Self>) {
        if self.scanning || self.draining {
            return;
        }
        self.scanning = true;
        let store = self.store.clone();
        let node = self.config.node_id.clone();
        let ttl_ms = self.ttl_ms();
        let limit = self.config.takeover_batch.max(1);
        let scan = async move {
            let orphans = store.orphaned_chats(limit).await?;
            let mut taken = Vec::new();
            for chat_id in orphans {
                // Another node may win the race for any of them; that is the point.
                if let Some(lease) = store.acquire_lease(&chat_id, &node, ttl_ms).await? {
                    taken.push((lease.chat_id, lease.epoch));
                }
            }
            Ok::<_, StoreError>(taken)
        };
        ctx.spawn(scan.into_actor(self).map(|result, act, _| {
            act.scanning = false;
            match result {
                Ok(taken) => {
                    for (chat_id, epoch) in taken {
                        if act.held.get(&chat_id) == Some(&epoch) {
                            // Our own lease, renewed between the scan and the acquire.
                            continue;
                        }
                        if act.draining {
                            // Drain began meanwhile: give it straight back.
                            act.release_in_background(chat_id, epoch);
                            continue;
                        }
                        act.metrics.takeovers.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(chat_id, epoch, node = %act.config.node_id, "took over chat");
                        act.held.insert(chat_id.clone(), epoch);
                        act.owner
                            .do_send(OwnershipChange::TakenOver { chat_id, epoch });
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %act.config.node_id, error = %e, "orphan scan failed")
                }
            }
            act.set_owned_gauge();
        }));
    }

    fn release_in_background(&self, chat_id: String, epoch: i64) {
        let store = self.store.clone();
        let node = self.config.node_id.clone();
        actix::spawn(async move {
            if let Err(e) = store.release_lease(&chat_id, &node, epoch).await {
                // It expires by itself within the TTL.
                tracing::warn!(chat_id, error = %e, "lease release failed");
            }
        });
    }
}

impl Actor for LeaseManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let period = (self.config.ttl / 3).max(Duration::from_millis(10));
        ctx.run_interval(period, |act, ctx| {
            act.renew(ctx);
            act.take_over_orphans(ctx);
        });
    }
}

impl LeaseManager {
    /// Takes `chat_id`'s lease (see [`AcquireLease`]).
    fn claim(
        &mut self,
        chat_id: String,
    ) -> ResponseActFuture<Self, Result<Option<Claim>, StoreError>> {
        if self.draining {
            return Box::pin(fut::ready(Ok(None)));
        }
        if let Some(epoch) = self.held.get(&chat_id) {
            return Box::pin(fut::ready(Ok(Some(Claim {
                epoch: *epoch,
                was_parked: false,
            }))));
        }
        let store = self.store.clone();
        let node = self.config.node_id.clone();
        let ttl_ms = self.ttl_ms();
        let call = async move { store.acquire_lease(&chat_id, &node, ttl_ms).await };
        Box::pin(call.into_actor(self).map(|result, act, _| {
            let lease = result?;
            Ok(lease.map(|lease| {
                act.held.insert(lease.chat_id, lease.epoch);
                act.set_owned_gauge();
                Claim {
                    epoch: lease.epoch,
                    was_parked: lease.was_parked,
                }
            }))
        }))
    }
}

impl Handler<AcquireLease> for LeaseManager {
    type Result = ResponseActFuture<Self, Result<Option<i64>, StoreError>>;

    fn handle(&mut self, msg: AcquireLease, _: &mut Self::Context) -> Self::Result {
        Box::pin(
            self.claim(msg.chat_id)
                .map(|claimed, _, _| claimed.map(|claim| claim.map(|c| c.epoch))),
        )
    }
}

impl Handler<ClaimLease> for LeaseManager {
    type Result = ResponseActFuture<Self, Result<Option<Claim>, StoreError>>;

    fn handle(&mut self, msg: ClaimLease, _: &mut Self::Context) -> Self::Result {
        self.claim(msg.chat_id)
    }
}

impl Handler<ReleaseLease> for LeaseManager {
    type Result = ();

    fn handle(&mut self, msg: ReleaseLease, _: &mut Self::Context) {
        if let Some(epoch) = self.held.remove(&msg.chat_id) {
            self.release_in_background(msg.chat_id, epoch);
            self.set_owned_gauge();
        }
    }
}

impl Handler<ParkLeases> for LeaseManager {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, msg: ParkLeases, ctx: &mut Self::Context) -> Self::Result {
        let parked: Vec<(String, i64)> = msg
            .chat_ids
            .into_iter()
            .filter_map(|chat_id| self.held.remove(&chat_id).map(|epoch| (chat_id, epoch)))
            .collect();
        if parked.is_empty() {
            // Any earlier park of them is done: it held the mailbox until then.
            return Box::pin(async { true });
        }
        self.set_owned_gauge();
        let store = self.store.clone();
        let node = self.config.node_id.clone();
        let metrics = self.metrics.clone();
        let park = async move {
            match store.park_leases(&node, &parked).await {
                // Counted once the store has them parked, so a reader of the metric knows
                // that the next claim of any of them finds it free.
                Ok(()) => {
                    metrics
                        .leases_parked
                        .fetch_add(parked.len() as u64, Ordering::Relaxed);
                    true
                }
                // They expire by themselves within the TTL and are then orphans, taken over.
                Err(e) => {
                    tracing::warn!(node, chats = parked.len(), error = %e, "leases not parked");
                    false
                }
            }
        };
        // Held in the mailbox, so a later claim finds them parked; answered when done.
        let (done, answer) = tokio::sync::oneshot::channel();
        ctx.wait(park.into_actor(self).map(move |parked, _, _| {
            let _ = done.send(parked);
        }));
        Box::pin(async move { answer.await.unwrap_or(false) })
    }
}

impl Handler<Drain> for LeaseManager {
    type Result = ResponseActFuture<Self, Vec<String>>;

    fn handle(&mut self, _: Drain, _: &mut Self::Context) -> Self::Result {
        self.draining = true;
        let held: Vec<(String, i64)> = self.held.drain().collect();
        self.set_owned_gauge();
        let store = self.store.clone();
        let node = self.config.node_id.clone();
        let release = async move {
            let mut released = Vec::with_capacity(held.len());
            for (chat_id, epoch) in held {
                match store.release_lease(&chat_id, &node, epoch).await {
                    Ok(()) => released.push(chat_id),
                    Err(e) => {
                        tracing::warn!(chat_id, error = %e, "lease release failed; it expires by itself")
                    }
                }
            }
            released
        };
        Box::pin(release.into_actor(self))
    }
}

impl Handler<HeldLeases> for LeaseManager {
    type Result = MessageResult<HeldLeases>;

    fn handle(&mut self, _: HeldLeases, _: &mut Self::Context) -> Self::Result {
        let mut held: Vec<(String, i64)> = self.held.iter().map(|(c, e)| (c.clone(), *e)).collect();
        held.sort();
        MessageResult(held)
    }
}
