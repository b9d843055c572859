//! The Tessera engine: chat actors exchanging typed messages.
//!
//! - [`ChatSession`](session::ChatSession), one per chat, owns its state and event log.
//! - [`AgentRunner`](runner::AgentRunner) drives one agent turn ([`turn::TurnMachine`], pure).
//! - [`AutoToolHandler`](auto_tool::AutoToolHandler) invokes UI tools for structured output.
//! - [`DedupCache`](dedup::DedupCache) makes every tool run at most once per turn.
//! - [`UiCorrelator`](correlator::UiCorrelator) owns the browser round trips.
//!
//! [`McpHub`](mcp::McpHub), one per node, owns the sessions with MCP servers.
//!
//! [`persist`] is the one boundary between engine values and store rows. Files import each
//! other in one direction: helpers reach a chat only through `Recipient`s of the messages
//! they own ([`events::Publish`], [`runner::TurnFinished`]).
//!
//! State lives in the actor that owns it: no locks around engine state.

pub mod auto_tool;
pub mod catalog;
mod config;
pub mod correlator;
pub mod dedup;
pub mod engine;
mod envelope;
mod error;
pub mod events;
mod hidden_text;
mod ids;
pub mod mcp;
pub mod persist;
pub mod plan;
pub mod runner;
pub mod secrets;
pub mod session;
mod shard;
mod status;
pub mod thread_name;
pub mod transcript;
pub mod turn;

pub use config::{DisconnectPolicy, EngineConfig};
pub use engine::{ChatHandle, Engine, NewChat};
pub use envelope::{ChatIdJson, envelope_seq, envelope_string, resume_boundary_last_seq};
pub use error::EngineError;
pub use shard::{EngineHooks, EventObserver, Shard};
