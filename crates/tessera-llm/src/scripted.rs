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
//! An agent may instead answer what the user typed: an object of `when` rules, tried in order,
//! and `otherwise` replies when none matches:
//!
//! ```json
//! "TodoAgent": {
//!   "when": [
//!     {"match": "(?i)^\\s*add\\s+(?P<title>.+)$", "replies": [
//!       {"tool_calls": [{"name": "add_task", "arguments": {"title": "{{match.title}}"}}]},
//!       {"content": "Added \"{{tool_result.task.title}}\"."}
//!     ]}
//!   ],
//!   "otherwise": [{"content": "Try: add buy milk"}]
//! }
//! ```
//!
//! `match` is a regular expression (Rust `regex` syntax) searched in the user's message. The
//! replies of the chosen rule are used one per model call since that message (tool call, then
//! the answer that reads its result); past the last, the last repeats. The user's message is the
//! last user message that is not a tool result fed back in the JSON text protocol.
//!
//! Placeholders (see [`template`]): `{{last_user_message}}`, `{{match.NAME}}`,
//! `{{tool_result.PATH}}`, `{{agent_output.AGENT.PATH}}`, each with an optional `|default`.
//! Inside `json` and tool-call `arguments` they are substituted in string values after
//! parsing, so quotes in the user's text stay valid JSON.

mod template;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use regex::Regex;
use serde_json::{Map, Value};

use self::template::{Groups, JsonTemplate, Scope, Template};
use crate::{
    ChatModel, ChatRequest, ChatResponse, DeltaSink, LlmError, Message, Role, ToolCall, Usage,
    WireCache,
};

/// The placeholder replaced by the text of the last user message.
pub const LAST_USER_MESSAGE: &str = "{{last_user_message}}";

/// The label (and reported model name) of the scripted model, so users always see that the
/// answers are canned.
pub const DEMO_LABEL: &str = "demo (scripted)";

/// How the engine feeds tool results and corrections back in the JSON text protocol: as user
/// messages starting like this. They are not what the user typed.
const JSON_TOOL_RESULT_PREFIX: &str = "Tool ";
const JSON_CORRECTION_PREFIX: &str = "Your reply was rejected:";

/// A [`ChatModel`] that replays a `demo.json` script. Parsed once at construction; a call only
/// clones pre-built shared text (or fills the placeholders where the script uses them).
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    description: Arc<str>,
    agents: Arc<HashMap<String, AgentScript>>,
}

#[derive(Debug)]
struct AgentScript {
    mode: Mode,
    /// The agent name made safe for tool-call ids.
    id_prefix: String,
}

#[derive(Debug)]
enum Mode {
    /// One reply per call of the agent over the whole chat.
    Sequence {
        replies: Vec<Reply>,
        /// Index the script cycles back to after the last reply.
        loop_from: usize,
    },
    /// Replies chosen by what the user last typed.
    Rules {
        rules: Vec<Rule>,
        otherwise: Vec<Reply>,
    },
}

#[derive(Debug)]
struct Rule {
    pattern: Regex,
    replies: Vec<Reply>,
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
    /// Plain text with placeholders.
    Text(Template),
    /// A JSON value with placeholders in some strings; serialized after substitution.
    Json(JsonTemplate),
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
    /// Arguments with placeholders in some string values.
    Template(JsonTemplate),
}

fn script_error(msg: impl Into<String>) -> LlmError {
    LlmError::Script(msg.into())
}

