//! The conformance kit: the source's regressions, black-box, against any receiver program that
//! follows the environment contract (`conformance run --receiver CMD`).
//!
//! For each case the kit starts a world of its own: fresh databases on a testdb server (a
//! local server of the case's own where the case stops it), `orbit-dev` with its fault API, a
//! subscription, and, where the case needs one, a `commit-proxy` in front of the receiver's
//! database. It runs `CMD init` (as an account that may create tables) and `CMD consume` (as
//! the runtime account) with only the documented environment: `ORBIT_URL`,
//! `ORBIT_CREDENTIALS_FILE`, `ORBIT_RECEIVER_DSN`, `ORBIT_SUBSCRIPTION_ID`, `RECEIVER_NAME`
//! (and `PATH`, `HOME`). It judges from outside only: the platform's deliveries, the two
//! tables, and the program's exit and output.
//!
//! What it must never do: judge a receiver by anything but the platform's state, the two
//! tables and the program's exit and output; print a token, a password or a result body in a
//! verdict; or mock the database or the platform (`fixtures` gives every world real ones).
//!
//! A case returns `Err` with a message that names the rule it proves; a panic inside the kit
//! (a world that would not start) is reported as the kit's own error, not the receiver's.
//!
//! Here: the registry ([`cases`], [`MUTANTS`]) and the runner ([`Case::run`]); `world.rs` (one
//! case's world and what the kit reads back from it); `cases/` (the cases, in groups). The
//! receiver runs as a [`fixtures::process::Proc`], in a process group of its own.

use std::future::Future;
use std::pin::Pin;

/// The version of the contract the kit checks (docs/receiver-contract.md), one for the
/// receiver and the kit.
pub use about::CONTRACT_VERSION;

/// The consumer name the kit gives the receiver.
pub const RECEIVER_NAME: &str = "kit-receiver";
/// The event types a case's subscription takes.
const TYPES: &[&str] = &[
    "task.started",
    "task.succeeded",
    "task.needs_review",
    "task.cancelled",
];
/// The short lease of cases that do not need the real one.
const SHORT_LEASE: u64 = 3;

/// Whether a receiver written to the source design alone must pass a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The source design's rules: every receiver must pass.
    Must,
    /// This project's stricter rules (the outage hold, identities compared byte for byte):
    /// reported, and failing the run only with `--strict`.
    Should,
}

/// The rules that are this project's own, stricter choices (SHOULD): identities compared byte
/// for byte, the outage hold (a read-only server's too), a redelivery after a prune,
/// configuration refused. Every other
/// rule is the source design's (MUST).
pub const SHOULD_RULES: &[&str] = &[
    "R-SCHEMA-7",
    "R-STORE-9",
    "R-STORE-12",
    "R-CLI-5",
    "R-DIST-4",
];

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Must => "MUST",
            Level::Should => "SHOULD",
        }
    }

    /// The level of a failure whose message is `why`, in a case of this level: the highest of
    /// the rules the message names anywhere (R-KIT-4), never lower than the case's. What a
    /// case found decides, not what it was about: a SHOULD case whose ledger finds an ACK
    /// without a committed row (R-STORE-7), a view moved backwards or an event applied twice
    /// fails the run without `--strict`, whichever rule its message names first. A message
    /// naming no rule (the kit's own error) keeps the case's level.
    pub fn of_failure(self, why: &str) -> Level {
        if self == Level::Must || rules_named(why).any(|rule| !SHOULD_RULES.contains(&rule)) {
            Level::Must
        } else {
            self
        }
    }
}

pub use fixtures::rules::{rule_named, rules_named};

