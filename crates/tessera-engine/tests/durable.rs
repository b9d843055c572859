//! Durability with a real SQLite store: the chat's log and state reach the store, a tool whose
//! durable record says "started, not completed" is reported as interrupted and never re-run,
//! and a chat rebuilt after a "restart" (a second engine on the same database) answers its
//! pending UI call exactly once.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use serde_json::{Map, json};
use tessera_engine::session::{
    GetSnapshot, Relinquish, ReplayEvents, Replayed, ToolAnswer, UserInput,
};
use tessera_engine::{EngineConfig, EngineHooks, NewChat};
use tessera_store::{
    ChatRecord, ChatStore, ChatWriteBatch, PendingUiRecord, SqliteStore, StoreError, StoreFuture,
    StoredChat, StoredEvent, StoredMessage, ToolClaim,
};

async fn store_at(dir: &std::path::Path) -> Arc<SqliteStore> {
    match SqliteStore::open(&dir.join("t.db")).await {
        Ok(s) => Arc::new(s),
        Err(e) => panic!("open store: {e}"),
    }
}

fn hooks(store: &Arc<SqliteStore>) -> EngineHooks {
    EngineHooks {
        store: Some(store.clone() as Arc<dyn ChatStore>),
        ..EngineHooks::default()
    }
}

fn say(content: &str) -> UserInput {
    UserInput {
        content: content.into(),
        client_msg_id: None,
    }
}

async fn new_chat(h: &Harness) -> Client {
    let chat = h
        .engine
        .start_chat(NewChat {
            tenant: "t".into(),
            user: "u".into(),
            workflow: "EngineTest".into(),
            context: Map::new(),
            chat_id: None,
        })
        .await;
    match chat {
        Ok(chat) => subscribe(chat, 0).await,
        Err(e) => panic!("{e}"),
    }
}

#[actix::test]
async fn a_tool_started_before_a_crash_is_reported_interrupted_not_rerun() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = store_at(dir.path()).await;
    let h = harness_with_hooks(EngineConfig::default(), hooks(&store), |req| {
        if after_tool(req) {
            let fed = req
                .messages
                .last()
                .map(|m| m.content_str().to_owned())
                .unwrap_or_default();
            return Reply::Text(if fed.contains("interrupted") {
                "told interrupted".into()
            } else {
                fed
            });
        }
        Reply::Tools(vec![("echo", json!({"message": "hi"}))])
    });
    let mut c = new_chat(&h).await;
    c.until("chat.input_request").await;
    // The previous process claimed this turn's first tool call and died before completing it.
    let chat_id = c.chat.identity.chat_id.to_string();
    let key = format!("turn_{chat_id}_HelperAgent_1:s1:0");
    assert_eq!(
        store.claim_tool(&chat_id, &key, None).await.ok(),
        Some(ToolClaim::Claimed)
    );

    assert!(c.chat.addr.send(say("go")).await.is_ok());
    let answer = c.until_match_agent("HelperAgent").await;
    assert_eq!(answer["data"]["content"], "told interrupted");
    assert_eq!(
        h.echo_runs.load(Ordering::SeqCst),
        0,
        "an interrupted tool is never silently re-run"
    );
}

#[actix::test]
async fn a_pending_ui_call_survives_a_restart_and_is_answered_once() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = store_at(dir.path()).await;
    let first = harness_with_hooks(EngineConfig::default(), hooks(&store), default_plan_script);
    let mut c = new_chat(&first).await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("next")).await.is_ok());
    let ui = loop {
        let call = c.until("chat.tool_call").await;
        if call["data"]["awaiting_response"] == true {
            break call;
        }
    };
    let corr = ui["data"]["corr"].as_str().unwrap_or_default().to_owned();
    let chat_id = c.chat.identity.chat_id.to_string();
    let seen = c
        .seen
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .max()
        .unwrap_or(0);
    // Wait until the store has the whole log (writes are behind the session).
    for _ in 0..200 {
        if store.last_seq(&chat_id).await.unwrap_or(0) >= seen
            && !store
                .pending_ui(&chat_id)
                .await
                .unwrap_or_default()
                .is_empty()
        {
            break;
        }
        actix::clock::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(store.last_seq(&chat_id).await.ok(), Some(seen));

    // "Restart": a second engine on the same database; the first one's actors are abandoned.
    let second = harness_with_hooks(EngineConfig::default(), hooks(&store), default_plan_script);
    let restored = second.engine.rehydrate().await.unwrap_or_default();
    let chat = restored
        .into_iter()
        .find(|h| *h.identity.chat_id == *chat_id)
        .unwrap_or_else(|| panic!("chat not rehydrated"));
    let snapshot = chat
        .addr
        .send(GetSnapshot)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(snapshot.status.as_str(), "awaiting_tool");
    assert_eq!(
        snapshot.last_seq, seen,
        "the event log continues where it stopped"
    );
    assert_eq!(
        snapshot.pending_ui_calls.first().map(|p| p.corr.clone()),
        Some(corr.clone())
    );

    let mut again = subscribe(chat.clone(), seen).await;
    let response = json!({"status": "success", "data": {}});
    assert_eq!(
        chat.addr
            .send(ToolAnswer {
                corr: corr.clone(),
                response: response.clone()
            })
            .await
            .ok(),
        Some(Ok(()))
    );
    let done = again.until("chat.tool_response").await;
    assert_eq!(done["data"]["success"], true);
    assert_eq!(done["seq"], seen + 1, "no seq is reused after the restart");
    again.until("chat.run_complete").await;
    let replay = chat.addr.send(ToolAnswer { corr, response }).await;
    assert!(
        matches!(replay.ok(), Some(Err(_))),
        "the answer is accepted once"
    );
}

