//! The `receiver` command line: which command, with which flags. clap (derive) reads its
//! structure; the help texts and every error line are this program's own, one line each, as
//! `docs/input-surfaces.md` lists them. Configuration never comes from here: it comes from the
//! environment ([`crate::config`]).

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, Parser, Subcommand};
use result_inbox::{EventId, QueueId, TaskId};

use crate::inspect::Target;

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Print this help text; exit 0.
    Help(&'static str),
    /// Print the version line; exit 0.
    Version,
    /// Run a command.
    Run(Command),
}

/// A command and its flags, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Init,
    Migrate(MigrateArgs),
    Demo,
    Consume,
    Retention,
    Prune(PruneArgs),
    Reconcile(ReconcileArgs),
    Digest {
        queue: Option<QueueId>,
        file: Option<String>,
    },
    Inspect {
        target: Target,
        show_event: bool,
        json: bool,
        compare: Option<String>,
    },
}

/// What `receiver prune` was asked to do, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneArgs {
    /// The window: rows received longer ago than this are deleted.
    pub older_than: Window,
    pub batch_rows: u32,
    pub pause: std::time::Duration,
    /// At most this many rows a second, on average over the run.
    pub max_rate: u32,
    /// Stop cleanly after this long (between batches).
    pub max_seconds: Option<u64>,
    pub dry_run: bool,
}

/// What `receiver migrate` was asked to do, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateArgs {
    pub dry_run: bool,
    pub allow_blocking: bool,
    /// How long to wait for another run's lock.
    pub lock_wait: std::time::Duration,
}

/// How long `migrate` waits for another run's lock unless `--lock-wait` says otherwise.
pub const DEFAULT_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// What `receiver reconcile` was asked to do, checked (times in UTC, RFC 3339).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileArgs {
    pub since: String,
    /// `None`: up to now.
    pub until: Option<String>,
    pub dry_run: bool,
    /// Redeliver also what was ACKED before the inbox's oldest row (pruned, not lost).
    pub allow_pruned_window: bool,
}

/// The longest window `reconcile` takes: a run is bounded, and the platform's listing of a
/// longer one is better split.
pub const MAX_RECONCILE_DAYS: i64 = 31;

/// A window as given (`30d`) and in seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub text: String,
    pub seconds: u64,
}

/// The shortest window `prune` takes without `--allow-short-window`.
pub const WINDOW_FLOOR_SECONDS: u64 = 24 * 3600;
/// Rows per batch unless `--batch-rows` says otherwise.
pub const DEFAULT_BATCH_ROWS: u32 = 1_000;
/// The pause between two batches unless `--pause` says otherwise.
pub const DEFAULT_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);
/// Rows a second at most unless `--max-rate` says otherwise: what this machine's bench shows
/// a full-speed `consume` keeps 0.9 of its rate beside (docs/capacity.md).
pub const DEFAULT_MAX_RATE: u32 = 5_000;
/// The largest `--max-rate`.
const MAX_MAX_RATE: u32 = 1_000_000;
/// The longest pause `--pause` takes.
const MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(60);

/// A usage error: the one line to print on stderr (exit 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage(pub String);

#[derive(Parser)]
#[command(
    name = "receiver",
    disable_help_flag = true,
    disable_help_subcommand = true,
    disable_version_flag = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(Subcommand)]
enum Sub {
    Init(Bare),
    Migrate(MigrateFlags),
    Demo(Bare),
    Consume(Bare),
    Retention(Bare),
    Prune(PruneFlags),
    Reconcile(ReconcileFlags),
    Digest(DigestArgs),
    Inspect(InspectArgs),
    Help,
}

/// A command whose configuration is all in the environment.
#[derive(Args)]
#[command(disable_help_flag = true)]
struct Bare {}

#[derive(Args)]
#[command(disable_help_flag = true)]
struct DigestArgs {
    #[arg(long, overrides_with = "queue")]
    queue: Option<String>,
    file: Option<String>,
}

#[derive(Args)]
#[command(disable_help_flag = true)]
struct PruneFlags {
    #[arg(long, allow_hyphen_values = true)]
    older_than: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    batch_rows: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pause: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    max_seconds: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    max_rate: Option<String>,
    #[arg(long)]
    dry_run: bool,
    #[arg(long)]
    allow_short_window: bool,
}

#[derive(Args)]
#[command(disable_help_flag = true)]
struct MigrateFlags {
    #[arg(long)]
    dry_run: bool,
    #[arg(long)]
    allow_blocking: bool,
    #[arg(long, allow_hyphen_values = true)]
    lock_wait: Option<String>,
}

#[derive(Args)]
#[command(disable_help_flag = true)]
struct ReconcileFlags {
    #[arg(long, allow_hyphen_values = true)]
    since: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    until: Option<String>,
    #[arg(long)]
    dry_run: bool,
    #[arg(long)]
    allow_pruned_window: bool,
}

