//! Why an apply did not succeed: the errors a caller matches, each with a stable lowercase
//! `kind()` for log lines and tests. A database failure is described by its error number,
//! SQLSTATE and our own words, never by the server's message text (which can quote data) and
//! never with the DSN.

use std::fmt;
use std::time::Duration;

use endpoint::reach::Unreachable;
use endpoint::tls::TlsProblem;
use sqlx::mysql::MySqlDatabaseError;

use crate::event::Rejection;
use canonical_form::Digest;

pub(crate) const ER_DUP_ENTRY: u16 = 1062;
pub(crate) const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
pub(crate) const ER_LOCK_DEADLOCK: u16 = 1213;
/// "Connections using insecure transport are prohibited" (MySQL). MariaDB 10.11 refuses the
/// same connection as access denied (1045), which [`StorageError::for_dsn`] explains.
const ER_SECURE_TRANSPORT_REQUIRED: u16 = 3159;
/// "The server is running with the --read-only option": a demoted primary, or a replica.
pub(crate) const ER_OPTION_PREVENTS_STATEMENT: u16 = 1290;
/// "Cannot execute statement in a READ ONLY transaction".
pub(crate) const ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: u16 = 1792;
/// MySQL 8: "Running in read-only mode" (`super_read_only`, a read-only InnoDB).
pub(crate) const ER_READ_ONLY_MODE: u16 = 1836;

/// Which conflict: the platform sent something that contradicts what is already recorded.
/// Redelivery will not fix it; a person must look at the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// Same consumer, queue and event id, different canonical content.
    DigestMismatch { stored: Digest, delivered: Digest },
    /// Same task and version as the view's, but another event id.
    SameVersionOtherEvent {
        version: u64,
        recorded_event: String,
    },
}

impl Conflict {
    /// The stable lowercase name.
    pub fn kind(&self) -> &'static str {
        match self {
            Conflict::DigestMismatch { .. } => "digest_mismatch",
            Conflict::SameVersionOtherEvent { .. } => "same_version_other_event",
        }
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::DigestMismatch { stored, delivered } => write!(
                f,
                "digest_mismatch: the event id is already recorded with other content (stored sha256 {stored}, delivered {delivered})"
            ),
            Conflict::SameVersionOtherEvent {
                version,
                recorded_event,
            } => write!(
                f,
                "same_version_other_event: version {version} of this task was already applied by event {recorded_event}"
            ),
        }
    }
}

/// A database failure, described without the server's message text (which can quote data)
/// and without the DSN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageError {
    kind: StorageKind,
    number: Option<u16>,
    sqlstate: Option<String>,
    /// What else the refusal may mean, given the DSN ([`StorageError::for_dsn`]).
    hint: Option<&'static str>,
    /// What stopped the connection, when it never reached the server or broke.
    cause: Option<Unreachable>,
    /// Where it was going, once [`StorageError::for_dsn`] knows: error lines at a connect name
    /// the server and the setting to check.
    place: Option<Box<Place>>,
}

/// The server and account a failed connection was for, and the setting that named them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Place {
    address: String,
    account: String,
    origin: &'static str,
}

