//! The `receiver-mutant` program: the receiver with one rule broken, chosen by
//! `RECEIVER_MUTANT` (a [`Mutant`]'s name), so that the conformance kit can prove that each of
//! its cases can fail. Built by `make mutant-build`, never released.
//!
//! Everything here wraps what the program does instead of living inside it: [`PROGRAM`] is the
//! program with its own `init` ([`init`]), `consume` ([`consume`]) and configuration source
//! ([`MutantEnv`]). `consume` installs the storage mutants' statements through the core's seam
//! (`crate::store_mutants`) and the stream's mutants through the SDK's ([`ForgetsLostAcks`],
//! [`CreditOnReceipt`]), and gives the program other [`receiver::consume::Seams`]: the
//! per-event mutants' way of applying.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

use result_inbox::Store;
use tokio::time::Instant;

use receiver::config::ConsumeConfig;
use receiver::consume::ConsumeError;
use receiver::delivery::{self, parse, Classification, Handled};
use receiver::group::Applier;
use receiver::program::{ConsumeFuture, InitFuture, Program, Stop};

use crate::frames;
pub use seam_names::Mutant;

/// The `receiver-mutant` program.
pub const PROGRAM: Program = Program {
    consume_source: &MutantEnv,
    init: run_init,
    consume: run_consume,
};

fn run_consume(config: &ConsumeConfig, stop: Stop) -> ConsumeFuture<'_> {
    Box::pin(consume(config, stop))
}

fn run_init(dsn: &result_inbox::Dsn) -> InitFuture<'_> {
    Box::pin(init(dsn))
}

/// The mutant `RECEIVER_MUTANT` names; unset means none. A bad value is fatal: a kit run
/// against a misspelt mutant would prove nothing.
pub fn active() -> Option<Mutant> {
    static ACTIVE: OnceLock<Option<Mutant>> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        #[allow(clippy::disallowed_methods)] // a test build's own switch, not configuration
        let name = std::env::var("RECEIVER_MUTANT").unwrap_or_default();
        if name.is_empty() {
            return None;
        }
        match Mutant::parse(&name) {
            Some(m) => {
                eprintln!("receiver-mutant: breaking one rule on purpose: {m}");
                Some(m)
            }
            None => {
                let names: Vec<&str> = Mutant::ALL.iter().map(|m| m.name()).collect();
                eprintln!(
                    "receiver-mutant: RECEIVER_MUTANT={name:?} is not one of {}",
                    names.join(", ")
                );
                std::process::exit(2);
            }
        }
    })
}

/// Whether `m` is the active mutant.
pub fn is(m: Mutant) -> bool {
    active() == Some(m)
}

/// `receiver init` in this build: [`Mutant::CaseInsensitiveIds`] changes the DDL.
pub async fn init(
    dsn: &result_inbox::Dsn,
) -> Result<result_inbox::schema::InitReport, result_inbox::schema::InitError> {
    crate::store_mutants::init(dsn, active()).await
}

