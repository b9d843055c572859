//! Built-in tools: implemented in Rust, available to every workflow that names them.
//!
//! WHY in-process: they are either trivial (echo, word_count) or need the engine's own
//! stores (todo tasks, artifact files), so an HTTP round trip would only add failure modes.

mod echo;
mod generate_and_download;
mod todo;
mod word_count;

pub use echo::Echo;
pub use generate_and_download::GenerateAndDownload;
pub use todo::{TodoOp, TodoTool};
pub use word_count::WordCount;

use serde_json::{Map, Value};

/// `{"status": "error", "message": ...}`: a tool's own, expected failure, reported to the
/// model as a result (it can react), not as a [`crate::ToolError`].
pub(crate) fn error_result(message: impl Into<String>) -> Value {
    crate::ToolErrorResult::new(None, &message.into()).to_value()
}

/// The argument `key` as a string, if present and a string.
pub(crate) fn str_arg<'a>(args: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}
