//! A MariaDB Galera cluster of local nodes on loopback, for the tests that prove the receiver
//! on a synchronous multi-primary MySQL.
//!
//! The cluster lives in `$TMPDIR/result-inbox-testdb/<pid>-galera-<n>/`, one directory per
//! node (`n1`, `n2`, …) with its own generated `my.cnf`, datadir, socket, temporary directory
//! and error log. What running it here taught:
//! - each node reads only its own `my.cnf` (`--defaults-file`). With `--no-defaults` the state
//!   transfer scripts, which read the configuration themselves, fall back to
//!   `/etc/mysql/my.cnf`, the system server's datadir;
//! - the first node bootstraps (`--wsrep-new-cluster`) on an installed datadir; the others
//!   join on an empty one by rsync state transfer, which as root needs the joiner's datadir
//!   owned by `nobody:nogroup`;
//! - a node restarted after SIGKILL first recovers its position (`--wsrep-recover`), then starts
//!   from it (`--wsrep-start-position`) and catches up by incremental state transfer.
//!
//! Every node listens on 127.0.0.1 only (SQL, group communication, IST and SST ports), dies
//! with the test process, and is removed like a local server (`cleanup.rs`). In network
//! namespaces ([`start`] with a [`Net`]) each node runs in a namespace of its own and listens
//! on its address on the run's bridge, on the standard ports; the harness administers every
//! node over its unix socket, which no cut of the network reaches.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use sqlx::{Connection, Executor, MySqlConnection, Row};

use crate::cleanup::{register, root_dir, sweep_leftovers, Cleanup};
use crate::error::Error;
use crate::local::{find_program, free_loopback_port, tail, LocalServer, Program};
use crate::netns::{Member, Net};
use crate::process::{is_root, spawn_long_lived, Running};
use crate::provision;
use crate::tls::{CertFiles, Pki};

/// Names the Galera provider library, when it is not in one of [`PROVIDER_PATHS`].
pub const TESTDB_GALERA_PROVIDER: &str = "TESTDB_GALERA_PROVIDER";
/// Where Debian's `galera-4` puts the provider.
pub const PROVIDER_PATHS: [&str; 2] = [
    "/usr/lib/galera/libgalera_smm.so",
    "/usr/lib/libgalera_smm.so",
];
/// How long a node has to reach `Synced` (a state transfer included).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(120);

/// The Galera provider library, or why there is none.
pub fn provider() -> Result<PathBuf, Error> {
    if let Some(path) = crate::settings::env(TESTDB_GALERA_PROVIDER) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::NoServerProgram(format!(
                "{TESTDB_GALERA_PROVIDER} names {}, which is not a file",
                path.display()
            )))
        };
    }
    PROVIDER_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::NoServerProgram(format!(
                "no Galera provider: libgalera_smm.so is in none of {}; install Debian's galera-4 and rsync (scripts/install-deps does), or set {TESTDB_GALERA_PROVIDER}",
                PROVIDER_PATHS.join(", ")
            ))
        })
}

/// The four ports of one node.
#[derive(Debug, Clone, Copy)]
struct Ports {
    sql: u16,
    gcomm: u16,
    ist: u16,
    sst: u16,
}

/// One node: its process, its directory and its ports.
#[derive(Debug)]
pub(crate) struct Node {
    child: Running,
    program: Program,
    dir: PathBuf,
    name: String,
    /// Where it listens: `127.0.0.1`, or its address in its namespace.
    host: String,
    ports: Ports,
    /// Its namespace, in a cluster in network namespaces.
    member: Option<Arc<Member>>,
    /// In namespaces: its certificate (for its address) and the CA's, for TLS from clients.
    tls: Option<(CertFiles, PathBuf)>,
}

impl Node {
    fn config(&self) -> PathBuf {
        self.dir.join("my.cnf")
    }

    pub(crate) fn port(&self) -> u16 {
        self.ports.sql
    }

    /// Where its SQL port listens.
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// Its unix socket, over which the harness administers it.
    pub(crate) fn socket(&self) -> PathBuf {
        self.dir.join("mysqld.sock")
    }

