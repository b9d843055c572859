//! Strict tool-argument validation and the JSON-mode text protocol.
//!
//! WHY: the model's arguments are untrusted input. Per the structured tool loop spec they are
//! validated strictly, with no coercion ("5" is not an integer, 5.0 is not an integer, 1 is
//! not a boolean), unknown arguments are dropped and defaults are injected, so a tool only ever
//! sees arguments that match its schema exactly.

use std::collections::HashSet;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{Keyword, ValidationError, Validator};
use serde_json::{Map, Value};

use crate::ToolError;

/// Schema keyword added (internally) next to every `"type": "integer"`; rejects numbers that
/// are not written as integers. JSON Schema itself accepts 5.0 as an integer; we do not.
const STRICT_INTEGER_KEYWORD: &str = "x-tessera-strict-integer";
/// Longest value preview or message fragment that goes into an error message.
const MAX_FRAGMENT_CHARS: usize = 80;
/// At most this many problems are reported for one call; the model only needs a few to fix it.
const MAX_ERRORS: usize = 10;

/// A tool's argument schema, compiled once and reused for every call.
///
/// WHY: compiling a JSON Schema is far more expensive than validating against it, and the
/// property names and defaults are needed on every call too.
#[derive(Debug)]
pub struct ArgSchema {
    validator: Validator,
    /// Top-level property names, when unknown top-level arguments are to be dropped.
    known: Option<HashSet<String>>,
    /// `properties.*.default` of optional properties, injected when the argument is missing.
    defaults: Vec<(String, Value)>,
}