impl ScriptedModel {
    /// Parse and validate a script. Every problem (missing agents, empty reply lists, unknown
    /// reply keys, bad regexes or placeholders, `loop_from` out of range) is reported now, not
    /// on the first call.
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
        for (agent, script) in agents_json {
            let mode = match script {
                Value::Array(replies) => {
                    let replies = parse_replies(replies, &format!("agents.{agent}"), None)?;
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
                    Mode::Sequence { replies, loop_from }
                }
                Value::Object(rules) => {
                    if loop_from.is_some_and(|m| m.contains_key(agent)) {
                        return Err(script_error(format!(
                            "loop_from.{agent}: an agent with `when` rules has no sequence to loop"
                        )));
                    }
                    parse_rules(rules, &format!("agents.{agent}")).map_err(script_error)?
                }
                _ => {
                    return Err(script_error(format!(
                        "agents.{agent} must be an array of replies, or an object with `when` rules and `otherwise` replies"
                    )));
                }
            };
            let id_prefix = agent
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            agents.insert(agent.clone(), AgentScript { mode, id_prefix });
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
        // The request's two shared parts as one slice of references (the rules index into it).
        let messages: Vec<&Message> = request.messages.iter().collect();
        let messages = messages.as_slice();
        let is_own = |m: &&Message| m.role == Role::Assistant && m.name.as_deref() == Some(agent);
        let k = messages.iter().filter(|m| is_own(m)).count();
        let typed = messages.iter().rposition(|m| is_typed_by_user(m));
        let user_text = typed.map_or("", |i| messages[i].content_str());

        let (reply, groups) = match &script.mode {
            Mode::Sequence { replies, loop_from } => {
                let index = if k < replies.len() {
                    k
                } else {
                    loop_from + (k - replies.len()) % (replies.len() - loop_from)
                };
                (&replies[index], None)
            }
            Mode::Rules { rules, otherwise } => {
                let since = typed.map_or(messages, |i| &messages[i + 1..]);
                let step = since.iter().filter(|m| is_own(m)).count();
                let (replies, groups) = rules
                    .iter()
                    .find_map(|r| {
                        r.pattern
                            .captures(user_text)
                            .map(|c| (&r.replies, Some((c, &r.pattern))))
                    })
                    .unwrap_or((otherwise, None));
                (&replies[step.min(replies.len() - 1)], groups)
            }
        };
        let scope = Filler {
            messages,
            user_text,
            groups: groups.map(|(captures, pattern)| {
                pattern
                    .capture_names()
                    .flatten()
                    .filter_map(|n| captures.name(n).map(|m| (n, m.as_str())))
                    .collect()
            }),
            tool_result: std::cell::OnceCell::new(),
        };

        let content: Option<Arc<str>> = reply.content.as_ref().map(|c| match c {
            Content::Fixed(text) => Arc::clone(text),
            Content::Text(template) => template.render(&scope).into(),
            Content::Json(template) => template.render(&scope).to_string().into(),
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
                    Arguments::Template(template) => template.render(&scope).to_string(),
                },
            })
            .collect();

        let prompt_chars: usize = messages
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
                wire: WireCache::default(),
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

/// A user message the user typed (not a tool result or correction of the JSON text protocol).
fn is_typed_by_user(message: &Message) -> bool {
    message.role == Role::User && json_tool_result(message).is_none() && {
        let text = message.content_str();
        !text.starts_with(JSON_CORRECTION_PREFIX)
    }
}

/// The result text of a JSON-protocol tool feedback message (`Tool 1 [name]: {…}`).
fn json_tool_result(message: &Message) -> Option<&str> {
    let rest = message
        .content_str()
        .strip_prefix(JSON_TOOL_RESULT_PREFIX)?;
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    let rest = rest.strip_prefix(" [")?;
    let (_, result) = rest.split_once("]: ")?;
    Some(result)
}

/// What placeholders read while one reply is built.
struct Filler<'a> {
    messages: &'a [&'a Message],
    user_text: &'a str,
    groups: Option<Vec<(&'a str, &'a str)>>,
    tool_result: std::cell::OnceCell<Option<Value>>,
}

