//! Real fault regressions (R-FAULT-4 and the seed's fault table): real `receiver consume`
//! processes, in the fault build (`receiver-faults`, barriers armed) where a test must stop one
//! at an exact point, killed with real signals; a real `orbit-dev` with real leases; real
//! MySQL servers, one of them stopped and started again.

use std::time::{Duration, Instant};

use conformance::process::{receiver_faults_bin, Consumer};
use conformance::{eventually, receiver_bin, OrbitDev, QUEUE};
use orbit_sdk::wire::{DeliveryInfo, Subscription};
use orbit_sdk::Client;
use serde_json::json;
use sqlx::{Connection, Executor, MySqlConnection};

/// A platform started with `args`, the receiver's tables, a subscription to `types`, and the
/// environment `receiver consume` needs for it.
async fn consuming(
    args: &[&str],
    types: &[&str],
) -> (OrbitDev, Client, Subscription, Vec<(&'static str, String)>) {
    let orbit = OrbitDev::start(args).await;
    orbit.init_receiver().await;
    let client = orbit.client();
    let sub = client.create_subscription(QUEUE, types).await.unwrap();
    let mut env = orbit.receiver_env();
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.clone()));
    (orbit, client, sub, env)
}

/// Submits and cancels a task: one `task.cancelled` event (version 2). The task id.
async fn cancelled_task(client: &Client) -> String {
    let task = client.submit_task(QUEUE, None).await.unwrap();
    client.cancel_task(&task.id).await.unwrap();
    task.id
}

/// The only delivery of `event_id`.
async fn only_delivery(orbit: &OrbitDev, sub: &str, event_id: &str) -> DeliveryInfo {
    let mut d = orbit.deliveries_of(sub, event_id).await;
    assert_eq!(d.len(), 1, "one delivery of {event_id}: {d:?}");
    d.remove(0)
}

