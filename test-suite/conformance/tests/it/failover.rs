//! Failover on primary/replica MySQL (R-DIST-4 to R-DIST-6): `receiver consume`, two processes under one
//! `RECEIVER_NAME`, drains a paced load (three versions a task, older ones arriving late, and
//! redeliveries) through one address that follows the primary (`testdb::Forwarder`, standing
//! for a virtual IP or a proxy), while the topology (`testdb::Topology`: a primary and two
//! replicas, GTID, semi-sync as each test asks) fails over under it. The consumers are never
//! restarted: they must find the new primary by themselves.
//!
//! - With lossless semi-sync (`AFTER_SYNC`) and the durability gate
//!   (`RECEIVER_REQUIRE_REPLICA_ACK=1`): the primary killed mid-load and the most advanced
//!   replica promoted (the old primary rebuilt, never re-attached); a clean switchover with the
//!   old primary demoted to read-only while the consumers hold connections to it; every
//!   replica's IO thread stopped until semi-sync falls back, during which nothing is ACKed.
//!   At the end the ledger on the final primary is clean: no ACKed event lost.
//! - With asynchronous replication and the replicas held back, the same kill loses ACKed
//!   events, and the suite counts them: it proves it can see a loss.
//! - The gate refuses, with one line, a server on which it cannot be honoured.
//!
//! `make failover SEED=… MINUTES=…` runs the first schedule at random for longer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fixtures::load::{produce, LOAD_TYPES};
use fixtures::process::Consumer;
use fixtures::{OrbitDev, QUEUE};
use sqlx::{Connection, MySqlConnection};
use testdb::{Provisioned, ReplicationOptions, Topology};

/// The platform's side: the platform, a client and the subscription to the load.
struct Platform {
    orbit: OrbitDev,
    client: orbit_sdk::Client,
    sub: orbit_sdk::wire::Subscription,
}

/// The database's side: the topology and the receiver's database on it.
struct Databases {
    topology: Topology,
    db: Provisioned,
}

/// The platform's settings: leases long enough for a promotion, a budget no run spends.
const PLATFORM: &[&str] = &[
    "--enable-fault-api",
    "--lease-seconds",
    "10",
    "--max-attempts",
    "100",
];

/// A topology with the receiver's database on it, a platform with a subscription to the
/// load, and the environment `receiver consume` needs, its DSN pointing at the forwarder.
async fn rig(
    options: ReplicationOptions,
    gate: bool,
) -> (Databases, Platform, Vec<(&'static str, String)>) {
    let topology = tokio::task::spawn_blocking(move || Topology::start(options))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the replication topology did not start: {e}"));
    let primary = topology.member(topology.primary());
    let db = primary.provision().await.expect("provisioned");
    fixtures::initialise(&db).await;
    topology
        .wait_caught_up(Duration::from_secs(30))
        .await
        .expect("the replicas have the schema");
    let orbit = OrbitDev::start(PLATFORM).await;
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, LOAD_TYPES)
        .await
        .expect("subscription created");
    let via = db
        .runtime_url()
        .expose()
        .replace(db.address(), &topology.address().to_string());
    let mut env = orbit.receiver_env_on(&secret::Secret::new(via));
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
    env.push((
        "RECEIVER_REQUIRE_REPLICA_ACK",
        if gate { "1" } else { "0" }.into(),
    ));
    (
        Databases { topology, db },
        Platform { orbit, client, sub },
        env,
    )
}

impl Platform {
    /// Tasks made in rounds of `per_round`, a pause between rounds, until `stop` is set.
    async fn paced_load(&self, stop: &AtomicBool, per_round: usize, seed: u64) -> Vec<String> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut tasks = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let sub = &self.sub.id;
            let made = produce(&self.orbit, &self.client, sub, per_round, &mut rng, |_| {}).await;
            tasks.extend(made);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        tasks
    }

    /// The event ids of the subscription's ACKED deliveries now (at most 10,000).
    async fn acked(&self) -> Vec<String> {
        let filter = orbit_sdk::DeliveryFilter {
            state: Some("ACKED".into()),
            limit: Some(10_000),
            ..Default::default()
        };
        self.client
            .list_deliveries(&self.sub.id, &filter)
            .await
            .expect("deliveries listed")
            .into_iter()
            .map(|d| d.event_id)
            .collect()
    }
}

