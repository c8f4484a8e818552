//! `receiver init`: runs the initial DDL from `schema/schema.sql`, once, and records the
//! schema's version (`schema/migrations.sql`, [`crate::version`]).
//!
//! The DDL is that file itself, compiled in, not a copy. Init only ever creates: if either
//! table already exists it stops before running anything, and it never repairs a partial
//! schema nor alters structure (upgrades are `receiver migrate`'s, [`crate::migrate`]).

use std::fmt;

pub use crate::ddl::statements;

use sqlx::{Connection, Executor, Row};

use crate::connect::connect_one;
use crate::dsn::Dsn;
use crate::error::StorageError;

/// Whether the inbox has an index of this name.
pub const INDEX_EXISTS: &str = "SELECT COUNT(*) FROM information_schema.statistics \
     WHERE table_schema = DATABASE() AND table_name = 'receiver_inbox' AND index_name = ?";

pub use crate::version::RECEIVED_AT_INDEX;

/// The initial DDL, version 1: `schema/schema.sql`.
pub const SCHEMA_SQL: &str = include_str!("../../../schema/schema.sql");

/// The receiver's tables, in creation order.
pub const TABLES: [&str; 2] = ["receiver_inbox", "receiver_task_views"];

const EXISTING_TABLES: &str = "SELECT table_name FROM information_schema.tables \
     WHERE table_schema = DATABASE() AND table_name IN ('receiver_inbox', 'receiver_task_views') \
     ORDER BY table_name";

const FOREIGN_KEYS: &str = "SELECT COUNT(*) FROM information_schema.table_constraints \
     WHERE constraint_schema = DATABASE() \
       AND table_name IN ('receiver_inbox', 'receiver_task_views') \
       AND constraint_type = 'FOREIGN KEY'";

/// What a successful init reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitReport {
    /// Foreign keys on the receiver's tables, read back from information_schema.
    pub foreign_keys: i64,
    /// The schema version recorded.
    pub schema_version: u32,
}

impl fmt::Display for InitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "receiver_schema_initialized=true foreign_keys={}\nschema_version={}",
            self.foreign_keys, self.schema_version
        )
    }
}

/// Why init did not complete.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("the receiver schema already exists in database `{database}` ({tables}): init only creates tables in an empty receiver database and changed nothing")]
    AlreadyInitialized { database: String, tables: String },
    #[error("database `{database}` at {address} does not exist or this account cannot use it: a DBA creates it and grants CREATE on it first (schema/grants.sql); check {origin}")]
    UnknownDatabase {
        database: String,
        address: String,
        origin: &'static str,
    },
    #[error("cannot connect to the receiver database: {0}")]
    Connect(StorageError),
    #[error("creating `{table}` failed: {error}; {note}")]
    Create {
        table: &'static str,
        error: StorageError,
        note: &'static str,
    },
    #[error("reading back the schema failed: {0}")]
    Verify(StorageError),
    #[error("the tables were created, but recording the schema's version failed: {0}; `receiver migrate` records it from the tables' shape")]
    Record(StorageError),
}

/// Creates the receiver's tables in the database `dsn` names.
pub async fn init(dsn: &Dsn) -> Result<InitReport, InitError> {
    init_from(dsn, SCHEMA_SQL).await
}

/// [`init`] with the DDL given (a test build's mutant changes it).
pub(crate) async fn init_from(dsn: &Dsn, schema_sql: &str) -> Result<InitReport, InitError> {
    let mut conn = connect_one(dsn).await.map_err(|error| {
        match error.number() {
            // Unknown database; access denied to the database.
            Some(1049 | 1044) => InitError::UnknownDatabase {
                database: dsn.database().to_owned(),
                address: dsn.address().to_owned(),
                origin: dsn.origin(),
            },
            _ => InitError::Connect(error),
        }
    })?;

    let existing: Vec<String> = sqlx::query(EXISTING_TABLES)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| InitError::Verify(StorageError::from_sqlx(&e)))?
        .iter()
        .map(|row| {
            row.try_get::<String, _>(0)
                .or_else(|_| {
                    row.try_get::<Vec<u8>, _>(0)
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                })
                .unwrap_or_default()
        })
        .collect();
    if !existing.is_empty() {
        return Err(InitError::AlreadyInitialized {
            database: dsn.database().to_owned(),
            tables: existing.join(", "),
        });
    }

    for (i, stmt) in statements(schema_sql).iter().enumerate() {
        let table = TABLES.get(i).copied().unwrap_or("?");
        conn.execute(stmt.as_str())
            .await
            .map_err(|e| InitError::Create {
                table,
                error: StorageError::from_sqlx(&e),
                note: if i == 0 {
                    "nothing was created"
                } else {
                    "earlier tables were created; init never repairs a partial schema, drop them by hand before running it again"
                },
            })?;
    }

    let foreign_keys: i64 = sqlx::query(FOREIGN_KEYS)
        .fetch_one(&mut conn)
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| InitError::Verify(StorageError::from_sqlx(&e)))?;
    let by = crate::ledger::this_run(&format!("receiver {} init", env!("CARGO_PKG_VERSION")));
    crate::ledger::record_init(&mut conn, &by)
        .await
        .map_err(InitError::Record)?;
    let _ = conn.close().await;
    Ok(InitReport {
        foreign_keys,
        schema_version: crate::version::SCHEMA_VERSION,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_file_is_two_create_tables_in_order() {
        let stmts = statements(SCHEMA_SQL);
        assert_eq!(stmts.len(), 2);
        for (stmt, table) in stmts.iter().zip(TABLES) {
            assert!(
                stmt.starts_with(&format!("CREATE TABLE {table} (")),
                "{stmt}"
            );
            assert!(!stmt.contains("IF NOT EXISTS"));
            assert!(!stmt.to_uppercase().contains("FOREIGN KEY"));
            for line in stmt.lines() {
                let column_type = line.split_whitespace().nth(1).unwrap_or("");
                assert!(
                    !column_type.to_uppercase().starts_with("JSON"),
                    "a JSON column rewrites numbers and key order: {line}"
                );
            }
        }
    }
}
