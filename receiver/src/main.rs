//! The `receiver` binary: parse the command and its configuration, call the library, map the
//! result to output and an exit code. Nothing else lives here.
//!
//! Exit codes: 0 success, 1 the command failed, 2 bad usage or configuration.

use std::process::ExitCode;

use receiver::config::{InitConfig, ProcessEnv};

const USAGE: &str = "usage: receiver <command>

commands:
  init    create the receiver's two tables in the database ORBIT_RECEIVER_DSN names (once)

environment:
  ORBIT_RECEIVER_DSN  mysql://user:password@host:port/<database> (the database is required)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["init"] => init(),
        ["help" | "--help" | "-h"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        [] => {
            eprintln!("receiver: no command given\n{USAGE}");
            ExitCode::from(2)
        }
        [other, ..] => {
            eprintln!("receiver: unknown command `{other}`: run `receiver help` for the commands");
            ExitCode::from(2)
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts")
}

fn init() -> ExitCode {
    let config = match InitConfig::from_source(&ProcessEnv) {
        Ok(c) => c,
        Err(errors) => {
            for e in errors.0 {
                eprintln!("receiver init: {e}");
            }
            return ExitCode::from(2);
        }
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
