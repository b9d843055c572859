//! Provider-neutral chat types. They mirror the OpenAI chat-completions shapes because that is
//! the API every supported endpoint (OpenAI, Ollama, vLLM, llama.cpp, LiteLLM) speaks.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a message in the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions that frame the conversation.
    System,
    /// The human (or the workflow acting for them).
    User,
    /// A model's answer; `Message::name` says which agent wrote it.
    Assistant,
    /// The result of a tool call, answering `Message::tool_call_id`.
    Tool,
}

/// One tool call requested by the model. `arguments` is the raw JSON text the model produced:
/// it is untrusted and is parsed and validated by the tool layer, never here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id; the tool result message refers to it.
    pub id: String,
    /// The tool to run.
    pub name: String,
    /// JSON text of the arguments, as produced by the model.
    pub arguments: String,
}

/// One message of the conversation. Content is an `Arc<str>` so that a transcript can be handed
/// to every model call of a turn without copying its text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote the message.
    pub role: Role,
    /// The text, if any (`None` for a pure tool-call message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Arc<str>>,
    /// The agent that wrote an assistant message (OpenAI's `name` field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
    /// Tools the assistant asked to run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: the id of the call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// This message in the provider's wire format, made when it is first sent.
    #[serde(skip)]
    pub wire: WireCache,
}

/// A message's wire encoding, made on first use and shared by every clone of the message:
/// a chat's earlier messages are encoded once, not again in every model request of every
/// later turn. A message is not changed once it has been sent (transcripts only grow); a
/// changed copy made from one that was sent must start from `WireCache::default()`.
#[derive(Clone, Default)]
pub struct WireCache(Arc<OnceLock<Box<str>>>);

impl WireCache {
    /// The cached encoding, or `encode`'s, which is kept for the next request.
    pub fn get_or_encode<E>(&self, encode: impl FnOnce() -> Result<String, E>) -> Result<&str, E> {
        if let Some(text) = self.0.get() {
            return Ok(text);
        }
        let text = encode()?;
        Ok(self.0.get_or_init(|| text.into_boxed_str()))
    }
}

impl std::fmt::Debug for WireCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "WireCache(encoded)"
        } else {
            "WireCache"
        })
    }
}

/// Not part of a message's value: two messages are equal whatever each has cached.
impl PartialEq for WireCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Message {
    /// A message with text content and nothing else.
    pub fn text(role: Role, content: impl Into<Arc<str>>) -> Self {
        Self {
            role,
            content: Some(content.into()),
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            wire: WireCache::default(),
        }
    }

    /// An assistant message written by `agent`.
    pub fn assistant(agent: impl Into<Arc<str>>, content: impl Into<Arc<str>>) -> Self {
        Self {
            name: Some(agent.into()),
            ..Self::text(Role::Assistant, content)
        }
    }

    /// The result of tool call `call_id`, as the model will read it.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<Arc<str>>) -> Self {
        Self {
            tool_call_id: Some(call_id.into()),
            ..Self::text(Role::Tool, content)
        }
    }

    /// The text content, or "" when there is none (e.g. a pure tool-call message).
    pub fn content_str(&self) -> &str {
        self.content.as_deref().unwrap_or("")
    }
}

/// A tool offered to the model (OpenAI function-calling shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls the tool by.
    pub name: String,
    /// What the tool does, for the model to decide when to use it.
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

/// How the model may use the offered tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides whether to call tools.
    Auto,
    /// The model must answer with text.
    None,
    /// The model must call at least one tool.
    Required,
    /// Force one named tool.
    Function(String),
}

/// Ask for output that matches a JSON Schema (OpenAI `response_format: json_schema`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseFormat {
    /// A name for the schema (OpenAI requires one).
    pub name: String,
    /// The JSON Schema the answer must match.
    pub schema: Value,
    /// Ask the provider to enforce the schema exactly.
    pub strict: bool,
}

/// Everything one model call needs. `agent` is metadata for routing, logs and the scripted
/// model; it is not sent to the provider.
///
/// `messages` and `tools` are shared, cheap to clone: an engine hands its transcript and tool
/// specs to every model call without copying them, and appends to the transcript in place
/// between calls once the previous request is dropped (`Arc::make_mut`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The agent asking; used by logs and the scripted model, never sent.
    pub agent: String,
    /// Model name; `None` uses the client's configured default.
    pub model: Option<String>,
    /// The transcript the model sees, oldest first.
    pub messages: Arc<Vec<Message>>,
    /// Tools the model may call; empty for none.
    pub tools: Arc<[ToolSpec]>,
    /// How the model may use `tools`; ignored when `tools` is empty.
    pub tool_choice: Option<ToolChoice>,
    /// Require a JSON answer matching a schema.
    pub response_format: Option<ResponseFormat>,
    /// Sampling temperature; `None` uses the provider's default.
    pub temperature: Option<f32>,
    /// Ask the provider to stream; deltas go to the sink passed to `ChatModel::complete`.
    pub stream: bool,
    /// Most tokens the model may generate (`max_tokens`); `None` leaves it to the provider.
    #[serde(default)]
    pub max_tokens: Option<u32>,
}

impl ChatRequest {
    /// A request for `agent` over `messages` (a `Vec<Message>` or an already shared one) with
    /// no tools, format or overrides.
    pub fn new(agent: impl Into<String>, messages: impl Into<Arc<Vec<Message>>>) -> Self {
        Self {
            agent: agent.into(),
            model: None,
            messages: messages.into(),
            tools: Arc::from([]),
            tool_choice: None,
            response_format: None,
            temperature: None,
            stream: false,
            max_tokens: None,
        }
    }
}

/// Token counts reported by the provider for one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the request (transcript, tools, schema).
    pub prompt_tokens: u64,
    /// Tokens of the answer.
    pub completion_tokens: u64,
}

impl Usage {
    /// Prompt plus completion tokens, for budgets and reports.
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

/// The model's answer to one request: one assistant message (text, tool calls, or both).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The assistant message (`name` is set to the requesting agent).
    pub message: Message,
    /// Token counts for this call (approximate for the scripted model).
    pub usage: Usage,
    /// Why the model stopped (`"stop"`, `"tool_calls"`, `"length"`, ...), when reported.
    pub finish_reason: Option<String>,
    /// The model that answered, as the provider named it.
    pub model: String,
}

/// Receives streamed text fragments as they arrive. Tool-call argument fragments are not
/// passed here: they are assembled into the final `ChatResponse`.
pub type DeltaSink = Box<dyn FnMut(&str) + Send>;
