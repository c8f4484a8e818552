//! Shared pieces of the conformance suite: a receiver database initialised the way a DBA and
//! `receiver init` would, event builders, and the path of the real `receiver` binary.
//!
//! Every database here lives on a real server from `testdb`; nothing is mocked.
//!
//! This crate is the top of the test layers: it drives the shipped programs, `orbit-dev` and
//! `commit-proxy` as real processes and servers, and nothing depends on it. What it must never
//! do: mock the database or the platform, judge a receiver in the kit by anything but the
//! platform's state, the two tables and the program's exit and output, or print a token, a
//! password or a result body in a verdict.

use std::path::PathBuf;

pub mod kit;
pub mod process;

use result_inbox::store::StoreOptions;
use result_inbox::Dsn;
use result_inbox::{ConsumerName, QueueId, Store, TaskEvent};
use sqlx::{Connection, MySqlConnection};
use testdb::{Provisioned, Server};

/// The queue the suite's events come from unless a test says otherwise.
pub const QUEUE: &str = "inbox-demo";

/// A receiver database with its schema created by `result_inbox::schema::init` (as the init
/// account) and the runtime grants applied, on the process's shared server.
#[derive(Debug)]
pub struct ReceiverDb {
    pub db: Provisioned,
}

impl ReceiverDb {
    /// Provisions fresh databases and accounts and initialises the receiver schema.
    pub async fn new() -> ReceiverDb {
        let db = Self::provisioned().await;
        let dsn = Dsn::parse(db.init_url().expose()).expect("testdb makes valid URLs");
        let report = result_inbox::schema::init(&dsn)
            .await
            .unwrap_or_else(|e| panic!("receiver init failed: {e}"));
        assert_eq!(report.foreign_keys, 0);
        db.grant_runtime().await.expect("runtime grants apply");
        ReceiverDb { db }
    }

    /// Fresh databases and accounts, without the receiver schema.
    pub async fn provisioned() -> Provisioned {
        let server = Server::shared().unwrap_or_else(|e| panic!("no test server: {e}"));
        server
            .provision()
            .await
            .unwrap_or_else(|e| panic!("provisioning failed: {e}"))
    }

    /// The runtime account's DSN.
    pub fn runtime_dsn(&self) -> Dsn {
        Dsn::parse(self.db.runtime_url().expose()).expect("testdb makes valid URLs")
    }

    /// A store for `consumer` and `queue`, connected as the runtime account.
    pub async fn store_for(&self, consumer: &str, queue: &str) -> Store {
        let options = StoreOptions {
            max_connections: 16,
            ..StoreOptions::default()
        };
        Store::connect(
            &self.runtime_dsn(),
            ConsumerName::new(consumer).expect("valid consumer name"),
            QueueId::new(queue).expect("valid queue"),
            options,
        )
        .await
        .unwrap_or_else(|e| panic!("store connect failed: {e}"))
    }

    /// The runtime account's DSN with the server address replaced by `via` (a proxy).
    pub fn runtime_dsn_via(&self, via: std::net::SocketAddr) -> Dsn {
        let url = self
            .db
            .runtime_url()
            .expose()
            .replace(self.db.address(), &via.to_string());
        Dsn::parse(&url).expect("testdb makes valid URLs")
    }

    /// A store like [`ReceiverDb::store`] whose connections go through `via` (a proxy).
    pub async fn store_via(&self, via: std::net::SocketAddr) -> Store {
        self.store_via_with(via, result_inbox::store::APPLY_TIMEOUT)
            .await
    }

