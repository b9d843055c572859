//! The store's single writer: one thread that owns the only write connection and
//! group-commits the writes of every chat.
//!
//! WHY a thread of its own: SQLite admits one writer at a time. Driving writes through an
//! async pool made every statement a round trip to a worker thread, and every chat's flush
//! its own transaction, so a thousand chats queued behind each other's `BEGIN`/`COMMIT`
//! (the server sat at one core, latency-bound). Here callers hand a closure to the thread;
//! the thread takes every job that is waiting, runs them all in ONE transaction, commits once,
//! and only then answers each caller. A job is therefore acknowledged only when it is durable,
//! and under load hundreds of jobs share one commit.
//!
//! A failing job rolls back only itself: the group first runs without savepoints (a
//! savepoint copies every page a job touches into a sub-journal, a tenth of the writer's time
//! in profiles), and when a job fails the group is rolled back and run again with a savepoint
//! per job. Jobs are therefore `Fn`: the second run sees the same inputs.
//!
//! Cadence: when the writer is saturated (the last group held at least [`PACE_FROM_JOBS`]
//! jobs), groups start at most every [`COMMIT_INTERVAL`] (a job arriving sooner waits for the
//! rest of the interval with the jobs queued behind it). Each commit rewrites the pages it
//! touches (the tail of every table, an index leaf per chat it writes), so fewer, larger
//! commits cost the writer less. Below that load a job is committed as soon as the writer is
//! free: pacing smaller groups too halved the bytes written at 420 turns/s but put up to
//! 10 ms on every tool claim, and tens of ms on the UI round trip's p99.
//!
//! Unhurried jobs ([`Writer::call_unhurried`]): a chat's write-behind flush and a tool's
//! completion. Nobody waits on their answer for anything a user sees (on one node events
//! reach clients before they are stored, and a completion is fire-and-forget), so a group
//! holding only such jobs starts [`UNHURRIED_WAIT`] after the first of them, unless a hurried
//! job (a chat's creation, say) arrives first and takes them along in its commit. Each commit
//! rewrites the tail pages of the tables it touches, so at light load the bytes written per
//! turn follow the commits; under load groups share commits anyway. While a group waits for
//! company, the writer sleeps outside its channel (parked until the group's start), and only
//! a command that cannot wait wakes it ([`WriterWake`]): the unhurried jobs queue up without
//! a wake-up each (at 420 turns/s about two per turn).
//!
//! Tool claims ([`Writer::claim`]) are answered between transactions, from the claims
//! journal (`claims_journal`): a new claim is durable once appended there, and its row is
//! written by the next group transaction, which it waits for like an unhurried job. WHY: a
//! claim must be durable before its tool runs, and as a commit of its own it made ~1.1
//! commits per turn at light load (420 turns/s: 41.5 KiB written per turn to keep 6.1).
//!
//! Ordering: jobs run in the order they were submitted (one FIFO channel), and submission
//! happens when the store method is called, not when its future is first polled. A claim is
//! answered when the writer takes it, ahead of the jobs already waiting for the next commit;
//! where those could change its answer (a chat not in the database yet, a key "started"
//! whose completion may be waiting) it is answered inside that commit instead. A claim of a
//! chat whose deletion is waiting is granted, and deleted with the chat.
//!
//! Priority: the writer thread runs [`WRITER_NICE`] steps below the threads that started it
//! (see [`lower_writer_priority`]).

use std::cell::Cell;
use std::ffi::c_int;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::mpsc::{self, SyncSender, TryRecvError};
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use rusqlite::Connection;
use rusqlite::hooks::Wal;
use tracing::{debug, error};

use crate::claims_journal::ClaimsJournal;
use crate::db::{Db, Held};
use crate::store::Completion;
use crate::{StoreError, ToolClaim, tools};

