//! Chat ownership between several nodes: the [`LeaseStore`] trait and its [`Lease`] rows.
//!
//! WHY a trait of its own: only a shared database (PostgreSQL) can arbitrate between nodes, so
//! the single-node SQLite store implements none of it. Every time value comes from the
//! database's clock (`now()`), never from a node's, so nodes with skewed clocks still agree on
//! who holds a lease.
//!
//! A lease alone cannot stop a node that was paused past its expiry from writing once it
//! resumes; fencing does: each durable chat write carries the epoch its writer holds
//! ([`crate::ChatWriteBatch::epoch`], the `epoch` argument of the tool claim and completion),
//! and the store refuses it with [`crate::StoreError::Fenced`] once the epoch moved on.

use crate::StoreFuture;

/// One chat's lease: which node owns the chat, under which epoch, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The chat.
    pub chat_id: String,
    /// The node holding it.
    pub node: String,
    /// Increases by one at every takeover; durable writes carry it (fencing).
    pub epoch: i64,
    /// When the lease lapses unless renewed, Unix milliseconds (database clock).
    pub expires_at_ms: i64,
    /// This acquire claimed a parked lease ([`LeaseStore::park_leases`]): the chat had left its
    /// owner's memory with nobody following it, so no reader on another node awaits its
    /// events.
    pub was_parked: bool,
}

/// The node a parked lease names (see [`LeaseStore::park_leases`]): none. WHY a node name and
/// not a column of its own: a node of an older build (during a rolling upgrade) knows nothing
/// of parking; it acquires a parked lease as an expired one, and its own leases, once expired,
/// are orphans to every node, whatever build.
pub const PARKED_NODE: &str = "";

/// Leases of chats among nodes, kept in the shared database.
pub trait LeaseStore: Send + Sync + 'static {
    /// Take the chat's lease for `node`: creates it (epoch 1) if none exists, returns the
    /// existing one (extended by `ttl_ms`) if `node` already holds it and it is live, takes it
    /// over (epoch + 1) only if it has expired; `Ok(None)` when another node holds a live
    /// lease.
    fn acquire_lease(&self, chat_id: &str, node: &str, ttl_ms: i64) -> StoreFuture<Option<Lease>>;

    /// Extend every given `(chat_id, epoch)` lease `node` still holds at that epoch by
    /// `ttl_ms`; returns the chat ids NOT renewed (lost to another node or released).
    fn renew_leases(
        &self,
        node: &str,
        held: &[(String, i64)],
        ttl_ms: i64,
    ) -> StoreFuture<Vec<String>>;

    /// Give a lease up (graceful drain): it expires now, so another node can take it at once.
    /// A lease `node` no longer holds at `epoch` is left alone.
    fn release_lease(&self, chat_id: &str, node: &str, epoch: i64) -> StoreFuture<()>;

    /// Park the given `(chat_id, epoch)` leases `node` still holds at that epoch: the chats
    /// left its memory of their own accord (idle, waiting only on a client), so no node takes
    /// them over by scanning; the next node a client asks claims one with
    /// [`LeaseStore::acquire_lease`] (the epoch moves on as after an expiry). Parked leases
    /// belong to no node ([`PARKED_NODE`]).
    fn park_leases(&self, node: &str, held: &[(String, i64)]) -> StoreFuture<()>;

    /// Open chats whose lease has expired (or that have none), oldest first, up to `limit`;
    /// parked leases are not orphans.
    fn orphaned_chats(&self, limit: i64) -> StoreFuture<Vec<String>>;
}
