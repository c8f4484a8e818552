//! The Apply transaction: record an event in the inbox and move the task's view forward, in one
//! READ COMMITTED transaction in the receiver's own MySQL database.
//!
//! This is the middle of the flow: a validated [`TaskEvent`] comes in, an [`Outcome`] or an
//! [`ApplyError`] goes out, and only an `Ok` may lead to an ACK. The store knows nothing of the
//! platform or the SDK.
//!
//! # What one apply sends
//!
//! Statements are prepared once per connection and cached; after that each line below is one
//! round trip. The session was set to READ COMMITTED and `time_zone = '+00:00'` when the
//! connection was opened, so a transaction costs no `SET`, and the store's own connections
//! (`pool.rs`) send no `COM_PING` around it.
//!
//! | path | statements | round trips |
//! |---|---|---|
//! | applied, first event of the task | `BEGIN`, [`INSERT_INBOX`], [`UPSERT_VIEW`] (inserts), `COMMIT` | 4 |
//! | applied, view exists | `BEGIN`, [`INSERT_INBOX`], [`UPSERT_VIEW`] (advances), `COMMIT` | 4 |
//! | stale (older version) | `BEGIN`, [`INSERT_INBOX`], [`UPSERT_VIEW`] (unchanged), [`MARK_STALE`], `COMMIT` | 5 |
//! | duplicate | `BEGIN`, [`INSERT_INBOX`] → 1062, [`READ_VERDICT`], `ROLLBACK` | 4 |
//! | conflict (same version, other event) | `BEGIN`, [`INSERT_INBOX`], [`UPSERT_VIEW`], [`READ_VIEW_EVENT`], `ROLLBACK` | 5 |
//!
//! plus whatever a caller's [`BusinessWrite`] sends, inside the same transaction.
//!
//! # Why in this order
//!
//! 1. The plain inbox `INSERT` comes first. It is the dedup: InnoDB makes a second inserter of
//!    the same key wait until the first commits (then 1062) or rolls back (then the insert
//!    succeeds). An uncommitted competitor is therefore never mistaken for a success, and a
//!    re-apply after an unknown COMMIT cannot read "absent" while the lost transaction is still
//!    open on the server. No `INSERT IGNORE` or `ON DUPLICATE KEY UPDATE` on the inbox: both
//!    hide which key collided. The row carries `applied = 1` provisionally; only the stale path
//!    clears it, in the same transaction, and nobody can read it in between (a duplicate waits
//!    on the row's lock, and READ COMMITTED readers see only committed rows).
//!
//!    On Galera (synchronous multi-primary) the second inserter does not wait when it runs on
//!    another node: each node accepts its own insert, and the cluster certifies the write sets
//!    at COMMIT in one global order. The later one fails certification (1213 in reply to
//!    COMMIT), or, if it is still open when the earlier one is applied on its node, it is
//!    aborted there (1213 at its next statement). Either way it rolled back, definitely, and
//!    [`Store::apply_until`] runs it again: the insert then meets the committed row (1062)
//!    and the apply reports a duplicate. Dedup still holds; only who waits differs.
//! 2. The view is created with its final values, or locked and advanced, by one
//!    `INSERT … ON DUPLICATE KEY UPDATE` ([`UPSERT_VIEW`]). On the view this is safe and it is
//!    what keeps concurrent first events of one task from deadlocking: a plain `INSERT` that
//!    meets an existing row takes a *shared* lock on it, and two such holders that then ask for
//!    the exclusive lock (`SELECT … FOR UPDATE`) deadlock, even after the creator committed.
//!    The upsert asks for the exclusive lock directly, so appliers of one task queue up. No row
//!    with a placeholder version exists at any point.
//! 3. Only a higher version advances the view (the upsert's `IF`s); it reports what it found
//!    through the OK packet's last-insert-id. An older version clears the inbox row's `applied`
//!    flag ([`MARK_STALE`]). The same version with another event id is a conflict: roll back.
//!    The same version with the same event id, which the inbox did not hold (its row was
//!    pruned, `crate::prune`), is stale too: recorded again with `applied = 0`, never applied
//!    twice.
//! 4. The caller's writes run, then `COMMIT`. Only a COMMIT answered with OK returns `Ok`.
//!    COMMIT answered with an error packet is a definite failure; COMMIT with no answer (the
//!    connection broke, or the time budget ran out) is [`ApplyError::CommitUnconfirmed`].
//!
//! # Contention and failures inside one apply
//!
//! Deadlocks (1213) can still happen where this store does not control the lock order: several
//! appliers of one event queued behind a winner that rolls back, or a caller's own writes. They,
//! lock wait timeouts (1205), an error in reply to COMMIT (Galera reports a failed
//! certification as 1213 there) and a connection lost before COMMIT was sent are definite
//! rollbacks: [`Store::apply_until`] restarts the transaction, on a fresh connection when the
//! old one broke, after a jittered doubling wait, until the budget is spent. Only then does a
//! retryable [`ApplyError::Storage`] reach the caller. A COMMIT without an answer is never
//! restarted blindly: it reaches the caller as [`ApplyError::CommitUnconfirmed`].
//!
//! When the budget runs out while a statement runs (a lock held by someone else, a server that
//! stopped answering), the connection is killed on the server from a new connection
//! (`KILL CONNECTION`) before the apply returns. That, rather than a session
//! `innodb_lock_wait_timeout` below the budget, bounds every wait: that variable counts whole
//! seconds, covers row locks only (not metadata locks, a Galera flow-control pause or a slow
//! statement of the caller's), and its 1205 ends only the statement, not the transaction that
//! still holds its locks.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::{Executor, MySql, MySqlConnection, Row};
use tokio::time::Instant;

