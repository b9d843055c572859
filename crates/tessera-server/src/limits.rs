//! Per-tenant limits shared by every connection and worker: the tenant-wide message budget
//! and the cap on open chats. Per-connection limits live in `ws.rs`.
//!
//! Each limit is one seam with two sides: [`TenantBudget`] and [`OpenChatQuota`] are this
//! node's own counters on a single node, and the deployment's `GlobalLimits` (NATS key-value,
//! `tessera-cluster`) in cluster mode, where every node must count the same tenant. Callers
//! (`ws.rs`, `rest.rs`, `agui.rs`) use the seam only.
//!
//! WHY a mutex-guarded map and not an actor for the local side: each check is a few
//! nanoseconds of arithmetic on the request path; a round trip through a mailbox would cost
//! more than the check.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::Addr;
use tessera_cluster::{AllowMessage, GlobalLimits, TenantBudgets};
use tessera_store::ChatStore;

/// The budget window.
const WINDOW: Duration = Duration::from_secs(60);

/// Fixed one-minute message windows, one per tenant.
#[derive(Debug)]
pub struct TenantRateLimiter {
    per_minute: u32,
    windows: Mutex<Windows>,
}

/// The windows, and the size at which stale ones are next swept out.
#[derive(Debug, Default)]
struct Windows {
    by_key: HashMap<Arc<str>, (Instant, u32)>,
    sweep_at: usize,
}

/// Keys kept before the first sweep of expired windows.
const FIRST_SWEEP: usize = 1024;

impl TenantRateLimiter {
    /// A limiter allowing `per_minute` messages per tenant per minute (0 = unlimited).
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            windows: Mutex::new(Windows::default()),
        }
    }

    /// Counts one message of `tenant`; false when the tenant is over its budget.
    #[cfg(test)]
    pub fn allow(&self, tenant: &Arc<str>) -> bool {
        self.check(tenant).is_ok()
    }

    /// Counts one message of `key`; over its budget, `Err` says when its window ends (for
    /// `Retry-After`). Refused messages count too, so hammering does not help.
    pub fn check(&self, key: &Arc<str>) -> Result<(), Duration> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if windows.by_key.len() >= windows.sweep_at.max(FIRST_SWEEP) {
            // Keys come and go (callers, tenants): expired windows leave, so the map does
            // not grow with every key ever seen.
            windows
                .by_key
                .retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
            windows.sweep_at = windows.by_key.len().saturating_mul(2);
        }
        let window = windows.by_key.entry(key.clone()).or_insert((now, 0));
        if now.duration_since(window.0) >= WINDOW {
            *window = (now, 0);
        }
        window.1 = window.1.saturating_add(1);
        if window.1 <= self.per_minute {
            Ok(())
        } else {
            Err(WINDOW.saturating_sub(now.duration_since(window.0)))
        }
    }

    /// How many keys have a window (for tests of the sweep).
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_key
            .len()
    }
}

/// The REST input budget: each caller (tenant and user) has its own per-minute limit, and
/// every REST input also spends its tenant's budget, shared with WebSocket frames.
#[derive(Debug)]
pub struct RestInputBudget {
    per_caller: TenantRateLimiter,
}

impl RestInputBudget {
    /// `per_minute` inputs per caller (0 = no per-caller limit).
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_caller: TenantRateLimiter::new(per_minute),
        }
    }

    /// Spends one input of `user` of `tenant` from both budgets; `Err(retry_after)` when over
    /// either (both are spent either way, as a WebSocket frame spends both).
    pub async fn spend(
        &self,
        tenants: &TenantBudget,
        tenant: &Arc<str>,
        user: &str,
    ) -> Result<(), Duration> {
        let caller: Arc<str> = Arc::from(format!("{tenant}\u{0}{user}"));
        let own = self.per_caller.check(&caller);
        let shared = tenants.spend(tenant).resolve().await;
        match (own, shared) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(a), Err(b)) => Err(a.max(b)),
            (Err(wait), _) | (_, Err(wait)) => Err(wait),
        }
    }
}

/// The tenant-wide message budget (WebSocket frames and REST inputs): this node's windows, or
/// in cluster mode the deployment's, reserved in chunks by the node's `TenantBudgets` actor
/// (accuracy: ARCHITECTURE.md, "Global limits").
pub enum TenantBudget {
    /// One node: [`TenantRateLimiter`].
    Local(TenantRateLimiter),
    /// Several nodes: every node spends from the same per-tenant budget.
    Global(Addr<TenantBudgets>),
}

/// The answer of [`TenantBudget::spend`]: known now, or to be awaited (the global budget may
/// have to reserve a chunk first).
pub enum BudgetCheck {
    /// Decided; `Err` says when the window ends.
    Now(Result<(), Duration>),
    /// Ask the node's `TenantBudgets` actor.
    Ask(actix::dev::Request<TenantBudgets, AllowMessage>),
}

