//! Liveness after failures: a burst of deliveries that fail in every way a receiver meets, then
//! good ones, which must all be taken and ACKed as if nothing had happened.

use std::time::Duration;

use commit_proxy::{Action, RuleSpec};
use orbit_sdk::DeliveryId;

use crate::world::*;
use crate::*;
use fixtures::{poll, QUEUE};

/// Events of each kind in the burst, and good ones after it.
const REFUSED: usize = 4;
const CONFLICTS: usize = 2;
const GOOD: usize = 20;
/// How long the proxy holds one COMMIT: past the 3 s lease and any apply budget below it.
const COMMIT_HELD_MS: u64 = 8_000;
/// How long the good deliveries may take, from the end of the burst.
const GOOD_WITHIN: Duration = Duration::from_secs(30);

pub(crate) async fn after_failures(ctx: Ctx) -> Verdict {
    let mut w = World::start_with(&ctx, SHORT_LEASE, 2).await;
    let proxy = w.behind_proxy().await;
    let p = w.running().await?;
    // An applied event, whose id the conflicts reuse with other content.
    let (_, applied) = w.cancelled_and_acked("R-STORE-7").await?;
    // The next COMMIT's OK is dropped (its outcome unknown to the receiver), and the one after
    // is held past the apply's budget.
    let rules: Vec<_> = [
        RuleSpec::new(Action::DropCommitOk).once(),
        RuleSpec::new(Action::HoldRequest {
            delay_ms: COMMIT_HELD_MS,
        })
        .once(),
    ]
    .into_iter()
    .map(|rule| proxy.arm(rule).expect("the rule arms"))
    .collect();
    let run = ctx.seed % 100_000;
    let event = |kind: &str, i: usize| {
        (
            format!("{kind}-{run}-{i}"),
            format!("{kind}-task-{run}-{i}"),
            1u64,
        )
    };
    // The burst: two good events whose COMMITs the proxy meets first, events the canonical
    // form refuses (a member named twice), and an applied event's id with other content.
    let mut burst = Vec::new();
    for i in 0..2 {
        burst.extend(w.inject(&event("victim", i)).1);
    }
    for i in 0..REFUSED {
        let (id, task, _) = event("refused", i);
        let body = format!(
            r#"{{"id":"{id}","type":"task.started","namespace":"{}","queue_id":"{QUEUE}","task_id":"{task}","task_id":"{task}","task_version":1,"state":"RUNNING","occurred_at":"2026-12-06T01:02:03Z"}}"#,
            w.namespace
        );
        burst.extend(w.inject_body(&body).1);
    }
    for _ in 0..CONFLICTS {
        burst.extend(w.forge(&applied, true, None).1);
    }
    let mut good: Vec<(String, DeliveryId)> = Vec::new();
    for i in 0..GOOD {
        let (key, ids) = w.inject(&event("good", i));
        good.extend(ids.into_iter().map(|id| (key.clone(), id)));
    }
    let ids: Vec<DeliveryId> = good.iter().map(|(_, id)| id.clone()).collect();
    if let Err(why) = w.acked(&ids, GOOD_WITHIN, "R-CLI-6").await {
        if why.starts_with("R-CLI-3") {
            return Err(why); // consume exited: that message says so
        }
        let mut found = Unacked::default();
        for (key, id) in &good {
            let d = w.delivery(id).await;
            match (d.state.as_str(), d.attempts) {
                ("ACKED", _) => {}
                ("PENDING", 0) => found.never += 1,
                ("EXPIRED", attempts) => found.expired.push((key.clone(), attempts)),
                _ => found.unfinished += 1,
            }
        }
        return Err(found.verdict(&p.output()));
    }
    // The two whose COMMITs were lost or held are resolved by their redeliveries too.
    w.acked(
        &burst[..2],
        Duration::from_secs(30),
        "R-STORE-8 (a COMMIT of unknown outcome is resolved by the redelivery)",
    )
    .await?;
    let refused_acked = {
        let mut n = 0;
        for id in &burst[2..2 + REFUSED + CONFLICTS] {
            n += usize::from(w.delivery(id).await.state == "ACKED");
        }
        n
    };
    ensure!(
        refused_acked == 0,
        "R-CANON-3: {refused_acked} refused or conflicting deliveries were ACKED"
    );
    // A receiver that commits implicitly sends no COMMIT for the proxy to meet.
    let fired: Vec<bool> = rules.iter().map(|r| !r.firings().is_empty()).collect();
    Ok(format!(
        "after {REFUSED} refused, {CONFLICTS} conflicts, {} and {}: {GOOD} good deliveries ACKED, every delivery of a good event ACKED",
        if fired[0] { "a lost COMMIT answer" } else { "no COMMIT to lose" },
        if fired[1] { format!("a COMMIT held {} s", COMMIT_HELD_MS / 1000) } else { "no COMMIT to hold".to_owned() },
    ))
}

