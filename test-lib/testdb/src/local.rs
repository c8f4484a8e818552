//! A local `mariadbd` or `mysqld` on a fresh datadir and a free loopback port.
//!
//! Every server lives in its own directory under `$TMPDIR/result-inbox-testdb/`, which holds
//! the datadir, the socket, the error log and `owner.pid` (the test process); `cleanup.rs`
//! removes it at exit or in a later run's sweep, and `process.rs` starts the server so that it
//! dies with the test process.

use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Seek, SeekFrom};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cleanup::{register, root_dir, sweep_leftovers, unregister_pid, Cleanup};
use crate::error::Error;
use crate::process::{is_root, spawn_long_lived, Running};
use crate::provision;
use crate::settings::READY_TIMEOUT;

/// Which server program, and how to make a datadir for it.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    pub(crate) server: PathBuf,
    pub(crate) mariadb: bool,
}

pub(crate) fn find_in_path(name: &str) -> Option<PathBuf> {
    #[allow(clippy::disallowed_methods)] // the harness looks up its own tools
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            ["/usr/sbin", "/usr/local/sbin", "/usr/local/mysql/bin"]
                .iter()
                .map(PathBuf::from),
        )
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub(crate) fn find_program() -> Result<Program, Error> {
    if let Some(server) = find_in_path("mariadbd") {
        return Ok(Program {
            server,
            mariadb: true,
        });
    }
    if let Some(server) = find_in_path("mysqld") {
        let version = Command::new(&server)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        return Ok(Program {
            server,
            mariadb: version.contains("MariaDB"),
        });
    }
    Err(Error::NoServerProgram(
        "no MySQL server found: neither mariadbd nor mysqld is on PATH or in /usr/sbin; \
         install Debian's mariadb-server (scripts/install-deps does), \
         or set TESTDB_MYSQL_URL to an existing server"
            .into(),
    ))
}

