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
use serde_json::{Map, Value, json};
use tessera_manifest::{CompiledModel, DisplayMode, ToolType};
use tessera_protocol::PendingUiCall;
use tessera_tools::{Tool, ToolContext};

use crate::correlator::{AwaitUiResponse, UiCorrelator, UiOutcome};
use crate::dedup::{ClaimKey, ClaimOutcome, CompleteKey, DedupCache};
use crate::events::{InteractionType, ToolCallInfo, tool_call_event, tool_response_event};
use crate::plan::CompiledWorkflow;
use crate::session::Publish;

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
}

/// How an auto-tool invocation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AutoToolOutcome {
    /// The tool ran; `result` is what the agent reads (secrets removed).
    Completed {
        tool_name: Arc<str>,
        success: bool,
        result: Value,
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
}

/// The per-arbiter auto-tool actor.
pub struct AutoToolHandler {
    dedup: Addr<DedupCache>,
    correlator: Addr<UiCorrelator>,
    default_ui_timeout: Option<Duration>,
    /// workflow name → agent → binding (`None` cached too, so misses stay cheap).
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
            .entry(workflow.workflow.name.clone())
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
        let key = format!(
            "{}:{}",
            msg.tool_ctx.chat_id, msg.tool_ctx.turn_idempotency_key
        );
        // The claim is enqueued before this handler returns: a duplicate handled next is
        // ordered behind it in the DedupCache mailbox and cannot also win.
        let claim = self.dedup.send(ClaimKey(key.clone()));
        let binding = self.binding(&msg.workflow, &msg.tool_ctx.agent_name);
        let dedup = self.dedup.clone();
        let correlator = self.correlator.clone();
        let default_timeout = self.default_ui_timeout;
        Box::pin(async move {
            let claimed = claim.await.unwrap_or(ClaimOutcome::InFlight);
            if !claimed.is_claimed() {
                tracing::warn!(chat_id = %msg.tool_ctx.chat_id, turn = %msg.tool_ctx.turn_idempotency_key, ?claimed, "duplicate turn: auto tool skipped");
                return AutoToolOutcome::Duplicate(claimed);
            }
            let Some(binding) = binding else {
                tracing::warn!(chat_id = %msg.tool_ctx.chat_id, agent = %msg.tool_ctx.agent_name, "no auto-tool binding");
                dedup.do_send(CompleteKey(key));
                return AutoToolOutcome::NoBinding;
            };
            if let Err(errors) = binding.model.validate(&msg.structured_data) {
                dedup.do_send(CompleteKey(key));
                return AutoToolOutcome::Invalid(errors.join("; "));
            }
            let outcome = run_ui_tool(
                &binding,
                &msg,
                &correlator,
                binding.timeout.or(default_timeout),
            )
            .await;
            dedup.do_send(CompleteKey(key));
            outcome
        })
    }
}

async fn run_ui_tool(
    binding: &AutoToolBinding,
    msg: &InvokeAutoTool,
    correlator: &Addr<UiCorrelator>,
    timeout: Option<Duration>,
) -> AutoToolOutcome {
    let ctx = &msg.tool_ctx;
    let kwargs = binding.build_kwargs(&msg.structured_data);
    let info = ToolCallInfo {
        agent: &ctx.agent_name,
        tool_name: &binding.tool_name,
        corr: &ctx.turn_idempotency_key,
        component_type: Some(&binding.component),
        workflow_name: &ctx.workflow_name,
        interaction: InteractionType::AutoTool,
    };
    msg.publish
        .do_send(Publish(tool_call_event(&info, &kwargs)));

    let (handler_ok, result, ui_response, secrets) = match prestep(binding, &kwargs, ctx).await {
        Err(failure) => (false, failure, None, Vec::new()),
        Ok(extra) => {
            let (payload, agent_message_id) = tessera_tools::build_ui_payload(
                &kwargs,
                extra.as_ref(),
                &ctx.workflow_name,
                &binding.display,
            );
            let call = PendingUiCall {
                corr: UiCorrelator::new_corr(),
                tool_name: binding.tool_name.to_string(),
                component_type: binding.component.clone(),
                display: binding.display.clone(),
                agent: ctx.agent_name.to_string(),
                payload,
                timeout_s: timeout.map(|t| t.as_secs_f64()),
            };
            wait_for_browser(
                binding,
                ctx,
                call,
                &agent_message_id,
                correlator,
                timeout,
                &msg.publish,
                true,
            )
            .await
        }
    };
    msg.publish
        .do_send(Publish(tool_response_event(&info, handler_ok, &result)));
    AutoToolOutcome::Completed {
        tool_name: binding.tool_name.clone(),
        success: tessera_tools::is_success(handler_ok, &result),
        result,
        ui_response,
        secrets,
    }
}

