//! The proxy: a loopback listener, one task per client connection, the armed rules and the log
//! of firings, and the handles a test uses to drive them.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::rules::{Fired, RuleInfo, RuleSpec, Rules, SpecError};

/// A client connection, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConnectionInfo {
    /// The proxy's number for it, from 1.
    pub id: u64,
    pub client: String,
    /// The server's thread id, once its greeting arrived (0 before).
    pub server_thread_id: u32,
    /// False once the proxy stopped interpreting it and relays raw bytes.
    pub interpreting: bool,
    pub since_ms: u64,
}

/// What every connection task of one proxy shares.
pub(crate) struct Shared {
    pub(crate) upstream: String,
    pub(crate) rules: Rules,
    next_connection: AtomicU64,
    connections: Mutex<BTreeMap<u64, ConnectionInfo>>,
}

impl Shared {
    fn connections(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, ConnectionInfo>> {
        self.connections.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The number the next accepted connection will get.
    pub(crate) fn next_connection_id(&self) -> u64 {
        self.next_connection.load(Ordering::SeqCst)
    }

    pub(crate) fn connection_list(&self) -> Vec<ConnectionInfo> {
        self.connections().values().cloned().collect()
    }

    pub(crate) fn set_thread_id(&self, id: u64, thread: u32) {
        if let Some(c) = self.connections().get_mut(&id) {
            c.server_thread_id = thread;
        }
    }

    pub(crate) fn set_interpreting(&self, id: u64, on: bool) {
        if let Some(c) = self.connections().get_mut(&id) {
            c.interpreting = on;
        }
    }
}

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
        let shared = Arc::new(Shared {
            upstream: upstream.to_owned(),
            rules: Rules::new(),
            next_connection: AtomicU64::new(1),
            connections: Mutex::new(BTreeMap::new()),
        });
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
                let id = shared.next_connection.fetch_add(1, Ordering::SeqCst);
                shared.connections().insert(id, ConnectionInfo {
                    id,
                    client: peer.to_string(),
                    server_thread_id: 0,
                    interpreting: true,
                    since_ms: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64,
                });
                let shared = shared.clone();
                sessions.spawn(async move {
                    crate::session::serve(id, client, shared.clone()).await;
                    shared.connections().remove(&id);
                });
            }
            // Reap finished sessions so the set does not grow.
            Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
        }
    }
}
