//! `conformance run --receiver CMD`: the conformance kit against any receiver program (see
//! `fixtures::kit` and the README's "Your own receiver").
//!
//! Options: `--only CASE[,CASE…]`, `--seed N` (the crash loop's schedule; by default one from
//! the clock, printed), `--junit FILE` (a JUnit XML report), `--json FILE` (a JSON report),
//! `--expect FILE` (cases known to fail, each with a reason), `--strict` (SHOULD cases count
//! too), `--keep-logs DIR` (where a failed case's receiver output is kept), `--jobs N` (cases
//! at once), `--list` (the cases); `--help` after any command. Report paths are checked, and their directories made, before
//! the first case. Exit 0 when no case fails the run (a MUST that failed, a SHOULD under
//! `--strict`, or any change from the expectations), 1 otherwise, 2 for a bad command line or
//! an unwritable report.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use conformance_kit::report::{self, CaseResult, Expected};
use conformance_kit::runner::{at_most, run_case};
use conformance_kit::{cases, Ctx, Level};

const USAGE: &str = "usage: conformance run --receiver 'COMMAND LINE' [--only CASE[,CASE…]] [--seed N] [--junit FILE] [--json FILE] [--certificate FILE] [--expect FILE] [--strict] [--keep-logs DIR] [--jobs N]\n       conformance mutants --receiver-mutant PATH [--runs N] [--only MUTANT[,MUTANT…]] [--seed N] [--jobs N] [--matrix FILE]\n       conformance list\n       conformance <command> --help";

const RUN_HELP: &str = "usage: conformance run --receiver 'COMMAND LINE' [--only CASE[,CASE…]] [--seed N] [--junit FILE] [--json FILE] [--certificate FILE] [--expect FILE] [--strict] [--keep-logs DIR] [--jobs N]

Runs the kit's cases against the receiver the command line starts (`COMMAND LINE init`, then
`COMMAND LINE consume`, with only the documented environment), one case at a time (or N at a
time), each in a world of its own (databases, orbit-dev, a subscription). Exit 0 when no case fails the run, 1
otherwise, 2 for a bad command line or an unwritable report.

  --receiver CMD     the receiver's command line, run with sh -c (required)
  --only CASES       some cases, by name (conformance list names them)
  --seed N           replays a run's drawn values and schedules (each run prints its seed)
  --junit FILE       a JUnit XML report; --json FILE a JSON report
  --certificate FILE a certificate of the run to publish: the kit (version, contract, its
                     SHA-256), the receiver (command, `--version` line), the database, the
                     seed, every case's verdict, the run's verdict plain and strict
  --expect FILE      cases known to fail, or that cannot run here, one `case: reason` a line
                     (`#` starts a comment); a case that fails otherwise than expected, or
                     passes, fails the run
  --strict           SHOULD cases fail the run too
  --keep-logs DIR    where the receiver's output of each failed case is kept (one directory a
                     case; default target/kit/logs); a passed case's is removed
  --jobs N           cases run at once, 1 to 8 (default 1): each case's timings hold with
                     three at once on two cores; a machine busy with other work may need 1
  --database URL     mysql://ADMIN:PASSWORD@HOST:PORT: make the cases' databases and accounts
                     on that server (a CI's service database) instead of servers of the kit's
                     own; it creates and drops only databases and users named orbit_test_*,
                     orbit_receiver_test_* and rit_*. The five cases that stop or reconfigure
                     their server (utc, every-connection, long-outage, database-restart,
                     read-only) still start one of their own (mariadbd or mysqld installed);
                     where they cannot, they are not run: declare them in --expect

Every option can come from the environment instead: CONFORMANCE_RECEIVER, CONFORMANCE_ONLY,
CONFORMANCE_SEED, CONFORMANCE_JUNIT, CONFORMANCE_JSON, CONFORMANCE_CERTIFICATE,
CONFORMANCE_EXPECT, CONFORMANCE_STRICT (1 or 0), CONFORMANCE_KEEP_LOGS, CONFORMANCE_JOBS,
CONFORMANCE_DATABASE; the command line wins. With CONFORMANCE_RECEIVER set, `conformance` with
no arguments runs.

A case that could not run (a server, a tool or a privilege it needs is missing) is reported as
not run with why, never as passed, and fails the run unless --expect declares it with a reason.";

const MUTANTS_HELP: &str = "usage: conformance mutants --receiver-mutant PATH [--runs N] [--only MUTANT[,MUTANT…]] [--seed N] [--jobs N] [--matrix FILE]

Runs each mutant of our receiver (PATH, built by `make mutant-build`; RECEIVER_MUTANT picks the
rule it breaks) against the case aimed at it, which must fail naming that rule, N times (1 by
default), run k with seed N+k (N drawn from the clock unless --seed). A mutant counts as caught
only if every run caught it. --jobs N runs N mutants at once (1 to 8, default 1). --matrix FILE
writes the mutant matrix (each mutant, its case and rule, caught in how many runs, with this
kit binary's SHA-256); kept as mutant-matrix.json beside the binary, every certificate of that
binary embeds it. It needs this repository's test build of our receiver (`make mutant-build`).
Exit 0 when every mutant is caught, 1 otherwise, 2 for a bad command line.";

/// The commands, for the help and the unknown-command line.
const COMMANDS: &[&str] = &["run", "mutants", "list"];

const LIST_HELP: &str = "usage: conformance list

Prints every case: its name, level (MUST or SHOULD), the rules it proves and what it does.";

/// Where the receiver's output of a failed case is kept unless `--keep-logs` says otherwise.
const DEFAULT_KEEP_LOGS: &str = "target/kit/logs";

struct Options {
    receiver: String,
    only: Option<Vec<String>>,
    seed: u64,
    junit: Option<std::path::PathBuf>,
    json: Option<std::path::PathBuf>,
    certificate: Option<std::path::PathBuf>,
    expect: Vec<Expected>,
    strict: bool,
    keep_logs: std::path::PathBuf,
    jobs: usize,
    /// The server the cases' databases go on (`--database`), instead of servers of the kit's own.
    database: Option<secret::Secret>,
}

/// What the command line asks for.
enum Asked {
    Run(Options),
    Mutants(MutantOptions),
    Nothing,
}

/// What `conformance mutants` was asked.
#[derive(Debug)]
struct MutantOptions {
    bin: String,
    /// Where to write the mutant matrix (`--matrix`).
    matrix: Option<std::path::PathBuf>,
    runs: u64,
    only: Option<Vec<String>>,
    seed: u64,
    jobs: usize,
}

/// `--seed`'s value.
fn seed_of(v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| format!("--seed {v:?} is not a whole number"))
}

/// `--only`'s value: names of `kind` (case, mutant), each one of `names`.
fn only_of(v: &str, kind: &str, names: &[&str]) -> Result<Vec<String>, String> {
    let list: Vec<String> = v.split(',').map(str::to_owned).collect();
    if let Some(bad) = list.iter().find(|n| !names.contains(&n.as_str())) {
        return Err(format!(
            "--only: no {kind} {bad:?}; {kind}s: {}",
            names.join(", ")
        ));
    }
    Ok(list)
}

/// A seed from the clock, when none is given.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// The command line's structure; clap reads it, and the words of every help and error are the
/// kit's own ([`USAGE`], [`refused`]).
#[derive(clap::Parser)]
#[command(
    name = "conformance",
    disable_help_flag = true,
    disable_version_flag = true,
    disable_help_subcommand = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    Run(RunArgs),
    Mutants(MutantArgs),
    List,
}

