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
/// applied rows and no version advanced a view twice. `what` names the run in failures, which
/// name the first event and task ids found wrong and what is wrong with each.
/// The platform is read through its API (at most 10,000 deliveries): for more, use
/// [`check_ledger_on`].
pub async fn check_ledger(
    admin: &mut MySqlConnection,
    client: &orbit_sdk::Client,
    sub: &orbit_sdk::SubscriptionId,
    tasks: &[String],
    what: &str,
) -> Result<Ledger, String> {
    // The platform lists 1,000 by default: ask for its most, so that a longer run is checked
    // whole, not its first thousand.
    let all = orbit_sdk::DeliveryFilter {
        limit: Some(10_000),
        ..Default::default()
    };
    let deliveries = client
        .list_deliveries(sub, &all)
        .await
        .map_err(|e| format!("{what}: the platform's deliveries could not be listed: {e}"))?;
    let deliveries: Vec<(String, String)> = deliveries
        .into_iter()
        .map(|d| (d.event_id, d.state))
        .collect();
    let mut versions = BTreeMap::new();
    for task in tasks {
        let platform = client
            .get_task(task)
            .await
            .map_err(|e| format!("{what}: task {task} could not be read: {e}"))?;
        versions.insert(task.clone(), platform.version);
    }
    verify(admin, &deliveries, &versions, what).await
}

/// [`check_ledger`] reading the platform's side from its database (`platform`), for runs of
/// any size: every task with a delivery of `sub` is checked, forged events (older versions
/// arriving late, under ids of their own) included.
pub async fn check_ledger_on(
    admin: &mut MySqlConnection,
    platform: &mut MySqlConnection,
    sub: &str,
    what: &str,
) -> Result<Ledger, String> {
    let text = |b: Vec<u8>| String::from_utf8(b).expect("ids are text");
    // The id each delivered body carries, which the receiver records: the platform's key for
    // it is the same but for forged events (orbit-dev's `forge-event`), stored under keys of
    // their own.
    let deliveries: Vec<(Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT JSON_VALUE(e.body, '$.id'), d.state FROM orbit_deliveries d \
         JOIN orbit_events e ON e.id = d.event_id WHERE d.subscription_id = ?",
    )
    .bind(sub)
    .fetch_all(&mut *platform)
    .await
    .map_err(|e| format!("{what}: the platform's deliveries could not be read: {e}"))?;
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
    .map_err(|e| format!("{what}: the platform's tasks could not be read: {e}"))?;
    let versions = versions.into_iter().map(|(t, v)| (text(t), v)).collect();
    verify(admin, &deliveries, &versions, what).await
}

