//! A Galera cluster of local nodes, each a [`Server`].

use std::time::Duration;

use crate::error::Error;
use crate::server::Server;
use crate::{cleanup, galera, netns};

/// A MariaDB Galera cluster of local nodes on loopback, each a [`Server`]. A database or an
/// account provisioned on one node exists on all. Dropping the cluster kills every node and
/// removes its directory.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<Server>,
    dir: std::path::PathBuf,
    started_in: Duration,
    /// The namespaces, in a cluster started in them; dropped after the nodes.
    net: Option<netns::Net>,
}

impl Cluster {
    /// Starts `count` nodes (the first bootstraps, the others join it by state transfer) and
    /// returns when every one is `Synced`. [`Error::NoServerProgram`] when the Galera provider
    /// or MariaDB's server is missing.
    pub fn start(count: usize) -> Result<Cluster, Error> {
        Self::start_with(count, None, 1)
    }

    /// [`Cluster::start`] with each node in a network namespace of its own, on one bridge
    /// ([`netns::Net`], made here; [`Cluster::net`] adds the other parties and cuts links).
    /// The harness administers the nodes over their unix sockets; their SQL addresses are on
    /// the bridge, for clients in other member namespaces, and speak TLS with a certificate
    /// for the address, signed by a CA made for the cluster ([`Server::pki`]; the URLs the
    /// provisioned databases give carry it). Needs root.
    pub fn start_in_namespaces(count: usize) -> Result<Cluster, Error> {
        Self::start_with(count, Some(netns::Net::create()?), 1)
    }

    /// [`Cluster::start_in_namespaces`] with each node's `innodb_flush_log_at_trx_commit` set
    /// to `flush` (1 everywhere else): a relaxed 0 or 2, to measure what a crash loses.
    pub fn start_in_namespaces_with_flush(count: usize, flush: u8) -> Result<Cluster, Error> {
        Self::start_with(count, Some(netns::Net::create()?), flush)
    }

    /// Restarts the killed nodes `nodes` together, each from its recovered position, and
    /// returns once every one is `Synced`: after two nodes crashed close together (the third,
    /// alone, is non-Primary until they are back) or after the whole cluster lost power (its
    /// primary component is restored once all its members are back, Galera's `pc.recovery`).
    /// One at a time would wait forever for a quorum that only the others can bring.
    ///
    /// A node that lost what it had answered (a relaxed `innodb_flush_log_at_trx_commit`)
    /// needs a full state transfer, which can fail while its donor serves another joiner (the
    /// node then aborts): each node that failed is started once more, alone, once the others
    /// are back.
    pub fn restart_together(&self, nodes: &[usize]) -> Result<(), Error> {
        let failed: Vec<usize> = std::thread::scope(|s| {
            let started: Vec<_> = nodes
                .iter()
                .map(|&i| {
                    let node = &self.nodes[i];
                    (i, s.spawn(move || node.restart()))
                })
                .collect();
            started
                .into_iter()
                .filter_map(|(i, h)| {
                    h.join()
                        .expect("a node's restart does not panic")
                        .err()
                        .map(|_| i)
                })
                .collect()
        });
        for i in failed {
            self.nodes[i].restart()?;
        }
        Ok(())
    }

    fn start_with(count: usize, net: Option<netns::Net>, flush: u8) -> Result<Cluster, Error> {
        let started = std::time::Instant::now();
        let galera::Nodes { nodes, dir, pki } = galera::start(count, net.as_ref(), flush)?;
        let where_ = if net.is_some() {
            "in network namespaces"
        } else {
            "on loopback"
        };
        let nodes = nodes
            .into_iter()
            .map(|node| {
                let description = format!(
                    "{} of a {count}-node Galera cluster {where_} (local mariadbd, {}:{})",
                    node.name(),
                    node.host(),
                    node.port()
                );
                Server::galera_node(node, pki.as_ref(), description)
            })
            .collect();
        cleanup::remove_at_exit();
        Ok(Cluster {
            nodes,
            dir,
            started_in: started.elapsed(),
            net,
        })
    }

    /// The namespaces of a cluster started with [`Cluster::start_in_namespaces`].
    pub fn net(&self) -> Option<&netns::Net> {
        self.net.as_ref()
    }

    /// The nodes, in order (`node1` first).
    pub fn nodes(&self) -> &[Server] {
        &self.nodes
    }

    /// Node `i`, counted from 0.
    pub fn node(&self, i: usize) -> &Server {
        &self.nodes[i]
    }

    /// How long starting the cluster took, until every node was `Synced`.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
