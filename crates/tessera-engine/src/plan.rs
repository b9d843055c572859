//! Workflows prepared for running: everything a turn needs is resolved once at start-up
//! (tool implementations, argument schemas, tool specs for the model, output validators), so
//! the hot path never parses a manifest or compiles a schema.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tessera_llm::{ChatModel, ToolSpec, Tools};
use tessera_manifest::{
    Agent, CompiledModel, ToolCalling, ToolDef, ToolImpl, ToolType, Workflow, mcp_exposed_name,
};
use tessera_tools::{ArgSchema, BuiltinRegistry, HttpTool, Tool};

use crate::EngineError;
use crate::mcp::{McpCatalog, McpTool};

/// How an agent calls tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallingMode {
    /// OpenAI function calling.
    Native,
    /// The text protocol of `structured_tool_loop.md`.
    Json,
}

/// An agent tool ready to run.
pub struct PlannedTool {
    pub name: Arc<str>,
    pub args: ArgSchema,
    pub exec: Arc<dyn Tool>,
    pub timeout: Duration,
}

impl std::fmt::Debug for PlannedTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannedTool")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// An agent's output model.
#[derive(Debug, Clone)]
pub struct OutputPlan {
    pub model_name: Arc<str>,
    pub model: CompiledModel,
}

/// One agent, prepared.
#[derive(Debug)]
pub struct AgentPlan {
    pub name: Arc<str>,
    /// Shared by every turn's system message when there is nothing to add to it.
    pub system_message: Arc<str>,
    pub context_variables: Vec<String>,
    pub model: Option<String>,
    pub temperature: Option<f32>,
    pub tool_calling: ToolCallingMode,
    pub tools: Vec<PlannedTool>,
    /// Shared with every model request of the agent rather than copied into each, and
    /// encoded for the wire once.
    pub tool_specs: Tools,
    /// The tool catalogue text appended to the system prompt in `json` mode.
    pub json_mode_catalogue: Option<String>,
    pub output: Option<OutputPlan>,
    pub structured_required: bool,
    pub auto_tool_mode: bool,
    pub max_consecutive_auto_reply: u32,
    /// The agent's `max_tokens` (`None`: the engine default).
    pub max_tokens: Option<u32>,
    /// The agent's total deadline per model call (`None`: the engine default).
    pub call_deadline: Option<Duration>,
    /// Triggers of `ui_hidden` derived variables watching this agent: replies that could
    /// still become one are not streamed (see `hidden_text.rs`).
    pub hidden_triggers: Arc<[String]>,
    /// How many tool calls of one model message run at once.
    pub max_parallel_tools: usize,
}

impl AgentPlan {
    /// The system prompt for a turn: the agent's message, the context variables it may read,
    /// and in `json` mode the tool protocol. Without either, the shared message itself.
    pub fn system_prompt(&self, context: &Map<String, Value>) -> Arc<str> {
        if self.context_variables.is_empty() && self.json_mode_catalogue.is_none() {
            return Arc::clone(&self.system_message);
        }
        let mut prompt = self.system_message.to_string();
        if !self.context_variables.is_empty() {
            prompt.push_str("\n\n[CONTEXT VARIABLES]");
            for name in &self.context_variables {
                let value = context.get(name).unwrap_or(&Value::Null);
                let _ = write!(prompt, "\n{name}: {value}");
            }
        }
        if let Some(catalogue) = &self.json_mode_catalogue {
            prompt.push_str("\n\n");
            prompt.push_str(catalogue);
        }
        prompt.into()
    }
}

/// A workflow with all its agents prepared, and the model its chats use.
pub struct CompiledWorkflow {
    pub workflow: Arc<Workflow>,
    /// The workflow's name, shared by every turn's tool context instead of copied per turn.
    pub name: Arc<str>,
    pub agents: HashMap<String, Arc<AgentPlan>>,
    pub model: Arc<dyn ChatModel>,
    /// Executable pre-steps of UI tools (e.g. the bundle builder before FileDownloadCenter).
    pub ui_presteps: HashMap<String, Arc<dyn Tool>>,
}

impl CompiledWorkflow {
    /// Prepares `workflow`; fails when a tool's implementation cannot be resolved. `http` is the
    /// shared client of HTTP tools, required only when the workflow has one.
    pub fn compile(
        workflow: Workflow,
        model: Arc<dyn ChatModel>,
        builtins: &BuiltinRegistry,
        http: Option<&reqwest::Client>,
        default_tool_timeout: Duration,
    ) -> Result<Self, EngineError> {
        Self::compile_with_mcp(workflow, model, builtins, http, default_tool_timeout, None)
    }

