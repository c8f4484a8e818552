//! The delivery life cycle's transactions: a stream's turn (leases handed back, ACKs recorded,
//! new leases taken, all in one transaction), and lease expiry.
//!
//! Every statement is set-based: a turn costs the same few round trips whether it records one
//! ACK or sixty, and leases one delivery or sixty.

use std::collections::HashMap;
use std::time::Duration;

use orbit_wire::DeliveryId;
use orbit_wire::{AckResult, LeaseProof, ServerMessage};
use serde_json::value::RawValue;
use sqlx::{MySql, Row, Transaction};

use super::Platform;
use crate::db::{self, random_hex, sha256};

/// Expires leases that ran out: back to PENDING, or EXPIRED when the budget is spent. The
/// `by_lease` index makes each pass read only the leases that ran out, however many
/// deliveries the platform keeps.
pub async fn expire_leases(p: super::Shared) {
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

/// The most deliveries one turn leases.
const LEASE_BATCH: u32 = 64;

/// One ACK's answer: the result, and why when it is refused.
pub(super) type AckAnswer = (AckResult, Option<String>);

/// What one leasing attempt found.
pub(super) enum Lease {
    /// Deliveries, leased: the messages to send, oldest first.
    Leased(Vec<ServerMessage>),
    /// No PENDING delivery (or no leasing was asked for).
    Nothing,
    /// PENDING deliveries wait, and why (paused, or the window is full).
    Held { why: String, pending: i64 },
}

/// What a stream's client sent since its last turn: leases handed back and ACKs, in the order
/// they came.
#[derive(Default)]
pub(super) struct Inbound {
    pub releases: Vec<(DeliveryId, LeaseProof)>,
    pub acks: Vec<(DeliveryId, LeaseProof)>,
}

/// What a turn did: each ACK's answer (in the order of [`Inbound::acks`]) and the new leases.
pub(super) struct Turned {
    pub answers: Vec<AckAnswer>,
    pub lease: Lease,
}

/// One turn of a stream of `sub`, in one transaction: the leases handed back become PENDING
/// again, the ACKs are checked and recorded (each answered as it would be alone), and, when
/// `lease` is above 0, up to that many PENDING deliveries are leased. Nothing is answered or
/// sent before the commit, so an ACK's answer still means the ACK is recorded. A deadlock is
/// retried (InnoDB rolled the transaction back).
pub(super) async fn turn(
    p: &Platform,
    sub: &str,
    inbound: &Inbound,
    lease: u32,
) -> Result<Turned, sqlx::Error> {
    let mut tries = 0;
    let (turned, released) = loop {
        match turn_once(p, sub, inbound, lease).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("40001") && tries < 3 => {
                tries += 1;
            }
            result => break result?,
        }
    };
    if !turned.answers.is_empty() {
        p.metrics.ack_turn();
    }
    for (result, _) in &turned.answers {
        p.metrics.ack(*result);
    }
    if released > 0 {
        p.metrics.released(released);
    }
    // Other streams of the subscription may have room again.
    if released > 0 || turned.answers.iter().any(|(r, _)| *r == AckResult::Acked) {
        p.wake.notify_waiters();
    }
    Ok(turned)
}

/// [`turn`], once; also how many leases were handed back.
async fn turn_once(
    p: &Platform,
    sub: &str,
    inbound: &Inbound,
    lease: u32,
) -> Result<(Turned, u64), sqlx::Error> {
    let mut tx = p.pool.begin().await?;
    // Leasing streams of one subscription take its row first: they go one at a time, so no
    // delivery is leased twice, and their row locks are always taken in the same order.
    let window = if lease > 0 {
        Some(lock_subscription(&mut tx, sub).await?)
    } else {
        None
    };
    let released = release_in(&mut tx, sub, &inbound.releases).await?;
    let answers = acks_in(&mut tx, sub, &inbound.acks).await?;
    let lease = match window {
        Some(Some(w)) => {
            // The window as it is now: this turn's ACKs and releases ended leases it counted.
            let acked = answers
                .iter()
                .filter(|(r, _)| *r == AckResult::Acked)
                .count();
            let outstanding = w.outstanding - acked as i64 - released as i64;
            lease_in(&mut tx, p, sub, &w, outstanding, lease).await?
        }
        Some(None) | None => Lease::Nothing,
    };
    tx.commit().await?;
    Ok((Turned { answers, lease }, released))
}