impl BudgetCheck {
    /// The decision (an unreachable budget actor refuses: never let a tenant over).
    pub async fn resolve(self) -> Result<(), Duration> {
        match self {
            Self::Now(decided) => decided,
            Self::Ask(asked) => match asked.await {
                Ok(true) => Ok(()),
                Ok(false) | Err(_) => Err(until_next_minute()),
            },
        }
    }
}

/// What is left of this wall-clock minute (the global budget's window).
fn until_next_minute() -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Duration::from_secs(60 - now.as_secs() % 60)
}

impl TenantBudget {
    /// `per_minute` messages per tenant (0 = unlimited) on this node only.
    pub fn local(per_minute: u32) -> Self {
        Self::Local(TenantRateLimiter::new(per_minute))
    }

    /// Spends one message of `tenant` (refused ones count too, so hammering does not help).
    pub fn spend(&self, tenant: &Arc<str>) -> BudgetCheck {
        match self {
            Self::Local(limiter) => BudgetCheck::Now(limiter.check(tenant)),
            Self::Global(budgets) => BudgetCheck::Ask(budgets.send(AllowMessage {
                tenant: tenant.to_string(),
            })),
        }
    }
}

/// Serializes the chat creations of each tenant, so a burst cannot overshoot the open-chat
/// cap: a creation holds its tenant's turn while it counts the tenant's open chats (in the
/// store: chats that left memory count too) and creates its own.
///
/// WHY an async lock per tenant and not an actor: the critical section spans awaits (the
/// count and the chat's first write), and only creations of one tenant must queue; an actor
/// would either serialize every tenant (`ctx.wait`) or re-implement this queue. The std
/// mutex guards only the map, for an insert or a removal; an entry leaves the map as soon as
/// no creation holds or waits for it.
#[derive(Debug, Default)]
pub struct ChatQuota {
    turns: Mutex<HashMap<Arc<str>, Arc<tokio::sync::Mutex<()>>>>,
}

/// A tenant's turn to create a chat; the next creation of the tenant waits until it drops.
pub struct CreationTurn<'a> {
    quota: &'a ChatQuota,
    tenant: Arc<str>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl ChatQuota {
    /// Waits for `tenant`'s turn to check the cap and create a chat.
    pub async fn turn(&self, tenant: &Arc<str>) -> CreationTurn<'_> {
        let lock = {
            let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
            turns.entry(tenant.clone()).or_default().clone()
        };
        CreationTurn {
            quota: self,
            tenant: tenant.clone(),
            guard: Some(lock.lock_owned().await),
        }
    }

    /// Tenants with a creation in progress or waiting.
    #[cfg(test)]
    fn tenants(&self) -> usize {
        self.turns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for CreationTurn<'_> {
    fn drop(&mut self) {
        let mut turns = self.quota.turns.lock().unwrap_or_else(|p| p.into_inner());
        self.guard = None;
        // Clones are taken only under this map lock: a count of 1 (the map's own) means
        // nobody holds or waits for this tenant's turn, so the entry may go.
        if turns
            .get(&self.tenant)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            turns.remove(&self.tenant);
        }
    }
}

/// The cap on each tenant's open chats: counted in the store, creations of a tenant taking
/// turns on this node ([`ChatQuota`]), or in cluster mode in the deployment's key-value bucket (exact while nodes
/// live; see ARCHITECTURE.md, "Global limits").
pub enum OpenChatQuota {
    /// One node.
    Local(ChatQuota),
    /// Several nodes.
    Global(Box<GlobalLimits>),
}

/// Why a chat may not be opened now.
#[derive(Debug, PartialEq, Eq)]
pub enum QuotaRefusal {
    /// The tenant has `limit` open chats already.
    Full,
    /// The count could not be read (store unreachable, key-value bucket unreachable).
    Unavailable,
}

/// A tenant's place for one more open chat, held while the chat is created: keep it with
/// [`QuotaSlot::opened`] once the chat exists, or give it back with [`QuotaSlot::abandon`].
pub struct QuotaSlot<'a> {
    /// Local: creations of one tenant are serialized until the chat is registered.
    _turn: Option<CreationTurn<'a>>,
    /// Global: the counted place, given back when the creation fails.
    counted: Option<(GlobalLimits, Arc<str>)>,
}

impl QuotaSlot<'_> {
    /// The chat was created (and registered): its place stays counted until it ends.
    pub fn opened(self) {}

    /// The chat was not created: give the place back.
    pub async fn abandon(self) {
        if let Some((limits, tenant)) = self.counted
            && let Err(e) = limits.chat_closed(&tenant).await
        {
            tracing::warn!(tenant = %tenant, error = %e, "could not give back an open-chat place");
        }
    }
}