/// Most jobs in one transaction: bounds the time a caller waits for a commit.
const MAX_JOBS_PER_COMMIT: usize = 512;
/// Shortest time between the starts of two group commits under load (see the module docs).
const COMMIT_INTERVAL: Duration = Duration::from_millis(10);
/// Jobs in a group from which the next group waits for [`COMMIT_INTERVAL`].
const PACE_FROM_JOBS: usize = 32;
/// Page cache of the write connection, in KiB (SQLite's negative `cache_size` unit); it
/// grows only as pages are used. WHY 16 MiB and not 64: since the log is appended in write
/// order (migration 8), what a commit reads again is the tables' tails, `chat_heads` and the
/// index upper levels; a larger cache mostly kept appended pages nobody reads back. 64 MiB
/// cost 30-40 MB of server memory at 1,000 x 10 (179-189 against 149-153 MiB peak) and
/// 40-75 MB at 10,000 x 10, for no CPU difference within the noise.
const WRITER_CACHE_KIB: i64 = -16_384;
/// WAL size, in pages, that wakes the checkpointer. WHY not SQLite's default 1,000: a pass
/// copies each page once however often the WAL holds it, and per-chat index leaves are
/// rewritten by many commits in a row, so passes over a longer WAL write fewer bytes (1,000
/// chats x 10 turns: 23-25 KiB written per turn instead of 25-30, on a loaded machine).
const CHECKPOINT_AFTER_PAGES: c_int = 3_000;
/// WAL size, in pages, at which the writer waits for a catch-up checkpoint (16 MiB of 4 KiB
/// pages): bounds the WAL file.
const CHECKPOINT_CAP_PAGES: c_int = 4_000;
/// Longest time an unhurried job (or a journaled claim) waits for others to share its commit
/// (see the module docs). At 420 turns/s: 5 ms wrote 25.4 KiB per turn (4.2x what is kept),
/// 20 ms 16.1 KiB (2.9x), 50 ms 13.2 KiB (2.4x). WHY 20: events clients have seen but the
/// store has not are lost to a crash, and this bounds how long they wait.
const UNHURRIED_WAIT: Duration = Duration::from_millis(20);
/// Prepared statements kept per connection (every write statement of the store fits).
const STATEMENT_CACHE: usize = 64;

/// Handle to the writer thread. Cheap to clone; the thread ends when the last handle is
/// dropped (after finishing the jobs already queued) or on [`Writer::close`].
#[derive(Clone)]
pub(crate) struct Writer {
    /// `None` only while the handle is dropped (see its `Drop`).
    jobs: Option<mpsc::Sender<Command>>,
    wake: Arc<WriterWake>,
}

impl Drop for Writer {
    /// The writer may be parked waiting for company: with the last handle gone it must find
    /// its channel closed now, not at the group's start. So this handle's sender goes first,
    /// then the writer is nudged.
    fn drop(&mut self) {
        drop(self.jobs.take());
        self.wake.nudge();
    }
}

/// How a sender wakes the writer while it waits for company: parked outside its channel, so
/// that an unhurried job queued meanwhile costs no wake-up, and anything else unparks it.
///
/// No wake-up is lost: the writer sets `waiting` and then looks at its channel once more
/// before it parks, and a sender queues its command and then reads `waiting`, each with a
/// `SeqCst` fence between; so either the writer finds the command, or the sender finds
/// `waiting` set and unparks it (an unpark before the park makes the park return at once).
#[derive(Debug)]
struct WriterWake {
    /// The writer is parked (or about to park) waiting for company.
    waiting: AtomicBool,
    /// The writer thread (set once it is spawned).
    thread: std::sync::OnceLock<std::thread::Thread>,
    /// Times the writer came back from waiting for company (tests count wake-ups with it).
    #[cfg(test)]
    wakeups: std::sync::atomic::AtomicUsize,
}

impl WriterWake {
    fn new() -> Self {
        Self {
            waiting: AtomicBool::new(false),
            thread: std::sync::OnceLock::new(),
            #[cfg(test)]
            wakeups: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Called after queueing a command that must not wait for the group's start.
    fn nudge(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst)
            && let Some(thread) = self.thread.get()
        {
            thread.unpark();
        }
    }
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Writer")
    }
}

/// How many nice steps below the threads that start it the writer thread runs.
///
/// WHY: the writer's work is throughput work: nobody sees a commit except through a claim,
/// and under load a later commit only means a larger group. On two cores, a reply that woke
/// while the writer held a core waited for the writer's time slice: at 420 turns/s with UI
/// tools, four alternating pairs read a UI round trip p99 of 0.79 / 0.74 / 0.82 / 0.80 ms at
/// the same priority against 0.62 / 0.55 / 0.56 / 0.56 ms ten steps lower, turn p99 unchanged
/// (docs/performance-log.md, "Fifteenth session"). It still gets a share of a busy core (about a
/// tenth beside one thread of normal priority) and all of an idle one, so it never starves.
/// The checkpoint thread keeps its priority: the writer waits for its catch-up passes.
const WRITER_NICE: c_int = 10;

/// Lowers the calling thread's priority by [`WRITER_NICE`] (on Linux, which keeps a nice value
/// per thread; elsewhere it does nothing). A refusal is logged and changes nothing else: the
/// writer is then only as urgent as the other threads.
fn lower_writer_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `nice` only adds to the calling thread's nice value (the kernel clamps it at
        // 19). `errno` is reset first because -1 is also a valid new nice value.
        let refused = unsafe {
            *libc::__errno_location() = 0;
            libc::nice(WRITER_NICE) == -1 && *libc::__errno_location() != 0
        };
        if refused {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "cannot lower the store writer's priority; it runs at the process's"
            );
        }
    }
}

enum Command {
    /// A job, and whether its caller waits on the answer (see [`Writer::call_unhurried`]).
    Job(Box<dyn Job>, Urgency),
    /// A tool claim (see [`Writer::claim`]).
    Claim(ClaimRequest),
    /// Finish what is queued, then stop and acknowledge.
    Close(oneshot::Sender<()>),
}