/// The real SQLite store, except that its first `failures` batch writes fail the way a failed
/// commit does (a transient error: disk full, I/O error, lock timeout), and tool claims can be
/// made to hang (see [`ClaimMode`]) like a process stopping right there.
struct FlakyStore {
    inner: SqliteStore,
    failures: AtomicUsize,
    claims: std::sync::atomic::AtomicU8,
    /// Batch writes refused for good (a conflict) from now on.
    refuse: std::sync::atomic::AtomicBool,
    /// Reads of a chat's events (`events_after`) so far.
    event_reads: AtomicUsize,
    /// The largest `limit` a read of a chat's events asked for.
    largest_event_read: AtomicUsize,
    /// Reads of a chat's events fail from now on.
    fail_event_reads: std::sync::atomic::AtomicBool,
}

/// A [`FlakyStore`] over a new SQLite database in `dir`, and engine hooks that use it.
async fn flaky_store(
    dir: &std::path::Path,
    failures: usize,
    claims: ClaimMode,
) -> (Arc<FlakyStore>, EngineHooks) {
    let inner = match SqliteStore::open(&dir.join("t.db")).await {
        Ok(s) => s,
        Err(e) => panic!("open store: {e}"),
    };
    let store = Arc::new(FlakyStore::new(inner, failures, claims));
    let hooks = EngineHooks {
        store: Some(store.clone() as Arc<dyn ChatStore>),
        ..EngineHooks::default()
    };
    (store, hooks)
}

/// What a [`FlakyStore`] does with a tool claim.
#[repr(u8)]
enum ClaimMode {
    /// Claims it.
    Pass = 0,
    /// Never answers, and claims nothing: the process stopped before its claim.
    HangUnclaimed = 1,
    /// Claims it in the store, then never answers: the process stopped after its claim.
    HangClaimed = 2,
}

impl FlakyStore {
    fn new(inner: SqliteStore, failures: usize, claims: ClaimMode) -> Self {
        Self {
            inner,
            failures: AtomicUsize::new(failures),
            claims: std::sync::atomic::AtomicU8::new(claims as u8),
            refuse: std::sync::atomic::AtomicBool::new(false),
            event_reads: AtomicUsize::new(0),
            largest_event_read: AtomicUsize::new(0),
            fail_event_reads: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl ChatStore for FlakyStore {
    fn apply_batch(&self, chat_id: &str, batch: Arc<ChatWriteBatch>) -> StoreFuture<()> {
        let fail = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Box::pin(std::future::ready(Err(StoreError::Transient(
                "injected failure".into(),
            ))));
        }
        if self.refuse.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Err(StoreError::Conflict(
                "injected conflict".into(),
            ))));
        }
        self.inner.apply_batch(chat_id, batch)
    }
    fn create_chat(&self, record: ChatRecord) -> StoreFuture<()> {
        self.inner.create_chat(record)
    }
    fn load_chat(&self, chat_id: &str) -> StoreFuture<Option<StoredChat>> {
        self.inner.load_chat(chat_id)
    }
    fn list_chats(
        &self,
        t: &str,
        u: &str,
        limit: u32,
        offset: u32,
    ) -> StoreFuture<Vec<StoredChat>> {
        self.inner.list_chats(t, u, limit, offset)
    }
    fn list_open_chats(&self) -> StoreFuture<Vec<StoredChat>> {
        self.inner.list_open_chats()
    }
    fn all_messages(&self, chat_id: &str) -> StoreFuture<Vec<StoredMessage>> {
        self.inner.all_messages(chat_id)
    }
    fn events_after(&self, chat_id: &str, after: u64, limit: u32) -> StoreFuture<Vec<StoredEvent>> {
        self.event_reads.fetch_add(1, Ordering::SeqCst);
        self.largest_event_read
            .fetch_max(limit as usize, Ordering::SeqCst);
        if self.fail_event_reads.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Err(StoreError::Transient(
                "injected read failure".into(),
            ))));
        }
        self.inner.events_after(chat_id, after, limit)
    }
    fn last_seq_taken(&self, chat_id: &str) -> StoreFuture<u64> {
        self.inner.last_seq_taken(chat_id)
    }
    fn pending_ui(&self, chat_id: &str) -> StoreFuture<Vec<PendingUiRecord>> {
        self.inner.pending_ui(chat_id)
    }
    fn claim_tool(&self, chat_id: &str, key: &str, epoch: Option<i64>) -> StoreFuture<ToolClaim> {
        let mode = self.claims.load(Ordering::SeqCst);
        if mode == ClaimMode::HangUnclaimed as u8 {
            return Box::pin(futures::future::pending());
        }
        let claim = self.inner.claim_tool(chat_id, key, epoch);
        match mode {
            2 => Box::pin(async move {
                let _ = claim.await;
                futures::future::pending().await
            }),
            _ => claim,
        }
    }
    fn complete_tool(&self, chat_id: &str, key: &str, epoch: Option<i64>) -> StoreFuture<()> {
        self.inner.complete_tool(chat_id, key, epoch)
    }
    fn complete_tool_recording(
        &self,
        chat_id: &str,
        key: &str,
        result: &serde_json::Value,
        epoch: Option<i64>,
    ) -> StoreFuture<()> {
        self.inner
            .complete_tool_recording(chat_id, key, result, epoch)
    }
    fn put_secrets(&self, chat_id: &str, sealed: Vec<u8>) -> StoreFuture<()> {
        self.inner.put_secrets(chat_id, sealed)
    }
    fn load_secrets(&self, chat_id: &str) -> StoreFuture<Option<Vec<u8>>> {
        self.inner.load_secrets(chat_id)
    }
    fn delete_secrets(&self, chat_id: &str) -> StoreFuture<bool> {
        self.inner.delete_secrets(chat_id)
    }
    fn delete_chat(&self, chat_id: &str) -> StoreFuture<bool> {
        self.inner.delete_chat(chat_id)
    }
    fn completed_chats_before(&self, before_ms: i64, limit: u32) -> StoreFuture<Vec<String>> {
        self.inner.completed_chats_before(before_ms, limit)
    }
    fn count_open_chats(&self, tenant: &str) -> StoreFuture<u64> {
        self.inner.count_open_chats(tenant)
    }
}

