//! Production transport (R-TLS): both hops over verified TLS against real TLS servers, and
//! each way a TLS setup can be wrong refused at start in one line.
//!
//! The database is a local MariaDB that refuses plain TCP (`require_secure_transport`), with a
//! certificate for `localhost` and `127.0.0.1` from a CA made for the test
//! (`testdb::Server::local_tls`); the receiver's accounts `REQUIRE X509`. The platform is
//! `orbit-dev serve --tls-cert … --tls-key …`, whose certificate the same CA signed; the
//! receiver names that CA in `ORBIT_CA_FILE`.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fixtures::process::Consumer;
use fixtures::{all_acked, bare_command, eventually, receiver_bin, OrbitDev, QUEUE};
use sqlx::Connection;
use testdb::{Provisioned, Server, TLS_NAMES};

fn receiver(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut cmd = bare_command(&receiver_bin());
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("receiver runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `out` failed with `code` and exactly one line on stderr besides the progress log (the
/// demo logs each step it starts), holding every one of `words`; nothing printed holds one
/// of `secrets`. The line.
fn one_line(out: &Output, code: i32, words: &[&str], secrets: &[&str]) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    let logged = |l: &&str| l.len() > 20 && l.as_bytes()[10] == b'T' && l.contains("Z  INFO ");
    let lines: Vec<&str> = err.lines().filter(|l| !logged(l)).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    for w in words {
        assert!(lines[0].contains(w), "{w:?} missing from: {err}");
    }
    for s in secrets {
        assert!(!err.contains(s), "a secret was printed: {err}");
        assert!(!text(&out.stdout).contains(s), "a secret was printed");
    }
    lines[0].to_owned()
}

/// A TLS server whose receiver accounts need a client certificate, with the receiver's tables
/// made over TLS by `receiver init`.
async fn tls_database() -> (Server, Provisioned) {
    let server = Server::local_tls(&TLS_NAMES).unwrap_or_else(|e| panic!("TLS server: {e}"));
    let db = server.provision().await.expect("provisioned");
    db.require_x509().await.expect("REQUIRE X509");
    (server, db)
}

/// [`tls_database`] with the receiver's tables made by `receiver init` over TLS and the
/// runtime grants, and an `orbit-dev` serving HTTPS and WSS with `args`, its own database on
/// the same TLS server and its certificate signed by the same CA.
async fn tls_platform(args: &[&str]) -> (Server, Provisioned, OrbitDev) {
    let (server, db) = tls_database().await;
    let init = receiver(&["init"], &dsn_env(db.init_url().expose()));
    assert!(init.status.success(), "{}", text(&init.stderr));
    db.grant_runtime().await.expect("grants");
    let platform = server.provision().await.expect("platform databases");
    let orbit = OrbitDev::start_tls(platform, server.pki().expect("a CA"), args);
    (server, db, orbit)
}

fn dsn_env(url: &str) -> Vec<(&'static str, String)> {
    vec![("ORBIT_RECEIVER_DSN", url.to_owned())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_hop_is_verified_and_each_tls_mistake_is_one_line() {
    let (server, db) = tls_database().await;
    let pki = server.pki().expect("a TLS server has a CA");
    let good = db.init_url().expose().to_owned();
    let password = db.init.password.expose().to_owned();
    let ca = pki.ca.display().to_string();

    // Verified against the run's CA, by address and by name, with the client certificate.
    let init = receiver(&["init"], &dsn_env(&good));
    assert!(init.status.success(), "{}", text(&init.stderr));
    let by_name = receiver(&["init"], &dsn_env(&good.replace("127.0.0.1", "localhost")));
    one_line(&by_name, 1, &["already exists"], &[&password]);

    // A CA that did not sign the server.
    let other = good.replace(&ca, &pki.other_ca.display().to_string());
    one_line(
        &receiver(&["init"], &dsn_env(&other)),
        1,
        &[
            "TLS: the server's certificate is not signed by a CA this client trusts",
            "ssl-ca",
        ],
        &[&password],
    );
    // Plain TCP to a server that requires TLS.
    let plain = good.replace("VERIFY_IDENTITY", "DISABLED");
    one_line(
        &receiver(&["init"], &dsn_env(&plain)),
        1,
        &["access denied", "ssl-mode=DISABLED", "requires TLS"],
        &[&password],
    );
    // No client certificate for an account that requires one.
    let no_cert = good
        .split("&ssl-cert=")
        .next()
        .expect("the URL has a query")
        .to_owned();
    one_line(
        &receiver(&["init"], &dsn_env(&no_cert)),
        1,
        &["access denied", "client certificate", "ssl-cert"],
        &[&password],
    );
    // A CA file that is not there: a configuration error, before any connection.
    let missing = good.replace(&ca, "/nonexistent/ca.pem");
    one_line(
        &receiver(&["init"], &dsn_env(&missing)),
        2,
        &[
            "ORBIT_RECEIVER_DSN",
            "ssl-ca=/nonexistent/ca.pem",
            "cannot be read",
        ],
        &[&password],
    );

    // A certificate for another name: refused by name, whatever the CA.
    let misnamed = Server::local_tls(&["db.internal.test"]).expect("TLS server");
    let other_db = misnamed.provision().await.expect("provisioned");
    let wrong_name = other_db.init_url().expose().to_owned();
    for mode in ["VERIFY_IDENTITY", "VERIFY_CA"] {
        one_line(
            &receiver(
                &["init"],
                &dsn_env(&wrong_name.replace("VERIFY_IDENTITY", mode)),
            ),
            1,
            &["TLS: the server's certificate does not name the host connected to"],
            &[other_db.init.password.expose()],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_refuses_an_untrusted_database_at_start_instead_of_waiting_for_it() {
    let (server, db, orbit) = tls_platform(&[]).await;
    let pki = server.pki().expect("a CA");
    let sub = orbit
        .client()
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .expect("subscription");
    let untrusted = db.runtime_url().expose().replace(
        &pki.ca.display().to_string(),
        &pki.other_ca.display().to_string(),
    );
    let mut env = orbit.receiver_env_on(&untrusted.into());
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
    // A receiver that took the TLS failure for an outage would wait here for good.
    let mut cmd = bare_command(&receiver_bin());
    cmd.arg("consume")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = fixtures::spawn(cmd);
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "consume still ran after 15 s on a database it will never trust: {}",
                text(&out.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = child.wait_with_output().expect("output");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("TLS: the server's certificate is not signed by a CA this client trusts"),
        "{err}"
    );
    assert!(!err.contains("waiting for it"), "{err}");
    assert!(!err.contains(db.runtime.password.expose()), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_and_consume_run_end_to_end_with_both_hops_on_tls() {
    let (_server, db, orbit) = tls_platform(&["--lease-seconds", "10"]).await;
    assert!(orbit.url.starts_with("https://"), "{}", orbit.url);
    let env = orbit.receiver_env_on(&db.runtime_url());

    let demo = receiver(&["demo"], &env);
    let demo_out = format!("{}{}", text(&demo.stdout), text(&demo.stderr));
    assert!(demo.status.success(), "{demo_out}");
    assert!(demo_out.contains("ack_confirmed=1"), "{demo_out}");

    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .expect("subscription");
    let mut env = env;
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
    let consumer = Consumer::normal(&env);
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(fixtures::cancelled_task(&client).await);
    }
    all_acked(&client, &sub.id, Some(20), Duration::from_secs(60)).await;
    let output = consumer.stop().await;
    assert!(output.contains("stream connected"), "{output}");
    assert!(!output.contains(orbit.credentials().token.expose()));
    assert!(!output.contains(db.runtime.password.expose()));

    // Every event applied once: one inbox row each, each view at version 2 (cancelled).
    let mut admin = sqlx::MySqlConnection::connect(db.admin_receiver_url().expose())
        .await
        .expect("admin connects");
    let (rows, applied): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), CAST(COALESCE(SUM(applied), 0) AS SIGNED) FROM receiver_inbox WHERE consumer_name = 'task-result-view'",
    )
    .fetch_one(&mut admin)
    .await
    .expect("inbox counts");
    // The demo's own event went to its own subscription: 21 events in all.
    assert_eq!((rows, applied), (21, 21));
    for task in &tasks {
        let version: Option<u64> =
            sqlx::query_scalar("SELECT task_version FROM receiver_task_views WHERE task_id = ?")
                .bind(task)
                .fetch_optional(&mut admin)
                .await
                .expect("view reads");
        assert_eq!(version, Some(2), "task {task}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_platform_the_sdk_does_not_trust_is_one_line_naming_orbit_url() {
    let (server, db, orbit) = tls_platform(&[]).await;
    let pki = server.pki().expect("a CA");
    let token = orbit.credentials().token.expose().to_owned();
    let base = orbit.receiver_env_on(&db.runtime_url());
    let with = |ca: Option<String>| -> Vec<(&'static str, String)> {
        let mut env: Vec<_> = base
            .iter()
            .filter(|(k, _)| *k != "ORBIT_CA_FILE")
            .cloned()
            .collect();
        if let Some(ca) = ca {
            env.push(("ORBIT_CA_FILE", ca));
        }
        env
    };
    // The system's roots alone, and the system's plus an unrelated CA: neither signed it.
    for env in [with(None), with(Some(pki.other_ca.display().to_string()))] {
        one_line(
            &receiver(&["demo"], &env),
            1,
            &[
                &format!("ORBIT_URL {}", orbit.url),
                "TLS: the server's certificate is not signed by a CA this client trusts",
                "ORBIT_CA_FILE",
            ],
            &[&token],
        );
    }
    // A CA file that is not there, or holds no certificate: configuration errors.
    one_line(
        &receiver(&["demo"], &with(Some("/nonexistent/ca.pem".into()))),
        2,
        &["ORBIT_CA_FILE", "/nonexistent/ca.pem"],
        &[&token],
    );
    one_line(
        &receiver(
            &["demo"],
            &with(Some(orbit.credentials_file.display().to_string())),
        ),
        2,
        &["ORBIT_CA_FILE", "holds no PEM certificate"],
        &[&token],
    );
    // Plain HTTP to the TLS port is not a fallback: the URL's scheme is what is used.
    let plain: Vec<_> = with(Some(pki.ca.display().to_string()))
        .into_iter()
        .map(|(k, v)| match k {
            "ORBIT_URL" => (k, v.replace("https://", "http://")),
            _ => (k, v),
        })
        .collect();
    let out = receiver(&["demo"], &plain);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains(&token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_platform_message_past_the_largest_delivery_closes_the_stream_in_one_line() {
    let (orbit, client, sub, env) = fixtures::subscribed_receiver(
        &["--enable-fault-api", "--lease-seconds", "2"],
        &["task.cancelled"],
    )
    .await;
    let consumer = Consumer::normal(&env);
    orbit.fault(serde_json::json!({"fault": "oversize-next-delivery"}));
    let task = fixtures::cancelled_task(&client).await;
    let limit = format!("more than {} bytes", orbit_sdk::MAX_MESSAGE_BYTES);
    eventually(
        Duration::from_secs(20),
        "the oversized message refused",
        || {
            let seen = consumer.output().contains(&limit);
            async move { seen }
        },
    )
    .await;
    // The delivery comes again, at its normal size, after its lease ran out: applied once.
    all_acked(&client, &sub.id, Some(1), Duration::from_secs(30)).await;
    let output = consumer.stop().await;
    let refusals: Vec<&str> = output.lines().filter(|l| l.contains(&limit)).collect();
    assert_eq!(refusals.len(), 1, "{output}");
    assert!(
        refusals[0].contains("stream disconnected"),
        "{}",
        refusals[0]
    );
    assert_eq!(orbit.view(&task).await.map(|v| v.0), Some(2));
    let deliveries = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .expect("deliveries");
    assert_eq!(deliveries[0].attempts, 2, "the oversized attempt, then one");
}

#[test]
fn orbit_dev_refuses_a_certificate_it_cannot_load_in_one_line() {
    let dir = testdb::scratch_dir().unwrap().join("orbit-dev-bad-tls");
    std::fs::create_dir_all(&dir).unwrap();
    let not_pem = dir.join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    for (args, words) in [
        (
            vec!["--tls-cert", not_pem.to_str().unwrap()],
            vec!["--tls-cert and --tls-key go together"],
        ),
        (
            vec![
                "--tls-cert",
                not_pem.to_str().unwrap(),
                "--tls-key",
                not_pem.to_str().unwrap(),
            ],
            vec!["--tls-cert", "holds no PEM certificate"],
        ),
        (
            vec![
                "--tls-cert",
                "/nonexistent/cert.pem",
                "--tls-key",
                "/nonexistent/key.pem",
            ],
            vec!["--tls-cert /nonexistent/cert.pem"],
        ),
    ] {
        let out = Command::new(fixtures::workspace_bin("orbit-dev"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(&args)
            .env("ORBIT_MYSQL_DSN", "mysql://u:p@127.0.0.1:1/orbit")
            .stdin(Stdio::null())
            .output()
            .expect("orbit-dev runs");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        for w in words {
            assert!(err.contains(w), "{w:?} missing from {err}");
        }
    }
}