use crate::connect::{connect_options, CONNECT_TIMEOUT};
use crate::dsn::Dsn;
use crate::durability;
use crate::error::{mysql_number, ER_DUP_ENTRY};
pub use crate::error::{ApplyError, Conflict, StorageError, StorageKind, WriteError};
use crate::event::{Rejection, TaskEvent};
use crate::identity::{ConsumerName, EventId, QueueId, TaskId};
pub use crate::outcome::Outcome;
use crate::pool::{Lease, Pool, KILL_TIMEOUT};
use crate::schema::{INDEX_EXISTS, RECEIVED_AT_INDEX};
use crate::seam::{self, Point};
pub use crate::statements::{
    Statements, INSERT_INBOX, MARK_STALE, READ_VERDICT, READ_VIEW_EVENT, UPSERT_VIEW,
    VIEW_ADVANCED, VIEW_CREATED, VIEW_NEWER, VIEW_SAME_EVENT, VIEW_SAME_VERSION_OTHER_EVENT,
};
pub use crate::work::{BusinessWrite, NoWrite, Receipt, WriteFuture};
use crate::work::{Done, GroupStep, Work};
use canonical_form::Digest;

/// One apply, from taking a connection to the answer to COMMIT, takes at most this long.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// How often an apply that committed reads the primary's semi-synchronous status again while
/// it reports no replica acknowledging ([`StoreOptions::require_replica_ack`]).
pub const REPLICA_POLL: Duration = Duration::from_millis(100);

/// Reads nothing, and fails when a table is missing or the server refuses to serve tables
/// (a Galera node outside the primary component).
const SCHEMA_CHECK: &str = "SELECT 1 FROM receiver_inbox JOIN receiver_task_views LIMIT 0";

/// The first wait before a retry inside the apply; it doubles up to [`RETRY_MAX_WAIT`], and
/// each wait is jittered to between half and all of it.
pub const RETRY_FIRST_WAIT: Duration = Duration::from_millis(10);
/// The longest wait between two attempts inside one apply.
pub const RETRY_MAX_WAIT: Duration = Duration::from_millis(400);

/// The age of the oldest inbox row of a consumer and queue, in microseconds (NULL: none).
const OLDEST_AGE: &str = "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(received_at), UTC_TIMESTAMP(6)) \
     FROM receiver_inbox WHERE consumer_name = ? AND queue_id = ?";

/// Reads a whole inbox record (not part of apply).
pub const READ_INBOX: &str = "SELECT event_digest, applied, event_canonical FROM receiver_inbox \
     WHERE consumer_name = ? AND queue_id = ? AND event_id = ?";

/// Reads a task's view (not part of apply).
pub const READ_VIEW: &str = "SELECT task_version, last_event_id, last_state, last_result, \
     applied_events, created_at, updated_at FROM receiver_task_views \
     WHERE consumer_name = ? AND queue_id = ? AND task_id = ?";

/// How to open a [`Store`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Pool size; at least the consumer's concurrency.
    pub max_connections: u32,
    /// The time budget of one apply.
    pub apply_timeout: Duration,
    /// Require that a replica holds every commit before the apply reports success (lossless
    /// semi-synchronous replication; see [`crate::durability`]): [`Store::connect`] refuses a
    /// server that cannot honour it, [`Store::check`] fails while the primary reports no
    /// replica acknowledging, and an apply whose commit no replica holds within its budget
    /// ends in [`ApplyError::Unreplicated`].
    pub require_replica_ack: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 8,
            apply_timeout: APPLY_TIMEOUT,
            require_replica_ack: false,
        }
    }
}

impl StoreOptions {
    /// These options with a pool of `n` connections.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// These options with a time budget of `budget` per apply.
    pub fn apply_timeout(mut self, budget: Duration) -> Self {
        self.apply_timeout = budget;
        self
    }

    /// These options requiring (or not) a replica's acknowledgement of every commit.
    pub fn require_replica_ack(mut self, required: bool) -> Self {
        self.require_replica_ack = required;
        self
    }
}

