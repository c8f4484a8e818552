//! Backpressure and readiness while the receiver's database is down: a probe on a connection
//! of its own, four times a second, decides; deliveries are held while it fails.
//!
//! A delivery taken while the database cannot answer would fail after its whole budget and
//! spend a lease and an attempt for nothing, and an orchestrator reading `/readyz` would keep
//! sending work to a receiver that can do none. So a health probe ([`Store::check`]: one
//! statement that reads no row, on its own connection, at most [`PROBE_TIMEOUT`]) runs every
//! [`HEALTH_PERIOD`], whatever the in-flight applies are doing. A stopped server fails it by
//! timeout, a dead one by refusal, a Galera node outside the primary component by 1047: within
//! 1.25 s either way (a period and a timeout), which leaves room under the 2 s promise. While
//! it fails, `receiver_database_up` is 0 (so `/readyz` answers 503) and the consumer's credit is
//! held (the platform sends nothing new); deliveries in flight end as they would anyway. The
//! first failure logs one line (`database unavailable: holding deliveries (…)`); the first
//! success after it logs one line with the time since the first failure (`database back after
//! N s`), and credit flows again.
//!
//! An apply that fails in a way that may mean the whole database is gone
//! ([`Outage::suspect`]) holds credit at once and asks for a probe now; if that probe
//! succeeds (a lock held elsewhere, say) the pause ends silently. Such a delivery is handed
//! back unattempted ([`Outage::confirmed`], then the SDK's `Release`) only when a probe that
//! began after its failure finds the database unable to serve: one probe, independent of
//! the apply, decides, so a delivery that fails alone is never released over and over.
//!
//! The probe counts three things as "cannot serve": no answer or a refusal (an outage:
//! `receiver_database_up` 0), a server that refuses writes (a demoted primary or a replica
//! behind the DSN's address after a failover: `receiver_database_up` 0 too, since no apply can
//! succeed there), and, with `RECEIVER_REQUIRE_REPLICA_ACK=1`, a primary whose commits no
//! replica acknowledges (`receiver_replica_ack` 0; the database itself is up). Each holds
//! deliveries and makes `/readyz` answer 503; each change of cause gets its own line.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backoff::Backoff;
use orbit_sdk::CreditGate;
use result_inbox::{HealthProbe, StorageError, StorageKind, Store};
use tokio::sync::{watch, Notify};

use crate::metrics::Metrics;
use tokio::time::Instant;

/// How long one probe may take before the database counts as not answering.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the health probe runs, up or down.
pub const HEALTH_PERIOD: Duration = Duration::from_millis(250);
/// The first wait between failed attempts at start; it doubles up to [`PROBE_MAX_WAIT`].
pub const PROBE_FIRST_WAIT: Duration = Duration::from_millis(250);
/// The longest wait between two attempts to connect at start.
pub const PROBE_MAX_WAIT: Duration = Duration::from_secs(5);

/// Holds deliveries back, and readiness down, while the database is down. Cloning shares the
/// state; the probe runs as long as the process.
#[derive(Clone)]
pub struct Outage(Arc<Inner>);

impl std::fmt::Debug for Outage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outage")
            .field("holding", &self.0.gate.is_held())
            .finish()
    }
}

struct Inner {
    store: Arc<Store>,
    gate: CreditGate,
    metrics: Metrics,
    /// How long the probe keeps trying through one outage (for ever when `None`).
    patience: Option<Duration>,
    state: Mutex<State>,
    /// Wakes the probe before its period (an apply's suspicion).
    wake: Notify,
    /// Each finished probe: how many have finished, and whether the last found the database
    /// unable to serve.
    probed: watch::Sender<(u64, bool)>,
}

/// What the probe and the applies have seen since the last success.
#[derive(Default)]
struct State {
    /// The first failure (a failed probe, or a suspicious apply) since the last success.
    first_failure: Option<Instant>,
    /// The cause whose line was logged for this outage, if any.
    announced: Option<Cause>,
}

/// Why the probe finds the database unable to serve: each has its own line and metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// Not answering, refusing connections, or refusing writes.
    Unavailable,
    /// Up, but no replica acknowledges the primary's commits.
    Unreplicated,
}

impl Cause {
    fn of(e: &StorageError) -> Cause {
        match e.kind() {
            StorageKind::Unreplicated => Cause::Unreplicated,
            _ => Cause::Unavailable,
        }
    }
}

impl Outage {
    /// Watches `store`, holding `gate` during an outage and saying so in `metrics`; starts the
    /// health probe, which keeps trying through an outage for ever unless given a `patience`
    /// (only a mutant is: [`crate::consume::Seams::probe_patience`]).
    pub fn start(
        store: Arc<Store>,
        gate: CreditGate,
        metrics: Metrics,
        patience: Option<Duration>,
    ) -> Outage {
        let outage = Outage(Arc::new(Inner {
            store,
            gate,
            metrics,
            patience,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            probed: watch::channel((0, false)).0,
        }));
        let inner = outage.0.clone();
        tokio::spawn(async move { inner.probe_forever().await });
        outage
    }