/// Waits until delivery `id` is in `state`; the delivery.
async fn delivery_reaches(
    client: &Client,
    id: &str,
    state: &str,
    within: Duration,
) -> DeliveryInfo {
    let deadline = Instant::now() + within;
    loop {
        let d = client.get_delivery(id).await.unwrap();
        if d.state == state {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "delivery {id} did not become {state} within {within:?}: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lines of `output` that are this event's delivery log lines.
fn delivery_lines<'a>(output: &'a str, event_id: &str) -> Vec<&'a str> {
    output
        .lines()
        .filter(|l| l.contains("classification=") && l.contains(event_id))
        .collect()
}

#[test]
fn the_normal_receiver_binary_has_no_barrier_code_flag_or_variable() {
    // The same strings in the fault build show that the search can find them.
    let needles: &[&[u8]] = &[
        b"RECEIVER_FAULT_BARRIERS",
        b"RECEIVER_FAULT_REPORT",
        b"barrier=",
        b"after_ack_sent",
        b"5fault7barrier",
    ];
    let normal = std::fs::read(receiver_bin()).unwrap();
    let faulty = std::fs::read(receiver_faults_bin()).unwrap();
    let contains = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
    for needle in needles {
        let n = String::from_utf8_lossy(needle);
        assert!(
            contains(&faulty, needle),
            "the fault build should contain {n:?}"
        );
        assert!(
            !contains(&normal, needle),
            "the normal receiver binary contains {n:?}"
        );
    }
    // And it has no command, flag or variable that would turn barriers on.
    let help = std::process::Command::new(receiver_bin())
        .args(["consume", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(!help.to_lowercase().contains("fault"), "{help}");
}

/// R-FAULT-4, exactly: the business commit is proved from the database, the platform shows the
/// delivery LEASED, attempt 1, not ACKed; SIGKILL; after the real 30-second lease a new
/// process dedups and ACKs the same delivery (attempts 2), and the view advanced once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r_fault_4_sigkill_after_commit_then_a_new_process_dedups_after_the_30s_lease() {
    let (orbit, client, sub, env) = consuming(&[], &["task.cancelled"]).await;
    let task = cancelled_task(&client).await;

    let mut first = Consumer::faulty(&env, "after_commit");
    let hit = first
        .wait_barrier("after_commit", Duration::from_secs(20))
        .await;
    let event_id = hit.key.clone();

    // The business transaction is committed: another connection sees it.
    assert_eq!(
        orbit.view(&task).await,
        Some((2, "CANCELLED".to_owned(), 1))
    );
    assert_eq!(orbit.inbox_rows(&event_id).await, 1);
    // The platform still has the delivery LEASED, attempt 1, not ACKed.
    let leased = only_delivery(&orbit, &sub.id, &event_id).await;
    assert_eq!(
        (leased.state.as_str(), leased.attempts),
        ("LEASED", 1),
        "{leased:?}"
    );
    let output = first.sigkill();
    assert!(
        delivery_lines(&output, &event_id)
            .iter()
            .any(|l| l.contains("classification=applied")),
        "{output}"
    );
    let still = client.get_delivery(&leased.id).await.unwrap();
    assert_eq!((still.state.as_str(), still.attempts), ("LEASED", 1));

    // A normal process; the platform leases the delivery again only after the 30 s lease.
    let second = Consumer::normal(&env);
    let acked = delivery_reaches(&client, &leased.id, "ACKED", Duration::from_secs(60)).await;
    assert_eq!(acked.attempts, 2, "{acked:?}");
    assert_eq!(
        orbit.view(&task).await,
        Some((2, "CANCELLED".to_owned(), 1)),
        "applied_events is still 1"
    );
    assert_eq!(orbit.inbox_rows(&event_id).await, 1);
    let output = second.stop().await;
    let lines = delivery_lines(&output, &event_id);
    assert!(
        lines.len() == 1
            && lines[0].contains("classification=duplicate")
            && lines[0].contains("attempt=2"),
        "{output}"
    );
}

/// The platform records the ACK but its reply is lost with the stream: the same process
/// re-reports with the original proof and hears `already_acked`; attempts stay 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_ack_reply_is_re_reported_with_the_original_proof() {
    let (orbit, client, sub, env) = consuming(&["--enable-fault-api"], &["task.cancelled"]).await;
    orbit.fault(json!({"fault": "drop-next-ack-reply"}));
    let task = cancelled_task(&client).await;
    let consumer = Consumer::normal(&env);
    eventually(
        Duration::from_secs(20),
        "the re-reported ACK's answer",
        || {
            let answered = consumer
                .output()
                .lines()
                .any(|l| l.contains("ack answered") && l.contains("AlreadyAcked"));
            async move { answered }
        },
    )
    .await;
    let output = consumer.stop().await;
    assert!(
        output.contains("stream disconnected; reconnecting"),
        "{output}"
    );
    let all = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].state.as_str(), all[0].attempts), ("ACKED", 1));
    assert_eq!(
        orbit.view(&task).await,
        Some((2, "CANCELLED".to_owned(), 1))
    );
    assert_eq!(orbit.inbox_rows(&all[0].event_id).await, 1);
}

