//! `tessera-loadgen`: the load generator, the mock OpenAI-compatible LLM server, and the
//! in-process engine benchmark of Tessera. Traffic goes to 127.0.0.0/8 only; every loop is
//! bounded in count and time.

mod engine_bench;
mod mock;
mod report;
mod run;
mod schema;
mod soak;
mod turn_gate;

use clap::{Parser, Subcommand};

// mimalloc instead of glibc malloc: the engine makes many small, short-lived allocations per
// turn, and glibc spent about a third of the engine's CPU on them (free-list consolidation).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Has mimalloc return freed pages to the OS at once rather than 10 ms later: chats keep
/// allocating while short-lived turn data is freed, and the delayed purge kept about 1 MiB of
/// such pages resident for 1,000 chats, for no measurable CPU. `MIMALLOC_PURGE_DELAY`, when set,
/// wins (mimalloc reads it itself), as in the server: a purge delay of 100 ms for the mock at
/// 100 ms model latency measured no different (0.047-0.048 against 0.048-0.051 ms per turn).
fn tune_allocator() {
    /// `mi_option_purge_delay` in mimalloc.h (v2 and v3), which libmimalloc-sys does not name.
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: sets a plain integer option; mimalloc allows this at any time, from any thread.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) };
}

/// Load generator and benchmarks for the Tessera engine.
#[derive(Parser)]
#[command(name = "tessera-loadgen", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a stateless OpenAI-compatible mock at POST /v1/chat/completions.
    MockLlm(mock::MockArgs),
    /// Drive N concurrent chats for K turns each over WebSocket, verifying every event.
    Run(run::RunArgs),
    /// Open N chats and hold them idle, to measure the server's memory per chat.
    Idle(run::IdleArgs),
    /// Benchmark the engine in process (no HTTP): N chats x K turns; prints one JSON line.
    EngineBench(engine_bench::EngineBenchArgs),
    /// Open and finish many chats (LoadTest, one turn each) while sampling the server's memory.
    Soak(soak::SoakArgs),
}

/// Grows this process's file descriptor table to its limit while the process has one thread.
///
/// WHY: the kernel grows the table by doubling as sockets open, and in a process with several
/// threads every growth first waits for an RCU grace period (`expand_files`), which a busy
/// disk can make long; one was seen there during a 10,000-chat ramp. In a process with one
/// thread the table grows without that wait. (That ramp's `408`s had another cause: 5 GiB of
/// per-chat histograms zeroed while connecting; see `report::Samples`.)
fn reserve_fd_table() {
    let Some(top) = highest_fd_allowed().filter(|top| *top > 2) else {
        return;
    };
    // SAFETY: only when the highest allowed number is free (F_GETFD fails on it), duplicates
    // stderr onto it and closes that copy at once: no descriptor in use is touched, and only
    // the table's size remains.
    unsafe {
        if libc::fcntl(top, libc::F_GETFD) == -1 && libc::dup2(2, top) == top {
            libc::close(top);
        }
    }
}

/// The highest descriptor number this process may open (its soft `RLIMIT_NOFILE` − 1, at most
/// 2^20 − 1), if the limit can be read.
fn highest_fd_allowed() -> Option<libc::c_int> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    libc::c_int::try_from(limit.rlim_cur.min(1 << 20))
        .ok()
        .map(|count| count - 1)
}

fn main() -> anyhow::Result<()> {
    tune_allocator();
    reserve_fd_table();
    let cli = Cli::parse();
    match cli.command {
        Command::MockLlm(args) => mock::run(args),
        Command::Run(args) => {
            if !run::run(args)? {
                std::process::exit(2);
            }
            Ok(())
        }
        Command::Idle(args) => {
            if !run::idle(args)? {
                std::process::exit(2);
            }
            Ok(())
        }
        Command::EngineBench(args) => engine_bench::run(args),
        Command::Soak(args) => {
            if !soak::run(args)? {
                std::process::exit(2);
            }
            Ok(())
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The size of this process's file descriptor table.
    fn fd_table_size() -> u64 {
        crate::report::proc_status_number("self", "FDSize").unwrap_or(0)
    }

    #[test]
    fn the_fd_table_is_grown_to_the_limit_up_front() {
        let Some(top) = highest_fd_allowed() else {
            panic!("the descriptor limit must be readable");
        };
        reserve_fd_table();
        assert!(
            fd_table_size() > u64::try_from(top).unwrap_or(u64::MAX),
            "FDSize {} does not reach descriptor {top}",
            fd_table_size()
        );
        // The copy it made is closed again: the highest number is free.
        // SAFETY: fcntl(F_GETFD) only queries the descriptor number.
        assert_eq!(unsafe { libc::fcntl(top, libc::F_GETFD) }, -1);
    }
}
