//! Removing inbox rows older than a window: the statements of `receiver prune`.
//!
//! The inbox row is what makes a redelivery a duplicate; once it is gone, a redelivery is
//! told apart by the view alone (the same version and event id, or an older version, is
//! stale: recorded again with `applied = 0`, never applied twice; see [`crate::store`]). What
//! is lost is the digest check: an event with a pruned id and other content can no longer be
//! told from its original. So the window must cover every way the platform can deliver an
//! event again (`docs/capacity.md`).
//!
//! How rows leave, so that no apply waits on it for long and replicas see the same thing:
//! - the rows come from the index `receiver_inbox_received_at`, oldest first, after a cursor
//!   (the last row of the previous batch), so a batch never walks the young rows nor the
//!   deleted ones that purge has not removed yet;
//! - each batch is one `DELETE` of explicit keys, in primary-key order, each row's age checked
//!   again, committed on its own (autocommit). No `DELETE … LIMIT` (its rows are not
//!   deterministic under statement-based binary logs); a second prune at the same time meets
//!   the same keys in the same order, so it waits or finds them gone, and never deadlocks on
//!   them;
//! - the window's edge is fixed once, at the start, from the server's clock (the one that
//!   wrote `received_at`);
//! - the views are never touched; the prune account holds no privilege on them.

use std::fmt;

use sqlx::{Connection, Executor, MySqlConnection, Row};

use crate::connect::connect_one;
use crate::dsn::Dsn;
use crate::error::StorageError;
use crate::error::StorageKind;
use crate::identity::{ConsumerName, QueueId};
use crate::schema::{INDEX_EXISTS, RECEIVED_AT_INDEX};

pub use crate::version::ADD_RECEIVED_AT_INDEX;

/// The largest batch `receiver prune` accepts: a batch is one transaction holding a lock on
/// each of its rows until it commits.
pub const MAX_BATCH_ROWS: u32 = 10_000;

/// How long one batch may wait for a row lock (an apply's redelivery of an old event holds
/// one for a moment) before it is tried again.
pub const LOCK_WAIT_SECONDS: u32 = 2;

/// `DATE_FORMAT`'s pattern for every time a prune reads and binds back: microseconds, UTC.
macro_rules! ts {
    () => {
        "'%Y-%m-%d %H:%i:%s.%f'"
    };
}

/// The window's edge, on the server's clock, as text.
const CUTOFF: &str = concat!(
    "SELECT CAST(DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL ? SECOND, ",
    ts!(),
    ") AS CHAR)"
);

/// What a dry run reports: the rows older than the window.
const SURVEY: &str = concat!(
    "SELECT COUNT(*), CAST(COALESCE(SUM(LENGTH(event_canonical)), 0) AS SIGNED), ",
    "CAST(DATE_FORMAT(MIN(received_at), ",
    ts!(),
    ") AS CHAR), CAST(DATE_FORMAT(MAX(received_at), ",
    ts!(),
    ") AS CHAR) FROM receiver_inbox FORCE INDEX (receiver_inbox_received_at) ",
    "WHERE consumer_name = ? AND queue_id = ? AND received_at < CAST(? AS DATETIME(6))"
);

/// The next batch's keys, oldest first, after the cursor (a consistent read: no lock).
const NEXT_KEYS: &str = concat!(
    "SELECT event_id, CAST(DATE_FORMAT(received_at, ",
    ts!(),
    ") AS CHAR), LENGTH(event_canonical) ",
    "FROM receiver_inbox FORCE INDEX (receiver_inbox_received_at) ",
    "WHERE consumer_name = ? AND queue_id = ? AND received_at < CAST(? AS DATETIME(6)) ",
    "AND (received_at > CAST(? AS DATETIME(6)) ",
    "OR (received_at = CAST(? AS DATETIME(6)) AND event_id > ?)) ",
    "ORDER BY received_at, event_id LIMIT ?"
);

/// The oldest row left of this consumer and queue (the index answers it at once).
const OLDEST: &str = concat!(
    "SELECT CAST(DATE_FORMAT(MIN(received_at), ",
    ts!(),
    ") AS CHAR) FROM receiver_inbox WHERE consumer_name = ? AND queue_id = ?"
);

/// Why a prune stopped short.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    #[error("the account lacks {0} on receiver_inbox: prune runs as an account with SELECT and DELETE on receiver_inbox only (schema/grants.sql, step 3)")]
    MissingGrant(&'static str),
    #[error("receiver_inbox has no index {RECEIVED_AT_INDEX}, so every batch would scan the whole table: run `receiver migrate` as the init account, which adds it online (ALGORITHM=INPLACE, LOCK=NONE; docs/upgrading.md)")]
    NoIndex,
    /// The schema's version does not fit this build (`crate::version`).
    #[error("{0}")]
    Schema(StorageError),
    #[error("{step}: {error}")]
    Storage {
        step: &'static str,
        error: StorageError,
    },
}

