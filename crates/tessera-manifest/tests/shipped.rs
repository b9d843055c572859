//! The shipped workflows in `workflows/` must always load.

use std::path::PathBuf;

use serde_json::json;
use tessera_manifest::{
    DisplayMode, HandoffKind, HandoffTarget, StartupMode, ToolCalling, ToolImpl, ToolType,
    Workflow, load_workflow, load_workflows,
};

fn workflows_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../workflows")
}

fn load(name: &str) -> Workflow {
    match load_workflow(&workflows_root().join(name)) {
        Ok(w) => w,
        Err(e) => panic!("{name} failed to load:\n{e}"),
    }
}

#[test]
fn all_shipped_workflows_load() {
    let all = load_workflows(&workflows_root());
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "Generator",
            "LoadTest",
            "McpEverything",
            "TextToolkit",
            "TodoAssistant"
        ]
    );
    for (name, result) in &all {
        if let Err(e) = result {
            panic!("{name} failed to load:\n{e}");
        }
    }
}

#[test]
fn only_the_benchmark_workload_is_unlisted() {
    for (name, result) in load_workflows(&workflows_root()) {
        let listed = result.map(|w| w.listed).unwrap_or_default();
        assert_eq!(listed, name != "LoadTest", "{name}");
    }
}

#[test]
fn generator_is_wired_as_the_spec_describes() {
    let w = load("Generator");
    assert_eq!(w.startup_mode, StartupMode::AgentDriven);
    assert_eq!(w.initial_agent, "InterviewAgent");
    let names: Vec<&str> = w.agents.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "InterviewAgent",
            "ContextAgent",
            "APIKeyAgent",
            "DownloadAgent"
        ],
        "file order kept"
    );

    let ui = w
        .ui_tool_of("ContextAgent")
        .map(|t| (t.function.as_str(), t.ui.clone()));
    assert_eq!(ui.as_ref().map(|(f, _)| *f), Some("action_plan"));
    assert_eq!(
        ui.and_then(|(_, u)| u).map(|u| u.mode),
        Some(DisplayMode::Artifact)
    );

    let key = w.tool("request_api_key").map(|t| t.secret_fields.clone());
    assert_eq!(key, Some(vec!["apiKey".to_owned()]));
    let dl = w
        .tool("generate_and_download")
        .and_then(|t| t.implementation.clone());
    assert_eq!(
        dl,
        Some(ToolImpl::Builtin {
            name: "generate_and_download".into()
        })
    );

    // UI tool parameters are derived from the registry model.
    let params = w.tool("action_plan").map(|t| t.parameters.clone());
    let model = w.output_model_of("ContextAgent").map(|m| m.schema.clone());
    assert!(params.is_some() && params == model);

    // The registry model validates a good output and explains a bad one.
    let Some(m) = w.output_model_of("ContextAgent") else {
        panic!("no model")
    };
    let good = json!({"ActionPlan": {"workflow": {"name": "n", "description": "d", "phases": [
        {"name": "p", "description": "d", "agents": ["AAgent"]}]}}, "agent_message": "ok"});
    assert_eq!(m.validate(&good), Ok(()));
    let bad = json!({"ActionPlan": {"workflow": {"name": "n", "description": "d", "phases": [{"name": 1}]}}});
    let Err(errors) = m.validate(&bad) else {
        panic!("should fail")
    };
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("/agent_message:") && e.contains("required")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("/ActionPlan/workflow/phases/0/name:")),
        "{errors:?}"
    );

    // Optional with default is not required.
    let Some(dm) = w.output_model_of("DownloadAgent") else {
        panic!("no model")
    };
    assert_eq!(dm.validate(&json!({"agent_message": "x"})), Ok(()));
    assert_eq!(
        dm.validate(&json!({"agent_message": "x", "confirmation_only": null})),
        Ok(())
    );

    let ctx = w.initial_context();
    assert_eq!(ctx.get("interview_complete"), Some(&json!(false)));
    assert_eq!(ctx.get("action_plan_status"), Some(&json!("")));

    let rules: Vec<_> = w.handoff_rules_for("InterviewAgent").collect();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].kind, HandoffKind::Condition);
    assert_eq!(rules[0].target, HandoffTarget::Agent("ContextAgent".into()));
    let mut vars = ctx.clone();
    assert!(!rules[0].condition.as_ref().is_some_and(|c| c.eval(&vars)));
    vars.insert("interview_complete".into(), json!(true));
    assert!(rules[0].condition.as_ref().is_some_and(|c| c.eval(&vars)));
    assert_eq!(rules[1].target, HandoffTarget::User);
    let last: Vec<_> = w.handoff_rules_for("DownloadAgent").collect();
    assert_eq!(
        last.first().map(|r| r.target.clone()),
        Some(HandoffTarget::Terminate)
    );
}

#[test]
fn todo_and_toolkit_workflows() {
    let todo = load("TodoAssistant");
    assert_eq!(todo.startup_mode, StartupMode::UserDriven);
    let tools: Vec<&str> = todo
        .agent_tools_of("TodoAgent")
        .map(|t| t.function.as_str())
        .collect();
    assert_eq!(
        tools,
        ["add_task", "list_tasks", "complete_task", "delete_task"]
    );
    assert!(
        todo.tools
            .iter()
            .all(|t| t.tool_type == ToolType::AgentTool && t.ui.is_none())
    );

    let kit = load("TextToolkit");
    let agent = kit.agent("ToolkitAgent").map(|a| a.tool_calling);
    assert_eq!(agent, Some(ToolCalling::Json));
    let echo = kit
        .tool("echo")
        .map(|t| t.parameters["properties"]["repeat_count"].clone());
    assert_eq!(
        echo,
        Some(
            json!({"type": "integer", "minimum": 1, "maximum": 10, "default": 1, "description": "How many times to repeat it"})
        )
    );
}

#[test]
fn workflow_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Workflow>();
}

#[test]
fn the_version_follows_the_manifest_content() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let copy = tmp.path().join("LoadTest");
    std::fs::create_dir_all(&copy).unwrap_or_else(|e| panic!("{e}"));
    let source = workflows_root().join("LoadTest");
    for file in tessera_manifest::MANIFEST_FILES {
        if source.join(file).is_file() {
            std::fs::copy(source.join(file), copy.join(file)).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let original = load("LoadTest");
    let copied = load_workflow(&copy).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(original.version.len(), 16);
    assert_eq!(copied.version, original.version, "same files, same version");
    let demo = copy.join("demo.json");
    let text = std::fs::read_to_string(&demo).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&demo, text.replace("Echoed your message.", "Echoed (v2)."))
        .unwrap_or_else(|e| panic!("{e}"));
    let changed = load_workflow(&copy).unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(
        changed.version, original.version,
        "a changed demo.json is a new version"
    );
}

#[test]
fn mcp_everything_grants_its_agent_two_prefixed_tools_of_one_http_server() {
    let w = load("McpEverything");
    let grants: Vec<(String, Vec<String>)> = w
        .mcp
        .grants_of("EverythingAgent")
        .map(|(server, grant)| {
            let names = grant
                .tools
                .iter()
                .map(|t| tessera_manifest::mcp_exposed_name(server, t))
                .collect();
            (server.name.clone(), names)
        })
        .collect();
    assert_eq!(
        grants,
        [(
            "everything".to_owned(),
            vec![
                "everything_echo".to_owned(),
                "everything_get-sum".to_owned()
            ]
        )]
    );
    assert!(matches!(
        w.mcp.servers[0].transport,
        tessera_manifest::McpTransport::Http { .. }
    ));
}
