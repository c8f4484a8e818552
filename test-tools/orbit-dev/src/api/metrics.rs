//! `GET /metrics`: the platform's side in the Prometheus text format, for the tests and for
//! whoever runs a development platform. Deliveries by state are counted from the database at
//! each scrape; leases that ran out and ACK answers are counted as they happen. No label
//! carries an id.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sqlx::Row;

use super::Shared;
use orbit_wire::AckResult;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// The platform's metrics.
pub struct PlatformMetrics {
    registry: Registry,
    deliveries: Family<StateLabel, Gauge>,
    leases_expired: Counter,
    leases_released: Counter,
    acks: Family<ResultLabel, Counter>,
    ack_turns: Counter,
    redelivered: Counter,
    acked_forgotten: Counter,
    held_max: Gauge,
}

impl Default for PlatformMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("orbit");
        let deliveries = Family::<StateLabel, Gauge>::default();
        registry.register(
            "deliveries",
            "Deliveries by state, read from the database at this scrape",
            deliveries.clone(),
        );
        let leases_expired = Counter::default();
        registry.register(
            "leases_expired",
            "Leases that ran out unACKed (back to PENDING, or EXPIRED when the budget was spent)",
            leases_expired.clone(),
        );
        let leases_released = Counter::default();
        registry.register(
            "leases_released",
            "Leases a client handed back unhandled (back to PENDING, the attempt not counted)",
            leases_released.clone(),
        );
        let acks = Family::<ResultLabel, Counter>::default();
        registry.register("acks", "ACKs answered, by result", acks.clone());
        let ack_turns = Counter::default();
        registry.register(
            "ack_turns",
            "Transactions that recorded ACKs (ACKs that arrive together share one)",
            ack_turns.clone(),
        );
        let redelivered = Counter::default();
        registry.register(
            "redelivered",
            "ACKED deliveries sent back to PENDING on request (POST /v1/deliveries/{id}/redeliver)",
            redelivered.clone(),
        );
        let acked_forgotten = Counter::default();
        registry.register(
            "acked_forgotten",
            "ACKED deliveries forgotten past --acked-retention-seconds (no longer listed or redeliverable)",
            acked_forgotten.clone(),
        );
        let held_max = Gauge::default();
        registry.register(
            "stream_held_max",
            "The most deliveries one stream has held at once: leased to it and not yet ACKed, released or expired",
            held_max.clone(),
        );
        PlatformMetrics {
            registry,
            held_max,
            acked_forgotten,
            deliveries,
            leases_expired,
            leases_released,
            acks,
            ack_turns,
            redelivered,
        }
    }
}

impl PlatformMetrics {
    /// One ACKED delivery sent back to PENDING.
    pub fn redelivered(&self) {
        self.redelivered.inc();
    }

    /// `n` ACKED deliveries forgotten past the retention.
    pub fn acked_forgotten(&self, n: u64) {
        self.acked_forgotten.inc_by(n);
    }

    pub fn leases_expired(&self, n: u64) {
        self.leases_expired.inc_by(n);
    }

    pub fn released(&self, n: u64) {
        self.leases_released.inc_by(n);
    }

    /// A stream holds `n` deliveries now: the high-water mark follows.
    pub fn held(&self, n: usize) {
        let n = n as i64;
        if n > self.held_max.get() {
            self.held_max.set(n);
        }
    }

    /// One transaction recorded ACKs.
    pub fn ack_turn(&self) {
        self.ack_turns.inc();
    }

    pub fn ack(&self, result: AckResult) {
        self.acks
            .get_or_create(&ResultLabel {
                result: result.as_str().to_owned(),
            })
            .inc();
    }
}

pub(super) async fn metrics(State(p): State<Shared>) -> impl IntoResponse {
    let rows = sqlx::query("SELECT state, COUNT(*) FROM orbit_deliveries GROUP BY state")
        .fetch_all(&p.pool)
        .await;
    let Ok(rows) = rows else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "the platform database did not answer\n".to_owned(),
        );
    };
    let m = &p.metrics;
    for state in ["PENDING", "LEASED", "ACKED", "EXPIRED", "DISCARDED"] {
        let count = rows
            .iter()
            .find(|r| r.try_get_unchecked::<String, _>(0).ok().as_deref() == Some(state))
            .and_then(|r| r.try_get::<i64, _>(1).ok())
            .unwrap_or(0);
        m.deliveries
            .get_or_create(&StateLabel {
                state: state.to_owned(),
            })
            .set(count);
    }
    let mut out = String::new();
    let _ = encode(&mut out, &m.registry);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out,
    )
}
