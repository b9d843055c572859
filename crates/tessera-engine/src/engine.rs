//! The [`Engine`] handle: compiled workflows, one [`Shard`] of helper actors per arbiter, and
//! chat creation. Chats are spread round-robin over the arbiters (one per core); a chat's
//! runner, dedup cache, correlator and auto-tool handler live on the chat's own arbiter, so
//! every hop of a turn is a local mailbox send.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use actix::prelude::*;
use serde_json::{Map, Value};
use tessera_llm::ChatModel;
use tessera_manifest::{ToolImpl, Workflow};
use tessera_tools::BuiltinRegistry;

use crate::catalog::{CurrentVersions, InstallWorkflows, ResolveWorkflow, WorkflowCatalog};
use crate::mcp::McpCatalog;
use crate::persist::{ChatRows, RestoredChat};
use crate::plan::CompiledWorkflow;
use crate::session::{ChatIdentity, ChatSession};
use crate::shard::{EngineHooks, Shard};
use crate::{EngineConfig, EngineError};

/// What a new chat needs.
#[derive(Debug, Clone)]
pub struct NewChat {
    pub tenant: String,
    pub user: String,
    pub workflow: String,
    /// Initial values for declared context variables.
    pub context: Map<String, Value>,
    /// A chosen id (e.g. when rehydrating); a fresh one otherwise.
    pub chat_id: Option<String>,
}

/// A started chat.
#[derive(Clone)]
pub struct ChatHandle {
    pub identity: ChatIdentity,
    pub workflow: String,
    pub addr: Addr<ChatSession>,
    /// The arbiter the chat runs on. An actor that talks to the chat a lot (e.g. an
    /// in-process subscriber) can be started here so its mailbox sends stay on one thread.
    pub arbiter: ArbiterHandle,
}

struct EngineInner {
    /// Every version of every workflow (see [`WorkflowCatalog`]).
    catalog: Addr<WorkflowCatalog>,
    /// What [`Engine::install`] compiles new versions with.
    builtins: BuiltinRegistry,
    /// Client of HTTP tools, built when the first workflow with one is compiled.
    http: Option<reqwest::Client>,
    /// The MCP hub and the tools listed at start; [`Engine::install`] lists new servers.
    mcp: Option<McpCatalog>,
    shards: Vec<Arc<Shard>>,
    next: AtomicUsize,
    config: Arc<EngineConfig>,
    _arbiters: Vec<Arbiter>,
}

/// A cheap-to-clone handle on the running engine. Must be created inside an actix `System`.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

impl Engine {
    /// Compiles `workflows` (each with the model its chats use) and starts one shard per
    /// arbiter.
    pub fn start(
        workflows: Vec<(Workflow, Arc<dyn ChatModel>)>,
        builtins: &BuiltinRegistry,
        config: EngineConfig,
        hooks: EngineHooks,
    ) -> Result<Self, EngineError> {
        let count = if config.arbiters == 0 {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        } else {
            config.arbiters
        };
        // Each thread names itself for CPU splits by thread; they are named before chats run
        // (waited for below: an arbiter runs the closure at once, it has nothing queued yet).
        let (named, all_named) = std::sync::mpsc::channel::<()>();
        let arbiters: Vec<Arbiter> = (0..count)
            .map(|_| {
                let arbiter = Arbiter::new();
                let named = named.clone();
                arbiter.spawn_fn(move || {
                    crate::thread_name::name_current_thread(crate::thread_name::ENGINE_THREAD);
                    let _ = named.send(());
                });
                arbiter
            })
            .collect();
        drop(named);
        // Ends once every closure has run or been dropped with its arbiter.
        while all_named.recv().is_ok() {}
        let handles = arbiters.iter().map(Arbiter::handle).collect();
        Self::start_on(workflows, builtins, config, hooks, arbiters, handles)
    }

    /// Like [`Engine::start`], but every chat and helper actor runs on the calling thread's
    /// arbiter (`config.arbiters` is ignored). `tessera test` runs the engine this way inside a
    /// current-thread runtime whose clock is paused, so UI and tool timeouts pass in virtual
    /// time. Must be called inside an actix `System`.
    pub fn start_on_current_arbiter(
        workflows: Vec<(Workflow, Arc<dyn ChatModel>)>,
        builtins: &BuiltinRegistry,
        config: EngineConfig,
        hooks: EngineHooks,
    ) -> Result<Self, EngineError> {
        let handles = vec![Arbiter::current()];
        Self::start_on(workflows, builtins, config, hooks, Vec::new(), handles)
    }

