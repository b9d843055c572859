//! Actor-level tests of the engine: each drives real actors with an in-process fake model and
//! asserts the exact events a client sees.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use actix::prelude::*;
use common::*;
use serde_json::{Map, Value, json};
use tessera_engine::auto_tool::{AutoToolHandler, AutoToolOutcome, InvokeAutoTool};
use tessera_engine::correlator::{
    CorrelationError, ListPendingUiCalls, ResolveUiCall, UiCorrelator,
};
use tessera_engine::dedup::{ClaimOutcome, DedupCache};
use tessera_engine::plan::CompiledWorkflow;
use tessera_engine::session::{CancelRun, Publish, ToolAnswer, UserInput};
use tessera_engine::{DisconnectPolicy, EngineConfig, EngineError, NewChat};
use tessera_llm::ChatModel;
use tessera_protocol::{ServerEvent, ToolCallEvent};
use tessera_tools::{
    BuiltinRegistry, InMemoryArtifactStore, InMemoryTaskStore, ToolContext, ToolServices,
};
use tokio::sync::mpsc;

fn say(content: &str) -> UserInput {
    UserInput {
        content: content.into(),
        client_msg_id: None,
    }
}

/// Helper: tools on "use tool", NEXT on "next"; Planner: valid plan JSON.
fn default_script(req: &tessera_llm::ChatRequest) -> Reply {
    match req.agent.as_str() {
        "HelperAgent" if after_tool(req) => Reply::Text("done".into()),
        "HelperAgent" => match last_user(req) {
            "use tool" => Reply::Tools(vec![("echo", json!({"message": "hi"}))]),
            "unknown tool" => Reply::Tools(vec![("rm_rf", json!({"path": "/"}))]),
            "bad args" => Reply::Tools(vec![(
                "echo",
                json!({"message": "hi", "repeat_count": "5"}),
            )]),
            "next" => Reply::Text("NEXT".into()),
            "hang" => Reply::Hang,
            "fail" => Reply::Fail,
            _ => Reply::Text("hello".into()),
        },
        "PlannerAgent" => Reply::Text(
            json!({"Plan": "three steps", "agent_message": "Please review"}).to_string(),
        ),
        _ => Reply::Text("?".into()),
    }
}

#[actix::test]
async fn agent_tool_runs_once_and_its_result_feeds_the_model() {
    let h = harness(EngineConfig::default(), default_script);
    let mut c = connect(&h, "t1").await;
    c.until("chat.input_request").await;
    assert_eq!(c.chat.addr.send(say("use tool")).await.ok(), Some(Ok(())));
    let text = c.until("chat.text").await; // the user's own message
    assert_eq!(text["data"]["role"], "user");
    let call = c.until("chat.tool_call").await;
    assert_eq!(call["data"]["tool_name"], "echo");
    assert_eq!(call["data"]["awaiting_response"], false);
    assert_eq!(call["data"]["payload"]["interaction_type"], "agent_tool");
    assert_eq!(
        call["data"]["payload"]["tool_args"],
        json!({"message": "hi", "repeat_count": 1}),
        "defaults are injected"
    );
    let response = c.until("chat.tool_response").await;
    assert_eq!(response["data"]["success"], true);
    let answer = c.until("chat.text").await;
    assert_eq!(answer["data"]["content"], "done");
    assert_eq!(answer["data"]["agent"], "HelperAgent");
    c.until("chat.input_request").await;
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        h.model.calls.load(Ordering::SeqCst),
        2,
        "one call for the tool, one after its result"
    );
}

#[actix::test]
async fn unknown_tool_is_an_error_the_model_sees_and_never_runs() {
    let (fed_tx, fed_rx) = std::sync::mpsc::channel::<String>();
    let h = harness(EngineConfig::default(), move |req| {
        if let (true, Some(m)) = (after_tool(req), req.messages.last()) {
            let _ = fed_tx.send(m.content_str().to_owned());
        }
        default_script(req)
    });
    let mut c = connect(&h, "t1").await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("unknown tool")).await.is_ok());
    let answer = c.until("chat.text").await;
    assert_eq!(answer["data"]["role"], "user");
    let answer = c.until("chat.text").await;
    assert_eq!(answer["data"]["content"], "done");
    assert!(
        c.of("chat.tool_call").is_empty(),
        "an unknown tool is never announced or run"
    );
    let fed: Vec<String> = fed_rx.try_iter().collect();
    assert_eq!(fed.len(), 1);
    assert!(
        fed[0].contains("unknown_tool") && fed[0].contains("rm_rf"),
        "{fed:?}"
    );
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 0);
}

