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
    workflows: BTreeMap<String, Arc<CompiledWorkflow>>,
    shards: Vec<Shard>,
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
        // Built only when a workflow has an HTTP tool: the client loads the TLS stack and the
        // root certificates (about 2 MiB of memory), which built-in tools never use.
        let needs_http = workflows.iter().any(|(workflow, _)| {
            workflow
                .tools
                .iter()
                .any(|t| matches!(t.implementation, Some(ToolImpl::Http { .. })))
        });
        let http = if needs_http {
            let client = reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(5))
                .build()
                .map_err(|e| EngineError::Workflow(format!("cannot build the HTTP client: {e}")))?;
            Some(client)
        } else {
            None
        };
        let mut compiled = BTreeMap::new();
        for (workflow, model) in workflows {
            let name = workflow.name.clone();
            let wf = CompiledWorkflow::compile(
                workflow,
                model,
                builtins,
                http.as_ref(),
                config.tool_timeout,
            )?;
            compiled.insert(name, Arc::new(wf));
        }
        let count = if config.arbiters == 0 {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        } else {
            config.arbiters
        };
        let arbiters: Vec<Arbiter> = (0..count).map(|_| Arbiter::new()).collect();
        let shards = arbiters
            .iter()
            .map(|a| Shard::start(a.handle(), &config, &hooks))
            .collect();
        Ok(Self {
            inner: Arc::new(EngineInner {
                workflows: compiled,
                shards,
                next: AtomicUsize::new(0),
                config: Arc::new(config),
                _arbiters: arbiters,
            }),
        })
    }

    fn workflow(&self, name: &str) -> Result<Arc<CompiledWorkflow>, EngineError> {
        self.inner
            .workflows
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::UnknownWorkflow(name.to_owned()))
    }

    fn next_shard(&self) -> Shard {
        let index = self.inner.next.fetch_add(1, Ordering::Relaxed) % self.inner.shards.len();
        self.inner.shards[index].clone()
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
        let wf = self.workflow(&new.workflow)?;
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
            rows.create(&identity, &new.workflow).await?;
        }
        let config = self.inner.config.clone();
        let (id, context) = (identity.clone(), new.context);
        let arbiter = shard.arbiter.clone();
        let addr = ChatSession::start_in_arbiter(&arbiter, move |_| {
            ChatSession::new(id, wf, shard, config, context)
        });
        Ok(ChatHandle {
            identity,
            workflow: new.workflow,
            addr,
            arbiter,
        })
    }

    /// Rebuilds one completed chat from the store for `tenant`/`user` (its history stays
    /// readable after a restart without keeping every finished chat in memory). `None` when
    /// there is no such chat, it is not theirs, or it is still open (open chats are rebuilt by
    /// [`Engine::rehydrate`] at start).
    pub async fn restore_completed_chat(
        &self,
        chat_id: &str,
        tenant: &str,
        user: &str,
    ) -> Result<Option<ChatHandle>, EngineError> {
        let Some(rows) = self.rows() else {
            return Ok(None);
        };
        let Some(chat) = rows.completed(chat_id, tenant, user).await? else {
            return Ok(None);
        };
        Ok(self.start_restored(chat))
    }

    /// Rebuilds one open chat from the store and resumes its pending work exactly as
    /// [`Engine::rehydrate`] does after a restart: the way a node takes over a chat whose owner
    /// died. `None` when the chat does not exist, has completed, or has an unknown workflow.
    pub async fn take_over(&self, chat_id: &str) -> Result<Option<ChatHandle>, EngineError> {
        let Some(rows) = self.rows() else {
            return Ok(None);
        };
        let Some(chat) = rows.open_chat(chat_id).await? else {
            return Ok(None);
        };
        if !self.inner.workflows.contains_key(&chat.workflow) {
            tracing::warn!(chat_id = %chat_id, workflow = %chat.workflow, "chat of an unknown workflow not taken over");
            return Ok(None);
        }
        Ok(self.start_restored(chat))
    }

    /// Starts the session of a chat loaded from the store; `None` for an unknown workflow.
    fn start_restored(&self, chat: RestoredChat) -> Option<ChatHandle> {
        let wf = self.workflow(&chat.workflow).ok()?;
        let shard = self.next_shard();
        let config = self.inner.config.clone();
        let (identity, workflow) = (chat.identity.clone(), chat.workflow.clone());
        let arbiter = shard.arbiter.clone();
        let addr = ChatSession::start_in_arbiter(&arbiter, move |_| {
            ChatSession::restore(wf, shard, config, chat)
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
        let known = |chat_id: &str, workflow: &str| {
            let known = self.inner.workflows.contains_key(workflow);
            if !known {
                tracing::warn!(chat_id = %chat_id, workflow = %workflow, "stored chat of an unknown workflow left alone");
            }
            known
        };
        let chats = rows.open_chats(known).await?;
        Ok(chats
            .into_iter()
            .filter_map(|chat| self.start_restored(chat))
            .collect())
    }

    /// The compiled workflows, by name.
    pub fn workflows(&self) -> impl Iterator<Item = &Arc<CompiledWorkflow>> {
        self.inner.workflows.values()
    }

    /// The engine's configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }
}
