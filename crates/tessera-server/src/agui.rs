//! `POST /api/v1/agui/{workflow}`: the AG-UI protocol over SSE. An AG-UI thread is one of our
//! chats (its id derived from tenant, user and `threadId`), so the chat's durability,
//! exactly-once UI tools and resume apply unchanged; a run lasts from the request until the
//! chat next stops (waits for the user, waits for a UI tool: an `interrupt` outcome, or ends).
//! Every event taken from the chat's log carries the log's seq as its SSE `id`, and
//! `RUN_FINISHED.metadata.tessera` names the chat and its last seq, so a client that lost the
//! stream can read what it missed from the chat's WebSocket (`?last_seq=`) or REST API.
//! The mapping of events lives in `agui_events.rs`.

use actix::prelude::*;
use actix_web::http::StatusCode;
use actix_web::web::Bytes;
use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tessera_engine::ChatHandle;
use tessera_engine::session::{
    ChatSnapshot, ChatStatus, GetSnapshot, Observed, ToolAnswer, Unsubscribe, UserInput, Watch,
};
use tessera_protocol::{ClientMessage, ErrorCode};
use tokio::sync::mpsc;

use crate::agui_events::{
    AguiEvent, AguiTranslator, Interrupt, RunOutcome, RunSignal, state_delta,
};
use crate::auth::Caller;
use crate::cluster::{RemoteChat, STREAM_SILENCE_LIMIT};
use crate::rest::{ApiError, parse_body, start_chat, unavailable};
use crate::serve::AppState;
use crate::ws::ChatLink;
use tessera_cluster::{ChatCommand, NumberedFrame, StreamFrame};

/// The fields of AG-UI's `RunAgentInput` this endpoint reads (the others are accepted and
/// ignored: tools are the workflow's, not the client's). Serialized to hand a run to the
/// chat's node in a cluster.
#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentInput {
    thread_id: String,
    run_id: String,
    #[serde(default)]
    messages: Vec<InputMessage>,
    /// Starting context variables of a new thread (ignored for an existing one).
    #[serde(default)]
    state: Option<Value>,
    #[serde(default)]
    resume: Vec<ResumeEntry>,
}

#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct InputMessage {
    #[serde(default)]
    id: Option<String>,
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct ResumeEntry {
    interrupt_id: String,
    status: String,
    #[serde(default)]
    payload: Option<Value>,
}

/// What a run hands to the chat once it may.
enum RunInput {
    /// A new user message.
    Message { content: String, id: Option<String> },
    /// Answers to UI tool calls (`resume` entries answering the previous run's interrupts).
    ToolAnswers(Vec<(String, Value)>),
    /// Nothing new: report where the chat stands.
    Nothing,
}

pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidField.as_str(),
        message,
    )
}