/// `receiver consume` in this build: [`receiver::consume::run_with`] wrapped, so that the
/// production path carries none of this.
/// - [`Mutant::PrintsToken`] prints the platform token first.
/// - [`Mutant::NoQueueCheck`] consumes whatever queue the subscription has: the configured
///   queue is replaced by the subscription's before consume compares them.
/// - [`Mutant::PauseOnSigterm`] pauses the subscription once consume has stopped.
/// - [`Mutant::ExitsOnShortLease`] refuses to start under a lease shorter than its default
///   apply budget and the margin.
/// - [`Mutant::ForgetsLostAcks`] drops an ACK whose answer was lost instead of sending it
///   again after reconnecting ([`ForgetsLostAcks`], a layer on the SDK's stream).
/// - [`Mutant::CreditOnReceipt`] grants a credit for every delivery as it arrives
///   ([`CreditOnReceipt`]).
/// - The others apply each event their way ([`apply`]).
pub async fn consume(
    config: &ConsumeConfig,
    stop: impl std::future::Future<Output = &'static str>,
) -> Result<(), ConsumeError> {
    let platform = &config.run.platform;
    let client = platform.client().map_err(ConsumeError::Platform)?;
    if let Some(m) = active() {
        crate::store_mutants::install(m);
    }
    let layer: Option<Box<dyn orbit_sdk::seam::LinkLayer>> = match active() {
        Some(Mutant::ForgetsLostAcks) => Some(Box::new(ForgetsLostAcks::default())),
        Some(Mutant::CreditOnReceipt) => Some(Box::new(CreditOnReceipt)),
        Some(Mutant::PrintsRefusedProof) => Some(Box::new(PrintsRefusedProof::default())),
        Some(Mutant::CancelsOnStreamDrop) => Some(Box::new(StreamEpochs)),
        Some(Mutant::CreditPerSubscription) => Some(Box::new(CreditPerSubscription::default())),
        _ => None,
    };
    if let Some(layer) = layer {
        if let Err(e) = orbit_sdk::seam::install(layer) {
            eprintln!("receiver-mutant: {e}");
            std::process::exit(2);
        }
    }
    if is(Mutant::PrintsToken) {
        eprintln!(
            "receiver-mutant: platform token {}",
            platform.credentials.token.expose()
        );
    }
    let mut config = config.clone();
    if is(Mutant::SplitCommit) || is(Mutant::ReadBeforeLock) || is(Mutant::ViewByTaskAlone) {
        let options =
            result_inbox::connect::connect_options(&config.run.dsn).map_err(ConsumeError::Store)?;
        let _ = SPLIT_POOL.set(
            sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(config.concurrency as u32)
                .connect_lazy_with(options),
        );
    }
    let one_event_apply = active().is_some_and(crate::store_mutants::changes_the_one_event_apply);
    if one_event_apply || is(Mutant::DeadlineFromSlot) {
        // One delivery a transaction: the mutant's statements run for every apply (a group
        // builds its own), and each apply has a deadline of its own.
        config.group_max = 1;
    }
    if is(Mutant::NoQueueCheck) {
        let subscription = client
            .get_subscription(&config.subscription)
            .await
            .map_err(ConsumeError::Platform)?;
        if let Ok(queue) = result_inbox::QueueId::new(subscription.queue_id) {
            config.run.platform.queue = queue;
        }
    }
    if is(Mutant::ExitsOnShortLease) {
        let subscription = client
            .get_subscription(&config.subscription)
            .await
            .map_err(ConsumeError::Platform)?;
        let budget = result_inbox::APPLY_TIMEOUT + receiver::consume::LEASE_MARGIN;
        if let Some(lease_ms) = subscription.lease_ms {
            if std::time::Duration::from_millis(lease_ms) < budget {
                return Err(ConsumeError::BudgetNotBelowLease {
                    id: subscription.id,
                    budget_ms: result_inbox::APPLY_TIMEOUT.as_millis() as u64,
                    lease_ms,
                });
            }
        }
    }
    let seams = receiver::consume::Seams {
        deadline: if is(Mutant::DeadlineFromExpiresAt) {
            deadline_from_expiry
        } else if is(Mutant::DeadlineFromSlot) {
            |_, window| Instant::now() + window
        } else {
            receiver::consume::Seams::PROGRAM.deadline
        },
        probe_patience: is(Mutant::ProbeGivesUp).then_some(std::time::Duration::from_secs(10)),
        apply,
        store_options: receiver::consume::Seams::PROGRAM.store_options,
        consumer: |consumer| {
            if is(Mutant::NoOutageHold) {
                // A gate of its own, which nothing holds: the health probe's and the applies'
                // holds no longer reach the stream.
                consumer.credit_gate(orbit_sdk::CreditGate::new())
            } else {
                consumer
            }
        },
    };
    let stop = async move {
        let signal = stop.await;
        if is(Mutant::AcksOnSigterm) {
            // The running applies report success; the SDK sends their ACKs before it stops.
            STOPPING.store(true, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        signal
    };
    receiver::consume::run_with(&config, stop, seams).await?;
    if is(Mutant::PauseOnSigterm) {
        let subscription = &config.subscription;
        match client.pause_subscription(subscription).await {
            Ok(_) => eprintln!("receiver-mutant: paused subscription {subscription}"),
            Err(e) => {
                eprintln!("receiver-mutant: could not pause subscription {subscription}: {e}")
            }
        }
    }
    Ok(())
}

/// [`Mutant::DeadlineFromExpiresAt`]'s deadline: the platform's `lease_expires_at` against
/// this host's clock, less the margin for the ACK; now when it has passed or cannot be read.
fn deadline_from_expiry(d: &orbit_sdk::Delivery, _window: std::time::Duration) -> Instant {
    let now_micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_micros() as i64);
    let left = canonical_form::unix_micros(&d.lease_expires_at)
        .map_or(0, |at| at - now_micros)
        .max(0) as u64;
    Instant::now()
        + std::time::Duration::from_micros(left).saturating_sub(receiver::consume::LEASE_MARGIN)
}

/// Set when a signal came ([`Mutant::AcksOnSigterm`]).
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What a handler that reports success without an apply returns.
fn applied_at_once() -> Handled {
    Handled {
        classification: Classification::Applied,
        event_id: None,
        reasons: Default::default(),
        detail: None,
        suspect_database: false,
        releasable: false,
    }
}

/// How this build applies one event:
/// - [`Mutant::AckBeforeCommit`] reports success at once and applies behind the ACK;
///   [`Mutant::AckEarlySometimes`] does so for one event in three;
/// - [`Mutant::UnconfirmedIsSuccess`] reports a COMMIT without an answer as applied;
/// - [`Mutant::FloatNumbers`] applies the event with its result's numbers through an `f64`;
/// - [`Mutant::AsReceived`] records the bytes as received
///   (`crate::store_mutants::as_received`);
/// - [`Mutant::EscapesNonAscii`], [`Mutant::EscapesSlash`], [`Mutant::KeepsOffset`] and
///   [`Mutant::Utf8KeyOrder`] record the canonical bytes their way
///   (`crate::store_mutants::rewritten`);
/// - [`Mutant::AcksRejected`] reports a refused event as applied;
/// - [`Mutant::NoEventQueueCheck`] applies the event as if it named the configured queue;
/// - [`Mutant::LostUpdate`] also writes the view from a read made before the transaction;
/// - [`Mutant::SplitCommit`] commits the inbox row and the view apart ([`split_commit`]);
/// - [`Mutant::StopsAfterFailures`] hangs every apply once three have failed;
/// - [`Mutant::AcksOnSigterm`] reports a running apply applied once a signal came;
/// - [`Mutant::ReadOnlyIsFailure`] never suspects the database after a failed apply;
/// - [`Mutant::LenientVersions`] applies a version such as `1.0` as the whole number;
/// - [`Mutant::ViewByTaskAlone`] also moves every other view of the task after an apply;
/// - [`Mutant::QuotesConflictResult`] prints a conflicting event's result;
/// - [`Mutant::CancelsOnStreamDrop`] fails an apply whose stream dropped ([`StreamEpochs`]);
/// - [`Mutant::SessionOnFirstConnection`] sets the session time zone on the connection of its
///   first apply only ([`UtcOnce`]);
/// - the others apply as the program does (their changes are in the store's statements).
fn apply<'a>(
    store: &'a Applier,
    raw: &'a [u8],
    deadline: Instant,
) -> Pin<Box<dyn Future<Output = Handled> + Send + 'a>> {
    Box::pin(async move {
        static FAILED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        if is(Mutant::StopsAfterFailures) {
            if FAILED.load(std::sync::atomic::Ordering::SeqCst) >= 3 {
                std::future::pending::<()>().await;
            }
            let h = store.apply_raw(raw, deadline).await;
            if !h.classification.acks() {
                FAILED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            return h;
        }
        static APPLIED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let early = match active() {
            Some(Mutant::AckBeforeCommit) => true,
            Some(Mutant::AckEarlySometimes) => {
                APPLIED.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 3 == 2
            }
            _ => false,
        };
        match active() {
            _ if early => {
                let (store, raw) = (store.clone(), raw.to_vec());
                tokio::spawn(async move { store.apply_raw(&raw, deadline).await });
                applied_at_once()
            }
            Some(Mutant::AcksOnSigterm) => {
                let stopping = async {
                    while !STOPPING.load(std::sync::atomic::Ordering::SeqCst) {
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                };
                tokio::select! {
                    h = store.apply_raw(raw, deadline) => h,
                    () = stopping => applied_at_once(),
                }
            }
            Some(Mutant::ReadOnlyIsFailure) => {
                let h = store.apply_raw(raw, deadline).await;
                Handled {
                    suspect_database: false,
                    releasable: false,
                    ..h
                }
            }
            Some(Mutant::LenientVersions) => {
                let rewritten = std::str::from_utf8(raw).ok().and_then(whole_version);
                let raw = rewritten.as_deref().map_or(raw, str::as_bytes);
                store.apply_raw(raw, deadline).await
            }
            Some(Mutant::ViewByTaskAlone) => {
                let h = store.apply_raw(raw, deadline).await;
                if h.classification == Classification::Applied {
                    if let (Ok(event), Some(pool)) = (parse(raw, store.queue()), SPLIT_POOL.get()) {
                        // Names the task alone: every consumer's and queue's view of it.
                        let _ = sqlx::query(
                            "UPDATE receiver_task_views SET task_version = ?, last_event_id = ?, \
                             last_state = ?, last_result = ? WHERE task_id = ? AND task_version < ?",
                        )
                        .bind(event.version())
                        .bind(event.id().as_str())
                        .bind(event.state().as_str())
                        .bind(event.result())
                        .bind(event.task().as_str())
                        .bind(event.version())
                        .execute(pool)
                        .await;
                    }
                }
                h
            }
            Some(Mutant::UnconfirmedIsSuccess) => {
                let h = store.apply_raw(raw, deadline).await;
                match h.classification {
                    Classification::CommitUnconfirmed => Handled {
                        classification: Classification::Applied,
                        ..h
                    },
                    _ => h,
                }
            }
            Some(Mutant::FloatNumbers) => {
                let rewritten = std::str::from_utf8(raw).ok().and_then(through_f64_event);
                let raw = rewritten.as_deref().map_or(raw, str::as_bytes);
                store.apply_raw(raw, deadline).await
            }
            Some(Mutant::AsReceived) => match parse(raw, store.queue()) {
                Ok(event) => {
                    let event = crate::store_mutants::as_received(event, raw);
                    delivery::apply(store, &event, Some(deadline)).await.1
                }
                Err(rejected) => rejected,
            },
            Some(
                m @ (Mutant::EscapesNonAscii
                | Mutant::EscapesSlash
                | Mutant::KeepsOffset
                | Mutant::Utf8KeyOrder),
            ) => match parse(raw, store.queue()) {
                Ok(event) => {
                    let event = crate::store_mutants::rewritten(m, event, raw);
                    delivery::apply(store, &event, Some(deadline)).await.1
                }
                Err(rejected) => rejected,
            },
            Some(Mutant::NoEventQueueCheck) => {
                let rewritten = std::str::from_utf8(raw)
                    .ok()
                    .and_then(|r| with_queue(r, store.queue().as_str()));
                let raw = rewritten.as_deref().map_or(raw, str::as_bytes);
                store.apply_raw(raw, deadline).await
            }
            Some(Mutant::LostUpdate) => match parse(raw, store.queue()) {
                Ok(event) => {
                    // A plain read before the transaction, and time for another apply of the
                    // same task to read the same.
                    let seen = store.view(event.task()).await.ok().flatten();
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    let write = BlindView {
                        seen: seen.map_or(0, |v| v.task_version),
                        consumer: store.consumer().as_str().to_owned(),
                    };
                    let applied = store.apply_until(&event, &write, Some(deadline)).await;
                    Handled::of(&event, &applied.result, applied.reasons)
                }
                Err(rejected) => rejected,
            },
            Some(Mutant::SplitCommit) => match parse(raw, store.queue()) {
                Ok(event) => split_commit(store, &event, deadline).await,
                Err(rejected) => rejected,
            },
            Some(Mutant::ReadBeforeLock) => match parse(raw, store.queue()) {
                Ok(event) => match read_before_lock(store, &event).await {
                    Some(handled) => handled,
                    None => delivery::apply(store, &event, Some(deadline)).await.1,
                },
                Err(rejected) => rejected,
            },
            Some(Mutant::SessionOnFirstConnection)
                if !SESSION_SET.load(std::sync::atomic::Ordering::SeqCst) =>
            {
                match parse(raw, store.queue()) {
                    Ok(event) => {
                        let applied = store
                            .apply_until(
                                &event,
                                &UtcOnce {
                                    consumer: store.consumer().as_str().to_owned(),
                                },
                                Some(deadline),
                            )
                            .await;
                        Handled::of(&event, &applied.result, applied.reasons)
                    }
                    Err(rejected) => rejected,
                }
            }
            Some(Mutant::CancelsOnStreamDrop) => {
                let received_on = frames::event_id(raw).and_then(|id| {
                    EPOCHS
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .1
                        .get(&id)
                        .copied()
                });
                let now = || EPOCHS.lock().unwrap_or_else(|p| p.into_inner()).0;
                if received_on.is_some_and(|on| on != now()) {
                    // Its stream is gone: dropped as if its lease had ended with it.
                    return Handled {
                        classification: Classification::Timeout,
                        ..applied_at_once()
                    };
                }
                let started_on = now();
                let dropped = async {
                    while now() == started_on {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                };
                tokio::select! {
                    h = store.apply_raw(raw, deadline) => h,
                    () = dropped => Handled {
                        classification: Classification::Timeout,
                        ..applied_at_once()
                    },
                }
            }
            Some(Mutant::QuotesConflictResult) => {
                let h = store.apply_raw(raw, deadline).await;
                if h.classification == Classification::Conflict {
                    if let Ok(event) = parse(raw, store.queue()) {
                        let result = event.result().map(String::from_utf8_lossy);
                        eprintln!(
                            "receiver-mutant: conflict for event {}: incoming result {}",
                            event.id().as_str(),
                            result.unwrap_or_default()
                        );
                    }
                }
                h
            }
            Some(Mutant::AcksRejected) => {
                let h = store.apply_raw(raw, deadline).await;
                match h.classification {
                    Classification::Rejected(_) => Handled {
                        classification: Classification::Applied,
                        ..h
                    },
                    _ => h,
                }
            }
            _ => store.apply_raw(raw, deadline).await,
        }
    })
}

/// [`Mutant::ReadBeforeLock`]: one transaction under REPEATABLE READ on the mutant's own
/// connections: the inbox row, a plain read of the view, then a blind write from that read.
/// `None` when the event's inbox row exists already (or the row cannot be written): the
/// program's own apply then decides (a duplicate, a conflict, an error).
async fn read_before_lock(store: &Store, event: &result_inbox::TaskEvent) -> Option<Handled> {
    let pool = SPLIT_POOL.get()?;
    let (consumer, queue) = (store.consumer().as_str(), store.queue().as_str());
    let (task, version) = (event.task().as_str(), event.version());
    let mut conn = pool.acquire().await.ok()?;
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *conn)
        .await
        .ok()?;
    let mut tx = sqlx::Connection::begin(&mut *conn).await.ok()?;
    sqlx::query(result_inbox::store::INSERT_INBOX)
        .bind(consumer)
        .bind(queue)
        .bind(event.id().as_str())
        .bind(&event.digest().0[..])
        .bind(event.canonical())
        .execute(&mut *tx)
        .await
        .ok()?;
    let seen: Option<u64> = sqlx::query_scalar(
        "SELECT task_version FROM receiver_task_views \
         WHERE consumer_name = ? AND queue_id = ? AND task_id = ?",
    )
    .bind(consumer)
    .bind(queue)
    .bind(task)
    .fetch_optional(&mut *tx)
    .await
    .ok()?;
    let written = match seen {
        Some(v) if v >= version => sqlx::query(result_inbox::store::MARK_STALE)
            .bind(consumer)
            .bind(queue)
            .bind(event.id().as_str())
            .execute(&mut *tx)
            .await
            .map(|_| Classification::Stale),
        // Blind: no condition on the version the row holds now.
        Some(_) => sqlx::query(
            "UPDATE receiver_task_views SET task_version = ?, last_event_id = ?, last_state = ?, \
             last_result = ?, applied_events = applied_events + 1, updated_at = UTC_TIMESTAMP(6) \
             WHERE consumer_name = ? AND queue_id = ? AND task_id = ?",
        )
        .bind(version)
        .bind(event.id().as_str())
        .bind(event.state().as_str())
        .bind(event.result())
        .bind(consumer)
        .bind(queue)
        .bind(task)
        .execute(&mut *tx)
        .await
        .map(|_| Classification::Applied),
        None => sqlx::query(result_inbox::store::UPSERT_VIEW)
            .bind(consumer)
            .bind(queue)
            .bind(task)
            .bind(version)
            .bind(event.id().as_str())
            .bind(event.state().as_str())
            .bind(event.result())
            .execute(&mut *tx)
            .await
            .map(|_| Classification::Applied),
    };
    let classification = written.ok()?;
    tx.commit().await.ok()?;
    Some(Handled {
        classification,
        event_id: Some(event.id().as_str().to_owned()),
        reasons: Default::default(),
        detail: None,
        suspect_database: false,
        releasable: false,
    })
}

/// [`Mutant::SplitCommit`]'s own connections to the receiver database (through the same DSN,
/// so a proxy in front of it sees these statements too).
static SPLIT_POOL: OnceLock<sqlx::MySqlPool> = OnceLock::new();

/// [`Mutant::SplitCommit`]: the inbox row alone (its own transaction, autocommit), then the
/// view in another. A row that exists already goes the program's way (a duplicate).
async fn split_commit(
    store: &Store,
    event: &result_inbox::TaskEvent,
    deadline: Instant,
) -> Handled {
    let Some(pool) = SPLIT_POOL.get() else {
        return delivery::apply(store, event, Some(deadline)).await.1;
    };
    let (consumer, queue) = (store.consumer().as_str(), store.queue().as_str());
    let inserted = sqlx::query(result_inbox::store::INSERT_INBOX)
        .bind(consumer)
        .bind(queue)
        .bind(event.id().as_str())
        .bind(&event.digest().0[..])
        .bind(event.canonical())
        .execute(pool)
        .await;
    if inserted.is_err() {
        return delivery::apply(store, event, Some(deadline)).await.1;
    }
    let view = sqlx::query(result_inbox::store::UPSERT_VIEW)
        .bind(consumer)
        .bind(queue)
        .bind(event.task().as_str())
        .bind(event.version())
        .bind(event.id().as_str())
        .bind(event.state().as_str())
        .bind(event.result())
        .execute(pool)
        .await;
    // The upsert reports what it found through the last insert id (the store's codes): an
    // older version is marked stale, in yet another statement.
    let classification = match &view {
        Ok(r) if r.last_insert_id() == result_inbox::store::VIEW_NEWER => {
            let _ = sqlx::query(result_inbox::store::MARK_STALE)
                .bind(consumer)
                .bind(queue)
                .bind(event.id().as_str())
                .execute(pool)
                .await;
            Classification::Stale
        }
        Ok(_) => Classification::Applied,
        Err(_) => Classification::StorageError,
    };
    Handled {
        classification,
        event_id: Some(event.id().as_str().to_owned()),
        reasons: Default::default(),
        detail: view.err().map(|e| e.to_string()),
        suspect_database: false,
        releasable: false,
    }
}

/// [`Mutant::LostUpdate`]'s write inside the apply: the view set to the event's values when
/// the event is newer than the version read before the transaction began (`seen`), whatever
/// the view holds now.
struct BlindView {
    seen: u64,
    consumer: String,
}

impl result_inbox::BusinessWrite for BlindView {
    fn write<'a>(
        &'a self,
        conn: &'a mut sqlx::MySqlConnection,
        receipt: result_inbox::Receipt<'a>,
    ) -> result_inbox::WriteFuture<'a> {
        Box::pin(async move {
            let e = receipt.event;
            if e.version() <= self.seen {
                return Ok(());
            }
            sqlx::query(
                "UPDATE receiver_task_views SET task_version = ?, last_event_id = ?, last_state = ? \
                 WHERE consumer_name = ? AND queue_id = ? AND task_id = ?",
            )
            .bind(e.version())
            .bind(e.id().as_str())
            .bind(e.state().as_str())
            .bind(&self.consumer)
            .bind(e.queue().as_str())
            .bind(e.task().as_str())
            .execute(conn)
            .await?;
            Ok(())
        })
    }
}