#[actix::test]
async fn failed_flushes_are_retried_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (store, hooks) = flaky_store(dir.path(), 3, ClaimMode::Pass).await;
    let h = harness_with_hooks(EngineConfig::default(), hooks, |req| {
        if after_tool(req) {
            return Reply::Text("done".into());
        }
        Reply::Tools(vec![("echo", json!({"message": "hi"}))])
    });
    let mut c = new_chat(&h).await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("go")).await.is_ok());
    c.until("chat.input_request").await;
    let chat_id = c.chat.identity.chat_id.to_string();

    // Retries back off (50 ms, 100 ms, 200 ms): wait until the session reports the store
    // caught up with its log.
    let mut snapshot = None;
    for _ in 0..500 {
        let now = c.chat.addr.send(GetSnapshot).await;
        let Ok(now) = now else { panic!("session gone") };
        if now.persisted_seq == Some(now.last_seq) {
            snapshot = Some(now);
            break;
        }
        actix::clock::sleep(std::time::Duration::from_millis(10)).await;
    }
    let Some(snapshot) = snapshot else {
        panic!("the store never caught up with the chat's log");
    };
    assert_eq!(
        store.failures.load(Ordering::SeqCst),
        0,
        "failures were injected"
    );
    let stored: Vec<u64> = store
        .inner
        .events_after(&chat_id, 0, 10_000)
        .await
        .unwrap_or_default()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(
        stored,
        (1..=snapshot.last_seq).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
    // The whole transcript (user, tool call, tool result, answer), in order, each once.
    let messages = store.inner.all_messages(&chat_id).await.unwrap_or_default();
    let idx: Vec<u64> = messages.iter().map(|m| m.idx).collect();
    assert_eq!(idx, (0..messages.len() as u64).collect::<Vec<_>>());
    let contents: Vec<&str> = messages.iter().map(|m| &*m.content).collect();
    assert_eq!(contents.first(), Some(&"go"), "{contents:?}");
    assert_eq!(contents.last(), Some(&"done"), "{contents:?}");
    assert!(messages.len() >= snapshot.transcript.len());
}

/// A chat of three turns (tool, then answer) on a store whose event reads are counted, that
/// keeps only `events_in_memory` of its stored events in memory, once the store holds them all.
async fn chat_with_few_events_in_memory(
    events_in_memory: usize,
) -> (tempfile::TempDir, Arc<FlakyStore>, Harness, Client) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (store, hooks) = flaky_store(dir.path(), 0, ClaimMode::Pass).await;
    let config = EngineConfig {
        events_in_memory,
        ..EngineConfig::default()
    };
    let h = harness_streaming(config, hooks, |req| {
        if after_tool(req) {
            return Reply::Streamed("done, and streamed".into());
        }
        Reply::Tools(vec![("echo", json!({"message": "hi"}))])
    });
    let mut c = new_chat(&h).await;
    c.until("chat.input_request").await;
    for turn in ["one", "two", "three"] {
        assert!(c.chat.addr.send(say(turn)).await.is_ok());
        c.until("chat.input_request").await;
    }
    for _ in 0..500 {
        let Ok(now) = c.chat.addr.send(GetSnapshot).await else {
            panic!("session gone")
        };
        if now.persisted_seq == Some(now.last_seq) {
            return (dir, store, h, c);
        }
        actix::clock::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the store never caught up with the chat's log");
}

/// The logged events a client gets on replay: what it saw live, but the deltas of messages
/// that are final (their `chat.text` replaces them).
fn replayable(live: &[serde_json::Value]) -> Vec<serde_json::Value> {
    live.iter()
        .filter(|e| e["seq"].as_u64().unwrap_or(0) > 0 && e["type"] != "chat.text_delta")
        .cloned()
        .collect()
}

