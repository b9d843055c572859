//! Per-tenant token usage (`GET /api/v1/usage`, the tenant-labelled series in `/metrics`) and
//! the AG-UI endpoint's authentication, against the real binary with two API-key tenants.

use std::time::Duration;

use integration_tests::server::{ServerOptions, TestServer};
use serde_json::{Value, json};
use sha2::Digest;

const KEY_A: &str = "tk-usage-tenant-a-0123456789";
const KEY_B: &str = "tk-usage-tenant-b-9876543210";

fn sha256_hex(data: &str) -> String {
    sha2::Sha256::digest(data.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn send(request: reqwest::RequestBuilder) -> (u16, String) {
    let response = tokio::time::timeout(Duration::from_secs(60), async {
        let response = request.send().await?;
        let status = response.status().as_u16();
        Ok::<_, reqwest::Error>((status, response.text().await?))
    })
    .await
    .unwrap_or_else(|_| panic!("no answer in 60 s"));
    response.unwrap_or_else(|e| panic!("request: {e}"))
}

#[tokio::test]
async fn usage_is_counted_per_tenant_and_the_agui_endpoint_needs_a_credential() {
    let config = format!(
        "[[tenants]]\nid = \"tenant-a\"\napi_key_sha256 = [\"{}\"]\n\n[[tenants]]\nid = \"tenant-b\"\napi_key_sha256 = [\"{}\"]\n",
        sha256_hex(KEY_A),
        sha256_hex(KEY_B)
    );
    let server = TestServer::start(ServerOptions {
        config_toml: Some(config),
        ..ServerOptions::default()
    })
    .await;
    let http = reqwest::Client::new();
    let agui = format!("{}/api/v1/agui/Generator", server.base);
    let run = json!({"threadId": "t1", "runId": "r1", "messages": [
        {"id": "m1", "role": "user", "content": "Automate my weekly social media posts"}
    ]});

    let (status, body) = send(http.post(&agui).json(&run)).await;
    assert_eq!(status, 401, "no credential, no run: {body}");

    let (status, body) = send(http.post(&agui).bearer_auth(KEY_A).json(&run)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"RUN_FINISHED\""), "{body}");

    let usage = |key: &'static str| {
        let http = http.clone();
        let url = format!("{}/api/v1/usage", server.base);
        async move {
            let (status, body) = send(http.get(url).bearer_auth(key)).await;
            assert_eq!(status, 200, "{body}");
            serde_json::from_str::<Value>(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
        }
    };
    let a = usage(KEY_A).await;
    assert_eq!(a["tenant"], "tenant-a");
    let input = a["input_tokens"].as_u64().unwrap_or_default();
    assert!(input > 0, "{a}");
    assert!(a["model_calls"].as_u64().unwrap_or_default() > 0, "{a}");
    assert_eq!(
        a["total_tokens"].as_u64(),
        Some(input + a["output_tokens"].as_u64().unwrap_or_default())
    );
    let b = usage(KEY_B).await;
    assert_eq!(b["total_tokens"], 0, "tenant-b used nothing: {b}");

    let (status, metrics) = send(http.get(format!("{}/metrics", server.base))).await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains(&format!(
            "tessera_gen_ai_client_token_usage_total{{tenant=\"tenant-a\",token_type=\"input\"}} {input}"
        )),
        "{metrics}"
    );
    assert!(!metrics.contains("tenant=\"tenant-b\""), "{metrics}");
}
