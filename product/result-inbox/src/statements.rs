//! The statements of one apply, as text, and the table a store runs them from
//! ([`Statements`]). `store.rs` documents the order they run in and the round trips of each path;
//! the test builds' storage mutants are these texts with one edit each.

use crate::connect::SESSION_TIME_ZONE;

/// First statement of every apply: the dedup claim. `applied = 1` is provisional: the stale
/// path clears it in the same transaction ([`MARK_STALE`]), so no other transaction ever sees
/// it wrong (a concurrent duplicate waits on this row's lock until COMMIT or ROLLBACK).
pub const INSERT_INBOX: &str = concat!(
    inbox_head!(),
    " VALUES (?, ?, ?, ?, ?, 1, UTC_TIMESTAMP(6))"
);

/// The inbox `INSERT` up to its values: one event's ([`INSERT_INBOX`]) and a group's
/// ([`INSERT_INBOX_HEAD`]) share it.
macro_rules! inbox_head {
    () => {
        "INSERT INTO receiver_inbox \
         (consumer_name, queue_id, event_id, event_digest, event_canonical, applied, received_at)"
    };
}
use inbox_head;

/// Creates the task's view with this event's final values, or, when the view exists, locks it
/// exclusively at once and advances it only for a higher version. One statement, one lock
/// request, no shared lock to upgrade: concurrent first events of one task queue behind each
/// other instead of deadlocking.
///
/// What happened comes back in the OK packet's last-insert-id, which `LAST_INSERT_ID(expr)`
/// sets (the table has no auto-increment column, so a fresh insert reports 0):
/// [`VIEW_CREATED`], [`VIEW_ADVANCED`], [`VIEW_NEWER`], [`VIEW_SAME_EVENT`],
/// [`VIEW_SAME_VERSION_OTHER_EVENT`]. MySQL assigns left to right with the new values of the
/// columns already assigned, so `applied_events` (which computes the code from the row as it
/// was) comes first and `task_version` last.
pub const UPSERT_VIEW: &str = "INSERT INTO receiver_task_views \
     (consumer_name, queue_id, task_id, task_version, last_event_id, last_state, last_result, \
      applied_events, created_at, updated_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)) \
     ON DUPLICATE KEY UPDATE \
       applied_events = applied_events + (LAST_INSERT_ID( \
         IF(VALUES(task_version) > task_version, 1, \
         IF(VALUES(task_version) < task_version, 2, \
         IF(VALUES(last_event_id) = last_event_id, 3, 4)))) = 1), \
       last_event_id = IF(VALUES(task_version) > task_version, VALUES(last_event_id), last_event_id), \
       last_state = IF(VALUES(task_version) > task_version, VALUES(last_state), last_state), \
       last_result = IF(VALUES(task_version) > task_version, VALUES(last_result), last_result), \
       updated_at = IF(VALUES(task_version) > task_version, VALUES(updated_at), updated_at), \
       task_version = GREATEST(task_version, VALUES(task_version))";

/// [`UPSERT_VIEW`] inserted the view: first event of the task.
pub const VIEW_CREATED: u64 = 0;
/// [`UPSERT_VIEW`] advanced an existing view.
pub const VIEW_ADVANCED: u64 = 1;
/// [`UPSERT_VIEW`] found a newer version: nothing changed.
pub const VIEW_NEWER: u64 = 2;
/// [`UPSERT_VIEW`] found this version applied by this event id: nothing changed.
pub const VIEW_SAME_EVENT: u64 = 3;
/// [`UPSERT_VIEW`] found this version applied by another event id: nothing changed.
pub const VIEW_SAME_VERSION_OTHER_EVENT: u64 = 4;

/// An older version is history only: clears the provisional `applied` flag.
pub const MARK_STALE: &str = "UPDATE receiver_inbox SET applied = 0 \
     WHERE consumer_name = ? AND queue_id = ? AND event_id = ?";

/// The event id that applied the view's version, for a conflict's message (the row is locked
/// by [`UPSERT_VIEW`]).
pub const READ_VIEW_EVENT: &str = "SELECT last_event_id FROM receiver_task_views \
     WHERE consumer_name = ? AND queue_id = ? AND task_id = ?";

/// After a duplicate key: whether the committed inbox record has this event's digest, that
/// digest, and the record's flag (READ COMMITTED sees it: the 1062 is only raised once the
/// competitor has committed). The server compares; the stored digest comes back for a
/// conflict's message. Not the frozen event: a duplicate should not cost a transfer of up to
/// 512 KiB. Read inside the transaction that met the key, whose shared lock on the row keeps a
/// prune from deleting it first. Binds the delivered digest, then the identity.
pub const READ_VERDICT: &str =
    "SELECT event_digest = ?, event_digest, applied FROM receiver_inbox \
     WHERE consumer_name = ? AND queue_id = ? AND event_id = ?";

/// The head of a group's inbox `INSERT` (the group apply adds one row of values per event:
/// `crate::group::insert_inbox_rows`).
pub const INSERT_INBOX_HEAD: &str = inbox_head!();

/// How a group is applied: as documented ([`GroupRule::Standard`]), or, only in a test build's
/// mutant store, with one of the group's own rules broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupRule {
    /// Judged by task, then version, each event against the view as the ones before it left
    /// it; each event keeps its own answer.
    Standard,
    /// Judged as the events came, each against the view as locked, not as the group's
    /// earlier events left it: the view ends at the last event to arrive, not the highest.
    ArrivalOrder,
    /// Once a group has fallen back and one of its events committed, every event of the group
    /// is answered applied, those that did not commit (a conflict, an unanswered COMMIT)
    /// included.
    AnswersAsCommitted,
    /// After a group met an event recorded already (rolling back, or reading the inbox
    /// first), the events it then committed as a group are applied once more, each alone, and
    /// the second answers (duplicates) stand.
    RestTwice,
}

/// The statements of one apply and the session they run in: one value a store is built with.
/// Production stores run [`Statements::STANDARD`]; a test build's mutant store runs another
/// table it installed through [`crate::seam`], so that the transaction in `store.rs` has no branch
/// of its own for them. Only this crate makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statements {
    pub(crate) insert_inbox: &'static str,
    pub(crate) upsert_view: &'static str,
    pub(crate) read_verdict: &'static str,
    /// The head of a group's inbox `INSERT`.
    pub(crate) insert_inbox_rows: &'static str,
    /// How a group is applied.
    pub(crate) group_rule: GroupRule,
    /// `None` leaves the server's own time zone.
    pub(crate) time_zone: Option<&'static str>,
    /// Whether the health check reads `@@global.read_only` (a read-only server is an outage).
    pub(crate) probe_read_only: bool,
    /// Whether an apply out of time mid-statement kills its connection on the server.
    pub(crate) kill_abandoned: bool,
}

impl Statements {
    /// What this store is documented to send (the table at the top of this file).
    pub const STANDARD: Statements = Statements {
        insert_inbox: INSERT_INBOX,
        upsert_view: UPSERT_VIEW,
        read_verdict: READ_VERDICT,
        insert_inbox_rows: INSERT_INBOX_HEAD,
        group_rule: GroupRule::Standard,
        time_zone: Some(SESSION_TIME_ZONE),
        probe_read_only: true,
        kill_abandoned: true,
    };
}
