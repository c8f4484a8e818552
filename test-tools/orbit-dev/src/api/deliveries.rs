//! Deliveries: list a subscription's, get one, add budget to an EXPIRED one. Never a proof.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use orbit_wire::{AckedPage, AddBudget, Redeliver, SCOPE_EVENTS_MANAGE, SCOPE_EVENTS_READ};
use serde::Deserialize;
use sqlx::Row;

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
) -> ApiResult<Json<Vec<orbit_wire::DeliveryInfo>>> {
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

#[derive(Deserialize)]
pub(super) struct AckedQuery {
    since: Option<String>,
    until: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

/// A time of the API (strict RFC 3339, any offset) as the DATETIME(6) text of its UTC instant
/// (microseconds: a finer fraction is cut); `None` for anything else.
fn datetime(s: &str) -> Option<String> {
    let utc = canonical_form::normalize_rfc3339(s)?;
    let utc = utc.strip_suffix('Z')?.replacen('T', " ", 1);
    Some(match utc.split_once('.') {
        Some((whole, fraction)) => format!("{whole}.{}", &fraction[..fraction.len().min(6)]),
        None => utc,
    })
}

/// `GET /v1/subscriptions/{id}/acked?since=&until=&after=&limit=`: the deliveries ACKED in
/// `[since, until)` (`until` defaults to now), oldest ACK first, one page of at most `limit`
/// (1 to 10 000, 1000 by default) with the cursor of the next. Paged by (ACK time, sequence)
/// on an index of its own, so each page costs the same however long the window.
pub(super) async fn list_acked(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<AckedQuery>, QueryRejection>,
) -> ApiResult<Json<AckedPage>> {
    let Query(q) = query?;
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_READ)?;
    visible_subscription(&p, &c, &id).await?;
    let since = q
        .since
        .as_deref()
        .ok_or_else(|| ApiError::invalid("since is required: an RFC 3339 time"))?;
    let since = datetime(since).ok_or_else(|| {
        ApiError::invalid("since must be an RFC 3339 time, e.g. 2026-12-05T10:00:00Z")
    })?;
    let until = match q.until.as_deref() {
        None => None,
        Some(u) => Some(datetime(u).ok_or_else(|| {
            ApiError::invalid("until must be an RFC 3339 time, e.g. 2026-12-05T11:00:00Z")
        })?),
    };
    if until.as_ref().is_some_and(|u| *u <= since) {
        return Err(ApiError::invalid("until must be after since"));
    }
    let limit = q.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 10000"));
    }
    // The cursor: the last ACK time and sequence of the page before, as this endpoint gave it.
    let after = match q.after.as_deref() {
        None => None,
        Some(a) => {
            let bad = || ApiError::invalid("after must be a cursor this endpoint gave (next)");
            let (at, seq) = a.rsplit_once(',').ok_or_else(bad)?;
            Some((
                datetime(at).ok_or_else(bad)?,
                seq.parse::<u64>().map_err(|_| bad())?,
            ))
        }
    };
    let mut sql = format!(
        "SELECT {}, seq FROM orbit_deliveries FORCE INDEX (by_acked) \
         WHERE subscription_id = ? AND acked_at >= ?",
        db::DELIVERY_COLUMNS
    );
    if until.is_some() {
        sql.push_str(" AND acked_at < ?");
    } else {
        sql.push_str(" AND acked_at < UTC_TIMESTAMP(6)");
    }
    if after.is_some() {
        sql.push_str(" AND (acked_at > ? OR (acked_at = ? AND seq > ?))");
    }
    sql.push_str(" ORDER BY acked_at, seq LIMIT ?");
    let mut query = sqlx::query(&sql).bind(&id).bind(&since);
    if let Some(u) = &until {
        query = query.bind(u);
    }
    if let Some((at, seq)) = &after {
        query = query.bind(at).bind(at).bind(seq);
    }
    let rows = query.bind(limit + 1).fetch_all(&p.pool).await?;
    let more = rows.len() > limit as usize;
    let mut deliveries = Vec::with_capacity(rows.len().min(limit as usize));
    let mut next = None;
    for row in rows.iter().take(limit as usize) {
        let d = db::delivery_from_row(row)?;
        if more {
            let seq: u64 = row.try_get("seq")?;
            next = d.acked_at.as_ref().map(|at| format!("{at},{seq}"));
        }
        deliveries.push(d);
    }
    let retained_since = match p.acked_retention {
        None => None,
        Some(keep) => Some(
            sqlx::query_scalar::<_, String>(
                "SELECT DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, '%Y-%m-%dT%H:%i:%s.%fZ')",
            )
            .bind(keep.as_micros() as u64)
            .fetch_one(&p.pool)
            .await?,
        ),
    };
    Ok(Json(AckedPage {
        deliveries,
        next: if more { next } else { None },
        retained_since,
    }))
}

