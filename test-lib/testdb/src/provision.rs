//! Per-test databases and accounts on a [`Server`], removed when the test is done.

use secret::Secret;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Connection, Executor, MySqlConnection, Row};

use crate::error::Error;

/// The DBA's grants, with the placeholder names this module replaces.
const GRANTS_SQL: &str = include_str!("../../../schema/grants.sql");

/// Runs `fut` to completion on a fresh single-threaded runtime in its own thread, so that it
/// works from synchronous code, from inside a runtime, and from `Drop`.
pub(crate) fn block_on<F, T>(fut: F) -> T
where
    F: std::future::Future<Output = T> + Send,
    T: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime starts")
                .block_on(fut)
        })
        .join()
        .expect("the helper thread does not panic")
    })
}

/// `mysql://user[:password]@address[/database][?query]`, a [`Secret`] because of the
/// password. `query` is empty, or a TLS server's parameters (see [`Server::tls_query`]).
pub(crate) fn url(
    user: &str,
    password: &str,
    address: &str,
    database: Option<&str>,
    query: &str,
) -> Secret {
    let mut u = format!("mysql://{}", endpoint::encode_component(user));
    if !password.is_empty() {
        u.push(':');
        u.push_str(&endpoint::encode_component(password));
    }
    u.push('@');
    u.push_str(address);
    if let Some(db) = database {
        u.push('/');
        u.push_str(&endpoint::encode_component(db));
    }
    if !query.is_empty() {
        if database.is_none() {
            u.push('/');
        }
        u.push('?');
        u.push_str(query);
    }
    Secret::new(u)
}

pub(crate) async fn connect(url: &str) -> Result<MySqlConnection, Error> {
    MySqlConnection::connect(url)
        .await
        .map_err(Error::sql("cannot connect as admin"))
}

pub(crate) async fn select_version(url: Secret) -> Result<String, Error> {
    let mut conn = connect(url.expose()).await?;
    let version: String = sqlx::query("SELECT VERSION()")
        .fetch_one(&mut conn)
        .await
        .and_then(|r| r.try_get(0))
        .map_err(Error::sql("SELECT VERSION() failed"))?;
    let _ = conn.close().await;
    Ok(version)
}

pub(crate) fn random_password() -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    let a = h.finish();
    let mut h = RandomState::new().build_hasher();
    h.write_u64(a);
    format!("P{:016x}{:016x}", a, h.finish())
}

/// A MySQL account made for one test; its password prints as `***`.
#[derive(Debug, Clone)]
pub struct Account {
    pub user: String,
    pub password: secret::Secret,
}

/// One test's databases and accounts. Dropping it drops them.
#[derive(Debug)]
pub struct Provisioned {
    pub(crate) address: String,
    pub(crate) admin_url: Secret,
    /// The admin URL on the receiver database.
    pub(crate) admin_receiver: Secret,
    /// What every account's URL of a TLS server carries (empty otherwise).
    pub(crate) query: String,
    /// The platform's database (`orbit_test_<pid>_<n>`).
    pub platform_db: String,
    /// The receiver's database (`orbit_receiver_test_<pid>_<n>`).
    pub receiver_db: String,
    /// May create tables in the receiver database; nothing else.
    pub init: Account,
    /// SELECT, INSERT, UPDATE on the two receiver tables, once [`Provisioned::grant_runtime`]
    /// has run; nothing else.
    pub runtime: Account,
    /// Everything on the platform database; nothing on the receiver's.
    pub platform: Account,
    /// SELECT and DELETE on the inbox, once [`Provisioned::grant_runtime`] has run; nothing
    /// else (`receiver prune`).
    pub prune: Account,
}

pub(crate) static SEQ: AtomicU64 = AtomicU64::new(0);

impl Provisioned {
    /// The statements of `schema/grants.sql` for this test's names: the init step, or the
    /// steps after init (the runtime and prune accounts').
    pub(crate) fn grants(&self, after_init: bool) -> Vec<String> {
        GRANTS_SQL
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .filter(|s| {
                (s.contains("receiver_runtime") || s.contains("receiver_prune")) == after_init
            })
            .map(|s| {
                s.replace("`orbit_receiver`", &format!("`{}`", self.receiver_db))
                    .replace("'receiver_init'", &format!("'{}'", self.init.user))
                    .replace("'receiver_runtime'", &format!("'{}'", self.runtime.user))
                    .replace("'receiver_prune'", &format!("'{}'", self.prune.user))
                    .replace("'localhost'", "'%'")
            })
            .collect()
    }