#[derive(Args)]
#[command(disable_help_flag = true)]
struct InspectArgs {
    #[arg(long, conflicts_with = "task_id")]
    event_id: Option<String>,
    #[arg(long)]
    task_id: Option<String>,
    #[arg(long)]
    show_event: bool,
    #[arg(long)]
    json: bool,
    #[arg(long)]
    compare: Option<String>,
}

/// Reads the arguments after the program's name.
pub fn parse(args: Vec<OsString>) -> Result<Invocation, Usage> {
    let args: Vec<String> = args
        .into_iter()
        .map(OsString::into_string)
        .collect::<Result<_, _>>()
        .map_err(|_| Usage("receiver: an argument is not valid UTF-8".into()))?;
    // Help and the version are answered before anything else is read: wherever `--help`
    // stands, the command it names is explained, never run.
    match about::asked(&args) {
        about::Asked::Help => {
            return Ok(Invocation::Help(help_of(about::command_named(
                &args, COMMANDS,
            ))))
        }
        about::Asked::Version => return Ok(Invocation::Version),
        about::Asked::Run => {}
    }
    let command = args.first().cloned().unwrap_or_default();
    let cli = Cli::try_parse_from(std::iter::once("receiver".to_owned()).chain(args))
        .map_err(|e| usage_line(&command, &e))?;
    let Some(sub) = cli.command else {
        return Err(Usage(format!(
            "receiver: no command given; the commands are {} (`receiver --help`)",
            COMMANDS.join(", ")
        )));
    };
    Ok(match sub {
        Sub::Help => Invocation::Help(USAGE),
        Sub::Init(_) => Invocation::Run(Command::Init),
        Sub::Migrate(m) => Invocation::Run(migrate(m)?),
        Sub::Demo(_) => Invocation::Run(Command::Demo),
        Sub::Consume(_) => Invocation::Run(Command::Consume),
        Sub::Retention(_) => Invocation::Run(Command::Retention),
        Sub::Prune(p) => Invocation::Run(prune(p)?),
        Sub::Reconcile(r) => Invocation::Run(reconcile(r, unix_now())?),
        Sub::Digest(d) => Invocation::Run(digest(d)?),
        Sub::Inspect(i) => Invocation::Run(inspect(i)?),
    })
}

/// The commands, in the order the help lists them (`help` too, which prints it).
pub const COMMANDS: &[&str] = &[
    "init",
    "migrate",
    "demo",
    "consume",
    "digest",
    "inspect",
    "retention",
    "prune",
    "reconcile",
    "help",
];

/// The help of `command`, or the program's when none is named.
fn help_of(command: Option<&str>) -> &'static str {
    match command {
        Some("init") => INIT_HELP,
        Some("migrate") => MIGRATE_HELP,
        Some("demo") => DEMO_HELP,
        Some("consume") => CONSUME_HELP,
        Some("retention") => RETENTION_HELP,
        Some("prune") => PRUNE_HELP,
        Some("reconcile") => RECONCILE_HELP,
        Some("digest") => DIGEST_HELP,
        Some("inspect") => INSPECT_HELP,
        _ => USAGE,
    }
}

fn digest(d: DigestArgs) -> Result<Command, Usage> {
    let queue = match d.queue {
        Some(q) => Some(QueueId::new(q).map_err(|e| usage("digest", &format!("--queue {e}")))?),
        None => None,
    };
    Ok(Command::Digest {
        queue,
        file: d.file,
    })
}

fn migrate(m: MigrateFlags) -> Result<Command, Usage> {
    let lock_wait = match m.lock_wait {
        None => DEFAULT_LOCK_WAIT,
        Some(w) => std::time::Duration::from_secs(
            duration_seconds(&w, &[("s", 1), ("m", 60)], true)
                .map_err(|why| usage("migrate", &format!("--lock-wait {w}: {why}")))?,
        ),
    };
    Ok(Command::Migrate(MigrateArgs {
        dry_run: m.dry_run,
        allow_blocking: m.allow_blocking,
        lock_wait,
    }))
}

