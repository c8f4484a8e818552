//! Test builds only (feature `mutants`): ways to break one rule each, so that the conformance
//! kit can prove that it notices (`conformance run --receiver target/debug/receiver-mutant`,
//! with `RECEIVER_MUTANT`). The production build has none of this code.
//!
//! The core carries the storage mutants; the receiver program those about acknowledging,
//! rewriting the event before it is applied, starting and stopping
//! ([`Mutant::AckBeforeCommit`], [`Mutant::UnconfirmedIsSuccess`], [`Mutant::FloatNumbers`],
//! [`Mutant::NoQueueCheck`], [`Mutant::PauseOnSigterm`], [`Mutant::PrintsToken`]), and hands
//! [`Mutant::AsReceived`] the bytes it received.

use std::fmt;
use std::sync::OnceLock;

use crate::event::TaskEvent;
use crate::store::Statements;

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
    /// ([`crate::TaskEvent::with_received`]).
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
}

impl Mutant {
    /// Every mutant, in the order the kit reports them.
    pub const ALL: [Mutant; 44] = [
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

/// [`Mutant::InsertIgnore`]'s inbox statement: a taken key inserts nothing and says nothing.
const INSERT_INBOX_IGNORE: &str = "INSERT IGNORE INTO receiver_inbox \
     (consumer_name, queue_id, event_id, event_digest, event_canonical, applied, received_at) \
     VALUES (?, ?, ?, ?, ?, 1, UTC_TIMESTAMP(6))";

/// [`Mutant::DuplicateIsError`]'s inbox statement: a taken key fails with an error other than
/// 1062 (1048, "cannot be null"), which the store treats like any other.
const INSERT_INBOX_DUPLICATE_FAILS: &str = "INSERT INTO receiver_inbox \
     (consumer_name, queue_id, event_id, event_digest, event_canonical, applied, received_at) \
     VALUES (?, ?, ?, ?, ?, 1, UTC_TIMESTAMP(6)) \
     ON DUPLICATE KEY UPDATE event_id = NULL";

/// [`Mutant::NoInboxDedup`]'s inbox statement: a second copy of a key overwrites the first
/// (an upsert, so that the runtime account's INSERT and UPDATE suffice).
const UPSERT_INBOX: &str = "INSERT INTO receiver_inbox \
     (consumer_name, queue_id, event_id, event_digest, event_canonical, applied, received_at) \
     VALUES (?, ?, ?, ?, ?, 1, UTC_TIMESTAMP(6)) \
     ON DUPLICATE KEY UPDATE event_digest = VALUES(event_digest), \
       event_canonical = VALUES(event_canonical), received_at = VALUES(received_at)";

/// [`Mutant::AnyVersion`]'s view statement: always reports an advance (code 1, two rows).
const UPSERT_VIEW_ANY_VERSION: &str = "INSERT INTO receiver_task_views \
     (consumer_name, queue_id, task_id, task_version, last_event_id, last_state, last_result, \
      applied_events, created_at, updated_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)) \
     ON DUPLICATE KEY UPDATE \
       applied_events = applied_events + LAST_INSERT_ID(1), \
       last_event_id = VALUES(last_event_id), last_state = VALUES(last_state), \
       last_result = VALUES(last_result), updated_at = VALUES(updated_at), \
       task_version = VALUES(task_version)";

/// [`Mutant::NoDigestCompare`]'s verdict: "the same digest", whatever is stored (it still
/// takes the delivered digest as its first parameter, like the store's).
const READ_VERDICT_UNCHECKED: &str = "SELECT ? IS NOT NULL, event_digest, applied \
     FROM receiver_inbox WHERE consumer_name = ? AND queue_id = ? AND event_id = ?";

/// [`Mutant::NoDigestCompareWhenStale`]'s verdict: "the same digest" whenever the stored
/// original was not applied.
const READ_VERDICT_APPLIED_ONLY: &str = "SELECT event_digest = ? OR applied = 0, event_digest, \
     applied FROM receiver_inbox WHERE consumer_name = ? AND queue_id = ? AND event_id = ?";

/// The view statement with every comparison of versions made on `cast(expression)` instead
/// of the unsigned numbers ([`Mutant::TextVersionOrder`], [`Mutant::SignedVersions`]).
fn versions_compared_as(cast: fn(&str) -> String) -> &'static str {
    let (new, old) = (cast("VALUES(task_version)"), cast("task_version"));
    leak(
        Statements::STANDARD
            .upsert_view
            .replace(
                "GREATEST(task_version, VALUES(task_version))",
                &format!("IF({new} > {old}, VALUES(task_version), task_version)"),
            )
            .replace(
                "VALUES(task_version) > task_version",
                &format!("{new} > {old}"),
            )
            .replace(
                "VALUES(task_version) < task_version",
                &format!("{new} < {old}"),
            ),
    )
}

/// The statements a store of mutant `m` runs: the store's own, with the mutant's changes.
/// Built once per process (each leaked string lives as long as the program anyway).
pub fn statements(m: Mutant) -> &'static Statements {
    static MADE: [OnceLock<Statements>; Mutant::ALL.len()] =
        [const { OnceLock::new() }; Mutant::ALL.len()];
    let index = Mutant::ALL.iter().position(|x| *x == m).unwrap_or(0);
    MADE[index].get_or_init(|| {
        let standard = Statements::STANDARD;
        match m {
            // The ignored row is taken for a duplicate, unchecked.
            Mutant::InsertIgnore => Statements {
                insert_inbox: INSERT_INBOX_IGNORE,
                read_verdict: READ_VERDICT_UNCHECKED,
                ..standard
            },
            Mutant::NoDigestCompare => Statements {
                read_verdict: READ_VERDICT_UNCHECKED,
                ..standard
            },
            Mutant::AnyVersion => Statements {
                upsert_view: UPSERT_VIEW_ANY_VERSION,
                ..standard
            },
            Mutant::DuplicateIsError => Statements {
                insert_inbox: INSERT_INBOX_DUPLICATE_FAILS,
                ..standard
            },
            Mutant::NoInboxDedup => Statements {
                insert_inbox: UPSERT_INBOX,
                upsert_view: UPSERT_VIEW_ANY_VERSION,
                ..standard
            },
            // The state parameter is read through a rewrite in the statement itself.
            Mutant::NeedsReviewAsSucceeded => Statements {
                upsert_view: leak(standard.upsert_view.replacen(
                    "VALUES (?, ?, ?, ?, ?, ?, ?,",
                    "VALUES (?, ?, ?, ?, ?, REPLACE(?, 'NEEDS_REVIEW', 'SUCCEEDED'), ?,",
                    1,
                )),
                ..standard
            },
            // "Higher version" becomes "higher version, or this version by this same event".
            Mutant::ReappliesPruned => Statements {
                upsert_view: leak(
                    standard
                        .upsert_view
                        .replace(
                            "IF(VALUES(task_version) > task_version,",
                            "IF(VALUES(task_version) > task_version OR (VALUES(task_version) = task_version AND VALUES(last_event_id) = last_event_id),",
                        ),
                ),
                ..standard
            },
            Mutant::TextVersionOrder => Statements {
                upsert_view: versions_compared_as(|e| format!("CAST({e} AS CHAR)")),
                ..standard
            },
            Mutant::SignedVersions => Statements {
                upsert_view: versions_compared_as(|e| format!("CAST({e} AS SIGNED)")),
                ..standard
            },
            // The result follows any version but the same one.
            Mutant::StaleWritesResult => Statements {
                upsert_view: leak(standard.upsert_view.replace(
                    "last_result = IF(VALUES(task_version) > task_version,",
                    "last_result = IF(VALUES(task_version) <> task_version,",
                )),
                ..standard
            },
            Mutant::NoDigestCompareWhenStale => Statements {
                read_verdict: READ_VERDICT_APPLIED_ONLY,
                ..standard
            },
            Mutant::CutsLargeResults => Statements {
                upsert_view: leak(standard.upsert_view.replacen(
                    "VALUES (?, ?, ?, ?, ?, ?, ?,",
                    "VALUES (?, ?, ?, ?, ?, ?, LEFT(?, 65535),",
                    1,
                )),
                ..standard
            },
            Mutant::ReadOnlyIsFailure => Statements {
                probe_read_only: false,
                ..standard
            },
            Mutant::ClosesWithoutKill => Statements {
                kill_abandoned: false,
                ..standard
            },
            Mutant::LocalTime => Statements {
                insert_inbox: leak(standard.insert_inbox.replace("UTC_TIMESTAMP(6)", "NOW(6)")),
                upsert_view: leak(standard.upsert_view.replace("UTC_TIMESTAMP(6)", "NOW(6)")),
                time_zone: None,
                ..standard
            },
            _ => standard,
        }
    })
}

