//! The WebSocket transport: one `WsConnection` actor per socket, forwarding client frames to
//! the chat's `ChatSession` and the session's events to the socket.
//!
//! This is the only module that uses `actix-web-actors` (deprecated upstream in favour of
//! `actix-ws`), so moving to `actix-ws` is a change to this file alone.
//!
//! Limits (see `SECURITY.md`): a soft frame limit (`chat.error` `frame_too_large`, the socket
//! stays open) and a hard one at 4× (close 1009); a message budget per connection and per
//! tenant (`chat.error` `rate_limited`, then close 1008 after `rate_limit_strikes` refusals
//! in a minute); a bounded outbound queue (close 1008 for a client that does not read); and
//! an idle timeout driven by ping/pong (close 1001). No extension (permessage-deflate) is
//! ever negotiated.
//!
//! WHY an [`Outbox`] actor: `WebsocketContext` buffers writes without bound, and the
//! connection actor only runs when the HTTP dispatcher polls the response body — which it
//! stops doing while the peer does not read. Chat events therefore go to a separate small
//! actor that keeps running, counts the backlog, and cuts off a connection whose backlog stays
//! over the limit.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_web::{HttpRequest, HttpResponse, web};
use actix_web_actors::ws;
use tessera_engine::session::{
    CancelRun, Deliver, Subscribe, SubscribeQuietly, ToolAnswer, Unsubscribe, UserInput,
};
use tessera_engine::{ChatHandle, ChatIdJson, envelope_string};
use tessera_protocol::{ClientMessage, ErrorCode, ServerEvent, parse_client_frame};

use crate::config::Limits;
use crate::frame_guard::{FrameGuard, GuardVerdict, Violation};
use crate::limits::{BudgetCheck, TenantBudget};
use crate::metrics::Metrics;

/// The longest beat of a connection's heartbeat (see [`beat_for`], [`heartbeat`]).
const HEARTBEAT: Duration = Duration::from_secs(15);
/// How long the outbox lets a backlog over the limit last: still over the limit this long
/// after it went over, the client is disconnected (a burst, such as a long replay, drains).
///
/// WHY a check armed when the backlog goes over, not a timer per connection: with 10,000
/// sockets, a 1-second timer each woke 10,000 actors a second for nothing.
const OUTBOX_CHECK: Duration = Duration::from_secs(1);

/// What every connection shares with the server.
pub struct ConnectionShared {
    /// Configured limits.
    pub limits: Arc<Limits>,
    /// Process counters.
    pub metrics: Arc<Metrics>,
    /// Open sockets, for shutdown.
    pub hub: Addr<ConnectionHub>,
    /// The tenant-wide message budget (this node's, or the deployment's in cluster mode).
    pub tenant_budget: Arc<TenantBudget>,
    /// The caller's tenant.
    pub tenant: Arc<str>,
}

/// Tracks open sockets so shutdown can close them with "going away" (1001).
#[derive(Default)]
pub struct ConnectionHub {
    open: std::collections::HashMap<u64, Addr<WsConnection>>,
    next: u64,
}

impl Actor for ConnectionHub {
    type Context = Context<Self>;
}

/// A socket opened.
#[derive(Message)]
#[rtype(result = "u64")]
struct Join(Addr<WsConnection>);

/// A socket closed.
#[derive(Message)]
#[rtype(result = "()")]
struct Leave(u64);

/// Close every socket with 1001; answers how many were open.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct CloseAll;

/// Sent to one socket on shutdown.
#[derive(Message)]
#[rtype(result = "()")]
struct GoingAway;

impl Handler<Join> for ConnectionHub {
    type Result = u64;
    fn handle(&mut self, Join(addr): Join, _: &mut Self::Context) -> u64 {
        self.next += 1;
        self.open.insert(self.next, addr);
        self.next
    }
}

impl Handler<Leave> for ConnectionHub {
    type Result = ();
    fn handle(&mut self, Leave(id): Leave, _: &mut Self::Context) {
        self.open.remove(&id);
    }
}