/// The good deliveries of `after-failures` that were not ACKED, by what became of them.
#[derive(Debug, Default)]
struct Unacked {
    /// Never leased.
    never: usize,
    /// Leased, and still LEASED or PENDING again.
    unfinished: usize,
    /// Each attempt failed until the budget was spent: event id, attempts.
    expired: Vec<(String, u32)>,
}

impl Unacked {
    /// The failure, saying what became of them: a receiver that stopped taking deliveries is
    /// one thing; one that took each and failed every attempt (an abandoned transaction still
    /// holding the row its redelivery needs, say) is another, and the message says which,
    /// with the receiver's own lines for the first expired event.
    fn verdict(&self, output: &str) -> String {
        let burst = format!(
            "after a burst of failed deliveries ({REFUSED} refused, {CONFLICTS} conflicts, a COMMIT whose answer was lost, one held {} s past the apply's budget)",
            COMMIT_HELD_MS / 1000
        );
        let missing = self.never + self.unfinished + self.expired.len();
        let mut why = format!(
            "R-CLI-6: {burst}, {missing} of {GOOD} good deliveries that followed were not ACKED within {} s: {} never taken, {} taken and not finished, {} EXPIRED",
            GOOD_WITHIN.as_secs(),
            self.never,
            self.unfinished,
            self.expired.len()
        );
        match self.expired.first() {
            Some((key, attempts)) if self.never == 0 && self.unfinished == 0 => {
                why.push_str(&format!(
                    "; the receiver did take them, and every attempt failed until the budget was spent (event {key}: {attempts} attempt(s); the receiver's lines for it: {}): does an apply that gives up leave its transaction open on the server, holding the rows the redelivery needs? (docs/receiver-contract.md, \"Deadlines\")",
                    lines_naming(output, key)
                ));
            }
            Some((key, attempts)) => why.push_str(&format!(
                "; the receiver stopped taking deliveries (a failed delivery must cost only itself); the first EXPIRED, event {key}, after {attempts} attempt(s): {}",
                lines_naming(output, key)
            )),
            None => why.push_str(
                "; the receiver stopped taking deliveries (a failed delivery must cost only itself)",
            ),
        }
        why
    }
}

/// How far `skewed-clock` puts the platform's clock from the receiver's, each way.
const SKEW_SECONDS: i64 = 60;