    /// [`ReceiverDb::store_via`] with an apply time budget of `budget`.
    pub async fn store_via_with(
        &self,
        via: std::net::SocketAddr,
        budget: std::time::Duration,
    ) -> Store {
        Store::connect(
            &self.runtime_dsn_via(via),
            ConsumerName::default(),
            QueueId::new(QUEUE).expect("valid queue"),
            StoreOptions {
                apply_timeout: budget,
                ..StoreOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("store connect through {via} failed: {e}"))
    }

    /// The default store: consumer `task-result-view`, queue [`QUEUE`].
    pub async fn store(&self) -> Store {
        self.store_for("task-result-view", QUEUE).await
    }

    /// One integer read by an admin connection on the receiver database, e.g. a `COUNT(*)`.
    pub async fn scalar(&self, sql: &str) -> i64 {
        let mut admin = self.admin().await;
        sqlx::query(sql)
            .fetch_one(&mut admin)
            .await
            .and_then(|r| sqlx::Row::try_get(&r, 0))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// (inbox rows, inbox rows with `applied = 1`).
    pub async fn inbox_counts(&self) -> (i64, i64) {
        (
            self.scalar("SELECT COUNT(*) FROM receiver_inbox").await,
            self.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE applied = 1")
                .await,
        )
    }

    /// A proxy in front of this database's server.
    pub async fn proxy(&self) -> commit_proxy::Proxy {
        commit_proxy::Proxy::start("127.0.0.1:0", self.db.address())
            .await
            .expect("the proxy starts")
    }

    /// An admin connection on the receiver database, for inspecting and interfering.
    pub async fn admin(&self) -> MySqlConnection {
        MySqlConnection::connect(self.db.admin_receiver_url().expose())
            .await
            .expect("admin connects")
    }
}

/// A task event as the platform would send it.
#[derive(Debug, Clone)]
pub struct EventSpec {
    pub id: String,
    pub event_type: String,
    pub state: String,
    pub queue: String,
    pub task: String,
    pub version: String,
    pub occurred_at: String,
    /// Raw JSON text of the result, if any.
    pub result: Option<String>,
}

impl EventSpec {
    /// A `task.cancelled` event.
    pub fn cancelled(id: &str, task: &str, version: u64) -> EventSpec {
        EventSpec {
            id: id.into(),
            event_type: "task.cancelled".into(),
            state: "CANCELLED".into(),
            queue: QUEUE.into(),
            task: task.into(),
            version: version.to_string(),
            occurred_at: "2026-12-02T14:17:05.123Z".into(),
            result: None,
        }
    }

    /// A `task.succeeded` event with `result` (raw JSON text).
    pub fn succeeded(id: &str, task: &str, version: u64, result: &str) -> EventSpec {
        EventSpec {
            event_type: "task.succeeded".into(),
            state: "SUCCEEDED".into(),
            result: Some(result.into()),
            ..EventSpec::cancelled(id, task, version)
        }
    }

    /// The event's JSON text, members in a deliberately non-canonical order with whitespace.
    pub fn json(&self) -> String {
        let mut s = format!(
            "{{ \"task_version\": {}, \"type\": \"{}\", \"id\": \"{}\", \"state\": \"{}\",\n  \"queue_id\": \"{}\", \"task_id\": \"{}\", \"namespace\": \"default\", \"occurred_at\": \"{}\"",
            self.version, self.event_type, self.id, self.state, self.queue, self.task, self.occurred_at
        );
        if let Some(r) = &self.result {
            s.push_str(", \"result\": ");
            s.push_str(r);
        }
        s.push_str(" }");
        s
    }

    /// The validated event, for the queue it names.
    pub fn event(&self) -> TaskEvent {
        let queue = QueueId::new(self.queue.clone()).expect("valid queue");
        TaskEvent::parse(self.json().as_bytes(), &queue)
            .unwrap_or_else(|e| panic!("test event is invalid: {e}"))
    }
}

/// The variable `make integration` marks every process of one run with; its leftover check
/// finds processes by it.
pub const RUN_MARKER: &str = "RESULT_INBOX_RUN";

/// A command for `bin` with an empty environment, except the run marker (kept so that the
/// leftover check still sees the process).
pub fn bare_command(bin: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin);
    cmd.env_clear();
    #[allow(clippy::disallowed_methods)] // the harness's own marker
    if let Some(marker) = std::env::var_os(RUN_MARKER) {
        cmd.env(RUN_MARKER, marker);
    }
    cmd
}

/// Every file (anything but a directory) below `dir`: what a run left behind there. Empty
/// directories do not count; a missing `dir` has none.
pub fn files_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// Spawns `cmd` tied to this test process (it dies with it, see `testdb::spawn_tied`).
pub fn spawn(cmd: std::process::Command) -> std::process::Child {
    let program = cmd.get_program().to_string_lossy().into_owned();
    testdb::spawn_tied(cmd).unwrap_or_else(|e| panic!("cannot start {program}: {e}"))
}

/// A platform started with `args` (see [`OrbitDev::start`]), the receiver's tables, a
/// subscription to `types` on [`QUEUE`], and the environment `receiver consume` needs for it.
pub async fn subscribed_receiver(
    args: &[&str],
    types: &[&str],
) -> (
    OrbitDev,
    orbit_sdk::Client,
    orbit_sdk::wire::Subscription,
    Vec<(&'static str, String)>,
) {
    let orbit = OrbitDev::start(args).await;
    orbit.init_receiver().await;
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, types)
        .await
        .expect("subscription created");
    let mut env = orbit.receiver_env();
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
    (orbit, client, sub, env)
}

/// Waits up to `timeout` for `check` to hold, polling every 50 ms; panics naming `what`.
pub async fn eventually<F, Fut>(timeout: std::time::Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "waited {timeout:?} for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `target/<profile>`, where the binaries of this workspace sit beside this test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // A test binary lives in target/<profile>/deps/, a harness binary in target/<profile>/.
    let mut dir = exe.parent().expect("target/<profile>/…");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().expect("target/<profile>");
    }
    dir.to_path_buf()
}

