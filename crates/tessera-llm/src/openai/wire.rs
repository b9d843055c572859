//! The OpenAI chat-completions wire format: request encoding, response decoding, and assembly
//! of streamed chunks. Pure functions over bytes and JSON so that they are testable without a
//! server, and so that no provider quirk can make the client panic.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use smallvec::SmallVec;

use crate::error::truncate_chars;
use crate::{
    ChatRequest, ChatResponse, LlmError, Message, Role, ToolCall, ToolChoice, Tools, Usage,
    WireCache,
};

mod scan;

/// Characters of a bad body quoted in an `InvalidResponse` message.
const BAD_BODY_EXCERPT_CHARS: usize = 120;

// ---------------------------------------------------------------------------------------------
// Request
// ---------------------------------------------------------------------------------------------

/// The request body: the messages' encodings, the tools' encoding, then the rest of the
/// request, serialized here. A message is encoded once over its chat's life (see
/// [`WireCache`]), an agent's tool list once, and the request's shared head (a chat's
/// transcript) is not copied at all: its pieces (see [`crate::WirePrefix`]) are parts of the
/// body, written to the socket as they are.
pub(crate) fn encode_request(
    request: &ChatRequest,
    model: &str,
) -> serde_json::Result<RequestBody> {
    // Always an object with at least `model`: `{"model":...}`.
    let rest = tessera_json::to_vec(&WireRequest::new(request, model))?;
    let messages = &request.messages;
    let head = messages.head();
    let head_pieces = messages
        .head_wire()
        .get_or_encode(head.len(), |base| join_head(head, base))?;
    let tail = messages
        .tail()
        .iter()
        .map(encode_message)
        .collect::<Result<SmallVec<[&str; 4]>, _>>()?;
    let tools = encode_tools(&request.tools)?;
    // Everything after the head in one part, sized exactly.
    let tail_len: usize = tail.iter().map(|text| text.len() + 1).sum();
    let tools_len = tools.map_or(0, |text| text.len() + 10);
    let mut after = Vec::with_capacity(2 + tail_len + tools_len + rest.len());
    let mut first = head_pieces.is_empty();
    for text in tail {
        if !std::mem::take(&mut first) {
            after.push(b',');
        }
        after.extend_from_slice(text.as_bytes());
    }
    after.extend_from_slice(b"],");
    if let Some(tools) = tools {
        after.extend_from_slice(b"\"tools\":");
        after.extend_from_slice(tools.as_bytes());
        after.push(b',');
    }
    after.extend_from_slice(rest.get(1..).unwrap_or_default());
    let mut parts = Vec::with_capacity(head_pieces.len() + 2);
    parts.push(Bytes::from_static(b"{\"messages\":["));
    parts.extend(head_pieces.iter().cloned());
    parts.push(Bytes::from(after));
    Ok(RequestBody::new(parts))
}

/// A request body in parts that are sent one after the other without being joined; cloning it
/// (for a retry) shares them. Its length is known, so it goes out with a `Content-Length`.
#[derive(Clone, Debug)]
pub(crate) struct RequestBody {
    parts: Arc<[Bytes]>,
    len: u64,
}

impl RequestBody {
    fn new(parts: Vec<Bytes>) -> Self {
        let len = parts.iter().map(|part| part.len() as u64).sum();
        Self {
            parts: parts.into(),
            len,
        }
    }

    /// The whole body in one buffer (tests and diagnostics; a request never joins it).
    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        self.parts
            .iter()
            .flat_map(|part| part.iter().copied())
            .collect()
    }

    /// Its parts, in order.
    pub(crate) fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }
}

/// The tools as the provider reads them, encoded once per list (an agent's list is shared by
/// all its requests; see [`crate::Tools`]); `None` when no tools are offered.
fn encode_tools(tools: &Tools) -> serde_json::Result<Option<&str>> {
    if tools.is_empty() {
        return Ok(None);
    }
    let encode = || {
        let wire: Vec<WireTool<'_>> = tools
            .iter()
            .map(|t| WireTool {
                kind: "function",
                function: WireFunction {
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.parameters,
                },
            })
            .collect();
        tessera_json::to_string(&wire)
    };
    tools.wire.get_or_encode(encode).map(Some)
}

/// One message's encoding, made once and kept with the message.
fn encode_message(message: &Message) -> serde_json::Result<&str> {
    message
        .wire
        .get_or_encode(|| tessera_json::to_string(&WireMessage::new(message)))
}

/// `head`'s messages encoded and joined by commas, from message `base` on (with a comma in
/// front, to follow the encoding of the messages before it) when given.
fn join_head(head: &[Message], base: Option<usize>) -> serde_json::Result<String> {
    let added = head
        .get(base.unwrap_or(0)..)
        .unwrap_or_default()
        .iter()
        .map(encode_message)
        .collect::<Result<Vec<&str>, _>>()?;
    let mut text = String::with_capacity(added.iter().map(|t| t.len() + 1).sum::<usize>());
    for encoded in added {
        if base.is_some() || !text.is_empty() {
            text.push(',');
        }
        text.push_str(encoded);
    }
    Ok(text)
}

/// The request body apart from its messages and tools, borrowing everything from the
/// `ChatRequest` so that large schemas are serialized without being copied first.
#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<WireResponseFormat<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: Role,
    /// `null` only for an assistant message that carries tool calls; `""` otherwise, because
    /// several servers reject a null content on other roles.
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Serialize)]
struct WireFunctionCall<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[derive(Serialize)]
struct WireResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: WireJsonSchema<'a>,
}

