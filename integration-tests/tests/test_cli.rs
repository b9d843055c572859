//! `tessera test`: the shipped workflows' tests pass through the real binary; a broken
//! expectation fails with exit code 1 and a diff naming the JSON path.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use integration_tests::{copy_dir, tessera_bin, workspace_root};

fn tessera_test(args: &[&Path]) -> Output {
    Command::new(tessera_bin())
        .arg("test")
        .args(args)
        .env_remove("TESSERA_WORKFLOWS_DIR")
        .env_remove("TESSERA_CONFIG")
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run tessera: {e}"))
}

#[test]
fn shipped_workflow_tests_pass_and_a_broken_expectation_fails_with_a_diff() {
    let out = tessera_test(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("PASS     Generator/tests/happy_path.json"),
        "{stdout}"
    );
    assert!(stdout.contains(" 0 failed"), "{stdout}");

    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp.path().join("TodoAssistant");
    let source = workspace_root().join("workflows/TodoAssistant");
    copy_dir(&source, &dir);
    let test = fs::read_to_string(source.join("tests/add_then_list.json"))
        .unwrap_or_else(|e| panic!("{e}"));
    // Change the first expectation that names the task (not the model's script).
    let expect_at = test
        .find("\"expect\"")
        .unwrap_or_else(|| panic!("no expect"));
    let (script, expect) = test.split_at(expect_at);
    assert!(expect.contains("\"Buy milk\""));
    fs::write(
        dir.join("tests/add_then_list.json"),
        format!(
            "{script}{}",
            expect.replacen("\"Buy milk\"", "\"Buy oat milk\"", 1)
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = tessera_test(&[&dir]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL     TodoAssistant/tests/add_then_list.json"),
        "{stdout}"
    );
    assert!(stdout.contains("at events["), "{stdout}");
    assert!(stdout.contains("- expected: \"Buy oat milk\""), "{stdout}");
}
