//! The WebSocket delivery stream: credit, leasing, lease expiry and ACKs.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::{FutureExt, SinkExt};
use orbit_sdk::wire::{AckResult, ClientMessage, ServerMessage, SCOPE_EVENTS_CONSUME};
use serde_json::value::RawValue;
use sqlx::Row;

use super::auth::caller;
use super::subscriptions::visible_subscription;
use super::{ApiResult, Platform, Shared};
use crate::db::{self, random_hex, sha256};

/// Expires leases that ran out: back to PENDING, or EXPIRED when the budget is spent. The
/// `by_lease` index makes each pass read only the leases that ran out, however many
/// deliveries the platform keeps.
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
        if let Ok(r) = result.as_ref().map(|r| r.rows_affected()).map_err(|_| ()) {
            if r > 0 {
                p.metrics.leases_expired(r);
                p.wake.notify_waiters();
            }
        }
    }
}

pub(super) async fn stream(
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

/// The most deliveries one leasing transaction takes.
const LEASE_BATCH: u32 = 64;

/// Leases the oldest PENDING deliveries of `sub`, up to `max` and to what its window has room
/// for, in one transaction, if the subscription is enabled; returns the messages to send. The
/// subscription row's lock (`FOR UPDATE`) serialises streams of one subscription, so no
/// delivery is leased twice.
async fn lease(p: &Platform, sub: &str, max: u32) -> Result<Lease, sqlx::Error> {
    let mut tx = p.pool.begin().await?;
    let Some(s) =
        sqlx::query("SELECT enabled, window_size FROM orbit_subscriptions WHERE id = ? FOR UPDATE")
            .bind(sub)
            .fetch_optional(&mut *tx)
            .await?
    else {
        return Ok(Lease::Nothing);
    };
    let enabled: bool = s.try_get(0)?;
    let window: u32 = s.try_get(1)?;
    if !enabled {
        return held(&mut tx, sub, "paused".to_owned()).await;
    }
    // `by_subscription` by name: the optimizer otherwise may take `by_lease` (state first) and
    // read every PENDING delivery of every subscription, a cost that grows with the backlog.
    let outstanding: i64 = sqlx::query("SELECT COUNT(*) FROM orbit_deliveries FORCE INDEX (by_subscription) \
                                        WHERE subscription_id = ? AND state IN ('LEASED', 'EXPIRED')")
        .bind(sub)
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
    if outstanding >= i64::from(window) {
        let why = format!("window full ({outstanding} of {window} leased or expired)");
        return held(&mut tx, sub, why).await;
    }
    let room = (i64::from(window) - outstanding).min(i64::from(max.min(LEASE_BATCH)));
    let rows = sqlx::query("SELECT seq, id, attempts FROM orbit_deliveries FORCE INDEX (by_subscription) \
                            WHERE subscription_id = ? AND state = 'PENDING' ORDER BY seq LIMIT ? FOR UPDATE")
        .bind(sub)
        .bind(room)
        .fetch_all(&mut *tx)
        .await?;
    if rows.is_empty() {
        return Ok(Lease::Nothing);
    }
    // Each lease its own proof: one UPDATE per row, all in this transaction.
    let mut leased = Vec::with_capacity(rows.len());
    for d in &rows {
        let seq: u64 = d.try_get(0)?;
        let delivery_id: String = d.try_get_unchecked(1)?;
        let attempt: u32 = d.try_get::<u32, _>(2)? + 1;
        let proof = random_hex(32);
        sqlx::query("UPDATE orbit_deliveries SET state = 'LEASED', attempts = ?, proof_sha256 = ?, \
                     lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, updated_at = UTC_TIMESTAMP(6) WHERE seq = ?")
            .bind(attempt)
            .bind(sha256(&proof))
            .bind(p.lease.as_micros() as u64)
            .bind(seq)
            .execute(&mut *tx)
            .await?;
        leased.push((seq, delivery_id, attempt, proof));
    }
    let marks = vec!["?"; leased.len()].join(", ");
    let sql = format!(
        "SELECT d.seq, e.body, DATE_FORMAT(d.lease_expires_at, '{}') FROM orbit_deliveries d \
         JOIN orbit_events e ON e.id = d.event_id WHERE d.seq IN ({marks})",
        db::TS
    );
    let mut query = sqlx::query(&sql);
    for (seq, ..) in &leased {
        query = query.bind(*seq);
    }
    let bodies = query.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    let mut by_seq = std::collections::HashMap::with_capacity(bodies.len());
    for row in &bodies {
        let seq: u64 = row.try_get(0)?;
        let body: Vec<u8> = row.try_get(1)?;
        let expires: String = row.try_get_unchecked(2)?;
        by_seq.insert(seq, (body, expires));
    }
    let mut messages = Vec::with_capacity(leased.len());
    for (seq, delivery_id, attempt, proof) in leased {
        let (body, expires) = by_seq
            .remove(&seq)
            .ok_or_else(|| sqlx::Error::RowNotFound)?;
        let event = RawValue::from_string(String::from_utf8_lossy(&body).into_owned())
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        messages.push(ServerMessage::Delivery {
            delivery_id: delivery_id.into(),
            attempt,
            proof: orbit_sdk::wire::LeaseProof::new(proof),
            lease_expires_at: expires,
            event,
        });
    }
    Ok(Lease::Leased(messages))
}

/// What one leasing attempt found.
enum Lease {
    /// Deliveries, leased: the messages to send, oldest first.
    Leased(Vec<ServerMessage>),
    /// No PENDING delivery.
    Nothing,
    /// PENDING deliveries wait, and why (paused, or the window is full).
    Held { why: String, pending: i64 },
}

/// [`Lease::Held`] when `sub` has PENDING deliveries, else [`Lease::Nothing`].
async fn held(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    sub: &str,
    why: String,
) -> Result<Lease, sqlx::Error> {
    let pending = pending_count(&mut **tx, sub).await?;
    Ok(if pending > 0 {
        Lease::Held { why, pending }
    } else {
        Lease::Nothing
    })
}

async fn pending_count<'e>(
    db: impl sqlx::Executor<'e, Database = sqlx::MySql>,
    sub: &str,
) -> Result<i64, sqlx::Error> {
    sqlx::query(
        "SELECT COUNT(*) FROM orbit_deliveries FORCE INDEX (by_subscription) \
         WHERE subscription_id = ? AND state = 'PENDING'",
    )
    .bind(sub)
    .fetch_one(db)
    .await?
    .try_get(0)
}

