//! Provider-neutral chat types. They mirror the OpenAI chat-completions shapes because that is
//! the API every supported endpoint (OpenAI, Ollama, vLLM, llama.cpp, LiteLLM) speaks.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a message in the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions that frame the conversation.
    System,
    /// The human (or the workflow acting for them).
    User,
    /// A model's answer; `Message::name` says which agent wrote it.
    Assistant,
    /// The result of a tool call, answering `Message::tool_call_id`.
    Tool,
}

/// One tool call requested by the model. `arguments` is the raw JSON text the model produced:
/// it is untrusted and is parsed and validated by the tool layer, never here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id; the tool result message refers to it.
    pub id: String,
    /// The tool to run.
    pub name: String,
    /// JSON text of the arguments, as produced by the model.
    pub arguments: String,
}

/// One message of the conversation. Content is an `Arc<str>` so that a transcript can be handed
/// to every model call of a turn without copying its text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote the message.
    pub role: Role,
    /// The text, if any (`None` for a pure tool-call message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Arc<str>>,
    /// The agent that wrote an assistant message (OpenAI's `name` field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
    /// Tools the assistant asked to run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: the id of the call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// This message in the provider's wire format, made when it is first sent.
    #[serde(skip)]
    pub wire: WireCache,
}

/// A message's wire encoding, made on first use and shared by every clone of the message:
/// a chat's earlier messages are encoded once, not again in every model request of every
/// later turn. A message is not changed once it has been sent (transcripts only grow); a
/// changed copy made from one that was sent must start from `WireCache::default()`.
#[derive(Clone, Default)]
pub struct WireCache(Arc<OnceLock<Box<str>>>);

impl WireCache {
    /// The cached encoding, or `encode`'s, which is kept for the next request.
    pub fn get_or_encode<E>(&self, encode: impl FnOnce() -> Result<String, E>) -> Result<&str, E> {
        if let Some(text) = self.0.get() {
            return Ok(text);
        }
        let text = encode()?;
        Ok(self.0.get_or_init(|| text.into_boxed_str()))
    }
}

impl std::fmt::Debug for WireCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "WireCache(encoded)"
        } else {
            "WireCache"
        })
    }
}

/// Not part of a message's value: two messages are equal whatever each has cached.
impl PartialEq for WireCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The wire encoding of a request's whole `head` (see [`Messages`]), made by the first request
/// that needs it and shared by its clones. It is kept in pieces: the encoding of an earlier,
/// shorter head that this head extends, then what the messages added since encode to. A
/// request body sends the pieces as they are (see the OpenAI client's `RequestBody`).
///
/// WHY pieces, not one string: joining the earlier encoding and the new messages into one
/// string copied the whole transcript once per turn, and copying it into the body once more
/// per request; each copy reads the transcript's encoding, cold once the chats outgrow the
/// caches (docs/performance-log.md, eleventh session). The socket write reads the pieces anyway.
#[derive(Clone, Default)]
pub struct WirePrefix {
    this: Arc<OnceLock<EncodedPrefix>>,
    /// The encoding of an earlier head that this one extends (the same messages, then more).
    base: Option<Arc<OnceLock<EncodedPrefix>>>,
}

struct EncodedPrefix {
    /// How many messages `pieces` encode.
    messages: usize,
    /// The encoding, in order: the pieces joined end to end are the whole.
    pieces: Vec<Bytes>,
}

/// At most this many pieces per head: the body's pieces go to the socket in one vectored write
/// (hyper queues up to 16 buffers, and a body has two more than its head).
const MAX_HEAD_PIECES: usize = 12;

impl WirePrefix {
    /// The cache for a head that extends the one this cache is for: its messages, then more.
    /// It starts from this encoding (or from the one this one would have started from).
    pub fn extended(&self) -> Self {
        let base = match self.this.get() {
            Some(_) => Some(Arc::clone(&self.this)),
            None => self.base.clone(),
        };
        Self {
            this: Arc::default(),
            base,
        }
    }

    /// The same cache without its base: what a head's owner keeps between requests, so that
    /// the earlier encoding's own pieces list is freed with the last request that may still
    /// need it (the pieces themselves are shared).
    pub fn without_base(&self) -> Self {
        Self {
            this: Arc::clone(&self.this),
            base: None,
        }
    }

