//! Durability, and the one boundary between engine values and store rows: nothing else in
//! the engine builds or reads a `StoredMessage`, `StoredEvent`, `PendingUiRecord`,
//! `ChatState` or `ChatRecord`, or calls the [`ChatStore`] for chat rows.
//!
//! - Writing: a session never awaits the database inside a handler. It queues its values in a
//!   [`WriteBehind`] (which maps them to rows) and one flush at a time runs as a spawned
//!   future, so a chat's writes reach the store in order (messages → events → pending UI
//!   calls → state) and batch naturally under load.
//! - Reading: [`ChatRows`] creates chats and loads stored ones back as engine values
//!   ([`RestoredChat`]), mapping each row with `From` / `TryFrom` at this boundary.
//! - Tool claims: [`StoreDedup`] puts the store's invocation records behind every
//!   `DedupCache`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tessera_llm::{Message, Role};
use tessera_protocol::{PendingUiCall, ServerEvent, ToolCallEvent};
use tessera_store::{
    ChatRecord, ChatState, ChatStore, ChatWriteBatch, JsonText, PendingUiRecord, STATUS_COMPLETED,
    StoreError, StoredChat, StoredEvent, StoredMessage, ToolClaim,
};

use crate::EngineError;
use crate::dedup::{ClaimDone, ClaimOutcome, DedupRecordStore, ToolKey};
use crate::status::{ChatIdentity, ChatStatus};

/// A chat's write-behind queue.
pub struct WriteBehind {
    store: Arc<dyn ChatStore>,
    chat_id: Arc<str>,
    queued: ChatWriteBatch,
    flushing: bool,
    /// The batch under way (shared with the store's job, not copied), put back at the head
    /// of the queue if the write fails for a reason a retry can cure: a failed flush must
    /// not lose the chat's history.
    in_flight: Option<Arc<ChatWriteBatch>>,
    /// Wait before the next retry; doubles up to [`MAX_RETRY_DELAY`], reset by a success.
    retry_delay: Duration,
    /// Highest event seq of the flush under way.
    in_flight_seq: u64,
    /// Highest event seq known to be in the store.
    persisted_seq: u64,
    /// The chat's lease epoch when a cluster owns chats by lease; every flush carries it so
    /// the store refuses it once another node took the chat over. `None` on a single node.
    epoch: Option<i64>,
    /// The state last handed to a flush: a flush whose state is unchanged leaves the chat's
    /// row alone (rewriting it dirtied a page of the `chats` table in every group commit).
    sent_state: Option<Arc<ChatState>>,
    /// The context's change count when `sent_state` was made (see `StateRow::context_changes`).
    sent_context_changes: u64,
    /// A batch was refused for good: the store's log of the chat has a gap.
    dropped_batch: bool,
    /// The chat's seqs up to here are marked taken in the store, or queued to be (see
    /// [`WriteBehind::queue_event`]).
    seqs_taken: u64,
    /// The mark last handed to a flush (the store's, once that flush is written).
    sent_mark: u64,
    /// The mark of the flush under way, if it carries one.
    in_flight_mark: Option<u64>,
    /// The mark the store is known to hold.
    durable_mark: u64,
    /// The highest seq of a streamed delta passed over (never stored).
    live_through: u64,
}

impl WriteBehind {
    /// A queue writing chat `chat_id` to `store`.
    pub fn new(store: Arc<dyn ChatStore>, chat_id: Arc<str>) -> Self {
        Self {
            store,
            chat_id,
            queued: ChatWriteBatch::default(),
            flushing: false,
            in_flight: None,
            retry_delay: FIRST_RETRY_DELAY,
            in_flight_seq: 0,
            persisted_seq: 0,
            epoch: None,
            sent_state: None,
            sent_context_changes: 0,
            dropped_batch: false,
            seqs_taken: 0,
            sent_mark: 0,
            in_flight_mark: None,
            durable_mark: 0,
            live_through: 0,
        }
    }

    /// The lease epoch every later flush carries (fencing, see `tessera_store::LeaseStore`).
    pub fn set_epoch(&mut self, epoch: Option<i64>) {
        self.epoch = epoch;
    }

    /// Highest event seq the store is known to hold: clients and operators can tell how far
    /// durability has caught up with the live log.
    pub fn persisted_seq(&self) -> u64 {
        self.persisted_seq
    }

    /// The seq up to which the store holds the chat's whole event log, so that memory may let
    /// those events go; `None` once a batch was dropped (the store's log has a gap, so the
    /// memory's log must stay whole).
    pub fn log_stored_through(&self) -> Option<u64> {
        (!self.dropped_batch).then_some(self.persisted_seq)
    }

