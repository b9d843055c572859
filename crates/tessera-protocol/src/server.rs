//! Events the server sends. Each goes out inside an [`Envelope`]:
//! `{"type", "seq", "chat_id", "timestamp", "data"}`, with `seq` assigned by the chat's
//! `ChatSession` (one more than the previous event of that chat, never reused).

use serde::{Deserialize, Serialize, Serializer, ser::SerializeMap};
use serde_json::Value;

use crate::ErrorCode;

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
    /// `chat.tool_call` in exactly the spec's shapes (auto-tool form or UI form).
    ToolCall(Value),
    /// `chat.tool_response` in exactly the spec's shape.
    ToolResponse(Value),
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

/// An event as it goes on the wire. Serialized by hand so the envelope costs no intermediate
/// `Value`.
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    pub seq: u64,
    pub chat_id: &'a str,
    pub timestamp: &'a str,
    pub event: &'a ServerEvent,
}

impl Envelope<'_> {
    /// The envelope as JSON text.
    pub fn to_json(&self) -> String {
        // Serializing plain data (strings, numbers, `Value`s) into a String cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl Serialize for Envelope<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(5))?;
        map.serialize_entry("type", self.event.type_name())?;
        map.serialize_entry("seq", &self.seq)?;
        map.serialize_entry("chat_id", self.chat_id)?;
        map.serialize_entry("timestamp", self.timestamp)?;
        map.serialize_entry("data", self.event)?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        let ev = ServerEvent::ToolCall(json!({"kind":"tool_call","corr":"x"}));
        let env = Envelope {
            seq: 1,
            chat_id: "c",
            timestamp: "t",
            event: &ev,
        };
        let v: Value = serde_json::from_str(&env.to_json()).expect("valid json");
        assert_eq!(v["type"], "chat.tool_call");
        assert_eq!(v["data"], json!({"kind":"tool_call","corr":"x"}));
    }
}
