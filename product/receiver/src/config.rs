//! Configuration: every variable the receiver reads, its default, and its parsing.
//!
//! Values come from a [`Source`]: the process environment in the binary, a map in tests (the
//! process environment is never mutated). Each command parses all of its variables in one pass
//! and reports every bad one, each on one line naming the variable and never echoing a secret.
//! Nothing outside this module reads the environment (clippy's `disallowed-methods` enforces it).

use std::collections::HashMap;
use std::fmt;

use result_inbox::identity::{ConsumerName, IdentityError};
pub use result_inbox::{Dsn, DsnError};

/// The receiver database, e.g. `mysql://receiver_runtime:…@127.0.0.1:3306/orbit_receiver`.
pub const ORBIT_RECEIVER_DSN: &str = "ORBIT_RECEIVER_DSN";
/// The receiver's fixed purpose; see [`ConsumerName`].
pub const RECEIVER_NAME: &str = "RECEIVER_NAME";
/// The platform, e.g. `http://127.0.0.1:8080` (plain HTTP to loopback only).
pub const ORBIT_URL: &str = "ORBIT_URL";
/// A PEM bundle of CAs to trust for an `https` platform, beside the system's own (for a
/// platform behind a private CA).
pub const ORBIT_CA_FILE: &str = "ORBIT_CA_FILE";
/// The credentials file `orbit-dev bootstrap` wrote.
pub const ORBIT_CREDENTIALS_FILE: &str = orbit_sdk::credentials::ORBIT_CREDENTIALS_FILE;
/// Overrides the credentials file's token.
pub const ORBIT_TOKEN: &str = orbit_sdk::credentials::ORBIT_TOKEN;
/// Overrides the credentials file's queue.
pub const ORBIT_QUEUE_ID: &str = orbit_sdk::credentials::ORBIT_QUEUE_ID;
/// The subscription `consume` reads (32 characters).
pub const ORBIT_SUBSCRIPTION_ID: &str = "ORBIT_SUBSCRIPTION_ID";
/// `text` (default) or `json` log lines.
pub const RECEIVER_LOG_FORMAT: &str = "RECEIVER_LOG_FORMAT";
/// Where `consume` serves `/metrics`, `/healthz` and `/readyz`, e.g. `127.0.0.1:9464`; unset,
/// nothing listens.
pub const RECEIVER_METRICS_LISTEN: &str = "RECEIVER_METRICS_LISTEN";

/// The time budget of one apply in `consume`, e.g. `5s` or `2500ms` (default 5 s); it must
/// leave the subscription's lease at least a second for the ACK.
pub const RECEIVER_APPLY_TIMEOUT: &str = "RECEIVER_APPLY_TIMEOUT";
/// The shortest and longest apply budget [`RECEIVER_APPLY_TIMEOUT`] may set.
pub const APPLY_TIMEOUT_RANGE: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_millis(100),
    std::time::Duration::from_secs(600),
);

/// `1` makes `consume` require that a replica holds every commit before it is ACKed: the
/// primary must run lossless semi-synchronous replication (wait point `AFTER_SYNC`), and while
/// it reports no replica acknowledging, deliveries are held and nothing committed meanwhile
/// is ACKed. `0` or unset: off.
pub const RECEIVER_REQUIRE_REPLICA_ACK: &str = "RECEIVER_REQUIRE_REPLICA_ACK";

/// How many deliveries `consume` applies at once (default [`DEFAULT_CONCURRENCY`], the
/// source's 4), within [`CONCURRENCY_RANGE`].
pub const RECEIVER_CONCURRENCY: &str = "RECEIVER_CONCURRENCY";
/// `consume`'s concurrency when [`RECEIVER_CONCURRENCY`] is unset.
pub const DEFAULT_CONCURRENCY: usize = 4;
/// The fewest and most deliveries [`RECEIVER_CONCURRENCY`] may ask for.
pub const CONCURRENCY_RANGE: (usize, usize) = (1, 256);
/// The most deliveries `consume` applies in one transaction (default [`DEFAULT_GROUP_MAX`]),
/// within [`GROUP_MAX_RANGE`]; `1` applies each in a transaction of its own.
pub const RECEIVER_GROUP_MAX: &str = "RECEIVER_GROUP_MAX";
/// `consume`'s group size limit when [`RECEIVER_GROUP_MAX`] is unset (docs/benchmarks.md
/// says how it was chosen).
pub const DEFAULT_GROUP_MAX: usize = 16;
/// The fewest and most deliveries [`RECEIVER_GROUP_MAX`] may ask for (the core's
/// [`result_inbox::GROUP_MAX_EVENTS`] at most).
pub const GROUP_MAX_RANGE: (usize, usize) = (1, result_inbox::GROUP_MAX_EVENTS);

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

