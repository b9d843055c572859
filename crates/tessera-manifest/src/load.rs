//! Reading a workflow folder: parse each manifest file, check every rule, cross-check the files
//! against each other, and build a [`Workflow`] only when nothing is wrong.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use crate::error::{Diag, ManifestErrors};
use crate::json::{Loc, did_you_mean, object};
use crate::workflow::{StartupMode, Workflow};
use crate::{agents, context, demo, handoffs, mcp, models, tools};

/// Manifest files larger than this are rejected rather than read into memory.
const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// Loads and validates the workflow in `dir`, reporting every problem found at once.
pub fn load_workflow(dir: &Path) -> Result<Workflow, ManifestErrors> {
    let folder = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string());
    let mut d = Diag::new(folder);

    let wf_doc = read_json(dir, "workflow.json", true, &mut d);
    let agents_doc = read_json(dir, "agents.json", true, &mut d);
    let so_doc = read_json(dir, "structured_outputs.json", false, &mut d);
    let tools_doc = read_json(dir, "tools.json", false, &mut d);
    let ctx_doc = read_json(dir, "context_variables.json", false, &mut d);
    let handoffs_doc = read_json(dir, "handoffs.json", false, &mut d);
    let demo_doc = read_json(dir, "demo.json", false, &mut d);
    let mcp_doc = read_json(dir, "mcp.json", false, &mut d);
    let mut versioned = vec![
        &wf_doc,
        &agents_doc,
        &so_doc,
        &tools_doc,
        &ctx_doc,
        &handoffs_doc,
        &demo_doc,
    ];
    // Only when present: workflows without MCP keep the versions their stored chats pinned.
    if !matches!(mcp_doc, Doc::Absent) {
        versioned.push(&mcp_doc);
    }
    let version = content_version(&versioned);

    // agents.json
    let parsed_agents = match &agents_doc {
        Doc::Ok(v, text) => agents::parse(v, &key_order::<AgentsOrder>(text, |o| o.agents), &mut d),
        _ => None,
    };
    let agent_names: Option<BTreeSet<String>> = parsed_agents.as_ref().map(|a| a.declared.clone());

    // structured_outputs.json
    let so = match &so_doc {
        Doc::Ok(v, _) => Some(models::parse(v, agent_names.as_ref(), &mut d)),
        Doc::Absent => Some(models::Models {
            models: BTreeMap::new(),
            registry: BTreeMap::new(),
            declared: BTreeSet::new(),
            registry_agents: BTreeSet::new(),
        }),
        Doc::Broken => None,
    };

    // tools.json
    let no_models = BTreeMap::new();
    let no_registry = BTreeMap::new();
    let tctx = tools::ToolCtx {
        agents: agent_names.as_ref(),
        registry: so.as_ref().map_or(&no_registry, |s| &s.registry),
        models: so.as_ref().map_or(&no_models, |s| &s.models),
    };
    let tools = match &tools_doc {
        Doc::Ok(v, _) => Some(tools::parse(v, &tctx, &mut d)),
        Doc::Absent => Some(tools::Tools {
            tools: Vec::new(),
            declared: BTreeMap::new(),
            ui_owners: Vec::new(),
        }),
        Doc::Broken => None,
    };

    // context_variables.json
    let cctx = context::ContextCtx {
        agents: agent_names.as_ref(),
        tools: tools.as_ref().map(|t| &t.declared),
    };
    let ctx = match &ctx_doc {
        Doc::Ok(v, text) => context::parse(
            v,
            &key_order::<DefsOrder>(text, |o| o.definitions),
            &cctx,
            &mut d,
        ),
        Doc::Absent => Some(context::Context::default()),
        Doc::Broken => None,
    };
    let var_names = ctx.as_ref().map(|c| &c.declared);

    // handoffs.json
    let handoff_rules = match &handoffs_doc {
        Doc::Ok(v, _) => handoffs::parse(v, agent_names.as_ref(), var_names, &mut d),
        _ => Vec::new(),
    };

    // mcp.json
    let mcp = match &mcp_doc {
        Doc::Ok(v, _) => {
            let functions: BTreeSet<String> = tools
                .as_ref()
                .map(|t| t.declared.keys().cloned().collect())
                .unwrap_or_default();
            mcp::parse(v, agent_names.as_ref(), &functions, &mut d)
        }
        _ => mcp::McpDecls::default(),
    };

    // demo.json
    if let Doc::Ok(v, _) = &demo_doc {
        demo::check(v, agent_names.as_ref(), &mut d);
    }

    // workflow.json
    let header = match &wf_doc {
        Doc::Ok(v, _) => parse_header(v, agent_names.as_ref(), &mut d),
        _ => None,
    };

    // Cross-file checks on agents.
    if let Some(pa) = &parsed_agents {
        let aloc = Loc::root("agents.json").key("agents");
        for (name, agent) in &pa.agents {
            let loc = aloc.key(name);
            let has_model = so.as_ref().is_none_or(|s| s.registry_agents.contains(name));
            if agent.auto_tool_mode {
                if !has_model {
                    loc.key("auto_tool_mode").err(
                        &mut d,
                        format!("auto_tool_mode agent \"{name}\" needs a model in the structured_outputs.json registry; add \"{name}\": \"<Model>\""),
                    );
                }
                if !agent.structured_outputs_required {
                    loc.key("structured_outputs_required").err(
                        &mut d,
                        "auto_tool_mode requires \"structured_outputs_required\": true so the output is validated before the UI tool runs",
                    );
                }
                if let Some(t) = &tools {
                    let n = t.ui_owners.iter().filter(|(a, _)| a == name).count();
                    if n != 1 {
                        loc.key("auto_tool_mode").err(
                            &mut d,
                            format!("auto_tool_mode agent \"{name}\" must own exactly one UI_Tool in tools.json, found {n}"),
                        );
                    }
                }
            } else if agent.structured_outputs_required && !has_model {
                loc.key("structured_outputs_required").err(
                    &mut d,
                    format!("\"{name}\" requires structured outputs but has no model in the structured_outputs.json registry; register one"),
                );
            }
        }
        if let Some(t) = &tools {
            for (owner, i) in &t.ui_owners {
                if pa.agents.get(owner).is_some_and(|a| !a.auto_tool_mode) {
                    Loc::root("tools.json").key("tools").idx(*i).key("agent").err(
                        &mut d,
                        format!("UI_Tool owner \"{owner}\" must have \"auto_tool_mode\": true in agents.json (UI tools are invoked from structured output)"),
                    );
                }
            }
        }
        if let Some(vars) = var_names {
            for (agent, i, var) in &pa.var_refs {
                if !vars.contains(var) {
                    aloc.key(agent).key("context_variables").idx(*i).err(
                        &mut d,
                        format!(
                            "context variable \"{var}\" is not declared in context_variables.json{}; declare it or remove it",
                            did_you_mean(var, vars.iter().map(String::as_str))
                        ),
                    );
                }
            }
        }
    }

    if !d.is_empty() {
        return Err(d.into_errors());
    }
    let (Some(header), Some(pa), Some(so), Some(tools), Some(ctx)) =
        (header, parsed_agents, so, tools, ctx)
    else {
        // Unreachable when no error was recorded; reported rather than panicking.
        d.err(
            "workflow.json",
            "",
            "the workflow could not be assembled; fix the errors above",
        );
        return Err(d.into_errors());
    };
    Ok(Workflow {
        name: header.name,
        description: header.description,
        initial_agent: header.initial_agent,
        max_turns: header.max_turns,
        human_in_the_loop: header.human_in_the_loop,
        initial_message: header.initial_message,
        startup_mode: header.startup_mode,
        listed: header.listed,
        agents: pa.agents,
        tools: tools.tools,
        models: so.models,
        registry: so.registry,
        variables: ctx.variables,
        derived: ctx.derived,
        ui_response_triggers: ctx.triggers,
        handoffs: handoff_rules,
        mcp,
        dir: dir.to_path_buf(),
        version,
    })
}

