//! `AgentRunner`: drives one [`TurnMachine`] — calls the model, runs agent tools, and reports
//! the outcome to its `ChatSession`. One runner lives for one turn, on the chat's arbiter; all
//! waiting happens in spawned futures that report back into the actor, never in a handler.

use std::sync::Arc;

use actix::prelude::*;
use futures::StreamExt;
use serde_json::{Map, Value};
use tessera_llm::{ChatModel, DeltaSink, Message};
use tessera_protocol::{InteractionType, ServerEvent};
use tessera_tools::{ToolContext, ToolError};
use tracing::Instrument;

use crate::dedup::{ClaimKey, ClaimOutcome, CompleteKey, DedupCache, ToolKey};
use crate::events::{Publish, ToolCallInfo, tool_call_event, tool_response_event};
use crate::hidden_text::HiddenTextFilter;
use crate::plan::AgentPlan;
use crate::transcript::Transcript;
use crate::turn::{
    Step, ToolInvocation, ToolResult, TurnFailure, TurnLimits, TurnMachine, TurnOutput,
};

/// Stop the turn at the next opportunity (in-flight model calls are dropped).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CancelTurn;

/// How the turn ended, reported to the chat's session when the runner stops.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TurnFinished {
    pub turn: u32,
    pub result: Result<TurnOutput, TurnFailure>,
    /// Messages a failed turn had added.
    pub partial: Vec<Message>,
}

/// Everything a runner needs besides the machine.
pub struct RunnerParts {
    /// Where the turn's events go (the chat's session). Peers are shared by `Arc`: cloning
    /// an actix `Recipient` or `Addr` allocates, and each tool call and stream takes them.
    pub publish: Arc<Recipient<Publish>>,
    /// Where the turn's outcome goes (the chat's session).
    pub report: Arc<Recipient<TurnFinished>>,
    pub dedup: Arc<Addr<DedupCache>>,
    pub model: Arc<dyn ChatModel>,
    pub tool_ctx: ToolContext,
    pub turn: u32,
    pub workflow_name: Arc<str>,
    /// The `invoke_workflow` span this turn's `invoke_agent` span goes under.
    pub workflow_span: tracing::Span,
    /// A turn re-run after a restart: the tool events of the turn the chat's log holds
    /// already (a reused result is not announced twice). Empty otherwise.
    pub logged_tools: LoggedToolEvents,
}

/// The agent-tool events of one turn that a chat's stored log holds, by invocation key: a
/// turn re-run after a restart or takeover announces only what clients have not seen.
#[derive(Debug, Clone, Default)]
pub struct LoggedToolEvents {
    /// Keys whose `chat.tool_call` is logged.
    pub calls: Vec<String>,
    /// Keys whose `chat.tool_response` is logged.
    pub responses: Vec<String>,
}

/// Runs one agent turn.
pub struct AgentRunner {
    machine: TurnMachine,
    first: Option<Step>,
    parts: RunnerParts,
    in_flight: Option<SpawnHandle>,
    finished: bool,
    /// `invoke_agent {agent}`: ends when the runner is dropped.
    span: tracing::Span,
}

impl AgentRunner {
    /// Starts a turn of `plan`; the runner reports with [`TurnFinished`] and stops.
    pub fn new(
        plan: Arc<AgentPlan>,
        transcript: &mut Transcript,
        context: &Map<String, Value>,
        limits: TurnLimits,
        parts: RunnerParts,
    ) -> Self {
        let (machine, first) = TurnMachine::start(
            plan,
            transcript,
            context,
            parts.tool_ctx.turn_idempotency_key.clone(),
            limits,
        );
        let span = tessera_telemetry::agent_span(
            &parts.workflow_span,
            &machine.plan().name,
            &parts.tool_ctx.chat_id,
            parts.turn,
        );
        Self {
            machine,
            first: Some(first),
            parts,
            in_flight: None,
            finished: false,
            span,
        }
    }

