//! `OpenAiClient`'s HTTP/1.1 connections against a hand-written server over real TCP: a
//! chunked event stream cut at awkward places, the connection kept for the next request, a kept
//! connection that the server dropped while it was idle, and an answer sent before the request
//! was read whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tessera_llm::openai::{OpenAiClient, OpenAiConfig};
use tessera_llm::{ChatModel, ChatRequest, ChatResponse, DeltaSink, LlmError, Message, Role};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

mod common;
use common::read_request;

/// What the server does with one request: answer with these writes (each flushed on its
/// own) and keep the connection or close it, or close it without a word.
enum Answer {
    Writes(Vec<Vec<u8>>),
    WritesThenClose(Vec<Vec<u8>>),
    /// The first step's writes at once, each later step's once the test says `release`.
    Steps(Vec<Vec<Vec<u8>>>),
    Close,
}

/// Counts of what the server saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    requests: AtomicUsize,
    /// Told each time the server closes a connection.
    closed: tokio::sync::Notify,
    /// Lets the next held step go (`Answer::Steps`).
    release: tokio::sync::Notify,
    /// Told when a held step has been written.
    released: tokio::sync::Notify,
}

/// A server on this runtime that answers request `r` of connection `c` (both from 0) with
/// `answer(c, r)`. Returns its base URL and its counts; it stops with the runtime.
async fn start_server(
    answer: impl Fn(usize, usize) -> Answer + Send + Sync + 'static,
) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let seen = Arc::new(Seen::default());
    let counts = Arc::clone(&seen);
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let connection = counts.connections.fetch_add(1, Ordering::SeqCst);
            let counts = Arc::clone(&counts);
            let answer = Arc::clone(&answer);
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                for request in 0.. {
                    if !read_request(&mut socket, &mut buffer).await {
                        break;
                    }
                    counts.requests.fetch_add(1, Ordering::SeqCst);
                    let (steps, close) = match answer(connection, request) {
                        Answer::Close => break,
                        Answer::Writes(writes) => (vec![writes], false),
                        Answer::WritesThenClose(writes) => (vec![writes], true),
                        Answer::Steps(steps) => (steps, false),
                    };
                    let mut written = true;
                    for (step, writes) in steps.into_iter().enumerate() {
                        if step > 0 {
                            counts.release.notified().await;
                        }
                        for write in writes {
                            if socket.write_all(&write).await.is_err() {
                                written = false;
                                break;
                            }
                            let _ = socket.flush().await;
                            // Let the client read each piece on its own.
                            tokio::task::yield_now().await;
                        }
                        if step > 0 {
                            counts.released.notify_one();
                        }
                        if !written {
                            break;
                        }
                    }
                    if close || !written {
                        break;
                    }
                }
                drop(socket);
                counts.closed.notify_one();
            });
        }
    });
    (format!("http://{address}/v1"), seen)
}

fn client(base_url: String) -> OpenAiClient {
    OpenAiClient::new(OpenAiConfig {
        base_url,
        default_model: "m".into(),
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        // A failed attempt fails the call: nothing here may cost one.
        max_attempts: 1,
        ..OpenAiConfig::default()
    })
    .expect("valid config")
}

