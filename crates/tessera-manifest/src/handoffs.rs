//! Handoff rules (`handoffs.json`): who speaks after an agent, either when a condition over the
//! context variables holds or unconditionally after its work.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::error::Diag;
use crate::expr::Expr;
use crate::json::{Loc, array, did_you_mean, object};

/// Where control goes when a rule fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoffTarget {
    /// Another agent of the workflow.
    Agent(String),
    /// Back to the human (the chat waits for user input).
    User,
    /// The chat ends.
    Terminate,
}

/// When a rule is considered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoffKind {
    /// Fires when its condition is true (checked first, in file order).
    Condition,
    /// Fallback after the agent's turn when no condition fired.
    AfterWork,
}

/// One rule of `handoffs.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct HandoffRule {
    /// Agent whose turn just ended.
    pub source_agent: String,
    /// Next speaker.
    pub target: HandoffTarget,
    /// Conditional or after-work.
    pub kind: HandoffKind,
    /// Parsed condition (`Some` exactly for [`HandoffKind::Condition`]).
    pub condition: Option<Expr>,
    /// The condition as written, for logs and events.
    pub condition_text: Option<String>,
}

/// Parses `handoffs.json`. `agents`/`vars` are `None` when their file is unreadable.
pub(crate) fn parse(
    doc: &Value,
    agents: Option<&BTreeSet<String>>,
    vars: Option<&BTreeSet<String>>,
    d: &mut Diag,
) -> Vec<HandoffRule> {
    let mut out = Vec::new();
    let root = Loc::root("handoffs.json");
    let Some(top) = object(doc, &root, "the document", d) else {
        return out;
    };
    top.allow_keys(&["handoff_rules"], d);
    let Some(rules_v) = top.get("handoff_rules") else {
        root.err(
            d,
            "missing required key \"handoff_rules\" (an array of rules)",
        );
        return out;
    };
    let rloc = root.key("handoff_rules");
    let Some(items) = array(rules_v, &rloc, "\"handoff_rules\"", d) else {
        return out;
    };
    let mut after_work_seen: BTreeSet<String> = BTreeSet::new();
    for (i, v) in items.iter().enumerate() {
        let loc = rloc.idx(i);
        if let Some(rule) = parse_rule(v, &loc, agents, vars, d) {
            if rule.kind == HandoffKind::AfterWork
                && !after_work_seen.insert(rule.source_agent.clone())
            {
                loc.err(
                    d,
                    format!(
                        "agent \"{}\" already has an after_work rule; keep only one",
                        rule.source_agent
                    ),
                );
                continue;
            }
            out.push(rule);
        }
    }
    out
}

fn check_agent(name: &str, loc: &Loc, agents: Option<&BTreeSet<String>>, d: &mut Diag) -> bool {
    match agents {
        Some(a) if !a.contains(name) => {
            loc.err(
                d,
                format!(
                    "agent \"{name}\" is not declared in agents.json{}; fix the name",
                    did_you_mean(name, a.iter().map(String::as_str))
                ),
            );
            false
        }
        _ => true,
    }
}

fn parse_rule(
    v: &Value,
    loc: &Loc,
    agents: Option<&BTreeSet<String>>,
    vars: Option<&BTreeSet<String>>,
    d: &mut Diag,
) -> Option<HandoffRule> {
    let o = object(v, loc, "a handoff rule", d)?;
    o.allow_keys(
        &[
            "source_agent",
            "target_agent",
            "handoff_type",
            "condition",
            "transition_target",
            "description",
        ],
        d,
    );
    let mut ok = true;
    let source = o.req_str("source_agent", d);
    if let Some(s) = source {
        ok &= check_agent(s, &loc.key("source_agent"), agents, d);
    }
    let target = match o.req_str("target_agent", d) {
        Some("user") => Some(HandoffTarget::User),
        Some("terminate") => Some(HandoffTarget::Terminate),
        Some(t) => {
            let known = match agents {
                Some(a) if !a.contains(t) => {
                    let candidates = a.iter().map(String::as_str).chain(["user", "terminate"]);
                    loc.key("target_agent").err(
                        d,
                        format!(
                            "target \"{t}\" is neither an agent in agents.json nor \"user\" or \"terminate\"{}",
                            did_you_mean(t, candidates)
                        ),
                    );
                    false
                }
                _ => true,
            };
            ok &= known;
            Some(HandoffTarget::Agent(t.to_owned()))
        }
        None => None,
    };
    let kind = match o.req_str("handoff_type", d) {
        Some("condition") => Some(HandoffKind::Condition),
        Some("after_work") => Some(HandoffKind::AfterWork),
        Some(other) => {
            loc.key("handoff_type").err(
                d,
                format!(
                    "\"handoff_type\" must be \"condition\" or \"after_work\", found \"{other}\""
                ),
            );
            None
        }
        None => None,
    };
    let text = o.opt_str("condition", d);
    if o.get("condition").is_some() && text.is_none() {
        ok = false;
    }
    let _ = o.opt_str("transition_target", d);
    let mut condition = None;
    match (kind, text) {
        (Some(HandoffKind::Condition), None) => {
            if o.get("condition").is_none() {
                loc.err(
                    d,
                    "a \"condition\" handoff needs a \"condition\" such as \"${flag} == True\"",
                );
            }
            ok = false;
        }
        (Some(HandoffKind::AfterWork), Some(_)) => {
            loc.key("condition").err(
                d,
                "an after_work rule has no condition; remove \"condition\" or use \"handoff_type\": \"condition\"",
            );
            ok = false;
        }
        (Some(HandoffKind::Condition), Some(t)) => match Expr::parse(t) {
            Ok(e) => {
                if let Some(vars) = vars {
                    for name in e.variables() {
                        if !vars.contains(name) {
                            loc.key("condition").err(
                                d,
                                format!(
                                    "${{{name}}} is not a declared or derived variable{}; declare it in context_variables.json",
                                    did_you_mean(name, vars.iter().map(String::as_str))
                                ),
                            );
                            ok = false;
                        }
                    }
                }
                condition = Some(e);
            }
            Err(e) => {
                loc.key("condition")
                    .err(d, format!("invalid condition: {e}"));
                ok = false;
            }
        },
        _ => {}
    }
    if !ok {
        return None;
    }
    Some(HandoffRule {
        source_agent: source?.to_owned(),
        target: target?,
        kind: kind?,
        condition,
        condition_text: text.map(str::to_owned),
    })
}
