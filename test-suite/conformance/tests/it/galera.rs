//! The receiver on a distributed MySQL: a three-node MariaDB Galera cluster (synchronous,
//! multi-primary, certification at COMMIT) from `testdb::Cluster`, one per suite run.
//!
//! On one server the inbox's dedup is the second inserter of a key waiting for the first. On
//! Galera two nodes each accept their own insert and the cluster certifies at COMMIT: the later
//! writer of a key fails with 1213, or a transaction still open on a node is aborted when a
//! conflicting one from another node applies there (brute-force abort, 1213 at its next
//! statement). Both are definite rollbacks, retried inside the apply. A node outside the
//! primary component refuses every table (1047): unavailable, never a reason to spend a
//! delivery. The tests here make each case happen on purpose and check the two tables, read
//! with `wsrep_sync_wait=1` so that a read on one node sees what another committed.
//!
//! The tests share the cluster and kill, pause or isolate its nodes, so they run one at a time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use fixtures::process::Consumer;
use fixtures::{all_acked, check_ledger, eventually, EventSpec, OrbitDev, QUEUE};
use result_inbox::store::{BusinessWrite, Receipt, StoreOptions, WriteFuture};
use result_inbox::{ApplyError, ConsumerName, Dsn, Outcome, QueueId, StorageKind, Store};
use sqlx::{MySqlConnection, Row};
use testdb::{Cluster, Provisioned, Server};

/// The apply budget on the cluster: above the ~6 s a COMMIT can stall while a dead peer is not
/// yet suspected (`evs.suspect_timeout`, 5 s), below the platform's 30 s lease.
const BUDGET: Duration = Duration::from_secs(15);

/// How long a test's setup waits for every node to let the runtime account use its database.
const SETUP_WAIT: Duration = Duration::from_secs(30);

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A figure for the run's log, past the test harness's capture of `eprintln!`.
fn note(line: std::fmt::Arguments<'_>) {
    fixtures::note("galera", line);
}

/// The suite's cluster, started on first use; `None` (with a message) only outside CI when
/// this machine has no Galera provider.
fn cluster() -> Option<&'static Cluster> {
    let result = CLUSTER.get_or_init(|| {
        if let Err(e) = testdb::galera_provider() {
            #[allow(clippy::disallowed_methods)] // CI must never skip this suite
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            if !ci {
                return Err(format!("SKIPPED: {e}"));
            }
            panic!("CI=true and no Galera cluster can start: {e}");
        }
        let cluster = Cluster::start(3).unwrap_or_else(|e| panic!("the cluster starts: {e}"));
        note(format_args!(
            "3 nodes Synced in {:.1} s",
            cluster.started_in().as_secs_f64()
        ));
        Ok(cluster)
    });
    match result {
        Ok(c) => Some(c),
        Err(skip) => {
            note(format_args!("{skip}"));
            None
        }
    }
}

/// One test's databases on the cluster (provisioned through node 1, present on all), the
/// receiver schema created and the runtime account granted.
struct OnCluster {
    cluster: &'static Cluster,
    db: Provisioned,
}

impl OnCluster {
    async fn new() -> Option<OnCluster> {
        let cluster = cluster()?;
        for node in cluster.nodes() {
            node.wait_synced().expect("every node Synced before a test");
        }
        let db = cluster.node(0).provision().await.expect("provisioned");
        let init = Dsn::parse(db.init_url().expose()).unwrap();
        result_inbox::schema::init(&init)
            .await
            .expect("receiver tables created");
        db.grant_runtime().await.expect("runtime grants given");
        let me = OnCluster { cluster, db };
        // Other nodes apply the tables and grants after node 1 has answered, and a node's
        // privilege cache may admit the account later still (1044 and 1142 were each seen once
        // under load, after a SHOW GRANTS there had already listed them). So wait for what the
        // tests need: the runtime account connecting to the database and reading both tables
        // on every node. Refusals are retried here, during setup only, within a bound.
        for i in 0..me.cluster.nodes().len() {
            let started = Instant::now();
            loop {
                match me.store(i).await {
                    Ok(store) => {
                        store.close().await;
                        break;
                    }
                    Err(_) if started.elapsed() < SETUP_WAIT => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => panic!(
                        "node {}: the runtime account still cannot use the test database after {:?}: {e}",
                        i + 1,
                        SETUP_WAIT
                    ),
                }
            }
        }
        Some(me)
    }