impl Handler<CloseAll> for ConnectionHub {
    type Result = usize;
    fn handle(&mut self, _: CloseAll, _: &mut Self::Context) -> usize {
        let count = self.open.len();
        for (_, addr) in self.open.drain() {
            addr.do_send(GoingAway);
        }
        count
    }
}

/// Events waiting for one connection, shared by its [`Outbox`] (producer) and its
/// [`WsConnection`] (consumer).
#[derive(Default)]
struct OutboxQueue {
    items: VecDeque<Arc<str>>,
    /// A `Flush` is on its way to the connection.
    flush_pending: bool,
    /// The connection was cut off; nothing more is queued.
    closed: bool,
}

type SharedQueue = Arc<Mutex<OutboxQueue>>;

fn lock(queue: &SharedQueue) -> std::sync::MutexGuard<'_, OutboxQueue> {
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

/// Receives a chat's events for one connection and bounds its backlog (see the module doc).
pub struct Outbox {
    conn: Addr<WsConnection>,
    queue: SharedQueue,
    limit: usize,
    /// A backlog check is scheduled (the backlog went over the limit).
    check_armed: bool,
    metrics: Arc<Metrics>,
}

/// The connection should move the queued events to its socket.
#[derive(Message)]
#[rtype(result = "()")]
struct Flush;

/// The connection fell too far behind: close it.
#[derive(Message)]
#[rtype(result = "()")]
struct SlowConsumer;

/// The connection ended: stop the outbox.
#[derive(Message)]
#[rtype(result = "()")]
struct StopOutbox;

impl Actor for Outbox {
    type Context = Context<Self>;
}

impl Outbox {
    fn cut_off(&mut self, backlog: usize, ctx: &mut Context<Self>) {
        {
            let mut queue = lock(&self.queue);
            queue.closed = true;
            queue.items = VecDeque::new();
        }
        self.metrics
            .ws_slow_consumers
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            backlog,
            limit = self.limit,
            "websocket client does not read; disconnecting it"
        );
        self.conn.do_send(SlowConsumer);
        ctx.stop();
    }
}

impl Handler<Deliver> for Outbox {
    type Result = ();

    fn handle(&mut self, Deliver(batch): Deliver, ctx: &mut Self::Context) {
        let backlog = {
            let mut queue = lock(&self.queue);
            if queue.closed {
                return;
            }
            queue.items.extend(batch);
            if !queue.flush_pending {
                queue.flush_pending = true;
                self.conn.do_send(Flush);
            }
            queue.items.len()
        };
        if backlog > self.limit && !self.check_armed {
            self.check_armed = true;
            ctx.run_later(OUTBOX_CHECK, |act, ctx| {
                act.check_armed = false;
                let backlog = lock(&act.queue).items.len();
                if backlog > act.limit {
                    act.cut_off(backlog, ctx);
                }
            });
        }
    }
}

impl Handler<StopOutbox> for Outbox {
    type Result = ();

