//! The todo tools of agent_runner.md: `add_task`, `list_tasks`, `complete_task`, `delete_task`.
//! Every call is scoped to the caller's tenant (`ctx.app_id`) and user (`ctx.user_id`), taken
//! from the engine's context, never from the model's arguments.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::{error_result, str_arg};
use crate::tasks::{TaskFilter, TaskStore};
use crate::{Tool, ToolContext, ToolError};

/// Longest accepted task title, in chars.
const MAX_TITLE_CHARS: usize = 500;
/// Longest accepted task description, in chars.
const MAX_DESCRIPTION_CHARS: usize = 5000;
const NOT_FOUND: &str = "Task not found.";

/// Which of the four todo operations a [`TodoTool`] performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TodoOp {
    /// `add_task {title, description?}`
    Add,
    /// `list_tasks {status?: all|pending|completed}`
    List,
    /// `complete_task {task_id}`
    Complete,
    /// `delete_task {task_id}`
    Delete,
}

impl TodoOp {
    /// All operations, in registration order.
    pub const ALL: [TodoOp; 4] = [TodoOp::Add, TodoOp::List, TodoOp::Complete, TodoOp::Delete];

    /// Tool name.
    pub fn name(self) -> &'static str {
        match self {
            TodoOp::Add => "add_task",
            TodoOp::List => "list_tasks",
            TodoOp::Complete => "complete_task",
            TodoOp::Delete => "delete_task",
        }
    }

    /// Description shown to the model.
    pub fn description(self) -> &'static str {
        match self {
            TodoOp::Add => "Add a task to the user's todo list",
            TodoOp::List => "List the user's tasks (all, pending or completed)",
            TodoOp::Complete => "Mark one of the user's tasks as completed",
            TodoOp::Delete => "Delete one of the user's tasks",
        }
    }

    /// JSON Schema of the arguments.
    pub fn parameters(self) -> Value {
        match self {
            TodoOp::Add => json!({
                "type": "object",
                "properties": {
                    "title": { "type": "string", "description": "Short task title" },
                    "description": { "type": "string", "description": "Optional details" }
                },
                "required": ["title"]
            }),
            TodoOp::List => json!({
                "type": "object",
                "properties": {
                    "status": {
                        "type": "string",
                        "enum": ["all", "pending", "completed"],
                        "default": "all",
                        "description": "Which tasks to list"
                    }
                }
            }),
            TodoOp::Complete | TodoOp::Delete => json!({
                "type": "object",
                "properties": {
                    "task_id": { "type": "string", "description": "Id of the task" }
                },
                "required": ["task_id"]
            }),
        }
    }
}

/// One todo operation over a shared [`TaskStore`].
#[derive(Clone)]
pub struct TodoTool {
    op: TodoOp,
    store: Arc<dyn TaskStore>,
}

impl TodoTool {
    /// The tool performing `op` against `store`.
    pub fn new(op: TodoOp, store: Arc<dyn TaskStore>) -> Self {
        Self { op, store }
    }
}

impl std::fmt::Debug for TodoTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TodoTool")
            .field("op", &self.op)
            .finish_non_exhaustive()
    }
}

impl Tool for TodoTool {
    fn invoke(
        &self,
        args: Map<String, Value>,
        ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        let this = self.clone();
        Box::pin(async move { this.run(&args, &ctx).await })
    }
}

impl TodoTool {
    async fn run(&self, args: &Map<String, Value>, ctx: &ToolContext) -> Result<Value, ToolError> {
        let (tenant, user) = (&*ctx.app_id, &*ctx.user_id);
        match self.op {
            TodoOp::Add => {
                let title = match str_arg(args, "title").map(str::trim) {
                    Some(t) if !t.is_empty() => t,
                    _ => return Ok(error_result("title is required")),
                };
                if title.chars().count() > MAX_TITLE_CHARS {
                    return Ok(error_result(format!(
                        "title is too long (max {MAX_TITLE_CHARS} characters)"
                    )));
                }
                let description = str_arg(args, "description")
                    .map(str::trim)
                    .filter(|d| !d.is_empty());
                if description.is_some_and(|d| d.chars().count() > MAX_DESCRIPTION_CHARS) {
                    return Ok(error_result(format!(
                        "description is too long (max {MAX_DESCRIPTION_CHARS} characters)"
                    )));
                }
                let task = self.store.add(tenant, user, title, description).await?;
                Ok(json!({
                    "status": "success",
                    "message": format!("Task '{}' added.", task.title),
                    "task": task,
                }))
            }
            TodoOp::List => {
                let filter = match str_arg(args, "status") {
                    None => TaskFilter::All,
                    Some(s) => match TaskFilter::parse(s) {
                        Some(f) => f,
                        None => {
                            return Ok(error_result(
                                "status must be one of: all, pending, completed",
                            ));
                        }
                    },
                };
                let tasks = self.store.list(tenant, user, filter).await?;
                Ok(json!({
                    "status": "success",
                    "count": tasks.len(),
                    "tasks": tasks,
                }))
            }
            TodoOp::Complete | TodoOp::Delete => {
                let task_id = match str_arg(args, "task_id").map(str::trim) {
                    Some(id) if !id.is_empty() => id,
                    _ => return Ok(error_result("task_id is required")),
                };
                let (found, verb) = if self.op == TodoOp::Complete {
                    (
                        self.store.complete(tenant, user, task_id).await?,
                        "completed",
                    )
                } else {
                    (self.store.delete(tenant, user, task_id).await?, "deleted")
                };
                Ok(match found {
                    Some(task) => json!({
                        "status": "success",
                        "message": format!("Task '{}' {verb}.", task.title),
                        "task": task,
                    }),
                    None => error_result(NOT_FOUND),
                })
            }
        }
    }
}