#[derive(clap::Args)]
struct RunArgs {
    #[arg(long, allow_hyphen_values = true)]
    receiver: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    only: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    seed: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    junit: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    json: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    certificate: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    expect: Option<String>,
    #[arg(long)]
    strict: bool,
    #[arg(long, allow_hyphen_values = true)]
    keep_logs: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    jobs: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    database: Option<String>,
}

#[derive(clap::Args)]
struct MutantArgs {
    #[arg(long, allow_hyphen_values = true)]
    receiver_mutant: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    matrix: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    runs: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    only: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    seed: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    jobs: Option<String>,
}

/// What each flag's value is, for the line that says it is missing.
const VALUES: &[(&str, &str)] = &[
    ("--receiver", "a command line"),
    ("--only", "CASE[,CASE…]"),
    ("--seed", "a number"),
    ("--junit", "a file"),
    ("--json", "a file"),
    ("--certificate", "a file"),
    ("--expect", "a file"),
    ("--keep-logs", "a directory"),
    ("--receiver-mutant", "a path"),
    ("--matrix", "a file"),
    ("--runs", "a number"),
    ("--jobs", "a number from 1 to 8"),
    ("--database", "a URL, mysql://ADMIN:PASSWORD@HOST:PORT"),
];

/// `--jobs`' value in `command`: how many cases (or mutants) run at once.
fn jobs_of(command: &str, value: Option<String>) -> Result<usize, String> {
    match given(command, "--jobs", value)? {
        Some(v) => v
            .parse()
            .ok()
            .filter(|n| (1..=8).contains(n))
            .ok_or(format!("--jobs {v:?} is not a number from 1 to 8")),
        None => Ok(1),
    }
}

/// `flag`'s value in `command`, which must not be empty.
fn given(command: &str, flag: &str, value: Option<String>) -> Result<Option<String>, String> {
    match value {
        Some(v) if v.is_empty() => Err(needs(command, flag)),
        v => Ok(v),
    }
}

/// The line for a flag of `command` given without its value.
fn needs(command: &str, flag: &str) -> String {
    let what = match (command, flag) {
        ("mutants", "--only") => "MUTANT[,MUTANT…]",
        _ => VALUES
            .iter()
            .find(|(f, _)| *f == flag)
            .map_or("a value", |(_, w)| w),
    };
    format!("{flag} needs {what}")
}

/// The kit's own line for what clap refused in `command` (`None`: before any command).
fn refused(command: Option<&str>, e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let context = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        Some(ContextValue::Strings(s)) => s.first().cloned().unwrap_or_default(),
        _ => String::new(),
    };
    // `--seed <SEED>` names the flag; the flag is what a person typed.
    let flag = context(ContextKind::InvalidArg)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_owned();
    match (e.kind(), command) {
        (ErrorKind::InvalidSubcommand, _) => about::unknown_command(
            "conformance",
            &context(ContextKind::InvalidSubcommand),
            COMMANDS,
        ),
        (ErrorKind::UnknownArgument, None) => {
            about::unknown_command("conformance", &flag, COMMANDS)
        }
        (ErrorKind::UnknownArgument, Some("list")) => {
            format!("list: unexpected argument `{flag}` (`conformance list --help`)")
        }
        (ErrorKind::UnknownArgument, Some(c)) => {
            format!("{c}: unknown argument `{flag}` (`conformance {c} --help`)")
        }
        (ErrorKind::InvalidValue | ErrorKind::NoEquals, c) => needs(c.unwrap_or(""), &flag),
        (_, c) => format!(
            "{}the command line could not be read (`conformance {}--help`)",
            c.map(|c| format!("{c}: ")).unwrap_or_default(),
            c.map(|c| format!("{c} ")).unwrap_or_default()
        ),
    }
}

