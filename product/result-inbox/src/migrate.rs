//! `receiver migrate`: moves a receiver database from its recorded schema version to this
//! build's, one DDL statement per step.
//!
//! MySQL and MariaDB commit every DDL statement on its own, so a step of two statements could
//! stop half done. Each step is therefore one statement, and the ledger
//! (`receiver_schema_versions`) records it as `started` before the statement and as `applied`
//! after it. What decides whether a step is done is the table's real shape (an index, a column
//! that exists), read from `information_schema`; the ledger names the step a killed run left
//! behind. So a run cut short at any point (SIGKILL, a lost connection, a restarted server) is
//! finished by the next: a step whose statement completed is recorded, one whose statement
//! never completed runs again.
//!
//! Two runs at once: the lock is one row of `receiver_schema_lock`, taken by compare-and-set
//! (`UPDATE … WHERE holder IS NULL OR renewed_at < now - lease`) and renewed while held. It is
//! an ordinary write, so it holds on Galera, where `GET_LOCK()` is not replicated: two nodes'
//! concurrent takes certify one and abort the other. A run that was killed stops renewing, and
//! after [`LOCK_LEASE`] the next takes the lock over.
//!
//! Every step states the algorithm and lock the server must use (`ALGORITHM=INPLACE,
//! LOCK=NONE` for an online index build). The server is held to it: if it cannot, the
//! statement fails and changes nothing. A step that would copy the table or block writes runs
//! only when asked (`allow_blocking`).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, Executor, MySqlConnection, Row};

use crate::connect::connect_one;
use crate::dsn::Dsn;
use crate::error::{StorageError, StorageKind};
use crate::ledger::{self, record_step, BASELINE};
use crate::schema::TABLES;
use crate::version::{self, Fit, Found, Mismatch, APPLIED, RECOGNISED, SCHEMA_VERSION, STARTED};
pub use crate::version::{Algorithm, Shape, Step, ADD_RECEIVED_AT_INDEX, STEPS};

const LEDGER_ROWS: &str = "SELECT version, state FROM receiver_schema_versions ORDER BY version";

/// A lock not renewed for this long belongs to a run that is gone: the next run takes it over.
pub const LOCK_LEASE: Duration = Duration::from_secs(15);
/// How often the holder renews the lock.
const RENEW_EVERY: Duration = Duration::from_secs(3);
/// How often a waiting run says what it waits for.
const SAY_EVERY: Duration = Duration::from_secs(5);
/// How often a long statement's run says it is still running.
const STILL_RUNNING_EVERY: Duration = Duration::from_secs(10);

/// Every step this build knows: the product's, and in a test build those it installed.
pub fn steps() -> Vec<Step> {
    let mut all = STEPS.to_vec();
    all.extend_from_slice(crate::seam::extra_steps());
    all.sort_by_key(|s| s.version);
    all
}

/// The newest version this build knows.
pub fn known_version() -> u32 {
    steps()
        .iter()
        .map(|s| s.version)
        .max()
        .unwrap_or(1)
        .max(SCHEMA_VERSION)
}

/// Whether `shape` is there.
async fn has_shape(conn: &mut MySqlConnection, shape: Shape) -> Result<bool, StorageError> {
    let count: i64 = match shape {
        Shape::Index { table, index } => {
            sqlx::query(
                "SELECT COUNT(*) FROM information_schema.statistics \
                 WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?",
            )
            .bind(table)
            .bind(index)
            .fetch_one(&mut *conn)
            .await
        }
        Shape::Column { table, column } => {
            // information_schema.columns lists only columns the account holds a privilege on,
            // and the init account holds none on columns (ALTER is a table's privilege);
            // SHOW CREATE TABLE asks for any privilege on the table.
            let row = sqlx::query(&format!("SHOW CREATE TABLE {table}"))
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| StorageError::from_sqlx(&e))?;
            let ddl = version::text(&row, 1);
            let named = format!("`{column}` ");
            return Ok(ddl.lines().any(|l| l.trim_start().starts_with(&named)));
        }
    }
    .and_then(|row| row.try_get(0))
    .map_err(|e| StorageError::from_sqlx(&e))?;
    Ok(count > 0)
}

/// The version the tables' shape shows: 1, then each step in order whose result is there.
pub async fn shape_version(conn: &mut MySqlConnection) -> Result<u32, StorageError> {
    let mut version = 1;
    for step in steps() {
        if !has_shape(conn, step.shape).await? {
            break;
        }
        version = step.version;
    }
    Ok(version)
}