/// The files a workflow version consists of, in the order [`load_workflow`] reads them.
pub const MANIFEST_FILES: &[&str] = &[
    "workflow.json",
    "agents.json",
    "structured_outputs.json",
    "tools.json",
    "context_variables.json",
    "handoffs.json",
    "demo.json",
    "mcp.json",
];

/// 16 hex digits of FNV-1a (64-bit) over the manifest files' text, in [`MANIFEST_FILES`]
/// order, each absent file marked as such. Stable across builds and platforms (unlike std's
/// hasher), so a restart computes the same version for the same files. Not a security hash:
/// it only tells versions of one workflow apart.
fn content_version(docs: &[&Doc]) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut hash = OFFSET;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    for doc in docs {
        match doc {
            Doc::Ok(_, text) => {
                feed(&(text.len() as u64).to_le_bytes());
                feed(text.as_bytes());
            }
            Doc::Absent | Doc::Broken => feed(&u64::MAX.to_le_bytes()),
        }
    }
    format!("{hash:016x}")
}

/// Loads every workflow under `root` (each subfolder holding a `workflow.json`), sorted by
/// folder name, so one bad workflow does not hide the others.
pub fn load_workflows(root: &Path) -> Vec<LoadedWorkflow> {
    let mut dirs: Vec<(String, PathBuf)> = match std::fs::read_dir(root) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_dir() && p.join("workflow.json").is_file())
            .map(|p| {
                (
                    p.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    p,
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    dirs.sort();
    dirs.into_iter()
        .map(|(name, p)| (name, load_workflow(&p)))
        .collect()
}

/// One workflow folder's name and what loading it gave.
pub type LoadedWorkflow = (String, Result<Workflow, ManifestErrors>);

/// Why a workflows directory yields no workflows at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkflowDirError {
    /// Nothing at that path.
    #[error("{0} does not exist")]
    NotFound(PathBuf),
    /// A file (or something unreadable) rather than a folder.
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    /// A folder, but neither a workflow folder nor a folder of them.
    #[error(
        "no workflows found in {0}: expected a workflow folder (with workflow.json) or a folder of workflow folders"
    )]
    NoWorkflows(PathBuf),
}