/// Our chat id for an AG-UI thread: a digest of tenant, user and thread, so two callers'
/// threads never meet whatever ids their clients choose.
fn thread_chat_id(caller: &Caller, thread_id: &str) -> String {
    let mut digest = Sha256::new();
    for part in [
        caller.tenant.as_bytes(),
        caller.user.as_bytes(),
        thread_id.as_bytes(),
    ] {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    let hex: String = digest
        .finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("agui_{hex}")
}

/// The text of an AG-UI message's content: a string, or the text parts of a list.
fn message_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A UI tool response (`{status, action?, data?, ...}`) checked by the same parser as the
/// WebSocket's `chat.tool_response`.
fn tool_answer(corr: &str, answer: Value) -> Result<(String, Value), ApiError> {
    let mut body = match answer {
        Value::Object(body) if body.get("status").is_some_and(Value::is_string) => body,
        // A bare answer is a successful submit of that data.
        other => {
            let mut body = Map::new();
            body.insert("status".into(), "success".into());
            body.insert("action".into(), "submit".into());
            body.insert("data".into(), other);
            body
        }
    };
    body.insert("corr".into(), corr.into());
    match parse_body("chat.tool_response", Value::Object(body))? {
        ClientMessage::ToolResponse(frame) => Ok((frame.corr, frame.raw)),
        _ => Err(bad_request("not a tool response")),
    }
}

impl RunAgentInput {
    /// What this run hands to the chat, given where the chat stands.
    fn run_input(&self, snap: &ChatSnapshot) -> Result<RunInput, ApiError> {
        if !self.resume.is_empty() {
            let answers = self
                .resume
                .iter()
                .map(|entry| match entry.status.as_str() {
                    "resolved" => tool_answer(
                        &entry.interrupt_id,
                        entry.payload.clone().unwrap_or(Value::Null),
                    ),
                    "cancelled" => tool_answer(
                        &entry.interrupt_id,
                        json!({"status": "error", "action": "cancel", "code": "user_cancelled"}),
                    ),
                    other => Err(bad_request(format!(
                        "resume status must be resolved or cancelled, not {other:?}"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(RunInput::ToolAnswers(answers));
        }
        // The client sends the whole thread each run: a user message is new when the client
        // holds more of them than the chat does (a retried run sends nothing twice).
        let sent = self.messages.iter().filter(|m| m.role == "user").count();
        let held = snap.transcript.iter().filter(|m| m.role == "user").count();
        match self.messages.last() {
            Some(last) if last.role == "user" && sent > held => {
                let content = message_text(last.content.as_ref());
                let mut body = Map::new();
                body.insert("content".into(), content.into());
                if let Some(id) = &last.id {
                    body.insert("client_msg_id".into(), id.clone().into());
                }
                match parse_body("chat.user_message", Value::Object(body))? {
                    ClientMessage::UserMessage {
                        content,
                        client_msg_id,
                    } => Ok(RunInput::Message {
                        content,
                        id: client_msg_id,
                    }),
                    _ => Err(bad_request("not a user message")),
                }
            }
            _ => Ok(RunInput::Nothing),
        }
    }
}

/// `POST /api/v1/agui/{workflow}`.
pub async fn run(
    caller: Caller,
    state: web::Data<AppState>,
    workflow: web::Path<String>,
    body: web::Json<RunAgentInput>,
) -> Result<HttpResponse, ApiError> {
    let input = body.into_inner();
    for (field, value) in [("threadId", &input.thread_id), ("runId", &input.run_id)] {
        if value.is_empty() || value.len() > 128 {
            return Err(bad_request(format!("{field} must be 1 to 128 bytes")));
        }
    }
    if state
        .tenant_budget
        .spend(&caller.tenant)
        .resolve()
        .await
        .is_err()
    {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::RateLimited.as_str(),
            "too many messages for this tenant; slow down",
        ));
    }
    let workflow = workflow.into_inner();
    let chat_id = thread_chat_id(&caller, &input.thread_id);
    // In a cluster, an open chat is served only by the node holding its lease: a run of a
    // chat another node runs is run there and its frames relayed from there.
    let frames = match crate::rest::locate_chat(&state, &caller, &chat_id).await {
        Ok(ChatLink::Local(chat)) => sse_body(start_run(chat, &workflow, input, false).await?),
        Ok(ChatLink::Remote(remote)) => {
            let remote = match &state.cluster {
                Some(cluster) => remote.with_patience(cluster.rest_patience),
                None => remote,
            };
            run_on_its_node(&remote, workflow, &input).await?
        }
        Err(e) if e.is_not_found() => {
            let context = match &input.state {
                Some(Value::Object(vars)) => vars.clone(),
                Some(Value::Null) | None => Map::new(),
                Some(_) => return Err(bad_request("state must be an object")),
            };
            let chat =
                start_chat(&state, &caller, workflow.clone(), context, Some(chat_id)).await?;
            sse_body(start_run(chat, &workflow, input, true).await?)
        }
        Err(e) => return Err(e),
    };
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(frames))
}

type SseBody = futures::stream::BoxStream<'static, Result<Bytes, actix_web::Error>>;

fn sse_body(received: mpsc::UnboundedReceiver<Bytes>) -> SseBody {
    Box::pin(futures::stream::unfold(
        received,
        |mut received| async move { received.recv().await.map(|frame| (Ok(frame), received)) },
    ))
}

/// Starts an AG-UI run of `chat` on this node (the node that runs the chat) and returns its
/// SSE frames as they come. `new_chat`: the chat was created for this run.
pub(crate) async fn start_run(
    chat: ChatHandle,
    workflow: &str,
    input: RunAgentInput,
    new_chat: bool,
) -> Result<mpsc::UnboundedReceiver<Bytes>, ApiError> {
    if chat.workflow != workflow {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "thread_of_other_workflow",
            format!("this thread runs workflow {}", chat.workflow),
        ));
    }
    let (events, received) = mpsc::unbounded_channel();
    let streamer = AguiRun {
        chat: chat.clone(),
        input,
        new_chat,
        translator: AguiTranslator::default(),
        events,
        before: None,
        sent_after: None,
        pending_message: None,
        subscription: None,
        finishing: false,
    };
    let arbiter = chat.arbiter.clone();
    let streamer = AguiRun::start_in_arbiter(&arbiter, move |_| streamer);
    let subscription = chat
        .addr
        .send(Watch(streamer.clone().recipient()))
        .await
        .map_err(|_| unavailable())?;
    streamer.do_send(Watching(subscription));
    Ok(received)
}

/// Runs the AG-UI run on the node that runs the chat and relays its frames. When that node
/// goes silent mid-run (it died), the stream ends with a `RUN_ERROR` the client can retry:
/// a retried run sends nothing twice (see [`RunAgentInput::run_input`]).
async fn run_on_its_node(
    remote: &RemoteChat,
    workflow: String,
    input: &RunAgentInput,
) -> Result<SseBody, ApiError> {
    let input = serde_json::to_value(input).map_err(|e| bad_request(e.to_string()))?;
    let started = remote
        .stream(|stream_to| ChatCommand::AguiRun {
            workflow,
            input,
            stream_to,
        })
        .await
        .map_err(crate::rest::owner_unreachable)?;
    match started {
        Ok(frames) => Ok(relayed(frames, STREAM_SILENCE_LIMIT)),
        Err(reply) => Err(crate::rest::refusal_error(reply)),
    }
}

/// The SSE body of frames an owner streams: their data in order until the owner's end. A lost
/// frame, `silence` without any frame (not even a keep-alive) or a closed connection means the
/// run's node is gone: the body ends with a `RUN_ERROR` the client can retry.
fn relayed(
    frames: impl futures::Stream<Item = NumberedFrame> + Send + Unpin + 'static,
    silence: std::time::Duration,
) -> SseBody {
    Box::pin(futures::stream::unfold(
        Some((frames, 0u64)),
        move |relaying| async move {
            use futures::StreamExt;
            let (mut frames, mut next) = relaying?;
            loop {
                let frame = tokio::time::timeout(silence, frames.next()).await;
                match frame {
                    Ok(Some(NumberedFrame { n, frame })) if n == next => {
                        next += 1;
                        match frame {
                            StreamFrame::Data(data) => {
                                return Some((Ok(data), Some((frames, next))));
                            }
                            StreamFrame::KeepAlive => {}
                            StreamFrame::End => return None,
                        }
                    }
                    _ => {
                        let lost = AguiEvent::RunError {
                            message: "lost the chat's node during the run; run again to continue"
                                .into(),
                            code: "owner_unavailable".into(),
                        };
                        return Some((Ok(sse_frame(&lost, None)), None));
                    }
                }
            }
        },
    ))
}

/// One SSE frame of `event` (with the chat's `seq` as its id when it comes from the log).
fn sse_frame(event: &AguiEvent, seq: Option<u64>) -> Bytes {
    let data = serde_json::to_string(event).unwrap_or_default();
    Bytes::from(match seq {
        Some(seq) => format!("id: {seq}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    })
}

/// The watch is attached (`id` for [`Unsubscribe`]): the run may look at the chat.
#[derive(Message)]
#[rtype(result = "()")]
struct Watching(u64);

/// One AG-UI run: watches the chat, hands it the run's input when it may, and streams the
/// translated events until the chat stops.
struct AguiRun {
    chat: ChatHandle,
    input: RunAgentInput,
    /// The chat was created for this run: what it said before the run watched it (say, a
    /// greeting) goes out from its transcript.
    new_chat: bool,
    translator: AguiTranslator,
    events: mpsc::UnboundedSender<Bytes>,
    /// Context variables at the start of the run (for `STATE_DELTA`).
    before: Option<Map<String, Value>>,
    /// Set once the run's input is handed over (or there is none to hand over): the seq
    /// after which the chat's stops end this run. The last seq *logged* when the input went
    /// in, not the last visible: in a cluster events become visible once durable, so an older
    /// stop (the greeting's input request) can still arrive after the snapshot.
    sent_after: Option<u64>,
    /// A user message held until the running turn stops.
    pending_message: Option<(String, Option<String>)>,
    subscription: Option<u64>,
    finishing: bool,
}

impl Actor for AguiRun {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let chat_id = self.chat.identity.chat_id.to_string();
        self.emit(
            AguiEvent::RunStarted {
                thread_id: self.input.thread_id.clone(),
                run_id: self.input.run_id.clone(),
                metadata: Some(json!({"tessera": {"chatId": chat_id}})),
            },
            None,
            ctx,
        );
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(id) = self.subscription.take() {
            self.chat.addr.do_send(Unsubscribe(id));
        }
    }
}

impl AguiRun {
    /// Sends one SSE frame; a client that went away stops the run (the chat goes on).
    fn emit(&mut self, event: AguiEvent, seq: Option<u64>, ctx: &mut Context<Self>) {
        if self.events.send(sse_frame(&event, seq)).is_err() {
            ctx.stop();
        }
    }

    fn emit_all(&mut self, events: Vec<AguiEvent>, seq: Option<u64>, ctx: &mut Context<Self>) {
        for event in events {
            self.emit(event, seq, ctx);
        }
    }

    fn fail(&mut self, code: &str, message: String, ctx: &mut Context<Self>) {
        self.finishing = true;
        self.emit(
            AguiEvent::RunError {
                message,
                code: code.to_owned(),
            },
            None,
            ctx,
        );
        ctx.stop();
    }

    /// Ends the run: closes an open message, sends the context's changes, then `RUN_FINISHED`.
    fn finish(&mut self, outcome: RunOutcome, ctx: &mut Context<Self>) {
        if self.finishing {
            return;
        }
        self.finishing = true;
        let mut out = Vec::new();
        self.translator.close_message(&mut out);
        self.emit_all(out, None, ctx);
        self.chat
            .addr
            .send(GetSnapshot)
            .into_actor(self)
            .map(move |snap, act, ctx| {
                let Ok(snap) = snap else {
                    act.fail("unavailable", "the chat is not running".into(), ctx);
                    return;
                };
                if let Some(before) = &act.before {
                    let delta = state_delta(before, &snap.visible_context);
                    if !delta.is_empty() {
                        act.emit(AguiEvent::StateDelta { delta }, None, ctx);
                    }
                }
                let finished = AguiEvent::RunFinished {
                    thread_id: act.input.thread_id.clone(),
                    run_id: act.input.run_id.clone(),
                    outcome,
                    metadata: Some(json!({"tessera": {
                        "chatId": &*snap.chat_id,
                        "lastSeq": snap.last_seq,
                    }})),
                };
                act.emit(finished, None, ctx);
                ctx.stop();
            })
            .wait(ctx);
    }

    /// Looks at the chat once: sends the state, then hands over the input or reports.
    fn begin(&mut self, snap: ChatSnapshot, ctx: &mut Context<Self>) {
        self.emit(
            AguiEvent::StateSnapshot {
                snapshot: Value::Object(snap.visible_context.clone()),
            },
            None,
            ctx,
        );
        self.before = Some(snap.visible_context.clone());
        if self.new_chat {
            let mut out = Vec::new();
            for said in snap
                .transcript
                .iter()
                .filter(|m| m.role == "assistant" && !m.ui_hidden)
            {
                self.translator
                    .whole_message(&said.message_id, &said.content, &mut out);
            }
            self.emit_all(out, None, ctx);
        }
        let input = match self.input.run_input(&snap) {
            Ok(input) => input,
            Err(e) => return self.fail(e.code(), e.to_string(), ctx),
        };
        match (input, &snap.status) {
            (RunInput::ToolAnswers(answers), _) => {
                self.send_answers(answers, snap.logged_seq, ctx);
            }
            (RunInput::Message { content, id }, ChatStatus::AwaitingUser) => {
                self.send_message(content, id, snap.logged_seq, ctx);
            }
            (input, ChatStatus::Running) => {
                // A turn is under way (e.g. a new chat's greeting): the message waits for it.
                if let RunInput::Message { content, id } = input {
                    self.pending_message = Some((content, id));
                }
                self.sent_after = Some(snap.logged_seq);
            }
            (RunInput::Nothing, ChatStatus::AwaitingUser) => self.finish(RunOutcome::Success, ctx),
            (_, ChatStatus::AwaitingTool) if !snap.pending_ui_calls.is_empty() => {
                let mut out = Vec::new();
                for call in &snap.pending_ui_calls {
                    self.translator.announce_ui_call(call, &mut out);
                }
                self.emit_all(out, None, ctx);
                let interrupts = snap.pending_ui_calls.iter().map(Interrupt::from).collect();
                self.finish(RunOutcome::Interrupt { interrupts }, ctx);
            }
            (RunInput::Message { .. }, ChatStatus::AwaitingTool) => self.fail(
                ErrorCode::NotAcceptingInput.as_str(),
                "the chat is running a tool; send the message when it is done".into(),
                ctx,
            ),
            (_, ChatStatus::AwaitingTool) => self.sent_after = Some(snap.logged_seq),
            (_, ChatStatus::Completed(reason)) => {
                let outcome = if reason.as_str() == "cancelled" {
                    RunOutcome::Cancelled
                } else {
                    RunOutcome::Success
                };
                self.finish(outcome, ctx);
            }
        }
    }
}

impl AguiRun {
    fn send_message(
        &mut self,
        content: String,
        client_msg_id: Option<String>,
        after: u64,
        ctx: &mut Context<Self>,
    ) {
        self.sent_after = Some(after);
        self.chat
            .addr
            .send(UserInput {
                content,
                client_msg_id,
            })
            .into_actor(self)
            .map(|sent, act, ctx| match sent {
                Ok(Ok(())) => {}
                Ok(Err(e)) => act.fail(e.code().as_str(), e.to_string(), ctx),
                Err(_) => act.fail("unavailable", "the chat is not running".into(), ctx),
            })
            .wait(ctx);
    }

    fn send_answers(&mut self, answers: Vec<(String, Value)>, after: u64, ctx: &mut Context<Self>) {
        self.sent_after = Some(after);
        let chat = self.chat.addr.clone();
        let sent = async move {
            for (corr, response) in answers {
                match chat.send(ToolAnswer { corr, response }).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err((e.code().as_str(), e.to_string())),
                    Err(_) => return Err(("unavailable", "the chat is not running".into())),
                }
            }
            Ok(())
        };
        sent.into_actor(self)
            .map(|sent, act, ctx| {
                if let Err((code, message)) = sent {
                    act.fail(code, message, ctx);
                }
            })
            .wait(ctx);
    }
}

impl Handler<Watching> for AguiRun {
    type Result = ();

    fn handle(&mut self, Watching(id): Watching, ctx: &mut Self::Context) {
        self.subscription = Some(id);
        self.chat
            .addr
            .send(GetSnapshot)
            .into_actor(self)
            .map(|snap, act, ctx| match snap {
                Ok(snap) => act.begin(snap, ctx),
                Err(_) => act.fail("unavailable", "the chat is not running".into(), ctx),
            })
            .wait(ctx);
    }
}

impl Handler<Observed> for AguiRun {
    type Result = ();

    fn handle(&mut self, Observed(event, seq): Observed, ctx: &mut Self::Context) {
        if self.finishing {
            return;
        }
        let mut out = Vec::new();
        let signal = self.translator.translate(&event, &mut out);
        self.emit_all(out, Some(seq), ctx);
        // Stops the chat reached before this run handed over its input are not its end.
        if self.sent_after.is_none_or(|after| seq <= after) {
            return;
        }
        match signal {
            RunSignal::Continue => {}
            RunSignal::AwaitingInput => match self.pending_message.take() {
                Some((content, id)) => self.send_message(content, id, seq, ctx),
                None => self.finish(RunOutcome::Success, ctx),
            },
            RunSignal::AwaitingUi(call) => {
                let interrupts = vec![Interrupt::from(&call)];
                self.finish(RunOutcome::Interrupt { interrupts }, ctx);
            }
            RunSignal::Completed(reason) if reason == "cancelled" => {
                self.finish(RunOutcome::Cancelled, ctx);
            }
            RunSignal::Completed(_) => self.finish(RunOutcome::Success, ctx),
            RunSignal::Failed { code, message } => self.fail(&code, message, ctx),
        }
    }
}

#[cfg(test)]
mod relay_tests {
    use std::time::Duration;

    use futures::StreamExt;
    use tessera_cluster::{NumberedFrame, StreamFrame};

    use super::relayed;

    fn frame(n: u64, frame: StreamFrame) -> NumberedFrame {
        NumberedFrame { n, frame }
    }

    fn data(n: u64, text: &'static str) -> NumberedFrame {
        frame(n, StreamFrame::Data(text.into()))
    }

    async fn body(frames: Vec<NumberedFrame>, then_silence: bool) -> Vec<String> {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        for f in frames {
            let _ = tx.unbounded_send(f);
        }
        // Kept open: the owner went silent rather than away.
        let _open = then_silence.then_some(tx);
        relayed(rx, Duration::from_secs(10))
            .map(|chunk| {
                chunk.map_or_else(
                    |e| e.to_string(),
                    |b| String::from_utf8_lossy(&b).into_owned(),
                )
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn an_owners_frames_are_relayed_in_order_until_its_end() {
        let got = body(
            vec![
                data(0, "a"),
                frame(1, StreamFrame::KeepAlive),
                data(2, "b"),
                frame(3, StreamFrame::End),
                data(4, "after the end"),
            ],
            false,
        )
        .await;
        assert_eq!(got, vec!["a", "b"]);
    }

    #[tokio::test]
    async fn a_lost_frame_ends_the_stream_with_a_run_error() {
        let got = body(vec![data(0, "a"), data(2, "c")], false).await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], "a");
        assert!(got[1].contains("RUN_ERROR") && got[1].contains("owner_unavailable"));
    }

    #[tokio::test]
    async fn an_owner_gone_away_ends_the_stream_with_a_run_error() {
        let got = body(vec![data(0, "a")], false).await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[1].contains("RUN_ERROR"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_owner_ends_the_stream_with_a_run_error_after_the_limit() {
        let started = tokio::time::Instant::now();
        let got = body(vec![data(0, "a")], true).await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[1].contains("RUN_ERROR"));
        assert!(
            started.elapsed() >= Duration::from_secs(10),
            "not before the limit"
        );
    }
}
