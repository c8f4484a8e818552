//! Configuration: every variable the receiver reads, its default, and its parsing.
//!
//! Values come from a [`Source`]: the process environment in the binary, a map in tests (the
//! process environment is never mutated). Each command parses all of its variables in one pass
//! and reports every bad one, each on one line naming the variable and never echoing a secret.
//! Nothing outside this module reads the environment (clippy's `disallowed-methods` enforces it).

use std::collections::HashMap;
use std::fmt;

use crate::identity::{ConsumerName, IdentityError};

/// The receiver database, e.g. `mysql://receiver_runtime:…@127.0.0.1:3306/orbit_receiver`.
pub const ORBIT_RECEIVER_DSN: &str = "ORBIT_RECEIVER_DSN";
/// The receiver's fixed purpose; see [`ConsumerName`].
pub const RECEIVER_NAME: &str = "RECEIVER_NAME";

/// Where configuration values come from.
pub trait Source {
    /// The value of `name`, if set.
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment. A value that is not valid UTF-8 is passed on with replacement
/// characters, so that validation reports it instead of it silently counting as unset.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Source for ProcessEnv {
    #[allow(clippy::disallowed_methods)] // the one place that reads the environment
    fn get(&self, name: &str) -> Option<String> {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    }
}

impl Source for HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).cloned()
    }
}

impl Source for HashMap<&str, &str> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).map(|v| (*v).to_owned())
    }
}

/// One bad variable: its name and what is wrong, never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub variable: &'static str,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.variable, self.problem)
    }
}

/// Every bad variable of one command, in the order they were read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// A MySQL connection URL that names its database. Its password is never printed: `Display`
/// and `Debug` show `mysql://user@host:port/database`.
#[derive(Clone, PartialEq, Eq)]
pub struct Dsn {
    url: String,
    user: String,
    host: String,
    database: String,
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
}

impl Dsn {
    /// Parses `url`. The database must be named explicitly: the receiver's tables belong in
    /// its own dedicated database, never in whatever a server picks by default.
    pub fn parse(url: &str) -> Result<Self, DsnError> {
        let rest = url
            .strip_prefix("mysql://")
            .or_else(|| url.strip_prefix("mariadb://"))
            .ok_or(DsnError::Scheme)?;
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        let (userinfo, host) = match authority.rfind('@') {
            Some(at) => (&authority[..at], &authority[at + 1..]),
            None => ("", authority),
        };
        if host.is_empty() {
            return Err(DsnError::NoHost);
        }
        let user = userinfo.split(':').next().unwrap_or("").to_owned();
        let after = &rest[authority_end..];
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
        Ok(Dsn {
            url: url.to_owned(),
            user,
            host: host.to_owned(),
            database: path.to_owned(),
        })
    }

    /// The database the DSN names.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The full URL, password included: for the driver only, never for output.
    pub fn expose_url(&self) -> &str {
        &self.url
    }
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

impl fmt::Debug for Dsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dsn({self})")
    }
}

/// Reads `ORBIT_RECEIVER_DSN`, collecting a problem into `errors`.
pub fn receiver_dsn(source: &dyn Source, errors: &mut Vec<ConfigError>) -> Option<Dsn> {
    match source.get(ORBIT_RECEIVER_DSN) {
        None => {
            errors.push(ConfigError {
                variable: ORBIT_RECEIVER_DSN,
                problem: "is not set: give the receiver database as mysql://user:password@host:port/<database>".into(),
            });
            None
        }
        Some(v) => match Dsn::parse(v.trim()) {
            Ok(dsn) => Some(dsn),
            Err(e) => {
                errors.push(ConfigError {
                    variable: ORBIT_RECEIVER_DSN,
                    problem: e.to_string(),
                });
                None
            }
        },
    }
}

/// Reads `RECEIVER_NAME` (default `task-result-view`), collecting a problem into `errors`.
pub fn receiver_name(source: &dyn Source, errors: &mut Vec<ConfigError>) -> Option<ConsumerName> {
    match source.get(RECEIVER_NAME) {
        None => Some(ConsumerName::default()),
        Some(v) => match ConsumerName::new(v) {
            Ok(name) => Some(name),
            Err(e) => {
                let problem = match e {
                    IdentityError::Empty => "is empty: unset it to use task-result-view".into(),
                    other => other.to_string(),
                };
                errors.push(ConfigError {
                    variable: RECEIVER_NAME,
                    problem,
                });
                None
            }
        },
    }
}

/// What `receiver init` needs.
#[derive(Debug, Clone)]
pub struct InitConfig {
    pub dsn: Dsn,
}

impl InitConfig {
    /// Parses every variable `init` reads.
    pub fn from_source(source: &dyn Source) -> Result<Self, ConfigErrors> {
        let mut errors = Vec::new();
        let dsn = receiver_dsn(source, &mut errors);
        match dsn {
            Some(dsn) if errors.is_empty() => Ok(InitConfig { dsn }),
            _ => Err(ConfigErrors(errors)),
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
        assert_eq!(Dsn::parse("mysql:///db"), Err(DsnError::NoHost));
        assert_eq!(
            Dsn::parse("mysql://h/a/b"),
            Err(DsnError::BadDatabase),
            "a path with two segments"
        );
        let dsn = Dsn::parse("mysql://u:s3cret@127.0.0.1:3306/orbit_receiver?x=1").unwrap();
        assert_eq!(dsn.database(), "orbit_receiver");
    }

    #[test]
    fn dsn_never_shows_its_password() {
        let dsn = Dsn::parse("mysql://u:s3cret@db.internal:3306/orbit_receiver").unwrap();
        assert_eq!(dsn.to_string(), "mysql://u@db.internal:3306/orbit_receiver");
        assert!(!format!("{dsn:?}").contains("s3cret"));
        // A password holding '@' still splits at the last one.
        let dsn = Dsn::parse("mysql://u:p@ss@h:1/d").unwrap();
        assert_eq!(dsn.to_string(), "mysql://u@h:1/d");
    }

    #[test]
    fn all_problems_in_one_pass_and_no_value_echoed() {
        let env: HashMap<&str, &str> = HashMap::new();
        let e = InitConfig::from_source(&env).unwrap_err();
        assert_eq!(e.0.len(), 1);
        assert!(e.to_string().starts_with("ORBIT_RECEIVER_DSN is not set"));

        let env: HashMap<&str, &str> = [(ORBIT_RECEIVER_DSN, "mysql://u:s3cret@h:1")]
            .into_iter()
            .collect();
        let e = InitConfig::from_source(&env).unwrap_err().to_string();
        assert!(e.contains("ORBIT_RECEIVER_DSN names no database"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");

        let env: HashMap<&str, &str> = [(RECEIVER_NAME, "-bad")].into_iter().collect();
        let mut errors = Vec::new();
        assert_eq!(receiver_name(&env, &mut errors), None);
        assert_eq!(errors[0].variable, RECEIVER_NAME);
        let env: HashMap<&str, &str> = HashMap::new();
        assert_eq!(
            receiver_name(&env, &mut errors).unwrap().as_str(),
            "task-result-view"
        );
    }
}
