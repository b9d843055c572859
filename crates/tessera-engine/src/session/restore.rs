//! A chat rebuilt from the store after a restart: its session is rebuilt from the stored
//! values, and once started it picks up what it was doing — the one home of restart logic.

use std::sync::Arc;

use actix::prelude::*;
use serde_json::Map;
use tessera_protocol::{ErrorCode, ServerEvent};

use super::{ChatSession, ChatStatus};
use crate::EngineConfig;
use crate::auto_tool::{UiWaitParts, resume_ui_wait};
use crate::dedup::{AdoptKey, ToolKey};
use crate::persist::{RestoredChat, ResumableUiCall};
use crate::plan::CompiledWorkflow;
use crate::shard::Shard;

/// What a chat rebuilt after a restart must pick up again.
#[derive(Debug, Clone)]
pub(super) struct RestoredWork {
    pending: Vec<ResumableUiCall>,
}

impl ChatSession {
    /// A chat rebuilt from its stored state, transcript and event log after a restart.
    pub fn restore(
        wf: Arc<CompiledWorkflow>,
        shard: Shard,
        config: Arc<EngineConfig>,
        stored: RestoredChat,
    ) -> Self {
        let mut session = Self::new(stored.identity, wf, shard, config, Map::new());
        session.context = stored.state.context;
        session.current_agent = Arc::from(stored.state.current_agent.as_str());
        session.turn = stored.state.turn;
        session.consecutive = stored.state.consecutive;
        session.status = stored.state.status;
        for message in stored.messages {
            session.history.push(message.message);
            session.meta.push((message.message_id, message.ui_hidden));
        }
        for text in &stored.events {
            session.log.push_stored(text);
        }
        let restored_seq = session.last_seq();
        if let Some(persist) = &mut session.persist {
            persist.set_persisted_seq(restored_seq);
        }
        session.restored = Some(RestoredWork {
            pending: stored.pending,
        });
        session
    }

    /// Opens the sealed vault, then resumes: a resumed tool sees the secrets collected
    /// before the restart.
    pub(super) fn start_restored(&mut self, work: RestoredWork, ctx: &mut Context<Self>) {
        let load = crate::secrets::load(
            self.shard.store.as_ref(),
            self.config.vault_key.clone(),
            &self.id.chat_id,
        );
        match load {
            // Waited for, so nothing else runs before the secrets are in.
            Some(load) => ctx.wait(load.into_actor(self).map(move |secrets, act, ctx| {
                act.secrets.store(secrets);
                act.resume_after_restart(work, ctx);
            })),
            None => self.resume_after_restart(work, ctx),
        }
    }

    /// Picks up where a chat stood when the previous process died.
    fn resume_after_restart(&mut self, work: RestoredWork, ctx: &mut Context<Self>) {
        tracing::info!(chat_id = %self.id.chat_id, status = self.status.as_str(), turn = self.turn, "chat rehydrated");
        match self.status.clone() {
            ChatStatus::AwaitingTool => {
                let Some(ResumableUiCall {
                    turn_key: turn_key_text,
                    call,
                }) = work.pending.into_iter().next()
                else {
                    // The tool was claimed but its UI call never reached the store.
                    self.publish(ServerEvent::error(
                        ErrorCode::ToolError,
                        "the server restarted while a tool was starting; it was not re-run",
                        true,
                    ));
                    self.await_user();
                    return;
                };
                let agent = self.current_agent.clone();
                let mut tool_ctx = self.tool_ctx(&agent);
                tool_ctx.turn_idempotency_key = Arc::from(turn_key_text.as_str());
                self.shard
                    .dedup
                    .do_send(AdoptKey(ToolKey::of_turn(&tool_ctx)));
                // The wait is registered with the correlator now, before this session handles
                // anything else: any later listing of pending calls already sees it.
                let parts = UiWaitParts {
                    correlator: self.shard.correlator.clone(),
                    dedup: self.shard.dedup.clone(),
                    publish: ctx.address().recipient(),
                    default_timeout: self.config.ui_timeout,
                };
                let wait = resume_ui_wait(&self.wf, tool_ctx, call, parts);
                self.await_auto_tool(wait, ctx);
            }
            ChatStatus::Running => {
                // Re-run the interrupted turn under the same turn key: tools it had claimed
                // are found in the durable records and reported, never re-run.
                let agent = self.current_agent.clone();
                self.turn = self.turn.saturating_sub(1);
                self.start_turn(agent, ctx);
            }
            ChatStatus::Completed(_) => self.schedule_retire(ctx),
            ChatStatus::AwaitingUser => {}
        }
    }
}
