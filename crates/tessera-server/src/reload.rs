//! Workflow versions and hot reload.
//!
//! Every version the server serves is first copied to `data_dir/workflow_versions/<name>/<version>/`
//! (the manifest files, `demo.json` included) and loaded from there, so the version a chat
//! started with can be compiled again after a restart even when the live folder has changed
//! since. On SIGHUP the workflows dir is loaded again: a valid changed workflow becomes the
//! version new chats get (running chats keep theirs); an invalid one is refused with its
//! errors logged, and its running version stays. With `workflows_watch_s` set, a change of
//! any manifest file's size or modification time triggers the same reload.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use tessera_engine::Engine;
use tessera_llm::ChatModel;
use tessera_llm::scripted::ScriptedModel;
use tessera_manifest::{MANIFEST_FILES, Workflow, load_workflow};

/// Where the chats' models come from.
#[derive(Clone)]
pub enum ModelSource {
    /// One OpenAI-compatible endpoint for every workflow.
    Endpoint(Arc<dyn ChatModel>),
    /// Each workflow's own `demo.json`, replayed offline.
    Demo,
}

impl ModelSource {
    /// The model of `workflow`; `None` (with a warning) when demo mode has no usable script.
    pub fn model_for(&self, workflow: &Workflow) -> Option<Arc<dyn ChatModel>> {
        match self {
            Self::Endpoint(client) => Some(client.clone()),
            Self::Demo => match ScriptedModel::from_file(&workflow.dir.join("demo.json")) {
                Ok(model) => Some(Arc::new(model)),
                Err(e) => {
                    tracing::warn!(workflow = %workflow.name, error = %e, "no usable demo.json; workflow not served in demo mode");
                    None
                }
            },
        }
    }
}

/// `data_dir/workflow_versions`.
fn versions_root(data_dir: &Path) -> PathBuf {
    data_dir.join("workflow_versions")
}

/// A workflow name made safe as one path component.
fn folder_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Copies `workflow`'s manifest files into its version folder (once per version) and loads
/// the copy, so the returned workflow's `dir` outlives later edits of the live folder.
pub fn pin_version(data_dir: &Path, workflow: &Workflow) -> anyhow::Result<Workflow> {
    let dest = versions_root(data_dir)
        .join(folder_name(&workflow.name))
        .join(&workflow.version);
    if !dest.join("workflow.json").is_file() {
        // Written beside the destination and renamed, so a crash never leaves half a version.
        let staging = dest.with_extension("partial");
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)
            .with_context(|| format!("cannot create {}", staging.display()))?;
        for file in MANIFEST_FILES {
            let source = workflow.dir.join(file);
            if source.is_file() {
                std::fs::copy(&source, staging.join(file))
                    .with_context(|| format!("cannot copy {}", source.display()))?;
            }
        }
        std::fs::rename(&staging, &dest)
            .with_context(|| format!("cannot create {}", dest.display()))?;
    }
    let pinned = load_workflow(&dest).map_err(|e| {
        anyhow::anyhow!(
            "the copy of {} version {} in {} is invalid:\n{e}",
            workflow.name,
            workflow.version,
            dest.display()
        )
    })?;
    anyhow::ensure!(
        pinned.version == workflow.version,
        "{} changed while it was being copied; reload again",
        workflow.dir.display()
    );
    Ok(pinned)
}

/// Every pinned version in `data_dir` that is not among `current`, for chats stored with an
/// older version. Unreadable copies are skipped with a warning.
pub fn older_versions(data_dir: &Path, current: &[Workflow]) -> Vec<Workflow> {
    let mut out = Vec::new();
    let Ok(names) = std::fs::read_dir(versions_root(data_dir)) else {
        return out;
    };
    for name in names.filter_map(Result::ok) {
        let Ok(versions) = std::fs::read_dir(name.path()) else {
            continue;
        };
        for version in versions.filter_map(Result::ok) {
            let dir = version.path();
            if !dir.join("workflow.json").is_file() {
                continue;
            }
            match load_workflow(&dir) {
                Ok(w)
                    if current
                        .iter()
                        .any(|c| c.name == w.name && c.version == w.version) => {}
                Ok(w) => out.push(w),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), errors = %e, "stored workflow version is invalid; chats of it run the current version");
                }
            }
        }
    }
    out
}

/// Pairs each workflow with its model, dropping those without one.
pub fn with_models(
    source: &ModelSource,
    workflows: Vec<Workflow>,
) -> Vec<(Workflow, Arc<dyn ChatModel>)> {
    workflows
        .into_iter()
        .filter_map(|w| source.model_for(&w).map(|m| (w, m)))
        .collect()
}