#[actix::test]
async fn arguments_are_validated_strictly_without_coercion() {
    let h = harness(EngineConfig::default(), default_script);
    let mut c = connect(&h, "t1").await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("bad args")).await.is_ok());
    c.until("chat.text").await;
    let answer = c.until("chat.text").await;
    assert_eq!(answer["data"]["content"], "done");
    assert_eq!(
        h.echo_runs.load(Ordering::SeqCst),
        0,
        "\"5\" is not an integer: the tool must not run"
    );
}

#[actix::test]
async fn hidden_token_hands_off_and_the_ui_tool_round_trip_completes_without_leaking_secrets() {
    let h = harness(EngineConfig::default(), default_script);
    let mut c = connect(&h, "t1").await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("next")).await.is_ok());
    c.until("chat.text").await; // user
    let token = c.until("chat.text").await;
    assert_eq!(token["data"]["content"], "NEXT");
    assert_eq!(token["data"]["ui_hidden"], true);
    let handoff = c.until("chat.handoff").await;
    assert_eq!(handoff["data"]["to"], "PlannerAgent");
    let ready = c.until("chat.structured_output_ready").await;
    assert_eq!(ready["data"]["model_name"], "PlanCall");
    let auto = c.until("chat.tool_call").await;
    assert_eq!(auto["data"]["awaiting_response"], false);
    assert_eq!(auto["data"]["payload"]["interaction_type"], "auto_tool");
    assert_eq!(auto["data"]["corr"], ready["data"]["turn_idempotency_key"]);
    let ui = c.until("chat.tool_call").await;
    assert_eq!(ui["data"]["awaiting_response"], true);
    assert_eq!(ui["data"]["display"], "artifact");
    assert_eq!(ui["data"]["component_type"], "PlanReview");
    assert_eq!(ui["data"]["payload"]["agent_message"], "Please review");
    let corr = ui["data"]["corr"].as_str().unwrap_or_default().to_owned();
    assert!(corr.len() > 30, "corr ids are long random tokens: {corr}");

    let answer = ToolAnswer {
        corr: corr.clone(),
        response: json!({"status": "success", "action": "approve", "data": {"apiKey": "sk-CANARY-9f8e7d", "ui_tool_id": corr}}),
    };
    assert_eq!(c.chat.addr.send(answer).await.ok(), Some(Ok(())));
    let done = c.until("chat.tool_response").await;
    assert_eq!(done["data"]["success"], true);
    assert_eq!(done["data"]["interaction_type"], "auto_tool");
    let complete = c.until("chat.run_complete").await;
    assert_eq!(complete["data"]["reason"], "terminate");
    let everything = serde_json::to_string(&c.seen).unwrap_or_default();
    assert!(
        !everything.contains("sk-CANARY-9f8e7d"),
        "a secret field reached an event"
    );
}

#[actix::test]
async fn forged_foreign_and_replayed_correlation_ids_are_refused() {
    let h = harness(EngineConfig::default(), default_script);
    let mut a = connect(&h, "t1").await;
    let mut b = connect(&h, "t2").await;
    for c in [&mut a, &mut b] {
        c.until("chat.input_request").await;
        assert!(c.chat.addr.send(say("next")).await.is_ok());
    }
    let corr_a = loop {
        let ev = a.until("chat.tool_call").await;
        if ev["data"]["awaiting_response"] == true {
            break ev["data"]["corr"].as_str().unwrap_or_default().to_owned();
        }
    };
    loop {
        if b.until("chat.tool_call").await["data"]["awaiting_response"] == true {
            break;
        }
    }
    let ok = json!({"status": "success", "data": {}});
    let forged = b
        .chat
        .addr
        .send(ToolAnswer {
            corr: "ui_forged".into(),
            response: ok.clone(),
        })
        .await;
    assert_eq!(
        forged.ok(),
        Some(Err(EngineError::Correlation(CorrelationError::Unknown)))
    );
    let foreign = b
        .chat
        .addr
        .send(ToolAnswer {
            corr: corr_a.clone(),
            response: ok.clone(),
        })
        .await;
    // Chats on other arbiters have other correlators: either way the answer is refused.
    assert!(
        matches!(
            foreign.ok(),
            Some(Err(EngineError::Correlation(
                CorrelationError::ForeignChat | CorrelationError::Unknown
            )))
        ),
        "a corr of another chat must be refused"
    );
    let bad = a
        .chat
        .addr
        .send(ToolAnswer {
            corr: corr_a.clone(),
            response: json!({"status": "maybe"}),
        })
        .await;
    assert!(
        matches!(bad.ok(), Some(Err(EngineError::InvalidToolResponse(_)))),
        "contract violations do not resolve the wait"
    );
    assert_eq!(
        a.chat
            .addr
            .send(ToolAnswer {
                corr: corr_a.clone(),
                response: ok.clone()
            })
            .await
            .ok(),
        Some(Ok(()))
    );
    let replay = a
        .chat
        .addr
        .send(ToolAnswer {
            corr: corr_a,
            response: ok,
        })
        .await;
    assert_eq!(
        replay.ok(),
        Some(Err(EngineError::Correlation(
            CorrelationError::AlreadyResolved
        )))
    );
    a.until("chat.run_complete").await;
    assert!(
        b.of("chat.tool_response").is_empty(),
        "chat B's wait was untouched"
    );
}

