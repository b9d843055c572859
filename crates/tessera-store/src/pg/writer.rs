//! Group commit on PostgreSQL: ONE writer task with its own connection, taking every job
//! waiting in its queue and committing them in ONE transaction.
//!
//! WHY: a commit waits for the WAL flush, and each statement is a network round trip; one
//! transaction per chat flush would spend the server's time on both. As the SQLite writer
//! does, the writer answers its callers only after COMMIT (a write is acknowledged when it is
//! durable), and a failing job rolls back only itself:
//!
//! - fast path: the group runs in one transaction with no savepoints; a group of chat
//!   batches, tool claims and completions (nearly every group) as one call that runs one
//!   statement per table over all of its jobs' rows (`merged.rs`), any other group one
//!   statement per job;
//! - when a job fails for a reason of its own (a conflict, an unknown chat, a stale epoch),
//!   the fast path's transaction is rolled back and the group re-runs with a savepoint per
//!   job, so that job alone fails and the others commit. Jobs only read their inputs, so
//!   re-running one is safe;
//! - a transient failure (connection lost, server restarting, timeout) fails the whole group
//!   with [`StoreError::Transient`], and the writer drops its connection and takes a fresh one
//!   from the pool for the next group: the store reconnects by itself after PostgreSQL
//!   restarts.
//!
//! Unhurried jobs ([`Write::is_unhurried`]: a tool's completion, a single node's flush): a
//! group holding only such jobs waits up to [`UNHURRIED_WAIT`] for a hurried one and commits
//! with it, as the SQLite writer does (`crate::writer`). In a cluster a flush is hurried (its
//! events are shown only once durable), so there the completion rides on the flush of its
//! tool's result instead of paying a WAL flush of its own.
//!
//! WHY one writer, not several in parallel: while it waits for a COMMIT, the jobs that arrive
//! queue up and form the next, larger group, so PostgreSQL pays its per-commit and
//! per-statement costs (WAL flush, executor start-up, round trips) once for more turns.
//! Measured (README "Scaling out"): four writers sharded by chat cost PostgreSQL 0.20-0.22 ms
//! of CPU per turn, one writer 0.09-0.12 ms, at the same or higher throughput. Ordering: the
//! jobs run in the order the store methods were called.

use futures::channel::oneshot;
use sqlx::pool::PoolConnection;
use sqlx::{Acquire, PgConnection, PgPool, Postgres};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::merged;
use super::writes::{Done, Write};
use crate::StoreError;

/// Most jobs in one transaction: bounds the time a caller waits for a commit.
const MAX_JOBS_PER_COMMIT: usize = 256;
/// Longest time a group of only unhurried jobs (see [`Write::is_unhurried`]) waits for a
/// hurried one to share its commit: a commit waits for PostgreSQL's WAL flush, so at light
/// load a tool's completion riding on the flush that follows it saves one.
const UNHURRIED_WAIT: Duration = Duration::from_millis(5);

enum Command {
    Job(Job),
    /// Finish what is queued, then stop and acknowledge.
    Close(oneshot::Sender<()>),
}

struct Job {
    write: Write,
    reply: oneshot::Sender<Result<Done, StoreError>>,
}

/// Handle to the writer task. Cheap to clone; the task ends when every handle is dropped
/// (after finishing its queue) or on [`Writer::close`].
#[derive(Clone, Debug)]
pub(crate) struct Writer {
    queue: mpsc::UnboundedSender<Command>,
}

impl Writer {
    /// Starts the writer on the current runtime, writing through `pool`.
    pub(crate) fn start(pool: &PgPool) -> Self {
        Self::start_with_wait(pool, UNHURRIED_WAIT)
    }

    /// [`Writer::start`] with the longest wait of unhurried jobs (tests set their own).
    fn start_with_wait(pool: &PgPool, unhurried_wait: Duration) -> Self {
        let (queue, jobs) = mpsc::unbounded_channel();
        tokio::spawn(run(pool.clone(), jobs, unhurried_wait));
        Self { queue }
    }

    /// Queues `write` now; resolves once the transaction that ran it has committed.
    pub(crate) fn submit(
        &self,
        write: Write,
    ) -> impl Future<Output = Result<Done, StoreError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        // A send error means the writer has stopped; the dropped reply then reads as Closed.
        let _ = self.queue.send(Command::Job(Job { write, reply }));
        async move { answer.await.unwrap_or(Err(StoreError::Closed)) }
    }

    /// Finishes every queued job, then stops the writer. Later writes fail with
    /// [`StoreError::Closed`].
    pub(crate) async fn close(&self) {
        let (done, stopped) = oneshot::channel();
        if self.queue.send(Command::Close(done)).is_ok() {
            let _ = stopped.await;
        }
    }
}

