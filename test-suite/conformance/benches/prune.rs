//! `receiver prune` beside a full-speed `receiver consume` (both release builds), on one
//! server: an inbox of a million rows older than the window, and three backlogs drained by
//! `consume` at concurrency 16, the middle one with `prune --older-than 30d` (its defaults)
//! running beside it, stopped by SIGTERM when the drain ends. Same run, same server, same
//! platform: the ratio is the middle drain's rate to the mean of the two around it.
//!
//! Reported: each drain's rate, apply times from consume's own lines (p50, p99, max), InnoDB
//! row lock waits during each drain (`Innodb_row_lock_waits`, `Innodb_row_lock_time`), the
//! rows prune deleted and its rate beside the drain and then alone, and the InnoDB history
//! list length (rows deleted but not yet purged) sampled every 500 ms.
//!
//! Run with `make bench-prune` (about 5 minutes; most of it writing the old rows).
//! `PRUNE_BENCH_ROWS` (1,000,000), `PRUNE_BENCH_BYTES` (1,024 bytes of frozen event a row) and
//! `PRUNE_BENCH_TASKS` (10,000 tasks, 40,000 deliveries a drain) pick others.

use std::time::{Duration, Instant};

use fixtures::process::Consumer;
use fixtures::QUEUE;
use sqlx::{Connection, MySqlConnection, Row};

/// The bench server's settings unless `PRUNE_BENCH_SERVER_ARGS` gives others: a buffer pool
/// larger than the million rows (about 1.2 GiB with their index), as a database server sized
/// for its data has; with the tests' 128 MiB every deleted row is a disk read here.
const DEFAULT_SERVER_ARGS: &str = "--innodb-buffer-pool-size=2G";

/// A bench knob, or its default.
fn knob(name: &str, default: usize) -> usize {
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: {v:?} is not a number"))
        })
        .unwrap_or(default)
}

fn main() {
    let rows = knob("PRUNE_BENCH_ROWS", 1_000_000);
    let bytes = knob("PRUNE_BENCH_BYTES", 1024);
    let tasks = knob("PRUNE_BENCH_TASKS", 10_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(rows, bytes, tasks));
}

/// The server's row lock counters: waits, and milliseconds waited in all.
async fn lock_counters(admin: &mut MySqlConnection) -> (f64, f64) {
    let rows = sqlx::query(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_row_lock_waits', 'Innodb_row_lock_time')",
    )
    .fetch_all(&mut *admin)
    .await
    .unwrap();
    let get = |name: &str| -> f64 {
        rows.iter()
            .find(|r| r.get::<String, _>(0) == name)
            .and_then(|r| r.get::<String, _>(1).parse().ok())
            .unwrap_or(0.0)
    };
    (get("Innodb_row_lock_waits"), get("Innodb_row_lock_time"))
}

