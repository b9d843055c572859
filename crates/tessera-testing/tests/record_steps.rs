//! `tessera record` reads the user's steps back from the event log: for every shipped test
//! file, the steps recorded from the events of its run are the steps that produced them
//! (messages, answers, timeouts, cancels), with secrets replaced by asterisks.

use std::path::PathBuf;

use serde_json::Value;
use tessera_testing::TestFile;
use tessera_testing::format::Step;
use tessera_testing::record::steps_from;
use tessera_testing::runner::{run_case, test_files};

fn workflows() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../workflows")
}

/// `value` with every secret field's string replaced by asterisks of the same length.
fn mask(value: &mut Value, secret_fields: &[String]) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v {
                    Value::String(s) if secret_fields.contains(key) => {
                        *s = "*".repeat(s.chars().count());
                    }
                    other => mask(other, secret_fields),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| mask(v, secret_fields)),
        _ => {}
    }
}

#[test]
fn steps_recorded_from_a_run_are_the_steps_that_made_it() {
    let mut checked = 0;
    for name in ["Generator", "TodoAssistant", "TextToolkit", "LoadTest"] {
        let dir = workflows().join(name);
        let workflow =
            tessera_manifest::load_workflow(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let secret_fields: Vec<String> = workflow
            .tools
            .iter()
            .flat_map(|t| t.secret_fields.clone())
            .collect();
        for file in test_files(&dir).unwrap_or_else(|e| panic!("{e}")) {
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{e}"));
            let test: TestFile = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
            let actual = run_case(&workflow, &test).unwrap_or_else(|e| panic!("{e}"));
            let recorded = steps_from(&workflow, &actual.raw_events);
            let expected: Vec<Step> = test
                .steps
                .iter()
                .map(|step| match step {
                    Step::Answer(answer) => {
                        let mut answer = answer.clone();
                        if let Some(data) = &mut answer.data {
                            mask(data, &secret_fields);
                        }
                        Step::Answer(answer)
                    }
                    other => other.clone(),
                })
                .collect();
            assert_eq!(recorded, expected, "{}", file.display());
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} test files");
}