/// Set once [`UtcOnce`] has set a connection's session ([`Mutant::SessionOnFirstConnection`]).
static SESSION_SET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// [`Mutant::SessionOnFirstConnection`]'s one setting of the session: inside the first apply,
/// `SET time_zone` on its connection, and that event's own times written again in UTC (the
/// statements ran in the server's zone), so that one connection at a time behaves.
struct UtcOnce {
    consumer: String,
}

impl result_inbox::BusinessWrite for UtcOnce {
    fn write<'a>(
        &'a self,
        conn: &'a mut sqlx::MySqlConnection,
        receipt: result_inbox::Receipt<'a>,
    ) -> result_inbox::WriteFuture<'a> {
        Box::pin(async move {
            let e = receipt.event;
            sqlx::query("SET time_zone = '+00:00'")
                .execute(&mut *conn)
                .await?;
            let consumer = &self.consumer;
            sqlx::query(
                "UPDATE receiver_inbox SET received_at = UTC_TIMESTAMP(6) \
                 WHERE consumer_name = ? AND queue_id = ? AND event_id = ?",
            )
            .bind(consumer)
            .bind(e.queue().as_str())
            .bind(e.id().as_str())
            .execute(&mut *conn)
            .await?;
            sqlx::query(
                "UPDATE receiver_task_views SET updated_at = UTC_TIMESTAMP(6), \
                 created_at = IF(applied_events = 1, UTC_TIMESTAMP(6), created_at) \
                 WHERE consumer_name = ? AND queue_id = ? AND task_id = ? AND last_event_id = ?",
            )
            .bind(consumer)
            .bind(e.queue().as_str())
            .bind(e.task().as_str())
            .bind(e.id().as_str())
            .execute(&mut *conn)
            .await?;
            SESSION_SET.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
    }
}

