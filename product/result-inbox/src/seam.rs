//! The core's one seam for test builds: the only place in this crate where the feature
//! `seams` appears. Without the feature the seam is compiled to nothing: [`reach`] is an empty
//! function and [`statements`] is always [`Statements::STANDARD`]. With it, a test build
//! (`test-tools/receiver-test-builds`, never a release) may install, once per process,
//! - a hook the store awaits at each [`Point`] inside the Apply transaction (the fault
//!   barriers, where a fault test stops a real process and kills it), and
//! - another statement table, for a store that breaks one rule on purpose (the conformance
//!   kit's mutants),
//!
//! and may give an event other stored bytes (a mutant that stores what it received).

use crate::event::TaskEvent;
use crate::statements::Statements;

/// A point inside the Apply transaction where the store awaits a test build's hook, in flow
/// order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// After `BEGIN`, before the inbox `INSERT`.
    BeforeInsert,
    /// After the inbox `INSERT` met the dedup key, before the committed record's verdict is
    /// read.
    BeforeVerdict,
    /// In a group's transaction, after the inbox rows of all its events were inserted.
    AfterInboxRows,
    /// In a group's transaction, after its views were created or advanced and its stale
    /// events marked, before the callers' writes.
    AfterViews,
    /// After every write, before `COMMIT`.
    BeforeCommit,
    /// In `receiver migrate`, after a step was recorded as started, before its statement.
    StepStarted,
    /// In `receiver migrate`, after a step's statement, before it is recorded as applied.
    StepDone,
}

/// Passes `point` for `event`; in a test build with a hook installed, waits for it. The
/// apply's time budget keeps running meanwhile.
pub(crate) async fn reach(point: Point, event: &TaskEvent) {
    #[cfg(feature = "seams")]
    if let Some(hook) = installed::HOOK.get() {
        hook(point, event.id().as_str().to_owned()).await;
    }
    #[cfg(not(feature = "seams"))]
    let _ = (point, event);
}

/// Passes `point` of `receiver migrate` for the step of `version`; in a test build with a
/// hook installed, waits for it.
pub(crate) async fn reach_step(point: Point, version: u32) {
    #[cfg(feature = "seams")]
    if let Some(hook) = installed::HOOK.get() {
        hook(point, version.to_string()).await;
    }
    #[cfg(not(feature = "seams"))]
    let _ = (point, version);
}

/// Steps a test build added to the product's (none in the product).
pub(crate) fn extra_steps() -> &'static [crate::version::Step] {
    #[cfg(feature = "seams")]
    if let Some(steps) = installed::STEPS.get() {
        return steps;
    }
    &[]
}

/// The statements every store of this process runs.
pub(crate) fn statements() -> &'static Statements {
    #[cfg(feature = "seams")]
    if let Some(table) = installed::STATEMENTS.get() {
        return table;
    }
    &Statements::STANDARD
}

#[cfg(feature = "seams")]
pub use installed::*;

#[cfg(feature = "seams")]
mod installed {
    use std::future::Future;
    use std::ops::Range;
    use std::pin::Pin;
    use std::sync::OnceLock;

    use super::Point;
    use crate::event::TaskEvent;
    pub use crate::statements::GroupRule;
    use crate::statements::Statements;
    use canonical_form::Digest;

    /// What the hook returns.
    pub type HookFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

    /// The hook: called with the point and the event id; the apply waits for its future.
    pub type Hook = Box<dyn Fn(Point, String) -> HookFuture + Send + Sync>;

    pub(super) static HOOK: OnceLock<Hook> = OnceLock::new();
    pub(super) static STATEMENTS: OnceLock<Statements> = OnceLock::new();
    pub(super) static STEPS: OnceLock<Vec<crate::version::Step>> = OnceLock::new();

    /// Adds `steps` to the product's for this process (a test-only schema change, to prove
    /// `receiver migrate` on a step of its own); a second install is refused.
    pub fn install_steps(steps: Vec<crate::version::Step>) -> Result<(), &'static str> {
        STEPS
            .set(steps)
            .map_err(|_| "test steps are already installed")
    }

    /// Installs the hook for this process; a second install is refused.
    pub fn install_hook(hook: Hook) -> Result<(), &'static str> {
        HOOK.set(hook)
            .map_err(|_| "a barrier hook is already installed")
    }

    /// The statements of one apply, as text a test build may change.
    #[derive(Debug, Clone, Copy)]
    pub struct StatementTable {
        pub insert_inbox: &'static str,
        pub upsert_view: &'static str,
        pub read_verdict: &'static str,
        /// The head of a group's inbox `INSERT`, up to its `VALUES`.
        pub insert_inbox_rows: &'static str,
        /// How a group is applied.
        pub group_rule: GroupRule,
        /// `None` leaves the server's own time zone.
        pub time_zone: Option<&'static str>,
        /// Whether the health check reads `@@global.read_only`.
        pub probe_read_only: bool,
        /// Whether an apply out of time mid-statement kills its connection on the server.
        pub kill_abandoned: bool,
    }

    impl StatementTable {
        /// What the store is documented to send.
        pub fn standard() -> StatementTable {
            let s = &Statements::STANDARD;
            StatementTable {
                insert_inbox: s.insert_inbox,
                upsert_view: s.upsert_view,
                read_verdict: s.read_verdict,
                insert_inbox_rows: s.insert_inbox_rows,
                group_rule: s.group_rule,
                time_zone: s.time_zone,
                probe_read_only: s.probe_read_only,
                kill_abandoned: s.kill_abandoned,
            }
        }
    }

    /// Installs `table` for every store this process opens; a second install is refused.
    pub fn install_statements(table: StatementTable) -> Result<(), &'static str> {
        STATEMENTS
            .set(Statements {
                insert_inbox: table.insert_inbox,
                upsert_view: table.upsert_view,
                read_verdict: table.read_verdict,
                insert_inbox_rows: table.insert_inbox_rows,
                group_rule: table.group_rule,
                time_zone: table.time_zone,
                probe_read_only: table.probe_read_only,
                kill_abandoned: table.kill_abandoned,
            })
            .map_err(|_| "a statement table is already installed")
    }

    /// `receiver init` with another schema's DDL.
    pub async fn init_from(
        dsn: &crate::dsn::Dsn,
        ddl: &str,
    ) -> Result<crate::schema::InitReport, crate::schema::InitError> {
        crate::schema::init_from(dsn, ddl).await
    }

    /// `event` with other stored bytes, their SHA-256, and where its result lies in them.
    pub fn with_stored_form(
        event: TaskEvent,
        stored: Vec<u8>,
        result: Option<Range<usize>>,
    ) -> TaskEvent {
        TaskEvent {
            digest: Digest::of(&stored),
            canonical: stored,
            result,
            ..event
        }
    }
}
