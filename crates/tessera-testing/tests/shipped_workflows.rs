//! Every shipped workflow's tests pass through the real engine (this is how
//! `cargo test --workspace` and `.ci/run` run them), and the runner itself behaves: virtual
//! time, readable failures, `--update`, misplaced steps, the exactly-once check.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;
use tessera_testing::runner::{CaseError, run_case, summarize_with};
use tessera_testing::{CaseOutcome, TestFile, run_dir, run_file};

fn workflows() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../workflows")
}

fn load(name: &str) -> tessera_manifest::Workflow {
    tessera_manifest::load_workflow(&workflows().join(name))
        .unwrap_or_else(|e| panic!("{name} must load: {e}"))
}

fn read_test(path: &Path) -> TestFile {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_shipped_workflow_has_tests_and_they_pass() {
    let reports = run_dir(&workflows(), false).unwrap_or_else(|e| panic!("{e}"));
    let mut failures = String::new();
    for r in &reports {
        match &r.outcome {
            CaseOutcome::Passed => {}
            CaseOutcome::Failed(ms) => {
                failures.push_str(&format!("FAIL {}\n", r.file.display()));
                for m in ms {
                    failures.push_str(&format!("{m}\n"));
                }
            }
            other => failures.push_str(&format!("{}: {other:?}\n", r.file.display())),
        }
    }
    assert!(failures.is_empty(), "{failures}");
    for name in ["Generator", "TodoAssistant", "TextToolkit", "LoadTest"] {
        assert!(
            reports.iter().any(|r| r.workflow == name),
            "{name} has no tests"
        );
    }
}

#[test]
fn a_ui_timeout_passes_in_virtual_time() {
    let workflow = load("LoadTest");
    let test = read_test(&workflows().join("LoadTest/tests/ui_timeout.json"));
    let started = Instant::now();
    let actual = run_case(&workflow, &test).unwrap_or_else(|e| panic!("{e}"));
    let elapsed = started.elapsed();
    let timed_out = actual.raw_events.iter().any(|(kind, data)| {
        kind == "chat.tool_response"
            && data["tool_name"] == "confirm_form"
            && data["payload"]["code"] == "ui_timeout"
    });
    assert!(timed_out, "{:#?}", actual.events);
    // confirm_form's timeout is 120 s: finishing in less real time than that proves the clock
    // the engine saw was virtual (the case usually takes a few milliseconds).
    assert!(
        elapsed.as_secs() < 60,
        "a 120 s UI timeout took {elapsed:?} of real time"
    );
    assert_eq!(actual.status, "awaiting_user");
}

#[test]
fn a_wrong_expectation_fails_with_its_json_path_and_update_rewrites_it() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = tmp.path().join("echo.json");
    let mut test = read_test(&workflows().join("LoadTest/tests/echo.json"));
    let events = test
        .expect
        .events
        .as_mut()
        .unwrap_or_else(|| panic!("echo.json has events"));
    let answer = events
        .iter_mut()
        .find(|e| e.kind == "chat.text" && e.agent.as_deref() == Some("EchoAgent"))
        .unwrap_or_else(|| panic!("an EchoAgent text"));
    answer.data = Some(json!({"content": "Something else."}));
    test.expect.status = Some("completed".into());
    std::fs::write(&file, tessera_testing::runner::to_pretty(&test))
        .unwrap_or_else(|e| panic!("{e}"));

    let workflow = load("LoadTest");
    let outcome = run_file(&workflow, &file, false).unwrap_or_else(|e| panic!("{e}"));
    let CaseOutcome::Failed(mismatches) = outcome else {
        panic!("expected a failure, got {outcome:?}")
    };
    let shown: Vec<String> = mismatches.iter().map(ToString::to_string).collect();
    let text = shown.join("\n");
    assert!(text.contains("at events[5].data.content:"), "{text}");
    assert!(text.contains("- expected: \"Something else.\""), "{text}");
    assert!(
        text.contains("+ actual:   \"Echoed your message.\""),
        "{text}"
    );
    assert!(text.contains("at status:"), "{text}");

    // --update: the file gets the run's expectations back, and then passes.
    let outcome = run_file(&workflow, &file, true).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(outcome, CaseOutcome::Updated), "{outcome:?}");
    let rewritten = read_test(&file);
    assert_eq!(rewritten.expect.status.as_deref(), Some("awaiting_user"));
    assert_eq!(rewritten.steps, test.steps);
    let outcome = run_file(&workflow, &file, false).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(outcome, CaseOutcome::Passed), "{outcome:?}");
}

#[test]
fn a_step_that_does_not_fit_the_chat_is_reported() {
    let workflow = load("LoadTest");
    let test: TestFile = serde_json::from_value(json!({
        "steps": [{"answer": {"data": {}}}]
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let err = run_case(&workflow, &test).map(|_| ()).unwrap_err();
    assert!(
        matches!(&err, CaseError::Step { index: 0, step: "answer", problem } if problem.contains("no UI call to answer")),
        "{err}"
    );
    let test: TestFile = serde_json::from_value(json!({
        "context": {"ui_round_trip": true},
        "steps": [{"user": "hi"}, {"timeout": "echo"}]
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let err = run_case(&workflow, &test).map(|_| ()).unwrap_err();
    assert!(
        err.to_string().contains(
            "expected echo to be waiting, but the chat waits for an answer to UI tool confirm_form"
        ),
        "{err}"
    );
}

#[test]
fn a_tool_announced_twice_breaks_exactly_once() {
    let call = |corr: &str| {
        (
            "chat.tool_call".to_owned(),
            json!({"tool_name": "echo", "corr": corr, "awaiting_response": false}),
        )
    };
    let response = |corr: &str| {
        (
            "chat.tool_response".to_owned(),
            json!({"tool_name": "echo", "corr": corr}),
        )
    };
    let fine = summarize_with(
        vec![call("k1"), response("k1"), call("k2"), response("k2")],
        Default::default(),
        "awaiting_user",
        &[],
    );
    assert!(fine.exactly_once.is_empty(), "{:?}", fine.exactly_once);
    let twice = summarize_with(
        vec![call("k1"), call("k1"), response("k1"), response("k1")],
        Default::default(),
        "awaiting_user",
        &[],
    );
    assert_eq!(twice.exactly_once.len(), 1, "{:?}", twice.exactly_once);
    assert!(twice.exactly_once[0].contains("announced 2 times and answered 2 times"));
    let unanswered = summarize_with(vec![call("k1")], Default::default(), "awaiting_user", &[]);
    assert_eq!(unanswered.exactly_once.len(), 1);
}
