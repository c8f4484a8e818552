//! `Store::apply` on a real server against the physical limit measured in the same run.
//!
//! The baseline is what every receiver pays anyway: a transaction that inserts one row into a
//! table with the inbox's key shape and commits. Against it, at concurrency 1, 4 and 16: the
//! first receipt (a new task's first event), the duplicate path and the stale path; events per
//! second, p50 and p99. Then contention: 16 applies on ONE task with rising versions, retried
//! as a redelivery would on retryable errors. The server's durability settings are printed.
//! Quick by default; `APPLY_BENCH_EVENTS=N` per configuration for a longer run.
//! Run with `make bench` (or `cargo bench -p receiver --bench apply`).

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use result_inbox::Dsn;
use result_inbox::{ApplyError, ConsumerName, Outcome, QueueId, Store, StoreOptions, TaskEvent};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{Executor, MySqlPool, Row};

fn event(task: &str, id: &str, version: u64) -> TaskEvent {
    let raw = format!(
        r#"{{"id":"{id}","type":"task.succeeded","namespace":"default","queue_id":"inbox-demo","task_id":"{task}","task_version":{version},"state":"SUCCEEDED","occurred_at":"2026-12-02T14:17:05Z","result":{{"total":123456789012345678901234567890,"price":1.50,"items":[1,2,3]}}}}"#
    );
    TaskEvent::parse(raw.as_bytes(), &QueueId::new("inbox-demo").unwrap()).unwrap()
}

