//! Built-in tools: echo, word_count, todo isolation, generate_and_download, registry.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::ctx;
use serde_json::{Map, Value, json};
use tessera_tools::{
    ArgSchema, ArtifactStore, BuiltinRegistry, InMemoryArtifactStore, InMemoryTaskStore,
    ToolContext, ToolServices,
};

fn services() -> (ToolServices, Arc<InMemoryArtifactStore>) {
    let artifacts = Arc::new(InMemoryArtifactStore::new());
    let services = ToolServices {
        tasks: Arc::new(InMemoryTaskStore::new()),
        artifacts: artifacts.clone(),
    };
    (services, artifacts)
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

async fn call(reg: &BuiltinRegistry, name: &str, args: Value, ctx: &ToolContext) -> Value {
    let tool = reg.get(name).expect("registered");
    // Go through the tool's own schema, as the engine does.
    let schema =
        ArgSchema::new(&reg.entry(name).expect("entry").parameters).expect("schema compiles");
    let args = schema.normalize(args).expect("valid args");
    tool.invoke(args, ctx.clone()).await.expect("tool ran")
}

#[tokio::test]
async fn registry_lists_every_builtin_with_a_compilable_schema() {
    let (services, _) = services();
    let reg = BuiltinRegistry::with_defaults(services);
    assert_eq!(
        reg.names(),
        vec![
            "add_task",
            "complete_task",
            "delete_task",
            "echo",
            "generate_and_download",
            "list_tasks",
            "word_count"
        ]
    );
    for name in reg.names() {
        let entry = reg.entry(name).expect("entry");
        assert!(!entry.description.is_empty());
        ArgSchema::new(&entry.parameters).expect("schema compiles");
    }
    assert!(reg.get("malicious_tool").is_none());
}

#[tokio::test]
async fn echo_matches_the_manifest_example() {
    let (services, _) = services();
    let reg = BuiltinRegistry::with_defaults(services);
    let c = ctx("app1", "u1", "chat1");
    assert_eq!(
        call(&reg, "echo", json!({"message": "hi"}), &c).await,
        json!({"status": "success", "echoed": "hi", "original_length": 2, "repeated_length": 2})
    );
    assert_eq!(
        call(
            &reg,
            "echo",
            json!({"message": "héllo", "repeat_count": 3}),
            &c
        )
        .await,
        json!({"status": "success", "echoed": "héllo héllo héllo", "original_length": 5, "repeated_length": 17})
    );
    for bad in [0, 11, -1] {
        assert_eq!(
            call(
                &reg,
                "echo",
                json!({"message": "hi", "repeat_count": bad}),
                &c
            )
            .await,
            json!({"status": "error", "message": "repeat_count must be between 1 and 10"})
        );
    }
    assert_eq!(
        call(&reg, "echo", json!({"message": ""}), &c).await,
        json!({"status": "error", "message": "message parameter is required"})
    );
    // Called without validation, a missing message is still an error result, not a panic.
    let raw = reg
        .get("echo")
        .expect("echo")
        .invoke(Map::new(), c.clone())
        .await
        .expect("ran");
    assert_eq!(raw["status"], "error");
}

#[tokio::test]
async fn word_count_counts_words_and_chars() {
    let (services, _) = services();
    let reg = BuiltinRegistry::with_defaults(services);
    let c = ctx("app1", "u1", "chat1");
    assert_eq!(
        call(
            &reg,
            "word_count",
            json!({"text": "  hello   wörld\nagain "}),
            &c
        )
        .await,
        json!({"status": "success", "words": 3, "chars": 22})
    );
    assert_eq!(
        call(&reg, "word_count", json!({"text": ""}), &c).await,
        json!({"status": "success", "words": 0, "chars": 0})
    );
}

#[tokio::test]
async fn todo_lifecycle() {
    let (services, _) = services();
    let reg = BuiltinRegistry::with_defaults(services);
    let c = ctx("app1", "u1", "chat1");
    let added = call(
        &reg,
        "add_task",
        json!({"title": "Buy milk", "description": "2 liters"}),
        &c,
    )
    .await;
    assert_eq!(added["status"], "success");
    assert_eq!(added["message"], "Task 'Buy milk' added.");
    assert_eq!(added["task"]["title"], "Buy milk");
    assert_eq!(added["task"]["description"], "2 liters");
    assert_eq!(added["task"]["completed"], false);
    let id = added["task"]["id"].as_str().expect("id").to_owned();
    call(&reg, "add_task", json!({"title": "Walk dog"}), &c).await;

    let all = call(&reg, "list_tasks", json!({}), &c).await;
    assert_eq!(all["count"], 2);
    let done = call(&reg, "complete_task", json!({"task_id": id}), &c).await;
    assert_eq!(done["status"], "success");
    assert_eq!(done["message"], "Task 'Buy milk' completed.");
    assert_eq!(done["task"]["completed"], true);

    let pending = call(&reg, "list_tasks", json!({"status": "pending"}), &c).await;
    assert_eq!(pending["tasks"].as_array().map(Vec::len), Some(1));
    assert_eq!(pending["tasks"][0]["title"], "Walk dog");
    let completed = call(&reg, "list_tasks", json!({"status": "completed"}), &c).await;
    assert_eq!(completed["tasks"][0]["id"], Value::String(id.clone()));

    let deleted = call(&reg, "delete_task", json!({"task_id": id}), &c).await;
    assert_eq!(deleted["message"], "Task 'Buy milk' deleted.");
    let again = call(&reg, "delete_task", json!({"task_id": id}), &c).await;
    assert_eq!(
        again,
        json!({"status": "error", "message": "Task not found."})
    );
    let missing = call(&reg, "complete_task", json!({"task_id": "nonexistent"}), &c).await;
    assert_eq!(
        missing,
        json!({"status": "error", "message": "Task not found."})
    );

    let blank = call(&reg, "add_task", json!({"title": "   "}), &c).await;
    assert_eq!(blank["status"], "error");
    let bad_filter = reg
        .get("list_tasks")
        .expect("tool")
        .invoke(obj(json!({"status": "archived"})), c.clone())
        .await
        .expect("ran");
    assert_eq!(bad_filter["status"], "error");
}

#[tokio::test]
async fn todo_tasks_are_isolated_by_tenant_and_user() {
    let (services, _) = services();
    let reg = BuiltinRegistry::with_defaults(services);
    let alice = ctx("tenantA", "alice", "c1");
    let bob = ctx("tenantA", "bob", "c2");
    // Same user id in another tenant is another person.
    let alice_b = ctx("tenantB", "alice", "c3");

    let a = call(&reg, "add_task", json!({"title": "Alice secret"}), &alice).await;
    let a_id = a["task"]["id"].as_str().expect("id").to_owned();
    let b = call(&reg, "add_task", json!({"title": "Bob task"}), &bob).await;
    let b_id = b["task"]["id"].as_str().expect("id").to_owned();

    for intruder in [&bob, &alice_b] {
        let listed = call(&reg, "list_tasks", json!({"status": "all"}), intruder).await;
        assert!(!listed.to_string().contains("Alice secret"), "{listed}");
        for tool in ["complete_task", "delete_task"] {
            let r = call(&reg, tool, json!({"task_id": a_id}), intruder).await;
            assert_eq!(
                r,
                json!({"status": "error", "message": "Task not found."}),
                "{tool}"
            );
        }
    }
    let alice_list = call(&reg, "list_tasks", json!({}), &alice).await;
    assert_eq!(alice_list["count"], 1);
    assert_eq!(
        alice_list["tasks"][0]["completed"], false,
        "intruders changed nothing"
    );
    assert!(!alice_list.to_string().contains("Bob task"));
    let r = call(&reg, "delete_task", json!({"task_id": b_id}), &alice).await;
    assert_eq!(r["status"], "error");
    assert_eq!(
        call(&reg, "list_tasks", json!({}), &alice_b).await["count"],
        0
    );
    assert_eq!(call(&reg, "list_tasks", json!({}), &bob).await["count"], 1);
}

/// Entries of a ZIP archive (name, content), read via the central directory, checking
/// signatures, sizes and CRCs.
fn read_zip(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let u16at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let u32at = |o: usize| {
        u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]) as usize
    };
    assert_eq!(&bytes[..4], b"PK\x03\x04", "local file header signature");
    let eocd = bytes.len() - 22;
    assert_eq!(
        &bytes[eocd..eocd + 4],
        b"PK\x05\x06",
        "end of central directory"
    );
    let count = u16at(eocd + 10);
    let mut at = u32at(eocd + 16);
    let mut out = Vec::new();
    for _ in 0..count {
        assert_eq!(&bytes[at..at + 4], b"PK\x01\x02");
        let method = u16at(at + 10);
        let crc = u32at(at + 16) as u32;
        let size = u32at(at + 24);
        let name_len = u16at(at + 28);
        let extra = u16at(at + 30);
        let comment = u16at(at + 32);
        let local = u32at(at + 42);
        let name =
            String::from_utf8(bytes[at + 46..at + 46 + name_len].to_vec()).expect("utf8 name");
        assert_eq!(method, 0, "stored");
        assert_eq!(&bytes[local..local + 4], b"PK\x03\x04");
        let data_at = local + 30 + u16at(local + 26) + u16at(local + 28);
        let data = bytes[data_at..data_at + size].to_vec();
        assert_eq!(crc32(&data), crc, "crc of {name}");
        out.push((name, data));
        at += 46 + name_len + extra + comment;
    }
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[tokio::test]
async fn generate_and_download_stores_a_readable_zip_for_its_owner() {
    let (services, artifacts) = services();
    let reg = BuiltinRegistry::with_defaults(services);
    let c = ctx("tenantA", "alice", "chat 42");
    let plan = json!({
        "workflow": {
            "name": "Social Poster",
            "phases": [
                {"name": "Draft", "agents": [{"name": "WriterAgent"}]},
                {"name": "Publish", "agents": ["PosterAgent", "WriterAgent"]}
            ]
        }
    });
    let result = call(
        &reg,
        "generate_and_download",
        json!({"agent_message": "Your bundle is ready", "confirmation_only": false, "ActionPlan": plan}),
        &c,
    )
    .await;
    assert_eq!(result["status"], "success");
    assert_eq!(result["mode"], "download");
    let file = &result["files"][0];
    assert_eq!(file["name"], "Social_Poster_bundle.zip");
    let id = file["artifact_id"].as_str().expect("artifact id");
    assert_eq!(
        file["download_path"],
        Value::String(format!("/api/v1/chats/chat%2042/files/{id}"))
    );

    let stored = artifacts
        .get("tenantA", "alice", "chat 42", id)
        .await
        .expect("store ok")
        .expect("stored under the owner");
    assert_eq!(file["size"], json!(stored.bytes.len()));
    let entries = read_zip(&stored.bytes);
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "Social_Poster/README.md",
            "Social_Poster/workflow.json",
            "Social_Poster/action_plan.json"
        ]
    );
    let readme = String::from_utf8(entries[0].1.clone()).expect("utf8");
    assert!(readme.contains("# Social Poster") && readme.contains("Your bundle is ready"));
    assert!(readme.contains("1. Draft") && readme.contains("2. Publish"));
    let workflow: Value = serde_json::from_slice(&entries[1].1).expect("workflow.json parses");
    assert_eq!(workflow["name"], "Social Poster");
    assert_eq!(
        workflow["agents"],
        json!([{"name": "WriterAgent"}, {"name": "PosterAgent"}])
    );
    let plan_back: Value = serde_json::from_slice(&entries[2].1).expect("plan parses");
    assert_eq!(plan_back, plan);

    // Nobody else can fetch it: other user, other tenant, other chat.
    for (t, u, ch) in [
        ("tenantA", "bob", "chat 42"),
        ("tenantB", "alice", "chat 42"),
        ("tenantA", "alice", "other"),
    ] {
        assert!(
            artifacts
                .get(t, u, ch, id)
                .await
                .expect("store ok")
                .is_none(),
            "{t}/{u}/{ch}"
        );
    }
}

