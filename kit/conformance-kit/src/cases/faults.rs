//! Cases with a fault the kit makes: a kill after COMMIT, the answer to COMMIT held or lost by
//! the proxy, the database killed and started again, and a seeded crash loop.

use std::time::Duration;

use commit_proxy::{Action, On, RuleSpec};
use orbit_sdk::DeliveryId;

use crate::world::*;
use crate::*;
use fixtures::{poll, QUEUE};

pub(crate) async fn kill_after_commit(ctx: Ctx) -> Verdict {
    // R-FAULT-4 names the real lease.
    let mut w = World::start(&ctx, 30).await;
    let mut p = w.running().await?;
    // The ACK arrives at the platform and is never handled: the kill lands before it counts.
    w.fault(serde_json::json!({"fault": "stall-next-ack"}));
    let (task, key) = w.cancelled_task().await;
    w.committed(&key).await?;
    let id = w.deliveries_of(&key).await[0].clone();
    let d = w.delivery(&id).await;
    ensure!(
        d.state == "LEASED" && d.attempts == 1,
        "R-FAULT-4: after the commit the delivery should be LEASED at attempt 1, not yet ACKed; it is {} at attempt {}",
        d.state,
        d.attempts
    );
    p.kill().await;
    let _q = w.consume();
    w.acked(
        std::slice::from_ref(&id),
        Duration::from_secs(75),
        "R-FAULT-4 (the redelivery after the lease is ACKed)",
    )
    .await?;
    let d = w.delivery(&id).await;
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    let rows = w.inbox(&key).await.len();
    ensure!(
        d.attempts == 2 && view.applied_events == 1 && rows == 1,
        "R-FAULT-4: after the kill and the redelivery: attempts {} (want 2), applied_events {} (want 1), inbox rows {rows} (want 1)",
        d.attempts,
        view.applied_events
    );
    Ok("killed after COMMIT; redelivered after 30 s: attempts 2, applied_events 1".into())
}

/// How long `ack-after-commit` holds the server's answer to COMMIT.
const HELD_MS: u64 = 1500;

/// Milliseconds since the Unix epoch, the clock of commit-proxy's firings.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

