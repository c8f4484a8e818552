//! Cases on what one event does to the two tables: the first receipt, a duplicate, an older
//! version, a conflict, and the content kept exactly (states, numbers, times).

use std::time::Duration;

use commit_proxy::{Action, On, RuleSpec};
use orbit_sdk::DeliveryId;
use result_inbox::Digest;
use serde_json::value::RawValue;

use crate::world::*;
use crate::*;
use fixtures::{poll, QUEUE};

/// Where the contract says what each decision writes.
const DECISIONS: &str = "docs/receiver-contract.md, \"The apply, decision by decision\"";

pub(crate) async fn first_receipt(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let delivery = w.delivery(&w.deliveries_of(&key).await[0]).await;
    ensure!(
        delivery.attempts == 1,
        "R-STORE-7: the first receipt took {} attempts; one suffices",
        delivery.attempts
    );
    let platform = w.client.get_task(&task).await.expect("task read");
    let view = w
        .view(&task)
        .await
        .ok_or("R-STORE-5: the event was ACKed but the task has no view")?;
    ensure!(
        view.version == platform.version
            && view.last_event == key
            && view.state == "CANCELLED"
            && view.result.is_none()
            && view.applied_events == 1,
        "R-STORE-7: the view should be version {}, event {key}, CANCELLED, no result, applied_events 1; it is {view:?}",
        platform.version
    );
    let rows = w.inbox(&key).await;
    ensure!(
        rows.len() == 1,
        "R-STORE-7: {} inbox rows for the event",
        rows.len()
    );
    let (digest, applied, canonical) = &rows[0];
    ensure!(
        *applied,
        "R-STORE-7: the inbox row says the event did not advance the view"
    );
    let (expected, expected_digest) =
        result_inbox::canonicalize(&w.body(&key).await).expect("the platform's event is valid");
    ensure!(
        *canonical == expected,
        "R-CANON-2: the stored event is not its canonical form (docs/canonical-json.md): {}",
        difference(canonical, &expected)
    );
    ensure!(
        digest[..] == expected_digest.0[..] && Digest::of(canonical).0[..] == digest[..],
        "R-CANON-2: the stored digest is not the SHA-256 of the canonical form"
    );
    Ok(format!(
        "ACKed at attempt 1; view v{} applied_events 1; canonical form and digest match",
        view.version
    ))
}

pub(crate) async fn duplicate(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let again = w.redeliver(&key);
    // A duplicate is resolved inside its first lease: once one was handed out again, the
    // receiver did not ACK it.
    for id in &again {
        let seen = w
            .or_ended(poll(
                Duration::from_secs(30),
                Duration::from_millis(50),
                || async {
                    let d = w.delivery(id).await;
                    match (d.attempts, d.state.as_str()) {
                        (0 | 1, "ACKED") => Some(Ok(())),
                        (0 | 1, _) => None,
                        _ => Some(Err(d)),
                    }
                },
            ))
            .await?;
        let stuck = match seen {
            Some(Ok(())) => continue,
            Some(Err(d)) => d,
            None => w.delivery(id).await,
        };
        return Err(format!(
            "R-STORE-4: the duplicate (delivery {id}) was not ACKed at its first attempt: it is {} after {} attempt(s); a duplicate is ACKed at once",
            stuck.state, stuck.attempts
        ));
    }
    let rows = w.inbox(&key).await.len();
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        rows == 1 && view.applied_events == 1,
        "R-STORE-4: after the duplicate: {rows} inbox row(s), applied_events {}; a duplicate must not advance the view again ({DECISIONS})",
        view.applied_events
    );
    Ok("the redelivery ACKed; one inbox row, applied_events 1".into())
}