    fn start_on(
        workflows: Vec<(Workflow, Arc<dyn ChatModel>)>,
        builtins: &BuiltinRegistry,
        config: EngineConfig,
        hooks: EngineHooks,
        arbiters: Vec<Arbiter>,
        handles: Vec<ArbiterHandle>,
    ) -> Result<Self, EngineError> {
        let http = http_client_for(&workflows, None)?;
        let mcp = hooks.mcp.clone();
        let compiled = compile_all(workflows, builtins, http.as_ref(), mcp.as_ref(), &config)?;
        let on = handles.first().cloned().unwrap_or_else(Arbiter::current);
        let catalog = WorkflowCatalog::start_in_arbiter(&on, move |_| {
            WorkflowCatalog::with_current(compiled)
        });
        let in_memory = Arc::new(AtomicUsize::new(0));
        let shards = handles
            .into_iter()
            .map(|a| {
                Arc::new(Shard {
                    chats_in_memory: in_memory.clone(),
                    ..Shard::start(a, &config, &hooks)
                })
            })
            .collect();
        Ok(Self {
            inner: Arc::new(EngineInner {
                catalog,
                builtins: builtins.clone(),
                http,
                mcp,
                shards,
                next: AtomicUsize::new(0),
                config: Arc::new(config),
                _arbiters: arbiters,
            }),
        })
    }

