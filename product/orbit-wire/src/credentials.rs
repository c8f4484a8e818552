//! Credentials: the JSON file `orbit-dev bootstrap` writes (mode 0600), with `ORBIT_TOKEN` and
//! `ORBIT_QUEUE_ID` overriding its values. The token is a [`Token`], which never prints.

use std::path::{Path, PathBuf};

use secret::Secret;
use serde::{Deserialize, Serialize};

/// The file named by this variable holds the credentials.
pub const ORBIT_CREDENTIALS_FILE: &str = "ORBIT_CREDENTIALS_FILE";
/// Overrides the file's token.
pub const ORBIT_TOKEN: &str = "ORBIT_TOKEN";
/// Overrides the file's queue.
pub const ORBIT_QUEUE_ID: &str = "ORBIT_QUEUE_ID";

/// A bearer token: a [`Secret`], so it prints as `***`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Token(Secret);

impl Token {
    /// Wraps a token.
    pub fn new(s: impl Into<String>) -> Self {
        Token(Secret::new(s))
    }
    /// The token text, for the Authorization header only.
    pub fn expose(&self) -> &str {
        self.0.expose()
    }
}

/// The credentials file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub token: Token,
    pub application: String,
    pub namespace: String,
    pub environment: String,
    pub queue_id: String,
    pub scopes: Vec<String>,
}

/// Why credentials could not be had. Never contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialsError {
    #[error("{ORBIT_CREDENTIALS_FILE} is not set and {ORBIT_TOKEN}/{ORBIT_QUEUE_ID} do not both stand in for it")]
    Missing,
    #[error("cannot read credentials file {0}: {1}")]
    Read(PathBuf, String),
    #[error("credentials file {path} is readable by group or others (mode {mode:03o}): run chmod 600 {path}")]
    Permissions { path: PathBuf, mode: u32 },
    #[error("credentials file {0} is not valid credentials JSON: {1}")]
    Malformed(PathBuf, String),
    #[error("{0} is set but empty")]
    Empty(&'static str),
}

/// serde_json's message, with every quoted value replaced by `"…"`: its invalid-type and
/// invalid-value errors quote the string they met (`invalid type: string "orb_…", expected a
/// sequence`), which may be the token put in the wrong field. Field names (in backticks),
/// the line and the column stay.
fn without_values(e: &serde_json::Error) -> String {
    e.to_string()
        .split('"')
        .enumerate()
        .map(|(i, part)| if i % 2 == 1 { "\"…\"" } else { part })
        .collect()
}

/// The largest credentials file read (the bootstrap's is about 200 bytes).
pub const MAX_CREDENTIALS_BYTES: u64 = 64 * 1024;

