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
//! next `group` events at once.
//!
//! Then the path users run: the release `receiver consume` at concurrency 16 drains a backlog
//! (`fixtures::load`, `GROUP_BENCH_DRAIN` deliveries, 6,000 by default) from a real
//! `orbit-dev` whose database is on a server of its own, into a fresh database on the durable
//! server, which only the receiver uses; with `RECEIVER_GROUP_MAX=1` and with the default, in
//! the same run. Each drain's events a second, apply time p50 and p99 (each delivery's
//! `duration_ms`), the server's counters and CPU time per event, the receiver's and the
//! platform's CPU time per event, and the ledger. Then the same at low load: 100 deliveries a
//! second for 20 seconds, against a receiver that waits for each; the backlog again with
//! commit-proxy dropping the OK to one COMMIT in a hundred; then the backlog into a
//! semi-synchronous primary with one replica and the gate on, and into one node of a
//! three-node Galera cluster.
//!
//! Run with `make bench` (or `cargo build --release --bins && cargo bench -p conformance
//! --bench group`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fixtures::process::Consumer;
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

impl Counters {
    /// Statements, commits, fsyncs and binary log group commits per event since `before`, for
    /// `n` events (the counter read itself is one statement).
    fn per_event(&self, before: &Counters, n: f64) -> [f64; 4] {
        [
            (self.questions - before.questions - 1.0) / n,
            (self.commits - before.commits) / n,
            (self.fsyncs - before.fsyncs) / n,
            (self.binlog_commits - before.binlog_commits) / n,
        ]
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
        per_event: after.per_event(&before, n),
        cpu_per_event: (after.cpu - before.cpu).div_f64(n),
    }
}

/// One drain by `receiver consume`.
struct Drained {
    concurrency: usize,
    group: usize,
    /// COMMIT answers commit-proxy dropped.
    dropped: u64,
    deliveries: usize,
    per_second: f64,
    apply_ms: Vec<u64>,
    per_event: [f64; 4],
    server_cpu: Duration,
    receiver_cpu: Duration,
    platform_cpu: Duration,
    /// The platform's database server's (the shared test server's).
    platform_server_cpu: Duration,
    /// Mean group size and fallbacks by cause, from consume's own metrics.
    groups: String,
    ledger: String,
}

/// `receiver consume` at concurrency 16 and group size `group`, on a fresh database of
/// `server` (the receiver's alone), from a platform on a server of its own: a backlog of
/// `tasks` tasks produced before it starts (`pace` `None`), or `pace` tasks a second (submitted,
/// then started: two deliveries each) while it runs.
async fn consume_drain(server: &testdb::Server, load: Load) -> Drained {
    let db = server.provision().await.unwrap();
    fixtures::initialise(&db).await;
    drain_into(&db, server.pid(), load, &[]).await
}

/// What one drain by `receiver consume` is given.
#[derive(Debug, Clone, Copy)]
struct Load {
    tasks: usize,
    /// `RECEIVER_CONCURRENCY`.
    concurrency: usize,
    group: usize,
    /// `None`: a backlog made before consume starts; otherwise tasks a second while it runs.
    pace: Option<u32>,
    /// commit-proxy in front of the server drops the OK to one COMMIT in this many (re-armed
    /// once a hundred more commits were counted), under 3 s leases: each group whose answer is
    /// lost comes back as duplicates.
    drop_one_in: Option<u64>,
}

impl Load {
    fn backlog(tasks: usize, group: usize) -> Load {
        Load {
            tasks,
            concurrency: 16,
            group,
            pace: None,
            drop_one_in: None,
        }
    }
}