    fn handle(&mut self, _: StopOutbox, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// Where a socket's chat runs: on this node, or (in a cluster) on another node, followed and
/// driven over NATS.
pub enum ChatLink {
    Local(ChatHandle),
    Remote(crate::cluster::RemoteChat),
}

impl ChatLink {
    /// The chat's id.
    pub fn chat_id(&self) -> &Arc<str> {
        match self {
            Self::Local(chat) => &chat.identity.chat_id,
            Self::Remote(remote) => &remote.chat_id,
        }
    }
}

/// One client socket of one chat.
pub struct WsConnection {
    chat: ChatLink,
    chat_id: Arc<str>,
    /// `chat_id` as JSON text, for the socket's own events (acks, errors).
    chat_id_json: ChatIdJson,
    after_seq: u64,
    subscription: Option<u64>,
    /// The feed of a remote chat's events (instead of `subscription`).
    remote_feed: Option<Addr<crate::cluster::RemoteFeed>>,
    /// A remote chat's owner was asked to hand it over with the user's first message (see
    /// [`WsConnection::take_chat_here`]); once per socket.
    asked_for_the_chat: bool,
    limits: Arc<Limits>,
    metrics: Arc<Metrics>,
    tenant_budget: Arc<TenantBudget>,
    tenant: Arc<str>,
    last_heard: Instant,
    window_start: Instant,
    window_count: u32,
    /// Frames refused as `rate_limited` in the current window.
    strikes: u32,
    hub: Addr<ConnectionHub>,
    hub_id: Option<u64>,
    queue: SharedQueue,
    /// The queue's events being written to the socket (kept, empty, between flushes).
    draining: VecDeque<Arc<str>>,
    outbox: Option<Addr<Outbox>>,
    /// Set when the inbound [`FrameGuard`] ended the stream.
    guard: GuardVerdict,
    /// We pinged and no pong came back yet: that one pong is free (heartbeats of many idle
    /// sockets must not eat the tenant's budget); any other pong is a frame like the rest.
    pong_expected: bool,
    /// The upgrade request's W3C trace context: parent of every turn this socket starts.
    trace_parent: Option<tessera_telemetry::RemoteParent>,
}

impl WsConnection {
    /// A connection that first replays the chat's events after `after_seq`.
    pub fn new(chat: ChatLink, after_seq: u64, shared: ConnectionShared) -> Self {
        let now = Instant::now();
        Self {
            chat_id: chat.chat_id().clone(),
            chat_id_json: ChatIdJson::new(chat.chat_id()),
            chat,
            after_seq,
            subscription: None,
            remote_feed: None,
            asked_for_the_chat: false,
            limits: shared.limits,
            metrics: shared.metrics,
            tenant_budget: shared.tenant_budget,
            tenant: shared.tenant,
            last_heard: now,
            window_start: now,
            window_count: 0,
            strikes: 0,
            hub: shared.hub,
            hub_id: None,
            queue: SharedQueue::default(),
            draining: VecDeque::new(),
            outbox: None,
            guard: GuardVerdict::default(),
            pong_expected: false,
            trace_parent: None,
        }
    }

    /// Ends the current subscription (local) or feed (remote).
    fn unsubscribe(&mut self) {
        if let (Some(old), ChatLink::Local(chat)) = (self.subscription.take(), &self.chat) {
            chat.addr.do_send(Unsubscribe(old));
        }
        if let Some(feed) = self.remote_feed.take() {
            feed.do_send(crate::cluster::StopFeed);
        }
    }

    fn subscribe(&mut self, after_seq: u64, ctx: &mut ws::WebsocketContext<Self>) {
        self.subscribe_after(after_seq, true, ctx);
    }

    /// Subscribes after `after_seq`; with `greet`, the replay opens with `chat.session` and
    /// ends with `chat.resume_boundary` (see [`SubscribeQuietly`]).
    fn subscribe_after(
        &mut self,
        after_seq: u64,
        greet: bool,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        self.unsubscribe();
        let Some(outbox) = &self.outbox else {
            return;
        };
        let chat = match &self.chat {
            ChatLink::Local(chat) => chat,
            ChatLink::Remote(remote) => {
                self.remote_feed = Some(remote.feed(
                    after_seq,
                    outbox.clone().recipient(),
                    ctx.address().recipient(),
                ));
                return;
            }
        };
        let recipient = outbox.clone().recipient();
        let request = if greet {
            futures::future::Either::Left(chat.addr.send(Subscribe {
                recipient,
                after_seq,
            }))
        } else {
            futures::future::Either::Right(chat.addr.send(SubscribeQuietly {
                recipient,
                after_seq,
            }))
        };
        ctx.wait(
            request
                .into_actor(self)
                .map(|result, act, ctx| match result {
                    Ok(id) => act.subscription = Some(id),
                    Err(_) => {
                        tracing::warn!(chat_id = %act.chat_id, "cannot subscribe: the chat is not running");
                        act.send_error(ctx, ErrorCode::Internal, "the chat is not running", false);
                        ctx.close(Some(ws::CloseReason {
                            code: ws::CloseCode::Error,
                            description: Some("chat unavailable".into()),
                        }));
                        ctx.stop();
                    }
                }),
        );
    }

    /// Sends a connection-scoped event (seq 0).
    fn send_direct(&self, ctx: &mut ws::WebsocketContext<Self>, event: &ServerEvent) {
        ctx.text(envelope_string(0, &self.chat_id_json, event));
    }

    fn send_error(
        &self,
        ctx: &mut ws::WebsocketContext<Self>,
        code: ErrorCode,
        message: impl Into<String>,
        recoverable: bool,
    ) {
        self.metrics.ws_errors.fetch_add(1, Ordering::Relaxed);
        self.send_direct(ctx, &ServerEvent::error(code, message, recoverable));
    }

    fn ack(&self, ctx: &mut ws::WebsocketContext<Self>, kind: &str, client_msg_id: Option<String>) {
        self.send_direct(
            ctx,
            &ServerEvent::Ack {
                kind: kind.to_owned(),
                client_msg_id,
            },
        );
    }

    /// Counts a frame against the connection's per-minute budget; false when over it.
    fn within_connection_rate(&mut self) -> bool {
        if self.window_start.elapsed() >= Duration::from_secs(60) {
            self.window_start = Instant::now();
            self.window_count = 0;
            self.strikes = 0;
        }
        self.window_count = self.window_count.saturating_add(1);
        self.window_count <= self.limits.messages_per_minute
    }

    /// Closes the socket with `code` and stops the actor.
    fn close_with(
        &self,
        ctx: &mut ws::WebsocketContext<Self>,
        code: ws::CloseCode,
        why: &'static str,
    ) {
        ctx.close(Some(ws::CloseReason {
            code,
            description: Some(why.into()),
        }));
        ctx.stop();
    }

    /// Acts on the budgets' verdict on one inbound frame. Over budget: `rate_limited`, and
    /// after `rate_limit_strikes` refusals in a minute a 1008 close; false then.
    fn admit_frame(&mut self, within_budgets: bool, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        if within_budgets {
            return true;
        }
        self.strikes = self.strikes.saturating_add(1);
        self.metrics.ws_rate_limited.fetch_add(1, Ordering::Relaxed);
        if self.strikes >= self.limits.rate_limit_strikes.max(1) {
            tracing::warn!(chat_id = %self.chat_id, "closing a websocket that keeps exceeding its rate limit");
            self.close_with(ctx, ws::CloseCode::Policy, "rate limit exceeded");
        } else {
            self.send_error(
                ctx,
                ErrorCode::RateLimited,
                "too many messages; slow down",
                true,
            );
        }
        false
    }

    fn on_text(&mut self, text: &str, ctx: &mut ws::WebsocketContext<Self>) {
        if text.len() > self.limits.max_frame_bytes {
            let err = tessera_protocol::FrameError::TooLarge {
                size: text.len(),
                limit: self.limits.max_frame_bytes,
            };
            self.send_error(ctx, err.code(), err.to_string(), true);
            return;
        }
        let message = match parse_client_frame(text) {
            Ok(message) => message,
            Err(err) => {
                self.send_error(ctx, err.code(), err.to_string(), true);
                return;
            }
        };
        match &self.chat {
            ChatLink::Local(_) => self.carry_out(message, ctx),
            ChatLink::Remote(remote) => {
                let remote = remote.clone();
                if !self.asked_for_the_chat && matches!(message, ClientMessage::UserMessage { .. })
                {
                    self.take_chat_here(remote, Some(message), ctx);
                } else {
                    self.forward(remote, message, ctx);
                }
            }
        }
    }

    /// Carries out a client frame on the chat's session here.
    fn carry_out(&mut self, message: ClientMessage, ctx: &mut ws::WebsocketContext<Self>) {
        // Borrowed, not cloned: cloning an actix address allocates (a sender task of its own).
        let ChatLink::Local(chat) = &self.chat else {
            return;
        };
        let chat = &chat.addr;
        match message {
            ClientMessage::UserMessage {
                content,
                client_msg_id,
            } => {
                let request = crate::telemetry::send_input(
                    chat,
                    UserInput {
                        content,
                        client_msg_id: client_msg_id.clone(),
                    },
                    self.trace_parent.clone(),
                );
                ctx.spawn(
                    request
                        .into_actor(self)
                        .map(move |result, act, ctx| match result {
                            Ok(Ok(())) => act.ack(ctx, "user_message", client_msg_id),
                            Ok(Err(err)) => act.send_error(ctx, err.code(), err.to_string(), true),
                            Err(_) => act.send_error(
                                ctx,
                                ErrorCode::Internal,
                                "the chat is not running",
                                false,
                            ),
                        }),
                );
            }
            ClientMessage::ToolResponse(frame) => {
                let corr = frame.corr.clone();
                let request = chat.send(ToolAnswer {
                    corr: frame.corr,
                    response: frame.raw,
                });
                ctx.spawn(
                    request
                        .into_actor(self)
                        .map(move |result, act, ctx| match result {
                            Ok(Ok(())) => act.ack(ctx, "tool_response", Some(corr)),
                            Ok(Err(err)) => act.send_error(ctx, err.code(), err.to_string(), true),
                            Err(_) => act.send_error(
                                ctx,
                                ErrorCode::Internal,
                                "the chat is not running",
                                false,
                            ),
                        }),
                );
            }
            ClientMessage::Resume { last_seq } => self.subscribe(last_seq, ctx),
            ClientMessage::Cancel => {
                chat.do_send(CancelRun);
                self.ack(ctx, "cancel", None);
            }
            ClientMessage::Ping => self.ack(ctx, "pong", None),
        }
    }

    /// Asks, once per socket, for a chat another node serves, when it waits on its user: when
    /// the feed shows it asking (`ChatWaitsOnUser`), or else with the user's first `message`.
    /// Its owner then hands it over unless someone there (or on a third node) watches it: an
    /// `AgentDriven` chat runs its first turn when it is created, so its socket most often
    /// finds it running and stays remote when it connects. Once the chat is here, the socket
    /// moves from its feed to the session, after the last event the feed gave it (without a
    /// second greeting), and the message goes to the session. Otherwise it is forwarded.
    /// Frames wait meanwhile (`ctx.wait`), keeping their order.
    fn take_chat_here(
        &mut self,
        remote: crate::cluster::RemoteChat,
        message: Option<ClientMessage>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        self.asked_for_the_chat = true;
        let feed = self.remote_feed.clone();
        let claim = {
            let remote = remote.clone();
            async move {
                let chat = remote.claim_here().await?;
                let stopped = match feed {
                    Some(feed) => feed.send(crate::cluster::StopFeed).await.ok(),
                    None => None,
                };
                Some((chat, stopped))
            }
        };
        ctx.wait(
            claim
                .into_actor(self)
                .map(move |claimed, act, ctx| match claimed {
                    Some((chat, stopped)) => {
                        tracing::debug!(chat_id = %act.chat_id, "the socket's chat moved here");
                        act.remote_feed = None;
                        act.chat = ChatLink::Local(chat);
                        match stopped {
                            // Greeted by the feed: not again.
                            Some(at) => act.subscribe_after(at.through, !at.greeted, ctx),
                            // No feed (it could not subscribe): as a resume would.
                            None => act.subscribe(act.after_seq, ctx),
                        }
                        if let Some(message) = message {
                            act.carry_out(message, ctx);
                        }
                    }
                    None => {
                        if let Some(message) = message {
                            act.forward(remote, message, ctx);
                        }
                    }
                }),
        );
    }

    /// Carries out a client frame for a chat another node owns: commands go to the owner over
    /// NATS and are acked (or refused) as the owner answers.
    fn forward(
        &mut self,
        remote: crate::cluster::RemoteChat,
        message: ClientMessage,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        use tessera_cluster::{ChatCommand, CommandReply};
        let (command, kind, ack_id) = match message {
            ClientMessage::UserMessage {
                content,
                client_msg_id,
            } => (
                ChatCommand::Input {
                    content,
                    client_msg_id: client_msg_id.clone(),
                },
                "user_message",
                client_msg_id,
            ),
            ClientMessage::ToolResponse(frame) => (
                ChatCommand::ToolAnswer {
                    corr: frame.corr.clone(),
                    response: frame.raw,
                },
                "tool_response",
                Some(frame.corr),
            ),
            ClientMessage::Cancel => (ChatCommand::Cancel, "cancel", None),
            ClientMessage::Resume { last_seq } => return self.subscribe(last_seq, ctx),
            ClientMessage::Ping => return self.ack(ctx, "pong", None),
        };
        let answer = async move { remote.forward(command).await };
        ctx.spawn(
            answer
                .into_actor(self)
                .map(move |reply, act, ctx| match reply {
                    CommandReply::Accepted | CommandReply::Answered { .. } => {
                        act.ack(ctx, kind, ack_id)
                    }
                    CommandReply::Refused { code, message, .. } => {
                        let code = ErrorCode::from_wire(&code).unwrap_or(ErrorCode::Internal);
                        act.send_error(ctx, code, message, true);
                    }
                }),
        );
    }
}

/// What a connection's heartbeat does, `quiet` after the client's last frame.
#[derive(Debug, PartialEq, Eq)]
enum Heartbeat {
    /// Silent for longer than the idle timeout: close (1001).
    Close,
    /// Quiet for half a beat or more: ask for a pong.
    Ping,
    /// Heard lately: the client is alive, and a ping would only cost both sides a frame.
    Quiet,
}

/// How often a connection with this idle timeout looks at its liveness: at least twice per
/// timeout, at most every [`HEARTBEAT`].
fn beat_for(idle: Duration) -> Duration {
    (idle / 2).clamp(Duration::from_millis(250), HEARTBEAT)
}

/// WHY not a ping every beat: under load every socket talks all the time, and a ping per
/// socket per beat is a frame written and a pong read that prove nothing (9,992 of them in
/// an 18 s load run of 10,000 chats, none since). A client quiet for half a beat is pinged,
/// so a live but silent one is asked within 1.5 beats (≤ ¾ of the idle timeout) and answers
/// before it runs out.
fn heartbeat(quiet: Duration, beat: Duration, idle: Duration) -> Heartbeat {
    if quiet > idle {
        Heartbeat::Close
    } else if quiet >= beat / 2 {
        Heartbeat::Ping
    } else {
        Heartbeat::Quiet
    }
}

impl Actor for WsConnection {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.metrics.ws_connections.fetch_add(1, Ordering::Relaxed);
        let join = self.hub.send(Join(ctx.address()));
        ctx.spawn(join.into_actor(self).map(|id, act, _| act.hub_id = id.ok()));
        self.outbox = Some(
            Outbox {
                conn: ctx.address(),
                queue: self.queue.clone(),
                limit: self.limits.outbound_queue.max(1),
                check_armed: false,
                metrics: self.metrics.clone(),
            }
            .start(),
        );
        let after = self.after_seq;
        self.subscribe(after, ctx);
        let idle = Duration::from_secs(self.limits.idle_timeout_s.max(1));
        let beat = beat_for(idle);
        ctx.run_interval(beat, move |act, ctx| {
            match heartbeat(act.last_heard.elapsed(), beat, idle) {
                Heartbeat::Close => act.close_with(ctx, ws::CloseCode::Away, "idle timeout"),
                Heartbeat::Ping => {
                    act.pong_expected = true;
                    act.metrics.ws_pings.fetch_add(1, Ordering::Relaxed);
                    ctx.ping(b"");
                }
                Heartbeat::Quiet => {}
            }
        });
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.metrics.ws_connections.fetch_sub(1, Ordering::Relaxed);
        if let Some(outbox) = self.outbox.take() {
            outbox.do_send(StopOutbox);
        }
        if let Some(id) = self.hub_id.take() {
            self.hub.do_send(Leave(id));
        }
        self.unsubscribe();
    }
}

impl Handler<GoingAway> for WsConnection {
    type Result = ();