/// The inbox row of an applied event deleted, as a prune past the window would, and the event
/// delivered again: ACKed, and the view and its `applied_events` unmoved. A receiver that never
/// prunes passes it by R-STORE-6 alone (the same version and event id is not newer).
pub(crate) async fn pruned_redelivery(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let before = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    let mut admin = w.admin().await;
    let pruned = sqlx::query("DELETE FROM receiver_inbox WHERE event_id = ?")
        .bind(&key)
        .execute(&mut admin)
        .await
        .expect("the kit deletes the inbox row")
        .rows_affected();
    ensure!(
        pruned == 1,
        "R-STORE-2: {pruned} inbox rows held the applied event {key}; one was expected"
    );
    let again = w.redeliver(&key);
    w.acked(
        &again,
        Duration::from_secs(30),
        "R-STORE-12 (a redelivery after its inbox row was pruned is ACKed as history)",
    )
    .await?;
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        view == before,
        "R-STORE-12: a redelivery whose inbox row was pruned moved the view: it was {before:?}, now {view:?}; the same version and event id is never applied twice ({DECISIONS})"
    );
    let rows = w.inbox(&key).await;
    ensure!(
        rows.iter().all(|(_, applied, _)| !applied),
        "R-STORE-12: the redelivery was recorded again as applied; it advanced nothing"
    );
    Ok(format!(
        "after its inbox row was deleted, the redelivery ACKed; the view stayed at v{}, applied_events {}",
        view.version, view.applied_events
    ))
}

pub(crate) async fn stale_version(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let before = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    let row = w.own_view_text(&task).await.ok_or("R-STORE-5: no view")?;
    // An older version that would change every column it could: another type, state and id,
    // and a result where the view has none.
    let old = "stale-older";
    let (_, deliveries) = w.send(
        &w.event(old, &task, before.version - 1, "task.succeeded")
            .with("result", r#"{"stale":true}"#),
    );
    w.acked(
        &deliveries,
        Duration::from_secs(30),
        "R-STORE-6 (an older version is ACKed as history)",
    )
    .await?;
    let after = w.own_view_text(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        after == row,
        "R-STORE-6: an older version (v{}) changed the view of v{} by {key}: {}; a stale event leaves every column of the view as it was ({DECISIONS})",
        before.version - 1,
        before.version,
        changed_columns(&row, &after)
    );
    let rows = w.inbox(old).await;
    ensure!(
        rows.len() == 1 && !rows[0].1,
        "R-STORE-6: the older event must be recorded with applied = false ({} row(s), applied {:?}; {DECISIONS})",
        rows.len(),
        rows.first().map(|r| r.1)
    );
    Ok(format!(
        "v{} (SUCCEEDED, a result) after v{}: ACKed, kept as history, every column of the view unchanged",
        before.version - 1,
        before.version,
    ))
}

/// Waits two leases and a second: `deliveries` must still be unACKED by then.
async fn never_acked(w: &World, deliveries: &[DeliveryId], rule: &str) -> Result<u32, String> {
    tokio::time::sleep(Duration::from_secs(2 * SHORT_LEASE + 1)).await;
    let mut attempts = 0;
    for id in deliveries {
        let d = w.delivery(id).await;
        ensure!(
            d.state != "ACKED",
            "{rule}: delivery {} was ACKed (attempt {}); it must never be",
            d.id,
            d.attempts
        );
        attempts = attempts.max(d.attempts);
    }
    Ok(attempts)
}

pub(crate) async fn same_id_other_content(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let original = w.inbox(&key).await;
    let (_, deliveries) = w.forge(&key, true, None);
    let attempts = never_acked(
        &w,
        &deliveries,
        "R-STORE-4: an event with the id of an applied event and other content (another digest) is a conflict ({DECISIONS})",
    )
    .await?;
    let rows = w.inbox(&key).await;
    ensure!(
        rows == original,
        "R-STORE-4: the stored record of event {key} changed after the conflicting event"
    );
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        view.applied_events == 1 && view.last_event == key,
        "R-STORE-4: the conflicting event changed the view: {view:?}"
    );
    Ok(format!(
        "not ACKed after {attempts} attempt(s); the record and the view unchanged"
    ))
}