/// The logged events of a resume, up to its `chat.resume_boundary` (returned too).
async fn resume(
    chat: &tessera_engine::ChatHandle,
    after: u64,
) -> (Vec<serde_json::Value>, serde_json::Value) {
    let mut client = subscribe(chat.clone(), after).await;
    let boundary = client.until("chat.resume_boundary").await;
    let logged = client
        .seen
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap_or(0) > 0)
        .cloned()
        .collect();
    (logged, boundary)
}

#[actix::test]
async fn a_resume_from_before_the_events_in_memory_replays_them_from_the_store() {
    let (_dir, store, _h, c) = chat_with_few_events_in_memory(4).await;
    let expected = replayable(&c.seen);
    assert!(
        c.of("chat.text_delta").len() > 1 && expected.len() > 12,
        "the chat must log deltas and more events than memory keeps: {:?}",
        c.types()
    );

    // From the start: the store's part, then memory's, byte for byte what was sent live.
    let reads = store.event_reads.load(Ordering::SeqCst);
    let (replayed, boundary) = resume(&c.chat, 0).await;
    assert_eq!(
        store.event_reads.load(Ordering::SeqCst),
        reads + 1,
        "the forgotten events come from the store"
    );
    assert_eq!(replayed, expected);
    assert_eq!(boundary["data"]["from_seq"], 0);
    assert_eq!(boundary["data"]["replayed"], expected.len());

    // From the middle, and from the last few events, which memory still holds.
    let last = expected.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0);
    for after in [5, last - 2] {
        let (replayed, _) = resume(&c.chat, after).await;
        let tail: Vec<_> = expected
            .iter()
            .filter(|e| e["seq"].as_u64().unwrap_or(0) > after)
            .cloned()
            .collect();
        assert_eq!(replayed, tail, "resume after {after}");
    }
    assert_eq!(
        store.event_reads.load(Ordering::SeqCst),
        reads + 2,
        "a resume within memory reads nothing"
    );
}

/// What another node's feed asks the owner for: the replay a subscriber gets (the store's part
/// and memory's), in pages that end where the limits say, each whole through its `through`.
#[actix::test]
async fn a_replay_for_another_node_is_a_subscriber_s_replay_in_pages() {
    let (_dir, store, _h, c) = chat_with_few_events_in_memory(4).await;
    let expected = replayable(&c.seen);
    let ask = |after_seq: u64, max_events: usize, max_bytes: usize, with_session: bool| {
        let chat = c.chat.clone();
        async move {
            let asked = chat.addr.send(ReplayEvents {
                after_seq,
                max_events,
                max_bytes,
                with_session,
            });
            match asked.await {
                Ok(Ok(page)) => page,
                other => panic!("no replay: {:?}", other.map(|r| r.map(|p| p.through))),
            }
        }
    };
    let texts = |page: &Replayed| -> Vec<serde_json::Value> {
        page.events
            .iter()
            .map(|t| serde_json::from_str(t).unwrap_or_default())
            .collect()
    };

    let first = ask(0, 5, usize::MAX, true).await;
    let session: serde_json::Value = first
        .session
        .as_deref()
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    assert_eq!(session["type"], "chat.session");
    assert_eq!(session["seq"], 0);
    assert!(first.more && first.events.len() == 5);
    let mut replayed = texts(&first);
    let mut through = first.through;
    assert!(
        through >= replayed[4]["seq"].as_u64().unwrap_or(u64::MAX),
        "whole through the page's last event"
    );
    loop {
        let page = ask(through, 5, usize::MAX, false).await;
        assert!(page.session.is_none(), "asked for once");
        assert!(page.events.len() <= 5);
        replayed.extend(texts(&page));
        through = page.through;
        if !page.more {
            break;
        }
    }
    assert_eq!(replayed, expected, "the pages make the subscriber's replay");
    assert_eq!(
        store.largest_event_read.load(Ordering::SeqCst),
        5,
        "no page reads more of the store than it holds"
    );
    let last_seq = c.chat.addr.send(GetSnapshot).await.map(|s| s.last_seq);
    assert_eq!(
        Ok(through),
        last_seq,
        "the last page is whole through the log's end"
    );

    // An event bigger than an answer may be ends the page before it, empty when it is first.
    let big = ask(0, 500, 10, false).await;
    let first_seq = expected[0]["seq"].as_u64().unwrap_or(0);
    assert!(big.events.is_empty() && big.more);
    assert_eq!(big.through, first_seq - 1);
}

#[actix::test]
async fn after_a_batch_the_store_refused_memory_forgets_nothing_more_and_a_resume_still_gets_all() {
    let (_dir, store, _h, mut c) = chat_with_few_events_in_memory(4).await;
    // The next turn's writes are refused for good: the store's log now has a gap.
    store.refuse.store(true, Ordering::SeqCst);
    assert!(c.chat.addr.send(say("four")).await.is_ok());
    c.until("chat.input_request").await;
    let expected = replayable(&c.seen);
    let (replayed, boundary) = resume(&c.chat, 0).await;
    assert_eq!(
        replayed, expected,
        "what was forgotten comes from the store, what it lacks from memory"
    );
    assert_eq!(boundary["data"]["from_seq"], 0);
}

