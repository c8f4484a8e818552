//! The names of the test builds' seams, typed and defined once: the fault [`Barrier`]s a
//! `receiver-faults` process can stop at, and the [`Mutant`]s a `receiver-mutant` process can
//! break. The test builds (`test-tools/receiver-test-builds`) implement them over the product's
//! seams; the suites and the conformance kit name them through these types, so a misspelt
//! barrier or mutant is a compile error, not a run that tests nothing.
//!
//! This crate depends on nothing: it is names and their spellings only.

use std::fmt;

/// A named point in the flow of one delivery where a `receiver-faults` process can stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Barrier {
    /// In the Apply transaction, after `BEGIN`, before the inbox `INSERT`.
    BeforeInsert,
    /// In the Apply transaction, after the inbox `INSERT` met the dedup key, before the
    /// committed record's verdict is read.
    BeforeVerdict,
    /// In a group's transaction, after the inbox rows of all its events were inserted.
    AfterInboxRows,
    /// In a group's transaction, after its views were written and its stale events marked.
    AfterViews,
    /// After the inbox row and the view are written, before `COMMIT`.
    BeforeCommit,
    /// After the apply answered (COMMIT confirmed, or a duplicate or stale verdict), before
    /// the handler returns and the SDK ACKs.
    AfterCommit,
    /// In the SDK, right after the ACK frame was written to the stream.
    AfterAckSent,
    /// In `receiver migrate`, after a step was recorded as started, before its statement
    /// (keyed by the step's version).
    StepStarted,
    /// In `receiver migrate`, after a step's statement, before it is recorded as applied.
    StepDone,
}

impl Barrier {
    /// The barriers in the flow of one delivery, in flow order: the first of [`Barrier::ALL`].
    pub const DELIVERY: &'static [Barrier] = Barrier::ALL.split_at(7).0;

    /// Every barrier: a delivery's, then `receiver migrate`'s.
    pub const ALL: [Barrier; 9] = [
        Barrier::BeforeInsert,
        Barrier::BeforeVerdict,
        Barrier::AfterInboxRows,
        Barrier::AfterViews,
        Barrier::BeforeCommit,
        Barrier::AfterCommit,
        Barrier::AfterAckSent,
        Barrier::StepStarted,
        Barrier::StepDone,
    ];

    /// The name `RECEIVER_FAULT_BARRIERS` takes.
    pub fn name(self) -> &'static str {
        match self {
            Barrier::BeforeInsert => "before_insert",
            Barrier::BeforeVerdict => "before_verdict",
            Barrier::AfterInboxRows => "after_inbox_rows",
            Barrier::AfterViews => "after_views",
            Barrier::BeforeCommit => "before_commit",
            Barrier::AfterCommit => "after_commit",
            Barrier::AfterAckSent => "after_ack_sent",
            Barrier::StepStarted => "step_started",
            Barrier::StepDone => "step_done",
        }
    }

    /// The barrier named `name`, if any.
    pub fn parse(name: &str) -> Option<Barrier> {
        Barrier::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Whether the barrier lies inside the Apply transaction.
    pub fn in_transaction(self) -> bool {
        matches!(
            self,
            Barrier::BeforeInsert
                | Barrier::BeforeVerdict
                | Barrier::AfterInboxRows
                | Barrier::AfterViews
                | Barrier::BeforeCommit
        )
    }
}

