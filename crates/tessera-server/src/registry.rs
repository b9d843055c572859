//! `ChatRegistry`: the server actor that routes a chat id to its `ChatSession`, and says who
//! owns it. Every lookup names the caller's tenant and user, and a chat of anyone else reads
//! exactly like a chat that does not exist.
//!
//! Completed chats leave memory on their own (see the engine's `Retire`); their handles here
//! then point at a stopped actor and are dropped on the next lookup or sweep, so the map holds
//! only running chats. A lookup that misses rebuilds a completed chat from the store.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use tessera_engine::ChatHandle;

/// Add a started chat.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RegisterChat(pub ChatHandle);

/// Find chat `chat_id` if `tenant`/`user` own it.
#[derive(Message)]
#[rtype(result = "Option<ChatHandle>")]
pub struct FindChat {
    pub chat_id: String,
    pub tenant: Arc<str>,
    pub user: Arc<str>,
}

/// Every chat of one tenant (for the open-chat quota).
#[derive(Message)]
#[rtype(result = "Vec<ChatHandle>")]
pub struct TenantChats(pub Arc<str>);

/// chat id → handle.
#[derive(Default)]
pub struct ChatRegistry {
    chats: HashMap<Arc<str>, ChatHandle>,
}

/// How often handles of chats that left memory are swept out.
const SWEEP: std::time::Duration = std::time::Duration::from_secs(30);

impl Actor for ChatRegistry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(SWEEP, |act, _| act.sweep());
    }
}

impl ChatRegistry {
    /// Drops the handles of chats whose session has stopped.
    fn sweep(&mut self) {
        self.chats.retain(|_, h| h.addr.connected());
    }
}

impl Handler<RegisterChat> for ChatRegistry {
    type Result = ();
    fn handle(&mut self, RegisterChat(handle): RegisterChat, _: &mut Self::Context) {
        self.chats.insert(handle.identity.chat_id.clone(), handle);
    }
}

impl Handler<FindChat> for ChatRegistry {
    type Result = Option<ChatHandle>;
    fn handle(&mut self, msg: FindChat, _: &mut Self::Context) -> Self::Result {
        let handle = self.chats.get(msg.chat_id.as_str())?;
        if !handle.addr.connected() {
            // The chat left memory: the caller rebuilds it from the store.
            self.chats.remove(msg.chat_id.as_str());
            return None;
        }
        (handle.identity.tenant == msg.tenant && handle.identity.user == msg.user)
            .then(|| handle.clone())
    }
}

impl Handler<TenantChats> for ChatRegistry {
    type Result = MessageResult<TenantChats>;
    fn handle(&mut self, TenantChats(tenant): TenantChats, _: &mut Self::Context) -> Self::Result {
        self.sweep();
        MessageResult(
            self.chats
                .values()
                .filter(|h| h.identity.tenant == tenant)
                .cloned()
                .collect(),
        )
    }
}