/// With `--acked-retention-seconds`: every second, forgets the ACKED deliveries whose ACK is
/// older than the retention, subscription by subscription on the `by_acked` index (a real
/// platform's retention of its delivery records). A forgotten delivery is gone from every
/// listing and cannot be redelivered; its event stays.
pub async fn forget_acked(p: Shared) {
    let Some(keep) = p.acked_retention else {
        return;
    };
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        // The ids' binary collation makes them bytes to sqlx.
        let subs: Vec<Vec<u8>> = sqlx::query_scalar("SELECT id FROM orbit_subscriptions")
            .fetch_all(&p.pool)
            .await
            .unwrap_or_default();
        for sub in subs {
            let forgotten = sqlx::query(
                "DELETE FROM orbit_deliveries WHERE subscription_id = ? AND state = 'ACKED' \
                 AND acked_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND",
            )
            .bind(&sub)
            .bind(keep.as_micros() as u64)
            .execute(&p.pool)
            .await
            .map(|r| r.rows_affected())
            .unwrap_or(0);
            p.metrics.acked_forgotten(forgotten);
        }
    }
}

/// `POST /v1/deliveries/{id}/redeliver` (`events:manage`): an ACKED delivery goes back to
/// PENDING with a fresh finite budget (`budget` more leases, 1 to 10; the platform's default
/// otherwise), to be leased with a new proof like any other; its ACK is forgotten (a late ACK
/// with the old proof is refused). The event's bytes never change. `409 not_acked` unless it is
/// ACKED. For a consumer whose database was restored: what it had ACKED since flows again
/// through its normal path and its dedup.
pub(super) async fn redeliver(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<Redeliver>, JsonRejection>,
) -> ApiResult<Json<orbit_wire::DeliveryInfo>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_MANAGE)?;
    let req = match body {
        Ok(Json(b)) => b,
        Err(JsonRejection::MissingJsonContentType(_)) => Redeliver::default(),
        Err(e) => return Err(e.into()),
    };
    let budget = req.budget.unwrap_or(p.max_attempts.min(10));
    if !(1..=10).contains(&budget) {
        return Err(ApiError::invalid("budget must be from 1 to 10"));
    }
    visible_delivery(&p, &c, &id).await?;
    let changed = sqlx::query(
        "UPDATE orbit_deliveries SET state = 'PENDING', budget = attempts + ?, \
         acked_proof_sha256 = NULL, acked_at = NULL, updated_at = UTC_TIMESTAMP(6) \
         WHERE id = ? AND state = 'ACKED'",
    )
    .bind(budget)
    .bind(&id)
    .execute(&p.pool)
    .await?
    .rows_affected();
    if changed == 0 {
        return Err(ApiError::conflict(
            "not_acked",
            "only an ACKED delivery can be redelivered",
        ));
    }
    p.metrics.redelivered();
    p.wake.notify_waiters();
    Ok(Json(visible_delivery(&p, &c, &id).await?))
}

async fn visible_delivery(
    p: &Platform,
    c: &Caller,
    id: &str,
) -> ApiResult<orbit_wire::DeliveryInfo> {
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
) -> ApiResult<Json<orbit_wire::DeliveryInfo>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_EVENTS_READ)?;
    Ok(Json(visible_delivery(&p, &c, &id).await?))
}

pub(super) async fn add_budget(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<AddBudget>, JsonRejection>,
) -> ApiResult<Json<orbit_wire::DeliveryInfo>> {
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
) -> ApiResult<Json<orbit_wire::DeliveryInfo>> {
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
) -> ApiResult<Json<orbit_wire::DeliveryInfo>> {
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
