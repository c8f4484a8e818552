//! After a run: the receiver's tables against the platform's deliveries, and against
//! themselves.

use sqlx::MySqlConnection;

/// What [`check_ledger`] counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    /// Deliveries of the subscription (all ACKED).
    pub deliveries: usize,
    /// Distinct events among them (each with one inbox row).
    pub events: usize,
    /// Inbox rows recorded as stale (not applied).
    pub stale: usize,
}

/// After a run: the receiver's tables (read through `admin`, on the receiver database) agree
/// with the platform and with themselves. Every delivery of `sub` is ACKED and its event has
/// exactly one inbox row; no other row exists; every one of `tasks` has a view at its highest
/// version, whose last event is the applied row of that version; `applied_events` counts the
/// applied rows and no version advanced a view twice. `what` names the run in failures.
pub async fn check_ledger(
    admin: &mut MySqlConnection,
    client: &orbit_sdk::Client,
    sub: &orbit_sdk::SubscriptionId,
    tasks: &[String],
    what: &str,
) -> Ledger {
    use std::collections::{BTreeMap, BTreeSet};
    let deliveries = client
        .list_deliveries(sub, &Default::default())
        .await
        .unwrap();
    assert!(
        deliveries.iter().all(|d| d.state == "ACKED"),
        "{what}: every delivery ACKED"
    );
    let delivered: BTreeSet<String> = deliveries.iter().map(|d| d.event_id.clone()).collect();
    let inbox: Vec<(Vec<u8>, bool, Vec<u8>)> =
        sqlx::query_as("SELECT event_id, applied, event_canonical FROM receiver_inbox")
            .fetch_all(&mut *admin)
            .await
            .unwrap();
    // event id → (task, version, applied)
    let mut rows = BTreeMap::new();
    for (id, applied, canonical) in inbox {
        let e: serde_json::Value = serde_json::from_slice(&canonical).unwrap();
        let id = String::from_utf8(id).unwrap();
        let task = e["task_id"].as_str().unwrap().to_owned();
        let version = e["task_version"].as_u64().unwrap();
        assert!(rows.insert(id, (task, version, applied)).is_none());
    }
    let recorded: BTreeSet<String> = rows.keys().cloned().collect();
    assert_eq!(
        recorded, delivered,
        "{what}: every delivered event has exactly one inbox row, and no other row exists"
    );

    let views: Vec<(Vec<u8>, u64, Vec<u8>, u64)> = sqlx::query_as(
        "SELECT task_id, task_version, last_event_id, applied_events FROM receiver_task_views",
    )
    .fetch_all(&mut *admin)
    .await
    .unwrap();
    let views: BTreeMap<String, (u64, String, u64)> = views
        .into_iter()
        .map(|(t, v, e, n)| {
            (
                String::from_utf8(t).unwrap(),
                (v, String::from_utf8(e).unwrap(), n),
            )
        })
        .collect();
    let inbox_tasks: BTreeSet<&String> = rows.values().map(|(t, _, _)| t).collect();
    let view_tasks: BTreeSet<&String> = views.keys().collect();
    assert_eq!(
        inbox_tasks, view_tasks,
        "{what}: no inbox row without its view, no view without an inbox row"
    );
    assert_eq!(view_tasks.len(), tasks.len(), "{what}: a view per task");

    for task in tasks {
        let (version, last_event, applied_events) = &views[task];
        let platform = client.get_task(task).await.unwrap();
        assert_eq!(
            *version, platform.version,
            "{what}: task {task} holds its highest version"
        );
        let of_task: Vec<_> = rows.iter().filter(|(_, (t, _, _))| t == task).collect();
        let (last_task, last_version, last_applied) = &rows[last_event];
        assert_eq!(
            (last_task, last_version, *last_applied),
            (task, version, true),
            "{what}: the view's last event is the applied row of its version"
        );
        let applied: Vec<u64> = of_task
            .iter()
            .filter(|(_, r)| r.2)
            .map(|(_, r)| r.1)
            .collect();
        let distinct: BTreeSet<u64> = applied.iter().copied().collect();
        assert_eq!(
            *applied_events,
            applied.len() as u64,
            "{what}: task {task}: applied_events counts the events that advanced it"
        );
        assert_eq!(
            distinct.len(),
            applied.len(),
            "{what}: task {task}: no version advanced the view twice"
        );
        assert!(applied.iter().all(|v| v <= version));
    }
    Ledger {
        deliveries: deliveries.len(),
        events: delivered.len(),
        stale: rows.values().filter(|r| !r.2).count(),
    }
}
