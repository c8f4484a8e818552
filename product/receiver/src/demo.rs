//! `receiver demo`: one task's cancellation, end to end, on a fresh subscription.
//!
//! Subscribe to `task.cancelled` on the configured queue, submit a task and cancel it, consume:
//! on this task's event run the business transaction twice (the first advances the view, the
//! second finds the committed inbox record), return success so the SDK ACKs, wait until the
//! platform confirms the ACK, then read everything back (the view, the platform's deliveries,
//! the paused subscription) and report it. Another program's event on the queue is refused,
//! not ACKed. At most 20 s in all; on failure the error names the step, and nothing is undone.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orbit_sdk::{AckResult, Client, ConsumerEvent, DeliveryFilter, EventConsumer};

use crate::config::DemoConfig;
use crate::delivery::{apply, foreign, parse, Classification, NotAcked};
use result_inbox::StoreOptions;
use result_inbox::{Outcome, Store, TaskId};

/// The whole demo's time budget.
pub const DEMO_TIMEOUT: Duration = Duration::from_secs(20);
/// The consumer's stop budget.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// What the demo read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoReport {
    pub task: String,
    pub state: String,
    pub inbox_duplicate: bool,
    pub applied_events: u64,
    pub ack_confirmed: usize,
    pub pending: usize,
    pub subscription_enabled: bool,
}

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "task={} state={} inbox_duplicate={} applied_events={}",
            self.task, self.state, self.inbox_duplicate, self.applied_events
        )?;
        write!(
            f,
            "ack_confirmed={} pending={} subscription_enabled={}",
            self.ack_confirmed, self.pending, self.subscription_enabled
        )
    }
}

/// A failed step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoError {
    pub step: &'static str,
    pub detail: String,
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failed at `{}`: {}", self.step, self.detail)
    }
}

impl std::error::Error for DemoError {}

/// What the handler saw of this program's event.
#[derive(Debug, Default)]
struct Seen {
    first: Option<Outcome>,
    second: Option<Outcome>,
}

/// Runs the demo within [`DEMO_TIMEOUT`].
pub async fn run(config: &DemoConfig) -> Result<DemoReport, DemoError> {
    let step: Arc<Mutex<&'static str>> = Arc::new(Mutex::new("start"));
    match tokio::time::timeout(DEMO_TIMEOUT, steps(config, step.clone())).await {
        Ok(result) => result,
        Err(_) => Err(DemoError {
            step: *step.lock().unwrap_or_else(|p| p.into_inner()),
            detail: format!("the demo did not finish within {DEMO_TIMEOUT:?}"),
        }),
    }
}

