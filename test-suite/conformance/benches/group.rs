//! The group apply on a real server, by group size and concurrency, against one event a
//! transaction measured in the same run on the same server: events a second, each event's
//! time to its answer (what an ACK waits for) at p50 and p99, and per event from the server's
//! own counters: statements (`Questions`, the round trips), commits (`Com_commit`), InnoDB
//! fsyncs (`Innodb_data_fsyncs`), binary log group commits (`Binlog_group_commits`) and the
//! server's CPU time (its process's user and system time).
//!
//! The server is durable as a production one should be, and says so: the binary log on in row
//! format, `sync_binlog=1` and `innodb_flush_log_at_trx_commit=1`.
//!
//! Each configuration applies `GROUP_BENCH_EVENTS` new events (3,200 by default), a third of
//! them a higher version of a task already there, by `concurrency` appliers each taking the
//! next `group` events at once. Run with `make bench` (or `cargo bench -p conformance --bench
//! group`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use result_inbox::store::NoWrite;
use result_inbox::{ConsumerName, Dsn, Member, QueueId, Store, StoreOptions, TaskEvent};
use sqlx::{Connection, MySqlConnection, Row};

fn event(task: &str, id: &str, version: u64) -> TaskEvent {
    let raw = format!(
        r#"{{"id":"{id}","type":"task.succeeded","namespace":"default","queue_id":"inbox-demo","task_id":"{task}","task_version":{version},"state":"SUCCEEDED","occurred_at":"2026-12-02T14:17:05Z","result":{{"total":123456789012345678901234567890,"price":1.50,"items":[1,2,3]}}}}"#
    );
    TaskEvent::parse(raw.as_bytes(), &QueueId::new("inbox-demo").unwrap()).unwrap()
}

/// The server's counters this bench reports, and its CPU time.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    questions: f64,
    commits: f64,
    fsyncs: f64,
    binlog_commits: f64,
    cpu: Duration,
}

impl Counters {
    async fn read(admin: &mut MySqlConnection, pid: Option<u32>) -> Counters {
        let rows = sqlx::query(
            "SHOW GLOBAL STATUS WHERE Variable_name IN \
             ('Questions', 'Com_commit', 'Innodb_data_fsyncs', 'Binlog_group_commits')",
        )
        .fetch_all(&mut *admin)
        .await
        .unwrap();
        let get = |name: &str| -> f64 {
            rows.iter()
                .find(|r| r.try_get::<String, _>(0).unwrap() == name)
                .and_then(|r| r.try_get::<String, _>(1).ok()?.parse().ok())
                .unwrap_or(0.0)
        };
        Counters {
            questions: get("Questions"),
            commits: get("Com_commit"),
            fsyncs: get("Innodb_data_fsyncs"),
            binlog_commits: get("Binlog_group_commits"),
            cpu: pid.map(cpu_of).unwrap_or_default(),
        }
    }
}

/// A process's user and system time, from `/proc` (clock ticks of 10 ms).
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

struct Measured {
    concurrency: usize,
    group: usize,
    per_second: f64,
    p50: Duration,
    p99: Duration,
    per_event: [f64; 4],
    cpu_per_event: Duration,
}

async fn run(
    store: &Arc<Store>,
    admin: &mut MySqlConnection,
    pid: Option<u32>,
    tag: &str,
    ops: usize,
    concurrency: usize,
    group: usize,
) -> Measured {
    // Two thirds new tasks, one third a higher version of a task one of them created.
    let events: Arc<Vec<TaskEvent>> = Arc::new(
        (0..ops)
            .map(|i| {
                if i % 3 == 2 {
                    event(&format!("t-{tag}-{}", i - 1), &format!("h-{tag}-{i}"), 6)
                } else {
                    event(&format!("t-{tag}-{i}"), &format!("e-{tag}-{i}"), 5)
                }
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let before = Counters::read(admin, pid).await;
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (store, events, next) = (store.clone(), events.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let from = next.fetch_add(group, Ordering::SeqCst);
                if from >= events.len() {
                    return latencies;
                }
                let to = (from + group).min(events.len());
                let members: Vec<Member<'_>> = events[from..to]
                    .iter()
                    .map(|event| Member {
                        event,
                        write: &NoWrite,
                        deadline: None,
                    })
                    .collect();
                let t = Instant::now();
                let done = store.apply_group(&members).await;
                let took = t.elapsed();
                for a in &done.results {
                    assert!(a.result.is_ok(), "{:?}", a.result);
                    latencies.push(took);
                }
            }
        }));
    }
    let mut latencies = Vec::new();
    for w in workers {
        latencies.extend(w.await.unwrap());
    }
    let elapsed = started.elapsed();
    let after = Counters::read(admin, pid).await;
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let n = ops as f64;
    Measured {
        concurrency,
        group,
        per_second: n / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        // The counter read itself is one statement.
        per_event: [
            (after.questions - before.questions - 1.0) / n,
            (after.commits - before.commits) / n,
            (after.fsyncs - before.fsyncs) / n,
            (after.binlog_commits - before.binlog_commits) / n,
        ],
        cpu_per_event: (after.cpu - before.cpu).div_f64(n),
    }
}

fn main() {
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    let ops: usize = std::env::var("GROUP_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3200);
    let server = testdb::Server::local_with_args(
        [
            "--log-bin=group-bench",
            "--binlog-format=ROW",
            "--sync-binlog=1",
            "--innodb-flush-log-at-trx-commit=1",
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .expect("a local server");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let db = server.provision().await.unwrap();
        result_inbox::schema::init(&Dsn::parse(db.init_url().expose()).unwrap())
            .await
            .unwrap();
        db.grant_runtime().await.unwrap();
        let mut admin = MySqlConnection::connect(db.admin_receiver_url().expose())
            .await
            .unwrap();
        let settings = sqlx::query(
            "SELECT @@version, @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin, @@binlog_format",
        )
        .fetch_one(&mut admin)
        .await
        .unwrap();
        println!(
            "group bench: {} ({}), innodb_flush_log_at_trx_commit={}, sync_binlog={}, log_bin={}, binlog_format={}, {ops} events per configuration",
            server.description(),
            settings.get::<String, _>(0),
            settings.get::<u32, _>(1),
            settings.get::<u32, _>(2),
            settings.get::<i64, _>(3),
            settings.get::<String, _>(4),
        );
        let store = Arc::new(
            Store::connect(
                &Dsn::parse(db.runtime_url().expose()).unwrap(),
                ConsumerName::default(),
                QueueId::new("inbox-demo").unwrap(),
                StoreOptions::default().max_connections(20),
            )
            .await
            .unwrap(),
        );
        let pid = server.pid();
        println!("| concurrency | group | events/s | ÷ group 1 | answer p50 ms | p99 ms | statements | commits | InnoDB fsyncs | binlog group commits | server CPU µs |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for concurrency in [4usize, 16] {
            let mut alone = None;
            for group in [1usize, 4, 16, 64] {
                let tag = format!("c{concurrency}g{group}");
                let r = run(&store, &mut admin, pid, &tag, ops, concurrency, group).await;
                let base = *alone.get_or_insert(r.per_second);
                println!(
                    "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.0} |",
                    r.concurrency,
                    r.group,
                    r.per_second,
                    r.per_second / base,
                    r.p50.as_secs_f64() * 1e3,
                    r.p99.as_secs_f64() * 1e3,
                    r.per_event[0],
                    r.per_event[1],
                    r.per_event[2],
                    r.per_event[3],
                    r.cpu_per_event.as_secs_f64() * 1e6,
                );
            }
        }
    });
}
