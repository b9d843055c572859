//! Context variables (`context_variables.json`): the shared state that drives handoff conditions,
//! set from defaults, the environment, agent text tokens and UI responses.

use std::collections::{BTreeMap, BTreeSet};

use indexmap::IndexMap;
use serde_json::{Map, Value};

use crate::error::Diag;
use crate::json::{Loc, array, did_you_mean, is_ident, object};
use crate::tools::ToolType;

/// The declared JSON type of a variable, so defaults and environment values are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarType {
    /// `bool`
    Bool,
    /// `str`
    Str,
    /// `int` (JSON integer)
    Int,
    /// `float` (any JSON number)
    Float,
    /// `dict` (JSON object)
    Dict,
    /// `list` (JSON array)
    List,
}

impl VarType {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "bool" => Self::Bool,
            "str" => Self::Str,
            "int" => Self::Int,
            "float" => Self::Float,
            "dict" => Self::Dict,
            "list" => Self::List,
            _ => return None,
        })
    }

    /// The value used when no default is given.
    fn zero(self) -> Value {
        match self {
            Self::Bool => Value::Bool(false),
            Self::Str => Value::String(String::new()),
            Self::Int => Value::from(0),
            Self::Float => Value::from(0.0),
            Self::Dict => Value::Object(Map::new()),
            Self::List => Value::Array(Vec::new()),
        }
    }

    fn accepts(self, v: &Value) -> bool {
        match self {
            Self::Bool => v.is_boolean(),
            Self::Str => v.is_string(),
            Self::Int => v.is_i64() || v.is_u64(),
            Self::Float => v.is_number(),
            Self::Dict => v.is_object(),
            Self::List => v.is_array(),
        }
    }

    /// Converts an environment string to this type (`None` when it does not parse).
    fn parse_env(self, s: &str) -> Option<Value> {
        match self {
            Self::Str => Some(Value::String(s.to_owned())),
            Self::Bool => match s.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Some(Value::Bool(true)),
                "0" | "false" | "no" | "off" | "" => Some(Value::Bool(false)),
                _ => None,
            },
            Self::Int => s.trim().parse::<i64>().ok().map(Value::from),
            Self::Float => s
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number),
            Self::Dict | Self::List => serde_json::from_str::<Value>(s)
                .ok()
                .filter(|v| self.accepts(v)),
        }
    }
}

/// Where a variable's initial value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VarSource {
    /// The manifest default.
    Static,
    /// An environment variable read when a chat starts (falls back to the default).
    Env {
        /// Environment variable name.
        var: String,
    },
}

/// A declared context variable.
#[derive(Debug, Clone, PartialEq)]
pub struct VariableDef {
    /// Name used as `${name}` in conditions.
    pub name: String,
    /// Declared type.
    pub ty: VarType,
    /// Initial value (the type's zero value when not given).
    pub default: Value,
    /// Static or environment.
    pub source: VarSource,
    /// Whether the value may be sent to the browser (false by default for env values, which
    /// are often secrets).
    pub client_visible: bool,
}

impl VariableDef {
    /// The value at chat start: the environment value for env sources, else the default.
    pub fn initial_value(&self) -> Value {
        match &self.source {
            VarSource::Static => self.default.clone(),
            VarSource::Env { var } => std::env::var(var)
                .ok()
                .and_then(|s| self.ty.parse_env(&s))
                .unwrap_or_else(|| self.default.clone()),
        }
    }
}

/// A boolean flipped to true when an agent's whole message equals a token (the spec's
/// `agent_text_equals`, e.g. `NEXT` sets `interview_complete`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DerivedVariable {
    /// Variable name.
    pub name: String,
    /// Agent whose messages are watched.
    pub source_agent: String,
    /// Exact text (after trimming the message) that sets the variable.
    pub trigger_value: String,
    /// Whether the triggering message is hidden from the UI.
    pub ui_hidden: bool,
}

/// Copies a value out of a UI tool's response into a variable, so conditions can react to what
/// the user did (e.g. `action_plan_status` from the `status` of `action_plan`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiResponseTrigger {
    /// Declared variable to set.
    pub variable: String,
    /// UI tool function name.
    pub tool: String,
    /// Dot path into the response object (`status`, `data.action`).
    pub response_key: String,
}

/// The parsed `context_variables.json`.
#[derive(Default)]
pub(crate) struct Context {
    pub variables: Vec<VariableDef>,
    pub derived: Vec<DerivedVariable>,
    pub triggers: Vec<UiResponseTrigger>,
    /// Every declared or derived name, valid or not.
    pub declared: BTreeSet<String>,
}

/// What `context_variables.json` is checked against.
pub(crate) struct ContextCtx<'a> {
    pub agents: Option<&'a BTreeSet<String>>,
    pub tools: Option<&'a BTreeMap<String, Option<ToolType>>>,
}

