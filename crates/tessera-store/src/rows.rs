//! Rows read back into the store's records, for either backend's sqlx row type.
//!
//! WHY generic: SQLite and PostgreSQL return the same columns under the same names (JSON as
//! text, integers as 64-bit), so one decoder per record serves both and the checks on what
//! is read (negative numbers, JSON that does not parse) are written once.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use sqlx::{ColumnIndex, Decode, Row, Type};
use tessera_tools::{ArtifactRef, StoredArtifact, Task};

use crate::convert::{json_from_sql, json_text_from_sql, sql_to_u32, sql_to_u64};
use crate::{
    ChatRecord, ChatState, PendingUiRecord, StoreError, StoredChat, StoredEvent, StoredMessage,
};

/// What the decoders need of a backend's row: named columns of these Rust types.
pub(crate) trait StoreRow<'r>: Row
where
    &'static str: ColumnIndex<Self>,
{
    /// A named column, decoded.
    fn col<T>(&'r self, name: &'static str) -> Result<T, StoreError>
    where
        T: Decode<'r, Self::Database> + Type<Self::Database>,
    {
        Ok(self.try_get(name)?)
    }
}

impl<'r, R: Row> StoreRow<'r> for R where &'static str: ColumnIndex<R> {}

/// `chat_id, tenant, user_id, workflow, workflow_version, created_at_ms, status, current_agent, turn,
/// consecutive, context, updated_at_ms`.
pub(crate) fn chat<'r, R>(row: &'r R) -> Result<StoredChat, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let chat_id: String = row.col("chat_id")?;
    let context_text: String = row.col("context")?;
    let context = match json_from_sql(&context_text, "chat context")? {
        Value::Object(map) => Arc::new(map),
        other => {
            return Err(StoreError::Corrupt(format!(
                "context of chat '{chat_id}' is not an object: {}",
                kind_of(&other)
            )));
        }
    };
    Ok(StoredChat {
        state: ChatState {
            status: row.col("status")?,
            current_agent: row.col("current_agent")?,
            turn: sql_to_u32(row.col("turn")?, "turn")?,
            consecutive: sql_to_u32(row.col("consecutive")?, "consecutive")?,
            context,
            updated_at_ms: row.col("updated_at_ms")?,
        },
        record: ChatRecord {
            chat_id,
            tenant: row.col("tenant")?,
            user_id: row.col("user_id")?,
            workflow: row.col("workflow")?,
            workflow_version: row.col("workflow_version")?,
            created_at_ms: row.col("created_at_ms")?,
        },
    })
}

/// `idx, message_id, role, agent, content, ui_hidden, raw`.
pub(crate) fn message<'r, R>(row: &'r R) -> Result<StoredMessage, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    &'r str: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
{
    let raw: String = row.col("raw")?;
    Ok(StoredMessage {
        idx: sql_to_u64(row.col("idx")?, "message idx")?,
        message_id: row.col("message_id")?,
        role: Cow::Owned(row.col::<String>("role")?),
        agent: row.col::<Option<&str>>("agent")?.map(Arc::from),
        content: Arc::from(row.col::<&str>("content")?),
        ui_hidden: row.col("ui_hidden")?,
        raw: json_text_from_sql(raw, "message raw")?,
    })
}

/// `seq, event_type, json`.
pub(crate) fn event<'r, R>(row: &'r R) -> Result<StoredEvent, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    &'r str: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(StoredEvent {
        seq: sql_to_u64(row.col("seq")?, "event seq")?,
        event_type: Cow::Owned(row.col::<String>("event_type")?),
        // Borrowed from the row, then copied once into the shared text.
        json: Arc::from(row.col::<&str>("json")?),
    })
}

/// `corr, turn_key, call, created_at_ms, timeout_at_ms`.
pub(crate) fn pending_ui<'r, R>(row: &'r R) -> Result<PendingUiRecord, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let call: String = row.col("call")?;
    Ok(PendingUiRecord {
        corr: row.col("corr")?,
        turn_key: row.col("turn_key")?,
        call: json_from_sql(&call, "pending ui call")?,
        created_at_ms: row.col("created_at_ms")?,
        timeout_at_ms: row.col("timeout_at_ms")?,
    })
}

/// `id, title, description, completed, created_at_ms`.
pub(crate) fn task<'r, R>(row: &'r R) -> Result<Task, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(Task {
        id: row.col("id")?,
        title: row.col("title")?,
        description: row.col("description")?,
        completed: row.col("completed")?,
        created_at_ms: sql_to_u64(row.col("created_at_ms")?, "task created_at_ms")?,
    })
}

/// `id, file_name, size, sha256, bytes`.
pub(crate) fn artifact<'r, R>(row: &'r R) -> Result<StoredArtifact, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let bytes: Vec<u8> = row.col("bytes")?;
    Ok(StoredArtifact {
        meta: ArtifactRef {
            id: row.col("id")?,
            file_name: row.col("file_name")?,
            size: sql_to_u64(row.col("size")?, "artifact size")?,
            sha256: Some(row.col("sha256")?),
        },
        bytes: Bytes::from(bytes),
    })
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