    /// Its namespace, in a cluster in network namespaces.
    pub(crate) fn member(&self) -> Option<&Arc<Member>> {
        self.member.as_ref()
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.join("error.log")
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn write_config(
        &self,
        cluster: &str,
        peers: &str,
        provider: &Path,
        flush: u8,
    ) -> Result<(), std::io::Error> {
        let d = self.dir.display();
        let Ports {
            sql,
            gcomm,
            ist,
            sst,
        } = self.ports;
        let user = if is_root() { "user=root\n" } else { "" };
        let h = &self.host;
        // rsync's state transfer would take the server's TLS files as a wish for an encrypted
        // transfer (stunnel); node to node stays on the run's bridge in clear.
        let sst_section = if self.tls.is_some() {
            "[sst]\nssl-mode=DISABLED\n"
        } else {
            ""
        };
        let tls = self.tls.as_ref().map_or(String::new(), |(files, ca)| {
            format!(
                "ssl-ca={}\nssl-cert={}\nssl-key={}\n",
                ca.display(),
                files.cert.display(),
                files.key.display()
            )
        });
        let text = format!(
            "# Generated by testdb for one node of a throwaway Galera cluster.\n\
             [mysqld]\n\
             datadir={d}/data\n\
             tmpdir={d}/tmp\n\
             socket={d}/mysqld.sock\n\
             pid-file={d}/server.pid\n\
             log-error={d}/error.log\n\
             port={sql}\n\
             bind-address={h}\n\
             {user}\
             {tls}\
             innodb_buffer_pool_size=64M\n\
             max_connections=300\n\
             binlog_format=ROW\n\
             default_storage_engine=InnoDB\n\
             innodb_autoinc_lock_mode=2\n\
             innodb_flush_log_at_trx_commit={flush}\n\
             wsrep_on=ON\n\
             wsrep_provider={provider}\n\
             wsrep_cluster_name={cluster}\n\
             wsrep_cluster_address=gcomm://{peers}\n\
             wsrep_node_name={name}\n\
             wsrep_node_address={h}:{gcomm}\n\
             wsrep_node_incoming_address={h}:{sql}\n\
             wsrep_sst_method=rsync\n\
             wsrep_sst_receive_address={h}:{sst}\n\
             wsrep_provider_options=\"base_host={h};base_port={gcomm};ist.recv_addr={h}:{ist};gcache.size=64M\"\n\
             {sst_section}",
            provider = provider.display(),
            name = self.name,
        );
        fs::write(self.config(), text)
    }

    /// Starts the node's server with `extra` arguments after its configuration.
    fn spawn(&self, extra: &[String]) -> Result<(), Error> {
        let mut cmd = Command::new(&self.program.server);
        cmd.arg(format!("--defaults-file={}", self.config().display()))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(member) = &self.member {
            member.enter(&mut cmd);
        }
        let child = spawn_long_lived(cmd).map_err(Error::io(format!(
            "cannot start {} for {}",
            self.program.server.display(),
            self.name
        )))?;
        register(Cleanup::Process {
            pid: child.id(),
            dir: self.dir.clone(),
        });
        self.child.set(child);
        Ok(())
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    /// SIGKILL and reap; returns whether the node was running.
    pub(crate) fn kill(&self) -> bool {
        self.child
            .kill()
            .inspect(|pid| crate::cleanup::unregister_pid(*pid))
            .is_some()
    }

    /// Sends `sig` to the running node; returns whether there was one.
    pub(crate) fn signal(&self, sig: Signal) -> bool {
        match self.pid().and_then(|p| i32::try_from(p).ok()) {
            Some(pid) => signal::kill(Pid::from_raw(pid), sig).is_ok(),
            None => false,
        }
    }

    fn exited(&self) -> Option<std::process::ExitStatus> {
        self.child.exited()
    }

    fn admin_url(&self) -> secret::Secret {
        provision::url(
            "root",
            "",
            "localhost",
            None,
            &format!("socket={}", self.socket().display()),
        )
    }

    /// A `SHOW GLOBAL STATUS` value of the node, when it answers.
    pub(crate) fn status(&self, variable: &str) -> Result<String, Error> {
        let url = self.admin_url();
        let query = format!("SHOW GLOBAL STATUS LIKE '{variable}'");
        provision::block_on(async move {
            let mut conn = MySqlConnection::connect(url.expose())
                .await
                .map_err(Error::sql("cannot connect to the node"))?;
            let row = sqlx::query(&query)
                .fetch_optional(&mut conn)
                .await
                .map_err(Error::sql(format!("`{query}` failed")))?;
            let _ = conn.close().await;
            Ok(row
                .and_then(|r| r.try_get::<String, _>(1).ok())
                .unwrap_or_default())
        })
    }

    fn status_is(&self, variable: &str, value: &str) -> bool {
        self.status(variable).is_ok_and(|v| v == value)
    }

    /// Runs one administrative statement on the node.
    pub(crate) fn execute(&self, statement: &str) -> Result<(), Error> {
        let url = self.admin_url();
        let statement = statement.to_owned();
        provision::block_on(async move {
            let mut conn = MySqlConnection::connect(url.expose())
                .await
                .map_err(Error::sql("cannot connect to the node"))?;
            conn.execute(statement.as_str())
                .await
                .map_err(Error::sql(format!("`{statement}` failed")))?;
            let _ = conn.close().await;
            Ok(())
        })
    }

    /// Waits until `done` holds for the node's status, failing fast if the node exits.
    pub(crate) fn wait_for(
        &self,
        what: &str,
        within: Duration,
        done: impl Fn(&Node) -> bool,
    ) -> Result<(), Error> {
        let start = Instant::now();
        let mut announced = false;
        loop {
            if let Some(status) = self.exited() {
                return Err(Error::Server {
                    what: format!("{} exited while waiting until {what} ({status})", self.name),
                    log: self.log_path(),
                    tail: tail(&self.log_path(), 3000),
                });
            }
            if done(self) {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited > within {
                return Err(Error::Server {
                    what: format!(
                        "{} on {}:{} did not reach {what} within {within:?}",
                        self.name, self.host, self.ports.sql
                    ),
                    log: self.log_path(),
                    tail: tail(&self.log_path(), 3000),
                });
            }
            if waited > Duration::from_secs(15) && !announced {
                eprintln!(
                    "testdb: still waiting until {} on {}:{} is {what} (log: {})",
                    self.name,
                    self.host,
                    self.ports.sql,
                    self.log_path().display()
                );
                announced = true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the node is `Synced` with the cluster, ready for applications.
    pub(crate) fn wait_synced(&self) -> Result<(), Error> {
        self.wait_for("Synced", SYNC_TIMEOUT, |n| {
            n.status_is("wsrep_local_state_comment", "Synced") && n.status_is("wsrep_ready", "ON")
        })
    }

    /// Cuts the node off from its peers (`gmcast.isolate`), or lets it rejoin; returns once it
    /// is non-Primary, or `Synced` again.
    pub(crate) fn isolate(&self, isolated: bool) -> Result<(), Error> {
        self.execute(&format!(
            "SET GLOBAL wsrep_provider_options = 'gmcast.isolate={}'",
            u8::from(isolated)
        ))?;
        if isolated {
            self.wait_for("non-Primary", SYNC_TIMEOUT, |n| {
                n.status_is("wsrep_cluster_status", "non-Primary")
            })
        } else {
            self.wait_synced()
        }
    }

    /// The position a killed node recovers from its datadir (`uuid:seqno`).
    fn recover_position(&self) -> Result<String, Error> {
        let log = self.dir.join("recover.log");
        let _ = fs::remove_file(&log);
        let status = Command::new(&self.program.server)
            .arg(format!("--defaults-file={}", self.config().display()))
            .arg("--wsrep-recover")
            .arg(format!("--log-error={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(Error::io("cannot run the server with --wsrep-recover"))?;
        let text = fs::read_to_string(&log).unwrap_or_default();
        let position = text
            .lines()
            .filter_map(|l| l.split("Recovered position: ").nth(1))
            .next_back()
            .map(|p| p.trim().to_owned());
        match position {
            Some(p) if status.success() => Ok(p),
            _ => Err(Error::Server {
                what: format!(
                    "{}: --wsrep-recover found no position ({status})",
                    self.name
                ),
                tail: tail(&log, 2000),
                log,
            }),
        }
    }

    /// Starts a killed node again from its recovered position and waits until it is `Synced`.
    pub(crate) fn restart(&self) -> Result<(), Error> {
        self.kill();
        let position = self.recover_position()?;
        self.spawn(&[format!("--wsrep-start-position={position}")])?;
        self.wait_synced()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The nodes of a cluster, in order, and where they live.
#[derive(Debug)]
pub(crate) struct Nodes {
    pub(crate) nodes: Vec<Node>,
    pub(crate) dir: PathBuf,
    /// In namespaces: the CA of the nodes' certificates.
    pub(crate) pki: Option<Arc<Pki>>,
}

/// Starts `count` nodes: the first bootstraps, the others join it at once, by state transfer.
/// With `net`, each node runs in a new member namespace of it (`node1`, …).
/// `flush` is each node's `innodb_flush_log_at_trx_commit`: 1 (what testdb runs, and what a
/// user must keep: every commit on disk before the node answers) or a relaxed 0 or 2, for a
/// run that measures what they lose.
pub(crate) fn start(count: usize, net: Option<&Net>, flush: u8) -> Result<Nodes, Error> {
    if count == 0 {
        return Err(Error::Config("a cluster needs at least one node".into()));
    }
    let provider = provider()?;
    let program = find_program()?;
    if !program.mariadb {
        return Err(Error::NoServerProgram(format!(
            "{} is not MariaDB's server: the Galera cluster needs mariadbd",
            program.server.display()
        )));
    }
    let root = root_dir();
    fs::create_dir_all(&root).map_err(Error::io(format!("cannot create {}", root.display())))?;
    sweep_leftovers(&root);
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let tag = format!(
        "{}-galera-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    );
    let dir = root.join(&tag);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(Error::io(format!("cannot create {}", dir.display())))?;
    fs::write(dir.join("owner.pid"), std::process::id().to_string())
        .map_err(Error::io(format!("cannot write in {}", dir.display())))?;
    // A cluster held in a static never drops: the directory goes at exit, after the nodes.
    register(Cleanup::Dir(dir.clone()));
    let result = start_in(&dir, &tag, count, &program, &provider, net, flush);
    match result {
        Ok((nodes, pki)) => Ok(Nodes { nodes, dir, pki }),
        Err(e) => {
            let _ = fs::remove_dir_all(&dir);
            Err(e)
        }
    }
}

fn start_in(
    dir: &Path,
    tag: &str,
    count: usize,
    program: &Program,
    provider: &Path,
    net: Option<&Net>,
    flush: u8,
) -> Result<(Vec<Node>, Option<Arc<Pki>>), Error> {
    // Clients on the bridge are not on loopback: they speak TLS, verified against the address.
    let pki = match net {
        Some(_) => Some(Arc::new(Pki::generate(&dir.join("tls"))?)),
        None => None,
    };
    let mut nodes = Vec::with_capacity(count);
    for i in 1..=count {
        let node_dir = dir.join(format!("n{i}"));
        fs::create_dir_all(node_dir.join("tmp"))
            .map_err(Error::io(format!("cannot create {}", node_dir.display())))?;
        let name = format!("node{i}");
        let (host, ports, member) = match net {
            // Each namespace has ports of its own: the standard ones.
            Some(net) => {
                let member = net.add(&name)?;
                let ports = Ports {
                    sql: 3306,
                    gcomm: 4567,
                    ist: 4568,
                    sst: 4444,
                };
                (member.addr().to_string(), ports, Some(member))
            }
            None => {
                let ports = Ports {
                    sql: free_loopback_port()?,
                    gcomm: free_loopback_port()?,
                    ist: free_loopback_port()?,
                    sst: free_loopback_port()?,
                };
                ("127.0.0.1".to_owned(), ports, None)
            }
        };
        let tls = match &pki {
            Some(pki) => Some((pki.server(&name, &[&host])?, pki.ca.clone())),
            None => None,
        };
        nodes.push(Node {
            child: Running::default(),
            program: program.clone(),
            dir: node_dir,
            name,
            host,
            ports,
            member,
            tls,
        });
    }
    // Before a node's first packet: every peer is on the run's bridge, seen from its namespace.
    if let Some(net) = net {
        for node in &nodes {
            for peer in &nodes {
                if let (Some(from), Some(to)) = (&node.member, &peer.member) {
                    if !Arc::ptr_eq(from, to) {
                        net.check_route(Some(from), to.addr())?;
                    }
                }
            }
        }
    }
    let peers = nodes
        .iter()
        .map(|n| format!("{}:{}", n.host, n.ports.gcomm))
        .collect::<Vec<_>>()
        .join(",");
    for node in &nodes {
        node.write_config(tag, &peers, provider, flush)
            .map_err(Error::io(format!(
                "cannot write {}",
                node.config().display()
            )))?;
    }
    let (first, joiners) = nodes.split_first().expect("at least one node");
    LocalServer::install(program, &first.dir)?;
    first.spawn(&["--wsrep-new-cluster".to_owned()])?;
    first.wait_synced()?;
    for node in joiners {
        let data = node.dir.join("data");
        fs::create_dir_all(&data)
            .map_err(Error::io(format!("cannot create {}", data.display())))?;
        if is_root() {
            hand_to_nobody(&data)?;
        }
        node.spawn(&[])?;
    }
    for node in joiners {
        node.wait_synced()?;
    }
    Ok((nodes, pki))
}

/// rsync's state transfer, run as root, writes the joiner's datadir as `nobody`.
fn hand_to_nobody(dir: &Path) -> Result<(), Error> {
    let user = nix::unistd::User::from_name("nobody")
        .ok()
        .flatten()
        .ok_or_else(|| Error::Config("no user `nobody` on this machine".into()))?;
    let group = nix::unistd::Group::from_name("nogroup")
        .ok()
        .flatten()
        .map(|g| g.gid)
        .unwrap_or(user.gid);
    nix::unistd::chown(dir, Some(user.uid), Some(group))
        .map_err(|e| Error::io(format!("cannot chown {}", dir.display()))(e.into()))
}
