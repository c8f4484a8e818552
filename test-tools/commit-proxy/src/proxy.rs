//! The proxy's public face: a loopback listener, one task per client connection, and the
//! handles a test uses to arm rules and read their firings. The state those tasks share is in
//! `state.rs`.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::rules::{Fired, RuleInfo, RuleSpec, SpecError};
pub use crate::state::ConnectionInfo;
use crate::state::Shared;

/// Why a proxy did not start.
#[derive(Debug)]
pub enum StartError {
    /// The listen address is not a loopback address.
    NotLoopback(String),
    /// The address could not be resolved or bound.
    Io(String, std::io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::NotLoopback(a) => write!(
                f,
                "refusing to listen on {a}: commit-proxy listens on loopback addresses only (127.0.0.1, ::1)"
            ),
            StartError::Io(a, e) => write!(f, "cannot listen on {a}: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// Resolves `addr` and binds it, refusing anything that is not loopback.
pub(crate) async fn bind_loopback(addr: &str) -> Result<TcpListener, StartError> {
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| StartError::Io(addr.to_owned(), e))?
        .collect();
    if resolved.is_empty() || !resolved.iter().all(|a| a.ip().is_loopback()) {
        return Err(StartError::NotLoopback(addr.to_owned()));
    }
    TcpListener::bind(resolved[0])
        .await
        .map_err(|e| StartError::Io(addr.to_owned(), e))
}

/// A running proxy. Dropping it stops the listener and every connection it relays.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("listen", &self.addr)
            .field("upstream", &self.shared.upstream)
            .finish()
    }
}

impl Proxy {
    /// Listens on `listen` (loopback only; port 0 picks a free one) and relays every client to
    /// `upstream` (`host:port`).
    pub async fn start(listen: &str, upstream: &str) -> Result<Proxy, StartError> {
        let listener = bind_loopback(listen).await?;
        let addr = listener
            .local_addr()
            .map_err(|e| StartError::Io(listen.to_owned(), e))?;
        let shared = Arc::new(Shared::new(upstream));
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Proxy {
            addr,
            shared,
            tasks: vec![accept],
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Arms a rule; it applies to statements that arrive after this returns.
    pub fn arm(&self, spec: RuleSpec) -> Result<RuleHandle, SpecError> {
        spec.validate()?;
        let info = self
            .shared
            .rules
            .arm(spec, self.shared.next_connection_id());
        Ok(RuleHandle {
            id: info.id,
            shared: self.shared.clone(),
        })
    }

    /// Disarms rule `id`, returning its final state.
    pub fn disarm(&self, id: u64) -> Option<RuleInfo> {
        self.shared.rules.disarm(id)
    }

    /// Disarms every rule; returns how many there were.
    pub fn disarm_all(&self) -> usize {
        self.shared.rules.disarm_all()
    }

    /// The armed rules with their hit counts.
    pub fn rules(&self) -> Vec<RuleInfo> {
        self.shared.rules.list()
    }

    /// Every logged firing after `after` (0 for all).
    pub fn events(&self, after: u64) -> Vec<Fired> {
        self.shared.rules.events_after(after, None)
    }

    /// Waits up to `timeout` for firings after `after`.
    pub async fn wait_events(&self, after: u64, timeout: Duration) -> Vec<Fired> {
        self.shared.rules.wait_events(after, None, timeout).await
    }

    /// Open client connections.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        self.shared.connection_list()
    }

    /// Serves the HTTP control interface on `listen` (loopback only) until the proxy drops.
    pub async fn serve_control(&mut self, listen: &str) -> Result<SocketAddr, StartError> {
        let listener = bind_loopback(listen).await?;
        let addr = listener
            .local_addr()
            .map_err(|e| StartError::Io(listen.to_owned(), e))?;
        let control = crate::control::Control {
            shared: self.shared.clone(),
            listen: self.addr,
        };
        self.tasks.push(tokio::spawn(control.serve(listener)));
        Ok(addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// An armed rule.
#[derive(Clone)]
pub struct RuleHandle {
    id: u64,
    shared: Arc<Shared>,
}

impl fmt::Debug for RuleHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RuleHandle({})", self.id)
    }
}

impl RuleHandle {
    /// The rule's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The rule's state (`None` once disarmed).
    pub fn info(&self) -> Option<RuleInfo> {
        self.shared.rules.info(self.id)
    }

    /// Every firing of this rule so far.
    pub fn firings(&self) -> Vec<Fired> {
        self.shared.rules.events_after(0, Some(self.id))
    }

    /// Waits until the rule has fired (returns at once if it already has).
    pub async fn fired(&self) -> Fired {
        loop {
            if let Some(f) = self.fired_within(Duration::from_secs(3600)).await {
                return f;
            }
        }
    }

    /// Waits up to `timeout` for the rule's first firing.
    pub async fn fired_within(&self, timeout: Duration) -> Option<Fired> {
        self.shared
            .rules
            .wait_events(0, Some(self.id), timeout)
            .await
            .into_iter()
            .next()
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut sessions = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, peer)) = accepted else { continue };
                let id = shared.register(peer);
                let shared = shared.clone();
                sessions.spawn(async move {
                    crate::session::serve(id, client, shared.clone()).await;
                    shared.unregister(id);
                });
            }
            // Reap finished sessions so the set does not grow.
            Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
        }
    }
}
