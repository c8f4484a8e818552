//! The receiver's database goes away while deliveries are queued (R-STORE-9): `receiver
//! consume` holds new deliveries instead of burning their attempts, says so once, and takes
//! them again when the database is back. Real processes, a real orbit-dev with real leases,
//! a real MySQL server of the test's own, stopped with SIGSTOP or killed and restarted.

use std::time::Duration;

use fixtures::process::Consumer;
use fixtures::{all_acked, cancelled_task, eventually, OwnServerReceiver};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::{Connection, MySqlConnection};

/// Deliveries queued while the database is gone.
const QUEUED: usize = 50;
/// How long the database stays gone.
const OUTAGE: Duration = Duration::from_secs(20);

/// How the database goes away.
#[derive(Clone, Copy, Debug)]
enum Outage {
    /// SIGSTOP, then SIGCONT: connections hang, nothing is refused.
    Stopped,
    /// SIGKILL, then a new server on the same datadir and port: connections are refused.
    Restarted,
}

/// Sends SIGCONT when dropped, so that a failing test never leaves a stopped server behind
/// (a stopped process ignores the SIGTERM its cleanup sends first).
struct ContinueOnDrop(Pid);

impl Drop for ContinueOnDrop {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

async fn run(outage: Outage, concurrency: usize) {
    // Leases longer than the 5 s budget, so an in-flight delivery fails before its lease ends.
    let own = OwnServerReceiver::start(
        &["--lease-seconds", "10", "--max-attempts", "100"],
        &["task.cancelled"],
    )
    .await;
    let (server, receiver_db, client, sub) = (&own.server, &own.receiver_db, &own.client, &own.sub);
    let mut env = own.env.clone();
    env.push(("RECEIVER_CONCURRENCY", concurrency.to_string()));
    let consumer = Consumer::normal(&env);

    // The consumer is up and applying.
    let mut tasks = vec![cancelled_task(client).await];
    eventually(Duration::from_secs(20), "the first event applied", || {
        let n = consumer.output().matches("classification=applied").count();
        async move { n == 1 }
    })
    .await;

    let pid = Pid::from_raw(server.pid().expect("a local server runs") as i32);
    let _resume = matches!(outage, Outage::Stopped).then_some(ContinueOnDrop(pid));
    match outage {
        Outage::Stopped => kill(pid, Signal::SIGSTOP).unwrap(),
        Outage::Restarted => assert!(server.kill(), "the server was running"),
    }
    let gone = std::time::Instant::now();
    for _ in 0..QUEUED {
        tasks.push(cancelled_task(client).await);
    }
    eventually(OUTAGE, "the consumer to say it holds deliveries", || {
        let said = consumer
            .output()
            .contains("database unavailable: holding deliveries (");
        async move { said }
    })
    .await;
    tokio::time::sleep(OUTAGE.saturating_sub(gone.elapsed())).await;
    match outage {
        Outage::Stopped => kill(pid, Signal::SIGCONT).unwrap(),
        Outage::Restarted => server.restart().expect("the server starts again"),
    }

    all_acked(client, &sub.id, Some(QUEUED + 1), Duration::from_secs(60)).await;
    let output = consumer.stop().await;
    assert!(
        output.contains("database back after "),
        "no line for the end of the outage: {output}"
    );
    assert_eq!(
        output
            .matches("database unavailable: holding deliveries")
            .count(),
        1,
        "one line for the start: {output}"
    );

    // Only what was running when the database went away spent a second attempt: what was
    // leased ahead was released, unattempted.
    let deliveries = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap();
    let spent: Vec<_> = deliveries.iter().filter(|d| d.attempts > 1).collect();
    assert!(
        spent.len() <= concurrency,
        "{} deliveries spent more than one attempt ({outage:?}, concurrency {concurrency}): {spent:?}",
        spent.len()
    );

    // Nothing lost, nothing doubled.
    let mut admin = MySqlConnection::connect(receiver_db.admin_receiver_url().expose())
        .await
        .unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM receiver_inbox")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(rows, tasks.len() as i64);
    let doubled: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM receiver_task_views WHERE applied_events <> 1 OR task_version <> 2",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(doubled, 0);
    let views: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM receiver_task_views")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(views, tasks.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_holds_queued_deliveries_without_spending_their_attempts() {
    run(Outage::Stopped, receiver::config::DEFAULT_CONCURRENCY).await;
}

/// The same at a concurrency of 16, whose 16 deliveries leased ahead are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_concurrency_16_a_stopped_database_spends_no_attempt_of_what_was_leased_ahead() {
    run(Outage::Stopped, 16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_database_holds_queued_deliveries_without_spending_their_attempts() {
    run(Outage::Restarted, receiver::config::DEFAULT_CONCURRENCY).await;
}

/// The longest `/readyz` may trail the database (R-OPS-3).
const READINESS: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_a_stopped_database_within_two_seconds_whatever_applies_do() {
    let own = OwnServerReceiver::start(&["--lease-seconds", "10"], &["task.cancelled"]).await;
    let (server, client) = (&own.server, &own.client);
    let mut env = own.env.clone();
    env.push(("RECEIVER_METRICS_LISTEN", "127.0.0.1:0".into()));
    let consumer = Consumer::normal(&env);
    let addr = consumer.metrics_addr().await;
    Consumer::readiness_becomes(&addr, true, Duration::from_secs(20)).await;

    // Deliveries arrive as the server stops: some applies are in flight, and will wait out
    // their whole budget; readiness must not wait for them.
    for _ in 0..4 {
        cancelled_task(client).await;
    }
    let pid = Pid::from_raw(server.pid().expect("a local server runs") as i32);
    let resume = ContinueOnDrop(pid);
    kill(pid, Signal::SIGSTOP).unwrap();
    let down = Consumer::readiness_becomes(&addr, false, Duration::from_secs(10)).await;
    let scraped = fixtures::http_raw(&addr, "GET", "/metrics", None, None).1;
    assert!(
        scraped.lines().any(|l| l == "receiver_database_up 0"),
        "{scraped}"
    );
    assert!(
        scraped.lines().any(|l| l == "receiver_deliveries_held 1"),
        "{scraped}"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    drop(resume);
    let up = Consumer::readiness_becomes(&addr, true, Duration::from_secs(10)).await;
    eprintln!(
        "outage: not ready {:.2} s after SIGSTOP, ready {:.2} s after SIGCONT",
        down.as_secs_f64(),
        up.as_secs_f64()
    );
    assert!(down <= READINESS, "not ready only {down:?} after SIGSTOP");
    assert!(up <= READINESS, "ready only {up:?} after SIGCONT");

    // The outage line counts from the first failure, which readiness saw within 2 s of the
    // stop: so from at least 2 s of the 4 s, to at most the 4 s plus the 2 s it took back.
    eventually(Duration::from_secs(10), "the outage line", || {
        let seen = consumer.output().contains("database back after ");
        async move { seen }
    })
    .await;
    let output = consumer.stop().await;
    let seconds: u64 = output
        .split("database back after ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no duration in the outage line: {output}"));
    assert!(
        (2..=6).contains(&seconds),
        "back after {seconds} s: {output}"
    );
    assert_eq!(
        output
            .matches("database unavailable: holding deliveries")
            .count(),
        1,
        "{output}"
    );
}

/// Sets `@@global.read_only` on a server of the test's own, as a failover does to a demoted
/// primary. The runtime account has no privilege to write through it; the admin does.
async fn set_read_only(server: &testdb::Server, on: bool) {
    let mut admin = MySqlConnection::connect(server.admin_url().expose())
        .await
        .expect("admin connects");
    sqlx::query(if on {
        "SET GLOBAL read_only = 1"
    } else {
        "SET GLOBAL read_only = 0"
    })
    .execute(&mut admin)
    .await
    .expect("read_only set");
}

/// How long the database stays read-only: two leases.
const READ_ONLY: Duration = Duration::from_secs(16);

/// A demoted primary (R-DIST-4): the server answers every read and refuses every write with
/// 1290. Before, each refusal was a failed apply that spent an attempt: with 5 s leases and a
/// budget of 3, 20 deliveries of 20 EXPIRED in 25 s and `/readyz` stayed 200. Now the probe
/// sees the server read-only and holds, `/readyz` answers 503, and what was in flight is
/// handed back unattempted: every delivery ends ACKED on its first counted attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_holds_deliveries_and_costs_none_an_attempt() {
    // 8 s leases: an apply in flight runs its 5 s budget and is handed back with 3 s to spare
    // on a loaded machine. Without the hand-back each would spend a second attempt.
    let own = OwnServerReceiver::start(
        &["--lease-seconds", "8", "--max-attempts", "3"],
        &["task.cancelled"],
    )
    .await;
    let (server, client, sub) = (&own.server, &own.client, &own.sub);
    let mut env = own.env.clone();
    env.push(("RECEIVER_METRICS_LISTEN", "127.0.0.1:0".into()));
    let consumer = Consumer::normal(&env);
    let addr = consumer.metrics_addr().await;
    cancelled_task(client).await;
    all_acked(client, &sub.id, Some(1), Duration::from_secs(20)).await;

    set_read_only(server, true).await;
    let went = std::time::Instant::now();
    // Some arrive before the probe has seen it: their applies meet 1290 in flight.
    let mut tasks = Vec::new();
    for _ in 0..QUEUED_READ_ONLY {
        tasks.push(cancelled_task(client).await);
    }
    let down = Consumer::readiness_becomes(&addr, false, Duration::from_secs(10)).await;
    assert!(
        down <= READINESS,
        "not ready only {down:?} after read_only=1"
    );
    let scraped = fixtures::http_raw(&addr, "GET", "/metrics", None, None).1;
    assert!(
        scraped.lines().any(|l| l == "receiver_database_up 0"),
        "{scraped}"
    );
    tokio::time::sleep(READ_ONLY.saturating_sub(went.elapsed())).await;
    set_read_only(server, false).await;

    all_acked(
        client,
        &sub.id,
        Some(QUEUED_READ_ONLY + 1),
        Duration::from_secs(60),
    )
    .await;
    let output = consumer.stop().await;
    assert!(
        output.contains("database unavailable: holding deliveries (database read-only"),
        "no line naming the read-only server: {output}"
    );
    let deliveries = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap();
    let spent: Vec<_> = deliveries.iter().filter(|d| d.attempts != 1).collect();
    assert!(
        spent.is_empty(),
        "{} deliveries were counted more than one attempt: {spent:?}\n{output}",
        spent.len()
    );
    let refused = output
        .matches("released: the database cannot serve now")
        .count();
    eprintln!(
        "read-only: {} deliveries ACKED, each on one counted attempt; {refused} handed back from a failed apply",
        deliveries.len()
    );
}

/// Deliveries made while the database is read-only.
const QUEUED_READ_ONLY: usize = 20;

/// The store itself (R-DIST-4): a write refused as read-only is classified by its number
/// (1290), retried inside the apply on new connections (reason `read_only`), and the
/// connection that met it is closed, never put back: after the server is writable again the
/// next apply runs on a connection opened afresh. The health check reports the read-only
/// server, which a plain `SELECT` would not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_refusal_is_classified_by_number_and_its_connection_is_discarded() {
    use result_inbox::{ApplyError, StorageKind, Store, StoreOptions};
    let server = testdb::Server::local().expect("a local server");
    let db = server.provision().await.expect("provisioned");
    fixtures::initialise(&db).await;
    let dsn = result_inbox::Dsn::parse(db.runtime_url().expose()).unwrap();
    let queue = result_inbox::QueueId::new(fixtures::QUEUE).unwrap();
    let store = Store::connect(
        &dsn,
        result_inbox::ConsumerName::default(),
        queue.clone(),
        StoreOptions::default()
            .max_connections(1)
            .apply_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let event = |n: u32| {
        let spec =
            fixtures::EventSpec::cancelled(&format!("evt-ro-{n}"), &format!("task-ro-{n}"), 2);
        result_inbox::TaskEvent::parse(spec.json().as_bytes(), &queue).unwrap()
    };
    let connections = |user: String| {
        let url = server.admin_url();
        async move {
            let mut admin = MySqlConnection::connect(url.expose()).await.unwrap();
            sqlx::query_scalar::<_, i64>(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ? ORDER BY ID",
            )
            .bind(user)
            .fetch_all(&mut admin)
            .await
            .unwrap()
        }
    };
    assert!(store.apply(&event(1)).await.is_ok());
    let before = connections(db.runtime.user.clone()).await;
    assert_eq!(
        before.len(),
        1,
        "the store's one idle connection: {before:?}"
    );

    set_read_only(&server, true).await;
    let mut probe = result_inbox::HealthProbe::default();
    let checked = store.check(&mut probe, Duration::from_secs(1)).await;
    assert_eq!(
        checked.map_err(|e| e.kind()),
        Err(StorageKind::ReadOnly),
        "the health check sees the read-only server"
    );
    // The refusal itself, on a connection of the receiver's account: classified by number.
    let refused = {
        let mut runtime = MySqlConnection::connect(db.runtime_url().expose())
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO receiver_task_views (consumer_name, queue_id, task_id, task_version, \
             last_event_id, last_state, applied_events, created_at, updated_at) \
             VALUES ('c', 'q', 't', 1, 'e', 'CANCELLED', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        )
        .execute(&mut runtime)
        .await
        .expect_err("a read-only server refuses the receiver's write")
    };
    let refusal = result_inbox::StorageError::from_sqlx(&refused);
    assert_eq!(
        (refusal.kind(), refusal.number()),
        (StorageKind::ReadOnly, Some(1290)),
        "{refusal}"
    );
    assert!(
        refusal.is_unavailable() && refusal.is_retryable(),
        "{refusal}"
    );
    let applied = store
        .apply_until(&event(2), &result_inbox::store::NoWrite, None)
        .await;
    // The apply retries until its budget ends, so its last attempt may start with little time
    // left; on a loaded machine opening that attempt's new connection can outlast it, and the
    // apply then reports the budget spent. Either way every restart was a read-only refusal.
    match &applied.result {
        Err(ApplyError::Storage(e)) => {
            assert_eq!((e.kind(), e.number()), (StorageKind::ReadOnly, Some(1290)));
            assert!(e.is_unavailable() && e.is_retryable(), "{e}");
        }
        Err(ApplyError::Timeout(_)) => {}
        other => panic!("wanted a read-only refusal, got {other:?}"),
    }
    let read_only = applied.reasons.count(result_inbox::RetryReason::ReadOnly);
    assert!(
        read_only >= 1 && read_only == applied.reasons.total(),
        "retried inside the apply, each time refused as read-only: {:?}",
        applied.reasons
    );
    set_read_only(&server, false).await;
    drop(probe);
    fixtures::eventually(
        Duration::from_secs(10),
        "the refused connection closed",
        || {
            let (first, list) = (before[0], connections(db.runtime.user.clone()));
            async move { !list.await.contains(&first) }
        },
    )
    .await;
    assert!(store.apply(&event(2)).await.is_ok());
    assert!(store
        .check(
            &mut result_inbox::HealthProbe::default(),
            Duration::from_secs(1)
        )
        .await
        .is_ok());
}