async fn run(pool: PgPool, mut queue: mpsc::UnboundedReceiver<Command>, unhurried_wait: Duration) {
    let mut conn: Option<PoolConnection<Postgres>> = None;
    let mut group: Vec<Job> = Vec::with_capacity(MAX_JOBS_PER_COMMIT);
    // Waits for the first job only; whatever queued up meanwhile joins its transaction.
    while let Some(first) = queue.recv().await {
        // Set while the group holds only unhurried jobs: when it starts anyway.
        let mut unhurried_until = None;
        let mut close = take(first, &mut group, &mut unhurried_until, unhurried_wait);
        while close.is_none() && group.len() < MAX_JOBS_PER_COMMIT {
            let next = match queue.try_recv() {
                Ok(command) => command,
                Err(_) => match unhurried_until {
                    None => break,
                    Some(until) => match tokio::time::timeout_at(until, queue.recv()).await {
                        Ok(Some(command)) => command,
                        // The queue closed, or the wait is over.
                        Ok(None) | Err(_) => break,
                    },
                },
            };
            close = take(next, &mut group, &mut unhurried_until, unhurried_wait);
        }
        if !group.is_empty() {
            // Chat by chat in id order (stable: one chat's writes keep their order), so the
            // lease rows a fenced group locks FOR SHARE are taken in the same order as a lease
            // renewal's row locks: no deadlock between the two.
            group.sort_by(|a, b| a.write.chat_id().cmp(b.write.chat_id()));
            let results = match &mut conn {
                Some(c) => commit_group(c, &group).await,
                None => match writer_connection(&pool).await {
                    Ok(fresh) => commit_group(conn.insert(fresh), &group).await,
                    Err(e) => Err(e),
                },
            };
            let results = match results {
                Ok(results) => results,
                Err(error) => {
                    // The connection may be broken or mid-transaction: never reuse it.
                    if let Some(mut broken) = conn.take() {
                        broken.close_on_drop();
                    }
                    warn!(jobs = group.len(), %error, "store write transaction failed");
                    group.iter().map(|_| Err(clone_error(&error))).collect()
                }
            };
            for (job, result) in group.drain(..).zip(results) {
                // The caller may have stopped waiting; that is fine.
                let _ = job.reply.send(result);
            }
        }
        if let Some(done) = close {
            let _ = done.send(());
            break;
        }
    }
    debug!("store writer stopped");
}

/// Adds a job to `group` (a Close is returned instead). `unhurried_until` is set by an
/// unhurried first job, `unhurried_wait` after now, and cleared by any hurried one (see
/// [`UNHURRIED_WAIT`]).
fn take(
    command: Command,
    group: &mut Vec<Job>,
    unhurried_until: &mut Option<Instant>,
    unhurried_wait: Duration,
) -> Option<oneshot::Sender<()>> {
    match command {
        Command::Job(job) => {
            if !job.write.is_unhurried() {
                *unhurried_until = None;
            } else if group.is_empty() {
                *unhurried_until = Some(Instant::now() + unhurried_wait);
            }
            group.push(job);
            None
        }
        Command::Close(done) => Some(done),
    }
}

/// The writer's connection, whose statements look rows up by key and never scan a table.
///
/// WHY: the merged statements join `UNNEST`ed arrays with the tables by primary key. Left to
/// itself, PostgreSQL switches a prepared statement to a generic plan after five runs and
/// keeps it for the connection's life (until the next ANALYZE); made while the tables were
/// nearly empty, that plan scanned them sequentially (measured: 11 million tuples read in a
/// 20,000-turn run). Planning every run for its arguments (`force_custom_plan`) cost the
/// planner's time on every statement of every group, and still chose hash joins over full
/// scans of `chats` for large groups. Every statement the writer runs has an index for its
/// lookups (the tables' primary keys, `artifacts_by_chat`), so the writer forbids the scans
/// and joins it never wants: the one generic plan of each statement is the index plan, made
/// once per connection (measured: no tuple read by a sequential scan in a 10,000-turn run).
///
/// And it uses that generic plan always (`force_generic_plan`): left to choose, PostgreSQL
/// compared the generic plan's cost, estimated for arrays of unknown length, with custom plans
/// for the few rows of a light-load group, and planned the statements of
/// `tessera_commit_group` anew on every call (measured at 420 turns/s: the planner took a
/// quarter of the backend's samples in the call, and forcing the generic plan took the call
/// from 0.39 to 0.24 ms).
async fn writer_connection(pool: &PgPool) -> Result<PoolConnection<Postgres>, StoreError> {
    let mut conn = pool.acquire().await?;
    sqlx::raw_sql(
        "SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off; \
         SET plan_cache_mode = force_generic_plan",
    )
    .execute(&mut *conn)
    .await?;
    Ok(conn)
}

