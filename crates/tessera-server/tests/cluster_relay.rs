//! Routing between nodes with a real engine and a real NATS server: another node (here a
//! second NATS connection) sees the owned chat's live events in seq order and drives the chat
//! with forwarded commands, answered as the owner's own socket would answer them.

use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tessera_cluster::{ChatCommand, ClusterBus, ClusterMetrics, CommandReply};
use tessera_engine::{Engine, EngineConfig, EngineHooks, NewChat};
use tessera_llm::ChatModel;
use tessera_llm::scripted::ScriptedModel;
use tessera_server::cluster::ChatRelay;
use tessera_store::{ChatStore, SqliteStore};
use tessera_tools::{ArtifactStore, BuiltinRegistry, ToolServices};

async fn bus(url: &str, node: &str, prefix: &str) -> ClusterBus {
    bus_counted(url, node, prefix, Arc::new(ClusterMetrics::default())).await
}

/// The buses of a chat's owner and of a reader on another node, under a prefix of their own.
async fn owner_and_reader(url: &str) -> (ClusterBus, ClusterBus) {
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    (
        bus(url, "owner", &prefix).await,
        bus(url, "reader", &prefix).await,
    )
}

/// A bus that counts into `metrics`.
async fn bus_counted(
    url: &str,
    node: &str,
    prefix: &str,
    metrics: Arc<ClusterMetrics>,
) -> ClusterBus {
    ClusterBus::connect(url, node, prefix, Duration::from_secs(5), metrics)
        .await
        .unwrap_or_else(|e| panic!("NATS: {e}"))
}

/// An engine serving the TodoAssistant demo, with `store` for its tools and (when `durable`)
/// as its chat store.
fn todo_engine(store: &Arc<SqliteStore>, durable: bool) -> Engine {
    todo_engine_with(store, durable, EngineConfig::default())
}

