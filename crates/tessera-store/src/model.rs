//! The records the store reads and writes.
//!
//! WHY plain data types (no database handles): the engine builds them from its in-memory
//! state and rebuilds its state from them after a restart, whatever backend sits behind
//! [`crate::ChatStore`].

use std::borrow::Cow;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
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
    /// Workflow context variables (secret-free). Shared with the live chat's copy: a state
    /// written after every turn would otherwise copy every variable (see the engine's
    /// `ContextVars`).
    pub context: Arc<Map<String, Value>>,
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
            context: Arc::default(),
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
    /// `user`, `assistant`, `tool`, `system` (borrowed when the engine writes it).
    pub role: Cow<'static, str>,
    /// Agent that wrote it, for assistant/tool messages. Shared with the engine's message.
    pub agent: Option<Arc<str>>,
    /// Display text. Shared with the engine's message.
    pub content: Arc<str>,
    /// Hidden from the UI transcript (still part of the model history).
    pub ui_hidden: bool,
    /// The full LLM message as JSON, used to rebuild the model history.
    pub raw: JsonText,
}

/// A JSON document kept as its text: stored as is, parsed only by whoever reads it.
///
/// WHY not a `Value`: every transcript row the engine queues was turned into a `Value` tree
/// (a map and a string per field) only for the store to write it out as text again. One
/// string instead: 547 allocations per LoadTest turn instead of 557-577 (docs/performance-log.md,
/// fifth session). WHY a `Box<str>` and not serde_json's `RawValue`: a `RawValue` can only be
/// made by serde_json's own writer or by parsing the text again; [`JsonText::new`] writes with
/// `tessera_json` (twenty-sixth session), whose text needs no check.
#[derive(Debug, Clone)]
pub struct JsonText(Box<str>);

impl JsonText {
    /// `value` serialized.
    pub fn new<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        tessera_json::to_string(value).map(|text| Self(text.into_boxed_str()))
    }

    /// `text`, checked to be one JSON document.
    pub fn from_text(text: String) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text).map(|raw| Self(raw.into()))
    }

    /// JSON `null`.
    pub fn null() -> Self {
        Self("null".into())
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        &self.0
    }

    /// The document parsed as a `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.get())
    }
}

/// The document itself, not a string holding it (as a `RawValue` serializes).
impl Serialize for JsonText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let raw: &RawValue = serde_json::from_str(&self.0).map_err(serde::ser::Error::custom)?;
        raw.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(|raw| Self(raw.into()))
    }
}

/// Equal when the texts are: what the store keeps is the text.
impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

/// One entry of the per-chat event log replayed to reconnecting clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEvent {
    /// Sequence number, unique per chat.
    pub seq: u64,
    /// Event type tag, for filtering without parsing `json`. Borrowed when it is one of the
    /// engine's own type names (every event it writes), owned when read back.
    pub event_type: Cow<'static, str>,
    /// The serialized event, exactly as sent. Shared with the text the engine sent to its
    /// clients.
    pub json: Arc<str>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_text_keeps_the_text_and_parses_on_demand() {
        let value = json!({"role": "assistant", "content": "a \"quoted\" é"});
        let text = JsonText::new(&value).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Some(text.get()),
            serde_json::to_string(&value).ok().as_deref()
        );
        assert_eq!(text.parse::<Value>().ok(), Some(value.clone()));
        // Serialized as the document itself, not as a string holding it.
        let wrapped = serde_json::to_string(&json!({"raw": text})).unwrap_or_default();
        assert_eq!(
            serde_json::from_str::<Value>(&wrapped).ok(),
            Some(json!({"raw": value}))
        );
        let again = JsonText::from_text(text.get().to_owned()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again, text);
        assert_ne!(JsonText::null(), text);
        assert_eq!(JsonText::null().get(), "null");
        // Read back from inside a document, its text as it was there.
        #[derive(Deserialize)]
        struct Row {
            raw: JsonText,
        }
        let row: Option<Row> = serde_json::from_str(r#"{"raw": {"a" : [1, "b"]}}"#).ok();
        assert_eq!(row.map(|r| r.raw.0), Some(r#"{"a" : [1, "b"]}"#.into()));
    }

    #[test]
    fn json_text_refuses_what_is_not_one_json_document() {
        assert!(JsonText::from_text("{\"role\":".to_owned()).is_err());
        assert!(JsonText::from_text("1 2".to_owned()).is_err());
        assert!(JsonText::from_text(String::new()).is_err());
    }
}
