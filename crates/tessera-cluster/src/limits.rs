//! Limits that must hold across every node, kept in JetStream key-value buckets named after
//! the deployment's prefix. Every update is a compare-and-set on the key's revision, so no
//! two nodes can both take the last unit of a limit.
//!
//! Accuracy:
//! - **Tickets** are exact: the first redemption on any node spends a ticket (a CAS from the
//!   issued revision); every later one, anywhere, fails. The bucket expires them after their
//!   TTL. Only a SHA-256 of the ticket is stored.
//! - **Open-chat quota** is exact while nodes live: a creation increments the tenant's count
//!   only below the limit; completing a chat decrements it. A node dying between completing a
//!   chat and the decrement leaves the count one too high (the tenant is refused early, never
//!   let over the limit).
//! - **Message budget** never lets a tenant over its budget in a window: nodes reserve budget
//!   in chunks (an eighth of the budget) with CAS and spend it locally, so a tenant may be
//!   refused up to `nodes × chunk` messages early in a window. Windows are wall-clock minutes
//!   of each node's clock: nodes must keep their clocks in sync (NTP); a skew of s seconds
//!   moves that node's window boundary by s.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{ClusterBus, ClusterError};

/// How many times a compare-and-set is retried against concurrent writers before giving up.
const CAS_ATTEMPTS: usize = 64;