/// A task's view as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskView {
    pub task_version: u64,
    pub last_event_id: String,
    pub last_state: String,
    /// Canonical JSON bytes, or `None` for SQL NULL.
    pub last_result: Option<Vec<u8>>,
    pub applied_events: u64,
}

/// The inbox's record of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRecord {
    pub digest: Digest,
    pub applied: bool,
    pub canonical: Vec<u8>,
}

/// The receiver's inbox and views for one consumer name and queue.
#[derive(Clone)]
pub struct Store {
    pool: Arc<Pool>,
    consumer: ConsumerName,
    queue: QueueId,
    apply_timeout: Duration,
    require_replica_ack: bool,
    statements: &'static Statements,
    /// How many more groups read the inbox before their dedup claims ([`Store::apply_group`]).
    screen: Arc<AtomicU32>,
    /// How the database's schema fits this build, as read at connect.
    schema: crate::version::Fit,
}

impl Store {
    /// The statements this store runs.
    pub(crate) fn statements(&self) -> &'static Statements {
        self.statements
    }

    /// The groups left to read the inbox before their dedup claims (shared by the store's
    /// clones).
    pub(crate) fn screen(&self) -> &AtomicU32 {
        &self.screen
    }
}

/// Names only: the connection options hold the password.
impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("consumer", &self.consumer)
            .field("queue", &self.queue)
            .field("apply_timeout", &self.apply_timeout)
            .finish_non_exhaustive()
    }
}

/// What one apply did, and how many times it restarted its transaction to get there.
#[derive(Debug)]
pub struct Applied {
    /// The answer: only an `Ok` may be ACKed.
    pub result: Result<Outcome, ApplyError>,
    /// Transactions restarted inside this apply after a definite rollback (a deadlock, a lock
    /// wait timeout, an error in reply to COMMIT, a connection lost before COMMIT).
    pub retries: u32,
    /// The same restarts, by why each was needed.
    pub reasons: Retries,
}

/// A connection of its own for [`Store::check`], outside the pool: a health probe never waits
/// behind applies for a connection, and applies never wait behind it.
#[derive(Default)]
pub struct HealthProbe {
    conn: Option<crate::pool::Conn>,
}

impl fmt::Debug for HealthProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthProbe")
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

/// Why a transaction was restarted inside an apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// 1213 on a statement before COMMIT: InnoDB chose this transaction as a deadlock's victim
    /// (on Galera, also a brute-force abort of a running statement).
    Deadlock,
    /// 1205: a lock was not granted in time.
    LockWait,
    /// 1213 in reply to COMMIT: on Galera, a certification failure or a brute-force abort at
    /// commit (a single InnoDB server does not deadlock at COMMIT).
    Certification,
    /// Any other definite failure in reply to COMMIT (Galera's 1180, say).
    CommitError,
    /// The connection broke or the server refused service before COMMIT was sent.
    Unavailable,
    /// The server refused a write as read-only (1290, 1792, 1836): a demoted primary, or an
    /// address that does not yet lead to the new one. Retried on a new connection.
    ReadOnly,
}

impl RetryReason {
    /// Every reason, in a fixed order.
    pub const ALL: [RetryReason; 6] = [
        RetryReason::Deadlock,
        RetryReason::LockWait,
        RetryReason::Certification,
        RetryReason::CommitError,
        RetryReason::Unavailable,
        RetryReason::ReadOnly,
    ];

    /// The stable lowercase name (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::Deadlock => "deadlock",
            RetryReason::LockWait => "lock_wait",
            RetryReason::Certification => "certification",
            RetryReason::CommitError => "commit_error",
            RetryReason::Unavailable => "unavailable",
            RetryReason::ReadOnly => "read_only",
        }
    }

    /// Why `e` was retried, given whether it answered COMMIT.
    fn of(e: &StorageError, at_commit: bool) -> RetryReason {
        match (e.kind(), at_commit) {
            (StorageKind::Deadlock, true) => RetryReason::Certification,
            (StorageKind::Deadlock, false) => RetryReason::Deadlock,
            (StorageKind::LockWaitTimeout, _) => RetryReason::LockWait,
            (StorageKind::ReadOnly, _) => RetryReason::ReadOnly,
            (_, true) => RetryReason::CommitError,
            _ => RetryReason::Unavailable,
        }
    }
}

/// Restarts counted by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retries([u32; RetryReason::ALL.len()]);

impl FromIterator<RetryReason> for Retries {
    fn from_iter<I: IntoIterator<Item = RetryReason>>(reasons: I) -> Retries {
        let mut r = Retries::default();
        for reason in reasons {
            r.add(reason);
        }
        r
    }
}

impl Retries {
    /// How many restarts had `reason`.
    pub fn count(&self, reason: RetryReason) -> u32 {
        self.0[reason as usize]
    }

    /// All restarts.
    pub fn total(&self) -> u32 {
        self.0.iter().sum()
    }