#[derive(Serialize)]
struct WireJsonSchema<'a> {
    name: Cow<'a, str>,
    schema: &'a Value,
    strict: bool,
}

impl<'a> WireRequest<'a> {
    /// Encode `request` for `model`. `tool_choice` is dropped when no tools are offered, since
    /// OpenAI rejects a `tool_choice` without `tools`.
    fn new(request: &'a ChatRequest, model: &'a str) -> Self {
        let tool_choice = match (&request.tool_choice, request.tools.is_empty()) {
            (Some(choice), false) => Some(match choice {
                ToolChoice::Auto => Value::from("auto"),
                ToolChoice::None => Value::from("none"),
                ToolChoice::Required => Value::from("required"),
                ToolChoice::Function(name) => serde_json::json!({
                    "type": "function",
                    "function": { "name": name },
                }),
            }),
            _ => None,
        };
        Self {
            model,
            tool_choice,
            response_format: request
                .response_format
                .as_ref()
                .map(|f| WireResponseFormat {
                    kind: "json_schema",
                    json_schema: WireJsonSchema {
                        name: sanitize_name(&f.name).unwrap_or(Cow::Borrowed("response")),
                        schema: &f.schema,
                        strict: f.strict,
                    },
                }),
            temperature: request.temperature,
            max_tokens: request.max_tokens,
            stream: request.stream,
            stream_options: request.stream.then_some(StreamOptions {
                include_usage: true,
            }),
        }
    }
}

impl<'a> WireMessage<'a> {
    fn new(m: &'a Message) -> Self {
        let is_assistant = m.role == Role::Assistant;
        let tool_calls: Vec<WireToolCall<'a>> = if is_assistant {
            m.tool_calls
                .iter()
                .map(|c| WireToolCall {
                    id: &c.id,
                    kind: "function",
                    function: WireFunctionCall {
                        name: &c.name,
                        arguments: if c.arguments.trim().is_empty() {
                            "{}"
                        } else {
                            &c.arguments
                        },
                    },
                })
                .collect()
        } else {
            Vec::new()
        };
        let content = match m.content.as_deref() {
            Some(text) => Some(text),
            None if !tool_calls.is_empty() => None,
            None => Some(""),
        };
        // `name` is not part of the tool-message shape; strict servers reject it there.
        let name = match m.role {
            Role::Tool => None,
            _ => m.name.as_deref().and_then(sanitize_name),
        };
        Self {
            role: m.role,
            content,
            name,
            tool_calls,
            tool_call_id: if m.role == Role::Tool {
                m.tool_call_id.as_deref()
            } else {
                None
            },
        }
    }
}

/// Make `name` match OpenAI's `^[a-zA-Z0-9_-]{1,64}$`: other characters become `_`, the result
/// is cut to 64 characters, and an empty name is dropped. Borrows when already valid.
pub(crate) fn sanitize_name(name: &str) -> Option<Cow<'_, str>> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() {
        return None;
    }
    if name.len() <= 64 && name.chars().all(ok) {
        return Some(Cow::Borrowed(name));
    }
    Some(Cow::Owned(
        name.chars()
            .take(64)
            .map(|c| if ok(c) { c } else { '_' })
            .collect(),
    ))
}

// ---------------------------------------------------------------------------------------------
// Non-streamed response
// ---------------------------------------------------------------------------------------------

fn invalid(msg: impl Into<String>) -> LlmError {
    LlmError::InvalidResponse(msg.into())
}

/// A short, printable start of a body for error messages.
fn body_excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "<empty body>".to_owned()
    } else {
        format!("{:?}", truncate_chars(text, BAD_BODY_EXCERPT_CHARS))
    }
}

/// The provider's error message from an `{"error": ...}` object or string, if any.
pub(crate) fn provider_error_message(error: &Value) -> Option<String> {
    match error {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("message").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

/// Decode a non-streamed chat completion. Never panics; anything unexpected becomes
/// `LlmError::InvalidResponse` with a short description.
pub(crate) fn parse_completion(
    body: &[u8],
    fallback_model: &str,
) -> Result<ChatResponse, LlmError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        invalid(format!(
            "body is not JSON ({e}); it starts with {}",
            body_excerpt(body)
        ))
    })?;
    let obj = value
        .as_object()
        .ok_or_else(|| invalid(format!("body is not a JSON object: {}", body_excerpt(body))))?;
    let choices = match obj.get("choices") {
        Some(Value::Array(choices)) => choices,
        Some(Value::Null) | None => {
            return Err(match obj.get("error").and_then(provider_error_message) {
                Some(msg) => invalid(format!(
                    "provider returned an error: {}",
                    truncate_chars(&msg, BAD_BODY_EXCERPT_CHARS)
                )),
                None => invalid("body has no `choices`"),
            });
        }
        Some(_) => return Err(invalid("`choices` is not an array")),
    };
    let choice = choices
        .first()
        .and_then(Value::as_object)
        .ok_or_else(|| invalid("`choices` is empty"))?;
    let message = choice
        .get("message")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid("choices[0] has no `message` object"))?;

    let content = match content_text(message.get("content"))? {
        Some(text) => Some(text),
        None => message
            .get("refusal")
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    let tool_calls = match message.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(i, c)| parse_tool_call(i, c))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid("choices[0].message.tool_calls is not an array")),
    };

    Ok(ChatResponse {
        message: Message {
            role: Role::Assistant,
            content: content.map(Into::into),
            name: None,
            tool_calls,
            tool_call_id: None,
            wire: WireCache::default(),
        },
        usage: parse_usage(obj.get("usage")),
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        model: response_model(obj, fallback_model),
    })
}

