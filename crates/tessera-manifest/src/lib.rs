//! tessera-manifest: loads a workflow folder (`workflow.json`, `agents.json`, `tools.json`,
//! `structured_outputs.json`, `context_variables.json`, `handoffs.json`, `demo.json`,
//! `mcp.json`), checks
//! every rule at once, and hands the engine a [`Workflow`] whose cross-references are all valid.
//!
//! Entry points: [`load_workflow`] for one folder, [`load_workflows`] for a root of folders,
//! [`load_workflow_dir`] for either (what every `tessera` command accepts).
//! Errors come back as [`ManifestErrors`]: every problem in every file, each with the file, a
//! JSON pointer and a one-sentence fix, so `tessera validate` can list them all in one run.
//!
//! Decisions worth knowing:
//! - Only `workflow.json` and `agents.json` are required; a missing optional file means "none"
//!   (no tools, models, variables, handoffs or demo script).
//! - Unknown keys are errors (with the allowed keys and a "did you mean"), to catch typos;
//!   `null` counts as absent for optional keys.
//! - Structured-output models compile to JSON Schema 2020-12 once at load; a field is required
//!   unless it is `Optional[...]` or has a `default`; extra keys in agent output are tolerated
//!   (Pydantic's default), see [`CompiledModel`].
//! - A UI tool without `parameters` takes its owner's registry model schema.
//! - Handoff conditions are parsed into [`Expr`] at load; every `${name}` must be declared.
//! - Nothing here panics on any input: malformed JSON in one file is reported and the other
//!   files are still checked, without cascading errors from the broken one.

#![warn(missing_docs)]

mod agents;
mod context;
mod demo;
mod error;
mod expr;
mod handoffs;
mod json;
mod load;
mod mcp;
mod models;
mod tools;
mod workflow;

pub use agents::{Agent, DEFAULT_PARALLEL_TOOLS, MAX_PARALLEL_TOOLS, ToolCalling};
pub use context::{DerivedVariable, UiResponseTrigger, VarSource, VarType, VariableDef};
pub use error::{ManifestError, ManifestErrors};
pub use expr::{Expr, ExprError};
pub use handoffs::{HandoffKind, HandoffRule, HandoffTarget};
pub use load::{
    LoadedWorkflow, MANIFEST_FILES, WorkflowDirError, load_workflow, load_workflow_dir,
    load_workflows,
};
pub use mcp::{McpDecls, McpGrant, McpServer, McpTransport, is_model_tool_name, mcp_exposed_name};
pub use models::CompiledModel;
pub use tools::{DisplayMode, ToolDef, ToolImpl, ToolType, UiSpec};
pub use workflow::{StartupMode, Workflow};
