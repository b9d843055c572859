//! Event envelopes as JSON text, on the hot path of every published event, and the chat's event
//! log. The timestamp is formatted once per millisecond per thread and the JSON is written into
//! a reused buffer by the protocol's envelope writer. The log keeps each event compactly and
//! rebuilds its exact text on replay.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tessera_protocol::{Envelope, ServerEvent, json_string, write_unix_millis};

thread_local! {
    /// The last timestamp formatted on this thread, as a JSON string, and the Unix millisecond
    /// it shows. Per thread, so no lock; every arbiter is one thread.
    static NOW: Cell<(i64, String)> = const { Cell::new((0, String::new())) };
    /// The serialization buffer, kept between events.
    static BUFFER: Cell<String> = const { Cell::new(String::new()) };
}

/// The largest serialization buffer kept for the next event, in bytes.
const MAX_KEPT_BUFFER: usize = 64 * 1024;

/// A chat id as a JSON string, escaped once for all the chat's envelopes.
#[derive(Debug, Clone)]
pub struct ChatIdJson(Box<str>);

impl ChatIdJson {
    pub fn new(chat_id: &str) -> Self {
        Self(json_string(chat_id).into())
    }
}

fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The timestamp of `ms` as a JSON string (replay; live events reuse one per thread).
fn timestamp_json(ms: i64) -> String {
    let mut out = String::with_capacity(26);
    write_timestamp_json(&mut out, ms);
    out
}

/// Replaces `out` with the timestamp of `ms` as a JSON string, as `rfc3339_now` formats it,
/// in `out`'s own room. Only digits and `-T:.Z`: nothing to escape.
fn write_timestamp_json(out: &mut String, ms: i64) {
    out.clear();
    out.push('"');
    write_unix_millis(out, ms);
    out.push('"');
}

/// Calls `f` with the current Unix millisecond and its timestamp as a JSON string.
fn with_timestamp<R>(f: impl FnOnce(i64, &str) -> R) -> R {
    // Taken out and put back rather than borrowed: no borrow can be left open by a panic.
    let (mut ms, mut text) = NOW.take();
    let now = unix_millis();
    if now != ms || text.is_empty() {
        ms = now;
        write_timestamp_json(&mut text, now);
    }
    let result = f(ms, &text);
    NOW.set((ms, text));
    result
}

/// Calls `f` with the thread's cleared serialization buffer.
fn with_buffer<R>(f: impl FnOnce(&mut String) -> R) -> R {
    let mut buffer = BUFFER.take();
    buffer.clear();
    let result = f(&mut buffer);
    // A rare huge event (a large tool result) does not pin its buffer to the thread.
    if buffer.capacity() <= MAX_KEPT_BUFFER {
        BUFFER.set(buffer);
    }
    result
}

/// A record's bytes as text: they were written from text, and are checked rather than trusted
/// unsafely (an empty event if they were not).
fn record_text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

/// The event `event` of chat `chat_id` with sequence number `seq`, in its envelope, stamped
/// now. The same text as `Envelope::to_json`.
pub(crate) fn envelope_json(seq: u64, chat_id: &ChatIdJson, event: &ServerEvent) -> Arc<str> {
    write_envelope(seq, chat_id, event, |text| Arc::from(text))
}

/// [`envelope_json`] as a `String` of exact length, for an event sent once and not logged (a
/// socket's acks and errors): a WebSocket frame takes the `String`'s buffer as it is.
pub fn envelope_string(seq: u64, chat_id: &ChatIdJson, event: &ServerEvent) -> String {
    write_envelope(seq, chat_id, event, |text| String::from(text))
}

/// Writes the envelope into the thread's buffer, stamped with the thread's timestamp, and
/// hands `finish` its text.
fn write_envelope<R>(
    seq: u64,
    chat_id: &ChatIdJson,
    event: &ServerEvent,
    finish: impl FnOnce(&str) -> R,
) -> R {
    with_timestamp(|_, timestamp| {
        with_buffer(|buffer| {
            let text = match Envelope::write_prepared(buffer, seq, &chat_id.0, timestamp, event) {
                Ok(_) => buffer.as_str(),
                // As `Envelope::to_json`: plain data cannot fail to serialize.
                Err(_) => "",
            };
            finish(text)
        })
    })
}