/// Where `consume` reads its configuration in this build: the process environment, but for
/// [`Mutant::LenientConfig`] a `RECEIVER_NAME` outside its grammar reads as unset (so the
/// default name is used instead of a refusal).
#[derive(Debug)]
pub struct MutantEnv;

impl receiver::config::Source for MutantEnv {
    fn get(&self, name: &str) -> Option<String> {
        let value = receiver::config::ProcessEnv.get(name);
        if is(Mutant::LenientConfig) && name == "RECEIVER_NAME" {
            return value.filter(|v| result_inbox::ConsumerName::new(v.clone()).is_ok());
        }
        value
    }
}

/// The event [`Mutant::NoEventQueueCheck`] applies instead of `raw`: `raw` naming `queue`
/// (`None` when `raw` is not a JSON object). Numbers are left as text (`RawValue`).
fn with_queue(raw: &str, queue: &str) -> Option<String> {
    with_member(raw, "queue_id", serde_json::Value::from(queue).to_string())
}

/// `raw` with member `name` set to the JSON text `value` (`None` when `raw` is not a JSON
/// object). Other members are left as text (`RawValue`).
fn with_member(raw: &str, name: &str, value: String) -> Option<String> {
    let mut event: std::collections::BTreeMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_str(raw).ok()?;
    event.insert(
        name.into(),
        serde_json::value::RawValue::from_string(value).ok()?,
    );
    serde_json::to_string(&event).ok()
}