/// Runs the group as described in the module docs: one result per job, or the error that
/// failed the whole group.
async fn commit_group(
    conn: &mut PgConnection,
    group: &[Job],
) -> Result<Vec<Result<Done, StoreError>>, StoreError> {
    let writes: Vec<&Write> = group.iter().map(|job| &job.write).collect();
    let fast = if merged::fits(writes.iter().copied()) {
        // One call, its own transaction.
        merged::run(conn, &writes).await
    } else {
        let mut tx = conn.begin().await?;
        match one_by_one(&mut tx, &writes).await {
            Ok(Some(done)) => {
                tx.commit().await?;
                Ok(Some(done.into_iter().map(Ok).collect()))
            }
            Err(error) if error.is_transient() => Err(error),
            other => {
                tx.rollback().await?;
                other.map(|_| None)
            }
        }
    };
    match fast {
        Ok(Some(done)) => return Ok(done),
        Err(error) if error.is_transient() => return Err(error),
        // Some job fails on its own, and nothing was written: find it, below.
        Ok(None) | Err(_) => {}
    }
    let mut results = Vec::with_capacity(group.len());
    let mut tx = conn.begin().await?;
    for job in group {
        let mut savepoint = tx.begin().await?;
        match job.write.run(&mut savepoint).await {
            Ok(done) => {
                savepoint.commit().await?;
                results.push(Ok(done));
            }
            Err(error) if error.is_transient() => return Err(error),
            Err(error) => {
                savepoint.rollback().await?;
                results.push(Err(error));
            }
        }
    }
    tx.commit().await?;
    Ok(results)
}

/// Every job in order without savepoints; `None` as soon as one fails on its own.
async fn one_by_one(
    conn: &mut PgConnection,
    writes: &[&Write],
) -> Result<Option<Vec<Done>>, StoreError> {
    let mut done = Vec::with_capacity(writes.len());
    for write in writes {
        match write.run(conn).await {
            Ok(answer) => done.push(answer),
            Err(error) if error.is_transient() => return Err(error),
            Err(_) => return Ok(None),
        }
    }
    Ok(Some(done))
}

