//! The `commit-proxy` binary: parse flags, start the proxy (and its control interface), print
//! where they listen, and run until SIGTERM or SIGINT.
//!
//! Exit codes: 0 stopped by a signal, 1 could not start, 2 bad usage.

use std::io::Write;
use std::process::ExitCode;

use commit_proxy::{Proxy, RuleSpec};

const USAGE: &str = "usage: commit-proxy --upstream HOST:PORT [--listen 127.0.0.1:0] [--control 127.0.0.1:0] [--rule SPEC]...

  --upstream HOST:PORT  the MySQL or MariaDB server to relay to (required)
  --listen ADDR         where clients connect (loopback only; default 127.0.0.1:0, a free port)
  --control ADDR        serve the HTTP JSON control interface here (loopback only)
  --rule SPEC           arm a rule at start, repeatable: ACTION[=ARG][@ON][:COUNT]
                        ACTION: drop-commit-ok, drop-commit-request, reset, error=NUMBER, delay=250ms|2s, hold-request=250ms|2s
                        ON: commit (default), rollback, begin, any; COUNT: fire at most that often
                        (without it, a rule stays armed for every matching statement)

On start it prints `listening=HOST:PORT` (and `control=HOST:PORT`) on stdout.";

struct Args {
    upstream: String,
    listen: String,
    control: Option<String>,
    rules: Vec<RuleSpec>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut upstream = None;
    let mut listen = "127.0.0.1:0".to_owned();
    let mut control = None;
    let mut rules = Vec::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "--upstream" => upstream = Some(host_port("--upstream", value("--upstream")?)?),
            "--listen" => listen = host_port("--listen", value("--listen")?)?,
            "--control" => control = Some(host_port("--control", value("--control")?)?),
            "--rule" => rules.push(RuleSpec::parse_cli(&value("--rule")?).map_err(|e| e.0)?),
            other => {
                return Err(format!(
                    "unknown argument `{other}`; the flags are --upstream, --listen, --control and --rule"
                ))
            }
        }
    }
    Ok(Args {
        upstream: upstream.ok_or("--upstream HOST:PORT is required")?,
        listen,
        control,
        rules,
    })
}

/// `value` if it has the form `HOST:PORT` (`[v6]:PORT` for an IPv6 address) with a port from
/// 0 to 65535; the flag's one line otherwise. Nothing is resolved or connected here.
fn host_port(flag: &str, value: String) -> Result<String, String> {
    let bad = |why: &str| format!("{flag} {value:?} {why}: give HOST:PORT, e.g. 127.0.0.1:3306");
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(bad("has no port"));
    };
    let host_ok = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok()),
        None => {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        }
    };
    if !host_ok {
        return Err(bad("has no valid host"));
    }
    if port.parse::<u16>().is_err() {
        return Err(bad("has no valid port (0 to 65535)"));
    }
    Ok(value)
}

fn main() -> ExitCode {
    let Some(argv) = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string().ok())
        .collect::<Option<Vec<String>>>()
    else {
        eprintln!("commit-proxy: an argument is not valid UTF-8");
        return ExitCode::from(2);
    };
    if about::answered("commit-proxy", &argv, &[], |_| USAGE.into()) {
        return ExitCode::SUCCESS;
    }
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("commit-proxy: {e}; see commit-proxy --help");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    runtime.block_on(run(args))
}

async fn run(args: Args) -> ExitCode {
    let mut proxy = match Proxy::start(&args.listen, &args.upstream).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("commit-proxy: {e}");
            // A non-loopback address is a usage error (2); an address that cannot be bound,
            // a failure to start (1).
            return match e {
                commit_proxy::StartError::NotLoopback(_) => ExitCode::from(2),
                commit_proxy::StartError::Io(..) => ExitCode::FAILURE,
            };
        }
    };
    for rule in args.rules {
        if let Err(e) = proxy.arm(rule) {
            eprintln!("commit-proxy: {e}");
            return ExitCode::from(2);
        }
    }
    let mut out = format!("listening={}\n", proxy.local_addr());
    if let Some(control) = &args.control {
        match proxy.serve_control(control).await {
            Ok(addr) => out.push_str(&format!("control={addr}\n")),
            Err(e) => {
                eprintln!("commit-proxy: control interface: {e}");
                return match e {
                    commit_proxy::StartError::NotLoopback(_) => ExitCode::from(2),
                    commit_proxy::StartError::Io(..) => ExitCode::FAILURE,
                };
            }
        }
    }
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(out.as_bytes());
    let _ = stdout.flush();
    drop(stdout);

    let stopped = async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return "no signal handler";
        };
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    };
    let why = stopped.await;
    drop(proxy);
    eprintln!("commit-proxy: stopped on {why}");
    ExitCode::SUCCESS
}
