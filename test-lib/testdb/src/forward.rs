//! One address that follows the primary: a plain TCP forwarder on loopback that a test
//! switches, standing for a virtual IP or a proxy (ProxySQL, HAProxy) in front of a
//! replication topology.
//!
//! A switch sends every **new** connection to the new target; connections already open stay
//! with the server they reached, as they do when a virtual IP moves or a proxy re-routes:
//! a client that holds a connection to a demoted primary keeps talking to it until it closes
//! that connection itself. A connection to a server that dies breaks like any other.
//!
//! It knows nothing of MySQL: bytes in, bytes out, in both directions, on two threads per
//! connection. Dropping it closes the listener and every connection it carries.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::Error;

/// A forwarder from a loopback port of its own to a switchable target.
#[derive(Debug)]
pub struct Forwarder {
    address: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    target: Mutex<SocketAddr>,
    stop: AtomicBool,
    /// Connections accepted so far (the drop's own wake-up not counted).
    accepted: AtomicU64,
    /// Every socket it holds, both ends of each connection, for the drop to close.
    open: Mutex<Vec<TcpStream>>,
}

impl Forwarder {
    /// Listens on a free loopback port and forwards each connection to `target`.
    pub fn start(target: SocketAddr) -> Result<Forwarder, Error> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(Error::io("the forwarder cannot bind a loopback port"))?;
        let address = listener
            .local_addr()
            .map_err(Error::io("the forwarder's address"))?;
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            stop: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            open: Mutex::new(Vec::new()),
        });
        let accept = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("testdb-forwarder".into())
                .spawn(move || accept_loop(&listener, &shared))
                .map_err(Error::io("cannot start the forwarder's thread"))?
        };
        Ok(Forwarder {
            address,
            shared,
            accept: Some(accept),
        })
    }

    /// Where clients connect: `127.0.0.1:<port>`.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// From now on, new connections go to `target`.
    pub fn switch(&self, target: SocketAddr) {
        *self.shared.target.lock().unwrap_or_else(|p| p.into_inner()) = target;
    }

    /// How many connections clients have opened through it so far: a test that must prove a
    /// program connected nowhere points the program here and reads 0.
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Where new connections go now.
    pub fn target(&self) -> SocketAddr {
        *self.shared.target.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let target = *shared.target.lock().unwrap_or_else(|p| p.into_inner());
        // A target that refuses (a killed primary) closes the client at once: what a client
        // of a virtual IP pointing at a dead host sees, sooner.
        let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        if let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) {
            let mut open = shared.open.lock().unwrap_or_else(|p| p.into_inner());
            open.retain(|s| s.peer_addr().is_ok());
            open.push(c3);
            open.push(s3);
        }
        let _ = std::thread::Builder::new()
            .name("testdb-forward-up".into())
            .spawn(move || pipe(client, server));
        let _ = std::thread::Builder::new()
            .name("testdb-forward-down".into())
            .spawn(move || pipe(s2, c2));
    }
}

/// Copies `from` to `to` until either ends, then closes both directions of both.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the stop.
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for s in self
            .shared
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener that answers each connection with `tag` and keeps it open until the
    /// client closes it.
    fn tagged(tag: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let _ = c.write_all(tag.as_bytes());
                    let mut rest = [0u8; 64];
                    while matches!(c.read(&mut rest), Ok(n) if n > 0) {}
                });
            }
        });
        addr
    }

    fn read_tag(addr: SocketAddr) -> (TcpStream, String) {
        let mut c = TcpStream::connect(addr).unwrap();
        let mut tag = [0u8; 1];
        c.read_exact(&mut tag).unwrap();
        (c, String::from_utf8_lossy(&tag).into_owned())
    }

    #[test]
    fn a_switch_moves_new_connections_and_leaves_open_ones_where_they_are() {
        let (a, b) = (tagged("a"), tagged("b"));
        let f = Forwarder::start(a).unwrap();
        let (mut old, tag) = read_tag(f.address());
        assert_eq!(tag, "a");
        f.switch(b);
        assert_eq!(f.target(), b);
        let (_new, tag) = read_tag(f.address());
        assert_eq!(tag, "b");
        assert_eq!(f.connections(), 2);
        // The old connection still leads to a: it is open (a write goes through).
        assert!(old.write_all(b"x").is_ok());
        drop(f);
        // Dropping the forwarder closes what it carried.
        let mut buf = [0u8; 1];
        old.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(matches!(old.read(&mut buf), Ok(0) | Err(_)));
    }
}
