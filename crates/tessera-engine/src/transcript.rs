//! A chat's transcript, held the way its model requests begin, so that a turn shares it with
//! its requests instead of copying it (the cost of starting a turn does not grow with the
//! number of messages).

use std::sync::Arc;

use tessera_llm::{Message, Messages, Role, WirePrefix};

/// Every message of a chat, oldest first, behind the system message of its latest turn.
///
/// The session appends to it between turns; a turn's requests share it as their head
/// ([`Transcript::request_prefix`]). Appending is in place while no request holds it (the
/// normal case once a turn has ended); otherwise `Arc::make_mut` copies it first.
#[derive(Debug, Clone)]
pub struct Transcript {
    /// Slot 0 is the system message (empty until the first turn), then the chat's messages.
    sent: Arc<Vec<Message>>,
    /// The wire encoding of `sent` as the latest turn's requests had it: the next turn's
    /// requests extend it instead of joining every message again.
    wire: WirePrefix,
}

impl Default for Transcript {
    fn default() -> Self {
        Self {
            sent: Arc::new(vec![Message::text(Role::System, "")]),
            wire: WirePrefix::default(),
        }
    }
}

impl Transcript {
    /// The chat's messages, oldest first (without the system message).
    pub fn messages(&self) -> &[Message] {
        self.sent.get(1..).unwrap_or_default()
    }

    /// How many messages the chat has (without the system message).
    pub fn len(&self) -> usize {
        self.messages().len()
    }

    /// True before the chat's first message.
    pub fn is_empty(&self) -> bool {
        self.messages().is_empty()
    }

    /// Appends a message of the chat.
    pub fn push(&mut self, message: Message) {
        Arc::make_mut(&mut self.sent).push(message);
    }

    /// Room for `n` more messages, with headroom (see [`reserve_with_headroom`]).
    pub fn reserve(&mut self, n: usize) {
        reserve_with_headroom(Arc::make_mut(&mut self.sent), n);
    }

    /// Whether a request (or a turn) still holds the transcript, so that appending would copy it.
    #[cfg(test)]
    pub(crate) fn is_shared(&self) -> bool {
        Arc::strong_count(&self.sent) > 1
    }

    /// The shared start of a turn's model requests: `system`, then every message of the chat
    /// (with an empty tail). An unchanged system message is kept as it is, so its encoding and
    /// the transcript's are extended rather than made again.
    pub fn request_prefix(&mut self, system: Arc<str>) -> Messages {
        let unchanged = self.sent.first().is_some_and(|first| {
            first
                .content
                .as_ref()
                .is_some_and(|old| Arc::ptr_eq(old, &system) || **old == *system)
        });
        // Messages are only appended, so the last encoding still holds for all but the new
        // ones, unless the system message in front of them changed.
        let wire = if unchanged {
            self.wire.extended()
        } else {
            let sent = Arc::make_mut(&mut self.sent);
            let message = Message::text(Role::System, system);
            match sent.first_mut() {
                Some(first) => *first = message,
                None => sent.push(message),
            }
            WirePrefix::default()
        };
        // The earlier encoding is freed with the turn's requests, not kept with the chat.
        self.wire = wire.without_base();
        Messages::new(Arc::clone(&self.sent), wire, Arc::default())
    }
}

