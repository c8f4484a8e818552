//! Child processes of the suites and the kit ([`Proc`]), and `receiver consume` as one
//! ([`Consumer`]): in its normal build or in the fault build (`receiver-faults`, with barriers
//! armed), and the real signals a fault test sends it.
//!
//! Every process here is started with `testdb::spawn_tied`, so it dies with the test process
//! even when that is killed; its stdout and stderr go to one log file in the test process's
//! scratch directory, which is removed at exit.

use std::fs;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::workspace_bin;

/// The barrier points of `receiver-faults`, typed: a misspelt one does not compile.
pub use seam_names::Barrier;

/// The fault build of the receiver (`make fault-build` makes it).
pub fn receiver_faults_bin() -> PathBuf {
    workspace_bin("receiver-faults")
}

/// Where a barrier stopped the process: one line of the report file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub point: Barrier,
    pub hit: u64,
    /// The event id (or, at `after_ack_sent`, the delivery id).
    pub key: String,
    pub pid: u32,
}

impl Hit {
    fn parse(line: &str) -> Option<Hit> {
        let mut point = None;
        let mut hit = None;
        let mut key = None;
        let mut pid = None;
        for field in line.split_whitespace() {
            match field.split_once('=')? {
                ("barrier", v) => point = Barrier::parse(v),
                ("hit", v) => hit = v.parse().ok(),
                ("key", v) => key = Some(v.to_owned()),
                ("pid", v) => pid = v.parse().ok(),
                _ => {}
            }
        }
        Some(Hit {
            point: point?,
            hit: hit?,
            key: key?,
            pid: pid?,
        })
    }
}

/// A process a test or the kit started: stdout and stderr in one log file, tied to this process
/// (it dies with it, see `testdb::spawn_tied`), SIGKILLed and reaped on drop. Started as a
/// process group of its own ([`Proc::start_group`]) it takes signals as a group, and it has
/// ended only when every process of the group has: a command line run with `sh -c` keeps the
/// shell as the parent of the program, and the shell can die of a signal before the program
/// has finished reacting to it.
#[derive(Debug)]
pub struct Proc {
    /// Shared with the [`Watch`]es of it (which only ever `try_wait`).
    child: Arc<Mutex<Child>>,
    pid: u32,
    log: PathBuf,
    group: bool,
    status: Option<ExitStatus>,
    /// Set once this side sent it a signal: an end after that is not "by itself".
    signalled: Arc<AtomicBool>,
    /// How and when it ended by itself, as seen when the `Proc` went: its watches keep it.
    ended: Arc<Mutex<Option<(ExitStatus, Duration)>>>,
    started: Instant,
}

/// A look at a [`Proc`] from elsewhere (the kit's world, while a case waits): whether it
/// ended by itself, that is, not after a signal from this side. It ends when the `Proc` does.
#[derive(Debug, Clone)]
pub struct Watch {
    child: Weak<Mutex<Child>>,
    signalled: Arc<AtomicBool>,
    ended: Arc<Mutex<Option<(ExitStatus, Duration)>>>,
    started: Instant,
    log: PathBuf,
}

impl Watch {
    /// How it ended and after how long, if it ended by itself; `None` while it runs or once it
    /// was sent a signal. After its `Proc` is gone, what the `Proc` saw as it went.
    pub fn ended_by_itself(&self) -> Option<(ExitStatus, Duration)> {
        if let Some(seen) = *self.ended.lock().unwrap_or_else(|p| p.into_inner()) {
            return Some(seen);
        }
        if self.signalled.load(Ordering::SeqCst) {
            return None;
        }
        let child = self.child.upgrade()?;
        let status = child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_wait()
            .ok()
            .flatten()?;
        // A signal sent while the lock was waited for.
        (!self.signalled.load(Ordering::SeqCst)).then(|| (status, self.started.elapsed()))
    }

    /// Where its output goes.
    pub fn log(&self) -> &Path {
        &self.log
    }
}

impl Proc {
    /// Starts `cmd` with its output to a new file at `log`.
    pub fn start(cmd: Command, log: PathBuf) -> Proc {
        Self::spawn(cmd, log, false)
    }

    /// [`Proc::start`] in a process group of its own.
    pub fn start_group(mut cmd: Command, log: PathBuf) -> Proc {
        cmd.process_group(0);
        Self::spawn(cmd, log, true)
    }

