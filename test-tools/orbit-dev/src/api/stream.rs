//! The WebSocket delivery stream: credit, and a turn per batch of frames (see `leasing`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::{FutureExt, SinkExt};
use orbit_wire::{AckResult, ClientMessage, ServerMessage, SCOPE_EVENTS_CONSUME};

use super::auth::caller;
use super::leasing::{ack_one, pending_count, turn, AckAnswer, Inbound, Lease};
use super::subscriptions::visible_subscription;
use super::{ApiResult, Platform, Shared};

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

pub(super) async fn send(socket: &mut WebSocket, m: &ServerMessage) -> bool {
    match serde_json::to_string(m) {
        Ok(text) => socket.send(Message::Text(text.into())).await.is_ok(),
        Err(_) => false,
    }
}

/// The oversize-next-delivery fault: `m` with a member no client reads, padded to 1 MiB, far
/// past the largest legal delivery (a 512 KiB event and its envelope).
async fn send_oversized(socket: &mut WebSocket, m: &ServerMessage) -> bool {
    let Ok(serde_json::Value::Object(mut fields)) = serde_json::to_value(m) else {
        return false;
    };
    fields.insert("padding".into(), "x".repeat(1024 * 1024).into());
    let text = serde_json::Value::Object(fields).to_string();
    socket.send(Message::Text(text.into())).await.is_ok()
}