impl Credentials {
    /// Reads `path`, refusing a file that group or others may read, one that is not a regular
    /// file, and one over [`MAX_CREDENTIALS_BYTES`].
    pub fn load(path: &Path) -> Result<Credentials, CredentialsError> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path)
            .map_err(|e| CredentialsError::Read(path.to_owned(), e.to_string()))?;
        // A regular file of sane size only: a FIFO would hang the start, a huge file fill
        // memory, for a file that holds a token and a queue id.
        if !meta.is_file() {
            return Err(CredentialsError::Read(
                path.to_owned(),
                "not a regular file".into(),
            ));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(CredentialsError::Permissions {
                path: path.to_owned(),
                mode,
            });
        }
        let mut text = Vec::new();
        use std::io::Read;
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_CREDENTIALS_BYTES + 1).read_to_end(&mut text))
            .map_err(|e| CredentialsError::Read(path.to_owned(), e.to_string()))?;
        if text.len() as u64 > MAX_CREDENTIALS_BYTES {
            return Err(CredentialsError::Read(
                path.to_owned(),
                format!("larger than {MAX_CREDENTIALS_BYTES} bytes, which no credentials file is"),
            ));
        }
        serde_json::from_slice(&text)
            .map_err(|e| CredentialsError::Malformed(path.to_owned(), without_values(&e)))
    }

    /// The credentials from a file and/or overrides: `token` and `queue` replace the file's
    /// values; with no file, both must be given.
    pub fn resolve(
        file: Option<&Path>,
        token: Option<String>,
        queue: Option<String>,
    ) -> Result<Credentials, CredentialsError> {
        if token.as_deref() == Some("") {
            return Err(CredentialsError::Empty(ORBIT_TOKEN));
        }
        if queue.as_deref() == Some("") {
            return Err(CredentialsError::Empty(ORBIT_QUEUE_ID));
        }
        let mut creds = match (file, &token, &queue) {
            (Some(path), _, _) => Credentials::load(path)?,
            (None, Some(token), Some(queue)) => Credentials {
                token: Token::new(token.clone()),
                application: String::new(),
                namespace: String::new(),
                environment: String::new(),
                queue_id: queue.clone(),
                scopes: Vec::new(),
            },
            _ => return Err(CredentialsError::Missing),
        };
        if let Some(t) = token {
            creds.token = Token::new(t);
        }
        if let Some(q) = queue {
            creds.queue_id = q;
        }
        Ok(creds)
    }

    /// Writes the file with mode 0600 into an existing directory; an existing file is an
    /// `AlreadyExists` error unless `replace`.
    pub fn write(&self, path: &Path, replace: bool) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        // No directory is created, and an existing file is kept unless `replace`.
        let mut options = std::fs::OpenOptions::new();
        options.write(true).mode(0o600);
        if replace {
            options.create(true).truncate(true);
        } else {
            options.create_new(true);
        }
        let mut file = options.open(path)?;
        // An existing file keeps its old mode through open(): set it.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        let mut text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        text.push(b'\n');
        file.write_all(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Credentials {
        Credentials {
            token: Token::new("orb_secret_123"),
            application: "inbox-example".into(),
            namespace: "default".into(),
            environment: "development".into(),
            queue_id: "inbox-demo".into(),
            scopes: vec!["events:read".into()],
        }
    }

    #[test]
    fn the_token_never_prints() {
        let c = sample();
        assert!(!format!("{c:?}").contains("orb_secret_123"));
        assert_eq!(format!("{:?}", c.token), "Token(***)");
    }

    #[test]
    fn no_malformed_file_error_shows_a_value() {
        let dir = std::env::temp_dir().join(format!("orbit-sdk-values-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.json");
        // The token where a list belongs, and as a number: serde_json itself quotes the first.
        for text in [
            r#"{"token":"t","application":"a","namespace":"n","environment":"e","queue_id":"q","scopes":"orb_secret_in_the_wrong_field"}"#,
            r#"{"token":["orb_secret_in_a_list"]}"#,
            r#"{"token":"orb_secret_ok","application":1}"#,
        ] {
            std::fs::write(&path, text).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            let raw = serde_json::from_str::<Credentials>(text)
                .unwrap_err()
                .to_string();
            let e = Credentials::load(&path).unwrap_err().to_string();
            assert!(!e.contains("orb_secret"), "{e}");
            assert!(e.contains("not valid credentials JSON"), "{e}");
            if text.contains("wrong_field") {
                assert!(raw.contains("orb_secret"), "serde_json quotes it: {raw}");
                assert!(e.contains("expected a sequence"), "{e}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn written_0600_and_refused_when_others_can_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("orbit-sdk-creds-{}", std::process::id()));
        let path = dir.join("sub/inbox.credentials.json");
        // No directory is created for the file, and an existing file is kept.
        let missing = sample().write(&path, false).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        sample().write(&path, false).unwrap();
        let exists = sample().write(&path, false).unwrap_err();
        assert_eq!(exists.kind(), std::io::ErrorKind::AlreadyExists);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Credentials::load(&path).unwrap(), sample());

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Credentials::load(&path).unwrap_err();
        assert!(
            e.to_string()
                .contains("readable by group or others (mode 644)"),
            "{e}"
        );

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let over = Credentials::resolve(Some(&path), Some("t2".into()), Some("q2".into())).unwrap();
        assert_eq!((over.token.expose(), over.queue_id.as_str()), ("t2", "q2"));
        assert_eq!(
            Credentials::resolve(None, Some("t".into()), None),
            Err(CredentialsError::Missing)
        );
        std::fs::write(&path, b"{\"token\": 5}").unwrap();
        let e = Credentials::load(&path).unwrap_err().to_string();
        assert!(e.contains("not valid credentials JSON"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
