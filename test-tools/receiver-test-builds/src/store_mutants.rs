//! The storage mutants: each breaks one rule through the statements the store runs, the
//! schema `init` makes, or the bytes an event is recorded with. Installed through the core's
//! seam (`result_inbox::seam`): the one-event transaction has no branch for any of them; the
//! group apply has one for each group rule a mutant breaks ([`GroupRule`]).

use result_inbox::seam::{self, GroupRule, StatementTable};
use result_inbox::TaskEvent;
use seam_names::Mutant;

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
        StatementTable::standard()
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

/// The statements a store of mutant `m` runs: the store's own, with the mutant's changes
/// (each leaked string lives as long as the program anyway).
pub fn statements(m: Mutant) -> StatementTable {
    let standard = StatementTable::standard();
    {
        match m {
            // The ignored row is taken for a duplicate, unchecked.
            Mutant::InsertIgnore => StatementTable {
                insert_inbox: INSERT_INBOX_IGNORE,
                read_verdict: READ_VERDICT_UNCHECKED,
                ..standard
            },
            Mutant::NoDigestCompare => StatementTable {
                read_verdict: READ_VERDICT_UNCHECKED,
                ..standard
            },
            Mutant::AnyVersion => StatementTable {
                upsert_view: UPSERT_VIEW_ANY_VERSION,
                ..standard
            },
            Mutant::DuplicateIsError => StatementTable {
                insert_inbox: INSERT_INBOX_DUPLICATE_FAILS,
                ..standard
            },
            Mutant::NoInboxDedup => StatementTable {
                insert_inbox: UPSERT_INBOX,
                upsert_view: UPSERT_VIEW_ANY_VERSION,
                ..standard
            },
            // The state parameter is read through a rewrite in the statement itself.
            Mutant::NeedsReviewAsSucceeded => StatementTable {
                upsert_view: leak(standard.upsert_view.replacen(
                    "VALUES (?, ?, ?, ?, ?, ?, ?,",
                    "VALUES (?, ?, ?, ?, ?, REPLACE(?, 'NEEDS_REVIEW', 'SUCCEEDED'), ?,",
                    1,
                )),
                ..standard
            },
            // "Higher version" becomes "higher version, or this version by this same event".
            Mutant::ReappliesPruned => StatementTable {
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
            Mutant::TextVersionOrder => StatementTable {
                upsert_view: versions_compared_as(|e| format!("CAST({e} AS CHAR)")),
                ..standard
            },
            Mutant::SignedVersions => StatementTable {
                upsert_view: versions_compared_as(|e| format!("CAST({e} AS SIGNED)")),
                ..standard
            },
            // The result follows any version but the same one.
            Mutant::StaleWritesResult => StatementTable {
                upsert_view: leak(standard.upsert_view.replace(
                    "last_result = IF(VALUES(task_version) > task_version,",
                    "last_result = IF(VALUES(task_version) <> task_version,",
                )),
                ..standard
            },
            Mutant::NoDigestCompareWhenStale => StatementTable {
                read_verdict: READ_VERDICT_APPLIED_ONLY,
                ..standard
            },
            Mutant::CutsLargeResults => StatementTable {
                upsert_view: leak(standard.upsert_view.replacen(
                    "VALUES (?, ?, ?, ?, ?, ?, ?,",
                    "VALUES (?, ?, ?, ?, ?, ?, LEFT(?, 65535),",
                    1,
                )),
                ..standard
            },
            Mutant::ReadOnlyIsFailure => StatementTable {
                probe_read_only: false,
                ..standard
            },
            Mutant::ClosesWithoutKill => StatementTable {
                kill_abandoned: false,
                ..standard
            },
            Mutant::GroupInArrivalOrder => StatementTable {
                group_rule: GroupRule::ArrivalOrder,
                ..standard
            },
            Mutant::AcksPartlyCommittedGroup => StatementTable {
                group_rule: GroupRule::AnswersAsCommitted,
                ..standard
            },
            Mutant::FallbackAppliesTwice => StatementTable {
                group_rule: GroupRule::RestTwice,
                ..standard
            },
            Mutant::LocalTime | Mutant::SessionOnFirstConnection => StatementTable {
                insert_inbox: leak(standard.insert_inbox.replace("UTC_TIMESTAMP(6)", "NOW(6)")),
                upsert_view: leak(standard.upsert_view.replace("UTC_TIMESTAMP(6)", "NOW(6)")),
                time_zone: None,
                ..standard
            },
            _ => standard,
        }
    }
}

/// Whether mutant `m` changes a statement of the one-event apply (the inbox row, the view, the
/// verdict read) or the session's time zone. A group's transaction builds its statements
/// apart, so such a mutant is run one delivery a transaction: otherwise its broken statement
/// runs only when a delivery happens to be applied alone, and whether the kit catches it
/// depends on timing.
pub fn changes_the_one_event_apply(m: Mutant) -> bool {
    let (s, standard) = (statements(m), StatementTable::standard());
    s.insert_inbox != standard.insert_inbox
        || s.upsert_view != standard.upsert_view
        || s.read_verdict != standard.read_verdict
        || s.time_zone != standard.time_zone
}

/// Installs mutant `m`'s statements for every store of this process.
pub fn install(m: Mutant) {
    if let Err(e) = seam::install_statements(statements(m)) {
        eprintln!("receiver-mutant: {e}");
        std::process::exit(2);
    }
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
    seam::with_stored_form(event, raw.to_vec(), result)
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
    seam::with_stored_form(event, stored, result)
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

/// `receiver init` for a store of mutant `m`: [`Mutant::CaseInsensitiveIds`] makes the
/// identity columns text of the table's case-insensitive collation.
pub async fn init(
    dsn: &result_inbox::Dsn,
    m: Option<Mutant>,
) -> Result<result_inbox::schema::InitReport, result_inbox::schema::InitError> {
    let ddl = result_inbox::schema::SCHEMA_SQL;
    match m {
        Some(Mutant::CaseInsensitiveIds) => {
            let ddl = ddl
                .replace("VARBINARY(", "VARCHAR(")
                .replace("COLLATE = utf8mb4_bin", "COLLATE = utf8mb4_general_ci");
            seam::init_from(dsn, &ddl).await
        }
        _ => result_inbox::schema::init(dsn).await,
    }
}
