//! The conformance kit: the source's regressions, black-box, against any receiver program that
//! follows the environment contract (`conformance run --receiver CMD`).
//!
//! For each case the kit starts a world of its own: fresh databases on a testdb server (a
//! local server of the case's own where the case stops it), `orbit-dev` with its fault API, a
//! subscription, and, where the case needs one, a `commit-proxy` in front of the receiver's
//! database. It runs `CMD init` (as an account that may create tables) and `CMD consume` (as
//! the runtime account) with only the documented environment: `ORBIT_URL`,
//! `ORBIT_CREDENTIALS_FILE`, `ORBIT_RECEIVER_DSN`, `ORBIT_SUBSCRIPTION_ID`, `RECEIVER_NAME`
//! (and `PATH`, `HOME`). It judges from outside only: the platform's deliveries, the two
//! tables, and the program's exit and output.
//!
//! A case returns `Err` with a message that names the rule it proves; a panic inside the kit
//! (a world that would not start) is reported as the kit's own error, not the receiver's.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use commit_proxy::{Action, RuleSpec};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use orbit_sdk::{DeliveryId, SubscriptionId};
use result_inbox::Digest;
use secret::Secret;
use serde_json::value::RawValue;
use sqlx::{Connection, MySqlConnection};
use testdb::{Provisioned, Server};

use crate::{OrbitDev, QUEUE};

/// The consumer name the kit gives the receiver.
pub const RECEIVER_NAME: &str = "kit-receiver";
/// The event types a case's subscription takes.
const TYPES: &[&str] = &[
    "task.started",
    "task.succeeded",
    "task.needs_review",
    "task.cancelled",
];
/// The short lease of cases that do not need the real one.
const SHORT_LEASE: u64 = 3;

/// A case's verdict: `Ok` with what it saw, or `Err` with what was wrong.
pub type Verdict = Result<String, String>;
type CaseFuture = Pin<Box<dyn Future<Output = Verdict> + Send>>;

/// One case of the kit.
pub struct Case {
    pub name: &'static str,
    /// The requirements it proves (`../shared/design/requirements.md`).
    pub rules: &'static str,
    pub what: &'static str,
    run: fn(Ctx) -> CaseFuture,
}

/// What a case gets: the receiver's command line and the run's seed.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub receiver: String,
    pub seed: u64,
}

macro_rules! case {
    ($name:literal, $rules:literal, $what:literal, $f:ident) => {
        Case {
            name: $name,
            rules: $rules,
            what: $what,
            run: |ctx| Box::pin($f(ctx)),
        }
    };
}

/// Every case, in the order the kit runs them.
pub fn cases() -> Vec<Case> {
    vec![
        case!("schema", "R-SCHEMA-1 R-SCHEMA-5 R-SCHEMA-7", "init makes 2 tables, 17 commented columns, no foreign key, byte-compared identity columns; a second init is refused", schema),
        case!("names-by-bytes", "R-SCHEMA-7 R-STORE-4", "two consumer names that differ only in case, on one database: each records the event and keeps a view of its own", names_by_bytes),
        case!("first-receipt", "R-STORE-5 R-STORE-7 R-CANON-2", "one event: ACKed at its first attempt, one inbox row with the canonical form and its SHA-256, the view at its version", first_receipt),
        case!("ack-after-commit", "R-STORE-7", "the answer to COMMIT held 1.5 s by the proxy: while the row is committed and the answer is on its way, the delivery is not ACKed", ack_after_commit),
        case!("duplicate", "R-STORE-4", "the same event delivered again: ACKed, still one inbox row, the view advanced once", duplicate),
        case!("stale-version", "R-STORE-6", "an older version arriving late: ACKed and kept as history, the view stays at the newer one", stale_version),
        case!("same-id-other-content", "R-STORE-2 R-STORE-4", "an event with an applied event's id and other content: never ACKed, the stored record unchanged", same_id_other_content),
        case!("same-version-other-id", "R-STORE-6", "another event id for a version already applied: never ACKed, rolled back (no inbox row)", same_version_other_id),
        case!("needs-review", "R-CANON-1", "NEEDS_REVIEW stays NEEDS_REVIEW in the view", needs_review),
        case!("exact-numbers", "R-SCHEMA-4 R-CANON-2", "big integers and decimal text in a result kept byte for byte", exact_numbers),
        case!("utc", "R-SCHEMA-6", "times stored in UTC while the server's time zone is +09:00", utc),
        case!("queue-mismatch", "R-CLI-3", "a subscription on another queue than the configured one: consume refuses to start and takes nothing", queue_mismatch),
        case!("kill-after-commit", "R-FAULT-4", "SIGKILL after COMMIT and before the ACK landed: after the real 30 s lease the redelivery is a duplicate (attempts 2, applied_events 1)", kill_after_commit),
        case!("commit-lost", "R-STORE-7 R-STORE-8 R-FAULT-3", "the server's OK to COMMIT dropped by the proxy: no ACK at that attempt, then resolved as a duplicate", commit_lost),
        case!("database-restart", "R-STORE-9", "the receiver's database killed and started again while events queue: nothing lost, nothing doubled, nothing expired", database_restart),
        case!("sigterm", "R-CLI-3", "SIGTERM ends consume within 10 s and leaves the subscription enabled", sigterm),
        case!("crash-loop", "R-FAULT-4 R-STORE-4 R-STORE-6", "seeded SIGKILLs over duplicates and out-of-order versions, then a ledger check", crash_loop),
        case!("no-secrets", "R-SDK-3 R-STORE-11 R-CLI-4", "no token, password or lease proof in the output, errors included", no_secrets),
    ]
}

/// The mutants of `receiver-mutant` (`RECEIVER_MUTANT`), each with the case aimed at it and
/// the rule its failure must name.
pub const MUTANTS: &[(&str, &str, &str)] = &[
    ("ack-before-commit", "ack-after-commit", "R-STORE-7"),
    ("insert-ignore", "same-id-other-content", "R-STORE-4"),
    ("no-digest-compare", "same-id-other-content", "R-STORE-4"),
    ("any-version", "stale-version", "R-STORE-6"),
    ("unconfirmed-is-success", "commit-lost", "R-STORE-8"),
    ("case-insensitive-ids", "schema", "R-SCHEMA-7"),
    ("as-received", "first-receipt", "R-CANON-2"),
    ("duplicate-is-error", "duplicate", "R-STORE-4"),
    ("no-inbox-dedup", "duplicate", "R-STORE-4"),
    ("needs-review-as-succeeded", "needs-review", "R-CANON-1"),
    ("float-numbers", "exact-numbers", "R-SCHEMA-4"),
    ("local-time", "utc", "R-SCHEMA-6"),
    ("no-queue-check", "queue-mismatch", "R-CLI-3"),
    ("pause-on-sigterm", "sigterm", "R-CLI-3"),
    ("prints-token", "no-secrets", "R-SDK-3"),
];

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl Case {
    /// Runs the case; a panic of the kit becomes an `Err` that says so.
    pub async fn run(&self, ctx: Ctx) -> Verdict {
        match tokio::spawn((self.run)(ctx)).await {
            Ok(v) => v,
            Err(e) => {
                let why = e
                    .try_into_panic()
                    .ok()
                    .and_then(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    })
                    .unwrap_or_else(|| "cancelled".into());
                Err(format!("the kit could not run the case: {why}"))
            }
        }
    }
}

