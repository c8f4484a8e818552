//! The Apply transaction on a real server (R-STORE, R-FAULT-2).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fixtures::{EventSpec, ReceiverDb};
use result_inbox::{ApplyError, BusinessWrite, Outcome, QueueId, TaskEvent, TaskId};
use result_inbox::{Conflict, Receipt, WriteFuture};
use sqlx::{Connection, Executor, MySqlConnection, Row};

/// View rows still carrying the in-transaction placeholder version.
const PLACEHOLDERS: &str = "SELECT COUNT(*) FROM receiver_task_views WHERE task_version = 0";

fn task(id: &str) -> TaskId {
    TaskId::new(id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_identical_events_advance_the_view_once() {
    let rdb = ReceiverDb::new().await;
    let store = Arc::new(rdb.store().await);
    let event = Arc::new(EventSpec::cancelled("evt-8", "task-8", 1).event());
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut handles = Vec::new();
    for _ in 0..8 {
        let (store, event, barrier) = (store.clone(), event.clone(), barrier.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            store.apply(&event).await
        }));
    }
    let mut outcomes = HashMap::new();
    for h in handles {
        let outcome = h.await.unwrap().expect("every identical apply succeeds");
        *outcomes.entry(outcome).or_insert(0) += 1;
    }
    assert_eq!(outcomes.get(&Outcome::Applied), Some(&1), "{outcomes:?}");
    assert_eq!(
        outcomes.get(&Outcome::Duplicate { applied: true }),
        Some(&7),
        "{outcomes:?}"
    );
    let view = store.view(&task("task-8")).await.unwrap().unwrap();
    assert_eq!(view.applied_events, 1);
    assert_eq!(view.task_version, 1);
    assert_eq!(view.last_state, "CANCELLED");
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 1);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE applied = 1")
            .await,
        1
    );
}