/// What one run of one case found as its worlds ended: held by that run's [`Ctx`] and the
/// worlds made from it, never by the process, so that cases running at once (`--jobs`) cannot
/// read or clear each other's findings. [`Case::run`] makes a new one for every run.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// ACKs the platform refused in the case's worlds, from orbit-dev's `/metrics`.
    refused_acks: std::sync::atomic::AtomicU64,
    /// What the receiver printed that it must not (a token, a password, a lease proof, a result
    /// body the case sent), found in every line of every world ([`world::leak_in`]), not only
    /// in the `no-secrets` case's.
    leaks: std::sync::Mutex<Vec<String>>,
    /// `consume`s that ended by themselves (no signal from the kit): a wait inside the case may
    /// not have looked.
    exits: std::sync::Mutex<Vec<String>>,
    /// How many worlds the case has started: each world's platform varies its events by the
    /// seed, the case and this count, so a case's worlds are the same at any `--jobs`.
    worlds: std::sync::atomic::AtomicU64,
    /// Set by a case whose subject is the platform's refusals (it judges them under its own
    /// rule), so that they are not named again as R-SDK-2.
    refusals_judged: std::sync::atomic::AtomicBool,
}

impl Findings {
    pub(crate) fn refused(&self, acks: u64) {
        self.refused_acks
            .fetch_add(acks, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn leak(&self, what: String) {
        push(&self.leaks, what);
    }

    pub(crate) fn exit(&self, what: String) {
        push(&self.exits, what);
    }

    /// This case judges the platform's refusals itself.
    pub(crate) fn judge_refusals_here(&self) {
        self.refusals_judged
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The number of the next world of this case, from 0.
    pub(crate) fn next_world(&self) -> u64 {
        self.worlds
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    fn first(found: &std::sync::Mutex<Vec<String>>) -> Option<String> {
        found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .first()
            .cloned()
    }
}

fn push(found: &std::sync::Mutex<Vec<String>>, what: String) {
    found
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(what);
}

/// Where a case's kit code panicked (`file:line`), written by the hook [`quiet_panics`]
/// installs while that case's future runs; one cell per run of a case.
type PanicCell = std::sync::Arc<std::sync::Mutex<Option<String>>>;

tokio::task_local! {
    /// The case whose future is being polled, and where its panic is noted: the panic hook
    /// runs on the panicking thread inside that poll, so it reaches the case's own cell.
    static PANICKED: (&'static str, PanicCell);
}

/// Replaces the panic hook's report (a message and, with `RUST_BACKTRACE`, a backtrace on
/// standard error) with a note of where it happened, in the cell of the case that panicked:
/// [`Case::run`] turns the panic into that case's one-line message. A panic outside any case
/// (the runner's own) is reported as usual.
pub fn quiet_panics() {
    let usual = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let noted = PANICKED.try_with(|(case, cell)| {
            *cell
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some(format!("{at}, in case {case}"));
        });
        if noted.is_err() {
            usual(info);
        }
    }));
}

/// A case's verdict: `Ok` with what it saw, or `Err` with what was wrong.
pub type Verdict = Result<String, String>;
type CaseFuture = Pin<Box<dyn Future<Output = Verdict> + Send>>;

/// One case of the kit.
pub struct Case {
    pub id: CaseId,
    pub name: &'static str,
    /// The requirements it proves (`docs/requirements.md`).
    pub rules: &'static str,
    pub level: Level,
    pub what: &'static str,
    run: fn(Ctx) -> CaseFuture,
}

/// What a case gets: the receiver's command line, the run's seed, and where the receiver's
/// output is copied when the case's worlds end (the runner keeps it for a failed case); and,
/// made afresh by [`Case::run`], what this run of the case found.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub receiver: String,
    pub seed: u64,
    pub logs: Option<std::path::PathBuf>,
    /// The case this context belongs to (set by [`Case::run`]).
    case: &'static str,
    found: std::sync::Arc<Findings>,
}

impl Ctx {
    pub fn new(receiver: String, seed: u64, logs: Option<std::path::PathBuf>) -> Ctx {
        Ctx {
            receiver,
            seed,
            logs,
            case: "",
            found: std::sync::Arc::default(),
        }
    }

    /// What this run of the case found so far.
    pub(crate) fn findings(&self) -> std::sync::Arc<Findings> {
        std::sync::Arc::clone(&self.found)
    }

