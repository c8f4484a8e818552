//! Recovery: `receiver reconcile` as a real process against a real `orbit-dev` and a real
//! server. After the receiver's database lost its newest rows (what a restore of an older
//! backup does), it finds exactly the events lost, has the platform deliver them again, and
//! `consume` applies them through its dedup; rows `receiver prune` removed are told apart.
//! The restore drill does it all for real: a hot backup with MariaDB's own tool taken while
//! `consume` drains a paced load, restored onto a new server; a backup older than the
//! platform's retention shows what cannot be recovered (R-OPS-6; encryption at rest is the
//! `at_rest` suite's).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fixtures::load::{produce, wait_drained, LOAD_TYPES};
use fixtures::process::Consumer;
use fixtures::{all_acked, cancelled_task, run_receiver, OrbitDev, QUEUE};
use sqlx::{Connection, MySqlConnection};
use testdb::Server;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// That `out` exited with `code`; else fails with what it printed.
fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// `receiver reconcile ARGS` with `env`: its exit, output, and the summary line's fields.
fn reconcile(env: &[(&'static str, String)], args: &[&str]) -> (Output, HashMap<String, String>) {
    let mut all = vec!["reconcile"];
    all.extend_from_slice(args);
    let out = run_receiver(&all, env, None);
    let summary = text(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .split(' ')
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    (out, summary)
}

/// The server's clock `ago` back, in RFC 3339 UTC (the clock the platform stamps ACKs with).
async fn server_time(conn: &mut MySqlConnection, ago: &str) -> String {
    sqlx::query_scalar(&format!(
        "SELECT DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL {ago}, '%Y-%m-%dT%H:%i:%s.%fZ')"
    ))
    .fetch_one(conn)
    .await
    .unwrap()
}

/// The event ids of the `n` newest (`newest`) or oldest inbox rows.
async fn inbox_ends(admin: &mut MySqlConnection, n: usize, newest: bool) -> Vec<String> {
    let order = if newest { "DESC" } else { "ASC" };
    let ids: Vec<Vec<u8>> = sqlx::query_scalar(&format!(
        "SELECT event_id FROM receiver_inbox ORDER BY received_at {order}, event_id LIMIT {n}"
    ))
    .fetch_all(admin)
    .await
    .unwrap();
    ids.into_iter()
        .map(|i| String::from_utf8(i).unwrap())
        .collect()
}

/// Deletes `events`' inbox rows and their tasks' views, as the admin (what a restore of a
/// backup taken before they were applied leaves).
async fn forget(admin: &mut MySqlConnection, events: &[String]) {
    for e in events {
        let task: Vec<u8> =
            sqlx::query_scalar("SELECT task_id FROM receiver_task_views WHERE last_event_id = ?")
                .bind(e)
                .fetch_one(&mut *admin)
                .await
                .unwrap();
        sqlx::query("DELETE FROM receiver_task_views WHERE task_id = ?")
            .bind(task)
            .execute(&mut *admin)
            .await
            .unwrap();
        sqlx::query("DELETE FROM receiver_inbox WHERE event_id = ?")
            .bind(e)
            .execute(&mut *admin)
            .await
            .unwrap();
    }
}

/// 30 events applied and ACKed; then the 7 newest inbox rows (and their views) are lost, as a
/// restore of an older backup loses them, and the 3 oldest are gone too, as a prune removes
/// them. `reconcile --dry-run` reports exactly the 7 as missing (exit 3) and the 3 as pruned;
/// `reconcile` has the 7 redelivered; `consume` applies them again (each view back at its
/// version, `applied_events` 1); a second `--dry-run` finds nothing missing (exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_finds_exactly_the_events_a_restore_lost_and_has_them_applied_again() {
    let (orbit, client, sub, env) = fixtures::subscribed_receiver(&[], &["task.cancelled"]).await;
    let mut admin = MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    let since = server_time(&mut admin, "1 MINUTE").await;
    let consumer = Consumer::normal(&env);
    // The first 3 are ACKed before the others exist: the rows left after a prune of those 3
    // were all received after their ACKs.
    for _ in 0..3 {
        cancelled_task(&client).await;
    }
    all_acked(&client, &sub.id, Some(3), Duration::from_secs(30)).await;
    for _ in 3..30 {
        cancelled_task(&client).await;
    }
    all_acked(&client, &sub.id, Some(30), Duration::from_secs(30)).await;
    consumer.stop().await;
    let lost = inbox_ends(&mut admin, 7, true).await;
    let pruned = inbox_ends(&mut admin, 3, false).await;
    forget(&mut admin, &lost).await;
    sqlx::query(&format!(
        "DELETE FROM receiver_inbox WHERE event_id IN ('{}')",
        pruned.join("', '")
    ))
    .execute(&mut admin)
    .await
    .unwrap();

    let (out, s) = reconcile(&env, &["--since", &since, "--dry-run"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}{}", text(&out.stderr));
    let counts: Vec<&str> = [
        "deliveries",
        "present",
        "missing",
        "missing_events",
        "pruned",
        "redelivered",
        "result",
    ]
    .iter()
    .map(|k| s.get(*k).map_or("?", String::as_str))
    .collect();
    assert_eq!(
        counts,
        ["30", "20", "7", "7", "3", "0", "missing"],
        "{stdout}"
    );
    let reported: BTreeSet<String> = stdout
        .lines()
        .filter(|l| l.ends_with(" missing"))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("event=")))
        .map(str::to_owned)
        .collect();
    assert_eq!(reported, lost.iter().cloned().collect::<BTreeSet<_>>());
    assert!(text(&out.stderr)
        .contains("3 ACKED deliveries have no inbox row but were ACKED before its oldest row"));
    assert_eq!(orbit.metric("orbit_redelivered_total"), Some(0));

    let (out, s) = reconcile(&env, &["--since", &since]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(
        (
            s["missing"].as_str(),
            s["redelivered"].as_str(),
            s["result"].as_str()
        ),
        ("7", "7", "redelivered")
    );
    assert_eq!(orbit.metric("orbit_redelivered_total"), Some(7));

    let consumer = Consumer::normal(&env);
    all_acked(&client, &sub.id, Some(30), Duration::from_secs(30)).await;
    consumer.stop().await;
    for e in &lost {
        let (applied, views): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM receiver_inbox WHERE event_id = ? AND applied = 1), \
             (SELECT COUNT(*) FROM receiver_task_views WHERE last_event_id = ? AND task_version = 2 AND applied_events = 1)",
        )
        .bind(e)
        .bind(e)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        assert_eq!((applied, views), (1, 1), "{e}");
    }
    let (out, s) = reconcile(&env, &["--since", &since, "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(
        (
            s["missing"].as_str(),
            s["pruned"].as_str(),
            s["result"].as_str()
        ),
        ("0", "3", "clean")
    );
}

/// Every bad input is one line on standard error, exit 2, nothing on standard output, and no
/// redelivery asked: a `--since` in the future, unparsable or after `--until`, a window past
/// the 31-day maximum, no `--since`, an unknown flag, and a credential without `events:read`
/// (or without `events:manage` when not a dry run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_window_and_a_credential_without_the_scopes_are_refused_in_one_line() {
    let (orbit, client, _sub, env) = fixtures::subscribed_receiver(&[], &["task.cancelled"]).await;
    cancelled_task(&client).await;
    let cases: [(&[&str], &str); 6] = [
        (&["--since", "2999-01-01T00:00:00Z"], "is in the future"),
        (&["--since", "yesterday"], "is not an RFC 3339 time"),
        (
            &[
                "--since",
                "2026-12-05T10:00:00Z",
                "--until",
                "2026-12-05T09:00:00+00:00",
            ],
            "is not after --since",
        ),
        (
            &[
                "--since",
                "2026-10-01T00:00:00Z",
                "--until",
                "2026-11-05T00:00:00Z",
            ],
            "longer than the 31 days one run takes",
        ),
        (&["--dry-run"], "give --since"),
        (
            &["--since", "2026-12-05T10:00:00Z", "--bogus"],
            "unknown flag `--bogus`",
        ),
    ];
    for (args, says) in cases {
        let (out, _) = reconcile(&env, args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let tasks_only = orbit.bootstrap_other(QUEUE, false);
    let mut limited = env.clone();
    for (k, v) in &mut limited {
        if *k == "ORBIT_CREDENTIALS_FILE" {
            *v = tasks_only.display().to_string();
        }
    }
    let (out, _) = reconcile(&limited, &["--since", "2026-12-05T10:00:00Z", "--dry-run"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "receiver reconcile: the credential lacks events:read: reconcile lists the subscription's ACKED deliveries"
    );
    assert_eq!(orbit.metric("orbit_redelivered_total"), Some(0));
}

/// A receiver that lost nothing, over a window of 10,000 ACKED deliveries (made directly in
/// both databases): `reconcile --dry-run` reads them in 10 pages of 1,000, one inbox lookup a
/// page, and reports 0 missing; its time is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_acked_deliveries_that_all_landed_reconcile_to_zero_missing() {
    const N: usize = 10_000;
    let (orbit, _client, sub, env) = fixtures::subscribed_receiver(&[], &["task.cancelled"]).await;
    let mut admin = MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    fixtures::insert_old_inbox_rows(&mut admin, ("task-result-view", QUEUE), "bulk", N, 100, 1)
        .await;
    let mut platform = MySqlConnection::connect(orbit.db.platform_url().expose())
        .await
        .unwrap();
    for start in (0..N).step_by(1_000) {
        let rows = vec![
            "(LPAD(?, 32, '0'), ?, ?, 'task.cancelled', ?, 'ACKED', 1, 5, \
             UTC_TIMESTAMP(6) - INTERVAL 30 MINUTE + INTERVAL ? MICROSECOND, \
             UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, UTC_TIMESTAMP(6))";
            1_000
        ]
        .join(", ");
        let sql = format!(
            "INSERT INTO orbit_deliveries (id, subscription_id, event_id, event_type, task_id, \
             state, attempts, budget, acked_at, created_at, updated_at) VALUES {rows}"
        );
        let mut q = sqlx::query(&sql);
        for i in start..start + 1_000 {
            q = q
                .bind(i.to_string())
                .bind(sub.id.as_str())
                .bind(format!("bulk-{i}"))
                .bind(format!("t-{i}"))
                .bind(i as u64);
        }
        q.execute(&mut platform).await.unwrap();
    }
    let since = server_time(&mut admin, "2 HOUR").await;
    let started = Instant::now();
    let (out, s) = reconcile(&env, &["--since", &since, "--dry-run"]);
    let took = started.elapsed();
    assert_exit(&out, 0);
    let counts: Vec<&str> = ["deliveries", "present", "missing", "pages", "result"]
        .iter()
        .map(|k| s.get(*k).map_or("?", String::as_str))
        .collect();
    assert_eq!(counts, ["10000", "10000", "0", "10", "clean"]);
    fixtures::note(
        "recovery",
        format_args!(
            "reconcile --dry-run over {N} ACKED deliveries: 0 missing in {:.2} s ({} s by its own count)",
        took.as_secs_f64(),
        s["seconds"]
    ),
    );
}

/// Tasks a second the drill's load makes (each three versions and a duplicate).
const DRILL_TASKS_PER_SECOND: f64 = 12.0;

/// The drill's paced load, until `stop`: batches of 3 tasks, each three versions and a
/// duplicate, and after each batch version 1 again, under an id of its own (orbit-dev's
/// `forge-event`), for one task of the batch: a late version, which the receiver records as
/// stale. How many tasks and late versions it made.
async fn paced_load(
    orbit: Arc<OrbitDev>,
    sub: orbit_sdk::SubscriptionId,
    stop: Arc<AtomicBool>,
) -> (usize, usize) {
    let client = orbit.client();
    let mut rng = fastrand::Rng::with_seed(0x0b5c_0ded);
    let started = Instant::now();
    let (mut tasks, mut late) = (0, 0);
    while !stop.load(Ordering::SeqCst) {
        let ids = produce(&orbit, &client, &sub, 3, &mut rng, |_| {}).await;
        tasks += ids.len();
        let task = &ids[rng.usize(..ids.len())];
        assert!(
            fixtures::load::send_late_version(&orbit, &client, &sub, task).await,
            "task {task} has deliveries"
        );
        late += 1;
        let due = started + Duration::from_secs_f64(tasks as f64 / DRILL_TASKS_PER_SECOND);
        tokio::time::sleep_until(due.into()).await;
    }
    (tasks, late)
}

/// The subscription's ACKED deliveries as the platform's database holds them: the event id
/// each delivered body carries, and how many ACKED deliveries it has.
async fn acked_events(platform: &mut MySqlConnection, sub: &str) -> BTreeMap<String, usize> {
    let ids: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT JSON_VALUE(e.body, '$.id') FROM orbit_deliveries d \
         JOIN orbit_events e ON e.id = d.event_id WHERE d.subscription_id = ? AND d.state = 'ACKED'",
    )
    .bind(sub)
    .fetch_all(platform)
    .await
    .unwrap();
    let mut events = BTreeMap::new();
    for id in ids {
        *events.entry(String::from_utf8(id).unwrap()).or_default() += 1;
    }
    events
}

/// Every inbox row's event id and digest.
async fn inbox_digests(admin: &mut MySqlConnection) -> BTreeMap<String, Vec<u8>> {
    let rows: Vec<(Vec<u8>, Vec<u8>)> =
        sqlx::query_as("SELECT event_id, event_digest FROM receiver_inbox")
            .fetch_all(admin)
            .await
            .unwrap();
    rows.into_iter()
        .map(|(e, d)| (String::from_utf8(e).unwrap(), d))
        .collect()
}

/// Waits until `sub` has no delivery left unACKED, stops `consumer`, and checks the ledger of
/// the receiver database `admin` against the platform's `platform`; `what` names the moment.
async fn drained_ledger(
    consumer: Consumer,
    platform: &mut MySqlConnection,
    admin: &mut MySqlConnection,
    sub: &str,
    what: &str,
) -> fixtures::Ledger {
    wait_drained(
        platform,
        sub,
        Duration::from_millis(200),
        Duration::from_secs(120),
    )
    .await;
    consumer.stop().await;
    fixtures::check_ledger_on(admin, platform, sub, what)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The restore drill (issue 41). `consume` drains a paced load (three versions and a duplicate
/// a task, late versions among them); a hot backup is taken with `mariadb-backup` mid-load,
/// prepared, and restored onto a new server; the old one is lost. Counted from the ledger
/// before the disaster (the platform's ACKED deliveries against the restored inbox), the
/// events applied after the backup's point are exactly what `reconcile --dry-run` reports
/// missing; `reconcile` has them redelivered; `consume`, pointed at the restored server (the
/// platform never restarts), applies them; the ledger is clean and a last `--dry-run` exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_backup_taken_mid_load_is_restored_and_reconcile_brings_back_exactly_what_came_after_it(
) {
    restore_drill(Server::local().expect("a local server"), false).await;
}

/// The restore drill on a server encrypted at rest (docs/recovery.md's settings): the hot
/// backup copies encrypted pages and an encrypted redo log while the load writes, is prepared
/// with the key, and restored onto a server given the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_servers_hot_backup_taken_mid_load_restores_and_reconciles_as_a_plain_ones_does(
) {
    let server = Server::local_encrypted().expect("a local server encrypted at rest");
    restore_drill(server, true).await;
}

/// The drill's steps on `server`, which is `encrypted` at rest or not; so must the restored
/// copy be.
async fn restore_drill(server: Server, encrypted: bool) {
    let label = if encrypted {
        "restore drill, encrypted at rest"
    } else {
        "restore drill"
    };
    let server = Arc::new(server);
    let db = server.provision().await.expect("provisioned");
    fixtures::initialise(&db).await;
    let orbit = Arc::new(OrbitDev::start(&["--enable-fault-api"]).await);
    let client = orbit.client();
    let sub = client.create_subscription(QUEUE, LOAD_TYPES).await.unwrap();
    let sub_id = sub.id.to_string();
    let mut platform = MySqlConnection::connect(orbit.db.platform_url().expose())
        .await
        .unwrap();
    let mut admin = MySqlConnection::connect(db.admin_receiver_url().expose())
        .await
        .unwrap();
    let since = server_time(&mut admin, "1 MINUTE").await;
    let env_on = |dsn: &secret::Secret| {
        let mut env = orbit.receiver_env_on(dsn);
        env.push(("ORBIT_SUBSCRIPTION_ID", sub_id.clone()));
        env
    };

    // The load, and consume draining it.
    let consumer = Consumer::normal(&env_on(&db.runtime_url()));
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(paced_load(orbit.clone(), sub.id.clone(), stop.clone()));
    fixtures::eventually(Duration::from_secs(60), "60 deliveries ACKED before the backup", || {
        let url = orbit.db.platform_url();
        let sub = sub_id.clone();
        async move {
            let mut c = MySqlConnection::connect(url.expose()).await.unwrap();
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orbit_deliveries WHERE subscription_id = ? AND state = 'ACKED'")
                .bind(sub)
                .fetch_one(&mut c)
                .await
                .unwrap();
            n >= 60
        }
    })
    .await;
    let backup = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || server.backup())
            .await
            .unwrap()
            .expect("a hot backup")
    };
    // The load goes on past the backup's point: what comes now is lost with the server.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let (tasks, late) = load.await.unwrap();
    let before = drained_ledger(
        consumer,
        &mut platform,
        &mut admin,
        &sub_id,
        "before the disaster",
    )
    .await;
    let original = inbox_digests(&mut admin).await;

    // The disaster: the server is lost; its backup is restored onto a new one.
    let started = Instant::now();
    let restored = Server::restore(&backup).expect("the backup restores onto a new server");
    let restored_in = started.elapsed();
    assert!(server.kill(), "the old server was running");
    drop(admin);
    let mut admin = MySqlConnection::connect(db.admin_receiver_url_on(&restored).expose())
        .await
        .unwrap();
    let held = inbox_digests(&mut admin).await;
    for (event, digest) in &held {
        assert_eq!(
            original.get(event),
            Some(digest),
            "event {event}: restored, but not as the old server held it"
        );
    }
    // The restored copy keeps the receiver's tables encrypted when the original was.
    let mut root = MySqlConnection::connect(restored.admin_url().expose())
        .await
        .unwrap();
    let encrypted_tables: Vec<String> = sqlx::query_scalar(
        "SELECT NAME FROM information_schema.INNODB_TABLESPACES_ENCRYPTION \
         WHERE NAME LIKE '%/receiver\\_%' AND ENCRYPTION_SCHEME = 1 ORDER BY NAME",
    )
    .fetch_all(&mut root)
    .await
    .unwrap();
    // The two tables, and the schema's ledger and lock.
    assert_eq!(
        encrypted_tables.len(),
        if encrypted { 4 } else { 0 },
        "the restored server's encrypted receiver tables: {encrypted_tables:?}"
    );
    // The backup is consistent: every view it holds names an applied row it holds.
    let orphans: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM receiver_task_views v LEFT JOIN receiver_inbox i \
         ON i.event_id = v.last_event_id AND i.applied = 1 WHERE i.event_id IS NULL",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(
        orphans, 0,
        "views in the backup without their applied inbox row"
    );

    // Counted from the ledger: the ACKED events the restored inbox lacks.
    let acked = acked_events(&mut platform, &sub_id).await;
    let after_point: BTreeMap<&String, &usize> = acked
        .iter()
        .filter(|(e, _)| !held.contains_key(*e))
        .collect();
    let lost_deliveries: usize = after_point.values().copied().sum();
    assert!(
        !after_point.is_empty() && !held.is_empty(),
        "the backup was taken mid-load: it should hold some events and miss others (held {}, of {})",
        held.len(),
        acked.len()
    );

    // reconcile against the restored server, as docs/recovery.md has it: from the backup's
    // start as xtrabackup_info records it, with no margin.
    let env = env_on(&db.runtime_url_on(&restored));
    let backup_start = backup.started_at().expect("the backup's start");
    let (out, s) = reconcile(&env, &["--since", &backup_start, "--dry-run"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}{}", text(&out.stderr));
    let reported: BTreeSet<&str> = stdout
        .lines()
        .filter(|l| l.ends_with(" missing"))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("event=")))
        .collect();
    let expected: BTreeSet<&str> = after_point.keys().map(|e| e.as_str()).collect();
    assert_eq!(reported, expected, "the events reconcile reports missing");
    assert_eq!(
        (
            s["missing"].clone(),
            s["missing_events"].clone(),
            s["pruned"].clone()
        ),
        (
            lost_deliveries.to_string(),
            after_point.len().to_string(),
            "0".to_owned()
        ),
        "{stdout}"
    );
    // The load's duplicate deliveries: some lost events were ACKED twice.
    assert!(
        lost_deliveries > after_point.len(),
        "{lost_deliveries} deliveries of {} events",
        after_point.len()
    );
    let found = s["missing"].clone();

    // Once per event: the other deliveries of an event are reported, not redelivered.
    let (out, s) = reconcile(&env, &["--since", &backup_start]);
    assert_exit(&out, 0);
    assert_eq!(
        (s["redelivered"].clone(), s["refused"].clone()),
        (after_point.len().to_string(), "0".to_owned())
    );
    let not_again = text(&out.stdout)
        .lines()
        .filter(|l| l.contains(" missing, not redelivered: its event is, by delivery="))
        .count();
    assert_eq!(not_again, lost_deliveries - after_point.len());
    assert_eq!(
        orbit.metric("orbit_redelivered_total"),
        Some(after_point.len() as u64)
    );
    let redelivered = s["redelivered"].clone();
    let consumer = Consumer::normal(&env);
    let after = drained_ledger(
        consumer,
        &mut platform,
        &mut admin,
        &sub_id,
        "after the restore and reconcile",
    )
    .await;
    assert_eq!(
        (after.deliveries, after.events),
        (before.deliveries, before.events)
    );
    // Every late version is recorded stale (or made its task's own version 1 stale).
    assert!(
        late > 0 && after.stale >= late,
        "{late} late versions sent, {} rows recorded stale",
        after.stale
    );
    // The whole run, from before the first event: every delivery is checked, none is missing.
    let (out, s) = reconcile(&env, &["--since", &since, "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(
        (s["deliveries"].clone(), s["missing"].clone()),
        (before.deliveries.to_string(), "0".to_owned())
    );
    fixtures::note(
        "recovery",
        format_args!(
            "{label}: {tasks} tasks and {late} late versions, {} deliveries of {} events ({} recorded stale); \
         backup taken mid-load in {:.1} s, prepared in {:.1} s, restored in {:.1} s, holding {} events; \
         after its point (from the ledger): {} events in {lost_deliveries} deliveries; \
         reconcile --dry-run found {found} missing of {} events; reconcile redelivered {redelivered}, one delivery per event; ledger violations: 0",
        before.deliveries,
        before.events,
        after.stale,
        backup.taken_in.as_secs_f64(),
        backup.prepared_in.as_secs_f64(),
        restored_in.as_secs_f64(),
        held.len(),
        after_point.len(),
        after_point.len(),
    ),
    );
}

