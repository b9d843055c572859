//! One agent turn as a plain state machine with no I/O of its own.
//!
//! The `AgentRunner` actor (`runner.rs`) feeds it model replies and tool
//! results and performs whatever [`Step`] it returns. Keeping the loop pure makes every rule of
//! `agent_runner.md` and `structured_tool_loop.md` testable without actors, HTTP or timers.

use std::sync::Arc;

use serde_json::{Map, Value};
use tessera_llm::{
    ChatRequest, ChatResponse, LlmError, Message, Messages, ResponseFormat, Role, ToolChoice,
};
use tessera_tools::{
    JsonModeReply, ToolError, ToolErrorResult, parse_arguments, parse_json_mode_reply,
    summarize_for_model,
};

use crate::ids;
use crate::plan::{AgentPlan, ToolCallingMode};
use crate::transcript::Transcript;

/// Limits a turn runs under (copied from `EngineConfig`).
#[derive(Debug, Clone, Copy)]
pub struct TurnLimits {
    pub max_tool_steps: u32,
    pub tool_result_max_chars: usize,
    pub structured_output_corrections: u32,
    pub json_mode_corrections: u32,
    pub stream: bool,
    /// `max_tokens` of agents that set none.
    pub max_tokens: u32,
    /// Total deadline of one model call for agents that set none.
    pub model_call_deadline: std::time::Duration,
}

/// What the driver must do next.
#[derive(Debug)]
pub enum Step {
    /// Call the model with this request.
    CallModel(ChatRequest),
    /// Run these validated tool calls, then report with [`TurnMachine::on_tool_results`].
    RunTools(Vec<ToolInvocation>),
    /// The turn produced its final output.
    Finished(TurnOutput),
    /// The turn ended without output.
    Failed(TurnFailure),
}

/// A tool call that passed ownership and argument validation and may run.
#[derive(Debug, Clone)]
pub struct ToolInvocation {
    /// The model's id for the call (generated in `json` mode).
    pub call_id: String,
    /// Index into the agent's tools.
    pub tool_index: usize,
    pub name: Arc<str>,
    pub args: Map<String, Value>,
    /// Deterministic per chat turn, step and position: the tool's idempotency key.
    pub invocation_key: String,
}

/// The outcome of one [`ToolInvocation`].
#[derive(Debug)]
pub struct ToolResult {
    pub call_id: String,
    /// Shared with the `chat.tool_response` and the durable completion.
    pub result: Result<Arc<Value>, ToolError>,
}

/// What a successful turn produced.
#[derive(Debug, Clone)]
pub struct TurnOutput {
    /// Messages to append to the transcript, in order (tool calls, tool results, final reply).
    pub new_messages: Vec<Message>,
    /// The final text of the agent.
    pub final_text: Arc<str>,
    /// Schema-valid structured output, when the agent has an output model.
    pub structured: Option<Value>,
}

/// Why a turn ended without output. Each maps to a stable `chat.error` code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TurnFailure {
    #[error("the model failed: {message}")]
    Model { code: &'static str, message: String },
    #[error("structured output still invalid after correction: {errors}")]
    StructuredOutputInvalid { errors: String },
    #[error("the reply is not valid tool-call JSON after correction: {reason}")]
    InvalidToolJson { reason: String },
    #[error("the agent used more than {0} tool steps without a final answer")]
    ToolStepsExhausted(u32),
    #[error("the turn was cancelled")]
    Cancelled,
}

/// The state of one agent turn.
pub struct TurnMachine {
    plan: Arc<AgentPlan>,
    limits: TurnLimits,
    turn_key: Arc<str>,
    /// The start of every model request of the turn: the system message and the chat's
    /// transcript, shared with the chat (never copied). Released when the turn ends, so the
    /// chat appends to its transcript in place again.
    prefix: Messages,
    /// Messages this turn added: the rest of each request. By the next request the previous
    /// one is normally gone, so they are appended in place (`Arc::make_mut` copies only this
    /// turn's few messages, and only if a model kept its request).
    added: Arc<Vec<Message>>,
    steps: u32,
    structured_corrections_left: u32,
    json_corrections_left: u32,
    /// Results of calls refused before running (unknown tool, bad arguments), merged with the
    /// real results so the model sees one answer per call, in call order.
    pending_calls: Vec<PendingCall>,
    json_tool_counter: u32,
    done: bool,
}

#[derive(Debug)]
enum PendingCall {
    Refused { call_id: String, message: String },
    Running { call_id: String, name: Arc<str> },
}

