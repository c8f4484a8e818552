//! The HTTP JSON API and the WebSocket delivery stream of `docs/orbit-protocol.md`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::SinkExt;
use orbit_sdk::wire::{
    AckResult, AddBudget, ClientMessage, CreateSubscription, CredentialInfo, ReportTask,
    ServerMessage, SubmitTask, EVENT_TYPES, SCOPE_EVENTS_CONSUME, SCOPE_EVENTS_MANAGE,
    SCOPE_EVENTS_READ, SCOPE_TASKS_CANCEL, SCOPE_TASKS_SUBMIT,
};
use serde::Deserialize;
use serde_json::value::RawValue;
use sqlx::{MySqlPool, Row};
use tokio::sync::Notify;

use crate::db::{self, random_hex, sha256};

/// Subscriptions one namespace may have (paused ones included; none is ever deleted).
pub const MAX_SUBSCRIPTIONS: i64 = 64;
/// The largest event the platform emits.
pub const MAX_EVENT_BYTES: usize = 512 * 1024;

/// Settings and shared state of a serving platform.
pub struct Platform {
    pub pool: MySqlPool,
    pub lease: Duration,
    pub max_attempts: u32,
    pub window: u32,
    pub fault_api: bool,
    /// Woken whenever deliveries may have become available.
    pub wake: Notify,
    /// Fault: process the next ACK but drop its reply (and the stream).
    pub drop_next_ack_reply: AtomicBool,
    /// Fault: drop the next ACK unread (it is never recorded) and close the stream.
    pub drop_next_ack: AtomicBool,
    /// Fault: close the stream right after the next delivery is sent.
    pub close_after_delivery: AtomicBool,
}

type Shared = Arc<Platform>;

/// An error reply: `{"error":{"code","message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
    fn not_found(what: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such {what}"),
        )
    }
    fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    }
    fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, code, message)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        // The server's log gets the detail; the client a stable code.
        eprintln!("orbit-dev: database error: {e}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            "the platform database failed; retry",
        )
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        ApiError::invalid(format!(
            "the request body is not valid JSON for this call: {}",
            e.body_text()
        ))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The caller's credential.
struct Caller {
    namespace: String,
    scopes: Vec<String>,
    queues: Vec<String>,
}

impl Caller {
    fn need(&self, scope: &str) -> ApiResult<()> {
        if self.scopes.iter().any(|s| s == scope) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "missing_scope",
                format!("this credential lacks the scope {scope}"),
            ))
        }
    }

    fn bound(&self, namespace: &str, queue: &str) -> ApiResult<()> {
        if namespace == self.namespace && self.queues.iter().any(|q| q == queue) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "queue_not_bound",
                format!("queue {queue} is not bound to this credential"),
            ))
        }
    }
}

async fn caller(p: &Platform, headers: &HeaderMap) -> ApiResult<Caller> {
    let unauthorized = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        )
    };
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(unauthorized)?;
    let row = sqlx::query(
        "SELECT namespace, scopes, queues FROM orbit_credentials WHERE token_sha256 = ?",
    )
    .bind(sha256(token.trim()))
    .fetch_optional(&p.pool)
    .await?
    .ok_or_else(unauthorized)?;
    let split = |s: String| {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(str::to_owned)
            .collect()
    };
    Ok(Caller {
        namespace: row.try_get_unchecked("namespace")?,
        scopes: split(row.try_get_unchecked("scopes")?),
        queues: split(row.try_get_unchecked("queues")?),
    })
}

pub fn router(p: Shared) -> Router {
    let mut r = Router::new()
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({"status": "ok"})) }),
        )
        .route("/v1/credential", get(credential))
        .route("/v1/queues/{queue}/tasks", post(submit_task))
        .route("/v1/tasks/{id}", get(get_task))
        .route("/v1/tasks/{id}/cancel", post(cancel_task))
        .route("/v1/tasks/{id}/report", post(report_task))
        .route("/v1/subscriptions", post(create_subscription))
        .route("/v1/subscriptions/{id}", get(get_subscription))
        .route("/v1/subscriptions/{id}/pause", post(pause))
        .route("/v1/subscriptions/{id}/resume", post(resume))
        .route("/v1/subscriptions/{id}/deliveries", get(list_deliveries))
        .route("/v1/subscriptions/{id}/stream", get(stream))
        .route("/v1/deliveries/{id}", get(get_delivery))
        .route("/v1/deliveries/{id}/budget", post(add_budget));
    if p.fault_api {
        r = r.route("/v1/_faults", post(arm_fault));
    }
    r.fallback(|| async { ApiError::not_found("endpoint") })
        .layer(axum::extract::DefaultBodyLimit::max(
            MAX_EVENT_BYTES + 64 * 1024,
        ))
        .with_state(p)
}