/// Reads the version of the schema behind `conn`: the ledger's, or, with no ledger, the one
/// its shape shows. An account that may not read the ledger gets [`Mismatch::Hidden`] as a
/// [`StorageKind::Schema`] error.
pub async fn read(conn: &mut MySqlConnection) -> Result<Found, StorageError> {
    match sqlx::query(LEDGER_ROWS).fetch_all(&mut *conn).await {
        Ok(rows) => {
            let mut found = Found {
                version: 0,
                recorded: true,
                unfinished: None,
                highest_named: 0,
            };
            for row in rows {
                let version: u32 = row.try_get(0).map_err(|e| StorageError::from_sqlx(&e))?;
                let state = version::text(&row, 1);
                found.highest_named = found.highest_named.max(version);
                if state == STARTED {
                    found.unfinished.get_or_insert(version);
                } else if found.unfinished.is_none() {
                    found.version = found.version.max(version);
                }
            }
            if found.version == 0 {
                // A ledger made and nothing in it yet (a first migrate cut short): the shape
                // says what the tables are.
                found.version = shape_version(conn).await?;
                found.recorded = false;
            }
            Ok(found)
        }
        Err(e) => {
            let error = StorageError::from_sqlx(&e);
            match error.number() {
                Some(1146) => Ok(Found {
                    version: shape_version(conn).await?,
                    recorded: false,
                    unfinished: None,
                    highest_named: 0,
                }),
                Some(1142) => Err(error.with_kind(StorageKind::Schema(Mismatch::Hidden))),
                _ => Err(error),
            }
        }
    }
}

/// Reads the schema's version and decides whether this build may run on it: what every program
/// does at start, before it takes a delivery or touches a row.
pub async fn check(conn: &mut MySqlConnection) -> Result<Fit, StorageError> {
    let found = read(conn).await?;
    version::fit(&found, known_version(), version::OLDEST_RUNNABLE)
        .map_err(|m| StorageError::of_kind(StorageKind::Schema(m)))
}

/// What `migrate` is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Print the plan and change nothing.
    pub dry_run: bool,
    /// Run steps that copy a table or block its writes.
    pub allow_blocking: bool,
    /// How long to wait for another run's lock before giving up.
    pub lock_wait: Duration,
    /// Who runs it, as the ledger and the lock record it (program, version, host, pid).
    pub by: String,
    /// The database's name, for the lines that name a grant.
    pub database: String,
}

/// Where `migrate` says what it does: results on one side, waits on the other.
pub trait Say {
    /// A line of the plan or the result (standard output).
    fn line(&mut self, line: String);
    /// What it waits for (standard error).
    fn waiting(&mut self, line: String);
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub from: u32,
    pub to: u32,
    pub dry_run: bool,
    /// Steps a dry run found to run.
    pub planned: u32,
    /// Steps whose statement ran.
    pub applied: u32,
    /// Steps found done by the table's shape and only recorded.
    pub recorded: u32,
    pub seconds: f64,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dry_run {
            write!(
                f,
                "dry run: {} step(s) to reach version {}; nothing was changed",
                self.planned, self.to
            )
        } else if self.applied == 0 && self.recorded == 0 && self.from == self.to {
            write!(
                f,
                "schema_version={}: already at the target; nothing to do",
                self.to
            )
        } else {
            write!(
                f,
                "migrated from={} to={} applied={} recorded={} seconds={:.2}",
                self.from, self.to, self.applied, self.recorded, self.seconds
            )
        }
    }
}

