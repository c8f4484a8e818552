//! A validated task event: the delivered bytes, checked against the configured queue and the
//! platform's rules, with its canonical bytes and digest.
//!
//! A [`TaskEvent`] can only be made by [`TaskEvent::parse`], so the store never sees an event
//! that failed validation (R-STORE-1), and its snapshot is always the delivered event, never
//! something rebuilt from a later task lookup (R-CANON-4).

use std::borrow::Cow;
use std::fmt;

use crate::identity::{EventId, QueueId, TaskId};
use canonical_form::{CanonError, CanonErrorKind, Digest, Document, Member};

/// A task's state as the platform reports it. `NeedsReview` is its own state: a task that a
/// person must look at is never reported as a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    NeedsReview,
}

impl TaskState {
    /// The platform's spelling, which is also what the view stores.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "PENDING",
            TaskState::Running => "RUNNING",
            TaskState::Succeeded => "SUCCEEDED",
            TaskState::Failed => "FAILED",
            TaskState::Cancelled => "CANCELLED",
            TaskState::NeedsReview => "NEEDS_REVIEW",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "PENDING" => TaskState::Pending,
            "RUNNING" => TaskState::Running,
            "SUCCEEDED" => TaskState::Succeeded,
            "FAILED" => TaskState::Failed,
            "CANCELLED" => TaskState::Cancelled,
            "NEEDS_REVIEW" => TaskState::NeedsReview,
            _ => return None,
        })
    }

    /// Whether an event in this state may carry a `result`.
    pub fn allows_result(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::NeedsReview
        )
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every event type the platform emits, and the one state each must carry.
pub const EVENT_TYPES: &[(&str, TaskState)] = &[
    ("task.submitted", TaskState::Pending),
    ("task.started", TaskState::Running),
    ("task.succeeded", TaskState::Succeeded),
    ("task.failed", TaskState::Failed),
    ("task.cancelled", TaskState::Cancelled),
    ("task.needs_review", TaskState::NeedsReview),
];

/// Why a delivered event was refused. The kinds of the canonical form come first; the rest are
/// about the event's fields. Each has a stable [`Rejection::kind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// The bytes are not a canonical-form document.
    Form(CanonError),
    /// A required member is absent.
    MissingField(&'static str),
    /// A member has the wrong JSON type or an unusable value.
    InvalidField(&'static str, String),
    /// The event came from another queue than the one this receiver is configured for.
    QueueMismatch,
    /// `task_version` is not an integer from 1 to 2^64 − 1.
    InvalidVersion,
    /// `type` is not one the platform emits.
    UnknownType,
    /// `state` is not the one `type` requires.
    StateMismatch { event_type: &'static str },
    /// A `result` on an event whose state allows none.
    ResultNotAllowed(TaskState),
}

impl Rejection {
    /// The stable lowercase kind: one of the canonical-form kinds (`duplicate_key`, …) or
    /// `missing_field`, `invalid_field`, `queue_mismatch`, `invalid_version`, `unknown_type`,
    /// `state_mismatch`, `result_not_allowed`.
    pub fn kind(&self) -> &'static str {
        match self {
            Rejection::Form(e) => e.kind().as_str(),
            Rejection::MissingField(_) => "missing_field",
            Rejection::InvalidField(..) => "invalid_field",
            Rejection::QueueMismatch => "queue_mismatch",
            Rejection::InvalidVersion => "invalid_version",
            Rejection::UnknownType => "unknown_type",
            Rejection::StateMismatch { .. } => "state_mismatch",
            Rejection::ResultNotAllowed(_) => "result_not_allowed",
        }
    }

    /// The canonical-form kind, when that is why the event was refused.
    pub fn form_kind(&self) -> Option<CanonErrorKind> {
        match self {
            Rejection::Form(e) => Some(e.kind()),
            _ => None,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Form(e) => write!(f, "{e}"),
            Rejection::MissingField(name) => write!(f, "missing_field: `{name}` is required"),
            Rejection::InvalidField(name, why) => write!(f, "invalid_field: `{name}` {why}"),
            Rejection::QueueMismatch => f.write_str(
                "queue_mismatch: the event's queue_id is not the queue this receiver consumes",
            ),
            Rejection::InvalidVersion => f.write_str(
                "invalid_version: `task_version` must be an integer from 1 to 18446744073709551615",
            ),
            Rejection::UnknownType => {
                f.write_str("unknown_type: `type` is not an event type the platform emits")
            }
            Rejection::StateMismatch { event_type } => write!(
                f,
                "state_mismatch: a {event_type} event must carry state {}",
                EVENT_TYPES
                    .iter()
                    .find(|(t, _)| t == event_type)
                    .map_or("?", |(_, s)| s.as_str())
            ),
            Rejection::ResultNotAllowed(state) => write!(
                f,
                "result_not_allowed: an event in state {state} carries no result"
            ),
        }
    }
}

impl std::error::Error for Rejection {}

/// An event refused by [`TaskEvent::parse`]: why, and its id when the envelope's `id` could
/// be read as one (so that a log line can name the event without reading it again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub event_id: Option<EventId>,
    pub rejection: Rejection,
}

