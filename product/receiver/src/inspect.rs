//! Read-only operator tools: `receiver digest`, `receiver inspect`, `receiver retention`.
//!
//! The source keeps records "for inspection" after a failed demo, a conflict or a spent budget;
//! these commands do the inspecting. None of them writes anything, and none needs more than the
//! runtime account's SELECT. None prints a frozen event or result unless asked (`--show-event`),
//! and none prints a token, a password or a lease proof.

use std::fmt::Write as _;

use serde_json::json;
use sqlx::{Connection, Row};

use result_inbox::canonical::{Digest, Document};
use result_inbox::connect::connect_one;
use result_inbox::Dsn;
use result_inbox::StorageError;
use result_inbox::{ConsumerName, EventId, QueueId, TaskEvent, TaskId};

/// Reads an event from `path`: a regular file only (a FIFO, a device or a directory is refused
/// before it is opened, so nothing hangs), and at most one byte more than an event may have,
/// so that an oversized file is refused as `too_large` without being read whole.
pub fn read_event_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let shown = path.display();
    let kind = |t: std::fs::FileType| -> Option<&'static str> {
        use std::os::unix::fs::FileTypeExt;
        match () {
            _ if t.is_file() => None,
            _ if t.is_dir() => Some("a directory"),
            _ if t.is_fifo() => Some("a named pipe"),
            _ if t.is_socket() => Some("a socket"),
            _ if t.is_char_device() || t.is_block_device() => Some("a device"),
            _ => Some("not a regular file"),
        }
    };
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    if let Some(what) = kind(meta.file_type()) {
        return Err(format!(
            "cannot read {shown}: it is {what}, not a regular file"
        ));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut raw = Vec::new();
    file.take(result_inbox::canonical::MAX_EVENT_BYTES as u64 + 1)
        .read_to_end(&mut raw)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    Ok(raw)
}

/// What `receiver digest` prints: the canonical bytes and their SHA-256, or the rejection kind.
pub fn digest(
    raw: &[u8],
    queue: Option<&QueueId>,
) -> Result<(Vec<u8>, Digest), (&'static str, String)> {
    match queue {
        Some(q) => TaskEvent::parse(raw, q)
            .map(|e| (e.canonical().to_vec(), e.digest()))
            .map_err(|r| (r.kind(), r.to_string())),
        None => {
            let doc = Document::parse(raw).map_err(|e| (e.kind().as_str(), e.to_string()))?;
            let bytes = doc.into_canonical();
            let d = Digest::of(&bytes);
            Ok((bytes, d))
        }
    }
}

/// One inbox row, as shown.
#[derive(Debug, Clone)]
pub struct InboxRow {
    pub event_id: String,
    pub digest: String,
    pub applied: bool,
    pub received_at: String,
    pub task_id: String,
    pub version: u64,
    /// Only with `--show-event`.
    pub event: Option<String>,
}

/// A task view, as shown.
#[derive(Debug, Clone)]
pub struct ViewRow {
    pub task_id: String,
    pub version: u64,
    pub last_event_id: String,
    pub state: String,
    pub applied_events: u64,
    pub created_at: String,
    pub updated_at: String,
}

/// One delivery from the platform (never a proof).
#[derive(Debug, Clone)]
pub struct DeliveryRow {
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub state: String,
    pub attempts: u32,
    pub budget: u32,
    pub lease_expires_at: Option<String>,
}

/// What `inspect` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Event(EventId),
    Task(TaskId),
}

/// The platform side of an inspection.
#[derive(Debug, Clone)]
pub enum PlatformPart {
    NotConfigured,
    Unavailable(String),
    Deliveries(Vec<DeliveryRow>),
}

/// Everything `inspect` found, and its verdict.
#[derive(Debug, Clone)]
pub struct Report {
    pub consumer: String,
    pub queue: String,
    pub inbox: Vec<InboxRow>,
    pub view: Option<ViewRow>,
    pub platform: PlatformPart,
    pub verdict: String,
}

const TS: &str = "%Y-%m-%dT%H:%i:%s.%fZ";

