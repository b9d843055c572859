//! Incremental Server-Sent Events parser.
//!
//! Network chunks split an event stream at arbitrary byte positions — inside a line, inside a
//! `\r\n` pair, even inside a multi-byte UTF-8 character. This parser is pure (bytes in, event
//! payloads out, no I/O) so that every split point can be unit-tested.

use std::ops::ControlFlow;

use crate::LlmError;

/// Largest single event (pending line plus accumulated data) accepted, so that a broken or
/// hostile endpoint that never sends a line break cannot make us buffer without bound.
pub const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// Turns the bytes of a `text/event-stream` body into the `data` payloads of its events.
///
/// Follows the SSE rules that matter for chat completions: lines end with `\n`, `\r\n` or `\r`;
/// `data:` lines (one optional space after the colon is dropped) accumulate, joined by `\n`;
/// a blank line dispatches the event; `:` comments and other fields (`event`, `id`, `retry`)
/// are ignored. At end of stream, [`SseParser::finish`] also dispatches an event that was not
/// followed by a blank line, because some servers omit the last one.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, unterminated line. Never contains a line terminator.
    line: Vec<u8>,
    /// Data of the event being built.
    data: String,
    /// Whether the event being built has at least one `data` line (it may be empty).
    has_data: bool,
    /// The previous chunk ended with `\r`: a `\n` at the start of the next one belongs to it.
    pending_cr: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed the next chunk of the body; returns the payloads of the events it completed, in
    /// order. Errors only when one event grows beyond [`MAX_EVENT_BYTES`].
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, LlmError> {
        let mut events = Vec::new();
        // Never breaks: every event is collected.
        let _ = self.push_each(chunk, |data| {
            events.push(data.to_owned());
            ControlFlow::Continue(())
        })?;
        Ok(events)
    }

    /// Feed the next chunk of the body; calls `on_event` with the payload of each event it
    /// completes, in order, until `on_event` breaks (the rest of the chunk is then left
    /// unread). The payload is lent from a buffer reused for the next event, so a stream costs
    /// no allocation per event. Errors only when one event grows beyond [`MAX_EVENT_BYTES`].
    pub fn push_each(
        &mut self,
        chunk: &[u8],
        mut on_event: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, LlmError> {
        let mut rest = chunk;
        if self.pending_cr {
            self.pending_cr = false;
            if let Some((b'\n', tail)) = rest.split_first() {
                rest = tail;
            }
        }
        while let Some(pos) = memchr::memchr2(b'\n', b'\r', rest) {
            let (in_chunk, terminator) = (&rest[..pos], rest[pos]);
            rest = &rest[pos + 1..];
            if terminator == b'\r' {
                match rest.split_first() {
                    Some((b'\n', tail)) => rest = tail,
                    Some(_) => {}
                    None => self.pending_cr = true,
                }
            }
            let flow = if self.line.is_empty() {
                // The whole line is in this chunk (the usual case): read it where it is.
                self.process_line(in_chunk, &mut on_event)
            } else {
                self.line.extend_from_slice(in_chunk);
                let line = std::mem::take(&mut self.line);
                let flow = self.process_line(&line, &mut on_event);
                // Reuse the allocation for the next line.
                self.line = line;
                self.line.clear();
                flow
            };
            if flow.is_break() {
                return Ok(flow);
            }
            self.check_size()?;
        }
        self.line.extend_from_slice(rest);
        self.check_size()?;
        Ok(ControlFlow::Continue(()))
    }

    /// Signal the end of the body; returns the payload of a final event that was not followed
    /// by a blank line, if any.
    pub fn finish(&mut self) -> Option<String> {
        let mut last = None;
        let mut keep_last = |data: &str| {
            last = Some(data.to_owned());
            ControlFlow::Continue(())
        };
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            let _ = self.process_line(&line, &mut keep_last);
        }
        self.pending_cr = false;
        let _ = self.process_line(b"", &mut keep_last);
        last
    }

    fn check_size(&self) -> Result<(), LlmError> {
        if self.line.len() + self.data.len() > MAX_EVENT_BYTES {
            return Err(LlmError::Stream(format!(
                "an event of the stream exceeds {MAX_EVENT_BYTES} bytes"
            )));
        }
        Ok(())
    }

    fn process_line(
        &mut self,
        line: &[u8],
        on_event: &mut impl FnMut(&str) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        if line.is_empty() {
            if self.has_data {
                self.has_data = false;
                let flow = on_event(&self.data);
                self.data.clear();
                return flow;
            }
            return ControlFlow::Continue(());
        }
        if line[0] == b':' {
            return ControlFlow::Continue(()); // comment / keep-alive
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            if self.has_data {
                self.data.push('\n');
            }
            self.has_data = true;
            // Invalid UTF-8 is replaced rather than fatal: the JSON parse that follows decides.
            // Checked by `from_utf8` first: its ASCII fast path is several times quicker than
            // the lossy decoder's, and a valid line is the rule.
            match std::str::from_utf8(value) {
                Ok(text) => self.data.push_str(text),
                Err(_) => self.data.push_str(&String::from_utf8_lossy(value)),
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded OpenAI stream: role chunk, multi-byte text, keep-alive comment, tool-call
    /// fragments, usage chunk, `[DONE]`.
    const RECORDED: &str = concat!(
        ": keep-alive\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Héllo \"}}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"wörld 🌍\"}}]}\n\n",
        "event: message\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\"\"}}]}}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}\n\n",
        "data: [DONE]\n\n",
    );

    fn parse_all(chunks: &[&[u8]]) -> Vec<String> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend(
                parser
                    .push(chunk)
                    .unwrap_or_else(|e| panic!("push failed: {e}")),
            );
        }
        out.extend(parser.finish());
        out
    }

    fn expected() -> Vec<String> {
        parse_all(&[RECORDED.as_bytes()])
    }

    #[test]
    fn whole_stream_yields_every_data_payload() {
        let events = expected();
        assert_eq!(events.len(), 7);
        assert!(events[1].contains("Héllo "));
        assert!(events[2].contains("wörld 🌍"));
        assert_eq!(events[6], "[DONE]");
        for e in &events[..6] {
            assert!(e.starts_with('{') && e.ends_with('}'), "{e}");
        }
    }

    #[test]
    fn every_single_split_point_gives_the_same_events() {
        let bytes = RECORDED.as_bytes();
        let want = expected();
        for i in 0..=bytes.len() {
            assert_eq!(parse_all(&[&bytes[..i], &bytes[i..]]), want, "split at {i}");
        }
    }

    #[test]
    fn every_pair_of_split_points_gives_the_same_events() {
        let bytes = RECORDED.as_bytes();
        let want = expected();
        // Stride keeps the quadratic test fast while still covering many boundary pairs;
        // the single-split test above covers every position exhaustively.
        for i in (0..=bytes.len()).step_by(3) {
            for j in (i..=bytes.len()).step_by(7) {
                assert_eq!(
                    parse_all(&[&bytes[..i], &bytes[i..j], &bytes[j..]]),
                    want,
                    "splits at {i},{j}"
                );
            }
        }
    }

    #[test]
    fn byte_at_a_time_gives_the_same_events() {
        let bytes = RECORDED.as_bytes();
        let chunks: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(parse_all(&chunks), expected());
    }

    #[test]
    fn crlf_and_cr_line_endings_at_every_split() {
        let crlf = RECORDED.replace('\n', "\r\n");
        let cr = RECORDED.replace('\n', "\r");
        let want = expected();
        for text in [&crlf, &cr] {
            let bytes = text.as_bytes();
            for i in 0..=bytes.len() {
                assert_eq!(parse_all(&[&bytes[..i], &bytes[i..]]), want, "split at {i}");
            }
        }
    }

    #[test]
    fn multi_line_data_is_joined_with_newlines() {
        let events = parse_all(&[b"data: a\ndata:b\ndata:  c\n\n"]);
        assert_eq!(events, vec!["a\nb\n c".to_owned()]);
    }

    #[test]
    fn final_event_without_blank_line_is_flushed_on_finish() {
        assert_eq!(
            parse_all(&[b"data: {\"a\":1}\n\ndata: [DONE]"]),
            vec!["{\"a\":1}".to_owned(), "[DONE]".to_owned()]
        );
        assert_eq!(parse_all(&[b"data: x\n"]), vec!["x".to_owned()]);
    }

    #[test]
    fn comments_fields_and_empty_events_are_ignored() {
        let events = parse_all(&[b": ping\n\nevent: x\nid: 3\nretry: 10\n\n\n\ndata\n\n"]);
        // A bare `data` line is a data field with an empty value.
        assert_eq!(events, vec![String::new()]);
    }

    #[test]
    fn invalid_utf8_does_not_panic() {
        let events = parse_all(&[b"data: \xff\xfe\n\n"]);
        assert_eq!(events.len(), 1);
    }

    #[test]
    fn invalid_utf8_in_data_is_replaced_not_fatal() {
        // Whole in one chunk, and split inside the bad bytes (the line is then pending).
        let stream: &[u8] = b"data: ok \xff\xfe end\n\ndata: fine\n\n";
        for at in 0..=stream.len() {
            let (first, second) = stream.split_at(at);
            assert_eq!(
                parse_all(&[first, second]),
                ["ok \u{FFFD}\u{FFFD} end", "fine"],
                "split at {at}"
            );
        }
    }

    #[test]
    fn unbounded_line_is_rejected() {
        let mut parser = SseParser::new();
        let big = vec![b'a'; 1024 * 1024];
        let mut failed = false;
        for _ in 0..9 {
            if parser.push(&big).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
    }

    #[test]
    fn push_each_stops_at_a_break_and_lends_each_payload_in_order() {
        let mut parser = SseParser::new();
        let mut seen = Vec::new();
        let flow = parser.push_each(b"data: a\n\ndata: [DONE]\n\ndata: c\n\n", |data| {
            seen.push(data.to_owned());
            if data == "[DONE]" {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        assert!(matches!(flow, Ok(ControlFlow::Break(()))));
        assert_eq!(seen, ["a", "[DONE]"], "nothing after the break is read");

        let mut parser = SseParser::new();
        let mut seen = Vec::new();
        let flow = parser.push_each(b"data: x\ndata: y\n\ndata: z", |data| {
            seen.push(data.to_owned());
            ControlFlow::Continue(())
        });
        assert!(matches!(flow, Ok(ControlFlow::Continue(()))));
        assert_eq!(seen, ["x\ny"]);
        assert_eq!(
            parser.finish().as_deref(),
            Some("z"),
            "the unterminated event is kept"
        );
    }
}
