//! NATS subject names. Every name starts with a prefix, so deployments (and parallel tests)
//! sharing one NATS server never see each other's traffic.

/// Builds the subjects of one deployment.
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// Subjects under `prefix` (one NATS token: letters, digits, `-` and `_`; anything else is
    /// replaced by `_`).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: token(prefix),
        }
    }

    /// The prefix, also used to name the key-value buckets.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Where the owner publishes the chat's live events.
    pub fn events(&self, chat_id: &str) -> String {
        format!("{}.chat.{}.events", self.prefix, token(chat_id))
    }

    /// Where the owner answers commands for the chat.
    pub fn commands(&self, chat_id: &str) -> String {
        format!("{}.chat.{}.cmd", self.prefix, token(chat_id))
    }
}

/// `raw` as one subject token. Chat ids are UUIDs, which pass through unchanged; any other
/// character (a `.`, `*`, `>` or space would change the subject's meaning) becomes its hex
/// code, so distinct ids stay distinct.
pub(crate) fn token(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            out.push(c);
        } else {
            for b in c.to_string().bytes() {
                out.push_str(&format!("={b:02x}"));
            }
        }
    }
    if out.is_empty() {
        out.push_str("=empty");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_ids_cannot_escape_their_subject() {
        let s = Subjects::new("t1");
        assert_eq!(s.events("abc-1"), "t1.chat.abc-1.events");
        assert_eq!(s.commands("a.b"), "t1.chat.a=2eb.cmd");
        assert_ne!(s.events("a*"), s.events("a>"));
        assert!(!s.events("x > y").contains(' '));
    }
}
