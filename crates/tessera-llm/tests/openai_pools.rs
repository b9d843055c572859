//! `OpenAiClient` keeps one connection pool per calling thread: the engine's arbiters each
//! drive their own connections (see `Inner::send`). Checked by counting the TCP connections a
//! keep-alive HTTP/1.1 server accepts.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tessera_llm::openai::{OpenAiClient, OpenAiConfig};
use tessera_llm::{ChatModel, ChatRequest, Message, Role};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

mod common;
use common::read_request;

/// Answers every request on a connection with the same completion, keeping it open.
async fn serve_connection(mut socket: TcpStream) {
    let body = json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                     "finish_reason": "stop"}],
    })
    .to_string();
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut buffer = Vec::new();
    while read_request(&mut socket, &mut buffer).await {
        if socket.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// A keep-alive server on a thread of its own; returns its address and its accept count.
fn start_server() -> (String, Arc<AtomicUsize>) {
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("server runtime");
        runtime.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("address"))
                .expect("send address");
            while let Ok((socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_connection(socket));
            }
        });
    });
    let address = rx.recv().expect("server address");
    (format!("http://{address}/v1"), accepted)
}

async fn say_hi(client: &OpenAiClient) {
    let request = ChatRequest::new("Writer", vec![Message::text(Role::User, "Say hi")]);
    let reply = client.complete(request, None).await.expect("completion");
    assert_eq!(reply.message.content_str(), "hi");
}

/// A thread with a single-threaded runtime, as an arbiter has.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn each_calling_thread_has_its_own_connections() {
    let (base_url, accepted) = start_server();
    let client = OpenAiClient::new(OpenAiConfig {
        base_url,
        api_key: Some("sk-test".into()),
        default_model: "m".into(),
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        max_attempts: 1,
        ..OpenAiConfig::default()
    })
    .expect("valid config");

    // Thread A: two calls, the second on the first's kept-alive connection; then A's runtime
    // keeps running (and driving that idle connection) until the end of the test.
    let (ready, a_called) = std::sync::mpsc::channel();
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let a_client = client.clone();
    let a = std::thread::spawn(move || {
        runtime().block_on(async move {
            say_hi(&a_client).await;
            say_hi(&a_client).await;
            ready.send(()).expect("signal");
            let _ = finished.await;
        });
    });
    a_called.recv().expect("thread A called");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    // Thread B does not ride A's idle connection (one shared pool would): it opens its own.
    let b_client = client.clone();
    std::thread::spawn(move || runtime().block_on(say_hi(&b_client)))
        .join()
        .expect("thread B");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);

    let _ = finish.send(());
    a.join().expect("thread A");
}
