//! `tessera validate [DIR...]`: loads workflows the way the server will and reports every
//! problem, so manifest mistakes are caught before a chat is started.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessera_manifest::{ManifestErrors, Workflow, load_workflow, load_workflows};

/// Folder checked when no directory is given.
const DEFAULT_DIR: &str = "workflows";

/// Validates each directory (a workflow folder, or a root of workflow folders) and prints a
/// summary per workflow or all its errors. Exit code 1 when anything is wrong.
pub fn run(dirs: &[PathBuf]) -> ExitCode {
    let default = [PathBuf::from(DEFAULT_DIR)];
    let dirs = if dirs.is_empty() { &default[..] } else { dirs };
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    for dir in dirs {
        match validate_dir(dir, &mut out) {
            Ok(ok) => failed |= !ok,
            Err(e) => {
                eprintln!("error: {}: {e}", dir.display());
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Validates one directory; `Ok(false)` when some workflow has errors.
fn validate_dir(dir: &Path, out: &mut impl Write) -> anyhow::Result<bool> {
    if !dir.is_dir() {
        anyhow::bail!("not a directory");
    }
    let results = if dir.join("workflow.json").is_file() {
        let name = dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        vec![(name, load_workflow(dir))]
    } else {
        load_workflows(dir)
    };
    if results.is_empty() {
        anyhow::bail!("no workflows found (expected workflow.json here or in its subfolders)");
    }
    let mut ok = true;
    for (name, result) in &results {
        match result {
            Ok(w) => print_summary(name, w, out)?,
            Err(errors) => {
                ok = false;
                print_errors(name, errors, out)?;
            }
        }
    }
    Ok(ok)
}

fn print_summary(folder: &str, w: &Workflow, out: &mut impl Write) -> std::io::Result<()> {
    let list = |items: Vec<&str>| {
        if items.is_empty() {
            "-".to_owned()
        } else {
            items.join(", ")
        }
    };
    writeln!(out, "ok    {folder} ({})", w.name)?;
    writeln!(
        out,
        "      agents:   {}",
        list(w.agents.keys().map(String::as_str).collect())
    )?;
    writeln!(
        out,
        "      tools:    {}",
        list(w.tools.iter().map(|t| t.function.as_str()).collect())
    )?;
    writeln!(
        out,
        "      models:   {}",
        list(w.models.keys().map(String::as_str).collect())
    )?;
    let variables: Vec<&str> = w
        .variables
        .iter()
        .map(|v| v.name.as_str())
        .chain(w.derived.iter().map(|d| d.name.as_str()))
        .collect();
    writeln!(out, "      vars:     {}", list(variables))?;
    writeln!(out, "      handoffs: {}", w.handoffs.len())
}

fn print_errors(
    folder: &str,
    errors: &ManifestErrors,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let n = errors.len();
    writeln!(
        out,
        "FAIL  {folder}: {n} error{}",
        if n == 1 { "" } else { "s" }
    )?;
    for e in errors.iter() {
        writeln!(out, "      {e}")?;
    }
    Ok(())
}
