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
//!
//! With `--tls-cert` and `--tls-key` every connection is TLS first (rustls): HTTPS and WSS on
//! the same routes, with the same limits; the handshake must finish within the header
//! timeout.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

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

/// The TLS configuration of `--tls-cert` (a PEM chain, the server's certificate first) and
/// `--tls-key` (a PEM private key); the error names the flag and the file.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert {}: holds no PEM certificate",
            cert.display()
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            format!(
                "--tls-cert {} and --tls-key {}: {e}",
                cert.display(),
                key.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `app` on `listener` until `stop` completes; connections still open then are dropped.
/// With `tls`, every connection is a TLS one.
pub async fn run(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let acceptor = tls.map(TlsAcceptor::from);
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
        let app = app.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            match acceptor {
                None => serve_connection(socket, app, limits).await,
                Some(acceptor) => {
                    // A client that does not finish its handshake in time, or fails it (an
                    // untrusted certificate on its side, say), is dropped without a word.
                    let handshake =
                        tokio::time::timeout(limits.header_timeout, acceptor.accept(socket));
                    if let Ok(Ok(stream)) = handshake.await {
                        serve_connection(stream, app, limits).await;
                    }
                }
            }
            drop(permit);
        });
    }
}

/// One HTTP/1.1 connection (upgrades included) on `io`, until it ends.
async fn serve_connection<S>(io: S, app: axum::Router, limits: Limits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
        .with_upgrades();
    // A client that breaks off or times out ends its connection; nothing to report.
    let _ = connection.await;
}