/// Every variable any command reads, for the check that none holds bytes that are not UTF-8.
pub const ALL_VARIABLES: &[&str] = &[
    ORBIT_RECEIVER_DSN,
    RECEIVER_NAME,
    ORBIT_URL,
    ORBIT_CA_FILE,
    ORBIT_CREDENTIALS_FILE,
    ORBIT_TOKEN,
    ORBIT_QUEUE_ID,
    ORBIT_SUBSCRIPTION_ID,
    RECEIVER_LOG_FORMAT,
    RECEIVER_METRICS_LISTEN,
    RECEIVER_APPLY_TIMEOUT,
    RECEIVER_CONCURRENCY,
    RECEIVER_GROUP_MAX,
    RECEIVER_REQUIRE_REPLICA_ACK,
];

/// The variables whose values are not UTF-8 (which [`ProcessEnv`] passes on with U+FFFD in
/// place of the bad bytes): each is one error, and nothing else is parsed, since a value read
/// lossily is not the value the user set.
fn not_utf8(source: &dyn Source) -> Result<(), ConfigErrors> {
    let bad: Vec<ConfigError> = ALL_VARIABLES
        .iter()
        .filter(|name| source.get(name).is_some_and(|v| v.contains('\u{FFFD}')))
        .map(|name| ConfigError {
            variable: name,
            problem: "is not valid UTF-8".into(),
        })
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(bad))
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
            Ok(dsn) => Some(dsn.named(ORBIT_RECEIVER_DSN)),
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

/// Reads `ORBIT_SUBSCRIPTION_ID`: 32 letters and digits. `missing` is the problem reported
/// when it is not set.
fn subscription_id(
    source: &dyn Source,
    errors: &mut Vec<ConfigError>,
    missing: &str,
) -> Option<orbit_sdk::SubscriptionId> {
    let problem = match source.get(ORBIT_SUBSCRIPTION_ID) {
        Some(s) if s.len() == 32 && s.bytes().all(|b| b.is_ascii_alphanumeric()) => {
            // 32 letters and digits always hold the id rule.
            return orbit_sdk::SubscriptionId::new(s).ok();
        }
        Some(_) => "must be a 32-character subscription id (letters and digits)",
        None => missing,
    };
    errors.push(ConfigError {
        variable: ORBIT_SUBSCRIPTION_ID,
        problem: problem.into(),
    });
    None
}

/// The platform side of `demo` and `consume`: where it is, and who we are there.
#[derive(Debug, Clone)]
pub struct PlatformConfig {
    pub url: String,
    pub credentials: orbit_sdk::Credentials,
    pub queue: result_inbox::QueueId,
    /// The CAs an `https` platform may be signed by (`None` for plain loopback HTTP).
    pub trust: Option<orbit_sdk::Trust>,
}

impl PlatformConfig {
    /// A client for the platform, trusting what the configuration says.
    pub fn client(&self) -> Result<orbit_sdk::Client, orbit_sdk::SdkError> {
        orbit_sdk::Client::with_trust(
            &self.url,
            self.credentials.token.clone(),
            self.trust.clone(),
        )
    }
}

