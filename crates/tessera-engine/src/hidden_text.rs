//! Holds back streamed text that could still turn out to be a hidden coordination token.
//!
//! WHY: a `ui_hidden` derived variable hides an agent message whose whole (trimmed) text equals
//! its trigger (e.g. `NEXT`). Whether a message is hidden is known only once it is complete,
//! but its tokens stream as `chat.text_delta` before that. So deltas are held while the text
//! so far could still become an exact trigger match, and released (all at once) the moment it
//! cannot. A message that does match is never streamed; its `chat.text` says it is hidden.

use std::sync::Arc;

/// Decides, delta by delta, what of one model reply may be streamed.
#[derive(Debug)]
pub struct HiddenTextFilter {
    /// The agent's hidden triggers (empty: everything streams as it comes).
    triggers: Arc<[String]>,
    /// Text held back so far.
    held: String,
    /// The reply can no longer match: stream as it comes.
    released: bool,
}

impl HiddenTextFilter {
    /// A filter for one reply of an agent whose hidden triggers are `triggers`.
    pub fn new(triggers: Arc<[String]>) -> Self {
        let released = triggers.is_empty();
        Self {
            triggers,
            held: String::new(),
            released,
        }
    }

    /// The text to stream after `delta` arrived: `None` while it is held back.
    pub fn push(&mut self, delta: &str) -> Option<String> {
        if self.released {
            return Some(delta.to_owned());
        }
        self.held.push_str(delta);
        if self.could_still_match() {
            return None;
        }
        self.released = true;
        Some(std::mem::take(&mut self.held))
    }

    /// Whether some continuation of the held text trims to exactly a trigger.
    fn could_still_match(&self) -> bool {
        let text = self.held.trim_start();
        self.triggers.iter().any(|trigger| {
            trigger.starts_with(text)
                || text
                    .strip_prefix(trigger.as_str())
                    .is_some_and(|rest| rest.trim().is_empty())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(triggers: &[&str], deltas: &[&str]) -> String {
        let triggers: Arc<[String]> = triggers.iter().map(|t| (*t).to_owned()).collect();
        let mut filter = HiddenTextFilter::new(triggers);
        deltas.iter().filter_map(|d| filter.push(d)).collect()
    }

    #[test]
    fn an_exact_trigger_is_never_streamed_in_any_split() {
        assert_eq!(streamed(&["NEXT"], &["NEXT"]), "");
        assert_eq!(streamed(&["NEXT"], &["N", "E", "X", "T"]), "");
        assert_eq!(streamed(&["NEXT"], &[" \n", "NE", "XT", " ", "\n"]), "");
    }

    #[test]
    fn other_text_streams_whole_once_it_cannot_match() {
        assert_eq!(streamed(&["NEXT"], &["Hello", " world"]), "Hello world");
        assert_eq!(streamed(&["NEXT"], &["NE", "W ideas"]), "NEW ideas");
        assert_eq!(streamed(&["NEXT"], &["NEXT", " step"]), "NEXT step");
        assert_eq!(
            streamed(&[], &["NE", "XT"]),
            "NEXT",
            "no trigger, no holding"
        );
        assert_eq!(streamed(&["NEXT", "DONE"], &["DO", "NE!"]), "DONE!");
    }
}