pub(crate) async fn ack_after_commit(ctx: Ctx) -> Verdict {
    // A lease long enough for an apply budget above the held answer.
    let mut w = World::start(&ctx, 5).await;
    let proxy = w.behind_proxy().await;
    let rule = proxy
        .arm(RuleSpec::new(Action::Delay { delay_ms: HELD_MS }).once())
        .expect("the rule arms");
    let _p = w.running().await?;
    let (task, key) = w.cancelled_task().await;
    let id = w.deliveries_of(&key).await[0].clone();
    let held = w
        .or_ended(rule.fired_within(Duration::from_secs(20)))
        .await?
        .ok_or("R-STORE-7: the receiver sent no COMMIT through its DSN within 20 s")?;
    // The server has answered; the proxy holds the answer for HELD_MS from `held.at_ms`. Watch
    // the delivery for the first two thirds of that (a read started later could be answered
    // after a right receiver's ACK).
    let watch_until = held.at_ms + HELD_MS * 2 / 3;
    loop {
        let started = unix_ms();
        if started >= watch_until {
            break;
        }
        ensure!(
            w.delivery(&id).await.state != "ACKED",
            "R-STORE-7: the delivery was ACKed before the receiver had the answer to its COMMIT: ACK only after COMMIT succeeds"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.acked(
        std::slice::from_ref(&id),
        Duration::from_secs(30),
        "R-STORE-7 (ACKed once the COMMIT is confirmed)",
    )
    .await?;
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        view.applied_events == 1,
        "R-STORE-7: applied_events {} after one event",
        view.applied_events
    );
    Ok(format!(
        "not ACKed while the COMMIT's answer was held; ACKed at attempt {} afterwards",
        w.delivery(&id).await.attempts
    ))
}

pub(crate) async fn commit_lost(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let proxy = w.behind_proxy().await;
    let rule = proxy
        .arm(RuleSpec::new(Action::DropCommitOk).once())
        .expect("the rule arms");
    let _p = w.running().await?;
    let (task, key) = w.cancelled_task().await;
    let id = w.deliveries_of(&key).await[0].clone();
    // Watch the delivery until the proxy drops the answer: an ACK seen before the drop came
    // before the COMMIT was answered at all (R-STORE-7). One seen only after it, at the first
    // attempt, came without an answer: most likely a COMMIT of unknown outcome taken as
    // success (R-STORE-8), though an ACK racing ahead of its COMMIT can land there too.
    let dropped = w.or_ended(poll(Duration::from_secs(20), Duration::from_millis(20), || async {
        if !rule.firings().is_empty() {
            return Some(Ok(()));
        }
        let acked = w.delivery(&id).await.state == "ACKED";
        // An ACK counts as early only if the drop had not happened meanwhile.
        (acked && rule.firings().is_empty()).then(|| {
            Err("R-STORE-7: the delivery was ACKed before its COMMIT was answered: ACK only after COMMIT succeeds".to_owned())
        })
    }))
    .await?;
    dropped.unwrap_or_else(|| {
        Err("R-STORE-7: the receiver sent no COMMIT through its DSN within 20 s".into())
    })?;
    let at_drop = w.delivery(&id).await;
    ensure!(
        at_drop.state != "ACKED" || at_drop.attempts >= 2,
        "R-STORE-8: the delivery was ACKed at attempt 1 although the answer to its COMMIT was lost on the way: a COMMIT of unknown outcome must not be ACKed (nor may an ACK precede the COMMIT, R-STORE-7)"
    );
    w.acked(
        std::slice::from_ref(&id),
        Duration::from_secs(40),
        "R-STORE-8 (the lost commit is resolved by a redelivery)",
    )
    .await?;
    let d = w.delivery(&id).await;
    ensure!(
        d.attempts >= 2,
        "R-STORE-8: the delivery was ACKed at attempt 1 although the answer to its COMMIT never came (CommitUnconfirmed must not be ACKed)"
    );
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    let rows = w.inbox(&key).await.len();
    ensure!(
        view.applied_events == 1 && rows == 1,
        "R-STORE-8: after the lost COMMIT reply: applied_events {}, inbox rows {rows}; the redelivery must find the commit (a duplicate)",
        view.applied_events
    );
    Ok(format!(
        "no ACK at the lost reply; ACKed at attempt {} as a duplicate, applied_events 1",
        d.attempts
    ))
}

/// The outage of `database-restart`: four leases long, so that a receiver which keeps taking
/// deliveries while its database is down spends an attempt of each every lease.
const OUTAGE: Duration = Duration::from_secs(12);
/// Its budget: what a receiver that holds spends (one attempt that met the outage, one
/// after), and one more.
const OUTAGE_BUDGET: u32 = 3;
/// The most attempts a delivery of it may spend: the one that met the outage (in flight when
/// the hold began), and the one after the database came back.
const OUTAGE_ATTEMPTS: u32 = 2;

/// What makes the receiver's database unable to serve for [`OUTAGE`]: killed and started
/// again, or made read-only under the runtime account.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outage {
    Killed,
    ReadOnly,
}

impl Outage {
    /// The rule a receiver breaks by spending attempts on it, and what it is, in words.
    fn rule(self) -> (&'static str, &'static str) {
        match self {
            Outage::Killed => ("R-STORE-9", "down"),
            Outage::ReadOnly => (
                "R-DIST-4",
                "read-only (a write refused with 1290, which is an outage, not a failure of the event)",
            ),
        }
    }

    async fn begin(self, w: &World) -> Result<(), String> {
        match self {
            Outage::Killed => {
                ensure!(
                    w.own_server().kill(),
                    "the kit could not kill the receiver's server"
                );
            }
            Outage::ReadOnly => set_read_only(w, true).await,
        }
        Ok(())
    }

    async fn end(self, w: &World) {
        match self {
            Outage::Killed => w
                .own_server()
                .restart()
                .expect("the receiver's server starts again"),
            Outage::ReadOnly => set_read_only(w, false).await,
        }
    }
}

