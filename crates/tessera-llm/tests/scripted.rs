//! The scripted demo model.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tessera_llm::scripted::ScriptedModel;
use tessera_llm::{ChatModel, ChatRequest, LlmError, Message, Role, ToolCall};

fn model(script: Value) -> ScriptedModel {
    ScriptedModel::from_json(&script).expect("valid script")
}

/// A transcript in which `agent` has already spoken `turns` times.
fn transcript(agent: &str, turns: usize, user: &str) -> Vec<Message> {
    let mut messages = vec![
        Message::text(Role::System, "sys"),
        Message::text(Role::User, user),
    ];
    for i in 0..turns {
        messages.push(Message::assistant(agent, format!("turn {i}")));
        messages.push(Message::assistant("Someone Else", "noise"));
    }
    messages
}

async fn reply(model: &ScriptedModel, agent: &str, turns: usize, user: &str) -> String {
    let request = ChatRequest::new(agent, transcript(agent, turns, user));
    let response = model.complete(request, None).await.expect("reply");
    response.message.content_str().to_owned()
}

#[tokio::test]
async fn labelled_as_demo() {
    let m = model(json!({"description": "d", "agents": {"A": [{"content": "x"}]}}));
    assert_eq!(m.label(), "demo (scripted)");
    assert!(m.is_demo());
    assert_eq!(m.description(), "d");
    assert!(m.has_agent("A") && !m.has_agent("B"));
}

#[tokio::test]
async fn replies_in_order_then_last_repeats() {
    let m = model(
        json!({"description": "", "agents": {"A": [{"content": "one"}, {"content": "two"}, {"content": "three"}]}}),
    );
    let mut got = Vec::new();
    for turns in 0..6 {
        got.push(reply(&m, "A", turns, "hi").await);
    }
    assert_eq!(got, ["one", "two", "three", "three", "three", "three"]);
}

#[tokio::test]
async fn loop_from_cycles() {
    let m = model(json!({
        "description": "",
        "agents": {"A": [{"content": "intro"}, {"content": "x"}, {"content": "y"}], "B": [{"content": "b0"}, {"content": "b1"}]},
        "loop_from": {"A": 1, "B": 0},
    }));
    let mut a = Vec::new();
    let mut b = Vec::new();
    for turns in 0..7 {
        a.push(reply(&m, "A", turns, "hi").await);
        b.push(reply(&m, "B", turns, "hi").await);
    }
    assert_eq!(a, ["intro", "x", "y", "x", "y", "x", "y"]);
    assert_eq!(b, ["b0", "b1", "b0", "b1", "b0", "b1", "b0"]);
}

#[tokio::test]
async fn only_own_assistant_messages_count() {
    let m = model(
        json!({"description": "", "agents": {"A": [{"content": "first"}, {"content": "second"}]}}),
    );
    // Messages from other agents and user messages naming A do not advance A's script.
    let mut messages = transcript("Other", 3, "hi");
    messages.push(Message {
        name: Some("A".into()),
        ..Message::text(Role::User, "I am not A's turn")
    });
    let response = m
        .complete(ChatRequest::new("A", messages), None)
        .await
        .expect("reply");
    assert_eq!(response.message.content.as_deref(), Some("first"));
    assert_eq!(response.message.name.as_deref(), Some("A"));
}

#[tokio::test]
async fn substitution_escapes_quotes_inside_json() {
    let m = model(json!({"description": "", "agents": {
        "A": [{"content": "You said: {{last_user_message}}"}],
        "J": [{"json": {"echo": "{{last_user_message}}", "list": ["<{{last_user_message}}>"], "n": 1}}],
        "T": [{"tool_calls": [{"name": "search", "arguments": {"q": "{{last_user_message}}"}}]}],
    }}));
    let user = "say \"hi\" \\ and {braces}\nnewline";
    let mut messages = transcript("A", 0, "older message");
    messages.push(Message::text(Role::User, user));
    messages.push(Message::tool_result("c", "not a user message"));

    let text = m
        .complete(ChatRequest::new("A", messages.clone()), None)
        .await
        .expect("reply");
    assert_eq!(text.message.content_str(), format!("You said: {user}"));

    let json_reply = m
        .complete(ChatRequest::new("J", messages.clone()), None)
        .await
        .expect("reply");
    let parsed: Value = serde_json::from_str(json_reply.message.content_str()).expect("valid JSON");
    assert_eq!(
        parsed,
        json!({"echo": user, "list": [format!("<{user}>")], "n": 1})
    );

    let tool_reply = m
        .complete(ChatRequest::new("T", messages), None)
        .await
        .expect("reply");
    let args: Value =
        serde_json::from_str(&tool_reply.message.tool_calls[0].arguments).expect("valid JSON");
    assert_eq!(args, json!({"q": user}));
}

