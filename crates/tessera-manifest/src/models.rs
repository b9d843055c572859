//! Structured-output models (`structured_outputs.json`): the Pydantic-like type notation is
//! compiled once at load into JSON Schema 2020-12 documents with a prebuilt validator.
//!
//! Decisions:
//! - A field is `required` unless its type is `Optional[...]` or it has a `default`.
//! - `additionalProperties` is left open: like Pydantic's default (`extra="ignore"`), extra keys
//!   in an agent's output are tolerated and simply not passed on.
//! - References to other models are emitted as `{"$ref": "#/$defs/Name"}`, with every
//!   transitively referenced model copied into the root's `$defs`; reference cycles are errors.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::error::Diag;
use crate::json::{Loc, array, did_you_mean, object};

/// Deepest type nesting accepted in a field type, so hostile input cannot overflow the stack.
const MAX_TYPE_DEPTH: usize = 32;

/// A model compiled to JSON Schema with its validator built once, so validating each agent
/// output is cheap and cannot fail on a bad schema at run time.
#[derive(Clone)]
pub struct CompiledModel {
    /// Model name from `structured_outputs.json`.
    pub name: String,
    /// The JSON Schema 2020-12 document (self-contained: references live in `$defs`).
    pub schema: Arc<Value>,
    /// The validator built from `schema`.
    pub validator: Arc<jsonschema::Validator>,
}

impl fmt::Debug for CompiledModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledModel")
            .field("name", &self.name)
            .field("schema", &self.schema)
            .finish()
    }
}

