//! Compilation of the structured-output type notation to JSON Schema 2020-12.

use std::fs;
use std::path::Path;

use serde_json::{Value, json};
use tessera_manifest::{CompiledModel, Workflow, load_workflow};

/// Writes a one-agent workflow whose structured_outputs.json holds `models`, and loads it.
fn load_with_models(
    dir: &Path,
    models: Value,
) -> Result<Workflow, tessera_manifest::ManifestErrors> {
    let write =
        |name: &str, v: Value| fs::write(dir.join(name), v.to_string()).map_err(|e| panic!("{e}"));
    let _ = write(
        "workflow.json",
        json!({"name": "S", "description": "", "initial_agent": "OnlyAgent", "max_turns": 1,
               "human_in_the_loop": false, "startup_mode": "UserDriven"}),
    );
    let _ = write(
        "agents.json",
        json!({"agents": {"OnlyAgent": {"system_message": "x", "max_consecutive_auto_reply": 1}}}),
    );
    let _ = write(
        "structured_outputs.json",
        json!({"structured_outputs": {"models": models, "registry": {}}}),
    );
    load_workflow(dir)
}

fn compile(models: Value) -> Workflow {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    load_with_models(tmp.path(), models).unwrap_or_else(|e| panic!("{e}"))
}

fn model<'a>(w: &'a Workflow, name: &str) -> &'a CompiledModel {
    w.models
        .get(name)
        .unwrap_or_else(|| panic!("model {name} missing"))
}

#[test]
fn primitive_types_and_required() {
    let w = compile(json!({
        "M": {"type": "model", "fields": {
            "s": {"type": "str", "description": "a string"},
            "i": {"type": "int"},
            "f": {"type": "float"},
            "b": {"type": "bool", "default": true},
            "d": {"type": "dict"},
            "l": {"type": "list[int]"},
            "o": {"type": "Optional[str]"},
            "lit": {"type": "Literal['low', 'high']"},
            "mixed": {"type": "Literal[1, 'x', True]"},
            "map": {"type": "dict[str, float]"}
        }}
    }));
    let m = model(&w, "M");
    let s = &*m.schema;
    assert_eq!(
        s["$schema"],
        json!("https://json-schema.org/draft/2020-12/schema")
    );
    assert_eq!(s["title"], json!("M"));
    assert_eq!(s["type"], json!("object"));
    assert_eq!(
        s["properties"]["s"],
        json!({"type": "string", "description": "a string"})
    );
    assert_eq!(s["properties"]["i"], json!({"type": "integer"}));
    assert_eq!(s["properties"]["f"], json!({"type": "number"}));
    assert_eq!(
        s["properties"]["b"],
        json!({"type": "boolean", "default": true})
    );
    assert_eq!(
        s["properties"]["l"],
        json!({"type": "array", "items": {"type": "integer"}})
    );
    assert_eq!(s["properties"]["o"], json!({"type": ["string", "null"]}));
    assert_eq!(
        s["properties"]["lit"],
        json!({"type": "string", "enum": ["low", "high"]})
    );
    assert_eq!(s["properties"]["mixed"], json!({"enum": [1, "x", true]}));
    assert_eq!(
        s["properties"]["map"],
        json!({"type": "object", "additionalProperties": {"type": "number"}})
    );
    let mut required: Vec<&str> = s["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    required.sort_unstable();
    assert_eq!(required, ["d", "f", "i", "l", "lit", "map", "mixed", "s"]);

    let good = json!({"s": "x", "i": 3, "f": 1.5, "d": {}, "l": [1], "lit": "low", "mixed": 1, "map": {"a": 1.0}});
    assert_eq!(m.validate(&good), Ok(()));
    // int means JSON integer: 1.5 is rejected; extra keys are tolerated (Pydantic's default).
    let mut bad = good.clone();
    bad["i"] = json!(1.5);
    bad["extra"] = json!("ignored");
    let errors = m.validate(&bad).err().unwrap_or_default();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("/i: "), "{errors:?}");
    let errors = m.validate(&json!({"s": "x"})).err().unwrap_or_default();
    assert!(
        errors
            .iter()
            .any(|e| e == "/i: \"i\" is a required property"),
        "{errors:?}"
    );
    let errors = m
        .validate(&json!("not an object"))
        .err()
        .unwrap_or_default();
    assert!(errors.iter().any(|e| e.starts_with("/: ")), "{errors:?}");
}

