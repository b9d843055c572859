//! Workflow versions and hot reload.
//!
//! Every version the server serves is first copied to `data_dir/workflow_versions/<name>/<version>/`
//! (the manifest files, `demo.json` included) and loaded from there, and kept in the store
//! (`WorkflowVersionStore`, table `workflow_versions`), so the version a chat started with can
//! be compiled again after a restart, or on another node sharing the store, even when the live
//! folder has changed since. The data dir is this node's copy of the store's versions: on start
//! ([`PinnedVersions::sync`]) versions only on disk (pinned before the store kept them) go to
//! the store, and versions only in the store (pinned by another node) are written to disk. On SIGHUP the workflows dir is loaded again: a valid changed workflow becomes the
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
use tessera_store::{WorkflowVersion, WorkflowVersionStore};

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

/// Where served versions are pinned: this node's data dir and the store.
#[derive(Clone)]
pub struct PinnedVersions {
    data_dir: PathBuf,
    store: Arc<dyn WorkflowVersionStore>,
}

impl PinnedVersions {
    /// Versions pinned in `data_dir` and kept in `store`.
    pub fn new(data_dir: PathBuf, store: Arc<dyn WorkflowVersionStore>) -> Self {
        Self { data_dir, store }
    }

    /// Pins `workflow` on disk ([`pin_version`]) and in the store; returns the pinned copy.
    pub async fn pin(&self, workflow: &Workflow) -> anyhow::Result<Workflow> {
        let pinned = pin_version(&self.data_dir, workflow)?;
        let record = version_record(&pinned)?;
        self.store
            .put_workflow_version(record)
            .await
            .with_context(|| {
                format!(
                    "cannot keep {} version {} in the store",
                    pinned.name, pinned.version
                )
            })?;
        Ok(pinned)
    }

    /// Makes the data dir and the store hold the same versions: versions pinned only on disk
    /// (by a build before the store kept them) are stored, versions only in the store (pinned
    /// by another node) are written to disk. Versions already in both are left alone.
    pub async fn sync(&self) -> anyhow::Result<()> {
        let stored = self
            .store
            .workflow_versions()
            .await
            .context("cannot read the stored workflow versions")?;
        let in_store: std::collections::HashSet<(String, String)> = stored
            .iter()
            .map(|v| (v.name.clone(), v.version.clone()))
            .collect();
        let mut shared = 0;
        for dir in pinned_dirs(&self.data_dir) {
            match load_workflow(&dir) {
                Ok(w) if !in_store.contains(&(w.name.clone(), w.version.clone())) => {
                    self.store.put_workflow_version(version_record(&w)?).await?;
                    shared += 1;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), errors = %e, "pinned workflow version is invalid; not stored");
                }
            }
        }
        let mut fetched = 0;
        for version in stored {
            if write_version(&self.data_dir, &version)? {
                fetched += 1;
            }
        }
        if shared + fetched > 0 {
            tracing::info!(
                stored = shared,
                copied_from_store = fetched,
                "workflow versions synced between the data dir and the store"
            );
        }
        Ok(())
    }
}

/// The store's record of a pinned workflow: its manifest files (which must be UTF-8 text).
fn version_record(pinned: &Workflow) -> anyhow::Result<WorkflowVersion> {
    let mut files = std::collections::BTreeMap::new();
    for file in MANIFEST_FILES {
        let path = pinned.dir.join(file);
        if path.is_file() {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            files.insert((*file).to_owned(), text);
        }
    }
    Ok(WorkflowVersion {
        name: pinned.name.clone(),
        version: pinned.version.clone(),
        files,
    })
}

/// Writes a stored version into the data dir unless it is there; true when written. Only
/// manifest file names are written, and only into the version's own folder.
fn write_version(data_dir: &Path, version: &WorkflowVersion) -> anyhow::Result<bool> {
    if folder_name(&version.version) != version.version {
        tracing::warn!(workflow = %version.name, version = %version.version, "stored workflow version has an unusable name; skipped");
        return Ok(false);
    }
    let dest = versions_root(data_dir)
        .join(folder_name(&version.name))
        .join(&version.version);
    if dest.join("workflow.json").is_file() {
        return Ok(false);
    }
    // Written beside the destination and renamed, so a crash never leaves half a version.
    let staging = dest.with_extension("partial");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)
        .with_context(|| format!("cannot create {}", staging.display()))?;
    for (file, text) in &version.files {
        if !MANIFEST_FILES.contains(&file.as_str()) {
            tracing::warn!(workflow = %version.name, file = %file, "stored workflow version names a file that is not a manifest file; skipped");
            continue;
        }
        std::fs::write(staging.join(file), text)
            .with_context(|| format!("cannot write {}", staging.join(file).display()))?;
    }
    std::fs::rename(&staging, &dest)
        .with_context(|| format!("cannot create {}", dest.display()))?;
    Ok(true)
}

