//! Thread names as the kernel reports them (`/proc/PID/task/TID/comm`, `top -H`, `perf
//! --sort comm`, the load generator's CPU split by thread). actix names every arbiter thread
//! `actix-rt|system:N|arbiter:M`, which the kernel cuts to 15 bytes, `actix-rt|system`: the
//! engine's arbiters and the HTTP workers could not be told apart in a CPU split.

/// The name of the engine's arbiter threads.
pub const ENGINE_THREAD: &str = "tessera-engine";

/// The name of the server's HTTP (and WebSocket) worker threads.
pub const HTTP_WORKER_THREAD: &str = "tessera-http";

/// Names the calling thread `name` for the kernel, which keeps its first 15 bytes. Does
/// nothing off Linux or for a name holding a NUL byte.
pub fn name_current_thread(name: &str) {
    #[cfg(target_os = "linux")]
    {
        let Ok(name) = std::ffi::CString::new(name) else {
            return;
        };
        // SAFETY: PR_SET_NAME reads one NUL-terminated string (at most 16 bytes of it) from
        // the pointer, which `name` keeps valid for the whole call; it names the calling
        // thread only.
        unsafe {
            libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = name;
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The kernel's name of the calling thread.
    fn kernel_name() -> String {
        std::fs::read_to_string("/proc/thread-self/comm")
            .unwrap_or_default()
            .trim_end()
            .to_owned()
    }

    #[test]
    fn the_kernel_reports_the_name_cut_to_15_bytes() {
        let names = std::thread::spawn(|| {
            name_current_thread("tessera-http");
            let short = kernel_name();
            name_current_thread("a-name-longer-than-fifteen-bytes");
            let cut = kernel_name();
            name_current_thread("nul\0inside");
            (short, cut, kernel_name())
        })
        .join();
        let Ok((short, cut, unchanged)) = names else {
            panic!("the thread must finish");
        };
        assert_eq!(short, "tessera-http");
        assert_eq!(cut, "a-name-longer-t");
        assert_eq!(unchanged, cut, "a name with a NUL byte changes nothing");
    }
}