    fn drive(&mut self, step: Step, ctx: &mut Context<Self>) {
        self.in_flight = None;
        match step {
            Step::CallModel(request) => {
                let sink = request.stream.then(|| self.delta_sink());
                let model = &self.parts.model;
                let span = tessera_telemetry::chat_span(
                    &self.span,
                    model.provider_name(),
                    request.model.as_deref().unwrap_or(model.label()),
                    &self.parts.tool_ctx.chat_id,
                );
                let captured_input =
                    tessera_telemetry::capturing_content().then(|| request.messages.clone());
                let call = with_deadline(
                    self.machine.model_call_deadline(),
                    model.complete(request, sink),
                )
                .instrument(span.clone());
                let started = std::time::Instant::now();
                let handle = ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
                    let step = match result {
                        Ok(reply) => {
                            tessera_telemetry::record_chat_response(
                                &span,
                                &reply.model,
                                reply.usage.prompt_tokens,
                                reply.usage.completion_tokens,
                                reply.finish_reason.as_deref(),
                            );
                            if let Some(input) = &captured_input {
                                let secrets = act.parts.tool_ctx.secrets.as_ref();
                                capture(&span, "gen_ai.input.messages", input, secrets);
                                capture(&span, "gen_ai.output.messages", [&reply.message], secrets);
                            }
                            act.publish_usage(&reply.model, reply.usage, started.elapsed());
                            act.machine.on_model_reply(reply)
                        }
                        Err(err) => {
                            tessera_telemetry::record_error(&span, err.code());
                            tracing::warn!(agent = %act.machine.plan().name, code = err.code(), "model call failed");
                            act.machine.on_model_error(&err)
                        }
                    };
                    act.drive(step, ctx);
                }));
                self.in_flight = Some(handle);
            }
            Step::RunTools(calls) => {
                // The calls of one model message run concurrently, at most the agent's
                // `max_parallel_tools` at a time; `buffered` yields results in call order.
                let limit = self.machine.plan().max_parallel_tools;
                let runs: Vec<_> = calls.into_iter().map(|call| self.run_tool(call)).collect();
                let batch = futures::stream::iter(runs)
                    .buffered(limit)
                    .collect::<Vec<_>>();
                let handle = ctx.spawn(batch.into_actor(self).map(|results, act, ctx| {
                    let step = act.machine.on_tool_results(results);
                    act.drive(step, ctx);
                }));
                self.in_flight = Some(handle);
            }
            Step::Finished(output) => self.report(Ok(output), ctx),
            Step::Failed(failure) => self.report(Err(failure), ctx),
        }
    }

    fn report(&mut self, result: Result<TurnOutput, TurnFailure>, ctx: &mut Context<Self>) {
        if self.finished {
            return;
        }
        self.finished = true;
        let partial = if result.is_err() {
            self.machine.take_added()
        } else {
            Vec::new()
        };
        self.parts.report.do_send(TurnFinished {
            turn: self.parts.turn,
            result,
            partial,
        });
        ctx.stop();
    }

    /// Claims the invocation key, announces the call, runs the tool under its timeout, and
    /// announces the result. A refused claim never runs the tool.
    fn run_tool(&self, call: ToolInvocation) -> impl Future<Output = ToolResult> + 'static {
        let plan = self.machine.plan().clone();
        let publish = Arc::clone(&self.parts.publish);
        let dedup = Arc::clone(&self.parts.dedup);
        let mut tool_ctx = self.parts.tool_ctx.clone();
        let workflow = self.parts.workflow_name.clone();
        let call_logged = self.parts.logged_tools.calls.contains(&call.invocation_key);
        let response_logged = self
            .parts
            .logged_tools
            .responses
            .contains(&call.invocation_key);
        tool_ctx.turn_idempotency_key = Arc::from(call.invocation_key.as_str());
        let key = ToolKey::of_turn(&tool_ctx);
        let span = tessera_telemetry::tool_span(
            &self.span,
            &plan.tools[call.tool_index].name,
            &call.call_id,
            &tool_ctx.chat_id,
        );
        let traced = span.clone();
        async move {
            // Claimed when this call starts, not when the batch is built: a call still
            // waiting for a free slot at a crash was never started and is not "interrupted".
            let claim = dedup.send(ClaimKey(key.clone()));
            let tool = &plan.tools[call.tool_index];
            let info = ToolCallInfo {
                agent: &plan.name,
                tool_name: &tool.name,
                corr: &call.invocation_key,
                component_type: None,
                workflow_name: &workflow,
                interaction: InteractionType::AgentTool,
            };
            let claimed = claim.await.unwrap_or(ClaimOutcome::InFlight);
            match claimed {
                ClaimOutcome::Claimed => {}
                // Started before a crash and never completed: report it, never re-run it.
                ClaimOutcome::Interrupted => {
                    return ToolResult {
                        call_id: call.call_id,
                        result: Ok(Arc::new(tessera_tools::interrupted_result())),
                    };
                }
                // Ran to completion before a crash or a takeover, and its result was recorded:
                // the re-run turn gets the same result, the tool does not run again.
                ClaimOutcome::Completed(Some(recorded)) => {
                    let recorded = Arc::new(recorded);
                    if !call_logged {
                        publish.do_send(Publish(tool_call_event(&info, &call.args)));
                    }
                    if !response_logged {
                        publish.do_send(Publish(tool_response_event(
                            &info,
                            true,
                            Arc::clone(&recorded),
                            None,
                        )));
                    }
                    return ToolResult {
                        call_id: call.call_id,
                        result: Ok(recorded),
                    };
                }
                ClaimOutcome::InFlight | ClaimOutcome::Completed(None) => {
                    let result = Err(ToolError::Failed(format!(
                        "this tool call already ran ({claimed:?}); it is not run twice"
                    )));
                    return ToolResult {
                        call_id: call.call_id,
                        result,
                    };
                }
            }
            publish.do_send(Publish(tool_call_event(&info, &call.args)));
            let capturing = tessera_telemetry::capturing_content();
            let secrets = tool_ctx.secrets.clone();
            if capturing {
                capture(
                    &traced,
                    "gen_ai.tool.call.arguments",
                    &call.args,
                    secrets.as_ref(),
                );
            }
            let result =
                match tokio::time::timeout(tool.timeout, tool.exec.invoke(call.args, tool_ctx))
                    .await
                {
                    Ok(result) => result.map(Arc::new),
                    Err(_) => Err(ToolError::Timeout(tool.timeout)),
                };
            dedup.do_send(CompleteKey {
                key,
                result: result.as_ref().ok().cloned(),
            });
            if capturing && let Ok(value) = &result {
                capture(&traced, "gen_ai.tool.call.result", value, secrets.as_ref());
            }
            let (ok, shown) = match &result {
                Ok(value) => (true, Arc::clone(value)),
                Err(err) => {
                    tessera_telemetry::record_error(&traced, err.code());
                    (false, Arc::new(err.to_result()))
                }
            };
            publish.do_send(Publish(tool_response_event(&info, ok, shown, None)));
            ToolResult {
                call_id: call.call_id,
                result,
            }
        }
        .instrument(span)
    }

    fn delta_sink(&self) -> DeltaSink {
        let publish = Arc::clone(&self.parts.publish);
        let agent = self.machine.plan().name.to_string();
        let message_id = message_id(&self.parts.tool_ctx.turn_idempotency_key);
        let mut hidden = HiddenTextFilter::new(self.machine.plan().hidden_triggers.clone());
        Box::new(move |delta: &str| {
            if let Some(delta) = hidden.push(delta) {
                publish.do_send(Publish(ServerEvent::TextDelta {
                    message_id: message_id.clone(),
                    agent: agent.clone(),
                    delta,
                }));
            }
        })
    }

    fn publish_usage(&self, model: &str, usage: tessera_llm::Usage, latency: std::time::Duration) {
        self.parts.publish.do_send(Publish(ServerEvent::Usage {
            agent: self.machine.plan().name.to_string(),
            model: model.to_owned(),
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.total(),
            latency_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
        }));
    }
}