/// The seq of an event's envelope text (0 for a connection's own events, which have none, or
/// for text that is no envelope).
pub fn envelope_seq(text: &[u8]) -> u64 {
    #[derive(serde::Deserialize)]
    struct SeqOnly {
        #[serde(default)]
        seq: u64,
    }
    serde_json::from_slice::<SeqOnly>(text).map_or(0, |s| s.seq)
}

/// The `last_seq` of a `chat.resume_boundary` envelope text (`None` for any other text): the
/// last event a new subscriber has been given, as the session saw it when it subscribed.
pub fn resume_boundary_last_seq(text: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Boundary<'a> {
        #[serde(rename = "type", borrow)]
        kind: &'a str,
        data: Option<BoundaryData>,
    }
    #[derive(serde::Deserialize)]
    struct BoundaryData {
        last_seq: Option<u64>,
    }
    serde_json::from_slice::<Boundary<'_>>(text)
        .ok()
        .filter(|b| b.kind == "chat.resume_boundary")
        .and_then(|b| b.data?.last_seq)
}

/// A chat's published events, for replay to late subscribers. An envelope's `seq` and
/// `chat_id` follow from the event's position and the chat, and its type and timestamp fit in
/// a few bytes, so a record keeps the `data` text and those bytes only: about 40% less memory
/// than the whole text, which was almost half the engine's heap. Replay rebuilds the text with
/// the same writer, so it is byte for byte what was sent live.
///
/// Streamed deltas are not kept once their message is final: when a message's `chat.text` is
/// logged, the records of its `chat.text_delta` events are emptied (their seqs stay taken),
/// and replays skip them — a resuming client gets the complete `chat.text` instead (see
/// `docs/protocol.md`). A long streamed answer otherwise kept every token in memory for the
/// chat's whole life.
///
/// A chat backed by a store keeps only its last events in memory ([`EventLog::forget_through`]):
/// a resume from further back reads the store. Without that, a chat's memory grew by every
/// event it ever published, about 1.6 KB a turn and the largest single item of a chat's memory
/// (docs/performance-log.md, twentieth session).
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    /// Record `i` holds the event with seq `forgotten + i + 1`:
    /// `[type index + 1][ms, 8 bytes LE][data]`, or `[VERBATIM][whole text]` for an event known
    /// only as text (restored from the store), or nothing for a dropped delta.
    records: VecDeque<Box<[u8]>>,
    /// The events up to this seq left memory (the store holds them).
    forgotten: u64,
    /// The seqs of the delta records of messages still streaming.
    streaming: DeltasByMessage,
}

/// Tag of a record that holds an event's whole text.
const VERBATIM: u8 = 0;

impl EventLog {
    /// An empty log whose next event has seq `after + 1` (older events are elsewhere).
    pub(crate) fn after(after: u64) -> Self {
        Self {
            forgotten: after,
            ..Self::default()
        }
    }

    /// The seq of the last logged event (0 when there is none).
    pub(crate) fn last_seq(&self) -> u64 {
        self.forgotten + self.records.len() as u64
    }

    /// The events up to this seq are no longer in memory.
    pub(crate) fn forgotten(&self) -> u64 {
        self.forgotten
    }

    /// Lets the oldest events go, down to the last `keep`, but only those the store holds
    /// (seq up to `stored`) and none from the first delta of a message still streaming on
    /// (its deltas are dropped when it is final, which a forgotten record could not be).
    pub(crate) fn forget_through(&mut self, stored: u64, keep: usize) {
        let streaming_from = self.streaming.first_seq().unwrap_or(u64::MAX);
        let limit = stored.min(streaming_from.saturating_sub(1));
        while self.records.len() > keep && self.forgotten < limit {
            self.records.pop_front();
            self.forgotten += 1;
        }
    }

