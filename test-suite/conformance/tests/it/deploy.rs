//! What ships for operators (R-OPS-4), checked by the tools that will read it: the alert rules
//! by `promtool` and by a real Prometheus scraping a real `receiver consume` and `orbit-dev`
//! through a database outage, every dashboard query against that live scrape, and the systemd
//! unit by `systemd-analyze verify`.
//!
//! Prometheus and promtool are Debian's, unpacked by `scripts/install-deps` into
//! `target/tools/prometheus` (or found on PATH).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fixtures::http::http_get_10;
use fixtures::process::Consumer;
use fixtures::{cancelled_task, eventually, OwnServerReceiver};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::Connection;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `name` from `target/tools/prometheus/usr/bin`, else from PATH.
fn prometheus_tool(name: &str) -> PathBuf {
    let unpacked = repo().join("target/tools/prometheus/usr/bin").join(name);
    if unpacked.is_file() {
        return unpacked;
    }
    #[allow(clippy::disallowed_methods)] // the test looks up its own tools
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no {name}: run scripts/install-deps (make deps)"))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the tool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let promtool = prometheus_tool("promtool");
    let dir = repo().join("deploy/prometheus");
    let checked = run(Command::new(&promtool)
        .args(["check", "rules", "receiver-alerts.yml"])
        .current_dir(&dir));
    assert!(checked.contains("SUCCESS: 9 rules found"), "{checked}");
    let tested = run(Command::new(&promtool)
        .args(["test", "rules", "receiver-alerts.test.yml"])
        .current_dir(&dir));
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    // verify resolves ExecStart: point it at a receiver that exists, in copies of the units
    // (the timer beside the service it starts).
    let dir = testdb::scratch_dir().unwrap().join("systemd-verify");
    std::fs::create_dir_all(&dir).unwrap();
    let receiver = fixtures::receiver_bin();
    let mut copies = Vec::new();
    for name in [
        "receiver-consume.service",
        "receiver-prune.service",
        "receiver-prune.timer",
        "receiver-reconcile-audit.service",
        "receiver-reconcile-audit.timer",
    ] {
        let text = std::fs::read_to_string(repo().join("deploy/systemd").join(name)).unwrap();
        let copy = dir.join(name);
        std::fs::write(
            &copy,
            text.replace("/usr/local/bin/receiver", &receiver.display().to_string()),
        )
        .unwrap();
        if name.ends_with(".service") {
            for hardening in [
                "DynamicUser=yes",
                "NoNewPrivileges=yes",
                "ProtectSystem=strict",
                "LoadCredential=",
                "TimeoutStopSec=15",
            ] {
                assert!(text.contains(hardening), "{name} lacks {hardening}");
            }
        }
        copies.push(copy);
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&copies)
        .stdin(Stdio::null())
        .output()
        .expect("systemd-analyze runs");
    let err = String::from_utf8_lossy(&out.stderr);
    // Without systemd as PID 1 (a container), verify still parses and checks the unit; it
    // only cannot reach the manager's bus, which it says in lines of its own.
    let problems: Vec<&str> = err
        .lines()
        .filter(|l| !l.contains("bus") && !l.contains("Bus") && !l.trim().is_empty())
        .collect();
    assert!(problems.is_empty(), "systemd-analyze verify: {err}");
    let consume = std::fs::read_to_string(&copies[0]).unwrap();
    assert!(consume.contains("Restart=on-failure"));
    // The nightly prune: a one-shot under a time limit, as the prune account, on a timer that
    // catches up a missed night.
    let prune = std::fs::read_to_string(&copies[1]).unwrap();
    for line in [
        "Type=oneshot",
        "LoadCredential=prune-dsn:",
        "prune --older-than 30d --max-seconds 3300",
    ] {
        assert!(prune.contains(line), "the prune service lacks {line}");
    }
    let timer = std::fs::read_to_string(&copies[2]).unwrap();
    assert!(timer.contains("Persistent=true") && timer.contains("Unit=receiver-prune.service"));
    // The daily audit: a one-shot dry run on a timer that catches up a missed day (its command
    // is run for real below).
    let audit = std::fs::read_to_string(&copies[3]).unwrap();
    assert!(audit.contains("Type=oneshot") && audit.contains("reconcile --dry-run --since"));
    let timer = std::fs::read_to_string(&copies[4]).unwrap();
    assert!(
        timer.contains("Persistent=true")
            && timer.contains("Unit=receiver-reconcile-audit.service")
    );
}

