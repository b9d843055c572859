//! `tessera validate` against the shipped workflows and a broken copy.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use integration_tests::{tessera_bin, workspace_root};

fn validate(args: &[&Path]) -> Output {
    Command::new(tessera_bin())
        .arg("validate")
        .args(args)
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run tessera: {e}"))
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap_or_else(|e| panic!("{e}"));
    for entry in fs::read_dir(from).unwrap_or_else(|e| panic!("{e}")) {
        let entry = entry.unwrap_or_else(|e| panic!("{e}"));
        let dest = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            fs::copy(entry.path(), dest).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn shipped_workflows_validate() {
    let out = validate(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["Generator", "TodoAssistant", "TextToolkit"] {
        assert!(stdout.contains(&format!("ok    {name}")), "{stdout}");
    }
    assert!(
        stdout.contains("InterviewAgent, ContextAgent, APIKeyAgent, DownloadAgent"),
        "{stdout}"
    );
}

#[test]
fn single_workflow_folder_validates() {
    let out = validate(&[&workspace_root().join("workflows/TodoAssistant")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("add_task, list_tasks, complete_task, delete_task"),
        "{stdout}"
    );
}

#[test]
fn broken_copy_fails_with_every_error() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = tmp.path().join("workflows");
    copy_dir(&workspace_root().join("workflows"), &root);
    let gen_dir = root.join("Generator");

    // Two independent mistakes in two files: both must be reported.
    let tools_path = gen_dir.join("tools.json");
    let tools = fs::read_to_string(&tools_path).unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        &tools_path,
        tools.replace("\"mode\": \"artifact\"", "\"mode\": \"modal\""),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let handoffs_path = gen_dir.join("handoffs.json");
    let handoffs = fs::read_to_string(&handoffs_path).unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        &handoffs_path,
        handoffs.replace("${interview_complete}", "${interview_done}"),
    )
    .unwrap_or_else(|e| panic!("{e}"));

    let out = validate(&[&root]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  Generator: 2 errors"), "{stdout}");
    assert!(
        stdout.contains("Generator/tools.json /tools/0/ui/mode: \"mode\" must be \"artifact\" or \"inline\", found \"modal\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("Generator/handoffs.json /handoff_rules/0/condition: ${interview_done} is not a declared or derived variable"),
        "{stdout}"
    );
    // The other workflows are still checked and reported.
    assert!(stdout.contains("ok    TodoAssistant"), "{stdout}");

    // Pointing at the broken workflow folder itself behaves the same.
    let out = validate(&[&gen_dir]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn missing_directory_fails() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = validate(&[&tmp.path().join("nope")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
    let empty = validate(&[tmp.path()]);
    assert_eq!(empty.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("no workflows found"));
}
