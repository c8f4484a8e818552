//! Fault barriers, for the fault regressions only: the `receiver-faults` binary installs them
//! through the seams of the core, the program and the SDK (`make fault-build`); the `receiver`
//! binary has no barrier, flag or variable.
//!
//! A barrier is a named point in the flow of one delivery:
//!
//! | point | where |
//! |---|---|
//! | `before_insert` | in the Apply transaction, after `BEGIN`, before the inbox `INSERT` |
//! | `before_verdict` | in the Apply transaction, after the inbox `INSERT` met the dedup key, before the committed record's verdict is read |
//! | `after_inbox_rows` | in a group's transaction, after the inbox rows of all its events |
//! | `after_views` | in a group's transaction, after its views were written and its stale events marked |
//! | `before_commit` | after the inbox row and the view are written, before `COMMIT` |
//! | `after_commit` | after the apply answered (COMMIT confirmed, or a duplicate/stale verdict), before the handler returns and the SDK ACKs |
//! | `after_ack_sent` | in the SDK, right after the ACK frame was written to the stream |
//! | `step_started` | in `receiver migrate`, after a step is recorded as started, before its statement (key: the step's version) |
//! | `step_done` | in `receiver migrate`, after a step's statement, before it is recorded as applied |
//!
//! `RECEIVER_FAULT_BARRIERS` arms some: a comma-separated list of `point` (stop at its first
//! hit) or `point@N` (stop at its N-th hit in this process). At an armed hit the barrier
//! appends one line `barrier=<point> hit=<N> key=<event or delivery id> pid=<pid>` to the
//! file `RECEIVER_FAULT_REPORT` and then waits: for a line on standard input (then it goes
//! on), or, if standard input ends, forever. The test usually kills the process there.
//!
//! The apply's 5 s budget still runs while a barrier inside the transaction waits.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use seam_names::Barrier;

/// What the environment armed.
#[derive(Debug, Default)]
struct Plan {
    /// point → the hit numbers that stop.
    armed: HashMap<Barrier, Vec<u64>>,
    report: Option<PathBuf>,
    hits: Mutex<HashMap<Barrier, u64>>,
}

/// Reads `RECEIVER_FAULT_BARRIERS` and `RECEIVER_FAULT_REPORT`; a bad value is fatal, since a
/// fault test with a misspelt barrier would test nothing.
fn plan() -> &'static Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    PLAN.get_or_init(|| match parse_env() {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("receiver-faults: {e}");
            std::process::exit(2);
        }
    })
}

fn parse_env() -> Result<Plan, String> {
    #[allow(clippy::disallowed_methods)] // the fault build's own switches, read once
    let spec = std::env::var("RECEIVER_FAULT_BARRIERS").unwrap_or_default();
    #[allow(clippy::disallowed_methods)]
    let report = std::env::var_os("RECEIVER_FAULT_REPORT").map(PathBuf::from);
    let mut plan = Plan {
        report,
        ..Plan::default()
    };
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, hit) = match item.split_once('@') {
            Some((name, n)) => (
                name,
                n.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    format!("RECEIVER_FAULT_BARRIERS: {item:?}: the hit number must be 1 or more")
                })?,
            ),
            None => (item, 1),
        };
        let point = Barrier::parse(name).ok_or_else(|| {
            let names: Vec<&str> = Barrier::ALL.iter().map(|b| b.name()).collect();
            format!(
                "RECEIVER_FAULT_BARRIERS: unknown point {name:?}; points: {}",
                names.join(", ")
            )
        })?;
        plan.armed.entry(point).or_default().push(hit);
    }
    if !plan.armed.is_empty() && plan.report.is_none() {
        return Err("RECEIVER_FAULT_BARRIERS is set but RECEIVER_FAULT_REPORT is not".into());
    }
    Ok(plan)
}

/// Says at start-up that this is the fault build and what it armed.
pub fn announce() {
    let plan = plan();
    let mut armed: Vec<String> = plan
        .armed
        .iter()
        .flat_map(|(p, hits)| hits.iter().map(move |h| format!("{p}@{h}")))
        .collect();
    armed.sort();
    eprintln!(
        "receiver-faults: TEST BUILD with fault barriers; armed: {}",
        if armed.is_empty() {
            "none".to_owned()
        } else {
            armed.join(",")
        }
    );
}

