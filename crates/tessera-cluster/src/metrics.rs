//! Per-node cluster counters, read by the server's `/metrics`.

use std::sync::atomic::{AtomicI64, AtomicU64};

/// Counters shared (by `Arc`) between the lease manager, the bus and the server.
#[derive(Debug, Default)]
pub struct ClusterMetrics {
    /// Chats whose lease this node holds.
    pub owned_chats: AtomicI64,
    /// Batched renewals that failed (store unreachable).
    pub lease_renew_failures: AtomicU64,
    /// Chats this node took over after another node's lease expired.
    pub takeovers: AtomicU64,
    /// Leases this node lost (renewal refused, or not renewed within the TTL).
    pub leases_lost: AtomicU64,
    /// Leases this node parked in the store: chats that left its memory idle, claimed again
    /// by whichever node a client asks next.
    pub leases_parked: AtomicU64,
    /// Chats this node handed over to the node a client's socket reached (see
    /// `ChatCommand::HandOver`); each is also counted as parked.
    pub chats_handed_over: AtomicU64,
    /// Last measured NATS round trip, microseconds.
    pub nats_rtt_us: AtomicU64,
    /// Commands forwarded to another node's chat.
    pub commands_forwarded: AtomicU64,
    /// Live events this node published for readers on other nodes (an owner publishes a
    /// chat's events only while such a reader follows it).
    pub live_events_published: AtomicU64,
}
