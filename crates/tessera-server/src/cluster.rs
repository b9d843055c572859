//! The owner's side of routing between nodes: a [`ChatRelay`] per owned chat publishes the
//! chat's live events on its NATS subject while sockets on other nodes follow it
//! ([`RemoteFeed`], the reader's side, below) and carries out the
//! commands other nodes forward (input, tool answers, cancels), answering each the way the
//! owner's own socket would have. See ARCHITECTURE.md, "Several nodes".
//!
//! The relay subscribes to its chat only while a reader on another node follows it, so an
//! owned chat nobody watches leaves memory when idle (its lease parked, see [`ClusterNode`]),
//! and the UI-call disconnect policy (which acts when a chat's last subscriber leaves) sees a
//! remote client leave once its follow lapses: up to [`FOLLOW_TTL`] later than a local one.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use bytes::Bytes;
use serde::Deserialize;
use tessera_cluster::{
    AcquireLease, ChatCommand, ClaimLease, ClusterBus, ClusterError, CommandReply, Drain,
    IncomingCommand, LeaseManager, LiveEvent, NumberedFrame, ParkLeases, ReleaseLease,
};
use tessera_engine::ChatHandle;
use tessera_engine::session::{
    CancelRun, Deliver, ReplayEvents, Subscribe, ToolAnswer, Unsubscribe, UserInput,
};
use tessera_protocol::ErrorCode;
use tokio::sync::{mpsc, oneshot};

/// Relays one owned chat; stop it (or drop its address) when the chat leaves this node.
pub struct ChatRelay {
    chat: ChatHandle,
    bus: ClusterBus,
    /// Bursts of events in seq order to the one task that publishes them (publishing from
    /// separate tasks could reorder them).
    outbound: Option<mpsc::UnboundedSender<Vec<LiveEvent>>>,
    /// The relay's subscription to the session: only while a reader follows the chat. A
    /// subscriber keeps a chat in memory, and the session hands every subscriber every burst;
    /// the chat's own sockets need no relay.
    subscription: Option<u64>,
    /// Which nodes' readers follow the chat ([`ChatCommand::Follow`]), and until when; live
    /// events are published only while one does. Publishing every event of every chat cost a
    /// two-node run ~20% of its CPU per turn when every client was on its chat's owner.
    followers: Followers,
    follow_ttl: std::time::Duration,
    /// Ends the subscription once the follow lapses.
    lapse: Option<SpawnHandle>,
    /// The last seq the session has shown while the relay was subscribed (readers check it).
    last_seq: Option<u64>,
    /// The node to tell when the chat leaves for another node ([`ChatCommand::HandOver`]);
    /// without one, hand-overs are refused.
    node: Option<Recipient<HandedOver>>,
    /// Ends the command subscription once the chat leaves this node ([`StopRelay`]).
    commands: Option<tessera_cluster::CommandsDrain>,
    /// The chat left this node: the commands that reached the relay before its subscription
    /// ended are refused as [`LEFT_OWNER`] (their forwarders retry on the new owner).
    leaving: bool,
}

impl ChatRelay {
    /// A relay for `chat` over `bus` that publishes nothing until a reader follows the chat;
    /// start it on the chat's arbiter.
    pub fn new(chat: ChatHandle, bus: ClusterBus) -> Self {
        Self {
            chat,
            bus,
            outbound: None,
            subscription: None,
            followers: Followers::default(),
            follow_ttl: FOLLOW_TTL,
            lapse: None,
            last_seq: None,
            node: None,
            commands: None,
            leaving: false,
        }
    }

    /// Hands the chat over when a client's socket reaches another node and nobody here
    /// watches it (see [`ChatCommand::HandOver`]), telling `node`.
    pub fn handing_over_to(mut self, node: Recipient<HandedOver>) -> Self {
        self.node = Some(node);
        self
    }

    /// For a chat taken over: readers on other nodes may be following it since its previous
    /// owner, and they renew with this node within the follow TTL (their renewals while no
    /// node served the chat were lost), so it publishes from the start for that long.
    pub fn assuming_followers(mut self) -> Self {
        let until = std::time::Instant::now() + self.follow_ttl;
        self.followers.follow(None, until);
        self
    }

    /// How long a reader's follow lasts ([`FOLLOW_TTL`] unless set).
    pub fn follow_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.follow_ttl = ttl;
        self
    }

    /// A reader on node `from` follows the chat (again) from now on. When the relay is not
    /// subscribed to the session, it returns the subscription to wait for (`ctx.wait`) before
    /// anything else: a replay read after it leaves no event between the two.
    fn follow_for_a_ttl(
        &mut self,
        from: Option<String>,
        ctx: &mut Context<Self>,
    ) -> Option<impl ActorFuture<Self, Output = ()> + 'static> {
        self.followers
            .follow(from, std::time::Instant::now() + self.follow_ttl);
        self.end_subscription_when_the_follow_lapses(ctx);
        self.subscription.is_none().then(|| self.subscribe(ctx))
    }

    fn followed(&self) -> bool {
        self.followers
            .until()
            .is_some_and(|until| std::time::Instant::now() < until)
    }

    /// Subscribes to the session's live events. Waited for (`ctx.wait`): no command, event or
    /// timer of the relay runs meanwhile, so there is never a second subscription.
    fn subscribe(
        &mut self,
        ctx: &mut Context<Self>,
    ) -> impl ActorFuture<Self, Output = ()> + 'static {
        // Live events only: a reader's replay gives what came before.
        self.chat
            .addr
            .send(Subscribe {
                recipient: ctx.address().recipient(),
                after_seq: u64::MAX,
            })
            .into_actor(self)
            .map(|id, act, _| match id {
                Ok(id) => act.subscription = Some(id),
                // The session stopped: the node's sweep stops the relay.
                Err(_) => tracing::debug!(chat_id = %act.chat.identity.chat_id, "the relay could not subscribe"),
            })
    }

    fn end_subscription_when_the_follow_lapses(&mut self, ctx: &mut Context<Self>) {
        let (None, Some(until)) = (self.lapse, self.followers.until()) else {
            return;
        };
        let left = until.saturating_duration_since(std::time::Instant::now());
        self.lapse = Some(ctx.run_later(left, |act, ctx| {
            act.lapse = None;
            if act.followed() {
                // Renewed meanwhile.
                act.end_subscription_when_the_follow_lapses(ctx);
            } else if let Some(id) = act.subscription.take() {
                act.chat.addr.do_send(Unsubscribe(id));
                // Unknown until the next subscription's boundary.
                act.last_seq = None;
            }
        }));
    }
}

/// Which nodes' readers follow a chat, and until when. A reader of an older build names no
/// node, nor do the readers a relay assumes after a takeover: such a follower (`None`) could
/// be on any node.
#[derive(Default)]
struct Followers(Vec<(Option<String>, std::time::Instant)>);

impl Followers {
    /// Node `node` follows until `until` (a renewal replaces its last follow).
    fn follow(&mut self, node: Option<String>, until: std::time::Instant) {
        let now = std::time::Instant::now();
        self.0.retain(|(n, u)| *u > now && *n != node);
        self.0.push((node, until));
    }

    /// Until when someone follows (`None`: nobody ever did, or every follow was dropped).
    fn until(&self) -> Option<std::time::Instant> {
        self.0.iter().map(|(_, until)| *until).max()
    }

    /// A node other than `node` (or one that could be any) follows at `now`.
    fn followed_beside(&self, node: Option<&str>, now: std::time::Instant) -> bool {
        self.0
            .iter()
            .any(|(n, until)| *until > now && (n.is_none() || n.as_deref() != node))
    }
}

/// How long an owner publishes a chat's live events after a reader on another node last
/// followed it ([`ChatCommand::Follow`] or a replay). A reader renews it with each check (at
/// most [`CHECK_QUIET`] apart); a reader gone is published to for at most this long.
pub const FOLLOW_TTL: std::time::Duration = std::time::Duration::from_secs(60);

impl Actor for ChatRelay {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let chat_id = self.chat.identity.chat_id.to_string();
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<LiveEvent>>();
        self.outbound = Some(tx);
        let bus = self.bus.clone();
        let publishing = chat_id.clone();
        actix::spawn(async move {
            while let Some(burst) = rx.recv().await {
                if let Err(e) = bus.publish_events(&publishing, &burst).await {
                    // Remote subscribers see the seq gap and read the store.
                    let seq = burst.first().map_or(0, |e| e.seq);
                    tracing::warn!(chat_id = %publishing, seq, error = %e, "live events not relayed");
                }
            }
        });
        if self.followed() {
            let subscribe = self.subscribe(ctx);
            ctx.wait(subscribe);
            self.end_subscription_when_the_follow_lapses(ctx);
        }
        let bus = self.bus.clone();
        let serving = async move { bus.serve_commands_until_drained(&chat_id).await };
        ctx.wait(serving.into_actor(self).map(|commands, act, ctx| match commands {
            Ok((commands, drain)) => {
                ctx.add_stream(commands);
                act.commands = Some(drain);
            }
            Err(e) => {
                tracing::warn!(chat_id = %act.chat.identity.chat_id, error = %e, "cannot serve the chat's commands");
                ctx.stop();
            }
        }));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(id) = self.subscription.take() {
            self.chat.addr.do_send(Unsubscribe(id));
        }
    }
}

