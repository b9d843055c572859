//! One arbiter's helper actors ([`Shard`]) and the engine's optional extensions
//! ([`EngineHooks`]). A chat's session holds its arbiter's shard; the helpers know nothing of
//! sessions (they publish through a `Recipient`).

use std::sync::Arc;

use actix::prelude::*;
use tessera_protocol::ServerEvent;
use tessera_store::ChatStore;

use crate::EngineConfig;
use crate::auto_tool::AutoToolHandler;
use crate::correlator::UiCorrelator;
use crate::dedup::{DedupCache, DedupRecordStore};
use crate::persist::StoreDedup;

/// Sees every event a chat publishes (metrics, audit). Must be cheap and never block.
pub type EventObserver = Arc<dyn Fn(&crate::status::ChatIdentity, &ServerEvent) + Send + Sync>;

/// Optional extensions of the engine.
#[derive(Clone, Default)]
pub struct EngineHooks {
    /// Durable tool-invocation records behind every `DedupCache`.
    pub durable_dedup: Option<Arc<dyn DedupRecordStore>>,
    /// Called for every published event.
    pub observer: Option<EventObserver>,
    /// Durable chats: state, transcript, event log, pending UI calls and tool records. Also
    /// backs the dedup cache unless `durable_dedup` is given.
    pub store: Option<Arc<dyn ChatStore>>,
    /// This node's MCP hub and the tools its servers listed when the workflows were loaded
    /// ([`crate::mcp::McpCatalog::discover`]); without it agents get no MCP tools.
    pub mcp: Option<crate::mcp::McpCatalog>,
}

/// The helper actors of one arbiter, shared by its chats (`Arc<Shard>`).
pub struct Shard {
    pub arbiter: ArbiterHandle,
    /// Shared by `Arc`: each turn's runner takes it, and cloning an actix address allocates.
    pub dedup: Arc<Addr<DedupCache>>,
    pub correlator: Addr<UiCorrelator>,
    pub auto_tools: Addr<AutoToolHandler>,
    pub observer: Option<EventObserver>,
    pub store: Option<Arc<dyn ChatStore>>,
    /// Chat sessions in memory, over all shards (see `Engine::chats_in_memory`).
    pub chats_in_memory: Arc<std::sync::atomic::AtomicUsize>,
}

impl Shard {
    /// Starts a shard's actors on `arbiter`.
    pub fn start(arbiter: ArbiterHandle, config: &EngineConfig, hooks: &EngineHooks) -> Self {
        let durable = hooks.durable_dedup.clone().or_else(|| {
            hooks
                .store
                .clone()
                .map(|store| Arc::new(StoreDedup(store)) as Arc<dyn DedupRecordStore>)
        });
        let capacity = config.dedup_capacity;
        let policy = config.disconnect_policy;
        let ui_timeout = config.ui_timeout;
        let dedup =
            DedupCache::start_in_arbiter(&arbiter, move |_| DedupCache::new(capacity, durable));
        let correlator =
            UiCorrelator::start_in_arbiter(&arbiter, move |_| UiCorrelator::new(policy));
        let (d, c) = (dedup.clone(), correlator.clone());
        let auto_tools = AutoToolHandler::start_in_arbiter(&arbiter, move |_| {
            AutoToolHandler::new(d, c, ui_timeout)
        });
        Self {
            arbiter,
            dedup: Arc::new(dedup),
            correlator,
            auto_tools,
            observer: hooks.observer.clone(),
            store: hooks.store.clone(),
            chats_in_memory: Arc::default(),
        }
    }
}