/// `Err(format!(…))` unless `cond`.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// The receiver program, run with `sh -c` in a process group of its own (so that a signal
/// reaches whatever the command line starts, `go run` included).
struct Program {
    child: Child,
    log: PathBuf,
}

impl Program {
    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: Signal) {
        let _ = killpg(Pid::from_raw(self.child.id() as i32), sig);
    }

    /// Waits up to `within` for the program to exit: the shell's status, once every process of
    /// its group has ended too. A signal to the group can end the shell (which dash keeps as
    /// the parent of the command) before the receiver has finished reacting to it.
    async fn wait(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + within;
        let group = self.child.id();
        let mut status = None;
        loop {
            if status.is_none() {
                status = self.child.try_wait().ok().flatten();
            }
            if status.is_some() && !testdb::group_alive(group) {
                return status;
            }
            if Instant::now() >= end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.wait(Duration::from_secs(10)).await;
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// One case's world.
struct World {
    receiver: String,
    orbit: OrbitDev,
    client: orbit_sdk::Client,
    sub: SubscriptionId,
    /// Where consume connects: the database, or a proxy in front of it.
    dsn: Secret,
    dir: PathBuf,
    runs: usize,
    /// Every output of the receiver in this world, for the secrets check.
    logs: Vec<PathBuf>,
    /// The receiver's databases on a server of the case's own, when it stops that server
    /// (the platform's stay on the shared one); dropped last, server after databases.
    own: Option<(Provisioned, Server)>,
}

/// Leases of `seconds`, the fault API on, and a budget of 20 attempts: no case is about an
/// exhausted budget, and the crash loop's kills must not spend one.
fn platform_args(seconds: u64) -> Vec<String> {
    vec![
        "--enable-fault-api".into(),
        "--lease-seconds".into(),
        seconds.to_string(),
        "--max-attempts".into(),
        "20".into(),
    ]
}

impl World {
    async fn start(ctx: &Ctx, lease: u64) -> World {
        let db = crate::ReceiverDb::provisioned().await;
        Self::on(ctx, lease, db, None).await
    }

    /// A world whose receiver database is on a local server of its own.
    async fn with_own_server(ctx: &Ctx, lease: u64) -> World {
        let server = Server::local().expect("a local server of the case's own");
        let own = server.provision().await.expect("databases provisioned");
        let db = crate::ReceiverDb::provisioned().await;
        Self::on(ctx, lease, db, Some((own, server))).await
    }

    async fn on(
        ctx: &Ctx,
        lease: u64,
        db: Provisioned,
        own: Option<(Provisioned, Server)>,
    ) -> World {
        let args = platform_args(lease);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // The platform's database lives beside the receiver's (testdb provisions both).
        let dsn = own.as_ref().map_or(&db, |(own, _)| own).runtime_url();
        let orbit = OrbitDev::start_with(db, &args);
        let client = orbit.client();
        let sub = client
            .create_subscription(QUEUE, TYPES)
            .await
            .expect("subscription created")
            .id;
        let dir = orbit
            .credentials_file
            .parent()
            .expect("a scratch directory")
            .to_path_buf();
        World {
            receiver: ctx.receiver.clone(),
            orbit,
            client,
            sub,
            dsn,
            dir,
            runs: 0,
            logs: Vec::new(),
            own,
        }
    }

    /// The documented environment, with `dsn` as the receiver's database.
    /// The receiver's databases and accounts.
    fn db(&self) -> &Provisioned {
        self.own.as_ref().map_or(&self.orbit.db, |(db, _)| db)
    }

    /// The server of the case's own.
    fn own_server(&self) -> &Server {
        &self.own.as_ref().expect("a server of the case's own").1
    }

    fn env(&self, dsn: &Secret) -> Vec<(&'static str, String)> {
        vec![
            ("ORBIT_URL", self.orbit.url.clone()),
            (
                "ORBIT_CREDENTIALS_FILE",
                self.orbit.credentials_file.display().to_string(),
            ),
            ("ORBIT_RECEIVER_DSN", dsn.expose().to_owned()),
            ("ORBIT_SUBSCRIPTION_ID", self.sub.to_string()),
            ("RECEIVER_NAME", RECEIVER_NAME.to_owned()),
        ]
    }

    fn spawn(&mut self, command: &str, env: &[(&'static str, String)]) -> Program {
        use std::os::unix::process::CommandExt;
        self.runs += 1;
        let log = self
            .dir
            .join(format!("receiver-{}-{command}.log", self.runs));
        let file = std::fs::File::create(&log).expect("a log file");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("{} \"$@\"", self.receiver))
            .arg("receiver")
            .arg(command)
            .env_clear()
            .envs(inherited())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("a log file"))
            .stderr(file)
            .process_group(0);
        let child = testdb::spawn_tied(cmd).expect("the receiver's command line starts");
        self.logs.push(log.clone());
        Program { child, log }
    }

    /// A `commit-proxy` in front of the receiver's database, which consume connects through
    /// from now on.
    async fn behind_proxy(&mut self) -> commit_proxy::Proxy {
        let proxy = commit_proxy::Proxy::start("127.0.0.1:0", self.db().address())
            .await
            .expect("the proxy starts");
        self.dsn = Secret::new(
            self.db()
                .runtime_url()
                .expose()
                .replace(self.db().address(), &proxy.local_addr().to_string()),
        );
        proxy
    }

    /// Waits (20 s at most) until event `event`'s inbox row is committed.
    async fn committed(&self, event: &str) -> Result<(), String> {
        let end = Instant::now() + Duration::from_secs(20);
        while self.inbox(event).await.is_empty() {
            ensure!(
                Instant::now() < end,
                "R-STORE-7: no inbox row for the delivered event within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// `CMD init` as the account that may create tables, then the runtime grants.
    async fn init(&mut self) -> Result<String, String> {
        let env = self.env(&self.db().init_url());
        let mut p = self.spawn("init", &env);
        let status = p.wait(Duration::from_secs(60)).await;
        let out = p.output();
        ensure!(
            status.is_some_and(|s| s.success()),
            "R-SCHEMA-5: `init` did not succeed ({}): {}",
            status.map_or("still running after 60 s".into(), |s| s.to_string()),
            last_lines(self, &out)
        );
        self.db().grant_runtime().await.expect("runtime grants");
        Ok(out)
    }

    fn consume(&mut self) -> Program {
        let env = self.env(&self.dsn.clone());
        self.spawn("consume", &env)
    }

    /// Sets up the tables and starts consume.
    async fn running(&mut self) -> Result<Program, String> {
        self.init().await?;
        Ok(self.consume())
    }

    async fn admin(&self) -> MySqlConnection {
        MySqlConnection::connect(self.db().admin_receiver_url().expose())
            .await
            .expect("an admin connection to the receiver's database")
    }

    async fn platform(&self) -> MySqlConnection {
        MySqlConnection::connect(self.orbit.db.platform_url().expose())
            .await
            .expect("a connection to the platform's database")
    }

    /// Submits and cancels a task: one `task.cancelled` event at version 2. Task and event id.
    async fn cancelled_task(&self) -> (String, String) {
        let task = crate::cancelled_task(&self.client).await;
        let event = self.wait_event_of(&task, "task.cancelled").await;
        (task, event)
    }

    /// The id of `task`'s event of `event_type` (its platform key).
    async fn wait_event_of(&self, task: &str, event_type: &str) -> String {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let d = self.deliveries().await;
            if let Some(d) = d
                .iter()
                .find(|d| d.task_id == task && d.event_type == event_type)
            {
                return d.event_id.clone();
            }
            assert!(
                Instant::now() < end,
                "the platform made no {event_type} delivery for task {task}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn deliveries(&self) -> Vec<orbit_sdk::wire::DeliveryInfo> {
        self.client
            .list_deliveries(&self.sub, &Default::default())
            .await
            .expect("deliveries listed")
    }

    async fn delivery(&self, id: &DeliveryId) -> orbit_sdk::wire::DeliveryInfo {
        self.client.get_delivery(id).await.expect("delivery read")
    }

    /// Waits until every delivery in `ids` is ACKED; `Err` names the first that is not.
    async fn acked(&self, ids: &[DeliveryId], within: Duration, rule: &str) -> Result<(), String> {
        let end = Instant::now() + within;
        loop {
            let mut open = None;
            for id in ids {
                let d = self.delivery(id).await;
                if d.state != "ACKED" {
                    open = Some(d);
                    break;
                }
            }
            let Some(d) = open else { return Ok(()) };
            ensure!(
                Instant::now() < end,
                "{rule}: delivery {} of event {} is {} after {} attempt(s), not ACKED within {} s",
                d.id,
                d.event_id,
                d.state,
                d.attempts,
                within.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The deliveries of platform event `event` (its key).
    async fn deliveries_of(&self, event: &str) -> Vec<DeliveryId> {
        self.deliveries()
            .await
            .into_iter()
            .filter(|d| d.event_id == event)
            .map(|d| d.id)
            .collect()
    }

    /// The platform's body of event `key`.
    async fn body(&self, key: &str) -> Vec<u8> {
        let mut c = self.platform().await;
        sqlx::query_scalar("SELECT body FROM orbit_events WHERE id = ?")
            .bind(key)
            .fetch_one(&mut c)
            .await
            .expect("the event's body")
    }

    /// The view of `task`: version, last event id, last state, last result, applied events.
    async fn view(&self, task: &str) -> Option<View> {
        let mut c = self.admin().await;
        let row: Option<ViewRow> = sqlx::query_as(
            "SELECT task_version, last_event_id, last_state, last_result, applied_events \
             FROM receiver_task_views WHERE consumer_name = ? AND queue_id = ? AND task_id = ?",
        )
        .bind(RECEIVER_NAME)
        .bind(QUEUE)
        .bind(task)
        .fetch_optional(&mut c)
        .await
        .expect("the view reads");
        row.map(|(version, event, state, result, applied_events)| View {
            version,
            last_event: String::from_utf8_lossy(&event).into_owned(),
            state: String::from_utf8_lossy(&state).into_owned(),
            result,
            applied_events,
        })
    }

    /// The inbox rows of event id `event`: digest, applied, canonical bytes.
    async fn inbox(&self, event: &str) -> Vec<(Vec<u8>, bool, Vec<u8>)> {
        let mut c = self.admin().await;
        sqlx::query_as(
            "SELECT event_digest, applied, event_canonical FROM receiver_inbox \
             WHERE consumer_name = ? AND queue_id = ? AND event_id = ?",
        )
        .bind(RECEIVER_NAME)
        .bind(QUEUE)
        .bind(event)
        .fetch_all(&mut c)
        .await
        .expect("the inbox reads")
    }

    /// Arms a platform fault; its answer.
    fn fault(&self, body: serde_json::Value) -> serde_json::Value {
        self.orbit.fault(body)
    }

    /// Forges an event from `key` (see orbit-dev's `forge-event`): the id its body carries
    /// and its deliveries.
    fn forge(&self, key: &str, keep_id: bool, version: Option<u64>) -> (String, Vec<DeliveryId>) {
        let mut body =
            serde_json::json!({"fault": "forge-event", "event_id": key, "keep_id": keep_id});
        if let Some(v) = version {
            body["task_version"] = v.into();
        }
        let reply = self.fault(body);
        let id = reply["event_id"].as_str().expect("a forged id").to_owned();
        let deliveries = reply["deliveries"]
            .as_array()
            .expect("deliveries")
            .iter()
            .filter_map(|d| d.as_str().map(DeliveryId::from))
            .collect();
        (id, deliveries)
    }

    /// A receiver that applies and ACKs `task`'s cancelled event: the world, its consume,
    /// task and event id.
    async fn first_event(
        ctx: &Ctx,
        lease: u64,
    ) -> Result<(World, Program, String, String), String> {
        let mut w = World::start(ctx, lease).await;
        let p = w.running().await?;
        let (task, event) = w.cancelled_task().await;
        let ids = w.deliveries_of(&event).await;
        w.acked(&ids, Duration::from_secs(30), "R-STORE-7").await?;
        Ok((w, p, task, event))
    }
}

/// What the environment of the kit passes on to the receiver: enough to find programs.
fn inherited() -> Vec<(&'static str, String)> {
    ["PATH", "HOME"]
        .into_iter()
        .filter_map(|k| {
            #[allow(clippy::disallowed_methods)] // the kit's own environment, passed on
            std::env::var(k).ok().map(|v| (k, v))
        })
        .collect()
}

/// A view row as read: version, last event id, state, result, applied events.
type ViewRow = (u64, Vec<u8>, Vec<u8>, Option<Vec<u8>>, u64);
/// A delivery's current and ACKed proof hashes.
type ProofRow = (Option<Vec<u8>>, Option<Vec<u8>>);

struct View {
    version: u64,
    last_event: String,
    state: String,
    result: Option<Vec<u8>>,
    applied_events: u64,
}

/// Everything but the result's bytes (a result body is never printed): their length.
impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("version", &self.version)
            .field("last_event", &self.last_event)
            .field("state", &self.state)
            .field(
                "result",
                &self.result.as_ref().map(|r| format!("{} bytes", r.len())),
            )
            .field("applied_events", &self.applied_events)
            .finish()
    }
}

/// How `stored` differs from `expected`, without printing either (an event or a result body
/// is never printed): their lengths and the first byte where they part.
fn difference(stored: &[u8], expected: &[u8]) -> String {
    let at = stored
        .iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .unwrap_or(stored.len().min(expected.len()));
    format!(
        "stored {} bytes, expected {} bytes, first difference at byte {at}",
        stored.len(),
        expected.len()
    )
}

/// The last three lines of a receiver's output, for a failure message, with the world's
/// token and passwords masked: the kit never repeats a secret a receiver printed.
fn last_lines(w: &World, out: &str) -> String {
    let lines: Vec<&str> = out.lines().rev().take(3).collect();
    let mut text = lines.into_iter().rev().collect::<Vec<_>>().join(" | ");
    for hidden in [
        w.orbit.credentials().token.expose().to_owned(),
        w.db().runtime.password.expose().to_owned(),
        w.db().init.password.expose().to_owned(),
    ] {
        if !hidden.is_empty() {
            text = text.replace(&hidden, secret::MASK);
        }
    }
    if text.is_empty() {
        "no output".into()
    } else {
        text
    }
}

async fn schema(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let out = w.init().await?;
    ensure!(
        out.contains("receiver_schema_initialized=true foreign_keys=0"),
        "R-SCHEMA-5: `init` did not print `receiver_schema_initialized=true foreign_keys=0`: {}",
        last_lines(&w, &out)
    );
    let mut c = w.admin().await;
    let db = w.db().receiver_db.clone();
    let tables: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(table_name AS CHAR), CAST(table_comment AS CHAR) FROM information_schema.tables \
         WHERE table_schema = ? ORDER BY table_name",
    )
    .bind(&db)
    .fetch_all(&mut c)
    .await
    .expect("tables listed");
    let names: Vec<&str> = tables.iter().map(|(t, _)| t.as_str()).collect();
    ensure!(
        names == ["receiver_inbox", "receiver_task_views"],
        "R-SCHEMA-1: the receiver's database must hold exactly receiver_inbox and receiver_task_views, not {names:?}"
    );
    for (t, comment) in &tables {
        ensure!(
            !comment.trim().is_empty(),
            "R-SCHEMA-1: table {t} has no comment"
        );
    }
    let columns: Vec<(String, String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT CAST(table_name AS CHAR), CAST(column_name AS CHAR), CAST(column_comment AS CHAR), \
         CAST(data_type AS CHAR), CAST(collation_name AS CHAR) FROM information_schema.columns \
         WHERE table_schema = ?",
    )
    .bind(&db)
    .fetch_all(&mut c)
    .await
    .expect("columns listed");
    ensure!(
        columns.len() == 17,
        "R-SCHEMA-1: 17 columns in all, not {}",
        columns.len()
    );
    for (t, col, comment, ..) in &columns {
        ensure!(
            !comment.trim().is_empty(),
            "R-SCHEMA-1: column {t}.{col} has no comment"
        );
    }
    let identity = [
        ("receiver_inbox", "consumer_name"),
        ("receiver_inbox", "queue_id"),
        ("receiver_inbox", "event_id"),
        ("receiver_task_views", "consumer_name"),
        ("receiver_task_views", "queue_id"),
        ("receiver_task_views", "task_id"),
    ];
    for (t, col) in identity {
        let Some((.., data_type, collation)) =
            columns.iter().find(|(ct, cc, ..)| ct == t && cc == col)
        else {
            return Err(format!("R-SCHEMA-2/3: {t} has no column {col}"));
        };
        let binary = matches!(data_type.as_str(), "varbinary" | "binary")
            || collation.as_deref().is_some_and(|c| c.ends_with("_bin"));
        ensure!(
            binary,
            "R-SCHEMA-7: identity column {t}.{col} is {data_type} with collation {}: identities must compare byte for byte (a binary collation or VARBINARY)",
            collation.as_deref().unwrap_or("none")
        );
    }
    let fks: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.referential_constraints WHERE constraint_schema = ?",
    )
    .bind(&db)
    .fetch_one(&mut c)
    .await
    .expect("foreign keys counted");
    ensure!(
        fks == 0,
        "R-SCHEMA-1: {fks} foreign key(s); there must be none"
    );

    let env = w.env(&w.db().init_url());
    let mut again = w.spawn("init", &env);
    let status = again.wait(Duration::from_secs(60)).await;
    ensure!(
        status.is_some_and(|s| !s.success()),
        "R-SCHEMA-5: a second `init` must fail on the existing tables; it {}",
        status.map_or("was still running after 60 s".into(), |s| format!(
            "exited {s}"
        ))
    );
    let after: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = ?",
    )
    .bind(&db)
    .fetch_one(&mut c)
    .await
    .expect("columns counted");
    ensure!(
        after == 17,
        "R-SCHEMA-5: the refused second `init` changed the structure ({after} columns)"
    );
    Ok("2 tables, 17 commented columns, 0 foreign keys, byte-compared identities; second init refused".into())
}

async fn names_by_bytes(ctx: Ctx) -> Verdict {
    const OTHER: &str = "KIT-RECEIVER";
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let _a = w.running().await?;
    let second = w
        .client
        .create_subscription(QUEUE, TYPES)
        .await
        .expect("a second subscription")
        .id;
    let mut env = w.env(&w.dsn.clone());
    for (k, v) in &mut env {
        match *k {
            "RECEIVER_NAME" => *v = OTHER.into(),
            "ORBIT_SUBSCRIPTION_ID" => *v = second.to_string(),
            _ => {}
        }
    }
    let _b = w.spawn("consume", &env);
    let (task, key) = w.cancelled_task().await;
    let ids: Vec<DeliveryId> = w.deliveries_of(&key).await;
    let theirs: Vec<DeliveryId> = w
        .client
        .list_deliveries(&second, &Default::default())
        .await
        .expect("deliveries listed")
        .into_iter()
        .map(|d| d.id)
        .collect();
    w.acked(&ids, Duration::from_secs(30), "R-STORE-7").await?;
    w.acked(&theirs, Duration::from_secs(30), "R-STORE-7")
        .await?;
    let mut c = w.admin().await;
    let views: Vec<(Vec<u8>, u64)> = sqlx::query_as(
        "SELECT consumer_name, applied_events FROM receiver_task_views WHERE task_id = ? ORDER BY consumer_name",
    )
    .bind(&task)
    .fetch_all(&mut c)
    .await
    .expect("views read");
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM receiver_inbox WHERE event_id = ?")
        .bind(&key)
        .fetch_one(&mut c)
        .await
        .expect("inbox counted");
    let names: Vec<String> = views
        .iter()
        .map(|(n, applied)| format!("{}={applied}", String::from_utf8_lossy(n)))
        .collect();
    ensure!(
        rows == 2 && views.len() == 2 && views.iter().all(|(_, n)| *n == 1),
        "R-SCHEMA-7: consumers {RECEIVER_NAME} and {OTHER} each took the event, but the database holds {rows} inbox row(s) and views {names:?}: identities must compare byte for byte, or distinct names collide on the unique key"
    );
    Ok(format!(
        "{RECEIVER_NAME} and {OTHER}: two inbox rows, two views ({})",
        names.join(", ")
    ))
}

async fn first_receipt(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let delivery = w.delivery(&w.deliveries_of(&key).await[0]).await;
    ensure!(
        delivery.attempts == 1,
        "R-STORE-7: the first receipt took {} attempts; one suffices",
        delivery.attempts
    );
    let platform = w.client.get_task(&task).await.expect("task read");
    let view = w
        .view(&task)
        .await
        .ok_or("R-STORE-5: the event was ACKed but the task has no view")?;
    ensure!(
        view.version == platform.version
            && view.last_event == key
            && view.state == "CANCELLED"
            && view.result.is_none()
            && view.applied_events == 1,
        "R-STORE-7: the view should be version {}, event {key}, CANCELLED, no result, applied_events 1; it is {view:?}",
        platform.version
    );
    let rows = w.inbox(&key).await;
    ensure!(
        rows.len() == 1,
        "R-STORE-7: {} inbox rows for the event",
        rows.len()
    );
    let (digest, applied, canonical) = &rows[0];
    ensure!(
        *applied,
        "R-STORE-7: the inbox row says the event did not advance the view"
    );
    let (expected, expected_digest) =
        result_inbox::canonicalize(&w.body(&key).await).expect("the platform's event is valid");
    ensure!(
        *canonical == expected,
        "R-CANON-2: the stored event is not its canonical form (docs/canonical-json.md): {}",
        difference(canonical, &expected)
    );
    ensure!(
        digest[..] == expected_digest.0[..] && Digest::of(canonical).0[..] == digest[..],
        "R-CANON-2: the stored digest is not the SHA-256 of the canonical form"
    );
    Ok(format!(
        "ACKed at attempt 1; view v{} applied_events 1; canonical form and digest match",
        view.version
    ))
}

async fn duplicate(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let reply = w.fault(serde_json::json!({"fault": "duplicate-event", "event_id": key}));
    let again: Vec<DeliveryId> = reply["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .filter_map(|d| d.as_str().map(DeliveryId::from))
        .collect();
    // A duplicate is resolved inside its first lease: once one was handed out again, the
    // receiver did not ACK it.
    let end = Instant::now() + Duration::from_secs(30);
    for id in &again {
        loop {
            let d = w.delivery(id).await;
            ensure!(
                d.attempts <= 1 && Instant::now() < end,
                "R-STORE-4: the duplicate (delivery {id}) was not ACKed at its first attempt: it is {} after {} attempt(s); a duplicate is ACKed at once",
                d.state,
                d.attempts
            );
            if d.state == "ACKED" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let rows = w.inbox(&key).await.len();
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        rows == 1 && view.applied_events == 1,
        "R-STORE-4: after the duplicate: {rows} inbox row(s), applied_events {}; a duplicate must not advance the view again",
        view.applied_events
    );
    Ok("the redelivery ACKed; one inbox row, applied_events 1".into())
}

async fn stale_version(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let before = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    let (old, deliveries) = w.forge(&key, false, Some(before.version - 1));
    w.acked(
        &deliveries,
        Duration::from_secs(30),
        "R-STORE-6 (an older version is ACKed as history)",
    )
    .await?;
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        view.version == before.version && view.last_event == key && view.applied_events == 1,
        "R-STORE-6: an older version (v{}) moved the view: it was v{} by {key}, applied_events 1; now {view:?}",
        before.version - 1,
        before.version
    );
    let rows = w.inbox(&old).await;
    ensure!(
        rows.len() == 1 && !rows[0].1,
        "R-STORE-6: the older event must be recorded with applied = false ({} row(s), applied {:?})",
        rows.len(),
        rows.first().map(|r| r.1)
    );
    Ok(format!(
        "v{} after v{}: ACKed, kept as history, the view stays at v{}",
        before.version - 1,
        before.version,
        before.version
    ))
}

/// Waits two leases and a second: `deliveries` must still be unACKED by then.
async fn never_acked(w: &World, deliveries: &[DeliveryId], rule: &str) -> Result<u32, String> {
    tokio::time::sleep(Duration::from_secs(2 * SHORT_LEASE + 1)).await;
    let mut attempts = 0;
    for id in deliveries {
        let d = w.delivery(id).await;
        ensure!(
            d.state != "ACKED",
            "{rule}: delivery {} was ACKed (attempt {}); it must never be",
            d.id,
            d.attempts
        );
        attempts = attempts.max(d.attempts);
    }
    Ok(attempts)
}

async fn same_id_other_content(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let original = w.inbox(&key).await;
    let (_, deliveries) = w.forge(&key, true, None);
    let attempts = never_acked(
        &w,
        &deliveries,
        "R-STORE-4: an event with the id of an applied event and other content (another digest) is a conflict",
    )
    .await?;
    let rows = w.inbox(&key).await;
    ensure!(
        rows == original,
        "R-STORE-4: the stored record of event {key} changed after the conflicting event"
    );
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        view.applied_events == 1 && view.last_event == key,
        "R-STORE-4: the conflicting event changed the view: {view:?}"
    );
    Ok(format!(
        "not ACKed after {attempts} attempt(s); the record and the view unchanged"
    ))
}

async fn same_version_other_id(ctx: Ctx) -> Verdict {
    let (w, _p, task, key) = World::first_event(&ctx, SHORT_LEASE).await?;
    let (other, deliveries) = w.forge(&key, false, None);
    let attempts = never_acked(
        &w,
        &deliveries,
        "R-STORE-6: another event id for a version already applied is a conflict",
    )
    .await?;
    let rows = w.inbox(&other).await.len();
    ensure!(
        rows == 0,
        "R-STORE-6: the conflicting event left {rows} inbox row(s): its transaction must roll back whole"
    );
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        view.last_event == key && view.applied_events == 1,
        "R-STORE-6: the conflicting event changed the view: {view:?}"
    );
    Ok(format!(
        "not ACKed after {attempts} attempt(s); no inbox row, the view unchanged"
    ))
}

/// Submits a task and reports `state` with `result`; the task and its event's key.
async fn reported_task(w: &World, state: &str, result: &str, event_type: &str) -> (String, String) {
    let task = w
        .client
        .submit_task(QUEUE, None)
        .await
        .expect("task submitted");
    let result = RawValue::from_string(result.to_owned()).expect("a JSON result");
    w.client
        .report_task(&task.id, state, Some(&result))
        .await
        .expect("task reported");
    let key = w.wait_event_of(&task.id, event_type).await;
    (task.id, key)
}

async fn needs_review(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let _p = w.running().await?;
    let (task, key) = reported_task(
        &w,
        "NEEDS_REVIEW",
        r#"{"reason":"manual check"}"#,
        "task.needs_review",
    )
    .await;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(30),
        "R-CANON-1 (a NEEDS_REVIEW event is valid)",
    )
    .await?;
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        view.state == "NEEDS_REVIEW",
        "R-CANON-1: NEEDS_REVIEW must stay NEEDS_REVIEW; the view says {:?}",
        view.state
    );
    Ok("the view says NEEDS_REVIEW".into())
}

async fn exact_numbers(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let _p = w.running().await?;
    let numbers = [
        "123456789012345678901234567890",
        "-0.000000000000000000001",
        "1.50",
        "1E+2",
    ];
    let result = format!(
        r#"{{"big":{},"tiny":{},"price":{},"exp":{},"text":"0.10"}}"#,
        numbers[0], numbers[1], numbers[2], numbers[3]
    );
    let (task, key) = reported_task(&w, "SUCCEEDED", &result, "task.succeeded").await;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(30),
        "R-SCHEMA-4",
    )
    .await?;
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    let stored = view.result.ok_or("R-STORE-7: the view has no result")?;
    let (canonical, _) = result_inbox::canonicalize(result.as_bytes()).expect("a valid result");
    let text = String::from_utf8_lossy(&stored);
    let lost: Vec<&str> = numbers.into_iter().filter(|n| !text.contains(n)).collect();
    ensure!(
        stored == canonical,
        "R-SCHEMA-4: the view's result must keep its exact bytes: {}; the numbers not kept as written: {}",
        difference(&stored, &canonical),
        if lost.is_empty() { "none".to_owned() } else { lost.join(", ") }
    );
    let (_, _, event) = w
        .inbox(&key)
        .await
        .into_iter()
        .next()
        .ok_or("R-STORE-7: no inbox row")?;
    let event = String::from_utf8_lossy(&event).into_owned();
    for n in numbers {
        ensure!(
            event.contains(n),
            "R-SCHEMA-4: the stored event lost the number {n}"
        );
    }
    Ok("the result and the event keep 10^29, 1e-21, 1.50 and 1E+2 as written".into())
}