/// A subscription's state, read with its row locked.
struct Window {
    enabled: bool,
    size: u32,
    /// Deliveries LEASED or EXPIRED when the row was locked.
    outstanding: i64,
}

/// Locks `sub`'s row (`FOR UPDATE`) and reads its state; `None` when there is no such
/// subscription.
async fn lock_subscription(
    tx: &mut Transaction<'_, MySql>,
    sub: &str,
) -> Result<Option<Window>, sqlx::Error> {
    let Some(s) =
        sqlx::query("SELECT enabled, window_size FROM orbit_subscriptions WHERE id = ? FOR UPDATE")
            .bind(sub)
            .fetch_optional(&mut **tx)
            .await?
    else {
        return Ok(None);
    };
    // `by_subscription` by name: the optimizer otherwise may take `by_lease` (state first) and
    // read every PENDING delivery of every subscription, a cost that grows with the backlog.
    let outstanding: i64 = sqlx::query(
        "SELECT COUNT(*) FROM orbit_deliveries FORCE INDEX (by_subscription) \
         WHERE subscription_id = ? AND state IN ('LEASED', 'EXPIRED')",
    )
    .bind(sub)
    .fetch_one(&mut **tx)
    .await?
    .try_get(0)?;
    Ok(Some(Window {
        enabled: s.try_get(0)?,
        size: s.try_get(1)?,
        outstanding,
    }))
}

