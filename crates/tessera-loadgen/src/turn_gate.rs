//! `engine-bench --active N`: at most N turns in flight per engine thread.
//!
//! WHY: with every chat's turn in flight at once, each step of a turn (the session, the runner,
//! the tool, the events) waits behind the same step of every other chat on its thread, so a
//! chat's state has gone cold between two steps of one turn. Bounding the turns in flight keeps
//! the steps of one turn close together; the difference between the two runs tells how much of
//! the cost per turn at many chats is that interleaving, and how much is a chat's state being
//! cold when its turn starts (docs/performance-log.md, "Twenty-fourth session").
//!
//! One gate per engine thread, started on that thread by its first driver: a permit is a
//! same-thread message, so the gate adds no cross-thread wake-up of its own.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix::prelude::*;

/// Hands out at most `limit` turn permits; drivers that ask for one beyond it wait in order.
pub struct TurnGate {
    limit: usize,
    in_flight: usize,
    waiting: VecDeque<Recipient<Permit>>,
    /// The most turns ever in flight at once on one gate, over every gate of the run (shared
    /// with the report).
    peak: Arc<AtomicU64>,
}

impl Actor for TurnGate {
    type Context = Context<Self>;
}

/// A driver asks to start a turn; `Permit` comes when it may.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Acquire(pub Recipient<Permit>);

/// A driver's turn ended: its permit goes to the next one waiting.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Release;

/// The driver may start its turn.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Permit;

impl TurnGate {
    /// This thread's gate, started on first use with `limit` (which holds for the thread's
    /// life: one benchmark per engine); `peak` is shared by every thread's gate.
    pub fn of_this_thread(limit: usize, peak: &Arc<AtomicU64>) -> Addr<TurnGate> {
        thread_local! {
            static GATE: RefCell<Option<Addr<TurnGate>>> = const { RefCell::new(None) };
        }
        GATE.with(|gate| {
            gate.borrow_mut()
                .get_or_insert_with(|| {
                    TurnGate {
                        limit: limit.max(1),
                        in_flight: 0,
                        waiting: VecDeque::new(),
                        peak: Arc::clone(peak),
                    }
                    .start()
                })
                .clone()
        })
    }

    fn admit(&mut self, driver: &Recipient<Permit>) {
        self.in_flight += 1;
        self.peak
            .fetch_max(self.in_flight as u64, Ordering::Relaxed);
        driver.do_send(Permit);
    }
}

impl Handler<Acquire> for TurnGate {
    type Result = ();

    fn handle(&mut self, Acquire(driver): Acquire, _: &mut Self::Context) {
        if self.in_flight < self.limit {
            self.admit(&driver);
        } else {
            self.waiting.push_back(driver);
        }
    }
}

impl Handler<Release> for TurnGate {
    type Result = ();

    fn handle(&mut self, _: Release, _: &mut Self::Context) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(next) = self.waiting.pop_front() {
            self.admit(&next);
        }
    }
}
