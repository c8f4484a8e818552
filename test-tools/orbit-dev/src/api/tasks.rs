//! Tasks: submit, get, cancel and report; every transition bumps the version and emits an
//! event, with a PENDING delivery for each matching enabled subscription.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use orbit_wire::{
    ReportTask, SubmitTask, SCOPE_EVENTS_READ, SCOPE_TASKS_CANCEL, SCOPE_TASKS_SUBMIT,
};
use serde_json::value::RawValue;
use sqlx::Row;

use super::auth::{caller, Caller};
use super::{ApiError, ApiResult, Platform, Shared, MAX_EVENT_BYTES};
use crate::db::{self, random_hex};

async fn load_task(p: &Platform, id: &str) -> ApiResult<orbit_wire::Task> {
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
async fn visible_task(p: &Platform, c: &Caller, id: &str) -> ApiResult<orbit_wire::Task> {
    let task = load_task(p, id).await?;
    if task.namespace != c.namespace {
        return Err(ApiError::not_found("task"));
    }
    c.bound(&task.namespace, &task.queue_id)?;
    Ok(task)
}

pub(super) async fn submit_task(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    body: Result<Json<SubmitTask>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<orbit_wire::Task>)> {
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

pub(super) async fn get_task(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_wire::Task>> {
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
) -> ApiResult<orbit_wire::Task> {
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

pub(super) async fn cancel_task(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<orbit_wire::Task>> {
    let c = caller(&p, &headers).await?;
    c.need(SCOPE_TASKS_CANCEL)?;
    Ok(Json(
        transition(&p, &c, &id, "CANCELLED", "task.cancelled", None).await?,
    ))
}

pub(super) async fn report_task(
    State(p): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<ReportTask>, JsonRejection>,
) -> ApiResult<Json<orbit_wire::Task>> {
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
    let event = Event {
        id: &event_id,
        event_type,
        namespace: &namespace,
        queue_id: &queue,
        task_id,
        task_version: row.try_get("version")?,
        state: &state,
        occurred_at: &now,
        result: result.as_deref(),
    };
    let body = match &p.vary {
        None => serde_json::to_string(&event).map_err(|e| ApiError::invalid(e.to_string()))?,
        Some(vary) => {
            let text = |s: &str| serde_json::Value::from(s).to_string();
            let mut members = vec![
                ("id", text(event.id)),
                ("type", text(event.event_type)),
                ("namespace", text(event.namespace)),
                ("queue_id", text(event.queue_id)),
                ("task_id", text(event.task_id)),
                ("task_version", event.task_version.to_string()),
                ("state", text(event.state)),
            ];
            if let Some(r) = event.result {
                members.push(("result", r.get().to_owned()));
            }
            vary.render(members, event.occurred_at)
        }
    };
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
    // A result a receiver must always refuse (too deep, a lone surrogate, a duplicate name)
    // would be delivered until its budget is spent and then sit in the window: refuse it here,
    // by the same rules (docs/canonical-json.md). The message names the rule, not the content.
    let checked = !p
        .skip_next_result_check
        .swap(false, std::sync::atomic::Ordering::SeqCst);
    if checked {
        if let Err(e) = canonical_form::Document::parse(body.as_bytes()) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_result",
                format!(
                    "the result breaks the canonical form's rules (docs/canonical-json.md): {e}"
                ),
            ));
        }
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
pub(super) async fn deliver(
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
