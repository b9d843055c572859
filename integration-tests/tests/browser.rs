//! The web client served by `tessera serve`, in a real headless Chromium (see
//! `integration_tests::browser`). Reported as ignored, with the reason, when Chromium or
//! chromedriver is missing, except under `CI=true`, where they fail. Screenshots land in
//! `integration-tests/artifacts/`.

use integration_tests::browser::{self, Browser, Viewport, keys};
use integration_tests::copy_dir;
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
        label.contains("scripted answers"),
        "the demo label says the answers are scripted: {label}"
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
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
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
    b.assert_accessible("the workflow picker").await;
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
    b.assert_accessible("the ActionPlan overlay").await;
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

    // The approved plan: a green "Approved" card that reopens read-only.
    let card = ".tool-card[data-component=ActionPlan]";
    assert_eq!(
        b.eval(
            &format!("const c = document.querySelector('{card}'); return [c.dataset.outcome, c.querySelector('.tool-card-status').textContent];"),
            vec![]
        )
        .await,
        json!(["approved", "Approved"])
    );
    b.click(
        "the View button of the approved plan",
        &format!("{card} [data-action=reopen]"),
    )
    .await;
    b.wait_until(
        "the plan reopens read-only",
        "const d = document.getElementById('artifact'); return d.open && d.textContent.includes('Phase 1: Research') && d.textContent.includes('read-only');",
    )
    .await;
    assert_eq!(
        b.eval("return [...document.querySelectorAll('#artifact [data-action=approve], #artifact [data-action=reject]')].filter(x => x.offsetParent !== null).length;", vec![]).await,
        0,
        "no way to answer again"
    );
    b.screenshot("desktop-2b-plan-reopened").await;
    b.press(keys::ESCAPE).await;
    b.wait_until(
        "the read-only overlay closes",
        "return !document.getElementById('artifact').open && !document.getElementById('app').inert;",
    )
    .await;
    assert_eq!(
        sent(&b, "chat.tool_response").await.len(),
        1,
        "reopening sends nothing"
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
    b.wait_until(
        "the sidebar says the chat is done",
        "const a = document.querySelector('#history-list .history-item[aria-current=page]'); return a && a.dataset.status === 'completed' && a.querySelector('.history-status').textContent === 'Done';",
    )
    .await;
    b.screenshot("desktop-5-complete").await;
    b.close().await;
}

#[tokio::test]
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
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
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
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
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
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
    // The chat history is a drawer behind the ☰ button.
    b.click("the history toggle", "#toggle-history").await;
    b.wait_until(
        "the drawer opens",
        "const r = document.getElementById('history').getBoundingClientRect(); return r.left >= 0 && r.right <= window.innerWidth && document.getElementById('toggle-history').getAttribute('aria-expanded') === 'true';",
    )
    .await;
    b.screenshot("phone-1b-history-drawer").await;
    b.press(keys::ESCAPE).await;
    b.wait_until(
        "the drawer closes",
        "return getComputedStyle(document.getElementById('history')).visibility === 'hidden';",
    )
    .await;
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
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
async fn workflows_without_components_get_the_generic_renderer() {
    let Some(bins) = browser::available() else {
        return;
    };
    // The shipped workflows minus Generator's ui/ folder.
    let workflows = shipped_workflows_copy();
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

/// A temporary copy of the shipped workflows, to change for one test.
fn shipped_workflows_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_dir(
        &integration_tests::workspace_root().join("workflows"),
        dir.path(),
    );
    dir
}

/// Opens the client and starts a chat of `workflow`; waits until the composer accepts input.
async fn start(b: &Browser, workflow: &str) {
    b.open("/").await;
    start_from_picker(b, workflow).await;
}

async fn wait_for_input(b: &Browser) {
    b.wait_until(
        "the composer accepts input",
        "return !document.getElementById('composer-input').disabled && window.tessera.state.connected;",
    )
    .await;
}

/// Sends `text` and waits until the agent has answered and asks for input again; returns the
/// agent's last message as shown.
async fn say(b: &Browser, text: &str) -> String {
    let before = b
        .eval(
            "return document.querySelectorAll('#log .msg-agent').length;",
            vec![],
        )
        .await;
    b.type_into("the composer", "#composer-input", text).await;
    b.press(keys::ENTER).await;
    let answer = b
        .wait_until(
            &format!("the agent's answer to {text:?}"),
            &format!(
                "const m = document.querySelectorAll('#log .msg-agent .msg-bubble');
                 const i = document.getElementById('composer-input');
                 return m.length > {before} && !i.disabled && window.tessera.state.status === 'awaiting_user' && m[m.length - 1].textContent;"
            ),
        )
        .await;
    answer.as_str().unwrap_or_default().to_owned()
}

