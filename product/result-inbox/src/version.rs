//! The schema's versions: which one this build creates and needs, the step that makes each
//! version after the first, and whether a program may run on a database's version.
//!
//! The version is recorded in `receiver_schema_versions` (`schema/migrations.sql`), one row
//! per version, by `receiver init` and `receiver migrate` ([`crate::ledger`]). A database made
//! before any version was recorded is recognised by its shape: the [`STEPS`] its tables
//! already show. Reading a database's version is [`crate::migrate::read`].
//!
//! Our rule (docs/upgrading.md): expand first, contract one release later. A step that only
//! adds (a table, a column, an index) enters a release; whatever removes or narrows something
//! waits one more release. So a release runs on its own version and on the one before, and
//! every program refuses a version newer than it knows before it touches a row.

use std::fmt;

use sqlx::Row;

/// The version this build creates (`receiver init`) and migrates to (`receiver migrate`).
pub const SCHEMA_VERSION: u32 = 2;

/// The oldest version this build still runs on (with a warning naming `receiver migrate`).
pub const OLDEST_RUNNABLE: u32 = 1;

/// The index a prune reads rows through, oldest first (`schema/schema.sql`).
pub const RECEIVED_AT_INDEX: &str = "receiver_inbox_received_at";

/// How a step's statement runs on the server, as the statement itself demands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// `ALGORITHM=INSTANT`: a change to the table's metadata only.
    Instant,
    /// `ALGORITHM=INPLACE, LOCK=NONE`: built in place; reads and writes go on.
    InplaceNoLock,
    /// `ALGORITHM=COPY`: the table is rebuilt and writes wait until it is.
    Copy,
}

impl Algorithm {
    /// Whether writes to the table wait while the statement runs.
    pub fn blocks_writes(self) -> bool {
        matches!(self, Algorithm::Copy)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Algorithm::Instant => "ALGORITHM=INSTANT (metadata only; reads and writes go on)",
            Algorithm::InplaceNoLock => {
                "ALGORITHM=INPLACE LOCK=NONE (online: reads and writes go on while it builds)"
            }
            Algorithm::Copy => "ALGORITHM=COPY (the table is copied; writes wait until it ends)",
        })
    }
}

/// What a step's statement leaves behind, read from `information_schema`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// An index of this name on the table.
    Index {
        table: &'static str,
        index: &'static str,
    },
    /// A column of this name on the table.
    Column {
        table: &'static str,
        column: &'static str,
    },
}

/// One version's change: one DDL statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The version the database is at once this step is applied.
    pub version: u32,
    /// A short name, recorded in the ledger.
    pub name: &'static str,
    /// The table it changes.
    pub table: &'static str,
    /// The one statement.
    pub statement: &'static str,
    /// The algorithm and lock the statement demands.
    pub algorithm: Algorithm,
    /// How its result is recognised.
    pub shape: Shape,
}

/// The `received_at` index, for an inbox made before it existed: the same index, with the
/// same comment, as `schema/schema.sql` creates.
pub const ADD_RECEIVED_AT_INDEX: &str = "ALTER TABLE receiver_inbox \
     ADD INDEX receiver_inbox_received_at (consumer_name, queue_id, received_at) \
     COMMENT '按受理时间找出窗口之外的旧行（receiver prune）与最早一行的年龄，不必扫描全表', \
     ALGORITHM = INPLACE, LOCK = NONE";

/// The product's steps, in version order. Version 1 is the initial two tables
/// (`schema/schema.sql` before the index); it has no step.
pub const STEPS: &[Step] = &[Step {
    version: 2,
    name: "inbox-received-at-index",
    table: "receiver_inbox",
    statement: ADD_RECEIVED_AT_INDEX,
    algorithm: Algorithm::InplaceNoLock,
    shape: Shape::Index {
        table: "receiver_inbox",
        index: RECEIVED_AT_INDEX,
    },
}];

/// The ledger and the lock (`schema/migrations.sql`).
pub const LEDGER_SQL: &str = include_str!("../../../schema/migrations.sql");

/// The ledger: one row per version.
pub const LEDGER_TABLE: &str = "receiver_schema_versions";

/// The migration lock: one row.
pub const LOCK_TABLE: &str = "receiver_schema_lock";

/// A ledger row's states.
pub const STARTED: &str = "started";
/// The step's statement completed.
pub const APPLIED: &str = "applied";
/// Found done by the tables' shape, in a database made before versions were recorded.
pub const RECOGNISED: &str = "recognised";