#[tokio::test]
async fn json_reply_is_sent_as_json_text() {
    let m = model(
        json!({"description": "", "agents": {"Critic": [{"json": {"verdict": "approve", "score": 8}}]}}),
    );
    let response = m
        .complete(ChatRequest::new("Critic", vec![]), None)
        .await
        .expect("reply");
    let parsed: Value = serde_json::from_str(response.message.content_str()).expect("JSON");
    assert_eq!(parsed, json!({"verdict": "approve", "score": 8}));
}

#[tokio::test]
async fn tool_call_replies_have_deterministic_ids() {
    let m = model(json!({"description": "", "agents": {"Researcher": [
        {"content": "Let me look.", "tool_calls": [
            {"name": "search", "arguments": {"q": "rust"}},
            {"name": "clock"},
        ]},
        {"content": "Found it."},
    ]}}));
    let first = m
        .complete(ChatRequest::new("Researcher", vec![]), None)
        .await
        .expect("reply");
    assert_eq!(first.message.content.as_deref(), Some("Let me look."));
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        first.message.tool_calls,
        vec![
            ToolCall {
                id: "call_Researcher_0_0".into(),
                name: "search".into(),
                arguments: "{\"q\":\"rust\"}".into()
            },
            ToolCall {
                id: "call_Researcher_0_1".into(),
                name: "clock".into(),
                arguments: "{}".into()
            },
        ]
    );
    let again = m
        .complete(ChatRequest::new("Researcher", vec![]), None)
        .await
        .expect("reply");
    assert_eq!(again, first, "the same transcript gives the same reply");

    // After the tool round-trip, the agent's own tool-call message counts as its turn.
    let mut messages = vec![first.message.clone()];
    messages.extend(
        first
            .message
            .tool_calls
            .iter()
            .map(|c| Message::tool_result(c.id.clone(), "result")),
    );
    let second = m
        .complete(ChatRequest::new("Researcher", messages), None)
        .await
        .expect("reply");
    assert_eq!(second.message.content.as_deref(), Some("Found it."));
    assert_eq!(second.finish_reason.as_deref(), Some("stop"));
    assert!(second.message.tool_calls.is_empty());
}

#[tokio::test]
async fn streaming_emits_word_deltas() {
    let m =
        model(json!({"description": "", "agents": {"A": [{"content": "The quick  brown fox."}]}}));
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink_seen = Arc::clone(&seen);
    let mut request = ChatRequest::new("A", vec![]);
    request.stream = true;
    let response = m
        .complete(
            request,
            Some(Box::new(move |d: &str| {
                sink_seen.lock().expect("lock").push(d.to_owned())
            })),
        )
        .await
        .expect("reply");
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen, ["The", " quick", "  brown", " fox."]);
    assert_eq!(seen.concat(), response.message.content_str());
}

#[tokio::test]
async fn no_deltas_without_stream_flag() {
    let m = model(json!({"description": "", "agents": {"A": [{"content": "a b c"}]}}));
    let seen = Arc::new(Mutex::new(0usize));
    let sink_seen = Arc::clone(&seen);
    let response = m
        .complete(
            ChatRequest::new("A", vec![]),
            Some(Box::new(move |_: &str| {
                *sink_seen.lock().expect("lock") += 1
            })),
        )
        .await
        .expect("reply");
    assert_eq!(response.message.content_str(), "a b c");
    assert_eq!(*seen.lock().expect("lock"), 0);
}