/// The daily audit's command as systemd runs it (`%%` unescaped to `%`, the DSN read from the
/// credential directory, the consume service's environment): over a receiver that lost nothing
/// it exits 0 with a clean summary over the last 25 hours; once an inbox row is gone it exits 3
/// and names the missing delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daily_audit_units_command_exits_0_when_nothing_is_missing_and_3_when_a_row_is_gone() {
    let (orbit, client, sub, env) = fixtures::subscribed_receiver(&[], &["task.cancelled"]).await;
    let consumer = Consumer::normal(&env);
    cancelled_task(&client).await;
    cancelled_task(&client).await;
    fixtures::all_acked(&client, &sub.id, Some(2), Duration::from_secs(30)).await;
    consumer.stop().await;

    let unit =
        std::fs::read_to_string(repo().join("deploy/systemd/receiver-reconcile-audit.service"))
            .unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart=/bin/sh -c '"))
        .and_then(|l| l.strip_suffix('\''))
        .expect("ExecStart=/bin/sh -c '…'");
    let script = exec.replace("%%", "%").replace(
        "/usr/local/bin/receiver",
        &fixtures::receiver_bin().display().to_string(),
    );
    let credentials = testdb::scratch_dir().unwrap().join("audit-credentials");
    std::fs::create_dir_all(&credentials).unwrap();
    let dsn = env
        .iter()
        .find(|(k, _)| *k == "ORBIT_RECEIVER_DSN")
        .map(|(_, v)| v.clone())
        .unwrap();
    std::fs::write(credentials.join("dsn"), dsn).unwrap();
    let audit = || {
        let mut cmd = fixtures::bare_command(Path::new("/bin/sh"));
        cmd.arg("-c")
            .arg(&script)
            .envs(
                env.iter()
                    .filter(|(k, _)| *k != "ORBIT_RECEIVER_DSN")
                    .map(|(k, v)| (*k, v.as_str())),
            )
            .env("PATH", "/usr/bin:/bin")
            .env("CREDENTIALS_DIRECTORY", &credentials)
            .stdin(Stdio::null());
        let out = cmd.output().expect("the audit's command runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), stdout, stderr)
    };
    let (code, stdout, stderr) = audit();
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.contains(" deliveries=2 present=2 missing=0 ") && summary.ends_with("result=clean"),
        "{summary}"
    );

    let mut admin = sqlx::MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    // The newest row, as a restore loses it (a lost oldest row would read as pruned).
    sqlx::query("DELETE FROM receiver_inbox ORDER BY received_at DESC LIMIT 1")
        .execute(&mut admin)
        .await
        .unwrap();
    let (code, stdout, stderr) = audit();
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("delivery=") && l.ends_with(" missing")),
        "{stdout}"
    );
    assert!(stdout
        .lines()
        .last()
        .unwrap_or_default()
        .ends_with("result=missing"));
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The series an instant query returns; panics if Prometheus refuses the query.
fn query(addr: &str, promql: &str) -> Vec<serde_json::Value> {
    let (status, body) = http_get_10(addr, &format!("/api/v1/query?query={}", encode(promql)));
    let v: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(
        (status, v["status"].as_str()),
        (200, Some("success")),
        "{promql}: {body}"
    );
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The state of alert `name` now: `None`, `Some("pending")` or `Some("firing")`.
fn alert_state(addr: &str, name: &str) -> Option<String> {
    let (_, body) = http_get_10(addr, "/api/v1/alerts");
    let v: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["data"]["alerts"]
        .as_array()?
        .iter()
        .find(|a| a["labels"]["alertname"] == name)
        .and_then(|a| a["state"].as_str().map(str::to_owned))
}

/// A Prometheus server on loopback, its data in a scratch directory, killed on drop.
struct Prometheus {
    child: std::process::Child,
    addr: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes `targets` (job, address) every second and evaluates the shipped rules every
    /// second.
    fn start(targets: &[(&str, &str)]) -> Prometheus {
        let dir = testdb::scratch_dir().unwrap().join("prometheus");
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let rules = repo().join("deploy/prometheus/receiver-alerts.yml");
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n",
            rules.canonicalize().unwrap().display()
        );
        for (job, addr) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(prometheus_tool("prometheus"));
        cmd.arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap());
        let child = testdb::spawn_tied(cmd).expect("prometheus starts");
        let me = Prometheus { child, addr };
        let started = Instant::now();
        while std::net::TcpStream::connect(&me.addr).is_err()
            || http_get_10(&me.addr, "/-/ready").0 != 200
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "Prometheus not ready after 30 s; log: {}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        me
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_fires_and_resolves_database_down_and_every_panel_query_returns_series() {
    let own = OwnServerReceiver::start(&["--lease-seconds", "10"], &["task.cancelled"]).await;
    let mut env = own.env.clone();
    env.push(("RECEIVER_METRICS_LISTEN", "127.0.0.1:0".into()));
    let consumer = Consumer::normal(&env);
    let addr = consumer.metrics_addr().await;
    for _ in 0..3 {
        cancelled_task(&own.client).await;
    }
    eventually(Duration::from_secs(20), "three applied", || {
        let n = consumer.output().matches("classification=applied").count();
        async move { n == 3 }
    })
    .await;

    let prom = Prometheus::start(&[("receiver", &addr), ("orbit-dev", &own.orbit.addr)]);
    eventually(Duration::from_secs(20), "both targets up", || {
        let up = query(&prom.addr, "up == 1").len();
        async move { up == 2 }
    })
    .await;

    // Every panel's query parses and returns series from the live scrape (rates need two
    // samples inside their window: a few seconds).
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/receiver-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expr");
            let title = panel["title"].as_str().unwrap_or("?");
            eventually(
                Duration::from_secs(20),
                &format!("series for panel {title:?}: {expr}"),
                || {
                    let n = query(&prom.addr, expr).len();
                    async move { n > 0 }
                },
            )
            .await;
            queries += 1;
        }
    }
    assert!(queries >= 10, "{queries} queries");

    // The database stops: the alert goes pending at once, fires after its 20 s, and resolves
    // when the database answers again.
    assert_eq!(alert_state(&prom.addr, "ReceiverDatabaseDown"), None);
    let pid = Pid::from_raw(own.server.pid().expect("a local server") as i32);
    struct Continue(Pid);
    impl Drop for Continue {
        fn drop(&mut self) {
            let _ = kill(self.0, Signal::SIGCONT);
        }
    }
    let resume = Continue(pid);
    kill(pid, Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    let state = |want: Option<&'static str>| {
        let now = alert_state(&prom.addr, "ReceiverDatabaseDown");
        async move { now.as_deref() == want }
    };
    eventually(
        Duration::from_secs(10),
        "ReceiverDatabaseDown pending",
        || state(Some("pending")),
    )
    .await;
    let pending = stopped.elapsed();
    eventually(
        Duration::from_secs(40),
        "ReceiverDatabaseDown firing",
        || state(Some("firing")),
    )
    .await;
    let firing = stopped.elapsed();
    assert!(firing >= Duration::from_secs(20), "fired after {firing:?}");
    drop(resume);
    let resumed = Instant::now();
    eventually(
        Duration::from_secs(15),
        "ReceiverDatabaseDown resolved",
        || state(None),
    )
    .await;
    eprintln!(
        "deploy: ReceiverDatabaseDown pending {:.1} s and firing {:.1} s after SIGSTOP, resolved {:.1} s after SIGCONT; {queries} panel queries returned series",
        pending.as_secs_f64(),
        firing.as_secs_f64(),
        resumed.elapsed().as_secs_f64()
    );
    consumer.stop().await;
}

