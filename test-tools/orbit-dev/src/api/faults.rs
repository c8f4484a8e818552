//! The fault API (`--enable-fault-api` only): faults a test arms on the platform's side.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::value::RawValue;
use sqlx::Row;

use super::tasks::deliver;
use super::{ApiError, ApiResult, Platform, Shared};

#[derive(Deserialize)]
pub(super) struct FaultRequest {
    fault: String,
    /// For `duplicate-event` and `forge-event`: the event to deliver again, or to forge from.
    event_id: Option<String>,
    /// For `forge-event`: keep the event's id (otherwise a new one).
    #[serde(default)]
    keep_id: bool,
    /// For `forge-event`: the forged event's task version (otherwise the original's).
    task_version: Option<u64>,
    /// For `forge-event`: the `queue_id` the forged body names (otherwise the original's); it
    /// is still delivered where the original was.
    queue_id: Option<String>,
    /// For `forge-event`: the `type` the forged body names (otherwise the original's); it is
    /// still delivered where the original was.
    #[serde(rename = "type")]
    event_type: Option<String>,
    /// For `inject-event`: the event's text, delivered byte for byte.
    body: Option<String>,
}

const FAULTS: &str = "drop-next-ack-reply, drop-next-ack, stall-next-ack, refuse-next-ack, close-stream-after-delivery, close-streams, oversize-next-delivery, skip-next-result-check, duplicate-event, forge-event or inject-event";

/// The forged event's `occurred_at`: no platform event carries it.
const FORGED_AT: &str = "2001-02-03T04:05:06Z";

pub(super) async fn arm_fault(
    State(p): State<Shared>,
    body: Result<Json<FaultRequest>, JsonRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    let Json(req) = body?;
    match req.fault.as_str() {
        "drop-next-ack-reply" => p.drop_next_ack_reply.store(true, Ordering::SeqCst),
        "drop-next-ack" => p.drop_next_ack.store(true, Ordering::SeqCst),
        "stall-next-ack" => p.stall_next_ack.store(true, Ordering::SeqCst),
        "refuse-next-ack" => p.refuse_next_ack.store(true, Ordering::SeqCst),
        "forge-event" => {
            let Some(event_id) = req.event_id.as_deref() else {
                return Err(ApiError::invalid("forge-event needs \"event_id\""));
            };
            let forged = Forged {
                keep_id: req.keep_id,
                task_version: req.task_version,
                queue_id: req.queue_id,
                event_type: req.event_type,
            };
            let (id, deliveries) = forge_event(&p, event_id, forged).await?;
            return Ok(Json(
                serde_json::json!({"forged": event_id, "event_id": id, "deliveries": deliveries}),
            ));
        }
        "inject-event" => {
            let Some(body) = req.body else {
                return Err(ApiError::invalid(
                    "inject-event needs \"body\", the event's text",
                ));
            };
            let (id, key, deliveries) = inject_event(&p, body).await?;
            return Ok(Json(
                serde_json::json!({"event_id": id, "key": key, "deliveries": deliveries}),
            ));
        }
        "close-stream-after-delivery" => p.close_after_delivery.store(true, Ordering::SeqCst),
        "close-streams" => {
            let open = p.close_streams.receiver_count();
            p.close_streams.send_modify(|n| *n += 1);
            return Ok(Json(
                serde_json::json!({"armed": req.fault, "streams": open}),
            ));
        }
        "oversize-next-delivery" => p.oversize_next_delivery.store(true, Ordering::SeqCst),
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
    let e = emitted(&mut tx, event_id).await?;
    let ids = deliver(
        p,
        &mut tx,
        &e.namespace,
        &e.queue,
        event_id,
        &e.event_type,
        &e.task_id,
    )
    .await?;
    tx.commit().await?;
    p.wake.notify_waiters();
    Ok(ids)
}

/// An emitted event, as stored.
struct Emitted {
    namespace: String,
    queue: String,
    task_id: String,
    event_type: String,
    body: Vec<u8>,
}

/// The emitted event `event_id` (404 when there is none).
async fn emitted(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    event_id: &str,
) -> ApiResult<Emitted> {
    let Some(row) = sqlx::query(
        "SELECT namespace, queue_id, task_id, event_type, body FROM orbit_events WHERE id = ?",
    )
    .bind(event_id)
    .fetch_optional(&mut **tx)
    .await?
    else {
        return Err(ApiError::not_found(&format!("event {event_id}")));
    };
    Ok(Emitted {
        namespace: row.try_get_unchecked(0)?,
        queue: row.try_get_unchecked(1)?,
        task_id: row.try_get_unchecked(2)?,
        event_type: row.try_get_unchecked(3)?,
        body: row.try_get(4)?,
    })
}

/// How `forge-event` changes the original (see [`forge_event`]).
struct Forged {
    keep_id: bool,
    task_version: Option<u64>,
    queue_id: Option<String>,
    event_type: Option<String>,
}

/// Fault: an event that contradicts an emitted one, delivered like a new event to every enabled
/// subscription taking its type: the same task, another `occurred_at`, and the same id
/// (`keep_id`: a publisher that reused an id for other content) or a new one, at the original's
/// task version (two events claiming one version) or at `task_version` (an older event arriving
/// late). Its body may name another queue or type than the original's (an event a platform
/// misrouted, or of a type no receiver knows); it still goes where the original went. It is
/// stored under a platform key of its own; the body's `id` is what receivers see. The id the
/// body carries, and the new deliveries' ids.
async fn forge_event(
    p: &Platform,
    event_id: &str,
    forged: Forged,
) -> ApiResult<(String, Vec<String>)> {
    let Forged {
        keep_id,
        task_version,
        queue_id,
        event_type: body_type,
    } = forged;
    let mut tx = p.pool.begin().await?;
    let Emitted {
        namespace,
        queue,
        task_id,
        event_type,
        body,
    } = emitted(&mut tx, event_id).await?;
    // Raw values: a result's numbers keep their text.
    let mut body: BTreeMap<String, Box<RawValue>> = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("event {event_id} cannot be forged: {e}")))?;
    let raw = |v: serde_json::Value| RawValue::from_string(v.to_string()).expect("JSON text");
    let key = crate::db::random_hex(16);
    let id = if keep_id {
        event_id.to_owned()
    } else {
        key.clone()
    };
    body.insert("id".into(), raw(id.clone().into()));
    body.insert("occurred_at".into(), raw(FORGED_AT.into()));
    if let Some(version) = task_version.filter(|v| *v >= 1) {
        body.insert("task_version".into(), raw(version.into()));
    }
    if let Some(queue) = queue_id {
        body.insert("queue_id".into(), raw(queue.into()));
    }
    if let Some(t) = body_type {
        body.insert("type".into(), raw(t.into()));
    }
    let body = serde_json::to_string(&body).expect("a map of JSON values serialises");
    let stored = Emitted {
        namespace,
        queue,
        task_id,
        event_type,
        body: body.into_bytes(),
    };
    let ids = store_and_deliver(p, tx, &key, &stored).await?;
    Ok((id, ids))
}

