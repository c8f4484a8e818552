//! `orbit-dev`: the development Orbit platform, a real server speaking `docs/orbit-protocol.md`
//! with all state in its own MySQL database. Built for development and tests; there is no
//! public Orbit to test against.
//!
//! Exit codes: 0 stopped by a signal (or bootstrap done), 1 failure, 2 bad usage.

mod api;
mod db;
mod serve;
mod vary;

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use orbit_wire::{Credentials, Token};
use orbit_wire::{
    SCOPE_EVENTS_CONSUME, SCOPE_EVENTS_MANAGE, SCOPE_EVENTS_READ, SCOPE_TASKS_CANCEL,
    SCOPE_TASKS_SUBMIT,
};
use tokio::sync::Notify;

const SERVE_USAGE: &str = "  orbit-dev serve [--listen 127.0.0.1:8080] [--lease-seconds 30] [--max-attempts 5] [--window 64]
                  [--header-timeout-seconds 10] [--body-timeout-seconds 30] [--max-connections 1024]
                  [--enable-fault-api] [--vary-events SEED] [--acked-retention-seconds N]
                  [--clock-offset-seconds N] [--tls-cert FILE --tls-key FILE]";
const BOOTSTRAP_USAGE: &str = "  orbit-dev bootstrap --application NAME --namespace NAME --environment NAME --queue ID [--event-access] --output PATH [--force]";
const ENVIRONMENT: &str = "environment:
  ORBIT_MYSQL_DSN  the platform's own database, e.g. mysql://orbit:…@127.0.0.1:3306/orbit_test";