async fn credential(
    State(p): State<Shared>,
    headers: HeaderMap,
) -> ApiResult<Json<CredentialInfo>> {
    let c = caller(&p, &headers).await?;
    Ok(Json(CredentialInfo {
        namespace: c.namespace,
        queues: c.queues,
        scopes: c.scopes,
    }))
}

async fn load_task(p: &Platform, id: &str) -> ApiResult<orbit_sdk::wire::Task> {
    let row = sqlx::query(&format!(
        "SELECT {} FROM orbit_tasks WHERE id = ?",
        db::TASK_COLUMNS
    ))
    .bind(id)
    .fetch_optional(&p.pool)
    .await?
    .ok_or_else(|| ApiError::not_found("task"))?;
    Ok(db::task_from_row(&row)?)
}

/// A task the caller may see.
async fn visible_task(p: &Platform, c: &Caller, id: &str) -> ApiResult<orbit_sdk::wire::Task> {
    let task = load_task(p, id).await?;
    if task.namespace != c.namespace {
        return Err(ApiError::not_found("task"));
    }
    c.bound(&task.namespace, &task.queue_id)?;
    Ok(task)
}

async fn submit_task(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    body: Result<Json<SubmitTask>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<orbit_sdk::wire::Task>)> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_TASKS_SUBMIT)?;
    c.bound(&c.namespace, &queue)?;
    let input = match body {
        Ok(Json(b)) => b.input,
        Err(JsonRejection::MissingJsonContentType(_)) => None,
        Err(e) => return Err(e.into()),
    };
    let id = format!("task_{}", random_hex(12));
    let mut tx = p.pool.begin().await?;
    sqlx::query("INSERT INTO orbit_tasks (id, namespace, queue_id, state, version, input, result, created_at, updated_at) \
                 VALUES (?, ?, ?, 'PENDING', 1, ?, NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")
        .bind(&id)
        .bind(&c.namespace)
        .bind(&queue)
        .bind(input.as_ref().map(|r| r.get().as_bytes().to_vec()))
        .execute(&mut *tx)
        .await?;
    emit(&p, &mut tx, &id, "task.submitted").await?;
    tx.commit().await?;
    p.wake.notify_waiters();
    Ok((StatusCode::CREATED, Json(load_task(&p, &id).await?)))
}

async fn get_task(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_sdk::wire::Task>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_TASKS_SUBMIT)
        .or_else(|_| c.need(SCOPE_EVENTS_READ))?;
    Ok(Json(visible_task(&p, &c, &id).await?))
}

/// Moves a task to `state`, bumps its version and emits `event_type`, atomically.
async fn transition(
    p: &Platform,
    c: &Caller,
    id: &str,
    state: &str,
    event_type: &str,
    result: Option<&RawValue>,
) -> ApiResult<orbit_sdk::wire::Task> {
    visible_task(p, c, id).await?;
    let mut tx = p.pool.begin().await?;
    let current: String = sqlx::query("SELECT state FROM orbit_tasks WHERE id = ? FOR UPDATE")
        .bind(id)
        .fetch_one(&mut *tx)
        .await?
        .try_get_unchecked(0)?;
    let allowed = match state {
        "RUNNING" => current == "PENDING",
        _ => current == "PENDING" || current == "RUNNING",
    };
    if !allowed {
        return Err(ApiError::conflict(
            "task_finished",
            format!("task {id} is {current} and cannot become {state}"),
        ));
    }
    sqlx::query("UPDATE orbit_tasks SET state = ?, version = version + 1, result = ?, updated_at = UTC_TIMESTAMP(6) WHERE id = ?")
        .bind(state)
        .bind(result.map(|r| r.get().as_bytes().to_vec()))
        .bind(id)
        .execute(&mut *tx)
        .await?;
    emit(p, &mut tx, id, event_type).await?;
    tx.commit().await?;
    p.wake.notify_waiters();
    load_task(p, id).await
}