impl Handler<Deliver> for ChatRelay {
    type Result = ();

    fn handle(&mut self, Deliver(batch): Deliver, _: &mut Self::Context) {
        let outbound = self.outbound.as_ref().filter(|_| self.followed());
        // One NATS message per burst, as one socket write per burst on this node.
        let mut burst = Vec::new();
        for text in batch.iter() {
            let seq = tessera_engine::envelope_seq(text.as_bytes());
            if seq == 0 {
                // The subscription's own events: its boundary says where the session is.
                if let Some(shown) = tessera_engine::resume_boundary_last_seq(text.as_bytes()) {
                    self.last_seq = Some(shown);
                }
                continue;
            }
            self.last_seq = Some(seq);
            if outbound.is_some() {
                burst.push(LiveEvent {
                    seq,
                    envelope: Bytes::from_owner(SharedEnvelope(text.clone())),
                });
            }
        }
        if let (Some(outbound), false) = (outbound, burst.is_empty()) {
            let _ = outbound.send(burst);
        }
    }
}

/// An envelope the session shares with its other subscribers, as [`Bytes`] without a copy.
struct SharedEnvelope(Arc<str>);

impl AsRef<[u8]> for SharedEnvelope {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Carries out a client's command on a local chat session, answering the way the session
/// answered (the relay sends that back to the forwarding node). REST reads are answered with
/// the JSON the owner's own REST API would send, refusals with its HTTP status.
pub async fn carry_out(chat: &ChatHandle, bus: &ClusterBus, command: ChatCommand) -> CommandReply {
    let addr = &chat.addr;
    match command {
        ChatCommand::Input {
            content,
            client_msg_id,
        } => match addr
            .send(UserInput {
                content,
                client_msg_id,
            })
            .await
        {
            Ok(Ok(())) => CommandReply::Accepted,
            Ok(Err(e)) => crate::rest::ApiError::from(e).to_refusal(),
            Err(_) => crate::rest::unavailable().to_refusal(),
        },
        ChatCommand::ToolAnswer { corr, response } => {
            match addr.send(ToolAnswer { corr, response }).await {
                Ok(Ok(())) => CommandReply::Accepted,
                Ok(Err(e)) => crate::rest::ApiError::from(e).to_refusal(),
                Err(_) => crate::rest::unavailable().to_refusal(),
            }
        }
        ChatCommand::Cancel => match addr.send(CancelRun).await {
            Ok(()) => CommandReply::Accepted,
            Err(_) => crate::rest::unavailable().to_refusal(),
        },
        ChatCommand::Snapshot => match crate::rest::snapshot(chat).await {
            Ok(snap) => CommandReply::Answered {
                body: crate::rest::chat_json(&snap),
            },
            Err(e) => e.to_refusal(),
        },
        ChatCommand::Messages { offset, limit } => match crate::rest::snapshot(chat).await {
            Ok(snap) => CommandReply::Answered {
                body: crate::rest::messages_json(
                    &snap,
                    usize::try_from(offset).unwrap_or(usize::MAX),
                    usize::try_from(limit).unwrap_or(usize::MAX),
                ),
            },
            Err(e) => e.to_refusal(),
        },
        ChatCommand::Replay {
            after_seq,
            with_session,
        } => match addr
            .send(ReplayEvents {
                after_seq,
                max_events: REPLAY_PAGE_EVENTS,
                max_bytes: REPLAY_PAGE_BYTES,
                with_session,
            })
            .await
        {
            Ok(Ok(replayed)) => CommandReply::Answered {
                body: serde_json::json!({
                    "session": replayed.session.as_deref(),
                    "events": replayed.events.iter().map(|e| &**e).collect::<Vec<&str>>(),
                    "through": replayed.through,
                    "more": replayed.more,
                }),
            },
            Ok(Err(e)) => crate::rest::ApiError::from(e).to_refusal(),
            Err(_) => crate::rest::unavailable().to_refusal(),
        },
        // The relay answers a follow itself, with the last seq it has seen.
        ChatCommand::Follow => CommandReply::Accepted,
        // The relay carries a hand-over out itself: its node must park the lease.
        ChatCommand::HandOver => refused(
            ErrorCode::Internal,
            "a hand-over is the relay's to carry out",
        ),
        ChatCommand::Stop => {
            // Stopped already is as good: nothing of it runs here any more.
            let _ = addr.send(tessera_engine::session::StopChat).await;
            CommandReply::Accepted
        }
        ChatCommand::AguiRun {
            workflow,
            input,
            stream_to,
        } => serve_agui_run(chat, bus, &workflow, input, stream_to).await,
    }
}

/// Events at most in one answer to [`ChatCommand::Replay`].
const REPLAY_PAGE_EVENTS: usize = 500;

/// Envelope bytes at most in one answer to [`ChatCommand::Replay`] (about; NATS refuses a
/// message over its `max_payload`, 1 MiB by default, and the answer's JSON escapes the texts).
const REPLAY_PAGE_BYTES: usize = 256 * 1024;

/// How often an owner streaming a run to another node says it is still there.
pub(crate) const STREAM_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a forwarder waits without any frame before it gives the owner up.
pub(crate) const STREAM_SILENCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts an AG-UI run of `chat` here and streams its SSE frames to `stream_to` until it ends.
async fn serve_agui_run(
    chat: &ChatHandle,
    bus: &ClusterBus,
    workflow: &str,
    input: serde_json::Value,
    stream_to: String,
) -> CommandReply {
    let input = match serde_json::from_value::<crate::agui::RunAgentInput>(input) {
        Ok(input) => input,
        Err(e) => return crate::agui::bad_request(e.to_string()).to_refusal(),
    };
    let mut frames = match crate::agui::start_run(chat.clone(), workflow, input, false).await {
        Ok(frames) => frames,
        Err(e) => return e.to_refusal(),
    };
    let bus = bus.clone();
    let chat_id = chat.identity.chat_id.clone();
    actix::spawn(async move {
        use tessera_cluster::StreamFrame;
        let mut n = 0u64;
        let mut keepalive = tokio::time::interval(STREAM_KEEPALIVE);
        keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        keepalive.tick().await;
        loop {
            let frame = tokio::select! {
                data = frames.recv() => match data {
                    Some(data) => StreamFrame::Data(data),
                    None => StreamFrame::End,
                },
                _ = keepalive.tick() => StreamFrame::KeepAlive,
            };
            let end = frame == StreamFrame::End;
            if let Err(e) = bus
                .send_stream_frame(&stream_to, &NumberedFrame { n, frame })
                .await
            {
                // The forwarder notices the silence and tells its client to retry.
                tracing::warn!(chat_id = %chat_id, error = %e, "AG-UI run not streamed");
                return;
            }
            n += 1;
            if end {
                return;
            }
        }
    });
    CommandReply::Accepted
}

/// Answer a reader's follow (see [`ChatRelay::answer_follow`]).
#[derive(Message)]
#[rtype(result = "()")]
struct AnswerFollow(IncomingCommand);

impl Handler<AnswerFollow> for ChatRelay {
    type Result = ();

