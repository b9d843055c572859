//! `tessera record CHAT_ID`: a stored chat becomes a test file, so a conversation that went
//! wrong in production becomes a regression test.
//!
//! - **model**: every assistant message of the transcript, per agent and in order, as a reply
//!   in the `demo.json` format (text, `json` for JSON text, `tool_calls`). The scripted model
//!   picks replies by counting the agent's earlier messages, so the replay gets the same
//!   answers in the same places.
//! - **steps**: the user's messages, UI answers, timeouts and cancels, read from the event log.
//! - **expect**: the stored events, final context and status, in the form `--update` writes.
//!
//! Secrets are never written. The vault is not opened at all; the log already holds only
//! `<field>_provided` / `<field>_length` for each secret field, and the recorded answer
//! carries asterisks of the same length in its place (so the replay's metadata matches).
//! Variables read from the environment (often credentials) are left out of the context.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use tessera_llm::{Message, Role};
use tessera_manifest::{VarSource, Workflow};
use tessera_store::{ChatStore, PendingUiRecord, StoredChat, StoredEvent, StoredMessage};

use crate::format::{Answer, Empty, IGNORED_EVENTS, Step, TestFile};
use crate::runner::{snapshot, summarize_with};

/// Why a chat could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// No chat with that id in the store.
    #[error("no chat {0} in the store")]
    NotFound(String),
    /// The chat's workflow is not among the loaded ones.
    #[error("chat {chat_id} runs workflow {workflow}, which is not in the workflows dir")]
    UnknownWorkflow {
        /// The chat.
        chat_id: String,
        /// Its workflow's name.
        workflow: String,
    },
    /// Reading the store failed.
    #[error("store: {0}")]
    Store(String),
}

/// Reads chat `chat_id` from `store` and builds its test file; `workflows` are the loaded
/// workflows (the chat's is picked by name). Returns the file and the chat's workflow.
pub async fn record_from_store<'w>(
    store: &dyn ChatStore,
    chat_id: &str,
    workflows: &'w [Workflow],
) -> Result<(TestFile, &'w Workflow), RecordError> {
    let err = |e: tessera_store::StoreError| RecordError::Store(e.to_string());
    let chat = store
        .load_chat(chat_id)
        .await
        .map_err(err)?
        .ok_or_else(|| RecordError::NotFound(chat_id.to_owned()))?;
    let workflow = workflows
        .iter()
        .find(|w| w.name == chat.record.workflow)
        .ok_or_else(|| RecordError::UnknownWorkflow {
            chat_id: chat_id.to_owned(),
            workflow: chat.record.workflow.clone(),
        })?;
    let messages = store.all_messages(chat_id).await.map_err(err)?;
    let events = store
        .events_after(chat_id, 0, u32::MAX)
        .await
        .map_err(err)?;
    let pending = store.pending_ui(chat_id).await.map_err(err)?;
    Ok((
        record(workflow, &chat, &messages, &events, &pending),
        workflow,
    ))
}