fn parse(args: &[String]) -> Result<Asked, String> {
    let names: Vec<&str> = cases().iter().map(|c| c.name).collect();
    // Help and the version before anything is read or written, wherever they stand.
    let help = |command: Option<&str>| {
        match command {
            Some("run") => RUN_HELP,
            Some("mutants") => MUTANTS_HELP,
            Some("list") => LIST_HELP,
            _ => USAGE,
        }
        .to_owned()
    };
    if about::answered("conformance", args, COMMANDS, help) {
        return Ok(Asked::Nothing);
    }
    let command = about::command_named(args, &["run", "mutants", "list", "--list"]);
    // `--list` is the old spelling of `list`.
    let command = command.map(|c| if c == "--list" { "list" } else { c });
    let words = args.iter().enumerate().map(|(i, a)| match (i, a.as_str()) {
        (0, "--list") => "list",
        (_, a) => a,
    });
    let cli = <Cli as clap::Parser>::try_parse_from(std::iter::once("conformance").chain(words))
        .map_err(|e| refused(command, &e))?;
    match cli.command {
        None => Err(format!(
            "no command given; the commands are {} (`conformance --help`)",
            COMMANDS.join(", ")
        )),
        Some(Command::List) => {
            for c in cases() {
                println!(
                    "{:<24} {:<7} {:<32} {}",
                    c.name,
                    c.level.as_str(),
                    c.rules,
                    c.what
                );
            }
            Ok(Asked::Nothing)
        }
        Some(Command::Mutants(m)) => mutant_options(m).map(Asked::Mutants),
        Some(Command::Run(r)) => run_options(r, &names).map(Asked::Run),
    }
}

/// The variable that stands in for `flag` of `conformance run` when the flag is not given, so
/// that the kit (and its image) can be configured by the environment alone.
fn variable_of(flag: &str) -> String {
    format!(
        "CONFORMANCE_{}",
        flag.trim_start_matches('-')
            .replace('-', "_")
            .to_ascii_uppercase()
    )
}

/// `flag`'s value: the command line's, else its variable's ([`variable_of`]); an empty value
/// of either is refused, naming which.
fn given_or_env(flag: &str, value: Option<String>) -> Result<Option<String>, String> {
    if value.is_some() {
        return given("run", flag, value);
    }
    let name = variable_of(flag);
    #[allow(clippy::disallowed_methods)] // the kit's own configuration, read in one place
    match std::env::var(&name) {
        Ok(v) if v.is_empty() => Err(format!("{name} is set but empty (it stands for {flag})")),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name} is not valid UTF-8")),
        Err(std::env::VarError::NotPresent) => Ok(None),
    }
}

fn run_options(r: RunArgs, names: &[&str]) -> Result<Options, String> {
    let r = RunArgs {
        receiver: given_or_env("--receiver", r.receiver)?,
        only: given_or_env("--only", r.only)?,
        seed: given_or_env("--seed", r.seed)?,
        junit: given_or_env("--junit", r.junit)?,
        json: given_or_env("--json", r.json)?,
        certificate: given_or_env("--certificate", r.certificate)?,
        expect: given_or_env("--expect", r.expect)?,
        strict: r.strict
            || match given_or_env("--strict", None)?.as_deref() {
                None | Some("0" | "false" | "no") => false,
                Some("1" | "true" | "yes") => true,
                Some(other) => {
                    return Err(format!(
                        "CONFORMANCE_STRICT={other:?} is not one of 1, true, yes, 0, false, no"
                    ))
                }
            },
        keep_logs: given_or_env("--keep-logs", r.keep_logs)?,
        jobs: given_or_env("--jobs", r.jobs)?,
        database: given_or_env("--database", r.database)?,
    };
    let database = r
        .database
        .map(|url| {
            let ok = url.starts_with("mysql://") || url.starts_with("mariadb://");
            ok.then(|| secret::Secret::new(url)).ok_or(
                "--database must look like mysql://ADMIN:PASSWORD@HOST:PORT (the server the kit makes its databases and accounts on)",
            )
        })
        .transpose()?;
    let receiver = given("run", "--receiver", r.receiver)?;
    let only = given("run", "--only", r.only)?
        .map(|v| only_of(&v, "case", names))
        .transpose()?;
    let seed = given("run", "--seed", r.seed)?
        .map(|v| seed_of(&v))
        .transpose()?;
    let junit = given("run", "--junit", r.junit)?.map(Into::into);
    let json = given("run", "--json", r.json)?.map(Into::into);
    let certificate = given("run", "--certificate", r.certificate)?.map(Into::into);
    let expect = match given("run", "--expect", r.expect)? {
        Some(file) => {
            let text =
                std::fs::read_to_string(&file).map_err(|e| format!("--expect {file}: {e}"))?;
            report::parse_expectations(&text, names).map_err(|e| format!("--expect {file}: {e}"))?
        }
        None => Vec::new(),
    };
    let jobs = jobs_of("run", r.jobs)?;
    let keep_logs = given("run", "--keep-logs", r.keep_logs)?
        .map_or_else(|| std::path::PathBuf::from(DEFAULT_KEEP_LOGS), Into::into);
    let receiver = receiver.ok_or(
        "run: --receiver (or CONFORMANCE_RECEIVER) is required: the command line that starts your receiver, e.g. --receiver 'python3 receiver.py' (`conformance run --help`)",
    )?;
    Ok(Options {
        receiver,
        only,
        seed: seed.unwrap_or_else(clock_seed),
        junit,
        json,
        certificate,
        expect,
        strict: r.strict,
        keep_logs,
        jobs,
        database,
    })
}

