//! The records the store reads and writes.
//!
//! WHY plain data types (no database handles): the engine builds them from its in-memory
//! state and rebuilds its state from them after a restart, whatever backend sits behind
//! [`crate::ChatStore`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Status of a chat waiting for the user's next message; the state every new chat starts in.
pub const STATUS_AWAITING_USER: &str = "awaiting_user";
/// Status of a finished chat; the only status [`crate::ChatStore::list_open_chats`] skips.
pub const STATUS_COMPLETED: &str = "completed";

/// Identity of a chat, fixed at creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatRecord {
    /// Globally unique chat id.
    pub chat_id: String,
    /// Owning tenant (app id).
    pub tenant: String,
    /// Owning user within the tenant.
    pub user_id: String,
    /// Workflow the chat runs.
    pub workflow: String,
    /// Version of the workflow the chat started with (`Workflow::version`); empty for chats
    /// stored before versions were recorded.
    pub workflow_version: String,
    /// Creation time, Unix milliseconds.
    pub created_at_ms: i64,
}

/// The mutable part of a chat the engine needs to resume it.
///
/// `context` must never contain secrets: the caller strips them before saving.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatState {
    /// Engine status (`awaiting_user`, `running`, `completed`, ...).
    pub status: String,
    /// Agent currently holding the conversation (empty before the first turn).
    pub current_agent: String,
    /// Number of user turns so far.
    pub turn: u32,
    /// Consecutive agent replies without user input (loop guard).
    pub consecutive: u32,
    /// Workflow context variables (secret-free).
    pub context: Map<String, Value>,
    /// Last update time, Unix milliseconds.
    pub updated_at_ms: i64,
}

impl ChatState {
    /// The state a freshly created chat has.
    pub fn initial(updated_at_ms: i64) -> Self {
        Self {
            status: STATUS_AWAITING_USER.to_owned(),
            current_agent: String::new(),
            turn: 0,
            consecutive: 0,
            context: Map::new(),
            updated_at_ms,
        }
    }
}

/// A chat with its current state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredChat {
    /// Identity.
    pub record: ChatRecord,
    /// Latest saved state.
    pub state: ChatState,
}

/// One transcript message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// 0-based position in the transcript; unique per chat.
    pub idx: u64,
    /// Stable message id shown to clients.
    pub message_id: String,
    /// `user`, `assistant`, `tool`, `system`.
    pub role: String,
    /// Agent that wrote it, for assistant/tool messages.
    pub agent: Option<String>,
    /// Display text.
    pub content: String,
    /// Hidden from the UI transcript (still part of the model history).
    pub ui_hidden: bool,
    /// The full LLM message as JSON, used to rebuild the model history.
    pub raw: Value,
}

/// One entry of the per-chat event log replayed to reconnecting clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEvent {
    /// Sequence number, unique per chat.
    pub seq: u64,
    /// Event type tag, for filtering without parsing `json`.
    pub event_type: String,
    /// The serialized event, exactly as sent.
    pub json: String,
}

/// A UI tool call waiting for the user's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingUiRecord {
    /// Correlation id the client answers with; unique per chat.
    pub corr: String,
    /// The turn/tool-call key the answer resumes.
    pub turn_key: String,
    /// The UI call payload, re-sent on reconnect.
    pub call: Value,
    /// When it was issued, Unix milliseconds.
    pub created_at_ms: i64,
    /// When it expires, Unix milliseconds; `None` = never.
    pub timeout_at_ms: Option<i64>,
}

/// Outcome of [`crate::ChatStore::claim_tool`], the exactly-once gate for tool side effects.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolClaim {
    /// This caller won the claim and must run the tool, then call `complete_tool`.
    Claimed,
    /// Someone claimed it before and never completed it: either it is running now or the
    /// process crashed mid-call. Either way: do not run it again (report "interrupted").
    AlreadyStarted,
    /// It already ran; here is its recorded result (if one was recorded).
    AlreadyCompleted(Option<Value>),
}
