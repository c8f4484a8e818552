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
//! connection was opened, so a transaction costs no `SET`.
//!
//! | path | statements | round trips |
//! |---|---|---|
//! | applied, view exists | `BEGIN`, [`INSERT_INBOX`], [`LOCK_VIEW`], [`ADVANCE`], `COMMIT` | 5 |
//! | applied, first event of the task | the same plus [`CREATE_VIEW`] | 6 |
//! | stale (older version) | `BEGIN`, [`INSERT_INBOX`], [`LOCK_VIEW`], `COMMIT` | 4 |
//! | duplicate | `BEGIN`, [`INSERT_INBOX`] → 1062, `ROLLBACK`, [`READ_VERDICT`] | 4 |
//! | conflict (same version, other event) | `BEGIN`, [`INSERT_INBOX`], [`LOCK_VIEW`], `ROLLBACK` | 4 |
//!
//! plus whatever a caller's [`BusinessWrite`] sends, inside the same transaction.
//!
//! # Why in this order
//!
//! 1. The plain inbox `INSERT` comes first. It is the dedup: InnoDB makes a second inserter of
//!    the same key wait until the first commits (then 1062) or rolls back (then the insert
//!    succeeds). An uncommitted competitor is therefore never mistaken for a success, and a
//!    re-apply after an unknown COMMIT cannot read "absent" while the lost transaction is still
//!    open on the server. No `INSERT IGNORE` or `ON DUPLICATE KEY UPDATE`: both hide which key
//!    collided and the latter deadlocks under concurrency.
//! 2. Then the view row is locked (`SELECT … FOR UPDATE`), or created with placeholder
//!    version 0 when absent (a racing creator makes that `INSERT` wait, then 1062, and the lock
//!    is taken again). The placeholder is always overwritten or rolled back before anyone can
//!    see it, because every event has version ≥ 1.
//! 3. Only a higher version advances the view; one multi-table `UPDATE` moves the view and sets
//!    the inbox row's `applied` flag together. An older version leaves the inbox row at
//!    `applied = 0`. The same version with another event id is a conflict: roll back.
//! 4. The caller's writes run, then `COMMIT`. Only a COMMIT answered with OK returns `Ok`.
//!    COMMIT answered with an error packet is a definite failure; COMMIT with no answer (the
//!    connection broke, or the time budget ran out) is [`ApplyError::CommitUnconfirmed`].
//!
//! Deadlocks (1213) are expected when several appliers queue behind one that rolls back; they
//! and lock wait timeouts (1205) are retryable storage errors, never a duplicate or a conflict.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql, MySqlConnection, MySqlPool, Row};

use crate::canonical::Digest;
use crate::dsn::Dsn;
use crate::error::{mysql_number, ER_DUP_ENTRY};
pub use crate::error::{ApplyError, Conflict, StorageError, StorageKind, WriteError};
use crate::event::{Rejection, TaskEvent};
use crate::identity::{ConsumerName, EventId, QueueId, TaskId};

/// One apply, from taking a connection to the answer to COMMIT, takes at most this long.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// First statement of every apply: the dedup claim.
pub const INSERT_INBOX: &str = "INSERT INTO receiver_inbox \
     (consumer_name, queue_id, event_id, event_digest, event_canonical, applied, received_at) \
     VALUES (?, ?, ?, ?, ?, 0, UTC_TIMESTAMP(6))";

/// Locks the task's view row, if it exists, and reads what the decision needs.
pub const LOCK_VIEW: &str = "SELECT task_version, last_event_id FROM receiver_task_views \
     WHERE consumer_name = ? AND queue_id = ? AND task_id = ? FOR UPDATE";

/// Creates the task's view row with placeholder version 0 (never visible after the
/// transaction ends: it is advanced or rolled back).
pub const CREATE_VIEW: &str = "INSERT INTO receiver_task_views \
     (consumer_name, queue_id, task_id, task_version, last_event_id, last_state, last_result, \
      applied_events, created_at, updated_at) \
     VALUES (?, ?, ?, 0, '', '', NULL, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))";

