//! The web client served by `tessera serve`, in a real headless Chromium (see
//! `integration_tests::browser`). Skipped with a message when Chromium or chromedriver is
//! missing, except under `CI=true`. Screenshots land in `integration-tests/artifacts/`.

use integration_tests::browser::{self, Browser, Viewport, keys};
use integration_tests::server::{ServerOptions, TestServer};
use serde_json::{Value, json};

const KEY: &str = "sk-BROWSER-CANARY-1234567890";
const REQUEST: &str = "Automate my weekly social media posts";

/// Records every frame the page sends on its WebSocket in `window.__sent` (test-only spy on
/// the prototype, so it covers the socket that is already open).
const SPY: &str = r#"
if (!window.__sent) {
  window.__sent = [];
  const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    try { window.__sent.push(JSON.parse(data)); } catch (e) { window.__sent.push(String(data)); }
    return send.call(this, data);
  };
}
return true;"#;

/// The frames sent so far of type `kind`.
async fn sent(b: &Browser, kind: &str) -> Vec<Value> {
    let all = b.eval("return window.__sent || [];", vec![]).await;
    all.as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["type"] == kind)
        .cloned()
        .collect()
}

/// Text of the conversation as the user sees it.
async fn log_text(b: &Browser) -> String {
    b.eval("return document.getElementById('log').innerText;", vec![])
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Every message row, checking none is shown twice (by message id and by text).
async fn assert_no_duplicates(b: &Browser) {
    let rows = b
        .eval(
            "return [...document.querySelectorAll('#log .msg')].map(m => [m.dataset.messageId, m.querySelector('.msg-bubble').textContent]);",
            vec![],
        )
        .await;
    let rows = rows.as_array().cloned().unwrap_or_default();
    let mut ids: Vec<String> = rows.iter().map(|r| r[0].to_string()).collect();
    let mut texts: Vec<String> = rows.iter().map(|r| r[1].to_string()).collect();
    let count = rows.len();
    ids.sort();
    ids.dedup();
    texts.sort();
    texts.dedup();
    assert_eq!(ids.len(), count, "a message id is shown twice: {rows:?}");
    assert_eq!(
        texts.len(),
        count,
        "a message text is shown twice: {rows:?}"
    );
    let cards = b
        .eval(
            "return [...document.querySelectorAll('#log .tool-card')].map(c => c.dataset.corr);",
            vec![],
        )
        .await;
    let mut corrs: Vec<String> = cards
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c.to_string())
        .collect();
    let n = corrs.len();
    corrs.sort();
    corrs.dedup();
    assert_eq!(corrs.len(), n, "a UI tool card is shown twice: {cards}");
}

/// Opens the client, starts a Generator chat and answers the interview, up to the
/// ActionPlan artifact overlay.
async fn generator_to_action_plan(b: &Browser) {
    b.open("/").await;
    let card = b
        .wait_for(
            "the Generator workflow in the picker",
            r#"#workflow-list button[data-workflow="Generator"]"#,
        )
        .await;
    let label = card.text().await.unwrap_or_default();
    assert!(
        label.contains("Demo model"),
        "the demo label is shown: {label}"
    );
    card.click().await.unwrap_or_else(|e| panic!("click: {e}"));
    b.wait_until(
        "the connection state says connected",
        "return document.getElementById('connection').dataset.state === 'connected';",
    )
    .await;
    b.wait_until(
        "the InterviewAgent greeting",
        "return [...document.querySelectorAll('#log .msg-agent .msg-bubble')].some(m => m.textContent.includes('What would you like to automate?'));",
    )
    .await;
    b.wait_until(
        "the composer accepts input",
        "return !document.getElementById('composer-input').disabled;",
    )
    .await;
    b.eval(SPY, vec![]).await;
    b.type_into("the composer", "#composer-input", REQUEST)
        .await;
    b.press(keys::ENTER).await;
    b.wait_until(
        "the user's message in the conversation",
        &format!(
            "return [...document.querySelectorAll('#log .msg-user .msg-bubble')].some(m => m.textContent === {});",
            json!(REQUEST)
        ),
    )
    .await;
    wait_for_action_plan(b).await;
}

async fn wait_for_action_plan(b: &Browser) {
    b.wait_until(
        "the ActionPlan artifact overlay",
        "const d = document.getElementById('artifact'); return d.open && !!d.querySelector('[data-action=approve]');",
    )
    .await;
}

