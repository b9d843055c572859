//! The scripted demo model's `when` rules: replies chosen by what the user typed, with
//! placeholders filled from the match, the latest tool result and other agents' outputs.

use serde_json::{Value, json};
use tessera_llm::scripted::ScriptedModel;
use tessera_llm::{ChatModel, ChatRequest, ChatResponse, LlmError, Message, Role, ToolCall};

fn model(script: Value) -> ScriptedModel {
    match ScriptedModel::from_json(&script) {
        Ok(m) => m,
        Err(e) => panic!("invalid script: {e}"),
    }
}

async fn ask(m: &ScriptedModel, agent: &str, messages: Vec<Message>) -> ChatResponse {
    match m.complete(ChatRequest::new(agent, messages), None).await {
        Ok(r) => r,
        Err(e) => panic!("no reply: {e}"),
    }
}

fn args(response: &ChatResponse) -> Value {
    let call = response
        .message
        .tool_calls
        .first()
        .unwrap_or_else(|| panic!("no tool call in {response:?}"));
    serde_json::from_str(&call.arguments).unwrap_or_else(|e| panic!("{e}"))
}

fn todo() -> ScriptedModel {
    model(json!({"agents": {"Todo": {
        "when": [
            {"match": "(?i)^\\s*(list|show)\\b", "replies": [
                {"tool_calls": [{"name": "list_tasks", "arguments": {"status": "all"}}]},
                {"content": "You have {{tool_result.count}}: {{tool_result.tasks[*].title|nothing yet}}."}
            ]},
            {"match": "(?i)^\\s*(?:complete|done)\\s+(?P<task>.+)$", "replies": [
                {"tool_calls": [{"name": "list_tasks", "arguments": {"status": "pending"}}]},
                {"tool_calls": [{"name": "complete_task", "arguments": {"task_id": "{{tool_result.tasks[title~task].id|none}}"}}]},
                {"content": "{{tool_result.message}}"}
            ]},
            {"match": "(?i)^\\s*add\\s+(?P<title>.+)$", "replies": [
                {"tool_calls": [{"name": "add_task", "arguments": {"title": "{{match.title}}"}}]},
                {"content": "Added \"{{match.title}}\"."}
            ]}
        ],
        "otherwise": [{"content": "Try \"add …\". You said: {{last_user_message}}"}]
    }}}))
}

fn user(text: &str) -> Message {
    Message::text(Role::User, text)
}

/// The assistant's tool-call message and its result, as the engine appends them.
fn tool_step(agent: &str, id: &str, name: &str, result: Value) -> [Message; 2] {
    [
        Message {
            tool_calls: vec![ToolCall {
                id: id.to_owned(),
                name: name.to_owned(),
                arguments: "{}".to_owned(),
            }],
            content: None,
            ..Message::assistant(agent, "")
        },
        Message::tool_result(id, result.to_string()),
    ]
}

#[tokio::test]
async fn the_rule_is_chosen_by_what_the_user_typed() {
    let m = todo();
    let added = ask(&m, "Todo", vec![user("add  Buy milk ")]).await;
    assert_eq!(added.message.tool_calls[0].name, "add_task");
    assert_eq!(args(&added), json!({"title": "Buy milk"}), "group trimmed");

    let listed = ask(&m, "Todo", vec![user("List my tasks")]).await;
    assert_eq!(listed.message.tool_calls[0].name, "list_tasks");

    let other = ask(&m, "Todo", vec![user("hello")]).await;
    assert!(other.message.tool_calls.is_empty());
    assert_eq!(
        other.message.content_str(),
        "Try \"add …\". You said: hello"
    );
}

