//! Canonicalises the benchmark events (`benches/support/events.rs`) a given number of times,
//! for `make bench-instructions`, which runs it under valgrind's callgrind twice per size (once
//! with 0 rounds, once with N) and divides the difference by the bytes read: instructions per
//! byte, which repeat exactly where timings do not.
//!
//! `canon_instructions <1KiB|64KiB|512KiB> <rounds> <ours|ours+sha256|event|serde_value>`

#[path = "../benches/support/events.rs"]
mod events;

use std::hint::black_box;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: canon_instructions <1KiB|64KiB|512KiB> <rounds> <ours|ours+sha256|event|serde_value>";
    let [size, rounds, what] = args.as_slice() else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let Some((_, bytes)) = events::SIZES.iter().find(|(label, _)| label == size) else {
        eprintln!("unknown size {size:?}; {usage}");
        std::process::exit(2);
    };
    let Ok(rounds) = rounds.parse::<u32>() else {
        eprintln!("rounds must be a whole number; {usage}");
        std::process::exit(2);
    };
    let raw = events::event(*bytes);
    let run: fn(&[u8]) = match what.as_str() {
        "ours" => |r| {
            black_box(result_inbox::canonical::Document::parse(r).expect("valid"));
        },
        "ours+sha256" => |r| {
            black_box(result_inbox::canonicalize(r).expect("valid"));
        },
        "event" => |r| {
            let queue = result_inbox::QueueId::new("inbox-demo").expect("a valid queue");
            black_box(result_inbox::TaskEvent::parse(r, &queue).expect("a valid event"));
        },
        "serde_value" => |r| {
            black_box(serde_json::from_slice::<serde_json::Value>(r).expect("valid"));
        },
        other => {
            eprintln!("unknown candidate {other:?}; {usage}");
            std::process::exit(2);
        }
    };
    for _ in 0..rounds {
        run(black_box(&raw));
    }
    println!("bytes={}", raw.len());
}