async fn approve_plan(b: &Browser) {
    b.click("the Approve button", "#artifact [data-action=approve]")
        .await;
    b.wait_until(
        "the API key input",
        r#"return !!document.querySelector('.tool-card[data-component="AgentAPIKeyInput"][data-state="active"] input[name=apiKey]');"#,
    )
    .await;
}

/// The element `css` lies within the screen's width.
async fn assert_inside_width(b: &Browser, css: &str) {
    let rect = b
        .eval(
            "const r = document.querySelector(arguments[0]).getBoundingClientRect(); return [r.left, r.right, window.innerWidth];",
            vec![json!(css)],
        )
        .await;
    let (left, right, width) = (
        rect[0].as_f64().unwrap_or(-1.0),
        rect[1].as_f64().unwrap_or(f64::MAX),
        rect[2].as_f64().unwrap_or(0.0),
    );
    assert!(
        left >= 0.0 && right <= width,
        "{css} sticks out of the screen: {rect}"
    );
}

/// No horizontal scrolling: the page fits the viewport.
async fn assert_fits_width(b: &Browser, when: &str) {
    let fits = b
        .eval(
            "return [document.documentElement.scrollWidth, window.innerWidth];",
            vec![],
        )
        .await;
    let scroll = fits[0].as_f64().unwrap_or(f64::MAX);
    let width = fits[1].as_f64().unwrap_or(0.0);
    assert!(
        scroll <= width,
        "{when}: the page is wider ({scroll}px) than the screen ({width}px)"
    );
}

#[tokio::test]
async fn generator_runs_to_the_download() {
    let Some(bins) = browser::available() else {
        return;
    };
    let server = TestServer::start(ServerOptions::default()).await;
    let b = Browser::launch(&bins, &server.base, Viewport::Desktop, "generator").await;
    b.open("/").await;
    b.wait_for("the workflow list", "#workflow-list button")
        .await;
    b.screenshot("desktop-1-picker").await;
    generator_to_action_plan(&b).await;

    // The artifact holds the conversation: focus is inside it and Tab cannot leave it.
    let inside = "return document.getElementById('artifact').contains(document.activeElement);";
    b.wait_until("focus moves into the overlay", inside).await;
    for _ in 0..6 {
        b.press(keys::TAB).await;
        assert_eq!(b.eval(inside, vec![]).await, true, "Tab left the overlay");
    }
    assert_eq!(
        b.eval("return document.getElementById('app').inert;", vec![])
            .await,
        true,
        "the conversation is inert under the overlay"
    );
    let plan = b
        .eval(
            "return document.getElementById('artifact').innerText;",
            vec![],
        )
        .await;
    let plan = plan.as_str().unwrap_or_default();
    for text in [
        "Weekly Content Pipeline",
        "Phase 1: Research",
        "ResearchAgent",
        "SchedulerAgent",
    ] {
        assert!(plan.contains(text), "the plan shows {text}: {plan}");
    }
    b.screenshot("desktop-2-action-plan").await;
    let corr = b
        .eval(
            "return document.querySelector('.tool-card[data-component=ActionPlan]').dataset.corr;",
            vec![],
        )
        .await;
    approve_plan(&b).await;

    // The approve answer follows the response contract.
    let answers = sent(&b, "chat.tool_response").await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let answer = &answers[0]["data"];
    assert_eq!(answer["corr"], corr);
    assert_eq!(answer["status"], "success");
    assert_eq!(answer["action"], "approve");
    assert_eq!(answer["data"]["ui_tool_id"], corr);
    assert_eq!(answer["data"]["eventId"], corr);
    assert_eq!(answer["data"]["workflowName"], "Generator");
    assert!(
        answer["data"]["agent_message_id"]
            .as_str()
            .is_some_and(|s| s.starts_with("msg_")),
        "{answer}"
    );

    // The key: required, masked, with a working show/hide toggle.
    let input = r#".tool-card[data-component="AgentAPIKeyInput"] input[name=apiKey]"#;
    b.click(
        "the Save key button",
        r#".tool-card[data-component="AgentAPIKeyInput"] [data-action=submit]"#,
    )
    .await;
    b.wait_until(
        "the required-field error",
        "const e = document.querySelector('.tool-card[data-component=AgentAPIKeyInput] .field-error'); return e && !e.hidden && e.textContent.includes('required');",
    )
    .await;
    assert_eq!(
        sent(&b, "chat.tool_response").await.len(),
        1,
        "an empty key is not sent"
    );
    b.type_into("the API key field", input, KEY).await;
    let kind = format!("return document.querySelector('{input}').type;");
    assert_eq!(b.eval(&kind, vec![]).await, "password", "masked at first");
    let toggle = r#".tool-card[data-component="AgentAPIKeyInput"] [data-action=toggle-visibility]"#;
    b.click("the show toggle", toggle).await;
    assert_eq!(
        b.eval(&kind, vec![]).await,
        "text",
        "shown after the toggle"
    );
    b.screenshot("desktop-3-api-key-shown").await;
    b.click("the hide toggle", toggle).await;
    assert_eq!(b.eval(&kind, vec![]).await, "password", "masked again");
    b.click(
        "the Save key button",
        r#".tool-card[data-component="AgentAPIKeyInput"] [data-action=submit]"#,
    )
    .await;

    // The download: the link works (from the page and over plain HTTP).
    let link = b
        .wait_for(
            "the download link",
            r#".tool-card[data-component="FileDownloadCenter"][data-state="active"] a.fdc-link"#,
        )
        .await;
    let href = link.attr("href").await.ok().flatten().unwrap_or_default();
    assert!(href.starts_with("/api/v1/chats/"), "{href}");
    let fetched = b
        .eval_async(
            "const done = arguments[arguments.length - 1];
             fetch(arguments[0]).then(async r => { const b = new Uint8Array(await r.arrayBuffer()); done([r.status, b[0], b[1], r.headers.get('content-type')]); }, e => done(String(e)));",
            vec![json!(href)],
        )
        .await;
    assert_eq!(fetched[0], 200, "{fetched}");
    assert_eq!(
        (fetched[1].as_u64(), fetched[2].as_u64()),
        (Some(u64::from(b'P')), Some(u64::from(b'K'))),
        "a zip"
    );
    let (status, bytes) = server.get_bytes(&href, "dev-user").await;
    assert_eq!(status, 200);
    assert!(bytes.starts_with(b"PK"));
    b.screenshot("desktop-4-download").await;
    b.click(
        "the Done button",
        r#".tool-card[data-component="FileDownloadCenter"] [data-action=done]"#,
    )
    .await;
    b.wait_until(
        "the run-complete state",
        "const f = document.getElementById('finished'); return !f.hidden && f.innerText.includes('complete');",
    )
    .await;
    assert_eq!(
        b.eval(
            "return document.getElementById('composer-input').disabled;",
            vec![]
        )
        .await,
        true
    );

    // What the user saw: no hidden NEXT, no secret anywhere in the page or its storage.
    let text = log_text(&b).await;
    assert!(!text.contains("NEXT"), "the hidden message is not shown");
    assert!(
        text.contains("Context Agent"),
        "agent names are shown: {text}"
    );
    let leaked = b
        .eval(
            "return document.documentElement.outerHTML.includes(arguments[0]) || JSON.stringify(sessionStorage).includes(arguments[0]);",
            vec![json!(KEY)],
        )
        .await;
    assert_eq!(leaked, false, "the API key is still in the page");
    let key_answer = sent(&b, "chat.tool_response").await;
    assert_eq!(key_answer[1]["data"]["data"]["apiKey"], KEY);
    assert_eq!(key_answer[2]["data"]["status"], "success");
    assert_no_duplicates(&b).await;
    b.screenshot("desktop-5-complete").await;
    b.close().await;
}

