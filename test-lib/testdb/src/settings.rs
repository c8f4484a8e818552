//! The harness's own settings: the `TESTDB_*` variables every backend reads, and how they are
//! read.

use std::time::Duration;

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

#[allow(clippy::disallowed_methods)] // the harness reads its own variables, not the receiver's
pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}