/// The receiver's container image, which `make integration-containers` builds
/// (`scripts/containers receiver-image`) and names in `RECEIVER_IMAGE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the receiver's image on our container engine: make integration-containers runs it"]
async fn the_receiver_image_runs_the_demo_end_to_end() {
    #[allow(clippy::disallowed_methods)] // set by scripts/containers run
    let (image, engine) = (
        std::env::var("RECEIVER_IMAGE").expect("RECEIVER_IMAGE names the image"),
        std::env::var("DOCKER_HOST").expect("DOCKER_HOST names the engine"),
    );
    let orbit = fixtures::OrbitDev::start(&[]).await;
    orbit.init_receiver().await;
    let credentials = orbit.credentials();
    // The image runs as nobody: the token and queue go in as variables, not as a file.
    let env = [
        ("ORBIT_URL", orbit.url.clone()),
        ("ORBIT_TOKEN", credentials.token.expose().to_owned()),
        ("ORBIT_QUEUE_ID", credentials.queue_id.clone()),
        (
            "ORBIT_RECEIVER_DSN",
            orbit.db.runtime_url().expose().to_owned(),
        ),
    ];
    let mut cmd = Command::new("docker");
    cmd.args(["-H", &engine, "run", "--rm", "--network", "host"]);
    for (k, v) in &env {
        cmd.args(["-e", &format!("{k}={v}")]);
    }
    let out = cmd
        .args([&image, "demo"])
        .stdin(Stdio::null())
        .output()
        .expect("docker runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("ack_confirmed=1"), "{stdout}");
    assert!(
        !stdout.contains(credentials.token.expose())
            && !stderr.contains(credentials.token.expose())
    );
    // The nightly prune from the same image, as the prune account: the demo's rows, aged
    // past the window, go; the view stays.
    let mut admin = sqlx::MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    let aged = sqlx::query("UPDATE receiver_inbox SET received_at = received_at - INTERVAL 40 DAY")
        .execute(&mut admin)
        .await
        .unwrap()
        .rows_affected();
    assert!(aged > 0);
    let pruned = Command::new("docker")
        .args(["-H", &engine, "run", "--rm", "--network", "host"])
        .args([
            "-e",
            &format!("ORBIT_RECEIVER_DSN={}", orbit.db.prune_url().expose()),
        ])
        .args(["-e", &format!("ORBIT_QUEUE_ID={}", credentials.queue_id)])
        .args([&image, "prune", "--older-than", "30d"])
        .stdin(Stdio::null())
        .output()
        .expect("docker runs");
    let summary = String::from_utf8_lossy(&pruned.stdout);
    assert!(
        pruned.status.success(),
        "{summary}{}",
        String::from_utf8_lossy(&pruned.stderr)
    );
    assert!(
        summary.contains(&format!("pruned rows={aged} ")),
        "{summary}"
    );
    let views: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM receiver_task_views")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(views, 1);
    eprintln!(
        "deploy: the receiver image ran the demo: {}; then prune: {}",
        stdout.trim().replace('\n', "; "),
        summary.trim()
    );
}

/// The kit's tarball (`make kit-dist`), the only file of this repository a team outside Rust
/// needs: `target/dist/result-inbox-kit-<version>-x86_64-linux.tar.gz`.
/// Asserts that a kit run passed every case against our release receiver; its output.
fn kit_passed(out: &std::process::Output, started: Instant) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let cases = conformance_kit::cases().len();
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("{cases} passed, 0 failed")),
        "{stdout}{stderr}"
    );
    assert!(
        stdout.contains(&format!(
            "conformance {} (contract {})",
            env!("CARGO_PKG_VERSION"),
            conformance_kit::CONTRACT_VERSION
        )),
        "{stdout}"
    );
    println!(
        "the kit in a container: {cases} of {cases} cases passed in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    stdout
}

