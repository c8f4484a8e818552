//! Failover on primary/replica MySQL (R-STORE-13): `receiver consume`, two processes under one
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

use conformance::load::{produce, LOAD_TYPES};
use conformance::process::Consumer;
use conformance::{check_ledger, OrbitDev, QUEUE};
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
    let init = result_inbox::Dsn::parse(db.init_url().expose()).unwrap();
    result_inbox::schema::init(&init)
        .await
        .expect("receiver tables created");
    db.grant_runtime().await.expect("runtime grants given");
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

/// Every delivery, up to the platform's largest page (its default is 1,000).
fn everything() -> orbit_sdk::DeliveryFilter {
    orbit_sdk::DeliveryFilter {
        limit: Some(10_000),
        ..Default::default()
    }
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

    /// The primary is killed (SIGKILL) mid-load; the most advanced replica is promoted, the
    /// forwarder follows it, the other replica follows it, and the old primary is rebuilt as
    /// its replica (never re-attached with what it holds).
    async fn kill_and_fail_over(&mut self) {
        let old = self.topology.primary();
        assert!(self.topology.kill(old), "the primary was running");
        let new = self
            .topology
            .promote_most_advanced()
            .await
            .expect("promoted");
        self.topology.switch(new).unwrap();
        for i in self.topology.replicas() {
            if i != old {
                self.topology
                    .follow(i, "slave_pos")
                    .await
                    .expect("the other replica follows");
            }
        }
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
        let new = self
            .topology
            .promote_most_advanced()
            .await
            .expect("promoted");
        self.topology.switch(new).unwrap();
        for i in self.topology.replicas() {
            let from = if i == old { "current_pos" } else { "slave_pos" };
            self.topology
                .follow(i, from)
                .await
                .expect("follows the new primary");
        }
        eprintln!("failover: switchover from {} to {}", old + 1, new + 1);
    }
}

impl Databases {
    /// Every replica's IO thread stopped until semi-sync falls back and a consumer says it
    /// holds; how many deliveries were ACKED over the next four seconds (which must be none).
    /// The replicas stay stopped.
    async fn fall_back(&self, platform: &Platform, consumers: &[&Consumer]) -> usize {
        let line = "replica acknowledgement lost: holding deliveries";
        let seen = |c: &Consumer| c.output().matches(line).count();
        let before: Vec<usize> = consumers.iter().map(|c| seen(c)).collect();
        for i in self.topology.replicas() {
            self.topology.stop_io(i).await.unwrap();
        }
        conformance::eventually(Duration::from_secs(30), line, || {
            let more = consumers.iter().zip(&before).any(|(c, n)| seen(c) > *n);
            async move { more }
        })
        .await;
        // ACKs already on their way when the status flipped have landed by now.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let acked = platform.acked().await.len();
        tokio::time::sleep(Duration::from_secs(4)).await;
        platform.acked().await.len() - acked
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failovers_under_lossless_semi_sync_with_the_gate_lose_no_acked_event() {
    let (mut dbs, platform, env) = rig(ReplicationOptions::default(), true).await;
    let a = Consumer::normal(&env);
    let b = Consumer::normal(&env);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let (tasks, acked_while_unreplicated) = {
        let load = platform.paced_load(&stop, 3, 20261205);
        let faults = async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            dbs.kill_and_fail_over().await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            dbs.switch_over().await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            // Every replica stops receiving: the next commit waits out the semi-sync timeout,
            // the primary falls back to asynchronous replication, and the gate holds until a
            // replica acknowledges again, by itself.
            let held = dbs.fall_back(&platform, &[&a, &b]).await;
            let back = "database back after";
            let was = a.output().matches(back).count();
            for i in dbs.topology.replicas() {
                dbs.topology.start_io(i).await.unwrap();
            }
            conformance::eventually(
                Duration::from_secs(30),
                "the gate to open by itself",
                || {
                    let now = a.output().matches(back).count();
                    async move { now > was }
                },
            )
            .await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            // Again, and this time the primary dies while no replica has what it committed
            // last: only what the gate let through could be lost, and it let nothing through.
            let held_then_killed = dbs.fall_back(&platform, &[&a, &b]).await;
            dbs.kill_and_fail_over().await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            stop.store(true, Ordering::SeqCst);
            held + held_then_killed
        };
        tokio::join!(load, faults)
    };
    assert_eq!(
        acked_while_unreplicated, 0,
        "deliveries were ACKED while no replica acknowledged the primary's commits"
    );
    let deliveries = tasks.len() * conformance::load::DELIVERIES_PER_TASK;
    let drained = conformance::poll(Duration::from_secs(120), Duration::from_millis(250), || {
        let (client, sub) = (platform.client.clone(), platform.sub.id.clone());
        async move {
            let d = client.list_deliveries(&sub, &everything()).await.ok()?;
            (d.len() == deliveries && d.iter().all(|d| d.state == "ACKED")).then_some(())
        }
    })
    .await;
    if drained.is_none() {
        // What each consumer said beyond its deliveries' lines, and its last lines.
        let tail = |c: &Consumer| {
            let out = c.output();
            let lines: Vec<&str> = out.lines().collect();
            let notable: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| !l.contains(" INFO delivery ") && !l.contains("ack answered"))
                .collect();
            format!(
                "{}\n(last lines)\n{}",
                notable.join("\n"),
                lines[lines.len().saturating_sub(10)..].join("\n")
            )
        };
        panic!(
            "not every one of {deliveries} deliveries was ACKED within 120 s\n--- a ---\n{}\n--- b ---\n{}",
            tail(&a),
            tail(&b)
        );
    }
    let out_a = a.stop().await;
    let out_b = b.stop().await;
    let mut admin = dbs.primary_receiver_db().await;
    let (client, sub) = (&platform.client, &platform.sub.id);
    let ledger = check_ledger(&mut admin, client, sub, &tasks, "failover")
        .await
        .unwrap_or_else(|e| panic!("{e}\n--- a ---\n{out_a}\n--- b ---\n{out_b}"));
    let all = client.list_deliveries(sub, &everything()).await.unwrap();
    let extra: u32 = all.iter().map(|d| d.attempts.saturating_sub(1)).sum();
    let released = out_a.matches("released: the database").count()
        + out_b.matches("released: the database").count();
    eprintln!(
        "failover: lossless semi-sync with the gate: 2 kills and promotions (one during a fallback), 1 switchover, 2 fallbacks; {} deliveries ACKED, {} events ({} stale); {extra} extra attempts, {released} handed back; 0 ACKed events lost; {:.1} s",
        ledger.deliveries,
        ledger.events,
        ledger.stale,
        started.elapsed().as_secs_f64()
    );
    assert!(
        out_a.contains("replica acknowledgement lost")
            || out_b.contains("replica acknowledgement lost"),
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
    eprintln!(
        "failover: asynchronous replication, replicas held back 4 s, primary killed: {lost} of {acked} ACKED deliveries' events lost ({} tasks)",
        tasks.len()
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
        let init = result_inbox::Dsn::parse(db.init_url().expose()).unwrap();
        result_inbox::schema::init(&init).await.unwrap();
        db.grant_runtime().await.unwrap();
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
        let status = conformance::poll(Duration::from_secs(20), Duration::from_millis(100), || {
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