pub(crate) async fn skewed_clock(ctx: Ctx) -> Verdict {
    let mut seen = Vec::new();
    for skew in [SKEW_SECONDS, -SKEW_SECONDS] {
        let offset = skew.to_string();
        let mut w = World::started(
            &ctx,
            SHORT_LEASE,
            BUDGET,
            &["--clock-offset-seconds", &offset],
        )
        .await;
        let _p = w.running().await?;
        let way = if skew > 0 { "ahead of" } else { "behind" };
        let short = if skew > 0 { "ahead" } else { "behind" };
        let mut ids = Vec::new();
        for _ in 0..6 {
            let (_, key) = w.cancelled_task().await;
            ids.extend(w.deliveries_of(&key).await);
        }
        // Until every delivery is ACKED, or one needed a second attempt.
        let ended = w
            .or_ended(fixtures::poll(
                Duration::from_secs(30),
                Duration::from_millis(100),
                || async {
                    let mut all = Vec::new();
                    for id in &ids {
                        all.push(w.delivery(id).await);
                    }
                    if let Some(d) = all.iter().find(|d| d.attempts > 1) {
                        return Some(Err(d.clone()));
                    }
                    all.iter().all(|d| d.state == "ACKED").then_some(Ok(()))
                },
            ))
            .await?;
        let late = match ended {
            Some(Ok(())) => None,
            Some(Err(d)) => Some(d),
            None => Some(w.delivery(&ids[0]).await),
        };
        if let Some(d) = late {
            return Err(format!(
                "R-STORE-9: with the platform's clock {} s {way} the receiver's, delivery {} (event {}) is {} after {} attempt(s); one suffices: take an apply's deadline from the lease length and the local receipt time, never from lease_expires_at against your own clock (docs/receiver-contract.md, \"Deadlines\")",
                skew.abs(),
                d.id,
                d.event_id,
                d.state,
                d.attempts
            ));
        }
        seen.push(format!("{} s {short}", skew.abs()));
    }
    Ok(format!(
        "the platform's clock {}: every delivery ACKed at its first attempt",
        seen.join(", then ")
    ))
}

/// How long `long-outage` keeps the receiver's database down: longer than a probe that
/// gives up after a while would wait.
const LONG_OUTAGE: Duration = Duration::from_secs(20);

pub(crate) async fn long_outage(ctx: Ctx) -> Verdict {
    let mut w = World::with_own_server(&ctx, SHORT_LEASE, BUDGET).await;
    let _p = w.running().await?;
    w.cancelled_and_acked("R-STORE-7").await?;
    ensure!(
        w.own_server().kill(),
        "the kit could not kill the receiver's server"
    );
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (_, key) = w.cancelled_task().await;
        ids.extend(w.deliveries_of(&key).await);
    }
    tokio::time::sleep(LONG_OUTAGE).await;
    w.own_server()
        .restart()
        .expect("the receiver's server starts again");
    for _ in 0..3 {
        let (_, key) = w.cancelled_task().await;
        ids.extend(w.deliveries_of(&key).await);
    }
    let rule = format!(
        "R-CLI-6 (after its database was down {} s, the receiver takes and applies deliveries again: probe for as long as an outage lasts; docs/receiver-contract.md, \"An outage of your database\")",
        LONG_OUTAGE.as_secs()
    );
    w.acked(&ids, Duration::from_secs(20), &rule).await?;
    Ok(format!(
        "{} events sent during and after a {} s outage: every one ACKed within 20 s of the restart",
        ids.len(),
        LONG_OUTAGE.as_secs()
    ))
}

/// The most deliveries a receiver with the default concurrency (4) may hold at once on its
/// stream: 4 applying and at most as many waiting.
const MOST_HELD: u64 = 8;
/// How many events wait for `credit-bound`'s receiver when it starts.
const BACKLOG: usize = 40;

pub(crate) async fn credit_bound(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, 10).await;
    // Every COMMIT answered 300 ms late: applies are slower than the platform, so credit
    // given for arrivals would pile deliveries up.
    let _proxy = w.behind_proxy_answering_commits_late(300).await;
    w.init().await?;
    let mut ids = Vec::new();
    for _ in 0..BACKLOG {
        let (_, key) = w.cancelled_task().await;
        ids.extend(w.deliveries_of(&key).await);
    }
    let _p = w.consume();
    w.acked(
        &ids,
        Duration::from_secs(60),
        "R-E2E-3 (a backlog of 40 is applied, at most 8 at a time held)",
    )
    .await?;
    let held = w
        .orbit
        .metric("orbit_stream_held_max")
        .ok_or("the kit could not read orbit-dev's orbit_stream_held_max")?;
    ensure!(
        held <= MOST_HELD,
        "R-E2E-3: the receiver held {held} deliveries at once on its stream (leased to it, not yet ACKed, released or expired); with the default concurrency of 4 it may hold at most {MOST_HELD}: 4 applying and at most 4 waiting. Grant credit for deliveries finished, never for deliveries received (docs/receiver-contract.md, \"Credit\"; R-SDK-2)"
    );
    Ok(format!(
        "a backlog of {BACKLOG} applied with every COMMIT 300 ms late: at most {held} deliveries held at once"
    ))
}

