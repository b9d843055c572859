//! Frames a client sends. Both our names (`chat.user_message`, `chat.tool_response`,
//! `chat.resume`) and the original runtime's (`user.input.submit`, `ui_tool_response`,
//! `client.resume`) are accepted, so clients written for either work.

use serde_json::{Map, Value};

use crate::FrameError;

/// Longest user message we accept, in characters; a larger one is refused, not truncated.
pub const MAX_CONTENT_CHARS: usize = 32 * 1024;

/// A parsed, well-typed client message.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// The user typed something.
    UserMessage {
        content: String,
        client_msg_id: Option<String>,
    },
    /// The browser answers a UI tool call.
    ToolResponse(ToolResponseFrame),
    /// Replay every event after `last_seq`, then the pending UI calls.
    Resume { last_seq: u64 },
    /// Stop the running turn.
    Cancel,
    /// Keep-alive; answered with an ack.
    Ping,
}

/// The answer to a UI tool call (`ui_tool_pipeline.md` response contract). `raw` keeps the
/// response object as the component sent it, for the tool's result.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResponseFrame {
    pub corr: String,
    pub raw: Value,
}

/// Parses one text frame. Fields may sit inside `data` (our clients) or at the top level.
pub fn parse_client_frame(text: &str) -> Result<ClientMessage, FrameError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| FrameError::NotJson(e.to_string()))?;
    let Value::Object(mut frame) = value else {
        return Err(FrameError::NotAnObject);
    };
    let Some(Value::String(kind)) = frame.remove("type") else {
        return Err(FrameError::NotAnObject);
    };
    let body = match frame.remove("data") {
        Some(Value::Object(data)) => data,
        Some(Value::Null) | None => frame,
        Some(_) => return Err(invalid("data", "must be an object")),
    };
    match kind.as_str() {
        "chat.user_message" => user_message(&body, "content"),
        "user.input.submit" => user_message(&body, "text"),
        "chat.tool_response" => tool_response(body),
        "ui_tool_response" => legacy_tool_response(body),
        "chat.resume" => Ok(ClientMessage::Resume {
            last_seq: seq_field(&body, "last_seq")?,
        }),
        "client.resume" => Ok(ClientMessage::Resume {
            last_seq: seq_field(&body, "lastClientIndex")?,
        }),
        "chat.cancel" => Ok(ClientMessage::Cancel),
        "ping" | "chat.ping" => Ok(ClientMessage::Ping),
        _ => Err(FrameError::UnknownType(truncate(&kind, 64))),
    }
}

fn user_message(
    body: &Map<String, Value>,
    field: &'static str,
) -> Result<ClientMessage, FrameError> {
    let content = match body.get(field) {
        Some(Value::String(s)) => s,
        Some(_) => return Err(invalid(field, "must be a string")),
        None => return Err(invalid(field, "is required")),
    };
    if content.trim().is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if content.chars().count() > MAX_CONTENT_CHARS {
        return Err(invalid(
            field,
            &format!("is longer than {MAX_CONTENT_CHARS} characters"),
        ));
    }
    let client_msg_id = match body.get("client_msg_id") {
        Some(Value::String(s)) if s.len() <= 128 => Some(s.clone()),
        Some(Value::Null) | None => None,
        Some(_) => {
            return Err(invalid(
                "client_msg_id",
                "must be a string of at most 128 bytes",
            ));
        }
    };
    Ok(ClientMessage::UserMessage {
        content: content.clone(),
        client_msg_id,
    })
}

fn tool_response(mut body: Map<String, Value>) -> Result<ClientMessage, FrameError> {
    // The spec's clients put the id in `corr`; some components only in `data.ui_tool_id`.
    let corr = match body.remove("corr") {
        Some(Value::String(s)) => s,
        Some(_) => return Err(invalid("corr", "must be a string")),
        None => match body.get("data").and_then(|d| d.get("ui_tool_id")) {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(invalid("corr", "is required")),
        },
    };
    check_corr(&corr)?;
    match body.get("status") {
        Some(Value::String(_)) => {}
        Some(_) => return Err(invalid("status", "must be a string")),
        None => return Err(invalid("status", "is required")),
    }
    Ok(ClientMessage::ToolResponse(ToolResponseFrame {
        corr,
        raw: Value::Object(body),
    }))
}

fn legacy_tool_response(mut body: Map<String, Value>) -> Result<ClientMessage, FrameError> {
    let corr = match body.remove("eventId") {
        Some(Value::String(s)) => s,
        Some(_) => return Err(invalid("eventId", "must be a string")),
        None => return Err(invalid("eventId", "is required")),
    };
    check_corr(&corr)?;
    let raw = match body.remove("response") {
        Some(Value::Object(r)) => r,
        Some(_) => return Err(invalid("response", "must be an object")),
        None => return Err(invalid("response", "is required")),
    };
    if !matches!(raw.get("status"), Some(Value::String(_))) {
        return Err(invalid("response.status", "must be a string"));
    }
    Ok(ClientMessage::ToolResponse(ToolResponseFrame {
        corr,
        raw: Value::Object(raw),
    }))
}

