//! Backpressure while the receiver's database is down: stop taking deliveries, probe, resume.
//!
//! A delivery taken while the database cannot answer would fail after its whole budget and
//! spend a lease and an attempt for nothing. So when an apply fails in a way that may mean the
//! database as a whole is gone (unavailable, no answer within the budget, COMMIT unanswered),
//! [`Outage::suspect`] holds the consumer's credit (the platform then sends nothing new) and
//! probes the database on a new connection, with a capped, jittered backoff. Deliveries already
//! in flight end as they would anyway. When a probe fails, one line says so
//! (`database unavailable: holding deliveries (…)`); when one succeeds, one line says how long
//! it lasted (`database back after N s`) and credit flows again. A failure the first probe
//! contradicts (a lock held elsewhere, say) costs a pause of one probe and prints nothing.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backoff::Backoff;
use orbit_sdk::CreditGate;
use result_inbox::{StorageError, Store};

use crate::metrics::Metrics;
use tokio::time::Instant;

/// How long one probe may take before the database counts as not answering.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The first wait between failed probes; it doubles up to [`PROBE_MAX_WAIT`].
pub const PROBE_FIRST_WAIT: Duration = Duration::from_millis(250);
/// The longest wait between two probes.
pub const PROBE_MAX_WAIT: Duration = Duration::from_secs(5);

/// Holds deliveries back while the database is down. Cloning shares the state.
#[derive(Clone)]
pub struct Outage(Arc<Inner>);

impl std::fmt::Debug for Outage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outage")
            .field("probing", &self.0.probing.load(Ordering::SeqCst))
            .field("holding", &self.0.gate.is_held())
            .finish()
    }
}

struct Inner {
    store: Arc<Store>,
    gate: CreditGate,
    probing: AtomicBool,
    metrics: Metrics,
}

impl Outage {
    /// Watches `store`, holding `gate` during an outage and saying so in `metrics`.
    pub fn new(store: Arc<Store>, gate: CreditGate, metrics: Metrics) -> Outage {
        Outage(Arc::new(Inner {
            store,
            gate,
            probing: AtomicBool::new(false),
            metrics,
        }))
    }

    /// A failure that may mean the database is gone: hold new deliveries and probe, unless a
    /// probe is already under way. Returns at once.
    pub fn suspect(&self) {
        if self.0.probing.swap(true, Ordering::SeqCst) {
            return;
        }
        self.0.gate.hold();
        self.0.metrics.database(true, true);
        let inner = self.0.clone();
        tokio::spawn(async move { inner.probe_until_back().await });
    }
}

impl Inner {
    async fn probe_until_back(&self) {
        // A probe that fails for any reason counts: the database is not serving this store.
        let _ = wait_for_database(
            || self.store.probe(PROBE_TIMEOUT),
            |_| true,
            || self.metrics.database(false, true),
            Lines {
                waiting: |e| {
                    format!(
                        "database unavailable: holding deliveries ({e}); probing it every {} s at most",
                        PROBE_MAX_WAIT.as_secs()
                    )
                },
                back: |s| format!("database back after {s} s: taking deliveries again"),
            },
        )
        .await;
        self.probing.store(false, Ordering::SeqCst);
        self.metrics.database(true, false);
        self.gate.release();
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
