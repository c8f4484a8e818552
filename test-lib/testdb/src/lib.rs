//! Throwaway MySQL servers for tests and the demo.
//!
//! A test asks for a [`Server`] and then [`Server::provision`]s its own uniquely named
//! databases and accounts on it: the platform's `orbit_test_…` and the receiver's separate
//! `orbit_receiver_test_…`, with an init, a runtime and a platform account holding exactly the
//! grants of `schema/grants.sql`. Nothing is shared between tests but the server process.
//!
//! Where the server comes from, first match wins:
//! 1. `TESTDB_MYSQL_URL=mysql://admin:password@host:port`: an existing server; the harness
//!    only creates and drops its own databases and users there (leftovers of a crashed run are
//!    removed by the next).
//! 2. With the `container` feature, when a Docker engine answers (the one `DOCKER_HOST` names):
//!    a container of `TESTDB_CONTAINER_IMAGE`, by default MySQL 8.4.
//! 3. A local `mariadbd` or `mysqld` on a fresh datadir in a temporary directory, listening on
//!    a free loopback port.
//!
//! `TESTDB_BACKEND=url|container|local` forces one. Servers and their directories are
//! removed when the [`Server`] drops, when the test process exits (the shared server), and, if
//! the process was killed, by the next run's sweep; a local server also dies with the process
//! that started it (`PR_SET_PDEATHSIG`). No server outlives the test run.
//!
//! This crate knows MySQL administration only; it knows nothing of the inbox. It sits at the
//! bottom of the test layers: the suites and the benches use it, it uses none of them.
//!
//! What this crate must never do: leave a server, a process, a directory or a network namespace
//! behind, listen on anything but loopback or an address inside a namespace the run created
//! ([`netns`]), print a password (every password and URL is a `secret::Secret`), or
//! touch a database it did not create.

mod at_rest;
mod cleanup;
pub mod forward;
mod galera;
mod local;
pub mod netns;
mod process;
mod provision;
pub mod replication;
pub mod tls;

#[cfg(feature = "container")]
mod container;
#[cfg(feature = "container")]
pub use container::{DEFAULT_IMAGE, TESTDB_CONTAINER_IMAGE, TESTDB_CONTAINER_WAIT};

use std::sync::OnceLock;
use std::time::Duration;

pub use at_rest::{
    server_options as encryption_options, write_key_file, Backup, ENCRYPTED_NOTE, TESTDB_ENCRYPTED,
};
pub use forward::Forwarder;
pub use galera::{provider as galera_provider, PROVIDER_PATHS, TESTDB_GALERA_PROVIDER};
pub use provision::{Account, Provisioned};
pub use replication::{ReplicationOptions, Topology};

/// Names the admin URL of an existing server to use instead of starting one.
pub const TESTDB_MYSQL_URL: &str = "TESTDB_MYSQL_URL";
/// When set (to anything), every server started is announced with one line on standard
/// error, `testdb: server <description>`, written past the test harness's capture: the
/// integration runner reads which servers a suite had from these lines.
pub const TESTDB_ANNOUNCE: &str = "TESTDB_ANNOUNCE";
/// Forces a backend: `url` (the server [`TESTDB_MYSQL_URL`] names), `container` or `local`.
pub const TESTDB_BACKEND: &str = "TESTDB_BACKEND";
/// When set (to anything), [`Server::start`] and so the shared server start a local server
/// that speaks only TLS ([`Server::local_tls`] for `localhost` and `127.0.0.1`): a suite run
/// this way makes every connection of its tests over verified TLS. Only the local backend can.
pub const TESTDB_TLS: &str = "TESTDB_TLS";

/// The names a TLS server's certificate carries unless a test asks for others.
pub const TLS_NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

/// How long a starting server has to answer `SELECT 1`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Spawns `cmd` so that it dies with this process, even when the process is killed with
/// SIGKILL (`PR_SET_PDEATHSIG`, from a thread that lives as long as the process). For the
/// platform and receiver processes a test starts.
pub fn spawn_tied(cmd: std::process::Command) -> std::io::Result<std::process::Child> {
    process::spawn_long_lived(cmd)
}