/// The agent tool rows: [tool name, state, open?, summary text].
async fn tool_rows(b: &Browser) -> Vec<Value> {
    b.eval(
        "return [...document.querySelectorAll('#log .tool-run')].map(r => [r.dataset.tool, r.dataset.state, r.querySelector('details').open, r.querySelector('summary').textContent]);",
        vec![],
    )
    .await
    .as_array()
    .cloned()
    .unwrap_or_default()
}

#[tokio::test]
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
async fn todo_demo_adds_lists_and_completes_and_shows_tool_results() {
    let Some(bins) = browser::available() else {
        return;
    };
    let server = TestServer::start(ServerOptions::default()).await;
    let b = Browser::launch(&bins, &server.base, Viewport::Desktop, "todo").await;
    start(&b, "TodoAssistant").await;
    assert_eq!(
        say(&b, "add Buy milk").await,
        "Added \"Buy milk\" to your list."
    );
    assert_eq!(
        say(&b, "Walk the dog").await,
        "Added \"Walk the dog\" to your list."
    );
    assert_eq!(
        say(&b, "List my tasks").await,
        "You have 2 task(s): Buy milk, Walk the dog."
    );
    let rows = tool_rows(&b).await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows[2][0], "list_tasks");
    assert_eq!(rows[2][1], "done");
    assert_eq!(rows[2][2], false, "collapsed by default");
    assert!(
        rows[2][3].as_str().unwrap_or_default().contains("2 items"),
        "{rows:?}"
    );
    // Expanding shows what the tool returned.
    b.click(
        "the list_tasks row",
        "#log .tool-run[data-tool=list_tasks] summary",
    )
    .await;
    let shown = b
        .wait_until(
            "the task list in the expanded row",
            "const r = document.querySelector('#log .tool-run[data-tool=list_tasks]'); return r.querySelector('details').open && r.innerText;",
        )
        .await;
    let shown = shown.as_str().unwrap_or_default();
    assert!(
        shown.contains("Buy milk") && shown.contains("Walk the dog"),
        "{shown}"
    );

    assert_eq!(say(&b, "complete milk").await, "Task 'Buy milk' completed.");
    let rows = tool_rows(&b).await;
    let names: Vec<&str> = rows.iter().filter_map(|r| r[0].as_str()).collect();
    assert_eq!(
        names,
        [
            "add_task",
            "add_task",
            "list_tasks",
            "list_tasks",
            "complete_task"
        ]
    );
    assert!(rows.iter().all(|r| r[1] == "done"), "{rows:?}");
    let notes = b
        .eval(
            "return document.querySelectorAll('#log .note').length;",
            vec![],
        )
        .await;
    assert_eq!(notes, 0, "successful tools leave no note");
    assert_no_duplicates(&b).await;
    b.assert_accessible("a TodoAssistant chat with tool rows")
        .await;
    b.screenshot("desktop-9-todo").await;

    b.reload().await;
    b.wait_until(
        "the conversation is back after a reload",
        "return document.querySelectorAll('#log .msg').length === 8 && window.tessera.state.connected;",
    )
    .await;
    assert_eq!(tool_rows(&b).await.len(), 5, "tool rows are not duplicated");
    assert_no_duplicates(&b).await;
    b.close().await;
}

#[tokio::test]
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
async fn text_toolkit_counts_words_and_echoes_on_a_phone() {
    let Some(bins) = browser::available() else {
        return;
    };
    let server = TestServer::start(ServerOptions::default()).await;
    let b = Browser::launch(&bins, &server.base, Viewport::Phone, "toolkit").await;
    start(&b, "TextToolkit").await;
    let help = say(&b, "help").await;
    assert!(
        help.contains("count words") && help.contains("scripted demo"),
        "{help}"
    );
    assert_eq!(
        b.eval("return document.querySelectorAll('#log .msg-agent li, #log .msg-agent strong').length > 2;", vec![]).await,
        true,
        "the help text is rendered as Markdown"
    );
    assert_eq!(
        say(&b, "Count the words in the quick brown fox").await,
        "\"the quick brown fox\" has 4 word(s) and 19 character(s)."
    );
    assert_eq!(say(&b, "echo hello there").await, "Echo: hello there");
    let rows = tool_rows(&b).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0][0], "word_count");
    assert!(
        rows[0][3].as_str().unwrap_or_default().contains("4 words"),
        "{rows:?}"
    );
    assert_eq!(rows[1][0], "echo");
    assert_fits_width(&b, "text toolkit").await;
    b.assert_accessible("TextToolkit on a phone").await;
    b.screenshot("phone-5-text-toolkit").await;
    b.close().await;
}

