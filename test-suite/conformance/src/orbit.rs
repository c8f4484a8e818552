//! The development platform as a real process (`orbit-dev serve`), its bootstrap, and the
//! subscriptions and tasks a test makes on it.

use std::path::PathBuf;

use result_inbox::Dsn;
use sqlx::{Connection, MySqlConnection};
use testdb::Provisioned;

use crate::*;

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
    /// With TLS: the CA that signed the server's certificate (`ORBIT_CA_FILE`).
    pub ca_file: Option<PathBuf>,
    /// What starts the program, when not a plain command on loopback.
    launcher: Option<Launcher>,
}

/// `args` and the options that make orbit-dev serve TLS only, with a certificate for `names`
/// signed by `pki`'s CA.
fn tls_args(pki: &testdb::tls::Pki, names: &[&str], args: &[&str]) -> Vec<String> {
    let files = pki
        .server("orbit-dev", names)
        .unwrap_or_else(|e| panic!("orbit-dev's certificate: {e}"));
    let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    all.extend([
        "--tls-cert".to_owned(),
        files.cert.display().to_string(),
        "--tls-key".to_owned(),
        files.key.display().to_string(),
    ]);
    all
}

/// Makes the `orbit-dev` command (from its binary's path) for [`OrbitDev::start_launched`],
/// with where it listens and the platform database's URL as seen from there.
#[derive(Clone)]
pub struct Launcher {
    /// The command for the binary: in a network namespace, say.
    pub command: std::sync::Arc<dyn Fn(&std::path::Path) -> std::process::Command + Send + Sync>,
    /// `--listen`, e.g. `10.213.7.4:0`.
    pub listen: String,
    /// `ORBIT_MYSQL_DSN` (over the server's unix socket, from another namespace).
    pub platform_dsn: secret::Secret,
}

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launcher")
            .field("listen", &self.listen)
            .finish_non_exhaustive()
    }
}

impl OrbitDev {
    /// Provisions databases, bootstraps, and serves with `args` (e.g. `--lease-seconds 1`).
    pub async fn start(args: &[&str]) -> OrbitDev {
        Self::start_with(ReceiverDb::provisioned().await, args)
    }

