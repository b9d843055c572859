//! `OpenAiClient` against `https` endpoints: a request reaches a server whose certificate the
//! roots vouch for over TLS, a server whose certificate they do not is refused before any
//! request is sent, and a server's answer sent before it read the request whole is reported.
//!
//! The roots are the platform's, read from `SSL_CERT_FILE` when it is set (as OpenSSL does):
//! this test binary sets it to its own CA, so it holds exactly one test.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tessera_llm::openai::{OpenAiClient, OpenAiConfig};
use tessera_llm::{ChatModel, ChatRequest, LlmError, Message, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

fn tls_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tls")
        .join(name)
}

/// A completion "over tls", closing its connection.
fn completion() -> String {
    let body = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"over tls"},"finish_reason":"stop"}]}"#;
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A TLS server on a random port of 127.0.0.1 with the certificate `cert`: it reads each
/// connection's request head (not its body), answers `response` and closes, and reports each
/// request's first line.
async fn serve_tls(
    cert: &str,
    key: &str,
    response: String,
) -> (u16, mpsc::UnboundedReceiver<String>) {
    let certs = vec![CertificateDer::from_pem_file(tls_file(cert)).expect("certificate")];
    let key = PrivateKeyDer::from_pem_file(tls_file(key)).expect("key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (seen, requests) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (acceptor, seen, response) = (acceptor.clone(), seen.clone(), response.clone());
            tokio::spawn(async move {
                // A refused handshake ends here, with nothing read.
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut chunk = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let _ = seen.send(text.lines().next().unwrap_or_default().to_owned());
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, requests)
}

fn client(port: u16) -> OpenAiClient {
    OpenAiClient::new(OpenAiConfig {
        base_url: format!("https://localhost:{port}/v1"),
        api_key: Some("sk-tls-test".to_owned()),
        default_model: "m".to_owned(),
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
        max_attempts: 1,
        ..OpenAiConfig::default()
    })
    .expect("config")
}

fn request() -> ChatRequest {
    ChatRequest::new("Writer", vec![Message::text(Role::User, "hi")])
}

#[tokio::test]
async fn over_tls_an_endpoint_is_reached_an_untrusted_certificate_refused_and_an_early_answer_reported()
 {
    // SAFETY: the one test of this binary sets it before any client reads the roots, and no
    // other thread of the process reads the environment meanwhile.
    unsafe { std::env::set_var("SSL_CERT_FILE", tls_file("test-ca.pem")) };

    let (port, mut requests) = serve_tls("trusted-cert.pem", "trusted-key.pem", completion()).await;
    let reply = client(port)
        .complete(request(), None)
        .await
        .expect("a trusted server answers over TLS");
    assert_eq!(reply.message.content.as_deref(), Some("over tls"));
    assert_eq!(
        requests.recv().await.as_deref(),
        Some("POST /v1/chat/completions HTTP/1.1")
    );

    let (port, mut requests) =
        serve_tls("untrusted-cert.pem", "untrusted-key.pem", completion()).await;
    let err = client(port)
        .complete(request(), None)
        .await
        .expect_err("a certificate the roots do not vouch for is refused");
    match &err {
        LlmError::Http(text) => assert!(text.contains("certificate"), "{text}"),
        other => panic!("expected an HTTP error naming the certificate, got {other:?}"),
    }
    assert!(
        requests.try_recv().is_err(),
        "no request may reach a server whose certificate was refused"
    );

    // A server that refuses a request from its head alone (a body limit) answers 413 and closes
    // with the body unread: the client reports the 413, not the failed write.
    let body = r#"{"error":{"message":"request too large"}}"#;
    let refusal = format!(
        "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (port, mut requests) = serve_tls("trusted-cert.pem", "trusted-key.pem", refusal).await;
    // Far more than the loopback's socket buffers take, so the write is still going on when
    // the server goes.
    let huge = ChatRequest::new(
        "Writer",
        vec![Message::text(Role::User, "x".repeat(48 << 20))],
    );
    match client(port).complete(huge, None).await {
        Err(LlmError::Status {
            status,
            body_excerpt,
        }) => {
            assert_eq!(status, 413);
            assert!(body_excerpt.contains("request too large"), "{body_excerpt}");
        }
        other => panic!("expected the server's 413, got {other:?}"),
    }
    assert_eq!(
        requests.recv().await.as_deref(),
        Some("POST /v1/chat/completions HTTP/1.1")
    );
}