/// Passes `point` for `key` (an event or delivery id); stops there if it is armed.
pub async fn barrier(point: Barrier, key: &str) {
    let plan = plan();
    let Some(stops) = plan.armed.get(&point) else {
        return;
    };
    let hit = {
        let mut hits = plan.hits.lock().unwrap_or_else(|p| p.into_inner());
        let n = hits.entry(point).or_default();
        *n += 1;
        *n
    };
    if !stops.contains(&hit) {
        return;
    }
    let line = format!(
        "barrier={point} hit={hit} key={key} pid={}\n",
        std::process::id()
    );
    if let Some(path) = &plan.report {
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("receiver-faults: cannot write {}: {e}", path.display());
            std::process::exit(2);
        }
    }
    // Wait for a line on stdin; at end of input, wait for ever (for the kill).
    let released = tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        matches!(std::io::stdin().read_line(&mut s), Ok(n) if n > 0)
    })
    .await
    .unwrap_or(false);
    if !released {
        std::future::pending::<()>().await;
    }
}

/// Installs every barrier: the core's inside the Apply transaction, the program's after it,
/// the SDK's after an ACK is written. Says first what this build armed; a bad setting exits.
pub fn install() {
    announce();
    let installed = [
        result_inbox::seam::install_hook(Box::new(|point, key| {
            let barrier = match point {
                result_inbox::seam::Point::BeforeInsert => Barrier::BeforeInsert,
                result_inbox::seam::Point::BeforeVerdict => Barrier::BeforeVerdict,
                result_inbox::seam::Point::AfterInboxRows => Barrier::AfterInboxRows,
                result_inbox::seam::Point::AfterViews => Barrier::AfterViews,
                result_inbox::seam::Point::BeforeCommit => Barrier::BeforeCommit,
                result_inbox::seam::Point::StepStarted => Barrier::StepStarted,
                result_inbox::seam::Point::StepDone => Barrier::StepDone,
            };
            Box::pin(async move { self::barrier(barrier, &key).await })
        })),
        receiver::seam::install_hook(Box::new(|point, key| {
            let barrier = match point {
                receiver::seam::Point::AfterCommit => Barrier::AfterCommit,
            };
            Box::pin(async move { self::barrier(barrier, &key).await })
        })),
        orbit_sdk::seam::install(Box::new(AckSent)),
    ];
    for result in installed {
        if let Err(e) = result {
            eprintln!("receiver-faults: {e}");
            std::process::exit(2);
        }
    }
}

/// The test-only schema steps `RECEIVER_TEST_SCHEMA_STEP` adds, as version 3 after the
/// product's: `instant` (a column added with `ALGORITHM=INSTANT`, what the upgrade drill
/// migrates to) or `copy` (a column added with `ALGORITHM=COPY`, which `receiver migrate`
/// refuses without `--allow-blocking`). A bad value exits.
pub fn install_test_steps() {
    use result_inbox::migrate::{Algorithm, Shape, Step};
    #[allow(clippy::disallowed_methods)] // the fault build's own switch, read once
    let asked = std::env::var("RECEIVER_TEST_SCHEMA_STEP").unwrap_or_default();
    let step = match asked.as_str() {
        "" => return,
        "instant" => Step {
            version: 3,
            name: "test-drill-column",
            table: "receiver_task_views",
            statement: "ALTER TABLE receiver_task_views \
                 ADD COLUMN drill_note VARBINARY(32) NULL COMMENT '仅测试构建：升级演练的一步', \
                 ALGORITHM = INSTANT",
            algorithm: Algorithm::Instant,
            shape: Shape::Column {
                table: "receiver_task_views",
                column: "drill_note",
            },
        },
        "copy" => Step {
            version: 3,
            name: "test-copying-column",
            table: "receiver_task_views",
            statement: "ALTER TABLE receiver_task_views \
                 ADD COLUMN drill_copy VARBINARY(32) NULL COMMENT '仅测试构建：需要复制表的一步', \
                 ALGORITHM = COPY",
            algorithm: Algorithm::Copy,
            shape: Shape::Column {
                table: "receiver_task_views",
                column: "drill_copy",
            },
        },
        other => {
            eprintln!("receiver-faults: RECEIVER_TEST_SCHEMA_STEP={other:?}: use instant or copy");
            std::process::exit(2);
        }
    };
    if let Err(e) = result_inbox::seam::install_steps(vec![step]) {
        eprintln!("receiver-faults: {e}");
        std::process::exit(2);
    }
}

/// The SDK's layer: [`Barrier::AfterAckSent`] once an ACK frame is written, keyed by its
/// delivery id.
struct AckSent;

impl orbit_sdk::seam::LinkLayer for AckSent {
    fn sent(&self, text: &str) -> orbit_sdk::seam::HookFuture {
        let acked = crate::frames::ack(text).map(|(delivery, _)| delivery);
        Box::pin(async move {
            if let Some(delivery) = acked {
                barrier(Barrier::AfterAckSent, &delivery).await;
            }
        })
    }
}
