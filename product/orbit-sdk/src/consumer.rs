//! `EventConsumer`: receive a subscription's deliveries over the WebSocket stream, run an async
//! handler per delivery, and ACK with that delivery's lease proof only when the handler
//! succeeded.
//!
//! - At most `concurrency` handlers run at once, and at most `prefetch` more deliveries wait
//!   for a free slot: the consumer grants the platform that much credit ahead, and returns it
//!   in batches (half the prefetch at a time, one by one without prefetch) as handlers finish,
//!   so a slot that frees takes the next delivery at once instead of waiting a round trip.
//!   While a [`CreditGate`] is held, no credit goes back, so the platform sends nothing new
//!   (the receiver holds it while its database is down), no waiting delivery starts, and each
//!   is released: handed back with a `release` message, so its lease ends now and its attempt
//!   is not counted. Releasing the gate grants the credit owed.
//! - A handler error means no ACK: the lease runs out and the platform delivers again. A
//!   handler that panics is a handler error too (its credit comes back; the panic's message
//!   is not repeated, since it may quote the event). A handler error that is a [`Release`],
//!   returned while the [`CreditGate`] is held, hands the delivery back at once instead: the
//!   handler could not do its work for a reason a wait cures (the receiver's database is
//!   down), so its attempt is not counted. With the gate open it is an ordinary failure, so
//!   that a handler cannot release one delivery over and over without spending its budget.
//! - An ACK without an answer stays pending with its ORIGINAL proof and is sent again after
//!   every reconnect until the platform answers it (acked, already acked, or refused because
//!   the lease was superseded).
//! - The connection is re-established with capped exponential backoff and jitter; a connect
//!   that takes longer than [`EventConsumer::connect_timeout`] is abandoned; a silent
//!   connection (no message for three heartbeat periods) or an ACK unanswered for
//!   [`EventConsumer::ack_timeout`] counts as broken. Those clocks count only time in which
//!   the consumer could read: after the process was stopped (SIGSTOP, a suspended machine),
//!   what waits in the stream is read first and the clocks start again, so a working stream
//!   and the deliveries in it are not dropped for a pause of the consumer's own.
//! - [`Running::shutdown`] cancels in-flight handlers (their deliveries are not ACKed), hands
//!   back the waiting deliveries and those still on the wire (until the stream has been quiet
//!   for 250 ms, at most 2 s), and returns within its deadline.
//!
//! The consumer never prints a token or a proof, and it knows nothing of what the handler does.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::value::RawValue;
use tokio::sync::{broadcast, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::client::Client;
pub use crate::link::StreamError;
use crate::link::{Connector, Link, WsConnector};
use orbit_wire::{AckResult, ClientMessage, LeaseProof, ServerMessage};
use orbit_wire::{DeliveryId, SubscriptionId};

/// How often the consumer sends a heartbeat; three periods of silence break the connection.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// A heartbeat tick that comes this much after it was due means the stream's loop could not
/// run for that long: nothing is judged by clocks that ran on while it could not read.
const LATE_TICK: Duration = Duration::from_secs(1);

/// How long opening the stream (TCP, TLS, WebSocket handshake) may take by default.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Holds back the credit of finished handlers while held, so that the platform sends no new
/// delivery; [`CreditGate::release`] grants what is owed. Cloning gives another handle on the
/// same gate. A consumer without a gate never holds.
#[derive(Debug, Clone)]
pub struct CreditGate(Arc<watch::Sender<bool>>);

impl Default for CreditGate {
    fn default() -> Self {
        CreditGate::new()
    }
}

impl CreditGate {
    /// An open gate.
    pub fn new() -> CreditGate {
        CreditGate(Arc::new(watch::channel(false).0))
    }

    /// From now on, no credit is returned to the platform.
    pub fn hold(&self) {
        self.0.send_replace(true);
    }

    /// Credit flows again, starting with what was kept back.
    pub fn release(&self) {
        self.0.send_replace(false);
    }

    /// Whether credit is being held back.
    pub fn is_held(&self) -> bool {
        *self.0.borrow()
    }

    fn watch(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }
}

/// One delivery, as a handler sees it. The lease proof stays inside the consumer.
pub struct Delivery {
    pub delivery_id: DeliveryId,
    /// 1 for the first lease of this delivery, 2 after one expiry, …
    pub attempt: u32,
    pub lease_expires_at: String,
    event: Box<RawValue>,
    received: Instant,
}

impl Delivery {
    /// The event's JSON exactly as the platform sent it.
    pub fn event_json(&self) -> &str {
        self.event.get()
    }

    /// When the consumer read the delivery off the stream: its lease began no later. A
    /// delivery may wait here for a handler slot, so a deadline derived from the lease counts
    /// from this instant, not from the handler's start.
    pub fn received_at(&self) -> Instant {
        self.received
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("delivery_id", &self.delivery_id)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

/// What the consumer reports while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumerEvent {
    /// The stream is open.
    Connected,
    /// The stream broke; the consumer reconnects after `retry_in`.
    Disconnected {
        reason: StreamError,
        retry_in: Duration,
    },
    /// The platform answered an ACK.
    Ack {
        delivery_id: DeliveryId,
        result: AckResult,
        reason: Option<String>,
    },
    /// A handler failed: no ACK; the platform will deliver again after the lease, or, for a
    /// [`Release`] honoured while the gate was held, once credit flows again.
    HandlerFailed {
        delivery_id: DeliveryId,
        error: HandlerError,
    },
}

/// A consumer of one subscription, not yet started.
#[derive(Debug, Clone)]
pub struct EventConsumer {
    client: Client,
    subscription: SubscriptionId,
    concurrency: usize,
    prefetch: usize,
    backoff_initial: Duration,
    backoff_max: Duration,
    ack_timeout: Duration,
    connect_timeout: Duration,
    gate: CreditGate,
}

/// A started consumer.
#[derive(Debug)]
pub struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<Summary>,
    events: broadcast::Sender<ConsumerEvent>,
}

/// What a consumer left behind when it stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Handlers still running when it stopped (cancelled; their deliveries were not ACKed).
    pub cancelled_handlers: usize,
    /// ACKs sent but never answered.
    pub unanswered_acks: usize,
    /// Deliveries received and never started, handed back to the platform as it stopped.
    pub released: usize,
}

