//! `receiver consume`: apply every delivery of an existing subscription until SIGINT/SIGTERM.
//!
//! Before consuming anything it reads the subscription and refuses to start when its queue is
//! not the configured one (a wrong queue would burn the delivery budget). Concurrency 4. A
//! signal cancels in-flight handlers (their deliveries are not ACKed and come again after the
//! lease) and the process ends within 10 s; the shared subscription is never paused.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orbit_sdk::{Client, ConsumerEvent, EventConsumer};

use crate::config::ConsumeConfig;
use crate::delivery::apply_raw;
use result_inbox::Store;
use result_inbox::StoreOptions;

/// Handlers at once.
pub const CONCURRENCY: usize = 4;
/// How long stopping may take, of the 10 s a signal allows.
pub const DRAIN: Duration = Duration::from_secs(8);

/// Why consume stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    #[error("cannot connect to the receiver database: {0}")]
    Store(#[source] result_inbox::StorageError),
    #[error("cannot use the platform: {0}")]
    Platform(#[source] orbit_sdk::SdkError),
    #[error("cannot listen for SIGTERM/SIGINT: {0}")]
    Signals(#[source] std::io::Error),
    #[error("subscription {id} consumes queue {actual}, not the configured queue {configured}: refusing to start")]
    WrongQueue {
        id: String,
        actual: String,
        configured: String,
    },
}

/// Connects to the platform and the database: the client, the subscription (checked against
/// the configured queue) and the store.
async fn start(
    config: &ConsumeConfig,
) -> Result<(Client, orbit_sdk::wire::Subscription, Arc<Store>), ConsumeError> {
    let queue = config.run.platform.queue.clone();
    let client = Client::new(
        &config.run.platform.url,
        config.run.platform.credentials.token.clone(),
    )
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
    let options = StoreOptions {
        max_connections: CONCURRENCY as u32 + 1,
        #[cfg(feature = "fault-barriers")]
        barrier: Some(crate::fault::store_hook()),
        ..StoreOptions::default()
    };
    let store = Store::connect(&config.run.dsn, config.run.name.clone(), queue, options)
        .await
        .map_err(ConsumeError::Store)?;
    Ok((client, subscription, Arc::new(store)))
}

/// Consumes until `stop` completes. A `stop` during start-up ends it at once, successfully.
pub async fn run(
    config: &ConsumeConfig,
    stop: impl Future<Output = &'static str>,
) -> Result<(), ConsumeError> {
    let mut stop = std::pin::pin!(stop);
    // The fault build checks its barrier settings before anything connects.
    #[cfg(feature = "fault-barriers")]
    crate::fault::announce();
    tracing::info!(
        subscription = %config.subscription,
        "starting: reading the subscription from the platform and connecting to the receiver database"
    );
    let (client, subscription, store) = tokio::select! {
        started = start(config) => started?,
        signal = &mut stop => {
            tracing::info!(signal, "stopped during start-up");
            return Ok(());
        }
    };
    let queue = config.run.platform.queue.clone();
    tracing::info!(subscription = %subscription.id, queue = %queue, consumer = %config.run.name, "consuming");
    let consumer = {
        let (store, queue) = (store.clone(), queue.clone());
        let consumer = EventConsumer::new(client, subscription.id.clone()).concurrency(CONCURRENCY);
        #[cfg(feature = "fault-barriers")]
        let consumer = consumer.after_ack_sent(crate::fault::ack_sent_hook());
        consumer.start(move |d| {
            let (store, queue) = (store.clone(), queue.clone());
            async move {
                let started = Instant::now();
                let h = apply_raw(&store, &queue, d.event_json().as_bytes()).await;
                let ms = started.elapsed().as_millis() as u64;
                h.log(&d.delivery_id, d.attempt, ms);
                if h.classification.acks() {
                    #[cfg(feature = "fault-barriers")]
                    crate::fault::barrier("after_commit", h.event_id.as_deref().unwrap_or("-"))
                        .await;
                    Ok(())
                } else {
                    Err(h.classification.to_string())
                }
            }
        })
    };
    let mut events = consumer.events();
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
                    tracing::info!(delivery_id = %delivery_id, result = ?result, "ack answered")
                }
                ConsumerEvent::Connected => tracing::info!("stream connected"),
                // Handler failures are logged by the handler; newer events are not ours to log.
                _ => {}
            }
        }
    });
    let signal = stop.await;
    tracing::info!(signal, "stopping: cancelling in-flight handlers");
    let summary = consumer.shutdown(DRAIN).await;
    watch.abort();
    store.close().await;
    tracing::info!(
        cancelled_handlers = summary.cancelled_handlers,
        unanswered_acks = summary.unanswered_acks,
        "stopped; the subscription stays enabled"
    );
    Ok(())
}
