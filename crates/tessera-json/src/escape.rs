//! A JSON string: quoted, with the escapes serde_json writes.

use crate::Sink;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The bytes of `word` that need an escape (a control character below 0x20, a quote or a
/// backslash), as their high bits. The lowest bit set is exact: `x - 0x01…` borrows into a
/// byte's high bit only from that byte matching or from a borrow below it, which starts at a
/// match; so the first match is found without a false one before it.
#[inline]
fn escape_bits(word: u64) -> u64 {
    let control = word.wrapping_sub(ONES * 0x20) & !word;
    let quote = word ^ (ONES * u64::from(b'"'));
    let quote = quote.wrapping_sub(ONES) & !quote;
    let backslash = word ^ (ONES * u64::from(b'\\'));
    let backslash = backslash.wrapping_sub(ONES) & !backslash;
    (control | quote | backslash) & HIGH_BITS
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

/// Where the first byte lies that a JSON string cannot hold as it is (a quote, a backslash or
/// a control character), eight bytes at a time: where a string's text ends for a reader, where
/// the next escape goes for a writer.
#[inline]
pub fn first_escapable(bytes: &[u8]) -> Option<usize> {
    let (words, tail) = bytes.as_chunks::<8>();
    for (n, word) in words.iter().enumerate() {
        let found = escape_bits(u64::from_le_bytes(*word));
        if found != 0 {
            return Some(n * 8 + found.trailing_zeros() as usize / 8);
        }
    }
    tail.iter()
        .position(|&byte| NEEDS_ESCAPE[usize::from(byte)])
        .map(|i| words.len() * 8 + i)
}

/// Appends `text` as a JSON string, escaped as serde_json does: `\"`, `\\`, `\b`, `\f`, `\n`,
/// `\r`, `\t`, other control characters as `\u00xx` (lowercase), everything else as it is.
pub fn push_escaped<S: Sink + ?Sized>(out: &mut S, text: &str) {
    out.reserve_bytes(text.len() + 2);
    out.push_ascii(b'"');
    let mut rest = text;
    // Each escape is of an ASCII byte, so the text either side of it is whole characters.
    while let Some(at) = first_escapable(rest.as_bytes()) {
        out.push_text(&rest[..at]);
        push_escape(out, rest.as_bytes()[at]);
        rest = &rest[at + 1..];
    }
    out.push_text(rest);
    out.push_ascii(b'"');
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
    fn the_first_escapable_byte_is_found_exactly_wherever_it_lies() {
        // Every byte value at every position of a word and of the tail, among plain bytes and
        // among non-ASCII ones (whose high bit must not pass for a match), alone and followed
        // by a second match (which must not be found first).
        for fill in [b'a', 0x80, 0xff, 0x21, 0x5b, 0x5d, 0x1f] {
            for byte in 0u8..=0xff {
                for at in 0..11 {
                    let mut bytes = [fill; 11];
                    bytes[at] = byte;
                    let expected = bytes
                        .iter()
                        .position(|&b| b < 0x20 || b == b'"' || b == b'\\');
                    assert_eq!(first_escapable(&bytes), expected, "{bytes:?}");
                    if at + 1 < bytes.len() {
                        bytes[at + 1] = b'"';
                        let expected = bytes
                            .iter()
                            .position(|&b| b < 0x20 || b == b'"' || b == b'\\');
                        assert_eq!(first_escapable(&bytes), expected, "{bytes:?}");
                    }
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