/// Whether a live process of process group `group` is left; zombies count as gone.
pub fn group_alive(group: u32) -> bool {
    process::group_alive(group)
}

/// Whether `pid` is a live process; a zombie (ended, not yet reaped) counts as gone.
pub fn process_alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(process::process_alive)
}

/// A directory for this process's temporary files under the harness's root, removed when the
/// process exits (also after failed tests), or by the next run's sweep if it was killed.
pub fn scratch_dir() -> std::io::Result<std::path::PathBuf> {
    cleanup::scratch_dir()
}

/// Why no server could be had, or an administration step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `TESTDB_*` variable, or a request the chosen backend cannot serve.
    #[error("{0}")]
    Config(String),
    /// Neither `mariadbd` nor `mysqld` (or the datadir installer) is installed.
    #[error("{0}")]
    NoServerProgram(String),
    /// A file, directory, port or process operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A statement or a connection to the server failed.
    #[error("{what}: {source}")]
    Sql {
        what: String,
        #[source]
        source: sqlx::Error,
    },
    /// The server exited at start-up because its port was taken meanwhile: try another.
    #[error("port {port} on 127.0.0.1 was taken before the server could bind it")]
    PortInUse { port: u16 },
    /// The server (or its datadir installer) failed or did not become ready; the end of its log.
    #[error("{what}; log {}:\n{tail}", log.display())]
    Server {
        what: String,
        log: std::path::PathBuf,
        tail: String,
    },
    /// The container backend failed.
    #[error("{0}")]
    Container(String),
    /// The process-wide shared server failed to start earlier; why, as it was reported then.
    #[error("the shared test server did not start: {0}")]
    Shared(String),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    pub(crate) fn sql(what: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Error {
        let what = what.into();
        move |source| Error::Sql { what, source }
    }
}

/// A MySQL server a test may use.
#[derive(Debug)]
pub struct Server {
    host: String,
    port: u16,
    admin_user: String,
    admin_password: secret::Secret,
    description: String,
    backend: Backend,
    /// A TLS server's certificate authority and its URL parameters.
    tls: Option<Tls>,
    /// What the harness's own admin URLs carry: empty, or `socket=…` for a server it
    /// administers over its unix socket (a TLS server, a node in a network namespace).
    admin_query: String,
}

/// What a TLS server's clients need.
#[derive(Debug)]
struct Tls {
    pki: std::sync::Arc<tls::Pki>,
    /// `ssl-mode=VERIFY_IDENTITY&ssl-ca=…&ssl-cert=…&ssl-key=…`.
    query: String,
}

impl Tls {
    /// The URL parameters of a client that verifies the server against `pki`'s CA and shows
    /// its client certificate.
    fn client_query(pki: &tls::Pki) -> String {
        format!(
            "ssl-mode=VERIFY_IDENTITY&ssl-ca={}&ssl-cert={}&ssl-key={}",
            pki.ca.display(),
            pki.client.cert.display(),
            pki.client.key.display()
        )
    }
}