#[tokio::test]
async fn same_event_id_with_other_content_is_a_conflict_and_changes_nothing() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let first = EventSpec::succeeded("evt-c", "task-c", 2, r#"{"amount":1}"#).event();
    assert_eq!(store.apply(&first).await.unwrap(), Outcome::Applied);
    let before = store.view(&task("task-c")).await.unwrap();

    let other = EventSpec::succeeded("evt-c", "task-c", 2, r#"{"amount":2}"#).event();
    match store.apply(&other).await {
        Err(ApplyError::Conflict(Conflict::DigestMismatch { stored, delivered })) => {
            assert_eq!(stored, first.digest());
            assert_eq!(delivered, other.digest());
        }
        other => panic!("wanted a digest conflict, got {other:?}"),
    }
    assert_eq!(store.view(&task("task-c")).await.unwrap(), before);
    let record = store.inbox_record(first.id()).await.unwrap().unwrap();
    assert_eq!(record.digest, first.digest());
    assert_eq!(record.canonical, first.canonical());

    // The same content with other whitespace and key order is the same event.
    let same = EventSpec::succeeded("evt-c", "task-c", 2, r#"{ "amount" : 1 }"#).event();
    assert_eq!(
        store.apply(&same).await.unwrap(),
        Outcome::Duplicate { applied: true }
    );
}

#[tokio::test]
async fn an_older_version_is_recorded_but_never_overwrites() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let v2 = EventSpec::succeeded("evt-v2", "task-o", 2, r#""new""#).event();
    let v1 = EventSpec::succeeded("evt-v1", "task-o", 1, r#""old""#).event();
    assert_eq!(store.apply(&v2).await.unwrap(), Outcome::Applied);
    assert_eq!(store.apply(&v1).await.unwrap(), Outcome::Stale);
    // A redelivery of the stale event reports what its first receipt did.
    assert_eq!(
        store.apply(&v1).await.unwrap(),
        Outcome::Duplicate { applied: false }
    );
    let view = store.view(&task("task-o")).await.unwrap().unwrap();
    assert_eq!(view.task_version, 2);
    assert_eq!(view.last_event_id, "evt-v2");
    assert_eq!(view.last_result.as_deref(), Some(&b"\"new\""[..]));
    assert_eq!(view.applied_events, 1);
    let stale = store.inbox_record(v1.id()).await.unwrap().unwrap();
    assert!(!stale.applied, "history kept with applied = false");
    assert!(store.inbox_record(v2.id()).await.unwrap().unwrap().applied);
}

#[tokio::test]
async fn other_consumer_names_and_queues_are_independent() {
    let rdb = ReceiverDb::new().await;
    let main = rdb.store().await;
    let other_name = rdb.store_for("audit-view", fixtures::QUEUE).await;
    let event = EventSpec::cancelled("evt-s", "task-s", 1).event();
    assert_eq!(main.apply(&event).await.unwrap(), Outcome::Applied);
    assert_eq!(other_name.apply(&event).await.unwrap(), Outcome::Applied);
    assert_eq!(
        main.apply(&event).await.unwrap(),
        Outcome::Duplicate { applied: true }
    );

    let other_queue = rdb.store_for("task-result-view", "other-queue").await;
    let mut spec = EventSpec::cancelled("evt-s", "task-s", 1);
    spec.queue = "other-queue".into();
    assert_eq!(
        other_queue.apply(&spec.event()).await.unwrap(),
        Outcome::Applied
    );
    // An event of one queue is refused by the other queue's store, before any SQL.
    match other_queue.apply(&event).await {
        Err(ApplyError::Rejected(r)) => assert_eq!(r.kind(), "queue_mismatch"),
        other => panic!("wanted a rejection, got {other:?}"),
    }

    for store in [&main, &other_name, &other_queue] {
        let view = store.view(&task("task-s")).await.unwrap().unwrap();
        assert_eq!(view.applied_events, 1);
    }
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 3);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_task_views").await,
        3
    );
}

/// Inserts a row into the test's business table, then optionally fails.
struct LedgerWrite {
    fail_after: bool,
}

impl BusinessWrite for LedgerWrite {
    fn write<'a>(&'a self, conn: &'a mut MySqlConnection, receipt: Receipt<'a>) -> WriteFuture<'a> {
        Box::pin(async move {
            sqlx::query("INSERT INTO business_ledger (event_id, outcome) VALUES (?, ?)")
                .bind(receipt.event.id().as_str())
                .bind(receipt.outcome.kind())
                .execute(&mut *conn)
                .await?;
            if self.fail_after {
                // A real server error, not a simulated one: the table does not exist.
                sqlx::query("INSERT INTO no_such_table VALUES (1)")
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        })
    }
}

/// A receiver database with the caller's own `business_ledger` table, which the runtime
/// account may read and insert into; and an admin connection on it.
async fn with_ledger() -> (ReceiverDb, sqlx::MySqlConnection) {
    let rdb = ReceiverDb::new().await;
    let mut admin = rdb.admin().await;
    admin
        .execute("CREATE TABLE business_ledger (event_id VARBINARY(128) PRIMARY KEY, outcome VARCHAR(16) NOT NULL)")
        .await
        .unwrap();
    admin
        .execute(
            format!(
                "GRANT SELECT, INSERT ON `{}`.business_ledger TO '{}'@'%'",
                rdb.db.receiver_db, rdb.db.runtime.user
            )
            .as_str(),
        )
        .await
        .unwrap();
    (rdb, admin)
}

#[tokio::test]
async fn a_failing_caller_write_is_reported_by_its_code_never_by_the_server_text() {
    let (rdb, mut admin) = with_ledger().await;
    // The ledger already holds this id: the caller's insert fails with the server's
    // "Duplicate entry 'evt-secret-7' for key 'PRIMARY'", which quotes the row.
    admin
        .execute("INSERT INTO business_ledger VALUES ('evt-secret-7', 'earlier')")
        .await
        .unwrap();
    let store = rdb.store().await;
    let event = EventSpec::cancelled("evt-secret-7", "task-secret", 1).event();
    let e = store
        .apply_with(&event, &LedgerWrite { fail_after: false })
        .await
        .expect_err("the caller's write fails");
    let shown = e.to_string();
    assert_eq!(
        shown,
        "write_failed: the caller's write failed, everything was rolled back (mysql 1062, SQLSTATE 23000)"
    );
    // The caller can still reach its own error on purpose.
    let source = std::error::Error::source(&e).expect("the caller's error is the source");
    assert!(source.to_string().contains("Duplicate entry"));
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 0);
}

