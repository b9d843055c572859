//! Routing between nodes over NATS: the owner of a chat publishes its live events on the
//! chat's events subject and answers commands on its commands subject; any other node relays
//! events to its own sockets and forwards its clients' commands by request/reply.
//!
//! WHY per-chat subjects: a forwarder needs no routing table. When no node serves a chat (a
//! takeover is under way), NATS answers "no responders" at once, and the forwarder retries.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_nats::{Client, Subject, Subscriber};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ClusterError, ClusterMetrics, Subjects};

/// A client's command for a chat, forwarded to the chat's owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ChatCommand {
    /// User input (`chat.user_input`).
    Input {
        /// The text.
        content: String,
        /// The client's id for it, echoed in the ack.
        client_msg_id: Option<String>,
    },
    /// The answer to a UI tool call.
    ToolAnswer {
        /// The call's correlation id.
        corr: String,
        /// What the user answered.
        response: Value,
    },
    /// Stop the running turn.
    Cancel,
    /// The chat as the REST API shows it (`GET /chats/{id}`); answered with its JSON.
    Snapshot,
    /// One page of the chat's transcript (`GET /chats/{id}/messages`); answered with its JSON.
    Messages {
        /// Messages skipped.
        offset: u64,
        /// Messages at most.
        limit: u64,
    },
    /// The chat's events after `after_seq` that clients may see, for a client on the
    /// forwarding node (the owner's memory holds streamed deltas, which no store does);
    /// answered with `{"session": envelope text or null, "events": [envelope text, …],
    /// "through": seq, "more": bool}`: a seq up to `through` with no event among them has
    /// none for clients.
    Replay {
        /// The last seq the forwarder's client has.
        after_seq: u64,
        /// Also the `chat.session` event that opens a subscriber's replay.
        #[serde(default)]
        with_session: bool,
    },
    /// A reader on the forwarding node follows the chat's live events: the owner publishes
    /// them for a while (a [`ChatCommand::Replay`] counts as one too), and answers with
    /// `{"last_seq": the last seq it has shown, or null}` so the reader can tell whether it
    /// missed the last one. Readers renew it while they last; with nobody following, the owner
    /// publishes nothing (its own sockets need no NATS).
    Follow,
    /// The chat is being deleted: stop its session now (the deleting node then deletes the
    /// stored chat and its lease, which fences any write still under way).
    Stop,
    /// A client's socket reached the forwarding node while nobody on the owner watches the
    /// chat: leave the owner's memory and park the lease, if the chat waits only on its user
    /// (or on UI calls without a timeout), so that the forwarder claims it and serves the
    /// socket as its own. `Accepted` once parked; refused (`chat_stays`) otherwise. An owner
    /// of an older build drops it undecoded, and the forwarder's short wait runs out.
    HandOver,
    /// Run an AG-UI run of the chat on its owner and stream the run's SSE frames to
    /// `stream_to` (an inbox the forwarder opened with [`ClusterBus::open_stream`]).
    AguiRun {
        /// The workflow the client asked for (a thread of another workflow is refused).
        workflow: String,
        /// The client's `RunAgentInput`.
        input: Value,
        /// Where the frames go.
        stream_to: String,
    },
}

/// The owner's answer to a [`ChatCommand`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CommandReply {
    /// Taken.
    Accepted,
    /// Carried out, with a JSON answer (reads).
    Answered {
        /// What the owner's REST API answers.
        body: Value,
    },
    /// Refused with a stable error code (the one the owner's own socket would have sent).
    Refused {
        /// Stable error code.
        code: String,
        /// For the user.
        message: String,
        /// The HTTP status the owner's REST API answers for it (absent: the forwarder picks).
        #[serde(default)]
        status: Option<u16>,
    },
}

/// One message of a stream from an owner to a forwarder (see [`ClusterBus::open_stream`]).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamFrame {
    /// The next piece of the stream.
    Data(Bytes),
    /// Nothing new, but the owner is still there.
    KeepAlive,
    /// The stream is over.
    End,
}