/// How long `abandoned-commit` holds the first COMMIT on its way to the server: past the
/// apply's budget and three leases.
const ABANDONED_HOLD_MS: u64 = 20_000;
/// `abandoned-commit`'s lease.
const ABANDONED_LEASE: u64 = 5;

pub(crate) async fn abandoned_commit(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, ABANDONED_LEASE).await;
    let proxy = w.behind_proxy().await;
    let _p = w.running().await?;
    let rule = proxy
        .arm(
            RuleSpec::new(Action::HoldRequest {
                delay_ms: ABANDONED_HOLD_MS,
            })
            .once(),
        )
        .expect("the rule arms");
    let (_, key) = w.cancelled_task().await;
    let id = w.deliveries_of(&key).await[0].clone();
    w.or_ended(rule.fired_within(Duration::from_secs(20)))
        .await?
        .ok_or("R-STORE-7: the receiver sent no COMMIT through its DSN within 20 s")?;
    let held = std::time::Instant::now();
    // The first attempt gives up; its lease ends; the second must apply or resolve in its
    // own lease, not wait behind the first one's locks.
    let within = Duration::from_secs(2 * ABANDONED_LEASE + 3);
    let d = w.settled(&id, within).await;
    ensure!(
        d.state == "ACKED" && d.attempts <= 2,
        "R-CLI-6: event {key}'s COMMIT was held {} s on its way to the server, past the apply's budget; {:.0} s later its delivery is {} after {} attempt(s), where the redelivery should have applied or resolved within its own lease: an apply that gives up must end its transaction on the server (KILL its connection from another), or the redelivery waits behind the abandoned transaction's row locks (docs/receiver-contract.md, \"Deadlines\")",
        ABANDONED_HOLD_MS / 1000,
        held.elapsed().as_secs_f64(),
        d.state,
        d.attempts
    );
    let rows = w.inbox(&key).await.len();
    ensure!(
        rows == 1,
        "R-STORE-4: event {key} has {rows} inbox rows after its abandoned COMMIT and its redelivery"
    );
    Ok(format!(
        "the first COMMIT held {} s: the redelivery ACKed at attempt {}, {:.1} s after the hold began",
        ABANDONED_HOLD_MS / 1000,
        d.attempts,
        held.elapsed().as_secs_f64()
    ))
}

/// Events of each round of `stream-dropped`.
const DROPPED_ROUND: usize = 8;
/// How long `stream-dropped` holds every COMMIT's answer: the applies are in flight, and the
/// deliveries behind them leased ahead, when the stream drops.
const DROPPED_COMMIT_MS: u64 = 600;
/// `stream-dropped`'s lease: long enough for every delivery of a round to be applied and
/// ACKed at its first attempt, after a reconnect, with the COMMITs held.
const DROPPED_LEASE: u64 = 20;