const SERVE_HELP: &str =
    "serve: prints `listening=HOST:PORT` on stdout once it accepts connections. Leases last
  --lease-seconds (30 by default, the real timing); a delivery gets --max-attempts leases before
  it is EXPIRED; a subscription holds at most --window outstanding deliveries (EXPIRED included).
  --enable-fault-api adds POST /v1/_faults (test-only faults: drop-next-ack-reply,
  close-stream-after-delivery, oversize-next-delivery, …); without it the endpoint does not exist.
  --vary-events SEED writes each event as another JSON writer might, drawn from SEED: member
  order, whitespace, \\u escapes, occurred_at's offset and fraction (docs/orbit-protocol.md).
  --acked-retention-seconds N forgets ACKED deliveries N seconds after their ACK (kept for ever
  by default): what is forgotten can no longer be listed or redelivered.
  --clock-offset-seconds N (-86400 to 86400) runs the platform's clock N seconds ahead (behind
  when negative) in the times it sends: each delivery's lease_expires_at says N seconds more
  than the lease it holds, which still ends on time. With --tls-cert (a PEM
  chain, the server's certificate first) and --tls-key (its PEM private key) it serves HTTPS
  and WSS only, on the same routes and limits; ORBIT_MYSQL_DSN may carry ssl-mode and ssl-ca.
  While the database does not answer, it says once a second what it is waiting for.";
const BOOTSTRAP_HELP: &str =
    "bootstrap: creates the namespace and queue if missing and a new credential bound to the queue
  with tasks:submit and tasks:cancel (plus events:read, events:consume, events:manage with
  --event-access); writes it to PATH with mode 0600 and prints where, never the token. PATH's
  directory must exist; an existing PATH is refused unless --force. The file is one JSON
  object: {\"token\",\"application\",\"namespace\",\"environment\",\"queue_id\",\"scopes\"}
  (docs/orbit-protocol.md, \"The credentials file\").";

/// The commands, for the help and the unknown-command line.
const COMMANDS: &[&str] = &["serve", "bootstrap"];

/// The help of `command`, or of the program when none is named.
fn help_of(command: Option<&str>) -> String {
    match command {
        Some("serve") => format!("usage:\n{SERVE_USAGE}\n\n{ENVIRONMENT}\n\n{SERVE_HELP}"),
        Some("bootstrap") => {
            format!("usage:\n{BOOTSTRAP_USAGE}\n\n{ENVIRONMENT}\n\n{BOOTSTRAP_HELP}")
        }
        _ => format!(
            "usage:\n{SERVE_USAGE}\n{BOOTSTRAP_USAGE}\n\n{ENVIRONMENT}\n\n{SERVE_HELP}\n{BOOTSTRAP_HELP}"
        ),
    }
}

fn main() -> ExitCode {
    // Arguments and the DSN must be UTF-8; say which one is not, never panic.
    let mut args = Vec::new();
    for (i, a) in std::env::args_os().skip(1).enumerate() {
        match a.into_string() {
            Ok(a) => args.push(a),
            Err(_) => {
                eprintln!("orbit-dev: argument {} is not valid UTF-8", i + 1);
                return ExitCode::from(2);
            }
        }
    }
    // Help and the version before anything is read or opened, wherever they stand.
    if about::answered("orbit-dev", &args, COMMANDS, help_of) {
        return ExitCode::SUCCESS;
    }
    if args.is_empty() {
        eprintln!(
            "orbit-dev: no command given; the commands are {} (`orbit-dev --help`)",
            COMMANDS.join(", ")
        );
        return ExitCode::from(2);
    }
    #[allow(clippy::disallowed_methods)] // the binary's one environment read
    let dsn = match std::env::var_os("ORBIT_MYSQL_DSN").map(|v| v.into_string()) {
        None => None,
        Some(Ok(v)) => Some(v).filter(|v| !v.is_empty()),
        Some(Err(_)) => {
            eprintln!("orbit-dev: ORBIT_MYSQL_DSN is not valid UTF-8");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    let result = match args[0].as_str() {
        "serve" => parse_serve(&args[1..]).and_then(|o| {
            let dsn = dsn
                .ok_or_else(|| usage("ORBIT_MYSQL_DSN is not set: name the platform's database"))?;
            runtime.block_on(serve(o, dsn))
        }),
        "bootstrap" => parse_bootstrap(&args[1..]).and_then(|o| {
            let dsn = dsn
                .ok_or_else(|| usage("ORBIT_MYSQL_DSN is not set: name the platform's database"))?;
            runtime.block_on(bootstrap(o, dsn))
        }),
        other => Err((2, about::unknown_command("orbit-dev", other, COMMANDS))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => {
            eprintln!("orbit-dev: {message}");
            ExitCode::from(code)
        }
    }
}

type Failure = (u8, String);

fn usage(message: &str) -> Failure {
    (2, format!("{message}; see orbit-dev --help"))
}

struct ServeOptions {
    listen: String,
    lease: Duration,
    max_attempts: u32,
    window: u32,
    fault_api: bool,
    vary_events: Option<u64>,
    /// `--acked-retention-seconds`.
    acked_retention: Option<Duration>,
    /// `--clock-offset-seconds`.
    clock_offset: i64,
    limits: serve::Limits,
    /// `--tls-cert`, `--tls-key`.
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

fn number(flag: &str, value: Option<&String>, min: u64, max: u64) -> Result<u64, Failure> {
    value
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| (min..=max).contains(v))
        .ok_or_else(|| usage(&format!("{flag} takes a number from {min} to {max}")))
}

fn parse_serve(args: &[String]) -> Result<ServeOptions, Failure> {
    let mut o = ServeOptions {
        listen: "127.0.0.1:8080".into(),
        lease: Duration::from_secs(30),
        max_attempts: 5,
        window: 64,
        fault_api: false,
        vary_events: None,
        acked_retention: None,
        clock_offset: 0,
        limits: serve::Limits::default(),
        tls: None,
    };
    let (mut cert, mut key) = (None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--listen" => {
                o.listen = it
                    .next()
                    .cloned()
                    .ok_or_else(|| usage("--listen needs an address"))?
            }
            "--lease-seconds" => o.lease = Duration::from_secs(number(flag, it.next(), 1, 3600)?),
            "--max-attempts" => o.max_attempts = number(flag, it.next(), 1, 1000)? as u32,
            "--window" => o.window = number(flag, it.next(), 1, 10_000)? as u32,
            "--header-timeout-seconds" => {
                o.limits.header_timeout = Duration::from_secs(number(flag, it.next(), 1, 3600)?)
            }
            "--body-timeout-seconds" => {
                o.limits.body_timeout = Duration::from_secs(number(flag, it.next(), 1, 3600)?)
            }
            "--max-connections" => {
                o.limits.max_connections = number(flag, it.next(), 1, 100_000)? as usize
            }
            "--enable-fault-api" => o.fault_api = true,
            "--vary-events" => o.vary_events = Some(number(flag, it.next(), 0, u64::MAX)?),
            "--acked-retention-seconds" => {
                o.acked_retention = Some(Duration::from_secs(number(
                    flag,
                    it.next(),
                    1,
                    366 * 86_400,
                )?))
            }
            "--clock-offset-seconds" => {
                o.clock_offset = it
                    .next()
                    .and_then(|v| v.parse::<i64>().ok())
                    .filter(|v| (-86_400..=86_400).contains(v))
                    .ok_or_else(|| usage(&format!("{flag} takes a number from -86400 to 86400")))?
            }
            "--tls-cert" | "--tls-key" => {
                let file = it
                    .next()
                    .map(std::path::PathBuf::from)
                    .ok_or_else(|| usage(&format!("{flag} needs a file")))?;
                if flag == "--tls-cert" {
                    cert = Some(file);
                } else {
                    key = Some(file);
                }
            }
            other => return Err(usage(&format!("unknown argument `{other}`"))),
        }
    }
    o.tls = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err(usage("--tls-cert and --tls-key go together")),
    };
    Ok(o)
}

async fn serve(o: ServeOptions, dsn: String) -> Result<(), Failure> {
    // Before the database: a certificate that does not load is the operator's to fix.
    let tls = o
        .tls
        .as_ref()
        .map(|(cert, key)| serve::tls_config(cert, key))
        .transpose()
        .map_err(|e| (2, e))?;
    let pool = db::open(&dsn).await.map_err(|e| (1, e))?;
    let listener = tokio::net::TcpListener::bind(&o.listen)
        .await
        .map_err(|e| (1, format!("cannot listen on {}: {e}", o.listen)))?;
    let addr = listener.local_addr().map_err(|e| (1, e.to_string()))?;
    if !addr.ip().is_loopback() {
        eprintln!("orbit-dev: warning: listening on {addr}, beyond loopback; this is a development server");
    }
    let platform = Arc::new(api::Platform {
        pool,
        lease: o.lease,
        max_attempts: o.max_attempts,
        window: o.window,
        fault_api: o.fault_api,
        vary: o.vary_events.map(vary::Vary::new),
        acked_retention: o.acked_retention,
        clock_offset: Duration::from_secs(o.clock_offset.unsigned_abs()),
        clock_behind: o.clock_offset < 0,
        wake: Notify::new(),
        drop_next_ack_reply: AtomicBool::new(false),
        drop_next_ack: AtomicBool::new(false),
        stall_next_ack: AtomicBool::new(false),
        refuse_next_ack: AtomicBool::new(false),
        close_after_delivery: AtomicBool::new(false),
        close_streams: tokio::sync::watch::Sender::new(0),
        oversize_next_delivery: AtomicBool::new(false),
        skip_next_result_check: AtomicBool::new(false),
        metrics: api::metrics::PlatformMetrics::default(),
    });
    tokio::spawn(api::expire_leases(platform.clone()));
    if platform.acked_retention.is_some() {
        tokio::spawn(api::forget_acked(platform.clone()));
    }
    println!("listening={addr}");
    let app = api::router(platform, o.limits.body_timeout);
    let stop = async {
        use tokio::signal::unix::{signal, SignalKind};
        if let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        }
    };
    serve::run(listener, app, o.limits, tls, stop)
        .await
        .map_err(|e| (1, format!("server failed: {e}")))
}

struct BootstrapOptions {
    application: String,
    namespace: String,
    environment: String,
    queue: String,
    event_access: bool,
    output: String,
    force: bool,
}

fn parse_bootstrap(args: &[String]) -> Result<BootstrapOptions, Failure> {
    let (mut application, mut namespace, mut environment, mut queue, mut output) =
        (None, None, None, None, None);
    let mut event_access = false;
    let mut force = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--application" => application = Some(value()?),
            "--namespace" => namespace = Some(value()?),
            "--environment" => environment = Some(value()?),
            "--queue" => queue = Some(value()?),
            "--output" => output = Some(value()?),
            "--event-access" => event_access = true,
            "--force" => force = true,
            other => return Err(usage(&format!("unknown argument `{other}`"))),
        }
    }
    let need =
        |v: Option<String>, flag: &str| v.ok_or_else(|| usage(&format!("{flag} is required")));
    let queue = need(queue, "--queue")?;
    if queue.len() > 128 || queue.contains(',') || queue.chars().any(char::is_control) {
        return Err(usage(
            "--queue must be at most 128 characters, without commas or control characters",
        ));
    }
    Ok(BootstrapOptions {
        application: need(application, "--application")?,
        namespace: need(namespace, "--namespace")?,
        environment: need(environment, "--environment")?,
        queue,
        event_access,
        output: need(output, "--output")?,
        force,
    })
}

