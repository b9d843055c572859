//! What follows an agent's turn, as plain functions of the workflow and the chat's context —
//! no actor, no I/O (like `TurnMachine`): handoff routing, derived variables, `ui_response`
//! triggers, and which variables clients may read. The session applies the results.

use super::variables::ContextVars;
use serde_json::{Map, Value};
use tessera_manifest::{HandoffKind, HandoffTarget, Workflow};

/// Where a chat goes after `agent`'s turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Route {
    /// The run ends (`terminate`), after a handoff to "terminate" with this reason.
    Terminate { reason: String },
    /// Wait for the user.
    User,
    /// `next` would exceed its `max_consecutive_auto_reply`: ask the user instead.
    ReplyLimit { next: String },
    /// `next` takes a turn; `in_a_row` is its run of turns since the user last spoke.
    Agent {
        next: String,
        reason: String,
        in_a_row: u32,
    },
}

/// Picks what follows `agent`: the first `condition` rule that holds, else the first
/// `after_work` rule, else the user. `consecutive` is `agent`'s run of turns so far.
pub(super) fn route(
    workflow: &Workflow,
    agent: &str,
    context: &Map<String, Value>,
    consecutive: u32,
) -> Route {
    let rules: Vec<_> = workflow.handoff_rules_for(agent).collect();
    let chosen = rules
        .iter()
        .find(|r| r.condition.as_ref().is_some_and(|c| c.eval(context)))
        .map(|r| {
            (
                r.target.clone(),
                r.condition_text.clone().unwrap_or_default(),
            )
        })
        .or_else(|| {
            rules
                .iter()
                .find(|r| r.kind == HandoffKind::AfterWork)
                .map(|r| (r.target.clone(), "after_work".to_owned()))
        });
    let (target, reason) = chosen.unwrap_or((HandoffTarget::User, "default".to_owned()));
    match target {
        HandoffTarget::Terminate => Route::Terminate { reason },
        HandoffTarget::User => Route::User,
        HandoffTarget::Agent(next) => {
            // AG2's max_consecutive_auto_reply: replies of the same agent in a row without
            // the user speaking.
            let limit = workflow
                .agent(&next)
                .map_or(0, |a| a.max_consecutive_auto_reply);
            let in_a_row = if next == agent { consecutive + 1 } else { 1 };
            if limit > 0 && in_a_row > limit {
                Route::ReplyLimit { next }
            } else {
                Route::Agent {
                    next,
                    reason,
                    in_a_row,
                }
            }
        }
    }
}

/// `agent_text_equals` derived variables: sets each whose trigger `text` matches; returns
/// whether the message is hidden from the UI.
pub(super) fn apply_derived(
    workflow: &Workflow,
    agent: &str,
    text: &str,
    context: &mut ContextVars,
) -> bool {
    let mut hidden = false;
    let trimmed = text.trim();
    for derived in &workflow.derived {
        if derived.source_agent == agent && trimmed == derived.trigger_value {
            context
                .edit()
                .insert(derived.name.clone(), Value::Bool(true));
            hidden |= derived.ui_hidden;
        }
    }
    hidden
}

/// `ui_response` triggers: copies a key of the (sanitized) answer to `tool` into a variable.
pub(super) fn apply_ui_response(
    workflow: &Workflow,
    tool: &str,
    response: &Value,
    context: &mut ContextVars,
) {
    for trigger in &workflow.ui_response_triggers {
        if trigger.tool != tool {
            continue;
        }
        let value = trigger
            .response_key
            .split('.')
            .try_fold(response, |v, key| v.get(key));
        if let Some(value) = value {
            context
                .edit()
                .insert(trigger.variable.clone(), value.clone());
        }
    }
}

/// Whether clients may read variable `name` (undeclared derived flags are visible).
pub(super) fn client_visible(workflow: &Workflow, name: &str) -> bool {
    workflow
        .variables
        .iter()
        .find(|v| v.name == name)
        .is_none_or(|v| v.client_visible)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use serde_json::json;

    fn fixture() -> Workflow {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/EngineTest");
        match tessera_manifest::load_workflow(&dir) {
            Ok(workflow) => workflow,
            Err(e) => panic!("fixture must load: {e}"),
        }
    }

    fn context(pairs: &[(&str, Value)]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    #[test]
    fn triggers_borrow_the_variables_to_change_only_when_they_fire() {
        let wf = fixture();
        let mut vars = ContextVars::new(Arc::new(context(&[("ready", json!(false))])));
        assert!(!apply_derived(&wf, "HelperAgent", "not yet", &mut vars));
        assert!(!apply_derived(&wf, "PlannerAgent", "NEXT", &mut vars));
        apply_ui_response(&wf, "other_tool", &json!({"status": "x"}), &mut vars);
        apply_ui_response(&wf, "review_plan", &json!({"other": "x"}), &mut vars);
        assert_eq!(
            vars.changes(),
            0,
            "nothing fired: the variables stay shared"
        );

        assert!(apply_derived(&wf, "HelperAgent", " NEXT ", &mut vars));
        assert_eq!(vars.get().get("ready"), Some(&json!(true)));
        apply_ui_response(&wf, "review_plan", &json!({"status": "ok"}), &mut vars);
        assert_eq!(vars.get().get("plan_status"), Some(&json!("ok")));
        assert_eq!(vars.changes(), 2);
    }

    #[test]
    fn the_first_condition_that_holds_wins() {
        let wf = fixture();
        let ready = context(&[("ready", json!(true)), ("mode", json!("json"))]);
        assert_eq!(
            route(&wf, "HelperAgent", &ready, 1),
            Route::Agent {
                next: "PlannerAgent".into(),
                reason: "${ready} == True".into(),
                in_a_row: 1,
            }
        );
        let json_mode = context(&[("ready", json!(false)), ("mode", json!("json"))]);
        assert!(matches!(
            route(&wf, "HelperAgent", &json_mode, 1),
            Route::Agent { next, .. } if next == "JsonAgent"
        ));
    }

    #[test]
    fn after_work_applies_when_no_condition_holds() {
        let wf = fixture();
        let idle = context(&[("ready", json!(false)), ("mode", json!("text"))]);
        assert_eq!(route(&wf, "HelperAgent", &idle, 1), Route::User);
    }

    #[test]
    fn terminate_carries_the_condition_as_reason() {
        let wf = fixture();
        let done = context(&[("plan_status", json!("success"))]);
        assert!(matches!(
            route(&wf, "PlannerAgent", &done, 1),
            Route::Terminate { reason } if reason.contains("plan_status")
        ));
    }

    #[test]
    fn an_agent_without_rules_hands_back_to_the_user() {
        let wf = fixture();
        assert_eq!(route(&wf, "NoSuchAgent", &Map::new(), 0), Route::User);
    }
}