async fn serve_stream(p: Shared, sub: String, mut socket: WebSocket) {
    let mut credit: u32 = 0;
    // What this stream holds: each delivery leased to it, with when, until its ACK, its
    // release or its lease's end (`orbit_stream_held_max`).
    let mut held: HashMap<String, tokio::time::Instant> = HashMap::new();
    let mut heartbeat = tokio::time::interval(Duration::from_secs(10));
    let mut poll = tokio::time::interval(Duration::from_millis(250));
    let mut report = HoldReport::default();
    let mut inbound = Inbound::default();
    let mut end = None;
    let mut closing = p.close_streams.subscribe();
    loop {
        // Registered before the turn reads anything, so that a delivery made or a lease ended
        // while the turn runs still wakes the wait below.
        let wake = p.wake.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        // One turn: what the client sent is recorded and answered, and deliveries are leased
        // while it has credit, in one transaction.
        let mut again = true;
        while again {
            again = false;
            let mut taken = std::mem::take(&mut inbound);
            for (delivery_id, _) in taken.acks.iter().chain(&taken.releases) {
                held.remove(delivery_id.as_str());
            }
            if faults_armed(&p) {
                // One ACK at a time, apart from leasing, so that the fault meets exactly the
                // next ACK.
                if !answer_one_by_one(&p, &sub, &mut socket, taken).await {
                    return;
                }
                taken = Inbound::default();
            }
            if taken.acks.is_empty() && taken.releases.is_empty() && credit == 0 {
                break;
            }
            // The close-after-delivery fault closes the stream after one delivery: lease one.
            let max = if p.close_after_delivery.load(Ordering::SeqCst) {
                credit.min(1)
            } else {
                credit
            };
            let turned = match turn(&p, &sub, &taken, max).await {
                Ok(t) => t,
                Err(e) => {
                    // Nothing of the turn is recorded: the client's ACKs go unanswered, as if
                    // lost, and the stream ends (the client reconnects).
                    eprintln!("orbit-dev: a stream's turn failed: {e}");
                    return;
                }
            };
            for ((delivery_id, _), given) in taken.acks.into_iter().zip(turned.answers) {
                if !answer(&mut socket, delivery_id, given).await {
                    return;
                }
            }
            match turned.lease {
                Lease::Leased(messages) => {
                    report.clear();
                    let now = tokio::time::Instant::now();
                    held.retain(|_, at| now.duration_since(*at) < p.lease);
                    for m in &messages {
                        if let ServerMessage::Delivery { delivery_id, .. } = m {
                            held.insert(delivery_id.as_str().to_owned(), now);
                        }
                    }
                    p.metrics.held(held.len());
                    credit -= messages.len() as u32;
                    // More may wait than one turn leases.
                    again = credit > 0;
                    for m in &messages {
                        let sent = if p.oversize_next_delivery.swap(false, Ordering::SeqCst) {
                            send_oversized(&mut socket, m).await
                        } else {
                            send(&mut socket, m).await
                        };
                        if !sent {
                            return;
                        }
                        if p.close_after_delivery.swap(false, Ordering::SeqCst) {
                            let _ = socket.close().await;
                            return;
                        }
                    }
                }
                Lease::Nothing if max > 0 => report.clear(),
                Lease::Nothing => {}
                Lease::Held { why, pending } => report.holding(&sub, why, pending),
            }
        }
        match end {
            Some(true) => {
                let _ = socket.close().await;
                return;
            }
            Some(false) => return,
            None => {}
        }
        tokio::select! {
            msg = socket.recv() => {
                // Frames that arrived together are handled together, in the next turn.
                let mut frames = vec![msg];
                while frames.len() < FRAME_BATCH {
                    match socket.recv().now_or_never() {
                        Some(next) => frames.push(next),
                        None => break,
                    }
                }
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
                        Ok(ClientMessage::Ack { delivery_id, proof }) => inbound.acks.push((delivery_id, proof)),
                        // Recorded before the ACKs of the same turn: an answer to an ACK sent
                        // after a release shows the release was recorded.
                        Ok(ClientMessage::Release { delivery_id, proof }) => inbound.releases.push((delivery_id, proof)),
                        // Not the contract: close rather than guess.
                        Err(_) => {
                            end = Some(true);
                            break;
                        }
                    }
                }
                if end.is_some() {
                    // The ACKs and releases read before the end are still recorded and answered.
                    credit = 0;
                }
            }
            _ = wake => {}
            Ok(()) = closing.changed() => {
                // The close-streams fault: this stream ends now; its leases run on.
                let _ = socket.close().await;
                return;
            }
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

/// Whether one of the ACK faults is armed.
fn faults_armed(p: &Platform) -> bool {
    p.stall_next_ack.load(Ordering::SeqCst)
        || p.refuse_next_ack.load(Ordering::SeqCst)
        || p.drop_next_ack.load(Ordering::SeqCst)
        || p.drop_next_ack_reply.load(Ordering::SeqCst)
}

/// Records and answers `inbound` one ACK at a time, each in its own transaction, while an ACK
/// fault is armed; `false` when the stream is to end. Releases go first, as in a turn.
async fn answer_one_by_one(
    p: &Platform,
    sub: &str,
    socket: &mut WebSocket,
    inbound: Inbound,
) -> bool {
    let releases = Inbound {
        releases: inbound.releases,
        acks: Vec::new(),
    };
    if let Err(e) = turn(p, sub, &releases, 0).await {
        eprintln!("orbit-dev: release failed: {e}");
        return false;
    }
    for (delivery_id, proof) in inbound.acks {
        if p.stall_next_ack.swap(false, Ordering::SeqCst) {
            // The ACK arrived and is never handled: the delivery stays LEASED until its
            // lease runs out, and the client waits for an answer.
            continue;
        }
        if p.refuse_next_ack.swap(false, Ordering::SeqCst) {
            // Answered as refused, never recorded (nor counted among the platform's refusals):
            // the delivery stays LEASED until its lease runs out.
            let why = Some("refused by the fault API (refuse-next-ack)".to_owned());
            if !answer(socket, delivery_id, (AckResult::Refused, why)).await {
                return false;
            }
            continue;
        }
        if p.drop_next_ack.swap(false, Ordering::SeqCst) {
            // The ACK is lost on the way: never recorded, never answered.
            let _ = socket.close().await;
            return false;
        }
        let given = match ack_one(p, sub, delivery_id.clone(), proof).await {
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
        if !answer(socket, delivery_id, given).await {
            return false;
        }
    }
    true
}

/// Sends one ACK's answer; `false` when the stream is gone.
async fn answer(
    socket: &mut WebSocket,
    delivery_id: orbit_wire::DeliveryId,
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