    /// The seed of this case's next world: the run's seed, the case's name and the world's
    /// number, so that which worlds a case gets does not depend on which cases ran beside it.
    pub(crate) fn world_seed(&self) -> u64 {
        let case = self.case.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        self.seed
            .wrapping_add(case)
            .wrapping_add(self.found.next_world())
    }
}

/// Defines [`CaseId`] and [`cases`] from one list, so that a case's identity and its entry
/// cannot drift apart.
macro_rules! registry {
    ($($id:ident => ($name:literal, $level:ident, $rules:literal, $what:literal, $f:ident),)*) => {
        /// A case's identity: code that names a case (the mutants' aims) names one of these, so
        /// a misspelt or removed case is a compile error.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum CaseId {
            $($id,)*
        }

        /// Every case, in the order the kit runs them.
        pub fn cases() -> Vec<Case> {
            vec![$(Case {
                id: CaseId::$id,
                name: $name,
                rules: $rules,
                level: Level::$level,
                what: $what,
                run: |ctx| Box::pin($f(ctx)),
            },)*]
        }
    };
}

registry! {
    Schema => ("schema", Must, "R-SCHEMA-1 R-SCHEMA-5 R-SCHEMA-7", "init makes 2 tables, 17 commented columns, no foreign key, byte-compared identity columns; a second init is refused", schema),
    NamesByBytes => ("names-by-bytes", Should, "R-SCHEMA-7 R-STORE-4", "two consumer names that differ only in case, on one database: each records the event and keeps a view of its own", names_by_bytes),
    FirstReceipt => ("first-receipt", Must, "R-STORE-5 R-STORE-7 R-CANON-2", "one event: ACKed at its first attempt, one inbox row with the canonical form and its SHA-256, the view at its version", first_receipt),
    AckAfterCommit => ("ack-after-commit", Must, "R-STORE-7", "the answer to COMMIT held 1.5 s by the proxy: while the row is committed and the answer is on its way, the delivery is not ACKed", ack_after_commit),
    EveryAckAfterCommit => ("every-ack-after-commit", Must, "R-STORE-7", "every COMMIT held 300 ms by the proxy before the server sees it, 12 events: no delivery ACKed sooner after its row's INSERT", every_ack_after_commit),
    CutBetweenStatements => ("cut-between-statements", Must, "R-STORE-7", "the receiver's connection cut at its first statement on the view, then at its first COMMIT: after each redelivery the inbox row and the view agree", cut_between_statements),
    Duplicate => ("duplicate", Must, "R-STORE-4", "the same event delivered again: ACKed, still one inbox row, the view advanced once", duplicate),
    StaleVersion => ("stale-version", Must, "R-STORE-6", "an older version arriving late, of another type with a result: ACKed and kept as history, every column of the view row unchanged", stale_version),
    VersionOrder => ("version-order", Must, "R-STORE-6", "versions whose text order is not their order (9 and 10, 99 and 100) and versions around 2^53 and 2^63 up to 2^64-1, each pair in both arrival orders: every view at the higher", version_order),
    DuplicateOriginals => ("duplicate-originals", Must, "R-STORE-4 R-STORE-12", "duplicates and same-id conflicts of an applied original, one recorded stale, and one recorded again after a prune: duplicates ACKed, conflicts never, records and views unchanged", duplicate_originals),
    PrunedRedelivery => ("pruned-redelivery", Should, "R-STORE-12", "an applied event's inbox row deleted as a prune would, then the event delivered again: ACKed, the view and applied_events unmoved", pruned_redelivery),
    MixedBacklog => ("mixed-backlog", Must, "R-STORE-6 R-STORE-4", "a backlog taken at a concurrency of 16: three versions of a task newest first, redeliveries beside new versions of their tasks, two event ids for one version: every view at its highest, applied_events as its inbox rows say, of each pair one ACKed and recorded and the other never", mixed_backlog),
    ConcurrentVersions => ("concurrent-versions", Must, "R-STORE-6 R-STORE-4", "every statement on the view answered 200 ms late, so that overlapping applies of one task overlap across read and write: 8 views meeting v5, v4, v3 at once, 8 new tasks whose first three versions come at once, 8 first events delivered twice at once: every view at the highest, each event applied once", concurrent_versions),
    SameIdOtherContent => ("same-id-other-content", Must, "R-STORE-2 R-STORE-4", "an event with an applied event's id and other content: never ACKed, the stored record unchanged", same_id_other_content),
    SameVersionOtherId => ("same-version-other-id", Must, "R-STORE-6", "another event id for a version already applied: never ACKed, rolled back (no inbox row)", same_version_other_id),
    CanonicalCorpus => ("canonical-corpus", Must, "R-CANON-2 R-STORE-5", "every valid event of the published vectors and 240 drawn from the seed (non-ASCII, escapes, '/', control characters, UTF-16 name order, number forms, occurred_at offsets), sent byte for byte: each stored event, digest and view result is the form's", canonical_corpus),
    NeedsReview => ("needs-review", Must, "R-CANON-1", "NEEDS_REVIEW stays NEEDS_REVIEW in the view", needs_review),
    ExactNumbers => ("exact-numbers", Must, "R-SCHEMA-4 R-CANON-2", "big integers and decimal text in a result kept byte for byte", exact_numbers),
    LargeResults => ("large-results", Must, "R-SCHEMA-4", "results of 70,000, 200,000 and 520,000 bytes with multi-byte characters at both ends and across byte 65,535: stored and viewed byte for byte", large_results),
    Scopes => ("scopes", Must, "R-SCHEMA-3 R-SCHEMA-2", "two consumer names on one queue and one name on two queues, one database, one task id: each view moved only by its own consumer's events of its own queue", scopes),
    Utc => ("utc", Must, "R-SCHEMA-6", "times stored in UTC while the server's time zone is +09:00", utc),
    EveryConnection => ("every-connection", Must, "R-SCHEMA-6", "the server at +09:00, every COMMIT answered 300 ms late so that applies overlap on several connections, and every connection killed between two rounds of 12 events: every stored time of both rounds in UTC (the session set on every connection, not once through a pool)", every_connection),
    QueueMismatch => ("queue-mismatch", Must, "R-CLI-3", "a subscription on another queue than the configured one: consume refuses to start and takes nothing", queue_mismatch),
    KillAfterCommit => ("kill-after-commit", Must, "R-FAULT-4", "SIGKILL after COMMIT and before the ACK landed: after the real 30 s lease the redelivery is a duplicate (attempts 2, applied_events 1)", kill_after_commit),
    CommitLost => ("commit-lost", Must, "R-STORE-7 R-STORE-8 R-FAULT-3", "the server's OK to COMMIT dropped by the proxy: no ACK at that attempt, then resolved as a duplicate", commit_lost),
    RefusedEvent => ("refused-event", Must, "R-CANON-3 R-STORE-1 R-CLI-4", "an event the canonical form refuses (a member named twice): never ACKed, EXPIRED once its budget of 2 is spent, no inbox row, its id in the output", refused_event),
    MalformedEvents => ("malformed-events", Must, "R-CANON-3 R-STORE-1 R-CLI-4", "21 events, each one change from a good one: every refusal of the event around the form the platform can carry (task versions 1.0, 1e0, 2E+1, -1, 0, 2^64 and \"1\" among them), a bad timestamp, a lone surrogate, a member named twice: each refused until EXPIRED, no inbox row, each printable id in the output", malformed_events),
    ForeignEvents => ("foreign-events", Must, "R-CANON-1", "on this subscription, an event naming another queue and one of an unknown type: each refused until its budget of 2 is spent, no inbox row, the view unchanged", foreign_events),
    LostAckReply => ("lost-ack-reply", Must, "R-SDK-2", "the answer to an ACK lost (the stream closed after it was recorded): the ACK sent again with the same proof is already_acked, one attempt", lost_ack_reply),
    AfterFailures => ("after-failures", Must, "R-CLI-6 R-STORE-8", "a burst of failing deliveries (4 refused, 2 conflicts, a COMMIT whose answer is lost, one held 8 s past the apply's budget), then 20 good ones: every good one ACKed within 30 s, the two COMMITs resolved", after_failures),
    AbandonedCommit => ("abandoned-commit", Must, "R-CLI-6", "the first COMMIT held 20 s on its way to the server by the proxy, past the apply's budget, its transaction open: the redelivery applies or resolves within its own lease (ACKED by attempt 2), not behind the abandoned transaction's locks", abandoned_commit),
    LongOutage => ("long-outage", Must, "R-CLI-6", "the receiver's database down 20 s, longer than a probe that gives up would wait, events sent during and after: every one ACKed within 20 s of the restart", long_outage),
    StreamDropped => ("stream-dropped", Must, "R-SDK-2 R-E2E-3", "the stream closed by the platform while deliveries are leased ahead and applies are in flight (every COMMIT answered 600 ms late): each ACKed at its first attempt on a later stream; then 3 s idle and 8 more events: all ACKed, several leased at once (credit whole on the new stream)", stream_dropped),
    CreditBound => ("credit-bound", Must, "R-E2E-3 R-SDK-2", "a backlog of 40 events, every COMMIT answered 300 ms late: never more than 8 deliveries held at once on the stream (the default concurrency 4, and at most as many waiting), counted by the platform", credit_bound),
    DatabaseRestart => ("database-restart", Should, "R-STORE-9", "the receiver's database killed for 12 s while events queue, a budget of 3: nothing lost, nothing doubled, no delivery past the 2 attempts a hold allows", database_restart),
    DeadlineFromArrival => ("deadline-from-arrival", Should, "R-STORE-9", "a saturated receiver with short leases: 8 events, 4 s leases, every COMMIT answered 2.2 s late, so half wait for a handler slot: all ACKed in the end and no ACK refused for coming after its lease (an apply's deadline counts from its delivery's arrival)", deadline_from_arrival),
    SkewedClock => ("skewed-clock", Should, "R-STORE-9", "the platform's clock 60 s ahead of the receiver's, then 60 s behind (orbit-dev --clock-offset-seconds), 3 s leases: every delivery ACKed at its first attempt", skewed_clock),
    ReadOnly => ("read-only", Should, "R-DIST-4", "the receiver's database made read-only for 12 s (its writes refused with 1290) while events queue, a budget of 3: nothing lost, nothing doubled, no delivery past the 2 attempts a hold allows", read_only),
    Sigterm => ("sigterm", Must, "R-CLI-3", "SIGTERM ends consume within 10 s and leaves the subscription enabled", sigterm),
    SigtermMidApply => ("sigterm-mid-apply", Must, "R-STORE-7 R-CLI-3", "SIGTERM while a COMMIT is held 3 s by the proxy: no delivery ACKed without its committed row, consume ends within 10 s, and what was not ACKed comes back and is applied once", sigterm_mid_apply),
    CrashLoop => ("crash-loop", Must, "R-FAULT-4 R-STORE-4 R-STORE-6", "seeded SIGKILLs over duplicates and out-of-order versions, then a ledger check", crash_loop),
    NoSecrets => ("no-secrets", Must, "R-SDK-3 R-STORE-11 R-CLI-4", "no token, password, lease proof or result body in the output, errors included: a lost COMMIT answer, a conflict, a refused ACK, a conflict between two results carrying markers, a wrong password and an unknown subscription", no_secrets),
    ConfigErrors => ("config-errors", Should, "R-CLI-5", "consume with a RECEIVER_NAME outside its grammar, too long, a DSN without a database, no subscription: a non-zero exit, a line naming the variable, nothing leased", config_errors),
}