#[tokio::test]
async fn generate_and_download_confirmation_and_no_plan() {
    let (services, artifacts) = services();
    let reg = BuiltinRegistry::with_defaults(services);
    let c = ctx("t", "u", "chat1");
    let confirm = call(
        &reg,
        "generate_and_download",
        json!({"confirmation_only": true}),
        &c,
    )
    .await;
    assert_eq!(
        confirm,
        json!({"status": "success", "mode": "confirmation", "files": []})
    );

    let result = call(&reg, "generate_and_download", json!({}), &c).await;
    let id = result["files"][0]["artifact_id"].as_str().expect("id");
    assert_eq!(result["files"][0]["name"], "Generator_bundle.zip");
    let stored = artifacts
        .get("t", "u", "chat1", id)
        .await
        .expect("ok")
        .expect("stored");
    let names: Vec<String> = read_zip(&stored.bytes)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        vec!["Generator/README.md", "Generator/workflow.json"]
    );
}

#[tokio::test]
async fn artifact_store_scoping() {
    let store = InMemoryArtifactStore::new();
    let r = store
        .put("t", "u", "c", "a.txt", Bytes::from_static(b"hello"))
        .await
        .expect("put");
    assert_eq!(r.size, 5);
    assert_eq!(r.file_name, "a.txt");
    let got = store
        .get("t", "u", "c", &r.id)
        .await
        .expect("ok")
        .expect("found");
    assert_eq!(&got.bytes[..], b"hello");
    assert!(
        store
            .get("t", "u2", "c", &r.id)
            .await
            .expect("ok")
            .is_none()
    );
    assert!(
        store
            .get("t", "u", "c", "art_nope")
            .await
            .expect("ok")
            .is_none()
    );
}
