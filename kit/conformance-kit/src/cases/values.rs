//! Cases on values a port meets only at their edges: versions whose text order differs from
//! their numeric order, duplicates of every kind of original, results near the size limit, and
//! two consumers and two queues on one database.

use std::time::Duration;

use orbit_sdk::DeliveryId;

use crate::world::*;
use crate::*;
use fixtures::QUEUE;

/// Where the contract says what each decision writes.
const DECISIONS: &str = "docs/receiver-contract.md, \"The apply, decision by decision\"";

/// Pairs of versions whose decimal text orders them the other way (9 and 10, 99 and 100), or
/// that a double or a signed 64-bit integer cannot tell apart or order: 2^53 and 2^53 + 1,
/// 2^63 − 1 and 2^63, 2^63 and 2^64 − 1.
const VERSION_PAIRS: [(u64, u64); 5] = [
    (9, 10),
    (99, 100),
    (1 << 53, (1 << 53) + 1),
    (i64::MAX as u64, 1 << 63),
    (1 << 63, u64::MAX),
];

/// Waits until every delivery of `sent` is ACKed (`rule` names a failure).
async fn all_acked(w: &World, sent: &[Vec<DeliveryId>], rule: &str) -> Result<(), String> {
    let ids: Vec<DeliveryId> = sent.iter().flatten().cloned().collect();
    w.acked(&ids, Duration::from_secs(30), rule).await
}

pub(crate) async fn version_order(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let _p = w.running().await?;
    // Per pair, two tasks: the lower version first (the view must advance) and the higher
    // first (the lower must be stale).
    let mut plans = Vec::new();
    for (i, (low, high)) in VERSION_PAIRS.into_iter().enumerate() {
        plans.push((format!("order-{i}-up"), low, high));
        plans.push((format!("order-{i}-down"), high, low));
    }
    let rule = "R-STORE-6 (every version from 1 to 2^64-1 is applied; docs/receiver-contract.md)";
    let first: Vec<_> = plans
        .iter()
        .map(|(task, v, _)| {
            w.send(&w.event(&format!("{task}-a"), task, *v, "task.started"))
                .1
        })
        .collect();
    all_acked(&w, &first, rule).await?;
    let second: Vec<_> = plans
        .iter()
        .map(|(task, _, v)| {
            w.send(&w.event(&format!("{task}-b"), task, *v, "task.started"))
                .1
        })
        .collect();
    all_acked(&w, &second, rule).await?;
    for (task, a, b) in &plans {
        let (high, winner, loser) = if a > b {
            (*a, format!("{task}-a"), format!("{task}-b"))
        } else {
            (*b, format!("{task}-b"), format!("{task}-a"))
        };
        let view = w
            .own_view_text(task)
            .await
            .ok_or_else(|| format!("R-STORE-5: task {task} has no view after two ACKed events"))?;
        let (version, last) = (
            view[0].clone().unwrap_or_default(),
            hex_text(view[1].as_deref().unwrap_or_default()),
        );
        ensure!(
            version == high.to_string() && last == winner,
            "R-STORE-6: task {task} met v{a} and then v{b}: its view holds v{version} by event {last}, not v{high} by {winner}; versions are compared as unsigned 64-bit integers, never as text, a double or a signed integer ({DECISIONS})"
        );
        let rows = w.inbox(&loser).await;
        ensure!(
            rows.len() == 1 && rows[0].1 == (a < b),
            "R-STORE-6: task {task} met v{a} and then v{b}: event {loser}'s inbox row should say applied = {}; it is {:?} ({DECISIONS})",
            a < b,
            rows.first().map(|r| r.1)
        );
    }
    Ok(format!(
        "{} tasks, each meeting two of 9, 10, 99, 100, 2^53, 2^53+1, 2^63-1, 2^63, 2^64-1 in either order: every view at the higher",
        plans.len()
    ))
}

/// Waits two leases and a second: none of `deliveries` may be ACKed by then.
async fn none_acked(w: &World, deliveries: &[(String, Vec<DeliveryId>)]) -> Result<(), String> {
    tokio::time::sleep(Duration::from_secs(2 * SHORT_LEASE + 1)).await;
    for (what, ids) in deliveries {
        for id in ids {
            let d = w.delivery(id).await;
            ensure!(
                d.state != "ACKED",
                "R-STORE-4: {what} was ACKed (attempt {}): a same-id event with other content is a conflict, whether the stored original was applied, recorded stale or recorded again after a prune; never ACK one ({DECISIONS})",
                d.attempts
            );
        }
    }
    Ok(())
}

