//! Shared test helpers.
#![allow(dead_code)]

use std::sync::Arc;

use tessera_tools::ToolContext;

pub fn ctx(tenant: &str, user: &str, chat: &str) -> ToolContext {
    ToolContext {
        chat_id: Arc::from(chat),
        app_id: Arc::from(tenant),
        user_id: Arc::from(user),
        workflow_name: Arc::from("Generator"),
        turn_idempotency_key: Arc::from(format!("{chat}:turn-1").as_str()),
        agent_name: Arc::from("TestAgent"),
        secrets: None,
    }
}
