//! What a long-running `consume` reports to an operator: Prometheus metrics on `/metrics`,
//! `/healthz` (the process answers) and `/readyz` (the subscription was checked and the
//! database answers), served only when `RECEIVER_METRICS_LISTEN` names an address.
//!
//! The registry and its text encoding are `prometheus-client` (the Prometheus project's own
//! Rust client: typed metrics, label sets as Rust types, no global registry, no macros to
//! learn), served by axum, which the workspace already builds for orbit-dev. Labels carry only
//! fixed words (a classification, an ACK result): never an id, a token or result data.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::delivery::Handled;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// Every metric `consume` keeps. Cloning shares them.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

struct Inner {
    registry: Registry,
    events: Family<OutcomeLabel, Counter>,
    apply_seconds: Histogram,
    retries: Family<ReasonLabel, Counter>,
    in_flight: Gauge,
    held: Gauge,
    database_up: Gauge,
    replica_ack: Gauge,
    last_applied: Gauge<f64, AtomicU64>,
    inbox_oldest_age: Gauge<f64, AtomicU64>,
    acks: Family<ResultLabel, Counter>,
    group_size: Histogram,
    fallbacks: Family<ReasonLabel, Counter>,
    subscription_checked: AtomicBool,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero (the database counts as up until a probe
    /// says otherwise).
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("receiver");
        let events = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "events",
            "Deliveries handled, by the classification their log line shows",
            events.clone(),
        );
        // 1 ms to about 8 s: the budget is 5 s.
        let apply_seconds = Histogram::new([
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 8.0,
        ]);
        registry.register(
            "apply_seconds",
            "Time from a delivery's arrival to its apply's answer",
            apply_seconds.clone(),
        );
        let retries = Family::<ReasonLabel, Counter>::default();
        // Every reason from the start, at 0: a dashboard or an alert finds the series before
        // the first retry.
        for reason in result_inbox::RetryReason::ALL {
            let _ = retries.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            });
        }
        registry.register(
            "apply_retries",
            "Transactions restarted inside an apply after a definite rollback, by reason: deadlock, lock_wait, certification (1213 in reply to COMMIT: Galera), commit_error, unavailable, read_only (a demoted primary: 1290, 1792, 1836)",
            retries.clone(),
        );
        // 1 to the largest RECEIVER_GROUP_MAX.
        let group_size = Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]);
        registry.register(
            "group_size",
            "Deliveries applied in one transaction (RECEIVER_GROUP_MAX at most)",
            group_size.clone(),
        );
        let fallbacks = Family::<ReasonLabel, Counter>::default();
        for why in result_inbox::Fallback::ALL {
            let _ = fallbacks.get_or_create(&ReasonLabel {
                reason: why.as_str(),
            });
        }
        registry.register(
            "group_fallbacks",
            "Groups rolled back and applied one delivery at a time, by cause: duplicate, conflict, view_race (a view created meanwhile), write, too_large",
            fallbacks.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "in_flight",
            "Deliveries being handled now",
            in_flight.clone(),
        );
        let held = Gauge::default();
        registry.register(
            "deliveries_held",
            "1 while new deliveries are held back because the database is down",
            held.clone(),
        );
        let database_up = Gauge::default();
        database_up.set(1);
        registry.register(
            "database_up",
            "0 from a failed probe of the receiver database until one succeeds",
            database_up.clone(),
        );
        let replica_ack = Gauge::default();
        replica_ack.set(1);
        registry.register(
            "replica_ack",
            "With RECEIVER_REQUIRE_REPLICA_ACK=1: 0 while the primary reports no replica acknowledging its commits (semi-sync off): deliveries are held and nothing committed meanwhile is ACKed; always 1 without it",
            replica_ack.clone(),
        );
        let last_applied = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "last_applied_timestamp_seconds",
            "When an event last advanced a view (Unix time), 0 before the first",
            last_applied.clone(),
        );
        let inbox_oldest_age = Gauge::<f64, AtomicU64>::default();
        inbox_oldest_age.set(-1.0);
        registry.register(
            "inbox_oldest_age_seconds",
            "Age of the oldest inbox row of this consumer and queue, read every minute (0: empty); above the prune window, prune has stopped running. -1: not read (the inbox lacks the received_at index, or it could not be read)",
            inbox_oldest_age.clone(),
        );
        let acks = Family::<ResultLabel, Counter>::default();
        registry.register("ack", "ACKs the platform answered, by result", acks.clone());
        registry.register(
            "build",
            "The receiver's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Metrics(Arc::new(Inner {
            registry,
            events,
            apply_seconds,
            retries,
            in_flight,
            held,
            database_up,
            replica_ack,
            last_applied,
            inbox_oldest_age,
            acks,
            group_size,
            fallbacks,
            subscription_checked: AtomicBool::new(false),
        }))
    }

    /// A delivery's handler started.
    pub fn started(&self) {
        self.0.in_flight.inc();
    }

    /// A delivery was handled in `took`.
    pub fn handled(&self, h: &Handled, took: Duration) {
        let inner = &self.0;
        inner.in_flight.dec();
        inner
            .events
            .get_or_create(&OutcomeLabel {
                outcome: h.classification.to_string(),
            })
            .inc();
        inner.apply_seconds.observe(took.as_secs_f64());
        for (reason, n) in h.reasons.iter().filter(|(_, n)| *n > 0) {
            inner
                .retries
                .get_or_create(&ReasonLabel {
                    reason: reason.as_str(),
                })
                .inc_by(u64::from(n));
        }
        if h.classification == crate::delivery::Classification::Applied {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            inner.last_applied.set(now.as_secs_f64());
        }
    }

    /// One group applied: its size, and why it fell back to one delivery at a time, if it did.
    pub fn group(&self, size: usize, fallback: Option<result_inbox::Fallback>) {
        self.0.group_size.observe(size as f64);
        if let Some(why) = fallback {
            self.0
                .fallbacks
                .get_or_create(&ReasonLabel {
                    reason: why.as_str(),
                })
                .inc();
        }
    }

    /// The platform answered an ACK with `result` (its wire name).
    pub fn ack(&self, result: &str) {
        self.0
            .acks
            .get_or_create(&ResultLabel {
                result: result.to_owned(),
            })
            .inc();
    }

    /// Whether new deliveries are held, and whether the database answers.
    pub fn database(&self, up: bool, holding: bool) {
        self.0.database_up.set(i64::from(up));
        self.0.held.set(i64::from(holding));
    }

    /// Whether the primary reports a replica acknowledging its commits (always true when the
    /// receiver does not require it).
    pub fn replica_ack(&self, acknowledged: bool) {
        self.0.replica_ack.set(i64::from(acknowledged));
    }

    /// The oldest inbox row's age (`None`: not known).
    pub fn inbox_oldest_age(&self, age: Option<Duration>) {
        self.0
            .inbox_oldest_age
            .set(age.map_or(-1.0, |a| a.as_secs_f64()));
    }

    /// Whether new deliveries are held (an apply's suspicion, before a probe decides).
    pub fn holding(&self, holding: bool) {
        self.0.held.set(i64::from(holding));
    }

    /// The subscription was read and matches the configured queue.
    pub fn subscription_checked(&self) {
        self.0.subscription_checked.store(true, Ordering::SeqCst);
    }

    fn ready(&self) -> bool {
        self.0.subscription_checked.load(Ordering::SeqCst)
            && self.0.database_up.get() == 1
            && self.0.replica_ack.get() == 1
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.0.registry);
        out
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `listen` until the process ends. The
    /// address it bound (useful with port 0) comes back at once.
    pub async fn serve(&self, listen: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let bound = listener.local_addr()?;
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .with_state(self.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(bound)
    }
}