impl OpenChatQuota {
    /// Takes a place for one more open chat of `tenant` if it has fewer than `limit`
    /// (0 = unlimited). `store` holds the tenant's chats (the local count).
    pub async fn reserve(
        &self,
        store: &dyn ChatStore,
        tenant: &Arc<str>,
        limit: usize,
    ) -> Result<QuotaSlot<'_>, QuotaRefusal> {
        match self {
            Self::Local(quota) => {
                // Held until the chat is registered, so concurrent creations cannot overshoot.
                let turn = quota.turn(tenant).await;
                if limit > 0 {
                    // Counted in the store: open chats that left memory count too.
                    let open = store.count_open_chats(tenant).await.map_err(|e| {
                        tracing::error!(tenant = %tenant, error = %e, "cannot count open chats");
                        QuotaRefusal::Unavailable
                    })?;
                    if open >= u64::try_from(limit).unwrap_or(u64::MAX) {
                        return Err(QuotaRefusal::Full);
                    }
                }
                Ok(QuotaSlot {
                    _turn: Some(turn),
                    counted: None,
                })
            }
            Self::Global(limits) => {
                if limit == 0 {
                    return Ok(QuotaSlot {
                        _turn: None,
                        counted: None,
                    });
                }
                let limit = u64::try_from(limit).unwrap_or(u64::MAX);
                match limits.try_open_chat(tenant, limit).await {
                    Ok(true) => Ok(QuotaSlot {
                        _turn: None,
                        counted: Some(((**limits).clone(), tenant.clone())),
                    }),
                    Ok(false) => Err(QuotaRefusal::Full),
                    Err(e) => {
                        tracing::warn!(tenant = %tenant, error = %e, "open-chat quota unavailable");
                        Err(QuotaRefusal::Unavailable)
                    }
                }
            }
        }
    }

    /// A chat of `tenant` ended (completed, or deleted while open): its place is free. The
    /// local count reads the chats themselves and needs nothing; the global one is decremented
    /// in the background (called from the engine's event observer, which must not wait).
    pub fn chat_ended(&self, tenant: &Arc<str>, limit: usize) {
        if let Self::Global(limits) = self
            && limit > 0
        {
            let (limits, tenant) = ((**limits).clone(), tenant.clone());
            actix_rt::spawn(async move {
                if let Err(e) = limits.chat_closed(&tenant).await {
                    tracing::warn!(tenant = %tenant, error = %e, "could not count an ended chat");
                }
            });
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The current wall-clock minute (the global budget's window).
    pub(crate) fn current_minute() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 60)
    }

    #[test]
    fn tenant_budget_is_per_tenant() {
        let limiter = TenantRateLimiter::new(3);
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        assert!((0..3).all(|_| limiter.allow(&a)));
        assert!(!limiter.allow(&a), "the fourth message of a is refused");
        assert!(limiter.allow(&b), "b has its own budget");
        assert!(TenantRateLimiter::new(0).allow(&a), "0 means unlimited");
        let retry = limiter.check(&a).err().map(|d| d.as_secs());
        assert!(retry.is_some_and(|s| s <= 60), "retry after {retry:?}");
    }

    #[test]
    fn rest_inputs_spend_the_caller_and_the_tenant_budget() {
        let tenants = TenantBudget::local(3);
        let budget = RestInputBudget::new(2);
        let a: Arc<str> = Arc::from("a");
        let spend =
            |user: &'static str| futures::executor::block_on(budget.spend(&tenants, &a, user));
        assert!(spend("alice").is_ok());
        assert!(spend("alice").is_ok());
        assert!(spend("alice").is_err(), "alice's own limit");
        assert!(
            spend("carol").is_err(),
            "the tenant's budget is spent (3 of 3 by alice)"
        );
        assert!(
            futures::executor::block_on(tenants.spend(&a).resolve()).is_err(),
            "WebSocket frames share it"
        );
    }

    #[test]
    fn expired_windows_are_swept_out() {
        let limiter = TenantRateLimiter::new(5);
        for i in 0..FIRST_SWEEP {
            limiter.allow(&Arc::from(format!("k{i}")));
        }
        // Age every window past the minute, then add one more key.
        {
            let mut windows = limiter.windows.lock().unwrap_or_else(|p| p.into_inner());
            let old = Instant::now().checked_sub(WINDOW * 2);
            for (start, _) in windows.by_key.values_mut() {
                *start = old.unwrap_or(*start);
            }
        }
        limiter.allow(&Arc::from("new"));
        assert_eq!(limiter.keys(), 1, "only the live window is left");
    }

    #[actix::test]
    async fn creations_of_a_tenant_take_turns_and_the_map_shrinks() {
        use futures::FutureExt;
        let quota = ChatQuota::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let first = quota.turn(&a).await;
        assert!(
            quota.turn(&a).now_or_never().is_none(),
            "a second creation of tenant a waits for the first"
        );
        let other = quota.turn(&b).now_or_never();
        assert!(other.is_some(), "tenant b does not wait for a");
        drop(other);
        assert_eq!(quota.tenants(), 1, "b's entry left with its turn");
        let mut waiting = Box::pin(quota.turn(&a));
        assert!(futures::poll!(&mut waiting).is_pending());
        drop(first);
        let second = waiting.await;
        assert_eq!(
            quota.tenants(),
            1,
            "a is still in use by the second creation"
        );
        drop(second);
        assert_eq!(
            quota.tenants(),
            0,
            "no creation in progress: the map is empty"
        );
    }
}