async fn cancel_task(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_sdk::wire::Task>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_TASKS_CANCEL)?;
    Ok(Json(
        transition(&p, &c, &id, "CANCELLED", "task.cancelled", None).await?,
    ))
}

async fn report_task(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<ReportTask>, JsonRejection>,
) -> ApiResult<Json<orbit_sdk::wire::Task>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_TASKS_SUBMIT)?;
    let Json(report) = body?;
    let event_type = match report.state.as_str() {
        "RUNNING" => "task.started",
        "SUCCEEDED" => "task.succeeded",
        "FAILED" => "task.failed",
        "NEEDS_REVIEW" => "task.needs_review",
        other => {
            return Err(ApiError::invalid(format!(
                "state must be RUNNING, SUCCEEDED, FAILED or NEEDS_REVIEW, not {other:?}"
            )))
        }
    };
    if report.state == "RUNNING" && report.result.is_some() {
        return Err(ApiError::invalid("a RUNNING report carries no result"));
    }
    Ok(Json(
        transition(
            &p,
            &c,
            &id,
            &report.state,
            event_type,
            report.result.as_deref(),
        )
        .await?,
    ))
}

/// Writes the event for the task's current version and a PENDING delivery for every enabled
/// subscription of its namespace whose queue and event types match.
async fn emit(
    p: &Platform,
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    task_id: &str,
    event_type: &str,
) -> ApiResult<()> {
    let row = sqlx::query(&format!(
        "SELECT namespace, queue_id, state, version, result, DATE_FORMAT(UTC_TIMESTAMP(6), '{}') AS now \
         FROM orbit_tasks WHERE id = ?",
        db::TS
    ))
    .bind(task_id)
    .fetch_one(&mut **tx)
    .await?;
    let namespace: String = row.try_get_unchecked("namespace")?;
    let queue: String = row.try_get_unchecked("queue_id")?;
    let result: Option<Vec<u8>> = row.try_get("result")?;
    let result = result
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| RawValue::from_string(s).ok());
    #[derive(serde::Serialize)]
    struct Event<'a> {
        id: &'a str,
        #[serde(rename = "type")]
        event_type: &'a str,
        namespace: &'a str,
        queue_id: &'a str,
        task_id: &'a str,
        task_version: u64,
        state: &'a str,
        occurred_at: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<&'a RawValue>,
    }
    let event_id = random_hex(16);
    let state: String = row.try_get_unchecked("state")?;
    let now: String = row.try_get_unchecked("now")?;
    let body = serde_json::to_string(&Event {
        id: &event_id,
        event_type,
        namespace: &namespace,
        queue_id: &queue,
        task_id,
        task_version: row.try_get("version")?,
        state: &state,
        occurred_at: &now,
        result: result.as_deref(),
    })
    .map_err(|e| ApiError::invalid(e.to_string()))?;
    if body.len() > MAX_EVENT_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "event_too_large",
            format!(
                "the event would be {} bytes; the limit is {MAX_EVENT_BYTES}",
                body.len()
            ),
        ));
    }
    sqlx::query("INSERT INTO orbit_events (id, namespace, queue_id, task_id, event_type, body, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))")
        .bind(&event_id)
        .bind(&namespace)
        .bind(&queue)
        .bind(task_id)
        .bind(event_type)
        .bind(body.as_bytes())
        .execute(&mut **tx)
        .await?;
    deliver(p, tx, &namespace, &queue, &event_id, event_type, task_id).await?;
    Ok(())
}

