//! What every program of this project says about itself, the same way in all six (`receiver`,
//! `demo`, `conformance`, `orbit-dev`, `commit-proxy`, `integration`): one version line, and
//! whether a command line asks for help or for that line.
//!
//! A request for help is honoured wherever it stands among the arguments, so that
//! `receiver --help prune --older-than 30d` explains `prune` and prunes nothing: each program
//! asks [`asked`] before it reads any configuration, writes any file or opens any connection.
//! This crate does nothing else, and depends on nothing but the canonical form (for its
//! version).

use std::ffi::OsStr;

/// The version of the receiver contract (docs/receiver-contract.md) that this build's receiver
/// keeps and this build's kit checks: a change to a MUST rule, or to what a MUST case relies
/// on, is a new major version.
pub const CONTRACT_VERSION: &str = "1.1";

/// The canonical form's version, as `canonical-form` defines it.
pub use canonical_form::FORM_VERSION;

/// This project's version (one for every crate, from the workspace's manifest).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit this build comes from (12 hex digits), or `unknown`.
pub const COMMIT: &str = env!("RESULT_INBOX_COMMIT");

/// What a command line asks for before anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// `--help` or `-h` somewhere: print the help of the command named, exit 0, act on nothing.
    Help,
    /// `--version` or `-V` somewhere (and no help): print [`version_line`], exit 0.
    Version,
    /// Neither: read the command line as usual.
    Run,
}

/// Whether `args` (the arguments after the program's name) ask for help or the version.
/// Arguments after a lone `--` are another program's and are not read. Help wins over the
/// version: a person who asks both wants to know how to use it.
pub fn asked<S: AsRef<OsStr>>(args: &[S]) -> Asked {
    let mut version = false;
    for a in args.iter().map(AsRef::as_ref) {
        if a == "--" {
            break;
        }
        if a == "--help" || a == "-h" {
            return Asked::Help;
        }
        version |= a == "--version" || a == "-V";
    }
    if version {
        Asked::Version
    } else {
        Asked::Run
    }
}

/// Answers a command line that asks for help or the version, as every program does: prints the
/// help of the command `args` name among `commands` (`help` gives its text; `None` is the
/// program's own), or [`version_line`]. `true` when it answered: the caller exits 0 and does
/// nothing else.
pub fn answered<S: AsRef<OsStr>>(
    program: &str,
    args: &[S],
    commands: &[&str],
    help: impl FnOnce(Option<&str>) -> String,
) -> bool {
    match asked(args) {
        Asked::Help => print(&help(command_named(args, commands))),
        Asked::Version => print(&version_line(program)),
        Asked::Run => return false,
    }
    true
}

/// The first of `args` that is one of `commands`: the command whose help to print.
pub fn command_named<'a, S: AsRef<OsStr>>(args: &[S], commands: &[&'a str]) -> Option<&'a str> {
    args.iter()
        .map(AsRef::as_ref)
        .take_while(|a| *a != "--")
        .find_map(|a| commands.iter().find(|c| OsStr::new(c) == a).copied())
}

/// Prints `text` and a newline on stdout, as help and the version are printed: a reader that
/// stops early (`| head`) closes the pipe, which is no error of ours, so nothing panics.
pub fn print(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

/// The one line `--version` prints: the program, its version, the commit it was built from,
/// the receiver contract's version and the canonical form's version.
pub fn version_line(program: &str) -> String {
    format!(
        "{program} {VERSION} (commit {COMMIT}; receiver contract {CONTRACT_VERSION}; canonical form {})",
        FORM_VERSION
    )
}

/// [`version_line`] with one more part before its closing parenthesis (the receiver names the
/// schema version it needs).
pub fn version_line_with(program: &str, more: &str) -> String {
    let line = version_line(program);
    format!("{}; {more})", line.trim_end_matches(')'))
}

/// What to say of an unknown command (after the program's `name: `): names it and lists the
/// commands.
pub fn unknown_command(program: &str, given: &str, commands: &[&str]) -> String {
    format!(
        "unknown command `{given}`; the commands are {} (`{program} --help`)",
        commands.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_anywhere_wins_and_nothing_after_a_double_dash_is_read() {
        assert_eq!(asked(&["prune", "--older-than", "30d", "-h"]), Asked::Help);
        assert_eq!(asked(&["--help", "prune"]), Asked::Help);
        assert_eq!(asked(&["-V", "init", "--help"]), Asked::Help);
        assert_eq!(asked(&["init", "--version"]), Asked::Version);
        assert_eq!(asked(&["init"]), Asked::Run);
        assert_eq!(asked(&["--only", "cli", "--", "--help"]), Asked::Run);
        // Only the exact words: a value that merely contains them is a value.
        assert_eq!(asked(&["--since", "--helpful"]), Asked::Run);
    }

    #[test]
    fn the_command_is_the_first_argument_that_names_one() {
        let commands = ["init", "prune"];
        assert_eq!(
            command_named(&["--help", "prune"], &commands),
            Some("prune")
        );
        assert_eq!(command_named(&["-h"], &commands), None);
        assert_eq!(command_named(&["--", "init"], &commands), None);
    }

    #[test]
    fn the_version_line_names_all_five_facts() {
        let line = version_line("receiver");
        assert!(
            line.starts_with(&format!("receiver {VERSION} (commit ")),
            "{line}"
        );
        assert!(line.contains("receiver contract 1.1"), "{line}");
        assert!(line.ends_with("canonical form 1)"), "{line}");
        assert!(!line.contains('\n'));
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() == 12 && COMMIT.bytes().all(|b| b.is_ascii_hexdigit())),
            "{COMMIT}"
        );
    }
}