/// Leases the oldest PENDING deliveries of `sub`, up to `max` and to what the window has room
/// for, in `tx`, whose transaction holds the subscription's row; returns the messages to send.
async fn lease_in(
    tx: &mut Transaction<'_, MySql>,
    p: &Platform,
    sub: &str,
    window: &Window,
    outstanding: i64,
    max: u32,
) -> Result<Lease, sqlx::Error> {
    if !window.enabled {
        return held(tx, sub, "paused".to_owned()).await;
    }
    let size = i64::from(window.size);
    if outstanding >= size {
        let why = format!("window full ({outstanding} of {size} leased or expired)");
        return held(tx, sub, why).await;
    }
    let room = (size - outstanding).min(i64::from(max.min(LEASE_BATCH)));
    // A plain read: only a leasing turn moves a delivery out of PENDING, and this turn holds
    // the subscription's row, so what it reads as PENDING stays so until it commits (the
    // UPDATE below checks). The expiry is the server's clock, once for the whole batch.
    let rows = sqlx::query(
        "SELECT d.seq, d.id, d.attempts, e.body, \
         DATE_FORMAT(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, '%Y-%m-%d %H:%i:%s.%f'), \
         DATE_FORMAT(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, '%Y-%m-%d %H:%i:%s.%f') \
         FROM orbit_deliveries d FORCE INDEX (by_subscription) JOIN orbit_events e ON e.id = d.event_id \
         WHERE d.subscription_id = ? AND d.state = 'PENDING' ORDER BY d.seq LIMIT ?",
    )
    .bind(p.lease.as_micros() as u64)
    .bind(told_expiry(p))
    .bind(sub)
    .bind(room)
    .fetch_all(&mut **tx)
    .await?;
    let Some(first) = rows.first() else {
        return Ok(Lease::Nothing);
    };
    let expires: String = first.try_get_unchecked(4)?;
    let told: String = first.try_get_unchecked(5)?;
    // Each lease its own proof; one UPDATE for all of them.
    let mut leased = Vec::with_capacity(rows.len());
    for d in &rows {
        let seq: u64 = d.try_get(0)?;
        let delivery_id: String = d.try_get_unchecked(1)?;
        let attempt: u32 = d.try_get::<u32, _>(2)? + 1;
        let body: Vec<u8> = d.try_get(3)?;
        leased.push((seq, delivery_id, attempt, random_hex(32), body));
    }
    let cases = " WHEN ? THEN ?".repeat(leased.len());
    let marks = vec!["?"; leased.len()].join(", ");
    let sql = format!(
        "UPDATE orbit_deliveries SET state = 'LEASED', attempts = attempts + 1, \
         proof_sha256 = CASE seq{cases} END, lease_expires_at = ?, updated_at = UTC_TIMESTAMP(6) \
         WHERE seq IN ({marks}) AND state = 'PENDING'"
    );
    let mut update = sqlx::query(&sql);
    for (seq, _, _, proof, _) in &leased {
        update = update.bind(*seq).bind(sha256(proof));
    }
    update = update.bind(&expires);
    for (seq, ..) in &leased {
        update = update.bind(*seq);
    }
    let changed = update.execute(&mut **tx).await?.rows_affected();
    if p.fault_api {
        let sql = format!(
            "INSERT INTO orbit_issued_proofs (proof_sha256) VALUES {}",
            vec!["(?)"; leased.len()].join(", ")
        );
        let mut issued = sqlx::query(&sql);
        for (_, _, _, proof, _) in &leased {
            issued = issued.bind(sha256(proof));
        }
        issued.execute(&mut **tx).await?;
    }
    if changed != leased.len() as u64 {
        // Not possible while every leasing turn holds the subscription's row; if it were, no
        // lease of this batch may stand.
        return Err(sqlx::Error::Protocol(format!(
            "leased {changed} of {} PENDING deliveries read",
            leased.len()
        )));
    }
    // The wire form of the expiry: `db::TS`, the same instant on the platform's clock as it
    // tells it (`--clock-offset-seconds`).
    let wire_expires = format!("{}Z", told.replacen(' ', "T", 1));
    let mut messages = Vec::with_capacity(leased.len());
    for (_, delivery_id, attempt, proof, body) in leased {
        let event = RawValue::from_string(String::from_utf8_lossy(&body).into_owned())
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        messages.push(ServerMessage::Delivery {
            delivery_id: DeliveryId::new(delivery_id)
                .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
            attempt,
            proof: LeaseProof::new(proof),
            lease_expires_at: wire_expires.clone(),
            event,
        });
    }
    Ok(Lease::Leased(messages))
}

