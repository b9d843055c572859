//! `WorkflowCatalog`: the compiled workflows by name and version. New chats get a workflow's
//! current version; a chat rebuilt from the store gets the version it started with. A reload
//! installs new versions while the server runs: chats already running hold their own
//! `Arc<CompiledWorkflow>` and are not affected.
//!
//! An actor rather than a shared map, so versions can change at run time without a lock; it
//! is asked only when a chat is created or rebuilt, never during a turn.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use actix::prelude::*;

use crate::plan::CompiledWorkflow;

/// Every known version of every workflow, and which one is current.
#[derive(Default)]
pub struct WorkflowCatalog {
    current: BTreeMap<String, Arc<CompiledWorkflow>>,
    /// (name, version) → compiled workflow; includes the current ones.
    versions: HashMap<(String, String), Arc<CompiledWorkflow>>,
}

impl WorkflowCatalog {
    /// A catalog whose current versions are `workflows`.
    pub fn with_current(workflows: Vec<Arc<CompiledWorkflow>>) -> Self {
        let mut catalog = Self::default();
        catalog.add(workflows, true);
        catalog
    }

    fn add(&mut self, workflows: Vec<Arc<CompiledWorkflow>>, current: bool) {
        for wf in workflows {
            let name = wf.workflow.name.clone();
            self.versions
                .insert((name.clone(), wf.workflow.version.clone()), wf.clone());
            if current {
                self.current.insert(name, wf);
            }
        }
    }
}

impl Actor for WorkflowCatalog {
    type Context = Context<Self>;
}

/// Which workflow a chat runs.
#[derive(Message)]
#[rtype(result = "Option<Arc<CompiledWorkflow>>")]
pub struct ResolveWorkflow {
    /// Workflow name.
    pub name: String,
    /// The version a stored chat started with; `None` (or an unknown or empty version, with a
    /// warning) means the current one.
    pub version: Option<String>,
}

/// Adds compiled versions; with `current`, new chats get them from now on.
#[derive(Message)]
#[rtype(result = "()")]
pub struct InstallWorkflows {
    /// The versions to add.
    pub workflows: Vec<Arc<CompiledWorkflow>>,
    /// Make them the current version of their workflow.
    pub current: bool,
}

/// The current version of each workflow, by name.
#[derive(Message)]
#[rtype(result = "BTreeMap<String, String>")]
pub struct CurrentVersions;

impl Handler<ResolveWorkflow> for WorkflowCatalog {
    type Result = Option<Arc<CompiledWorkflow>>;

    fn handle(&mut self, msg: ResolveWorkflow, _: &mut Self::Context) -> Self::Result {
        let current = self.current.get(&msg.name).cloned();
        let Some(version) = msg.version.filter(|v| !v.is_empty()) else {
            return current;
        };
        let key = (msg.name, version);
        match self.versions.get(&key) {
            Some(wf) => Some(wf.clone()),
            None => {
                if current.is_some() {
                    tracing::warn!(workflow = %key.0, version = %key.1, "stored workflow version unknown; the chat runs the current version");
                }
                current
            }
        }
    }
}

impl Handler<InstallWorkflows> for WorkflowCatalog {
    type Result = ();

    fn handle(&mut self, msg: InstallWorkflows, _: &mut Self::Context) {
        self.add(msg.workflows, msg.current);
    }
}

impl Handler<CurrentVersions> for WorkflowCatalog {
    type Result = MessageResult<CurrentVersions>;

    fn handle(&mut self, _: CurrentVersions, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            self.current
                .iter()
                .map(|(name, wf)| (name.clone(), wf.workflow.version.clone()))
                .collect(),
        )
    }
}
