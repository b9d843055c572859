//! Shared fixtures for the store tests.

#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::json;
use tessera_store::{ChatRecord, SqliteStore, StoredEvent, StoredMessage};

/// A temp dir holding the database file; keep it alive for the test's duration.
pub struct TempDb {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

pub fn temp_db() -> TempDb {
    let dir = tempfile::tempdir().expect("tempdir");
    // A nested path checks that `open` creates missing parent directories.
    let path = dir.path().join("data").join("nested").join("tessera.db");
    TempDb { dir, path }
}

pub async fn open(db: &TempDb) -> SqliteStore {
    SqliteStore::open(&db.path).await.expect("open store")
}

pub fn record(chat_id: &str, tenant: &str, user: &str, created_at_ms: i64) -> ChatRecord {
    ChatRecord {
        chat_id: chat_id.to_owned(),
        tenant: tenant.to_owned(),
        user_id: user.to_owned(),
        workflow: "support".to_owned(),
        workflow_version: "v1".to_owned(),
        created_at_ms,
    }
}

pub fn message(idx: u64) -> StoredMessage {
    StoredMessage {
        idx,
        message_id: format!("m{idx}"),
        role: if idx.is_multiple_of(2) {
            "user"
        } else {
            "assistant"
        }
        .to_owned(),
        agent: (idx % 2 == 1).then(|| "triage".to_owned()),
        content: format!("message {idx}"),
        ui_hidden: idx == 3,
        raw: json!({"role": "user", "content": format!("message {idx}")}),
    }
}

pub fn event(seq: u64) -> StoredEvent {
    StoredEvent {
        seq,
        event_type: "chat.text".to_owned(),
        json: format!(r#"{{"type":"chat.text","seq":{seq}}}"#),
    }
}
