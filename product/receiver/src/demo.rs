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

/// What the handler saw of this program's event: the outcomes of its two applies.
type Seen = Arc<Mutex<Option<[Outcome; 2]>>>;

/// Which step the demo is at, so that a timeout can name it.
#[derive(Clone, Default)]
struct Progress(Arc<Mutex<&'static str>>);

impl Progress {
    /// Enters step `name` and logs it.
    fn enter(&self, name: &'static str) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = name;
        tracing::info!(step = name, "demo");
    }

    /// Enters step `name`; the error a failure there becomes.
    fn at(&self, name: &'static str) -> impl Fn(String) -> DemoError {
        self.enter(name);
        move |detail: String| DemoError { step: name, detail }
    }

    fn current(&self) -> &'static str {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The demo's own subscription and task on the platform.
struct Made {
    subscription: orbit_sdk::wire::Subscription,
    task: String,
    own_task: TaskId,
}

/// Runs the demo within [`DEMO_TIMEOUT`].
pub async fn run(config: &DemoConfig) -> Result<DemoReport, DemoError> {
    let progress = Progress::default();
    match tokio::time::timeout(DEMO_TIMEOUT, steps(config, &progress)).await {
        Ok(result) => result,
        Err(_) => Err(DemoError {
            step: progress.current(),
            detail: format!("the demo did not finish within {DEMO_TIMEOUT:?}"),
        }),
    }
}

/// The steps, in order; each names itself before it starts.
async fn steps(config: &DemoConfig, progress: &Progress) -> Result<DemoReport, DemoError> {
    let (store, client) = connect(config, progress).await?;
    let made = subscribe_and_cancel(&client, config, progress).await?;
    progress.enter("consume the task's event");
    let seen = Seen::default();
    let consumer = EventConsumer::new(client.clone(), made.subscription.id.clone()).start({
        let (store, seen, own_task) = (store.clone(), seen.clone(), made.own_task.clone());
        move |d| handle(store.clone(), seen.clone(), own_task.clone(), d)
    });
    let events = consumer.events();
    let confirmed = match ack_confirmed(events, &client, &made.task, progress).await {
        Ok(id) => id,
        Err(e) => {
            let _ = consumer.shutdown(STOP_TIMEOUT).await;
            return Err(e);
        }
    };
    tracing::info!(delivery_id = %confirmed, "ack confirmed");
    let fail = progress.at("stop the consumer");
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
    read_back(&store, &client, &made, &seen, progress).await
}

/// The store on the receiver's database, and the platform's client.
async fn connect(
    config: &DemoConfig,
    progress: &Progress,
) -> Result<(Arc<Store>, Client), DemoError> {
    let fail = progress.at("connect to the receiver database");
    let store = Store::connect(
        &config.dsn,
        config.name.clone(),
        config.platform.queue.clone(),
        StoreOptions::default(),
    )
    .await
    .map_err(|e| fail(e.to_string()))?;
    let fail = progress.at("connect to the platform");
    let client = config.platform.client().map_err(|e| fail(e.to_string()))?;
    Ok((Arc::new(store), client))
}

/// A new subscription for `task.cancelled`, and a task submitted and cancelled.
async fn subscribe_and_cancel(
    client: &Client,
    config: &DemoConfig,
    progress: &Progress,
) -> Result<Made, DemoError> {
    let queue = config.platform.queue.as_str();
    let fail = progress.at("create the subscription");
    let subscription = client
        .create_subscription(queue, &["task.cancelled"])
        .await
        .map_err(|e| fail(e.to_string()))?;
    let fail = progress.at("submit the task");
    let task = client
        .submit_task(queue, None)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let fail = progress.at("cancel the task");
    client
        .cancel_task(&task.id)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let own_task = TaskId::new(task.id.clone()).map_err(|e| fail(format!("task id {e}")))?;
    Ok(Made {
        subscription,
        task: task.id,
        own_task,
    })
}

/// One delivery: this program's event runs the business transaction twice (the first
/// advances the view, the second finds the committed inbox record); another program's is
/// refused.
async fn handle(
    store: Arc<Store>,
    seen: Seen,
    own_task: TaskId,
    d: orbit_sdk::Delivery,
) -> Result<(), NotAcked> {
    let started = std::time::Instant::now();
    let log = |h: &crate::delivery::Handled| {
        h.log(
            &d.delivery_id,
            d.attempt,
            started.elapsed().as_millis() as u64,
        )
    };
    let event = parse(d.event_json().as_bytes(), store.queue()).map_err(|h| {
        log(&h);
        NotAcked(h.classification)
    })?;
    if event.task() != &own_task {
        log(&foreign(&event));
        return Err(NotAcked(Classification::Foreign));
    }
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let (outcome, h) = apply(&store, &event, None).await;
        log(&h);
        outcomes.push(outcome.ok_or(NotAcked(h.classification))?);
    }
    *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some([outcomes[0], outcomes[1]]);
    Ok(())
}

/// Waits until the platform confirms the ACK of this task's delivery; its id.
async fn ack_confirmed(
    mut events: tokio::sync::broadcast::Receiver<ConsumerEvent>,
    client: &Client,
    task: &str,
    progress: &Progress,
) -> Result<orbit_sdk::DeliveryId, DemoError> {
    let fail = progress.at("wait for the ACK to be confirmed");
    loop {
        match events.recv().await {
            Ok(ConsumerEvent::Ack {
                delivery_id,
                result,
                reason,
            }) => {
                let ours = client
                    .get_delivery(&delivery_id)
                    .await
                    .is_ok_and(|d| d.task_id == task);
                if !ours {
                    continue;
                }
                return match result {
                    AckResult::Acked | AckResult::AlreadyAcked => Ok(delivery_id),
                    // Refused, or an answer newer than this program: not an ACK.
                    _ => Err(fail(format!(
                        "the platform refused the ACK: {}",
                        reason.unwrap_or_default()
                    ))),
                };
            }
            Ok(ConsumerEvent::Disconnected { reason, .. }) => {
                tracing::warn!(reason = %reason, "stream disconnected; reconnecting");
            }
            Ok(_) => {}
            Err(e) => return Err(fail(e.to_string())),
        }
    }
}

/// Reads everything back (the view, the handler's outcomes, the platform's deliveries),
/// pauses the subscription and reports.
async fn read_back(
    store: &Store,
    client: &Client,
    made: &Made,
    seen: &Seen,
    progress: &Progress,
) -> Result<DemoReport, DemoError> {
    let fail = progress.at("read the view");
    let view = store
        .view(&made.own_task)
        .await
        .map_err(|e| fail(e.to_string()))?
        .ok_or_else(|| fail("no view row for the task after a confirmed ACK".into()))?;
    let fail = progress.at("read the handler's outcomes");
    let Some([_, second]) = *seen.lock().unwrap_or_else(|p| p.into_inner()) else {
        return Err(fail("the handler never ran for the task's event".into()));
    };
    let inbox_duplicate = second == Outcome::Duplicate { applied: true };

    let fail = progress.at("read the deliveries");
    let deliveries = client
        .list_deliveries(
            &made.subscription.id,
            &DeliveryFilter {
                task_id: Some(made.task.clone()),
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

    let fail = progress.at("pause the subscription");
    client
        .pause_subscription(&made.subscription.id)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let enabled = client
        .get_subscription(&made.subscription.id)
        .await
        .map_err(|e| fail(e.to_string()))?
        .enabled;
    store.close().await;

    Ok(DemoReport {
        task: made.task.clone(),
        state: view.last_state,
        inbox_duplicate,
        applied_events: view.applied_events,
        ack_confirmed,
        pending,
        subscription_enabled: enabled,
    })
}