/// One received [`StreamFrame`], numbered by the owner from 0 so a lost one shows.
#[derive(Debug, Clone, PartialEq)]
pub struct NumberedFrame {
    /// Its place in the stream.
    pub n: u64,
    /// The frame.
    pub frame: StreamFrame,
}

impl NumberedFrame {
    fn encode(&self) -> Bytes {
        let (tag, body): (u8, &[u8]) = match &self.frame {
            StreamFrame::Data(data) => (b'd', data),
            StreamFrame::KeepAlive => (b'k', &[]),
            StreamFrame::End => (b'e', &[]),
        };
        let mut out = Vec::with_capacity(9 + body.len());
        out.push(tag);
        out.extend_from_slice(&self.n.to_be_bytes());
        out.extend_from_slice(body);
        Bytes::from(out)
    }

    fn decode(payload: &Bytes) -> Result<Self, ClusterError> {
        let short = || ClusterError::Decode("stream frame shorter than its header".into());
        let tag = *payload.first().ok_or_else(short)?;
        let n: [u8; 8] = payload
            .get(1..9)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(short)?;
        let frame = match tag {
            b'd' => StreamFrame::Data(payload.slice(9..)),
            b'k' => StreamFrame::KeepAlive,
            b'e' => StreamFrame::End,
            other => return Err(ClusterError::Decode(format!("stream frame tag {other}"))),
        };
        Ok(Self {
            n: u64::from_be_bytes(n),
            frame,
        })
    }
}

/// Where an owner may stream to: inboxes only, so a command cannot make it publish on a
/// chat's subjects.
const INBOX_PREFIX: &str = "_INBOX.";

/// One live event relayed from the owner: its seq and its serialized envelope (the same bytes
/// the owner's own sockets get).
#[derive(Debug, Clone, PartialEq)]
pub struct LiveEvent {
    /// The event's seq in its chat.
    pub seq: u64,
    /// The JSON envelope.
    pub envelope: Bytes,
}

/// Envelope bytes at most in one NATS message of several live events (NATS refuses a message
/// over its `max_payload`, 1 MiB by default); a larger event goes alone.
const LIVE_BATCH_BYTES: usize = 256 * 1024;

impl LiveEvent {
    /// One event alone: its seq (never 0), then its envelope.
    fn encode(&self) -> Bytes {
        let mut out = Vec::with_capacity(8 + self.envelope.len());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.envelope);
        Bytes::from(out)
    }

    /// Several events in one message: a seq of 0 (no event has it), then each event's seq,
    /// its envelope's length (u32) and its envelope.
    fn encode_batch(events: &[LiveEvent]) -> Bytes {
        let size: usize = events.iter().map(|e| 12 + e.envelope.len()).sum();
        let mut out = Vec::with_capacity(8 + size);
        out.extend_from_slice(&0u64.to_be_bytes());
        for event in events {
            out.extend_from_slice(&event.seq.to_be_bytes());
            // Below LIVE_BATCH_BYTES: a larger event is sent alone.
            out.extend_from_slice(&(event.envelope.len() as u32).to_be_bytes());
            out.extend_from_slice(&event.envelope);
        }
        Bytes::from(out)
    }

    /// The events of one message, either form.
    fn decode(payload: &Bytes) -> Result<Vec<Self>, ClusterError> {
        let short = || ClusterError::Decode("live event message cut short".into());
        let seq_at = |at: usize| -> Result<u64, ClusterError> {
            let head: [u8; 8] = payload
                .get(at..at + 8)
                .and_then(|h| h.try_into().ok())
                .ok_or_else(short)?;
            Ok(u64::from_be_bytes(head))
        };
        let seq = seq_at(0)?;
        if seq != 0 {
            return Ok(vec![Self {
                seq,
                envelope: payload.slice(8..),
            }]);
        }
        let mut events = Vec::new();
        let mut at = 8;
        while at < payload.len() {
            let seq = seq_at(at)?;
            let len: [u8; 4] = payload
                .get(at + 8..at + 12)
                .and_then(|l| l.try_into().ok())
                .ok_or_else(short)?;
            let start = at + 12;
            let end = start + u32::from_be_bytes(len) as usize;
            if end > payload.len() {
                return Err(short());
            }
            events.push(Self {
                seq,
                envelope: payload.slice(start..end),
            });
            at = end;
        }
        Ok(events)
    }
}