/// The kinds of storage failure a caller acts on differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageKind {
    /// 1213: retry the whole transaction.
    Deadlock,
    /// 1205: retry the whole transaction.
    LockWaitTimeout,
    /// The server could not be reached, or the connection broke before COMMIT was sent
    /// (Galera's 1047 and 1180 included: a node not ready, a failed commit on a node).
    Unavailable,
    /// The server did not answer a probe in time (it may be stopped or overloaded).
    NotAnswering,
    /// The server refuses writes: 1290 (`--read-only`), 1792 (a read-only transaction),
    /// MySQL's 1836, or a health probe that read `@@global.read_only` = 1. A demoted primary
    /// after a failover, or a replica behind the DSN's address: waiting for the address to
    /// reach the writable primary cures it, so it holds deliveries like an outage. Classified
    /// by error number only (MariaDB 12 changed 1290's text). The connection that met it is
    /// closed, never reused: a pool that keeps connections to a demoted primary keeps writing
    /// to it.
    ReadOnly,
    /// A store that requires a replica's acknowledgement: the primary reports that no replica acknowledges its
    /// commits (semi-synchronous replication is off, or fell back to asynchronous), so a
    /// commit it confirms may exist on that one server only. Nothing may be ACKed on it.
    Unreplicated,
    /// The replica-acknowledgement requirement cannot be honoured on this server (why): no
    /// semi-synchronous replication, not enabled, or a wait point other than `AFTER_SYNC`.
    /// Waiting will not help; the server's settings or the requirement must change.
    ReplicaAckUnsupported(&'static str),
    /// The receiver's tables are missing (run `receiver init`).
    SchemaMissing,
    /// The schema's version does not fit this build (`crate::version`): newer than it knows,
    /// older than it runs on, or not readable by the account.
    Schema(crate::version::Mismatch),
    /// The server refused the account's user name and password (1045).
    AccessDenied,
    /// The connection's TLS failed: an untrusted or misnamed server certificate, a refused
    /// client certificate, a server without TLS, or a server that refuses plain TCP. Trying
    /// again will not help; the DSN's `ssl-*` parameters or the server's certificate must
    /// change.
    Tls(TlsProblem),
    /// The account lacks a privilege it needs.
    PermissionDenied,
    /// Any other error the server reported.
    Server,
    /// The server answered something the store did not expect.
    Unexpected(&'static str),
}

impl StorageError {
    pub(crate) fn unexpected(what: &'static str) -> Self {
        StorageError {
            kind: StorageKind::Unexpected(what),
            number: None,
            sqlstate: None,
            hint: None,
            cause: None,
            place: None,
        }
    }

    /// A connection that was not made within its time.
    pub(crate) fn timed_out() -> Self {
        let mut e = Self::of_kind(StorageKind::Unavailable);
        e.cause = Some(Unreachable::TimedOut);
        e
    }

    pub(crate) fn not_answering() -> Self {
        Self::of_kind(StorageKind::NotAnswering)
    }

    /// A failure of `kind` found by reading the server's state, with no error number.
    pub(crate) fn of_kind(kind: StorageKind) -> Self {
        StorageError {
            kind,
            number: None,
            sqlstate: None,
            hint: None,
            cause: None,
            place: None,
        }
    }

    /// This error as another kind, its error number and SQLSTATE kept.
    pub(crate) fn with_kind(mut self, kind: StorageKind) -> Self {
        self.kind = kind;
        self
    }

    /// This error with `hint` after its text.
    pub(crate) fn with_hint(mut self, hint: &'static str) -> Self {
        self.hint = Some(hint);
        self
    }

    /// A refused connection, read with what the DSN asked for: a server that requires TLS
    /// refuses plain TCP, and an account that requires a client certificate refuses one
    /// without, with the same "access denied" (1045) as a wrong password. The hint is given
    /// only where the DSN makes it likely: TLS turned off, or TLS asked for without a client
    /// certificate; a plain wrong password on a loopback DSN reads as before.
    pub(crate) fn for_dsn(mut self, dsn: &crate::dsn::Dsn) -> Self {
        self.place = Some(Box::new(Place {
            address: dsn.address().to_owned(),
            account: dsn.user().to_owned(),
            origin: dsn.origin(),
        }));
        if self.kind == StorageKind::AccessDenied {
            self.hint = if dsn.tls_disabled() {
                Some("or, as the DSN sets ssl-mode=DISABLED, the server requires TLS: use ssl-mode=VERIFY_IDENTITY and ssl-ca")
            } else if dsn.requires_tls() && !dsn.has_client_certificate() {
                Some("or the account requires a client certificate (REQUIRE X509): add ssl-cert and ssl-key")
            } else {
                None
            };
        }
        self
    }

    /// Classifies a driver error. Only the error number and SQLSTATE are kept.
    pub fn from_sqlx(e: &sqlx::Error) -> Self {
        let mut number = None;
        let mut sqlstate = None;
        let cause = match e {
            sqlx::Error::Io(io) => Unreachable::find(io),
            _ => None,
        };
        let kind = match e {
            sqlx::Error::Database(db) => {
                sqlstate = db.code().map(|c| c.into_owned());
                number = db
                    .try_downcast_ref::<MySqlDatabaseError>()
                    .map(MySqlDatabaseError::number);
                match number {
                    Some(ER_LOCK_DEADLOCK) => StorageKind::Deadlock,
                    Some(ER_LOCK_WAIT_TIMEOUT) => StorageKind::LockWaitTimeout,
                    Some(1146) => StorageKind::SchemaMissing,
                    Some(ER_SECURE_TRANSPORT_REQUIRED) => StorageKind::Tls(TlsProblem::Required),
                    Some(1045) => StorageKind::AccessDenied,
                    Some(
                        ER_OPTION_PREVENTS_STATEMENT
                        | ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
                        | ER_READ_ONLY_MODE,
                    ) => StorageKind::ReadOnly,
                    Some(1044 | 1142 | 1143 | 1227) => StorageKind::PermissionDenied,
                    // Too many connections, server shutting down, connection killed
                    // (MariaDB's 1927, MySQL's 3169), disconnected for inactivity (4031).
                    // Galera: 1047 (the node is not ready), 1180 (commit failed on the node).
                    Some(1040 | 1047 | 1053 | 1077 | 1180 | 1927 | 3169 | 4031) => {
                        StorageKind::Unavailable
                    }
                    _ => StorageKind::Server,
                }
            }
            // A handshake that failed on a certificate arrives as an I/O error wrapping
            // rustls's; a server without TLS under a DSN that requires it, as `Tls`.
            sqlx::Error::Io(io) if TlsProblem::find(io).is_some() => {
                StorageKind::Tls(TlsProblem::find(io).unwrap_or(TlsProblem::Handshake))
            }
            sqlx::Error::Tls(e) => StorageKind::Tls(TlsProblem::find(e.as_ref()).unwrap_or(
                if e.to_string().contains("not support TLS") {
                    TlsProblem::NoTls
                } else {
                    TlsProblem::Handshake
                },
            )),
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => StorageKind::Unavailable,
            sqlx::Error::Protocol(_) => StorageKind::Unexpected("protocol error"),
            sqlx::Error::Configuration(_) => StorageKind::Unexpected("invalid connection options"),
            sqlx::Error::RowNotFound => StorageKind::Unexpected("row not found"),
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
                StorageKind::Unexpected("a column did not decode")
            }
            _ => StorageKind::Unexpected("driver error"),
        };
        StorageError {
            kind,
            number,
            sqlstate,
            hint: None,
            cause,
            place: None,
        }
    }

    /// What kind of failure.
    pub fn kind(&self) -> StorageKind {
        self.kind
    }

    /// The MySQL error number, when the server sent one.
    pub fn number(&self) -> Option<u16> {
        self.number
    }

    /// Whether running the same apply again can succeed without anyone changing anything.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            StorageKind::Deadlock
                | StorageKind::LockWaitTimeout
                | StorageKind::Unavailable
                | StorageKind::NotAnswering
                | StorageKind::ReadOnly
        )
    }

    /// Whether the failure says the database as a whole cannot be used right now (rather
    /// than this one transaction failing): what a consumer should hold back new work for.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self.kind,
            StorageKind::Unavailable
                | StorageKind::NotAnswering
                | StorageKind::ReadOnly
                | StorageKind::Unreplicated
        )
    }

    /// Whether the connection that met this error must be closed rather than reused: it broke,
    /// or it leads to a server that refuses writes (the next connection may reach the new
    /// primary; this one never will).
    pub fn discards_connection(&self) -> bool {
        matches!(self.kind, StorageKind::Unavailable | StorageKind::ReadOnly)
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A schema that does not fit is no fault of the address or the setting.
        let place = self
            .place
            .as_deref()
            .filter(|_| !matches!(self.kind, StorageKind::Schema(_)));
        // At a connect, the line starts with where it went: `127.0.0.1:3306: connection
        // refused: …; check ORBIT_RECEIVER_DSN`.
        if let Some(p) = place {
            match self.kind {
                StorageKind::AccessDenied => write!(
                    f,
                    "access denied for account `{}` at {}",
                    p.account, p.address
                )?,
                _ => write!(f, "{}: ", p.address)?,
            }
        }
        let what = match self.kind {
            StorageKind::Deadlock => "deadlock: the transaction was rolled back",
            StorageKind::LockWaitTimeout => {
                "lock wait timeout: another transaction held a row too long"
            }
            StorageKind::Unavailable => match (self.cause, place) {
                (Some(cause), Some(_)) => cause.describe(),
                (Some(cause), None) => {
                    write!(f, "database unavailable: ")?;
                    cause.describe()
                }
                (None, Some(_)) => "the database is unavailable",
                (None, None) => "database unavailable",
            },
            StorageKind::NotAnswering if place.is_some() => {
                "the server accepted the connection but did not answer in time"
            }
            StorageKind::NotAnswering => "database not answering",
            StorageKind::ReadOnly => {
                "database read-only (a demoted primary, or a replica): it refuses writes"
            }
            StorageKind::Unreplicated => {
                "no replica acknowledges the primary's commits (semi-synchronous replication is off): nothing is ACKed until one does"
            }
            StorageKind::SchemaMissing => {
                "receiver tables missing: run `receiver init` against this database"
            }
            StorageKind::Schema(mismatch) => {
                write!(f, "{mismatch}")?;
                ""
            }
            StorageKind::AccessDenied if place.is_some() => {
                ": the server refused its password, or the account may not connect from this host"
            }
            StorageKind::AccessDenied => {
                "access denied: the server refused the DSN's user name or password"
            }
            StorageKind::Tls(problem) => {
                let check = match problem {
                    TlsProblem::UntrustedCertificate => "check the DSN's ssl-ca",
                    TlsProblem::NameMismatch => {
                        "connect by a host name or address the certificate carries"
                    }
                    TlsProblem::Expired => "the server needs a new certificate",
                    TlsProblem::ClientCertificateRefused => "check the DSN's ssl-cert and ssl-key",
                    TlsProblem::NoTls => "enable TLS on the server, or use a server that has it",
                    TlsProblem::Required => "add ssl-mode=VERIFY_IDENTITY and ssl-ca to the DSN",
                    TlsProblem::Handshake => {
                        "check the DSN's ssl-* parameters and the server's TLS"
                    }
                };
                write!(f, "TLS: {}: ", problem.describe())?;
                check
            }
            StorageKind::ReplicaAckUnsupported(why) => {
                write!(f, "the replica acknowledgement required cannot be honoured: ")?;
                why
            }
            StorageKind::PermissionDenied => {
                "permission denied: see schema/grants.sql for what the account needs"
            }
            StorageKind::Server => "server error",
            StorageKind::Unexpected(what) => what,
        };
        f.write_str(what)?;
        match (self.number, &self.sqlstate) {
            (Some(n), Some(s)) => write!(f, " (mysql {n}, SQLSTATE {s})")?,
            (Some(n), None) => write!(f, " (mysql {n})")?,
            _ => {}
        }
        if let Some(hint) = self.hint {
            write!(f, "; {hint}")?;
        }
        match place {
            Some(p) => write!(f, "; check {}", p.origin),
            None => Ok(()),
        }
    }
}