impl Writer {
    /// Open the write connection on `path` (already created and migrated) and start the
    /// thread.
    pub(crate) fn start(path: &Path, busy_timeout: Duration) -> Result<Self, StoreError> {
        Self::start_with_wait(path, busy_timeout, UNHURRIED_WAIT)
    }

    /// [`Writer::start`] with the longest wait of unhurried jobs (tests set their own).
    fn start_with_wait(
        path: &Path,
        busy_timeout: Duration,
        unhurried_wait: Duration,
    ) -> Result<Self, StoreError> {
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
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // Checkpoints run on a thread of their own (see `checkpoint`); installing the WAL
        // hook also turns off SQLite's automatic checkpoint on this connection.
        let checkpointer = Checkpointer::start(path, busy_timeout)?;
        conn.wal_hook(Some(wal_grew));
        let journal = ClaimsJournal::open(path, &conn)?;
        let (jobs, queue) = mpsc::channel();
        let wake = Arc::new(WriterWake::new());
        let thread_wake = Arc::clone(&wake);
        let spawned = std::thread::Builder::new()
            .name("tessera-store-writer".to_owned())
            .spawn(move || {
                lower_writer_priority();
                Thread {
                    db: Db::new(&conn),
                    journal,
                    checkpointer,
                    unhurried_wait,
                    wake: thread_wake,
                }
                .run(queue)
            })
            .map_err(|source| crate::sqlite_error::setup_io(path, source))?;
        // Set before any command can reach the thread: only this handle sends, and it is not
        // returned yet. (The writer waits for company only after taking a command.)
        let _ = wake.thread.set(spawned.thread().clone());
        Ok(Self {
            jobs: Some(jobs),
            wake,
        })
    }

    /// Queue `work` now; the future resolves with its result once the transaction that ran
    /// it has committed. `work` runs on the writer thread: an `Err` rolls back exactly what
    /// it wrote (and `work` may run twice, see the module docs).
    pub(crate) fn call<T, F>(
        &self,
        work: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
        F: Fn(&Db<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.submit(work, Urgency::Hurried)
    }

    /// [`Writer::call`] for a job whose answer nobody waits on for anything a user sees: it
    /// may wait up to [`UNHURRIED_WAIT`] to share a commit with the next hurried job. The
    /// answer still comes only once the job is durable.
    pub(crate) fn call_unhurried<T, F>(
        &self,
        work: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
        F: Fn(&Db<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.submit(work, Urgency::Unhurried)
    }

    /// Claims tool invocation `key` of chat `chat_id` (see `tools`): answered once the
    /// claim is durable in the claims journal, without waiting for a commit (see
    /// `claims_journal`). A chat the database does not hold yet is claimed inside the next
    /// group transaction instead, behind the jobs queued before it (its creation, say).
    pub(crate) fn claim(
        &self,
        chat_id: String,
        key: String,
    ) -> impl Future<Output = Result<ToolClaim, StoreError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        self.claim_then(chat_id, key, Answer::on_channel(reply));
        answered(answer)
    }

    /// [`Writer::claim`] whose answer goes to `reply`, called on the writer thread
    /// ([`StoreError::Closed`] at once when the writer has stopped).
    pub(crate) fn claim_then(&self, chat_id: String, key: String, reply: Answer<ToolClaim>) {
        self.send(Command::Claim(ClaimRequest {
            chat_id,
            key,
            reply,
        }));
        self.wake.nudge();
    }

    /// [`Writer::call_unhurried`] whose answer goes to `reply` instead of a future: sent on
    /// the writer thread once the job is durable or has failed ([`StoreError::Closed`] at
    /// once, on the caller's thread, when the writer has stopped). A callback behind it must
    /// be quick: the next transaction waits for it.
    pub(crate) fn call_unhurried_then<T, F>(&self, work: F, reply: Answer<T>)
    where
        T: Send + 'static,
        F: Fn(&Db<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.queue(Call::boxed(work, reply), Urgency::Unhurried);
    }

    fn submit<T, F>(
        &self,
        work: F,
        urgency: Urgency,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
        F: Fn(&Db<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.queue(Call::boxed(work, Answer::on_channel(reply)), urgency);
        answered(answer)
    }

    /// Queues `job`. A writer that has stopped drops it, and a dropped job answers
    /// [`StoreError::Closed`].
    fn queue(&self, job: Box<dyn Job>, urgency: Urgency) {
        self.send(Command::Job(job, urgency));
        // An unhurried job joins a waiting group without waking the writer: it commits when
        // the group starts, as it would have.
        if urgency == Urgency::Hurried {
            self.wake.nudge();
        }
    }

    /// Queues `command`; false when the writer has stopped (a dropped reply then reads as
    /// [`StoreError::Closed`]).
    fn send(&self, command: Command) -> bool {
        self.jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(command).is_ok())
    }

    /// Finish every queued job, then stop the thread. Later calls fail with
    /// [`StoreError::Closed`].
    pub(crate) async fn close(&self) {
        let (done, stopped) = oneshot::channel();
        if self.send(Command::Close(done)) {
            self.wake.nudge();
            let _ = stopped.await;
        }
    }
}

/// The writer's answer; a writer that stopped before answering reads as
/// [`StoreError::Closed`].
async fn answered<T>(answer: oneshot::Receiver<Result<T, StoreError>>) -> Result<T, StoreError> {
    answer.await.unwrap_or(Err(StoreError::Closed))
}

/// A claim for the writer thread.
struct ClaimRequest {
    chat_id: String,
    key: String,
    reply: Answer<ToolClaim>,
}

/// Where the writer's answer to one caller goes: a future's channel, or a [`Completion`]
/// called on the writer thread. Answered once; dropped unanswered (a writer that stopped, or
/// a command it never took), it answers [`StoreError::Closed`].
pub(crate) struct Answer<T>(Option<Completion<T>>);

impl<T: Send + 'static> Answer<T> {
    /// An answer for `done`.
    pub(crate) fn to(done: Completion<T>) -> Self {
        Self(Some(done))
    }

