//! The canonical corpus: every valid event of the published vectors (docs/canonical-v1.json)
//! and a few hundred drawn from the run's seed, sent byte for byte through orbit-dev's
//! `inject-event`, then each stored event, digest and view checked against the form.

use std::collections::HashMap;
use std::time::Duration;

use fastrand::Rng;
use orbit_sdk::DeliveryId;
use result_inbox::Digest;

use crate::forms::{self, Value};
use crate::world::*;
use crate::*;
use fixtures::QUEUE;

/// The published vectors, as the form's own tests read them.
const VECTORS: &str = include_str!("../../../../docs/canonical-v1.json");
/// Events drawn per run, besides the vectors'.
const DRAWN: usize = 240;

/// One event of the corpus: how the kit wrote it and what the receiver must store.
struct Sent {
    /// `vector <name>` or `drawn #<n>`: the event's name in a failure.
    label: String,
    id: String,
    task: String,
    version: u64,
    state: &'static str,
    body: String,
    canonical: String,
    /// The canonical bytes of the result member, when it is not absent or `null`.
    result: Option<String>,
}

/// The event's envelope around `result` (`None`: a `task.cancelled` event), written both ways.
struct Envelope<'a> {
    n: usize,
    namespace: &'a str,
    occurred_at: Value,
    result: Option<Value>,
}

pub(crate) async fn canonical_corpus(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let _p = w.running().await?;
    let namespace = w.orbit.credentials().namespace;
    let corpus = corpus(ctx.seed, &namespace);
    let mut deliveries: Vec<(DeliveryId, usize)> = Vec::new();
    for (i, e) in corpus.iter().enumerate() {
        let reply = w.fault(serde_json::json!({"fault": "inject-event", "body": e.body}));
        for d in reply["deliveries"].as_array().into_iter().flatten() {
            deliveries.push((
                DeliveryId::new(d.as_str().expect("a delivery id")).expect("a delivery id"),
                i,
            ));
        }
    }
    assert_eq!(deliveries.len(), corpus.len(), "one delivery per event");
    let ids: Vec<DeliveryId> = deliveries.iter().map(|(d, _)| d.clone()).collect();
    if let Err(why) = w.acked(&ids, Duration::from_secs(60), "R-CANON-2").await {
        // Name the event the receiver did not take, by its place in the corpus.
        let mut open = None;
        for (d, i) in &deliveries {
            if w.delivery(d).await.state != "ACKED" {
                open = Some(*i);
                break;
            }
        }
        let label = open.map_or("?".to_owned(), |i| corpus[i].label.clone());
        return Err(format!(
            "R-CANON-2: a valid event was not taken ({label}; docs/canonical-json.md accepts it): {why}"
        ));
    }
    let stored = stored_events(&w).await;
    let views = views(&w).await;
    for e in &corpus {
        let Some((digest, canonical)) = stored.get(e.id.as_bytes()) else {
            return Err(format!(
                "R-STORE-7: {} was ACKed with no inbox row under its id ({} bytes)",
                e.label,
                e.id.len()
            ));
        };
        let expected = e.canonical.as_bytes();
        if canonical.as_slice() != expected {
            let at = first_difference(canonical, expected);
            return Err(format!(
                "R-CANON-2 ({}): the stored event of {} is not the form's ({}; byte {at} is {}, the form writes {})",
                forms::broken_rule(canonical, expected, at),
                e.label,
                difference(canonical, expected),
                byte(canonical, at),
                byte(expected, at)
            ));
        }
        ensure!(
            digest.as_slice() == Digest::of(expected).0,
            "R-CANON-2: {}: the stored digest is not the SHA-256 of its canonical bytes",
            e.label
        );
        let Some(view) = views.get(e.task.as_bytes()) else {
            return Err(format!("R-STORE-5: {}: no view for its task", e.label));
        };
        ensure!(
            view.version == e.version && view.last_event == e.id.as_bytes() && view.state == e.state.as_bytes(),
            "R-STORE-5: {}: the view holds version {} (expected {}), state {:?} (expected {}), last event {} bytes (expected {})",
            e.label,
            view.version,
            e.version,
            String::from_utf8_lossy(&view.state),
            e.state,
            view.last_event.len(),
            e.id.len()
        );
        let result = e.result.as_ref().map(String::as_bytes);
        if view.result.as_deref() != result {
            let (stored, expected) = (view.result.as_deref(), result);
            return Err(match (stored, expected) {
                (Some(s), Some(x)) => {
                    let at = first_difference(s, x);
                    format!(
                        "R-CANON-2 ({}): the view's result of {} is not the form's ({}; byte {at} is {}, the form writes {})",
                        forms::broken_rule(s, x, at),
                        e.label,
                        difference(s, x),
                        byte(s, at),
                        byte(x, at)
                    )
                }
                (None, Some(_)) => format!("R-STORE-5: {}: the view has no result", e.label),
                (_, None) => format!(
                    "R-STORE-5: {}: the view has a result where the event has none (or null)",
                    e.label
                ),
            });
        }
    }
    let vectors = corpus
        .iter()
        .filter(|e| e.label.starts_with("vector"))
        .count();
    Ok(format!(
        "{} events ({vectors} from the published vectors, {} drawn from seed {}): every stored event, digest and view result byte for byte the form's",
        corpus.len(),
        corpus.len() - vectors,
        ctx.seed
    ))
}