    /// Logs `event` as the next seq, stamped now; returns its envelope text.
    pub(crate) fn publish(&mut self, chat_id: &ChatIdJson, event: &ServerEvent) -> Arc<str> {
        let seq = self.last_seq() + 1;
        let type_name = event.type_name();
        let type_index = ServerEvent::TYPE_NAMES
            .iter()
            .position(|name| *name == type_name)
            .and_then(|i| u8::try_from(i + 1).ok());
        let (text, record) = with_timestamp(|ms, timestamp| {
            with_buffer(|buffer| {
                let Ok(data) = Envelope::write_prepared(buffer, seq, &chat_id.0, timestamp, event)
                else {
                    // As `Envelope::to_json`: plain data cannot fail to serialize.
                    return (Arc::from(""), Box::from([VERBATIM]));
                };
                let text = Arc::from(buffer.as_str());
                let record = match type_index {
                    Some(tag) => {
                        let data = &buffer.as_bytes()[data];
                        let mut record = Vec::with_capacity(9 + data.len());
                        record.push(tag);
                        record.extend_from_slice(&ms.to_le_bytes());
                        record.extend_from_slice(data);
                        record.into_boxed_slice()
                    }
                    None => verbatim(&text),
                };
                (text, record)
            })
        });
        self.records.push_back(record);
        match event {
            ServerEvent::TextDelta { message_id, .. } => self.note_delta(message_id),
            ServerEvent::Text { message_id, .. } => self.drop_deltas(message_id),
            _ => {}
        }
        text
    }

    /// Logs event `seq` as its whole text (an event restored from the store), dropping deltas
    /// as [`EventLog::publish`] does. The seqs before it that the store lacks (deltas whose
    /// message was final before they were stored) stay taken, as empty records like a dropped
    /// delta's, so every later event keeps its seq. A seq not above the last is ignored: the
    /// store gives them ascending.
    pub(crate) fn push_stored(&mut self, seq: u64, text: &str) {
        if seq <= self.last_seq() {
            return;
        }
        self.take_seqs_through(seq - 1);
        self.records.push_back(verbatim(text));
        self.track_stream(text, true);
    }

    /// Takes the seqs up to `seq` (taken in the store without an event: deltas never stored,
    /// and the seqs marked taken ahead of them) as empty records, so the next event's seq is
    /// above them.
    pub(crate) fn take_seqs_through(&mut self, seq: u64) {
        while self.last_seq() < seq {
            self.records.push_back(Box::default());
        }
    }

    /// Drops the deltas of the message whose `chat.text` is `text`, an event logged after
    /// these (a replay's later part, which memory holds); any other text changes nothing.
    pub(crate) fn finalized_later(&mut self, text: &str) {
        self.track_stream(text, false);
    }

    /// Notes the delta that `text`, just logged, is (when `logged`), or drops the deltas of
    /// the message whose final text it is.
    fn track_stream(&mut self, text: &str, logged: bool) {
        // Only `chat.text` and `chat.text_delta` events need a look inside.
        if !text.contains("\"chat.text") {
            return;
        }
        let Ok(event) = serde_json::from_str::<serde_json::Value>(text) else {
            return;
        };
        let Some(message_id) = event["data"]["message_id"].as_str() else {
            return;
        };
        match event["type"].as_str() {
            Some("chat.text_delta") if logged => self.note_delta(message_id),
            Some("chat.text") => self.drop_deltas(message_id),
            _ => {}
        }
    }

    /// The last record is a delta of `message_id`.
    fn note_delta(&mut self, message_id: &str) {
        self.streaming.note(message_id, self.last_seq());
    }

    /// `message_id` is final: its deltas leave the log.
    fn drop_deltas(&mut self, message_id: &str) {
        for seq in self.streaming.take(message_id) {
            let at = seq.checked_sub(self.forgotten + 1);
            if let Some(record) = at.and_then(|at| self.records.get_mut(usize::try_from(at).ok()?))
            {
                *record = Box::default();
            }
        }
    }

