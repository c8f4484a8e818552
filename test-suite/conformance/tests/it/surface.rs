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

use fixtures::{bare_command, files_under, workspace_bin, ReceiverDb};

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

/// `orbit-dev bootstrap`'s arguments, as a person runs it.
fn bootstrap_line() -> Vec<String> {
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
    ])
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
        ("orbit-dev", bootstrap_line()),
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
            "init, migrate, demo, consume, digest, inspect, retention, prune, reconcile, help",
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
            // The receiver names, last, the schema version it needs.
            let ending = match program {
                "receiver" => format!(
                    "; receiver contract {}; canonical form {}; schema version {})",
                    about::CONTRACT_VERSION,
                    about::FORM_VERSION,
                    result_inbox::version::SCHEMA_VERSION
                ),
                _ => format!(
                    "; receiver contract {}; canonical form {})",
                    about::CONTRACT_VERSION,
                    about::FORM_VERSION
                ),
            };
            assert!(line.ends_with(&ending), "{line}");
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

/// A port on loopback where nothing listens (bound, then closed).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// One failure of the table: a program, a real condition, and what its line must say.
struct Failure {
    /// Its row in docs/input-surfaces.md ("Failing to reach a server").
    id: &'static str,
    program: &'static str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Option<&'static str>,
    exit: i32,
    /// Fragments of the last line on stderr.
    says: Vec<String>,
}

fn envs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Words of libraries and of our internals that a user must never have to read.
const INTERNAL_WORDS: &[&str] = &[
    "retryable",
    "Io(",
    "pool timed out",
    "os error",
    "client error (Connect)",
    "tcp connect error",
    "error sending request",
    "storage_error",
];