    /// An answer on the channel `reply` (its receiver may have stopped waiting; that is
    /// fine).
    fn on_channel(reply: oneshot::Sender<Result<T, StoreError>>) -> Self {
        Self::to(Box::new(move |answer| {
            let _ = reply.send(answer);
        }))
    }

    fn send(mut self, answer: Result<T, StoreError>) {
        if let Some(done) = self.0.take() {
            done(answer);
        }
    }
}

impl<T> Drop for Answer<T> {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done(Err(StoreError::Closed));
        }
    }
}

/// Whether a job's caller waits on its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Urgency {
    Hurried,
    Unhurried,
}

/// A request to the checkpointer.
enum Checkpoint {
    /// The WAL grew: copy what is there, beside the writer.
    Wake,
    /// The writer is paused until the answer: copy everything so the WAL can start over.
    CatchUp(SyncSender<()>),
}

thread_local! {
    /// On the writer thread: the WAL's size in pages after the last commit. A thread-local
    /// because SQLite's WAL hook is a plain function pointer with no room for captured state.
    static WAL_PAGES: Cell<c_int> = const { Cell::new(0) };
}

/// WAL hook of the write connection, called after each commit with the WAL's size in pages.
fn wal_grew(_wal: &Wal, pages: c_int) -> rusqlite::Result<()> {
    WAL_PAGES.set(pages);
    Ok(())
}

/// Keeps the WAL short without ever checkpointing inside a commit.
///
/// WHY not SQLite's automatic checkpoint: it runs inside the COMMIT of whichever write
/// crosses the threshold, so every caller queued behind that commit (tool claims included)
/// waited for tens of milliseconds of page copying. Here a checkpointer thread with its own
/// connection copies the WAL back into the database (PASSIVE) beside the writer. Under
/// steady writes such a pass never sees the WAL's end, and the WAL only starts over after a
/// pass that copied all of it, so once the WAL passes `CHECKPOINT_CAP_PAGES` the writer waits
/// between two transactions for one catch-up pass: short, because the passes beside it have
/// copied nearly everything already.
struct Checkpointer {
    requests: SyncSender<Checkpoint>,
}

impl Checkpointer {
    fn start(path: &Path, busy_timeout: Duration) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(busy_timeout)?;
        let (requests, incoming) = mpsc::sync_channel::<Checkpoint>(1);
        std::thread::Builder::new()
            .name("tessera-store-checkpoint".to_owned())
            .spawn(move || {
                // Ends when the writer thread drops its sender.
                while let Ok(request) = incoming.recv() {
                    checkpoint(&conn);
                    if let Checkpoint::CatchUp(done) = request {
                        let _ = done.send(());
                    }
                }
            })
            .map_err(|source| crate::sqlite_error::setup_io(path, source))?;
        Ok(Self { requests })
    }

    /// Called by the writer between transactions.
    fn after_commit(&self) {
        let pages = WAL_PAGES.get();
        if pages >= CHECKPOINT_CAP_PAGES {
            let (done, wait) = mpsc::sync_channel(1);
            if self.requests.send(Checkpoint::CatchUp(done)).is_ok() && wait.recv().is_ok() {
                WAL_PAGES.set(0);
            }
        } else if pages >= CHECKPOINT_AFTER_PAGES {
            // Full means a pass is already due: nothing to add.
            let _ = self.requests.try_send(Checkpoint::Wake);
        }
    }
}

fn checkpoint(conn: &Connection) {
    let done = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
    });
    match done {
        Ok((wal_pages, copied)) => debug!(wal_pages, copied, "wal checkpoint"),
        Err(e) => error!(error = %e, "wal checkpoint failed"),
    }
}