impl Scope for Filler<'_> {
    fn user_text(&self) -> &str {
        self.user_text
    }

    fn group(&self, name: &str) -> Option<&str> {
        self.groups
            .as_ref()?
            .iter()
            .find_map(|(n, v)| (*n == name).then_some(*v))
    }

    fn tool_result(&self) -> Option<&Value> {
        self.tool_result
            .get_or_init(|| {
                self.messages.iter().rev().find_map(|m| {
                    let text = match m.role {
                        Role::Tool => Some(m.content_str()),
                        Role::User => json_tool_result(m),
                        _ => None,
                    }?;
                    serde_json::from_str(text).ok()
                })
            })
            .as_ref()
    }

    fn agent_output(&self, agent: &str) -> Option<Value> {
        self.messages
            .iter()
            .rev()
            .find(|m| {
                m.role == Role::Assistant && m.name.as_deref() == Some(agent) && m.content.is_some()
            })
            .and_then(|m| serde_json::from_str(m.content_str()).ok())
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

fn parse_replies(replies: &[Value], at: &str, groups: Groups<'_>) -> Result<Vec<Reply>, LlmError> {
    if replies.is_empty() {
        return Err(script_error(format!("{at} has no replies")));
    }
    replies
        .iter()
        .enumerate()
        .map(|(i, reply)| {
            parse_reply(reply, groups).map_err(|e| script_error(format!("{at}[{i}]: {e}")))
        })
        .collect()
}

fn parse_rules(script: &Map<String, Value>, at: &str) -> Result<Mode, String> {
    check_keys(script, &["when", "otherwise"]).map_err(|e| format!("{at}: {e}"))?;
    let otherwise = match script.get("otherwise") {
        Some(Value::Array(replies)) => parse_replies(replies, &format!("{at}.otherwise"), None),
        _ => {
            return Err(format!(
                "{at}.otherwise must be an array of replies (used when no rule matches)"
            ));
        }
    }
    .map_err(|e| e.to_string())?;
    let rules_json = match script.get("when") {
        Some(Value::Array(rules)) => rules,
        _ => {
            return Err(format!(
                "{at}.when must be an array of {{\"match\", \"replies\"}} rules"
            ));
        }
    };
    let mut rules = Vec::with_capacity(rules_json.len());
    for (i, rule) in rules_json.iter().enumerate() {
        let at = format!("{at}.when[{i}]");
        let rule = rule
            .as_object()
            .ok_or_else(|| format!("{at} must be an object with `match` and `replies`"))?;
        check_keys(rule, &["match", "replies"]).map_err(|e| format!("{at}: {e}"))?;
        let pattern = match rule.get("match") {
            Some(Value::String(p)) => {
                Regex::new(p).map_err(|e| format!("{at}.match is not a valid regex: {e}"))?
            }
            _ => {
                return Err(format!(
                    "{at}.match must be a regular expression (a string)"
                ));
            }
        };
        let names: Vec<String> = pattern
            .capture_names()
            .flatten()
            .map(str::to_owned)
            .collect();
        let replies = match rule.get("replies") {
            Some(Value::Array(replies)) => {
                parse_replies(replies, &format!("{at}.replies"), Some(&names))
            }
            _ => return Err(format!("{at}.replies must be an array of replies")),
        }
        .map_err(|e| e.to_string())?;
        rules.push(Rule { pattern, replies });
    }
    Ok(Mode::Rules { rules, otherwise })
}

fn parse_reply(reply: &Value, groups: Groups<'_>) -> Result<Reply, String> {
    let obj = reply.as_object().ok_or("a reply must be an object")?;
    check_keys(obj, &["content", "json", "tool_calls"])?;
    let content = match (obj.get("content"), obj.get("json")) {
        (Some(_), Some(_)) => {
            return Err("a reply has either `content` or `json`, not both".to_owned());
        }
        (Some(Value::String(text)), None) => {
            let template = Template::parse(text, groups)?;
            Some(if template.is_fixed() {
                Content::Fixed(text.as_str().into())
            } else {
                Content::Text(template)
            })
        }
        (Some(_), None) => return Err("`content` must be a string".to_owned()),
        (None, Some(value)) => {
            let template = JsonTemplate::parse(value, groups)?;
            Some(if template.is_fixed() {
                Content::Fixed(value.to_string().into())
            } else {
                Content::Json(template)
            })
        }
        (None, None) => None,
    };
    let tool_calls = match obj.get("tool_calls") {
        None => Vec::new(),
        Some(Value::Array(calls)) if !calls.is_empty() => calls
            .iter()
            .enumerate()
            .map(|(i, call)| parse_call(call, groups).map_err(|e| format!("tool_calls[{i}]: {e}")))
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

fn parse_call(call: &Value, groups: Groups<'_>) -> Result<ScriptedCall, String> {
    let obj = call.as_object().ok_or("a tool call must be an object")?;
    check_keys(obj, &["name", "arguments"])?;
    let name = match obj.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => return Err("`name` must be a non-empty string".to_owned()),
    };
    let arguments = match obj.get("arguments") {
        None => Arguments::Fixed("{}".to_owned()),
        Some(value @ Value::Object(_)) => {
            let template = JsonTemplate::parse(value, groups)?;
            if template.is_fixed() {
                Arguments::Fixed(value.to_string())
            } else {
                Arguments::Template(template)
            }
        }
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
