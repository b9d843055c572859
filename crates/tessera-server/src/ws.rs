//! The WebSocket transport: one `WsConnection` actor per socket, forwarding client frames to
//! the chat's `ChatSession` and the session's events to the socket.
//!
//! This is the only module that uses `actix-web-actors` (deprecated upstream in favour of
//! `actix-ws`), so moving to `actix-ws` is a change to this file alone.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_web::{HttpRequest, HttpResponse, web};
use actix_web_actors::ws;
use tessera_engine::ChatHandle;
use tessera_engine::session::{CancelRun, Deliver, Subscribe, ToolAnswer, Unsubscribe, UserInput};
use tessera_protocol::{
    ClientMessage, Envelope, ErrorCode, ServerEvent, parse_client_frame, rfc3339_now,
};

use crate::config::Limits;
use crate::metrics::Metrics;

/// How often we ping an idle client.
const HEARTBEAT: Duration = Duration::from_secs(15);

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

/// One client socket of one chat.
pub struct WsConnection {
    chat: ChatHandle,
    after_seq: u64,
    subscription: Option<u64>,
    limits: Arc<Limits>,
    metrics: Arc<Metrics>,
    last_heard: Instant,
    window_start: Instant,
    window_count: u32,
    hub: Addr<ConnectionHub>,
    hub_id: Option<u64>,
}

impl WsConnection {
    /// A connection that first replays the chat's events after `after_seq`.
    pub fn new(
        chat: ChatHandle,
        after_seq: u64,
        limits: Arc<Limits>,
        metrics: Arc<Metrics>,
        hub: Addr<ConnectionHub>,
    ) -> Self {
        let now = Instant::now();
        Self {
            chat,
            after_seq,
            subscription: None,
            limits,
            metrics,
            last_heard: now,
            window_start: now,
            window_count: 0,
            hub,
            hub_id: None,
        }
    }

    fn subscribe(&mut self, after_seq: u64, ctx: &mut ws::WebsocketContext<Self>) {
        if let Some(old) = self.subscription.take() {
            self.chat.addr.do_send(Unsubscribe(old));
        }
        let request = self.chat.addr.send(Subscribe {
            recipient: ctx.address().recipient(),
            after_seq,
        });
        ctx.wait(
            request
                .into_actor(self)
                .map(|result, act, ctx| match result {
                    Ok(id) => act.subscription = Some(id),
                    Err(_) => {
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
        let timestamp = rfc3339_now();
        ctx.text(
            Envelope {
                seq: 0,
                chat_id: &self.chat.identity.chat_id,
                timestamp: &timestamp,
                event,
            }
            .to_json(),
        );
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

    /// Counts a frame against the per-minute budget; false when over it.
    fn within_rate(&mut self) -> bool {
        if self.window_start.elapsed() >= Duration::from_secs(60) {
            self.window_start = Instant::now();
            self.window_count = 0;
        }
        self.window_count += 1;
        self.window_count <= self.limits.messages_per_minute
    }

    fn on_text(&mut self, text: &str, ctx: &mut ws::WebsocketContext<Self>) {
        self.metrics.ws_frames_in.fetch_add(1, Ordering::Relaxed);
        if text.len() > self.limits.max_frame_bytes {
            let err = tessera_protocol::FrameError::TooLarge {
                size: text.len(),
                limit: self.limits.max_frame_bytes,
            };
            self.send_error(ctx, err.code(), err.to_string(), true);
            return;
        }
        if !self.within_rate() {
            self.send_error(
                ctx,
                ErrorCode::RateLimited,
                "too many messages; slow down",
                true,
            );
            return;
        }
        let message = match parse_client_frame(text) {
            Ok(message) => message,
            Err(err) => {
                self.send_error(ctx, err.code(), err.to_string(), true);
                return;
            }
        };
        match message {
            ClientMessage::UserMessage {
                content,
                client_msg_id,
            } => {
                let request = self.chat.addr.send(UserInput {
                    content,
                    client_msg_id: client_msg_id.clone(),
                });
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
                let request = self.chat.addr.send(ToolAnswer {
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
                self.chat.addr.do_send(CancelRun);
                self.ack(ctx, "cancel", None);
            }
            ClientMessage::Ping => self.ack(ctx, "pong", None),
        }
    }
}

impl Actor for WsConnection {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.metrics.ws_connections.fetch_add(1, Ordering::Relaxed);
        let join = self.hub.send(Join(ctx.address()));
        ctx.spawn(join.into_actor(self).map(|id, act, _| act.hub_id = id.ok()));
        let after = self.after_seq;
        self.subscribe(after, ctx);
        let idle = Duration::from_secs(self.limits.idle_timeout_s.max(1));
        ctx.run_interval(HEARTBEAT, move |act, ctx| {
            if act.last_heard.elapsed() > idle {
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Away,
                    description: Some("idle timeout".into()),
                }));
                ctx.stop();
            } else {
                ctx.ping(b"");
            }
        });
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.metrics.ws_connections.fetch_sub(1, Ordering::Relaxed);
        if let Some(id) = self.hub_id.take() {
            self.hub.do_send(Leave(id));
        }
        if let Some(id) = self.subscription.take() {
            self.chat.addr.do_send(Unsubscribe(id));
        }
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

impl Handler<Deliver> for WsConnection {
    type Result = ();

    fn handle(&mut self, Deliver(text): Deliver, ctx: &mut Self::Context) {
        ctx.text(&*text);
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for WsConnection {
    fn handle(&mut self, item: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        self.last_heard = Instant::now();
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
            Err(err) => {
                tracing::debug!(chat_id = %self.chat.identity.chat_id, error = %err, "websocket protocol error");
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
/// the protocol and close the socket with 1009; smaller oversize frames get `chat.error`.
pub fn upgrade(
    req: &HttpRequest,
    stream: web::Payload,
    chat: ChatHandle,
    after_seq: u64,
    limits: Arc<Limits>,
    metrics: Arc<Metrics>,
    hub: Addr<ConnectionHub>,
) -> Result<HttpResponse, actix_web::Error> {
    let codec_limit = limits.max_frame_bytes.saturating_mul(4);
    ws::WsResponseBuilder::new(
        WsConnection::new(chat, after_seq, limits, metrics, hub),
        req,
        stream,
    )
    .frame_size(codec_limit)
    .start()
}