async fn metrics(State(m): State<Metrics>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

async fn readyz(State(m): State<Metrics>) -> impl IntoResponse {
    if m.ready() {
        (StatusCode::OK, "ready\n")
    } else if !m.0.subscription_checked.load(Ordering::SeqCst) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the subscription has not been checked yet\n",
        )
    } else if m.0.database_up.get() == 1 {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no replica acknowledges the primary's commits\n",
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the receiver database does not answer or refuses writes\n",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::{Classification, Handled};
    use result_inbox::RetryReason;

    fn handled(classification: Classification, reasons: &[RetryReason]) -> Handled {
        let reasons: result_inbox::Retries = reasons.iter().copied().collect();
        Handled {
            classification,
            event_id: Some("evt-secret-id".into()),
            reasons,
            detail: None,
            suspect_database: false,
            releasable: false,
        }
    }

    #[test]
    fn counts_by_classification_without_ids() {
        let m = Metrics::new();
        let deadlock_and_certification = [RetryReason::Deadlock, RetryReason::Certification];
        for (c, r) in [
            (Classification::Applied, &deadlock_and_certification[..]),
            (Classification::Applied, &[RetryReason::Certification][..]),
            (Classification::Duplicate, &[][..]),
            (Classification::Rejected("too_deep"), &[][..]),
        ] {
            m.started();
            m.handled(&handled(c, r), Duration::from_millis(3));
        }
        m.ack("acked");
        m.database(false, true);
        let text = m.encode();
        for line in [
            "receiver_events_total{outcome=\"applied\"} 2",
            "receiver_events_total{outcome=\"duplicate\"} 1",
            "receiver_events_total{outcome=\"rejected:too_deep\"} 1",
            "receiver_apply_seconds_count 4",
            "receiver_apply_retries_total{reason=\"deadlock\"} 1",
            "receiver_apply_retries_total{reason=\"certification\"} 2",
            "receiver_apply_retries_total{reason=\"lock_wait\"} 0",
            "receiver_apply_retries_total{reason=\"unavailable\"} 0",
            "receiver_in_flight 0",
            "receiver_database_up 0",
            "receiver_deliveries_held 1",
            "receiver_ack_total{result=\"acked\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in:\n{text}"
            );
        }
        assert!(!text.contains("evt-secret-id"));

        assert!(!m.ready(), "not ready before the subscription check");
        m.subscription_checked();
        assert!(!m.ready(), "not ready while the database is down");
        m.database(true, false);
        assert!(m.ready());
        m.replica_ack(false);
        assert!(!m.ready(), "not ready while no replica acknowledges");
        assert!(m.encode().lines().any(|l| l == "receiver_replica_ack 0"));
        m.replica_ack(true);
        assert!(m.ready());
    }
}