/// One queued write, type-erased so jobs of every result type share the channel.
trait Job: Send {
    /// Run inside the open group transaction, in a savepoint of its own if `isolated`;
    /// false when the job failed.
    fn run(&mut self, db: &Db<'_>, isolated: bool) -> bool;
    /// Answer the caller once the group transaction has committed (or failed to).
    fn finish(self: Box<Self>, committed: Result<(), &str>);
}

/// `work`, and where its answer goes.
struct Call<T, F> {
    work: F,
    result: Option<Result<T, StoreError>>,
    reply: Answer<T>,
}

impl<T, F> Call<T, F>
where
    T: Send + 'static,
    F: Fn(&Db<'_>) -> Result<T, StoreError> + Send + 'static,
{
    /// `work` as a job whose answer goes to `reply`.
    fn boxed(work: F, reply: Answer<T>) -> Box<dyn Job> {
        Box::new(Self {
            work,
            result: None,
            reply,
        })
    }
}

impl<T, F> Job for Call<T, F>
where
    T: Send + 'static,
    F: Fn(&Db<'_>) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, db: &Db<'_>, isolated: bool) -> bool {
        let result = if isolated {
            in_savepoint(db, &self.work)
        } else {
            (self.work)(db)
        };
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn finish(self: Box<Self>, committed: Result<(), &str>) {
        let Self { result, reply, .. } = *self;
        let answer = match (committed, result) {
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(StoreError::Closed),
            // The job's own error is the more precise one; a clean job lost to a failed
            // commit reports the commit.
            (Err(_), Some(Err(e))) => Err(e),
            (Err(reason), _) => Err(StoreError::Transient(format!("commit failed: {reason}"))),
        };
        reply.send(answer);
    }
}

fn in_savepoint<T>(
    db: &Db<'_>,
    work: impl Fn(&Db<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    db.prepare_cached("SAVEPOINT job")?.execute([])?;
    let result = work(db);
    if result.is_err() {
        db.forget_all_heads();
        db.prepare_cached("ROLLBACK TO job")?.execute([])?;
    }
    db.prepare_cached("RELEASE job")?.execute([])?;
    result
}

/// The writer thread's state: the write connection, the claims journal and the
/// checkpointer.
struct Thread<'c> {
    /// The write connection, which the spawned thread owns.
    db: Db<'c>,
    journal: ClaimsJournal,
    checkpointer: Checkpointer,
    unhurried_wait: Duration,
    wake: Arc<WriterWake>,
}

impl Thread<'_> {
    fn run(mut self, queue: mpsc::Receiver<Command>) {
        let mut group: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_JOBS_PER_COMMIT);
        // Never earlier than COMMIT_INTERVAL after the previous group started.
        let mut next_start = Instant::now();
        // Blocks for the first job only; whatever queues up until the group may start joins
        // its transaction.
        while let Ok(first) = queue.recv() {
            // When the group may start: at `next_start` once it holds a hurried job, at most
            // `unhurried_wait` after its first job while it holds only unhurried ones.
            let mut start = next_start;
            let mut close = self.take(first, &mut group, &mut start, next_start);
            while close.is_none() && group.len() < MAX_JOBS_PER_COMMIT {
                let next = match queue.try_recv() {
                    Ok(command) => command,
                    // Nothing to commit yet (only claims that were answered from the
                    // database): wait for the next command.
                    Err(_) if !self.has_writes(&group) => match queue.recv() {
                        Ok(command) => command,
                        Err(_) => break,
                    },
                    Err(_) => match self.wait_for_company(&queue, start) {
                        Some(command) => command,
                        // The group's start, or every sender gone.
                        None => break,
                    },
                };
                close = self.take(next, &mut group, &mut start, next_start);
            }
            if self.has_writes(&group) {
                next_start = if group.len() >= PACE_FROM_JOBS {
                    Instant::now() + COMMIT_INTERVAL
                } else {
                    Instant::now()
                };
                self.commit_group(&mut group);
                self.checkpointer.after_commit();
            }
            if let Some(done) = close {
                let _ = done.send(());
                break;
            }
        }
        debug!("store writer stopped");
    }

    /// Waits until `start` for the next command, parked outside the channel (see
    /// [`WriterWake`]): `None` at `start`, or when every sender is gone.
    fn wait_for_company(&self, queue: &mpsc::Receiver<Command>, start: Instant) -> Option<Command> {
        self.wake.waiting.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let next = loop {
            match queue.try_recv() {
                Ok(command) => break Some(command),
                Err(TryRecvError::Disconnected) => break None,
                Err(TryRecvError::Empty) => {}
            }
            let now = Instant::now();
            if now >= start {
                break None;
            }
            std::thread::park_timeout(start - now);
            #[cfg(test)]
            self.wake.wakeups.fetch_add(1, Ordering::Relaxed);
        };
        self.wake.waiting.store(false, Ordering::SeqCst);
        next
    }

