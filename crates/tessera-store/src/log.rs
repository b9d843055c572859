//! The SQLite chat log (`chat_log`, migration 8): what a chat's flush writes (its events,
//! transcript messages and new state) as ONE packed row, linked to the chat's previous row;
//! the chat's `chat_heads` row (integers only) points at the newest row and at the row with
//! the latest state.
//!
//! WHY: a row per event and per message under unique per-chat indexes, and the state updated
//! in the wide `chats` row, made every chat in a group commit dirty pages of its own; rows
//! appended in write order plus a dense table of heads dirty the table's tail and a page the
//! commit's other chats share (see the migration for the whole story).
//!
//! Packed format: a list of fields, each `<byte length in decimal>:<bytes>`. An event is 3
//! fields (seq, event_type, json); a message 7 (idx, message_id, role, agent as `-` or
//! `+name`, content, ui_hidden as `0`/`1`, raw JSON); a state 6 (status, current_agent, turn,
//! consecutive, context JSON, updated_at_ms). Migration 8 writes events and messages in the
//! same format in SQL, so both must change together.

use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, params};
use sqlx::{Row, SqlitePool};

use crate::convert::{json_text_from_sql, sql_to_u64, u64_to_sql};
use crate::db::{Db, Held};
use crate::{ChatState, StoreError, StoredEvent, StoredMessage};

/// A chat's `chat_heads` row: where its log and its chain of unindexed tool claims stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Heads {
    pub(crate) chat_no: i64,
    /// The newest log row.
    pub(crate) log_row: Option<i64>,
    pub(crate) last_seq: i64,
    pub(crate) next_idx: i64,
    /// The newest claim not yet in `tool_invocation_keys` (see `tools`).
    pub(crate) claims_head: Option<i64>,
    pub(crate) unindexed_claims: i64,
    /// That claim's `chain_filter` (`None` without a head, or for a head without a filter).
    pub(crate) head_filter: Option<i64>,
    /// The claim chained before it (its `prev`; `None` without a head or at a chain's start).
    pub(crate) head_prev: Option<i64>,
    /// Whether `tool_invocation_keys` holds any of the chat's keys: when not, a key is looked
    /// for in the chain alone.
    pub(crate) indexed_keys: bool,
}

/// [`heads`]' statement.
pub(crate) const HEADS_SQL: &str = "SELECT h.chat_no, h.log_head, h.last_seq, h.next_idx, \
     h.claims_head, h.unindexed_claims, t.chain_filter, t.prev, \
     EXISTS (SELECT 1 FROM tool_invocation_keys k WHERE k.chat_no = h.chat_no) \
     FROM chat_numbers n JOIN chat_heads h ON h.chat_no = n.chat_no \
     LEFT JOIN tool_invocations t ON t.rowid = h.claims_head WHERE n.chat_id = ?";
/// [`append`]'s new row.
pub(crate) const APPEND_SQL: &str = "INSERT INTO chat_log \
     (chat_no, prev, seq_floor, idx_floor, events, messages, state) VALUES (?, ?, ?, ?, ?, ?, ?)";
/// [`append`]'s move of the chat's heads.
pub(crate) const MOVE_HEAD_SQL: &str = "UPDATE chat_heads SET log_head = ?, last_seq = ?, \
     next_idx = ?, state_row = COALESCE(?, state_row) WHERE chat_no = ?";

/// The chat's heads row; `None` for an unknown chat.
pub(crate) fn heads(db: &Db<'_>, chat_id: &str) -> Result<Option<Heads>, StoreError> {
    if let Some(kept) = db.kept_heads(chat_id) {
        return Ok(Some(kept));
    }
    let read = db.with(Held::ChatHeads, |statement| {
        Ok(statement
            .query_row([chat_id], |row| {
                Ok(Heads {
                    chat_no: row.get(0)?,
                    log_row: row.get(1)?,
                    last_seq: row.get(2)?,
                    next_idx: row.get(3)?,
                    claims_head: row.get(4)?,
                    unindexed_claims: row.get(5)?,
                    head_filter: row.get(6)?,
                    head_prev: row.get(7)?,
                    indexed_keys: row.get(8)?,
                })
            })
            .optional()?)
    })?;
    if let Some(heads) = read {
        db.remember_heads(chat_id, heads);
    }
    Ok(read)
}

