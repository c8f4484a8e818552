//! Whether the server behind a connection can keep what the store commits: that it takes
//! writes at all (not a demoted primary or a replica), and, when the store requires it, that
//! a replica acknowledges every commit before the server confirms it (lossless
//! semi-synchronous replication).
//!
//! Both are read, never written: `@@global.read_only`, `SHOW GLOBAL STATUS` and `SHOW GLOBAL
//! VARIABLES` need no privilege, so the runtime account keeps the grants it has.
//!
//! # The replica-acknowledgement rule
//!
//! A primary with semi-synchronous replication waits, at each COMMIT, for a replica to say it
//! has the transaction; when none answers within `rpl_semi_sync_master_timeout` it stops
//! waiting, switches semi-sync off (`Rpl_semi_sync_master_status` = OFF; MySQL:
//! `Rpl_semi_sync_source_status`), confirms the COMMIT anyway, and goes on asynchronously. It
//! switches back on only once a replica has caught up with the latest commit written to the
//! binary log, those written while it was off included.
//!
//! So the store reads the status **on the connection that committed, after the answer to
//! COMMIT** (or after a duplicate's verdict): ON at that moment means a replica holds this
//! transaction, whether it was acknowledged in the wait or caught up with afterwards; OFF
//! means it may exist on this one server only, and it is not ACKed ([`crate::ApplyError::Unreplicated`]).
//! A COMMIT that completed just as the status flipped is judged by what is read after it:
//! never by a status read before the COMMIT, and never on another connection (which may lead
//! to another server after a failover).
//!
//! This holds only with the wait point `AFTER_SYNC`: with MariaDB's default `AFTER_COMMIT`, a
//! transaction is visible to others (a duplicate's verdict, say) before any replica has it.
//! So the settings check refuses any other wait point.

use sqlx::{Executor, MySqlConnection, Row};

use crate::error::{StorageError, StorageKind};

/// Whether the server refuses writes. A string, so that a server whose `read_only` is an
/// enumeration (`OFF`, `ON`, `NO_LOCK`, …) reads as plainly as one where it is 0 or 1.
pub const READ_ONLY_CHECK: &str = "SELECT CAST(@@global.read_only AS CHAR)";

/// Whether a replica acknowledges the primary's commits now, under either name.
pub const SEMI_SYNC_STATUS: &str = "SHOW GLOBAL STATUS WHERE Variable_name IN \
     ('Rpl_semi_sync_master_status', 'Rpl_semi_sync_source_status')";

/// The primary's semi-synchronous settings, under either name.
pub const SEMI_SYNC_SETTINGS: &str = "SHOW GLOBAL VARIABLES WHERE Variable_name IN \
     ('rpl_semi_sync_master_enabled', 'rpl_semi_sync_source_enabled', \
      'rpl_semi_sync_master_wait_point', 'rpl_semi_sync_source_wait_point')";

/// Whether `value` (of `read_only`) says the server takes writes.
fn writable_value(value: &str) -> bool {
    matches!(value.trim(), "0" | "OFF" | "off")
}

/// Fails with [`StorageKind::ReadOnly`] when the server behind `conn` refuses writes.
pub(crate) async fn check_writable(conn: &mut MySqlConnection) -> Result<(), StorageError> {
    let row = conn
        .fetch_one(READ_ONLY_CHECK)
        .await
        .map_err(|e| StorageError::from_sqlx(&e))?;
    let value: Vec<u8> = row.try_get(0).map_err(|e| StorageError::from_sqlx(&e))?;
    if writable_value(&String::from_utf8_lossy(&value)) {
        Ok(())
    } else {
        Err(StorageError::of_kind(StorageKind::ReadOnly).with_hint("@@global.read_only is set"))
    }
}

/// `SHOW` rows as (lower-cased name, value).
async fn show(
    conn: &mut MySqlConnection,
    sql: &str,
) -> Result<Vec<(String, String)>, StorageError> {
    let rows = conn
        .fetch_all(sql)
        .await
        .map_err(|e| StorageError::from_sqlx(&e))?;
    rows.iter()
        .map(|row| {
            let text = |i: usize| -> Result<String, StorageError> {
                let bytes: Vec<u8> = row.try_get(i).map_err(|e| StorageError::from_sqlx(&e))?;
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            };
            Ok((text(0)?.to_ascii_lowercase(), text(1)?))
        })
        .collect()
}

/// Whether the primary behind `conn` reports a replica acknowledging its commits now:
/// `Ok(())` when it does, [`StorageKind::Unreplicated`] when it does not, and
/// [`StorageKind::ReplicaAckUnsupported`] when the server has no such status at all.
pub(crate) async fn check_replica_ack(conn: &mut MySqlConnection) -> Result<(), StorageError> {
    let status = show(conn, SEMI_SYNC_STATUS).await?;
    match status.first() {
        None => Err(StorageError::of_kind(StorageKind::ReplicaAckUnsupported(
            "the server reports neither Rpl_semi_sync_master_status nor Rpl_semi_sync_source_status (no semi-synchronous replication on it)",
        ))),
        Some((_, value)) if value.eq_ignore_ascii_case("ON") => Ok(()),
        Some(_) => Err(StorageError::of_kind(StorageKind::Unreplicated)),
    }
}

