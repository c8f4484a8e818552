//! A backlog drained by the real `receiver consume` (release build) from a real `orbit-dev`,
//! against the same events applied straight through `Store` at the same concurrency, in the
//! same run, on the same server: events per second, their ratio, and what reached the
//! platform that should not have (deadlocks, second attempts).
//!
//! The backlog: 500 tasks, each `task.submitted` (v1), `task.started` (v2), `task.succeeded`
//! (v3) and one redelivery of one of those (the platform's duplicate-event fault): 2,000
//! deliveries, the tasks' steps interleaved in a seeded random order. orbit-dev's task states
//! allow three versions per task (a final state is final), so the fourth delivery of each task
//! is a duplicate rather than a fourth version.
//!
//! Run with `make bench` (or `cargo build --release --bins && cargo bench -p conformance
//! --bench drain`). `DRAIN_BENCH_TASKS=N` changes the number of tasks,
//! `DRAIN_BENCH_CONCURRENCY=N` the concurrency of both runs (`RECEIVER_CONCURRENCY` for
//! consume; 4 by default).
//!
//! The drain is watched by counting the subscription's deliveries not yet ACKED on the
//! platform's database every 100 ms (an index range over what is left), not by listing every
//! delivery through the API, which loaded the platform it measures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::process::Consumer;
use conformance::{subscribed_receiver, QUEUE};
use result_inbox::{ConsumerName, QueueId, Store, StoreOptions, TaskEvent};
use serde_json::json;
use sqlx::{Connection, MySqlConnection};

#[derive(Clone, Copy)]
enum Step {
    Submit,
    Start,
    Succeed,
    Duplicate,
}