pub(crate) async fn same_version_other_id(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let (other, deliveries) = w.forge(&key, false, None);
    let attempts = never_acked(
        &w,
        &deliveries,
        "R-STORE-6: another event id for a version already applied is a conflict ({DECISIONS})",
    )
    .await?;
    let rows = w.inbox(&other).await.len();
    ensure!(
        rows == 0,
        "R-STORE-6: the conflicting event left {rows} inbox row(s): its transaction must roll back whole"
    );
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        view.last_event == key && view.applied_events == 1,
        "R-STORE-6: the conflicting event changed the view: {view:?}"
    );
    Ok(format!(
        "not ACKed after {attempts} attempt(s); no inbox row, the view unchanged"
    ))
}

/// Submits a task and reports `state` with `result`; the task and its event's key.
async fn reported_task(w: &World, state: &str, result: &str, event_type: &str) -> (String, String) {
    let task = w
        .client
        .submit_task(QUEUE, None)
        .await
        .expect("task submitted");
    let result = RawValue::from_string(result.to_owned()).expect("a JSON result");
    w.client
        .report_task(&task.id, state, Some(&result))
        .await
        .expect("task reported");
    let key = w.wait_event_of(&task.id, event_type).await;
    (task.id, key)
}

pub(crate) async fn needs_review(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let _p = w.running().await?;
    let (task, key) = reported_task(
        &w,
        "NEEDS_REVIEW",
        r#"{"reason":"manual check"}"#,
        "task.needs_review",
    )
    .await;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(30),
        "R-CANON-1 (a NEEDS_REVIEW event is valid)",
    )
    .await?;
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        view.state == "NEEDS_REVIEW",
        "R-CANON-1: NEEDS_REVIEW must stay NEEDS_REVIEW; the view says {:?}",
        view.state
    );
    Ok("the view says NEEDS_REVIEW".into())
}

pub(crate) async fn exact_numbers(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let _p = w.running().await?;
    let numbers = [
        "123456789012345678901234567890",
        "-0.000000000000000000001",
        "1.50",
        "1E+2",
    ];
    let result = format!(
        r#"{{"big":{},"tiny":{},"price":{},"exp":{},"text":"0.10"}}"#,
        numbers[0], numbers[1], numbers[2], numbers[3]
    );
    let (task, key) = reported_task(&w, "SUCCEEDED", &result, "task.succeeded").await;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(30),
        "R-SCHEMA-4",
    )
    .await?;
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    let stored = view.result.ok_or("R-STORE-7: the view has no result")?;
    let (canonical, _) = result_inbox::canonicalize(result.as_bytes()).expect("a valid result");
    let text = String::from_utf8_lossy(&stored);
    let lost: Vec<&str> = numbers.into_iter().filter(|n| !text.contains(n)).collect();
    ensure!(
        stored == canonical,
        "R-SCHEMA-4: the view's result must keep its exact bytes: {}; the numbers not kept as written: {}",
        difference(&stored, &canonical),
        if lost.is_empty() { "none".to_owned() } else { lost.join(", ") }
    );
    let (_, _, event) = w
        .inbox(&key)
        .await
        .into_iter()
        .next()
        .ok_or("R-STORE-7: no inbox row")?;
    let event = String::from_utf8_lossy(&event).into_owned();
    for n in numbers {
        ensure!(
            event.contains(n),
            "R-SCHEMA-4: the stored event lost the number {n}"
        );
    }
    Ok("the result and the event keep 10^29, 1e-21, 1.50 and 1E+2 as written".into())
}

