//! When a chat's events become visible. On a single node an event goes to subscribers as soon
//! as it is logged (the store catches up behind it, and a restart reads the same store). In a
//! cluster the next owner of a chat continues from the store alone, so an event a client saw
//! but the store never got would have its seq reused by different content: there an event is
//! held here until the flush that carries it is durable (a streamed delta, never stored, until
//! the store's mark of seqs taken covers it), and only then fanned out. For the
//! same reason a client's input and UI answers are acknowledged only once the events they
//! caused are durable (an acknowledged answer the next owner never saw would be lost).

use std::collections::VecDeque;
use std::sync::Arc;

use tessera_protocol::ServerEvent;
use tokio::sync::oneshot;

/// A logged event not yet durable.
pub(super) struct HeldEvent {
    pub(super) seq: u64,
    pub(super) text: Arc<str>,
    /// The typed event, kept only when in-process watchers were attached at publish time.
    pub(super) typed: Option<ServerEvent>,
    /// The corr of the UI call this event announces (`chat.tool_call` awaiting a response):
    /// the call is not listed as pending to clients before its announcement is visible.
    pub(super) ui_call: Option<Box<str>>,
}

/// How many recently ended UI calls are remembered for an acknowledgement asked for after
/// the call's `chat.tool_response` was logged (the answer's reply and the auto tool's event
/// reach the session in either order).
const ENDED_UI_CALLS_KEPT: usize = 16;

/// The events of a fenced chat waiting for the store, in seq order, and the acknowledgements
/// waiting for them.
#[derive(Default)]
pub(super) struct HeldEvents {
    events: VecDeque<HeldEvent>,
    /// Fired once the event with this seq is durable.
    seq_waiters: Vec<(u64, oneshot::Sender<()>)>,
    /// Fired once the event ending this UI call (its `chat.tool_response`) is durable.
    ui_answer_waiters: Vec<(Box<str>, oneshot::Sender<()>)>,
    /// Recently ended UI calls and the seq of the event that ended each.
    ended_ui_calls: VecDeque<(Box<str>, u64)>,
    /// The last seq known durable.
    durable_seq: u64,
}

impl HeldEvents {
    /// Nothing held; the store holds the log up to `durable_seq` (a restored chat's).
    pub(super) fn after(durable_seq: u64) -> Self {
        Self {
            durable_seq,
            ..Self::default()
        }
    }

    /// Holds `event`; `ends_ui_call` is the corr of the UI call it ends, if any.
    pub(super) fn hold(&mut self, event: HeldEvent, ends_ui_call: Option<&str>) {
        if let Some(corr) = ends_ui_call {
            let seq = event.seq;
            let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ui_answer_waiters)
                .into_iter()
                .partition(|(c, _)| &**c == corr);
            self.ui_answer_waiters = later;
            self.seq_waiters
                .extend(now.into_iter().map(|(_, tx)| (seq, tx)));
            if self.ended_ui_calls.len() == ENDED_UI_CALLS_KEPT {
                self.ended_ui_calls.pop_front();
            }
            self.ended_ui_calls.push_back((corr.into(), seq));
        }
        self.events.push_back(event);
    }

    /// The seq of the last event clients may see, given the log's last seq.
    pub(super) fn visible_seq(&self, last_seq: u64) -> u64 {
        self.events
            .front()
            .map_or(last_seq, |first| first.seq.saturating_sub(1))
    }

    /// True while the announcement of UI call `corr` is held.
    pub(super) fn hides_ui_call(&self, corr: &str) -> bool {
        self.events
            .iter()
            .any(|e| e.ui_call.as_deref() == Some(corr))
    }

    /// Resolves once the event with seq `seq` is durable (dropped if the chat stops first).
    pub(super) fn when_durable(&mut self, seq: u64) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        if seq <= self.durable_seq {
            let _ = tx.send(());
        } else {
            self.seq_waiters.push((seq, tx));
        }
        rx
    }

    /// Resolves once the `chat.tool_response` that ends UI call `corr` is durable, whether it
    /// was logged already or is yet to come.
    pub(super) fn when_ui_answer_durable(&mut self, corr: &str) -> oneshot::Receiver<()> {
        match self.ended_ui_calls.iter().find(|(c, _)| &**c == corr) {
            Some(&(_, seq)) => self.when_durable(seq),
            None => {
                // Waiters whose answer was refused (an unknown or ended corr) gave up.
                self.ui_answer_waiters.retain(|(_, tx)| !tx.is_closed());
                let (tx, rx) = oneshot::channel();
                self.ui_answer_waiters.push((corr.into(), tx));
                rx
            }
        }
    }

    /// Takes the held events the store now settles (seq up to `settled_seq`: stored, or a
    /// delta whose seq the store marks taken), in order, and fires the acknowledgements
    /// waiting for them.
    pub(super) fn take_durable(&mut self, settled_seq: u64) -> Vec<HeldEvent> {
        self.durable_seq = self.durable_seq.max(settled_seq);
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.seq_waiters)
            .into_iter()
            .partition(|(seq, _)| *seq <= settled_seq);
        self.seq_waiters = later;
        for (_, tx) in due {
            let _ = tx.send(());
        }
        let durable = self
            .events
            .iter()
            .take_while(|e| e.seq <= settled_seq)
            .count();
        self.events.drain(..durable).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(seq: u64) -> HeldEvent {
        HeldEvent {
            seq,
            text: Arc::from(format!("{seq}")),
            typed: None,
            ui_call: (seq == 6).then(|| Box::from("ui_6")),
        }
    }

    #[test]
    fn events_leave_in_order_once_the_store_holds_them() {
        let mut events = HeldEvents::default();
        assert_eq!(events.visible_seq(4), 4, "nothing held: all is visible");
        for seq in 5..=8 {
            events.hold(held(seq), None);
        }
        assert_eq!(events.visible_seq(8), 4);
        assert!(events.take_durable(4).is_empty());
        assert!(events.hides_ui_call("ui_6"));
        let seqs: Vec<u64> = events.take_durable(6).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [5, 6]);
        assert_eq!(events.visible_seq(8), 6);
        assert!(
            !events.hides_ui_call("ui_6"),
            "its announcement is visible now"
        );
        let seqs: Vec<u64> = events.take_durable(100).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [7, 8]);
        assert_eq!(events.visible_seq(8), 8);
    }

    #[test]
    fn acknowledgements_wait_for_the_events_they_caused() {
        let mut events = HeldEvents::default();
        events.hold(held(1), None);
        let mut input = events.when_durable(1);
        // Asked before the answer's event is logged, and after.
        let mut early = events.when_ui_answer_durable("ui_a");
        events.hold(held(2), Some("ui_a"));
        let mut late = events.when_ui_answer_durable("ui_a");
        assert!(input.try_recv().is_err(), "not durable yet");
        let _ = events.take_durable(1);
        assert!(input.try_recv().is_ok());
        assert!(early.try_recv().is_err() && late.try_recv().is_err());
        let _ = events.take_durable(2);
        assert!(early.try_recv().is_ok() && late.try_recv().is_ok());
        assert!(events.when_durable(2).try_recv().is_ok(), "already durable");
        let mut other = events.when_ui_answer_durable("ui_b");
        assert!(other.try_recv().is_err(), "its answer is yet to come");
    }
}