/// The event [`Mutant::LenientVersions`] applies instead of `raw`: its task version written
/// with a fraction or an exponent replaced by the whole number it equals (`None` when it has
/// none such).
fn whole_version(raw: &str) -> Option<String> {
    let event: std::collections::BTreeMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_str(raw).ok()?;
    let text = event.get("task_version")?.get();
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: f64 = text.parse().ok()?;
    (value >= 1.0 && value.fract() == 0.0 && value < 1e15)
        .then(|| with_member(raw, "task_version", (value as u64).to_string()))
        .flatten()
}

/// The event [`Mutant::FloatNumbers`] applies instead of `raw`: every number of its result
/// through an `f64` (`None` when `raw` is not a JSON object with a result).
fn through_f64_event(raw: &str) -> Option<String> {
    let mut event: serde_json::Value = serde_json::from_str(raw).ok()?;
    let result = event.get_mut("result")?;
    *result = through_f64(result.take());
    Some(event.to_string())
}

fn through_f64(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Number(n), Value::Number),
        Value::Array(items) => Value::Array(items.into_iter().map(through_f64).collect()),
        Value::Object(members) => Value::Object(
            members
                .into_iter()
                .map(|(k, v)| (k, through_f64(v)))
                .collect(),
        ),
        other => other,
    }
}