/// Parses `context_variables.json`; `order` is the key order of `definitions` in the file.
pub(crate) fn parse(
    doc: &Value,
    order: &[String],
    ctx: &ContextCtx<'_>,
    d: &mut Diag,
) -> Option<Context> {
    let root = Loc::root("context_variables.json");
    let top = object(doc, &root, "the document", d)?;
    top.allow_keys(
        &["definitions", "derived_variables", "ui_response_triggers"],
        d,
    );
    let mut out = Context::default();
    let mut def_types: BTreeMap<String, Option<VarType>> = BTreeMap::new();

    if let Some(defs_v) = top.get("definitions") {
        let dloc = root.key("definitions");
        if let Some(defs) = object(defs_v, &dloc, "\"definitions\" (name -> definition)", d) {
            let mut ordered: IndexMap<&String, &Value> = IndexMap::new();
            for n in order {
                if let Some((k, v)) = defs.map.get_key_value(n) {
                    ordered.insert(k, v);
                }
            }
            for (k, v) in defs.map {
                ordered.entry(k).or_insert(v);
            }
            for (name, v) in ordered {
                out.declared.insert(name.clone());
                let loc = dloc.key(name);
                if !is_ident(name) {
                    loc.err(d, format!("variable name \"{name}\" must be an identifier (letters, digits, _), e.g. \"api_key_status\""));
                }
                let (ty, def) = parse_definition(name, v, &loc, d);
                def_types.insert(name.clone(), ty);
                if let Some(def) = def {
                    out.variables.push(def);
                }
            }
        }
    }

    if let Some(der_v) = top.get("derived_variables") {
        let dloc = root.key("derived_variables");
        if let Some(items) = array(der_v, &dloc, "\"derived_variables\"", d) {
            let mut seen = BTreeSet::new();
            for (i, v) in items.iter().enumerate() {
                let loc = dloc.idx(i);
                if let Some(dv) = parse_derived(v, &loc, ctx, &def_types, &mut seen, d) {
                    out.derived.push(dv);
                }
            }
            out.declared.extend(seen);
        }
    }

    if let Some(tr_v) = top.get("ui_response_triggers") {
        let tloc = root.key("ui_response_triggers");
        if let Some(items) = array(tr_v, &tloc, "\"ui_response_triggers\"", d) {
            for (i, v) in items.iter().enumerate() {
                if let Some(t) = parse_trigger(v, &tloc.idx(i), ctx, &def_types, d) {
                    out.triggers.push(t);
                }
            }
        }
    }
    Some(out)
}

fn parse_definition(
    name: &str,
    v: &Value,
    loc: &Loc,
    d: &mut Diag,
) -> (Option<VarType>, Option<VariableDef>) {
    let Some(o) = object(v, loc, &format!("variable \"{name}\""), d) else {
        return (None, None);
    };
    o.allow_keys(
        &["type", "default", "source", "client_visible", "description"],
        d,
    );
    let ty = match o.req_str("type", d) {
        Some(t) => match VarType::parse(t) {
            Some(ty) => Some(ty),
            None => {
                loc.key("type").err(
                    d,
                    format!(
                        "unknown variable type \"{t}\"; use bool, str, int, float, dict or list"
                    ),
                );
                None
            }
        },
        None => None,
    };
    let Some(ty) = ty else { return (None, None) };
    let mut ok = true;
    let default = match o.get("default") {
        None => ty.zero(),
        Some(v) if ty.accepts(v) => v.clone(),
        Some(v) => {
            loc.key("default").err(
                d,
                format!(
                    "default {v} does not match type {}; fix the default or the type",
                    type_label(ty)
                ),
            );
            ok = false;
            Value::Null
        }
    };
    let source = match o.get("source") {
        None => VarSource::Static,
        Some(sv) => match parse_source(sv, &loc.key("source"), d) {
            Some(s) => s,
            None => {
                ok = false;
                VarSource::Static
            }
        },
    };
    let client_visible = o.opt_bool(
        "client_visible",
        !matches!(source, VarSource::Env { .. }),
        d,
    );
    if !ok {
        return (Some(ty), None);
    }
    (
        Some(ty),
        Some(VariableDef {
            name: name.to_owned(),
            ty,
            default,
            source,
            client_visible,
        }),
    )
}

fn type_label(ty: VarType) -> &'static str {
    match ty {
        VarType::Bool => "bool",
        VarType::Str => "str",
        VarType::Int => "int",
        VarType::Float => "float",
        VarType::Dict => "dict",
        VarType::List => "list",
    }
}

fn parse_source(v: &Value, loc: &Loc, d: &mut Diag) -> Option<VarSource> {
    let o = object(v, loc, "\"source\"", d)?;
    match o.req_str("kind", d)? {
        "static" => {
            o.allow_keys(&["kind"], d);
            Some(VarSource::Static)
        }
        "env" => {
            o.allow_keys(&["kind", "var"], d);
            let var = o.req_str("var", d)?;
            if var.is_empty() || var.contains('=') || var.contains('\0') {
                loc.key("var").err(
                    d,
                    format!("\"{var}\" is not a valid environment variable name"),
                );
                return None;
            }
            Some(VarSource::Env {
                var: var.to_owned(),
            })
        }
        other => {
            loc.key("kind").err(
                d,
                format!("source \"kind\" must be \"static\" or \"env\", found \"{other}\""),
            );
            None
        }
    }
}

