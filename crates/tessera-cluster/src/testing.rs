//! For tests of any crate that need a NATS server.

/// `TESSERA_TEST_NATS_URL`, or `None` after printing that `test` is skipped. Under `CI=true` a
/// missing NATS fails the test instead (panics).
pub fn test_nats_url(test: &str) -> Option<String> {
    match std::env::var("TESSERA_TEST_NATS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: TESSERA_TEST_NATS_URL is not set and CI=true"
            );
            eprintln!("SKIPPED {test}: set TESSERA_TEST_NATS_URL (e.g. nats://127.0.0.1:4222)");
            None
        }
    }
}

/// Deletes a test's key-value buckets (the JetStream streams named after its prefix) when
/// dropped, pass or fail, so runs do not pile streams up on the shared server.
pub struct DropBuckets {
    url: String,
    prefix: String,
}

impl DropBuckets {
    /// Drops the buckets of deployment `prefix` on the NATS server at `url` when dropped.
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