/// Why a run did not reach the target. [`MigrateError::exit_code`] is what `receiver migrate`
/// exits with.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{0}")]
    Connect(StorageError),
    #[error("database `{database}` {what}: it is not a receiver inbox; `receiver init` makes one, and migrate changes nothing")]
    NotAnInbox { database: String, what: String },
    #[error("{0}")]
    Newer(version::Mismatch),
    #[error("step {version} ({name}) would block writes to {table} while it runs ({algorithm}): `{statement}`; run it in a quiet window with --allow-blocking")]
    Blocking {
        version: u32,
        name: &'static str,
        table: &'static str,
        algorithm: Algorithm,
        statement: &'static str,
    },
    #[error("the migration lock is still held by {holder} after {waited} s of waiting: that run is still renewing it; nothing was changed")]
    LockWait { holder: String, waited: u64 },
    #[error("this account may not {what} ({error}): receiver migrate runs as the init account (schema/grants.sql, step 1); nothing was changed")]
    NotInitAccount {
        what: &'static str,
        error: StorageError,
    },
    #[error("step {version} ({name}) failed: {error}; it stays recorded as started, and `receiver migrate` resumes it")]
    Step {
        version: u32,
        name: &'static str,
        error: StorageError,
    },
    #[error("the migration lock was lost (not renewed for {} s, so another run may take it): stopped after step {after}; `receiver migrate` resumes", LOCK_LEASE.as_secs())]
    LostLock { after: u32 },
    #[error("{0}")]
    Database(StorageError),
}

impl MigrateError {
    /// 1 a database failure (what was applied stays applied; a rerun resumes), 2 the account
    /// is not the init account, 3 not an inbox, 4 a newer schema, 5 a blocking step not
    /// allowed, 6 the lock stayed held.
    pub fn exit_code(&self) -> u8 {
        match self {
            MigrateError::Connect(_)
            | MigrateError::Step { .. }
            | MigrateError::LostLock { .. }
            | MigrateError::Database(_) => 1,
            MigrateError::NotInitAccount { .. } => 2,
            MigrateError::NotAnInbox { .. } => 3,
            MigrateError::Newer(_) => 4,
            MigrateError::Blocking { .. } => 5,
            MigrateError::LockWait { .. } => 6,
        }
    }
}

fn db(e: sqlx::Error) -> MigrateError {
    MigrateError::Database(StorageError::from_sqlx(&e))
}

/// The first line of every run: `schema_version=<found> target=<known>`, then what else is
/// true of the found version.
pub fn header(found: &Found, target: u32) -> String {
    let mut line = format!("schema_version={} target={}", found.version, target);
    if !found.recorded {
        line.push_str(" recorded=no (recognised by the tables' shape)");
    }
    if let Some(step) = found.unfinished {
        line.push_str(&format!(" unfinished_step={step}"));
    }
    line
}

/// How this server runs DDL under Galera, when it is a Galera node.
async fn galera_method(conn: &mut MySqlConnection) -> Result<Option<String>, MigrateError> {
    let rows =
        sqlx::query("SHOW VARIABLES WHERE Variable_name IN ('wsrep_on', 'wsrep_OSU_method')")
            .fetch_all(&mut *conn)
            .await
            .map_err(db)?;
    let mut on = false;
    let mut method = String::from("TOI");
    for row in rows {
        let name = version::text(&row, 0).to_ascii_lowercase();
        let value = version::text(&row, 1);
        match name.as_str() {
            "wsrep_on" => on = value.eq_ignore_ascii_case("ON"),
            "wsrep_osu_method" => method = value,
            _ => {}
        }
    }
    Ok(on.then_some(method))
}

