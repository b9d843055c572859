//! The declarative UI tool, as pure functions: payload building, response contract, secret
//! stripping and the canonical error results.
//!
//! WHY pure functions: the engine's UiCorrelator owns the waiting (emit `chat.tool_call`,
//! wait for the correlated `chat.tool_response`); everything about *what* is sent and *what*
//! the agent gets back lives here, in one definition, testable without an engine.

use serde_json::{Map, Value};

/// Shown with the component when the agent gave no `agent_message`.
const DEFAULT_AGENT_MESSAGE: &str = "Please review and respond to continue.";
/// Secret values at least this long are also scrubbed from any other string in the response
/// (defence in depth); shorter ones would cause false positives ("true", "1").
const MIN_SCRUB_LEN: usize = 6;
/// Correlation fields the browser echoes back; they are noise for the agent.
const CORRELATION_KEYS: [&str; 3] = ["corr", "ui_tool_id", "eventId"];
/// The only top-level keys of a normalized UI response.
const CONTRACT_KEYS: [&str; 5] = ["status", "action", "data", "message", "code"];

/// Build the component payload for a `chat.tool_call` event and return it with its new
/// `agent_message_id`. The payload is `args` (keys as given), plus `extra` (the pre-step's
/// result object, e.g. generate_and_download's `files`; its `status` is not copied), plus
/// `agent_message` (from args, else a default), `agent_message_id` (`msg_` + 10 hex chars),
/// `workflow_name` and `display`; those four always win over same-named keys.
pub fn build_ui_payload(
    args: &Map<String, Value>,
    extra: Option<&Value>,
    workflow_name: &str,
    display: &str,
) -> (Value, String) {
    let mut payload = args.clone();
    match extra {
        Some(Value::Object(extra)) => {
            for (k, v) in extra {
                if k != "status" {
                    payload.insert(k.clone(), v.clone());
                }
            }
        }
        Some(Value::Null) | None => {}
        Some(other) => {
            payload.insert("result".to_owned(), other.clone());
        }
    }
    let agent_message = args
        .get("agent_message")
        .and_then(Value::as_str)
        .filter(|m| !m.trim().is_empty())
        .unwrap_or(DEFAULT_AGENT_MESSAGE)
        .to_owned();
    let agent_message_id = new_agent_message_id();
    payload.insert("agent_message".to_owned(), Value::String(agent_message));
    payload.insert(
        "agent_message_id".to_owned(),
        Value::String(agent_message_id.clone()),
    );
    payload.insert(
        "workflow_name".to_owned(),
        Value::String(workflow_name.to_owned()),
    );
    payload.insert("display".to_owned(), Value::String(display.to_owned()));
    (Value::Object(payload), agent_message_id)
}

/// `msg_` followed by 10 lowercase hex chars of a random UUID, as the spec's tools generate.
fn new_agent_message_id() -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("msg_{}", &hex[..10])
}

/// A UI response split into what the agent may see and the secrets it must not.
#[derive(Debug, Clone, PartialEq)]
pub struct SanitizedResponse {
    /// The response with every secret field replaced by `<field>_provided` / `<field>_length`
    /// metadata and correlation noise removed. Safe to log and to show the model.
    pub for_agent: Value,
    /// `(field name, secret value)` pairs, for the engine's encrypted vault. Never log these.
    pub secrets: Vec<(String, String)>,
}

/// Strip secrets from the browser's response. Every object member whose key is one of
/// `secret_fields` (exact, case-sensitive match), at any depth, is removed and replaced by
/// `{"<field>_provided": bool, "<field>_length": n}`; the value goes to `secrets`. Any other
/// string that contains a (6+ char) secret value gets it replaced with `[redacted]`. The
/// correlation keys `corr`, `ui_tool_id` and `eventId` are dropped.
pub fn sanitize_ui_response(response: Value, secret_fields: &[String]) -> SanitizedResponse {
    let mut for_agent = response;
    let mut secrets = Vec::new();
    extract_secrets(&mut for_agent, secret_fields, &mut secrets);
    if let Value::Object(top) = &mut for_agent {
        for key in CORRELATION_KEYS {
            top.remove(key);
        }
        if let Some(Value::Object(data)) = top.get_mut("data") {
            for key in CORRELATION_KEYS {
                data.remove(key);
            }
        }
    }
    let scrub: Vec<&str> = secrets
        .iter()
        .map(|(_, v)| v.as_str())
        .filter(|v| v.chars().count() >= MIN_SCRUB_LEN)
        .collect();
    if !scrub.is_empty() {
        scrub_strings(&mut for_agent, &scrub);
    }
    SanitizedResponse { for_agent, secrets }
}

fn extract_secrets(value: &mut Value, fields: &[String], out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for field in fields {
                if let Some(secret) = map.remove(field) {
                    let text = match secret {
                        Value::String(s) => s,
                        Value::Null => String::new(),
                        other => other.to_string(),
                    };
                    let length = text.chars().count();
                    map.insert(format!("{field}_provided"), Value::Bool(length > 0));
                    map.insert(format!("{field}_length"), Value::from(length));
                    if length > 0 && !out.iter().any(|(f, v)| f == field && *v == text) {
                        out.push((field.clone(), text));
                    }
                }
            }
            for v in map.values_mut() {
                extract_secrets(v, fields, out);
            }
        }
        Value::Array(items) => {
            for v in items {
                extract_secrets(v, fields, out);
            }
        }
        _ => {}
    }
}

