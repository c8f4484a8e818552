//! The accept loop: HTTP/1.1 connections, each bounded in what a slow or idle client can hold.
//!
//! - a request head (request line and headers) must arrive within the header timeout, or the
//!   connection is closed (hyper's `header_read_timeout`, which also covers an idle keep-alive
//!   connection waiting for its next request);
//! - a request body must arrive within the body timeout (`api::router` answers 408 otherwise);
//! - at most `max_connections` connections are served at once; past that, new ones wait in the
//!   listen backlog until one closes.
//!
//! A WebSocket stream is an upgraded connection and holds its slot while it lasts.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What one client may hold, each a `serve` flag.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `--header-timeout-seconds`: a request head must arrive within this.
    pub header_timeout: Duration,
    /// `--body-timeout-seconds`: a request body must arrive within this.
    pub body_timeout: Duration,
    /// `--max-connections`: connections served at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 1024,
        }
    }
}

/// Serves `app` on `listener` until `stop` completes; connections still open then are dropped.
pub async fn run(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut stop = std::pin::pin!(stop);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut stop => return Ok(()),
        };
        let (socket, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // A client that went away between SYN and accept, or a transient lack of file
                // descriptors: say so and go on; the listener itself is fine.
                Err(e) => {
                    eprintln!("orbit-dev: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => return Ok(()),
        };
        // No Nagle: deliveries and ACK answers are small frames that must not wait for the
        // client's delayed ACK of the previous one.
        let _ = socket.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(socket), service)
                .with_upgrades();
            // A client that breaks off or times out ends its connection; nothing to report.
            let _ = connection.await;
            drop(permit);
        });
    }
}