#[actix::test]
async fn a_failed_read_of_forgotten_events_is_reported_and_the_rest_replayed() {
    let (_dir, store, _h, c) = chat_with_few_events_in_memory(4).await;
    let expected = replayable(&c.seen);
    store.fail_event_reads.store(true, Ordering::SeqCst);
    let mut client = subscribe(c.chat.clone(), 0).await;
    let boundary = client.until("chat.resume_boundary").await;
    let error = client.of("chat.error");
    assert_eq!(error.len(), 1, "{:?}", client.types());
    assert_eq!(error[0]["data"]["recoverable"], true);
    let from = boundary["data"]["from_seq"].as_u64().unwrap_or(0);
    assert!(from > 0, "the boundary says where the replay starts");
    let replayed: Vec<_> = client
        .seen
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap_or(0) > 0)
        .cloned()
        .collect();
    let tail: Vec<_> = expected
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap_or(0) > from)
        .cloned()
        .collect();
    assert_eq!(replayed, tail);

    // The chat goes on, and a later resume gets everything.
    store.fail_event_reads.store(false, Ordering::SeqCst);
    let (replayed, _) = resume(&c.chat, 0).await;
    assert_eq!(replayed, expected);
}

#[actix::test]
async fn a_ui_call_that_timed_out_leaves_the_stored_pending_list() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = store_at(dir.path()).await;
    let config = EngineConfig {
        ui_timeout: Some(std::time::Duration::from_millis(200)),
        ..EngineConfig::default()
    };
    let h = harness_with_hooks(config, hooks(&store), default_plan_script);
    let mut c = new_chat(&h).await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("next")).await.is_ok());
    let response = c.until("chat.tool_response").await;
    assert_eq!(response["data"]["payload"]["code"], "ui_timeout");
    let chat_id = c.chat.identity.chat_id.to_string();
    // The store is written behind the session: wait (bounded) for it to catch up.
    let mut caught_up = false;
    for _ in 0..500 {
        let snapshot = c.chat.addr.send(GetSnapshot).await;
        let Ok(snapshot) = snapshot else {
            panic!("session gone")
        };
        if snapshot.persisted_seq == Some(snapshot.last_seq) {
            caught_up = true;
            break;
        }
        actix::clock::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(caught_up, "the store never caught up with the chat's log");
    let pending = store.pending_ui(&chat_id).await.unwrap_or_default();
    assert!(pending.is_empty(), "still pending: {pending:?}");
}

/// Failover: another node's engine takes one open chat over from the store (only that chat),
/// and it continues where its dead owner's store writes stopped.
#[actix::test]
async fn one_open_chat_is_taken_over_by_another_engine() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = store_at(dir.path()).await;
    let first = harness_with_hooks(EngineConfig::default(), hooks(&store), default_plan_script);
    let mut c = new_chat(&first).await;
    let _other = new_chat(&first).await;
    c.until("chat.input_request").await;
    let chat_id = c.chat.identity.chat_id.to_string();
    let seen = c
        .seen
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .max()
        .unwrap_or(0);
    for _ in 0..200 {
        if store.last_seq(&chat_id).await.unwrap_or(0) >= seen {
            break;
        }
        actix::clock::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(store.last_seq(&chat_id).await.ok(), Some(seen));

    let second = harness_with_hooks(EngineConfig::default(), hooks(&store), default_plan_script);
    assert!(
        matches!(second.engine.take_over("no-such-chat", 1).await, Ok(None)),
        "an unknown chat is not taken"
    );
    let chat = match second.engine.take_over(&chat_id, 1).await {
        Ok(Some(chat)) => chat,
        other => panic!("not taken over: {:?}", other.map(|c| c.map(|h| h.identity))),
    };
    let snapshot = chat
        .addr
        .send(GetSnapshot)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        snapshot.last_seq, seen,
        "seq continues where the store stopped"
    );
    let mut again = subscribe(chat.clone(), seen).await;
    assert!(chat.addr.send(say("next")).await.is_ok());
    again.until("chat.run_start").await;
    // (`chat.session` and `chat.resume_boundary` are per connection, seq 0.)
    let seqs: Vec<u64> = again
        .seen
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|seq| *seq > 0)
        .collect();
    assert!(!seqs.is_empty());
    let expected: Vec<u64> = (seen + 1..=seen + seqs.len() as u64).collect();
    assert_eq!(
        seqs, expected,
        "no gap and no reused seq after the takeover"
    );
}