fn mutant_options(m: MutantArgs) -> Result<MutantOptions, String> {
    let names: Vec<&str> = conformance_kit::MUTANTS
        .iter()
        .map(|m| m.0.name())
        .collect();
    let bin = given("mutants", "--receiver-mutant", m.receiver_mutant)?;
    let runs = match given("mutants", "--runs", m.runs)? {
        Some(v) => v
            .parse()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or(format!("--runs {v:?} is not a number from 1 to 1000"))?,
        None => 1,
    };
    let only = given("mutants", "--only", m.only)?
        .map(|v| only_of(&v, "mutant", &names))
        .transpose()?;
    let seed = given("mutants", "--seed", m.seed)?
        .map(|v| seed_of(&v))
        .transpose()?;
    Ok(MutantOptions {
        bin: bin.ok_or(
            "mutants: --receiver-mutant is required: the path of the mutant build (`make mutant-build`) (`conformance mutants --help`)",
        )?,
        matrix: given("mutants", "--matrix", m.matrix)?.map(Into::into),
        runs,
        only,
        seed: seed.unwrap_or_else(clock_seed),
        jobs: jobs_of("mutants", m.jobs)?,
    })
}

/// One case's result.
struct Ran {
    name: &'static str,
    rules: &'static str,
    /// The failure's level (the rule's it names, never lower than the case's), or the case's.
    level: conformance_kit::Level,
    /// The case's own level.
    case_level: conformance_kit::Level,
    seconds: f64,
    verdict: Result<String, String>,
    /// The expectations file's reason, when it says this case fails.
    expected: Option<String>,
}

impl Ran {
    fn result(&self) -> CaseResult<'_> {
        CaseResult {
            name: self.name,
            rules: self.rules,
            level: self.level,
            seconds: self.seconds,
            verdict: &self.verdict,
            expected: self.expected.as_deref(),
        }
    }
}

fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

fn junit(ran: &[Ran], o: &Options, replay: &str, seconds: f64) -> String {
    let failures = ran
        .iter()
        .filter(|r| r.verdict.is_err() && r.expected.is_none())
        .filter(|r| r.result().outcome() != report::Outcome::NotRun)
        .count();
    let errors = ran
        .iter()
        .filter(|r| r.result().outcome() == report::Outcome::NotRun)
        .count();
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        s,
        "<testsuite name=\"result-inbox conformance kit {} (contract {})\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{seconds:.1}\">",
        env!("CARGO_PKG_VERSION"),
        conformance_kit::CONTRACT_VERSION,
        ran.len()
    );
    let _ = writeln!(
        s,
        "  <properties>\n    <property name=\"receiver\" value=\"{}\"/>\n    <property name=\"seed\" value=\"{}\"/>\n    <property name=\"replay\" value=\"{}\"/>\n  </properties>",
        xml(&o.receiver),
        o.seed,
        xml(replay)
    );
    for r in ran {
        let _ = write!(
            s,
            "  <testcase classname=\"kit.{}\" name=\"{} [{} {}]\" time=\"{:.1}\"",
            xml(r.name),
            xml(r.name),
            r.level.as_str(),
            xml(r.rules),
            r.seconds
        );
        match (&r.verdict, r.result().outcome()) {
            (Err(why), report::Outcome::NotRun) => {
                let _ = writeln!(
                    s,
                    ">\n    <error message=\"not run: {}\">{}\nnot run is never a pass: make the case runnable here, or declare it in --expect with a reason</error>\n  </testcase>",
                    xml(why.lines().next().unwrap_or("not run")),
                    xml(why)
                );
            }
            (Err(why), report::Outcome::DeclaredNotRun) => {
                let _ = writeln!(
                    s,
                    ">\n    <skipped message=\"not run here (declared): {}\">{}</skipped>\n  </testcase>",
                    xml(r.expected.as_deref().unwrap_or_default()),
                    xml(why)
                );
            }
            (Err(why), _) if r.expected.is_some() => {
                let _ = writeln!(
                    s,
                    ">\n    <skipped message=\"expected to fail: {}\">{}</skipped>\n  </testcase>",
                    xml(r.expected.as_deref().unwrap_or_default()),
                    xml(why)
                );
            }
            (Ok(saw), _) => {
                let _ = writeln!(
                    s,
                    ">\n    <system-out>{}\nseed {}; replay: {replay} --only {}</system-out>\n  </testcase>",
                    xml(saw),
                    o.seed,
                    xml(r.name)
                );
            }
            (Err(why), _) => {
                let _ = writeln!(
                    s,
                    ">\n    <failure message=\"{}\">{}\nreplay: {replay} --only {}</failure>\n  </testcase>",
                    xml(why.lines().next().unwrap_or("failed")),
                    xml(why),
                    xml(r.name)
                );
            }
        }
    }
    s.push_str("</testsuite>\n");
    s
}