#[tokio::test]
async fn each_model_call_after_the_message_takes_the_next_reply_reading_the_tool_result() {
    let m = todo();
    let mut messages = vec![user("add old"), Message::assistant("Todo", "Added.")];
    messages.push(user("show tasks"));
    messages.extend(tool_step(
        "Todo",
        "c1",
        "list_tasks",
        json!({"status": "success", "count": 2, "tasks": [{"title": "Buy milk"}, {"title": "Walk the dog"}]}),
    ));
    let answer = ask(&m, "Todo", messages).await;
    assert!(answer.message.tool_calls.is_empty());
    assert_eq!(
        answer.message.content_str(),
        "You have 2: Buy milk, Walk the dog."
    );

    let empty = ask(
        &m,
        "Todo",
        [
            vec![user("list")],
            tool_step("Todo", "c1", "list_tasks", json!({"count": 0, "tasks": []})).to_vec(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(
        empty.message.content_str(),
        "You have 0: nothing yet.",
        "the default fills an empty list"
    );
}

#[tokio::test]
async fn a_filter_finds_the_item_the_user_named() {
    let m = todo();
    let tasks = json!({"tasks": [
        {"id": "t_1", "title": "Buy milk"},
        {"id": "t_2", "title": "Walk the dog"}
    ]});
    let mut messages = vec![user("done walk THE dog")];
    messages.extend(tool_step("Todo", "c1", "list_tasks", tasks.clone()));
    let call = ask(&m, "Todo", messages).await;
    assert_eq!(call.message.tool_calls[0].name, "complete_task");
    assert_eq!(args(&call), json!({"task_id": "t_2"}));

    let mut messages = vec![user("complete taxes")];
    messages.extend(tool_step("Todo", "c1", "list_tasks", tasks));
    assert_eq!(
        args(&ask(&m, "Todo", messages).await),
        json!({"task_id": "none"}),
        "no match: the default"
    );
}

#[tokio::test]
async fn json_protocol_feedback_is_not_taken_for_the_users_message() {
    let m = model(json!({"agents": {"Kit": {
        "when": [{"match": "(?i)^count (?P<text>.+)$", "replies": [
            {"json": {"tool": "word_count", "args": {"text": "{{match.text}}"}}},
            {"content": "{{tool_result.words}} words in \"{{match.text}}\"."}
        ]}],
        "otherwise": [{"content": "?"}]
    }}}));
    let first = ask(&m, "Kit", vec![user("count one two three")]).await;
    let parsed: Value =
        serde_json::from_str(first.message.content_str()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        parsed,
        json!({"tool": "word_count", "args": {"text": "one two three"}})
    );
    // The engine feeds the result back as a user message in the JSON text protocol.
    let messages = vec![
        user("count one two three"),
        Message::assistant("Kit", first.message.content_str()),
        user(r#"Tool 1 [word_count]: {"status":"success","words":3,"chars":13}"#),
    ];
    let second = ask(&m, "Kit", messages).await;
    assert_eq!(
        second.message.content_str(),
        "3 words in \"one two three\"."
    );
}

#[tokio::test]
async fn an_agents_output_is_copied_whole_into_json() {
    let m = model(json!({"agents": {
        "Planner": [{"json": {"plan": {"name": "P", "steps": [1, 2]}}}],
        "Packer": [{"json": {"plan": "{{agent_output.Planner.plan}}", "note": "for {{agent_output.Planner.plan.name}}"}}]
    }}));
    let messages = vec![
        user("go"),
        Message::assistant("Planner", r#"{"plan": {"name": "Old", "steps": []}}"#),
        user("no, again"),
        Message::assistant("Planner", r#"{"plan": {"name": "P", "steps": [1, 2]}}"#),
    ];
    let packed = ask(&m, "Packer", messages).await;
    let parsed: Value =
        serde_json::from_str(packed.message.content_str()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        parsed,
        json!({"plan": {"name": "P", "steps": [1, 2]}, "note": "for P"}),
        "the latest output, as a value"
    );
    let nothing = ask(&m, "Packer", vec![user("go")]).await;
    let parsed: Value =
        serde_json::from_str(nothing.message.content_str()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed["plan"], Value::Null, "no output yet");
}

#[tokio::test]
async fn placeholders_typed_by_the_user_are_not_expanded() {
    let m = todo();
    let typed = "add {{last_user_message}} and {{match.title}}";
    let added = ask(&m, "Todo", vec![user(typed)]).await;
    assert_eq!(
        args(&added),
        json!({"title": "{{last_user_message}} and {{match.title}}"})
    );
}

#[test]
fn bad_rules_are_rejected_at_construction() {
    let rule = |r: Value| json!({"agents": {"A": {"when": [r], "otherwise": [{"content": "x"}]}}});
    let cases = [
        (
            json!({"agents": {"A": {"when": []}}}),
            "otherwise must be an array",
        ),
        (
            json!({"agents": {"A": {"otherwise": [{"content": "x"}]}}}),
            "when must be an array",
        ),
        (
            rule(json!({"match": "(unclosed", "replies": [{"content": "x"}]})),
            "not a valid regex",
        ),
        (
            rule(json!({"match": "(?P<a>.+)", "replies": [{"content": "{{match.b}}"}]})),
            "no group named \"b\"",
        ),
        (
            rule(json!({"match": "x", "replies": [{"content": "{{whatever}}"}]})),
            "unknown placeholder",
        ),
        (
            rule(json!({"match": "x", "replies": [{"content": "{{tool_result.a[b]}}"}]})),
            "[field~group]",
        ),
        (
            rule(json!({"match": "x", "replies": [{"content": "{{match.a"}]})),
            "unclosed",
        ),
        (rule(json!({"match": "x", "replies": []})), "no replies"),
        (rule(json!({"match": "x", "reply": []})), "unknown key"),
        (
            json!({"agents": {"A": [{"content": "{{match.a}}"}]}}),
            "only be used in the replies of a `when` rule",
        ),
        (
            json!({"agents": {"A": {"when": [], "otherwise": [{"content": "x"}]}}, "loop_from": {"A": 0}}),
            "no sequence to loop",
        ),
    ];
    for (script, needle) in cases {
        match ScriptedModel::from_json(&script) {
            Err(LlmError::Script(msg)) => assert!(msg.contains(needle), "{script}: {msg}"),
            other => {
                panic!("{script}: expected a script error containing {needle:?}, got {other:?}")
            }
        }
    }
}

#[test]
fn the_shipped_demo_scripts_load() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../workflows");
    let mut loaded = 0;
    for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let demo = entry.path().join("demo.json");
        if demo.is_file() {
            if let Err(e) = ScriptedModel::from_file(&demo) {
                panic!("{e}");
            }
            loaded += 1;
        }
    }
    assert!(
        loaded >= 4,
        "found {loaded} demo scripts under {}",
        root.display()
    );
}
