//! The soak (`make soak`; not part of `make test`): 100,000 deliveries through the real
//! `receiver consume` (release build) from a real `orbit-dev`, made while the receiver
//! consumes (`fixtures::load`: three versions and a duplicate per task; older versions
//! arrive late when handlers overtake each other), and then 1,000 older versions sent late on
//! purpose (orbit-dev's `forge-event`: version 1 again under a new id, for tasks at their top
//! version), each of which must be recorded as stale. Once a second it samples the resident set
//! and the open file descriptors of both processes; at the end it checks the ledger and
//! reports each process's growth after warm-up and its slope (least squares, per minute).
//! It fails when the receiver's or the platform's resident set grows by 10 MB or more after
//! warm-up, or their descriptors do not stay flat (within 8 of the warm-up's), or the ledger
//! finds anything wrong.
//!
//! `SOAK_DELIVERIES=N` (a multiple of 4; 100,000 by default), `SOAK_CONCURRENCY=N` (consume's,
//! 4 by default), `SOAK_STALE=N` (the older versions sent late; 1,000 by default).

use std::time::{Duration, Instant};

use fixtures::load::{produce, DELIVERIES_PER_TASK, LOAD_TYPES};
use fixtures::process::Consumer;
use fixtures::subscribed_receiver;
use sqlx::{Connection, MySqlConnection};

/// Samples before this are the warm-up (pools filling, caches growing to their size).
const WARM_UP: Duration = Duration::from_secs(30);
/// The most the resident set may grow after warm-up.
const RSS_LIMIT_KB: i64 = 10 * 1024;
/// How far the open descriptors may move from the warm-up's count.
const FD_SLACK: i64 = 8;

/// One sample of one process.
#[derive(Clone, Copy)]
struct Sample {
    at: f64,
    rss_kb: i64,
    fds: i64,
}

fn sample(pid: u32, at: f64) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as i64;
    Some(Sample { at, rss_kb, fds })
}

/// The least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

/// What one process did after warm-up; `Err` names a target it missed.
fn report(name: &str, samples: &[Sample]) -> Result<String, String> {
    let after: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|s| s.at >= WARM_UP.as_secs_f64())
        .collect();
    let (Some(first), Some(last)) = (after.first(), after.last()) else {
        return Err(format!("{name}: no sample after the warm-up"));
    };
    let peak = after.iter().map(|s| s.rss_kb).max().unwrap_or(0);
    let growth = peak - first.rss_kb;
    let rss_slope = slope(
        &after
            .iter()
            .map(|s| (s.at / 60.0, s.rss_kb as f64 / 1024.0))
            .collect::<Vec<_>>(),
    );
    let fd_slope = slope(
        &after
            .iter()
            .map(|s| (s.at / 60.0, s.fds as f64))
            .collect::<Vec<_>>(),
    );
    let (fd_min, fd_max) = (
        after.iter().map(|s| s.fds).min().unwrap_or(0),
        after.iter().map(|s| s.fds).max().unwrap_or(0),
    );
    let line = format!(
        "{name}: RSS {:.1} MB after warm-up, peak {:.1} MB, end {:.1} MB: growth {:.2} MB, slope {rss_slope:+.3} MB/min; open FDs {} after warm-up, {fd_min}..{fd_max}, end {}, slope {fd_slope:+.2}/min",
        first.rss_kb as f64 / 1024.0,
        peak as f64 / 1024.0,
        last.rss_kb as f64 / 1024.0,
        growth as f64 / 1024.0,
        first.fds,
        last.fds
    );
    if growth >= RSS_LIMIT_KB {
        return Err(format!("{line}: the resident set grew by 10 MB or more"));
    }
    if (fd_max - first.fds).abs() > FD_SLACK || (first.fds - fd_min).abs() > FD_SLACK {
        return Err(format!("{line}: the open descriptors did not stay flat"));
    }
    Ok(line)
}

