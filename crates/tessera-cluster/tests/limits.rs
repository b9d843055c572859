//! Global limits over a real NATS server (JetStream key-value), with two connections standing
//! for two nodes.

mod common;

use std::time::Duration;

use actix::prelude::*;
use serde_json::json;
use tessera_cluster::{AllowMessage, GlobalLimits, TenantBudgets, TicketRedeemError};

async fn two_nodes(url: &str) -> (GlobalLimits, GlobalLimits, common::DropBuckets) {
    let prefix = common::unique_prefix();
    let cleanup = common::DropBuckets::new(url, &prefix);
    let a = common::node_bus(url, "a", &prefix, Duration::from_secs(5)).await;
    let b = common::node_bus(url, "b", &prefix, Duration::from_secs(5)).await;
    let ttl = Duration::from_secs(60);
    (
        GlobalLimits::open(&a, ttl).await.expect("buckets"),
        GlobalLimits::open(&b, ttl).await.expect("buckets"),
        cleanup,
    )
}

#[actix_rt::test]
async fn a_ticket_issued_on_one_node_is_redeemed_once_on_any() {
    let Some(url) = common::nats_url("a_ticket_issued_on_one_node") else {
        return;
    };
    let (a, b, _cleanup) = two_nodes(&url).await;
    let claims = json!({"tenant": "acme", "user": "u1"});
    a.issue_ticket("tk-1", "chat-1", claims.clone())
        .await
        .expect("issued");
    assert_eq!(
        b.redeem_ticket("tk-1", "chat-1").await.expect("redeemed"),
        claims
    );
    assert!(matches!(
        a.redeem_ticket("tk-1", "chat-1").await,
        Err(TicketRedeemError::Invalid)
    ));
    assert!(matches!(
        b.redeem_ticket("never-issued", "chat-1").await,
        Err(TicketRedeemError::Invalid)
    ));

    // Bound to its chat: used for another one, it is refused (and spent).
    a.issue_ticket("tk-2", "chat-2", claims.clone())
        .await
        .expect("issued");
    assert!(matches!(
        b.redeem_ticket("tk-2", "chat-other").await,
        Err(TicketRedeemError::Invalid)
    ));

    // Raced from both nodes: exactly one wins.
    for i in 0..20 {
        let ticket = format!("race-{i}");
        a.issue_ticket(&ticket, "chat-r", claims.clone())
            .await
            .expect("issued");
        let (ra, rb) = futures::join!(
            a.redeem_ticket(&ticket, "chat-r"),
            b.redeem_ticket(&ticket, "chat-r")
        );
        assert_eq!(
            usize::from(ra.is_ok()) + usize::from(rb.is_ok()),
            1,
            "ticket {ticket} redeemed exactly once"
        );
    }
}

#[actix_rt::test]
async fn the_open_chat_quota_holds_across_nodes() {
    let Some(url) = common::nats_url("the_open_chat_quota_holds_across_nodes") else {
        return;
    };
    let (a, b, _cleanup) = two_nodes(&url).await;
    let attempts: Vec<_> = (0..10)
        .map(|i| {
            let node = if i % 2 == 0 { a.clone() } else { b.clone() };
            async move { node.try_open_chat("acme", 3).await.expect("counter") }
        })
        .collect();
    let opened = futures::future::join_all(attempts).await;
    assert_eq!(opened.iter().filter(|o| **o).count(), 3, "{opened:?}");
    assert_eq!(b.open_chats("acme").await.expect("count"), 3);
    assert!(a.try_open_chat("other-tenant", 3).await.expect("counter"));

    a.chat_closed("acme").await.expect("closed");
    assert!(
        b.try_open_chat("acme", 3).await.expect("counter"),
        "a slot was freed"
    );
    assert!(!a.try_open_chat("acme", 3).await.expect("counter"));
    assert!(a.try_open_chat("acme", 0).await.expect("0 = unlimited"));
}

#[actix_rt::test]
async fn the_message_budget_is_shared_by_the_nodes() {
    let Some(url) = common::nats_url("the_message_budget_is_shared") else {
        return;
    };
    let minute = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() / 60)
            .unwrap_or(0)
    };
    // A window turning during the run would reset the budget: run again in the next one.
    for _ in 0..2 {
        let (a, b, _cleanup) = two_nodes(&url).await;
        let started = minute();
        let node_a = TenantBudgets::new(a, 16).start();
        let node_b = TenantBudgets::new(b, 16).start();
        let mut allowed = 0;
        for i in 0..40 {
            let node = if i % 3 == 0 { &node_a } else { &node_b };
            let ok = node
                .send(AllowMessage {
                    tenant: "acme".into(),
                })
                .await
                .expect("actor alive");
            allowed += usize::from(ok);
        }
        let other = node_a
            .send(AllowMessage {
                tenant: "globex".into(),
            })
            .await
            .expect("actor alive");
        if minute() != started {
            continue;
        }
        assert_eq!(allowed, 16, "exactly the budget, across both nodes");
        assert!(other, "another tenant has its own budget");
        return;
    }
    panic!("the minute turned during both runs");
}