/// Drops the OK to one COMMIT of `one_in` through `proxy`, counting commits on `counter`,
/// until `stop`; how many were dropped.
async fn drop_commit_oks(
    proxy: &commit_proxy::Proxy,
    counter: &mut MySqlConnection,
    one_in: u64,
    stop: &std::sync::atomic::AtomicBool,
) -> u64 {
    use commit_proxy::{Action, RuleSpec};
    let mut dropped = 0;
    while !stop.load(Ordering::SeqCst) {
        let rule = proxy
            .arm(RuleSpec::new(Action::DropCommitOk).once())
            .unwrap();
        while !stop.load(Ordering::SeqCst) {
            if rule.fired_within(Duration::from_millis(50)).await.is_some() {
                dropped += 1;
                break;
            }
        }
        let from = commits(counter).await;
        while !stop.load(Ordering::SeqCst) && commits(counter).await < from + one_in {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    dropped
}

/// The server's `Com_commit`.
async fn commits(c: &mut MySqlConnection) -> u64 {
    let row = sqlx::query("SHOW GLOBAL STATUS LIKE 'Com_commit'")
        .fetch_one(c)
        .await
        .unwrap();
    row.get::<String, _>(1).parse::<u64>().unwrap()
}

/// [`consume_drain`] into `db` (initialised), whose server's process is `pid`, with `extra`
/// in consume's environment.
async fn drain_into(
    db: &testdb::Provisioned,
    pid: Option<u32>,
    load: Load,
    extra: &[(&'static str, String)],
) -> Drained {
    let Load {
        tasks,
        concurrency,
        group,
        pace,
        drop_one_in,
    } = load;
    let mut admin = MySqlConnection::connect(db.admin_receiver_url().expose())
        .await
        .unwrap();
    let mut platform_args = vec!["--enable-fault-api", "--window", "10000"];
    if drop_one_in.is_some() {
        platform_args.extend(["--lease-seconds", "3"]);
    }
    let (orbit, client, sub, env) =
        fixtures::subscribed_receiver(&platform_args, fixtures::load::LOAD_TYPES).await;
    let mut rng = fastrand::Rng::with_seed(0x5EED_6A0B);
    if pace.is_none() {
        fixtures::load::produce(&orbit, &client, &sub.id, tasks, &mut rng, |_| {}).await;
    }
    let mut env: Vec<(&str, String)> = env
        .into_iter()
        .filter(|(k, _)| *k != "ORBIT_RECEIVER_DSN")
        .collect();
    let proxy = match drop_one_in {
        Some(_) => Some(
            commit_proxy::Proxy::start("127.0.0.1:0", db.address())
                .await
                .unwrap(),
        ),
        None => None,
    };
    let dsn = db.runtime_url().expose().to_owned();
    let dsn = match &proxy {
        Some(p) => dsn.replace(db.address(), &p.local_addr().to_string()),
        None => dsn,
    };
    env.push(("ORBIT_RECEIVER_DSN", dsn));
    env.push(("RECEIVER_CONCURRENCY", concurrency.to_string()));
    env.push(("RECEIVER_GROUP_MAX", group.to_string()));
    env.push(("RECEIVER_METRICS_LISTEN", "127.0.0.1:0".to_owned()));
    env.extend(extra.iter().cloned());
    let consumer = Consumer::normal(&env);
    while !consumer.output().contains("consuming") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (_, mut platform) = orbit.connections().await;
    let before = Counters::read(&mut admin, pid).await;
    let (receiver_from, platform_from) = (cpu_of(consumer.pid()), cpu_of(orbit.pid()));
    let platform_server = testdb::Server::shared()
        .ok()
        .and_then(|s| s.pid())
        .expect("the platform's database server is a local process");
    let platform_server_from = cpu_of(platform_server);
    let started = Instant::now();
    if let Some(per_second) = pace {
        let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
        for _ in 0..tasks {
            tick.tick().await;
            let task = client.submit_task(fixtures::QUEUE, None).await.unwrap();
            client.report_task(&task.id, "RUNNING", None).await.unwrap();
        }
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut counter = MySqlConnection::connect(db.admin_receiver_url().expose())
        .await
        .unwrap();
    let dropping = async {
        match (&proxy, drop_one_in) {
            (Some(p), Some(n)) => drop_commit_oks(p, &mut counter, n, &stop).await,
            _ => 0,
        }
    };
    let drained = async {
        fixtures::load::wait_drained(
            &mut platform,
            sub.id.as_str(),
            Duration::from_millis(20),
            Duration::from_secs(600),
        )
        .await;
        stop.store(true, Ordering::SeqCst);
    };
    let (dropped, ()) = tokio::join!(dropping, drained);
    let elapsed = started.elapsed();
    let after = Counters::read(&mut admin, pid).await;
    let receiver_cpu = cpu_of(consumer.pid()) - receiver_from;
    let platform_cpu = cpu_of(orbit.pid()) - platform_from;
    let platform_server_cpu = cpu_of(platform_server) - platform_server_from;
    let groups = group_summary(&consumer.metrics_addr().await);
    let output = consumer.stop().await;
    let ledger = fixtures::check_ledger_on(&mut admin, &mut platform, sub.id.as_str(), "group")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let deliveries = ledger.deliveries;
    let n = deliveries as f64;
    Drained {
        concurrency,
        group,
        dropped,
        deliveries,
        per_second: n / elapsed.as_secs_f64(),
        apply_ms: fixtures::load::apply_durations_ms(&output),
        per_event: after.per_event(&before, n),
        server_cpu: (after.cpu - before.cpu).div_f64(n),
        receiver_cpu: receiver_cpu.div_f64(n),
        platform_cpu: platform_cpu.div_f64(n),
        platform_server_cpu: platform_server_cpu.div_f64(n),
        groups,
        ledger: format!(
            "0 violations ({} deliveries, {} events)",
            ledger.deliveries, ledger.events
        ),
    }
}

/// From consume's metrics at `addr`: the mean group size over its groups, and the groups that
/// fell back, by cause (those that did).
fn group_summary(addr: &str) -> String {
    let (status, text) = fixtures::http_raw(addr, "GET", "/metrics", None, None);
    assert_eq!(status, 200, "{text}");
    let sample = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    };
    let (sum, count) = (
        sample("receiver_group_size_sum"),
        sample("receiver_group_size_count"),
    );
    let fallbacks: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("receiver_group_fallbacks_total{reason=\"")?;
            let (reason, value) = rest.split_once("\"} ")?;
            let n: f64 = value.parse().ok()?;
            (n > 0.0).then(|| format!("{reason} {n}"))
        })
        .collect();
    match count {
        0.0 => "no groups".to_owned(),
        _ => format!(
            "{count} groups of {:.1}; fallbacks: {}",
            sum / count,
            if fallbacks.is_empty() {
                "none".to_owned()
            } else {
                fallbacks.join(", ")
            }
        ),
    }
}

/// The drains' table: one row each, and each against the first (group 1).
fn print_drains(what: &str, drains: &[Drained]) {
    println!();
    println!("group bench: {what}");
    println!("| concurrency | group max | deliveries | COMMIT answers dropped | events/s | ÷ group 1 | apply p50 ms | p99 ms | statements | commits | InnoDB fsyncs | binlog group commits | server CPU µs | ÷ group 1 | receiver CPU µs | platform CPU µs | its server's µs | groups | ledger |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let base = &drains[0];
    for d in drains {
        let pct = |p: f64| {
            d.apply_ms
                .get(((d.apply_ms.len() as f64 * p) as usize).min(d.apply_ms.len().max(1) - 1))
                .copied()
                .unwrap_or(0)
        };
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.2} | {} | {} | {:.2} | {:.3} | {:.3} | {:.3} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} | {} | {} |",
            d.concurrency,
            d.group,
            d.deliveries,
            d.dropped,
            d.per_second,
            d.per_second / base.per_second,
            pct(0.50),
            pct(0.99),
            d.per_event[0],
            d.per_event[1],
            d.per_event[2],
            d.per_event[3],
            d.server_cpu.as_secs_f64() * 1e6,
            d.server_cpu.as_secs_f64() / base.server_cpu.as_secs_f64(),
            d.receiver_cpu.as_secs_f64() * 1e6,
            d.platform_cpu.as_secs_f64() * 1e6,
            d.platform_server_cpu.as_secs_f64() * 1e6,
            d.groups,
            d.ledger
        );
    }
    // Where the platform costs nothing, the receiver and its server bound the rate: the ratio
    // of their CPU per delivery is what grouping would give.
    let own = |d: &Drained| (d.server_cpu + d.receiver_cpu).as_secs_f64();
    for d in &drains[1..] {
        println!(
            "  concurrency {}, group max {}: without the platform's share, events/s ÷ the first row would be {:.2} (the receiver and its server: {:.0} against {:.0} µs a delivery)",
            d.concurrency,
            d.group,
            own(base) / own(d),
            own(d) * 1e6,
            own(base) * 1e6
        );
    }
}

