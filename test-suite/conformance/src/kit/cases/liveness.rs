//! Liveness after failures: a burst of deliveries that fail in every way a receiver meets, then
//! good ones, which must all be taken and ACKed as if nothing had happened.

use std::time::Duration;

use commit_proxy::{Action, RuleSpec};
use orbit_sdk::DeliveryId;

use crate::kit::world::*;
use crate::kit::*;
use crate::QUEUE;

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
    let _p = w.running().await?;
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
    let mut good: Vec<DeliveryId> = Vec::new();
    for i in 0..GOOD {
        good.extend(w.inject(&event("good", i)).1);
    }
    if let Err(why) = w.acked(&good, GOOD_WITHIN, "R-CLI-6").await {
        if why.starts_with("R-CLI-3") {
            return Err(why); // consume exited: that message says so
        }
        let (mut never, mut unfinished) = (0, 0);
        for id in &good {
            let d = w.delivery(id).await;
            match (d.state.as_str(), d.attempts) {
                ("ACKED", _) => {}
                ("PENDING", 0) => never += 1,
                _ => unfinished += 1,
            }
        }
        return Err(format!(
            "R-CLI-6: after a burst of failed deliveries ({REFUSED} refused, {CONFLICTS} conflicts, a COMMIT whose answer was lost, one held {} s past the apply's budget), {} of {GOOD} good deliveries that followed were not ACKED within {} s: {never} never taken, {unfinished} taken and not finished; the receiver stopped taking deliveries (a failed delivery must cost only itself)",
            COMMIT_HELD_MS / 1000,
            never + unfinished,
            GOOD_WITHIN.as_secs()
        ));
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
