//! One server per data dir: `tessera serve` holds an exclusive lock on `<data_dir>/tessera.lock`
//! for its whole life, so a second server pointed at the same dir refuses to start instead of
//! writing the same SQLite database (two writers would interleave chats' seqs and claims).
//!
//! The lock is an OS file lock (`flock`), released by the kernel when the process ends, even
//! by a crash or SIGKILL: a stale lock file never blocks a restart.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

use anyhow::Context as _;

/// The name of the lock file in the data dir.
pub const LOCK_FILE: &str = "tessera.lock";

/// Held for the process lifetime; dropping it releases the data dir.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

/// Locks `dir` for this process, or says which process holds it.
pub fn lock_data_dir(dir: &Path) -> anyhow::Result<DataDirLock> {
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let holder = if holder.is_empty() { "unknown" } else { holder };
            anyhow::bail!(
                "the data dir {} is in use by another tessera process (pid {holder}, which holds {}); \
                 two servers must not share one data dir: stop that one or give this one another data_dir",
                dir.display(),
                path.display()
            );
        }
        Err(TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("cannot lock {}", path.display()));
        }
    }
    // Who holds it, for the message above (best effort: the lock is what counts).
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = write!(file, "{}", std::process::id());
    Ok(DataDirLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_dir_is_refused_until_the_first_is_dropped() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("tessera-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let first = lock_data_dir(&dir)?;
        let refused = lock_data_dir(&dir).map(|_| ()).map_err(|e| e.to_string());
        let message = refused.err().unwrap_or_default();
        assert!(message.contains("another tessera process"), "{message}");
        assert!(
            message.contains(&std::process::id().to_string()),
            "{message}"
        );
        drop(first);
        let again = lock_data_dir(&dir);
        assert!(again.is_ok(), "free again once the holder is gone");
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
