//! Agents (`agents.json`): who speaks, with which prompt, and how their output is handled.

use indexmap::IndexMap;
use serde_json::Value;

use crate::error::Diag;
use crate::json::{Loc, is_pascal_case, object};

/// How an agent calls tools, because local models often lack native function calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolCalling {
    /// The provider's function-calling API (OpenAI `tools`).
    #[default]
    Native,
    /// The strict text protocol: the model answers final text or `{"tool": ..., "args": {...}}`.
    Json,
}

/// One agent of a workflow, as declared in `agents.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Agent {
    /// PascalCase name, unique in the workflow; used in handoffs, tools and the registry.
    pub name: String,
    /// The agent's system prompt.
    pub system_message: String,
    /// How many times in a row the agent may reply without a human turn (loop guard).
    pub max_consecutive_auto_reply: u32,
    /// When true, the agent's structured output auto-invokes its single UI tool.
    pub auto_tool_mode: bool,
    /// When true, the agent's output must validate against its registry model.
    pub structured_outputs_required: bool,
    /// Model override (e.g. `gpt-4o-mini`); `None` uses the server default.
    pub model: Option<String>,
    /// Sampling temperature override in `0..=2`.
    pub temperature: Option<f32>,
    /// Tool-calling protocol used for this agent.
    pub tool_calling: ToolCalling,
    /// Declared context variables whose values are shown in this agent's prompt.
    pub context_variables: Vec<String>,
    /// Most tokens one model reply may have; `None` uses the server default.
    pub max_tokens: Option<u32>,
    /// Seconds one model call may take in total (streamed or not, retries included); `None`
    /// uses the server default.
    pub call_deadline_s: Option<f64>,
    /// How many tool calls of one model message run at once (`1..=MAX_PARALLEL_TOOLS`).
    pub max_parallel_tools: u32,
}

/// Largest `max_tokens` an agent may ask for (beyond any model's output window).
pub const MAX_TOKENS_LIMIT: u32 = 1_000_000;
/// Longest `call_deadline_s` an agent may set: one hour.
pub const CALL_DEADLINE_LIMIT_S: f64 = 3600.0;

/// `max_parallel_tools` when an agent does not set it.
pub const DEFAULT_PARALLEL_TOOLS: u32 = 4;
/// The largest accepted `max_parallel_tools` (a model rarely returns more calls at once).
pub const MAX_PARALLEL_TOOLS: u32 = 32;

/// The parsed `agents.json`: valid agents in file order, plus every declared name.
pub(crate) struct Agents {
    pub agents: IndexMap<String, Agent>,
    /// Context-variable references to check once variables are known: (agent, index, name).
    pub var_refs: Vec<(String, usize, String)>,
    /// Every agent name in the file, valid or not (avoids cascading "unknown agent" errors).
    pub declared: std::collections::BTreeSet<String>,
}

const AGENT_KEYS: &[&str] = &[
    "system_message",
    "max_consecutive_auto_reply",
    "auto_tool_mode",
    "structured_outputs_required",
    "model",
    "temperature",
    "tool_calling",
    "context_variables",
    "description",
    "max_tokens",
    "call_deadline_s",
    "max_parallel_tools",
];

/// Parses `agents.json`; `order` is the key order of the `agents` object in the file.
pub(crate) fn parse(doc: &Value, order: &[String], d: &mut Diag) -> Option<Agents> {
    let root = Loc::root("agents.json");
    let top = object(doc, &root, "the document", d)?;
    top.allow_keys(&["agents"], d);
    let Some(agents_v) = top.get("agents") else {
        root.err(
            d,
            "missing required key \"agents\" (an object of agent name -> definition)",
        );
        return None;
    };
    let aloc = root.key("agents");
    let agents = object(agents_v, &aloc, "\"agents\"", d)?;
    if agents.map.is_empty() {
        aloc.err(d, "a workflow needs at least one agent; add one");
    }
    let mut names: Vec<&String> = order
        .iter()
        .filter(|n| agents.map.contains_key(*n))
        .collect();
    for k in agents.map.keys() {
        if !names.contains(&k) {
            names.push(k);
        }
    }
    let mut out = Agents {
        agents: IndexMap::new(),
        var_refs: Vec::new(),
        declared: agents.map.keys().cloned().collect(),
    };
    for name in names {
        let Some(v) = agents.map.get(name) else {
            continue;
        };
        let loc = aloc.key(name);
        if !is_pascal_case(name) {
            loc.err(
                d,
                format!(
                    "agent name \"{name}\" must be PascalCase (e.g. \"ContextAgent\"); rename it"
                ),
            );
        }
        if let Some(agent) = parse_agent(name, v, &loc, &mut out.var_refs, d) {
            out.agents.insert(name.clone(), agent);
        }
    }
    Some(out)
}