    /// The texts of the events after seq `after`, in order, exactly as they were published.
    #[cfg(test)]
    pub(crate) fn replay<'a>(
        &'a self,
        after: u64,
        chat_id: &'a ChatIdJson,
    ) -> impl Iterator<Item = Arc<str>> + 'a {
        self.replay_until(after, self.last_seq(), chat_id)
    }

    /// [`EventLog::replay`] of the events after seq `after` up to seq `until` (in a cluster,
    /// the last durable one), of those still in memory: none up to [`EventLog::forgotten`].
    pub(crate) fn replay_until<'a>(
        &'a self,
        after: u64,
        until: u64,
        chat_id: &'a ChatIdJson,
    ) -> impl Iterator<Item = Arc<str>> + 'a {
        let index = |seq: u64| {
            usize::try_from(seq.saturating_sub(self.forgotten))
                .map_or(self.records.len(), |i| i.min(self.records.len()))
        };
        let to = index(until);
        let from = index(after).min(to);
        let first_seq = self.forgotten.max(after) + 1;
        self.records
            .range(from..to)
            .zip(first_seq..)
            .filter(|(record, _)| !record.is_empty())
            .map(move |(record, seq)| rebuild(record, seq, chat_id))
    }
}

/// The seqs of streamed deltas, by the message they belong to: noted as they are published,
/// taken when the message's final text makes them unneeded (a chat streams one message at a
/// time, so this holds one or two entries).
#[derive(Debug, Default)]
pub(crate) struct DeltasByMessage(Vec<(Box<str>, Vec<u64>)>);

impl DeltasByMessage {
    /// Delta `seq` belongs to `message_id` (seqs are noted ascending).
    pub(crate) fn note(&mut self, message_id: &str, seq: u64) {
        match self.0.iter_mut().find(|(id, _)| &**id == message_id) {
            Some((_, seqs)) => seqs.push(seq),
            None => self.0.push((message_id.into(), vec![seq])),
        }
    }

    /// The seqs noted for `message_id`, ascending, now forgotten (none when there are none).
    pub(crate) fn take(&mut self, message_id: &str) -> Vec<u64> {
        match self.0.iter().position(|(id, _)| &**id == message_id) {
            Some(i) => self.0.swap_remove(i).1,
            None => Vec::new(),
        }
    }

    /// The lowest seq noted, if any.
    fn first_seq(&self) -> Option<u64> {
        self.0
            .iter()
            .filter_map(|(_, seqs)| seqs.first().copied())
            .min()
    }
}

fn verbatim(text: &str) -> Box<[u8]> {
    let mut record = Vec::with_capacity(1 + text.len());
    record.push(VERBATIM);
    record.extend_from_slice(text.as_bytes());
    record.into_boxed_slice()
}

