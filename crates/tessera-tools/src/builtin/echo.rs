//! `echo`: repeats a message; used to check tool wiring end to end (tool_manifest.md).

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::{error_result, str_arg};
use crate::{Tool, ToolContext, ToolError};

/// The `echo` tool: `{message, repeat_count = 1}` → the message repeated, space-separated.
#[derive(Debug, Clone, Copy, Default)]
pub struct Echo;

impl Echo {
    /// Tool name.
    pub const NAME: &'static str = "echo";
    /// Description shown to the model.
    pub const DESCRIPTION: &'static str = "Echo test tool for debugging agent communication";

    /// JSON Schema of the arguments. The 1..=10 range is checked by the tool itself, so the
    /// model gets the spec's error result rather than a validation error.
    pub fn parameters() -> Value {
        json!({
            "type": "object",
            "properties": {
                "message": { "type": "string", "description": "Message to echo back" },
                "repeat_count": {
                    "type": "integer",
                    "default": 1,
                    "description": "Number of times to repeat (1 to 10)"
                }
            },
            "required": ["message"]
        })
    }

    fn run(args: &Map<String, Value>) -> Value {
        let message = match str_arg(args, "message") {
            Some(m) if !m.is_empty() => m,
            _ => return error_result("message parameter is required"),
        };
        let repeat = match args.get("repeat_count") {
            None | Some(Value::Null) => 1,
            Some(v) => match v.as_i64() {
                Some(n) if (1..=10).contains(&n) => n as usize,
                _ => return error_result("repeat_count must be between 1 and 10"),
            },
        };
        let echoed = vec![message; repeat].join(" ");
        tracing::debug!(repeat, original_len = message.len(), "echo");
        json!({
            "status": "success",
            "original_length": message.chars().count(),
            "repeated_length": echoed.chars().count(),
            "echoed": echoed,
        })
    }
}

impl Tool for Echo {
    fn invoke(
        &self,
        args: Map<String, Value>,
        _ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        Box::pin(std::future::ready(Ok(Self::run(&args))))
    }
}