impl PruneError {
    /// A failed statement of `step`; `grant` is the privilege it needs.
    fn of(step: &'static str, grant: &'static str, e: &sqlx::Error) -> PruneError {
        let error = StorageError::from_sqlx(e);
        if error.kind() == StorageKind::PermissionDenied {
            PruneError::MissingGrant(grant)
        } else {
            PruneError::Storage { step, error }
        }
    }

    /// Whether trying the same batch again may succeed: a lock it waited for too long, or a
    /// deadlock.
    pub fn is_lock_conflict(&self) -> bool {
        matches!(self, PruneError::Storage { error, .. }
            if matches!(error.kind(), StorageKind::Deadlock | StorageKind::LockWaitTimeout))
    }
}

/// What a dry run found older than the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Survey {
    pub rows: u64,
    /// The frozen events' bytes.
    pub bytes: u64,
    pub oldest: Option<String>,
    pub newest: Option<String>,
}

/// What one batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Batch {
    /// Rows the batch found older than the window; 0: nothing is left to delete.
    pub found: u64,
    /// Rows it deleted (fewer than found when another prune took some first).
    pub deleted: u64,
    /// The frozen events' bytes of the rows it deleted (of those found, in proportion when
    /// another prune took some).
    pub bytes: u64,
}

/// One prune run: a connection, the window's edge and the cursor.
pub struct Pruner {
    conn: MySqlConnection,
    consumer: ConsumerName,
    queue: QueueId,
    cutoff: String,
    /// How the schema fits this build (an older one is pruned, with a warning).
    schema: crate::version::Fit,
    /// The last row handled: its `received_at` and event id.
    cursor: (String, Vec<u8>),
}

impl fmt::Debug for Pruner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pruner")
            .field("consumer", &self.consumer)
            .field("queue", &self.queue)
            .field("cutoff", &self.cutoff)
            .finish_non_exhaustive()
    }
}

impl Pruner {
    /// How the schema fits this build: the caller warns about an older one.
    pub fn schema(&self) -> crate::version::Fit {
        self.schema
    }

