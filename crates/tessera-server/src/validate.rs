//! `tessera validate [DIR...]`: loads workflows the way the server will and reports every
//! problem, so manifest mistakes are caught before a chat is started.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use std::time::Duration;

use tessera_manifest::{ManifestErrors, McpTransport, Workflow, load_workflow_dir};
use tessera_mcp::{ServerCheck, check_server};

/// Validates each directory (a workflow folder, or a root of workflow folders) and prints a
/// summary per workflow or all its errors. With no directory, checks the configured
/// `workflows_dir` (config file, then `TESSERA_WORKFLOWS_DIR`): the folder `serve` would load.
/// Exit code 1 when anything is wrong.
pub fn run(dirs: &[PathBuf], configured: &Path) -> ExitCode {
    let default = [configured.to_path_buf()];
    let dirs = if dirs.is_empty() { &default[..] } else { dirs };
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    for dir in dirs {
        match validate_dir(dir, &mut out) {
            Ok(ok) => failed |= !ok,
            Err(e) => {
                eprintln!("error: {e}");
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

/// The command that validates `dir` from where the user stands: `tessera validate DIR` when
/// this binary is installed, `cargo run [--release] -- validate DIR` when it runs from a
/// checkout's `target/` folder (where `tessera` is usually not on the PATH).
pub fn validate_command(dir: &Path) -> String {
    let exe = std::env::current_exe().ok();
    let profile = exe.as_deref().and_then(|exe| {
        let profile_dir = exe.parent()?;
        let target = profile_dir.parent()?;
        (target.file_name()? == "target").then(|| profile_dir.file_name())?
    });
    let dir = shell_word(&dir.display().to_string());
    match profile.and_then(|p| p.to_str()) {
        Some("release") => format!("cargo run --release -- validate {dir}"),
        Some(_) => format!("cargo run -- validate {dir}"),
        None => format!("tessera validate {dir}"),
    }
}

/// Quotes a path for a POSIX shell when it has characters the shell would split or expand.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Validates one directory; `Ok(false)` when some workflow has errors.
fn validate_dir(dir: &Path, out: &mut impl Write) -> anyhow::Result<bool> {
    let results = load_workflow_dir(dir)?;
    let mut ok = true;
    for (name, result) in &results {
        match result {
            Ok(w) => {
                print_summary(name, w, out)?;
                ok &= check_mcp_servers(w, out)?;
            }
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

/// How long `validate` waits for one MCP server to start and list its tools.
const MCP_CHECK_DEADLINE: Duration = Duration::from_secs(15);

/// Starts or reaches each MCP server an agent is granted and checks the allow-listed tools
/// exist: a missing tool is an error; an unreachable server only a warning (it may be up
/// where the workflow is served). `Ok(false)` on an error.
fn check_mcp_servers(w: &Workflow, out: &mut impl Write) -> anyhow::Result<bool> {
    if w.mcp.servers.is_empty() {
        return Ok(true);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut ok = true;
    for server in &w.mcp.servers {
        let allowed: Vec<String> = w
            .mcp
            .grants
            .iter()
            .filter(|g| g.server == server.name)
            .flat_map(|g| g.tools.iter().cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let kind = match server.transport {
            McpTransport::Stdio { .. } => "stdio",
            McpTransport::Http { .. } => "http",
        };
        let check = runtime.block_on(check_server(
            &server.transport,
            &allowed,
            MCP_CHECK_DEADLINE,
        ));
        match check {
            ServerCheck::Unreachable(why) => writeln!(
                out,
                "      warning: MCP server \"{}\" ({kind}) is unreachable, its tools were not checked: {why}",
                server.name
            )?,
            ServerCheck::Listed {
                listed,
                missing,
                unusable,
            } => {
                writeln!(
                    out,
                    "      mcp:      {} ({kind}): {listed} tools listed, allowed: {}",
                    server.name,
                    allowed.join(", ")
                )?;
                for tool in missing {
                    ok = false;
                    writeln!(
                        out,
                        "      error: mcp.json: tool \"{tool}\" is allowed but MCP server \"{}\" does not list it",
                        server.name
                    )?;
                }
                for (tool, why) in unusable {
                    ok = false;
                    writeln!(
                        out,
                        "      error: mcp.json: tool \"{tool}\" of MCP server \"{}\" has an unusable input schema: {why}",
                        server.name
                    )?;
                }
            }
        }
    }
    Ok(ok)
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
