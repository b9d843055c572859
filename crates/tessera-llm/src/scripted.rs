//! The scripted demo model: replays a workflow's `demo.json` so that every shipped workflow runs
//! offline, deterministically, with no API key.
//!
//! Format:
//!
//! ```json
//! {
//!   "description": "What this demo shows",
//!   "agents": {
//!     "Researcher": [
//!       {"tool_calls": [{"name": "search", "arguments": {"query": "{{last_user_message}}"}}]},
//!       {"content": "Here is what I found about {{last_user_message}}."}
//!     ],
//!     "Critic": [{"json": {"verdict": "approve", "score": 8}}]
//!   },
//!   "loop_from": {"Researcher": 0}
//! }
//! ```
//!
//! A reply is `{"content": text}`, `{"json": value}` (sent as the value's JSON text), or
//! `{"tool_calls": [{"name", "arguments": {..}}]}`, optionally with `"content"` too. Keys that
//! start with `_` are comments. The model keeps no state: the reply for agent `A` is chosen by
//! counting the assistant messages named `A` already in the request, so concurrent chats never
//! interfere and a resumed chat picks up where it stopped. Past the last reply the script
//! cycles from `loop_from[A]` (by default the last reply repeats).
//!
//! `{{last_user_message}}` in any text is replaced by the last user message; inside `json` and
//! tool-call `arguments` it is substituted in string values after parsing, so quotes in the
//! user's text stay valid JSON.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value};

use crate::{
    ChatModel, ChatRequest, ChatResponse, DeltaSink, LlmError, Message, Role, ToolCall, Usage,
};

/// The placeholder replaced by the text of the last user message.
pub const LAST_USER_MESSAGE: &str = "{{last_user_message}}";

/// The label (and reported model name) of the scripted model, so users always see that the
/// answers are canned.
pub const DEMO_LABEL: &str = "demo (scripted)";

/// A [`ChatModel`] that replays a `demo.json` script. Parsed once at construction; a call only
/// clones pre-built shared text (or substitutes the placeholder where the script uses it).
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    description: Arc<str>,
    agents: Arc<HashMap<String, AgentScript>>,
}

#[derive(Debug)]
struct AgentScript {
    replies: Vec<Reply>,
    /// Index the script cycles back to after the last reply.
    loop_from: usize,
    /// The agent name made safe for tool-call ids.
    id_prefix: String,
}

#[derive(Debug)]
struct Reply {
    content: Option<Content>,
    tool_calls: Vec<ScriptedCall>,
}

#[derive(Debug)]
enum Content {
    /// Final text, shared by every call.
    Fixed(Arc<str>),
    /// Plain text containing the placeholder.
    Text(String),
    /// A JSON value with the placeholder in some string; serialized after substitution.
    Json(Value),
}

#[derive(Debug)]
struct ScriptedCall {
    name: String,
    arguments: Arguments,
}

#[derive(Debug)]
enum Arguments {
    /// Final JSON text of the arguments.
    Fixed(String),
    /// Arguments with the placeholder in some string value.
    Template(Value),
}

fn script_error(msg: impl Into<String>) -> LlmError {
    LlmError::Script(msg.into())
}

impl ScriptedModel {
    /// Parse and validate a script. Every problem (missing agents, empty reply lists, unknown
    /// reply keys, `loop_from` out of range) is reported now, not on the first call.
    pub fn from_json(script: &Value) -> Result<Self, LlmError> {
        let root = script
            .as_object()
            .ok_or_else(|| script_error("the demo script must be a JSON object"))?;
        let description = match root.get("description") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err(script_error("`description` must be a string")),
        };
        let agents_json = root
            .get("agents")
            .and_then(Value::as_object)
            .ok_or_else(|| script_error("the demo script needs an `agents` object"))?;
        let loop_from = match root.get("loop_from") {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => Some(map),
            Some(_) => return Err(script_error("`loop_from` must be an object")),
        };
        if let Some(loop_from) = loop_from
            && let Some(unknown) = loop_from.keys().find(|a| !agents_json.contains_key(*a))
        {
            return Err(script_error(format!(
                "`loop_from` names agent {unknown:?}, which has no replies"
            )));
        }