#[actix::test]
async fn ui_wait_times_out_with_a_clear_result() {
    let config = EngineConfig {
        ui_timeout: Some(Duration::from_millis(50)),
        ..EngineConfig::default()
    };
    let h = harness(config, default_script);
    let mut c = connect(&h, "t1").await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("next")).await.is_ok());
    let response = c.until("chat.tool_response").await;
    assert_eq!(response["data"]["success"], false);
    assert_eq!(response["data"]["payload"]["code"], "ui_timeout");
    let waiting = c.until("chat.input_request").await;
    assert_eq!(waiting["data"]["agent"], "PlannerAgent");
}

#[actix::test]
async fn invalid_structured_output_gets_one_correction() {
    let h = harness(EngineConfig::default(), |req| match req.agent.as_str() {
        "PlannerAgent"
            if req
                .messages
                .iter()
                .any(|m| m.content_str().contains("did not match")) =>
        {
            Reply::Text(json!({"Plan": "p", "agent_message": "fixed"}).to_string())
        }
        "PlannerAgent" => Reply::Text(json!({"Plan": "p"}).to_string()),
        _ => default_script(req),
    });
    let mut c = connect(&h, "t1").await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("next")).await.is_ok());
    let ready = c.until("chat.structured_output_ready").await;
    assert_eq!(ready["data"]["structured_data"]["agent_message"], "fixed");
    assert_eq!(
        h.model.calls.load(Ordering::SeqCst),
        3,
        "helper once, planner twice"
    );
}

#[actix::test]
async fn structured_output_still_invalid_after_correction_is_an_error_not_a_loop() {
    let h = harness(EngineConfig::default(), |req| match req.agent.as_str() {
        "PlannerAgent" => Reply::Text("not json at all".into()),
        _ => default_script(req),
    });
    let mut c = connect(&h, "t1").await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("next")).await.is_ok());
    let error = c.until("chat.error").await;
    assert_eq!(error["data"]["code"], "structured_output_invalid");
    assert_eq!(error["data"]["recoverable"], true);
    c.until("chat.input_request").await;
    assert!(c.of("chat.tool_call").is_empty());
    assert_eq!(h.model.calls.load(Ordering::SeqCst), 3);
}

async fn json_chat(h: &Harness) -> tessera_engine::ChatHandle {
    let mut context = Map::new();
    context.insert("mode".into(), json!("json"));
    match h
        .engine
        .start_chat(NewChat {
            tenant: "t".into(),
            user: "u".into(),
            workflow: "EngineTest".into(),
            context,
            chat_id: None,
        })
        .await
    {
        Ok(chat) => chat,
        Err(e) => panic!("{e}"),
    }
}

