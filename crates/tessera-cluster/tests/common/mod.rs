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

/// Deletes a test's key-value buckets (the JetStream streams named after its prefix) when
/// dropped, pass or fail, so runs do not pile streams up on the shared server.
pub struct DropBuckets {
    url: String,
    prefix: String,
}

impl DropBuckets {
    pub fn new(url: &str, prefix: &str) -> Self {
        Self {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
        }
    }
}

impl Drop for DropBuckets {
    fn drop(&mut self) {
        let url = self.url.clone();
        let streams: Vec<String> = ["tickets", "quotas", "budgets"]
            .iter()
            .map(|b| format!("KV_{}_{b}", self.prefix))
            .collect();
        // Its own thread and runtime: this may run while the test's runtime unwinds.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(client) = async_nats::connect(url).await {
                    let js = async_nats::jetstream::new(client);
                    for stream in streams {
                        let _ = js.delete_stream(stream).await;
                    }
                }
            });
        })
        .join();
    }
}