/// Before anything is created on the platform: the file must not exist (unless `--force`), and
/// its directory must (bootstrap creates no directory the user did not ask for).
fn check_output(o: &BootstrapOptions) -> Result<(), Failure> {
    let path = std::path::Path::new(&o.output);
    if path.exists() && !o.force {
        return Err(usage(&format!(
            "{} exists: refusing to overwrite a credentials file (its token stays valid on the platform); pass --force to replace it",
            o.output
        )));
    }
    if path.is_dir() {
        return Err(usage(&format!("{} is a directory, not a file", o.output)));
    }
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) if !dir.is_dir() => Err(usage(&format!(
            "the directory of {} does not exist: create it first (mode 0700)",
            o.output
        ))),
        _ => Ok(()),
    }
}

async fn bootstrap(o: BootstrapOptions, dsn: String) -> Result<(), Failure> {
    check_output(&o)?;
    let pool = db::open(&dsn).await.map_err(|e| (1, e))?;
    let fail = |e: sqlx::Error| (1, format!("bootstrap failed: {e}"));
    sqlx::query("INSERT IGNORE INTO orbit_namespaces (name, application, environment, created_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))")
        .bind(&o.namespace)
        .bind(&o.application)
        .bind(&o.environment)
        .execute(&pool)
        .await
        .map_err(fail)?;
    sqlx::query("INSERT IGNORE INTO orbit_queues (id, namespace, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))")
        .bind(&o.queue)
        .bind(&o.namespace)
        .execute(&pool)
        .await
        .map_err(fail)?;
    let mut scopes = vec![SCOPE_TASKS_SUBMIT, SCOPE_TASKS_CANCEL];
    if o.event_access {
        scopes.extend([SCOPE_EVENTS_READ, SCOPE_EVENTS_CONSUME, SCOPE_EVENTS_MANAGE]);
    }
    let token = format!("orb_{}", db::random_hex(24));
    sqlx::query("INSERT INTO orbit_credentials (token_sha256, namespace, scopes, queues, created_at) VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))")
        .bind(db::sha256(&token))
        .bind(&o.namespace)
        .bind(scopes.join(","))
        .bind(&o.queue)
        .execute(&pool)
        .await
        .map_err(fail)?;
    let creds = Credentials {
        token: Token::new(token),
        application: o.application,
        namespace: o.namespace,
        environment: o.environment,
        queue_id: o.queue.clone(),
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
    };
    creds
        .write(std::path::Path::new(&o.output), o.force)
        .map_err(|e| (1, format!("cannot write {}: {e}", o.output)))?;
    println!(
        "credentials written to {} (mode 0600; queue {}; scopes {})",
        o.output,
        o.queue,
        scopes.join(" ")
    );
    Ok(())
}