impl std::error::Error for StorageError {}

/// The error a caller's write returns.
pub type WriteError = Box<dyn std::error::Error + Send + Sync>;

/// Why an apply did not succeed. None of these may be ACKed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The event is invalid for this receiver; nothing touched the database.
    #[error("rejected: {0}")]
    Rejected(Rejection),
    /// The event contradicts what is recorded; nothing changed.
    #[error("conflict: {0}")]
    Conflict(Conflict),
    /// COMMIT was sent and no answer came. The data may or may not be committed; applying the
    /// same event again finds out (duplicate if it was, applied afresh if not).
    #[error("commit_unconfirmed: COMMIT was sent but its outcome is unknown; apply the event again to resolve it")]
    CommitUnconfirmed,
    /// The apply ran out of its time budget before COMMIT was sent; nothing was committed.
    // No duration in the text: the log line that carries it has the one that counts
    // (`duration_ms`, from the delivery's arrival); the budget is the variant's value.
    #[error("timeout: the apply ran out of its time budget before COMMIT; nothing was committed")]
    Timeout(Duration),
    /// Committed (with this outcome) on a primary that reports no replica acknowledging its
    /// commits, then or within the apply's budget (`StoreOptions::require_replica_ack`): the
    /// transaction may exist on that one server only, so it must not be ACKed. A redelivery
    /// finds it as a duplicate, and is ACKed once a replica has it.
    #[error("unreplicated: committed, but no replica acknowledges the primary's commits (semi-synchronous replication is off); not ACKed until one does")]
    Unreplicated(crate::outcome::Outcome),
    /// The database failed; nothing was committed.
    #[error("storage_error: {0}")]
    Storage(StorageError),
    /// The caller's own write failed; the whole transaction was rolled back. Its text is not
    /// printed (a database error's message can quote the row, R-STORE-11): only its MySQL
    /// number and SQLSTATE when it is a driver error. The error itself is the `source()`.
    #[error("write_failed: the caller's write failed, everything was rolled back{}", write_code(.0))]
    Write(#[source] WriteError),
}