/// Appends one row with `events`, `messages` and `state` (any may be empty) to the chat's log
/// and moves its head: one row written at the table's end and one update of the chat's small
/// `chat_heads` row. A completed state is also written to the chat's `chats` row, once, for
/// the listing and retention queries that read it there.
///
/// Every seq must lie above the chat's last stored seq and every idx at or above its next
/// idx; in any order within the flush, no repeats. Otherwise: [`StoreError::Conflict`] and
/// nothing written.
pub(crate) fn append(
    db: &Db<'_>,
    chat_id: &str,
    events: &[StoredEvent],
    messages: &[StoredMessage],
    state: Option<&ChatState>,
) -> Result<(), StoreError> {
    let head = heads(db, chat_id)?.ok_or_else(|| StoreError::NotFound(chat_id.to_owned()))?;
    let mut events: Vec<&StoredEvent> = events.iter().collect();
    events.sort_unstable_by_key(|e| e.seq);
    let mut messages: Vec<&StoredMessage> = messages.iter().collect();
    messages.sort_unstable_by_key(|m| m.idx);
    // Packing first: it refuses numbers beyond SQLite's range as invalid input.
    let packed_events = (!events.is_empty())
        .then(|| pack_events(&events))
        .transpose()?;
    let packed_messages = (!messages.is_empty())
        .then(|| pack_messages(&messages))
        .transpose()?;
    let packed_state = state.map(pack_state).transpose()?;
    let last_seq = ascending_from(
        events.iter().map(|e| e.seq),
        head.last_seq + 1,
        head.last_seq,
    )
    .map_err(|seq| {
        StoreError::Conflict(format!(
            "event seq {seq} of chat '{chat_id}' is not above its last stored seq {} \
             (or repeats in the flush)",
            head.last_seq
        ))
    })?;
    let next_idx = ascending_from(
        messages.iter().map(|m| m.idx),
        head.next_idx,
        head.next_idx - 1,
    )
    .map_err(|idx| {
        StoreError::Conflict(format!(
            "message idx {idx} of chat '{chat_id}' is already taken: the transcript continues \
             at {} (or the flush repeats it)",
            head.next_idx
        ))
    })? + 1;

    db.with(Held::AppendLog, |statement| {
        Ok(statement.execute(params![
            head.chat_no,
            head.log_row,
            head.last_seq,
            head.next_idx,
            packed_events,
            packed_messages,
            packed_state
        ])?)
    })?;
    let row = db.last_insert_rowid();
    db.with(Held::MoveLogHead, |statement| {
        Ok(statement.execute(params![
            row,
            last_seq,
            next_idx,
            state.map(|_| row),
            head.chat_no
        ])?)
    })?;
    db.remember_heads(
        chat_id,
        Heads {
            log_row: Some(row),
            last_seq,
            next_idx,
            ..head
        },
    );
    if let Some(state) = state.filter(|s| s.status == crate::STATUS_COMPLETED) {
        crate::chats::save_completed_state(db, chat_id, state)?;
    }
    Ok(())
}

/// Marks the chat's seqs up to `seq` taken (`chat_heads.seqs_taken`, migration 11), whether
/// or not their events are stored, in place of the last mark. Unknown chat: nothing to mark
/// (it adds no row, as removing a UI call adds none).
pub(crate) fn take_seqs_through(db: &Db<'_>, chat_id: &str, seq: u64) -> Result<(), StoreError> {
    let Some(head) = heads(db, chat_id)? else {
        return Ok(());
    };
    let seq = u64_to_sql(seq, "event seq")?;
    db.prepare_cached("UPDATE chat_heads SET seqs_taken = ? WHERE chat_no = ?")?
        .execute(params![seq, head.chat_no])?;
    Ok(())
}