/// Reads `ORBIT_CA_FILE` and the system's roots, for an `https` platform or whenever a CA file
/// is named (so that a bad one is reported at start, whatever the URL).
fn trust(
    source: &dyn Source,
    secure: bool,
    errors: &mut Vec<ConfigError>,
) -> Option<orbit_sdk::Trust> {
    let file = source.get(ORBIT_CA_FILE).filter(|f| !f.is_empty());
    if !secure && file.is_none() {
        return None;
    }
    match orbit_sdk::Trust::load(file.as_deref().map(std::path::Path::new)) {
        Ok(trust) => Some(trust),
        Err(e) => {
            let problem = match e {
                orbit_sdk::TrustError::CaFile { problem, .. } => {
                    format!("{}: {problem}", file.unwrap_or_default())
                }
                other => other.to_string(),
            };
            errors.push(ConfigError {
                variable: ORBIT_CA_FILE,
                problem,
            });
            None
        }
    }
}

fn orbit(source: &dyn Source, errors: &mut Vec<ConfigError>) -> Option<PlatformConfig> {
    use orbit_sdk::CredentialsError as E;
    let url = match source.get(ORBIT_URL) {
        None => {
            errors.push(ConfigError {
                variable: ORBIT_URL,
                problem: "is not set: give the platform, e.g. http://127.0.0.1:8080".into(),
            });
            None
        }
        Some(u) => match orbit_sdk::client::BaseUrl::parse(u.trim()) {
            Ok(_) => Some(u.trim().to_owned()),
            Err(e) => {
                let problem = e.to_string();
                let problem = problem
                    .strip_prefix("invalid ORBIT_URL: ")
                    .unwrap_or(&problem);
                errors.push(ConfigError {
                    variable: ORBIT_URL,
                    problem: problem.to_owned(),
                });
                None
            }
        },
    };
    let secure = url
        .as_deref()
        .is_some_and(|u| u.to_ascii_lowercase().starts_with("https://"));
    let trust = trust(source, secure, errors);
    let file = source.get(ORBIT_CREDENTIALS_FILE).filter(|f| !f.is_empty());
    let credentials = match orbit_sdk::Credentials::resolve(
        file.as_deref().map(std::path::Path::new),
        source.get(ORBIT_TOKEN),
        source.get(ORBIT_QUEUE_ID),
    ) {
        Ok(c) => Some(c),
        Err(e) => {
            let (variable, problem) = match &e {
                E::Missing => (
                    ORBIT_CREDENTIALS_FILE,
                    "is not set: name the credentials file from bootstrap (or set both ORBIT_TOKEN and ORBIT_QUEUE_ID)".to_owned(),
                ),
                E::Empty(name) => (*name, "is set but empty".to_owned()),
                other => (ORBIT_CREDENTIALS_FILE, other.to_string()),
            };
            errors.push(ConfigError { variable, problem });
            None
        }
    };
    // A token is printable ASCII; a line break (a file written with `echo`, a variable set
    // from one) would otherwise fail later, at the first request, as an HTTP builder error.
    let credentials = credentials.filter(|c| {
        let clean = !c.token.expose().is_empty()
            && c.token.expose().bytes().all(|b| b.is_ascii_graphic());
        if !clean {
            let variable = if source.get(ORBIT_TOKEN).is_some() {
                ORBIT_TOKEN
            } else {
                ORBIT_CREDENTIALS_FILE
            };
            errors.push(ConfigError {
                variable,
                problem: "holds a token with a character no token has (a space, a line break or another control character): check for a trailing newline".into(),
            });
        }
        clean
    });
    let queue =
        credentials
            .as_ref()
            .and_then(|c| match result_inbox::QueueId::new(c.queue_id.clone()) {
                Ok(q) => Some(q),
                Err(e) => {
                    errors.push(ConfigError {
                        variable: ORBIT_QUEUE_ID,
                        problem: format!("(or the credentials file's queue_id) {e}"),
                    });
                    None
                }
            });
    if secure && trust.is_none() {
        return None;
    }
    Some(PlatformConfig {
        url: url?,
        credentials: credentials?,
        queue: queue?,
        trust,
    })
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

fn log_format(source: &dyn Source, errors: &mut Vec<ConfigError>) -> LogFormat {
    match source.get(RECEIVER_LOG_FORMAT).as_deref() {
        None | Some("text") => LogFormat::Text,
        Some("json") => LogFormat::Json,
        Some(_) => {
            errors.push(ConfigError {
                variable: RECEIVER_LOG_FORMAT,
                problem: "must be text or json".into(),
            });
            LogFormat::Text
        }
    }
}

/// What `demo` and `consume` both need: the platform, the receiver database, the consumer
/// name and the log format.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub platform: PlatformConfig,
    pub dsn: Dsn,
    pub name: ConsumerName,
    pub log: LogFormat,
}