/// `path` under `target/<profile>`, which must exist: `build` says how to make it.
fn built(path: &str, build: &str) -> PathBuf {
    let bin = profile_dir().join(path);
    assert!(
        bin.is_file(),
        "{} is missing: build it first with `{build}` (`make build` does)",
        bin.display()
    );
    bin
}

/// A binary of this workspace (`target/<profile>/<name>`).
pub fn workspace_bin(name: &str) -> PathBuf {
    built(name, "cargo build --workspace --bins")
}

/// An example of this workspace (`target/<profile>/examples/<name>`).
pub fn workspace_example(name: &str) -> PathBuf {
    built(
        &format!("examples/{name}"),
        "cargo build --workspace --examples",
    )
}

/// The `receiver` binary.
pub fn receiver_bin() -> PathBuf {
    workspace_bin("receiver")
}

/// One HTTP/1.1 request with a JSON body to `addr`; the status and the JSON reply. Enough of
/// a client to drive a control interface the way a test in any language would.
pub fn http_json(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let (status, text) = http_raw(addr, method, path, None, body);
    let json =
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, json)
}

/// One raw HTTP/1.1 request, optionally with a bearer token; the status and the body text.
pub fn http_raw(
    addr: &str,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&serde_json::Value>,
) -> (u16, String) {
    use std::io::{Read, Write};
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let mut stream = std::net::TcpStream::connect(addr).expect("the server answers");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("request written");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("reply read");
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, body.to_owned())
}

