//! The loaded [`Workflow`]: everything the engine needs to run a chat, checked and cross-linked.

use std::collections::BTreeMap;
use std::path::PathBuf;

use indexmap::IndexMap;
use serde_json::{Map, Value};

use crate::agents::Agent;
use crate::context::{DerivedVariable, UiResponseTrigger, VariableDef};
use crate::handoffs::HandoffRule;
use crate::mcp::McpDecls;
use crate::models::CompiledModel;
use crate::tools::{ToolDef, ToolType};

/// Who speaks first when a chat starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartupMode {
    /// The chat waits for the user's first message (or uses `initial_message` as it).
    UserDriven,
    /// The initial agent speaks first without user input.
    AgentDriven,
}

/// A fully validated workflow: built only when every manifest check passed, so the engine can
/// rely on every cross-reference (agents, tools, models, variables) being valid.
#[derive(Debug, Clone)]
pub struct Workflow {
    /// Display name from `workflow.json`.
    pub name: String,
    /// One-line description for listings.
    pub description: String,
    /// Agent that takes the first turn.
    pub initial_agent: String,
    /// Upper bound on agent turns per chat (loop guard).
    pub max_turns: u32,
    /// Whether the user takes part (false: agents run to completion).
    pub human_in_the_loop: bool,
    /// Optional first message injected at start.
    pub initial_message: Option<String>,
    /// Who speaks first.
    pub startup_mode: StartupMode,
    /// Offered in `GET /workflows` (the client's picker); `"listed": false` hides a workflow
    /// that is started only by name (e.g. a benchmark workload).
    pub listed: bool,
    /// Agents in file order.
    pub agents: IndexMap<String, Agent>,
    /// Tools in file order.
    pub tools: Vec<ToolDef>,
    /// Compiled structured-output models by name.
    pub models: BTreeMap<String, CompiledModel>,
    /// Agent name -> model name.
    pub registry: BTreeMap<String, String>,
    /// Declared context variables in file order.
    pub variables: Vec<VariableDef>,
    /// Derived (text-triggered) boolean variables.
    pub derived: Vec<DerivedVariable>,
    /// UI-response triggers.
    pub ui_response_triggers: Vec<UiResponseTrigger>,
    /// Handoff rules in file order.
    pub handoffs: Vec<HandoffRule>,
    /// MCP servers and which of their tools each agent may call (`mcp.json`).
    pub mcp: McpDecls,
    /// Folder the workflow was loaded from (for demo.json and other assets).
    pub dir: PathBuf,
    /// Content version of the manifest files (16 hex digits): chats remember the version
    /// they started with, so a reloaded workflow does not change a running chat.
    pub version: String,
}

impl Workflow {
    /// Looks up an agent by name.
    pub fn agent(&self, name: &str) -> Option<&Agent> {
        self.agents.get(name)
    }

    /// All tools owned by `agent`, in file order.
    pub fn tools_of<'a>(&'a self, agent: &'a str) -> impl Iterator<Item = &'a ToolDef> + 'a {
        self.tools.iter().filter(move |t| t.agent == agent)
    }

    /// The `Agent_Tool`s of `agent`: what is offered to its model for function calling.
    pub fn agent_tools_of<'a>(&'a self, agent: &'a str) -> impl Iterator<Item = &'a ToolDef> + 'a {
        self.tools_of(agent)
            .filter(|t| t.tool_type == ToolType::AgentTool)
    }

    /// The UI tool of `agent` (auto-tool agents have exactly one).
    pub fn ui_tool_of(&self, agent: &str) -> Option<&ToolDef> {
        self.tools
            .iter()
            .find(|t| t.agent == agent && t.tool_type == ToolType::UiTool)
    }

    /// Looks up a tool by function name.
    pub fn tool(&self, function: &str) -> Option<&ToolDef> {
        self.tools.iter().find(|t| t.function == function)
    }

    /// The structured-output model registered for `agent`.
    pub fn output_model_of(&self, agent: &str) -> Option<&CompiledModel> {
        self.registry.get(agent).and_then(|m| self.models.get(m))
    }

    /// The context variables at chat start: defaults, environment values (read now), and every
    /// derived variable set to false.
    pub fn initial_context(&self) -> Map<String, Value> {
        let mut ctx = Map::new();
        for v in &self.variables {
            ctx.insert(v.name.clone(), v.initial_value());
        }
        for dv in &self.derived {
            ctx.insert(dv.name.clone(), Value::Bool(false));
        }
        ctx
    }

    /// Rules whose source is `agent`, in file order (conditions are evaluated in this order).
    pub fn handoff_rules_for<'a>(
        &'a self,
        agent: &'a str,
    ) -> impl Iterator<Item = &'a HandoffRule> + 'a {
        self.handoffs
            .iter()
            .filter(move |r| r.source_agent == agent)
    }

    /// Whether `name` may be sent to the browser (derived variables are; env ones by default not).
    pub fn is_client_visible(&self, name: &str) -> bool {
        match self.variables.iter().find(|v| v.name == name) {
            Some(v) => v.client_visible,
            None => self.derived.iter().any(|d| d.name == name),
        }
    }
}
