//! `receiver-faults`: the `receiver` program built with fault barriers, for the fault
//! regressions only (see `receiver::fault`). It is built by `make fault-build` and is never
//! part of a release.

#[path = "../main.rs"]
mod program;

fn main() -> std::process::ExitCode {
    program::main()
}