    /// Runs the steps of `schema/grants.sql` that need the tables: the runtime and the prune
    /// accounts' grants.
    pub async fn grant_runtime(&self) -> Result<(), Error> {
        let mut conn = connect(self.admin_url.expose()).await?;
        for stmt in self.grants(true) {
            match conn.execute(stmt.as_str()).await {
                Ok(_) => {}
                // A receiver written elsewhere (the kit judges those) may keep no schema
                // ledger of ours: the grant to read it is moot there.
                Err(e)
                    if stmt.contains("receiver_schema_versions")
                        && e.as_database_error()
                            .and_then(|d| d.code())
                            .is_some_and(|c| c == "42S02") => {}
                Err(e) => return Err(Error::sql("runtime grant failed")(e)),
            }
        }
        let _ = conn.close().await;
        Ok(())
    }

    fn receiver_url_for(&self, a: &Account) -> Secret {
        url(
            &a.user,
            a.password.expose(),
            &self.address,
            Some(&self.receiver_db),
            &self.query,
        )
    }

    /// The init account's URL on the receiver database.
    pub fn init_url(&self) -> Secret {
        self.receiver_url_for(&self.init)
    }

    /// The runtime account's URL on the receiver database.
    pub fn runtime_url(&self) -> Secret {
        self.receiver_url_for(&self.runtime)
    }

    /// The prune account's URL on the receiver database.
    pub fn prune_url(&self) -> Secret {
        self.receiver_url_for(&self.prune)
    }

    /// The platform account's URL on the platform database.
    pub fn platform_url(&self) -> Secret {
        url(
            &self.platform.user,
            self.platform.password.expose(),
            &self.address,
            Some(&self.platform_db),
            &self.query,
        )
    }

    /// The runtime account's URL on the platform database (which it must not be able to use).
    pub fn runtime_url_on_platform_db(&self) -> Secret {
        url(
            &self.runtime.user,
            self.runtime.password.expose(),
            &self.address,
            Some(&self.platform_db),
            &self.query,
        )
    }

    /// The admin URL on the receiver database, for tests that inspect or interfere.
    pub fn admin_receiver_url(&self) -> Secret {
        self.admin_receiver.clone()
    }

    /// On a TLS server: makes the init and runtime accounts `REQUIRE X509`, so that they can
    /// connect only with a client certificate signed by the server's CA (their URLs carry
    /// one).
    pub async fn require_x509(&self) -> Result<(), Error> {
        let mut conn = connect(self.admin_url.expose()).await?;
        for a in [&self.init, &self.runtime] {
            conn.execute(format!("ALTER USER '{}'@'%' REQUIRE X509", a.user).as_str())
                .await
                .map_err(Error::sql("ALTER USER … REQUIRE X509 failed"))?;
        }
        let _ = conn.close().await;
        Ok(())
    }

    /// `host:port`.
    pub fn address(&self) -> &str {
        &self.address
    }

    async fn drop_all(admin_url: Secret, dbs: [String; 2], users: [String; 4]) {
        let Ok(mut conn) = connect(admin_url.expose()).await else {
            return;
        };
        // Sessions of this test's own accounts that outlived it (a proxy's connection whose
        // task was never polled again, say) would hold their tables' metadata locks, and DROP
        // DATABASE would wait on them for the server's lock wait timeout (a year by default).
        let mut sessions = sqlx::query_scalar(
            "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST WHERE USER IN (?, ?, ?, ?)",
        );
        for user in &users {
            sessions = sessions.bind(user);
        }
        let sessions: Vec<i64> = sessions.fetch_all(&mut conn).await.unwrap_or_default();
        for id in sessions {
            let _ = conn.execute(format!("KILL CONNECTION {id}").as_str()).await;
        }
        for db in dbs {
            let _ = conn
                .execute(format!("DROP DATABASE IF EXISTS `{db}`").as_str())
                .await;
        }
        for user in users {
            let _ = conn
                .execute(format!("DROP USER IF EXISTS '{user}'@'%'").as_str())
                .await;
        }
        let _ = conn.close().await;
    }
}

impl Drop for Provisioned {
    fn drop(&mut self) {
        block_on(Self::drop_all(
            self.admin_url.clone(),
            [self.platform_db.clone(), self.receiver_db.clone()],
            [
                self.init.user.clone(),
                self.runtime.user.clone(),
                self.platform.user.clone(),
                self.prune.user.clone(),
            ],
        ));
    }
}