/// What [`check_replica_ack_settings`] found wrong, if anything.
fn settings_problem(settings: &[(String, String)]) -> Option<&'static str> {
    let get = |a: &str, b: &str| {
        settings
            .iter()
            .find(|(name, _)| name == a || name == b)
            .map(|(_, v)| v.as_str())
    };
    let enabled = get(
        "rpl_semi_sync_master_enabled",
        "rpl_semi_sync_source_enabled",
    );
    let wait_point = get(
        "rpl_semi_sync_master_wait_point",
        "rpl_semi_sync_source_wait_point",
    );
    match (enabled, wait_point) {
        (None, _) | (_, None) => Some(
            "the server has no rpl_semi_sync_master_enabled / rpl_semi_sync_source_enabled or no wait point variable (no semi-synchronous replication on it)",
        ),
        (Some(e), _) if !e.eq_ignore_ascii_case("ON") => Some(
            "rpl_semi_sync_master_enabled (rpl_semi_sync_source_enabled) is OFF on the server: no commit would ever be acknowledged by a replica",
        ),
        (_, Some(w)) if !w.eq_ignore_ascii_case("AFTER_SYNC") => Some(
            "rpl_semi_sync_master_wait_point (rpl_semi_sync_source_wait_point) is not AFTER_SYNC: with AFTER_COMMIT a commit is visible before a replica has it",
        ),
        _ => None,
    }
}

/// Refuses, with [`StorageKind::ReplicaAckUnsupported`], a server on which the requirement
/// cannot be honoured: semi-synchronous replication absent, not enabled on the primary, with a
/// wait point other than `AFTER_SYNC`, or its settings or status unreadable (the server's
/// error number kept). A server that is merely unavailable fails as such (the caller waits);
/// a status that reads OFF is no refusal: the caller holds until a replica acknowledges.
pub(crate) async fn check_replica_ack_settings(
    conn: &mut MySqlConnection,
) -> Result<(), StorageError> {
    let settings = show(conn, SEMI_SYNC_SETTINGS).await.map_err(unreadable)?;
    if let Some(problem) = settings_problem(&settings) {
        return Err(StorageError::of_kind(StorageKind::ReplicaAckUnsupported(
            problem,
        )));
    }
    match check_replica_ack(conn).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == StorageKind::Unreplicated => Ok(()),
        Err(e) => Err(unreadable(e)),
    }
}

/// A failure to read the semi-sync settings or status: as it is when the server is merely
/// unavailable (or says there is no such status), else a refusal keeping its error number.
fn unreadable(e: StorageError) -> StorageError {
    if e.is_unavailable() || matches!(e.kind(), StorageKind::ReplicaAckUnsupported(_)) {
        return e;
    }
    e.with_kind(StorageKind::ReplicaAckUnsupported(
        "the server's semi-synchronous settings or status could not be read",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_reads_as_writable_only_when_off() {
        for v in ["0", "OFF", " 0\n"] {
            assert!(writable_value(v), "{v:?}");
        }
        for v in ["1", "ON", "NO_LOCK", "NO_LOCK_NO_ADMIN", ""] {
            assert!(!writable_value(v), "{v:?}");
        }
    }

    fn settings(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_unreadable_status_is_a_refusal_and_an_unavailable_server_stays_one() {
        let denied = unreadable(StorageError::of_kind(StorageKind::PermissionDenied));
        assert!(matches!(
            denied.kind(),
            StorageKind::ReplicaAckUnsupported(why) if why.contains("could not be read")
        ));
        assert!(!denied.is_retryable());
        let down = unreadable(StorageError::of_kind(StorageKind::Unavailable));
        assert_eq!(down.kind(), StorageKind::Unavailable);
    }

    #[test]
    fn only_enabled_after_sync_semi_sync_can_honour_the_requirement() {
        let mariadb = |enabled, point| {
            settings(&[
                ("rpl_semi_sync_master_enabled", enabled),
                ("rpl_semi_sync_master_wait_point", point),
            ])
        };
        assert_eq!(settings_problem(&mariadb("ON", "AFTER_SYNC")), None);
        let mysql = settings(&[
            ("rpl_semi_sync_source_enabled", "ON"),
            ("rpl_semi_sync_source_wait_point", "AFTER_SYNC"),
        ]);
        assert_eq!(settings_problem(&mysql), None);
        assert!(settings_problem(&mariadb("ON", "AFTER_COMMIT"))
            .unwrap()
            .contains("not AFTER_SYNC"));
        assert!(settings_problem(&mariadb("OFF", "AFTER_SYNC"))
            .unwrap()
            .contains("is OFF"));
        assert!(settings_problem(&[])
            .unwrap()
            .contains("no semi-synchronous"));
    }
}