/// What one reload did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReloadSummary {
    /// Workflows whose new version new chats now get.
    pub installed: Vec<String>,
    /// Workflows whose change was refused (invalid); the running version stays.
    pub refused: Vec<String>,
    /// Workflows with no change.
    pub unchanged: usize,
}

/// Loads the workflows dir again and installs every valid changed workflow (see the module
/// docs). Workflows added or removed since the start are left alone (a restart serves them).
pub async fn reload(
    engine: &Engine,
    workflows_dir: &Path,
    data_dir: &Path,
    models: &ModelSource,
) -> ReloadSummary {
    let mut summary = ReloadSummary::default();
    let current = engine.current_versions().await;
    let loaded = match tessera_manifest::load_workflow_dir(workflows_dir) {
        Ok(loaded) => loaded,
        Err(e) => {
            tracing::error!(error = %e, "workflow reload refused; every running version stays");
            summary.refused.push(workflows_dir.display().to_string());
            return summary;
        }
    };
    let mut install = Vec::new();
    for (folder, result) in loaded {
        let workflow = match result {
            Ok(workflow) => workflow,
            Err(errors) => {
                tracing::error!(workflow = %folder, errors = %errors, "workflow change refused: the new version is invalid; the running version stays");
                summary.refused.push(folder);
                continue;
            }
        };
        match current.get(&workflow.name) {
            None => {
                tracing::warn!(workflow = %workflow.name, "a workflow not served at start appeared; restart the server to serve it");
                continue;
            }
            Some(version) if *version == workflow.version => {
                summary.unchanged += 1;
                continue;
            }
            Some(_) => {}
        }
        let pinned = match pin_version(data_dir, &workflow) {
            Ok(pinned) => pinned,
            Err(e) => {
                tracing::error!(workflow = %workflow.name, error = %format!("{e:#}"), "workflow change refused");
                summary.refused.push(folder);
                continue;
            }
        };
        match models.model_for(&pinned) {
            Some(model) => install.push((pinned, model)),
            None => summary.refused.push(folder),
        }
    }
    let names: Vec<(String, String)> = install
        .iter()
        .map(|(w, _)| (w.name.clone(), w.version.clone()))
        .collect();
    if !install.is_empty() {
        if let Err(e) = engine.install(install, true).await {
            tracing::error!(error = %e, "workflow change refused: it does not compile; every running version stays");
            summary
                .refused
                .extend(names.into_iter().map(|(name, _)| name));
            return summary;
        }
        for (name, version) in names {
            tracing::info!(workflow = %name, version = %version, "workflow reloaded: new chats get this version; running chats keep theirs");
            summary.installed.push(name);
        }
    }
    tracing::info!(
        installed = summary.installed.len(),
        refused = summary.refused.len(),
        unchanged = summary.unchanged,
        "workflow reload done"
    );
    summary
}

/// Reloads on every SIGHUP until the process ends.
#[cfg(unix)]
pub async fn on_sighup(
    engine: Engine,
    workflows_dir: PathBuf,
    data_dir: PathBuf,
    models: ModelSource,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; workflow reload is off");
            return;
        }
    };
    while hangup.recv().await.is_some() {
        tracing::info!(dir = %workflows_dir.display(), "SIGHUP: reloading workflows");
        reload(&engine, &workflows_dir, &data_dir, &models).await;
    }
}

/// Size and modification time of every manifest file under `dir` (a workflow folder or a
/// folder of them): what the watch compares between two looks.
fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<std::time::SystemTime>)> {
    let mut folders = vec![dir.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(dir) {
        folders.extend(
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir()),
        );
    }
    let mut out = Vec::new();
    for folder in folders {
        for file in MANIFEST_FILES {
            let path = folder.join(file);
            if let Ok(meta) = std::fs::metadata(&path) {
                out.push((path, meta.len(), meta.modified().ok()));
            }
        }
    }
    out.sort();
    out
}

/// Reloads whenever a manifest file under `workflows_dir` changes, looking every `every`.
pub async fn watch(
    engine: Engine,
    workflows_dir: PathBuf,
    data_dir: PathBuf,
    models: ModelSource,
    every: std::time::Duration,
) {
    let mut last = fingerprint(&workflows_dir);
    loop {
        tokio::time::sleep(every).await;
        let now = fingerprint(&workflows_dir);
        if now != last {
            last = now;
            tracing::info!(dir = %workflows_dir.display(), "workflow files changed: reloading");
            reload(&engine, &workflows_dir, &data_dir, &models).await;
        }
    }
}
