//! What a server keeps on disk: encryption at rest, and hot backups that restore onto a new
//! server.
//!
//! An encrypted server is a local one started with MariaDB's `file_key_management` plugin and a
//! key file made for it, and with every kind of file InnoDB, Aria and the server write
//! encrypted ([`server_options`]). A backup is taken with MariaDB's own tool while the server
//! runs, prepared, and restored into the datadir of a new server ([`Server::backup`],
//! [`Server::restore`]).

use std::fs;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlConnection};

use crate::error::Error;

/// When set (to anything), [`Server::start`] and so the shared server start a local server
/// that encrypts what it writes ([`Server::local_encrypted`]): a suite run this way keeps every
/// row of its tests encrypted on disk. Only the local backend can.
pub const TESTDB_ENCRYPTED: &str = "TESTDB_ENCRYPTED";

/// What an encrypted server's description ends with.
pub const ENCRYPTED_NOTE: &str = ", encrypted at rest";

/// The server options that encrypt everything MariaDB writes to disk with key 1 of `key_file`
/// (MariaDB's `file_key_management` plugin): InnoDB's tablespaces (`FORCE`: a table cannot be
/// created unencrypted), its redo log and temporary tablespace, the server's temporary files
/// (sorts, large transactions' binlog caches), Aria tables and the binary log. Two background
/// threads encrypt the tablespaces that existed before (the system tablespace, which holds the
/// undo log and the doublewrite buffer).
pub fn server_options(key_file: &Path) -> Vec<String> {
    vec![
        "--plugin-load-add=file_key_management".to_owned(),
        format!("--file-key-management-filename={}", key_file.display()),
        "--innodb-encrypt-tables=FORCE".to_owned(),
        "--innodb-encrypt-log=ON".to_owned(),
        "--innodb-encrypt-temporary-tables=ON".to_owned(),
        "--innodb-encryption-threads=2".to_owned(),
        "--encrypt-tmp-files=ON".to_owned(),
        "--aria-encrypt-tables=ON".to_owned(),
        "--encrypt-binlog=ON".to_owned(),
    ]
}

/// Writes a key file for `file_key_management` at `path`, readable by its owner only: key id
/// 1, 256 random bits from the kernel, in hex (`1;<64 hex digits>`).
pub fn write_key_file(path: &Path) -> Result<(), Error> {
    let mut key = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(Error::io("cannot read /dev/urandom for a key"))?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, format!("1;{hex}\n").as_bytes()))
        .map_err(Error::io(format!(
            "cannot write the key file {}",
            path.display()
        )))
}

/// A directory of its own under this process's scratch directory, `<what>-<n>`.
pub(crate) fn scratch_path(what: &str) -> Result<PathBuf, Error> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir =
        crate::cleanup::scratch_dir().map_err(Error::io("cannot make a scratch directory"))?;
    Ok(dir.join(format!("{what}-{}", SEQ.fetch_add(1, Ordering::SeqCst))))
}

/// How long an encrypted server's background threads have to encrypt what existed before.
const ENCRYPT_WITHIN: Duration = Duration::from_secs(60);

/// Waits until every InnoDB tablespace of the server at `url` is encrypted and none is being
/// rotated.
pub(crate) async fn wait_encrypted(url: secret::Secret) -> Result<(), Error> {
    let mut conn = MySqlConnection::connect(url.expose())
        .await
        .map_err(Error::sql("cannot connect as admin"))?;
    let started = Instant::now();
    loop {
        let (spaces, plain): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), CAST(COALESCE(SUM(ENCRYPTION_SCHEME = 0 OR KEY_ROTATION_PAGE_NUMBER IS NOT NULL), 0) AS SIGNED) \
             FROM information_schema.INNODB_TABLESPACES_ENCRYPTION",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(Error::sql("reading INNODB_TABLESPACES_ENCRYPTION failed"))?;
        if spaces > 0 && plain == 0 {
            let _ = conn.close().await;
            return Ok(());
        }
        if started.elapsed() > ENCRYPT_WITHIN {
            return Err(Error::Config(format!(
                "the server's encryption threads left {plain} of {spaces} tablespaces unencrypted after {ENCRYPT_WITHIN:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A hot backup of a local server ([`Server::backup`]), prepared: a consistent copy of the
/// server as of one point during the backup. Its directory goes with it.
#[derive(Debug)]
pub struct Backup {
    pub(crate) dir: PathBuf,
    /// The options of the server it came from, which a restored server starts with (an
    /// encrypted server's key plugin among them).
    pub(crate) options: Vec<String>,
    /// How long `mariadb-backup --backup` took, while the server kept working.
    pub taken_in: Duration,
    /// How long `mariadb-backup --prepare` took.
    pub prepared_in: Duration,
}

impl Backup {
    /// Where the prepared backup lies.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// When the backup started, as `xtrabackup_info` records it (`start_time`, to the second;
    /// the tool ran in UTC), in RFC 3339: what an operator gives `receiver reconcile --since`.
    pub fn started_at(&self) -> Result<String, Error> {
        let info = self.dir.join("xtrabackup_info");
        let text = fs::read_to_string(&info)
            .map_err(Error::io(format!("cannot read {}", info.display())))?;
        text.lines()
            .find_map(|l| l.strip_prefix("start_time = "))
            .map(|t| format!("{}Z", t.trim().replacen(' ', "T", 1)))
            .ok_or_else(|| Error::Config(format!("{} has no start_time", info.display())))
    }
}

impl Drop for Backup {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        // The tool's options file and logs lie beside it.
        for extension in ["cnf", "backup.log", "prepare.log"] {
            let _ = fs::remove_file(self.dir.with_extension(extension));
        }
    }
}
