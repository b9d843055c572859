//! `tessera serve`: loads the workflows, picks the model (the real endpoint when
//! `OPENAI_API_KEY`/`OPENAI_BASE_URL` are set, otherwise the offline scripted demo), starts the
//! engine and the HTTP/WebSocket server, and shuts down gracefully on SIGTERM / Ctrl-C.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::prelude::*;
use actix_web::{App, HttpServer, web};
use anyhow::Context as _;
use serde_json::{Value, json};
use tessera_engine::{Engine, EngineConfig, EngineHooks};
use tessera_llm::ChatModel;
use tessera_llm::openai::{OpenAiClient, OpenAiConfig};
use tessera_llm::scripted::ScriptedModel;
use tessera_manifest::Workflow;
use tessera_protocol::ServerEvent;
use tessera_tools::{
    ArtifactStore, BuiltinRegistry, InMemoryArtifactStore, InMemoryTaskStore, ToolServices,
};

use crate::auth::Authenticator;
use crate::config::{Limits, ServerConfig};
use crate::metrics::Metrics;
use crate::registry::ChatRegistry;

/// Shared state of every HTTP handler.
pub struct AppState {
    pub engine: Engine,
    pub registry: Addr<ChatRegistry>,
    pub auth: Authenticator,
    pub metrics: Arc<Metrics>,
    pub limits: Arc<Limits>,
    pub artifacts: Arc<dyn ArtifactStore>,
    /// `GET /workflows` body, built once.
    pub workflows: Arc<Vec<Value>>,
    pub shutting_down: Arc<AtomicBool>,
}

/// Chooses the model of each workflow.
fn models_for(
    config: &ServerConfig,
    workflows: Vec<Workflow>,
) -> anyhow::Result<Vec<(Workflow, Arc<dyn ChatModel>)>> {
    let mut openai = OpenAiConfig::from_env();
    let endpoint_configured =
        std::env::var_os("OPENAI_API_KEY").is_some() || config.llm.base_url.is_some();
    if let Some(url) = &config.llm.base_url {
        openai.base_url = url.clone();
    }
    if let Some(model) = &config.llm.model {
        openai.default_model = model.clone();
    }
    openai.request_timeout = Duration::from_secs_f64(config.llm.timeout_s.max(1.0));
    if endpoint_configured && !config.llm.demo {
        let client: Arc<dyn ChatModel> =
            Arc::new(OpenAiClient::new(openai).context("cannot build the OpenAI client")?);
        tracing::info!(
            model = client.label(),
            "using the OpenAI-compatible endpoint"
        );
        return Ok(workflows.into_iter().map(|w| (w, client.clone())).collect());
    }
    tracing::warn!(
        "no OPENAI_API_KEY / OPENAI_BASE_URL: chats use the offline scripted DEMO model"
    );
    let mut out = Vec::new();
    for workflow in workflows {
        let demo = workflow.dir.join("demo.json");
        match ScriptedModel::from_file(&demo) {
            Ok(model) => out.push((workflow, Arc::new(model) as Arc<dyn ChatModel>)),
            Err(e) => {
                tracing::warn!(workflow = %workflow.name, error = %e, "no usable demo.json; workflow not served in demo mode")
            }
        }
    }
    Ok(out)
}

fn load_workflows(dir: &Path) -> anyhow::Result<Vec<Workflow>> {
    let mut loaded = Vec::new();
    for (name, result) in tessera_manifest::load_workflows(dir) {
        match result {
            Ok(workflow) => loaded.push(workflow),
            Err(errors) => {
                anyhow::bail!("workflow {name} is invalid (run `tessera validate`):\n{errors}")
            }
        }
    }
    if loaded.is_empty() {
        anyhow::bail!("no workflows found in {}", dir.display());
    }
    Ok(loaded)
}

fn workflow_summary(workflow: &Workflow, demo: bool) -> Value {
    json!({
        "name": workflow.name,
        "description": workflow.description,
        "initial_agent": workflow.initial_agent,
        "startup_mode": format!("{:?}", workflow.startup_mode),
        "agents": workflow.agents.keys().collect::<Vec<_>>(),
        "ui_components": workflow.tools.iter().filter_map(|t| t.ui.as_ref().map(|u| u.component.clone())).collect::<Vec<_>>(),
        "demo": demo,
    })
}

/// Runs the server until SIGTERM or Ctrl-C.
pub fn run(config: ServerConfig) -> anyhow::Result<()> {
    let system = actix::System::new();
    system.block_on(serve(config))
}

async fn serve(config: ServerConfig) -> anyhow::Result<()> {
    let workflows = load_workflows(&config.workflows_dir)?;
    let with_models = models_for(&config, workflows)?;
    let summaries: Vec<Value> = with_models
        .iter()
        .map(|(w, m)| workflow_summary(w, m.is_demo()))
        .collect();
    let artifacts: Arc<dyn ArtifactStore> = Arc::new(InMemoryArtifactStore::default());
    let services = ToolServices {
        tasks: Arc::new(InMemoryTaskStore::default()),
        artifacts: artifacts.clone(),
    };
    let builtins = BuiltinRegistry::with_defaults(services);
    let engine_config = EngineConfig {
        ui_timeout: config.limits.ui_timeout(),
        tool_timeout: Duration::from_secs_f64(config.limits.tool_timeout_s.max(0.1)),
        stream: config.llm.stream,
        ..EngineConfig::default()
    };
    let metrics = Arc::new(Metrics::default());
    let observed = metrics.clone();
    let hooks = EngineHooks {
        durable_dedup: None,
        observer: Some(Arc::new(move |event: &ServerEvent| observed.observe(event))),
    };
    let engine = Engine::start(with_models, &builtins, engine_config, hooks)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let registry = ChatRegistry::default().start();
    let shutting_down = Arc::new(AtomicBool::new(false));
    let state = web::Data::new(AppState {
        engine,
        registry,
        auth: Authenticator::new(config.tenants.clone()),
        metrics,
        limits: Arc::new(config.limits.clone()),
        artifacts,
        workflows: Arc::new(summaries),
        shutting_down: shutting_down.clone(),
    });
    let workers = if config.http_workers == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        config.http_workers
    };
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(web::JsonConfig::default().limit(256 * 1024))
            .configure(crate::rest::routes)
            .configure(crate::web_client::routes)
    })
    .workers(workers)
    .shutdown_timeout(10)
    .disable_signals()
    .bind(config.bind)
    .with_context(|| format!("cannot listen on {}", config.bind))?;
    for addr in server.addrs() {
        // The integration tests read this line to learn the port when binding port 0.
        println!("tessera listening on http://{addr}");
        tracing::info!(%addr, "listening");
    }
    let server = server.run();
    let handle = server.handle();
    let flag = shutting_down.clone();
    actix_rt::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: no new connections; closing sockets");
        flag.store(true, Ordering::Relaxed);
        handle.stop(true).await;
    });
    server.await.context("server failed")?;
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
