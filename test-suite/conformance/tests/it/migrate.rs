//! Upgrades: `receiver migrate` as a real process against a real server (the index step on an
//! inbox made without it, a kill at each point of a step, two runs at once, a step that would
//! block writes, bad input), and every program's check of the schema's version at start.
//!
//! The steps beyond the product's own come from the fault build (`receiver-faults` with
//! `RECEIVER_TEST_SCHEMA_STEP`): a test-only version 3 that the machinery is proven on; the
//! index step is the product's real one.

use std::process::Output;
use std::time::{Duration, Instant};

use commit_proxy::{Action, On, RuleSpec};
use fixtures::process::{receiver_faults_bin, Barrier, Consumer};
use fixtures::{bare_command, receiver_bin, ReceiverDb};
use sqlx::{Executor, MySqlConnection, Row};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Standard error without the fault build's own announcement.
fn errors(out: &Output) -> String {
    text(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with("receiver-faults: TEST BUILD"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Yesterday at midnight, UTC, in RFC 3339.
fn yesterday() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        / 86_400;
    let (y, m, d) = result_inbox::canonical::date_from_epoch_days(days - 1);
    format!("{y:04}-{m:02}-{d:02}T00:00:00Z")
}

/// `bin ARGS` with only `env`; its exit and output.
fn run(bin: &std::path::Path, args: &[&str], env: &[(&str, String)]) -> Output {
    bare_command(bin)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the receiver runs")
}

/// The environment of `migrate` as the init account.
fn init_env(rdb: &ReceiverDb) -> Vec<(&'static str, String)> {
    vec![("ORBIT_RECEIVER_DSN", rdb.db.init_url().expose().to_owned())]
}

/// [`init_env`] with the fault build's test-only step `kind` (`instant` or `copy`).
fn with_step(rdb: &ReceiverDb, kind: &str) -> Vec<(&'static str, String)> {
    let mut env = init_env(rdb);
    env.push(("RECEIVER_TEST_SCHEMA_STEP", kind.to_owned()));
    env
}

async fn count(admin: &mut MySqlConnection, sql: &str) -> i64 {
    sqlx::query(sql)
        .fetch_one(admin)
        .await
        .and_then(|r| r.try_get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn has_index(admin: &mut MySqlConnection) -> bool {
    count(
        admin,
        "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() \
         AND table_name = 'receiver_inbox' AND index_name = 'receiver_inbox_received_at'",
    )
    .await
        > 0
}

async fn has_column(admin: &mut MySqlConnection, column: &str) -> bool {
    count(
        admin,
        &format!(
            "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() \
             AND table_name = 'receiver_task_views' AND column_name = '{column}'"
        ),
    )
    .await
        > 0
}

async fn has_ledger(admin: &mut MySqlConnection) -> bool {
    count(
        admin,
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() \
         AND table_name = 'receiver_schema_versions'",
    )
    .await
        > 0
}

/// The version as a DBA reads it, with the one `SELECT` docs/upgrading.md gives.
async fn recorded(admin: &mut MySqlConnection) -> i64 {
    count(
        admin,
        "SELECT CAST(COALESCE(MAX(version), 0) AS SIGNED) FROM receiver_schema_versions \
         WHERE state <> 'started'",
    )
    .await
}

/// The ledger's state of `version`.
async fn state_of(admin: &mut MySqlConnection, version: u32) -> Option<String> {
    sqlx::query("SELECT CAST(state AS CHAR) FROM receiver_schema_versions WHERE version = ?")
        .bind(version)
        .fetch_optional(admin)
        .await
        .unwrap()
        .map(|r| r.get::<String, _>(0))
}

const DROP_INDEX: &str = "ALTER TABLE receiver_inbox DROP INDEX receiver_inbox_received_at";
const DROP_LEDGER: &str = "DROP TABLE receiver_schema_versions, receiver_schema_lock";

async fn exec(admin: &mut MySqlConnection, statements: &[&str]) {
    for s in statements {
        admin
            .execute(*s)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
}

/// A receiver database as an inbox made before the `received_at` index and before any
/// version was recorded: `init`'s tables, the index and the ledger dropped.
async fn inbox_without_index() -> (ReceiverDb, MySqlConnection) {
    let rdb = ReceiverDb::new().await;
    let mut admin = rdb.admin().await;
    exec(&mut admin, &[DROP_INDEX, DROP_LEDGER]).await;
    (rdb, admin)
}

#[tokio::test]
async fn dry_run_then_migrate_adds_the_index_online_and_records_it_and_a_second_run_does_nothing() {
    let (rdb, mut admin) = inbox_without_index().await;
    let env = init_env(&rdb);

    let dry = run(&receiver_bin(), &["migrate", "--dry-run"], &env);
    let out = text(&dry.stdout);
    assert!(dry.status.success(), "{out}{}", text(&dry.stderr));
    let first = out.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("schema_version=1 target=2 "),
        "the first line names both versions: {out}"
    );
    assert!(first.contains("recorded=no"), "{out}");
    assert!(
        out.contains(
            "step 2 inbox-received-at-index on receiver_inbox: ALGORITHM=INPLACE LOCK=NONE"
        ),
        "{out}"
    );
    assert!(
        out.contains("ADD INDEX receiver_inbox_received_at"),
        "{out}"
    );
    assert!(!has_index(&mut admin).await, "a dry run added the index");
    assert!(!has_ledger(&mut admin).await, "a dry run made the ledger");

    // The runtime account may not migrate: one line, exit 2, nothing made.
    let runtime = vec![(
        "ORBIT_RECEIVER_DSN",
        rdb.db.runtime_url().expose().to_owned(),
    )];
    let refused = run(&receiver_bin(), &["migrate"], &runtime);
    let err = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("runs as the init account"), "{err}");
    assert!(!has_index(&mut admin).await && !has_ledger(&mut admin).await);

    let migrated = run(&receiver_bin(), &["migrate"], &env);
    let out = text(&migrated.stdout);
    assert!(migrated.status.success(), "{out}{}", text(&migrated.stderr));
    assert!(out.starts_with("schema_version=1 target=2"), "{out}");
    assert!(
        out.contains("applied step 2 inbox-received-at-index"),
        "{out}"
    );
    assert!(
        out.lines()
            .last()
            .unwrap_or_default()
            .starts_with("migrated from=1 to=2 applied=1 recorded=0"),
        "{out}"
    );
    assert!(has_index(&mut admin).await);
    assert_eq!(recorded(&mut admin).await, 2);
    assert_eq!(state_of(&mut admin, 1).await.as_deref(), Some("recognised"));
    assert_eq!(state_of(&mut admin, 2).await.as_deref(), Some("applied"));

    let again = run(&receiver_bin(), &["migrate"], &env);
    let out = text(&again.stdout);
    assert!(again.status.success(), "{out}{}", text(&again.stderr));
    assert_eq!(
        out.trim(),
        "schema_version=2 target=2\nschema_version=2: already at the target; nothing to do"
    );
    // The lock is free again.
    assert_eq!(
        count(
            &mut admin,
            "SELECT COUNT(*) FROM receiver_schema_lock WHERE holder IS NOT NULL"
        )
        .await,
        0
    );
}

/// `init` records its version; an inbox of 0.1.0's shape (the index, no ledger) is recognised
/// as version 2 and only recorded.
#[tokio::test]
async fn init_records_its_version_and_an_unrecorded_inbox_is_recognised_by_its_shape() {
    let rdb = ReceiverDb::new().await;
    let mut admin = rdb.admin().await;
    assert_eq!(recorded(&mut admin).await, 2);
    exec(&mut admin, &[DROP_LEDGER]).await;
    let out = run(&receiver_bin(), &["migrate"], &init_env(&rdb));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with("schema_version=2 target=2 recorded=no"),
        "{stdout}"
    );
    assert!(
        stdout.contains("recorded versions 1 to 2 as recognised"),
        "{stdout}"
    );
    assert_eq!(recorded(&mut admin).await, 2);
    assert_eq!(state_of(&mut admin, 2).await.as_deref(), Some("recognised"));
}

/// A newer schema than a program knows: each refuses with one line naming both versions,
/// before it touches a row; `consume` takes no lease. An older one it still runs on: a warning
/// naming `receiver migrate`.
#[tokio::test]
async fn every_program_refuses_a_newer_schema_before_touching_anything() {
    let (orbit, client, sub, env) = fixtures::subscribed_receiver(&[], &["task.cancelled"]).await;
    let task = fixtures::cancelled_task(&client).await;
    let mut admin: MySqlConnection =
        sqlx::Connection::connect(orbit.db.admin_receiver_url().expose())
            .await
            .unwrap();
    admin
        .execute(
            "INSERT INTO receiver_schema_versions \
             (version, name, state, statement, started_at, applied_at, applied_by) \
             VALUES (7, 'from-the-future', 'applied', 'ALTER TABLE …', UTC_TIMESTAMP(6), \
             UTC_TIMESTAMP(6), 'a later release')",
        )
        .await
        .unwrap();

    let names_both = |err: &str| err.contains("schema version 7") && err.contains("version 2");
    let mut consume = Consumer::normal(&env);
    let status = consume.ends_within(Duration::from_secs(20)).await;
    let err = consume.output();
    assert_eq!(status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("receiver consume:"))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(names_both(line), "{line}");
    let deliveries = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap();
    assert!(!deliveries.is_empty());
    for d in &deliveries {
        assert_eq!(
            (d.state.as_str(), d.attempts),
            ("PENDING", 0),
            "a delivery was leased: {d:?}"
        );
    }
    assert_eq!(orbit.view(&task).await, None);

    let mut inspect_env = env.clone();
    inspect_env.retain(|(k, _)| *k != "ORBIT_URL");
    let inspect = run(
        &receiver_bin(),
        &["inspect", "--task-id", &task],
        &inspect_env,
    );
    let err = text(&inspect.stderr);
    assert_eq!(inspect.status.code(), Some(1), "{err}");
    assert!(names_both(&err) && err.lines().count() == 1, "{err}");

    let prune_env = fixtures::prune_env(&orbit.db.prune_url());
    let prune = run(
        &receiver_bin(),
        &["prune", "--older-than", "30d"],
        &prune_env,
    );
    let err = text(&prune.stderr);
    assert_ne!(prune.status.code(), Some(0), "{err}");
    assert!(names_both(&err) && err.lines().count() == 1, "{err}");

    let reconcile = run(
        &receiver_bin(),
        &["reconcile", "--since", &yesterday(), "--dry-run"],
        &env,
    );
    let err = text(&reconcile.stderr);
    assert_eq!(reconcile.status.code(), Some(1), "{err}");
    assert!(names_both(&err) && err.lines().count() == 1, "{err}");

    let migrate = run(
        &receiver_bin(),
        &["migrate"],
        &[(
            "ORBIT_RECEIVER_DSN",
            orbit.db.init_url().expose().to_owned(),
        )],
    );
    let err = text(&migrate.stderr);
    assert_eq!(migrate.status.code(), Some(4), "{err}");
    assert!(names_both(&err), "{err}");
    assert_eq!(
        text(&migrate.stdout).trim(),
        "schema_version=7 target=2",
        "never migrated down"
    );
    assert_eq!(
        recorded(&mut admin).await,
        7,
        "the ledger was left as it was"
    );

    // Version 1 (no index, nothing recorded): inspect runs, with a warning naming migrate.
    exec(&mut admin, &[DROP_LEDGER, DROP_INDEX]).await;
    let inspect = run(
        &receiver_bin(),
        &["inspect", "--task-id", &task],
        &inspect_env,
    );
    let err = text(&inspect.stderr);
    assert!(inspect.status.success(), "{err}");
    assert!(
        err.contains("schema version 1, older than") && err.contains("receiver migrate"),
        "{err}"
    );
}

/// SIGKILL at each point of a step (after it is recorded as started, and after its statement
/// before it is recorded as applied): the next run takes the dead run's lock over, reads the
/// table's shape, and finishes the step once.
#[tokio::test]
async fn a_migrate_killed_mid_step_is_finished_by_the_next_run() {
    let (before, after) = tokio::join!(
        killed_at(Barrier::StepStarted),
        killed_at(Barrier::StepDone)
    );
    // Before the statement: the next run ran it. After it: the next run only recorded it.
    assert!(
        before.contains("applied step 3 test-drill-column"),
        "{before}"
    );
    assert!(
        before.contains("migrated from=2 to=3 applied=1 recorded=0"),
        "{before}"
    );
    assert!(
        after.contains("recorded step 3 test-drill-column: the table already had it"),
        "{after}"
    );
    assert!(
        after.contains("migrated from=2 to=3 applied=0 recorded=1"),
        "{after}"
    );
}

/// One database: a migrate to the test step killed at `barrier`, then a second run; the
/// second's output.
async fn killed_at(barrier: Barrier) -> String {
    let rdb = ReceiverDb::new().await;
    let mut admin = rdb.admin().await;
    let env = with_step(&rdb, "instant");
    let mut first = Consumer::faulty_command(&["migrate"], &env, &[(barrier, 1)]);
    first.wait_barrier(barrier, Duration::from_secs(20)).await;
    first.sigkill();
    assert_eq!(state_of(&mut admin, 3).await.as_deref(), Some("started"));
    assert_eq!(
        has_column(&mut admin, "drill_note").await,
        barrier == Barrier::StepDone
    );

    let t = Instant::now();
    let second = run(&receiver_faults_bin(), &["migrate"], &env);
    let (out, err) = (text(&second.stdout), text(&second.stderr));
    assert!(second.status.success(), "killed at {barrier}: {out}{err}");
    assert!(
        out.starts_with("schema_version=2 target=3 unfinished_step=3"),
        "{out}"
    );
    assert!(
        err.contains("took over the migration lock from receiver"),
        "the dead run's lock was taken over: {err}"
    );
    assert!(t.elapsed() < Duration::from_secs(40), "{:?}", t.elapsed());
    assert!(has_column(&mut admin, "drill_note").await);
    assert_eq!(state_of(&mut admin, 3).await.as_deref(), Some("applied"));
    assert_eq!(recorded(&mut admin).await, 3);
    out
}

/// A connection lost mid-step (reset by the proxy as the step's statement goes out, so the
/// server never runs it): one line naming the step, exit 1, the step left recorded as started
/// and the lock freed at once; the next run applies it.
#[tokio::test]
async fn a_connection_lost_mid_step_leaves_it_started_and_the_next_run_finishes_it() {
    let (rdb, mut admin) = inbox_without_index().await;
    let proxy = rdb.proxy().await;
    let rule = proxy
        .arm(RuleSpec {
            contains: Some("ADD INDEX".into()),
            ..RuleSpec::new(Action::Reset).on(On::Any).once()
        })
        .unwrap();
    let via = rdb
        .db
        .init_url()
        .expose()
        .replace(rdb.db.address(), &proxy.local_addr().to_string());
    let env = vec![("ORBIT_RECEIVER_DSN", via)];
    let cut = tokio::task::spawn_blocking({
        let env = env.clone();
        move || run(&receiver_bin(), &["migrate"], &env)
    })
    .await
    .unwrap();
    let err = text(&cut.stderr);
    assert_eq!(cut.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("step 2 (inbox-received-at-index) failed")
            && err.contains("`receiver migrate` resumes it"),
        "{err}"
    );
    assert_eq!(rule.firings().len(), 1);
    assert!(!has_index(&mut admin).await);
    assert_eq!(state_of(&mut admin, 2).await.as_deref(), Some("started"));
    assert_eq!(
        count(
            &mut admin,
            "SELECT COUNT(*) FROM receiver_schema_lock WHERE holder IS NOT NULL"
        )
        .await,
        0,
        "the lock was left held"
    );

    let t = Instant::now();
    let resumed = tokio::task::spawn_blocking(move || run(&receiver_bin(), &["migrate"], &env))
        .await
        .unwrap();
    let out = text(&resumed.stdout);
    assert!(resumed.status.success(), "{out}{}", text(&resumed.stderr));
    assert!(
        out.starts_with("schema_version=1 target=2 unfinished_step=2"),
        "{out}"
    );
    assert!(
        out.contains("applied step 2 inbox-received-at-index"),
        "{out}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the next run waited for a lock nobody held: {:?}",
        t.elapsed()
    );
    assert!(has_index(&mut admin).await);
    assert_eq!(recorded(&mut admin).await, 2);
}

/// Two runs at once: the second waits, saying for whom, while the first holds the lock (held
/// at a barrier inside its step), and finds the step done when it gets the lock; with a short
/// `--lock-wait` it gives up with exit 6 and changes nothing.
#[tokio::test]
async fn two_migrates_at_once_never_both_apply_a_step() {
    let rdb = ReceiverDb::new().await;
    let mut admin = rdb.admin().await;
    let env = with_step(&rdb, "instant");
    let mut first = Consumer::faulty_command(&["migrate"], &env, &[(Barrier::StepStarted, 1)]);
    first
        .wait_barrier(Barrier::StepStarted, Duration::from_secs(20))
        .await;

    let impatient = run(
        &receiver_faults_bin(),
        &["migrate", "--lock-wait", "2s"],
        &env,
    );
    let err = errors(&impatient);
    assert_eq!(impatient.status.code(), Some(6), "{err}");
    assert!(
        err.contains("waiting for the migration lock: held by receiver"),
        "{err}"
    );
    assert!(!has_column(&mut admin, "drill_note").await);

    let mut second = Consumer::faulty_command(&["migrate"], &env, &[]);
    fixtures::eventually(
        Duration::from_secs(10),
        "the second run says it waits",
        || {
            let waiting = second
                .output()
                .contains("waiting for the migration lock: held by");
            async move { waiting }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        second.try_wait().is_none(),
        "the second run went on while the first held the lock (renewed every few seconds): {}",
        second.output()
    );
    assert!(!has_column(&mut admin, "drill_note").await);

    first.release();
    assert!(first.ends_within(Duration::from_secs(20)).await.success());
    assert!(first.output().contains("applied step 3 test-drill-column"));
    assert!(second.ends_within(Duration::from_secs(20)).await.success());
    let out = second.output();
    assert!(
        out.contains("while waiting for the lock the database moved to schema_version=3"),
        "{out}"
    );
    assert!(
        !out.contains("applied step"),
        "both applied the step: {out}"
    );
    assert_eq!(recorded(&mut admin).await, 3);
}

/// A step that would copy the table is refused, named, unless `--allow-blocking`.
#[tokio::test]
async fn a_step_that_blocks_writes_runs_only_when_allowed() {
    let rdb = ReceiverDb::new().await;
    let mut admin = rdb.admin().await;
    let env = with_step(&rdb, "copy");
    let refused = run(&receiver_faults_bin(), &["migrate"], &env);
    let err = errors(&refused);
    assert_eq!(refused.status.code(), Some(5), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("step 3 (test-copying-column) would block writes to receiver_task_views")
            && err.contains("ALGORITHM = COPY")
            && err.contains("--allow-blocking"),
        "{err}"
    );
    assert!(!has_column(&mut admin, "drill_copy").await);
    assert!(!has_ledger_row(&mut admin, 3).await);

    let dry = run(&receiver_faults_bin(), &["migrate", "--dry-run"], &env);
    assert!(dry.status.success());
    assert!(
        text(&dry.stdout).contains("ALGORITHM=COPY"),
        "{}",
        text(&dry.stdout)
    );

    let allowed = run(
        &receiver_faults_bin(),
        &["migrate", "--allow-blocking"],
        &env,
    );
    assert!(allowed.status.success(), "{}", text(&allowed.stderr));
    assert!(has_column(&mut admin, "drill_copy").await);
}

async fn has_ledger_row(admin: &mut MySqlConnection, version: u32) -> bool {
    state_of(admin, version).await.is_some()
}

/// Each bad input: one line and the exit code the help states; nothing changed.
#[tokio::test]
async fn bad_input_gets_one_line_and_its_exit_code() {
    let empty = ReceiverDb::provisioned().await;
    let env = vec![("ORBIT_RECEIVER_DSN", empty.init_url().expose().to_owned())];
    for (args, code, says) in [
        (
            &["migrate", "--force"][..],
            2,
            "receiver migrate: unknown flag `--force`",
        ),
        (
            &["migrate", "--lock-wait", "soon"][..],
            2,
            "--lock-wait soon",
        ),
        (&["migrate", "extra"][..], 2, "unexpected argument `extra`"),
        (&["migrate"][..], 3, "it is not a receiver inbox"),
        (
            &["migrate", "--dry-run"][..],
            3,
            "it is not a receiver inbox",
        ),
    ] {
        let out = run(&receiver_bin(), args, &env);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let mut admin: MySqlConnection = sqlx::Connection::connect(empty.admin_receiver_url().expose())
        .await
        .unwrap();
    assert!(
        !has_ledger(&mut admin).await,
        "migrate made tables in a database that is no inbox"
    );
    let no_dsn = run(&receiver_bin(), &["migrate"], &[]);
    assert_eq!(no_dsn.status.code(), Some(2));
    assert!(text(&no_dsn.stderr).contains("ORBIT_RECEIVER_DSN"));
}
