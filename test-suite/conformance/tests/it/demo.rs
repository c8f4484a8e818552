//! `receiver demo` and `receiver consume` as real processes against a real `orbit-dev` and a
//! real MySQL server (R-CLI).

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use fixtures::{bare_command, eventually, receiver_bin, spawn, OrbitDev, QUEUE};
use orbit_sdk::{DeliveryFilter, SubscriptionId};
use sqlx::{Connection, Executor, MySqlConnection, Row};

fn receiver(args: &[&str], env: &[(&str, String)]) -> Command {
    let mut cmd = bare_command(&receiver_bin());
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// `cmd` with stdout and stderr piped.
fn piped(mut cmd: Command) -> Command {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("receiver runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The demo's two lines with the task id replaced.
fn redacted(stdout: &str) -> (String, String) {
    let task = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("task="))
        .expect("a task= field")
        .to_owned();
    (stdout.replace(&task, "[task]"), task)
}

async fn platform_admin(orbit: &OrbitDev) -> MySqlConnection {
    let server = testdb::Server::shared().unwrap();
    MySqlConnection::connect(&format!(
        "{}/{}",
        server.admin_url().expose(),
        orbit.db.platform_db
    ))
    .await
    .unwrap()
}

/// Every secret the platform knows for its proofs: hashes of current and acked proofs.
async fn proof_hashes(orbit: &OrbitDev) -> Vec<Vec<u8>> {
    let mut admin = platform_admin(orbit).await;
    let rows = sqlx::query("SELECT proof_sha256 FROM orbit_deliveries WHERE proof_sha256 IS NOT NULL UNION ALL SELECT acked_proof_sha256 FROM orbit_deliveries WHERE acked_proof_sha256 IS NOT NULL")
        .fetch_all(&mut admin)
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.try_get::<Vec<u8>, _>(0).unwrap())
        .collect()
}

/// Fails if `output` shows a token, a password, a proof or `secrets`.
async fn assert_no_secrets(orbit: &OrbitDev, output: &str, secrets: &[&str]) {
    let token = orbit.credentials().token.expose().to_owned();
    assert!(!output.contains(&token), "the token was printed");
    for p in [&orbit.db.runtime.password, &orbit.db.init.password] {
        assert!(!output.contains(p.expose()), "a DSN password was printed");
    }
    for s in secrets {
        assert!(!output.contains(s), "{s} was printed");
    }
    // Any 64-hex word whose SHA-256 is a stored proof hash would be a printed proof.
    let hashes = proof_hashes(orbit).await;
    for word in output.split(|c: char| !c.is_ascii_hexdigit()) {
        if word.len() == 64 {
            let h = result_inbox::Digest::of(word.as_bytes()).0.to_vec();
            assert!(!hashes.contains(&h), "a lease proof was printed");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_twice_on_the_same_databases_with_new_identities() {
    let orbit = OrbitDev::start(&[]).await;
    orbit.init_receiver().await;
    let env = orbit.receiver_env();
    let started = Instant::now();
    let first = run(&mut receiver(&["demo"], &env));
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert!(started.elapsed() < Duration::from_secs(20));
    // The second run logs JSON: every stderr line is a JSON object.
    let mut json_env = env.clone();
    json_env.push(("RECEIVER_LOG_FORMAT", "json".into()));
    let second = run(&mut receiver(&["demo"], &json_env));
    assert!(second.status.success(), "{}", text(&second.stderr));
    for line in text(&second.stderr).lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string(), "{line}");
    }
    let (a, task_a) = redacted(&text(&first.stdout));
    let (b, task_b) = redacted(&text(&second.stdout));
    assert_ne!(task_a, task_b, "each run makes a new task");
    assert_eq!(a, b);
    insta::assert_snapshot!("demo_lines", a);
    let all = format!(
        "{}{}{}{}",
        text(&first.stdout),
        text(&first.stderr),
        text(&second.stdout),
        text(&second.stderr)
    );
    assert_no_secrets(&orbit, &all, &[]).await;

    // Two subscriptions now, both paused; each task's delivery ACKed once.
    let mut admin = platform_admin(&orbit).await;
    let subs: Vec<(String, bool)> =
        sqlx::query("SELECT id, enabled FROM orbit_subscriptions ORDER BY created_at")
            .fetch_all(&mut admin)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.try_get_unchecked(0).unwrap(), r.try_get(1).unwrap()))
            .collect();
    assert_eq!(subs.len(), 2);
    assert!(subs.iter().all(|(_, enabled)| !enabled));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_programs_event_is_refused_and_the_demo_still_succeeds() {
    let orbit = OrbitDev::start(&[]).await;
    orbit.init_receiver().await;
    let client = orbit.client();
    let mut admin = platform_admin(&orbit).await;
    // Whether another program's event reaches the demo's brand-new subscription before the
    // demo is done is a race the test cannot control from outside; try a few runs, and check
    // every foreign delivery the demo did receive.
    let mut refused_seen = false;
    for run_no in 0..5 {
        // Another program's tasks, waiting on the same queue to be cancelled.
        let mut foreign_tasks = Vec::new();
        for _ in 0..3 {
            foreign_tasks.push(client.submit_task(QUEUE, None).await.unwrap().id);
        }
        let subs_before: i64 = sqlx::query("SELECT COUNT(*) FROM orbit_subscriptions")
            .fetch_one(&mut admin)
            .await
            .unwrap()
            .try_get(0)
            .unwrap();
        let demo = spawn(piped(receiver(&["demo"], &orbit.receiver_env())));
        // As soon as the demo's subscription exists, the other program cancels its tasks.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n: i64 = sqlx::query("SELECT COUNT(*) FROM orbit_subscriptions")
                .fetch_one(&mut admin)
                .await
                .unwrap()
                .try_get(0)
                .unwrap();
            if n > subs_before || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for t in &foreign_tasks {
            client.cancel_task(t).await.unwrap();
        }
        let out = tokio::task::spawn_blocking(move || demo.wait_with_output().unwrap())
            .await
            .unwrap();
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "run {run_no}: {stderr}");
        let (_, task) = redacted(&text(&out.stdout));
        let sub: String =
            sqlx::query("SELECT id FROM orbit_subscriptions ORDER BY created_at DESC LIMIT 1")
                .fetch_one(&mut admin)
                .await
                .unwrap()
                .try_get_unchecked(0)
                .unwrap();
        let deliveries = client
            .list_deliveries(
                &SubscriptionId::new(sub).unwrap(),
                &DeliveryFilter::default(),
            )
            .await
            .unwrap();
        let foreign: Vec<_> = deliveries.iter().filter(|d| d.task_id != task).collect();
        assert!(foreign.iter().all(|d| foreign_tasks.contains(&d.task_id)));
        assert!(
            foreign.iter().all(|d| d.state != "ACKED"),
            "a foreign event was ACKed: {foreign:?}"
        );
        if foreign.iter().any(|d| d.attempts > 0) {
            assert!(stderr.contains("classification=foreign"), "{stderr}");
            refused_seen = true;
            break;
        }
    }
    assert!(
        refused_seen,
        "in five runs no foreign event reached the demo before it finished"
    );
}