    fn add(&mut self, reason: RetryReason) {
        self.0[reason as usize] += 1;
    }

    /// Each reason with its count, zeros included.
    pub fn iter(&self) -> impl Iterator<Item = (RetryReason, u32)> + '_ {
        RetryReason::ALL.into_iter().map(|r| (r, self.count(r)))
    }
}

impl Store {
    /// Opens one connection on `dsn` for `consumer` and `queue`, and checks that the schema is
    /// there; further connections open on demand, up to `options.max_connections`.
    pub async fn connect(
        dsn: &Dsn,
        consumer: ConsumerName,
        queue: QueueId,
        options: StoreOptions,
    ) -> Result<Store, StorageError> {
        let statements = crate::seam::statements();
        let connect = connect_options(dsn)?.timezone(statements.time_zone.map(str::to_owned));
        let pool = Arc::new(Pool::new(connect, options.max_connections));
        let mut store = Store {
            pool,
            consumer,
            queue,
            apply_timeout: options.apply_timeout,
            require_replica_ack: options.require_replica_ack,
            statements,
            screen: Arc::new(AtomicU32::new(0)),
            schema: crate::version::Fit::Current,
        };
        // Fail at start, not at the first event, when `init` was never run. A server that
        // accepts the connection and then says nothing must not hold the start forever.
        let first = async {
            store.read(sqlx::query(SCHEMA_CHECK)).await?;
            // The schema's version, before anything is taken or written: a newer one than
            // this build knows is refused here.
            let schema = {
                let mut conn = store.pool.acquire().await.map_err(storage)?;
                let fit = crate::migrate::check(conn.get()).await?;
                conn.clean();
                fit
            };
            if store.require_replica_ack {
                // A server that can never honour the requirement is refused now, not held
                // for forever; one whose replica is only late is waited for like an outage.
                let mut conn = store.pool.acquire().await.map_err(storage)?;
                durability::check_replica_ack_settings(conn.get()).await?;
                conn.clean();
            }
            Ok::<_, StorageError>(schema)
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, first).await {
            Ok(result) => result
                .map(|schema| {
                    store.schema = schema;
                    store
                })
                .map_err(|e| e.for_dsn(dsn)),
            Err(_) => Err(StorageError::not_answering().for_dsn(dsn)),
        }
    }

    /// How the database's schema fits this build: an older one that it still runs on is
    /// [`crate::version::Fit::Older`], which a program warns about.
    pub fn schema(&self) -> crate::version::Fit {
        self.schema
    }

    /// Whether this store requires a replica's acknowledgement of every commit.
    pub fn requires_replica_ack(&self) -> bool {
        self.require_replica_ack
    }

    /// The consumer name this store records under.
    pub fn consumer(&self) -> &ConsumerName {
        &self.consumer
    }

    /// The queue this store accepts events from.
    pub fn queue(&self) -> &QueueId {
        &self.queue
    }

    /// The time budget of one apply.
    pub fn apply_timeout(&self) -> Duration {
        self.apply_timeout
    }

    /// Closes the idle connections and refuses new applies.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Whether the database serves this store now, on `probe`'s own connection (kept between
    /// calls, opened again after a failure), within `within`. Cheap enough to call four times
    /// a second: one statement that reads no row, naming the tables, because a Galera node
    /// outside the primary component answers `SELECT 1` but refuses every table (1047); one
    /// that reads `@@global.read_only`, because a demoted primary answers every read and
    /// refuses every write ([`StorageKind::ReadOnly`]); and, when the store requires a
    /// replica's acknowledgement, the primary's semi-synchronous status
    /// ([`StorageKind::Unreplicated`] while it is off).
    pub async fn check(
        &self,
        probe: &mut HealthProbe,
        within: Duration,
    ) -> Result<(), StorageError> {
        let attempt = async {
            let conn = match &mut probe.conn {
                Some(conn) => conn,
                slot => slot.insert(self.pool.open().await.map_err(storage)?),
            };
            conn.raw.execute(SCHEMA_CHECK).await.map_err(storage)?;
            if self.statements.probe_read_only {
                durability::check_writable(&mut conn.raw).await?;
            }
            if self.require_replica_ack {
                durability::check_replica_ack(&mut conn.raw).await?;
            }
            Ok(())
        };
        let result = match tokio::time::timeout(within, attempt).await {
            Ok(result) => result,
            Err(_) => Err(StorageError::not_answering()),
        };
        if result.is_err() {
            // A connection that failed or hung is not trusted again: the next check opens one.
            probe.conn = None;
        }
        result
    }

    /// Records `event` and advances its task's view, with no writes of the caller's.
    pub async fn apply(&self, event: &TaskEvent) -> Result<Outcome, ApplyError> {
        self.apply_with(event, &NoWrite).await
    }