/// Registers the UI call with the correlator, waits for its end, and turns the browser's answer
/// into the agent's result (secrets split off). `announce` is false when resuming a call whose
/// `chat.tool_call` is already in the chat's log.
#[allow(clippy::too_many_arguments)]
async fn wait_for_browser(
    binding: &AutoToolBinding,
    ctx: &ToolContext,
    call: PendingUiCall,
    agent_message_id: &str,
    correlator: &Addr<UiCorrelator>,
    timeout: Option<Duration>,
    publish: &Recipient<Publish>,
    announce: bool,
) -> (bool, Value, Option<Value>, Vec<(String, String)>) {
    let corr = call.corr.clone();
    let wait = correlator.send(AwaitUiResponse {
        chat_id: ctx.chat_id.clone(),
        call,
        timeout,
        publish: publish.clone(),
        announce,
    });
    let outcome = wait.await.unwrap_or(UiOutcome::Cancelled);
    interpret_ui_outcome(binding, &corr, agent_message_id, outcome)
}

/// Turns how a UI wait ended into the agent's result: (handler ok, result, sanitized answer,
/// secrets split off the answer).
fn interpret_ui_outcome(
    binding: &AutoToolBinding,
    corr: &str,
    agent_message_id: &str,
    outcome: UiOutcome,
) -> (bool, Value, Option<Value>, Vec<(String, String)>) {
    match outcome {
        UiOutcome::Answered(response) => {
            let clean = tessera_tools::sanitize_ui_response(response, &binding.secret_fields);
            let result = agent_result(&clean.for_agent, corr, agent_message_id);
            (true, result, Some(clean.for_agent), clean.secrets)
        }
        UiOutcome::TimedOut(after) => (
            true,
            tessera_tools::ui_timeout_result(after.as_secs_f64()),
            None,
            Vec::new(),
        ),
        UiOutcome::Cancelled => (true, tessera_tools::ui_cancelled_result(), None, Vec::new()),
        UiOutcome::Disconnected => (
            true,
            json!({"status": "error", "code": "connection_lost", "message": "Connection lost during the UI interaction."}),
            None,
            Vec::new(),
        ),
    }
}

/// The UI call announced by a `chat.tool_call` event's data (UI form).
pub fn pending_call_from_event(data: &Value) -> Result<PendingUiCall, String> {
    let text = |key: &str| {
        data.get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("missing {key}"))
    };
    Ok(PendingUiCall {
        corr: text("corr")?,
        tool_name: text("tool_name")?,
        component_type: text("component_type")?,
        display: text("display")?,
        agent: text("agent")?,
        payload: data.get("payload").cloned().unwrap_or(Value::Null),
        timeout_s: data.get("timeout_s").and_then(Value::as_f64),
    })
}

/// After a restart: finish a UI call whose turn key was claimed before the crash and whose
/// wait the session re-registered with the correlator (`outcome` is how that wait ended).
#[derive(Message)]
#[rtype(result = "AutoToolOutcome")]
pub struct FinishUiWait {
    pub workflow: Arc<CompiledWorkflow>,
    pub tool_ctx: ToolContext,
    pub call: PendingUiCall,
    pub outcome: UiOutcome,
    pub publish: Recipient<Publish>,
}

impl Handler<FinishUiWait> for AutoToolHandler {
    type Result = MessageResult<FinishUiWait>;

    fn handle(&mut self, msg: FinishUiWait, _ctx: &mut Self::Context) -> Self::Result {
        let key = format!(
            "{}:{}",
            msg.tool_ctx.chat_id, msg.tool_ctx.turn_idempotency_key
        );
        let Some(binding) = self.binding(&msg.workflow, &msg.tool_ctx.agent_name) else {
            self.dedup.do_send(CompleteKey(key));
            return MessageResult(AutoToolOutcome::NoBinding);
        };
        let info = ToolCallInfo {
            agent: &msg.tool_ctx.agent_name,
            tool_name: &binding.tool_name,
            corr: &msg.tool_ctx.turn_idempotency_key,
            component_type: Some(&binding.component),
            workflow_name: &msg.tool_ctx.workflow_name,
            interaction: InteractionType::AutoTool,
        };
        let agent_message_id = msg.call.payload["agent_message_id"]
            .as_str()
            .unwrap_or_default();
        let (handler_ok, result, ui_response, secrets) =
            interpret_ui_outcome(&binding, &msg.call.corr, agent_message_id, msg.outcome);
        msg.publish
            .do_send(Publish(tool_response_event(&info, handler_ok, &result)));
        self.dedup.do_send(CompleteKey(key));
        MessageResult(AutoToolOutcome::Completed {
            tool_name: binding.tool_name.clone(),
            success: tessera_tools::is_success(handler_ok, &result),
            result,
            ui_response,
            secrets,
        })
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
        Err(err) => Err(json!({"status": "error", "code": err.code(), "message": err.to_string()})),
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
