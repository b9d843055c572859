//! The server: loads the workflows, picks the model (the real endpoint when
//! `OPENAI_API_KEY`/`OPENAI_BASE_URL` are set, otherwise the offline scripted demo), starts the
//! engine and the HTTP/WebSocket server on a listener, and shuts down gracefully when told to
//! (the binary tells it on SIGTERM / Ctrl-C).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::prelude::*;
use actix_web::{App, HttpServer, web};
use anyhow::Context as _;
use serde_json::{Value, json};
use tessera_engine::mcp::McpCatalog;
use tessera_engine::session::ChatIdentity;
use tessera_engine::{Engine, EngineConfig, EngineHooks};
use tessera_llm::ChatModel;
use tessera_llm::openai::{OpenAiClient, OpenAiConfig};
use tessera_manifest::Workflow;
use tessera_protocol::ServerEvent;
use tessera_store::ChatStore;
use tessera_tools::{ArtifactStore, BuiltinRegistry, ToolServices};

use crate::auth::Authenticator;
use crate::config::{Limits, ServerConfig};
use crate::metrics::Metrics;
use crate::registry::ChatRegistry;
use crate::reload::{self, ModelSource};

/// Longest wait on shutdown for the chats to hand the store what they queued.
const STORE_QUEUED_WRITES_TIMEOUT: Duration = Duration::from_secs(10);

/// Shared state of every HTTP handler.
pub struct AppState {
    pub engine: Engine,
    pub registry: Addr<ChatRegistry>,
    pub auth: Authenticator,
    /// Tenant-wide message budget (WebSocket frames and REST inputs), local or global.
    pub tenant_budget: Arc<crate::limits::TenantBudget>,
    /// Per-caller REST input budget.
    pub rest_budget: crate::limits::RestInputBudget,
    /// Cap on each tenant's open chats, local or global.
    pub chat_quota: Arc<crate::limits::OpenChatQuota>,
    pub metrics: Arc<Metrics>,
    /// This node's cluster counters (cluster mode only), shown on `/metrics`.
    pub cluster_metrics: Option<Arc<tessera_cluster::ClusterMetrics>>,
    /// What `/readyz` checks (the store; NATS in cluster mode).
    pub readiness: crate::readiness::Readiness,
    pub limits: Arc<Limits>,
    pub artifacts: Arc<dyn ArtifactStore>,
    /// Every chat ever created, for listings that survive restarts.
    pub chats: Arc<dyn ChatStore>,
    /// `GET /workflows` body, built once.
    pub workflows: Arc<Vec<Value>>,
    pub shutting_down: Arc<AtomicBool>,
    /// Open sockets, closed with 1001 on shutdown.
    pub connections: Addr<crate::ws::ConnectionHub>,
    /// Where the workflows live; the web client loads their `ui/*.js` components from here.
    pub workflows_dir: std::path::PathBuf,
    /// Cluster mode (`cluster.nats_url`): this node's part of the service.
    pub cluster: Option<ClusterHandles>,
}

/// What a node of a cluster uses to own, find and reach chats (see ARCHITECTURE.md, "Several
/// nodes").
pub struct ClusterHandles {
    /// Starts, serves and gives up this node's chats (it holds the `LeaseManager`).
    pub node: Addr<crate::cluster::ClusterNode>,
    /// NATS: live events and forwarded commands of chats other nodes own.
    pub bus: tessera_cluster::ClusterBus,
    /// How long a forwarded command waits for a node to serve its chat (a takeover).
    pub patience: Duration,
    /// The same for a REST request, which rather answers 503 with `Retry-After` than keeps a
    /// client (or its load balancer) waiting for a lease to expire.
    pub rest_patience: Duration,
    /// A socket reaching this node for a chat another node owns asks for the chat
    /// (`cluster.hand_over_sockets`).
    pub hand_over_sockets: bool,
}

/// How long a forwarded command waits for its owner's answer over NATS.
const CLUSTER_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Orphaned chats a node takes over per scan at most.
const TAKEOVER_BATCH: i64 = 64;

