//! Capacity: `receiver prune` as a real process against a real server, and the rule it relies
//! on (R-STORE-12): a redelivery whose inbox row was pruned is recorded again as not applied,
//! is ACKed, and never moves the view.

use fixtures::process::Barrier;
use std::collections::HashMap;
use std::process::Output;
use std::time::Duration;

use fixtures::process::Consumer;
use fixtures::{run_receiver, EventSpec, ReceiverDb, QUEUE};
use result_inbox::prune::Pruner;
use result_inbox::{ApplyError, ConsumerName, Dsn, Outcome, QueueId, TaskId};
use sqlx::Executor;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `n` inbox rows of the default consumer and queue, 100 bytes each, 40 days old.
async fn old_rows(admin: &mut sqlx::MySqlConnection, n: usize) {
    fixtures::insert_old_inbox_rows(admin, ("task-result-view", QUEUE), "old", n, 100, 40).await;
}

/// `receiver prune ARGS` with `env`, started, its output piped (for a test that signals it or
/// kills its server meanwhile).
fn start_prune(env: &[(&'static str, String)], args: &[&str]) -> std::process::Child {
    let mut cmd = fixtures::bare_command(&fixtures::receiver_bin());
    cmd.arg("prune")
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    fixtures::spawn(cmd)
}

/// The `key=value` fields of a summary line.
fn fields(line: &str) -> HashMap<String, String> {
    line.split(' ')
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `receiver prune ARGS` as `url`'s account; its exit, output and summary fields.
fn prune(
    rdb: &ReceiverDb,
    url: &secret::Secret,
    args: &[&str],
) -> (Output, HashMap<String, String>) {
    prune_with(&rdb.prune_env(url), args)
}

/// The prune account's environment on `db`.
fn db_env(db: &testdb::Provisioned) -> Vec<(&'static str, String)> {
    fixtures::prune_env(&db.prune_url())
}

/// `receiver prune ARGS` with `env`; its exit, output and summary fields.
fn prune_with(env: &[(&'static str, String)], args: &[&str]) -> (Output, HashMap<String, String>) {
    let mut all = vec!["prune"];
    all.extend_from_slice(args);
    let out = run_receiver(&all, env, None);
    let summary = fields(text(&out.stdout).lines().last().unwrap_or_default());
    (out, summary)
}

fn number(summary: &HashMap<String, String>, key: &str) -> u64 {
    summary
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {summary:?}"))
}

/// Prunes `consumer`'s rows with the library, as the prune account: 30 days, every row older.
async fn prune_all(rdb: &ReceiverDb, consumer: &str) -> u64 {
    let dsn = Dsn::parse(rdb.db.prune_url().expose()).unwrap();
    let mut p = Pruner::connect(
        &dsn,
        ConsumerName::new(consumer).unwrap(),
        QueueId::new(QUEUE).unwrap(),
        30 * 86_400,
    )
    .await
    .unwrap();
    let mut deleted = 0;
    loop {
        let b = p.batch(100).await.unwrap();
        if b.found == 0 {
            break;
        }
        deleted += b.deleted;
    }
    p.close().await;
    deleted
}

/// R-STORE-12, every case on one task: the latest version redelivered after its row was pruned,
/// an older one, and the latest id with other content (the window's price: no longer a
/// conflict, but still never applied). The view and its `applied_events` never move; each
/// redelivery leaves an inbox row with `applied = 0`.
#[tokio::test]
async fn after_pruning_a_redelivery_is_recorded_again_as_not_applied_and_never_moves_the_view() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let v1 = EventSpec::succeeded("evt-p1", "task-p", 1, r#"{"n":1}"#).event();
    let v2 = EventSpec::succeeded("evt-p2", "task-p", 2, r#"{"n":2}"#).event();
    let o1 = EventSpec::succeeded("evt-o1", "task-o", 1, r#"{"n":1}"#).event();
    for e in [&v1, &v2, &o1] {
        assert_eq!(store.apply(e).await.unwrap(), Outcome::Applied);
    }
    let view = |task: &'static str| {
        let store = &store;
        async move {
            store
                .view(&TaskId::new(task).unwrap())
                .await
                .unwrap()
                .unwrap()
        }
    };
    let (p_before, o_before) = (view("task-p").await, view("task-o").await);
    assert_eq!((p_before.task_version, p_before.applied_events), (2, 2));

    // Within the window, other content under a recorded id is a conflict.
    let other = EventSpec::succeeded("evt-o1", "task-o", 1, r#"{"n":"other"}"#).event();
    assert!(matches!(
        store.apply(&other).await,
        Err(ApplyError::Conflict(_))
    ));

    rdb.age_rows(&["evt-p1", "evt-p2", "evt-o1"], 40).await;
    assert_eq!(prune_all(&rdb, "task-result-view").await, 3);
    assert_eq!(rdb.inbox_counts().await, (0, 0));

    // The latest version again, an older one, and a pruned id with other content: each stale.
    for (event, what) in [
        (&v2, "the latest version"),
        (&v1, "an older version"),
        (&other, "a pruned id with other content"),
    ] {
        assert_eq!(store.apply(event).await.unwrap(), Outcome::Stale, "{what}");
        let record = store.inbox_record(event.id()).await.unwrap().unwrap();
        assert!(!record.applied, "{what}: recorded again as not applied");
        assert_eq!(record.digest, event.digest(), "{what}");
    }
    // Once recorded again, the same event is a duplicate of that record, not applied.
    assert_eq!(
        store.apply(&v2).await.unwrap(),
        Outcome::Duplicate { applied: false }
    );
    assert_eq!(view("task-p").await, p_before, "the view never moved");
    assert_eq!(view("task-o").await, o_before, "the view never moved");
    assert_eq!(rdb.inbox_counts().await, (3, 0));
}

/// R-STORE-12 and the source's warning: a caller's write sees the redelivery after pruning as
/// not applied, so the embedding example's notice is written once.
#[tokio::test]
async fn the_embedding_example_writes_no_second_notice_for_a_redelivery_after_pruning() {
    let rdb = ReceiverDb::new().await;
    rdb.customer_notices().await;
    let event = EventSpec::cancelled("evt-n1", "task-n", 2)
        .json()
        .replace('\n', " ");
    let example = |line: &str| {
        let (rdb, line) = (&rdb, line.to_owned());
        async move {
            let out = rdb.run_embed(&line).await;
            assert!(out.status.success(), "{}", text(&out.stderr));
            text(&out.stdout).trim().to_owned()
        }
    };
    assert_eq!(example(&event).await, "event=evt-n1 outcome=applied");
    rdb.age_rows(&["evt-n1"], 40).await;
    // The example's own consumer name.
    assert_eq!(prune_all(&rdb, "customer-notices").await, 1);
    assert_eq!(example(&event).await, "event=evt-n1 outcome=stale");
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM customer_notices").await, 1);
    assert_eq!(
        rdb.scalar("SELECT CAST(applied_events AS SIGNED) FROM receiver_task_views")
            .await,
        1
    );
}

/// A prune's batch and a redelivery of the same event at once: while the batch holds the row
/// (deleted, not yet committed), the apply waits; if the batch commits, the apply is stale; if
/// it rolls back, a duplicate. Either way the view does not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_racing_a_prune_of_its_row_waits_and_never_moves_the_view() {
    let rdb = ReceiverDb::new().await;
    let store = std::sync::Arc::new(rdb.store().await);
    for (commit, want) in [
        (true, Outcome::Stale),
        (false, Outcome::Duplicate { applied: true }),
    ] {
        let id = format!("evt-r-{commit}");
        let task = format!("task-r-{commit}");
        let event = EventSpec::cancelled(&id, &task, 1).event();
        assert_eq!(store.apply(&event).await.unwrap(), Outcome::Applied);
        // The batch, by hand, as the prune account: its DELETE holds the row.
        let mut batch = sqlx::MySqlConnection::connect(rdb.db.prune_url().expose())
            .await
            .unwrap();
        use sqlx::Connection;
        batch.execute("BEGIN").await.unwrap();
        let deleted = sqlx::query("DELETE FROM receiver_inbox WHERE event_id = ?")
            .bind(&id)
            .execute(&mut batch)
            .await
            .unwrap()
            .rows_affected();
        assert_eq!(deleted, 1);
        let apply = {
            let (store, event) = (store.clone(), event.clone());
            tokio::spawn(async move { store.apply(&event).await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!apply.is_finished(), "the apply waits on the batch's lock");
        batch
            .execute(if commit { "COMMIT" } else { "ROLLBACK" })
            .await
            .unwrap();
        assert_eq!(
            apply.await.unwrap().unwrap(),
            want,
            "batch committed: {commit}"
        );
        let view = store
            .view(&TaskId::new(&task).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.applied_events, 1);
    }
}

/// The verdict window: a redelivery met the dedup key and is stopped (a real `receiver-faults
/// consume`, barrier `before_verdict`) before it reads the committed record; a real `receiver
/// prune` runs meanwhile. The record cannot vanish under the verdict: the prune waits for the
/// apply's lock, the apply ends a duplicate and is ACKed at its first attempt, then the prune
/// deletes the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_during_a_duplicate_s_verdict_waits_and_the_duplicate_is_acked_at_once() {
    let (orbit, client, sub, env) =
        fixtures::subscribed_receiver(&["--enable-fault-api"], &["task.cancelled"]).await;
    let task = fixtures::cancelled_task(&client).await;
    let mut consumer = Consumer::faulty(&env, &[(Barrier::BeforeVerdict, 1)]);
    fixtures::all_acked(&client, &sub.id, Some(1), Duration::from_secs(20)).await;
    let event_id = orbit
        .client()
        .list_deliveries(&sub.id, &orbit_sdk::DeliveryFilter::default())
        .await
        .unwrap()[0]
        .event_id
        .clone();
    fixtures::age_inbox_rows(&orbit.db, &[&event_id], 40).await;

    let reply = orbit.fault(serde_json::json!({"fault": "duplicate-event", "event_id": event_id}));
    let again = reply["deliveries"][0]
        .as_str()
        .expect("a delivery")
        .to_owned();
    consumer
        .wait_barrier(Barrier::BeforeVerdict, Duration::from_secs(20))
        .await;
    let pruning = {
        let env = fixtures::prune_env(&orbit.db.prune_url());
        std::thread::spawn(move || run_receiver(&["prune", "--older-than", "30d"], &env, None))
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !pruning.is_finished(),
        "the prune waits for the apply's lock"
    );
    assert_eq!(orbit.inbox_rows(&event_id).await, 1);
    consumer.release();

    let id = orbit_sdk::DeliveryId::new(again.as_str()).unwrap();
    let acked = fixtures::wait::poll(
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let d = client.get_delivery(&id).await.unwrap();
            (d.state == "ACKED").then_some(d)
        },
    )
    .await
    .expect("the duplicate is ACKed");
    assert_eq!(acked.attempts, 1, "{acked:?}");
    let out = pruning.join().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary = fields(text(&out.stdout).trim());
    assert_eq!(number(&summary, "rows"), 1, "{summary:?}");
    assert_eq!(
        orbit.view(&task).await,
        Some((2, "CANCELLED".to_owned(), 1))
    );
    let output = consumer.stop().await;
    assert!(
        output
            .lines()
            .any(|l| l.contains(&again) && l.contains("classification=duplicate")),
        "{output}"
    );
}

/// The command end to end: only rows of this consumer and queue older than the window go, in
/// batches; the views stay; a dry run before says what would go and deletes nothing.
#[tokio::test]
async fn prune_deletes_only_this_consumer_s_rows_older_than_the_window_and_never_a_view() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let other_consumer = rdb.store_for("other-purpose", QUEUE).await;
    let other_queue = rdb.store_for("task-result-view", "other-queue").await;
    for i in 0..6 {
        let e = EventSpec::cancelled(&format!("evt-w{i}"), &format!("task-w{i}"), 1).event();
        store.apply(&e).await.unwrap();
        other_consumer.apply(&e).await.unwrap();
    }
    let mut elsewhere = EventSpec::cancelled("evt-q", "task-q", 1);
    elsewhere.queue = "other-queue".into();
    other_queue.apply(&elsewhere.event()).await.unwrap();
    let mut admin = rdb.admin().await;
    // Everything but evt-w4 and evt-w5 is 40 days old, in every consumer and queue.
    admin
        .execute("UPDATE receiver_inbox SET received_at = received_at - INTERVAL 40 DAY WHERE event_id NOT IN ('evt-w4', 'evt-w5')")
        .await
        .unwrap();
    let bytes: i64 = sqlx::query_scalar(
        "SELECT CAST(SUM(LENGTH(event_canonical)) AS SIGNED) FROM receiver_inbox \
         WHERE consumer_name = 'task-result-view' AND queue_id = ? AND event_id IN ('evt-w0', 'evt-w1', 'evt-w2', 'evt-w3')",
    )
    .bind(QUEUE)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    let url = rdb.db.prune_url();

    let (out, dry) = prune(&rdb, &url, &["--older-than", "30d", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).trim().ends_with(": nothing deleted"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(number(&dry, "rows"), 4, "{dry:?}");
    assert_eq!(number(&dry, "bytes"), bytes as u64);
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 13);

    let (out, done) = prune(&rdb, &url, &["--older-than", "30d", "--batch-rows", "3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 1, "one summary line");
    assert_eq!(number(&done, "rows"), 4, "{done:?}");
    assert_eq!(number(&done, "bytes"), bytes as u64);
    assert_eq!(number(&done, "batches"), 2);
    assert_eq!(done["result"], "complete");
    assert!(done["oldest_left"].ends_with('Z'), "{done:?}");
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(CONCAT(consumer_name, '/', queue_id, '/', event_id) AS CHAR) FROM receiver_inbox ORDER BY 1",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    let mut want: Vec<String> = (0..6)
        .map(|i| format!("other-purpose/{QUEUE}/evt-w{i}"))
        .chain(["task-result-view/other-queue/evt-q".to_owned()])
        .chain((4..6).map(|i| format!("task-result-view/{QUEUE}/evt-w{i}")))
        .collect();
    want.sort();
    assert_eq!(left, want);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_task_views").await,
        13
    );

    // Nothing older is left: a second run deletes nothing and says so.
    let (out, again) = prune(&rdb, &url, &["--older-than", "30d"]);
    assert!(out.status.success());
    assert_eq!((number(&again, "rows"), number(&again, "batches")), (0, 0));
}

/// Every bad input is refused with one line and exit 2, the wrong account with one line naming
/// the grant and exit 1, a missing index with one line naming the statement that adds it; none
/// deletes anything.
#[tokio::test]
async fn prune_refuses_bad_input_the_runtime_account_and_a_missing_index_and_deletes_nothing() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    for i in 0..3 {
        let id = format!("evt-b{i}");
        store
            .apply(&EventSpec::cancelled(&id, &format!("task-b{i}"), 1).event())
            .await
            .unwrap();
        rdb.age_rows(&[&id], 40).await;
    }
    let url = rdb.db.prune_url();
    for args in [
        &["--older-than", "12h"][..],
        &["--older-than", "0s", "--allow-short-window"],
        &["--older-than", "-3d"],
        &["--older-than", "3y"],
        &["--older-than", "30d", "--batch-rows", "0"],
        &["--older-than", "30d", "--batch-rows", "20000"],
        &[],
    ] {
        let (out, _) = prune(&rdb, &url, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("receiver prune: "), "{err}");
        assert!(out.stdout.is_empty());
    }
    // A configuration error: no queue.
    let out = run_receiver(
        &["prune", "--older-than", "30d"],
        &[("ORBIT_RECEIVER_DSN", url.expose().to_owned())],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("ORBIT_QUEUE_ID"),
        "{}",
        text(&out.stderr)
    );

    let (out, _) = prune(&rdb, &rdb.db.runtime_url(), &["--older-than", "30d"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim(),
        "receiver prune: the account lacks DELETE on receiver_inbox: prune runs as an account with SELECT and DELETE on receiver_inbox only (schema/grants.sql, step 3) (after 0 rows in 0 batches, which stay deleted)"
    );
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(!text(&out.stderr).contains(rdb.db.runtime.password.expose()));
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 3);

    rdb.admin()
        .await
        .execute("ALTER TABLE receiver_inbox DROP INDEX receiver_inbox_received_at")
        .await
        .unwrap();
    let (out, _) = prune(&rdb, &url, &["--older-than", "30d"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("has no index receiver_inbox_received_at")
            && err.contains("run `receiver migrate` as the init account"),
        "{err}"
    );
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 3);
    // The command the line names adds it back (the ledger says version 2, the table's shape
    // says otherwise: the shape wins), and prune runs.
    let migrate = run_receiver(
        &["migrate"],
        &[("ORBIT_RECEIVER_DSN", rdb.db.init_url().expose().to_owned())],
        None,
    );
    assert!(
        text(&migrate.stdout).contains("applied step 2 inbox-received-at-index"),
        "{}{}",
        text(&migrate.stdout),
        text(&migrate.stderr)
    );
    let (out, done) = prune(&rdb, &url, &["--older-than", "30d"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(number(&done, "rows"), 3);
}

/// A time limit stops cleanly between batches with exit 4 and says how far it got; a second
/// run continues; two runs at once share the rest without harm, and touch no young row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_limit_stops_cleanly_a_second_run_continues_and_two_at_once_share_the_rest() {
    let rdb = ReceiverDb::new().await;
    let mut admin = rdb.admin().await;
    let ours = ("task-result-view", QUEUE);
    fixtures::insert_old_inbox_rows(&mut admin, ours, "old", 20_000, 200, 40).await;
    fixtures::insert_old_inbox_rows(&mut admin, ours, "young", 500, 200, 2).await;
    let url = rdb.db.prune_url();

    let (out, first) = prune(
        &rdb,
        &url,
        &[
            "--older-than",
            "30d",
            "--batch-rows",
            "50",
            "--pause",
            "100ms",
            "--max-seconds",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    let rows = number(&first, "rows");
    assert!(rows > 0 && rows < 20_000, "{first:?}");
    assert!(
        first["result"].starts_with("stopped_at_max_seconds"),
        "{first:?}"
    );
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE event_id LIKE 'old-%'")
            .await,
        (20_000 - rows) as i64
    );

    let runs: Vec<_> = (0..2)
        .map(|_| {
            let env = rdb.prune_env(&url);
            std::thread::spawn(move || {
                run_receiver(
                    &[
                        "prune",
                        "--older-than",
                        "30d",
                        "--batch-rows",
                        "500",
                        "--pause",
                        "0",
                    ],
                    &env,
                    None,
                )
            })
        })
        .collect();
    let mut total = rows;
    for r in runs {
        let out = r.join().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        total += number(&fields(text(&out.stdout).trim()), "rows");
    }
    assert_eq!(total, 20_000, "every old row deleted once");
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE event_id LIKE 'old-%'")
            .await,
        0
    );
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE event_id LIKE 'young-%'")
            .await,
        500
    );
}

/// SIGTERM stops a run between batches: exit 4, a summary, nothing half done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_prune_between_batches_with_a_summary() {
    let rdb = ReceiverDb::new().await;
    old_rows(&mut rdb.admin().await, 5_000).await;
    let child = start_prune(
        &rdb.prune_env(&rdb.db.prune_url()),
        &[
            "--older-than",
            "30d",
            "--batch-rows",
            "10",
            "--pause",
            "200ms",
        ],
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    let summary = fields(text(&out.stdout).trim());
    assert_eq!(summary["result"], "stopped_by_SIGTERM");
    let rows = number(&summary, "rows");
    assert!(rows > 0 && rows % 10 == 0, "{summary:?}");
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await,
        5_000 - rows as i64
    );
}

/// `receiver_inbox_oldest_age_seconds` from a real `consume`: the age of its consumer's oldest
/// row, read through the index at start; -1 (and one line) on an inbox without the index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_reports_the_oldest_inbox_row_s_age_and_minus_one_without_the_index() {
    let (orbit, client, sub, mut env) =
        fixtures::subscribed_receiver(&[], &["task.cancelled"]).await;
    env.push(("RECEIVER_METRICS_LISTEN", "127.0.0.1:0".into()));
    fixtures::cancelled_task(&client).await;
    let first = Consumer::normal(&env);
    fixtures::all_acked(&client, &sub.id, Some(1), Duration::from_secs(20)).await;
    first.stop().await;
    let event = client
        .list_deliveries(&sub.id, &orbit_sdk::DeliveryFilter::default())
        .await
        .unwrap()[0]
        .event_id
        .clone();
    fixtures::age_inbox_rows(&orbit.db, &[&event], 40).await;

    let age = |addr: String| async move {
        fixtures::eventually(Duration::from_secs(10), "the gauge is read", || {
            let addr = addr.clone();
            async move { gauge(&addr).is_some_and(|v| v != -1.0) }
        })
        .await;
        gauge(&addr).unwrap()
    };
    let second = Consumer::normal(&env);
    let seconds = age(second.metrics_addr().await).await;
    let forty_days = 40.0 * 86_400.0;
    assert!(
        (forty_days..forty_days + 120.0).contains(&seconds),
        "{seconds}"
    );
    second.stop().await;

    let mut admin = sqlx::MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    use sqlx::Connection;
    admin
        .execute("ALTER TABLE receiver_inbox DROP INDEX receiver_inbox_received_at")
        .await
        .unwrap();
    let third = Consumer::normal(&env);
    let addr = third.metrics_addr().await;
    fixtures::eventually(
        Duration::from_secs(10),
        "the line on the missing index",
        || {
            let said = third
                .output()
                .contains("the inbox lacks the received_at index");
            async move { said }
        },
    )
    .await;
    assert_eq!(gauge(&addr), Some(-1.0));
    third.stop().await;
}

/// The value of `receiver_inbox_oldest_age_seconds` on `addr`'s `/metrics`.
fn gauge(addr: &str) -> Option<f64> {
    let (status, text) = fixtures::http_raw(addr, "GET", "/metrics", None, None);
    assert_eq!(status, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix("receiver_inbox_oldest_age_seconds "))
        .and_then(|v| v.trim().parse().ok())
}

/// The database lost in the middle of a run (its own server, SIGKILLed): prune stops with exit
/// 1, one summary line of what it did and one line of why; what it deleted stays deleted, and
/// the next run continues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_lost_mid_run_stops_prune_with_exit_1_and_keeps_what_it_deleted() {
    let server = testdb::Server::local().expect("a local server");
    let db = server.provision().await.expect("provisioned");
    fixtures::initialise(&db).await;
    use sqlx::Connection;
    let mut admin = sqlx::MySqlConnection::connect(db.admin_receiver_url().expose())
        .await
        .unwrap();
    old_rows(&mut admin, 5_000).await;
    drop(admin);
    let child = start_prune(
        &db_env(&db),
        &[
            "--older-than",
            "30d",
            "--batch-rows",
            "10",
            "--pause",
            "100ms",
        ],
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(server.kill(), "the server was running");
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let summary = fields(text(&out.stdout).trim());
    assert!(summary["result"].starts_with("failed"), "{summary:?}");
    let rows = number(&summary, "rows");
    assert!(rows > 0, "{summary:?}");
    let err = text(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("receiver prune: ") && last.contains(&format!("after {rows} rows")),
        "{err}"
    );
    assert!(!err.contains(db.prune.password.expose()));

    server.restart().expect("the server comes back");
    let mut admin = sqlx::MySqlConnection::connect(db.admin_receiver_url().expose())
        .await
        .unwrap();
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM receiver_inbox")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        left,
        5_000 - rows as i64,
        "what it reported deleted stays deleted"
    );
    let (out, again) = prune_with(&db_env(&db), &["--older-than", "30d", "--pause", "0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(number(&again, "rows") as i64, left);
}