    /// The encoding of a head of `messages` messages, in pieces (none of them empty): the
    /// cached one, or the base's pieces followed by `encode`'s text. `encode` is given how
    /// many of the first messages the base already encodes (`None` when there is no base:
    /// encode them all); its text must be what follows the base's (with any separator in
    /// front). A cache already holding another head's encoding (not expected) is left as it
    /// is and the result is not kept.
    pub fn get_or_encode<E>(
        &self,
        messages: usize,
        encode: impl FnOnce(Option<usize>) -> Result<String, E>,
    ) -> Result<Cow<'_, [Bytes]>, E> {
        if let Some(done) = self.this.get() {
            if done.messages == messages {
                return Ok(Cow::Borrowed(&done.pieces));
            }
            return Ok(Cow::Owned(pieces_after(&[], encode(None)?)));
        }
        let base = self
            .base
            .as_ref()
            .and_then(|base| base.get())
            .filter(|base| base.messages > 0 && base.messages <= messages);
        let pieces = match base {
            Some(base) => pieces_after(&base.pieces, encode(Some(base.messages))?),
            None => pieces_after(&[], encode(None)?),
        };
        let done = self.this.get_or_init(|| EncodedPrefix { messages, pieces });
        Ok(Cow::Borrowed(&done.pieces))
    }
}

/// `base`'s pieces (shared, not copied), then `added` as a piece of its own; over
/// [`MAX_HEAD_PIECES`], the two neighbours smallest together become one. A chat's turns add
/// pieces of similar size, so what is copied stays a few turns' worth, whatever the length.
fn pieces_after(base: &[Bytes], added: String) -> Vec<Bytes> {
    let mut pieces = Vec::with_capacity((base.len() + 1).min(MAX_HEAD_PIECES + 1));
    pieces.extend(base.iter().cloned());
    if !added.is_empty() {
        pieces.push(Bytes::from(added));
    }
    while pieces.len() > MAX_HEAD_PIECES {
        let at = (0..pieces.len() - 1)
            .min_by_key(|&i| pieces[i].len() + pieces[i + 1].len())
            .unwrap_or(0);
        let second = pieces.remove(at + 1);
        let first = &pieces[at];
        let mut joined = Vec::with_capacity(first.len() + second.len());
        joined.extend_from_slice(first);
        joined.extend_from_slice(&second);
        pieces[at] = Bytes::from(joined);
    }
    pieces
}

impl std::fmt::Debug for WirePrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.this.get() {
            Some(done) => write!(f, "WirePrefix({} messages encoded)", done.messages),
            None => f.write_str("WirePrefix"),
        }
    }
}

impl Message {
    /// A message with text content and nothing else.
    pub fn text(role: Role, content: impl Into<Arc<str>>) -> Self {
        Self {
            role,
            content: Some(content.into()),
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            wire: WireCache::default(),
        }
    }

    /// An assistant message written by `agent`.
    pub fn assistant(agent: impl Into<Arc<str>>, content: impl Into<Arc<str>>) -> Self {
        Self {
            name: Some(agent.into()),
            ..Self::text(Role::Assistant, content)
        }
    }

    /// The result of tool call `call_id`, as the model will read it.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<Arc<str>>) -> Self {
        Self {
            tool_call_id: Some(call_id.into()),
            ..Self::text(Role::Tool, content)
        }
    }

    /// The text content, or "" when there is none (e.g. a pure tool-call message).
    pub fn content_str(&self) -> &str {
        self.content.as_deref().unwrap_or("")
    }
}

/// A tool offered to the model (OpenAI function-calling shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls the tool by.
    pub name: String,
    /// What the tool does, for the model to decide when to use it.
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

/// The tools offered to a model, shared: an agent's list is made once and handed to every
/// request, and its wire encoding is made once too (the same for every request).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tools {
    specs: Arc<[ToolSpec]>,
    /// The whole list in the provider's wire format, made when it is first sent.
    pub wire: WireCache,
}

impl std::ops::Deref for Tools {
    type Target = [ToolSpec];

    fn deref(&self) -> &[ToolSpec] {
        &self.specs
    }
}

impl From<Vec<ToolSpec>> for Tools {
    fn from(specs: Vec<ToolSpec>) -> Self {
        Self {
            specs: specs.into(),
            wire: WireCache::default(),
        }
    }
}

impl Serialize for Tools {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.specs.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Tools {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<ToolSpec>::deserialize(deserializer).map(Self::from)
    }
}

/// How the model may use the offered tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides whether to call tools.
    Auto,
    /// The model must answer with text.
    None,
    /// The model must call at least one tool.
    Required,
    /// Force one named tool.
    Function(String),
}

/// Ask for output that matches a JSON Schema (OpenAI `response_format: json_schema`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseFormat {
    /// A name for the schema (OpenAI requires one).
    pub name: String,
    /// The JSON Schema the answer must match (shared: an agent's schema is the same in every
    /// request).
    pub schema: Arc<Value>,
    /// Ask the provider to enforce the schema exactly.
    pub strict: bool,
}