/// `SET GLOBAL read_only` on the receiver's own server, as its administrator: the runtime
/// account, without SUPER, is refused every write meanwhile (1290).
async fn set_read_only(w: &World, on: bool) {
    let mut admin = w.admin().await;
    sqlx::query(if on {
        "SET GLOBAL read_only = ON"
    } else {
        "SET GLOBAL read_only = OFF"
    })
    .execute(&mut admin)
    .await
    .expect("the kit sets read_only on the receiver's own server");
}

pub(crate) async fn database_restart(ctx: Ctx) -> Verdict {
    through_outage(ctx, Outage::Killed).await
}

pub(crate) async fn read_only(ctx: Ctx) -> Verdict {
    through_outage(ctx, Outage::ReadOnly).await
}

/// Events queued while the receiver's database cannot serve for [`OUTAGE`], a budget of
/// [`OUTAGE_BUDGET`]: every delivery ACKED, none past [`OUTAGE_ATTEMPTS`], the ledger clean.
async fn through_outage(ctx: Ctx, outage: Outage) -> Verdict {
    let (rule, what) = outage.rule();
    let mut w = World::with_own_server(&ctx, SHORT_LEASE, OUTAGE_BUDGET).await;
    let _p = w.running().await?;
    let (first, _) = w.cancelled_and_acked("R-STORE-7").await?;
    outage.begin(&w).await?;
    let mut tasks = vec![first];
    for _ in 0..6 {
        tasks.push(fixtures::cancelled_task(&w.client).await);
    }
    tokio::time::sleep(OUTAGE).await;
    outage.end(&w).await;
    // Until every delivery is ACKED, or one has spent its budget (EXPIRED never comes back).
    let ended = w
        .or_ended(poll(
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let all = w.deliveries().await;
                let done = all.iter().all(|d| d.state == "ACKED")
                    || all.iter().any(|d| d.state == "EXPIRED");
                done.then_some(all)
            },
        ))
        .await?;
    let deliveries = match ended {
        Some(all) => all,
        None => w.deliveries().await,
    };
    let ids: Vec<DeliveryId> = deliveries.iter().map(|d| d.id.clone()).collect();
    let open: Vec<String> = deliveries
        .iter()
        .filter(|d| d.state != "ACKED")
        .enumerate()
        .map(|(i, d)| {
            // The receiver's lines for the first only: the others are alike.
            format!(
                "{} of event {} {} after {} attempt(s){}",
                d.id,
                d.event_id,
                d.state,
                d.attempts,
                if i == 0 {
                    w.expired_cause(d)
                } else {
                    String::new()
                }
            )
        })
        .collect();
    ensure!(
        open.is_empty(),
        "{rule}: while the database is {what}, take no new delivery (each attempt spent on it is one of a finite budget, {OUTAGE_BUDGET} here): {}",
        open.join(", ")
    );
    let spent: Vec<String> = deliveries
        .iter()
        .filter(|d| d.attempts > OUTAGE_ATTEMPTS)
        .map(|d| format!("{} of event {} ({} attempts)", d.id, d.event_id, d.attempts))
        .collect();
    ensure!(
        spent.is_empty(),
        "{rule}: while the database was {what} the receiver kept taking deliveries: {} spent more than the {OUTAGE_ATTEMPTS} attempts a hold allows (one that met the outage, one after): {}",
        spent.len(),
        spent.join(", ")
    );
    ledger(&w, &tasks, rule).await?;
    let most = deliveries.iter().map(|d| d.attempts).max().unwrap_or(0);
    Ok(format!(
        "{} events across {} s {} with a budget of {OUTAGE_BUDGET}: all ACKED, each applied once; at most {most} attempts",
        ids.len(),
        OUTAGE.as_secs(),
        match outage {
            Outage::Killed => "of a killed database",
            Outage::ReadOnly => "of a read-only database",
        }
    ))
}

