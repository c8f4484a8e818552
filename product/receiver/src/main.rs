//! The `receiver` binary: the program ([`receiver::program`]) with its own parts.

fn main() -> std::process::ExitCode {
    receiver::program::main(&receiver::program::RECEIVER)
}
