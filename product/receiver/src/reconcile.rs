//! `receiver reconcile`: after the receiver's database went back in time (a restore), what the
//! platform holds as ACKED but the inbox lacks is found and delivered again.
//!
//! The platform's listing of ACKED deliveries (`GET /v1/subscriptions/{id}/acked`) is read page
//! by page; each page costs one indexed lookup in the inbox (`event_id IN (…)` under the
//! primary key's prefix), never one per delivery. A missing event is not applied here: the
//! platform is asked to deliver it again (`POST /v1/deliveries/{id}/redeliver`), so it takes the
//! one path every event takes, `consume` and its dedup. An event the platform delivered more
//! than once is asked for once: its other ACKED deliveries are reported, not redelivered. The
//! run writes nothing to the database.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Instant;

use orbit_sdk::wire::{SCOPE_EVENTS_MANAGE, SCOPE_EVENTS_READ};
use orbit_sdk::SdkError;
use sqlx::{Connection, MySqlConnection};

use crate::cli::ReconcileArgs;
use crate::config::ReconcileConfig;
use crate::progress::Progress;

/// Deliveries per page of the platform's listing.
pub const PAGE: u32 = 1_000;
/// The exit status of a `--dry-run` that found events missing.
pub const MISSING: u8 = 3;

/// Why a run could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("{0}")]
    Platform(#[source] SdkError),
    #[error("the credential lacks {0}: {1}")]
    Scope(&'static str, &'static str),
    #[error("subscription {id} is for queue {actual:?}, not the configured {configured:?}")]
    WrongQueue {
        id: String,
        actual: String,
        configured: String,
    },
    #[error("the receiver database: {0}")]
    Database(String),
}

impl ReconcileError {
    /// 2 for what the user must change (the credential, the subscription, the window); 1 when
    /// the platform or the database failed.
    pub fn exit_code(&self) -> u8 {
        match self {
            ReconcileError::Platform(_) | ReconcileError::Database(_) => 1,
            _ => 2,
        }
    }
}

/// What a run saw and did.
#[derive(Debug, Default)]
pub struct Summary {
    pub window: String,
    /// ACKED deliveries in the window.
    pub deliveries: u64,
    /// Of those, with an inbox row.
    pub present: u64,
    pub missing: u64,
    /// The events of the missing deliveries: fewer when the platform delivered one event more
    /// than once.
    pub missing_events: u64,
    /// Missing events the platform accepted to deliver again (one delivery each).
    pub redelivered: u64,
    /// Missing events whose delivery it refused to (no longer ACKED: already on its way again).
    pub refused: u64,
    /// Without a row, but ACKED before the inbox's oldest row: removed by `receiver prune`,
    /// not lost (a restore loses the newest rows, never the oldest); not redelivered unless
    /// `--allow-pruned-window`.
    pub pruned: u64,
    pub pages: u64,
    /// When the platform forgets ACKED deliveries after a retention and the window starts
    /// before what it still holds: the oldest ACK time it lists them all from. What the inbox
    /// lost of the events ACKED before it cannot be found or recovered from the platform.
    pub retained_since: Option<String>,
    pub seconds: f64,
    pub dry_run: bool,
    /// Why the run stopped early, if it did.
    pub failed: Option<String>,
}

impl Summary {
    /// The exit status `receiver reconcile` ends with.
    pub fn exit_code(&self) -> u8 {
        match (&self.failed, self.dry_run, self.missing) {
            (Some(_), _, _) => 1,
            (None, true, m) if m > 0 => MISSING,
            _ => 0,
        }
    }

    fn result(&self) -> &'static str {
        match (&self.failed, self.dry_run, self.missing) {
            (Some(_), _, _) => "failed",
            (None, _, 0) => "clean",
            (None, true, _) => "missing",
            (None, false, _) => "redelivered",
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reconcile window={} deliveries={} present={} missing={} missing_events={} redelivered={} refused={} pruned={} pages={} retained_since={} seconds={:.1} result={}",
            self.window,
            self.deliveries,
            self.present,
            self.missing,
            self.missing_events,
            self.redelivered,
            self.refused,
            self.pruned,
            self.pages,
            self.retained_since.as_deref().unwrap_or("-"),
            self.seconds,
            self.result()
        )
    }
}