/// The ACK is lost on the way (never recorded) and the process is killed right after sending
/// it, before it could re-report: after the lease a new process dedups and ACKs (attempts 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_ack_and_a_killed_process_end_in_a_dedup_after_the_lease() {
    let (orbit, client, sub, env) = consuming(
        &["--enable-fault-api", "--lease-seconds", "3"],
        &["task.cancelled"],
    )
    .await;
    orbit.fault(json!({"fault": "drop-next-ack"}));
    let task = cancelled_task(&client).await;
    let mut first = Consumer::faulty(&env, "after_ack_sent");
    let hit = first
        .wait_barrier("after_ack_sent", Duration::from_secs(20))
        .await;
    let delivery = client.get_delivery(&hit.key).await.unwrap();
    first.sigkill();
    assert_eq!(
        orbit.view(&task).await,
        Some((2, "CANCELLED".to_owned(), 1))
    );
    // The ACK never landed: the lease is still out, attempt 1.
    let still = client.get_delivery(&delivery.id).await.unwrap();
    assert_eq!(
        (still.state.as_str(), still.attempts),
        ("LEASED", 1),
        "{still:?}"
    );

    let second = Consumer::normal(&env);
    let acked = delivery_reaches(&client, &delivery.id, "ACKED", Duration::from_secs(20)).await;
    assert_eq!(acked.attempts, 2);
    let output = second.stop().await;
    assert!(
        delivery_lines(&output, &delivery.event_id)
            .iter()
            .all(|l| l.contains("classification=duplicate")),
        "{output}"
    );
    assert_eq!(
        orbit.view(&task).await,
        Some((2, "CANCELLED".to_owned(), 1))
    );
    assert_eq!(orbit.inbox_rows(&delivery.event_id).await, 1);
    assert_eq!(
        orbit.deliveries_of(&sub.id, &delivery.event_id).await.len(),
        1
    );
}

