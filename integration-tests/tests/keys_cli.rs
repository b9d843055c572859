//! `tessera hash-key` and `tessera gen-secret-key`, as `deploy/README.md` tells operators to
//! run them: their output goes into `tessera.toml` and the server accepts it.

use std::io::Write as _;
use std::process::{Command, Stdio};

use integration_tests::server::{ServerOptions, TestServer};
use integration_tests::tessera_bin;
use sha2::Digest as _;

fn run(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut child = Command::new(tessera_bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run tessera: {e}"));
    if let (Some(mut pipe), Some(text)) = (child.stdin.take(), stdin) {
        pipe.write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sha256_hex(text: &str) -> String {
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn hashed_keys_and_a_generated_vault_key_are_accepted_by_the_server() {
    let key = "tk-live-0123456789abcdef";
    // `echo KEY | tessera hash-key`: the newline echo adds is not part of the key.
    let (ok, from_stdin, err) = run(&["hash-key"], Some(&format!("{key}\n")));
    assert!(ok, "{err}");
    assert_eq!(from_stdin, sha256_hex(key));
    let (ok, from_arg, err) = run(&["hash-key", key], None);
    assert!(ok, "{err}");
    assert_eq!(from_arg, from_stdin);
    let (ok, _, err) = run(&["hash-key"], Some(""));
    assert!(!ok, "an empty key is refused");
    assert!(err.contains("empty"), "{err}");

    let (ok, secret, err) = run(&["gen-secret-key"], None);
    assert!(ok, "{err}");
    assert_eq!(secret.len(), 64, "{secret}");
    assert!(secret.chars().all(|c| c.is_ascii_hexdigit()), "{secret}");
    let (_, second, _) = run(&["gen-secret-key"], None);
    assert_ne!(secret, second, "every key is new");

    let server = TestServer::start(ServerOptions {
        config_toml: Some(format!(
            "[secrets]\nkey_hex = \"{secret}\"\n\n[[tenants]]\nid = \"acme\"\napi_key_sha256 = [\"{from_stdin}\"]\n"
        )),
        ..Default::default()
    })
    .await;
    let http = reqwest::Client::new();
    let status = |key: &'static str| {
        let request = http
            .get(format!("{}/api/v1/workflows", server.base))
            .bearer_auth(key)
            .send();
        async move { request.await.map(|r| r.status().as_u16()).unwrap_or(0) }
    };
    assert_eq!(status("tk-live-0123456789abcdef").await, 200);
    assert_eq!(status("tk-live-wrong").await, 401);
}