/// A node that lost a chat's lease stops the chat at once and writes nothing more; the node
/// that took it over answers the pending UI call under the same `corr`.
#[actix::test]
async fn a_relinquished_chat_stops_and_writes_nothing_more() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = store_at(dir.path()).await;
    let first = harness_with_hooks(EngineConfig::default(), hooks(&store), default_plan_script);
    let mut c = new_chat(&first).await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("next")).await.is_ok());
    let ui = loop {
        let call = c.until("chat.tool_call").await;
        if call["data"]["awaiting_response"] == true {
            break call;
        }
    };
    let corr = ui["data"]["corr"].as_str().unwrap_or_default().to_owned();
    let chat_id = c.chat.identity.chat_id.to_string();
    let seen = c
        .seen
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .max()
        .unwrap_or(0);
    for _ in 0..200 {
        if store.last_seq(&chat_id).await.unwrap_or(0) >= seen
            && !store
                .pending_ui(&chat_id)
                .await
                .unwrap_or_default()
                .is_empty()
        {
            break;
        }
        actix::clock::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(store.last_seq(&chat_id).await.ok(), Some(seen));

    assert!(c.chat.addr.send(Relinquish).await.is_ok());
    let answer = ToolAnswer {
        corr: corr.clone(),
        response: json!({"status": "success", "data": {}}),
    };
    assert!(
        c.chat.addr.send(answer).await.is_err(),
        "the relinquished session is stopped"
    );
    assert_eq!(
        store.last_seq(&chat_id).await.ok(),
        Some(seen),
        "nothing was written after relinquishing"
    );

    let second = harness_with_hooks(EngineConfig::default(), hooks(&store), default_plan_script);
    let chat = match second.engine.take_over(&chat_id, 1).await {
        Ok(Some(chat)) => chat,
        _ => panic!("not taken over"),
    };
    let mut again = subscribe(chat.clone(), seen).await;
    let response = json!({"status": "success", "data": {}});
    assert_eq!(
        chat.addr.send(ToolAnswer { corr, response }).await.ok(),
        Some(Ok(())),
        "the new owner answers the same corr"
    );
    let done = again.until("chat.tool_response").await;
    assert_eq!(done["seq"], seen + 1);
}

/// An `echo` that answers "a" at once and never answers "b"; counts the calls it started.
struct HalfHanging(Arc<AtomicUsize>);

impl tessera_tools::Tool for HalfHanging {
    fn invoke(
        &self,
        args: Map<String, serde_json::Value>,
        _ctx: tessera_tools::ToolContext,
    ) -> futures::future::BoxFuture<'static, Result<serde_json::Value, tessera_tools::ToolError>>
    {
        self.0.fetch_add(1, Ordering::SeqCst);
        let message = args.get("message").cloned().unwrap_or_default();
        Box::pin(async move {
            if message == "b" {
                futures::future::pending::<()>().await;
            }
            Ok(json!({"status": "success", "echoed": message}))
        })
    }
}

/// Asks for echo "a" and "b" in one message; then repeats the results it was fed.
fn batch_script(req: &tessera_llm::ChatRequest) -> Reply {
    if after_tool(req) {
        let fed: Vec<String> = req
            .messages
            .iter()
            .filter(|m| m.role == tessera_llm::Role::Tool)
            .map(|m| m.content_str().to_owned())
            .collect();
        return Reply::Text(fed.join("\n"));
    }
    Reply::Tools(vec![
        ("echo", json!({"message": "a"})),
        ("echo", json!({"message": "b"})),
    ])
}

#[actix::test]
async fn a_crash_mid_batch_reuses_the_finished_call_and_reports_the_started_one() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = store_at(dir.path()).await;
    let first_runs = Arc::new(AtomicUsize::new(0));
    let first = harness_custom(
        EngineConfig::default(),
        hooks(&store),
        Some(Arc::new(HalfHanging(first_runs.clone()))),
        |_| {},
        batch_script,
    );
    let mut c = new_chat(&first).await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("go")).await.is_ok());
    let chat_id = c.chat.identity.chat_id.to_string();
    let key_a = format!("turn_{chat_id}_HelperAgent_1:s1:0");
    let key_b = format!("turn_{chat_id}_HelperAgent_1:s1:1");
    // Both calls claimed and announced, "a" answered (probing the store before a call is
    // claimed would claim it for the test).
    while c.of("chat.tool_call").len() < 2 {
        c.until("chat.tool_call").await;
    }
    if c.of("chat.tool_response").is_empty() {
        c.until("chat.tool_response").await;
    }
    // Wait until "a" is durably completed, and the turn stored as far as clients saw it (its
    // response: events are stored behind, write-behind), while "b" is still running: the
    // moment of the crash.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let a = store.claim_tool(&chat_id, &key_a, None).await.ok();
        let stored = store
            .events_after(&chat_id, 0, 1_000)
            .await
            .unwrap_or_default();
        let response_stored = stored
            .iter()
            .any(|event| &*event.event_type == "chat.tool_response");
        if matches!(a, Some(ToolClaim::AlreadyCompleted(_))) && response_stored {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a never completed: {a:?}"
        );
        actix::clock::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        store.claim_tool(&chat_id, &key_b, None).await.ok(),
        Some(ToolClaim::AlreadyStarted)
    );
    assert_eq!(
        first_runs.load(Ordering::SeqCst),
        2,
        "both calls had started"
    );

    // "Restart": a second engine on the same database re-runs the interrupted turn.
    let second = harness_with_hooks(EngineConfig::default(), hooks(&store), batch_script);
    let restored = second.engine.rehydrate().await.unwrap_or_default();
    let chat = restored
        .into_iter()
        .find(|h| *h.identity.chat_id == *chat_id)
        .unwrap_or_else(|| panic!("chat not rehydrated"));
    let mut again = subscribe(chat, 0).await;
    let answer = again.until_match_agent("HelperAgent").await;
    let content = answer["data"]["content"].as_str().unwrap_or_default();
    let fed: Vec<&str> = content.lines().collect();
    assert_eq!(fed.len(), 2, "{content}");
    let reused: serde_json::Value = serde_json::from_str(fed[0]).unwrap_or_default();
    assert_eq!(
        reused,
        json!({"status": "success", "echoed": "a"}),
        "a is not run again: its recorded result is reused: {content}"
    );
    assert!(
        fed[1].contains("interrupted"),
        "b is reported interrupted: {content}"
    );
    assert_eq!(
        second.echo_runs.load(Ordering::SeqCst),
        0,
        "the restarted engine ran neither call"
    );
}

