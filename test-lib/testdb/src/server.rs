//! A MySQL server a test may use, whichever backend it comes from.

mod accounts;
mod encrypted;

use std::sync::OnceLock;

use crate::at_rest::TESTDB_ENCRYPTED;
#[cfg(feature = "container")]
use crate::container;
use crate::error::Error;
use crate::settings::{
    env, TESTDB_ANNOUNCE, TESTDB_BACKEND, TESTDB_MYSQL_URL, TESTDB_TLS, TLS_NAMES,
};
use crate::{cleanup, galera, local, netns, provision, tls};

/// A MySQL server a test may use.
#[derive(Debug)]
pub struct Server {
    host: String,
    port: u16,
    admin_user: String,
    admin_password: secret::Secret,
    description: String,
    pub(crate) backend: Backend,
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
pub(crate) enum Backend {
    Local(local::LocalServer),
    Existing,
    /// One node of a [`Cluster`].
    Galera(galera::Node),
    /// Held for its `Drop`, which removes the container.
    #[cfg(feature = "container")]
    Container(#[allow(dead_code)] container::ContainerServer),
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
    pub(crate) fn loopback_root(port: u16, description: String, backend: Backend) -> Server {
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
    /// A node of a [`crate::Cluster`], administered over its unix socket.
    pub(crate) fn galera_node(
        node: galera::Node,
        pki: Option<&std::sync::Arc<tls::Pki>>,
        description: String,
    ) -> Server {
        let admin_query = format!("socket={}", node.socket().display());
        let tls = pki.map(|pki| Tls {
            query: Tls::client_query(pki),
            pki: pki.clone(),
        });
        Server {
            host: node.host().to_owned(),
            admin_query,
            tls,
            ..Server::loopback_root(node.port(), description, Backend::Galera(node))
        }
    }

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
        let version = provision::block_on(accounts::server_version(&server))?;
        let server = Server {
            description: format!("{version} (existing server at {host}:{port})"),
            ..server
        };
        provision::block_on(accounts::sweep_leftovers(&server))?;
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