/// One SSE event of a stream: a chunk with `content` as its delta, or the finish when `None`.
fn chunk_event(content: Option<&str>) -> String {
    let (delta, finish) = match content {
        Some(content) => (json!({"content": content}), json!(null)),
        None => (json!({}), json!("stop")),
    };
    format!(
        "data: {}\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    )
}

/// The SSE body of a streamed "Hello, world" in two deltas.
fn event_stream() -> Vec<u8> {
    [
        chunk_event(Some("Hello")),
        chunk_event(Some(", world")),
        chunk_event(None),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
    .into_bytes()
}

/// `body` as a chunked response in writes cut across chunk-size lines, data and line ends.
fn chunked_writes(body: &[u8]) -> Vec<Vec<u8>> {
    let mut wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        transfer-encoding: chunked\r\n\r\n"
        .to_vec();
    for (n, piece) in body.chunks(37).enumerate() {
        // Extensions on some chunk-size lines, upper-case hex on others.
        let size = if n % 2 == 0 {
            format!("{:x};n={n}\r\n", piece.len())
        } else {
            format!("{:X}\r\n", piece.len())
        };
        wire.extend_from_slice(size.as_bytes());
        wire.extend_from_slice(piece);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    wire.chunks(23).map(<[u8]>::to_vec).collect()
}

/// A complete non-streamed answer "hi", in one write.
fn plain_writes() -> Vec<Vec<u8>> {
    let body = json!({
        "id": "c2", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                     "finish_reason": "stop"}],
    })
    .to_string();
    vec![
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    ]
}

async fn say_hi(client: &OpenAiClient) {
    let request = ChatRequest::new("Writer", vec![Message::text(Role::User, "Say hi")]);
    let reply = client.complete(request, None).await.expect("completion");
    assert_eq!(reply.message.content_str(), "hi");
}

#[tokio::test]
async fn a_chunked_event_stream_cut_anywhere_is_read_and_its_connection_kept() {
    let (base_url, seen) =
        start_server(|_, _| Answer::Writes(chunked_writes(&event_stream()))).await;
    let client = client(base_url);
    for _ in 0..2 {
        let mut request = ChatRequest::new("Writer", vec![Message::text(Role::User, "Hi")]);
        request.stream = true;
        let deltas = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let sink_deltas = Arc::clone(&deltas);
        let sink: DeltaSink = Box::new(move |delta: &str| {
            sink_deltas.lock().unwrap().push(delta.to_owned());
        });
        let reply = client.complete(request, Some(sink)).await.expect("stream");
        assert_eq!(reply.message.content_str(), "Hello, world");
        // Whole events' text, one delta per read: how the writes fell into reads decides
        // whether the two came together.
        let deltas = deltas.lock().unwrap().clone();
        assert!(
            deltas == ["Hello", ", world"] || deltas == ["Hello, world"],
            "{deltas:?}"
        );
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
    assert_eq!(
        seen.connections.load(Ordering::SeqCst),
        1,
        "the second request rides the first's connection"
    );
}

#[tokio::test]
async fn a_kept_connection_the_server_dropped_is_replaced_without_a_failed_attempt() {
    // The first connection answers once, then takes the next request and closes without an
    // answer (as a server whose idle timeout struck just then); later connections answer.
    let (base_url, seen) = start_server(|connection, request| {
        if connection == 0 && request == 1 {
            Answer::Close
        } else {
            Answer::Writes(plain_writes())
        }
    })
    .await;
    let client = client(base_url);
    say_hi(&client).await;
    say_hi(&client).await;
    say_hi(&client).await;
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    assert_eq!(
        seen.requests.load(Ordering::SeqCst),
        4,
        "the dropped request went again, once"
    );
}

#[tokio::test]
async fn a_kept_connection_the_server_closed_while_idle_is_replaced() {
    // Every connection answers once and closes (no `connection: close` header to warn).
    let (base_url, seen) = start_server(|_, _| Answer::WritesThenClose(plain_writes())).await;
    let client = client(base_url);
    let closed = seen.closed.notified();
    say_hi(&client).await;
    closed.await;
    say_hi(&client).await;
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
}

/// A streamed "Hello, world" whose caller has all it needs at `[DONE]`.
async fn stream_hello(client: &OpenAiClient) {
    let mut request = ChatRequest::new("Writer", vec![Message::text(Role::User, "Hi")]);
    request.stream = true;
    let reply = client.complete(request, None).await.expect("stream");
    assert_eq!(reply.message.content_str(), "Hello, world");
}

#[tokio::test]
async fn a_stream_whose_body_ends_after_done_keeps_its_connection() {
    // The body's last chunk (`0`, the blank line) comes only after the client has its answer.
    let (base_url, seen) = start_server(|_, _| {
        let mut writes = chunked_writes(&event_stream());
        let mut wire = writes.concat();
        let end = wire.split_off(wire.len() - 5);
        assert_eq!(end, b"0\r\n\r\n");
        writes = vec![wire];
        Answer::Steps(vec![writes, vec![end]])
    })
    .await;
    let client = client(base_url);
    stream_hello(&client).await;
    let released = seen.released.notified();
    seen.release.notify_one();
    released.await;
    // The second answer's end is held too; the call has what it needs at `[DONE]`.
    stream_hello(&client).await;
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
    assert_eq!(
        seen.connections.load(Ordering::SeqCst),
        1,
        "the first answer's end was read before the second request, on the same connection"
    );
}

#[tokio::test]
async fn an_answer_before_the_request_was_read_whole_is_reported_not_the_write_error() {
    // A server that refuses a request from its head alone (as a proxy limiting bodies does):
    // it answers 413 and closes with the body unread, which resets the connection.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut chunk = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tokio::io::AsyncReadExt::read(&mut socket, &mut chunk)
                .await
                .expect("read");
            assert_ne!(n, 0, "the request's head");
            head.extend_from_slice(&chunk[..n]);
        }
        let body = r#"{"error":{"message":"request too large"}}"#;
        let answer = format!(
            "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(answer.as_bytes()).await.expect("answer");
        // Dropped with the rest of the request unread.
    });
    let client = client(format!("http://{address}/v1"));
    // Far more than the loopback's socket buffers take, so the write is still going on when
    // the server goes.
    let huge = "x".repeat(48 << 20);
    let request = ChatRequest::new("Writer", vec![Message::text(Role::User, huge)]);
    let error = client.complete(request, None).await.expect_err("refused");
    server.await.expect("server");
    match error {
        tessera_llm::LlmError::Status {
            status,
            body_excerpt,
        } => {
            assert_eq!(status, 413);
            assert!(body_excerpt.contains("request too large"), "{body_excerpt}");
        }
        other => panic!("expected the server's 413, got {other:?}"),
    }
}