/// The group's error, once per job. (`StoreError` is not `Clone`: it is a caller-facing
/// error type; here every job gets the same kind and message.)
fn clone_error(error: &StoreError) -> StoreError {
    match error {
        StoreError::Closed => StoreError::Closed,
        StoreError::Setup(m) => StoreError::Setup(m.clone()),
        other => StoreError::Transient(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sqlx::postgres::PgPoolOptions;

    use super::*;
    use crate::testing::PgTestSchema;
    use crate::{ChatRecord, ChatStore, ChatWriteBatch, PgStore, StoredEvent, ToolClaim};

    fn flush(chat_id: &str, seq: u64, epoch: Option<i64>) -> Write {
        let batch = ChatWriteBatch {
            events: vec![StoredEvent {
                seq,
                event_type: "chat.text".into(),
                json: "{}".into(),
            }],
            epoch,
            ..ChatWriteBatch::default()
        };
        Write::Batch {
            chat_id: chat_id.to_owned(),
            batch: Arc::new(batch),
        }
    }

    fn claim(chat_id: &str, key: &str) -> Write {
        Write::ClaimTool {
            chat_id: chat_id.to_owned(),
            key: key.to_owned(),
            epoch: None,
        }
    }

    /// A store with chat `c1`, and a pool of this test's runtime on the same schema.
    async fn scratch(test: &str) -> Option<(PgTestSchema, PgStore, PgPool)> {
        let schema = PgTestSchema::create(test).await?;
        let store = PgStore::connect_with(schema.options())
            .await
            .expect("store");
        let record = ChatRecord {
            chat_id: "c1".into(),
            tenant: "t".into(),
            user_id: "u".into(),
            workflow: "w".into(),
            workflow_version: String::new(),
            created_at_ms: 0,
        };
        store.create_chat(record).await.expect("chat");
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(schema.options())
            .await
            .expect("pool");
        Some((schema, store, pool))
    }

    /// The transaction id that wrote event `seq` of `c1`, and the one that wrote claim `key`.
    async fn writers_of(pool: &PgPool, seq: i64, key: &str) -> (String, String) {
        sqlx::query_as(
            "SELECT (SELECT xmin::text FROM events WHERE chat_id = 'c1' AND seq = $1), \
                    (SELECT xmin::text FROM tool_invocations \
                     WHERE chat_id = 'c1' AND invocation_key = $2)",
        )
        .bind(seq)
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("xmin")
    }

    #[tokio::test]
    async fn an_unhurried_flush_commits_with_the_next_hurried_write() {
        let Some((_schema, _store, pool)) = scratch("pg_writer_unhurried").await else {
            return;
        };
        // A wait no test outlives: the flush can only commit with the claim.
        let writer = Writer::start_with_wait(&pool, Duration::from_secs(3600));
        let mut flushed = Box::pin(writer.submit(flush("c1", 1, None)));
        // Not answered on its own (it would be within milliseconds if it were hurried).
        let alone = tokio::time::timeout(Duration::from_millis(200), flushed.as_mut()).await;
        assert!(alone.is_err(), "an unhurried flush waits for company");
        assert!(writer.submit(claim("c1", "k1")).await.is_ok());
        assert!(flushed.await.is_ok());
        let (event_tx, claim_tx) = writers_of(&pool, 1, "k1").await;
        assert_eq!(event_tx, claim_tx, "one transaction wrote both");
        writer.close().await;
    }

    #[tokio::test]
    async fn a_fenced_flush_is_hurried() {
        let Some((_schema, _store, pool)) = scratch("pg_writer_fenced_flush").await else {
            return;
        };
        let writer = Writer::start_with_wait(&pool, Duration::from_secs(3600));
        // A cluster's flush (it carries a lease epoch): answered without company. The epoch
        // is refused (the chat has no lease), which still answers at once.
        let answer = tokio::time::timeout(
            Duration::from_secs(30),
            writer.submit(flush("c1", 1, Some(1))),
        )
        .await;
        assert!(
            answer.is_ok(),
            "a fenced flush does not wait for other writes"
        );
        writer.close().await;
    }

    /// A group of one turn's writes (the fast path): every claim answered as it stands (won,
    /// or the record it found, with its result), and all of it in one transaction.
    #[tokio::test]
    async fn a_group_answers_each_claim_as_it_stands_in_one_transaction() {
        let Some((_schema, store, pool)) = scratch("pg_writer_one_call").await else {
            return;
        };
        // Records from before: one completed with a result, one started and never completed.
        assert_eq!(
            store.claim_tool("c1", "done", None).await.unwrap(),
            ToolClaim::Claimed
        );
        store
            .complete_tool_with_result("c1", "done", &serde_json::json!({"n": 1}), None)
            .await
            .unwrap();
        assert_eq!(
            store.claim_tool("c1", "crashed", None).await.unwrap(),
            ToolClaim::Claimed
        );
        let writer = Writer::start_with_wait(&pool, Duration::from_secs(3600));
        // Submitted before any is awaited: the writer takes them as one group.
        let answers = futures::future::join_all([
            writer.submit(flush("c1", 1, None)),
            writer.submit(claim("c1", "new")),
            writer.submit(claim("c1", "done")),
            writer.submit(claim("c1", "crashed")),
        ])
        .await;
        let claims: Vec<_> = answers
            .into_iter()
            .map(|answer| match answer {
                Ok(Done::Claim(claim)) => Some(claim),
                Ok(Done::Unit) => None,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            claims,
            [
                None,
                Some(ToolClaim::Claimed),
                Some(ToolClaim::AlreadyCompleted(Some(
                    serde_json::json!({"n": 1})
                ))),
                Some(ToolClaim::AlreadyStarted),
            ]
        );
        let (event_tx, claim_tx) = writers_of(&pool, 1, "new").await;
        assert_eq!(event_tx, claim_tx, "one transaction wrote both");
        writer.close().await;
    }

    #[tokio::test]
    async fn an_unhurried_write_alone_commits_after_its_wait() {
        let Some((_schema, _store, pool)) = scratch("pg_writer_unhurried_alone").await else {
            return;
        };
        let writer = Writer::start_with_wait(&pool, Duration::from_millis(1));
        assert!(writer.submit(flush("c1", 1, None)).await.is_ok());
        writer.close().await;
    }
}
