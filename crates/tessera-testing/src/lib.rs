//! tessera-testing: workflow tests without a live model.
//!
//! A workflow ships test files in `workflows/<Name>/tests/*.json` ([`format::TestFile`]): the
//! user's steps (messages, UI answers, timeouts, cancels), the model's replies in the
//! `demo.json` format, and expectations (events in order, final context, handoffs, tool calls,
//! status). [`runner`] runs each through the real engine in process with a virtual clock;
//! [`diff`] prints what differs with its JSON path; [`record`] turns a stored chat into a test
//! file. `tessera test` and `tessera record` are thin wrappers around this crate.

#![warn(missing_docs)]

pub mod diff;
pub mod format;
pub mod record;
pub mod runner;

pub use format::TestFile;
pub use runner::{CaseOutcome, CaseReport, run_dir, run_file};
