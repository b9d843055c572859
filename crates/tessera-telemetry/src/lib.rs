//! OpenTelemetry GenAI spans for a chat, and W3C trace context in and out.
//!
//! Every span here is a plain `tracing` span under the target [`TARGET`]; the server installs
//! a `tracing-opentelemetry` layer for that target only when OTLP export is configured
//! (`tessera-server/src/telemetry.rs`). WHY one target: when export is off no layer is
//! interested in it, so each span macro is one cached callsite check and yields a disabled
//! span: no allocation, no attribute formatting (`tracing` evaluates field values only for an
//! enabled span). The log layer filters the target out, so logs stay as they were.
//!
//! Names and attributes follow the OpenTelemetry GenAI semantic conventions:
//! `invoke_workflow {workflow}` ⊃ `invoke_agent {agent}` ⊃ `chat {model}` / `execute_tool {tool}`,
//! and `await_ui_response {tool}` for the wait on the browser. Message content goes on a span
//! only when the operator opted in ([`capturing_content`]), with the chat's secrets redacted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of every span meant for OpenTelemetry.
pub const TARGET: &str = "tessera::otel";

/// `chat {model}`: seconds from sending the request to the first streamed chunk.
pub const TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";

/// The W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C vendor trace state header.
pub const TRACESTATE: &str = "tracestate";

static EXPORTING: AtomicBool = AtomicBool::new(false);
static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Called once by the process that installed an exporting layer.
pub fn set_exporting() {
    EXPORTING.store(true, Ordering::Relaxed);
}

/// True when spans are exported (the trace context is worth extracting and injecting).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Called once when the operator opted in to message content on spans
/// (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`).
pub fn set_capture_content() {
    CAPTURE_CONTENT.store(true, Ordering::Relaxed);
}

/// True when spans are exported and may carry message content (opt-in; off by default).
pub fn capturing_content() -> bool {
    exporting() && CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// Puts content (`gen_ai.input.messages`, `gen_ai.output.messages`,
/// `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`) on `span`. Callers check
/// [`capturing_content`] first and pass text whose secrets are already redacted.
pub fn record_content(span: &Span, key: &'static str, text: String) {
    if !span.is_disabled() {
        span.set_attribute(key, text);
    }
}

/// A caller's trace context (from `traceparent` / `tracestate`), to become the parent of the
/// spans of the work it asked for. Carried in actor messages, never in a thread-local.
#[derive(Clone, Debug)]
pub struct RemoteParent(opentelemetry::Context);

impl RemoteParent {
    /// The context in `traceparent` (and `tracestate`), when exporting and the header is a
    /// valid W3C trace context.
    pub fn from_headers(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        if !exporting() {
            return None;
        }
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert(TRACEPARENT.to_owned(), traceparent?.to_owned());
        if let Some(state) = tracestate {
            carrier.insert(TRACESTATE.to_owned(), state.to_owned());
        }
        let cx = TraceContextPropagator::new().extract(&carrier);
        cx.span().span_context().is_valid().then_some(Self(cx))
    }

    /// Makes this the parent of `span` (a span not yet entered).
    pub fn adopt(&self, span: &Span) {
        // Fails only for a disabled span or one already started: nothing to parent then.
        let _ = span.set_parent(self.0.clone());
    }
}

/// `traceparent` (and `tracestate`) of the current span, for an outgoing HTTP request; empty
/// when not exporting or outside any exported span.
pub fn outgoing_headers() -> Vec<(&'static str, String)> {
    if !exporting() {
        return Vec::new();
    }
    let cx = Span::current().context();
    if !cx.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut carrier: HashMap<String, String> = HashMap::with_capacity(2);
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    [TRACEPARENT, TRACESTATE]
        .into_iter()
        .filter_map(|name| carrier.remove(name).map(|value| (name, value)))
        .filter(|(_, value)| !value.is_empty())
        .collect()
}

/// `invoke_workflow {workflow}`: one user input (or resumed run) until the chat waits for the
/// user again or ends; its parent is the caller's trace context when there is one.
pub fn workflow_span(workflow: &str, chat_id: &str, parent: Option<&RemoteParent>) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        parent: None,
        "invoke_workflow",
        otel.name = format!("invoke_workflow {workflow}"),
        gen_ai.operation.name = "invoke_workflow",
        gen_ai.workflow.name = workflow,
        gen_ai.conversation.id = chat_id,
    );
    if let Some(parent) = parent {
        parent.adopt(&span);
    }
    span
}