/// A stream dropped by the platform while deliveries are leased ahead and applies are in
/// flight: a lease belongs to the delivery, not to the stream, so nothing may be cancelled
/// that could finish, and every delivery must be ACKed at its first attempt on a later stream.
/// Then an idle period and a second round: the new stream's credit must be whole (counted
/// per connection, granted afresh), or the receiver stalls for good.
pub(crate) async fn stream_dropped(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, DROPPED_LEASE).await;
    let _proxy = w
        .behind_proxy_answering_commits_late(DROPPED_COMMIT_MS)
        .await;
    let _p = w.running().await?;
    let round = |r: usize| -> Vec<DeliveryId> {
        w.first_events(&format!("dropped-{r}"), DROPPED_ROUND, ctx.seed)
            .into_iter()
            .flat_map(|(_, _, deliveries)| deliveries)
            .collect()
    };
    let first = round(0);
    // Close the stream once the receiver holds several leases and none is ACKed yet; what it
    // holds then is what the close must not cost an attempt.
    let held = w
        .or_ended(poll(
            Duration::from_secs(20),
            Duration::from_millis(50),
            || async {
                let ds = w.deliveries().await;
                let of = |state: &str| -> Vec<DeliveryId> {
                    ds.iter()
                        .filter(|d| first.contains(&d.id) && d.state == state)
                        .map(|d| d.id.clone())
                        .collect()
                };
                let (leased, acked) = (of("LEASED"), of("ACKED"));
                (leased.len() >= 2 || !acked.is_empty()).then_some((leased, acked.len()))
            },
        ))
        .await?
        .ok_or(format!(
            "R-E2E-3: none of the {DROPPED_ROUND} deliveries of the first round was leased within 20 s"
        ))?;
    let closed = w.fault(serde_json::json!({"fault": "close-streams"}));
    let streams = closed["streams"].as_u64().unwrap_or(0);
    let (leased, acked_before) = held;
    w.acked(
        &leased,
        Duration::from_secs(DROPPED_LEASE - 2),
        "R-SDK-2 (a dropped stream ends no lease: every delivery it held is ACKed on a later stream, within its lease)",
    )
    .await?;
    let mut late = Vec::new();
    for id in &leased {
        let d = w.delivery(id).await;
        if d.attempts != 1 {
            late.push(format!("{} at attempt {}", d.id, d.attempts));
        }
    }
    ensure!(
        late.is_empty(),
        "R-SDK-2: the platform closed the stream while {} deliveries were leased to the receiver ({acked_before} ACKed before), and {} of them were ACKed only after their leases ran out ({}): a lease belongs to the delivery, not to the stream; a dropped stream must cancel no apply that could finish nor forget the deliveries leased ahead, and their ACKs go on the next stream (docs/receiver-contract.md, \"Leases across reconnects\")",
        leased.len(),
        late.len(),
        late.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
    );
    // Idle, then more: the new stream's credit is whole.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The first round's deliveries that were not leased at the close, and a second round:
    // only the new stream's credit brings them.
    let mut second: Vec<DeliveryId> = first
        .iter()
        .filter(|id| !leased.contains(id))
        .cloned()
        .collect();
    second.extend(round(1));
    let most = std::sync::atomic::AtomicUsize::new(0);
    let watch = async {
        loop {
            let ds = w.deliveries().await;
            let n = ds
                .iter()
                .filter(|d| second.contains(&d.id) && d.state == "LEASED")
                .count();
            most.fetch_max(n, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let acked = tokio::select! {
        a = w.acked(&second, Duration::from_secs(30), "R-E2E-3") => a,
        () = watch => unreachable!("the watch never ends"),
    };
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    acked.map_err(|why| {
        format!(
            "R-E2E-3: after the stream was dropped and reconnected, then 3 s idle, {} deliveries that only the new stream could bring were not all ACKed within 30 s (at most {most} leased at once): grant credit afresh on every new stream, counted per connection, never per subscription (docs/receiver-contract.md, \"Leases across reconnects\"); {why}",
            second.len()
        )
    })?;
    ensure!(
        most >= 2,
        "R-E2E-3: after the reconnect the receiver held at most {most} delivery at a time with {} waiting and every COMMIT answered {DROPPED_COMMIT_MS} ms late: the new stream's credit is not whole (the default concurrency is 4; docs/receiver-contract.md, \"Credit\")",
        second.len()
    );
    Ok(format!(
        "the stream closed ({streams} open) with {} leased and {acked_before} ACKed: each ACKed at its first attempt on a later stream; after 3 s idle, {} more ACKed, up to {most} leased at once",
        leased.len(),
        second.len()
    ))
}

/// `deadline-from-arrival`'s lease: its apply window is the lease less 1 s.
const SATURATED_LEASE: u64 = 4;
/// How long `deadline-from-arrival` holds every COMMIT's answer: longer than half the window,
/// so that a delivery that waited for a handler slot behind one such apply has too little of
/// its lease left for another, and shorter than the window, so that a fresh one fits.
const SATURATED_COMMIT_MS: u64 = 2_200;
/// Events of `deadline-from-arrival`: twice the deliveries a receiver of the default
/// concurrency (4) holds applying.
const SATURATED_EVENTS: usize = 8;

/// A saturated receiver with short leases: every COMMIT answered 2.2 s late, 4 s leases, and
/// twice as many events as the default concurrency applies at once, so that half of them wait
/// for a handler slot. An apply's deadline counts from when its delivery arrived, not from
/// when a slot freed: one that starts late with a whole budget runs past its lease, and its
/// ACK comes after the lease ended (the platform refuses it, and the delivery is tried again
/// though it committed). Every delivery must be ACKed in the end, and no ACK refused.
pub(crate) async fn deadline_from_arrival(ctx: Ctx) -> Verdict {
    ctx.findings().judge_refusals_here();
    let mut w = World::start(&ctx, SATURATED_LEASE).await;
    let _proxy = w
        .behind_proxy_answering_commits_late(SATURATED_COMMIT_MS)
        .await;
    let _p = w.running().await?;
    let ids: Vec<DeliveryId> = w
        .first_events("saturated", SATURATED_EVENTS, ctx.seed)
        .into_iter()
        .flat_map(|(_, _, deliveries)| deliveries)
        .collect();
    w.acked(
        &ids,
        Duration::from_secs(40),
        "R-STORE-9 (every delivery of a saturated receiver is ACKed in the end)",
    )
    .await?;
    let refused = w
        .orbit
        .metric("orbit_acks_total{result=\"refused\"}")
        .unwrap_or(0);
    let mut attempts = 0;
    for id in &ids {
        attempts = attempts.max(w.delivery(id).await.attempts);
    }
    ensure!(
        refused == 0,
        "R-STORE-9: with {SATURATED_EVENTS} events, 4 s leases and every COMMIT answered {SATURATED_COMMIT_MS} ms late, the platform refused {refused} ACK(s) that came after their lease had ended: an apply ran past its delivery's lease. Count an apply's deadline from when its delivery arrived, not from when a handler slot freed; a delivery that waited has only what is left of its lease (docs/receiver-contract.md, \"Deadlines\")"
    );
    Ok(format!(
        "{SATURATED_EVENTS} deliveries ACKed (at most {attempts} attempt(s) each), no ACK after its lease"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_deliveries_are_told_from_a_stalled_receiver() {
        let output =
            "applied evt-1\nerror event=good-7 timeout after 5 s\nerror event=good-7 lock wait\n";
        let expired = Unacked {
            expired: vec![("good-7".into(), 2)],
            ..Unacked::default()
        }
        .verdict(output);
        assert!(expired.starts_with("R-CLI-6: "), "{expired}");
        assert!(
            expired.contains("0 never taken, 0 taken and not finished, 1 EXPIRED"),
            "{expired}"
        );
        assert!(expired.contains("the receiver did take them"), "{expired}");
        assert!(
            expired.contains("event good-7: 2 attempt(s); the receiver's lines for it: error event=good-7 timeout after 5 s | error event=good-7 lock wait"),
            "{expired}"
        );
        assert!(!expired.contains("stopped taking deliveries"), "{expired}");
        let stalled = Unacked {
            never: 18,
            ..Unacked::default()
        }
        .verdict(output);
        assert!(stalled.contains("18 never taken"), "{stalled}");
        assert!(
            stalled.contains("the receiver stopped taking deliveries"),
            "{stalled}"
        );
        assert_eq!(lines_naming(output, "good-9"), "none names it");
    }
}
