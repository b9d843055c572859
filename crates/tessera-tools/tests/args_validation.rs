//! Strict argument validation (structured_tool_loop.md) and the JSON-mode reply protocol.

use serde_json::{Value, json};
use tessera_tools::{ArgSchema, JsonModeReply, ToolError, parse_arguments, parse_json_mode_reply};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "query": { "type": "string" },
            "max_results": { "type": "integer", "default": 5 },
            "global": { "type": "boolean", "default": false },
            "guidance_scale": { "type": "number", "default": 7.5 },
            "filters": {
                "type": "object",
                "properties": {
                    "limit": { "type": "integer" },
                    "ids": { "type": "array", "items": { "type": "integer" } }
                }
            }
        },
        "required": ["query"]
    })
}

enum Expect {
    /// Normalized arguments, exactly.
    Ok(Value),
    /// Err(InvalidArgs) whose joined text contains every fragment.
    Err(&'static [&'static str]),
}

#[test]
fn strict_validation_table() {
    let s = ArgSchema::new(&schema()).expect("schema compiles");
    let defaults =
        |q: &str| json!({"query": q, "max_results": 5, "global": false, "guidance_scale": 7.5});
    let cases: Vec<(&str, Value, Expect)> = vec![
        (
            "valid with all optionals",
            json!({"query": "rust", "max_results": 3, "global": true, "guidance_scale": 2.5}),
            Expect::Ok(
                json!({"query": "rust", "max_results": 3, "global": true, "guidance_scale": 2.5}),
            ),
        ),
        (
            "valid without optionals, defaults injected",
            json!({"query": "rust"}),
            Expect::Ok(defaults("rust")),
        ),
        (
            "integer accepted for number",
            json!({"query": "q", "guidance_scale": 3}),
            Expect::Ok(
                json!({"query": "q", "max_results": 5, "global": false, "guidance_scale": 3}),
            ),
        ),
        (
            "negative and large integers",
            json!({"query": "q", "max_results": -3, "filters": {"limit": 18446744073709551615u64}}),
            Expect::Ok(
                json!({"query": "q", "max_results": -3, "global": false, "guidance_scale": 7.5,
                              "filters": {"limit": 18446744073709551615u64}}),
            ),
        ),
        (
            "unknown args dropped",
            json!({"query": "q", "evil": "rm -rf", "other": 1}),
            Expect::Ok(defaults("q")),
        ),
        (
            "missing required",
            json!({}),
            Expect::Err(&["missing required argument 'query'"]),
        ),
        (
            "missing required with other args",
            json!({"max_results": 2}),
            Expect::Err(&["'query'"]),
        ),
        (
            "wrong type: int for string",
            json!({"query": 5}),
            Expect::Err(&["query", "expected string"]),
        ),
        (
            "\"5\" for int",
            json!({"query": "q", "max_results": "5"}),
            Expect::Err(&["max_results", "expected integer", "string \"5\""]),
        ),
        (
            "5.0 for int",
            json!({"query": "q", "max_results": 5.0}),
            Expect::Err(&["max_results", "expected integer", "number 5.0"]),
        ),
        (
            "5.5 for int",
            json!({"query": "q", "max_results": 5.5}),
            Expect::Err(&["max_results", "expected integer", "number 5.5"]),
        ),
        (
            "true for int",
            json!({"query": "q", "max_results": true}),
            Expect::Err(&["max_results", "expected integer", "boolean true"]),
        ),
        (
            "null for int",
            json!({"query": "q", "max_results": null}),
            Expect::Err(&["max_results", "expected integer", "null"]),
        ),
        (
            "1 for bool",
            json!({"query": "q", "global": 1}),
            Expect::Err(&["global", "expected boolean", "number 1"]),
        ),
        (
            "\"true\" for bool",
            json!({"query": "q", "global": "true"}),
            Expect::Err(&["global", "expected boolean"]),
        ),
        (
            "\"2.5\" for number",
            json!({"query": "q", "guidance_scale": "2.5"}),
            Expect::Err(&["guidance_scale", "expected number"]),
        ),
        (
            "nested int ok",
            json!({"query": "q", "filters": {"limit": 2, "ids": [1, 2]}}),
            Expect::Ok(
                json!({"query": "q", "max_results": 5, "global": false, "guidance_scale": 7.5,
                              "filters": {"limit": 2, "ids": [1, 2]}}),
            ),
        ),
        (
            "nested 2.0 for int",
            json!({"query": "q", "filters": {"limit": 2.0}}),
            Expect::Err(&["filters/limit", "expected integer"]),
        ),
        (
            "nested array item 2.0 for int",
            json!({"query": "q", "filters": {"ids": [1, 2.0]}}),
            Expect::Err(&["filters/ids/1", "expected integer"]),
        ),
        (
            "nested \"3\" for int",
            json!({"query": "q", "filters": {"ids": ["3"]}}),
            Expect::Err(&["filters/ids/0", "expected integer"]),
        ),
        (
            "several errors reported",
            json!({"max_results": "x", "global": 0}),
            Expect::Err(&["'query'", "max_results", "global"]),
        ),
        (
            "non-object: array",
            json!([1, 2]),
            Expect::Err(&["must be a JSON object", "array"]),
        ),
        (
            "non-object: string",
            json!("query"),
            Expect::Err(&["must be a JSON object", "string"]),
        ),
        (
            "non-object: null",
            Value::Null,
            Expect::Err(&["must be a JSON object", "null"]),
        ),
        (
            "non-object: number",
            json!(5),
            Expect::Err(&["must be a JSON object", "number"]),
        ),
    ];
    let mut failures = Vec::new();
    for (name, input, expect) in cases {
        let got = s.normalize(input);
        match (&expect, &got) {
            (Expect::Ok(want), Ok(args)) if &Value::Object(args.clone()) == want => {}
            (Expect::Err(frags), Err(ToolError::InvalidArgs(msgs))) => {
                let text = msgs.join(" | ");
                for f in *frags {
                    if !text.contains(f) {
                        failures.push(format!("{name}: error {text:?} lacks {f:?}"));
                    }
                }
            }
            _ => failures.push(format!("{name}: got {got:?}")),
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

#[test]
fn one_message_per_problem() {
    let s = ArgSchema::new(&schema()).expect("schema compiles");
    let Err(ToolError::InvalidArgs(msgs)) = s.normalize(json!({"query": "q", "max_results": 5.5}))
    else {
        panic!("5.5 accepted")
    };
    assert_eq!(
        msgs,
        vec!["max_results: expected integer, got number 5.5".to_owned()]
    );
}

#[test]
fn error_messages_never_echo_huge_values() {
    let s = ArgSchema::new(&schema()).expect("schema compiles");
    let huge = "A".repeat(100_000);
    let err = s
        .normalize(json!({"query": "q", "max_results": huge.clone(), huge.clone(): 1}))
        .expect_err("invalid");
    let ToolError::InvalidArgs(msgs) = err else {
        panic!("wrong error")
    };
    for m in &msgs {
        assert!(
            m.chars().count() < 200,
            "message too long: {} chars",
            m.len()
        );
    }
    // The unknown huge key was dropped, only max_results is reported.
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(msgs[0].contains('…'));
}

#[test]
fn strictness_through_refs_and_combinators() {
    let s = ArgSchema::new(&json!({
        "type": "object",
        "$defs": { "count": { "type": "integer" } },
        "properties": {
            "a": { "$ref": "#/$defs/count" },
            "b": { "anyOf": [ { "type": "integer" }, { "type": "string" } ] },
            "c": { "type": ["integer", "null"] },
            "d": { "type": ["integer", "number"] },
            "e": { "type": "object", "additionalProperties": { "type": "integer" } },
            "f": { "type": "array", "prefixItems": [ { "type": "integer" } ] },
            // A data value shaped like a schema must not be touched.
            "g": { "type": "object", "default": { "type": "integer" } }
        }
    }))
    .expect("schema compiles");
    for bad in [
        json!({"a": 1.0}),
        json!({"b": 2.0}),
        json!({"c": 3.0}),
        json!({"e": {"x": 1.5}}),
        json!({"f": [1.0]}),
    ] {
        assert!(s.normalize(bad.clone()).is_err(), "accepted {bad}");
    }
    let ok = s
        .normalize(json!({"a": 1, "b": "x", "c": null, "d": 4.5, "e": {"x": 1}, "f": [1]}))
        .expect("valid");
    assert_eq!(
        ok["g"],
        json!({"type": "integer"}),
        "default injected unchanged"
    );
}

#[test]
fn unknown_args_kept_when_schema_allows_them() {
    let open = ArgSchema::new(&json!({
        "type": "object",
        "properties": { "a": { "type": "string" } },
        "additionalProperties": true
    }))
    .expect("compiles");
    let args = open
        .normalize(json!({"a": "x", "extra": 1}))
        .expect("valid");
    assert_eq!(args.get("extra"), Some(&json!(1)));

    let closed = ArgSchema::new(&json!({
        "type": "object",
        "properties": { "a": { "type": "string" } },
        "additionalProperties": false
    }))
    .expect("compiles");
    let args = closed
        .normalize(json!({"a": "x", "extra": 1}))
        .expect("extra dropped, not rejected");
    assert!(!args.contains_key("extra"));

    let no_props = ArgSchema::new(&json!({"type": "object"})).expect("compiles");
    let args = no_props.normalize(json!({"anything": [1]})).expect("valid");
    assert!(args.contains_key("anything"));
}

#[test]
fn required_args_get_no_default() {
    let s = ArgSchema::new(&json!({
        "type": "object",
        "properties": { "n": { "type": "integer", "default": 1 } },
        "required": ["n"]
    }))
    .expect("compiles");
    let err = s.normalize(json!({})).expect_err("required stays required");
    assert!(err.to_string().contains("'n'"), "{err}");
}

#[test]
fn bad_schema_is_rejected() {
    assert!(ArgSchema::new(&json!({"type": 5})).is_err());
    assert!(ArgSchema::new(&json!("not a schema")).is_err());
}

#[test]
fn parse_arguments_text() {
    assert_eq!(parse_arguments("").expect("empty is {}"), json!({}));
    assert_eq!(parse_arguments("  \n").expect("blank is {}"), json!({}));
    assert_eq!(
        parse_arguments(r#"{"a": 1}"#).expect("parses"),
        json!({"a": 1})
    );
    // Non-object JSON parses; normalize() rejects it later.
    assert_eq!(parse_arguments("[1]").expect("parses"), json!([1]));
    let err = parse_arguments(r#"{"a": "#).expect_err("broken JSON");
    assert_eq!(err.code(), "invalid_args");
    assert!(err.to_string().contains("not valid JSON"));
}

#[test]
fn json_mode_reply_table() {
    use JsonModeReply::*;
    let call = |tool: &str, args: Value| ToolCall {
        tool: tool.to_owned(),
        args,
    };
    let cases: Vec<(&str, JsonModeReply)> = vec![
        ("Hello there!", Final("Hello there!".into())),
        ("  padded answer \n", Final("padded answer".into())),
        ("", Final(String::new())),
        (
            r#"{"tool":"web_search","args":{"query":"x"}}"#,
            call("web_search", json!({"query": "x"})),
        ),
        ("  {\"tool\": \"t\", \"args\": {}}\n", call("t", json!({}))),
        (
            "```json\n{\"tool\": \"t\", \"args\": {\"n\": 1}}\n```",
            call("t", json!({"n": 1})),
        ),
        (
            "```JSON\n{\"tool\": \"t\", \"args\": {}}\n```",
            call("t", json!({})),
        ),
        (
            "```\n{\"tool\": \"t\", \"args\": {}}\n```",
            call("t", json!({})),
        ),
        (r#"{"answer": "42"}"#, Final(r#"{"answer": "42"}"#.into())),
        ("[1, 2]", Final("[1, 2]".into())),
        ("\"just a string\"", Final("\"just a string\"".into())),
        (
            "```python\nprint('hi')\n```",
            Final("```python\nprint('hi')\n```".into()),
        ),
        (
            "The tool field is called \"tool\".",
            Final("The tool field is called \"tool\".".into()),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(parse_json_mode_reply(text), want, "input {text:?}");
    }
    for (text, why) in [
        (r#"{"tool":"t"}"#, "args"),
        (r#"{"tool":"t","args":[]}"#, "object"),
        (r#"{"tool":"t","args":"{}"}"#, "object"),
        (r#"{"tool":5,"args":{}}"#, "string"),
        (r#"{"tool":"","args":{}}"#, "string"),
        (r#"{"tool":"t","args":{},"extra":1}"#, "extra"),
        (r#"{"tool": "t", "args": {"#, "not valid JSON"),
        (
            "```json\n{\"tool\": \"t\", \"arguments\": {}}\n```",
            "arguments",
        ),
    ] {
        match parse_json_mode_reply(text) {
            Invalid(reason) => assert!(reason.contains(why), "{text:?}: {reason:?} lacks {why:?}"),
            other => panic!("{text:?} should be Invalid, got {other:?}"),
        }
    }
}

#[test]
fn error_codes_are_stable() {
    use std::time::Duration;
    let cases = [
        (ToolError::InvalidArgs(vec![]), "invalid_args"),
        (ToolError::UnknownTool("x".into()), "unknown_tool"),
        (ToolError::Timeout(Duration::from_secs(1)), "timeout"),
        (ToolError::Failed("x".into()), "tool_failed"),
        (
            ToolError::Http {
                status: Some(404),
                message: "x".into(),
            },
            "http_error",
        ),
        (ToolError::Cancelled, "cancelled"),
    ];
    for (err, code) in cases {
        assert_eq!(err.code(), code);
    }
    assert_eq!(
        ToolError::UnknownTool("foo_bar".into()).to_string(),
        "unknown tool 'foo_bar'"
    );
}

#[test]
fn shared_types_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ArgSchema>();
    assert_send_sync::<tessera_tools::BuiltinRegistry>();
    assert_send_sync::<tessera_tools::HttpTool>();
}