#[derive(Debug)]
enum Backend {
    Local(local::LocalServer),
    Existing,
    /// One node of a [`Cluster`].
    Galera(galera::Node),
    /// Held for its `Drop`, which removes the container.
    #[cfg(feature = "container")]
    Container(#[allow(dead_code)] container::ContainerServer),
}

#[allow(clippy::disallowed_methods)] // the harness reads its own variables, not the receiver's
pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Server {
    /// Starts (or connects to) a server owned by the caller; it is removed on drop.
    pub fn start() -> Result<Server, Error> {
        let forced = env(TESTDB_BACKEND);
        if env(TESTDB_ENCRYPTED).is_some() {
            return match forced.as_deref() {
                None | Some("local") => Self::local_encrypted(),
                Some(other) => Err(Error::Config(format!(
                    "{TESTDB_ENCRYPTED} needs the local backend, and {TESTDB_BACKEND} is {other}"
                ))),
            };
        }
        if env(TESTDB_TLS).is_some() {
            return match forced.as_deref() {
                None | Some("local") => Self::local_tls(&TLS_NAMES),
                Some(other) => Err(Error::Config(format!(
                    "{TESTDB_TLS} needs the local backend, and {TESTDB_BACKEND} is {other}"
                ))),
            };
        }
        match forced.as_deref() {
            Some("url") => Self::existing(),
            Some("container") => Self::container(),
            Some("local") => Self::local(),
            Some(other) => Err(Error::Config(format!(
                "{TESTDB_BACKEND}={other} is not one of local, container, url"
            ))),
            None => {
                if env(TESTDB_MYSQL_URL).is_some() {
                    return Self::existing();
                }
                #[cfg(feature = "container")]
                if container::engine_answers() {
                    return Self::container();
                }
                Self::local()
            }
        }
    }

    /// A local `mariadbd`/`mysqld` on a temporary datadir, whatever the environment says.
    pub fn local() -> Result<Server, Error> {
        let server = local::LocalServer::start(None)?;
        Ok(Self::loopback_root(
            server.port(),
            server.description().to_owned(),
            Backend::Local(server),
        ))
    }

    /// A local server started with further options `args` (kept for a restart), e.g.
    /// `--rpl-semi-sync-master-enabled=ON`.
    pub fn local_with_args(args: Vec<String>) -> Result<Server, Error> {
        let server = local::LocalServer::start_with(None, args)?;
        Ok(Self::loopback_root(
            server.port(),
            server.description().to_owned(),
            Backend::Local(server),
        ))
    }

    /// A local server that speaks TLS and refuses plain TCP (`require_secure_transport`),
    /// with a certificate for `names` (e.g. `localhost` and `127.0.0.1`) signed by a CA made
    /// for it ([`Server::pki`]); its files live in the server's directory and go with it.
    /// Every URL this server and its [`Provisioned`] databases give carries
    /// [`Server::tls_query`]: verified TLS, with the CA's client certificate.
    pub fn local_tls(names: &[&str]) -> Result<Server, Error> {
        let made: std::sync::Mutex<Option<(Tls, String)>> = std::sync::Mutex::new(None);
        let make = |dir: &std::path::Path| -> Result<local::ServerTls, Error> {
            let pki = tls::Pki::generate(&dir.join("tls"))?;
            let server = pki.server("server", names)?;
            let query = Tls::client_query(&pki);
            // The harness administers the server over its unix socket, which the server
            // counts as secure: so it can whatever names the certificate carries (a test may
            // give it names that do not match on purpose).
            let admin_query = format!("socket={}", dir.join("mysqld.sock").display());
            let args = vec![
                format!("--ssl-ca={}", pki.ca.display()),
                format!("--ssl-cert={}", server.cert.display()),
                format!("--ssl-key={}", server.key.display()),
                "--require-secure-transport=ON".to_owned(),
            ];
            *made.lock().unwrap_or_else(|p| p.into_inner()) = Some((
                Tls {
                    pki: std::sync::Arc::new(pki),
                    query,
                },
                admin_query.clone(),
            ));
            Ok(local::ServerTls {
                args,
                query: admin_query,
            })
        };
        let server = local::LocalServer::start(Some(&make))?;
        let (tls, admin_query) = made.into_inner().unwrap_or_else(|p| p.into_inner()).unzip();
        Ok(Server {
            tls,
            admin_query: admin_query.unwrap_or_default(),
            ..Self::loopback_root(
                server.port(),
                server.description().to_owned(),
                Backend::Local(server),
            )
        })
    }

    /// A TLS server's certificate authority ([`Server::local_tls`]), `None` for the others.
    pub fn pki(&self) -> Option<&tls::Pki> {
        self.tls.as_ref().map(|t| &*t.pki)
    }

    /// The URL parameters every client of a TLS server needs; empty for the others.
    pub fn tls_query(&self) -> String {
        self.tls
            .as_ref()
            .map(|t| t.query.clone())
            .unwrap_or_default()
    }

    /// A server of ours on loopback, administered as `root` without a password.
    fn loopback_root(port: u16, description: String, backend: Backend) -> Server {
        Server {
            host: "127.0.0.1".into(),
            port,
            admin_user: "root".into(),
            admin_password: secret::Secret::new(""),
            description,
            backend,
            tls: None,
            admin_query: String::new(),
        }
        .announced()
    }

    /// See [`TESTDB_ANNOUNCE`].
    fn announced(self) -> Server {
        if env(TESTDB_ANNOUNCE).is_some() {
            use std::io::Write;
            let line = format!("testdb: server {}\n", self.description);
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
        self
    }

    fn existing() -> Result<Server, Error> {
        let url = env(TESTDB_MYSQL_URL)
            .ok_or_else(|| Error::Config(format!("{TESTDB_MYSQL_URL} is not set")))?;
        let rest = url.strip_prefix("mysql://").ok_or_else(|| {
            Error::Config(format!(
                "{TESTDB_MYSQL_URL} must look like mysql://admin:password@host:port"
            ))
        })?;
        let (authority, _) = endpoint::split_authority(rest);
        let parsed = endpoint::Authority::parse(authority).map_err(|e| {
            Error::Config(match e {
                endpoint::AuthorityError::NoHost => format!("{TESTDB_MYSQL_URL} names no host"),
                endpoint::AuthorityError::BadPort => {
                    format!("{TESTDB_MYSQL_URL} has a malformed port")
                }
            })
        })?;
        let user = parsed.user().ok_or_else(|| {
            Error::Config(format!(
                "{TESTDB_MYSQL_URL} must name an admin user: mysql://admin:password@host:port"
            ))
        })?;
        let (host, port) = (parsed.host(), parsed.port().unwrap_or(3306));
        let password = parsed.password().unwrap_or("");
        let server = Server {
            host: host.to_owned(),
            port,
            admin_user: user.to_owned(),
            admin_password: secret::Secret::new(password),
            description: format!("existing server at {host}:{port}"),
            backend: Backend::Existing,
            tls: None,
            admin_query: String::new(),
        };
        let version = provision::block_on(provision::server_version(&server))?;
        let server = Server {
            description: format!("{version} (existing server at {host}:{port})"),
            ..server
        };
        provision::block_on(provision::sweep_leftovers(&server))?;
        Ok(server.announced())
    }

    #[cfg(feature = "container")]
    fn container() -> Result<Server, Error> {
        let server = container::ContainerServer::start()?;
        Ok(Self::loopback_root(
            server.port(),
            server.description().to_owned(),
            Backend::Container(server),
        ))
    }

    #[cfg(not(feature = "container"))]
    fn container() -> Result<Server, Error> {
        Err(Error::Config(
            "the container backend needs testdb's `container` feature".into(),
        ))
    }

    /// The process-wide shared server, started on first use and removed when the process exits.
    pub fn shared() -> Result<&'static Server, Error> {
        static SHARED: OnceLock<Result<Server, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let server = Server::start().map_err(|e| e.to_string())?;
                cleanup::remove_at_exit();
                Ok(server)
            })
            .as_ref()
            .map_err(|e| Error::Shared(e.clone()))
    }

    /// `host:port` of the server.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the server is, e.g. `10.11.19-MariaDB (local mariadbd, /tmp/…)`.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// An admin URL (no database); it carries a password only for an existing server.
    pub fn admin_url(&self) -> secret::Secret {
        self.admin_url_on(None)
    }

    /// An admin URL on `database`.
    pub fn admin_url_on(&self, database: Option<&str>) -> secret::Secret {
        provision::url(
            &self.admin_user,
            self.admin_password.expose(),
            &self.address(),
            database,
            &self.admin_query,
        )
    }

    /// Kills a local server or a cluster node with SIGKILL, as a crash would; returns whether
    /// one was killed.
    pub fn kill(&self) -> bool {
        match &self.backend {
            Backend::Local(server) => server.kill(),
            Backend::Galera(node) => node.kill(),
            _ => false,
        }
    }

    /// Starts a local server again after [`Server::kill`], on the same datadir and port, and
    /// waits until it answers; a cluster node recovers its position, rejoins and waits until it
    /// is `Synced`. An error for other backends.
    pub fn restart(&self) -> Result<(), Error> {
        match &self.backend {
            Backend::Local(server) => server.restart(),
            Backend::Galera(node) => node.restart(),
            _ => Err(Error::Config(
                "only a local server or a cluster node can be restarted".into(),
            )),
        }
    }

    /// The process id of a local server or a cluster node while it runs.
    pub fn pid(&self) -> Option<u32> {
        match &self.backend {
            Backend::Local(server) => server.pid(),
            Backend::Galera(node) => node.pid(),
            _ => None,
        }
    }

    /// Where a local server or a cluster node writes its error log.
    pub fn log_path(&self) -> Option<std::path::PathBuf> {
        match &self.backend {
            Backend::Local(server) => Some(server.log_path()),
            Backend::Galera(node) => Some(node.log_path()),
            _ => None,
        }
    }

    fn node(&self) -> Result<&galera::Node, Error> {
        match &self.backend {
            Backend::Galera(node) => Ok(node),
            _ => Err(Error::Config("not a node of a Galera cluster".into())),
        }
    }

    /// SIGSTOP: a local server or a cluster node that stops answering, its peers and
    /// replicas included (a hung host).
    pub fn pause(&self) -> Result<(), Error> {
        self.signal(nix::sys::signal::Signal::SIGSTOP)
    }

    /// SIGCONT after [`Server::pause`].
    pub fn resume(&self) -> Result<(), Error> {
        self.signal(nix::sys::signal::Signal::SIGCONT)
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> Result<(), Error> {
        let sent = match &self.backend {
            Backend::Local(server) => server.signal(signal),
            _ => self.node()?.signal(signal),
        };
        match sent {
            true => Ok(()),
            false => Err(Error::Config("the server is not running".into())),
        }
    }

    /// Cuts a cluster node off from its peers (`gmcast.isolate=1`) and returns once it is
    /// non-Primary (it then refuses applications with 1047), or, with `false`, lets it rejoin
    /// and returns once it is `Synced`.
    pub fn isolate(&self, isolated: bool) -> Result<(), Error> {
        self.node()?.isolate(isolated)
    }

    /// A cluster node's `SHOW GLOBAL STATUS` value, e.g. `wsrep_local_state_comment`.
    pub fn wsrep_status(&self, variable: &str) -> Result<String, Error> {
        self.node()?.status(variable)
    }

    /// A cluster node's network namespace, in a cluster started in namespaces.
    pub fn member(&self) -> Option<&std::sync::Arc<netns::Member>> {
        self.node().ok()?.member()
    }

    /// A local server's or a cluster node's unix socket (for a client in another network
    /// namespace, which cannot reach loopback here).
    pub fn socket(&self) -> Option<std::path::PathBuf> {
        match &self.backend {
            Backend::Local(server) => Some(server.socket()),
            Backend::Galera(node) => Some(node.socket()),
            _ => None,
        }
    }

    /// Waits until a cluster node is `Synced` (after a rejoin, say).
    pub fn wait_synced(&self) -> Result<(), Error> {
        self.node()?.wait_synced()
    }
}

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
                let admin_query = format!("socket={}", node.socket().display());
                let tls = pki.as_ref().map(|pki| Tls {
                    query: Tls::client_query(pki),
                    pki: pki.clone(),
                });
                Server {
                    host: node.host().to_owned(),
                    admin_query,
                    tls,
                    ..Server::loopback_root(node.port(), description, Backend::Galera(node))
                }
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
