//! Prometheus metrics as plain atomic counters. No label carries a chat id; the one series
//! with a tenant label is the token usage (see `usage.rs`), so keep `/metrics` behind the
//! network boundary when tenants must not learn of each other.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use std::sync::Arc;

use tessera_protocol::ServerEvent;

use crate::usage::UsageCounters;

/// Process-wide counters, shared by all handlers behind an `Arc`.
#[derive(Debug, Default)]
pub struct Metrics {
    pub chats_open: AtomicI64,
    pub chats_created: AtomicU64,
    /// Chats deleted by their owner or purged by retention.
    pub chats_deleted: AtomicU64,
    pub ws_connections: AtomicI64,
    pub ws_frames_in: AtomicU64,
    pub ws_errors: AtomicU64,
    /// Frames refused because a connection or tenant exceeded its message budget.
    pub ws_rate_limited: AtomicU64,
    /// Connections cut off because they did not read their events.
    pub ws_slow_consumers: AtomicU64,
    /// Heartbeat pings sent to clients quiet for half a beat.
    pub ws_pings: AtomicU64,
    pub turns: AtomicU64,
    pub tool_calls_ok: AtomicU64,
    pub tool_calls_error: AtomicU64,
    pub llm_tokens: AtomicU64,
    pub llm_calls: AtomicU64,
    pub llm_latency_ms_sum: AtomicU64,
    /// Model calls by latency bucket (upper bounds in [`LATENCY_BUCKETS_MS`], then +Inf).
    pub llm_latency_buckets: [AtomicU64; LATENCY_BUCKETS_MS.len() + 1],
    /// Token usage per tenant (the only series with a tenant label; see `usage.rs`).
    pub usage: UsageCounters,
}

/// Upper bounds of the model-latency histogram, in milliseconds.
pub const LATENCY_BUCKETS_MS: [u64; 8] = [10, 50, 100, 250, 500, 1000, 2500, 10000];

