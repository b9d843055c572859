//! How often a streamed answer's text goes on: the first piece at once, later ones joined and
//! passed on at most once per interval, and none held longer than the interval. No I/O: the
//! stream loop reads, this decides.
//!
//! WHY: each piece passed on becomes a `chat.text_delta` event (a log record, a frame for every
//! client, a queued store row, a wake-up of each client's socket thread). A model that streams
//! token by token would cost all that once per token; a browser shows no difference between
//! text that arrives every 10 ms and every 30 ms. The first piece is never held, so the time
//! to the first text is what the model gives.
//!
//! WHY held text goes on with a later read, and by a timer only when the stream stalls: a timer
//! that fires is a wake-up of the engine's thread, which costs as much as the event it saves
//! (measured: a window timed from the last delta saved nothing with a model streaming every
//! 20 ms). Timed from when the text was first held, the timer fires only when no read comes
//! within the interval; a steady stream's held text goes on with its next read.

use tokio::time::{Duration, Instant};

/// The text of one streamed answer not yet passed on, and when text last was.
pub(super) struct DeltaWindow {
    interval: Duration,
    held: String,
    /// When the held text's first piece came (meaningless while nothing is held).
    held_since: Instant,
    /// When text was last passed on; `None` before the first piece.
    last_sent: Option<Instant>,
}

impl DeltaWindow {
    /// A window of `interval`; zero passes every piece on at once.
    pub(super) fn new(interval: Duration) -> Self {
        Self {
            interval,
            held: String::new(),
            held_since: Instant::now(),
            last_sent: None,
        }
    }

    /// Takes `text` read at `now`: passes it on (with what is held before it) when it is the
    /// answer's first text or the interval since the last has passed; holds it otherwise.
    pub(super) fn push(&mut self, text: &str, now: Instant, sink: &mut (dyn FnMut(&str) + Send)) {
        if text.is_empty() {
            return;
        }
        if self.last_sent.is_some_and(|at| now < at + self.interval) {
            if self.held.is_empty() {
                self.held_since = now;
            }
            self.held.push_str(text);
            return;
        }
        if self.held.is_empty() {
            sink(text);
            self.last_sent = Some(now);
        } else {
            self.held.push_str(text);
            self.flush(now, sink);
        }
    }

    /// When the held text must go on even if nothing more is read: an interval after its first
    /// piece came. `None` when nothing is held.
    pub(super) fn due(&self) -> Option<Instant> {
        (!self.held.is_empty()).then(|| self.held_since + self.interval)
    }

    /// Passes on what is held: it is due and nothing more was read, or the stream ended.
    pub(super) fn flush(&mut self, now: Instant, sink: &mut (dyn FnMut(&str) + Send)) {
        if self.held.is_empty() {
            return;
        }
        sink(&self.held);
        self.held.clear();
        self.last_sent = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Feeds `reads` (milliseconds after the start, text) and then flushes at the end; returns
    /// what went on, each with when.
    fn paced(interval_ms: u64, reads: &[(u64, &str)]) -> Vec<(u64, String)> {
        let start = Instant::now();
        let mut window = DeltaWindow::new(ms(interval_ms));
        let mut sent = Vec::new();
        let mut last = 0;
        for &(at, text) in reads {
            // What the stream loop does when the held text comes due before the next read.
            if let Some(due) = window.due()
                && due <= start + ms(at)
            {
                let due_ms = (due - start).as_millis() as u64;
                window.flush(due, &mut |t| sent.push((due_ms, t.to_owned())));
            }
            window.push(text, start + ms(at), &mut |t| sent.push((at, t.to_owned())));
            last = at;
        }
        window.flush(start + ms(last), &mut |t| sent.push((last, t.to_owned())));
        sent
    }

    fn owned(sent: &[(u64, &str)]) -> Vec<(u64, String)> {
        sent.iter().map(|&(at, t)| (at, t.to_owned())).collect()
    }

    #[test]
    fn a_zero_interval_passes_every_piece_on_at_once() {
        let reads = [(0, "a"), (1, "b"), (1, "c"), (5, "d")];
        assert_eq!(paced(0, &reads), owned(&reads));
    }

    #[test]
    fn the_first_piece_goes_on_at_once_and_later_ones_at_most_once_per_interval() {
        let reads = [
            (0, "He"),
            (10, "ll"),
            (20, "o"),
            (30, ","),
            (40, " wo"),
            (50, "rld"),
        ];
        assert_eq!(
            paced(30, &reads),
            owned(&[(0, "He"), (30, "llo,"), (50, " world")]),
            "held text goes on, joined, with the first read an interval after the last; the rest at the end"
        );
    }

    #[test]
    fn a_steady_stream_s_held_text_goes_on_with_its_reads_and_never_by_the_timer() {
        // A token every 20 ms with a 30 ms window: every second read passes two tokens on.
        let reads: Vec<(u64, &str)> = (0..10).map(|i| (i * 20, "t")).collect();
        let sent = paced(30, &reads);
        let times: Vec<u64> = sent.iter().map(|&(at, _)| at).collect();
        assert_eq!(times, [0, 40, 80, 120, 160, 180], "180: the end");
        let texts: Vec<&str> = sent.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(texts, ["t", "tt", "tt", "tt", "tt", "t"]);
    }

    #[test]
    fn text_held_when_the_stream_stalls_goes_on_when_it_is_due() {
        // "b" comes 5 ms after "a" and is held; nothing more comes until 100 ms, so "b" goes
        // on at 35 ms (the stream loop's timer: an interval after it came), not with "c".
        let sent = paced(30, &[(0, "a"), (5, "b"), (100, "c")]);
        assert_eq!(sent, owned(&[(0, "a"), (35, "b"), (100, "c")]));
    }

    #[test]
    fn nothing_is_due_when_nothing_is_held() {
        let start = Instant::now();
        let mut window = DeltaWindow::new(ms(30));
        assert_eq!(window.due(), None);
        window.push("a", start, &mut |_| {});
        assert_eq!(window.due(), None, "the first piece went on");
        window.push("", start + ms(1), &mut |_| {
            panic!("empty text is not passed on")
        });
        assert_eq!(window.due(), None);
        window.push("b", start + ms(1), &mut |_| panic!("held"));
        assert_eq!(
            window.due(),
            Some(start + ms(31)),
            "an interval after it came"
        );
        window.push("c", start + ms(20), &mut |_| panic!("held"));
        assert_eq!(window.due(), Some(start + ms(31)), "still timed from \"b\"");
        let mut flushed = String::new();
        window.flush(start + ms(31), &mut |t| flushed.push_str(t));
        assert_eq!(flushed, "bc");
        assert_eq!(window.due(), None);
        window.flush(start + ms(32), &mut |_| panic!("nothing left"));
    }
}