#[tokio::test(flavor = "multi_thread")]
async fn every_failure_to_reach_a_server_is_one_line_naming_where_why_and_what_to_check() {
    let db = ReceiverDb::provisioned().await;
    let address = db.address().to_owned();
    let init_url = db.init_url().expose().to_owned();
    let password = db.init.password.expose().to_owned();
    let platform_url = db.platform_url().expose().to_owned();
    let platform_password = db.platform.password.expose().to_owned();
    let closed = closed_port();

    // A platform over HTTPS whose certificate a CA of this run signed, which nothing trusts.
    let scratch = std::env::temp_dir().join(format!("surface-e-{}", std::process::id()));
    let pki = testdb::tls::Pki::generate(&scratch.join("pki")).unwrap();
    let tls_orbit = fixtures::OrbitDev::start_tls(ReceiverDb::provisioned().await, &pki, &[]);
    let token = tls_orbit.credentials().token.expose().to_owned();
    let credentials = tls_orbit.credentials_file.display().to_string();
    let wrong_password = "not-the-password-q7";
    // The receiver's own database, ready, for the cases about the platform.
    let ready = ReceiverDb::new().await;
    let runtime_url = ready.db.runtime_url().expose().to_owned();

    let bootstrap = |dsn: String| Failure {
        id: "",
        program: "orbit-dev",
        args: bootstrap_line(),
        env: vec![("ORBIT_MYSQL_DSN".into(), dsn)],
        stdin: None,
        exit: 1,
        says: vec![],
    };
    let cases = vec![
        Failure {
            id: "database-refused",
            program: "receiver",
            args: strings(&["init"]),
            env: envs(&[(
                "ORBIT_RECEIVER_DSN",
                &init_url.replace(&address, &format!("127.0.0.1:{closed}")),
            )]),
            stdin: None,
            exit: 1,
            says: vec![
                format!("receiver init: cannot connect to the receiver database: 127.0.0.1:{closed}: connection refused: nothing listens on that port; check ORBIT_RECEIVER_DSN"),
            ],
        },
        Failure {
            id: "database-password",
            program: "receiver",
            args: strings(&["init"]),
            env: envs(&[("ORBIT_RECEIVER_DSN", &init_url.replace(&password, wrong_password))]),
            stdin: None,
            exit: 1,
            says: vec![
                format!("access denied for account `{}` at {address}", db.init.user),
                "check ORBIT_RECEIVER_DSN".into(),
            ],
        },
        Failure {
            id: "database-unknown",
            program: "receiver",
            args: strings(&["init"]),
            env: envs(&[(
                "ORBIT_RECEIVER_DSN",
                &init_url.replace(&format!("/{}", db.receiver_db), "/no_such_receiver_db"),
            )]),
            stdin: None,
            exit: 1,
            says: vec![
                format!("database `no_such_receiver_db` at {address} does not exist"),
                "check ORBIT_RECEIVER_DSN".into(),
            ],
        },
        Failure {
            id: "platform-refused",
            program: "receiver",
            args: strings(&["demo"]),
            env: envs(&[
                ("ORBIT_RECEIVER_DSN", &runtime_url),
                ("ORBIT_URL", &format!("http://127.0.0.1:{closed}")),
                ("ORBIT_CREDENTIALS_FILE", &credentials),
            ]),
            stdin: None,
            exit: 1,
            says: vec![format!(
                "cannot reach the platform at 127.0.0.1:{closed}: connection refused: nothing listens on that port; check ORBIT_URL"
            )],
        },
        Failure {
            id: "platform-untrusted",
            program: "receiver",
            args: strings(&["demo"]),
            env: envs(&[
                ("ORBIT_RECEIVER_DSN", &runtime_url),
                ("ORBIT_URL", &tls_orbit.url),
                ("ORBIT_CREDENTIALS_FILE", &credentials),
            ]),
            stdin: None,
            exit: 1,
            says: vec![
                format!("ORBIT_URL {}", tls_orbit.url),
                "TLS: the server's certificate is not signed by a CA this client trusts".into(),
                "ORBIT_CA_FILE".into(),
            ],
        },
        Failure {
            id: "platform-database-password",
            says: vec![
                format!(
                    "orbit-dev: cannot connect to the platform database at {address}: access denied for account `{}`",
                    db.platform.user
                ),
                "check ORBIT_MYSQL_DSN".into(),
            ],
            ..bootstrap(platform_url.replace(&platform_password, wrong_password))
        },
        Failure {
            id: "platform-database-unknown",
            says: vec![
                "unknown database `no_such_platform_db`".into(),
                "check ORBIT_MYSQL_DSN".into(),
            ],
            ..bootstrap(platform_url.replace(&format!("/{}", db.platform_db), "/no_such_platform_db"))
        },
        Failure {
            id: "platform-database-refused",
            says: vec![format!(
                "orbit-dev: cannot connect to the platform database at 127.0.0.1:{closed}: connection refused: nothing listens on that port; check ORBIT_MYSQL_DSN"
            )],
            ..bootstrap(platform_url.replace(&address, &format!("127.0.0.1:{closed}")))
        },
        Failure {
            id: "digest-field",
            program: "receiver",
            args: strings(&["digest", "--queue", "inbox-demo"]),
            env: vec![],
            stdin: Some(r#"{"id":"e-1","type":"task.started","namespace":"default","queue_id":"inbox-demo","task_id":"t-1","task_version":"7","state":"RUNNING","occurred_at":"2026-01-01T00:00:00Z"}"#),
            exit: 3,
            says: vec!["receiver digest: invalid_version: `task_version` must be an integer".into()],
        },
        Failure {
            id: "proxy-upstream",
            program: "commit-proxy",
            args: strings(&["--upstream", "banana"]),
            env: vec![],
            stdin: None,
            exit: 2,
            says: vec!["commit-proxy: --upstream \"banana\" has no port: give HOST:PORT".into()],
        },
        Failure {
            id: "proxy-listen",
            program: "commit-proxy",
            args: strings(&["--upstream", &address, "--listen", "0.0.0.0:0"]),
            env: vec![],
            stdin: None,
            exit: 2,
            says: vec!["listens on loopback addresses only".into()],
        },
        Failure {
            id: "kit-receiver",
            program: "conformance",
            args: strings(&["run"]),
            env: vec![],
            stdin: None,
            exit: 2,
            says: vec!["conformance: run: --receiver (or CONFORMANCE_RECEIVER) is required".into()],
        },
    ];

    let surfaces = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/input-surfaces.md"),
    )
    .unwrap();
    let secrets = [
        password.as_str(),
        &platform_password,
        wrong_password,
        &token,
    ];
    for case in &cases {
        let started = Instant::now();
        let ran = match case.stdin {
            None => run(
                &workspace_bin(case.program),
                &case.args,
                &case.env,
                &scratch,
            ),
            Some(input) => {
                let mut cmd = bare_command(&workspace_bin(case.program));
                cmd.args(&case.args)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                let mut child = cmd.spawn().unwrap();
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(input.as_bytes())
                    .unwrap();
                let out = child.wait_with_output().unwrap();
                Ran {
                    code: out.status.code(),
                    stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                    stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                    files: vec![],
                }
            }
        };
        let id = case.id;
        assert_eq!(ran.code, Some(case.exit), "{id}: exit\n{}", ran.stderr);
        // One line; orbit-dev, while it waits for its database, says so at most once a
        // second before it.
        // Log lines (`receiver demo` logs its steps) are not the error.
        let lines: Vec<&str> = ran
            .stderr
            .lines()
            .filter(|l| !l.contains("Z  INFO "))
            .collect();
        let (waiting, last) = lines.split_at(lines.len().saturating_sub(1));
        assert_eq!(last.len(), 1, "{id}: {}", ran.stderr);
        let last = last[0];
        assert!(
            waiting
                .iter()
                .all(|l| l.starts_with("orbit-dev: waiting for the platform database at ")),
            "{id}: one line: {}",
            ran.stderr
        );
        assert!(
            waiting.len() as u64 <= started.elapsed().as_secs() + 1,
            "{id}: more than one waiting line a second: {}",
            ran.stderr
        );
        for fragment in &case.says {
            assert!(
                last.contains(fragment.as_str()),
                "{id}: {last:?} lacks {fragment:?}"
            );
        }
        for word in INTERNAL_WORDS {
            assert!(
                !ran.stderr.contains(word),
                "{id}: {word:?} in {}",
                ran.stderr
            );
        }
        for secret in secrets {
            assert!(
                !ran.stderr.contains(secret) && !ran.stdout.contains(secret),
                "{id} printed a secret"
            );
        }
        // docs/input-surfaces.md lists the case with the same exit code.
        let row = surfaces
            .lines()
            .find(|l| l.starts_with(&format!("| `{id}` |")))
            .unwrap_or_else(|| panic!("docs/input-surfaces.md has no row for `{id}`"));
        assert!(
            row.contains(&format!("| {} |", case.exit)),
            "docs/input-surfaces.md says another exit code for `{id}`: {row}"
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
