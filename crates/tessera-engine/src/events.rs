//! Builders for the spec's `chat.tool_call` / `chat.tool_response` shapes, in one place so the
//! auto-tool, agent-tool and UI paths cannot drift apart.

use serde_json::{Map, Value, json};
use tessera_protocol::ServerEvent;

/// Which path invoked a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InteractionType {
    /// Runtime-invoked UI tool for structured output (`auto_tool_execution.md`).
    AutoTool,
    /// A backend tool the model called.
    AgentTool,
}

impl InteractionType {
    fn as_str(self) -> &'static str {
        match self {
            Self::AutoTool => "auto_tool",
            Self::AgentTool => "agent_tool",
        }
    }
}

/// What a `chat.tool_call` announces.
pub struct ToolCallInfo<'a> {
    pub agent: &'a str,
    pub tool_name: &'a str,
    /// The correlation id: the turn key for auto tools, the invocation key for agent tools.
    pub corr: &'a str,
    pub component_type: Option<&'a str>,
    pub workflow_name: &'a str,
    pub interaction: InteractionType,
}

/// `chat.tool_call` with `awaiting_response: false` (the runtime handles the tool itself).
pub fn tool_call_event(info: &ToolCallInfo<'_>, tool_args: &Map<String, Value>) -> ServerEvent {
    let mut event = json!({
        "kind": "tool_call",
        "agent": info.agent,
        "tool_name": info.tool_name,
        "tool_call_id": info.corr,
        "corr": info.corr,
        "awaiting_response": false,
        "component_type": info.component_type,
        "payload": {
            "agent_name": info.agent,
            "interaction_type": info.interaction.as_str(),
            "workflow_name": info.workflow_name,
        },
    });
    // Cloned in, not passed to `json!`, which would copy it by serializing it.
    event["payload"]["tool_args"] = Value::Object(tool_args.clone());
    ServerEvent::ToolCall(event)
}

/// `chat.tool_response` with the spec's success rule.
pub fn tool_response_event(
    info: &ToolCallInfo<'_>,
    handler_ok: bool,
    result: &Value,
) -> ServerEvent {
    let success = tessera_tools::is_success(handler_ok, result);
    let status = if handler_ok { "ok" } else { "error" };
    let content = if success {
        format!("Tool {} completed successfully.", info.tool_name)
    } else {
        format!("Tool {} reported status error.", info.tool_name)
    };
    let mut event = json!({
        "kind": "tool_response",
        "agent": info.agent,
        "tool_name": info.tool_name,
        "call_id": info.corr,
        "corr": info.corr,
        "status": status,
        "success": success,
        "content": content,
        "interaction_type": info.interaction.as_str(),
    });
    // Cloned in, not passed to `json!`, which would copy it by serializing it.
    event["payload"] = result.clone();
    ServerEvent::ToolResponse(event)
}
