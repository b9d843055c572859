//! A stream chunk of the usual shape, read by hand into the [`ChunkWire`] serde would make.
//!
//! WHY: a provider sends one chunk per token, and serde's derived reader took ~4,950
//! instructions for each of the mock's ~170-byte chunks (~40,000 per LoadTest turn); this one
//! took ~3,300 (twenty-sixth session), and ~2,000 since it reads into its caller's struct
//! instead of returning nested ones (thirty-first; docs/performance-log.md). This reader only
//! accepts what it is sure of (strings and their escapes, whole numbers, the fields and types
//! [`ChunkWire`] has, each key once) and gives up on anything else, which serde then reads as
//! before: an escaped surrogate pair, an escaped key, a field of another type, a duplicate
//! key, an `error`, an array where an object belongs. Whatever it accepts, serde reads the
//! same.

use std::borrow::Cow;

use smallvec::SmallVec;

use super::{ChoiceWire, ChunkWire, DeltaWire, FragmentWire, FunctionWire, UsageWire, WireStr};

/// Nesting depth past which a skipped value is left to serde (whose own limit is 128).
const MAX_DEPTH: u32 = 64;

/// `data` read into `chunk` (empty at first: [`ChunkWire::EMPTY`]), or `None` when it is not
/// of the usual shape, and what `chunk` holds then is to be dropped. WHY in place: built and
/// returned, the nested structs were copied several times over (~670 instructions a chunk).
pub(super) fn scan_chunk_into<'a>(data: &'a str, chunk: &mut ChunkWire<'a>) -> Option<()> {
    let mut reader = Reader {
        text: data,
        bytes: data.as_bytes(),
        at: 0,
    };
    reader.chunk(chunk)?;
    reader.skip_whitespace();
    (reader.at == reader.bytes.len()).then_some(())
}

/// Sets `bit` in `seen`, or gives up when it was set: a key twice is serde's error.
fn first_time(seen: &mut u8, bit: u8) -> Option<()> {
    if *seen & bit != 0 {
        return None;
    }
    *seen |= bit;
    Some(())
}

