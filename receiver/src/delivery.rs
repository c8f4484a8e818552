//! What the receiver does with one delivered event, and how it names the result: the stable
//! classification in every log line, and whether the SDK may ACK.

use std::fmt;

use crate::store::ApplyError;
use crate::{Outcome, QueueId, Store, TaskEvent};

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
            Classification::StorageError => f.write_str("storage_error"),
            Classification::Timeout => f.write_str("timeout"),
            Classification::WriteFailed => f.write_str("write_failed"),
            Classification::Foreign => f.write_str("foreign"),
        }
    }
}

/// One handled delivery: its classification, the event id when it could be read, and the
/// redacted reason when it is not ACKed.
#[derive(Debug, Clone)]
pub struct Handled {
    pub classification: Classification,
    pub event_id: Option<String>,
    pub detail: Option<String>,
}

/// Validates `raw` for `queue` and applies it once.
pub async fn apply_raw(store: &Store, queue: &QueueId, raw: &[u8]) -> (Option<TaskEvent>, Handled) {
    let event = match TaskEvent::parse(raw, queue) {
        Ok(e) => e,
        Err(rejection) => {
            return (
                None,
                Handled {
                    classification: Classification::Rejected(rejection.kind()),
                    event_id: None,
                    detail: Some(rejection.to_string()),
                },
            )
        }
    };
    let result = store.apply(&event).await;
    let handled = Handled {
        classification: Classification::of(&result),
        event_id: Some(event.id().to_string()),
        detail: result.err().map(|e| e.to_string()),
    };
    (Some(event), handled)
}

/// The rejection for an event that is not this program's.
pub fn foreign(event: &TaskEvent) -> Handled {
    Handled {
        classification: Classification::Foreign,
        event_id: Some(event.id().to_string()),
        detail: Some(format!(
            "the event is for task {}, not this program's task; not ACKed",
            event.task()
        )),
    }
}
