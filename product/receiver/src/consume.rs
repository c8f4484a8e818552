//! `receiver consume`: apply every delivery of an existing subscription until SIGINT/SIGTERM.
//!
//! Before consuming anything it reads the subscription and refuses to start when its queue is
//! not the configured one (a wrong queue would burn the delivery budget). Concurrency 4 unless
//! `RECEIVER_CONCURRENCY` says otherwise; deliveries that are ready together are applied in
//! one transaction, up to 16 (`RECEIVER_GROUP_MAX`; see [`crate::group`]). A
//! signal cancels in-flight handlers (their deliveries are not ACKed and come again after the
//! lease) and the process ends within 10 s; the shared subscription is never paused.
//!
//! When the database is unavailable at start (down, not answering, a Galera node outside the
//! primary component), it waits for it, saying so, before taking any delivery.
//!
//! Each apply ends by the earlier of its budget (5 s, or `RECEIVER_APPLY_TIMEOUT`, which must
//! be below the lease by [`LEASE_MARGIN`]) and its lease's end minus
//! [`LEASE_MARGIN`] (measured from when the delivery arrived, with the lease the subscription
//! reports, so clock skew between hosts plays no part). While the database is down, no new
//! delivery is taken ([`crate::outage`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orbit_sdk::{Client, ConsumerEvent, CreditGate, EventConsumer, Release};

use crate::config::ConsumeConfig;
use crate::delivery::{Handled, NotAcked};
use crate::group::Applier;
use crate::metrics::Metrics;
use crate::outage::{wait_for_database, Lines, Outage, PROBE_MAX_WAIT};
use crate::seam::Point;
use result_inbox::{StorageError, Store, StoreOptions};

/// Kept between an apply's deadline and its lease's end, for the ACK to reach the platform.
pub const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// How long an apply of a delivery leased for `lease` may take: the budget, or less when the
/// lease (minus [`LEASE_MARGIN`], and never less than half the lease) ends sooner.
pub fn apply_window(budget: Duration, lease: Option<Duration>) -> Duration {
    match lease {
        Some(lease) => budget.min(lease.saturating_sub(LEASE_MARGIN).max(lease / 2)),
        None => budget,
    }
}
/// How long stopping may take, of the 10 s a signal allows.
pub const DRAIN: Duration = Duration::from_secs(8);