async fn utc(ctx: Ctx) -> Verdict {
    // A server of the case's own: its time zone is changed for every connection.
    let mut w = World::with_own_server(&ctx, SHORT_LEASE).await;
    let mut c = w.admin().await;
    sqlx::query("SET GLOBAL time_zone = '+09:00'")
        .execute(&mut c)
        .await
        .expect("the server's time zone set");
    let _p = w.running().await?;
    let (task, key) = w.cancelled_task().await;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(30),
        "R-SCHEMA-6",
    )
    .await?;
    let skew: Vec<(Option<i64>, Option<i64>)> = sqlx::query_as(
        "SELECT TIMESTAMPDIFF(SECOND, i.received_at, UTC_TIMESTAMP(6)), \
                TIMESTAMPDIFF(SECOND, v.updated_at, UTC_TIMESTAMP(6)) \
         FROM receiver_inbox i JOIN receiver_task_views v ON v.task_id = ? WHERE i.event_id = ?",
    )
    .bind(&task)
    .bind(&key)
    .fetch_all(&mut c)
    .await
    .map_err(|e| format!("R-SCHEMA-3: received_at and updated_at could not be read: {e}"))?;
    let (received, updated) = skew.first().copied().ok_or("R-STORE-7: no inbox row")?;
    for (what, s) in [
        ("receiver_inbox.received_at", received),
        ("receiver_task_views.updated_at", updated),
    ] {
        let s = s.ok_or(format!("R-SCHEMA-3: {what} is NULL"))?;
        ensure!(
            s.abs() < 600,
            "R-SCHEMA-6: {what} is {s} s from UTC_TIMESTAMP() with the server at +09:00: times must be stored in UTC"
        );
    }
    Ok("received_at and updated_at in UTC with the server at +09:00".into())
}