/// The checks of [`check_ledger`], given the platform's deliveries (event id, state) and the
/// highest version of each task. Every problem found is named with its event or task id; the
/// error lists the first [`SHOWN`] of them.
async fn verify(
    admin: &mut MySqlConnection,
    deliveries: &[(String, String)],
    versions: &BTreeMap<String, u64>,
    what: &str,
) -> Result<Ledger, String> {
    let mut problems = Problems::default();
    for (event, state) in deliveries {
        if state != "ACKED" {
            problems.add(format!("event {event}: a delivery is {state}, not ACKED"));
        }
    }
    let delivered: BTreeSet<&str> = deliveries.iter().map(|(e, _)| e.as_str()).collect();
    let inbox: Vec<(Vec<u8>, bool, Vec<u8>)> =
        sqlx::query_as("SELECT event_id, applied, event_canonical FROM receiver_inbox")
            .fetch_all(&mut *admin)
            .await
            .map_err(|e| format!("{what}: the inbox could not be read: {e}"))?;
    // event id → (task, version, applied)
    let mut rows = BTreeMap::new();
    for (id, applied, canonical) in inbox {
        let id = String::from_utf8_lossy(&id).into_owned();
        let e: serde_json::Value = serde_json::from_slice(&canonical).unwrap_or_default();
        let (Some(task), Some(version)) = (e["task_id"].as_str(), e["task_version"].as_u64())
        else {
            problems.add(format!(
                "event {id}: the stored event has no task id or version"
            ));
            continue;
        };
        if rows
            .insert(id.clone(), (task.to_owned(), version, applied))
            .is_some()
        {
            problems.add(format!("event {id}: doubled (two inbox rows)"));
        }
    }
    let recorded: BTreeSet<&str> = rows.keys().map(String::as_str).collect();
    for missing in delivered.difference(&recorded) {
        problems.add(format!(
            "event {missing}: ACKED without a committed inbox row (R-STORE-7: ACK only after COMMIT)"
        ));
    }
    for extra in recorded.difference(&delivered) {
        problems.add(format!(
            "event {extra}: an inbox row for no delivered event"
        ));
    }

    let views: Vec<(Vec<u8>, u64, Vec<u8>, u64)> = sqlx::query_as(
        "SELECT task_id, task_version, last_event_id, applied_events FROM receiver_task_views",
    )
    .fetch_all(&mut *admin)
    .await
    .map_err(|e| format!("{what}: the views could not be read: {e}"))?;
    let views: BTreeMap<String, (u64, String, u64)> = views
        .into_iter()
        .map(|(t, v, e, n)| {
            (
                String::from_utf8_lossy(&t).into_owned(),
                (v, String::from_utf8_lossy(&e).into_owned(), n),
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
    for task in applied_by_task.keys() {
        if !views.contains_key(*task) {
            problems.add(format!("task {task}: inbox rows without a view"));
        }
    }
    for task in views.keys() {
        if !applied_by_task.contains_key(task.as_str()) {
            problems.add(format!("task {task}: a view without an inbox row"));
        }
    }
    for (task, highest) in versions {
        let Some((version, last_event, applied_events)) = views.get(task) else {
            problems.add(format!(
                "task {task}: no view (its top version is {highest})"
            ));
            continue;
        };
        if version != highest {
            problems.add(format!(
                "task {task}: the view is at version {version}, not the top version {highest} (R-STORE-6)"
            ));
        }
        match rows.get(last_event) {
            Some((t, v, true)) if t == task && v == version => {}
            _ => problems.add(format!(
                "task {task}: the view's last event {last_event} is not the applied inbox row of version {version}"
            )),
        }
        let applied = applied_by_task
            .get(task.as_str())
            .cloned()
            .unwrap_or_default();
        let distinct: BTreeSet<u64> = applied.iter().copied().collect();
        if *applied_events != applied.len() as u64 {
            problems.add(format!(
                "task {task}: applied_events is {applied_events}, but {} inbox rows advanced the view",
                applied.len()
            ));
        }
        if distinct.len() != applied.len() {
            problems.add(format!(
                "task {task}: a version advanced the view twice (R-STORE-4)"
            ));
        }
        if let Some(v) = applied.iter().find(|v| *v > version) {
            problems.add(format!(
                "task {task}: version {v} is marked applied above the view's {version}"
            ));
        }
    }
    problems.verdict(what)?;
    Ok(Ledger {
        deliveries: deliveries.len(),
        events: delivered.len(),
        stale: rows.values().filter(|r| !r.2).count(),
    })
}

/// How many problems a failed ledger lists.
pub const SHOWN: usize = 5;

/// What a ledger found wrong, in the order found.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, p: String) {
        self.0.push(p);
    }

    fn verdict(self, what: &str) -> Result<(), String> {
        if self.0.is_empty() {
            return Ok(());
        }
        let more = self.0.len().saturating_sub(SHOWN);
        // The rule the first finding breaks comes first (an ACK without its row is R-STORE-7
        // whichever case's check found it), then the check that looked: the failure is read,
        // and its level taken, from what was found.
        let found = self
            .0
            .iter()
            .find_map(|p| crate::kit::rules_named(p).next())
            .filter(|rule| *rule != what);
        let mut out = match found {
            Some(rule) => format!(
                "{rule}: the ledger found {} problem(s) in {what}'s check: ",
                self.0.len()
            ),
            None => format!("{what}: the ledger found {} problem(s): ", self.0.len()),
        };
        out.push_str(&self.0[..self.0.len().min(SHOWN)].join("; "));
        if more > 0 {
            out.push_str(&format!("; and {more} more"));
        }
        Err(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_a_finding_breaks_comes_first_then_the_check_that_looked() {
        let mut lost = Problems::default();
        lost.add(
            "event e: ACKED without a committed inbox row (R-STORE-7: ACK only after COMMIT)"
                .into(),
        );
        let why = lost.verdict("R-STORE-9").unwrap_err();
        assert!(
            why.starts_with(
                "R-STORE-7: the ledger found 1 problem(s) in R-STORE-9's check: event e"
            ),
            "{why}"
        );
        let mut same = Problems::default();
        same.add("task t: a version advanced the view twice (R-STORE-4)".into());
        assert!(same
            .verdict("R-STORE-4")
            .unwrap_err()
            .starts_with("R-STORE-4: the ledger found 1 problem(s): task t"));
        assert_eq!(Problems::default().verdict("R-STORE-9"), Ok(()));
    }
}
