//! Why no server could be had, or an administration step failed: the one error of the crate.

/// Why no server could be had, or an administration step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `TESTDB_*` variable, or a request the chosen backend cannot serve.
    #[error("{0}")]
    Config(String),
    /// Neither `mariadbd` nor `mysqld` (or the datadir installer) is installed.
    #[error("{0}")]
    NoServerProgram(String),
    /// A file, directory, port or process operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A statement or a connection to the server failed.
    #[error("{what}: {source}")]
    Sql {
        what: String,
        #[source]
        source: sqlx::Error,
    },
    /// The server exited at start-up because its port was taken meanwhile: try another.
    #[error("port {port} on 127.0.0.1 was taken before the server could bind it")]
    PortInUse { port: u16 },
    /// The server (or its datadir installer) failed or did not become ready; the end of its log.
    #[error("{what}; log {}:\n{tail}", log.display())]
    Server {
        what: String,
        log: std::path::PathBuf,
        tail: String,
    },
    /// The container backend failed.
    #[error("{0}")]
    Container(String),
    /// The process-wide shared server failed to start earlier; why, as it was reported then.
    #[error("the shared test server did not start: {0}")]
    Shared(String),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    pub(crate) fn sql(what: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Error {
        let what = what.into();
        move |source| Error::Sql { what, source }
    }
}