    /// Records `event`, advances its task's view and runs `write`, all in one transaction.
    pub async fn apply_with(
        &self,
        event: &TaskEvent,
        write: &dyn BusinessWrite,
    ) -> Result<Outcome, ApplyError> {
        self.apply_until(event, write, None).await.result
    }

    /// [`Store::apply_with`], finishing by `deadline` when that comes before the time budget
    /// (a delivery's lease expiry, say), and reporting the retries it made.
    ///
    /// A definite rollback restarts the whole transaction after a jittered, doubling wait
    /// ([`RETRY_FIRST_WAIT`] to [`RETRY_MAX_WAIT`]) while time is left. A COMMIT without an
    /// answer is never retried here: only a later apply of the same event can tell whether it
    /// committed. When time runs out mid-statement, the connection is killed on the server
    /// before this returns (within half a second, reserved from the budget), so nothing of
    /// the apply still waits for or holds a lock there.
    pub async fn apply_until(
        &self,
        event: &TaskEvent,
        write: &dyn BusinessWrite,
        deadline: Option<Instant>,
    ) -> Applied {
        if event.queue() != &self.queue {
            return Applied {
                result: Err(ApplyError::Rejected(Rejection::QueueMismatch)),
                retries: 0,
                reasons: Retries::default(),
            };
        }
        let (done, reasons) = self.run(&Work::One(event, write), deadline).await;
        let result = done.and_then(|done| match done {
            Done::One(outcome) => Ok(outcome),
            _ => Err(ApplyError::Storage(StorageError::unexpected(
                "one event's apply ended as a group",
            ))),
        });
        Applied {
            result,
            retries: reasons.total(),
            reasons,
        }
    }

    /// Runs `work` in transactions until one ends without a retryable failure or time runs
    /// out (the earlier of `deadline` and the budget); what the last one did and the
    /// restarts before it.
    pub(crate) async fn run(
        &self,
        work: &Work<'_>,
        deadline: Option<Instant>,
    ) -> (Result<Done, ApplyError>, Retries) {
        let started = Instant::now();
        let budget_end = started + self.apply_timeout;
        let end = deadline.map_or(budget_end, |d| d.min(budget_end));
        // What a timeout reports: the time this apply was given.
        let allowed = end.saturating_duration_since(started);
        // Time kept back for killing an abandoned statement, so the whole apply ends by `end`.
        let reserve = KILL_TIMEOUT.min(allowed / 4);
        let work_end = end.checked_sub(reserve).unwrap_or(end);
        let mut backoff = backoff::Backoff::new(RETRY_FIRST_WAIT, RETRY_MAX_WAIT);
        let mut reasons = Retries::default();
        loop {
            let (result, at_commit) = self.attempt(work, work_end, allowed).await;
            let again = match &result {
                Err(ApplyError::Storage(e)) if e.is_retryable() => {
                    Some(RetryReason::of(e, at_commit))
                }
                _ => None,
            };
            let pause = backoff.next_wait();
            let Some(reason) = again.filter(|_| Instant::now() + pause < work_end) else {
                return (result, reasons);
            };
            tokio::time::sleep(pause).await;
            reasons.add(reason);
        }
    }

    /// One transaction, on one connection, ended by `end`; and whether COMMIT was sent.
    async fn attempt(
        &self,
        work: &Work<'_>,
        end: Instant,
        budget: Duration,
    ) -> (Result<Done, ApplyError>, bool) {
        let mut conn = match tokio::time::timeout_at(end, self.pool.acquire()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return (Err(e.into()), false),
            Err(_) => return (Err(ApplyError::Timeout(budget)), false),
        };
        let commit_sent = AtomicBool::new(false);
        let ran = tokio::time::timeout_at(
            end,
            self.run_transaction(&mut conn, work, &commit_sent, end),
        )
        .await;
        let at_commit = commit_sent.load(Ordering::SeqCst);
        let result = match ran {
            Ok(result) => result,
            // Out of time mid-statement: end the statement and its transaction on the server
            // (the lock it waits for or holds) before answering.
            Err(_) => {
                if self.statements.kill_abandoned {
                    conn.abandon().await;
                } else {
                    // Only a mutant: the socket closed, the server left to notice.
                    conn.broken();
                    drop(conn);
                }
                if at_commit {
                    Err(ApplyError::CommitUnconfirmed)
                } else {
                    Err(ApplyError::Timeout(budget))
                }
            }
        };
        (result, at_commit)
    }

