//! `chat.tool_call` and `chat.tool_response` as typed data. The engine builds them, the
//! session and the server read their fields, and only the envelope writer turns them into the
//! spec's JSON shapes (keys in the order serde_json writes an object's keys: sorted).

use std::sync::Arc;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::{Map, Value};

use crate::PendingUiCall;

/// Which path invoked a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InteractionType {
    /// Runtime-invoked UI tool for structured output (`auto_tool_execution.md`).
    AutoTool,
    /// A backend tool the model called.
    AgentTool,
}

/// `chat.tool_call`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolCallEvent {
    /// The runtime runs the tool itself (`awaiting_response: false`): an agent tool, or the
    /// announcement of an auto tool before its UI call.
    Announced(ToolAnnouncement),
    /// A UI call the browser must answer (`awaiting_response: true`).
    AwaitingUi(PendingUiCall),
}

/// A tool the runtime runs itself, as `chat.tool_call` announces it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolAnnouncement {
    /// The names are `Arc<str>`, shared with the workflow's compiled plan: every tool call
    /// announces them, and copying them cost an allocation each.
    pub agent: Arc<str>,
    pub tool_name: Arc<str>,
    /// The correlation id: the turn key for auto tools, the invocation key for agent tools.
    pub corr: String,
    pub component_type: Option<String>,
    pub workflow_name: Arc<str>,
    pub interaction: InteractionType,
    pub tool_args: Map<String, Value>,
}

/// `chat.tool_response`: how a tool call ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResponseEvent {
    pub agent: Arc<str>,
    pub tool_name: Arc<str>,
    /// The correlation id of the matching [`ToolAnnouncement`].
    pub corr: String,
    /// The handler itself ran without error (`status: "ok"`, else `"error"`).
    pub handler_ok: bool,
    /// The spec's success rule over the handler and its result.
    pub success: bool,
    pub interaction: InteractionType,
    /// What the agent reads (secrets removed). Shared with the turn's tool result and the
    /// durable completion: a tool's result was copied for each of them.
    pub result: Arc<Value>,
    /// The UI call this response ends, when the tool waited for one (never sent: the
    /// engine's bookkeeping of pending calls).
    pub ended_ui_call: Option<String>,
}

impl ToolResponseEvent {
    /// The sentence shown for the response.
    pub fn content(&self) -> String {
        if self.success {
            format!("Tool {} completed successfully.", self.tool_name)
        } else {
            format!("Tool {} reported status error.", self.tool_name)
        }
    }
}

/// `payload` of an announced call.
struct AnnouncementPayload<'a>(&'a ToolAnnouncement);

impl Serialize for AnnouncementPayload<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let a = self.0;
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("agent_name", &a.agent)?;
        map.serialize_entry("interaction_type", &a.interaction)?;
        map.serialize_entry("tool_args", &a.tool_args)?;
        map.serialize_entry("workflow_name", &a.workflow_name)?;
        map.end()
    }
}

impl Serialize for ToolCallEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Announced(a) => {
                let mut map = serializer.serialize_map(Some(8))?;
                map.serialize_entry("agent", &a.agent)?;
                map.serialize_entry("awaiting_response", &false)?;
                map.serialize_entry("component_type", &a.component_type)?;
                map.serialize_entry("corr", &a.corr)?;
                map.serialize_entry("kind", "tool_call")?;
                map.serialize_entry("payload", &AnnouncementPayload(a))?;
                map.serialize_entry("tool_call_id", &a.corr)?;
                map.serialize_entry("tool_name", &a.tool_name)?;
                map.end()
            }
            Self::AwaitingUi(call) => {
                let mut map = serializer.serialize_map(Some(9))?;
                map.serialize_entry("agent", &call.agent)?;
                map.serialize_entry("awaiting_response", &true)?;
                map.serialize_entry("component_type", &call.component_type)?;
                map.serialize_entry("corr", &call.corr)?;
                map.serialize_entry("display", &call.display)?;
                map.serialize_entry("kind", "tool_call")?;
                map.serialize_entry("payload", &call.payload)?;
                map.serialize_entry("timeout_s", &call.timeout_s)?;
                map.serialize_entry("tool_name", &call.tool_name)?;
                map.end()
            }
        }
    }
}

impl Serialize for ToolResponseEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(10))?;
        map.serialize_entry("agent", &self.agent)?;
        map.serialize_entry("call_id", &self.corr)?;
        map.serialize_entry("content", &self.content())?;
        map.serialize_entry("corr", &self.corr)?;
        map.serialize_entry("interaction_type", &self.interaction)?;
        map.serialize_entry("kind", "tool_response")?;
        map.serialize_entry("payload", &*self.result)?;
        map.serialize_entry("status", if self.handler_ok { "ok" } else { "error" })?;
        map.serialize_entry("success", &self.success)?;
        map.serialize_entry("tool_name", &self.tool_name)?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The shapes the spec (and every client) reads, as the engine built them before they
    /// were typed: `json!` objects.
    #[test]
    fn wire_shapes_are_the_specs() {
        let mut args = Map::new();
        args.insert("message".into(), json!("hi"));
        let announced = ToolCallEvent::Announced(ToolAnnouncement {
            agent: "A".into(),
            tool_name: "echo".into(),
            corr: "k1".into(),
            component_type: None,
            workflow_name: "W".into(),
            interaction: InteractionType::AgentTool,
            tool_args: args,
        });
        let expected = json!({
            "kind": "tool_call", "agent": "A", "tool_name": "echo", "tool_call_id": "k1",
            "corr": "k1", "awaiting_response": false, "component_type": null,
            "payload": {"agent_name": "A", "interaction_type": "agent_tool",
                        "workflow_name": "W", "tool_args": {"message": "hi"}},
        });
        assert_eq!(
            serde_json::to_string(&announced).ok(),
            serde_json::to_string(&expected).ok()
        );

        let ui = ToolCallEvent::AwaitingUi(PendingUiCall {
            corr: "ui_1".into(),
            tool_name: "t".into(),
            component_type: "C".into(),
            display: "inline".into(),
            agent: "A".into(),
            payload: json!({"x": 1}),
            timeout_s: Some(2.5),
        });
        let expected = json!({
            "kind": "tool_call", "tool_name": "t", "component_type": "C", "agent": "A",
            "payload": {"x": 1}, "corr": "ui_1", "awaiting_response": true,
            "display": "inline", "timeout_s": 2.5,
        });
        assert_eq!(
            serde_json::to_string(&ui).ok(),
            serde_json::to_string(&expected).ok()
        );

        let response = ToolResponseEvent {
            agent: "A".into(),
            tool_name: "echo".into(),
            corr: "k1".into(),
            handler_ok: false,
            success: false,
            interaction: InteractionType::AutoTool,
            result: Arc::new(json!({"status": "error"})),
            ended_ui_call: Some("ui_1".into()),
        };
        let expected = json!({
            "kind": "tool_response", "agent": "A", "tool_name": "echo", "call_id": "k1",
            "corr": "k1", "status": "error", "success": false,
            "content": "Tool echo reported status error.", "interaction_type": "auto_tool",
            "payload": {"status": "error"},
        });
        assert_eq!(
            serde_json::to_string(&response).ok(),
            serde_json::to_string(&expected).ok()
        );
    }
}
