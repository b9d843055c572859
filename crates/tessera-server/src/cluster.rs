//! The owner's side of routing between nodes: a [`ChatRelay`] per owned chat publishes the
//! chat's live events on its NATS subject (for sockets on other nodes) and carries out the
//! commands other nodes forward (input, tool answers, cancels), answering each the way the
//! owner's own socket would have. See ARCHITECTURE.md, "Several nodes".
//!
//! Known limit: the relay is a permanent subscriber of its chat, so the UI-call disconnect
//! policy (which acts when a chat's last subscriber leaves) does not see remote clients leave.

use actix::prelude::*;
use bytes::Bytes;
use serde::Deserialize;
use tessera_cluster::{ChatCommand, ClusterBus, CommandReply, IncomingCommand, LiveEvent};
use tessera_engine::ChatHandle;
use tessera_engine::session::{CancelRun, Deliver, Subscribe, ToolAnswer, Unsubscribe, UserInput};
use tessera_protocol::ErrorCode;
use tokio::sync::mpsc;

/// Relays one owned chat; stop it (or drop its address) when the chat leaves this node.
pub struct ChatRelay {
    chat: ChatHandle,
    bus: ClusterBus,
    /// Events in seq order to the one task that publishes them (publishing from separate
    /// tasks could reorder them).
    outbound: Option<mpsc::UnboundedSender<LiveEvent>>,
    subscription: Option<u64>,
}

impl ChatRelay {
    /// A relay for `chat` over `bus`; start it on the chat's arbiter.
    pub fn new(chat: ChatHandle, bus: ClusterBus) -> Self {
        Self {
            chat,
            bus,
            outbound: None,
            subscription: None,
        }
    }
}

/// The seq of a serialized event envelope (0 for per-connection events).
#[derive(Deserialize)]
struct SeqOnly {
    #[serde(default)]
    seq: u64,
}

impl Actor for ChatRelay {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let chat_id = self.chat.identity.chat_id.to_string();
        let (tx, mut rx) = mpsc::unbounded_channel::<LiveEvent>();
        self.outbound = Some(tx);
        let bus = self.bus.clone();
        let publishing = chat_id.clone();
        actix::spawn(async move {
            while let Some(event) = rx.recv().await {
                if let Err(e) = bus.publish_event(&publishing, &event).await {
                    // Remote subscribers see the seq gap and read the store.
                    tracing::warn!(chat_id = %publishing, seq = event.seq, error = %e, "live event not relayed");
                }
            }
        });
        // Live events only: everything before now is in the store for any reader.
        let subscribe = self.chat.addr.send(Subscribe {
            recipient: ctx.address().recipient(),
            after_seq: u64::MAX,
        });
        ctx.wait(subscribe.into_actor(self).map(|id, act, ctx| match id {
            Ok(id) => act.subscription = Some(id),
            Err(_) => ctx.stop(),
        }));
        let bus = self.bus.clone();
        let serving = async move { bus.serve_commands(&chat_id).await };
        ctx.wait(serving.into_actor(self).map(|commands, act, ctx| match commands {
            Ok(commands) => {
                ctx.add_stream(commands);
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

    fn handle(&mut self, Deliver(text): Deliver, _: &mut Self::Context) {
        let seq = serde_json::from_str::<SeqOnly>(&text).map_or(0, |s| s.seq);
        if seq == 0 {
            return;
        }
        if let Some(outbound) = &self.outbound {
            let _ = outbound.send(LiveEvent {
                seq,
                envelope: Bytes::copy_from_slice(text.as_bytes()),
            });
        }
    }
}

fn refused(code: ErrorCode, message: impl ToString) -> CommandReply {
    CommandReply::Refused {
        code: code.as_str().to_owned(),
        message: message.to_string(),
    }
}

impl StreamHandler<IncomingCommand> for ChatRelay {
    fn handle(&mut self, incoming: IncomingCommand, ctx: &mut Self::Context) {
        let addr = self.chat.addr.clone();
        let bus = self.bus.clone();
        let chat_id = self.chat.identity.chat_id.clone();
        let not_running = || refused(ErrorCode::Internal, "the chat is not running");
        let command = incoming.command.clone();
        let carry_out = async move {
            let reply = match command {
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
                    Ok(Err(e)) => refused(e.code(), &e),
                    Err(_) => not_running(),
                },
                ChatCommand::ToolAnswer { corr, response } => {
                    match addr.send(ToolAnswer { corr, response }).await {
                        Ok(Ok(())) => CommandReply::Accepted,
                        Ok(Err(e)) => refused(e.code(), &e),
                        Err(_) => not_running(),
                    }
                }
                ChatCommand::Cancel => match addr.send(CancelRun).await {
                    Ok(()) => CommandReply::Accepted,
                    Err(_) => not_running(),
                },
            };
            if let Err(e) = bus.reply(incoming, &reply).await {
                // The forwarder times out and tells its client to retry.
                tracing::warn!(chat_id = %chat_id, error = %e, "command answer not sent");
            }
        };
        // In arrival order: the next command waits for this one, as on one socket.
        ctx.wait(carry_out.into_actor(self));
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// How long a reader waits before asking the store again for events it has seen live but the
/// store does not hold yet (the owner writes behind its live events).
const STORE_CATCH_UP_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// Events read from the store per catch-up query.
const CATCH_UP_PAGE: u32 = 500;

/// The reader's side of routing: feeds a subscriber on a node that does not own the chat with
/// every event after `after_seq`, each exactly once and in seq order — first from the store
/// (replay), then live from the owner over NATS. A live event past a gap (the ones published
/// before the subscription, or lost in a failover) is held back until the store has filled the
/// gap, so the subscriber never sees a gap or a duplicate.
pub struct RemoteFeed {
    chat_id: String,
    store: std::sync::Arc<dyn tessera_store::ChatStore>,
    bus: ClusterBus,
    recipient: Recipient<Deliver>,
    /// The next seq the subscriber gets.
    next_seq: u64,
    /// Live events ahead of `next_seq`, by seq.
    held: std::collections::BTreeMap<u64, Bytes>,
    catching_up: bool,
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
        }
    }

    fn deliver(&mut self, envelope: &[u8]) {
        let text = String::from_utf8_lossy(envelope);
        self.recipient
            .do_send(Deliver(std::sync::Arc::from(text.as_ref())));
        self.next_seq += 1;
    }

    /// Delivers held live events that are next in line.
    fn drain_held(&mut self) {
        while let Some(envelope) = self.held.remove(&self.next_seq) {
            self.deliver(&envelope);
        }
        let stale: Vec<u64> = self.held.range(..self.next_seq).map(|(s, _)| *s).collect();
        for seq in stale {
            self.held.remove(&seq);
        }
    }

    /// Reads the store from `next_seq` on; again after a pause while live events are still
    /// held back (the store has not caught up with them yet).
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
            let mut full_page = false;
            match events {
                Ok(events) => {
                    full_page = events.len() == CATCH_UP_PAGE as usize;
                    for event in events {
                        if event.seq == act.next_seq {
                            act.deliver(event.json.as_bytes());
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(chat_id = %act.chat_id, error = %e, "replay from the store failed; retrying")
                }
            }
            act.drain_held();
            if full_page {
                act.catch_up(ctx);
            } else if !act.held.is_empty() {
                ctx.run_later(STORE_CATCH_UP_RETRY, |act, ctx| act.catch_up(ctx));
            }
        }));
    }
}

impl Actor for RemoteFeed {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Subscribe first, then read the store: an event published in between is then both
        // live and stored, and the seq check delivers it once.
        let bus = self.bus.clone();
        let chat_id = self.chat_id.clone();
        let subscribe = async move { bus.subscribe_events(&chat_id).await };
        ctx.wait(subscribe.into_actor(self).map(|events, act, ctx| match events {
            Ok(events) => {
                ctx.add_stream(events);
                act.catch_up(ctx);
            }
            Err(e) => {
                tracing::warn!(chat_id = %act.chat_id, error = %e, "cannot follow the chat's live events");
                ctx.stop();
            }
        }));
    }
}