fn text(row: &sqlx::mysql::MySqlRow, i: usize) -> Result<String, sqlx::Error> {
    let b: Vec<u8> = row.try_get(i)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// Reads the database side of an inspection.
pub async fn read(
    dsn: &Dsn,
    consumer: &ConsumerName,
    queue: &QueueId,
    target: &Target,
    show_event: bool,
) -> Result<(Vec<InboxRow>, Option<ViewRow>), StorageError> {
    let fail = |e: sqlx::Error| StorageError::from_sqlx(&e);
    let mut conn = connect_one(dsn).await?;
    if let Some(warning) = result_inbox::migrate::check(&mut conn).await?.warning() {
        eprintln!("receiver inspect: warning: {warning}");
    }
    let select = format!(
        "SELECT event_id, event_digest, applied, CAST(DATE_FORMAT(received_at, '{TS}') AS BINARY), event_canonical \
         FROM receiver_inbox WHERE consumer_name = ? AND queue_id = ? AND "
    );
    let rows = match target {
        Target::Event(e) => sqlx::query(&format!("{select} event_id = ?"))
            .bind(consumer.as_str().as_bytes())
            .bind(queue.as_str().as_bytes())
            .bind(e.as_str().as_bytes())
            .fetch_all(&mut conn)
            .await
            .map_err(fail)?,
        // The inbox has no task column: the canonical form spells the member exactly so, which
        // narrows the rows; the parsed envelope then decides (below).
        Target::Task(t) => {
            let needle = format!("\"task_id\":{}", serde_json::Value::from(t.as_str()));
            sqlx::query(&format!(
                "{select} LOCATE(?, event_canonical) > 0 ORDER BY received_at"
            ))
            .bind(consumer.as_str().as_bytes())
            .bind(queue.as_str().as_bytes())
            .bind(needle.as_bytes())
            .fetch_all(&mut conn)
            .await
            .map_err(fail)?
        }
    };
    let mut inbox = Vec::new();
    for r in &rows {
        let canonical: Vec<u8> = r.try_get(4).map_err(fail)?;
        let digest: Vec<u8> = r.try_get(1).map_err(fail)?;
        let event = TaskEvent::parse(&canonical, queue).ok();
        // The text search above also finds a `"task_id":…` inside another task's result:
        // only the envelope's own field decides.
        if let Target::Task(t) = target {
            if event.as_ref().map(|e| e.task().as_str()) != Some(t.as_str()) {
                continue;
            }
        }
        inbox.push(InboxRow {
            event_id: text(r, 0).map_err(fail)?,
            digest: digest.iter().map(|b| format!("{b:02x}")).collect(),
            applied: r.try_get(2).map_err(fail)?,
            received_at: text(r, 3).map_err(fail)?,
            task_id: event
                .as_ref()
                .map(|e| e.task().to_string())
                .unwrap_or_default(),
            version: event.as_ref().map(|e| e.version()).unwrap_or(0),
            event: show_event.then(|| String::from_utf8_lossy(&canonical).into_owned()),
        });
    }
    let task = match target {
        Target::Task(t) => Some(t.to_string()),
        Target::Event(_) => inbox.first().map(|r| r.task_id.clone()),
    };
    let view = match task {
        None => None,
        Some(task) => sqlx::query(&format!(
            "SELECT task_id, task_version, last_event_id, last_state, applied_events, \
             CAST(DATE_FORMAT(created_at, '{TS}') AS BINARY), CAST(DATE_FORMAT(updated_at, '{TS}') AS BINARY) \
             FROM receiver_task_views WHERE consumer_name = ? AND queue_id = ? AND task_id = ?"
        ))
        .bind(consumer.as_str().as_bytes())
        .bind(queue.as_str().as_bytes())
        .bind(task.as_bytes())
        .fetch_optional(&mut conn)
        .await
        .map_err(fail)?
        .map(|r| -> Result<ViewRow, sqlx::Error> {
            Ok(ViewRow {
                task_id: text(&r, 0)?,
                version: r.try_get(1)?,
                last_event_id: text(&r, 2)?,
                state: text(&r, 3)?,
                applied_events: r.try_get(4)?,
                created_at: text(&r, 5)?,
                updated_at: text(&r, 6)?,
            })
        })
        .transpose()
        .map_err(fail)?,
    };
    let _ = conn.close().await;
    Ok((inbox, view))
}

/// The one-line verdict a person can act on.
pub fn verdict(
    target: &Target,
    inbox: &[InboxRow],
    view: Option<&ViewRow>,
    platform: &PlatformPart,
    compared: Option<&Digest>,
) -> String {
    if let (Some(d), Some(row)) = (compared, inbox.first()) {
        if d.to_hex() != row.digest {
            return "conflict (digest differs from the committed record)".into();
        }
    }
    let deliveries: &[DeliveryRow] = match platform {
        PlatformPart::Deliveries(d) => d,
        _ => &[],
    };
    let expired = deliveries.iter().find(|d| d.state == "EXPIRED");
    let not_received = || match expired {
        Some(d) => format!(
            "expired (attempts {} of {}; add budget after fixing the cause)",
            d.attempts, d.budget
        ),
        None if deliveries
            .iter()
            .any(|d| d.state == "PENDING" || d.state == "LEASED") =>
        {
            "not_received (a delivery is still pending)".into()
        }
        None => "not_received".into(),
    };
    match target {
        Target::Event(_) => match inbox.first() {
            Some(row) if row.applied => "applied".into(),
            Some(_) => format!("stale (view at v{})", view.map(|v| v.version).unwrap_or(0)),
            None => not_received(),
        },
        Target::Task(_) => match view {
            Some(v) if expired.is_none() => format!(
                "applied (view at v{}, {} {})",
                v.version,
                v.applied_events,
                if v.applied_events == 1 {
                    "advance"
                } else {
                    "advances"
                }
            ),
            Some(v) => format!("applied up to v{}, but {}", v.version, not_received()),
            None => not_received(),
        },
    }
}

impl Report {
    /// Human-readable lines.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "consumer={} queue={}", self.consumer, self.queue);
        if self.inbox.is_empty() {
            let _ = writeln!(s, "inbox: no row");
        }
        for r in &self.inbox {
            let _ = writeln!(
                s,
                "inbox: event_id={} task_id={} task_version={} sha256={} applied={} received_at={}",
                r.event_id, r.task_id, r.version, r.digest, r.applied, r.received_at
            );
            if let Some(e) = &r.event {
                let _ = writeln!(s, "inbox: event={e}");
            }
        }
        match &self.view {
            None => {
                let _ = writeln!(s, "view: no row");
            }
            Some(v) => {
                let _ = writeln!(
                    s,
                    "view: task_id={} task_version={} last_event_id={} state={} applied_events={} created_at={} updated_at={}",
                    v.task_id, v.version, v.last_event_id, v.state, v.applied_events, v.created_at, v.updated_at
                );
            }
        }
        match &self.platform {
            PlatformPart::NotConfigured => {
                let _ = writeln!(s, "platform: not configured (set ORBIT_URL, credentials and ORBIT_SUBSCRIPTION_ID to see deliveries)");
            }
            PlatformPart::Unavailable(why) => {
                let _ = writeln!(
                    s,
                    "platform: unavailable ({why}); the database side above is complete"
                );
            }
            PlatformPart::Deliveries(ds) if ds.is_empty() => {
                let _ = writeln!(s, "platform: no delivery on this subscription");
            }
            PlatformPart::Deliveries(ds) => {
                for d in ds {
                    let _ = writeln!(
                        s,
                        "platform: delivery_id={} event_id={} type={} state={} attempts={} budget={} lease_expires_at={}",
                        d.id,
                        d.event_id,
                        d.event_type,
                        d.state,
                        d.attempts,
                        d.budget,
                        d.lease_expires_at.as_deref().unwrap_or("-")
                    );
                }
            }
        }
        let _ = write!(s, "verdict={}", self.verdict);
        s
    }

    /// The same as one JSON object.
    pub fn json(&self) -> serde_json::Value {
        json!({
            "consumer": self.consumer,
            "queue": self.queue,
            "inbox": self.inbox.iter().map(|r| json!({
                "event_id": r.event_id, "task_id": r.task_id, "task_version": r.version,
                "sha256": r.digest, "applied": r.applied, "received_at": r.received_at,
                "event": r.event,
            })).collect::<Vec<_>>(),
            "view": self.view.as_ref().map(|v| json!({
                "task_id": v.task_id, "task_version": v.version, "last_event_id": v.last_event_id,
                "state": v.state, "applied_events": v.applied_events,
                "created_at": v.created_at, "updated_at": v.updated_at,
            })),
            "platform": match &self.platform {
                PlatformPart::NotConfigured => json!({"status": "not_configured"}),
                PlatformPart::Unavailable(why) => json!({"status": "unavailable", "reason": why}),
                PlatformPart::Deliveries(ds) => json!({"status": "ok", "deliveries": ds.iter().map(|d| json!({
                    "delivery_id": d.id, "event_id": d.event_id, "type": d.event_type, "state": d.state,
                    "attempts": d.attempts, "budget": d.budget, "lease_expires_at": d.lease_expires_at,
                })).collect::<Vec<_>>()}),
            },
            "verdict": self.verdict,
        })
    }
}