/// InnoDB's history list length: undo records of committed changes (here, deleted rows) that
/// purge has not removed yet.
async fn history_length(admin: &mut MySqlConnection) -> u64 {
    let row = sqlx::query("SHOW ENGINE INNODB STATUS")
        .fetch_one(&mut *admin)
        .await
        .unwrap();
    let status: String = row.get(2);
    status
        .lines()
        .find_map(|l| l.strip_prefix("History list length "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Row lock waits whose blocker is a session of `user` (prune's account), now: how many, and
/// the longest so far, in microseconds. Sampled every 100 ms, so any wait past 100 ms is seen.
async fn waits_on(admin: &mut MySqlConnection, user: &str) -> (u64, u64) {
    let row = sqlx::query(
        "SELECT CAST(COUNT(*) AS UNSIGNED), \
         CAST(COALESCE(MAX(TIMESTAMPDIFF(MICROSECOND, r.trx_wait_started, NOW(6))), 0) AS UNSIGNED) \
         FROM information_schema.INNODB_LOCK_WAITS w \
         JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
         JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
         JOIN information_schema.PROCESSLIST p ON p.ID = b.trx_mysql_thread_id \
         WHERE p.USER = ?",
    )
    .bind(user)
    .fetch_one(&mut *admin)
    .await
    .unwrap();
    (row.get(0), row.get(1))
}

struct Drain {
    rate: f64,
    p50: u64,
    p99: u64,
    max: u64,
    lock_waits: f64,
    lock_ms: f64,
}

/// Queues `tasks` tasks' deliveries, then drains them with `receiver consume` at concurrency
/// 16; `beside` starts just before the consumer and is given the drain's end.
async fn drain(
    orbit: &fixtures::OrbitDev,
    client: &orbit_sdk::Client,
    sub: &orbit_sdk::SubscriptionId,
    env: &[(&'static str, String)],
    tasks: usize,
    seed: u64,
    beside: Option<&mut Beside>,
) -> Drain {
    let mut rng = fastrand::Rng::with_seed(seed);
    fixtures::load::produce(orbit, client, sub, tasks, &mut rng, |_| {}).await;
    let (mut admin, mut platform) = orbit.connections().await;
    let mut beside = beside;
    if let Some(b) = beside.as_deref_mut() {
        b.start(orbit);
    }
    let mut env = env.to_vec();
    env.push(("RECEIVER_CONCURRENCY", "16".into()));
    let consumer = Consumer::normal(&env);
    while !consumer.output().contains("consuming") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let locks_from = lock_counters(&mut admin).await;
    let started = Instant::now();
    let sub_id = sub.as_str().to_owned();
    let mut watched = std::pin::pin!(fixtures::load::wait_drained(
        &mut platform,
        &sub_id,
        Duration::from_millis(100),
        Duration::from_secs(900),
    ));
    // Waits on prune's locks every 100 ms, the history list every 500 ms, while the drain runs.
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            () = &mut watched => break,
            () = tokio::time::sleep(Duration::from_millis(100)) => {
                if let Some(b) = beside.as_deref_mut() {
                    let (n, longest) = waits_on(&mut admin, &orbit.db.prune.user).await;
                    b.waits_seen += n;
                    b.longest_wait_us = b.longest_wait_us.max(longest);
                    ticks += 1;
                    if ticks % 5 == 0 {
                        let h = history_length(&mut admin).await;
                        b.history_max = b.history_max.max(h);
                    }
                }
            }
        }
    }
    let drained = started.elapsed();
    let locks = lock_counters(&mut admin).await;
    if let Some(b) = beside {
        b.stop();
    }
    let output = consumer.stop().await;
    let apply_ms = fixtures::load::apply_durations_ms(&output);
    let at = |p: f64| {
        apply_ms
            .get(((apply_ms.len() as f64 * p) as usize).min(apply_ms.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Drain {
        rate: (tasks * 4) as f64 / drained.as_secs_f64(),
        p50: at(0.5),
        p99: at(0.99),
        max: apply_ms.last().copied().unwrap_or(0),
        lock_waits: locks.0 - locks_from.0,
        lock_ms: locks.1 - locks_from.1,
    }
}

/// `receiver prune` beside a drain: started before it, SIGTERM at its end; its summary.
#[derive(Default)]
struct Beside {
    child: Option<std::process::Child>,
    summary: String,
    history_max: u64,
    /// Waits on prune's locks seen by the samples (a wait seen twice counts twice).
    waits_seen: u64,
    longest_wait_us: u64,
}

impl Beside {
    fn start(&mut self, orbit: &fixtures::OrbitDev) {
        let mut cmd = fixtures::bare_command(&fixtures::receiver_bin());
        cmd.args(["prune", "--older-than", "30d"])
            .envs(fixtures::prune_env(&orbit.db.prune_url()))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        self.child = Some(fixtures::spawn(cmd));
    }

    fn stop(&mut self) {
        let child = self.child.take().expect("prune was started");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let out = child.wait_with_output().unwrap();
        self.summary = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    }
}

fn field(summary: &str, key: &str) -> f64 {
    summary
        .split(' ')
        .find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {summary:?}"))
}

async fn run(rows: usize, bytes: usize, tasks: usize) {
    // A server of the bench's own, so that its settings are the bench's.
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    let args: Vec<String> = std::env::var("PRUNE_BENCH_SERVER_ARGS")
        .unwrap_or_else(|_| DEFAULT_SERVER_ARGS.to_owned())
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let server = testdb::Server::local_with_args(args.clone()).expect("a local server");
    let db = server.provision().await.expect("provisioned");
    let orbit = fixtures::OrbitDev::start_with(db, &["--enable-fault-api", "--window", "10000"]);
    orbit.init_receiver().await;
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, fixtures::load::LOAD_TYPES)
        .await
        .expect("subscription created");
    let mut env = orbit.receiver_env();
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
    let mut admin = MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    let made = Instant::now();
    fixtures::insert_old_inbox_rows(
        &mut admin,
        ("task-result-view", QUEUE),
        "old",
        rows,
        bytes,
        40,
    )
    .await;
    let pool: u64 = sqlx::query_scalar("SELECT @@innodb_buffer_pool_size")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    println!(
        "prune bench: {rows} inbox rows of {bytes} bytes, 40 days old, written in {:.0} s; history list {}; buffer pool {} MiB (server args: {args:?})",
        made.elapsed().as_secs_f64(),
        history_length(&mut admin).await,
        pool >> 20
    );
    // Let purge settle what the writing left before measuring.
    let settle = Instant::now();
    while history_length(&mut admin).await > 1_000 && settle.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let before = drain(&orbit, &client, &sub.id, &env, tasks, 1, None).await;
    let mut beside = Beside::default();
    let history_start = history_length(&mut admin).await;
    let with = drain(&orbit, &client, &sub.id, &env, tasks, 2, Some(&mut beside)).await;
    let history_end = history_length(&mut admin).await;
    let after = drain(&orbit, &client, &sub.id, &env, tasks, 3, None).await;

    // Prune alone and unpaced, for 10 s, from where the first run stopped: what it could do.
    let alone = fixtures::run_receiver(
        &[
            "prune",
            "--older-than",
            "30d",
            "--max-seconds",
            "10",
            "--pause",
            "0",
            "--max-rate",
            "1000000",
        ],
        &fixtures::prune_env(&orbit.db.prune_url()),
        None,
    );
    let alone = String::from_utf8_lossy(&alone.stdout).trim().to_owned();

    let deliveries = tasks * 4;
    println!();
    println!("prune bench summary ({deliveries} deliveries a drain, receiver consume at concurrency 16; prune with its defaults: batches of 1,000, at least 20 ms apart, at most 5,000 rows a second):");
    println!("| drain | events/s | apply p50 ms | apply p99 ms | apply max ms | row lock waits | ms waited |");
    println!("|---|---|---|---|---|---|---|");
    for (name, d) in [
        ("before, no prune", &before),
        ("with prune beside", &with),
        ("after, no prune", &after),
    ] {
        println!(
            "| {name} | {:.0} | {} | {} | {} | {:.0} | {:.0} |",
            d.rate, d.p50, d.p99, d.max, d.lock_waits, d.lock_ms
        );
    }
    let baseline = (before.rate + after.rate) / 2.0;
    let ratio = with.rate / baseline;
    let (pruned, seconds) = (
        field(&beside.summary, "rows"),
        field(&beside.summary, "seconds"),
    );
    let (alone_rows, alone_seconds) = (field(&alone, "rows"), field(&alone, "seconds"));
    println!();
    println!(
        "  drain with prune ÷ mean of the drains without: {ratio:.2} (goal ≥ 0.90: {})",
        if ratio >= 0.9 { "met" } else { "missed" }
    );
    println!(
        "  prune beside the drain: {pruned:.0} rows in {seconds:.1} s = {:.0} rows/s (goal ≥ 5,000: {})",
        pruned / seconds,
        if pruned / seconds >= 5000.0 {
            "met"
        } else {
            "missed"
        }
    );
    println!(
        "  prune alone afterwards, unpaced (--pause 0 --max-rate 1000000): {alone_rows:.0} rows in {alone_seconds:.1} s = {:.0} rows/s",
        alone_rows / alone_seconds
    );
    println!(
        "  waits on prune's locks, sampled every 100 ms: {} seen, the longest {:.1} ms (goal: none over 100 ms: {}); worst apply with prune {} ms vs {} ms without",
        beside.waits_seen,
        beside.longest_wait_us as f64 / 1000.0,
        if beside.longest_wait_us <= 100_000 { "met" } else { "missed" },
        with.max,
        before.max.max(after.max)
    );
    println!(
        "  InnoDB history list length: {history_start} before the drain with prune, at most {} during it, {history_end} after",
        beside.history_max
    );
    println!("  prune's summary beside the drain: {}", beside.summary);
    println!("  prune's summary alone: {alone}");
    drop(orbit);
    drop(server);
}