impl CompiledModel {
    /// Checks an agent's output against the model; the messages (one per violation, prefixed
    /// with the instance path) are fed back to the agent so it can correct itself.
    pub fn validate(&self, value: &Value) -> Result<(), Vec<String>> {
        let errors: Vec<String> = self
            .validator
            .iter_errors(value)
            .map(|e| {
                let mut path = e.instance_path().to_string();
                if let jsonschema::error::ValidationErrorKind::Required { property } = e.kind()
                    && let Some(p) = property.as_str()
                {
                    path.push('/');
                    path.push_str(&p.replace('~', "~0").replace('/', "~1"));
                }
                if path.is_empty() {
                    path.push('/');
                }
                let mut msg = e.to_string();
                if msg.chars().count() > 300 {
                    msg = msg.chars().take(300).collect::<String>() + "…";
                }
                format!("{path}: {msg}")
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// A parsed field type.
#[derive(Debug, Clone, PartialEq)]
enum Ty {
    Str,
    Int,
    Float,
    Bool,
    Dict(Option<Box<Ty>>),
    List(Option<Box<Ty>>),
    Optional(Box<Ty>),
    Literal(Vec<Value>),
    Ref(String),
}

const BUILTIN_TYPES: &[&str] = &[
    "str", "int", "float", "bool", "dict", "list", "Optional", "Literal",
];

#[derive(Debug, Clone, PartialEq)]
enum TTok {
    Ident(String),
    Lit(Value),
    Open,
    Close,
    Comma,
}

fn lex_type(src: &str) -> Result<Vec<TTok>, String> {
    let mut out = Vec::new();
    let mut it = src.chars().peekable();
    while let Some(&c) = it.peek() {
        match c {
            c if c.is_whitespace() => {
                it.next();
            }
            '[' => {
                it.next();
                out.push(TTok::Open);
            }
            ']' => {
                it.next();
                out.push(TTok::Close);
            }
            ',' => {
                it.next();
                out.push(TTok::Comma);
            }
            '"' | '\'' => {
                it.next();
                let mut s = String::new();
                loop {
                    match it.next() {
                        Some(ch) if ch == c => break,
                        Some('\\') => match it.next() {
                            Some(ch) => s.push(ch),
                            None => return Err("unterminated string in Literal[...]".into()),
                        },
                        Some(ch) => s.push(ch),
                        None => return Err("unterminated string in Literal[...]".into()),
                    }
                }
                out.push(TTok::Lit(Value::String(s)));
            }
            c if c.is_ascii_digit() || c == '-' => {
                let mut t = String::new();
                while let Some(&ch) = it.peek() {
                    if ch.is_ascii_digit() || ch == '-' {
                        t.push(ch);
                        it.next();
                    } else {
                        break;
                    }
                }
                let n: i64 = t
                    .parse()
                    .map_err(|_| format!("invalid integer \"{t}\" in Literal[...]"))?;
                out.push(TTok::Lit(Value::from(n)));
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut t = String::new();
                while let Some(&ch) = it.peek() {
                    if ch.is_ascii_alphanumeric() || ch == '_' || ch == '.' {
                        t.push(ch);
                        it.next();
                    } else {
                        break;
                    }
                }
                out.push(TTok::Ident(t));
            }
            other => return Err(format!("unexpected character {other:?}")),
        }
    }
    Ok(out)
}

struct TyParser {
    toks: Vec<TTok>,
    pos: usize,
}

impl TyParser {
    fn next(&mut self) -> Option<TTok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn peek(&self) -> Option<&TTok> {
        self.toks.get(self.pos)
    }

    fn expect(&mut self, want: TTok, what: &str) -> Result<(), String> {
        if self.next() == Some(want) {
            Ok(())
        } else {
            Err(format!("expected {what}"))
        }
    }

    fn ty(&mut self, depth: usize) -> Result<Ty, String> {
        if depth > MAX_TYPE_DEPTH {
            return Err(format!("type nested deeper than {MAX_TYPE_DEPTH} levels"));
        }
        let name = match self.next() {
            Some(TTok::Ident(n)) => n,
            _ => return Err("expected a type name".into()),
        };
        let has_args = self.peek() == Some(&TTok::Open);
        match (name.as_str(), has_args) {
            ("str", false) => Ok(Ty::Str),
            ("int", false) => Ok(Ty::Int),
            ("float", false) => Ok(Ty::Float),
            ("bool", false) => Ok(Ty::Bool),
            ("dict" | "Dict", false) => Ok(Ty::Dict(None)),
            ("list" | "List", false) => Ok(Ty::List(None)),
            ("list" | "List", true) => {
                self.pos += 1;
                let inner = self.ty(depth + 1)?;
                self.expect(TTok::Close, "\"]\" after list[T]")?;
                Ok(Ty::List(Some(Box::new(inner))))
            }
            ("dict" | "Dict", true) => {
                self.pos += 1;
                if self.next() != Some(TTok::Ident("str".into())) {
                    return Err("dict keys must be str: write dict[str, T]".into());
                }
                self.expect(TTok::Comma, "\",\" in dict[str, T]")?;
                let inner = self.ty(depth + 1)?;
                self.expect(TTok::Close, "\"]\" after dict[str, T]")?;
                Ok(Ty::Dict(Some(Box::new(inner))))
            }
            ("Optional", true) => {
                self.pos += 1;
                let inner = self.ty(depth + 1)?;
                self.expect(TTok::Close, "\"]\" after Optional[T]")?;
                Ok(Ty::Optional(Box::new(inner)))
            }
            ("Literal", true) => {
                self.pos += 1;
                let mut values = Vec::new();
                loop {
                    match self.next() {
                        Some(TTok::Lit(v)) => values.push(v),
                        Some(TTok::Ident(w)) if w == "True" || w == "true" => {
                            values.push(Value::Bool(true))
                        }
                        Some(TTok::Ident(w)) if w == "False" || w == "false" => {
                            values.push(Value::Bool(false))
                        }
                        _ => {
                            return Err(
                                "Literal[...] takes quoted strings, integers or True/False".into(),
                            );
                        }
                    }
                    match self.next() {
                        Some(TTok::Comma) => {}
                        Some(TTok::Close) => break,
                        _ => return Err("expected \",\" or \"]\" in Literal[...]".into()),
                    }
                }
                Ok(Ty::Literal(values))
            }
            ("Optional" | "Literal", false) => Err(format!("{name} needs arguments: {name}[...]")),
            ("str" | "int" | "float" | "bool", true) => Err(format!("{name} takes no arguments")),
            (_, true) => Err(format!("unknown generic type \"{name}\"")),
            (_, false) => Ok(Ty::Ref(name)),
        }
    }
}

/// Parses the type notation (`str`, `list[Phase]`, `Optional[Literal["a","b"]]`, ...).
fn parse_type(src: &str) -> Result<Ty, String> {
    let toks = lex_type(src)?;
    let mut p = TyParser { toks, pos: 0 };
    let ty = p.ty(0)?;
    if p.pos < p.toks.len() {
        return Err("unexpected text after the type".into());
    }
    Ok(ty)
}

impl Ty {
    fn refs<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Ty::Ref(n) => out.push(n),
            Ty::Dict(Some(t)) | Ty::List(Some(t)) | Ty::Optional(t) => t.refs(out),
            _ => {}
        }
    }

    fn schema(&self) -> Value {
        match self {
            Ty::Str => json!({"type": "string"}),
            Ty::Int => json!({"type": "integer"}),
            Ty::Float => json!({"type": "number"}),
            Ty::Bool => json!({"type": "boolean"}),
            Ty::Dict(None) => json!({"type": "object"}),
            Ty::Dict(Some(t)) => json!({"type": "object", "additionalProperties": t.schema()}),
            Ty::List(None) => json!({"type": "array"}),
            Ty::List(Some(t)) => json!({"type": "array", "items": t.schema()}),
            Ty::Optional(t) => {
                let inner = t.schema();
                match inner.get("type").and_then(Value::as_str) {
                    Some(ty) if inner.as_object().is_some_and(|o| o.len() == 1) => {
                        json!({"type": [ty, "null"]})
                    }
                    _ => json!({"anyOf": [inner, {"type": "null"}]}),
                }
            }
            Ty::Literal(values) => {
                let mut types: Vec<&str> = values
                    .iter()
                    .map(|v| match v {
                        Value::Bool(_) => "boolean",
                        Value::Number(_) => "integer",
                        _ => "string",
                    })
                    .collect();
                types.sort_unstable();
                types.dedup();
                match types.as_slice() {
                    [one] => json!({"type": one, "enum": values}),
                    _ => json!({"enum": values}),
                }
            }
            Ty::Ref(n) => json!({"$ref": format!("#/$defs/{n}")}),
        }
    }
}

/// One model before compilation.
enum RawModel {
    /// `{"type":"model","fields":{...}}`: the local schema (refs point into `$defs`) and its refs.
    Typed {
        schema: Value,
        refs: BTreeSet<String>,
    },
    /// `{"schema": {...}}`: used as given.
    Raw(Value),
}

/// The parsed `structured_outputs.json`.
pub(crate) struct Models {
    pub models: BTreeMap<String, CompiledModel>,
    pub registry: BTreeMap<String, String>,
    /// Every model name declared, valid or not (to avoid cascading "unknown model" errors).
    pub declared: BTreeSet<String>,
    /// Every agent listed in the registry, even with an unknown model (avoids cascades).
    pub registry_agents: BTreeSet<String>,
}

/// Parses and compiles `structured_outputs.json`. `agents` is `None` when the agent list itself
/// could not be read (then registry agents are not checked).
pub(crate) fn parse(doc: &Value, agents: Option<&BTreeSet<String>>, d: &mut Diag) -> Models {
    let mut out = Models {
        models: BTreeMap::new(),
        registry: BTreeMap::new(),
        declared: BTreeSet::new(),
        registry_agents: BTreeSet::new(),
    };
    let root = Loc::root("structured_outputs.json");
    let Some(top) = object(doc, &root, "the document", d) else {
        return out;
    };
    top.allow_keys(&["structured_outputs"], d);
    let Some(so_v) = top.get("structured_outputs") else {
        root.err(
            d,
            "missing required key \"structured_outputs\"; wrap models and registry in it",
        );
        return out;
    };
    let Some(so) = object(
        so_v,
        &root.key("structured_outputs"),
        "\"structured_outputs\"",
        d,
    ) else {
        return out;
    };
    so.allow_keys(&["models", "registry"], d);

    let mut raw: BTreeMap<String, RawModel> = BTreeMap::new();
    if let Some(models_v) = so.get("models") {
        let mloc = so.loc.key("models");
        if let Some(models) = object(models_v, &mloc, "\"models\"", d) {
            out.declared = models.map.keys().cloned().collect();
            for (name, mv) in models.map {
                if let Some(m) = parse_model(name, mv, &mloc.key(name), &out.declared, d) {
                    raw.insert(name.clone(), m);
                }
            }
        }
    }

    compile_all(&raw, &so.loc.key("models"), &mut out, d);

    if let Some(reg_v) = so.get("registry") {
        let rloc = so.loc.key("registry");
        if let Some(reg) = object(reg_v, &rloc, "\"registry\" (agent name -> model name)", d) {
            for (agent, mv) in reg.map {
                out.registry_agents.insert(agent.clone());
                let loc = rloc.key(agent);
                if let Some(agents) = agents
                    && !agents.contains(agent)
                {
                    loc.err(
                            d,
                            format!(
                                "registry agent \"{agent}\" is not declared in agents.json{}; fix the name or add the agent",
                                did_you_mean(agent, agents.iter().map(String::as_str))
                            ),
                        );
                }
                match mv.as_str() {
                    Some(model) if out.declared.contains(model) => {
                        out.registry.insert(agent.clone(), model.to_owned());
                    }
                    Some(model) => loc.err(
                        d,
                        format!(
                            "model \"{model}\" is not defined under \"models\"{}; define it or fix the name",
                            did_you_mean(model, out.declared.iter().map(String::as_str))
                        ),
                    ),
                    None => loc.err(d, "registry values must be model names (strings)"),
                }
            }
        }
    }
    out
}

fn parse_model(
    name: &str,
    v: &Value,
    loc: &Loc,
    declared: &BTreeSet<String>,
    d: &mut Diag,
) -> Option<RawModel> {
    let m = object(v, loc, &format!("model \"{name}\""), d)?;
    if let Some(schema) = m.map.get("schema") {
        m.allow_keys(&["schema", "description"], d);
        if !schema.is_object() {
            loc.key("schema")
                .err(d, "\"schema\" must be a JSON Schema object");
            return None;
        }
        return Some(RawModel::Raw(schema.clone()));
    }
    m.allow_keys(&["type", "fields", "description"], d);
    match m.get("type") {
        Some(Value::String(t)) if t == "model" => {}
        Some(other) => {
            loc.key("type").err(d, format!("model \"type\" must be \"model\", found {other}"));
        }
        None => loc.err(
            d,
            "a model needs \"type\": \"model\" with \"fields\", or a raw JSON Schema under \"schema\"",
        ),
    }
    let floc = loc.key("fields");
    let Some(fields_v) = m.get("fields") else {
        loc.err(
            d,
            "missing required key \"fields\" (an object of field name -> {\"type\": ...})",
        );
        return None;
    };
    let fields = object(fields_v, &floc, "\"fields\"", d)?;
    let mut ok = true;
    let mut props = Map::new();
    let mut required = Vec::new();
    let mut refs = BTreeSet::new();
    for (fname, fv) in fields.map {
        let loc = floc.key(fname);
        let Some(f) = object(fv, &loc, &format!("field \"{fname}\""), d) else {
            ok = false;
            continue;
        };
        f.allow_keys(&["type", "description", "default"], d);
        let Some(tsrc) = f.req_str("type", d) else {
            ok = false;
            continue;
        };
        let ty = match parse_type(tsrc) {
            Ok(ty) => ty,
            Err(e) => {
                loc.key("type").err(
                    d,
                    format!("invalid type \"{tsrc}\": {e}; see the type notation in the docs"),
                );
                ok = false;
                continue;
            }
        };
        let mut these = Vec::new();
        ty.refs(&mut these);
        for r in these {
            if declared.contains(r) {
                refs.insert(r.to_owned());
            } else {
                let hint = did_you_mean(
                    r,
                    BUILTIN_TYPES
                        .iter()
                        .copied()
                        .chain(declared.iter().map(String::as_str)),
                );
                loc.key("type").err(
                    d,
                    format!(
                        "unknown type \"{r}\"{hint}; use str, int, float, bool, dict, list[T], Optional[T], Literal[...] or a model name"
                    ),
                );
                ok = false;
            }
        }
        let mut schema = ty.schema();
        if let Value::Object(s) = &mut schema {
            if let Some(desc) = f.opt_str("description", d) {
                s.insert("description".into(), Value::String(desc.to_owned()));
            }
            if let Some(def) = f.map.get("default") {
                s.insert("default".into(), def.clone());
            }
        }
        if !matches!(ty, Ty::Optional(_)) && !f.map.contains_key("default") {
            required.push(Value::String(fname.clone()));
        }
        props.insert(fname.clone(), schema);
    }
    if !ok {
        return None;
    }
    let schema = json!({"type": "object", "properties": props, "required": required});
    Some(RawModel::Typed { schema, refs })
}

/// Finds reference cycles and compiles every model whose whole reference closure is valid.
fn compile_all(raw: &BTreeMap<String, RawModel>, mloc: &Loc, out: &mut Models, d: &mut Diag) {
    let refs_of = |n: &str| -> Vec<String> {
        match raw.get(n) {
            Some(RawModel::Typed { refs, .. }) => refs.iter().cloned().collect(),
            _ => Vec::new(),
        }
    };
    // Cycle detection: iterative DFS with colours; each cycle reported once at its first model.
    let mut in_cycle: BTreeSet<String> = BTreeSet::new();
    let mut done: BTreeSet<String> = BTreeSet::new();
    for start in raw.keys() {
        if done.contains(start) {
            continue;
        }
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), refs_of(start))];
        let mut on_path: Vec<String> = vec![start.clone()];
        while let Some((_, pending)) = stack.last_mut() {
            match pending.pop() {
                Some(next) => {
                    if let Some(i) = on_path.iter().position(|n| *n == next) {
                        let cycle: Vec<String> =
                            on_path.get(i..).map(<[String]>::to_vec).unwrap_or_default();
                        if !cycle.iter().any(|n| in_cycle.contains(n)) {
                            let mut shown = cycle.clone();
                            shown.push(next.clone());
                            let first = cycle.first().cloned().unwrap_or_default();
                            mloc.key(&first).err(
                                d,
                                format!(
                                    "model reference cycle {}; models cannot contain themselves, break the cycle (e.g. use dict)",
                                    shown.join(" -> ")
                                ),
                            );
                        }
                        in_cycle.extend(cycle);
                    } else if !done.contains(&next) && raw.contains_key(&next) {
                        let r = refs_of(&next);
                        on_path.push(next.clone());
                        stack.push((next, r));
                    }
                }
                None => {
                    if let Some((n, _)) = stack.pop() {
                        done.insert(n);
                    }
                    on_path.pop();
                }
            }
        }
    }

    for (name, model) in raw {
        // Transitive closure of references; skip models touching a cycle or a broken model.
        let mut closure: BTreeSet<String> = BTreeSet::new();
        let mut todo = refs_of(name);
        let mut broken = in_cycle.contains(name);
        while let Some(n) = todo.pop() {
            if in_cycle.contains(&n) || !raw.contains_key(&n) {
                broken = true;
            }
            if closure.insert(n.clone()) {
                todo.extend(refs_of(&n));
            }
        }
        if broken {
            continue;
        }
        let mut schema = match model {
            RawModel::Typed { schema, .. } => schema.clone(),
            RawModel::Raw(schema) => schema.clone(),
        };
        if let Value::Object(root) = &mut schema {
            if matches!(model, RawModel::Typed { .. }) {
                root.insert(
                    "$schema".into(),
                    json!("https://json-schema.org/draft/2020-12/schema"),
                );
                root.insert("title".into(), Value::String(name.clone()));
            }
            if !closure.is_empty() {
                let mut defs = Map::new();
                for n in &closure {
                    let def = match raw.get(n) {
                        Some(RawModel::Typed { schema, .. }) => schema.clone(),
                        Some(RawModel::Raw(schema)) => embed_raw(n, schema),
                        None => continue,
                    };
                    defs.insert(n.clone(), def);
                }
                root.insert("$defs".into(), Value::Object(defs));
            }
        }
        match build_validator(&schema) {
            Ok(v) => {
                out.models.insert(
                    name.clone(),
                    CompiledModel {
                        name: name.clone(),
                        schema: Arc::new(schema),
                        validator: Arc::new(v),
                    },
                );
            }
            Err(e) => {
                let loc = if matches!(model, RawModel::Raw(_)) {
                    mloc.key(name).key("schema")
                } else {
                    mloc.key(name)
                };
                loc.err(d, format!("not a valid JSON Schema: {e}; fix the schema"));
            }
        }
    }
}