/// The ledger of [`fixtures::check_ledger`], its failure naming `rule` and the first event ids
/// found wrong.
async fn ledger(w: &World, tasks: &[String], rule: &str) -> Result<fixtures::Ledger, String> {
    let mut admin = w.admin().await;
    fixtures::check_ledger(&mut admin, &w.client, &w.sub, tasks, rule).await
}

pub(crate) async fn crash_loop(ctx: Ctx) -> Verdict {
    let mut rng = fastrand::Rng::with_seed(ctx.seed);
    let mut w = World::start(&ctx, 2).await;
    w.init().await?;
    let mut tasks = Vec::new();
    let mut p = w.consume();
    let mut kills = 0;
    for round in 0..6 {
        // Two versions per task (RUNNING, then CANCELLED), some duplicated: out of order
        // within the receiver's concurrency, and again after a redelivery.
        for _ in 0..2 {
            let t = w
                .client
                .submit_task(QUEUE, None)
                .await
                .expect("task submitted");
            w.client
                .report_task(&t.id, "RUNNING", None)
                .await
                .expect("task reported");
            w.client.cancel_task(&t.id).await.expect("task cancelled");
            if rng.bool() {
                let key = w.wait_event_of(&t.id, "task.started").await;
                w.fault(serde_json::json!({"fault": "duplicate-event", "event_id": key}));
            }
            tasks.push(t.id);
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(300..2000))).await;
        if round < 5 {
            p.kill().await;
            kills += 1;
            p = w.consume();
        }
    }
    let ids: Vec<DeliveryId> = w.deliveries().await.into_iter().map(|d| d.id).collect();
    w.acked(
        &ids,
        Duration::from_secs(90),
        "R-FAULT-4 (after the kills every delivery is ACKed)",
    )
    .await?;
    let l = ledger(&w, &tasks, "R-STORE-4/R-STORE-6").await?;
    Ok(format!(
        "seed {}: {kills} SIGKILLs, {} deliveries of {} events over {} tasks, {} stale; the ledger holds",
        ctx.seed,
        l.deliveries,
        l.events,
        tasks.len(),
        l.stale
    ))
}

/// How long `every-ack-after-commit` holds each COMMIT before the server sees it.
const COMMIT_HELD_MS: u64 = 300;
/// Events of `every-ack-after-commit`.
const EVERY_ACK_EVENTS: usize = 12;

/// Every COMMIT reaches the server `COMMIT_HELD_MS` after it was sent, so a row is committed
/// at least that long after its INSERT (`received_at`); a delivery ACKed sooner after its
/// event's `received_at` was ACKed before its COMMIT. Both times are the one server's clock.
pub(crate) async fn every_ack_after_commit(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, 5).await;
    let proxy = w.behind_proxy().await;
    proxy
        .arm(RuleSpec::new(Action::HoldRequest {
            delay_ms: COMMIT_HELD_MS,
        }))
        .expect("the rule arms");
    let _p = w.running().await?;
    for _ in 0..EVERY_ACK_EVENTS {
        fixtures::cancelled_task(&w.client).await;
    }
    let ids: Vec<DeliveryId> = w.deliveries().await.into_iter().map(|d| d.id).collect();
    w.acked(&ids, Duration::from_secs(60), "R-STORE-7").await?;
    // Microseconds since 2000, on the server's clock: when each delivery was ACKED (the
    // platform's database) and when its event's row was inserted (the receiver's).
    let acked: Vec<(Vec<u8>, Vec<u8>, i64)> = sqlx::query_as(
        "SELECT d.id, JSON_VALUE(e.body, '$.id'), \
         TIMESTAMPDIFF(MICROSECOND, '2000-01-01', d.updated_at) \
         FROM orbit_deliveries d JOIN orbit_events e ON e.id = d.event_id \
         WHERE d.subscription_id = ? AND d.state = 'ACKED'",
    )
    .bind(w.sub.as_str())
    .fetch_all(&mut w.platform().await)
    .await
    .expect("the platform's deliveries read");
    let inserted: Vec<(Vec<u8>, i64)> = sqlx::query_as(
        "SELECT event_id, TIMESTAMPDIFF(MICROSECOND, '2000-01-01', received_at) FROM receiver_inbox",
    )
    .fetch_all(&mut w.admin().await)
    .await
    .expect("the inbox read");
    let inserted: std::collections::HashMap<Vec<u8>, i64> = inserted.into_iter().collect();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut early = Vec::new();
    for (delivery, event, at) in &acked {
        let Some(row) = inserted.get(event) else {
            early.push(format!(
                "delivery {} of event {}: ACKED without an inbox row",
                text(delivery),
                text(event)
            ));
            continue;
        };
        let after_ms = (at - row) as f64 / 1000.0;
        if after_ms < COMMIT_HELD_MS as f64 {
            early.push(format!(
                "delivery {} of event {}: ACKED {after_ms:.0} ms after its row was inserted",
                text(delivery),
                text(event)
            ));
        }
    }
    ensure!(
        early.is_empty(),
        "R-STORE-7: every COMMIT reached the server {COMMIT_HELD_MS} ms after it was sent, so no delivery can be ACKed sooner after its row's INSERT unless it was ACKed before its COMMIT; {} of {} were: {}",
        early.len(),
        acked.len(),
        early.join(", ")
    );
    Ok(format!(
        "{} deliveries, every COMMIT held {COMMIT_HELD_MS} ms before the server saw it: each ACKed after its COMMIT",
        acked.len()
    ))
}