impl RunConfig {
    /// Reads the variables every running command needs, collecting problems into `errors`.
    fn read(source: &dyn Source, errors: &mut Vec<ConfigError>) -> Option<RunConfig> {
        let platform = orbit(source, errors);
        let dsn = receiver_dsn(source, errors);
        let name = receiver_name(source, errors);
        let log = log_format(source, errors);
        Some(RunConfig {
            platform: platform?,
            dsn: dsn?,
            name: name?,
            log,
        })
    }
}

/// What `receiver demo` needs: nothing beyond [`RunConfig`].
pub type DemoConfig = RunConfig;

impl DemoConfig {
    /// Parses every variable `demo` reads.
    pub fn from_source(source: &dyn Source) -> Result<Self, ConfigErrors> {
        not_utf8(source)?;
        let mut errors = Vec::new();
        match RunConfig::read(source, &mut errors) {
            Some(run) if errors.is_empty() => Ok(run),
            _ => Err(ConfigErrors(errors)),
        }
    }
}

/// What `receiver consume` needs.
#[derive(Debug, Clone)]
pub struct ConsumeConfig {
    pub run: RunConfig,
    pub subscription: orbit_sdk::SubscriptionId,
    /// Where to serve metrics, if anywhere.
    pub metrics: Option<std::net::SocketAddr>,
    /// The apply budget the user set, if any (otherwise the store's default).
    pub apply_timeout: Option<std::time::Duration>,
    /// Deliveries applied at once.
    pub concurrency: usize,
    /// The most deliveries applied in one transaction ([`RECEIVER_GROUP_MAX`]).
    pub group_max: usize,
    /// [`RECEIVER_REQUIRE_REPLICA_ACK`].
    pub require_replica_ack: bool,
}

/// Reads `RECEIVER_REQUIRE_REPLICA_ACK`: `0` or `1` (unset: `0`).
fn require_replica_ack(source: &dyn Source, errors: &mut Vec<ConfigError>) -> bool {
    match source
        .get(RECEIVER_REQUIRE_REPLICA_ACK)
        .as_deref()
        .map(str::trim)
    {
        None | Some("0") => false,
        Some("1") => true,
        Some(_) => {
            errors.push(ConfigError {
                variable: RECEIVER_REQUIRE_REPLICA_ACK,
                problem: "must be 0 or 1 (1: ACK only what a replica holds, with lossless semi-synchronous replication)".into(),
            });
            false
        }
    }
}

/// Reads `RECEIVER_CONCURRENCY`: a whole number within [`CONCURRENCY_RANGE`].
fn concurrency(source: &dyn Source, errors: &mut Vec<ConfigError>) -> usize {
    whole_number(
        source,
        errors,
        (RECEIVER_CONCURRENCY, CONCURRENCY_RANGE, DEFAULT_CONCURRENCY),
        "deliveries applied at once",
    )
}

/// Reads `RECEIVER_GROUP_MAX`: a whole number within [`GROUP_MAX_RANGE`].
fn group_max(source: &dyn Source, errors: &mut Vec<ConfigError>) -> usize {
    whole_number(
        source,
        errors,
        (RECEIVER_GROUP_MAX, GROUP_MAX_RANGE, DEFAULT_GROUP_MAX),
        "most deliveries applied in one transaction; 1 for one each",
    )
}