/// Now, RFC 3339 in UTC to the second.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (y, m, d) = result_inbox::canonical::date_from_epoch_days(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// The SHA-256 of this program's own binary, hex: which kit judged.
fn own_sha256() -> String {
    std::env::current_exe()
        .and_then(std::fs::read)
        .map(|bytes| result_inbox::Digest::of(&bytes).to_hex())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// The first line `CMD --version` prints, run as the kit runs the receiver (`sh -c`, in a
/// process group of its own, with only PATH and HOME), if it exits 0 within 10 s having printed
/// one. A receiver without `--version` is not at fault: the certificate says null.
fn receiver_version(receiver: &str) -> Option<String> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("{receiver} \"$@\""))
        .args(["receiver", "--version"])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    #[allow(clippy::disallowed_methods)] // the kit passes its own HOME on, as to every case
    if let Some(home) = std::env::var_os("HOME") {
        cmd.env("HOME", home);
    }
    let mut child = cmd.spawn().ok()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if Instant::now() > deadline => {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let mut out = String::new();
    use std::io::Read;
    child
        .stdout
        .take()?
        .take(4096)
        .read_to_string(&mut out)
        .ok()?;
    out.lines()
        .next()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
}

/// Makes the cases' databases go on the server `url` names: the kit's server library reads it
/// from `TESTDB_MYSQL_URL` as the process starts, so the kit starts itself again with it set
/// (once: the second start finds it set), never printing the URL.
fn on_database(url: &secret::Secret) {
    use std::os::unix::process::CommandExt;
    #[allow(clippy::disallowed_methods)] // the variable this very function sets
    if std::env::var("TESTDB_MYSQL_URL").as_deref() == Ok(url.expose()) {
        return;
    }
    let err = std::process::Command::new(
        std::env::current_exe().unwrap_or_else(|_| "conformance".into()),
    )
    .args(std::env::args_os().skip(1))
    .env("TESTDB_MYSQL_URL", url.expose())
    .env("TESTDB_BACKEND", "url")
    .exec();
    eprintln!("conformance: cannot start again with the database --database names: {err}");
    std::process::exit(2);
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    #[allow(clippy::disallowed_methods)] // the kit's own configuration: no arguments, a receiver
    if args.is_empty() && std::env::var_os(variable_of("--receiver")).is_some() {
        args.push("run".into());
    }
    let o = match parse(&args) {
        Ok(Asked::Run(o)) => o,
        Ok(Asked::Mutants(o)) => return mutants(&o),
        Ok(Asked::Nothing) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conformance: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(url) = &o.database {
        on_database(url);
    }
    for file in o.junit.iter().chain(&o.json).chain(&o.certificate) {
        if let Err(e) = report::prepare(file) {
            eprintln!("conformance: {e}");
            return ExitCode::from(2);
        }
    }
    conformance_kit::quiet_panics();
    let replay = format!(
        "conformance run --receiver {} --seed {}{}",
        shell_quote(&o.receiver),
        o.seed,
        if o.strict { " --strict" } else { "" }
    );
    let started = Instant::now();
    let started_at = utc_now();
    let selected: Vec<_> = cases()
        .into_iter()
        .filter(|c| {
            o.only
                .as_ref()
                .is_none_or(|only| only.iter().any(|n| n == c.name))
        })
        .collect();
    let (server, admin_url) = match testdb::Server::shared() {
        Ok(s) => (s.description().to_owned(), s.admin_url()),
        Err(e) => {
            eprintln!("conformance: no database server for the cases: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "conformance {} (contract {}): {} case(s) against {}; seed {}; databases on {server}",
        env!("CARGO_PKG_VERSION"),
        conformance_kit::CONTRACT_VERSION,
        selected.len(),
        shell_quote(&o.receiver),
        o.seed
    );
    let ran = at_most(&selected, o.jobs, |runtime, case| {
        println!(
            "conformance: {}: running ({}; {})",
            case.name,
            case.level.as_str(),
            case.what
        );
        let t = Instant::now();
        let logs = o.keep_logs.join(case.name);
        let _ = std::fs::remove_dir_all(&logs);
        let ctx = Ctx::new(o.receiver.clone(), o.seed, Some(logs.clone()));
        let verdict = match run_case(runtime, case, ctx) {
            Err(why) if logs.is_dir() => {
                Err(format!("{why} (the receiver's output: {})", logs.display()))
            }
            verdict => {
                let _ = std::fs::remove_dir_all(&logs);
                verdict
            }
        };
        let seconds = t.elapsed().as_secs_f64();
        match &verdict {
            Ok(saw) => println!(
                "conformance: {}: passed in {seconds:.1} s (seed {}): {saw}",
                case.name, o.seed
            ),
            Err(why) if why.starts_with(report::NOT_RUN) => println!(
                "conformance: {}: NOT RUN ({seconds:.1} s): {why}",
                case.name
            ),
            Err(why) => println!(
                "conformance: {}: FAILED in {seconds:.1} s: {why}\nconformance: replay: {replay} --only {}",
                case.name, case.name
            ),
        }
        Ran {
            name: case.name,
            rules: case.rules,
            level: match &verdict {
                Err(why) => case.level.of_failure(why),
                Ok(_) => case.level,
            },
            case_level: case.level,
            seconds,
            verdict,
            expected: o
                .expect
                .iter()
                .find(|e| e.case == case.name)
                .map(|e| e.reason.clone()),
        }
    });
    let seconds = started.elapsed().as_secs_f64();

    println!(
        "\n{:<24} {:<7} {:<32} {:>16} {:>8}",
        "case", "level", "rules", "result", "seconds"
    );
    for r in &ran {
        println!(
            "{:<24} {:<7} {:<32} {:>16} {:>8.1}",
            r.name,
            r.level.as_str(),
            r.rules,
            r.result().outcome().as_str(),
            r.seconds
        );
    }
    let failing: Vec<&Ran> = ran
        .iter()
        .filter(|r| r.result().outcome().fails_run(r.level, o.strict))
        .collect();
    let count = |o: report::Outcome| ran.iter().filter(|r| r.result().outcome() == o).count();
    println!(
        "{:<24} {} passed, {} failed, {} not run, {} expected failures, {} declared not run, {} unexpected passes; {:.1} s (wall clock)",
        "total",
        count(report::Outcome::Passed),
        count(report::Outcome::Failed),
        count(report::Outcome::NotRun),
        count(report::Outcome::ExpectedFailure),
        count(report::Outcome::DeclaredNotRun),
        count(report::Outcome::UnexpectedPass),
        seconds
    );
    for r in &ran {
        match (&r.verdict, r.result().outcome()) {
            (Err(why), report::Outcome::Failed) => {
                let counts = match (
                    r.result().outcome().fails_run(r.level, o.strict),
                    r.level,
                    r.case_level,
                ) {
                    (false, _, _) => " (a SHOULD: fails the run only with --strict)",
                    (true, Level::Must, Level::Should) => {
                        " (a MUST rule, found by a SHOULD case: it fails the run without --strict)"
                    }
                    _ => "",
                };
                println!("FAILED {} [{}]{counts}: {why}", r.name, r.level.as_str());
            }
            (Err(why), report::Outcome::NotRun) => println!(
                "NOT RUN {}: {why}; a case not run is never a pass: make it runnable here, or declare it in --expect with the reason it cannot run",
                r.name
            ),
            (Err(why), report::Outcome::DeclaredNotRun) => println!(
                "not run {} (declared: {}): {why}",
                r.name,
                r.expected.as_deref().unwrap_or_default()
            ),
            (_, report::Outcome::UnexpectedPass) => println!(
                "UNEXPECTED PASS {}: the expectations file says it fails ({}); take it out",
                r.name,
                r.expected.as_deref().unwrap_or_default()
            ),
            _ => {}
        }
    }
    println!("the kit cannot verify:");
    for c in report::CANNOT_VERIFY {
        println!("  - {c}");
    }
    println!("seed {} (replay: {replay})", o.seed);
    if let Some(file) = &o.junit {
        if let Err(e) = std::fs::write(file, junit(&ran, &o, &replay, seconds)) {
            eprintln!("conformance: cannot write {}: {e}", file.display());
            return ExitCode::from(2);
        }
        println!("junit: {}", file.display());
    }
    if let Some(file) = &o.json {
        let results: Vec<CaseResult<'_>> = ran.iter().map(Ran::result).collect();
        let j = report::json(&o.receiver, o.seed, o.strict, seconds, &results);
        let text = serde_json::to_string_pretty(&j).unwrap_or_default();
        if let Err(e) = std::fs::write(file, text + "\n") {
            eprintln!("conformance: cannot write {}: {e}", file.display());
            return ExitCode::from(2);
        }
        println!("json: {}", file.display());
    }
    if let Some(file) = &o.certificate {
        let results: Vec<CaseResult<'_>> = ran.iter().map(Ran::result).collect();
        let version = receiver_version(&o.receiver);
        let kit_sha256 = own_sha256();
        let mutant_matrix = match conformance_kit::provenance::matrix_path()
            .ok_or_else(|| "the kit's own path is unknown".to_owned())
            .and_then(|p| conformance_kit::provenance::matrix_for(&p, &kit_sha256))
        {
            Ok(m) => Some(m),
            Err(why) => {
                println!("certificate: without a mutant matrix: {why} (`conformance mutants --matrix` makes one)");
                None
            }
        };
        let environment = tokio::runtime::Runtime::new()
            .expect("a tokio runtime")
            .block_on(conformance_kit::provenance::environment(
                admin_url.expose(),
                o.jobs,
            ));
        let facts = report::Facts {
            receiver: &o.receiver,
            receiver_version: version.as_deref(),
            kit_sha256: &kit_sha256,
            // The description starts with the server's `VERSION()`, then how it runs.
            database_server: server.split(" (").next().unwrap_or(&server),
            seed: o.seed,
            started_at: &started_at,
            environment,
            mutant_matrix,
            declared: &o.expect,
            cases_total: cases().len(),
        };
        let c = report::certificate(&facts, seconds, &results);
        let text = serde_json::to_string_pretty(&c).unwrap_or_default();
        if let Err(e) = std::fs::write(file, text + "\n") {
            eprintln!("conformance: cannot write {}: {e}", file.display());
            return ExitCode::from(2);
        }
        println!("certificate: {}", file.display());
    }
    if failing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `conformance mutants`: each mutant against the case aimed at it, `runs` times with seeds
/// `seed`, `seed + 1`, …; every run must fail with a message naming the rule the mutant
/// breaks. A mutant the kit does not catch in every run fails the run.
fn mutants(o: &MutantOptions) -> ExitCode {
    let bin = o.bin.as_str();
    if !std::path::Path::new(bin).is_file() {
        eprintln!("conformance: {bin} is missing: `make mutant-build` builds it");
        return ExitCode::from(2);
    }
    if let Some(file) = &o.matrix {
        if let Err(e) = report::prepare(file) {
            eprintln!("conformance: {e}");
            return ExitCode::from(2);
        }
    }
    conformance_kit::quiet_panics();
    let all = cases();
    let started = Instant::now();
    let started_at = utc_now();
    let selected: Vec<_> = conformance_kit::MUTANTS
        .iter()
        .filter(|(m, _, _)| {
            o.only
                .as_ref()
                .is_none_or(|only| only.iter().any(|n| n == m.name()))
        })
        .collect();
    let rows = at_most(&selected, o.jobs, |runtime, (mutant, case, rule)| {
        let case = all
            .iter()
            .find(|c| c.id == *case)
            .expect("the mutant table names a case");
        let t = Instant::now();
        let mut caught_runs = 0;
        for run in 0..o.runs {
            let seed = o.seed.wrapping_add(run);
            let ctx = Ctx::new(
                format!("env RECEIVER_MUTANT={mutant} {}", shell_quote(bin)),
                seed,
                None,
            );
            println!(
                "conformance: mutant {mutant}: running {} (seed {seed})",
                case.name
            );
            let verdict = run_case(runtime, case, ctx);
            let caught = matches!(&verdict, Err(why) if why.contains(rule));
            caught_runs += u64::from(caught);
            let why = match &verdict {
                Ok(saw) => format!("NOT CAUGHT: the case passed ({saw})"),
                Err(why) if caught => why.clone(),
                Err(why) => format!("NOT CAUGHT: the case failed without naming {rule}: {why}"),
            };
            println!("conformance: mutant {mutant}: {why}");
        }
        (
            *mutant,
            case.name,
            *rule,
            caught_runs,
            t.elapsed().as_secs_f64(),
        )
    });
    let missed = rows.iter().filter(|r| r.3 != o.runs).count();
    println!(
        "\n{:<30} {:<24} {:<11} {:>8} {:>8}",
        "mutant", "caught by", "rule", "result", "seconds"
    );
    for (mutant, case, rule, caught, seconds) in &rows {
        let result = match (*caught == o.runs, o.runs) {
            (true, 1) => "caught".to_owned(),
            (true, n) => format!("{n}/{n}"),
            (false, 1) => "MISSED".to_owned(),
            (false, n) => format!("MISSED {caught}/{n}"),
        };
        println!("{mutant:<30} {case:<24} {rule:<11} {result:>8} {seconds:>8.1}");
    }
    println!(
        "{:<30} {:<24} {:<11} {:>8} {:>8.1}  (wall clock; seeds {} to {})",
        "total",
        format!("{} of {} caught", rows.len() - missed, rows.len()),
        "",
        "",
        started.elapsed().as_secs_f64(),
        o.seed,
        o.seed.wrapping_add(o.runs - 1)
    );
    if let Some(file) = &o.matrix {
        let rows: Vec<conformance_kit::provenance::MatrixRow> = rows
            .iter()
            .map(
                |(mutant, case, rule, caught, _)| conformance_kit::provenance::MatrixRow {
                    mutant: mutant.to_string(),
                    case: (*case).to_owned(),
                    rule: (*rule).to_owned(),
                    caught: *caught,
                    runs: o.runs,
                },
            )
            .collect();
        let mutant_sha = std::fs::read(bin)
            .map(|b| result_inbox::Digest::of(&b).to_hex())
            .unwrap_or_default();
        let m = conformance_kit::provenance::matrix(
            &own_sha256(),
            &mutant_sha,
            o.seed,
            &started_at,
            &rows,
        );
        let text = serde_json::to_string_pretty(&m).unwrap_or_default();
        if let Err(e) = std::fs::write(file, text + "\n") {
            eprintln!("conformance: cannot write {}: {e}", file.display());
            return ExitCode::from(2);
        }
        println!("matrix: {}", file.display());
    }
    if missed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            receiver: "env A='b' ./recv <x>".into(),
            only: None,
            seed: 7,
            junit: None,
            json: None,
            certificate: None,
            expect: Vec::new(),
            strict: false,
            keep_logs: DEFAULT_KEEP_LOGS.into(),
            jobs: 1,
            database: None,
        }
    }

    #[test]
    fn the_junit_report_escapes_and_marks_each_failure_with_its_message_and_replay() {
        let ran = [
            Ran {
                name: "first-receipt",
                rules: "R-STORE-7",
                level: conformance_kit::Level::Must,
                case_level: conformance_kit::Level::Must,
                seconds: 0.5,
                verdict: Ok("ACKed & <fine>".into()),
                expected: None,
            },
            Ran {
                name: "stale-version",
                rules: "R-STORE-6",
                level: conformance_kit::Level::Must,
                case_level: conformance_kit::Level::Must,
                seconds: 1.0,
                verdict: Err("R-STORE-6: \"v1\" moved the view\nsecond line\u{1}".into()),
                expected: None,
            },
        ];
        let xml = junit(
            &ran,
            &options(),
            "conformance run --receiver 'x' --seed 7",
            1.5,
        );
        assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite "));
        assert!(xml.contains("tests=\"2\" failures=\"1\""), "{xml}");
        assert!(
            xml.contains("value=\"env A='b' ./recv &lt;x&gt;\""),
            "{xml}"
        );
        assert!(
            xml.contains("<property name=\"seed\" value=\"7\"/>"),
            "{xml}"
        );
        assert!(
            xml.contains("<system-out>ACKed &amp; &lt;fine&gt;\nseed 7; replay: conformance run --receiver 'x' --seed 7 --only first-receipt</system-out>"),
            "{xml}"
        );
        assert!(
            xml.contains("<failure message=\"R-STORE-6: &quot;v1&quot; moved the view\">"),
            "{xml}"
        );
        assert!(xml.contains("--only stale-version</failure>"), "{xml}");
        assert!(!xml.contains('\u{1}'), "control characters are left out");
        assert_eq!(xml.matches("<testcase ").count(), 2);
        assert!(xml.trim_end().ends_with("</testsuite>"));
    }

    #[test]
    fn a_bad_command_line_is_one_clear_error() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let err = |a: &[&str]| match parse(&args(a)) {
            Err(e) => e,
            Ok(_) => panic!("{a:?} was accepted"),
        };
        assert!(err(&["run"]).starts_with(
            "run: --receiver (or CONFORMANCE_RECEIVER) is required: the command line"
        ));
        assert!(err(&["run", "--receiver", ""]).starts_with("--receiver needs a command line"));
        assert!(err(&["run", "--receiver", "x", "--only", "nope"])
            .starts_with("--only: no case \"nope\"; cases: schema,"));
        assert!(err(&["run", "--receiver", "x", "--seed", "-1"])
            .starts_with("--seed \"-1\" is not a whole number"));
        assert_eq!(
            err(&["run", "--receiver", "x", "--bogus"]),
            "run: unknown argument `--bogus` (`conformance run --help`)"
        );
        assert!(err(&["mutants"]).starts_with("mutants: --receiver-mutant is required"));
        assert!(err(&["run", "--receiver", "r", "--certificate"])
            .starts_with("--certificate needs a file"));
        assert_eq!(
            err(&["frob"]),
            "unknown command `frob`; the commands are run, mutants, list (`conformance --help`)"
        );
        assert!(err(&["mutants", "--receiver-mutant", "m", "--runs", "0"])
            .starts_with("--runs \"0\" is not a number from 1 to 1000"));
        assert!(
            err(&["mutants", "--receiver-mutant", "m", "--only", "nope"])
                .starts_with("--only: no mutant \"nope\"; mutants: ack-before-commit,")
        );
        assert!(
            err(&["run", "--receiver", "x", "--expect", "/no/such/file"])
                .starts_with("--expect /no/such/file: ")
        );
        assert!(err(&[]).starts_with("no command given; the commands are run, mutants, list"));
        for e in [err(&[]), err(&["frob"]), err(&["run"]), err(&["mutants"])] {
            assert_eq!(e.lines().count(), 1, "one line: {e}");
        }
        match parse(&args(&[
            "run",
            "--receiver",
            "r",
            "--only",
            "schema,utc",
            "--seed",
            "9",
            "--strict",
            "--json",
            "out/kit.json",
            "--keep-logs",
            "out/logs",
            "--jobs",
            "2",
        ])) {
            Ok(Asked::Run(o)) => {
                assert_eq!((o.receiver.as_str(), o.seed), ("r", 9));
                assert!(o.strict);
                assert_eq!(o.json, Some("out/kit.json".into()));
                assert_eq!(o.only, Some(vec!["schema".to_owned(), "utc".to_owned()]));
                assert_eq!(o.keep_logs, std::path::PathBuf::from("out/logs"));
                assert_eq!(o.jobs, 2);
            }
            _ => panic!("a good command line"),
        }
        match parse(&args(&["run", "--receiver", "r"])) {
            Ok(Asked::Run(o)) => {
                assert_eq!(o.keep_logs, std::path::PathBuf::from(DEFAULT_KEEP_LOGS))
            }
            _ => panic!("a good command line"),
        }
        assert!(err(&["run", "--receiver", "r", "--keep-logs"])
            .starts_with("--keep-logs needs a directory"));
        for bad in ["0", "9", "two", "-1"] {
            assert_eq!(
                err(&["run", "--receiver", "r", "--jobs", bad]),
                format!("--jobs {bad:?} is not a number from 1 to 8")
            );
        }
        assert!(err(&["mutants", "--receiver-mutant", "m", "--jobs"]).starts_with("--jobs needs"));
        // --help after each command is its help, not an error.
        for command in ["run", "mutants", "list", "--list"] {
            for flag in ["--help", "-h"] {
                assert!(
                    matches!(parse(&args(&[command, flag])), Ok(Asked::Nothing)),
                    "{command} {flag}"
                );
            }
        }
        assert!(matches!(parse(&args(&["--help"])), Ok(Asked::Nothing)));
    }

    /// Every flag of `conformance run` that a variable can stand in for (the help names each).
    const RUN_FLAGS: &[&str] = &[
        "--receiver",
        "--only",
        "--seed",
        "--junit",
        "--json",
        "--certificate",
        "--expect",
        "--strict",
        "--keep-logs",
        "--jobs",
        "--database",
    ];

    #[test]
    fn every_flag_of_run_has_its_variable_in_the_help() {
        for flag in RUN_FLAGS {
            let name = variable_of(flag);
            assert!(RUN_HELP.contains(&name), "{flag}: {name}");
            assert!(RUN_HELP.contains(flag), "{flag}");
        }
        assert_eq!(variable_of("--keep-logs"), "CONFORMANCE_KEEP_LOGS");
    }

    #[test]
    fn every_mutant_is_aimed_at_a_case_that_names_its_rule() {
        let all = cases();
        let aimed: Vec<conformance_kit::Mutant> =
            conformance_kit::MUTANTS.iter().map(|m| m.0).collect();
        let in_kit: Vec<conformance_kit::Mutant> = conformance_kit::Mutant::ALL
            .into_iter()
            .filter(|m| m.in_kit())
            .collect();
        assert_eq!(aimed, in_kit, "every mutant of the kit once, in order");
        for (mutant, case, rule) in conformance_kit::MUTANTS {
            let c = all
                .iter()
                .find(|c| c.id == *case)
                .unwrap_or_else(|| panic!("{mutant}: no case {case:?}"));
            assert!(
                c.rules.contains(rule),
                "{mutant}: {case:?} does not prove {rule}"
            );
        }
    }
}
