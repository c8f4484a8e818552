//! `receiver migrate`'s real step (the `received_at` index, `ALGORITHM=INPLACE, LOCK=NONE`) on
//! an inbox of a million rows made before the index (schema version 1), alone and beside a
//! full-speed `receiver consume` (release builds, one server). Same run, same server, same
//! platform: three backlogs drained at concurrency 16, the middle one with `receiver migrate`
//! started beside it; the ratio is the middle drain's rate to the mean of the two around it.
//!
//! Reported: the step's time alone and beside the drain (from migrate's own summary), each
//! drain's rate and apply times (p50, p99, max, from consume's own lines).
//!
//! Run with `make bench-migrate` (about 5 minutes; most of it writing the rows).
//! `MIGRATE_BENCH_ROWS` (1,000,000), `MIGRATE_BENCH_BYTES` (1,024 bytes of frozen event a row)
//! and `MIGRATE_BENCH_TASKS` (10,000 tasks, 40,000 deliveries a drain) pick others.

use std::time::{Duration, Instant};

use fixtures::process::Consumer;
use fixtures::QUEUE;
use sqlx::{Connection, Executor, MySqlConnection};

/// A buffer pool larger than the million rows, as a server sized for its data has.
const SERVER_ARGS: &str = "--innodb-buffer-pool-size=2G";

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
    let rows = knob("MIGRATE_BENCH_ROWS", 1_000_000);
    let bytes = knob("MIGRATE_BENCH_BYTES", 1024);
    let tasks = knob("MIGRATE_BENCH_TASKS", 10_000);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(rows, bytes, tasks));
}

/// Back to schema version 1: no index, no ledger.
async fn unmigrate(admin: &mut MySqlConnection) {
    for s in [
        "ALTER TABLE receiver_inbox DROP INDEX receiver_inbox_received_at",
        "DROP TABLE IF EXISTS receiver_schema_versions, receiver_schema_lock",
    ] {
        admin
            .execute(s)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
}

/// `receiver migrate` as the init account, started.
fn start_migrate(orbit: &fixtures::OrbitDev) -> std::process::Child {
    let mut cmd = fixtures::bare_command(&fixtures::receiver_bin());
    cmd.arg("migrate")
        .env("ORBIT_RECEIVER_DSN", orbit.db.init_url().expose())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    fixtures::spawn(cmd)
}

/// The step's seconds, from migrate's last line.
fn seconds(out: std::process::Output) -> f64 {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "migrate failed: {text}");
    assert!(text.contains("applied step 2"), "{text}");
    text.lines()
        .last()
        .and_then(|l| l.split(' ').find_map(|t| t.strip_prefix("seconds=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no seconds= in {text}"))
}

struct Drain {
    rate: f64,
    p50: u64,
    p99: u64,
    max: u64,
    migrate_seconds: Option<f64>,
}

async fn drain(
    orbit: &fixtures::OrbitDev,
    client: &orbit_sdk::Client,
    sub: &orbit_sdk::SubscriptionId,
    env: &[(&'static str, String)],
    tasks: usize,
    seed: u64,
    migrate_beside: bool,
) -> Drain {
    let mut rng = fastrand::Rng::with_seed(seed);
    fixtures::load::produce(orbit, client, sub, tasks, &mut rng, |_| {}).await;
    let (_, mut platform) = orbit.connections().await;
    let mut env = env.to_vec();
    env.push(("RECEIVER_CONCURRENCY", "16".into()));
    let consumer = Consumer::normal(&env);
    while !consumer.output().contains("consuming") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = Instant::now();
    let migrate = migrate_beside.then(|| start_migrate(orbit));
    fixtures::load::wait_drained(
        &mut platform,
        sub.as_str(),
        Duration::from_millis(100),
        Duration::from_secs(900),
    )
    .await;
    let drained = started.elapsed();
    let output = consumer.stop().await;
    let migrate_seconds = migrate.map(|m| seconds(m.wait_with_output().unwrap()));
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
        migrate_seconds,
    }
}

async fn run(rows: usize, bytes: usize, tasks: usize) {
    let args: Vec<String> = SERVER_ARGS.split_whitespace().map(str::to_owned).collect();
    let server = testdb::Server::local_with_args(args).expect("a local server");
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
    println!(
        "migrate bench: {rows} inbox rows of {bytes} bytes written in {:.0} s",
        made.elapsed().as_secs_f64()
    );

    unmigrate(&mut admin).await;
    let alone = seconds(start_migrate(&orbit).wait_with_output().unwrap());
    unmigrate(&mut admin).await;

    let before = drain(&orbit, &client, &sub.id, &env, tasks, 1, false).await;
    let with = drain(&orbit, &client, &sub.id, &env, tasks, 2, true).await;
    let after = drain(&orbit, &client, &sub.id, &env, tasks, 3, false).await;

    println!();
    println!(
        "migrate bench summary ({} deliveries a drain, receiver consume at concurrency 16; the step: ALTER TABLE receiver_inbox ADD INDEX receiver_inbox_received_at …, ALGORITHM = INPLACE, LOCK = NONE):",
        tasks * 4
    );
    println!("| drain | events/s | apply p50 ms | apply p99 ms | apply max ms |");
    println!("|---|---|---|---|---|");
    for (name, d) in [
        ("before (version 1: no index)", &before),
        ("with migrate beside", &with),
        ("after (version 2: the index)", &after),
    ] {
        println!(
            "| {name} | {:.0} | {} | {} | {} |",
            d.rate, d.p50, d.p99, d.max
        );
    }
    let ratio = with.rate / ((before.rate + after.rate) / 2.0);
    println!();
    println!("  the step alone: {alone:.1} s on {rows} rows");
    println!(
        "  the step beside the drain: {:.1} s",
        with.migrate_seconds.unwrap_or(0.0)
    );
    println!("  drain with migrate ÷ mean of the drains without: {ratio:.2}");
    drop(orbit);
    drop(server);
}