/// Checks that `values` (sorted) start at `first_allowed` or above and never repeat; returns
/// the last value (`none` when there are none), or the offending value.
fn ascending_from(
    values: impl Iterator<Item = u64>,
    first_allowed: i64,
    none: i64,
) -> Result<i64, u64> {
    let mut last = none;
    let mut floor = first_allowed;
    for v in values {
        let at = i64::try_from(v).map_err(|_| v)?;
        if at < floor {
            return Err(v);
        }
        last = at;
        floor = at.saturating_add(1);
    }
    Ok(last)
}

/// Appends one field of the packed format.
fn put_field(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(itoa::Buffer::new().format(bytes.len()).as_bytes());
    out.push(b':');
    out.extend_from_slice(bytes);
}

/// A number field, as `to_string` writes the number, without its allocation.
fn put_number(out: &mut Vec<u8>, value: impl itoa::Integer) {
    put_field(out, itoa::Buffer::new().format(value).as_bytes());
}

fn pack_events(events: &[&StoredEvent]) -> Result<Vec<u8>, StoreError> {
    let size: usize = events
        .iter()
        .map(|e| e.event_type.len() + e.json.len() + 32)
        .sum();
    let mut out = Vec::with_capacity(size);
    for e in events {
        u64_to_sql(e.seq, "event seq")?;
        put_number(&mut out, e.seq);
        put_field(&mut out, e.event_type.as_bytes());
        put_field(&mut out, e.json.as_bytes());
    }
    Ok(out)
}

fn pack_messages(messages: &[&StoredMessage]) -> Result<Vec<u8>, StoreError> {
    // Sized up front (as `pack_events` is): grown field by field, a flush's buffer was
    // reallocated and copied several times.
    let size: usize = messages
        .iter()
        .map(|m| {
            m.message_id.len()
                + m.role.len()
                + m.agent.as_ref().map_or(0, |a| a.len())
                + m.content.len()
                + m.raw.get().len()
                + 64
        })
        .sum();
    let mut out = Vec::with_capacity(size);
    // Scratch buffer for the agent field, reused for every message.
    let mut agent = Vec::new();
    for m in messages {
        u64_to_sql(m.idx, "message idx")?;
        put_number(&mut out, m.idx);
        put_field(&mut out, m.message_id.as_bytes());
        put_field(&mut out, m.role.as_bytes());
        agent.clear();
        match &m.agent {
            None => agent.push(b'-'),
            Some(name) => {
                agent.push(b'+');
                agent.extend_from_slice(name.as_bytes());
            }
        }
        put_field(&mut out, &agent);
        put_field(&mut out, m.content.as_bytes());
        put_field(&mut out, if m.ui_hidden { b"1" } else { b"0" });
        put_field(&mut out, m.raw.get().as_bytes());
    }
    Ok(out)
}

fn pack_state(state: &ChatState) -> Result<Vec<u8>, StoreError> {
    let context = tessera_json::to_vec(&state.context)?;
    let mut out = Vec::with_capacity(context.len() + state.current_agent.len() + 48);
    put_field(&mut out, state.status.as_bytes());
    put_field(&mut out, state.current_agent.as_bytes());
    put_number(&mut out, u64::from(state.turn));
    put_number(&mut out, u64::from(state.consecutive));
    put_field(&mut out, &context);
    // Signed: a clock before 1970 is stored as it was given.
    put_number(&mut out, state.updated_at_ms);
    Ok(out)
}

/// The state packed in a log row.
pub(crate) fn unpack_state(packed: &[u8]) -> Result<ChatState, StoreError> {
    let mut fields = Fields::new(packed);
    let status = fields.text()?;
    let current_agent = fields.text()?;
    let turn = fields.number()?;
    let consecutive = fields.number()?;
    let context = match serde_json::from_slice(fields.next()?) {
        Ok(serde_json::Value::Object(map)) => Arc::new(map),
        _ => return Err(corrupt("a context that is not a JSON object")),
    };
    let updated_at_ms = fields.number()?;
    if !fields.is_empty() {
        return Err(corrupt("a state with extra fields"));
    }
    Ok(ChatState {
        status,
        current_agent,
        turn,
        consecutive,
        context,
        updated_at_ms,
    })
}

