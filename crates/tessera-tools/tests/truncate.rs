//! summarize_for_model: bounded, char-safe, marked truncation.

use serde_json::{Value, json};
use tessera_tools::summarize_for_model;

/// Split "prefix…[truncated N chars]" into (prefix, N, lower_bound).
fn split_marker(s: &str) -> Option<(&str, usize, bool)> {
    let at = s.rfind("…[truncated ")?;
    let rest = s[at..]
        .strip_prefix("…[truncated ")?
        .strip_suffix(" chars]")?;
    let (n, plus) = match rest.strip_suffix('+') {
        Some(n) => (n, true),
        None => (rest, false),
    };
    Some((&s[..at], n.parse().ok()?, plus))
}

#[test]
fn short_results_are_compact_json_unchanged() {
    let v = json!({"status": "success", "items": [1, 2, 3], "name": "x"});
    let full = serde_json::to_string(&v).expect("serializes");
    assert_eq!(summarize_for_model(&v, 900), full);
    // Exactly at the limit: no marker.
    assert_eq!(summarize_for_model(&v, full.chars().count()), full);
}

#[test]
fn cut_at_limit_with_exact_marker() {
    let v = json!({"text": "abcdefghij".repeat(20)});
    let full = serde_json::to_string(&v).expect("serializes");
    let total = full.chars().count();
    for max in [40, 100, total - 1] {
        let out = summarize_for_model(&v, max);
        assert!(
            out.chars().count() <= max,
            "max {max}: {} chars",
            out.chars().count()
        );
        let (prefix, n, plus) = split_marker(&out).expect("has marker");
        assert!(!plus);
        assert!(full.starts_with(prefix));
        assert_eq!(
            prefix.chars().count() + n,
            total,
            "N counts the removed chars"
        );
        // As much as fits is kept.
        assert!(
            out.chars().count() >= max - 1,
            "max {max}: only {}",
            out.chars().count()
        );
    }
}

#[test]
fn multibyte_chars_are_never_split() {
    let v = json!({"s": "é🦀日本語".repeat(200)});
    let full = serde_json::to_string(&v).expect("serializes");
    for max in 25..60 {
        let out = summarize_for_model(&v, max);
        assert!(out.chars().count() <= max);
        let (prefix, n, _) = split_marker(&out).expect("has marker");
        assert!(
            full.starts_with(prefix),
            "prefix must be a char-boundary prefix"
        );
        assert_eq!(prefix.chars().count() + n, full.chars().count());
    }
}

#[test]
fn tiny_limits_return_just_the_marker() {
    let v = json!({"a": "b".repeat(100)});
    let out = summarize_for_model(&v, 0);
    let (prefix, n, _) = split_marker(&out).expect("marker");
    assert_eq!(prefix, "");
    assert_eq!(n, serde_json::to_string(&v).expect("ser").chars().count());
}

#[test]
fn huge_results_stop_early() {
    // ~20 MB of JSON; the summary stops counting after 1 MiB past the cut.
    let big: Vec<Value> = (0..200_000)
        .map(
            |i| json!({"id": i, "text": "lorem ipsum dolor sit amet, consectetur adipiscing elit"}),
        )
        .collect();
    let v = Value::Array(big);
    let start = std::time::Instant::now();
    let out = summarize_for_model(&v, 900);
    assert!(out.chars().count() <= 900);
    let (_, n, plus) = split_marker(&out).expect("marker");
    assert!(plus, "count is a lower bound: {out}");
    assert!(n >= 1 << 20);
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn strings_and_scalars() {
    assert_eq!(summarize_for_model(&json!("hi"), 900), "\"hi\"");
    assert_eq!(summarize_for_model(&json!(42), 900), "42");
    assert_eq!(summarize_for_model(&Value::Null, 900), "null");
}
