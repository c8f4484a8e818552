//! The receiver's database as a test gets it: provisioned on the shared server (or a server
//! of the test's own), initialised the way a DBA and `receiver init` would, and stores on it.

use result_inbox::store::StoreOptions;
use result_inbox::Dsn;
use result_inbox::{ConsumerName, QueueId, Store};
use sqlx::{Connection, MySqlConnection};
use testdb::{Provisioned, Server};

use crate::*;

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

    /// The embedding example's own table (`product/result-inbox/examples/embed.rs`), with the runtime
    /// account's SELECT and INSERT on it.
    pub async fn customer_notices(&self) {
        let mut admin = self.admin().await;
        for stmt in [
            "CREATE TABLE customer_notices (task_id VARBINARY(128) NOT NULL, \
             task_version BIGINT UNSIGNED NOT NULL, state VARCHAR(32) NOT NULL, \
             PRIMARY KEY (task_id, task_version)) ENGINE=InnoDB"
                .to_owned(),
            format!(
                "GRANT SELECT, INSERT ON `{}`.customer_notices TO '{}'@'%'",
                self.db.receiver_db, self.db.runtime.user
            ),
        ] {
            sqlx::Executor::execute(&mut admin, stmt.as_str())
                .await
                .unwrap_or_else(|e| panic!("{stmt}: {e}"));
        }
    }

    /// The embedding example, run as a user would, on this database as the runtime account,
    /// with `lines` (one event a line) on its standard input; its exit and output.
    pub async fn run_embed(&self, lines: &str) -> std::process::Output {
        let mut cmd = crate::bare_command(&crate::workspace_example("embed"));
        cmd.arg(self.db.runtime_url().expose())
            .arg(QUEUE)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = crate::spawn(cmd);
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("a piped stdin");
            stdin.write_all(lines.as_bytes()).expect("stdin written");
        }
        tokio::task::spawn_blocking(move || child.wait_with_output().expect("embed ends"))
            .await
            .expect("the wait finished")
    }

    /// [`age_inbox_rows`] on this database.
    pub async fn age_rows(&self, events: &[&str], days: u32) {
        age_inbox_rows(&self.db, events, days).await;
    }

    /// [`prune_env`] for the default consumer and [`QUEUE`].
    pub fn prune_env(&self, url: &secret::Secret) -> Vec<(&'static str, String)> {
        prune_env(url)
    }

    /// An admin connection on the receiver database, for inspecting and interfering.
    pub async fn admin(&self) -> MySqlConnection {
        MySqlConnection::connect(self.db.admin_receiver_url().expose())
            .await
            .expect("admin connects")
    }
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
        initialise(&receiver_db).await;
        let orbit = OrbitDev::start(args).await;
        let client = orbit.client();
        let sub = client
            .create_subscription(QUEUE, types)
            .await
            .expect("subscription created");
        let mut env = orbit.receiver_env_on(&receiver_db.runtime_url());
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

/// Does what a DBA and `receiver init` do to fresh databases `db`: the receiver's tables, made
/// by the init account, then the runtime grants.
pub async fn initialise(db: &Provisioned) {
    let init = Dsn::parse(db.init_url().expose()).expect("testdb makes valid URLs");
    result_inbox::schema::init(&init)
        .await
        .expect("receiver tables created");
    db.grant_runtime().await.expect("runtime grants given");
}

/// A connection at `url` (an admin URL on a cluster node) whose reads wait until the node has
/// applied everything committed anywhere in the cluster before them (`wsrep_sync_wait = 1`).
pub async fn admin_in_sync(url: &secret::Secret) -> MySqlConnection {
    use sqlx::Executor;
    let mut c = MySqlConnection::connect(url.expose())
        .await
        .expect("the node's admin connection opens");
    c.execute("SET SESSION wsrep_sync_wait = 1")
        .await
        .expect("wsrep_sync_wait is set");
    c
}

/// Writes `n` inbox rows of `consumer` and `queue` straight into the table (as the admin, 1,000
/// a statement), with ids `<prefix>-<i>`, `bytes` bytes of frozen event each, received
/// `age_days` ago: what months of applies leave behind, made in seconds. The rows are not
/// events a store could have written (the bytes are filler); only a prune reads them.
pub async fn insert_old_inbox_rows(
    conn: &mut MySqlConnection,
    (consumer, queue): (&str, &str),
    prefix: &str,
    n: usize,
    bytes: usize,
    age_days: u32,
) {
    let filler = vec![b'x'; bytes];
    let mut i = 0;
    while i < n {
        let chunk = (n - i).min(1_000);
        let rows = vec!["(?, ?, ?, UNHEX(SHA2(?, 256)), ?, 1, UTC_TIMESTAMP(6) - INTERVAL ? DAY - INTERVAL ? MICROSECOND)"; chunk].join(", ");
        let sql = format!(
            "INSERT INTO receiver_inbox (consumer_name, queue_id, event_id, event_digest, event_canonical, applied, received_at) VALUES {rows}"
        );
        let mut q = sqlx::query(&sql);
        for j in i..i + chunk {
            let id = format!("{prefix}-{j}");
            q = q
                .bind(consumer)
                .bind(queue)
                .bind(id.clone())
                .bind(id)
                .bind(filler.as_slice())
                .bind(age_days)
                .bind(j as u64);
        }
        q.execute(&mut *conn)
            .await
            .expect("old inbox rows inserted");
        i += chunk;
    }
}

/// Moves the inbox rows of `events` `days` into the past, as if received then (as the admin: no
/// account of the receiver may change `received_at`).
pub async fn age_inbox_rows(db: &Provisioned, events: &[&str], days: u32) {
    let mut admin = MySqlConnection::connect(db.admin_receiver_url().expose())
        .await
        .expect("admin connects");
    for e in events {
        let changed = sqlx::query(
            "UPDATE receiver_inbox SET received_at = received_at - INTERVAL ? DAY WHERE event_id = ?",
        )
        .bind(days)
        .bind(e)
        .execute(&mut admin)
        .await
        .expect("the inbox row ages")
        .rows_affected();
        assert_eq!(changed, 1, "no inbox row of {e} to age");
    }
}

/// The environment `receiver prune` needs, connecting with `url` (the prune account's, or
/// another to prove it refused), for the default consumer and [`QUEUE`].
pub fn prune_env(url: &secret::Secret) -> Vec<(&'static str, String)> {
    vec![
        ("ORBIT_RECEIVER_DSN", url.expose().to_owned()),
        ("ORBIT_QUEUE_ID", QUEUE.to_owned()),
    ]
}
