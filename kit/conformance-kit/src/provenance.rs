//! What a certificate says about where a run happened and how far the kit that judged can be
//! trusted: the environment (kernel, CPUs, `--jobs`, the database server's settings that the
//! cases depend on) and the kit build's own mutant matrix, made by `conformance mutants
//! --matrix` and kept beside the binary, valid only for the binary whose SHA-256 it names.

use std::path::{Path, PathBuf};

use sqlx::{Connection, MySqlConnection};

/// The file beside the `conformance` binary that holds its mutant matrix.
pub const MATRIX_FILE: &str = "mutant-matrix.json";

/// The server settings a certificate records: each changes what a case's timing or a
/// receiver's transaction meets.
const SETTINGS: &[&str] = &[
    "version",
    "version_comment",
    "time_zone",
    "transaction_isolation",
    "sql_mode",
    "innodb_rollback_on_timeout",
    "innodb_lock_wait_timeout",
    "innodb_flush_log_at_trx_commit",
    "log_bin",
    "sync_binlog",
    "read_only",
    "wsrep_on",
];

/// The environment of a run: the kernel, the CPUs this process may use, the cases at once, and
/// the database server with its settings (a setting the server does not have is left out).
pub async fn environment(admin_url: &str, jobs: usize) -> serde_json::Value {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let mut settings = serde_json::Map::new();
    if let Ok(mut c) = MySqlConnection::connect(admin_url).await {
        for name in SETTINGS {
            let value: Result<(Option<String>,), _> =
                sqlx::query_as(&format!("SELECT CAST(@@global.{name} AS CHAR)"))
                    .fetch_one(&mut c)
                    .await;
            if let Ok((Some(v),)) = value {
                settings.insert((*name).to_owned(), v.into());
            }
        }
        let _ = c.close().await;
    }
    serde_json::json!({
        "kernel": kernel,
        "cpus": cpus,
        "jobs": jobs,
        "database_settings": settings,
    })
}

/// One mutant's row of the matrix.
#[derive(Debug, Clone)]
pub struct MatrixRow {
    pub mutant: String,
    pub case: String,
    pub rule: String,
    pub caught: u64,
    pub runs: u64,
}

/// The matrix `conformance mutants --matrix FILE` writes: for the kit binary that ran it (its
/// SHA-256) and the mutant build it ran against, each mutant, the case aimed at it and the
/// rule, and in how many of its runs the case caught it.
pub fn matrix(
    kit_sha256: &str,
    receiver_mutant_sha256: &str,
    seed: u64,
    made_at: &str,
    rows: &[MatrixRow],
) -> serde_json::Value {
    serde_json::json!({
        "kit_sha256": kit_sha256,
        "receiver_mutant_sha256": receiver_mutant_sha256,
        "made_at": made_at,
        "seed": seed,
        "mutants": rows.iter().map(|r| serde_json::json!({
            "mutant": r.mutant,
            "case": r.case,
            "rule": r.rule,
            "caught": r.caught,
            "runs": r.runs,
        })).collect::<Vec<_>>(),
    })
}

/// Where the running kit's matrix would be: beside its binary.
pub fn matrix_path() -> Option<PathBuf> {
    Some(std::env::current_exe().ok()?.parent()?.join(MATRIX_FILE))
}

/// The matrix at `path`, when it was made by the binary whose SHA-256 is `kit_sha256`; why not
/// otherwise (none there, unreadable, or made by another build).
pub fn matrix_for(path: &Path, kit_sha256: &str) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("no mutant matrix at {}: {e}", path.display()))?;
    let m: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a mutant matrix: {e}", path.display()))?;
    match m["kit_sha256"].as_str() {
        Some(sha) if sha == kit_sha256 => Ok(m),
        Some(sha) => Err(format!(
            "{} was made by another kit build (SHA-256 {sha}, this one {kit_sha256})",
            path.display()
        )),
        None => Err(format!("{} names no kit build", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matrix_holds_only_for_the_build_that_made_it() {
        let dir = std::env::temp_dir().join(format!("kit-matrix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(MATRIX_FILE);
        let rows = [MatrixRow {
            mutant: "ack-before-commit".into(),
            case: "ack-after-commit".into(),
            rule: "R-STORE-7".into(),
            caught: 3,
            runs: 3,
        }];
        let m = matrix("aa", "bb", 7, "2026-12-07T00:00:00Z", &rows);
        std::fs::write(&path, m.to_string()).unwrap();
        let read = matrix_for(&path, "aa").unwrap();
        assert_eq!(read["mutants"][0]["caught"], 3);
        assert_eq!(read["receiver_mutant_sha256"], "bb");
        let other = matrix_for(&path, "cc").unwrap_err();
        assert!(other.contains("made by another kit build"), "{other}");
        assert!(matrix_for(&dir.join("none"), "aa")
            .unwrap_err()
            .starts_with("no mutant matrix at "));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