/// A restore from a backup older than the platform's retention of ACKED deliveries
/// (`orbit-dev --acked-retention-seconds 6`): the backup is taken before any event; 5 events
/// are applied and ACKed, and the platform forgets their deliveries; 4 more are applied and
/// ACKed. After the restore, `reconcile --dry-run` finds the 4 still listed missing and says in
/// one line that what was ACKED before the platform's horizon cannot be recovered; the 4 are
/// redelivered and applied again, the 5 are lost for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_older_than_the_platforms_retention_recovers_what_it_still_lists_and_says_what_it_cannot(
) {
    let server = Server::local().expect("a local server");
    let db = server.provision().await.expect("provisioned");
    fixtures::initialise(&db).await;
    let orbit = OrbitDev::start(&["--acked-retention-seconds", "6"]).await;
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .unwrap();
    let env_on = |dsn: &secret::Secret| {
        let mut env = orbit.receiver_env_on(dsn);
        env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
        env
    };
    let mut admin = MySqlConnection::connect(db.admin_receiver_url().expose())
        .await
        .unwrap();
    let since = server_time(&mut admin, "1 MINUTE").await;
    let backup = server.backup().expect("a hot backup");

    let consumer = Consumer::normal(&env_on(&db.runtime_url()));
    let mut forgotten = BTreeSet::new();
    for _ in 0..5 {
        forgotten.insert(cancelled_task(&client).await);
    }
    all_acked(&client, &sub.id, Some(5), Duration::from_secs(30)).await;
    fixtures::eventually(
        Duration::from_secs(30),
        "the platform to forget the first 5 ACKED deliveries",
        || async { orbit.metric("orbit_acked_forgotten_total") == Some(5) },
    )
    .await;
    let mut kept = BTreeSet::new();
    for _ in 0..4 {
        kept.insert(cancelled_task(&client).await);
    }
    all_acked(&client, &sub.id, Some(4), Duration::from_secs(30)).await;
    consumer.stop().await;
    assert_eq!(inbox_digests(&mut admin).await.len(), 9);

    let restored = Server::restore(&backup).expect("the backup restores onto a new server");
    assert!(server.kill());
    let env = env_on(&db.runtime_url_on(&restored));
    let (out, s) = reconcile(&env, &["--since", &since, "--dry-run"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{}{stderr}", text(&out.stdout));
    assert_eq!(
        (s["deliveries"].as_str(), s["missing"].as_str()),
        ("4", "4"),
        "{}",
        text(&out.stdout)
    );
    assert_ne!(s["retained_since"], "-");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("the platform keeps ACKED deliveries only since")
            && stderr.contains("cannot be recovered from the platform"),
        "{stderr}"
    );

    let (out, s) = reconcile(&env, &["--since", &since]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(s["redelivered"], "4");
    let consumer = Consumer::normal(&env);
    all_acked(&client, &sub.id, Some(4), Duration::from_secs(30)).await;
    consumer.stop().await;
    let mut admin = MySqlConnection::connect(db.admin_receiver_url_on(&restored).expose())
        .await
        .unwrap();
    let views: Vec<Vec<u8>> = sqlx::query_scalar("SELECT task_id FROM receiver_task_views")
        .fetch_all(&mut admin)
        .await
        .unwrap();
    let views: BTreeSet<String> = views
        .into_iter()
        .map(|t| String::from_utf8(t).unwrap())
        .collect();
    assert_eq!(
        views, kept,
        "the restored views: the 4 recovered, none of the 5 forgotten"
    );
    assert!(views.is_disjoint(&forgotten));
    fixtures::note(
        "recovery",
        format_args!(
            "a backup older than the platform's retention: {} events recovered, {} ACKed before its horizon lost for good; reconcile said: {}",
        kept.len(),
        forgotten.len(),
        stderr.trim()
    ),
    );
}