    /// The transaction and what follows it on the same connection: the duplicate's verdict,
    /// or a ROLLBACK after an error or before a group's fallback; then, when the store
    /// requires it, a replica's acknowledgement of what is recorded, waited for until `end`.
    /// Leaves the lease clean when the connection may be reused.
    async fn run_transaction(
        &self,
        conn: &mut Lease<'_>,
        work: &Work<'_>,
        commit_sent: &AtomicBool,
        end: Instant,
    ) -> Result<Done, ApplyError> {
        let attempt = match *work {
            Work::One(event, write) => self
                .transaction(conn.get(), event, write, commit_sent)
                .await
                .map(|step| match step {
                    Step::Committed(outcome) => GroupStep::Committed(vec![outcome]),
                    Step::AlreadyRecorded => GroupStep::AlreadyRecorded(event),
                }),
            Work::Group { members, screen } => {
                self.group_transaction(conn.get(), members, screen, commit_sent)
                    .await
            }
        };
        let recorded = match attempt {
            Ok(GroupStep::Committed(outcomes)) => {
                conn.clean();
                Ok(outcomes)
            }
            Ok(GroupStep::AlreadyRecorded(event)) => {
                // The verdict is read before ROLLBACK: the duplicate key left this transaction
                // a shared lock on the committed row, so nothing (a prune's DELETE) can remove
                // it between the dedup claim and the verdict. Read after ROLLBACK, a row pruned
                // in between would be "vanished", an error costing the delivery an attempt.
                seam::reach(Point::BeforeVerdict, event).await;
                let resolved = self.resolve_duplicate(conn.get(), event).await;
                let rolled_back = conn.get().execute("ROLLBACK").await;
                match (&resolved, rolled_back) {
                    (Err(ApplyError::Storage(_)), _) | (_, Err(_)) => {}
                    _ => conn.clean(),
                }
                resolved.map(|outcome| vec![outcome])
            }
            Ok(GroupStep::Fallback(why)) => {
                // Nothing of the group stays: roll it back, and apply its events one by one.
                return match conn.get().execute("ROLLBACK").await {
                    Ok(_) => {
                        conn.clean();
                        Ok(Done::Fallback(why))
                    }
                    Err(e) => {
                        conn.broken();
                        Err(e.into())
                    }
                };
            }
            Err(e) => {
                // Before COMMIT, a clean ROLLBACK keeps the connection; after COMMIT was sent,
                // or if ROLLBACK fails, the connection is closed. A transport failure cannot be
                // rolled back from here: the server does it when it sees the socket close. A
                // read-only refusal closes it too: it leads to a server that will not take
                // writes, and the next connection may reach the new primary.
                if matches!(&e, ApplyError::Storage(s) if s.discards_connection()) {
                    conn.broken();
                } else if !commit_sent.load(Ordering::SeqCst)
                    && conn.get().execute("ROLLBACK").await.is_ok()
                {
                    conn.clean();
                }
                Err(e)
            }
        };
        let outcomes = recorded?;
        let replicated = !self.require_replica_ack || self.await_replica(conn, end).await;
        Ok(match work {
            Work::One(..) if !replicated => {
                return Err(ApplyError::Unreplicated(outcomes[0]));
            }
            Work::One(..) => Done::One(outcomes[0]),
            Work::Group { .. } => Done::Group {
                outcomes,
                replicated,
            },
        })
    }

    /// After a commit or a duplicate's verdict, on the same connection (so the same server):
    /// whether the primary reports a replica acknowledging, read after that answer (see
    /// [`crate::durability`] for why that is enough), polled until shortly before `end`.
    /// `false` means what is recorded is not known to be on a replica.
    async fn await_replica(&self, conn: &mut Lease<'_>, end: Instant) -> bool {
        loop {
            match durability::check_replica_ack(conn.get()).await {
                Ok(()) => return true,
                Err(e) if e.kind() == StorageKind::Unreplicated => {}
                // The status could not be read: what is recorded is not known to be on a
                // replica either.
                Err(_) => {
                    conn.broken();
                    return false;
                }
            }
            if Instant::now() + REPLICA_POLL * 2 >= end {
                return false;
            }
            tokio::time::sleep(REPLICA_POLL).await;
        }
    }