/// Runs `receiver reconcile`, printing each missing delivery on standard output as it is
/// found. `Err` when nothing was checked (configuration, scopes, queue, connection, window);
/// a failure after the first page is the summary's `failed`.
pub async fn run(
    config: &ReconcileConfig,
    args: &ReconcileArgs,
) -> Result<Summary, ReconcileError> {
    let started = Instant::now();
    let platform = &config.run.platform;
    let client = platform.client().map_err(ReconcileError::Platform)?;
    let credential = client
        .credential()
        .await
        .map_err(ReconcileError::Platform)?;
    let has = |scope: &str| credential.scopes.iter().any(|s| s == scope);
    if !has(SCOPE_EVENTS_READ) {
        return Err(ReconcileError::Scope(
            SCOPE_EVENTS_READ,
            "reconcile lists the subscription's ACKED deliveries",
        ));
    }
    if !args.dry_run && !has(SCOPE_EVENTS_MANAGE) {
        return Err(ReconcileError::Scope(
            SCOPE_EVENTS_MANAGE,
            "reconcile asks for redeliveries (--dry-run only reports)",
        ));
    }
    let subscription = client
        .get_subscription(&config.subscription)
        .await
        .map_err(ReconcileError::Platform)?;
    if subscription.queue_id != platform.queue.as_str() {
        return Err(ReconcileError::WrongQueue {
            id: subscription.id.to_string(),
            actual: subscription.queue_id,
            configured: platform.queue.to_string(),
        });
    }
    let mut db = result_inbox::connect::connect_one(&config.run.dsn)
        .await
        .map_err(|e| ReconcileError::Database(e.to_string()))?;
    let fit = result_inbox::migrate::check(&mut db)
        .await
        .map_err(|e| ReconcileError::Database(e.to_string()))?;
    if let Some(warning) = fit.warning() {
        eprintln!("receiver reconcile: warning: {warning}");
    }
    let (consumer, queue) = (config.run.name.as_str(), platform.queue.as_str());
    // The oldest row left: a delivery ACKED before it whose row is gone was pruned.
    let oldest: Option<String> = sqlx::query_scalar(
        "SELECT DATE_FORMAT(MIN(received_at), '%Y-%m-%dT%H:%i:%s.%fZ') FROM receiver_inbox \
         WHERE consumer_name = ? AND queue_id = ?",
    )
    .bind(consumer)
    .bind(queue)
    .fetch_one(&mut db)
    .await
    .map_err(|e| ReconcileError::Database(redacted(&e)))?;
    let oldest_at = oldest.as_deref().and_then(canonical_form::unix_micros);
    let mut summary = Summary {
        window: format!("{}..{}", args.since, args.until.as_deref().unwrap_or("now")),
        dry_run: args.dry_run,
        ..Summary::default()
    };
    let mut progress = Progress::new("reconcile");
    let mut after: Option<String> = None;
    // Each missing event, with the delivery reported (and, unless --dry-run, redelivered) for
    // it: one entry per event lost, across pages.
    let mut asked: HashMap<String, String> = HashMap::new();
    loop {
        let page = match client
            .list_acked(
                &config.subscription,
                &args.since,
                args.until.as_deref(),
                after.as_deref(),
                PAGE,
            )
            .await
        {
            Ok(p) => p,
            Err(e) => {
                summary.failed = Some(e.to_string());
                break;
            }
        };
        summary.pages += 1;
        if summary.pages == 1 {
            summary.retained_since = page.retained_since.filter(|h| {
                canonical_form::unix_micros(h) > canonical_form::unix_micros(&args.since)
            });
            if let Some(h) = &summary.retained_since {
                progress.clear();
                eprintln!(
                    "reconcile: the platform keeps ACKED deliveries only since {h} (its retention), and the window starts at {}: what the inbox lost of the events ACKED before {h} can be neither listed nor redelivered, so it cannot be recovered from the platform",
                    args.since
                );
            }
        }
        summary.deliveries += page.deliveries.len() as u64;
        let present = match present(&mut db, consumer, queue, &page.deliveries).await {
            Ok(p) => p,
            Err(e) => {
                summary.failed = Some(format!("the receiver database: {}", redacted(&e)));
                break;
            }
        };
        for d in &page.deliveries {
            if present.contains(d.event_id.as_bytes()) {
                summary.present += 1;
                continue;
            }
            let acked_at = d.acked_at.as_deref().unwrap_or("-");
            let before_oldest = match (canonical_form::unix_micros(acked_at), oldest_at) {
                (Some(at), Some(oldest)) => at < oldest,
                _ => false,
            };
            if before_oldest && !args.allow_pruned_window {
                summary.pruned += 1;
                continue;
            }
            summary.missing += 1;
            // The delivery already reported for this event, if one was.
            let first = match asked.entry(d.event_id.clone()) {
                Entry::Occupied(seen) => Some(seen.get().clone()),
                Entry::Vacant(slot) => {
                    slot.insert(d.id.to_string());
                    summary.missing_events += 1;
                    None
                }
            };
            let verdict = match (first, args.dry_run) {
                (Some(first), true) => format!("missing (its event also by delivery={first})"),
                (Some(first), false) => {
                    format!("missing, not redelivered: its event is, by delivery={first}")
                }
                (None, true) => "missing".to_owned(),
                (None, false) => match client.redeliver(&d.id, None).await {
                    Ok(_) => {
                        summary.redelivered += 1;
                        "missing, redelivery requested".to_owned()
                    }
                    Err(SdkError::Api { status: 409, .. }) => {
                        summary.refused += 1;
                        "missing, no longer ACKED (already on its way again)".to_owned()
                    }
                    Err(e) => {
                        summary.failed = Some(e.to_string());
                        break;
                    }
                },
            };
            progress.clear();
            println!(
                "delivery={} event={} task={} acked_at={acked_at} {verdict}",
                d.id, d.event_id, d.task_id
            );
        }
        if summary.failed.is_some() {
            break;
        }
        progress.show(|| {
            format!(
                "{} ACKED deliveries read in {} pages, {} missing so far",
                summary.deliveries, summary.pages, summary.missing
            )
        });
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    progress.clear();
    if summary.pruned > 0 {
        eprintln!(
            "reconcile: {} ACKED deliveries have no inbox row but were ACKED before its oldest row ({}): removed by receiver prune, not lost, and not redelivered (--allow-pruned-window redelivers them too)",
            summary.pruned,
            oldest.as_deref().unwrap_or("-")
        );
    }
    let _ = db.close().await;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// The event ids of `page` that have an inbox row of `consumer` and `queue`: one lookup under
/// the primary key's prefix.
async fn present(
    db: &mut MySqlConnection,
    consumer: &str,
    queue: &str,
    page: &[orbit_sdk::wire::DeliveryInfo],
) -> Result<HashSet<Vec<u8>>, sqlx::Error> {
    if page.is_empty() {
        return Ok(HashSet::new());
    }
    let sql = format!(
        "SELECT event_id FROM receiver_inbox WHERE consumer_name = ? AND queue_id = ? \
         AND event_id IN ({})",
        vec!["?"; page.len()].join(", ")
    );
    let mut query = sqlx::query_scalar::<_, Vec<u8>>(&sql)
        .bind(consumer)
        .bind(queue);
    for d in page {
        query = query.bind(d.event_id.as_str());
    }
    Ok(query.fetch_all(db).await?.into_iter().collect())
}

/// A database error as a person may see it: the server's message without the DSN.
fn redacted(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => format!("{} ({})", d.message(), d.code().unwrap_or_default()),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_one_line_and_the_exit_status_follows_what_was_found() {
        let s = Summary {
            window: "2026-12-05T10:00:00Z..now".into(),
            deliveries: 12,
            present: 9,
            missing: 3,
            missing_events: 2,
            dry_run: true,
            pages: 1,
            ..Summary::default()
        };
        assert_eq!(
            s.to_string(),
            "reconcile window=2026-12-05T10:00:00Z..now deliveries=12 present=9 missing=3 missing_events=2 redelivered=0 refused=0 pruned=0 pages=1 retained_since=- seconds=0.0 result=missing"
        );
        assert_eq!(s.exit_code(), MISSING);
        let done = Summary {
            dry_run: false,
            redelivered: 2,
            ..s
        };
        assert_eq!((done.exit_code(), done.result()), (0, "redelivered"));
        let failed = Summary {
            failed: Some("the platform: down".into()),
            ..Summary::default()
        };
        assert_eq!((failed.exit_code(), failed.result()), (1, "failed"));
    }
}