    fn spawn(mut cmd: Command, log: PathBuf, group: bool) -> Proc {
        let out = fs::File::create(&log).expect("a log file");
        cmd.stdout(out.try_clone().expect("a log file")).stderr(out);
        let child = crate::spawn(cmd);
        Proc {
            pid: child.id(),
            child: Arc::new(Mutex::new(child)),
            log,
            group,
            status: None,
            signalled: Arc::new(AtomicBool::new(false)),
            ended: Arc::new(Mutex::new(None)),
            started: Instant::now(),
        }
    }

    /// A [`Watch`] on it.
    pub fn watch(&self) -> Watch {
        Watch {
            child: Arc::downgrade(&self.child),
            signalled: self.signalled.clone(),
            ended: self.ended.clone(),
            started: self.started,
            log: self.log.clone(),
        }
    }

    fn child(&self) -> std::sync::MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The process id (of the group's leader, for a group).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Where its output goes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Everything it printed so far.
    pub fn output(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its standard input, if the command was given a pipe (once).
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child().stdin.take()
    }

    /// Sends `signal` to the process, or to its group.
    pub fn signal(&self, signal: Signal) -> nix::Result<()> {
        self.signalled.store(true, Ordering::SeqCst);
        let pid = Pid::from_raw(self.pid() as i32);
        if self.group {
            killpg(pid, signal)
        } else {
            kill(pid, signal)
        }
    }

    /// How it ended, once it has (and, for a group, once every process of it has).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            let status = self.child().try_wait().ok().flatten();
            self.status = status;
        }
        match self.status {
            Some(_) if self.group && testdb::group_alive(self.pid) => None,
            status => status,
        }
    }

    /// Waits up to `within` for it to end; how it ended, or `None` if it is still running.
    pub async fn wait_within(&mut self, within: Duration) -> Option<ExitStatus> {
        crate::poll(within, Duration::from_millis(20), || {
            let status = self.try_wait();
            async move { status }
        })
        .await
    }

    /// Waits for it to end, blocking the thread.
    pub fn wait(&mut self) -> ExitStatus {
        if let Some(s) = self.status {
            return s;
        }
        let waited = self.child().wait();
        let status = waited.expect("wait for a child process");
        self.status = Some(status);
        status
    }

    /// SIGKILL, then waits (up to 10 s) for it to end.
    pub async fn kill(&mut self) {
        let _ = self.signal(Signal::SIGKILL);
        let _ = self.wait_within(Duration::from_secs(10)).await;
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // An end nobody signalled, kept for the watches (the kit reports it after the case).
        if !self.signalled.load(Ordering::SeqCst) {
            let exited = self
                .status
                .or_else(|| self.child().try_wait().ok().flatten());
            if let Some(status) = exited {
                *self.ended.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((status, self.started.elapsed()));
            }
        }
        if self.status.is_none() || self.group {
            let _ = self.signal(Signal::SIGKILL);
            let _ = self.child().wait();
        }
    }
}

/// A running `receiver consume`. Killed (SIGKILL) on drop if still running.
#[derive(Debug)]
pub struct Consumer {
    proc: Proc,
    stdin: Option<ChildStdin>,
    report: PathBuf,
}

fn scratch_file(stem: &str) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = testdb::scratch_dir().expect("a scratch directory");
    dir.join(format!("{stem}-{}", SEQ.fetch_add(1, Ordering::SeqCst)))
}

impl Consumer {
    /// The normal `receiver consume` with `env`.
    pub fn normal(env: &[(&str, String)]) -> Consumer {
        Self::start(crate::bare_command(&crate::receiver_bin()), env, &[])
    }

    /// `receiver-faults consume` with `env` and `armed` barriers, each at its hit
    /// (`RECEIVER_FAULT_BARRIERS`; `(Barrier::BeforeInsert, 2)` stops at its second pass).
    pub fn faulty(env: &[(&str, String)], armed: &[(Barrier, u64)]) -> Consumer {
        Self::start(crate::bare_command(&receiver_faults_bin()), env, armed)
    }

