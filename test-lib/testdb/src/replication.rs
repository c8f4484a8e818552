//! A replication topology for failover tests: one primary and replicas, each a local
//! `mariadbd` on a temporary datadir and a loopback port, with GTID replication, binary logs on
//! every server (`log_slave_updates`), and semi-synchronous replication on or off as the test
//! asks; one address in front of them ([`Forwarder`]) that follows the primary.
//!
//! The primitives are the steps a failover tool (or an operator) takes, each one statement or
//! signal, so that a test composes them into a failover, a switchover or a fault:
//! - [`Topology::kill`] (SIGKILL), [`Topology::pause`] / [`Topology::resume`] (SIGSTOP /
//!   SIGCONT), [`Topology::stop_io`] / [`Topology::start_io`] (a replica stops receiving);
//! - [`Topology::promote_most_advanced`]: the live replica that has received the most is
//!   chosen, its relay log applied to the end **before** anything restarts its replication
//!   threads (a GTID replica purges its relay log when they start), then replication is
//!   stopped and the server made writable, with semi-sync's primary side enabled;
//! - [`Topology::demote`] (read-only), [`Topology::follow`] (a replica follows the new
//!   primary), [`Topology::switch`] (the forwarder sends new connections there);
//! - [`Topology::rebuild`]: a crashed primary never rejoins with what it holds (it may have
//!   committed a transaction no replica acknowledged, and InnoDB recovers it when it
//!   restarts): its datadir is replaced and it is started afresh as a replica of the new
//!   primary, copying everything from the new primary's binary log, under a new server id.
//!
//! Durability settings, as the suite requires of a user: `sync_binlog=1`,
//! `innodb_flush_log_at_trx_commit=1`, `sync_relay_log=1` on replicas, and for lossless
//! semi-sync `rpl_semi_sync_master_wait_point=AFTER_SYNC` set explicitly (MariaDB's default is
//! AFTER_COMMIT).
//!
//! Like every server of this crate, the members die with the test process and their
//! directories go at drop, at exit, or in the next run's sweep.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sqlx::{Connection, Executor, MySqlConnection, Row};

use crate::error::Error;
use crate::forward::Forwarder;
use crate::server::{Backend, Server};

/// How replication is configured.
#[derive(Debug, Clone)]
pub struct ReplicationOptions {
    /// Replicas beside the primary.
    pub replicas: usize,
    /// Semi-synchronous replication (the primary waits for a replica's receipt at COMMIT).
    pub semi_sync: bool,
    /// `rpl_semi_sync_master_wait_point`: `AFTER_SYNC` (lossless) or `AFTER_COMMIT`.
    pub wait_point: &'static str,
    /// `rpl_semi_sync_master_timeout`: how long the primary waits before falling back to
    /// asynchronous replication.
    pub timeout: Duration,
}

impl Default for ReplicationOptions {
    fn default() -> Self {
        ReplicationOptions {
            replicas: 2,
            semi_sync: true,
            wait_point: "AFTER_SYNC",
            timeout: Duration::from_millis(1500),
        }
    }
}

/// One primary, its replicas, and a forwarder to the primary. Dropping it stops them all.
#[derive(Debug)]
pub struct Topology {
    /// Declared first: dropped (closing what it carries) before the servers.
    forwarder: Forwarder,
    members: Vec<Server>,
    primary: usize,
    options: ReplicationOptions,
    password: secret::Secret,
    next_server_id: u32,
}

/// The replication account's name.
const REPL_USER: &str = "repl";

