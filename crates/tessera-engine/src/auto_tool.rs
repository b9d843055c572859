//! `AutoToolHandler`: the spec's `AutoToolEventHandler`. When an `auto_tool_mode` agent emits
//! valid structured output, the runtime — not the model — invokes the agent's UI tool:
//! claim the turn key, resolve the binding (cached per workflow), validate, map kwargs
//! case-insensitively, announce `chat.tool_call`, run the optional pre-step, wait for the
//! browser through the `UiCorrelator`, strip secrets, announce `chat.tool_response`, and hand
//! the result back.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use serde_json::{Map, Value};
use tessera_manifest::{CompiledModel, DisplayMode, ToolType};
use tessera_protocol::{InteractionType, PendingUiCall};
use tessera_tools::{Tool, ToolContext, ToolErrorResult};
use tracing::Instrument;

use crate::correlator::{AwaitUiResponse, UiCorrelator, UiOutcome};
use crate::dedup::{ClaimKey, ClaimOutcome, CompleteKey, DedupCache, ToolKey};
use crate::events::{Publish, ToolCallInfo, tool_call_event, tool_response_event};
use crate::plan::CompiledWorkflow;

/// Everything needed to auto-invoke one agent's UI tool, resolved once per workflow.
pub struct AutoToolBinding {
    pub model_name: Arc<str>,
    pub agent_name: Arc<str>,
    pub tool_name: Arc<str>,
    /// Lower-cased parameter name → declared name, for case-insensitive kwargs mapping.
    pub param_lookup: HashMap<String, String>,
    pub component: String,
    pub display: String,
    pub secret_fields: Vec<String>,
    pub timeout: Option<Duration>,
    pub prestep: Option<Arc<dyn Tool>>,
    pub model: CompiledModel,
}

impl AutoToolBinding {
    /// How long a call of this tool waits for the browser: its own `timeout_s`, else
    /// `default` (the engine's UI timeout).
    pub fn wait_limit(&self, default: Option<Duration>) -> Option<Duration> {
        self.timeout.or(default)
    }

    /// Maps structured-output fields onto the tool's parameters, ignoring case; fields the
    /// tool does not declare are dropped. A tool without declared parameters takes them all.
    pub fn build_kwargs(&self, data: &Value) -> Map<String, Value> {
        let mut kwargs = Map::new();
        if let Value::Object(fields) = data {
            for (key, value) in fields {
                if self.param_lookup.is_empty() {
                    kwargs.insert(key.clone(), value.clone());
                } else if let Some(name) = self.param_lookup.get(&key.to_lowercase()) {
                    kwargs.insert(name.clone(), value.clone());
                }
            }
        }
        kwargs
    }
}

/// Resolves the binding of `agent` in `workflow`, or `None` when it has no complete auto-tool
/// configuration (agent, registry model, UI tool).
pub fn resolve_binding(workflow: &CompiledWorkflow, agent: &str) -> Option<AutoToolBinding> {
    let wf = &workflow.workflow;
    let model = wf.output_model_of(agent)?.clone();
    let tool = wf.ui_tool_of(agent)?;
    if tool.tool_type != ToolType::UiTool {
        return None;
    }
    let ui = tool.ui.as_ref()?;
    let param_lookup = tool
        .parameters
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| {
            props
                .keys()
                .map(|k| (k.to_lowercase(), k.clone()))
                .collect()
        })
        .unwrap_or_default();
    Some(AutoToolBinding {
        model_name: Arc::from(model.name.as_str()),
        agent_name: Arc::from(agent),
        tool_name: Arc::from(tool.function.as_str()),
        param_lookup,
        component: ui.component.clone(),
        display: match ui.mode {
            DisplayMode::Artifact => "artifact",
            DisplayMode::Inline => "inline",
        }
        .to_owned(),
        secret_fields: tool.secret_fields.clone(),
        timeout: tool.timeout_s.map(Duration::from_secs_f64),
        prestep: workflow.ui_presteps.get(&tool.function).cloned(),
        model,
    })
}

/// Invoke the UI tool bound to `agent` for this structured output.
#[derive(Message)]
#[rtype(result = "AutoToolOutcome")]
pub struct InvokeAutoTool {
    pub workflow: Arc<CompiledWorkflow>,
    pub tool_ctx: ToolContext,
    pub structured_data: Value,
    pub publish: Recipient<Publish>,
    /// The `execute_tool` span of this invocation (named here once the tool is known).
    pub span: tracing::Span,
}

