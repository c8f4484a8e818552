//! The `receiver` binary: parse the command and its configuration, call the library, map the
//! result to output and an exit code. Nothing else lives here.
//!
//! Exit codes: 0 success, 1 the command failed, 2 bad usage or configuration.

use std::process::ExitCode;

use receiver::config::{
    ConfigErrors, ConsumeConfig, DemoConfig, InitConfig, LogFormat, ProcessEnv,
};

const USAGE: &str = "usage: receiver <command>   (receiver <command> --help for details)

commands:
  init       create the receiver's two tables, once
  demo       one task's cancellation end to end on a new subscription
  consume    apply an existing subscription's deliveries until SIGINT/SIGTERM
  digest     print an event's canonical bytes and SHA-256 (read-only)
  inspect    show what the receiver (and the platform) recorded for an event or a task (read-only)
  retention  inbox size and age per consumer and queue (read-only)";

const DIGEST_HELP: &str = "usage: receiver digest [--queue QUEUE] [FILE]

Reads one event from FILE (or stdin) and prints
  canonical=<the canonical bytes the inbox would store>
  sha256=<their SHA-256, as in receiver_inbox.event_digest>
or `rejected=<kind>` with exit code 3 for an event the receiver would refuse (exit code 2 is
a usage or configuration error, 1 a file that cannot be read). Without --queue it
checks the canonical form only; with it, the whole event as `consume` would (queue included).
Compare its sha256 with an inbox row's to tell a duplicate from a conflict. Writes nothing.";

const INSPECT_HELP: &str = "usage: receiver inspect (--event-id ID | --task-id ID) [--show-event] [--compare FILE] [--json]

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

const RETENTION_HELP: &str = "usage: receiver retention

Prints, per consumer name and queue, how many inbox rows there are, the oldest and newest
receipt (UTC), their approximate size and the number of task views. It deletes nothing, and the
runtime account cannot: deleting dedup records inside the platform's redelivery window (leases,
budgets, manual retries, backup restores) lets a redelivery apply its effect a second time.

environment:
  ORBIT_RECEIVER_DSN  the receiver database";

const INIT_HELP: &str = "usage: receiver init

Creates receiver_inbox and receiver_task_views (schema/schema.sql) in the database
ORBIT_RECEIVER_DSN names, and prints `receiver_schema_initialized=true foreign_keys=0`.
Fails, changing nothing, if either table exists. The account needs CREATE on that database.

environment:
  ORBIT_RECEIVER_DSN  mysql://user:password@host:port/<database>; the database is required;
                      a host other than loopback needs ?ssl-mode=VERIFY_IDENTITY (or REQUIRED)";

const DEMO_HELP: &str = "usage: receiver demo

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

const CONSUME_HELP: &str = "usage: receiver consume

Applies every delivery of the subscription ORBIT_SUBSCRIPTION_ID, four at a time, logging one
line per delivery (applied, duplicate, stale, conflict, rejected:<kind>, commit_unconfirmed,
storage_error, timeout, write_failed). Refuses to start if the subscription's queue is not the
configured one, or if RECEIVER_APPLY_TIMEOUT does not leave the lease a second for the ACK.
While the database is unavailable (at start or later) it takes no delivery and says so.
SIGINT or SIGTERM cancels in-flight handlers and exits within 10 s; the subscription is never
paused.

environment:
  ORBIT_SUBSCRIPTION_ID   the 32-character subscription id (required)
  RECEIVER_APPLY_TIMEOUT  the budget of one apply: 5s unless set, e.g. 2500ms
  RECEIVER_METRICS_LISTEN where to serve /metrics, /healthz, /readyz (unset: nowhere)
  ORBIT_URL, ORBIT_CREDENTIALS_FILE, ORBIT_TOKEN, ORBIT_QUEUE_ID, ORBIT_RECEIVER_DSN,
  RECEIVER_NAME, RECEIVER_LOG_FORMAT   as for demo";

