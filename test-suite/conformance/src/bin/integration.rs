//! `make integration`: every real-server suite of the conformance tests, each in its own test
//! process (so with its own temporary MySQL server), independent suites in parallel, then a
//! summary table and a proof that nothing was left behind.
//!
//! A suite is a module of `tests/it` (`storage`, `faults`, …). Each runs as
//! `it <its tests> --exact` with its own `TMPDIR` under this run's directory and the variable
//! `RESULT_INBOX_RUN=<run id>`, which every process it starts inherits. At the end no process
//! may carry that variable and no suite directory may hold anything but empty directories;
//! otherwise the run fails, naming what was left (and removes it). The suites' logs go to
//! `target/integration-logs/`; a failed suite's log is also printed. A variant runs a suite's
//! tests again under a name of its own with one variable set (`storage-tls`: the storage suite
//! on a server that speaks only TLS; `storage-encrypted`: on a server that encrypts at rest;
//! `faults-ungrouped` and `outage-ungrouped`: with every receiver applying one delivery per
//! transaction), and fails when its log does not show that the variable took effect.
//!
//! Options: `--jobs N` (suites at once; default 3), `--only SUITE[,SUITE…]`, `--containers`,
//! and after `--` arguments for every test process (e.g. `-- --include-ignored`).
//!
//! `--containers` (`make integration-containers`, under `scripts/containers run`, which starts
//! the engine and names it in `DOCKER_HOST`): the tests are built with the container backend,
//! and every suite that can runs with `TESTDB_BACKEND=container`; the suites that need a local
//! server are not run (`make integration` runs them), and the run says why. Which servers a
//! suite had is read from its log (testdb announces each, `TESTDB_ANNOUNCE`): a suite that had
//! no container server, or a local one where none is expected, fails the run.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fixtures::RUN_MARKER as RUN_VAR;

/// One suite's result.
#[derive(Debug, Clone)]
struct Outcome {
    suite: String,
    tests: usize,
    passed: usize,
    failed: usize,
    ignored: usize,
    seconds: f64,
    ok: bool,
    log: PathBuf,
    /// The servers testdb announced in the suite's log.
    servers: Vec<String>,
}

const USAGE: &str = "usage: integration [--jobs N] [--only SUITE[,SUITE…]] [--containers] [-- ARGS FOR EVERY TEST PROCESS…]

Runs every real-server suite (a module of test-suite/conformance/tests/it), each in its own
process with its own temporary MySQL server, N at a time (3 by default); prints a summary table
and fails if a process, server or temporary file of the run is left behind. `make integration`
runs it.

  --jobs N         suites at a time (1 or more)
  --only SUITES    some suites, by name (a comma-separated list)
  --containers     the container backend: servers in containers of an engine of its own
  -- ARGS          passed to every test process (e.g. -- --nocapture)

Exit 0 when every suite passed and nothing was left behind, 1 otherwise, 2 for a bad command
line.";

/// On the container run: suites that need a local server, and why; they are not run there.
const LOCAL_ONLY: &[(&str, &str)] = &[
    (
        "cleanup",
        "it SIGKILLs test processes and checks that their servers die with them and that the next run sweeps what they left; a container outlives the process that started it",
    ),
    (
        "galera",
        "a Galera cluster of local nodes (testdb::Cluster), which the tests pause, kill and cut off",
    ),
    (
        "nemesis",
        "a Galera cluster of local nodes in network namespaces, with real partitions, a node killed and consumers paused",
    ),
    (
        "failover",
        "a primary and two replicas of local servers (testdb::Topology), which the tests kill, demote, promote and rebuild",
    ),
    (
        "storage-tls",
        "a local server that speaks only TLS, with certificates made for the run; the storage suite itself runs on the container server",
    ),
    (
        "storage-encrypted",
        "a local server that encrypts at rest, with a key file made for the run; the storage suite itself runs on the container server",
    ),
    (
        "tls",
        "local servers that speak only TLS, with certificates made for each test",
    ),
    (
        "at_rest",
        "it reads the files of a local server's datadir, with and without encryption at rest",
    ),
    (
        "upgrade",
        "its rolling-upgrade drill runs on a local server of its own and a local Galera cluster (testdb::Cluster)",
    ),
    (
        "deploy",
        "its Prometheus test stops (SIGSTOP) the receiver's own local server; the receiver's image is run after the suites, on the container server",
    ),
];

