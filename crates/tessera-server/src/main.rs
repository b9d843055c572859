//! The `tessera` binary: parses the command line and dispatches to the `tessera_server`
//! library (`validate`, or `run` on a bound listener until SIGTERM / Ctrl-C).

mod keys;
mod record;
mod workflow_tests;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tessera_server::{ServerConfig, validate};

// mimalloc instead of glibc malloc: the engine makes many small, short-lived allocations per
// turn, and glibc spent about a third of the engine's CPU on them (free-list consolidation).
// The `system-allocator` feature keeps glibc's, for heap profilers that see only it
// (`scripts/alloc-sites.sh`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Has mimalloc return freed pages to the OS [`PURGE_DELAY_MS`] after they were freed rather
/// than its default 10 ms, unless `MIMALLOC_PURGE_DELAY` is set (mimalloc reads it itself).
///
/// WHY not 0 (returned at once), which this was: chats keep allocating while short-lived
/// turn data is freed, so pages handed back were faulted in again moments later. At 3,000
/// chats with 100 ms model latency, 7.9 page faults per turn at 0 against 2.6 at 1 s, and
/// 4–19% less CPU per turn at 100 ms in alternating runs (docs/performance-log.md, "Current figures
/// against issue 14"); the price is the pages freed in the last 100 ms, a few MiB under load.
#[cfg(not(feature = "system-allocator"))]
fn tune_allocator() {
    /// `mi_option_purge_delay` in mimalloc.h (v2 and v3), which libmimalloc-sys does not name.
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    const PURGE_DELAY_MS: std::ffi::c_long = 100;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: sets a plain integer option; mimalloc allows this at any time, from any thread.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS) };
}

/// Command-line interface of the Tessera workflow engine.
#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "Runs LLM agent chat workflows defined by JSON manifests"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands; add new ones here and dispatch them in `main`.
#[derive(Debug, Subcommand)]
enum Command {
    /// Check workflow manifests and print a summary or every error (exit code 1 on any error).
    Validate {
        /// Workflow folders, or folders containing workflow folders (default: the configured
        /// `workflows_dir`, as `serve` would load it).
        dirs: Vec<PathBuf>,
        /// A TOML config file; `TESSERA_*` environment variables override it.
        #[arg(long, env = "TESSERA_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Run the workflows' test files (`<workflow>/tests/*.json`) against the real engine with
    /// their scripted model replies (exit code 1 on any failure).
    Test {
        /// Workflow folders, or folders containing workflow folders (default: the configured
        /// `workflows_dir`).
        dirs: Vec<PathBuf>,
        /// Rewrite each test's expectations from this run (review the diff before committing).
        #[arg(long)]
        update: bool,
        /// A TOML config file; `TESSERA_*` environment variables override it.
        #[arg(long, env = "TESSERA_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Write a test file from a stored chat (model replies, user steps and what happened), so
    /// the conversation replays with `tessera test`. Secrets are never written.
    Record {
        /// The chat's id (as in `GET /api/v1/chats`).
        chat_id: String,
        /// Output file (default: `<workflow>/tests/recorded_<chat id>.json`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// A TOML config file; `TESSERA_*` environment variables override it (the store is
        /// `data_dir/tessera.db`).
        #[arg(long, env = "TESSERA_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Print the SHA-256 of an API key, the value for `tenants[].api_key_sha256`.
    HashKey {
        /// The key; without it the key is read from stdin (keeps it out of shell history).
        key: Option<String>,
    },
    /// Print a new random vault key (32 bytes as hex), the value for `secrets.key_hex` /
    /// `TESSERA_SECRET_KEY`.
    GenSecretKey,
    /// Serve chats over HTTP and WebSocket (the web client is at `/`).
    Serve {
        /// A TOML config file; `TESSERA_*` environment variables override it.
        #[arg(long, env = "TESSERA_CONFIG")]
        config: Option<PathBuf>,
        /// Listen address, e.g. 127.0.0.1:8080 (port 0 picks a free port).
        #[arg(long)]
        bind: Option<std::net::SocketAddr>,
        /// A workflow folder or a folder of workflow folders (overrides the configuration).
        #[arg(long)]
        workflows_dir: Option<PathBuf>,
        /// Log format.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
}

/// How logs are written.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn serve(
    config: Option<PathBuf>,
    bind: Option<std::net::SocketAddr>,
    workflows_dir: Option<PathBuf>,
    log_format: LogFormat,
) -> ExitCode {
    let telemetry = match tessera_server::telemetry::init(matches!(log_format, LogFormat::Json)) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("tessera serve: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let result = load_config(config.as_deref()).and_then(|mut c| {
        if let Some(bind) = bind {
            c.bind = bind;
        }
        if let Some(dir) = workflows_dir {
            c.workflows_dir = dir;
        }
        let listener =
            tessera_server::bind(c.bind).with_context(|| format!("cannot listen on {}", c.bind))?;
        actix::System::new().block_on(tessera_server::run(listener, c, shutdown_signal()))
    });
    // After the runtime: the exporter's blocking client must not run inside it.
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera serve: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The one configuration every subcommand reads: the file, then `TESSERA_*` overrides.
fn load_config(path: Option<&std::path::Path>) -> anyhow::Result<ServerConfig> {
    ServerConfig::load(path, |k| std::env::var(k).ok())
}

fn validate(dirs: &[PathBuf], config: Option<&std::path::Path>) -> ExitCode {
    match load_config(config) {
        Ok(c) => validate::run(dirs, &c.workflows_dir),
        Err(e) => {
            eprintln!("tessera validate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    #[cfg(not(feature = "system-allocator"))]
    tune_allocator();
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { dirs, config } => validate(&dirs, config.as_deref()),
        Command::Test {
            dirs,
            update,
            config,
        } => match load_config(config.as_deref()) {
            Ok(c) => workflow_tests::run(&dirs, &c.workflows_dir, update),
            Err(e) => {
                eprintln!("tessera test: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Record {
            chat_id,
            out,
            config,
        } => match load_config(config.as_deref()) {
            Ok(c) => record::run(&c, &chat_id, out),
            Err(e) => {
                eprintln!("tessera record: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::HashKey { key } => keys::hash_key(key),
        Command::GenSecretKey => keys::gen_secret_key(),
        Command::Serve {
            config,
            bind,
            workflows_dir,
            log_format,
        } => serve(config, bind, workflows_dir, log_format),
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