async fn queue_mismatch(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    w.init().await?;
    // The same credentials, naming another queue: the token can read the subscription, so
    // only the receiver's own comparison of the two queues can refuse.
    let other = other_queue_credentials(&w.orbit.credentials_file, OTHER_QUEUE)?;
    let (_, key) = w.cancelled_task().await;
    let id = w.deliveries_of(&key).await[0].clone();
    let mut env = w.env(&w.dsn.clone());
    for (k, v) in &mut env {
        if *k == "ORBIT_CREDENTIALS_FILE" {
            *v = other.display().to_string();
        }
    }
    let mut p = w.spawn("consume", &env);
    let end = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let d = w.delivery(&id).await;
        ensure!(
            d.attempts == 0 && w.inbox(&key).await.is_empty(),
            "R-CLI-3: consume for queue {OTHER_QUEUE} on a subscription of {QUEUE} took its events (delivery {} after {} attempt(s)) instead of refusing to start",
            d.state,
            d.attempts
        );
        if let Some(status) = p.wait(Duration::from_millis(200)).await {
            break Some(status);
        }
        if Instant::now() >= end {
            break None;
        }
    };
    ensure!(
        status.is_some_and(|s| !s.success()),
        "R-CLI-3: consume for queue {OTHER_QUEUE} on a subscription of {QUEUE} must refuse to start; it {}",
        status.map_or("was still running after 20 s".into(), |s| format!("exited {s}"))
    );
    Ok(format!(
        "refused ({}), nothing taken",
        status.map(|s| s.to_string()).unwrap_or_default()
    ))
}

