//! Subscriptions: create (at most 64 per namespace), get, pause and resume.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use orbit_wire::{CreateSubscription, EVENT_TYPES, SCOPE_EVENTS_MANAGE, SCOPE_EVENTS_READ};
use sqlx::Row;

use super::auth::{caller, Caller};
use super::{ApiError, ApiResult, Platform, Shared, MAX_SUBSCRIPTIONS};
use crate::db::{self, random_hex};

pub(super) async fn create_subscription(
    State(p): State<Shared>,
    headers: HeaderMap,
    body: Result<Json<CreateSubscription>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<orbit_wire::Subscription>)> {
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

async fn load_subscription(p: &Platform, id: &str) -> ApiResult<orbit_wire::Subscription> {
    let row = sqlx::query(&format!(
        "SELECT {} FROM orbit_subscriptions WHERE id = ?",
        db::SUBSCRIPTION_COLUMNS
    ))
    .bind(id)
    .fetch_optional(&p.pool)
    .await?
    .ok_or_else(|| ApiError::not_found("subscription"))?;
    let mut subscription = db::subscription_from_row(&row)?;
    subscription.lease_ms = Some(p.lease.as_millis() as u64);
    Ok(subscription)
}

pub(super) async fn visible_subscription(
    p: &Platform,
    c: &Caller,
    id: &str,
) -> ApiResult<orbit_wire::Subscription> {
    let s = load_subscription(p, id).await?;
    if s.namespace != c.namespace {
        return Err(ApiError::not_found("subscription"));
    }
    c.bound(&s.namespace, &s.queue_id)?;
    Ok(s)
}

pub(super) async fn get_subscription(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_wire::Subscription>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_READ)?;
    Ok(Json(visible_subscription(&p, &c, &id).await?))
}

async fn set_enabled(
    p: &Platform,
    headers: &HeaderMap,
    id: &str,
    on: bool,
) -> ApiResult<Json<orbit_wire::Subscription>> {
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

pub(super) async fn pause(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_wire::Subscription>> {
    set_enabled(&p, &headers, &id, false).await
}

pub(super) async fn resume(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_wire::Subscription>> {
    set_enabled(&p, &headers, &id, true).await
}