fn main() {
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    let tasks: usize = std::env::var("DRAIN_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    let concurrency: usize = std::env::var("DRAIN_BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(receiver::config::DEFAULT_CONCURRENCY);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(drain(tasks, concurrency));
}

async fn drain(tasks: usize, concurrency: usize) {
    let (orbit, client, sub, mut env) = subscribed_receiver(
        &["--enable-fault-api", "--window", "10000"],
        &["task.submitted", "task.started", "task.succeeded"],
    )
    .await;

    // The schedule: each task's steps in order, the tasks interleaved at random.
    let mut rng = fastrand::Rng::with_seed(0x5EED_D4A1);
    let mut plan: Vec<Vec<Step>> = (0..tasks)
        .map(|_| {
            let mut steps = vec![Step::Submit, Step::Start, Step::Succeed];
            steps.insert(rng.usize(1..=3), Step::Duplicate);
            steps.reverse();
            steps
        })
        .collect();
    let mut ids: Vec<Option<String>> = vec![None; tasks];
    let produced = Instant::now();
    let mut open: Vec<usize> = (0..tasks).collect();
    while !open.is_empty() {
        let pick = rng.usize(..open.len());
        let t = open[pick];
        match plan[t].pop().expect("a step left") {
            Step::Submit => ids[t] = Some(client.submit_task(QUEUE, None).await.unwrap().id),
            Step::Start => {
                let id = ids[t].as_deref().unwrap();
                client.report_task(id, "RUNNING", None).await.unwrap();
            }
            Step::Succeed => {
                let id = ids[t].as_deref().unwrap();
                let result =
                    serde_json::value::RawValue::from_string(format!(r#"{{"n":{t},"ok":true}}"#))
                        .unwrap();
                client
                    .report_task(id, "SUCCEEDED", Some(&result))
                    .await
                    .unwrap();
            }
            Step::Duplicate => {
                let filter = orbit_sdk::DeliveryFilter {
                    task_id: ids[t].clone(),
                    ..Default::default()
                };
                let emitted = client.list_deliveries(&sub.id, &filter).await.unwrap();
                let event = &emitted[rng.usize(..emitted.len())].event_id;
                orbit.fault(json!({"fault": "duplicate-event", "event_id": event}));
            }
        }
        if plan[t].is_empty() {
            open.swap_remove(pick);
        }
    }
    let deliveries = tasks * 4;
    println!(
        "drain bench: {deliveries} deliveries queued over {tasks} tasks in {:.1} s; draining with receiver consume at concurrency {concurrency}",
        produced.elapsed().as_secs_f64()
    );

    // The drain: from the consumer's "consuming" line to every delivery ACKED.
    env.push(("RECEIVER_CONCURRENCY", concurrency.to_string()));
    let consumer = Consumer::normal(&env);
    while !consumer.output().contains("consuming") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut admin = MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    let mut platform = MySqlConnection::connect(orbit.db.platform_url().expose())
        .await
        .unwrap();
    let drain_from = Counters::read(&mut admin).await;
    let started = Instant::now();
    let left = || {
        sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM orbit_deliveries WHERE subscription_id = ? \
             AND state IN ('PENDING', 'LEASED', 'EXPIRED')",
        )
        .bind(sub.id.as_str())
    };
    while left().fetch_one(&mut platform).await.unwrap() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the backlog did not drain in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = started.elapsed();
    let drain_counts = Counters::read(&mut admin).await.since(&drain_from);
    let output = consumer.stop().await;
    // Counted on the platform's database: the API lists at most 10,000 at a time.
    let (made, second_attempts): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), CAST(COALESCE(SUM(attempts > 1), 0) AS SIGNED) FROM orbit_deliveries \
         WHERE subscription_id = ?",
    )
    .bind(sub.id.as_str())
    .fetch_one(&mut platform)
    .await
    .unwrap();
    assert_eq!(made, deliveries as i64, "every delivery made");
    let drain_rate = deliveries as f64 / drained.as_secs_f64();
    let deadlocks = output
        .lines()
        .filter(|l| l.contains("not acked") && l.contains("mysql 1213"))
        .count();
    let not_acked = output.lines().filter(|l| l.contains("not acked")).count();
    // How long the applies themselves took, from consume's own lines: the rest of a
    // delivery's time is the platform's (lease, send, ACK).
    let mut apply_ms: Vec<u64> = output
        .lines()
        .filter(|l| l.contains("classification="))
        .filter_map(|l| l.split(" duration_ms=").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse().ok())
        .collect();
    apply_ms.sort_unstable();
    let apply_p50 = apply_ms.get(apply_ms.len() / 2).copied().unwrap_or(0);
    let retried: u64 = output
        .lines()
        .filter_map(|l| l.split(" retries=").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse::<u64>().ok())
        .sum();

    // The same deliveries straight through Store, same concurrency, another consumer name.
    let canonical: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT event_canonical FROM receiver_inbox ORDER BY received_at")
            .fetch_all(&mut admin)
            .await
            .unwrap();
    let queue = QueueId::new(QUEUE).unwrap();
    let mut events: Vec<TaskEvent> = canonical
        .iter()
        .map(|c| TaskEvent::parse(c, &queue).unwrap())
        .collect();
    // The duplicates again, one per task, so that both runs apply the same number.
    let extra: Vec<TaskEvent> = (0..tasks)
        .map(|i| events[i % events.len()].clone())
        .collect();
    events.extend(extra);
    events.truncate(deliveries);
    rng.shuffle(&mut events);
    let dsn = result_inbox::Dsn::parse(orbit.db.runtime_url().expose()).unwrap();
    let store = Arc::new(
        Store::connect(
            &dsn,
            ConsumerName::new("drain-direct").unwrap(),
            queue,
            StoreOptions {
                max_connections: concurrency as u32,
                ..StoreOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    let events = Arc::new(events);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let direct_from = Counters::read(&mut admin).await;
    let direct_started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (store, events, next) = (store.clone(), events.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut failed = 0;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(e) = events.get(i) else {
                    return failed;
                };
                if store.apply(e).await.is_err() {
                    failed += 1;
                }
            }
        }));
    }
    let mut direct_failed = 0;
    for w in workers {
        direct_failed += w.await.unwrap();
    }
    let direct = direct_started.elapsed();
    let direct_counts = Counters::read(&mut admin).await.since(&direct_from);
    let direct_rate = deliveries as f64 / direct.as_secs_f64();
    store.close().await;

    println!(
        "  receiver consume: {deliveries} deliveries in {:.2} s: {drain_rate:.0} events/s",
        drained.as_secs_f64()
    );
    println!(
        "  Store::apply direct, same events, concurrency {concurrency}: {:.2} s: {direct_rate:.0} events/s ({direct_failed} failed)",
        direct.as_secs_f64()
    );
    println!("  consume ÷ direct: {:.2}", drain_rate / direct_rate);
    // The server is shared: the drain's counts are the platform's and the receiver's together;
    // the direct run's are the receiver's alone for the same events, so the difference is the
    // platform's (and the bench's own watch, a count every 100 ms).
    let per = |c: &Counters| c.per(deliveries);
    let (all, receiver_only) = (per(&drain_counts), per(&direct_counts));
    println!(
        "  per delivery, server counters: drain (platform + receiver) {} ; direct (receiver) {} ; so the platform about {:.1} statements, {:.2} commits, {:.2} fsyncs",
        all.show(),
        receiver_only.show(),
        all.statements - receiver_only.statements,
        all.commits - receiver_only.commits,
        all.fsyncs - receiver_only.fsyncs
    );
    println!(
        "  per delivery in consume: {:.1} ms of wall time per handler slot, of which the apply (p50) {apply_p50} ms",
        drained.as_secs_f64() * 1000.0 * concurrency as f64 / deliveries as f64
    );
    println!(
        "  reached the platform: {deadlocks} deadlocks, {not_acked} deliveries not ACKed, {second_attempts} second attempts; retries inside the apply: {retried}"
    );
    assert_eq!(deadlocks, 0, "a deadlock reached the platform");
}

/// Server-wide counters (`SHOW GLOBAL STATUS`): statements, commits and fsyncs.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    statements: f64,
    commits: f64,
    fsyncs: f64,
}

impl Counters {
    async fn read(admin: &mut MySqlConnection) -> Counters {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SHOW GLOBAL STATUS WHERE Variable_name IN \
             ('Questions', 'Com_commit', 'Innodb_os_log_fsyncs', 'Innodb_data_fsyncs')",
        )
        .fetch_all(&mut *admin)
        .await
        .unwrap();
        let get = |name: &str| {
            rows.iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0.0)
        };
        Counters {
            statements: get("Questions"),
            commits: get("Com_commit"),
            // MySQL counts the redo log's fsyncs apart; MariaDB 10.11 counts them all in
            // `Innodb_data_fsyncs`. Whichever the server has.
            fsyncs: get("Innodb_os_log_fsyncs").max(get("Innodb_data_fsyncs")),
        }
    }

    fn since(self, before: &Counters) -> Counters {
        Counters {
            statements: self.statements - before.statements,
            commits: self.commits - before.commits,
            fsyncs: self.fsyncs - before.fsyncs,
        }
    }

    fn per(&self, n: usize) -> Counters {
        let n = n as f64;
        Counters {
            statements: self.statements / n,
            commits: self.commits / n,
            fsyncs: self.fsyncs / n,
        }
    }

    fn show(&self) -> String {
        format!(
            "{:.1} statements, {:.2} commits, {:.2} fsyncs",
            self.statements, self.commits, self.fsyncs
        )
    }
}