/// The queue `queue-mismatch` configures the receiver for.
const OTHER_QUEUE: &str = "kit-other-queue";

/// A copy of the credentials file `from` whose `queue_id` is `queue` (mode 0600, beside it).
fn other_queue_credentials(from: &std::path::Path, queue: &str) -> Result<PathBuf, String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let text = std::fs::read_to_string(from)
        .map_err(|e| format!("the kit cannot read {}: {e}", from.display()))?;
    let mut credentials: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("the kit cannot parse {}: {e}", from.display()))?;
    credentials["queue_id"] = queue.into();
    let to = from.with_file_name(format!("{queue}.credentials.json"));
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&to)
        .and_then(|mut f| f.write_all(credentials.to_string().as_bytes()))
        .map_err(|e| format!("the kit cannot write {}: {e}", to.display()))?;
    Ok(to)
}

async fn kill_after_commit(ctx: Ctx) -> Verdict {
    // R-FAULT-4 names the real lease.
    let mut w = World::start(&ctx, 30).await;
    let mut p = w.running().await?;
    // The ACK arrives at the platform and is never handled: the kill lands before it counts.
    w.fault(serde_json::json!({"fault": "stall-next-ack"}));
    let (task, key) = w.cancelled_task().await;
    w.committed(&key).await?;
    let id = w.deliveries_of(&key).await[0].clone();
    let d = w.delivery(&id).await;
    ensure!(
        d.state == "LEASED" && d.attempts == 1,
        "R-FAULT-4: after the commit the delivery should be LEASED at attempt 1, not yet ACKed; it is {} at attempt {}",
        d.state,
        d.attempts
    );
    p.kill().await;
    let _q = w.consume();
    w.acked(
        std::slice::from_ref(&id),
        Duration::from_secs(75),
        "R-FAULT-4 (the redelivery after the lease is ACKed)",
    )
    .await?;
    let d = w.delivery(&id).await;
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    let rows = w.inbox(&key).await.len();
    ensure!(
        d.attempts == 2 && view.applied_events == 1 && rows == 1,
        "R-FAULT-4: after the kill and the redelivery: attempts {} (want 2), applied_events {} (want 1), inbox rows {rows} (want 1)",
        d.attempts,
        view.applied_events
    );
    Ok("killed after COMMIT; redelivered after 30 s: attempts 2, applied_events 1".into())
}