    /// BEGIN … COMMIT. Returns with the transaction still open on any error, and on a
    /// duplicate key of the inbox.
    async fn transaction(
        &self,
        conn: &mut MySqlConnection,
        event: &TaskEvent,
        write: &dyn BusinessWrite,
        commit_sent: &AtomicBool,
    ) -> Result<Step, ApplyError> {
        let consumer = self.consumer.as_str().as_bytes();
        let queue = self.queue.as_str().as_bytes();
        let task = event.task().as_str().as_bytes();
        let event_id = event.id().as_str().as_bytes();

        conn.execute("BEGIN").await?;
        seam::reach(Point::BeforeInsert, event).await;
        let inserted = sqlx::query(self.statements.insert_inbox)
            .bind(consumer)
            .bind(queue)
            .bind(event_id)
            .bind(&event.digest().0[..])
            .bind(event.canonical())
            .execute(&mut *conn)
            .await;
        match inserted {
            // No row inserted: the key was taken. The plain INSERT always reports 1062 instead;
            // reading the count keeps the decision on what the server did, whatever the
            // statement.
            Ok(r) if r.rows_affected() == 0 => return Ok(Step::AlreadyRecorded),
            Ok(_) => {}
            // The inbox has one unique key, so a 1062 here is always the dedup identity.
            Err(e) if mysql_number(&e) == Some(ER_DUP_ENTRY) => return Ok(Step::AlreadyRecorded),
            Err(e) => return Err(e.into()),
        }

        let upserted = sqlx::query(self.statements.upsert_view)
            .bind(consumer)
            .bind(queue)
            .bind(task)
            .bind(event.version())
            .bind(event_id)
            .bind(event.state().as_str().as_bytes())
            .bind(event.result())
            .execute(&mut *conn)
            .await?;
        let outcome =
            match (upserted.last_insert_id(), upserted.rows_affected()) {
                // A fresh row counts 1, an updated row 2 (the driver asks for found rows).
                (VIEW_CREATED, 1) | (VIEW_ADVANCED, 2) => Outcome::Applied,
                // Older, or the same version and event id whose inbox row is no longer there
                // (pruned, `crate::prune`): history only, recorded again as not applied.
                (VIEW_NEWER | VIEW_SAME_EVENT, _) => {
                    self.identity_query(MARK_STALE, event.id())
                        .execute(&mut *conn)
                        .await?;
                    Outcome::Stale
                }
                (VIEW_SAME_VERSION_OTHER_EVENT, _) => {
                    let recorded: Vec<u8> = sqlx::query(READ_VIEW_EVENT)
                        .bind(consumer)
                        .bind(queue)
                        .bind(task)
                        .fetch_one(&mut *conn)
                        .await?
                        .try_get(0)?;
                    return Err(ApplyError::Conflict(Conflict::SameVersionOtherEvent {
                        version: event.version(),
                        recorded_event: String::from_utf8_lossy(&recorded).into_owned(),
                    }));
                }
                _ => return Err(ApplyError::Storage(StorageError::unexpected(
                    "the view statement reported neither a new, an advanced nor an unchanged row",
                ))),
            };

        write
            .write(&mut *conn, Receipt { event, outcome })
            .await
            .map_err(ApplyError::Write)?;

        seam::reach(Point::BeforeCommit, event).await;
        commit_sent.store(true, Ordering::SeqCst);
        match conn.execute("COMMIT").await {
            Ok(_) => Ok(Step::Committed(outcome)),
            // The server answered COMMIT with an error: a definite failure, nothing committed.
            Err(e @ sqlx::Error::Database(_)) => Err(e.into()),
            // No answer: the outcome is unknown.
            Err(_) => Err(ApplyError::CommitUnconfirmed),
        }
    }

    /// After a duplicate key: compare the committed record's digest with this event's.
    async fn resolve_duplicate(
        &self,
        conn: &mut MySqlConnection,
        event: &TaskEvent,
    ) -> Result<Outcome, ApplyError> {
        let row = sqlx::query(self.statements.read_verdict)
            .bind(&event.digest().0[..])
            .bind(self.consumer.as_str().as_bytes())
            .bind(self.queue.as_str().as_bytes())
            .bind(event.id().as_str().as_bytes())
            .fetch_optional(&mut *conn)
            .await?
            .ok_or(ApplyError::Storage(StorageError::unexpected(
                "inbox row vanished after a duplicate key",
            )))?;
        let same: i64 = row.try_get(0)?;
        if same == 1 {
            Ok(Outcome::Duplicate {
                applied: row.try_get(2)?,
            })
        } else {
            Err(ApplyError::Conflict(Conflict::DigestMismatch {
                stored: digest_column(&row, 1)?,
                delivered: event.digest(),
            }))
        }
    }

