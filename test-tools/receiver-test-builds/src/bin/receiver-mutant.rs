//! `receiver-mutant`: the `receiver` program with one rule broken on purpose
//! (`RECEIVER_MUTANT`, see `receiver_test_builds::mutants`), for the conformance kit's proof
//! that it catches each. Built by `make mutant-build` and never part of a release.

fn main() -> std::process::ExitCode {
    receiver::program::main(&receiver_test_builds::mutants::PROGRAM)
}