/// [`todo_engine`] with `config`.
fn todo_engine_with(store: &Arc<SqliteStore>, durable: bool, config: EngineConfig) -> Engine {
    let workflows_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workflows");
    let workflow = tessera_manifest::load_workflows(&workflows_dir)
        .into_iter()
        .find(|(name, _)| name == "TodoAssistant")
        .and_then(|(_, w)| w.ok())
        .unwrap_or_else(|| panic!("TodoAssistant loads"));
    let model: Arc<dyn ChatModel> = Arc::new(
        ScriptedModel::from_file(&workflow.dir.join("demo.json")).unwrap_or_else(|e| panic!("{e}")),
    );
    let artifacts: Arc<dyn ArtifactStore> = store.clone();
    let builtins = BuiltinRegistry::with_defaults(ToolServices {
        tasks: store.clone(),
        artifacts,
    });
    Engine::start(
        vec![(workflow, model)],
        &builtins,
        config,
        EngineHooks {
            store: durable.then(|| store.clone() as Arc<dyn tessera_store::ChatStore>),
            ..EngineHooks::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A SQLite store in `dir`, an engine on it and one new TodoAssistant chat; a durable one is
/// started as a cluster node starts the chats it owns, under a lease epoch (so it shows an
/// event once it is stored).
async fn todo_chat(
    dir: &std::path::Path,
    durable: bool,
) -> (Engine, tessera_engine::ChatHandle, Arc<SqliteStore>) {
    todo_chat_with(dir, durable, EngineConfig::default()).await
}

/// [`todo_chat`] on an engine with `config`.
async fn todo_chat_with(
    dir: &std::path::Path,
    durable: bool,
    config: EngineConfig,
) -> (Engine, tessera_engine::ChatHandle, Arc<SqliteStore>) {
    let store = Arc::new(
        SqliteStore::open(&dir.join("t.db"))
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let engine = todo_engine_with(&store, durable, config);
    let new = NewChat {
        tenant: "t".into(),
        user: "u".into(),
        workflow: "TodoAssistant".into(),
        context: Map::new(),
        chat_id: None,
    };
    let chat = engine
        .start_fenced_chat(new, durable.then_some(1))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (engine, chat, store)
}

#[actix::test]
async fn another_node_sees_live_events_in_order_and_drives_the_chat() {
    let Some(url) = tessera_cluster::testing::test_nats_url("another_node_sees_live_events") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_engine, chat, _store) = todo_chat(data.path(), false).await;
    let chat_id = chat.identity.chat_id.to_string();

    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let owner = bus(&url, "owner", &prefix).await;
    let other = bus(&url, "other", &prefix).await;
    let mut events = other
        .subscribe_events(&chat_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .flat_map(futures::stream::iter);
    let arbiter = chat.arbiter.clone();
    let relayed = chat.clone();
    let _relay = ChatRelay::start_in_arbiter(&arbiter, move |_| ChatRelay::new(relayed, owner));

    // The relay serves commands once it is subscribed; until then the chat has no responder.
    // It publishes live events only for a reader that follows the chat; the follow's answer
    // says the last seq the chat has shown (its first events, from its creation).
    let followed = command_once_served(&other, &chat_id, &ChatCommand::Follow).await;
    let shown = match &followed {
        CommandReply::Answered { body } => body["last_seq"].as_u64(),
        _ => None,
    };
    let shown = shown.unwrap_or_else(|| panic!("no last seq in {followed:?}"));
    let input = ChatCommand::Input {
        content: "Buy milk".into(),
        client_msg_id: Some("m1".into()),
    };
    assert_eq!(
        other
            .send_command(&chat_id, &input)
            .await
            .unwrap_or_else(|e| panic!("{e}")),
        CommandReply::Accepted
    );

    let mut seqs = Vec::new();
    let mut types = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .unwrap_or_else(|_| panic!("the turn did not end; saw {types:?}"))
            .unwrap_or_else(|| panic!("stream ended"));
        let body: Value = serde_json::from_slice(&event.envelope).unwrap_or_default();
        assert_eq!(
            body["seq"],
            json!(event.seq),
            "the relayed seq is the event's own"
        );
        seqs.push(event.seq);
        let kind = body["type"].as_str().unwrap_or_default().to_owned();
        types.push(kind.clone());
        // The turn is over when the chat asks the user again.
        if kind == "chat.input_request" && types.iter().any(|t| t == "chat.run_start") {
            break;
        }
    }
    assert_eq!(
        seqs,
        (shown + 1..=shown + seqs.len() as u64).collect::<Vec<_>>(),
        "contiguous from the last seq shown, no duplicate"
    );
    assert!(types.iter().any(|t| t == "chat.tool_call"), "{types:?}");

    let bogus = ChatCommand::ToolAnswer {
        corr: "no-such-corr".into(),
        response: json!({"status": "success"}),
    };
    match other.send_command(&chat_id, &bogus).await {
        Ok(CommandReply::Refused { code, .. }) => assert_eq!(code, "unknown_correlation"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Sends `command` once a node serves the chat (a relay serves commands once it has
/// subscribed; until then the chat has no responder), and its answer.
async fn command_once_served(
    bus: &ClusterBus,
    chat_id: &str,
    command: &ChatCommand,
) -> CommandReply {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match bus.send_command(chat_id, command).await {
            Err(tessera_cluster::ClusterError::NoOwner(_))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other.unwrap_or_else(|e| panic!("{e}")),
        }
    }
}

/// Runs one TodoAssistant turn through `bus` (forwarded input) and waits until `local`, a
/// subscriber of the session on the owner, has seen it end: the chat's `turn`-th input
/// request after the greeting's. Answers the turn's last seq.
async fn run_turn(
    bus: &ClusterBus,
    chat_id: &str,
    local: &actix::Addr<Collector>,
    turn: usize,
) -> u64 {
    let say = ChatCommand::Input {
        content: format!("Buy item {turn}"),
        client_msg_id: None,
    };
    assert_eq!(
        command_once_served(bus, chat_id, &say).await,
        CommandReply::Accepted
    );
    let seen = collected_once(local, "the turn did not end", |seen| {
        seen.iter()
            .filter(|e| e["type"] == "chat.input_request")
            .count()
            > turn
    })
    .await;
    logged_seqs(&seen).last().copied().unwrap_or(0)
}

/// The last seq `local` has seen.
async fn last_seen(local: &actix::Addr<Collector>) -> u64 {
    logged_seqs(&local.send(Collected).await.unwrap_or_default())
        .last()
        .copied()
        .unwrap_or(0)
}

/// A subscriber of `chat`'s session on its own node, from its first event.
async fn local_subscriber(chat: &tessera_engine::ChatHandle) -> actix::Addr<Collector> {
    let collector = Collector::default().start();
    chat.addr
        .send(tessera_engine::session::Subscribe {
            recipient: collector.clone().recipient(),
            after_seq: 0,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    collector
}

/// The seqs of the live events `events` brings through `last` (the test fails after 10 s).
async fn live_seqs_through(
    events: &mut (impl futures::Stream<Item = tessera_cluster::LiveEvent> + Unpin),
    last: u64,
) -> Vec<u64> {
    let mut seqs = Vec::new();
    while seqs.last().is_none_or(|s| *s < last) {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .unwrap_or_else(|_| panic!("no live event after {seqs:?}; waiting for {last}"))
            .unwrap_or_else(|| panic!("stream ended"));
        seqs.push(event.seq);
    }
    seqs
}

/// A chat on its owner's node, and another node following its live subject: what the follow
/// tests share. No relay serves the chat yet ([`Following::relay`]).
struct Following {
    _data: tempfile::TempDir,
    _engine: Engine,
    chat: tessera_engine::ChatHandle,
    chat_id: String,
    store: Arc<SqliteStore>,
    owner: ClusterBus,
    /// The other node's bus; it counts into `reader_metrics`.
    reader: ClusterBus,
    reader_metrics: Arc<ClusterMetrics>,
    /// The chat's live subject, as the other node receives it.
    live: futures::stream::BoxStream<'static, tessera_cluster::LiveEvent>,
    /// A subscriber of the session on the owner, which sees every event at once.
    local: actix::Addr<Collector>,
}

impl Following {
    /// `None` when NATS is not configured (the test is skipped).
    async fn start(test: &str, durable: bool) -> Option<Following> {
        let url = tessera_cluster::testing::test_nats_url(test)?;
        let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (engine, chat, store) = todo_chat(data.path(), durable).await;
        let chat_id = chat.identity.chat_id.to_string();
        let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
        let owner = bus(&url, "owner", &prefix).await;
        let reader_metrics = Arc::new(ClusterMetrics::default());
        let reader = bus_counted(&url, "reader", &prefix, reader_metrics.clone()).await;
        let live = reader
            .subscribe_events(&chat_id)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .flat_map(futures::stream::iter)
            .boxed();
        let local = local_subscriber(&chat).await;
        // A durable chat shows its first events once they are stored. A reader that follows
        // before then is rightly sent them live, ahead of the turns the tests publish.
        let logged = chat
            .addr
            .send(tessera_engine::session::GetSnapshot)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .logged_seq;
        collected_once(&local, "the chat's first events were not shown", |seen| {
            logged_seqs(seen).last().copied().unwrap_or(0) >= logged
        })
        .await;
        Some(Following {
            _data: data,
            _engine: engine,
            chat,
            chat_id,
            store,
            owner,
            reader,
            reader_metrics,
            live,
            local,
        })
    }

    /// Starts the chat's relay, whose follows last `ttl`.
    fn relay(&self, ttl: Duration) -> actix::Addr<ChatRelay> {
        let (relayed, owner) = (self.chat.clone(), self.owner.clone());
        ChatRelay::start_in_arbiter(&self.chat.arbiter.clone(), move |_| {
            ChatRelay::new(relayed, owner).follow_ttl(ttl)
        })
    }

    /// A feed of the chat on the reader's node from its first event, checking with the owner
    /// (and renewing its follow) every `every`, and what it delivers.
    fn feed(
        &self,
        every: Duration,
    ) -> (
        actix::Addr<tessera_server::cluster::RemoteFeed>,
        actix::Addr<Collector>,
    ) {
        let fed = Collector::default().start();
        let store: Arc<dyn tessera_store::ChatStore> = self.store.clone();
        let feed = tessera_server::cluster::RemoteFeed::new(
            self.chat_id.clone(),
            0,
            store,
            self.reader.clone(),
            fed.clone().recipient(),
        )
        .checks_between(every, every)
        .start();
        (feed, fed)
    }

    /// Runs the chat's `turn`-th turn through the reader's node; its last seq.
    async fn run_turn(&self, turn: usize) -> u64 {
        run_turn(&self.reader, &self.chat_id, &self.local, turn).await
    }

    /// The seqs published on the live subject through `last`.
    async fn live_through(&mut self, last: u64) -> Vec<u64> {
        live_seqs_through(&mut self.live, last).await
    }

    /// Asserts that the next events published are exactly those after `after` through
    /// `last` (one publisher's messages arrive in order, so anything published before them
    /// and not yet read would come first).
    async fn assert_published_next(&mut self, after: u64, last: u64, what: &str) {
        assert_eq!(
            self.live_through(last).await,
            (after + 1..=last).collect::<Vec<_>>(),
            "{what}"
        );
    }

    /// Sends `command` through the reader's node once the chat is served; the answer.
    async fn command(&self, command: &ChatCommand) -> CommandReply {
        command_once_served(&self.reader, &self.chat_id, command).await
    }
}

#[actix::test]
async fn a_relay_publishes_live_events_only_while_a_reader_on_another_node_follows() {
    let Some(mut f) = Following::start("a_relay_publishes_only_followed", false).await else {
        return;
    };
    let ttl = Duration::from_millis(500);
    let _relay = f.relay(ttl);

    // Nobody follows: the first turn is not published.
    let first = f.run_turn(1).await;
    // A follow is answered with the last seq shown (a reader's check that it has it).
    assert_eq!(
        f.command(&ChatCommand::Follow).await,
        CommandReply::Answered {
            body: json!({"last_seq": first})
        }
    );
    let second = f.run_turn(2).await;
    // One publisher's messages arrive in order, so the first turn's would come first.
    f.assert_published_next(
        first,
        second,
        "followed: the second turn, whole; not the first",
    )
    .await;

    // The follow lapses with no renewal: the third turn is not published.
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let third = f.run_turn(3).await;
    let replay = ChatCommand::Replay {
        after_seq: third,
        with_session: false,
    };
    assert!(matches!(
        f.command(&replay).await,
        CommandReply::Answered { .. }
    ));
    let fourth = f.run_turn(4).await;
    f.assert_published_next(
        third,
        fourth,
        "a replay follows too: the fourth turn, whole; not the third",
    )
    .await;
}

#[actix::test]
async fn a_reader_s_feed_keeps_the_chat_followed_until_it_stops() {
    let Some(mut f) = Following::start("a_reader_s_feed_keeps_following", true).await else {
        return;
    };
    // Checks every 100 ms keep a 1 s follow alive through a stall of up to 900 ms (with a
    // 400 ms follow this failed once, in a local run).
    let ttl = Duration::from_millis(1000);
    let _relay = f.relay(ttl);
    // Serving (a Snapshot does not follow).
    assert!(matches!(
        f.command(&ChatCommand::Snapshot).await,
        CommandReply::Answered { .. }
    ));

    let (feed, fed) = f.feed(ttl / 10);
    collected_once(&fed, "the feed's replay did not end", |seen| {
        seen.iter().any(|e| e["type"] == "chat.resume_boundary")
    })
    .await;
    // Long past the follow its replay started: only its checks keep the chat followed.
    tokio::time::sleep(ttl * 3).await;
    let before = last_seen(&f.local).await;
    let first = f.run_turn(1).await;
    f.assert_published_next(before, first, "the turn is published whole")
        .await;

    // The feed stops (its socket closed): the follow lapses.
    feed.send(tessera_server::cluster::StopFeed)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(ttl * 2).await;
    let first = last_seen(&f.local).await;
    let second = f.run_turn(2).await;
    assert!(matches!(
        f.command(&ChatCommand::Follow).await,
        CommandReply::Answered { .. }
    ));
    f.run_turn(3).await;
    // Up to the third turn's first event only: nothing renews this follow, and a turn slower
    // than its TTL would lapse it midway.
    let seqs = f.live_through(second + 1).await;
    assert_eq!(
        seqs.last(),
        Some(&(second + 1)),
        "a follow again: the third turn is published from its start"
    );
    assert!(
        seqs.iter().all(|s| *s <= first || *s > second),
        "nothing of the turn run after the feed stopped: {seqs:?} (it ran {first}..={second})"
    );
}

#[actix::test]
async fn a_feed_that_starts_before_the_owner_serves_the_chat_follows_it_once_it_does() {
    use std::sync::atomic::Ordering;
    let Some(mut f) = Following::start("a_feed_that_starts_before", true).await else {
        return;
    };
    // No relay yet: the feed's replay comes from the store and follows nothing. Its checks
    // are far off, so only asking again soon can make the owner publish.
    let (_feed, fed) = f.feed(Duration::from_secs(600));
    collected_once(
        &fed,
        "the feed's replay from the store did not end",
        |seen| seen.iter().any(|e| e["type"] == "chat.resume_boundary"),
    )
    .await;
    let _relay = f.relay(tessera_server::cluster::FOLLOW_TTL);
    assert!(matches!(
        f.command(&ChatCommand::Snapshot).await,
        CommandReply::Answered { .. }
    ));

    // The feed's next request (it sends none but follows while the chat is quiet) reaches a
    // relay that serves the chat, ahead of the input sent after it on the same connection.
    let forwarded = || f.reader_metrics.commands_forwarded.load(Ordering::Relaxed);
    let asked = forwarded();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while forwarded() == asked {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the feed did not ask to follow the chat again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = last_seen(&f.local).await;
    let first = f.run_turn(1).await;
    f.assert_published_next(before, first, "the first turn is published whole")
        .await;
}

#[actix::test]
async fn a_feed_that_missed_the_last_live_event_reads_it_when_the_owner_shows_it() {
    let Some(f) = Following::start("a_feed_that_missed_the_last", true).await else {
        return;
    };
    // Follows lapse long before the feed checks again: the turn below is not published.
    let ttl = Duration::from_millis(300);
    let _relay = f.relay(ttl);
    assert!(matches!(
        f.command(&ChatCommand::Snapshot).await,
        CommandReply::Answered { .. }
    ));
    let (_feed, fed) = f.feed(Duration::from_secs(2));
    collected_once(&fed, "the feed's replay did not end", |seen| {
        seen.iter().any(|e| e["type"] == "chat.resume_boundary")
    })
    .await;
    tokio::time::sleep(ttl * 2).await;
    let last = f.run_turn(1).await;
    // Its next check finds the owner past what it has, and the store has the turn.
    let seen = collected_once(&fed, "the feed never caught up", |seen| {
        logged_seqs(seen).last().is_some_and(|s| *s >= last)
    })
    .await;
    assert!(
        seen.iter()
            .any(|e| e["type"] == "chat.text" && e["data"]["content"] == "Buy item 1"),
        "{seen:?}"
    );
}

/// Collects what a feed delivers.
#[derive(Default)]
struct Collector(Vec<Value>);
impl actix::Actor for Collector {
    type Context = actix::Context<Self>;
}
impl actix::Handler<tessera_engine::session::Deliver> for Collector {
    type Result = ();
    fn handle(&mut self, msg: tessera_engine::session::Deliver, _: &mut Self::Context) {
        for text in &msg.0 {
            self.0.push(serde_json::from_str(text).unwrap_or_default());
        }
    }
}
#[derive(actix::Message)]
#[rtype(result = "Vec<Value>")]
struct Collected;

impl actix::Handler<Collected> for Collector {
    type Result = actix::MessageResult<Collected>;
    fn handle(&mut self, _: Collected, _: &mut Self::Context) -> Self::Result {
        actix::MessageResult(self.0.clone())
    }
}

/// What `collector` got, once `done` says it is all there (polled; the test fails after 10 s
/// with `what` and what came).
async fn collected_once(
    collector: &actix::Addr<Collector>,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = collector.send(Collected).await.unwrap_or_default();
        if done(&seen) {
            return seen;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The seqs of the logged events in `seen` (connection-scoped events have seq 0).
fn logged_seqs(seen: &[Value]) -> Vec<u64> {
    seen.iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|s| *s > 0)
        .collect()
}

#[actix::test]
async fn a_reader_on_another_node_gets_the_owner_s_replay_then_live_events_without_duplicate() {
    let Some(url) = tessera_cluster::testing::test_nats_url("a_reader_on_another_node") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_engine, chat, store) = todo_chat(data.path(), true).await;
    let chat_id = chat.identity.chat_id.to_string();
    let (owner, reader) = owner_and_reader(&url).await;
    let relayed = chat.clone();
    let _relay = ChatRelay::start_in_arbiter(&chat.arbiter.clone(), move |_| {
        ChatRelay::new(relayed, owner)
    });

    // A first turn before the reader arrives: only the store has it for the reader.
    let say = |text: &str| ChatCommand::Input {
        content: text.into(),
        client_msg_id: None,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match reader.send_command(&chat_id, &say("Buy milk")).await {
            Err(tessera_cluster::ClusterError::NoOwner(_))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => {
                assert_eq!(
                    other.unwrap_or_else(|e| panic!("{e}")),
                    CommandReply::Accepted
                );
                break;
            }
        }
    }

    let collector = Collector::default().start();
    let store_for_feed: Arc<dyn tessera_store::ChatStore> = store.clone();
    let _feed = tessera_server::cluster::RemoteFeed::new(
        chat_id.clone(),
        0,
        store_for_feed,
        reader.clone(),
        collector.clone().recipient(),
    )
    .start();
    // A second turn while the feed replays and follows.
    let second = loop {
        match reader.send_command(&chat_id, &say("Buy bread")).await {
            Ok(CommandReply::Refused { code, .. }) if code == "not_accepting_input" => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other.unwrap_or_else(|e| panic!("{e}")),
        }
    };
    assert_eq!(second, CommandReply::Accepted);

    // The greeting's request, then one per turn.
    let seen = collected_once(&collector, "the reader did not get both turns", |seen| {
        let input_requests = seen
            .iter()
            .filter(|e| e["type"] == "chat.input_request")
            .count();
        input_requests >= 3
            && seen.iter().any(|e| {
                e["type"] == "chat.text" && e["data"]["content"].to_string().contains("Buy bread")
            })
    })
    .await;
    // Logged events only: the replay's `chat.resume_boundary` is connection-scoped.
    let seqs = logged_seqs(&seen);
    let boundaries = seen
        .iter()
        .filter(|e| e["type"] == "chat.resume_boundary")
        .count();
    assert_eq!(boundaries, 1, "the replay ends with one resume boundary");
    assert_eq!(
        seen.first().map(|e| &e["type"]),
        Some(&Value::from("chat.session")),
        "the owner's chat.session opens the replay"
    );
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "every event once, in order: {seqs:?}"
    );
    // Every stored event, as stored; the others are streamed deltas (live only: the first
    // turn's, final before the reader came, are in no replay).
    let stored = store
        .events_after(&chat_id, 0, u32::MAX)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let last = seqs.last().copied().unwrap_or(0);
    let stored_seqs: Vec<u64> = stored
        .iter()
        .map(|e| e.seq)
        .filter(|s| *s <= last)
        .collect();
    assert_eq!(
        seqs.iter()
            .copied()
            .filter(|s| stored_seqs.contains(s))
            .collect::<Vec<_>>(),
        stored_seqs,
        "the reader got every stored event"
    );
    for event in seen.iter().filter(|e| e["seq"].as_u64().unwrap_or(0) > 0) {
        let seq = event["seq"].as_u64().unwrap_or(0);
        match stored.iter().find(|e| e.seq == seq) {
            Some(stored) => assert_eq!(
                serde_json::from_str::<Value>(&stored.json).ok().as_ref(),
                Some(event),
                "seq {seq} as stored"
            ),
            None => assert_eq!(event["type"], "chat.text_delta", "seq {seq} is not stored"),
        }
    }
}

#[actix::test]
async fn a_chat_taken_over_is_served_to_other_nodes_until_it_is_lost() {
    use tessera_cluster::{ClusterError, OwnershipChange};
    use tessera_server::cluster::{ClusterNode, FindOwned};
    let Some(url) = tessera_cluster::testing::test_nats_url("a_chat_taken_over_is_served") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // The dead node's engine created the chat; its greeting reached the store.
    let (_dead, chat, store) = todo_chat(data.path(), true).await;
    let chat_id = chat.identity.chat_id.to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tessera_store::ChatStore::events_after(&*store, &chat_id, 0, 10)
        .await
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "greeting never stored"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(chat);

    let engine = todo_engine(&store, true);
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let node = ClusterNode::new(engine, bus(&url, "survivor", &prefix).await).start();
    let client_node = bus(&url, "entry", &prefix).await;
    let mut live = client_node
        .subscribe_events(&chat_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .flat_map(futures::stream::iter);
    node.do_send(OwnershipChange::TakenOver {
        chat_id: chat_id.clone(),
        epoch: 2,
    });
    let say = ChatCommand::Input {
        content: "Buy milk".into(),
        client_msg_id: None,
    };
    loop {
        match client_node.send_command(&chat_id, &say).await {
            Err(ClusterError::NoOwner(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => {
                assert_eq!(
                    other.unwrap_or_else(|e| panic!("{e}")),
                    CommandReply::Accepted
                );
                break;
            }
        }
    }
    let owned = node.send(FindOwned(chat_id.clone())).await.unwrap_or(None);
    assert_eq!(owned.map(|(_, epoch)| epoch), Some(2));
    // Readers may follow a chat since its previous owner: a chat taken over is published
    // before any of them renews its follow with the new owner.
    let event = tokio::time::timeout(Duration::from_secs(10), live.next())
        .await
        .unwrap_or_else(|_| panic!("the turn of a chat taken over was not published"))
        .unwrap_or_else(|| panic!("stream ended"));
    let body: Value = serde_json::from_slice(&event.envelope).unwrap_or_default();
    assert_eq!(body["type"], "chat.text", "{body}");
    assert_eq!(body["data"]["content"], "Buy milk", "{body}");

    node.do_send(OwnershipChange::Lost {
        chat_id: chat_id.clone(),
        epoch: 2,
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match client_node
            .send_command(&chat_id, &ChatCommand::Cancel)
            .await
        {
            Err(ClusterError::NoOwner(_)) => break,
            other => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "still served after being lost: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert!(
        node.send(FindOwned(chat_id))
            .await
            .unwrap_or(None)
            .is_none()
    );
}

/// Waits (up to 10 s) until `chat`'s session has stopped; how long that took.
async fn stopped_within(chat: &tessera_engine::ChatHandle) -> Duration {
    let started = tokio::time::Instant::now();
    while chat.addr.connected() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the chat never left memory"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

#[actix::test]
async fn an_owned_chat_leaves_memory_when_idle_once_no_reader_follows_it() {
    let Some(url) = tessera_cluster::testing::test_nats_url("an_owned_chat_leaves_memory") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = EngineConfig {
        idle_evict: Some(Duration::from_millis(100)),
        ..EngineConfig::default()
    };
    let (engine, chat, store) = todo_chat_with(data.path(), true, config).await;
    let store: Arc<dyn ChatStore> = store;
    let chat_id = chat.identity.chat_id.to_string();
    let (owner, reader) = owner_and_reader(&url).await;
    let ttl = Duration::from_millis(800);
    let relayed = chat.clone();
    let _relay = ChatRelay::start_in_arbiter(&chat.arbiter.clone(), move |_| {
        ChatRelay::new(relayed, owner).follow_ttl(ttl)
    });

    // A follow subscribes the relay to the session, which keeps the chat in memory until the
    // follow lapses; then the relay lets go, and the idle chat leaves.
    let followed_at = tokio::time::Instant::now();
    assert!(matches!(
        command_once_served(&reader, &chat_id, &ChatCommand::Follow).await,
        CommandReply::Answered { .. }
    ));
    let stayed = followed_at.elapsed() + stopped_within(&chat).await;
    assert!(
        stayed >= ttl,
        "left memory {stayed:?} after the follow, within its {ttl:?}"
    );

    // A command that reaches the relay after its chat left memory is refused with the code
    // forwarders retry on (the chat is claimed again once its lease is parked).
    let input = ChatCommand::Input {
        content: "Buy milk".into(),
        client_msg_id: None,
    };
    match reader.send_command(&chat_id, &input).await {
        Ok(CommandReply::Refused { code, .. }) => assert_eq!(code, "chat_left_owner"),
        other => panic!("expected the left-owner refusal, got {other:?}"),
    }
    // A forwarding node retries it as "no responders" (offering to claim the chat each time)
    // until its patience runs out, rather than passing the refusal on to its client.
    let forwarding = tessera_server::cluster::ClusterNode::new(engine, reader.clone()).start();
    let remote = tessera_server::cluster::RemoteChat::new(
        Arc::from(chat_id.as_str()),
        reader,
        store,
        forwarding,
        Duration::from_millis(300),
    );
    assert_eq!(
        remote.send(input).await,
        Err(tessera_server::cluster::ForwardError::NoOwner)
    );
}

/// Stands for the owner's `ClusterNode`: records the hand-overs it is told of and parks them.
#[derive(Default)]
struct HandOvers(Vec<String>);
impl actix::Actor for HandOvers {
    type Context = actix::Context<Self>;
}
impl actix::Handler<tessera_server::cluster::HandedOver> for HandOvers {
    type Result = bool;
    fn handle(&mut self, msg: tessera_server::cluster::HandedOver, _: &mut Self::Context) -> bool {
        self.0.push(msg.chat_id);
        true
    }
}
#[derive(actix::Message)]
#[rtype(result = "Vec<String>")]
struct Told;
impl actix::Handler<Told> for HandOvers {
    type Result = actix::MessageResult<Told>;
    fn handle(&mut self, _: Told, _: &mut Self::Context) -> Self::Result {
        actix::MessageResult(self.0.clone())
    }
}

/// The refusal code of `reply`, or what it was instead.
fn refusal(reply: CommandReply) -> String {
    match reply {
        CommandReply::Refused { code, .. } => code,
        other => format!("not refused: {other:?}"),
    }
}

/// Subscribes to `chat` on its node until the chat asks its user; the subscription's id.
async fn watched_until_it_asks_its_user(chat: &tessera_engine::ChatHandle) -> u64 {
    let local = Collector::default().start();
    let subscription = chat
        .addr
        .send(tessera_engine::session::Subscribe {
            recipient: local.clone().recipient(),
            after_seq: 0,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    collected_once(&local, "the chat never asked its user", |seen| {
        seen.iter().any(|e| e["type"] == "chat.input_request")
    })
    .await;
    subscription
}

#[actix::test]
async fn a_relay_hands_its_chat_over_only_once_nobody_on_its_node_watches_it() {
    let Some(url) = tessera_cluster::testing::test_nats_url("a_relay_hands_its_chat_over") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_engine, chat, _store) = todo_chat(data.path(), true).await;
    let chat_id = chat.identity.chat_id.to_string();
    let (owner, reader) = owner_and_reader(&url).await;
    let node = HandOvers::default().start();
    let relayed = chat.clone();
    let told = node.clone().recipient();
    let _relay = ChatRelay::start_in_arbiter(&chat.arbiter.clone(), move |_| {
        ChatRelay::new(relayed, owner).handing_over_to(told)
    });
    let subscription = watched_until_it_asks_its_user(&chat).await;

    // A socket on this node watches the chat: it stays, and the node is told nothing.
    let asked = command_once_served(&reader, &chat_id, &ChatCommand::HandOver).await;
    assert_eq!(refusal(asked), "chat_stays");
    assert!(chat.addr.connected());
    assert!(node.send(Told).await.unwrap_or_default().is_empty());

    // Its socket gone, the chat waits only on its user: it leaves, and the node (which parks
    // the lease) is told before the forwarder is answered.
    chat.addr
        .send(tessera_engine::session::Unsubscribe(subscription))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        reader
            .send_command(&chat_id, &ChatCommand::HandOver)
            .await
            .unwrap_or_else(|e| panic!("{e}")),
        CommandReply::Accepted
    );
    assert_eq!(
        node.send(Told).await.unwrap_or_default(),
        vec![chat_id.clone()]
    );
    stopped_within(&chat).await;
}

/// A chat waiting on its user with nobody on its node watching, relayed with hand-overs to
/// a node that records them, and followed by the readers on the nodes `followers` names;
/// with its engine, the owner's and those nodes' buses (in that order) and the node.
async fn followed_from(
    url: &str,
    data: &std::path::Path,
    followers: &[&str],
) -> (
    Engine,
    tessera_engine::ChatHandle,
    Vec<ClusterBus>,
    actix::Addr<HandOvers>,
) {
    let (engine, chat, _store) = todo_chat(data, true).await;
    let chat_id = chat.identity.chat_id.to_string();
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let owner = bus(url, "owner", &prefix).await;
    let mut buses = vec![owner.clone()];
    for node in followers {
        buses.push(bus(url, node, &prefix).await);
    }
    let node = HandOvers::default().start();
    let (relayed, told) = (chat.clone(), node.clone().recipient());
    let _relay = ChatRelay::start_in_arbiter(&chat.arbiter.clone(), move |_| {
        ChatRelay::new(relayed, owner).handing_over_to(told)
    });
    let subscription = watched_until_it_asks_its_user(&chat).await;
    chat.addr
        .send(tessera_engine::session::Unsubscribe(subscription))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for follower in &buses[1..] {
        let followed = command_once_served(follower, &chat_id, &ChatCommand::Follow).await;
        assert!(
            matches!(followed, CommandReply::Answered { .. }),
            "{followed:?}"
        );
    }
    (engine, chat, buses, node)
}

#[actix::test]
async fn a_relay_hands_its_chat_over_to_the_only_node_that_follows_it() {
    let Some(url) = tessera_cluster::testing::test_nats_url("a_relay_hands_to_its_follower") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_engine, chat, buses, node) = followed_from(&url, data.path(), &["reader"]).await;
    let chat_id = chat.identity.chat_id.to_string();
    // The relay is subscribed for the reader's node; that node asks with its user's first
    // message, and the relay's own subscription does not keep the chat.
    assert_eq!(
        buses[1]
            .send_command(&chat_id, &ChatCommand::HandOver)
            .await
            .unwrap_or_else(|e| panic!("{e}")),
        CommandReply::Accepted
    );
    assert_eq!(node.send(Told).await.unwrap_or_default(), vec![chat_id]);
    stopped_within(&chat).await;
}

#[actix::test]
async fn a_relay_keeps_a_chat_that_a_third_node_follows() {
    let Some(url) = tessera_cluster::testing::test_nats_url("a_relay_keeps_a_chat_followed") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_engine, chat, buses, node) = followed_from(&url, data.path(), &["reader", "third"]).await;
    let chat_id = chat.identity.chat_id.to_string();
    // Moved to the reader's node, the chat would leave the third node's reader following a
    // node that no longer serves it until its next check.
    let asked = command_once_served(&buses[1], &chat_id, &ChatCommand::HandOver).await;
    assert_eq!(refusal(asked), "chat_stays");
    assert!(chat.addr.connected());
    assert!(node.send(Told).await.unwrap_or_default().is_empty());
}

#[actix::test]
async fn a_relay_that_cannot_tell_its_node_keeps_its_chat() {
    let Some(url) = tessera_cluster::testing::test_nats_url("a_relay_that_cannot_tell") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_engine, chat, _store) = todo_chat(data.path(), true).await;
    let chat_id = chat.identity.chat_id.to_string();
    let (owner, reader) = owner_and_reader(&url).await;
    let relayed = chat.clone();
    let _relay = ChatRelay::start_in_arbiter(&chat.arbiter.clone(), move |_| {
        ChatRelay::new(relayed, owner)
    });
    let subscription = watched_until_it_asks_its_user(&chat).await;
    chat.addr
        .send(tessera_engine::session::Unsubscribe(subscription))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Unwatched and waiting on its user, but with no node to park its lease the chat stays:
    // leaving would strand it until the lease expired.
    let asked = command_once_served(&reader, &chat_id, &ChatCommand::HandOver).await;
    assert_eq!(refusal(asked), "chat_stays");
    assert!(chat.addr.connected());
}

/// A lease store in which every chat is held by some other node: claims find it taken.
struct LeasesHeldElsewhere;
impl tessera_store::LeaseStore for LeasesHeldElsewhere {
    fn acquire_lease(
        &self,
        _: &str,
        _: &str,
        _: i64,
    ) -> tessera_store::StoreFuture<Option<tessera_store::Lease>> {
        Box::pin(async { Ok(None) })
    }
    fn renew_leases(
        &self,
        _: &str,
        _: &[(String, i64)],
        _: i64,
    ) -> tessera_store::StoreFuture<Vec<String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn release_lease(&self, _: &str, _: &str, _: i64) -> tessera_store::StoreFuture<()> {
        Box::pin(async { Ok(()) })
    }
    fn park_leases(&self, _: &str, _: &[(String, i64)]) -> tessera_store::StoreFuture<()> {
        Box::pin(async { Ok(()) })
    }
    fn orphaned_chats(&self, _: i64) -> tessera_store::StoreFuture<Vec<String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

#[actix::test]
async fn a_draining_node_asks_no_owner_to_hand_a_socket_s_chat_over() {
    use actix::AsyncContext;
    use tessera_server::cluster::{ClaimFromOwner, Claimed, ClusterNode, DrainNode, RemoteChat};
    let Some(url) = tessera_cluster::testing::test_nats_url("a_draining_node_asks_no_owner") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (engine, _chat, store) = todo_chat(data.path(), false).await;
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let metrics = Arc::new(ClusterMetrics::default());
    let asking = bus_counted(&url, "asking", &prefix, metrics.clone()).await;
    let node = ClusterNode::create({
        let (asking, metrics) = (asking.clone(), metrics.clone());
        move |ctx| {
            let leases = tessera_cluster::LeaseManager::new(
                Arc::new(LeasesHeldElsewhere),
                tessera_cluster::LeaseManagerConfig {
                    node_id: "asking".into(),
                    ttl: Duration::from_secs(10),
                    takeover_batch: 1,
                },
                ctx.address().recipient(),
                metrics,
            )
            .start();
            ClusterNode::new(engine, asking).with_leases(leases)
        }
    });
    // The chat's owner elsewhere hands it over whenever asked.
    let owner = bus(&url, "owner", &prefix).await;
    let mut commands = owner
        .serve_commands("c1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    actix::spawn(async move {
        while let Some(incoming) = commands.next().await {
            let _ = owner.reply(incoming, &CommandReply::Accepted).await;
        }
    });
    let store: Arc<dyn ChatStore> = store;
    let remote = RemoteChat::new(
        Arc::from("c1"),
        asking,
        store,
        node.clone(),
        Duration::from_secs(1),
    );
    let claim = |remote: &RemoteChat| node.send(ClaimFromOwner(remote.clone()));
    let forwarded = || {
        metrics
            .commands_forwarded
            .load(std::sync::atomic::Ordering::Relaxed)
    };

    // Serving, the node asks (and here cannot claim the lease, so the socket stays remote).
    assert!(matches!(claim(&remote).await, Ok(Ok(Claimed::Remote))));
    assert_eq!(forwarded(), 1, "the owner was asked");
    // Draining, it could not claim the chat: it asks nothing, which would leave it parked.
    node.send(DrainNode).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(claim(&remote).await, Ok(Ok(Claimed::Remote))));
    assert_eq!(forwarded(), 1, "a draining node asked the owner");
}

#[actix::test]
async fn a_hand_over_is_asked_again_until_a_chat_created_a_moment_ago_is_served() {
    use tessera_server::cluster::{ClusterNode, RemoteChat};
    let Some(url) = tessera_cluster::testing::test_nats_url("a_hand_over_is_asked_again") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (engine, _chat, store) = todo_chat(data.path(), false).await;
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let asking = bus(&url, "asking", &prefix).await;
    let owner = bus(&url, "owner", &prefix).await;
    // The owner's relay starts serving the chat's commands a while after the socket's node
    // first asks (which finds no responders then), and hands the chat over when asked.
    const RELAY_STARTS_AFTER: Duration = Duration::from_millis(300);
    actix::spawn(async move {
        actix_rt::time::sleep(RELAY_STARTS_AFTER).await;
        let mut commands = owner
            .serve_commands("c1")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        while let Some(incoming) = commands.next().await {
            let _ = owner.reply(incoming, &CommandReply::Accepted).await;
        }
    });
    let store: Arc<dyn ChatStore> = store;
    let node = ClusterNode::new(engine, asking.clone()).start();
    let remote = RemoteChat::new(Arc::from("c1"), asking, store, node, Duration::from_secs(1));
    assert!(
        remote.ask_owner_to_hand_over().await,
        "the hand-over was not asked again once the owner served the chat"
    );
}

/// A lease store that grants every acquire, logs its calls in order, and holds its first park
/// until the test opens `gate`.
struct GatedParks {
    calls: std::sync::Mutex<Vec<String>>,
    gate: std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}
impl GatedParks {
    fn log(&self, call: String) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(call);
        }
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }
}
impl tessera_store::LeaseStore for GatedParks {
    fn acquire_lease(
        &self,
        chat_id: &str,
        node: &str,
        _: i64,
    ) -> tessera_store::StoreFuture<Option<tessera_store::Lease>> {
        self.log(format!("acquire {chat_id}"));
        let lease = tessera_store::Lease {
            chat_id: chat_id.to_owned(),
            node: node.to_owned(),
            epoch: 1,
            expires_at_ms: i64::MAX,
            was_parked: false,
        };
        Box::pin(async move { Ok(Some(lease)) })
    }
    fn renew_leases(
        &self,
        _: &str,
        _: &[(String, i64)],
        _: i64,
    ) -> tessera_store::StoreFuture<Vec<String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn release_lease(&self, _: &str, _: &str, _: i64) -> tessera_store::StoreFuture<()> {
        Box::pin(async { Ok(()) })
    }
    fn park_leases(&self, _: &str, leases: &[(String, i64)]) -> tessera_store::StoreFuture<()> {
        let ids: Vec<&str> = leases.iter().map(|(id, _)| id.as_str()).collect();
        self.log(format!("park {}", ids.join(",")));
        let gate = self.gate.lock().ok().and_then(|mut g| g.take());
        Box::pin(async move {
            if let Some(gate) = gate {
                let _ = gate.await;
            }
            Ok(())
        })
    }
    fn orphaned_chats(&self, _: i64) -> tessera_store::StoreFuture<Vec<String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

#[actix::test]
async fn hand_overs_that_come_while_a_park_runs_are_parked_together_before_a_claim() {
    use tessera_cluster::{AcquireLease, LeaseManager, LeaseManagerConfig};
    use tessera_server::cluster::{ClaimChat, Claimed, ClusterNode, HandedOver};
    let Some(url) = tessera_cluster::testing::test_nats_url("hand_overs_parked_together") else {
        return;
    };
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (engine, chat, _store) = todo_chat(data.path(), false).await;
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let metrics = Arc::new(ClusterMetrics::default());
    let node_bus = bus_counted(&url, "node", &prefix, metrics.clone()).await;
    let (open, gate) = tokio::sync::oneshot::channel();
    let store = Arc::new(GatedParks {
        calls: std::sync::Mutex::new(Vec::new()),
        gate: std::sync::Mutex::new(Some(gate)),
    });
    let (leases_tx, leases_rx) = std::sync::mpsc::channel();
    let node = ClusterNode::create({
        let (store, metrics) = (store.clone(), metrics.clone());
        move |ctx| {
            let leases = LeaseManager::new(
                store,
                LeaseManagerConfig {
                    node_id: "node".into(),
                    ttl: Duration::from_secs(60),
                    takeover_batch: 1,
                },
                actix::AsyncContext::address(ctx).recipient(),
                metrics,
            )
            .start();
            let _ = leases_tx.send(leases.clone());
            ClusterNode::new(engine, node_bus).with_leases(leases)
        }
    });
    let leases = leases_rx.recv().unwrap_or_else(|e| panic!("{e}"));
    for id in ["a", "b", "c"] {
        let held = leases.send(AcquireLease { chat_id: id.into() }).await;
        assert!(matches!(held, Ok(Ok(Some(1)))), "{held:?}");
    }
    let handed_over = |id: &str| {
        node.send(HandedOver {
            chat_id: id.into(),
            session: chat.addr.clone(),
        })
    };
    // The first park runs (held at the gate); two more hand-overs and a claim of one of them
    // come meanwhile.
    let first = handed_over("a");
    while !store.calls().contains(&"park a".to_owned()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (second, third) = (handed_over("b"), handed_over("c"));
    let claim = node.send(ClaimChat("b".into()));
    // Both in the node's mailbox and handled before the gate opens.
    assert!(
        node.send(tessera_server::cluster::FindOwned("x".into()))
            .await
            .is_ok()
    );
    let _ = open.send(());
    assert_eq!(first.await.ok(), Some(true));
    assert_eq!(second.await.ok(), Some(true));
    assert_eq!(third.await.ok(), Some(true));
    // "b" is no chat of the store: once claimed, it is not open.
    assert!(matches!(claim.await, Ok(Ok(Claimed::NotOpen))));
    assert_eq!(
        store.calls()[3..],
        ["park a", "park b,c", "acquire b"].map(String::from),
        "one store call for the hand-overs that queued, and the claim after it"
    );
    assert_eq!(
        metrics
            .chats_handed_over
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}