/// Advances the view and marks the inbox row as the one that advanced it, in one statement.
pub const ADVANCE: &str = "UPDATE receiver_task_views v \
     JOIN receiver_inbox i \
       ON i.consumer_name = v.consumer_name AND i.queue_id = v.queue_id AND i.event_id = ? \
     SET v.task_version = ?, v.last_event_id = ?, v.last_state = ?, v.last_result = ?, \
         v.applied_events = v.applied_events + 1, v.updated_at = UTC_TIMESTAMP(6), \
         i.applied = 1 \
     WHERE v.consumer_name = ? AND v.queue_id = ? AND v.task_id = ?";

/// Reads the committed inbox record's digest and flag after a duplicate key (READ COMMITTED
/// sees it: the 1062 is only raised once the competitor has committed). Not the frozen event:
/// a duplicate should not cost a transfer of up to 512 KiB.
pub const READ_VERDICT: &str = "SELECT event_digest, applied FROM receiver_inbox \
     WHERE consumer_name = ? AND queue_id = ? AND event_id = ?";

/// Reads a whole inbox record (not part of apply).
pub const READ_INBOX: &str = "SELECT event_digest, applied, event_canonical FROM receiver_inbox \
     WHERE consumer_name = ? AND queue_id = ? AND event_id = ?";

/// Reads a task's view (not part of apply).
pub const READ_VIEW: &str = "SELECT task_version, last_event_id, last_state, last_result, \
     applied_events, created_at, updated_at FROM receiver_task_views \
     WHERE consumer_name = ? AND queue_id = ? AND task_id = ?";

/// What an apply did. Every variant is a success: the event is safely recorded and may be
/// ACKed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// First receipt, and it advanced the view.
    Applied,
    /// First receipt of an older version: recorded with `applied = false`, view untouched.
    Stale,
    /// Already recorded with the same content. `applied` is what the ORIGINAL transaction did;
    /// nothing ran again.
    Duplicate { applied: bool },
}

impl Outcome {
    /// The stable lowercase name: `applied`, `stale` or `duplicate`.
    pub fn kind(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Stale => "stale",
            Outcome::Duplicate { .. } => "duplicate",
        }
    }
}

/// What a caller's write is told about the event being applied.
#[derive(Debug, Clone, Copy)]
pub struct Receipt<'a> {
    /// The event, validated.
    pub event: &'a TaskEvent,
    /// `Applied` (the view advanced) or `Stale` (an older version, view untouched).
    pub outcome: Outcome,
}

/// The future a [`BusinessWrite`] returns.
pub type WriteFuture<'a> = Pin<Box<dyn Future<Output = Result<(), WriteError>> + Send + 'a>>;

/// A caller's own writes, run inside the apply's transaction after the view update and before
/// COMMIT, on the first receipt of an event only (never for a duplicate). An error rolls back
/// everything: no inbox row and no view change remain, and the event can be delivered again.
///
/// The connection is mid-transaction: do not COMMIT, ROLLBACK or change the isolation level,
/// and do not call anything outside the database while holding its locks.
pub trait BusinessWrite: Sync {
    /// Runs the writes.
    fn write<'a>(&'a self, conn: &'a mut MySqlConnection, receipt: Receipt<'a>) -> WriteFuture<'a>;
}

/// No writes beyond the built-in view.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoWrite;

impl BusinessWrite for NoWrite {
    fn write<'a>(&'a self, _: &'a mut MySqlConnection, _: Receipt<'a>) -> WriteFuture<'a> {
        Box::pin(async { Ok(()) })
    }
}