    /// A failure that may mean the database is gone: hold new deliveries now and probe at
    /// once. Returns at once.
    pub fn suspect(&self) {
        let now = Instant::now();
        self.0
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first_failure
            .get_or_insert(now);
        self.0.gate.hold();
        self.0.metrics.holding(true);
        self.0.wake.notify_one();
    }

    /// After [`Outage::suspect`]: whether a probe confirms that the database cannot serve
    /// now. A probe that finds it down is taken at once; one that finds it up may have
    /// begun before the failure, so only a probe that began after this call can say "up".
    /// At most two probes' time (about 2.5 s when the server does not answer).
    pub async fn confirmed(&self) -> bool {
        let mut probed = self.0.probed.subscribe();
        let (start, _) = *probed.borrow_and_update();
        loop {
            if probed.changed().await.is_err() {
                return false;
            }
            let (n, down) = *probed.borrow_and_update();
            if down {
                return true;
            }
            if n >= start + 2 {
                return false;
            }
        }
    }
}

impl Inner {
    async fn probe_forever(&self) {
        let mut probe = HealthProbe::default();
        loop {
            let result = self.store.check(&mut probe, PROBE_TIMEOUT).await;
            self.record(result);
            if self.gave_up() {
                return;
            }
            // A suspicion while this probe ran leaves a permit: the next probe starts at once.
            tokio::select! {
                () = tokio::time::sleep(HEALTH_PERIOD) => {}
                () = self.wake.notified() => {}
            }
        }
    }

    /// Whether this outage has outlasted the probe's patience (never without one).
    fn gave_up(&self) -> bool {
        let first = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first_failure;
        match (self.patience, first) {
            (Some(patience), Some(first)) if first.elapsed() > patience => {
                tracing::warn!("giving up on the database after {} s", patience.as_secs());
                true
            }
            _ => false,
        }
    }

    fn record(&self, result: Result<(), StorageError>) {
        let down = result.is_err();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(()) => {
                if let Some(first) = state.first_failure.take() {
                    if state.announced.is_some() {
                        tracing::info!(
                            "database back after {} s: taking deliveries again",
                            first.elapsed().as_secs()
                        );
                    }
                    state.announced = None;
                    self.gate.release();
                }
                self.metrics.database(true, false);
                self.metrics.replica_ack(true);
            }
            Err(e) => {
                state.first_failure.get_or_insert_with(Instant::now);
                self.gate.hold();
                let cause = Cause::of(&e);
                match cause {
                    Cause::Unavailable => {
                        self.metrics.database(false, true);
                        self.metrics.replica_ack(true);
                    }
                    Cause::Unreplicated => {
                        self.metrics.database(true, true);
                        self.metrics.replica_ack(false);
                    }
                }
                if state.announced != Some(cause) {
                    let every = HEALTH_PERIOD.as_millis();
                    match cause {
                        Cause::Unavailable => tracing::warn!(
                            "database unavailable: holding deliveries ({e}); probing it every {every} ms"
                        ),
                        Cause::Unreplicated => tracing::warn!(
                            "replica acknowledgement lost: holding deliveries, and ACKing nothing committed meanwhile ({e}); probing it every {every} ms"
                        ),
                    }
                    state.announced = Some(cause);
                }
            }
        }
        drop(state);
        self.probed.send_modify(|(n, last)| {
            *n += 1;
            *last = down;
        });
    }
}

/// What one wait for the database says: once, when an attempt first finds it unavailable (with
/// that error), and once, when it answers again (with the whole seconds waited).
pub(crate) struct Lines {
    pub waiting: fn(&StorageError) -> String,
    pub back: fn(u64) -> String,
}

/// Runs `attempt` until it succeeds. While a failure is one that `unavailable` says waiting can
/// cure, it reports it to `failed`, waits a jittered, doubling while ([`PROBE_FIRST_WAIT`] to
/// [`PROBE_MAX_WAIT`]) and tries again; any other failure ends the wait. The first such
/// failure, and the answer after it, each get one line ([`Lines`]). The one way `consume`
/// waits for its database: at start, and while it holds deliveries during an outage.
pub(crate) async fn wait_for_database<T, Fut>(
    mut attempt: impl FnMut() -> Fut,
    unavailable: impl Fn(&StorageError) -> bool,
    mut failed: impl FnMut(),
    lines: Lines,
) -> Result<T, StorageError>
where
    Fut: Future<Output = Result<T, StorageError>>,
{
    let started = Instant::now();
    let mut backoff = Backoff::new(PROBE_FIRST_WAIT, PROBE_MAX_WAIT);
    let mut announced = false;
    loop {
        match attempt().await {
            Ok(v) => {
                if announced {
                    tracing::info!("{}", (lines.back)(started.elapsed().as_secs()));
                }
                return Ok(v);
            }
            Err(e) if unavailable(&e) => {
                failed();
                if !announced {
                    tracing::warn!("{}", (lines.waiting)(&e));
                    announced = true;
                }
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(backoff.next_wait()).await;
    }
}
