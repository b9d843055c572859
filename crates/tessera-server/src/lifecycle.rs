//! Data lifecycle: deleting a chat on its owner's request and purging completed chats after
//! the retention period. Both stop the chat's session (if one is in memory) before the store
//! forgets the chat, so no late write or event outlives the deletion.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use actix::Addr;
use tessera_engine::ChatHandle;
use tessera_engine::persist::now_ms;
use tessera_engine::session::{ChatStatus, GetSnapshot, StopChat};
use tessera_store::{ChatStore, STATUS_COMPLETED, StoreError};

use crate::auth::Caller;
use crate::metrics::Metrics;
use crate::registry::{ChatRegistry, FindChat, ForgetChat};

/// Chats purged per store query; the sweep repeats until a query returns fewer.
const PURGE_BATCH: u32 = 200;

/// Deletes the caller's chat `chat_id` with everything kept for it. `Ok(false)` when the
/// caller owns no such chat (a chat of anyone else reads exactly like a missing one).
pub async fn delete_owned_chat(
    chats: &Arc<dyn ChatStore>,
    registry: &Addr<ChatRegistry>,
    metrics: &Metrics,
    caller: &Caller,
    chat_id: &str,
) -> Result<bool, StoreError> {
    let stored = chats.load_chat(chat_id).await?;
    let stored_owned = stored
        .as_ref()
        .filter(|c| *c.record.tenant == *caller.tenant && *c.record.user_id == *caller.user);
    let live = registry
        .send(FindChat {
            chat_id: chat_id.to_owned(),
            tenant: caller.tenant.clone(),
            user: caller.user.clone(),
        })
        .await
        .ok()
        .flatten();
    if stored_owned.is_none() && live.is_none() {
        return Ok(false);
    }
    let was_open = match &live {
        Some(handle) => stop_session(handle).await,
        None => stored_owned.is_some_and(|c| c.state.status != STATUS_COMPLETED),
    };
    let _ = registry.send(ForgetChat(chat_id.to_owned())).await;
    chats.delete_chat(chat_id).await?;
    if was_open {
        metrics.chats_open.fetch_sub(1, Ordering::Relaxed);
    }
    metrics.chats_deleted.fetch_add(1, Ordering::Relaxed);
    tracing::info!(chat_id, tenant = %caller.tenant, "chat deleted by its owner");
    Ok(true)
}

/// Stops a live session; `true` when it was still open (not completed).
async fn stop_session(handle: &ChatHandle) -> bool {
    let open = match handle.addr.send(GetSnapshot).await {
        Ok(snap) => !matches!(snap.status, ChatStatus::Completed(_)),
        // Already stopped: nothing is open any more.
        Err(_) => false,
    };
    let _ = handle.addr.send(StopChat).await;
    open
}

/// Deletes every completed chat last updated more than `max_age` ago; returns how many.
pub async fn purge_expired(
    chats: &Arc<dyn ChatStore>,
    registry: &Addr<ChatRegistry>,
    metrics: &Metrics,
    max_age: Duration,
) -> Result<usize, StoreError> {
    let age_ms = i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX);
    let cutoff = now_ms().saturating_sub(age_ms);
    let mut purged = 0;
    loop {
        let due = chats.completed_chats_before(cutoff, PURGE_BATCH).await?;
        for chat_id in &due {
            // A completed chat may be in memory (restored for a reader); stop it first.
            if let Ok(Some(handle)) = registry.send(ForgetChat(chat_id.clone())).await {
                let _ = handle.addr.send(StopChat).await;
            }
            if chats.delete_chat(chat_id).await? {
                purged += 1;
                metrics.chats_deleted.fetch_add(1, Ordering::Relaxed);
            }
        }
        if due.len() < PURGE_BATCH as usize {
            return Ok(purged);
        }
    }
}

/// Runs [`purge_expired`] every `interval`, forever (spawned by `run` when retention is on).
pub async fn retention_loop(
    chats: Arc<dyn ChatStore>,
    registry: Addr<ChatRegistry>,
    metrics: Arc<Metrics>,
    max_age: Duration,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match purge_expired(&chats, &registry, &metrics, max_age).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "retention: purged completed chats"),
            Err(error) => tracing::warn!(%error, "retention: purge failed; retrying next sweep"),
        }
    }
}
