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
