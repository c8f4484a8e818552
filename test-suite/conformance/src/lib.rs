//! Shared pieces of the conformance suite: a receiver database initialised the way a DBA and
//! `receiver init` would, event builders, and the path of the real `receiver` binary.
//!
//! Every database here lives on a real server from `testdb`; nothing is mocked.
//!
//! This crate is the top of the test layers: it drives the shipped programs, `orbit-dev` and
//! `commit-proxy` as real processes and servers, and nothing depends on it. What it must never
//! do: mock the database or the platform, judge a receiver in the kit by anything but the
//! platform's state, the two tables and the program's exit and output, or print a token, a
//! password or a result body in a verdict.

pub mod bins;
pub mod database;
pub mod docs;
pub mod events;
pub mod http;
pub mod kit;
pub mod ledger;
pub mod load;
pub mod orbit;
pub mod process;
pub mod wait;

pub use bins::{
    bare, bare_command, files_under, receiver_bin, run_receiver, spawn, workspace_bin,
    workspace_example, RUN_MARKER,
};
pub use database::{
    admin_in_sync, age_inbox_rows, initialise, insert_old_inbox_rows, prune_env, OwnServerReceiver,
    ReceiverDb,
};
pub use events::EventSpec;
pub use http::{http_json, http_raw};
pub use ledger::{check_ledger, check_ledger_on, Ledger};
pub use orbit::{all_acked, bootstrap, cancelled_task, subscribed_receiver, Launcher, OrbitDev};
pub use wait::{eventually, poll, poll_blocking};

/// Writes `suite: line` to standard error past the test harness's capture of `eprintln!`: a
/// figure for the run's log, which `make integration` repeats under its table.
pub fn note(suite: &str, line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{suite}: {line}");
}

/// The queue the suite's events come from unless a test says otherwise.
pub const QUEUE: &str = "inbox-demo";
