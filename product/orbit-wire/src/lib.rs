//! The Orbit protocol's contract, shared by both sides: the SDK that consumes and `orbit-dev`
//! that serves. Its JSON shapes, the scopes and event types, the platform's ids, the credentials
//! file, and the protocol's version. `docs/orbit-protocol.md` is the contract these types follow;
//! this crate holds no client and no server, so neither side links the other's stack.
//!
//! Event bodies and results travel as raw JSON (`RawValue`): their exact text, big integers and
//! decimal spellings included, reaches the handler untouched.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub mod credentials;

pub use credentials::{Credentials, CredentialsError, Token};
pub use platform_id::IdentityError;

/// The protocol's version: every path of the HTTP API and the stream starts with `/v1/`.
pub const PROTOCOL_VERSION: &str = "v1";

/// The path of the API's `rest` (which starts with `/`) under this protocol version.
pub fn api_path(rest: &str) -> String {
    format!("/{PROTOCOL_VERSION}{rest}")
}

platform_id::platform_id!(
    /// A subscription's id (the platform issues 32 characters).
    SubscriptionId
);
platform_id::platform_id!(
    /// A delivery's id: one event for one subscription, over all its attempts.
    DeliveryId
);

/// Scope: read subscriptions and deliveries.
pub const SCOPE_EVENTS_READ: &str = "events:read";
/// Scope: open a subscription's delivery stream and ACK.
pub const SCOPE_EVENTS_CONSUME: &str = "events:consume";
/// Scope: create, pause and resume subscriptions; add budget.
pub const SCOPE_EVENTS_MANAGE: &str = "events:manage";
/// Scope: submit tasks and report their results.
pub const SCOPE_TASKS_SUBMIT: &str = "tasks:submit";
/// Scope: cancel tasks.
pub const SCOPE_TASKS_CANCEL: &str = "tasks:cancel";

/// Every event type the platform emits, with the task state it carries.
pub const EVENT_TYPES: &[(&str, &str)] = &[
    ("task.submitted", "PENDING"),
    ("task.started", "RUNNING"),
    ("task.succeeded", "SUCCEEDED"),
    ("task.failed", "FAILED"),
    ("task.cancelled", "CANCELLED"),
    ("task.needs_review", "NEEDS_REVIEW"),
];

/// A lease proof: what an ACK must carry. A [`secret::Secret`], so it prints as `***`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseProof(secret::Secret);

impl LeaseProof {
    /// Wraps a proof.
    pub fn new(s: impl Into<String>) -> Self {
        LeaseProof(secret::Secret::new(s))
    }
    /// The proof text, for the ACK message only.
    pub fn expose(&self) -> &str {
        self.0.expose()
    }
}

/// A task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub namespace: String,
    pub queue_id: String,
    pub state: String,
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<RawValue>>,
    pub created_at: String,
    pub updated_at: String,
}

/// `POST /v1/queues/{queue}/tasks`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SubmitTask {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Box<RawValue>>,
}

/// `POST /v1/tasks/{id}/report`: a worker reports RUNNING, SUCCEEDED, FAILED or NEEDS_REVIEW.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReportTask {
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<RawValue>>,
}

/// A subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    /// 32 characters.
    pub id: SubscriptionId,
    pub namespace: String,
    pub queue_id: String,
    pub event_types: Vec<String>,
    pub enabled: bool,
    /// Outstanding deliveries (LEASED and EXPIRED) it may hold.
    pub window: u32,
    pub created_at: String,
    /// How long each lease of its deliveries lasts, in milliseconds; absent from platforms that do
    /// not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
}

/// `POST /v1/subscriptions`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateSubscription {
    pub queue_id: String,
    pub event_types: Vec<String>,
}

/// A delivery, as listed (never with a proof).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryInfo {
    pub id: DeliveryId,
    pub subscription_id: SubscriptionId,
    pub event_id: String,
    pub event_type: String,
    pub task_id: String,
    /// PENDING, LEASED, ACKED or EXPIRED.
    pub state: String,
    /// Leases handed out so far.
    pub attempts: u32,
    /// Leases allowed in all.
    pub budget: u32,
    pub lease_expires_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// When it was ACKED (RFC 3339 UTC), while it is; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked_at: Option<String>,
}

/// `GET /v1/subscriptions/{id}/acked`: one page of the deliveries ACKED in a window of time,
/// oldest ACK first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AckedPage {
    pub deliveries: Vec<DeliveryInfo>,
    /// The cursor of the next page (`after`), or `None` after the last.
    pub next: Option<String>,
    /// A platform that forgets ACKED deliveries after a retention: the oldest ACK time it still
    /// lists them all from (RFC 3339, UTC). A delivery ACKED before it may be gone, and can then
    /// be neither listed nor redelivered. `None` when it keeps them for ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained_since: Option<String>,
}

/// `POST /v1/deliveries/{id}/redeliver`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Redeliver {
    /// Leases the redelivery may take, 1 to 10 (the platform's default budget otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u32>,
}

/// `POST /v1/deliveries/{id}/budget`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AddBudget {
    /// 1 to 10.
    pub add: u32,
}

/// What a credential may do, as `GET /v1/credential` reports it (never the token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialInfo {
    pub namespace: String,
    pub queues: Vec<String>,
    pub scopes: Vec<String>,
}

/// An error reply: `{"error":{"code":…,"message":…}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The code and message of an error reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