/// [`Mutant::ForgetsLostAcks`]: an ACK written on an earlier connection is never written
/// again, so an ACK whose answer was lost is dropped instead of sent again with the same proof
/// after the reconnect. A later attempt's ACK, with its new proof, goes out.
#[derive(Debug, Default)]
pub struct ForgetsLostAcks {
    state: std::sync::Mutex<Written>,
}

/// The connection now open (counted from 1), and every ACK written with the connection it went
/// out on.
#[derive(Debug, Default)]
struct Written {
    connection: u64,
    acks: Vec<(orbit_sdk::DeliveryId, orbit_sdk::wire::LeaseProof, u64)>,
}

impl orbit_sdk::seam::LinkLayer for ForgetsLostAcks {
    fn connected(&self) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .connection += 1;
    }

    fn sending(&self, text: &str) -> bool {
        let Some((delivery, proof)) = frames::ack(text) else {
            return true;
        };
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = state.connection;
        let earlier = state
            .acks
            .iter()
            .any(|(d, p, on)| *d == delivery && *p == proof && *on < now);
        if !earlier {
            state.acks.push((delivery, proof, now));
        }
        !earlier
    }
}

/// [`Mutant::CreditOnReceipt`]: a credit for every delivery as it arrives, as well as the
/// program's own when it finishes.
#[derive(Debug)]
pub struct CreditOnReceipt;

