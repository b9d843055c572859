//! Comparing expectations with what happened, and printing the differences the way a
//! snapshot tool does: the JSON path, the expected value and the actual one.

use std::fmt;

use serde_json::Value;

use crate::format::ExpectedEvent;

/// One difference between an expectation and the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Where, e.g. `events[3].data.payload.status` or `context.api_key_status`.
    pub path: String,
    /// What the test file says (`None`: nothing expected there).
    pub expected: Option<Value>,
    /// What the run produced (`None`: nothing there).
    pub actual: Option<Value>,
    /// Extra context (e.g. the whole expected and actual event).
    pub note: Option<String>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<Value>| v.as_ref().map_or("(nothing)".to_owned(), compact);
        writeln!(f, "  at {}:", self.path)?;
        writeln!(f, "    - expected: {}", show(&self.expected))?;
        write!(f, "    + actual:   {}", show(&self.actual))?;
        if let Some(note) = &self.note {
            for line in note.lines() {
                write!(f, "\n    {line}")?;
            }
        }
        Ok(())
    }
}

/// A value on one line, long strings and arrays kept whole (the reader needs them).
fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| v.to_string())
}

/// A JSON path segment for an object key: `.key`, or `["odd key"]` when it is not a plain
/// identifier.
fn key_segment(key: &str) -> String {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        format!(".{key}")
    } else {
        format!("[{}]", Value::from(key))
    }
}

/// Records where `actual` does not contain `expected`: objects must have every expected key
/// (extra keys are fine), arrays must have the same length and match entry by entry, other
/// values must be equal.
pub fn subset(expected: &Value, actual: &Value, path: &str, out: &mut Vec<Mismatch>) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (key, ev) in e {
                let at = format!("{path}{}", key_segment(key));
                match a.get(key) {
                    Some(av) => subset(ev, av, &at, out),
                    None => out.push(Mismatch {
                        path: at,
                        expected: Some(ev.clone()),
                        actual: None,
                        note: None,
                    }),
                }
            }
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                subset(ev, av, &format!("{path}[{i}]"), out);
            }
        }
        _ if expected == actual => {}
        _ => out.push(Mismatch {
            path: path.to_owned(),
            expected: Some(expected.clone()),
            actual: Some(actual.clone()),
            note: None,
        }),
    }
}

/// Compares the expected event list with the actual one. Stops at the first event that
/// differs (later ones usually differ because of it) and says which events follow on each side.
pub fn events(expected: &[ExpectedEvent], actual: &[ExpectedEvent], out: &mut Vec<Mismatch>) {
    let to_value = |e: &ExpectedEvent| serde_json::to_value(e).unwrap_or(Value::Null);
    for (i, (e, a)) in expected.iter().zip(actual).enumerate() {
        let before = out.len();
        let path = format!("events[{i}]");
        let mut field = |name: &str, ev: Option<Value>, av: Option<Value>| {
            if ev.is_some() && ev != av {
                out.push(Mismatch {
                    path: format!("{path}.{name}"),
                    expected: ev,
                    actual: av,
                    note: None,
                });
            }
        };
        field(
            "type",
            Some(e.kind.clone().into()),
            Some(a.kind.clone().into()),
        );
        field(
            "agent",
            e.agent.clone().map(Value::from),
            a.agent.clone().map(Value::from),
        );
        field(
            "tool",
            e.tool.clone().map(Value::from),
            a.tool.clone().map(Value::from),
        );
        if let Some(ed) = &e.data {
            subset(
                ed,
                a.data.as_ref().unwrap_or(&Value::Null),
                &format!("{path}.data"),
                out,
            );
        }
        if out.len() > before {
            let note = format!(
                "expected event: {}\nactual event:   {}{}",
                compact(&to_value(e)),
                compact(&to_value(a)),
                following(&expected[i + 1..], &actual[i + 1..])
            );
            if let Some(last) = out.last_mut() {
                last.note = Some(note);
            }
            return;
        }
    }
    if expected.len() != actual.len() {
        let n = expected.len().min(actual.len());
        out.push(Mismatch {
            path: format!("events[{n}]"),
            expected: expected.get(n).map(to_value),
            actual: actual.get(n).map(to_value),
            note: Some(format!(
                "expected {} events, got {}{}",
                expected.len(),
                actual.len(),
                following(&expected[n..], &actual[n..])
            )),
        });
    }
}

/// "then expected: a, b / then actual: c" for the events after a difference.
fn following(expected: &[ExpectedEvent], actual: &[ExpectedEvent]) -> String {
    let names = |events: &[ExpectedEvent]| {
        if events.is_empty() {
            return "(none)".to_owned();
        }
        let shown: Vec<String> = events
            .iter()
            .take(8)
            .map(|e| match (&e.agent, &e.tool) {
                (_, Some(tool)) => format!("{} {tool}", e.kind),
                (Some(agent), None) => format!("{} {agent}", e.kind),
                (None, None) => e.kind.clone(),
            })
            .collect();
        let more = events.len().saturating_sub(8);
        if more > 0 {
            format!("{}, … {more} more", shown.join(", "))
        } else {
            shown.join(", ")
        }
    };
    format!(
        "\nthen expected: {}\nthen actual:   {}",
        names(expected),
        names(actual)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subset_reports_the_json_path_of_each_difference() {
        let mut out = Vec::new();
        subset(
            &json!({"payload": {"status": "success", "items": [1, 2]}, "gone": true}),
            &json!({"payload": {"status": "error", "items": [1, 3], "extra": 0}}),
            "events[2].data",
            &mut out,
        );
        let paths: Vec<&str> = out.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "events[2].data.gone",
                "events[2].data.payload.items[1]",
                "events[2].data.payload.status"
            ]
        );
        assert_eq!(out[2].expected, Some(json!("success")));
        assert_eq!(out[2].actual, Some(json!("error")));
    }

    #[test]
    fn event_lists_stop_at_the_first_difference_and_count_the_rest() {
        let ev = |kind: &str, agent: &str| ExpectedEvent {
            kind: kind.into(),
            agent: Some(agent.into()),
            tool: None,
            data: None,
        };
        let mut out = Vec::new();
        events(
            &[ev("chat.run_start", "A"), ev("chat.text", "A")],
            &[
                ev("chat.run_start", "A"),
                ev("chat.text", "B"),
                ev("chat.x", "B"),
            ],
            &mut out,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].path, "events[1].agent");
        let shown = out[0].to_string();
        assert!(shown.contains("then actual:   chat.x B"), "{shown}");

        let mut out = Vec::new();
        events(&[ev("chat.run_start", "A")], &[], &mut out);
        assert_eq!(out[0].path, "events[0]");
        assert_eq!(out[0].actual, None);
    }
}
