//! The receiver database's address: a MySQL URL that names its database, checked before
//! anything connects, and never printed with its password.

use std::fmt;

use secret::Secret;

/// A MySQL connection URL that names its database. Its password is never printed: the URL is
/// a [`Secret`], and `Display` shows `mysql://user@host:port/database`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dsn {
    url: Secret,
    user: String,
    host: String,
    database: String,
    query: String,
    /// Where the DSN came from, for error lines to name ("the DSN" unless [`Dsn::named`]).
    origin: &'static str,
}

/// Why a DSN was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DsnError {
    #[error("must start with mysql:// (or mariadb://)")]
    Scheme,
    #[error("has no host")]
    NoHost,
    #[error("names no database: use mysql://user:password@host:port/<database>")]
    NoDatabase,
    #[error("has a malformed database name")]
    BadDatabase,
    #[error("points at {0}, which is not loopback, without TLS: add ?ssl-mode=VERIFY_IDENTITY (or REQUIRED)")]
    NoTls(String),
    #[error("has a port that is not a number from 1 to 65535")]
    BadPort,
    #[error(
        "has the parameter `{0}`, which the receiver does not know (it knows {KNOWN_PARAMETERS})"
    )]
    UnknownParameter(String),
    #[error(
        "sets the session time zone (`{0}`), which the receiver sets to UTC itself: remove it"
    )]
    TimeZone(String),
    #[error("has ssl-mode set to something other than disabled, preferred, required, verify_ca or verify_identity")]
    BadSslMode,
    #[error("has {parameter}={path}, which cannot be read: {problem}")]
    TlsFile {
        parameter: &'static str,
        path: String,
        problem: String,
    },
    #[error("has {0} without {1}: a client certificate needs both ssl-cert and ssl-key")]
    HalfClientCertificate(&'static str, &'static str),
}

/// The URL parameters a DSN may carry (the driver's own names; `sslmode` and the like are
/// accepted spellings of the same).
pub const KNOWN_PARAMETERS: &str =
    "ssl-mode, ssl-ca, ssl-cert, ssl-key, charset, collation, statement-cache-capacity, socket";

impl Dsn {
    /// Parses `url`. The database must be named explicitly: the receiver's tables belong in
    /// its own dedicated database, never in whatever a server picks by default.
    pub fn parse(url: &str) -> Result<Self, DsnError> {
        let rest = url
            .strip_prefix("mysql://")
            .or_else(|| url.strip_prefix("mariadb://"))
            .ok_or(DsnError::Scheme)?;
        let (authority, after) = endpoint::split_authority(rest);
        let parsed = endpoint::Authority::parse(authority).map_err(|e| match e {
            endpoint::AuthorityError::NoHost => DsnError::NoHost,
            endpoint::AuthorityError::BadPort => DsnError::BadPort,
        })?;
        let user = parsed.user().unwrap_or("").to_owned();
        let host = parsed.host_and_port();
        let path = after
            .strip_prefix('/')
            .map(|p| &p[..p.find(['?', '#']).unwrap_or(p.len())])
            .unwrap_or("");
        if path.is_empty() {
            return Err(DsnError::NoDatabase);
        }
        if path.contains('/') || path.chars().any(char::is_control) {
            return Err(DsnError::BadDatabase);
        }
        let query = after
            .split_once('?')
            .map(|(_, q)| q)
            .unwrap_or("")
            .to_owned();
        check_parameters(&query)?;
        let host_name = parsed.host().trim_start_matches('[').trim_end_matches(']');
        // The driver's default port, so that an error line names where it really went.
        let host = match parsed.port() {
            Some(_) => host.to_owned(),
            None => format!("{host}:3306"),
        };
        let dsn = Dsn {
            url: Secret::new(url),
            user,
            host,
            database: path.to_owned(),
            query,
            origin: "the DSN",
        };
        if !parsed.is_loopback() && !dsn.requires_tls() {
            return Err(DsnError::NoTls(host_name.to_owned()));
        }
        dsn.check_tls_files()?;
        Ok(dsn)
    }