/// Makes room for `n` more elements; when `vec` must grow, it grows by half its length at once
/// (at least by `n`).
///
/// WHY neither `reserve_exact` nor `reserve`: a chat keeps its transcript (and its message ids)
/// for its whole life. Exact growth reallocated them twice a turn, and each reallocation moved
/// every message, a pass over memory that has gone cold once the chats outgrow the caches
/// (docs/performance-log.md, eleventh session: ~12 last-level read misses per turn fewer at 1,500
/// chats). Doubling leaves up to half of each unused. Growing by half moves each element about
/// twice over a chat's life and leaves at most a third unused.
pub(crate) fn reserve_with_headroom<T>(vec: &mut Vec<T>, n: usize) {
    if vec.capacity() - vec.len() < n {
        vec.reserve_exact(n.max(vec.len() / 2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_grows_by_half_the_length_so_a_long_chat_reallocates_rarely() {
        let mut vec: Vec<u64> = Vec::new();
        let mut reallocations = 0;
        for i in 0..200 {
            let before = vec.capacity();
            reserve_with_headroom(&mut vec, 1);
            if vec.capacity() != before {
                reallocations += 1;
            }
            assert!(vec.capacity() > vec.len(), "room for the next element");
            // At most a third unused (plus the one element asked for).
            assert!(vec.capacity() <= vec.len() + vec.len() / 2 + 1);
            vec.push(i);
        }
        // Exact growth would have reallocated 200 times; by half, ~log1.5(200).
        assert!(reallocations <= 15, "{reallocations} reallocations");
        // A request larger than half the length is granted whole.
        reserve_with_headroom(&mut vec, 500);
        assert!(vec.capacity() >= vec.len() + 500);
    }

    fn user(text: &str) -> Message {
        Message::text(Role::User, text)
    }

    fn encoded(message: &Message) -> bool {
        format!("{:?}", message.wire).contains("encoded")
    }

    #[test]
    fn the_prefix_is_the_system_message_then_the_messages() {
        let mut transcript = Transcript::default();
        assert!(transcript.is_empty());
        transcript.push(user("a"));
        transcript.push(user("b"));
        let prefix = transcript.request_prefix(Arc::from("sys"));
        assert_eq!(
            prefix.to_vec(),
            vec![Message::text(Role::System, "sys"), user("a"), user("b")]
        );
        assert!(prefix.tail().is_empty());
        assert_eq!(transcript.messages(), &[user("a"), user("b")]);
        assert_eq!(transcript.len(), 2);
    }

    #[test]
    fn the_prefix_is_shared_not_copied() {
        let mut transcript = Transcript::default();
        transcript.push(user("a"));
        let first = transcript.request_prefix(Arc::from("sys"));
        let again = transcript.request_prefix(Arc::from("sys"));
        assert!(std::ptr::eq(first.head(), again.head()));
    }

    #[test]
    fn pushing_while_a_request_holds_the_prefix_leaves_that_request_unchanged() {
        let mut transcript = Transcript::default();
        transcript.push(user("a"));
        let held = transcript.request_prefix(Arc::from("sys"));
        transcript.push(user("b"));
        assert_eq!(held.len(), 2);
        assert_eq!(transcript.len(), 2);
        let next = transcript.request_prefix(Arc::from("sys"));
        assert_eq!(next.len(), 3);
    }

    #[test]
    fn an_unchanged_system_message_keeps_its_encoding_and_a_changed_one_replaces_it() {
        let mut transcript = Transcript::default();
        let first = transcript.request_prefix(Arc::from("sys"));
        let system = &first.head()[0];
        assert_eq!(
            system.wire.get_or_encode(|| Ok::<_, ()>("x".into())),
            Ok("x")
        );
        drop(first);
        // The same text in another allocation (a prompt rebuilt from context variables).
        let same = transcript.request_prefix(Arc::from(String::from("sys")));
        assert!(encoded(&same.head()[0]));
        drop(same);
        let changed = transcript.request_prefix(Arc::from("sys 2"));
        assert_eq!(changed.head()[0].content_str(), "sys 2");
        assert!(!encoded(&changed.head()[0]));
        assert_eq!(changed.len(), 1);
    }

    /// Encodes a head the way a request encoder would: each message's text, joined by "|".
    fn join(prefix: &Messages) -> String {
        let head = prefix.head();
        let pieces = prefix.head_wire().get_or_encode(head.len(), |base| {
            let added: Vec<&str> = head[base.unwrap_or(0)..]
                .iter()
                .map(Message::content_str)
                .collect();
            let separator = if base.is_some() { "|" } else { "" };
            Ok::<_, ()>(format!("{separator}{}", added.join("|")))
        });
        pieces
            .map(|pieces| pieces.iter().map(|p| String::from_utf8_lossy(p)).collect())
            .unwrap_or_default()
    }

    #[test]
    fn the_next_turn_extends_the_last_encoding_unless_the_system_message_changed() {
        let mut transcript = Transcript::default();
        transcript.push(user("a"));
        let first = transcript.request_prefix(Arc::from("sys"));
        assert_eq!(join(&first), "sys|a");
        drop(first);
        transcript.push(user("b"));
        let second = transcript.request_prefix(Arc::from("sys"));
        // Started from the first turn's encoding: only "b" was asked for, and the first
        // turn's piece is kept as it is in front of it.
        let mut asked = None;
        let pieces = second.head_wire().get_or_encode(3, |base| {
            asked = Some(base);
            Ok::<_, ()>("|b".to_owned())
        });
        assert_eq!(asked, Some(Some(2)));
        let pieces: Vec<String> = pieces
            .map(|pieces| {
                pieces
                    .iter()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(pieces, ["sys|a", "|b"]);
        drop(second);
        transcript.push(user("c"));
        let changed = transcript.request_prefix(Arc::from("sys 2"));
        assert_eq!(join(&changed), "sys 2|a|b|c");
    }
}