/// [`Lease::Held`] when `sub` has PENDING deliveries, else [`Lease::Nothing`].
async fn held(
    tx: &mut Transaction<'_, MySql>,
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

/// How many deliveries of `sub` are PENDING (one range of the `by_subscription` index).
pub(super) async fn pending_count<'e>(
    db: impl sqlx::Executor<'e, Database = MySql>,
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

/// What an ACK found of its delivery, with the row locked.
struct Found {
    state: String,
    current: Option<Vec<u8>>,
    acked_with: Option<Vec<u8>>,
    live: bool,
}

/// Checks `acks` against their deliveries' current leases and records them, in `tx`: one
/// locking read and one UPDATE for all. Each answer is the one the ACK would get alone, after
/// the ones before it (a second ACK with the same proof is `already_acked`). Rows are locked
/// in id order, so that two turns never wait on each other in a circle.
async fn acks_in(
    tx: &mut Transaction<'_, MySql>,
    sub: &str,
    acks: &[(DeliveryId, LeaseProof)],
) -> Result<Vec<AckAnswer>, sqlx::Error> {
    if acks.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids: Vec<&str> = acks.iter().map(|(id, _)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let sql = format!(
        "SELECT id, state, proof_sha256, acked_proof_sha256, lease_expires_at > UTC_TIMESTAMP(6) \
         FROM orbit_deliveries FORCE INDEX (by_id) WHERE id IN ({}) AND subscription_id = ? \
         ORDER BY id FOR UPDATE",
        vec!["?"; ids.len()].join(", ")
    );
    let mut query = sqlx::query(&sql);
    for id in &ids {
        query = query.bind(*id);
    }
    let mut found = HashMap::with_capacity(ids.len());
    for row in query.bind(sub).fetch_all(&mut **tx).await? {
        let id: String = row.try_get_unchecked(0)?;
        found.insert(
            id,
            Found {
                state: row.try_get_unchecked(1)?,
                current: row.try_get(2)?,
                acked_with: row.try_get(3)?,
                live: row.try_get::<Option<i64>, _>(4)? == Some(1),
            },
        );
    }
    let mut answers = Vec::with_capacity(acks.len());
    let mut acked = Vec::new();
    for (id, proof) in acks {
        let hash = sha256(proof.expose());
        let Some(d) = found.get_mut(id.as_str()) else {
            answers.push((
                AckResult::Refused,
                Some("no such delivery on this subscription".into()),
            ));
            continue;
        };
        let matches = d.current.as_deref() == Some(&hash[..]);
        answers.push(match d.state.as_str() {
            "ACKED" if d.acked_with.as_deref() == Some(&hash[..]) => {
                (AckResult::AlreadyAcked, None)
            }
            "ACKED" => (AckResult::Refused, Some("acked by another lease".into())),
            "LEASED" if matches && d.live => {
                d.state = "ACKED".into();
                d.acked_with = d.current.take();
                acked.push(id.as_str());
                (AckResult::Acked, None)
            }
            "LEASED" if matches => (AckResult::Refused, Some("the lease has expired".into())),
            _ => (
                AckResult::Refused,
                Some("the proof belongs to a superseded or expired lease".into()),
            ),
        });
    }
    if !acked.is_empty() {
        let sql = format!(
            "UPDATE orbit_deliveries SET state = 'ACKED', acked_proof_sha256 = proof_sha256, \
             proof_sha256 = NULL, lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6), \
             acked_at = UTC_TIMESTAMP(6) \
             WHERE id IN ({})",
            vec!["?"; acked.len()].join(", ")
        );
        let mut update = sqlx::query(&sql);
        for id in &acked {
            update = update.bind(*id);
        }
        update.execute(&mut **tx).await?;
    }
    Ok(answers)
}

/// Ends the leases handed back, in `tx`: each delivery whose current lease the proof belongs
/// to goes back to PENDING with its attempt uncounted (it was never tried). Any other proof
/// changes nothing. How many went back.
async fn release_in(
    tx: &mut Transaction<'_, MySql>,
    sub: &str,
    releases: &[(DeliveryId, LeaseProof)],
) -> Result<u64, sqlx::Error> {
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
        .execute(&mut **tx)
        .await?
        .rows_affected();
    }
    Ok(back)
}

/// Checks one ACK against the delivery's current lease and records it, in a transaction of
/// its own (the path the ACK faults take, one ACK at a time).
pub(super) async fn ack_one(
    p: &Platform,
    sub: &str,
    delivery_id: DeliveryId,
    proof: LeaseProof,
) -> Result<AckAnswer, sqlx::Error> {
    let inbound = Inbound {
        releases: Vec::new(),
        acks: vec![(delivery_id, proof)],
    };
    let mut turned = turn(p, sub, &inbound, 0).await?;
    Ok(turned.answers.remove(0))
}

/// The timestamp format on the wire ([`db::TS`]) is what [`lease_in`] builds from the
/// server's `'%Y-%m-%d %H:%i:%s.%f'`.
const _: () = assert!(matches!(db::TS.as_bytes(), b"%Y-%m-%dT%H:%i:%s.%fZ"));

/// Microseconds from now to the lease's end as the platform tells it: the lease, shifted by
/// `--clock-offset-seconds`.
fn told_expiry(p: &Platform) -> i64 {
    let lease = p.lease.as_micros() as i64;
    let offset = p.clock_offset.as_micros() as i64;
    if p.clock_behind {
        lease - offset
    } else {
        lease + offset
    }
}
