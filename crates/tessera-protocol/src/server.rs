//! Events the server sends. Each goes out inside an [`Envelope`]:
//! `{"type", "seq", "chat_id", "timestamp", "data"}`, with `seq` assigned by the chat's
//! `ChatSession` (one more than the previous event of that chat, never reused).

use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ErrorCode;
use crate::tool_events::{ToolCallEvent, ToolResponseEvent};

/// A UI tool call still waiting for the browser, as listed in `chat.session` and re-sent on
/// resume so a reloaded page can answer it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingUiCall {
    pub corr: String,
    pub tool_name: String,
    pub component_type: String,
    pub display: String,
    pub agent: String,
    pub payload: Value,
    /// Seconds until the wait times out, when a timeout applies.
    pub timeout_s: Option<f64>,
}

/// One server event, without its envelope. `data` is the variant's fields (serialized
/// untagged); the wire `type` comes from [`ServerEvent::type_name`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ServerEvent {
    /// Sent on connect: where the chat stands.
    Session {
        workflow: String,
        status: String,
        current_agent: String,
        last_seq: u64,
        pending_ui_calls: Vec<PendingUiCall>,
        /// Label of the model behind the chat, e.g. "demo (scripted)".
        model: String,
        demo: bool,
    },
    /// An agent starts a turn.
    RunStart { agent: String, turn: u32 },
    /// A complete agent (or echoed user) message.
    Text {
        message_id: String,
        agent: String,
        role: String,
        content: String,
        ui_hidden: bool,
    },
    /// A streamed fragment of the message `message_id`.
    TextDelta {
        message_id: String,
        agent: String,
        delta: String,
    },
    /// An agent produced schema-valid structured output.
    StructuredOutputReady {
        agent_name: String,
        model_name: String,
        structured_data: Value,
        auto_tool_mode: bool,
        turn_idempotency_key: String,
    },
    /// `chat.tool_call`: a tool the runtime runs, or a UI call awaiting the browser.
    ToolCall(ToolCallEvent),
    /// `chat.tool_response`: how a tool call ended.
    ToolResponse(ToolResponseEvent),
    /// The chat waits for the user to type.
    InputRequest { agent: String },
    /// Control passes from one agent to another (or to the user, or ends).
    Handoff {
        from: String,
        to: String,
        reason: String,
    },
    /// Tokens used by one model call.
    Usage {
        agent: String,
        model: String,
        prompt_tokens: u64,
        completion_tokens: u64,
        total_tokens: u64,
        /// Wall time of the model call, retries included.
        latency_ms: u64,
    },
    /// A client message was accepted.
    Ack {
        kind: String,
        client_msg_id: Option<String>,
    },
    /// End of a resume replay: everything after `from_seq` up to `last_seq` was sent.
    ResumeBoundary {
        from_seq: u64,
        last_seq: u64,
        replayed: u64,
        pending_ui_calls: Vec<PendingUiCall>,
    },
    /// The run ended (`terminate`, `max_turns`, `cancelled`, `error`).
    RunComplete { reason: String, agent: String },
    /// Something went wrong; `recoverable` says whether the chat can go on.
    Error {
        code: ErrorCode,
        message: String,
        recoverable: bool,
    },
}

impl ServerEvent {
    /// Every wire `type`, for compact encodings that store a type as its index here.
    pub const TYPE_NAMES: [&'static str; 14] = [
        "chat.session",
        "chat.run_start",
        "chat.text",
        "chat.text_delta",
        "chat.structured_output_ready",
        "chat.tool_call",
        "chat.tool_response",
        "chat.input_request",
        "chat.handoff",
        "chat.usage",
        "chat.ack",
        "chat.resume_boundary",
        "chat.run_complete",
        "chat.error",
    ];

