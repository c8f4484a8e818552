//! Fault rules: what to do to which statements on which connections, how often; and the log of
//! what each firing really did.
//!
//! A rule is armed at run time and applies to every connection, or to the next N connections
//! accepted after it was armed. Its count says how many times it fires (once, N times, or
//! always). A rule *hits* whenever a statement matches it; it *fires* when it changes what a
//! client sees, and only a firing uses up its count. `drop-commit-ok`, for instance, hits every
//! COMMIT but fires only on an OK reply: an ERR is a definite answer and passes through.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::classify::Kind;

/// What a rule does to a matched statement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Action {
    /// Forward the COMMIT, read the server's real reply; an OK is dropped and both sides are
    /// closed (committed, and the client cannot know). An ERR passes through.
    DropCommitOk,
    /// Close the client without forwarding the COMMIT; the server rolls back.
    DropCommitRequest,
    /// Answer with this ERR packet instead of forwarding the statement.
    Error {
        number: u16,
        #[serde(default)]
        sqlstate: Option<String>,
        #[serde(default)]
        message: Option<String>,
    },
    /// Forward the statement and hold its reply this long.
    Delay { delay_ms: u64 },
    /// Hold the statement this long, then forward it (the server sees it later).
    HoldRequest { delay_ms: u64 },
    /// Close both sides (the client with a TCP reset) instead of forwarding the statement.
    Reset,
}

impl Action {
    /// The action's name, as used on the command line and in the API.
    pub fn name(&self) -> &'static str {
        match self {
            Action::DropCommitOk => "drop-commit-ok",
            Action::DropCommitRequest => "drop-commit-request",
            Action::Error { .. } => "error",
            Action::Delay { .. } => "delay",
            Action::HoldRequest { .. } => "hold-request",
            Action::Reset => "reset",
        }
    }

    /// The SQLSTATE and message of an `Error` action, with defaults for well-known numbers.
    pub fn error_fields(&self) -> Option<(u16, String, String)> {
        let Action::Error {
            number,
            sqlstate,
            message,
        } = self
        else {
            return None;
        };
        let (default_state, default_message) = match number {
            1213 => (
                "40001",
                "Deadlock found when trying to get lock; try restarting transaction",
            ),
            1205 => (
                "HY000",
                "Lock wait timeout exceeded; try restarting transaction",
            ),
            1062 => ("23000", "Duplicate entry (injected by commit-proxy)"),
            _ => ("HY000", "error injected by commit-proxy"),
        };
        Some((
            *number,
            sqlstate.clone().unwrap_or_else(|| default_state.to_owned()),
            message
                .clone()
                .unwrap_or_else(|| default_message.to_owned()),
        ))
    }
}

/// Which statements a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum On {
    #[default]
    Commit,
    Rollback,
    Begin,
    /// Every COM_QUERY and COM_STMT_EXECUTE.
    Any,
}

impl On {
    fn matches(self, kind: Kind) -> bool {
        match self {
            On::Commit => kind == Kind::Commit,
            On::Rollback => kind == Kind::Rollback,
            On::Begin => kind == Kind::Begin,
            On::Any => true,
        }
    }
}

/// A rule as a caller asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleSpec {
    #[serde(flatten)]
    pub action: Action,
    #[serde(default)]
    pub on: On,
    /// Fire at most this many times; `None` fires on every match until disarmed.
    #[serde(default)]
    pub count: Option<u64>,
    /// Only the next N connections accepted after arming; `None` for every connection.
    #[serde(default)]
    pub next_connections: Option<u64>,
    /// Only statements whose text contains this (ASCII case-insensitive).
    #[serde(default)]
    pub contains: Option<String>,
}

/// Why a rule spec was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError(pub String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

impl RuleSpec {
    /// A rule with `action` on COMMIT, every connection, always.
    pub fn new(action: Action) -> RuleSpec {
        RuleSpec {
            action,
            on: On::Commit,
            count: None,
            next_connections: None,
            contains: None,
        }
    }

    /// Fire at most `n` times.
    pub fn times(mut self, n: u64) -> RuleSpec {
        self.count = Some(n);
        self
    }

    /// Fire once.
    pub fn once(self) -> RuleSpec {
        self.times(1)
    }

    /// Match these statements.
    pub fn on(mut self, on: On) -> RuleSpec {
        self.on = on;
        self
    }

    /// Only the next `n` connections.
    pub fn next_connections(mut self, n: u64) -> RuleSpec {
        self.next_connections = Some(n);
        self
    }