impl Databases {
    /// An admin connection on the receiver database of the primary now.
    async fn primary_receiver_db(&self) -> MySqlConnection {
        let primary = self.topology.member(self.topology.primary());
        MySqlConnection::connect(self.db.admin_receiver_url_on(primary).expose())
            .await
            .expect("the primary's receiver database opens")
    }

    /// The most advanced replica promoted, the forwarder switched to it, the other replica
    /// following it, and the old primary `old` too from `old_position` (none: it is dead, and
    /// is rebuilt instead). The new primary's index.
    async fn promote(&mut self, old: usize, old_position: Option<&str>) -> usize {
        let new = self
            .topology
            .promote_most_advanced()
            .await
            .expect("promoted");
        self.topology.switch(new).unwrap();
        for i in self.topology.replicas() {
            let from = if i == old {
                old_position
            } else {
                Some("slave_pos")
            };
            if let Some(from) = from {
                self.topology
                    .follow(i, from)
                    .await
                    .expect("follows the new primary");
            }
        }
        new
    }

    /// The primary is killed (SIGKILL) mid-load; the most advanced replica is promoted, the
    /// forwarder follows it, the other replica follows it, and the old primary is rebuilt as
    /// its replica (never re-attached with what it holds).
    async fn kill_and_fail_over(&mut self) {
        let old = self.topology.primary();
        assert!(self.topology.kill(old), "the primary was running");
        let new = self.promote(old, None).await;
        self.topology
            .rebuild(old)
            .await
            .expect("the old primary rebuilt");
        eprintln!("failover: primary {} killed, {} promoted", old + 1, new + 1);
    }

    /// A clean switchover: the primary is demoted to read-only while the consumers still hold
    /// connections to it, the replicas catch up, one is promoted, the forwarder follows it, and
    /// the old primary becomes its replica.
    async fn switch_over(&mut self) {
        let old = self.topology.primary();
        self.topology.demote(old).await.expect("demoted");
        // The consumers meet 1290 on their pooled connections to it meanwhile.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        self.topology
            .wait_caught_up(Duration::from_secs(30))
            .await
            .expect("the replicas caught up");
        let new = self.promote(old, Some("current_pos")).await;
        eprintln!("failover: switchover from {} to {}", old + 1, new + 1);
    }
}

impl Databases {
    /// Every replica's IO thread stopped until semi-sync falls back and a consumer says it
    /// holds; how many deliveries were ACKED over the four seconds after the next two (which
    /// must be none).
    /// The replicas stay stopped.
    async fn fall_back(
        &self,
        platform: &mut MySqlConnection,
        sub: &str,
        consumers: &[&Consumer],
    ) -> i64 {
        let line = "replica acknowledgement lost: holding deliveries";
        let seen = |c: &Consumer| c.output().matches(line).count();
        let before: Vec<usize> = consumers.iter().map(|c| seen(c)).collect();
        for i in self.topology.replicas() {
            self.topology.stop_io(i).await.unwrap();
        }
        let said = fixtures::poll(Duration::from_secs(30), Duration::from_millis(100), || {
            let more = consumers.iter().zip(&before).any(|(c, n)| seen(c) > *n);
            async move { more.then_some(()) }
        })
        .await;
        if said.is_none() {
            let primary = self.topology.primary();
            let status = self.topology.semi_sync_on(primary).await;
            panic!(
                "no consumer said {line:?} within 30 s of every replica's IO thread stopped; the primary (member {}) reports semi-sync on: {status:?}\n{}",
                primary + 1,
                consumers.iter().map(|c| notable(c)).collect::<Vec<_>>().join("\n---\n")
            );
        }
        // ACKs already on their way when the status flipped have landed by now, even on a
        // loaded machine.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let acked = acked_count(platform, sub).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        acked_count(platform, sub).await - acked
    }