    fn node(&self, i: usize) -> &'static Server {
        self.cluster.node(i)
    }

    /// A store connected to node `i` as the runtime account.
    async fn store(&self, i: usize) -> Result<Store, result_inbox::StorageError> {
        Store::connect(
            &Dsn::parse(self.db.runtime_url_on(self.node(i)).expose()).unwrap(),
            ConsumerName::default(),
            QueueId::new(QUEUE).unwrap(),
            StoreOptions {
                apply_timeout: BUDGET,
                ..StoreOptions::default()
            },
        )
        .await
    }

    /// An admin connection on the receiver database on node `i` whose reads wait until the
    /// node has applied everything committed anywhere before them.
    async fn admin(&self, i: usize) -> MySqlConnection {
        fixtures::admin_in_sync(&self.db.admin_receiver_url_on(self.node(i))).await
    }

    /// (inbox rows, applied inbox rows) of `task`, and its view's (version, last event,
    /// applied_events), read on node `i`.
    async fn task(&self, i: usize, task: &str) -> ((i64, i64), Option<(u64, String, u64)>) {
        let mut c = self.admin(i).await;
        let pattern = format!("%\"task_id\":\"{task}\"%");
        let row = sqlx::query(
            "SELECT COUNT(*), CAST(COALESCE(SUM(applied), 0) AS SIGNED) FROM receiver_inbox \
             WHERE CAST(event_canonical AS CHAR) LIKE ?",
        )
        .bind(&pattern)
        .fetch_one(&mut c)
        .await
        .unwrap();
        let view = sqlx::query(
            "SELECT task_version, last_event_id, applied_events FROM receiver_task_views \
             WHERE task_id = ?",
        )
        .bind(task)
        .fetch_optional(&mut c)
        .await
        .unwrap()
        .map(|r| {
            (
                r.get::<u64, _>(0),
                String::from_utf8(r.get::<Vec<u8>, _>(1)).unwrap(),
                r.get::<u64, _>(2),
            )
        });
        ((row.get(0), row.get(1)), view)
    }

    /// Inbox rows of the whole test database, read on node `i`.
    async fn inbox_rows(&self, i: usize) -> i64 {
        let mut c = self.admin(i).await;
        sqlx::query("SELECT COUNT(*) FROM receiver_inbox")
            .fetch_one(&mut c)
            .await
            .unwrap()
            .get(0)
    }
}

/// A caller's write that stops every apply of a round at a rendezvous just before COMMIT, so
/// that transactions on different nodes reach certification together; then waits `after`
/// (to order who commits first) and runs `then` once. Later attempts (the retries) pass.
struct Rendezvous {
    barrier: Arc<tokio::sync::Barrier>,
    after: Duration,
    calls: AtomicU32,
    then: Box<dyn Fn() + Send + Sync>,
}

impl Rendezvous {
    fn new(barrier: &Arc<tokio::sync::Barrier>, after: Duration) -> Rendezvous {
        Self::then(barrier, after, || {})
    }

    fn then(
        barrier: &Arc<tokio::sync::Barrier>,
        after: Duration,
        then: impl Fn() + Send + Sync + 'static,
    ) -> Rendezvous {
        Rendezvous {
            barrier: barrier.clone(),
            after,
            calls: AtomicU32::new(0),
            then: Box::new(then),
        }
    }
}