struct Stats {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// Runs `ops` operations over `concurrency` workers; `op(i)` is the i-th operation.
async fn measure<F, Fut>(ops: usize, concurrency: usize, op: F) -> Stats
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..concurrency {
        let op = op.clone();
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = w;
            while i < ops {
                let t = Instant::now();
                op(i).await;
                lat.push(t.elapsed());
                i += concurrency;
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for w in workers {
        lat.extend(w.await.unwrap());
    }
    let elapsed = started.elapsed();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    Stats {
        per_second: ops as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

async fn apply_retrying(store: &Store, e: &TaskEvent) -> (Outcome, u32) {
    let mut retries = 0;
    loop {
        match store.apply(e).await {
            Ok(o) => return (o, retries),
            Err(err) if err.is_retryable() && retries < 50 => retries += 1,
            Err(err) => panic!("apply failed: {err}"),
        }
    }
}

fn main() {
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    let ops: usize = std::env::var("APPLY_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1600);
    let server = testdb::Server::start().expect("a throwaway MySQL server");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let db = server.provision().await.unwrap();
        result_inbox::schema::init(&Dsn::parse(&db.init_url()).unwrap()).await.unwrap();
        db.grant_runtime().await.unwrap();
        let admin: MySqlPool = MySqlPoolOptions::new()
            .max_connections(20)
            .connect_with(sqlx::mysql::MySqlConnectOptions::from_str(&db.admin_receiver_url()).unwrap())
            .await
            .unwrap();
        let settings = admin
            .fetch_one("SELECT @@version, @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog")
            .await
            .unwrap();
        let version: String = settings.try_get(0).unwrap();
        let flush: i64 = settings.try_get::<u32, _>(1).map(i64::from).or_else(|_| settings.try_get::<i64, _>(1)).unwrap_or(-1);
        admin
            .execute("CREATE TABLE bench_baseline (consumer_name VARBINARY(64) NOT NULL, queue_id VARBINARY(128) NOT NULL, event_id VARBINARY(128) NOT NULL, PRIMARY KEY (consumer_name, queue_id, event_id)) ENGINE=InnoDB")
            .await
            .unwrap();
        println!(
            "apply bench: server {} ({}), innodb_flush_log_at_trx_commit={flush}, {} events per configuration",
            server.description(),
            version,
            ops
        );
        let store = Arc::new(
            Store::connect(
                &Dsn::parse(&db.runtime_url()).unwrap(),
                ConsumerName::default(),
                QueueId::new("inbox-demo").unwrap(),
                StoreOptions { max_connections: 20, ..StoreOptions::default() },
            )
            .await
            .unwrap(),
        );
        println!("  path            conc  events/s   p50 µs   p99 µs   ÷ baseline");
        let mut at1 = None;
        let mut at16 = None;
        for concurrency in [1usize, 4, 16] {
            let tag = format!("c{concurrency}");
            let baseline = {
                let (admin, tag) = (admin.clone(), tag.clone());
                measure(ops, concurrency, move |i| {
                    let (admin, tag) = (admin.clone(), tag.clone());
                    async move {
                        let mut conn = admin.acquire().await.unwrap();
                        conn.execute("BEGIN").await.unwrap();
                        sqlx::query("INSERT INTO bench_baseline VALUES ('task-result-view', 'inbox-demo', ?)")
                            .bind(format!("base-{tag}-{i}"))
                            .execute(&mut *conn)
                            .await
                            .unwrap();
                        conn.execute("COMMIT").await.unwrap();
                    }
                })
                .await
            };
            let first_events: Arc<Vec<TaskEvent>> = Arc::new(
                (0..ops).map(|i| event(&format!("t-{tag}-{i}"), &format!("e-{tag}-{i}"), 5)).collect(),
            );
            let first = {
                let (store, evs) = (store.clone(), first_events.clone());
                measure(ops, concurrency, move |i| {
                    let (store, evs) = (store.clone(), evs.clone());
                    async move {
                        assert_eq!(apply_retrying(&store, &evs[i]).await.0, Outcome::Applied);
                    }
                })
                .await
            };
            let duplicate = {
                let (store, evs) = (store.clone(), first_events.clone());
                measure(ops, concurrency, move |i| {
                    let (store, evs) = (store.clone(), evs.clone());
                    async move {
                        assert_eq!(apply_retrying(&store, &evs[i]).await.0, Outcome::Duplicate { applied: true });
                    }
                })
                .await
            };
            let stale_events: Arc<Vec<TaskEvent>> = Arc::new(
                (0..ops).map(|i| event(&format!("t-{tag}-{i}"), &format!("s-{tag}-{i}"), 2)).collect(),
            );
            let stale = {
                let (store, evs) = (store.clone(), stale_events.clone());
                measure(ops, concurrency, move |i| {
                    let (store, evs) = (store.clone(), evs.clone());
                    async move {
                        assert_eq!(apply_retrying(&store, &evs[i]).await.0, Outcome::Stale);
                    }
                })
                .await
            };
            for (name, s) in [("baseline", &baseline), ("first receipt", &first), ("duplicate", &duplicate), ("stale", &stale)] {
                println!(
                    "  {name:<15} {concurrency:>4} {:>9.0} {:>8} {:>8}   {:.2}",
                    s.per_second,
                    s.p50.as_micros(),
                    s.p99.as_micros(),
                    s.per_second / baseline.per_second
                );
            }
            if concurrency == 1 {
                at1 = Some(first.per_second);
            }
            if concurrency == 16 {
                at16 = Some(first.per_second);
            }
        }
        if let (Some(a), Some(b)) = (at1, at16) {
            println!("  first receipt, concurrency 16 ÷ concurrency 1: {:.2}", b / a);
        }

        // Contention: 16 concurrent applies on one task, rising versions.
        let events: Vec<TaskEvent> = (1..=16).map(|v| event("t-hot", &format!("hot-{v}"), v)).collect();
        let mut handles = Vec::new();
        for e in events {
            let store = store.clone();
            handles.push(tokio::spawn(async move { apply_retrying(&store, &e).await }));
        }
        let mut retries = 0;
        let mut applied = 0;
        for h in handles {
            let (o, r) = h.await.unwrap();
            retries += r;
            if o == Outcome::Applied {
                applied += 1;
            }
        }
        let view = store.view(&result_inbox::TaskId::new("t-hot").unwrap()).await.unwrap().unwrap();
        assert_eq!(view.task_version, 16);
        assert_eq!(view.applied_events, applied);
        println!(
            "  contention: 16 applies on one task: view at v{}, {} advances, {} retries after retryable errors",
            view.task_version, applied, retries
        );
        let _: Option<ApplyError> = None;
        store.close().await;
        admin.close().await;
        drop(db);
    });
}
