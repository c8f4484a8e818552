//! `make demo` until the Orbit platform exists: the receiver's half of the demo on a throwaway
//! MySQL server. It runs `init`, then applies one `task.cancelled` event twice through the
//! same business transaction (the first advances the view, the second finds the committed
//! inbox record), reads the view back and prints the demo's first line.
//!
//! Exit codes: 0 success, 1 a step failed (the message names it).

use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use conformance::{EventSpec, ReceiverDb};
use receiver::{Outcome, TaskId};

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    match runtime.block_on(demo()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("store-demo: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn demo() -> Result<(), String> {
    let started = Instant::now();
    eprintln!("store-demo: starting a throwaway MySQL server (about two seconds)…");
    let server = testdb::Server::shared().map_err(|e| e.to_string())?;
    eprintln!("store-demo: server {}", server.description());

    let db = ReceiverDb::provisioned().await;
    let dsn = receiver::config::Dsn::parse(&db.init_url()).map_err(|e| e.to_string())?;
    let report = receiver::schema::init(&dsn)
        .await
        .map_err(|e| format!("init: {e}"))?;
    println!("{report}");
    db.grant_runtime().await.map_err(|e| e.to_string())?;
    let rdb = ReceiverDb { db };
    let store = rdb.store().await;

    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let task = format!("task-{nanos:x}");
    let event = EventSpec::cancelled(&format!("evt-{nanos:x}"), &task, 2).event();

    let first = store
        .apply(&event)
        .await
        .map_err(|e| format!("first apply: {e}"))?;
    let second = store
        .apply(&event)
        .await
        .map_err(|e| format!("second apply: {e}"))?;
    if first != Outcome::Applied {
        return Err(format!("first apply was {first:?}, not applied"));
    }
    let Outcome::Duplicate { applied: true } = second else {
        return Err(format!("second apply was {second:?}, not a duplicate"));
    };
    let view = store
        .view(&TaskId::new(task.clone()).map_err(|e| e.to_string())?)
        .await
        .map_err(|e| format!("reading the view: {e}"))?
        .ok_or("the view is missing after a committed apply")?;
    println!(
        "task={task} state={} inbox_duplicate=true applied_events={}",
        view.last_state, view.applied_events
    );
    store.close().await;
    eprintln!(
        "store-demo: done in {:.1?}; the platform half (subscription, ACK, pause) arrives with the Orbit platform",
        started.elapsed()
    );
    Ok(())
}