impl EventConsumer {
    /// A consumer of `subscription` with concurrency 4 and no prefetch.
    pub fn new(client: Client, subscription: impl Into<SubscriptionId>) -> EventConsumer {
        EventConsumer {
            client,
            subscription: subscription.into(),
            concurrency: 4,
            prefetch: 0,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(10),
            connect_timeout: CONNECT_TIMEOUT,
            gate: CreditGate::new(),
        }
    }

    /// How many deliveries may be handled at once (at least 1).
    pub fn concurrency(mut self, n: usize) -> EventConsumer {
        self.concurrency = n.max(1);
        self
    }

    /// How many deliveries may wait for a handler slot, leased ahead (0 by default: each
    /// delivery is leased only once a slot is free). Prefetch keeps the slots busy while the
    /// platform's round trip for the next delivery is under way; each waiting delivery's lease
    /// runs meanwhile ([`Delivery::received_at`]).
    pub fn prefetch(mut self, n: usize) -> EventConsumer {
        self.prefetch = n;
        self
    }

    /// Reconnect backoff: first delay and cap (jitter of ±50% is added).
    pub fn backoff(mut self, initial: Duration, max: Duration) -> EventConsumer {
        self.backoff_initial = initial;
        self.backoff_max = max.max(initial);
        self
    }

    /// How long an ACK may go unanswered before the connection counts as broken.
    pub fn ack_timeout(mut self, timeout: Duration) -> EventConsumer {
        self.ack_timeout = timeout;
        self
    }

    /// How long opening the stream may take before it counts as a failed attempt.
    pub fn connect_timeout(mut self, timeout: Duration) -> EventConsumer {
        self.connect_timeout = timeout;
        self
    }

    /// Returns finished handlers' credit only while `gate` is open.
    pub fn credit_gate(mut self, gate: CreditGate) -> EventConsumer {
        self.gate = gate;
        self
    }

    /// Starts consuming; `handler` runs once per delivery. Its error comes back, as its own
    /// type, in [`ConsumerEvent::HandlerFailed`] ([`HandlerError::downcast_ref`]).
    pub fn start<H, F, E>(self, handler: H) -> Running
    where
        H: Fn(Delivery) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let (stop, stop_rx) = watch::channel(false);
        let (events, _) = broadcast::channel(1024);
        let handler = Arc::new(move |d: Delivery| {
            let fut = handler(d);
            async move { fut.await.map_err(HandlerError::failed) }
        });
        let connector = crate::seam::connector(WsConnector::new(
            &self.client,
            &format!("/v1/subscriptions/{}/stream", self.subscription),
            self.connect_timeout,
        ));
        let task = tokio::spawn(run(self, connector, handler, stop_rx, events.clone()));
        Running { stop, task, events }
    }
}

impl Running {
    /// Everything the consumer reports from now on.
    pub fn events(&self) -> broadcast::Receiver<ConsumerEvent> {
        self.events.subscribe()
    }

    /// Stops: cancels in-flight handlers, closes the stream, and returns within `deadline`.
    pub async fn shutdown(self, deadline: Duration) -> Summary {
        let _ = self.stop.send(true);
        let mut task = self.task;
        match tokio::time::timeout(deadline, &mut task).await {
            Ok(Ok(summary)) => summary,
            _ => {
                task.abort();
                Summary::default()
            }
        }
    }
}

/// Capped exponential backoff with jitter between connection attempts, and what the consumer
/// says about each.
struct Reconnect(backoff::Backoff);

impl Reconnect {
    fn reset(&mut self) {
        self.0.reset();
    }

    /// Reports the disconnection and waits; false if a stop came first.
    async fn wait(
        &mut self,
        reason: StreamError,
        events: &broadcast::Sender<ConsumerEvent>,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let wait = self.0.next_wait();
        let _ = events.send(ConsumerEvent::Disconnected {
            reason,
            retry_in: wait,
        });
        tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = stop.changed() => false,
        }
    }
}

type Handler = Arc<
    dyn Fn(Delivery) -> std::pin::Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>
        + Send
        + Sync,
>;

/// Why a handler did not succeed, so that its delivery was not ACKed: the handler's own error,
/// kept as its type, or a panic (whose message is not repeated).
#[derive(Debug, Clone, thiserror::Error)]
pub enum HandlerError {
    #[error("{0}")]
    Failed(Arc<dyn std::error::Error + Send + Sync>),
    #[error("the handler panicked")]
    Panicked,
}