    fn handle(&mut self, _: GoingAway, ctx: &mut Self::Context) {
        ctx.close(Some(ws::CloseReason {
            code: ws::CloseCode::Away,
            description: Some("server shutting down".into()),
        }));
        ctx.stop();
    }
}

impl Handler<Flush> for WsConnection {
    type Result = ();

    fn handle(&mut self, _: Flush, ctx: &mut Self::Context) {
        {
            let mut queue = lock(&self.queue);
            queue.flush_pending = false;
            // Swapped with the emptied buffer of the last flush, so neither side reallocates.
            std::mem::swap(&mut queue.items, &mut self.draining);
        }
        for text in self.draining.drain(..) {
            ctx.text(&*text);
        }
    }
}

impl Handler<crate::cluster::ChatWaitsOnUser> for WsConnection {
    type Result = ();

    fn handle(&mut self, _: crate::cluster::ChatWaitsOnUser, ctx: &mut Self::Context) {
        if let (ChatLink::Remote(remote), false) = (&self.chat, self.asked_for_the_chat) {
            let remote = remote.clone();
            self.take_chat_here(remote, None, ctx);
        }
    }
}

impl Handler<SlowConsumer> for WsConnection {
    type Result = ();

    fn handle(&mut self, _: SlowConsumer, ctx: &mut Self::Context) {
        self.close_with(
            ctx,
            ws::CloseCode::Policy,
            "outbound queue full: the client does not read",
        );
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for WsConnection {
    fn handle(&mut self, item: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        self.last_heard = Instant::now();
        let counted = match &item {
            Ok(ws::Message::Close(_)) | Ok(ws::Message::Nop) | Err(_) => false,
            Ok(ws::Message::Pong(_)) => !std::mem::take(&mut self.pong_expected),
            Ok(_) => true,
        };
        if !counted {
            self.on_frame(item, ctx);
            return;
        }
        // Any frame, good or bad, spends both budgets (so frames refused for their size or
        // kind cannot flood for free), and refused frames spend them too.
        self.metrics.ws_frames_in.fetch_add(1, Ordering::Relaxed);
        let own_ok = self.within_connection_rate();
        match self.tenant_budget.spend(&self.tenant) {
            BudgetCheck::Now(tenant) => {
                if self.admit_frame(own_ok && tenant.is_ok(), ctx) {
                    self.on_frame(item, ctx);
                }
            }
            asked @ BudgetCheck::Ask(_) => {
                // The global budget answers asynchronously: later frames wait (`ctx.wait`) so
                // they are handled in the order they came.
                ctx.wait(
                    asked
                        .resolve()
                        .into_actor(self)
                        .map(move |tenant, act, ctx| {
                            if act.admit_frame(own_ok && tenant.is_ok(), ctx) {
                                act.on_frame(item, ctx);
                            }
                        }),
                );
            }
        }
    }
}

impl WsConnection {
    /// Handles one inbound frame the budgets admitted (or that does not count).
    fn on_frame(
        &mut self,
        item: Result<ws::Message, ws::ProtocolError>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        match item {
            Ok(ws::Message::Text(text)) => self.on_text(&text, ctx),
            Ok(ws::Message::Binary(_)) => self.send_error(
                ctx,
                ErrorCode::MalformedFrame,
                "binary frames are not supported; send JSON text",
                true,
            ),
            Ok(ws::Message::Ping(bytes)) => ctx.pong(&bytes),
            Ok(ws::Message::Pong(_)) | Ok(ws::Message::Nop) => {}
            Ok(ws::Message::Continuation(_)) => {
                self.send_error(
                    ctx,
                    ErrorCode::MalformedFrame,
                    "fragmented messages are not supported",
                    true,
                );
            }
            Ok(ws::Message::Close(reason)) => {
                ctx.close(reason);
                ctx.stop();
            }
            Err(ws::ProtocolError::Overflow) => {
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Size,
                    description: Some("frame too large".into()),
                }));
                ctx.stop();
            }
            Err(_) if self.guard.violation() == Some(Violation::TooLarge) => {
                tracing::warn!(chat_id = %self.chat_id, "closing a websocket whose frame announces more than the hard limit");
                self.close_with(ctx, ws::CloseCode::Size, "frame too large");
            }
            Err(_) if self.guard.violation() == Some(Violation::InvalidUtf8) => {
                tracing::debug!(chat_id = %self.chat_id, "closing a websocket that sent text that is not UTF-8");
                self.close_with(ctx, ws::CloseCode::Invalid, "text is not UTF-8");
            }
            Err(err) => {
                tracing::debug!(chat_id = %self.chat_id, error = %err, "websocket protocol error");
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Protocol,
                    description: None,
                }));
                ctx.stop();
            }
        }
    }
}

