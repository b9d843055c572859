//! The Tessera chat wire protocol, with no I/O: what a client may send ([`ClientMessage`],
//! parsed by [`parse_client_frame`]) and what the server sends ([`ServerEvent`] inside an
//! [`Envelope`]). Keeping frames apart from the engine lets the parser be fuzzed alone and the
//! transport be swapped without touching chat logic.

mod client;
mod error;
mod server;
mod time;
mod tool_events;

pub use client::{ClientMessage, MAX_CONTENT_CHARS, ToolResponseFrame, parse_client_frame};
pub use error::{ErrorCode, FrameError};
pub use server::{Envelope, PendingUiCall, ServerEvent, json_string};
pub use time::{format_unix_millis, rfc3339_now, write_unix_millis};
pub use tool_events::{InteractionType, ToolAnnouncement, ToolCallEvent, ToolResponseEvent};