    fn handle(&mut self, AnswerFollow(incoming): AnswerFollow, _: &mut Self::Context) {
        self.answer_follow(incoming);
    }
}

/// The refusal of a hand-over: the chat stays with its owner (someone there watches it, it
/// is running, or it waits on a timed UI call), and the socket is served from there.
const STAYS: &str = "chat_stays";

impl ChatRelay {
    /// Carries out [`ChatCommand::HandOver`]: the chat leaves memory if it may, and the node
    /// parks its lease before the forwarder is answered, so the forwarder's claim finds it
    /// parked. Waited for in the mailbox like any command: none forwarded after it runs on a
    /// chat that is leaving (it finds the chat gone and is retried on the new owner).
    ///
    /// The relay's own subscription does not keep the chat: it is there for the readers that
    /// follow, and the chat leaves only when none but the asking node's follow (that node
    /// then serves its socket itself; readers on a third node would not know where to follow
    /// the chat until their next check).
    fn hand_over(&mut self, incoming: IncomingCommand, ctx: &mut Context<Self>) {
        let session = self.chat.addr.clone();
        let chat_id = self.chat.identity.chat_id.clone();
        let followed_elsewhere = self
            .followers
            .followed_beside(incoming.from.as_deref(), std::time::Instant::now());
        let node = self.node.clone().filter(|_| !followed_elsewhere);
        let relay_subscription = self.subscription;
        let bus = self.bus.clone();
        let hand_over = async move {
            let handed_over = match node {
                None => false,
                Some(node) => {
                    // What a chat created a moment ago queued is stored first.
                    let _ = session.send(tessera_engine::session::WhenStored).await;
                    let left = session
                        .send(tessera_engine::session::LeaveForAnotherNode {
                            but_for: relay_subscription,
                        })
                        .await
                        .unwrap_or(false);
                    left && node
                        .send(HandedOver {
                            chat_id: chat_id.to_string(),
                            session,
                        })
                        .await
                        .unwrap_or(false)
                }
            };
            tracing::debug!(chat_id = %chat_id, handed_over, "hand-over asked by another node");
            let reply = if handed_over {
                CommandReply::Accepted
            } else {
                refusal(STAYS, "the chat stays with its owner")
            };
            if let Err(e) = bus.reply(incoming, &reply).await {
                tracing::debug!(chat_id = %chat_id, error = %e, "hand-over not answered");
            }
        };
        ctx.wait(hand_over.into_actor(self));
    }