impl TurnMachine {
    /// Starts a turn of `plan` over the chat's `transcript` with the agent's context variables
    /// `context`.
    pub fn start(
        plan: Arc<AgentPlan>,
        transcript: &mut Transcript,
        context: &Map<String, Value>,
        turn_key: Arc<str>,
        limits: TurnLimits,
    ) -> (Self, Step) {
        let prefix = transcript.request_prefix(plan.system_prompt(context));
        let mut machine = Self {
            structured_corrections_left: limits.structured_output_corrections,
            json_corrections_left: limits.json_mode_corrections,
            plan,
            limits,
            turn_key,
            prefix,
            // Room for a typical tool step (the call and its result) without growing.
            added: Arc::new(Vec::with_capacity(3)),
            steps: 0,
            pending_calls: Vec::new(),
            json_tool_counter: 0,
            done: false,
        };
        let step = machine.call_model();
        (machine, step)
    }

    /// The idempotency key of the `index`th tool call of the current step:
    /// `{turn key}:s{step}:{index}`.
    fn invocation_key(&self, index: usize) -> String {
        ids::join(&[
            &self.turn_key,
            ":s",
            ids::digits().format(self.steps),
            ":",
            ids::digits().format(index),
        ])
    }

    /// The agent this turn runs.
    pub fn plan(&self) -> &Arc<AgentPlan> {
        &self.plan
    }

    /// A model call failed (after the client's own retries).
    pub fn on_model_error(&mut self, err: &LlmError) -> Step {
        self.fail(TurnFailure::Model {
            code: err.code(),
            message: err.to_string(),
        })
    }

    /// The model answered.
    pub fn on_model_reply(&mut self, reply: ChatResponse) -> Step {
        if self.done {
            return self.fail(TurnFailure::Cancelled);
        }
        let mut message = reply.message;
        message.role = Role::Assistant;
        message.name = Some(self.plan.name.clone());
        match self.plan.tool_calling {
            ToolCallingMode::Native if !message.tool_calls.is_empty() => {
                self.native_tool_calls(message)
            }
            ToolCallingMode::Json if !self.plan.tools.is_empty() => self.json_reply(message),
            _ => self.final_reply(message),
        }
    }

    /// The tools of the last [`Step::RunTools`] finished.
    pub fn on_tool_results(&mut self, results: Vec<ToolResult>) -> Step {
        if self.done {
            return self.fail(TurnFailure::Cancelled);
        }
        let pending = std::mem::take(&mut self.pending_calls);
        let mut results: Vec<Option<ToolResult>> = results.into_iter().map(Some).collect();
        let max = self.limits.tool_result_max_chars;
        let json_mode = self.plan.tool_calling == ToolCallingMode::Json;
        for call in pending {
            let (call_id, text, name) = match call {
                PendingCall::Refused { call_id, message } => (call_id, message, None),
                PendingCall::Running { call_id, name } => {
                    let found = results
                        .iter_mut()
                        .find(|r| r.as_ref().is_some_and(|r| r.call_id == call_id))
                        .and_then(Option::take);
                    let text = match found.map(|r| r.result) {
                        Some(Ok(value)) => summarize_for_model(&value, max),
                        Some(Err(err)) => err.to_result_text(),
                        None => ToolErrorResult::new(None, "the tool produced no result").to_text(),
                    };
                    (call_id, text, Some(name))
                }
            };
            if json_mode {
                self.json_tool_counter += 1;
                let label = name.as_deref().unwrap_or("refused");
                let n = self.json_tool_counter;
                self.add(Message::text(
                    Role::User,
                    format!("Tool {n} [{label}]: {text}"),
                ));
            } else {
                self.add(Message::tool_result(call_id, text));
            }
        }
        self.call_model()
    }

    /// Stops the turn; the driver must not run anything else for it.
    pub fn cancel(&mut self) -> Step {
        self.fail(TurnFailure::Cancelled)
    }

    fn native_tool_calls(&mut self, message: Message) -> Step {
        if self.steps >= self.limits.max_tool_steps {
            return self.fail(TurnFailure::ToolStepsExhausted(self.limits.max_tool_steps));
        }
        self.steps += 1;
        let mut runnable = Vec::new();
        for (i, call) in message.tool_calls.iter().enumerate() {
            match self.validate_call(&call.name, parse_arguments(&call.arguments)) {
                Ok((tool_index, args)) => {
                    let name = self.plan.tools[tool_index].name.clone();
                    self.pending_calls.push(PendingCall::Running {
                        call_id: call.id.clone(),
                        name: name.clone(),
                    });
                    runnable.push(ToolInvocation {
                        call_id: call.id.clone(),
                        tool_index,
                        name,
                        args,
                        invocation_key: self.invocation_key(i),
                    });
                }
                Err(message) => self.pending_calls.push(PendingCall::Refused {
                    call_id: call.id.clone(),
                    message,
                }),
            }
        }
        self.add(message);
        if runnable.is_empty() {
            // Nothing may run: the model reads the refusals and tries again.
            return self.on_tool_results(Vec::new());
        }
        Step::RunTools(runnable)
    }