#[tokio::test]
async fn usage_is_non_zero() {
    let m = model(json!({"description": "", "agents": {"A": [{"content": "hello there"}]}}));
    let response = m
        .complete(ChatRequest::new("A", transcript("A", 0, "hi")), None)
        .await
        .expect("reply");
    assert!(response.usage.prompt_tokens > 0);
    assert!(response.usage.completion_tokens > 0);
    assert_eq!(response.model, "demo (scripted)");
}

#[tokio::test]
async fn unknown_agent_is_a_script_error() {
    let m = model(
        json!({"description": "", "agents": {"Writer": [{"content": "x"}], "Critic": [{"content": "y"}]}}),
    );
    let err = m
        .complete(ChatRequest::new("Editor", vec![]), None)
        .await
        .expect_err("must fail");
    let LlmError::Script(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(
        msg.contains("\"Editor\"") && msg.contains("Critic, Writer"),
        "{msg}"
    );
    assert_eq!(err.code(), "llm_script");
}

#[test]
fn invalid_scripts_are_rejected_at_construction() {
    let cases = [
        (json!([]), "JSON object"),
        (json!({"description": ""}), "agents"),
        (json!({"agents": {"A": []}}), "no replies"),
        (json!({"agents": {"A": "hi"}}), "array"),
        (json!({"agents": {"A": [{}]}}), "needs"),
        (
            json!({"agents": {"A": [{"contnet": "typo"}]}}),
            "unknown key",
        ),
        (
            json!({"agents": {"A": [{"content": "x", "json": {}}]}}),
            "not both",
        ),
        (json!({"agents": {"A": [{"content": 5}]}}), "string"),
        (
            json!({"agents": {"A": [{"tool_calls": [{"arguments": {}}]}]}}),
            "name",
        ),
        (
            json!({"agents": {"A": [{"tool_calls": [{"name": "t", "arguments": "{}"}]}]}}),
            "object",
        ),
        (
            json!({"agents": {"A": [{"content": "x"}]}, "loop_from": {"A": 1}}),
            "loop_from",
        ),
        (
            json!({"agents": {"A": [{"content": "x"}]}, "loop_from": {"B": 0}}),
            "\"B\"",
        ),
    ];
    for (script, needle) in cases {
        match ScriptedModel::from_json(&script) {
            Err(LlmError::Script(msg)) => assert!(msg.contains(needle), "{script}: {msg}"),
            other => panic!("{script}: {other:?}"),
        }
    }
    // Keys starting with `_` are comments.
    assert!(
        ScriptedModel::from_json(&json!({"agents": {"A": [{"content": "x", "_note": "ok"}]}}))
            .is_ok()
    );
}

#[test]
fn from_file_reads_and_reports_paths() {
    let dir = std::env::temp_dir().join(format!("tessera-llm-scripted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good = dir.join("demo.json");
    std::fs::write(
        &good,
        r#"{"description": "file demo", "agents": {"A": [{"content": "from file"}]}}"#,
    )
    .expect("write");
    let m = ScriptedModel::from_file(&good).expect("loads");
    assert_eq!(m.description(), "file demo");

    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{ not json").expect("write");
    let err = ScriptedModel::from_file(&bad).expect_err("bad JSON");
    assert!(
        matches!(&err, LlmError::Script(m) if m.contains("bad.json")),
        "{err:?}"
    );

    let missing = dir.join("missing.json");
    let err = ScriptedModel::from_file(&missing).expect_err("missing file");
    assert!(
        matches!(&err, LlmError::Script(m) if m.contains("missing.json")),
        "{err:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn concurrent_chats_do_not_interfere() {
    let m: Arc<dyn ChatModel> = Arc::new(model(
        json!({"description": "", "agents": {"A": [{"content": "0"}, {"content": "1"}, {"content": "2"}]}}),
    ));
    let calls =
        (0..30).map(|i| m.complete(ChatRequest::new("A", transcript("A", i % 3, "hi")), None));
    for (i, result) in futures::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(
            result.expect("reply").message.content_str(),
            (i % 3).to_string()
        );
    }
}