/// Inserts a PENDING delivery of event `event_id` for every enabled subscription of the
/// namespace whose queue and event types match; the new deliveries' ids.
async fn deliver(
    p: &Platform,
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    namespace: &str,
    queue: &str,
    event_id: &str,
    event_type: &str,
    task_id: &str,
) -> ApiResult<Vec<String>> {
    let subscriptions = sqlx::query(
        "SELECT id, event_types FROM orbit_subscriptions WHERE namespace = ? AND queue_id = ? AND enabled = 1",
    )
    .bind(namespace)
    .bind(queue)
    .fetch_all(&mut **tx)
    .await?;
    let mut ids = Vec::new();
    for s in subscriptions {
        let types: String = s.try_get_unchecked("event_types")?;
        if !types.split(',').any(|t| t == event_type) {
            continue;
        }
        let sub: String = s.try_get_unchecked("id")?;
        let id = random_hex(16);
        sqlx::query("INSERT INTO orbit_deliveries (id, subscription_id, event_id, event_type, task_id, state, attempts, budget, created_at, updated_at) \
                     VALUES (?, ?, ?, ?, ?, 'PENDING', 0, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")
            .bind(&id)
            .bind(&sub)
            .bind(event_id)
            .bind(event_type)
            .bind(task_id)
            .bind(p.max_attempts)
            .execute(&mut **tx)
            .await?;
        ids.push(id);
    }
    Ok(ids)
}

async fn create_subscription(
    State(p): State<Shared>,
    headers: HeaderMap,
    body: Result<Json<CreateSubscription>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<orbit_sdk::wire::Subscription>)> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_MANAGE)?;
    let Json(req) = body?;
    c.bound(&c.namespace, &req.queue_id)?;
    if req.event_types.is_empty() {
        return Err(ApiError::invalid(
            "event_types must name at least one event type",
        ));
    }
    for t in &req.event_types {
        if !EVENT_TYPES.iter().any(|(known, _)| known == t) {
            return Err(ApiError::invalid(format!("unknown event type {t:?}")));
        }
    }
    let mut tx = p.pool.begin().await?;
    // Serialise creations per namespace so the limit holds under concurrency.
    sqlx::query("SELECT name FROM orbit_namespaces WHERE name = ? FOR UPDATE")
        .bind(&c.namespace)
        .fetch_optional(&mut *tx)
        .await?;
    let count: i64 = sqlx::query("SELECT COUNT(*) FROM orbit_subscriptions WHERE namespace = ?")
        .bind(&c.namespace)
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
    if count >= MAX_SUBSCRIPTIONS {
        return Err(ApiError::conflict(
            "subscription_limit",
            format!("namespace {} already has {MAX_SUBSCRIPTIONS} subscriptions, the limit; subscriptions are never deleted, so use a fresh namespace", c.namespace),
        ));
    }
    let id = random_hex(16);
    sqlx::query("INSERT INTO orbit_subscriptions (id, namespace, queue_id, event_types, enabled, window_size, created_at) \
                 VALUES (?, ?, ?, ?, 1, ?, UTC_TIMESTAMP(6))")
        .bind(&id)
        .bind(&c.namespace)
        .bind(&req.queue_id)
        .bind(req.event_types.join(","))
        .bind(p.window)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(load_subscription(&p, &id).await?)))
}

async fn load_subscription(p: &Platform, id: &str) -> ApiResult<orbit_sdk::wire::Subscription> {
    let row = sqlx::query(&format!(
        "SELECT {} FROM orbit_subscriptions WHERE id = ?",
        db::SUBSCRIPTION_COLUMNS
    ))
    .bind(id)
    .fetch_optional(&p.pool)
    .await?
    .ok_or_else(|| ApiError::not_found("subscription"))?;
    Ok(db::subscription_from_row(&row)?)
}

async fn visible_subscription(
    p: &Platform,
    c: &Caller,
    id: &str,
) -> ApiResult<orbit_sdk::wire::Subscription> {
    let s = load_subscription(p, id).await?;
    if s.namespace != c.namespace {
        return Err(ApiError::not_found("subscription"));
    }
    c.bound(&s.namespace, &s.queue_id)?;
    Ok(s)
}

async fn get_subscription(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_sdk::wire::Subscription>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_READ)?;
    Ok(Json(visible_subscription(&p, &c, &id).await?))
}

async fn set_enabled(
    p: &Platform,
    headers: &HeaderMap,
    id: &str,
    on: bool,
) -> ApiResult<Json<orbit_sdk::wire::Subscription>> {
    let c = caller(p, headers).await?;
    c.need(SCOPE_EVENTS_MANAGE)?;
    visible_subscription(p, &c, id).await?;
    sqlx::query("UPDATE orbit_subscriptions SET enabled = ? WHERE id = ?")
        .bind(on)
        .bind(id)
        .execute(&p.pool)
        .await?;
    p.wake.notify_waiters();
    Ok(Json(load_subscription(p, id).await?))
}