/// The messages of one model request, oldest first, held as two shared parts: `head`, a prefix
/// its owner keeps across requests (a chat's system message and transcript), then `tail`, what
/// the request adds (a turn's tool calls and results so far). Cloning shares both parts, so
/// handing a long transcript to a model call costs the same as a short one; the owner of each
/// part appends to it in place once the previous request is dropped (`Arc::make_mut`).
#[derive(Debug, Clone, Default)]
pub struct Messages {
    head: Arc<Vec<Message>>,
    /// `head`'s encoding in one piece. The head must not change while this is paired with it.
    head_wire: WirePrefix,
    tail: Arc<Vec<Message>>,
}

impl Messages {
    /// `head` (its one-piece encoding cached in `head_wire`) followed by `tail`.
    pub fn new(head: Arc<Vec<Message>>, head_wire: WirePrefix, tail: Arc<Vec<Message>>) -> Self {
        Self {
            head,
            head_wire,
            tail,
        }
    }

    /// The same head, followed by `tail` instead.
    pub fn with_tail(&self, tail: Arc<Vec<Message>>) -> Self {
        Self {
            head: Arc::clone(&self.head),
            head_wire: self.head_wire.clone(),
            tail,
        }
    }

    /// The shared prefix.
    pub fn head(&self) -> &[Message] {
        &self.head
    }

    /// The cache of the head's encoding in one piece.
    pub fn head_wire(&self) -> &WirePrefix {
        &self.head_wire
    }

    /// What follows the head.
    pub fn tail(&self) -> &[Message] {
        &self.tail
    }

    /// Every message, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Message> + Clone {
        self.head.iter().chain(self.tail.iter())
    }

    /// How many messages the request holds.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// True when the request holds no message.
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.tail.is_empty()
    }

    /// The message at `index`, oldest first.
    pub fn get(&self, index: usize) -> Option<&Message> {
        match index.checked_sub(self.head.len()) {
            None => self.head.get(index),
            Some(i) => self.tail.get(i),
        }
    }

    /// The newest message.
    pub fn last(&self) -> Option<&Message> {
        self.tail.last().or_else(|| self.head.last())
    }

    /// A copy of every message (sharing their text and wire encodings).
    pub fn to_vec(&self) -> Vec<Message> {
        self.iter().cloned().collect()
    }
}

impl From<Vec<Message>> for Messages {
    fn from(messages: Vec<Message>) -> Self {
        Arc::new(messages).into()
    }
}

impl From<Arc<Vec<Message>>> for Messages {
    fn from(head: Arc<Vec<Message>>) -> Self {
        Self::new(head, WirePrefix::default(), Arc::default())
    }
}

impl<'a> IntoIterator for &'a Messages {
    type Item = &'a Message;
    type IntoIter = std::iter::Chain<std::slice::Iter<'a, Message>, std::slice::Iter<'a, Message>>;

    fn into_iter(self) -> Self::IntoIter {
        self.head.iter().chain(self.tail.iter())
    }
}

/// Equal when the same messages are in the same order, however they are split.
impl PartialEq for Messages {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Serialize for Messages {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Message>::deserialize(deserializer).map(Self::from)
    }
}

/// Everything one model call needs. `agent` is metadata for routing, logs and the scripted
/// model; it is not sent to the provider.
///
/// `messages` and `tools` are shared, cheap to clone: an engine hands its transcript and tool
/// specs to every model call without copying them (see [`Messages`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The agent asking; used by logs and the scripted model, never sent.
    pub agent: String,
    /// Model name; `None` uses the client's configured default.
    pub model: Option<String>,
    /// The transcript the model sees, oldest first.
    pub messages: Messages,
    /// Tools the model may call; empty for none.
    pub tools: Tools,
    /// How the model may use `tools`; ignored when `tools` is empty.
    pub tool_choice: Option<ToolChoice>,
    /// Require a JSON answer matching a schema.
    pub response_format: Option<ResponseFormat>,
    /// Sampling temperature; `None` uses the provider's default.
    pub temperature: Option<f32>,
    /// Ask the provider to stream; deltas go to the sink passed to `ChatModel::complete`.
    pub stream: bool,
    /// Most tokens the model may generate (`max_tokens`); `None` leaves it to the provider.
    #[serde(default)]
    pub max_tokens: Option<u32>,
}

impl ChatRequest {
    /// A request for `agent` over `messages` (a `Vec<Message>`, a shared one, or [`Messages`])
    /// with no tools, format or overrides.
    pub fn new(agent: impl Into<String>, messages: impl Into<Messages>) -> Self {
        Self {
            agent: agent.into(),
            model: None,
            messages: messages.into(),
            tools: Tools::default(),
            tool_choice: None,
            response_format: None,
            temperature: None,
            stream: false,
            max_tokens: None,
        }
    }
}

