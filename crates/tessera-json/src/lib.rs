//! Compact JSON text from any `serde::Serialize` value: byte for byte what
//! `serde_json::to_string` writes, with the same errors, but with strings scanned eight bytes
//! at a time for the characters JSON escapes.
//!
//! WHY: serde_json looks up every byte of every string in a table before copying it, and its
//! `Formatter` has no hook for that scan. A LoadTest turn writes ~190 strings (events to the
//! browser, messages to the model, stored rows), and serde_json's string writing took ~34,000
//! instructions of it; with this writer a turn costs ~10,600 fewer instructions (−2.3%;
//! docs/performance-log.md, twenty-sixth session). Serde_json stays the reader and the error
//! type; this crate only writes.
//!
//! ```
//! let text = tessera_json::to_string(&serde_json::json!({"role": "user", "content": "a \"b\""}))?;
//! assert_eq!(text, r#"{"content":"a \"b\"","role":"user"}"#);
//! # Ok::<(), serde_json::Error>(())
//! ```

mod escape;
mod ser;

pub use escape::{first_escapable, push_escaped};
pub use ser::Serializer;

use serde::Serialize;

/// Where JSON text is appended: a `String` or a byte buffer. Everything written is UTF-8.
pub trait Sink {
    /// Appends `text`.
    fn push_text(&mut self, text: &str);
    /// Appends one ASCII byte (a quote, a bracket, a comma).
    fn push_ascii(&mut self, byte: u8);
    /// Room for `additional` more bytes.
    fn reserve_bytes(&mut self, additional: usize);
}

impl Sink for String {
    #[inline]
    fn push_text(&mut self, text: &str) {
        self.push_str(text);
    }
    #[inline]
    fn push_ascii(&mut self, byte: u8) {
        debug_assert!(byte.is_ascii());
        self.push(char::from(byte));
    }
    #[inline]
    fn reserve_bytes(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

impl Sink for Vec<u8> {
    #[inline]
    fn push_text(&mut self, text: &str) {
        self.extend_from_slice(text.as_bytes());
    }
    #[inline]
    fn push_ascii(&mut self, byte: u8) {
        self.push(byte);
    }
    #[inline]
    fn reserve_bytes(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

/// Appends `value`'s JSON text to `out`. On an error, `out` may hold part of the text.
pub fn write<T, S>(out: &mut S, value: &T) -> serde_json::Result<()>
where
    T: ?Sized + Serialize,
    S: Sink + ?Sized,
{
    value.serialize(&mut Serializer::new(out))
}

/// `value`'s JSON text.
pub fn to_string<T: ?Sized + Serialize>(value: &T) -> serde_json::Result<String> {
    let mut out = String::with_capacity(128);
    write(&mut out, value)?;
    Ok(out)
}

/// `value`'s JSON text as bytes.
pub fn to_vec<T: ?Sized + Serialize>(value: &T) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(128);
    write(&mut out, value)?;
    Ok(out)
}