impl Metrics {
    /// Counts what a published event of a chat of `tenant` says (turns, tool results,
    /// tokens, ended chats).
    pub fn observe(&self, tenant: &Arc<str>, event: &ServerEvent) {
        match event {
            ServerEvent::RunStart { .. } => {
                self.turns.fetch_add(1, Ordering::Relaxed);
            }
            ServerEvent::ToolResponse(response) => {
                let counter = if response.success {
                    &self.tool_calls_ok
                } else {
                    &self.tool_calls_error
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            ServerEvent::Usage {
                prompt_tokens,
                completion_tokens,
                total_tokens,
                latency_ms,
                ..
            } => {
                self.usage
                    .record(tenant, *prompt_tokens, *completion_tokens);
                self.llm_tokens.fetch_add(*total_tokens, Ordering::Relaxed);
                self.llm_calls.fetch_add(1, Ordering::Relaxed);
                self.llm_latency_ms_sum
                    .fetch_add(*latency_ms, Ordering::Relaxed);
                let bucket = LATENCY_BUCKETS_MS
                    .iter()
                    .position(|b| latency_ms <= b)
                    .unwrap_or(LATENCY_BUCKETS_MS.len());
                self.llm_latency_buckets[bucket].fetch_add(1, Ordering::Relaxed);
            }
            event if ends_chat(event) => {
                self.chats_open.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// The Prometheus text exposition of the counters here (the handler adds gauges read
    /// from elsewhere with [`write_metric`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(1024);
        let mut gauge = |name: &str, help: &str, kind: &str, value: i64| {
            write_metric(&mut out, name, help, kind, value);
        };
        let load = |a: &AtomicU64| i64::try_from(a.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
        gauge(
            "tessera_chats_open",
            "Chats not completed.",
            "gauge",
            self.chats_open.load(Ordering::Relaxed),
        );
        gauge(
            "tessera_chats_created_total",
            "Chats created.",
            "counter",
            load(&self.chats_created),
        );
        gauge(
            "tessera_chats_deleted_total",
            "Chats deleted by their owner or purged by retention.",
            "counter",
            load(&self.chats_deleted),
        );
        gauge(
            "tessera_ws_connections",
            "Open WebSocket connections.",
            "gauge",
            self.ws_connections.load(Ordering::Relaxed),
        );
        gauge(
            "tessera_ws_frames_in_total",
            "Client frames received.",
            "counter",
            load(&self.ws_frames_in),
        );
        gauge(
            "tessera_ws_errors_total",
            "Client frames refused with chat.error.",
            "counter",
            load(&self.ws_errors),
        );
        gauge(
            "tessera_ws_rate_limited_total",
            "Client frames refused by a message budget.",
            "counter",
            load(&self.ws_rate_limited),
        );
        gauge(
            "tessera_ws_slow_consumers_total",
            "Connections closed because the client did not read.",
            "counter",
            load(&self.ws_slow_consumers),
        );
        gauge(
            "tessera_ws_pings_total",
            "Heartbeat pings sent to quiet clients.",
            "counter",
            load(&self.ws_pings),
        );
        gauge(
            "tessera_turns_total",
            "Agent turns started.",
            "counter",
            load(&self.turns),
        );
        gauge(
            "tessera_llm_tokens_total",
            "Tokens reported by model calls.",
            "counter",
            load(&self.llm_tokens),
        );
        let _ = writeln!(
            out,
            "# HELP tessera_tool_calls_total Tool calls by outcome.\n# TYPE tessera_tool_calls_total counter\ntessera_tool_calls_total{{status=\"ok\"}} {}\ntessera_tool_calls_total{{status=\"error\"}} {}",
            self.tool_calls_ok.load(Ordering::Relaxed),
            self.tool_calls_error.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP tessera_llm_latency_ms Model call latency.\n# TYPE tessera_llm_latency_ms histogram"
        );
        let mut cumulative = 0;
        for (i, bound) in LATENCY_BUCKETS_MS.iter().enumerate() {
            cumulative += self.llm_latency_buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "tessera_llm_latency_ms_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += self.llm_latency_buckets[LATENCY_BUCKETS_MS.len()].load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "tessera_llm_latency_ms_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let _ = writeln!(
            out,
            "tessera_llm_latency_ms_sum {}",
            self.llm_latency_ms_sum.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "tessera_llm_latency_ms_count {}",
            self.llm_calls.load(Ordering::Relaxed)
        );
        self.usage.render(&mut out);
        out
    }
}

/// Appends this node's cluster counters (cluster mode).
pub fn render_cluster(out: &mut String, cluster: &tessera_cluster::ClusterMetrics) {
    let load = |a: &AtomicU64| i64::try_from(a.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
    write_metric(
        out,
        "tessera_cluster_owned_chats",
        "Chats whose lease this node holds.",
        "gauge",
        cluster.owned_chats.load(Ordering::Relaxed),
    );
    write_metric(
        out,
        "tessera_cluster_lease_renew_failures_total",
        "Batched lease renewals that failed (store unreachable).",
        "counter",
        load(&cluster.lease_renew_failures),
    );
    write_metric(
        out,
        "tessera_cluster_takeovers_total",
        "Chats this node took over after another node's lease expired or was released.",
        "counter",
        load(&cluster.takeovers),
    );
    write_metric(
        out,
        "tessera_cluster_leases_lost_total",
        "Leases this node lost (renewal refused, or not renewed within the TTL).",
        "counter",
        load(&cluster.leases_lost),
    );
    write_metric(
        out,
        "tessera_cluster_leases_parked_total",
        "Leases parked: chats that left this node's memory idle, claimed by the next node asked.",
        "counter",
        load(&cluster.leases_parked),
    );
    write_metric(
        out,
        "tessera_cluster_chats_handed_over_total",
        "Chats handed over to the node a client's socket reached (also counted as parked).",
        "counter",
        load(&cluster.chats_handed_over),
    );
    write_metric(
        out,
        "tessera_cluster_commands_forwarded_total",
        "Client commands forwarded to the owner of a chat on another node.",
        "counter",
        load(&cluster.commands_forwarded),
    );
    write_metric(
        out,
        "tessera_cluster_live_events_published_total",
        "Live events published for readers on other nodes (only while one follows the chat).",
        "counter",
        load(&cluster.live_events_published),
    );
    let rtt_us = cluster.nats_rtt_us.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "# HELP tessera_cluster_nats_rtt_seconds Last measured NATS round trip.\n# TYPE tessera_cluster_nats_rtt_seconds gauge\ntessera_cluster_nats_rtt_seconds {}",
        rtt_us as f64 / 1e6
    );
}

/// True for the event that completes a chat (it no longer counts as open).
pub fn ends_chat(event: &ServerEvent) -> bool {
    matches!(event, ServerEvent::RunComplete { reason, .. } if reason == "terminate" || reason == "max_turns")
}

/// Appends one metric in the Prometheus text format; `kind` is `gauge` or `counter`.
pub fn write_metric(out: &mut String, name: &str, help: &str, kind: &str, value: i64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::ClusterMetrics;

    #[test]
    fn cluster_counters_are_rendered_with_their_values() {
        let cluster = ClusterMetrics::default();
        cluster.owned_chats.store(7, Ordering::Relaxed);
        cluster.lease_renew_failures.store(2, Ordering::Relaxed);
        cluster.takeovers.store(3, Ordering::Relaxed);
        cluster.leases_lost.store(1, Ordering::Relaxed);
        cluster.leases_parked.store(5, Ordering::Relaxed);
        cluster.chats_handed_over.store(4, Ordering::Relaxed);
        cluster.commands_forwarded.store(11, Ordering::Relaxed);
        cluster.live_events_published.store(13, Ordering::Relaxed);
        cluster.nats_rtt_us.store(1500, Ordering::Relaxed);
        let mut out = String::new();
        render_cluster(&mut out, &cluster);
        for line in [
            "tessera_cluster_owned_chats 7",
            "tessera_cluster_lease_renew_failures_total 2",
            "tessera_cluster_takeovers_total 3",
            "tessera_cluster_leases_lost_total 1",
            "tessera_cluster_leases_parked_total 5",
            "tessera_cluster_chats_handed_over_total 4",
            "tessera_cluster_commands_forwarded_total 11",
            "tessera_cluster_live_events_published_total 13",
            "tessera_cluster_nats_rtt_seconds 0.0015",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in:\n{out}");
        }
    }
}
