//! The stream's messages as the SDK's layer sees them: JSON text, read with the wire contract's
//! own types.

use orbit_sdk::wire::{ClientMessage, LeaseProof, ServerMessage};
use orbit_sdk::DeliveryId;

/// The delivery and proof of an ACK frame; `None` for any other message.
pub fn ack(text: &str) -> Option<(DeliveryId, LeaseProof)> {
    match serde_json::from_str::<ClientMessage>(text).ok()? {
        ClientMessage::Ack { delivery_id, proof } => Some((delivery_id, proof)),
        _ => None,
    }
}

/// The delivery whose ACK the platform refused, when `text` says so.
pub fn refused(text: &str) -> Option<DeliveryId> {
    match ServerMessage::from_json(text).ok()? {
        ServerMessage::AckResult {
            delivery_id,
            result: orbit_sdk::wire::AckResult::Refused,
            ..
        } => Some(delivery_id),
        _ => None,
    }
}

/// The `id` member of the event a delivery carries, when `text` is a delivery.
pub fn delivered_event_id(text: &str) -> Option<String> {
    match ServerMessage::from_json(text).ok()? {
        ServerMessage::Delivery { event, .. } => event_id(event.get().as_bytes()),
        _ => None,
    }
}

/// The `id` member of an event's text.
pub fn event_id(raw: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(raw).ok()?;
    v.get("id")?.as_str().map(str::to_owned)
}

/// Whether `text` is a credit frame.
pub fn is_credit(text: &str) -> bool {
    matches!(
        serde_json::from_str::<ClientMessage>(text),
        Ok(ClientMessage::Credit { .. })
    )
}

/// Whether `text` is a delivery.
pub fn is_delivery(text: &str) -> bool {
    matches!(
        ServerMessage::from_json(text),
        Ok(ServerMessage::Delivery { .. })
    )
}

/// A credit frame for `credit` more deliveries.
pub fn credit(credit: u32) -> String {
    serde_json::to_string(&ClientMessage::Credit { credit }).expect("a credit frame serializes")
}