impl Topology {
    /// Starts the members (in parallel), makes the first the primary and the others its
    /// replicas, and returns when every replica has caught up.
    pub fn start(options: ReplicationOptions) -> Result<Topology, Error> {
        let count = options.replicas + 1;
        let started: Vec<Result<Server, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..count)
                .map(|i| {
                    let args = member_args(i as u32 + 1, i == 0, &options);
                    s.spawn(move || {
                        crate::local::LocalServer::start_with(None, args).map(|server| {
                            let description = format!(
                                "member {} of a replication topology ({})",
                                i + 1,
                                server.description()
                            );
                            Server::loopback_root(
                                server.port(),
                                description,
                                Backend::Local(server),
                            )
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a server start does not panic"))
                .collect()
        });
        let members = started.into_iter().collect::<Result<Vec<_>, _>>()?;
        let forwarder = Forwarder::start(addr(&members[0])?)?;
        let mut topology = Topology {
            forwarder,
            members,
            primary: 0,
            password: secret::Secret::new(crate::provision::random_password()),
            next_server_id: count as u32 + 1,
            options,
        };
        crate::provision::block_on(topology.set_up())?;
        Ok(topology)
    }

    async fn set_up(&mut self) -> Result<(), Error> {
        let mut primary = self.admin(self.primary).await?;
        let password = self.password.expose().to_owned();
        for sql in [
            format!("CREATE USER '{REPL_USER}'@'127.0.0.1' IDENTIFIED BY '{password}'"),
            format!("GRANT REPLICATION SLAVE ON *.* TO '{REPL_USER}'@'127.0.0.1'"),
        ] {
            primary
                .execute(sql.as_str())
                .await
                .map_err(Error::sql("creating the replication account"))?;
        }
        for i in self.replicas() {
            self.follow(i, "slave_pos").await?;
        }
        self.wait_caught_up(Duration::from_secs(30)).await
    }

    /// Every member, in order; [`Topology::primary`] says which is the primary now.
    pub fn members(&self) -> &[Server] {
        &self.members
    }

    /// Member `i`.
    pub fn member(&self, i: usize) -> &Server {
        &self.members[i]
    }

    /// The index of the primary now.
    pub fn primary(&self) -> usize {
        self.primary
    }

    /// The indexes of the members that are not the primary.
    pub fn replicas(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|i| *i != self.primary)
            .collect()
    }

    /// The one address clients use: `127.0.0.1:<port>` of the forwarder.
    pub fn address(&self) -> SocketAddr {
        self.forwarder.address()
    }

    /// How replication was configured.
    pub fn options(&self) -> &ReplicationOptions {
        &self.options
    }

    /// An admin connection to member `i`.
    pub async fn admin(&self, i: usize) -> Result<MySqlConnection, Error> {
        MySqlConnection::connect(self.members[i].admin_url().expose())
            .await
            .map_err(Error::sql(format!("connecting to member {}", i + 1)))
    }

    /// SIGKILL member `i`, as a crash would.
    pub fn kill(&self, i: usize) -> bool {
        self.members[i].kill()
    }

    /// SIGSTOP member `i`: it stops answering, its replicas and its clients included.
    pub fn pause(&self, i: usize) -> Result<(), Error> {
        self.members[i].pause()
    }

    /// SIGCONT after [`Topology::pause`].
    pub fn resume(&self, i: usize) -> Result<(), Error> {
        self.members[i].resume()
    }

    /// Replica `i` stops receiving (its IO thread); what it received it still applies.
    pub async fn stop_io(&self, i: usize) -> Result<(), Error> {
        self.run(i, "STOP SLAVE IO_THREAD").await
    }

    /// Replica `i` receives again.
    pub async fn start_io(&self, i: usize) -> Result<(), Error> {
        self.run(i, "START SLAVE IO_THREAD").await
    }

    /// Member `i` refuses writes from accounts without the privilege to bypass it (the
    /// runtime account's): a demoted primary.
    pub async fn demote(&self, i: usize) -> Result<(), Error> {
        self.run(i, "SET GLOBAL read_only = 1").await
    }

    /// New connections through the forwarder go to member `i`.
    pub fn switch(&self, i: usize) -> Result<(), Error> {
        self.forwarder.switch(addr(&self.members[i])?);
        Ok(())
    }

    async fn run(&self, i: usize, sql: &str) -> Result<(), Error> {
        self.admin(i)
            .await?
            .execute(sql)
            .await
            .map(|_| ())
            .map_err(Error::sql(format!("{sql} on member {}", i + 1)))
    }

    /// Member `i` replicates from the primary, from `position` (`slave_pos` for a replica,
    /// `current_pos` for a former primary that stepped down cleanly).
    pub async fn follow(&self, i: usize, position: &str) -> Result<(), Error> {
        let port = self.members[self.primary].port();
        let password = self.password.expose();
        let mut c = self.admin(i).await?;
        for sql in [
            "STOP SLAVE".to_owned(),
            format!(
                "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {port}, \
                 MASTER_USER = '{REPL_USER}', MASTER_PASSWORD = '{password}', \
                 MASTER_USE_GTID = {position}, MASTER_CONNECT_RETRY = 1, \
                 MASTER_HEARTBEAT_PERIOD = 1"
            ),
            "SET GLOBAL read_only = 1".to_owned(),
            "SET GLOBAL rpl_semi_sync_master_enabled = OFF".to_owned(),
            "START SLAVE".to_owned(),
        ] {
            c.execute(sql.as_str()).await.map_err(Error::sql(format!(
                "making member {} a replica of member {}",
                i + 1,
                self.primary + 1
            )))?;
        }
        Ok(())
    }

    /// The highest sequence number of GTID domain 0 that member `i` has received (a replica:
    /// its IO thread's position) or written (the primary: its binary log).
    pub async fn received(&self, i: usize) -> Result<u64, Error> {
        let mut c = self.admin(i).await?;
        let status = c
            .fetch_optional("SHOW SLAVE STATUS")
            .await
            .map_err(Error::sql("SHOW SLAVE STATUS"))?;
        let pos = match status {
            Some(row) => text(&row, "Gtid_IO_Pos"),
            None => {
                let row = c
                    .fetch_one("SELECT @@GLOBAL.gtid_binlog_pos")
                    .await
                    .map_err(Error::sql("reading gtid_binlog_pos"))?;
                text(&row, 0)
            }
        };
        Ok(sequence(&pos))
    }

    /// The highest sequence number of GTID domain 0 that member `i` has applied.
    pub async fn applied(&self, i: usize) -> Result<u64, Error> {
        let row = self
            .admin(i)
            .await?
            .fetch_one("SELECT @@GLOBAL.gtid_current_pos")
            .await
            .map_err(Error::sql("reading gtid_current_pos"))?;
        Ok(sequence(&text(&row, 0)))
    }

    /// Waits until every live replica has applied all that the primary has written.
    pub async fn wait_caught_up(&self, within: Duration) -> Result<(), Error> {
        let end = Instant::now() + within;
        let target = self.applied(self.primary).await?;
        for i in self.replicas() {
            self.wait_applied(i, target, end).await?;
        }
        Ok(())
    }

    /// Waits until member `i` has applied sequence `target`, failing at `end`.
    async fn wait_applied(&self, i: usize, target: u64, end: Instant) -> Result<(), Error> {
        while self.applied(i).await? < target {
            if Instant::now() > end {
                return Err(Error::Config(format!(
                    "member {} did not apply up to sequence {target} in time",
                    i + 1
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Promotes the live replica that has received the most (the primary is dead, stopped or
    /// demoted): waits until it has applied its whole relay log, stops its replication, turns
    /// semi-sync's primary side on (when the topology uses it) and makes it writable. The
    /// forwarder is not switched and the other members are not touched: see
    /// [`Topology::switch`], [`Topology::follow`] and [`Topology::rebuild`]. Returns the new
    /// primary's index.
    pub async fn promote_most_advanced(&mut self) -> Result<usize, Error> {
        let mut best: Option<(usize, u64)> = None;
        for i in self.replicas() {
            if self.members[i].pid().is_none() {
                continue;
            }
            if let Ok(n) = self.received(i).await {
                if best.is_none_or(|(_, m)| n > m) {
                    best = Some((i, n));
                }
            }
        }
        let (chosen, received) =
            best.ok_or_else(|| Error::Config("no live replica to promote".into()))?;
        // Its relay log applied to the end while its SQL thread still runs: nothing restarts
        // a replication thread before that (a restart would purge the relay log).
        self.wait_applied(chosen, received, Instant::now() + Duration::from_secs(60))
            .await?;
        let semi = if self.options.semi_sync { "ON" } else { "OFF" };
        let mut c = self.admin(chosen).await?;
        for sql in [
            "STOP SLAVE".to_owned(),
            "RESET SLAVE ALL".to_owned(),
            // Off, then on: enabling starts the primary side in the state ON, whereas a
            // server that was a primary before keeps the OFF it fell back to, and switches on
            // only when a replica acknowledges a commit made after it, which, if the receiver
            // is the only writer and holds, never comes.
            "SET GLOBAL rpl_semi_sync_master_enabled = OFF".to_owned(),
            format!("SET GLOBAL rpl_semi_sync_master_enabled = {semi}"),
            "SET GLOBAL read_only = 0".to_owned(),
        ] {
            c.execute(sql.as_str())
                .await
                .map_err(Error::sql(format!("promoting member {}", chosen + 1)))?;
        }
        self.primary = chosen;
        Ok(chosen)
    }

    /// Member `i` (a crashed former primary) rebuilt from nothing as a replica of the
    /// primary: killed if it runs, its datadir replaced, started with a new server id, and
    /// replicating everything from the primary's binary log. Returns when it has caught up.
    pub async fn rebuild(&mut self, i: usize) -> Result<(), Error> {
        assert_ne!(i, self.primary, "the primary is not rebuilt");
        let id = self.next_server_id;
        self.next_server_id += 1;
        let args = member_args(id, false, &self.options);
        let member = &mut self.members[i];
        tokio::task::block_in_place(|| match &mut member.backend {
            Backend::Local(server) => server.rebuild(args),
            _ => Err(Error::Config("only a local member can be rebuilt".into())),
        })?;
        self.follow(i, "slave_pos").await?;
        self.wait_caught_up(Duration::from_secs(60)).await
    }

    /// `Rpl_semi_sync_master_status` of member `i`: whether a replica acknowledges its
    /// commits now.
    pub async fn semi_sync_on(&self, i: usize) -> Result<bool, Error> {
        let row = self
            .admin(i)
            .await?
            .fetch_optional("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_status'")
            .await
            .map_err(Error::sql("reading Rpl_semi_sync_master_status"))?;
        Ok(row.is_some_and(|r| text(&r, 1).eq_ignore_ascii_case("ON")))
    }
}

/// A member's server options.
fn member_args(server_id: u32, primary: bool, options: &ReplicationOptions) -> Vec<String> {
    let on = |b: bool| if b { "ON" } else { "OFF" };
    vec![
        format!("--server-id={server_id}"),
        "--log-bin=binlog".into(),
        "--log-slave-updates=ON".into(),
        "--binlog-format=ROW".into(),
        "--relay-log=relay".into(),
        "--sync-binlog=1".into(),
        "--innodb-flush-log-at-trx-commit=1".into(),
        "--sync-relay-log=1".into(),
        "--sync-master-info=1".into(),
        "--skip-slave-start".into(),
        format!(
            "--rpl-semi-sync-master-enabled={}",
            on(options.semi_sync && primary)
        ),
        format!("--rpl-semi-sync-slave-enabled={}", on(options.semi_sync)),
        format!("--rpl-semi-sync-master-wait-point={}", options.wait_point),
        format!(
            "--rpl-semi-sync-master-timeout={}",
            options.timeout.as_millis()
        ),
        format!("--read-only={}", if primary { 0 } else { 1 }),
    ]
}

fn addr(server: &Server) -> Result<SocketAddr, Error> {
    server
        .address()
        .parse()
        .map_err(|_| Error::Config(format!("not an address: {}", server.address())))
}

/// A column of `row` (by name or position) as text; empty when it cannot be read.
fn text<I: sqlx::ColumnIndex<sqlx::mysql::MySqlRow>>(
    row: &sqlx::mysql::MySqlRow,
    column: I,
) -> String {
    row.try_get::<Vec<u8>, _>(column)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The sequence number of GTID domain 0 in a position such as `0-2-57,1-3-4` (0 if absent).
fn sequence(position: &str) -> u64 {
    position
        .split(',')
        .filter_map(|g| {
            let mut parts = g.trim().split('-');
            let domain = parts.next()?;
            let _server = parts.next()?;
            let seq = parts.next()?.parse().ok()?;
            (domain == "0").then_some(seq)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_s_sequence_is_domain_zero_s() {
        assert_eq!(sequence("0-1-57"), 57);
        assert_eq!(sequence("1-3-9,0-2-60"), 60);
        assert_eq!(sequence(""), 0);
        assert_eq!(sequence("1-3-9"), 0);
    }

    #[test]
    fn only_the_primary_starts_writable_with_semi_sync_s_primary_side() {
        let o = ReplicationOptions::default();
        let p = member_args(1, true, &o);
        let r = member_args(2, false, &o);
        assert!(p.contains(&"--read-only=0".to_owned()));
        assert!(p.contains(&"--rpl-semi-sync-master-enabled=ON".to_owned()));
        assert!(r.contains(&"--read-only=1".to_owned()));
        assert!(r.contains(&"--rpl-semi-sync-master-enabled=OFF".to_owned()));
        assert!(r.contains(&"--rpl-semi-sync-master-wait-point=AFTER_SYNC".to_owned()));
        assert!(r.contains(&"--sync-relay-log=1".to_owned()));
    }
}
