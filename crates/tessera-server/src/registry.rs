//! `ChatRegistry`: the server actor that routes a chat id to its `ChatSession`, and says who
//! owns it. Every lookup names the caller's tenant and user, and a chat of anyone else reads
//! exactly like a chat that does not exist.
//!
//! It holds only chats in memory. Completed chats leave memory on their own (the engine's
//! `Retire`), and so do open chats left idle (the engine's `IdleCheck`); their handles here
//! then point at a stopped actor and are dropped on the next lookup or sweep. [`OpenChat`]
//! rebuilds a chat that is not in memory from the store, once: concurrent lookups of one chat
//! wait for the same rebuild (this actor owns the in-flight state), so a chat never has two
//! sessions.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use tessera_engine::{ChatHandle, Engine};
use tokio::sync::oneshot;

/// Add a started chat.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RegisterChat(pub ChatHandle);

/// Find chat `chat_id` in memory if `tenant`/`user` own it (no rebuild: for callers that
/// only act on a live session, such as deletion).
#[derive(Message)]
#[rtype(result = "Option<ChatHandle>")]
pub struct FindChat {
    pub chat_id: String,
    pub tenant: Arc<str>,
    pub user: Arc<str>,
}

/// Chat `chat_id` of `tenant`/`user`: the one in memory, else rebuilt from the store (open or
/// completed) and registered. `Ok(None)` when there is no such chat or it is not theirs.
#[derive(Message)]
#[rtype(result = "Result<Option<ChatHandle>, RebuildFailed>")]
pub struct OpenChat {
    pub chat_id: String,
    pub tenant: Arc<str>,
    pub user: Arc<str>,
}

/// A chat could not be rebuilt from the store (the store failed, or the registry stopped).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the chat could not be loaded: {0}")]
pub struct RebuildFailed(pub Arc<str>);

/// Drop a chat (deleted or purged); returns its handle if it was registered.
#[derive(Message)]
#[rtype(result = "Option<ChatHandle>")]
pub struct ForgetChat(pub String);

/// How many chats the registry tracks: handles, and rebuilds in flight (for tests that the
/// maps shrink).
#[derive(Message)]
#[rtype(result = "(usize, usize)")]
pub struct RegistrySize;

type Reply = oneshot::Sender<Result<Option<ChatHandle>, RebuildFailed>>;

/// A lookup waiting for a rebuild.
struct Waiter {
    tenant: Arc<str>,
    user: Arc<str>,
    reply: Reply,
}

/// Resolves, with the number of chats asked, once every chat in memory has stored the writes
/// it had queued (see `tessera_engine::session::WhenStored`): sent on shutdown, before the
/// store is closed.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct StoreQueuedWrites;

/// chat id → handle, and the rebuilds in flight.
pub struct ChatRegistry {
    engine: Engine,
    chats: HashMap<Arc<str>, ChatHandle>,
    /// chat id → the lookups waiting for its rebuild (the first one started it).
    rebuilding: HashMap<Arc<str>, Vec<Waiter>>,
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
    /// A registry that rebuilds chats with `engine`.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            chats: HashMap::new(),
            rebuilding: HashMap::new(),
        }
    }

    /// Drops the handles of chats whose session has stopped.
    fn sweep(&mut self) {
        self.chats.retain(|_, h| h.addr.connected());
    }

    /// The live handle of `chat_id`, if any (a stopped one is dropped).
    fn live(&mut self, chat_id: &str) -> Option<&ChatHandle> {
        if self.chats.get(chat_id).is_some_and(|h| !h.addr.connected()) {
            self.chats.remove(chat_id);
        }
        self.chats.get(chat_id)
    }

    /// Rebuilds `chat_id` for the first of `waiters` and answers them all.
    fn rebuild(&mut self, chat_id: Arc<str>, waiters: Vec<Waiter>, ctx: &mut Context<Self>) {
        let Some(first) = waiters.first() else {
            return;
        };
        let (tenant, user) = (first.tenant.clone(), first.user.clone());
        self.rebuilding.insert(chat_id.clone(), waiters);
        let engine = self.engine.clone();
        let (id, t, u) = (chat_id.clone(), tenant.clone(), user.clone());
        let load = async move { engine.restore_chat(&id, &t, &u).await };
        // Spawned, not waited: lookups of other chats go on meanwhile; lookups of this one
        // join `rebuilding`.
        ctx.spawn(load.into_actor(self).map(move |result, act, ctx| {
            let waiters = act.rebuilding.remove(&chat_id).unwrap_or_default();
            let handle = match result {
                Ok(handle) => handle,
                Err(error) => {
                    tracing::warn!(chat_id = %chat_id, %error, "chat could not be rebuilt from the store");
                    let failed = RebuildFailed(Arc::from(error.to_string()));
                    for waiter in waiters {
                        let _ = waiter.reply.send(Err(failed.clone()));
                    }
                    return;
                }
            };
            if let Some(handle) = &handle {
                tracing::debug!(chat_id = %chat_id, tenant = %handle.identity.tenant, "chat rebuilt from the store");
                act.chats.insert(chat_id.clone(), handle.clone());
            }
            // Lookups by another caller than the one the rebuild was for, when it found
            // nothing: the chat may be theirs, so they get a rebuild of their own.
            let mut others = Vec::new();
            for waiter in waiters {
                let answer = match &handle {
                    Some(h) => owns(h, &waiter.tenant, &waiter.user).then(|| h.clone()),
                    None if waiter.tenant == tenant && waiter.user == user => None,
                    None => {
                        others.push(waiter);
                        continue;
                    }
                };
                let _ = waiter.reply.send(Ok(answer));
            }
            if !others.is_empty() {
                act.rebuild(chat_id, others, ctx);
            }
        }));
    }
}

