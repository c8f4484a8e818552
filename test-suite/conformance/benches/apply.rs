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
use sqlx::{Connection, Executor, MySqlConnection, MySqlPool, Row};

/// The two-row floor: the inbox row and the view row a first receipt must write, with their
/// final values, into copies of the receiver's tables.
const FLOOR_INBOX: &str = "INSERT INTO bench_inbox (consumer_name, queue_id, event_id, event_digest, \
     event_canonical, applied, received_at) VALUES ('task-result-view', 'inbox-demo', ?, ?, ?, 1, UTC_TIMESTAMP(6))";
const FLOOR_VIEW: &str = "INSERT INTO bench_view (consumer_name, queue_id, task_id, task_version, \
     last_event_id, last_state, last_result, applied_events, created_at, updated_at) \
     VALUES ('task-result-view', 'inbox-demo', ?, ?, ?, ?, ?, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))";

/// An event whose `result` is about `kib` KiB of canonical JSON.
fn large_event(task: &str, id: &str, version: u64, kib: usize) -> TaskEvent {
    let item = r#"{"sku":"A-1000","note":"a line of text, repeated to reach the size","qty":12},"#;
    let items = item.repeat(kib * 1024 / item.len());
    let raw = format!(
        r#"{{"id":"{id}","type":"task.succeeded","namespace":"default","queue_id":"inbox-demo","task_id":"{task}","task_version":{version},"state":"SUCCEEDED","occurred_at":"2026-12-02T14:17:05Z","result":{{"items":[{}]}}}}"#,
        items.trim_end_matches(',')
    );
    TaskEvent::parse(raw.as_bytes(), &QueueId::new("inbox-demo").unwrap()).unwrap()
}

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
    /// Statements the server counted per operation (`Questions`: COM_QUERY and prepared
    /// executes).
    statements: f64,
    /// `Innodb_data_fsyncs` per operation.
    fsyncs: f64,
    /// `Com_admin_commands` per operation: MariaDB counts every `COM_PING` there. The admin
    /// pool's own pings around the two counter reads (at most 4) are included.
    pings: f64,
}

/// The server's statement, fsync and ping counters.
async fn server_counters(admin: &MySqlPool) -> (f64, f64, f64) {
    let rows = sqlx::query(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Innodb_data_fsyncs', 'Com_admin_commands')",
    )
    .fetch_all(admin)
    .await
    .unwrap();
    let get = |name: &str| -> f64 {
        rows.iter()
            .find(|r| r.try_get::<String, _>(0).unwrap() == name)
            .and_then(|r| r.try_get::<String, _>(1).ok()?.parse().ok())
            .unwrap_or(0.0)
    };
    (
        get("Questions"),
        get("Innodb_data_fsyncs"),
        get("Com_admin_commands"),
    )
}

