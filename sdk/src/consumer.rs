//! `EventConsumer`: receive a subscription's deliveries over the WebSocket stream, run an async
//! handler per delivery, and ACK with that delivery's lease proof only when the handler
//! succeeded.
//!
//! - At most `concurrency` deliveries are held at once: the consumer grants the platform one
//!   credit per free handler slot and returns a credit when a handler finishes.
//! - A handler error means no ACK: the lease runs out and the platform delivers again.
//! - An ACK without an answer stays pending with its ORIGINAL proof and is sent again after
//!   every reconnect until the platform answers it (acked, already acked, or refused because
//!   the lease was superseded).
//! - The connection is re-established with capped exponential backoff and jitter; a silent
//!   connection (no message for three heartbeat periods) or an ACK unanswered for
//!   [`EventConsumer::ack_timeout`] counts as broken.
//! - [`Running::shutdown`] cancels in-flight handlers (their deliveries are not ACKed) and
//!   returns within its deadline.
//!
//! The consumer never prints a token or a proof, and it knows nothing of what the handler does.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::value::RawValue;
use tokio::sync::{broadcast, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

use crate::client::Client;
use crate::wire::{AckResult, ClientMessage, LeaseProof, ServerMessage};

/// How often the consumer sends a heartbeat; three periods of silence break the connection.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// One delivery, as a handler sees it. The lease proof stays inside the consumer.
pub struct Delivery {
    pub delivery_id: String,
    /// 1 for the first lease of this delivery, 2 after one expiry, …
    pub attempt: u32,
    pub lease_expires_at: String,
    event: Box<RawValue>,
}

impl Delivery {
    /// The event's JSON exactly as the platform sent it.
    pub fn event_json(&self) -> &str {
        self.event.get()
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
    Disconnected { reason: String, retry_in: Duration },
    /// The platform answered an ACK.
    Ack {
        delivery_id: String,
        result: AckResult,
        reason: Option<String>,
    },
    /// A handler failed: no ACK; the platform will deliver again after the lease.
    HandlerFailed { delivery_id: String, error: String },
}

/// A consumer of one subscription, not yet started.
#[derive(Debug, Clone)]
pub struct EventConsumer {
    client: Client,
    subscription: String,
    concurrency: usize,
    backoff_initial: Duration,
    backoff_max: Duration,
    ack_timeout: Duration,
    #[cfg(feature = "fault-hooks")]
    after_ack_sent: Option<AckSentHook>,
}

/// Test builds only (feature `fault-hooks`): awaited right after an ACK is written to the
/// stream, with the delivery id; the consumer does nothing else until it returns.
#[cfg(feature = "fault-hooks")]
#[derive(Clone)]
pub struct AckSentHook(pub Arc<dyn Fn(String) -> HookFuture + Send + Sync>);

/// What an [`AckSentHook`] returns.
#[cfg(feature = "fault-hooks")]
pub type HookFuture = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

#[cfg(feature = "fault-hooks")]
impl fmt::Debug for AckSentHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AckSentHook")
    }
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
}

impl EventConsumer {
    /// A consumer of `subscription` with concurrency 4.
    pub fn new(client: Client, subscription: impl Into<String>) -> EventConsumer {
        EventConsumer {
            client,
            subscription: subscription.into(),
            concurrency: 4,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(10),
            #[cfg(feature = "fault-hooks")]
            after_ack_sent: None,
        }
    }

    /// Test builds only: runs `hook` after every first send of an ACK.
    #[cfg(feature = "fault-hooks")]
    pub fn after_ack_sent(mut self, hook: AckSentHook) -> EventConsumer {
        self.after_ack_sent = Some(hook);
        self
    }