#[test]
fn the_demo_with_the_platform_down_fails_clearly_within_twenty_seconds() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let dir = std::env::temp_dir().join(format!("demo-down-{}", std::process::id()));
    let creds = dir.join("c.json");
    std::fs::create_dir_all(&dir).unwrap();
    orbit_sdk::Credentials {
        token: orbit_sdk::Token::new("orb_recognisable_token_1234"),
        application: "a".into(),
        namespace: "default".into(),
        environment: "development".into(),
        queue_id: QUEUE.into(),
        scopes: vec![],
    }
    .write(&creds, true)
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rdb = rt.block_on(fixtures::ReceiverDb::new());
    let started = Instant::now();
    let out = run(&mut receiver(
        &["demo"],
        &[
            ("ORBIT_URL", format!("http://127.0.0.1:{port}")),
            ("ORBIT_CREDENTIALS_FILE", creds.display().to_string()),
            (
                "ORBIT_RECEIVER_DSN",
                rdb.db.runtime_url().expose().to_owned(),
            ),
        ],
    ));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with(
            "receiver demo: failed at `create the subscription`: cannot reach the platform"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("orb_recognisable_token_1234"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_refuses_a_subscription_of_another_queue() {
    let orbit = OrbitDev::start(&[]).await;
    orbit.init_receiver().await;
    let other_file = orbit.bootstrap_other("other-queue", true);
    let other = orbit_sdk::Client::new(
        &orbit.url,
        orbit_sdk::Credentials::load(&other_file).unwrap().token,
    )
    .unwrap();
    let sub = other
        .create_subscription("other-queue", &["task.cancelled"])
        .await
        .unwrap();
    let mut env = orbit.receiver_env();
    env[1].1 = other_file.display().to_string();
    env.push(("ORBIT_QUEUE_ID", QUEUE.into()));
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
    let out = run(&mut receiver(&["consume"], &env));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("receiver consume: subscription {} consumes queue other-queue, not the configured queue {QUEUE}: refusing to start", sub.id)),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_refuses_an_apply_budget_that_leaves_the_lease_no_second_for_the_ack() {
    let orbit = OrbitDev::start(&["--lease-seconds", "5"]).await;
    orbit.init_receiver().await;
    let sub = orbit
        .client()
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .unwrap();
    let mut env = orbit.receiver_env();
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
    env.push(("RECEIVER_APPLY_TIMEOUT", "4500ms".into()));
    let out = run(&mut receiver(&["consume"], &env));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).lines().last(),
        Some(format!("receiver consume: RECEIVER_APPLY_TIMEOUT (4500 ms) must be below subscription {}'s lease (5000 ms) by at least 1000 ms for the ACK: refusing to start", sub.id).as_str()),
    );
    // A budget without its unit is a configuration error, found before anything connects.
    env.pop();
    env.push(("RECEIVER_APPLY_TIMEOUT", "4".into()));
    let out = run(&mut receiver(&["consume"], &env));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("RECEIVER_APPLY_TIMEOUT must be a whole number of seconds or milliseconds with its unit, e.g. 5s or 2500ms"),
        "{}",
        text(&out.stderr)
    );
}