/// Stores `event` under platform key `key` and delivers it (one PENDING delivery for each
/// enabled subscription taking it), committing `tx`: the new deliveries' ids.
async fn store_and_deliver(
    p: &Platform,
    mut tx: sqlx::Transaction<'_, sqlx::MySql>,
    key: &str,
    event: &Emitted,
) -> ApiResult<Vec<String>> {
    sqlx::query(
        "INSERT INTO orbit_events (id, namespace, queue_id, task_id, event_type, body, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))",
    )
    .bind(key)
    .bind(&event.namespace)
    .bind(&event.queue)
    .bind(&event.task_id)
    .bind(&event.event_type)
    .bind(&event.body)
    .execute(&mut *tx)
    .await?;
    let ids = deliver(
        p,
        &mut tx,
        &event.namespace,
        &event.queue,
        key,
        &event.event_type,
        &event.task_id,
    )
    .await?;
    tx.commit().await?;
    p.wake.notify_waiters();
    Ok(ids)
}

/// Fault: an event whose text the caller wrote, stored and delivered byte for byte (what a
/// platform with another JSON writer would send: other member orders, escapes, whitespace,
/// `occurred_at` offsets), to every enabled subscription of the namespace and queue it names
/// that takes its type. It must be a JSON object whose `namespace`, `queue_id`, `type` and
/// `task_id` are strings; nothing else is checked (a test may inject an event a receiver must
/// refuse). Stored under a platform key of its own, which deliveries name. The id its `id`
/// member holds (empty when it has none), the key, and the new deliveries' ids.
async fn inject_event(p: &Platform, body: String) -> ApiResult<(String, String, Vec<String>)> {
    if body.len() > super::MAX_EVENT_BYTES {
        return Err(ApiError::invalid(format!(
            "inject-event: the body is {} bytes; the limit is {}",
            body.len(),
            super::MAX_EVENT_BYTES
        )));
    }
    // Raw values: numbers past any float (1e400) are the caller's to send.
    let parsed: BTreeMap<String, Box<RawValue>> = serde_json::from_str(&body).map_err(|e| {
        ApiError::invalid(format!("inject-event: the body is not a JSON object: {e}"))
    })?;
    let member = |name: &str| -> ApiResult<String> {
        parsed
            .get(name)
            .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "inject-event: the body needs a string member {name:?}"
                ))
            })
    };
    let (namespace, queue) = (member("namespace")?, member("queue_id")?);
    let (event_type, task_id) = (member("type")?, member("task_id")?);
    let id = member("id").unwrap_or_default();
    let key = crate::db::random_hex(16);
    let event = Emitted {
        namespace,
        queue,
        task_id,
        event_type,
        body: body.into_bytes(),
    };
    let ids = store_and_deliver(p, p.pool.begin().await?, &key, &event).await?;
    Ok((id, key, ids))
}
