//! `receiver-faults`: the `receiver` program with fault barriers (`RECEIVER_FAULT_BARRIERS`,
//! see `receiver_test_builds::barriers`), for the fault regressions. Built by
//! `make fault-build` and never part of a release.

use receiver::config::ConsumeConfig;
use receiver::program::{ConsumeFuture, Program, Stop, RECEIVER};

fn main() -> std::process::ExitCode {
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