fn main() {
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    let drain: usize = std::env::var("GROUP_BENCH_DRAIN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6000);
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    let ops: usize = std::env::var("GROUP_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3200);
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    let only = std::env::var("GROUP_BENCH_ONLY").unwrap_or_default();
    // The sections to run (`GROUP_BENCH_ONLY`, comma-separated; all when unset).
    let part = |name: &str| only.is_empty() || only.split(',').any(|p| p.trim() == name);
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
        for concurrency in [4usize, 16].into_iter().filter(|_| part("store")) {
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
        store.close().await;
        let mut drains = Vec::new();
        if part("consume") {
            for group in [1, 16] {
                drains.push(consume_drain(&server, Load::backlog(drain / 4, group)).await);
            }
            print_drains(
                "receiver consume at concurrency 16 draining a backlog, on this server of its own (the platform on another)",
                &drains,
            );
        }
        // The curve: consume by concurrency and group size.
        for concurrency in [4, 16].into_iter().filter(|_| part("curve")) {
            let mut curve = Vec::new();
            for group in [1, 4, 16, 64] {
                let load = Load {
                    concurrency,
                    ..Load::backlog(drain / 4, group)
                };
                curve.push(consume_drain(&server, load).await);
            }
            print_drains(
                &format!("receiver consume at concurrency {concurrency} draining the backlog, by group size"),
                &curve,
            );
        }
        if part("lossy") {
            let mut lossy = Vec::new();
            for group in [1, 16] {
                let load = Load {
                    drop_one_in: Some(100),
                    ..Load::backlog(drain / 4, group)
                };
                lossy.push(consume_drain(&server, load).await);
            }
            print_drains(
                "the same backlog with commit-proxy dropping the OK to one COMMIT in a hundred (3 s leases: each lost answer's deliveries come back as duplicates)",
                &lossy,
            );
        }
        if part("low") {
            let mut low = Vec::new();
            for group in [1, 16] {
                let load = Load {
                    pace: Some(50),
                    ..Load::backlog(1000, group)
                };
                low.push(consume_drain(&server, load).await);
            }
            print_drains(
                "receiver consume at concurrency 16, 100 deliveries a second for 20 s (50 tasks a second, submitted and started)",
                &low,
            );
        }
        // The same backlog into a semi-synchronous primary with one replica, the gate on.
        if part("semisync") {
            let topology = tokio::task::spawn_blocking(|| {
                testdb::Topology::start(testdb::ReplicationOptions {
                    replicas: 1,
                    ..testdb::ReplicationOptions::default()
                })
            })
            .await
            .unwrap()
            .expect("a primary and a replica");
            let primary = topology.member(topology.primary());
            let mut gated = Vec::new();
            // Then concurrency 32: twice the deliveries held for each commit's round trip.
            for (concurrency, group) in [(16, 1), (16, 16), (32, 16)] {
                let db = primary.provision().await.unwrap();
                fixtures::initialise(&db).await;
                topology
                    .wait_caught_up(Duration::from_secs(30))
                    .await
                    .unwrap();
                let gate = [("RECEIVER_REQUIRE_REPLICA_ACK", "1".to_owned())];
                let load = Load {
                    concurrency,
                    ..Load::backlog(drain / 4, group)
                };
                gated.push(drain_into(&db, primary.pid(), load, &gate).await);
            }
            let mut admin = topology.admin(topology.primary()).await.unwrap();
            let settings = sqlx::query(
                "SELECT @@rpl_semi_sync_master_enabled, @@rpl_semi_sync_master_wait_point, \
                 @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@binlog_format",
            )
            .fetch_one(&mut admin)
            .await
            .unwrap();
            print_drains(
                &format!(
                    "the same backlog into a semi-synchronous primary (one replica acknowledging; rpl_semi_sync_master_enabled={}, wait point {}, innodb_flush_log_at_trx_commit={}, sync_binlog={}, binlog_format={}), RECEIVER_REQUIRE_REPLICA_ACK=1",
                    settings.get::<i64, _>(0),
                    settings.get::<String, _>(1),
                    settings.get::<u32, _>(2),
                    settings.get::<u32, _>(3),
                    settings.get::<String, _>(4),
                ),
                &gated,
            );
            for g in &gated {
                // Against the one server's drain at concurrency 16 and the same group size.
                if let Some(one) = drains.iter().find(|d| d.group == g.group) {
                    println!(
                        "  concurrency {}, group max {}: the semi-synchronous primary with the gate ÷ the one server at concurrency {}: {:.2}",
                        g.concurrency,
                        g.group,
                        one.concurrency,
                        g.per_second / one.per_second
                    );
                }
            }
            drop(topology);
        }
        // The same backlog into one node of a three-node Galera cluster (each COMMIT
        // certified by all three).
        if part("galera") {
            let cluster = tokio::task::spawn_blocking(|| testdb::Cluster::start(3))
                .await
                .unwrap()
                .expect("a three-node Galera cluster (galera-4)");
            let node = cluster.node(0);
            let mut certified = Vec::new();
            for group in [1, 16] {
                let db = node.provision().await.unwrap();
                fixtures::initialise(&db).await;
                let load = Load::backlog(drain / 4, group);
                certified.push(drain_into(&db, node.pid(), load, &[]).await);
            }
            let mut admin = MySqlConnection::connect(node.admin_url().expose())
                .await
                .unwrap();
            let settings = sqlx::query(
                "SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin, \
                 (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
                  WHERE VARIABLE_NAME = 'wsrep_cluster_size')",
            )
            .fetch_one(&mut admin)
            .await
            .unwrap();
            print_drains(
                &format!(
                    "the same backlog into one node of a Galera cluster of {} (innodb_flush_log_at_trx_commit={}, sync_binlog={}, log_bin={}; durability by replication to every node)",
                    settings.get::<String, _>(3),
                    settings.get::<u32, _>(0),
                    settings.get::<u32, _>(1),
                    settings.get::<i64, _>(2),
                ),
                &certified,
            );
        }
    });
}