/// Token counts reported by the provider for one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the request (transcript, tools, schema).
    pub prompt_tokens: u64,
    /// Tokens of the answer.
    pub completion_tokens: u64,
}

impl Usage {
    /// Prompt plus completion tokens, for budgets and reports.
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

/// The model's answer to one request: one assistant message (text, tool calls, or both).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The assistant message (`name` is set to the requesting agent).
    pub message: Message,
    /// Token counts for this call (approximate for the scripted model).
    pub usage: Usage,
    /// Why the model stopped (`"stop"`, `"tool_calls"`, `"length"`, ...), when reported.
    pub finish_reason: Option<String>,
    /// The model that answered, as the provider named it.
    pub model: String,
}

/// Receives streamed text fragments as they arrive. Tool-call argument fragments are not
/// passed here: they are assembled into the final `ChatResponse`.
pub type DeltaSink = Box<dyn FnMut(&str) + Send>;

#[cfg(test)]
mod tests {
    use super::*;

    fn text(pieces: &[Bytes]) -> String {
        pieces.iter().map(|p| String::from_utf8_lossy(p)).collect()
    }

    /// The encoding of "m0".."m{n-1}" joined by ",", extended from the base's.
    fn encode_upto(n: usize) -> impl FnOnce(Option<usize>) -> Result<String, ()> {
        move |base| {
            let added: Vec<String> = (base.unwrap_or(0)..n).map(|i| format!("m{i}")).collect();
            let separator = if base.is_some() { "," } else { "" };
            Ok(format!("{separator}{}", added.join(",")))
        }
    }

    #[test]
    fn an_extended_head_shares_the_earlier_pieces_and_adds_only_its_own() {
        let first = WirePrefix::default();
        let one = first
            .get_or_encode(2, encode_upto(2))
            .map(|p| p.into_owned());
        let one = one.unwrap_or_default();
        assert_eq!(text(&one), "m0,m1");
        let second = first.extended();
        let two = second
            .get_or_encode(3, encode_upto(3))
            .map(|p| p.into_owned());
        let two = two.unwrap_or_default();
        assert_eq!(text(&two), "m0,m1,m2");
        assert_eq!(two.len(), 2);
        // The first piece is the earlier encoding itself, not a copy of it.
        assert_eq!(two[0].as_ptr(), one[0].as_ptr());
        // Asked again for the same head: the cached pieces, `encode` not called.
        let again = second.get_or_encode(3, |_| Err::<String, ()>(()));
        assert_eq!(again.map(|p| text(&p)), Ok("m0,m1,m2".to_owned()));
    }

    #[test]
    fn a_long_head_keeps_at_most_its_cap_of_pieces_and_the_same_text() {
        let mut prefix = WirePrefix::default();
        for n in 1..=100 {
            prefix = prefix.extended();
            let pieces = prefix
                .get_or_encode(n, encode_upto(n))
                .map(|p| p.into_owned());
            let pieces = pieces.unwrap_or_default();
            let expected: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
            assert_eq!(text(&pieces), expected.join(","), "{n} messages");
            assert!(pieces.len() <= MAX_HEAD_PIECES, "{} pieces", pieces.len());
            assert!(pieces.iter().all(|p| !p.is_empty()));
        }
    }

    fn user(text: &str) -> Message {
        Message::text(Role::User, text)
    }

    /// `a b c` split after `at` messages.
    fn split(at: usize) -> Messages {
        let all = [user("a"), user("b"), user("c")];
        Messages::new(
            Arc::new(all[..at].to_vec()),
            WirePrefix::default(),
            Arc::new(all[at..].to_vec()),
        )
    }

    #[test]
    fn messages_read_the_same_however_they_are_split() {
        let whole = split(3);
        for at in 0..=3 {
            let messages = split(at);
            assert_eq!(messages, whole);
            assert_eq!(messages.len(), 3);
            assert_eq!(messages.get(2), Some(&user("c")));
            assert_eq!(messages.get(3), None);
            assert_eq!(messages.last(), Some(&user("c")));
            assert_eq!(messages.iter().next_back(), Some(&user("c")));
            assert_eq!(messages.to_vec(), vec![user("a"), user("b"), user("c")]);
            assert_eq!(
                serde_json::to_value(&messages).ok(),
                serde_json::to_value(whole.to_vec()).ok()
            );
        }
        assert_ne!(split(1), Messages::from(vec![user("a")]));
        assert!(Messages::default().is_empty());
        assert_eq!(Messages::default().last(), None);
    }

    #[test]
    fn a_request_with_split_messages_round_trips_through_json() {
        let request = ChatRequest::new("A", split(1));
        let text = serde_json::to_string(&request).unwrap_or_default();
        let back: Result<ChatRequest, _> = serde_json::from_str(&text);
        assert_eq!(back.ok(), Some(request));
    }
}