fn prune(p: PruneFlags) -> Result<Command, Usage> {
    let bad = |problem: String| usage("prune", &problem);
    let Some(text) = p.older_than else {
        return Err(bad(
            "give --older-than, the window to keep (e.g. 30d)".into()
        ));
    };
    let seconds = duration_seconds(
        &text,
        &[("s", 1), ("m", 60), ("h", 3600), ("d", 86_400)],
        false,
    )
    .map_err(|why| bad(format!("--older-than {text}: {why}")))?;
    if seconds < WINDOW_FLOOR_SECONDS && !p.allow_short_window {
        return Err(bad(format!(
            "--older-than {text} is under the 24h floor: a window shorter than the platform's redelivery horizon turns redeliveries into first receipts; add --allow-short-window if that is meant"
        )));
    }
    let batch_rows = match p.batch_rows {
        None => DEFAULT_BATCH_ROWS,
        Some(b) => match b.parse::<u32>() {
            Ok(n @ 1..=result_inbox::prune::MAX_BATCH_ROWS) => n,
            _ => {
                return Err(bad(format!(
                    "--batch-rows {b}: must be a whole number from 1 to {}",
                    result_inbox::prune::MAX_BATCH_ROWS
                )))
            }
        },
    };
    let pause = match p.pause {
        None => DEFAULT_PAUSE,
        Some(t) => {
            let ms = duration_seconds(&t, &[("ms", 1), ("s", 1000)], true)
                .map_err(|why| bad(format!("--pause {t}: {why}")))?;
            let pause = std::time::Duration::from_millis(ms);
            if pause > MAX_PAUSE {
                return Err(bad(format!("--pause {t}: at most 60s")));
            }
            pause
        }
    };
    let max_rate = match p.max_rate {
        None => DEFAULT_MAX_RATE,
        Some(r) => match r.parse::<u32>() {
            Ok(n @ 1..=MAX_MAX_RATE) => n,
            _ => {
                return Err(bad(format!(
                "--max-rate {r}: must be a whole number of rows a second, from 1 to {MAX_MAX_RATE}"
            )))
            }
        },
    };
    let max_seconds = match p.max_seconds {
        None => None,
        Some(m) => match m.parse::<u64>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                return Err(bad(format!(
                    "--max-seconds {m}: must be a whole number of seconds, more than 0"
                )))
            }
        },
    };
    Ok(Command::Prune(PruneArgs {
        older_than: Window { text, seconds },
        batch_rows,
        pause,
        max_rate,
        max_seconds,
        dry_run: p.dry_run,
    }))
}

/// Microseconds since the epoch, now.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// `reconcile`'s window, checked against `now` (microseconds since the epoch).
fn reconcile(r: ReconcileFlags, now: i64) -> Result<Command, Usage> {
    let bad = |problem: String| usage("reconcile", &problem);
    let time = |flag: &str, v: &str| -> Result<(String, i64), Usage> {
        match (
            canonical_form::normalize_rfc3339(v),
            canonical_form::unix_micros(v),
        ) {
            (Some(utc), Some(at)) => Ok((utc, at)),
            _ => Err(bad(format!(
                "{flag} {v:?} is not an RFC 3339 time, e.g. 2026-12-05T10:00:00Z"
            ))),
        }
    };
    let Some(since) = r.since else {
        return Err(bad(
            "give --since, the start of the window (RFC 3339, e.g. 2026-12-05T10:00:00Z)".into(),
        ));
    };
    let (since_utc, since_at) = time("--since", &since)?;
    if since_at >= now {
        return Err(bad(format!(
            "--since {since} is in the future: nothing was ACKed then yet"
        )));
    }
    let (until_utc, until_at) = match &r.until {
        None => (None, now),
        Some(u) => {
            let (utc, at) = time("--until", u)?;
            if at <= since_at {
                return Err(bad(format!("--until {u} is not after --since {since}")));
            }
            (Some(utc), at)
        }
    };
    let days = (until_at - since_at) as f64 / 86_400e6;
    if days > MAX_RECONCILE_DAYS as f64 {
        return Err(bad(format!(
            "the window is {days:.1} days, longer than the {MAX_RECONCILE_DAYS} days one run takes: split it with --until"
        )));
    }
    Ok(Command::Reconcile(ReconcileArgs {
        since: since_utc,
        until: until_utc,
        dry_run: r.dry_run,
        allow_pruned_window: r.allow_pruned_window,
    }))
}

/// `text` as a whole number and one of `units` (name, how many of the smallest unit), in the
/// smallest unit; why not, in a few words. Zero only if `zero_ok` (then with or without a unit).
fn duration_seconds(text: &str, units: &[(&str, u64)], zero_ok: bool) -> Result<u64, String> {
    let names = units.iter().map(|(u, _)| *u).collect::<Vec<_>>().join(", ");
    if text.starts_with('-') {
        return Err("cannot be negative".into());
    }
    if zero_ok && text.trim_end_matches(|c: char| c.is_ascii_alphabetic()) == "0" {
        return Ok(0);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "needs a whole number and a unit ({names}), e.g. 30{}",
            units.last().map_or("", |u| u.0)
        ));
    }
    let Some((_, size)) = units.iter().find(|(u, _)| *u == unit) else {
        return Err(if unit.is_empty() {
            format!("needs a unit ({names})")
        } else {
            format!("unknown unit `{unit}` (use {names})")
        });
    };
    let n: u64 = digits.parse().map_err(|_| "is too large".to_owned())?;
    if n == 0 {
        return Err("must be more than zero".into());
    }
    n.checked_mul(*size)
        .filter(|v| *v <= 100 * 365 * 86_400 * 1000)
        .ok_or_else(|| "is too large".to_owned())
}

fn inspect(i: InspectArgs) -> Result<Command, Usage> {
    let target = match (i.event_id, i.task_id) {
        (Some(e), None) => EventId::new(e)
            .map(Target::Event)
            .map_err(|e| usage("inspect", &format!("--event-id {e}")))?,
        (None, Some(t)) => TaskId::new(t)
            .map(Target::Task)
            .map_err(|e| usage("inspect", &format!("--task-id {e}")))?,
        _ => return Err(usage("inspect", "give --event-id or --task-id")),
    };
    Ok(Command::Inspect {
        target,
        show_event: i.show_event,
        json: i.json,
        compare: i.compare,
    })
}