        let mut agents = HashMap::with_capacity(agents_json.len());
        for (agent, replies_json) in agents_json {
            let replies_json = replies_json.as_array().ok_or_else(|| {
                script_error(format!("agents.{agent} must be an array of replies"))
            })?;
            if replies_json.is_empty() {
                return Err(script_error(format!("agents.{agent} has no replies")));
            }
            let replies = replies_json
                .iter()
                .enumerate()
                .map(|(i, reply)| {
                    parse_reply(reply)
                        .map_err(|e| script_error(format!("agents.{agent}[{i}]: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let last = replies.len() - 1;
            let loop_from = match loop_from.and_then(|m| m.get(agent)) {
                None => last,
                Some(v) => match v.as_u64() {
                    Some(i) if i <= last as u64 => i as usize,
                    _ => {
                        return Err(script_error(format!(
                            "loop_from.{agent} must be an index between 0 and {last}, got {v}"
                        )));
                    }
                },
            };
            let id_prefix = agent
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            agents.insert(
                agent.clone(),
                AgentScript {
                    replies,
                    loop_from,
                    id_prefix,
                },
            );
        }
        Ok(Self {
            description: description.into(),
            agents: Arc::new(agents),
        })
    }

    /// Read and parse a `demo.json` file.
    pub fn from_file(path: &Path) -> Result<Self, LlmError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| script_error(format!("cannot read {}: {e}", path.display())))?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| script_error(format!("{} is not valid JSON: {e}", path.display())))?;
        Self::from_json(&json).map_err(|e| match e {
            LlmError::Script(msg) => script_error(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    /// The script's description, for showing what the demo does.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Whether the script has replies for `agent`; lets a workflow loader check coverage
    /// before any chat starts.
    pub fn has_agent(&self, agent: &str) -> bool {
        self.agents.contains_key(agent)
    }

    /// The scripted agents, sorted, for diagnostics.
    pub fn agents(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.agents.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Build the response to `request` (pure; no streaming).
    fn respond(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let agent = request.agent.as_str();
        let script = self.agents.get(agent).ok_or_else(|| {
            script_error(format!(
                "the demo script has no replies for agent {agent:?} (scripted agents: {})",
                self.agents().join(", ")
            ))
        })?;
        let k = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant && m.name.as_deref() == Some(agent))
            .count();
        let replies = &script.replies;
        let index = if k < replies.len() {
            k
        } else {
            script.loop_from + (k - replies.len()) % (replies.len() - script.loop_from)
        };
        let reply = &replies[index];

        let last_user = || {
            request
                .messages
                .iter()
                .rev()
                .find(|m| m.role == Role::User)
                .map(Message::content_str)
                .unwrap_or("")
        };
        let content: Option<Arc<str>> = reply.content.as_ref().map(|c| match c {
            Content::Fixed(text) => Arc::clone(text),
            Content::Text(text) => text.replace(LAST_USER_MESSAGE, last_user()).into(),
            Content::Json(value) => substitute(value, last_user()).to_string().into(),
        });
        let tool_calls: Vec<ToolCall> = reply
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, call)| ToolCall {
                id: format!("call_{}_{k}_{i}", script.id_prefix),
                name: call.name.clone(),
                arguments: match &call.arguments {
                    Arguments::Fixed(text) => text.clone(),
                    Arguments::Template(value) => substitute(value, last_user()).to_string(),
                },
            })
            .collect();

        let prompt_chars: usize = request
            .messages
            .iter()
            .map(|m| {
                m.content_str().chars().count()
                    + m.tool_calls
                        .iter()
                        .map(|c| c.arguments.len())
                        .sum::<usize>()
            })
            .sum();
        let completion_chars = content.as_deref().map_or(0, |c| c.chars().count())
            + tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.len())
                .sum::<usize>();
        let finish_reason = if tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        Ok(ChatResponse {
            message: Message {
                role: Role::Assistant,
                content,
                name: Some(agent.into()),
                tool_calls,
                tool_call_id: None,
            },
            usage: Usage {
                prompt_tokens: approx_tokens(prompt_chars),
                completion_tokens: approx_tokens(completion_chars),
            },
            finish_reason: Some(finish_reason.to_owned()),
            model: DEMO_LABEL.to_owned(),
        })
    }
}

impl ChatModel for ScriptedModel {
    fn complete(
        &self,
        request: ChatRequest,
        deltas: Option<DeltaSink>,
    ) -> BoxFuture<'static, Result<ChatResponse, LlmError>> {
        let result = self.respond(&request);
        let stream = request.stream;
        Box::pin(async move {
            let response = result?;
            if let (true, Some(mut sink), Some(text)) =
                (stream, deltas, response.message.content.as_deref())
            {
                for word in word_deltas(text) {
                    sink(word);
                }
            }
            Ok(response)
        })
    }

    fn label(&self) -> &str {
        DEMO_LABEL
    }

    fn is_demo(&self) -> bool {
        true
    }
}

/// Roughly four characters per token, and never zero, so that usage events look real.
fn approx_tokens(chars: usize) -> u64 {
    (chars.div_ceil(4) as u64).max(1)
}

/// Split `text` into word-sized pieces, each starting with the whitespace before its word, so
/// that the pieces concatenate back to exactly `text`.
pub(crate) fn word_deltas(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let word_start = rest
            .find(|c: char| !c.is_whitespace())
            .unwrap_or(rest.len());
        let end = rest[word_start..]
            .find(char::is_whitespace)
            .map_or(rest.len(), |i| word_start + i);
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

fn parse_reply(reply: &Value) -> Result<Reply, String> {
    let obj = reply.as_object().ok_or("a reply must be an object")?;
    check_keys(obj, &["content", "json", "tool_calls"])?;
    let content = match (obj.get("content"), obj.get("json")) {
        (Some(_), Some(_)) => {
            return Err("a reply has either `content` or `json`, not both".to_owned());
        }
        (Some(Value::String(text)), None) => Some(if text.contains(LAST_USER_MESSAGE) {
            Content::Text(text.clone())
        } else {
            Content::Fixed(text.as_str().into())
        }),
        (Some(_), None) => return Err("`content` must be a string".to_owned()),
        (None, Some(value)) => Some(if has_placeholder(value) {
            Content::Json(value.clone())
        } else {
            Content::Fixed(value.to_string().into())
        }),
        (None, None) => None,
    };
    let tool_calls = match obj.get("tool_calls") {
        None => Vec::new(),
        Some(Value::Array(calls)) if !calls.is_empty() => calls
            .iter()
            .enumerate()
            .map(|(i, call)| parse_call(call).map_err(|e| format!("tool_calls[{i}]: {e}")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("`tool_calls` must be a non-empty array".to_owned()),
    };
    if content.is_none() && tool_calls.is_empty() {
        return Err("a reply needs `content`, `json` or `tool_calls`".to_owned());
    }
    Ok(Reply {
        content,
        tool_calls,
    })
}

fn parse_call(call: &Value) -> Result<ScriptedCall, String> {
    let obj = call.as_object().ok_or("a tool call must be an object")?;
    check_keys(obj, &["name", "arguments"])?;
    let name = match obj.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => return Err("`name` must be a non-empty string".to_owned()),
    };
    let arguments = match obj.get("arguments") {
        None => Arguments::Fixed("{}".to_owned()),
        Some(value @ Value::Object(_)) if has_placeholder(value) => {
            Arguments::Template(value.clone())
        }
        Some(value @ Value::Object(_)) => Arguments::Fixed(value.to_string()),
        Some(_) => return Err("`arguments` must be an object".to_owned()),
    };
    Ok(ScriptedCall { name, arguments })
}

/// Reject unknown keys (typos would otherwise silently drop part of a reply); `_`-prefixed keys
/// are comments.
fn check_keys(obj: &Map<String, Value>, allowed: &[&str]) -> Result<(), String> {
    match obj
        .keys()
        .find(|k| !k.starts_with('_') && !allowed.contains(&k.as_str()))
    {
        Some(key) => Err(format!(
            "unknown key {key:?} (expected {})",
            allowed.join(", ")
        )),
        None => Ok(()),
    }
}

fn has_placeholder(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains(LAST_USER_MESSAGE),
        Value::Array(items) => items.iter().any(has_placeholder),
        Value::Object(map) => map.values().any(has_placeholder),
        _ => false,
    }
}

/// A copy of `value` with the placeholder replaced in every string value.
fn substitute(value: &Value, replacement: &str) -> Value {
    match value {
        Value::String(s) if s.contains(LAST_USER_MESSAGE) => {
            Value::String(s.replace(LAST_USER_MESSAGE, replacement))
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| substitute(v, replacement)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), substitute(v, replacement)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_deltas_concatenate_to_the_text() {
        for text in [
            "",
            "one",
            "Hello world",
            "  lead\nand  trail  ",
            "héllo 🌍 wörld",
            " ",
        ] {
            let pieces: Vec<&str> = word_deltas(text).collect();
            assert_eq!(pieces.concat(), text);
            assert!(pieces.iter().all(|p| !p.is_empty()));
        }
        assert_eq!(
            word_deltas("Hello big world").collect::<Vec<_>>(),
            vec!["Hello", " big", " world"]
        );
    }

    #[test]
    fn approx_tokens_is_never_zero() {
        assert_eq!(approx_tokens(0), 1);
        assert_eq!(approx_tokens(4), 1);
        assert_eq!(approx_tokens(5), 2);
    }
}