impl ArgSchema {
    /// Compile `schema` (JSON Schema draft 2020-12). Errors describe why the schema is unusable.
    pub fn new(schema: &Value) -> Result<Self, String> {
        if !schema.is_object() && !schema.is_boolean() {
            return Err("argument schema must be a JSON object".to_owned());
        }
        let mut marked = schema.clone();
        mark_strict_integers(&mut marked);
        let validator = jsonschema::draft202012::options()
            .with_keyword(STRICT_INTEGER_KEYWORD, |_, _, _| {
                Ok(Box::new(StrictInteger) as Box<dyn for<'i> Keyword<'i>>)
            })
            .build(&marked)
            .map_err(|e| {
                format!(
                    "invalid argument schema: {}",
                    truncate_chars(&e.to_string(), 200)
                )
            })?;

        let properties = schema.get("properties").and_then(Value::as_object);
        let required: HashSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // Extra keys are dropped only when the schema lists its properties and does not
        // explicitly allow others (additionalProperties true/schema, or patternProperties).
        let extras_allowed = schema
            .get("additionalProperties")
            .is_some_and(|a| a.is_object() || a == &Value::Bool(true))
            || schema.get("patternProperties").is_some();
        let known = match properties {
            Some(props) if !extras_allowed => Some(props.keys().cloned().collect()),
            _ => None,
        };
        let defaults = properties
            .map(|props| {
                props
                    .iter()
                    .filter(|(name, _)| !required.contains(name.as_str()))
                    .filter_map(|(name, prop)| {
                        prop.get("default").map(|d| (name.clone(), d.clone()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            validator,
            known,
            defaults,
        })
    }

    /// Turn the model's raw arguments into the exact argument map a tool receives: must be an
    /// object; unknown top-level arguments dropped; defaults injected; then strictly validated.
    pub fn normalize(&self, raw: Value) -> Result<Map<String, Value>, ToolError> {
        let Value::Object(mut args) = raw else {
            return Err(ToolError::InvalidArgs(vec![format!(
                "arguments must be a JSON object, got {}",
                json_type(&raw)
            )]));
        };
        if let Some(known) = &self.known {
            let mut dropped = Vec::new();
            args.retain(|k, _| {
                let keep = known.contains(k);
                if !keep {
                    dropped.push(truncate_chars(k, MAX_FRAGMENT_CHARS));
                }
                keep
            });
            if !dropped.is_empty() {
                tracing::debug!(?dropped, "dropped unknown tool arguments");
            }
        }
        for (name, default) in &self.defaults {
            if !args.contains_key(name) {
                args.insert(name.clone(), default.clone());
            }
        }
        let instance = Value::Object(args);
        let mut errors: Vec<String> = Vec::new();
        for message in self.validator.iter_errors(&instance).map(|e| describe(&e)) {
            // 1.5 for an integer fails both `type` and the strict-integer keyword.
            if !errors.contains(&message) {
                errors.push(message);
                if errors.len() == MAX_ERRORS {
                    break;
                }
            }
        }
        if !errors.is_empty() {
            return Err(ToolError::InvalidArgs(errors));
        }
        match instance {
            Value::Object(args) => Ok(args),
            // Unreachable: `instance` was built from a map above.
            _ => Err(ToolError::InvalidArgs(vec![
                "arguments must be a JSON object".to_owned(),
            ])),
        }
    }
}

/// Parse the model's raw argument text. Empty (or all-whitespace) text means `{}`.
///
/// WHY: models send function-call arguments as a JSON string; a parse failure must become a
/// short `InvalidArgs` message the model can act on, never a panic or a raw echo of the text.
pub fn parse_arguments(text: &str) -> Result<Value, ToolError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_str(text).map_err(|e| {
        ToolError::InvalidArgs(vec![format!(
            "arguments are not valid JSON: {}",
            truncate_chars(&e.to_string(), MAX_FRAGMENT_CHARS)
        )])
    })
}

/// What a model reply means under the JSON-mode text protocol (models without native tool
/// calling answer either with plain text or with `{"tool": "...", "args": {...}}`).
#[derive(Debug, Clone, PartialEq)]
pub enum JsonModeReply {
    /// The final answer text (trimmed).
    Final(String),
    /// A well-formed tool call. `args` still has to go through [`ArgSchema::normalize`].
    ToolCall {
        /// Tool name as the model wrote it.
        tool: String,
        /// The `args` object.
        args: Value,
    },
    /// An attempted tool call that violates the protocol; the string says why, so the
    /// engine can ask the model for its single correction.
    Invalid(String),
}

/// Classify a JSON-mode reply. A JSON object (optionally inside a ```json fence) with exactly
/// the keys `tool` (string) and `args` (object) is a tool call; an object that has a `tool` key
/// but another shape, or text that looks like such an object but is not valid JSON, is
/// `Invalid`; everything else is final text.
pub fn parse_json_mode_reply(text: &str) -> JsonModeReply {
    let trimmed = text.trim();
    let candidate = strip_json_fence(trimmed);
    let value: Value = match serde_json::from_str(candidate) {
        Ok(v) => v,
        Err(e) => {
            if candidate.starts_with('{') && candidate.contains("\"tool\"") {
                return JsonModeReply::Invalid(format!(
                    "tool call is not valid JSON: {}",
                    truncate_chars(&e.to_string(), MAX_FRAGMENT_CHARS)
                ));
            }
            return JsonModeReply::Final(trimmed.to_owned());
        }
    };
    let Value::Object(mut obj) = value else {
        return JsonModeReply::Final(trimmed.to_owned());
    };
    if !obj.contains_key("tool") {
        return JsonModeReply::Final(trimmed.to_owned());
    }
    let extra: Vec<String> = obj
        .keys()
        .filter(|k| k.as_str() != "tool" && k.as_str() != "args")
        .map(|k| truncate_chars(k, MAX_FRAGMENT_CHARS))
        .collect();
    if !extra.is_empty() {
        return JsonModeReply::Invalid(format!(
            "a tool call must have exactly the keys \"tool\" and \"args\"; unexpected: {}",
            extra.join(", ")
        ));
    }
    let tool = match obj.remove("tool") {
        Some(Value::String(t)) if !t.trim().is_empty() => t,
        _ => return JsonModeReply::Invalid("\"tool\" must be a non-empty string".to_owned()),
    };
    match obj.remove("args") {
        Some(args @ Value::Object(_)) => JsonModeReply::ToolCall { tool, args },
        Some(_) => JsonModeReply::Invalid("\"args\" must be a JSON object".to_owned()),
        None => JsonModeReply::Invalid("a tool call must have an \"args\" object".to_owned()),
    }
}

/// Strip one surrounding Markdown code fence (```json ... ``` or ``` ... ```), if present.
fn strip_json_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let Some(body) = rest.strip_suffix("```") else {
        return text;
    };
    // The rest of the opening line is the info string ("json", "JSON", or nothing).
    let (info, body) = body.split_once('\n').unwrap_or(("", body));
    let info = info.trim();
    if !info.is_empty() && !info.eq_ignore_ascii_case("json") {
        return text;
    }
    body.trim()
}

/// The custom keyword: a number must be written as an integer (fits i64 or u64).
struct StrictInteger;

impl<'i> Keyword<'i> for StrictInteger {
    fn validate(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        if self.is_valid(instance) {
            Ok(())
        } else {
            Err(ValidationError::custom("not an integer"))
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        match instance {
            Value::Number(n) => n.is_i64() || n.is_u64(),
            _ => true,
        }
    }
}

/// Add [`STRICT_INTEGER_KEYWORD`] to every (sub)schema whose `type` demands an integer (and
/// does not also allow "number"). Only schema-bearing keywords are walked, never data keywords
/// such as `default`, `enum`, `const` or `examples`.
fn mark_strict_integers(schema: &mut Value) {
    let Value::Object(obj) = schema else {
        return;
    };
    if type_requires_integer(obj.get("type")) {
        obj.insert(STRICT_INTEGER_KEYWORD.to_owned(), Value::Bool(true));
    }
    for (key, sub) in obj.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                if let Value::Object(map) = sub {
                    map.values_mut().for_each(mark_strict_integers);
                }
            }
            "items" | "prefixItems" | "allOf" | "anyOf" | "oneOf" => match sub {
                Value::Array(list) => list.iter_mut().for_each(mark_strict_integers),
                other => mark_strict_integers(other),
            },
            "additionalProperties"
            | "additionalItems"
            | "unevaluatedProperties"
            | "unevaluatedItems"
            | "contains"
            | "not"
            | "if"
            | "then"
            | "else"
            | "propertyNames" => mark_strict_integers(sub),
            _ => {}
        }
    }
}

