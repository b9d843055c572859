//! A real WebSocket client for tests: sends frames, collects every event, and checks that the
//! logged events arrive in `seq` order with no duplicates: consecutive when live; in a replay
//! (between `chat.session` and `chat.resume_boundary`) the seqs of dropped deltas are skipped,
//! and live events go on from the boundary's `last_seq` (above the last replayed event's when
//! the log's last seqs carry no event, as after a restart in mid-stream; docs/protocol.md).

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

/// One connected client.
pub struct WsClient {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// Every event received, in order.
    pub events: Vec<Value>,
    /// Highest logged seq seen.
    pub last_seq: u64,
    /// Between `chat.session` and `chat.resume_boundary`.
    replaying: bool,
}

impl WsClient {
    /// Connects as `user` (dev mode identifies the user by `X-User-Id`).
    pub async fn connect(url: &str, user: &str) -> WsClient {
        match Self::try_connect(url, user).await {
            Ok(client) => client,
            Err(e) => panic!("websocket connect failed: {e}"),
        }
    }

    /// Connects, returning the handshake error (e.g. 404 for another user's chat).
    pub async fn try_connect(url: &str, user: &str) -> Result<WsClient, String> {
        Self::try_connect_with(url, user, &[]).await
    }

    /// Connects with extra upgrade-request `headers` (e.g. a W3C `traceparent`).
    pub async fn try_connect_with(
        url: &str,
        user: &str,
        headers: &[(&'static str, &str)],
    ) -> Result<WsClient, String> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = url.into_client_request().map_err(|e| e.to_string())?;
        let value = user.parse().map_err(|_| "bad user header".to_owned())?;
        request.headers_mut().insert("x-user-id", value);
        for (name, value) in headers {
            let value = value.parse().map_err(|_| format!("bad {name} header"))?;
            request.headers_mut().insert(*name, value);
        }
        let (socket, _) = connect_async(request).await.map_err(|e| e.to_string())?;
        Ok(WsClient {
            socket,
            events: Vec::new(),
            last_seq: 0,
            replaying: false,
        })
    }

    /// Sends a JSON frame.
    pub async fn send(&mut self, frame: Value) {
        self.send_text(frame.to_string()).await;
    }

    /// Sends a JSON frame; `false` when the socket is gone (e.g. its node was killed).
    pub async fn try_send(&mut self, frame: Value) -> bool {
        self.socket
            .send(Message::text(frame.to_string()))
            .await
            .is_ok()
    }

    /// Sends raw text.
    pub async fn send_text(&mut self, text: String) {
        if let Err(e) = self.socket.send(Message::text(text)).await {
            panic!("send failed: {e}");
        }
    }

    /// Sends a user message.
    pub async fn say(&mut self, content: &str) {
        self.send(json!({"type": "chat.user_message", "data": {"content": content}}))
            .await;
    }

    /// The next event of any type (None when the socket closed).
    pub async fn next(&mut self) -> Option<Value> {
        // One deadline for the whole wait: pings from the server must not extend it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let item = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .ok()??;
            match item {
                Ok(Message::Text(text)) => {
                    let event: Value = serde_json::from_str(&text)
                        .unwrap_or_else(|e| panic!("server sent non-JSON: {e}"));
                    if std::env::var_os("TESSERA_TEST_TRACE").is_some() {
                        eprintln!("<- {event}");
                    }
                    let seq = event["seq"].as_u64().unwrap_or(0);
                    match event["type"].as_str() {
                        Some("chat.session") => self.replaying = true,
                        Some("chat.resume_boundary") => {
                            self.replaying = false;
                            let boundary = event["data"]["last_seq"].as_u64().unwrap_or(0);
                            self.last_seq = self.last_seq.max(boundary);
                        }
                        _ => {}
                    }
                    if seq > 0 && self.replaying {
                        assert!(
                            seq > self.last_seq,
                            "seq duplicate or out of order: {event}"
                        );
                        self.last_seq = seq;
                    } else if seq > 0 {
                        assert_eq!(seq, self.last_seq + 1, "seq gap or duplicate: {event}");
                        self.last_seq = seq;
                    }
                    self.events.push(event.clone());
                    return Some(event);
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Waits for the next event of `kind`. The timeout only stops a broken test from hanging.
    pub async fn until(&mut self, kind: &str) -> Value {
        self.until_match(kind, |_| true).await
    }

    /// Waits for the next event of `kind` that satisfies `pred`.
    pub async fn until_match(&mut self, kind: &str, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            match self.next().await {
                Some(event) if event["type"] == kind && pred(&event) => return event,
                Some(_) => {}
                None => panic!(
                    "socket closed while waiting for {kind}; got {:?}",
                    self.types()
                ),
            }
        }
    }

    /// For a client that resumed after seq `seen` once its chat was rebuilt in mid-stream (a
    /// restart, a takeover): waits for `agent`'s turn run again, from its `chat.run_start` (under
    /// a reused seq its first events would never reach a client that asks for what came after
    /// `seen`) to its `chat.text`, asserts that every logged event got is above `seen`, and
    /// returns the number of words in the text.
    pub async fn until_turn_run_again_above(&mut self, seen: u64, agent: &str) -> usize {
        self.until_match("chat.run_start", |e| e["data"]["agent"] == agent)
            .await;
        let text = self
            .until_match("chat.text", |e| e["data"]["agent"] == agent)
            .await;
        assert!(
            self.events
                .iter()
                .filter_map(|e| e["seq"].as_u64())
                .all(|seq| seq == 0 || seq > seen),
            "every logged event of the rebuilt chat is above seq {seen}: {:?}",
            self.events
        );
        text["data"]["content"]
            .as_str()
            .unwrap_or_default()
            .split_whitespace()
            .count()
    }

    /// Waits for the UI tool call that awaits the browser.
    pub async fn until_ui_call(&mut self) -> Value {
        self.until_match("chat.tool_call", |e| e["data"]["awaiting_response"] == true)
            .await
    }

    /// Types of all events received.
    pub fn types(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|e| e["type"].as_str().unwrap_or("?").to_owned())
            .collect()
    }

    /// Events of `kind` received so far.
    pub fn of(&self, kind: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["type"] == kind).collect()
    }

    /// Closes the socket.
    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }
}
