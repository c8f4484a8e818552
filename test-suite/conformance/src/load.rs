//! A backlog like the ones users meet, for the drain bench and the soak: tasks that each go
//! `task.submitted` (v1), `task.started` (v2), `task.succeeded` (v3), with one redelivery of
//! one of those (the platform's duplicate-event fault), the tasks' steps interleaved in a
//! seeded random order. orbit-dev's task states allow three versions per task (a final state
//! is final), so the fourth delivery of each task is a duplicate rather than a fourth version;
//! older versions still arrive after newer ones when handlers overtake each other, and are
//! recorded as stale.

use serde_json::json;

use crate::{OrbitDev, QUEUE};

/// The event types a subscription to this load takes.
pub const LOAD_TYPES: &[&str] = &["task.submitted", "task.started", "task.succeeded"];

/// Deliveries per task: three versions and a duplicate.
pub const DELIVERIES_PER_TASK: usize = 4;

#[derive(Clone, Copy)]
enum Step {
    Submit,
    Start,
    Succeed,
    Duplicate,
}

/// Makes `tasks` tasks' deliveries to `sub` (which takes [`LOAD_TYPES`] on [`QUEUE`]) on
/// `orbit` (started with `--enable-fault-api`), in an order drawn from `rng`; returns the
/// task ids. `progress` is called after each step with how many deliveries are made.
pub async fn produce(
    orbit: &OrbitDev,
    client: &orbit_sdk::Client,
    sub: &orbit_sdk::SubscriptionId,
    tasks: usize,
    rng: &mut fastrand::Rng,
    mut progress: impl FnMut(usize),
) -> Vec<String> {
    let mut plan: Vec<Vec<Step>> = (0..tasks)
        .map(|_| {
            let mut steps = vec![Step::Submit, Step::Start, Step::Succeed];
            steps.insert(rng.usize(1..=3), Step::Duplicate);
            steps.reverse();
            steps
        })
        .collect();
    let mut ids: Vec<Option<String>> = vec![None; tasks];
    let mut open: Vec<usize> = (0..tasks).collect();
    let mut made = 0;
    while !open.is_empty() {
        let pick = rng.usize(..open.len());
        let t = open[pick];
        match plan[t].pop().expect("a step left") {
            Step::Submit => ids[t] = Some(client.submit_task(QUEUE, None).await.unwrap().id),
            Step::Start => {
                let id = ids[t].as_deref().unwrap();
                client.report_task(id, "RUNNING", None).await.unwrap();
            }
            Step::Succeed => {
                let id = ids[t].as_deref().unwrap();
                let result =
                    serde_json::value::RawValue::from_string(format!(r#"{{"n":{t},"ok":true}}"#))
                        .unwrap();
                client
                    .report_task(id, "SUCCEEDED", Some(&result))
                    .await
                    .unwrap();
            }
            Step::Duplicate => {
                let filter = orbit_sdk::DeliveryFilter {
                    task_id: ids[t].clone(),
                    ..Default::default()
                };
                let emitted = client.list_deliveries(sub, &filter).await.unwrap();
                let event = &emitted[rng.usize(..emitted.len())].event_id;
                orbit.fault(json!({"fault": "duplicate-event", "event_id": event}));
            }
        }
        made += 1;
        progress(made);
        if plan[t].is_empty() {
            open.swap_remove(pick);
        }
    }
    ids.into_iter().flatten().collect()
}

/// Sends version 1 of `task` again, late, under an id of its own (orbit-dev's `forge-event`
/// with `keep_id` false, so the new id is also the platform's key for it, and the listing of
/// ACKED deliveries names it as its body does), copied from the task's first delivery to
/// `sub`. The receiver records it as stale once the task is past version 1. Whether the task
/// had a delivery to copy.
pub async fn send_late_version(
    orbit: &OrbitDev,
    client: &orbit_sdk::Client,
    sub: &orbit_sdk::SubscriptionId,
    task: &str,
) -> bool {
    let filter = orbit_sdk::DeliveryFilter {
        task_id: Some(task.to_owned()),
        ..Default::default()
    };
    let emitted = client.list_deliveries(sub, &filter).await.unwrap();
    let Some(first) = emitted.first() else {
        return false;
    };
    orbit.fault(json!({"fault": "forge-event", "event_id": first.event_id, "keep_id": false, "task_version": 1}));
    true
}

/// Waits until no delivery of `sub` is left unACKED (PENDING, LEASED or EXPIRED), asking the
/// platform's database every `every` whether one is left: one index entry read, whatever the
/// backlog, so the watch does not load the platform it measures. Panics after `within`.
pub async fn wait_drained(
    platform: &mut sqlx::MySqlConnection,
    sub: &str,
    every: std::time::Duration,
    within: std::time::Duration,
) {
    let started = std::time::Instant::now();
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT 1 FROM orbit_deliveries WHERE subscription_id = ? \
             AND state IN ('PENDING', 'LEASED', 'EXPIRED') LIMIT 1) AS one",
        )
        .bind(sub)
        .fetch_one(&mut *platform)
        .await
        .unwrap();
        if left == 0 {
            return;
        }
        assert!(
            started.elapsed() < within,
            "the deliveries did not drain in {within:?}"
        );
        tokio::time::sleep(every).await;
    }
}

/// How long each apply took, from `receiver consume`'s own lines (`duration_ms=`), sorted:
/// the rest of a delivery's time is the platform's (lease, send, ACK).
pub fn apply_durations_ms(consume_output: &str) -> Vec<u64> {
    let mut ms: Vec<u64> = consume_output
        .lines()
        .filter(|l| l.contains("classification="))
        .filter_map(|l| l.split(" duration_ms=").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse().ok())
        .collect();
    ms.sort_unstable();
    ms
}