    /// Starts counting from `seq` (a chat restored from the store already holds its log, and
    /// its seqs up to `seq` are taken).
    pub fn set_persisted_seq(&mut self, seq: u64) {
        self.persisted_seq = seq;
        self.in_flight_seq = seq;
        self.seqs_taken = seq;
        self.sent_mark = seq;
        self.durable_mark = seq;
        self.live_through = seq;
    }

    /// The seq up to which every logged event may be shown in a cluster, where an event a
    /// client saw must keep its seq whoever owns the chat next: a stored event once it is
    /// durable, a streamed delta (never stored) once the store's mark covers its seq and every
    /// stored event before it is durable. A delta under a durable mark thus waits for no write.
    pub fn settled_through(&self) -> u64 {
        let unwritten = self
            .in_flight
            .as_ref()
            .and_then(|batch| batch.events.first())
            .or_else(|| self.queued.events.first())
            .map_or(u64::MAX, |event| event.seq.saturating_sub(1));
        self.persisted_seq
            .max(self.live_through.min(self.durable_mark).min(unwritten))
    }

    /// True when writes wait for a flush.
    /// Nothing queued and no flush running: the store holds everything.
    pub fn is_idle(&self) -> bool {
        !self.flushing && self.queued.is_empty()
    }

    pub fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// Queues a transcript message.
    pub fn queue_message(&mut self, row: TranscriptRow<'_>) {
        self.queued.messages.push(row.into());
    }

    /// Queues a published event and, for a UI call, its pending-call bookkeeping: a call that
    /// starts waiting is recorded under `turn_key` (asked only then), one that ended is
    /// forgotten.
    ///
    /// A streamed delta is not stored: it is live only (memory replays it while its message
    /// streams, see `EventLog`; in a cluster the owner's memory answers other nodes' replays),
    /// and once its message's `chat.text` is out no replay gives it again, so a stored delta
    /// was a row written and kept for nothing (~31 KiB per 100-word answer from a model that
    /// streams at a pace, and a flush per token). Its seq is marked taken in the store
    /// instead, [`SEQS_TAKEN_AHEAD`] at a time: a chat rebuilt after a crash (or taken over by
    /// another node) continues above the mark, so a client that saw the delta never has its
    /// seq given to another event. The next stored event moves the mark back to its own seq,
    /// so a restart after the stream shows no jump. In a cluster a delta is shown only once
    /// the mark covering it is durable ([`WriteBehind::settled_through`]).
    pub fn queue_event(
        &mut self,
        seq: u64,
        event: &ServerEvent,
        text: Arc<str>,
        turn_key: impl FnOnce() -> String,
    ) {
        if matches!(event, ServerEvent::TextDelta { .. }) {
            self.live_through = seq;
            if seq > self.seqs_taken {
                self.seqs_taken = seq + SEQS_TAKEN_AHEAD;
                self.queued.seqs_taken_through = Some(self.seqs_taken);
            }
            return;
        }
        if self.seqs_taken > seq {
            // No seq above this one was published: the mark comes back to it, unless the
            // store's mark is not above it (a stream within one flush moves no mark at all).
            self.seqs_taken = seq;
            self.queued.seqs_taken_through = (self.sent_mark > seq).then_some(seq);
        }
        let queue = &mut self.queued;
        queue.events.push(StoredEvent {
            seq,
            event_type: event.type_name().into(),
            json: text,
        });
        match event {
            ServerEvent::ToolCall(ToolCallEvent::AwaitingUi(call)) => {
                queue
                    .put_pending
                    .push(pending_row(call, turn_key(), now_ms()));
            }
            ServerEvent::ToolResponse(response) => {
                if let Some(corr) = &response.ended_ui_call {
                    queue.remove_pending.push(corr.clone());
                }
            }
            _ => {}
        }
    }

    /// Sends the chat's current state with the queued writes (nothing is sent when nothing
    /// else is queued: the state changes only with events), unless it is the state already
    /// sent (`updated_at_ms` is thus the time of the last change).
    pub fn queue_state(&mut self, row: StateRow<'_>) {
        if !self.has_queued()
            || self
                .sent_state
                .as_ref()
                .is_some_and(|s| row.matches(s, self.sent_context_changes))
        {
            return;
        }
        self.sent_context_changes = row.context_changes;
        let state = Arc::new(ChatState::from(row));
        self.sent_state = Some(Arc::clone(&state));
        self.queued.state = Some(state);
    }