#[actix::test]
async fn json_mode_runs_a_valid_tool_call_and_answers() {
    let h = harness(EngineConfig::default(), |req| match req.agent.as_str() {
        "JsonAgent" if after_tool(req) => Reply::Text("There are 3 words.".into()),
        "JsonAgent" => Reply::Text(r#"{"tool": "word_count", "args": {"text": "a b c"}}"#.into()),
        _ => Reply::Text("ok".into()),
    });
    let mut c = subscribe(json_chat(&h).await, 0).await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("count")).await.is_ok());
    let call = c.until("chat.tool_call").await;
    assert_eq!(call["data"]["tool_name"], "word_count");
    let result = c.until("chat.tool_response").await;
    assert_eq!(result["data"]["payload"]["words"], 3);
    loop {
        let text = c.until("chat.text").await;
        if text["data"]["agent"] == "JsonAgent" {
            assert_eq!(text["data"]["content"], "There are 3 words.");
            break;
        }
    }
}

#[actix::test]
async fn json_mode_gives_one_correction_then_stops_with_an_error() {
    let h = harness(EngineConfig::default(), |req| match req.agent.as_str() {
        "JsonAgent" => Reply::Text(r#"{"tool": "word_count", "args": {"text": 5}}"#.into()),
        _ => Reply::Text("ok".into()),
    });
    let mut c = subscribe(json_chat(&h).await, 0).await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("count")).await.is_ok());
    let error = c.until("chat.error").await;
    assert_eq!(error["data"]["code"], "tool_error");
    assert!(
        c.of("chat.tool_call").is_empty(),
        "an invalid call never runs"
    );
    assert_eq!(
        h.model.calls.load(Ordering::SeqCst),
        3,
        "helper once, json agent twice (one correction)"
    );
}

#[actix::test]
async fn cancel_mid_turn_stops_the_turn_and_the_chat_stays_usable() {
    let h = harness(EngineConfig::default(), default_script);
    let mut c = connect(&h, "t1").await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("hang")).await.is_ok());
    c.until("chat.run_start").await;
    assert!(
        c.chat
            .addr
            .send(say("again"))
            .await
            .ok()
            .is_some_and(|r| r.is_err()),
        "busy chats refuse input"
    );
    assert!(c.chat.addr.send(CancelRun).await.is_ok());
    let done = c.until("chat.run_complete").await;
    assert_eq!(done["data"]["reason"], "cancelled");
    c.until("chat.input_request").await;
    assert_eq!(c.chat.addr.send(say("hello")).await.ok(), Some(Ok(())));
    let text = c.until("chat.text").await;
    assert_eq!(text["data"]["role"], "user");
    let text = c.until("chat.text").await;
    assert_eq!(text["data"]["content"], "hello");
}

#[actix::test]
async fn model_failure_is_a_recoverable_error() {
    let h = harness(EngineConfig::default(), default_script);
    let mut c = connect(&h, "t1").await;
    c.until("chat.input_request").await;
    assert!(c.chat.addr.send(say("fail")).await.is_ok());
    let error = c.until("chat.error").await;
    assert_eq!(error["data"]["code"], "llm_error");
    assert_eq!(error["data"]["recoverable"], true);
    c.until("chat.input_request").await;
}