/// Runs `orbit-dev bootstrap` for `queue` in namespace `default` against the platform database
/// `platform_dsn`, writing the credentials to `output`; returns what it printed on stdout.
pub fn bootstrap(
    platform_dsn: &str,
    queue: &str,
    event_access: bool,
    output: &std::path::Path,
) -> Result<String, String> {
    // bootstrap creates no directory: make the output's, private, as a user would.
    if let Some(dir) = output.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let mut cmd = std::process::Command::new(workspace_bin("orbit-dev"));
    cmd.args([
        "bootstrap",
        "--application",
        "inbox-example",
        "--namespace",
        "default",
        "--environment",
        "development",
        "--queue",
        queue,
    ]);
    if event_access {
        cmd.arg("--event-access");
    }
    let out = cmd
        .arg("--output")
        .arg(output)
        .env("ORBIT_MYSQL_DSN", platform_dsn)
        .output()
        .map_err(|e| format!("orbit-dev bootstrap: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "orbit-dev bootstrap failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A running `orbit-dev` process on its own fresh platform database, bootstrapped with an
/// event-access credential for queue [`QUEUE`]. Killed on drop.
#[derive(Debug)]
pub struct OrbitDev {
    child: Option<std::process::Child>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The bootstrap's credentials file (mode 0600).
    pub credentials_file: PathBuf,
    args: Vec<String>,
    /// The platform's (and a receiver's) databases.
    pub db: Provisioned,
}

impl OrbitDev {
    /// Provisions databases, bootstraps, and serves with `args` (e.g. `--lease-seconds 1`).
    pub async fn start(args: &[&str]) -> OrbitDev {
        Self::start_with(ReceiverDb::provisioned().await, args)
    }

    /// [`OrbitDev::start`] on databases provisioned elsewhere (a node of a cluster, say).
    pub fn start_with(db: Provisioned, args: &[&str]) -> OrbitDev {
        let dir = testdb::scratch_dir()
            .expect("a scratch directory")
            .join(format!("orbit-dev-{}", db.platform_db));
        let credentials_file = dir.join("inbox.credentials.json");
        bootstrap(db.platform_url().expose(), QUEUE, true, &credentials_file)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut me = OrbitDev {
            child: None,
            url: String::new(),
            addr: "127.0.0.1:0".into(),
            credentials_file,
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            db,
        };
        me.serve();
        me
    }

    fn serve(&mut self) {
        use std::io::BufRead;
        let mut cmd = std::process::Command::new(workspace_bin("orbit-dev"));
        cmd.arg("serve")
            .args(["--listen", &self.addr])
            .args(&self.args)
            .env("ORBIT_MYSQL_DSN", self.db.platform_url().expose())
            .stdout(std::process::Stdio::piped())
            .stderr(self.log_file());
        let mut child = testdb::spawn_tied(cmd).expect("orbit-dev starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("orbit-dev prints where it listens");
        let addr = line
            .trim()
            .strip_prefix("listening=")
            .unwrap_or_else(|| panic!("orbit-dev did not start: {line:?}"))
            .to_owned();
        self.url = format!("http://{addr}");
        self.addr = addr;
        self.child = Some(child);
    }

    /// Where the server's standard error goes (appended across restarts).
    fn log_path(&self) -> PathBuf {
        self.credentials_file.with_file_name("orbit-dev.log")
    }

    fn log_file(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("orbit-dev's log file opens")
    }

    /// What the server wrote to standard error so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The server's process id (0 when it is not running).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, std::process::Child::id)
    }

    /// SIGKILL the server and wait for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same database and port.
    pub fn restart(&mut self) {
        self.kill();
        self.serve();
    }

    /// The bootstrap's credentials.
    pub fn credentials(&self) -> orbit_sdk::Credentials {
        orbit_sdk::Credentials::load(&self.credentials_file).expect("credentials load")
    }

    /// Creates the receiver's tables (as the init account) and grants the runtime account.
    pub async fn init_receiver(&self) {
        let dsn = Dsn::parse(self.db.init_url().expose()).expect("testdb makes valid URLs");
        result_inbox::schema::init(&dsn)
            .await
            .unwrap_or_else(|e| panic!("receiver init failed: {e}"));
        self.db.grant_runtime().await.expect("runtime grants apply");
    }

    /// The environment `receiver demo` / `consume` need against this platform.
    pub fn receiver_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ORBIT_URL", self.url.clone()),
            (
                "ORBIT_CREDENTIALS_FILE",
                self.credentials_file.display().to_string(),
            ),
            (
                "ORBIT_RECEIVER_DSN",
                self.db.runtime_url().expose().to_owned(),
            ),
        ]
    }

    /// Bootstraps a further credential in namespace `default` for `queue`; its file.
    pub fn bootstrap_other(&self, queue: &str, event_access: bool) -> PathBuf {
        let file = self
            .credentials_file
            .with_file_name(format!("{queue}-{event_access}.json"));
        bootstrap(self.db.platform_url().expose(), queue, event_access, &file)
            .unwrap_or_else(|e| panic!("{e}"));
        file
    }

    /// Arms a fault of `--enable-fault-api` (`{"fault": …}`); the reply.
    pub fn fault(&self, body: serde_json::Value) -> serde_json::Value {
        let (status, reply) = http_json(&self.addr, "POST", "/v1/_faults", Some(&body));
        assert_eq!(status, 200, "arming {body}: {reply}");
        reply
    }

    /// The subscription's deliveries of `event_id`.
    pub async fn deliveries_of(
        &self,
        subscription: &orbit_sdk::SubscriptionId,
        event_id: &str,
    ) -> Vec<orbit_sdk::wire::DeliveryInfo> {
        let all = self
            .client()
            .list_deliveries(subscription, &orbit_sdk::DeliveryFilter::default())
            .await
            .expect("deliveries listed");
        all.into_iter().filter(|d| d.event_id == event_id).collect()
    }

    /// The receiver's view of `task` (any consumer name): version, state, applied_events.
    pub async fn view(&self, task: &str) -> Option<(u64, String, u64)> {
        let mut admin = MySqlConnection::connect(self.db.admin_receiver_url().expose())
            .await
            .expect("admin connects");
        let row = sqlx::query(
            "SELECT task_version, last_state, applied_events FROM receiver_task_views WHERE task_id = ?",
        )
        .bind(task)
        .fetch_optional(&mut admin)
        .await
        .expect("the view reads");
        row.map(|r| {
            use sqlx::Row;
            (
                r.get(0),
                String::from_utf8_lossy(&r.get::<Vec<u8>, _>(1)).into_owned(),
                r.get(2),
            )
        })
    }

    /// How many inbox rows hold `event_id`.
    pub async fn inbox_rows(&self, event_id: &str) -> i64 {
        let mut admin = MySqlConnection::connect(self.db.admin_receiver_url().expose())
            .await
            .expect("admin connects");
        sqlx::query_scalar("SELECT COUNT(*) FROM receiver_inbox WHERE event_id = ?")
            .bind(event_id)
            .fetch_one(&mut admin)
            .await
            .expect("the inbox reads")
    }

    /// An SDK client with the bootstrap's credential.
    pub fn client(&self) -> orbit_sdk::Client {
        orbit_sdk::Client::new(&self.url, self.credentials().token).expect("a loopback URL")
    }
}

impl Drop for OrbitDev {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = self.credentials_file.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Submits and cancels a task on [`QUEUE`]: one `task.cancelled` event (version 2). The task id.
pub async fn cancelled_task(client: &orbit_sdk::Client) -> String {
    let task = client
        .submit_task(QUEUE, None)
        .await
        .expect("task submitted");
    client.cancel_task(&task.id).await.expect("task cancelled");
    task.id
}

/// Waits until `sub`'s deliveries are all ACKED (and, with `count`, that many).
pub async fn all_acked(
    client: &orbit_sdk::Client,
    sub: &orbit_sdk::SubscriptionId,
    count: Option<usize>,
    within: std::time::Duration,
) {
    eventually(within, "every delivery ACKED", || {
        let (client, sub) = (client.clone(), sub.clone());
        async move {
            let d = client
                .list_deliveries(&sub, &Default::default())
                .await
                .expect("deliveries listed");
            count.is_none_or(|n| d.len() == n) && d.iter().all(|d| d.state == "ACKED")
        }
    })
    .await;
}

/// A receiver whose database lives on a local server of its own (so that a test may stop,
/// kill or restart it without harming any other test), a platform started with `args`, a
/// subscription to `types` on [`QUEUE`], and the environment `receiver consume` needs.
#[derive(Debug)]
pub struct OwnServerReceiver {
    pub orbit: OrbitDev,
    pub client: orbit_sdk::Client,
    pub sub: orbit_sdk::wire::Subscription,
    pub env: Vec<(&'static str, String)>,
    pub receiver_db: Provisioned,
    /// Declared last: dropped after everything that uses it.
    pub server: Server,
}

impl OwnServerReceiver {
    pub async fn start(args: &[&str], types: &[&str]) -> OwnServerReceiver {
        let server = Server::local().expect("a local server");
        let receiver_db = server.provision().await.expect("provisioned");
        let init = Dsn::parse(receiver_db.init_url().expose()).expect("testdb makes valid URLs");
        result_inbox::schema::init(&init)
            .await
            .expect("receiver tables created");
        receiver_db
            .grant_runtime()
            .await
            .expect("runtime grants given");
        let orbit = OrbitDev::start(args).await;
        let client = orbit.client();
        let sub = client
            .create_subscription(QUEUE, types)
            .await
            .expect("subscription created");
        let mut env: Vec<(&'static str, String)> = orbit
            .receiver_env()
            .into_iter()
            .filter(|(k, _)| *k != "ORBIT_RECEIVER_DSN")
            .collect();
        env.push((
            "ORBIT_RECEIVER_DSN",
            receiver_db.runtime_url().expose().to_owned(),
        ));
        env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
        OwnServerReceiver {
            orbit,
            client,
            sub,
            env,
            receiver_db,
            server,
        }
    }
}

/// What [`check_ledger`] counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    /// Deliveries of the subscription (all ACKED).
    pub deliveries: usize,
    /// Distinct events among them (each with one inbox row).
    pub events: usize,
    /// Inbox rows recorded as stale (not applied).
    pub stale: usize,
}

/// After a run: the receiver's tables (read through `admin`, on the receiver database) agree
/// with the platform and with themselves. Every delivery of `sub` is ACKED and its event has
/// exactly one inbox row; no other row exists; every one of `tasks` has a view at its highest
/// version, whose last event is the applied row of that version; `applied_events` counts the
/// applied rows and no version advanced a view twice. `what` names the run in failures.
pub async fn check_ledger(
    admin: &mut MySqlConnection,
    client: &orbit_sdk::Client,
    sub: &orbit_sdk::SubscriptionId,
    tasks: &[String],
    what: &str,
) -> Ledger {
    use std::collections::{BTreeMap, BTreeSet};
    let deliveries = client
        .list_deliveries(sub, &Default::default())
        .await
        .unwrap();
    assert!(
        deliveries.iter().all(|d| d.state == "ACKED"),
        "{what}: every delivery ACKED"
    );
    let delivered: BTreeSet<String> = deliveries.iter().map(|d| d.event_id.clone()).collect();
    let inbox: Vec<(Vec<u8>, bool, Vec<u8>)> =
        sqlx::query_as("SELECT event_id, applied, event_canonical FROM receiver_inbox")
            .fetch_all(&mut *admin)
            .await
            .unwrap();
    // event id → (task, version, applied)
    let mut rows = BTreeMap::new();
    for (id, applied, canonical) in inbox {
        let e: serde_json::Value = serde_json::from_slice(&canonical).unwrap();
        let id = String::from_utf8(id).unwrap();
        let task = e["task_id"].as_str().unwrap().to_owned();
        let version = e["task_version"].as_u64().unwrap();
        assert!(rows.insert(id, (task, version, applied)).is_none());
    }
    let recorded: BTreeSet<String> = rows.keys().cloned().collect();
    assert_eq!(
        recorded, delivered,
        "{what}: every delivered event has exactly one inbox row, and no other row exists"
    );

    let views: Vec<(Vec<u8>, u64, Vec<u8>, u64)> = sqlx::query_as(
        "SELECT task_id, task_version, last_event_id, applied_events FROM receiver_task_views",
    )
    .fetch_all(&mut *admin)
    .await
    .unwrap();
    let views: BTreeMap<String, (u64, String, u64)> = views
        .into_iter()
        .map(|(t, v, e, n)| {
            (
                String::from_utf8(t).unwrap(),
                (v, String::from_utf8(e).unwrap(), n),
            )
        })
        .collect();
    let inbox_tasks: BTreeSet<&String> = rows.values().map(|(t, _, _)| t).collect();
    let view_tasks: BTreeSet<&String> = views.keys().collect();
    assert_eq!(
        inbox_tasks, view_tasks,
        "{what}: no inbox row without its view, no view without an inbox row"
    );
    assert_eq!(view_tasks.len(), tasks.len(), "{what}: a view per task");

    for task in tasks {
        let (version, last_event, applied_events) = &views[task];
        let platform = client.get_task(task).await.unwrap();
        assert_eq!(
            *version, platform.version,
            "{what}: task {task} holds its highest version"
        );
        let of_task: Vec<_> = rows.iter().filter(|(_, (t, _, _))| t == task).collect();
        let (last_task, last_version, last_applied) = &rows[last_event];
        assert_eq!(
            (last_task, last_version, *last_applied),
            (task, version, true),
            "{what}: the view's last event is the applied row of its version"
        );
        let applied: Vec<u64> = of_task
            .iter()
            .filter(|(_, r)| r.2)
            .map(|(_, r)| r.1)
            .collect();
        let distinct: BTreeSet<u64> = applied.iter().copied().collect();
        assert_eq!(
            *applied_events,
            applied.len() as u64,
            "{what}: task {task}: applied_events counts the events that advanced it"
        );
        assert_eq!(
            distinct.len(),
            applied.len(),
            "{what}: task {task}: no version advanced the view twice"
        );
        assert!(applied.iter().all(|v| v <= version));
    }
    Ledger {
        deliveries: deliveries.len(),
        events: delivered.len(),
        stale: rows.values().filter(|r| !r.2).count(),
    }
}