/// A raw schema copied into another model's `$defs` gets its own `$id`, so its internal `#/...`
/// references keep resolving against itself.
fn embed_raw(name: &str, schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Value::Object(o) = &mut s {
        o.remove("$schema");
        o.entry("$id")
            .or_insert_with(|| Value::String(format!("urn:tessera:model:{name}")));
    }
    s
}

/// Builds a draft 2020-12 validator (the default when a schema declares no `$schema`).
pub(crate) fn build_validator(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(schema)
        .map_err(|e| {
            let path = e.instance_path().to_string();
            if path.is_empty() {
                e.to_string()
            } else {
                format!("{path}: {e}")
            }
        })
}

/// Checks that `v` is an object JSON Schema (`"type": "object"`) that compiles; used for tool
/// parameters.
pub(crate) fn check_object_schema(v: &Value, loc: &Loc, d: &mut Diag) -> bool {
    let Some(o) = object(v, loc, "a JSON Schema", d) else {
        return false;
    };
    if o.map.get("type").and_then(Value::as_str) != Some("object") {
        loc.err(
            d,
            "tool parameters must be a JSON Schema with \"type\": \"object\"",
        );
        return false;
    }
    if let Some(props) = o.map.get("properties")
        && !props.is_object()
    {
        loc.key("properties").err(
            d,
            "\"properties\" must be an object of argument name -> schema",
        );
        return false;
    }
    if let Some(req) = o.map.get("required")
        && array(req, &loc.key("required"), "\"required\"", d).is_none()
    {
        return false;
    }
    if !required_names_exist(v, loc, d) {
        return false;
    }
    match build_validator(v) {
        Ok(_) => true,
        Err(e) => {
            loc.err(d, format!("not a valid JSON Schema: {e}; fix the schema"));
            false
        }
    }
}

