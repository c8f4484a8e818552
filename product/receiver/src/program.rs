//! The `receiver` program: read the command line ([`crate::cli`]) and the configuration, call
//! the library, map the result to output and an exit code. The binary's `main` is
//! [`main`]`(&`[`RECEIVER`]`)`; nothing else lives there.
//!
//! A [`Program`] names the parts a test build may replace (how `init` makes the schema, how
//! `consume` runs, where `consume` reads its configuration): the conformance kit's mutants
//! run this same program with other parts (`test-tools/receiver-test-builds`). The parts are
//! data, so the program has no branch for them.
//!
//! Exit codes: 0 success, 1 the command failed, 2 bad usage or configuration.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

use result_inbox::schema::{InitError, InitReport};
use result_inbox::Dsn;

use crate::cli::{self, Command, Invocation};
use crate::config::{
    ConfigErrors, ConsumeConfig, DemoConfig, InitConfig, LogFormat, ProcessEnv, PruneConfig, Source,
};
use crate::consume::ConsumeError;
use crate::inspect::Target;

/// What `init` returns.
pub type InitFuture<'a> = Pin<Box<dyn Future<Output = Result<InitReport, InitError>> + 'a>>;
/// The signal that stops `consume`, named.
pub type Stop = Pin<Box<dyn Future<Output = &'static str> + Send>>;
/// What `consume` returns.
pub type ConsumeFuture<'a> = Pin<Box<dyn Future<Output = Result<(), ConsumeError>> + 'a>>;

/// The parts of the program a test build may replace.
#[derive(Clone, Copy)]
pub struct Program {
    /// Where `consume` reads its configuration.
    pub consume_source: &'static (dyn Source + Sync),
    /// Makes the schema (`receiver init`).
    pub init: for<'a> fn(&'a Dsn) -> InitFuture<'a>,
    /// Runs `receiver consume` until the stop.
    pub consume: for<'a> fn(&'a ConsumeConfig, Stop) -> ConsumeFuture<'a>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Program")
    }
}

/// The `receiver` program itself.
pub const RECEIVER: Program = Program {
    consume_source: &ProcessEnv,
    init: init_schema,
    consume: run_consume,
};

fn init_schema(dsn: &Dsn) -> InitFuture<'_> {
    Box::pin(result_inbox::schema::init(dsn))
}

fn run_consume(config: &ConsumeConfig, stop: Stop) -> ConsumeFuture<'_> {
    Box::pin(crate::consume::run(config, stop))
}

/// Runs `program` on this process's arguments: what the `receiver` binary's `main` is, and
/// what a test build's is with its own [`Program`].
pub fn main(program: &Program) -> ExitCode {
    match cli::parse(std::env::args_os().skip(1).collect()) {
        Ok(Invocation::Help(text)) => {
            about::print(text);
            ExitCode::SUCCESS
        }
        Ok(Invocation::Version) => {
            about::print(&about::version_line_with(
                "receiver",
                &format!("schema version {}", result_inbox::migrate::known_version()),
            ));
            ExitCode::SUCCESS
        }
        Ok(Invocation::Run(command)) => match command {
            Command::Init => init(program),
            Command::Migrate(args) => migrate(&args),
            Command::Demo => demo(),
            Command::Consume => consume(program),
            Command::Retention => retention(),
            Command::Prune(args) => prune(&args),
            Command::Reconcile(args) => reconcile(&args),
            Command::Digest { queue, file } => digest(queue, file),
            Command::Inspect {
                target,
                show_event,
                json,
                compare,
            } => inspect(target, show_event, json, compare),
        },
        Err(cli::Usage(line)) => {
            eprintln!("{line}");
            ExitCode::from(2)
        }
    }
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

fn init(program: &Program) -> ExitCode {
    let config = match InitConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("init", errors),
    };
    finish("init", runtime().block_on((program.init)(&config.dsn)))
}

/// `receiver migrate`: results on stdout, waits on stderr.
struct Lines;

impl result_inbox::migrate::Say for Lines {
    fn line(&mut self, line: String) {
        println!("{line}");
    }
    fn waiting(&mut self, line: String) {
        eprintln!("receiver migrate: {line}");
    }
}

fn migrate(args: &crate::cli::MigrateArgs) -> ExitCode {
    let config = match InitConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("migrate", errors),
    };
    let options = result_inbox::migrate::Options {
        dry_run: args.dry_run,
        allow_blocking: args.allow_blocking,
        lock_wait: args.lock_wait,
        by: result_inbox::ledger::this_run(&format!(
            "receiver {} migrate",
            env!("CARGO_PKG_VERSION")
        )),
        database: config.dsn.database().to_owned(),
    };
    let rt = runtime();
    match rt.block_on(result_inbox::migrate::migrate(
        &config.dsn,
        &options,
        &mut Lines,
    )) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("receiver migrate: {e}");
            ExitCode::from(e.exit_code())
        }
    }
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
    finish("demo", runtime().block_on(crate::demo::run(&config)))
}

