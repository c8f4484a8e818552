//! The store's own connections: one per concurrent apply, opened on demand, kept while clean.
//!
//! Not sqlx's pool, for two reasons:
//! - sqlx's pool sends `COM_PING` on acquire and on every release: two round trips per apply
//!   that prove nothing the next statement would not (a broken idle connection fails at
//!   `BEGIN`, before anything is written, and the apply retries on a fresh one);
//! - each connection knows its server-side id (`CONNECTION_ID()`), so a connection abandoned
//!   mid-statement is ended on the server with `KILL` from another connection, not left
//!   waiting on a lock until `innodb_lock_wait_timeout`.
//!
//! A connection goes back to the idle list only when its owner says it is clean (no open
//! transaction, no statement in flight). Every other connection is closed, and killed on the
//! server when a statement may still run there.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{Connection, Executor, Row};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a `KILL` of an abandoned connection may take, connecting included.
pub(crate) const KILL_TIMEOUT: Duration = Duration::from_millis(500);

/// One open connection and its id on the server.
pub(crate) struct Conn {
    pub(crate) raw: MySqlConnection,
    pub(crate) id: u64,
}

/// At most `max` connections, idle ones reused last-in first-out.
pub(crate) struct Pool {
    options: MySqlConnectOptions,
    idle: Mutex<Vec<Conn>>,
    slots: Arc<Semaphore>,
}

impl Pool {
    pub(crate) fn new(options: MySqlConnectOptions, max: u32) -> Pool {
        Pool {
            options,
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(max.max(1) as usize)),
        }
    }

    /// Opens a connection and makes it a store connection: READ COMMITTED for every later
    /// transaction (the time zone is in the options), and its server-side id read.
    pub(crate) async fn open(&self) -> Result<Conn, sqlx::Error> {
        let mut raw = MySqlConnection::connect_with(&self.options).await?;
        raw.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .await?;
        let id: u64 = sqlx::query("SELECT CONNECTION_ID()")
            .fetch_one(&mut raw)
            .await?
            .try_get(0)?;
        Ok(Conn { raw, id })
    }

    /// A connection for one apply: an idle one, or a new one. Waits for a free slot.
    pub(crate) async fn acquire(&self) -> Result<Lease<'_>, sqlx::Error> {
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = self.idle.lock().expect("idle list lock").pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.open().await?,
        };
        Ok(Lease {
            pool: self,
            conn: Some(conn),
            state: State::Busy,
            _permit: permit,
        })
    }

    /// Closes the idle connections; connections in use close when their lease ends.
    pub(crate) async fn close(&self) {
        self.slots.close();
        let idle: Vec<Conn> = std::mem::take(&mut *self.idle.lock().expect("idle list lock"));
        for conn in idle {
            let _ = conn.raw.close().await;
        }
    }

    /// Ends connection `id` on the server (its statement and its transaction), from a new
    /// connection, within [`KILL_TIMEOUT`]. Best effort: a server that does not answer has
    /// nothing running for us either, and an id already gone is not an error worth reporting.
    pub(crate) async fn kill(&self, id: u64) {
        let options = self.options.clone();
        let _ = tokio::time::timeout(KILL_TIMEOUT, async move {
            let mut killer = MySqlConnection::connect_with(&options).await?;
            // KILL takes no placeholder; the id is our own integer.
            let _ = killer
                .execute(format!("KILL CONNECTION {id}").as_str())
                .await;
            killer.close().await
        })
        .await;
    }
}

/// How a lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Possibly mid-statement or mid-transaction: closed and killed on the server.
    Busy,
    /// No transaction open: back to the idle list.
    Clean,
    /// The connection itself failed: closed; nothing can still run for it on the server
    /// that a kill could reach sooner than the server notices the closed socket.
    Broken,
}

/// A connection in use by one apply.
pub(crate) struct Lease<'p> {
    pool: &'p Pool,
    conn: Option<Conn>,
    state: State,
    _permit: OwnedSemaphorePermit,
}

impl Lease<'_> {
    pub(crate) fn get(&mut self) -> &mut MySqlConnection {
        &mut self
            .conn
            .as_mut()
            .expect("connection present until the lease ends")
            .raw
    }

    /// No transaction is open: the connection may serve another apply.
    pub(crate) fn clean(&mut self) {
        self.state = State::Clean;
    }

    /// The connection failed at the transport: do not reuse it, and do not try to kill it.
    pub(crate) fn broken(&mut self) {
        self.state = State::Broken;
    }

    /// Ends the lease of a connection that may still run something on the server: closes it
    /// and kills it there, waiting at most [`KILL_TIMEOUT`].
    pub(crate) async fn abandon(mut self) {
        if let Some(conn) = self.conn.take() {
            let id = conn.id;
            drop(conn);
            self.pool.kill(id).await;
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        match self.state {
            State::Clean => self.pool.idle.lock().expect("idle list lock").push(conn),
            State::Broken => drop(conn),
            State::Busy => {
                // Dropped mid-apply (its future was cancelled): close it here, and have the
                // server end whatever it still runs, on a task of its own.
                let id = conn.id;
                drop(conn);
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let options = self.pool.options.clone();
                    runtime.spawn(async move {
                        let killer = Pool::new(options, 1);
                        killer.kill(id).await;
                    });
                }
            }
        }
    }
}