/// A fenced chat (a cluster's: it has a lease epoch) with an engine over `store`.
async fn fenced_chat(h: &Harness) -> Client {
    let chat = h
        .engine
        .start_fenced_chat(
            NewChat {
                tenant: "t".into(),
                user: "u".into(),
                workflow: "EngineTest".into(),
                context: Map::new(),
                chat_id: None,
            },
            Some(1),
        )
        .await;
    match chat {
        Ok(chat) => subscribe(chat, 0).await,
        Err(e) => panic!("{e}"),
    }
}

/// The seqs the store holds for `chat_id`.
async fn stored_seqs(store: &FlakyStore, chat_id: &str) -> Vec<u64> {
    store
        .inner
        .events_after(chat_id, 0, u32::MAX)
        .await
        .unwrap_or_default()
        .iter()
        .map(|e| e.seq)
        .collect()
}

/// In a cluster a client only ever sees what the store holds: events are delivered once
/// durable (flushes that fail are retried first), and input and UI answers are acknowledged
/// once the events they caused are durable. (SQLite checks no epoch; the session's behaviour
/// is the same on either store.)
#[actix::test]
async fn a_fenced_chat_shows_and_acknowledges_only_durable_events() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (store, hooks) = flaky_store(dir.path(), 0, ClaimMode::Pass).await;
    let h = harness_with_hooks(EngineConfig::default(), hooks, default_plan_script);
    let mut c = fenced_chat(&h).await;
    let chat_id = c.chat.identity.chat_id.to_string();
    c.until("chat.input_request").await;

    // The flushes of the input's events fail three times first.
    store.failures.store(3, Ordering::SeqCst);
    assert_eq!(
        c.chat.addr.send(say("next")).await.ok(),
        Some(Ok(())),
        "input accepted"
    );
    assert_eq!(
        store.failures.load(Ordering::SeqCst),
        0,
        "the ack came after the failed flushes"
    );
    let user_text = stored_seqs(&store, &chat_id).await.len();
    assert!(user_text >= 2, "the user's message is stored when acked");

    let ui = loop {
        let call = c.until("chat.tool_call").await;
        if call["data"]["awaiting_response"] == true {
            break call;
        }
    };
    let corr = ui["data"]["corr"].as_str().unwrap_or_default().to_owned();
    let pending = store.inner.pending_ui(&chat_id).await.unwrap_or_default();
    assert_eq!(
        pending.first().map(|p| p.corr.as_str()),
        Some(corr.as_str()),
        "a UI call is shown once its pending record is stored"
    );
    store.failures.store(2, Ordering::SeqCst);
    let answer = ToolAnswer {
        corr,
        response: json!({"status": "success", "data": {}}),
    };
    assert_eq!(c.chat.addr.send(answer).await.ok(), Some(Ok(())));
    let stored = store
        .inner
        .events_after(&chat_id, 0, u32::MAX)
        .await
        .unwrap_or_default();
    assert!(
        stored.iter().any(|e| e.event_type == "chat.tool_response"),
        "the answer's tool response is stored when the answer is acked"
    );
    c.until("chat.run_complete").await;

    // Everything the client got was in the store by then, under the same seq, and the store
    // holds no event the client did not get (the chat is over).
    let seen: Vec<(u64, serde_json::Value)> = c
        .seen
        .iter()
        .filter_map(|e| e["seq"].as_u64().filter(|s| *s > 0).map(|s| (s, e.clone())))
        .collect();
    let stored = store
        .inner
        .events_after(&chat_id, 0, u32::MAX)
        .await
        .unwrap_or_default();
    assert_eq!(seen.len(), stored.len());
    for ((seq, event), stored) in seen.iter().zip(&stored) {
        assert_eq!(*seq, stored.seq);
        let stored: serde_json::Value = serde_json::from_str(&stored.json).unwrap_or_default();
        assert_eq!(event, &stored, "seq {seq}");
    }
}

/// Drives a chat of `h` to its planner's structured output, whose auto tool's claim hangs (see
/// [`ClaimMode`]); returns the chat id once the store holds the output and the chat's state
/// says it waits on the tool: the moment the process "dies".
async fn stop_before_the_ui_call(h: &Harness, store: &FlakyStore) -> String {
    let mut c = new_chat(h).await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("next")).await.is_ok());
    c.until("chat.structured_output_ready").await;
    let chat_id = c.chat.identity.chat_id.to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let state = store.inner.load_chat(&chat_id).await.ok().flatten();
        let events = stored_seqs(store, &chat_id).await;
        let seen = c.seen.iter().filter_map(|e| e["seq"].as_u64()).max();
        if state.is_some_and(|s| s.state.status == "awaiting_tool")
            && Some(events.len() as u64) == seen
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never stored");
        actix::clock::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        c.of("chat.tool_call").is_empty(),
        "the UI call was never announced"
    );
    assert!(
        store
            .inner
            .pending_ui(&chat_id)
            .await
            .unwrap_or_default()
            .is_empty()
    );
    chat_id
}

