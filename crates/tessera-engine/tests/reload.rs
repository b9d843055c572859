//! Workflow versions: an installed version serves new chats while running chats keep the one
//! they started with.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use common::*;
use tessera_engine::EngineConfig;
use tessera_engine::session::UserInput;
use tessera_llm::ChatModel;

fn model(reply: &'static str) -> Arc<dyn ChatModel> {
    Arc::new(FakeModel {
        script: Box::new(move |_| Reply::Text(reply.into())),
        calls: AtomicUsize::new(0),
    })
}

async fn chat(h: &Harness) -> Client {
    connect(h, "t1").await
}

async fn reply_to(client: &mut Client, text: &str) -> String {
    client.until("chat.input_request").await;
    let sent = client
        .chat
        .addr
        .send(UserInput {
            content: text.into(),
            client_msg_id: None,
        })
        .await;
    assert!(matches!(sent, Ok(Ok(()))));
    let answer = client.until_match_agent("HelperAgent").await;
    answer["data"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[actix::test]
async fn an_installed_version_serves_new_chats_and_running_chats_keep_theirs() {
    let h = harness(EngineConfig::default(), |_| Reply::Text("v1".into()));
    let v1 = tessera_manifest::load_workflow(&fixture_dir()).unwrap_or_else(|e| panic!("{e}"));
    let mut v2 = v1.clone();
    v2.version = "v2-test".into();

    let mut before = chat(&h).await;
    assert_eq!(reply_to(&mut before, "hi").await, "v1");

    h.engine
        .install(vec![(v2, model("v2"))], true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        h.engine
            .current_versions()
            .await
            .get("EngineTest")
            .map(String::as_str),
        Some("v2-test")
    );
    let mut after = chat(&h).await;
    assert_eq!(reply_to(&mut after, "hi").await, "v2", "a new chat gets v2");
    assert_eq!(
        reply_to(&mut before, "again").await,
        "v1",
        "the running chat keeps v1"
    );

    // Installing a version as not current (a stored chat's old version) changes nothing
    // for new chats.
    let mut v3 = v1.clone();
    v3.version = "v3-test".into();
    h.engine
        .install(vec![(v3, model("v3"))], false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut later = chat(&h).await;
    assert_eq!(reply_to(&mut later, "hi").await, "v2");
}