/// Why a ticket was not redeemed.
#[derive(Debug, thiserror::Error)]
pub enum TicketRedeemError {
    /// Unknown, expired, already spent, or issued for another chat.
    #[error("invalid or spent ticket")]
    Invalid,
    /// The bucket could not be reached; the ticket is not spent.
    #[error(transparent)]
    Unavailable(#[from] ClusterError),
}

#[derive(Serialize, Deserialize)]
struct TicketRecord {
    chat_id: String,
    claims: Value,
}

/// Handles to the deployment's limit buckets (cheap to clone).
#[derive(Clone)]
pub struct GlobalLimits {
    tickets: kv::Store,
    quotas: kv::Store,
    budgets: kv::Store,
}

fn kv_error(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Limits(e.to_string())
}

/// A key-value key for arbitrary text (tenant names may hold any character).
fn key_of(raw: &str) -> String {
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn ticket_key(ticket: &str) -> String {
    Sha256::digest(ticket.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn parse_count(value: &[u8]) -> u64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

impl GlobalLimits {
    /// Opens (creating when missing) the buckets of `bus`'s deployment; tickets live `ticket_ttl`.
    pub async fn open(bus: &ClusterBus, ticket_ttl: Duration) -> Result<Self, ClusterError> {
        let js = jetstream::new(bus.client().clone());
        let prefix = bus.subjects().prefix().to_owned();
        let bucket = |name: &str, max_age: Duration| kv::Config {
            bucket: format!("{prefix}_{name}"),
            history: 1,
            max_age,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        let tickets = open_bucket(
            &js,
            bucket("tickets", ticket_ttl.max(Duration::from_secs(1))),
        )
        .await?;
        // Counts must not expire; budgets only need the current and the previous window.
        let quotas = open_bucket(&js, bucket("quotas", Duration::ZERO)).await?;
        let budgets = open_bucket(&js, bucket("budgets", Duration::from_secs(180))).await?;
        Ok(Self {
            tickets,
            quotas,
            budgets,
        })
    }

    /// Records a single-use `ticket` for `chat_id`, carrying `claims` (who it authenticates).
    pub async fn issue_ticket(
        &self,
        ticket: &str,
        chat_id: &str,
        claims: Value,
    ) -> Result<(), ClusterError> {
        let record = TicketRecord {
            chat_id: chat_id.to_owned(),
            claims,
        };
        let body = serde_json::to_vec(&record).map_err(|e| ClusterError::Decode(e.to_string()))?;
        self.tickets
            .create(ticket_key(ticket), Bytes::from(body))
            .await
            .map_err(kv_error)?;
        Ok(())
    }

    /// Spends `ticket` for `chat_id` and returns its claims; any node, exactly once.
    pub async fn redeem_ticket(
        &self,
        ticket: &str,
        chat_id: &str,
    ) -> Result<Value, TicketRedeemError> {
        let key = ticket_key(ticket);
        let entry = self
            .tickets
            .entry(key.as_str())
            .await
            .map_err(kv_error)?
            .ok_or(TicketRedeemError::Invalid)?;
        if entry.operation != kv::Operation::Put || entry.value.is_empty() {
            return Err(TicketRedeemError::Invalid);
        }
        // Spent by replacing the record with nothing, from the revision we read: of two
        // concurrent redemptions only one update succeeds.
        match self
            .tickets
            .update(&key, Bytes::new(), entry.revision)
            .await
        {
            Ok(_) => {}
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                return Err(TicketRedeemError::Invalid);
            }
            Err(e) => return Err(kv_error(e).into()),
        }
        let record: TicketRecord = serde_json::from_slice(&entry.value)
            .map_err(|e| ClusterError::Decode(e.to_string()))?;
        if record.chat_id != chat_id {
            return Err(TicketRedeemError::Invalid);
        }
        Ok(record.claims)
    }

    /// Counts one more open chat of `tenant` if it has fewer than `limit` (0 = unlimited);
    /// false when the quota is full.
    pub async fn try_open_chat(&self, tenant: &str, limit: u64) -> Result<bool, ClusterError> {
        if limit == 0 {
            return Ok(true);
        }
        let key = key_of(tenant);
        let added = self
            .add_below(&self.quotas, &key, 1, limit)
            .await
            .map(|granted| granted == 1)?;
        Ok(added)
    }

    /// One chat of `tenant` completed (or was refused after [`Self::try_open_chat`]).
    pub async fn chat_closed(&self, tenant: &str) -> Result<(), ClusterError> {
        let key = key_of(tenant);
        for _ in 0..CAS_ATTEMPTS {
            let Some(entry) = self.quotas.entry(key.as_str()).await.map_err(kv_error)? else {
                return Ok(());
            };
            let next = parse_count(&entry.value).saturating_sub(1);
            match self
                .quotas
                .update(&key, Bytes::from(next.to_string()), entry.revision)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(kv_error(e)),
            }
        }
        Err(ClusterError::Limits(format!(
            "quota of {tenant} too contended"
        )))
    }

    /// The tenant's open chats as counted (for tests and metrics).
    pub async fn open_chats(&self, tenant: &str) -> Result<u64, ClusterError> {
        let entry = self.quotas.entry(key_of(tenant)).await.map_err(kv_error)?;
        Ok(entry.map_or(0, |e| parse_count(&e.value)))
    }

    /// Reserves up to `want` of `tenant`'s `per_window` messages in the window `window`;
    /// returns how many were granted (0 when the window's budget is spent).
    pub async fn reserve_messages(
        &self,
        tenant: &str,
        window: u64,
        want: u64,
        per_window: u64,
    ) -> Result<u64, ClusterError> {
        let key = format!("{}.{window}", key_of(tenant));
        self.add_below(&self.budgets, &key, want, per_window).await
    }

    /// Adds up to `want` to the counter at `key` without passing `limit`; returns what was added.
    async fn add_below(
        &self,
        store: &kv::Store,
        key: &str,
        want: u64,
        limit: u64,
    ) -> Result<u64, ClusterError> {
        for _ in 0..CAS_ATTEMPTS {
            let entry = store.entry(key).await.map_err(kv_error)?;
            let (count, revision) = match &entry {
                Some(e) if e.operation == kv::Operation::Put => {
                    (parse_count(&e.value), Some(e.revision))
                }
                Some(e) => (0, Some(e.revision)),
                None => (0, None),
            };
            let granted = want.min(limit.saturating_sub(count));
            if granted == 0 {
                return Ok(0);
            }
            let value = Bytes::from((count + granted).to_string());
            let written = match revision {
                Some(rev) => store
                    .update(key, value, rev)
                    .await
                    .map(|_| ())
                    .map_err(|e| {
                        (
                            e.kind() == kv::UpdateErrorKind::WrongLastRevision,
                            kv_error(e),
                        )
                    }),
                None => store
                    .create(key, value)
                    .await
                    .map(|_| ())
                    .map_err(|e| (e.kind() == kv::CreateErrorKind::AlreadyExists, kv_error(e))),
            };
            match written {
                Ok(()) => return Ok(granted),
                Err((true, _)) => continue,
                Err((false, e)) => return Err(e),
            }
        }
        Err(ClusterError::Limits(format!("counter {key} too contended")))
    }
}

/// The bucket if it exists, else a new one. Created as the key-value stream itself rather
/// than with `create_key_value`, which first asks for the account's limits in a shape NATS
/// servers before 2.10 do not answer with. Two nodes creating it at once is harmless: creating
/// an identical stream succeeds.
async fn open_bucket(
    js: &jetstream::Context,
    config: kv::Config,
) -> Result<kv::Store, ClusterError> {
    if let Ok(store) = js.get_key_value(config.bucket.clone()).await {
        return Ok(store);
    }
    let stream = jetstream::stream::Config {
        name: format!("KV_{}", config.bucket),
        subjects: vec![format!("$KV.{}.>", config.bucket)],
        max_messages_per_subject: config.history,
        max_age: config.max_age,
        storage: config.storage,
        num_replicas: 1,
        discard: jetstream::stream::DiscardPolicy::New,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        ..Default::default()
    };
    js.get_or_create_stream(stream).await.map_err(kv_error)?;
    js.get_key_value(config.bucket).await.map_err(kv_error)
}

/// The current one-minute window of this node's clock.
fn current_window() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60)
}

/// Spend one message of `tenant`'s global budget; false when it is spent for this minute.
#[derive(Message, Debug)]
#[rtype(result = "bool")]
pub struct AllowMessage {
    /// The tenant.
    pub tenant: String,
}

#[derive(Default)]
struct LocalBudget {
    window: u64,
    /// Reserved from the global counter and not spent yet.
    left: u64,
    /// The global budget of this window is spent.
    exhausted: bool,
    refilling: bool,
    waiting: Vec<tokio::sync::oneshot::Sender<bool>>,
}

/// The per-tenant message budget of one node: spends locally what it reserved from the global
/// counter in chunks (see the module docs for the accuracy this gives).
pub struct TenantBudgets {
    limits: GlobalLimits,
    per_minute: u64,
    chunk: u64,
    tenants: HashMap<String, LocalBudget>,
}

impl TenantBudgets {
    /// `per_minute` messages per tenant across every node (0 = unlimited).
    pub fn new(limits: GlobalLimits, per_minute: u64) -> Self {
        Self {
            limits,
            per_minute,
            chunk: (per_minute / 8).max(1),
            tenants: HashMap::new(),
        }
    }