    /// The files `ssl-ca`, `ssl-cert` and `ssl-key` name must be readable now: the driver
    /// reads them at each connection, where a missing file would look like an unavailable
    /// database. Only that they open is checked here; their content is the handshake's.
    fn check_tls_files(&self) -> Result<(), DsnError> {
        for parameter in ["ssl-ca", "ssl-cert", "ssl-key"] {
            let Some(raw) = self.parameter(parameter) else {
                continue;
            };
            let shown = |p: &str| -> String {
                p.chars()
                    .take(200)
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect()
            };
            let Some(path) = endpoint::decode_component(raw) else {
                return Err(DsnError::TlsFile {
                    parameter,
                    path: shown(raw),
                    problem: "the path is not UTF-8".into(),
                });
            };
            let problem = match std::fs::File::open(&path) {
                Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => continue,
                Ok(_) => "it is not a file".to_owned(),
                Err(e) => e.to_string(),
            };
            return Err(DsnError::TlsFile {
                parameter,
                path: shown(&path),
                problem,
            });
        }
        match (
            self.parameter("ssl-cert").is_some(),
            self.parameter("ssl-key").is_some(),
        ) {
            (true, false) => Err(DsnError::HalfClientCertificate("ssl-cert", "ssl-key")),
            (false, true) => Err(DsnError::HalfClientCertificate("ssl-key", "ssl-cert")),
            _ => Ok(()),
        }
    }

    /// Whether the URL asks for a verified or required TLS connection.
    pub(crate) fn requires_tls(&self) -> bool {
        self.query.split('&').any(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            k.eq_ignore_ascii_case("ssl-mode")
                && matches!(
                    v.to_ascii_uppercase().as_str(),
                    "REQUIRED" | "VERIFY_CA" | "VERIFY_IDENTITY"
                )
        })
    }

    /// Whether the URL turns TLS off (`ssl-mode=DISABLED`).
    pub fn tls_disabled(&self) -> bool {
        self.parameter("ssl-mode")
            .is_some_and(|v| v.eq_ignore_ascii_case("disabled"))
    }

    /// Whether the URL names a client certificate (`ssl-cert`).
    pub fn has_client_certificate(&self) -> bool {
        self.parameter("ssl-cert").is_some()
    }

    /// The value of parameter `name` (or its spelling without the dash), as written.
    fn parameter(&self, name: &str) -> Option<&str> {
        let short = name.replace('-', "");
        self.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == name || k == short).then_some(v)
        })
    }

    /// This DSN, read from the variable `name`: what an error line tells the user to check.
    pub fn named(mut self, name: &'static str) -> Dsn {
        self.origin = name;
        self
    }

    /// Where the DSN came from: the variable's name, or "the DSN".
    pub fn origin(&self) -> &'static str {
        self.origin
    }

    /// `host:port` (the port the driver uses when the URL gives none).
    pub fn address(&self) -> &str {
        &self.host
    }

    /// The account's user name (not a secret; its password is).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The database the DSN names.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The full URL, password included: for the driver only, never for output.
    pub fn expose_url(&self) -> &str {
        self.url.expose()
    }
}

/// Every parameter must be one the driver knows, spelled as it spells it (it ignores the
/// rest silently), and `ssl-mode` must have a value it knows (compared without case, as it
/// does). The session time zone is the store's to set.
fn check_parameters(query: &str) -> Result<(), DsnError> {
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "ssl-mode" | "sslmode" => {
                let known = [
                    "disabled",
                    "preferred",
                    "required",
                    "verify_ca",
                    "verify_identity",
                ];
                if !known.iter().any(|k| k.eq_ignore_ascii_case(value)) {
                    return Err(DsnError::BadSslMode);
                }
            }
            "ssl-ca"
            | "sslca"
            | "ssl-cert"
            | "sslcert"
            | "ssl-key"
            | "sslkey"
            | "charset"
            | "collation"
            | "statement-cache-capacity"
            | "socket" => {}
            "timezone" | "time-zone" => return Err(DsnError::TimeZone(key.to_owned())),
            other => {
                // The name only (never the value), and only its printable ASCII.
                let shown: String = other
                    .chars()
                    .take(40)
                    .map(|c| if c.is_ascii_graphic() { c } else { '?' })
                    .collect();
                return Err(DsnError::UnknownParameter(shown));
            }
        }
    }
    Ok(())
}