    /// The wire `type` of this event.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Session { .. } => "chat.session",
            Self::RunStart { .. } => "chat.run_start",
            Self::Text { .. } => "chat.text",
            Self::TextDelta { .. } => "chat.text_delta",
            Self::StructuredOutputReady { .. } => "chat.structured_output_ready",
            Self::ToolCall(_) => "chat.tool_call",
            Self::ToolResponse(_) => "chat.tool_response",
            Self::InputRequest { .. } => "chat.input_request",
            Self::Handoff { .. } => "chat.handoff",
            Self::Usage { .. } => "chat.usage",
            Self::Ack { .. } => "chat.ack",
            Self::ResumeBoundary { .. } => "chat.resume_boundary",
            Self::RunComplete { .. } => "chat.run_complete",
            Self::Error { .. } => "chat.error",
        }
    }

    /// A `chat.error` event.
    pub fn error(code: ErrorCode, message: impl Into<String>, recoverable: bool) -> Self {
        Self::Error {
            code,
            message: message.into(),
            recoverable,
        }
    }
}

/// An event as it goes on the wire: `{"type", "seq", "chat_id", "timestamp", "data"}`, written
/// by [`Envelope::write_prepared`] on every path (one implementation of the format).
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    pub seq: u64,
    pub chat_id: &'a str,
    pub timestamp: &'a str,
    pub event: &'a ServerEvent,
}

/// `s` as JSON string text, quotes included.
pub fn json_string(s: &str) -> String {
    let mut out = String::new();
    tessera_json::push_escaped(&mut out, s);
    out
}

impl Envelope<'_> {
    /// The envelope as JSON text.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(256);
        let (chat_id, timestamp) = (json_string(self.chat_id), json_string(self.timestamp));
        // Plain data (strings, numbers, `Value`s) cannot fail to serialize.
        match Self::write_prepared(&mut out, self.seq, &chat_id, &timestamp, self.event) {
            Ok(_) => out,
            Err(_) => String::new(),
        }
    }

    /// Appends the envelope of `event` to `out`, with the chat id and timestamp already JSON
    /// strings: the engine escapes a chat's id once and formats the time once per millisecond,
    /// which on small events cost as much as the event data. Returns where `data` lies in `out`.
    pub fn write_prepared(
        out: &mut String,
        seq: u64,
        chat_id_json: &str,
        timestamp_json: &str,
        event: &ServerEvent,
    ) -> serde_json::Result<Range<usize>> {
        write_head(out, event.type_name(), seq, chat_id_json, timestamp_json);
        let start = out.len();
        tessera_json::write(out, event)?;
        let data = start..out.len();
        out.push('}');
        Ok(data)
    }

    /// Appends an envelope whose `data` is already JSON text (`data_json`, as
    /// [`Envelope::write_prepared`] wrote it): rebuilds an event's text exactly from its parts.
    pub fn write_prepared_data(
        out: &mut String,
        type_name: &str,
        seq: u64,
        chat_id_json: &str,
        timestamp_json: &str,
        data_json: &str,
    ) -> serde_json::Result<()> {
        write_head(out, type_name, seq, chat_id_json, timestamp_json);
        out.push_str(data_json);
        out.push('}');
        Ok(())
    }
}