    fn refill(&mut self, tenant: String, window: u64, ctx: &mut Context<Self>) {
        let limits = self.limits.clone();
        let (chunk, per_minute) = (self.chunk, self.per_minute);
        let key = tenant.clone();
        let reserve = async move {
            limits
                .reserve_messages(&key, window, chunk, per_minute)
                .await
        };
        ctx.spawn(reserve.into_actor(self).map(move |granted, act, _| {
            let Some(budget) = act.tenants.get_mut(&tenant) else {
                return;
            };
            budget.refilling = false;
            let granted = granted.unwrap_or_else(|e| {
                // Unreachable bucket: refuse rather than let a tenant past the limit.
                tracing::warn!(tenant = %tenant, error = %e, "message budget unavailable");
                0
            });
            if budget.window != window {
                // The window turned meanwhile: what was reserved belongs to the old one.
                for waiter in budget.waiting.drain(..) {
                    let _ = waiter.send(false);
                }
                return;
            }
            budget.left += granted;
            budget.exhausted = granted == 0;
            for waiter in budget.waiting.drain(..) {
                let allowed = budget.left > 0;
                budget.left = budget.left.saturating_sub(1);
                let _ = waiter.send(allowed);
            }
        }));
    }
}

impl Actor for TenantBudgets {
    type Context = Context<Self>;
}

impl Handler<AllowMessage> for TenantBudgets {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, msg: AllowMessage, ctx: &mut Self::Context) -> Self::Result {
        if self.per_minute == 0 {
            return Box::pin(async { true });
        }
        let window = current_window();
        let budget = self.tenants.entry(msg.tenant.clone()).or_default();
        if budget.window != window {
            budget.window = window;
            budget.left = 0;
            budget.exhausted = false;
        }
        if budget.left > 0 {
            budget.left -= 1;
            return Box::pin(async { true });
        }
        if budget.exhausted {
            return Box::pin(async { false });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        budget.waiting.push(tx);
        if !budget.refilling {
            budget.refilling = true;
            self.refill(msg.tenant, window, ctx);
        }
        Box::pin(async move { rx.await.unwrap_or(false) })
    }
}
