//! `generate_and_download`: the Generator workflow's bundle builder (tool_manifest.md, "File
//! Delivery Pattern"). It runs before the FileDownloadCenter UI is shown; its result (`mode`,
//! `files`) is merged into that UI payload.
//!
//! It sees the agent's structured output and the call context. Its manifest entry declares
//! `uses_secrets: ["apiKey"]`, so the context carries the collected key, but the tool records
//! only *that* a key was provided (`api_key_provided`), never its value: a bundle cannot
//! contain collected credentials.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::str_arg;
use crate::artifacts::ArtifactStore;
use crate::zip::write_stored_zip;
use crate::{Tool, ToolContext, ToolError};

/// Longest file-name stem derived from a workflow name.
const MAX_SLUG_CHARS: usize = 64;

/// Builds a `.zip` workflow bundle (README.md, workflow.json, action_plan.json when a plan
/// was given) and stores it for download from the chat it was made in.
#[derive(Clone)]
pub struct GenerateAndDownload {
    artifacts: Arc<dyn ArtifactStore>,
}

impl std::fmt::Debug for GenerateAndDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenerateAndDownload")
            .finish_non_exhaustive()
    }
}

impl GenerateAndDownload {
    /// Tool name.
    pub const NAME: &'static str = "generate_and_download";
    /// Description shown to the model.
    pub const DESCRIPTION: &'static str =
        "Generate workflow files and deliver them as a downloadable ZIP";

    /// The tool, storing bundles in `artifacts`.
    pub fn new(artifacts: Arc<dyn ArtifactStore>) -> Self {
        Self { artifacts }
    }

    /// JSON Schema of the arguments: anything (the agent's structured output); the known
    /// fields are `agent_message`, `confirmation_only` and `ActionPlan`.
    pub fn parameters() -> Value {
        json!({
            "type": "object",
            "properties": {
                "agent_message": { "type": "string" },
                "confirmation_only": { "type": "boolean", "default": false },
                "ActionPlan": { "type": "object" }
            },
            "additionalProperties": true
        })
    }

    async fn run(&self, args: &Map<String, Value>, ctx: &ToolContext) -> Result<Value, ToolError> {
        if args.get("confirmation_only").and_then(Value::as_bool) == Some(true) {
            return Ok(json!({ "status": "success", "mode": "confirmation", "files": [] }));
        }
        let plan = args
            .get("ActionPlan")
            .or_else(|| args.get("action_plan"))
            .filter(|p| p.is_object());
        let name = plan
            .and_then(|p| {
                p.pointer("/workflow/name")
                    .or_else(|| p.get("name"))
                    .and_then(Value::as_str)
            })
            .filter(|n| !n.trim().is_empty())
            .unwrap_or(&ctx.workflow_name)
            .trim()
            .to_owned();
        let slug = slug(&name);
        let entries = bundle_entries(&name, &slug, plan, str_arg(args, "agent_message"), ctx)?;
        let zip = write_stored_zip(&entries)
            .map_err(|e| ToolError::Failed(format!("could not build bundle: {e}")))?;
        let file_name = format!("{slug}_bundle.zip");
        let stored = self
            .artifacts
            .put(
                &ctx.app_id,
                &ctx.user_id,
                &ctx.chat_id,
                &file_name,
                Bytes::from(zip),
            )
            .await?;
        tracing::info!(
            chat_id = %ctx.chat_id,
            artifact_id = %stored.id,
            size = stored.size,
            "workflow bundle stored"
        );
        Ok(json!({
            "status": "success",
            "mode": "download",
            "api_key_provided": api_key_provided(ctx),
            "files": [{
                "name": stored.file_name,
                "size": stored.size,
                "artifact_id": stored.id,
                "download_path": format!(
                    "/api/v1/chats/{}/files/{}",
                    percent_encode(&ctx.chat_id),
                    percent_encode(&stored.id)
                ),
            }],
        }))
    }
}

impl Tool for GenerateAndDownload {
    fn invoke(
        &self,
        args: Map<String, Value>,
        ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        let this = self.clone();
        Box::pin(async move { this.run(&args, &ctx).await })
    }
}

