//! The group apply on a real server: many events in one transaction, each with the outcome one
//! apply after another would give it, and what it costs the server.

use std::sync::Arc;

use fixtures::{EventSpec, ReceiverDb, QUEUE};
use result_inbox::store::NoWrite;
use result_inbox::{
    ApplyError, BusinessWrite, Fallback, Member, Outcome, Receipt, Store, TaskEvent, TaskId,
    WriteFuture,
};
use sqlx::MySqlConnection;

fn members<'a>(events: &'a [TaskEvent], write: &'a dyn BusinessWrite) -> Vec<Member<'a>> {
    events
        .iter()
        .map(|event| Member {
            event,
            write,
            deadline: None,
        })
        .collect()
}

/// Each member's answer, as `applied`, `stale`, `duplicate`, or the error's kind.
async fn group(store: &Store, events: &[TaskEvent]) -> (Vec<String>, Option<Fallback>) {
    let done = store.apply_group(&members(events, &NoWrite)).await;
    (
        done.results.iter().map(|a| kind(&a.result)).collect(),
        done.fallback,
    )
}

fn kind(result: &Result<Outcome, ApplyError>) -> String {
    match result {
        Ok(Outcome::Duplicate { applied }) => format!("duplicate:{applied}"),
        Ok(o) => o.kind().to_owned(),
        Err(e) => e.kind().to_owned(),
    }
}

/// Every view of `store`'s consumer (task, version, last event, applied events) and every
/// inbox row (event, applied), in key order.
async fn state(rdb: &ReceiverDb, consumer: &str) -> (Vec<String>, Vec<String>) {
    use sqlx::Row;
    let mut conn = rdb.admin().await;
    let views = sqlx::query(
        "SELECT CAST(task_id AS CHAR), task_version, CAST(last_event_id AS CHAR), applied_events \
         FROM receiver_task_views WHERE consumer_name = ? ORDER BY task_id",
    )
    .bind(consumer)
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .iter()
    .map(|r| {
        format!(
            "{} v{} {} x{}",
            r.get::<String, _>(0),
            r.get::<u64, _>(1),
            r.get::<String, _>(2),
            r.get::<u64, _>(3)
        )
    })
    .collect();
    let inbox = sqlx::query(
        "SELECT CAST(event_id AS CHAR), applied FROM receiver_inbox \
         WHERE consumer_name = ? ORDER BY event_id",
    )
    .bind(consumer)
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .iter()
    .map(|r| format!("{}={}", r.get::<String, _>(0), r.get::<bool, _>(1)))
    .collect();
    (views, inbox)
}

