//! Who a chat belongs to and where it stands: plain values shared by the session, the
//! persistence boundary and the server.

use std::sync::Arc;

/// Identity of a chat: who owns it.
#[derive(Debug, Clone)]
pub struct ChatIdentity {
    pub chat_id: Arc<str>,
    pub tenant: Arc<str>,
    pub user: Arc<str>,
}

/// Where a chat stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatStatus {
    /// Waiting for the user to type.
    AwaitingUser,
    /// An agent turn is running.
    Running,
    /// A UI tool is waiting for the browser.
    AwaitingTool,
    /// The run ended; the reason is kept.
    Completed(String),
}

impl ChatStatus {
    /// The status as clients see it (and the store keeps it).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::AwaitingUser => "awaiting_user",
            Self::Running => "running",
            Self::AwaitingTool => "awaiting_tool",
            Self::Completed(_) => "completed",
        }
    }
}