    /// Takes the queued writes and hands them to the store, unless a flush is already
    /// running (then the writes wait for the next one) or nothing is queued: false then.
    /// `done` gets the flush's outcome, on whichever thread the store finished it (SQLite's
    /// writer thread; see [`ChatStore::apply_batch_then`]).
    pub fn start_flush(&mut self, done: impl FnOnce(FlushOutcome) + Send + 'static) -> bool {
        if self.flushing || self.queued.is_empty() {
            return false;
        }
        self.flushing = true;
        let mut batch = std::mem::take(&mut self.queued);
        batch.epoch = self.epoch;
        if let Some(mark) = batch.seqs_taken_through {
            self.sent_mark = mark;
        }
        self.in_flight_mark = batch.seqs_taken_through;
        let batch = Arc::new(batch);
        // The deltas passed over count as settled: none of them is ever to be stored.
        self.in_flight_seq = batch
            .events
            .last()
            .map_or(self.persisted_seq, |e| e.seq)
            .max(self.live_through);
        self.in_flight = Some(batch.clone());
        let chat_id = self.chat_id.clone();
        self.store.apply_batch_then(
            &self.chat_id,
            batch,
            Box::new(move |written| done(flush_outcome(&chat_id, written))),
        );
        true
    }

    /// The flush finished: what to do next.
    pub fn flush_done(&mut self, outcome: FlushOutcome) -> NextFlush {
        self.flushing = false;
        let failed = self.in_flight.take();
        match outcome {
            FlushOutcome::Written => {
                self.persisted_seq = self.in_flight_seq;
                if let Some(mark) = self.in_flight_mark {
                    self.durable_mark = mark;
                }
                self.retry_delay = FIRST_RETRY_DELAY;
            }
            FlushOutcome::Retry => {
                if let Some(failed) = failed {
                    // The store's job has finished with its share; a copy only if not.
                    let failed = Arc::unwrap_or_clone(failed);
                    let newer = std::mem::take(&mut self.queued);
                    self.queued = prepend(failed, newer);
                }
                let delay = self.retry_delay;
                self.retry_delay = (delay * 2).min(MAX_RETRY_DELAY);
                return NextFlush::After(delay);
            }
            // The dropped batch may have held the latest state: send it again with the next.
            FlushOutcome::Dropped => {
                self.sent_state = None;
                self.dropped_batch = true;
            }
            FlushOutcome::Fenced => self.sent_state = None,
        }
        if self.queued.is_empty() {
            NextFlush::Idle
        } else {
            NextFlush::Now
        }
    }
}

/// How a flush ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushOutcome {
    /// The batch is in the store.
    Written,
    /// The store failed in a way a retry can cure (I/O, lock timeout, failed commit): the
    /// batch goes back to the head of the queue.
    Retry,
    /// The store refused the batch for good (conflict, chat deleted): logged and dropped.
    Dropped,
    /// The chat's lease moved to a newer epoch (another node owns it): the session must
    /// relinquish the chat.
    Fenced,
}

/// What the session should do after a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextFlush {
    /// Nothing is queued.
    Idle,
    /// More writes are queued: flush now.
    Now,
    /// The flush failed: try again after this delay (backing off).
    After(Duration),
}

/// How far ahead of a streamed delta's seq a single node marks seqs taken: one small store
/// update per this many deltas. A chat rebuilt after a restart continues above the mark, so
/// its seqs may jump by up to this much there (clients take any higher seq; gaps are normal).
const SEQS_TAKEN_AHEAD: u64 = 128;

/// First retry delay after a failed flush.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(50);
/// Longest retry delay.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// `first`'s writes followed by `then`'s, as one batch (the newest state wins).
fn prepend(mut first: ChatWriteBatch, then: ChatWriteBatch) -> ChatWriteBatch {
    first.messages.extend(then.messages);
    first.events.extend(then.events);
    first.put_pending.extend(then.put_pending);
    first.remove_pending.extend(then.remove_pending);
    first.seqs_taken_through = then.seqs_taken_through.or(first.seqs_taken_through);
    if then.state.is_some() {
        first.state = then.state;
    }
    first
}

/// What the store's answer to a flush of `chat_id` means for the write-behind queue.
fn flush_outcome(chat_id: &str, written: Result<(), StoreError>) -> FlushOutcome {
    match written {
        Ok(()) => FlushOutcome::Written,
        Err(error) if error.is_transient() => {
            tracing::warn!(chat_id = %chat_id, %error, "persisting chat failed; will retry");
            FlushOutcome::Retry
        }
        Err(StoreError::Fenced(_)) => {
            tracing::warn!(chat_id = %chat_id, "write fenced: another node owns the chat now");
            FlushOutcome::Fenced
        }
        Err(error) => {
            // A conflict or a deleted chat: the same batch would fail again.
            tracing::error!(chat_id = %chat_id, %error, "persisting chat failed; batch dropped");
            FlushOutcome::Dropped
        }
    }
}

