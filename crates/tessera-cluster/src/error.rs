//! The crate's one error type.

use tessera_store::StoreError;

/// What can go wrong between nodes.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// NATS cannot be reached (connect, publish or subscribe failed).
    #[error("nats unavailable: {0}")]
    Nats(String),
    /// A forwarded command got no answer in time (the owner is slow, paused or just died).
    #[error("the chat's owner did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// No node serves the chat right now (none owns it yet, or a takeover is under way).
    #[error("no node owns chat '{0}' right now")]
    NoOwner(String),
    /// A message between nodes did not decode (another version, or garbage).
    #[error("bad message between nodes: {0}")]
    Decode(String),
    /// The key-value bucket behind a global limit failed.
    #[error("global limit store failed: {0}")]
    Limits(String),
    /// The lease store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
