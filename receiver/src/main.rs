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
  init     create the receiver's two tables, once
  demo     one task's cancellation end to end on a new subscription
  consume  apply an existing subscription's deliveries until SIGINT/SIGTERM";

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
configured one. SIGINT or SIGTERM cancels in-flight handlers and exits within 10 s; the
subscription is never paused.

environment:
  ORBIT_SUBSCRIPTION_ID   the 32-character subscription id (required)
  ORBIT_URL, ORBIT_CREDENTIALS_FILE, ORBIT_TOKEN, ORBIT_QUEUE_ID, ORBIT_RECEIVER_DSN,
  RECEIVER_NAME, RECEIVER_LOG_FORMAT   as for demo";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["init"] => init(),
        ["demo"] => demo(),
        ["consume"] => consume(),
        ["init", "--help" | "-h"] => help(INIT_HELP),
        ["demo", "--help" | "-h"] => help(DEMO_HELP),
        ["consume", "--help" | "-h"] => help(CONSUME_HELP),
        ["help" | "--help" | "-h"] => help(USAGE),
        [] => {
            eprintln!("receiver: no command given\n{USAGE}");
            ExitCode::from(2)
        }
        [cmd @ ("init" | "demo" | "consume"), other, ..] => {
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
    match runtime().block_on(receiver::schema::init(&config.dsn)) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("receiver init: {e}");
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
    match runtime().block_on(receiver::demo::run(&config)) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("receiver demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn consume() -> ExitCode {
    let config = match ConsumeConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("consume", errors),
    };
    logging(config.log);
    let rt = runtime();
    let stop = async {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            },
            _ => std::future::pending().await,
        }
    };
    let result = rt.block_on(receiver::consume::run(&config, stop));
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