pub(crate) fn free_loopback_port() -> Result<u16, Error> {
    // MariaDB reads --port=0 as "the default port", not "any": pick one here. Below the
    // kernel's ephemeral range: a port from `bind(…:0)` is free only until the next outgoing
    // connection takes it as its local port, and a server (mariadbd, rsync's state transfer
    // daemon) started a moment later then finds it taken.
    const LOWEST: u32 = 10_000;
    let below = ephemeral_start().min(32_768);
    if below > LOWEST + 1_000 {
        for _ in 0..64 {
            // std's randomly keyed hasher, as `provision` uses it: a different draw in every
            // process and every call.
            let draw = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            let port = (LOWEST + (draw % u64::from(below - LOWEST)) as u32) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(Error::io("cannot find a free loopback port"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(Error::io("cannot find a free loopback port"))
}

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_start() -> u32 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

pub(crate) fn tail(path: &Path, bytes: u64) -> String {
    let Ok(mut f) = fs::File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(bytes)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s
}

/// A running local server. Dropping it kills the server and removes its directory.
#[derive(Debug)]
pub(crate) struct LocalServer {
    child: Running,
    pid: AtomicU32,
    program: Program,
    dir: PathBuf,
    port: u16,
    description: String,
    /// The server's TLS, if it was started with it: its options, and what an admin URL needs.
    tls: Option<ServerTls>,
    /// Further options it was started with (a replication member's), kept for a restart.
    extra: Vec<String>,
    /// What its description adds (`, encrypted at rest`, `, restored from a backup`).
    note: String,
}

/// Where a new server's datadir comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Datadir<'a> {
    /// A fresh one, from the installer.
    Fresh,
    /// A copy of a prepared backup in this directory (`mariadb-backup --copy-back`).
    Restored(&'a Path),
}

/// The hot backup tool of MariaDB (`mariadb-backup`, formerly `mariabackup`).
pub(crate) fn backup_tool() -> Result<PathBuf, Error> {
    find_in_path("mariadb-backup")
        .or_else(|| find_in_path("mariabackup"))
        .ok_or_else(|| {
            Error::NoServerProgram(
                "mariadb-backup is not installed: install Debian's mariadb-backup (scripts/install-deps does)".into(),
            )
        })
}

/// Runs `cmd` with its output into `log`; an error names `what` and carries the log's tail.
fn run_logged(mut cmd: Command, log: &Path, what: &str) -> Result<(), Error> {
    let out =
        fs::File::create(log).map_err(Error::io(format!("cannot create {}", log.display())))?;
    let program = Path::new(cmd.get_program()).display().to_string();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(
            out.try_clone()
                .map_err(Error::io(format!("cannot write {}", log.display())))?,
        )
        .stderr(out)
        .status()
        .map_err(Error::io(format!("{what}: cannot run {program}")))?;
    if !status.success() {
        return Err(Error::Server {
            what: format!("{what} failed ({status})"),
            tail: tail(log, 2000),
            log: log.to_path_buf(),
        });
    }
    Ok(())
}

/// Runs MariaDB's backup tool with `args` after `--defaults-file=<defaults>` (the options it
/// must share with the server) or `--no-defaults`, its output into `log`.
fn run_backup_tool(
    defaults: Option<&Path>,
    args: &[String],
    log: &Path,
    what: &str,
) -> Result<(), Error> {
    let mut cmd = Command::new(backup_tool()?);
    cmd.arg(match defaults {
        Some(file) => format!("--defaults-file={}", file.display()),
        None => "--no-defaults".to_owned(),
    })
    .args(args)
    // The times it writes into `xtrabackup_info` are local: make them UTC.
    .env("TZ", "UTC");
    run_logged(cmd, log, what)
}

/// Writes a TLS server's certificates into its directory; what the server is started with.
pub(crate) type MakeTls<'a> = &'a dyn Fn(&Path) -> Result<ServerTls, Error>;

/// What a TLS server was started with.
#[derive(Debug, Clone)]
pub(crate) struct ServerTls {
    /// `--ssl-*` and `--require-secure-transport` options.
    pub(crate) args: Vec<String>,
    /// The query an admin URL carries to connect (the server refuses plain TCP).
    pub(crate) query: String,
}

impl LocalServer {
    /// A plain server, or with `tls` a server that refuses any TCP connection without TLS;
    /// `tls` is called with the server's own directory, to write its certificates there.
    pub(crate) fn start(tls: Option<MakeTls<'_>>) -> Result<LocalServer, Error> {
        Self::start_with(tls, Vec::new())
    }

    /// [`LocalServer::start`] with further server options `extra` (kept for restarts).
    pub(crate) fn start_with(
        tls: Option<MakeTls<'_>>,
        extra: Vec<String>,
    ) -> Result<LocalServer, Error> {
        Self::start_on(tls, extra, Datadir::Fresh, "")
    }

    /// A server on a datadir from `datadir`, with further options `extra`; `note` is added to
    /// its description.
    pub(crate) fn start_on(
        tls: Option<MakeTls<'_>>,
        extra: Vec<String>,
        datadir: Datadir<'_>,
        note: &str,
    ) -> Result<LocalServer, Error> {
        let program = find_program()?;
        let root = root_dir();
        fs::create_dir_all(&root)
            .map_err(Error::io(format!("cannot create {}", root.display())))?;
        sweep_leftovers(&root);

        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = root.join(format!(
            "{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(Error::io(format!("cannot create {}", dir.display())))?;
        fs::write(dir.join("owner.pid"), std::process::id().to_string())
            .map_err(Error::io(format!("cannot write in {}", dir.display())))?;

        let made = match datadir {
            Datadir::Fresh => Self::install(&program, &dir),
            Datadir::Restored(backup) => Self::copy_back(backup, &dir),
        };
        let result = made.and_then(|()| {
            let tls = tls.map(|make| make(&dir)).transpose()?;
            // A port can be taken between choosing and binding; try a few.
            let mut last = None;
            for _ in 0..3 {
                match Self::launch(
                    &program,
                    &dir,
                    free_loopback_port()?,
                    tls.clone(),
                    extra.clone(),
                    note,
                ) {
                    Ok(server) => return Ok(server),
                    Err(e @ Error::PortInUse { .. }) => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            Err(last.expect("three tries, each a port in use"))
        });
        if result.is_err() {
            let _ = fs::remove_dir_all(&dir);
        }
        result
    }

    pub(crate) fn install(program: &Program, dir: &Path) -> Result<(), Error> {
        let data = dir.join("data");
        let log = dir.join("install.log");
        // Each server has a temporary directory of its own: a server that starts deletes every
        // `#sql…` file in its tmpdir, and would delete another installer's temporary tables if
        // they shared `$TMPDIR` (this failed a CI run).
        let tmp = dir.join("tmp");
        fs::create_dir_all(&tmp).map_err(Error::io(format!("cannot create {}", tmp.display())))?;
        let cmd = if program.mariadb {
            let installer = find_in_path("mariadb-install-db")
                .or_else(|| find_in_path("mysql_install_db"))
                .ok_or_else(|| {
                    Error::NoServerProgram("mariadb-install-db is not installed".into())
                })?;
            let mut cmd = Command::new(installer);
            cmd.arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .arg(format!("--tmpdir={}", tmp.display()))
                .arg("--auth-root-authentication-method=normal")
                .arg("--skip-test-db");
            if is_root() {
                cmd.arg("--user=root");
            }
            cmd
        } else {
            let mut cmd = Command::new(&program.server);
            cmd.arg("--no-defaults")
                .arg("--initialize-insecure")
                .arg(format!("--datadir={}", data.display()))
                .arg(format!("--tmpdir={}", tmp.display()));
            if is_root() {
                cmd.arg("--user=root");
            }
            cmd
        };
        run_logged(cmd, &log, "creating a datadir")
    }

    /// Copies the prepared backup in `backup` into `dir`'s datadir, as an operator restores one.
    fn copy_back(backup: &Path, dir: &Path) -> Result<(), Error> {
        let tmp = dir.join("tmp");
        fs::create_dir_all(&tmp).map_err(Error::io(format!("cannot create {}", tmp.display())))?;
        run_backup_tool(
            None,
            &[
                "--copy-back".to_owned(),
                format!("--target-dir={}", backup.display()),
                format!("--datadir={}", dir.join("data").display()),
            ],
            &dir.join("restore.log"),
            "restoring the backup (mariadb-backup --copy-back)",
        )
    }

    /// Takes a hot backup of the running server into `target` (which must not exist) with
    /// `mariadb-backup --backup`, then prepares it (`--prepare`: the redo copied during the
    /// backup applied, so that the copy is consistent as of one point); how long each took.
    pub(crate) fn backup(&self, target: &Path) -> Result<(Duration, Duration), Error> {
        let started = Instant::now();
        let args = vec![
            "--backup".to_owned(),
            format!("--target-dir={}", target.display()),
            format!("--datadir={}", self.dir.join("data").display()),
            format!("--socket={}", self.socket().display()),
            "--user=root".to_owned(),
        ];
        // An encrypted server's files are read with its key plugin, whose options the tool
        // takes from an options file only (not from its command line).
        let defaults = target.with_extension("cnf");
        let mut cnf = "[mariadbd]\n".to_owned();
        for option in key_options(&self.extra) {
            let (name, value) = option
                .trim_start_matches("--")
                .split_once('=')
                .unwrap_or((&option, ""));
            cnf.push_str(&format!("{}={value}\n", name.replace('-', "_")));
        }
        fs::write(&defaults, cnf)
            .map_err(Error::io(format!("cannot write {}", defaults.display())))?;
        let log = target.with_extension("backup.log");
        run_backup_tool(
            Some(&defaults),
            &args,
            &log,
            "the hot backup (mariadb-backup --backup)",
        )?;
        let took = started.elapsed();
        let started = Instant::now();
        // The tool writes the options the prepare needs (the key plugin's among them) into the
        // backup itself.
        run_backup_tool(
            Some(&target.join("backup-my.cnf")),
            &[
                "--prepare".to_owned(),
                format!("--target-dir={}", target.display()),
            ],
            &target.with_extension("prepare.log"),
            "preparing the backup (mariadb-backup --prepare)",
        )?;
        Ok((took, started.elapsed()))
    }

    /// The further options it was started with.
    pub(crate) fn options(&self) -> &[String] {
        &self.extra
    }

    /// `SET GLOBAL innodb_fast_shutdown = 0` and `SHUTDOWN` as the admin at `url`; waits until
    /// the process has exited.
    pub(crate) fn shut_down(&self, url: &secret::Secret) -> Result<(), Error> {
        provision::block_on(async {
            use sqlx::{Connection, Executor};
            let mut conn = sqlx::MySqlConnection::connect(url.expose())
                .await
                .map_err(Error::sql("cannot connect as admin"))?;
            conn.execute("SET GLOBAL innodb_fast_shutdown = 0")
                .await
                .map_err(Error::sql("SET GLOBAL innodb_fast_shutdown failed"))?;
            // The server may close the connection before it answers.
            let _ = conn.execute("SHUTDOWN").await;
            Ok::<(), Error>(())
        })?;
        let started = Instant::now();
        while self.try_wait().is_none() {
            if started.elapsed() > READY_TIMEOUT {
                return Err(Error::Server {
                    what: format!(
                        "the server on 127.0.0.1:{} did not exit within {READY_TIMEOUT:?} of SHUTDOWN",
                        self.port
                    ),
                    log: self.log_path(),
                    tail: tail(&self.log_path(), 3000),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        Ok(())
    }

    /// The server's own directory: its datadir (`data/`), its temporary directory (`tmp/`),
    /// its socket and its logs.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn launch(
        program: &Program,
        dir: &Path,
        port: u16,
        tls: Option<ServerTls>,
        extra: Vec<String>,
        note: &str,
    ) -> Result<LocalServer, Error> {
        let _ = fs::remove_file(dir.join("error.log"));
        let child = Self::spawn(program, dir, port, tls.as_ref(), &extra)?;
        let pid = child.id();
        let mut server = LocalServer {
            child: Running::new(child),
            pid: AtomicU32::new(pid),
            program: program.clone(),
            dir: dir.to_path_buf(),
            port,
            description: String::new(),
            tls,
            extra,
            note: note.to_owned(),
        };
        let version = server.wait_ready(&dir.join("error.log"))?;
        let name = program
            .server
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tls = if server.tls.is_some() {
            ", TLS only"
        } else {
            ""
        };
        server.description = format!(
            "{version} (local {name}, 127.0.0.1:{port}{tls}{})",
            server.note
        );
        Ok(server)
    }

    /// Starts the server process on `dir`'s datadir and `port`, registered for cleanup.
    fn spawn(
        program: &Program,
        dir: &Path,
        port: u16,
        tls: Option<&ServerTls>,
        extra: &[String],
    ) -> Result<Child, Error> {
        let data = dir.join("data");
        let log = dir.join("error.log");
        let socket = dir.join("mysqld.sock");
        // sockaddr_un holds 107 bytes of path.
        if socket.as_os_str().len() > 107 {
            return Err(Error::Config(format!(
                "the server's socket path would be too long for a unix socket ({} bytes, at most 107): {}; set TMPDIR to a shorter directory",
                socket.as_os_str().len(),
                socket.display()
            )));
        }
        let mut cmd = Command::new(&program.server);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", dir.join("tmp").display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", data.join("server.pid").display()))
            .arg(format!("--log-error={}", log.display()))
            .arg("--innodb-buffer-pool-size=128M")
            .arg("--max-connections=500");
        if !program.mariadb {
            cmd.arg("--mysqlx=OFF");
        }
        if let Some(tls) = tls {
            cmd.args(&tls.args);
        }
        cmd.args(extra);
        if is_root() {
            cmd.arg("--user=root");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_long_lived(cmd).map_err(Error::io(format!(
            "cannot start {}",
            program.server.display()
        )))?;
        register(Cleanup::Process {
            pid: child.id(),
            dir: dir.to_path_buf(),
        });
        Ok(child)
    }

    /// Starts a killed server again on the same datadir and port (InnoDB recovers what was
    /// committed); returns when it answers `SELECT 1`.
    pub(crate) fn restart(&self) -> Result<(), Error> {
        self.kill();
        let child = Self::spawn(
            &self.program,
            &self.dir,
            self.port,
            self.tls.as_ref(),
            &self.extra,
        )?;
        let old = self.pid.swap(child.id(), Ordering::SeqCst);
        unregister_pid(old);
        self.child.set(child);
        self.wait_ready(&self.dir.join("error.log")).map(|_| ())
    }

    /// Kills the server, replaces its datadir with a fresh one, and starts it again on the
    /// same port with `extra` as its further options: a server rebuilt from nothing (an old
    /// primary that must not rejoin with what it holds).
    pub(crate) fn rebuild(&mut self, extra: Vec<String>) -> Result<(), Error> {
        self.kill();
        let data = self.dir.join("data");
        fs::remove_dir_all(&data)
            .map_err(Error::io(format!("cannot remove {}", data.display())))?;
        Self::install(&self.program, &self.dir)?;
        self.extra = extra;
        self.restart()
    }

    /// Sends `signal` to the running server; whether one was running.
    pub(crate) fn signal(&self, signal: nix::sys::signal::Signal) -> bool {
        self.pid().is_some_and(|pid| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).is_ok()
        })
    }

    /// Waits until the server answers `SELECT 1`, failing fast if it exits.
    fn wait_ready(&self, log: &Path) -> Result<String, Error> {
        let start = Instant::now();
        let mut announced = false;
        loop {
            if let Some(status) = self.try_wait() {
                let tail = tail(log, 3000);
                // MariaDB and MySQL both log the bind failure in these words.
                if tail.contains("Address already in use") {
                    return Err(Error::PortInUse { port: self.port });
                }
                return Err(Error::Server {
                    what: format!("the server exited during start-up ({status})"),
                    log: log.to_path_buf(),
                    tail,
                });
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                let query = self.tls.as_ref().map_or("", |t| t.query.as_str());
                let url =
                    provision::url("root", "", &format!("127.0.0.1:{}", self.port), None, query);
                if let Ok(version) = provision::block_on(provision::select_version(url)) {
                    return Ok(version);
                }
            }
            let waited = start.elapsed();
            if waited > READY_TIMEOUT {
                return Err(Error::Server {
                    what: format!(
                        "the server on 127.0.0.1:{} did not answer SELECT 1 within {READY_TIMEOUT:?}",
                        self.port
                    ),
                    log: log.to_path_buf(),
                    tail: tail(log, 3000),
                });
            }
            if waited > Duration::from_secs(5) && !announced {
                eprintln!(
                    "testdb: still waiting for the server on 127.0.0.1:{} to answer SELECT 1 (log: {})",
                    self.port,
                    log.display()
                );
                announced = true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn try_wait(&self) -> Option<std::process::ExitStatus> {
        self.child.exited()
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn description(&self) -> &str {
        &self.description
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.join("error.log")
    }

    pub(crate) fn socket(&self) -> PathBuf {
        self.dir.join("mysqld.sock")
    }

    /// SIGKILL and reap; returns whether the server was still running.
    pub(crate) fn kill(&self) -> bool {
        self.child
            .kill()
            .inspect(|pid| unregister_pid(*pid))
            .is_some()
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.kill();
        unregister_pid(self.pid.load(Ordering::SeqCst));
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The options of `options` that a tool reading the server's files needs too (the key plugin
/// and its key file).
pub(crate) fn key_options(options: &[String]) -> Vec<String> {
    options
        .iter()
        .filter(|o| {
            o.starts_with("--plugin-load-add=file_key_management")
                || o.starts_with("--file-key-management-")
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_lies_below_the_ephemeral_range_and_differs_between_calls() {
        let below = ephemeral_start();
        let ports: Vec<u16> = (0..20).map(|_| free_loopback_port().unwrap()).collect();
        if below > 11_000 {
            assert!(
                ports
                    .iter()
                    .all(|p| u32::from(*p) >= 10_000 && u32::from(*p) < below),
                "{ports:?} (ephemeral range from {below})"
            );
        }
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() >= 18, "{ports:?}");
    }
}
