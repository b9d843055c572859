//! `word_count`: counts words and chars of a text; a side-effect-free utility tool.

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::{error_result, str_arg};
use crate::{Tool, ToolContext, ToolError};

/// The `word_count` tool: `{text}` → `{"status":"success","words":n,"chars":n}`. Words are
/// whitespace-separated runs; chars are Unicode scalar values.
#[derive(Debug, Clone, Copy, Default)]
pub struct WordCount;

impl WordCount {
    /// Tool name.
    pub const NAME: &'static str = "word_count";
    /// Description shown to the model.
    pub const DESCRIPTION: &'static str = "Count the words and characters of a text";

    /// JSON Schema of the arguments.
    pub fn parameters() -> Value {
        json!({
            "type": "object",
            "properties": {
                "text": { "type": "string", "description": "Text to count" }
            },
            "required": ["text"]
        })
    }

    fn run(args: &Map<String, Value>) -> Value {
        match str_arg(args, "text") {
            Some(text) => json!({
                "status": "success",
                "words": text.split_whitespace().count(),
                "chars": text.chars().count(),
            }),
            None => error_result("text parameter is required"),
        }
    }
}

impl Tool for WordCount {
    fn invoke(
        &self,
        args: Map<String, Value>,
        _ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        Box::pin(std::future::ready(Ok(Self::run(&args))))
    }
}
