//! After a run: the receiver's tables against the platform's deliveries, and against
//! themselves.

use std::collections::{BTreeMap, BTreeSet};

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
/// The platform is read through its API (at most 10,000 deliveries): for more, use
/// [`check_ledger_on`].
pub async fn check_ledger(
    admin: &mut MySqlConnection,
    client: &orbit_sdk::Client,
    sub: &orbit_sdk::SubscriptionId,
    tasks: &[String],
    what: &str,
) -> Ledger {
    let deliveries = client
        .list_deliveries(sub, &Default::default())
        .await
        .unwrap();
    let deliveries: Vec<(String, String)> = deliveries
        .into_iter()
        .map(|d| (d.event_id, d.state))
        .collect();
    let mut versions = BTreeMap::new();
    for task in tasks {
        let platform = client.get_task(task).await.unwrap();
        versions.insert(task.clone(), platform.version);
    }
    verify(admin, &deliveries, &versions, what).await
}

/// [`check_ledger`] reading the platform's side from its database (`platform`), for runs of
/// any size: every task with a delivery of `sub` is checked.
pub async fn check_ledger_on(
    admin: &mut MySqlConnection,
    platform: &mut MySqlConnection,
    sub: &str,
    what: &str,
) -> Ledger {
    let text = |b: Vec<u8>| String::from_utf8(b).expect("ids are text");
    let deliveries: Vec<(Vec<u8>, Vec<u8>)> =
        sqlx::query_as("SELECT event_id, state FROM orbit_deliveries WHERE subscription_id = ?")
            .bind(sub)
            .fetch_all(&mut *platform)
            .await
            .unwrap();
    let deliveries: Vec<(String, String)> = deliveries
        .into_iter()
        .map(|(e, s)| (text(e), text(s)))
        .collect();
    let versions: Vec<(Vec<u8>, u64)> = sqlx::query_as(
        "SELECT id, version FROM orbit_tasks WHERE id IN \
         (SELECT task_id FROM orbit_deliveries WHERE subscription_id = ?)",
    )
    .bind(sub)
    .fetch_all(&mut *platform)
    .await
    .unwrap();
    let versions = versions.into_iter().map(|(t, v)| (text(t), v)).collect();
    verify(admin, &deliveries, &versions, what).await
}

/// The checks of [`check_ledger`], given the platform's deliveries (event id, state) and the
/// highest version of each task.
async fn verify(
    admin: &mut MySqlConnection,
    deliveries: &[(String, String)],
    versions: &BTreeMap<String, u64>,
    what: &str,
) -> Ledger {
    assert!(
        deliveries.iter().all(|(_, state)| state == "ACKED"),
        "{what}: every delivery ACKED"
    );
    let delivered: BTreeSet<&str> = deliveries.iter().map(|(e, _)| e.as_str()).collect();
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
    let recorded: BTreeSet<&str> = rows.keys().map(String::as_str).collect();
    assert!(
        recorded == delivered,
        "{what}: every delivered event has exactly one inbox row, and no other row exists \
         ({} delivered events, {} inbox rows, {} in common)",
        delivered.len(),
        recorded.len(),
        recorded.intersection(&delivered).count()
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
    // task → the versions of its applied rows
    let mut applied_by_task: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (task, version, applied) in rows.values() {
        let versions = applied_by_task.entry(task).or_default();
        if *applied {
            versions.push(*version);
        }
    }
    let inbox_tasks: BTreeSet<&str> = applied_by_task.keys().copied().collect();
    let view_tasks: BTreeSet<&str> = views.keys().map(String::as_str).collect();
    assert_eq!(
        inbox_tasks, view_tasks,
        "{what}: no inbox row without its view, no view without an inbox row"
    );
    assert_eq!(view_tasks.len(), versions.len(), "{what}: a view per task");

    for (task, highest) in versions {
        let (version, last_event, applied_events) = &views[task];
        assert_eq!(
            version, highest,
            "{what}: task {task} holds its highest version"
        );
        let (last_task, last_version, last_applied) = &rows[last_event];
        assert_eq!(
            (last_task, last_version, *last_applied),
            (task, version, true),
            "{what}: the view's last event is the applied row of its version"
        );
        let applied = &applied_by_task[task.as_str()];
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
