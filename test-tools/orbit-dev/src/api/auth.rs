//! Who is calling: the bearer token's credential, its scopes and the queues bound to it.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use orbit_wire::CredentialInfo;
use sqlx::Row;

use super::{ApiError, ApiResult, Platform, Shared};
use crate::db::sha256;

/// The caller's credential.
pub(super) struct Caller {
    pub(super) namespace: String,
    pub(super) scopes: Vec<String>,
    pub(super) queues: Vec<String>,
}

impl Caller {
    pub(super) fn need(&self, scope: &str) -> ApiResult<()> {
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

    pub(super) fn bound(&self, namespace: &str, queue: &str) -> ApiResult<()> {
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

pub(super) async fn caller(p: &Platform, headers: &HeaderMap) -> ApiResult<Caller> {
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

pub(super) async fn credential(
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
