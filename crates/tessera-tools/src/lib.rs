//! tessera-tools
//!
//! Everything about executing a tool call, independent of the engine and the manifest
//! format: the [`Tool`] trait, strict argument validation ([`ArgSchema`]), the JSON-mode
//! text protocol, result summarization, built-in and HTTP tools, and the declarative UI
//! tool's payload/response functions. APIs take plain values (JSON Schemas as
//! `serde_json::Value`, secret field names as `&[String]`) so the engine can feed them
//! manifest data.

#![warn(missing_docs)]

pub mod args;
pub mod artifacts;
pub mod builtin;
pub mod error;
pub mod http;
pub mod registry;
pub mod tasks;
pub mod tool;
pub mod truncate;
pub mod ui;
mod zip;

pub use args::{ArgSchema, JsonModeReply, parse_arguments, parse_json_mode_reply};
pub use artifacts::{ArtifactRef, ArtifactStore, InMemoryArtifactStore, StoredArtifact};
pub use error::{StoreError, ToolError, ToolErrorResult};
pub use http::HttpTool;
pub use registry::{BuiltinRegistry, RegisteredTool, ToolServices};
pub use tasks::{InMemoryTaskStore, Task, TaskFilter, TaskStore};
pub use tool::{SecretView, Tool, ToolContext};
pub use truncate::summarize_for_model;
pub use ui::{
    SanitizedResponse, build_ui_payload, interrupted_result, is_success, normalize_ui_response,
    sanitize_ui_response, ui_cancelled_result, ui_timeout_result,
};
