//! `receiver consume`'s metrics and health endpoints, scraped by a real Prometheus text parser
//! (`prometheus-parse`) after a known mix of deliveries, with the receiver's own database
//! killed and restarted in between (R-OPS: metrics per outcome, readiness).

use std::collections::HashMap;
use std::time::Duration;

use fixtures::process::Consumer;
use fixtures::{eventually, http_raw, OwnServerReceiver, QUEUE};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use sqlx::{Connection, MySqlConnection};

/// One scrape: every sample by its name and labels, e.g. `receiver_events_total{outcome=applied}`.
fn scrape(addr: &str) -> HashMap<String, f64> {
    let (status, text) = http_raw(addr, "GET", "/metrics", None, None);
    assert_eq!(status, 200, "{text}");
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let parsed =
        prometheus_parse::Scrape::parse(lines).expect("a valid Prometheus text exposition");
    let mut samples = HashMap::new();
    for s in parsed.samples {
        let mut labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        let key = if labels.is_empty() {
            s.metric.clone()
        } else {
            format!("{}{{{}}}", s.metric, labels.join(","))
        };
        let value = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(h) => {
                samples.insert(
                    format!("{key}_count"),
                    h.iter().map(|b| b.count).fold(0.0, f64::max),
                );
                continue;
            }
            prometheus_parse::Value::Summary(_) => continue,
        };
        samples.insert(key, value);
    }
    samples
}

