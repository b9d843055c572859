//! Per-tenant limits shared by every connection and worker: the tenant-wide message budget
//! and the cap on open chats. Per-connection limits live in `ws.rs`.
//!
//! WHY a mutex-guarded map and not an actor: each check is a few nanoseconds of arithmetic
//! on the request path; a round trip through a mailbox would cost more than the check.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use tessera_engine::ChatHandle;
use tessera_engine::session::{ChatStatus, GetSnapshot};

/// The budget window.
const WINDOW: Duration = Duration::from_secs(60);

/// Fixed one-minute message windows, one per tenant.
#[derive(Debug)]
pub struct TenantRateLimiter {
    per_minute: u32,
    windows: Mutex<HashMap<Arc<str>, (Instant, u32)>>,
}

impl TenantRateLimiter {
    /// A limiter allowing `per_minute` messages per tenant per minute (0 = unlimited).
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one message of `tenant`; false when the tenant is over its budget.
    pub fn allow(&self, tenant: &Arc<str>) -> bool {
        if self.per_minute == 0 {
            return true;
        }
        let now = Instant::now();
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let window = windows.entry(tenant.clone()).or_insert((now, 0));
        if now.duration_since(window.0) >= WINDOW {
            *window = (now, 0);
        }
        window.1 = window.1.saturating_add(1);
        window.1 <= self.per_minute
    }
}

/// The cap on a tenant's open (not completed) chats. Creations of one tenant are serialized
/// so a burst cannot overshoot the cap.
#[derive(Debug, Default)]
pub struct ChatQuota {
    locks: Mutex<HashMap<Arc<str>, Arc<tokio::sync::Mutex<()>>>>,
    /// Chats known to have completed (terminal), so they are never asked again.
    completed: Mutex<HashSet<Arc<str>>>,
}

impl ChatQuota {
    /// The lock to hold while checking and creating a chat of `tenant`.
    pub fn tenant_lock(&self, tenant: &Arc<str>) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(tenant.clone()).or_default().clone()
    }

    /// How many of `chats` are open, counting at most up to `limit` (asks only chats not
    /// yet known to be completed, and only when the plain count reaches the limit).
    pub async fn open_count(&self, chats: Vec<ChatHandle>, limit: usize) -> usize {
        let unknown: Vec<ChatHandle> = {
            let completed = self.completed.lock().unwrap_or_else(|p| p.into_inner());
            chats
                .into_iter()
                .filter(|c| !completed.contains(&c.identity.chat_id))
                .collect()
        };
        if unknown.len() < limit {
            return unknown.len();
        }
        let statuses = join_all(unknown.iter().map(|c| c.addr.send(GetSnapshot))).await;
        let mut open = 0;
        let mut completed = self.completed.lock().unwrap_or_else(|p| p.into_inner());
        for (chat, status) in unknown.iter().zip(statuses) {
            match status {
                Ok(snap) if matches!(snap.status, ChatStatus::Completed(_)) => {
                    completed.insert(chat.identity.chat_id.clone());
                }
                // A stopped actor is not open either.
                Err(_) => {
                    completed.insert(chat.identity.chat_id.clone());
                }
                Ok(_) => open += 1,
            }
        }
        open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_budget_is_per_tenant() {
        let limiter = TenantRateLimiter::new(3);
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        assert!((0..3).all(|_| limiter.allow(&a)));
        assert!(!limiter.allow(&a), "the fourth message of a is refused");
        assert!(limiter.allow(&b), "b has its own budget");
        assert!(TenantRateLimiter::new(0).allow(&a), "0 means unlimited");
    }
}
