//! Recovery: `receiver reconcile` as a real process against a real `orbit-dev` and a real
//! server. After the receiver's database lost its newest rows (what a restore of an older
//! backup does), it finds exactly the events lost, has the platform deliver them again, and
//! `consume` applies them through its dedup; rows `receiver prune` removed are told apart.

use std::collections::{BTreeSet, HashMap};
use std::process::Output;
use std::time::{Duration, Instant};

use conformance::process::Consumer;
use conformance::{all_acked, cancelled_task, run_receiver, QUEUE};
use sqlx::{Connection, MySqlConnection};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
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
    let (orbit, client, sub, env) =
        conformance::subscribed_receiver(&[], &["task.cancelled"]).await;
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
        "pruned",
        "redelivered",
        "result",
    ]
    .iter()
    .map(|k| s.get(*k).map_or("?", String::as_str))
    .collect();
    assert_eq!(counts, ["30", "20", "7", "3", "0", "missing"], "{stdout}");
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
    let (orbit, client, _sub, env) =
        conformance::subscribed_receiver(&[], &["task.cancelled"]).await;
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
    let (orbit, _client, sub, env) =
        conformance::subscribed_receiver(&[], &["task.cancelled"]).await;
    let mut admin = MySqlConnection::connect(orbit.db.admin_receiver_url().expose())
        .await
        .unwrap();
    conformance::insert_old_inbox_rows(&mut admin, ("task-result-view", QUEUE), "bulk", N, 100, 1)
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
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let counts: Vec<&str> = ["deliveries", "present", "missing", "pages", "result"]
        .iter()
        .map(|k| s.get(*k).map_or("?", String::as_str))
        .collect();
    assert_eq!(counts, ["10000", "10000", "0", "10", "clean"]);
    println!(
        "reconcile --dry-run over {N} ACKED deliveries: 0 missing in {:.2} s ({} s by its own count)",
        took.as_secs_f64(),
        s["seconds"]
    );
}