/// How an auto-tool invocation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AutoToolOutcome {
    /// The tool ran; `result` is what the agent reads (secrets removed), shared with the
    /// `chat.tool_response`.
    Completed {
        tool_name: Arc<str>,
        result: Arc<Value>,
        /// The browser's answer (secrets removed), for `ui_response` triggers.
        ui_response: Option<Value>,
        /// Secret values collected from the answer, for the chat's vault only.
        secrets: Vec<(String, String)>,
    },
    /// The turn key was already claimed: nothing ran.
    Duplicate(ClaimOutcome),
    /// No binding for this agent: nothing ran.
    NoBinding,
    /// The structured data failed the model's schema: nothing ran.
    Invalid(String),
    /// The chat left memory while its UI call waited: the call is still pending in the store
    /// and nothing was announced or completed.
    Released,
}

/// The per-arbiter auto-tool actor.
pub struct AutoToolHandler {
    dedup: Addr<DedupCache>,
    correlator: Addr<UiCorrelator>,
    default_ui_timeout: Option<Duration>,
    /// `name@version` of a workflow → agent → binding (`None` cached too, so misses stay
    /// cheap); per version, since a reloaded workflow may bind its agents differently.
    bindings: HashMap<String, HashMap<String, Option<Arc<AutoToolBinding>>>>,
}

impl AutoToolHandler {
    /// A handler using this arbiter's dedup cache and correlator.
    pub fn new(
        dedup: Addr<DedupCache>,
        correlator: Addr<UiCorrelator>,
        default_ui_timeout: Option<Duration>,
    ) -> Self {
        Self {
            dedup,
            correlator,
            default_ui_timeout,
            bindings: HashMap::new(),
        }
    }

    fn binding(
        &mut self,
        workflow: &CompiledWorkflow,
        agent: &str,
    ) -> Option<Arc<AutoToolBinding>> {
        let per_workflow = self
            .bindings
            .entry(format!(
                "{}@{}",
                workflow.workflow.name, workflow.workflow.version
            ))
            .or_default();
        if let Some(cached) = per_workflow.get(agent) {
            return cached.clone();
        }
        let resolved = resolve_binding(workflow, agent).map(Arc::new);
        per_workflow.insert(agent.to_owned(), resolved.clone());
        resolved
    }
}

impl Actor for AutoToolHandler {
    type Context = Context<Self>;
}

impl Handler<InvokeAutoTool> for AutoToolHandler {
    type Result = ResponseFuture<AutoToolOutcome>;

    fn handle(&mut self, msg: InvokeAutoTool, _ctx: &mut Self::Context) -> Self::Result {
        let key = ToolKey::of_turn(&msg.tool_ctx);
        // The claim is enqueued before this handler returns: a duplicate handled next is
        // ordered behind it in the DedupCache mailbox and cannot also win.
        let claim = self.dedup.send(ClaimKey(key.clone()));
        let binding = self.binding(&msg.workflow, &msg.tool_ctx.agent_name);
        let parts = UiWaitParts {
            correlator: self.correlator.clone(),
            dedup: self.dedup.clone(),
            publish: msg.publish.clone(),
            default_timeout: self.default_ui_timeout,
        };
        Box::pin(async move {
            let claimed = claim.await.unwrap_or(ClaimOutcome::InFlight);
            if !claimed.is_claimed() {
                tracing::warn!(chat_id = %msg.tool_ctx.chat_id, turn = %msg.tool_ctx.turn_idempotency_key, ?claimed, "duplicate turn: auto tool skipped");
                return AutoToolOutcome::Duplicate(claimed);
            }
            let Some(binding) = binding else {
                tracing::warn!(chat_id = %msg.tool_ctx.chat_id, agent = %msg.tool_ctx.agent_name, "no auto-tool binding");
                parts.dedup.do_send(CompleteKey::new(key));
                return AutoToolOutcome::NoBinding;
            };
            if let Err(errors) = binding.model.validate(&msg.structured_data) {
                parts.dedup.do_send(CompleteKey::new(key));
                return AutoToolOutcome::Invalid(errors.join("; "));
            }
            tessera_telemetry::record_auto_tool(&msg.span, &binding.tool_name);
            run_ui_tool(binding, msg.tool_ctx, &msg.structured_data, parts)
                .instrument(msg.span)
                .await
        })
    }
}

