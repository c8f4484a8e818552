//! The platform's state, all of it in its own MySQL database (`ORBIT_MYSQL_DSN`): tables are
//! created on first start, nothing is ever deleted, and a restart loses nothing.

use std::str::FromStr;
use std::time::Duration;

use orbit_wire::{DeliveryInfo, Subscription, Task};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{Executor, Row};

/// The platform's tables. Times are UTC (`time_zone = '+00:00'`).
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS orbit_namespaces (
        name VARCHAR(128) NOT NULL PRIMARY KEY,
        application VARCHAR(128) NOT NULL,
        environment VARCHAR(128) NOT NULL,
        created_at DATETIME(6) NOT NULL
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS orbit_queues (
        id VARCHAR(128) NOT NULL PRIMARY KEY,
        namespace VARCHAR(128) NOT NULL,
        created_at DATETIME(6) NOT NULL
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS orbit_credentials (
        token_sha256 BINARY(32) NOT NULL PRIMARY KEY,
        namespace VARCHAR(128) NOT NULL,
        scopes VARCHAR(512) NOT NULL,
        queues VARCHAR(2048) NOT NULL,
        created_at DATETIME(6) NOT NULL
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS orbit_tasks (
        id VARCHAR(64) NOT NULL PRIMARY KEY,
        namespace VARCHAR(128) NOT NULL,
        queue_id VARCHAR(128) NOT NULL,
        state VARCHAR(16) NOT NULL,
        version BIGINT UNSIGNED NOT NULL,
        input MEDIUMBLOB NULL,
        result MEDIUMBLOB NULL,
        created_at DATETIME(6) NOT NULL,
        updated_at DATETIME(6) NOT NULL
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS orbit_subscriptions (
        id CHAR(32) NOT NULL PRIMARY KEY,
        namespace VARCHAR(128) NOT NULL,
        queue_id VARCHAR(128) NOT NULL,
        event_types VARCHAR(1024) NOT NULL,
        enabled TINYINT(1) NOT NULL,
        window_size INT UNSIGNED NOT NULL,
        created_at DATETIME(6) NOT NULL,
        KEY by_namespace (namespace)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS orbit_events (
        id CHAR(32) NOT NULL PRIMARY KEY,
        namespace VARCHAR(128) NOT NULL,
        queue_id VARCHAR(128) NOT NULL,
        task_id VARCHAR(64) NOT NULL,
        event_type VARCHAR(64) NOT NULL,
        body MEDIUMBLOB NOT NULL,
        created_at DATETIME(6) NOT NULL
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS orbit_deliveries (
        seq BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
        id CHAR(32) NOT NULL,
        subscription_id CHAR(32) NOT NULL,
        event_id CHAR(32) NOT NULL,
        event_type VARCHAR(64) NOT NULL,
        task_id VARCHAR(64) NOT NULL,
        state VARCHAR(16) NOT NULL,
        attempts INT UNSIGNED NOT NULL,
        budget INT UNSIGNED NOT NULL,
        proof_sha256 BINARY(32) NULL,
        lease_expires_at DATETIME(6) NULL,
        acked_proof_sha256 BINARY(32) NULL,
        acked_at DATETIME(6) NULL,
        created_at DATETIME(6) NOT NULL,
        updated_at DATETIME(6) NOT NULL,
        UNIQUE KEY by_id (id),
        KEY by_acked (subscription_id, acked_at, seq),
        KEY by_subscription (subscription_id, state, seq),
        KEY by_task (subscription_id, task_id, seq),
        KEY by_lease (state, lease_expires_at)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    // With the fault API only: every lease proof ever handed out, as its SHA-256, so that a
    // test can recognise a superseded attempt's proof in a receiver's output.
    "CREATE TABLE IF NOT EXISTS orbit_issued_proofs (
        proof_sha256 BINARY(32) NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB",
];

/// Formats a DATETIME column as RFC 3339 UTC.
pub const TS: &str = "%Y-%m-%dT%H:%i:%s.%fZ";

/// Random lowercase hex from the kernel.
pub fn random_hex(bytes: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("/dev/urandom is readable");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of a secret, the only form secrets are stored in.
pub fn sha256(s: &str) -> Vec<u8> {
    Sha256::digest(s.as_bytes()).to_vec()
}

/// How long `open` waits for the platform database to accept a connection (it may be starting
/// beside orbit-dev).
const OPEN_PATIENCE: Duration = Duration::from_secs(10);

/// Opens the pool and creates the tables if missing. While the database cannot be reached it
/// waits up to [`OPEN_PATIENCE`], saying once a second what it waits for; a refusal that
/// waiting cannot cure (access denied, an unknown database) ends it at once.
pub async fn open(dsn: &str) -> Result<MySqlPool, String> {
    use sqlx::Connection;
    let options = MySqlConnectOptions::from_str(dsn)
        .map_err(|_| "ORBIT_MYSQL_DSN is not a valid mysql:// URL".to_owned())?
        .timezone(Some("+00:00".to_owned()));
    let at = address_of(dsn);
    let started = tokio::time::Instant::now();
    let mut said: Option<tokio::time::Instant> = None;
    loop {
        let attempt = tokio::time::timeout(
            Duration::from_secs(2),
            sqlx::MySqlConnection::connect_with(&options),
        )
        .await;
        let (why, waiting_helps) = match attempt {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                break;
            }
            Ok(Err(e)) => plain_failure(&e, &options),
            Err(_) => (
                endpoint::reach::Unreachable::TimedOut.describe().to_owned(),
                true,
            ),
        };
        let waited = started.elapsed();
        if !waiting_helps || waited >= OPEN_PATIENCE {
            return Err(format!(
                "cannot connect to the platform database at {at}: {why}; check ORBIT_MYSQL_DSN"
            ));
        }
        if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            eprintln!(
                "orbit-dev: waiting for the platform database at {at} ({why}); {} s of {} s",
                waited.as_secs(),
                OPEN_PATIENCE.as_secs()
            );
            said = Some(tokio::time::Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let pool = MySqlPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(|c, _| {
            Box::pin(async move {
                c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await?;
                Ok(())
            })
        })
        .connect_with(options)
        .await
        .map_err(|e| {
            let (why, _) = plain_failure(&e, &MySqlConnectOptions::new());
            format!("cannot connect to the platform database at {at}: {why}; check ORBIT_MYSQL_DSN")
        })?;
    for stmt in SCHEMA {
        pool.execute(*stmt)
            .await
            .map_err(|e| format!("creating the platform tables failed: {e}"))?;
    }
    Ok(pool)
}

/// `host:port` of a DSN, for error lines (never its user or password).
fn address_of(dsn: &str) -> String {
    let rest = dsn.split_once("://").map_or(dsn, |(_, r)| r);
    let (authority, _) = endpoint::split_authority(rest);
    match endpoint::Authority::parse(authority) {
        Ok(a) if a.port().is_some() => a.host_and_port().to_owned(),
        Ok(a) => format!("{}:3306", a.host_and_port()),
        Err(_) => "the address in ORBIT_MYSQL_DSN".to_owned(),
    }
}

/// A failed connection in plain words, and whether waiting may cure it.
fn plain_failure(e: &sqlx::Error, options: &MySqlConnectOptions) -> (String, bool) {
    if let sqlx::Error::Database(d) = e {
        let number = d
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number());
        return match number {
            Some(1045) => (
                format!(
                    "access denied for account `{}`: the server refused its password, or the account may not connect from this host",
                    options.get_username()
                ),
                false,
            ),
            Some(1049 | 1044) => (
                format!(
                    "unknown database `{}`, or the account may not use it",
                    options.get_database().unwrap_or_default()
                ),
                false,
            ),
            // Too many connections, shutting down: a server that will come back.
            Some(1040 | 1053 | 1077) => ("the server is busy or shutting down".into(), true),
            Some(n) => (format!("the server refused the connection (mysql {n})"), false),
            None => ("the server refused the connection".into(), false),
        };
    }
    if let Some(problem) = endpoint::tls::TlsProblem::find(e) {
        return (format!("TLS: {}", problem.describe()), false);
    }
    match endpoint::reach::Unreachable::find(e) {
        Some(cause) => (cause.describe().to_owned(), true),
        None if matches!(e, sqlx::Error::PoolTimedOut) => (
            endpoint::reach::Unreachable::TimedOut.describe().to_owned(),
            true,
        ),
        None => ("the connection failed".into(), true),
    }
}

// Text columns use a binary collation (exact comparison), which the driver reports as binary:
// they are read unchecked, as the UTF-8 they are.

pub fn task_from_row(r: &MySqlRow) -> Result<Task, sqlx::Error> {
    let result: Option<Vec<u8>> = r.try_get("result")?;
    Ok(Task {
        id: r.try_get_unchecked("id")?,
        namespace: r.try_get_unchecked("namespace")?,
        queue_id: r.try_get_unchecked("queue_id")?,
        state: r.try_get_unchecked("state")?,
        version: r.try_get("version")?,
        result: result
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| RawValue::from_string(s).ok()),
        created_at: r.try_get_unchecked("created")?,
        updated_at: r.try_get_unchecked("updated")?,
    })
}

pub const TASK_COLUMNS: &str = "id, namespace, queue_id, state, version, result, \
     DATE_FORMAT(created_at, '%Y-%m-%dT%H:%i:%s.%fZ') AS created, \
     DATE_FORMAT(updated_at, '%Y-%m-%dT%H:%i:%s.%fZ') AS updated";

/// A platform id read back from its column: the platform made it, so a refusal is a decode error.
fn id_column<T: TryFrom<String, Error = orbit_wire::IdentityError>>(
    r: &MySqlRow,
    column: &str,
) -> Result<T, sqlx::Error> {
    T::try_from(r.try_get_unchecked::<String, _>(column)?)
        .map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

pub fn subscription_from_row(r: &MySqlRow) -> Result<Subscription, sqlx::Error> {
    let types: String = r.try_get_unchecked("event_types")?;
    Ok(Subscription {
        id: id_column(r, "id")?,
        namespace: r.try_get_unchecked("namespace")?,
        queue_id: r.try_get_unchecked("queue_id")?,
        event_types: types
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        enabled: r.try_get("enabled")?,
        window: r.try_get("window_size")?,
        created_at: r.try_get_unchecked("created")?,
        lease_ms: None,
    })
}

pub const SUBSCRIPTION_COLUMNS: &str =
    "id, namespace, queue_id, event_types, enabled, window_size, \
     DATE_FORMAT(created_at, '%Y-%m-%dT%H:%i:%s.%fZ') AS created";

pub fn delivery_from_row(r: &MySqlRow) -> Result<DeliveryInfo, sqlx::Error> {
    Ok(DeliveryInfo {
        id: id_column(r, "id")?,
        subscription_id: id_column(r, "subscription_id")?,
        event_id: r.try_get_unchecked("event_id")?,
        event_type: r.try_get_unchecked("event_type")?,
        task_id: r.try_get_unchecked("task_id")?,
        state: r.try_get_unchecked("state")?,
        attempts: r.try_get("attempts")?,
        budget: r.try_get("budget")?,
        lease_expires_at: r.try_get_unchecked("lease_expires")?,
        created_at: r.try_get_unchecked("created")?,
        updated_at: r.try_get_unchecked("updated")?,
        acked_at: r.try_get_unchecked("acked")?,
    })
}

pub const DELIVERY_COLUMNS: &str = "id, subscription_id, event_id, event_type, task_id, state, \
     attempts, budget, \
     DATE_FORMAT(lease_expires_at, '%Y-%m-%dT%H:%i:%s.%fZ') AS lease_expires, \
     DATE_FORMAT(created_at, '%Y-%m-%dT%H:%i:%s.%fZ') AS created, \
     DATE_FORMAT(updated_at, '%Y-%m-%dT%H:%i:%s.%fZ') AS updated, \
     DATE_FORMAT(acked_at, '%Y-%m-%dT%H:%i:%s.%fZ') AS acked";