pub(crate) async fn duplicate_originals(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let _p = w.running().await?;
    let rule = "R-STORE-4 (a same-id event with the same content is a duplicate, ACKed)";
    // Applied (dup-applied v2), recorded stale (dup-stale v1, after v2), and pruned then
    // recorded again (dup-pruned v1 of its own task).
    let applied = w.event("dup-applied", "dup-task", 2, "task.started");
    let stale = w.event("dup-stale", "dup-task", 1, "task.started");
    let pruned = w.event("dup-pruned", "dup-task-2", 1, "task.started");
    all_acked(&w, &[w.send(&applied).1, w.send(&pruned).1], rule).await?;
    all_acked(
        &w,
        &[w.send(&stale).1],
        "R-STORE-6 (an older version is ACKed as history)",
    )
    .await?;
    let mut admin = w.admin().await;
    sqlx::query("DELETE FROM receiver_inbox WHERE event_id = ?")
        .bind("dup-pruned")
        .execute(&mut admin)
        .await
        .expect("the kit deletes an inbox row, as a prune would");
    all_acked(
        &w,
        &[w.send(&pruned).1],
        "R-STORE-12 (a redelivery after its inbox row was pruned is ACKed as history)",
    )
    .await?;
    let recorded = |id: &'static str| {
        let w = &w;
        async move {
            let rows = w.inbox(id).await;
            rows.first()
                .map(|(digest, applied, _)| (digest.clone(), *applied))
        }
    };
    let views = (
        w.own_view_text("dup-task").await,
        w.own_view_text("dup-task-2").await,
    );
    let stored = [
        recorded("dup-applied").await,
        recorded("dup-stale").await,
        recorded("dup-pruned").await,
    ];
    ensure!(
        stored[0].as_ref().is_some_and(|r| r.1) && stored[1].as_ref().is_some_and(|r| !r.1),
        "R-STORE-6: dup-applied (v2) and dup-stale (v1 after it) should be recorded applied and not applied; they are {:?} and {:?}",
        stored[0].as_ref().map(|r| r.1),
        stored[1].as_ref().map(|r| r.1)
    );
    // The same content again, for each original: ACKed, nothing moved.
    let same: Vec<_> = [&applied, &stale, &pruned]
        .into_iter()
        .map(|e| w.send(e).1)
        .collect();
    all_acked(&w, &same, rule).await?;
    // Other content under each id: never ACKed.
    let other = |e: &Body| e.clone().with_text("occurred_at", "2026-12-07T00:00:00Z");
    let mut conflicts = vec![
        (
            "dup-applied with other content (its original applied)".to_owned(),
            w.send(&other(&applied)).1,
        ),
        (
            "dup-stale with other content (its original recorded stale)".to_owned(),
            w.send(&other(&stale)).1,
        ),
    ];
    if stored[2].is_some() {
        conflicts.push((
            "dup-pruned with other content (its original recorded again after a prune)".to_owned(),
            w.send(&other(&pruned)).1,
        ));
    }
    none_acked(&w, &conflicts).await?;
    let after = [
        recorded("dup-applied").await,
        recorded("dup-stale").await,
        recorded("dup-pruned").await,
    ];
    for (id, (before, now)) in ["dup-applied", "dup-stale", "dup-pruned"]
        .iter()
        .zip(stored.iter().zip(&after))
    {
        ensure!(
            before == now && w.inbox(id).await.len() <= 1,
            "R-STORE-4: event {id}'s inbox record changed after a duplicate or a conflict (applied {:?} -> {:?}); a recorded event is never rewritten",
            before.as_ref().map(|r| r.1),
            now.as_ref().map(|r| r.1)
        );
    }
    let views_after = (
        w.own_view_text("dup-task").await,
        w.own_view_text("dup-task-2").await,
    );
    for (task, before, now) in [
        ("dup-task", &views.0, &views_after.0),
        ("dup-task-2", &views.1, &views_after.1),
    ] {
        ensure!(
            before == now,
            "R-STORE-4: task {task}'s view moved on duplicates and conflicts: {}",
            match (before, now) {
                (Some(b), Some(n)) => changed_columns(b, n),
                _ => "the row appeared or went".into(),
            }
        );
    }
    Ok(format!(
        "duplicates of an applied, a stale and a {} original ACKed; {} conflicts never ACKed; records and views unchanged",
        if stored[2].is_some() { "pruned and re-recorded" } else { "pruned (not re-recorded)" },
        conflicts.len()
    ))
}