/// A command that arrived for a chat this node owns; answer it with [`ClusterBus::reply`].
#[derive(Debug)]
pub struct IncomingCommand {
    /// The command.
    pub command: ChatCommand,
    reply_to: Option<Subject>,
    /// The node that sent it, for the commands that name it ([`ChatCommand::names_sender`]);
    /// `None` for the others, and from a node of an older build.
    pub from: Option<String>,
}

/// Ends a command stream gracefully (see [`ClusterBus::serve_commands_until_drained`]).
#[derive(Debug)]
pub struct CommandsDrain(Option<tokio::sync::oneshot::Sender<()>>);

impl CommandsDrain {
    /// Ends the subscription; the stream yields what already arrived, then ends.
    pub fn drain(&mut self) {
        if let Some(asked) = self.0.take() {
            let _ = asked.send(());
        }
    }
}

/// The NATS header in which a forwarder names itself (see [`ChatCommand::names_sender`]).
const SENDER_HEADER: &str = "Tessera-Node";

impl ChatCommand {
    /// Commands whose owner needs to know which node sent them: the follows (a `Replay` is
    /// one), kept by node, and a hand-over, which an owner grants only when no other node
    /// follows the chat.
    pub fn names_sender(&self) -> bool {
        matches!(self, Self::Follow | Self::Replay { .. } | Self::HandOver)
    }
}

impl IncomingCommand {
    /// The sender waits for an answer (it sent a request, not a plain publish).
    pub fn wants_reply(&self) -> bool {
        self.reply_to.is_some()
    }
}

/// The NATS connection of one node.
#[derive(Clone)]
pub struct ClusterBus {
    client: Client,
    /// This node's id, named in the commands that need it.
    node_id: Arc<str>,
    subjects: Subjects,
    request_timeout: Duration,
    metrics: Arc<ClusterMetrics>,
}

impl ClusterBus {
    /// Connects to `url` as `node_id`, with subjects under `prefix`. Commands forwarded to an
    /// owner wait at most `request_timeout` for its answer. The first connection must succeed
    /// (a node does not start without NATS); after that the client reconnects by itself for
    /// as long as it takes, and [`Self::is_connected`] says whether it is connected now.
    pub async fn connect(
        url: &str,
        node_id: &str,
        prefix: &str,
        request_timeout: Duration,
        metrics: Arc<ClusterMetrics>,
    ) -> Result<Self, ClusterError> {
        let client = async_nats::ConnectOptions::new()
            .name(format!("tessera-{node_id}"))
            .connect(url)
            .await
            .map_err(|e| ClusterError::Nats(e.to_string()))?;
        Ok(Self {
            client,
            node_id: Arc::from(node_id),
            subjects: Subjects::new(prefix),
            request_timeout,
            metrics,
        })
    }

    /// The underlying client (the key-value buckets of [`crate::GlobalLimits`] share it).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The deployment's subjects.
    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// True while the connection to NATS is up.
    pub fn is_connected(&self) -> bool {
        matches!(
            self.client.connection_state(),
            async_nats::connection::State::Connected
        )
    }

    /// The node's cluster counters this bus reports to.
    pub fn metrics(&self) -> &ClusterMetrics {
        &self.metrics
    }