#[actix::test]
async fn resume_replays_exactly_the_events_after_last_seq_in_order() {
    let h = harness(EngineConfig::default(), default_script);
    let mut first = connect(&h, "t1").await;
    first.until("chat.input_request").await;
    assert!(first.chat.addr.send(say("use tool")).await.is_ok());
    first.until("chat.input_request").await;
    let logged: Vec<&Value> = first
        .seen
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap_or(0) > 0)
        .collect();
    let seqs: Vec<u64> = logged.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "seqs are 1, 2, 3… with no gap"
    );

    let mut second = subscribe(first.chat.clone(), 3).await;
    let boundary = second.until("chat.resume_boundary").await;
    let replayed: Vec<u64> = second
        .seen
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|s| *s > 0)
        .collect();
    assert_eq!(replayed, (4..=seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(boundary["data"]["replayed"], replayed.len());
    assert_eq!(second.seen[0]["type"], "chat.session");
}

/// Publishes into a channel, standing in for a chat session.
struct PublishSink(mpsc::UnboundedSender<ServerEvent>);
impl Actor for PublishSink {
    type Context = Context<Self>;
}
impl Handler<Publish> for PublishSink {
    type Result = ();
    fn handle(&mut self, Publish(event): Publish, _: &mut Self::Context) {
        let _ = self.0.send(event);
    }
}

#[actix::test]
async fn the_same_structured_output_delivered_twice_concurrently_runs_the_tool_once() {
    let workflow = match tessera_manifest::load_workflow(&fixture_dir()) {
        Ok(w) => w,
        Err(e) => panic!("{e}"),
    };
    let model: Arc<dyn ChatModel> = Arc::new(FakeModel {
        script: Box::new(default_script),
        calls: Default::default(),
    });
    let services = ToolServices {
        tasks: Arc::new(InMemoryTaskStore::default()),
        artifacts: Arc::new(InMemoryArtifactStore::default()),
    };
    let http = reqwest::Client::new();
    let compiled = match CompiledWorkflow::compile(
        workflow,
        model,
        &BuiltinRegistry::with_defaults(services),
        Some(&http),
        Duration::from_secs(5),
    ) {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("{e}"),
    };
    let dedup = DedupCache::new(64, None).start();
    let correlator = UiCorrelator::new(DisconnectPolicy::KeepPending).start();
    let handler = AutoToolHandler::new(dedup, correlator.clone(), None).start();
    let (tx, mut events) = mpsc::unbounded_channel();
    let sink = PublishSink(tx).start();
    let ctx = ToolContext {
        chat_id: "chat_dup".into(),
        app_id: "t".into(),
        user_id: "u".into(),
        workflow_name: "EngineTest".into(),
        turn_idempotency_key: "turn_chat_dup_PlannerAgent_1".into(),
        agent_name: "PlannerAgent".into(),
        secrets: None,
    };
    let data = json!({"Plan": "p", "agent_message": "m"});
    let invoke = || InvokeAutoTool {
        workflow: compiled.clone(),
        tool_ctx: ctx.clone(),
        structured_data: data.clone(),
        publish: sink.clone().recipient(),
        span: tracing::Span::none(),
    };
    let (first, second) = (handler.send(invoke()), handler.send(invoke()));

    // Exactly one UI call is registered; answer it so the owner completes.
    let corr = loop {
        match tokio::time::timeout(Duration::from_secs(10), events.recv()).await {
            Ok(Some(ServerEvent::ToolCall(ToolCallEvent::AwaitingUi(call)))) => {
                break call.corr;
            }
            Ok(Some(_)) => {}
            other => panic!("expected a UI tool call, got {other:?}"),
        }
    };
    let pending = correlator
        .send(ListPendingUiCalls {
            chat_id: "chat_dup".into(),
        })
        .await
        .unwrap_or_default();
    assert_eq!(pending.len(), 1);
    let resolved = correlator
        .send(ResolveUiCall {
            chat_id: "chat_dup".into(),
            corr,
            response: json!({"status": "success", "data": {}}),
        })
        .await;
    assert_eq!(resolved.ok(), Some(Ok(())));
    let outcomes = [first.await, second.await];
    let ran = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(AutoToolOutcome::Completed { .. })))
        .count();
    let skipped = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(AutoToolOutcome::Duplicate(ClaimOutcome::InFlight))))
        .count();
    assert_eq!((ran, skipped), (1, 1), "{outcomes:?}");
    let mut calls = 0;
    while let Ok(event) = events.try_recv() {
        if matches!(event, ServerEvent::ToolCall(_)) {
            calls += 1;
        }
    }
    assert_eq!(calls, 0, "the duplicate announced nothing");
}

/// Records each delivered batch as the `type` of each of its events.
struct Batches(mpsc::UnboundedSender<Vec<String>>);

impl Actor for Batches {
    type Context = Context<Self>;
}

impl Handler<tessera_engine::session::Deliver> for Batches {
    type Result = ();

    fn handle(
        &mut self,
        tessera_engine::session::Deliver(batch): tessera_engine::session::Deliver,
        _: &mut Self::Context,
    ) {
        let types = batch
            .iter()
            .map(|text| {
                serde_json::from_str::<Value>(text)
                    .ok()
                    .and_then(|event| event["type"].as_str().map(str::to_owned))
                    .unwrap_or_default()
            })
            .collect();
        let _ = self.0.send(types);
    }
}

async fn subscribe_batches(
    chat: &tessera_engine::ChatHandle,
    after_seq: u64,
) -> mpsc::UnboundedReceiver<Vec<String>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let sent = chat
        .addr
        .send(tessera_engine::session::Subscribe {
            recipient: Batches(tx).start().recipient(),
            after_seq,
        })
        .await;
    assert!(sent.is_ok(), "subscribe must reach the session");
    rx
}

