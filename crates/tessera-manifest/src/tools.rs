//! Tools (`tools.json`): what each agent can call, how it is implemented, and how UI tools are
//! displayed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::error::Diag;
use crate::json::{Loc, array, did_you_mean, is_pascal_case, is_snake_case, object};
use crate::models::{CompiledModel, check_object_schema};

/// Which execution model a tool follows (the spec's `tool_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolType {
    /// `UI_Tool`: shown to the user in the browser; the user's response is the result.
    UiTool,
    /// `Agent_Tool`: run by the server when the agent calls it.
    AgentTool,
}

/// Where a UI tool's component is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisplayMode {
    /// Full-screen overlay for complex artifacts.
    Artifact,
    /// Embedded in the chat flow for quick inputs.
    Inline,
}

/// The front-end component a UI tool renders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiSpec {
    /// PascalCase React component name.
    pub component: String,
    /// Overlay or inline.
    pub mode: DisplayMode,
}

/// How Tessera runs a tool without Python.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolImpl {
    /// A tool compiled into the server, looked up by name.
    Builtin {
        /// Registry name of the built-in tool.
        name: String,
    },
    /// A tool reached by POSTing the arguments as JSON to a URL.
    Http {
        /// `http://` or `https://` endpoint.
        url: String,
        /// Request timeout in seconds (server default when absent).
        timeout_s: Option<f64>,
    },
}

/// One tool of a workflow, as declared in `tools.json` and completed at load.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    /// Owning agent: only it is offered (or auto-invokes) this tool.
    pub agent: String,
    /// snake_case name, unique per workflow: what the model calls.
    pub function: String,
    /// Legacy file name from the spec (informational; its stem equals `function`).
    pub file: Option<String>,
    /// Purpose statement shown to the model (at most 140 characters).
    pub description: String,
    /// UI tool or agent tool.
    pub tool_type: ToolType,
    /// Component and display mode; `Some` exactly for UI tools.
    pub ui: Option<UiSpec>,
    /// How to run it. Required for agent tools; for UI tools an optional pre-step whose result
    /// is merged into the UI payload.
    pub implementation: Option<ToolImpl>,
    /// JSON Schema (type object) of the arguments: inline, derived from the owner's registry
    /// model for UI tools, or an empty object schema.
    pub parameters: Arc<Value>,
    /// Keys of the UI response `data` whose values must never reach the agent or the logs.
    pub secret_fields: Vec<String>,
    /// Names of collected secrets (some UI tool's `secret_fields`) this tool may read from
    /// the chat's vault; every other tool gets none.
    pub uses_secrets: Vec<String>,
    /// Per-tool timeout in seconds for the UI wait or the tool run.
    pub timeout_s: Option<f64>,
}

const TOOL_KEYS: &[&str] = &[
    "agent",
    "file",
    "function",
    "description",
    "tool_type",
    "ui",
    "impl",
    "parameters",
    "secret_fields",
    "uses_secrets",
    "timeout_s",
];

/// Context needed to check tools against the rest of the workflow.
pub(crate) struct ToolCtx<'a> {
    /// Declared agent names, or `None` when agents.json is unreadable.
    pub agents: Option<&'a BTreeSet<String>>,
    /// Registry agent -> model name.
    pub registry: &'a BTreeMap<String, String>,
    /// Compiled models.
    pub models: &'a BTreeMap<String, CompiledModel>,
}

/// The parsed `tools.json`.
pub(crate) struct Tools {
    pub tools: Vec<ToolDef>,
    /// Every function name with its tool type, valid entry or not.
    pub declared: BTreeMap<String, Option<ToolType>>,
    /// (owner agent, entry index) of every entry declared as a UI tool, valid or not.
    pub ui_owners: Vec<(String, usize)>,
}

/// Parses `tools.json`.
pub(crate) fn parse(doc: &Value, ctx: &ToolCtx<'_>, d: &mut Diag) -> Tools {
    let mut out = Tools {
        tools: Vec::new(),
        declared: BTreeMap::new(),
        ui_owners: Vec::new(),
    };
    let root = Loc::root("tools.json");
    let Some(top) = object(doc, &root, "the document", d) else {
        return out;
    };
    top.allow_keys(&["tools"], d);
    let Some(tools_v) = top.get("tools") else {
        root.err(
            d,
            "missing required key \"tools\" (an array of tool definitions)",
        );
        return out;
    };
    let tloc = root.key("tools");
    let Some(items) = array(tools_v, &tloc, "\"tools\"", d) else {
        return out;
    };
    for (i, v) in items.iter().enumerate() {
        let loc = tloc.idx(i);
        if v.get("tool_type").and_then(Value::as_str) == Some("UI_Tool")
            && let Some(a) = v.get("agent").and_then(Value::as_str)
        {
            out.ui_owners.push((a.to_owned(), i));
        }
        if let Some(t) = parse_tool(v, &loc, ctx, &mut out.declared, d) {
            out.tools.push(t);
        }
    }
    check_uses_secrets(items, &tloc, d);
    out
}