/// Reads the fields of a packed value in order.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn new(packed: &'a [u8]) -> Self {
        Self { rest: packed }
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    fn next(&mut self) -> Result<&'a [u8], StoreError> {
        let colon = self
            .rest
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| corrupt("a field without its length"))?;
        let len: usize = parse_decimal(&self.rest[..colon])
            .ok_or_else(|| corrupt("a field length that is not a number"))?;
        let start = colon + 1;
        let end = start
            .checked_add(len)
            .filter(|&end| end <= self.rest.len())
            .ok_or_else(|| corrupt("a field longer than the row"))?;
        let field = &self.rest[start..end];
        self.rest = &self.rest[end..];
        Ok(field)
    }

    fn text(&mut self) -> Result<String, StoreError> {
        owned_text(self.next()?)
    }

    /// The next field as shared text, copied once.
    fn shared_text(&mut self) -> Result<Arc<str>, StoreError> {
        utf8(self.next()?).map(Arc::from)
    }

    fn number<T: std::str::FromStr>(&mut self) -> Result<T, StoreError> {
        parse_decimal(self.next()?).ok_or_else(|| corrupt("a number field that is not a number"))
    }
}

/// A number written in decimal digits (with a sign for signed types).
fn parse_decimal<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

fn owned_text(bytes: &[u8]) -> Result<String, StoreError> {
    utf8(bytes).map(str::to_owned)
}

fn utf8(bytes: &[u8]) -> Result<&str, StoreError> {
    std::str::from_utf8(bytes).map_err(|_| corrupt("a text field that is not UTF-8"))
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("chat log row holds {what}"))
}

fn unpack_events(packed: &[u8], out: &mut Vec<StoredEvent>) -> Result<(), StoreError> {
    let mut fields = Fields::new(packed);
    while !fields.is_empty() {
        out.push(StoredEvent {
            seq: fields.number()?,
            event_type: fields.text()?.into(),
            json: fields.shared_text()?,
        });
    }
    Ok(())
}

fn unpack_messages(packed: &[u8], out: &mut Vec<StoredMessage>) -> Result<(), StoreError> {
    let mut fields = Fields::new(packed);
    while !fields.is_empty() {
        let idx = fields.number()?;
        let message_id = fields.text()?;
        let role = fields.text()?.into();
        let agent = match fields.next()? {
            [b'-'] => None,
            [b'+', name @ ..] => Some(utf8(name).map(Arc::from)?),
            _ => return Err(corrupt("an agent field without its marker")),
        };
        let content = fields.shared_text()?;
        let ui_hidden = match fields.next()? {
            b"0" => false,
            b"1" => true,
            _ => return Err(corrupt("a ui_hidden field that is not 0 or 1")),
        };
        let raw = std::str::from_utf8(fields.next()?)
            .map_err(|_| corrupt("raw JSON that is not UTF-8"))?;
        out.push(StoredMessage {
            idx,
            message_id,
            role,
            agent,
            content,
            ui_hidden,
            raw: json_text_from_sql(raw.to_owned(), "message raw")?,
        });
    }
    Ok(())
}

/// The packed `$column` of the chat's rows (oldest first) from the newest back to the first
/// row whose `$floor` is at or below `?2`: the rows that may hold what a read starts from.
macro_rules! walk_sql {
    ($column:literal, $floor:literal) => {
        concat!(
            "WITH RECURSIVE walk(r, prev, floor, packed) AS (",
            " SELECT l.rowid, l.prev, l.",
            $floor,
            ", l.",
            $column,
            " FROM chat_numbers n JOIN chat_heads h ON h.chat_no = n.chat_no",
            " JOIN chat_log l ON l.rowid = h.log_head WHERE n.chat_id = ?1",
            " UNION ALL",
            " SELECT l.rowid, l.prev, l.",
            $floor,
            ", l.",
            $column,
            " FROM walk w JOIN chat_log l ON l.rowid = w.prev WHERE w.floor > ?2",
            ") SELECT packed FROM walk WHERE packed IS NOT NULL ORDER BY r"
        )
    };
}