impl orbit_sdk::seam::LinkLayer for CreditOnReceipt {
    fn received(&self, text: &str) -> Vec<String> {
        if frames::is_delivery(text) {
            vec![frames::credit(1)]
        } else {
            Vec::new()
        }
    }
}

/// [`Mutant::PrintsRefusedProof`]: the proof of every ACK written, by delivery, so that the line
/// for a refused ACK can quote it.
#[derive(Debug, Default)]
pub struct PrintsRefusedProof {
    sent: std::sync::Mutex<std::collections::HashMap<orbit_sdk::DeliveryId, String>>,
}

impl orbit_sdk::seam::LinkLayer for PrintsRefusedProof {
    fn sending(&self, text: &str) -> bool {
        if let Some((delivery, proof)) = frames::ack(text) {
            self.sent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(delivery, proof.expose().to_owned());
        }
        true
    }

    fn received(&self, text: &str) -> Vec<String> {
        if let Some(delivery) = frames::refused(text) {
            let sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(proof) = sent.get(&delivery) {
                eprintln!(
                    "receiver-mutant: ACK of delivery {delivery} refused; its proof was {proof}"
                );
            }
        }
        Vec::new()
    }
}

/// [`Mutant::CancelsOnStreamDrop`]'s record: the stream connection open now (counted from 1),
/// and the connection each event's delivery arrived on.
static EPOCHS: std::sync::Mutex<(u64, EventEpochs)> =
    std::sync::Mutex::new((0, std::collections::BTreeMap::new()));