#[tokio::test]
async fn a_failing_caller_write_rolls_back_inbox_view_and_its_own_rows() {
    let (rdb, _admin) = with_ledger().await;
    let store = rdb.store().await;
    let event = EventSpec::cancelled("evt-w", "task-w", 1).event();

    match store
        .apply_with(&event, &LedgerWrite { fail_after: true })
        .await
    {
        Err(e @ ApplyError::Write(_)) => assert_eq!(e.kind(), "write_failed"),
        other => panic!("wanted write_failed, got {other:?}"),
    }
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 0);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_task_views").await,
        0
    );
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM business_ledger").await, 0);

    // The event can be retried, and a working write commits with the view.
    assert_eq!(
        store
            .apply_with(&event, &LedgerWrite { fail_after: false })
            .await
            .unwrap(),
        Outcome::Applied
    );
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM business_ledger").await, 1);
    assert_eq!(
        store
            .view(&task("task-w"))
            .await
            .unwrap()
            .unwrap()
            .applied_events,
        1
    );
    // A duplicate never runs the caller's write again.
    assert_eq!(
        store
            .apply_with(&event, &LedgerWrite { fail_after: false })
            .await
            .unwrap(),
        Outcome::Duplicate { applied: true }
    );
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM business_ledger").await, 1);
}

/// Records what the session looks like from inside the apply's transaction.
struct SessionProbe(Mutex<Vec<String>>);

impl BusinessWrite for SessionProbe {
    fn write<'a>(&'a self, conn: &'a mut MySqlConnection, _: Receipt<'a>) -> WriteFuture<'a> {
        Box::pin(async move {
            // MySQL 8 names it transaction_isolation; MariaDB 10.11 tx_isolation.
            let isolation: String = match sqlx::query("SELECT @@session.transaction_isolation")
                .fetch_one(&mut *conn)
                .await
            {
                Ok(row) => row.try_get(0)?,
                Err(_) => sqlx::query("SELECT @@session.tx_isolation")
                    .fetch_one(&mut *conn)
                    .await?
                    .try_get(0)?,
            };
            let tz: String = sqlx::query("SELECT @@session.time_zone")
                .fetch_one(&mut *conn)
                .await?
                .try_get(0)?;
            self.0.lock().unwrap().extend([isolation, tz]);
            Ok(())
        })
    }
}

#[tokio::test]
async fn the_transaction_is_read_committed_in_utc() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let probe = SessionProbe(Mutex::new(Vec::new()));
    let event = EventSpec::cancelled("evt-rc", "task-rc", 1).event();
    assert_eq!(
        store.apply_with(&event, &probe).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        *probe.0.lock().unwrap(),
        vec!["READ-COMMITTED".to_owned(), "+00:00".to_owned()]
    );
    // received_at is within a minute of the server's UTC clock.
    let skew = rdb
        .scalar(
            "SELECT ABS(TIMESTAMPDIFF(SECOND, received_at, UTC_TIMESTAMP())) FROM receiver_inbox",
        )
        .await;
    assert!(skew < 60, "received_at is {skew}s away from UTC");
}

/// A second connection that inserts the inbox row of `event` and keeps its transaction open.
async fn competitor(rdb: &ReceiverDb, event: &TaskEvent) -> MySqlConnection {
    let mut conn = rdb.admin().await;
    conn.execute("BEGIN").await.unwrap();
    // The rival records the event as history only (applied = 0), as a stale apply would.
    sqlx::query(
        "INSERT INTO receiver_inbox (consumer_name, queue_id, event_id, event_digest, \
         event_canonical, applied, received_at) VALUES (?, ?, ?, ?, ?, 0, UTC_TIMESTAMP(6))",
    )
    .bind("task-result-view")
    .bind(fixtures::QUEUE)
    .bind(event.id().as_str())
    .bind(&event.digest().0[..])
    .bind(event.canonical())
    .execute(&mut conn)
    .await
    .unwrap();
    conn
}