/// `call`, cut off after `deadline` as a timeout: a model that streams a token a second
/// forever never trips a per-chunk timeout, so the whole call needs a bound. Dropping the
/// future drops its HTTP request.
async fn with_deadline(
    deadline: std::time::Duration,
    call: impl Future<Output = Result<tessera_llm::ChatResponse, tessera_llm::LlmError>>,
) -> Result<tessera_llm::ChatResponse, tessera_llm::LlmError> {
    tokio::time::timeout(deadline, call)
        .await
        .unwrap_or(Err(tessera_llm::LlmError::Timeout(deadline)))
}

/// Puts `content` on `span` as JSON, with the chat's secrets redacted (only when the operator
/// opted in to content on spans: see `tessera_telemetry::capturing_content`).
fn capture(
    span: &tracing::Span,
    key: &'static str,
    content: impl serde::Serialize,
    secrets: Option<&tessera_tools::SecretView>,
) {
    let json = serde_json::to_string(&content).unwrap_or_default();
    let json = match secrets {
        Some(secrets) => secrets.redact(&json),
        None => json,
    };
    tessera_telemetry::record_content(span, key, json);
}

/// The id of the message a turn's final text is published under.
pub fn message_id(turn_key: &str) -> String {
    crate::ids::join(&["msg_", turn_key])
}

impl Actor for AgentRunner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(step) = self.first.take() {
            self.drive(step, ctx);
        }
    }
}

impl Handler<CancelTurn> for AgentRunner {
    type Result = ();

    fn handle(&mut self, _: CancelTurn, ctx: &mut Self::Context) {
        if let Some(handle) = self.in_flight.take() {
            ctx.cancel_future(handle);
        }
        let step = self.machine.cancel();
        self.drive(step, ctx);
    }
}