/// What `serve`, `validate` and `test` all accept as a workflows directory: a workflow folder
/// itself (holding `workflow.json`) or a folder of workflow folders. Every workflow found is
/// loaded, valid or not, so callers can report every invalid one.
pub fn load_workflow_dir(dir: &Path) -> Result<Vec<LoadedWorkflow>, WorkflowDirError> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(WorkflowDirError::NotFound(dir.to_path_buf()));
        }
        Ok(m) if m.is_dir() => {}
        _ => return Err(WorkflowDirError::NotADirectory(dir.to_path_buf())),
    }
    if dir.join("workflow.json").is_file() {
        let name = dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        return Ok(vec![(name, load_workflow(dir))]);
    }
    let found = load_workflows(dir);
    if found.is_empty() {
        return Err(WorkflowDirError::NoWorkflows(dir.to_path_buf()));
    }
    Ok(found)
}

/// The outcome of reading one manifest file.
enum Doc {
    /// Parsed, with its text (for key order).
    Ok(Value, String),
    /// Optional file not present.
    Absent,
    /// Present but unreadable or invalid (already reported).
    Broken,
}

fn read_json(dir: &Path, file: &'static str, required: bool, d: &mut Diag) -> Doc {
    let path = dir.join(file);
    let loc = Loc::root(file);
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if required {
                loc.err(
                    d,
                    format!("{file} is missing; every workflow folder needs one"),
                );
                return Doc::Broken;
            }
            return Doc::Absent;
        }
        Err(e) => {
            loc.err(d, format!("cannot read {file}: {e}"));
            return Doc::Broken;
        }
        Ok(m) if !m.is_file() => {
            loc.err(d, format!("{file} is not a regular file"));
            return Doc::Broken;
        }
        Ok(m) if m.len() > MAX_FILE_BYTES => {
            loc.err(
                d,
                format!("{file} is larger than {MAX_FILE_BYTES} bytes; manifests must be small"),
            );
            return Doc::Broken;
        }
        Ok(_) => {}
    }
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            loc.err(d, format!("cannot read {file}: {e}"));
            return Doc::Broken;
        }
    };
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(_) => {
            loc.err(d, format!("{file} is not valid UTF-8; save it as UTF-8"));
            return Doc::Broken;
        }
    };
    match serde_json::from_str::<Value>(&text) {
        Ok(v) => Doc::Ok(v, text),
        Err(e) => {
            loc.err(
                d,
                format!(
                    "invalid JSON at line {} column {}: {}; fix the syntax",
                    e.line(),
                    e.column(),
                    strip_position(&e.to_string())
                ),
            );
            Doc::Broken
        }
    }
}