/// Builds the test file of a stored chat (pure; see the module docs).
pub fn record(
    workflow: &Workflow,
    chat: &StoredChat,
    messages: &[StoredMessage],
    events: &[StoredEvent],
    pending: &[PendingUiRecord],
) -> TestFile {
    let events: Vec<(String, Value)> = events
        .iter()
        .filter(|e| !IGNORED_EVENTS.contains(&&*e.event_type))
        .filter_map(|e| {
            let mut v: Value = serde_json::from_str(&e.json).ok()?;
            Some((
                e.event_type.clone().into_owned(),
                v.get_mut("data").map(Value::take)?,
            ))
        })
        .collect();
    let context = recordable_context(workflow, &chat.state.context);
    let still_waiting: Vec<String> = pending
        .iter()
        .filter_map(|p| {
            p.call
                .get("tool_name")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    let waiting: Vec<&str> = still_waiting.iter().map(String::as_str).collect();
    let steps = steps_from(workflow, &events);
    let actual = summarize_with(events, context.clone(), &chat.state.status, &waiting);
    TestFile {
        description: format!(
            "Recorded from chat {} ({} turns, status {}).",
            chat.record.chat_id, chat.state.turn, chat.state.status
        ),
        context: initial_context(workflow, &context),
        model: Some(model_from(messages)),
        steps,
        expect: snapshot(&actual),
    }
}

/// The declared variables except environment-sourced ones (often credentials).
fn recordable_context(workflow: &Workflow, context: &Map<String, Value>) -> Map<String, Value> {
    context
        .iter()
        .filter(|(name, _)| {
            workflow
                .variables
                .iter()
                .find(|v| &v.name == *name)
                .is_none_or(|v| matches!(v.source, VarSource::Static))
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The store keeps only the latest context. A static variable that no `ui_response` trigger
/// sets and that is not derived never changes during a chat, so a final value other than its
/// default is the value the chat was created with.
fn initial_context(workflow: &Workflow, last: &Map<String, Value>) -> Map<String, Value> {
    workflow
        .variables
        .iter()
        .filter(|v| matches!(v.source, VarSource::Static))
        .filter(|v| {
            !workflow
                .ui_response_triggers
                .iter()
                .any(|t| t.variable == v.name)
        })
        .filter_map(|v| {
            let value = last.get(&v.name)?;
            (*value != v.default).then(|| (v.name.clone(), value.clone()))
        })
        .collect()
}

/// The model's replies, per agent in transcript order, in the `demo.json` format.
fn model_from(messages: &[StoredMessage]) -> Value {
    let mut agents: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for stored in messages {
        let Ok(message) = stored.raw.parse::<Message>() else {
            continue;
        };
        let Some(agent) = message
            .name
            .as_deref()
            .filter(|_| message.role == Role::Assistant)
        else {
            continue;
        };
        let mut reply = Map::new();
        if !message.tool_calls.is_empty() {
            let calls: Vec<Value> = message
                .tool_calls
                .iter()
                .map(|c| {
                    let arguments = serde_json::from_str::<Value>(&c.arguments)
                        .unwrap_or_else(|_| Value::String(c.arguments.clone()));
                    json!({"name": c.name, "arguments": arguments})
                })
                .collect();
            reply.insert("tool_calls".into(), Value::Array(calls));
        }
        let text = message.content_str();
        if !text.is_empty() || message.tool_calls.is_empty() {
            match serde_json::from_str::<Value>(text) {
                Ok(v @ (Value::Object(_) | Value::Array(_))) if message.tool_calls.is_empty() => {
                    reply.insert("json".into(), v);
                }
                _ => {
                    reply.insert("content".into(), text.into());
                }
            }
        }
        agents
            .entry(agent.to_owned())
            .or_default()
            .push(Value::Object(reply));
    }
    json!({ "agents": agents })
}

/// The user's actions, read from the event log (`chat.*` events with their `data`).
pub fn steps_from(workflow: &Workflow, events: &[(String, Value)]) -> Vec<Step> {
    let mut steps = Vec::new();
    // Tool of the UI call waiting for an answer, and whether a cancel already ended it.
    let mut waiting: Option<String> = None;
    let mut cancelled: Vec<String> = Vec::new();
    for (kind, data) in events {
        let tool = data.get("tool_name").and_then(Value::as_str).unwrap_or("");
        match kind.as_str() {
            "chat.text" if data.get("role").and_then(Value::as_str) == Some("user") => {
                let content = data.get("content").and_then(Value::as_str).unwrap_or("");
                steps.push(Step::User(content.to_owned()));
            }
            "chat.tool_call" if data.get("awaiting_response") == Some(&Value::Bool(true)) => {
                waiting = Some(tool.to_owned());
            }
            "chat.run_complete"
                if data.get("reason").and_then(Value::as_str) == Some("cancelled") =>
            {
                // Only a cancel while a UI call waits can be replayed (steps run when the chat
                // has settled); a cancel during a model call is left out.
                if let Some(tool) = waiting.take() {
                    steps.push(Step::Cancel(Empty {}));
                    cancelled.push(tool);
                }
            }
            "chat.tool_response"
                if data.get("interaction_type").and_then(Value::as_str) == Some("auto_tool") =>
            {
                waiting = None;
                if let Some(i) = cancelled.iter().position(|t| t == tool) {
                    cancelled.remove(i);
                    continue;
                }
                let payload = data.get("payload").cloned().unwrap_or(Value::Null);
                let code = payload.get("code").and_then(Value::as_str);
                if code == Some("ui_timeout") {
                    steps.push(Step::Timeout(tool.to_owned()));
                    continue;
                }
                let secret_fields: &[String] = workflow
                    .tools
                    .iter()
                    .find(|t| t.function == tool)
                    .map_or(&[], |t| &t.secret_fields);
                steps.push(Step::Answer(answer_from(tool, &payload, secret_fields)));
            }
            _ => {}
        }
    }
    steps
}

/// The browser's answer as the log shows it, with asterisks where a secret was.
fn answer_from(tool: &str, payload: &Value, secret_fields: &[String]) -> Answer {
    let text = |key: &str| payload.get(key).and_then(Value::as_str).map(str::to_owned);
    let mut data = payload.get("data").cloned();
    if let Some(data) = &mut data {
        restore_secret_placeholders(data, secret_fields);
    }
    Answer {
        tool: Some(tool.to_owned()),
        status: text("status").unwrap_or_else(|| "success".into()),
        action: text("action"),
        data,
        message: text("message"),
        code: text("code"),
    }
}

/// Turns `<field>_provided` / `<field>_length` back into `<field>: "****"` (same length).
fn restore_secret_placeholders(value: &mut Value, secret_fields: &[String]) {
    match value {
        Value::Object(map) => {
            for field in secret_fields {
                let provided = map.remove(&format!("{field}_provided"));
                let length = map.remove(&format!("{field}_length"));
                if provided.is_some() || length.is_some() {
                    let n = length.and_then(|l| l.as_u64()).unwrap_or(0);
                    let n = usize::try_from(n).unwrap_or(0).min(4096);
                    map.insert(field.clone(), Value::String("*".repeat(n)));
                }
            }
            for v in map.values_mut() {
                restore_secret_placeholders(v, secret_fields);
            }
        }
        Value::Array(items) => {
            for v in items {
                restore_secret_placeholders(v, secret_fields);
            }
        }
        _ => {}
    }
}
