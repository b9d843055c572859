//! `demo.json`: the offline script replayed by the scripted model. Its reply format belongs to
//! the LLM crate; here we only check it is well-formed JSON naming real agents, so a renamed
//! agent does not silently break the demo.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::error::Diag;
use crate::json::{Loc, array, did_you_mean, object};

/// Checks `demo.json` against the workflow's agents (`None` when agents.json is unreadable).
pub(crate) fn check(doc: &Value, agents: Option<&BTreeSet<String>>, d: &mut Diag) {
    let root = Loc::root("demo.json");
    let Some(top) = object(doc, &root, "the document", d) else {
        return;
    };
    let Some(agents_v) = top.get("agents") else {
        root.err(
            d,
            "missing required key \"agents\" (agent name -> array of scripted replies)",
        );
        return;
    };
    let aloc = root.key("agents");
    let Some(scripts) = object(agents_v, &aloc, "\"agents\"", d) else {
        return;
    };
    for (name, script) in scripts.map {
        let loc = aloc.key(name);
        check_agent(name, &loc, agents, d);
        if script.is_object() {
            // `when` rules: their regexes and placeholders are checked by the demo model
            // itself when `tessera serve` loads the script.
            for key in ["when", "otherwise"] {
                match script.get(key) {
                    Some(Value::Array(_)) => {}
                    _ => loc.key(key).err(
                        d,
                        format!("\"{name}\" has `when` rules, so \"{key}\" must be an array"),
                    ),
                }
            }
        } else if array(
            script,
            &loc,
            &format!("the replies of \"{name}\" (or an object of `when` rules)"),
            d,
        )
        .is_some_and(<[Value]>::is_empty)
        {
            loc.err(
                d,
                format!("\"{name}\" has no scripted replies; add at least one or remove the agent"),
            );
        }
    }
    if let Some(lf) = top.get("loop_from") {
        let lloc = root.key("loop_from");
        if let Some(lf) = object(lf, &lloc, "\"loop_from\" (agent name -> reply index)", d) {
            for (name, idx) in lf.map {
                let loc = lloc.key(name);
                let len = scripts
                    .map
                    .get(name)
                    .and_then(Value::as_array)
                    .map(Vec::len);
                match (idx.as_u64(), len) {
                    (_, None) => loc.err(d, format!("\"{name}\" has no script under \"agents\"; remove it or add replies")),
                    (Some(i), Some(n)) if usize::try_from(i).is_ok_and(|i| i < n) => {}
                    _ => loc.err(
                        d,
                        format!("loop_from index must be an integer below the number of replies of \"{name}\""),
                    ),
                }
            }
        }
    }
}

fn check_agent(name: &str, loc: &Loc, agents: Option<&BTreeSet<String>>, d: &mut Diag) {
    if let Some(a) = agents
        && !a.contains(name)
    {
        loc.err(
                d,
                format!(
                    "agent \"{name}\" is not declared in agents.json{}; fix the name or remove the script",
                    did_you_mean(name, a.iter().map(String::as_str))
                ),
            );
    }
}