impl Rejected {
    /// The rejection's stable kind ([`Rejection::kind`]).
    pub fn kind(&self) -> &'static str {
        self.rejection.kind()
    }
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.rejection.fmt(f)
    }
}

impl std::error::Error for Rejected {}

impl From<CanonError> for Rejection {
    fn from(e: CanonError) -> Self {
        Rejection::Form(e)
    }
}

/// A delivered task event that passed validation, with its frozen canonical bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct TaskEvent {
    pub(crate) id: EventId,
    pub(crate) event_type: &'static str,
    pub(crate) queue: QueueId,
    pub(crate) task: TaskId,
    pub(crate) version: u64,
    pub(crate) state: TaskState,
    /// Where the `result` lies in `canonical`.
    pub(crate) result: Option<std::ops::Range<usize>>,
    pub(crate) canonical: Vec<u8>,
    pub(crate) digest: Digest,
}

fn string_member<'d>(doc: &'d Document, name: &'static str) -> Result<Cow<'d, str>, Rejection> {
    match doc.get(name) {
        None => Err(Rejection::MissingField(name)),
        Some(Member::String(s)) => Ok(s),
        Some(_) => Err(Rejection::InvalidField(name, "must be a string".into())),
    }
}

impl TaskEvent {
    /// Validates `raw` as an event of `queue`: the canonical form (R-CANON-2, R-CANON-3), then
    /// the fields (R-CANON-1). Nothing else is consulted. A refusal names the event's id when
    /// the envelope's `id` could be read as one.
    pub fn parse(raw: &[u8], queue: &QueueId) -> Result<Self, Rejected> {
        let doc = Document::parse(raw).map_err(|e| Rejected {
            event_id: None,
            rejection: e.into(),
        })?;
        let event_id = match doc.get("id") {
            Some(Member::String(id)) => EventId::new(id.into_owned()).ok(),
            _ => None,
        };
        Self::validate(doc, queue).map_err(|rejection| Rejected {
            event_id,
            rejection,
        })
    }

    /// The fields of a canonical-form document, checked (R-CANON-1).
    fn validate(doc: Document, queue: &QueueId) -> Result<Self, Rejection> {
        let id = EventId::new(string_member(&doc, "id")?.into_owned())
            .map_err(|e| Rejection::InvalidField("id", e.to_string()))?;
        let type_text = string_member(&doc, "type")?;
        let namespace = string_member(&doc, "namespace")?;
        if namespace.is_empty() {
            return Err(Rejection::InvalidField("namespace", "is empty".into()));
        }
        let queue_text = string_member(&doc, "queue_id")?;
        let task = TaskId::new(string_member(&doc, "task_id")?.into_owned())
            .map_err(|e| Rejection::InvalidField("task_id", e.to_string()))?;
        // Presence only: the canonical form already checked and normalised it.
        string_member(&doc, "occurred_at")?;
        let version = match doc.get("task_version") {
            None => return Err(Rejection::MissingField("task_version")),
            Some(Member::Number(n)) => parse_version(n).ok_or(Rejection::InvalidVersion)?,
            Some(_) => return Err(Rejection::InvalidVersion),
        };
        let state_text = string_member(&doc, "state")?;

        if *queue_text != *queue.as_str() {
            return Err(Rejection::QueueMismatch);
        }
        let (event_type, required) = EVENT_TYPES
            .iter()
            .find(|(t, _)| *t == type_text.as_ref())
            .copied()
            .ok_or(Rejection::UnknownType)?;
        let state = TaskState::parse(&state_text)
            .filter(|s| *s == required)
            .ok_or(Rejection::StateMismatch { event_type })?;
        // `"result": null` means no result, exactly like an absent member.
        let has_result = match doc.get("result") {
            None | Some(Member::Null) => false,
            Some(_) if state.allows_result() => true,
            Some(_) => return Err(Rejection::ResultNotAllowed(state)),
        };

        // The result's canonical bytes are a slice of the event's, never a copy.
        let result = if has_result { doc.span("result") } else { None };
        let canonical = doc.into_canonical();
        let digest = Digest::of(&canonical);
        Ok(TaskEvent {
            id,
            event_type,
            queue: queue.clone(),
            task,
            version,
            state,
            result,
            canonical,
            digest,
        })
    }

