//! Parallel tool calls: the calls of one model message run concurrently (bounded by the
//! agent's `max_parallel_tools`), each with its own claim and events, and the model reads the
//! results in its own call order, not in completion order.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tessera_engine::EngineConfig;
use tessera_engine::session::UserInput;
use tessera_llm::{ChatRequest, Role};
use tessera_tools::{Tool, ToolContext, ToolError};
use tokio::sync::watch;

/// An `echo` whose calls meet: each call waits until two calls have started, so two calls
/// run one after the other never meet (the first gives up after `patience`). The call for
/// "a" also waits until "b" has finished, so completion order is the reverse of call order.
struct Rendezvous {
    started: watch::Sender<usize>,
    b_finished: watch::Sender<bool>,
    patience: Duration,
}

impl Tool for Rendezvous {
    fn invoke(
        &self,
        args: Map<String, Value>,
        _ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        self.started.send_modify(|n| *n += 1);
        let mut started = self.started.subscribe();
        let mut b_finished = self.b_finished.subscribe();
        let b_done = self.b_finished.clone();
        let patience = self.patience;
        let message = args.get("message").cloned().unwrap_or(Value::Null);
        Box::pin(async move {
            let met = tokio::time::timeout(patience, started.wait_for(|n| *n >= 2))
                .await
                .is_ok_and(|r| r.is_ok());
            if !met {
                return Ok(json!({"status": "error", "message": "the other call never started"}));
            }
            if message == "a" {
                let waited = tokio::time::timeout(patience, b_finished.wait_for(|b| *b))
                    .await
                    .is_ok_and(|r| r.is_ok());
                if !waited {
                    return Ok(json!({"status": "error", "message": "b never finished"}));
                }
            } else {
                b_done.send_replace(true);
            }
            Ok(json!({"status": "success", "echoed": message}))
        })
    }
}

/// Asks for echo "a" and echo "b" in one message; once they ran, answers with the tool
/// results it was given, in the order it was given them: `call_id=result` lines.
fn two_echoes(req: &ChatRequest) -> Reply {
    if after_tool(req) {
        let fed: Vec<String> = req
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .map(|m| {
                format!(
                    "{}={}",
                    m.tool_call_id.as_deref().unwrap_or("?"),
                    m.content_str()
                )
            })
            .collect();
        return Reply::Text(fed.join("\n"));
    }
    Reply::Tools(vec![
        ("echo", json!({"message": "a"})),
        ("echo", json!({"message": "b"})),
    ])
}

fn rendezvous(patience: Duration) -> Arc<dyn Tool> {
    Arc::new(Rendezvous {
        started: watch::Sender::new(0),
        b_finished: watch::Sender::new(false),
        patience,
    })
}

async fn run_two_echoes(h: &Harness) -> (Client, Vec<String>) {
    let mut c = start(h).await;
    let said = c.chat.addr.send(UserInput {
        content: "go".into(),
        client_msg_id: None,
    });
    assert!(said.await.is_ok());
    let answer = c.until_match_agent("HelperAgent").await;
    let lines = answer["data"]["content"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    (c, lines)
}

async fn start(h: &Harness) -> Client {
    let chat = h
        .engine
        .start_chat(tessera_engine::NewChat {
            tenant: "t".into(),
            user: "u".into(),
            workflow: "EngineTest".into(),
            context: Map::new(),
            chat_id: None,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut c = subscribe(chat, 0).await;
    c.until("chat.input_request").await;
    c
}

#[actix::test]
async fn two_tool_calls_of_one_message_run_concurrently_and_answer_in_call_order() {
    // Patience far above any scheduling delay: it is only reached when the calls run serially.
    let h = harness_custom(
        EngineConfig::default(),
        tessera_engine::EngineHooks::default(),
        Some(rendezvous(Duration::from_secs(10))),
        |_| {},
        two_echoes,
    );
    let (c, lines) = run_two_echoes(&h).await;
    assert_eq!(lines.len(), 2, "one result per call: {lines:?}");
    assert!(
        lines[0].starts_with("call_0_0=") && lines[0].contains(r#""echoed":"a""#),
        "first the result of the first call, although it finished last: {lines:?}"
    );
    assert!(
        lines[1].starts_with("call_0_1=") && lines[1].contains(r#""echoed":"b""#),
        "{lines:?}"
    );
    assert!(
        lines.iter().all(|l| l.contains("success")),
        "both calls met, so they ran at the same time: {lines:?}"
    );
    // Each call has its own announced call and response, under its own invocation key.
    let calls: Vec<&str> = c
        .of("chat.tool_call")
        .iter()
        .filter_map(|e| e["data"]["corr"].as_str())
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[0].ends_with(":s1:0") || calls[1].ends_with(":s1:0"));
    assert!(calls[0].ends_with(":s1:1") || calls[1].ends_with(":s1:1"));
    assert_eq!(c.of("chat.tool_response").len(), 2);
}

#[actix::test]
async fn with_max_parallel_tools_1_the_calls_run_one_after_the_other() {
    // The control for the test above: run serially, the rendezvous fails.
    let h = harness_custom(
        EngineConfig::default(),
        tessera_engine::EngineHooks::default(),
        Some(rendezvous(Duration::from_millis(300))),
        |workflow| {
            if let Some(agent) = workflow.agents.get_mut("HelperAgent") {
                agent.max_parallel_tools = 1;
            }
        },
        two_echoes,
    );
    let (_c, lines) = run_two_echoes(&h).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].contains("the other call never started"),
        "serially the first call waits alone: {lines:?}"
    );
    assert!(lines[1].contains(r#""echoed":"b""#), "{lines:?}");
}