/// A message from client to platform on the delivery stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMessage {
    /// May receive `credit` more deliveries.
    Credit {
        credit: u32,
    },
    /// The delivery was handled; `proof` is that delivery's lease proof.
    Ack {
        delivery_id: DeliveryId,
        proof: LeaseProof,
    },
    /// The client will not handle the delivery (it stops, or holds new work back): its lease
    /// ends now and its attempt is not counted. No answer; a proof that is not the current
    /// lease's changes nothing.
    Release {
        delivery_id: DeliveryId,
        proof: LeaseProof,
    },
    Heartbeat,
}

/// A message from platform to client on the delivery stream. Read it with
/// [`ServerMessage::from_json`]: serde cannot buffer a raw event inside a tagged enum.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    Delivery {
        delivery_id: DeliveryId,
        /// 1 for the first lease, 2 after one expiry, …
        attempt: u32,
        proof: LeaseProof,
        lease_expires_at: String,
        /// The event, exactly as emitted.
        event: Box<RawValue>,
    },
    AckResult {
        delivery_id: DeliveryId,
        result: AckResult,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    Heartbeat,
}

/// The platform's answer to an ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AckResult {
    /// This ACK moved the delivery to ACKED.
    Acked,
    /// The delivery was already ACKED by this same lease (a repeated ACK).
    AlreadyAcked,
    /// Not accepted: the proof belongs to a superseded or expired lease, or to nothing.
    Refused,
}

impl AckResult {
    /// The name on the wire, which metrics and log lines use too: `acked`, `already_acked`,
    /// `refused`.
    pub fn as_str(self) -> &'static str {
        match self {
            AckResult::Acked => "acked",
            AckResult::AlreadyAcked => "already_acked",
            AckResult::Refused => "refused",
        }
    }
}

/// Why a stream message could not be read as a [`ServerMessage`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// Not JSON, or a field of the wrong type.
    #[error("{0}")]
    NotAMessage(String),
    /// A message of a known type without one of its fields.
    #[error("a {kind} message without `{field}`")]
    Missing { kind: String, field: &'static str },
    /// A `type` this SDK does not know.
    #[error("unknown message type {0:?}")]
    UnknownType(String),
}

/// Every field any server message has, for reading; `type` says which are present.
#[derive(Deserialize)]
struct ServerMessageFields {
    #[serde(rename = "type")]
    kind: String,
    delivery_id: Option<DeliveryId>,
    attempt: Option<u32>,
    proof: Option<LeaseProof>,
    lease_expires_at: Option<String>,
    event: Option<Box<RawValue>>,
    result: Option<AckResult>,
    reason: Option<String>,
}

impl ServerMessage {
    /// Reads a stream message, keeping the event's exact text.
    pub fn from_json(text: &str) -> Result<ServerMessage, MessageError> {
        let f: ServerMessageFields =
            serde_json::from_str(text).map_err(|e| MessageError::NotAMessage(e.to_string()))?;
        let missing = |field: &'static str| MessageError::Missing {
            kind: f.kind.clone(),
            field,
        };
        match f.kind.as_str() {
            "delivery" => Ok(ServerMessage::Delivery {
                delivery_id: f
                    .delivery_id
                    .clone()
                    .ok_or_else(|| missing("delivery_id"))?,
                attempt: f.attempt.ok_or_else(|| missing("attempt"))?,
                proof: f.proof.clone().ok_or_else(|| missing("proof"))?,
                lease_expires_at: f
                    .lease_expires_at
                    .clone()
                    .ok_or_else(|| missing("lease_expires_at"))?,
                event: f.event.ok_or_else(|| missing("event"))?,
            }),
            "ack_result" => Ok(ServerMessage::AckResult {
                delivery_id: f
                    .delivery_id
                    .clone()
                    .ok_or_else(|| missing("delivery_id"))?,
                result: f.result.ok_or_else(|| missing("result"))?,
                reason: f.reason,
            }),
            "heartbeat" => Ok(ServerMessage::Heartbeat),
            other => Err(MessageError::UnknownType(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_ack_result_is_named_as_on_the_wire() {
        for r in [
            AckResult::Acked,
            AckResult::AlreadyAcked,
            AckResult::Refused,
        ] {
            assert_eq!(
                serde_json::to_value(r).unwrap(),
                serde_json::Value::from(r.as_str())
            );
        }
    }

    use super::*;

    #[test]
    fn a_delivery_keeps_the_event_text_and_hides_the_proof() {
        let text = r#"{"type":"delivery","delivery_id":"d1","attempt":2,"proof":"p-secret","lease_expires_at":"2026-12-02T14:00:00Z","event":{"n": 123456789012345678901234567890, "x": 1.50}}"#;
        let m = ServerMessage::from_json(text).unwrap();
        assert!(!format!("{m:?}").contains("p-secret"));
        match m {
            ServerMessage::Delivery { event, attempt, .. } => {
                assert_eq!(attempt, 2);
                assert_eq!(
                    event.get(),
                    r#"{"n": 123456789012345678901234567890, "x": 1.50}"#
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            ServerMessage::from_json(r#"{"type":"delivery"}"#).unwrap_err(),
            MessageError::Missing {
                kind: "delivery".into(),
                field: "delivery_id"
            }
        );
        assert_eq!(
            ServerMessage::from_json(r#"{"type":"gossip"}"#).unwrap_err(),
            MessageError::UnknownType("gossip".into())
        );
        assert!(matches!(
            ServerMessage::from_json("[1]"),
            Err(MessageError::NotAMessage(_))
        ));
        assert!(matches!(
            ServerMessage::from_json(
                r#"{"type":"ack_result","delivery_id":"d","result":"already_acked"}"#
            ),
            Ok(ServerMessage::AckResult {
                result: AckResult::AlreadyAcked,
                ..
            })
        ));
    }
}