    /// Adds a job to `group` (a Close is returned instead) and moves the group's `start`: a
    /// hurried job brings it back to `next_start`, an unhurried first job puts it
    /// `unhurried_wait` after now. A claim is answered here, between transactions, unless
    /// its chat is not in the database yet (then it becomes a hurried job).
    fn take(
        &mut self,
        command: Command,
        group: &mut Vec<Box<dyn Job>>,
        start: &mut Instant,
        next_start: Instant,
    ) -> Option<oneshot::Sender<()>> {
        let first_write = !self.has_writes(group);
        let (job, urgency) = match command {
            Command::Job(job, urgency) => (Some(job), urgency),
            Command::Claim(request) => {
                match self.journal.claim(&self.db, &request.chat_id, &request.key) {
                    // "Started" may be stale while jobs wait in `group` (the key's
                    // completion, say): then the claim is answered in their transaction.
                    // Not when another writer's journal holds the key: the transaction
                    // would not see that claim, and none of these jobs can complete it.
                    Ok(Some(ToolClaim::AlreadyStarted))
                        if !group.is_empty()
                            && !self
                                .journal
                                .held_by_another_writer(&request.chat_id, &request.key) =>
                    {
                        Self::claim_in_transaction(request)
                    }
                    // A new claim is journaled: its row waits for a commit like an
                    // unhurried job.
                    Ok(Some(ToolClaim::Claimed)) => {
                        request.reply.send(Ok(ToolClaim::Claimed));
                        (None, Urgency::Unhurried)
                    }
                    Ok(Some(answer)) => {
                        request.reply.send(Ok(answer));
                        return None;
                    }
                    Err(e) => {
                        request.reply.send(Err(e));
                        return None;
                    }
                    Ok(None) => Self::claim_in_transaction(request),
                }
            }
            Command::Close(done) => return Some(done),
        };
        match urgency {
            Urgency::Hurried => *start = (*start).min(next_start),
            Urgency::Unhurried if first_write => {
                *start = (*start).max(Instant::now() + self.unhurried_wait);
            }
            Urgency::Unhurried => {}
        }
        group.extend(job);
        None
    }

    /// True when a commit has something to write: jobs, or claims only the journal holds.
    fn has_writes(&self, group: &[Box<dyn Job>]) -> bool {
        !group.is_empty() || self.journal.has_uncommitted()
    }

    /// A claim as a hurried job of the group: [`tools::claim`] inside its transaction,
    /// after the jobs queued before it.
    fn claim_in_transaction(request: ClaimRequest) -> (Option<Box<dyn Job>>, Urgency) {
        let ClaimRequest {
            chat_id,
            key,
            reply,
        } = request;
        let work = move |db: &Db<'_>| tools::claim(db, &chat_id, &key);
        (Some(Call::boxed(work, reply)), Urgency::Hurried)
    }

    fn commit_group(&mut self, group: &mut Vec<Box<dyn Job>>) {
        let outcome = match self.run_group(group, false) {
            // A job failed and the group was rolled back: again, each job in a savepoint.
            Ok(false) => self.run_group(group, true).map(|_| ()),
            other => other.map(|_| ()),
        };
        match &outcome {
            Ok(()) => self.journal.committed(&self.db),
            // The journal keeps its claims; the next group writes them.
            Err(reason) => {
                error!(jobs = group.len(), error = %reason, "store write transaction failed")
            }
        }
        let committed = outcome.as_ref().map(|_| ()).map_err(String::as_str);
        for job in group.drain(..) {
            job.finish(committed);
        }
    }

    /// Runs `group` in one transaction, after the claims journaled since the last commit,
    /// and commits it. Without `isolated` savepoints, the first failing job stops the run and
    /// rolls the whole transaction back: `Ok(false)`, nothing written. With them, a failing
    /// job rolls back only itself and the rest commit.
    fn run_group(&self, group: &mut [Box<dyn Job>], isolated: bool) -> Result<bool, String> {
        let db = &self.db;
        db.begin(Held::BeginImmediate).map_err(|e| e.to_string())?;
        if let Err(e) = self.journal.insert_uncommitted(db) {
            let _ = db.rollback();
            return Err(format!("journaled tool claims: {e}"));
        }
        for job in group.iter_mut() {
            if !job.run(db, isolated) && !isolated {
                db.rollback().map_err(|e| e.to_string())?;
                return Ok(false);
            }
        }
        db.commit().map_err(|e| {
            // A failed COMMIT may leave the transaction open; end it so the next group starts
            // clean.
            let _ = db.rollback();
            e.to_string()
        })?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// A writer whose unhurried jobs wait up to `unhurried_wait`, on a fresh database file
    /// with one table; the file's and its WAL's paths.
    fn scratch_writer(
        dir: &tempfile::TempDir,
        unhurried_wait: Duration,
    ) -> (Writer, std::path::PathBuf, std::path::PathBuf) {
        let path = dir.path().join("w.db");
        let conn = Connection::open(&path).expect("scratch database");
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x INTEGER NOT NULL);")
            .expect("scratch schema");
        drop(conn);
        let writer =
            Writer::start_with_wait(&path, Duration::from_secs(5), unhurried_wait).expect("writer");
        let wal = dir.path().join("w.db-wal");
        (writer, path, wal)
    }

