//! Logs, and OpenTelemetry traces over OTLP/HTTP (protobuf) when the standard `OTEL_*`
//! variables ask for them. Off by default. The spans themselves are made by
//! `tessera-telemetry` (one `tracing` target); this module installs the exporting layer for
//! that target, takes the W3C trace context off incoming requests, and flushes on shutdown.
//!
//! Export is on when `OTEL_TRACES_EXPORTER=otlp`, or when `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set and `OTEL_TRACES_EXPORTER` is not `none`;
//! `OTEL_SDK_DISABLED=true` turns it off. The exporter and SDK read the rest themselves
//! (`OTEL_EXPORTER_OTLP_*` endpoint, headers, timeout, compression; `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`; `OTEL_TRACES_SAMPLER[_ARG]`; `OTEL_BSP_*`).

use actix::Addr;
use actix::MailboxError;
use actix_web::HttpRequest;
use anyhow::{Context as _, bail};
use futures::future::Either;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tessera_engine::EngineError;
use tessera_engine::session::{ChatSession, TracedInput, UserInput};
use tessera_telemetry::RemoteParent;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The service name when `OTEL_SERVICE_NAME` does not give one.
const DEFAULT_SERVICE_NAME: &str = "tessera";

/// The GenAI conventions' opt-in for message content on spans.
const CAPTURE_CONTENT: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

/// The only OTLP protocol built in.
const HTTP_PROTOBUF: &str = "http/protobuf";

/// Whether the environment asks for trace export. An unsupported exporter or protocol is an
/// error (a silent fallback would lose the operator's traces without a word).
pub fn export_requested(env: impl Fn(&str) -> Option<String>) -> anyhow::Result<bool> {
    let set = |key: &str| {
        env(key)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    let exporters = set("OTEL_TRACES_EXPORTER");
    let on = match exporters.as_deref() {
        Some(list) => {
            let mut otlp = false;
            for exporter in list.split(',').map(str::trim) {
                match exporter {
                    "otlp" => otlp = true,
                    "none" => {}
                    other => {
                        bail!("OTEL_TRACES_EXPORTER={other} is not supported (use otlp or none)")
                    }
                }
            }
            otlp
        }
        None => {
            set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
                || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        }
    };
    if on {
        for key in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = set(key)
                && protocol != HTTP_PROTOBUF
            {
                bail!("{key}={protocol} is not supported (use {HTTP_PROTOBUF})");
            }
        }
    }
    Ok(on)
}

/// The installed subscriber; [`Telemetry::shutdown`] flushes the spans still queued.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still queued (bounded by the exporter's timeout) and stops export.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            eprintln!("tessera: flushing traces failed: {e}");
        }
    }
}

/// Installs the global subscriber: the log layer (`RUST_LOG`, text or JSON, on stderr) and,
/// when [`export_requested`], the OTLP layer for `tessera-telemetry`'s spans. Call before any
/// async runtime starts (the exporter's HTTP client is a blocking one, on its own thread).
pub fn init(json_logs: bool) -> anyhow::Result<Telemetry> {
    let env_filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,actix_server=warn"))
        // Spans for export are not log lines, whatever RUST_LOG says.
        .add_directive(
            format!("{}=off", tessera_telemetry::TARGET)
                .parse()
                .context("the telemetry target directive")?,
        );
    let provider = if export_requested(|k| std::env::var(k).ok())? {
        Some(tracer_provider()?)
    } else {
        None
    };
    let installed = match &provider {
        // The log filter stays global, as without OpenTelemetry: the GenAI spans' target is
        // off, so their callsites are disabled (no cost on the hot path).
        None => tracing_subscriber::registry()
            .with(env_filter)
            .with(log_layer(json_logs))
            .try_init(),
        Some(provider) => {
            let traces = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("tessera"))
                // Only the GenAI spans: no log event becomes a span event.
                .with_filter(
                    Targets::new().with_target(tessera_telemetry::TARGET, LevelFilter::INFO),
                );
            tracing_subscriber::registry()
                .with(log_layer(json_logs).with_filter(env_filter))
                .with(traces)
                .try_init()
        }
    };
    installed.context("cannot install the log subscriber")?;
    if provider.is_some() {
        tessera_telemetry::set_exporting();
        tracing::info!("OpenTelemetry trace export is on (OTLP over HTTP, protobuf)");
        if std::env::var(CAPTURE_CONTENT).is_ok_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            tessera_telemetry::set_capture_content();
            tracing::warn!(
                "{CAPTURE_CONTENT}=true: spans carry message content (secrets redacted); treat the trace backend as holding user data"
            );
        }
    }
    Ok(Telemetry { provider })
}

/// Log lines on stderr, one human-readable line or one JSON object each.
fn log_layer<S>(json: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if json {
        logs.json().boxed()
    } else {
        logs.boxed()
    }
}

fn tracer_provider() -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .context("cannot build the OTLP span exporter")?;
    let resource = match std::env::var("OTEL_SERVICE_NAME") {
        Ok(name) if !name.trim().is_empty() => Resource::builder().build(),
        _ => Resource::builder()
            .with_service_name(DEFAULT_SERVICE_NAME)
            .build(),
    };
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// The caller's W3C trace context (`traceparent`, `tracestate`), when traces are exported.
pub fn remote_parent(req: &HttpRequest) -> Option<RemoteParent> {
    if !tessera_telemetry::exporting() {
        return None;
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
    };
    RemoteParent::from_headers(
        header(tessera_telemetry::TRACEPARENT),
        header(tessera_telemetry::TRACESTATE),
    )
}

/// Sends `input` to the chat, as a child of `parent`'s trace when there is one.
pub fn send_input(
    chat: &Addr<ChatSession>,
    input: UserInput,
    parent: Option<RemoteParent>,
) -> impl Future<Output = Result<Result<(), EngineError>, MailboxError>> + 'static {
    match parent {
        Some(parent) => Either::Left(chat.send(TracedInput { input, parent })),
        None => Either::Right(chat.send(input)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requested(vars: &[(&str, &str)]) -> anyhow::Result<bool> {
        export_requested(|key| {
            vars.iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn export_is_off_unless_an_otel_variable_asks_for_it() {
        assert!(!requested(&[]).unwrap_or(true));
        assert!(!requested(&[("OTEL_SERVICE_NAME", "x")]).unwrap_or(true));
        assert!(requested(&[("OTEL_TRACES_EXPORTER", "otlp")]).unwrap_or(false));
        assert!(
            requested(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")]).unwrap_or(false)
        );
        assert!(
            requested(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c/v1/traces")])
                .unwrap_or(false)
        );
        assert!(
            !requested(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_TRACES_EXPORTER", "none"),
            ])
            .unwrap_or(true)
        );
        assert!(
            !requested(&[
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_SDK_DISABLED", "true"),
            ])
            .unwrap_or(true)
        );
    }

    #[test]
    fn unsupported_exporters_and_protocols_are_refused() {
        assert!(requested(&[("OTEL_TRACES_EXPORTER", "zipkin")]).is_err());
        assert!(
            requested(&[
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ])
            .is_err()
        );
        assert!(
            requested(&[
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ])
            .unwrap_or(false)
        );
    }
}
