//! Engine limits and policies. One value is shared (behind an `Arc`) by every actor.

use std::time::Duration;

/// What happens to a pending UI call when the chat's last client disconnects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DisconnectPolicy {
    /// Keep waiting; a resumed client gets the call again (Tessera's default).
    #[default]
    KeepPending,
    /// Fail the call at once with `connection_lost` (the original runtime's behaviour).
    Fail,
}

/// Tunables of the agent turn and the UI round trip.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Agent-tool rounds per turn before the turn fails.
    pub max_tool_steps: u32,
    /// Default time limit of one agent-tool call.
    pub tool_timeout: Duration,
    /// Tool results are cut to this many characters before the model reads them.
    pub tool_result_max_chars: usize,
    /// Correction attempts when structured output fails its schema.
    pub structured_output_corrections: u32,
    /// Correction attempts for an invalid reply in `json` tool-calling mode.
    pub json_mode_corrections: u32,
    /// Turn keys remembered by the `DedupCache` (LRU).
    pub dedup_capacity: usize,
    /// Default wait for a UI tool answer; `None` waits until cancelled.
    pub ui_timeout: Option<Duration>,
    /// See [`DisconnectPolicy`].
    pub disconnect_policy: DisconnectPolicy,
    /// Ask models to stream and publish `chat.text_delta` events.
    pub stream: bool,
    /// Total time one model call may take (all its retries and its whole stream); an agent's
    /// `call_deadline_s` wins. Past it the call is dropped and reported as a timeout.
    pub model_call_deadline: Duration,
    /// `max_tokens` sent with every model call; an agent's `max_tokens` wins.
    pub max_tokens: u32,
    /// Number of arbiters (threads) chats are spread over; 0 means one per core.
    pub arbiters: usize,
    /// Seals the chats' secret vaults at rest; `None` keeps secrets in memory only.
    pub vault_key: Option<std::sync::Arc<crate::secrets::VaultKey>>,
    /// An open chat idle this long with nobody subscribed, no turn running and all its writes
    /// stored leaves memory; it is rebuilt from the store on demand (as after a restart).
    /// `None` keeps open chats in memory (so does running without a store).
    pub idle_evict: Option<Duration>,
    /// Events of a chat kept in memory for resumes once the store holds them; a resume from
    /// further back reads the store. Without a store every event stays in memory.
    pub events_in_memory: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_tool_steps: 5,
            tool_timeout: Duration::from_secs(12),
            tool_result_max_chars: 900,
            structured_output_corrections: 1,
            json_mode_corrections: 1,
            dedup_capacity: 65_536,
            ui_timeout: Some(Duration::from_secs(15 * 60)),
            disconnect_policy: DisconnectPolicy::KeepPending,
            stream: true,
            model_call_deadline: Duration::from_secs(300),
            max_tokens: 4096,
            arbiters: 0,
            vault_key: None,
            idle_evict: None,
            events_in_memory: 32,
        }
    }
}