/// Where a UI wait registers, reports and completes.
pub struct UiWaitParts {
    pub correlator: Addr<UiCorrelator>,
    pub dedup: Addr<DedupCache>,
    /// The chat's session: `chat.tool_call` / `chat.tool_response` go here.
    pub publish: Recipient<Publish>,
    /// The wait limit of a UI tool without a `timeout_s` of its own.
    pub default_timeout: Option<Duration>,
}

/// Announces the auto tool, runs its pre-step, and waits for the browser.
async fn run_ui_tool(
    binding: Arc<AutoToolBinding>,
    ctx: ToolContext,
    structured_data: &Value,
    parts: UiWaitParts,
) -> AutoToolOutcome {
    let kwargs = binding.build_kwargs(structured_data);
    let info = tool_info(&binding, &ctx);
    parts
        .publish
        .do_send(Publish(tool_call_event(&info, &kwargs)));
    match prestep(&binding, &kwargs, &ctx).await {
        Err(failure) => {
            let failed = UiResult {
                handler_ok: false,
                result: failure,
                ui_response: None,
                secrets: Vec::new(),
                ended_ui_call: None,
            };
            finish(&binding, &ctx, failed, &parts)
        }
        Ok(extra) => {
            let (payload, _) = tessera_tools::build_ui_payload(
                &kwargs,
                extra.as_ref(),
                &ctx.workflow_name,
                &binding.display,
            );
            let timeout = binding.wait_limit(parts.default_timeout);
            let call = PendingUiCall {
                corr: UiCorrelator::new_corr(),
                tool_name: binding.tool_name.to_string(),
                component_type: binding.component.clone(),
                display: binding.display.clone(),
                agent: ctx.agent_name.to_string(),
                payload,
                timeout_s: timeout.map(|t| t.as_secs_f64()),
            };
            wait_for_ui(binding, ctx, call, true, parts).await
        }
    }
}

/// Picks up, after a restart, a UI call whose turn key was claimed before the process died:
/// the same wait as a fresh call's (`wait_for_ui`), without announcing the call again
/// (its `chat.tool_call` is in the chat's log). Resolves the binding of `tool_ctx`'s agent.
pub fn resume_ui_wait(
    workflow: &CompiledWorkflow,
    ctx: ToolContext,
    call: PendingUiCall,
    parts: UiWaitParts,
) -> futures::future::BoxFuture<'static, AutoToolOutcome> {
    let Some(binding) = resolve_binding(workflow, &ctx.agent_name).map(Arc::new) else {
        parts
            .dedup
            .do_send(CompleteKey::new(ToolKey::of_turn(&ctx)));
        return Box::pin(std::future::ready(AutoToolOutcome::NoBinding));
    };
    Box::pin(wait_for_ui(binding, ctx, call, false, parts))
}

/// The one UI wait of an auto tool, fresh or resumed: registers `call` with the correlator
/// before returning its future (so any later listing of the chat's pending calls sees it),
/// then, when the wait ends, turns it into the agent's result (secrets split off), announces
/// `chat.tool_response` and completes the turn key. `announce` publishes the call's
/// `chat.tool_call` (false when resuming one already in the log).
fn wait_for_ui(
    binding: Arc<AutoToolBinding>,
    ctx: ToolContext,
    call: PendingUiCall,
    announce: bool,
    parts: UiWaitParts,
) -> impl Future<Output = AutoToolOutcome> + 'static {
    let corr = call.corr.clone();
    let agent_message_id = call.payload["agent_message_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let span = tessera_telemetry::ui_wait_span(&binding.tool_name, &corr, &ctx.chat_id);
    let wait = parts.correlator.send(AwaitUiResponse {
        chat_id: ctx.chat_id.clone(),
        call,
        timeout: binding.wait_limit(parts.default_timeout),
        publish: parts.publish.clone(),
        announce,
    });
    async move {
        let outcome = wait
            .instrument(span.clone())
            .await
            .unwrap_or(UiOutcome::Cancelled);
        span.record("tessera.ui.outcome", outcome.kind());
        drop(span);
        if outcome == UiOutcome::Released {
            return AutoToolOutcome::Released;
        }
        let ended = interpret_ui_outcome(&binding, corr, &agent_message_id, outcome);
        finish(&binding, &ctx, ended, &parts)
    }
}

