//! Helpers shared by the integration tests: locating and running the real `tessera` binary.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root, so tests can find `workflows/` and `target/` wherever they run from.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Path of the real `tessera` binary, built once per test process with
/// `cargo build -p tessera-server --bin tessera` (a no-op when up to date), because
/// `CARGO_BIN_EXE_*` is only available to tests of the binary's own package. Panics with the
/// build output if the build fails: that is a test failure, not a recoverable condition.
pub fn tessera_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = workspace_root();
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        let bin = target
            .join("debug")
            .join(format!("tessera{}", std::env::consts::EXE_SUFFIX));
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "-p", "tessera-server", "--bin", "tessera"])
            .current_dir(&root)
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) if bin.is_file() => eprintln!(
                "warning: building tessera failed, using the existing binary:\n{}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Ok(o) => panic!(
                "cargo build -p tessera-server failed:\n{}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) if bin.is_file() => {
                eprintln!("warning: cannot run cargo ({e}); using the existing binary")
            }
            Err(e) => panic!("cannot run cargo to build tessera: {e}"),
        }
        assert!(
            bin.is_file(),
            "{} does not exist after building",
            bin.display()
        );
        bin
    })
    .clone()
}

/// Path of the real `tessera-loadgen` binary (the mock LLM server and load generator), built
/// once per test process with `cargo build -p tessera-loadgen --bin tessera-loadgen`, like
/// [`tessera_bin`]. Panics with the build output if the build fails.
pub fn loadgen_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = workspace_root();
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        let bin = target
            .join("debug")
            .join(format!("tessera-loadgen{}", std::env::consts::EXE_SUFFIX));
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "-p", "tessera-loadgen", "--bin", "tessera-loadgen"])
            .current_dir(&root)
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) if bin.is_file() => eprintln!(
                "warning: building tessera-loadgen failed, using the existing binary:\n{}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Ok(o) => panic!(
                "cargo build -p tessera-loadgen failed:\n{}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) if bin.is_file() => {
                eprintln!("warning: cannot run cargo ({e}); using the existing binary")
            }
            Err(e) => panic!("cannot run cargo to build tessera-loadgen: {e}"),
        }
        assert!(
            bin.is_file(),
            "{} does not exist after building",
            bin.display()
        );
        bin
    })
    .clone()
}

pub mod browser;
pub mod server;
pub mod wsclient;
