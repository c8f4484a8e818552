//! A backlog drained by the real `receiver consume` (release build) from a real `orbit-dev`,
//! against the same events applied straight through `Store` at the same concurrency, in the
//! same run, on the same server: events per second, their ratio, and what reached the
//! platform that should not have (deadlocks, second attempts).
//!
//! The backlog: `fixtures::load` (three versions and a duplicate per task, interleaved).
//!
//! Run with `make bench` (or `cargo build --release --bins && cargo bench -p conformance
//! --bench drain`). One run drains three backlogs, each on a platform and server of its own:
//! 2,000 deliveries at concurrency 4 (consume's default) and 16 (twice), and 20,000 at 16, whose rate
//! against the 2,000's shows whether a delivery's cost grows with the backlog.
//! The 2,000 at 16 run twice, with consume's default group size and with one delivery a
//! transaction (`RECEIVER_GROUP_MAX=1`). `DRAIN_BENCH_RUNS=2000@4,20000@16/1` picks others
//! (deliveries, a multiple of 4, @ the concurrency of both the consume and the direct run,
//! optionally / the group size). After each drain the ledger is checked
//! (every event one inbox row, views at the top version, `applied_events` right).
//!
//! The drain is watched by asking the platform's database every 100 ms whether one delivery is
//! left that is not ACKED (one index entry read), not by listing every delivery through the
//! API, which loaded the platform it measures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fixtures::process::Consumer;
use fixtures::{subscribed_receiver, QUEUE};
use result_inbox::{ConsumerName, QueueId, Store, StoreOptions, TaskEvent};
use sqlx::MySqlConnection;