/// Waits until `n` connections of this test's database are inside the inbox INSERT. With the
/// competitor's row uncommitted, that INSERT cannot finish: they are blocked on its lock.
async fn blocked_inserts(rdb: &ReceiverDb, n: i64) {
    let mut admin = rdb.admin().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    loop {
        let blocked: i64 = sqlx::query(
            "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE db = ? AND command = 'Execute' AND info LIKE 'INSERT INTO receiver_inbox%'",
        )
        .bind(&rdb.db.receiver_db)
        .fetch_one(&mut admin)
        .await
        .and_then(|r| r.try_get(0))
        .unwrap();
        if blocked >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 4 s for {n} blocked inbox inserts, saw {blocked}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `appliers` concurrent applies of `ours`, started while a rival transaction holds the
/// uncommitted inbox row of `theirs` (same identity), and seen blocked on it.
struct Race {
    store: Arc<result_inbox::Store>,
    rival: MySqlConnection,
    applies: Vec<tokio::task::JoinHandle<Result<Outcome, ApplyError>>>,
}

async fn race(rdb: &ReceiverDb, theirs: &TaskEvent, ours: TaskEvent, appliers: usize) -> Race {
    let store = Arc::new(rdb.store().await);
    let ours = Arc::new(ours);
    let rival = competitor(rdb, theirs).await;
    let applies = (0..appliers)
        .map(|_| {
            let (store, ours) = (store.clone(), ours.clone());
            tokio::spawn(async move { store.apply(&ours).await })
        })
        .collect();
    blocked_inserts(rdb, appliers as i64).await;
    let race = Race {
        store,
        rival,
        applies,
    };
    assert!(
        race.applies.iter().all(|h| !h.is_finished()),
        "apply must wait for the rival, not report success"
    );
    race
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncommitted_competitor_blocks_apply_until_it_rolls_back() {
    let rdb = ReceiverDb::new().await;
    let event = EventSpec::cancelled("evt-race", "task-race", 1).event();
    let mut race = race(&rdb, &event, event.clone(), 1).await;
    race.rival.execute("ROLLBACK").await.unwrap();
    let apply = race.applies.pop().unwrap();
    assert_eq!(apply.await.unwrap().unwrap(), Outcome::Applied);
    let view = race.store.view(&task("task-race")).await.unwrap().unwrap();
    assert_eq!(view.applied_events, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncommitted_competitor_that_commits_makes_apply_a_duplicate() {
    let rdb = ReceiverDb::new().await;
    let event = EventSpec::cancelled("evt-race2", "task-race2", 1).event();
    let mut race = race(&rdb, &event, event.clone(), 1).await;
    race.rival.execute("COMMIT").await.unwrap();
    // The rival recorded the event without advancing a view: the original applied = false.
    let apply = race.applies.pop().unwrap();
    assert_eq!(
        apply.await.unwrap().unwrap(),
        Outcome::Duplicate { applied: false }
    );
    assert!(race
        .store
        .view(&task("task-race2"))
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncommitted_competitor_with_other_content_ends_in_conflict() {
    let rdb = ReceiverDb::new().await;
    let theirs = EventSpec::succeeded("evt-race3", "task-race3", 1, "1").event();
    let ours = EventSpec::succeeded("evt-race3", "task-race3", 1, "2").event();
    let mut race = race(&rdb, &theirs, ours, 1).await;
    race.rival.execute("COMMIT").await.unwrap();
    match race.applies.pop().unwrap().await.unwrap() {
        Err(ApplyError::Conflict(c)) => assert_eq!(c.kind(), "digest_mismatch"),
        other => panic!("wanted a conflict, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_waiters_behind_a_competitor_that_rolls_back_apply_once() {
    let rdb = ReceiverDb::new().await;
    let event = EventSpec::cancelled("evt-queue", "task-queue", 1).event();
    let mut race = race(&rdb, &event, event.clone(), 4).await;
    race.rival.execute("ROLLBACK").await.unwrap();
    let mut applied = 0;
    for h in race.applies {
        match h.await.unwrap() {
            Ok(Outcome::Applied) => applied += 1,
            Ok(Outcome::Duplicate { applied: true }) => {}
            // InnoDB may pick deadlock victims among waiters of a rolled-back insert; the
            // apply restarts those itself, so none reaches the caller.
            other => panic!("wrong outcome for a waiter: {other:?}"),
        }
    }
    assert_eq!(applied, 1);
    let view = race.store.view(&task("task-queue")).await.unwrap().unwrap();
    assert_eq!(view.applied_events, 1);
    assert_eq!(rdb.scalar(PLACEHOLDERS).await, 0);
}

#[tokio::test]
async fn same_task_same_version_other_event_is_a_conflict_and_leaves_nothing() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let first = EventSpec::cancelled("evt-a1", "task-sv", 3).event();
    let second = EventSpec::cancelled("evt-a2", "task-sv", 3).event();
    assert_eq!(store.apply(&first).await.unwrap(), Outcome::Applied);
    match store.apply(&second).await {
        Err(ApplyError::Conflict(Conflict::SameVersionOtherEvent {
            version,
            recorded_event,
        })) => {
            assert_eq!(version, 3);
            assert_eq!(recorded_event, "evt-a1");
        }
        other => panic!("wanted a same-version conflict, got {other:?}"),
    }
    assert!(store.inbox_record(second.id()).await.unwrap().is_none());
    let view = store.view(&task("task-sv")).await.unwrap().unwrap();
    assert_eq!((view.task_version, view.applied_events), (3, 1));
    assert_eq!(view.last_event_id, "evt-a1");

    // A first event whose only write fails leaves no placeholder behind either.
    let fresh = EventSpec::cancelled("evt-new", "task-new", 1).event();
    assert!(store
        .apply_with(&fresh, &LedgerWrite { fail_after: true })
        .await
        .is_err());
    assert_eq!(rdb.scalar(PLACEHOLDERS).await, 0);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_task_views").await,
        1
    );
}

#[tokio::test]
async fn ids_differing_in_case_or_accents_are_different_events() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    for (i, id) in ["evt-a", "evt-A", "evt-á", "evt-a "].iter().enumerate() {
        let event = EventSpec::cancelled(id, "task-case", i as u64 + 1).event();
        assert_eq!(store.apply(&event).await.unwrap(), Outcome::Applied, "{id}");
    }
    for (i, t) in ["task-x", "TASK-X", "task-x\u{301}"].iter().enumerate() {
        let event = EventSpec::cancelled(&format!("evt-t{i}"), t, 1).event();
        assert_eq!(store.apply(&event).await.unwrap(), Outcome::Applied, "{t}");
    }
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 7);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_task_views").await,
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_shuffled_versions_end_at_the_highest() {
    let rdb = ReceiverDb::new().await;
    let store = Arc::new(rdb.store().await);
    // A fixed shuffle (a permutation of 1..=64), so a failure reproduces.
    let mut versions: Vec<u64> = (1..=64).collect();
    fastrand::Rng::with_seed(0x9E37_79B9_7F4A_7C15).shuffle(&mut versions);
    let mut handles = Vec::new();
    for v in versions {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let event = EventSpec::cancelled(&format!("evt-{v}"), "task-64", v).event();
            // Retry as a redelivery would, on retryable errors only.
            let mut retries = 0;
            loop {
                match store.apply(&event).await {
                    Ok(outcome) => return (outcome, retries),
                    Err(e) if e.is_retryable() && retries < 20 => retries += 1,
                    Err(e) => panic!("version {v}: {e}"),
                }
            }
        }));
    }
    let mut applied = 0u64;
    for h in handles {
        let (outcome, retries) = h.await.unwrap();
        match outcome {
            Outcome::Applied => applied += 1,
            Outcome::Stale => {}
            // Only after a retry: the first attempt's COMMIT went through unconfirmed, and the
            // duplicate reports what that attempt did.
            Outcome::Duplicate { applied: a } if retries > 0 => applied += u64::from(a),
            Outcome::Duplicate { .. } => panic!("no event was delivered twice"),
        }
    }
    let view = store.view(&task("task-64")).await.unwrap().unwrap();
    assert_eq!(view.task_version, 64);
    assert_eq!(view.last_event_id, "evt-64");
    assert_eq!(view.applied_events, applied);
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 64);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE applied = 1")
            .await,
        applied as i64
    );
}

#[tokio::test]
async fn states_results_and_timestamps_are_stored_exactly() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;

    let mut review = EventSpec::succeeded(
        "evt-r",
        "task-r",
        1,
        r#"{"total": 123456789012345678901234567890, "price": 1.50}"#,
    );
    review.event_type = "task.needs_review".into();
    review.state = "NEEDS_REVIEW".into();
    review.occurred_at = "2026-12-02T22:17:05.120+08:00".into();
    let event = review.event();
    assert_eq!(store.apply(&event).await.unwrap(), Outcome::Applied);
    let view = store.view(&task("task-r")).await.unwrap().unwrap();
    assert_eq!(view.last_state, "NEEDS_REVIEW");
    assert_eq!(
        view.last_result.as_deref(),
        Some(&br#"{"price":1.50,"total":123456789012345678901234567890}"#[..])
    );
    let record = store.inbox_record(event.id()).await.unwrap().unwrap();
    let frozen = String::from_utf8(record.canonical).unwrap();
    assert!(
        frozen.contains(r#""occurred_at":"2026-12-02T14:17:05.12Z""#),
        "{frozen}"
    );
    assert!(frozen.contains("123456789012345678901234567890"));

    let cancelled = EventSpec::cancelled("evt-n", "task-n", 1).event();
    assert_eq!(store.apply(&cancelled).await.unwrap(), Outcome::Applied);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_task_views WHERE task_id = 'task-n' AND last_result IS NULL").await,
        1,
        "an event without a result stores SQL NULL"
    );
}

#[tokio::test]
async fn exactly_512_kib_is_stored_and_one_byte_more_is_refused() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let queue = QueueId::new(fixtures::QUEUE).unwrap();
    let spec = EventSpec::succeeded("evt-big", "task-big", 1, "\"PAD\"");
    let base = spec.json();
    let pad = result_inbox::canonical::MAX_EVENT_BYTES - base.len() + 5;
    let full = base.replace("\"PAD\"", &format!("\"{}\"", "x".repeat(pad - 2)));
    assert_eq!(full.len(), result_inbox::canonical::MAX_EVENT_BYTES);
    let event = TaskEvent::parse(full.as_bytes(), &queue).unwrap();
    assert_eq!(store.apply(&event).await.unwrap(), Outcome::Applied);
    let record = store.inbox_record(event.id()).await.unwrap().unwrap();
    assert_eq!(record.canonical, event.canonical());

    let over = full.replacen(' ', "  ", 1);
    assert_eq!(over.len(), result_inbox::canonical::MAX_EVENT_BYTES + 1);
    let refused = TaskEvent::parse(over.as_bytes(), &queue).unwrap_err();
    assert_eq!(refused.kind(), "too_large");
}