fn sigterm(child: &Child) {
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_stopped_during_start_up_exits_cleanly() {
    // A platform address that accepts connections and never answers: consume stays in start-up.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let orbit = OrbitDev::start(&[]).await;
    let mut env: Vec<(&str, String)> = orbit
        .receiver_env()
        .into_iter()
        .filter(|(k, _)| *k != "ORBIT_URL")
        .collect();
    env.push((
        "ORBIT_URL",
        format!("http://{}", silent.local_addr().unwrap()),
    ));
    env.push((
        "ORBIT_SUBSCRIPTION_ID",
        "0123456789abcdef0123456789abcdef".into(),
    ));
    let mut consume = spawn(piped(receiver(&["consume"], &env)));
    // Wait until its request arrives: then it is waiting for the subscription.
    silent.set_nonblocking(true).unwrap();
    let asked = fixtures::poll(Duration::from_secs(10), Duration::from_millis(20), || {
        let seen = match silent.accept() {
            Ok((c, _)) => Some(Ok(c)),
            Err(_) => consume.try_wait().unwrap().map(Err),
        };
        async move { seen }
    })
    .await;
    let accepted = match asked.expect("consume never asked the platform") {
        Ok(c) => c,
        Err(status) => {
            let out = consume.wait_with_output().unwrap();
            panic!("consume exited ({status}): {}", text(&out.stderr));
        }
    };
    sigterm(&consume);
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || consume.wait_with_output().unwrap()),
    )
    .await
    .expect("consume did not exit within 10 s of SIGTERM")
    .unwrap();
    drop(accepted);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    assert!(stderr.contains("stopped during start-up"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_stops_within_ten_seconds_while_a_handler_waits_on_a_row_lock() {
    let orbit = OrbitDev::start(&["--lease-seconds", "2"]).await;
    orbit.init_receiver().await;
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, &["task.cancelled", "task.succeeded"])
        .await
        .unwrap();
    let mut env = orbit.receiver_env();
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));

    // A result body with a recognisable string: it must never be printed.
    let secret_task = client.submit_task(QUEUE, None).await.unwrap();
    let body =
        serde_json::value::RawValue::from_string(r#"{"note":"RESULT-BODY-SECRET-42"}"#.into())
            .unwrap();
    client
        .report_task(&secret_task.id, "SUCCEEDED", Some(&body))
        .await
        .unwrap();

    // Another connection holds the task's view row, uncommitted: the apply must wait.
    let task = client.submit_task(QUEUE, None).await.unwrap();
    let mut blocker = MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    blocker.execute("BEGIN").await.unwrap();
    sqlx::query(
        "INSERT INTO receiver_task_views (consumer_name, queue_id, task_id, task_version, \
         last_event_id, last_state, last_result, applied_events, created_at, updated_at) \
         VALUES (?, ?, ?, 0, '', '', NULL, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .bind("task-result-view")
    .bind(QUEUE)
    .bind(task.id.as_str())
    .execute(&mut blocker)
    .await
    .unwrap();
    client.cancel_task(&task.id).await.unwrap();

    let mut consume = spawn(piped(receiver(&["consume"], &env)));
    // Wait until the handler sits in the view lock.
    let db = orbit.db.receiver_db.clone();
    let admin = sqlx::MySqlPool::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the handler to reach the row lock", || {
        let (admin, db) = (admin.clone(), db.clone());
        async move {
            let waiting: i64 = sqlx::query("SELECT COUNT(*) FROM information_schema.processlist WHERE db = ? AND info LIKE 'INSERT INTO receiver_task_views%'")
                .bind(&db)
                .fetch_one(&admin)
                .await
                .unwrap()
                .try_get(0)
                .unwrap();
            waiting > 0
        }
    })
    .await;
    sigterm(&consume);
    let stopped = Instant::now();
    let status = loop {
        if let Some(s) = consume.try_wait().unwrap() {
            break s;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "consume did not exit within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
    let mut output = String::new();
    consume
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut output)
        .unwrap();
    consume
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut output)
        .unwrap();
    assert!(
        client.get_subscription(&sub.id).await.unwrap().enabled,
        "never paused"
    );
    blocker.execute("ROLLBACK").await.unwrap();

    // A new consumer gets the delivery again after its lease and applies it once.
    let again = spawn(piped(receiver(&["consume"], &env)));
    let cancelled_deliveries = || {
        let (client, sub, task) = (client.clone(), sub.id.clone(), task.id.clone());
        async move {
            let filter = DeliveryFilter {
                task_id: Some(task),
                ..Default::default()
            };
            let d = client.list_deliveries(&sub, &filter).await.unwrap();
            d.into_iter()
                .filter(|d| d.event_type == "task.cancelled")
                .collect::<Vec<_>>()
        }
    };
    eventually(
        Duration::from_secs(20),
        "the delivery to be applied again and ACKED",
        || {
            let listed = cancelled_deliveries();
            async move {
                let c = listed.await;
                !c.is_empty() && c.iter().all(|d| d.state == "ACKED")
            }
        },
    )
    .await;
    let cancelled = cancelled_deliveries().await;
    assert!(cancelled[0].attempts >= 2);
    sigterm(&again);
    let out = tokio::task::spawn_blocking(move || again.wait_with_output().unwrap())
        .await
        .unwrap();
    output.push_str(&text(&out.stdout));
    output.push_str(&text(&out.stderr));
    assert!(out.status.success());
    assert!(output.contains("classification=applied"), "{output}");

    let view = orbit_view(&orbit, &task.id).await;
    assert_eq!(view, ("CANCELLED".to_owned(), 1));
    assert_no_secrets(&orbit, &output, &["RESULT-BODY-SECRET-42"]).await;
}

async fn orbit_view(orbit: &OrbitDev, task: &str) -> (String, u64) {
    let mut admin = MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    let row =
        sqlx::query("SELECT last_state, applied_events FROM receiver_task_views WHERE task_id = ?")
            .bind(task)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    (
        String::from_utf8(row.try_get(0).unwrap()).unwrap(),
        row.try_get(1).unwrap(),
    )
}