/// The corpus of a run: the vectors' events, then [`DRAWN`] drawn ones. Each is checked
/// against the reference form first: a disagreement is the kit's fault and stops the case.
fn corpus(seed: u64, namespace: &str) -> Vec<Sent> {
    let mut rng = Rng::with_seed(seed ^ 0xC0_4B05);
    let vectors: serde_json::Value = serde_json::from_str(VECTORS).expect("the vectors parse");
    let mut out = Vec::new();
    for v in vectors["vectors"].as_array().expect("a vectors array") {
        let (Some(name), Some(input), Some(canonical)) = (
            v["name"].as_str(),
            v["input"].as_str(),
            v["canonical"].as_str(),
        ) else {
            continue; // a refusal, or an input too large to carry inside an event
        };
        let label = format!("vector {name}");
        // Top-level members as raw text: a vector's numbers may be past any float (1e400).
        let parsed: Members = serde_json::from_str(input).expect("a valid vector");
        let n = out.len();
        let whole_event = parsed.contains_key("id")
            && text_of(&parsed, "queue_id").as_deref() == Some(QUEUE)
            && text_of(&parsed, "namespace").as_deref() == Some(namespace);
        let envelope = if whole_event {
            // A whole event: sent as published.
            out.push(whole(label, input, canonical, &parsed));
            continue;
        } else if let Some(at) = text_of(&parsed, "occurred_at") {
            let normal: serde_json::Value = serde_json::from_str(canonical).expect("JSON");
            Envelope {
                n,
                namespace,
                occurred_at: Value::Given {
                    sent: serde_json::Value::from(at.as_str()).to_string(),
                    canonical: normal["occurred_at"].to_string(),
                },
                result: Some(Value::draw_object(&mut rng, 1)),
            }
        } else {
            Envelope {
                n,
                namespace,
                occurred_at: forms::draw_timestamp(&mut rng),
                result: Some(Value::Given {
                    sent: input.to_owned(),
                    canonical: canonical.to_owned(),
                }),
            }
        };
        out.push(envelope.write(&mut rng, label));
    }
    for i in 0..DRAWN {
        let n = out.len();
        let result = match rng.u8(0..8) {
            0 => None,
            1 => Some(Value::Literal("null")),
            2 => Some(Value::draw(&mut rng, 3)),
            _ => Some(Value::draw_object(&mut rng, 3)),
        };
        let envelope = Envelope {
            n,
            namespace,
            occurred_at: forms::draw_timestamp(&mut rng),
            result,
        };
        out.push(envelope.write(&mut rng, format!("drawn #{i} (seed {seed})")));
    }
    for e in &out {
        let (reference, _) = result_inbox::canonicalize(e.body.as_bytes()).unwrap_or_else(|err| {
            panic!(
                "the kit wrote an event the form refuses ({}): {err}",
                e.label
            )
        });
        assert!(
            reference == e.canonical.as_bytes(),
            "the kit's two writings of {} disagree with the reference form",
            e.label
        );
    }
    out
}

/// A vector's top-level members, their values as raw text.
type Members = std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>;

/// Member `name` of `members` when it is a string.
fn text_of(members: &Members, name: &str) -> Option<String> {
    members
        .get(name)
        .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
}

/// A published whole event, sent as it is.
fn whole(label: String, input: &str, canonical: &str, parsed: &Members) -> Sent {
    let text = |k: &str| text_of(parsed, k).expect("a string member");
    let result = parsed.get("result").filter(|r| r.get() != "null").map(|_| {
        let c: Members = serde_json::from_str(canonical).expect("JSON");
        c["result"].get().to_owned()
    });
    Sent {
        label,
        id: text("id"),
        task: text("task_id"),
        version: parsed["task_version"].get().parse().expect("a version"),
        state: state_of(&text("state")),
        body: input.to_owned(),
        canonical: canonical.to_owned(),
        result,
    }
}

fn state_of(s: &str) -> &'static str {
    match s {
        "SUCCEEDED" => "SUCCEEDED",
        "NEEDS_REVIEW" => "NEEDS_REVIEW",
        "CANCELLED" => "CANCELLED",
        "RUNNING" => "RUNNING",
        other => {
            panic!("a vector event in state {other}, which the kit's subscription does not take")
        }
    }
}

