//! `soak`: opens and finishes many chats, one after another on a few workers, and samples the
//! server's memory as it goes, to show that finished chats do not stay in memory; with
//! `--idle`, that chats left open and idle do not either.
//!
//! Each chat is a `LoadTest` chat created with `finish_after_turn` (REST `POST /chats`), sent
//! one message (`POST /chats/{id}/input`), and polled (`GET /chats/{id}`) until it has
//! completed. With `--idle` it is created without `finish_after_turn` and polled until its
//! turn is over (`awaiting_user`), then left open: the server evicts it after
//! `limits.idle_chat_evict_s`. REST over pooled connections, not a WebSocket per chat: 100,000 sockets opened
//! and closed in a minute would run out of loopback ports (TIME_WAIT), which is not what this
//! measures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::report::proc_status_number;

/// Options of `soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// Server root, e.g. http://127.0.0.1:8080 (loopback only).
    #[arg(long)]
    pub url: String,
    /// Chats to open and finish in total.
    #[arg(long, default_value_t = 100_000)]
    pub chats: usize,
    /// Chats in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// The server's pid, to read its memory from /proc/<pid>/status.
    #[arg(long)]
    pub server_pid: u32,
    /// Print a memory sample every this many finished chats.
    #[arg(long, default_value_t = 10_000)]
    pub sample_every: usize,
    /// Seconds to wait after the last chat before the final sample (finished chats leave
    /// memory a few seconds after they complete).
    #[arg(long, default_value_t = 10)]
    pub settle_s: u64,
    /// Longest wait for one chat to finish, in seconds.
    #[arg(long, default_value_t = 60)]
    pub chat_timeout_s: u64,
    /// Hard limit of the whole run, in seconds.
    #[arg(long, default_value_t = 3600)]
    pub max_seconds: u64,
    /// Runtime worker threads of the load generator.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Leave each chat open and idle after its one turn instead of finishing it.
    #[arg(long)]
    pub idle: bool,
}

struct Soak {
    base: String,
    http: reqwest::Client,
    next: AtomicUsize,
    finished: AtomicUsize,
    failed: AtomicU64,
    total: usize,
    chat_timeout: Duration,
    deadline: Instant,
    /// Chats stay open (see [`SoakArgs::idle`]).
    idle: bool,
}

/// One memory sample.
struct Sample {
    chats: usize,
    seconds: f64,
    rss_kib: u64,
    in_memory: i64,
}

impl Soak {
    /// Opens chat `i`, sends its one message and waits until it has completed.
    async fn one_chat(&self, i: usize) -> anyhow::Result<()> {
        let user = format!("soak-{}", i % 64);
        let created: Value = self
            .http
            .post(format!("{}/api/v1/chats", self.base))
            .header("x-user-id", &user)
            .json(&json!({"workflow": "LoadTest", "context": {"finish_after_turn": !self.idle}}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let chat = created["chat_id"]
            .as_str()
            .context("no chat_id in the answer")?;
        self.http
            .post(format!("{}/api/v1/chats/{chat}/input", self.base))
            .header("x-user-id", &user)
            .json(&json!({"content": format!("soak chat {i}")}))
            .send()
            .await?
            .error_for_status()?;
        let until = Instant::now() + self.chat_timeout;
        let done = if self.idle {
            "awaiting_user"
        } else {
            "completed"
        };
        loop {
            let state: Value = self
                .http
                .get(format!("{}/api/v1/chats/{chat}", self.base))
                .header("x-user-id", &user)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            if state["status"] == done {
                return Ok(());
            }
            if Instant::now() > until {
                bail!("chat {chat} did not finish in {:?}", self.chat_timeout);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn worker(self: Arc<Self>) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.total || Instant::now() > self.deadline {
                return;
            }
            match self.one_chat(i).await {
                Ok(()) => {
                    self.finished.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    if self.failed.fetch_add(1, Ordering::Relaxed) < 5 {
                        eprintln!("chat {i} failed: {e:#}");
                    }
                }
            }
        }
    }

    /// The server's `tessera_chats_in_memory` gauge (-1 when it cannot be read).
    async fn chats_in_memory(&self) -> i64 {
        let text = match self.http.get(format!("{}/metrics", self.base)).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        text.lines()
            .find_map(|l| l.strip_prefix("tessera_chats_in_memory "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1)
    }
}

/// Runs `soak`; returns whether every chat finished.
pub fn run(args: SoakArgs) -> anyhow::Result<bool> {
    let base = args.url.trim_end_matches('/').to_owned();
    let authority = base
        .strip_prefix("http://")
        .context("--url must start with http://")?;
    let loopback = authority.starts_with("127.") || authority.starts_with("localhost:");
    if !loopback {
        bail!("the load generator only talks to 127.0.0.0/8; {authority} is not loopback");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency.max(1) + 1)
        .timeout(Duration::from_secs(60))
        .build()
        .context("cannot build the HTTP client")?;
    let started = Instant::now();
    let soak = Arc::new(Soak {
        base,
        http,
        next: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        failed: AtomicU64::new(0),
        total: args.chats,
        chat_timeout: Duration::from_secs(args.chat_timeout_s.max(1)),
        deadline: started + Duration::from_secs(args.max_seconds.max(1)),
        idle: args.idle,
    });
    let pid = args.server_pid.to_string();
    let rss = || proc_status_number(&pid, "VmRSS").unwrap_or(0);
    let samples = runtime.block_on(async {
        let mut samples = vec![Sample {
            chats: 0,
            seconds: 0.0,
            rss_kib: rss(),
            in_memory: soak.chats_in_memory().await,
        }];
        let workers: Vec<_> = (0..args.concurrency.max(1))
            .map(|_| tokio::spawn(soak.clone().worker()))
            .collect();
        let every = args.sample_every.max(1);
        let mut next_sample = every;
        while workers.iter().any(|w| !w.is_finished()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let done = soak.finished.load(Ordering::Relaxed);
            if done >= next_sample {
                next_sample = (done / every + 1) * every;
                let sample = Sample {
                    chats: done,
                    seconds: started.elapsed().as_secs_f64(),
                    rss_kib: rss(),
                    in_memory: soak.chats_in_memory().await,
                };
                eprintln!(
                    "{:>8} chats finished  {:>7.1} s  server RSS {:>7.1} MiB  chats in memory {}",
                    sample.chats,
                    sample.seconds,
                    sample.rss_kib as f64 / 1024.0,
                    sample.in_memory
                );
                samples.push(sample);
            }
        }
        tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
        samples.push(Sample {
            chats: soak.finished.load(Ordering::Relaxed),
            seconds: started.elapsed().as_secs_f64(),
            rss_kib: rss(),
            in_memory: soak.chats_in_memory().await,
        });
        samples
    });
    let finished = soak.finished.load(Ordering::Relaxed);
    let failed = soak.failed.load(Ordering::Relaxed);
    let mib = |kib: u64| (kib as f64 / 1024.0 * 10.0).round() / 10.0;
    let summary = json!({
        "mode": if args.idle { "open_idle" } else { "finished" },
        "chats_finished": finished,
        "chats_failed": failed,
        "seconds": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "server_peak_rss_MiB": proc_status_number(&pid, "VmHWM").map(mib),
        "samples": samples.iter().map(|s| json!({
            "chats": s.chats,
            "seconds": (s.seconds * 10.0).round() / 10.0,
            "rss_MiB": mib(s.rss_kib),
            "chats_in_memory": s.in_memory,
        })).collect::<Vec<_>>(),
    });
    println!("{summary}");
    Ok(failed == 0 && finished == args.chats)
}