/// Markdown with everything a chat answer uses, plus XSS attempts the sanitizer must stop.
const MARKDOWN: &str = "## Plan\n\n- **bold** item\n- second item\n\n| Name | Count |\n|---|---|\n| milk | 2 |\n\n[the docs](https://example.com/docs) and [a trap](javascript:window.__xss='link')\n\n```\nlet answer = 42;\n```\n\n<img src=x onerror=\"window.__xss='model'\"><script>window.__xss='script'</script><a href=\"#\" onclick=\"window.__xss='click'\">click</a>";

#[tokio::test]
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
async fn markdown_is_rendered_and_nothing_from_the_model_or_a_tool_executes() {
    let Some(bins) = browser::available() else {
        return;
    };
    let workflows = shipped_workflows_copy();
    let demo = json!({"agents": {"TodoAgent": {
        "when": [{"match": "(?i)^add (?P<title>.+)$", "replies": [
            {"tool_calls": [{"name": "add_task", "arguments": {"title": "{{match.title}}"}}]},
            {"content": "Added {{tool_result.task.title}}"}
        ]}],
        "otherwise": [{"content": MARKDOWN}]
    }}});
    std::fs::write(
        workflows.path().join("TodoAssistant/demo.json"),
        demo.to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let server = TestServer::start(ServerOptions {
        workflows_dir: Some(workflows.path().to_path_buf()),
        ..Default::default()
    })
    .await;
    let b = Browser::launch(&bins, &server.base, Viewport::Desktop, "markdown").await;
    start(&b, "TodoAssistant").await;
    say(&b, "show me markdown").await;
    let rendered = b
        .eval(
            "const m = [...document.querySelectorAll('#log .msg-agent .msg-bubble')].pop();
             const docs = m.querySelector('a[href=\"https://example.com/docs\"]');
             return {
               h2: m.querySelector('h2')?.textContent,
               strong: m.querySelector('li strong')?.textContent,
               cell: m.querySelector('table td')?.textContent,
               target: docs?.target, rel: docs?.rel,
               trapHref: [...m.querySelectorAll('a')].find(a => a.textContent === 'a trap')?.getAttribute('href') ?? null,
               code: m.querySelector('.md-code pre')?.textContent,
               copy: !!m.querySelector('.md-code .md-copy'),
             };",
            vec![],
        )
        .await;
    assert_eq!(rendered["h2"], "Plan", "{rendered}");
    assert_eq!(rendered["strong"], "bold");
    assert_eq!(rendered["cell"], "milk");
    assert_eq!(rendered["target"], "_blank");
    assert!(
        rendered["rel"]
            .as_str()
            .unwrap_or_default()
            .contains("noopener")
    );
    assert_eq!(
        rendered["trapHref"],
        Value::Null,
        "javascript: links lose their href"
    );
    assert_eq!(
        rendered["code"].as_str().map(str::trim),
        Some("let answer = 42;")
    );
    assert_eq!(rendered["copy"], true);

    // The copy button copies the code (the clipboard is stubbed to observe it).
    b.eval(
        "Object.defineProperty(navigator, 'clipboard', { configurable: true, value: { writeText: async (t) => { window.__copied = t; } } }); return true;",
        vec![],
    )
    .await;
    b.click("the copy button", "#log .md-copy").await;
    let copied = b
        .wait_until("the code is copied", "return window.__copied;")
        .await;
    assert_eq!(copied.as_str().map(str::trim), Some("let answer = 42;"));
    b.wait_until(
        "the button confirms",
        "return document.querySelector('#log .md-copy').textContent === 'Copied';",
    )
    .await;

    // XSS through a tool result (the task title) and the model's text that repeats it.
    let payload = "<img src=x onerror=\"window.__xss='tool'\"><b onmouseover=\"window.__xss='hover'\">bold</b>";
    say(&b, &format!("add {payload}")).await;
    b.click(
        "the add_task row",
        "#log .tool-run[data-tool=add_task] summary",
    )
    .await;
    b.wait_until(
        "the tool result shows the title as text",
        &format!(
            "const r = document.querySelector('#log .tool-run[data-tool=add_task]'); return r.querySelector('details').open && r.innerText.includes({});",
            json!(payload)
        ),
    )
    .await;
    let dangerous = b
        .eval(
            "const log = document.getElementById('log');
             const handlers = [...log.querySelectorAll('*')].filter(n => [...n.attributes].some(a => a.name.startsWith('on')));
             return { xss: window.__xss ?? null, scripts: log.querySelectorAll('script').length,
                      images: log.querySelectorAll('img').length, handlers: handlers.length,
                      js: [...log.querySelectorAll('a[href]')].filter(a => a.href.startsWith('javascript:')).length };",
            vec![],
        )
        .await;
    assert_eq!(
        dangerous,
        json!({"xss": null, "scripts": 0, "images": 0, "handlers": 0, "js": 0}),
        "nothing executable reached the page"
    );
    b.screenshot("desktop-10-markdown").await;
    b.assert_accessible("Markdown answers").await;
    b.close().await;
}

#[tokio::test]
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
async fn history_lists_the_users_chats_and_reopens_them() {
    let Some(bins) = browser::available() else {
        return;
    };
    let server = TestServer::start(ServerOptions::default()).await;
    let b = Browser::launch(&bins, &server.base, Viewport::Desktop, "history").await;
    start(&b, "TodoAssistant").await;
    say(&b, "add Buy milk").await;
    assert_eq!(
        b.eval("return document.title;", vec![]).await,
        "TodoAssistant · Tessera"
    );
    b.click("the sidebar's New chat button", "#history-new")
        .await;
    b.click(
        "the TextToolkit workflow",
        r#"#workflow-list button[data-workflow="TextToolkit"]"#,
    )
    .await;
    wait_for_input(&b).await;
    say(&b, "echo hi").await;
    let listed = "return [...document.querySelectorAll('#history-list .history-item')].map(a => [a.querySelector('.history-workflow').textContent, a.querySelector('.history-status').textContent, a.getAttribute('aria-current')]);";
    b.wait_until(
        "both chats in the sidebar",
        "return document.querySelectorAll('#history-list .history-item').length === 2;",
    )
    .await;
    assert_eq!(
        b.eval(listed, vec![]).await,
        json!([
            ["TextToolkit", "Your turn", "page"],
            ["TodoAssistant", "Your turn", null]
        ]),
        "newest first, the open one marked"
    );
    b.screenshot("desktop-11-history").await;
    b.assert_accessible("the history sidebar").await;

    // A new tab (its own, empty sessionStorage) still lists both and reopens one by replay.
    let tab = b
        .client
        .new_window(true)
        .await
        .unwrap_or_else(|e| panic!("new tab: {e}"));
    b.client
        .switch_to_window(tab.handle)
        .await
        .unwrap_or_else(|e| panic!("switch tab: {e}"));
    b.open("/").await;
    b.wait_for("the picker in the new tab", "#workflow-list button")
        .await;
    b.wait_until(
        "the sidebar after a fresh start",
        "return document.querySelectorAll('#history-list .history-item').length === 2;",
    )
    .await;
    b.click(
        "the TodoAssistant chat in the sidebar",
        "#history-list .history-item[data-workflow=TodoAssistant]",
    )
    .await;
    b.wait_until(
        "the TodoAssistant chat replayed",
        "return [...document.querySelectorAll('#log .msg-agent .msg-bubble')].some(m => m.textContent === 'Added \"Buy milk\" to your list.') && document.title === 'TodoAssistant · Tessera';",
    )
    .await;
    wait_for_input(&b).await;
    assert_eq!(
        say(&b, "list").await,
        "You have 1 task(s): Buy milk.",
        "the reopened chat goes on"
    );
    assert_no_duplicates(&b).await;
    b.close().await;
}

#[tokio::test]
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
async fn a_model_error_reads_plainly_and_retry_sends_again() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let Some(bins) = browser::available() else {
        return;
    };
    let llm = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(400).set_body_json(
            json!({"error": {"message": "model overloaded (test)", "type": "invalid_request_error"}}),
        ))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&llm)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "cmpl-1", "object": "chat.completion", "model": "mock-model",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Hello from the **mock** model."}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
        })))
        .with_priority(2)
        .mount(&llm)
        .await;
    let server = TestServer::start(ServerOptions {
        env: vec![
            ("OPENAI_BASE_URL".into(), format!("{}/v1", llm.uri())),
            ("OPENAI_API_KEY".into(), "sk-test".into()),
            ("TESSERA_STREAM".into(), "false".into()),
        ],
        ..Default::default()
    })
    .await;
    let b = Browser::launch(&bins, &server.base, Viewport::Desktop, "retry").await;
    start(&b, "TodoAssistant").await;
    b.type_into("the composer", "#composer-input", "hi").await;
    b.press(keys::ENTER).await;
    let error = b
        .wait_for(
            "the error with a retry button",
            "#log .note-error [data-action=retry]",
        )
        .await;
    let shown = b
        .eval(
            "const e = document.querySelector('#log .note-error'); return [e.querySelector('.error-title').textContent, e.querySelector('details').open, e.querySelector('details code').textContent];",
            vec![],
        )
        .await;
    assert_eq!(
        shown[0],
        "The AI model could not answer: its service is unreachable or returned an error."
    );
    assert_eq!(shown[1], false, "details folded away");
    assert!(
        shown[2].as_str().unwrap_or_default().contains("llm_error"),
        "{shown}"
    );
    b.screenshot("desktop-12-error").await;
    b.assert_accessible("an error with a retry button").await;
    error.click().await.unwrap_or_else(|e| panic!("click: {e}"));
    b.wait_until(
        "the retried answer",
        "return [...document.querySelectorAll('#log .msg-agent .msg-bubble')].some(m => m.textContent === 'Hello from the mock model.' && m.querySelector('strong'));",
    )
    .await;
    assert_eq!(
        b.eval(
            "return document.querySelectorAll('#log [data-action=retry]').length;",
            vec![]
        )
        .await,
        0,
        "the retry button is gone once used"
    );
    let usage = b
        .wait_until(
            "token usage shown",
            "const u = document.getElementById('chat-usage'); const m = [...document.querySelectorAll('#log .msg-usage')].pop(); return !u.hidden && m && [u.textContent, m.textContent];",
        )
        .await;
    assert!(
        usage[0].as_str().unwrap_or_default().contains("17 tokens"),
        "{usage}"
    );
    assert_eq!(usage[1], "17 tokens");
    b.close().await;
}