/// Says on standard error why a stream holds PENDING deliveries back, once per change, so
/// that a person (or a test) can tell "nothing to send" from "not sending".
#[derive(Default)]
struct HoldReport(Option<(String, i64)>);

impl HoldReport {
    fn holding(&mut self, sub: &str, why: String, pending: i64) {
        let now = Some((why, pending));
        if self.0 != now {
            let (why, pending) = now.as_ref().expect("just set");
            eprintln!("orbit-dev: subscription {sub}: {why}; holding {pending} pending");
            self.0 = now;
        }
    }

    fn clear(&mut self) {
        self.0 = None;
    }

    /// Whether the last line said `why`.
    fn is(&self, why: &str) -> bool {
        self.0.as_ref().is_some_and(|(w, _)| w == why)
    }
}

/// Why a stream holds deliveries when its client granted no credit.
const NO_CREDIT: &str = "the client has no credit";

/// One ACK's answer: the result, and why when it is refused.
type AckAnswer = (AckResult, Option<String>);

/// Checks an ACK against the delivery's current lease and records it, in `tx`.
async fn ack_in(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    sub: &str,
    delivery_id: &str,
    proof: &str,
) -> Result<AckAnswer, sqlx::Error> {
    let hash = sha256(proof);
    let Some(row) = sqlx::query("SELECT state, proof_sha256, acked_proof_sha256, lease_expires_at > UTC_TIMESTAMP(6) \
                                 FROM orbit_deliveries WHERE id = ? AND subscription_id = ? FOR UPDATE")
        .bind(delivery_id)
        .bind(sub)
        .fetch_optional(&mut **tx)
        .await?
    else {
        return Ok((AckResult::Refused, Some("no such delivery on this subscription".into())));
    };
    let state: String = row.try_get_unchecked(0)?;
    let current: Option<Vec<u8>> = row.try_get(1)?;
    let acked_with: Option<Vec<u8>> = row.try_get(2)?;
    let live = row.try_get::<Option<i64>, _>(3)? == Some(1);
    Ok(match state.as_str() {
        "ACKED" if acked_with.as_deref() == Some(&hash[..]) => (AckResult::AlreadyAcked, None),
        "ACKED" => (AckResult::Refused, Some("acked by another lease".into())),
        "LEASED" if current.as_deref() == Some(&hash[..]) && live => {
            sqlx::query("UPDATE orbit_deliveries SET state = 'ACKED', acked_proof_sha256 = proof_sha256, proof_sha256 = NULL, \
                         lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6) WHERE id = ?")
                .bind(delivery_id)
                .execute(&mut **tx)
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
    })
}

/// Checks and records the ACKs that arrived together, in one transaction; each gets the answer
/// it would get alone (an ACK's answer means what `docs/orbit-protocol.md` says).
pub(super) async fn ack_many(
    p: &Platform,
    sub: &str,
    acks: &[(&str, &str)],
) -> Result<Vec<AckAnswer>, sqlx::Error> {
    // Rows are locked in id order, so that two batches never wait on each other in a circle;
    // a deadlock with another kind of transaction is retried (InnoDB rolled this one back).
    let mut order: Vec<usize> = (0..acks.len()).collect();
    order.sort_by_key(|&i| acks[i].0);
    let mut tries = 0;
    let answers = loop {
        match ack_in_order(p, sub, acks, &order).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("40001") && tries < 3 => {
                tries += 1;
            }
            result => break result?,
        }
    };
    for (result, _) in &answers {
        p.metrics.ack(*result);
    }
    if answers.iter().any(|(r, _)| *r == AckResult::Acked) {
        p.wake.notify_waiters();
    }
    Ok(answers)
}

