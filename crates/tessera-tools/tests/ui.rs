//! UI tool payload building, response contract, secret sanitization, canonical results.

use serde_json::{Map, Value, json};
use tessera_tools::{
    build_ui_payload, interrupted_result, is_success, normalize_ui_response, sanitize_ui_response,
    ui_cancelled_result, ui_timeout_result,
};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

#[test]
fn payload_contains_args_message_id_workflow_display_and_extra() {
    let args = obj(json!({"service": "openai", "maskInput": true, "agent_message": "Key please"}));
    let extra = json!({"status": "success", "mode": "download", "files": [{"name": "b.zip"}]});
    let (payload, id) = build_ui_payload(&args, Some(&extra), "Generator", "inline");
    assert!(id.starts_with("msg_"));
    assert_eq!(id.len(), 14);
    assert!(id[4..].chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(
        payload,
        json!({
            "service": "openai",
            "maskInput": true,
            "agent_message": "Key please",
            "agent_message_id": id,
            "workflow_name": "Generator",
            "display": "inline",
            "mode": "download",
            "files": [{"name": "b.zip"}],
        })
    );
    // Fresh id every time.
    let (_, id2) = build_ui_payload(&args, None, "Generator", "inline");
    assert_ne!(id, id2);
}

#[test]
fn payload_default_message_and_reserved_keys_win() {
    let args = obj(
        json!({"ActionPlan": {"workflow": {}}, "display": "bogus", "agent_message_id": "forged"}),
    );
    let (payload, id) = build_ui_payload(&args, None, "Generator", "artifact");
    assert!(
        payload["agent_message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    assert_eq!(payload["display"], "artifact");
    assert_eq!(payload["agent_message_id"], Value::String(id));
    assert_eq!(payload["ActionPlan"], json!({"workflow": {}}));
}

#[test]
fn secrets_are_stripped_everywhere_and_returned_separately() {
    const CANARY: &str = "sk-CANARY-0123456789abcdef";
    let response = json!({
        "corr": "ui_tool_abc",
        "status": "success",
        "action": "submit",
        "apiKey": CANARY,
        "data": {
            "service": "openai",
            "apiKey": CANARY,
            "keyLength": 26,
            "ui_tool_id": "ui_tool_abc",
            "eventId": "ui_tool_abc",
            "nested": [{"apiKey": CANARY}],
            "note": format!("the key is {CANARY}"),
            "agent_message_id": "msg_0123456789"
        }
    });
    let out = sanitize_ui_response(response, &["apiKey".to_owned()]);
    let text = out.for_agent.to_string();
    assert!(!text.contains("CANARY"), "secret leaked: {text}");
    assert_eq!(out.secrets, vec![("apiKey".to_owned(), CANARY.to_owned())]);
    let data = &out.for_agent["data"];
    assert_eq!(data["apiKey_provided"], true);
    assert_eq!(data["apiKey_length"], 26);
    assert_eq!(out.for_agent["apiKey_provided"], true);
    assert_eq!(data["service"], "openai");
    assert_eq!(data["agent_message_id"], "msg_0123456789");
    assert_eq!(out.for_agent["status"], "success");
    assert_eq!(out.for_agent["action"], "submit");
    assert!(out.for_agent.get("corr").is_none());
    assert!(data.get("ui_tool_id").is_none() && data.get("eventId").is_none());
    assert!(
        data["note"]
            .as_str()
            .is_some_and(|n| n.contains("[redacted]"))
    );
}

#[test]
fn secret_matching_is_case_sensitive_and_empty_secret_not_provided() {
    let response = json!({"status": "success", "data": {"token": "", "Token": "visible"}});
    let out = sanitize_ui_response(response, &["token".to_owned()]);
    assert!(out.secrets.is_empty());
    assert_eq!(out.for_agent["data"]["token_provided"], false);
    assert_eq!(out.for_agent["data"]["token_length"], 0);
    assert_eq!(out.for_agent["data"]["Token"], "visible");
}

#[test]
fn no_secret_fields_means_untouched_data() {
    let response =
        json!({"status": "error", "code": "user_cancelled", "message": "m", "data": {"x": 1}});
    let out = sanitize_ui_response(response.clone(), &[]);
    assert_eq!(out.for_agent, response);
    assert!(out.secrets.is_empty());
}

#[test]
fn response_contract_table() {
    let ok: Vec<(Value, Value)> = vec![
        (
            json!({"status": "success", "action": "submit", "data": {"a": 1}, "corr": "x"}),
            json!({"status": "success", "action": "submit", "data": {"a": 1}}),
        ),
        (json!({"status": "success"}), json!({"status": "success"})),
        (
            json!({"status": "error", "action": "cancel", "code": "user_cancelled", "message": "User cancelled"}),
            json!({"status": "error", "action": "cancel", "code": "user_cancelled", "message": "User cancelled"}),
        ),
        (
            json!({"status": "error", "action": "cancel"}),
            json!({"status": "error", "action": "cancel", "code": "user_cancelled", "message": "User cancelled operation"}),
        ),
        (
            json!({"status": "error", "code": "user_cancelled", "data": {"ui_tool_id": "u"}}),
            json!({"status": "error", "action": "cancel", "code": "user_cancelled",
                   "message": "User cancelled operation", "data": {"ui_tool_id": "u"}}),
        ),
        (
            json!({"status": "error", "message": "Component render failed", "code": "component_error"}),
            json!({"status": "error", "message": "Component render failed", "code": "component_error"}),
        ),
        (
            json!({"status": "success", "data": null}),
            json!({"status": "success"}),
        ),
    ];
    for (input, want) in ok {
        assert_eq!(
            normalize_ui_response(&input).as_ref(),
            Ok(&want),
            "input {input}"
        );
    }
    let bad: Vec<(Value, &str)> = vec![
        (json!("success"), "object"),
        (json!([]), "object"),
        (json!({}), "status"),
        (json!({"status": "ok"}), "\"success\" or \"error\""),
        (json!({"status": "cancelled"}), "\"success\" or \"error\""),
        (json!({"status": true}), "string"),
        (json!({"status": "success", "action": "cancel"}), "cancel"),
        (
            json!({"status": "success", "code": "user_cancelled"}),
            "cancel",
        ),
        (
            json!({"status": "error", "action": "cancel", "code": "oops"}),
            "user_cancelled",
        ),
        (
            json!({"status": "error", "action": "submit", "code": "user_cancelled"}),
            "cancel",
        ),
        (json!({"status": "success", "data": [1]}), "data"),
        (json!({"status": "success", "data": "x"}), "data"),
        (json!({"status": "error", "message": 5}), "message"),
        (json!({"status": "error", "code": 5}), "code"),
        (json!({"status": "success", "action": {}}), "action"),
    ];
    for (input, why) in bad {
        match normalize_ui_response(&input) {
            Err(e) => assert!(e.contains(why), "{input}: {e:?} lacks {why:?}"),
            Ok(v) => panic!("{input} accepted as {v}"),
        }
    }
}

#[test]
fn canonical_results() {
    let t = ui_timeout_result(300.0);
    assert_eq!(t["status"], "error");
    assert_eq!(t["code"], "ui_timeout");
    assert!(
        t["message"]
            .as_str()
            .is_some_and(|m| m.contains("300 seconds"))
    );
    assert!(
        ui_timeout_result(1.5)["message"]
            .as_str()
            .is_some_and(|m| m.contains("1.5 seconds"))
    );

    let c = ui_cancelled_result();
    assert_eq!(
        normalize_ui_response(&c).as_ref(),
        Ok(&c),
        "cancel result satisfies the contract"
    );
    assert_eq!(c["code"], "user_cancelled");

    assert_eq!(
        interrupted_result(),
        json!({"status": "error", "code": "interrupted",
               "message": "The tool was interrupted by a restart and was not re-run."})
    );
}

#[test]
fn success_rule() {
    assert!(is_success(true, &json!({"status": "success"})));
    assert!(is_success(true, &json!({"result": 1})));
    assert!(is_success(true, &json!("text")));
    assert!(is_success(true, &json!([{"status": "error"}])));
    assert!(!is_success(
        true,
        &json!({"status": "error", "message": "x"})
    ));
    assert!(!is_success(true, &json!({"status": "failed"})));
    assert!(!is_success(true, &json!({"status": "Error"})));
    assert!(!is_success(false, &json!({"status": "success"})));
    assert!(!is_success(true, &ui_timeout_result(1.0)));
    assert!(!is_success(true, &interrupted_result()));
}
