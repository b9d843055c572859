//! The Tessera server as a library: [`run`] serves chats (REST, WebSocket, the web client) on
//! a bound listener until a shutdown future resolves; [`validate`] checks workflow folders.
//! The `tessera` binary (`main.rs`) only parses the command line, binds and waits for signals,
//! and tests can start a server in-process the same way.

mod agui;
mod agui_events;
mod auth;
pub mod cluster;
mod cluster_limits;
pub mod config;
mod data_lock;
mod frame_guard;
mod lifecycle;
mod limits;
mod metrics;
mod readiness;
mod registry;
mod reload;
mod rest;
mod serve;
pub mod stores;
pub mod telemetry;
mod usage;
pub mod validate;
mod web_client;
mod ws;

pub use auth::sha256_hex;
pub use config::ServerConfig;
pub use serve::{bind, run};