impl HandlerError {
    fn failed(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> HandlerError {
        HandlerError::Failed(Arc::from(e.into()))
    }

    /// The handler's error as `E`, when it is one (or a [`Release`] of one).
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            HandlerError::Failed(e) => e.downcast_ref().or_else(|| {
                e.downcast_ref::<Release>()
                    .and_then(|r| r.0.downcast_ref::<E>())
            }),
            HandlerError::Panicked => None,
        }
    }

    /// Whether the handler asked for its delivery to be handed back ([`Release`]).
    pub fn is_release(&self) -> bool {
        matches!(self, HandlerError::Failed(e) if e.is::<Release>())
    }
}

/// A handler's error asking for its delivery to be handed back to the platform now, its
/// attempt not counted, instead of left to run out its lease: the handler did nothing that
/// needs the lease (no COMMIT whose outcome is unknown), and a wait, not a redelivery, cures
/// what stopped it. Honoured only while the consumer's [`CreditGate`] is held (nothing new
/// comes until it opens); otherwise it is an ordinary failure. The reason is kept: it comes
/// back in [`ConsumerEvent::HandlerFailed`], and [`HandlerError::downcast_ref`] reaches it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Release(pub Box<dyn std::error::Error + Send + Sync>);

/// The same failure: both panics, or the very same error value.
impl PartialEq for HandlerError {
    fn eq(&self, other: &HandlerError) -> bool {
        match (self, other) {
            (HandlerError::Failed(a), HandlerError::Failed(b)) => Arc::ptr_eq(a, b),
            (HandlerError::Panicked, HandlerError::Panicked) => true,
            _ => false,
        }
    }
}

impl Eq for HandlerError {}

/// Credit for the platform: what is owed to it (finished or released deliveries whose credit
/// has not gone back yet), given in batches.
struct Credit {
    owed: u32,
    /// The least worth a frame while the gate is open (1 without prefetch).
    batch: u32,
}

impl Credit {
    /// Owes `n` more; what to grant now, if anything: nothing while `held`, nothing below a
    /// batch unless `now`.
    fn give(&mut self, n: u32, held: bool, now: bool) -> Option<u32> {
        self.owed += n;
        if held || self.owed == 0 || (self.owed < self.batch && !now) {
            return None;
        }
        Some(std::mem::take(&mut self.owed))
    }
}

/// Deliveries received and not started: each with its proof, oldest first.
type Waiting = std::collections::VecDeque<(Delivery, LeaseProof)>;

/// A handler's task: the delivery's id and proof, and how the handler ended.
type InFlight = JoinSet<(DeliveryId, LeaseProof, Result<(), HandlerError>)>;

/// Starts waiting deliveries while there is a free slot.
fn start_waiting(waiting: &mut Waiting, in_flight: &mut InFlight, handler: &Handler, slots: usize) {
    while in_flight.len() < slots {
        let Some((delivery, proof)) = waiting.pop_front() else {
            return;
        };
        let handler = handler.clone();
        let delivery_id = delivery.delivery_id.clone();
        in_flight.spawn(async move {
            let result = AssertUnwindSafe(handler(delivery))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| Err(HandlerError::Panicked));
            (delivery_id, proof, result)
        });
    }
}

/// Hands every waiting delivery back to the platform; how many. A release that cannot be
/// sent is left to its lease.
async fn release_waiting<L: Link>(waiting: &mut Waiting, link: &mut L) -> usize {
    let n = waiting.len();
    for (d, proof) in waiting.drain(..) {
        let m = ClientMessage::Release {
            delivery_id: d.delivery_id,
            proof,
        };
        if send(link, &m).await.is_err() {
            break;
        }
    }
    n
}

/// At a stop, deliveries the platform sent against credit given earlier may still be on the
/// wire: each that arrives before the connection has been quiet for [`STOP_QUIET`] (and at
/// most for [`STOP_DRAIN`]) is handed back at once, so that its lease ends now instead of
/// running out and costing an attempt. Any other message is dropped: the process is leaving.
async fn release_arriving<L: Link>(link: &mut L) -> usize {
    let until = Instant::now() + STOP_DRAIN;
    let mut released = 0;
    loop {
        let quiet = STOP_QUIET.min(until.saturating_duration_since(Instant::now()));
        let Ok(Ok(Some(text))) = tokio::time::timeout(quiet, link.recv()).await else {
            return released;
        };
        if let Ok(ServerMessage::Delivery {
            delivery_id, proof, ..
        }) = ServerMessage::from_json(&text)
        {
            if send(link, &ClientMessage::Release { delivery_id, proof })
                .await
                .is_err()
            {
                return released;
            }
            released += 1;
        }
    }
}

/// How long the stream must be quiet at a stop before it is closed (see [`release_arriving`]).
const STOP_QUIET: Duration = Duration::from_millis(250);
/// The most a stop waits for deliveries already on the wire.
const STOP_DRAIN: Duration = Duration::from_secs(2);