    /// Checks the combination makes sense.
    pub fn validate(&self) -> Result<(), SpecError> {
        if matches!(
            self.action,
            Action::DropCommitOk | Action::DropCommitRequest
        ) && self.on != On::Commit
        {
            return Err(SpecError(format!(
                "{} applies to COMMIT only (on must be commit)",
                self.action.name()
            )));
        }
        if self.count == Some(0) {
            return Err(SpecError(
                "count must be at least 1 (leave it out for always)".into(),
            ));
        }
        if self.next_connections == Some(0) {
            return Err(SpecError(
                "next_connections must be at least 1 (leave it out for every connection)".into(),
            ));
        }
        if let Action::Error {
            sqlstate: Some(s), ..
        } = &self.action
        {
            if s.len() != 5 || !s.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Err(SpecError(format!(
                    "sqlstate must be 5 letters or digits, not {s:?}"
                )));
            }
        }
        if let Action::Delay { delay_ms } | Action::HoldRequest { delay_ms } = self.action {
            if delay_ms > 600_000 {
                return Err(SpecError("delay_ms is at most 600000 (ten minutes)".into()));
            }
        }
        Ok(())
    }

    /// Parses the command line form `ACTION[=ARG][@ON][:COUNT]`, e.g. `drop-commit-ok`,
    /// `drop-commit-ok:1`, `error=1213`, `error=1205@any:3`, `delay=250ms`, `reset@rollback`.
    pub fn parse_cli(s: &str) -> Result<RuleSpec, SpecError> {
        let bad = |why: &str| SpecError(format!("rule {s:?}: {why}"));
        let (rest, count) = match s.rsplit_once(':') {
            Some((rest, n)) => (
                rest,
                Some(
                    n.parse::<u64>()
                        .map_err(|_| bad("the count after ':' must be a number"))?,
                ),
            ),
            None => (s, None),
        };
        let (rest, on) = match rest.split_once('@') {
            Some((rest, on)) => (
                rest,
                match on {
                    "commit" => On::Commit,
                    "rollback" => On::Rollback,
                    "begin" => On::Begin,
                    "any" => On::Any,
                    _ => return Err(bad("'@' takes commit, rollback, begin or any")),
                },
            ),
            None => (rest, On::Commit),
        };
        let (name, arg) = match rest.split_once('=') {
            Some((name, arg)) => (name, Some(arg)),
            None => (rest, None),
        };
        let action = match (name, arg) {
            ("drop-commit-ok", None) => Action::DropCommitOk,
            ("drop-commit-request", None) => Action::DropCommitRequest,
            ("reset", None) => Action::Reset,
            ("error", Some(n)) => Action::Error {
                number: n.parse().map_err(|_| bad("error=NUMBER, e.g. error=1213"))?,
                sqlstate: None,
                message: None,
            },
            ("delay" | "hold-request", Some(d)) => {
                let ms = d
                    .strip_suffix("ms")
                    .and_then(|n| n.parse::<u64>().ok())
                    .or_else(|| d.strip_suffix('s').and_then(|n| n.parse::<u64>().ok()).map(|s| s * 1000))
                    .ok_or_else(|| bad(&format!("{name}=DURATION, e.g. {name}=250ms or {name}=2s")))?;
                if name == "delay" {
                    Action::Delay { delay_ms: ms }
                } else {
                    Action::HoldRequest { delay_ms: ms }
                }
            }
            ("error", None) => return Err(bad("error needs a number: error=1213")),
            ("delay", None) => return Err(bad("delay needs a duration: delay=250ms")),
            ("hold-request", None) => {
                return Err(bad("hold-request needs a duration: hold-request=250ms"))
            }
            _ => {
                return Err(bad(
                    "unknown action; use drop-commit-ok, drop-commit-request, error=N, delay=D, hold-request=D or reset",
                ))
            }
        };
        let spec = RuleSpec {
            action,
            on,
            count,
            next_connections: None,
            contains: None,
        };
        spec.validate().map_err(|e| bad(&e.0))?;
        Ok(spec)
    }
}

/// An armed rule, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleInfo {
    pub id: u64,
    #[serde(flatten)]
    pub spec: RuleSpec,
    /// Firings left; `None` for always.
    pub remaining: Option<u64>,
    /// Statements that matched.
    pub hits: u64,
    /// Times it changed what a client saw.
    pub fired: u64,
    /// Still armed.
    pub armed: bool,
}

/// What really happened when a rule fired: enough to resolve an unknown outcome against the
/// server's own truth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fired {
    /// Position in the proxy's event log, from 1.
    pub seq: u64,
    pub rule: u64,
    pub action: &'static str,
    /// The proxy's number for the client connection.
    pub connection: u64,
    /// The server's thread id for that connection (`CONNECTION_ID()`), from its greeting.
    pub server_thread_id: u32,
    /// The statement's class (`commit`, `rollback`, `begin`, `other`).
    pub statement: &'static str,
    /// The start of the statement's text (at most 200 bytes).
    pub text: String,
    /// The server's reply: `ok`, `err`, or `none` when it was never asked.
    pub reply: &'static str,
    pub error_number: Option<u16>,
    /// Status flags before the statement and in the server's reply.
    pub status_before: u16,
    pub status_after: Option<u16>,
    pub in_transaction_before: bool,
    pub in_transaction_after: Option<bool>,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
}

