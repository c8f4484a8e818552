//! Processes the harness starts: forked from one long-lived thread so that they die with the
//! test process (`PR_SET_PDEATHSIG`), even when it is killed with SIGKILL; killed and reaped;
//! and checked for life without counting zombies.

use std::fs;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock};

use nix::sys::prctl;
use nix::sys::signal::{self, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

/// The state letter and the process group of the process whose `/proc/<pid>/stat` is `stat`.
/// Both follow the command name, which is in parentheses and may hold spaces.
fn state_and_group(stat: &str) -> (Option<char>, Option<u32>) {
    let mut fields = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace();
    let state = fields.next().and_then(|s| s.chars().next());
    // After the state: the parent's pid, then the group.
    let group = fields.nth(1).and_then(|g| g.parse().ok());
    (state, group)
}

/// Whether a state letter is a live process's: a zombie (killed, not yet reaped) is gone.
fn live(state: Option<char>) -> bool {
    !matches!(state, Some('Z' | 'X') | None)
}

/// Whether `pid` is a live process. A zombie (killed, not yet reaped) counts as gone.
pub(crate) fn process_alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| live(state_and_group(&stat).0))
}

/// Whether a live process of process group `group` is left.
pub(crate) fn group_alive(group: u32) -> bool {
    let Ok(entries) = fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let stat = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let (state, g) = state_and_group(&stat);
        g == Some(group) && live(state)
    })
}

/// A request to the spawner thread.
type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Forks servers from one thread that lives as long as the process: `PR_SET_PDEATHSIG` fires
/// when the forking *thread* exits, so a short-lived thread would take the server with it.
pub(crate) fn spawn_long_lived(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testdb-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("the spawner thread starts");
        Mutex::new(tx)
    });
    // SAFETY: the closure only calls prctl, which is async-signal-safe, and allocates nothing;
    // nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from));
    }
    let (tx, rx) = mpsc::channel();
    sender
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

/// SIGKILL and reap a child of this process.
pub(crate) fn kill_and_reap(pid: u32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    let pid = Pid::from_raw(pid);
    let _ = signal::kill(pid, Signal::SIGKILL);
    let _ = waitpid(pid, None);
}

/// SIGKILL a process that is not a child of this one (a leftover of a killed run).
pub(crate) fn kill(pid: i32) {
    let _ = signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
}

/// Whether this process runs as root (the servers then need `--user=root`).
pub(crate) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A server process of ours while it runs: its pid, whether it exited, and a kill that reaps it
/// and drops its exit-cleanup entry. Shared by local servers and cluster nodes.
#[derive(Debug, Default)]
pub(crate) struct Running(Mutex<Option<Child>>);

impl Running {
    pub(crate) fn new(child: Child) -> Running {
        Running(Mutex::new(Some(child)))
    }

    fn lock(&self) -> MutexGuard<'_, Option<Child>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `child` from now on (after a restart).
    pub(crate) fn set(&self, child: Child) {
        *self.lock() = Some(child);
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.lock().as_ref().map(Child::id)
    }

    /// How the process ended, if it has.
    pub(crate) fn exited(&self) -> Option<ExitStatus> {
        self.lock()
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL and reap; returns the pid it ended, if it was running. The caller takes it off
    /// the exit registry (`cleanup`): this module sits below that one and never calls up.
    pub(crate) fn kill(&self) -> Option<u32> {
        let mut child = self.lock().take()?;
        let _ = child.kill();
        let _ = child.wait();
        Some(child.id())
    }
}