impl StreamHandler<LiveEvent> for RemoteFeed {
    fn handle(&mut self, event: LiveEvent, ctx: &mut Self::Context) {
        if !self.recipient.connected() {
            ctx.stop();
            return;
        }
        if event.seq < self.next_seq {
            return;
        }
        if event.seq == self.next_seq && !self.catching_up {
            self.deliver(&event.envelope);
            self.drain_held();
            return;
        }
        self.held.insert(event.seq, event.envelope);
        self.catch_up(ctx);
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// The node's side of ownership: carries out what the `LeaseManager` decides. A chat taken
/// over is rebuilt from the store (`Engine::take_over`) and served to other nodes by a
/// [`ChatRelay`]; a chat lost is relinquished at once (it writes nothing more) and its relay
/// stopped, so commands for it reach its new owner.
pub struct ClusterNode {
    engine: tessera_engine::Engine,
    bus: ClusterBus,
    owned: std::collections::HashMap<String, OwnedChat>,
}

struct OwnedChat {
    chat: ChatHandle,
    relay: Addr<ChatRelay>,
    epoch: i64,
}

impl ClusterNode {
    /// A node running chats on `engine`, reachable over `bus`.
    pub fn new(engine: tessera_engine::Engine, bus: ClusterBus) -> Self {
        Self {
            engine,
            bus,
            owned: std::collections::HashMap::new(),
        }
    }

    fn serve(&mut self, chat: ChatHandle, epoch: i64) {
        let relayed = chat.clone();
        let bus = self.bus.clone();
        let relay = ChatRelay::start_in_arbiter(&chat.arbiter.clone(), move |_| {
            ChatRelay::new(relayed, bus)
        });
        self.owned.insert(
            chat.identity.chat_id.to_string(),
            OwnedChat { chat, relay, epoch },
        );
    }
}

impl Actor for ClusterNode {
    type Context = Context<Self>;
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

impl Handler<tessera_cluster::OwnershipChange> for ClusterNode {
    type Result = ();

    fn handle(&mut self, change: tessera_cluster::OwnershipChange, ctx: &mut Self::Context) {
        use tessera_cluster::OwnershipChange;
        match change {
            OwnershipChange::TakenOver { chat_id, epoch } => {
                let engine = self.engine.clone();
                let restoring = chat_id.clone();
                let restore = async move { engine.take_over(&restoring).await };
                ctx.spawn(restore.into_actor(self).map(move |restored, act, _| {
                    match restored {
                        Ok(Some(chat)) => {
                            tracing::info!(chat_id = %chat_id, epoch, "serving a chat taken over");
                            act.serve(chat, epoch);
                        }
                        // Completed meanwhile, or of a workflow this node does not serve.
                        Ok(None) => {
                            tracing::warn!(chat_id = %chat_id, epoch, "taken-over chat not started")
                        }
                        Err(e) => {
                            tracing::error!(chat_id = %chat_id, epoch, error = %e, "taken-over chat could not be rebuilt")
                        }
                    }
                }));
            }
            OwnershipChange::Lost { chat_id, epoch } => {
                if let Some(owned) = self.owned.remove(&chat_id) {
                    tracing::warn!(chat_id = %chat_id, epoch, "chat lost to another node");
                    owned.chat.addr.do_send(tessera_engine::session::Relinquish);
                    owned.relay.do_send(StopRelay);
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
        ctx.stop();
    }
}