async fn run<C, H, F>(
    config: EventConsumer,
    mut connector: C,
    handler: Arc<H>,
    mut stop: watch::Receiver<bool>,
    events: broadcast::Sender<ConsumerEvent>,
) -> Summary
where
    C: Connector,
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let handler: Handler = Arc::new(move |d| Box::pin(handler(d)));
    let slots = config.concurrency;
    let window = slots + config.prefetch;
    let mut in_flight: InFlight = JoinSet::new();
    let mut waiting: Waiting = Waiting::new();
    let mut released = 0;
    // ACKs sent and not yet answered: delivery id → the ORIGINAL proof.
    let mut pending: HashMap<DeliveryId, (LeaseProof, Instant)> = HashMap::new();
    let mut gate = config.gate.watch();
    let mut credit = Credit {
        owed: 0,
        batch: (config.prefetch as u32 / 2).max(1),
    };
    // Jittered from half to one and a half of each step, so that consumers cut off together
    // spread their reconnects on both sides of it.
    let mut backoff = Reconnect(
        backoff::Backoff::new(config.backoff_initial, config.backoff_max).jitter(0.5, 1.5),
    );

    'connect: loop {
        if *stop.borrow() {
            break;
        }
        let connected = tokio::select! {
            c = connector.connect() => c,
            _ = stop.changed() => break 'connect,
        };
        let mut link = match connected {
            Ok(link) => link,
            Err(reason) => {
                if backoff.wait(reason, &events, &mut stop).await {
                    continue 'connect;
                }
                break 'connect;
            }
        };
        backoff.reset();
        let _ = events.send(ConsumerEvent::Connected);

        // A new stream starts with no credit: what is not running or waiting is owed to it.
        let mut outgoing = Vec::new();
        credit.owed = 0;
        let free = window.saturating_sub(in_flight.len() + waiting.len()) as u32;
        let held = *gate.borrow();
        if let Some(n) = credit.give(free, held, true) {
            outgoing.push(ClientMessage::Credit { credit: n });
        }
        for (id, (proof, sent)) in pending.iter_mut() {
            *sent = Instant::now();
            outgoing.push(ClientMessage::Ack {
                delivery_id: id.clone(),
                proof: proof.clone(),
            });
        }
        let mut broken = None;
        for m in outgoing {
            if let Err(e) = send(&mut link, &m).await {
                broken = Some(e);
                break;
            }
        }

        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        let mut last_heard = Instant::now();
        while broken.is_none() {
            tokio::select! {
                // In this order, not at random: after the process was stopped (SIGSTOP, a
                // suspended VM) its timers and its socket turn ready together, and what the
                // platform sent meanwhile (ACK answers, deliveries) must be read before the
                // heartbeat judges the stream by clocks that ran on while nothing could read.
                biased;
                _ = stop.changed() => {
                    // Handlers that have already finished are ACKed first: their work is
                    // done (committed, for a receiver), and an ACK left unsent costs their
                    // delivery a lease. The answers are not waited for.
                    while let Some(done) = in_flight.try_join_next() {
                        if let Ok((delivery_id, proof, Ok(()))) = done {
                            pending.insert(delivery_id.clone(), (proof.clone(), Instant::now()));
                            if send(&mut link, &ClientMessage::Ack { delivery_id, proof }).await.is_err() {
                                break;
                            }
                        }
                    }
                    // The rest are cancelled first: a handler that ended during the drain
                    // below would never be ACKed (nothing collects it any more), and cost an
                    // attempt.
                    in_flight.abort_all();
                    released += release_waiting(&mut waiting, &mut link).await;
                    released += release_arriving(&mut link).await;
                    link.close().await;
                    break 'connect;
                }
                msg = link.recv() => {
                    last_heard = Instant::now();
                    let text = match msg {
                        Ok(Some(t)) => t,
                        Ok(None) => { broken = Some(StreamError::Closed); continue }
                        Err(e) => { broken = Some(e); continue }
                    };
                    match ServerMessage::from_json(&text) {
                        Ok(ServerMessage::Delivery { delivery_id, attempt, proof, lease_expires_at, event }) => {
                            let received = Instant::now();
                            let delivery = Delivery { delivery_id, attempt, lease_expires_at, event, received };
                            waiting.push_back((delivery, proof));
                            if *gate.borrow() {
                                // Nothing new starts while held: it goes back at once.
                                let n = release_waiting(&mut waiting, &mut link).await as u32;
                                credit.give(n, true, false);
                            } else {
                                start_waiting(&mut waiting, &mut in_flight, &handler, slots);
                            }
                        }
                        Ok(ServerMessage::AckResult { delivery_id, result, reason }) => {
                            pending.remove(&delivery_id);
                            let _ = events.send(ConsumerEvent::Ack { delivery_id, result, reason });
                        }
                        Ok(ServerMessage::Heartbeat) => {}
                        Err(e) => broken = Some(StreamError::Message(e)),
                    }
                }
                Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                    // Handlers that finished together: an ACK each, then the waiting
                    // deliveries take their slots, then one credit frame if a batch is owed.
                    let mut finished = vec![done];
                    while let Some(more) = in_flight.try_join_next() {
                        finished.push(more);
                    }
                    let held = *gate.borrow();
                    if !held {
                        start_waiting(&mut waiting, &mut in_flight, &handler, slots);
                    }
                    let mut freed = 0;
                    for done in finished {
                        // Handlers catch their panics; an error here is a cancelled task.
                        let Ok((delivery_id, proof, result)) = done else { continue };
                        freed += 1;
                        match result {
                            Ok(()) => {
                                // Kept until answered, and sent again after a reconnect.
                                pending.insert(delivery_id.clone(), (proof.clone(), Instant::now()));
                                if broken.is_some() {
                                    continue;
                                }
                                if let Err(e) = send(&mut link, &ClientMessage::Ack { delivery_id, proof }).await {
                                    broken = Some(e);
                                    continue;
                                }
                            }
                            Err(error) => {
                                if error.is_release() && held && broken.is_none() {
                                    let m = ClientMessage::Release { delivery_id: delivery_id.clone(), proof };
                                    if let Err(e) = send(&mut link, &m).await {
                                        broken = Some(e);
                                    }
                                }
                                let _ = events.send(ConsumerEvent::HandlerFailed { delivery_id, error });
                            }
                        }
                    }
                    if broken.is_some() {
                        continue;
                    }
                    if let Some(n) = credit.give(freed, held, false) {
                        if let Err(e) = send(&mut link, &ClientMessage::Credit { credit: n }).await {
                            broken = Some(e);
                        }
                    }
                }
                Ok(()) = gate.changed() => {
                    let held = *gate.borrow_and_update();
                    if held {
                        let n = release_waiting(&mut waiting, &mut link).await as u32;
                        credit.give(n, true, false);
                    } else {
                        start_waiting(&mut waiting, &mut in_flight, &handler, slots);
                        if let Some(n) = credit.give(0, false, true) {
                            if let Err(e) = send(&mut link, &ClientMessage::Credit { credit: n }).await {
                                broken = Some(e);
                            }
                        }
                    }
                }
                due = heartbeat.tick() => {
                    if due.elapsed() > LATE_TICK {
                        // The loop could not run (the process was stopped, or starved): what
                        // the platform sent meanwhile may not have been read yet, so the
                        // silence and the ACKs are timed again from now.
                        let now = Instant::now();
                        last_heard = now;
                        pending.values_mut().for_each(|(_, sent)| *sent = now);
                    }
                    if last_heard.elapsed() > HEARTBEAT * 3 {
                        broken = Some(StreamError::Silent);
                    } else if pending.values().any(|(_, sent)| sent.elapsed() > config.ack_timeout) {
                        broken = Some(StreamError::AckUnanswered);
                    } else if let Err(e) = send(&mut link, &ClientMessage::Heartbeat).await {
                        broken = Some(e);
                    }
                }
            }
        }
        if !backoff
            .wait(broken.unwrap_or(StreamError::Closed), &events, &mut stop)
            .await
        {
            break 'connect;
        }
    }
    let summary = Summary {
        cancelled_handlers: in_flight.len(),
        unanswered_acks: pending.len(),
        released,
    };
    in_flight.abort_all();
    summary
}