/// Runs `phase` and fills in its per-operation server counters (the bench is the server's only
/// client; the two counter reads themselves add 2 statements, spread over `ops`).
async fn counted(
    admin: &MySqlPool,
    ops: usize,
    phase: impl std::future::Future<Output = Stats>,
) -> Stats {
    let (q0, f0, p0) = server_counters(admin).await;
    let mut stats = phase.await;
    let (q1, f1, p1) = server_counters(admin).await;
    stats.statements = (q1 - q0 - 1.0) / ops as f64;
    stats.fsyncs = (f1 - f0) / ops as f64;
    stats.pings = (p1 - p0) / ops as f64;
    stats
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
        statements: 0.0,
        fsyncs: 0.0,
        pings: 0.0,
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

/// Applies every event of `events` through `store`, `concurrency` at a time, each expected to
/// come out as `expected`; the phase's figures.
async fn applied_all(
    admin: &MySqlPool,
    store: &Store,
    events: &Arc<Vec<TaskEvent>>,
    concurrency: usize,
    expected: Outcome,
) -> Stats {
    let ops = events.len();
    counted(admin, ops, async {
        let (store, evs) = (store.clone(), events.clone());
        measure(ops, concurrency, move |i| {
            let (store, evs) = (store.clone(), evs.clone());
            async move {
                assert_eq!(apply_retrying(&store, &evs[i]).await.0, expected);
            }
        })
        .await
    })
    .await
}

type Conns = Arc<Vec<tokio::sync::Mutex<MySqlConnection>>>;

/// One connection per worker, READ COMMITTED, no pool and so no ping: the baselines' setup.
async fn dedicated(url: &str, n: usize) -> Conns {
    let mut v = Vec::new();
    for _ in 0..n {
        let mut c = MySqlConnection::connect(url).await.unwrap();
        c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .await
            .unwrap();
        v.push(tokio::sync::Mutex::new(c));
    }
    Arc::new(v)
}

/// The inbox row of `e` in the floor's copy of the inbox table.
async fn floor_inbox_row(conn: &mut MySqlConnection, e: &TaskEvent) {
    sqlx::query(FLOOR_INBOX)
        .bind(e.id().as_str().as_bytes())
        .bind(&e.digest().0[..])
        .bind(e.canonical())
        .execute(conn)
        .await
        .unwrap();
}

/// Baseline (a): `BEGIN`, one row, `COMMIT`.
async fn bare_commits(conns: &Conns, tag: &str, ops: usize, concurrency: usize) -> Stats {
    let (conns, tag) = (conns.clone(), tag.to_owned());
    measure(ops, concurrency, move |i| {
        let (conns, tag) = (conns.clone(), tag.clone());
        async move {
            let mut conn = conns[i % conns.len()].lock().await;
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
}

/// Baseline (b): `BEGIN`, the inbox row and the view row of `events[i]` with final values,
/// `COMMIT`, into copies of the receiver's tables.
async fn two_rows(
    conns: &Conns,
    events: &Arc<Vec<TaskEvent>>,
    ops: usize,
    concurrency: usize,
) -> Stats {
    let (conns, evs) = (conns.clone(), events.clone());
    measure(ops, concurrency, move |i| {
        let (conns, evs) = (conns.clone(), evs.clone());
        async move {
            let e = &evs[i];
            let mut conn = conns[i % conns.len()].lock().await;
            conn.execute("BEGIN").await.unwrap();
            floor_inbox_row(&mut conn, e).await;
            sqlx::query(FLOOR_VIEW)
                .bind(e.task().as_str().as_bytes())
                .bind(e.version())
                .bind(e.id().as_str().as_bytes())
                .bind(e.state().as_str().as_bytes())
                .bind(e.result())
                .execute(&mut *conn)
                .await
                .unwrap();
            conn.execute("COMMIT").await.unwrap();
        }
    })
    .await
}

/// The two other ways to advance an existing view, measured against the store's upsert on the
/// floor's copies of the tables (tasks `f-<tag>-<i>`, whose views the floor phase wrote): a
/// single-table `UPDATE … WHERE task_version < ?` (`lock_first = false`), or the earlier design's
/// `SELECT … FOR UPDATE` and then the `UPDATE` (`lock_first = true`). Each is `BEGIN`, the inbox
/// row, the view change, `COMMIT`; neither handles the absent or newer view, which the upsert
/// also covers in the same statement.
async fn advance_candidate(
    conns: &Conns,
    tag: &str,
    ops: usize,
    concurrency: usize,
    version: u64,
    lock_first: bool,
) -> Stats {
    let (conns, tag) = (conns.clone(), tag.to_owned());
    measure(ops, concurrency, move |i| {
        let (conns, tag) = (conns.clone(), tag.clone());
        async move {
            let task = format!("f-{tag}-{i}");
            let e = event(&task, &format!("c{version}-{tag}-{i}"), version);
            let mut conn = conns[i % conns.len()].lock().await;
            conn.execute("BEGIN").await.unwrap();
            floor_inbox_row(&mut conn, &e).await;
            if lock_first {
                sqlx::query(
                    "SELECT task_version FROM bench_view WHERE consumer_name = 'task-result-view' \
                     AND queue_id = 'inbox-demo' AND task_id = ? FOR UPDATE",
                )
                .bind(task.as_bytes())
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            }
            let changed = sqlx::query(
                "UPDATE bench_view SET task_version = ?, last_event_id = ?, last_state = ?, \
                 last_result = ?, applied_events = applied_events + 1, updated_at = UTC_TIMESTAMP(6) \
                 WHERE consumer_name = 'task-result-view' AND queue_id = 'inbox-demo' \
                 AND task_id = ? AND task_version < ?",
            )
            .bind(e.version())
            .bind(e.id().as_str().as_bytes())
            .bind(e.state().as_str().as_bytes())
            .bind(e.result())
            .bind(task.as_bytes())
            .bind(e.version())
            .execute(&mut *conn)
            .await
            .unwrap()
            .rows_affected();
            assert_eq!(changed, 1);
            conn.execute("COMMIT").await.unwrap();
        }
    })
    .await
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
        result_inbox::schema::init(&Dsn::parse(db.init_url().expose()).unwrap()).await.unwrap();
        db.grant_runtime().await.unwrap();
        let admin: MySqlPool = MySqlPoolOptions::new()
            .max_connections(20)
            .connect_with(sqlx::mysql::MySqlConnectOptions::from_str(db.admin_receiver_url().expose()).unwrap())
            .await
            .unwrap();
        let settings = admin
            .fetch_one("SELECT @@version, @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog")
            .await
            .unwrap();
        let version: String = settings.try_get(0).unwrap();
        let flush: i64 = settings.try_get::<u32, _>(1).map(i64::from).or_else(|_| settings.try_get::<i64, _>(1)).unwrap_or(-1);
        admin.execute("CREATE TABLE bench_inbox LIKE receiver_inbox").await.unwrap();
        admin.execute("CREATE TABLE bench_view LIKE receiver_task_views").await.unwrap();
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
                &Dsn::parse(db.runtime_url().expose()).unwrap(),
                ConsumerName::default(),
                QueueId::new("inbox-demo").unwrap(),
                StoreOptions { max_connections: 20, ..StoreOptions::default() },
            )
            .await
            .unwrap(),
        );
        println!("  path            conc  events/s   p50 µs   p99 µs     ÷ (a)   ÷ (b)   stmts  fsyncs  pings (per op, server counters)");
        let mut at1 = None;
        let mut at16 = None;
        for concurrency in [1usize, 4, 16] {
            let tag = format!("c{concurrency}");
            // (a) the bare commit and (b) the two-row floor, each worker on a connection of
            // its own (no pool, no ping), as the store's own connections are.
            let conns = dedicated(db.admin_receiver_url().expose(), concurrency).await;
            let baseline = counted(&admin, ops, async {
                bare_commits(&conns, &tag, ops, concurrency).await
            })
            .await;
            let floor_events: Arc<Vec<TaskEvent>> = Arc::new(
                (0..ops).map(|i| event(&format!("f-{tag}-{i}"), &format!("f-{tag}-{i}"), 5)).collect(),
            );
            let floor = counted(&admin, ops, async {
                two_rows(&conns, &floor_events, ops, concurrency).await
            })
            .await;
            let first_events: Arc<Vec<TaskEvent>> = Arc::new(
                (0..ops).map(|i| event(&format!("t-{tag}-{i}"), &format!("e-{tag}-{i}"), 5)).collect(),
            );
            let first = applied_all(&admin, &store, &first_events, concurrency, Outcome::Applied).await;
            let higher_events: Arc<Vec<TaskEvent>> = Arc::new(
                (0..ops).map(|i| event(&format!("t-{tag}-{i}"), &format!("h-{tag}-{i}"), 6)).collect(),
            );
            let existing = applied_all(&admin, &store, &higher_events, concurrency, Outcome::Applied).await;
            let plain_update =
                advance_candidate(&conns, &tag, ops, concurrency, 6, false).await;
            let lock_then_update =
                advance_candidate(&conns, &tag, ops, concurrency, 7, true).await;
            println!(
                "  existing task, candidates at c{concurrency}: the store's upsert {:.0}/s; UPDATE … WHERE task_version < ? {:.0}/s (÷ upsert {:.2}); SELECT … FOR UPDATE + UPDATE {:.0}/s (÷ upsert {:.2})",
                existing.per_second,
                plain_update.per_second,
                plain_update.per_second / existing.per_second,
                lock_then_update.per_second,
                lock_then_update.per_second / existing.per_second,
            );
            let duplicate = applied_all(&admin, &store, &first_events, concurrency, Outcome::Duplicate { applied: true }).await;
            let stale_events: Arc<Vec<TaskEvent>> = Arc::new(
                (0..ops).map(|i| event(&format!("t-{tag}-{i}"), &format!("s-{tag}-{i}"), 2)).collect(),
            );
            let stale = applied_all(&admin, &store, &stale_events, concurrency, Outcome::Stale).await;
            for (name, s) in [
                ("(a) bare commit", &baseline),
                ("(b) two rows", &floor),
                ("first receipt", &first),
                ("existing task", &existing),
                ("duplicate", &duplicate),
                ("stale", &stale),
            ] {
                println!(
                    "  {name:<15} {concurrency:>4} {:>9.0} {:>8} {:>8}   {:>5.2}   {:>5.2}   {:>5.1}   {:>5.2}  {:>5.3}",
                    s.per_second,
                    s.p50.as_micros(),
                    s.p99.as_micros(),
                    s.per_second / baseline.per_second,
                    s.per_second / floor.per_second,
                    s.statements,
                    s.fsyncs,
                    s.pings
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

        // Contention: 16 concurrent applies on one task, versions 1-16, each apply once (what
        // reaches the caller is what would reach the platform). A new task every round (the
        // first receipt's create-or-lock) and an existing one (the view row's lock).
        for (scenario, rounds) in [("a new task", 20usize), ("an existing task", 20)] {
            let mut deadlocks = 0;
            let mut other_errors = 0;
            let mut retries = 0;
            let mut deadlock_retries_possible = 0;
            for round in 0..rounds {
                let task = format!("t-hot-{}-{round}", scenario.len());
                if scenario == "an existing task" {
                    store.apply(&event(&task, &format!("seed-{task}"), 1)).await.unwrap();
                }
                let start = Arc::new(tokio::sync::Barrier::new(16));
                let mut handles = Vec::new();
                for v in 1..=16u64 {
                    let (store, start) = (store.clone(), start.clone());
                    let e = event(&task, &format!("{task}-{v}"), v + 1);
                    handles.push(tokio::spawn(async move {
                        start.wait().await;
                        store.apply_until(&e, &result_inbox::store::NoWrite, None).await
                    }));
                }
                for h in handles {
                    let applied = h.await.unwrap();
                    retries += applied.retries;
                    deadlock_retries_possible += 1;
                    match applied.result {
                        Ok(_) => {}
                        Err(ApplyError::Storage(e)) if e.kind() == result_inbox::StorageKind::Deadlock => deadlocks += 1,
                        Err(_) => other_errors += 1,
                    }
                }
                let view = store.view(&result_inbox::TaskId::new(&task).unwrap()).await.unwrap().unwrap();
                assert_eq!(view.task_version, 17, "{scenario}, round {round}");
            }
            println!(
                "  contention, 16 concurrent versions of {scenario}, {rounds} rounds ({deadlock_retries_possible} applies): {deadlocks} deadlocks and {other_errors} other errors reached the caller; {retries} retries inside the apply"
            );
            assert_eq!(deadlocks, 0, "a deadlock reached the caller");
        }
        // The large path: a 64 KiB result, written twice by a first receipt (the inbox's frozen
        // event and the view's last_result), against the two-row floor with the same bytes.
        let redo: i64 = admin
            .fetch_one("SELECT @@innodb_log_file_size")
            .await
            .unwrap()
            .try_get::<u64, _>(0)
            .map(|v| v as i64)
            .unwrap_or(-1);
        let log_waits = |admin: MySqlPool| async move {
            let row = admin
                .fetch_one("SHOW GLOBAL STATUS LIKE 'Innodb_log_waits'")
                .await
                .unwrap();
            row.try_get::<String, _>(1).unwrap().parse::<u64>().unwrap_or(0)
        };
        let large_ops = (ops / 4).max(50);
        println!(
            "  large events (a 64 KiB result, {large_ops} per configuration), innodb_log_file_size={} MiB:",
            redo / (1024 * 1024)
        );
        println!("  path            conc  events/s   p50 µs   p99 µs     ÷ (a)   ÷ (b, same bytes)");
        for concurrency in [1usize, 4, 16] {
            let waits_before = log_waits(admin.clone()).await;
            let tag = format!("L{concurrency}");
            let conns = dedicated(db.admin_receiver_url().expose(), concurrency).await;
            let bare = bare_commits(&conns, &tag, large_ops, concurrency).await;
            let floor_events: Arc<Vec<TaskEvent>> = Arc::new(
                (0..large_ops).map(|i| large_event(&format!("fl-{tag}-{i}"), &format!("fl-{tag}-{i}"), 5, 64)).collect(),
            );
            let floor = {
                two_rows(&conns, &floor_events, large_ops, concurrency).await
            };
            let events: Arc<Vec<TaskEvent>> = Arc::new(
                (0..large_ops).map(|i| large_event(&format!("tl-{tag}-{i}"), &format!("el-{tag}-{i}"), 5, 64)).collect(),
            );
            let first = {
                let (store, evs) = (store.clone(), events.clone());
                measure(large_ops, concurrency, move |i| {
                    let (store, evs) = (store.clone(), evs.clone());
                    async move {
                        assert_eq!(apply_retrying(&store, &evs[i]).await.0, Outcome::Applied);
                    }
                })
                .await
            };
            for (name, st) in [("(a) bare commit", &bare), ("(b) two rows", &floor), ("first receipt", &first)] {
                println!(
                    "  {name:<15} {concurrency:>4} {:>9.0} {:>8} {:>8}   {:>5.2}   {:>5.2}",
                    st.per_second,
                    st.p50.as_micros(),
                    st.p99.as_micros(),
                    st.per_second / bare.per_second,
                    st.per_second / floor.per_second
                );
            }
            println!(
                "  (Innodb_log_waits during c{concurrency}: {}; event size {} bytes)",
                log_waits(admin.clone()).await - waits_before,
                events[0].canonical().len()
            );
        }
        // The received_at index (receiver prune's, and the oldest row's age): first receipts
        // into an inbox with it and into one without it (a second database on this server, the
        // index dropped), in alternating rounds at concurrency 4.
        let bare = server.provision().await.unwrap();
        result_inbox::schema::init(&Dsn::parse(bare.init_url().expose()).unwrap()).await.unwrap();
        bare.grant_runtime().await.unwrap();
        let mut bare_admin = sqlx::MySqlConnection::connect(bare.admin_receiver_url().expose()).await.unwrap();
        bare_admin
            .execute("ALTER TABLE receiver_inbox DROP INDEX receiver_inbox_received_at")
            .await
            .unwrap();
        let unindexed = Arc::new(
            Store::connect(
                &Dsn::parse(bare.runtime_url().expose()).unwrap(),
                ConsumerName::default(),
                QueueId::new("inbox-demo").unwrap(),
                StoreOptions { max_connections: 20, ..StoreOptions::default() },
            )
            .await
            .unwrap(),
        );
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for round in 0..3 {
            for (indexed, target) in [(true, &store), (false, &unindexed)] {
                let events: Arc<Vec<TaskEvent>> = Arc::new(
                    (0..ops).map(|i| event(&format!("ix-{round}-{i}"), &format!("ix-{round}-{i}"), 5)).collect(),
                );
                let s = applied_all(&admin, target, &events, 4, Outcome::Applied).await;
                if indexed { with.push(s.per_second) } else { without.push(s.per_second) }
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "  the received_at index, first receipts at c4, 3 alternating rounds of {ops}: with it {:.0}/s, without it {:.0}/s; with ÷ without {:.3} (rounds with: {:?}; without: {:?})",
            mean(&with),
            mean(&without),
            mean(&with) / mean(&without),
            with.iter().map(|v| v.round() as i64).collect::<Vec<_>>(),
            without.iter().map(|v| v.round() as i64).collect::<Vec<_>>(),
        );
        unindexed.close().await;
        drop(bare_admin);
        drop(bare);
        store.close().await;
        admin.close().await;
        drop(db);
    });
}