fn response_model(obj: &Map<String, Value>, fallback: &str) -> String {
    match obj.get("model").and_then(Value::as_str) {
        Some(m) if !m.is_empty() => m.to_owned(),
        _ => fallback.to_owned(),
    }
}

/// Message content: a string, null, or (some servers) an array of `{"type":"text","text":..}`.
fn content_text(content: Option<&Value>) -> Result<Option<String>, LlmError> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => Ok(Some(
            parts
                .iter()
                .filter_map(|p| match p {
                    Value::String(s) => Some(s.as_str()),
                    _ => p.get("text").and_then(Value::as_str),
                })
                .collect(),
        )),
        Some(_) => Err(invalid("choices[0].message.content is not a string")),
    }
}

fn parse_tool_call(i: usize, call: &Value) -> Result<ToolCall, LlmError> {
    let function = call
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid(format!("tool_calls[{i}] has no `function` object")))?;
    let name = match function.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => return Err(invalid(format!("tool_calls[{i}] has no function name"))),
    };
    let arguments = match function.get("arguments") {
        Some(Value::String(s)) => normalize_arguments(s.clone()),
        None | Some(Value::Null) => "{}".to_owned(),
        // Some servers send the arguments as an object instead of its JSON text.
        Some(other) => other.to_string(),
    };
    let id = match call.get("id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ => format!("call_{i}"),
    };
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
}

/// Empty arguments mean "no arguments"; say so as JSON so that the tool layer can parse them.
fn normalize_arguments(arguments: String) -> String {
    if arguments.trim().is_empty() {
        "{}".to_owned()
    } else {
        arguments
    }
}