fn type_requires_integer(ty: Option<&Value>) -> bool {
    match ty {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(types)) => {
            let has = |name: &str| types.iter().any(|t| t.as_str() == Some(name));
            has("integer") && !has("number")
        }
        _ => false,
    }
}

/// One short, path-naming message per validation error; values are previewed, never dumped.
fn describe(err: &ValidationError<'_>) -> String {
    let path = err.instance_path().as_str().trim_start_matches('/');
    let prefix = if path.is_empty() {
        String::new()
    } else {
        format!("{}: ", truncate_chars(path, MAX_FRAGMENT_CHARS))
    };
    let got = || preview(err.instance());
    match err.kind() {
        ValidationErrorKind::Required { property } => {
            let name = property
                .as_str()
                .map(|s| truncate_chars(s, MAX_FRAGMENT_CHARS))
                .unwrap_or_else(|| truncate_chars(&property.to_string(), MAX_FRAGMENT_CHARS));
            if path.is_empty() {
                format!("missing required argument '{name}'")
            } else {
                format!("{prefix}missing required field '{name}'")
            }
        }
        ValidationErrorKind::Type {
            kind: TypeKind::Single(t),
        } => format!("{prefix}expected {t}, got {}", got()),
        ValidationErrorKind::Type {
            kind: TypeKind::Multiple(types),
        } => {
            let names: Vec<String> = types.iter().map(|t| t.to_string()).collect();
            format!("{prefix}expected one of {}, got {}", names.join("|"), got())
        }
        ValidationErrorKind::Custom { .. } => format!("{prefix}expected integer, got {}", got()),
        _ => format!(
            "{prefix}{}",
            truncate_chars(&err.masked().to_string(), MAX_FRAGMENT_CHARS)
        ),
    }
}

/// `string "abc"`, `number 5.5`, `boolean true`, `object`, ... (at most ~80 chars of value).
fn preview(v: &Value) -> String {
    match v {
        Value::String(s) => format!(
            "string {}",
            Value::String(truncate_chars(s, MAX_FRAGMENT_CHARS))
        ),
        Value::Number(n) => format!(
            "number {}",
            truncate_chars(&n.to_string(), MAX_FRAGMENT_CHARS)
        ),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Null => "null".to_owned(),
        Value::Array(_) => "array".to_owned(),
        Value::Object(_) => "object".to_owned(),
    }
}

pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Cut `s` to at most `max` chars (on a char boundary), marking the cut with `…`.
pub(crate) fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((cut, _)) => format!("{}…", &s[..cut]),
    }
}