impl BusinessWrite for Rendezvous {
    fn write<'a>(&'a self, _: &'a mut MySqlConnection, _: Receipt<'a>) -> WriteFuture<'a> {
        Box::pin(async move {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                self.barrier.wait().await;
                tokio::time::sleep(self.after).await;
                (self.then)();
            }
            Ok(())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_on_two_nodes_at_once_is_applied_once_and_the_other_is_a_duplicate() {
    let _serial = SERIAL.lock().await;
    let Some(c) = OnCluster::new().await else {
        return;
    };
    let (a, b) = (c.store(1).await.unwrap(), c.store(2).await.unwrap());
    let event = EventSpec::cancelled("evt-twin", "task-twin", 1).event();
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let (wa, wb) = (
        Rendezvous::new(&barrier, Duration::ZERO),
        Rendezvous::new(&barrier, Duration::ZERO),
    );
    let (ra, rb) = tokio::join!(
        a.apply_until(&event, &wa, None),
        b.apply_until(&event, &wb, None)
    );
    let outcomes = [
        ra.result.as_ref().map(|o| o.kind()),
        rb.result.as_ref().map(|o| o.kind()),
    ];
    let mut kinds: Vec<&str> = outcomes
        .iter()
        .map(|r| {
            *r.as_ref()
                .unwrap_or_else(|e| panic!("an apply failed: {e}"))
        })
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["applied", "duplicate"], "node 2 and node 3");
    let loser = if ra.result.as_ref().is_ok_and(|o| o.kind() == "duplicate") {
        &ra
    } else {
        &rb
    };
    assert!(
        loser.retries >= 1,
        "the duplicate came from a retry after the certification failure, not from waiting: {} retries",
        loser.retries
    );
    assert!(
        loser
            .reasons
            .count(result_inbox::RetryReason::Certification)
            + loser.reasons.count(result_inbox::RetryReason::Deadlock)
            >= 1,
        "a certification failure or a brute-force abort: {:?}",
        loser.reasons
    );
    note(format_args!(
        "same event on two nodes: retries {} and {} ({:?}, {:?})",
        ra.retries, rb.retries, ra.reasons, rb.reasons
    ));
    for node in 0..3 {
        assert_eq!(
            c.task(node, "task-twin").await,
            ((1, 1), Some((1, "evt-twin".to_owned(), 1))),
            "node {}",
            node + 1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_versions_on_two_nodes_end_at_the_higher_in_either_order_with_or_without_a_view() {
    let _serial = SERIAL.lock().await;
    let Some(c) = OnCluster::new().await else {
        return;
    };
    let (a, b) = (c.store(1).await.unwrap(), c.store(2).await.unwrap());
    let mut retries = 0;
    for existing in [false, true] {
        for higher_first in [true, false] {
            let task = format!("task-v-{existing}-{higher_first}");
            let mut applied_before = 0;
            if existing {
                let v0 = EventSpec::cancelled(&format!("{task}-0"), &task, 1).event();
                assert_eq!(a.apply(&v0).await.unwrap(), Outcome::Applied);
                applied_before = 1;
            }
            let base = u64::from(existing);
            let low = EventSpec::cancelled(&format!("{task}-low"), &task, base + 1).event();
            let high = EventSpec::cancelled(&format!("{task}-high"), &task, base + 2).event();
            // Both transactions have written before either commits; one commits 300 ms first.
            let barrier = Arc::new(tokio::sync::Barrier::new(2));
            let (first, second) = (Duration::ZERO, Duration::from_millis(300));
            let (w_high, w_low) = if higher_first {
                (
                    Rendezvous::new(&barrier, first),
                    Rendezvous::new(&barrier, second),
                )
            } else {
                (
                    Rendezvous::new(&barrier, second),
                    Rendezvous::new(&barrier, first),
                )
            };
            let (rh, rl) = tokio::join!(
                a.apply_until(&high, &w_high, None),
                b.apply_until(&low, &w_low, None)
            );
            let (oh, ol) = (rh.result.unwrap(), rl.result.unwrap());
            retries += rh.retries + rl.retries;
            assert_eq!(oh, Outcome::Applied, "{task}: the higher version applies");
            let expect_low = if higher_first {
                Outcome::Stale
            } else {
                Outcome::Applied
            };
            // The lower one either committed first (applied, then overtaken) or, certified
            // second against the higher one, was retried and found itself stale.
            assert!(
                ol == expect_low || ol == Outcome::Stale,
                "{task}: the lower version is {ol:?}"
            );
            let applied_low = i64::from(ol == Outcome::Applied);
            for node in 0..3 {
                let ((rows, applied), view) = c.task(node, &task).await;
                assert_eq!(
                    rows,
                    2 + applied_before,
                    "{task}: inbox rows, node {}",
                    node + 1
                );
                assert_eq!(
                    applied,
                    1 + applied_before + applied_low,
                    "{task}: applied rows"
                );
                assert_eq!(
                    view,
                    Some((base + 2, format!("{task}-high"), applied as u64)),
                    "{task}: view at the higher version, applied_events = applied rows, node {}",
                    node + 1
                );
            }
        }
    }
    note(format_args!(
        "two versions on two nodes, four rounds: {retries} retries"
    ));
    assert!(
        retries >= 1,
        "the rounds made no transaction conflict: nothing was tested"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_apply_aborted_by_a_higher_version_from_another_node_is_retried_and_stale() {
    let _serial = SERIAL.lock().await;
    let Some(c) = OnCluster::new().await else {
        return;
    };
    let (a, b) = (c.store(1).await.unwrap(), c.store(2).await.unwrap());
    let task = "task-bf";
    let v1 = EventSpec::cancelled("bf-1", task, 1).event();
    assert_eq!(a.apply(&v1).await.unwrap(), Outcome::Applied);
    // Node 3 holds version 2 open, its view row written, while node 2 commits version 3: the
    // cluster applies version 3 on node 3 and aborts the open transaction there.
    let v2 = EventSpec::cancelled("bf-2", task, 2).event();
    let v3 = EventSpec::cancelled("bf-3", task, 3).event();
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let hold = Rendezvous::new(&barrier, Duration::from_millis(1500));
    let commit_now = Rendezvous::new(&barrier, Duration::ZERO);
    let (r2, r3) = tokio::join!(
        b.apply_until(&v2, &hold, None),
        a.apply_until(&v3, &commit_now, None)
    );
    assert_eq!(r3.result.unwrap(), Outcome::Applied);
    assert_eq!(
        r2.result.unwrap(),
        Outcome::Stale,
        "version 2, aborted by version 3, retried and found stale"
    );
    assert!(
        r2.retries >= 1,
        "version 2 was aborted and retried: {} retries",
        r2.retries
    );
    for node in 0..3 {
        assert_eq!(
            c.task(node, task).await,
            ((3, 2), Some((3, "bf-3".to_owned(), 2))),
            "node {}",
            node + 1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_during_commit_is_unconfirmed_and_another_node_resolves_it_to_one_row() {
    let _serial = SERIAL.lock().await;
    let Some(c) = OnCluster::new().await else {
        return;
    };
    let victim = c.node(2);
    let doomed = c.store(2).await.unwrap();
    let event = EventSpec::cancelled("evt-doomed", "task-doomed", 1).event();
    // The node stops just before the COMMIT reaches it, and is killed while the client waits
    // for the answer: the client cannot know whether it committed.
    let barrier = Arc::new(tokio::sync::Barrier::new(1));
    let stop = Rendezvous::then(&barrier, Duration::ZERO, move || {
        victim.pause().expect("node 3 stopped");
    });
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        victim.kill()
    });
    let r = doomed.apply_until(&event, &stop, None).await;
    assert!(killer.await.unwrap(), "node 3 was running and was killed");
    assert!(
        matches!(r.result, Err(ApplyError::CommitUnconfirmed)),
        "wanted commit_unconfirmed, got {:?}",
        r.result
    );
    // The re-apply on a node still in the cluster decides it by identity.
    let healthy = c.store(1).await.unwrap();
    let started = Instant::now();
    let again = healthy.apply(&event).await.expect("the re-apply succeeds");
    note(format_args!(
        "re-apply after a node killed mid-COMMIT: {} in {} ms",
        again.kind(),
        started.elapsed().as_millis()
    ));
    assert!(matches!(
        again,
        Outcome::Applied | Outcome::Duplicate { applied: true }
    ));
    assert_eq!(c.task(0, "task-doomed").await.0, (1, 1), "exactly one row");
    let rejoin = Instant::now();
    victim.restart().expect("node 3 rejoins");
    note(format_args!(
        "node 3 recovered and rejoined in {:.1} s",
        rejoin.elapsed().as_secs_f64()
    ));
    assert_eq!(c.task(2, "task-doomed").await.0, (1, 1), "node 3 caught up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_crash_while_applying_on_a_healthy_node_ends_within_the_budget() {
    let _serial = SERIAL.lock().await;
    let Some(c) = OnCluster::new().await else {
        return;
    };
    let peer = c.node(2);
    let store = c.store(1).await.unwrap();
    let event = EventSpec::cancelled("evt-peer", "task-peer", 1).event();
    let barrier = Arc::new(tokio::sync::Barrier::new(1));
    let crash = Rendezvous::then(&barrier, Duration::ZERO, move || {
        assert!(peer.kill(), "node 3 killed");
    });
    let started = Instant::now();
    let r = store.apply_until(&event, &crash, None).await;
    let took = started.elapsed();
    note(format_args!(
        "apply while a peer crashed: {:?} after {} ms, {} retries",
        r.result.as_ref().map(|o| o.kind()),
        took.as_millis(),
        r.retries
    ));
    assert_eq!(r.result.unwrap(), Outcome::Applied);
    assert!(took < BUDGET, "within the budget: {took:?}");
    assert_eq!(c.task(0, "task-peer").await.0, (1, 1));
    peer.restart().expect("node 3 rejoins");
    assert_eq!(c.task(2, "task-peer").await.0, (1, 1), "node 3 caught up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_node_is_unavailable_writes_nothing_and_spends_no_attempt() {
    let _serial = SERIAL.lock().await;
    let Some(c) = OnCluster::new().await else {
        return;
    };
    let isolated = c.node(2);
    let store = c.store(2).await.unwrap();
    isolated.isolate(true).expect("node 3 isolated");
    // Should an assertion fail below, node 3 still rejoins for the tests after this one.
    let _rejoin = Rejoin(isolated);

    // The library: 1047 is unavailable, at connect and at apply, and nothing is written.
    let refused = c
        .store(2)
        .await
        .expect_err("no store on a non-Primary node");
    assert_eq!(
        (refused.kind(), refused.number()),
        (StorageKind::Unavailable, Some(1047))
    );
    let event = EventSpec::cancelled("evt-iso", "task-iso", 1).event();
    let applied = store
        .apply_until(&event, &result_inbox::store::NoWrite, None)
        .await;
    // Each refusal closes its connection, so each restart opens one; the last restart may
    // start with too little of the budget left to open it on a loaded machine, and then the
    // apply reports the budget spent. Either way every restart was for 1047.
    match &applied.result {
        Err(ApplyError::Storage(e)) => {
            assert_eq!(
                (e.kind(), e.number()),
                (StorageKind::Unavailable, Some(1047))
            )
        }
        Err(ApplyError::Timeout(_)) => {}
        other => panic!("wanted unavailable (1047), got {other:?}"),
    }
    let unavailable = applied
        .reasons
        .count(result_inbox::RetryReason::Unavailable);
    assert!(
        unavailable >= 1 && unavailable == applied.reasons.total(),
        "retried inside the apply, each time as unavailable: {:?}",
        applied.reasons
    );
    assert!(
        store
            .check(
                &mut result_inbox::HealthProbe::default(),
                Duration::from_secs(1)
            )
            .await
            .is_err(),
        "the probe fails too"
    );

    // The program: `consume` on the isolated node waits at start and takes no delivery.
    let orbit = OrbitDev::start_with(c.node(0).provision().await.unwrap(), &[]);
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .unwrap();
    let env = consume_env(&orbit, &c, 2, &sub.id);
    let consumer = Consumer::normal(&env);
    let mut tasks = Vec::new();
    for _ in 0..5 {
        tasks.push(fixtures::cancelled_task(&client).await);
    }
    eventually(Duration::from_secs(20), "consume says it waits", || {
        let out = consumer.output();
        async move { out.contains("database unavailable: waiting for it before taking deliveries") }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let deliveries = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap();
    assert_eq!(deliveries.len(), 5);
    assert!(
        deliveries
            .iter()
            .all(|d| d.state == "PENDING" && d.attempts == 0),
        "no delivery taken while the node is isolated: {deliveries:?}"
    );
    for node in 0..2 {
        assert_eq!(
            c.inbox_rows(node).await,
            0,
            "nothing written on node {}",
            node + 1
        );
    }

    isolated.isolate(false).expect("node 3 rejoins");
    all_acked(&client, &sub.id, Some(5), Duration::from_secs(60)).await;
    let deliveries = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap();
    assert!(
        deliveries.iter().all(|d| d.attempts == 1),
        "each applied on its first attempt: {deliveries:?}"
    );
    assert!(consumer.output().contains("database ready after"));
    consumer.stop().await;
    assert_eq!(c.inbox_rows(0).await, 5);
}

/// Lets an isolated node rejoin when dropped, if it has not already.
struct Rejoin(&'static Server);

impl Drop for Rejoin {
    fn drop(&mut self) {
        if !self
            .0
            .wsrep_status("wsrep_cluster_status")
            .is_ok_and(|s| s == "Primary")
        {
            let _ = self.0.isolate(false);
        }
    }
}

/// `receiver consume`'s environment against `orbit`, with its database on node `i`.
fn consume_env(
    orbit: &OrbitDev,
    c: &OnCluster,
    i: usize,
    sub: &str,
) -> Vec<(&'static str, String)> {
    let mut env = orbit.receiver_env_on(&c.db.runtime_url_on(c.node(i)));
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.to_owned()));
    env.push(("RECEIVER_APPLY_TIMEOUT", format!("{}s", BUDGET.as_secs())));
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_on_two_nodes_through_a_node_kill_and_an_isolation_lose_and_double_nothing() {
    let _serial = SERIAL.lock().await;
    let Some(c) = OnCluster::new().await else {
        return;
    };
    // The platform's tables live on node 1, the two consumers (one name) on nodes 2 and 3.
    let receiver_db = &c.db;
    let orbit = OrbitDev::start_with(
        c.node(0).provision().await.unwrap(),
        &["--lease-seconds", "20"],
    );
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, &["task.started", "task.succeeded", "task.cancelled"])
        .await
        .unwrap();
    let consumers = [
        Consumer::normal(&consume_env(&orbit, &c, 1, &sub.id)),
        Consumer::normal(&consume_env(&orbit, &c, 2, &sub.id)),
    ];
    const TASKS: usize = 300;
    let mut tasks = Vec::with_capacity(TASKS);
    let mut events = 0;
    let result = serde_json::value::RawValue::from_string(
        r#"{"amount":"12345678901234567890.10","n":1}"#.to_owned(),
    )
    .unwrap();
    let started = Instant::now();
    for i in 0..TASKS {
        let task = client.submit_task(QUEUE, None).await.unwrap().id;
        client.report_task(&task, "RUNNING", None).await.unwrap();
        if i % 3 == 0 {
            client.cancel_task(&task).await.unwrap();
        } else {
            client
                .report_task(&task, "SUCCEEDED", Some(&result))
                .await
                .unwrap();
        }
        events += 2;
        tasks.push(task);
        if i == TASKS / 3 {
            // Node 3 crashes under its consumer, and comes back.
            assert!(c.node(2).kill());
        }
        if i == TASKS / 2 {
            c.node(2).restart().expect("node 3 rejoins");
            // Node 2 is cut off for a while under its consumer.
            c.node(1).isolate(true).expect("node 2 isolated");
        }
        if i == 2 * TASKS / 3 {
            c.node(1).isolate(false).expect("node 2 rejoins");
        }
    }
    all_acked(&client, &sub.id, Some(events), Duration::from_secs(240)).await;
    note(format_args!(
        "end to end: {TASKS} tasks, {events} events, all ACKED after {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    let [a, b] = consumers;
    let logs = format!("{}\n{}", a.output(), b.output());
    a.stop().await;
    b.stop().await;
    let held = logs
        .matches("database unavailable: holding deliveries")
        .count();
    let retried: u64 = logs
        .lines()
        .filter_map(|l| l.split("retries=").nth(1))
        .filter_map(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    note(format_args!(
        "end to end: {retried} retries inside applies, {held} outage holds"
    ));

    assert!(
        retried >= 1,
        "the kill, the isolation and two consumers on one stream made no apply retry: nothing was tested"
    );

    let mut admin = fixtures::admin_in_sync(&receiver_db.admin_receiver_url_on(c.node(0))).await;
    let ledger = check_ledger(&mut admin, &client, &sub.id, &tasks, "galera end to end")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ledger.events, events, "every event delivered");
    // Every view at the latest version, read on the other nodes too.
    for node in 1..3 {
        let mut other = c.admin(node).await;
        let behind: i64 =
            sqlx::query("SELECT COUNT(*) FROM receiver_task_views WHERE task_version < 3")
                .fetch_one(&mut other)
                .await
                .unwrap()
                .get(0);
        assert_eq!(behind, 0, "node {}: every view at version 3", node + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_a_stopped_or_non_primary_node_within_two_seconds() {
    let _serial = SERIAL.lock().await;
    let Some(c) = OnCluster::new().await else {
        return;
    };
    let orbit = OrbitDev::start_with(c.node(0).provision().await.unwrap(), &[]);
    let sub = orbit
        .client()
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .unwrap();
    let mut env = consume_env(&orbit, &c, 1, &sub.id);
    env.push(("RECEIVER_METRICS_LISTEN", "127.0.0.1:0".into()));
    let consumer = Consumer::normal(&env);
    let addr = consumer.metrics_addr().await;
    Consumer::readiness_becomes(&addr, true, Duration::from_secs(30)).await;
    let limit = Duration::from_secs(2);

    // The consumer's node stops answering (a hung host).
    let node = c.node(1);
    node.pause().expect("node 2 paused");
    let down = Consumer::readiness_becomes(&addr, false, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    node.resume().expect("node 2 resumed");
    let up = Consumer::readiness_becomes(&addr, true, Duration::from_secs(30)).await;
    node.wait_synced().expect("node 2 Synced again");

    // The node leaves the primary component: it still answers, with 1047.
    node.isolate(true).expect("node 2 isolated");
    let rejoin = Rejoin(node);
    let non_primary = Consumer::readiness_becomes(&addr, false, Duration::from_secs(10)).await;
    node.isolate(false).expect("node 2 rejoined");
    let back = Consumer::readiness_becomes(&addr, true, Duration::from_secs(30)).await;
    drop(rejoin);
    note(format_args!(
        "readiness: {:.2} s after SIGSTOP, {:.2} s after SIGCONT, {:.2} s after non-Primary, {:.2} s after Synced",
        down.as_secs_f64(),
        up.as_secs_f64(),
        non_primary.as_secs_f64(),
        back.as_secs_f64()
    ));
    let output = consumer.stop().await;
    assert!(
        down <= limit,
        "not ready only {down:?} after the node stopped"
    );
    assert!(
        non_primary <= limit,
        "not ready only {non_primary:?} after the node went non-Primary"
    );
    assert!(
        back <= limit,
        "ready only {back:?} after the node was Synced"
    );
    // After SIGCONT a node answers once the cluster has it back; readiness follows that, not
    // the signal: a bound on `up` would measure Galera.
    assert!(up < Duration::from_secs(30), "{output}");
}
