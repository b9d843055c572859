//! What the cluster tests share: the NATS server to use, and a unique prefix per test.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use tessera_cluster::{ClusterBus, ClusterMetrics};

pub use tessera_cluster::testing::test_nats_url as nats_url;

/// A prefix no other test (or run) uses.
pub fn unique_prefix() -> String {
    format!("t{}", uuid::Uuid::new_v4().simple())
}

/// A node's bus: its own connection, as a separate process would have.
pub async fn node_bus(url: &str, node: &str, prefix: &str, timeout: Duration) -> ClusterBus {
    ClusterBus::connect(
        url,
        node,
        prefix,
        timeout,
        Arc::new(ClusterMetrics::default()),
    )
    .await
    .expect("NATS reachable")
}

// Not every test file uses it.
#[allow(unused_imports)]
pub use tessera_cluster::testing::DropBuckets;