type EventEpochs = std::collections::BTreeMap<String, u64>;

/// [`Mutant::CancelsOnStreamDrop`]'s layer: counts the stream's connections and notes which
/// one each delivery arrived on ([`EPOCHS`]).
#[derive(Debug)]
pub struct StreamEpochs;

impl orbit_sdk::seam::LinkLayer for StreamEpochs {
    fn connected(&self) {
        EPOCHS.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
    }

    fn received(&self, text: &str) -> Vec<String> {
        if let Some(id) = frames::delivered_event_id(text) {
            let mut epochs = EPOCHS.lock().unwrap_or_else(|p| p.into_inner());
            let now = epochs.0;
            epochs.1.insert(id, now);
        }
        Vec::new()
    }
}

/// [`Mutant::CreditPerSubscription`]: the credit granted on the first connection is taken as
/// the subscription's for good; later connections are sent none.
#[derive(Debug, Default)]
pub struct CreditPerSubscription {
    connections: std::sync::atomic::AtomicU64,
}

impl orbit_sdk::seam::LinkLayer for CreditPerSubscription {
    fn connected(&self) {
        self.connections
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn sending(&self, text: &str) -> bool {
        !(frames::is_credit(text) && self.connections.load(std::sync::atomic::Ordering::SeqCst) > 1)
    }
}
