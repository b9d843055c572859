//! The todo list store behind the `add_task` / `list_tasks` / `complete_task` / `delete_task`
//! built-ins.
//!
//! WHY a trait: the store crate implements it against SQLite/PostgreSQL; the in-memory
//! version serves tests and single-process development. Every method takes the tenant and
//! the user, so isolation is part of the interface and not a convention of callers.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::StoreError;

/// One todo item, owned by exactly one (tenant, user).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Opaque id (`t_` + 12 hex chars); unique across all owners.
    pub id: String,
    /// Short title.
    pub title: String,
    /// Optional longer text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Whether the task was completed.
    pub completed: bool,
    /// Creation time, Unix milliseconds.
    pub created_at_ms: u64,
}

/// Which tasks `list` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskFilter {
    /// Every task.
    All,
    /// Tasks not yet completed.
    Pending,
    /// Completed tasks.
    Completed,
}

impl TaskFilter {
    /// Parse the tool argument (`all`, `pending`, `completed`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "all" => Some(Self::All),
            "pending" => Some(Self::Pending),
            "completed" => Some(Self::Completed),
            _ => None,
        }
    }

    fn matches(self, task: &Task) -> bool {
        match self {
            Self::All => true,
            Self::Pending => !task.completed,
            Self::Completed => task.completed,
        }
    }
}

/// Persistent todo lists, scoped by tenant (`app_id`) and user. An id that belongs to another
/// owner must behave exactly like an id that does not exist.
pub trait TaskStore: Send + Sync {
    /// Create a task for (tenant, user).
    fn add<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        title: &'a str,
        description: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Task, StoreError>>;

    /// The owner's tasks matching `filter`, oldest first.
    fn list<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        filter: TaskFilter,
    ) -> BoxFuture<'a, Result<Vec<Task>, StoreError>>;

    /// Mark the owner's task completed; `None` when the owner has no such task.
    fn complete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Task>, StoreError>>;

    /// Delete the owner's task; returns it, or `None` when the owner has no such task.
    fn delete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Task>, StoreError>>;
}

type Owner = (String, String);

/// Process-local [`TaskStore`] for tests and development.
#[derive(Debug, Default)]
pub struct InMemoryTaskStore {
    // A std Mutex is fine: this is a data store, not engine state, and the lock is never held
    // across an await (every method finishes its work before returning a ready future).
    tasks: Mutex<HashMap<Owner, Vec<Task>>>,
}

impl InMemoryTaskStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn with_owner<T>(
        &self,
        tenant: &str,
        user: &str,
        f: impl FnOnce(&mut Vec<Task>) -> T,
    ) -> Result<T, StoreError> {
        let mut guard = self
            .tasks
            .lock()
            .map_err(|_| StoreError("task store lock poisoned".to_owned()))?;
        let list = guard
            .entry((tenant.to_owned(), user.to_owned()))
            .or_default();
        Ok(f(list))
    }
}

impl TaskStore for InMemoryTaskStore {
    fn add<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        title: &'a str,
        description: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Task, StoreError>> {
        let task = Task {
            id: format!("t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            title: title.to_owned(),
            description: description.map(str::to_owned),
            completed: false,
            created_at_ms: now_ms(),
        };
        let result = self.with_owner(tenant, user, |list| {
            list.push(task.clone());
            task
        });
        Box::pin(std::future::ready(result))
    }

    fn list<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        filter: TaskFilter,
    ) -> BoxFuture<'a, Result<Vec<Task>, StoreError>> {
        let result = self.with_owner(tenant, user, |list| {
            list.iter().filter(|t| filter.matches(t)).cloned().collect()
        });
        Box::pin(std::future::ready(result))
    }

    fn complete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Task>, StoreError>> {
        let result = self.with_owner(tenant, user, |list| {
            list.iter_mut().find(|t| t.id == task_id).map(|t| {
                t.completed = true;
                t.clone()
            })
        });
        Box::pin(std::future::ready(result))
    }

    fn delete<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Task>, StoreError>> {
        let result = self.with_owner(tenant, user, |list| {
            list.iter()
                .position(|t| t.id == task_id)
                .map(|i| list.remove(i))
        });
        Box::pin(std::future::ready(result))
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