/// On the container run: suites whose tests start no database server, and why; the container
/// backend has nothing to prove there, and every suite it runs must have a container server.
const NO_SERVER: &[(&str, &str)] = &[(
    "release",
    "its tests install files and read the docs; its walkthrough runs on a clean container after the suites",
)];

/// On the container run: variants that change the receiver, not the server, and why; `make
/// integration` runs them, and the backend would add nothing to what they prove.
const SETTING_ONLY: &[(&str, &str)] = &[
    (
        "faults-ungrouped",
        "the faults suite with one delivery a transaction: a setting of the receiver, proved on local servers",
    ),
    (
        "outage-ungrouped",
        "the outage suite with one delivery a transaction: a setting of the receiver, proved on local servers",
    ),
];

/// A suite run a second time, under a name of its own, with one variable set.
struct Variant {
    name: &'static str,
    suite: &'static str,
    variable: &'static str,
    /// How its log shows that the variable took effect: a variant that ran as the suite does
    /// would prove nothing.
    proof: Proof,
}

/// What a variant's log must show.
enum Proof {
    /// The description of every server it had contains `mark`; `kind` names such servers.
    Servers {
        mark: &'static str,
        kind: &'static str,
    },
    /// This line.
    Line(&'static str),
}

/// `storage-tls` is the storage suite with every connection over verified TLS to a server that
/// refuses plain TCP (R-TLS-1); `storage-encrypted` is the storage suite on a server that
/// encrypts everything it writes (docs/recovery.md).
const VARIANTS: &[Variant] = &[
    Variant {
        name: "storage-tls",
        suite: "storage",
        variable: testdb::TESTDB_TLS,
        proof: Proof::Servers {
            mark: "TLS only",
            kind: "TLS-only servers",
        },
    },
    Variant {
        name: "storage-encrypted",
        suite: "storage",
        variable: testdb::TESTDB_ENCRYPTED,
        proof: Proof::Servers {
            mark: testdb::ENCRYPTED_NOTE,
            kind: "servers encrypted at rest",
        },
    },
    Variant {
        name: "faults-ungrouped",
        suite: "faults",
        variable: fixtures::UNGROUPED,
        proof: Proof::Line(fixtures::UNGROUPED_NOTE),
    },
    Variant {
        name: "outage-ungrouped",
        suite: "outage",
        variable: fixtures::UNGROUPED,
        proof: Proof::Line(fixtures::UNGROUPED_NOTE),
    },
];

/// On the container run: suites on the container server whose database-loss tests start a
/// local server of their own, and why.
const PARTLY_LOCAL: &[(&str, &str)] = &[
    (
        "group",
        "its counting test reads a server's global counters, which only a server of the test's own keeps for it alone",
    ),
    (
        "faults",
        "its database-loss tests SIGKILL and restart the receiver's server on the same datadir and port",
    ),
    (
        "metrics",
        "its outage test kills and restarts the receiver's server",
    ),
    (
        "outage",
        "each test stops (SIGSTOP), kills or restarts the receiver's server",
    ),
    (
        "kit",
        "its run of the kit's cases includes utc, which starts a server of its own as the kit's cases that reconfigure their server do, and its given-database test starts one to stand for a team's service database",
    ),
    (
        "prune",
        "its database-loss test kills a prune's server mid-run and restarts it",
    ),
    (
        "recovery",
        "its restore tests take hot backups of local servers with mariadb-backup and restore them onto new ones",
    ),
];

struct Options {
    jobs: usize,
    only: Option<Vec<String>>,
    containers: bool,
    extra: Vec<String>,
}

/// The command line's structure; clap reads it, and the words of every help and error are the
/// runner's own ([`USAGE`], [`refused`]).
#[derive(clap::Parser)]
#[command(
    name = "integration",
    disable_help_flag = true,
    disable_version_flag = true
)]
struct Cli {
    #[arg(long, allow_hyphen_values = true)]
    jobs: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    only: Option<String>,
    #[arg(long)]
    containers: bool,
    /// What follows `--`: the test processes' own arguments.
    #[arg(last = true, allow_hyphen_values = true)]
    extra: Vec<String>,
}