#[tokio::test]
async fn the_runtime_account_cannot_delete_create_or_read_the_platform() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    store
        .apply(&EventSpec::cancelled("evt-g", "task-g", 1).event())
        .await
        .unwrap();
    let mut runtime = MySqlConnection::connect(rdb.db.runtime_url().expose())
        .await
        .unwrap();
    let denied = |r: Result<sqlx::mysql::MySqlQueryResult, sqlx::Error>| -> u16 {
        let e = r.expect_err("must be denied");
        e.as_database_error()
            .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
            .map(|d| d.number())
            .unwrap_or_else(|| panic!("not a server error: {e}"))
    };
    assert_eq!(
        denied(runtime.execute("DELETE FROM receiver_inbox").await),
        1142
    );
    assert_eq!(
        denied(runtime.execute("CREATE TABLE t (x INT)").await),
        1142
    );
    assert_eq!(
        denied(runtime.execute("DROP TABLE receiver_task_views").await),
        1142
    );
    let platform_table = format!("SELECT 1 FROM `{}`.anything", rdb.db.platform_db);
    assert!(matches!(
        denied(runtime.execute(platform_table.as_str()).await),
        1142 | 1044
    ));
    // Not even a connection with the platform database as default.
    let e = MySqlConnection::connect(rdb.db.runtime_url_on_platform_db().expose())
        .await
        .expect_err("the runtime account cannot use the platform database");
    assert!(
        e.to_string().contains("1044") || e.to_string().contains("denied"),
        "{e}"
    );
    // While SELECT, INSERT, UPDATE on its two tables work.
    runtime
        .execute("UPDATE receiver_task_views SET updated_at = updated_at")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_past_its_time_budget_fails_without_committing() {
    let rdb = ReceiverDb::new().await;
    let store = result_inbox::Store::connect(
        &rdb.runtime_dsn(),
        result_inbox::ConsumerName::default(),
        QueueId::new(fixtures::QUEUE).unwrap(),
        result_inbox::StoreOptions::default()
            .max_connections(4)
            .apply_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let event = EventSpec::cancelled("evt-slow", "task-slow", 1).event();
    let mut rival = competitor(&rdb, &event).await;
    match store.apply(&event).await {
        Err(e @ ApplyError::Timeout(_)) => {
            assert_eq!(e.kind(), "timeout");
            assert!(e.is_retryable());
        }
        other => panic!("wanted a timeout, got {other:?}"),
    }
    rival.execute("ROLLBACK").await.unwrap();
    drop(rival);
    // Nothing of the timed-out attempt was committed.
    assert_eq!(rdb.inbox_counts().await, (0, 0));
    // Redelivered later (to a store with the normal budget), it applies once.
    let normal = rdb.store().await;
    assert_eq!(normal.apply(&event).await.unwrap(), Outcome::Applied);
    assert_eq!(
        store
            .view(&task("task-slow"))
            .await
            .unwrap()
            .unwrap()
            .applied_events,
        1
    );
}

/// The example of embedding the core (`product/result-inbox/examples/embed.rs`), run as a user would: its own
/// table written in the same transaction as the inbox row and the view.
#[tokio::test]
async fn the_embedding_example_writes_its_own_row_in_the_apply_transaction() {
    let rdb = ReceiverDb::new().await;
    rdb.customer_notices().await;
    let mut admin = rdb.admin().await;
    // A notice for version 3 exists already, so the example's write for v3 fails (1062 on its
    // own table): the inbox row and the view change of v3 must roll back with it.
    admin
        .execute("INSERT INTO customer_notices VALUES ('task-e', 3, 'CANCELLED')")
        .await
        .unwrap();
    let lines = [
        EventSpec::cancelled("evt-e1", "task-e", 1).json(),
        EventSpec::cancelled("evt-e1", "task-e", 1).json(),
        EventSpec::cancelled("evt-e3", "task-e", 3).json(),
        EventSpec::cancelled("evt-e0", "task-e", 0).json(),
    ]
    .map(|j| j.replace('\n', " "))
    .join("\n");
    let out = rdb.run_embed(&lines).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "event=evt-e1 outcome=applied",
            "event=evt-e1 outcome=duplicate",
            "event=evt-e3 error=write_failed",
            "event=- error=rejected:invalid_version",
        ]
    );
    // One notice of the example's (v1) beside the one put there; v3 left nothing.
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM customer_notices WHERE task_version = 1")
            .await,
        1
    );
    assert_eq!(rdb.inbox_counts().await, (1, 1));
    assert_eq!(
        rdb.scalar("SELECT CAST(task_version AS SIGNED) FROM receiver_task_views")
            .await,
        1
    );
}