pub(crate) async fn utc(ctx: Ctx) -> Verdict {
    // A server of the case's own: its time zone is changed for every connection.
    let mut w = World::with_own_server(&ctx, SHORT_LEASE, BUDGET).await;
    let mut c = w.admin().await;
    sqlx::query("SET GLOBAL time_zone = '+09:00'")
        .execute(&mut c)
        .await
        .expect("the server's time zone set");
    let _p = w.running().await?;
    let (task, key) = w.cancelled_task().await;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(30),
        "R-SCHEMA-6",
    )
    .await?;
    let skew: Vec<(Option<i64>, Option<i64>)> = sqlx::query_as(
        "SELECT TIMESTAMPDIFF(SECOND, i.received_at, UTC_TIMESTAMP(6)), \
                TIMESTAMPDIFF(SECOND, v.updated_at, UTC_TIMESTAMP(6)) \
         FROM receiver_inbox i JOIN receiver_task_views v ON v.task_id = ? WHERE i.event_id = ?",
    )
    .bind(&task)
    .bind(&key)
    .fetch_all(&mut c)
    .await
    .map_err(|e| format!("R-SCHEMA-3: received_at and updated_at could not be read: {e}"))?;
    let (received, updated) = skew.first().copied().ok_or("R-STORE-7: no inbox row")?;
    for (what, s) in [
        ("receiver_inbox.received_at", received),
        ("receiver_task_views.updated_at", updated),
    ] {
        let s = s.ok_or(format!("R-SCHEMA-3: {what} is NULL"))?;
        ensure!(
            s.abs() < 600,
            "R-SCHEMA-6: {what} is {s} s from UTC_TIMESTAMP() with the server at +09:00: times must be stored in UTC"
        );
    }
    Ok("received_at and updated_at in UTC with the server at +09:00".into())
}

/// Events of each round of `every-connection`.
const ROUND: usize = 12;

/// Every connection the receiver opens must have the session the contract requires, not only
/// the first: a setting made once through a pool reaches one connection. The server of the
/// case's own runs at +09:00; every COMMIT is answered 300 ms late, so that applies overlap and
/// a receiver that opens connections as it needs them opens several; between two rounds every
/// connection of the runtime account is killed on the server, so that every later apply runs on
/// a connection opened anew. Every stored time of both rounds must be UTC.
pub(crate) async fn every_connection(ctx: Ctx) -> Verdict {
    let mut w = World::with_own_server(&ctx, 10, BUDGET).await;
    let mut admin = w.admin().await;
    sqlx::query("SET GLOBAL time_zone = '+09:00'")
        .execute(&mut admin)
        .await
        .expect("the server's time zone set");
    let _proxy = w.behind_proxy_answering_commits_late(300).await;
    let _p = w.running().await?;
    let mut tasks = Vec::new();
    let mut most = 0;
    for round in 0..2 {
        let mut ids = Vec::new();
        for (task, key, deliveries) in w.first_events(&format!("conn-{round}"), ROUND, ctx.seed) {
            ids.extend(deliveries);
            tasks.push((task, key));
        }
        let seen = connections(&mut admin, &w.db().runtime.user);
        let (acked, seen) =
            tokio::join!(w.acked(&ids, Duration::from_secs(40), "R-SCHEMA-6"), seen);
        acked?;
        most = most.max(seen);
        if round == 0 {
            // Every connection of the runtime account goes; the next applies open new ones.
            let ids: Vec<(i64,)> =
                sqlx::query_as("SELECT id FROM information_schema.PROCESSLIST WHERE user = ?")
                    .bind(&w.db().runtime.user)
                    .fetch_all(&mut admin)
                    .await
                    .expect("the receiver's connections listed");
            for (id,) in ids {
                let _ = sqlx::query(&format!("KILL CONNECTION {id}"))
                    .execute(&mut admin)
                    .await;
            }
        }
    }
    let mut wrong = Vec::new();
    for (task, key) in &tasks {
        let skew: Option<(Option<i64>, Option<i64>, Option<i64>)> = sqlx::query_as(
            "SELECT TIMESTAMPDIFF(SECOND, i.received_at, UTC_TIMESTAMP(6)), \
                    TIMESTAMPDIFF(SECOND, v.created_at, UTC_TIMESTAMP(6)), \
                    TIMESTAMPDIFF(SECOND, v.updated_at, UTC_TIMESTAMP(6)) \
             FROM receiver_inbox i JOIN receiver_task_views v ON v.task_id = ? \
             WHERE i.event_id = ?",
        )
        .bind(task)
        .bind(key)
        .fetch_optional(&mut admin)
        .await
        .map_err(|e| format!("R-SCHEMA-3: the stored times could not be read: {e}"))?;
        let (received, created, updated) = skew.ok_or(format!(
            "R-STORE-7: event {key} was ACKed without an inbox row and a view"
        ))?;
        for (what, s) in [
            ("received_at", received),
            ("created_at", created),
            ("updated_at", updated),
        ] {
            if s.is_none_or(|s| s.abs() >= 600) {
                wrong.push(format!("{key}: {what} {s:?} s from UTC"));
            }
        }
    }
    ensure!(
        wrong.is_empty(),
        "R-SCHEMA-6: with the server at +09:00, {} of {} stored times are not UTC, over up to {most} connections at once and every connection killed between two rounds: the session the contract requires must be set on every connection the receiver opens, not once through its pool (docs/receiver-contract.md, \"Every connection\"): {}",
        wrong.len(),
        tasks.len() * 3,
        wrong.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
    );
    Ok(format!(
        "{} events over two rounds, up to {most} connections at once, every connection killed between them: every stored time UTC with the server at +09:00",
        tasks.len()
    ))
}

