//! What a chat's helpers (runner, auto tools, correlator) publish to the chat: the
//! [`Publish`] message they send through a `Recipient<Publish>`, and the builders of the typed
//! `chat.tool_call` / `chat.tool_response` events, in one place so the auto-tool, agent-tool
//! and UI paths cannot drift apart.

use std::sync::Arc;

use actix::Message;
use serde_json::{Map, Value};
use tessera_protocol::{
    InteractionType, ServerEvent, ToolAnnouncement, ToolCallEvent, ToolResponseEvent,
};

/// Publish an event to the chat: it gets the next `seq`, enters the log, and goes to every
/// subscriber. Helpers publish only through this; the chat's session handles it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Publish(pub ServerEvent);

/// What a `chat.tool_call` announces.
pub struct ToolCallInfo<'a> {
    /// The names are the plan's shared strings: each event takes a reference count, not a copy.
    pub agent: &'a Arc<str>,
    pub tool_name: &'a Arc<str>,
    /// The correlation id: the turn key for auto tools, the invocation key for agent tools.
    pub corr: &'a str,
    pub component_type: Option<&'a str>,
    pub workflow_name: &'a Arc<str>,
    pub interaction: InteractionType,
}

/// `chat.tool_call` with `awaiting_response: false` (the runtime handles the tool itself).
pub fn tool_call_event(info: &ToolCallInfo<'_>, tool_args: &Map<String, Value>) -> ServerEvent {
    ServerEvent::ToolCall(ToolCallEvent::Announced(ToolAnnouncement {
        agent: Arc::clone(info.agent),
        tool_name: Arc::clone(info.tool_name),
        corr: info.corr.to_owned(),
        component_type: info.component_type.map(str::to_owned),
        workflow_name: Arc::clone(info.workflow_name),
        interaction: info.interaction,
        tool_args: tool_args.clone(),
    }))
}

/// `chat.tool_response` with the spec's success rule; `ended_ui_call` is the corr of the UI
/// call the tool waited for, if any.
pub fn tool_response_event(
    info: &ToolCallInfo<'_>,
    handler_ok: bool,
    result: Arc<Value>,
    ended_ui_call: Option<String>,
) -> ServerEvent {
    ServerEvent::ToolResponse(ToolResponseEvent {
        agent: Arc::clone(info.agent),
        tool_name: Arc::clone(info.tool_name),
        corr: info.corr.to_owned(),
        handler_ok,
        success: tessera_tools::is_success(handler_ok, &result),
        interaction: info.interaction,
        result,
        ended_ui_call,
    })
}