/// Checks that the database holds the receiver's two tables.
async fn require_inbox(conn: &mut MySqlConnection, dsn: &Dsn) -> Result<(), MigrateError> {
    let present: Vec<String> = sqlx::query(
        "SELECT table_name FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name IN ('receiver_inbox', 'receiver_task_views') \
         ORDER BY table_name",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?
    .iter()
    .map(|r| version::text(r, 0))
    .collect();
    let missing: Vec<&str> = TABLES
        .iter()
        .copied()
        .filter(|t| !present.iter().any(|p| p == t))
        .collect();
    match missing.len() {
        0 => Ok(()),
        2 => Err(MigrateError::NotAnInbox {
            database: dsn.database().to_owned(),
            what: "holds neither receiver_inbox nor receiver_task_views (or this account may see neither)".into(),
        }),
        _ => Err(MigrateError::NotAnInbox {
            database: dsn.database().to_owned(),
            what: format!("lacks {}", missing.join(", ")),
        }),
    }
}

/// Runs `receiver migrate` on `dsn`.
pub async fn migrate(
    dsn: &Dsn,
    options: &Options,
    say: &mut (dyn Say + Send),
) -> Result<Summary, MigrateError> {
    let started = Instant::now();
    let mut conn = connect_one(dsn).await.map_err(MigrateError::Connect)?;
    require_inbox(&mut conn, dsn).await?;
    let target = known_version();
    let found = read(&mut conn).await.map_err(|e| match e.kind() {
        StorageKind::Schema(m) => MigrateError::Newer(m),
        _ => MigrateError::Database(e),
    })?;
    say.line(header(&found, target));
    if found.highest_named > target || found.version > target {
        return Err(MigrateError::Newer(version::Mismatch::Newer {
            found: found.highest_named.max(found.version),
            known: target,
        }));
    }
    let galera = galera_method(&mut conn).await?;
    let pending = pending(&mut conn, &found).await?;

    if options.dry_run {
        if !found.recorded {
            say.line(format!(
                "would create {} and {} (schema/migrations.sql) and record {} as recognised",
                version::LEDGER_TABLE,
                version::LOCK_TABLE,
                versions_up_to(found.version)
            ));
        }
        for step in &pending {
            let done = has_shape(&mut conn, step.shape)
                .await
                .map_err(MigrateError::Database)?;
            if step.version <= found.version {
                say.line(format!(
                    "step {} {}: recorded as applied, but {} lacks it (changed by hand?): it would run again",
                    step.version, step.name, step.table
                ));
            }
            say.line(plan_line(step, done, galera.as_deref()));
            say.line(format!("  {}", step.statement));
        }
        let _ = conn.close().await;
        return Ok(Summary {
            from: found.version,
            to: target,
            dry_run: true,
            planned: pending.len() as u32,
            applied: 0,
            recorded: 0,
            seconds: started.elapsed().as_secs_f64(),
        });
    }

    if !options.allow_blocking {
        if let Some(step) = pending.iter().find(|s| s.algorithm.blocks_writes()) {
            return Err(MigrateError::Blocking {
                version: step.version,
                name: step.name,
                table: step.table,
                algorithm: step.algorithm,
                statement: step.statement,
            });
        }
    }

    // The ledger and the lock, made if missing: IF NOT EXISTS, so two first runs at once
    // both succeed. The runtime and prune accounts may not create tables, which is what
    // keeps them out.
    ledger::create(&mut conn)
        .await
        .map_err(|error| written(error, "create the ledger's tables"))?;
    let mut lock = Lock::take(dsn, &mut conn, options, say).await?;
    let result = run_steps(&mut conn, &found, target, options, &lock, say).await;
    lock.release(&mut conn).await;
    let _ = conn.close().await;
    let (applied, recorded, from) = result?;
    Ok(Summary {
        from,
        to: target,
        dry_run: false,
        planned: 0,
        applied,
        recorded,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The steps to run, in order: those after the found version, and any recorded as done whose
/// result the table no longer shows (the shape wins over the ledger).
async fn pending(conn: &mut MySqlConnection, found: &Found) -> Result<Vec<Step>, MigrateError> {
    let mut pending = Vec::new();
    for step in steps() {
        if step.version > found.version
            || !has_shape(conn, step.shape)
                .await
                .map_err(MigrateError::Database)?
        {
            pending.push(step);
        }
    }
    Ok(pending)
}

/// `version 1`, or `versions 1 to N`.
fn versions_up_to(version: u32) -> String {
    match version {
        1 => "version 1".to_owned(),
        n => format!("versions 1 to {n}"),
    }
}

/// The plan's line for one step.
fn plan_line(step: &Step, done: bool, galera: Option<&str>) -> String {
    let mut line = format!(
        "step {} {} on {}: {}",
        step.version, step.name, step.table, step.algorithm
    );
    if done {
        line.push_str("; already done by the table's shape, so it would only be recorded");
    }
    match galera {
        Some(m) if m.eq_ignore_ascii_case("RSU") => line.push_str(
            "; galera wsrep_OSU_method=RSU: it runs on this node only, desynchronised; run it on every node (docs/upgrading.md)",
        ),
        Some(m) => line.push_str(&format!(
            "; galera wsrep_OSU_method={m}: every node runs it at the same point in the cluster's order, and the cluster's writes wait until it ends (docs/upgrading.md)"
        )),
        None => {}
    }
    line
}

/// Under the lock: reads the ledger afresh, records what the shape shows for a database made
/// before versions were recorded, then runs each step in order. Returns (statements run,
/// steps only recorded, the version it started from).
async fn run_steps(
    conn: &mut MySqlConnection,
    before_lock: &Found,
    target: u32,
    options: &Options,
    lock: &Lock,
    say: &mut (dyn Say + Send),
) -> Result<(u32, u32, u32), MigrateError> {
    // Another run may have moved the database while this one waited for the lock.
    let found = read(conn).await.map_err(MigrateError::Database)?;
    if found.version != before_lock.version {
        say.line(format!(
            "while waiting for the lock the database moved to schema_version={}",
            found.version
        ));
    }
    let mut recorded = 0;
    if !found.recorded {
        record_baseline(conn, found.version, &options.by).await?;
        say.line(format!(
            "recorded {} as recognised by the tables' shape",
            versions_up_to(found.version)
        ));
        say.line(format!(
            "from now on every program reads the version at start: grant the runtime and prune accounts SELECT on `{}`.receiver_schema_versions (schema/grants.sql, steps 2 and 3)",
            options.database
        ));
    }
    let mut applied = 0;
    for step in pending(conn, &found).await? {
        if step.version > target {
            break;
        }
        if step.version <= found.version {
            say.line(format!(
                "step {} {}: recorded as applied, but {} lacks it (changed by hand?): running it again",
                step.version, step.name, step.table
            ));
        }
        if lock.lost() {
            return Err(MigrateError::LostLock {
                after: step.version - 1,
            });
        }
        if found.unfinished == Some(step.version) {
            say.line(format!(
                "step {} {}: a run that was cut short started it; resuming from the table's shape",
                step.version, step.name
            ));
        }
        record_step(conn, &step, STARTED, &options.by)
            .await
            .map_err(|e| written(e, "write receiver_schema_versions"))?;
        crate::seam::reach_step(crate::seam::Point::StepStarted, step.version).await;
        let t = Instant::now();
        let ran = if has_shape(conn, step.shape)
            .await
            .map_err(MigrateError::Database)?
        {
            false
        } else {
            run_statement(conn, &step, say).await?;
            true
        };
        if lock.lost() {
            return Err(MigrateError::LostLock {
                after: step.version - 1,
            });
        }
        crate::seam::reach_step(crate::seam::Point::StepDone, step.version).await;
        record_step(conn, &step, APPLIED, &options.by)
            .await
            .map_err(|e| written(e, "write receiver_schema_versions"))?;
        if ran {
            applied += 1;
            say.line(format!(
                "applied step {} {} on {} in {:.2} s",
                step.version,
                step.name,
                step.table,
                t.elapsed().as_secs_f64()
            ));
        } else {
            recorded += 1;
            say.line(format!(
                "recorded step {} {}: the table already had it",
                step.version, step.name
            ));
        }
    }
    Ok((applied, recorded, found.version))
}

/// Runs one step's statement, saying every few seconds that it is still running. A statement
/// that fails although its result is there (a run before this one completed it) counts as
/// done.
async fn run_statement(
    conn: &mut MySqlConnection,
    step: &Step,
    say: &mut (dyn Say + Send),
) -> Result<(), MigrateError> {
    let t = Instant::now();
    let result = {
        let mut run = std::pin::pin!(conn.execute(step.statement));
        loop {
            match tokio::time::timeout(STILL_RUNNING_EVERY, &mut run).await {
                Ok(r) => break r,
                Err(_) => say.waiting(format!(
                    "step {} {}: the server is still running it on {} after {} s ({})",
                    step.version,
                    step.name,
                    step.table,
                    t.elapsed().as_secs(),
                    step.algorithm
                )),
            }
        }
    };
    match result {
        Ok(_) => Ok(()),
        Err(e) => {
            let error = StorageError::from_sqlx(&e);
            if matches!(error.kind(), StorageKind::Server | StorageKind::Deadlock)
                && has_shape(conn, step.shape).await.unwrap_or(false)
            {
                return Ok(());
            }
            if error.kind() == StorageKind::PermissionDenied {
                return Err(MigrateError::NotInitAccount {
                    what: "alter the receiver's tables",
                    error,
                });
            }
            Err(MigrateError::Step {
                version: step.version,
                name: step.name,
                error,
            })
        }
    }
}

/// Records versions 1 to `version` as recognised by the tables' shape.
async fn record_baseline(
    conn: &mut MySqlConnection,
    version: u32,
    by: &str,
) -> Result<(), MigrateError> {
    let write = |e| written(e, "write receiver_schema_versions");
    ledger::record(conn, 1, "initial-tables", RECOGNISED, BASELINE, by)
        .await
        .map_err(write)?;
    for step in steps().iter().filter(|s| s.version <= version) {
        record_step(conn, step, RECOGNISED, by)
            .await
            .map_err(write)?;
    }
    Ok(())
}

/// A failed write of the ledger or the lock: the account's, when it lacks the privilege.
fn written(error: StorageError, what: &'static str) -> MigrateError {
    match error.kind() {
        StorageKind::PermissionDenied => MigrateError::NotInitAccount { what, error },
        _ => MigrateError::Database(error),
    }
}

/// The lock held by this run, renewed in the background on a connection of its own.
struct Lock {
    by: String,
    dsn: Dsn,
    lost: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

const TAKE: &str = "UPDATE receiver_schema_lock \
     SET holder = ?, taken_at = UTC_TIMESTAMP(6), renewed_at = UTC_TIMESTAMP(6) \
     WHERE id = 1 AND (holder IS NULL OR renewed_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND)";
const HELD_BY: &str = "SELECT holder, \
     TIMESTAMPDIFF(SECOND, renewed_at, UTC_TIMESTAMP(6)), \
     CAST(DATE_FORMAT(taken_at, '%Y-%m-%dT%H:%i:%sZ') AS CHAR) \
     FROM receiver_schema_lock WHERE id = 1";
const RENEW: &str = "UPDATE receiver_schema_lock SET renewed_at = UTC_TIMESTAMP(6) \
     WHERE id = 1 AND holder = ?";
const RELEASE: &str = "UPDATE receiver_schema_lock \
     SET holder = NULL, taken_at = NULL, renewed_at = NULL WHERE id = 1 AND holder = ?";

impl Lock {
    async fn take(
        dsn: &Dsn,
        conn: &mut MySqlConnection,
        options: &Options,
        say: &mut (dyn Say + Send),
    ) -> Result<Lock, MigrateError> {
        sqlx::query("INSERT IGNORE INTO receiver_schema_lock (id) VALUES (1)")
            .execute(&mut *conn)
            .await
            .map_err(|e| {
                let error = StorageError::from_sqlx(&e);
                match error.kind() {
                    StorageKind::PermissionDenied => MigrateError::NotInitAccount {
                        what: "write receiver_schema_lock",
                        error,
                    },
                    _ => MigrateError::Database(error),
                }
            })?;
        let waiting_since = Instant::now();
        let mut said: Option<Instant> = None;
        loop {
            // Who held it before, so that a take-over can say whom it replaced.
            let before = Self::holder(conn).await?;
            let taken = sqlx::query(TAKE)
                .bind(&options.by)
                .bind(LOCK_LEASE.as_secs())
                .execute(&mut *conn)
                .await;
            match taken {
                Ok(done) if done.rows_affected() == 1 => {
                    if let Some((holder, age, _)) = before {
                        say.waiting(format!(
                            "took over the migration lock from {holder}: not renewed for {age} s, so that run is gone"
                        ));
                    }
                    break;
                }
                Ok(_) => {}
                // Galera: two nodes took it at once and this one lost the certification.
                Err(e) if StorageError::from_sqlx(&e).is_retryable() => {}
                Err(e) => return Err(db(e)),
            }
            let holder = Self::holder(conn).await?;
            let waited = waiting_since.elapsed();
            if waited >= options.lock_wait {
                return Err(MigrateError::LockWait {
                    holder: holder.map(|h| h.0).unwrap_or_else(|| "another run".into()),
                    waited: waited.as_secs(),
                });
            }
            if said.is_none_or(|s| s.elapsed() >= SAY_EVERY) {
                if let Some((holder, age, since)) = &holder {
                    say.waiting(format!(
                        "waiting for the migration lock: held by {holder} since {since}, renewed {age} s ago (taken over if not renewed for {} s); waited {} s of {} s",
                        LOCK_LEASE.as_secs(),
                        waited.as_secs(),
                        options.lock_wait.as_secs()
                    ));
                }
                said = Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = tokio::spawn(renew(dsn.clone(), options.by.clone(), lost.clone()));
        Ok(Lock {
            by: options.by.clone(),
            dsn: dsn.clone(),
            lost,
            renewer,
        })
    }

    /// The holder, how many seconds ago it renewed, and since when it holds; `None` when free.
    async fn holder(
        conn: &mut MySqlConnection,
    ) -> Result<Option<(String, i64, String)>, MigrateError> {
        let row = sqlx::query(HELD_BY)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
        Ok(row.and_then(|r| {
            let holder = version::text(&r, 0);
            (!holder.is_empty()).then(|| {
                (
                    holder,
                    r.try_get::<Option<i64>, _>(1).ok().flatten().unwrap_or(0),
                    version::text(&r, 2),
                )
            })
        }))
    }

    fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    async fn release(&mut self, conn: &mut MySqlConnection) {
        self.renewer.abort();
        let released = sqlx::query(RELEASE)
            .bind(&self.by)
            .execute(&mut *conn)
            .await;
        if released.is_err() {
            // The run's connection may be what failed (a lost connection mid-step): a new one
            // frees the lock now. If that fails too, the lock expires after its lease, and the
            // next run waits that long, no longer.
            if let Ok(mut fresh) = connect_one(&self.dsn).await {
                let _ = sqlx::query(RELEASE)
                    .bind(&self.by)
                    .execute(&mut fresh)
                    .await;
                let _ = fresh.close().await;
            }
        }
    }
}

/// Renews the lock every few seconds on a connection of its own (the run's connection may be
/// busy with a long statement). Marks it lost when the row names another holder, or when no
/// renewal succeeded for a whole lease.
async fn renew(dsn: Dsn, by: String, lost: Arc<AtomicBool>) {
    let mut conn: Option<MySqlConnection> = None;
    let mut last_renewed = Instant::now();
    loop {
        tokio::time::sleep(RENEW_EVERY).await;
        if conn.is_none() {
            conn = connect_one(&dsn).await.ok();
        }
        if let Some(c) = conn.as_mut() {
            match sqlx::query(RENEW).bind(&by).execute(&mut *c).await {
                Ok(done) if done.rows_affected() == 1 => last_renewed = Instant::now(),
                Ok(_) => {
                    lost.store(true, Ordering::SeqCst);
                    return;
                }
                Err(_) => conn = None,
            }
        }
        if last_renewed.elapsed() >= LOCK_LEASE {
            lost.store(true, Ordering::SeqCst);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_is_one_statement_that_states_its_algorithm() {
        for step in STEPS {
            assert_eq!(
                crate::ddl::statements(step.statement).len(),
                1,
                "{}",
                step.name
            );
            let upper = step.statement.to_uppercase();
            let stated = match step.algorithm {
                Algorithm::Instant => upper.contains("ALGORITHM = INSTANT"),
                Algorithm::InplaceNoLock => {
                    upper.contains("ALGORITHM = INPLACE") && upper.contains("LOCK = NONE")
                }
                Algorithm::Copy => upper.contains("ALGORITHM = COPY"),
            };
            assert!(stated, "{} does not demand {:?}", step.name, step.algorithm);
        }
        let versions: Vec<u32> = STEPS.iter().map(|s| s.version).collect();
        let expected: Vec<u32> = (2..2 + STEPS.len() as u32).collect();
        assert_eq!(versions, expected, "versions follow each other from 2");
        assert_eq!(STEPS.last().map(|s| s.version), Some(SCHEMA_VERSION));
    }

    #[test]
    fn the_index_step_makes_the_index_init_makes() {
        let init = crate::ddl::statements(crate::schema::SCHEMA_SQL)[0].clone();
        let index_line = init
            .lines()
            .find(|l| l.contains("KEY receiver_inbox_received_at"))
            .expect("init makes the index")
            .trim()
            .trim_start_matches("KEY ")
            .to_owned();
        assert!(
            ADD_RECEIVED_AT_INDEX.contains(&index_line),
            "{index_line} / {ADD_RECEIVED_AT_INDEX}"
        );
        let comment = init
            .split("COMMENT '")
            .find(|c| c.starts_with("按受理时间"))
            .and_then(|c| c.split('\'').next())
            .expect("the index has a comment");
        assert!(ADD_RECEIVED_AT_INDEX.contains(comment));
    }

    #[test]
    fn the_header_names_both_versions_and_how_the_found_one_is_known() {
        let found = Found {
            version: 1,
            recorded: false,
            unfinished: None,
            highest_named: 0,
        };
        assert_eq!(
            header(&found, 2),
            "schema_version=1 target=2 recorded=no (recognised by the tables' shape)"
        );
    }
}
