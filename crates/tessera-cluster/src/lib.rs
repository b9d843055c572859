//! Several `tessera serve` nodes as one service, on PostgreSQL (durable state and chat
//! ownership) and NATS (routing between nodes).
//!
//! - [`LeaseManager`]: the actor that owns this node's chat leases: acquires them, renews them
//!   all in one batched call every third of the TTL, takes over chats whose lease expired,
//!   releases them on drain, and tells the node when it lost one ([`OwnershipChange`]).
//! - [`ClusterBus`]: per-chat NATS subjects — live events published by the owner for
//!   subscribers on other nodes, and request/reply (with a timeout) for the commands a
//!   non-owner forwards to the owner (input, tool answers, cancels).
//! - [`GlobalLimits`]: limits that must hold across nodes (single-use WebSocket tickets, the
//!   per-tenant message budget, the per-tenant open-chat quota) in JetStream key-value buckets.
//!
//! Nothing here retains chat history: replay on resume always reads the store, so a lost NATS
//! message costs a live subscriber at most a resume, never data.

#![warn(missing_docs)]

mod bus;
mod error;
mod lease;
mod limits;
mod metrics;
mod subjects;
pub mod testing;

pub use bus::{
    ChatCommand, ClusterBus, CommandReply, CommandsDrain, IncomingCommand, LiveEvent,
    NumberedFrame, StreamFrame,
};
pub use error::ClusterError;
pub use lease::{
    AcquireLease, Claim, ClaimLease, Drain, HeldLeases, LeaseManager, LeaseManagerConfig,
    OwnershipChange, ParkLeases, ReleaseLease,
};
pub use limits::{AllowMessage, GlobalLimits, TenantBudgets, TicketRedeemError};
pub use metrics::ClusterMetrics;
pub use subjects::Subjects;