fn check_corr(corr: &str) -> Result<(), FrameError> {
    if corr.is_empty() || corr.len() > 128 {
        return Err(invalid("corr", "must be 1 to 128 bytes"));
    }
    Ok(())
}

fn seq_field(body: &Map<String, Value>, field: &'static str) -> Result<u64, FrameError> {
    match body.get(field) {
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| invalid(field, "must be a non-negative integer")),
        Some(_) => Err(invalid(field, "must be a non-negative integer")),
        None => Ok(0),
    }
}

fn invalid(field: &'static str, problem: &str) -> FrameError {
    FrameError::InvalidField {
        field,
        problem: problem.to_owned(),
    }
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use serde_json::json;

    fn parse(v: Value) -> Result<ClientMessage, FrameError> {
        parse_client_frame(&v.to_string())
    }

    #[test]
    fn user_message_in_data_or_top_level() {
        let want = ClientMessage::UserMessage {
            content: "hi".into(),
            client_msg_id: Some("c1".into()),
        };
        assert_eq!(
            parse(json!({"type":"chat.user_message","data":{"content":"hi","client_msg_id":"c1"}})),
            Ok(want.clone())
        );
        assert_eq!(
            parse(json!({"type":"chat.user_message","content":"hi","client_msg_id":"c1"})),
            Ok(want)
        );
    }

    #[test]
    fn legacy_names_are_accepted() {
        assert_eq!(
            parse(json!({"type":"user.input.submit","data":{"text":"yo"}})),
            Ok(ClientMessage::UserMessage {
                content: "yo".into(),
                client_msg_id: None
            })
        );
        assert_eq!(
            parse(json!({"type":"client.resume","lastClientIndex":7})),
            Ok(ClientMessage::Resume { last_seq: 7 })
        );
        let got = parse(
            json!({"type":"ui_tool_response","data":{"eventId":"ui_1","response":{"status":"success","data":{"a":1}}}}),
        );
        assert_eq!(
            got,
            Ok(ClientMessage::ToolResponse(ToolResponseFrame {
                corr: "ui_1".into(),
                raw: json!({"status":"success","data":{"a":1}})
            }))
        );
    }

    #[test]
    fn tool_response_takes_corr_from_data_when_missing() {
        let got = parse(
            json!({"type":"chat.tool_response","data":{"status":"success","data":{"ui_tool_id":"ui_9"}}}),
        );
        match got {
            Ok(ClientMessage::ToolResponse(f)) => assert_eq!(f.corr, "ui_9"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn bad_frames_get_stable_codes() {
        let cases: Vec<(&str, ErrorCode)> = vec![
            ("not json", ErrorCode::MalformedFrame),
            ("[1,2]", ErrorCode::MalformedFrame),
            (r#"{"data":{}}"#, ErrorCode::MalformedFrame),
            (r#"{"type":"chat.nope"}"#, ErrorCode::UnknownType),
            (
                r#"{"type":"chat.user_message","data":{"content":5}}"#,
                ErrorCode::InvalidField,
            ),
            (
                r#"{"type":"chat.user_message","data":{"content":"  "}}"#,
                ErrorCode::InvalidField,
            ),
            (
                r#"{"type":"chat.user_message","data":[]}"#,
                ErrorCode::InvalidField,
            ),
            (
                r#"{"type":"chat.tool_response","data":{"status":"success"}}"#,
                ErrorCode::InvalidField,
            ),
            (
                r#"{"type":"chat.tool_response","data":{"corr":"x"}}"#,
                ErrorCode::InvalidField,
            ),
            (
                r#"{"type":"chat.tool_response","data":{"corr":"","status":"success"}}"#,
                ErrorCode::InvalidField,
            ),
            (
                r#"{"type":"chat.resume","data":{"last_seq":-1}}"#,
                ErrorCode::InvalidField,
            ),
            (
                r#"{"type":"chat.resume","data":{"last_seq":"3"}}"#,
                ErrorCode::InvalidField,
            ),
        ];
        for (text, code) in cases {
            let err = parse_client_frame(text).expect_err(text);
            assert_eq!(err.code(), code, "{text}");
        }
    }

    #[test]
    fn oversize_content_is_refused() {
        let big = "x".repeat(MAX_CONTENT_CHARS + 1);
        let err = parse(json!({"type":"chat.user_message","data":{"content":big}}))
            .expect_err("too long");
        assert_eq!(err.code(), ErrorCode::InvalidField);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_any_text(s in "\\PC*") {
            let _ = parse_client_frame(&s);
        }

        #[test]
        fn never_panics_on_typed_garbage(kind in "(chat\\.user_message|chat\\.tool_response|chat\\.resume|ui_tool_response|client\\.resume|user\\.input\\.submit)", body in "\\PC{0,40}") {
            let _ = parse_client_frame(&format!(r#"{{"type":"{kind}","data":{body}}}"#));
            let _ = parse_client_frame(&format!(r#"{{"type":"{kind}","data":{{"corr":{body},"status":{body}}}}}"#));
        }
    }
}