/// The store's tool-invocation records (per chat and invocation key) as the `DedupCache`'s
/// durable layer.
pub struct StoreDedup(pub Arc<dyn ChatStore>);

impl DedupRecordStore for StoreDedup {
    fn claim(&self, key: &ToolKey, epoch: Option<i64>, done: ClaimDone) {
        self.0.claim_tool_then(
            &key.chat_id,
            &key.invocation,
            epoch,
            Box::new(move |claimed| {
                done(match claimed {
                    Ok(ToolClaim::Claimed) => Ok(ClaimOutcome::Claimed),
                    Ok(ToolClaim::AlreadyStarted) => Ok(ClaimOutcome::Interrupted),
                    // `null` is what a completion without a result records.
                    Ok(ToolClaim::AlreadyCompleted(result)) => {
                        Ok(ClaimOutcome::Completed(result.filter(|r| !r.is_null())))
                    }
                    Err(e) => Err(e.to_string()),
                })
            }),
        );
    }

    fn complete(&self, key: &ToolKey, result: Option<&Value>, epoch: Option<i64>) {
        let log_key = key.clone();
        self.0.complete_tool_then(
            &key.chat_id,
            &key.invocation,
            result,
            epoch,
            Box::new(move |completed| {
                if let Err(error) = completed {
                    tracing::error!(key = %log_key, %error, "durable dedup completion failed");
                }
            }),
        );
    }
}

/// A transcript message on its way to the store.
pub struct TranscriptRow<'a> {
    /// 0-based position in the transcript.
    pub idx: u64,
    pub message: &'a Message,
    pub message_id: &'a str,
    pub ui_hidden: bool,
}

impl From<TranscriptRow<'_>> for StoredMessage {
    fn from(row: TranscriptRow<'_>) -> Self {
        let role = match row.message.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        StoredMessage {
            idx: row.idx,
            message_id: row.message_id.to_owned(),
            role: role.into(),
            agent: row.message.name.clone(),
            content: row.message.content.clone().unwrap_or_else(|| Arc::from("")),
            ui_hidden: row.ui_hidden,
            raw: JsonText::new(row.message).unwrap_or_else(|_| JsonText::null()),
        }
    }
}

/// A transcript message read back from the store.
pub struct RestoredMessage {
    pub message: Message,
    pub message_id: String,
    pub ui_hidden: bool,
}

impl From<StoredMessage> for RestoredMessage {
    /// A row whose full LLM message does not decode keeps its text as a user message: the
    /// history stays readable and the model still sees what was said.
    fn from(row: StoredMessage) -> Self {
        let message = row
            .raw
            .parse()
            .unwrap_or_else(|_| Message::text(Role::User, row.content));
        Self {
            message,
            message_id: row.message_id,
            ui_hidden: row.ui_hidden,
        }
    }
}

/// The part of a session the store keeps as the chat's state.
pub struct StateRow<'a> {
    pub status: &'a ChatStatus,
    pub current_agent: &'a str,
    pub turn: u32,
    pub consecutive: u32,
    /// Shared with the row, not copied (see `ContextVars`).
    pub context: &'a Arc<Map<String, Value>>,
    /// How many times the chat's context was borrowed to change (it never goes down): equal
    /// counts mean an equal context, which is cheaper to know than comparing the maps.
    pub context_changes: u64,
}

impl StateRow<'_> {
    /// True when `state`, made from a row whose context had `state_context_changes`, holds
    /// this row's values (its time aside).
    fn matches(&self, state: &ChatState, state_context_changes: u64) -> bool {
        self.turn == state.turn
            && self.consecutive == state.consecutive
            && self.status.as_str() == state.status
            && self.current_agent == state.current_agent
            && self.context_changes == state_context_changes
    }
}

impl From<StateRow<'_>> for ChatState {
    fn from(row: StateRow<'_>) -> Self {
        ChatState {
            status: row.status.as_str().to_owned(),
            current_agent: row.current_agent.to_owned(),
            turn: row.turn,
            consecutive: row.consecutive,
            context: Arc::clone(row.context),
            updated_at_ms: now_ms(),
        }
    }
}

/// A chat's state read back from the store.
#[derive(Debug, Clone)]
pub struct RestoredState {
    pub status: ChatStatus,
    pub current_agent: String,
    pub turn: u32,
    pub consecutive: u32,
    pub context: Arc<Map<String, Value>>,
}