/// The mutants of `receiver-mutant` (`RECEIVER_MUTANT`), each with the case aimed at it and
/// the rule its failure must name.
pub use seam_names::Mutant;

/// Every mutant with its aimed case and rule.
pub const MUTANTS: &[(Mutant, CaseId, &str)] = &[
    (Mutant::AckBeforeCommit, CaseId::AckAfterCommit, "R-STORE-7"),
    (
        Mutant::InsertIgnore,
        CaseId::SameIdOtherContent,
        "R-STORE-4",
    ),
    (
        Mutant::NoDigestCompare,
        CaseId::SameIdOtherContent,
        "R-STORE-4",
    ),
    (Mutant::AnyVersion, CaseId::StaleVersion, "R-STORE-6"),
    (
        Mutant::UnconfirmedIsSuccess,
        CaseId::CommitLost,
        "R-STORE-8",
    ),
    (Mutant::CaseInsensitiveIds, CaseId::Schema, "R-SCHEMA-7"),
    (Mutant::AsReceived, CaseId::FirstReceipt, "R-CANON-2"),
    (Mutant::DuplicateIsError, CaseId::Duplicate, "R-STORE-4"),
    (Mutant::NoInboxDedup, CaseId::Duplicate, "R-STORE-4"),
    (
        Mutant::NeedsReviewAsSucceeded,
        CaseId::NeedsReview,
        "R-CANON-1",
    ),
    (Mutant::FloatNumbers, CaseId::ExactNumbers, "R-SCHEMA-4"),
    (Mutant::LocalTime, CaseId::Utc, "R-SCHEMA-6"),
    (Mutant::NoQueueCheck, CaseId::QueueMismatch, "R-CLI-3"),
    (Mutant::PauseOnSigterm, CaseId::Sigterm, "R-CLI-3"),
    (Mutant::PrintsToken, CaseId::NoSecrets, "R-SDK-3"),
    (Mutant::AcksRejected, CaseId::RefusedEvent, "R-CANON-3"),
    (Mutant::NoOutageHold, CaseId::DatabaseRestart, "R-STORE-9"),
    (Mutant::LenientConfig, CaseId::ConfigErrors, "R-CLI-5"),
    (Mutant::ForgetsLostAcks, CaseId::LostAckReply, "R-SDK-2"),
    (
        Mutant::NoEventQueueCheck,
        CaseId::ForeignEvents,
        "R-CANON-1",
    ),
    (Mutant::LostUpdate, CaseId::ConcurrentVersions, "R-STORE-6"),
    (
        Mutant::AckEarlySometimes,
        CaseId::EveryAckAfterCommit,
        "R-STORE-7",
    ),
    (
        Mutant::SplitCommit,
        CaseId::CutBetweenStatements,
        "R-STORE-7",
    ),
    (
        Mutant::ReappliesPruned,
        CaseId::PrunedRedelivery,
        "R-STORE-12",
    ),
    (
        Mutant::EscapesNonAscii,
        CaseId::CanonicalCorpus,
        "R-CANON-2",
    ),
    (Mutant::EscapesSlash, CaseId::CanonicalCorpus, "R-CANON-2"),
    (Mutant::KeepsOffset, CaseId::CanonicalCorpus, "R-CANON-2"),
    (Mutant::Utf8KeyOrder, CaseId::CanonicalCorpus, "R-CANON-2"),
    (
        Mutant::ReadBeforeLock,
        CaseId::ConcurrentVersions,
        "R-STORE-6",
    ),
    (Mutant::StopsAfterFailures, CaseId::AfterFailures, "R-CLI-6"),
    (Mutant::ExitsOnShortLease, CaseId::Sigterm, "R-CLI-3"),
    (Mutant::TextVersionOrder, CaseId::VersionOrder, "R-STORE-6"),
    (Mutant::SignedVersions, CaseId::VersionOrder, "R-STORE-6"),
    (Mutant::StaleWritesResult, CaseId::StaleVersion, "R-STORE-6"),
    (
        Mutant::NoDigestCompareWhenStale,
        CaseId::DuplicateOriginals,
        "R-STORE-4",
    ),
    (Mutant::CutsLargeResults, CaseId::LargeResults, "R-SCHEMA-4"),
    (
        Mutant::LenientVersions,
        CaseId::MalformedEvents,
        "R-CANON-3",
    ),
    (Mutant::ViewByTaskAlone, CaseId::Scopes, "R-SCHEMA-3"),
    (Mutant::AcksOnSigterm, CaseId::SigtermMidApply, "R-STORE-7"),
    (Mutant::ReadOnlyIsFailure, CaseId::ReadOnly, "R-DIST-4"),
    (
        Mutant::DeadlineFromExpiresAt,
        CaseId::SkewedClock,
        "R-STORE-9",
    ),
    (Mutant::ProbeGivesUp, CaseId::LongOutage, "R-CLI-6"),
    (Mutant::CreditOnReceipt, CaseId::CreditBound, "R-E2E-3"),
    (
        Mutant::ClosesWithoutKill,
        CaseId::AbandonedCommit,
        "R-CLI-6",
    ),
    (
        Mutant::GroupInArrivalOrder,
        CaseId::MixedBacklog,
        "R-STORE-6",
    ),
    (
        Mutant::AcksPartlyCommittedGroup,
        CaseId::MixedBacklog,
        "R-STORE-6",
    ),
    (Mutant::PrintsRefusedProof, CaseId::NoSecrets, "R-SDK-3"),
    (
        Mutant::QuotesConflictResult,
        CaseId::NoSecrets,
        "R-STORE-11",
    ),
    (
        Mutant::SessionOnFirstConnection,
        CaseId::EveryConnection,
        "R-SCHEMA-6",
    ),
    (
        Mutant::CancelsOnStreamDrop,
        CaseId::StreamDropped,
        "R-SDK-2",
    ),
    (
        Mutant::CreditPerSubscription,
        CaseId::StreamDropped,
        "R-E2E-3",
    ),
    (
        Mutant::DeadlineFromSlot,
        CaseId::DeadlineFromArrival,
        "R-STORE-9",
    ),
];

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl Case {
    /// Runs the case with findings of its own; a panic of the kit becomes an `Err` that says
    /// so, in one line. When the platform refused ACKs in the case, a failure names that cause
    /// first (R-SDK-2: an ACK must carry the proof of the delivery's current lease) and a pass
    /// notes it.
    pub async fn run(&self, ctx: Ctx) -> Verdict {
        let ctx = Ctx {
            case: self.name,
            found: std::sync::Arc::default(),
            ..ctx
        };
        let found = ctx.findings();
        let verdict = self.run_caught(ctx).await;
        judged(&found, verdict)
    }

    async fn run_caught(&self, ctx: Ctx) -> Verdict {
        let cell = PanicCell::default();
        let run = PANICKED.scope((self.name, std::sync::Arc::clone(&cell)), (self.run)(ctx));
        match tokio::spawn(run).await {
            Ok(v) => v,
            Err(e) => {
                let why = e
                    .try_into_panic()
                    .ok()
                    .and_then(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    })
                    .unwrap_or_else(|| "cancelled".into());
                let at = cell
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                let why = why.lines().next().unwrap_or_default();
                Err(match at {
                    Some(at) => format!("{}: {why} (at {at})", report::NOT_RUN),
                    None => format!("{}: {why}", report::NOT_RUN),
                })
            }
        }
    }
}

