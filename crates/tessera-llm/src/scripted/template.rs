//! Placeholders in demo-script text and JSON, parsed once when the script loads.
//!
//! `{{source|default}}`, where source is one of:
//!
//! - `last_user_message`: what the user last typed;
//! - `match.NAME`: the named group `NAME` of the rule's `match` regex (trimmed);
//! - `tool_result.PATH`: a value from the latest tool result (parsed as JSON);
//! - `agent_output.AGENT.PATH`: a value from agent `AGENT`'s latest reply (parsed as JSON).
//!
//! A PATH is dot-separated steps: a key, an array index, `key[*]` (every item) or
//! `key[field~NAME]` (the first item whose `field` contains the text of group `NAME`, ignoring
//! case). Values are written as text: strings as they are, arrays of values joined with ", ",
//! anything else as JSON. An empty result is replaced by the default, if given. Inside JSON, a
//! string that is exactly one placeholder becomes the value itself (so an object can be copied).
//!
//! Substitution is a single pass: text that comes from the user or a tool is never expanded
//! again, so a user typing `{{…}}` gets it back verbatim.

use serde_json::{Map, Value};

/// A text with placeholders, split into literal and placeholder parts.
#[derive(Debug, Clone)]
pub(super) struct Template(Vec<Part>);

#[derive(Debug, Clone)]
enum Part {
    Literal(String),
    Var(Var),
}

/// One placeholder.
#[derive(Debug, Clone)]
pub(super) struct Var {
    source: Source,
    default: Option<String>,
}

#[derive(Debug, Clone)]
enum Source {
    LastUserMessage,
    Match(String),
    ToolResult(Vec<Step>),
    AgentOutput { agent: String, path: Vec<Step> },
}

#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
    All,
    Find { field: String, group: String },
}

/// A JSON value whose strings may hold placeholders.
#[derive(Debug, Clone)]
pub(super) enum JsonTemplate {
    /// No placeholder anywhere below: used as is.
    Fixed(Value),
    /// A string that is exactly one placeholder: replaced by the value it names.
    Whole(Var),
    Text(Template),
    Array(Vec<JsonTemplate>),
    Object(Vec<(String, JsonTemplate)>),
}

/// What placeholders can read while one reply is built.
pub(super) trait Scope {
    /// The text the user last typed.
    fn user_text(&self) -> &str;
    /// A named group of the rule's match, if the rule matched with it.
    fn group(&self, name: &str) -> Option<&str>;
    /// The latest tool result, parsed.
    fn tool_result(&self) -> Option<&Value>;
    /// `agent`'s latest reply, parsed.
    fn agent_output(&self, agent: &str) -> Option<Value>;
}

/// Capture-group names a template may use: `None` allows none (there is no regex).
pub(super) type Groups<'a> = Option<&'a [String]>;

impl Template {
    /// Parses `text`; unknown placeholders and groups the rule's regex lacks are errors.
    pub(super) fn parse(text: &str, groups: Groups<'_>) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("{{") {
            let Some(len) = rest[start + 2..].find("}}") else {
                return Err(format!("unclosed placeholder in {text:?}"));
            };
            if start > 0 {
                parts.push(Part::Literal(rest[..start].to_owned()));
            }
            let inner = &rest[start + 2..start + 2 + len];
            parts.push(Part::Var(parse_var(inner, groups)?));
            rest = &rest[start + 2 + len + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        Ok(Template(parts))
    }

    /// Whether the text has no placeholder.
    pub(super) fn is_fixed(&self) -> bool {
        self.0.iter().all(|p| matches!(p, Part::Literal(_)))
    }

    /// The text with every placeholder filled from `scope`.
    pub(super) fn render(&self, scope: &dyn Scope) -> String {
        let mut out = String::new();
        for part in &self.0 {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Var(var) => out.push_str(&as_text(&var.resolve(scope))),
            }
        }
        out
    }

    /// The one placeholder this text consists of, if so.
    fn whole(&self) -> Option<&Var> {
        match self.0.as_slice() {
            [Part::Var(var)] => Some(var),
            _ => None,
        }
    }
}

impl JsonTemplate {
    /// Parses the placeholders in every string of `value`.
    pub(super) fn parse(value: &Value, groups: Groups<'_>) -> Result<JsonTemplate, String> {
        let parsed = match value {
            Value::String(s) => {
                let template = Template::parse(s, groups)?;
                if template.is_fixed() {
                    JsonTemplate::Fixed(value.clone())
                } else if let Some(var) = template.whole() {
                    JsonTemplate::Whole(var.clone())
                } else {
                    JsonTemplate::Text(template)
                }
            }
            Value::Array(items) => JsonTemplate::Array(
                items
                    .iter()
                    .map(|v| JsonTemplate::parse(v, groups))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => JsonTemplate::Object(
                map.iter()
                    .map(|(k, v)| Ok((k.clone(), JsonTemplate::parse(v, groups)?)))
                    .collect::<Result<_, String>>()?,
            ),
            other => JsonTemplate::Fixed(other.clone()),
        };
        Ok(match parsed {
            JsonTemplate::Array(items) if items.iter().all(JsonTemplate::is_fixed) => {
                JsonTemplate::Fixed(value.clone())
            }
            JsonTemplate::Object(fields) if fields.iter().all(|(_, v)| v.is_fixed()) => {
                JsonTemplate::Fixed(value.clone())
            }
            other => other,
        })
    }

    /// Whether there is no placeholder anywhere in the value.
    pub(super) fn is_fixed(&self) -> bool {
        matches!(self, JsonTemplate::Fixed(_))
    }

    /// The value with every placeholder filled from `scope`.
    pub(super) fn render(&self, scope: &dyn Scope) -> Value {
        match self {
            JsonTemplate::Fixed(v) => v.clone(),
            JsonTemplate::Whole(var) => var.resolve(scope),
            JsonTemplate::Text(t) => Value::String(t.render(scope)),
            JsonTemplate::Array(items) => {
                Value::Array(items.iter().map(|v| v.render(scope)).collect())
            }
            JsonTemplate::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| (k.clone(), v.render(scope)))
                    .collect::<Map<_, _>>(),
            ),
        }
    }
}