fn scrub_strings(value: &mut Value, secrets: &[&str]) {
    match value {
        Value::String(s) => {
            for secret in secrets {
                if s.contains(secret) {
                    *s = s.replace(secret, "[redacted]");
                }
            }
        }
        Value::Object(map) => {
            // Keys could carry a secret too; rebuild the map only when one does.
            if map.keys().any(|k| secrets.iter().any(|s| k.contains(s))) {
                let old = std::mem::take(map);
                for (mut k, v) in old {
                    for secret in secrets {
                        if k.contains(secret) {
                            k = k.replace(secret, "[redacted]");
                        }
                    }
                    map.insert(k, v);
                }
            }
            map.values_mut().for_each(|v| scrub_strings(v, secrets));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| scrub_strings(v, secrets)),
        _ => {}
    }
}

/// Enforce the UI response contract and return its canonical form, which has only the keys
/// `status`, `action`, `data`, `message`, `code`. `status` must be "success" or "error";
/// `action`, `message` and `code` must be strings and `data` an object when present. A cancel
/// (`action: "cancel"`, or `code: "user_cancelled"`) must have status "error"; a missing
/// code/action/message of a cancel is filled in. The `Err` text is meant for the client
/// (the engine sends it as a `chat.error` and keeps waiting).
pub fn normalize_ui_response(response: &Value) -> Result<Value, String> {
    let Value::Object(obj) = response else {
        return Err("UI response must be a JSON object".to_owned());
    };
    let status = match obj.get("status") {
        Some(Value::String(s)) if s == "success" || s == "error" => s.clone(),
        Some(Value::String(_)) => {
            return Err("UI response status must be \"success\" or \"error\"".to_owned());
        }
        Some(_) => return Err("UI response status must be a string".to_owned()),
        None => return Err("UI response is missing \"status\"".to_owned()),
    };
    let string_field = |key: &str| -> Result<Option<String>, String> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("UI response \"{key}\" must be a string")),
        }
    };
    let mut action = string_field("action")?;
    let mut message = string_field("message")?;
    let mut code = string_field("code")?;
    let data = match obj.get("data") {
        None | Some(Value::Null) => None,
        Some(d @ Value::Object(_)) => Some(d.clone()),
        Some(_) => return Err("UI response \"data\" must be an object".to_owned()),
    };

    let is_cancel =
        action.as_deref() == Some("cancel") || code.as_deref() == Some("user_cancelled");
    if is_cancel {
        if status != "error" {
            return Err("a cancel response must have status \"error\"".to_owned());
        }
        if action.as_deref().is_some_and(|a| a != "cancel") {
            return Err("a user_cancelled response must have action \"cancel\"".to_owned());
        }
        if code.as_deref().is_some_and(|c| c != "user_cancelled") {
            return Err("a cancel response must have code \"user_cancelled\"".to_owned());
        }
        action = Some("cancel".to_owned());
        code = Some("user_cancelled".to_owned());
        message.get_or_insert_with(|| "User cancelled operation".to_owned());
    }

    let mut out = Map::new();
    out.insert("status".to_owned(), Value::String(status));
    let fields = [("action", action), ("message", message), ("code", code)];
    for (key, value) in fields {
        if let Some(v) = value {
            out.insert(key.to_owned(), Value::String(v));
        }
    }
    if let Some(d) = data {
        out.insert("data".to_owned(), d);
    }
    debug_assert!(out.keys().all(|k| CONTRACT_KEYS.contains(&k.as_str())));
    Ok(Value::Object(out))
}

/// The agent's result when the user did not answer within the UI timeout of `secs` seconds.
pub fn ui_timeout_result(secs: f64) -> Value {
    let secs = if secs.fract() == 0.0 && secs.is_finite() {
        format!("{secs:.0}")
    } else {
        format!("{secs:.1}")
    };
    let message = format!("The user did not respond within {secs} seconds.");
    crate::ToolErrorResult::new(Some("ui_timeout"), &message).to_value()
}

/// The agent's result when the user cancelled the UI interaction.
pub fn ui_cancelled_result() -> Value {
    serde_json::json!({
        "status": "error",
        "action": "cancel",
        "code": "user_cancelled",
        "message": "User cancelled operation",
    })
}

/// The result recorded for a tool call that was in flight when the process restarted; the
/// call is never re-run because it may have had side effects.
pub fn interrupted_result() -> Value {
    crate::ToolErrorResult::new(
        Some("interrupted"),
        "The tool was interrupted by a restart and was not re-run.",
    )
    .to_value()
}

/// The spec's success rule: the call completed (`status_ok`) and its result is not an object
/// whose `status` is "error" or "failed" (ASCII case-insensitive).
pub fn is_success(status_ok: bool, result: &Value) -> bool {
    if !status_ok {
        return false;
    }
    match result.get("status").and_then(Value::as_str) {
        Some(s) => !(s.eq_ignore_ascii_case("error") || s.eq_ignore_ascii_case("failed")),
        None => true,
    }
}
