//! The HTTP JSON API and the WebSocket delivery stream of `docs/orbit-protocol.md`.
//!
//! This module holds what every route shares (the [`Platform`] state, the error reply, the
//! router); each resource has its own module: [`auth`] (bearer token → credential),
//! [`tasks`] (transitions and the events they emit), [`subscriptions`], [`deliveries`],
//! [`faults`] (the test-only fault API) and [`stream`] (leasing, lease expiry and ACKs).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sqlx::MySqlPool;
use tokio::sync::Notify;

use auth::credential;
use deliveries::{add_budget, get_delivery, list_deliveries};
use faults::arm_fault;
use stream::stream;
use subscriptions::{create_subscription, get_subscription, pause, resume};
use tasks::{cancel_task, get_task, report_task, submit_task};

mod auth;
mod deliveries;
mod faults;
mod leasing;
pub mod metrics;
mod stream;
mod subscriptions;
mod tasks;

pub use deliveries::forget_acked;
pub use leasing::expire_leases;

/// Subscriptions one namespace may have (paused ones included; none is ever deleted).
pub const MAX_SUBSCRIPTIONS: i64 = 64;
/// The largest event the platform emits: the largest a receiver accepts.
pub use canonical_form::MAX_EVENT_BYTES;

/// Settings and shared state of a serving platform.
pub struct Platform {
    pub pool: MySqlPool,
    pub lease: Duration,
    pub max_attempts: u32,
    pub window: u32,
    pub fault_api: bool,
    /// `--vary-events`: how each emitted event is written (otherwise compact, UTC).
    pub vary: Option<crate::vary::Vary>,
    /// `--acked-retention-seconds`: how long an ACKED delivery is kept after its ACK (for
    /// ever when `None`).
    pub acked_retention: Option<Duration>,
    /// `--clock-offset-seconds`: how far the times the platform sends are from its own clock,
    /// and whether behind (the leases themselves run on its own clock).
    pub clock_offset: Duration,
    pub clock_behind: bool,
    /// Woken whenever deliveries may have become available.
    pub wake: Notify,
    /// Fault: process the next ACK but drop its reply (and the stream).
    pub drop_next_ack_reply: AtomicBool,
    /// Fault: drop the next ACK unread (it is never recorded) and close the stream.
    pub drop_next_ack: AtomicBool,
    /// The next ACK is read and then neither recorded nor answered; its stream stays open.
    pub stall_next_ack: AtomicBool,
    /// The next ACK is answered `refused` and not recorded; the delivery stays LEASED.
    pub refuse_next_ack: AtomicBool,
    /// Fault: close the stream right after the next delivery is sent.
    pub close_after_delivery: AtomicBool,
    /// Fault: every stream open now closes (each watches this count).
    pub close_streams: tokio::sync::watch::Sender<u64>,
    /// The next delivery sent is padded past any legal size (the oversize-next-delivery fault).
    pub oversize_next_delivery: AtomicBool,
    /// Fault: accept the next reported result without the canonical form's check (as a
    /// platform that does not validate would), so that a receiver meets a poison event.
    pub skip_next_result_check: AtomicBool,
    /// What `/metrics` reports.
    pub metrics: metrics::PlatformMetrics,
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
    fn is_not_found(&self) -> bool {
        self.status == StatusCode::NOT_FOUND
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
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("the request body is over {BODY_LIMIT} bytes"),
            );
        }
        ApiError::invalid(format!(
            "the request body is not valid JSON for this call: {}",
            e.body_text()
        ))
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        ApiError::invalid(format!("the query string is malformed: {}", e.body_text()))
    }
}

/// The largest request body read: an event's limit plus room for the envelope of a report.
pub const BODY_LIMIT: usize = MAX_EVENT_BYTES + 64 * 1024;
/// The longest request target (path and query) answered; longer ones get 414.
pub const URI_LIMIT: usize = 8 * 1024;
/// The most header bytes (names and values) answered; more get 431.
pub const HEADERS_LIMIT: usize = 16 * 1024;

/// Reads a request's body within `timeout` (a client trickling or stalling its body would
/// otherwise hold its connection for as long as it likes): 408 `body_timeout` when it does
/// not arrive in time, 413 when it is over [`BODY_LIMIT`].
async fn body_in_time(
    request: axum::extract::Request,
    next: axum::middleware::Next,
    timeout: Duration,
) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, BODY_LIMIT)).await {
        Ok(Ok(bytes)) => {
            next.run(axum::extract::Request::from_parts(parts, bytes.into()))
                .await
        }
        Ok(Err(_)) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the request body is over {BODY_LIMIT} bytes, or broke off"),
        )
        .into_response(),
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the request body did not arrive within {} s",
                timeout.as_secs()
            ),
        )
        .into_response(),
    }
}

/// Answers a request whose target or headers are over the limits with the documented JSON
/// error, before any handler runs. (Past hyper's own, larger limits the connection gets
/// hyper's bare 414 or 431.)
async fn limits(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let uri = request.uri().to_string().len();
    if uri > URI_LIMIT {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the request target is {uri} bytes; the limit is {URI_LIMIT}"),
        )
        .into_response();
    }
    let headers: usize = request
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if headers > HEADERS_LIMIT {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("the request headers are {headers} bytes; the limit is {HEADERS_LIMIT}"),
        )
        .into_response();
    }
    next.run(request).await
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

pub fn router(p: Shared, body_timeout: Duration) -> Router {
    let mut r = Router::new()
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({"status": "ok"})) }),
        )
        .route("/metrics", get(metrics::metrics))
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
        .route("/v1/subscriptions/{id}/acked", get(deliveries::list_acked))
        .route("/v1/subscriptions/{id}/stream", get(stream))
        .route("/v1/deliveries/{id}", get(get_delivery))
        .route("/v1/deliveries/{id}/budget", post(add_budget))
        .route("/v1/deliveries/{id}/discard", post(deliveries::discard))
        .route("/v1/deliveries/{id}/redeliver", post(deliveries::redeliver));
    if p.fault_api {
        r = r.route("/v1/_faults", post(arm_fault));
    }
    r.fallback(|| async { ApiError::not_found("endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method",
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(move |request, next| {
            body_in_time(request, next, body_timeout)
        }))
        .layer(axum::middleware::from_fn(limits))
        .with_state(p)
}