impl fmt::Display for Barrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
    /// The inbox stores the event as received and the SHA-256 of those bytes, not its
    /// canonical form (R-CANON-2); set on the event by the receiver
    /// (the test build hands the event its received bytes).
    AsReceived,
    /// The inbox's duplicate key is an error like any other, so a redelivery of an applied
    /// event is never ACKed (R-STORE-4, and R-FAULT-4's redelivery after a kill).
    DuplicateIsError,
    /// No inbox dedup at all: the inbox row is overwritten and the view takes every event, so
    /// a redelivery advances it again (R-STORE-4).
    NoInboxDedup,
    /// The task state is read as "finished": NEEDS_REVIEW becomes SUCCEEDED (R-CANON-1).
    NeedsReviewAsSucceeded,
    /// The event's numbers go through a binary float before they are stored (R-SCHEMA-4).
    FloatNumbers,
    /// Times are the session's local time: no UTC session, `NOW(6)` (R-SCHEMA-6).
    LocalTime,
    /// `consume` does not compare the subscription's queue with the configured one (R-CLI-3).
    NoQueueCheck,
    /// `consume` pauses the subscription when it stops (R-CLI-3).
    PauseOnSigterm,
    /// `consume` prints the platform token at start (R-SDK-3).
    PrintsToken,
    /// An event the receiver refuses is ACKed all the same, as if handled (R-CANON-3).
    AcksRejected,
    /// `consume` never holds new deliveries while its database is unavailable: each one is
    /// taken, fails, and spends an attempt (R-STORE-9).
    NoOutageHold,
    /// A `RECEIVER_NAME` outside its grammar is quietly replaced by the default name instead
    /// of refused (R-CLI-5).
    LenientConfig,
    /// An ACK whose answer was lost is dropped, not sent again with the same proof after the
    /// reconnect (R-SDK-2).
    ForgetsLostAcks,
    /// An event is taken as the configured queue's whatever queue it names (R-CANON-1).
    NoEventQueueCheck,
    /// The view is also written from a read made before the transaction: an event newer than
    /// what was read overwrites the view blindly, so of two newer versions applied at once the
    /// lower may win (R-STORE-6). One at a time it behaves.
    LostUpdate,
    /// One delivery in three: success is reported at once and the apply runs behind the ACK
    /// (R-STORE-7); the others wait for their COMMIT.
    AckEarlySometimes,
    /// The inbox row is committed in one transaction and the view in another, so a cut
    /// between them leaves a recorded event whose view never moved (R-STORE-7).
    SplitCommit,
    /// The view also advances on the same version and event id when the inbox held no row
    /// for it, so a redelivery after pruning applies a second time (R-STORE-12). While the
    /// inbox row is there, its dedup hides the fault.
    ReappliesPruned,
    /// The canonical writer escapes every character outside ASCII as `\uXXXX` (a surrogate
    /// pair beyond the BMP), as Python's `json.dumps` does by default (R-CANON-2, rule O4).
    EscapesNonAscii,
    /// The canonical writer escapes `/` as `\/`, as PHP's `json_encode` does (R-CANON-2, O4).
    EscapesSlash,
    /// `occurred_at` is stored as delivered, its offset and fraction kept, not normalised to
    /// UTC (R-CANON-2, O7).
    KeepsOffset,
    /// Members are sorted by their names' UTF-8 bytes, not their UTF-16 code units (R-CANON-2,
    /// O2): the two differ only where a character above U+FFFF meets one in U+E000–U+FFFF.
    Utf8KeyOrder,
    /// The apply runs under REPEATABLE READ and reads the view with a plain (non-locking)
    /// SELECT inside its transaction, then writes it blindly from what it read: of two newer
    /// versions applied at once, the lower may win (R-STORE-6). The most likely fault of a
    /// fresh port; one at a time it behaves.
    ReadBeforeLock,
    /// Once three deliveries have failed (refused, a conflict, an unconfirmed COMMIT, …),
    /// every later apply hangs: `consume` takes its window and then nothing more (R-CLI-6).
    StopsAfterFailures,
    /// `consume` refuses to start when the subscription's lease is shorter than its default
    /// apply budget (5 s) and a margin, instead of cutting the budget to fit: under a short
    /// lease it exits at once, with one clear line (R-CLI-3).
    ExitsOnShortLease,
    /// Task versions are compared as their decimal text, so 10 is below 9 (R-STORE-6).
    TextVersionOrder,
    /// Task versions are compared as signed 64-bit integers, so 2^63 and above are below
    /// every smaller version (R-STORE-6).
    SignedVersions,
    /// A stale event leaves the view's version alone but writes its result into the view
    /// (R-STORE-6: a stale event changes no column of the view).
    StaleWritesResult,
    /// A same-id event is compared with the stored digest only when the stored original was
    /// applied: under an original recorded stale, any content is taken for a duplicate
    /// (R-STORE-4).
    NoDigestCompareWhenStale,
    /// The view's result is cut at 65,535 bytes, as a 64 KiB `TEXT` or `BLOB` column under a
    /// session without strict mode does (R-SCHEMA-4).
    CutsLargeResults,
    /// A task version written with a fraction or an exponent (`1.0`, `1e0`, `2E+1`) is read
    /// as the whole number it equals instead of refused (R-CANON-3).
    LenientVersions,
    /// After an event advances its view, every view of the same task id is moved to it too,
    /// whatever their consumer name and queue (R-SCHEMA-3).
    ViewByTaskAlone,
    /// On SIGTERM, every delivery whose apply is still running is reported applied at once,
    /// so the SDK ACKs it before its COMMIT is answered (R-STORE-7).
    AcksOnSigterm,
    /// A write refused as read-only (1290) is a failure of the delivery, not an outage: the
    /// health check does not read `@@global.read_only`, and a failed apply never holds new
    /// deliveries, so each delivery spends its attempts while the server refuses writes
    /// (R-DIST-4).
    ReadOnlyIsFailure,
    /// An apply's deadline is the platform's `lease_expires_at` read against this host's
    /// clock (less the margin for the ACK), not the receipt time and the lease length: with
    /// the platform's clock behind, every apply has run out before it starts (R-STORE-9).
    DeadlineFromExpiresAt,
    /// The health probe gives up once an outage has lasted 10 s, its hold left on: after a
    /// longer outage `consume` never takes a delivery again (R-CLI-6).
    ProbeGivesUp,
    /// The SDK grants a credit for every delivery as it arrives, as well as when it finishes:
    /// the deliveries held grow without bound while applies are slower than the platform
    /// (R-E2E-3, R-SDK-2).
    CreditOnReceipt,
    /// An apply out of time mid-statement closes its socket and leaves the server to notice:
    /// a COMMIT held on its way keeps the transaction and its row locks open, and the
    /// redelivery waits behind them (R-CLI-6; the contract's Deadlines).
    ClosesWithoutKill,
    /// A group's events are judged as they came, each against its view as locked: of three
    /// versions of a task that arrive newest first in one group, the oldest is written last
    /// and the view ends below a version that was ACKed (R-STORE-6). One at a time it behaves.
    GroupInArrivalOrder,
    /// Once a group has fallen back to one event at a time and one of its events committed,
    /// every event of the group is ACKed, a conflict among them included (R-STORE-6). A
    /// group that commits whole behaves.
    AcksPartlyCommittedGroup,
    /// After a group met a redelivery, the events it committed as a group are applied once
    /// more each alone, and the second answers stand: first receipts are reported as
    /// duplicates (the receiver's own account; nothing in the tables differs).
    FallbackAppliesTwice,
    /// When the platform refuses an ACK, the SDK's line for it quotes the lease proof the ACK
    /// carried (R-SDK-3).
    PrintsRefusedProof,
    /// A conflict's log line quotes the incoming event's result (R-STORE-11).
    QuotesConflictResult,
    /// The session time zone is set once, through the pool, by the first apply: only the
    /// connection that apply ran on stores UTC; every other (and every reconnect) stores the
    /// server's local time (R-SCHEMA-6). One connection at a time it behaves.
    SessionOnFirstConnection,
    /// When the stream drops, every apply in flight is cancelled and every delivery received
    /// on it and not yet started is dropped, as if their leases had ended with the stream: each
    /// spends an attempt (R-SDK-2).
    CancelsOnStreamDrop,
    /// Credit is counted per subscription, not per connection: what was granted on the first
    /// stream is taken as still granted, so a new stream gets none and the receiver stalls for
    /// good after a reconnect (R-E2E-3).
    CreditPerSubscription,
    /// An apply's deadline counts from when a handler slot took its delivery, not from when the
    /// delivery arrived: a delivery that waited gets a whole budget and its apply runs past the
    /// lease, one delivery a transaction (R-STORE-9).
    DeadlineFromSlot,
}

