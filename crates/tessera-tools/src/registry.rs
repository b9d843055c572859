//! The built-in tool registry: name → implementation, parameters and description.
//!
//! WHY: the engine resolves a manifest's tool names against one table built at startup;
//! built-ins carry their own argument schemas so the engine can validate and advertise them
//! the same way as manifest-declared tools.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::Tool;
use crate::artifacts::ArtifactStore;
use crate::builtin::{Echo, GenerateAndDownload, TodoOp, TodoTool, WordCount};
use crate::tasks::TaskStore;

/// The stores built-in tools need. The store crate implements both against SQL databases.
#[derive(Clone)]
pub struct ToolServices {
    /// Todo lists for the `*_task` tools.
    pub tasks: Arc<dyn TaskStore>,
    /// Generated files for `generate_and_download`.
    pub artifacts: Arc<dyn ArtifactStore>,
}

impl std::fmt::Debug for ToolServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolServices").finish_non_exhaustive()
    }
}

/// One registered tool.
#[derive(Clone)]
pub struct RegisteredTool {
    /// The implementation (shared by all chats).
    pub tool: Arc<dyn Tool>,
    /// Description shown to the model.
    pub description: String,
    /// JSON Schema of the arguments (compile it with [`crate::ArgSchema::new`]).
    pub parameters: Value,
}

impl std::fmt::Debug for RegisteredTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredTool")
            .field("description", &self.description)
            .field("parameters", &self.parameters)
            .finish_non_exhaustive()
    }
}

/// Name → built-in tool. Read-only once built; share it behind an `Arc`.
#[derive(Debug, Clone, Default)]
pub struct BuiltinRegistry {
    tools: BTreeMap<String, RegisteredTool>,
}

impl BuiltinRegistry {
    /// A registry with no tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry with every built-in: `echo`, `word_count`, `add_task`, `list_tasks`,
    /// `complete_task`, `delete_task`, `generate_and_download`.
    pub fn with_defaults(services: ToolServices) -> Self {
        let mut r = Self::new();
        r.register(
            Echo::NAME,
            Echo::DESCRIPTION,
            Echo::parameters(),
            Arc::new(Echo),
        );
        r.register(
            WordCount::NAME,
            WordCount::DESCRIPTION,
            WordCount::parameters(),
            Arc::new(WordCount),
        );
        for op in TodoOp::ALL {
            r.register(
                op.name(),
                op.description(),
                op.parameters(),
                Arc::new(TodoTool::new(op, Arc::clone(&services.tasks))),
            );
        }
        r.register(
            GenerateAndDownload::NAME,
            GenerateAndDownload::DESCRIPTION,
            GenerateAndDownload::parameters(),
            Arc::new(GenerateAndDownload::new(Arc::clone(&services.artifacts))),
        );
        r
    }

    /// Add (or replace) a tool.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        tool: Arc<dyn Tool>,
    ) {
        self.tools.insert(
            name.into(),
            RegisteredTool {
                tool,
                description: description.into(),
                parameters,
            },
        );
    }

    /// The implementation of `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).map(|t| Arc::clone(&t.tool))
    }

    /// Everything registered for `name` (implementation, description, parameters).
    pub fn entry(&self, name: &str) -> Option<&RegisteredTool> {
        self.tools.get(name)
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.tools.keys().map(String::as_str).collect()
    }
}