    /// The event id.
    pub fn id(&self) -> &EventId {
        &self.id
    }
    /// The event type, e.g. `task.cancelled`.
    pub fn event_type(&self) -> &'static str {
        self.event_type
    }
    /// The queue it came from (always the configured one).
    pub fn queue(&self) -> &QueueId {
        &self.queue
    }
    /// The task it is about.
    pub fn task(&self) -> &TaskId {
        &self.task
    }
    /// The task version it reports (≥ 1).
    pub fn version(&self) -> u64 {
        self.version
    }
    /// The task state it reports.
    pub fn state(&self) -> TaskState {
        self.state
    }
    /// The canonical bytes of its `result`, if it has one.
    pub fn result(&self) -> Option<&[u8]> {
        self.result.clone().map(|r| &self.canonical[r])
    }
    /// The canonical bytes of the whole event: what the inbox stores and hashes.
    pub fn canonical(&self) -> &[u8] {
        &self.canonical
    }
    /// SHA-256 of [`TaskEvent::canonical`].
    pub fn digest(&self) -> Digest {
        self.digest
    }
}

/// Ids, version and state only: an event's body and result are never printed.
impl fmt::Debug for TaskEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskEvent")
            .field("id", &self.id)
            .field("type", &self.event_type)
            .field("task", &self.task)
            .field("version", &self.version)
            .field("state", &self.state)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