/// An event the receiver's database refuses (here: a trigger standing for a broken business
/// rule on one task) is never ACKed; when its budget is spent it is EXPIRED and keeps its place
/// in the window, so later deliveries wait; once the cause is fixed, budget added through the
/// management API delivers it again to the same consumer, and it is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_event_expires_in_the_window_and_is_applied_once_after_the_fix_and_more_budget() {
    let (orbit, client, sub, env) = consuming(
        &[
            "--lease-seconds",
            "1",
            "--max-attempts",
            "2",
            "--window",
            "1",
        ],
        &["task.cancelled"],
    )
    .await;
    let poison = client.submit_task(QUEUE, None).await.unwrap().id;
    let mut admin = MySqlConnection::connect(&orbit.db.admin_receiver_url())
        .await
        .unwrap();
    admin
        .execute(
            format!(
                "CREATE TRIGGER refuse_poison BEFORE INSERT ON receiver_task_views FOR EACH ROW \
                 IF NEW.task_id = '{poison}' THEN \
                 SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'business rule refuses this task'; \
                 END IF"
            )
            .as_str(),
        )
        .await
        .unwrap();
    client.cancel_task(&poison).await.unwrap();
    let consumer = Consumer::normal(&env);

    let d = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap()
        .remove(0);
    let expired = delivery_reaches(&client, &d.id, "EXPIRED", Duration::from_secs(20)).await;
    assert_eq!((expired.attempts, expired.budget), (2, 2));
    assert_eq!(orbit.view(&poison).await, None, "rolled back whole");
    assert_eq!(orbit.inbox_rows(&d.event_id).await, 0, "rolled back whole");
    let refused = delivery_lines(&consumer.output(), &d.event_id)
        .into_iter()
        .filter(|l| l.contains("classification=storage_error"))
        .count();
    assert_eq!(refused, 2, "{}", consumer.output());

    // The EXPIRED delivery holds the window of 1: a good event waits behind it.
    let good = cancelled_task(&client).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = client
        .list_deliveries(
            &sub.id,
            &orbit_sdk::DeliveryFilter {
                task_id: Some(good.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (waiting.state.as_str(), waiting.attempts),
        ("PENDING", 0),
        "{waiting:?}"
    );

    // Fix the cause, add budget: the same consumer applies it once, then the good one flows.
    admin.execute("DROP TRIGGER refuse_poison").await.unwrap();
    client.add_budget(&d.id, 1).await.unwrap();
    let acked = delivery_reaches(&client, &d.id, "ACKED", Duration::from_secs(20)).await;
    assert_eq!((acked.attempts, acked.budget), (3, 3));
    delivery_reaches(&client, &waiting.id, "ACKED", Duration::from_secs(20)).await;
    let output = consumer.stop().await;
    assert_eq!(
        orbit.view(&poison).await,
        Some((2, "CANCELLED".to_owned(), 1))
    );
    assert_eq!(orbit.inbox_rows(&d.event_id).await, 1);
    assert_eq!(
        orbit.view(&good).await,
        Some((2, "CANCELLED".to_owned(), 1))
    );
    let applied: Vec<_> = delivery_lines(&output, &d.event_id)
        .into_iter()
        .filter(|l| l.contains("classification=applied"))
        .collect();
    assert_eq!(applied.len(), 1, "{output}");
    assert!(applied[0].contains("attempt=3"), "{output}");
}

/// The receiver's MySQL server is killed while consume runs: nothing is ACKed, the log says
/// storage_error without any DSN, the process keeps running; when the server is back, every
/// redelivered event is applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_loss_acks_nothing_and_every_event_is_applied_once_when_it_is_back() {
    // The receiver's database on a server of its own, so that stopping it harms no other test.
    let server = testdb::Server::local().expect("a local server");
    let receiver_db = server.provision().await.expect("provisioned");
    let init = receiver::config::Dsn::parse(&receiver_db.init_url()).unwrap();
    receiver::schema::init(&init).await.unwrap();
    receiver_db.grant_runtime().await.unwrap();

    let orbit = OrbitDev::start(&["--lease-seconds", "2", "--max-attempts", "100"]).await;
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .unwrap();
    let mut env: Vec<(&str, String)> = orbit
        .receiver_env()
        .into_iter()
        .filter(|(k, _)| *k != "ORBIT_RECEIVER_DSN")
        .collect();
    let dsn = receiver_db.runtime_url();
    env.push(("ORBIT_RECEIVER_DSN", dsn.clone()));
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.clone()));
    let mut consumer = Consumer::normal(&env);

    let before = cancelled_task(&client).await;
    eventually(Duration::from_secs(20), "the first event's ACK", || {
        let client = client.clone();
        let sub = sub.id.clone();
        async move {
            let d = client
                .list_deliveries(&sub, &Default::default())
                .await
                .unwrap();
            d.iter().all(|d| d.state == "ACKED")
        }
    })
    .await;

    assert!(server.kill(), "the server was running");
    let lost = [cancelled_task(&client).await, cancelled_task(&client).await];
    eventually(
        Duration::from_secs(30),
        "storage_error lines for both events",
        || {
            let n = consumer
                .output()
                .lines()
                .filter(|l| l.contains("classification=storage_error"))
                .count();
            async move { n >= 2 }
        },
    )
    .await;
    assert!(consumer.try_wait().is_none(), "consume keeps running");
    let during = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap();
    assert_eq!(
        during.iter().filter(|d| d.state == "ACKED").count(),
        1,
        "nothing is ACKed while the database is gone: {during:?}"
    );

    server.restart().expect("the server starts again");
    eventually(Duration::from_secs(40), "every delivery ACKED", || {
        let client = client.clone();
        let sub = sub.id.clone();
        async move {
            let d = client
                .list_deliveries(&sub, &Default::default())
                .await
                .unwrap();
            d.len() == 3 && d.iter().all(|d| d.state == "ACKED")
        }
    })
    .await;
    let output = consumer.stop().await;

    let mut admin = MySqlConnection::connect(&receiver_db.admin_receiver_url())
        .await
        .unwrap();
    for task in lost.iter().chain([&before]) {
        let (version, applied): (u64, u64) = sqlx::query_as(
            "SELECT task_version, applied_events FROM receiver_task_views WHERE task_id = ?",
        )
        .bind(task)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        assert_eq!((version, applied), (2, 1), "task {task}");
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM receiver_inbox")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(rows, 3);
    let applied_lines = output
        .lines()
        .filter(|l| l.contains("classification=applied"))
        .count();
    assert_eq!(applied_lines, 3, "{output}");
    // The storage errors name the failure, never where the database is or how to log in.
    let password = &receiver_db.runtime.password;
    assert!(!output.contains("mysql://"), "{output}");
    assert!(
        !output.contains(password.as_str()),
        "a password was printed"
    );
    assert!(!output.contains(&dsn), "the DSN was printed");
}
