//! Deliveries: list a subscription's, get one, add budget to an EXPIRED one. Never a proof.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use orbit_sdk::wire::{AddBudget, SCOPE_EVENTS_MANAGE, SCOPE_EVENTS_READ};
use serde::Deserialize;

use super::auth::{caller, Caller};
use super::subscriptions::visible_subscription;
use super::{ApiError, ApiResult, Platform, Shared};
use crate::db::{self};

#[derive(Deserialize)]
pub(super) struct DeliveryQuery {
    state: Option<String>,
    task_id: Option<String>,
    limit: Option<u32>,
}

pub(super) async fn list_deliveries(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<DeliveryQuery>, QueryRejection>,
) -> ApiResult<Json<Vec<orbit_sdk::wire::DeliveryInfo>>> {
    let Query(q) = query?;
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_READ)?;
    visible_subscription(&p, &c, &id).await?;
    if let Some(s) = &q.state {
        if !matches!(
            s.as_str(),
            "PENDING" | "LEASED" | "ACKED" | "EXPIRED" | "DISCARDED"
        ) {
            return Err(ApiError::invalid(
                "state must be PENDING, LEASED, ACKED, EXPIRED or DISCARDED",
            ));
        }
    }
    let limit = q.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 10000"));
    }
    // Only the filters given, so that a task's deliveries are read through `by_task` rather
    // than by scanning the subscription's.
    let mut sql = format!(
        "SELECT {} FROM orbit_deliveries WHERE subscription_id = ?",
        db::DELIVERY_COLUMNS
    );
    if q.state.is_some() {
        sql.push_str(" AND state = ?");
    }
    if q.task_id.is_some() {
        sql.push_str(" AND task_id = ?");
    }
    sql.push_str(" ORDER BY seq LIMIT ?");
    let mut query = sqlx::query(&sql).bind(&id);
    if let Some(state) = &q.state {
        query = query.bind(state);
    }
    if let Some(task) = &q.task_id {
        query = query.bind(task);
    }
    let rows = query.bind(limit).fetch_all(&p.pool).await?;
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
    // Another namespace's delivery answers exactly as an unknown one: no oracle for ids.
    match visible_subscription(p, c, &d.subscription_id).await {
        Err(e) if e.is_not_found() => Err(ApiError::not_found("delivery")),
        other => other.map(|_| d),
    }
}

pub(super) async fn get_delivery(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_sdk::wire::DeliveryInfo>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_READ)?;
    Ok(Json(visible_delivery(&p, &c, &id).await?))
}

pub(super) async fn add_budget(
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
    from_expired(
        &p,
        &c,
        &id,
        "PENDING",
        req.add,
        "budget can be added to an EXPIRED delivery only",
    )
    .await
}

/// `POST /v1/deliveries/{id}/discard`: an EXPIRED delivery that can never apply (its event is
/// refused by every receiver) leaves the window for good, as DISCARDED. It is never leased
/// again; its event stays readable.
pub(super) async fn discard(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_sdk::wire::DeliveryInfo>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_MANAGE)?;
    from_expired(
        &p,
        &c,
        &id,
        "DISCARDED",
        0,
        "only an EXPIRED delivery can be discarded",
    )
    .await
}

/// Moves a visible EXPIRED delivery to `state` with `add` more budget (PENDING with budget
/// added, or DISCARDED), wakes the streams (a slot of the window is free again) and answers the
/// delivery; `409 not_expired` with `refusal` when it is not EXPIRED.
async fn from_expired(
    p: &Platform,
    c: &Caller,
    id: &str,
    state: &str,
    add: u32,
    refusal: &'static str,
) -> ApiResult<Json<orbit_sdk::wire::DeliveryInfo>> {
    visible_delivery(p, c, id).await?;
    let changed = sqlx::query(
        "UPDATE orbit_deliveries SET budget = budget + ?, state = ?, updated_at = UTC_TIMESTAMP(6) \
         WHERE id = ? AND state = 'EXPIRED'",
    )
    .bind(add)
    .bind(state)
    .bind(id)
    .execute(&p.pool)
    .await?
    .rows_affected();
    if changed == 0 {
        return Err(ApiError::conflict("not_expired", refusal));
    }
    p.wake.notify_waiters();
    Ok(Json(visible_delivery(p, c, id).await?))
}
