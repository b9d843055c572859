//! A chat rebuilt from the store after a restart: its session is rebuilt from the stored
//! values, and once started it picks up what it was doing — the one home of restart logic.

use std::sync::Arc;

use actix::prelude::*;
use serde_json::{Map, Value};
use tessera_protocol::{ErrorCode, ServerEvent};

use super::{ChatSession, ChatStatus};
use crate::EngineConfig;
use crate::auto_tool::{UiWaitParts, resume_ui_wait};
use crate::dedup::{AdoptKey, ToolKey};
use crate::persist::{RestoredChat, ResumableUiCall};
use crate::plan::CompiledWorkflow;
use crate::runner::LoggedToolEvents;
use crate::shard::Shard;

/// What a chat rebuilt after a restart must pick up again.
#[derive(Debug, Clone)]
pub(super) struct RestoredWork {
    pending: Vec<ResumableUiCall>,
    /// The last `chat.structured_output_ready` of the log that asked for an auto tool: its
    /// turn key and data, for an auto tool whose UI call never reached the store.
    auto_tool: Option<(String, Value)>,
    /// For an interrupted turn: its tool events the log already holds (the re-run reuses
    /// recorded results without announcing them again).
    logged_tools: LoggedToolEvents,
}

impl ChatSession {
    /// A chat rebuilt from its stored state, transcript and event log after a restart.
    pub fn restore(
        wf: Arc<CompiledWorkflow>,
        shard: Arc<Shard>,
        config: Arc<EngineConfig>,
        stored: RestoredChat,
    ) -> Self {
        let mut session = Self::new(stored.identity, wf, shard, config, Map::new());
        session.context = super::variables::ContextVars::new(stored.state.context);
        session.current_agent = Arc::from(stored.state.current_agent.as_str());
        session.turn = stored.state.turn;
        session.consecutive = stored.state.consecutive;
        session.status = stored.state.status;
        for message in stored.messages {
            session.history.push(message.message);
            session.meta.push((message.message_id, message.ui_hidden));
        }
        for (seq, text) in &stored.events {
            session.log.push_stored(*seq, text);
        }
        session.log.take_seqs_through(stored.last_seq_taken);
        let restored_seq = session.last_seq();
        if let Some(persist) = &mut session.persist {
            persist.set_persisted_seq(restored_seq);
        }
        session.forget_stored_events();
        let key = super::turn_key(&session.id.chat_id, &session.current_agent, session.turn);
        // Only the current turn's request (the state and the event were stored together).
        let auto_tool = (session.status == ChatStatus::AwaitingTool && stored.pending.is_empty())
            .then(|| last_auto_tool_request(&stored.events))
            .flatten()
            .filter(|(turn_key, _)| *turn_key == key);
        let logged_tools = if session.status == ChatStatus::Running {
            LoggedToolEvents {
                calls: tool_events_of_turn(&stored.events, &key, "chat.tool_call"),
                responses: tool_events_of_turn(&stored.events, &key, "chat.tool_response"),
            }
        } else {
            LoggedToolEvents::default()
        };
        session.restored = Some(RestoredWork {
            pending: stored.pending,
            auto_tool,
            logged_tools,
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
                    self.resume_unannounced_auto_tool(work.auto_tool, ctx);
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
                    dedup: Addr::clone(&self.shard.dedup),
                    publish: ctx.address().recipient(),
                    default_timeout: self.config.ui_timeout,
                };
                let wait = resume_ui_wait(&self.wf, tool_ctx, call, parts);
                self.await_auto_tool(wait, ctx);
            }
            ChatStatus::Running => {
                // Re-run the interrupted turn under the same turn key: tools it had claimed
                // are found in the durable records and reported (left `started`) or reused
                // (completed), never re-run.
                self.logged_tools = work.logged_tools;
                let agent = self.current_agent.clone();
                self.turn = self.turn.saturating_sub(1);
                self.start_turn(agent, ctx);
            }
            ChatStatus::Completed(_) => self.schedule_retire(ctx),
            ChatStatus::AwaitingUser => {}
        }
    }

    /// The chat stopped between its agent's structured output and the durable announcement
    /// of the UI call (no client can have seen or answered it). The auto tool is invoked
    /// again under the same turn key, and its claim decides: never claimed → it runs now;
    /// claimed and left `started` → reported as interrupted, never silently re-run.
    fn resume_unannounced_auto_tool(
        &mut self,
        request: Option<(String, Value)>,
        ctx: &mut Context<Self>,
    ) {
        let Some((turn_key, data)) = request else {
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
        tool_ctx.turn_idempotency_key = Arc::from(turn_key.as_str());
        self.invoke_auto_tool(tool_ctx, data, ctx);
    }
}