/// Reads `variable`: a whole number within `range`, `default` when unset; `what` says what it
/// counts in the error.
fn whole_number(
    source: &dyn Source,
    errors: &mut Vec<ConfigError>,
    (variable, (low, high), default): (&'static str, (usize, usize), usize),
    what: &str,
) -> usize {
    let Some(v) = source.get(variable) else {
        return default;
    };
    match v.trim().parse::<usize>() {
        Ok(n) if (low..=high).contains(&n) => n,
        _ => {
            errors.push(ConfigError {
                variable,
                problem: format!(
                    "must be a whole number from {low} to {high} ({what}; default {default})"
                ),
            });
            default
        }
    }
}

/// Reads `RECEIVER_APPLY_TIMEOUT`: a whole number of `ms` or `s` within
/// [`APPLY_TIMEOUT_RANGE`].
fn apply_timeout(
    source: &dyn Source,
    errors: &mut Vec<ConfigError>,
) -> Option<std::time::Duration> {
    use std::time::Duration;
    let v = source.get(RECEIVER_APPLY_TIMEOUT)?;
    let v = v.trim();
    let parsed = if let Some(ms) = v.strip_suffix("ms") {
        ms.parse::<u64>().ok().map(Duration::from_millis)
    } else if let Some(s) = v.strip_suffix('s') {
        s.parse::<u64>().ok().map(Duration::from_secs)
    } else {
        None
    };
    let (low, high) = APPLY_TIMEOUT_RANGE;
    match parsed {
        Some(d) if (low..=high).contains(&d) => Some(d),
        Some(_) => {
            errors.push(ConfigError {
                variable: RECEIVER_APPLY_TIMEOUT,
                problem: format!(
                    "must be between {} ms and {} s",
                    low.as_millis(),
                    high.as_secs()
                ),
            });
            None
        }
        None => {
            errors.push(ConfigError {
                variable: RECEIVER_APPLY_TIMEOUT,
                problem: "must be a whole number of seconds or milliseconds with its unit, e.g. 5s or 2500ms".into(),
            });
            None
        }
    }
}

/// Reads `RECEIVER_METRICS_LISTEN`: an IP address and a port (port 0 picks a free one).
fn metrics_listen(
    source: &dyn Source,
    errors: &mut Vec<ConfigError>,
) -> Option<std::net::SocketAddr> {
    let v = source.get(RECEIVER_METRICS_LISTEN)?;
    match v.trim().parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            errors.push(ConfigError {
                variable: RECEIVER_METRICS_LISTEN,
                problem: "must be an IP address and a port, e.g. 127.0.0.1:9464 (unset it to serve no metrics)".into(),
            });
            None
        }
    }
}

impl ConsumeConfig {
    /// Parses every variable `consume` reads.
    pub fn from_source(source: &dyn Source) -> Result<Self, ConfigErrors> {
        not_utf8(source)?;
        let mut errors = Vec::new();
        let run = RunConfig::read(source, &mut errors);
        let subscription = subscription_id(
            source,
            &mut errors,
            "is not set: give the 32-character id of an existing subscription",
        );
        let metrics = metrics_listen(source, &mut errors);
        let apply_timeout = apply_timeout(source, &mut errors);
        let concurrency = concurrency(source, &mut errors);
        let group_max = group_max(source, &mut errors);
        let require_replica_ack = require_replica_ack(source, &mut errors);
        match (run, subscription) {
            (Some(run), Some(subscription)) if errors.is_empty() => Ok(ConsumeConfig {
                run,
                subscription,
                metrics,
                apply_timeout,
                concurrency,
                group_max,
                require_replica_ack,
            }),
            _ => Err(ConfigErrors(errors)),
        }
    }
}

/// What `receiver inspect` needs: the database, the consumer and queue, and optionally the
/// platform (with `ORBIT_URL` set, also credentials and `ORBIT_SUBSCRIPTION_ID`).
#[derive(Debug, Clone)]
pub struct InspectConfig {
    pub dsn: Dsn,
    pub name: ConsumerName,
    pub queue: result_inbox::QueueId,
    pub platform: Option<(PlatformConfig, orbit_sdk::SubscriptionId)>,
}