#[tokio::test]
async fn escape_cancels_the_artifact_and_the_chat_asks_again() {
    let Some(bins) = browser::available() else {
        return;
    };
    let server = TestServer::start(ServerOptions::default()).await;
    let b = Browser::launch(&bins, &server.base, Viewport::Desktop, "cancel").await;
    generator_to_action_plan(&b).await;
    b.wait_until(
        "focus moves into the overlay",
        "return document.getElementById('artifact').contains(document.activeElement);",
    )
    .await;
    b.press(keys::ESCAPE).await;
    b.wait_until(
        "the overlay closes",
        "return !document.getElementById('artifact').open && !document.getElementById('app').inert;",
    )
    .await;
    let answers = sent(&b, "chat.tool_response").await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let answer = &answers[0]["data"];
    assert_eq!(answer["status"], "error");
    assert_eq!(answer["action"], "cancel");
    assert_eq!(answer["code"], "user_cancelled");
    assert!(answer["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert_eq!(answer["data"]["ui_tool_id"], answer["corr"]);

    b.wait_until(
        "the conversation shows the cancellation",
        "return [...document.querySelectorAll('#log .note-cancelled')].some(n => n.textContent.includes('cancelled'));",
    )
    .await;
    b.wait_until(
        "the ActionPlan card says cancelled",
        "return document.querySelector('.tool-card[data-component=ActionPlan] .tool-card-status').textContent === 'Cancelled';",
    )
    .await;
    b.wait_until(
        "the chat asks for input again",
        "const i = document.getElementById('composer-input'); return !i.disabled && i.placeholder.includes('Context Agent') && document.activeElement === i;",
    )
    .await;
    b.screenshot("desktop-6-cancelled").await;
    assert_no_duplicates(&b).await;
    b.close().await;
}

#[tokio::test]
async fn reload_and_drop_while_a_ui_tool_waits() {
    let Some(bins) = browser::available() else {
        return;
    };
    let server = TestServer::start(ServerOptions::default()).await;
    let b = Browser::launch(&bins, &server.base, Viewport::Desktop, "reload").await;
    generator_to_action_plan(&b).await;
    let before = b.eval("return window.tessera.state;", vec![]).await;
    assert!(before["lastSeq"].as_u64().unwrap_or(0) > 20, "{before}");

    b.reload().await;
    wait_for_action_plan(&b).await;
    let after = b.eval("return window.tessera.state;", vec![]).await;
    assert_eq!(after["chatId"], before["chatId"], "the same chat resumed");
    assert_eq!(
        after["lastSeq"], before["lastSeq"],
        "nothing new, nothing lost"
    );
    let text = log_text(&b).await;
    assert_eq!(text.matches("What would you like to automate?").count(), 1);
    assert_eq!(text.matches(REQUEST).count(), 1);
    assert_no_duplicates(&b).await;
    b.screenshot("desktop-7-after-reload").await;

    // Answer after the reload: the run continues.
    b.eval(SPY, vec![]).await;
    approve_plan(&b).await;
    assert_eq!(sent(&b, "chat.tool_response").await.len(), 1);

    // A dropped socket reconnects by itself and the pending input stays usable, once.
    let connections = before["connections"].as_u64().unwrap_or(0);
    let after_reload = b
        .eval("return window.tessera.state.connections;", vec![])
        .await;
    b.eval("window.tessera.drop(); return true;", vec![]).await;
    b.wait_until(
        "the client reconnects after a drop",
        &format!(
            "const s = window.tessera.state; return s.connected && s.connections > {} && document.getElementById('connection').dataset.state === 'connected';",
            after_reload.as_u64().unwrap_or(connections)
        ),
    )
    .await;
    assert_eq!(
        b.eval(
            "return document.querySelectorAll('.tool-card[data-component=AgentAPIKeyInput][data-state=active]').length;",
            vec![]
        )
        .await,
        1
    );
    b.type_into(
        "the API key field",
        r#".tool-card[data-component="AgentAPIKeyInput"] input[name=apiKey]"#,
        KEY,
    )
    .await;
    b.press(keys::ENTER).await;
    b.wait_for(
        "the download link",
        r#".tool-card[data-component="FileDownloadCenter"][data-state="active"] a.fdc-link"#,
    )
    .await;
    assert_no_duplicates(&b).await;
    let text = log_text(&b).await;
    assert_eq!(text.matches("What would you like to automate?").count(), 1);
    b.close().await;
}

#[tokio::test]
async fn narrow_phone_screen() {
    let Some(bins) = browser::available() else {
        return;
    };
    let server = TestServer::start(ServerOptions::default()).await;
    let b = Browser::launch(&bins, &server.base, Viewport::Phone, "phone").await;
    b.open("/").await;
    b.wait_for("the workflow list", "#workflow-list button")
        .await;
    let width = b.eval("return window.innerWidth;", vec![]).await;
    assert_eq!(width, 375, "the phone viewport is in effect");
    assert_fits_width(&b, "picker").await;
    b.screenshot("phone-1-picker").await;
    generator_to_action_plan(&b).await;
    let overlay = b
        .eval(
            "const r = document.getElementById('artifact').getBoundingClientRect(); return [r.width, r.height, window.innerHeight];",
            vec![],
        )
        .await;
    assert_eq!(
        overlay[0], 375,
        "the overlay takes the full width: {overlay}"
    );
    assert_eq!(overlay[1], overlay[2], "and the full height: {overlay}");
    b.screenshot("phone-2-action-plan").await;
    approve_plan(&b).await;
    assert_fits_width(&b, "API key input").await;
    for css in [
        ".tool-card[data-component=AgentAPIKeyInput] [data-action=toggle-visibility]",
        ".tool-card[data-component=AgentAPIKeyInput] [data-action=submit]",
        "#composer-send",
    ] {
        assert_inside_width(&b, css).await;
    }
    b.screenshot("phone-3-api-key").await;
    b.type_into(
        "the API key field",
        r#".tool-card[data-component="AgentAPIKeyInput"] input[name=apiKey]"#,
        KEY,
    )
    .await;
    b.press(keys::ENTER).await;
    b.wait_for(
        "the download link",
        r#".tool-card[data-component="FileDownloadCenter"][data-state="active"] a.fdc-link"#,
    )
    .await;
    assert_fits_width(&b, "downloads").await;
    for css in [
        ".tool-card[data-component=FileDownloadCenter] a.fdc-link",
        ".tool-card[data-component=FileDownloadCenter] [data-action=done]",
    ] {
        assert_inside_width(&b, css).await;
    }
    b.screenshot("phone-4-download").await;
    b.close().await;
}

#[tokio::test]
async fn workflows_without_components_get_the_generic_renderer() {
    let Some(bins) = browser::available() else {
        return;
    };
    // The shipped workflows minus Generator's ui/ folder.
    let workflows = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_dir(
        &integration_tests::workspace_root().join("workflows"),
        workflows.path(),
    );
    std::fs::remove_dir_all(workflows.path().join("Generator/ui"))
        .unwrap_or_else(|e| panic!("{e}"));
    let server = TestServer::start(ServerOptions {
        workflows_dir: Some(workflows.path().to_path_buf()),
        ..Default::default()
    })
    .await;
    let b = Browser::launch(&bins, &server.base, Viewport::Desktop, "generic").await;
    generator_to_action_plan(&b).await;
    let shown = b
        .eval(
            "const d = document.getElementById('artifact'); return [!!d.querySelector('.tool-generic'), d.innerText];",
            vec![],
        )
        .await;
    assert_eq!(shown[0], true, "the generic renderer is used");
    let text = shown[1].as_str().unwrap_or_default();
    for part in [
        "Blueprint ready",
        "Weekly Content Pipeline",
        "Phase 2: Drafting",
        "EditorAgent, SchedulerAgent",
    ] {
        assert!(
            text.contains(part),
            "the payload is readable ({part}): {text}"
        );
    }
    assert!(
        !text.contains("agent_message_id"),
        "internal fields are hidden"
    );
    b.screenshot("desktop-8-generic-renderer").await;
    b.click(
        "the generic Reject button",
        "#artifact [data-action=reject]",
    )
    .await;
    let answers = sent(&b, "chat.tool_response").await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["data"]["status"], "error");
    assert_eq!(answers[0]["data"]["action"], "reject");
    assert_eq!(answers[0]["data"]["data"]["workflowName"], "Generator");
    b.wait_until(
        "the conversation shows the rejection and asks for feedback",
        "return [...document.querySelectorAll('#log .note-cancelled')].some(n => n.textContent.includes('rejected')) && !document.getElementById('composer-input').disabled;",
    )
    .await;
    b.close().await;
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).into_iter().flatten().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            std::fs::create_dir_all(&target).unwrap_or_else(|e| panic!("{e}"));
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[tokio::test]
async fn backend_tools_stay_quiet_and_streamed_text_is_shown_once() {
    let Some(bins) = browser::available() else {
        return;
    };
    let server = TestServer::start(ServerOptions::default()).await;
    let b = Browser::launch(&bins, &server.base, Viewport::Desktop, "todo").await;
    b.open("/").await;
    b.click(
        "the TodoAssistant workflow",
        r#"#workflow-list button[data-workflow="TodoAssistant"]"#,
    )
    .await;
    b.wait_until(
        "the composer accepts input",
        "return !document.getElementById('composer-input').disabled;",
    )
    .await;
    for task in ["Buy milk", "Walk the dog"] {
        b.type_into("the composer", "#composer-input", task).await;
        b.press(keys::ENTER).await;
        b.wait_until(
            "the agent confirms the task",
            &format!(
                "return [...document.querySelectorAll('#log .msg-agent .msg-bubble')].some(m => m.textContent === {}) && !document.getElementById('composer-input').disabled;",
                json!(format!("Added \"{task}\" to your list."))
            ),
        )
        .await;
    }
    let notes = b
        .eval(
            "return [...document.querySelectorAll('#log .note')].map(n => n.textContent);",
            vec![],
        )
        .await;
    assert_eq!(
        notes,
        json!([]),
        "successful backend tool runs leave no note"
    );
    assert_no_duplicates(&b).await;
    b.reload().await;
    b.wait_until(
        "the conversation is back after a reload",
        "return document.querySelectorAll('#log .msg').length === 4 && window.tessera.state.connected;",
    )
    .await;
    assert_no_duplicates(&b).await;
    b.screenshot("desktop-9-todo").await;
    b.close().await;
}