/// A result of `size` bytes in canonical form: an object with one string member that starts
/// and ends with multi-byte characters and has a 4-byte one across byte 65,535 (where a 64 KiB
/// column cuts).
fn large_result(size: usize) -> String {
    let head = "{\"text\":\"é😀";
    let tail = "€😀\"}";
    let across = 65_533 - head.len();
    let rest = size - head.len() - across - "😀".len() - tail.len();
    format!("{head}{}😀{}{tail}", "a".repeat(across), "b".repeat(rest))
}

/// Result sizes: past 64 KiB, past a 16-bit length, and near the 512 KiB event limit.
const LARGE_SIZES: [usize; 3] = [70_000, 200_000, 520_000];

pub(crate) async fn large_results(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, 5).await;
    let _p = w.running().await?;
    let mut sent = Vec::new();
    for (i, size) in LARGE_SIZES.into_iter().enumerate() {
        let (id, task) = (format!("large-{i}"), format!("large-task-{i}"));
        let result = large_result(size);
        let event = w
            .event(&id, &task, 1, "task.succeeded")
            .with("result", result.clone());
        let text = event.text();
        let (_, ids) = w.send(&event);
        sent.push((id, task, result, text, ids));
    }
    let ids: Vec<_> = sent.iter().map(|s| s.4.clone()).collect();
    all_acked(
        &w,
        &ids,
        "R-SCHEMA-4 (a result up to the 512 KiB event limit is stored whole)",
    )
    .await?;
    for (id, task, result, text, _) in &sent {
        let (canonical, _) = result_inbox::canonicalize(result.as_bytes()).expect("a valid result");
        let (event, _) = result_inbox::canonicalize(text.as_bytes()).expect("a valid event");
        let view = w.view(task).await.ok_or("R-STORE-5: no view")?;
        let stored = view.result.unwrap_or_default();
        ensure!(
            stored == canonical,
            "R-SCHEMA-4: the view's result of event {id} ({} bytes, multi-byte characters at both ends and across byte 65,535) was not kept whole: {}; a result column must hold 512 KiB, and a session must refuse what does not fit rather than cut it",
            canonical.len(),
            difference(&stored, &canonical)
        );
        let (_, _, recorded) = w
            .inbox(id)
            .await
            .into_iter()
            .next()
            .ok_or("R-STORE-7: no inbox row")?;
        ensure!(
            recorded == event,
            "R-SCHEMA-4: the stored event {id} is not its canonical form whole: {}",
            difference(&recorded, &event)
        );
    }
    Ok(format!(
        "results of {} bytes stored and viewed byte for byte",
        LARGE_SIZES.map(|s| s.to_string()).join(", ")
    ))
}

/// The second consumer name and the second queue of `scopes`.
const OTHER_NAME: &str = "kit-receiver-b";
const OTHER_QUEUE: &str = "kit-queue-b";

