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
