//! Error types: every manifest problem is a [`ManifestError`]; a load reports all of them at once.

use std::fmt;

/// One problem found in a workflow's manifests, located precisely enough to fix it without
/// guessing: the workflow folder, the file, a JSON pointer into it, and a one-sentence remedy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ManifestError {
    /// Folder name of the workflow (e.g. `Generator`), so errors from many workflows stay apart.
    pub workflow: String,
    /// File inside the workflow folder (e.g. `tools.json`).
    pub file: String,
    /// JSON pointer to the offending value (e.g. `/tools/2/ui/mode`); empty for the whole file.
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl ManifestError {
    fn render(&self) -> String {
        if self.path.is_empty() {
            format!("{}/{}: {}", self.workflow, self.file, self.message)
        } else {
            format!(
                "{}/{} {}: {}",
                self.workflow, self.file, self.path, self.message
            )
        }
    }
}

/// All problems found while loading one workflow: authors fix everything in one pass instead of
/// discovering errors one at a time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ManifestErrors(pub Vec<ManifestError>);

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl ManifestErrors {
    /// Iterates the individual errors, so callers need not reach into the tuple field.
    pub fn iter(&self) -> std::slice::Iter<'_, ManifestError> {
        self.0.iter()
    }

    /// Number of errors, for summaries such as "3 errors".
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no error was recorded (a loaded workflow never returns an empty set).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Collects errors while a workflow is checked (internal).
#[derive(Debug)]
pub(crate) struct Diag {
    workflow: String,
    errors: Vec<ManifestError>,
}

impl Diag {
    pub(crate) fn new(workflow: impl Into<String>) -> Self {
        Self {
            workflow: workflow.into(),
            errors: Vec::new(),
        }
    }

    /// Records one error.
    pub(crate) fn err(&mut self, file: &str, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ManifestError {
            workflow: self.workflow.clone(),
            file: file.to_owned(),
            path: path.into(),
            message: message.into(),
        });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub(crate) fn into_errors(self) -> ManifestErrors {
        ManifestErrors(self.errors)
    }
}
