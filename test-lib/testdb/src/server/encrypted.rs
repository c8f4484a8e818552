//! A server that encrypts what it writes, its backups, and a backup restored onto a new server.

use std::fs;
use std::path::Path;

use crate::at_rest::{
    scratch_path, server_options, wait_encrypted, write_key_file, Backup, ENCRYPTED_NOTE,
};
use crate::error::Error;
use crate::local::{Datadir, LocalServer};
use crate::provision;
use crate::server::{Backend, Server};

impl Server {
    fn local_backend(&self, what: &str) -> Result<&LocalServer, Error> {
        match &self.backend {
            Backend::Local(server) => Ok(server),
            _ => Err(Error::Config(format!("{what} needs a local server"))),
        }
    }

    /// A local server that encrypts at rest ([`server_options`]) with a key file made for it
    /// (in this process's scratch directory); returns once every tablespace is encrypted.
    pub fn local_encrypted() -> Result<Server, Error> {
        let keys = scratch_path("keys")?;
        write_key_file(&keys)?;
        let server =
            LocalServer::start_on(None, server_options(&keys), Datadir::Fresh, ENCRYPTED_NOTE)?;
        let server = Self::loopback_root(
            server.port(),
            server.description().to_owned(),
            Backend::Local(server),
        );
        provision::block_on(wait_encrypted(server.admin_url()))?;
        Ok(server)
    }

    /// A local server's own directory: its datadir (`data/`) and temporary directory
    /// (`tmp/`), its socket and its logs.
    pub fn directory(&self) -> Option<&Path> {
        self.local_backend("a directory").ok().map(LocalServer::dir)
    }

    /// Takes a hot backup of this local server with MariaDB's own tool while it keeps
    /// working (`mariadb-backup --backup`, over its unix socket), and prepares it.
    pub fn backup(&self) -> Result<Backup, Error> {
        let server = self.local_backend("a backup")?;
        let dir = scratch_path("backup")?;
        match server.backup(&dir) {
            Ok((taken_in, prepared_in)) => Ok(Backup {
                dir,
                options: server.options().to_vec(),
                taken_in,
                prepared_in,
            }),
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// A new local server, on a port of its own, whose datadir is a copy of `backup`
    /// (`mariadb-backup --copy-back`), started with the options of the server the backup came
    /// from: its databases, tables and accounts as they were at the backup's point.
    pub fn restore(backup: &Backup) -> Result<Server, Error> {
        let server = LocalServer::start_on(
            None,
            backup.options.clone(),
            Datadir::Restored(&backup.dir),
            ", restored from a backup",
        )?;
        Ok(Self::loopback_root(
            server.port(),
            server.description().to_owned(),
            Backend::Local(server),
        ))
    }

    /// Shuts a local server down cleanly and slowly (`innodb_fast_shutdown = 0`: every page
    /// flushed, the undo log purged), so that everything it holds is in its data files; waits
    /// until the process has exited.
    pub fn shut_down(&self) -> Result<(), Error> {
        self.local_backend("a shutdown")?
            .shut_down(&self.admin_url())
    }
}
