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
mod cluster;
mod error;
pub mod forward;
mod galera;
mod leftovers;
mod local;
pub mod netns;
mod process;
mod provision;
pub mod replication;
mod server;
mod settings;
pub mod tls;

#[cfg(feature = "container")]
mod container;
#[cfg(feature = "container")]
pub use container::{DEFAULT_IMAGE, TESTDB_CONTAINER_IMAGE, TESTDB_CONTAINER_WAIT};

pub use at_rest::{
    server_options as encryption_options, write_key_file, Backup, ENCRYPTED_NOTE, TESTDB_ENCRYPTED,
};
pub use cluster::Cluster;
pub use error::Error;
pub use forward::Forwarder;
pub use galera::{provider as galera_provider, PROVIDER_PATHS, TESTDB_GALERA_PROVIDER};
pub use provision::{Account, Provisioned};
pub use replication::{ReplicationOptions, Topology};
pub use server::Server;
pub use settings::{
    READY_TIMEOUT, TESTDB_ANNOUNCE, TESTDB_BACKEND, TESTDB_MYSQL_URL, TESTDB_TLS, TLS_NAMES,
};

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