async fn pause(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_sdk::wire::Subscription>> {
    set_enabled(&p, &headers, &id, false).await
}

async fn resume(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_sdk::wire::Subscription>> {
    set_enabled(&p, &headers, &id, true).await
}

#[derive(Deserialize)]
struct DeliveryQuery {
    state: Option<String>,
    task_id: Option<String>,
    limit: Option<u32>,
}

async fn list_deliveries(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<DeliveryQuery>,
) -> ApiResult<Json<Vec<orbit_sdk::wire::DeliveryInfo>>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_READ)?;
    visible_subscription(&p, &c, &id).await?;
    if let Some(s) = &q.state {
        if !matches!(s.as_str(), "PENDING" | "LEASED" | "ACKED" | "EXPIRED") {
            return Err(ApiError::invalid(
                "state must be PENDING, LEASED, ACKED or EXPIRED",
            ));
        }
    }
    let rows = sqlx::query(&format!(
        "SELECT {} FROM orbit_deliveries WHERE subscription_id = ? \
         AND (? IS NULL OR state = ?) AND (? IS NULL OR task_id = ?) ORDER BY seq LIMIT ?",
        db::DELIVERY_COLUMNS
    ))
    .bind(&id)
    .bind(&q.state)
    .bind(&q.state)
    .bind(&q.task_id)
    .bind(&q.task_id)
    .bind(q.limit.unwrap_or(1000).min(10_000))
    .fetch_all(&p.pool)
    .await?;
    Ok(Json(
        rows.iter()
            .map(db::delivery_from_row)
            .collect::<Result<_, _>>()?,
    ))
}

async fn visible_delivery(
    p: &Platform,
    c: &Caller,
    id: &str,
) -> ApiResult<orbit_sdk::wire::DeliveryInfo> {
    let row = sqlx::query(&format!(
        "SELECT {} FROM orbit_deliveries WHERE id = ?",
        db::DELIVERY_COLUMNS
    ))
    .bind(id)
    .fetch_optional(&p.pool)
    .await?
    .ok_or_else(|| ApiError::not_found("delivery"))?;
    let d = db::delivery_from_row(&row)?;
    visible_subscription(p, c, &d.subscription_id).await?;
    Ok(d)
}

async fn get_delivery(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_sdk::wire::DeliveryInfo>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_READ)?;
    Ok(Json(visible_delivery(&p, &c, &id).await?))
}

async fn add_budget(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<AddBudget>, JsonRejection>,
) -> ApiResult<Json<orbit_sdk::wire::DeliveryInfo>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_MANAGE)?;
    let Json(req) = body?;
    if !(1..=10).contains(&req.add) {
        return Err(ApiError::invalid("add must be from 1 to 10"));
    }
    visible_delivery(&p, &c, &id).await?;
    let changed = sqlx::query("UPDATE orbit_deliveries SET budget = budget + ?, state = 'PENDING', updated_at = UTC_TIMESTAMP(6) \
                               WHERE id = ? AND state = 'EXPIRED'")
        .bind(req.add)
        .bind(&id)
        .execute(&p.pool)
        .await?
        .rows_affected();
    if changed == 0 {
        return Err(ApiError::conflict(
            "not_expired",
            "budget can be added to an EXPIRED delivery only",
        ));
    }
    p.wake.notify_waiters();
    Ok(Json(visible_delivery(&p, &c, &id).await?))
}

#[derive(Deserialize)]
struct FaultRequest {
    fault: String,
    /// For `duplicate-event`: the event to deliver again.
    event_id: Option<String>,
}

const FAULTS: &str =
    "drop-next-ack-reply, drop-next-ack, close-stream-after-delivery or duplicate-event";