/// The tarball on a clean Debian 12 container with only `mariadb-server` installed (the testdb
/// image, `MARIADB_IMAGE`), no network and no Rust: the QUICKSTART.md it carries, its marked
/// block run as written (the receiver named as `RECEIVER`, as its text says), runs every case
/// against our release receiver and all pass.
#[test]
#[ignore = "needs our container engine and the kit's tarball: make integration-containers runs it"]
fn the_kit_tarball_passes_on_a_clean_debian_with_only_mariadb() {
    #[allow(clippy::disallowed_methods)] // set by scripts/containers run
    let image = std::env::var("MARIADB_IMAGE").expect("MARIADB_IMAGE names the image");
    #[allow(clippy::disallowed_methods)] // set by scripts/containers run
    let engine = std::env::var("DOCKER_HOST").expect("DOCKER_HOST names the engine");
    let tarball = fixtures::bins::dist_tarball("result-inbox-kit-");
    let file = tarball.file_name().unwrap().to_string_lossy().into_owned();
    let name = file.trim_end_matches(".tar.gz");
    // The QUICKSTART.md a user unpacks, not the template in deploy/kit.
    let quickstart = Command::new("tar")
        .args(["-xzOf"])
        .arg(&tarball)
        .arg(format!("{name}/QUICKSTART.md"))
        .output()
        .unwrap();
    assert!(quickstart.status.success());
    let quickstart = String::from_utf8_lossy(&quickstart.stdout).into_owned();
    let script = format!(
        "cd /tmp && cp /dist/{file} . && RECEIVER=/receiver/receiver\n{}",
        fixtures::docs::script(&quickstart, "quickstart")
    );
    let receiver = repo().join("target/release/receiver");
    assert!(receiver.is_file(), "make release first");
    let started = Instant::now();
    let out = Command::new("docker")
        .args(["-H", &engine, "run", "--rm", "--network", "none", "-v"])
        .arg(format!("{}:/receiver/receiver:ro", receiver.display()))
        .arg("-v")
        .arg(format!("{}:/dist/{file}:ro", tarball.display()))
        .args(["--entrypoint", "bash", &image, "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("docker runs");
    let stdout = kit_passed(&out, started);
    // `bin/conformance list` ran first, as the block says.
    assert!(stdout.contains("canonical-corpus"), "{stdout}");
}

/// The kit's image (`KIT_IMAGE`: `deploy/kit/Dockerfile`, MariaDB inside) against our release
/// receiver mounted into it: QUICKSTART.md's image example, run as written on our engine (its
/// placeholders, the build directory and the receiver's name, filled in), passes every case and
/// leaves its JUnit report in the reports directory it mounts.
#[test]
#[ignore = "needs our container engine and the kit's image: make integration-containers runs it"]
fn the_kit_image_passes_against_a_mounted_receiver() {
    #[allow(clippy::disallowed_methods)] // set by scripts/containers run
    let image = std::env::var("KIT_IMAGE").expect("KIT_IMAGE names the image");
    assert_eq!(
        image, "result-inbox-kit:local",
        "the name QUICKSTART.md uses"
    );
    let receiver = repo().join("target/release/receiver");
    assert!(receiver.is_file(), "make release first");
    let quickstart = std::fs::read_to_string(repo().join("deploy/kit/QUICKSTART.md")).unwrap();
    let script = fixtures::docs::script(&quickstart, "quickstart-image")
        .replace(
            "/path/to/build",
            &receiver.parent().unwrap().display().to_string(),
        )
        .replace("your-receiver", "receiver");
    let dir = std::env::temp_dir().join(format!("kit-image-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    // DOCKER_HOST (our engine) comes from scripts/containers run, as a user's would.
    let out = Command::new("bash")
        .args(["-c", &script])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .expect("bash runs");
    kit_passed(&out, started);
    let report = dir.join("kit-reports/kit.xml");
    assert!(
        std::fs::read_to_string(&report).is_ok_and(|x| x.contains("<testsuite ")),
        "no JUnit report at {}",
        report.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A container our test started, removed when the test ends, also on failure.
struct Container {
    engine: String,
    name: String,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["-H", &self.engine, "rm", "-f", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The CI recipes of docs/conformance-kit.md ("In your CI"), as a team pastes them: the GitHub
/// Actions job's shell steps, with its variables, run on a clean Debian 12 container (only
/// `mariadb-server` installed, no network) that shares its network with a MariaDB service
/// container on 127.0.0.1:33306, as GitHub maps a service's port; the kit's tarball where the
/// job reads it and our release receiver where the job builds its own. The run passes every
/// case on the service database, and leaves a JUnit report and a certificate (valid against
/// its schema, complete, with the tarball's own mutant matrix) where the job uploads them. The
/// GitLab job must run the same steps, so running one runs both.
#[test]
#[ignore = "needs our container engine and the kit's tarball: make integration-containers runs it"]
fn the_ci_recipes_run_against_a_service_database() {
    #[allow(clippy::disallowed_methods)] // set by scripts/containers run
    let image = std::env::var("MARIADB_IMAGE").expect("MARIADB_IMAGE names the image");
    #[allow(clippy::disallowed_methods)] // set by scripts/containers run
    let engine = std::env::var("DOCKER_HOST").expect("DOCKER_HOST names the engine");
    let page = std::fs::read_to_string(repo().join("docs/conformance-kit.md")).unwrap();
    let yaml = |mark: &str| {
        fixtures::docs::marked_blocks(&page, mark)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no block marked {mark}"))
    };
    let github = fixtures::docs::ci_job(&yaml("ci-github"));
    let gitlab = fixtures::docs::ci_job(&yaml("ci-gitlab"));
    // The same steps, but for how each installs the server programs.
    let installs = |s: &&String| s.contains("apt-get install");
    let rest = |job: &fixtures::docs::CiJob| -> Vec<String> {
        job.steps.iter().filter(|s| !installs(s)).cloned().collect()
    };
    assert_eq!(rest(&github), rest(&gitlab), "the two jobs' steps differ");
    assert!(github.steps.iter().any(|s| installs(&s)), "{github:?}");
    let keys = |job: &fixtures::docs::CiJob| -> Vec<String> {
        job.env
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| k.starts_with("CONFORMANCE_") || k == "KIT")
            .collect()
    };
    assert_eq!(
        keys(&github),
        keys(&gitlab),
        "the two jobs' variables differ"
    );

    let tarball = fixtures::bins::dist_tarball("result-inbox-kit-");
    let file = tarball.file_name().unwrap().to_string_lossy().into_owned();
    let kit = file.trim_end_matches(".tar.gz").to_owned();
    let receiver = repo().join("target/release/receiver");
    assert!(receiver.is_file(), "make release first");
    let dir = std::env::temp_dir().join(format!("kit-ci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("kit-reports")).unwrap();

    // The service, as the job's `services:` starts it: its own datadir, its root account
    // reachable over TCP with the password the job names, on the port the job maps.
    let password = github
        .env
        .iter()
        .find_map(|(k, v)| (k == "CONFORMANCE_DATABASE").then(|| v.clone()))
        .and_then(|url| {
            url.strip_prefix("mysql://root:")
                .and_then(|r| r.split_once('@'))
                .map(|(p, _)| p.to_owned())
        })
        .expect("the job's database URL names root's password");
    let service = Container {
        engine: engine.clone(),
        name: format!("kit-ci-service-{}", std::process::id()),
    };
    let started = Command::new("docker")
        .args([
            "-H",
            &engine,
            "run",
            "-d",
            "--network",
            "none",
            "--name",
            &service.name,
        ])
        .args(["--entrypoint", "bash", &image, "-c"])
        .arg(
            "mariadb-install-db --user=root --datadir=/tmp/svc >/tmp/install.log 2>&1 && \
             exec mariadbd --user=root --datadir=/tmp/svc --socket=/tmp/svc.sock \
             --pid-file=/tmp/svc.pid --bind-address=127.0.0.1 --port=33306",
        )
        .output()
        .unwrap();
    assert!(started.status.success(), "{started:?}");
    // As the MariaDB image's MARIADB_ROOT_PASSWORD does: no anonymous account (which, for a
    // connection from localhost, would match before the kit's accounts at '%'), root by
    // password from anywhere, and from localhost (which a TCP connection to 127.0.0.1 is
    // matched as) by password or socket.
    let grant = format!(
        "DELETE FROM mysql.global_priv WHERE User = ''; FLUSH PRIVILEGES; \
         ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('{password}') OR unix_socket; \
         CREATE USER 'root'@'%' IDENTIFIED BY '{password}'; \
         GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = Command::new("docker")
            .args(["-H", &engine, "exec", &service.name])
            .args(["mariadb", "-S", "/tmp/svc.sock", "-e", &grant])
            .output()
            .unwrap();
        if ok.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the service never answered: {ok:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The job: its variables (the workspace and the tarball's name filled in), then its steps.
    let mut cmd = Command::new("docker");
    cmd.args(["-H", &engine, "run", "--rm"])
        .arg("--network")
        .arg(format!("container:{}", service.name))
        .arg("-v")
        .arg(format!("{}:/work/ci/{file}:ro", tarball.display()))
        .arg("-v")
        .arg(format!(
            "{}:/work/build/your-receiver:ro",
            receiver.display()
        ))
        .arg("-v")
        .arg(format!(
            "{}:/work/kit-reports",
            dir.join("kit-reports").display()
        ))
        .args(["-w", "/work"]);
    for (k, v) in &github.env {
        let v = match k.as_str() {
            "KIT" => kit.clone(),
            _ => v.replace("${{ github.workspace }}", "/work"),
        };
        cmd.args(["-e", &format!("{k}={v}")]);
    }
    let script = format!("set -euo pipefail\n{}\n", github.steps.join("\n"));
    let t = Instant::now();
    let out = cmd
        .args(["--entrypoint", "bash", &image, "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("docker runs");
    let stdout = kit_passed(&out, t);
    assert!(
        stdout.contains("(existing server at 127.0.0.1:33306)"),
        "the cases ran on the service: {stdout}"
    );
    assert!(
        !stdout.contains(&password),
        "the URL's password was printed"
    );

    let junit = std::fs::read_to_string(dir.join("kit-reports/junit.xml")).unwrap();
    let cases = conformance_kit::cases().len();
    assert!(
        junit.contains(&format!("tests=\"{cases}\" failures=\"0\" errors=\"0\"")),
        "{junit}"
    );
    let certificate = dir.join("kit-reports/certificate.json");
    let valid = Command::new("python3")
        .args([
            "-c",
            "import json, sys, jsonschema; jsonschema.Draft202012Validator(json.load(open(sys.argv[1]))).validate(json.load(open(sys.argv[2]))); print('valid')",
        ])
        .arg(repo().join("docs/certificate.schema.json"))
        .arg(&certificate)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&valid.stdout),
        "valid\n",
        "{}",
        String::from_utf8_lossy(&valid.stderr)
    );
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&certificate).unwrap()).unwrap();
    assert_eq!(c["verdict"]["plain"], "pass");
    assert_eq!(c["complete"], true);
    assert_eq!(c["environment"]["jobs"], 2);
    assert_eq!(c["mutant_matrix"]["kit_sha256"], c["kit"]["sha256"]);
    let mutants = c["mutant_matrix"]["mutants"].as_array().unwrap();
    assert_eq!(mutants.len(), conformance_kit::MUTANTS.len());
    assert!(
        mutants.iter().all(|m| m["caught"] == m["runs"]),
        "{mutants:?}"
    );
    println!(
        "the CI recipe ran every case against a service database in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