/// How a UI tool ended, as the agent sees it.
struct UiResult {
    /// The tool's handler completed (a pre-step failure is the only `false`).
    handler_ok: bool,
    /// What the agent reads (secrets removed).
    result: Value,
    /// The browser's answer (secrets removed), for `ui_response` triggers.
    ui_response: Option<Value>,
    /// Secrets split off the answer, for the chat's vault only.
    secrets: Vec<(String, String)>,
    /// The corr of the UI call that ended, when one was issued.
    ended_ui_call: Option<String>,
}

/// Turns how a UI wait ended into the agent's result.
fn interpret_ui_outcome(
    binding: &AutoToolBinding,
    corr: String,
    agent_message_id: &str,
    outcome: UiOutcome,
) -> UiResult {
    let (result, ui_response, secrets) = match outcome {
        UiOutcome::Answered(response) => {
            let clean = tessera_tools::sanitize_ui_response(response, &binding.secret_fields);
            let result = agent_result(&clean.for_agent, &corr, agent_message_id);
            (result, Some(clean.for_agent), clean.secrets)
        }
        UiOutcome::TimedOut(after) => (
            tessera_tools::ui_timeout_result(after.as_secs_f64()),
            None,
            Vec::new(),
        ),
        // Released never gets here (`wait_for_ui` returns first); read as a cancel if it did.
        UiOutcome::Cancelled | UiOutcome::Released => {
            (tessera_tools::ui_cancelled_result(), None, Vec::new())
        }
        UiOutcome::Disconnected => (
            ToolErrorResult::new(
                Some("connection_lost"),
                "Connection lost during the UI interaction.",
            )
            .to_value(),
            None,
            Vec::new(),
        ),
    };
    UiResult {
        handler_ok: true,
        result,
        ui_response,
        secrets,
        ended_ui_call: Some(corr),
    }
}

/// The end of every auto-tool run: `chat.tool_response`, the turn key completed, the outcome.
fn finish(
    binding: &AutoToolBinding,
    ctx: &ToolContext,
    ended: UiResult,
    parts: &UiWaitParts,
) -> AutoToolOutcome {
    let info = tool_info(binding, ctx);
    let result = Arc::new(ended.result);
    parts.publish.do_send(Publish(tool_response_event(
        &info,
        ended.handler_ok,
        Arc::clone(&result),
        ended.ended_ui_call,
    )));
    parts.dedup.do_send(CompleteKey::new(ToolKey::of_turn(ctx)));
    AutoToolOutcome::Completed {
        tool_name: binding.tool_name.clone(),
        result,
        ui_response: ended.ui_response,
        secrets: ended.secrets,
    }
}

/// The auto tool's `chat.tool_call` / `chat.tool_response` identity.
fn tool_info<'a>(binding: &'a AutoToolBinding, ctx: &'a ToolContext) -> ToolCallInfo<'a> {
    ToolCallInfo {
        agent: &ctx.agent_name,
        tool_name: &binding.tool_name,
        corr: &ctx.turn_idempotency_key,
        component_type: Some(&binding.component),
        workflow_name: &ctx.workflow_name,
        interaction: InteractionType::AutoTool,
    }
}

/// Runs the UI tool's pre-step (e.g. building the download bundle), if it has one.
async fn prestep(
    binding: &AutoToolBinding,
    kwargs: &Map<String, Value>,
    ctx: &ToolContext,
) -> Result<Option<Value>, Value> {
    let Some(tool) = &binding.prestep else {
        return Ok(None);
    };
    match tool.invoke(kwargs.clone(), ctx.clone()).await {
        Ok(value) if tessera_tools::is_success(true, &value) => Ok(Some(value)),
        Ok(value) => Err(value),
        Err(err) => Err(err.to_result()),
    }
}

/// The `use_ui_tool` return shape the agent reads.
fn agent_result(response: &Value, corr: &str, agent_message_id: &str) -> Value {
    let mut result = match response {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    result.insert("ui_event_id".into(), Value::String(corr.to_owned()));
    result.insert(
        "agent_message_id".into(),
        Value::String(agent_message_id.to_owned()),
    );
    Value::Object(result)
}