fn parse_derived(
    v: &Value,
    loc: &Loc,
    ctx: &ContextCtx<'_>,
    def_types: &BTreeMap<String, Option<VarType>>,
    seen: &mut BTreeSet<String>,
    d: &mut Diag,
) -> Option<DerivedVariable> {
    let o = object(v, loc, "a derived variable", d)?;
    o.allow_keys(
        &[
            "name",
            "trigger_type",
            "source_agent",
            "trigger_value",
            "ui_hidden",
            "description",
        ],
        d,
    );
    let mut ok = true;
    let name = o.req_str("name", d);
    if let Some(n) = name {
        if !is_ident(n) {
            loc.key("name").err(
                d,
                format!("variable name \"{n}\" must be an identifier (letters, digits, _)"),
            );
            ok = false;
        }
        if !seen.insert(n.to_owned()) {
            loc.key("name").err(
                d,
                format!("derived variable \"{n}\" is declared twice; keep one"),
            );
            ok = false;
        }
        if let Some(ty) = def_types.get(n)
            && ty.is_some_and(|t| t != VarType::Bool)
        {
            loc.key("name").err(
                    d,
                    format!("\"{n}\" is also in definitions with a non-bool type; derived variables are bool"),
                );
            ok = false;
        }
    }
    match o.req_str("trigger_type", d) {
        Some("agent_text_equals") => {}
        Some(other) => {
            loc.key("trigger_type").err(
                d,
                format!("unsupported \"trigger_type\" \"{other}\"; the only supported type is \"agent_text_equals\""),
            );
            ok = false;
        }
        None => ok = false,
    }
    let agent = o.req_str("source_agent", d);
    if let (Some(a), Some(agents)) = (agent, ctx.agents)
        && !agents.contains(a)
    {
        loc.key("source_agent").err(
            d,
            format!(
                "agent \"{a}\" is not declared in agents.json{}; fix the name",
                did_you_mean(a, agents.iter().map(String::as_str))
            ),
        );
        ok = false;
    }
    let trigger = o.req_str("trigger_value", d);
    if let Some(t) = trigger {
        if t.trim().is_empty() {
            loc.key("trigger_value")
                .err(d, "\"trigger_value\" must not be empty (e.g. \"NEXT\")");
            ok = false;
        } else if t.trim() != t {
            loc.key("trigger_value").err(
                d,
                "\"trigger_value\" has surrounding whitespace and could never match a trimmed message; remove it",
            );
            ok = false;
        }
    }
    let ui_hidden = o.opt_bool("ui_hidden", false, d);
    if !ok {
        return None;
    }
    Some(DerivedVariable {
        name: name?.to_owned(),
        source_agent: agent?.to_owned(),
        trigger_value: trigger?.to_owned(),
        ui_hidden,
    })
}

fn parse_trigger(
    v: &Value,
    loc: &Loc,
    ctx: &ContextCtx<'_>,
    def_types: &BTreeMap<String, Option<VarType>>,
    d: &mut Diag,
) -> Option<UiResponseTrigger> {
    let o = object(v, loc, "a UI response trigger", d)?;
    o.allow_keys(&["variable", "tool", "response_key", "description"], d);
    let mut ok = true;
    let variable = o.req_str("variable", d);
    if let Some(var) = variable
        && !def_types.contains_key(var)
    {
        loc.key("variable").err(
            d,
            format!(
                "variable \"{var}\" is not declared under \"definitions\"{}; declare it",
                did_you_mean(var, def_types.keys().map(String::as_str))
            ),
        );
        ok = false;
    }
    let tool = o.req_str("tool", d);
    if let (Some(t), Some(tools)) = (tool, ctx.tools) {
        match tools.get(t) {
            Some(Some(ToolType::UiTool)) | Some(None) => {}
            Some(Some(ToolType::AgentTool)) => {
                loc.key("tool").err(
                    d,
                    format!("tool \"{t}\" is an Agent_Tool; ui_response_triggers need a UI_Tool"),
                );
                ok = false;
            }
            None => {
                loc.key("tool").err(
                    d,
                    format!(
                        "tool \"{t}\" is not declared in tools.json{}; fix the name",
                        did_you_mean(t, tools.keys().map(String::as_str))
                    ),
                );
                ok = false;
            }
        }
    }
    let key = o.req_str("response_key", d);
    if let Some(k) = key
        && (k.is_empty() || k.split('.').any(str::is_empty))
    {
        loc.key("response_key").err(
            d,
            format!(
                "\"response_key\" \"{k}\" must be a dot path like \"status\" or \"data.action\""
            ),
        );
        ok = false;
    }
    if !ok {
        return None;
    }
    Some(UiResponseTrigger {
        variable: variable?.to_owned(),
        tool: tool?.to_owned(),
        response_key: key?.to_owned(),
    })
}
