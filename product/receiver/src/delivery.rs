//! What the receiver does with one delivered event, and how it names the result: the stable
//! classification in every log line, and whether the SDK may ACK.

use std::fmt;

use result_inbox::store::NoWrite;
use result_inbox::ApplyError;
use result_inbox::{Outcome, QueueId, Store, TaskEvent};
use tokio::time::Instant;

/// The stable name of what happened to a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classification {
    Applied,
    Duplicate,
    Stale,
    Conflict,
    /// With the rejection kind, e.g. `rejected:duplicate_key`.
    Rejected(&'static str),
    CommitUnconfirmed,
    /// Committed on a primary whose commits no replica acknowledges
    /// (`RECEIVER_REQUIRE_REPLICA_ACK`): not ACKed.
    Unreplicated,
    StorageError,
    Timeout,
    WriteFailed,
    /// Another program's event (the demo accepts only its own task).
    Foreign,
}

impl Classification {
    /// Whether the delivery may be ACKed: only when the event is safely recorded.
    pub fn acks(&self) -> bool {
        matches!(
            self,
            Classification::Applied | Classification::Duplicate | Classification::Stale
        )
    }

    /// Classifies the result of an apply.
    pub fn of(result: &Result<Outcome, ApplyError>) -> Classification {
        match result {
            Ok(Outcome::Applied) => Classification::Applied,
            Ok(Outcome::Duplicate { .. }) => Classification::Duplicate,
            Ok(Outcome::Stale) => Classification::Stale,
            Err(ApplyError::Rejected(r)) => Classification::Rejected(r.kind()),
            Err(ApplyError::Conflict(_)) => Classification::Conflict,
            Err(ApplyError::CommitUnconfirmed) => Classification::CommitUnconfirmed,
            Err(ApplyError::Unreplicated(_)) => Classification::Unreplicated,
            Err(ApplyError::Storage(_)) => Classification::StorageError,
            Err(ApplyError::Timeout(_)) => Classification::Timeout,
            Err(ApplyError::Write(_)) => Classification::WriteFailed,
        }
    }
}

impl fmt::Display for Classification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Classification::Applied => f.write_str("applied"),
            Classification::Duplicate => f.write_str("duplicate"),
            Classification::Stale => f.write_str("stale"),
            Classification::Conflict => f.write_str("conflict"),
            Classification::Rejected(kind) => write!(f, "rejected:{kind}"),
            Classification::CommitUnconfirmed => f.write_str("commit_unconfirmed"),
            Classification::Unreplicated => f.write_str("unreplicated"),
            Classification::StorageError => f.write_str("storage_error"),
            Classification::Timeout => f.write_str("timeout"),
            Classification::WriteFailed => f.write_str("write_failed"),
            Classification::Foreign => f.write_str("foreign"),
        }
    }
}

/// The failure a handler hands the SDK for a delivery it must not ACK: what happened to it.
/// It comes back, as this type, in the SDK's `HandlerFailed` event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not acked: {0}")]
pub struct NotAcked(pub Classification);

/// One handled delivery: its classification, the event id when it could be read, the
/// transactions restarted inside the apply, and the redacted reason when it is not ACKed.
#[derive(Debug, Clone)]
pub struct Handled {
    pub classification: Classification,
    pub event_id: Option<String>,
    /// The restarts by reason (`receiver_apply_retries_total{reason}`; their total is the log
    /// line's `retries`).
    pub reasons: result_inbox::Retries,
    pub detail: Option<String>,
    /// The failure may mean the database as a whole is unavailable or not answering (not
    /// just this transaction): worth a probe before taking more deliveries.
    pub suspect_database: bool,
    /// Nothing of the apply is in doubt (it rolled back, or it committed and only a
    /// replica's acknowledgement is missing), so the delivery may be handed back unattempted
    /// if a probe confirms that the database cannot serve now. Never after a COMMIT without
    /// an answer.
    pub releasable: bool,
}

impl Handled {
    /// The delivery's one log line: classification, event id, delivery id, attempt, retries
    /// inside the apply, duration; for a delivery not ACKed also the (redacted) reason.
    pub fn log(&self, delivery_id: &str, attempt: u32, duration_ms: u64) {
        let event_id = self.event_id.as_deref().unwrap_or("-");
        let c = self.classification.to_string();
        let retries = self.reasons.total();
        if self.classification.acks() {
            tracing::info!(classification = %c, event_id, delivery_id, attempt, retries, duration_ms, "delivery");
        } else {
            let detail = self.detail.as_deref().unwrap_or("");
            tracing::warn!(classification = %c, event_id, delivery_id, attempt, retries, duration_ms, detail, "delivery not acked");
        }
    }

    fn without_apply(
        classification: Classification,
        event_id: Option<String>,
        detail: String,
    ) -> Handled {
        Handled {
            classification,
            event_id,
            reasons: Default::default(),
            detail: Some(detail),
            suspect_database: false,
            releasable: false,
        }
    }
}