/// A small deterministic generator (xorshift), so that a failing seed can be replayed.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[tokio::test]
async fn a_group_gives_each_event_what_one_apply_after_another_in_version_order_gives() {
    let rdb = ReceiverDb::new().await;
    for seed in 1..=12u64 {
        let mut draw = Draw(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        // Earlier history on a few tasks, then a group of up to 24 events on the same tasks:
        // new tasks, higher and lower versions, one task twice in the group, an event whose
        // view already names it (a pruned inbox row).
        let history: Vec<TaskEvent> = (0..draw.below(6))
            .map(|i| {
                let task = format!("t{}", draw.below(4));
                EventSpec::cancelled(&format!("h{seed}-{i}"), &task, 2 + draw.below(6)).event()
            })
            .collect();
        let batch: Vec<TaskEvent> = (0..2 + draw.below(23))
            .map(|i| {
                let task = format!("t{}", draw.below(6));
                let result = format!(r#"{{"n":{i}}}"#);
                EventSpec::succeeded(&format!("g{seed}-{i}"), &task, 1 + draw.below(12), &result)
                    .event()
            })
            .collect();
        // The same version twice on one task with two event ids is a conflict in either
        // order, which the next test covers; keep this one to outcomes that always exist.
        let mut seen = std::collections::HashSet::new();
        let batch: Vec<TaskEvent> = batch
            .into_iter()
            .filter(|e| seen.insert((e.task().as_str().to_owned(), e.version())))
            .collect();

        let (grouped, alone) = (format!("grouped-{seed}"), format!("alone-{seed}"));
        let g = rdb.store_for(&grouped, QUEUE).await;
        let a = rdb.store_for(&alone, QUEUE).await;
        for e in &history {
            g.apply(e).await.unwrap();
            a.apply(e).await.unwrap();
        }
        let (answers, fallback) = group(&g, &batch).await;
        // One apply after another, in version order (by task, then version).
        let mut order: Vec<usize> = (0..batch.len()).collect();
        order.sort_by_key(|&i| (batch[i].task().as_str().to_owned(), batch[i].version()));
        let mut expected = vec![String::new(); batch.len()];
        for i in order {
            expected[i] = kind(&a.apply(&batch[i]).await);
        }
        let conflict_free = history.iter().all(|h| {
            !batch
                .iter()
                .any(|b| b.task() == h.task() && b.version() == h.version())
        });
        assert_eq!(answers, expected, "seed {seed}: each event's answer");
        if conflict_free {
            assert_eq!(fallback, None, "seed {seed}: the group needed no fallback");
        }
        let (gv, gi) = state(&rdb, &grouped).await;
        let (av, ai) = state(&rdb, &alone).await;
        assert_eq!(gv, av, "seed {seed}: the views");
        assert_eq!(gi, ai, "seed {seed}: the inbox");
    }
}

#[tokio::test]
async fn two_versions_of_a_task_in_one_group_apply_in_version_order_whatever_their_arrival() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let newer = EventSpec::succeeded("e-v5", "task-2v", 5, r#"{"v":5}"#).event();
    let older = EventSpec::succeeded("e-v3", "task-2v", 3, r#"{"v":3}"#).event();
    // The newer one arrives first: in version order the older one still applies first.
    let (answers, fallback) = group(&store, &[newer, older]).await;
    assert_eq!(answers, ["applied", "applied"]);
    assert_eq!(fallback, None);
    let view = store
        .view(&TaskId::new("task-2v").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((view.task_version, view.applied_events), (5, 2));
    assert_eq!(view.last_event_id, "e-v5");
    assert_eq!(view.last_result.as_deref(), Some(&br#"{"v":5}"#[..]));
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE applied = 1")
            .await,
        2
    );
}

#[tokio::test]
async fn a_duplicate_in_a_group_falls_back_and_costs_only_itself() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let earlier = EventSpec::cancelled("e-dup", "task-d", 1).event();
    store.apply(&earlier).await.unwrap();
    let events = [
        EventSpec::cancelled("e-a", "task-a", 1).event(),
        earlier.clone(),
        EventSpec::cancelled("e-b", "task-b", 1).event(),
        // The same event twice in one group: the second is a duplicate of the first.
        EventSpec::cancelled("e-a", "task-a", 1).event(),
    ];
    let (answers, fallback) = group(&store, &events).await;
    assert_eq!(fallback, Some(Fallback::Duplicate));
    assert_eq!(
        answers,
        ["applied", "duplicate:true", "applied", "duplicate:true"]
    );
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 3);
}

#[tokio::test]
async fn a_conflict_in_a_group_falls_back_and_costs_only_itself() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    store
        .apply(&EventSpec::cancelled("e-first", "task-c", 4).event())
        .await
        .unwrap();
    let events = [
        EventSpec::cancelled("e-x", "task-x", 1).event(),
        EventSpec::cancelled("e-other", "task-c", 4).event(),
        EventSpec::cancelled("e-y", "task-c", 5).event(),
    ];
    let (answers, fallback) = group(&store, &events).await;
    assert_eq!(fallback, Some(Fallback::Conflict));
    assert_eq!(answers, ["applied", "conflict", "applied"]);
    let view = store
        .view(&TaskId::new("task-c").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((view.task_version, view.last_event_id.as_str()), (5, "e-y"));
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE event_id = 'e-other'")
            .await,
        0
    );
}

/// A write that fails for one event id.
struct FailsFor(&'static str);

impl BusinessWrite for FailsFor {
    fn write<'a>(&'a self, _: &'a mut MySqlConnection, receipt: Receipt<'a>) -> WriteFuture<'a> {
        let fails = receipt.event.id().as_str() == self.0;
        Box::pin(async move {
            if fails {
                Err("refused by the caller".into())
            } else {
                Ok(())
            }
        })
    }
}

#[tokio::test]
async fn a_failing_write_in_a_group_falls_back_and_costs_only_its_event() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let events: Vec<TaskEvent> = (0..4)
        .map(|i| EventSpec::cancelled(&format!("e-w{i}"), &format!("task-w{i}"), 1).event())
        .collect();
    let write = FailsFor("e-w2");
    let done = store.apply_group(&members(&events, &write)).await;
    assert_eq!(done.fallback, Some(Fallback::Write));
    let answers: Vec<String> = done.results.iter().map(|a| kind(&a.result)).collect();
    assert_eq!(answers, ["applied", "applied", "write_failed", "applied"]);
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 3);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE event_id = 'e-w2'")
            .await,
        0
    );
}