/// Everything `sql` (a [`walk_sql`] query) finds of the chat from `from` on, unpacked in row
/// order: the rows that may hold it, oldest first, so the caller filters the first ones.
async fn read_chain<T>(
    pool: &SqlitePool,
    sql: &'static str,
    chat_id: &str,
    from: i64,
    unpack: fn(&[u8], &mut Vec<T>) -> Result<(), StoreError>,
) -> Result<Vec<T>, StoreError> {
    let rows = sqlx::query(sql)
        .bind(chat_id)
        .bind(from)
        .fetch_all(pool)
        .await?;
    let mut out = Vec::new();
    for row in &rows {
        unpack(row.try_get(0)?, &mut out)?;
    }
    Ok(out)
}

/// Up to `limit` events with seq > `after`, ordered by seq.
pub(crate) async fn events_after(
    pool: SqlitePool,
    chat_id: String,
    after: u64,
    limit: u32,
) -> Result<Vec<StoredEvent>, StoreError> {
    // A seq beyond i64::MAX is never stored.
    let Ok(after_sql) = i64::try_from(after) else {
        return Ok(Vec::new());
    };
    let events = read_chain(
        &pool,
        walk_sql!("events", "seq_floor"),
        &chat_id,
        after_sql,
        unpack_events,
    )
    .await?;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    Ok(events
        .into_iter()
        .filter(|e| e.seq > after)
        .take(limit)
        .collect())
}

/// The chat's highest stored seq, 0 for an empty log (or an unknown chat).
pub(crate) async fn last_seq(pool: SqlitePool, chat_id: String) -> Result<u64, StoreError> {
    let last: Option<i64> = sqlx::query_scalar(
        "SELECT h.last_seq FROM chat_numbers n JOIN chat_heads h ON h.chat_no = n.chat_no \
         WHERE n.chat_id = ?",
    )
    .bind(&chat_id)
    .fetch_optional(&pool)
    .await?;
    sql_to_u64(last.unwrap_or(0), "event seq")
}

/// The chat's highest taken seq: its last stored event's, or a higher seq marked taken
/// ([`take_seqs_through`]); 0 for an unknown chat.
pub(crate) async fn last_seq_taken(pool: SqlitePool, chat_id: String) -> Result<u64, StoreError> {
    let last: Option<i64> = sqlx::query_scalar(
        "SELECT MAX(h.last_seq, h.seqs_taken) FROM chat_numbers n \
         JOIN chat_heads h ON h.chat_no = n.chat_no WHERE n.chat_id = ?",
    )
    .bind(&chat_id)
    .fetch_optional(&pool)
    .await?;
    sql_to_u64(last.unwrap_or(0), "event seq")
}

/// Up to `limit` messages with idx >= `from`, ordered by idx (`limit` `None`: all of them).
pub(crate) async fn messages_from(
    pool: SqlitePool,
    chat_id: String,
    from: u64,
    limit: Option<u32>,
) -> Result<Vec<StoredMessage>, StoreError> {
    // An idx beyond i64::MAX is never stored.
    let Ok(from_sql) = i64::try_from(from) else {
        return Ok(Vec::new());
    };
    let messages = read_chain(
        &pool,
        walk_sql!("messages", "idx_floor"),
        &chat_id,
        from_sql,
        unpack_messages,
    )
    .await?;
    let limit = limit.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    Ok(messages
        .into_iter()
        .filter(|m| m.idx >= from)
        .take(limit)
        .collect())
}

