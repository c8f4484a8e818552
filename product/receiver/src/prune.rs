//! `receiver prune`: the inbox kept to a window, in small batches, beside a running `consume`.
//!
//! The statements, and why they are safe under load, are in `result_inbox::prune`; here is the
//! run around them: the batch loop, the pause between batches, the time limit and signals
//! (both stop between batches, never inside one), retries of a batch that met an apply's
//! lock, progress on a terminal, and the summary line.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use result_inbox::prune::{PruneError, Pruner};

use crate::cli::PruneArgs;
use crate::config::PruneConfig;
use crate::progress::Progress;

/// How many times one batch is tried again after a lock wait timeout or a deadlock.
pub const LOCK_RETRIES: u32 = 10;
/// The least wait before a batch that met a lock is tried again.
const LOCK_BACKOFF: Duration = Duration::from_millis(200);

/// Why a run ended.
#[derive(Debug)]
pub enum Ending {
    /// Nothing older than the window is left (as far as this run's cursor saw).
    Complete,
    /// `--max-seconds` was reached between batches.
    TimeLimit(u64),
    /// SIGINT or SIGTERM, between batches.
    Signal(&'static str),
    /// A database error: what was deleted before it stays deleted.
    Failed(PruneError),
}

/// What a run did.
#[derive(Debug)]
pub struct Summary {
    pub window: String,
    /// The window's edge (UTC).
    pub cutoff: String,
    pub rows: u64,
    pub bytes: u64,
    pub batches: u64,
    /// Batches tried again after a lock conflict.
    pub lock_retries: u64,
    pub seconds: f64,
    /// The oldest row of this consumer and queue left after the run (UTC).
    pub oldest_left: Option<String>,
    pub ending: Ending,
}

impl Summary {
    /// The exit status `receiver prune` ends with.
    pub fn exit_code(&self) -> u8 {
        match self.ending {
            Ending::Complete => 0,
            Ending::Failed(_) => 1,
            Ending::TimeLimit(_) | Ending::Signal(_) => STOPPED_EARLY,
        }
    }
}

/// The exit status of a run stopped by `--max-seconds` or a signal with rows left.
pub const STOPPED_EARLY: u8 = 4;

/// `2026-11-05 01:02:03.123456` as `2026-11-05T01:02:03.123456Z`.
fn utc(t: &str) -> String {
    format!("{}Z", t.replacen(' ', "T", 1))
}

fn oldest(t: &Option<String>) -> String {
    t.as_deref().map_or_else(|| "none".to_owned(), utc)
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let result = match &self.ending {
            Ending::Complete => "complete".to_owned(),
            Ending::TimeLimit(s) => format!(
                "stopped_at_max_seconds ({s} s; rows older than the window may remain: run again to continue)"
            ),
            Ending::Signal(s) => format!("stopped_by_{s} (run again to continue)"),
            Ending::Failed(_) => "failed (what was deleted stays deleted)".to_owned(),
        };
        write!(
            f,
            "pruned rows={} bytes={} batches={} seconds={:.1} oldest_left={} window={} cutoff={} lock_retries={} result={result}",
            self.rows,
            self.bytes,
            self.batches,
            self.seconds,
            oldest(&self.oldest_left),
            self.window,
            utc(&self.cutoff),
            self.lock_retries,
        )
    }
}

/// What a dry run prints.
#[derive(Debug)]
pub struct DryRun {
    pub window: String,
    pub cutoff: String,
    pub survey: result_inbox::prune::Survey,
}

impl fmt::Display for DryRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dry_run rows={} bytes={} oldest={} newest={} window={} cutoff={}: nothing deleted",
            self.survey.rows,
            self.survey.bytes,
            oldest(&self.survey.oldest),
            oldest(&self.survey.newest),
            self.window,
            utc(&self.cutoff),
        )
    }
}

/// What `receiver prune` prints: a dry run's survey, or a run's summary.
#[derive(Debug)]
pub enum Report {
    DryRun(DryRun),
    Pruned(Summary),
}