/// What a rejected delivery's line says after the reason: the same bytes come again on every
/// attempt, so waiting for a redelivery is pointless.
pub const REDELIVERY_CANNOT_HELP: &str =
    "redelivery cannot help: the event itself is refused; see docs/operations.md, Deliveries that can never apply";

/// Validates `raw` for `queue`, or says why not (with the event id when it can be read).
pub fn parse(raw: &[u8], queue: &QueueId) -> Result<TaskEvent, Handled> {
    TaskEvent::parse(raw, queue).map_err(|refused| {
        Handled::without_apply(
            Classification::Rejected(refused.kind()),
            refused
                .event_id
                .map(|id| id.as_str().to_owned())
                .or_else(|| envelope_id(raw)),
            format!("{}; {REDELIVERY_CANNOT_HELP}", refused.rejection),
        )
    })
}

/// The envelope's `id` of an event the canonical form refused before any field was read,
/// read leniently (the other members are skipped unchecked), so that the log line names the
/// event an operator will look for: a result with a member named twice still has a readable
/// id. `None` when the document is not JSON, names `id` twice, or its id is not a valid one.
fn envelope_id(raw: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        id: Option<String>,
    }
    let envelope: Envelope = serde_json::from_slice(raw).ok()?;
    let id = result_inbox::EventId::new(envelope.id?).ok()?;
    Some(id.as_str().to_owned())
}

impl Handled {
    /// How to report the result of applying `event`, after the restarts `reasons` counts
    /// inside the apply.
    pub fn of(
        event: &TaskEvent,
        result: &Result<Outcome, ApplyError>,
        reasons: result_inbox::Retries,
    ) -> Handled {
        Handled::of_id(event.id().to_string(), result, reasons)
    }

    /// [`Handled::of`] for the event whose id is `event_id`.
    pub fn of_id(
        event_id: String,
        result: &Result<Outcome, ApplyError>,
        reasons: result_inbox::Retries,
    ) -> Handled {
        let suspect_database = match result {
            Err(ApplyError::Storage(e)) => e.is_unavailable(),
            // No answer within the budget: a stopped server looks like this (so does a lock
            // held elsewhere, which a probe tells apart).
            Err(
                ApplyError::Timeout(_)
                | ApplyError::CommitUnconfirmed
                | ApplyError::Unreplicated(_),
            ) => true,
            _ => false,
        };
        let releasable = suspect_database && !matches!(result, Err(ApplyError::CommitUnconfirmed));
        Handled {
            classification: Classification::of(result),
            event_id: Some(event_id),
            reasons,
            detail: result.as_ref().err().map(|e| e.to_string()),
            suspect_database,
            releasable,
        }
    }
}

/// Applies `event` (finishing by `deadline` when that is sooner than the store's budget);
/// the outcome and how to report it.
pub async fn apply(
    store: &Store,
    event: &TaskEvent,
    deadline: Option<Instant>,
) -> (Option<Outcome>, Handled) {
    let applied = store.apply_until(event, &NoWrite, deadline).await;
    let handled = Handled::of(event, &applied.result, applied.reasons);
    (applied.result.ok(), handled)
}

/// Validates `raw` for the store's queue and applies it; the outcome (none when the event
/// was refused or the apply failed) and how to report it.
pub async fn apply_raw(
    store: &Store,
    raw: &[u8],
    deadline: Option<Instant>,
) -> (Option<Outcome>, Handled) {
    match parse(raw, store.queue()) {
        Ok(event) => apply(store, &event, deadline).await,
        Err(rejected) => (None, rejected),
    }
}