/// The next batch holding an event of `kind` (the timeout only stops a broken test).
async fn batch_with(rx: &mut mpsc::UnboundedReceiver<Vec<String>>, kind: &str) -> Vec<String> {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(batch)) if batch.iter().any(|t| t == kind) => return batch,
            Ok(Some(_)) => {}
            Ok(None) => panic!("delivery closed while waiting for {kind}"),
            Err(_) => panic!("no batch with {kind}"),
        }
    }
}

#[actix::test]
async fn what_one_handler_publishes_reaches_a_subscriber_as_one_batch_in_order() {
    let h = harness(EngineConfig::default(), default_script);
    let chat = start(&h, "t1").await;
    let mut batches = subscribe_batches(&chat, 0).await;
    batch_with(&mut batches, "chat.input_request").await;
    assert_eq!(chat.addr.send(say("hi")).await.ok(), Some(Ok(())));
    // The turn's end publishes the answer and the next input request from one handler: they
    // travel together, the answer first.
    let end = batch_with(&mut batches, "chat.input_request").await;
    let text_at = end.iter().position(|t| t == "chat.text");
    let request_at = end.iter().position(|t| t == "chat.input_request");
    assert!(
        matches!((text_at, request_at), (Some(t), Some(r)) if t < r),
        "answer and input request in one batch, in order: {end:?}"
    );
}

#[actix::test]
async fn a_late_subscriber_gets_its_replay_as_one_batch_between_session_and_boundary() {
    let h = harness(EngineConfig::default(), default_script);
    let mut first = connect(&h, "t1").await;
    first.until("chat.input_request").await;
    assert_eq!(
        first.chat.addr.send(say("use tool")).await.ok(),
        Some(Ok(()))
    );
    first.until("chat.input_request").await;
    let logged = first
        .seen
        .iter()
        .filter(|e| e["seq"].as_u64() > Some(0))
        .count();
    let mut batches = subscribe_batches(&first.chat, 0).await;
    let mut received = Vec::new();
    for _ in 0..3 {
        match tokio::time::timeout(Duration::from_secs(10), batches.recv()).await {
            Ok(Some(batch)) => received.push(batch),
            _ => panic!("expected session, replay and boundary; got {received:?}"),
        }
    }
    assert_eq!(received[0], ["chat.session"]);
    assert_eq!(received[1].len(), logged, "the whole log in one batch");
    assert!(
        received[1]
            .iter()
            .all(|t| t != "chat.session" && t != "chat.resume_boundary")
    );
    assert_eq!(received[2], ["chat.resume_boundary"]);
}

#[actix::test]
async fn a_quiet_subscriber_gets_the_events_after_its_seq_without_session_or_boundary() {
    let h = harness(EngineConfig::default(), default_script);
    let mut first = connect(&h, "t1").await;
    first.until("chat.input_request").await;
    assert_eq!(first.chat.addr.send(say("hi")).await.ok(), Some(Ok(())));
    first.until("chat.input_request").await;
    let logged: Vec<u64> = first
        .seen
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|seq| *seq > 0)
        .collect();
    let after = logged[0];

    // A socket another node fed through `after` (it has the greeting) moves to this session.
    let (tx, mut batches) = mpsc::unbounded_channel();
    let sent = first
        .chat
        .addr
        .send(tessera_engine::session::SubscribeQuietly {
            recipient: Batches(tx).start().recipient(),
            after_seq: after,
        })
        .await;
    assert!(sent.is_ok(), "subscribe must reach the session");
    assert_eq!(first.chat.addr.send(say("again")).await.ok(), Some(Ok(())));
    let mut received = Vec::new();
    while received
        .iter()
        .filter(|t| *t == "chat.input_request")
        .count()
        < 2
    {
        match tokio::time::timeout(Duration::from_secs(10), batches.recv()).await {
            Ok(Some(batch)) => received.extend(batch),
            _ => panic!("expected the replay and the next turn; got {received:?}"),
        }
    }
    assert!(
        received
            .iter()
            .all(|t| t != "chat.session" && t != "chat.resume_boundary"),
        "{received:?}"
    );
    // The replay: every logged event after `after`, then the new turn's.
    let replayed = logged.len() - 1;
    let seen_types: Vec<&str> = first
        .seen
        .iter()
        .filter(|e| e["seq"].as_u64().is_some_and(|seq| seq > after))
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert_eq!(received[..replayed], seen_types[..], "{received:?}");
}