/// R-STORE-5: concurrent first events of one new task, with distinct versions, never deadlock
/// in the view's create-or-lock (its statement takes the exclusive lock at once), so no apply
/// even needs a retry; the view ends at the highest version every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_first_versions_of_a_new_task_never_deadlock() {
    let rdb = ReceiverDb::new().await;
    let store = Arc::new(rdb.store().await);
    let mut retried = Vec::new();
    for round in 0..20 {
        let id = format!("task-new-{round}");
        let start = Arc::new(tokio::sync::Barrier::new(16));
        let mut handles = Vec::new();
        for v in 1..=16u64 {
            let (store, start) = (store.clone(), start.clone());
            let event = EventSpec::cancelled(&format!("evt-{round}-{v}"), &id, v).event();
            handles.push(tokio::spawn(async move {
                start.wait().await;
                let applied = store
                    .apply_until(&event, &result_inbox::store::NoWrite, None)
                    .await;
                (v, applied)
            }));
        }
        let mut advanced = 0;
        for h in handles {
            let (v, applied) = h.await.unwrap();
            match applied.result {
                Ok(Outcome::Applied) => advanced += 1,
                Ok(Outcome::Stale) => {}
                other => panic!("round {round}, version {v}: {other:?}"),
            }
            if applied.retries > 0 {
                retried.push((round, v, applied.retries));
            }
        }
        let view = store.view(&task(&id)).await.unwrap().unwrap();
        assert_eq!(view.task_version, 16, "round {round}");
        assert_eq!(view.applied_events, advanced, "round {round}");
    }
    assert!(
        retried.is_empty(),
        "(round, version, retries) that had to restart: {retried:?}"
    );
    assert_eq!(rdb.scalar(PLACEHOLDERS).await, 0);
}