    /// A fallback, then every replica receives again: the gate opens by itself.
    async fn fall_back_and_recover(
        &self,
        platform: &mut MySqlConnection,
        sub: &str,
        consumers: &[&Consumer],
    ) -> i64 {
        let back = "database back after";
        let was: Vec<usize> = consumers
            .iter()
            .map(|c| c.output().matches(back).count())
            .collect();
        let held = self.fall_back(platform, sub, consumers).await;
        for i in self.topology.replicas() {
            self.topology.start_io(i).await.unwrap();
        }
        fixtures::eventually(
            Duration::from_secs(30),
            "the gate to open by itself",
            || {
                let now: Vec<usize> = consumers
                    .iter()
                    .map(|c| c.output().matches(back).count())
                    .collect();
                let opened = now.iter().zip(&was).all(|(n, w)| n > w);
                async move { opened }
            },
        )
        .await;
        held
    }
}

/// What a consumer said beyond its deliveries' lines, and its last lines: for a failure.
fn notable(c: &Consumer) -> String {
    let out = c.output();
    let lines: Vec<&str> = out.lines().collect();
    let said: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.contains(" INFO delivery ") && !l.contains("ack answered"))
        .collect();
    format!(
        "{}\n(last lines)\n{}",
        said.join("\n"),
        lines[lines.len().saturating_sub(10)..].join("\n")
    )
}

/// The subscription's ACKED deliveries now, counted in the platform's database (a long run
/// has more than a listing holds).
async fn acked_count(platform: &mut MySqlConnection, sub: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM orbit_deliveries WHERE subscription_id = ? AND state = 'ACKED'",
    )
    .bind(sub)
    .fetch_one(platform)
    .await
    .expect("the platform's deliveries counted")
}

/// A test's own variable (`make failover` sets them), empty counting as unset.
#[allow(clippy::disallowed_methods)] // the suite's own switches
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The faults of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// The primary SIGKILLed under load, the most advanced replica promoted.
    Kill,
    /// The primary demoted to read-only while consumers hold connections to it, then a
    /// replica promoted.
    Switchover,
    /// Every replica stopped until semi-sync falls back; the gate holds; they resume.
    Fallback,
    /// A fallback, then the primary killed while no replica has its last commits.
    FallbackThenKill,
}