#[test]
fn references_are_inlined_transitively_via_defs() {
    let w = compile(json!({
        "Leaf": {"type": "model", "fields": {"v": {"type": "int"}}},
        "Mid": {"type": "model", "fields": {"leaves": {"type": "list[Leaf]"}}},
        "Top": {"type": "model", "fields": {"mid": {"type": "Mid"}, "maybe": {"type": "Optional[Leaf]"}}}
    }));
    let top = model(&w, "Top");
    let s = &*top.schema;
    assert_eq!(s["properties"]["mid"], json!({"$ref": "#/$defs/Mid"}));
    assert_eq!(
        s["properties"]["maybe"],
        json!({"anyOf": [{"$ref": "#/$defs/Leaf"}, {"type": "null"}]})
    );
    let defs = s["$defs"]
        .as_object()
        .map(|d| d.keys().cloned().collect::<Vec<_>>());
    assert_eq!(defs, Some(vec!["Leaf".to_owned(), "Mid".to_owned()]));
    assert_eq!(
        top.validate(&json!({"mid": {"leaves": [{"v": 1}]}, "maybe": null})),
        Ok(())
    );
    let errors = top
        .validate(&json!({"mid": {"leaves": [{"v": "one"}]}}))
        .err()
        .unwrap_or_default();
    assert!(
        errors.iter().any(|e| e.starts_with("/mid/leaves/0/v: ")),
        "{errors:?}"
    );
    // A model without references has no $defs.
    assert!(model(&w, "Leaf").schema.get("$defs").is_none());
}

#[test]
fn raw_schema_models_are_used_and_embeddable() {
    let w = compile(json!({
        "Raw": {"schema": {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}}},
            "required": ["tags"],
            "$defs": {"Tag": {"type": "string", "minLength": 2}}
        }},
        "Wrapper": {"type": "model", "fields": {"raw": {"type": "Raw"}}}
    }));
    let raw = model(&w, "Raw");
    assert_eq!(raw.validate(&json!({"tags": ["ab"]})), Ok(()));
    assert!(raw.validate(&json!({"tags": ["a"]})).is_err());
    let wrapper = model(&w, "Wrapper");
    assert_eq!(
        wrapper.validate(&json!({"raw": {"tags": ["ab", "cd"]}})),
        Ok(())
    );
    let errors = wrapper
        .validate(&json!({"raw": {"tags": ["a"]}}))
        .err()
        .unwrap_or_default();
    assert!(
        errors.iter().any(|e| e.starts_with("/raw/tags/0: ")),
        "{errors:?}"
    );
}

#[test]
fn schema_errors_are_all_reported() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let result = load_with_models(
        tmp.path(),
        json!({
            "A": {"type": "model", "fields": {"b": {"type": "B"}}},
            "B": {"type": "model", "fields": {"a": {"type": "list[A]"}}},
            "C": {"type": "model", "fields": {"x": {"type": "Strng"}, "y": {"type": "Optional["}}},
            "D": {"type": "model", "fields": {"a": {"type": "A"}}},
            "E": {"schema": {"$ref": "https://example.com/remote.json"}},
            "F": {"type": "model", "fields": {"ok": {"type": "int"}}}
        }),
    );
    let errors = result.err().unwrap_or_else(|| panic!("should fail"));
    let text = errors.to_string();
    assert!(text.contains("model reference cycle A -> B -> A"), "{text}");
    assert!(
        text.contains("unknown type \"Strng\" (did you mean \"str\"?)"),
        "{text}"
    );
    assert!(text.contains("invalid type \"Optional[\""), "{text}");
    assert!(
        text.contains("/structured_outputs/models/E/schema: not a valid JSON Schema"),
        "{text}"
    );
    // The cycle is reported once; D (which only uses the cycle) is not reported separately.
    assert_eq!(text.matches("model reference cycle").count(), 1, "{text}");
    assert_eq!(errors.len(), 4, "{text}");
}