fn parse_agent(
    name: &str,
    v: &Value,
    loc: &Loc,
    var_refs: &mut Vec<(String, usize, String)>,
    d: &mut Diag,
) -> Option<Agent> {
    let o = object(v, loc, &format!("agent \"{name}\""), d)?;
    o.allow_keys(AGENT_KEYS, d);
    let system_message = o.req_str("system_message", d);
    if system_message.is_some_and(|s| s.trim().is_empty()) {
        loc.key("system_message").err(
            d,
            "\"system_message\" must not be empty; describe the agent's role",
        );
    }
    let max_auto = o.req_u32("max_consecutive_auto_reply", d);
    let auto_tool_mode = o.opt_bool("auto_tool_mode", false, d);
    let structured_outputs_required = o.opt_bool("structured_outputs_required", false, d);
    let model = o.opt_str("model", d);
    if model.is_some_and(|m| m.trim().is_empty()) {
        loc.key("model").err(
            d,
            "\"model\" must not be empty; remove it to use the server default",
        );
    }
    let mut temperature = None;
    if let Some(t) = o.get("temperature") {
        match t.as_f64() {
            Some(f) if (0.0..=2.0).contains(&f) => temperature = Some(f as f32),
            _ => loc.key("temperature").err(
                d,
                format!("\"temperature\" must be a number from 0 to 2, found {t}"),
            ),
        }
    }
    let tool_calling = match o.opt_str("tool_calling", d) {
        None | Some("native") => ToolCalling::Native,
        Some("json") => ToolCalling::Json,
        Some(other) => {
            loc.key("tool_calling").err(
                d,
                format!("\"tool_calling\" must be \"native\" or \"json\", found \"{other}\""),
            );
            ToolCalling::Native
        }
    };
    let max_tokens = o.get("max_tokens").and_then(|v| {
        let n = v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (1..=MAX_TOKENS_LIMIT).contains(n));
        if n.is_none() {
            loc.key("max_tokens").err(
                d,
                format!(
                    "\"max_tokens\" must be an integer from 1 to {MAX_TOKENS_LIMIT}, found {v}"
                ),
            );
        }
        n
    });
    let call_deadline_s = o.opt_positive("call_deadline_s", d);
    if call_deadline_s.is_some_and(|s| s > CALL_DEADLINE_LIMIT_S) {
        loc.key("call_deadline_s").err(
            d,
            format!("\"call_deadline_s\" must be at most {CALL_DEADLINE_LIMIT_S} seconds"),
        );
    }
    let max_parallel_tools = match o.get("max_parallel_tools") {
        None => DEFAULT_PARALLEL_TOOLS,
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if (1..=MAX_PARALLEL_TOOLS).contains(&n) => n,
            _ => {
                loc.key("max_parallel_tools").err(
                    d,
                    format!(
                        "\"max_parallel_tools\" must be an integer from 1 to {MAX_PARALLEL_TOOLS}, found {v}"
                    ),
                );
                DEFAULT_PARALLEL_TOOLS
            }
        },
    };
    let vars = o.opt_str_list("context_variables", d);
    for (i, var) in &vars {
        var_refs.push((name.to_owned(), *i, (*var).to_owned()));
    }
    Some(Agent {
        name: name.to_owned(),
        system_message: system_message?.to_owned(),
        max_consecutive_auto_reply: max_auto?,
        auto_tool_mode,
        structured_outputs_required,
        model: model.map(str::to_owned),
        temperature,
        tool_calling,
        context_variables: vars.into_iter().map(|(_, v)| v.to_owned()).collect(),
        max_tokens,
        call_deadline_s,
        max_parallel_tools,
    })
}