/// Starts a streamed call on `client`; its deltas arrive on the returned channel.
fn spawn_stream(
    client: &OpenAiClient,
) -> (
    tokio::task::JoinHandle<Result<ChatResponse, LlmError>>,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (deltas, sink_seen) = tokio::sync::mpsc::unbounded_channel::<String>();
    let sink: DeltaSink = Box::new(move |text: &str| {
        let _ = deltas.send(text.to_owned());
    });
    let mut request = ChatRequest::new("Writer", vec![Message::text(Role::User, "Hi")]);
    request.stream = true;
    let client = client.clone();
    let call = tokio::spawn(async move { client.complete(request, Some(sink)).await });
    (call, sink_seen)
}

/// Streams "Hello, world" in three deltas: the first in the answer's first write, the other
/// two together in a second write that waits for `release`; in one length-delimited body, or
/// chunked with one chunk per event.
async fn deltas_in_two_reads(chunked: bool) {
    let first = [chunk_event(Some("Hello"))];
    let rest = [
        chunk_event(Some(", ")),
        chunk_event(Some("world")),
        chunk_event(None),
        "data: [DONE]\n\n".to_owned(),
    ];
    let (head, first, rest) = if chunked {
        let chunk = |event: &String| format!("{:x}\r\n{event}\r\n", event.len());
        (
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                .to_owned(),
            first.iter().map(chunk).collect::<String>(),
            rest.iter().map(chunk).collect::<String>() + "0\r\n\r\n",
        )
    } else {
        let (first, rest) = (first.concat(), rest.concat());
        (
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
                first.len() + rest.len()
            ),
            first,
            rest,
        )
    };
    let (base_url, seen) = start_server(move |_, _| {
        Answer::Steps(vec![
            vec![format!("{head}{first}").into_bytes()],
            vec![rest.clone().into_bytes()],
        ])
    })
    .await;
    let client = client(base_url);
    let (call, mut sink_seen) = spawn_stream(&client);
    // The first event is passed on while the rest of the answer is still held back.
    assert_eq!(sink_seen.recv().await.as_deref(), Some("Hello"));
    seen.release.notify_one();
    let reply = call.await.expect("task").expect("stream");
    assert_eq!(reply.message.content_str(), "Hello, world");
    // The two deltas that came in one read, as one.
    assert_eq!(sink_seen.recv().await.as_deref(), Some(", world"));
    assert_eq!(sink_seen.recv().await, None, "no other delta");
}

#[tokio::test]
async fn deltas_read_together_reach_the_sink_as_one_and_a_later_read_on_its_own() {
    deltas_in_two_reads(false).await;
}

#[tokio::test]
async fn a_chunked_body_s_chunks_read_together_make_one_delta() {
    deltas_in_two_reads(true).await;
}