impl From<ChatState> for RestoredState {
    /// An unknown status reads as waiting for the user: the chat stays usable.
    fn from(state: ChatState) -> Self {
        let status = match state.status.as_str() {
            "running" => ChatStatus::Running,
            "awaiting_tool" => ChatStatus::AwaitingTool,
            "completed" => ChatStatus::Completed("restored".into()),
            _ => ChatStatus::AwaitingUser,
        };
        Self {
            status,
            current_agent: state.current_agent,
            turn: state.turn,
            consecutive: state.consecutive,
            context: state.context,
        }
    }
}

/// A UI call that was waiting for the browser when the chat was stored.
#[derive(Debug, Clone)]
pub struct ResumableUiCall {
    /// The turn key the answer resumes.
    pub turn_key: String,
    pub call: PendingUiCall,
}

impl TryFrom<PendingUiRecord> for ResumableUiCall {
    type Error = serde_json::Error;

    fn try_from(record: PendingUiRecord) -> Result<Self, Self::Error> {
        Ok(Self {
            turn_key: record.turn_key,
            call: serde_json::from_value(record.call)?,
        })
    }
}

/// The store's record of a UI call that starts waiting now (`now_ms`).
fn pending_row(call: &PendingUiCall, turn_key: String, now_ms: i64) -> PendingUiRecord {
    PendingUiRecord {
        corr: call.corr.clone(),
        turn_key,
        call: serde_json::to_value(call).unwrap_or(Value::Null),
        created_at_ms: now_ms,
        timeout_at_ms: call.timeout_s.map(|t| now_ms + (t * 1000.0) as i64),
    }
}

/// A stored chat, as a session is rebuilt from it.
pub struct RestoredChat {
    pub identity: ChatIdentity,
    pub workflow: String,
    /// The workflow version the chat started with (empty when stored before versions were).
    pub workflow_version: String,
    pub state: RestoredState,
    pub messages: Vec<RestoredMessage>,
    /// Each stored event's seq and text, in seq order (seqs the store lacks are streamed
    /// deltas, which a single node does not store).
    pub events: Vec<(u64, Arc<str>)>,
    /// The chat's highest taken seq (at or above its last stored event's): it continues
    /// above it (see [`WriteBehind::queue_event`]).
    pub last_seq_taken: u64,
    /// The pending UI calls, oldest first.
    pub pending: Vec<ResumableUiCall>,
}

/// The store's chat rows as the engine reads and creates them.
#[derive(Clone)]
pub struct ChatRows(pub Arc<dyn ChatStore>);

pub(crate) fn store_error(e: StoreError) -> EngineError {
    EngineError::Store(e.to_string())
}

impl ChatRows {
    /// Writes a new chat's record, before any other write of the chat.
    pub async fn create(
        &self,
        identity: &ChatIdentity,
        workflow: &str,
        workflow_version: &str,
    ) -> Result<(), EngineError> {
        let record = ChatRecord {
            chat_id: identity.chat_id.to_string(),
            tenant: identity.tenant.to_string(),
            user_id: identity.user.to_string(),
            workflow: workflow.to_owned(),
            workflow_version: workflow_version.to_owned(),
            created_at_ms: now_ms(),
        };
        self.0.create_chat(record).await.map_err(store_error)
    }

    /// Chat `chat_id` if it is `tenant`/`user`'s (open or completed), loaded whole.
    pub async fn owned(
        &self,
        chat_id: &str,
        tenant: &str,
        user: &str,
    ) -> Result<Option<RestoredChat>, EngineError> {
        let Some(chat) = self.0.load_chat(chat_id).await.map_err(store_error)? else {
            return Ok(None);
        };
        if chat.record.tenant != tenant || chat.record.user_id != user {
            return Ok(None);
        }
        self.load(chat).await.map(Some)
    }

    /// Chat `chat_id` if it exists and has not completed, loaded whole (a chat taken over from
    /// another node).
    pub async fn open_chat(&self, chat_id: &str) -> Result<Option<RestoredChat>, EngineError> {
        match self.0.load_chat(chat_id).await.map_err(store_error)? {
            Some(chat) if chat.state.status != STATUS_COMPLETED => self.load(chat).await.map(Some),
            _ => Ok(None),
        }
    }

    /// Every chat that has not completed, oldest first, loaded whole; `keep` filters by
    /// (chat id, workflow) before the chat's rows are read.
    pub async fn open_chats(
        &self,
        keep: impl Fn(&str, &str) -> bool,
    ) -> Result<Vec<RestoredChat>, EngineError> {
        let mut chats = Vec::new();
        for chat in self.0.list_open_chats().await.map_err(store_error)? {
            if keep(&chat.record.chat_id, &chat.record.workflow) {
                chats.push(self.load(chat).await?);
            }
        }
        Ok(chats)
    }