fn parse_var(inner: &str, groups: Groups<'_>) -> Result<Var, String> {
    let (source, default) = match inner.split_once('|') {
        Some((s, d)) => (s.trim(), Some(d.to_owned())),
        None => (inner.trim(), None),
    };
    let unknown = || {
        format!(
            "unknown placeholder {{{{{inner}}}}} (use last_user_message, match.NAME, tool_result.PATH or agent_output.AGENT.PATH)"
        )
    };
    let source = if source == "last_user_message" {
        Source::LastUserMessage
    } else if let Some(name) = source.strip_prefix("match.") {
        check_group(name, groups)?;
        Source::Match(name.to_owned())
    } else if let Some(path) = source.strip_prefix("tool_result") {
        let path = match path {
            "" => "",
            p => p.strip_prefix('.').ok_or_else(unknown)?,
        };
        Source::ToolResult(parse_path(path, groups)?)
    } else if let Some(rest) = source.strip_prefix("agent_output.") {
        let (agent, path) = rest.split_once('.').unwrap_or((rest, ""));
        if agent.is_empty() {
            return Err(unknown());
        }
        Source::AgentOutput {
            agent: agent.to_owned(),
            path: parse_path(path, groups)?,
        }
    } else {
        return Err(unknown());
    };
    Ok(Var { source, default })
}

fn check_group(name: &str, groups: Groups<'_>) -> Result<(), String> {
    match groups {
        Some(names) if names.iter().any(|g| g == name) => Ok(()),
        Some(names) => Err(format!(
            "the rule's `match` has no group named {name:?} (it has: {})",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )),
        None => Err(format!(
            "match.{name} can only be used in the replies of a `when` rule"
        )),
    }
}

fn parse_path(path: &str, groups: Groups<'_>) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    if path.is_empty() {
        return Ok(steps);
    }
    for part in path.split('.') {
        let (key, filter) = match part.split_once('[') {
            Some((key, rest)) => {
                let filter = rest
                    .strip_suffix(']')
                    .ok_or_else(|| format!("`[` without `]` in path {path:?}"))?;
                (key, Some(filter))
            }
            None => (part, None),
        };
        if !key.is_empty() {
            steps.push(match key.parse::<usize>() {
                Ok(i) => Step::Index(i),
                Err(_) => Step::Key(key.to_owned()),
            });
        }
        match filter {
            None if key.is_empty() => return Err(format!("empty step in path {path:?}")),
            None => {}
            Some("*") => steps.push(Step::All),
            Some(f) => {
                let (field, group) = f.split_once('~').ok_or_else(|| {
                    format!("a filter is [*] or [field~group], found [{f}] in {path:?}")
                })?;
                check_group(group, groups)?;
                steps.push(Step::Find {
                    field: field.to_owned(),
                    group: group.to_owned(),
                });
            }
        }
    }
    Ok(steps)
}

impl Var {
    fn resolve(&self, scope: &dyn Scope) -> Value {
        let found = match &self.source {
            Source::LastUserMessage => Value::String(scope.user_text().to_owned()),
            Source::Match(name) => {
                Value::String(scope.group(name).unwrap_or_default().trim().to_owned())
            }
            Source::ToolResult(path) => scope
                .tool_result()
                .map_or(Value::Null, |v| walk(v, path, scope)),
            Source::AgentOutput { agent, path } => scope
                .agent_output(agent)
                .map_or(Value::Null, |v| walk(&v, path, scope)),
        };
        match &self.default {
            Some(default) if as_text(&found).is_empty() => Value::String(default.clone()),
            _ => found,
        }
    }
}

fn walk(value: &Value, path: &[Step], scope: &dyn Scope) -> Value {
    let Some((step, rest)) = path.split_first() else {
        return value.clone();
    };
    match step {
        Step::Key(key) => value.get(key).map_or(Value::Null, |v| walk(v, rest, scope)),
        Step::Index(i) => value.get(i).map_or(Value::Null, |v| walk(v, rest, scope)),
        Step::All => match value {
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|v| walk(v, rest, scope))
                    .filter(|v| !v.is_null())
                    .collect(),
            ),
            _ => Value::Null,
        },
        Step::Find { field, group } => {
            let wanted = scope.group(group).unwrap_or_default().trim().to_lowercase();
            if wanted.is_empty() {
                return Value::Null;
            }
            value
                .as_array()
                .and_then(|items| {
                    items.iter().find(|item| {
                        item.get(field)
                            .and_then(Value::as_str)
                            .is_some_and(|s| s.to_lowercase().contains(&wanted))
                    })
                })
                .map_or(Value::Null, |v| walk(v, rest, scope))
        }
    }
}

/// A value as the text a reader expects: strings unquoted, lists comma-separated.
fn as_text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .map(as_text)
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}
