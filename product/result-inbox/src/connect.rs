//! How every connection to the receiver's database is opened: its options (the session time
//! zone) and the bound on waiting for it. The store's pool, `init`, `prune` and the operator
//! tools all open theirs here, so a failure to connect is worded the same everywhere.

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};

use crate::dsn::Dsn;
use crate::error::StorageError;

/// How long a new connection (and [`crate::store::Store::connect`]) waits for the server's answer to its first query.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The session time zone of every store connection: times are stored as UTC.
pub const SESSION_TIME_ZONE: &str = "+00:00";

/// Connection options every store connection gets: UTC session time zone (READ COMMITTED is
/// set once the connection is open).
pub fn connect_options(dsn: &Dsn) -> Result<MySqlConnectOptions, StorageError> {
    let options = MySqlConnectOptions::from_str(dsn.expose_url())
        .map_err(|_| StorageError::unexpected("the DSN is not a valid MySQL URL"))?;
    Ok(options.timezone(Some(SESSION_TIME_ZONE.to_owned())))
}

/// Opens one connection on `dsn` with [`connect_options`], within [`CONNECT_TIMEOUT`]. A failure
/// names the server, the account where it matters and the setting to check
/// ([`StorageError::for_dsn`]): what every command that needs one connection reports.
pub async fn connect_one(dsn: &Dsn) -> Result<MySqlConnection, StorageError> {
    let options = connect_options(dsn)?;
    use sqlx::Connection;
    match tokio::time::timeout(CONNECT_TIMEOUT, MySqlConnection::connect_with(&options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(StorageError::from_sqlx(&e).for_dsn(dsn)),
        Err(_) => Err(StorageError::timed_out().for_dsn(dsn)),
    }
}