fn consume(program: &Program) -> ExitCode {
    let config = match ConsumeConfig::from_source(program.consume_source) {
        Ok(c) => c,
        Err(errors) => return config_failed("consume", errors),
    };
    logging(config.run.log);
    let rt = runtime();
    let result = rt.block_on(async {
        // Registered before anything else: a signal during start-up also ends the process
        // cleanly (exit 0).
        let stop = match stop_signal() {
            Ok(stop) => stop,
            Err(e) => return Err(crate::consume::ConsumeError::Signals(e)),
        };
        (program.consume)(&config, Box::pin(stop)).await
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

/// SIGINT or SIGTERM, whichever comes first, named; registered before the command starts, so
/// that a signal during start-up also ends it cleanly, never by the signal's default action.
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = &'static str> + Send + 'static>
{
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

fn prune(args: &crate::cli::PruneArgs) -> ExitCode {
    let config = match PruneConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("prune", errors),
    };
    let rt = runtime();
    let report = rt.block_on(async {
        let stop = stop_signal().map_err(|e| format!("cannot watch for signals: {e}"))?;
        crate::prune::run(&config, args, stop)
            .await
            .map_err(|e| e.to_string())
    });
    match report {
        Ok(crate::prune::Report::DryRun(d)) => {
            println!("{d}");
            ExitCode::SUCCESS
        }
        Ok(crate::prune::Report::Pruned(s)) => {
            if let crate::prune::Ending::Failed(e) = &s.ending {
                if s.rows > 0 {
                    println!("{s}");
                }
                eprintln!(
                    "receiver prune: {e} (after {} rows in {} batches, which stay deleted)",
                    s.rows, s.batches
                );
            } else {
                println!("{s}");
            }
            ExitCode::from(s.exit_code())
        }
        Err(e) => {
            eprintln!("receiver prune: {e}");
            ExitCode::FAILURE
        }
    }
}

fn reconcile(args: &crate::cli::ReconcileArgs) -> ExitCode {
    let config = match crate::config::ReconcileConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("reconcile", errors),
    };
    let rt = runtime();
    match rt.block_on(crate::reconcile::run(&config, args)) {
        Ok(summary) => {
            println!("{summary}");
            if let Some(why) = &summary.failed {
                eprintln!(
                    "receiver reconcile: {why} (after {} deliveries in {} pages; the redeliveries asked for stay asked)",
                    summary.deliveries, summary.pages
                );
            }
            ExitCode::from(summary.exit_code())
        }
        Err(e) => {
            eprintln!("receiver reconcile: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn digest(queue: Option<result_inbox::QueueId>, file: Option<String>) -> ExitCode {
    let read = match file {
        Some(path) => crate::inspect::read_event_file(std::path::Path::new(&path)),
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
    match crate::inspect::digest(&raw, queue.as_ref()) {
        Ok((bytes, d)) => {
            println!("canonical={}", String::from_utf8_lossy(&bytes));
            println!("sha256={d}");
            ExitCode::SUCCESS
        }
        Err((kind, why)) => {
            // The kind on stdout, for scripts; what was wrong, and where, on stderr.
            println!("rejected={kind}");
            eprintln!("receiver digest: {why}");
            ExitCode::from(REJECTED)
        }
    }
}

/// The exit code of `digest` and `inspect --compare` for an event the receiver refuses: not 2,
/// which every command uses for a usage or configuration error.
const REJECTED: u8 = 3;

fn inspect(target: Target, show_event: bool, json: bool, compare: Option<String>) -> ExitCode {
    let config = match crate::config::InspectConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("inspect", errors),
    };
    let compared = match compare {
        None => None,
        Some(path) => match crate::inspect::read_event_file(std::path::Path::new(&path)) {
            Ok(raw) => match crate::inspect::digest(&raw, Some(&config.queue)) {
                Ok((_, d)) => Some(d),
                Err((_, why)) => {
                    eprintln!("receiver inspect: the event in {path} is rejected: {why}");
                    return ExitCode::from(REJECTED);
                }
            },
            Err(e) => {
                eprintln!("receiver inspect: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    match runtime().block_on(crate::inspect::inspect(
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
            eprintln!("receiver inspect: cannot read the receiver database: {e}");
            ExitCode::FAILURE
        }
    }
}

fn retention() -> ExitCode {
    let config = match InitConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => return config_failed("retention", errors),
    };
    match runtime().block_on(crate::inspect::retention(&config.dsn)) {
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
            println!("nothing deleted: receiver prune keeps the inbox to a window that covers the platform's redelivery horizon (receiver prune --help)");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("receiver retention: cannot read the receiver database: {e}");
            ExitCode::FAILURE
        }
    }
}
