//! The schema's ledger (`receiver_schema_versions`, `schema/migrations.sql`): making it, and
//! writing its rows. `receiver init` records what it created here; `receiver migrate` records
//! each step as started and as applied.

use sqlx::{Executor, MySqlConnection};

use crate::error::StorageError;
use crate::version::{Step, APPLIED, LEDGER_SQL, SCHEMA_VERSION, STARTED, STEPS};

/// The first version: the two tables. Recorded by `init` and recognised by `migrate`.
pub const BASELINE: &str =
    "the initial tables receiver_inbox and receiver_task_views (schema/schema.sql)";

/// Makes the ledger and the lock if they are missing (`IF NOT EXISTS`: two first runs at once
/// both succeed).
pub async fn create(conn: &mut MySqlConnection) -> Result<(), StorageError> {
    for statement in crate::ddl::statements(LEDGER_SQL) {
        conn.execute(statement.as_str())
            .await
            .map_err(|e| StorageError::from_sqlx(&e))?;
    }
    Ok(())
}

/// Writes one ledger row (autocommit): a new one, or the state of an existing one. A row
/// written as started gets a new start time and no applied time.
pub async fn record(
    conn: &mut MySqlConnection,
    version: u32,
    name: &str,
    state: &str,
    statement: &str,
    by: &str,
) -> Result<(), StorageError> {
    let done = state != STARTED;
    sqlx::query(
        "INSERT INTO receiver_schema_versions \
           (version, name, state, statement, started_at, applied_at, applied_by) \
         VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6), IF(?, UTC_TIMESTAMP(6), NULL), ?) \
         ON DUPLICATE KEY UPDATE state = VALUES(state), applied_at = VALUES(applied_at), \
           applied_by = VALUES(applied_by), \
           started_at = IF(VALUES(state) = 'started', VALUES(started_at), started_at)",
    )
    .bind(version)
    .bind(name)
    .bind(state)
    .bind(statement)
    .bind(done)
    .bind(by)
    .execute(&mut *conn)
    .await
    .map_err(|e| StorageError::from_sqlx(&e))?;
    Ok(())
}

/// [`record`] of `step` in `state`.
pub async fn record_step(
    conn: &mut MySqlConnection,
    step: &Step,
    state: &str,
    by: &str,
) -> Result<(), StorageError> {
    record(conn, step.version, step.name, state, step.statement, by).await
}

/// `init`'s record: the ledger made, and every version up to [`SCHEMA_VERSION`] applied,
/// since `schema/schema.sql` creates the tables in that version's shape.
pub(crate) async fn record_init(conn: &mut MySqlConnection, by: &str) -> Result<(), StorageError> {
    create(conn).await?;
    record(conn, 1, "initial-tables", APPLIED, BASELINE, by).await?;
    for step in STEPS.iter().filter(|s| s.version <= SCHEMA_VERSION) {
        record(
            conn,
            step.version,
            step.name,
            APPLIED,
            "created by receiver init (schema/schema.sql)",
            by,
        )
        .await?;
    }
    Ok(())
}

/// Who this process is, for the ledger and the lock: `<program> on <host> pid <pid> run
/// <start time>`, the start time so that two runs of one process differ.
pub fn this_run(program: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".into());
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    format!(
        "{program} on {host} pid {} run {micros}",
        std::process::id()
    )
}