const JOBS_NEEDED: &str = "--jobs needs a number of 1 or more";
const ONLY_NEEDED: &str = "--only needs SUITE[,SUITE…]";

/// The runner's own line for what clap refused.
fn refused(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let flag = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => s.split_whitespace().next().unwrap_or("").to_owned(),
        _ => String::new(),
    };
    match (e.kind(), flag.as_str()) {
        (ErrorKind::InvalidValue | ErrorKind::NoEquals, "--jobs") => JOBS_NEEDED.into(),
        (ErrorKind::InvalidValue | ErrorKind::NoEquals, "--only") => ONLY_NEEDED.into(),
        (_, given) => format!(
            "unknown argument `{given}`; the flags are --jobs, --only, --containers and -- (`integration --help`)"
        ),
    }
}

fn parse_args() -> Result<Options, String> {
    let cli = <Cli as clap::Parser>::try_parse_from(std::env::args()).map_err(|e| refused(&e))?;
    let jobs = match cli.jobs {
        Some(n) => n.parse().ok().filter(|n| *n > 0).ok_or(JOBS_NEEDED)?,
        None => 3,
    };
    Ok(Options {
        jobs,
        only: cli
            .only
            .map(|list| list.split(',').map(str::to_owned).collect()),
        containers: cli.containers,
        extra: cli.extra,
    })
}

/// The `it` test binary, built if needed, via cargo's JSON messages; with the container
/// backend compiled in for the container run.
fn test_binary(containers: bool) -> Result<PathBuf, String> {
    #[allow(clippy::disallowed_methods)] // cargo tells a program it runs where cargo is
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "test",
            "-p",
            "conformance",
            "--test",
            "it",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(containers.then_some("--features=container"))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err("building the conformance tests failed".into());
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "it")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo built no `it` test executable".into())
}

/// Test names by suite (the first path segment).
fn suites(bin: &Path) -> Result<BTreeMap<String, Vec<String>>, String> {
    let out = Command::new(bin)
        .args(["--list", "--format", "terse"])
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let mut by_suite: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.strip_suffix(": test") else {
            continue;
        };
        let suite = name.split("::").next().unwrap_or(name).to_owned();
        by_suite.entry(suite).or_default().push(name.to_owned());
    }
    if by_suite.is_empty() {
        return Err(format!("{} lists no tests", bin.display()));
    }
    Ok(by_suite)
}

/// Reads the last `test result: ok. 3 passed; 0 failed; 1 ignored; …` line (earlier ones may
/// be the captured output of a child test process).
fn counts(log: &str) -> (usize, usize, usize) {
    let mut c = (0, 0, 0);
    if let Some(line) = log.lines().rfind(|l| l.starts_with("test result:")) {
        for part in line.split([';', '.']) {
            let mut w = part.split_whitespace();
            if let (Some(n), Some(what)) = (w.next(), w.next()) {
                if let Ok(n) = n.parse::<usize>() {
                    match what {
                        "passed" => c.0 += n,
                        "failed" => c.1 += n,
                        "ignored" => c.2 += n,
                        _ => {}
                    }
                }
            }
        }
    }
    c
}

/// What every suite of one run shares.
struct Run {
    bin: PathBuf,
    run_dir: PathBuf,
    log_dir: PathBuf,
    run_id: String,
    extra: Vec<String>,
    containers: bool,
}