    /// The workflow a chat runs: `version` for a stored chat, else the current one.
    async fn workflow(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<CompiledWorkflow>, EngineError> {
        self.inner
            .catalog
            .send(ResolveWorkflow {
                name: name.to_owned(),
                version: version.map(str::to_owned),
            })
            .await
            .map_err(|_| EngineError::Unavailable)?
            .ok_or_else(|| EngineError::UnknownWorkflow(name.to_owned()))
    }

    /// Compiles `workflows` and adds them to the catalog; with `current`, new chats get them
    /// from now on while running chats keep the version they started with (hot reload). A
    /// workflow that does not compile is an error and nothing is installed.
    pub async fn install(
        &self,
        workflows: Vec<(Workflow, Arc<dyn ChatModel>)>,
        current: bool,
    ) -> Result<(), EngineError> {
        let http = http_client_for(&workflows, self.inner.http.as_ref())?;
        // A reload asks the servers again: a server that was down at start is offered once it
        // is back, and a changed tool list is picked up.
        let mcp = match &self.inner.mcp {
            Some(catalog) => {
                let refs: Vec<&Workflow> = workflows.iter().map(|(w, _)| w).collect();
                Some(McpCatalog::discover(catalog.hub.clone(), &refs, true).await)
            }
            None => None,
        };
        let compiled = compile_all(
            workflows,
            &self.inner.builtins,
            http.as_ref(),
            mcp.as_ref(),
            &self.inner.config,
        )?;
        self.inner
            .catalog
            .send(InstallWorkflows {
                workflows: compiled,
                current,
            })
            .await
            .map_err(|_| EngineError::Unavailable)
    }

    /// The current version of each workflow, by name.
    pub async fn current_versions(&self) -> BTreeMap<String, String> {
        self.inner
            .catalog
            .send(CurrentVersions)
            .await
            .unwrap_or_default()
    }

    fn next_shard(&self) -> Arc<Shard> {
        let index = self.inner.next.fetch_add(1, Ordering::Relaxed) % self.inner.shards.len();
        Arc::clone(&self.inner.shards[index])
    }

    /// The store's chat rows, when the engine has a store.
    fn rows(&self) -> Option<ChatRows> {
        self.inner
            .shards
            .first()
            .and_then(|s| s.store.clone())
            .map(ChatRows)
    }

    /// Starts a chat on the next arbiter. With a store, the chat's record is written first, so
    /// every later write of the chat has its row.
    pub async fn start_chat(&self, new: NewChat) -> Result<ChatHandle, EngineError> {
        self.start_fenced_chat(new, None).await
    }

    /// [`Engine::start_chat`] for a cluster node that holds the new chat's lease at `epoch`:
    /// every durable write of the chat carries it (fencing, see `tessera_store::LeaseStore`).
    pub async fn start_fenced_chat(
        &self,
        new: NewChat,
        epoch: Option<i64>,
    ) -> Result<ChatHandle, EngineError> {
        let wf = self.workflow(&new.workflow, None).await?;
        let shard = self.next_shard();
        let chat_id: Arc<str> = Arc::from(
            new.chat_id
                .unwrap_or_else(|| format!("chat_{}", uuid::Uuid::new_v4().simple())),
        );
        let identity = ChatIdentity {
            chat_id,
            tenant: Arc::from(new.tenant),
            user: Arc::from(new.user),
        };
        if let Some(rows) = shard.store.clone().map(ChatRows) {
            rows.create(&identity, &new.workflow, &wf.workflow.version)
                .await?;
        }
        let config = self.inner.config.clone();
        let (id, context) = (identity.clone(), new.context);
        let arbiter = shard.arbiter.clone();
        let addr = ChatSession::start_in_arbiter(&arbiter, move |_| {
            ChatSession::new(id, wf, shard, config, context).with_epoch(epoch)
        });
        Ok(ChatHandle {
            identity,
            workflow: new.workflow,
            addr,
            arbiter,
        })
    }

    /// Rebuilds one chat of `tenant`/`user` that is not in memory: a completed chat (its
    /// history stays readable without keeping every finished chat in memory) or an open chat
    /// that left memory while idle, which resumes its pending work exactly as
    /// [`Engine::rehydrate`] does after a restart (a pending UI call is waited for again under
    /// the same corr). `None` when there is no such chat or it is not theirs. The caller makes
    /// sure one chat is rebuilt once (the server's registry does).
    pub async fn restore_chat(
        &self,
        chat_id: &str,
        tenant: &str,
        user: &str,
    ) -> Result<Option<ChatHandle>, EngineError> {
        let Some(rows) = self.rows() else {
            return Ok(None);
        };
        let Some(chat) = rows.owned(chat_id, tenant, user).await? else {
            return Ok(None);
        };
        Ok(self.start_restored(chat, None).await)
    }

    /// Rebuilds one open chat from the store and resumes its pending work exactly as
    /// [`Engine::rehydrate`] does after a restart: the way a node takes over a chat whose owner
    /// died. Every durable write of the chat carries the lease `epoch` this node took it at.
    /// `None` when the chat does not exist, has completed, or has an unknown workflow.
    pub async fn take_over(
        &self,
        chat_id: &str,
        epoch: i64,
    ) -> Result<Option<ChatHandle>, EngineError> {
        let Some(rows) = self.rows() else {
            return Ok(None);
        };
        let Some(chat) = rows.open_chat(chat_id).await? else {
            return Ok(None);
        };
        Ok(self.start_restored(chat, Some(epoch)).await)
    }

    /// Starts the session of a chat loaded from the store, on the workflow version it started
    /// with; `None` for an unknown workflow.
    async fn start_restored(&self, chat: RestoredChat, epoch: Option<i64>) -> Option<ChatHandle> {
        let wf = self
            .workflow(&chat.workflow, Some(&chat.workflow_version))
            .await
            .ok()?;
        let shard = self.next_shard();
        let config = self.inner.config.clone();
        let (identity, workflow) = (chat.identity.clone(), chat.workflow.clone());
        let arbiter = shard.arbiter.clone();
        let addr = ChatSession::start_in_arbiter(&arbiter, move |_| {
            ChatSession::restore(wf, shard, config, chat).with_epoch(epoch)
        });
        Some(ChatHandle {
            identity,
            workflow,
            addr,
            arbiter,
        })
    }

    /// Rebuilds every chat the store holds that has not completed (after a restart or crash)
    /// and resumes its pending work: a pending UI call becomes answerable again, an
    /// interrupted turn re-runs under its own turn key. Chats of unknown workflows are skipped.
    pub async fn rehydrate(&self) -> Result<Vec<ChatHandle>, EngineError> {
        let Some(rows) = self.rows() else {
            return Ok(Vec::new());
        };
        let served = self.current_versions().await;
        let known = |chat_id: &str, workflow: &str| {
            let known = served.contains_key(workflow);
            if !known {
                tracing::warn!(chat_id = %chat_id, workflow = %workflow, "stored chat of an unknown workflow left alone");
            }
            known
        };
        let mut handles = Vec::new();
        for chat in rows.open_chats(known).await? {
            handles.extend(self.start_restored(chat, None).await);
        }
        Ok(handles)
    }

    /// How many chat sessions are in memory (completed chats, and open ones idle for
    /// `idle_evict`, leave and are rebuilt from the store on demand).
    pub fn chats_in_memory(&self) -> usize {
        self.inner
            .shards
            .first()
            .map_or(0, |s| s.chats_in_memory.load(Ordering::Relaxed))
    }

    /// The engine's configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }
}

/// The HTTP tools' client: `existing`, else a new one when some workflow has an HTTP tool.
/// Built lazily because it loads the TLS stack and the root certificates (about 2 MiB of
/// memory), which built-in tools never use.
fn http_client_for(
    workflows: &[(Workflow, Arc<dyn ChatModel>)],
    existing: Option<&reqwest::Client>,
) -> Result<Option<reqwest::Client>, EngineError> {
    if let Some(client) = existing {
        return Ok(Some(client.clone()));
    }
    let needs_http = workflows.iter().any(|(workflow, _)| {
        workflow
            .tools
            .iter()
            .any(|t| matches!(t.implementation, Some(ToolImpl::Http { .. })))
    });
    if !needs_http {
        return Ok(None);
    }
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .map(Some)
        .map_err(|e| EngineError::Workflow(format!("cannot build the HTTP client: {e}")))
}

fn compile_all(
    workflows: Vec<(Workflow, Arc<dyn ChatModel>)>,
    builtins: &BuiltinRegistry,
    http: Option<&reqwest::Client>,
    mcp: Option<&McpCatalog>,
    config: &EngineConfig,
) -> Result<Vec<Arc<CompiledWorkflow>>, EngineError> {
    workflows
        .into_iter()
        .map(|(workflow, model)| {
            CompiledWorkflow::compile_with_mcp(
                workflow,
                model,
                builtins,
                http,
                config.tool_timeout,
                mcp,
            )
            .map(Arc::new)
        })
        .collect()
}