    /// One round trip to the server, recorded in the metrics: a message to a fresh inbox of
    /// this connection, received back. The server handles a connection's operations in order,
    /// so once it is back every subscription made before it is in force.
    pub async fn round_trip(&self) -> Result<Duration, ClusterError> {
        let started = Instant::now();
        let inbox = self.client.new_inbox();
        let mut echo = self
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| ClusterError::Nats(e.to_string()))?;
        self.client
            .publish(inbox, Bytes::new())
            .await
            .map_err(|e| ClusterError::Nats(e.to_string()))?;
        tokio::time::timeout(self.request_timeout, echo.next())
            .await
            .map_err(|_| ClusterError::Timeout(self.request_timeout))?
            .ok_or_else(|| ClusterError::Nats("connection closed".into()))?;
        let rtt = started.elapsed();
        self.metrics.nats_rtt_us.store(
            u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        Ok(rtt)
    }

    /// Publishes a burst of the chat's live events, in seq order (owner side): as few
    /// messages as [`LIVE_BATCH_BYTES`] allows, since each message costs the owner, NATS and
    /// every reader the same whatever it holds.
    pub async fn publish_events(
        &self,
        chat_id: &str,
        events: &[LiveEvent],
    ) -> Result<(), ClusterError> {
        self.metrics
            .live_events_published
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        // Cloned per message as a reference count, not a string.
        let subject = Subject::from(self.subjects.events(chat_id));
        let mut rest = events;
        while !rest.is_empty() {
            let mut bytes = 0;
            let take = rest
                .iter()
                .take_while(|e| {
                    bytes += e.envelope.len();
                    bytes <= LIVE_BATCH_BYTES
                })
                .count()
                .max(1);
            let (burst, after) = rest.split_at(take);
            let payload = match burst {
                [one] => one.encode(),
                several => LiveEvent::encode_batch(several),
            };
            self.client
                .publish(subject.clone(), payload)
                .await
                .map_err(|e| ClusterError::Nats(e.to_string()))?;
            rest = after;
        }
        Ok(())
    }

    /// The chat's live events from now on, in the bursts the owner published them (relay
    /// side). Undecodable messages are logged and skipped; the subscriber resumes from the
    /// store if it sees a seq gap.
    pub async fn subscribe_events(
        &self,
        chat_id: &str,
    ) -> Result<impl Stream<Item = Vec<LiveEvent>> + Send + Unpin + use<>, ClusterError> {
        let subscriber = self.subscribe(self.subjects.events(chat_id)).await?;
        let chat = chat_id.to_owned();
        Ok(subscriber.filter_map(move |msg| {
            let decoded = LiveEvent::decode(&msg.payload);
            if let Err(e) = &decoded {
                tracing::warn!(chat_id = %chat, error = %e, "dropped an undecodable live event");
            }
            futures::future::ready(decoded.ok())
        }))
    }

    /// The commands other nodes forward for `chat_id` (owner side). Subscribe when taking the
    /// chat; drop the stream when giving it up (see [`ClusterBus::serve_commands_until_drained`]
    /// to answer what already arrived first).
    pub async fn serve_commands(
        &self,
        chat_id: &str,
    ) -> Result<impl Stream<Item = IncomingCommand> + Send + Unpin + use<>, ClusterError> {
        Ok(self.serve_commands_until_drained(chat_id).await?.0)
    }