fn run_suite(run: &Run, suite: &str, tests: &[String]) -> Outcome {
    let Run {
        bin,
        run_dir,
        log_dir,
        run_id,
        extra,
        containers,
    } = run;
    let backend = containers.then_some("container");
    let tmp = run_dir.join(suite);
    let log = log_dir.join(format!("{suite}.log"));
    let started = Instant::now();
    let result = fs::create_dir_all(&tmp)
        .and_then(|()| fs::File::create(&log))
        .and_then(|f| {
            Command::new(bin)
                .args(tests)
                .arg("--exact")
                .args(extra)
                .env("TMPDIR", &tmp)
                .env(RUN_VAR, run_id)
                .envs(backend.map(|b| (testdb::TESTDB_BACKEND, b)))
                .envs(
                    VARIANTS
                        .iter()
                        .filter(|v| v.name == suite)
                        .map(|v| (v.variable, "1")),
                )
                .env(testdb::TESTDB_ANNOUNCE, "1")
                .stdin(Stdio::null())
                .stdout(f.try_clone()?)
                .stderr(f)
                .status()
        });
    let seconds = started.elapsed().as_secs_f64();
    let text = fs::read_to_string(&log).unwrap_or_default();
    let (passed, failed, ignored) = counts(&text);
    let servers: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("testdb: server "))
        .map(str::to_owned)
        .collect();
    let mut ok = matches!(result, Ok(s) if s.success());
    if let Err(e) = &result {
        eprintln!("integration: cannot run suite {suite}: {e}");
    }
    // A variant whose variable did not take effect would prove nothing.
    for v in VARIANTS.iter().filter(|v| v.name == suite) {
        match v.proof {
            Proof::Servers { mark, kind } => {
                if servers.is_empty() || servers.iter().any(|s| !s.contains(mark)) {
                    eprintln!("integration: suite {suite} must run on {kind}; it had: {servers:?}");
                    ok = false;
                }
            }
            Proof::Line(line) => {
                if !text.lines().any(|l| l == line) {
                    eprintln!("integration: suite {suite}'s log must say {line:?}; it does not");
                    ok = false;
                }
            }
        }
    }
    Outcome {
        suite: suite.to_owned(),
        tests: tests.len(),
        passed,
        failed,
        ignored,
        seconds,
        ok,
        log,
        servers,
    }
}

/// On the container run: why a suite (or the suite a variant runs again) needs a local server
/// for some of its tests, if it does.
fn partly_local(suite: &str) -> Option<&'static str> {
    let suite = VARIANTS
        .iter()
        .find(|v| v.name == suite)
        .map_or(suite, |v| v.suite);
    PARTLY_LOCAL
        .iter()
        .find(|(name, _)| *name == suite)
        .map(|(_, why)| *why)
}

/// On the container run: how many container and local servers a suite had, and what is wrong
/// with that, if anything.
fn servers_had(o: &Outcome) -> (String, Option<String>) {
    let container = o
        .servers
        .iter()
        .filter(|d| d.contains("(container "))
        .count();
    let local = o.servers.len() - container;
    let column = match (container, local) {
        (0, 0) => "none".to_owned(),
        (c, 0) => format!("{c} container"),
        (0, l) => format!("{l} local"),
        (c, l) => format!("{c} container + {l} local"),
    };
    let wrong = if container == 0 {
        Some(format!(
            "{} had no container server (testdb announced none in {})",
            o.suite,
            o.log.display()
        ))
    } else if local > 0 && partly_local(&o.suite).is_none() {
        Some(format!(
            "{} started {local} local server(s) but is not listed as needing one",
            o.suite
        ))
    } else {
        None
    };
    (column, wrong)
}

/// Processes that still carry this run's marker: (pid, command line).
fn leftover_processes(run_id: &str) -> Vec<(u32, String)> {
    let marker = format!("{RUN_VAR}={run_id}");
    let me = std::process::id();
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(environ) = fs::read(e.path().join("environ")) else {
            continue;
        };
        if !environ.split(|b| *b == 0).any(|v| v == marker.as_bytes()) {
            continue;
        }
        // A zombie is dead; its parent has not reaped it yet.
        if !testdb::process_alive(pid) {
            continue;
        }
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        found.push((pid, cmdline.trim().to_owned()));
    }
    found
}

