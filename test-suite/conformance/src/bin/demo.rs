//! `make demo`: the whole demo from a fresh clone, in one command.
//!
//! A throwaway MySQL server (`testdb`), the platform's and the receiver's databases and accounts
//! on it, `orbit-dev bootstrap` into `.local/` (directory 0700, file 0600), `orbit-dev serve`,
//! `receiver init`, `receiver demo`; the three lines on stdout; everything torn down afterwards,
//! also on failure, with the logs left under `.local/`.
//!
//! Exit codes: 0 success, 1 a step failed (the message names it and the logs).

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};

use fixtures::workspace_bin;

/// Kills the platform process on every way out.
struct Guard(Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

const HELP: &str = "usage: demo   (make demo runs it)

The whole demo from a fresh clone: a throwaway MySQL server, the platform's and the receiver's
databases and accounts on it, a platform credential in .local/ (directory 0700, file 0600),
orbit-dev serve, receiver init and receiver demo, then everything torn down. Prints the demo's
three lines on stdout; the logs stay in .local/. Takes no arguments and reads no variables.

Exit 0 when the demo passed, 1 when a step failed (the line names it and the logs), 2 for an
argument.";

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    if about::answered("demo", &args, &[], |_| HELP.into()) {
        return ExitCode::SUCCESS;
    }
    if let Some(first) = args.first() {
        eprintln!(
            "demo: unexpected argument `{}`: the demo takes no arguments (`demo --help`)",
            first.to_string_lossy()
        );
        return ExitCode::from(2);
    }
    let local = PathBuf::from(".local");
    match run(&local) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("make demo: {e}; logs are in {}/", local.display());
            ExitCode::FAILURE
        }
    }
}

fn log_file(local: &Path, name: &str) -> Result<fs::File, String> {
    fs::File::create(local.join(name)).map_err(|e| format!("cannot create .local/{name}: {e}"))
}

fn run(local: &Path) -> Result<(), String> {
    fs::create_dir_all(local).map_err(|e| format!("cannot create .local: {e}"))?;
    fs::set_permissions(local, fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot restrict .local: {e}"))?;

    eprintln!("make demo: starting a throwaway MySQL server…");
    let server = testdb::Server::start().map_err(|e| format!("temporary MySQL: {e}"))?;
    eprintln!("make demo: server {}", server.description());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let db = runtime
        .block_on(server.provision())
        .map_err(|e| format!("databases and accounts: {e}"))?;

    let credentials = local.join("inbox.credentials.json");
    // A previous run's file names a platform that is gone with its throwaway server.
    let _ = std::fs::remove_file(&credentials);
    let printed =
        fixtures::bootstrap(db.platform_url().expose(), "inbox-demo", true, &credentials)?;
    eprint!("make demo: {printed}");

    let mut serve = Command::new(workspace_bin("orbit-dev"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("ORBIT_MYSQL_DSN", db.platform_url().expose())
        .stdout(Stdio::piped())
        .stderr(log_file(local, "orbit-dev.log")?)
        .spawn()
        .map_err(|e| format!("orbit-dev serve: {e}"))?;
    let stdout = serve.stdout.take().ok_or("orbit-dev serve: no stdout")?;
    let platform = Guard(Some(serve));
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| format!("orbit-dev serve: {e}"))?;
    let addr = line
        .trim()
        .strip_prefix("listening=")
        .ok_or("orbit-dev serve did not start (see .local/orbit-dev.log)")?
        .to_owned();
    eprintln!("make demo: orbit-dev listening on {addr}");

    let init = Command::new(workspace_bin("receiver"))
        .arg("init")
        .env("ORBIT_RECEIVER_DSN", db.init_url().expose())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("receiver init: {e}"))?;
    print!("{}", String::from_utf8_lossy(&init.stdout));
    if !init.status.success() {
        return Err("receiver init failed".into());
    }
    runtime
        .block_on(db.grant_runtime())
        .map_err(|e| format!("runtime grants: {e}"))?;

    let demo = Command::new(workspace_bin("receiver"))
        .arg("demo")
        .env("ORBIT_URL", format!("http://{addr}"))
        .env("ORBIT_CREDENTIALS_FILE", &credentials)
        .env("ORBIT_RECEIVER_DSN", db.runtime_url().expose())
        .stderr(log_file(local, "receiver-demo.log")?)
        .output()
        .map_err(|e| format!("receiver demo: {e}"))?;
    print!("{}", String::from_utf8_lossy(&demo.stdout));
    drop(platform);
    if !demo.status.success() {
        let log = fs::read_to_string(local.join("receiver-demo.log")).unwrap_or_default();
        let last = log.lines().last().unwrap_or("").to_owned();
        return Err(format!("receiver demo failed: {last}"));
    }
    eprintln!("make demo: done; the temporary server and databases are removed");
    Ok(())
}
