//! The one trait every executable tool implements, and the context it runs in.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value};

use crate::ToolError;

/// Who and where a tool runs for. The engine fills it; a tool must scope every read and write
/// to `app_id` (tenant) and `user_id`, so no tool can see another tenant's data.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The chat the call belongs to.
    pub chat_id: Arc<str>,
    /// The tenant.
    pub app_id: Arc<str>,
    /// The user, within the tenant.
    pub user_id: Arc<str>,
    /// The workflow the chat runs.
    pub workflow_name: Arc<str>,
    /// `{chat_id}`-scoped key of the agent turn this call belongs to.
    pub turn_idempotency_key: Arc<str>,
    /// The agent that made the call.
    pub agent_name: Arc<str>,
}

impl ToolContext {
    /// The `context_variables` object the spec injects into tool kwargs.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "chat_id": &*self.chat_id,
            "app_id": &*self.app_id,
            "user_id": &*self.user_id,
            "workflow_name": &*self.workflow_name,
            "turn_idempotency_key": &*self.turn_idempotency_key,
            "agent_name": &*self.agent_name,
        })
    }
}

/// An executable tool. `args` are already validated and normalized against the tool's schema
/// (see [`crate::args`]); the returned value is the tool's JSON result, which the engine
/// truncates before the model sees it. Implementations are shared by all chats.
pub trait Tool: Send + Sync + 'static {
    /// Run the tool. A business failure is `Ok` with `"status": "error"`; `Err` is for calls
    /// that produced no result (timeout, transport failure, cancellation).
    fn invoke(
        &self,
        args: Map<String, Value>,
        ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>>;
}