/// A case's verdict with what its worlds found: a consume that exited by itself is the story
/// of any failure after it, and fails a case that did not notice; a secret printed fails any
/// case, first; refused ACKs are named.
fn judged(found: &Findings, verdict: Verdict) -> Verdict {
    let verdict = match (Findings::first(&found.exits), verdict) {
        (None, v) => v,
        (Some(_), Err(why)) if why.starts_with("R-CLI-3: consume exited") => Err(why),
        (Some(exit), Ok(_)) => Err(exit),
        (Some(exit), Err(why)) => Err(format!("{exit}; then the case saw: {why}")),
    };
    let verdict = match (Findings::first(&found.leaks), verdict) {
        (None, v) => v,
        (Some(leak), Ok(_)) => Err(leak),
        (Some(leak), Err(why)) => Err(format!("{leak}; then: {why}")),
    };
    let judged_by_case = found
        .refusals_judged
        .load(std::sync::atomic::Ordering::SeqCst);
    let refused = if judged_by_case {
        0
    } else {
        found.refused_acks.load(std::sync::atomic::Ordering::SeqCst)
    };
    match verdict {
        Err(why) if refused > 0 => Err(format!(
            "R-SDK-2: the platform refused {refused} ACK(s) in this case (an ACK with the proof of a superseded or expired lease, or for no delivery): look there first; then: {why}"
        )),
        Ok(saw) if refused > 0 => Ok(format!(
            "{saw}; note R-SDK-2: the platform refused {refused} ACK(s) in this case"
        )),
        v => v,
    }
}