/// Why consume stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    #[error("cannot connect to the receiver database: {0}")]
    Store(#[source] result_inbox::StorageError),
    /// The schema's version does not fit this build: refused before any lease is taken.
    #[error("{0}")]
    Schema(#[source] result_inbox::StorageError),
    #[error("RECEIVER_REQUIRE_REPLICA_ACK=1 cannot be honoured by the receiver database: {0}: refusing to start")]
    ReplicaAck(String),
    #[error("{0}")]
    Platform(#[source] orbit_sdk::SdkError),
    #[error("cannot listen for SIGTERM/SIGINT: {0}")]
    Signals(#[source] std::io::Error),
    #[error("cannot serve metrics on {0} (RECEIVER_METRICS_LISTEN): {1}")]
    Metrics(std::net::SocketAddr, #[source] std::io::Error),
    #[error("subscription {id} consumes queue {actual}, not the configured queue {configured}: refusing to start")]
    WrongQueue {
        id: orbit_sdk::SubscriptionId,
        actual: String,
        configured: String,
    },
    #[error("RECEIVER_APPLY_TIMEOUT ({budget_ms} ms) must be below subscription {id}'s lease ({lease_ms} ms) by at least {} ms for the ACK: refusing to start", LEASE_MARGIN.as_millis())]
    BudgetNotBelowLease {
        id: orbit_sdk::SubscriptionId,
        budget_ms: u64,
        lease_ms: u64,
    },
}

/// Connects to the platform and the database: the client, the subscription (checked against
/// the configured queue) and the store, opened with `seams`' options.
async fn start(
    config: &ConsumeConfig,
    seams: Seams,
) -> Result<(Client, orbit_sdk::wire::Subscription, Arc<Store>), ConsumeError> {
    let queue = config.run.platform.queue.clone();
    let client = config
        .run
        .platform
        .client()
        .map_err(ConsumeError::Platform)?;
    let subscription = client
        .get_subscription(&config.subscription)
        .await
        .map_err(ConsumeError::Platform)?;
    if subscription.queue_id != queue.as_str() {
        return Err(ConsumeError::WrongQueue {
            id: subscription.id,
            actual: subscription.queue_id,
            configured: queue.to_string(),
        });
    }
    // A budget the user chose must fit the lease; the default is cut short instead (`run`).
    if let (Some(budget), Some(lease_ms)) = (config.apply_timeout, subscription.lease_ms) {
        if budget + LEASE_MARGIN > Duration::from_millis(lease_ms) {
            return Err(ConsumeError::BudgetNotBelowLease {
                id: subscription.id,
                budget_ms: budget.as_millis() as u64,
                lease_ms,
            });
        }
    }
    let options = StoreOptions::default()
        .max_connections(config.concurrency as u32 + 1)
        .apply_timeout(config.apply_timeout.unwrap_or(result_inbox::APPLY_TIMEOUT))
        .require_replica_ack(config.require_replica_ack);
    let options = (seams.store_options)(options);
    let store = connect_store(config, queue, options).await?;
    Ok((client, subscription, Arc::new(store)))
}

/// Opens the store, waiting while the database is unavailable (down, not answering, or a
/// Galera node outside the primary component): no delivery is taken before it answers, so
/// none spends an attempt. Any other failure (wrong password, tables missing) ends the start.
async fn connect_store(
    config: &ConsumeConfig,
    queue: result_inbox::QueueId,
    options: StoreOptions,
) -> Result<Store, ConsumeError> {
    wait_for_database(
        || Store::connect(&config.run.dsn, config.run.name.clone(), queue.clone(), options.clone()),
        StorageError::is_unavailable,
        || {},
        Lines {
            waiting: |e| {
                format!(
                    "database unavailable: waiting for it before taking deliveries ({e}); trying every {} s at most",
                    PROBE_MAX_WAIT.as_secs()
                )
            },
            back: |s| format!("database ready after {s} s: starting"),
        },
    )
    .await
    .map_err(|e| match e.kind() {
        result_inbox::StorageKind::ReplicaAckUnsupported(why) => ConsumeError::ReplicaAck(
            match e.number() {
                Some(n) => format!("{why} (mysql {n})"),
                None => why.to_owned(),
            },
        ),
        result_inbox::StorageKind::Schema(_) => ConsumeError::Schema(e),
        _ => ConsumeError::Store(e),
    })
    .inspect(|store| {
        if let Some(warning) = store.schema().warning() {
            tracing::warn!("{warning}");
        }
    })
}

/// How `consume` applies one delivered event, finishing by the deadline, before it decides on
/// the ACK from what comes back. The program's is [`apply_event`].
pub type ApplyEvent = for<'a> fn(
    &'a Applier,
    &'a [u8],
    tokio::time::Instant,
) -> Pin<Box<dyn Future<Output = Handled> + Send + 'a>>;

/// The event as delivered, validated and applied, in a group with what else is waiting when
/// `RECEIVER_GROUP_MAX` allows ([`Applier::apply_raw`]).
pub fn apply_event<'a>(
    applier: &'a Applier,
    raw: &'a [u8],
    deadline: tokio::time::Instant,
) -> Pin<Box<dyn Future<Output = Handled> + Send + 'a>> {
    Box::pin(applier.apply_raw(raw, deadline))
}

/// What a build of the program may set in `consume`: how each event is applied, and the
/// store's options. The program runs [`Seams::PROGRAM`]; the kit's mutant build passes its own
/// (`mutant.rs`), so that no mutant lives inside [`run_with`].
#[derive(Clone, Copy)]
pub struct Seams {
    pub apply: ApplyEvent,
    pub store_options: fn(StoreOptions) -> StoreOptions,
    pub consumer: fn(EventConsumer) -> EventConsumer,
    /// When a delivery's apply must be done, given the apply's window.
    pub deadline: fn(&orbit_sdk::Delivery, Duration) -> tokio::time::Instant,
    /// How long the health probe keeps trying through one outage: for ever (`None`) in the
    /// program; a mutant's probe gives up (R-CLI-6 broken on purpose).
    pub probe_patience: Option<Duration>,
}

impl Seams {
    /// The program's own: events as delivered, the store and the consumer as configured.
    pub const PROGRAM: Seams = Seams {
        apply: apply_event,
        store_options: |options| options,
        consumer: |consumer| consumer,
        // The lease began when the delivery arrived; it may have waited for a slot. Never
        // the platform's lease_expires_at against this host's clock: the clocks may differ.
        deadline: |d, window| d.received_at() + window,
        probe_patience: None,
    };
}

impl std::fmt::Debug for Seams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seams").finish_non_exhaustive()
    }
}