fn leak(sql: String) -> &'static str {
    Box::leak(sql.into_boxed_str())
}

/// [`Mutant::AsReceived`]'s event: `event` recording the bytes it was parsed from, and their
/// SHA-256, instead of its canonical form. The result keeps its canonical bytes when they
/// appear as such in `raw`; otherwise the view gets none.
pub fn as_received(event: TaskEvent, raw: &[u8]) -> TaskEvent {
    let result = event.result().and_then(|r| {
        raw.windows(r.len())
            .position(|w| w == r)
            .map(|at| at..at + r.len())
    });
    event.with_stored_form(raw.to_vec(), result)
}

/// The event as a mutant's canonical writer would store it ([`Mutant::EscapesNonAscii`],
/// [`Mutant::EscapesSlash`], [`Mutant::KeepsOffset`], [`Mutant::Utf8KeyOrder`]; any other
/// mutant leaves it as it is): the whole event and its result written the mutant's way, the
/// digest that of the mutant's bytes. `raw` is the event as received.
pub fn rewritten(m: Mutant, event: TaskEvent, raw: &[u8]) -> TaskEvent {
    let write = |bytes: &[u8]| -> Vec<u8> {
        match m {
            Mutant::EscapesNonAscii => {
                let text = String::from_utf8_lossy(bytes);
                let mut out = String::with_capacity(text.len() * 2);
                for c in text.chars() {
                    if c.is_ascii() {
                        out.push(c);
                    } else {
                        let mut units = [0u16; 2];
                        for u in c.encode_utf16(&mut units) {
                            out.push_str(&format!("\\u{u:04x}"));
                        }
                    }
                }
                out.into_bytes()
            }
            Mutant::EscapesSlash => String::from_utf8_lossy(bytes)
                .replace('/', "\\/")
                .into_bytes(),
            Mutant::Utf8KeyOrder => {
                let mut out = Vec::with_capacity(bytes.len());
                byte_ordered(bytes, &mut 0, &mut out);
                out
            }
            _ => bytes.to_vec(),
        }
    };
    let mut stored = write(event.canonical());
    if m == Mutant::KeepsOffset {
        let delivered = serde_json::from_slice::<serde_json::Value>(raw)
            .ok()
            .and_then(|v| v.get("occurred_at").map(ToString::to_string));
        let text = String::from_utf8_lossy(&stored).into_owned();
        if let (Some(delivered), Some(at)) = (delivered, text.find("\"occurred_at\":\"")) {
            let value = at + "\"occurred_at\":".len();
            let end = text[value + 1..]
                .find('"')
                .map_or(text.len(), |e| value + e + 2);
            stored = format!("{}{delivered}{}", &text[..value], &text[end..]).into_bytes();
        }
    }
    let result = event.result().map(write).and_then(|r| {
        stored
            .windows(r.len().max(1))
            .position(|w| w == r)
            .map(|at| at..at + r.len())
    });
    event.with_stored_form(stored, result)
}

