//! What this process must remove when it exits, and what earlier, killed runs left behind.
//!
//! Every server and scratch directory lives under `$TMPDIR/result-inbox-testdb/`, each with an
//! `owner.pid` (the test process). At exit (also after failed tests: the harness ends with
//! `exit()`) this process kills its servers and removes its directories and containers; a
//! later run removes directories whose owner is gone, killing a server still running there.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::process::{self, kill_and_reap, process_alive};

/// Servers and containers this process still has to remove at exit.
pub(crate) enum Cleanup {
    Process {
        pid: u32,
        dir: PathBuf,
    },
    Dir(PathBuf),
    #[cfg_attr(not(feature = "container"), allow(dead_code))]
    Container {
        id: String,
    },
    /// A network namespace of ours (`netns.rs`).
    Namespace(String),
    /// A root-namespace link of ours (`netns.rs`).
    Link(String),
}

static LIVE: Mutex<Vec<Cleanup>> = Mutex::new(Vec::new());

pub(crate) fn register(c: Cleanup) {
    remove_at_exit();
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).push(c);
}

pub(crate) fn unregister_pid(pid: u32) {
    LIVE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|c| !matches!(c, Cleanup::Process { pid: p, .. } if *p == pid));
}

extern "C" fn cleanup_at_exit() {
    let live = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|p| p.into_inner()));
    for c in live {
        match c {
            Cleanup::Process { pid, dir } => {
                kill_and_reap(pid);
                let _ = fs::remove_dir_all(dir);
            }
            Cleanup::Dir(dir) => {
                let _ = fs::remove_dir_all(dir);
            }
            Cleanup::Container { id } => {
                let _ = Command::new("docker")
                    .args(["rm", "--force", "--volumes", &id])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
            Cleanup::Namespace(name) => crate::leftovers::delete_namespace(&name),
            Cleanup::Link(name) => {
                let _ = Command::new("ip")
                    .args(["link", "delete", &name])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// Registers the exit hook once. The Rust test harness ends with `exit()`, also after failed
/// tests, so this runs for servers held in statics, which never drop.
pub(crate) fn remove_at_exit() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        // nix has no atexit, so this one call stays with libc.
        // SAFETY: registering a plain `extern "C"` function with no captured state.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
    });
}

pub(crate) fn root_dir() -> PathBuf {
    std::env::temp_dir().join("result-inbox-testdb")
}

/// This process's scratch directory, `<root>/<pid>-scratch`, made once and removed at exit.
pub(crate) fn scratch_dir() -> std::io::Result<PathBuf> {
    static SCRATCH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    SCRATCH
        .get_or_init(|| {
            let root = root_dir();
            fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
            sweep_leftovers(&root);
            let dir = root.join(format!("{}-scratch", std::process::id()));
            fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            fs::write(dir.join("owner.pid"), std::process::id().to_string())
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            register(Cleanup::Dir(dir.clone()));
            Ok(dir)
        })
        .clone()
        .map_err(std::io::Error::other)
}

/// Removes directories of earlier runs whose test process is gone, killing their servers, and
/// their network namespaces.
pub(crate) fn sweep_leftovers(root: &Path) {
    crate::leftovers::sweep();
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let read_pid = |name: &str| -> Option<i32> {
            fs::read_to_string(dir.join(name)).ok()?.trim().parse().ok()
        };
        match read_pid("owner.pid") {
            Some(owner) if process_alive(owner) => continue,
            // A directory being set up right now has no owner file for a moment.
            None if entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() < Duration::from_secs(60)) =>
            {
                continue
            }
            _ => {}
        }
        // A local server keeps its pid in `data/`, each node of a cluster in its own `n<i>/`.
        let nodes = fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.path().join("server.pid"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let servers = std::iter::once(dir.join("data/server.pid"))
            .chain(nodes)
            .filter_map(|f| fs::read_to_string(f).ok()?.trim().parse::<i32>().ok());
        for server in servers {
            let cmdline = fs::read(format!("/proc/{server}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy()) {
                // A leftover server of ours, identified by its datadir or configuration.
                process::kill(server);
            }
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