pub fn main() -> ExitCode {
    let args: Vec<String> = match std::env::args_os()
        .skip(1)
        .map(std::ffi::OsString::into_string)
        .collect::<Result<_, _>>()
    {
        Ok(args) => args,
        Err(_) => {
            eprintln!("receiver: an argument is not valid UTF-8");
            return ExitCode::from(2);
        }
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["init"] => init(),
        ["demo"] => demo(),
        ["consume"] => consume(),
        ["init", "--help" | "-h"] => help(INIT_HELP),
        ["digest", "--help" | "-h", ..] => help(DIGEST_HELP),
        ["inspect", "--help" | "-h", ..] => help(INSPECT_HELP),
        ["retention", "--help" | "-h"] => help(RETENTION_HELP),
        ["digest", rest @ ..] => digest(rest),
        ["inspect", rest @ ..] => inspect(rest),
        ["retention"] => retention(),
        ["demo", "--help" | "-h"] => help(DEMO_HELP),
        ["consume", "--help" | "-h"] => help(CONSUME_HELP),
        ["help" | "--help" | "-h"] => help(USAGE),
        [] => {
            eprintln!("receiver: no command given\n{USAGE}");
            ExitCode::from(2)
        }
        [cmd @ ("init" | "demo" | "consume" | "retention"), other, ..] => {
            eprintln!("receiver {cmd}: unexpected argument `{other}`: configuration comes from the environment (receiver {cmd} --help)");
            ExitCode::from(2)
        }
        [other, ..] => {
            eprintln!("receiver: unknown command `{other}`: run `receiver help` for the commands");
            ExitCode::from(2)
        }
    }
}

fn help(text: &str) -> ExitCode {
    println!("{text}");
    ExitCode::SUCCESS
}

fn config_failed(command: &str, errors: ConfigErrors) -> ExitCode {
    for e in errors.0 {
        eprintln!("receiver {command}: {e}");
    }
    ExitCode::from(2)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts")
}

/// Log lines go to stderr: human-readable, or JSON when asked.
fn logging(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

fn init() -> ExitCode {
    let config = match InitConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("init", errors),
    };
    #[cfg(not(feature = "mutants"))]
    let init = result_inbox::schema::init(&config.dsn);
    #[cfg(feature = "mutants")]
    let init = receiver::mutant::init(&config.dsn);
    finish("init", runtime().block_on(init))
}

/// Prints a command's report on stdout (exit 0), or its error as one line on stderr (exit 1).
fn finish<T: std::fmt::Display, E: std::fmt::Display>(
    command: &str,
    result: Result<T, E>,
) -> ExitCode {
    match result {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("receiver {command}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn demo() -> ExitCode {
    let config = match DemoConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("demo", errors),
    };
    logging(config.log);
    finish("demo", runtime().block_on(receiver::demo::run(&config)))
}

fn consume() -> ExitCode {
    let config = match ConsumeConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("consume", errors),
    };
    logging(config.run.log);
    let rt = runtime();
    let result = rt.block_on(async {
        // Registered before anything else: a signal during start-up also ends the process
        // cleanly (exit 0), never by the signal's default action.
        use tokio::signal::unix::{signal, SignalKind};
        let (mut term, mut int) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => (term, int),
            (Err(e), _) | (_, Err(e)) => return Err(receiver::consume::ConsumeError::Signals(e)),
        };
        let stop = async move {
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            }
        };
        #[cfg(not(feature = "mutants"))]
        return receiver::consume::run(&config, stop).await;
        #[cfg(feature = "mutants")]
        return receiver::mutant::consume(&config, stop).await;
    });
    // Do not wait for stray blocking work: the 10 s promise holds.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("receiver consume: {e}");
            ExitCode::FAILURE
        }
    }
}