const FAULTS: [Fault; 4] = [
    Fault::Kill,
    Fault::Switchover,
    Fault::Fallback,
    Fault::FallbackThenKill,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failovers_under_lossless_semi_sync_with_the_gate_lose_no_acked_event() {
    let seed = var("FAILOVER_SEED")
        .map(|s| s.parse::<u64>().expect("FAILOVER_SEED is a number"))
        .unwrap_or_else(|| fastrand::u64(..1_000_000));
    let minutes =
        var("FAILOVER_MINUTES").map(|m| m.parse::<f64>().expect("FAILOVER_MINUTES is a number"));
    fixtures::note(
        "failover",
        format_args!(
            "seed {seed}{}",
            minutes.map_or(String::new(), |m| format!(", {m} minutes"))
        ),
    );
    let (mut dbs, platform, env) = rig(ReplicationOptions::default(), true).await;
    let sub = platform.sub.id.to_string();
    let platform_url = platform.orbit.db.platform_url();
    let connect = || async {
        MySqlConnection::connect(platform_url.expose())
            .await
            .expect("the platform's database opens")
    };
    let a = Consumer::normal(&env);
    let b = Consumer::normal(&env);
    let consumers = [&a, &b];
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut counts: std::collections::BTreeMap<Fault, usize> = Default::default();
    let (tasks, acked_while_unreplicated) = {
        let load = platform.paced_load(&stop, 3, seed);
        let faults = async {
            let mut conn = connect().await;
            let mut held = 0;
            let plan: Vec<Fault> = match minutes {
                None => FAULTS.to_vec(),
                Some(_) => Vec::new(),
            };
            let mut next = plan.into_iter();
            loop {
                let fault = match minutes {
                    None => match next.next() {
                        Some(f) => f,
                        None => break,
                    },
                    Some(m) if started.elapsed().as_secs_f64() < m * 60.0 => {
                        FAULTS[rng.usize(..FAULTS.len())]
                    }
                    Some(_) => break,
                };
                tokio::time::sleep(Duration::from_millis(rng.u64(2000..4000))).await;
                match fault {
                    Fault::Kill => dbs.kill_and_fail_over().await,
                    Fault::Switchover => dbs.switch_over().await,
                    Fault::Fallback => {
                        held += dbs.fall_back_and_recover(&mut conn, &sub, &consumers).await;
                    }
                    Fault::FallbackThenKill => {
                        held += dbs.fall_back(&mut conn, &sub, &consumers).await;
                        dbs.kill_and_fail_over().await;
                    }
                }
                *counts.entry(fault).or_default() += 1;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            stop.store(true, Ordering::SeqCst);
            held
        };
        tokio::join!(load, faults)
    };
    assert_eq!(
        acked_while_unreplicated, 0,
        "deliveries were ACKED while no replica acknowledged the primary's commits"
    );
    let deliveries = tasks.len() * fixtures::load::DELIVERIES_PER_TASK;
    let mut conn = connect().await;
    let until = Instant::now() + Duration::from_secs(180);
    let mut drained = None;
    while Instant::now() < until {
        if acked_count(&mut conn, &sub).await == deliveries as i64 {
            drained = Some(());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if drained.is_none() {
        panic!(
            "not every one of {deliveries} deliveries was ACKED within 180 s (seed {seed})\n--- a ---\n{}\n--- b ---\n{}",
            notable(&a),
            notable(&b)
        );
    }
    let out_a = a.stop().await;
    let out_b = b.stop().await;
    let mut admin = dbs.primary_receiver_db().await;
    let ledger = fixtures::check_ledger_on(&mut admin, &mut conn, &sub, "failover")
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let extra: i64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(attempts - 1), 0) AS SIGNED) FROM orbit_deliveries WHERE subscription_id = ?",
    )
    .bind(&sub)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    // Every extra attempt has its reason in a consume log: a "delivery not acked" line of
    // that delivery at the attempt before (nothing else here takes a lease away: the
    // platform's stream is never cut and no consumer is stopped).
    let again: Vec<(Vec<u8>, u32)> = sqlx::query_as(
        "SELECT id, attempts FROM orbit_deliveries WHERE subscription_id = ? AND attempts > 1",
    )
    .bind(&sub)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let outs = [out_a.as_str(), out_b.as_str()];
    let unexplained: Vec<String> = again
        .iter()
        .flat_map(|(id, attempts)| {
            let id = String::from_utf8_lossy(id).into_owned();
            (1..*attempts).filter_map(move |n| {
                let line = format!("delivery_id=\"{id}\" attempt={n} ");
                let said = outs.iter().any(|out| {
                    out.lines()
                        .any(|l| l.contains("delivery not acked") && l.contains(&line))
                });
                (!said).then(|| format!("{id} attempt {n}"))
            })
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "seed {seed}: extra attempts without a reason in the consume logs: {unexplained:?}"
    );
    let count = |out: &str, what: &str| out.matches(what).count();
    let both = |what: &str| count(&out_a, what) + count(&out_b, what);
    let kinds: Vec<String> = counts.iter().map(|(k, n)| format!("{k:?} {n}")).collect();
    fixtures::note(
        "failover",
        format_args!(
            "seed {seed}: faults {}; {} deliveries ACKED, {} events ({} stale); extra attempts {extra}; handed back {}; not ACKed as unreplicated {}; ACKED while unreplicated 0; ACKed events lost 0 (ledger clean on the final primary); {:.0} s",
        kinds.join(", "),
        ledger.deliveries,
        ledger.events,
        ledger.stale,
        both("released: the database"),
        both("classification=unreplicated"),
        started.elapsed().as_secs_f64()
    ),
    );
    assert!(
        both("replica acknowledgement lost") > 0,
        "the fallback was never seen"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_replication_with_replicas_held_back_loses_acked_events_and_the_suite_sees_it()
{
    let options = ReplicationOptions {
        semi_sync: false,
        ..ReplicationOptions::default()
    };
    let (mut dbs, platform, env) = rig(options, false).await;
    let a = Consumer::normal(&env);
    let stop = AtomicBool::new(false);
    let (tasks, (acked, lost)) = {
        let load = platform.paced_load(&stop, 3, 7);
        let faults = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            for i in dbs.topology.replicas() {
                dbs.topology.stop_io(i).await.unwrap();
            }
            // The primary confirms every COMMIT at once; the receiver ACKs; no replica has it.
            tokio::time::sleep(Duration::from_secs(4)).await;
            stop.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let acked = platform.acked().await;
            dbs.kill_and_fail_over().await;
            let mut admin = dbs.primary_receiver_db().await;
            let kept: std::collections::BTreeSet<String> =
                sqlx::query_scalar::<_, Vec<u8>>("SELECT event_id FROM receiver_inbox")
                    .fetch_all(&mut admin)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .collect();
            let lost = acked.iter().filter(|e| !kept.contains(*e)).count();
            (acked.len(), lost)
        };
        tokio::join!(load, faults)
    };
    let _ = a.stop().await;
    fixtures::note(
        "failover",
        format_args!(
            "asynchronous replication, replicas held back 4 s, primary killed: {lost} of {acked} ACKED deliveries' events lost ({} tasks)",
        tasks.len()
    ),
    );
    assert!(
        lost > 0,
        "asynchronous replication with the replicas held back lost nothing: the suite could not see a loss"
    );
}

/// Bad input: `RECEIVER_REQUIRE_REPLICA_ACK=1` against a server that cannot honour it is
/// refused at start with one line naming why: no semi-sync enabled, and a wait point that is
/// not AFTER_SYNC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_refuses_a_server_that_cannot_honour_it_in_one_line() {
    for (args, why) in [
        (
            vec![],
            "rpl_semi_sync_master_enabled (rpl_semi_sync_source_enabled) is OFF",
        ),
        (
            vec![
                "--rpl-semi-sync-master-enabled=ON".to_owned(),
                "--rpl-semi-sync-master-wait-point=AFTER_COMMIT".to_owned(),
            ],
            "is not AFTER_SYNC",
        ),
    ] {
        let server = testdb::Server::local_with_args(args).expect("a local server");
        let db = server.provision().await.expect("provisioned");
        fixtures::initialise(&db).await;
        let orbit = OrbitDev::start(&[]).await;
        let sub = orbit
            .client()
            .create_subscription(QUEUE, &["task.cancelled"])
            .await
            .unwrap();
        let mut env = orbit.receiver_env_on(&db.runtime_url());
        env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
        env.push(("RECEIVER_REQUIRE_REPLICA_ACK", "1".into()));
        let mut consumer = Consumer::normal(&env);
        let status = fixtures::poll(Duration::from_secs(20), Duration::from_millis(100), || {
            let exited = consumer.try_wait();
            async move { exited }
        })
        .await
        .expect("consume exits");
        let output = consumer.output();
        assert_eq!(status.code(), Some(1), "{output}");
        let refusal: Vec<&str> = output
            .lines()
            .filter(|l| l.contains("RECEIVER_REQUIRE_REPLICA_ACK=1 cannot be honoured"))
            .collect();
        assert_eq!(refusal.len(), 1, "{output}");
        assert!(refusal[0].contains(why), "{output}");
        assert!(refusal[0].ends_with("refusing to start"), "{output}");
    }
}