impl Mutant {
    /// Every mutant, in the order the kit reports them.
    pub const ALL: [Mutant; 53] = [
        Mutant::AckBeforeCommit,
        Mutant::InsertIgnore,
        Mutant::NoDigestCompare,
        Mutant::AnyVersion,
        Mutant::UnconfirmedIsSuccess,
        Mutant::CaseInsensitiveIds,
        Mutant::AsReceived,
        Mutant::DuplicateIsError,
        Mutant::NoInboxDedup,
        Mutant::NeedsReviewAsSucceeded,
        Mutant::FloatNumbers,
        Mutant::LocalTime,
        Mutant::NoQueueCheck,
        Mutant::PauseOnSigterm,
        Mutant::PrintsToken,
        Mutant::AcksRejected,
        Mutant::NoOutageHold,
        Mutant::LenientConfig,
        Mutant::ForgetsLostAcks,
        Mutant::NoEventQueueCheck,
        Mutant::LostUpdate,
        Mutant::AckEarlySometimes,
        Mutant::SplitCommit,
        Mutant::ReappliesPruned,
        Mutant::EscapesNonAscii,
        Mutant::EscapesSlash,
        Mutant::KeepsOffset,
        Mutant::Utf8KeyOrder,
        Mutant::ReadBeforeLock,
        Mutant::StopsAfterFailures,
        Mutant::ExitsOnShortLease,
        Mutant::TextVersionOrder,
        Mutant::SignedVersions,
        Mutant::StaleWritesResult,
        Mutant::NoDigestCompareWhenStale,
        Mutant::CutsLargeResults,
        Mutant::LenientVersions,
        Mutant::ViewByTaskAlone,
        Mutant::AcksOnSigterm,
        Mutant::ReadOnlyIsFailure,
        Mutant::DeadlineFromExpiresAt,
        Mutant::ProbeGivesUp,
        Mutant::CreditOnReceipt,
        Mutant::ClosesWithoutKill,
        Mutant::GroupInArrivalOrder,
        Mutant::AcksPartlyCommittedGroup,
        Mutant::FallbackAppliesTwice,
        Mutant::PrintsRefusedProof,
        Mutant::QuotesConflictResult,
        Mutant::SessionOnFirstConnection,
        Mutant::CancelsOnStreamDrop,
        Mutant::CreditPerSubscription,
        Mutant::DeadlineFromSlot,
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
            Mutant::AsReceived => "as-received",
            Mutant::DuplicateIsError => "duplicate-is-error",
            Mutant::NoInboxDedup => "no-inbox-dedup",
            Mutant::NeedsReviewAsSucceeded => "needs-review-as-succeeded",
            Mutant::FloatNumbers => "float-numbers",
            Mutant::LocalTime => "local-time",
            Mutant::NoQueueCheck => "no-queue-check",
            Mutant::PauseOnSigterm => "pause-on-sigterm",
            Mutant::PrintsToken => "prints-token",
            Mutant::AcksRejected => "acks-rejected",
            Mutant::NoOutageHold => "no-outage-hold",
            Mutant::LenientConfig => "lenient-config",
            Mutant::ForgetsLostAcks => "forgets-lost-acks",
            Mutant::NoEventQueueCheck => "no-event-queue-check",
            Mutant::LostUpdate => "lost-update",
            Mutant::AckEarlySometimes => "ack-early-sometimes",
            Mutant::SplitCommit => "split-commit",
            Mutant::ReappliesPruned => "reapplies-pruned",
            Mutant::EscapesNonAscii => "escapes-non-ascii",
            Mutant::EscapesSlash => "escapes-slash",
            Mutant::KeepsOffset => "keeps-offset",
            Mutant::Utf8KeyOrder => "utf8-key-order",
            Mutant::ReadBeforeLock => "read-before-lock",
            Mutant::StopsAfterFailures => "stops-after-failures",
            Mutant::ExitsOnShortLease => "exits-on-short-lease",
            Mutant::TextVersionOrder => "text-version-order",
            Mutant::SignedVersions => "signed-versions",
            Mutant::StaleWritesResult => "stale-writes-result",
            Mutant::NoDigestCompareWhenStale => "no-digest-compare-when-stale",
            Mutant::CutsLargeResults => "cuts-large-results",
            Mutant::LenientVersions => "lenient-versions",
            Mutant::ViewByTaskAlone => "view-by-task-alone",
            Mutant::AcksOnSigterm => "acks-on-sigterm",
            Mutant::ReadOnlyIsFailure => "read-only-is-failure",
            Mutant::DeadlineFromExpiresAt => "deadline-from-expires-at",
            Mutant::ProbeGivesUp => "probe-gives-up",
            Mutant::CreditOnReceipt => "credit-on-receipt",
            Mutant::ClosesWithoutKill => "closes-without-kill",
            Mutant::GroupInArrivalOrder => "group-in-arrival-order",
            Mutant::AcksPartlyCommittedGroup => "acks-partly-committed-group",
            Mutant::FallbackAppliesTwice => "fallback-applies-twice",
            Mutant::PrintsRefusedProof => "prints-refused-proof",
            Mutant::QuotesConflictResult => "quotes-conflict-result",
            Mutant::SessionOnFirstConnection => "session-on-first-connection",
            Mutant::CancelsOnStreamDrop => "cancels-on-stream-drop",
            Mutant::CreditPerSubscription => "credit-per-subscription",
            Mutant::DeadlineFromSlot => "deadline-from-slot",
        }
    }

    /// Whether the conformance kit is where this mutant is caught (a receiver's tables and
    /// ACKs show it). The others break only our receiver's own account of each delivery,
    /// which no receiver written elsewhere shares: the `group` suite catches them.
    pub fn in_kit(self) -> bool {
        !matches!(self, Mutant::FallbackAppliesTwice)
    }

    /// The mutant named `name`, if any.
    pub fn parse(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_as_itself_and_no_two_share_one() {
        for m in Mutant::ALL {
            assert_eq!(Mutant::parse(m.name()), Some(m));
        }
        for b in Barrier::ALL {
            assert_eq!(Barrier::parse(b.name()), Some(b));
        }
        let mut names: Vec<&str> = Mutant::ALL.iter().map(|m| m.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Mutant::ALL.len());
        assert_eq!(Mutant::parse("no-such-mutant"), None);
        assert_eq!(Barrier::parse("after_everything"), None);
    }
}