    /// Commits recorded in the WAL (frames whose "database size after commit" is set). No
    /// checkpoint runs in these tests (far below `CHECKPOINT_AFTER_PAGES`), so the WAL holds
    /// every commit since the writer started.
    fn wal_commits(wal: &Path) -> usize {
        let bytes = std::fs::read(wal).unwrap_or_default();
        if bytes.len() < 32 {
            return 0;
        }
        let page_size = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        bytes[32..]
            .chunks(24 + page_size)
            .filter(|frame| frame.len() >= 8 && frame[4..8] != [0, 0, 0, 0])
            .count()
    }

    /// The nice value of the calling thread (field 19 of `/proc/thread-self/stat`).
    #[cfg(target_os = "linux")]
    fn own_nice() -> Option<i32> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split(' ').nth(16)?.parse().ok()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_writer_thread_runs_ten_nice_steps_below_its_starter() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (writer, _, _) = scratch_writer(&dir, Duration::from_millis(1));
        let starter = own_nice().expect("the test thread's nice value");
        let on_writer = futures::executor::block_on(writer.call(|_| Ok(own_nice())))
            .expect("the job runs")
            .expect("the writer thread's nice value");
        assert_eq!(on_writer, (starter + WRITER_NICE).min(19));
        assert_eq!(
            own_nice(),
            Some(starter),
            "the starting thread keeps its priority"
        );
    }

    fn insert(x: i64) -> impl Fn(&Db<'_>) -> Result<(), StoreError> + Send + 'static {
        move |conn| {
            conn.execute("INSERT INTO t (x) VALUES (?1)", [x])?;
            Ok(())
        }
    }

    #[tokio::test]
    async fn an_unhurried_job_rides_on_the_next_hurried_commit() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A wait no test outlives: the unhurried job can only commit with the hurried one.
        let (writer, _path, wal) = scratch_writer(&dir, Duration::from_secs(3600));
        let commits_before = wal_commits(&wal);

        let mut flush = Box::pin(writer.call_unhurried(insert(1)));
        // Not answered on its own (it would be within milliseconds if it were hurried).
        let alone = tokio::time::timeout(Duration::from_millis(200), flush.as_mut()).await;
        assert!(alone.is_err(), "an unhurried job waits for company");
        let claim = writer.call(insert(2));
        assert!(matches!(claim.await, Ok(())));
        // Answered by the same commit as the hurried job (which ran after it, in order).
        assert!(matches!(flush.as_mut().now_or_never(), Some(Ok(()))));
        assert_eq!(
            wal_commits(&wal) - commits_before,
            1,
            "one commit for both jobs"
        );
        writer.close().await;
    }

    /// Returns once the writer has taken a job and waits for company (a condition, not a
    /// delay).
    async fn until_waiting_for_company(writer: &Writer) {
        let since = Instant::now();
        while !writer.wake.waiting.load(Ordering::SeqCst) {
            assert!(since.elapsed() < Duration::from_secs(30), "never waited");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn unhurried_jobs_join_a_waiting_group_without_waking_the_writer() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (writer, _path, wal) = scratch_writer(&dir, Duration::from_secs(3600));
        let commits_before = wal_commits(&wal);
        let first = writer.call_unhurried(insert(0));
        until_waiting_for_company(&writer).await;
        let wakeups_before = writer.wake.wakeups.load(Ordering::Relaxed);
        let mut later = Vec::new();
        for x in 1..=20 {
            later.push(writer.call_unhurried(insert(x)));
            // Spaced out, so that a writer woken by each job would have parked again before
            // the next (wake-ups that close together would merge into one).
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // A hurried job wakes it; the group commits, in order, with everything queued.
        assert!(matches!(writer.call(insert(21)).await, Ok(())));
        let wakeups = writer.wake.wakeups.load(Ordering::Relaxed) - wakeups_before;
        // One for the hurried job (a park may also return spuriously now and then); one per
        // unhurried job would be about 20 more.
        assert!(
            wakeups < 8,
            "{wakeups} wake-ups for 20 unhurried jobs and one hurried"
        );
        assert!(matches!(first.await, Ok(())));
        for job in later {
            assert!(matches!(job.now_or_never(), Some(Ok(()))));
        }
        assert_eq!(wal_commits(&wal) - commits_before, 1, "one commit for all");
        writer.close().await;
    }

    /// A writer on a fresh Tessera database in `dir` holding chat "c1", whose unhurried jobs
    /// wait longer than any test (they commit only with a hurried one); the database's path.
    async fn writer_on_a_chat(dir: &tempfile::TempDir) -> (Writer, std::path::PathBuf) {
        let path = dir.path().join("claims.db");
        let created = path.clone();
        tokio::task::spawn_blocking(move || crate::claims_journal::database_with_a_chat(&created))
            .await
            .expect("a database with chat c1");
        let writer =
            Writer::start_with_wait(&path, Duration::from_secs(5), Duration::from_secs(3600))
                .expect("writer");
        (writer, path)
    }

    /// The rows of claim `key` in the database at `path`.
    fn claim_rows(path: &Path, key: &str) -> i64 {
        crate::claims_journal::claim_rows(&Connection::open(path).expect("reader"), key)
    }

    #[tokio::test]
    async fn a_key_another_writer_journaled_stays_claimed_while_jobs_wait() {
        let dir = tempfile::tempdir().expect("temp dir");
        // The unhurried job below commits with the hurried one at the end, so its group is
        // still waiting when the key is claimed.
        let (writer, path) = writer_on_a_chat(&dir).await;
        // Another process claims the key: it is in the journal, not yet in the database.
        let other_conn = Connection::open(&path).expect("other connection");
        let mut other = ClaimsJournal::open(&path, &other_conn).expect("other journal");
        assert_eq!(
            other
                .claim(&Db::new(&other_conn), "c1", "k")
                .expect("other claim"),
            Some(ToolClaim::Claimed)
        );
        // This writer has a job waiting for company when the same key is claimed here.
        let flush = writer.call_unhurried(|_| Ok(()));
        until_waiting_for_company(&writer).await;
        let answer = writer.claim("c1".into(), "k".into()).await;
        assert!(
            matches!(answer, Ok(ToolClaim::AlreadyStarted)),
            "the other process's claim holds: {answer:?}"
        );
        assert!(matches!(writer.call(|_| Ok(())).await, Ok(())));
        assert!(matches!(flush.await, Ok(())));
        writer.close().await;
    }

    #[tokio::test]
    async fn a_claim_another_writers_reset_stored_meanwhile_is_written_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A claim's row is written only with a hurried job.
        let (writer, path) = writer_on_a_chat(&dir).await;
        assert!(matches!(
            writer.claim("c1".into(), "mine".into()).await,
            Ok(ToolClaim::Claimed)
        ));
        assert!(matches!(writer.call(|_| Ok(())).await, Ok(())));
        assert_eq!(claim_rows(&path, "mine"), 1, "written at the next commit");
        assert!(matches!(
            writer.claim("c1".into(), "k".into()).await,
            Ok(ToolClaim::Claimed)
        ));
        // Another process opens the database: it puts every journaled claim in it, this
        // writer's too, and resets the file.
        let other_conn = Connection::open(&path).expect("other connection");
        ClaimsJournal::open(&path, &other_conn).expect("other journal");
        assert_eq!(claim_rows(&path, "k"), 1, "stored by the other writer");
        assert!(matches!(writer.call(|_| Ok(())).await, Ok(())));
        assert_eq!(claim_rows(&path, "k"), 1, "not written a second time");
        writer.close().await;
    }

    #[tokio::test]
    async fn dropping_the_last_handle_commits_a_waiting_group_at_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A wait no test outlives: only the dropped handle can end it.
        let (writer, path, _wal) = scratch_writer(&dir, Duration::from_secs(3600));
        let flush = writer.call_unhurried(insert(5));
        until_waiting_for_company(&writer).await;
        drop(writer);
        let answer = tokio::time::timeout(Duration::from_secs(30), flush).await;
        assert!(matches!(answer, Ok(Ok(()))), "{answer:?}");
        let conn = Connection::open(&path).expect("reopen");
        let kept: i64 = conn
            .query_row("SELECT x FROM t", [], |row| row.get(0))
            .expect("the row is stored");
        assert_eq!(kept, 5);
    }

    #[tokio::test]
    async fn an_unhurried_job_alone_commits_after_its_wait() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (writer, _path, wal) = scratch_writer(&dir, Duration::from_millis(1));
        assert!(matches!(writer.call_unhurried(insert(1)).await, Ok(())));
        assert_eq!(wal_commits(&wal), 1);
        writer.close().await;
    }

    #[tokio::test]
    async fn closing_commits_the_unhurried_jobs_that_wait() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (writer, path, _wal) = scratch_writer(&dir, Duration::from_secs(3600));
        let flush = writer.call_unhurried(insert(7));
        writer.close().await;
        assert!(matches!(flush.await, Ok(())));
        let conn = Connection::open(&path).expect("reopen");
        let kept: i64 = conn
            .query_row("SELECT x FROM t", [], |row| row.get(0))
            .expect("the row is stored");
        assert_eq!(kept, 7);
    }
}
