//! Bounded rendering of tool results for the model's context.
//!
//! WHY: a tool result can be megabytes; the model only gets a short summary (the engine's
//! limit, 900 chars by default). Serializing the whole value just to cut it would allocate the
//! whole text, so serialization writes into a bounded buffer and gives up early.

use std::io;

use serde_json::Value;

/// After the kept prefix, at most this many more bytes of serialized output are counted (but
/// not stored) to report how much was cut; past it serialization stops and the count is
/// reported as a lower bound (`N+`).
const MAX_COUNTED_BYTES: usize = 1 << 20;

/// Compact JSON text of `result`, at most `max_chars` chars including the
/// `…[truncated N chars]` marker that replaces whatever was cut (N counts the chars removed;
/// `N+` when there were so many that counting stopped). The cut is on a char boundary.
/// When `max_chars` is smaller than the marker itself, only the marker is returned.
pub fn summarize_for_model(result: &Value, max_chars: usize) -> String {
    let mut writer = BoundedWriter::new(max_chars);
    // An error here only means the writer stopped early (or, impossibly, a serializer bug);
    // either way the writer holds what we need.
    let complete = serde_json::to_writer(&mut writer, result).is_ok() && !writer.overflowed;
    let BoundedWriter {
        kept,
        kept_chars,
        extra_chars,
        ..
    } = writer;
    let text = String::from_utf8(kept)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    if extra_chars == 0 && complete {
        return text;
    }
    let total = kept_chars + extra_chars;
    let marker = |removed: usize| {
        if complete {
            format!("…[truncated {removed} chars]")
        } else {
            format!("…[truncated {removed}+ chars]")
        }
    };
    // Keep as much as fits next to the marker. The marker's width depends on the number it
    // reports; `marker(total)` is the widest it can be, so start from there and grow.
    let width = |removed: usize| marker(removed).chars().count();
    let mut keep = max_chars.saturating_sub(width(total)).min(kept_chars);
    while keep < kept_chars && keep + 1 + width(total - keep - 1) <= max_chars {
        keep += 1;
    }
    let cut = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
    let mut out = String::with_capacity(cut + 32);
    out.push_str(&text[..cut]);
    out.push_str(&marker(total - keep));
    out
}

/// Stores the first `limit` chars written, counts up to [`MAX_COUNTED_BYTES`] more, then fails
/// the write so serialization stops.
struct BoundedWriter {
    limit: usize,
    kept: Vec<u8>,
    kept_chars: usize,
    /// Chars seen after the kept prefix.
    extra_chars: usize,
    extra_bytes: usize,
    /// Set once counting stopped; `extra_chars` is then a lower bound.
    overflowed: bool,
}

impl BoundedWriter {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            // Typical results are ASCII; a multibyte result grows the buffer as needed.
            kept: Vec::with_capacity(limit.min(64 * 1024)),
            kept_chars: 0,
            extra_chars: 0,
            extra_bytes: 0,
            overflowed: false,
        }
    }
}

impl io::Write for BoundedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for &b in buf {
            let starts_char = (b & 0xC0) != 0x80;
            if self.extra_chars == 0 && (!starts_char || self.kept_chars < self.limit) {
                // Still inside the kept prefix (continuation bytes follow their lead byte).
                if starts_char {
                    self.kept_chars += 1;
                }
                self.kept.push(b);
            } else {
                if starts_char {
                    self.extra_chars += 1;
                }
                self.extra_bytes += 1;
                if self.extra_bytes > MAX_COUNTED_BYTES {
                    self.overflowed = true;
                    return Err(io::Error::other("summary limit reached"));
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