struct Reader<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn chunk(&mut self, chunk: &mut ChunkWire<'a>) -> Option<()> {
        let mut seen = 0;
        self.object(|r, key| match key {
            // A null error is no error; any other goes to serde and the general reader.
            "error" => {
                first_time(&mut seen, 1)?;
                r.null().then_some(())
            }
            "model" => {
                first_time(&mut seen, 2)?;
                chunk.model = r.optional_str()?;
                Some(())
            }
            "usage" => {
                first_time(&mut seen, 4)?;
                if !r.null() {
                    chunk.usage = Some(r.usage()?);
                }
                Some(())
            }
            "choices" => {
                first_time(&mut seen, 8)?;
                if !r.null() {
                    let choices = chunk.choices.insert(SmallVec::new());
                    r.array(|r| {
                        choices.push(ChoiceWire {
                            index: None,
                            finish_reason: None,
                            delta: None,
                        });
                        r.choice(choices.last_mut()?)
                    })?;
                }
                Some(())
            }
            _ => r.skip_value(1),
        })
    }

    fn usage(&mut self) -> Option<UsageWire> {
        let mut usage = UsageWire {
            prompt_tokens: None,
            completion_tokens: None,
        };
        let mut seen = 0;
        self.object(|r, key| match key {
            "prompt_tokens" => {
                first_time(&mut seen, 1)?;
                usage.prompt_tokens = r.optional_u64()?;
                Some(())
            }
            "completion_tokens" => {
                first_time(&mut seen, 2)?;
                usage.completion_tokens = r.optional_u64()?;
                Some(())
            }
            _ => r.skip_value(2),
        })?;
        Some(usage)
    }

    fn choice(&mut self, choice: &mut ChoiceWire<'a>) -> Option<()> {
        let mut seen = 0;
        self.object(|r, key| match key {
            "index" => {
                first_time(&mut seen, 1)?;
                choice.index = r.optional_u64()?;
                Some(())
            }
            "finish_reason" => {
                first_time(&mut seen, 2)?;
                choice.finish_reason = r.optional_str()?;
                Some(())
            }
            "delta" => {
                first_time(&mut seen, 4)?;
                if !r.null() {
                    r.delta(choice.delta.insert(DeltaWire {
                        content: None,
                        refusal: None,
                        tool_calls: None,
                    }))?;
                }
                Some(())
            }
            _ => r.skip_value(3),
        })
    }

    fn delta(&mut self, delta: &mut DeltaWire<'a>) -> Option<()> {
        let mut seen = 0;
        self.object(|r, key| match key {
            "content" => {
                first_time(&mut seen, 1)?;
                delta.content = r.optional_str()?;
                Some(())
            }
            "refusal" => {
                first_time(&mut seen, 2)?;
                delta.refusal = r.optional_str()?;
                Some(())
            }
            "tool_calls" => {
                first_time(&mut seen, 4)?;
                if !r.null() {
                    let fragments = delta.tool_calls.insert(SmallVec::new());
                    r.array(|r| {
                        fragments.push(FragmentWire {
                            id: None,
                            index: None,
                            function: None,
                        });
                        r.fragment(fragments.last_mut()?)
                    })?;
                }
                Some(())
            }
            _ => r.skip_value(4),
        })
    }

    fn fragment(&mut self, fragment: &mut FragmentWire<'a>) -> Option<()> {
        let mut seen = 0;
        self.object(|r, key| match key {
            "id" => {
                first_time(&mut seen, 1)?;
                fragment.id = r.optional_str()?;
                Some(())
            }
            "index" => {
                first_time(&mut seen, 2)?;
                fragment.index = r.optional_u64()?;
                Some(())
            }
            "function" => {
                first_time(&mut seen, 4)?;
                if !r.null() {
                    fragment.function = Some(r.function()?);
                }
                Some(())
            }
            _ => r.skip_value(5),
        })
    }

    fn function(&mut self) -> Option<FunctionWire<'a>> {
        let mut function = FunctionWire {
            name: None,
            arguments: None,
        };
        let mut seen = 0;
        self.object(|r, key| match key {
            "name" => {
                first_time(&mut seen, 1)?;
                function.name = r.optional_str()?;
                Some(())
            }
            "arguments" => {
                first_time(&mut seen, 2)?;
                function.arguments = r.optional_str()?;
                Some(())
            }
            _ => r.skip_value(6),
        })?;
        Some(function)
    }

    // --- JSON pieces -----------------------------------------------------------------------

    fn skip_whitespace(&mut self) {
        // Providers send compact JSON: one comparison tells most bytes from whitespace (every
        // whitespace byte is at most a space).
        while let Some(&byte) = self.bytes.get(self.at)
            && byte <= b' '
            && matches!(byte, b' ' | b'\n' | b'\r' | b'\t')
        {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// Consumes `literal` when the text continues with it.
    fn literal(&mut self, literal: &[u8]) -> bool {
        let found = self.peek().is_some() && self.bytes[self.at..].starts_with(literal);
        if found {
            self.at += literal.len();
        }
        found
    }

    fn null(&mut self) -> bool {
        self.literal(b"null")
    }

    /// An object; `member` reads each value, given its key (keys with escapes: not handled).
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            if self.peek()? != b'"' {
                return None;
            }
            let key = self.plain_str()?;
            self.eat(b':')?;
            member(self, key)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array; `element` reads each element.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            element(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string without escapes, borrowed from the chunk (the reader is at its quote).
    fn plain_str(&mut self) -> Option<&'a str> {
        let start = self.at + 1;
        let len = tessera_json::first_escapable(self.bytes.get(start..)?)?;
        if self.bytes[start + len] != b'"' {
            return None;
        }
        self.at = start + len + 1;
        self.text.get(start..start + len)
    }

    /// `null` or a string: borrowed from the chunk, or decoded when it holds escapes.
    fn optional_str(&mut self) -> Option<Option<WireStr<'a>>> {
        if self.null() {
            return Some(None);
        }
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.at + 1;
        if let Some(text) = self.plain_str() {
            return Some(Some(WireStr(Cow::Borrowed(text))));
        }
        Some(Some(WireStr(Cow::Owned(self.decoded_str(start)?))))
    }

    /// The text of the string that starts at `start` (after its quote), its escapes decoded.
    /// Escapes of UTF-16 surrogates (characters outside the BMP, written as a pair) are left
    /// to serde, which also knows the errors of a pair that is not one.
    fn decoded_str(&mut self, start: usize) -> Option<String> {
        let mut out = String::with_capacity(self.bytes.len() - start);
        let mut at = start;
        loop {
            let len = tessera_json::first_escapable(self.bytes.get(at..)?)?;
            out.push_str(self.text.get(at..at + len)?);
            at += len;
            match self.bytes[at] {
                b'"' => {
                    self.at = at + 1;
                    return Some(out);
                }
                b'\\' => {
                    let (decoded, escape_len) = match self.bytes.get(at + 1)? {
                        b'"' => ('"', 2),
                        b'\\' => ('\\', 2),
                        b'/' => ('/', 2),
                        b'b' => ('\u{8}', 2),
                        b'f' => ('\u{c}', 2),
                        b'n' => ('\n', 2),
                        b'r' => ('\r', 2),
                        b't' => ('\t', 2),
                        b'u' => {
                            let hex = self.bytes.get(at + 2..at + 6)?;
                            let mut code = 0;
                            for &digit in hex {
                                code = code * 16 + char::from(digit).to_digit(16)?;
                            }
                            (char::from_u32(code)?, 6)
                        }
                        _ => return None,
                    };
                    out.push(decoded);
                    at += escape_len;
                }
                _ => return None,
            }
        }
    }

    /// `null` or a whole number that fits a `u64`, written as JSON writes one (no sign, no
    /// leading zero, no fraction or exponent: serde reads those as other types).
    fn optional_u64(&mut self) -> Option<Option<u64>> {
        if self.null() {
            return Some(None);
        }
        let digits = self.bytes.get(self.at..)?;
        let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
        // A fraction or exponent after the digits fails where the caller expects `,` or `}`.
        if len == 0 || (len > 1 && digits[0] == b'0') {
            return None;
        }
        let mut value: u64 = 0;
        for &digit in &digits[..len] {
            value = value
                .checked_mul(10)?
                .checked_add(u64::from(digit - b'0'))?;
        }
        self.at += len;
        Some(Some(value))
    }

    /// Any JSON value, checked as serde checks one it ignores, and not kept.
    fn skip_value(&mut self, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.skip_str(),
            b'{' => self.object(|r, _| r.skip_value(depth + 1)),
            b'[' => self.array(|r| r.skip_value(depth + 1)),
            b't' => self.literal(b"true").then_some(()),
            b'f' => self.literal(b"false").then_some(()),
            b'n' => self.null().then_some(()),
            b'-' | b'0'..=b'9' => self.skip_number(),
            _ => None,
        }
    }

    /// A string with any valid escapes (the reader is at its quote).
    fn skip_str(&mut self) -> Option<()> {
        self.at += 1;
        loop {
            let rest = self.bytes.get(self.at..)?;
            let len = tessera_json::first_escapable(rest)?;
            self.at += len;
            match rest[len] {
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                b'\\' => match self.bytes.get(self.at + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 2,
                    b'u' => {
                        let hex = self.bytes.get(self.at + 2..self.at + 6)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        self.at += 6;
                    }
                    _ => return None,
                },
                _ => return None,
            }
        }
    }

    /// A number as JSON writes one: `-`? (`0` | [1-9][0-9]*) (`.` [0-9]+)? ([eE] [+-]? [0-9]+)?
    fn skip_number(&mut self) -> Option<()> {
        if self.bytes.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match self.bytes.get(self.at)? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.skip_digits(),
            _ => return None,
        }
        if self.bytes.get(self.at) == Some(&b'.') {
            self.at += 1;
            self.require_digits()?;
        }
        if let Some(b'e' | b'E') = self.bytes.get(self.at) {
            self.at += 1;
            if let Some(b'+' | b'-') = self.bytes.get(self.at) {
                self.at += 1;
            }
            self.require_digits()?;
        }
        Some(())
    }

    fn skip_digits(&mut self) {
        while self.bytes.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
    }

    fn require_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.skip_digits();
        (self.at > start).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn serde_reads(data: &str) -> Option<ChunkWire<'_>> {
        serde_json::from_str(data).ok()
    }

    fn scan_chunk(data: &str) -> Option<ChunkWire<'_>> {
        let mut chunk = ChunkWire::EMPTY;
        scan_chunk_into(data, &mut chunk).map(|()| chunk)
    }

    #[test]
    fn the_usual_chunks_are_read_by_hand_as_serde_reads_them() {
        for data in [
            // OpenAI: role, text, tool call pieces, finish, usage (with its details).
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"obfuscation":"a1b2"}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"echo","arguments":""}}]},"finish_reason":null}]}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}]}"#,
            r#"{"id":"c","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}"#,
            // Azure's content filter results, logprobs with numbers of every form, spacing.
            r#"{"choices":[{"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}},"delta":{"content":"Hi"},"index":0,"logprobs":{"content":[{"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[]},{"logprob":1.5e-3,"x":-0,"y":0.0,"z":2E+10}]}}],"model":"gpt-4"}"#,
            " { \"model\" : \"m\" ,\n\t\"choices\" : [ { \"delta\" : { \"content\" : \"x\" } , \"index\" : 0 } ] } \n",
            r#"{"error":null,"model":null,"usage":null,"choices":null}"#,
            r#"{"choices":[{"index":null,"finish_reason":null,"delta":null}],"usage":{"prompt_tokens":null}}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":null,"index":18446744073709551615,"function":null},{"function":{"name":null,"arguments":null}}]}}]}"#,
            // Escapes in a string it keeps: decoded, owned, as serde's.
            r#"{"choices":[{"delta":{"content":"say \"hi\"\n\t\\ \/ \b\f\r \u00e9\u0000"}}]}"#,
            r#"{"model":"gpt\u002d4","choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\"x\":1}"}}]}}]}"#,
            r#"{"skipped":"escapes \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDCA1 are fine here","choices":[]}"#,
            "{}",
        ] {
            let ours = scan_chunk(data);
            assert!(ours.is_some(), "given up on {data}");
            assert_eq!(ours, serde_reads(data), "{data}");
        }
    }

    #[test]
    fn what_it_is_not_sure_of_is_left_to_serde() {
        for data in [
            // Surrogates (and bad escapes) in a string it keeps.
            r#"{"choices":[{"delta":{"content":"\uD83D\uDCA1"}}]}"#,
            r#"{"choices":[{"delta":{"content":"\uDCA1"}}]}"#,
            r#"{"model":"\u12G4"}"#,
            r#"{"model":"\u+12f"}"#,
            r#"{"model":"\x"}"#,
            r#"{"model":"a\"#,
            // An escaped key, which serde matches after decoding.
            r#"{"mod\u0065l":"m"}"#,
            // An error, a duplicate key, a field of another type.
            r#"{"error":{"message":"overloaded"}}"#,
            r#"{"model":"a","model":"b"}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"model":7}"#,
            r#"{"choices":[{"index":-1}]}"#,
            r#"{"choices":[{"index":1.0}]}"#,
            r#"{"choices":[{"index":1e2}]}"#,
            r#"{"choices":[{"index":01}]}"#,
            r#"{"choices":[{"index":18446744073709551616}]}"#,
            r#"{"usage":{"prompt_tokens":"1"}}"#,
            r#"{"choices":{"delta":{}}}"#,
            r#"{"choices":[["by", "position"]]}"#,
            r#"{"choices":[null]}"#,
            // Not JSON, or more than one document.
            r#"{"choices":[],}"#,
            r#"{"x":[1,]}"#,
            r#"{"x":tru}"#,
            r#"{"x":nul}"#,
            r#"{"x":"\q"}"#,
            r#"{"x":"\u12G4"}"#,
            "{\"x\":\"a\u{1}\"}",
            r#"{"x":-}"#,
            r#"{"x":1.}"#,
            r#"{"x":1e}"#,
            r#"{"x":.5}"#,
            r#"{"model":"m"} {}"#,
            r#"{"model":"m""#,
            r#"[{"model":"m"}]"#,
            "",
            // Deeper than it follows (serde's own limit is 128).
            &format!(r#"{{"x":{}1{}}}"#, "[".repeat(70), "]".repeat(70)),
        ] {
            assert_eq!(scan_chunk(data), None, "{data}");
        }
    }

    /// A JSON value of any kind, written by serde_json: numbers of every form, strings with
    /// escapes, nesting.
    fn any_value() -> BoxedStrategy<String> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            any::<String>().prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::btree_map("[a-z\"]{0,4}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
        .prop_map(|v| serde_json::to_string(&v).unwrap_or_default())
        .boxed()
    }

    /// What a field of the chunk holds, for the generator.
    #[derive(Clone, Copy, Debug)]
    enum Kind {
        Error,
        Text,
        Number,
        Usage,
        Choices,
        Delta,
        ToolCalls,
        Function,
    }

    const CHUNK: &[(&str, Kind)] = &[
        ("error", Kind::Error),
        ("model", Kind::Text),
        ("usage", Kind::Usage),
        ("choices", Kind::Choices),
    ];
    const USAGE: &[(&str, Kind)] = &[
        ("prompt_tokens", Kind::Number),
        ("completion_tokens", Kind::Number),
    ];
    const CHOICE: &[(&str, Kind)] = &[
        ("index", Kind::Number),
        ("finish_reason", Kind::Text),
        ("delta", Kind::Delta),
    ];
    const DELTA: &[(&str, Kind)] = &[
        ("content", Kind::Text),
        ("refusal", Kind::Text),
        ("tool_calls", Kind::ToolCalls),
    ];
    const FRAGMENT: &[(&str, Kind)] = &[
        ("id", Kind::Text),
        ("index", Kind::Number),
        ("function", Kind::Function),
    ];
    const FUNCTION: &[(&str, Kind)] = &[("name", Kind::Text), ("arguments", Kind::Text)];

    /// Mostly the right type for `kind`, sometimes `null`, sometimes any value at all.
    fn value(kind: Kind) -> BoxedStrategy<String> {
        let right = match kind {
            Kind::Error => Just("null".to_owned()).boxed(),
            Kind::Text => prop_oneof![
                3 => "[a-zA-Z0-9 ,.{}:é]{0,12}".prop_map(|s| format!("\"{s}\"")),
                1 => any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
                1 => prop::collection::vec(
                    prop::sample::select(vec![
                        "a", "é", "\\\"", "\\\\", "\\/", "\\b", "\\n", "\\u00e9", "\\u0000",
                        "\\uD83D\\uDCA1", "\\uDCA1", "\\u12G4", "\\x",
                    ]),
                    0..6,
                )
                .prop_map(|pieces| format!("\"{}\"", pieces.concat())),
            ]
            .boxed(),
            Kind::Number => prop_oneof![
                4 => any::<u64>().prop_map(|n| n.to_string()),
                1 => prop::sample::select(vec!["0", "-1", "1.0", "1e2", "01", "18446744073709551616", "-0"])
                    .prop_map(str::to_owned),
            ]
            .boxed(),
            Kind::Usage => object(USAGE),
            Kind::Choices => array(object(CHOICE)),
            Kind::Delta => object(DELTA),
            Kind::ToolCalls => array(object(FRAGMENT)),
            Kind::Function => object(FUNCTION),
        };
        prop_oneof![8 => right, 1 => Just("null".to_owned()), 1 => any_value()].boxed()
    }

    /// JSON whitespace, mostly none.
    fn space() -> BoxedStrategy<String> {
        prop_oneof![4 => Just(String::new()), 1 => "[ \t\r\n]{1,3}"].boxed()
    }

    fn array(element: BoxedStrategy<String>) -> BoxedStrategy<String> {
        (prop::collection::vec(element, 0..3), space())
            .prop_map(|(elements, ws)| format!("[{ws}{}{ws}]", elements.join(&format!("{ws},"))))
            .boxed()
    }

    /// An object of `fields` in any order, some twice, with other keys between them.
    fn object(fields: &'static [(&'static str, Kind)]) -> BoxedStrategy<String> {
        let member = (0..fields.len() + 1).prop_flat_map(move |i| match fields.get(i) {
            Some(&(key, kind)) => value(kind)
                .prop_map(move |v| (format!("\"{key}\""), v))
                .boxed(),
            None => (
                prop_oneof![
                    4 => "[a-z_]{1,8}".prop_map(|k| format!("\"{k}\"")),
                    1 => Just(r#""mod\u0065l""#.to_owned()),
                ],
                any_value(),
            )
                .boxed(),
        });
        (prop::collection::vec(member, 0..5), space())
            .prop_map(|(members, ws)| {
                let members: Vec<String> = members
                    .into_iter()
                    .map(|(k, v)| format!("{k}{ws}:{ws}{v}"))
                    .collect();
                format!("{{{ws}{}}}", members.join(","))
            })
            .boxed()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The property the reader stands on: what it reads, serde reads the same.
        #[test]
        fn whatever_it_reads_serde_reads_the_same(data in object(CHUNK)) {
            if let Some(ours) = scan_chunk(&data) {
                prop_assert_eq!(Some(ours), serde_reads(&data), "{}", data);
            }
        }

        /// Cut anywhere or with a byte changed, a chunk is read the same or left to serde.
        #[test]
        fn a_damaged_chunk_is_never_read_differently(
            data in object(CHUNK),
            cut in any::<prop::sample::Index>(),
            byte in prop::sample::select(b"{}[]\":,\\0-.e ntf".to_vec()),
        ) {
            let at = cut.index(data.len() + 1);
            let (mut head, tail) = (data.as_bytes()[..at].to_vec(), &data.as_bytes()[at..]);
            let cut_off = String::from_utf8_lossy(&head).into_owned();
            head.push(byte);
            head.extend_from_slice(tail);
            let changed = String::from_utf8_lossy(&head).into_owned();
            for text in [cut_off, changed] {
                if let Some(ours) = scan_chunk(&text) {
                    prop_assert_eq!(Some(ours), serde_reads(&text), "{}", text);
                }
            }
        }
    }
}