/// `receiver <command>: <problem> (receiver <command> --help)`.
fn usage(command: &str, problem: &str) -> Usage {
    Usage(format!(
        "receiver {command}: {problem} (receiver {command} --help)"
    ))
}

/// The program's own line for what clap refused.
fn usage_line(command: &str, e: &clap::Error) -> Usage {
    let context = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        Some(ContextValue::Strings(s)) => s.first().cloned().unwrap_or_default(),
        _ => String::new(),
    };
    // `--queue <QUEUE>` names the flag; the flag is what a person typed.
    let flag = context(ContextKind::InvalidArg)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_owned();
    match e.kind() {
        ErrorKind::InvalidSubcommand => Usage(format!(
            "receiver: {}",
            about::unknown_command("receiver", &context(ContextKind::InvalidSubcommand), COMMANDS)
        )),
        ErrorKind::UnknownArgument if !COMMANDS.contains(&command) => Usage(format!(
            "receiver: unknown flag `{flag}` before the command; the commands are {} (`receiver --help`)",
            COMMANDS.join(", ")
        )),
        ErrorKind::UnknownArgument => match command {
            "digest" if flag.starts_with("--") => {
                usage("digest", &format!("unknown flag `{flag}`"))
            }
            "prune" if flag.starts_with("--") => {
                usage("prune", &format!("unknown flag `{flag}`"))
            }
            "reconcile" if flag.starts_with("--") => {
                usage("reconcile", &format!("unknown flag `{flag}`"))
            }
            "migrate" if flag.starts_with("--") => {
                usage("migrate", &format!("unknown flag `{flag}`"))
            }
            "digest" | "inspect" | "prune" | "reconcile" | "migrate" => {
                usage(command, &format!("unexpected argument `{flag}`"))
            }
            "help" => Usage(format!(
                "receiver help: unexpected argument `{flag}`: run `receiver help` for the commands"
            )),
            _ => Usage(format!(
                "receiver {command}: unexpected argument `{flag}`: configuration comes from the environment (receiver {command} --help)"
            )),
        },
        ErrorKind::ArgumentConflict => usage(command, "give one of --event-id or --task-id"),
        ErrorKind::InvalidValue | ErrorKind::NoEquals => {
            let needs = match flag.as_str() {
                "--queue" => "a queue id",
                "--compare" => "a file",
                "--older-than" => "a window, e.g. 30d",
                "--batch-rows" => "a number of rows",
                "--pause" => "a duration, e.g. 20ms",
                "--max-seconds" => "a number of seconds",
                "--max-rate" => "a number of rows a second",
                "--since" | "--until" => "an RFC 3339 time, e.g. 2026-12-05T10:00:00Z",
                "--lock-wait" => "a duration, e.g. 300s",
                _ => "an id",
            };
            usage(command, &format!("{flag} needs {needs}"))
        }
        _ => usage(command, &format!("cannot read the arguments: {}", e.kind())),
    }
}

pub const USAGE: &str = "usage: receiver <command>   (receiver <command> --help for details)

commands:
  init       create the receiver's two tables, once, and record the schema's version
  migrate    bring the receiver's schema to this release's version, step by step (the init account)
  demo       one task's cancellation end to end on a new subscription
  consume    apply an existing subscription's deliveries until SIGINT/SIGTERM
  digest     print an event's canonical bytes and SHA-256 (read-only)
  inspect    show what the receiver (and the platform) recorded for an event or a task (read-only)
  retention  inbox size and age per consumer and queue (read-only)
  prune      delete inbox rows older than a window, in small batches (a prune account)
  reconcile  find ACKED deliveries whose event the inbox lacks (a restore) and have them redelivered";

pub const DIGEST_HELP: &str = "usage: receiver digest [--queue QUEUE] [FILE]

Reads one event from FILE (or stdin) and prints
  canonical=<the canonical bytes the inbox would store>
  sha256=<their SHA-256, as in receiver_inbox.event_digest>
or `rejected=<kind>` with exit code 3 for an event the receiver would refuse (exit code 2 is
a usage or configuration error, 1 a file that cannot be read). Without --queue it
checks the canonical form only; with it, the whole event as `consume` would (queue included).
Compare its sha256 with an inbox row's to tell a duplicate from a conflict. Writes nothing.";

pub const INSPECT_HELP: &str = "usage: receiver inspect (--event-id ID | --task-id ID) [--show-event] [--compare FILE] [--json]

Shows the inbox row(s) and the task view the receiver holds for an event or a task under
RECEIVER_NAME and the queue, and, when ORBIT_URL is set, the platform's deliveries of that
subscription (state, attempts, budget, lease; never proofs); ends with a one-line verdict:
applied, stale (view at vN), not_received, expired (attempts a of b; add budget after fixing the
cause), or conflict (digest differs from the committed record, with --compare FILE holding the
event as delivered). The frozen event is shown only with --show-event: it may hold result data.
Writes nothing; the runtime account's SELECT is enough.