/// The most connections `user` held at once, sampled for 3 s.
async fn connections(admin: &mut sqlx::MySqlConnection, user: &str) -> i64 {
    let mut most = 0;
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE user = ?")
                .bind(user)
                .fetch_one(&mut *admin)
                .await
                .unwrap_or((0,));
        most = most.max(n);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    most
}

/// Tasks of each kind in `concurrent-versions`.
const CONCURRENT_TASKS: usize = 8;
/// How long the proxy holds the answer to each statement on the view in `concurrent-versions`:
/// a transaction that read the view without a lock and writes it after the answer leaves this
/// long for a competing one to read the same.
const VIEW_HELD_MS: u64 = 200;

/// Three races, each made certain rather than left to timing: the proxy holds the answer to
/// every statement that names `receiver_task_views` for [`VIEW_HELD_MS`], so that any two
/// applies of one task that overlap at all overlap across their read and their write, whatever
/// the receiver's design and isolation level. Newer versions arrive highest first, so that a
/// write from a stale read always lands a lower version last:
/// - tasks whose views exist at v2, each meeting v5, v4, v3 at once;
/// - new tasks whose first three events (v5, v4, v3) arrive at once;
/// - new tasks whose first event arrives twice at once (the duplicate race).
///
/// A receiver that locks the view row before it reads it (or writes it in one conditional
/// statement) is slowed, never wrong; one that reads before it locks loses an update on every
/// run; one that applies one delivery at a time never races and passes.
pub(crate) async fn concurrent_versions(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, 10).await;
    let proxy = w.behind_proxy().await;
    let mut rule = RuleSpec::new(Action::Delay {
        delay_ms: VIEW_HELD_MS,
    })
    .on(On::Any);
    rule.contains = Some("receiver_task_views".into());
    proxy.arm(rule).expect("the rule arms");
    let _p = w.running().await?;
    let run = ctx.seed % 100_000;
    let task = |kind: &str, i: usize| format!("race-{kind}-{run}-{i}");
    let started = |t: &str, v: u64| (format!("{t}-v{v}"), t.to_owned(), v);
    // The existing views, at v2.
    let mut first = Vec::new();
    for i in 0..CONCURRENT_TASKS {
        first.extend(w.inject(&started(&task("old", i), 2)).1);
    }
    w.acked(&first, Duration::from_secs(30), "R-STORE-7")
        .await?;
    // Then every race at once.
    let mut ids = Vec::new();
    for i in 0..CONCURRENT_TASKS {
        for kind in ["old", "new"] {
            for v in [5, 4, 3] {
                ids.extend(w.inject(&started(&task(kind, i), v)).1);
            }
        }
        let twice = started(&task("dup", i), 2);
        let (key, once) = w.inject(&twice);
        ids.extend(once);
        ids.extend(w.redeliver(&key));
    }
    ensure!(
        ids.len() == CONCURRENT_TASKS * 8,
        "the kit made {} deliveries, not {}",
        ids.len(),
        CONCURRENT_TASKS * 8
    );
    w.acked(&ids, Duration::from_secs(90), "R-STORE-6").await?;
    let mut lost = Vec::new();
    let mut doubled = Vec::new();
    for i in 0..CONCURRENT_TASKS {
        for (kind, least) in [("old", 2), ("new", 1)] {
            let t = task(kind, i);
            match w.view(&t).await {
                Some(v) if v.version == 5 && v.applied_events >= least => {}
                Some(v) => lost.push(format!(
                    "{t} at version {} (applied_events {})",
                    v.version, v.applied_events
                )),
                None => lost.push(format!("{t} has no view")),
            }
        }
        let t = task("dup", i);
        let rows = w.inbox(&format!("{t}-v2")).await.len();
        match w.view(&t).await {
            Some(v) if v.version == 2 && v.applied_events == 1 && rows == 1 => {}
            v => doubled.push(format!(
                "{t}: {rows} inbox row(s), view {:?}",
                v.map(|v| (v.version, v.applied_events))
            )),
        }
    }
    ensure!(
        lost.is_empty(),
        "R-STORE-6: versions 5, 4 and 3 of a task applied at once must leave its view at 5 (only a higher version advances it: lock the view row before reading it, or write it in one conditional statement); with each statement on the view answered {VIEW_HELD_MS} ms late, {} of {} tasks lost an update: {}",
        lost.len(),
        CONCURRENT_TASKS * 2,
        lost.join(", ")
    );
    ensure!(
        doubled.is_empty(),
        "R-STORE-4: one event delivered twice at once must be recorded once and advance its view once (applied_events 1); with each statement on the view answered {VIEW_HELD_MS} ms late, {} of {CONCURRENT_TASKS} were not: {}",
        doubled.len(),
        doubled.join(", ")
    );
    Ok(format!(
        "each statement on the view answered {VIEW_HELD_MS} ms late: {CONCURRENT_TASKS} views at v2 meeting v5, v4, v3 at once, {CONCURRENT_TASKS} new tasks whose first three versions came at once, all at v5; {CONCURRENT_TASKS} events delivered twice at once, each applied once"
    ))
}