fn value(samples: &HashMap<String, f64>, key: &str) -> f64 {
    *samples
        .get(key)
        .unwrap_or_else(|| panic!("no sample {key} in {samples:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_counts_every_outcome_and_reports_the_database_and_readiness() {
    // The receiver's database on a server of its own: the test kills it.
    let own = OwnServerReceiver::start(
        &["--enable-fault-api", "--lease-seconds", "30"],
        &["task.cancelled", "task.succeeded"],
    )
    .await;
    let (server, receiver_db, orbit, client, sub) = (
        &own.server,
        &own.receiver_db,
        &own.orbit,
        &own.client,
        &own.sub,
    );
    let mut env = own.env.clone();
    env.push(("RECEIVER_METRICS_LISTEN", "127.0.0.1:0".into()));

    // The platform does not answer yet: the subscription check cannot finish.
    let platform = Pid::from_raw(orbit.pid() as i32);
    kill(platform, Signal::SIGSTOP).unwrap();
    let consumer = Consumer::normal(&env);
    let addr = consumer.metrics_addr().await;
    assert_eq!(http_raw(&addr, "GET", "/healthz", None, None).0, 200);
    let (status, text) = http_raw(&addr, "GET", "/readyz", None, None);
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("subscription"), "{text}");
    kill(platform, Signal::SIGCONT).unwrap();
    eventually(Duration::from_secs(20), "readiness after the check", || {
        let ready = http_raw(&addr, "GET", "/readyz", None, None).0 == 200;
        async move { ready }
    })
    .await;

    // A known mix: three applied, one duplicate, one stale, one rejected.
    let mut applied = Vec::new();
    for _ in 0..3 {
        let task = client.submit_task(QUEUE, None).await.unwrap();
        client.cancel_task(&task.id).await.unwrap();
        applied.push(task.id);
    }
    let lines = |what: &'static str| {
        let n = consumer.output().matches(what).count();
        async move { n }
    };
    eventually(Duration::from_secs(20), "three applied", || {
        let f = lines("classification=applied");
        async move { f.await == 3 }
    })
    .await;
    let delivered = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap();
    orbit.fault(json!({"fault": "duplicate-event", "event_id": delivered[0].event_id}));
    // A view already at version 99 makes this task's cancellation (version 2) stale.
    let stale = client.submit_task(QUEUE, None).await.unwrap();
    let mut admin = MySqlConnection::connect(receiver_db.admin_receiver_url().expose())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO receiver_task_views (consumer_name, queue_id, task_id, task_version, \
         last_event_id, last_state, last_result, applied_events, created_at, updated_at) \
         VALUES ('task-result-view', ?, ?, 99, 'evt-ahead', 'SUCCEEDED', NULL, 1, \
         UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .bind(QUEUE)
    .bind(&stale.id)
    .execute(&mut admin)
    .await
    .unwrap();
    client.cancel_task(&stale.id).await.unwrap();
    // A result the canonical form refuses (a duplicate member name), past the platform's own
    // check of results (a platform that does not validate them).
    let poison = client.submit_task(QUEUE, None).await.unwrap();
    let body = serde_json::value::RawValue::from_string(r#"{"a":1,"a":2}"#.into()).unwrap();
    orbit.fault(serde_json::json!({"fault": "skip-next-result-check"}));
    client
        .report_task(&poison.id, "SUCCEEDED", Some(&body))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "the duplicate, the stale and the rejected",
        || {
            let out = consumer.output();
            let done = out.contains("classification=duplicate")
                && out.contains("classification=stale")
                && out.contains("classification=rejected:duplicate_key");
            async move { done }
        },
    )
    .await;
    eventually(Duration::from_secs(10), "five ACKs answered", || {
        let f = lines("ack answered");
        async move { f.await == 5 }
    })
    .await;

    let m = scrape(&addr);
    assert_eq!(value(&m, "receiver_events_total{outcome=applied}"), 3.0);
    assert_eq!(value(&m, "receiver_events_total{outcome=duplicate}"), 1.0);
    assert_eq!(value(&m, "receiver_events_total{outcome=stale}"), 1.0);
    assert_eq!(
        value(&m, "receiver_events_total{outcome=rejected:duplicate_key}"),
        1.0
    );
    assert_eq!(value(&m, "receiver_apply_seconds_count"), 6.0);
    assert_eq!(value(&m, "receiver_ack_total{result=acked}"), 5.0);
    assert_eq!(value(&m, "receiver_in_flight"), 0.0);
    for reason in [
        "deadlock",
        "lock_wait",
        "certification",
        "commit_error",
        "unavailable",
    ] {
        let key = format!("receiver_apply_retries_total{{reason={reason}}}");
        assert_eq!(value(&m, &key), 0.0, "{key}");
    }
    assert_eq!(value(&m, "receiver_database_up"), 1.0);
    assert_eq!(value(&m, "receiver_deliveries_held"), 0.0);
    let last = value(&m, "receiver_last_applied_timestamp_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        now - last < 60.0 && last <= now + 1.0,
        "last applied at {last}, now {now}"
    );

    // The platform's side of the same mix.
    let p = scrape(&orbit.addr);
    assert_eq!(value(&p, "orbit_deliveries{state=ACKED}"), 5.0);
    assert_eq!(
        value(&p, "orbit_deliveries{state=LEASED}"),
        1.0,
        "the rejected one"
    );
    assert_eq!(value(&p, "orbit_deliveries{state=PENDING}"), 0.0);
    assert_eq!(value(&p, "orbit_acks_total{result=acked}"), 5.0);
    assert_eq!(value(&p, "orbit_leases_expired_total"), 0.0);

    // The database goes away: a failed apply, a failed probe, database_up 0, deliveries held.
    drop(admin);
    assert!(server.kill(), "the server was running");
    let task = client.submit_task(QUEUE, None).await.unwrap();
    client.cancel_task(&task.id).await.unwrap();
    eventually(
        Duration::from_secs(30),
        "database_up 0 and deliveries held",
        || {
            let m = scrape(&addr);
            let down = value(&m, "receiver_database_up") == 0.0
                && value(&m, "receiver_deliveries_held") == 1.0;
            async move { down }
        },
    )
    .await;
    let (status, text) = http_raw(&addr, "GET", "/readyz", None, None);
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("database"), "{text}");
    server.restart().expect("the server starts again");
    eventually(Duration::from_secs(30), "database_up back to 1", || {
        let m = scrape(&addr);
        let up = value(&m, "receiver_database_up") == 1.0
            && value(&m, "receiver_deliveries_held") == 0.0;
        async move { up }
    })
    .await;
    assert_eq!(http_raw(&addr, "GET", "/readyz", None, None).0, 200);
    let output = consumer.stop().await;
    // Labels and lines carry no secret.
    let password = &receiver_db.runtime.password;
    assert!(
        !output.contains(password.expose()),
        "a password was printed"
    );
}