/// Usage is informational: missing or odd fields count as zero rather than failing the call.
fn parse_usage(usage: Option<&Value>) -> Usage {
    let field = |name: &str| {
        usage
            .and_then(|u| u.get(name))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Usage {
        prompt_tokens: field("prompt_tokens"),
        completion_tokens: field("completion_tokens"),
    }
}

// ---------------------------------------------------------------------------------------------
// Streamed response
// ---------------------------------------------------------------------------------------------

/// One tool call being assembled from stream fragments.
#[derive(Debug, Default)]
struct PartialCall {
    index: u64,
    id: String,
    name: String,
    arguments: String,
}

/// A string in a stream chunk: borrowed from the chunk's text unless it holds escapes.
///
/// WHY a type of its own: serde borrows only a field whose type is exactly `Cow<str>`; an
/// `Option<Cow<str>>` with `#[serde(borrow)]` still deserializes through `String`, one
/// allocation per field per chunk (the model name of every chunk, every content delta).
#[cfg_attr(test, derive(Debug, PartialEq))]
struct WireStr<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for WireStr<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text<'a>(std::marker::PhantomData<&'a str>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Text<'a> {
            type Value = WireStr<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(WireStr(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(WireStr(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(WireStr(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(Text(std::marker::PhantomData))
    }
}

impl std::ops::Deref for WireStr<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// One stream chunk of the shape providers send, read without building a `Value` tree (the
/// chunks are most of a streamed answer's parsing): by hand ([`scan::scan_chunk_into`]) when
/// it is plainly of this shape, else by serde. A chunk with a field of another type, a duplicate
/// field or an `error` does not fit and is read by the general path
/// ([`StreamAssembler::apply_value`]); a chunk that fits means the same on both paths.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct ChunkWire<'a> {
    error: Option<IgnoredAny>,
    #[serde(borrow)]
    model: Option<WireStr<'a>>,
    usage: Option<UsageWire>,
    /// Inline: one choice is what we ask for, so a chunk needs no allocation of its own.
    #[serde(borrow)]
    choices: Option<SmallVec<[ChoiceWire<'a>; 1]>>,
}

impl ChunkWire<'_> {
    /// A chunk with none of its fields, to be read into.
    const EMPTY: Self = Self {
        error: None,
        model: None,
        usage: None,
        choices: None,
    };
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct UsageWire {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct ChoiceWire<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    finish_reason: Option<WireStr<'a>>,
    #[serde(borrow)]
    delta: Option<DeltaWire<'a>>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct DeltaWire<'a> {
    #[serde(borrow)]
    content: Option<WireStr<'a>>,
    #[serde(borrow)]
    refusal: Option<WireStr<'a>>,
    #[serde(borrow)]
    tool_calls: Option<SmallVec<[FragmentWire<'a>; 1]>>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct FragmentWire<'a> {
    #[serde(borrow)]
    id: Option<WireStr<'a>>,
    index: Option<u64>,
    #[serde(borrow)]
    function: Option<FunctionWire<'a>>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct FunctionWire<'a> {
    #[serde(borrow)]
    name: Option<WireStr<'a>>,
    #[serde(borrow)]
    arguments: Option<WireStr<'a>>,
}

/// Builds the final response from the `data:` payloads of a streamed completion: concatenates
/// content deltas, assembles tool calls by `index` (id and name come first, arguments in
/// pieces), and keeps the last usage, finish reason and model.
#[derive(Debug, Default)]
pub(crate) struct StreamAssembler {
    content: String,
    saw_content: bool,
    refusal: String,
    calls: Vec<PartialCall>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    model: Option<String>,
}

impl StreamAssembler {
    /// Apply one chunk (the JSON text of one event). Content deltas are passed to `on_delta`.
    pub(crate) fn apply(
        &mut self,
        data: &str,
        on_delta: &mut dyn FnMut(&str),
    ) -> Result<(), LlmError> {
        // The usual chunk by hand; what the reader is not sure of, by serde as it reads it.
        let mut chunk = ChunkWire::EMPTY;
        if scan::scan_chunk_into(data, &mut chunk).is_some() {
            self.apply_typed(&chunk, on_delta);
            return Ok(());
        }
        // `[...]` would fill a derived struct by position: only objects take the typed path.
        if data.trim_start().starts_with('{')
            && let Ok(chunk) = serde_json::from_str::<ChunkWire<'_>>(data)
            && chunk.error.is_none()
        {
            self.apply_typed(&chunk, on_delta);
            return Ok(());
        }
        self.apply_value(data, on_delta)
    }

    /// A chunk of the usual shape (see [`ChunkWire`]): the same effect as [`Self::apply_value`]
    /// on the same text.
    fn apply_typed(&mut self, chunk: &ChunkWire<'_>, on_delta: &mut dyn FnMut(&str)) {
        if self.model.is_none()
            && let Some(m) = chunk.model.as_deref().filter(|m| !m.is_empty())
        {
            self.model = Some(m.to_owned());
        }
        if let Some(usage) = &chunk.usage {
            self.usage = Some(Usage {
                prompt_tokens: usage.prompt_tokens.unwrap_or(0),
                completion_tokens: usage.completion_tokens.unwrap_or(0),
            });
        }
        // We ask for one choice; ignore any other index a server might send.
        for choice in chunk
            .choices
            .iter()
            .flatten()
            .filter(|c| c.index.unwrap_or(0) == 0)
        {
            if let Some(reason) = choice.finish_reason.as_deref() {
                self.finish_reason = Some(reason.to_owned());
            }
            let Some(delta) = &choice.delta else {
                continue;
            };
            if let Some(text) = &delta.content {
                self.push_content(text, on_delta);
            }
            if let Some(refusal) = &delta.refusal {
                self.refusal.push_str(refusal);
            }
            for fragment in delta.tool_calls.iter().flatten() {
                let (name, arguments) = fragment.function.as_ref().map_or((None, None), |f| {
                    (f.name.as_deref(), f.arguments.as_deref())
                });
                self.apply_fragment_parts(fragment.id.as_deref(), fragment.index, name, arguments);
            }
        }
    }

    /// Any chunk, read as a `Value`: the general rules (fields of another type ignored or
    /// refused one by one) and their error messages.
    fn apply_value(&mut self, data: &str, on_delta: &mut dyn FnMut(&str)) -> Result<(), LlmError> {
        let value: Value = serde_json::from_str(data).map_err(|e| {
            invalid(format!(
                "stream chunk is not JSON ({e}); it starts with {}",
                body_excerpt(data.as_bytes())
            ))
        })?;
        let Some(obj) = value.as_object() else {
            return Err(invalid("stream chunk is not a JSON object"));
        };
        if let Some(error) = obj.get("error").filter(|e| !e.is_null()) {
            let msg = provider_error_message(error).unwrap_or_else(|| "unknown error".to_owned());
            return Err(LlmError::Stream(format!(
                "provider sent an error: {}",
                truncate_chars(&msg, BAD_BODY_EXCERPT_CHARS)
            )));
        }
        if self.model.is_none()
            && let Some(m) = obj
                .get("model")
                .and_then(Value::as_str)
                .filter(|m| !m.is_empty())
        {
            self.model = Some(m.to_owned());
        }
        if let Some(usage) = obj.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(parse_usage(Some(usage)));
        }
        let choices = match obj.get("choices") {
            None | Some(Value::Null) => return Ok(()),
            Some(Value::Array(choices)) => choices,
            Some(_) => return Err(invalid("stream chunk `choices` is not an array")),
        };
        // We ask for one choice; ignore any other index a server might send.
        for choice in choices
            .iter()
            .filter(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        {
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_owned());
            }
            let Some(delta) = choice.get("delta").filter(|d| !d.is_null()) else {
                continue;
            };
            match delta.get("content") {
                None | Some(Value::Null) => {}
                Some(Value::String(text)) => self.push_content(text, on_delta),
                Some(_) => return Err(invalid("stream delta content is not a string")),
            }
            if let Some(refusal) = delta.get("refusal").and_then(Value::as_str) {
                self.refusal.push_str(refusal);
            }
            match delta.get("tool_calls") {
                None | Some(Value::Null) => {}
                Some(Value::Array(fragments)) => {
                    for fragment in fragments {
                        self.apply_tool_fragment(fragment)?;
                    }
                }
                Some(_) => return Err(invalid("stream delta tool_calls is not an array")),
            }
        }
        Ok(())
    }

    fn push_content(&mut self, text: &str, on_delta: &mut dyn FnMut(&str)) {
        self.saw_content = true;
        if !text.is_empty() {
            self.content.push_str(text);
            on_delta(text);
        }
    }

    fn apply_tool_fragment(&mut self, fragment: &Value) -> Result<(), LlmError> {
        if !fragment.is_object() {
            return Err(invalid("stream tool-call fragment is not an object"));
        }
        let function = fragment.get("function").filter(|f| !f.is_null());
        let arguments = match function.and_then(|f| f.get("arguments")) {
            None | Some(Value::Null) => None,
            Some(Value::String(piece)) => Some(Cow::Borrowed(piece.as_str())),
            Some(other) => Some(Cow::Owned(other.to_string())),
        };
        self.apply_fragment_parts(
            fragment.get("id").and_then(Value::as_str),
            fragment.get("index").and_then(Value::as_u64),
            function.and_then(|f| f.get("name")).and_then(Value::as_str),
            arguments.as_deref(),
        );
        Ok(())
    }

    /// Adds one tool-call fragment: its id and name (kept from the first that has them) and a
    /// piece of its arguments.
    fn apply_fragment_parts(
        &mut self,
        id: Option<&str>,
        index: Option<u64>,
        name: Option<&str>,
        arguments: Option<&str>,
    ) {
        let id = id.filter(|id| !id.is_empty());
        let index = match index {
            Some(index) => index,
            // No index (some servers): a new id starts a new call, anything else continues
            // the latest one.
            None => match (id, self.calls.last()) {
                (Some(id), _) if !self.calls.iter().any(|c| c.id == id) => {
                    self.calls.iter().map(|c| c.index + 1).max().unwrap_or(0)
                }
                (_, Some(last)) => last.index,
                (_, None) => 0,
            },
        };
        let pos = match self.calls.iter().position(|c| c.index == index) {
            Some(pos) => pos,
            None => {
                self.calls.push(PartialCall {
                    index,
                    ..PartialCall::default()
                });
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[pos];
        if let Some(id) = id
            && call.id.is_empty()
        {
            call.id = id.to_owned();
        }
        if let Some(name) = name
            && call.name.is_empty()
        {
            call.name = name.to_owned();
        }
        if let Some(piece) = arguments {
            call.arguments.push_str(piece);
        }
    }

    /// Whether the provider said the answer is complete.
    pub(crate) fn has_finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// The assembled response. Fails when a tool call never received its name.
    pub(crate) fn finish(mut self, fallback_model: &str) -> Result<ChatResponse, LlmError> {
        self.calls.sort_by_key(|c| c.index);
        let tool_calls = self
            .calls
            .into_iter()
            .map(|c| {
                if c.name.is_empty() {
                    return Err(invalid(format!(
                        "streamed tool call #{} has no function name",
                        c.index
                    )));
                }
                Ok(ToolCall {
                    id: if c.id.is_empty() {
                        format!("call_{}", c.index)
                    } else {
                        c.id
                    },
                    name: c.name,
                    arguments: normalize_arguments(c.arguments),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // An empty text next to tool calls is an artefact of the role chunk, not an answer.
        let content = if !self.content.is_empty() {
            Some(self.content)
        } else if !self.refusal.is_empty() {
            Some(self.refusal)
        } else if self.saw_content && tool_calls.is_empty() {
            Some(String::new())
        } else {
            None
        };
        Ok(ChatResponse {
            message: Message {
                role: Role::Assistant,
                content: content.map(Into::into),
                name: None,
                tool_calls,
                tool_call_id: None,
                wire: WireCache::default(),
            },
            usage: self.usage.unwrap_or_default(),
            finish_reason: self.finish_reason,
            model: self.model.unwrap_or_else(|| fallback_model.to_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use std::sync::Arc;

    use super::*;
    use crate::{Messages, ResponseFormat, ToolSpec, WirePrefix};

    fn encode(request: &ChatRequest) -> Value {
        encode_request(request, "m")
            .and_then(|body| serde_json::from_slice(&body.to_vec()))
            .unwrap_or(Value::Null)
    }

    #[test]
    fn a_sent_message_is_encoded_once_and_reused_by_its_clones() {
        let first = ChatRequest::new("A", vec![Message::text(Role::User, "hi")]);
        let once = encode(&first);
        // The next request holds a clone of the same message: the clone shares the encoding.
        let mut messages = first.messages.to_vec();
        assert!(format!("{:?}", messages[0].wire).contains("encoded"));
        messages.push(Message::assistant("A", "hello"));
        let again = encode(&ChatRequest::new("A", messages));
        assert_eq!(again["messages"][0], once["messages"][0]);
        assert_eq!(
            again["messages"][1],
            json!({"role": "assistant", "content": "hello", "name": "A"})
        );
    }

    /// A chat's messages after `turns` turns, each built anew (nothing encoded yet).
    fn chat(turns: usize) -> Vec<Message> {
        let mut messages = vec![Message::text(Role::System, "be \"brief\"")];
        for i in 0..turns {
            messages.push(Message::text(Role::User, format!("question {i}")));
            let mut call = Message::assistant("A", "");
            call.content = None;
            call.tool_calls = vec![ToolCall {
                id: format!("c{i}"),
                name: "echo".into(),
                arguments: "{\"x\":1}".into(),
            }];
            messages.push(call);
            messages.push(Message::tool_result(format!("c{i}"), "ok"));
            messages.push(Message::assistant("A", format!("answer {i}")));
        }
        messages
    }

    fn body(messages: Messages) -> Vec<u8> {
        encode_request(&ChatRequest::new("A", messages), "m")
            .map(|body| body.to_vec())
            .unwrap_or_default()
    }

    #[test]
    fn a_body_built_on_an_earlier_prefix_equals_the_body_made_fresh() {
        let turn = |n: usize| Arc::new(chat(n));
        // Turn 1: the head is encoded in one piece; turn 2 extends that encoding.
        let first = WirePrefix::default();
        let one = body(Messages::new(turn(1), first.clone(), Arc::default()));
        assert_eq!(one, body(Messages::from(chat(1))));
        let head = turn(3);
        let second = first.extended();
        let tail = Arc::new(vec![Message::text(Role::User, "more")]);
        let made = body(Messages::new(Arc::clone(&head), second.clone(), tail));
        let mut all = chat(3);
        all.push(Message::text(Role::User, "more"));
        let fresh = body(Messages::from(all));
        assert_eq!(
            String::from_utf8_lossy(&made),
            String::from_utf8_lossy(&fresh)
        );
        // The cached head serves the turn's next request as it is.
        let again = body(Messages::new(head, second, Arc::default()));
        assert_eq!(again, body(Messages::from(chat(3))));
    }

    #[test]
    fn a_body_holds_the_head_pieces_themselves_not_a_copy() {
        let first = WirePrefix::default();
        body(Messages::new(
            Arc::new(chat(1)),
            first.clone(),
            Arc::default(),
        ));
        let second = first.extended();
        let request = ChatRequest::new(
            "A",
            Messages::new(Arc::new(chat(2)), second.clone(), Arc::default()),
        );
        let sent = encode_request(&request, "m").map(|body| body.parts);
        let sent = sent.unwrap_or_else(|_| Arc::from(Vec::new()));
        let pieces = second.get_or_encode(9, |_| Err::<String, ()>(()));
        let pieces = pieces.map(|p| p.into_owned()).unwrap_or_default();
        // The opening, turn 1's piece, turn 2's piece, then the rest of the request.
        assert_eq!((sent.len(), pieces.len()), (4, 2));
        assert_eq!(sent[1].as_ptr(), pieces[0].as_ptr());
        assert_eq!(sent[2].as_ptr(), pieces[1].as_ptr());
        let fresh = body(Messages::from(chat(2)));
        let whole: Vec<u8> = sent.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(whole, fresh);
    }

    #[test]
    fn an_extended_prefix_reuses_the_earlier_encoding_instead_of_encoding_again() {
        let first = WirePrefix::default();
        body(Messages::new(
            Arc::new(chat(1)),
            first.clone(),
            Arc::default(),
        ));
        // Different first messages (never the case for a chat, whose messages are only
        // appended): what the body holds for them shows which encoding was used.
        let mut other = chat(2);
        other[1] = Message::text(Role::User, "changed");
        let made = body(Messages::new(
            Arc::new(other),
            first.extended(),
            Arc::default(),
        ));
        let text = String::from_utf8_lossy(&made);
        assert!(
            text.contains("question 0") && !text.contains("changed"),
            "{text}"
        );
        assert!(text.contains("question 1"), "{text}");
    }

    #[test]
    fn a_body_is_valid_with_either_part_empty() {
        let messages = chat(1);
        let split = |at: usize| {
            let head = Arc::new(messages[..at].to_vec());
            let tail = Arc::new(messages[at..].to_vec());
            encode(&ChatRequest::new(
                "A",
                Messages::new(head, WirePrefix::default(), tail),
            ))
        };
        let whole = encode(&ChatRequest::new("A", messages.clone()));
        assert_eq!(whole["messages"].as_array().map(Vec::len), Some(5));
        for at in 0..=messages.len() {
            assert_eq!(split(at), whole, "split at {at}");
        }
    }

    #[test]
    fn a_tool_list_is_encoded_once_and_shared_by_every_request_that_offers_it() {
        let specs = || {
            vec![ToolSpec {
                name: "echo".into(),
                description: "Echo \"x\"".into(),
                parameters: json!({"type": "object", "properties": {"x": {"type": "string"}}}),
            }]
        };
        let tools = Tools::from(specs());
        let request = |tools: Tools| {
            let mut request = ChatRequest::new("A", vec![Message::text(Role::User, "hi")]);
            request.tools = tools;
            request.tool_choice = Some(ToolChoice::Auto);
            encode(&request)
        };
        let first = request(tools.clone());
        assert!(format!("{:?}", tools.wire).contains("encoded"));
        let again = request(tools);
        let fresh = request(Tools::from(specs()));
        assert_eq!(again, fresh);
        assert_eq!(first, fresh);
        assert_eq!(fresh["tools"][0]["function"]["name"], "echo");
        assert_eq!(fresh["tool_choice"], "auto");
    }

    #[test]
    fn an_empty_transcript_still_encodes_a_valid_body() {
        let v = encode(&ChatRequest::new("A", Vec::new()));
        assert_eq!(v["messages"], json!([]));
        assert_eq!(v["model"], "m");
    }

    #[test]
    fn request_encodes_every_field() {
        let mut assistant = Message::assistant("Writer Bot", "");
        assistant.content = None;
        assistant.tool_calls = vec![ToolCall {
            id: "c1".into(),
            name: "search".into(),
            arguments: "{\"q\":1}".into(),
        }];
        let mut request = ChatRequest::new(
            "Writer",
            vec![
                Message::text(Role::System, "sys"),
                Message {
                    name: Some("ünïcode user".into()),
                    ..Message::text(Role::User, "hi")
                },
                assistant,
                Message::tool_result("c1", "result"),
            ],
        );
        request.tools = vec![ToolSpec {
            name: "search".into(),
            description: "Search things".into(),
            parameters: json!({"type": "object"}),
        }]
        .into();
        request.tool_choice = Some(ToolChoice::Function("search".into()));
        request.response_format = Some(ResponseFormat {
            name: "out".into(),
            schema: json!({"type": "object"}).into(),
            strict: true,
        });
        request.temperature = Some(0.5);
        request.max_tokens = Some(321);
        request.stream = true;

        let v = encode(&request);
        assert_eq!(v["model"], "m");
        assert_eq!(
            v["messages"][0],
            json!({"role": "system", "content": "sys"})
        );
        assert_eq!(v["messages"][1]["name"], "_n_code_user");
        assert_eq!(
            v["messages"][2],
            json!({
                "role": "assistant",
                "content": null,
                "name": "Writer_Bot",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{\"q\":1}"}}],
            })
        );
        assert_eq!(
            v["messages"][3],
            json!({"role": "tool", "content": "result", "tool_call_id": "c1"})
        );
        assert_eq!(
            v["tools"],
            json!([{"type": "function", "function": {
            "name": "search", "description": "Search things", "parameters": {"type": "object"}}}])
        );
        assert_eq!(
            v["tool_choice"],
            json!({"type": "function", "function": {"name": "search"}})
        );
        assert_eq!(
            v["response_format"],
            json!({"type": "json_schema", "json_schema": {
            "name": "out", "schema": {"type": "object"}, "strict": true}})
        );
        assert_eq!(v["temperature"], json!(0.5));
        assert_eq!(v["max_tokens"], json!(321));
        assert_eq!(v["stream"], true);
        assert_eq!(v["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn minimal_request_omits_optional_fields() {
        let request = ChatRequest::new("A", vec![Message::text(Role::User, "hi")]);
        let v = encode(&request);
        let keys: Vec<&str> = v
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(keys, vec!["messages", "model"]);
    }

    #[test]
    fn tool_choice_without_tools_is_dropped() {
        let mut request = ChatRequest::new("A", vec![]);
        request.tool_choice = Some(ToolChoice::Required);
        assert!(encode(&request).get("tool_choice").is_none());
        request.tools = vec![ToolSpec {
            name: "t".into(),
            description: String::new(),
            parameters: json!({}),
        }]
        .into();
        for (choice, want) in [
            (ToolChoice::Auto, json!("auto")),
            (ToolChoice::None, json!("none")),
            (ToolChoice::Required, json!("required")),
        ] {
            request.tool_choice = Some(choice);
            assert_eq!(encode(&request)["tool_choice"], want);
        }
    }

    #[test]
    fn names_are_sanitized() {
        assert_eq!(sanitize_name("ok_Name-1").as_deref(), Some("ok_Name-1"));
        assert!(matches!(sanitize_name("ok"), Some(Cow::Borrowed(_))));
        assert_eq!(sanitize_name("a b.c").as_deref(), Some("a_b_c"));
        assert_eq!(sanitize_name(""), None);
        let long = "x".repeat(100);
        assert_eq!(sanitize_name(&long).map(|n| n.len()), Some(64));
    }

    #[test]
    fn garbage_bodies_are_invalid_responses() {
        for body in [
            &b""[..],
            b"not json",
            b"<html>502</html>",
            b"[]",
            b"{}",
            b"{\"choices\": null}",
            b"{\"choices\": 3}",
            b"{\"choices\": []}",
            b"{\"choices\": [1]}",
            b"{\"choices\": [{}]}",
            b"{\"choices\": [{\"message\": {\"content\": 5}}]}",
            b"{\"choices\": [{\"message\": {\"tool_calls\": {}}}]}",
            b"{\"choices\": [{\"message\": {\"tool_calls\": [{\"function\": {}}]}}]}",
            b"{\"error\": {\"message\": \"boom\"}}",
            b"\xff\xfe",
        ] {
            match parse_completion(body, "m") {
                Err(LlmError::InvalidResponse(msg)) => assert!(!msg.is_empty()),
                other => panic!("{:?} gave {other:?}", String::from_utf8_lossy(body)),
            }
        }
        let Err(err) = parse_completion(b"{\"error\": {\"message\": \"boom\"}}", "m") else {
            panic!("expected error");
        };
        assert!(err.to_string().contains("boom"));
    }

    #[test]
    fn lenient_about_optional_parts() {
        let body = br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],
            "tool_calls":[{"function":{"name":"f","arguments":{"x":1}}},{"id":"","function":{"name":"g","arguments":""}}]}}],
            "usage":{"prompt_tokens":"lots"}}"#;
        let r = parse_completion(body, "fallback").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.message.content.as_deref(), Some("ab"));
        assert_eq!(r.message.tool_calls[0].id, "call_0");
        assert_eq!(r.message.tool_calls[0].arguments, "{\"x\":1}");
        assert_eq!(r.message.tool_calls[1].id, "call_1");
        assert_eq!(r.message.tool_calls[1].arguments, "{}");
        assert_eq!(r.usage, Usage::default());
        assert_eq!(r.model, "fallback");
        assert_eq!(r.finish_reason, None);
    }

    #[test]
    fn assembler_builds_tool_calls_without_indices() {
        let mut asm = StreamAssembler::default();
        let mut ignore = |_: &str| {};
        for chunk in [
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{\"x\""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ] {
            asm.apply(chunk, &mut ignore)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(asm.has_finished());
        let r = asm.finish("m").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.message.content, None);
        assert_eq!(
            r.message.tool_calls,
            vec![
                ToolCall {
                    id: "a".into(),
                    name: "f".into(),
                    arguments: "{\"x\":1}".into()
                },
                ToolCall {
                    id: "b".into(),
                    name: "g".into(),
                    arguments: "{}".into()
                },
            ]
        );
    }

    /// Feeds `chunks` to a fresh assembler, through `apply` or only the general `Value` path.
    fn assemble(
        chunks: &[&str],
        general_only: bool,
    ) -> (Vec<String>, Result<ChatResponse, LlmError>) {
        let mut asm = StreamAssembler::default();
        let mut deltas = Vec::new();
        let mut on_delta = |text: &str| deltas.push(text.to_owned());
        for chunk in chunks {
            let applied = if general_only {
                asm.apply_value(chunk, &mut on_delta)
            } else {
                asm.apply(chunk, &mut on_delta)
            };
            if let Err(err) = applied {
                return (deltas, Err(err));
            }
        }
        (deltas, asm.finish("fallback"))
    }

    #[test]
    fn typed_chunks_mean_what_the_general_reader_makes_of_them() {
        let streams: &[&[&str]] = &[
            // The usual shapes: role chunk, text, tool calls in pieces, usage last.
            &[
                r#"{"id":"c1","model":"gpt-x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
                r#"{"model":"other","choices":[{"index":0,"delta":{"content":"Hel\u006co"},"logprobs":null}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":" there"}},{"index":1,"delta":{"content":"ignored"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#,
            ],
            &[
                r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":""}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\""}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}},{"index":1,"function":{"arguments":"{}"}}]}}]}"#,
                r#"{"choices":[{"delta":{"content":null,"refusal":null},"finish_reason":"tool_calls"}],"usage":null}"#,
            ],
            // Shapes only the general reader takes: other types, duplicate keys.
            &[
                r#"{"model":7,"choices":[{"index":"0","delta":{"content":"a"}}]}"#,
                r#"{"choices":[{"index":0.0,"delta":{"content":"b"}},{"index":-1,"delta":{"content":"c"}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":"x","id":"i","function":{"name":"h","arguments":{"k":[1]}}}]}}]}"#,
                r#"{"choices":[{"delta":{"content":"d","content":"e"},"finish_reason":5}],"usage":{"prompt_tokens":1.5}}"#,
                r#"{"choices":[{"delta":"text","finish_reason":"stop"}],"usage":[1]}"#,
            ],
            // Errors: the same error and the same deltas before it.
            &[
                r#"{"choices":[{"delta":{"content":"x"}}]}"#,
                r#"{"choices":[{"delta":{"content":1}}]}"#,
            ],
            &[r#"{"choices":[{"delta":{"content":"x"}}],"error":{"message":"overloaded"}}"#],
            &[r#"{"choices":{"delta":{}}}"#],
            &[r#"[{"choices":[]}]"#],
        ];
        let fits = |chunk: &str| serde_json::from_str::<ChunkWire<'_>>(chunk).is_ok();
        assert!(streams[0].iter().chain(streams[1]).all(|c| fits(c)));
        assert!(!streams[2].iter().any(|c| fits(c)));
        for chunks in streams {
            let (typed_deltas, typed) = assemble(chunks, false);
            let (general_deltas, general) = assemble(chunks, true);
            assert_eq!(typed_deltas, general_deltas, "{chunks:?}");
            assert_eq!(format!("{typed:?}"), format!("{general:?}"), "{chunks:?}");
        }
        let (deltas, usual) = assemble(streams[0], false);
        assert_eq!(deltas, ["Hello", " there"]);
        let usual = usual.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(usual.message.content.as_deref(), Some("Hello there"));
        assert_eq!(
            (usual.model.as_str(), usual.usage.prompt_tokens),
            ("gpt-x", 12)
        );
    }

    #[test]
    fn a_chunk_borrows_its_strings_unless_they_hold_escapes() {
        let data = r#"{"model":"gpt-x","choices":[{"index":0,"delta":{"content":"plain","tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\"x\":1}"}}]},"finish_reason":"stop"}]}"#;
        let chunk: ChunkWire<'_> = serde_json::from_str(data).expect("fits");
        let borrowed = |s: &Option<WireStr<'_>>, text: &str| matches!(s, Some(WireStr(Cow::Borrowed(b))) if *b == text);
        assert!(borrowed(&chunk.model, "gpt-x"));
        let choice = &chunk.choices.as_ref().expect("choices")[0];
        assert!(borrowed(&choice.finish_reason, "stop"));
        let delta = choice.delta.as_ref().expect("delta");
        assert!(borrowed(&delta.content, "plain"));
        let fragment = &delta.tool_calls.as_ref().expect("tool calls")[0];
        assert!(borrowed(&fragment.id, "c1"));
        let function = fragment.function.as_ref().expect("function");
        assert!(borrowed(&function.name, "f"));
        // Escapes need the decoded text: owned, and decoded.
        assert!(matches!(&function.arguments, Some(WireStr(Cow::Owned(a))) if a == r#"{"x":1}"#));
    }

    #[test]
    fn assembler_rejects_bad_chunks_and_reports_stream_errors() {
        let mut ignore = |_: &str| {};
        let mut asm = StreamAssembler::default();
        assert!(matches!(
            asm.apply("nope", &mut ignore),
            Err(LlmError::InvalidResponse(_))
        ));
        assert!(matches!(
            asm.apply("[1]", &mut ignore),
            Err(LlmError::InvalidResponse(_))
        ));
        let err = asm.apply(r#"{"error":{"message":"overloaded"}}"#, &mut ignore);
        assert!(
            matches!(&err, Err(LlmError::Stream(m)) if m.contains("overloaded")),
            "{err:?}"
        );
        let mut asm = StreamAssembler::default();
        asm.apply(
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}"#,
            &mut ignore,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(asm.finish("m"), Err(LlmError::InvalidResponse(_))));
    }
}