/// A "restart" over the same store (claims pass now): the new engine and the chat rebuilt,
/// subscribed.
async fn restart_with(store: &Arc<FlakyStore>, chat_id: &str) -> (Harness, Client) {
    store.claims.store(ClaimMode::Pass as u8, Ordering::SeqCst);
    let hooks = EngineHooks {
        store: Some(store.clone() as Arc<dyn ChatStore>),
        ..EngineHooks::default()
    };
    // Read before the restart: the restored chat writes on its own at once.
    let seen = stored_seqs(store, chat_id).await.len() as u64;
    let second = harness_with_hooks(EngineConfig::default(), hooks, default_plan_script);
    let restored = second.engine.rehydrate().await.unwrap_or_default();
    let chat = restored
        .into_iter()
        .find(|h| *h.identity.chat_id == *chat_id)
        .unwrap_or_else(|| panic!("chat not rehydrated"));
    let client = subscribe(chat, seen).await;
    (second, client)
}

/// A process stopped after an auto tool's structured output but before its claim: the
/// restored chat invokes the tool again (nothing had started), and the UI call is announced
/// and answered once.
#[actix::test]
async fn an_auto_tool_stopped_before_its_claim_runs_after_the_restart() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (store, hooks) = flaky_store(dir.path(), 0, ClaimMode::HangUnclaimed).await;
    let first = harness_with_hooks(EngineConfig::default(), hooks, default_plan_script);
    let chat_id = stop_before_the_ui_call(&first, &store).await;

    let (_second, mut again) = restart_with(&store, &chat_id).await;
    let ui = loop {
        let call = again.until("chat.tool_call").await;
        if call["data"]["awaiting_response"] == true {
            break call;
        }
    };
    let corr = ui["data"]["corr"].as_str().unwrap_or_default().to_owned();
    let answer = ToolAnswer {
        corr: corr.clone(),
        response: json!({"status": "success", "data": {}}),
    };
    assert_eq!(again.chat.addr.send(answer).await.ok(), Some(Ok(())));
    let done = again.until("chat.tool_response").await;
    assert_eq!(done["data"]["success"], true);
    again.until("chat.run_complete").await;
    assert_eq!(again.of("chat.tool_response").len(), 1, "answered once");
    assert!(again.of("chat.error").is_empty(), "{:?}", again.types());
}

/// A process stopped after an auto tool's claim but before its UI call reached the store: the
/// restored chat reports the tool interrupted and never runs it again.
#[actix::test]
async fn an_auto_tool_stopped_after_its_claim_is_reported_interrupted() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (store, hooks) = flaky_store(dir.path(), 0, ClaimMode::HangClaimed).await;
    let first = harness_with_hooks(EngineConfig::default(), hooks, default_plan_script);
    let chat_id = stop_before_the_ui_call(&first, &store).await;
    let turn_key = format!("turn_{chat_id}_PlannerAgent_2");
    // The claim reached the store (asked through the inner store: it is there already).
    assert_eq!(
        store.inner.claim_tool(&chat_id, &turn_key, None).await.ok(),
        Some(ToolClaim::AlreadyStarted)
    );

    let (_second, mut again) = restart_with(&store, &chat_id).await;
    let error = again.until("chat.error").await;
    assert!(
        error["data"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not re-run")),
        "{error}"
    );
    again.until("chat.input_request").await;
    assert!(
        again.of("chat.tool_call").is_empty(),
        "the UI call is not announced"
    );
}

/// In a cluster, events the store refused for good are never shown: the chat leaves the node
/// (to be rebuilt from the store) instead of going on with a log the store does not have.
#[actix::test]
async fn a_fenced_chat_whose_write_is_refused_for_good_shows_nothing_more_and_stops() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (store, hooks) = flaky_store(dir.path(), 0, ClaimMode::Pass).await;
    let h = harness_with_hooks(EngineConfig::default(), hooks, default_plan_script);
    let mut c = fenced_chat(&h).await;
    c.until("chat.input_request").await;
    // Logged events only (seq > 0; `chat.session` and `chat.resume_boundary` are per
    // connection).
    let logged = |c: &Client| {
        c.seen
            .iter()
            .filter(|e| e["seq"].as_u64().unwrap_or(0) > 0)
            .count()
    };
    let shown = logged(&c);
    store.refuse.store(true, Ordering::SeqCst);
    // (The timeout only stops a broken engine from hanging the test.)
    let input = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        c.chat.addr.send(say("next")),
    )
    .await;
    assert!(
        matches!(input, Ok(Ok(Err(_)) | Err(_))) && input.is_ok(),
        "input whose events were refused is not acked: {input:?}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while c.chat.addr.connected() {
        assert!(
            std::time::Instant::now() < deadline,
            "the chat did not stop"
        );
        actix::clock::sleep(std::time::Duration::from_millis(10)).await;
    }
    while let Ok(event) = c.rx.try_recv() {
        c.seen.push(event);
    }
    assert_eq!(logged(&c), shown, "nothing more was shown: {:?}", c.types());
}
