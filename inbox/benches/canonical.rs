//! Canonicalise + SHA-256 against three references on the same bytes, in one run:
//! serde_json into a `Value` (the common way), serde_json into `IgnoredAny` (a validating scan,
//! the practical ceiling), and serde_jcs from a `Value` (what a user would pick off the shelf).
//!
//! Events of about 1 KiB, 64 KiB and 512 KiB with realistic shapes: a task event whose result
//! nests objects and arrays, long strings with escapes and non-ASCII text, and many numbers
//! (big integers, decimals with trailing zeros, exponents). Criterion reports each; the summary
//! at the end measures all of them again in alternating rounds and prints the ratios
//! `docs/benchmarks.md` quotes. Run with `make bench` (or `cargo bench -p receiver --bench canonical`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use result_inbox::QueueId;

/// A task event of about `target` bytes.
fn event(target: usize) -> Vec<u8> {
    let mut items = Vec::new();
    let mut i = 0u64;
    let mut size = 0;
    while size < target.saturating_sub(400) {
        let item = format!(
            r#"{{"sku":"SKU-{i:06}","name":"Widget \"{i}\" – größe {i} 组件","qty":{q},"price":{p}.{c:02}0,"total":123456789012345678901234567{d:03},"ratio":{i}.5e-3,"tags":["a\\tb","c/d","é😀"],"ok":{ok},"note":null,"dims":{{"w":{w},"h":{h},"unit":"mm"}}}}"#,
            q = i % 17 + 1,
            p = i % 997,
            c = i % 100,
            d = i % 1000,
            ok = i % 2 == 0,
            w = i * 3,
            h = i * 7
        );
        size += item.len() + 1;
        items.push(item);
        i += 1;
    }
    let body = format!(
        r#"{{ "type": "task.succeeded", "id": "evt-bench", "namespace": "default", "queue_id": "inbox-demo",
  "task_id": "task-bench", "task_version": 7, "state": "SUCCEEDED", "occurred_at": "2026-12-02T22:17:05.123456+08:00",
  "result": {{ "order": {{ "items": [{}], "currency": "EUR", "customer": {{ "id": 42, "name": "Zoë" }} }} }} }}"#,
        items.join(",")
    );
    assert!(
        body.len() <= result_inbox::canonical::MAX_EVENT_BYTES,
        "{}",
        body.len()
    );
    body.into_bytes()
}

fn ours(raw: &[u8], queue: &QueueId) {
    let e = result_inbox::TaskEvent::parse(raw, queue).expect("a valid event");
    black_box(e.digest());
}

fn serde_value(raw: &[u8]) {
    let v: serde_json::Value = serde_json::from_slice(raw).unwrap();
    black_box(v);
}

fn serde_ignored(raw: &[u8]) {
    let v: serde::de::IgnoredAny = serde_json::from_slice(raw).unwrap();
    black_box(v);
}

fn jcs(raw: &[u8]) {
    let v: serde_json::Value = serde_json::from_slice(raw).unwrap();
    black_box(serde_jcs::to_vec(&v).unwrap());
}

type Candidate = (&'static str, fn(&[u8], &QueueId));

const CANDIDATES: [Candidate; 4] = [
    ("canonical+sha256 (ours)", ours),
    ("serde_json Value", |r, _| serde_value(r)),
    ("serde_json IgnoredAny", |r, _| serde_ignored(r)),
    ("serde_jcs from Value", |r, _| jcs(r)),
];

const SIZES: [(&str, usize); 3] = [("1KiB", 1024), ("64KiB", 64 * 1024), ("512KiB", 510 * 1024)];

fn canonical(c: &mut Criterion) {
    let queue = QueueId::new("inbox-demo").unwrap();
    let mut group = c.benchmark_group("canonicalise");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    for (label, size) in SIZES {
        let raw = event(size);
        group.throughput(Throughput::Bytes(raw.len() as u64));
        for (name, f) in CANDIDATES {
            group.bench_function(format!("{label}/{name}"), |b| b.iter(|| f(&raw, &queue)));
        }
    }
    group.finish();
    summary(&queue);
}

/// Alternating rounds of every candidate on every size; MB/s and ratios to ours.
fn summary(queue: &QueueId) {
    println!(
        "\ncanonicalise summary (MB/s = 10^6 bytes per second; alternating rounds, same bytes):"
    );
    for (label, size) in SIZES {
        let raw = event(size);
        let per_round = (2_000_000 / raw.len()).max(3);
        let mut total = [Duration::ZERO; 4];
        for _ in 0..5 {
            for (k, (_, f)) in CANDIDATES.iter().enumerate() {
                let t = Instant::now();
                for _ in 0..per_round {
                    f(&raw, queue);
                }
                total[k] += t.elapsed();
            }
        }
        let mbs = |t: Duration| (5 * per_round * raw.len()) as f64 / t.as_secs_f64() / 1e6;
        let ours = mbs(total[0]);
        println!(
            "  {label} ({} bytes): ours {ours:.0} MB/s; serde_json Value {:.0} (ours ÷ it {:.2}); IgnoredAny {:.0} (ours ÷ it {:.2}); serde_jcs {:.0} (ours ÷ it {:.2})",
            raw.len(),
            mbs(total[1]),
            ours / mbs(total[1]),
            mbs(total[2]),
            ours / mbs(total[2]),
            mbs(total[3]),
            ours / mbs(total[3]),
        );
    }
}

criterion_group!(benches, canonical);

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