const API_KEY: &str = "tk_browser_test_6b1f0e9d8c7a";
const JWT_SECRET: &str = "browser-jwt-secret-0c9d8e7f6a5b4c3d";

fn auth_config() -> String {
    use sha2::Digest as _;
    let digest: String = sha2::Sha256::digest(API_KEY.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "[auth.jwt]\nhs256_secret = \"{JWT_SECRET}\"\nissuer = \"https://issuer.test\"\naudience = \"tessera\"\n\n[[tenants]]\nid = \"acme\"\napi_key_sha256 = [\"{digest}\"]\n"
    )
}

fn jwt(sub: &str) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 600;
    let claims = json!({"sub": sub, "tenant": "acme", "iss": "https://issuer.test", "aud": "tessera", "exp": exp});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .unwrap_or_else(|e| panic!("encode: {e}"))
}

/// Records the URL of every WebSocket the page opens in `window.__wsUrls`.
const WS_URL_SPY: &str = r#"
window.__wsUrls = [];
const Native = window.WebSocket;
window.WebSocket = class extends Native {
  constructor(url, protocols) { super(url, protocols); window.__wsUrls.push(String(url)); }
};
return true;"#;

#[tokio::test]
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
async fn sign_in_with_an_api_key_then_with_a_jwt() {
    let Some(bins) = browser::available() else {
        return;
    };
    let server = TestServer::start(ServerOptions {
        config_toml: Some(auth_config()),
        ..Default::default()
    })
    .await;
    let b = Browser::launch(&bins, &server.base, Viewport::Desktop, "signin").await;
    b.open("/").await;
    b.wait_for("the sign-in form", "#signin-form").await;
    b.screenshot("desktop-13-signin").await;
    b.assert_accessible("the sign-in form").await;

    // A wrong key is refused in plain words.
    b.type_into("the API key field", "#signin-key", "tk_wrong")
        .await;
    b.type_into("the user field", "#signin-user", "alice").await;
    b.click("Sign in", "#signin-submit").await;
    b.wait_until(
        "the refusal",
        "const e = document.getElementById('signin-error'); return !e.hidden && e.textContent.includes('not accepted');",
    )
    .await;
    b.eval(
        "document.getElementById('signin-key').value = ''; return true;",
        vec![],
    )
    .await;
    b.type_into("the API key field", "#signin-key", API_KEY)
        .await;
    b.click("Sign in", "#signin-submit").await;
    b.wait_for(
        "the picker after signing in",
        "#workflow-list button[data-workflow=TodoAssistant]",
    )
    .await;
    assert_eq!(
        b.eval(
            "return document.getElementById('signin-key').value;",
            vec![]
        )
        .await,
        "",
        "the form forgets the key"
    );
    b.eval(WS_URL_SPY, vec![]).await;
    start_from_picker(&b, "TodoAssistant").await;
    assert_eq!(
        say(&b, "add Buy milk").await,
        "Added \"Buy milk\" to your list."
    );
    let urls = b
        .eval(
            "return window.__wsUrls.concat(performance.getEntriesByType('resource').map(e => e.name), [location.href]);",
            vec![],
        )
        .await;
    let urls = urls.to_string();
    assert!(
        !urls.contains(API_KEY),
        "the key never goes in a URL: {urls}"
    );
    assert!(urls.contains("ticket="), "the socket uses a ticket: {urls}");

    // A reload keeps the sign-in (this tab only) and the chat.
    b.reload().await;
    b.wait_until(
        "the chat is back after a reload",
        "return window.tessera.state.connected && window.tessera.state.signedIn && document.querySelectorAll('#log .msg').length === 2;",
    )
    .await;

    // Sign out: back to the form, nothing kept.
    b.click("Sign out", "#sign-out").await;
    b.wait_for("the sign-in form again", "#signin-form").await;
    let kept = b
        .eval("return JSON.stringify(sessionStorage);", vec![])
        .await;
    assert!(
        !kept.as_str().unwrap_or_default().contains(API_KEY),
        "{kept}"
    );
    assert_eq!(
        b.eval("return window.tessera.state.chatId;", vec![]).await,
        Value::Null
    );

    // A JWT for another user of the tenant: their own (empty) history.
    b.click("the JWT choice", "input[name=kind][value=jwt]")
        .await;
    b.type_into("the token field", "#signin-token", &jwt("bob"))
        .await;
    b.click("Sign in", "#signin-submit").await;
    b.wait_for("the picker after the JWT", "#workflow-list button")
        .await;
    b.wait_until(
        "bob's empty history",
        "const n = document.getElementById('history-note'); return !n.hidden && n.textContent === 'No chats yet.';",
    )
    .await;
    start_from_picker(&b, "TextToolkit").await;
    assert_eq!(say(&b, "echo hi bob").await, "Echo: hi bob");
    b.close().await;
}