async fn arm_fault(
    State(p): State<Shared>,
    body: Result<Json<FaultRequest>, JsonRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    let Json(req) = body?;
    match req.fault.as_str() {
        "drop-next-ack-reply" => p.drop_next_ack_reply.store(true, Ordering::SeqCst),
        "drop-next-ack" => p.drop_next_ack.store(true, Ordering::SeqCst),
        "close-stream-after-delivery" => p.close_after_delivery.store(true, Ordering::SeqCst),
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

/// Expires leases that ran out: back to PENDING, or EXPIRED when the budget is spent.
pub async fn expire_leases(p: Shared) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let result = sqlx::query(
            "UPDATE orbit_deliveries SET state = IF(attempts >= budget, 'EXPIRED', 'PENDING'), \
             proof_sha256 = NULL, lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6) \
             WHERE state = 'LEASED' AND lease_expires_at <= UTC_TIMESTAMP(6)",
        )
        .execute(&p.pool)
        .await;
        if matches!(result, Ok(r) if r.rows_affected() > 0) {
            p.wake.notify_waiters();
        }
    }
}

async fn stream(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    ws: WebSocketUpgrade,
) -> ApiResult<Response> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_CONSUME)?;
    visible_subscription(&p, &c, &id).await?;
    Ok(ws.on_upgrade(move |socket| serve_stream(p, id, socket)))
}

/// Leases the oldest PENDING delivery of `sub`, if the subscription is enabled and its window
/// has room; returns the message to send.
async fn lease_one(p: &Platform, sub: &str) -> Result<Option<ServerMessage>, sqlx::Error> {
    let mut tx = p.pool.begin().await?;
    let Some(s) =
        sqlx::query("SELECT enabled, window_size FROM orbit_subscriptions WHERE id = ? FOR UPDATE")
            .bind(sub)
            .fetch_optional(&mut *tx)
            .await?
    else {
        return Ok(None);
    };
    let enabled: bool = s.try_get(0)?;
    let window: u32 = s.try_get(1)?;
    if !enabled {
        return Ok(None);
    }
    let outstanding: i64 = sqlx::query("SELECT COUNT(*) FROM orbit_deliveries WHERE subscription_id = ? AND state IN ('LEASED', 'EXPIRED')")
        .bind(sub)
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
    if outstanding >= i64::from(window) {
        return Ok(None);
    }
    let Some(d) = sqlx::query("SELECT seq, id, event_id, attempts FROM orbit_deliveries \
                               WHERE subscription_id = ? AND state = 'PENDING' ORDER BY seq LIMIT 1 FOR UPDATE")
        .bind(sub)
        .fetch_optional(&mut *tx)
        .await?
    else {
        return Ok(None);
    };
    let seq: u64 = d.try_get(0)?;
    let delivery_id: String = d.try_get_unchecked(1)?;
    let event_id: String = d.try_get_unchecked(2)?;
    let attempt: u32 = d.try_get::<u32, _>(3)? + 1;
    let proof = random_hex(32);
    sqlx::query("UPDATE orbit_deliveries SET state = 'LEASED', attempts = ?, proof_sha256 = ?, \
                 lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, updated_at = UTC_TIMESTAMP(6) WHERE seq = ?")
        .bind(attempt)
        .bind(sha256(&proof))
        .bind(p.lease.as_micros() as u64)
        .bind(seq)
        .execute(&mut *tx)
        .await?;
    let row = sqlx::query(&format!(
        "SELECT e.body, DATE_FORMAT(d.lease_expires_at, '{}') FROM orbit_deliveries d JOIN orbit_events e ON e.id = d.event_id WHERE d.seq = ?",
        db::TS
    ))
    .bind(seq)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    let body: Vec<u8> = row.try_get(0)?;
    let expires: String = row.try_get_unchecked(1)?;
    let event = RawValue::from_string(String::from_utf8_lossy(&body).into_owned())
        .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    let _ = event_id;
    Ok(Some(ServerMessage::Delivery {
        delivery_id,
        attempt,
        proof: orbit_sdk::wire::LeaseProof::new(proof),
        lease_expires_at: expires,
        event,
    }))
}

