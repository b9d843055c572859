//! Event envelopes as JSON text, on the hot path of every published event: the timestamp is
//! formatted once per millisecond per thread, and the JSON is written into a reused buffer, so
//! an event costs one allocation (its shared text).

use std::cell::Cell;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tessera_protocol::{ServerEvent, rfc3339_now};

thread_local! {
    /// The last timestamp formatted on this thread, as a JSON string, and the Unix millisecond
    /// it shows. Per thread, so no lock; every arbiter is one thread.
    static NOW: Cell<(u128, String)> = const { Cell::new((0, String::new())) };
    /// The serialization buffer, kept between events.
    static BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// The largest serialization buffer kept for the next event, in bytes.
const MAX_KEPT_BUFFER: usize = 64 * 1024;

/// A chat id as a JSON string, escaped once for all the chat's envelopes.
#[derive(Debug, Clone)]
pub(crate) struct ChatIdJson(Box<str>);

impl ChatIdJson {
    pub(crate) fn new(chat_id: &str) -> Self {
        Self(json_string(chat_id).into())
    }
}

/// `s` as JSON string text, quotes included.
fn json_string(s: &str) -> String {
    // Serializing a string into a String cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

fn unix_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Calls `f` with the current UTC time as `rfc3339_now` formats it, as a JSON string.
fn with_timestamp<R>(f: impl FnOnce(&str) -> R) -> R {
    // Taken out and put back rather than borrowed: no borrow can be left open by a panic.
    let (mut ms, mut text) = NOW.take();
    let now = unix_millis();
    if now != ms || text.is_empty() {
        let fresh = json_string(&rfc3339_now());
        // `rfc3339_now` reads the clock itself; its text shows `now` only if the clock did not
        // pass `now` meanwhile. Otherwise it is still the current time, just not cached.
        if unix_millis() != now {
            NOW.set((ms, text));
            return f(&fresh);
        }
        (ms, text) = (now, fresh);
    }
    let result = f(&text);
    NOW.set((ms, text));
    result
}

/// The event `event` of chat `chat_id` with sequence number `seq`, in its envelope, stamped
/// now. The same text as `Envelope::to_json`.
pub(crate) fn envelope_json(seq: u64, chat_id: &ChatIdJson, event: &ServerEvent) -> Arc<str> {
    with_timestamp(|timestamp| {
        let mut buffer = BUFFER.take();
        buffer.clear();
        let text = match write_envelope(&mut buffer, seq, &chat_id.0, timestamp, event) {
            // serde_json writes UTF-8 only; checked anyway rather than trusted unsafely.
            Ok(()) => std::str::from_utf8(&buffer).map_or_else(|_| Arc::from(""), Arc::from),
            // As `Envelope::to_json`: plain data cannot fail to serialize.
            Err(_) => Arc::from(""),
        };
        // A rare huge event (a large tool result) does not pin its buffer to the thread.
        if buffer.capacity() <= MAX_KEPT_BUFFER {
            BUFFER.set(buffer);
        }
        text
    })
}

/// Writes what `Envelope::serialize` writes, field by field, with the chat id and timestamp
/// already JSON strings: on small events, serde's generic map serialization and escaping of
/// these fields cost as much as the event data. Kept identical by the tests below.
fn write_envelope(
    out: &mut Vec<u8>,
    seq: u64,
    chat_id_json: &str,
    timestamp_json: &str,
    event: &ServerEvent,
) -> serde_json::Result<()> {
    out.extend_from_slice(b"{\"type\":");
    let type_name = event.type_name();
    // Type names are plain literals ("chat.text"); checked without an early exit so the
    // check stays cheap, escaped by serde_json should one ever need it.
    let plain = type_name
        .bytes()
        .fold(true, |ok, b| ok & (b >= 0x20) & (b != b'"') & (b != b'\\'));
    if plain {
        out.push(b'"');
        out.extend_from_slice(type_name.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, type_name)?;
    }
    out.extend_from_slice(b",\"seq\":");
    serde_json::to_writer(&mut *out, &seq)?;
    out.extend_from_slice(b",\"chat_id\":");
    out.extend_from_slice(chat_id_json.as_bytes());
    out.extend_from_slice(b",\"timestamp\":");
    out.extend_from_slice(timestamp_json.as_bytes());
    out.extend_from_slice(b",\"data\":");
    serde_json::to_writer(&mut *out, event)?;
    out.push(b'}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tessera_protocol::{Envelope, ErrorCode};

    fn written(seq: u64, chat_id: &str, timestamp: &str, event: &ServerEvent) -> String {
        let mut out = Vec::new();
        let (chat_id, timestamp) = (json_string(chat_id), json_string(timestamp));
        assert!(write_envelope(&mut out, seq, &chat_id, &timestamp, event).is_ok());
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn same_text_as_the_protocol_envelope() {
        let events = [
            ServerEvent::InputRequest {
                agent: "A \"quoted\" agent".into(),
            },
            ServerEvent::error(ErrorCode::Internal, "line\nbreak", true),
            ServerEvent::ToolCall(
                json!({"kind": "tool_call", "payload": {"tool_args": {"é": [1, null]}}}),
            ),
        ];
        let ids = ["chat_1", "chat \"odd\" \\ id\u{1}", "chat_é"];
        for event in &events {
            for chat_id in ids {
                for seq in [0, 7, u64::MAX] {
                    let expected = Envelope {
                        seq,
                        chat_id,
                        timestamp: "2026-01-01T00:00:00.000Z",
                        event,
                    }
                    .to_json();
                    let text = written(seq, chat_id, "2026-01-01T00:00:00.000Z", event);
                    assert_eq!(text, expected);
                }
            }
        }
    }

    #[test]
    fn stamps_the_current_time() {
        let event = ServerEvent::InputRequest { agent: "A".into() };
        let text = envelope_json(3, &ChatIdJson::new("chat_1"), &event);
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let timestamp = parsed["timestamp"].as_str().unwrap_or_default().to_owned();
        assert_eq!(timestamp.len(), "2026-01-01T00:00:00.000Z".len());
        let expected = Envelope {
            seq: 3,
            chat_id: "chat_1",
            timestamp: &timestamp,
            event: &event,
        }
        .to_json();
        assert_eq!(&*text, expected);
    }
}