/// The files of the bundle, all under a `<slug>/` folder.
fn bundle_entries(
    name: &str,
    slug: &str,
    plan: Option<&Value>,
    agent_message: Option<&str>,
    ctx: &ToolContext,
) -> Result<Vec<(String, Vec<u8>)>, ToolError> {
    let phases = plan.map(plan_phases).unwrap_or_default();
    let agents = plan.map(plan_agents).unwrap_or_default();

    let key_provided = api_key_provided(ctx);
    let workflow = json!({
        "name": name,
        "version": 1,
        "generated_from": &*ctx.workflow_name,
        "phases": phases,
        "agents": agents,
        "tools": [],
        "api_key_provided": key_provided,
    });
    let to_json = |v: &Value| {
        serde_json::to_vec_pretty(v)
            .map_err(|e| ToolError::Failed(format!("could not serialize bundle file: {e}")))
    };

    let mut readme = format!(
        "# {name}\n\nWorkflow bundle generated by Tessera (from the `{}` workflow).\n",
        ctx.workflow_name
    );
    if let Some(message) = agent_message.map(str::trim).filter(|m| !m.is_empty()) {
        readme.push_str(&format!("\n{message}\n"));
    }
    if !phases.is_empty() {
        readme.push_str("\n## Phases\n\n");
        for (i, phase) in phases.iter().enumerate() {
            readme.push_str(&format!("{}. {}\n", i + 1, phase));
        }
    }
    readme.push_str(if key_provided {
        "\nAPI key: provided during the chat (kept in the chat's encrypted vault, not in this bundle).\n"
    } else {
        "\nAPI key: not provided.\n"
    });
    readme
        .push_str("\n## Contents\n\n- `workflow.json`: workflow skeleton (name, phases, agents)\n");
    if plan.is_some() {
        readme.push_str("- `action_plan.json`: the approved action plan, as given\n");
    }

    let mut entries = vec![
        (format!("{slug}/README.md"), readme.into_bytes()),
        (format!("{slug}/workflow.json"), to_json(&workflow)?),
    ];
    if let Some(plan) = plan {
        entries.push((format!("{slug}/action_plan.json"), to_json(plan)?));
    }
    Ok(entries)
}

/// Whether the chat collected an API key; the value itself is never read here.
fn api_key_provided(ctx: &ToolContext) -> bool {
    ctx.secrets.as_ref().is_some_and(|s| s.contains("apiKey"))
}

/// The phases array of a plan (`workflow.phases` or `phases`).
fn phases_of(plan: &Value) -> &[Value] {
    plan.pointer("/workflow/phases")
        .or_else(|| plan.get("phases"))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Phase names (`name`, `title` or `phase_name`), in order.
fn plan_phases(plan: &Value) -> Vec<String> {
    phases_of(plan)
        .iter()
        .filter_map(|p| {
            p.get("name")
                .or_else(|| p.get("title"))
                .or_else(|| p.get("phase_name"))
                .and_then(Value::as_str)
        })
        .map(str::to_owned)
        .collect()
}

/// Distinct agent names mentioned by the phases (`agents: [string | {name}]`).
fn plan_agents(plan: &Value) -> Vec<Value> {
    let mut names: Vec<String> = Vec::new();
    for phase in phases_of(plan) {
        let Some(agents) = phase.get("agents").and_then(Value::as_array) else {
            continue;
        };
        for agent in agents {
            let name = agent
                .as_str()
                .or_else(|| agent.get("name").and_then(Value::as_str))
                .or_else(|| agent.get("agent_name").and_then(Value::as_str));
            if let Some(n) = name.filter(|n| !names.iter().any(|x| x == n)) {
                names.push(n.to_owned());
            }
        }
    }
    names.into_iter().map(|n| json!({ "name": n })).collect()
}

/// A safe file-name stem: ASCII letters, digits, `-` and `_` kept, anything else `_`.
fn slug(name: &str) -> String {
    let s: String = name
        .chars()
        .take(MAX_SLUG_CHARS)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let s = s.trim_matches('_');
    if s.is_empty() {
        "workflow".to_owned()
    } else {
        s.to_owned()
    }
}

/// Percent-encode everything but RFC 3986 unreserved characters (for a URL path segment).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