/// The rejection for an event that is not this program's.
pub fn foreign(event: &TaskEvent) -> Handled {
    Handled::without_apply(
        Classification::Foreign,
        Some(event.id().to_string()),
        format!(
            "the event is for task {}, not this program's task; not ACKed",
            event.task()
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use result_inbox::{ApplyError, Conflict, Digest, Outcome, QueueId, StorageError, TaskEvent};

    use super::*;

    #[test]
    fn a_refusal_of_the_canonical_form_still_names_the_event_when_its_envelope_has_an_id() {
        let queue = QueueId::new("inbox-demo").unwrap();
        let event = |id: &str| {
            format!(
                r#"{{"id":{id},"type":"task.succeeded","namespace":"default","queue_id":"inbox-demo","task_id":"t-1","task_version":3,"state":"SUCCEEDED","occurred_at":"2026-12-02T14:17:05Z","result":{{"n":1,"n":2}}}}"#
            )
        };
        let refused = parse(event(r#""evt-1""#).as_bytes(), &queue).unwrap_err();
        assert_eq!(
            refused.classification,
            Classification::Rejected("duplicate_key")
        );
        assert_eq!(refused.event_id.as_deref(), Some("evt-1"));
        // `id` named twice, or not a valid id, or not JSON: nothing to name.
        let twice = event(r#""evt-1","id":"evt-2""#);
        assert_eq!(parse(twice.as_bytes(), &queue).unwrap_err().event_id, None);
        let bad = event(concat!("\"evt 1", '\u{0}', "\""));
        assert_eq!(parse(bad.as_bytes(), &queue).unwrap_err().event_id, None);
        assert_eq!(parse(b"{\"id\":", &queue).unwrap_err().event_id, None);
    }

    /// A writer into a shared buffer, for capturing log lines.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn queue() -> QueueId {
        QueueId::new("inbox-demo").unwrap()
    }

    fn event(task: &str) -> TaskEvent {
        let text = format!(
            r#"{{"id":"evt-1","type":"task.cancelled","namespace":"default","queue_id":"inbox-demo","task_id":"{task}","task_version":2,"state":"CANCELLED","occurred_at":"2026-12-02T14:17:05Z"}}"#
        );
        TaskEvent::parse(text.as_bytes(), &queue()).unwrap()
    }

    /// Every classification, each made the way the receiver makes it: from a real apply
    /// result, a real rejection, or the demo's foreign-event check.
    fn every_case() -> Vec<Handled> {
        let e = event("t-1");
        let result = |r: Result<Outcome, ApplyError>| Handled::of(&e, &r, Default::default());
        let write_error: result_inbox::store::WriteError = "the ledger refused it".into();
        let cases = vec![
            Handled::of(
                &e,
                &Ok(Outcome::Applied),
                [result_inbox::RetryReason::Deadlock; 2]
                    .into_iter()
                    .collect(),
            ),
            result(Ok(Outcome::Duplicate { applied: true })),
            result(Ok(Outcome::Stale)),
            result(Err(ApplyError::Conflict(Conflict::DigestMismatch {
                stored: Digest([0xab; 32]),
                delivered: Digest([0xcd; 32]),
            }))),
            parse(br#"{"id":"evt-1","id":"evt-2"}"#, &queue()).unwrap_err(),
            result(Err(ApplyError::CommitUnconfirmed)),
            result(Err(ApplyError::Unreplicated(Outcome::Applied))),
            result(Err(ApplyError::Storage(StorageError::from_sqlx(
                &sqlx::Error::PoolTimedOut,
            )))),
            result(Err(ApplyError::Timeout(Duration::from_secs(5)))),
            result(Err(ApplyError::Write(write_error))),
            foreign(&event("t-2")),
        ];
        // Every variant once: a new classification fails to compile here until it has a case.
        let mut seen = Vec::new();
        for h in &cases {
            let n = match h.classification {
                Classification::Applied => 0,
                Classification::Duplicate => 1,
                Classification::Stale => 2,
                Classification::Conflict => 3,
                Classification::Rejected(_) => 4,
                Classification::CommitUnconfirmed => 5,
                Classification::Unreplicated => 6,
                Classification::StorageError => 7,
                Classification::Timeout => 8,
                Classification::WriteFailed => 9,
                Classification::Foreign => 10,
            };
            seen.push(n);
        }
        assert_eq!(seen, (0..11).collect::<Vec<_>>());
        cases
    }

    #[test]
    fn only_recorded_outcomes_ack() {
        let acks: Vec<String> = every_case()
            .iter()
            .filter(|h| h.classification.acks())
            .map(|h| h.classification.to_string())
            .collect();
        assert_eq!(acks, ["applied", "duplicate", "stale"]);
    }

    #[test]
    fn a_refused_event_names_its_id_when_it_can_be_read() {
        // Well-formed, with a valid id, refused for its type: the id is logged.
        let h = parse(
            br#"{"id":"evt-9","type":"task.unknown","namespace":"default","queue_id":"inbox-demo","task_id":"t","task_version":1,"state":"SUCCEEDED","occurred_at":"2026-12-02T14:17:05Z"}"#,
            &queue(),
        )
        .unwrap_err();
        assert_eq!(h.classification, Classification::Rejected("unknown_type"));
        assert_eq!(h.event_id.as_deref(), Some("evt-9"));
        assert!(h.detail.unwrap().ends_with(REDELIVERY_CANNOT_HELP));
        // Not JSON, or an id that is no event id (a control character): nothing is logged.
        for raw in [&br#"{"id":"evt-9","#[..], br#"{"id":"evtx","type":1}"#] {
            assert_eq!(parse(raw, &queue()).unwrap_err().event_id, None);
        }
    }

    #[test]
    fn one_log_line_per_classification() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_target(false)
            .with_ansi(false)
            .without_time()
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for h in every_case() {
                h.log("d-1", 2, 7);
            }
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        insta::assert_snapshot!(text);
    }
}