/// How to open a [`Store`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Pool size; at least the consumer's concurrency.
    pub max_connections: u32,
    /// The time budget of one apply.
    pub apply_timeout: Duration,
    /// Test builds only: awaited at [`crate::hooks::POINTS`].
    #[cfg(feature = "fault-hooks")]
    pub barrier: Option<crate::hooks::BarrierHook>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 8,
            apply_timeout: APPLY_TIMEOUT,
            #[cfg(feature = "fault-hooks")]
            barrier: None,
        }
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
    pool: MySqlPool,
    consumer: ConsumerName,
    queue: QueueId,
    apply_timeout: Duration,
    #[cfg(feature = "fault-hooks")]
    barrier: Option<crate::hooks::BarrierHook>,
}

/// Names only: the pool's connection options hold the password.
impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("consumer", &self.consumer)
            .field("queue", &self.queue)
            .field("apply_timeout", &self.apply_timeout)
            .finish_non_exhaustive()
    }
}

/// Connection options every store connection gets: UTC session time zone, READ COMMITTED.
pub fn connect_options(dsn: &Dsn) -> Result<MySqlConnectOptions, StorageError> {
    let options = MySqlConnectOptions::from_str(dsn.expose_url())
        .map_err(|_| StorageError::unexpected("the DSN is not a valid MySQL URL"))?;
    Ok(options.timezone(Some("+00:00".to_owned())))
}

/// Makes a connection a store connection: READ COMMITTED for every later transaction.
async fn prepare_session(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await?;
    Ok(())
}