    /// [`ClusterBus::serve_commands`], with a handle that ends the stream gracefully: once
    /// [`CommandsDrain::drain`] is called the subscription is ended at the server, and the
    /// stream still yields every command that reached this node before it ends. A command
    /// dropped with the stream would go unanswered, and its forwarder could only time out
    /// without knowing whether it was carried out.
    pub async fn serve_commands_until_drained(
        &self,
        chat_id: &str,
    ) -> Result<
        (
            impl Stream<Item = IncomingCommand> + Send + Unpin + use<>,
            CommandsDrain,
        ),
        ClusterError,
    > {
        let subscriber = self.subscribe(self.subjects.commands(chat_id)).await?;
        let (drain, drain_asked) = tokio::sync::oneshot::channel();
        let messages = futures::stream::unfold(
            (subscriber, Some(drain_asked)),
            |(mut subscriber, mut drain_asked)| async move {
                loop {
                    let Some(asked) = drain_asked.as_mut() else {
                        let msg = subscriber.next().await?;
                        return Some((msg, (subscriber, drain_asked)));
                    };
                    tokio::select! {
                        msg = subscriber.next() => {
                            return msg.map(|msg| (msg, (subscriber, drain_asked)));
                        }
                        asked = asked => {
                            drain_asked = None;
                            // A handle dropped without asking: served until the stream is.
                            if asked.is_ok() && let Err(e) = subscriber.drain().await {
                                tracing::debug!(error = %e, "the command subscription was not drained");
                                return None;
                            }
                        }
                    }
                }
            },
        );
        let chat = chat_id.to_owned();
        let commands = messages.filter_map(move |msg| {
            let decoded = serde_json::from_slice::<ChatCommand>(&msg.payload);
            let incoming = match decoded {
                Ok(command) => Some(IncomingCommand {
                    from: command
                        .names_sender()
                        .then(|| msg.headers.as_ref()?.get(SENDER_HEADER))
                        .flatten()
                        .map(|node| node.to_string()),
                    command,
                    reply_to: msg.reply,
                }),
                Err(e) => {
                    tracing::warn!(chat_id = %chat, error = %e, "dropped an undecodable command");
                    None
                }
            };
            futures::future::ready(incoming)
        });
        Ok((Box::pin(commands), CommandsDrain(Some(drain))))
    }

    /// Answers a command (owner side). A command sent without a reply subject needs none.
    pub async fn reply(
        &self,
        incoming: IncomingCommand,
        reply: &CommandReply,
    ) -> Result<(), ClusterError> {
        let Some(to) = incoming.reply_to else {
            return Ok(());
        };
        let body = serde_json::to_vec(reply).map_err(|e| ClusterError::Decode(e.to_string()))?;
        self.client
            .publish(to, Bytes::from(body))
            .await
            .map_err(|e| ClusterError::Nats(e.to_string()))
    }

    /// Forwards `command` to the chat's owner and waits for its answer (forwarder side).
    /// [`ClusterError::NoOwner`] when no node serves the chat right now;
    /// [`ClusterError::Timeout`] when the owner did not answer in time.
    pub async fn send_command(
        &self,
        chat_id: &str,
        command: &ChatCommand,
    ) -> Result<CommandReply, ClusterError> {
        self.send_command_within(chat_id, command, self.request_timeout)
            .await
    }

    /// [`ClusterBus::send_command`], waiting at most `timeout` for the answer.
    pub async fn send_command_within(
        &self,
        chat_id: &str,
        command: &ChatCommand,
        timeout: Duration,
    ) -> Result<CommandReply, ClusterError> {
        use async_nats::RequestErrorKind;
        let body = serde_json::to_vec(command).map_err(|e| ClusterError::Decode(e.to_string()))?;
        let mut request = async_nats::Request::new()
            .payload(Bytes::from(body))
            .timeout(Some(timeout));
        if command.names_sender() {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(SENDER_HEADER, &*self.node_id);
            request = request.headers(headers);
        }
        self.metrics
            .commands_forwarded
            .fetch_add(1, Ordering::Relaxed);
        let answer = self
            .client
            .send_request(self.subjects.commands(chat_id), request)
            .await
            .map_err(|e| match e.kind() {
                RequestErrorKind::TimedOut => ClusterError::Timeout(timeout),
                RequestErrorKind::NoResponders => ClusterError::NoOwner(chat_id.to_owned()),
                _ => ClusterError::Nats(e.to_string()),
            })?;
        serde_json::from_slice(&answer.payload).map_err(|e| ClusterError::Decode(e.to_string()))
    }

