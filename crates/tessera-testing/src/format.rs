//! The test-file format (`workflows/<Name>/tests/*.json`); README "Testing workflows" documents
//! it for authors.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One test case of a workflow.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TestFile {
    /// What the case shows (free text).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Initial values of declared context variables.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub context: Map<String, Value>,
    /// The model's replies, in the `demo.json` format (`agents`, `loop_from`); absent means the
    /// workflow's own `demo.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Value>,
    /// What the user does, in order. Each step runs once the chat has settled (nothing left to
    /// do but wait for the user or a UI answer).
    #[serde(default)]
    pub steps: Vec<Step>,
    /// What must have happened once the last step has settled.
    #[serde(default)]
    pub expect: Expect,
}

/// One thing the user does.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Types a message (the chat must be waiting for the user).
    User(String),
    /// Answers the pending UI tool call.
    Answer(Answer),
    /// Leaves the pending UI call of this tool unanswered until its timeout passes (in
    /// virtual time: a 15-minute timeout takes no real time).
    Timeout(String),
    /// Presses cancel (stops the running turn or the UI wait).
    Cancel(Empty),
}

/// `{}`: a step that takes no argument (`{"cancel": {}}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// A UI tool answer, as the browser sends it in `chat.tool_response` (without `corr`, which
/// the runner fills in from the pending call).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// The tool that must be waiting (checked when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// `success` (default) or `error`.
    #[serde(default = "success")]
    pub status: String,
    /// e.g. `submit`, `approve`, `cancel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The component's data (secret fields are stripped by the engine, as in production).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Error message (with `status: "error"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Error code (with `status: "error"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

fn success() -> String {
    "success".to_owned()
}

impl Answer {
    /// The `chat.tool_response` data for the pending call `corr`.
    pub fn response(&self, corr: &str) -> Value {
        let mut map = Map::new();
        map.insert("corr".into(), corr.into());
        map.insert("status".into(), self.status.clone().into());
        let optional = [
            ("action", self.action.clone().map(Value::from)),
            ("data", self.data.clone()),
            ("message", self.message.clone().map(Value::from)),
            ("code", self.code.clone().map(Value::from)),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                map.insert(key.into(), value);
            }
        }
        Value::Object(map)
    }
}

/// Expectations; each absent one is not checked.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Every event in order (without [`IGNORED_EVENTS`]); each entry matches by type, agent,
    /// tool and a subset of `data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<ExpectedEvent>>,
    /// Context variables at the end (only the ones named are checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Map<String, Value>>,
    /// Handoffs taken, in order, as `"From -> To"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoffs: Option<Vec<String>>,
    /// Tools called, in order (each call must be announced and answered exactly once
    /// whether or not this is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<String>>,
    /// `awaiting_user`, `awaiting_tool` or `completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// One expected event.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedEvent {
    /// Event type, e.g. `chat.text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `data.agent` (or `data.agent_name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// `data.tool_name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// A subset of `data`: every key given must match (objects recursively; arrays entry by
    /// entry with the same length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// Event types the runner leaves out: connection bookkeeping, token counts and streaming
/// deltas say nothing about what the workflow did.
pub const IGNORED_EVENTS: &[&str] = &[
    "chat.session",
    "chat.resume_boundary",
    "chat.ack",
    "chat.usage",
    "chat.text_delta",
];

/// Keys whose values change from run to run (correlation ids, message ids, timings) or repeat
/// what `agent` / `tool` already say: left out of the expectations `--update` writes. Besides
/// these, every `id`, `*_id`, `*_at_ms` and `*_path` key is left out (ids, timestamps and
/// download paths that tools such as `add_task` or `generate_and_download` make up).
const VOLATILE_KEYS: &[&str] = &["corr", "latency_ms", "turn_idempotency_key"];

fn volatile(key: &str) -> bool {
    VOLATILE_KEYS.contains(&key)
        || key == "id"
        || key.ends_with("_id")
        || key.ends_with("_at_ms")
        || key.ends_with("_path")
}

/// `data.agent` or `data.agent_name` of an event.
pub fn event_agent(data: &Value) -> Option<&str> {
    data.get("agent")
        .or_else(|| data.get("agent_name"))
        .and_then(Value::as_str)
}

/// The expectation that matches `event` (`{type, data}`) exactly, minus volatile values: what
/// `--update` and `tessera record` write.
pub fn expected_from(kind: &str, data: &Value) -> ExpectedEvent {
    let agent = event_agent(data).map(str::to_owned);
    let tool = data
        .get("tool_name")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut data = strip_volatile(data);
    if let Value::Object(map) = &mut data {
        if agent.is_some() {
            map.remove("agent");
            if map.get("agent_name").and_then(Value::as_str) == agent.as_deref() {
                map.remove("agent_name");
            }
        }
        if tool.is_some() {
            map.remove("tool_name");
        }
    }
    let empty = data.as_object().is_some_and(Map::is_empty);
    ExpectedEvent {
        kind: kind.to_owned(),
        agent,
        tool,
        data: (!empty).then_some(data),
    }
}

fn strip_volatile(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !volatile(k))
                .map(|(k, v)| (k.clone(), strip_volatile(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_volatile).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn steps_read_as_one_key_objects() {
        let steps: Vec<Step> = serde_json::from_value(json!([
            {"user": "hi"},
            {"answer": {"tool": "form", "data": {"a": 1}}},
            {"timeout": "form"},
            {"cancel": {}}
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(steps[0], Step::User("hi".into()));
        let Step::Answer(answer) = &steps[1] else {
            panic!("{:?}", steps[1])
        };
        assert_eq!(answer.status, "success");
        assert_eq!(
            answer.response("ui_1"),
            json!({"corr": "ui_1", "status": "success", "data": {"a": 1}})
        );
        assert_eq!(steps[2], Step::Timeout("form".into()));
        assert_eq!(steps[3], Step::Cancel(Empty {}));
        let typo = serde_json::from_value::<Step>(json!({"usr": "hi"}));
        assert!(typo.is_err());
    }

    #[test]
    fn expectations_drop_volatile_ids_and_lift_agent_and_tool() {
        let e = expected_from(
            "chat.tool_response",
            &json!({"agent": "A", "tool_name": "t", "corr": "ui_123",
                    "payload": {"status": "success", "ui_event_id": "ui_9"}}),
        );
        assert_eq!(e.agent.as_deref(), Some("A"));
        assert_eq!(e.tool.as_deref(), Some("t"));
        assert_eq!(e.data, Some(json!({"payload": {"status": "success"}})));
        let bare = expected_from("chat.input_request", &json!({"agent": "A"}));
        assert_eq!(bare.data, None);
    }
}