/// The server's global counters: statements from clients (prepares included), commits,
/// rollbacks; read in one statement.
async fn counters(conn: &mut MySqlConnection) -> [i64; 3] {
    use sqlx::Row;
    let row = sqlx::query(
        "SELECT SUM(IF(VARIABLE_NAME = 'QUESTIONS', VARIABLE_VALUE, 0)), \
                SUM(IF(VARIABLE_NAME = 'COM_COMMIT', VARIABLE_VALUE, 0)), \
                SUM(IF(VARIABLE_NAME = 'COM_ROLLBACK', VARIABLE_VALUE, 0)) \
         FROM information_schema.GLOBAL_STATUS",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    [0, 1, 2].map(|i| row.get::<f64, _>(i) as i64)
}

#[tokio::test]
async fn a_group_of_sixteen_costs_at_most_half_a_round_trip_and_a_sixteenth_of_a_commit_each() {
    // A server of this test's own: no other test moves its global counters.
    let server = testdb::Server::local().expect("a local server");
    let rdb = ReceiverDb::on(&server).await;
    let store = rdb.store().await;
    // Half the tasks have a view already (advanced), half are new (created), two are stale;
    // the same shape twice, the first to prepare the connection's statements.
    let shape = |round: &str| -> Vec<TaskEvent> {
        (0..16)
            .map(|i| {
                let version = if i < 2 { 1 } else { 9 };
                let task = format!("task-{round}{i}");
                EventSpec::cancelled(&format!("e-{round}{i}"), &task, version).event()
            })
            .collect()
    };
    for round in ["w", "q"] {
        for i in 0..8 {
            let task = format!("task-{round}{i}");
            store
                .apply(&EventSpec::cancelled(&format!("old-{round}{i}"), &task, 5).event())
                .await
                .unwrap();
        }
    }
    assert_eq!(group(&store, &shape("w")).await.1, None);
    let events = shape("q");
    // Reading the counters is itself statements: measured and taken off.
    let mut admin = rdb.admin().await;
    let a = counters(&mut admin).await;
    let b = counters(&mut admin).await;
    let (answers, fallback) = group(&store, &events).await;
    let c = counters(&mut admin).await;
    assert_eq!(fallback, None);
    assert_eq!(&answers[..3], ["stale", "stale", "applied"]);
    let reading = b[0] - a[0];
    let questions = c[0] - b[0] - reading;
    let commits = c[1] - b[1];
    assert!(
        questions <= 7,
        "{questions} statements for 16 events, where seven at most are the group's (reading the counters costs {reading})"
    );
    assert_eq!(commits, 1, "one commit for the group");
    assert_eq!(c[2] - b[2], 0, "no rollback");

    // Four of sixteen recorded already (redeliveries): the group rolls back, the four resolve
    // alone as duplicates, and the other twelve commit as one group, not one by one.
    let mut again: Vec<TaskEvent> = shape("r");
    again[..4].clone_from_slice(&events[..4]);
    // Two stale first receipts, two applied, then a new event.
    let redelivered = [
        "duplicate:false",
        "duplicate:false",
        "duplicate:true",
        "duplicate:true",
        "applied",
    ];
    let d = counters(&mut admin).await;
    let (answers, fallback) = group(&store, &again).await;
    let e = counters(&mut admin).await;
    assert_eq!(fallback, Some(Fallback::Duplicate));
    assert_eq!(&answers[..5], redelivered);
    assert_eq!(e[1] - d[1], 1, "the twelve new events commit in one group");
    assert_eq!(
        e[2] - d[2],
        1 + 4,
        "the first try and each duplicate roll back"
    );

    // Redeliveries keep coming: the store's next group reads which of its events are recorded
    // and answers those inside the group, with no rollback and no transaction of their own.
    let mut third: Vec<TaskEvent> = shape("s");
    third[..2].clone_from_slice(&events[..2]);
    third[2..4].clone_from_slice(&again[4..6]);
    let f = counters(&mut admin).await;
    let (answers, fallback) = group(&store, &third).await;
    let g = counters(&mut admin).await;
    assert_eq!(
        fallback, None,
        "the recorded events are answered in the group"
    );
    assert_eq!(&answers[..5], redelivered);
    let questions = g[0] - f[0] - reading;
    assert!(
        questions <= 8,
        "{questions} statements for 16 events, four of them redeliveries, where eight at most are the group's"
    );
    assert_eq!(g[1] - f[1], 1, "one commit for the group");
    assert_eq!(g[2] - f[2], 0, "no rollback");

    // A recorded event delivered with other content: the group falls back, that event alone
    // reports the conflict, and the others still apply.
    let mut fourth: Vec<TaskEvent> = shape("t");
    fourth[5] = EventSpec::cancelled("e-s9", "task-s9", 10).event();
    let (answers, fallback) = group(&store, &fourth).await;
    assert_eq!(fallback, Some(Fallback::Duplicate));
    assert_eq!(answers[5], "conflict");
    assert_eq!(
        answers.iter().filter(|a| *a == "applied").count(),
        15,
        "{answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_groups_over_the_same_tasks_end_at_the_highest_versions_without_deadlock() {
    let rdb = ReceiverDb::new().await;
    let store = Arc::new(rdb.store().await);
    // Eight groups of sixteen, over the same eight tasks, versions shuffled between them.
    let mut handles = Vec::new();
    let mut highest = std::collections::BTreeMap::new();
    for g in 0..8 {
        let events: Vec<TaskEvent> = (0..16)
            .map(|i| {
                let task = format!("task-k{}", (i + g) % 8);
                let version = 1 + g * 16 + i;
                let e = EventSpec::cancelled(&format!("e-{g}-{i}"), &task, version).event();
                let top = highest.entry(task).or_insert(0);
                *top = (*top).max(version);
                e
            })
            .collect();
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let done = store.apply_group(&members(&events, &NoWrite)).await;
            done.results
                .into_iter()
                .map(|a| a.result.map_err(|e| e.to_string()))
                .collect::<Vec<_>>()
        }));
    }
    let mut applied = 0;
    for h in handles {
        for r in h.await.unwrap() {
            let outcome = r.expect("every event of every group is recorded");
            if outcome == Outcome::Applied {
                applied += 1;
            }
        }
    }
    for (task, top) in &highest {
        let view = store
            .view(&TaskId::new(task.clone()).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.task_version, *top, "{task}");
    }
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 128);
    assert_eq!(
        rdb.scalar("SELECT CAST(SUM(applied_events) AS SIGNED) FROM receiver_task_views")
            .await,
        applied
    );
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE applied = 1")
            .await,
        applied
    );
}

