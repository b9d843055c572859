//! `tessera validate` against the shipped workflows and a broken copy.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use integration_tests::{copy_dir, tessera_bin, workspace_root};

fn validate(args: &[&Path]) -> Output {
    Command::new(tessera_bin())
        .arg("validate")
        .args(args)
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run tessera: {e}"))
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
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nope does not exist"), "{stderr}");
    let empty = validate(&[tmp.path()]);
    assert_eq!(empty.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("no workflows found"));
}

/// Runs `tessera serve` on port 0 with `args`, for a start that must fail: the process must
/// exit on its own (it is killed, and the test fails, if it is still up after 60 s).
fn serve_expecting_exit(args: &[&std::ffi::OsStr], env: &[(&str, &Path)]) -> (i32, String) {
    let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut command = Command::new(tessera_bin());
    command
        .args(["serve", "--bind", "127.0.0.1:0"])
        .args(args)
        .env("TESSERA_DATA_DIR", data.path())
        .env_remove("TESSERA_WORKFLOWS_DIR")
        .env_remove("TESSERA_CONFIG")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .current_dir(workspace_root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run tessera: {e}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tessera serve {args:?} did not exit");
            }
        }
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    (status.code().unwrap_or(-1), stderr)
}

/// A broken copy of the shipped workflows: Generator and TodoAssistant each have one mistake.
fn two_broken_workflows(root: &Path) {
    copy_dir(&workspace_root().join("workflows"), root);
    for (folder, from, to) in [
        ("Generator", "\"mode\": \"artifact\"", "\"mode\": \"modal\""),
        ("TodoAssistant", "\"Agent_Tool\"", "\"AgentTool\""),
    ] {
        let path = root.join(folder).join("tools.json");
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.contains(from), "{folder}/tools.json lacks {from}");
        fs::write(&path, text.replacen(from, to, 1)).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn serve_reports_every_invalid_workflow_with_a_validate_command_that_works_here() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = tmp.path().join("workflows");
    two_broken_workflows(&root);
    let (code, stderr) = serve_expecting_exit(&["--workflows-dir".as_ref(), root.as_os_str()], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("2 of ") && stderr.contains(" workflows in "),
        "{stderr}"
    );
    assert!(stderr.contains("workflow Generator is invalid"), "{stderr}");
    assert!(
        stderr.contains("workflow TodoAssistant is invalid"),
        "{stderr}"
    );
    assert!(stderr.contains("found \"modal\""), "{stderr}");
    // The test binary runs from target/debug, as `cargo run` would: the hint says so, and the
    // command it prints really reports the same workflows.
    let hint = format!("`cargo run -- validate {}`", root.display());
    assert!(stderr.contains(&hint), "expected {hint} in:\n{stderr}");
    let out = validate(&[&root]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("FAIL  Generator") && stdout.contains("FAIL  TodoAssistant"));
}

#[test]
fn serve_says_a_missing_workflows_dir_does_not_exist_and_an_empty_one_has_none() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let missing = tmp.path().join("nowhere");
    let (code, stderr) = serve_expecting_exit(&[], &[("TESSERA_WORKFLOWS_DIR", &missing)]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains(&format!("{} does not exist", missing.display())),
        "{stderr}"
    );
    let (code, stderr) =
        serve_expecting_exit(&["--workflows-dir".as_ref(), tmp.path().as_os_str()], &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no workflows found in"), "{stderr}");
}

#[tokio::test]
async fn serve_accepts_a_single_workflow_folder_like_validate() {
    let server =
        integration_tests::server::TestServer::start(integration_tests::server::ServerOptions {
            workflows_dir: Some(workspace_root().join("workflows/TodoAssistant")),
            ..Default::default()
        })
        .await;
    let (status, body) = server.get("/api/v1/workflows", "alice").await;
    assert_eq!(status, 200, "{body}");
    let names: Vec<&str> = body["workflows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["name"].as_str())
        .collect();
    assert_eq!(names, ["TodoAssistant"], "{body}");
    server.terminate().await;
}

#[test]
fn validate_checks_the_configured_workflows_dir_like_serve() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = tmp.path().join("workflows");
    two_broken_workflows(&root);
    let run = |env: &[(&str, &Path)], args: &[&str]| {
        let mut command = Command::new(tessera_bin());
        command
            .arg("validate")
            .args(args)
            .env_remove("TESSERA_WORKFLOWS_DIR")
            .env_remove("TESSERA_CONFIG")
            .current_dir(workspace_root());
        for (k, v) in env {
            command.env(k, v);
        }
        command
            .output()
            .unwrap_or_else(|e| panic!("cannot run tessera: {e}"))
    };
    // From the environment.
    let out = run(&[("TESSERA_WORKFLOWS_DIR", &root)], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  Generator"), "{stdout}");
    // From the config file.
    let config = tmp.path().join("tessera.toml");
    fs::write(
        &config,
        format!("workflows_dir = {:?}\n", root.display().to_string()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = run(&[], &["--config", &config.display().to_string()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  TodoAssistant"), "{stdout}");
    // Without either, the default folder (the shipped workflows) is checked.
    let out = run(&[], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