/// Every complete version folder under `data_dir/workflow_versions`.
fn pinned_dirs(data_dir: &Path) -> Vec<PathBuf> {
    let Ok(names) = std::fs::read_dir(versions_root(data_dir)) else {
        return Vec::new();
    };
    names
        .filter_map(Result::ok)
        .filter_map(|name| std::fs::read_dir(name.path()).ok())
        .flat_map(|versions| versions.filter_map(Result::ok).map(|v| v.path()))
        .filter(|dir| dir.join("workflow.json").is_file())
        .collect()
}

/// Every pinned version in `data_dir` that is not among `current`, for chats stored with an
/// older version. Unreadable copies are skipped with a warning.
pub fn older_versions(data_dir: &Path, current: &[Workflow]) -> Vec<Workflow> {
    let mut out = Vec::new();
    for dir in pinned_dirs(data_dir) {
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
    versions: &PinnedVersions,
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
        let pinned = match versions.pin(&workflow).await {
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
    versions: PinnedVersions,
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
        reload(&engine, &workflows_dir, &versions, &models).await;
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
    versions: PinnedVersions,
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
            reload(&engine, &workflows_dir, &versions, &models).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_store::SqliteStore;

    fn shipped(name: &str) -> anyhow::Result<Workflow> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../workflows")
            .join(name);
        load_workflow(&dir).map_err(|e| anyhow::anyhow!("{e}"))
    }

    #[actix_rt::test]
    async fn versions_pinned_on_one_node_reach_another_through_the_store() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let store = Arc::new(SqliteStore::open(&tmp.path().join("shared.db")).await?);
        let workflow = shipped("LoadTest")?;

        // A node that pinned a version on disk before the store kept versions.
        let first = tmp.path().join("node-a");
        pin_version(&first, &workflow)?;
        assert!(store.workflow_versions().await?.is_empty());
        let node_a = PinnedVersions::new(first.clone(), store.clone());
        node_a.sync().await?;
        let stored = store.workflow_versions().await?;
        assert_eq!(stored.len(), 1, "the file-only version was stored on start");
        assert_eq!(
            (stored[0].name.as_str(), stored[0].version.as_str()),
            (workflow.name.as_str(), workflow.version.as_str())
        );
        assert!(stored[0].files.contains_key("demo.json"));

        // Another node (its own, empty data dir) gets it from the store on start, and can
        // load it as an older version when it serves something else now.
        let second = tmp.path().join("node-b");
        PinnedVersions::new(second.clone(), store.clone())
            .sync()
            .await?;
        let older = older_versions(&second, &[]);
        assert_eq!(older.len(), 1);
        assert_eq!(older[0].version, workflow.version);
        assert!(
            older[0].dir.starts_with(&second),
            "loaded from node b's own copy"
        );

        // Pinning a served version puts it in both places; pinning it again changes nothing.
        let other = shipped("TextToolkit")?;
        let pinned = node_a.pin(&other).await?;
        assert!(pinned.dir.starts_with(&first));
        node_a.pin(&other).await?;
        assert_eq!(store.workflow_versions().await?.len(), 2);
        Ok(())
    }

    #[test]
    fn a_stored_version_writes_only_manifest_files_into_its_own_folder() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let hostile = WorkflowVersion {
            name: "../../evil".into(),
            version: "v1".into(),
            files: [
                ("workflow.json".to_owned(), "{}".to_owned()),
                ("../../outside.txt".to_owned(), "x".to_owned()),
            ]
            .into_iter()
            .collect(),
        };
        assert!(write_version(tmp.path(), &hostile)?);
        let folder = versions_root(tmp.path()).join("______evil").join("v1");
        assert!(folder.join("workflow.json").is_file());
        assert!(!tmp.path().join("outside.txt").exists());
        assert_eq!(std::fs::read_dir(&folder)?.count(), 1);
        let bad_version = WorkflowVersion {
            version: "../v2".into(),
            ..hostile
        };
        assert!(!write_version(tmp.path(), &bad_version)?, "skipped");
        Ok(())
    }
}