    /// The chat's transcript, event log and pending UI calls.
    async fn load(&self, chat: StoredChat) -> Result<RestoredChat, EngineError> {
        let chat_id = chat.record.chat_id.as_str();
        let messages = self.0.all_messages(chat_id).await.map_err(store_error)?;
        let events = self
            .0
            .events_after(chat_id, 0, u32::MAX)
            .await
            .map_err(store_error)?;
        let last_seq_taken = self.0.last_seq_taken(chat_id).await.map_err(store_error)?;
        let pending = self.0.pending_ui(chat_id).await.map_err(store_error)?;
        Ok(RestoredChat {
            identity: ChatIdentity {
                chat_id: Arc::from(chat_id),
                tenant: Arc::from(chat.record.tenant.as_str()),
                user: Arc::from(chat.record.user_id.as_str()),
            },
            workflow: chat.record.workflow,
            workflow_version: chat.record.workflow_version,
            state: chat.state.into(),
            messages: messages.into_iter().map(RestoredMessage::from).collect(),
            events: events.into_iter().map(|e| (e.seq, e.json)).collect(),
            last_seq_taken,
            pending: pending
                .into_iter()
                .filter_map(|p| ResumableUiCall::try_from(p).ok())
                .collect(),
        })
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_read_back_as_the_values_they_were_written_from() {
        let message = Message::assistant("Planner", "the plan");
        let stored = StoredMessage::from(TranscriptRow {
            idx: 3,
            message: &message,
            message_id: "msg_1",
            ui_hidden: true,
        });
        assert_eq!((stored.idx, &*stored.role), (3, "assistant"));
        assert_eq!(stored.agent.as_deref(), Some("Planner"));
        let back = RestoredMessage::from(stored);
        assert_eq!(back.message, message);
        assert_eq!((back.message_id.as_str(), back.ui_hidden), ("msg_1", true));

        let mut context = Map::new();
        context.insert("approved".into(), json!(true));
        let context = Arc::new(context);
        let status = ChatStatus::AwaitingTool;
        let state = ChatState::from(StateRow {
            status: &status,
            current_agent: "Planner",
            turn: 4,
            consecutive: 2,
            context: &context,
            context_changes: 1,
        });
        let back = RestoredState::from(state);
        assert_eq!(back.status, status);
        assert_eq!((back.turn, back.consecutive), (4, 2));
        assert_eq!(
            (back.current_agent.as_str(), &back.context),
            ("Planner", &context)
        );

        let call = PendingUiCall {
            corr: "ui_1".into(),
            tool_name: "review".into(),
            component_type: "Review".into(),
            display: "artifact".into(),
            agent: "Planner".into(),
            payload: json!({"plan": "p"}),
            timeout_s: Some(1.5),
        };
        let record = pending_row(&call, "turn_c_Planner_4".into(), 1_000);
        assert_eq!(record.timeout_at_ms, Some(2_500));
        let back = ResumableUiCall::try_from(record);
        assert!(matches!(back, Ok(ref r) if r.call == call && r.turn_key == "turn_c_Planner_4"));
    }

    /// The `chats` row is rewritten only when the state changed: an unchanged state stays out
    /// of the batch, a changed one (here the status, then the context) goes in.
    #[actix_rt::test]
    async fn a_flush_carries_the_state_only_when_it_changed() {
        let store = tessera_store::SqliteStore::in_memory().await;
        let store: Arc<dyn ChatStore> = Arc::new(store.expect("scratch store"));
        let mut queue = WriteBehind::new(store, Arc::from("chat_1"));
        let mut context = Arc::new(Map::new());
        let event = ServerEvent::RunStart {
            agent: "A".into(),
            turn: 1,
        };
        let mut flush_with =
            |seq: u64, status: &ChatStatus, context: &Arc<Map<String, Value>>, changes| {
                queue.queue_event(seq, &event, Arc::from("{}"), String::new);
                queue.queue_state(StateRow {
                    status,
                    current_agent: "A",
                    turn: 1,
                    consecutive: 0,
                    context,
                    context_changes: changes,
                });
                let started = queue.start_flush(|_| {});
                let state = queue
                    .in_flight
                    .as_ref()
                    .and_then(|batch| batch.state.as_ref())
                    .map(|state| (state.status.clone(), state.context.len()));
                queue.flush_done(FlushOutcome::Written);
                assert!(started);
                state
            };
        let running = &ChatStatus::Running;
        assert_eq!(
            flush_with(1, running, &context, 0),
            Some(("running".to_owned(), 0))
        );
        assert_eq!(flush_with(2, running, &context, 0), None);
        let awaiting = &ChatStatus::AwaitingUser;
        assert_eq!(
            flush_with(3, awaiting, &context, 0),
            Some(("awaiting_user".to_owned(), 0))
        );
        // Only the context changed (its change count says so): the new one is written.
        Arc::make_mut(&mut context).insert("approved".into(), json!(true));
        assert_eq!(
            flush_with(4, awaiting, &context, 1),
            Some(("awaiting_user".to_owned(), 1))
        );
        assert_eq!(flush_with(5, awaiting, &context, 1), None);
    }

    /// A streamed delta is never stored: the first one marks seqs taken [`SEQS_TAKEN_AHEAD`]
    /// beyond it, the deltas up to the mark queue nothing at all, the next delta past it moves
    /// the mark on, and the next stored event brings it back. A chat loaded back continues
    /// above the mark. In a cluster a delta settles (may be shown) once the store's mark
    /// covers it and every stored event before it is durable.
    #[actix_rt::test]
    async fn a_streamed_delta_s_seq_is_marked_taken_instead_of_stored() {
        let store = tessera_store::SqliteStore::in_memory().await;
        let store: Arc<dyn ChatStore> = Arc::new(store.expect("scratch store"));
        store
            .create_chat(ChatRecord {
                chat_id: "chat_1".into(),
                tenant: "t".into(),
                user_id: "u".into(),
                workflow: "w".into(),
                workflow_version: String::new(),
                created_at_ms: 1,
            })
            .await
            .expect("chat created");
        let mut queue = WriteBehind::new(Arc::clone(&store), Arc::from("chat_1"));
        let delta = |id: &str| ServerEvent::TextDelta {
            message_id: id.into(),
            agent: "A".into(),
            delta: "tok".into(),
        };
        let text = |id: &str| ServerEvent::Text {
            message_id: id.into(),
            agent: "A".into(),
            role: "assistant".into(),
            content: "whole".into(),
            ui_hidden: false,
        };
        let run_start = ServerEvent::RunStart {
            agent: "A".into(),
            turn: 1,
        };
        let queue_all = |queue: &mut WriteBehind, events: &[(u64, ServerEvent)]| {
            for (seq, event) in events {
                queue.queue_event(
                    *seq,
                    event,
                    Arc::from(format!("{{\"seq\":{seq}}}")),
                    String::new,
                );
            }
        };
        // The seqs of the events a flush sends, and the seqs it marks taken.
        let flush = |queue: &mut WriteBehind| -> (Vec<u64>, Option<u64>) {
            let (sent, written) = std::sync::mpsc::channel();
            assert!(queue.start_flush(move |outcome| {
                let _ = sent.send(outcome);
            }));
            let sent = queue.in_flight.as_ref().map(|batch| {
                let seqs = batch.events.iter().map(|e| e.seq).collect();
                (seqs, batch.seqs_taken_through)
            });
            let outcome = written
                .recv_timeout(Duration::from_secs(10))
                .expect("the flush ends");
            assert_eq!(outcome, FlushOutcome::Written);
            queue.flush_done(outcome);
            sent.unwrap_or_default()
        };
        let ahead = SEQS_TAKEN_AHEAD;
        queue_all(
            &mut queue,
            &[(1, run_start.clone()), (2, delta("m1")), (3, delta("m1"))],
        );
        assert_eq!(flush(&mut queue), (vec![1], Some(2 + ahead)));
        assert_eq!(
            queue.persisted_seq(),
            3,
            "the deltas passed over are settled"
        );
        queue_all(
            &mut queue,
            &[(4, delta("m1")), (5, delta("m1")), (6, text("m1"))],
        );
        assert_eq!(
            flush(&mut queue),
            (vec![6], Some(6)),
            "the stream is over: the mark comes back to the next stored event"
        );
        // m2's first delta marks seqs taken ahead; those up to the mark queue nothing, so no
        // flush; the next one moves the mark on.
        queue_all(&mut queue, &[(7, delta("m2"))]);
        assert_eq!(flush(&mut queue), (vec![], Some(7 + ahead)));
        let upto_mark: Vec<_> = (8..=7 + ahead).map(|seq| (seq, delta("m2"))).collect();
        queue_all(&mut queue, &upto_mark);
        assert!(!queue.start_flush(|_| {}), "nothing was queued");
        queue_all(&mut queue, &[(8 + ahead, delta("m2"))]);
        assert_eq!(flush(&mut queue), (vec![], Some(8 + 2 * ahead)));
        assert_eq!(queue.persisted_seq(), 8 + ahead);
        let stored: Vec<u64> = store
            .events_after("chat_1", 0, 1000)
            .await
            .expect("events read")
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(stored, [1, 6]);
        // Loaded back after a crash, the chat's next event is above every seq a client may
        // have seen.
        let restored = ChatRows(Arc::clone(&store))
            .open_chats(|_, _| true)
            .await
            .expect("chat loaded");
        assert_eq!(restored[0].last_seq_taken, 8 + 2 * ahead);
        let mut log = crate::envelope::EventLog::default();
        for (seq, text) in &restored[0].events {
            log.push_stored(*seq, text);
        }
        log.take_seqs_through(restored[0].last_seq_taken);
        assert_eq!(log.last_seq(), 8 + 2 * ahead);

        // m2's text brings the mark back; m3 streams and is final within one flush: no mark.
        queue_all(&mut queue, &[(9 + ahead, text("m2"))]);
        assert_eq!(flush(&mut queue), (vec![9 + ahead], Some(9 + ahead)));
        queue_all(
            &mut queue,
            &[
                (10 + ahead, delta("m3")),
                (11 + ahead, delta("m3")),
                (12 + ahead, text("m3")),
            ],
        );
        assert_eq!(flush(&mut queue), (vec![12 + ahead], None));
        assert_eq!(store.last_seq_taken("chat_1").await.ok(), Some(12 + ahead));

        // In a cluster (a lease epoch): what may be shown waits for the store.
        let mut queue = WriteBehind::new(Arc::clone(&store), Arc::from("chat_1"));
        queue.set_persisted_seq(12 + ahead);
        queue.set_epoch(Some(1));
        let s = 12 + ahead;
        queue_all(
            &mut queue,
            &[(s + 1, run_start.clone()), (s + 2, delta("m5"))],
        );
        assert_eq!(queue.settled_through(), s, "nothing durable yet");
        let (sent, written) = std::sync::mpsc::channel();
        assert!(queue.start_flush(move |outcome| {
            let _ = sent.send(outcome);
        }));
        queue_all(&mut queue, &[(s + 3, delta("m5"))]);
        assert!(
            !queue.has_queued(),
            "under the mark in flight: nothing to write"
        );
        assert_eq!(queue.settled_through(), s, "the flush is under way");
        let outcome = written.recv_timeout(Duration::from_secs(10));
        queue.flush_done(outcome.expect("the flush ends"));
        assert_eq!(queue.settled_through(), s + 3, "the mark is durable");
        queue_all(&mut queue, &[(s + 4, delta("m5"))]);
        assert_eq!(
            queue.settled_through(),
            s + 4,
            "a delta under a durable mark settles at once"
        );
        assert!(!queue.start_flush(|_| {}), "without a write");
        queue_all(&mut queue, &[(s + 5, text("m5")), (s + 6, delta("m6"))]);
        assert_eq!(
            queue.settled_through(),
            s + 4,
            "a delta waits for the stored event before it"
        );
        assert_eq!(flush(&mut queue), (vec![s + 5], Some(s + 6 + ahead)));
        assert_eq!(queue.settled_through(), s + 6);
        assert_eq!(
            store.last_seq_taken("chat_1").await.ok(),
            Some(s + 6 + ahead)
        );
        // A stored event brings the mark back while a flush is under way: a delta after it
        // waits for its own mark.
        queue_all(&mut queue, &[(s + 7, text("m6"))]);
        let (sent, written) = std::sync::mpsc::channel();
        assert!(queue.start_flush(move |outcome| {
            let _ = sent.send(outcome);
        }));
        queue_all(&mut queue, &[(s + 8, delta("m7"))]);
        let outcome = written.recv_timeout(Duration::from_secs(10));
        assert_eq!(
            queue.flush_done(outcome.expect("the flush ends")),
            NextFlush::Now
        );
        assert_eq!(
            queue.settled_through(),
            s + 7,
            "s + 8's mark is not written yet"
        );
        assert_eq!(flush(&mut queue), (vec![], Some(s + 8 + ahead)));
        assert_eq!(queue.settled_through(), s + 8);
    }

    #[test]
    fn an_undecodable_pending_call_is_an_error_not_a_guess() {
        let record = PendingUiRecord {
            corr: "ui_1".into(),
            turn_key: "t".into(),
            call: json!({"corr": 7}),
            created_at_ms: 0,
            timeout_at_ms: None,
        };
        assert!(ResumableUiCall::try_from(record).is_err());
    }
}