    /// Opens a stream an owner can send frames to (forwarder side): subscribes to a fresh
    /// inbox and returns its name (for the command) and the frames that arrive on it, in the
    /// order the owner sent them (NATS keeps one publisher's order). Drop the stream to close it.
    pub async fn open_stream(
        &self,
    ) -> Result<
        (
            String,
            impl Stream<Item = NumberedFrame> + Send + Unpin + use<>,
        ),
        ClusterError,
    > {
        let inbox = self.client.new_inbox();
        let subscriber = self.subscribe(inbox.clone()).await?;
        Ok((
            inbox,
            subscriber.filter_map(|msg| {
                let decoded = NumberedFrame::decode(&msg.payload);
                if let Err(e) = &decoded {
                    tracing::warn!(error = %e, "dropped an undecodable stream frame");
                }
                futures::future::ready(decoded.ok())
            }),
        ))
    }

    /// Sends one frame of a stream to `to` (owner side); `to` must be an inbox.
    pub async fn send_stream_frame(
        &self,
        to: &str,
        frame: &NumberedFrame,
    ) -> Result<(), ClusterError> {
        if !to.starts_with(INBOX_PREFIX) {
            return Err(ClusterError::Decode(format!(
                "a stream goes to an inbox, not to {to:?}"
            )));
        }
        self.client
            .publish(to.to_owned(), frame.encode())
            .await
            .map_err(|e| ClusterError::Nats(e.to_string()))
    }

    async fn subscribe(&self, subject: String) -> Result<Subscriber, ClusterError> {
        let subscriber = self
            .client
            .subscribe(subject)
            .await
            .map_err(|e| ClusterError::Nats(e.to_string()))?;
        // Only once the server has handled the SUB does a publish from another node reach
        // it: wait for a round trip on this connection, which comes after it.
        self.round_trip().await?;
        Ok(subscriber)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_frames_round_trip() -> Result<(), ClusterError> {
        for frame in [
            StreamFrame::Data(Bytes::from_static(b"data: {}\n\n")),
            StreamFrame::KeepAlive,
            StreamFrame::End,
        ] {
            let numbered = NumberedFrame { n: 7, frame };
            assert_eq!(NumberedFrame::decode(&numbered.encode())?, numbered);
        }
        assert!(NumberedFrame::decode(&Bytes::from_static(b"d123")).is_err());
        assert!(NumberedFrame::decode(&Bytes::from_static(b"x\0\0\0\0\0\0\0\0")).is_err());
        Ok(())
    }

    #[test]
    fn live_events_round_trip_alone_and_in_bursts() -> Result<(), ClusterError> {
        let event = |seq: u64, text: &'static str| LiveEvent {
            seq,
            envelope: Bytes::from_static(text.as_bytes()),
        };
        let one = event(7, r#"{"seq":7}"#);
        assert_eq!(LiveEvent::decode(&one.encode())?, vec![one.clone()]);
        let burst = vec![one, event(8, ""), event(9, r#"{"seq":9}"#)];
        let encoded = LiveEvent::encode_batch(&burst);
        assert_eq!(LiveEvent::decode(&encoded)?, burst);
        // Cut anywhere inside the last event, or its length: refused, not misread.
        for cut in [encoded.len() - 1, encoded.len() - 10, 8 + 12 + 9 + 5] {
            assert!(
                LiveEvent::decode(&encoded.slice(..cut)).is_err(),
                "cut at {cut}"
            );
        }
        assert!(LiveEvent::decode(&Bytes::from_static(b"1234")).is_err());
        Ok(())
    }

    #[test]
    fn a_refusal_without_a_status_still_decodes() -> Result<(), serde_json::Error> {
        let reply: CommandReply =
            serde_json::from_str(r#"{"kind":"refused","code":"internal","message":"m"}"#)?;
        assert_eq!(
            reply,
            CommandReply::Refused {
                code: "internal".into(),
                message: "m".into(),
                status: None
            }
        );
        Ok(())
    }
}
