//! The one place where Tessera's typed events become AG-UI events (protocol 1.0, as defined by
//! the `@ag-ui/core` package). A run's events are not independent (a streamed message is
//! opened once and closed once), so [`AguiTranslator`] keeps that little state; single events
//! without state convert with `From`.

use serde::Serialize;
use serde_json::{Map, Value, json};
use tessera_protocol::{
    InteractionType, PendingUiCall, ServerEvent, ToolAnnouncement, ToolCallEvent,
};

/// One AG-UI event, serialized as `{"type": "RUN_STARTED", ...}` with camelCase fields.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AguiEvent {
    #[serde(rename_all = "camelCase")]
    RunStarted {
        thread_id: String,
        run_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<Value>,
    },
    #[serde(rename_all = "camelCase")]
    RunFinished {
        thread_id: String,
        run_id: String,
        outcome: RunOutcome,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<Value>,
    },
    #[serde(rename_all = "camelCase")]
    RunError {
        message: String,
        code: String,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageStart {
        message_id: String,
        role: &'static str,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageContent {
        message_id: String,
        delta: String,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageEnd {
        message_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallStart {
        tool_call_id: String,
        tool_call_name: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallArgs {
        tool_call_id: String,
        delta: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallEnd {
        tool_call_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallResult {
        message_id: String,
        tool_call_id: String,
        content: String,
        role: &'static str,
    },
    StateSnapshot {
        snapshot: Value,
    },
    StateDelta {
        delta: Vec<Value>,
    },
}

/// Why a run ended (`RUN_FINISHED.outcome`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RunOutcome {
    Success,
    Interrupt { interrupts: Vec<Interrupt> },
    Cancelled,
}

/// A UI tool call the run waits for; the next run answers it by `id` in `resume`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interrupt {
    pub id: String,
    pub reason: String,
    pub message: String,
    pub tool_call_id: String,
    pub metadata: Value,
}

impl From<&PendingUiCall> for Interrupt {
    fn from(call: &PendingUiCall) -> Self {
        Self {
            id: call.corr.clone(),
            reason: "tool_call".into(),
            message: format!("{} is waiting for the user", call.tool_name),
            tool_call_id: call.corr.clone(),
            metadata: json!({
                "componentType": call.component_type,
                "display": call.display,
                "agent": call.agent,
                "timeoutS": call.timeout_s,
            }),
        }
    }
}

/// The three events of one whole tool call: start, its arguments as one JSON delta, end.
pub struct WholeToolCall(pub [AguiEvent; 3]);

fn tool_call(id: &str, name: &str, args: &Value) -> WholeToolCall {
    WholeToolCall([
        AguiEvent::ToolCallStart {
            tool_call_id: id.to_owned(),
            tool_call_name: name.to_owned(),
        },
        AguiEvent::ToolCallArgs {
            tool_call_id: id.to_owned(),
            delta: args.to_string(),
        },
        AguiEvent::ToolCallEnd {
            tool_call_id: id.to_owned(),
        },
    ])
}

impl From<&ToolAnnouncement> for WholeToolCall {
    fn from(call: &ToolAnnouncement) -> Self {
        tool_call(
            &call.corr,
            &call.tool_name,
            &Value::Object(call.tool_args.clone()),
        )
    }
}

impl From<&PendingUiCall> for WholeToolCall {
    /// A UI tool as an AG-UI frontend tool call: the arguments are the component's payload.
    fn from(call: &PendingUiCall) -> Self {
        tool_call(&call.corr, &call.tool_name, &call.payload)
    }
}

/// What a Tessera event means for the run that streams it.
#[derive(Debug, Clone, PartialEq)]
pub enum RunSignal {
    /// Nothing: keep streaming.
    Continue,
    /// The chat waits for the user to type.
    AwaitingInput,
    /// The chat waits for a UI tool call.
    AwaitingUi(PendingUiCall),
    /// The chat ended (`reason`: terminate, max_turns, cancelled, error).
    Completed(String),
    /// A failure the chat cannot go on from.
    Failed { code: String, message: String },
}

/// Turns one run's Tessera events into AG-UI events.
#[derive(Debug, Default)]
pub struct AguiTranslator {
    /// The assistant message being streamed, if one is open.
    open_message: Option<String>,
    /// What the open message's deltas carried: its complete text may arrive before the rest
    /// of them (a run that attaches mid-stream reads it from the transcript), and the client
    /// gets what they did not carry.
    streamed: String,
    /// Tool calls started in this run (a result of a call started elsewhere is not sent).
    started_tool_calls: Vec<String>,
    /// Messages started in this run, from events or from the transcript: each goes out once.
    started_messages: Vec<String>,
}

impl AguiTranslator {
    /// The AG-UI events for `event`, appended to `out`, and what it means for the run.
    pub fn translate(&mut self, event: &ServerEvent, out: &mut Vec<AguiEvent>) -> RunSignal {
        match event {
            ServerEvent::TextDelta {
                message_id, delta, ..
            } if !delta.is_empty() => {
                if self.open_message.as_deref() != Some(message_id) {
                    if self.started_messages.contains(message_id) {
                        return RunSignal::Continue;
                    }
                    self.close_message(out);
                    self.started_messages.push(message_id.clone());
                    out.push(AguiEvent::TextMessageStart {
                        message_id: message_id.clone(),
                        role: "assistant",
                    });
                    self.open_message = Some(message_id.clone());
                    self.streamed.clear();
                }
                self.streamed.push_str(delta);
                out.push(AguiEvent::TextMessageContent {
                    message_id: message_id.clone(),
                    delta: delta.clone(),
                });
            }
            ServerEvent::Text {
                message_id,
                role,
                content,
                ui_hidden,
                ..
            } if role == "assistant" && !ui_hidden => self.whole_message(message_id, content, out),
            // An auto tool's announcement is followed by its UI call, the frontend tool call
            // a client answers; announcing both would show one call twice.
            ServerEvent::ToolCall(ToolCallEvent::Announced(call))
                if call.interaction == InteractionType::AgentTool =>
            {
                self.close_message(out);
                self.started_tool_calls.push(call.corr.clone());
                out.extend(WholeToolCall::from(call).0);
            }
            ServerEvent::ToolCall(ToolCallEvent::AwaitingUi(call)) => {
                self.announce_ui_call(call, out);
                return RunSignal::AwaitingUi(call.clone());
            }
            ServerEvent::ToolResponse(response)
                if self.started_tool_calls.contains(&response.corr) =>
            {
                self.close_message(out);
                out.push(AguiEvent::ToolCallResult {
                    message_id: format!("{}-result", response.corr),
                    tool_call_id: response.corr.clone(),
                    content: response.result.to_string(),
                    role: "tool",
                });
            }
            ServerEvent::InputRequest { .. } => return RunSignal::AwaitingInput,
            ServerEvent::RunComplete { reason, .. } => return RunSignal::Completed(reason.clone()),
            ServerEvent::Error {
                code,
                message,
                recoverable: false,
            } => {
                return RunSignal::Failed {
                    code: code.as_str().to_owned(),
                    message: message.clone(),
                };
            }
            _ => {}
        }
        RunSignal::Continue
    }

    /// A complete assistant message (an event, or a transcript entry a new thread's client has
    /// not seen), unless it already went out. If it is the message being streamed, the rest of
    /// its text goes out and the message closes.
    pub fn whole_message(&mut self, message_id: &str, content: &str, out: &mut Vec<AguiEvent>) {
        if self.open_message.as_deref() == Some(message_id) {
            // The deltas are a prefix of the complete text; should one ever not be, the
            // client keeps what it was shown rather than a text twice.
            if let Some(rest) = content.strip_prefix(self.streamed.as_str())
                && !rest.is_empty()
            {
                out.push(AguiEvent::TextMessageContent {
                    message_id: message_id.to_owned(),
                    delta: rest.to_owned(),
                });
            }
            self.close_message(out);
            return;
        }
        if content.is_empty() || self.started_messages.iter().any(|m| m == message_id) {
            return;
        }
        self.close_message(out);
        self.started_messages.push(message_id.to_owned());
        out.push(AguiEvent::TextMessageStart {
            message_id: message_id.to_owned(),
            role: "assistant",
        });
        out.push(AguiEvent::TextMessageContent {
            message_id: message_id.to_owned(),
            delta: content.to_owned(),
        });
        out.push(AguiEvent::TextMessageEnd {
            message_id: message_id.to_owned(),
        });
    }

    /// A UI call as a frontend tool call, once per run (a call the run reports as pending
    /// may also arrive as an event).
    pub fn announce_ui_call(&mut self, call: &PendingUiCall, out: &mut Vec<AguiEvent>) {
        if self.started_tool_calls.contains(&call.corr) {
            return;
        }
        self.close_message(out);
        self.started_tool_calls.push(call.corr.clone());
        out.extend(WholeToolCall::from(call).0);
    }

    /// Ends the streamed message, if one is open (before a tool call or the run's end).
    pub fn close_message(&mut self, out: &mut Vec<AguiEvent>) {
        if let Some(message_id) = self.open_message.take() {
            self.streamed.clear();
            out.push(AguiEvent::TextMessageEnd { message_id });
        }
    }
}

/// The JSON Patch (RFC 6902) from one set of context variables to another, top-level keys
/// only (each changed variable is replaced whole).
pub fn state_delta(before: &Map<String, Value>, after: &Map<String, Value>) -> Vec<Value> {
    let mut patch = Vec::new();
    for (key, value) in after {
        let path = format!("/{}", key.replace('~', "~0").replace('/', "~1"));
        match before.get(key) {
            None => patch.push(json!({"op": "add", "path": path, "value": value})),
            Some(old) if old != value => {
                patch.push(json!({"op": "replace", "path": path, "value": value}));
            }
            Some(_) => {}
        }
    }
    for key in before.keys().filter(|k| !after.contains_key(*k)) {
        let path = format!("/{}", key.replace('~', "~0").replace('/', "~1"));
        patch.push(json!({"op": "remove", "path": path}));
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(id: &str, text: &str) -> ServerEvent {
        ServerEvent::TextDelta {
            message_id: id.into(),
            agent: "A".into(),
            delta: text.into(),
        }
    }

    fn text(id: &str, text: &str) -> ServerEvent {
        ServerEvent::Text {
            message_id: id.into(),
            agent: "A".into(),
            role: "assistant".into(),
            content: text.into(),
            ui_hidden: false,
        }
    }

    #[test]
    fn a_streamed_message_opens_once_and_closes_on_the_complete_text() {
        let mut t = AguiTranslator::default();
        let mut out = Vec::new();
        t.translate(&delta("m1", "Hel"), &mut out);
        t.translate(&delta("m1", "lo"), &mut out);
        t.translate(&text("m1", "Hello"), &mut out);
        let types: Vec<String> = out
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or_default()["type"].to_string())
            .collect();
        assert_eq!(
            types,
            [
                "\"TEXT_MESSAGE_START\"",
                "\"TEXT_MESSAGE_CONTENT\"",
                "\"TEXT_MESSAGE_CONTENT\"",
                "\"TEXT_MESSAGE_END\""
            ]
        );
    }

    #[test]
    fn a_complete_text_sends_what_the_deltas_had_not_carried_yet() {
        let contents = |out: &[AguiEvent]| -> Vec<Value> {
            out.iter()
                .map(|e| serde_json::to_value(e).unwrap_or_default())
                .filter(|e| e["type"] != "TEXT_MESSAGE_START")
                .collect()
        };
        // A run that attached mid-stream reads the complete text from the transcript.
        let mut t = AguiTranslator::default();
        let mut out = Vec::new();
        t.translate(&delta("m1", "Hi! I turn"), &mut out);
        t.whole_message("m1", "Hi! I turn ideas into agents.", &mut out);
        t.translate(&delta("m1", " ideas"), &mut out);
        t.translate(&text("m1", "Hi! I turn ideas into agents."), &mut out);
        assert_eq!(
            contents(&out),
            [
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Hi! I turn"}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": " ideas into agents."}),
                json!({"type": "TEXT_MESSAGE_END", "messageId": "m1"}),
            ]
        );
        // The complete text event sends the rest too; one that does not continue the deltas
        // only closes the message.
        let mut t = AguiTranslator::default();
        let mut out = Vec::new();
        t.translate(&delta("m2", "Done"), &mut out);
        t.translate(&text("m2", "Done, thanks"), &mut out);
        t.translate(&delta("m3", "A"), &mut out);
        t.translate(&text("m3", "B"), &mut out);
        assert_eq!(
            contents(&out),
            [
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "Done"}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": ", thanks"}),
                json!({"type": "TEXT_MESSAGE_END", "messageId": "m2"}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m3", "delta": "A"}),
                json!({"type": "TEXT_MESSAGE_END", "messageId": "m3"}),
            ]
        );
    }

    #[test]
    fn a_whole_message_becomes_start_content_end_and_hidden_text_nothing() {
        let mut t = AguiTranslator::default();
        let mut out = Vec::new();
        t.translate(&text("m2", "Hi"), &mut out);
        t.translate(
            &ServerEvent::Text {
                message_id: "m3".into(),
                agent: "A".into(),
                role: "assistant".into(),
                content: "NEXT".into(),
                ui_hidden: true,
            },
            &mut out,
        );
        assert_eq!(out.len(), 3);
        assert_eq!(
            serde_json::to_value(&out[1]).unwrap_or_default(),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "Hi"})
        );
    }

    #[test]
    fn a_ui_call_is_a_frontend_tool_call_and_an_interrupt() {
        let call = PendingUiCall {
            corr: "ui_1".into(),
            tool_name: "action_plan".into(),
            component_type: "ActionPlan".into(),
            display: "artifact".into(),
            agent: "A".into(),
            payload: json!({"plan": 1}),
            timeout_s: None,
        };
        let mut t = AguiTranslator::default();
        let mut out = Vec::new();
        let signal = t.translate(
            &ServerEvent::ToolCall(ToolCallEvent::AwaitingUi(call.clone())),
            &mut out,
        );
        assert_eq!(signal, RunSignal::AwaitingUi(call.clone()));
        assert_eq!(
            serde_json::to_value(&out[1]).unwrap_or_default(),
            json!({"type": "TOOL_CALL_ARGS", "toolCallId": "ui_1", "delta": "{\"plan\":1}"})
        );
        let outcome = RunOutcome::Interrupt {
            interrupts: vec![Interrupt::from(&call)],
        };
        let outcome = serde_json::to_value(outcome).unwrap_or_default();
        assert_eq!(outcome["type"], "interrupt");
        assert_eq!(outcome["interrupts"][0]["id"], "ui_1");
        assert_eq!(outcome["interrupts"][0]["toolCallId"], "ui_1");
    }

    #[test]
    fn the_state_delta_adds_replaces_and_removes_variables() {
        let before = json!({"a": 1, "b": 2, "c/d": 3});
        let after = json!({"a": 1, "b": 5, "e": true});
        let (Value::Object(before), Value::Object(after)) = (before, after) else {
            unreachable!("objects")
        };
        let patch = state_delta(&before, &after);
        assert_eq!(
            patch,
            vec![
                json!({"op": "replace", "path": "/b", "value": 5}),
                json!({"op": "add", "path": "/e", "value": true}),
                json!({"op": "remove", "path": "/c~1d"}),
            ]
        );
    }
}