/// [`ack_in`] for each of `acks`, taken in `order`, in one transaction; the answers in the
/// order of `acks`.
async fn ack_in_order(
    p: &Platform,
    sub: &str,
    acks: &[(&str, &str)],
    order: &[usize],
) -> Result<Vec<AckAnswer>, sqlx::Error> {
    let mut tx = p.pool.begin().await?;
    let mut answers: Vec<Option<AckAnswer>> = vec![None; acks.len()];
    for &i in order {
        let (delivery_id, proof) = acks[i];
        answers[i] = Some(ack_in(&mut tx, sub, delivery_id, proof).await?);
    }
    tx.commit().await?;
    Ok(answers.into_iter().flatten().collect())
}

/// Ends the leases the client handed back, in one transaction: each delivery whose current
/// lease the proof belongs to goes back to PENDING with its attempt uncounted (it was never
/// tried). Any other proof changes nothing. No answer.
async fn release(
    p: &Platform,
    sub: &str,
    releases: &[(orbit_sdk::DeliveryId, orbit_sdk::wire::LeaseProof)],
) -> Result<(), sqlx::Error> {
    if releases.is_empty() {
        return Ok(());
    }
    let mut tx = p.pool.begin().await?;
    let mut back = 0;
    for (delivery_id, proof) in releases {
        back += sqlx::query(
            "UPDATE orbit_deliveries SET state = 'PENDING', attempts = attempts - 1, \
             proof_sha256 = NULL, lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6) \
             WHERE id = ? AND subscription_id = ? AND state = 'LEASED' AND proof_sha256 = ?",
        )
        .bind(delivery_id.as_str())
        .bind(sub)
        .bind(sha256(proof.expose()))
        .execute(&mut *tx)
        .await?
        .rows_affected();
    }
    tx.commit().await?;
    if back > 0 {
        p.metrics.released(back);
        p.wake.notify_waiters();
    }
    Ok(())
}

/// Checks one ACK against the delivery's current lease and records it.
pub(super) async fn ack(
    p: &Platform,
    sub: &str,
    delivery_id: &str,
    proof: &str,
) -> Result<AckAnswer, sqlx::Error> {
    let mut answers = ack_many(p, sub, &[(delivery_id, proof)]).await?;
    Ok(answers.remove(0))
}

pub(super) async fn send(socket: &mut WebSocket, m: &ServerMessage) -> bool {
    match serde_json::to_string(m) {
        Ok(text) => socket.send(Message::Text(text.into())).await.is_ok(),
        Err(_) => false,
    }
}

