//! Test builds only (feature `mutants`): ways to break one rule each, so that the conformance
//! kit can prove that it notices (`conformance run --receiver target/debug/receiver-mutant`,
//! with `RECEIVER_MUTANT`). The production build has none of this code.
//!
//! The core carries the storage mutants; the receiver program the two about acknowledging
//! ([`Mutant::AckBeforeCommit`], [`Mutant::UnconfirmedIsSuccess`]).

use std::fmt;

/// One broken rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutant {
    /// The handler returns success (the SDK ACKs) before the transaction commits (R-STORE-7).
    AckBeforeCommit,
    /// `INSERT IGNORE` for the inbox, and a silently ignored row taken as a duplicate
    /// (R-STORE-2).
    InsertIgnore,
    /// A duplicate key is a duplicate, whatever the stored digest says (R-STORE-4).
    NoDigestCompare,
    /// The view takes every event's values, whatever its version (R-STORE-6).
    AnyVersion,
    /// `CommitUnconfirmed` is treated as success and ACKed (R-STORE-8).
    UnconfirmedIsSuccess,
    /// `init` makes the identity columns case-insensitive text (R-SCHEMA-7).
    CaseInsensitiveIds,
}

impl Mutant {
    /// Every mutant, in the order the kit reports them.
    pub const ALL: [Mutant; 6] = [
        Mutant::AckBeforeCommit,
        Mutant::InsertIgnore,
        Mutant::NoDigestCompare,
        Mutant::AnyVersion,
        Mutant::UnconfirmedIsSuccess,
        Mutant::CaseInsensitiveIds,
    ];

    /// The name `RECEIVER_MUTANT` takes.
    pub fn name(self) -> &'static str {
        match self {
            Mutant::AckBeforeCommit => "ack-before-commit",
            Mutant::InsertIgnore => "insert-ignore",
            Mutant::NoDigestCompare => "no-digest-compare",
            Mutant::AnyVersion => "any-version",
            Mutant::UnconfirmedIsSuccess => "unconfirmed-is-success",
            Mutant::CaseInsensitiveIds => "case-insensitive-ids",
        }
    }

    /// The mutant named `name`, if any.
    pub fn parse(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// [`Mutant::InsertIgnore`]'s inbox statement.
pub(crate) const INSERT_INBOX_IGNORE: &str = "INSERT IGNORE INTO receiver_inbox \
     (consumer_name, queue_id, event_id, event_digest, event_canonical, applied, received_at) \
     VALUES (?, ?, ?, ?, ?, 1, UTC_TIMESTAMP(6))";

/// [`Mutant::AnyVersion`]'s view statement: always reports an advance (code 1, two rows).
pub(crate) const UPSERT_VIEW_ANY_VERSION: &str = "INSERT INTO receiver_task_views \
     (consumer_name, queue_id, task_id, task_version, last_event_id, last_state, last_result, \
      applied_events, created_at, updated_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)) \
     ON DUPLICATE KEY UPDATE \
       applied_events = applied_events + LAST_INSERT_ID(1), \
       last_event_id = VALUES(last_event_id), last_state = VALUES(last_state), \
       last_result = VALUES(last_result), updated_at = VALUES(updated_at), \
       task_version = VALUES(task_version)";

/// The statement mutant `m` runs instead of the store's `sql`.
pub(crate) fn statement(m: Mutant, sql: &'static str) -> &'static str {
    match m {
        Mutant::InsertIgnore if sql == crate::store::INSERT_INBOX => INSERT_INBOX_IGNORE,
        Mutant::AnyVersion if sql == crate::store::UPSERT_VIEW => UPSERT_VIEW_ANY_VERSION,
        _ => sql,
    }
}

/// [`Mutant::CaseInsensitiveIds`]'s DDL: the identity columns as text of the table's
/// case-insensitive collation.
pub(crate) fn case_insensitive_schema(sql: &str) -> String {
    sql.replace("VARBINARY(", "VARCHAR(")
        .replace("COLLATE = utf8mb4_bin", "COLLATE = utf8mb4_general_ci")
}