/// One line of `receiver retention`.
#[derive(Debug, Clone)]
pub struct RetentionRow {
    pub consumer: String,
    pub queue: String,
    pub inbox_rows: i64,
    pub oldest: String,
    pub newest: String,
    pub approx_bytes: i64,
    pub views: i64,
}

/// Inbox rows per consumer name and queue, with their age span and size, and the views.
pub async fn retention(dsn: &Dsn) -> Result<Vec<RetentionRow>, StorageError> {
    let fail = |e: sqlx::Error| StorageError::from_sqlx(&e);
    let mut conn = connect_one(dsn).await?;
    let rows = sqlx::query(&format!(
        "SELECT i.consumer_name, i.queue_id, COUNT(*), \
         CAST(DATE_FORMAT(MIN(i.received_at), '{TS}') AS BINARY), CAST(DATE_FORMAT(MAX(i.received_at), '{TS}') AS BINARY), \
         CAST(SUM(LENGTH(i.event_canonical) + 64 + LENGTH(i.event_id)) AS SIGNED), \
         (SELECT COUNT(*) FROM receiver_task_views v WHERE v.consumer_name = i.consumer_name AND v.queue_id = i.queue_id) \
         FROM receiver_inbox i GROUP BY i.consumer_name, i.queue_id ORDER BY i.consumer_name, i.queue_id"
    ))
    .fetch_all(&mut conn)
    .await
    .map_err(fail)?;
    let mut out = Vec::new();
    for r in &rows {
        out.push(RetentionRow {
            consumer: text(r, 0).map_err(fail)?,
            queue: text(r, 1).map_err(fail)?,
            inbox_rows: r.try_get(2).map_err(fail)?,
            oldest: text(r, 3).map_err(fail)?,
            newest: text(r, 4).map_err(fail)?,
            approx_bytes: r.try_get(5).map_err(fail)?,
            views: r.try_get(6).map_err(fail)?,
        });
    }
    let _ = conn.close().await;
    Ok(out)
}