/// `invoke_agent {agent}`: one agent turn, under its workflow span.
pub fn agent_span(parent: &Span, agent: &str, chat_id: &str, turn: u32) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "invoke_agent",
        otel.name = format!("invoke_agent {agent}"),
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = agent,
        gen_ai.conversation.id = chat_id,
        tessera.turn = i64::from(turn),
    )
}

/// `chat {model}`: one model call (a client span); the response fields are recorded by
/// [`record_chat_response`] and, when streaming, [`TIME_TO_FIRST_CHUNK`] by the client.
pub fn chat_span(parent: &Span, provider: &str, model: &str, chat_id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "chat",
        otel.name = format!("chat {model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider,
        gen_ai.request.model = model,
        gen_ai.conversation.id = chat_id,
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        gen_ai.response.time_to_first_chunk = tracing::field::Empty,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// What a model call answered, on its `chat` span.
pub fn record_chat_response(
    span: &Span,
    response_model: &str,
    input_tokens: u64,
    output_tokens: u64,
    finish_reason: Option<&str>,
) {
    if span.is_disabled() {
        return;
    }
    span.record("gen_ai.response.model", response_model);
    // As i64: `tracing-opentelemetry` exports a u64 as a string.
    span.record("gen_ai.usage.input_tokens", as_int(input_tokens));
    span.record("gen_ai.usage.output_tokens", as_int(output_tokens));
    if let Some(reason) = finish_reason {
        // The convention's type is a string array; one model call has one choice here.
        span.set_attribute(
            "gen_ai.response.finish_reasons",
            opentelemetry::Value::Array(
                vec![opentelemetry::StringValue::from(reason.to_owned())].into(),
            ),
        );
    }
}

fn as_int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Marks `span` failed with `error_type` (a stable code, never a message with user data).
pub fn record_error(span: &Span, error_type: &str) {
    span.record("error.type", error_type);
    span.record("otel.status_code", "ERROR");
}

/// `execute_tool {tool}`: one agent tool call, under its agent span.
pub fn tool_span(parent: &Span, tool: &str, call_id: &str, chat_id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "execute_tool",
        otel.name = format!("execute_tool {tool}"),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = tool,
        gen_ai.tool.call.id = call_id,
        gen_ai.tool.type = "function",
        gen_ai.conversation.id = chat_id,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// `execute_tool {tool}` of a UI tool bound to an agent's structured output (an auto tool),
/// under the workflow span; the browser round trip is its child [`ui_wait_span`].
pub fn auto_tool_span(parent: &Span, agent: &str, chat_id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "execute_tool",
        otel.name = "execute_tool",
        gen_ai.operation.name = "execute_tool",
        gen_ai.agent.name = agent,
        gen_ai.tool.type = "extension",
        gen_ai.conversation.id = chat_id,
        gen_ai.tool.name = tracing::field::Empty,
    )
}

/// Names an [`auto_tool_span`] once its tool is known.
pub fn record_auto_tool(span: &Span, tool: &str) {
    if span.is_disabled() {
        return;
    }
    span.record("otel.name", format!("execute_tool {tool}"));
    span.record("gen_ai.tool.name", tool);
}

/// `await_ui_response {tool}`: the wait for the browser's answer to a UI tool, under the
/// current span (the auto tool's).
pub fn ui_wait_span(tool: &str, corr: &str, chat_id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "await_ui_response",
        otel.name = format!("await_ui_response {tool}"),
        gen_ai.tool.name = tool,
        gen_ai.tool.call.id = corr,
        gen_ai.conversation.id = chat_id,
        tessera.ui.outcome = tracing::field::Empty,
    )
}