impl Envelope<'_> {
    /// The event, with an id, task and version drawn in the forms a platform may use.
    fn write(self, rng: &mut Rng, label: String) -> Sent {
        let n = self.n;
        let id = match rng.u8(0..6) {
            0 => format!("{:032x}", rng.u128(..)),
            1 => format!(
                "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
                rng.u32(..),
                rng.u16(..),
                rng.u16(..0x1000),
                rng.u16(..0x1000),
                rng.u64(..1 << 48)
            ),
            2 => format!("évènement/{n}:😀"),
            3 => format!("{n:x}{}", "x".repeat(124))
                .chars()
                .take(128)
                .collect(),
            4 => format!("EVT_{n}"),
            _ => format!("evt {n} <a&b> \"q\" \\"),
        };
        let task = match rng.u8(0..4) {
            0 => format!("tâche/{n}"),
            1 => format!("task_{n:x}_{}", "0".repeat(40)),
            2 => format!("T-{n}"),
            _ => format!("task:{n}:{}", rng.u32(..)),
        };
        let version: u64 = [1, 2, 9_007_199_254_740_993, 4_294_967_296, u64::MAX][rng.usize(0..5)];
        let (kind, state) = match (&self.result, rng.bool()) {
            (None, _) => ("task.cancelled", "CANCELLED"),
            (Some(_), true) => ("task.succeeded", "SUCCEEDED"),
            (Some(_), false) => ("task.needs_review", "NEEDS_REVIEW"),
        };
        let result = self
            .result
            .as_ref()
            .map(Value::canonical)
            .filter(|r| r != "null");
        let mut members = vec![
            ("id".to_owned(), Value::Str(id.clone())),
            ("type".to_owned(), Value::Str(kind.into())),
            ("namespace".to_owned(), Value::Str(self.namespace.into())),
            ("queue_id".to_owned(), Value::Str(QUEUE.into())),
            ("task_id".to_owned(), Value::Str(task.clone())),
            (
                "task_version".to_owned(),
                Value::Number(version.to_string()),
            ),
            ("state".to_owned(), Value::Str(state.into())),
            ("occurred_at".to_owned(), self.occurred_at),
        ];
        if let Some(r) = self.result {
            members.push(("result".to_owned(), r));
        }
        if rng.u8(0..4) == 0 {
            // A member the receiver does not know: kept in the canonical bytes.
            members.push(("trace\u{E000}😀".to_owned(), Value::draw(rng, 2)));
        }
        let event = Value::Object(members);
        Sent {
            label,
            id,
            task,
            version,
            state,
            body: event.sent(rng),
            canonical: event.canonical(),
            result,
        }
    }
}

/// Every inbox row of the kit's consumer and queue: event id to digest and canonical bytes.
async fn stored_events(w: &World) -> HashMap<Vec<u8>, (Vec<u8>, Vec<u8>)> {
    let mut c = w.admin().await;
    let rows: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT event_id, event_digest, event_canonical FROM receiver_inbox \
         WHERE consumer_name = ? AND queue_id = ?",
    )
    .bind(RECEIVER_NAME)
    .bind(QUEUE)
    .fetch_all(&mut c)
    .await
    .expect("the inbox reads");
    rows.into_iter().map(|(id, d, c)| (id, (d, c))).collect()
}

/// A view as the corpus reads it.
struct StoredView {
    version: u64,
    last_event: Vec<u8>,
    state: Vec<u8>,
    result: Option<Vec<u8>>,
}

/// Every view of the kit's consumer and queue, by task id.
async fn views(w: &World) -> HashMap<Vec<u8>, StoredView> {
    let mut c = w.admin().await;
    // Task id, version, last event id, last state, last result.
    type Row = (Vec<u8>, u64, Vec<u8>, Vec<u8>, Option<Vec<u8>>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT task_id, task_version, last_event_id, last_state, last_result \
         FROM receiver_task_views WHERE consumer_name = ? AND queue_id = ?",
    )
    .bind(RECEIVER_NAME)
    .bind(QUEUE)
    .fetch_all(&mut c)
    .await
    .expect("the views read");
    rows.into_iter()
        .map(|(task, version, last_event, state, result)| {
            (
                task,
                StoredView {
                    version,
                    last_event,
                    state,
                    result,
                },
            )
        })
        .collect()
}

fn first_difference(a: &[u8], b: &[u8]) -> usize {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()))
}

/// Byte `at` of `bytes` as hex (never more of the content), or "the end".
fn byte(bytes: &[u8], at: usize) -> String {
    bytes
        .get(at)
        .map_or("the end".to_owned(), |b| format!("0x{b:02x}"))
}