    /// Answers a follow with the last seq the session has shown (`null` when unknown: the
    /// reader then reads the store).
    fn answer_follow(&self, incoming: IncomingCommand) {
        if !incoming.wants_reply() {
            return;
        }
        let bus = self.bus.clone();
        let chat_id = self.chat.identity.chat_id.clone();
        let reply = CommandReply::Answered {
            body: serde_json::json!({ "last_seq": self.last_seq }),
        };
        actix::spawn(async move {
            if let Err(e) = bus.reply(incoming, &reply).await {
                tracing::debug!(chat_id = %chat_id, error = %e, "follow not answered");
            }
        });
    }
}

impl StreamHandler<IncomingCommand> for ChatRelay {
    fn handle(&mut self, incoming: IncomingCommand, ctx: &mut Self::Context) {
        // Answered by the relay itself, from what it has seen: a reader checks with each
        // follow that it has the last event shown.
        if let (ChatCommand::Follow, false) = (&incoming.command, self.leaving) {
            match self.follow_for_a_ttl(incoming.from.clone(), ctx) {
                // Answered once subscribed, through the mailbox: after the subscription's
                // boundary, which tells the relay the last seq shown.
                Some(subscribe) => ctx.wait(subscribe.map(move |(), _, ctx| {
                    ctx.address().do_send(AnswerFollow(incoming));
                })),
                None => self.answer_follow(incoming),
            }
            return;
        }
        if self.leaving || !self.chat.addr.connected() {
            // The chat left memory (or this node); the node's sweep parks its lease within a
            // second (or has), and the forwarder then claims it (see `RemoteChat::send`).
            // Nothing was carried out.
            let bus = self.bus.clone();
            let reply = refused_as_left_owner();
            actix::spawn(async move {
                let _ = bus.reply(incoming, &reply).await;
            });
            return;
        }
        if let ChatCommand::HandOver = incoming.command {
            self.hand_over(incoming, ctx);
            return;
        }
        // A replay follows the chat, subscribed before the replay is read: every event after
        // what the replay holds is then published.
        let subscribe = match incoming.command {
            ChatCommand::Replay { .. } => self.follow_for_a_ttl(incoming.from.clone(), ctx),
            _ => None,
        };
        let chat = self.chat.clone();
        let bus = self.bus.clone();
        let chat_id = self.chat.identity.chat_id.clone();
        let command = incoming.command.clone();
        let answer = async move {
            let reply = carry_out(&chat, &bus, command).await;
            if let Err(e) = bus.reply(incoming, &reply).await {
                // The forwarder times out and tells its client to retry.
                tracing::warn!(chat_id = %chat_id, error = %e, "command answer not sent");
            }
        };
        // In arrival order: the next command waits for this one, as on one socket. (One
        // `ctx.wait` per handler: actix runs the last one waited for first.)
        match subscribe {
            Some(subscribe) => {
                ctx.wait(subscribe.then(move |(), _, _| fut::wrap_future::<_, Self>(answer)))
            }
            None => ctx.wait(answer.into_actor(self)),
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// How long a reader waits before asking the store (and the owner) again for events it has
/// seen live but could not place yet.
const STORE_CATCH_UP_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// How soon after the chat's last activity a reader checks with the owner that it has every
/// event (a lost last live event comes with no later one to reveal the gap); the check also
/// renews its follow.
const CHECK_SOON: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest wait between two checks: each check that finds the chat quiet since the one
/// before doubles the wait up to this, and a live event brings it back to [`CHECK_SOON`].
/// (A reader per idle chat and socket reading the store every second was the store's main
/// load in a cluster of idle chats; a check is a NATS request, and reads the store only when
/// the owner has shown an event the reader lacks.)
pub const CHECK_QUIET: std::time::Duration = std::time::Duration::from_secs(16);

/// How long a gap the store cannot fill may last before the reader asks the owner (see
/// `RemoteFeed::stalled`).
const STALL_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Events read from the store per catch-up query.
const CATCH_UP_PAGE: u32 = 500;

/// The reader's side of routing: feeds a subscriber on a node that does not own the chat with
/// what a subscriber on the owner gets — `chat.session`, the events after `after_seq`, each
/// once and in seq order, `chat.resume_boundary`, then live events from the owner over NATS.
/// The replay comes from the owner ([`ChatCommand::Replay`]: its memory, and its store reads):
/// the store holds no streamed delta, so only the owner has the deltas of a message still
/// streaming, and only it can say which seqs have no event for clients. A live event past a
/// gap (one published before the subscription, or lost) is held back until the store or the
/// owner has filled the gap. While no node owns the chat (a takeover), the store alone
/// replays what it holds. The owner publishes live events only while a reader follows the
/// chat: the replay request is the feed's first follow, renewed by each check (see
/// [`CHECK_SOON`]).
pub struct RemoteFeed {
    chat_id: String,
    store: std::sync::Arc<dyn tessera_store::ChatStore>,
    bus: ClusterBus,
    recipient: Recipient<Deliver>,
    /// The next seq the subscriber may get (lower ones it has, or have no event).
    next_seq: u64,
    /// Live events ahead of `next_seq`, by seq.
    held: std::collections::BTreeMap<u64, Bytes>,
    catching_up: bool,
    /// Where the replay started, until the `chat.resume_boundary` that ends it is sent.
    boundary_from: Option<u64>,
    /// That boundary went to the subscriber.
    greeted: bool,
    /// Events delivered before that boundary (the replay's, and live ones that came before
    /// it went).
    replayed: u64,
    /// The owner was asked for the `chat.session` event that opens the replay.
    session_asked: bool,
    /// The wait before the next check (see [`CHECK_QUIET`]), and that check.
    check_every: std::time::Duration,
    check: Option<SpawnHandle>,
    /// The shortest and the longest wait between checks ([`CHECK_SOON`], [`CHECK_QUIET`]).
    check_soon: std::time::Duration,
    check_quiet: std::time::Duration,
    /// The seq the feed has been stuck before, and since when.
    stalled_since: Option<(u64, std::time::Instant)>,
    /// The owner answered the feed's last replay or follow request. When the first replay
    /// goes unanswered the feed asks to follow again soon, not at its next check: a replay
    /// asked before a new chat's relay served commands follows nothing, and the feed would get
    /// the chat's events from the store and the owner's replays alone, which leave out the
    /// deltas of messages already final.
    followed: bool,
    /// A follow request is under way, or waits to be sent again.
    follow_asked: bool,
    /// Events delivered and not yet sent (see [`RemoteFeed::send_delivered`]).
    delivered: Vec<Arc<str>>,
    /// Told once when a live event shows the chat waiting on its user (a socket asks for the
    /// chat then, see `WsConnection::take_chat_here`).
    waits_on_user: Option<Recipient<ChatWaitsOnUser>>,
}

/// A live event shows that the chat a [`RemoteFeed`] feeds waits on its user
/// (`chat.input_request`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ChatWaitsOnUser;

/// The owner's answer to [`ChatCommand::Replay`].
#[derive(Deserialize)]
struct ReplayPage {
    #[serde(default)]
    session: Option<String>,
    events: Vec<String>,
    through: u64,
    #[serde(default)]
    more: bool,
}

impl RemoteFeed {
    /// A feed of `chat_id`'s events after `after_seq` to `recipient`.
    pub fn new(
        chat_id: String,
        after_seq: u64,
        store: std::sync::Arc<dyn tessera_store::ChatStore>,
        bus: ClusterBus,
        recipient: Recipient<Deliver>,
    ) -> Self {
        Self {
            chat_id,
            store,
            bus,
            recipient,
            next_seq: after_seq + 1,
            held: std::collections::BTreeMap::new(),
            catching_up: false,
            boundary_from: Some(after_seq + 1),
            greeted: false,
            replayed: 0,
            session_asked: false,
            check_every: CHECK_SOON,
            check: None,
            check_soon: CHECK_SOON,
            check_quiet: CHECK_QUIET,
            stalled_since: None,
            followed: false,
            follow_asked: false,
            delivered: Vec::new(),
            waits_on_user: None,
        }
    }

    /// Tells `recipient`, once, when a live event shows the chat waiting on its user.
    pub fn telling_when_it_waits_on_user(mut self, recipient: Recipient<ChatWaitsOnUser>) -> Self {
        self.waits_on_user = Some(recipient);
        self
    }

    /// Checks between `soon` and `quiet` apart instead of between [`CHECK_SOON`] and
    /// [`CHECK_QUIET`] (`quiet` must stay below the owner's follow TTL).
    pub fn checks_between(mut self, soon: std::time::Duration, quiet: std::time::Duration) -> Self {
        self.check_soon = soon;
        self.check_every = soon;
        self.check_quiet = quiet;
        self
    }

    /// Asks the owner to follow the chat (again) and for the last seq it has shown, and reads
    /// the store when that is past what the feed delivered. Without an answer (no node serves
    /// the chat, or it is slow) it reads the store, and with `retry` asks again after that
    /// long, twice as long each next time.
    fn follow(&mut self, retry: Option<std::time::Duration>, ctx: &mut Context<Self>) {
        if self.follow_asked {
            return;
        }
        self.follow_asked = true;
        let bus = self.bus.clone();
        let chat_id = self.chat_id.clone();
        let ask = async move { bus.send_command(&chat_id, &ChatCommand::Follow).await };
        ctx.spawn(ask.into_actor(self).map(move |reply, act, ctx| {
            let last_seq = match reply {
                Ok(CommandReply::Answered { body }) => Ok(body["last_seq"].as_u64()),
                Ok(other) => Err(format!("{other:?}")),
                Err(e) => Err(e.to_string()),
            };
            match last_seq {
                Ok(last_seq) => {
                    act.followed = true;
                    act.follow_asked = false;
                    // Unknown (the owner has shown nothing since it took the chat): the store.
                    if last_seq.is_none_or(|last| last >= act.next_seq) {
                        act.catch_up(ctx);
                    }
                }
                Err(error) => {
                    tracing::debug!(chat_id = %act.chat_id, %error, "the owner did not take the follow");
                    act.followed = false;
                    act.catch_up(ctx);
                    match retry {
                        Some(retry) => {
                            ctx.run_later(retry, move |act, ctx| {
                                act.follow_asked = false;
                                act.follow(Some((retry * 2).min(act.check_quiet)), ctx);
                            });
                        }
                        None => act.follow_asked = false,
                    }
                }
            }
        }));
    }

    /// Ends the replay as a local session does: a `chat.resume_boundary` (seq 0) with the
    /// UI calls the store says are waiting, so a resuming client can answer a call whose
    /// announcement it missed.
    fn send_boundary(&mut self, ctx: &mut Context<Self>) {
        let Some(from) = self.boundary_from.take() else {
            return;
        };
        let store = self.store.clone();
        let chat_id = self.chat_id.clone();
        let read = async move { store.pending_ui(&chat_id).await };
        ctx.spawn(read.into_actor(self).map(move |pending, act, _| {
            let pending_ui_calls = pending
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| serde_json::from_value(p.call).ok())
                .collect();
            // Counting the live events delivered during the read: they came before it.
            let event = tessera_protocol::ServerEvent::ResumeBoundary {
                from_seq: from,
                last_seq: act.next_seq - 1,
                replayed: act.replayed,
                pending_ui_calls,
            };
            let timestamp = tessera_protocol::rfc3339_now();
            let text = tessera_protocol::Envelope {
                seq: 0,
                chat_id: &act.chat_id,
                timestamp: &timestamp,
                event: &event,
            }
            .to_json();
            act.recipient
                .do_send(Deliver::one(Arc::from(text.as_str())));
            act.greeted = true;
        }));
    }

    /// Delivers event `seq` (not below `next_seq`) with the next [`RemoteFeed::send_delivered`].
    fn deliver(&mut self, seq: u64, envelope: &[u8]) {
        let text = String::from_utf8_lossy(envelope);
        self.delivered.push(Arc::from(text.as_ref()));
        self.next_seq = seq + 1;
        if !self.greeted {
            self.replayed += 1;
        }
    }

    /// Sends the subscriber what was delivered since the last send, as one batch (one socket
    /// write). Every handler that delivers calls it before it returns.
    fn send_delivered(&mut self) {
        if !self.delivered.is_empty() {
            self.recipient
                .do_send(Deliver(std::mem::take(&mut self.delivered)));
        }
    }

    /// Delivers held live events that are next in line.
    fn drain_held(&mut self) {
        while let Some(envelope) = self.held.remove(&self.next_seq) {
            self.deliver(self.next_seq, &envelope);
        }
        let stale: Vec<u64> = self.held.range(..self.next_seq).map(|(s, _)| *s).collect();
        for seq in stale {
            self.held.remove(&seq);
        }
    }

    /// Reads the store from `next_seq` on; when it cannot fill a gap (before a stored event,
    /// or before a held live one), see [`RemoteFeed::stalled`].
    fn catch_up(&mut self, ctx: &mut Context<Self>) {
        if self.catching_up {
            return;
        }
        self.catching_up = true;
        let store = self.store.clone();
        let chat_id = self.chat_id.clone();
        let after = self.next_seq - 1;
        let read = async move { store.events_after(&chat_id, after, CATCH_UP_PAGE).await };
        ctx.spawn(read.into_actor(self).map(|events, act, ctx| {
            act.catching_up = false;
            let (mut full_page, mut gap) = (false, false);
            match events {
                Ok(events) => {
                    full_page = events.len() == CATCH_UP_PAGE as usize;
                    for event in events {
                        if event.seq == act.next_seq {
                            act.deliver(event.seq, event.json.as_bytes());
                        } else if event.seq > act.next_seq {
                            gap = true;
                            break;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(chat_id = %act.chat_id, error = %e, "replay from the store failed; retrying")
                }
            }
            act.drain_held();
            act.send_delivered();
            if gap || (!full_page && !act.held.is_empty()) {
                act.stalled(ctx);
            } else if full_page {
                act.catch_up(ctx);
            } else {
                act.send_boundary(ctx);
            }
        }));
    }

    /// The feed cannot go on from the store (a gap before a stored event, or before a held
    /// live one): reads the store again after a pause and asks the owner once the same gap has
    /// lasted [`STALL_GRACE`]. Not at once: a gap before a stored event is most often a delta
    /// the owner showed with it and NATS is still bringing, and the owner's replay skips the
    /// deltas of a message that is final by then, which would cut this one from the live view.
    fn stalled(&mut self, ctx: &mut Context<Self>) {
        match self.stalled_since {
            Some((seq, since)) if seq == self.next_seq => {
                if since.elapsed() >= STALL_GRACE {
                    self.stalled_since = None;
                    self.ask_owner(true, ctx);
                    return;
                }
            }
            _ => self.stalled_since = Some((self.next_seq, std::time::Instant::now())),
        }
        ctx.run_later(STORE_CATCH_UP_RETRY, |act, ctx| act.catch_up(ctx));
    }

    /// Asks the owner for the events from `next_seq` on (see [`ChatCommand::Replay`]), with
    /// the `chat.session` event first when the replay starts. If it cannot answer (a takeover
    /// is under way), reads the store: again after a pause when the feed is `stuck` (a gap
    /// before an event it has), or at once for a replay that starts (without its
    /// `chat.session`, which only the owner can give; a later live event shows any gap).
    fn ask_owner(&mut self, stuck: bool, ctx: &mut Context<Self>) {
        if self.catching_up {
            return;
        }
        self.catching_up = true;
        let bus = self.bus.clone();
        let chat_id = self.chat_id.clone();
        let with_session = self.boundary_from.is_some() && !self.session_asked;
        self.session_asked = true;
        let command = ChatCommand::Replay {
            after_seq: self.next_seq - 1,
            with_session,
        };
        let ask = async move { bus.send_command(&chat_id, &command).await };
        ctx.spawn(ask.into_actor(self).map(move |reply, act, ctx| {
            act.catching_up = false;
            let page = match reply {
                Ok(CommandReply::Answered { body }) => {
                    serde_json::from_value::<ReplayPage>(body).map_err(|e| e.to_string())
                }
                Ok(other) => Err(format!("{other:?}")),
                Err(e) => Err(e.to_string()),
            };
            let page = match page {
                Ok(page) => page,
                Err(error) => {
                    tracing::debug!(chat_id = %act.chat_id, %error, "the owner did not replay");
                    if !act.followed {
                        act.follow(Some(STORE_CATCH_UP_RETRY), ctx);
                    }
                    if stuck {
                        ctx.run_later(STORE_CATCH_UP_RETRY, |act, ctx| act.catch_up(ctx));
                    } else {
                        act.catch_up(ctx);
                    }
                    return;
                }
            };
            act.followed = true;
            if let Some(session) = page.session.filter(|_| act.boundary_from.is_some()) {
                act.delivered.push(Arc::from(session.as_str()));
            }
            for text in &page.events {
                let seq = tessera_engine::envelope_seq(text.as_bytes());
                if seq >= act.next_seq {
                    act.deliver(seq, text.as_bytes());
                }
            }
            // The seqs up to `through` without an event have none for clients.
            act.next_seq = act.next_seq.max(page.through + 1);
            act.drain_held();
            act.send_delivered();
            if page.more && page.events.is_empty() {
                // The next event is too big for an answer; the store has it.
                act.catch_up(ctx);
            } else if page.more {
                act.ask_owner(true, ctx);
            } else if !act.held.is_empty() {
                ctx.run_later(STORE_CATCH_UP_RETRY, |act, ctx| act.catch_up(ctx));
            } else {
                act.send_boundary(ctx);
            }
        }));
    }

    /// Checks after `check_every` (see [`RemoteFeed::follow`]), waiting longer each time the
    /// chat stayed quiet.
    fn schedule_check(&mut self, ctx: &mut Context<Self>) {
        let seen = self.next_seq;
        self.check = Some(ctx.run_later(self.check_every, move |act, ctx| {
            if !act.recipient.connected() {
                ctx.stop();
                return;
            }
            if act.next_seq == seen {
                act.check_every = (act.check_every * 2).min(act.check_quiet);
            }
            act.follow(None, ctx);
            act.schedule_check(ctx);
        }));
    }

    /// The chat is active: the next check comes `check_soon` from now at most.
    fn on_activity(&mut self, ctx: &mut Context<Self>) {
        if self.check_every > self.check_soon {
            self.check_every = self.check_soon;
            if let Some(check) = self.check.take() {
                ctx.cancel_future(check);
            }
            self.schedule_check(ctx);
        }
    }
}

impl Actor for RemoteFeed {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Subscribe first, then replay: an event published in between is then both live and
        // replayed, and the seq check delivers it once.
        let bus = self.bus.clone();
        let chat_id = self.chat_id.clone();
        let subscribe = async move { bus.subscribe_events(&chat_id).await };
        ctx.wait(subscribe.into_actor(self).map(|events, act, ctx| match events {
            Ok(events) => {
                ctx.add_stream(events);
                act.ask_owner(false, ctx);
                act.schedule_check(ctx);
            }
            Err(e) => {
                tracing::warn!(chat_id = %act.chat_id, error = %e, "cannot follow the chat's live events");
                ctx.stop();
            }
        }));
    }
}

/// How a `chat.input_request` envelope starts (the envelope's first field is its type).
const INPUT_REQUEST_ENVELOPE: &[u8] = br#"{"type":"chat.input_request""#;

/// Stop feeding (the socket closed, resumes from another seq, or moves to the chat's
/// session on this node); answers where the feed left its subscriber.
#[derive(Message)]
#[rtype(result = "FeedStopped")]
pub struct StopFeed;

/// Where a stopped [`RemoteFeed`] left its subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedStopped {
    /// The subscriber has every event through this seq (those without one have none for it).
    pub through: u64,
    /// It got the `chat.resume_boundary` that ends the replay.
    pub greeted: bool,
}

impl Handler<StopFeed> for RemoteFeed {
    type Result = MessageResult<StopFeed>;

    fn handle(&mut self, _: StopFeed, ctx: &mut Self::Context) -> Self::Result {
        ctx.stop();
        // Every handler sends what it delivered before it returns: nothing is left unsent.
        MessageResult(FeedStopped {
            through: self.next_seq - 1,
            greeted: self.greeted,
        })
    }
}

impl StreamHandler<Vec<LiveEvent>> for RemoteFeed {
    fn handle(&mut self, burst: Vec<LiveEvent>, ctx: &mut Self::Context) {
        if !self.recipient.connected() {
            ctx.stop();
            return;
        }
        self.on_activity(ctx);
        if self.waits_on_user.is_some()
            && burst
                .iter()
                .any(|e| e.envelope.starts_with(INPUT_REQUEST_ENVELOPE))
            && let Some(waits) = self.waits_on_user.take()
        {
            waits.do_send(ChatWaitsOnUser);
        }
        let mut holding = false;
        for event in burst {
            if event.seq < self.next_seq {
                continue;
            }
            if !holding && event.seq == self.next_seq && !self.catching_up {
                self.deliver(event.seq, &event.envelope);
            } else {
                self.held.insert(event.seq, event.envelope);
                holding = true;
            }
        }
        if holding {
            self.send_delivered();
            self.catch_up(ctx);
        } else {
            self.drain_held();
            self.send_delivered();
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// The node's side of ownership: carries out what the `LeaseManager` decides. A chat taken
/// over is rebuilt from the store (`Engine::take_over`) and served to other nodes by a
/// [`ChatRelay`]; a chat lost is relinquished at once (it writes nothing more) and its relay
/// stopped, so commands for it reach its new owner. It is also the one place that starts a
/// chat on this node in cluster mode ([`ClaimChat`], [`ServeChat`]), so a chat is never
/// started twice here.
pub struct ClusterNode {
    engine: tessera_engine::Engine,
    bus: ClusterBus,
    leases: Option<Addr<LeaseManager>>,
    registry: Option<Addr<crate::registry::ChatRegistry>>,
    owned: HashMap<String, OwnedChat>,
    /// Chats being rebuilt from the store, with whoever waits for them.
    restoring: HashMap<String, Vec<oneshot::Sender<Option<ChatHandle>>>>,
    draining: bool,
    /// Chats handed over whose leases wait to be parked, with whoever waits for each: one
    /// store call parks all that came while the previous one ran (see [`HandedOver`]).
    parks_queued: Vec<(String, oneshot::Sender<bool>)>,
    park_running: bool,
    /// Chats whose park is queued or under way, with the claims here that wait for it: a
    /// claim then finds the lease parked, never still held here.
    parking: HashMap<String, Vec<oneshot::Sender<()>>>,
}

struct OwnedChat {
    chat: ChatHandle,
    relay: Addr<ChatRelay>,
    epoch: i64,
}

/// How often the node parks the leases of chats whose session has stopped: an open chat left
/// memory idle (waiting only on a client), a completed chat retired, or a fenced chat
/// relinquished itself (its lease is no longer this node's, and parking it changes nothing).
const SWEEP_STOPPED: std::time::Duration = std::time::Duration::from_secs(1);

impl ClusterNode {
    /// A node running chats on `engine`, reachable over `bus`.
    pub fn new(engine: tessera_engine::Engine, bus: ClusterBus) -> Self {
        Self {
            engine,
            bus,
            leases: None,
            registry: None,
            owned: HashMap::new(),
            restoring: HashMap::new(),
            draining: false,
            parks_queued: Vec::new(),
            park_running: false,
            parking: HashMap::new(),
        }
    }

    /// The lease manager that decides for this node (it must report to this node).
    pub fn with_leases(mut self, leases: Addr<LeaseManager>) -> Self {
        self.leases = Some(leases);
        self
    }

    /// Registers every chat this node serves, so local lookups find it.
    pub(crate) fn with_registry(mut self, registry: Addr<crate::registry::ChatRegistry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Serves `chat` under `epoch`; `taken_over` when another node served it before (its
    /// readers may be following it).
    fn serve(&mut self, chat: ChatHandle, epoch: i64, taken_over: bool, ctx: &Context<Self>) {
        let relayed = chat.clone();
        let bus = self.bus.clone();
        let node = ctx.address().recipient();
        let relay = ChatRelay::start_in_arbiter(&chat.arbiter.clone(), move |_| {
            let relay = ChatRelay::new(relayed, bus).handing_over_to(node);
            if taken_over {
                relay.assuming_followers()
            } else {
                relay
            }
        });
        if let Some(registry) = &self.registry {
            registry.do_send(crate::registry::RegisterChat(chat.clone()));
        }
        // Never two relays serving one chat's commands.
        if let Some(previous) = self.owned.insert(
            chat.identity.chat_id.to_string(),
            OwnedChat { chat, relay, epoch },
        ) {
            previous.relay.do_send(StopRelay);
        }
    }

    fn release(&self, chat_id: &str) {
        if let Some(leases) = &self.leases {
            leases.do_send(ReleaseLease {
                chat_id: chat_id.to_owned(),
            });
        }
    }

    /// Rebuilds `chat_id` from the store under `epoch` (once, whoever asks). `was_parked`: its
    /// lease was parked, so no reader on another node follows it (a chat whose owner died may
    /// have some, see [`ChatRelay::assuming_followers`]).
    fn restore(
        &mut self,
        chat_id: String,
        epoch: i64,
        was_parked: bool,
        waiter: Option<oneshot::Sender<Option<ChatHandle>>>,
        ctx: &mut Context<Self>,
    ) {
        if let Some(waiters) = self.restoring.get_mut(&chat_id) {
            waiters.extend(waiter);
            return;
        }
        self.restoring
            .insert(chat_id.clone(), waiter.into_iter().collect());
        let engine = self.engine.clone();
        let restoring = chat_id.clone();
        let restore = async move { engine.take_over(&restoring, epoch).await };
        ctx.spawn(restore.into_actor(self).map(move |restored, act, ctx| {
            let waiters = act.restoring.remove(&chat_id).unwrap_or_default();
            let served = match restored {
                Ok(Some(chat)) => {
                    tracing::info!(chat_id = %chat_id, epoch, was_parked, "serving a chat taken over");
                    act.serve(chat.clone(), epoch, !was_parked, ctx);
                    Some(chat)
                }
                // Completed meanwhile, or of a workflow this node does not serve.
                Ok(None) => {
                    tracing::warn!(chat_id = %chat_id, epoch, "taken-over chat not started");
                    act.release(&chat_id);
                    None
                }
                Err(e) => {
                    // Released so a later scan (of any node) tries again.
                    tracing::error!(chat_id = %chat_id, epoch, error = %e, "taken-over chat could not be rebuilt");
                    act.release(&chat_id);
                    None
                }
            };
            for waiter in waiters {
                let _ = waiter.send(served.clone());
            }
        }));
    }

    fn drop_chat(&mut self, chat_id: &str) -> Option<OwnedChat> {
        let owned = self.forget(chat_id)?;
        owned.chat.addr.do_send(tessera_engine::session::Relinquish);
        Some(owned)
    }

    /// Stops serving `chat_id` here (its relay stops); the session is the caller's concern.
    fn forget(&mut self, chat_id: &str) -> Option<OwnedChat> {
        let owned = self.owned.remove(chat_id)?;
        owned.relay.do_send(StopRelay);
        Some(owned)
    }
}

impl Actor for ClusterNode {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(SWEEP_STOPPED, |act, _| {
            // (A chat being rebuilt here is not among them: `ClaimChat` takes a stopped chat
            // out of `owned` before it rebuilds it.)
            let stopped: Vec<String> = act
                .owned
                .iter()
                .filter(|(_, o)| !o.chat.addr.connected())
                .map(|(id, _)| id.clone())
                .collect();
            if stopped.is_empty() {
                return;
            }
            for chat_id in &stopped {
                act.forget(chat_id);
            }
            // Parked, not released: released, an idle chat would be an orphan that some
            // node's scan rebuilds at once, only for it to leave memory again. A session stops
            // of its own accord only when the store alone can carry it on. Sent before any
            // later claim's `ClaimLease`, which then finds the lease parked.
            if let Some(leases) = &act.leases {
                leases.do_send(ParkLeases { chat_ids: stopped });
            }
        });
    }
}

/// The chat this node owns under `chat_id`, with its epoch.
#[derive(Message)]
#[rtype(result = "Option<(ChatHandle, i64)>")]
pub struct FindOwned(pub String);

impl Handler<FindOwned> for ClusterNode {
    type Result = MessageResult<FindOwned>;

    fn handle(&mut self, FindOwned(chat_id): FindOwned, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            self.owned
                .get(&chat_id)
                .map(|owned| (owned.chat.clone(), owned.epoch)),
        )
    }
}

/// Where a client's chat runs, as seen from this node.
#[derive(Clone)]
pub enum Claimed {
    /// Here: talk to the session.
    Local(ChatHandle),
    /// Another node holds the chat's live lease: follow and forward over NATS.
    Remote,
    /// Not an open chat any more (completed meanwhile).
    NotOpen,
}

/// Serve open chat `chat_id` here if no other node owns it (an orphan is taken over at once,
/// rather than on the next scan); says where it runs.
#[derive(Message)]
#[rtype(result = "Result<Claimed, String>")]
pub struct ClaimChat(pub String);

enum ClaimStep {
    Done(Result<Claimed, String>),
    Wait(oneshot::Receiver<Option<ChatHandle>>),
}

impl Handler<ClaimChat> for ClusterNode {
    type Result = ResponseActFuture<Self, Result<Claimed, String>>;

    fn handle(&mut self, ClaimChat(chat_id): ClaimChat, ctx: &mut Self::Context) -> Self::Result {
        if let Some(claims) = self.parking.get_mut(&chat_id) {
            // Handed over a moment ago, its park still queued: claimed once it is parked.
            let (parked, wait) = oneshot::channel();
            claims.push(parked);
            let node = ctx.address();
            return Box::pin(fut::wrap_future(async move {
                let _ = wait.await;
                claim_through(&node, chat_id).await
            }));
        }
        if let Some(owned) = self.owned.get(&chat_id) {
            if owned.chat.addr.connected() {
                return Box::pin(fut::ready(Ok(Claimed::Local(owned.chat.clone()))));
            }
            // It left memory and the sweep has not parked its lease yet: rebuilt below under
            // the lease this node still holds, which the sweep must not park meanwhile.
            self.forget(&chat_id);
        }
        let (Some(leases), false) = (self.leases.clone(), self.draining) else {
            return Box::pin(fut::ready(Ok(Claimed::Remote)));
        };
        let acquire = async move {
            leases
                .send(ClaimLease {
                    chat_id: chat_id.clone(),
                })
                .await
                .map(|lease| (chat_id, lease))
        };
        Box::pin(
            acquire
                .into_actor(self)
                .map(|acquired, act, ctx| match acquired {
                    Err(_) => ClaimStep::Done(Err("the lease manager stopped".into())),
                    Ok((_, Err(e))) => ClaimStep::Done(Err(e.to_string())),
                    Ok((_, Ok(None))) => ClaimStep::Done(Ok(Claimed::Remote)),
                    Ok((chat_id, Ok(Some(claim)))) => {
                        if let Some(owned) = act.owned.get(&chat_id)
                            && owned.chat.addr.connected()
                        {
                            return ClaimStep::Done(Ok(Claimed::Local(owned.chat.clone())));
                        }
                        let (tx, rx) = oneshot::channel();
                        act.restore(chat_id, claim.epoch, claim.was_parked, Some(tx), ctx);
                        ClaimStep::Wait(rx)
                    }
                })
                .then(|step, _, _| {
                    fut::wrap_future::<_, Self>(async move {
                        match step {
                            ClaimStep::Done(result) => result,
                            ClaimStep::Wait(rx) => Ok(match rx.await {
                                Ok(Some(chat)) => Claimed::Local(chat),
                                _ => Claimed::NotOpen,
                            }),
                        }
                    })
                }),
        )
    }
}

/// Serve here a chat another node serves, for a client's socket that reached this node: ask
/// its owner to hand it over ([`RemoteChat::ask_owner_to_hand_over`]) and, once its lease is
/// parked, claim it ([`ClaimChat`]). `Remote` while this node drains (it could not claim the
/// chat, which would stay parked) or when the owner keeps the chat.
#[derive(Message)]
#[rtype(result = "Result<Claimed, String>")]
pub struct ClaimFromOwner(pub RemoteChat);

impl Handler<ClaimFromOwner> for ClusterNode {
    type Result = ResponseFuture<Result<Claimed, String>>;

    fn handle(
        &mut self,
        ClaimFromOwner(remote): ClaimFromOwner,
        ctx: &mut Self::Context,
    ) -> Self::Result {
        if self.draining || self.leases.is_none() {
            return Box::pin(async { Ok(Claimed::Remote) });
        }
        let node = ctx.address();
        Box::pin(async move {
            if !remote.ask_owner_to_hand_over().await {
                return Ok(Claimed::Remote);
            }
            claim_through(&node, remote.chat_id.to_string()).await
        })
    }
}

/// [`ClaimChat`] through `node`'s mailbox (from a future of its own).
async fn claim_through(node: &Addr<ClusterNode>, chat_id: String) -> Result<Claimed, String> {
    node.send(ClaimChat(chat_id))
        .await
        .map_err(|_| "the node stopped".to_owned())?
}

/// A chat's session left this node's memory for the node a client's socket reached (see
/// [`ChatRelay::hand_over`]): park its lease (with the next batch of parks) and answer once
/// parked. `false` (nothing parked) when this node serves the chat again meanwhile (its own
/// client claimed it back).
#[derive(Message)]
#[rtype(result = "bool")]
pub struct HandedOver {
    pub chat_id: String,
    /// The session that left.
    pub session: Addr<tessera_engine::session::ChatSession>,
}

impl Handler<HandedOver> for ClusterNode {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, msg: HandedOver, ctx: &mut Self::Context) -> Self::Result {
        let HandedOver { chat_id, session } = msg;
        let still_ours = match self.owned.get(&chat_id) {
            Some(owned) => owned.chat.addr == session,
            // Taken out by the sweep (which parked it), or being rebuilt by a claim here.
            None => !self.restoring.contains_key(&chat_id) && !self.parking.contains_key(&chat_id),
        };
        if !still_ours || self.leases.is_none() {
            return Box::pin(async { false });
        }
        self.forget(&chat_id);
        let (parked, answer) = oneshot::channel();
        self.parking.insert(chat_id.clone(), Vec::new());
        self.parks_queued.push((chat_id, parked));
        self.park_next_batch(ctx);
        Box::pin(async move { answer.await.unwrap_or(false) })
    }
}

impl ClusterNode {
    /// Parks the leases of the chats handed over since the last batch, in one store call,
    /// unless one runs (it starts the next when done). One call per chat queued a burst of a
    /// thousand moves behind each other for seconds: each holds the lease manager's mailbox.
    fn park_next_batch(&mut self, ctx: &mut Context<Self>) {
        if self.park_running || self.parks_queued.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.parks_queued);
        let Some(leases) = self.leases.clone() else {
            for (chat_id, waiter) in batch {
                let _ = waiter.send(false);
                self.claims_after_park(&chat_id);
            }
            return;
        };
        self.park_running = true;
        let chat_ids = batch.iter().map(|(chat_id, _)| chat_id.clone()).collect();
        let park = async move { leases.send(ParkLeases { chat_ids }).await.unwrap_or(false) };
        ctx.spawn(park.into_actor(self).map(move |parked, act, ctx| {
            act.park_running = false;
            if parked {
                act.bus
                    .metrics()
                    .chats_handed_over
                    .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            for (chat_id, waiter) in batch {
                let _ = waiter.send(parked);
                act.claims_after_park(&chat_id);
            }
            act.park_next_batch(ctx);
        }));
    }

    /// Lets the claims of `chat_id` that waited for its park go on.
    fn claims_after_park(&mut self, chat_id: &str) {
        for claim in self.parking.remove(chat_id).unwrap_or_default() {
            let _ = claim.send(());
        }
    }
}

/// Take the lease of a chat about to be created here; its epoch, or `None` when this node
/// takes no new chats (draining).
#[derive(Message)]
#[rtype(result = "Result<Option<i64>, String>")]
pub struct LeaseNewChat(pub String);

impl Handler<LeaseNewChat> for ClusterNode {
    type Result = ResponseFuture<Result<Option<i64>, String>>;

    fn handle(
        &mut self,
        LeaseNewChat(chat_id): LeaseNewChat,
        _: &mut Self::Context,
    ) -> Self::Result {
        let (Some(leases), false) = (self.leases.clone(), self.draining) else {
            return Box::pin(async { Ok(None) });
        };
        Box::pin(async move {
            leases
                .send(AcquireLease { chat_id })
                .await
                .map_err(|_| "the lease manager stopped".to_owned())?
                .map_err(|e| e.to_string())
        })
    }
}

/// Serve a chat started here under the lease `epoch` (see [`LeaseNewChat`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ServeChat {
    pub chat: ChatHandle,
    pub epoch: i64,
}

impl Handler<ServeChat> for ClusterNode {
    type Result = ();

    fn handle(&mut self, msg: ServeChat, ctx: &mut Self::Context) {
        self.serve(msg.chat, msg.epoch, false, ctx);
    }
}

/// Graceful drain: take no more chats, release every lease (other nodes take the chats over
/// on their next scan) and stop the chats here; answers how many leases were released.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct DrainNode;

impl Handler<DrainNode> for ClusterNode {
    type Result = ResponseActFuture<Self, usize>;

    fn handle(&mut self, _: DrainNode, _: &mut Self::Context) -> Self::Result {
        self.draining = true;
        let leases = self.leases.clone();
        let drain = async move {
            match leases {
                Some(leases) => leases
                    .send(Drain)
                    .await
                    .map_or(0, |released| released.len()),
                None => 0,
            }
        };
        Box::pin(drain.into_actor(self).map(|released, act, _| {
            // After the release: a write already under way is durable before a new owner's
            // takeover, and anything later is fenced.
            let chats: Vec<String> = act.owned.keys().cloned().collect();
            for chat_id in chats {
                act.drop_chat(&chat_id);
            }
            released
        }))
    }
}

impl Handler<tessera_cluster::OwnershipChange> for ClusterNode {
    type Result = ();

    fn handle(&mut self, change: tessera_cluster::OwnershipChange, ctx: &mut Self::Context) {
        use tessera_cluster::OwnershipChange;
        match change {
            OwnershipChange::TakenOver { chat_id, epoch } => {
                if self.owned.contains_key(&chat_id) {
                    return;
                }
                self.restore(chat_id, epoch, false, None, ctx);
            }
            OwnershipChange::Lost { chat_id, epoch } => {
                if self.drop_chat(&chat_id).is_some() {
                    tracing::warn!(chat_id = %chat_id, epoch, "chat lost to another node");
                }
            }
        }
    }
}

/// Stop relaying (the chat left this node).
#[derive(Message)]
#[rtype(result = "()")]
struct StopRelay;

impl Handler<StopRelay> for ChatRelay {
    type Result = ();

    fn handle(&mut self, _: StopRelay, ctx: &mut Self::Context) {
        let Some(mut commands) = self.commands.take() else {
            ctx.stop();
            return;
        };
        // Stops once its command stream ends, every command that reached it answered: under
        // load a command forwarded while the chat left (a hand-over under way, say) waits in
        // the stream, and dropped it would leave its forwarder to time out.
        self.leaving = true;
        commands.drain();
        ctx.run_later(DRAIN_LIMIT, |_, ctx| ctx.stop());
    }
}

/// The longest a relay that stops waits for its command stream to end (a NATS connection
/// lost meanwhile would never end it).
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a socket reaching a node that does not own its chat waits for the owner to hand
/// the chat over (a flush, a park and a NATS round trip; a few milliseconds).
pub const HAND_OVER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// First wait before forwarding a command again when no node serves the chat.
const NO_OWNER_FIRST_RETRY: std::time::Duration = std::time::Duration::from_millis(50);
/// Longest wait between such retries.
const NO_OWNER_MAX_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// Why a command did not reach the chat's owner (it may be retried).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardError {
    /// No node served the chat within the patience (its owner died and its lease has not
    /// expired yet, or a takeover is under way).
    NoOwner,
    /// The owner did not answer in time (slow or paused); it may have carried the command out.
    Timeout,
    /// NATS failed.
    Bus,
}

/// The refusal code of a command that reached a relay after its chat left memory: carried
/// out by nobody, so the forwarder retries as for "no responders" (not a client-facing code).
const LEFT_OWNER: &str = "chat_left_owner";

fn refused_as_left_owner() -> CommandReply {
    refusal(LEFT_OWNER, "the chat left its owner's memory; retry")
}

fn refused(code: ErrorCode, message: impl ToString) -> CommandReply {
    refusal(code.as_str(), message)
}

/// A refusal with `code`, without an HTTP status (a command no REST client sent).
fn refusal(code: &str, message: impl ToString) -> CommandReply {
    CommandReply::Refused {
        code: code.to_owned(),
        message: message.to_string(),
        status: None,
    }
}

/// A chat another node owns, as a socket on this node uses it: its events come through a
/// [`RemoteFeed`], its commands are forwarded to the owner over NATS.
#[derive(Clone)]
pub struct RemoteChat {
    pub chat_id: Arc<str>,
    bus: ClusterBus,
    store: Arc<dyn tessera_store::ChatStore>,
    node: Addr<ClusterNode>,
    /// How long a command waits for some node to serve the chat (a takeover under way).
    patience: std::time::Duration,
    /// A socket may take the chat over from its owner ([`RemoteChat::claim_here`]).
    hand_over: bool,
}

impl RemoteChat {
    /// Chat `chat_id`, followed over `bus` and read from `store`; `patience` bounds the wait
    /// for a takeover (at least the lease TTL plus a scan).
    pub fn new(
        chat_id: Arc<str>,
        bus: ClusterBus,
        store: Arc<dyn tessera_store::ChatStore>,
        node: Addr<ClusterNode>,
        patience: std::time::Duration,
    ) -> Self {
        Self {
            chat_id,
            bus,
            store,
            node,
            patience,
            hand_over: false,
        }
    }

    /// The same chat, which a socket may take over from its owner when `hand_over`
    /// (`cluster.hand_over_sockets`, see [`RemoteChat::claim_here`]).
    pub fn handing_over(mut self, hand_over: bool) -> Self {
        self.hand_over = hand_over;
        self
    }

    /// For a client's socket on this node: takes the chat over from its owner, if hand-overs
    /// are on and the owner lets it go (see [`ClaimFromOwner`]). `None` when it stays there.
    pub async fn claim_here(&self) -> Option<ChatHandle> {
        if !self.hand_over {
            return None;
        }
        match self.node.send(ClaimFromOwner(self.clone())).await {
            Ok(Ok(Claimed::Local(chat))) => Some(chat),
            _ => None,
        }
    }

    /// The same chat, with commands waiting at most `patience` for a node to serve it (REST
    /// answers a retryable error sooner than a socket, which the client keeps open).
    pub fn with_patience(mut self, patience: std::time::Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Forwards `command` to the chat's owner and returns its answer, refusals included, the
    /// way a socket reports them.
    pub async fn forward(&self, command: ChatCommand) -> CommandReply {
        match self.send(command).await {
            Ok(reply) => reply,
            Err(ForwardError::Timeout) => refused(
                ErrorCode::Internal,
                "the chat's node did not answer in time; check the chat and retry",
            ),
            Err(ForwardError::NoOwner | ForwardError::Bus) => {
                refused(ErrorCode::Internal, "no node serves the chat right now")
            }
        }
    }

    /// Sends `command` to the chat's owner and waits for its answer. "No responders" (no node
    /// serves the chat: its owner died, is handing it over, or parked it idle) and a refusal
    /// because the chat just left its owner's memory are retried until `patience` runs out,
    /// offering to take the chat over here each time; a timeout is not retried (the owner may
    /// have carried the command out).
    pub async fn send(&self, command: ChatCommand) -> Result<CommandReply, ForwardError> {
        let deadline = std::time::Instant::now() + self.patience;
        let mut delay = NO_OWNER_FIRST_RETRY;
        loop {
            let sent = match self.bus.send_command(&self.chat_id, &command).await {
                Ok(CommandReply::Refused { code, .. }) if code == LEFT_OWNER => {
                    Err(ClusterError::NoOwner(self.chat_id.to_string()))
                }
                sent => sent,
            };
            match sent {
                Ok(reply) => return Ok(reply),
                Err(ClusterError::NoOwner(_)) => {
                    let now = std::time::Instant::now();
                    if now >= deadline {
                        return Err(ForwardError::NoOwner);
                    }
                    // Takes an orphan over here; a no-op while another node holds the lease.
                    let _ = self.node.send(ClaimChat(self.chat_id.to_string())).await;
                    actix_rt::time::sleep(delay.min(deadline - now)).await;
                    delay = (delay * 2).min(NO_OWNER_MAX_RETRY);
                }
                Err(ClusterError::Timeout(_)) => return Err(ForwardError::Timeout),
                Err(e) => {
                    tracing::warn!(chat_id = %self.chat_id, error = %e, "command not forwarded");
                    return Err(ForwardError::Bus);
                }
            }
        }
    }

    /// Asks the chat's owner to hand it over ([`ChatCommand::HandOver`]), for a socket that
    /// reached this node: `true` once its lease is parked, for this node to claim. The owner
    /// refuses while someone there watches the chat, or while it runs; an owner of an older
    /// build does not answer, and [`HAND_OVER_WAIT`] bounds the socket's wait for it.
    pub async fn ask_owner_to_hand_over(&self) -> bool {
        let deadline = std::time::Instant::now() + HAND_OVER_WAIT;
        let mut delay = NO_OWNER_FIRST_RETRY;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self
                .bus
                .send_command_within(&self.chat_id, &ChatCommand::HandOver, left)
                .await
            {
                Ok(CommandReply::Accepted) => return true,
                Ok(_) => return false,
                // A chat created a moment ago whose relay does not serve commands yet (or an
                // owner gone whose lease has not expired): asked again until the wait is over.
                Err(ClusterError::NoOwner(_)) if left > delay => {
                    actix_rt::time::sleep(delay).await;
                    delay = (delay * 2).min(NO_OWNER_MAX_RETRY);
                }
                Err(e) => {
                    tracing::debug!(chat_id = %self.chat_id, error = %e, "no hand-over");
                    return false;
                }
            }
        }
    }

    /// Sends a command that makes the chat's owner stream frames back (an AG-UI run) and
    /// returns the frames, or the owner's answer when it did not accept; `make_command` builds
    /// the command from the inbox the frames go to (subscribed before the command is sent).
    pub async fn stream(
        &self,
        make_command: impl FnOnce(String) -> ChatCommand,
    ) -> Result<
        Result<futures::stream::BoxStream<'static, NumberedFrame>, CommandReply>,
        ForwardError,
    > {
        let (inbox, frames) = self.bus.open_stream().await.map_err(|e| {
            tracing::warn!(chat_id = %self.chat_id, error = %e, "cannot open a stream");
            ForwardError::Bus
        })?;
        match self.send(make_command(inbox)).await? {
            CommandReply::Accepted => Ok(Ok(Box::pin(frames))),
            other => Ok(Err(other)),
        }
    }

    /// Starts feeding `recipient` every event after `after_seq`, telling `waits` when the
    /// chat waits on its user if the socket may take the chat over (see
    /// [`RemoteChat::claim_here`]).
    pub fn feed(
        &self,
        after_seq: u64,
        recipient: Recipient<Deliver>,
        waits: Recipient<ChatWaitsOnUser>,
    ) -> Addr<RemoteFeed> {
        let feed = RemoteFeed::new(
            self.chat_id.to_string(),
            after_seq,
            self.store.clone(),
            self.bus.clone(),
            recipient,
        );
        if self.hand_over {
            feed.telling_when_it_waits_on_user(waits).start()
        } else {
            feed.start()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Followers, INPUT_REQUEST_ENVELOPE};
    use std::time::{Duration, Instant};

    #[test]
    fn an_input_request_envelope_starts_as_the_feed_looks_for_it() {
        let event = tessera_protocol::ServerEvent::InputRequest { agent: "A".into() };
        let text = tessera_protocol::Envelope {
            seq: 3,
            chat_id: "c",
            timestamp: "t",
            event: &event,
        }
        .to_json();
        assert!(
            text.as_bytes().starts_with(INPUT_REQUEST_ENVELOPE),
            "{text}"
        );
    }

    #[test]
    fn a_node_follows_beside_another_only_while_its_follow_lasts() {
        let now = Instant::now();
        let mut followers = Followers::default();
        followers.follow(Some("b".into()), now + Duration::from_secs(60));
        assert!(!followers.followed_beside(Some("b"), now));
        assert!(followers.followed_beside(Some("c"), now));
        // An unnamed sender could be any node.
        assert!(followers.followed_beside(None, now));

        followers.follow(Some("c".into()), now + Duration::from_secs(1));
        assert!(followers.followed_beside(Some("b"), now));
        assert!(!followers.followed_beside(Some("b"), now + Duration::from_secs(2)));
        assert_eq!(followers.until(), Some(now + Duration::from_secs(60)));
    }

    #[test]
    fn a_follower_that_names_no_node_could_be_any() {
        let now = Instant::now();
        let mut followers = Followers::default();
        followers.follow(None, now + Duration::from_secs(60));
        assert!(followers.followed_beside(Some("b"), now));
    }

    #[test]
    fn a_renewal_replaces_the_node_s_last_follow() {
        let now = Instant::now();
        let mut followers = Followers::default();
        followers.follow(Some("b".into()), now + Duration::from_secs(60));
        followers.follow(Some("b".into()), now + Duration::from_secs(30));
        assert_eq!(followers.until(), Some(now + Duration::from_secs(30)));
    }
}