/// Deletes every log row of the chat (before the chat's own row goes).
pub(crate) fn delete(conn: &Connection, chat_id: &str) -> Result<(), StoreError> {
    conn.prepare_cached(
        "WITH RECURSIVE walk(r) AS (\
           SELECT h.log_head FROM chat_numbers n JOIN chat_heads h ON h.chat_no = n.chat_no \
           WHERE n.chat_id = ? AND h.log_head IS NOT NULL \
           UNION ALL \
           SELECT l.prev FROM walk w JOIN chat_log l ON l.rowid = w.r WHERE l.prev IS NOT NULL) \
         DELETE FROM chat_log WHERE rowid IN (SELECT r FROM walk)",
    )?
    .execute([chat_id])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JsonText;
    use serde_json::json;

    fn message(idx: u64, agent: Option<&str>) -> StoredMessage {
        StoredMessage {
            idx,
            message_id: format!("m{idx}"),
            role: "assistant".into(),
            agent: agent.map(Arc::from),
            content: "multi-byte: héllo, 12:34, \"quoted\"".into(),
            ui_hidden: idx % 2 == 1,
            raw: JsonText::new(&json!({"role": "assistant", "content": "x:1"}))
                .unwrap_or_else(|e| panic!("{e}")),
        }
    }

    #[test]
    fn packed_messages_and_events_read_back_unchanged() {
        let messages = [
            message(0, None),
            message(1, Some("triage")),
            message(2, Some("")),
        ];
        let packed = pack_messages(&messages.iter().collect::<Vec<_>>()).unwrap();
        let mut back = Vec::new();
        unpack_messages(&packed, &mut back).unwrap();
        assert_eq!(back, messages);

        let events = [
            StoredEvent {
                seq: 7,
                event_type: "chat.text".into(),
                json: r#"{"text":"a:b 10:"}"#.into(),
            },
            StoredEvent {
                seq: 8,
                event_type: "".into(),
                json: "not json at all".into(),
            },
        ];
        let packed = pack_events(&events.iter().collect::<Vec<_>>()).unwrap();
        let mut back = Vec::new();
        unpack_events(&packed, &mut back).unwrap();
        assert_eq!(back, events);
    }

    #[test]
    fn a_packed_state_reads_back_unchanged() {
        let state = ChatState {
            status: "running".to_owned(),
            current_agent: "triage:1".to_owned(),
            turn: 41,
            consecutive: 2,
            context: Arc::new(
                json!({"k": "v:1", "n": [1, 2]})
                    .as_object()
                    .cloned()
                    .unwrap(),
            ),
            updated_at_ms: -5,
        };
        assert_eq!(unpack_state(&pack_state(&state).unwrap()).unwrap(), state);
        // The time is written as `to_string` wrote it before (rows already stored read the
        // same), at both ends of its range.
        for updated_at_ms in [0, -5, 1_764_000_000_123, i64::MIN, i64::MAX] {
            let state = ChatState {
                updated_at_ms,
                ..state.clone()
            };
            let packed = pack_state(&state).unwrap();
            let text = updated_at_ms.to_string();
            assert!(packed.ends_with(format!("{}:{text}", text.len()).as_bytes()));
            assert_eq!(unpack_state(&packed).unwrap(), state);
        }
        assert!(matches!(
            unpack_state(b"7:running0:1:41:01:[]1:0"),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn a_damaged_row_is_reported_as_corrupt() {
        let mut out = Vec::new();
        for damaged in [
            &b"3:abc"[..],
            b"1:7",
            b"x:7",
            b"99:short",
            b"1:79:chat.text",
        ] {
            out.clear();
            assert!(
                matches!(
                    unpack_events(damaged, &mut out),
                    Err(StoreError::Corrupt(_))
                ),
                "{:?}",
                String::from_utf8_lossy(damaged)
            );
        }
    }

    #[test]
    fn order_checks_refuse_repeats_and_values_below_the_floor() {
        assert_eq!(ascending_from([4, 5, 9].into_iter(), 4, 3), Ok(9));
        assert_eq!(ascending_from(std::iter::empty(), 4, 3), Ok(3));
        assert_eq!(ascending_from([3, 4].into_iter(), 4, 3), Err(3));
        assert_eq!(ascending_from([4, 4].into_iter(), 4, 3), Err(4));
        assert_eq!(ascending_from([u64::MAX].into_iter(), 0, -1), Err(u64::MAX));
    }
}

/// The heads a writer's [`Db`] keeps between transactions (see `db`): read from the database
/// once, then from memory, and never stale where another connection, a rollback or a deletion
/// changed the row.
#[cfg(test)]
mod kept_heads_tests {
    use super::*;
    use crate::claims_journal::database_with_a_chat;

    const LAST_SEQ_TO_7: &str = "UPDATE chat_heads SET last_seq = 7 \
         WHERE chat_no = (SELECT chat_no FROM chat_numbers WHERE chat_id = 'c1')";

    fn scratch() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("h.db");
        database_with_a_chat(&path);
        let conn = Connection::open(&path).unwrap_or_else(|e| panic!("{e}"));
        (dir, conn)
    }

    fn last_seq(db: &Db<'_>) -> i64 {
        heads(db, "c1")
            .unwrap_or_else(|e| panic!("{e}"))
            .map_or(-1, |h| h.last_seq)
    }

    fn ok<T>(result: Result<T, StoreError>) -> T {
        result.unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`last_seq`] read in a transaction of its own, begun with `begin`.
    fn last_seq_in(db: &Db<'_>, begin: Held) -> i64 {
        ok(db.begin(begin));
        let seq = last_seq(db);
        ok(db.commit());
        seq
    }

    #[test]
    fn heads_read_in_one_transaction_are_kept_for_the_next() {
        let (_dir, conn) = scratch();
        let db = Db::new(&conn);
        assert_eq!(last_seq_in(&db, Held::BeginImmediate), 0);
        // Changed behind the cache's back on the same connection (which `data_version` does
        // not count): a later transaction still answers from memory, so the row was kept...
        conn.execute(LAST_SEQ_TO_7, [])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            last_seq_in(&db, Held::Begin),
            0,
            "kept from the last transaction"
        );
        // ...while outside a transaction begun by `Db::begin` the database is read.
        assert_eq!(last_seq(&db), 7);
    }

    #[test]
    fn another_connections_commit_is_seen_by_the_next_transaction() {
        let (dir, conn) = scratch();
        let db = Db::new(&conn);
        assert_eq!(last_seq_in(&db, Held::Begin), 0);
        let other = Connection::open(dir.path().join("h.db")).unwrap_or_else(|e| panic!("{e}"));
        other
            .execute(LAST_SEQ_TO_7, [])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(last_seq_in(&db, Held::Begin), 7);
    }

    #[test]
    fn heads_moved_by_an_append_are_kept_and_a_rollback_forgets_them() {
        let (_dir, conn) = scratch();
        let db = Db::new(&conn);
        let event = StoredEvent {
            seq: 1,
            event_type: "chat.text".into(),
            json: Arc::from(r#"{"type":"chat.text","seq":1}"#),
        };
        ok(db.begin(Held::BeginImmediate));
        ok(append(&db, "c1", std::slice::from_ref(&event), &[], None));
        assert_eq!(last_seq(&db), 1, "the append's own heads");
        ok(db.rollback());
        ok(db.begin(Held::BeginImmediate));
        assert_eq!(last_seq(&db), 0, "the rolled-back append is forgotten");
        ok(append(&db, "c1", std::slice::from_ref(&event), &[], None));
        ok(db.commit());
        assert_eq!(last_seq_in(&db, Held::Begin), 1);
        let stored: i64 = conn
            .query_row("SELECT last_seq FROM chat_heads", [], |r| r.get(0))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stored, 1);
    }

    #[test]
    fn a_deleted_chat_has_no_kept_heads() {
        let (_dir, conn) = scratch();
        let db = Db::new(&conn);
        ok(db.begin(Held::BeginImmediate));
        assert_eq!(last_seq(&db), 0);
        assert!(ok(crate::chats::delete(&db, "c1")));
        assert!(ok(heads(&db, "c1")).is_none());
        ok(db.commit());
    }
}