impl InspectConfig {
    /// Parses every variable `inspect` reads.
    pub fn from_source(source: &dyn Source) -> Result<Self, ConfigErrors> {
        not_utf8(source)?;
        let mut errors = Vec::new();
        let dsn = receiver_dsn(source, &mut errors);
        let name = receiver_name(source, &mut errors);
        let (queue, platform) = if source.get(ORBIT_URL).is_some() {
            let platform = orbit(source, &mut errors);
            let subscription = subscription_id(
                source,
                &mut errors,
                "must name the subscription's 32-character id when ORBIT_URL is set",
            );
            let queue = platform.as_ref().map(|p| p.queue.clone());
            (queue, platform.zip(subscription))
        } else {
            (queue_without_platform(source, &mut errors, "inspect"), None)
        };
        match (dsn, name, queue) {
            (Some(dsn), Some(name), Some(queue)) if errors.is_empty() => Ok(InspectConfig {
                dsn,
                name,
                queue,
                platform,
            }),
            _ => Err(ConfigErrors(errors)),
        }
    }
}

/// The queue from `ORBIT_QUEUE_ID`, else from the credentials file, for a `command` that
/// never calls the platform.
fn queue_without_platform(
    source: &dyn Source,
    errors: &mut Vec<ConfigError>,
    command: &str,
) -> Option<result_inbox::QueueId> {
    let file = source.get(ORBIT_CREDENTIALS_FILE).filter(|f| !f.is_empty());
    let queue_text = match (source.get(ORBIT_QUEUE_ID), file) {
        (Some(q), _) => Some(q),
        (None, Some(f)) => match orbit_sdk::Credentials::load(std::path::Path::new(&f)) {
            Ok(c) => Some(c.queue_id),
            Err(e) => {
                errors.push(ConfigError {
                    variable: ORBIT_CREDENTIALS_FILE,
                    problem: e.to_string(),
                });
                None
            }
        },
        (None, None) => {
            errors.push(ConfigError {
                variable: ORBIT_QUEUE_ID,
                problem: format!(
                    "is not set (nor ORBIT_CREDENTIALS_FILE): {command} needs the queue"
                ),
            });
            None
        }
    };
    queue_text.and_then(|q| match result_inbox::QueueId::new(q) {
        Ok(q) => Some(q),
        Err(e) => {
            errors.push(ConfigError {
                variable: ORBIT_QUEUE_ID,
                problem: e.to_string(),
            });
            None
        }
    })
}

/// What `receiver prune` needs: the database (as the prune account), the consumer and queue.
#[derive(Debug, Clone)]
pub struct PruneConfig {
    pub dsn: Dsn,
    pub name: ConsumerName,
    pub queue: result_inbox::QueueId,
}

impl PruneConfig {
    /// Parses every variable `prune` reads.
    pub fn from_source(source: &dyn Source) -> Result<Self, ConfigErrors> {
        not_utf8(source)?;
        let mut errors = Vec::new();
        let dsn = receiver_dsn(source, &mut errors);
        let name = receiver_name(source, &mut errors);
        let queue = queue_without_platform(source, &mut errors, "prune");
        match (dsn, name, queue) {
            (Some(dsn), Some(name), Some(queue)) if errors.is_empty() => {
                Ok(PruneConfig { dsn, name, queue })
            }
            _ => Err(ConfigErrors(errors)),
        }
    }
}

/// What `receiver reconcile` needs: the platform and subscription, the receiver database, the
/// consumer name (the queue is the platform's).
#[derive(Debug, Clone)]
pub struct ReconcileConfig {
    pub run: RunConfig,
    pub subscription: orbit_sdk::SubscriptionId,
}