/// Upgrades `req` to a WebSocket bound to `chat`. Frames larger than 4× the text limit break
/// the protocol and close the socket with 1009 as soon as their header announces it (the
/// [`FrameGuard`]); smaller oversize frames get `chat.error`. The `tessera.v1` subprotocol is
/// echoed when offered (never a `bearer.` entry), and no extension is negotiated.
pub fn upgrade(
    req: &HttpRequest,
    stream: web::Payload,
    chat: ChatLink,
    after_seq: u64,
    shared: ConnectionShared,
) -> Result<HttpResponse, actix_web::Error> {
    let codec_limit = shared.limits.max_frame_bytes.saturating_mul(4);
    let mut connection = WsConnection::new(chat, after_seq, shared);
    connection.trace_parent = crate::telemetry::remote_parent(req);
    let guarded = FrameGuard::new(stream, codec_limit, connection.guard.clone());
    ws::WsResponseBuilder::new(connection, req, guarded)
        .frame_size(codec_limit)
        .protocols(&[crate::auth::WS_PROTOCOL])
        .start()
}

#[cfg(test)]
mod tests {
    use super::{Heartbeat, beat_for, heartbeat};
    use std::time::Duration;

    /// A 60 s idle timeout: a 15 s beat, half of it 7.5 s.
    const IDLE: Duration = Duration::from_secs(60);

