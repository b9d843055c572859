//! Latency histograms, process memory and CPU readings, and the end-of-run summary.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// A latency histogram in microseconds (1 µs .. 10 min, 3 significant digits).
pub struct Latency(Histogram<u64>);

impl Latency {
    /// Longest sample kept, in microseconds (10 minutes); longer ones are recorded as this.
    pub const MAX_US: u64 = 600_000_000;

    /// An empty histogram.
    pub fn new() -> Self {
        // The bounds are constants that hdrhistogram accepts; fall back to auto-resizing.
        let hist = Histogram::new_with_bounds(1, Self::MAX_US, 3)
            .or_else(|_| Histogram::new(3))
            .unwrap_or_else(|_| unreachable_histogram());
        Self(hist)
    }

    /// Records one sample (a run records its chats' [`Samples`] through `merge_samples`).
    #[cfg(test)]
    pub fn record(&mut self, d: std::time::Duration) {
        let _ = self.0.record(Self::micros(d));
    }

    /// A sample as the histogram keeps it: whole microseconds within `1..=MAX_US`.
    fn micros(d: std::time::Duration) -> u64 {
        u64::try_from(d.as_micros())
            .unwrap_or(Self::MAX_US)
            .clamp(1, Self::MAX_US)
    }

    /// Adds one chat's samples.
    pub fn merge_samples(&mut self, samples: &Samples) {
        for &us in &samples.0 {
            let _ = self.0.record(us);
        }
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The sample at quantile `q` (0..=1), in microseconds; `None` when empty.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        (!self.0.is_empty()).then(|| self.0.value_at_quantile(q))
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

/// One chat's samples, listed until the run merges them into its [`Latency`]. A histogram of
/// its own would be ~180 KiB per chat (its counts array spans 1 µs .. 10 min): three per chat
/// made the load generator zero 5 GiB while it opened 10,000 chats, busy in page faults for
/// seconds while the server waited for its handshakes.
#[derive(Default)]
pub struct Samples(Vec<u64>);

impl Samples {
    /// Records one sample.
    pub fn record(&mut self, d: std::time::Duration) {
        self.0.push(Latency::micros(d));
    }
}

fn unreachable_histogram() -> Histogram<u64> {
    // `Histogram::new(3)` cannot fail for 3 significant digits; keep a last resort anyway.
    match Histogram::new(2) {
        Ok(h) => h,
        Err(e) => panic!("hdrhistogram refused every configuration: {e}"),
    }
}

/// A numeric field of `/proc/<pid>/status`: `VmRSS` and `VmHWM` in KiB, `FDSize` as a count.
pub fn proc_status_number(pid: &str, field: &str) -> Option<u64> {
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

/// CPU time and disk writes so far, summed over processes other than the server (the
/// database's): those named `comm` when the window starts, read again at its end (a process
/// that starts or exits in between is missing from the difference).
pub struct PeerUsage {
    pids: Vec<String>,
    cpu_s: f64,
    write_bytes: u64,
}

impl PeerUsage {
    /// Every process whose `/proc/PID/comm` is `comm`, and their usage now.
    pub fn named(comm: &str) -> Self {
        let pids = std::fs::read_dir("/proc")
            .map(|dir| {
                dir.flatten()
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
                    .filter(|pid| {
                        std::fs::read_to_string(format!("/proc/{pid}/comm"))
                            .is_ok_and(|name| name.trim_end() == comm)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self::of(pids)
    }

    /// The same processes' usage now.
    pub fn again(&self) -> Self {
        Self::of(self.pids.clone())
    }

    fn of(pids: Vec<String>) -> Self {
        let (mut cpu_s, mut write_bytes) = (0.0, 0);
        for pid in &pids {
            if let Some(one) = ServerUsage::read(pid) {
                cpu_s += one.cpu_s;
                write_bytes += one.write_bytes.unwrap_or(0);
            }
        }
        Self {
            pids,
            cpu_s,
            write_bytes,
        }
    }

    /// What was used between `start` and `self`, per turn.
    pub fn since(&self, start: &PeerUsage, turns: u64) -> Value {
        let turns = turns.max(1) as f64;
        let cpu = self.cpu_s - start.cpu_s;
        let written = self.write_bytes.saturating_sub(start.write_bytes) as f64;
        json!({
            "processes": start.pids.len(),
            "cpu_s": (cpu * 1000.0).round() / 1000.0,
            "cpu_ms_per_turn": (cpu * 1000.0 / turns * 10_000.0).round() / 10_000.0,
            "write_KiB_per_turn": (written / 1024.0 / turns * 100.0).round() / 100.0,
        })
    }
}

/// What a server process has used so far, read from `/proc/<pid>`: CPU time (total and by
/// thread name) and bytes it caused to be written to disk.
pub struct ServerUsage {
    cpu_s: f64,
    write_bytes: Option<u64>,
    threads: BTreeMap<String, f64>,
}

impl ServerUsage {
    /// The usage of process `pid` now; `None` when its `/proc` entry cannot be read.
    pub fn read(pid: &str) -> Option<Self> {
        let cpu_s = proc_stat_cpu_seconds(&format!("/proc/{pid}/stat"))?;
        let write_bytes = std::fs::read_to_string(format!("/proc/{pid}/io"))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("write_bytes:"))
                    .and_then(|v| v.trim().parse().ok())
            });
        let mut threads = BTreeMap::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let dir = task.path();
                let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
                if let Some(cpu) = proc_stat_cpu_seconds(&dir.join("stat").to_string_lossy()) {
                    *threads.entry(thread_group(&name)).or_insert(0.0) += cpu;
                }
            }
        }
        Some(Self {
            cpu_s,
            write_bytes,
            threads,
        })
    }

    /// What was used between `start` and `self`, per turn where `turns` > 0: server CPU per
    /// turn, disk bytes written per turn, and each thread group's share of the CPU (threads
    /// that ended between the readings are missing from the split, not from the total).
    pub fn since(&self, start: &ServerUsage, turns: u64) -> Value {
        let turns = turns.max(1) as f64;
        let cpu = self.cpu_s - start.cpu_s;
        let split: serde_json::Map<String, Value> = self
            .threads
            .iter()
            .map(|(name, s)| (name, s - start.threads.get(name).copied().unwrap_or(0.0)))
            .filter(|(_, used)| *used > 0.0)
            .map(|(name, used)| {
                let share = if cpu > 0.0 { used / cpu * 100.0 } else { 0.0 };
                (name.clone(), json!((share * 10.0).round() / 10.0))
            })
            .collect();
        json!({
            "cpu_s": (cpu * 1000.0).round() / 1000.0,
            "cpu_ms_per_turn": (cpu * 1000.0 / turns * 10_000.0).round() / 10_000.0,
            "write_KiB_per_turn": self
                .write_bytes
                .zip(start.write_bytes)
                .map(|(end, begin)| (end.saturating_sub(begin) as f64 / 1024.0 / turns * 100.0).round() / 100.0),
            "cpu_percent_by_thread": split,
        })
    }
}

/// utime + stime of a `/proc/.../stat` file, in seconds.
fn proc_stat_cpu_seconds(path: &str) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces; the numeric fields follow its last ')'.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    Some((utime + stime) as f64 / ticks)
}

/// A thread's name without its instance number ("actix-rt|system:0|arbiter:1" and
/// "...arbiter:2" are one group).
fn thread_group(comm: &str) -> String {
    comm.trim()
        .trim_end_matches(|c: char| {
            c.is_ascii_digit() || c == ':' || c == '-' || c == '#' || c == ' '
        })
        .to_owned()
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn chat_samples_merge_into_the_run_histogram_as_if_recorded_there() {
        let mut direct = Latency::new();
        let mut chats = [Samples::default(), Samples::default()];
        let samples = [3, 70, 1, 900, 12, 45].map(Duration::from_millis);
        // Out of range both ways: clamped alike.
        let out_of_range = [Duration::ZERO, Duration::from_secs(3_600)];
        for (i, d) in samples.into_iter().chain(out_of_range).enumerate() {
            direct.record(d);
            chats[i % 2].record(d);
        }
        let mut merged = Latency::new();
        for chat in &chats {
            merged.merge_samples(chat);
        }
        assert_eq!(merged.count(), 8);
        for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
            assert_eq!(merged.quantile_us(q), direct.quantile_us(q), "quantile {q}");
        }
        assert_eq!(merged.quantile_us(0.0), Some(1));
        let top = merged.quantile_us(1.0).unwrap_or_default();
        assert!(
            top >= Latency::MAX_US * 999 / 1000,
            "longest sample {top} µs"
        );
    }
}