impl ReconcileConfig {
    /// Parses every variable `reconcile` reads.
    pub fn from_source(source: &dyn Source) -> Result<Self, ConfigErrors> {
        not_utf8(source)?;
        let mut errors = Vec::new();
        let run = RunConfig::read(source, &mut errors);
        let subscription = subscription_id(
            source,
            &mut errors,
            "is not set: give the 32-character id of the subscription whose ACKED deliveries reconcile checks",
        );
        match (run, subscription) {
            (Some(run), Some(subscription)) if errors.is_empty() => {
                Ok(ReconcileConfig { run, subscription })
            }
            _ => Err(ConfigErrors(errors)),
        }
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
        not_utf8(source)?;
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

    #[test]
    fn the_replica_ack_requirement_is_0_or_1() {
        for (v, want) in [
            ("0", Some(false)),
            ("1", Some(true)),
            (" 1 ", Some(true)),
            ("yes", None),
            ("2", None),
        ] {
            let env: HashMap<&str, &str> =
                [(RECEIVER_REQUIRE_REPLICA_ACK, v)].into_iter().collect();
            let mut errors = Vec::new();
            let got = require_replica_ack(&env, &mut errors);
            match want {
                Some(w) => assert!(errors.is_empty() && got == w, "{v:?}"),
                None => assert_eq!(errors[0].to_string(), "RECEIVER_REQUIRE_REPLICA_ACK must be 0 or 1 (1: ACK only what a replica holds, with lossless semi-synchronous replication)"),
            }
        }
        let unset: HashMap<&str, &str> = HashMap::new();
        assert!(!require_replica_ack(&unset, &mut Vec::new()));
    }

    #[test]
    fn the_concurrency_is_a_whole_number_from_1_to_256() {
        let read = |v: &str| {
            let env: HashMap<&str, &str> = [(RECEIVER_CONCURRENCY, v)].into_iter().collect();
            let mut errors = Vec::new();
            let n = concurrency(&env, &mut errors);
            (n, errors.first().map(|e| e.to_string()))
        };
        assert_eq!(read("16"), (16, None));
        assert_eq!(read(" 1 "), (1, None));
        assert_eq!(read("256"), (256, None));
        for bad in ["0", "257", "-1", "4.5", "", "four"] {
            assert_eq!(
                read(bad).1.as_deref(),
                Some("RECEIVER_CONCURRENCY must be a whole number from 1 to 256 (deliveries applied at once; default 4)"),
                "{bad:?}"
            );
        }
        let env: HashMap<&str, &str> = HashMap::new();
        assert_eq!(concurrency(&env, &mut Vec::new()), DEFAULT_CONCURRENCY);
    }

    #[test]
    fn the_group_size_is_a_whole_number_from_1_to_64() {
        let read = |v: &str| {
            let env: HashMap<&str, &str> = [(RECEIVER_GROUP_MAX, v)].into_iter().collect();
            let mut errors = Vec::new();
            let n = group_max(&env, &mut errors);
            (n, errors.first().map(|e| e.to_string()))
        };
        assert_eq!(read("1"), (1, None));
        assert_eq!(read(" 64 "), (64, None));
        for bad in ["0", "65", "-1", "", "sixteen"] {
            assert_eq!(
                read(bad).1.as_deref(),
                Some("RECEIVER_GROUP_MAX must be a whole number from 1 to 64 (most deliveries applied in one transaction; 1 for one each; default 16)"),
                "{bad:?}"
            );
        }
        let env: HashMap<&str, &str> = HashMap::new();
        assert_eq!(group_max(&env, &mut Vec::new()), DEFAULT_GROUP_MAX);
    }

    #[test]
    fn the_apply_budget_needs_a_unit_and_a_sane_size() {
        use std::time::Duration;
        let read = |v: &str| {
            let env: HashMap<&str, &str> = [(RECEIVER_APPLY_TIMEOUT, v)].into_iter().collect();
            let mut errors = Vec::new();
            let d = apply_timeout(&env, &mut errors);
            (d, errors.first().map(|e| e.to_string()))
        };
        assert_eq!(read("5s"), (Some(Duration::from_secs(5)), None));
        assert_eq!(read(" 2500ms "), (Some(Duration::from_millis(2500)), None));
        for bad in ["5", "5 s", "-1s", "1.5s", "", "s", "5m"] {
            let (d, e) = read(bad);
            assert_eq!(d, None, "{bad:?}");
            assert!(
                e.as_deref().is_some_and(|e| e.starts_with("RECEIVER_APPLY_TIMEOUT must be a whole number")),
                "{bad:?}: {e:?}"
            );
        }
        for out in ["99ms", "0s", "601s"] {
            let (d, e) = read(out);
            assert_eq!(d, None, "{out:?}");
            assert_eq!(
                e.as_deref(),
                Some("RECEIVER_APPLY_TIMEOUT must be between 100 ms and 600 s"),
                "{out:?}"
            );
        }
        let env: HashMap<&str, &str> = HashMap::new();
        assert_eq!(apply_timeout(&env, &mut Vec::new()), None);
    }
}