    /// [`Self::compile`] with the MCP servers' tools: each agent is also offered the
    /// allow-listed tools `mcp` listed (none without it).
    pub fn compile_with_mcp(
        workflow: Workflow,
        model: Arc<dyn ChatModel>,
        builtins: &BuiltinRegistry,
        http: Option<&reqwest::Client>,
        default_tool_timeout: Duration,
        mcp: Option<&McpCatalog>,
    ) -> Result<Self, EngineError> {
        let mut agents = HashMap::new();
        for agent in workflow.agents.values() {
            let mut plan = plan_agent(&workflow, agent, builtins, http, default_tool_timeout)?;
            plan_mcp_tools(&workflow, agent, mcp, default_tool_timeout, &mut plan)?;
            agents.insert(agent.name.clone(), Arc::new(plan));
        }
        let mut ui_presteps = HashMap::new();
        for tool in workflow
            .tools
            .iter()
            .filter(|t| t.tool_type == ToolType::UiTool)
        {
            if let Some(implementation) = &tool.implementation {
                let exec = resolve_exec(
                    &workflow.name,
                    tool,
                    implementation,
                    builtins,
                    http,
                    default_tool_timeout,
                )?;
                ui_presteps.insert(tool.function.clone(), exec);
            }
        }
        Ok(Self {
            name: Arc::from(workflow.name.as_str()),
            workflow: Arc::new(workflow),
            agents,
            model,
            ui_presteps,
        })
    }

    /// The prepared agent `name`.
    pub fn agent(&self, name: &str) -> Option<&Arc<AgentPlan>> {
        self.agents.get(name)
    }
}

fn plan_agent(
    workflow: &Workflow,
    agent: &Agent,
    builtins: &BuiltinRegistry,
    http: Option<&reqwest::Client>,
    default_timeout: Duration,
) -> Result<AgentPlan, EngineError> {
    let mut tools = Vec::new();
    let mut tool_specs = Vec::new();
    for def in workflow.agent_tools_of(&agent.name) {
        let Some(implementation) = &def.implementation else {
            return Err(EngineError::Workflow(format!(
                "{}: tool {} has no implementation",
                workflow.name, def.function
            )));
        };
        let exec = resolve_exec(
            &workflow.name,
            def,
            implementation,
            builtins,
            http,
            default_timeout,
        )?;
        let args = ArgSchema::new(&def.parameters).map_err(|e| {
            EngineError::Workflow(format!("{}: tool {}: {e}", workflow.name, def.function))
        })?;
        tool_specs.push(ToolSpec {
            name: def.function.clone(),
            description: def.description.clone(),
            parameters: (*def.parameters).clone(),
        });
        tools.push(PlannedTool {
            name: Arc::from(def.function.as_str()),
            args,
            exec,
            timeout: def
                .timeout_s
                .map(Duration::from_secs_f64)
                .unwrap_or(default_timeout),
        });
    }
    let tool_calling = match agent.tool_calling {
        ToolCalling::Native => ToolCallingMode::Native,
        ToolCalling::Json => ToolCallingMode::Json,
    };
    let json_mode_catalogue = (tool_calling == ToolCallingMode::Json && !tool_specs.is_empty())
        .then(|| json_catalogue(&tool_specs));
    let output = workflow
        .output_model_of(&agent.name)
        .map(|model: &CompiledModel| OutputPlan {
            model_name: Arc::from(model.name.as_str()),
            model: model.clone(),
        });
    Ok(AgentPlan {
        name: Arc::from(agent.name.as_str()),
        system_message: Arc::from(agent.system_message.as_str()),
        context_variables: agent.context_variables.clone(),
        model: agent.model.clone(),
        temperature: agent.temperature,
        tool_calling,
        tools,
        tool_specs: tool_specs.into(),
        json_mode_catalogue,
        output,
        structured_required: agent.structured_outputs_required,
        auto_tool_mode: agent.auto_tool_mode,
        max_consecutive_auto_reply: agent.max_consecutive_auto_reply,
        max_tokens: agent.max_tokens,
        call_deadline: agent.call_deadline_s.map(Duration::from_secs_f64),
        hidden_triggers: workflow
            .derived
            .iter()
            .filter(|d| d.ui_hidden && d.source_agent == agent.name)
            .map(|d| d.trigger_value.clone())
            .collect(),
        max_parallel_tools: usize::try_from(agent.max_parallel_tools)
            .unwrap_or(1)
            .max(1),
    })
}