async fn serve_stream(p: Shared, sub: String, mut socket: WebSocket) {
    let mut credit: u32 = 0;
    let mut heartbeat = tokio::time::interval(Duration::from_secs(10));
    let mut poll = tokio::time::interval(Duration::from_millis(250));
    let mut report = HoldReport::default();
    loop {
        // Hand out deliveries while the client has credit.
        while credit > 0 {
            // The close-after-delivery fault closes the stream after one delivery: lease one.
            let max = if p.close_after_delivery.load(Ordering::SeqCst) {
                1
            } else {
                credit
            };
            match lease(&p, &sub, max).await {
                Ok(Lease::Leased(messages)) => {
                    report.clear();
                    credit -= messages.len() as u32;
                    for m in &messages {
                        if !send(&mut socket, m).await {
                            return;
                        }
                        if p.close_after_delivery.swap(false, Ordering::SeqCst) {
                            let _ = socket.close().await;
                            return;
                        }
                    }
                }
                Ok(Lease::Nothing) => {
                    report.clear();
                    break;
                }
                Ok(Lease::Held { why, pending }) => {
                    report.holding(&sub, why, pending);
                    break;
                }
                Err(e) => {
                    eprintln!("orbit-dev: leasing failed: {e}");
                    break;
                }
            }
        }
        let wake = p.wake.notified();
        tokio::select! {
            msg = socket.recv() => {
                // Frames that arrived together are handled together: their ACKs are recorded
                // in one transaction, each still answered on its own.
                let mut frames = vec![msg];
                while frames.len() < FRAME_BATCH {
                    match socket.recv().now_or_never() {
                        Some(next) => frames.push(next),
                        None => break,
                    }
                }
                let mut acks = Vec::new();
                let mut releases = Vec::new();
                let mut end = None;
                for msg in frames {
                    let text = match msg {
                        Some(Ok(Message::Text(t))) => t,
                        Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                            end = Some(false);
                            break;
                        }
                        // The protocol is text frames only: close rather than guess.
                        Some(Ok(Message::Binary(_))) => {
                            end = Some(true);
                            break;
                        }
                        Some(Ok(_)) => continue,
                    };
                    match serde_json::from_str::<ClientMessage>(text.as_str()) {
                        Ok(ClientMessage::Credit { credit: more }) => credit = credit.saturating_add(more).min(10_000),
                        Ok(ClientMessage::Heartbeat) => {}
                        Ok(ClientMessage::Ack { delivery_id, proof }) => acks.push((delivery_id, proof)),
                        Ok(ClientMessage::Release { delivery_id, proof }) => releases.push((delivery_id, proof)),
                        // Not the contract: close rather than guess.
                        Err(_) => {
                            end = Some(true);
                            break;
                        }
                    }
                }
                // Releases first: an answer to an ACK sent after a release shows the release
                // was recorded.
                if let Err(e) = release(&p, &sub, &releases).await {
                    eprintln!("orbit-dev: release failed: {e}");
                    return;
                }
                if !answer_acks(&p, &sub, &mut socket, acks).await {
                    return;
                }
                match end {
                    Some(true) => {
                        let _ = socket.close().await;
                        return;
                    }
                    Some(false) => return,
                    None => {}
                }
            }
            _ = wake => {}
            _ = poll.tick() => {
                // A client without credit is said once it has stayed so for a tick, never per
                // delivery: a draining client runs out of credit after every delivery it takes.
                if credit == 0 && !report.is(NO_CREDIT) {
                    match pending_count(&p.pool, &sub).await {
                        Ok(0) | Err(_) => report.clear(),
                        Ok(pending) => report.holding(&sub, NO_CREDIT.to_owned(), pending),
                    }
                }
            }
            _ = heartbeat.tick() => {
                if !send(&mut socket, &ServerMessage::Heartbeat).await {
                    return;
                }
            }
        }
    }
}

/// The most frames one turn of a stream's loop reads before it answers.
const FRAME_BATCH: usize = 256;

/// Records and answers `acks`, in order; `false` when the stream is to end. While one of the
/// ACK faults is armed they go one at a time, so that the fault meets exactly the next ACK.
async fn answer_acks(
    p: &Platform,
    sub: &str,
    socket: &mut WebSocket,
    acks: Vec<(orbit_sdk::DeliveryId, orbit_sdk::wire::LeaseProof)>,
) -> bool {
    if acks.is_empty() {
        return true;
    }
    let faults_armed = p.stall_next_ack.load(Ordering::SeqCst)
        || p.drop_next_ack.load(Ordering::SeqCst)
        || p.drop_next_ack_reply.load(Ordering::SeqCst);
    if faults_armed {
        for (delivery_id, proof) in acks {
            if p.stall_next_ack.swap(false, Ordering::SeqCst) {
                // The ACK arrived and is never handled: the delivery stays LEASED until its
                // lease runs out, and the client waits for an answer.
                continue;
            }
            if p.drop_next_ack.swap(false, Ordering::SeqCst) {
                // The ACK is lost on the way: never recorded, never answered.
                let _ = socket.close().await;
                return false;
            }
            let (result, reason) = match ack(p, sub, &delivery_id, proof.expose()).await {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("orbit-dev: ack failed: {e}");
                    return false;
                }
            };
            if p.drop_next_ack_reply.swap(false, Ordering::SeqCst) {
                // The ACK is recorded; the client never hears so.
                let _ = socket.close().await;
                return false;
            }
            if !answer(socket, delivery_id, (result, reason)).await {
                return false;
            }
        }
        return true;
    }
    let pairs: Vec<(&str, &str)> = acks
        .iter()
        .map(|(id, proof)| (id.as_str(), proof.expose()))
        .collect();
    let answers = match ack_many(p, sub, &pairs).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("orbit-dev: ack failed: {e}");
            return false;
        }
    };
    for ((delivery_id, _), given) in acks.into_iter().zip(answers) {
        if !answer(socket, delivery_id, given).await {
            return false;
        }
    }
    true
}

/// Sends one ACK's answer; `false` when the stream is gone.
async fn answer(
    socket: &mut WebSocket,
    delivery_id: orbit_sdk::DeliveryId,
    given: AckAnswer,
) -> bool {
    let (result, reason) = given;
    let message = ServerMessage::AckResult {
        delivery_id,
        result,
        reason,
    };
    send(socket, &message).await
}
