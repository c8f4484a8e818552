//! What every one of the six programs (`receiver`, `demo`, `conformance`, `orbit-dev`,
//! `commit-proxy`, `integration`) answers before it does anything: help wherever `--help` or
//! `-h` stands acts on nothing, `--version` is one line of five facts, and an unknown command
//! is one line naming it and the commands (R-CLI-5).
//!
//! "Acts on nothing" is measured, not assumed: every variable a program reads points at a live
//! throwaway server through a forwarder that counts connections, or at a listener that counts
//! them; each run has an empty working directory and HOME of its own. A run that connects,
//! writes a file or keeps running fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use conformance::{bare_command, files_under, workspace_bin, ReceiverDb};

/// Longer than any help takes; a program still running after it is doing something else.
const PATIENCE: Duration = Duration::from_secs(20);

/// One run's result.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    files: Vec<PathBuf>,
}

/// Runs `bin args` in an empty directory of its own with `env`; kills it after [`PATIENCE`].
fn run(bin: &Path, args: &[String], env: &[(String, String)], scratch: &Path) -> Ran {
    let dir = scratch.join(format!("run-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd: Command = bare_command(bin);
    cmd.args(args)
        .current_dir(&dir)
        .env("HOME", &dir)
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} {args:?} was still running after {PATIENCE:?}: it acted instead of printing its help",
                bin.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let files = files_under(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    Ran {
        code,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        files,
    }
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

/// Every program and a real command line of each of its commands: the lines a person runs.
fn command_lines(proxy_upstream: &str) -> Vec<(&'static str, Vec<String>)> {
    vec![
        ("receiver", strings(&["init"])),
        ("receiver", strings(&["demo"])),
        ("receiver", strings(&["consume"])),
        ("receiver", strings(&["retention"])),
        (
            "receiver",
            strings(&["prune", "--older-than", "30d", "--batch-rows", "10"]),
        ),
        (
            "receiver",
            strings(&["prune", "--older-than", "1s", "--allow-short-window"]),
        ),
        (
            "receiver",
            strings(&["reconcile", "--since", "2026-01-01T00:00:00Z"]),
        ),
        (
            "receiver",
            strings(&["digest", "--queue", "inbox-demo", "event.json"]),
        ),
        (
            "receiver",
            strings(&["inspect", "--task-id", "t-1", "--json"]),
        ),
        ("receiver", strings(&["help"])),
        ("demo", strings(&[])),
        (
            "conformance",
            strings(&[
                "run",
                "--receiver",
                "receiver",
                "--only",
                "schema",
                "--junit",
                "r.xml",
            ]),
        ),
        (
            "conformance",
            strings(&[
                "mutants",
                "--receiver-mutant",
                "receiver-mutant",
                "--runs",
                "1",
            ]),
        ),
        ("conformance", strings(&["list"])),
        ("orbit-dev", strings(&["serve", "--listen", "127.0.0.1:0"])),
        (
            "orbit-dev",
            strings(&[
                "bootstrap",
                "--application",
                "a",
                "--namespace",
                "default",
                "--environment",
                "development",
                "--queue",
                "inbox-demo",
                "--output",
                "credentials.json",
            ]),
        ),
        (
            "commit-proxy",
            vec![
                "--upstream".into(),
                proxy_upstream.into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
            ],
        ),
        (
            "integration",
            strings(&["--only", "surface", "--jobs", "1"]),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn help_anywhere_on_any_command_line_of_every_program_acts_on_nothing() {
    let db = ReceiverDb::provisioned().await;
    let server: std::net::SocketAddr = db.address().parse().unwrap();
    let database = testdb::Forwarder::start(server).unwrap();
    // The platform: a listener that counts (its target is the database; nothing should come).
    let platform = testdb::Forwarder::start(server).unwrap();
    let through = |url: String| url.replace(db.address(), &database.address().to_string());
    let scratch = std::env::temp_dir().join(format!("surface-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let credentials = scratch.join("credentials.json");
    std::fs::write(&credentials, "{}").unwrap();
    let env: Vec<(String, String)> = [
        (
            "ORBIT_RECEIVER_DSN",
            through(db.init_url().expose().to_owned()),
        ),
        (
            "ORBIT_MYSQL_DSN",
            through(db.platform_url().expose().to_owned()),
        ),
        ("ORBIT_URL", format!("http://{}", platform.address())),
        ("ORBIT_CREDENTIALS_FILE", credentials.display().to_string()),
        (
            "ORBIT_SUBSCRIPTION_ID",
            "0123456789abcdef0123456789abcdef".into(),
        ),
        ("RECEIVER_NAME", "surface-test".into()),
        ("RECEIVER_METRICS_LISTEN", "127.0.0.1:0".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();

    let mut runs = 0;
    for (program, line) in command_lines(&database.address().to_string()) {
        let bin = workspace_bin(program);
        for at in 0..=line.len() {
            let flag = if (at + runs) % 2 == 0 { "--help" } else { "-h" };
            let mut args = line.clone();
            args.insert(at, flag.to_owned());
            let ran = run(&bin, &args, &env, &scratch);
            runs += 1;
            let shown = format!("{program} {}", args.join(" "));
            assert_eq!(ran.code, Some(0), "{shown}: exit\n{}", ran.stderr);
            assert!(ran.stdout.starts_with("usage"), "{shown}: {}", ran.stdout);
            assert_eq!(ran.stderr, "", "{shown}: nothing on stderr");
            assert!(ran.files.is_empty(), "{shown} wrote {:?}", ran.files);
            // The help of the command named, not the program's: the command is in its usage.
            if let Some(command) = line.first().filter(|c| !c.starts_with('-')) {
                assert!(
                    ran.stdout
                        .lines()
                        .take(3)
                        .any(|l| l.contains(command.as_str())),
                    "{shown}: not {command}'s help: {}",
                    ran.stdout
                );
            }
            assert_eq!(
                (database.connections(), platform.connections()),
                (0, 0),
                "{shown} connected to the database or the platform"
            );
        }
    }
    assert!(runs > 60, "{runs} runs");

    // The forwarders do count: one real command through each shows it.
    let init = run(
        &workspace_bin("receiver"),
        &strings(&["init"]),
        &env,
        &scratch,
    );
    assert_eq!(init.code, Some(0), "{}", init.stderr);
    assert!(database.connections() > 0, "the counter counts");
    let _ = std::fs::remove_dir_all(&scratch);
}

#[test]
fn every_program_prints_one_version_line_of_five_facts_and_names_an_unknown_command() {
    let scratch = std::env::temp_dir().join(format!("surface-v-{}", std::process::id()));
    let commands: &[(&str, &str)] = &[
        (
            "receiver",
            "init, demo, consume, digest, inspect, retention, prune, reconcile, help",
        ),
        ("conformance", "run, mutants, list"),
        ("orbit-dev", "serve, bootstrap"),
    ];
    for program in [
        "receiver",
        "demo",
        "conformance",
        "orbit-dev",
        "commit-proxy",
        "integration",
    ] {
        let bin = workspace_bin(program);
        for flag in ["--version", "-V"] {
            let ran = run(&bin, &strings(&[flag]), &[], &scratch);
            assert_eq!(ran.code, Some(0), "{program} {flag}: {}", ran.stderr);
            let line = ran.stdout.trim_end();
            assert_eq!(ran.stdout.lines().count(), 1, "{program}: {}", ran.stdout);
            let prefix = format!("{program} {} (commit ", about::VERSION);
            assert!(line.starts_with(&prefix), "{line}");
            assert!(
                line.ends_with(&format!(
                    "; receiver contract {}; canonical form {})",
                    about::CONTRACT_VERSION,
                    about::FORM_VERSION
                )),
                "{line}"
            );
            let commit = &line[prefix.len()..].split(';').next().unwrap();
            assert!(
                commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
                "{program}: the commit of a build from a checkout: {commit:?}"
            );
        }
    }
    for (program, list) in commands {
        let ran = run(&workspace_bin(program), &strings(&["frob"]), &[], &scratch);
        assert_eq!(ran.code, Some(2), "{program} frob");
        assert_eq!(
            ran.stderr,
            format!(
                "{program}: unknown command `frob`; the commands are {list} (`{program} --help`)\n"
            )
        );
        assert_eq!(ran.stdout, "");
    }
    // The programs without commands name an unknown flag in one line.
    for (program, args) in [
        ("demo", &["--frob"][..]),
        ("commit-proxy", &["--upstream", "127.0.0.1:1", "--frob"]),
        ("integration", &["--frob"]),
    ] {
        let ran = run(&workspace_bin(program), &strings(args), &[], &scratch);
        assert_eq!(ran.code, Some(2), "{program} {args:?}");
        assert_eq!(ran.stderr.lines().count(), 1, "{}", ran.stderr);
        assert!(ran.stderr.contains("`--frob`"), "{}", ran.stderr);
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