impl Store {
    /// Opens a pool on `dsn` for `consumer` and `queue`, and checks that the schema is there.
    pub async fn connect(
        dsn: &Dsn,
        consumer: ConsumerName,
        queue: QueueId,
        options: StoreOptions,
    ) -> Result<Store, StorageError> {
        let pool = MySqlPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.apply_timeout)
            .after_connect(|conn, _| Box::pin(prepare_session(conn)))
            .connect_with(connect_options(dsn)?)
            .await
            .map_err(|e| StorageError::from_sqlx(&e))?;
        let store = Store {
            pool,
            consumer,
            queue,
            apply_timeout: options.apply_timeout,
            #[cfg(feature = "fault-hooks")]
            barrier: options.barrier,
        };
        // Fail at start, not at the first event, when `init` was never run.
        sqlx::query("SELECT 1 FROM receiver_inbox JOIN receiver_task_views LIMIT 0")
            .execute(&store.pool)
            .await
            .map_err(|e| StorageError::from_sqlx(&e))?;
        Ok(store)
    }

    /// The consumer name this store records under.
    pub fn consumer(&self) -> &ConsumerName {
        &self.consumer
    }

    /// The queue this store accepts events from.
    pub fn queue(&self) -> &QueueId {
        &self.queue
    }

    /// Closes the pool, waiting for connections in use to come back.
    pub async fn close(&self) {
        self.pool.close().await;
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
        if event.queue() != &self.queue {
            return Err(ApplyError::Rejected(Rejection::QueueMismatch));
        }
        let commit_sent = AtomicBool::new(false);
        match tokio::time::timeout(
            self.apply_timeout,
            self.apply_once(event, write, &commit_sent),
        )
        .await
        {
            Ok(result) => result,
            // The future, and with it the connection, was dropped: the guard closed the
            // connection, so the server rolls back whatever it had not committed.
            Err(_) if commit_sent.load(Ordering::SeqCst) => Err(ApplyError::CommitUnconfirmed),
            Err(_) => Err(ApplyError::Timeout(self.apply_timeout)),
        }
    }

    async fn apply_once(
        &self,
        event: &TaskEvent,
        write: &dyn BusinessWrite,
        commit_sent: &AtomicBool,
    ) -> Result<Outcome, ApplyError> {
        let mut conn = TxConn::acquire(&self.pool).await?;
        let attempt = self
            .transaction(conn.get(), event, write, commit_sent)
            .await;
        match attempt {
            Ok(Step::Committed(outcome)) => {
                conn.release();
                Ok(outcome)
            }
            Ok(Step::AlreadyRecorded) => {
                conn.get().execute("ROLLBACK").await?;
                let resolved = self.resolve_duplicate(conn.get(), event).await;
                if !matches!(resolved, Err(ApplyError::Storage(_))) {
                    conn.release();
                }
                resolved
            }
            Err(e) => {
                // Before COMMIT, a clean ROLLBACK keeps the connection; after COMMIT was sent,
                // or if ROLLBACK fails, the connection is closed (the guard's drop).
                if !commit_sent.load(Ordering::SeqCst)
                    && conn.get().execute("ROLLBACK").await.is_ok()
                {
                    conn.release();
                }
                Err(e)
            }
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

        conn.execute("BEGIN").await?;
        #[cfg(feature = "fault-hooks")]
        self.barrier("before_insert", event).await;
        let inserted = sqlx::query(INSERT_INBOX)
            .bind(consumer)
            .bind(queue)
            .bind(event.id().as_str().as_bytes())
            .bind(&event.digest().0[..])
            .bind(event.canonical())
            .execute(&mut *conn)
            .await;
        match inserted {
            Ok(_) => {}
            // The inbox has one unique key, so a 1062 here is always the dedup identity.
            Err(e) if mysql_number(&e) == Some(ER_DUP_ENTRY) => return Ok(Step::AlreadyRecorded),
            Err(e) => return Err(e.into()),
        }

        let (current_version, current_event) = match self.lock_view(conn, task).await? {
            Some(found) => found,
            None => {
                let created = sqlx::query(CREATE_VIEW)
                    .bind(consumer)
                    .bind(queue)
                    .bind(task)
                    .execute(&mut *conn)
                    .await;
                match created {
                    Ok(_) => (0, Vec::new()),
                    // Another transaction created it first and has committed: lock that row.
                    Err(e) if mysql_number(&e) == Some(ER_DUP_ENTRY) => self
                        .lock_view(conn, task)
                        .await?
                        .ok_or(StorageError::unexpected(
                            "view row vanished after a duplicate key",
                        ))
                        .map_err(ApplyError::Storage)?,
                    Err(e) => return Err(e.into()),
                }
            }
        };

        let outcome = if event.version() > current_version {
            let changed = sqlx::query(ADVANCE)
                .bind(event.id().as_str().as_bytes())
                .bind(event.version())
                .bind(event.id().as_str().as_bytes())
                .bind(event.state().as_str().as_bytes())
                .bind(event.result())
                .bind(consumer)
                .bind(queue)
                .bind(task)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if changed != 2 {
                return Err(ApplyError::Storage(StorageError::unexpected(
                    "the view update did not change exactly the view row and the inbox row",
                )));
            }
            Outcome::Applied
        } else if event.version() == current_version
            && current_event != event.id().as_str().as_bytes()
        {
            return Err(ApplyError::Conflict(Conflict::SameVersionOtherEvent {
                version: current_version,
                recorded_event: String::from_utf8_lossy(&current_event).into_owned(),
            }));
        } else {
            // Older, or the same version and event id whose inbox row is no longer there
            // (the receiver never deletes one, but an operator might): history only.
            Outcome::Stale
        };

        write
            .write(&mut *conn, Receipt { event, outcome })
            .await
            .map_err(ApplyError::Write)?;

        #[cfg(feature = "fault-hooks")]
        self.barrier("before_commit", event).await;
        commit_sent.store(true, Ordering::SeqCst);
        match conn.execute("COMMIT").await {
            Ok(_) => Ok(Step::Committed(outcome)),
            // The server answered COMMIT with an error: a definite failure, nothing committed.
            Err(e @ sqlx::Error::Database(_)) => Err(e.into()),
            // No answer: the outcome is unknown.
            Err(_) => Err(ApplyError::CommitUnconfirmed),
        }
    }

    #[cfg(feature = "fault-hooks")]
    async fn barrier(&self, point: &'static str, event: &TaskEvent) {
        if let Some(hook) = &self.barrier {
            (hook.0)(point, event.id().to_string()).await;
        }
    }

    async fn lock_view(
        &self,
        conn: &mut MySqlConnection,
        task: &[u8],
    ) -> Result<Option<(u64, Vec<u8>)>, ApplyError> {
        let row = sqlx::query(LOCK_VIEW)
            .bind(self.consumer.as_str().as_bytes())
            .bind(self.queue.as_str().as_bytes())
            .bind(task)
            .fetch_optional(&mut *conn)
            .await?;
        match row {
            None => Ok(None),
            Some(row) => Ok(Some((row.try_get(0)?, row.try_get(1)?))),
        }
    }

    /// After a duplicate key: compare the committed record's digest with this event's.
    async fn resolve_duplicate(
        &self,
        conn: &mut MySqlConnection,
        event: &TaskEvent,
    ) -> Result<Outcome, ApplyError> {
        let row = self
            .identity_query(READ_VERDICT, event.id())
            .fetch_optional(&mut *conn)
            .await?
            .ok_or(ApplyError::Storage(StorageError::unexpected(
                "inbox row vanished after a duplicate key",
            )))?;
        let stored = digest_column(&row, 0)?;
        if stored == event.digest() {
            Ok(Outcome::Duplicate {
                applied: row.try_get(1)?,
            })
        } else {
            Err(ApplyError::Conflict(Conflict::DigestMismatch {
                stored,
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

    /// The committed inbox record of `event`, if any.
    pub async fn inbox_record(&self, event: &EventId) -> Result<Option<InboxRecord>, StorageError> {
        let decode = |e: sqlx::Error| StorageError::from_sqlx(&e);
        let Some(row) = self
            .identity_query(READ_INBOX, event)
            .fetch_optional(&self.pool)
            .await
            .map_err(decode)?
        else {
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

    /// The committed view of `task`, if any.
    pub async fn view(&self, task: &TaskId) -> Result<Option<TaskView>, StorageError> {
        let decode = |e: sqlx::Error| StorageError::from_sqlx(&e);
        let row = sqlx::query(READ_VIEW)
            .bind(self.consumer.as_str().as_bytes())
            .bind(self.queue.as_str().as_bytes())
            .bind(task.as_str().as_bytes())
            .fetch_optional(&self.pool)
            .await
            .map_err(decode)?;
        let Some(row) = row else { return Ok(None) };
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

/// Where one transaction attempt ended, short of an error.
enum Step {
    Committed(Outcome),
    /// The inbox INSERT hit the dedup key: the event is already committed.
    AlreadyRecorded,
}

/// A pooled connection that is closed, not returned to the pool, unless [`TxConn::release`]
/// says it is clean. A connection whose transaction state is unknown (an error mid-statement,
/// a timeout that dropped the future, COMMIT without an answer) must never serve another apply.
struct TxConn {
    conn: Option<PoolConnection<MySql>>,
    clean: bool,
}

impl TxConn {
    async fn acquire(pool: &MySqlPool) -> Result<Self, ApplyError> {
        let conn = pool.acquire().await?;
        Ok(TxConn {
            conn: Some(conn),
            clean: false,
        })
    }

    fn get(&mut self) -> &mut MySqlConnection {
        self.conn.as_mut().expect("connection present until drop")
    }

    fn release(&mut self) {
        self.clean = true;
    }
}

impl Drop for TxConn {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if !self.clean {
                // Detached from the pool and dropped: the socket closes and the server rolls
                // back anything uncommitted.
                drop(conn.detach());
            }
        }
    }
}

/// A `BINARY(32)` digest column.
fn digest_column(row: &sqlx::mysql::MySqlRow, index: usize) -> Result<Digest, ApplyError> {
    let bytes: Vec<u8> = row.try_get(index)?;
    let bytes: [u8; 32] = bytes.try_into().map_err(|_| {
        ApplyError::Storage(StorageError::unexpected("a stored digest is not 32 bytes"))
    })?;
    Ok(Digest(bytes))
}