/// A place to cut, and the proxy rule that cuts there.
type Cut = (&'static str, fn() -> RuleSpec);

/// Where `cut-between-statements` cuts the receiver's connection, one event each: at the
/// first statement that names the view table (a TCP reset instead of forwarding it), and at
/// the first COMMIT (never forwarded: the server rolls back).
const CUTS: [Cut; 2] = [
    ("at its first statement on receiver_task_views", || {
        let mut rule = RuleSpec::new(Action::Reset).on(On::Any).once();
        rule.contains = Some("receiver_task_views".into());
        rule
    }),
    ("at its first COMMIT", || {
        RuleSpec::new(Action::DropCommitRequest).once()
    }),
];

/// At each cut the receiver loses its connection between statements; after the redelivery
/// the inbox row and the view must agree: the row applied and the view at its version,
/// advanced once. A receiver that commits the row and the view apart keeps a row whose view
/// never moved.
pub(crate) async fn cut_between_statements(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let proxy = w.behind_proxy().await;
    let _p = w.running().await?;
    // One event first, so that whatever the receiver reads at start is behind it and each cut
    // meets the apply of its own event.
    w.cancelled_and_acked("R-STORE-7").await?;
    let mut seen = Vec::new();
    for (where_, rule) in CUTS {
        let armed = proxy.arm(rule()).expect("the rule arms");
        let (task, key) = w.cancelled_task().await;
        // A receiver that commits implicitly (autocommit) never sends COMMIT: nothing to cut
        // there, and the agreement below is still checked.
        let cut = w
            .or_ended(armed.fired_within(Duration::from_secs(10)))
            .await?
            .is_some();
        proxy.disarm(armed.id());
        w.acked(
            &w.deliveries_of(&key).await,
            Duration::from_secs(30),
            "R-STORE-7 (after a cut, the redelivery applies)",
        )
        .await?;
        let rows = w.inbox(&key).await;
        let view = w.view(&task).await;
        let applied = rows.iter().filter(|(_, applied, _)| *applied).count();
        ensure!(
            rows.len() == 1
                && applied == 1
                && view
                    .as_ref()
                    .is_some_and(|v| v.version == 2 && v.applied_events == 1 && v.last_event == key),
            "R-STORE-7: cut {where_}, then redelivered: event {key} has {} inbox row(s) ({applied} applied) and the view {:?}; the row and the view effect commit together or not at all",
            rows.len(),
            view
        );
        seen.push(if cut {
            where_.to_owned()
        } else {
            format!("{where_} (never sent)")
        });
    }
    Ok(format!(
        "cut {}: each time the row and the view agreed after the redelivery",
        seen.join(", then ")
    ))
}