async fn send<L: Link>(link: &mut L, m: &ClientMessage) -> Result<(), StreamError> {
    let text = serde_json::to_string(m).map_err(|e| StreamError::Transport(e.to_string()))?;
    link.send(text).await
}

/// The consumer's loop over in-memory links, with tokio's clock paused: time moves only when
/// every task waits, so timeouts and heartbeats are exact and instant.
#[cfg(test)]
mod tests {
    use super::*;
    use orbit_wire::Token;
    use tokio::sync::mpsc;

    /// The platform's end of one link.
    struct Peer {
        from_client: mpsc::UnboundedReceiver<String>,
        to_client: mpsc::UnboundedSender<Result<Option<String>, StreamError>>,
        frozen_until: Frozen,
    }

    /// Until when the client's reads see nothing: a process stopped by SIGSTOP, whose timers
    /// and socket turn ready at the same moment when it runs again.
    type Frozen = Arc<std::sync::Mutex<Option<tokio::time::Instant>>>;

    impl Peer {
        /// The next message the client sent, parsed.
        async fn next(&mut self) -> ClientMessage {
            let text = self
                .from_client
                .recv()
                .await
                .expect("the client is connected");
            serde_json::from_str(&text).expect("a client message")
        }

        /// The next message that is not a heartbeat.
        async fn next_not_heartbeat(&mut self) -> ClientMessage {
            loop {
                match self.next().await {
                    ClientMessage::Heartbeat => continue,
                    m => return m,
                }
            }
        }

        /// Nothing the platform sends is read for `d`, as if the client's process were stopped.
        fn freeze(&self, d: Duration) {
            *self.frozen_until.lock().unwrap() = Some(tokio::time::Instant::now() + d);
        }

        fn deliver(&self, id: &str) {
            let text = format!(
                r#"{{"type":"delivery","delivery_id":"{id}","attempt":1,"proof":"p-{id}","lease_expires_at":"2026-12-03T00:00:30Z","event":{{"id":"{id}"}}}}"#
            );
            self.to_client.send(Ok(Some(text))).unwrap();
        }
    }

    struct ChannelLink {
        to_peer: mpsc::UnboundedSender<String>,
        from_peer: mpsc::UnboundedReceiver<Result<Option<String>, StreamError>>,
        frozen_until: Frozen,
    }

    impl Link for ChannelLink {
        async fn send(&mut self, text: String) -> Result<(), StreamError> {
            self.to_peer
                .send(text)
                .map_err(|_| StreamError::Transport("peer gone".to_owned()))
        }
        async fn recv(&mut self) -> Result<Option<String>, StreamError> {
            let frozen = *self.frozen_until.lock().unwrap();
            if let Some(until) = frozen {
                tokio::time::sleep_until(until).await;
            }
            self.from_peer.recv().await.unwrap_or(Ok(None))
        }
        async fn close(&mut self) {}
    }

