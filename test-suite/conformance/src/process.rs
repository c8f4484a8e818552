//! `receiver consume` as a real process, in its normal build or in the fault build
//! (`receiver-faults`, with barriers armed), and the real signals a fault test sends it.
//!
//! Every process here is started with `testdb::spawn_tied`, so it dies with the test process
//! even when that is killed; its stdout and stderr go to one log file in the test process's
//! scratch directory, which is removed at exit.

use std::fs;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::workspace_bin;

/// The barrier points of `receiver-faults`, in flow order (`product/receiver/src/fault.rs`; the fault
/// build exits with an error naming the points if it is given any other).
pub const BARRIERS: &[&str] = &[
    "before_insert",
    "before_commit",
    "after_commit",
    "after_ack_sent",
];

/// The fault build of the receiver (`make fault-build` makes it).
pub fn receiver_faults_bin() -> PathBuf {
    workspace_bin("receiver-faults")
}

/// Where a barrier stopped the process: one line of the report file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub point: String,
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
                ("barrier", v) => point = Some(v.to_owned()),
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

/// A running `receiver consume`. Killed (SIGKILL) on drop if still running.
#[derive(Debug)]
pub struct Consumer {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    /// stdout and stderr, interleaved.
    pub log: PathBuf,
    report: PathBuf,
    /// How the process ended, once it has.
    status: Option<ExitStatus>,
}

fn scratch_file(stem: &str) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = testdb::scratch_dir().expect("a scratch directory");
    dir.join(format!("{stem}-{}", SEQ.fetch_add(1, Ordering::SeqCst)))
}

impl Consumer {
    /// The normal `receiver consume` with `env`.
    pub fn normal(env: &[(&str, String)]) -> Consumer {
        Self::spawn(&crate::receiver_bin(), env, None)
    }

    /// `receiver-faults consume` with `env` and `barriers` armed (`RECEIVER_FAULT_BARRIERS`,
    /// e.g. `after_commit` or `before_insert@2`).
    pub fn faulty(env: &[(&str, String)], barriers: &str) -> Consumer {
        Self::spawn(&receiver_faults_bin(), env, Some(barriers))
    }

    fn spawn(bin: &Path, env: &[(&str, String)], barriers: Option<&str>) -> Consumer {
        let log = scratch_file("consume.log");
        let report = scratch_file("barriers");
        let out = fs::File::create(&log).expect("log file");
        let mut cmd = crate::bare_command(bin);
        cmd.arg("consume")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out);
        if let Some(b) = barriers {
            cmd.env("RECEIVER_FAULT_BARRIERS", b)
                .env("RECEIVER_FAULT_REPORT", &report);
        }
        let mut child = crate::spawn(cmd);
        Consumer {
            stdin: child.stdin.take(),
            child: Some(child),
            log,
            report,
            status: None,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Everything the process printed so far.
    pub fn output(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
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
    pub async fn wait_barrier(&mut self, point: &str, within: Duration) -> Hit {
        let deadline = Instant::now() + within;
        loop {
            if let Some(hit) = self.hits().into_iter().find(|h| h.point == point) {
                return hit;
            }
            if let Some(status) = self.try_wait() {
                panic!(
                    "the consumer exited ({status}) before barrier {point}; its output:\n{}",
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the consumer did not reach barrier {point} within {within:?}; its output:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
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
        if self.status.is_none() {
            if let Some(child) = self.child.as_mut() {
                self.status = child.try_wait().ok().flatten();
            }
        }
        self.status
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(self.pid() as i32);
        kill(pid, signal).unwrap_or_else(|e| panic!("kill -{signal} {pid}: {e}"));
    }

    /// SIGKILL, then waits for the exit and checks that the signal ended it; the output.
    pub fn sigkill(mut self) -> String {
        if self.try_wait().is_none() {
            self.signal(Signal::SIGKILL);
        }
        let status = self.wait();
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
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.output().contains("starting:") {
            assert!(
                Instant::now() < deadline && self.try_wait().is_none(),
                "consume never logged that it started; its output:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.signal(Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.try_wait().is_none() {
            assert!(
                Instant::now() < deadline,
                "consume did not exit within 10 s of SIGTERM; its output:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let status = self.wait();
        assert!(
            status.success(),
            "consume ended with {status} after SIGTERM; its output:\n{}",
            self.output()
        );
        self.output()
    }

    fn wait(&mut self) -> ExitStatus {
        if let Some(s) = self.status {
            return s;
        }
        let child = self.child.as_mut().expect("a child");
        let status = child.wait().expect("wait for the consumer");
        self.status = Some(status);
        status
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.status.is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