fn main() {
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    let runs = std::env::var("DRAIN_BENCH_RUNS")
        .unwrap_or_else(|_| "2000@4,2000@16/1,2000@16,20000@16".into());
    let runs: Vec<(usize, usize, Option<usize>)> = runs
        .split(',')
        .map(|r| {
            let (r, group) = match r.split_once('/') {
                Some((r, g)) => (r, g.trim().parse().ok()),
                None => (r, None),
            };
            let parsed = r.split_once('@').and_then(|(n, c)| Some((n.trim().parse().ok()?, c.trim().parse().ok()?)));
            match parsed {
                Some((n, c)) if n % 4 == 0 && n > 0 && c > 0 => (n, c, group),
                _ => panic!("DRAIN_BENCH_RUNS: {r:?} is not DELIVERIES@CONCURRENCY[/GROUP] (deliveries a multiple of 4)"),
            }
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut results = Vec::new();
    for (deliveries, concurrency, group) in runs {
        results.push(rt.block_on(drain(deliveries / 4, concurrency, group)));
    }
    println!();
    println!("drain bench summary (events/s; per delivery from the server's counters):");
    println!("| deliveries | concurrency | group max | consume | direct | consume ÷ direct | receiver CPU ms | drain statements | drain commits | platform statements | platform commits | platform fsyncs | platform rows read | ledger |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.3} | {:.2} | {:.3} | {:.1} | {:.2} | {:.2} | {:.0} | {} |",
            r.deliveries,
            r.concurrency,
            r.group.map_or("default".to_owned(), |g| g.to_string()),
            r.drain_rate,
            r.direct_rate,
            r.drain_rate / r.direct_rate,
            r.receiver_cpu_ms,
            r.drain_statements,
            r.drain_commits,
            r.platform.statements,
            r.platform.commits,
            r.platform.fsyncs,
            r.platform.rows_read,
            r.ledger
        );
    }
    for grouped in results.iter().filter(|r| r.group != Some(1)) {
        for alone in results.iter().filter(|r| r.group == Some(1)) {
            if (grouped.deliveries, grouped.concurrency) == (alone.deliveries, alone.concurrency) {
                println!(
                    "  consume grouped ÷ one delivery a transaction, {} at concurrency {}: {:.2}",
                    grouped.deliveries,
                    grouped.concurrency,
                    grouped.drain_rate / alone.drain_rate
                );
            }
        }
    }
    for big in &results {
        for small in &results {
            if (big.concurrency, big.group) == (small.concurrency, small.group)
                && big.deliveries > small.deliveries
            {
                println!(
                    "  backlog {} ÷ backlog {} at concurrency {}: {:.2}",
                    big.deliveries,
                    small.deliveries,
                    big.concurrency,
                    big.drain_rate / small.drain_rate
                );
            }
        }
    }
}

/// One drain's figures.
struct Run {
    deliveries: usize,
    concurrency: usize,
    /// `RECEIVER_GROUP_MAX`, when the run set one.
    group: Option<usize>,
    /// The receiver's CPU time per delivery, in ms.
    receiver_cpu_ms: f64,
    /// Statements and commits per delivery during the drain (the platform's and the
    /// receiver's together).
    drain_statements: f64,
    drain_commits: f64,
    drain_rate: f64,
    direct_rate: f64,
    /// The platform's share per delivery (the drain's counts less the direct run's).
    platform: Counters,
    /// What the ledger found.
    ledger: String,
}

async fn drain(tasks: usize, concurrency: usize, group: Option<usize>) -> Run {
    let (orbit, client, sub, mut env) = subscribed_receiver(
        &["--enable-fault-api", "--window", "10000"],
        fixtures::load::LOAD_TYPES,
    )
    .await;

    let mut rng = fastrand::Rng::with_seed(0x5EED_D4A1);
    let produced = Instant::now();
    fixtures::load::produce(&orbit, &client, &sub.id, tasks, &mut rng, |_| {}).await;
    let deliveries = tasks * 4;
    println!(
        "drain bench: {deliveries} deliveries queued over {tasks} tasks in {:.1} s; draining with receiver consume at concurrency {concurrency}",
        produced.elapsed().as_secs_f64()
    );

    // The drain: from the consumer's "consuming" line to every delivery ACKED.
    env.push(("RECEIVER_CONCURRENCY", concurrency.to_string()));
    if let Some(group) = group {
        env.push(("RECEIVER_GROUP_MAX", group.to_string()));
    }
    let consumer = Consumer::normal(&env);
    while !consumer.output().contains("consuming") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (mut admin, mut platform) = orbit.connections().await;
    let drain_from = Counters::read(&mut admin).await;
    let pids = [consumer.pid(), orbit.pid()];
    let cpu_from = Cpu::read(pids);
    let started = Instant::now();
    fixtures::load::wait_drained(
        &mut platform,
        sub.id.as_str(),
        Duration::from_millis(100),
        Duration::from_secs(600),
    )
    .await;
    let drained = started.elapsed();
    let drain_counts = Counters::read(&mut admin).await.since(&drain_from);
    let cpu = Cpu::read(pids).since(&cpu_from);
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
    let apply_ms = fixtures::load::apply_durations_ms(&output);
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
    let direct_cpu_from = Cpu::read(pids);
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
    let direct_cpu = Cpu::read(pids).since(&direct_cpu_from);
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
    let ms = |ticks: f64| ticks * 1000.0 / Cpu::HZ / deliveries as f64;
    println!(
        "  CPU per delivery during the drain: receiver {:.3} ms, orbit-dev {:.3} ms, the rest of the machine (the server, the bench's watch) {:.3} ms; idle {:.3} ms of the {} cores' time",
        ms(cpu.procs[0]),
        ms(cpu.procs[1]),
        ms(cpu.busy - cpu.procs[0] - cpu.procs[1]),
        ms(cpu.idle),
        cpu.cores
    );
    println!(
        "  CPU per delivery during the direct run: the machine (the server, the bench's Store) {:.3} ms; idle {:.3} ms",
        ms(direct_cpu.busy - direct_cpu.procs[0] - direct_cpu.procs[1]),
        ms(direct_cpu.idle)
    );
    println!(
        "  reached the platform: {deadlocks} deadlocks, {not_acked} deliveries not ACKed, {second_attempts} second attempts; retries inside the apply: {retried}"
    );
    assert_eq!(deadlocks, 0, "a deadlock reached the platform");

    // The consume run's ledger (the direct run wrote under another consumer name, in the same
    // tables: its rows are taken out first).
    for table in ["receiver_inbox", "receiver_task_views"] {
        sqlx::query(&format!(
            "DELETE FROM {table} WHERE consumer_name = 'drain-direct'"
        ))
        .execute(&mut admin)
        .await
        .unwrap();
    }
    let ledger = fixtures::check_ledger_on(&mut admin, &mut platform, sub.id.as_str(), "drain")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ledger = format!(
        "0 violations ({} deliveries, {} events, {} stale)",
        ledger.deliveries, ledger.events, ledger.stale
    );
    println!("  ledger: {ledger}");
    let platform_share = all.since(&receiver_only);
    Run {
        deliveries,
        concurrency,
        group,
        receiver_cpu_ms: ms(cpu.procs[0]),
        drain_statements: all.statements,
        drain_commits: all.commits,
        drain_rate,
        direct_rate,
        platform: platform_share,
        ledger,
    }
}

/// Server-wide counters (`SHOW GLOBAL STATUS`): statements, commits and fsyncs.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    statements: f64,
    commits: f64,
    fsyncs: f64,
    rows_read: f64,
}