/// What a database says of its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The recorded version, or, when none is recorded, the one its shape shows.
    pub version: u32,
    /// Whether [`Found::version`] comes from the ledger (else from the tables' shape).
    pub recorded: bool,
    /// A step recorded as started and never as applied: a `migrate` that was cut short.
    pub unfinished: Option<u32>,
    /// The highest version the ledger names at all (started or done).
    pub highest_named: u32,
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "schema version {}", self.version)?;
        if !self.recorded {
            f.write_str(" (not recorded: recognised by the tables' shape)")?;
        }
        if let Some(step) = self.unfinished {
            write!(f, ", step {step} started and not finished")?;
        }
        Ok(())
    }
}

/// Why a program may not run on a database's schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mismatch {
    /// The database names a version newer than this build knows.
    Newer { found: u32, known: u32 },
    /// The database is older than this build runs on.
    TooOld { found: u32, oldest: u32 },
    /// The ledger exists but this account may not read it.
    Hidden,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Newer { found, known } => write!(
                f,
                "the receiver database is at schema version {found}, newer than version {known}, the newest this receiver knows: run a receiver of the release that migrated it (docs/upgrading.md); nothing was touched"
            ),
            Mismatch::TooOld { found, oldest } => write!(
                f,
                "the receiver database is at schema version {found}, older than version {oldest}, the oldest this receiver runs on: run `receiver migrate` as the init account first (docs/upgrading.md)"
            ),
            Mismatch::Hidden => f.write_str(
                "this account cannot read receiver_schema_versions, the schema's version: grant it SELECT on that table (schema/grants.sql)",
            ),
        }
    }
}

/// How a database's schema fits this build, when it may run on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// At this build's version.
    Current,
    /// Older, but still one this build runs on: `receiver migrate` brings it up.
    Older(u32),
}

impl Fit {
    /// The warning a program logs for an older schema; `None` when current.
    pub fn warning(self) -> Option<String> {
        match self {
            Fit::Current => None,
            Fit::Older(found) => Some(format!(
                "the receiver database is at schema version {found}, older than this receiver's {SCHEMA_VERSION}: it runs on it, but run `receiver migrate` as the init account (docs/upgrading.md)"
            )),
        }
    }
}

/// Whether a build that knows up to `known` and runs on `oldest` and later may run on `found`.
pub fn fit(found: &Found, known: u32, oldest: u32) -> Result<Fit, Mismatch> {
    if found.highest_named > known || found.version > known {
        return Err(Mismatch::Newer {
            found: found.highest_named.max(found.version),
            known,
        });
    }
    if found.version < oldest {
        return Err(Mismatch::TooOld {
            found: found.version,
            oldest,
        });
    }
    Ok(if found.version == known {
        Fit::Current
    } else {
        Fit::Older(found.version)
    })
}

/// A text column (VARBINARY arrives as bytes) as a string.
pub(crate) fn text(row: &sqlx::mysql::MySqlRow, i: usize) -> String {
    row.try_get::<String, _>(i)
        .or_else(|_| {
            row.try_get::<Vec<u8>, _>(i)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(version: u32, highest_named: u32) -> Found {
        Found {
            version,
            recorded: true,
            unfinished: None,
            highest_named,
        }
    }

    #[test]
    fn a_build_runs_on_its_version_and_the_one_before_and_refuses_a_newer_one() {
        assert_eq!(fit(&found(2, 2), 2, 1), Ok(Fit::Current));
        assert_eq!(fit(&found(1, 1), 2, 1), Ok(Fit::Older(1)));
        assert_eq!(
            fit(&found(3, 3), 2, 1),
            Err(Mismatch::Newer { found: 3, known: 2 })
        );
        assert_eq!(
            fit(&found(1, 1), 3, 2),
            Err(Mismatch::TooOld {
                found: 1,
                oldest: 2
            })
        );
    }

    #[test]
    fn a_newer_step_only_started_is_already_a_newer_schema() {
        // A migrate of a later release is under way: what it adds may already be there.
        let mut f = found(2, 3);
        f.unfinished = Some(3);
        assert_eq!(fit(&f, 2, 1), Err(Mismatch::Newer { found: 3, known: 2 }));
    }

    #[test]
    fn the_refusal_names_both_versions() {
        let line = Mismatch::Newer { found: 3, known: 2 }.to_string();
        assert!(
            line.contains("version 3") && line.contains("version 2"),
            "{line}"
        );
        assert!(Mismatch::TooOld {
            found: 1,
            oldest: 2
        }
        .to_string()
        .contains("receiver migrate"));
    }
}