/// Consumes until `stop` completes. A `stop` during start-up ends it at once, successfully.
pub async fn run(
    config: &ConsumeConfig,
    stop: impl Future<Output = &'static str>,
) -> Result<(), ConsumeError> {
    run_with(config, stop, Seams::PROGRAM).await
}

/// [`run`] through `seams`.
pub async fn run_with(
    config: &ConsumeConfig,
    stop: impl Future<Output = &'static str>,
    seams: Seams,
) -> Result<(), ConsumeError> {
    let apply = seams.apply;
    let deadline_of = seams.deadline;
    let mut stop = std::pin::pin!(stop);
    tracing::info!(
        subscription = %config.subscription,
        "starting: reading the subscription from the platform and connecting to the receiver database"
    );
    let metrics = Metrics::new();
    if let Some(listen) = config.metrics {
        let bound = metrics
            .serve(listen)
            .await
            .map_err(|e| ConsumeError::Metrics(listen, e))?;
        tracing::info!(listen = %bound, "metrics: serving /metrics, /healthz and /readyz");
    }
    let (client, subscription, store) = tokio::select! {
        started = start(config, seams) => started?,
        signal = &mut stop => {
            tracing::info!(signal, "stopped during start-up");
            return Ok(());
        }
    };
    metrics.subscription_checked();
    let queue = config.run.platform.queue.clone();
    tracing::info!(subscription = %subscription.id, queue = %queue, consumer = %config.run.name, "consuming");
    let lease = subscription.lease_ms.map(Duration::from_millis);
    let window = apply_window(store.apply_timeout(), lease);
    if let Some(lease) = lease.filter(|_| window < store.apply_timeout()) {
        tracing::warn!(
            lease_ms = lease.as_millis() as u64,
            budget_ms = store.apply_timeout().as_millis() as u64,
            apply_ms = window.as_millis() as u64,
            "the subscription's lease is shorter than the apply budget plus a margin for the ACK: each apply is cut short to end before its lease"
        );
    }
    let gate = CreditGate::new();
    let outage = Outage::start(
        store.clone(),
        gate.clone(),
        metrics.clone(),
        seams.probe_patience,
    );
    let ages = config
        .metrics
        .map(|_| tokio::spawn(watch_inbox_age(store.clone(), metrics.clone())));
    let applier = Applier::grouped(
        store.clone(),
        config.group_max,
        config.concurrency,
        metrics.clone(),
    );
    let consumer = {
        let applier = applier.clone();
        let consumer = (seams.consumer)(
            EventConsumer::new(client, subscription.id.clone())
                .concurrency(config.concurrency)
                .prefetch(config.concurrency)
                .credit_gate(gate),
        );
        let metrics = metrics.clone();
        consumer.start(move |d| {
            let (applier, outage) = (applier.clone(), outage.clone());
            let metrics = metrics.clone();
            async move {
                let started = Instant::now();
                let mut unfinished = Unfinished {
                    delivery_id: &d.delivery_id,
                    attempt: d.attempt,
                    started,
                    logged: false,
                };
                metrics.started();
                let deadline = deadline_of(&d, window);
                let h = apply(&applier, d.event_json().as_bytes(), deadline).await;
                let took = started.elapsed();
                metrics.handled(&h, took);
                h.log(&d.delivery_id, d.attempt, took.as_millis() as u64);
                unfinished.logged = true;
                if h.suspect_database {
                    outage.suspect();
                }
                if h.classification.acks() {
                    crate::seam::reach(Point::AfterCommit, h.event_id.as_deref().unwrap_or("-"))
                        .await;
                    Ok(())
                } else if h.releasable && outage.confirmed().await {
                    // The database cannot serve now, as a probe of its own confirms, and
                    // nothing of this apply is in doubt: hand the delivery back unattempted
                    // (held deliveries come again once the probe succeeds).
                    tracing::info!(
                        delivery_id = %d.delivery_id,
                        attempt = d.attempt,
                        "released: the database cannot serve now; the platform counts no attempt"
                    );
                    Err(Box::new(Release(Box::new(NotAcked(h.classification))))
                        as Box<dyn std::error::Error + Send + Sync>)
                } else {
                    Err(Box::new(NotAcked(h.classification))
                        as Box<dyn std::error::Error + Send + Sync>)
                }
            }
        })
    };
    let mut events = consumer.events();
    let acks = metrics.clone();
    let watch = tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            match e {
                ConsumerEvent::Disconnected { reason, retry_in } => {
                    tracing::warn!(reason = %reason, retry_in_ms = retry_in.as_millis() as u64, "stream disconnected; reconnecting")
                }
                ConsumerEvent::Ack {
                    delivery_id,
                    result,
                    ..
                } => {
                    acks.ack(result.as_str());
                    tracing::info!(delivery_id = %delivery_id, result = ?result, "ack answered")
                }
                ConsumerEvent::Connected => tracing::info!("stream connected"),
                // A failed handler (`NotAcked`) has logged its delivery's line already; newer
                // events are not ours to log.
                _ => {}
            }
        }
    });
    let signal = stop.await;
    tracing::info!(signal, "stopping: cancelling in-flight handlers");
    let summary = consumer.shutdown(DRAIN).await;
    applier.stop();
    watch.abort();
    if let Some(ages) = ages {
        ages.abort();
    }
    store.close().await;
    tracing::info!(
        cancelled_handlers = summary.cancelled_handlers,
        unanswered_acks = summary.unanswered_acks,
        released = summary.released,
        "stopped; the subscription stays enabled"
    );
    Ok(())
}

