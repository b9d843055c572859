//! The spans are disabled (and nothing is propagated) while no layer exports them; with an
//! OpenTelemetry layer, a caller's `traceparent` becomes the workflow span's parent and an
//! outgoing request carries the current span's context.

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tessera_telemetry::{
    RemoteParent, TARGET, agent_span, chat_span, outgoing_headers, set_exporting, tool_span,
    workflow_span,
};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN_ID: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{CALLER_SPAN_ID}-01")
}

// One test: `set_exporting` is process-wide and one-way, so "off" must be checked first.
#[test]
fn spans_are_off_without_an_exporting_layer_and_carry_the_trace_with_one() {
    // The server's subscriber when export is off: every level on, the GenAI target off.
    let logs_only =
        tracing_subscriber::registry().with(EnvFilter::new(format!("trace,{TARGET}=off")));
    tracing::subscriber::with_default(logs_only, || {
        let workflow = workflow_span("Wf", "chat_1", None);
        let agent = agent_span(&workflow, "Agent", "chat_1", 1);
        let chat = chat_span(&agent, "openai", "gpt", "chat_1");
        let tool = tool_span(&agent, "lookup", "call_1", "chat_1");
        for span in [&workflow, &agent, &chat, &tool] {
            assert!(span.is_disabled());
        }
        assert!(tool.in_scope(outgoing_headers).is_empty());
        assert!(RemoteParent::from_headers(Some(&traceparent()), None).is_none());
    });

    let provider = SdkTracerProvider::builder().build();
    let exporting = tracing_subscriber::registry().with(
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("test"))
            .with_filter(Targets::new().with_target(TARGET, LevelFilter::INFO)),
    );
    set_exporting();
    tracing::subscriber::with_default(exporting, || {
        assert!(RemoteParent::from_headers(Some("00-not-a-trace-01"), None).is_none());
        assert!(RemoteParent::from_headers(None, Some("k=v")).is_none());
        let parent = RemoteParent::from_headers(Some(&traceparent()), Some("vendor=1"))
            .unwrap_or_else(|| panic!("a valid traceparent is a parent"));
        let workflow = workflow_span("Wf", "chat_1", Some(&parent));
        let agent = agent_span(&workflow, "Agent", "chat_1", 1);
        let tool = tool_span(&agent, "lookup", "call_1", "chat_1");
        assert!(!tool.is_disabled());

        let headers = tool.in_scope(outgoing_headers);
        let traceparent = headers
            .iter()
            .find(|(name, _)| *name == "traceparent")
            .map(|(_, value)| value.clone())
            .unwrap_or_else(|| panic!("no traceparent in {headers:?}"));
        let tool_context = tool.context();
        let tool_span_id = tool_context.span().span_context().span_id().to_string();
        assert_eq!(traceparent, format!("00-{TRACE_ID}-{tool_span_id}-01"));
        assert!(
            headers.contains(&("tracestate", "vendor=1".to_owned())),
            "{headers:?}"
        );
        // Outside any span there is nothing to propagate.
        assert!(outgoing_headers().is_empty());
    });
}
