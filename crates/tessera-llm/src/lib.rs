//! Talking to language models.
//!
//! The engine sees only [`ChatModel`]: one request in, one assistant message out. Two
//! implementations ship: [`openai::OpenAiClient`] for any OpenAI-compatible HTTP endpoint and
//! [`scripted::ScriptedModel`], which replays a workflow's `demo.json` so every shipped workflow
//! runs offline. The scripted model is labelled as a demo everywhere a user can see it.

mod error;
pub mod openai;
pub mod scripted;
mod types;

use futures::future::BoxFuture;

pub use error::LlmError;
pub use types::{
    ChatRequest, ChatResponse, DeltaSink, Message, Messages, ResponseFormat, Role, ToolCall,
    ToolChoice, ToolSpec, Tools, Usage, WireCache, WirePrefix,
};

/// A chat-completions model. Implementations must be cheap to share (`Arc<dyn ChatModel>`) and
/// safe to call from many chats at once: they hold no per-chat state.
pub trait ChatModel: Send + Sync + 'static {
    /// Run one completion. When `deltas` is given and the request asks to stream, text
    /// fragments are passed to it as they arrive; the returned response is always complete.
    fn complete(
        &self,
        request: ChatRequest,
        deltas: Option<DeltaSink>,
    ) -> BoxFuture<'static, Result<ChatResponse, LlmError>>;

    /// A short label shown to users, e.g. `"gpt-4o-mini"` or `"demo (scripted)"`.
    fn label(&self) -> &str;

    /// The `gen_ai.provider.name` of the model's spans (OpenTelemetry GenAI conventions).
    fn provider_name(&self) -> &'static str {
        "tessera.scripted"
    }

    /// True for the scripted demo model, so that clients can say the answers are canned.
    fn is_demo(&self) -> bool {
        false
    }
}
