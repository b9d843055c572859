//! A chat's context variables, with a count of their changes.

use serde_json::{Map, Value};

/// The context variables of a chat. Every mutable borrow counts as a change, so that the
/// write-behind can tell whether the variables differ from the copy it last sent to the store
/// by comparing two numbers.
///
/// WHY: comparing the maps read both, the live one and the sent copy, at every flush (a few
/// per turn), and neither is in the caches once the chats outgrow them (~8 of a turn's
/// last-level read misses at 1,500 chats; README, tenth session).
#[derive(Debug, Default)]
pub(crate) struct ContextVars {
    map: Map<String, Value>,
    changes: u64,
}

impl ContextVars {
    pub(crate) fn new(map: Map<String, Value>) -> Self {
        Self { map, changes: 0 }
    }

    /// The variables, to read.
    pub(crate) fn get(&self) -> &Map<String, Value> {
        &self.map
    }

    /// The variables, to change: counted as a change whether or not the caller changes them.
    pub(crate) fn edit(&mut self) -> &mut Map<String, Value> {
        self.changes += 1;
        &mut self.map
    }

    /// How many times the variables were borrowed to change: equal counts, equal variables.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_edit_counts_as_a_change_and_reading_does_not() {
        let mut vars = ContextVars::new(Map::new());
        assert_eq!(vars.changes(), 0);
        assert!(vars.get().is_empty());
        assert_eq!(vars.changes(), 0);
        vars.edit().insert("k".to_owned(), Value::Bool(true));
        assert_eq!(vars.changes(), 1);
        assert_eq!(vars.get().get("k"), Some(&Value::Bool(true)));
        let _ = vars.edit();
        assert_eq!(
            vars.changes(),
            2,
            "a borrow to change counts even if nothing changed"
        );
    }
}
