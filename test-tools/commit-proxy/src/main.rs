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
            "--upstream" => upstream = Some(value("--upstream")?),
            "--listen" => listen = value("--listen")?,
            "--control" => control = Some(value("--control")?),
            "--rule" => rules.push(RuleSpec::parse_cli(&value("--rule")?).map_err(|e| e.0)?),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(Args {
        upstream: upstream.ok_or("--upstream HOST:PORT is required")?,
        listen,
        control,
        rules,
    })
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
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
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
            return ExitCode::FAILURE;
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
                return ExitCode::FAILURE;
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