/// Runs `receiver prune`. `Err` only when nothing was done (the connection, the index, the
/// window's edge); a failure after the first batch is the summary's [`Ending::Failed`].
pub async fn run(
    config: &PruneConfig,
    args: &PruneArgs,
    stop: impl Future<Output = &'static str> + Send + 'static,
) -> Result<Report, PruneError> {
    let mut pruner = Pruner::connect(
        &config.dsn,
        config.name.clone(),
        config.queue.clone(),
        args.older_than.seconds,
    )
    .await?;
    if let Some(warning) = pruner.schema().warning() {
        eprintln!("receiver prune: warning: {warning}");
    }
    let window = args.older_than.text.clone();
    let cutoff = pruner.cutoff().to_owned();
    if args.dry_run {
        let survey = pruner.survey().await?;
        pruner.close().await;
        return Ok(Report::DryRun(DryRun {
            window,
            cutoff,
            survey,
        }));
    }

    let stopping = Arc::new(AtomicBool::new(false));
    let signal = Arc::new(std::sync::Mutex::new(None));
    let wake = Arc::new(tokio::sync::Notify::new());
    let watcher = {
        let (stopping, signal, wake) = (stopping.clone(), signal.clone(), wake.clone());
        tokio::spawn(async move {
            let name = stop.await;
            if let Ok(mut s) = signal.lock() {
                *s = Some(name);
            }
            stopping.store(true, Ordering::SeqCst);
            wake.notify_one();
        })
    };

    let started = Instant::now();
    let limit = args.max_seconds.map(Duration::from_secs);
    let mut progress = Progress::new("prune");
    let mut summary = Summary {
        window,
        cutoff,
        rows: 0,
        bytes: 0,
        batches: 0,
        lock_retries: 0,
        seconds: 0.0,
        oldest_left: None,
        ending: Ending::Complete,
    };
    let mut conflicts = 0u32;
    summary.ending = loop {
        if stopping.load(Ordering::SeqCst) {
            let name = signal.lock().ok().and_then(|s| *s).unwrap_or("signal");
            break Ending::Signal(name);
        }
        if let (Some(limit), Some(s)) = (limit, args.max_seconds) {
            if started.elapsed() >= limit {
                break Ending::TimeLimit(s);
            }
        }
        match pruner.batch(args.batch_rows).await {
            Ok(b) if b.found == 0 => break Ending::Complete,
            Ok(b) => {
                conflicts = 0;
                summary.rows += b.deleted;
                summary.bytes += b.bytes;
                summary.batches += 1;
                let at = pruner.position().map(str::to_owned);
                progress.show(|| {
                    let secs = started.elapsed().as_secs_f64().max(0.001);
                    format!(
                        "{} rows deleted ({:.0}/s), {} bytes, {} batches, at {}",
                        summary.rows,
                        summary.rows as f64 / secs,
                        summary.bytes,
                        summary.batches,
                        oldest(&at)
                    )
                });
            }
            Err(e) if e.is_lock_conflict() && conflicts < LOCK_RETRIES => {
                conflicts += 1;
                summary.lock_retries += 1;
                progress.say(&format!(
                    "a batch met rows locked by an apply ({e}); trying it again ({conflicts} of {LOCK_RETRIES})"
                ));
                tokio::time::sleep(args.pause.max(LOCK_BACKOFF)).await;
                continue;
            }
            Err(e) => break Ending::Failed(e),
        }
        // At least the pause, and long enough to keep the run's average under the rate.
        let due = started + Duration::from_secs_f64(summary.rows as f64 / f64::from(args.max_rate));
        let wait = args
            .pause
            .max(due.saturating_duration_since(Instant::now()));
        if !wait.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = wake.notified() => {}
            }
        }
    };
    watcher.abort();
    progress.clear();
    summary.seconds = started.elapsed().as_secs_f64();
    summary.oldest_left = match &summary.ending {
        // The connection may be what failed: no further statement on it.
        Ending::Failed(_) => None,
        _ => pruner.oldest_left().await.unwrap_or(None),
    };
    pruner.close().await;
    Ok(Report::Pruned(summary))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(ending: Ending) -> Summary {
        Summary {
            window: "30d".into(),
            cutoff: "2026-11-06 01:00:00.000000".into(),
            rows: 4000,
            bytes: 1_234_567,
            batches: 4,
            lock_retries: 0,
            seconds: 1.25,
            oldest_left: Some("2026-11-06 01:00:00.250000".into()),
            ending,
        }
    }

    #[test]
    fn the_summary_is_one_line_with_every_figure_and_the_exit_status_follows_the_ending() {
        let s = summary(Ending::Complete);
        assert_eq!(
            s.to_string(),
            "pruned rows=4000 bytes=1234567 batches=4 seconds=1.2 oldest_left=2026-11-06T01:00:00.250000Z window=30d cutoff=2026-11-06T01:00:00.000000Z lock_retries=0 result=complete"
        );
        assert_eq!(s.exit_code(), 0);
        let s = summary(Ending::TimeLimit(60));
        assert!(s.to_string().ends_with("result=stopped_at_max_seconds (60 s; rows older than the window may remain: run again to continue)"));
        assert_eq!(s.exit_code(), STOPPED_EARLY);
        assert_eq!(
            summary(Ending::Signal("SIGTERM")).exit_code(),
            STOPPED_EARLY
        );
        let failed = summary(Ending::Failed(PruneError::NoIndex));
        assert_eq!(failed.exit_code(), 1);
        assert!(!failed.to_string().contains('\n'));
    }

    #[test]
    fn an_empty_survey_says_none() {
        let d = DryRun {
            window: "7d".into(),
            cutoff: "2026-11-29 00:00:00.000000".into(),
            survey: result_inbox::prune::Survey {
                rows: 0,
                bytes: 0,
                oldest: None,
                newest: None,
            },
        };
        assert_eq!(
            d.to_string(),
            "dry_run rows=0 bytes=0 oldest=none newest=none window=7d cutoff=2026-11-29T00:00:00.000000Z: nothing deleted"
        );
    }
}