/// Tasks of each kind in `mixed-backlog`.
const MIXED_TASKS: usize = 8;
/// The concurrency `mixed-backlog` starts `consume` with (`RECEIVER_CONCURRENCY`).
const MIXED_CONCURRENCY: &str = "16";

/// A backlog that waits for `consume` to start, at a concurrency of 16, so that a receiver
/// that applies many deliveries together (in one transaction, say) meets every mix at once.
/// For each of [`MIXED_TASKS`] rounds, in this order of arrival:
/// - versions 3, 2 and 1 of a new task, newest first;
/// - the redelivery of an event applied before the backlog, and the next version of its task;
/// - two event ids for version 1 of a new task: whichever is applied first, the other is a
///   conflict.
///
/// Every view must end at its highest version with `applied_events` equal to its task's inbox
/// rows marked applied; of each pair, exactly one is ACKed and recorded, the other never ACKed
/// and never recorded; every other delivery ACKed. A receiver that applies one delivery at a
/// time meets none of these together and passes.
pub(crate) async fn mixed_backlog(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let run = ctx.seed % 100_000;
    let task = |kind: &str, i: usize| format!("mix-{kind}-{run}-{i}");
    let started = |t: &str, v: u64| (format!("{t}-v{v}"), t.to_owned(), v);
    // The events applied before the backlog, whose redeliveries join it.
    let first = w.running().await?;
    let mut seen = Vec::new();
    let mut seen_ids = Vec::new();
    for i in 0..MIXED_TASKS {
        let (key, ids) = w.inject(&started(&task("seen", i), 1));
        seen.push(key);
        seen_ids.extend(ids);
    }
    w.acked(&seen_ids, Duration::from_secs(30), "R-STORE-7")
        .await?;
    let _ = first.signal(nix::sys::signal::Signal::SIGTERM);
    let mut first = first;
    ensure!(
        first.wait_within(Duration::from_secs(10)).await.is_some(),
        "R-CLI-3: consume was still running 10 s after SIGTERM"
    );
    // The backlog, while no consume runs.
    let mut good = Vec::new();
    let mut pairs = Vec::new();
    for (i, key) in seen.iter().enumerate() {
        for v in [3, 2, 1] {
            good.extend(w.inject(&started(&task("new", i), v)).1);
        }
        good.extend(w.redeliver(key));
        good.extend(w.inject(&started(&task("seen", i), 2)).1);
        let t = task("pair", i);
        let [a, b] = ["a", "b"].map(|x| {
            let id = format!("{t}-{x}");
            let deliveries = w.inject(&(id.clone(), t.clone(), 1)).1;
            (id, deliveries)
        });
        pairs.push((t, [a, b]));
    }
    let mut env = w.env(&w.dsn.clone());
    env.push(("RECEIVER_CONCURRENCY", MIXED_CONCURRENCY.into()));
    let _p = w.consume_with(&env);
    w.acked(&good, Duration::from_secs(60), "R-STORE-6").await?;
    // Time for a conflict to be ACKed, if it were going to be.
    tokio::time::sleep(Duration::from_secs(2 * SHORT_LEASE + 1)).await;

    let mut wrong = Vec::new();
    let mut uncounted = Vec::new();
    let mut views = Vec::new();
    for i in 0..MIXED_TASKS {
        for (kind, versions) in [("new", &[3, 2, 1][..]), ("seen", &[2, 1][..])] {
            let t = task(kind, i);
            let mut applied = 0;
            for v in versions {
                let rows = w.inbox(&format!("{t}-v{v}")).await;
                applied += rows.iter().filter(|r| r.1).count() as u64;
            }
            let view = w.view(&t).await;
            views.push((t, versions[0], applied, view));
        }
    }
    for (t, version, applied, view) in views {
        match view {
            Some(v) if v.version == version && v.applied_events == applied => {}
            Some(v) if v.version == version => uncounted.push(format!(
                "{t}: applied_events {} but {applied} of its inbox rows applied",
                v.applied_events
            )),
            v => wrong.push(format!(
                "{t} at version {:?}, not {version}",
                v.map(|v| v.version)
            )),
        }
    }
    ensure!(
        wrong.is_empty(),
        "R-STORE-6: every view must end at its task's highest version, whatever the order its versions came in and whatever else came with them; with a backlog of {} deliveries taken at a concurrency of {MIXED_CONCURRENCY}, {} of {} did not: {}",
        good.len() + 2 * pairs.len(),
        wrong.len(),
        2 * MIXED_TASKS,
        wrong.join(", ")
    );
    ensure!(
        uncounted.is_empty(),
        "R-STORE-4: a view's applied_events counts the events that advanced it, each once (the inbox rows marked applied); {} of {} views did not: {}",
        uncounted.len(),
        2 * MIXED_TASKS,
        uncounted.join(", ")
    );
    for (t, [a, b]) in &pairs {
        let mut acked = Vec::new();
        for (id, deliveries) in [a, b] {
            let mut any = false;
            for d in deliveries {
                any |= w.delivery(d).await.state == "ACKED";
            }
            let rows = w.inbox(id).await.len();
            acked.push((id.clone(), any, rows));
        }
        let won: Vec<&(String, bool, usize)> = acked.iter().filter(|(_, ack, _)| *ack).collect();
        let view = w.view(t).await;
        ensure!(
            won.len() == 1
                && won[0].2 == 1
                && acked.iter().all(|(_, ack, rows)| *ack || *rows == 0)
                && view.as_ref().is_some_and(|v| v.last_event == won[0].0 && v.applied_events == 1),
            "R-STORE-6: two event ids for version 1 of {t}, in one backlog: the first applied must be ACKed and recorded, the other is a conflict, never ACKed and never recorded; (event, ACKed, inbox rows): {acked:?}, the view {:?}",
            view.map(|v| (v.last_event, v.applied_events))
        );
    }
    Ok(format!(
        "a backlog of {} deliveries at a concurrency of {MIXED_CONCURRENCY}: {} views at their highest versions, applied_events as recorded; of {} same-version pairs, one ACKed and recorded each, the other never",
        good.len() + 2 * pairs.len(),
        2 * MIXED_TASKS,
        pairs.len()
    ))
}