fn main() -> ExitCode {
    // Help and the version before anything is built, started or written, wherever they stand
    // (before a `--`: what follows it is the test processes').
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    if about::answered("integration", &args, &[], |_| USAGE.into()) {
        return ExitCode::SUCCESS;
    }
    let started = Instant::now();
    let result = parse_args()
        .map_err(|e| (e, ExitCode::from(2)))
        .and_then(|options| plan(options).map_err(|e| (e, ExitCode::FAILURE)));
    let plan = match result {
        Ok(plan) => plan,
        Err((e, code)) => {
            eprintln!("integration: {e}");
            return code;
        }
    };
    let run_id = format!("{}-{}", std::process::id(), started.elapsed().as_nanos());
    let (run_dir, log_dir) = match directories(&plan.bin) {
        Ok(dirs) => dirs,
        Err(e) => {
            eprintln!("integration: {e}");
            return ExitCode::FAILURE;
        }
    };
    let containers = plan.options.containers;
    let not_run = plan.not_run.clone();
    let run = Run {
        bin: plan.bin.clone(),
        run_dir: run_dir.clone(),
        log_dir: log_dir.clone(),
        run_id: run_id.clone(),
        extra: plan.options.extra.clone(),
        containers,
    };
    let results = run_suites(run, plan);
    let mut ok = report(&results, &not_run, containers, started);
    ok &= cleanup_checked(&run_id, &run_dir, &results);
    // The suites' temporary directories go, pass or fail; the logs stay in the build directory.
    let _ = fs::remove_dir_all(&run_dir);
    if ok {
        ExitCode::SUCCESS
    } else {
        println!("integration: FAILED; logs in {}", log_dir.display());
        ExitCode::FAILURE
    }
}