/// `Err(format!(…))` unless `cond`.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn panics_here(_: Ctx) -> Verdict {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        panic!("a world that would not start")
    }

    async fn finds_an_exit(ctx: Ctx) -> Verdict {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        ctx.findings()
            .exit("R-CLI-3: consume exited by itself".into());
        Ok("saw it".into())
    }

    async fn passes(_: Ctx) -> Verdict {
        tokio::time::sleep(std::time::Duration::from_millis(80)).await;
        Ok("fine".into())
    }

    fn fake(name: &'static str, run: fn(Ctx) -> CaseFuture) -> Case {
        Case {
            id: CaseId::Schema,
            name,
            rules: "R-STORE-7",
            level: Level::Must,
            what: "",
            run,
        }
    }

    /// Cases running at once on one runtime: a panic names the case it happened in, and an
    /// exit found by one case fails that case only, even when both share one context.
    #[test]
    fn findings_and_panics_stay_with_their_case() {
        quiet_panics();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let all = [
            fake("one", |c| Box::pin(panics_here(c))),
            fake("two", |c| Box::pin(finds_an_exit(c))),
            fake("three", |c| Box::pin(passes(c))),
            fake("four", |c| Box::pin(panics_here(c))),
        ];
        let ctx = Ctx::new("r".into(), 1, None);
        let verdicts = runtime.block_on(futures_join(&all, &ctx));
        let line = format!("{}:", file!());
        match &verdicts[0] {
            Err(why) => assert!(
                why.starts_with(
                    "the kit could not run the case: a world that would not start (at "
                ) && why.contains(&line)
                    && why.ends_with(", in case one)"),
                "{why}"
            ),
            v => panic!("{v:?}"),
        }
        assert_eq!(
            verdicts[1],
            Err("R-CLI-3: consume exited by itself".to_owned())
        );
        assert_eq!(verdicts[2], Ok("fine".to_owned()));
        assert!(
            matches!(&verdicts[3], Err(why) if why.ends_with(", in case four)")),
            "{:?}",
            verdicts[3]
        );
    }

    async fn futures_join(all: &[Case], ctx: &Ctx) -> Vec<Verdict> {
        let (a, b, c, d) = tokio::join!(
            all[0].run(ctx.clone()),
            all[1].run(ctx.clone()),
            all[2].run(ctx.clone()),
            all[3].run(ctx.clone())
        );
        vec![a, b, c, d]
    }

    #[test]
    fn a_failure_takes_the_level_of_the_rule_it_names() {
        assert_eq!(rule_named("R-STORE-7: no row"), Some("R-STORE-7"));
        assert_eq!(rule_named("R-CANON-2 (O4: …): x"), Some("R-CANON-2"));
        assert_eq!(
            rule_named("the kit could not run the case: R-STORE-7"),
            None
        );
        assert_eq!(rule_named("R-: x"), None);
        let should = Level::Should;
        assert_eq!(
            should.of_failure("R-STORE-7: ACKed with no row"),
            Level::Must
        );
        assert_eq!(
            should.of_failure("R-STORE-9: kept taking deliveries"),
            Level::Should
        );
        assert_eq!(
            should.of_failure("the kit could not run the case"),
            Level::Should
        );
        assert_eq!(Level::Must.of_failure("R-CLI-5: x"), Level::Must);
        // What was found decides: a SHOULD case whose ledger found lost data fails the run.
        assert_eq!(
            should.of_failure(
                "R-STORE-9: the ledger found 1 problem(s): event e: ACKED without a committed inbox row (R-STORE-7: ACK only after COMMIT)"
            ),
            Level::Must
        );
        assert_eq!(
            should.of_failure("R-STORE-9: held 3 s; see R-STORE-12 and R-CLI-5"),
            Level::Should
        );
        // Only whole rule names count.
        assert_eq!(
            rules_named("R-STORE-9: x (R-STORE-7) and XR-CANON-2, R-").collect::<Vec<_>>(),
            ["R-STORE-9", "R-STORE-7"]
        );
        // Every SHOULD case names SHOULD rules first, so that its own failure stays a SHOULD.
        for case in cases().into_iter().filter(|c| c.level == Level::Should) {
            let first = case.rules.split(' ').next().unwrap_or_default();
            assert!(SHOULD_RULES.contains(&first), "{}: {first}", case.name);
        }
    }
}

mod cases;
mod forms;
pub mod provenance;
pub mod report;
pub mod runner;
mod world;

use cases::*;