struct RuleState {
    info: RuleInfo,
    /// First proxy connection number the rule applies to.
    first_connection: u64,
}

/// The rules and the event log shared by a proxy's connections, its API and its control server.
pub(crate) struct Rules {
    state: Mutex<RulesState>,
    /// How many rules are armed: with none, connections skip classification entirely.
    armed: std::sync::atomic::AtomicUsize,
    /// The number of events logged so far; watchers wait for it to grow.
    events_logged: watch::Sender<u64>,
}

struct RulesState {
    next_id: u64,
    rules: Vec<RuleState>,
    events: VecDeque<Fired>,
    logged: u64,
}

/// How many firings the log keeps.
const EVENT_LOG: usize = 10_000;

/// A rule that matched a statement, to be fired or not by the connection.
#[derive(Debug, Clone)]
pub(crate) struct Matched {
    pub id: u64,
    pub action: Action,
}

impl Rules {
    pub(crate) fn new() -> Rules {
        Rules {
            state: Mutex::new(RulesState {
                next_id: 1,
                rules: Vec::new(),
                events: VecDeque::new(),
                logged: 0,
            }),
            events_logged: watch::channel(0).0,
            armed: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Whether any rule is armed (a hint: a rule armed meanwhile applies from the next
    /// statement on).
    pub(crate) fn any_armed(&self) -> bool {
        self.armed.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    fn count_armed(&self, st: &RulesState) {
        self.armed
            .store(st.rules.len(), std::sync::atomic::Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RulesState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn arm(&self, spec: RuleSpec, next_connection: u64) -> RuleInfo {
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        let info = RuleInfo {
            id,
            remaining: spec.count,
            spec,
            hits: 0,
            fired: 0,
            armed: true,
        };
        st.rules.push(RuleState {
            info: info.clone(),
            first_connection: next_connection,
        });
        self.count_armed(&st);
        info
    }

    pub(crate) fn disarm(&self, id: u64) -> Option<RuleInfo> {
        let mut st = self.lock();
        let i = st.rules.iter().position(|r| r.info.id == id)?;
        let mut r = st.rules.remove(i);
        self.count_armed(&st);
        r.info.armed = false;
        Some(r.info)
    }

    pub(crate) fn disarm_all(&self) -> usize {
        let mut st = self.lock();
        let n = st.rules.len();
        st.rules.clear();
        self.count_armed(&st);
        n
    }

    pub(crate) fn list(&self) -> Vec<RuleInfo> {
        self.lock().rules.iter().map(|r| r.info.clone()).collect()
    }

    pub(crate) fn info(&self, id: u64) -> Option<RuleInfo> {
        self.lock()
            .rules
            .iter()
            .find(|r| r.info.id == id)
            .map(|r| r.info.clone())
    }

    /// The first armed rule matching a statement of `kind` with `text` on `connection`,
    /// counting a hit. `certain` statements only, except for `drop-commit-ok`, which confirms
    /// from the reply before it fires.
    pub(crate) fn matching(
        &self,
        connection: u64,
        kind: Kind,
        certain: bool,
        text: &str,
    ) -> Option<Matched> {
        let mut st = self.lock();
        let rule = st.rules.iter_mut().find(|r| {
            let spec = &r.info.spec;
            r.info.remaining != Some(0)
                && spec.on.matches(kind)
                && (certain || spec.action == Action::DropCommitOk)
                && spec.next_connections.is_none_or(|n| {
                    (r.first_connection..r.first_connection + n).contains(&connection)
                })
                && spec.contains.as_ref().is_none_or(|needle| {
                    text.to_ascii_lowercase()
                        .contains(&needle.to_ascii_lowercase())
                })
        })?;
        rule.info.hits += 1;
        Some(Matched {
            id: rule.info.id,
            action: rule.info.spec.action.clone(),
        })
    }

    /// Uses up one firing of rule `id`; false if it was disarmed or spent meanwhile.
    pub(crate) fn take(&self, id: u64) -> bool {
        let mut st = self.lock();
        let Some(rule) = st.rules.iter_mut().find(|r| r.info.id == id) else {
            return false;
        };
        match rule.info.remaining {
            Some(0) => false,
            Some(n) => {
                rule.info.remaining = Some(n - 1);
                rule.info.fired += 1;
                true
            }
            None => {
                rule.info.fired += 1;
                true
            }
        }
    }

    /// Logs a firing and wakes whoever waits for one.
    pub(crate) fn record(&self, mut event: Fired) -> Fired {
        event.at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let logged = {
            let mut st = self.lock();
            st.logged += 1;
            event.seq = st.logged;
            st.events.push_back(event.clone());
            if st.events.len() > EVENT_LOG {
                st.events.pop_front();
            }
            st.logged
        };
        self.events_logged.send_replace(logged);
        event
    }

    /// Events after `after` (a `seq`), optionally only those of `rule`.
    pub(crate) fn events_after(&self, after: u64, rule: Option<u64>) -> Vec<Fired> {
        self.lock()
            .events
            .iter()
            .filter(|e| e.seq > after && rule.is_none_or(|r| e.rule == r))
            .cloned()
            .collect()
    }

    /// Waits up to `timeout` for an event after `after` (of `rule`, if given).
    pub(crate) async fn wait_events(
        &self,
        after: u64,
        rule: Option<u64>,
        timeout: Duration,
    ) -> Vec<Fired> {
        let mut rx = self.events_logged.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let found = self.events_after(after, rule);
            if !found.is_empty() {
                return found;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Vec::new();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_specs() {
        assert_eq!(
            RuleSpec::parse_cli("drop-commit-ok").unwrap(),
            RuleSpec::new(Action::DropCommitOk)
        );
        assert_eq!(
            RuleSpec::parse_cli("drop-commit-ok:1").unwrap(),
            RuleSpec::new(Action::DropCommitOk).once()
        );
        let e = RuleSpec::parse_cli("error=1205@any:3").unwrap();
        assert_eq!(e.on, On::Any);
        assert_eq!(e.count, Some(3));
        assert_eq!(
            e.action.error_fields().unwrap(),
            (
                1205,
                "HY000".to_owned(),
                "Lock wait timeout exceeded; try restarting transaction".to_owned()
            )
        );
        assert_eq!(
            RuleSpec::parse_cli("delay=2s").unwrap().action,
            Action::Delay { delay_ms: 2000 }
        );
        assert_eq!(
            RuleSpec::parse_cli("hold-request=300ms").unwrap().action,
            Action::HoldRequest { delay_ms: 300 }
        );
        let held: RuleSpec =
            serde_json::from_str(r#"{"action":"hold-request","delay_ms":300}"#).unwrap();
        assert_eq!(held.action, Action::HoldRequest { delay_ms: 300 });
        for bad in [
            "hold-request",
            "hold-request=700000s",
            "drop-commit-ok@any",
            "error",
            "error=x",
            "delay=5",
            "explode",
            "reset:0",
            "reset@sometimes",
        ] {
            assert!(RuleSpec::parse_cli(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_specs_round_trip() {
        let spec: RuleSpec = serde_json::from_str(
            r#"{"action":"error","number":1213,"on":"commit","count":1,"next_connections":2}"#,
        )
        .unwrap();
        assert_eq!(spec.next_connections, Some(2));
        assert_eq!(spec.action.error_fields().unwrap().1, "40001");
        let back: RuleSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn counts_scopes_and_hits() {
        let rules = Rules::new();
        // Armed when connection 5 is the next one: applies to 5 and 6 only.
        let id = rules
            .arm(RuleSpec::new(Action::Reset).times(2).next_connections(2), 5)
            .id;
        // Without a connection scope, connections opened before arming count too.
        let every = rules
            .arm(RuleSpec::new(Action::Reset).on(On::Rollback), 5)
            .id;
        assert_eq!(
            rules
                .matching(1, Kind::Rollback, true, "ROLLBACK")
                .map(|m| m.id),
            Some(every)
        );
        rules.disarm(every);
        assert!(rules.matching(4, Kind::Commit, true, "COMMIT").is_none());
        assert!(rules.matching(7, Kind::Commit, true, "COMMIT").is_none());
        assert!(rules
            .matching(5, Kind::Rollback, true, "ROLLBACK")
            .is_none());
        assert!(rules.matching(5, Kind::Commit, false, "COMMIT").is_none());
        assert!(rules.matching(5, Kind::Commit, true, "COMMIT").is_some());
        assert!(rules.take(id));
        assert!(rules.matching(6, Kind::Commit, true, "COMMIT").is_some());
        assert!(rules.take(id));
        assert!(rules.matching(6, Kind::Commit, true, "COMMIT").is_none());
        assert!(!rules.take(id));
        let info = rules.info(id).unwrap();
        assert_eq!((info.hits, info.fired, info.remaining), (2, 2, Some(0)));
    }
}