/// How long `ack-after-commit` holds the server's answer to COMMIT.
const HELD_MS: u64 = 1500;

/// Milliseconds since the Unix epoch, the clock of commit-proxy's firings.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

async fn ack_after_commit(ctx: Ctx) -> Verdict {
    // A lease long enough for an apply budget above the held answer.
    let mut w = World::start(&ctx, 5).await;
    let proxy = w.behind_proxy().await;
    let rule = proxy
        .arm(RuleSpec::new(Action::Delay { delay_ms: HELD_MS }).once())
        .expect("the rule arms");
    let _p = w.running().await?;
    let (task, key) = w.cancelled_task().await;
    let id = w.deliveries_of(&key).await[0].clone();
    let held = rule
        .fired_within(Duration::from_secs(20))
        .await
        .ok_or("R-STORE-7: the receiver sent no COMMIT through its DSN within 20 s")?;
    // The server has answered; the proxy holds the answer for HELD_MS from `held.at_ms`. Watch
    // the delivery for the first two thirds of that (a read started later could be answered
    // after a right receiver's ACK).
    let watch_until = held.at_ms + HELD_MS * 2 / 3;
    loop {
        let started = unix_ms();
        if started >= watch_until {
            break;
        }
        ensure!(
            w.delivery(&id).await.state != "ACKED",
            "R-STORE-7: the delivery was ACKed before the receiver had the answer to its COMMIT: ACK only after COMMIT succeeds"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.acked(
        std::slice::from_ref(&id),
        Duration::from_secs(30),
        "R-STORE-7 (ACKed once the COMMIT is confirmed)",
    )
    .await?;
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    ensure!(
        view.applied_events == 1,
        "R-STORE-7: applied_events {} after one event",
        view.applied_events
    );
    Ok(format!(
        "not ACKed while the COMMIT's answer was held; ACKed at attempt {} afterwards",
        w.delivery(&id).await.attempts
    ))
}

async fn commit_lost(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let proxy = w.behind_proxy().await;
    let rule = proxy
        .arm(RuleSpec::new(Action::DropCommitOk).once())
        .expect("the rule arms");
    let _p = w.running().await?;
    let (task, key) = w.cancelled_task().await;
    let id = w.deliveries_of(&key).await[0].clone();
    // Watch the delivery until the proxy drops the answer: an ACK seen before the drop came
    // before the COMMIT was answered at all (R-STORE-7). One seen only after it, at the first
    // attempt, came without an answer: most likely a COMMIT of unknown outcome taken as
    // success (R-STORE-8), though an ACK racing ahead of its COMMIT can land there too.
    let deadline = Instant::now() + Duration::from_secs(20);
    while rule.firings().is_empty() {
        ensure!(
            w.delivery(&id).await.state != "ACKED" || !rule.firings().is_empty(),
            "R-STORE-7: the delivery was ACKed before its COMMIT was answered: ACK only after COMMIT succeeds"
        );
        ensure!(
            Instant::now() < deadline,
            "R-STORE-7: the receiver sent no COMMIT through its DSN within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let at_drop = w.delivery(&id).await;
    ensure!(
        at_drop.state != "ACKED" || at_drop.attempts >= 2,
        "R-STORE-8: the delivery was ACKed at attempt 1 although the answer to its COMMIT was lost on the way: a COMMIT of unknown outcome must not be ACKed (nor may an ACK precede the COMMIT, R-STORE-7)"
    );
    w.acked(
        std::slice::from_ref(&id),
        Duration::from_secs(40),
        "R-STORE-8 (the lost commit is resolved by a redelivery)",
    )
    .await?;
    let d = w.delivery(&id).await;
    ensure!(
        d.attempts >= 2,
        "R-STORE-8: the delivery was ACKed at attempt 1 although the answer to its COMMIT never came (CommitUnconfirmed must not be ACKed)"
    );
    let view = w.view(&task).await.ok_or("R-STORE-5: no view")?;
    let rows = w.inbox(&key).await.len();
    ensure!(
        view.applied_events == 1 && rows == 1,
        "R-STORE-8: after the lost COMMIT reply: applied_events {}, inbox rows {rows}; the redelivery must find the commit (a duplicate)",
        view.applied_events
    );
    Ok(format!(
        "no ACK at the lost reply; ACKed at attempt {} as a duplicate, applied_events 1",
        d.attempts
    ))
}

async fn database_restart(ctx: Ctx) -> Verdict {
    let mut w = World::with_own_server(&ctx, SHORT_LEASE).await;
    let _p = w.running().await?;
    let (first, key) = w.cancelled_task().await;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(30),
        "R-STORE-7",
    )
    .await?;
    ensure!(
        w.own_server().kill(),
        "the kit could not kill the receiver's server"
    );
    let mut tasks = vec![first];
    for _ in 0..6 {
        tasks.push(crate::cancelled_task(&w.client).await);
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    w.own_server()
        .restart()
        .expect("the receiver's server starts again");
    let ids: Vec<DeliveryId> = w.deliveries().await.into_iter().map(|d| d.id).collect();
    w.acked(
        &ids,
        Duration::from_secs(60),
        "R-STORE-9 (after the database is back, every event is applied)",
    )
    .await?;
    let expired = w
        .deliveries()
        .await
        .iter()
        .filter(|d| d.state == "EXPIRED")
        .count();
    ensure!(
        expired == 0,
        "R-STORE-9: {expired} deliveries EXPIRED during the outage"
    );
    ledger(&w, &tasks, "R-STORE-9").await?;
    let most = w
        .deliveries()
        .await
        .iter()
        .map(|d| d.attempts)
        .max()
        .unwrap_or(0);
    Ok(format!(
        "{} events across an 8 s outage: all ACKED, each applied once; at most {most} attempts",
        ids.len()
    ))
}

/// The ledger of [`crate::check_ledger`], its panic turned into a message naming `rule`.
async fn ledger(w: &World, tasks: &[String], rule: &str) -> Result<crate::Ledger, String> {
    let mut admin = w.admin().await;
    let client = w.client.clone();
    let (sub, tasks) = (w.sub.clone(), tasks.to_vec());
    let rule = rule.to_owned();
    tokio::spawn(async move { crate::check_ledger(&mut admin, &client, &sub, &tasks, &rule).await })
        .await
        .map_err(|e| {
            let why = e
                .try_into_panic()
                .ok()
                .and_then(|p| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            format!("ledger: {}", why.lines().next().unwrap_or("failed"))
        })
}

async fn sigterm(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let mut p = w.running().await?;
    let (_, key) = w.cancelled_task().await;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(30),
        "R-STORE-7",
    )
    .await?;
    for _ in 0..4 {
        crate::cancelled_task(&w.client).await;
    }
    let started = Instant::now();
    p.signal(Signal::SIGTERM);
    let status = p.wait(Duration::from_secs(10)).await;
    ensure!(
        status.is_some(),
        "R-CLI-3: consume was still running 10 s after SIGTERM"
    );
    let sub = w
        .client
        .get_subscription(&w.sub)
        .await
        .expect("subscription read");
    ensure!(
        sub.enabled,
        "R-CLI-3: consume paused the shared subscription on SIGTERM"
    );
    // The shell's status says little here: the signal to the group may end it first.
    Ok(format!(
        "every process of the command line ended {:.1} s after SIGTERM; the subscription still enabled",
        started.elapsed().as_secs_f64()
    ))
}

async fn crash_loop(ctx: Ctx) -> Verdict {
    let mut rng = fastrand::Rng::with_seed(ctx.seed);
    let mut w = World::start(&ctx, 2).await;
    w.init().await?;
    let mut tasks = Vec::new();
    let mut p = w.consume();
    let mut kills = 0;
    for round in 0..6 {
        // Two versions per task (RUNNING, then CANCELLED), some duplicated: out of order
        // within the receiver's concurrency, and again after a redelivery.
        for _ in 0..2 {
            let t = w
                .client
                .submit_task(QUEUE, None)
                .await
                .expect("task submitted");
            w.client
                .report_task(&t.id, "RUNNING", None)
                .await
                .expect("task reported");
            w.client.cancel_task(&t.id).await.expect("task cancelled");
            if rng.bool() {
                let key = w.wait_event_of(&t.id, "task.started").await;
                w.fault(serde_json::json!({"fault": "duplicate-event", "event_id": key}));
            }
            tasks.push(t.id);
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(300..2000))).await;
        if round < 5 {
            p.kill().await;
            kills += 1;
            p = w.consume();
        }
    }
    let ids: Vec<DeliveryId> = w.deliveries().await.into_iter().map(|d| d.id).collect();
    w.acked(
        &ids,
        Duration::from_secs(90),
        "R-FAULT-4 (after the kills every delivery is ACKed)",
    )
    .await?;
    let l = ledger(&w, &tasks, "R-STORE-4/R-STORE-6").await?;
    Ok(format!(
        "seed {}: {kills} SIGKILLs, {} deliveries of {} events over {} tasks, {} stale; the ledger holds",
        ctx.seed,
        l.deliveries,
        l.events,
        tasks.len(),
        l.stale
    ))
}

async fn no_secrets(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let proxy = w.behind_proxy().await;
    // A lost COMMIT reply and a refused event make the receiver report errors too.
    let rule = proxy
        .arm(RuleSpec::new(Action::DropCommitOk).once())
        .expect("the rule arms");
    let mut p = w.running().await?;
    let (_, key) = w.cancelled_task().await;
    let _ = rule.fired_within(Duration::from_secs(20)).await;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(40),
        "R-STORE-8",
    )
    .await?;
    let (_, forged) = w.forge(&key, true, None);
    tokio::time::sleep(Duration::from_secs(SHORT_LEASE + 1)).await;
    p.signal(Signal::SIGTERM);
    let _ = p.wait(Duration::from_secs(10)).await;

    let token = w.orbit.credentials().token.expose().to_owned();
    let passwords = [
        w.db().runtime.password.expose().to_owned(),
        w.db().init.password.expose().to_owned(),
    ];
    let mut c = w.platform().await;
    let proofs: Vec<ProofRow> = sqlx::query_as(
        "SELECT proof_sha256, acked_proof_sha256 FROM orbit_deliveries WHERE subscription_id = ?",
    )
    .bind(w.sub.as_str())
    .fetch_all(&mut c)
    .await
    .expect("proof hashes read");
    let proofs: BTreeSet<Vec<u8>> = proofs
        .into_iter()
        .flat_map(|(a, b)| [a, b])
        .flatten()
        .collect();
    let mut scanned = 0;
    for log in &w.logs {
        let out = std::fs::read_to_string(log).unwrap_or_default();
        scanned += out.len();
        ensure!(
            !out.contains(&token),
            "R-SDK-3: the receiver's output ({}) contains the platform token",
            log.display()
        );
        for pw in &passwords {
            ensure!(
                !out.contains(pw.as_str()),
                "R-STORE-11: the receiver's output ({}) contains a database password",
                log.display()
            );
        }
        for word in out.split(|c: char| !(c.is_ascii_alphanumeric() || "-_+/=.".contains(c))) {
            if word.len() >= 16 && proofs.contains(Digest::of(word.as_bytes()).0.as_slice()) {
                return Err(format!(
                    "R-SDK-3: the receiver's output ({}) contains a lease proof",
                    log.display()
                ));
            }
        }
    }
    let _ = forged;
    Ok(format!(
        "{} bytes of output over {} runs (a lost COMMIT reply and a conflict included): no token, password or lease proof",
        scanned,
        w.logs.len()
    ))
}
