//! Ids and keys built from their parts by hand.
//!
//! WHY: `format!` took ~300 to ~1,100 instructions for each of the ids a turn builds (its
//! turn key, message ids, tool invocation keys), about 1% of a turn
//! (docs/performance-log.md, twenty-fifth session).

/// `parts` joined, in a string allocated once at its final size.
pub(crate) fn join(parts: &[&str]) -> String {
    let mut id = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        id.push_str(part);
    }
    id
}

/// A buffer for an integer's decimal digits, for [`join`]:
/// `join(&["msg_", digits().format(n)])`.
pub(crate) fn digits() -> itoa::Buffer {
    itoa::Buffer::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_parts_and_digits_as_format_would() {
        assert_eq!(join(&[]), "");
        assert_eq!(
            join(&["turn_", "c-1", "_", "agent", "_", digits().format(42u32)]),
            format!("turn_{}_{}_{}", "c-1", "agent", 42)
        );
        assert_eq!(join(&["msg_user_", digits().format(0usize)]), "msg_user_0");
        assert_eq!(
            join(&[
                "k",
                ":s",
                digits().format(u32::MAX),
                ":",
                digits().format(7usize)
            ]),
            format!("k:s{}:{}", u32::MAX, 7)
        );
    }
}