    /// Hands out one link per `Peer` the test asks for; a connect with no link waiting
    /// blocks (as a server that never answers the handshake would) until its timeout.
    struct ChannelConnector {
        links: mpsc::UnboundedReceiver<ChannelLink>,
        timeout: Duration,
    }

    impl Connector for ChannelConnector {
        type Link = ChannelLink;
        async fn connect(&mut self) -> Result<ChannelLink, StreamError> {
            match tokio::time::timeout(self.timeout, self.links.recv()).await {
                Ok(Some(link)) => Ok(link),
                Ok(None) => Err(StreamError::Connect("no more links".to_owned())),
                Err(_) => Err(StreamError::ConnectTimeout(self.timeout)),
            }
        }
    }

    struct Harness {
        links: mpsc::UnboundedSender<ChannelLink>,
        events: broadcast::Receiver<ConsumerEvent>,
        stop: watch::Sender<bool>,
        task: JoinHandle<Summary>,
    }

    impl Harness {
        fn start<H, F>(concurrency: usize, gate: CreditGate, handler: H) -> Harness
        where
            H: Fn(Delivery) -> F + Send + Sync + 'static,
            F: Future<Output = Result<(), String>> + Send + 'static,
        {
            Harness::prefetching(concurrency, 0, gate, handler)
        }

        fn prefetching<H, F>(
            concurrency: usize,
            prefetch: usize,
            gate: CreditGate,
            handler: H,
        ) -> Harness
        where
            H: Fn(Delivery) -> F + Send + Sync + 'static,
            F: Future<Output = Result<(), String>> + Send + 'static,
        {
            Harness::failing_with(concurrency, prefetch, gate, move |d: Delivery| {
                let fut = handler(d);
                async move { fut.await.map_err(HandlerError::failed) }
            })
        }

        /// A harness whose handler fails with the error it chooses.
        fn failing_with<H, F>(
            concurrency: usize,
            prefetch: usize,
            gate: CreditGate,
            handler: H,
        ) -> Harness
        where
            H: Fn(Delivery) -> F + Send + Sync + 'static,
            F: Future<Output = Result<(), HandlerError>> + Send + 'static,
        {
            let client = Client::new("http://127.0.0.1:9", Token::new("t")).unwrap();
            let config = EventConsumer::new(client, SubscriptionId::new("s").unwrap())
                .concurrency(concurrency)
                .prefetch(prefetch)
                .credit_gate(gate);
            let (links, rx) = mpsc::unbounded_channel();
            let connector = ChannelConnector {
                links: rx,
                timeout: config.connect_timeout,
            };
            let (stop, stop_rx) = watch::channel(false);
            let (events_tx, events) = broadcast::channel(64);
            let task = tokio::spawn(run(
                config,
                connector,
                Arc::new(handler),
                stop_rx,
                events_tx,
            ));
            Harness {
                links,
                events,
                stop,
                task,
            }
        }

        fn peer(&self) -> Peer {
            let (to_peer, from_client) = mpsc::unbounded_channel();
            let (to_client, from_peer) = mpsc::unbounded_channel();
            let frozen_until = Frozen::default();
            self.links
                .send(ChannelLink {
                    to_peer,
                    from_peer,
                    frozen_until: frozen_until.clone(),
                })
                .unwrap();
            Peer {
                from_client,
                to_client,
                frozen_until,
            }
        }

        async fn next_event(&mut self) -> ConsumerEvent {
            self.events.recv().await.unwrap()
        }

        async fn stop(self) -> Summary {
            self.stop.send(true).unwrap();
            self.task.await.unwrap()
        }
    }

    /// Everything the client sent so far was a heartbeat.
    fn only_heartbeats(peer: &mut Peer) {
        while let Ok(text) = peer.from_client.try_recv() {
            let m: ClientMessage = serde_json::from_str(&text).unwrap();
            assert!(
                matches!(m, ClientMessage::Heartbeat),
                "sent {m:?} while held"
            );
        }
    }

