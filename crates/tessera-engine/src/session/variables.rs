//! A chat's context variables, with a count of their changes.

use std::sync::Arc;

use serde_json::{Map, Value};

/// The context variables of a chat. Every mutable borrow counts as a change, so that the
/// write-behind can tell whether the variables differ from the copy it last sent to the store
/// by comparing two numbers.
///
/// WHY: comparing the maps read both, the live one and the sent copy, at every flush (a few
/// per turn), and neither is in the caches once the chats outgrow them (~8 of a turn's
/// last-level read misses at 1,500 chats; README, tenth session).
///
/// The map is shared with the state rows written to the store ([`ContextVars::shared`]) and
/// copied only when changed while a row still holds it: the state is written after every
/// turn, and copying every variable into it was an allocation per key and value each time
/// (docs/performance-log.md, twenty-second session). So a caller borrows to change only what it
/// changes.
#[derive(Debug, Default)]
pub(crate) struct ContextVars {
    map: Arc<Map<String, Value>>,
    changes: u64,
}

impl ContextVars {
    pub(crate) fn new(map: Arc<Map<String, Value>>) -> Self {
        Self { map, changes: 0 }
    }

    /// The variables, shared (for a state row).
    pub(crate) fn shared(&self) -> &Arc<Map<String, Value>> {
        &self.map
    }

    /// The variables, to read.
    pub(crate) fn get(&self) -> &Map<String, Value> {
        &self.map
    }

    /// The variables, to change: counted as a change whether or not the caller changes them.
    pub(crate) fn edit(&mut self) -> &mut Map<String, Value> {
        self.changes += 1;
        Arc::make_mut(&mut self.map)
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
        let mut vars = ContextVars::new(Arc::default());
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

    #[test]
    fn a_shared_copy_keeps_its_values_when_the_variables_change_later() {
        let start = Map::from_iter([("k".to_owned(), Value::from(1))]);
        let mut vars = ContextVars::new(Arc::new(start));
        let row = Arc::clone(vars.shared());
        assert!(Arc::ptr_eq(&row, vars.shared()), "shared, not copied");
        vars.edit().insert("k".to_owned(), Value::from(2));
        assert_eq!(
            row.get("k"),
            Some(&Value::from(1)),
            "the row keeps its values"
        );
        assert_eq!(vars.get().get("k"), Some(&Value::from(2)));
        let after = Arc::clone(vars.shared());
        vars.edit().insert("n".to_owned(), Value::from(3));
        assert_eq!(
            after.len(),
            1,
            "a copy again while a later row holds the map"
        );
    }
}