/// Two groups that both find no view for the same new tasks and both mean to create them: the
/// proxy answers every statement on the views 200 ms late, so both groups have read "none"
/// before either creates. The second creator meets the first's row, tries again, locks the
/// views the first made and judges against them; it never writes over them blindly (a view
/// would lose the first group's version or its count). Whichever group creates first, the
/// views end at the higher versions, and each counts the events that advanced it: two when
/// the lower group came first, one when it came second (its events then stale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_creating_the_same_views_at_once_both_count_and_the_highest_version_wins() {
    use commit_proxy::{Action, On, RuleSpec};
    let rdb = ReceiverDb::new().await;
    let proxy = rdb.proxy().await;
    let mut rule = RuleSpec::new(Action::Delay { delay_ms: 200 }).on(On::Any);
    rule.contains = Some("receiver_task_views".into());
    proxy.arm(rule).unwrap();
    let store = rdb.store_via(proxy.local_addr()).await;
    let batch = |tag: &str, base: u64| -> Vec<TaskEvent> {
        (0..8)
            .map(|k| {
                EventSpec::cancelled(&format!("e-{tag}-{k}"), &format!("task-race{k}"), base + k)
                    .event()
            })
            .collect()
    };
    let (low, high) = (batch("low", 10), batch("high", 20));
    let (low, high) = (members(&low, &NoWrite), members(&high, &NoWrite));
    let (a, b) = tokio::join!(store.apply_group(&low), store.apply_group(&high));
    for r in &b.results {
        assert_eq!(r.result.as_ref().ok(), Some(&Outcome::Applied), "{r:?}");
    }
    let want: Vec<String> = a
        .results
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let count = match r.result {
                Ok(Outcome::Applied) => 2,
                Ok(Outcome::Stale) => 1,
                ref other => panic!("task-race{k}'s lower event: {other:?}"),
            };
            format!("task-race{k} v{} e-high-{k} x{count}", 20 + k)
        })
        .collect();
    let (views, _) = state(&rdb, "task-result-view").await;
    assert_eq!(views, want);
}