/// Chooses where the chats' models come from: the configured endpoint, else the demo scripts.
fn model_source(config: &ServerConfig) -> anyhow::Result<ModelSource> {
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
    openai.delta_interval = Duration::from_millis(config.llm.delta_interval_ms);
    if endpoint_configured && !config.llm.demo {
        let client: Arc<dyn ChatModel> =
            Arc::new(OpenAiClient::new(openai).context("cannot build the OpenAI client")?);
        tracing::info!(
            model = client.label(),
            "using the OpenAI-compatible endpoint"
        );
        return Ok(ModelSource::Endpoint(client));
    }
    tracing::warn!(
        "no OPENAI_API_KEY / OPENAI_BASE_URL: chats use the offline scripted DEMO model"
    );
    Ok(ModelSource::Demo)
}

/// Loads every workflow in `dir`; refuses to start when any is invalid, listing every invalid
/// one with all its errors and the command that validates them.
fn load_workflows(dir: &Path) -> anyhow::Result<Vec<Workflow>> {
    let mut loaded = Vec::new();
    let mut invalid = Vec::new();
    for (name, result) in tessera_manifest::load_workflow_dir(dir)? {
        match result {
            Ok(workflow) => loaded.push(workflow),
            Err(errors) => invalid.push(format!("workflow {name} is invalid:\n{errors}")),
        }
    }
    if !invalid.is_empty() {
        anyhow::bail!(
            "{} of {} workflows in {} are invalid (check them with `{}`):\n{}",
            invalid.len(),
            invalid.len() + loaded.len(),
            dir.display(),
            crate::validate::validate_command(dir),
            invalid.join("\n")
        );
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
        "listed": workflow.listed,
    })
}

/// Connects to NATS: the bus of this node and the counters it keeps.
async fn connect_cluster_bus(
    url: &str,
    config: &ServerConfig,
) -> anyhow::Result<(
    tessera_cluster::ClusterBus,
    Arc<tessera_cluster::ClusterMetrics>,
)> {
    let metrics = Arc::new(tessera_cluster::ClusterMetrics::default());
    let bus = tessera_cluster::ClusterBus::connect(
        url,
        &config.cluster.node_id(),
        &config.cluster.subject_prefix,
        CLUSTER_REQUEST_TIMEOUT,
        metrics.clone(),
    )
    .await
    .with_context(|| {
        format!(
            "cannot connect to NATS at {}",
            crate::config::redact_url(url)
        )
    })?;
    Ok((bus, metrics))
}

/// Starts this node's `ClusterNode` with its `LeaseManager`.
async fn start_cluster_node(
    (bus, metrics): (
        tessera_cluster::ClusterBus,
        Arc<tessera_cluster::ClusterMetrics>,
    ),
    config: &ServerConfig,
    leases: Arc<dyn tessera_store::LeaseStore>,
    engine: Engine,
    registry: Addr<ChatRegistry>,
) -> anyhow::Result<ClusterHandles> {
    let node_id = config.cluster.node_id();
    let ttl = config.cluster.lease_ttl();
    let lease_config = tessera_cluster::LeaseManagerConfig {
        node_id: node_id.clone(),
        ttl,
        takeover_batch: TAKEOVER_BATCH,
    };
    let relay_bus = bus.clone();
    let node = crate::cluster::ClusterNode::create(move |ctx| {
        let manager = tessera_cluster::LeaseManager::new(
            leases,
            lease_config,
            ctx.address().recipient(),
            metrics,
        )
        .start();
        crate::cluster::ClusterNode::new(engine, relay_bus)
            .with_leases(manager)
            .with_registry(registry)
    });
    tracing::info!(node = %node_id, lease_ttl_s = ttl.as_secs(), "cluster mode: leases in PostgreSQL, routing over NATS");
    Ok(ClusterHandles {
        node,
        bus,
        // Lease expiry, the next orphan scan (a third of the TTL) and the restore.
        patience: ttl * 2 + Duration::from_secs(5),
        rest_patience: CLUSTER_REQUEST_TIMEOUT,
        hand_over_sockets: config.cluster.hand_over_sockets,
    })
}

