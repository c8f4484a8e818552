//! `receiver-mutant`: the `receiver` program with one rule broken on purpose (see
//! `receiver::mutant`), for the conformance kit's proof that it catches each. Built by
//! `make mutant-build` and never part of a release.

#[path = "../main.rs"]
mod program;

fn main() -> std::process::ExitCode {
    program::main()
}