/// The invocation keys of turn `turn_key`'s agent tools with an event of type `kind` in
/// `events` (the stored envelopes).
fn tool_events_of_turn(events: &[(u64, Arc<str>)], turn_key: &str, kind: &str) -> Vec<String> {
    let prefix = format!("{turn_key}:");
    events
        .iter()
        .map(|(_, text)| text)
        // A cheap text check first; the parsed type and corr decide.
        .filter(|e| e.contains(kind) && e.contains(&prefix))
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|e| e["type"] == kind)
        .filter_map(|e| e["data"]["corr"].as_str().map(str::to_owned))
        .filter(|corr| corr.starts_with(&prefix))
        .collect()
}

/// The turn key and data of the log's last `chat.structured_output_ready` that asked for an
/// auto tool (`events`: the stored envelopes in seq order).
fn last_auto_tool_request(events: &[(u64, Arc<str>)]) -> Option<(String, Value)> {
    let (_, text) = events
        .iter()
        .rev()
        .find(|(_, e)| e.contains("\"chat.structured_output_ready\""))?;
    let mut event: Value = serde_json::from_str(text).ok()?;
    let data = event.get_mut("data")?;
    if data["auto_tool_mode"] != Value::Bool(true) {
        return None;
    }
    let turn_key = data["turn_idempotency_key"].as_str()?.to_owned();
    Some((turn_key, data["structured_data"].take()))
}

#[cfg(test)]
mod tests {
    use super::tool_events_of_turn;

    fn envelope(seq: u64, kind: &str, data: serde_json::Value) -> (u64, std::sync::Arc<str>) {
        let text = serde_json::json!({"type": kind, "seq": seq, "chat_id": "c", "data": data});
        (seq, text.to_string().into())
    }

    /// A turn re-run after a takeover announces only what its log lacks: the keys come from
    /// events of the asked type and turn, never from text that merely mentions them.
    #[test]
    fn the_logged_tool_events_of_a_turn_are_found_by_type_and_turn() {
        let turn = "turn_c_A_3";
        let events = vec![
            envelope(
                1,
                "chat.tool_call",
                serde_json::json!({"corr": "turn_c_A_3:s1:0"}),
            ),
            envelope(
                2,
                "chat.tool_call",
                serde_json::json!({"corr": "turn_c_A_3:s1:1"}),
            ),
            envelope(
                3,
                "chat.tool_response",
                serde_json::json!({"corr": "turn_c_A_3:s1:0",
                "content": "\"chat.tool_call\" turn_c_A_3:s1:9"}),
            ),
            envelope(
                4,
                "chat.tool_call",
                serde_json::json!({"corr": "turn_c_A_2:s1:0"}),
            ),
            envelope(
                5,
                "chat.text",
                serde_json::json!({"content": "\"chat.tool_call\" turn_c_A_3:"}),
            ),
        ];
        assert_eq!(
            tool_events_of_turn(&events, turn, "chat.tool_call"),
            ["turn_c_A_3:s1:0", "turn_c_A_3:s1:1"]
        );
        assert_eq!(
            tool_events_of_turn(&events, turn, "chat.tool_response"),
            ["turn_c_A_3:s1:0"]
        );
    }
}