/// Pending connections the listening socket queues (as actix-web's own `bind` does; the
/// operating system's default of 128 drops connections under a burst of clients).
const LISTEN_BACKLOG: i32 = 2048;

/// A listening socket on `addr` for [`run`] (port 0 picks a free port).
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// Serves chats on `listener` until `shutdown` resolves, then closes every socket (1001),
/// drains HTTP, commits what the chats queued and returns. `config.bind` is not used: the
/// listener is already bound (port 0 works). Must run inside an actix `System` (the engine's
/// actors live there); prints `tessera listening on http://{addr}` on stdout once it accepts
/// connections.
pub async fn run(
    listener: std::net::TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + 'static,
) -> anyhow::Result<()> {
    // A cluster node reaches NATS first: tickets, the tenant budget and the open-chat quota
    // are shared through it from the first request on.
    let cluster_link = match &config.cluster.nats_url {
        Some(url) => Some(connect_cluster_bus(url, &config).await?),
        None => None,
    };
    let cluster_limits = match &cluster_link {
        Some((bus, _)) => Some(crate::cluster_limits::cluster_limits(&config, bus).await?),
        None => None,
    };
    let limit_seams = crate::cluster_limits::LimitSeams::new(&config, cluster_limits.as_ref());
    let auth = limit_seams.tickets_for(Authenticator::new(config.tenants.clone(), &config.auth)?);
    if auth.dev_mode() {
        tracing::warn!("no tenants or JWT configured: DEV MODE, every request is trusted");
    }
    let vault_key = match config.secrets.key()? {
        Some(key) => key,
        None => {
            tracing::warn!(
                "no secrets.key_hex / TESSERA_SECRET_KEY: collected secrets are encrypted with a per-process key and do not survive a restart"
            );
            tessera_engine::secrets::VaultKey::random_bytes()
                .map_err(|e| anyhow::anyhow!("cannot make a vault key: {e}"))?
        }
    };
    let workflows = load_workflows(&config.workflows_dir)?;
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create the data dir {}", config.data_dir.display()))?;
    // Taken before anything is written to the data dir; held until `run` returns, i.e. for
    // the server's lifetime.
    let _data_lock = crate::data_lock::lock_data_dir(&config.data_dir)?;
    let stores = crate::stores::Stores::open(
        &config.store_location()?,
        config.limits.max_file_bytes_per_tenant,
    )
    .await?;
    // Each served version is pinned in the data dir and the store first (see `reload`), so
    // chats stored with it get it back after a restart, or on another node, even if the live
    // folder has changed.
    let versions = reload::PinnedVersions::new(config.data_dir.clone(), stores.workflow_versions());
    versions.sync().await?;
    let mut pinned = Vec::with_capacity(workflows.len());
    for workflow in &workflows {
        pinned.push(versions.pin(workflow).await?);
    }
    let workflows = pinned;
    let older = reload::older_versions(&config.data_dir, &workflows);
    let models = model_source(&config)?;
    let with_models = reload::with_models(&models, workflows);
    let summaries: Vec<Value> = with_models
        .iter()
        .map(|(w, m)| workflow_summary(w, m.is_demo()))
        .collect();
    let store = stores.chats();
    let artifacts = stores.artifacts();
    let lease_store = match (config.cluster.enabled(), stores.leases()) {
        (false, _) => None,
        (true, Some(leases)) => Some(leases),
        // Refused rather than ignored: nodes on separate SQLite files would each run the
        // same chats.
        (true, None) => anyhow::bail!(
            "cluster.nats_url / TESSERA_NATS_URL is set, but the store is SQLite: several nodes must share one PostgreSQL database (set store.url / TESSERA_STORE_URL to postgres://...)"
        ),
    };
    let services = ToolServices {
        tasks: stores.tasks(),
        artifacts: artifacts.clone(),
    };
    let builtins = BuiltinRegistry::with_defaults(services);
    let engine_config = EngineConfig {
        ui_timeout: config.limits.ui_timeout(),
        tool_timeout: Duration::from_secs_f64(config.limits.tool_timeout_s.max(0.1)),
        stream: config.llm.stream,
        model_call_deadline: Duration::from_secs_f64(config.llm.call_deadline_s),
        max_tokens: config.llm.max_tokens,
        arbiters: config.engine_threads,
        vault_key: Some(Arc::new(tessera_engine::secrets::VaultKey::new(vault_key))),
        // In a cluster too: a chat that leaves memory has its lease parked (no orphan scan
        // brings it back), and the next node a client reaches claims it.
        idle_evict: config.limits.idle_chat_evict(),
        ..EngineConfig::default()
    };
    let metrics = Arc::new(Metrics::default());
    let observed = metrics.clone();
    let (quota, quota_limit) = (
        limit_seams.chat_quota.clone(),
        config.limits.max_open_chats_per_tenant,
    );
    let hooks = EngineHooks {
        durable_dedup: None,
        observer: Some(Arc::new(move |chat: &ChatIdentity, event: &ServerEvent| {
            observed.observe(&chat.tenant, event);
            if crate::metrics::ends_chat(event) {
                quota.chat_ended(&chat.tenant, quota_limit);
            }
        })),
        store: Some(store.clone()),
        mcp: Some(
            McpCatalog::discover(
                McpCatalog::start_hub().map_err(|e| anyhow::anyhow!("{e}"))?,
                &with_models.iter().map(|(w, _)| w).collect::<Vec<_>>(),
                false,
            )
            .await,
        ),
    };
    let engine = Engine::start(with_models, &builtins, engine_config, hooks)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Older versions that stored chats may have started with, before those chats are rebuilt.
    // One at a time: a version that no longer compiles (say, its built-in tool is gone) is
    // skipped, and its chats run the current version.
    for (workflow, model) in reload::with_models(&models, older) {
        let (name, version) = (workflow.name.clone(), workflow.version.clone());
        match engine.install(vec![(workflow, model)], false).await {
            Ok(()) => {
                tracing::info!(workflow = %name, version = %version, "older workflow version loaded for stored chats")
            }
            Err(e) => {
                tracing::warn!(workflow = %name, version = %version, error = %e, "older workflow version does not compile; its chats run the current version")
            }
        }
    }
    if config.workflows_watch_s > 0.0 {
        actix_rt::spawn(reload::watch(
            engine.clone(),
            config.workflows_dir.clone(),
            versions.clone(),
            models.clone(),
            Duration::from_secs_f64(config.workflows_watch_s.max(0.05)),
        ));
    }
    #[cfg(unix)]
    actix_rt::spawn(reload::on_sighup(
        engine.clone(),
        config.workflows_dir.clone(),
        versions.clone(),
        models.clone(),
    ));
    let registry = ChatRegistry::new(engine.clone()).start();
    let cluster_metrics = cluster_link.as_ref().map(|(_, metrics)| metrics.clone());
    let readiness_bus = cluster_link.as_ref().map(|(bus, _)| bus.clone());
    let cluster = match (cluster_link, lease_store) {
        (Some(link), Some(leases)) => {
            Some(start_cluster_node(link, &config, leases, engine.clone(), registry.clone()).await?)
        }
        _ => None,
    };
    // In a cluster the open chats belong to whichever node holds their lease: the orphan scan
    // takes over those nobody holds, instead of every node rebuilding every chat.
    let restored = if cluster.is_some() {
        Vec::new()
    } else {
        engine
            .rehydrate()
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?
    };
    if !restored.is_empty() {
        tracing::info!(
            chats = restored.len(),
            "rehydrated open chats from the store"
        );
    }
    metrics.chats_open.fetch_add(
        i64::try_from(restored.len()).unwrap_or(0),
        Ordering::Relaxed,
    );
    for handle in restored {
        registry.do_send(crate::registry::RegisterChat(handle));
    }
    if let Some(max_age) = config.retention.max_age() {
        actix_rt::spawn(crate::lifecycle::retention_loop(
            store.clone(),
            registry.clone(),
            metrics.clone(),
            max_age,
            Duration::from_secs_f64(config.retention.sweep_interval_s.max(0.05)),
        ));
    }
    let shutting_down = Arc::new(AtomicBool::new(false));
    let connections = crate::ws::ConnectionHub::default().start();
    let hub = connections.clone();
    let chats = registry.clone();
    let state = web::Data::new(AppState {
        engine,
        registry,
        auth,
        tenant_budget: limit_seams.tenant_budget.clone(),
        rest_budget: crate::limits::RestInputBudget::new(config.limits.rest_inputs_per_minute),
        chat_quota: limit_seams.chat_quota.clone(),
        metrics,
        cluster_metrics,
        readiness: crate::readiness::Readiness::new(store.clone(), readiness_bus),
        limits: Arc::new(config.limits.clone()),
        artifacts,
        chats: store.clone(),
        workflows: Arc::new(summaries),
        shutting_down: shutting_down.clone(),
        connections,
        workflows_dir: config.workflows_dir.clone(),
        cluster,
    });
    let draining = state.cluster.as_ref().map(|c| c.node.clone());
    // One per core by default. On 2 cores one worker costs 3-10% less CPU per turn, but it
    // neither flattens the cost from 1,000 to 10,000 chats nor helps at model latency
    // (docs/performance-log.md, "Eighth session"), and a larger machine needs more. The `408`s
    // once blamed on one worker were the load generator's stall. It stays a setting.
    let workers = if config.http_workers == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        config.http_workers
    };
    let server = HttpServer::new(move || {
        // Runs on each worker thread: names it apart from the engine's (CPU splits by thread).
        tessera_engine::thread_name::name_current_thread(
            tessera_engine::thread_name::HTTP_WORKER_THREAD,
        );
        App::new()
            .app_data(state.clone())
            .app_data(web::JsonConfig::default().limit(256 * 1024))
            .configure(crate::rest::routes)
            .configure(crate::web_client::routes)
    })
    // Replies are small writes (an ack, then an event): without TCP_NODELAY the second one
    // waits ~40 ms for the client's delayed ACK.
    .on_connect(|conn, _ext| {
        if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
            let _ = tcp.set_nodelay(true);
        }
    })
    .workers(workers)
    .shutdown_timeout(10)
    .disable_signals()
    .listen(listener)
    .context("cannot listen on the given socket")?;
    for addr in server.addrs() {
        // The integration tests read this line to learn the port when binding port 0.
        println!("tessera listening on http://{addr}");
        tracing::info!(%addr, "listening");
    }
    let server = server.run();
    let handle = server.handle();
    let flag = shutting_down.clone();
    actix_rt::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: no new connections; closing sockets");
        flag.store(true, Ordering::Relaxed);
        if let Some(node) = draining {
            // Leases released now, so other nodes take the chats over on their next scan
            // instead of after the TTL.
            let released = node.send(crate::cluster::DrainNode).await.unwrap_or(0);
            tracing::info!(leases = released, "drained: leases released to other nodes");
        }
        let closed = hub.send(crate::ws::CloseAll).await.unwrap_or(0);
        tracing::info!(sockets = closed, "closed sockets with 1001 (going away)");
        handle.stop(true).await;
    });
    server.await.context("server failed")?;
    // Sockets are closed and HTTP has drained: let every chat hand the store what it queued,
    // then let the store commit it before the process exits (a write still queued at exit
    // would be lost as in a crash). Bounded: a store that cannot write must not hang the exit.
    let stored = tokio::time::timeout(
        STORE_QUEUED_WRITES_TIMEOUT,
        chats.send(crate::registry::StoreQueuedWrites),
    )
    .await;
    match stored {
        Ok(Ok(chats)) => tracing::info!(chats, "queued chat writes handed to the store"),
        _ => tracing::warn!("queued chat writes not all stored before shutdown"),
    }
    stores.close().await;
    tracing::info!("store closed");
    Ok(())
}