    fn json_reply(&mut self, message: Message) -> Step {
        let reply = parse_json_mode_reply(message.content_str());
        match reply {
            JsonModeReply::Final(_) => self.final_reply(message),
            JsonModeReply::ToolCall { tool, args } => {
                if self.steps >= self.limits.max_tool_steps {
                    return self.fail(TurnFailure::ToolStepsExhausted(self.limits.max_tool_steps));
                }
                match self.validate_call(&tool, Ok(args)) {
                    Ok((tool_index, args)) => {
                        self.steps += 1;
                        let name = self.plan.tools[tool_index].name.clone();
                        let call_id = format!("json_{}", self.steps);
                        self.pending_calls.push(PendingCall::Running {
                            call_id: call_id.clone(),
                            name: name.clone(),
                        });
                        self.add(message);
                        Step::RunTools(vec![ToolInvocation {
                            invocation_key: self.invocation_key(0),
                            call_id,
                            tool_index,
                            name,
                            args,
                        }])
                    }
                    Err(reason) => self.json_correction(message, reason),
                }
            }
            JsonModeReply::Invalid(reason) => self.json_correction(message, reason),
        }
    }

    fn json_correction(&mut self, message: Message, reason: String) -> Step {
        if self.json_corrections_left == 0 {
            return self.fail(TurnFailure::InvalidToolJson { reason });
        }
        self.json_corrections_left -= 1;
        self.add(message);
        self.add(Message::text(
            Role::User,
            format!(
                "Your reply was rejected: {reason}. Answer with either plain final text, or exactly one JSON object {{\"tool\": \"<name>\", \"args\": {{...}}}} using only the tools listed."
            ),
        ));
        self.call_model()
    }

    fn final_reply(&mut self, message: Message) -> Step {
        let text: Arc<str> = message.content.clone().unwrap_or_else(|| Arc::from(""));
        let Some(output) = self.plan.output.as_ref() else {
            self.add(message);
            return self.finish(text, None);
        };
        match parse_structured(&text).and_then(|v| {
            output
                .model
                .validate(&v)
                .map(|()| v)
                .map_err(|e| e.join("; "))
        }) {
            Ok(value) => {
                self.add(message);
                self.finish(text, Some(value))
            }
            Err(errors) if !self.plan.structured_required => {
                // Output is only advisory for this agent: keep the text, drop the structure.
                tracing::debug!(agent = %self.plan.name, %errors, "optional structured output did not validate");
                self.add(message);
                self.finish(text, None)
            }
            Err(errors) => {
                if self.structured_corrections_left == 0 {
                    return self.fail(TurnFailure::StructuredOutputInvalid { errors });
                }
                self.structured_corrections_left -= 1;
                let correction = format!(
                    "Your output did not match the required schema {}. Errors: {errors}. Reply again with only the corrected JSON object.",
                    output.model_name
                );
                self.add(message);
                self.add(Message::text(Role::User, correction));
                self.call_model()
            }
        }
    }

    /// Ownership and strict argument checks. The error text is what the model will read.
    fn validate_call(
        &self,
        name: &str,
        args: Result<Value, ToolError>,
    ) -> Result<(usize, Map<String, Value>), String> {
        let Some(index) = self.plan.tools.iter().position(|t| &*t.name == name) else {
            let known: Vec<&str> = self.plan.tools.iter().map(|t| &*t.name).collect();
            let message = format!(
                "Unknown tool '{}'. Available tools: {}",
                clip(name, 64),
                known.join(", ")
            );
            return Err(ToolErrorResult::new(Some("unknown_tool"), &message).to_text());
        };
        let args = args.map_err(|e| e.to_result_text())?;
        let normalized = self.plan.tools[index]
            .args
            .normalize(args)
            .map_err(|e| e.to_result_text())?;
        Ok((index, normalized))
    }

    /// How long one model call of this turn may take in total.
    pub fn model_call_deadline(&self) -> std::time::Duration {
        self.plan
            .call_deadline
            .unwrap_or(self.limits.model_call_deadline)
    }