    /// Connects, checks that the index is there and fixes the window's edge: rows received
    /// more than `window_seconds` before now, by the server's clock.
    pub async fn connect(
        dsn: &Dsn,
        consumer: ConsumerName,
        queue: QueueId,
        window_seconds: u64,
    ) -> Result<Pruner, PruneError> {
        let connect = |e: sqlx::Error| PruneError::Storage {
            step: "cannot connect to the receiver database",
            error: StorageError::from_sqlx(&e).for_dsn(dsn),
        };
        let mut conn = connect_one(dsn)
            .await
            .map_err(|error| PruneError::Storage {
                step: "cannot connect to the receiver database",
                error,
            })?;
        for set in [
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_owned(),
            format!("SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_SECONDS}"),
        ] {
            conn.execute(set.as_str()).await.map_err(connect)?;
        }
        let indexed: i64 = sqlx::query_scalar(INDEX_EXISTS)
            .bind(RECEIVED_AT_INDEX)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| PruneError::of("reading the inbox's indexes", "SELECT", &e))?;
        if indexed == 0 {
            // information_schema shows a table's indexes only to an account with some
            // privilege on it: no row may also mean no grant at all.
            let visible = sqlx::query("SELECT 1 FROM receiver_inbox LIMIT 0")
                .execute(&mut conn)
                .await;
            return Err(match visible {
                Err(e) => PruneError::of("reading receiver_inbox", "SELECT", &e),
                Ok(_) => PruneError::NoIndex,
            });
        }
        let schema =
            crate::migrate::check(&mut conn)
                .await
                .map_err(|error| match error.kind() {
                    StorageKind::Schema(_) => PruneError::Schema(error),
                    _ => PruneError::Storage {
                        step: "reading the schema's version",
                        error,
                    },
                })?;
        let cutoff: String = sqlx::query_scalar(CUTOFF)
            .bind(window_seconds)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| PruneError::of("reading the server's clock", "SELECT", &e))?;
        Ok(Pruner {
            conn,
            consumer,
            queue,
            cutoff,
            schema,
            cursor: ("1000-01-01 00:00:00.000000".to_owned(), Vec::new()),
        })
    }

    /// The window's edge: rows received before it (UTC, microseconds) are pruned.
    pub fn cutoff(&self) -> &str {
        &self.cutoff
    }

    /// The `received_at` of the last row a batch handled (UTC), before any batch `None`.
    pub fn position(&self) -> Option<&str> {
        (!self.cursor.1.is_empty()).then_some(self.cursor.0.as_str())
    }

    /// What lies older than the window, without deleting anything.
    pub async fn survey(&mut self) -> Result<Survey, PruneError> {
        let row = sqlx::query(SURVEY)
            .bind(self.consumer.as_str().as_bytes())
            .bind(self.queue.as_str().as_bytes())
            .bind(&self.cutoff)
            .fetch_one(&mut self.conn)
            .await
            .map_err(|e| PruneError::of("surveying the inbox", "SELECT", &e))?;
        let read = |e: sqlx::Error| PruneError::of("surveying the inbox", "SELECT", &e);
        let rows: i64 = row.try_get(0).map_err(read)?;
        let bytes: i64 = row.try_get(1).map_err(read)?;
        Ok(Survey {
            rows: rows.unsigned_abs(),
            bytes: bytes.unsigned_abs(),
            oldest: row.try_get(2).map_err(read)?,
            newest: row.try_get(3).map_err(read)?,
        })
    }

    /// Deletes up to `rows` of the oldest rows past the cursor, in one transaction; moves the
    /// cursor past them. A batch that failed may be tried again: its rows are still there.
    pub async fn batch(&mut self, rows: u32) -> Result<Batch, PruneError> {
        let found = sqlx::query(NEXT_KEYS)
            .bind(self.consumer.as_str().as_bytes())
            .bind(self.queue.as_str().as_bytes())
            .bind(&self.cutoff)
            .bind(&self.cursor.0)
            .bind(&self.cursor.0)
            .bind(&self.cursor.1)
            .bind(rows)
            .fetch_all(&mut self.conn)
            .await
            .map_err(|e| PruneError::of("finding old rows", "SELECT", &e))?;
        let read = |e: sqlx::Error| PruneError::of("finding old rows", "SELECT", &e);
        let mut keys: Vec<Vec<u8>> = Vec::with_capacity(found.len());
        let mut bytes = 0u64;
        let mut last = None;
        for row in &found {
            keys.push(row.try_get(0).map_err(read)?);
            let length: Option<i64> = row.try_get(2).map_err(read)?;
            bytes += length.unwrap_or(0).unsigned_abs();
            last = Some(row.try_get::<String, _>(1).map_err(read)?);
        }
        let (Some(last_at), Some(last_key)) = (last, keys.last().cloned()) else {
            return Ok(Batch::default());
        };
        // Primary-key order: two prunes lock the same rows in the same order.
        keys.sort_unstable();
        let marks = vec!["?"; keys.len()].join(", ");
        let sql = format!(
            "DELETE FROM receiver_inbox WHERE consumer_name = ? AND queue_id = ? \
             AND received_at < CAST(? AS DATETIME(6)) AND event_id IN ({marks})"
        );
        let mut delete = sqlx::query(&sql)
            .bind(self.consumer.as_str().as_bytes())
            .bind(self.queue.as_str().as_bytes())
            .bind(&self.cutoff);
        for k in &keys {
            delete = delete.bind(k.as_slice());
        }
        let deleted = delete
            .execute(&mut self.conn)
            .await
            .map_err(|e| PruneError::of("deleting a batch", "DELETE", &e))?
            .rows_affected();
        self.cursor = (last_at, last_key);
        let found = keys.len() as u64;
        Ok(Batch {
            found,
            deleted,
            bytes: if deleted == found {
                bytes
            } else {
                bytes * deleted / found.max(1)
            },
        })
    }

    /// The `received_at` of the oldest row left of this consumer and queue, if any.
    pub async fn oldest_left(&mut self) -> Result<Option<String>, PruneError> {
        sqlx::query_scalar(OLDEST)
            .bind(self.consumer.as_str().as_bytes())
            .bind(self.queue.as_str().as_bytes())
            .fetch_one(&mut self.conn)
            .await
            .map_err(|e| PruneError::of("reading the oldest row left", "SELECT", &e))
    }

    /// Closes the connection.
    pub async fn close(self) {
        let _ = self.conn.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_time_is_read_and_bound_in_one_text_form() {
        for sql in [CUTOFF, SURVEY, NEXT_KEYS, OLDEST] {
            assert!(sql.contains(ts!()), "{sql}");
        }
        // The window's edge and the cursor are compared as DATETIME(6), never as text.
        assert_eq!(NEXT_KEYS.matches("CAST(? AS DATETIME(6))").count(), 3);
        assert!(SURVEY.contains("received_at < CAST(? AS DATETIME(6))"));
    }

    #[test]
    fn the_index_statement_names_the_schema_s_index() {
        let schema = include_str!("../../../schema/schema.sql");
        let columns = "(consumer_name, queue_id, received_at)";
        assert!(schema.contains(&format!("KEY {RECEIVED_AT_INDEX} {columns}")));
        assert!(ADD_RECEIVED_AT_INDEX.contains(&format!("{RECEIVED_AT_INDEX} {columns}")));
    }
}
