//! Running cases: each at most [`CASE_LIMIT`], several at once on threads of their own
//! (`--jobs`). Whatever a case finds stays with that case ([`Case::run`]), so the verdicts are
//! the same at any number of jobs.

use std::time::Duration;

use crate::{Case, Ctx};

/// How long one case may take before the kit gives up on it.
pub const CASE_LIMIT: Duration = Duration::from_secs(240);

/// `work` on each of `items`, at most `jobs` at a time, each worker thread with a runtime of
/// its own; the answers in the items' order.
pub fn at_most<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    work: impl Fn(&tokio::runtime::Runtime, &T) -> R + Sync,
) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: std::sync::Mutex<Vec<Option<R>>> =
        std::sync::Mutex::new(items.iter().map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, items.len().max(1)) {
            scope.spawn(|| {
                let runtime = runtime();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(item) = items.get(i) else { break };
                    let answer = work(&runtime, item);
                    done.lock().expect("no worker panicked holding it")[i] = Some(answer);
                }
            });
        }
    });
    done.into_inner()
        .expect("no worker panicked holding it")
        .into_iter()
        .map(|r| r.expect("every item was run"))
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs `case`, giving up after [`CASE_LIMIT`].
pub fn run_case(
    runtime: &tokio::runtime::Runtime,
    case: &Case,
    ctx: Ctx,
) -> Result<String, String> {
    runtime.block_on(async {
        tokio::time::timeout(CASE_LIMIT, case.run(ctx))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "the case did not finish within {} s",
                    CASE_LIMIT.as_secs()
                ))
            })
    })
}