impl Counters {
    async fn read(admin: &mut MySqlConnection) -> Counters {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SHOW GLOBAL STATUS WHERE Variable_name IN \
             ('Questions', 'Com_commit', 'Innodb_os_log_fsyncs', 'Innodb_data_fsyncs', 'Innodb_rows_read', 'Rows_read')",
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
            // MariaDB counts rows read in `Rows_read`; MySQL in `Innodb_rows_read`.
            rows_read: get("Innodb_rows_read").max(get("Rows_read")),
        }
    }

    fn since(self, before: &Counters) -> Counters {
        Counters {
            statements: self.statements - before.statements,
            commits: self.commits - before.commits,
            fsyncs: self.fsyncs - before.fsyncs,
            rows_read: self.rows_read - before.rows_read,
        }
    }

    fn per(&self, n: usize) -> Counters {
        let n = n as f64;
        Counters {
            statements: self.statements / n,
            commits: self.commits / n,
            fsyncs: self.fsyncs / n,
            rows_read: self.rows_read / n,
        }
    }

    fn show(&self) -> String {
        format!(
            "{:.1} statements, {:.2} commits, {:.2} fsyncs, {:.0} rows read",
            self.statements, self.commits, self.fsyncs, self.rows_read
        )
    }
}

/// CPU time from `/proc`, in clock ticks: two processes', and the machine's busy and idle time.
struct Cpu {
    procs: [f64; 2],
    busy: f64,
    idle: f64,
    cores: usize,
}

impl Cpu {
    /// Linux's USER_HZ, the unit of `/proc`'s CPU times, on every architecture we run.
    const HZ: f64 = 100.0;

    fn read(pids: [u32; 2]) -> Cpu {
        let procs = pids.map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // After the command name's closing parenthesis: field 3 is the first; utime and
            // stime are fields 14 and 15.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<f64> = rest
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)
        });
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cores = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count();
        let total: Vec<f64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal
        let idle = total.get(3).copied().unwrap_or(0.0) + total.get(4).copied().unwrap_or(0.0);
        let busy = total.iter().take(8).sum::<f64>() - idle;
        Cpu {
            procs,
            busy,
            idle,
            cores,
        }
    }

    fn since(self, before: &Cpu) -> Cpu {
        Cpu {
            procs: [
                self.procs[0] - before.procs[0],
                self.procs[1] - before.procs[1],
            ],
            busy: self.busy - before.busy,
            idle: self.idle - before.idle,
            cores: self.cores,
        }
    }
}
