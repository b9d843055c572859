//! Latency histograms, process memory and CPU readings, and the end-of-run summary.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// A latency histogram in microseconds (1 µs .. 10 min, 3 significant digits).
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

impl Latency {
    /// An empty histogram.
    pub fn new() -> Self {
        // The bounds are constants that hdrhistogram accepts; fall back to auto-resizing.
        let hist = Histogram::new_with_bounds(1, 600_000_000, 3)
            .or_else(|_| Histogram::new(3))
            .unwrap_or_else(|_| unreachable_histogram());
        Self(hist)
    }

    /// Records one sample.
    pub fn record(&mut self, d: std::time::Duration) {
        let us = (d.as_micros() as u64).clamp(1, 600_000_000);
        let _ = self.0.record(us);
    }

    /// Adds another histogram's samples.
    pub fn merge(&mut self, other: &Latency) {
        let _ = self.0.add(&other.0);
    }

    /// `{count, p50_ms, p90_ms, p99_ms, max_ms}`.
    pub fn summary(&self) -> Value {
        let ms = |us: u64| (us as f64) / 1000.0;
        if self.0.is_empty() {
            return json!({"count": 0});
        }
        json!({
            "count": self.0.len(),
            "p50_ms": ms(self.0.value_at_quantile(0.50)),
            "p90_ms": ms(self.0.value_at_quantile(0.90)),
            "p99_ms": ms(self.0.value_at_quantile(0.99)),
            "max_ms": ms(self.0.max()),
        })
    }
}

fn unreachable_histogram() -> Histogram<u64> {
    // `Histogram::new(3)` cannot fail for 3 significant digits; keep a last resort anyway.
    match Histogram::new(2) {
        Ok(h) => h,
        Err(e) => panic!("hdrhistogram refused every configuration: {e}"),
    }
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in KiB.
pub fn proc_status_kib(pid: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// CPU time (user + system) of this process so far, in seconds.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Errors counted by stable code.
pub type ErrorCounts = BTreeMap<String, u64>;

/// Prints a two-column table of a flat JSON summary to stderr.
pub fn print_table(summary: &Value) {
    let Value::Object(fields) = summary else {
        return;
    };
    eprintln!();
    for (key, value) in fields {
        match value {
            Value::Object(inner) if inner.contains_key("count") => {
                let get = |k: &str| inner.get(k).and_then(Value::as_f64).unwrap_or(0.0);
                eprintln!(
                    "{key:<24} n={:<8} p50={:>9.3} ms  p90={:>9.3} ms  p99={:>9.3} ms  max={:>9.3} ms",
                    inner.get("count").and_then(Value::as_u64).unwrap_or(0),
                    get("p50_ms"),
                    get("p90_ms"),
                    get("p99_ms"),
                    get("max_ms"),
                );
            }
            Value::Object(inner) if inner.is_empty() => eprintln!("{key:<24} none"),
            other => eprintln!("{key:<24} {other}"),
        }
    }
}