    /// `cmd` (the receiver's or `receiver-faults`' binary, made elsewhere: to run in a network
    /// namespace, say) as `consume`, with only `env` and, if any, the `armed` barriers.
    pub fn start(mut cmd: Command, env: &[(&str, String)], armed: &[(Barrier, u64)]) -> Consumer {
        let report = scratch_file("barriers");
        crate::bare(&mut cmd);
        cmd.arg("consume")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped());
        if !armed.is_empty() {
            let spec: Vec<String> = armed.iter().map(|(b, hit)| format!("{b}@{hit}")).collect();
            cmd.env("RECEIVER_FAULT_BARRIERS", spec.join(","))
                .env("RECEIVER_FAULT_REPORT", &report);
        }
        let mut proc = Proc::start(cmd, scratch_file("consume.log"));
        Consumer {
            stdin: proc.take_stdin(),
            proc,
            report,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Everything the process printed so far.
    pub fn output(&self) -> String {
        self.proc.output()
    }

    /// Where consume serves its metrics (it was started with `RECEIVER_METRICS_LISTEN`), from
    /// its `metrics: serving … listen=ADDR` line; waits up to 10 s for it.
    pub async fn metrics_addr(&self) -> String {
        let mut addr = String::new();
        crate::eventually(
            Duration::from_secs(10),
            "the metrics address in the log",
            || {
                addr = self
                    .output()
                    .lines()
                    .find(|l| l.contains("metrics: serving"))
                    .and_then(|l| l.split("listen=").nth(1))
                    .map(|a| a.trim().to_owned())
                    .unwrap_or_default();
                let found = !addr.is_empty();
                async move { found }
            },
        )
        .await;
        addr
    }

    /// How long after now `/readyz` on `addr` first answers 200 (`ready`) or 503 (not), polled
    /// every 50 ms; panics after `within` with the last answer.
    pub async fn readiness_becomes(addr: &str, ready: bool, within: Duration) -> Duration {
        let started = std::time::Instant::now();
        let want = if ready { 200 } else { 503 };
        loop {
            let (status, text) = crate::http_raw(addr, "GET", "/readyz", None, None);
            if status == want {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "/readyz still answered {status} ({}) after {within:?}",
                text.trim()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every barrier hit reported so far.
    pub fn hits(&self) -> Vec<Hit> {
        fs::read_to_string(&self.report)
            .unwrap_or_default()
            .lines()
            .filter_map(Hit::parse)
            .collect()
    }

    /// Waits until the process stops at barrier `point`; panics (with the log) if it exits or
    /// `within` passes first.
    pub async fn wait_barrier(&mut self, point: Barrier, within: Duration) -> Hit {
        let seen = crate::poll(within, Duration::from_millis(20), || {
            let seen = match self.hits().into_iter().find(|h| h.point == point) {
                Some(hit) => Some(Ok(hit)),
                None => self.try_wait().map(Err),
            };
            async move { seen }
        })
        .await;
        match seen {
            Some(Ok(hit)) => hit,
            Some(Err(status)) => panic!(
                "the consumer exited ({status}) before barrier {point}; its output:\n{}",
                self.output()
            ),
            None => panic!(
                "the consumer did not reach barrier {point} within {within:?}; its output:\n{}",
                self.output()
            ),
        }
    }

    /// Lets a process stopped at a barrier go on.
    pub fn release(&mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"go\n");
            let _ = stdin.flush();
        }
    }

    /// The exit status, if the process has ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.proc.try_wait()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) {
        self.proc
            .signal(signal)
            .unwrap_or_else(|e| panic!("kill -{signal} {}: {e}", self.pid()));
    }

    /// SIGKILL, then waits for the exit and checks that the signal ended it; the output.
    pub fn sigkill(mut self) -> String {
        if self.try_wait().is_none() {
            self.signal(Signal::SIGKILL);
        }
        let status = self.proc.wait();
        assert_eq!(
            status.signal(),
            Some(Signal::SIGKILL as i32),
            "the consumer ended with {status}, not by SIGKILL; its output:\n{}",
            self.output()
        );
        self.output()
    }

    /// SIGTERM, then waits (at most 10 s, the receiver's promise) for a successful exit; the
    /// output. Waits first (up to 20 s) for the `starting` line, which consume logs once it
    /// handles signals: a SIGTERM before that ends any process by the signal's default action.
    pub async fn stop(mut self) -> String {
        let started = crate::poll(Duration::from_secs(20), Duration::from_millis(20), || {
            let seen = if self.output().contains("starting:") {
                Some(true)
            } else {
                self.try_wait().map(|_| false)
            };
            async move { seen }
        })
        .await;
        assert!(
            started == Some(true),
            "consume never logged that it started; its output:\n{}",
            self.output()
        );
        self.signal(Signal::SIGTERM);
        assert!(
            self.proc
                .wait_within(Duration::from_secs(10))
                .await
                .is_some(),
            "consume did not exit within 10 s of SIGTERM; its output:\n{}",
            self.output()
        );
        let status = self.proc.wait();
        assert!(
            status.success(),
            "consume ended with {status} after SIGTERM; its output:\n{}",
            self.output()
        );
        self.output()
    }
}
