//! Helpers shared by the integration tests: locating and running the real `tessera` binary.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root, so tests can find `workflows/` and `target/` wherever they run from.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Copies the folder `from` into `to`, recursively (e.g. a workflow to break or change).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
        let entry = entry.unwrap_or_else(|e| panic!("{e}"));
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// Path of the real `tessera` binary (see [`build_bin`]).
pub fn tessera_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_bin("tessera-server", "tessera"))
        .clone()
}

/// Path of the real `tessera-loadgen` binary: the mock LLM server and load generator.
pub fn loadgen_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_bin("tessera-loadgen", "tessera-loadgen"))
        .clone()
}

/// Path of `tessera-mcp-testserver`, the MCP server the MCP tests talk to.
pub fn mcp_testserver_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_bin("tessera-mcp", "tessera-mcp-testserver"))
        .clone()
}

/// Builds `bin` of `package` with cargo (a no-op when up to date) and returns its path:
/// `CARGO_BIN_EXE_*` only reaches tests of the binary's own package. A failed build panics
/// with cargo's output: running a stale binary would test something else.
fn build_bin(package: &str, bin: &str) -> PathBuf {
    let root = workspace_root();
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let path = target
        .join("debug")
        .join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    match Command::new(cargo)
        .args(["build", "-p", package, "--bin", bin])
        .current_dir(&root)
        .output()
    {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "cargo build -p {package} --bin {bin} failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("cannot run cargo to build {bin}: {e}"),
    }
    assert!(
        path.is_file(),
        "{} does not exist after building",
        path.display()
    );
    path
}

pub mod browser;
pub mod cluster;
pub mod mock_llm;
pub mod postgres;
pub mod server;
pub mod wsclient;