/// Every name in an object schema's `required` (here and in nested object properties) must be
/// one of its `properties`: JSON Schema accepts `"required": ["titel"]` beside a `title`
/// property, and the tool then rejects every call the model makes, which looks like a model
/// bug rather than a typo in the manifest.
fn required_names_exist(schema: &Value, loc: &Loc, d: &mut Diag) -> bool {
    let Some(map) = schema.as_object() else {
        return true;
    };
    let props = map.get("properties").and_then(Value::as_object);
    let mut ok = true;
    if let Some(Value::Array(required)) = map.get("required") {
        for (i, name) in required.iter().enumerate() {
            let at = loc.key("required").idx(i);
            let Some(name) = name.as_str() else {
                at.err(d, "\"required\" entries must be property names (strings)");
                ok = false;
                continue;
            };
            if props.is_some_and(|p| p.contains_key(name)) {
                continue;
            }
            let known = props.into_iter().flat_map(|p| p.keys().map(String::as_str));
            at.err(
                d,
                format!(
                    "required property \"{name}\" is not declared in \"properties\"{}; fix the name or declare the property",
                    did_you_mean(name, known)
                ),
            );
            ok = false;
        }
    }
    for (name, sub) in props.into_iter().flatten() {
        ok &= required_names_exist(sub, &loc.key("properties").key(name), d);
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_notation() {
        assert_eq!(parse_type("str"), Ok(Ty::Str));
        assert_eq!(
            parse_type("list[ Phase ]"),
            Ok(Ty::List(Some(Box::new(Ty::Ref("Phase".into())))))
        );
        assert_eq!(
            parse_type("Optional[bool]"),
            Ok(Ty::Optional(Box::new(Ty::Bool)))
        );
        assert_eq!(
            parse_type("Literal['a', \"b\", 1, True]"),
            Ok(Ty::Literal(vec![
                json!("a"),
                json!("b"),
                json!(1),
                json!(true)
            ]))
        );
        assert_eq!(
            parse_type("dict[str, int]"),
            Ok(Ty::Dict(Some(Box::new(Ty::Int))))
        );
        for bad in [
            "",
            "list[",
            "list[str",
            "Optional",
            "str[int]",
            "Literal[]",
            "Foo[str]",
            "dict[int, str]",
            "str int",
            "@",
        ] {
            assert!(parse_type(bad).is_err(), "{bad:?}");
        }
        let deep = format!("{}str{}", "list[".repeat(1000), "]".repeat(1000));
        assert!(parse_type(&deep).is_err());
    }

    #[test]
    fn optional_schema_shapes() {
        assert_eq!(
            Ty::Optional(Box::new(Ty::Int)).schema(),
            json!({"type": ["integer", "null"]})
        );
        assert_eq!(
            Ty::Optional(Box::new(Ty::Ref("A".into()))).schema(),
            json!({"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]})
        );
    }
}