    /// `sql` with this store's consumer name and queue and `event` bound, in that order.
    fn identity_query<'q>(
        &'q self,
        sql: &'q str,
        event: &'q EventId,
    ) -> sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments> {
        sqlx::query(sql)
            .bind(self.consumer.as_str().as_bytes())
            .bind(self.queue.as_str().as_bytes())
            .bind(event.as_str().as_bytes())
    }

    /// Runs one read on a store connection (not part of an apply).
    async fn read(
        &self,
        query: sqlx::query::Query<'_, MySql, sqlx::mysql::MySqlArguments>,
    ) -> Result<Option<sqlx::mysql::MySqlRow>, StorageError> {
        let mut conn = self.pool.acquire().await.map_err(storage)?;
        let row = query.fetch_optional(conn.get()).await.map_err(storage)?;
        conn.clean();
        Ok(row)
    }

    /// Runs one read of many rows on a store connection (not part of an apply).
    pub(crate) async fn read_all(
        &self,
        query: sqlx::query::Query<'_, MySql, sqlx::mysql::MySqlArguments>,
    ) -> Result<Vec<sqlx::mysql::MySqlRow>, StorageError> {
        let mut conn = self.pool.acquire().await.map_err(storage)?;
        let rows = query.fetch_all(conn.get()).await.map_err(storage)?;
        conn.clean();
        Ok(rows)
    }

    /// The committed inbox record of `event`, if any.
    pub async fn inbox_record(&self, event: &EventId) -> Result<Option<InboxRecord>, StorageError> {
        let decode = |e: sqlx::Error| StorageError::from_sqlx(&e);
        let Some(row) = self.read(self.identity_query(READ_INBOX, event)).await? else {
            return Ok(None);
        };
        Ok(Some(InboxRecord {
            digest: digest_column(&row, 0).map_err(|e| match e {
                ApplyError::Storage(s) => s,
                _ => StorageError::unexpected("a stored digest did not decode"),
            })?,
            applied: row.try_get(1).map_err(decode)?,
            canonical: row.try_get(2).map_err(decode)?,
        }))
    }

    /// Whether the inbox has the index [`RECEIVED_AT_INDEX`], which makes
    /// [`Store::inbox_oldest_age`] a lookup instead of a scan.
    pub async fn has_received_at_index(&self) -> Result<bool, StorageError> {
        let query = sqlx::query(INDEX_EXISTS).bind(RECEIVED_AT_INDEX);
        let row = self
            .read(query)
            .await?
            .ok_or(StorageError::unexpected("COUNT(*) returned no row"))?;
        let n: i64 = row.try_get(0).map_err(storage)?;
        Ok(n > 0)
    }

    /// How long ago the oldest inbox row of this consumer and queue was received, by the
    /// server's clock; `None` for an empty inbox. With the `received_at` index the server
    /// answers from the index's first entry; without it, it scans the consumer's rows.
    pub async fn inbox_oldest_age(&self) -> Result<Option<Duration>, StorageError> {
        let query = sqlx::query(OLDEST_AGE)
            .bind(self.consumer.as_str().as_bytes())
            .bind(self.queue.as_str().as_bytes());
        let row = self
            .read(query)
            .await?
            .ok_or(StorageError::unexpected("MIN() returned no row"))?;
        let micros: Option<i64> = row.try_get(0).map_err(storage)?;
        Ok(micros.map(|m| Duration::from_micros(m.max(0).unsigned_abs())))
    }

    /// The committed view of `task`, if any.
    pub async fn view(&self, task: &TaskId) -> Result<Option<TaskView>, StorageError> {
        let decode = |e: sqlx::Error| StorageError::from_sqlx(&e);
        let query = sqlx::query(READ_VIEW)
            .bind(self.consumer.as_str().as_bytes())
            .bind(self.queue.as_str().as_bytes())
            .bind(task.as_str().as_bytes());
        let Some(row) = self.read(query).await? else {
            return Ok(None);
        };
        let text = |i: usize| -> Result<String, StorageError> {
            let bytes: Vec<u8> = row.try_get(i).map_err(decode)?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        };
        Ok(Some(TaskView {
            task_version: row.try_get(0).map_err(decode)?,
            last_event_id: text(1)?,
            last_state: text(2)?,
            last_result: row.try_get(3).map_err(decode)?,
            applied_events: row.try_get(4).map_err(decode)?,
        }))
    }
}

fn storage(e: sqlx::Error) -> StorageError {
    StorageError::from_sqlx(&e)
}

/// Where one event's transaction ended, short of an error.
enum Step {
    Committed(Outcome),
    /// The inbox INSERT hit the dedup key: the event is already committed.
    AlreadyRecorded,
}

/// A `BINARY(32)` digest column.
pub(crate) fn digest_column(
    row: &sqlx::mysql::MySqlRow,
    index: usize,
) -> Result<Digest, ApplyError> {
    let bytes: Vec<u8> = row.try_get(index)?;
    let bytes: [u8; 32] = bytes.try_into().map_err(|_| {
        ApplyError::Storage(StorageError::unexpected("a stored digest is not 32 bytes"))
    })?;
    Ok(Digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dsn_s_ssl_mode_reaches_the_connect_options() {
        // Lower-case `required` is the driver's REQUIRED: TLS is used (proved on the options
        // the store connects with, not by connecting).
        let dsn = Dsn::parse("mysql://u:p@db.internal:3306/r?ssl-mode=required").unwrap();
        assert!(matches!(
            connect_options(&dsn).unwrap().get_ssl_mode(),
            sqlx::mysql::MySqlSslMode::Required
        ));
        // The CA file must exist (Dsn::parse opens it); any readable file will do here.
        let dsn = Dsn::parse(concat!(
            "mysql://u:p@127.0.0.1:3306/r?ssl-mode=verify_identity&ssl-ca=",
            env!("CARGO_MANIFEST_DIR"),
            "/Cargo.toml"
        ))
        .unwrap();
        assert!(matches!(
            connect_options(&dsn).unwrap().get_ssl_mode(),
            sqlx::mysql::MySqlSslMode::VerifyIdentity
        ));
    }
}