/// `[1-9][0-9]*` within `u64`: no sign, fraction, exponent or leading zero.
fn parse_version(text: &str) -> Option<u64> {
    if text.starts_with('0') || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> QueueId {
        QueueId::new("inbox-demo").unwrap()
    }

    fn event(fields: &str) -> String {
        format!(
            r#"{{"id":"evt-1","namespace":"default","queue_id":"inbox-demo","task_id":"t-1","occurred_at":"2026-12-02T14:17:05Z",{fields}}}"#
        )
    }

    fn parse(fields: &str) -> Result<TaskEvent, Rejection> {
        TaskEvent::parse(event(fields).as_bytes(), &queue()).map_err(|r| r.rejection)
    }

    #[test]
    fn every_type_with_its_state_is_accepted() {
        for (t, s) in EVENT_TYPES {
            let e = parse(&format!(r#""type":"{t}","state":"{s}","task_version":3"#)).unwrap();
            assert_eq!(e.state(), *s);
            assert_eq!(e.event_type(), *t);
            assert_eq!(e.version(), 3);
            assert_eq!(e.result(), None);
        }
    }

    #[test]
    fn every_type_with_another_state_is_refused() {
        for (t, s) in EVENT_TYPES {
            for (_, other) in EVENT_TYPES.iter().filter(|(_, o)| o != s) {
                let r = parse(&format!(
                    r#""type":"{t}","state":"{other}","task_version":1"#
                ));
                assert_eq!(r.unwrap_err().kind(), "state_mismatch", "{t} with {other}");
            }
        }
    }

    #[test]
    fn needs_review_stays_needs_review_and_keeps_its_result() {
        let e = parse(r#""type":"task.needs_review","state":"NEEDS_REVIEW","task_version":2,"result":{"b":1.50,"a":123456789012345678901234567890}"#).unwrap();
        assert_eq!(e.state(), TaskState::NeedsReview);
        assert_eq!(e.state().as_str(), "NEEDS_REVIEW");
        assert_eq!(
            e.result(),
            Some(&br#"{"a":123456789012345678901234567890,"b":1.50}"#[..])
        );
    }

    #[test]
    fn results_only_where_the_state_allows() {
        let r = parse(
            r#""type":"task.cancelled","state":"CANCELLED","task_version":2,"result":{"x":1}"#,
        );
        assert_eq!(r.unwrap_err().kind(), "result_not_allowed");
        let ok =
            parse(r#""type":"task.cancelled","state":"CANCELLED","task_version":2,"result":null"#)
                .unwrap();
        assert_eq!(ok.result(), None);
        let failed =
            parse(r#""type":"task.failed","state":"FAILED","task_version":2,"result":"boom""#)
                .unwrap();
        assert_eq!(failed.result(), Some(&b"\"boom\""[..]));
    }

    #[test]
    fn versions() {
        for bad in [
            "0",
            "-1",
            "1.0",
            "1e2",
            "-0",
            "18446744073709551616",
            "\"2\"",
        ] {
            let r = parse(&format!(
                r#""type":"task.cancelled","state":"CANCELLED","task_version":{bad}"#
            ));
            assert_eq!(r.unwrap_err().kind(), "invalid_version", "{bad}");
        }
        let max = parse(
            r#""type":"task.cancelled","state":"CANCELLED","task_version":18446744073709551615"#,
        )
        .unwrap();
        assert_eq!(max.version(), u64::MAX);
    }

    #[test]
    fn field_rejections_have_their_kinds() {
        let base = r#""type":"task.cancelled","state":"CANCELLED","task_version":1"#;
        let cases: &[(&str, &str)] = &[
            (r#"{"id":"e","type":"task.cancelled"}"#, "missing_field"),
            (
                &event(r#""type":"task.exploded","state":"CANCELLED","task_version":1"#),
                "unknown_type",
            ),
            (
                &event(r#""type":"task.cancelled","state":"cancelled","task_version":1"#),
                "state_mismatch",
            ),
            (
                &event(base).replace(r#""id":"evt-1""#, r#""id":7"#),
                "invalid_field",
            ),
            (
                &event(base).replace(r#""id":"evt-1""#, r#""id":"""#),
                "invalid_field",
            ),
            (
                &event(base).replace("inbox-demo", "other-queue"),
                "queue_mismatch",
            ),
            (
                &event(base).replace("inbox-demo", "INBOX-DEMO"),
                "queue_mismatch",
            ),
            (
                &event(base).replace("2026-12-02T14:17:05Z", "yesterday"),
                "invalid_timestamp",
            ),
            (r#"{"a":1,"a":1}"#, "duplicate_key"),
            // The envelope rules of docs/canonical-json.md: C1 controls count as controls, an
            // empty namespace is refused, and the first failing rule decides.
            (
                &event(base).replace(r#""id":"evt-1""#, r#""id":"evt\u0085""#),
                "invalid_field",
            ),
            (
                &event(base).replace(r#""task_id":"t-1""#, r#""task_id":"t\u007f""#),
                "invalid_field",
            ),
            (
                &event(base).replace(r#""namespace":"default""#, r#""namespace":"""#),
                "invalid_field",
            ),
            (
                &event(r#""type":"task.cancelled","state":"CANCELLED","task_version":01"#),
                "invalid_json",
            ),
            (
                &event(r#""type":"task.cancelled","state":"CANCELLED","task_version":1.0"#),
                "invalid_version",
            ),
            (
                &event(r#""type":"task.exploded","state":"CANCELLED","task_version":0"#)
                    .replace("inbox-demo", "other-queue"),
                "invalid_version",
            ),
            (
                &event(r#""type":"task.exploded","state":"PENDING","task_version":1"#)
                    .replace("inbox-demo", "other-queue"),
                "queue_mismatch",
            ),
        ];
        for (input, kind) in cases {
            let r = TaskEvent::parse(input.as_bytes(), &queue());
            assert_eq!(r.unwrap_err().kind(), *kind, "{input}");
        }
    }

    #[test]
    fn a_refusal_names_the_event_when_its_id_can_be_read() {
        let unknown = event(r#""type":"task.exploded","state":"CANCELLED","task_version":1"#);
        let refused = TaskEvent::parse(unknown.as_bytes(), &queue()).unwrap_err();
        assert_eq!(refused.kind(), "unknown_type");
        assert_eq!(
            refused.event_id.as_ref().map(EventId::as_str),
            Some("evt-1")
        );
        // Not JSON: no id to read. An id that is not a valid id: not repeated.
        let broken = TaskEvent::parse(b"{\"id\":\"evt-1\",", &queue()).unwrap_err();
        assert_eq!(broken.event_id, None);
        let bad_id = unknown.replace("evt-1", "evt 1\\u0000");
        assert_eq!(
            TaskEvent::parse(bad_id.as_bytes(), &queue())
                .unwrap_err()
                .event_id,
            None
        );
    }

    #[test]
    fn occurred_at_is_stored_in_utc() {
        let raw = event(r#""type":"task.cancelled","state":"CANCELLED","task_version":1"#)
            .replace("2026-12-02T14:17:05Z", "2026-12-02T22:17:05.250+08:00");
        let e = TaskEvent::parse(raw.as_bytes(), &queue()).unwrap();
        let text = std::str::from_utf8(e.canonical()).unwrap();
        assert!(
            text.contains(r#""occurred_at":"2026-12-02T14:17:05.25Z""#),
            "{text}"
        );
    }

    #[test]
    fn debug_never_shows_the_result() {
        let e = parse(r#""type":"task.succeeded","state":"SUCCEEDED","task_version":2,"result":{"secret":"hunter2"}"#).unwrap();
        let shown = format!("{e:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("evt-1"), "{shown}");
    }
}
