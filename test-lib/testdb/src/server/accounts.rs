//! A server's accounts and databases for one test ([`Server::provision`]), and what the harness
//! administers on a server as a whole.

use crate::error::Error;
use std::sync::atomic::Ordering;

use secret::Secret;
use sqlx::{Connection, Executor, Row};

use crate::provision::{connect, random_password, select_version, url, Account, Provisioned, SEQ};
use crate::server::Server;

impl Server {
    /// Creates fresh databases and accounts for one test, with the init and platform grants.
    /// The runtime grants need the tables: call [`Provisioned::grant_runtime`] after init.
    pub async fn provision(&self) -> Result<Provisioned, Error> {
        let pid = std::process::id();
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{pid}_{n}");
        let account = |role: &str| Account {
            user: format!("rit_{tag}_{role}"),
            password: random_password().into(),
        };
        let receiver_db = format!("orbit_receiver_test_{tag}");
        let p = Provisioned {
            address: self.address(),
            admin_url: self.admin_url(),
            admin_receiver: self.admin_url_on(Some(&receiver_db)),
            query: self.tls_query(),
            platform_db: format!("orbit_test_{tag}"),
            receiver_db,
            init: account("init"),
            runtime: account("run"),
            platform: account("plat"),
            prune: account("prune"),
        };
        let mut conn = connect(p.admin_url.expose()).await?;
        let mut stmts = vec![
            format!("CREATE DATABASE `{}` CHARACTER SET utf8mb4", p.platform_db),
            format!("CREATE DATABASE `{}` CHARACTER SET utf8mb4", p.receiver_db),
        ];
        for a in [&p.init, &p.runtime, &p.platform, &p.prune] {
            stmts.push(format!(
                "CREATE USER '{}'@'%' IDENTIFIED BY '{}'",
                a.user,
                a.password.expose()
            ));
        }
        stmts.extend(p.grants(false));
        stmts.push(format!(
            "GRANT ALL PRIVILEGES ON `{}`.* TO '{}'@'%'",
            p.platform_db, p.platform.user
        ));
        for stmt in &stmts {
            conn.execute(stmt.as_str())
                .await
                .map_err(Error::sql(format!(
                    "provisioning failed at `{}`",
                    stmt.split(" IDENTIFIED").next().unwrap_or(stmt)
                )))?;
        }
        let _ = conn.close().await;
        Ok(p)
    }
}

impl Provisioned {
    /// [`Provisioned::runtime_url`] on another node of the same cluster, where the same
    /// databases and accounts exist.
    pub fn runtime_url_on(&self, node: &Server) -> Secret {
        url(
            &self.runtime.user,
            self.runtime.password.expose(),
            &node.address(),
            Some(&self.receiver_db),
            &node.tls_query(),
        )
    }

    /// [`Provisioned::init_url`] on another node of the same cluster.
    pub fn init_url_on(&self, node: &Server) -> Secret {
        url(
            &self.init.user,
            self.init.password.expose(),
            &node.address(),
            Some(&self.receiver_db),
            &node.tls_query(),
        )
    }

    /// [`Provisioned::admin_receiver_url`] on another node of the same cluster.
    pub fn admin_receiver_url_on(&self, node: &Server) -> Secret {
        node.admin_url_on(Some(&self.receiver_db))
    }
}

pub(crate) async fn server_version(server: &Server) -> Result<String, Error> {
    select_version(server.admin_url()).await
}

/// On an existing server on this machine: drops the databases and users of earlier runs whose
/// test process is gone. A server elsewhere is left alone (its pids are not ours to judge).
pub(crate) async fn sweep_leftovers(server: &Server) -> Result<(), Error> {
    if !matches!(server.host.as_str(), "127.0.0.1" | "localhost" | "::1") {
        return Ok(());
    }
    let mut conn = connect(server.admin_url().expose()).await?;
    let dead = |name: &str| -> bool {
        let pid = name
            .trim_start_matches("orbit_receiver_test_")
            .trim_start_matches("orbit_test_")
            .trim_start_matches("rit_")
            .split('_')
            .next()
            .and_then(|p| p.parse::<i32>().ok());
        pid.is_some_and(|p| !crate::process::process_alive(p))
    };
    let dbs: Vec<String> = sqlx::query(
        "SELECT schema_name FROM information_schema.schemata \
         WHERE schema_name LIKE 'orbit\\_test\\_%' OR schema_name LIKE 'orbit\\_receiver\\_test\\_%'",
    )
    .fetch_all(&mut conn)
    .await
    .map(|rows| rows.iter().filter_map(|r| r.try_get(0).ok()).collect())
    .unwrap_or_default();
    for db in dbs.iter().filter(|d| dead(d)) {
        let _ = conn
            .execute(format!("DROP DATABASE IF EXISTS `{db}`").as_str())
            .await;
    }
    let users: Vec<String> =
        sqlx::query("SELECT user FROM mysql.user WHERE user LIKE 'rit\\_%' AND host = '%'")
            .fetch_all(&mut conn)
            .await
            .map(|rows| rows.iter().filter_map(|r| r.try_get(0).ok()).collect())
            .unwrap_or_default();
    for user in users.iter().filter(|u| dead(u)) {
        let _ = conn
            .execute(format!("DROP USER IF EXISTS '{user}'@'%'").as_str())
            .await;
    }
    let _ = conn.close().await;
    Ok(())
}