/// [`Mutant::Utf8KeyOrder`]: the canonical JSON value at `text[*at..]` copied to `out` with
/// every object's members sorted by their names' bytes as written.
fn byte_ordered(text: &[u8], at: &mut usize, out: &mut Vec<u8>) {
    // A string, quotes included, from `*at`.
    fn string(text: &[u8], at: &mut usize) -> std::ops::Range<usize> {
        let start = *at;
        *at += 1;
        while *at < text.len() && text[*at] != b'"' {
            *at += if text[*at] == b'\\' { 2 } else { 1 };
        }
        *at += 1;
        start..(*at).min(text.len())
    }
    match text.get(*at) {
        Some(b'{') => {
            *at += 1;
            let mut members: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            while *at < text.len() && text[*at] != b'}' {
                if text[*at] == b',' {
                    *at += 1;
                }
                let name = text[string(text, at)].to_vec();
                *at += 1; // ':'
                let mut value = Vec::new();
                byte_ordered(text, at, &mut value);
                members.push((name, value));
            }
            *at += 1;
            members.sort();
            out.push(b'{');
            for (i, (name, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend(name);
                out.push(b':');
                out.extend(value);
            }
            out.push(b'}');
        }
        Some(b'[') => {
            *at += 1;
            out.push(b'[');
            while *at < text.len() && text[*at] != b']' {
                if text[*at] == b',' {
                    *at += 1;
                    out.push(b',');
                }
                byte_ordered(text, at, out);
            }
            *at += 1;
            out.push(b']');
        }
        Some(b'"') => {
            let r = string(text, at);
            out.extend_from_slice(&text[r]);
        }
        Some(_) => {
            let start = *at;
            while *at < text.len() && !matches!(text[*at], b',' | b'}' | b']') {
                *at += 1;
            }
            out.extend_from_slice(&text[start..*at]);
        }
        None => {}
    }
}

/// [`crate::schema::init`] for a store of mutant `m`: [`Mutant::CaseInsensitiveIds`] makes the
/// identity columns text of the table's case-insensitive collation.
pub async fn init(
    dsn: &crate::dsn::Dsn,
    m: Option<Mutant>,
) -> Result<crate::schema::InitReport, crate::schema::InitError> {
    let ddl = crate::schema::SCHEMA_SQL;
    match m {
        Some(Mutant::CaseInsensitiveIds) => {
            let ddl = ddl
                .replace("VARBINARY(", "VARCHAR(")
                .replace("COLLATE = utf8mb4_bin", "COLLATE = utf8mb4_general_ci");
            crate::schema::init_from(dsn, &ddl).await
        }
        _ => crate::schema::init(dsn).await,
    }
}