    /// How many deliveries may be handled at once (at least 1).
    pub fn concurrency(mut self, n: usize) -> EventConsumer {
        self.concurrency = n.max(1);
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

    /// Starts consuming; `handler` runs once per delivery.
    pub fn start<H, F, E>(self, handler: H) -> Running
    where
        H: Fn(Delivery) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let (stop, stop_rx) = watch::channel(false);
        let (events, _) = broadcast::channel(1024);
        let handler = Arc::new(move |d: Delivery| {
            let fut = handler(d);
            async move { fut.await.map_err(|e| e.to_string()) }
        });
        let task = tokio::spawn(run(self, handler, stop_rx, events.clone()));
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

/// Backoff jitter from a generator seeded by the system (fastrand).
struct Jitter(fastrand::Rng);

impl Jitter {
    fn new() -> Jitter {
        Jitter(fastrand::Rng::new())
    }

    /// `d` scaled by a factor in [0.5, 1.5).
    fn apply(&mut self, d: Duration) -> Duration {
        d.mul_f64(0.5 + self.0.f64())
    }
}

/// Capped exponential backoff with jitter between connection attempts.
struct Backoff {
    jitter: Jitter,
    delay: Duration,
    initial: Duration,
    max: Duration,
}

impl Backoff {
    fn reset(&mut self) {
        self.delay = self.initial;
    }

    /// Reports the disconnection and waits; false if a stop came first.
    async fn wait(
        &mut self,
        reason: String,
        events: &broadcast::Sender<ConsumerEvent>,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let wait = self.jitter.apply(self.delay);
        let _ = events.send(ConsumerEvent::Disconnected {
            reason,
            retry_in: wait,
        });
        self.delay = (self.delay * 2).min(self.max);
        tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = stop.changed() => false,
        }
    }
}

type Handler = Arc<
    dyn Fn(Delivery) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync,
>;

async fn run<H, F>(
    config: EventConsumer,
    handler: Arc<H>,
    mut stop: watch::Receiver<bool>,
    events: broadcast::Sender<ConsumerEvent>,
) -> Summary
where
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), String>> + Send + 'static,
{
    let handler: Handler = Arc::new(move |d| Box::pin(handler(d)));
    let mut in_flight: JoinSet<(String, LeaseProof, Result<(), String>)> = JoinSet::new();
    // ACKs sent and not yet answered: delivery id → the ORIGINAL proof.
    let mut pending: HashMap<String, (LeaseProof, Instant)> = HashMap::new();
    let mut backoff = Backoff {
        jitter: Jitter::new(),
        delay: config.backoff_initial,
        initial: config.backoff_initial,
        max: config.backoff_max,
    };
    let url = config
        .client
        .base()
        .ws(&format!("/v1/subscriptions/{}/stream", config.subscription));

    'connect: loop {
        if *stop.borrow() {
            break;
        }
        let request = url.as_str().into_client_request().map(|mut r| {
            if let Ok(v) =
                HeaderValue::from_str(&format!("Bearer {}", config.client.token().expose()))
            {
                r.headers_mut().insert("Authorization", v);
            }
            r
        });
        let connected = match request {
            Ok(r) => tokio::select! {
                c = tokio_tungstenite::connect_async(r) => c.map_err(|e| e.to_string()),
                _ = stop.changed() => break 'connect,
            },
            Err(e) => Err(e.to_string()),
        };
        let mut ws = match connected {
            Ok((ws, _)) => ws,
            Err(reason) => {
                if backoff.wait(reason, &events, &mut stop).await {
                    continue 'connect;
                }
                break 'connect;
            }
        };
        backoff.reset();
        let _ = events.send(ConsumerEvent::Connected);

        let mut outgoing = Vec::new();
        let free = config.concurrency.saturating_sub(in_flight.len());
        if free > 0 {
            outgoing.push(ClientMessage::Credit {
                credit: free as u32,
            });
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
            if let Err(e) = send(&mut ws, &m).await {
                broken = Some(e);
                break;
            }
        }

        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        let mut last_heard = Instant::now();
        while broken.is_none() {
            tokio::select! {
                _ = stop.changed() => {
                    let _ = ws.close(None).await;
                    break 'connect;
                }
                msg = ws.next() => {
                    last_heard = Instant::now();
                    let text = match msg {
                        Some(Ok(Message::Text(t))) => t,
                        Some(Ok(Message::Close(_))) | None => { broken = Some("the platform closed the stream".to_owned()); continue }
                        Some(Ok(_)) => continue,
                        Some(Err(e)) => { broken = Some(e.to_string()); continue }
                    };
                    match ServerMessage::from_json(text.as_str()) {
                        Ok(ServerMessage::Delivery { delivery_id, attempt, proof, lease_expires_at, event }) => {
                            let handler = handler.clone();
                            let delivery = Delivery { delivery_id: delivery_id.clone(), attempt, lease_expires_at, event };
                            in_flight.spawn(async move {
                                let result = handler(delivery).await;
                                (delivery_id, proof, result)
                            });
                        }
                        Ok(ServerMessage::AckResult { delivery_id, result, reason }) => {
                            pending.remove(&delivery_id);
                            let _ = events.send(ConsumerEvent::Ack { delivery_id, result, reason });
                        }
                        Ok(ServerMessage::Heartbeat) => {}
                        Err(e) => broken = Some(format!("unexpected stream message: {e}")),
                    }
                }
                Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                    let Ok((delivery_id, proof, result)) = done else { continue };
                    match result {
                        Ok(()) => {
                            pending.insert(delivery_id.clone(), (proof.clone(), Instant::now()));
                            #[cfg(feature = "fault-hooks")]
                            let acked = delivery_id.clone();
                            if let Err(e) = send(&mut ws, &ClientMessage::Ack { delivery_id, proof }).await {
                                broken = Some(e);
                                continue;
                            }
                            #[cfg(feature = "fault-hooks")]
                            if let Some(hook) = &config.after_ack_sent {
                                (hook.0)(acked).await;
                            }
                        }
                        Err(error) => {
                            let _ = events.send(ConsumerEvent::HandlerFailed { delivery_id, error });
                        }
                    }
                    if let Err(e) = send(&mut ws, &ClientMessage::Credit { credit: 1 }).await {
                        broken = Some(e);
                    }
                }
                _ = heartbeat.tick() => {
                    if last_heard.elapsed() > HEARTBEAT * 3 {
                        broken = Some("no message from the platform for three heartbeat periods".to_owned());
                    } else if pending.values().any(|(_, sent)| sent.elapsed() > config.ack_timeout) {
                        broken = Some("an ACK went unanswered".to_owned());
                    } else if let Err(e) = send(&mut ws, &ClientMessage::Heartbeat).await {
                        broken = Some(e);
                    }
                }
            }
        }
        if !backoff
            .wait(broken.unwrap_or_default(), &events, &mut stop)
            .await
        {
            break 'connect;
        }
    }
    let summary = Summary {
        cancelled_handlers: in_flight.len(),
        unanswered_acks: pending.len(),
    };
    in_flight.abort_all();
    summary
}

async fn send<S>(ws: &mut S, m: &ClientMessage) -> Result<(), String>
where
    S: futures_util::Sink<Message> + Unpin,
    S::Error: fmt::Display,
{
    let text = serde_json::to_string(m).map_err(|e| e.to_string())?;
    ws.send(Message::Text(text.into()))
        .await
        .map_err(|e| e.to_string())
}