pub(crate) async fn scopes(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let _a = w.running().await?;
    // Consumer B on the kit's queue takes task.started only; consumer A on the other queue.
    let b_sub = w
        .client
        .create_subscription(QUEUE, &["task.started"])
        .await
        .expect("a second subscription")
        .id;
    // The other queue's credential, as its operator would be given one.
    let q_file = w.orbit.bootstrap_other(OTHER_QUEUE, true);
    let q_token = orbit_sdk::Credentials::load(&q_file)
        .expect("the other queue's credentials load")
        .token;
    w.extra_secrets.push(q_token.expose().to_owned());
    let q_client = orbit_sdk::Client::new(&w.orbit.url, q_token).expect("a loopback URL");
    let q_sub = q_client
        .create_subscription(OTHER_QUEUE, TYPES)
        .await
        .expect("a subscription on another queue")
        .id;
    let base = w.env(&w.dsn.clone());
    let with = |name: &str, sub: &str, credentials: Option<&std::path::Path>| {
        let mut env = base.clone();
        for (k, v) in &mut env {
            match (*k, credentials) {
                ("RECEIVER_NAME", _) => *v = name.into(),
                ("ORBIT_SUBSCRIPTION_ID", _) => *v = sub.into(),
                ("ORBIT_CREDENTIALS_FILE", Some(file)) => *v = file.display().to_string(),
                _ => {}
            }
        }
        env
    };
    let b_env = with(OTHER_NAME, b_sub.as_ref(), None);
    let q_env = with(RECEIVER_NAME, q_sub.as_ref(), Some(&q_file));
    let _b = w.consume_with(&b_env);
    let _q = w.consume_with(&q_env);
    let task = "scope-task";
    let rule = "R-SCHEMA-3 (each consumer and queue applies its own events)";
    // e1 reaches A and B on the kit's queue; e2 (v3, a result) only A there; e3 (v2) only A
    // on the other queue.
    // The platform delivers e1 to both subscriptions of the kit's queue.
    let e1 = w.send(&w.event("scope-1", task, 1, "task.started")).1;
    all_acked(&w, &[e1], rule).await?;
    let e2 = w.send(
        &w.event("scope-2", task, 3, "task.succeeded")
            .with("result", r#"{"scope":"a"}"#),
    );
    all_acked(&w, &[e2.1], rule).await?;
    let e3 = w.send(
        &w.event("scope-3", task, 2, "task.started")
            .with_text("queue_id", OTHER_QUEUE),
    );
    // Its deliveries are read with the other queue's credential.
    for id in &e3.1 {
        let acked = w
            .or_ended(fixtures::poll(
                Duration::from_secs(30),
                Duration::from_millis(50),
                || async {
                    let d = q_client.get_delivery(id).await.expect("delivery read");
                    (d.state == "ACKED").then_some(())
                },
            ))
            .await?;
        ensure!(
            acked.is_some(),
            "{rule}: delivery {id} of event scope-3 on queue {OTHER_QUEUE} was not ACKED within 30 s"
        );
    }
    let expected = [
        (RECEIVER_NAME, QUEUE, "3", "scope-2"),
        (OTHER_NAME, QUEUE, "1", "scope-1"),
        (RECEIVER_NAME, OTHER_QUEUE, "2", "scope-3"),
    ];
    for (name, queue, version, event) in expected {
        let view = w.view_text(name, queue, task).await.ok_or_else(|| {
            format!("R-SCHEMA-3: consumer {name} on queue {queue} has no view of {task}")
        })?;
        let (v, last) = (
            view[0].clone().unwrap_or_default(),
            hex_text(view[1].as_deref().unwrap_or_default()),
        );
        ensure!(
            v == version && last == event,
            "R-SCHEMA-3: consumer {name}'s view of {task} on queue {queue} is v{v} by {last}; its own events leave it at v{version} by {event}: a view is identified by consumer name, queue and task, and only its own consumer's events of its own queue move it"
        );
    }
    let mut c = w.admin().await;
    let rows: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT consumer_name, queue_id, event_id FROM receiver_inbox ORDER BY 1, 2, 3",
    )
    .fetch_all(&mut c)
    .await
    .expect("the inbox reads");
    let mut rows: Vec<String> = rows
        .iter()
        .map(|(n, q, e)| {
            format!(
                "{}/{}/{}",
                String::from_utf8_lossy(n),
                String::from_utf8_lossy(q),
                String::from_utf8_lossy(e)
            )
        })
        .collect();
    rows.sort();
    let mut want = [
        format!("{OTHER_NAME}/{QUEUE}/scope-1"),
        format!("{RECEIVER_NAME}/{OTHER_QUEUE}/scope-3"),
        format!("{RECEIVER_NAME}/{QUEUE}/scope-1"),
        format!("{RECEIVER_NAME}/{QUEUE}/scope-2"),
    ];
    want.sort();
    ensure!(
        rows == want,
        "R-SCHEMA-2: the inbox should hold {want:?} (consumer/queue/event); it holds {rows:?}"
    );
    Ok("two consumers on one queue and one consumer on two queues: three views, each moved by its own events only".into())
}