/// The envelope text of `record`, the event with seq `seq`.
fn rebuild(record: &[u8], seq: u64, chat_id: &ChatIdJson) -> Arc<str> {
    let Some((&tag, rest)) = record.split_first() else {
        return Arc::from("");
    };
    let type_name = usize::from(tag)
        .checked_sub(1)
        .and_then(|i| ServerEvent::TYPE_NAMES.get(i));
    let (Some(type_name), Some((ms, data))) = (type_name, rest.split_first_chunk::<8>()) else {
        return Arc::from(record_text(rest).unwrap_or_default());
    };
    let timestamp = timestamp_json(i64::from_le_bytes(*ms));
    let Some(data) = record_text(data) else {
        return Arc::from("");
    };
    with_buffer(|buffer| {
        match Envelope::write_prepared_data(buffer, type_name, seq, &chat_id.0, &timestamp, data) {
            Ok(()) => Arc::from(buffer.as_str()),
            Err(_) => Arc::from(""),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tessera_protocol::ErrorCode;

    fn events() -> Vec<ServerEvent> {
        vec![
            ServerEvent::InputRequest {
                agent: "A \"quoted\" agent".into(),
            },
            ServerEvent::error(ErrorCode::Internal, "line\nbreak", true),
            ServerEvent::ToolCall(tessera_protocol::ToolCallEvent::Announced(
                tessera_protocol::ToolAnnouncement {
                    agent: "A".into(),
                    tool_name: "t".into(),
                    corr: "k".into(),
                    component_type: None,
                    workflow_name: "W".into(),
                    interaction: tessera_protocol::InteractionType::AgentTool,
                    tool_args: json!({"é": [1, null]})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                },
            )),
        ]
    }

    #[test]
    fn a_timestamp_written_in_place_is_the_json_string_of_the_formatted_time() {
        let mut reused = String::from("left over from an earlier, longer timestamp text");
        for ms in [
            0,
            951_782_400_123,
            1_790_000_000_999,
            -1,
            253_402_300_799_999,
        ] {
            write_timestamp_json(&mut reused, ms);
            let expected = json_string(&tessera_protocol::format_unix_millis(ms));
            assert_eq!(reused, expected);
            assert_eq!(timestamp_json(ms), expected);
        }
    }

    /// The timestamp inside an envelope text.
    fn timestamp_of(text: &str) -> String {
        let parsed: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        parsed["timestamp"].as_str().unwrap_or_default().to_owned()
    }

    #[test]
    fn stamps_the_current_time() {
        let event = ServerEvent::InputRequest { agent: "A".into() };
        let text = envelope_json(3, &ChatIdJson::new("chat_1"), &event);
        let timestamp = timestamp_of(&text);
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

    #[test]
    fn a_connection_event_is_the_envelope_text_in_a_string_of_its_own_length() {
        let event = ServerEvent::Ack {
            kind: "user_message".into(),
            client_msg_id: Some("m \"1\"".into()),
        };
        let text = envelope_string(0, &ChatIdJson::new("chat\\1"), &event);
        assert_eq!(
            text.len(),
            text.capacity(),
            "a frame takes the buffer without a copy"
        );
        let timestamp = timestamp_of(&text);
        let expected = Envelope {
            seq: 0,
            chat_id: "chat\\1",
            timestamp: &timestamp,
            event: &event,
        }
        .to_json();
        assert_eq!(text, expected);
    }

    fn delta(message_id: &str, text: &str) -> ServerEvent {
        ServerEvent::TextDelta {
            message_id: message_id.into(),
            agent: "A".into(),
            delta: text.into(),
        }
    }

    fn final_text(message_id: &str, text: &str) -> ServerEvent {
        ServerEvent::Text {
            message_id: message_id.into(),
            agent: "A".into(),
            role: "assistant".into(),
            content: text.into(),
            ui_hidden: false,
        }
    }

    /// The seqs a replay of the whole log gives.
    fn replayed_seqs(log: &EventLog, chat: &ChatIdJson) -> Vec<u64> {
        log.replay(0, chat)
            .map(|t| {
                let v: serde_json::Value = serde_json::from_str(&t).unwrap_or_default();
                v["seq"].as_u64().unwrap_or(0)
            })
            .collect()
    }

    #[test]
    fn deltas_of_a_final_message_are_not_replayed_and_keep_their_seqs() {
        let chat = ChatIdJson::new("chat_1");
        let events = [
            delta("m1", "Hel"),
            ServerEvent::InputRequest { agent: "A".into() },
            delta("m1", "lo"),
            final_text("m1", "Hello"),
            delta("m2", "still streaming"),
        ];
        let mut log = EventLog::default();
        let mut stored = EventLog::default();
        for (seq, event) in (1..).zip(&events) {
            let text = log.publish(&chat, event);
            stored.push_stored(seq, &text);
        }
        for log in [&log, &stored] {
            assert_eq!(log.last_seq(), 5);
            assert_eq!(
                replayed_seqs(log, &chat),
                [2, 4, 5],
                "m1's deltas are gone, m2's (not final) stay"
            );
        }
    }

    #[test]
    fn forgetting_keeps_the_last_events_and_every_one_the_store_lacks_or_still_streams() {
        let chat = ChatIdJson::new("chat_1");
        let mut log = EventLog::default();
        let texts: Vec<Arc<str>> = (0..6)
            .map(|i| {
                log.publish(
                    &chat,
                    &ServerEvent::InputRequest {
                        agent: format!("A{i}"),
                    },
                )
            })
            .collect();
        log.forget_through(3, 1);
        assert_eq!(log.forgotten(), 3, "only what the store holds leaves");
        assert_eq!(log.last_seq(), 6);
        log.forget_through(6, 2);
        assert_eq!(log.forgotten(), 4, "the last two stay");
        let replayed: Vec<Arc<str>> = log.replay(0, &chat).collect();
        assert_eq!(
            replayed,
            texts[4..],
            "memory replays what it holds, with its seqs"
        );
        assert_eq!(log.replay(5, &chat).collect::<Vec<_>>(), texts[5..]);

        // A streaming message's deltas stay until it is final, then drop as before.
        log.publish(&chat, &delta("m1", "Hel"));
        log.publish(&chat, &delta("m1", "lo"));
        log.forget_through(8, 0);
        assert_eq!(log.forgotten(), 6, "not from the first delta of m1 on");
        log.publish(&chat, &final_text("m1", "Hello"));
        log.forget_through(8, 0);
        assert_eq!(log.forgotten(), 8);
        assert_eq!(replayed_seqs(&log, &chat), [9]);
    }

    /// Events restored from a store that left some deltas out keep their seqs: the gaps stay
    /// taken, replays skip them, and the next event follows the last stored seq.
    #[test]
    fn stored_events_with_gaps_keep_their_seqs() {
        let chat = ChatIdJson::new("chat_1");
        let mut log = EventLog::default();
        log.push_stored(1, "{\"seq\":1}");
        log.push_stored(4, "{\"seq\":4}");
        log.push_stored(4, "{\"again\":4}");
        log.push_stored(5, "{\"seq\":5}");
        assert_eq!(log.last_seq(), 5);
        assert_eq!(replayed_seqs(&log, &chat), [1, 4, 5]);
        assert_eq!(
            log.replay(2, &chat).collect::<Vec<_>>(),
            [Arc::from("{\"seq\":4}"), Arc::from("{\"seq\":5}")]
        );
        let next = log.publish(&chat, &ServerEvent::InputRequest { agent: "A".into() });
        assert!(next.contains("\"seq\":6"), "{next}");
    }

    #[test]
    fn a_log_after_a_seq_numbers_its_events_from_there() {
        let chat = ChatIdJson::new("chat_1");
        let mut log = EventLog::after(40);
        let text = log.publish(&chat, &ServerEvent::InputRequest { agent: "A".into() });
        assert!(text.contains("\"seq\":41"), "{text}");
        log.push_stored(42, "{\"seq\":42}");
        assert_eq!(log.last_seq(), 42);
        assert_eq!(log.replay(0, &chat).count(), 2);
        assert_eq!(
            log.replay(41, &chat).collect::<Vec<_>>(),
            [Arc::from("{\"seq\":42}")]
        );
    }

    #[test]
    fn a_resume_boundary_gives_its_last_seq_and_other_events_none() {
        let chat = ChatIdJson::new("c1");
        let boundary = ServerEvent::ResumeBoundary {
            from_seq: 3,
            last_seq: 9,
            replayed: 6,
            pending_ui_calls: Vec::new(),
        };
        let text = envelope_string(0, &chat, &boundary);
        assert_eq!(resume_boundary_last_seq(text.as_bytes()), Some(9));
        for event in events() {
            let text = envelope_string(9, &chat, &event);
            assert_eq!(resume_boundary_last_seq(text.as_bytes()), None);
        }
        assert_eq!(resume_boundary_last_seq(b"not json"), None);
    }

    #[test]
    fn replay_is_the_published_text() {
        for chat_id in ["chat_1", "chat \"odd\" \\ id\u{1}", "chat_é"] {
            let chat = ChatIdJson::new(chat_id);
            let mut log = EventLog::default();
            let mut published = Vec::new();
            for (i, event) in events().iter().enumerate() {
                let text = log.publish(&chat, event);
                let expected = Envelope {
                    seq: i as u64 + 1,
                    chat_id,
                    timestamp: &timestamp_of(&text),
                    event,
                }
                .to_json();
                assert_eq!(&*text, expected);
                published.push(text);
            }
            let until: Vec<Arc<str>> = log.replay_until(0, 2, &chat).collect();
            assert_eq!(until, published[..2], "replay stops at `until`");
            assert_eq!(log.replay_until(3, 2, &chat).count(), 0);
            log.push_stored(4, "{\"restored\":true}");
            published.push(Arc::from("{\"restored\":true}"));
            assert_eq!(log.last_seq(), 4);
            for after in 0..=5 {
                let replayed: Vec<Arc<str>> = log.replay(after, &chat).collect();
                let from = (after as usize).min(published.len());
                assert_eq!(replayed, published[from..]);
            }
        }
    }
}
