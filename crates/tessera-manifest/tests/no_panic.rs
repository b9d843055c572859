//! Property tests: no input, however malformed, may panic the loader or the condition parser.

use std::fs;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde_json::{Map, Value};
use tessera_manifest::{Expr, load_workflow};

const FILES: [&str; 7] = [
    "workflow.json",
    "agents.json",
    "tools.json",
    "structured_outputs.json",
    "context_variables.json",
    "handoffs.json",
    "demo.json",
];

/// Keys and strings that the loader cares about, so random documents reach deep code paths.
const WORDS: &[&str] = &[
    "agents",
    "tools",
    "structured_outputs",
    "models",
    "registry",
    "fields",
    "type",
    "schema",
    "definitions",
    "derived_variables",
    "ui_response_triggers",
    "handoff_rules",
    "source_agent",
    "target_agent",
    "handoff_type",
    "condition",
    "agent",
    "function",
    "description",
    "tool_type",
    "ui",
    "component",
    "mode",
    "impl",
    "kind",
    "name",
    "url",
    "parameters",
    "properties",
    "required",
    "secret_fields",
    "uses_secrets",
    "timeout_s",
    "system_message",
    "max_consecutive_auto_reply",
    "auto_tool_mode",
    "structured_outputs_required",
    "temperature",
    "tool_calling",
    "context_variables",
    "initial_agent",
    "max_turns",
    "startup_mode",
    "human_in_the_loop",
    "trigger_type",
    "trigger_value",
    "variable",
    "tool",
    "response_key",
    "default",
    "source",
    "var",
    "loop_from",
    "MainAgent",
    "FormAgent",
    "UI_Tool",
    "Agent_Tool",
    "builtin",
    "http",
    "model",
    "str",
    "int",
    "list[Form]",
    "Optional[int]",
    "Literal['a']",
    "Form",
    "FormCall",
    "object",
    "string",
    "$ref",
    "#/$defs/X",
    "pattern",
    "[",
    "items",
    "enum",
    "minimum",
    "condition",
    "after_work",
    "user",
    "terminate",
    "${done} == True",
    "agent_text_equals",
    "artifact",
    "inline",
    "UserDriven",
    "env",
    "static",
    "bool",
    "done",
    "form_status",
    "",
];

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(WORDS).prop_map(str::to_owned),
        1 => "\\PC{0,12}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        word().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((word(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

/// What to put in one manifest file.
#[derive(Debug, Clone)]
enum FileContent {
    Absent,
    Json(Value),
    Text(String),
}

fn file_content() -> impl Strategy<Value = FileContent> {
    prop_oneof![
        1 => Just(FileContent::Absent),
        4 => json_value().prop_map(FileContent::Json),
        1 => "\\PC{0,40}".prop_map(FileContent::Text),
    ]
}

fn write(dir: &Path, file: &str, content: &FileContent) {
    let r = match content {
        FileContent::Absent => Ok(()),
        FileContent::Json(v) => fs::write(dir.join(file), v.to_string()),
        FileContent::Text(t) => fs::write(dir.join(file), t),
    };
    r.unwrap_or_else(|e| panic!("write {file}: {e}"));
}

fn base_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/broken/_base")
}

fn base_doc(file: &str) -> Value {
    let text = fs::read_to_string(base_dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Replaces the node reached by following `steps` (each picks a child by index modulo the
/// number of children) with `new`.
fn replace_at(v: &mut Value, steps: &[usize], new: Value) {
    let Some((first, rest)) = steps.split_first() else {
        *v = new;
        return;
    };
    let child = match v {
        Value::Array(a) if !a.is_empty() => {
            let n = a.len();
            a.get_mut(first % n)
        }
        Value::Object(o) if !o.is_empty() => {
            let n = o.len();
            o.values_mut().nth(first % n)
        }
        _ => None,
    };
    match child {
        Some(c) => replace_at(c, rest, new),
        None => *v = new,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_manifest_files_never_panic(contents in proptest::collection::vec(file_content(), 7)) {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for (file, content) in FILES.iter().zip(&contents) {
            write(tmp.path(), file, content);
        }
        let _ = load_workflow(tmp.path());
    }

    #[test]
    fn mutated_valid_workflow_never_panics(
        file_idx in 0usize..7,
        steps in proptest::collection::vec(any::<usize>(), 0..6),
        new in json_value(),
    ) {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for (i, file) in FILES.iter().enumerate() {
            let mut doc = base_doc(file);
            if i == file_idx {
                replace_at(&mut doc, &steps, new.clone());
            }
            write(tmp.path(), file, &FileContent::Json(doc));
        }
        if let Ok(w) = load_workflow(tmp.path()) {
            // Whatever loaded must be usable without panicking.
            let ctx = w.initial_context();
            for rule in &w.handoffs {
                if let Some(c) = &rule.condition {
                    let _ = c.eval(&ctx);
                }
            }
            for m in w.models.values() {
                let _ = m.validate(&new);
            }
        }
    }

    #[test]
    fn random_condition_strings_never_panic(src in "\\PC{0,60}", vars in json_value()) {
        if let Ok(e) = Expr::parse(&src) {
            let vars = match vars { Value::Object(m) => m, _ => Map::new() };
            let _ = e.eval(&vars);
        }
    }

    #[test]
    fn token_soup_conditions_never_panic(
        toks in proptest::collection::vec(
            proptest::sample::select(&[
                "${a}", "${b}", "==", "!=", "and", "or", "not", "(", ")", "True", "None", "'x'",
                "\"y\"", "1", "-2.5", "false", "null", "=", "${", "}", "'",
            ][..]),
            0..30,
        ),
        a in json_value(),
        b in json_value(),
    ) {
        let src = toks.join(" ");
        if let Ok(e) = Expr::parse(&src) {
            let mut vars = Map::new();
            vars.insert("a".into(), a);
            vars.insert("b".into(), b);
            let _ = e.eval(&vars);
        }
    }

    #[test]
    fn random_field_types_never_panic(ty in "\\PC{0,30}", ty2 in proptest::sample::select(&[
        "list[", "Optional[Literal['a', 1, True]]", "dict[str, list[Form]]", "Literal[", "list[list[list[int]]]",
        "Optional[Optional[str]]", "Form[", "]", "Literal['a',]", "dict[str,", "Literal[-]",
    ][..])) {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for file in FILES {
            let mut doc = base_doc(file);
            if file == "structured_outputs.json" {
                doc["structured_outputs"]["models"]["Form"]["fields"]["title"]["type"] = Value::String(ty.clone());
                doc["structured_outputs"]["models"]["Form"]["fields"]["other"] = serde_json::json!({"type": ty2});
            }
            write(tmp.path(), file, &FileContent::Json(doc));
        }
        let _ = load_workflow(tmp.path());
    }
}