environment:
  ORBIT_RECEIVER_DSN, RECEIVER_NAME   the receiver database and purpose
  ORBIT_QUEUE_ID or ORBIT_CREDENTIALS_FILE   the queue
  ORBIT_URL, ORBIT_CREDENTIALS_FILE, ORBIT_SUBSCRIPTION_ID   optional: the platform side";

pub const RETENTION_HELP: &str = "usage: receiver retention

Prints, per consumer name and queue, how many inbox rows there are, the oldest and newest
receipt (UTC), their approximate size and the number of task views. It deletes nothing, and the
runtime account cannot: `receiver prune`, as an account of its own, keeps the inbox to a window,
which must cover the platform's redelivery horizon (leases, budgets, manual retries, backup
restores): past it, a redelivery is still never applied twice, but an event reusing a pruned id
with other content is no longer seen as a conflict.

environment:
  ORBIT_RECEIVER_DSN  the receiver database";

pub const RECONCILE_HELP: &str = "usage: receiver reconcile --since TIME [--until TIME] [--dry-run] [--allow-pruned-window]

Lists the subscription's deliveries the platform holds as ACKED in [--since, --until) (RFC 3339,
e.g. 2026-12-05T10:00:00Z; --until defaults to now; at most 31 days), page by page, finds those
whose event has no inbox row under RECEIVER_NAME and the queue (one indexed lookup per page),
and asks the platform to deliver each such event again (POST /v1/deliveries/{id}/redeliver,
once per event: another ACKED delivery of the same event is reported, not redelivered), so
that it flows through `consume` and its dedup like any delivery. After a restore of the
receiver's database, start the window at the backup's point in time, or a little before.
It reads the database only (the runtime account's SELECT suffices) and needs events:read, and
events:manage unless --dry-run. Prints each missing delivery and one summary line:
`reconcile window=… deliveries=… present=… missing=… missing_events=… redelivered=… refused=… pruned=… pages=… retained_since=… seconds=… result=…`.
A delivery without a row that was ACKED before the inbox's oldest row was removed by `receiver
prune`, not lost (a restore loses the newest rows, never the oldest): it is counted as pruned
and not redelivered, unless --allow-pruned-window (its redelivery is harmless: recorded as not
applied, R-STORE-12). A platform that forgets ACKED deliveries after a retention says since when
it holds them all (retained_since); a window that starts before that is said in one line on
standard error: what the inbox lost of earlier events cannot be recovered from the platform.
See docs/recovery.md.

exit status: 0 nothing missing (or every missing one redelivered), 3 --dry-run found some
missing, 1 the platform or the database failed (what was asked stays asked), 2 usage,
configuration, a credential without the scopes, or a subscription of another queue.

environment:
  ORBIT_URL, ORBIT_CREDENTIALS_FILE (or ORBIT_TOKEN and ORBIT_QUEUE_ID), ORBIT_SUBSCRIPTION_ID
  ORBIT_RECEIVER_DSN, RECEIVER_NAME";

pub const PRUNE_HELP: &str = "usage: receiver prune --older-than WINDOW [--dry-run] [--batch-rows N] [--pause D] [--max-rate N] [--max-seconds N] [--allow-short-window]

Deletes the inbox rows of RECEIVER_NAME and the queue received more than WINDOW ago (30d; units
s, m, h, d), oldest first, in batches of --batch-rows (1000; at most 10000), each its own short
transaction, at least --pause apart (20ms; ms or s) and at most --max-rate rows a second (5000),
so that applies beside it keep their pace. Task views are never touched. A
redelivery of a pruned event is still never applied twice (it is recorded again as stale), but
an event reusing a pruned id with other content is no longer seen as a conflict: the window must
cover every redelivery, manual retry and restore (docs/capacity.md). Refuses a window under 24h
unless --allow-short-window. --dry-run prints what it would delete and deletes nothing.
--max-seconds stops cleanly between batches; a second run continues; two at once are safe.
SIGINT or SIGTERM stops after the batch in flight. Never calls the platform.

Prints one line at the end: rows, bytes, batches, seconds, the oldest row left; progress on a
terminal. Exit status: 0 nothing older than the window is left (or a dry run), 1 a database
error (what was deleted stays deleted), 2 bad usage or configuration, 4 stopped by
--max-seconds or a signal with rows left.

environment:
  ORBIT_RECEIVER_DSN  the receiver database, as the prune account (SELECT and DELETE on
                      receiver_inbox only: schema/grants.sql)
  RECEIVER_NAME       the receiver's purpose, default task-result-view
  ORBIT_QUEUE_ID or ORBIT_CREDENTIALS_FILE   the queue";

pub const INIT_HELP: &str = "usage: receiver init

Creates receiver_inbox and receiver_task_views (schema/schema.sql) in the database
ORBIT_RECEIVER_DSN names, records the schema's version in receiver_schema_versions
(schema/migrations.sql), and prints `receiver_schema_initialized=true foreign_keys=0` and
`schema_version=<N>`. Fails, changing nothing, if either table exists (a later release's
schema changes reach an existing database through `receiver migrate`). The account is the init
account (schema/grants.sql, step 1).

environment:
  ORBIT_RECEIVER_DSN  mysql://user:password@host:port/<database>; the database is required;
                      a host other than loopback needs ?ssl-mode=VERIFY_IDENTITY (or REQUIRED)";

pub const MIGRATE_HELP: &str =
    "usage: receiver migrate [--dry-run] [--allow-blocking] [--lock-wait D]

Moves the receiver database ORBIT_RECEIVER_DSN names from its recorded schema version (or, when
none is recorded, the one its tables' shape shows) to this release's, one DDL statement per
step, each recorded in receiver_schema_versions as started before it runs and as applied after.
Prints `schema_version=<found> target=<this release's>`, then a line per step, then a summary;
a database already at the target is left as it is. A run cut short (killed, disconnected, the
server restarted) is finished by the next run. Two runs at once: the second waits for the
first's lock (receiver_schema_lock), saying for whom, at most --lock-wait (300s; s or m).
--dry-run prints each step's statement and the algorithm and lock the server will use, and
changes nothing (the runtime account may run it). A step that would copy a table or block its
writes is refused unless --allow-blocking. Runs as the init account (schema/grants.sql, step 1),
never as the runtime or prune account. See docs/upgrading.md.

exit status: 0 at the target (or a dry run), 1 a database failure (what was applied stays
applied; run it again to resume), 2 usage, configuration or an account that is not the init
account, 3 the database is not a receiver inbox, 4 its schema is newer than this release knows
(never migrated down), 5 a blocking step without --allow-blocking, 6 another run kept the lock.

environment:
  ORBIT_RECEIVER_DSN  the receiver database, as the init account";

pub const DEMO_HELP: &str = "usage: receiver demo

Creates a subscription for task.cancelled on the configured queue, submits and cancels one
task, consumes its event (running the business transaction twice), waits for the ACK to be
confirmed, pauses the subscription and prints
  task=<id> state=CANCELLED inbox_duplicate=true applied_events=1
  ack_confirmed=1 pending=0 subscription_enabled=false
Another program's event on the queue is refused, not ACKed. At most 20 s. On failure: exit 1,
one line naming the step, every record kept.

environment:
  ORBIT_URL               the platform, e.g. http://127.0.0.1:8080 (plain http to loopback only)
  ORBIT_CREDENTIALS_FILE  the credentials file from orbit-dev bootstrap (mode 0600)
  ORBIT_TOKEN             overrides the file's token
  ORBIT_QUEUE_ID          overrides the file's queue
  ORBIT_RECEIVER_DSN      the receiver database (runtime account)
  RECEIVER_NAME           the receiver's purpose, default task-result-view
  RECEIVER_LOG_FORMAT     text (default) or json";

pub const CONSUME_HELP: &str = "usage: receiver consume

Applies every delivery of the subscription ORBIT_SUBSCRIPTION_ID, four at a time unless
RECEIVER_CONCURRENCY says otherwise, logging one
line per delivery (applied, duplicate, stale, conflict, rejected:<kind>, commit_unconfirmed,
unreplicated, storage_error, timeout, write_failed). Refuses to start if the subscription's
queue is not the configured one, or if RECEIVER_APPLY_TIMEOUT does not leave the lease a second
for the ACK. While the database is unavailable or read-only (at start or later) it takes no
delivery and says so.
SIGINT or SIGTERM cancels in-flight handlers and exits within 10 s; the subscription is never
paused.

environment:
  ORBIT_SUBSCRIPTION_ID   the 32-character subscription id (required)
  RECEIVER_APPLY_TIMEOUT  the budget of one apply: 5s unless set, e.g. 2500ms
  RECEIVER_CONCURRENCY    deliveries applied at once, 1 to 256: 4 unless set
  RECEIVER_METRICS_LISTEN where to serve /metrics, /healthz, /readyz (unset: nowhere)
  RECEIVER_REQUIRE_REPLICA_ACK  1: ACK only what a replica holds (lossless semi-sync);
                          0 unless set
  ORBIT_URL, ORBIT_CREDENTIALS_FILE, ORBIT_TOKEN, ORBIT_QUEUE_ID, ORBIT_RECEIVER_DSN,
  RECEIVER_NAME, RECEIVER_LOG_FORMAT   as for demo";

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Invocation, Usage> {
        parse(args.iter().map(OsString::from).collect())
    }

    fn line(args: &[&str]) -> String {
        run(args).unwrap_err().0
    }

    #[test]
    fn migrate_and_its_flags() {
        assert_eq!(
            run(&["migrate"]),
            Ok(Invocation::Run(Command::Migrate(MigrateArgs {
                dry_run: false,
                allow_blocking: false,
                lock_wait: DEFAULT_LOCK_WAIT,
            })))
        );
        assert_eq!(
            run(&[
                "migrate",
                "--dry-run",
                "--allow-blocking",
                "--lock-wait",
                "2m"
            ]),
            Ok(Invocation::Run(Command::Migrate(MigrateArgs {
                dry_run: true,
                allow_blocking: true,
                lock_wait: std::time::Duration::from_secs(120),
            })))
        );
        assert_eq!(
            line(&["migrate", "--lock-wait", "-1s"]),
            "receiver migrate: --lock-wait -1s: cannot be negative (receiver migrate --help)"
        );
        assert_eq!(
            line(&["migrate", "--force"]),
            "receiver migrate: unknown flag `--force` (receiver migrate --help)"
        );
    }

    #[test]
    fn commands_and_their_flags() {
        assert_eq!(run(&["init"]), Ok(Invocation::Run(Command::Init)));
        assert_eq!(run(&["consume"]), Ok(Invocation::Run(Command::Consume)));
        assert_eq!(
            run(&["digest", "--queue", "q-1", "e.json"]),
            Ok(Invocation::Run(Command::Digest {
                queue: Some(QueueId::new("q-1").unwrap()),
                file: Some("e.json".into())
            }))
        );
        assert_eq!(
            run(&["inspect", "--task-id", "t-1", "--json", "--show-event"]),
            Ok(Invocation::Run(Command::Inspect {
                target: Target::Task(TaskId::new("t-1").unwrap()),
                show_event: true,
                json: true,
                compare: None
            }))
        );
    }

    #[test]
    fn help_is_asked_for_with_help_or_h() {
        for (args, text) in [
            (&["help"][..], USAGE),
            (&["--help"], USAGE),
            (&["-h"], USAGE),
            (&["init", "--help"], INIT_HELP),
            (&["consume", "-h"], CONSUME_HELP),
            (&["digest", "--help"], DIGEST_HELP),
            (&["inspect", "-h"], INSPECT_HELP),
            (&["retention", "--help"], RETENTION_HELP),
            (&["prune", "--help"], PRUNE_HELP),
            (&["prune", "--older-than", "30d", "-h"], PRUNE_HELP),
            (&["demo", "--help"], DEMO_HELP),
            // Anywhere on the line, before the command or among bad values: never run.
            (&["--help", "prune", "--older-than", "30d"], PRUNE_HELP),
            (&["-h", "init"], INIT_HELP),
            (
                &["reconcile", "--since", "yesterday", "--help"],
                RECONCILE_HELP,
            ),
            (&["inspect", "--frob", "-h"], INSPECT_HELP),
            (&["--version", "consume", "--help"], CONSUME_HELP),
            (&["launch", "--help"], USAGE),
        ] {
            assert_eq!(run(args), Ok(Invocation::Help(text)), "{args:?}");
        }
    }

    #[test]
    fn the_version_is_asked_for_with_version_or_capital_v_anywhere() {
        for args in [
            &["--version"][..],
            &["-V"],
            &["prune", "--older-than", "1s", "--version"],
        ] {
            assert_eq!(run(args), Ok(Invocation::Version), "{args:?}");
        }
    }

    #[test]
    fn every_usage_error_is_the_program_s_own_line() {
        assert_eq!(
            line(&["launch"]),
            "receiver: unknown command `launch`; the commands are init, migrate, demo, consume, digest, inspect, retention, prune, reconcile, help (`receiver --help`)"
        );
        assert_eq!(
            line(&[]),
            "receiver: no command given; the commands are init, migrate, demo, consume, digest, inspect, retention, prune, reconcile, help (`receiver --help`)"
        );
        assert_eq!(
            line(&["--frob", "init"]),
            "receiver: unknown flag `--frob` before the command; the commands are init, migrate, demo, consume, digest, inspect, retention, prune, reconcile, help (`receiver --help`)"
        );
        assert_eq!(
            line(&["consume", "--fast"]),
            "receiver consume: unexpected argument `--fast`: configuration comes from the environment (receiver consume --help)"
        );
        assert_eq!(
            line(&["init", "now"]),
            "receiver init: unexpected argument `now`: configuration comes from the environment (receiver init --help)"
        );
        assert_eq!(
            line(&["digest", "--fast"]),
            "receiver digest: unknown flag `--fast` (receiver digest --help)"
        );
        assert_eq!(
            line(&["digest", "a.json", "b.json"]),
            "receiver digest: unexpected argument `b.json` (receiver digest --help)"
        );
        assert_eq!(
            line(&["digest", "--queue"]),
            "receiver digest: --queue needs a queue id (receiver digest --help)"
        );
        assert!(line(&["digest", "--queue", ""]).starts_with("receiver digest: --queue "));
        assert_eq!(
            line(&["inspect"]),
            "receiver inspect: give --event-id or --task-id (receiver inspect --help)"
        );
        assert_eq!(
            line(&["inspect", "--event-id", "e", "--task-id", "t"]),
            "receiver inspect: give one of --event-id or --task-id (receiver inspect --help)"
        );
        assert_eq!(
            line(&["inspect", "--event-id"]),
            "receiver inspect: --event-id needs an id (receiver inspect --help)"
        );
        assert_eq!(
            line(&["inspect", "--task-id", "t", "--compare"]),
            "receiver inspect: --compare needs a file (receiver inspect --help)"
        );
        assert_eq!(
            line(&["inspect", "--task-id", "t", "extra"]),
            "receiver inspect: unexpected argument `extra` (receiver inspect --help)"
        );
    }

    #[test]
    fn prune_reads_its_window_batch_pause_and_limit() {
        assert_eq!(
            run(&["prune", "--older-than", "30d"]),
            Ok(Invocation::Run(Command::Prune(PruneArgs {
                older_than: Window {
                    text: "30d".into(),
                    seconds: 30 * 86_400
                },
                batch_rows: DEFAULT_BATCH_ROWS,
                pause: DEFAULT_PAUSE,
                max_rate: DEFAULT_MAX_RATE,
                max_seconds: None,
                dry_run: false,
            })))
        );
        let Ok(Invocation::Run(Command::Prune(p))) = run(&[
            "prune",
            "--older-than",
            "90m",
            "--allow-short-window",
            "--batch-rows",
            "10000",
            "--pause",
            "0",
            "--max-seconds",
            "60",
            "--max-rate",
            "20000",
            "--dry-run",
        ]) else {
            panic!("refused")
        };
        assert_eq!(
            (
                p.older_than.seconds,
                p.batch_rows,
                p.pause,
                p.max_seconds,
                p.dry_run
            ),
            (5400, 10_000, std::time::Duration::ZERO, Some(60), true)
        );
        assert_eq!(p.max_rate, 20_000);
        for (window, seconds) in [
            ("86400s", 86_400),
            ("1440m", 86_400),
            ("24h", 86_400),
            ("7d", 604_800),
        ] {
            let Ok(Invocation::Run(Command::Prune(p))) = run(&["prune", "--older-than", window])
            else {
                panic!("{window} refused")
            };
            assert_eq!(p.older_than.seconds, seconds, "{window}");
        }
        let Ok(Invocation::Run(Command::Prune(p))) =
            run(&["prune", "--older-than", "2d", "--pause", "1s"])
        else {
            panic!("refused")
        };
        assert_eq!(p.pause, std::time::Duration::from_secs(1));
    }

    #[test]
    fn prune_refuses_every_bad_value_with_one_line() {
        let help = "(receiver prune --help)";
        for (args, problem) in [
            (&["prune"][..], "give --older-than, the window to keep (e.g. 30d)"),
            (&["prune", "--older-than", "23h"], "--older-than 23h is under the 24h floor: a window shorter than the platform's redelivery horizon turns redeliveries into first receipts; add --allow-short-window if that is meant"),
            (&["prune", "--older-than", "0d", "--allow-short-window"], "--older-than 0d: must be more than zero"),
            (&["prune", "--older-than", "-1d"], "--older-than -1d: cannot be negative"),
            (&["prune", "--older-than", "30w"], "--older-than 30w: unknown unit `w` (use s, m, h, d)"),
            (&["prune", "--older-than", "30"], "--older-than 30: needs a unit (s, m, h, d)"),
            (&["prune", "--older-than", "d"], "--older-than d: needs a whole number and a unit (s, m, h, d), e.g. 30d"),
            (&["prune", "--older-than", "1.5d"], "--older-than 1.5d: unknown unit `.5d` (use s, m, h, d)"),
            (&["prune", "--older-than", "99999999999999999999d"], "--older-than 99999999999999999999d: is too large"),
            (&["prune", "--older-than", "30d", "--batch-rows", "0"], "--batch-rows 0: must be a whole number from 1 to 10000"),
            (&["prune", "--older-than", "30d", "--batch-rows", "10001"], "--batch-rows 10001: must be a whole number from 1 to 10000"),
            (&["prune", "--older-than", "30d", "--batch-rows", "-5"], "--batch-rows -5: must be a whole number from 1 to 10000"),
            (&["prune", "--older-than", "30d", "--pause", "5m"], "--pause 5m: unknown unit `m` (use ms, s)"),
            (&["prune", "--older-than", "30d", "--pause", "61s"], "--pause 61s: at most 60s"),
            (&["prune", "--older-than", "30d", "--max-seconds", "0"], "--max-seconds 0: must be a whole number of seconds, more than 0"),
            (&["prune", "--older-than", "30d", "--max-rate", "0"], "--max-rate 0: must be a whole number of rows a second, from 1 to 1000000"),
            (&["prune", "--older-than", "30d", "--fast"], "unknown flag `--fast`"),
            (&["prune", "--older-than", "30d", "now"], "unexpected argument `now`"),
            (&["prune", "--older-than"], "--older-than needs a window, e.g. 30d"),
        ] {
            assert_eq!(line(args), format!("receiver prune: {problem} {help}"), "{args:?}");
        }
    }

    #[test]
    fn an_argument_that_is_not_utf8_is_named_not_read() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff, 0xfe]);
        assert_eq!(
            parse(vec![OsString::from("digest"), bad]).unwrap_err().0,
            "receiver: an argument is not valid UTF-8"
        );
    }
}