/// Checks an ACK against the delivery's current lease and records it.
async fn ack(
    p: &Platform,
    sub: &str,
    delivery_id: &str,
    proof: &str,
) -> Result<(AckResult, Option<String>), sqlx::Error> {
    let hash = sha256(proof);
    let mut tx = p.pool.begin().await?;
    let Some(row) = sqlx::query("SELECT state, proof_sha256, acked_proof_sha256, lease_expires_at > UTC_TIMESTAMP(6) \
                                 FROM orbit_deliveries WHERE id = ? AND subscription_id = ? FOR UPDATE")
        .bind(delivery_id)
        .bind(sub)
        .fetch_optional(&mut *tx)
        .await?
    else {
        return Ok((AckResult::Refused, Some("no such delivery on this subscription".into())));
    };
    let state: String = row.try_get_unchecked(0)?;
    let current: Option<Vec<u8>> = row.try_get(1)?;
    let acked_with: Option<Vec<u8>> = row.try_get(2)?;
    let live = row.try_get::<Option<i64>, _>(3)? == Some(1);
    let answer = match state.as_str() {
        "ACKED" if acked_with.as_deref() == Some(&hash[..]) => (AckResult::AlreadyAcked, None),
        "ACKED" => (AckResult::Refused, Some("acked by another lease".into())),
        "LEASED" if current.as_deref() == Some(&hash[..]) && live => {
            sqlx::query("UPDATE orbit_deliveries SET state = 'ACKED', acked_proof_sha256 = proof_sha256, proof_sha256 = NULL, \
                         lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6) WHERE id = ?")
                .bind(delivery_id)
                .execute(&mut *tx)
                .await?;
            (AckResult::Acked, None)
        }
        "LEASED" if current.as_deref() == Some(&hash[..]) => {
            (AckResult::Refused, Some("the lease has expired".into()))
        }
        _ => (
            AckResult::Refused,
            Some("the proof belongs to a superseded or expired lease".into()),
        ),
    };
    tx.commit().await?;
    if answer.0 == AckResult::Acked {
        p.wake.notify_waiters();
    }
    Ok(answer)
}

async fn send(socket: &mut WebSocket, m: &ServerMessage) -> bool {
    match serde_json::to_string(m) {
        Ok(text) => socket.send(Message::Text(text.into())).await.is_ok(),
        Err(_) => false,
    }
}

async fn serve_stream(p: Shared, sub: String, mut socket: WebSocket) {
    let mut credit: u32 = 0;
    let mut heartbeat = tokio::time::interval(Duration::from_secs(10));
    let mut poll = tokio::time::interval(Duration::from_millis(250));
    loop {
        // Hand out deliveries while the client has credit.
        while credit > 0 {
            match lease_one(&p, &sub).await {
                Ok(Some(m)) => {
                    credit -= 1;
                    if !send(&mut socket, &m).await {
                        return;
                    }
                    if p.close_after_delivery.swap(false, Ordering::SeqCst) {
                        let _ = socket.close().await;
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    eprintln!("orbit-dev: leasing failed: {e}");
                    break;
                }
            }
        }
        let wake = p.wake.notified();
        tokio::select! {
            msg = socket.recv() => {
                let text = match msg {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                    Some(Ok(_)) => continue,
                };
                match serde_json::from_str::<ClientMessage>(text.as_str()) {
                    Ok(ClientMessage::Credit { credit: more }) => credit = credit.saturating_add(more).min(10_000),
                    Ok(ClientMessage::Heartbeat) => {}
                    Ok(ClientMessage::Ack { delivery_id, proof }) => {
                        if p.drop_next_ack.swap(false, Ordering::SeqCst) {
                            // The ACK is lost on the way: never recorded, never answered.
                            let _ = socket.close().await;
                            return;
                        }
                        let (result, reason) = match ack(&p, &sub, &delivery_id, proof.expose()).await {
                            Ok(r) => r,
                            Err(e) => {
                                eprintln!("orbit-dev: ack failed: {e}");
                                return;
                            }
                        };
                        if p.drop_next_ack_reply.swap(false, Ordering::SeqCst) {
                            // The ACK is recorded; the client never hears so.
                            let _ = socket.close().await;
                            return;
                        }
                        if !send(&mut socket, &ServerMessage::AckResult { delivery_id, result, reason }).await {
                            return;
                        }
                    }
                    // Not the contract: close rather than guess.
                    Err(_) => {
                        let _ = socket.close().await;
                        return;
                    }
                }
            }
            _ = wake => {}
            _ = poll.tick() => {}
            _ = heartbeat.tick() => {
                if !send(&mut socket, &ServerMessage::Heartbeat).await {
                    return;
                }
            }
        }
    }
}
