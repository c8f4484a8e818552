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

#[path = "support/events.rs"]
mod events;
use events::{event, SIZES};

/// Counts every allocation and reallocation the process makes, so that the summary can say
/// how many one canonicalisation costs.
struct Counting;

static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

// SAFETY: every call is passed on unchanged to the system allocator; only a counter is added.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from the system allocator with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: `ptr` came from the system allocator with this layout.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Allocations (and reallocations) one call of `f` makes.
fn allocations(f: impl Fn()) -> u64 {
    let before = ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed);
    f();
    ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed) - before
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
        println!(
            "  {label}: allocations per event: ours {} (target at most 8); serde_json Value {}",
            allocations(|| ours_once(&raw, queue)),
            allocations(|| serde_value(&raw)),
        );
    }
}

fn ours_once(raw: &[u8], queue: &QueueId) {
    ours(raw, queue)
}

criterion_group!(benches, canonical);

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