async fn start_from_picker(b: &Browser, workflow: &str) {
    b.click(
        &format!("the {workflow} workflow"),
        &format!(r#"#workflow-list button[data-workflow="{workflow}"]"#),
    )
    .await;
    wait_for_input(b).await;
}

#[tokio::test]
#[cfg_attr(
    browser_missing,
    ignore = "Chromium or chromedriver not found: run .ci/install-browser"
)]
async fn dark_mode_follows_the_system() {
    let Some(bins) = browser::available() else {
        return;
    };
    let server = TestServer::start(ServerOptions::default()).await;
    for (viewport, name) in [
        (Viewport::DesktopDark, "desktop"),
        (Viewport::PhoneDark, "phone"),
    ] {
        let b = Browser::launch(&bins, &server.base, viewport, "dark").await;
        start(&b, "TodoAssistant").await;
        let look = b
            .eval(
                "return [matchMedia('(prefers-color-scheme: dark)').matches, getComputedStyle(document.documentElement).backgroundColor, !!document.querySelector('link[rel=icon]')];",
                vec![],
            )
            .await;
        assert_eq!(look, json!([true, "rgb(18, 21, 28)", true]), "dark colours");
        say(&b, "help").await;
        say(&b, "add Buy milk").await;
        say(&b, "list my tasks").await;
        b.click(
            "the list_tasks row",
            "#log .tool-run[data-tool=list_tasks] summary",
        )
        .await;
        if name == "phone" {
            assert_fits_width(&b, "dark phone").await;
        }
        b.assert_accessible(&format!("dark mode ({name})")).await;
        b.screenshot(&format!("{name}-dark-chat")).await;
        if name == "desktop" {
            b.click("New chat", "#new-chat").await;
            generator_to_action_plan(&b).await;
            b.assert_accessible("the ActionPlan overlay in dark mode")
                .await;
            b.screenshot("desktop-dark-action-plan").await;
        }
        b.close().await;
    }
    let (status, icon) = server.get_bytes("/static/favicon.svg", "dev-user").await;
    assert_eq!(status, 200);
    assert!(icon.starts_with(b"<svg"), "the favicon is served");
}