/// ` (mysql N, SQLSTATE S)` when a caller's write failed with a driver error, else nothing.
fn write_code(e: &WriteError) -> String {
    match e.downcast_ref::<sqlx::Error>() {
        Some(sqlx) => {
            let s = StorageError::from_sqlx(sqlx);
            match (s.number, s.sqlstate.as_deref()) {
                (Some(n), Some(state)) => format!(" (mysql {n}, SQLSTATE {state})"),
                (Some(n), None) => format!(" (mysql {n})"),
                _ => format!(" ({})", s),
            }
        }
        None => String::new(),
    }
}

impl ApplyError {
    /// The stable lowercase name: `rejected`, `conflict`, `commit_unconfirmed`,
    /// `unreplicated`, `timeout`, `storage_error` or `write_failed`.
    pub fn kind(&self) -> &'static str {
        match self {
            ApplyError::Rejected(_) => "rejected",
            ApplyError::Conflict(_) => "conflict",
            ApplyError::CommitUnconfirmed => "commit_unconfirmed",
            ApplyError::Unreplicated(_) => "unreplicated",
            ApplyError::Timeout(_) => "timeout",
            ApplyError::Storage(_) => "storage_error",
            ApplyError::Write(_) => "write_failed",
        }
    }

    /// Whether applying the same event again may succeed (as a redelivery would).
    pub fn is_retryable(&self) -> bool {
        match self {
            ApplyError::Rejected(_) | ApplyError::Conflict(_) => false,
            ApplyError::CommitUnconfirmed
            | ApplyError::Unreplicated(_)
            | ApplyError::Timeout(_)
            | ApplyError::Write(_) => true,
            ApplyError::Storage(e) => e.is_retryable(),
        }
    }
}

impl From<sqlx::Error> for ApplyError {
    fn from(e: sqlx::Error) -> Self {
        ApplyError::Storage(StorageError::from_sqlx(&e))
    }
}

/// The MySQL error number of a driver error, when the server sent one.
pub(crate) fn mysql_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}
