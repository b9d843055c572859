//! What `/readyz` checks: the store answers a read and, in cluster mode, NATS answers a round
//! trip (which also records `tessera_cluster_nats_rtt_seconds`). A node that cannot reach
//! either is taken out of its load balancer until it can again; it recovers by itself.

use std::sync::Arc;
use std::time::Duration;

use tessera_cluster::ClusterBus;
use tessera_store::ChatStore;

/// How long a probe may take before it counts as failed (below the usual probe timeouts).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A chat id no chat has (ids are UUIDs or client-chosen printable text): reading it costs one
/// primary-key lookup.
const PROBE_CHAT_ID: &str = "\u{1}readyz-probe";

/// The dependencies a node needs to serve chats.
#[derive(Clone)]
pub struct Readiness {
    store: Arc<dyn ChatStore>,
    bus: Option<ClusterBus>,
}

impl Readiness {
    /// Checks `store`, and NATS through `bus` when the node runs in cluster mode.
    pub fn new(store: Arc<dyn ChatStore>, bus: Option<ClusterBus>) -> Self {
        Self { store, bus }
    }

    /// The names of the dependencies that do not answer now (empty: ready).
    pub async fn failing(&self) -> Vec<&'static str> {
        let store = async {
            matches!(
                tokio::time::timeout(PROBE_TIMEOUT, self.store.load_chat(PROBE_CHAT_ID)).await,
                Ok(Ok(_))
            )
        };
        let nats = async {
            match &self.bus {
                None => true,
                Some(bus) => {
                    bus.is_connected()
                        && matches!(
                            tokio::time::timeout(PROBE_TIMEOUT, bus.round_trip()).await,
                            Ok(Ok(_))
                        )
                }
            }
        };
        let (store_ok, nats_ok) = futures::join!(store, nats);
        let mut failing = Vec::new();
        if !store_ok {
            failing.push("store");
        }
        if !nats_ok {
            failing.push("nats");
        }
        failing
    }
}