fn knob(name: &str, default: usize) -> usize {
    #[allow(clippy::disallowed_methods)] // a bench knob, not receiver configuration
    let value = std::env::var(name).ok();
    match value {
        None => default,
        Some(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {v:?} is not a whole number")),
    }
}

fn main() {
    let deliveries = knob("SOAK_DELIVERIES", 100_000);
    let concurrency = knob("SOAK_CONCURRENCY", receiver::config::DEFAULT_CONCURRENCY);
    let stale = knob("SOAK_STALE", 1_000);
    assert!(
        deliveries % DELIVERIES_PER_TASK == 0 && deliveries > 0,
        "SOAK_DELIVERIES: {deliveries} is not a positive multiple of 4"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    assert!(
        stale <= deliveries / DELIVERIES_PER_TASK,
        "SOAK_STALE: {stale} is more than the {} tasks",
        deliveries / DELIVERIES_PER_TASK
    );
    rt.block_on(soak(deliveries / DELIVERIES_PER_TASK, concurrency, stale));
}

async fn soak(tasks: usize, concurrency: usize, stale: usize) {
    let (orbit, client, sub, mut env) =
        subscribed_receiver(&["--enable-fault-api", "--window", "10000"], LOAD_TYPES).await;
    env.push(("RECEIVER_CONCURRENCY", concurrency.to_string()));
    let deliveries = tasks * DELIVERIES_PER_TASK;
    let consumer = Consumer::normal(&env);
    while !consumer.output().contains("consuming") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "soak: {deliveries} deliveries over {tasks} tasks, made while receiver consume (concurrency {concurrency}) drains them; sampling RSS and open FDs every second"
    );
    let (receiver_pid, orbit_pid) = (consumer.pid(), orbit.pid());
    let started = Instant::now();
    let sampler = tokio::spawn(async move {
        let mut samples = (Vec::new(), Vec::new());
        loop {
            let at = started.elapsed().as_secs_f64();
            match (sample(receiver_pid, at), sample(orbit_pid, at)) {
                (Some(r), Some(o)) => {
                    samples.0.push(r);
                    samples.1.push(o);
                }
                _ => return samples,
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });

    let mut rng = fastrand::Rng::with_seed(0x50A4_5EED);
    let step = (deliveries / 10).max(1);
    produce(&orbit, &client, &sub.id, tasks, &mut rng, |made| {
        if made % step == 0 {
            println!(
                "  {:>3.0} s: {made} of {deliveries} deliveries made",
                started.elapsed().as_secs_f64()
            );
        }
    })
    .await;
    let mut platform = MySqlConnection::connect(orbit.db.platform_url().expose())
        .await
        .unwrap();
    println!(
        "  {:.0} s: every task made; waiting for the last deliveries to be ACKED",
        started.elapsed().as_secs_f64()
    );
    fixtures::load::wait_drained(
        &mut platform,
        sub.id.as_str(),
        Duration::from_millis(200),
        Duration::from_secs(1800),
    )
    .await;
    // Older versions arriving late, which the receiver must record as stale without moving a
    // view back: for `stale` tasks already at their top version, an event of version 1 under
    // a new id (orbit-dev's `forge-event`).
    let keys: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT MIN(id) FROM orbit_events \
         WHERE CAST(JSON_VALUE(body, '$.task_version') AS UNSIGNED) >= 2 GROUP BY task_id LIMIT ?",
    )
    .bind(stale as u64)
    .fetch_all(&mut platform)
    .await
    .unwrap();
    let mut forged = Vec::with_capacity(keys.len());
    for key in &keys {
        let key = String::from_utf8(key.clone()).unwrap();
        let reply = orbit.fault(
            serde_json::json!({"fault": "forge-event", "event_id": key, "keep_id": false, "task_version": 1}),
        );
        forged.push(reply["event_id"].as_str().expect("a forged id").to_owned());
    }
    println!(
        "  {:.0} s: {} older versions (version 1 again, new ids) sent late; waiting for them to be ACKED",
        started.elapsed().as_secs_f64(),
        forged.len()
    );
    fixtures::load::wait_drained(
        &mut platform,
        sub.id.as_str(),
        Duration::from_millis(200),
        Duration::from_secs(600),
    )
    .await;
    let took = started.elapsed();
    let output = consumer.stop().await;
    let (receiver_samples, orbit_samples) = sampler.await.unwrap();
    println!(
        "  {deliveries} deliveries in {:.0} s ({:.0}/s, the making included)",
        took.as_secs_f64(),
        deliveries as f64 / took.as_secs_f64()
    );
    let not_acked = output.lines().filter(|l| l.contains("not acked")).count();
    println!("  deliveries not ACKed at some attempt: {not_acked}");

    let mut admin = MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    let ledger = fixtures::check_ledger_on(&mut admin, &mut platform, sub.id.as_str(), "soak")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "  ledger: 0 violations ({} deliveries, {} events, {} stale)",
        ledger.deliveries, ledger.events, ledger.stale
    );
    assert_eq!(
        ledger.deliveries,
        deliveries + forged.len(),
        "every delivery made"
    );
    let marks = vec!["?"; forged.len()].join(", ");
    let sql =
        format!("SELECT COUNT(*) FROM receiver_inbox WHERE applied = 0 AND event_id IN ({marks})");
    let mut query = sqlx::query_scalar::<_, i64>(&sql);
    for id in &forged {
        query = query.bind(id);
    }
    let forged_stale = query.fetch_one(&mut admin).await.unwrap();
    println!(
        "  late older versions recorded as stale: {forged_stale} of {}",
        forged.len()
    );
    assert_eq!(
        forged_stale as usize,
        forged.len(),
        "every older version sent late is recorded and not applied"
    );
    let mut failed = Vec::new();
    for (name, samples) in [
        ("receiver consume", &receiver_samples),
        ("orbit-dev", &orbit_samples),
    ] {
        match report(name, samples) {
            Ok(line) => println!("  {line}"),
            Err(line) => {
                println!("  {line}");
                failed.push(line);
            }
        }
    }
    assert!(failed.is_empty(), "the soak missed: {failed:?}");
}
