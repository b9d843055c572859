//! Table-driven test over `tests/broken/<case>/`: each case overlays a few files on the valid
//! `tests/broken/_base` workflow so that exactly one rule is broken, and `expected.txt` names the
//! file, JSON pointer and a message substring of the error that must be reported.
//!
//! Case folder contents: replacement manifest files, an optional `remove.txt` (base files to
//! delete, one per line) and `expected.txt` (`file: ...`, `path: ...`, `message: ...`).

use std::fs;
use std::path::{Path, PathBuf};

use tessera_manifest::load_workflow;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/broken")
}

struct Expected {
    file: String,
    path: String,
    message: String,
}

fn read_expected(case: &Path) -> Expected {
    let text = fs::read_to_string(case.join("expected.txt")).unwrap_or_default();
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_owned()))
            .unwrap_or_else(|| panic!("{}: expected.txt lacks `{key}`", case.display()))
    };
    Expected {
        file: field("file:"),
        path: field("path:"),
        message: field("message:"),
    }
}

/// Copies the base workflow plus the case's overlay into `dest`.
fn materialize(case: &Path, dest: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dest)?;
    for entry in fs::read_dir(corpus().join("_base"))? {
        let entry = entry?;
        fs::copy(entry.path(), dest.join(entry.file_name()))?;
    }
    for entry in fs::read_dir(case)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == "expected.txt" || name == "remove.txt" {
            continue;
        }
        fs::copy(entry.path(), dest.join(&name))?;
    }
    if let Ok(list) = fs::read_to_string(case.join("remove.txt")) {
        for f in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
            fs::remove_file(dest.join(f))?;
        }
    }
    Ok(())
}

#[test]
fn base_workflow_is_valid() {
    if let Err(e) = load_workflow(&corpus().join("_base")) {
        panic!("the base of the broken corpus must be valid:\n{e}");
    }
}

#[test]
fn every_broken_case_reports_its_error() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let mut cases: Vec<PathBuf> = fs::read_dir(corpus())
        .unwrap_or_else(|e| panic!("read corpus: {e}"))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n != "_base"))
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 25,
        "the corpus should have at least 25 cases, found {}",
        cases.len()
    );

    let mut failures = Vec::new();
    for case in &cases {
        let name = case
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = tmp.path().join(&name);
        materialize(case, &dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let expected = read_expected(case);
        match load_workflow(&dir) {
            Ok(_) => failures.push(format!("{name}: loaded without errors")),
            Err(errors) => {
                let found = errors.iter().any(|e| {
                    e.file == expected.file
                        && e.path == expected.path
                        && e.message.contains(&expected.message)
                });
                if !found {
                    failures.push(format!(
                        "{name}: expected {} {}: ...{}...\n  got:\n    {}",
                        expected.file,
                        expected.path,
                        expected.message,
                        errors.to_string().replace('\n', "\n    ")
                    ));
                }
                // One rule broken -> errors only in the expected file, and few of them.
                let stray: Vec<String> = errors
                    .iter()
                    .filter(|e| e.file != expected.file)
                    .map(ToString::to_string)
                    .collect();
                if !stray.is_empty() || errors.len() > 2 {
                    failures.push(format!("{name}: unexpected extra errors:\n    {errors}"));
                }
                // Every error names its workflow folder in its display form.
                assert!(
                    errors
                        .to_string()
                        .lines()
                        .all(|l| l.starts_with(&format!("{name}/")))
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn errors_from_several_files_are_reported_together() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let dir = tmp.path().join("Multi");
    // Malformed tools.json plus two unrelated mistakes elsewhere.
    materialize(&corpus().join("invalid_json"), &dir).unwrap_or_else(|e| panic!("{e}"));
    let wf = fs::read_to_string(dir.join("workflow.json")).unwrap_or_default();
    fs::write(
        dir.join("workflow.json"),
        wf.replace("\"max_turns\": 10", "\"max_turns\": 0"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ho = fs::read_to_string(dir.join("handoffs.json")).unwrap_or_default();
    fs::write(
        dir.join("handoffs.json"),
        ho.replace("\"terminate\"", "\"Terminate\""),
    )
    .unwrap_or_else(|e| panic!("{e}"));

    let errors = match load_workflow(&dir) {
        Ok(_) => panic!("should fail"),
        Err(e) => e,
    };
    let files: Vec<&str> = errors.iter().map(|e| e.file.as_str()).collect();
    assert_eq!(
        files,
        ["tools.json", "handoffs.json", "workflow.json"],
        "{errors}"
    );
    let text = errors.to_string();
    assert!(
        text.starts_with("Multi/tools.json: invalid JSON at line 1 column"),
        "{text}"
    );
    assert!(
        text.contains("Multi/workflow.json /max_turns: \"max_turns\" must be greater than 0"),
        "{text}"
    );
    assert!(text.contains("(did you mean \"terminate\"?)"), "{text}");
}
