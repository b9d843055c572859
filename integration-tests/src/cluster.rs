//! Several real `tessera serve` nodes as one service, for the cluster tests: one PostgreSQL
//! schema (chats and leases) and one NATS server (routing), each cluster under its own subject
//! prefix. Needs `TESSERA_TEST_DATABASE_URL` and `TESSERA_TEST_NATS_URL`; without them a test
//! says it is skipped, and under `CI=true` it fails instead.

use std::time::{Duration, Instant};

use tessera_store::testing::PgTestSchema;
use tessera_store::{ChatStore, PgStore};

use crate::server::{ServerOptions, TestServer};

const NATS_ENV: &str = "TESSERA_TEST_NATS_URL";

/// Lease TTL of the test nodes: short, so a takeover happens within the test's time.
pub const LEASE_TTL_S: u64 = 3;

/// The NATS url, or `None` (after printing that `test` is skipped); panics under `CI=true`.
pub fn nats_url(test: &str) -> Option<String> {
    let url = std::env::var(NATS_ENV).ok().filter(|u| !u.is_empty());
    if url.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{NATS_ENV} is not set, and CI=true requires the cluster tests to run"
        );
        eprintln!("skipped {test}: {NATS_ENV} is not set");
    }
    url
}

/// The tests of one file take turns: each runs several nodes and measures takeover times
/// against lease TTLs of a few seconds, and nodes of two tests at once on a 2-core machine
/// starve each other's lease renewals. (Test files are separate processes, which cargo runs
/// one after the other.)
pub static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// N nodes on one schema and one NATS subject prefix.
pub struct Cluster {
    pub schema: PgTestSchema,
    /// `None` once a test stopped the node.
    pub nodes: Vec<Option<TestServer>>,
    /// Each node's log (stderr), `node{i}.log`.
    logs: tempfile::TempDir,
}

impl Cluster {
    /// `count` nodes with the test lease TTL ([`LEASE_TTL_S`]); `None`: skipped.
    pub async fn start(test: &str, count: usize) -> Option<Cluster> {
        Self::start_with_ttl(test, count, LEASE_TTL_S).await
    }

    /// `count` nodes whose leases last `ttl_s`; `None`: skipped.
    pub async fn start_with_ttl(test: &str, count: usize, ttl_s: u64) -> Option<Cluster> {
        Self::start_with(test, count, ttl_s, ServerOptions::default()).await
    }

    /// `count` nodes whose leases last `ttl_s`, with `extra` settings for every node
    /// (environment on top of the cluster's own, workflows); `None`: skipped.
    pub async fn start_with(
        test: &str,
        count: usize,
        ttl_s: u64,
        extra: ServerOptions,
    ) -> Option<Cluster> {
        let nats = nats_url(test)?;
        let schema = PgTestSchema::create(test).await?;
        let prefix = format!("t{}", schema.name);
        let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut nodes = Vec::new();
        for i in 0..count {
            let mut env = vec![
                ("TESSERA_STORE_URL".to_owned(), schema.url()),
                ("TESSERA_NATS_URL".to_owned(), nats.clone()),
                ("TESSERA_NATS_PREFIX".to_owned(), prefix.clone()),
                ("TESSERA_NODE_ID".to_owned(), format!("node{i}")),
                ("TESSERA_LEASE_TTL_S".to_owned(), ttl_s.to_string()),
                // One vault key for the service: a node that takes a chat over opens the
                // secrets another node sealed.
                ("TESSERA_SECRET_KEY".to_owned(), "42".repeat(32)),
                // The tenant budget is global in a cluster: 300 chats of one tenant (plus their
                // resends after reconnects) would spend the default 1,200 a minute and wait for
                // the next minute, which is not what these tests measure.
                (
                    "TESSERA_MESSAGES_PER_MINUTE_PER_TENANT".to_owned(),
                    "1000000".to_owned(),
                ),
                (
                    "RUST_LOG".to_owned(),
                    "warn,tessera_cluster=info,tessera_server::cluster=info".to_owned(),
                ),
            ];
            env.extend(extra.env.iter().cloned());
            let options = ServerOptions {
                env,
                workflows_dir: extra.workflows_dir.clone(),
                stderr_file: Some(logs.path().join(format!("node{i}.log"))),
                ..Default::default()
            };
            nodes.push(Some(TestServer::start(options).await));
        }
        Some(Cluster {
            schema,
            nodes,
            logs,
        })
    }

    /// Node `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.logs.path().join(format!("node{i}.log"))).unwrap_or_default()
    }

    /// Node `i` (panics if a test stopped it).
    pub fn node(&self, i: usize) -> &TestServer {
        self.nodes[i]
            .as_ref()
            .unwrap_or_else(|| panic!("node {i} was stopped"))
    }

    /// Every node's base url (empty for a stopped node).
    pub fn bases(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.as_ref().map(|n| n.base.clone()).unwrap_or_default())
            .collect()
    }

    /// The cluster's store, opened by the test.
    pub async fn store(&self) -> PgStore {
        PgStore::connect(&self.schema.url())
            .await
            .unwrap_or_else(|e| panic!("cannot open the test store: {e}"))
    }
}

/// Waits (polling) until `done`; fails the test after `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every stored event of `chat`, once the store holds the event with seq `through` or a later
/// one (`what` names the wait in its timeout message).
pub async fn stored_events(
    store: &PgStore,
    chat: &str,
    through: u64,
    what: &str,
) -> Vec<tessera_store::StoredEvent> {
    wait_until(what, Duration::from_secs(10), async || {
        store
            .events_after(chat, 0, u32::MAX)
            .await
            .is_ok_and(|e| e.last().is_some_and(|e| e.seq >= through))
    })
    .await;
    store
        .events_after(chat, 0, u32::MAX)
        .await
        .unwrap_or_default()
}

/// Asserts a client's view of a chat (its logged events after seq `after`, `(seq, event)` in
/// the order it got them, over all its sockets) against the store: seqs ascending (no
/// duplicate), every stored event after `after` up to the last seq seen was seen and is the
/// same, and what was seen but is not stored is a streamed delta (live only: no store holds
/// one, see docs/protocol.md).
pub fn assert_view_matches_store(
    chat: &str,
    after: u64,
    seen: &[(u64, &serde_json::Value)],
    stored: &[tessera_store::StoredEvent],
) {
    let seqs: Vec<u64> = seen.iter().map(|(seq, _)| *seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "chat {chat}: seqs out of order or repeated in the client's view: {seqs:?}"
    );
    let last = seqs.last().copied().unwrap_or(0);
    for event in stored
        .iter()
        .filter(|e| e.seq > after)
        .take_while(|e| e.seq <= last)
    {
        let in_store: serde_json::Value =
            serde_json::from_str(&event.json).unwrap_or(serde_json::Value::Null);
        let view = seen.iter().find(|(seq, _)| *seq == event.seq);
        assert_eq!(
            view.map(|(_, event)| *event),
            Some(&in_store),
            "chat {chat}: the client saw something else under seq {} than the store holds (seen: {seqs:?})",
            event.seq
        );
    }
    for (seq, event) in seen {
        if stored.binary_search_by_key(seq, |e| e.seq).is_err() {
            assert_eq!(
                event["type"], "chat.text_delta",
                "chat {chat}: seq {seq} was seen but is not in the store"
            );
        }
    }
}
