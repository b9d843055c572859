//! A JSON string: quoted, with the escapes serde_json writes.

use crate::Sink;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// Whether any of the eight bytes in `word` needs an escape: a control character (below
/// 0x20), a quote or a backslash. Exact, never a false alarm: `x - 0x01…` borrows into a byte's
/// high bit only from a byte that was zero or from a borrow below it, which starts at a zero.
#[inline]
fn needs_escape(word: u64) -> bool {
    let control = word.wrapping_sub(ONES * 0x20) & !word;
    let quote = word ^ (ONES * u64::from(b'"'));
    let quote = quote.wrapping_sub(ONES) & !quote;
    let backslash = word ^ (ONES * u64::from(b'\\'));
    let backslash = backslash.wrapping_sub(ONES) & !backslash;
    (control | quote | backslash) & HIGH_BITS != 0
}

/// Whether a byte needs an escape, by value: the table the word test stands in for.
const NEEDS_ESCAPE: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = true;
        byte += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// Appends `text` as a JSON string, escaped as serde_json does: `\"`, `\\`, `\b`, `\f`, `\n`,
/// `\r`, `\t`, other control characters as `\u00xx` (lowercase), everything else as it is.
pub fn push_escaped<S: Sink + ?Sized>(out: &mut S, text: &str) {
    out.reserve_bytes(text.len() + 2);
    out.push_ascii(b'"');
    let bytes = text.as_bytes();
    let (words, tail) = bytes.as_chunks::<8>();
    // Most strings (keys, names, plain text) need no escape: one pass of word tests, then one
    // copy. The tail's few bytes go through the table.
    let clean = words
        .iter()
        .all(|word| !needs_escape(u64::from_le_bytes(*word)))
        && !tail.iter().any(|&byte| NEEDS_ESCAPE[usize::from(byte)]);
    if clean {
        out.push_text(text);
    } else {
        push_with_escapes(out, text);
    }
    out.push_ascii(b'"');
}

/// The string's text with its escapes: runs without any copied whole, a word at a time. Out
/// of line so that the common case above stays small where it is inlined.
#[inline(never)]
fn push_with_escapes<S: Sink + ?Sized>(out: &mut S, text: &str) {
    let bytes = text.as_bytes();
    // `start..` is the part not written yet; it always begins at a char boundary (0, or just
    // after an escaped ASCII byte).
    let mut start = 0;
    let mut at = 0;
    while at < bytes.len() {
        if let Some(word) = bytes
            .get(at..at + 8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            && !needs_escape(u64::from_le_bytes(word))
        {
            at += 8;
            continue;
        }
        let end = (at + 8).min(bytes.len());
        for (i, &byte) in bytes[at..end].iter().enumerate() {
            if NEEDS_ESCAPE[usize::from(byte)] {
                out.push_text(&text[start..at + i]);
                push_escape(out, byte);
                start = at + i + 1;
            }
        }
        at = end;
    }
    out.push_text(&text[start..]);
}

/// The escape of one byte that needs one.
fn push_escape<S: Sink + ?Sized>(out: &mut S, byte: u8) {
    let short = match byte {
        b'"' => "\\\"",
        b'\\' => "\\\\",
        b'\n' => "\\n",
        b'\r' => "\\r",
        b'\t' => "\\t",
        0x08 => "\\b",
        0x0c => "\\f",
        _ => return push_unicode_escape(out, byte),
    };
    out.push_text(short);
}

fn push_unicode_escape<S: Sink + ?Sized>(out: &mut S, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push_text("\\u00");
    out.push_ascii(HEX[usize::from(byte >> 4)]);
    out.push_ascii(HEX[usize::from(byte & 0x0f)]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        push_escaped(&mut out, text);
        out
    }

    fn reference(text: &str) -> String {
        serde_json::to_string(text).unwrap_or_default()
    }

    #[test]
    fn every_byte_value_escapes_as_serde_json_at_every_offset_in_a_word() {
        // Each ASCII character, alone and at each position of a 17-byte string (two words and a
        // tail), so both the word test and the byte loop see it everywhere.
        for byte in 0u8..=0x7f {
            let c = char::from(byte);
            assert_eq!(
                escaped(&c.to_string()),
                reference(&c.to_string()),
                "{byte:#x}"
            );
            for at in 0..17 {
                let mut text: Vec<char> = "abcdefghijklmnopq".chars().collect();
                text[at] = c;
                let text: String = text.into_iter().collect();
                assert_eq!(escaped(&text), reference(&text), "{byte:#x} at {at}");
            }
        }
    }

    #[test]
    fn the_word_test_flags_exactly_the_words_holding_an_escape() {
        // Every byte value in every position of a word of otherwise plain bytes, and next to
        // non-ASCII bytes (whose high bit must not pass for a match).
        for fill in [b'a', 0x80, 0xff, 0x21, 0x5b, 0x5d] {
            for byte in 0u8..=0xff {
                for at in 0..8 {
                    let mut word = [fill; 8];
                    word[at] = byte;
                    let expected = word.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
                    assert_eq!(needs_escape(u64::from_le_bytes(word)), expected, "{word:?}");
                }
            }
        }
    }

    #[test]
    fn text_without_escapes_and_the_empty_string_are_quoted_as_they_are() {
        assert_eq!(escaped(""), "\"\"");
        assert_eq!(
            escaped("héllo wörld, ünïcode 💡"),
            "\"héllo wörld, ünïcode 💡\""
        );
    }

    proptest! {
        #[test]
        fn any_text_escapes_as_serde_json(text in any::<String>()) {
            prop_assert_eq!(escaped(&text), reference(&text));
        }

        #[test]
        fn text_dense_with_escapes_escapes_as_serde_json(
            text in proptest::collection::vec(
                prop_oneof![Just('"'), Just('\\'), Just('\n'), Just('\u{1}'), Just('\u{1f}'),
                    Just('a'), Just('é'), Just('\u{7f}'), Just('💡')],
                0..40,
            ).prop_map(|c| c.into_iter().collect::<String>())
        ) {
            prop_assert_eq!(escaped(&text), reference(&text));
        }
    }
}