/// Everything of the envelope up to its `data` value.
fn write_head(
    out: &mut String,
    type_name: &str,
    seq: u64,
    chat_id_json: &str,
    timestamp_json: &str,
) {
    out.push_str("{\"type\":");
    tessera_json::push_escaped(out, type_name);
    out.push_str(",\"seq\":");
    out.push_str(itoa::Buffer::new().format(seq));
    out.push_str(",\"chat_id\":");
    out.push_str(chat_id_json);
    out.push_str(",\"timestamp\":");
    out.push_str(timestamp_json);
    out.push_str(",\"data\":");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Serializer, ser::SerializeMap};
    use serde_json::json;

    /// The envelope through serde's generic map serialization: the reference the hand-written
    /// writer must match byte for byte.
    struct Reference<'a>(Envelope<'a>);

    impl Serialize for Reference<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let e = &self.0;
            let mut map = serializer.serialize_map(Some(5))?;
            map.serialize_entry("type", e.event.type_name())?;
            map.serialize_entry("seq", &e.seq)?;
            map.serialize_entry("chat_id", e.chat_id)?;
            map.serialize_entry("timestamp", e.timestamp)?;
            map.serialize_entry("data", e.event)?;
            map.end()
        }
    }

    fn ui_call(corr: &str) -> crate::PendingUiCall {
        crate::PendingUiCall {
            corr: corr.into(),
            tool_name: "t".into(),
            component_type: "C".into(),
            display: "inline".into(),
            agent: "A".into(),
            payload: json!({}),
            timeout_s: None,
        }
    }

    #[test]
    fn same_text_as_serde() {
        let events = [
            ServerEvent::InputRequest {
                agent: "A \"quoted\" agent".into(),
            },
            ServerEvent::error(ErrorCode::Internal, "line\nbreak", true),
            ServerEvent::ToolCall(ToolCallEvent::Announced(crate::ToolAnnouncement {
                agent: "A".into(),
                tool_name: "t".into(),
                corr: "k".into(),
                component_type: None,
                workflow_name: "W".into(),
                interaction: crate::InteractionType::AgentTool,
                tool_args: json!({"é": [1, null]})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            })),
        ];
        let ids = ["chat_1", "chat \"odd\" \\ id\u{1}", "chat_é"];
        for event in &events {
            for chat_id in ids {
                for seq in [0, 7, u64::MAX] {
                    let envelope = Envelope {
                        seq,
                        chat_id,
                        timestamp: "2026-01-01T00:00:00.000Z",
                        event,
                    };
                    let expected = serde_json::to_string(&Reference(envelope)).expect("json");
                    assert_eq!(envelope.to_json(), expected);
                }
            }
        }
    }

    #[test]
    fn rebuilt_from_parts_is_the_same_text() {
        let event = ServerEvent::Handoff {
            from: "A".into(),
            to: "B".into(),
            reason: "after_work".into(),
        };
        let (chat_id, timestamp) = (json_string("c\"1"), json_string("t"));
        let mut whole = String::new();
        let data =
            Envelope::write_prepared(&mut whole, 9, &chat_id, &timestamp, &event).expect("written");
        let mut rebuilt = String::new();
        Envelope::write_prepared_data(
            &mut rebuilt,
            event.type_name(),
            9,
            &chat_id,
            &timestamp,
            &whole[data],
        )
        .expect("written");
        assert_eq!(rebuilt, whole);
    }

    #[test]
    fn type_names_are_listed() {
        let events = [
            ServerEvent::InputRequest { agent: "A".into() },
            ServerEvent::error(ErrorCode::Internal, "x", true),
            ServerEvent::ToolCall(ToolCallEvent::AwaitingUi(ui_call("x"))),
            ServerEvent::ToolResponse(ToolResponseEvent {
                agent: "A".into(),
                tool_name: "t".into(),
                corr: "k".into(),
                handler_ok: true,
                success: true,
                interaction: crate::InteractionType::AgentTool,
                result: std::sync::Arc::new(json!({})),
                ended_ui_call: None,
            }),
            ServerEvent::RunStart {
                agent: "A".into(),
                turn: 1,
            },
        ];
        for event in &events {
            assert!(ServerEvent::TYPE_NAMES.contains(&event.type_name()));
        }
    }

    #[test]
    fn envelope_has_the_five_fields() {
        let ev = ServerEvent::error(ErrorCode::UnknownType, "nope", true);
        let env = Envelope {
            seq: 3,
            chat_id: "c1",
            timestamp: "t",
            event: &ev,
        };
        let v: Value = serde_json::from_str(&env.to_json()).expect("valid json");
        assert_eq!(
            v,
            json!({"type":"chat.error","seq":3,"chat_id":"c1","timestamp":"t",
                   "data":{"code":"unknown_type","message":"nope","recoverable":true}})
        );
    }

    #[test]
    fn tool_call_data_is_passed_through() {
        let call = ToolCallEvent::AwaitingUi(ui_call("x"));
        let ev = ServerEvent::ToolCall(call.clone());
        let env = Envelope {
            seq: 1,
            chat_id: "c",
            timestamp: "t",
            event: &ev,
        };
        let v: Value = serde_json::from_str(&env.to_json()).expect("valid json");
        assert_eq!(v["type"], "chat.tool_call");
        assert_eq!(v["data"], serde_json::to_value(&call).unwrap_or_default());
        assert_eq!(v["data"]["corr"], "x");
    }
}
