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
    /// Run a command.
    Run(Command),
}

/// A command and its flags, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Init,
    Demo,
    Consume,
    Retention,
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
    #[arg(short, long)]
    help: bool,
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(Subcommand)]
enum Sub {
    Init(Bare),
    Demo(Bare),
    Consume(Bare),
    Retention(Bare),
    Digest(DigestArgs),
    Inspect(InspectArgs),
    Help,
}

/// A command whose configuration is all in the environment.
#[derive(Args)]
#[command(disable_help_flag = true)]
struct Bare {
    #[arg(short, long)]
    help: bool,
}

#[derive(Args)]
#[command(disable_help_flag = true)]
struct DigestArgs {
    #[arg(short, long)]
    help: bool,
    #[arg(long, overrides_with = "queue")]
    queue: Option<String>,
    file: Option<String>,
}

#[derive(Args)]
#[command(disable_help_flag = true)]
struct InspectArgs {
    #[arg(short, long)]
    help: bool,
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
    let command = args.first().cloned().unwrap_or_default();
    let cli = Cli::try_parse_from(std::iter::once("receiver".to_owned()).chain(args))
        .map_err(|e| usage_line(&command, &e))?;
    let Some(sub) = cli.command else {
        return if cli.help {
            Ok(Invocation::Help(USAGE))
        } else {
            Err(Usage(format!("receiver: no command given\n{USAGE}")))
        };
    };
    let (help, text, command) = match sub {
        Sub::Help => (true, USAGE, None),
        Sub::Init(b) => (b.help, INIT_HELP, Some(Command::Init)),
        Sub::Demo(b) => (b.help, DEMO_HELP, Some(Command::Demo)),
        Sub::Consume(b) => (b.help, CONSUME_HELP, Some(Command::Consume)),
        Sub::Retention(b) => (b.help, RETENTION_HELP, Some(Command::Retention)),
        Sub::Digest(d) if d.help => (true, DIGEST_HELP, None),
        Sub::Digest(d) => (false, DIGEST_HELP, Some(digest(d)?)),
        Sub::Inspect(i) if i.help => (true, INSPECT_HELP, None),
        Sub::Inspect(i) => (false, INSPECT_HELP, Some(inspect(i)?)),
    };
    match command {
        Some(command) if !help => Ok(Invocation::Run(command)),
        _ => Ok(Invocation::Help(text)),
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
            "receiver: unknown command `{}`: run `receiver help` for the commands",
            context(ContextKind::InvalidSubcommand)
        )),
        ErrorKind::UnknownArgument => match command {
            "digest" if flag.starts_with("--") => {
                usage("digest", &format!("unknown flag `{flag}`"))
            }
            "digest" | "inspect" => usage(command, &format!("unexpected argument `{flag}`")),
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
                _ => "an id",
            };
            usage(command, &format!("{flag} needs {needs}"))
        }
        _ => usage(command, &format!("cannot read the arguments: {}", e.kind())),
    }
}

pub const USAGE: &str = "usage: receiver <command>   (receiver <command> --help for details)

commands:
  init       create the receiver's two tables, once
  demo       one task's cancellation end to end on a new subscription
  consume    apply an existing subscription's deliveries until SIGINT/SIGTERM
  digest     print an event's canonical bytes and SHA-256 (read-only)
  inspect    show what the receiver (and the platform) recorded for an event or a task (read-only)
  retention  inbox size and age per consumer and queue (read-only)";

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
runtime account cannot: deleting dedup records inside the platform's redelivery window (leases,
budgets, manual retries, backup restores) lets a redelivery apply its effect a second time.

environment:
  ORBIT_RECEIVER_DSN  the receiver database";

pub const INIT_HELP: &str = "usage: receiver init

Creates receiver_inbox and receiver_task_views (schema/schema.sql) in the database
ORBIT_RECEIVER_DSN names, and prints `receiver_schema_initialized=true foreign_keys=0`.
Fails, changing nothing, if either table exists. The account needs CREATE on that database.

environment:
  ORBIT_RECEIVER_DSN  mysql://user:password@host:port/<database>; the database is required;
                      a host other than loopback needs ?ssl-mode=VERIFY_IDENTITY (or REQUIRED)";

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
            (&["demo", "--help"], DEMO_HELP),
        ] {
            assert_eq!(run(args), Ok(Invocation::Help(text)), "{args:?}");
        }
    }

    #[test]
    fn every_usage_error_is_the_program_s_own_line() {
        assert_eq!(
            line(&["launch"]),
            "receiver: unknown command `launch`: run `receiver help` for the commands"
        );
        assert_eq!(line(&[]), format!("receiver: no command given\n{USAGE}"));
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
    fn an_argument_that_is_not_utf8_is_named_not_read() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff, 0xfe]);
        assert_eq!(
            parse(vec![OsString::from("digest"), bad]).unwrap_err().0,
            "receiver: an argument is not valid UTF-8"
        );
    }
}
