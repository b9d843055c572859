//! `tessera record CHAT_ID`: writes a test file (see `tessera-testing`) from a chat in the
//! configured store, for the chat's workflow to replay as a regression test.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use tessera_store::SqliteStore;
use tessera_testing::record::record_from_store;

use tessera_server::ServerConfig;

/// Records `chat_id` into `out` (default: `<workflow>/tests/recorded_<chat_id>.json`).
pub fn run(config: &ServerConfig, chat_id: &str, out: Option<PathBuf>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tessera record: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(record(config, chat_id, out)) {
        Ok(path) => {
            println!("wrote {}", path.display());
            println!("run it with `tessera test`; review its expectations before committing");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tessera record: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn record(
    config: &ServerConfig,
    chat_id: &str,
    out: Option<PathBuf>,
) -> anyhow::Result<PathBuf> {
    let db_path = config.data_dir.join("tessera.db");
    anyhow::ensure!(
        db_path.is_file(),
        "no store at {} (set data_dir / TESSERA_DATA_DIR to the server's)",
        db_path.display()
    );
    let workflows: Vec<_> = tessera_manifest::load_workflow_dir(&config.workflows_dir)?
        .into_iter()
        .filter_map(|(_, loaded)| loaded.ok())
        .collect();
    let store = SqliteStore::open(&db_path)
        .await
        .with_context(|| format!("cannot open {}", db_path.display()))?;
    let recorded = record_from_store(&store, chat_id, &workflows).await;
    store.close().await;
    let (test, workflow) = recorded?;
    let path = match out {
        Some(path) => path,
        None => {
            let safe: String = chat_id
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            workflow
                .dir
                .join("tests")
                .join(format!("recorded_{safe}.json"))
        }
    };
    anyhow::ensure!(
        !path.exists(),
        "{} exists; choose another file with --out",
        path.display()
    );
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(&path, tessera_testing::runner::to_pretty(&test))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}