/// How often `receiver_inbox_oldest_age_seconds` is read: pruning runs nightly, the alert
/// looks for days.
pub const INBOX_AGE_PERIOD: Duration = Duration::from_secs(60);

/// Keeps `receiver_inbox_oldest_age_seconds`: read at once, then every [`INBOX_AGE_PERIOD`],
/// and only where the `received_at` index makes it a lookup (without it, each read would scan
/// the consumer's rows: the gauge stays -1 and one line says why).
async fn watch_inbox_age(store: Arc<Store>, metrics: Metrics) {
    match store.has_received_at_index().await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(
                "receiver_inbox_oldest_age_seconds is not read: the inbox lacks the received_at index (docs/capacity.md adds it)"
            );
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the inbox's indexes; trying the oldest row's age anyway")
        }
    }
    loop {
        let age = store.inbox_oldest_age().await;
        metrics.inbox_oldest_age(match age {
            Ok(age) => Some(age.unwrap_or_default()),
            Err(_) => None,
        });
        tokio::time::sleep(INBOX_AGE_PERIOD).await;
    }
}

/// A handler's delivery until it has logged its line: a handler cancelled before that (at
/// shutdown) logs `classification=cancelled` when it is dropped, so that every delivery that
/// comes back after its lease has a line saying why.
struct Unfinished<'a> {
    delivery_id: &'a str,
    attempt: u32,
    started: Instant,
    logged: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.logged {
            let duration_ms = self.started.elapsed().as_millis() as u64;
            let (delivery_id, attempt) = (self.delivery_id, self.attempt);
            tracing::warn!(
                classification = "cancelled",
                delivery_id,
                attempt,
                duration_ms,
                detail = "the handler was cancelled before the apply ended: the delivery comes back after its lease",
                "delivery not acked"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_secs(5);

    #[test]
    fn an_apply_ends_before_its_lease_with_room_for_the_ack() {
        let s = Duration::from_secs;
        assert_eq!(apply_window(BUDGET, None), BUDGET);
        assert_eq!(apply_window(BUDGET, Some(s(30))), BUDGET);
        assert_eq!(apply_window(BUDGET, Some(s(6))), BUDGET);
        assert_eq!(apply_window(BUDGET, Some(s(4))), s(3));
        // A lease no longer than the margin still leaves half of it to the apply.
        assert_eq!(apply_window(BUDGET, Some(s(1))), Duration::from_millis(500));
    }
}
