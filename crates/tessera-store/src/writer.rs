//! The store's single writer: one thread that owns the only write connection and
//! group-commits the writes of every chat.
//!
//! WHY a thread of its own: SQLite admits one writer at a time. Driving writes through an
//! async pool made every statement a round trip to a worker thread, and every chat's flush
//! its own transaction, so a thousand chats queued behind each other's `BEGIN`/`COMMIT`
//! (the server sat at one core, latency-bound). Here callers hand a closure to the thread;
//! the thread takes every job that is waiting, runs them all in ONE transaction (each job in
//! its own savepoint, so one failing job rolls back only itself), commits once, and only then
//! answers each caller. A job is therefore acknowledged only when it is durable, and under
//! load hundreds of jobs share one commit.
//!
//! Ordering: jobs run in the order they were submitted (one FIFO channel), and submission
//! happens when the store method is called, not when its future is first polled.

use std::fmt;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use futures::channel::oneshot;
use rusqlite::Connection;
use tracing::{debug, error};

use crate::StoreError;

/// Most jobs in one transaction: bounds the time a caller waits for a commit.
const MAX_JOBS_PER_COMMIT: usize = 512;
/// Page cache of the write connection, in KiB (SQLite's negative `cache_size` unit); it
/// grows only as pages are used.
const WRITER_CACHE_KIB: i64 = -65_536;
/// WAL size, in pages, that triggers a checkpoint (SQLite's default is 1,000).
const WAL_AUTOCHECKPOINT_PAGES: i64 = 8_000;
/// Prepared statements kept per connection (every write statement of the store fits).
const STATEMENT_CACHE: usize = 64;

/// Handle to the writer thread. Cheap to clone; the thread ends when the last handle is
/// dropped (after finishing the jobs already queued) or on [`Writer::close`].
#[derive(Clone)]
pub(crate) struct Writer {
    jobs: mpsc::Sender<Command>,
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Writer")
    }
}

enum Command {
    Job(Box<dyn Job>),
    /// Finish what is queued, then stop and acknowledge.
    Close(oneshot::Sender<()>),
}

impl Writer {
    /// Open the write connection on `path` (already created and migrated) and start the
    /// thread.
    pub(crate) fn start(path: &Path, busy_timeout: Duration) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(busy_timeout)?;
        // Same settings as the read pool: WAL, NORMAL sync (durable across process crashes),
        // foreign keys enforced.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // Each job runs in a savepoint, and SQLite journals a savepoint's pages in a temp
        // file unless temp storage is in memory; a group transaction touches more pages than
        // the default 2 MiB cache holds, and a full cache spills pages to the WAL mid-
        // transaction. Both showed up as a third of the writer's time in profiles.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        conn.pragma_update(None, "cache_size", WRITER_CACHE_KIB)?;
        // Checkpoint less often: hot pages (the tails of the event and message indexes) are
        // then copied back to the database file once per many commits, not once per few.
        conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let (jobs, queue) = mpsc::channel();
        std::thread::Builder::new()
            .name("tessera-store-writer".to_owned())
            .spawn(move || run(conn, queue))
            .map_err(|source| StoreError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Self { jobs })
    }

    /// Queue `work` now; the future resolves with its result once the transaction that ran
    /// it has committed. `work` runs on the writer thread inside a savepoint: an `Err`
    /// rolls back exactly what it wrote.
    pub(crate) fn call<T, F>(
        &self,
        work: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Call {
            work: Some(work),
            result: None,
            reply,
        });
        // A send error means the writer has stopped; the dropped reply then reads as Closed.
        let _ = self.jobs.send(Command::Job(job));
        async move { answer.await.unwrap_or(Err(StoreError::Closed)) }
    }

    /// Finish every queued job, then stop the thread. Later calls fail with
    /// [`StoreError::Closed`].
    pub(crate) async fn close(&self) {
        let (done, stopped) = oneshot::channel();
        if self.jobs.send(Command::Close(done)).is_ok() {
            let _ = stopped.await;
        }
    }
}

/// One queued write, type-erased so jobs of every result type share the channel.
trait Job: Send {
    /// Run inside the open group transaction.
    fn run(&mut self, conn: &Connection);
    /// Answer the caller once the group transaction has committed (or failed to).
    fn finish(self: Box<Self>, committed: Result<(), &str>);
}

struct Call<T, F> {
    work: Option<F>,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job for Call<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, conn: &Connection) {
        let Some(work) = self.work.take() else {
            return;
        };
        self.result = Some(in_savepoint(conn, work));
    }

    fn finish(self: Box<Self>, committed: Result<(), &str>) {
        let answer = match (committed, self.result) {
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(StoreError::Closed),
            // The job's own error is the more precise one; a clean job lost to a failed
            // commit reports the commit.
            (Err(_), Some(Err(e))) => Err(e),
            (Err(reason), _) => Err(StoreError::Commit(reason.to_owned())),
        };
        // The caller may have stopped waiting; that is fine.
        let _ = self.reply.send(answer);
    }
}

fn in_savepoint<T>(
    conn: &Connection,
    work: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    conn.prepare_cached("SAVEPOINT job")?.execute([])?;
    let result = work(conn);
    if result.is_err() {
        conn.prepare_cached("ROLLBACK TO job")?.execute([])?;
    }
    conn.prepare_cached("RELEASE job")?.execute([])?;
    result
}

fn run(conn: Connection, queue: mpsc::Receiver<Command>) {
    let mut group: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_JOBS_PER_COMMIT);
    // Blocks for the first job only; whatever queued up meanwhile joins its transaction.
    while let Ok(first) = queue.recv() {
        let mut close = None;
        match first {
            Command::Job(job) => group.push(job),
            Command::Close(done) => close = Some(done),
        }
        while close.is_none() && group.len() < MAX_JOBS_PER_COMMIT {
            match queue.try_recv() {
                Ok(Command::Job(job)) => group.push(job),
                Ok(Command::Close(done)) => close = Some(done),
                Err(_) => break,
            }
        }
        if !group.is_empty() {
            commit_group(&conn, &mut group);
        }
        if let Some(done) = close {
            let _ = done.send(());
            break;
        }
    }
    debug!("store writer stopped");
}

fn commit_group(conn: &Connection, group: &mut Vec<Box<dyn Job>>) {
    let outcome = match conn.execute_batch("BEGIN IMMEDIATE") {
        Ok(()) => {
            for job in group.iter_mut() {
                job.run(conn);
            }
            conn.execute_batch("COMMIT").map_err(|e| {
                // A failed COMMIT may leave the transaction open; end it so the next group
                // starts clean.
                let _ = conn.execute_batch("ROLLBACK");
                e.to_string()
            })
        }
        Err(e) => Err(e.to_string()),
    };
    if let Err(reason) = &outcome {
        error!(jobs = group.len(), error = %reason, "store write transaction failed");
    }
    let committed = outcome.as_ref().map(|_| ()).map_err(String::as_str);
    for job in group.drain(..) {
        job.finish(committed);
    }
}
