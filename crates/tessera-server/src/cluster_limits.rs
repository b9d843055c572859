//! The limits every node of a cluster must count together — WebSocket tickets, the per-tenant
//! message budget and the per-tenant open-chat quota — and the choice between them and a
//! single node's own counters. `serve.rs` builds [`LimitSeams`] once; handlers only see the
//! seams (`auth.rs` `TicketBook`, `limits.rs` `TenantBudget` and `OpenChatQuota`).
//! Accuracy of each: ARCHITECTURE.md, "Global limits".

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use anyhow::Context as _;
use tessera_cluster::{ClusterBus, GlobalLimits, TenantBudgets};

use crate::auth::Authenticator;
use crate::config::ServerConfig;
use crate::limits::{ChatQuota, OpenChatQuota, TenantBudget};

/// This node's handles to the deployment's limit buckets.
#[derive(Clone)]
pub struct ClusterLimits {
    limits: GlobalLimits,
    budgets: Addr<TenantBudgets>,
}

/// Opens (creating when missing) the deployment's limit buckets on `bus` and starts this
/// node's `TenantBudgets` actor (it reserves the tenants' message budget in chunks).
pub async fn cluster_limits(
    config: &ServerConfig,
    bus: &ClusterBus,
) -> anyhow::Result<ClusterLimits> {
    let ticket_ttl = Duration::from_secs(config.auth.ticket_ttl_s.max(1));
    let limits = GlobalLimits::open(bus, ticket_ttl)
        .await
        .context("cannot open the cluster's limit buckets in NATS JetStream")?;
    let budgets = TenantBudgets::new(
        limits.clone(),
        u64::from(config.limits.messages_per_minute_per_tenant),
    )
    .start();
    Ok(ClusterLimits { limits, budgets })
}

/// The limits the handlers use: this node's own, or the cluster's.
pub struct LimitSeams {
    /// Tenant-wide message budget.
    pub tenant_budget: Arc<TenantBudget>,
    /// Cap on each tenant's open chats.
    pub chat_quota: Arc<OpenChatQuota>,
    /// Where tickets live (`None`: this node's memory).
    tickets: Option<GlobalLimits>,
}

impl LimitSeams {
    /// A single node's limits (`cluster` = `None`), or the cluster's.
    pub fn new(config: &ServerConfig, cluster: Option<&ClusterLimits>) -> Self {
        let per_minute = config.limits.messages_per_minute_per_tenant;
        match cluster {
            None => Self {
                tenant_budget: Arc::new(TenantBudget::local(per_minute)),
                chat_quota: Arc::new(OpenChatQuota::Local(ChatQuota::default())),
                tickets: None,
            },
            Some(cluster) => Self {
                // Unlimited needs no round trip through the budget actor.
                tenant_budget: Arc::new(if per_minute == 0 {
                    TenantBudget::local(0)
                } else {
                    TenantBudget::Global(cluster.budgets.clone())
                }),
                chat_quota: Arc::new(OpenChatQuota::Global(Box::new(cluster.limits.clone()))),
                tickets: Some(cluster.limits.clone()),
            },
        }
    }

    /// `auth` with its tickets kept where these limits say.
    pub fn tickets_for(&self, auth: Authenticator) -> Authenticator {
        match &self.tickets {
            Some(limits) => auth.with_global_tickets(Box::new(limits.clone())),
            None => auth,
        }
    }
}

#[cfg(test)]
mod tests {
    //! Two nodes in one process, each with its own NATS connection (as two processes would
    //! have), sharing one deployment's buckets.

    use std::sync::Arc;

    use tessera_cluster::ClusterMetrics;
    use tessera_cluster::testing::{DropBuckets, test_nats_url};

    use super::*;
    use crate::auth::Caller;
    use crate::limits::QuotaRefusal;

    async fn node(url: &str, name: &str, prefix: &str, config: &ServerConfig) -> ClusterLimits {
        let bus = ClusterBus::connect(
            url,
            name,
            prefix,
            Duration::from_secs(5),
            Arc::new(ClusterMetrics::default()),
        )
        .await
        .expect("NATS reachable");
        cluster_limits(config, &bus).await.expect("limit buckets")
    }

    fn config(per_minute: u32) -> ServerConfig {
        let mut config = ServerConfig::default();
        config.auth.ticket_ttl_s = 30;
        config.limits.messages_per_minute_per_tenant = per_minute;
        config
    }

