//! What a transaction is asked to record and how it can end, shared by the one-event apply
//! (`store.rs`) and the group apply (`group.rs`): the caller's writes ([`BusinessWrite`]), a
//! group's [`Member`]s, and why a group falls back to one event at a time ([`Fallback`]).

use std::future::Future;
use std::pin::Pin;

use sqlx::MySqlConnection;
use tokio::time::Instant;

use crate::error::WriteError;
use crate::event::TaskEvent;
use crate::outcome::Outcome;

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

/// One event of a group, with the caller's writes and when its apply must be done.
#[derive(Clone, Copy)]
pub struct Member<'a> {
    pub event: &'a TaskEvent,
    pub write: &'a dyn BusinessWrite,
    /// The member's own deadline (a delivery's lease, say): the group ends by the earliest.
    pub deadline: Option<Instant>,
}

impl std::fmt::Debug for Member<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("event", &self.event.id().as_str())
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

/// Why a group was rolled back and applied one event at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// An inbox row of the group was already there (a redelivery, or the same event twice).
    Duplicate,
    /// An event has the version its view holds, with another event id.
    Conflict,
    /// Another transaction created a view the group meant to create.
    ViewRace,
    /// A caller's write failed.
    Write,
    /// The group's events are more than [`GROUP_MAX_BYTES`] or [`GROUP_MAX_EVENTS`].
    TooLarge,
}

impl Fallback {
    /// Every cause, in a fixed order.
    pub const ALL: [Fallback; 5] = [
        Fallback::Duplicate,
        Fallback::Conflict,
        Fallback::ViewRace,
        Fallback::Write,
        Fallback::TooLarge,
    ];

    /// The stable lowercase name (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Duplicate => "duplicate",
            Fallback::Conflict => "conflict",
            Fallback::ViewRace => "view_race",
            Fallback::Write => "write",
            Fallback::TooLarge => "too_large",
        }
    }
}

/// What one transaction is asked to record.
pub(crate) enum Work<'a> {
    /// One event and the caller's write ([`Store::apply_until`]).
    One(&'a TaskEvent, &'a dyn BusinessWrite),
    /// Several, each with its write, in one transaction ([`Store::apply_group`]); `screen`:
    /// the inbox is read for them first, and those recorded already are answered there.
    Group {
        members: &'a [Member<'a>],
        screen: bool,
    },
}

/// Where a transaction attempt ended, short of an error: committed with each event's outcome
/// (in the order the work named them), one event already recorded, or a group that must be
/// applied one event at a time (nothing of it stays).
pub(crate) enum GroupStep<'a> {
    Committed(Vec<Outcome>),
    AlreadyRecorded(&'a TaskEvent),
    Fallback(Fallback),
}

/// What [`Store::run`] ends with, short of an error.
pub(crate) enum Done {
    One(Outcome),
    Group {
        outcomes: Vec<Outcome>,
        /// Whether a replica holds the commit, when the store requires it (else `true`).
        replicated: bool,
    },
    Fallback(Fallback),
}