    fn credit(m: ClientMessage) -> u32 {
        match m {
            ClientMessage::Credit { credit } => credit,
            other => panic!("wanted credit, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_handler_is_a_failure_and_its_credit_comes_back() {
        let mut h = Harness::start(2, CreditGate::new(), |d: Delivery| async move {
            if d.delivery_id == "boom" {
                panic!("handler bug");
            }
            Ok(())
        });
        let mut peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        assert_eq!(credit(peer.next().await), 2);
        peer.deliver("boom");
        assert_eq!(
            h.next_event().await,
            ConsumerEvent::HandlerFailed {
                delivery_id: DeliveryId::new("boom").unwrap(),
                error: HandlerError::Panicked
            }
        );
        assert_eq!(
            credit(peer.next_not_heartbeat().await),
            1,
            "the slot is free again"
        );
        // And the consumer still works: the next delivery is handled and ACKed.
        peer.deliver("fine");
        match peer.next_not_heartbeat().await {
            ClientMessage::Ack { delivery_id, .. } => assert_eq!(delivery_id, "fine"),
            other => panic!("wanted an ACK, got {other:?}"),
        }
        assert_eq!(h.stop().await.cancelled_handlers, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_gate_keeps_credit_back_and_releases_what_arrives_until_it_is_released() {
        let gate = CreditGate::new();
        let mut h = Harness::start(2, gate.clone(), |_| async { Err("no database".to_owned()) });
        let mut peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        assert_eq!(credit(peer.next().await), 2);
        peer.deliver("a");
        assert!(matches!(
            h.next_event().await,
            ConsumerEvent::HandlerFailed { .. }
        ));
        assert_eq!(credit(peer.next_not_heartbeat().await), 1, "a's slot");
        gate.hold();
        // Sent before the platform heard of the hold: handed back, never started.
        peer.deliver("b");
        peer.deliver("c");
        assert_eq!(released(peer.next_not_heartbeat().await), "b");
        assert_eq!(released(peer.next_not_heartbeat().await), "c");
        // 25 s on (short of the silence limit), only heartbeats have been sent.
        tokio::time::sleep(Duration::from_secs(25)).await;
        only_heartbeats(&mut peer);
        assert!(h.events.try_recv().is_err(), "b was started");
        gate.release();
        assert_eq!(credit(peer.next_not_heartbeat().await), 2, "what was owed");
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_failure_is_handed_back_only_while_the_gate_is_held() {
        let gate = CreditGate::new();
        let holder = gate.clone();
        // What the receiver does for "b": hold the gate (its database is down), then ask for
        // the release. For "a" it asks without holding.
        let mut h = Harness::failing_with(1, 0, gate.clone(), move |d| {
            let holder = holder.clone();
            async move {
                if d.delivery_id.as_str() == "b" {
                    holder.hold();
                }
                Err(HandlerError::failed(Release("database down".into())))
            }
        });
        let mut peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        assert_eq!(credit(peer.next().await), 1);
        // The gate is open: an ordinary failure, left to its lease (no release, credit back).
        peer.deliver("a");
        match h.next_event().await {
            ConsumerEvent::HandlerFailed { error, .. } => assert!(error.is_release()),
            other => panic!("wanted a failure, got {other:?}"),
        }
        assert_eq!(
            credit(peer.next_not_heartbeat().await),
            1,
            "a's slot, no release"
        );
        // Held by the handler: handed back with its own proof, and no credit while held.
        peer.deliver("b");
        assert_eq!(released(peer.next_not_heartbeat().await), "b");
        match h.next_event().await {
            ConsumerEvent::HandlerFailed { error, .. } => {
                assert_eq!(error.to_string(), "database down");
            }
            other => panic!("wanted a failure, got {other:?}"),
        }
        gate.release();
        assert_eq!(
            credit(peer.next_not_heartbeat().await),
            1,
            "b's slot, once open"
        );
        h.stop().await;
    }

    fn acked(m: ClientMessage) -> String {
        match m {
            ClientMessage::Ack { delivery_id, .. } => delivery_id.to_string(),
            other => panic!("wanted an ACK, got {other:?}"),
        }
    }

    fn released(m: ClientMessage) -> String {
        match m {
            ClientMessage::Release { delivery_id, proof } => {
                assert_eq!(proof.expose(), format!("p-{delivery_id}"), "its own proof");
                delivery_id.to_string()
            }
            other => panic!("wanted a release, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn prefetched_deliveries_wait_for_a_slot_and_credit_returns_in_batches() {
        // Each handler waits for a permit: `go.add_permits(1)` lets the running one end.
        let go = Arc::new(tokio::sync::Semaphore::new(0));
        let permits = go.clone();
        let mut h = Harness::prefetching(1, 4, CreditGate::new(), move |_| {
            let permits = permits.clone();
            async move {
                permits.acquire().await.expect("never closed").forget();
                Ok(())
            }
        });
        let mut peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        assert_eq!(credit(peer.next().await), 5, "the slot and the prefetch");
        for id in ["a", "b", "c", "d", "e"] {
            peer.deliver(id);
        }
        // One slot: a runs, b to e wait; when a ends, b takes the slot.
        go.add_permits(1);
        assert_eq!(acked(peer.next_not_heartbeat().await), "a");
        go.add_permits(1);
        assert_eq!(acked(peer.next_not_heartbeat().await), "b");
        // a's credit alone was under the batch (half the prefetch): one frame for both.
        assert_eq!(credit(peer.next_not_heartbeat().await), 2, "a batch of two");
        // On stop, the waiting d and e go back, each with its own proof; c, running, is
        // cancelled.
        let summary = h.stop().await;
        let mut back = Vec::new();
        while let Ok(text) = peer.from_client.try_recv() {
            match serde_json::from_str(&text).unwrap() {
                ClientMessage::Heartbeat => {}
                m => back.push(released(m)),
            }
        }
        assert_eq!(back, ["d", "e"]);
        assert_eq!(
            summary,
            Summary {
                cancelled_handlers: 1,
                unanswered_acks: 2,
                released: 2
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_that_arrives_during_the_stop_is_handed_back_not_left_to_its_lease() {
        let mut h = Harness::start(2, CreditGate::new(), |_| async { Ok(()) });
        let mut peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        assert_eq!(credit(peer.next().await), 2);
        h.stop.send(true).unwrap();
        // The stop has begun (the consumer waits for the stream to fall quiet) when a
        // delivery sent against the earlier credit arrives.
        tokio::time::sleep(Duration::from_millis(100)).await;
        peer.deliver("late");
        let summary = h.task.await.unwrap();
        assert_eq!(released(peer.next_not_heartbeat().await), "late");
        assert_eq!(summary.released, 1);
        assert_eq!(summary.cancelled_handlers, 0, "never started");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_cancels_running_handlers_before_it_waits_for_the_stream_to_fall_quiet() {
        // A handler that would end 100 ms into the stop's drain: nothing would ACK it then,
        // so it must not get to finish (its delivery comes back whole, not half-handled).
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = finished.clone();
        let mut h = Harness::start(1, CreditGate::new(), move |_| {
            let flag = flag.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
        });
        let mut peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        assert_eq!(credit(peer.next().await), 1);
        peer.deliver("slow");
        tokio::task::yield_now().await;
        let summary = h.stop().await;
        assert!(!finished.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(summary.cancelled_handlers, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_that_finished_as_the_stop_came_is_acked_not_left_to_its_lease() {
        // The handler itself signals the stop as it ends, so that both are ready when the
        // loop next looks: the stop must not drop the finished handler's ACK.
        let stop: Arc<std::sync::OnceLock<watch::Sender<bool>>> = Arc::default();
        let inside = stop.clone();
        let mut h = Harness::start(1, CreditGate::new(), move |_| {
            let inside = inside.clone();
            async move {
                let _ = inside.get().expect("the stop is in place").send(true);
                Ok(())
            }
        });
        let _ = stop.set(std::mem::replace(&mut h.stop, watch::channel(false).0));
        let mut peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        assert_eq!(credit(peer.next().await), 1);
        peer.deliver("done");
        let summary = (&mut h.task).await.unwrap();
        assert_eq!(acked(peer.next_not_heartbeat().await), "done");
        assert_eq!(summary.cancelled_handlers, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_held_at_connect_grants_nothing_to_the_new_stream() {
        let gate = CreditGate::new();
        gate.hold();
        let mut h = Harness::start(3, gate.clone(), |_| async { Ok(()) });
        let mut peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        tokio::time::sleep(Duration::from_secs(25)).await;
        only_heartbeats(&mut peer);
        gate.release();
        assert_eq!(credit(peer.next_not_heartbeat().await), 3);
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_connect_that_never_completes_times_out_and_is_retried() {
        let mut h = Harness::start(1, CreditGate::new(), |_| async { Ok(()) });
        let started = Instant::now();
        match h.next_event().await {
            ConsumerEvent::Disconnected { reason, .. } => {
                assert_eq!(reason, StreamError::ConnectTimeout(CONNECT_TIMEOUT))
            }
            other => panic!("wanted a failed connect, got {other:?}"),
        }
        assert_eq!(started.elapsed(), CONNECT_TIMEOUT);
        // The next attempt gets a link and connects.
        let mut peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        assert_eq!(credit(peer.next().await), 1);
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_freeze_what_waits_in_the_stream_is_read_before_a_timeout_is_judged() {
        // A process stopped (SIGSTOP) past the ACK timeout wakes up with its timers expired
        // and the platform's answers in its socket. Reading the answers first finds the ACK
        // answered; judging first would break a working stream and lose what waits in it.
        let mut h = Harness::start(1, CreditGate::new(), |_| async { Ok(()) });
        let mut peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        assert_eq!(credit(peer.next().await), 1);
        // select! without an order picks among ready branches at random: many freezes.
        for round in 0..32 {
            let id = format!("d{round}");
            peer.deliver(&id);
            // Frozen for 19 s once the delivery is read: its ACK goes out, the answer arrives
            // meanwhile, and is readable when the ACK timeout (10 s) has long passed. Every
            // other round the socket turns readable a moment after the timers, as when the
            // runtime sees the expired timer before the socket's readiness.
            let lag = Duration::from_millis(if round % 2 == 0 { 0 } else { 5 });
            peer.freeze(Duration::from_secs(19) + lag);
            assert_eq!(acked(peer.next_not_heartbeat().await), id);
            let answer =
                format!(r#"{{"type":"ack_result","delivery_id":"{id}","result":"acked"}}"#);
            peer.to_client.send(Ok(Some(answer))).unwrap();
            // One jump: the heartbeat's tick and the read come due in the same turn.
            tokio::time::advance(Duration::from_secs(19)).await;
            match h.next_event().await {
                ConsumerEvent::Ack { delivery_id, .. } => assert_eq!(delivery_id.to_string(), id),
                other => panic!("after freeze {round}: wanted the ACK's answer, got {other:?}"),
            }
            assert_eq!(
                credit(peer.next_not_heartbeat().await),
                1,
                "after freeze {round}"
            );
        }
        assert_eq!(h.stop().await.unanswered_acks, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_platform_breaks_the_connection_after_three_heartbeats() {
        let mut h = Harness::start(1, CreditGate::new(), |_| async { Ok(()) });
        let _peer = h.peer();
        assert_eq!(h.next_event().await, ConsumerEvent::Connected);
        let started = Instant::now();
        match h.next_event().await {
            ConsumerEvent::Disconnected { reason, .. } => assert_eq!(reason, StreamError::Silent),
            other => panic!("wanted a disconnect, got {other:?}"),
        }
        let silent = started.elapsed();
        assert!(
            silent > HEARTBEAT * 3 && silent <= HEARTBEAT * 4,
            "broke after {silent:?}"
        );
        h.stop().await;
    }
}