/// R-STORE-9: a lock held past the budget costs one timeout, not a statement left waiting on
/// the server (where it would keep its own inbox row locked against the redelivery).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_runs_out_of_time_leaves_nothing_waiting_on_the_server() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let event = EventSpec::cancelled("evt-held", "task-held", 1).event();
    // The competitor holds the inbox row's lock far past the 5 s budget (MariaDB's own lock
    // wait would last 50 s).
    let mut rival = competitor(&rdb, &event).await;
    let held_since = std::time::Instant::now();
    let started = std::time::Instant::now();
    match store.apply(&event).await {
        Err(ApplyError::Timeout(_)) => {}
        other => panic!("wanted a timeout, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took <= result_inbox::store::APPLY_TIMEOUT + Duration::from_millis(250),
        "the apply took {took:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut admin = rdb.admin().await;
    let waiting: i64 = sqlx::query(
        "SELECT COUNT(*) FROM information_schema.processlist \
         WHERE db = ? AND info LIKE 'INSERT INTO receiver_inbox%'",
    )
    .bind(&rdb.db.receiver_db)
    .fetch_one(&mut admin)
    .await
    .unwrap()
    .try_get(0)
    .unwrap();
    assert_eq!(
        waiting, 0,
        "a statement of the apply still runs on the server"
    );
    // The competitor's is the only open transaction.
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM information_schema.innodb_trx")
            .await,
        1
    );
    // The competitor keeps its lock for 20 s in all, then gives up.
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(held_since.elapsed())).await;
    rival.execute("ROLLBACK").await.unwrap();
    // The redelivery waits for nothing.
    let again = std::time::Instant::now();
    assert_eq!(store.apply(&event).await.unwrap(), Outcome::Applied);
    assert!(
        again.elapsed() < Duration::from_secs(1),
        "{:?}",
        again.elapsed()
    );
}

/// A short deadline (a short lease) still leaves the apply most of its time: only a quarter,
/// at most 500 ms, is kept back for killing an abandoned statement.
#[tokio::test]
async fn an_apply_with_a_short_deadline_still_applies() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let event = EventSpec::cancelled("evt-short", "task-short", 1).event();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(400);
    let applied = store
        .apply_until(&event, &result_inbox::store::NoWrite, Some(deadline))
        .await;
    assert_eq!(applied.result.unwrap(), Outcome::Applied);
}