    #[actix_rt::test]
    async fn a_ticket_issued_on_one_node_is_redeemed_once_on_another() -> anyhow::Result<()> {
        let Some(url) = test_nats_url("a_ticket_issued_on_one_node_is_redeemed_once_on_another")
        else {
            return Ok(());
        };
        let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
        let _cleanup = DropBuckets::new(&url, &prefix);
        let config = config(0);
        let (a, b) = (
            node(&url, "a", &prefix, &config).await,
            node(&url, "b", &prefix, &config).await,
        );
        let auth_a =
            LimitSeams::new(&config, Some(&a)).tickets_for(crate::auth::tests::authenticator()?);
        let auth_b =
            LimitSeams::new(&config, Some(&b)).tickets_for(crate::auth::tests::authenticator()?);
        let caller = Caller {
            tenant: Arc::from("acme"),
            user: Arc::from("bob"),
        };
        crate::auth::tests::tickets_are_single_use_and_bound_to_their_chat(
            &auth_a, &auth_b, &caller,
        )
        .await
    }

    #[actix_rt::test]
    async fn the_tenant_budget_is_shared_by_the_nodes() {
        let Some(url) = test_nats_url("the_tenant_budget_is_shared_by_the_nodes") else {
            return;
        };
        let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
        let _cleanup = DropBuckets::new(&url, &prefix);
        // 16 a minute: each node reserves chunks of 2.
        let config = config(16);
        let (a, b) = (
            node(&url, "a", &prefix, &config).await,
            node(&url, "b", &prefix, &config).await,
        );
        let (a, b) = (
            LimitSeams::new(&config, Some(&a)),
            LimitSeams::new(&config, Some(&b)),
        );
        let tenant: Arc<str> = Arc::from("acme");
        let other: Arc<str> = Arc::from("globex");
        // Alternate between the nodes, as a load balancer would; more than the budget. A
        // window may turn during the loop (wall-clock minutes): then a node's count restarts,
        // so the loop is repeated until it ran within one minute.
        let allowed = loop {
            let minute = crate::limits::tests::current_minute();
            let mut allowed = 0;
            for i in 0..40 {
                let node = if i % 2 == 0 { &a } else { &b };
                if node.tenant_budget.spend(&tenant).resolve().await.is_ok() {
                    allowed += 1;
                }
            }
            if crate::limits::tests::current_minute() == minute {
                break allowed;
            }
        };
        assert!(
            (14..=16).contains(&allowed),
            "both nodes together let through at most the budget of 16 (chunks of 2, so at most 2 early refusals); got {allowed}"
        );
        assert!(
            b.tenant_budget.spend(&other).resolve().await.is_ok(),
            "another tenant has its own budget"
        );
    }

    #[actix_rt::test]
    async fn the_open_chat_quota_is_shared_by_the_nodes() {
        let Some(url) = test_nats_url("the_open_chat_quota_is_shared_by_the_nodes") else {
            return;
        };
        let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
        let _cleanup = DropBuckets::new(&url, &prefix);
        let config = config(0);
        let (a, b) = (
            node(&url, "a", &prefix, &config).await,
            node(&url, "b", &prefix, &config).await,
        );
        let (a, b) = (
            LimitSeams::new(&config, Some(&a)),
            LimitSeams::new(&config, Some(&b)),
        );
        // The global quota counts in NATS; the store is the local side's (unused here).
        let store = match tessera_store::SqliteStore::in_memory().await {
            Ok(store) => store,
            Err(e) => panic!("{e}"),
        };
        let registry = &store;
        let tenant: Arc<str> = Arc::from("acme");
        let first = a.chat_quota.reserve(registry, &tenant, 2).await;
        let second = b.chat_quota.reserve(registry, &tenant, 2).await;
        assert!(first.is_ok() && second.is_ok(), "two places of two");
        if let Ok(slot) = first {
            slot.opened();
        }
        assert_eq!(
            a.chat_quota.reserve(registry, &tenant, 2).await.err(),
            Some(QuotaRefusal::Full),
            "the quota counts the other node's chat"
        );
        // A failed creation gives its place back at once.
        if let Ok(slot) = second {
            slot.abandon().await;
        }
        let third = a.chat_quota.reserve(registry, &tenant, 2).await;
        assert!(third.is_ok(), "the abandoned place is free again");
        if let Ok(slot) = third {
            slot.opened();
        }
        // An ended chat frees its place (in the background: wait for it).
        b.chat_quota.chat_ended(&tenant, 2);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match b.chat_quota.reserve(registry, &tenant, 2).await {
                Ok(slot) => {
                    slot.opened();
                    break;
                }
                Err(refusal) => {
                    assert_eq!(refusal, QuotaRefusal::Full);
                    assert!(
                        std::time::Instant::now() < deadline,
                        "an ended chat's place was never freed"
                    );
                    actix_rt::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
}