/// Adds `agent`'s allow-listed MCP tools to its plan, with the schemas the servers listed.
/// A tool whose server was unreachable or does not list it is left out (and logged).
fn plan_mcp_tools(
    workflow: &Workflow,
    agent: &Agent,
    mcp: Option<&McpCatalog>,
    default_timeout: Duration,
    plan: &mut AgentPlan,
) -> Result<(), EngineError> {
    let mut specs = plan.tool_specs.to_vec();
    let before = specs.len();
    for (server, grant) in workflow.mcp.grants_of(&agent.name) {
        let listed = mcp.and_then(|m| Some((m, m.listed.get(&server.transport)?)));
        let Some((catalog, Ok(tools))) = listed else {
            // The hub's discovery already warned once per server.
            tracing::debug!(workflow = %workflow.name, agent = %agent.name, mcp_server = %server.name, "MCP server not listed: its tools are not offered");
            continue;
        };
        for name in &grant.tools {
            let Some(info) = tools.iter().find(|t| &t.name == name) else {
                tracing::warn!(workflow = %workflow.name, agent = %agent.name, mcp_server = %server.name, tool = %name, "allow-listed MCP tool not in the server's tools/list");
                continue;
            };
            let exposed = mcp_exposed_name(server, name);
            let args = ArgSchema::new(&info.input_schema).map_err(|e| {
                EngineError::Workflow(format!(
                    "{}: MCP tool {exposed} of server {}: {e}",
                    workflow.name, server.name
                ))
            })?;
            specs.push(ToolSpec {
                name: exposed.clone(),
                description: info.description.clone().unwrap_or_default(),
                parameters: info.input_schema.clone(),
            });
            plan.tools.push(PlannedTool {
                name: Arc::from(exposed.as_str()),
                args,
                exec: Arc::new(McpTool {
                    hub: catalog.hub.clone(),
                    server: server.transport.clone(),
                    server_name: Arc::from(server.name.as_str()),
                    tool: Arc::from(name.as_str()),
                }),
                timeout: server
                    .timeout_s
                    .map(Duration::from_secs_f64)
                    .unwrap_or(default_timeout),
            });
        }
    }
    if specs.len() != before {
        if plan.tool_calling == ToolCallingMode::Json {
            plan.json_mode_catalogue = Some(json_catalogue(&specs));
        }
        plan.tool_specs = specs.into();
    }
    Ok(())
}

fn resolve_exec(
    workflow: &str,
    def: &ToolDef,
    implementation: &ToolImpl,
    builtins: &BuiltinRegistry,
    http: Option<&reqwest::Client>,
    default_timeout: Duration,
) -> Result<Arc<dyn Tool>, EngineError> {
    // Every tool sees only the collected secrets its manifest entry declares.
    let scoped = |tool: Arc<dyn Tool>| crate::secrets::scope_secrets(tool, &def.uses_secrets);
    let exec: Result<Arc<dyn Tool>, EngineError> = match implementation {
        ToolImpl::Builtin { name } => builtins.get(name).ok_or_else(|| {
            EngineError::Workflow(format!(
                "{workflow}: tool {} names unknown built-in {name:?}",
                def.function
            ))
        }),
        ToolImpl::Http { url, timeout_s } => {
            let timeout = timeout_s
                .or(def.timeout_s)
                .map(Duration::from_secs_f64)
                .unwrap_or(default_timeout);
            let client = http.ok_or_else(|| {
                EngineError::Workflow(format!(
                    "{workflow}: tool {} is an HTTP tool but no HTTP client was given",
                    def.function
                ))
            })?;
            Ok(Arc::new(HttpTool::new(
                url.clone(),
                timeout,
                client.clone(),
            )))
        }
    };
    exec.map(scoped)
}

fn json_catalogue(specs: &[ToolSpec]) -> String {
    let mut text = String::from(
        "[TOOLS]\nYou may call one tool at a time. To call a tool, reply with ONLY a JSON object {\"tool\": \"<name>\", \"args\": {...}} and nothing else. To answer the user, reply with plain text.\nAvailable tools:",
    );
    for spec in specs {
        let _ = write!(
            text,
            "\n- {}: {} Arguments schema: {}",
            spec.name, spec.description, spec.parameters
        );
    }
    text
}