/// A histogram's count, sum and `le="1.0"` bucket from a scrape's text.
fn histogram(text: &str, name: &str) -> (f64, f64, f64) {
    let sample = |line_start: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(line_start))
            .unwrap_or_else(|| panic!("no {line_start} in:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    };
    (
        sample(&format!("{name}_count ")),
        sample(&format!("{name}_sum ")),
        sample(&format!("{name}_bucket{{le=\"1.0\"}} ")),
    )
}

/// A backlog of `tasks` cancelled tasks (two deliveries each), drained by one consumer with
/// `group_max`; the group histogram's count, sum and single-delivery groups, and the
/// consumer's log.
async fn drain(tasks: usize, group_max: &str) -> ((f64, f64, f64), String) {
    let (orbit, client, sub, mut env) = fixtures::subscribed_receiver(
        &["--lease-seconds", "30"],
        &["task.submitted", "task.cancelled"],
    )
    .await;
    for _ in 0..tasks {
        let task = client.submit_task(QUEUE, None).await.unwrap();
        client.cancel_task(&task.id).await.unwrap();
    }
    env.push(("RECEIVER_CONCURRENCY", "16".into()));
    env.push(("RECEIVER_GROUP_MAX", group_max.into()));
    env.push(("RECEIVER_METRICS_LISTEN", "127.0.0.1:0".into()));
    let consumer = fixtures::process::Consumer::normal(&env);
    let addr = consumer.metrics_addr().await;
    fixtures::all_acked(
        &client,
        &sub.id,
        Some(2 * tasks),
        std::time::Duration::from_secs(60),
    )
    .await;
    let (status, text) = fixtures::http_raw(&addr, "GET", "/metrics", None, None);
    assert_eq!(status, 200, "{text}");
    let log = consumer.output();
    consumer.stop().await;
    drop(orbit);
    (histogram(&text, "receiver_group_size"), log)
}

/// The log's lines of ACKed deliveries (applied, or stale when a task's cancellation came
/// before its submission).
fn acked_lines(log: &str) -> usize {
    log.lines()
        .filter(|l| {
            l.contains(" delivery classification=applied ")
                || l.contains(" delivery classification=stale ")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_drains_a_backlog_in_groups_and_logs_and_acks_each_delivery() {
    let ((groups, deliveries, singles), log) = drain(60, "16").await;
    assert_eq!(
        deliveries, 120.0,
        "every delivery was applied in a group ({groups} groups)"
    );
    assert!(
        groups < deliveries / 2.0 && singles < groups,
        "{groups} groups of {deliveries} deliveries, {singles} of them alone: groups formed"
    );
    // One line per delivery, as without groups.
    assert_eq!(acked_lines(&log), 120, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_with_a_group_size_of_one_applies_each_delivery_alone() {
    let ((groups, deliveries, singles), log) = drain(10, "1").await;
    // No group is formed at all: each delivery is its own transaction.
    assert_eq!((groups, deliveries, singles), (0.0, 0.0, 0.0));
    assert_eq!(acked_lines(&log), 20, "{log}");
}

/// The lines consume logs for a backlog of 40 redeliveries of applied events among 40 new
/// events (20 tasks, then 20 more), taken at concurrency 16 by `receiver`, or by
/// `receiver-mutant` with `mutant`: (lines of new events applied or stale, lines of
/// duplicates), and the log.
async fn split_backlog(mutant: Option<&str>) -> ((usize, usize), String) {
    use fixtures::process::Consumer;
    use std::time::Duration;
    let (orbit, client, sub, mut env) = fixtures::subscribed_receiver(
        &["--lease-seconds", "30", "--enable-fault-api"],
        &["task.submitted", "task.cancelled"],
    )
    .await;
    for _ in 0..20 {
        let task = client.submit_task(QUEUE, None).await.unwrap();
        client.cancel_task(&task.id).await.unwrap();
    }
    let first = Consumer::normal(&env);
    fixtures::all_acked(&client, &sub.id, Some(40), Duration::from_secs(60)).await;
    first.stop().await;
    let applied = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap();
    // Each new task's two events beside two redeliveries, so that most groups hold both.
    for pair in applied.chunks(2) {
        let task = client.submit_task(QUEUE, None).await.unwrap();
        client.cancel_task(&task.id).await.unwrap();
        for d in pair {
            orbit.fault(serde_json::json!({"fault": "duplicate-event", "event_id": d.event_id}));
        }
    }
    env.push(("RECEIVER_CONCURRENCY", "16".into()));
    let consumer = match mutant {
        None => Consumer::normal(&env),
        Some(m) => {
            env.push(("RECEIVER_MUTANT", m.into()));
            let bin = fixtures::workspace_bin("receiver-mutant");
            Consumer::start(fixtures::bare_command(&bin), &env, &[])
        }
    };
    fixtures::all_acked(&client, &sub.id, Some(120), Duration::from_secs(60)).await;
    let log = consumer.output();
    consumer.stop().await;
    drop(orbit);
    let duplicates = log
        .lines()
        .filter(|l| l.contains(" delivery classification=duplicate "))
        .count();
    ((acked_lines(&log), duplicates), log)
}

/// After a duplicate splits a group, the events already recorded resolve alone and the rest
/// commit once more as a group: consume's account of each delivery stays exact (each first
/// receipt applied or stale, each redelivery a duplicate). The mutant whose fallback applies
/// the rest a second time (`fallback-applies-twice`) reports first receipts as duplicates,
/// and this test tells it apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_duplicate_splits_a_group_each_first_receipt_is_logged_applied_and_each_redelivery_duplicate(
) {
    let (lines, log) = split_backlog(None).await;
    assert_eq!(lines, (40, 40), "{log}");
    let (lines, log) = split_backlog(Some("fallback-applies-twice")).await;
    assert!(
        lines.0 < 40 && lines.1 > 40,
        "the mutant's first receipts should come out duplicates: {lines:?}\n{log}"
    );
}

/// One group at a time is the rule, but a group held up must not hold back the deliveries
/// behind it: with one task's view locked by another session, its delivery's group waits for
/// the lock, and the new tasks delivered meanwhile are applied and ACKed by another worker
/// while it does (after 100 ms; the apply's own budget is 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_held_on_a_lock_does_not_hold_back_the_deliveries_behind_it() {
    use sqlx::{Connection, Executor};
    use std::time::{Duration, Instant};
    let (orbit, client, sub, mut env) = fixtures::subscribed_receiver(
        &["--lease-seconds", "30"],
        &["task.submitted", "task.cancelled"],
    )
    .await;
    env.push(("RECEIVER_CONCURRENCY", "16".into()));
    env.push(("RECEIVER_GROUP_MAX", "16".into()));
    let consumer = fixtures::process::Consumer::normal(&env);
    let held = client.submit_task(QUEUE, None).await.unwrap();
    fixtures::all_acked(&client, &sub.id, Some(1), Duration::from_secs(20)).await;

    // Another session locks the task's view; its cancellation's group then waits on it.
    let mut locker = MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    // That one row only, by its whole key, as the receiver's own transactions lock rows.
    locker
        .execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await
        .unwrap();
    locker.execute("BEGIN").await.unwrap();
    sqlx::query(
        "SELECT task_version FROM receiver_task_views \
         WHERE consumer_name = 'task-result-view' AND queue_id = ? AND task_id = ? FOR UPDATE",
    )
    .bind(QUEUE)
    .bind(held.id.as_str())
    .fetch_one(&mut locker)
    .await
    .unwrap();
    client.cancel_task(&held.id).await.unwrap();
    let state_of = |task: String| {
        let (client, sub) = (client.clone(), sub.id.clone());
        async move {
            client
                .list_deliveries(&sub, &Default::default())
                .await
                .unwrap()
                .into_iter()
                .filter(|d| d.task_id == task)
                .map(|d| d.state)
                .collect::<Vec<_>>()
        }
    };
    // The cancellation is leased (taken by a worker), not ACKed.
    fixtures::eventually(
        Duration::from_secs(10),
        "the held task's cancellation leased",
        || {
            let states = state_of(held.id.clone());
            async move { states.await.contains(&"LEASED".to_owned()) }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let mut others = Vec::new();
    for _ in 0..5 {
        others.push(client.submit_task(QUEUE, None).await.unwrap().id);
    }
    // Each new task's delivery ACKed, or the time runs out.
    let mut waiting = others.clone();
    while !waiting.is_empty() && started.elapsed() < Duration::from_secs(3) {
        let mut left = Vec::new();
        for task in waiting {
            if state_of(task.clone()).await != ["ACKED"] {
                left.push(task);
            }
        }
        waiting = left;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waited = started.elapsed();
    let still_held = state_of(held.id.clone()).await;
    // Released: the held group commits, and every delivery ends ACKed.
    locker.execute("ROLLBACK").await.unwrap();
    fixtures::all_acked(&client, &sub.id, Some(7), Duration::from_secs(20)).await;
    let log = consumer.output();
    consumer.stop().await;
    assert!(
        waiting.is_empty(),
        "{} new deliveries not ACKed within {waited:?} behind the held group\n{log}",
        waiting.len()
    );
    assert!(
        still_held.contains(&"LEASED".to_owned()),
        "the held task's cancellation should still have waited for the lock: {still_held:?}\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_inside_a_group_loses_nothing_and_a_new_one_applies_each_event_once() {
    use fixtures::process::{Barrier, Consumer};
    use sqlx::Connection;
    use std::time::Duration;
    let (orbit, client, sub, mut env) = fixtures::subscribed_receiver(
        &["--lease-seconds", "2"],
        &["task.submitted", "task.cancelled"],
    )
    .await;
    env.push(("RECEIVER_CONCURRENCY", "16".into()));
    let mut tasks = Vec::new();
    for point in [
        Barrier::AfterInboxRows,
        Barrier::AfterViews,
        Barrier::BeforeCommit,
    ] {
        // A backlog of new events, so that groups form and none falls back on a duplicate.
        for _ in 0..12 {
            let task = client.submit_task(QUEUE, None).await.unwrap();
            client.cancel_task(&task.id).await.unwrap();
            tasks.push(task.id);
        }
        let mut c = Consumer::faulty(&env, &[(point, 1)]);
        let hit = c.wait_barrier(point, Duration::from_secs(20)).await;
        assert_eq!(hit.point, point);
        let log = c.sigkill();
        // Killed inside the transaction: the event held at the barrier has no line of a
        // handled delivery.
        let id = format!("event_id=\"{}\"", hit.key);
        assert!(
            !log.lines()
                .any(|l| l.contains(&id) && l.contains(" delivery classification=")),
            "{point}: the event held at the barrier was logged as handled:\n{log}"
        );
    }
    let last = Consumer::normal(&env);
    fixtures::all_acked(&client, &sub.id, None, Duration::from_secs(60)).await;
    last.stop().await;
    let mut admin = MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    fixtures::check_ledger(&mut admin, &client, &sub.id, &tasks, "killed inside groups")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn a_group_whose_commit_ok_is_lost_is_unconfirmed_whole_and_resolved_event_by_event() {
    use commit_proxy::{Action, RuleSpec};
    let rdb = ReceiverDb::new().await;
    let proxy = rdb.proxy().await;
    let proxied = rdb.store_via(proxy.local_addr()).await;
    let events: Vec<TaskEvent> = (0..6)
        .map(|i| EventSpec::cancelled(&format!("e-lost{i}"), &format!("task-lost{i}"), 1).event())
        .collect();
    let rule = proxy
        .arm(RuleSpec::new(Action::DropCommitOk).once())
        .unwrap();
    let (answers, fallback) = group(&proxied, &events).await;
    assert_eq!(fallback, None);
    assert_eq!(answers, vec!["commit_unconfirmed"; 6]);
    let fired = rule
        .fired_within(std::time::Duration::from_secs(5))
        .await
        .expect("the rule fired");
    assert_eq!((fired.statement, fired.reply), ("commit", "ok"));
    // The server committed the group; each event's redelivery finds it, one at a time or as
    // a group again, and applies nothing twice.
    let fresh = rdb.store().await;
    assert_eq!(
        fresh.apply(&events[0]).await.unwrap(),
        Outcome::Duplicate { applied: true }
    );
    let (answers, fallback) = group(&fresh, &events[1..]).await;
    assert_eq!(fallback, Some(Fallback::Duplicate));
    assert_eq!(answers, vec!["duplicate:true"; 5]);
    assert_eq!(
        rdb.scalar("SELECT CAST(SUM(applied_events) AS SIGNED) FROM receiver_task_views")
            .await,
        6
    );
}
