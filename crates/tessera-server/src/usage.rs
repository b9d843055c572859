//! Token usage per tenant, counted from every `chat.usage` event this node publishes: served
//! to the tenant itself by `GET /api/v1/usage`, and to operators in `/metrics` as
//! `tessera_gen_ai_client_token_usage_total{tenant, token_type}` (the GenAI semantic
//! conventions' `gen_ai.client.token.usage`, as a counter).
//!
//! WHY a mutex-guarded map (as in `limits.rs`): one map update per model call, on the path that
//! publishes the event; an actor round trip would cost more than the update.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// Tenants with their own series in `/metrics`; usage of any further tenant is summed under
/// `tenant="_other"` there (the usage endpoint still counts each tenant apart), so a system
/// with very many tenants cannot blow up the metrics' cardinality.
pub const MAX_TENANT_SERIES: usize = 1000;

/// The series that collects tenants beyond [`MAX_TENANT_SERIES`].
const OTHER_TENANTS: &str = "_other";

/// One tenant's usage since this node started.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TenantUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub model_calls: u64,
}

/// Usage of every tenant seen.
#[derive(Debug, Default)]
pub struct UsageCounters {
    tenants: Mutex<BTreeMap<Arc<str>, TenantUsage>>,
}

impl UsageCounters {
    /// Adds one model call of `tenant`.
    pub fn record(&self, tenant: &Arc<str>, input_tokens: u64, output_tokens: u64) {
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let usage = tenants.entry(tenant.clone()).or_default();
        usage.input_tokens = usage.input_tokens.saturating_add(input_tokens);
        usage.output_tokens = usage.output_tokens.saturating_add(output_tokens);
        usage.model_calls = usage.model_calls.saturating_add(1);
    }

    /// `tenant`'s usage (zero when it used nothing yet).
    pub fn of(&self, tenant: &str) -> TenantUsage {
        let tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        tenants.get(tenant).copied().unwrap_or_default()
    }

    /// Appends the Prometheus series (tenant ids are label values: escaped).
    pub fn render(&self, out: &mut String) {
        let tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let mut series: BTreeMap<&str, TenantUsage> = BTreeMap::new();
        for (i, (tenant, usage)) in tenants.iter().enumerate() {
            let name = if i < MAX_TENANT_SERIES {
                &**tenant
            } else {
                OTHER_TENANTS
            };
            let sum = series.entry(name).or_default();
            sum.input_tokens += usage.input_tokens;
            sum.output_tokens += usage.output_tokens;
        }
        let _ = writeln!(
            out,
            "# HELP tessera_gen_ai_client_token_usage_total Tokens used by model calls, by tenant and token type.\n# TYPE tessera_gen_ai_client_token_usage_total counter"
        );
        for (tenant, usage) in series {
            let tenant = escape_label(tenant);
            for (kind, count) in [
                ("input", usage.input_tokens),
                ("output", usage.output_tokens),
            ] {
                let _ = writeln!(
                    out,
                    "tessera_gen_ai_client_token_usage_total{{tenant=\"{tenant}\",token_type=\"{kind}\"}} {count}"
                );
            }
        }
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_counted_per_tenant_and_rendered_with_a_tenant_label() {
        let counters = UsageCounters::default();
        let (acme, globex): (Arc<str>, Arc<str>) = ("acme".into(), "glo\"bex".into());
        counters.record(&acme, 10, 3);
        counters.record(&acme, 5, 2);
        counters.record(&globex, 7, 1);
        assert_eq!(
            counters.of("acme"),
            TenantUsage {
                input_tokens: 15,
                output_tokens: 5,
                model_calls: 2
            }
        );
        assert_eq!(counters.of("initech"), TenantUsage::default());
        let mut out = String::new();
        counters.render(&mut out);
        assert!(out.contains(
            "tessera_gen_ai_client_token_usage_total{tenant=\"acme\",token_type=\"input\"} 15"
        ));
        assert!(out.contains(
            "tessera_gen_ai_client_token_usage_total{tenant=\"glo\\\"bex\",token_type=\"output\"} 1"
        ));
    }

    #[test]
    fn tenants_beyond_the_series_cap_are_summed_under_other() {
        let counters = UsageCounters::default();
        for i in 0..MAX_TENANT_SERIES + 2 {
            counters.record(&Arc::from(format!("t{i:05}")), 1, 1);
        }
        let mut out = String::new();
        counters.render(&mut out);
        assert!(out.contains("tenant=\"_other\",token_type=\"input\"} 2"));
        assert_eq!(
            out.lines()
                .filter(|l| l.contains("token_type=\"input\""))
                .count(),
            MAX_TENANT_SERIES + 1
        );
        assert_eq!(counters.of("t01001").input_tokens, 1);
    }
}
