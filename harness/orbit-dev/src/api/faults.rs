//! The fault API (`--enable-fault-api` only): faults a test arms on the platform's side.

use std::sync::atomic::Ordering;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use sqlx::Row;

use super::tasks::deliver;
use super::{ApiError, ApiResult, Platform, Shared};

#[derive(Deserialize)]
pub(super) struct FaultRequest {
    fault: String,
    /// For `duplicate-event`: the event to deliver again.
    event_id: Option<String>,
}

const FAULTS: &str = "drop-next-ack-reply, drop-next-ack, close-stream-after-delivery, skip-next-result-check or duplicate-event";

pub(super) async fn arm_fault(
    State(p): State<Shared>,
    body: Result<Json<FaultRequest>, JsonRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    let Json(req) = body?;
    match req.fault.as_str() {
        "drop-next-ack-reply" => p.drop_next_ack_reply.store(true, Ordering::SeqCst),
        "drop-next-ack" => p.drop_next_ack.store(true, Ordering::SeqCst),
        "close-stream-after-delivery" => p.close_after_delivery.store(true, Ordering::SeqCst),
        "skip-next-result-check" => p.skip_next_result_check.store(true, Ordering::SeqCst),
        "duplicate-event" => {
            let Some(event_id) = req.event_id.as_deref() else {
                return Err(ApiError::invalid("duplicate-event needs \"event_id\""));
            };
            let deliveries = duplicate_event(&p, event_id).await?;
            return Ok(Json(
                serde_json::json!({"duplicated": event_id, "deliveries": deliveries}),
            ));
        }
        other => {
            return Err(ApiError::invalid(format!(
                "unknown fault {other:?}: {FAULTS}"
            )))
        }
    }
    Ok(Json(serde_json::json!({"armed": req.fault})))
}

/// Fault: delivers an already emitted event once more, as a new PENDING delivery for every
/// enabled subscription that takes it (what a publisher that retried its send would cause).
/// The new deliveries' ids.
async fn duplicate_event(p: &Platform, event_id: &str) -> ApiResult<Vec<String>> {
    let mut tx = p.pool.begin().await?;
    let Some(event) = sqlx::query(
        "SELECT namespace, queue_id, task_id, event_type FROM orbit_events WHERE id = ?",
    )
    .bind(event_id)
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Err(ApiError::not_found(&format!("event {event_id}")));
    };
    let namespace: String = event.try_get_unchecked(0)?;
    let queue: String = event.try_get_unchecked(1)?;
    let task_id: String = event.try_get_unchecked(2)?;
    let event_type: String = event.try_get_unchecked(3)?;
    let ids = deliver(
        p,
        &mut tx,
        &namespace,
        &queue,
        event_id,
        &event_type,
        &task_id,
    )
    .await?;
    tx.commit().await?;
    p.wake.notify_waiters();
    Ok(ids)
}