/// What a run will do: the test binary, the suites to run, and those the container run leaves
/// out (with why).
struct Plan {
    options: Options,
    bin: PathBuf,
    suites: BTreeMap<String, Vec<String>>,
    not_run: Vec<(&'static str, usize, &'static str, &'static str)>,
}

/// Builds the test binary, lists its suites and keeps those `options` asks for.
fn plan(options: Options) -> Result<Plan, String> {
    let bin = test_binary(options.containers)?;
    let mut suites = suites(&bin)?;
    for v in VARIANTS {
        if let Some(tests) = suites.get(v.suite).cloned() {
            suites.insert(v.name.to_owned(), tests);
        }
    }
    #[allow(clippy::disallowed_methods)] // the engine's address, for the container run
    let engine = std::env::var_os("DOCKER_HOST");
    if options.containers && engine.is_none() {
        return Err(
            "--containers needs a Docker engine in DOCKER_HOST; run it as `make integration-containers`"
                .into(),
        );
    }
    if let Some(only) = &options.only {
        if let Some(name) = only.iter().find(|name| !suites.contains_key(*name)) {
            return Err(format!(
                "no suite {name:?}; suites: {}",
                suites.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        suites.retain(|k, _| only.contains(k));
    }
    let mut not_run = Vec::new();
    if options.containers {
        let skipped = LOCAL_ONLY
            .iter()
            .map(|(suite, why)| (*suite, "needs a local server", *why))
            .chain(
                NO_SERVER
                    .iter()
                    .map(|(suite, why)| (*suite, "starts no server", *why)),
            )
            .chain(
                SETTING_ONLY
                    .iter()
                    .map(|(suite, why)| (*suite, "a receiver setting", *why)),
            );
        for (suite, needs, why) in skipped {
            if let Some(tests) = suites.remove(suite) {
                not_run.push((suite, tests.len(), needs, why));
            }
        }
    }
    Ok(Plan {
        options,
        bin,
        suites,
        not_run,
    })
}

/// The run's scratch directory and its log directory, both made empty.
fn directories(bin: &Path) -> Result<(PathBuf, PathBuf), String> {
    // Short: a MySQL socket path under it must stay within 107 bytes.
    let run_dir = std::env::temp_dir().join(format!("ri-it-{}", std::process::id()));
    // Logs stay in the build directory (target/integration-logs), not in a temporary one.
    let log_dir = bin
        .ancestors()
        .nth(3)
        .map(|target| target.join("integration-logs"))
        .unwrap_or_else(|| PathBuf::from("integration-logs"));
    let _ = fs::remove_dir_all(&run_dir);
    let _ = fs::remove_dir_all(&log_dir);
    for dir in [&run_dir, &log_dir] {
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    Ok((run_dir, log_dir))
}

/// Runs every suite of `plan`, `jobs` at a time, longest first; the outcomes by suite name.
fn run_suites(run: Run, plan: Plan) -> Vec<Outcome> {
    // Longest suites first (the Galera cluster's, the nemesis's, then the fault suite), so
    // that none starts last.
    let mut queue: Vec<(String, Vec<String>)> = plan.suites.into_iter().collect();
    queue.sort_by_key(|(name, tests)| {
        (
            name != "galera",
            name != "nemesis",
            name != "failover",
            name != "faults",
            std::cmp::Reverse(tests.len()),
        )
    });
    let queue: VecDeque<_> = queue.into();
    println!(
        "integration: {} suites, {} at a time, each with its own temporary MySQL server; logs in {}",
        queue.len(),
        plan.options.jobs,
        run.log_dir.display()
    );
    let queue = Arc::new(Mutex::new(queue));
    let results = Arc::new(Mutex::new(Vec::new()));
    let run = Arc::new(run);
    let workers: Vec<_> = (0..plan.options.jobs)
        .map(|_| {
            let (queue, results, run) = (queue.clone(), results.clone(), run.clone());
            std::thread::spawn(move || loop {
                let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                let Some((suite, tests)) = next else { break };
                println!("integration: {suite}: running {} tests", tests.len());
                let o = run_suite(&run, &suite, &tests);
                println!(
                    "integration: {suite}: {} in {:.1} s",
                    if o.ok { "passed" } else { "FAILED" },
                    o.seconds
                );
                results.lock().unwrap_or_else(|p| p.into_inner()).push(o);
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let mut results = std::mem::take(&mut *results.lock().unwrap_or_else(|p| p.into_inner()));
    results.sort_by(|a, b| a.suite.cmp(&b.suite));
    results
}

/// Prints the failed suites' output, the summary table, what the container run left out or
/// ran locally, and the figures the suites report; whether every suite passed on the servers
/// it should have had.
fn report(
    results: &[Outcome],
    not_run: &[(&'static str, usize, &'static str, &'static str)],
    containers: bool,
    started: Instant,
) -> bool {
    for o in results.iter().filter(|o| !o.ok) {
        println!("\n===== {} (failed) — {} =====", o.suite, o.log.display());
        println!("{}", fs::read_to_string(&o.log).unwrap_or_default());
    }
    // The suite column is as wide as the longest name (`storage-encrypted`).
    let w = results
        .iter()
        .map(|o| o.suite.len())
        .chain(not_run.iter().map(|(s, ..)| s.len()))
        .max()
        .unwrap_or(0)
        .max(14);
    println!(
        "\n{:<w$} {:>6} {:>7} {:>7} {:>8} {:>8}{}",
        "suite",
        "tests",
        "passed",
        "failed",
        "ignored",
        "seconds",
        if containers { "  servers" } else { "" },
        w = w
    );
    let mut mismatches = Vec::new();
    for o in results {
        let column = if containers {
            let (column, wrong) = servers_had(o);
            mismatches.extend(wrong);
            format!("  {column}")
        } else {
            String::new()
        };
        println!(
            "{:<w$} {:>6} {:>7} {:>7} {:>8} {:>8.1}{column}",
            o.suite,
            o.tests,
            o.passed,
            o.failed,
            o.ignored,
            o.seconds,
            w = w
        );
    }
    for (suite, tests, needs, _) in not_run {
        println!(
            "{suite:<w$} {tests:>6} {:>7} {:>7} {:>8} {:>8}  not run: {needs}",
            "-",
            "-",
            "-",
            "-",
            w = w
        );
    }
    let sum = |f: fn(&Outcome) -> usize| results.iter().map(f).sum::<usize>();
    println!(
        "{:<w$} {:>6} {:>7} {:>7} {:>8} {:>8.1}  (wall clock)",
        "total",
        sum(|o| o.tests),
        sum(|o| o.passed),
        sum(|o| o.failed),
        sum(|o| o.ignored),
        started.elapsed().as_secs_f64(),
        w = w
    );
    for (suite, _, _, why) in not_run {
        println!("containers: {suite} not run (make integration runs it): {why}");
    }
    for o in results {
        if let Some(why) = partly_local(&o.suite).filter(|_| containers) {
            println!("containers: {} had local servers too: {why}", o.suite);
        }
    }
    for wrong in &mismatches {
        println!("containers: WRONG SERVER: {wrong}");
    }
    // The crash loop's seed, for replaying it, and the figures of the Galera, nemesis,
    // failover, recovery and encryption suites.
    for o in results {
        let log = fs::read_to_string(&o.log).unwrap_or_default();
        for line in log.lines().filter(|l| {
            l.starts_with("crash-loop: seed=")
                || l.starts_with("galera: ")
                || l.starts_with("nemesis: ")
                || l.starts_with("failover: ")
                || l.starts_with("recovery: ")
                || l.starts_with("at_rest: ")
        }) {
            println!("{}", line.split("; plan").next().unwrap_or(line));
        }
    }
    results.iter().all(|o| o.ok) && mismatches.is_empty()
}

/// Whether the run left nothing behind: no process marked with `run_id` (killed if found),
/// no file in a suite's scratch directory. Says so either way.
fn cleanup_checked(run_id: &str, run_dir: &Path, results: &[Outcome]) -> bool {
    // Give exiting processes a moment to be reaped.
    let _ = fixtures::poll_blocking(Duration::from_secs(5), Duration::from_millis(100), || {
        leftover_processes(run_id).is_empty().then_some(())
    });
    let leftovers = leftover_processes(run_id);
    let files: Vec<PathBuf> = results
        .iter()
        .flat_map(|o| fixtures::files_under(&run_dir.join(&o.suite)))
        .collect();
    if leftovers.is_empty() {
        println!("cleanup: no process of this run is left");
    } else {
        for (pid, cmd) in &leftovers {
            println!("cleanup: LEFT BEHIND: process {pid}: {cmd}");
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
    if files.is_empty() {
        println!("cleanup: no temporary file or directory of this run is left");
    } else {
        for f in files.iter().take(20) {
            println!("cleanup: LEFT BEHIND: {}", f.display());
        }
    }
    // Every suite process has ended: a namespace or link of ours whose owner is gone was left.
    let network = testdb::netns::leftovers();
    if network.is_empty() {
        println!("cleanup: no network namespace or link of this run is left");
    } else {
        for n in &network {
            println!("cleanup: LEFT BEHIND: {n}");
        }
    }
    leftovers.is_empty() && files.is_empty() && network.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(suite: &str, servers: &[&str]) -> Outcome {
        Outcome {
            suite: suite.to_owned(),
            tests: 1,
            passed: 1,
            failed: 0,
            ignored: 0,
            seconds: 0.0,
            ok: true,
            log: PathBuf::from("target/integration/x.log"),
            servers: servers.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    const CONTAINER: &str =
        "10.11.18-MariaDB (container result-inbox/mariadb:10.11, engine 20.10.24, 127.0.0.1:32768)";
    const LOCAL: &str = "10.11.18-MariaDB (local mariadbd, 127.0.0.1:40001)";

    #[test]
    fn a_suite_with_no_container_server_is_the_wrong_server() {
        let (column, wrong) = servers_had(&outcome("storage", &[LOCAL]));
        assert_eq!(column, "1 local");
        assert!(wrong.is_some_and(|w| w.contains("storage had no container server")));
        let (column, wrong) = servers_had(&outcome("storage", &[]));
        assert_eq!(column, "none");
        assert!(wrong.is_some());
    }

    #[test]
    fn a_variant_may_have_a_local_server_where_its_suite_may() {
        let (_, wrong) = servers_had(&outcome("faults-ungrouped", &[CONTAINER, LOCAL]));
        assert_eq!(wrong, None);
        assert_eq!(partly_local("outage-ungrouped"), partly_local("outage"));
        assert!(partly_local("storage").is_none());
    }

    #[test]
    fn a_local_server_is_wrong_only_where_a_suite_is_not_listed_as_needing_one() {
        let (column, wrong) = servers_had(&outcome("storage", &[CONTAINER, LOCAL]));
        assert_eq!(column, "1 container + 1 local");
        assert!(wrong.is_some_and(|w| w.contains("not listed as needing one")));
        let (column, wrong) = servers_had(&outcome("faults", &[CONTAINER, CONTAINER, LOCAL]));
        assert_eq!((column.as_str(), wrong), ("2 container + 1 local", None));
        let (column, wrong) = servers_had(&outcome("storage", &[CONTAINER]));
        assert_eq!((column.as_str(), wrong), ("1 container", None));
    }
}