/// Runs an inspection: the database side, then the platform's deliveries when configured.
pub async fn inspect(
    config: &crate::config::InspectConfig,
    target: &Target,
    show_event: bool,
    compared: Option<&Digest>,
) -> Result<Report, StorageError> {
    let (inbox, view) = read(&config.dsn, &config.name, &config.queue, target, show_event).await?;
    let platform = match &config.platform {
        None => PlatformPart::NotConfigured,
        Some((p, subscription)) => match deliveries(p, subscription, target, &inbox).await {
            Ok(d) => PlatformPart::Deliveries(d),
            Err(e) => PlatformPart::Unavailable(e),
        },
    };
    let verdict = verdict(target, &inbox, view.as_ref(), &platform, compared);
    Ok(Report {
        consumer: config.name.to_string(),
        queue: config.queue.to_string(),
        inbox,
        view,
        platform,
        verdict,
    })
}

async fn deliveries(
    p: &crate::config::PlatformConfig,
    subscription: &orbit_sdk::SubscriptionId,
    target: &Target,
    inbox: &[InboxRow],
) -> Result<Vec<DeliveryRow>, String> {
    let client = p.client().map_err(|e| e.to_string())?;
    let task = match target {
        Target::Task(t) => Some(t.to_string()),
        Target::Event(_) => inbox.first().map(|r| r.task_id.clone()),
    };
    let all = client
        .list_deliveries(
            subscription,
            &orbit_sdk::DeliveryFilter {
                task_id: task,
                limit: Some(10_000),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(all
        .into_iter()
        .filter(|d| match target {
            Target::Event(e) => d.event_id == e.as_str(),
            Target::Task(_) => true,
        })
        .map(|d| DeliveryRow {
            id: d.id.into_string(),
            event_id: d.event_id,
            event_type: d.event_type,
            state: d.state,
            attempts: d.attempts,
            budget: d.budget,
            lease_expires_at: d.lease_expires_at,
        })
        .collect())
}