/// Every `uses_secrets` name must be collected by some tool's `secret_fields`: a typo would
/// otherwise silently give the tool nothing, and an undeclared name hints at a tool reaching
/// for a secret the workflow never meant to share.
fn check_uses_secrets(items: &[Value], tloc: &Loc, d: &mut Diag) {
    let collected: BTreeSet<&str> = items
        .iter()
        .filter_map(|v| v.get("secret_fields").and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (i, v) in items.iter().enumerate() {
        let Some(Value::Array(names)) = v.get("uses_secrets") else {
            continue;
        };
        for (j, name) in names.iter().enumerate() {
            if let Some(name) = name.as_str()
                && !name.trim().is_empty()
                && !collected.contains(name)
            {
                tloc.idx(i).key("uses_secrets").idx(j).err(
                    d,
                    format!(
                        "secret \"{name}\" is not collected by any tool's \"secret_fields\"{}; declare it there or remove it",
                        did_you_mean(name, collected.iter().copied())
                    ),
                );
            }
        }
    }
}

fn parse_tool(
    v: &Value,
    loc: &Loc,
    ctx: &ToolCtx<'_>,
    declared: &mut BTreeMap<String, Option<ToolType>>,
    d: &mut Diag,
) -> Option<ToolDef> {
    let o = object(v, loc, "a tool definition", d)?;
    o.allow_keys(TOOL_KEYS, d);
    let mut ok = true;

    let agent = o.req_str("agent", d);
    if let (Some(a), Some(agents)) = (agent, ctx.agents)
        && !agents.contains(a)
    {
        loc.key("agent").err(
            d,
            format!(
                "agent \"{a}\" is not declared in agents.json{}; fix the name or add the agent",
                did_you_mean(a, agents.iter().map(String::as_str))
            ),
        );
        ok = false;
    }

    let tool_type = match o.req_str("tool_type", d) {
        Some("UI_Tool") => Some(ToolType::UiTool),
        Some("Agent_Tool") => Some(ToolType::AgentTool),
        Some(other) => {
            loc.key("tool_type").err(
                d,
                format!("\"tool_type\" must be \"UI_Tool\" or \"Agent_Tool\" (with underscore), found \"{other}\""),
            );
            None
        }
        None => None,
    };

    let function = o.req_str("function", d);
    if let Some(f) = function {
        if !is_snake_case(f) {
            loc.key("function").err(
                d,
                format!("\"function\" \"{f}\" must be snake_case (e.g. \"request_api_key\")"),
            );
            ok = false;
        }
        if declared.contains_key(f) {
            loc.key("function").err(
                d,
                format!("tool \"{f}\" is declared twice; function names must be unique"),
            );
            ok = false;
        } else {
            declared.insert(f.to_owned(), tool_type);
        }
    }

    let file = o.opt_str("file", d);
    if let (Some(file), Some(f)) = (file, function) {
        let stem = file.rsplit_once('.').map_or(file, |(s, _)| s);
        if stem != f {
            loc.key("file").err(
                d,
                format!("file \"{file}\" does not match function \"{f}\": the file stem must equal the function name (e.g. \"{f}.py\")"),
            );
            ok = false;
        } else if file.ends_with(".py") && !is_snake_case(stem) {
            loc.key("file")
                .err(d, format!("file \"{file}\" must be snake_case"));
            ok = false;
        }
    }

    let description = o.req_str("description", d);
    match description {
        Some(s) if s.trim().is_empty() => {
            loc.key("description").err(
                d,
                "\"description\" must not be empty; say what the tool does for the model",
            );
            ok = false;
        }
        Some(s) if s.chars().count() > 140 => {
            loc.key("description").err(
                d,
                format!(
                    "\"description\" is {} characters; shorten it to at most 140",
                    s.chars().count()
                ),
            );
            ok = false;
        }
        _ => {}
    }

    // ui
    let ui = match (tool_type, o.get("ui")) {
        (Some(ToolType::UiTool), None) => {
            loc.err(d, "a UI_Tool needs \"ui\": {\"component\": \"PascalCase\", \"mode\": \"artifact\" | \"inline\"}");
            ok = false;
            None
        }
        (Some(ToolType::UiTool), Some(u)) => {
            let r = parse_ui(u, &loc.key("ui"), d);
            ok &= r.is_some();
            r
        }
        (Some(ToolType::AgentTool), Some(_)) => {
            loc.key("ui").err(
                d,
                "an Agent_Tool has no UI: set \"ui\" to null or remove it",
            );
            ok = false;
            None
        }
        _ => None,
    };

    // impl
    let implementation = match o.get("impl") {
        Some(v) => {
            let r = parse_impl(v, &loc.key("impl"), d);
            ok &= r.is_some();
            r
        }
        None => {
            if tool_type == Some(ToolType::AgentTool) {
                loc.err(
                    d,
                    "an Agent_Tool needs \"impl\": {\"kind\": \"builtin\", \"name\": ...} or {\"kind\": \"http\", \"url\": ...}",
                );
                ok = false;
            }
            None
        }
    };

    // parameters
    let parameters = match o.get("parameters") {
        Some(p) => {
            if check_object_schema(p, &loc.key("parameters"), d) {
                Some(Arc::new(p.clone()))
            } else {
                ok = false;
                None
            }
        }
        None => match tool_type {
            Some(ToolType::AgentTool) => {
                loc.err(
                    d,
                    "an Agent_Tool needs \"parameters\" (a JSON Schema object; use {\"type\": \"object\", \"properties\": {}} for none)",
                );
                ok = false;
                None
            }
            _ => agent
                .and_then(|a| ctx.registry.get(a))
                .and_then(|m| ctx.models.get(m))
                .map(|m| Arc::clone(&m.schema)),
        },
    };

    // secret_fields
    let secret_fields: Vec<String> = o
        .opt_str_list("secret_fields", d)
        .into_iter()
        .map(|(_, s)| s.to_owned())
        .collect();
    if !secret_fields.is_empty() && tool_type == Some(ToolType::AgentTool) {
        loc.key("secret_fields").err(
            d,
            "\"secret_fields\" applies only to UI_Tool responses; remove it from this Agent_Tool",
        );
        ok = false;
    }

    let uses_secrets: Vec<String> = o
        .opt_str_list("uses_secrets", d)
        .into_iter()
        .map(|(_, s)| s.to_owned())
        .collect();

    let timeout_s = o.opt_positive("timeout_s", d);
    if o.get("timeout_s").is_some() && timeout_s.is_none() {
        ok = false;
    }

    if !ok {
        return None;
    }
    Some(ToolDef {
        agent: agent?.to_owned(),
        function: function?.to_owned(),
        file: file.map(str::to_owned),
        description: description?.to_owned(),
        tool_type: tool_type?,
        ui,
        implementation,
        parameters: parameters
            .unwrap_or_else(|| Arc::new(json!({"type": "object", "properties": {}}))),
        secret_fields,
        uses_secrets,
        timeout_s,
    })
}

fn parse_ui(v: &Value, loc: &Loc, d: &mut Diag) -> Option<UiSpec> {
    let o = object(v, loc, "\"ui\"", d)?;
    o.allow_keys(&["component", "mode"], d);
    let component = o.req_str("component", d);
    if let Some(c) = component
        && !is_pascal_case(c)
    {
        loc.key("component").err(
            d,
            format!("\"component\" \"{c}\" must be a PascalCase React component name"),
        );
        return None;
    }
    let mode = match o.req_str("mode", d) {
        Some("artifact") => Some(DisplayMode::Artifact),
        Some("inline") => Some(DisplayMode::Inline),
        Some(other) => {
            loc.key("mode").err(
                d,
                format!("\"mode\" must be \"artifact\" or \"inline\", found \"{other}\""),
            );
            None
        }
        None => None,
    };
    Some(UiSpec {
        component: component?.to_owned(),
        mode: mode?,
    })
}

fn parse_impl(v: &Value, loc: &Loc, d: &mut Diag) -> Option<ToolImpl> {
    let o = object(v, loc, "\"impl\"", d)?;
    match o.req_str("kind", d)? {
        "builtin" => {
            o.allow_keys(&["kind", "name"], d);
            let name = o.req_str("name", d)?;
            if name.trim().is_empty() {
                loc.key("name")
                    .err(d, "the built-in tool \"name\" must not be empty");
                return None;
            }
            Some(ToolImpl::Builtin {
                name: name.to_owned(),
            })
        }
        "http" => {
            o.allow_keys(&["kind", "url", "timeout_s"], d);
            let url = o.req_str("url", d);
            let timeout_s = o.opt_positive("timeout_s", d);
            if o.get("timeout_s").is_some() && timeout_s.is_none() {
                return None;
            }
            let url = url?;
            if !valid_http_url(url) {
                loc.key("url").err(
                    d,
                    format!(
                        "\"url\" \"{url}\" must be an absolute http:// or https:// URL with a host"
                    ),
                );
                return None;
            }
            Some(ToolImpl::Http {
                url: url.to_owned(),
                timeout_s,
            })
        }
        other => {
            loc.key("kind").err(
                d,
                format!("\"kind\" must be \"builtin\" or \"http\", found \"{other}\""),
            );
            None
        }
    }
}

fn valid_http_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    let Some(rest) = rest else { return false };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    !host.is_empty()
        && !host.starts_with(':')
        && !url.chars().any(|c| c.is_whitespace() || c.is_control())
}
