//! `receiver-faults`: the `receiver` program with fault barriers (`RECEIVER_FAULT_BARRIERS`,
//! see `receiver_test_builds::barriers`) and, when `RECEIVER_TEST_SCHEMA_STEP` asks, a
//! test-only schema step, for the fault regressions. Built by
//! `make fault-build` and never part of a release.

use receiver::config::ConsumeConfig;
use receiver::program::{ConsumeFuture, Program, Stop, RECEIVER};

fn main() -> std::process::ExitCode {
    receiver_test_builds::barriers::install_test_steps();
    // `migrate` stops at its barriers too (`step_started`, `step_done`).
    if std::env::args().nth(1).as_deref() == Some("migrate") {
        receiver_test_builds::barriers::install();
    }
    receiver::program::main(&Program {
        consume: consume_with_barriers,
        ..RECEIVER
    })
}

/// `consume` with every barrier installed first: the settings are checked, and said, before
/// anything connects.
fn consume_with_barriers(config: &ConsumeConfig, stop: Stop) -> ConsumeFuture<'_> {
    receiver_test_builds::barriers::install();
    (RECEIVER.consume)(config, stop)
}