fn owns(handle: &ChatHandle, tenant: &str, user: &str) -> bool {
    *handle.identity.tenant == *tenant && *handle.identity.user == *user
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
        self.live(&msg.chat_id)
            .filter(|h| owns(h, &msg.tenant, &msg.user))
            .cloned()
    }
}

impl Handler<OpenChat> for ChatRegistry {
    type Result = ResponseFuture<Result<Option<ChatHandle>, RebuildFailed>>;
    fn handle(&mut self, msg: OpenChat, ctx: &mut Self::Context) -> Self::Result {
        if let Some(handle) = self.live(&msg.chat_id) {
            let found = owns(handle, &msg.tenant, &msg.user).then(|| handle.clone());
            return Box::pin(std::future::ready(Ok(found)));
        }
        let (reply, answer) = oneshot::channel();
        let waiter = Waiter {
            tenant: msg.tenant,
            user: msg.user,
            reply,
        };
        match self.rebuilding.get_mut(msg.chat_id.as_str()) {
            Some(waiting) => waiting.push(waiter),
            None => self.rebuild(Arc::from(msg.chat_id), vec![waiter], ctx),
        }
        Box::pin(async move {
            answer
                .await
                .unwrap_or_else(|_| Err(RebuildFailed(Arc::from("the registry stopped"))))
        })
    }
}

impl Handler<ForgetChat> for ChatRegistry {
    type Result = Option<ChatHandle>;
    fn handle(&mut self, ForgetChat(chat_id): ForgetChat, _: &mut Self::Context) -> Self::Result {
        self.chats.remove(chat_id.as_str())
    }
}

impl Handler<RegistrySize> for ChatRegistry {
    type Result = MessageResult<RegistrySize>;
    fn handle(&mut self, _: RegistrySize, _: &mut Self::Context) -> Self::Result {
        self.sweep();
        MessageResult((self.chats.len(), self.rebuilding.len()))
    }
}

impl Handler<StoreQueuedWrites> for ChatRegistry {
    type Result = ResponseFuture<usize>;

    fn handle(&mut self, _: StoreQueuedWrites, _ctx: &mut Self::Context) -> Self::Result {
        self.sweep();
        let asked: Vec<_> = self
            .chats
            .values()
            .map(|handle| handle.addr.send(tessera_engine::session::WhenStored))
            .collect();
        Box::pin(async move {
            let count = asked.len();
            // A chat that stopped meanwhile has nothing more to store.
            futures::future::join_all(asked).await;
            count
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_engine::{EngineConfig, EngineHooks};
    use tessera_tools::BuiltinRegistry;

    #[actix::test]
    async fn concurrent_lookups_of_a_missing_chat_share_one_rebuild_and_leave_nothing_behind() {
        let config = EngineConfig {
            arbiters: 1,
            ..EngineConfig::default()
        };
        let engine = Engine::start(
            Vec::new(),
            &BuiltinRegistry::default(),
            config,
            EngineHooks::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let registry = ChatRegistry::new(engine).start();
        let lookups = (0..10).map(|i| {
            registry.send(OpenChat {
                chat_id: "chat_missing".into(),
                tenant: Arc::from("t"),
                user: Arc::from(if i % 2 == 0 { "u1" } else { "u2" }),
            })
        });
        for answer in futures::future::join_all(lookups).await {
            assert!(matches!(answer, Ok(Ok(None))), "no such chat for anyone");
        }
        assert_eq!(
            registry.send(RegistrySize).await.ok(),
            Some((0, 0)),
            "no handle and no rebuild in flight is left"
        );
    }
}