/// Streams "abcd", one delta per step of the server: "a" at once, then "b", "c" and "d" each
/// when the test releases it (with the finish and `[DONE]` after "d"), as a length-delimited body.
fn stream_in_steps() -> Answer {
    let first = chunk_event(Some("a"));
    let later = [
        chunk_event(Some("b")),
        chunk_event(Some("c")),
        [chunk_event(Some("d")), chunk_event(None)].concat() + "data: [DONE]\n\n",
    ];
    let length = first.len() + later.iter().map(String::len).sum::<usize>();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {length}\r\n\r\n"
    );
    let mut steps = vec![vec![format!("{head}{first}").into_bytes()]];
    steps.extend(later.into_iter().map(|event| vec![event.into_bytes()]));
    Answer::Steps(steps)
}

async fn next_delta(
    sink_seen: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(10), sink_seen.recv())
        .await
        .expect("a delta within 10 s")
}

/// Lets the server's next step go and waits until it is written.
async fn release_step(seen: &Seen) {
    let released = seen.released.notified();
    seen.release.notify_one();
    released.await;
}

#[tokio::test]
async fn with_a_delta_interval_later_text_is_held_and_joined_and_none_is_lost() {
    const INTERVAL: Duration = Duration::from_secs(1);
    let (base_url, seen) = start_server(|_, _| stream_in_steps()).await;
    let client = OpenAiClient::new(OpenAiConfig {
        delta_interval: INTERVAL,
        ..client(base_url).config().clone()
    })
    .expect("valid config");
    let (call, mut sink_seen) = spawn_stream(&client);
    // The first text is never held.
    assert_eq!(next_delta(&mut sink_seen).await.as_deref(), Some("a"));
    release_step(&seen).await;
    let b_written_at = tokio::time::Instant::now();
    // Time for the client to read "b" on its own: without the window it would go on alone.
    tokio::time::sleep(Duration::from_millis(30)).await;
    release_step(&seen).await;
    // The server now holds "d" back: "b" and "c" go on together when their time comes, not
    // with the stream's next read.
    assert_eq!(next_delta(&mut sink_seen).await.as_deref(), Some("bc"));
    assert!(
        b_written_at.elapsed() >= INTERVAL - Duration::from_millis(50),
        "held for the interval after \"b\" came, went on after {:?}",
        b_written_at.elapsed()
    );
    release_step(&seen).await;
    let reply = call.await.expect("task").expect("stream");
    assert_eq!(reply.message.content_str(), "abcd");
    // "d" came within the interval after "bc": held, and passed on before the answer.
    assert_eq!(sink_seen.try_recv().ok().as_deref(), Some("d"));
    assert_eq!(sink_seen.recv().await, None, "no other delta");
}

/// The read timeout counts from each read: a stream whose reads come further apart in all
/// than the timeout, each within it, goes on; one that stalls for longer fails with a
/// timeout, after the text it streamed (not retried: the sink has seen part of the answer).
#[tokio::test]
async fn a_stream_times_out_only_when_one_wait_for_a_read_is_longer_than_the_timeout() {
    const TIMEOUT: Duration = Duration::from_secs(1);
    const GAP: Duration = Duration::from_millis(600);
    let (base_url, seen) = start_server(|_, _| stream_in_steps()).await;
    let client = OpenAiClient::new(OpenAiConfig {
        request_timeout: TIMEOUT,
        ..client(base_url).config().clone()
    })
    .expect("valid config");
    let (call, mut sink_seen) = spawn_stream(&client);
    assert_eq!(next_delta(&mut sink_seen).await.as_deref(), Some("a"));
    for expected in ["b", "c"] {
        tokio::time::sleep(GAP).await;
        release_step(&seen).await;
        assert_eq!(next_delta(&mut sink_seen).await.as_deref(), Some(expected));
    }
    // "d" is never released.
    let stalled_at = tokio::time::Instant::now();
    let failed = call.await.expect("task");
    assert_eq!(failed.err(), Some(LlmError::Timeout(TIMEOUT)));
    assert!(
        stalled_at.elapsed() >= TIMEOUT - Duration::from_millis(100),
        "timed out {:?} after the last read",
        stalled_at.elapsed()
    );
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1, "not retried");
}