impl fmt::Display for Dsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.user.is_empty() {
            write!(f, "mysql://{}/{}", self.host, self.database)
        } else {
            write!(f, "mysql://{}@{}/{}", self.user, self.host, self.database)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsn_needs_a_database() {
        for url in [
            "mysql://u:p@127.0.0.1:3306",
            "mysql://u:p@127.0.0.1:3306/",
            "mysql://u:p@127.0.0.1:3306/?ssl-mode=disabled",
        ] {
            assert_eq!(Dsn::parse(url), Err(DsnError::NoDatabase), "{url}");
        }
        assert_eq!(Dsn::parse("postgres://x/y"), Err(DsnError::Scheme));
        assert_eq!(
            Dsn::parse("mysql://u:p@db.internal:3306/r"),
            Err(DsnError::NoTls("db.internal".into()))
        );
        assert!(Dsn::parse("mysql://u:p@db.internal:3306/r?ssl-mode=VERIFY_IDENTITY").is_ok());
        assert!(Dsn::parse("mysql://u:p@db.internal:3306/r?ssl-mode=disabled").is_err());
        assert!(Dsn::parse("mysql://u:p@[::1]:3306/r").is_ok());
        assert!(Dsn::parse("mysql://u:p@localhost/r").is_ok());
        assert_eq!(Dsn::parse("mysql:///db"), Err(DsnError::NoHost));
        assert_eq!(
            Dsn::parse("mysql://h/a/b"),
            Err(DsnError::BadDatabase),
            "a path with two segments"
        );
        let dsn =
            Dsn::parse("mysql://u:s3cret@127.0.0.1:3306/orbit_receiver?charset=utf8mb4").unwrap();
        assert_eq!(dsn.database(), "orbit_receiver");
    }

    #[test]
    fn ports_parameters_and_ssl_modes_are_checked_without_connecting() {
        for url in [
            "mysql://u:p@127.0.0.1:99999/r",
            "mysql://u:p@127.0.0.1:0/r",
            "mysql://u:p@127.0.0.1:x/r",
            "mysql://u:p@[::1]:70000/r",
        ] {
            assert_eq!(Dsn::parse(url), Err(DsnError::BadPort), "{url}");
        }
        assert_eq!(
            Dsn::parse("mysql://u:p@127.0.0.1:3306/r?sslmode=required&pool=9"),
            Err(DsnError::UnknownParameter("pool".into()))
        );
        assert_eq!(
            Dsn::parse("mysql://u:p@127.0.0.1:3306/r?timezone=%2B08:00"),
            Err(DsnError::TimeZone("timezone".into()))
        );
        assert_eq!(
            Dsn::parse("mysql://u:p@127.0.0.1:3306/r?ssl-mode=strict"),
            Err(DsnError::BadSslMode)
        );
        assert!(
            Dsn::parse("mysql://u:p@127.0.0.1/r").is_ok(),
            "no port is the default port"
        );
    }

    #[test]
    fn tls_files_must_open_and_a_client_certificate_needs_its_key() {
        let dir = std::env::temp_dir().join(format!("dsn-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, "pem").unwrap();
        let base = "mysql://u:p@db.internal:3306/r?ssl-mode=VERIFY_IDENTITY";
        assert!(Dsn::parse(&format!("{base}&ssl-ca={}", ca.display())).is_ok());
        match Dsn::parse(&format!("{base}&ssl-ca={}/missing.pem", dir.display())) {
            Err(DsnError::TlsFile {
                parameter, path, ..
            }) => {
                assert_eq!(parameter, "ssl-ca");
                assert!(path.ends_with("/missing.pem"), "{path}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Dsn::parse(&format!("{base}&ssl-ca={}", dir.display())),
            Err(DsnError::TlsFile { .. })
        ));
        assert_eq!(
            Dsn::parse(&format!("{base}&ssl-cert={}", ca.display())),
            Err(DsnError::HalfClientCertificate("ssl-cert", "ssl-key"))
        );
        let both = Dsn::parse(&format!(
            "{base}&ssl-cert={}&ssl-key={}",
            ca.display(),
            ca.display()
        ))
        .unwrap();
        assert!(both.has_client_certificate());
        assert!(!both.tls_disabled());
        assert!(Dsn::parse("mysql://u:p@127.0.0.1/r?ssl-mode=disabled")
            .unwrap()
            .tls_disabled());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dsn_never_shows_its_password() {
        let dsn = Dsn::parse("mysql://u:s3cret@db.internal:3306/orbit_receiver?ssl-mode=REQUIRED")
            .unwrap();
        assert_eq!(dsn.to_string(), "mysql://u@db.internal:3306/orbit_receiver");
        assert!(!format!("{dsn:?}").contains("s3cret"));
        // A password holding '@' still splits at the last one.
        let dsn = Dsn::parse("mysql://u:p@ss@127.0.0.1:1/d").unwrap();
        assert_eq!(dsn.to_string(), "mysql://u@127.0.0.1:1/d");
    }
}