async fn steps(
    config: &DemoConfig,
    current: Arc<Mutex<&'static str>>,
) -> Result<DemoReport, DemoError> {
    let at = |name: &'static str| {
        *current.lock().unwrap_or_else(|p| p.into_inner()) = name;
        tracing::info!(step = name, "demo");
        move |detail: String| DemoError { step: name, detail }
    };
    let queue = config.platform.queue.clone();

    let fail = at("connect to the receiver database");
    let store = Arc::new(
        Store::connect(
            &config.dsn,
            config.name.clone(),
            queue.clone(),
            StoreOptions::default(),
        )
        .await
        .map_err(|e| fail(e.to_string()))?,
    );
    let fail = at("connect to the platform");
    let client = Client::new(
        &config.platform.url,
        config.platform.credentials.token.clone(),
    )
    .map_err(|e| fail(e.to_string()))?;
    let fail = at("create the subscription");
    let subscription = client
        .create_subscription(queue.as_str(), &["task.cancelled"])
        .await
        .map_err(|e| fail(e.to_string()))?;
    let fail = at("submit the task");
    let task = client
        .submit_task(queue.as_str(), None)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let fail = at("cancel the task");
    client
        .cancel_task(&task.id)
        .await
        .map_err(|e| fail(e.to_string()))?;

    let fail = at("consume the task's event");
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let own_task = TaskId::new(task.id.clone()).map_err(|e| fail(format!("task id {e}")))?;
    let consumer = {
        let (store, seen, queue, own_task) =
            (store.clone(), seen.clone(), queue.clone(), own_task.clone());
        EventConsumer::new(client.clone(), subscription.id.clone()).start(move |d| {
            let (store, seen, queue, own_task) =
                (store.clone(), seen.clone(), queue.clone(), own_task.clone());
            async move {
                let started = std::time::Instant::now();
                let event = match parse(d.event_json().as_bytes(), &queue) {
                    Ok(e) => e,
                    Err(h) => {
                        h.log(
                            &d.delivery_id,
                            d.attempt,
                            started.elapsed().as_millis() as u64,
                        );
                        return Err(NotAcked(h.classification));
                    }
                };
                if event.task() != &own_task {
                    foreign(&event).log(
                        &d.delivery_id,
                        d.attempt,
                        started.elapsed().as_millis() as u64,
                    );
                    return Err(NotAcked(Classification::Foreign));
                }
                // The same business transaction twice: the first advances the view, the
                // second finds the committed inbox record.
                let mut outcomes = Vec::new();
                for _ in 0..2 {
                    let (outcome, h) = apply(&store, &event, None).await;
                    h.log(
                        &d.delivery_id,
                        d.attempt,
                        started.elapsed().as_millis() as u64,
                    );
                    match outcome {
                        Some(o) => outcomes.push(o),
                        None => return Err(NotAcked(h.classification)),
                    }
                }
                let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                s.first = outcomes.first().copied();
                s.second = outcomes.get(1).copied();
                Ok(())
            }
        })
    };
    let mut events = consumer.events();

    let fail = at("wait for the ACK to be confirmed");
    let confirmed = loop {
        match events.recv().await {
            Ok(ConsumerEvent::Ack {
                delivery_id,
                result,
                reason,
            }) => {
                let ours = client
                    .get_delivery(&delivery_id)
                    .await
                    .map(|d| d.task_id == task.id)
                    .unwrap_or(false);
                if !ours {
                    continue;
                }
                match result {
                    AckResult::Acked | AckResult::AlreadyAcked => break delivery_id,
                    // Refused, or an answer newer than this program: not an ACK.
                    _ => {
                        let _ = consumer.shutdown(STOP_TIMEOUT).await;
                        return Err(fail(format!(
                            "the platform refused the ACK: {}",
                            reason.unwrap_or_default()
                        )));
                    }
                }
            }
            Ok(ConsumerEvent::Disconnected { reason, .. }) => {
                tracing::warn!(reason = %reason, "stream disconnected; reconnecting");
            }
            Ok(_) => {}
            Err(e) => return Err(fail(e.to_string())),
        }
    };
    tracing::info!(delivery_id = %confirmed, "ack confirmed");

    let fail = at("stop the consumer");
    let stopped = tokio::time::timeout(
        STOP_TIMEOUT + Duration::from_millis(200),
        consumer.shutdown(STOP_TIMEOUT),
    )
    .await;
    if stopped.is_err() {
        return Err(fail(format!(
            "the consumer did not stop within {STOP_TIMEOUT:?}"
        )));
    }

    let fail = at("read the view");
    let view = store
        .view(&own_task)
        .await
        .map_err(|e| fail(e.to_string()))?
        .ok_or_else(|| fail("no view row for the task after a confirmed ACK".into()))?;
    let fail = at("read the handler's outcomes");
    let (first, second) = {
        let s = seen.lock().unwrap_or_else(|p| p.into_inner());
        (s.first, s.second)
    };
    if first.is_none() {
        return Err(fail("the handler never ran for the task's event".into()));
    }
    let inbox_duplicate = second == Some(Outcome::Duplicate { applied: true });

    let fail = at("read the deliveries");
    let deliveries = client
        .list_deliveries(
            &subscription.id,
            &DeliveryFilter {
                task_id: Some(task.id.clone()),
                ..DeliveryFilter::default()
            },
        )
        .await
        .map_err(|e| fail(e.to_string()))?;
    let ack_confirmed = deliveries.iter().filter(|d| d.state == "ACKED").count();
    let pending = deliveries
        .iter()
        .filter(|d| d.state == "PENDING" || d.state == "LEASED")
        .count();

    let fail = at("pause the subscription");
    client
        .pause_subscription(&subscription.id)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let enabled = client
        .get_subscription(&subscription.id)
        .await
        .map_err(|e| fail(e.to_string()))?
        .enabled;
    store.close().await;

    Ok(DemoReport {
        task: task.id,
        state: view.last_state,
        inbox_duplicate,
        applied_events: view.applied_events,
        ack_confirmed,
        pending,
        subscription_enabled: enabled,
    })
}
