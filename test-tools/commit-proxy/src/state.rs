//! What every connection task of one proxy shares: the upstream address, the armed rules, and
//! the list of client connections. The proxy, the control API and each session read and
//! update it; none of them owns it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::rules::Rules;

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
    pub(crate) fn new(upstream: &str) -> Shared {
        Shared {
            upstream: upstream.to_owned(),
            rules: Rules::new(),
            next_connection: AtomicU64::new(1),
            connections: Mutex::new(BTreeMap::new()),
        }
    }

    /// Lists a newly accepted connection; its number.
    pub(crate) fn register(&self, peer: SocketAddr) -> u64 {
        let id = self.next_connection.fetch_add(1, Ordering::SeqCst);
        let since_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        self.connections().insert(
            id,
            ConnectionInfo {
                id,
                client: peer.to_string(),
                server_thread_id: 0,
                interpreting: true,
                since_ms,
            },
        );
        id
    }

    /// Removes a connection that ended from the list.
    pub(crate) fn unregister(&self, id: u64) {
        self.connections().remove(&id);
    }

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
