//! The one trait every executable tool implements, and the context it runs in.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value};

use crate::ToolError;

/// Who and where a tool runs for. The engine fills it; a tool must scope every read and write
/// to `app_id` (tenant) and `user_id`, so no tool can see another tenant's data.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The chat the call belongs to.
    pub chat_id: Arc<str>,
    /// The tenant.
    pub app_id: Arc<str>,
    /// The user, within the tenant.
    pub user_id: Arc<str>,
    /// The workflow the chat runs.
    pub workflow_name: Arc<str>,
    /// `{chat_id}`-scoped key of the agent turn this call belongs to.
    pub turn_idempotency_key: Arc<str>,
    /// The agent that made the call.
    pub agent_name: Arc<str>,
    /// Secrets the chat collected that this tool declared in `uses_secrets` (the engine
    /// narrows the view per tool); `None` for every other tool. Never part of [`Self::to_json`].
    pub secrets: Option<SecretView>,
}

/// A read-only view of some of a chat's collected secrets (e.g. the Generator's `apiKey`).
///
/// WHY its own type: `Debug` shows only the names, and the values are overwritten when the
/// last view is dropped, so a tool context can be logged or cloned without leaking them.
#[derive(Clone)]
pub struct SecretView(Arc<SecretEntries>);

struct SecretEntries(Vec<(String, String)>);

impl Drop for SecretEntries {
    fn drop(&mut self) {
        for (_, value) in &mut self.0 {
            let mut bytes = std::mem::take(value).into_bytes();
            bytes.iter_mut().for_each(|b| *b = 0);
            std::hint::black_box(&bytes);
        }
    }
}

impl SecretView {
    /// A view of `(name, value)` pairs.
    pub fn new(entries: Vec<(String, String)>) -> Self {
        Self(Arc::new(SecretEntries(entries)))
    }

    /// The value of secret `name`, if collected.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `text` (plain or JSON) with every collected secret value, as is or JSON-escaped,
    /// replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (_, value) in self.0.0.iter().filter(|(_, v)| !v.is_empty()) {
            let escaped = serde_json::to_string(value).unwrap_or_default();
            let escaped = escaped.trim_matches('"');
            for form in [value.as_str(), escaped] {
                if !form.is_empty() && out.contains(form) {
                    out = out.replace(form, "[redacted]");
                }
            }
        }
        out
    }

    /// Whether secret `name` was collected (what a tool may record instead of the value).
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The view narrowed to `names`; `None` when none of them is held.
    pub fn only(&self, names: &[String]) -> Option<SecretView> {
        let kept: Vec<(String, String)> = self
            .0
            .0
            .iter()
            .filter(|(n, _)| names.contains(n))
            .cloned()
            .collect();
        (!kept.is_empty()).then(|| SecretView::new(kept))
    }
}

impl std::fmt::Debug for SecretView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries(self.0.0.iter().map(|(n, _)| format!("{n}=<redacted>")))
            .finish()
    }
}

impl ToolContext {
    /// The `context_variables` object the spec injects into tool kwargs.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "chat_id": &*self.chat_id,
            "app_id": &*self.app_id,
            "user_id": &*self.user_id,
            "workflow_name": &*self.workflow_name,
            "turn_idempotency_key": &*self.turn_idempotency_key,
            "agent_name": &*self.agent_name,
        })
    }
}

/// An executable tool. `args` are already validated and normalized against the tool's schema
/// (see [`crate::args`]); the returned value is the tool's JSON result, which the engine
/// truncates before the model sees it. Implementations are shared by all chats.
pub trait Tool: Send + Sync + 'static {
    /// Run the tool. A business failure is `Ok` with `"status": "error"`; `Err` is for calls
    /// that produced no result (timeout, transport failure, cancellation).
    fn invoke(
        &self,
        args: Map<String, Value>,
        ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_view_redacts_and_narrows() {
        let view = SecretView::new(vec![
            ("apiKey".into(), "sk-canary-42".into()),
            ("other".into(), "x".into()),
        ]);
        assert!(!format!("{view:?}").contains("sk-canary-42"));
        let narrowed = view.only(&["apiKey".to_owned()]);
        assert_eq!(
            narrowed.as_ref().and_then(|v| v.get("apiKey")),
            Some("sk-canary-42")
        );
        assert!(narrowed.is_some_and(|v| !v.contains("other")));
        assert!(view.only(&["missing".to_owned()]).is_none());
    }

    #[test]
    fn redact_hides_secret_values_plain_and_json_escaped() {
        let view = SecretView::new(vec![
            ("apiKey".into(), "sk-canary-42".into()),
            ("pin".into(), "a\"b".into()),
        ]);
        let json = serde_json::json!({"text": "key sk-canary-42 and a\"b"}).to_string();
        let redacted = view.redact(&json);
        assert!(!redacted.contains("sk-canary-42"), "{redacted}");
        assert!(!redacted.contains("a\\\"b"), "{redacted}");
        assert_eq!(redacted.matches("[redacted]").count(), 2, "{redacted}");
        assert_eq!(view.redact("nothing secret"), "nothing secret");
    }
}