fn digest(args: &[&str]) -> ExitCode {
    let mut queue = None;
    let mut file = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "--queue" => match it.next().map(|q| result_inbox::QueueId::new(*q)) {
                Some(Ok(q)) => queue = Some(q),
                Some(Err(e)) => return usage("digest", &format!("--queue {e}")),
                None => return usage("digest", "--queue needs a queue id"),
            },
            flag if flag.starts_with("--") => {
                return usage("digest", &format!("unknown flag `{flag}`"))
            }
            path if file.is_none() => file = Some(path),
            extra => return usage("digest", &format!("unexpected argument `{extra}`")),
        }
    }
    let read = match file {
        Some(path) => receiver::inspect::read_event_file(std::path::Path::new(path)),
        None => {
            use std::io::Read;
            let mut buf = Vec::new();
            std::io::stdin()
                .take(result_inbox::canonical::MAX_EVENT_BYTES as u64 + 1)
                .read_to_end(&mut buf)
                .map(|_| buf)
                .map_err(|e| format!("cannot read stdin: {e}"))
        }
    };
    let raw = match read {
        Ok(r) => r,
        Err(e) => {
            eprintln!("receiver digest: {e}");
            return ExitCode::FAILURE;
        }
    };
    match receiver::inspect::digest(&raw, queue.as_ref()) {
        Ok((bytes, d)) => {
            println!("canonical={}", String::from_utf8_lossy(&bytes));
            println!("sha256={d}");
            ExitCode::SUCCESS
        }
        Err(kind) => {
            println!("rejected={kind}");
            ExitCode::from(REJECTED)
        }
    }
}

/// The exit code of `digest` and `inspect --compare` for an event the receiver refuses: not 2,
/// which every command uses for a usage or configuration error.
const REJECTED: u8 = 3;

fn usage(command: &str, problem: &str) -> ExitCode {
    eprintln!("receiver {command}: {problem} (receiver {command} --help)");
    ExitCode::from(2)
}

fn inspect(args: &[&str]) -> ExitCode {
    use receiver::inspect::Target;
    let mut target = None;
    let (mut show_event, mut json, mut compare) = (false, false, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "--event-id" | "--task-id" => {
                let Some(v) = it.next() else {
                    return usage("inspect", &format!("{a} needs an id"));
                };
                let t = if *a == "--event-id" {
                    result_inbox::EventId::new(*v).map(Target::Event)
                } else {
                    result_inbox::TaskId::new(*v).map(Target::Task)
                };
                match t {
                    Ok(t) if target.is_none() => target = Some(t),
                    Ok(_) => return usage("inspect", "give one of --event-id or --task-id"),
                    Err(e) => return usage("inspect", &format!("{a} {e}")),
                }
            }
            "--show-event" => show_event = true,
            "--json" => json = true,
            "--compare" => match it.next() {
                Some(path) => compare = Some(*path),
                None => return usage("inspect", "--compare needs a file"),
            },
            other => return usage("inspect", &format!("unexpected argument `{other}`")),
        }
    }
    let Some(target) = target else {
        return usage("inspect", "give --event-id or --task-id");
    };
    let config = match receiver::config::InspectConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("inspect", errors),
    };
    let compared = match compare {
        None => None,
        Some(path) => match receiver::inspect::read_event_file(std::path::Path::new(path)) {
            Ok(raw) => match receiver::inspect::digest(&raw, Some(&config.queue)) {
                Ok((_, d)) => Some(d),
                Err(kind) => {
                    eprintln!("receiver inspect: the event in {path} is rejected: {kind}");
                    return ExitCode::from(REJECTED);
                }
            },
            Err(e) => {
                eprintln!("receiver inspect: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    match runtime().block_on(receiver::inspect::inspect(
        &config,
        &target,
        show_event,
        compared.as_ref(),
    )) {
        Ok(report) => {
            if json {
                println!("{}", report.json());
            } else {
                println!("{}", report.text());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("receiver inspect: storage_error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn retention() -> ExitCode {
    let config = match InitConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("retention", errors),
    };
    match runtime().block_on(receiver::inspect::retention(&config.dsn)) {
        Ok(rows) if rows.is_empty() => {
            println!("inbox: empty");
            ExitCode::SUCCESS
        }
        Ok(rows) => {
            for r in rows {
                println!(
                    "consumer={} queue={} inbox_rows={} oldest={} newest={} approx_bytes={} views={}",
                    r.consumer, r.queue, r.inbox_rows, r.oldest, r.newest, r.approx_bytes, r.views
                );
            }
            println!("nothing deleted: retention must cover the platform's redelivery window (see receiver retention --help)");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("receiver retention: storage_error: {e}");
            ExitCode::FAILURE
        }
    }
}