/// serde_json appends " at line X column Y" to its messages; we report the position ourselves.
fn strip_position(msg: &str) -> &str {
    msg.rfind(" at line ")
        .map_or(msg, |i| msg.get(..i).unwrap_or(msg))
}

#[derive(Deserialize)]
struct AgentsOrder {
    agents: IndexMap<String, IgnoredAny>,
}

#[derive(Deserialize)]
struct DefsOrder {
    #[serde(default)]
    definitions: IndexMap<String, IgnoredAny>,
}

/// Key order of one object in the file (serde_json's map is sorted); empty when unavailable.
fn key_order<T: for<'de> Deserialize<'de>>(
    text: &str,
    pick: impl FnOnce(T) -> IndexMap<String, IgnoredAny>,
) -> Vec<String> {
    serde_json::from_str::<T>(text)
        .map(|t| pick(t).into_keys().collect())
        .unwrap_or_default()
}

/// The parsed `workflow.json`.
struct Header {
    name: String,
    description: String,
    initial_agent: String,
    max_turns: u32,
    human_in_the_loop: bool,
    initial_message: Option<String>,
    startup_mode: StartupMode,
    listed: bool,
}

fn parse_header(v: &Value, agents: Option<&BTreeSet<String>>, d: &mut Diag) -> Option<Header> {
    let loc = Loc::root("workflow.json");
    let o = object(v, &loc, "the document", d)?;
    o.allow_keys(
        &[
            "name",
            "description",
            "initial_agent",
            "max_turns",
            "human_in_the_loop",
            "initial_message",
            "startup_mode",
            "listed",
        ],
        d,
    );
    let name = o.req_str("name", d);
    if name.is_some_and(|n| n.trim().is_empty()) {
        loc.key("name").err(d, "\"name\" must not be empty");
    }
    let description = o.req_str("description", d);
    let initial_agent = o.req_str("initial_agent", d);
    if let (Some(a), Some(agents)) = (initial_agent, agents)
        && !agents.contains(a)
    {
        loc.key("initial_agent").err(
            d,
            format!(
                "initial_agent \"{a}\" is not declared in agents.json{}; use one of: {}",
                did_you_mean(a, agents.iter().map(String::as_str)),
                agents.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        );
    }
    let max_turns = o.req_u32("max_turns", d);
    if max_turns == Some(0) {
        loc.key("max_turns")
            .err(d, "\"max_turns\" must be greater than 0");
    }
    let human = o.req_bool("human_in_the_loop", d);
    let initial_message = o.opt_str("initial_message", d);
    let listed = o.opt_bool("listed", true, d);
    let startup_mode = match o.req_str("startup_mode", d) {
        Some("UserDriven") => Some(StartupMode::UserDriven),
        Some("AgentDriven") => Some(StartupMode::AgentDriven),
        Some(other) => {
            loc.key("startup_mode").err(
                d,
                format!(
                    "\"startup_mode\" must be \"UserDriven\" or \"AgentDriven\", found \"{other}\""
                ),
            );
            None
        }
        None => None,
    };
    Some(Header {
        name: name?.to_owned(),
        description: description?.to_owned(),
        initial_agent: initial_agent?.to_owned(),
        max_turns: max_turns?,
        human_in_the_loop: human?,
        initial_message: initial_message.map(str::to_owned),
        startup_mode: startup_mode?,
        listed,
    })
}