    fn after(ms: u64) -> Heartbeat {
        heartbeat(Duration::from_millis(ms), beat_for(IDLE), IDLE)
    }

    #[test]
    fn a_client_heard_within_half_a_beat_is_not_pinged() {
        assert_eq!(after(0), Heartbeat::Quiet);
        assert_eq!(after(7_499), Heartbeat::Quiet);
    }

    #[test]
    fn a_client_quiet_for_half_a_beat_or_more_is_pinged_until_the_idle_timeout() {
        assert_eq!(after(7_500), Heartbeat::Ping);
        assert_eq!(after(30_000), Heartbeat::Ping);
        assert_eq!(after(60_000), Heartbeat::Ping);
    }

    #[test]
    fn a_client_silent_past_the_idle_timeout_is_closed() {
        assert_eq!(after(60_001), Heartbeat::Close);
    }

    #[test]
    fn a_silent_live_client_is_asked_in_time_to_answer() {
        // Beats land one beat apart: the longest a client can stay unasked is the longest
        // quiet that is let be, plus one beat. It must leave a quarter of the idle timeout
        // for the pong.
        for idle_s in [1, 2, 30, 60, 600] {
            let idle = Duration::from_secs(idle_s);
            let beat = beat_for(idle);
            let longest_let_be = (0..=idle.as_millis() as u64)
                .map(Duration::from_millis)
                .take_while(|quiet| heartbeat(*quiet, beat, idle) == Heartbeat::Quiet)
                .last()
                .unwrap_or_default();
            let asked_by = longest_let_be + beat;
            assert_eq!(heartbeat(asked_by, beat, idle), Heartbeat::Ping, "{idle_s}");
            assert!(
                asked_by <= idle * 3 / 4,
                "{idle_s}: asked after {asked_by:?}"
            );
        }
    }
}