    fn call_model(&mut self) -> Step {
        let messages = self.prefix.with_tail(Arc::clone(&self.added));
        let mut request = ChatRequest::new(&*self.plan.name, messages);
        request.model = self.plan.model.clone();
        request.temperature = self.plan.temperature;
        request.stream = self.limits.stream;
        request.max_tokens = Some(self.plan.max_tokens.unwrap_or(self.limits.max_tokens));
        if self.plan.tool_calling == ToolCallingMode::Native && !self.plan.tools.is_empty() {
            request.tools = self.plan.tool_specs.clone();
            request.tool_choice = Some(ToolChoice::Auto);
        }
        if let Some(output) = &self.plan.output
            && self.plan.tool_calling == ToolCallingMode::Native
            && self.plan.tools.is_empty()
        {
            request.response_format = Some(ResponseFormat {
                name: output.model_name.to_string(),
                schema: Arc::clone(&output.model.schema),
                strict: false,
            });
        }
        Step::CallModel(request)
    }

    fn add(&mut self, message: Message) {
        Arc::make_mut(&mut self.added).push(message);
    }

    fn finish(&mut self, final_text: Arc<str>, structured: Option<Value>) -> Step {
        self.end();
        Step::Finished(TurnOutput {
            new_messages: self.take_added(),
            final_text,
            structured,
        })
    }

    fn fail(&mut self, failure: TurnFailure) -> Step {
        self.end();
        Step::Failed(failure)
    }

    /// Marks the turn done and lets go of the chat's transcript, which the chat is about to
    /// append to: holding it would make that append copy it.
    fn end(&mut self) {
        self.done = true;
        self.prefix = Messages::default();
    }

    /// Messages this turn added so far (kept when a turn fails, for the transcript).
    pub fn take_added(&mut self) -> Vec<Message> {
        let added = std::mem::take(&mut self.added);
        Arc::try_unwrap(added).unwrap_or_else(|shared| shared.to_vec())
    }
}

/// Parses an agent's structured output: a JSON object, optionally inside a ```json fence.
fn parse_structured(text: &str) -> Result<Value, String> {
    let trimmed = text.trim();
    let inner = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|rest| rest.strip_suffix("```"))
        .unwrap_or(trimmed);
    match serde_json::from_str::<Value>(inner.trim()) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err("the output must be a JSON object".to_owned()),
        Err(e) => Err(format!("the output is not valid JSON ({e})")),
    }
}

fn clip(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use tessera_llm::{Tools, Usage};

    use super::*;

    fn plan() -> Arc<AgentPlan> {
        Arc::new(AgentPlan {
            name: Arc::from("A"),
            system_message: Arc::from("sys"),
            context_variables: Vec::new(),
            model: None,
            temperature: None,
            tool_calling: ToolCallingMode::Native,
            tools: Vec::new(),
            tool_specs: Tools::default(),
            json_mode_catalogue: None,
            output: None,
            structured_required: false,
            auto_tool_mode: false,
            max_consecutive_auto_reply: 1,
            max_tokens: None,
            call_deadline: None,
            hidden_triggers: Arc::from([]),
            max_parallel_tools: 1,
        })
    }

    fn limits() -> TurnLimits {
        TurnLimits {
            max_tool_steps: 4,
            tool_result_max_chars: 1000,
            structured_output_corrections: 1,
            json_mode_corrections: 1,
            stream: false,
            max_tokens: 100,
            model_call_deadline: std::time::Duration::from_secs(10),
        }
    }

    #[test]
    fn a_turn_shares_the_chat_transcript_and_lets_go_of_it_when_it_ends() {
        let mut transcript = Transcript::default();
        for i in 0..50 {
            transcript.push(Message::text(Role::User, format!("m{i}")));
        }
        let (mut machine, step) = TurnMachine::start(
            plan(),
            &mut transcript,
            &Map::new(),
            Arc::from("k"),
            limits(),
        );
        let Step::CallModel(request) = step else {
            panic!("the turn must start with a model call, got {step:?}");
        };
        // The request holds the chat's messages themselves, behind the system message.
        assert_eq!(request.messages.len(), 51);
        assert!(std::ptr::eq(
            &request.messages.head()[1..],
            transcript.messages()
        ));
        drop(request);
        assert!(
            transcript.is_shared(),
            "the running turn holds the transcript"
        );
        let reply = ChatResponse {
            message: Message::text(Role::Assistant, "done"),
            usage: Usage::default(),
            finish_reason: None,
            model: "m".into(),
        };
        let step = machine.on_model_reply(reply);
        assert!(matches!(step, Step::Finished(_)), "{step:?}");
        // Appending the turn's messages now happens in place, without copying the transcript.
        assert!(!transcript.is_shared());
    }
}