    /// [`OrbitDev::start_with`] serving HTTPS and WSS only, with a certificate for
    /// `localhost` and `127.0.0.1` signed by `pki`'s CA (the receiver's database server's CA,
    /// typically); [`OrbitDev::url`] is `https://…` and the receiver's environment names the CA
    /// in `ORBIT_CA_FILE`.
    pub fn start_tls(db: Provisioned, pki: &testdb::tls::Pki, args: &[&str]) -> OrbitDev {
        let all = tls_args(pki, &testdb::TLS_NAMES, args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        Self::start_inner(db, &all, Some(pki.ca.clone()))
    }

    /// [`OrbitDev::start`] on databases provisioned elsewhere (a node of a cluster, say).
    pub fn start_with(db: Provisioned, args: &[&str]) -> OrbitDev {
        Self::start_inner(db, args, None)
    }

    /// [`OrbitDev::start_with`] started by `launcher` (in a network namespace, listening on
    /// its address there) on HTTPS and WSS only, with a certificate for the address it
    /// listens on, signed by `pki`'s CA; a restart starts it the same way.
    pub fn start_launched(
        db: Provisioned,
        pki: &testdb::tls::Pki,
        args: &[&str],
        launcher: Launcher,
    ) -> OrbitDev {
        let host = launcher
            .listen
            .rsplit_once(':')
            .map_or(launcher.listen.as_str(), |(h, _)| h);
        let all = tls_args(pki, &[host], args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let mut me = Self::prepared(db, &all, Some(pki.ca.clone()));
        me.addr = launcher.listen.clone();
        me.launcher = Some(launcher);
        me.serve();
        me
    }

    fn start_inner(db: Provisioned, args: &[&str], ca_file: Option<PathBuf>) -> OrbitDev {
        let mut me = Self::prepared(db, args, ca_file);
        me.serve();
        me
    }

    /// Bootstrapped, not yet serving.
    fn prepared(db: Provisioned, args: &[&str], ca_file: Option<PathBuf>) -> OrbitDev {
        let dir = testdb::scratch_dir()
            .expect("a scratch directory")
            .join(format!("orbit-dev-{}", db.platform_db));
        let credentials_file = dir.join("inbox.credentials.json");
        bootstrap(db.platform_url().expose(), QUEUE, true, &credentials_file)
            .unwrap_or_else(|e| panic!("{e}"));
        OrbitDev {
            child: None,
            url: String::new(),
            addr: "127.0.0.1:0".into(),
            credentials_file,
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            db,
            ca_file,
            launcher: None,
        }
    }

    fn serve(&mut self) {
        use std::io::BufRead;
        let bin = workspace_bin("orbit-dev");
        let (mut cmd, dsn) = match &self.launcher {
            Some(l) => ((l.command)(&bin), l.platform_dsn.clone()),
            None => (std::process::Command::new(bin), self.db.platform_url()),
        };
        cmd.arg("serve")
            .args(["--listen", &self.addr])
            .args(&self.args)
            .env("ORBIT_MYSQL_DSN", dsn.expose())
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
        let scheme = if self.ca_file.is_some() {
            "https"
        } else {
            "http"
        };
        self.url = format!("{scheme}://{addr}");
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
        self.receiver_env_on(&self.db.runtime_url())
    }

    /// [`OrbitDev::receiver_env`] with the receiver's database at `dsn` (another server, another
    /// node, a proxy).
    pub fn receiver_env_on(&self, dsn: &secret::Secret) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("ORBIT_URL", self.url.clone()),
            (
                "ORBIT_CREDENTIALS_FILE",
                self.credentials_file.display().to_string(),
            ),
            ("ORBIT_RECEIVER_DSN", dsn.expose().to_owned()),
        ];
        if let Some(ca) = &self.ca_file {
            env.push(("ORBIT_CA_FILE", ca.display().to_string()));
        }
        env
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

    /// A value without labels, or with the labels written in `name` (`orbit_acks_total{result="refused"}`),
    /// from the platform's `/metrics`; `None` when it is absent or the platform does not
    /// answer within 2 s (it may have been stopped). Never panics: a world reads it while it
    /// drops.
    pub fn metric(&self, name: &str) -> Option<u64> {
        let request = format!(
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        );
        let reply = crate::http::exchange(
            &self.addr,
            self.ca_file.as_deref(),
            &request,
            std::time::Duration::from_secs(2),
        )
        .ok()?;
        reply
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Arms a fault of `--enable-fault-api` (`{"fault": …}`); the reply.
    pub fn fault(&self, body: serde_json::Value) -> serde_json::Value {
        let text = body.to_string();
        let request = format!(
            "POST /v1/_faults HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
            self.addr,
            text.len()
        );
        let reply = crate::http::exchange(
            &self.addr,
            self.ca_file.as_deref(),
            &request,
            std::time::Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("arming {body}: {e}"));
        let (status, reply) = crate::http::split_reply(&reply);
        assert_eq!(status, 200, "arming {body}: {reply}");
        serde_json::from_str(reply.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {reply}"))
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

    /// An admin connection on the receiver database and the platform account's on the
    /// platform database, for a bench or a test that watches both.
    pub async fn connections(&self) -> (MySqlConnection, MySqlConnection) {
        let admin = MySqlConnection::connect(self.db.admin_receiver_url().expose())
            .await
            .expect("admin connects");
        let platform = MySqlConnection::connect(self.db.platform_url().expose())
            .await
            .expect("the platform account connects");
        (admin, platform)
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

    /// An SDK client with the bootstrap's credential (trusting the platform's CA with TLS).
    pub fn client(&self) -> orbit_sdk::Client {
        let trust = self.ca_file.as_ref().map(|ca| {
            orbit_sdk::Trust::load(Some(ca)).unwrap_or_else(|e| panic!("the run's CA: {e}"))
        });
        orbit_sdk::Client::with_trust(&self.url, self.credentials().token, trust)
            .expect("a loopback URL")
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
