//! The canonical form against its published vectors, plus properties no finite list covers.

use super::*;
use proptest::prelude::*;

const VECTORS: &str = include_str!("../../../docs/canonical-v1.json");

struct Vector {
    name: String,
    input: Vec<u8>,
    expect: Result<(String, String), String>,
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex in vector file"))
        .collect()
}

fn vectors() -> Vec<Vector> {
    let doc: serde_json::Value = serde_json::from_str(VECTORS).expect("vector file is JSON");
    doc["vectors"]
        .as_array()
        .expect("vectors array")
        .iter()
        .map(|v| {
            let name = v["name"].as_str().unwrap().to_owned();
            let input = if let Some(s) = v.get("input") {
                s.as_str().unwrap().as_bytes().to_vec()
            } else if let Some(h) = v.get("input_hex") {
                hex_bytes(h.as_str().unwrap())
            } else {
                let mut out = Vec::new();
                for part in v["input_parts"].as_array().unwrap() {
                    let text = part[0].as_str().unwrap();
                    for _ in 0..part[1].as_u64().unwrap() {
                        out.extend_from_slice(text.as_bytes());
                    }
                }
                out
            };
            let expect = match v.get("error") {
                Some(kind) => Err(kind.as_str().unwrap().to_owned()),
                None => Ok((
                    v["canonical"].as_str().unwrap().to_owned(),
                    v["sha256"].as_str().unwrap().to_owned(),
                )),
            };
            Vector {
                name,
                input,
                expect,
            }
        })
        .collect()
}

#[test]
fn every_vector_holds() {
    let vectors = vectors();
    assert!(vectors.len() >= 20, "the form promises at least 20 vectors");
    for v in &vectors {
        let got = canonicalize(&v.input);
        match (&v.expect, got) {
            (Ok((canonical, sha)), Ok((bytes, digest))) => {
                assert_eq!(
                    String::from_utf8(bytes.clone()).unwrap(),
                    *canonical,
                    "{}",
                    v.name
                );
                assert_eq!(digest.to_hex(), *sha, "{}", v.name);
                // The canonical form is a fixed point.
                let (again, _) = canonicalize(&bytes).expect("canonical bytes re-read");
                assert_eq!(again, bytes, "{} is not a fixed point", v.name);
            }
            (Err(kind), Err(e)) => assert_eq!(e.kind().as_str(), kind, "{}: {e}", v.name),
            (want, got) => panic!("{}: wanted {want:?}, got {got:?}", v.name),
        }
    }
}

#[test]
fn every_rejection_kind_has_a_vector() {
    let vectors = vectors();
    for kind in CanonErrorKind::ALL {
        assert!(
            vectors
                .iter()
                .any(|v| v.expect.as_ref().err().map(String::as_str) == Some(kind.as_str())),
            "no vector rejects with {kind}"
        );
    }
}

#[test]
fn errors_name_a_place_not_the_content() {
    let secret = r#"{"result":{"token":"hunter2","a":1,"a":2}}"#;
    let e = canonicalize(secret.as_bytes()).unwrap_err();
    assert_eq!(e.kind(), CanonErrorKind::DuplicateKey);
    assert!(!e.to_string().contains("hunter2"), "{e}");
    assert!(e.to_string().contains("at byte 10"), "{e}");
}

#[test]
fn utf16_order_differs_from_byte_order_where_it_should() {
    assert_eq!(utf16_order("\u{1F600}", "\u{E000}"), Ordering::Less);
    assert_eq!("\u{1F600}".cmp("\u{E000}"), Ordering::Greater);
    assert_eq!(utf16_order("a", "ab"), Ordering::Less);
}

#[test]
fn sha256_matches_a_known_answer() {
    // FIPS 180-2 example "abc".
    assert_eq!(
        Digest::of(b"abc").to_hex(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

/// A JSON value for property tests, rendered either way by the strategies below.
#[derive(Debug, Clone)]
enum Gen {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Gen>),
    Obj(Vec<(String, Gen)>),
}

fn gen_value() -> impl Strategy<Value = Gen> {
    let leaf = prop_oneof![
        Just(Gen::Null),
        any::<bool>().prop_map(Gen::Bool),
        "-?(0|[1-9][0-9]{0,30})(\\.[0-9]{1,5})?([eE][+-]?[0-9]{1,2})?".prop_map(Gen::Num),
        "[a-zé😀\u{e000}\"\\\\\n\u{1}/ ]{0,8}".prop_map(Gen::Str),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Gen::Arr),
            prop::collection::btree_map("[a-c😀\u{e000}]{0,3}", inner, 0..5)
                .prop_map(|m| Gen::Obj(m.into_iter().collect())),
        ]
    })
}

fn escape(s: &str, fancy: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04X}", c as u32)),
            c if fancy && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            '/' if fancy => out.push_str("\\/"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Renders `g` with members in `order` (a rotation) and with or without whitespace/escapes.
fn render(g: &Gen, rotate: usize, fancy: bool, out: &mut String) {
    let ws = if fancy { " \n\t" } else { "" };
    match g {
        Gen::Null => out.push_str("null"),
        Gen::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Gen::Num(n) => out.push_str(n),
        Gen::Str(s) => escape(s, fancy, out),
        Gen::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(ws);
                render(item, rotate, fancy, out);
            }
            out.push_str(ws);
            out.push(']');
        }
        Gen::Obj(members) => {
            out.push('{');
            let n = members.len();
            for i in 0..n {
                let (k, v) = &members[(i + rotate) % n];
                if i > 0 {
                    out.push(',');
                }
                out.push_str(ws);
                escape(k, fancy, out);
                out.push_str(ws);
                out.push(':');
                out.push_str(ws);
                render(v, rotate, fancy, out);
            }
            out.push_str(ws);
            out.push('}');
        }
    }
}

fn document(g: Gen) -> Gen {
    Gen::Obj(vec![("v".into(), g), ("w".into(), Gen::Null)])
}

/// Changes one leaf so that the document means something else.
fn mutate(g: &Gen, pick: usize) -> Gen {
    match g {
        Gen::Null => Gen::Bool(false),
        Gen::Bool(b) => Gen::Bool(!b),
        Gen::Num(n) => Gen::Num(match n.strip_prefix('-') {
            Some(positive) => positive.to_owned(),
            None => format!("-{n}"),
        }),
        Gen::Str(s) => Gen::Str(format!("{s}x")),
        Gen::Arr(items) if items.is_empty() => Gen::Arr(vec![Gen::Null]),
        Gen::Arr(items) => {
            let mut items = items.clone();
            let i = pick % items.len();
            items[i] = mutate(&items[i], pick / 7);
            Gen::Arr(items)
        }
        Gen::Obj(m) if m.is_empty() => Gen::Obj(vec![("k".into(), Gen::Null)]),
        Gen::Obj(m) => {
            let mut m = m.clone();
            let i = pick % m.len();
            m[i].1 = mutate(&m[i].1, pick / 7);
            Gen::Obj(m)
        }
    }
}

proptest! {
    #[test]
    fn key_order_and_whitespace_never_change_the_digest(g in gen_value(), rotate in 0usize..5) {
        let doc = document(g);
        let mut plain = String::new();
        render(&doc, 0, false, &mut plain);
        let mut fancy = String::new();
        render(&doc, rotate, true, &mut fancy);
        let (a, da) = canonicalize(plain.as_bytes()).unwrap();
        let (b, db) = canonicalize(fancy.as_bytes()).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(da, db);
        // serde_json (without arbitrary_precision) agrees that the canonical bytes are JSON.
        prop_assert!(serde_json::from_slice::<serde_json::Value>(&a).is_ok());
    }

    #[test]
    fn changing_any_value_changes_the_digest(g in gen_value(), pick in 0usize..10_000) {
        let doc = document(g);
        let changed = mutate(&doc, pick);
        let mut a = String::new();
        render(&doc, 0, false, &mut a);
        let mut b = String::new();
        render(&changed, 0, false, &mut b);
        let (_, da) = canonicalize(a.as_bytes()).unwrap();
        let (_, db) = canonicalize(b.as_bytes()).unwrap();
        prop_assert_ne!(da, db);
    }
}

/// A timestamp member's text: valid with any offset or `Z`, or near misses.
fn gen_timestamp() -> impl Strategy<Value = String> {
    prop_oneof![
        "20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])[Tt ](0[0-9]|1[0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?([Zz]|[+-](0[0-9]|1[0-3]):[0-5][0-9])",
        "[0-9T:.+Z-]{0,30}",
    ]
}

/// An event-shaped document: a few known members, a timestamp, a nested result, in any order.
fn gen_event() -> impl Strategy<Value = Gen> {
    (
        prop::option::of(gen_timestamp()),
        gen_value(),
        prop::collection::vec(("[a-z_\"\\\\\u{1}😀\u{e000}]{0,6}", gen_value()), 0..4),
        any::<bool>(),
    )
        .prop_map(|(ts, result, extra, number_ts)| {
            let mut m: Vec<(String, Gen)> = vec![
                ("id".into(), Gen::Str("evt-1".into())),
                ("task_version".into(), Gen::Num("3".into())),
                ("result".into(), result),
            ];
            if let Some(ts) = ts {
                let v = if number_ts {
                    Gen::Num("20261202".into())
                } else {
                    Gen::Str(ts)
                };
                m.push(("occurred_at".into(), v));
            }
            for (k, v) in extra {
                if !m.iter().any(|(n, _)| *n == k) {
                    m.push((k, v));
                }
            }
            Gen::Obj(m)
        })
}

/// Bytes that make a rendered document wrong in every way the reader distinguishes.
const NASTY: &[&[u8]] = &[
    b"\"",
    b"\\",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b" ",
    b"0",
    b"-",
    b"e",
    b".",
    b"\\u",
    b"\\ud800",
    b"\\udc00",
    b"\x01",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"\xef\xbb\xbf",
    b"tru",
    b"nul",
    b",\"id\":1",
    b"[[[[",
];

/// One edit of `raw`: a byte removed, a nasty sequence inserted or put in a byte's place, the
/// input cut short, a member repeated, or the whole wrapped in arrays up to the depth limit.
fn edit(raw: &[u8], how: u8, at: usize, pick: usize) -> Vec<u8> {
    let mut v = raw.to_vec();
    let i = if v.is_empty() { 0 } else { at % v.len() };
    let nasty = NASTY[pick % NASTY.len()];
    match how % 7 {
        0 if !v.is_empty() => {
            v.remove(i);
        }
        1 => {
            v.splice(i..i, nasty.iter().copied());
        }
        2 if !v.is_empty() => {
            v.splice(i..i + 1, nasty.iter().copied());
        }
        3 => v.truncate(i),
        4 => {
            // A duplicate name, also one written with an escape.
            let dup: &[u8] = if pick % 2 == 0 {
                b"\"id\":2,"
            } else {
                b"\"i\\u0064\":2,"
            };
            if let Some(p) = v.iter().position(|b| *b == b'{') {
                v.splice(p + 1..p + 1, dup.iter().copied());
            }
        }
        5 => {
            let n = 125 + pick % 6;
            let mut w = vec![b'['; n];
            w.extend_from_slice(&v);
            w.extend(std::iter::repeat_n(b']', n));
            v = w;
        }
        _ => {}
    }
    v
}

/// `g` rendered (members rotated, with or without whitespace and escapes), then edited.
fn generated(g: &Gen, rotate: usize, fancy: bool, edits: &[(u8, usize, usize)]) -> Vec<u8> {
    let mut text = String::new();
    render(g, rotate, fancy, &mut text);
    let mut raw = text.into_bytes();
    for &(how, at, pick) in edits {
        raw = edit(&raw, how, at, pick);
    }
    raw
}

proptest! {
    // On the same inputs: canonical bytes are their own canonical form and JSON to serde_json
    // (seen once: a number beyond an f64's range made serde_json's Value refuse valid JSON);
    // whatever is refused is refused with an error, not a panic.
    #[test]
    fn canonical_bytes_are_a_fixed_point(
        g in gen_event(),
        rotate in 0usize..5,
        fancy in any::<bool>(),
        edits in prop::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 0..3),
    ) {
        let raw = generated(&g, rotate, fancy, &edits);
        if let Ok(doc) = Document::parse(&raw) {
            let once = doc.into_canonical();
            let twice = Document::parse(&once).map(Document::into_canonical);
            prop_assert_eq!(twice.as_ref(), Ok(&once));
            // JSON syntax, not what serde_json can hold: `1e310` is valid JSON (and kept as
            // written) but out of an f64's range, so read it raw.
            prop_assert!(serde_json::from_slice::<&serde_json::value::RawValue>(&once).is_ok());
        }
    }

}

/// The generated inputs reach every answer: valid documents (with a timestamp to normalise)
/// and every rejection kind but `too_large`, which its own vector covers. (They were also the
/// inputs on which the single-pass writer was compared with the tree writer it replaced, byte
/// for byte and error for error: 1,300,000 of them, before the tree writer was removed.)
#[test]
fn the_generated_inputs_reach_every_answer() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    let strategy = (
        gen_event(),
        0usize..5,
        any::<bool>(),
        prop::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 0..3),
    );
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..3000 {
        let (g, rotate, fancy, edits) = strategy.new_tree(&mut runner).unwrap().current();
        let raw = generated(&g, rotate, fancy, &edits);
        let answer = match Document::parse(&raw) {
            Ok(_) => "valid",
            Err(e) => e.kind().as_str(),
        };
        *seen.entry(answer).or_insert(0u32) += 1;
    }
    for kind in CanonErrorKind::ALL {
        if kind != CanonErrorKind::TooLarge {
            assert!(
                seen.contains_key(kind.as_str()),
                "{kind} never produced: {seen:?}"
            );
        }
    }
    assert!(seen["valid"] >= 600, "too few valid inputs: {seen:?}");
    eprintln!("answers of 3000 generated inputs: {seen:?}");
}

/// Counts the bytes this thread holds on the heap, and the most it held, for the fuzz run's
/// memory bound (thread-local: tests run side by side).
struct Tracking;

thread_local! {
    static HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static PEAK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn held(change: isize) {
    let _ = HELD.try_with(|h| {
        let now = h.get().saturating_add_signed(change);
        h.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

// SAFETY: every call goes to the system allocator unchanged; only thread-local counters are
// added, which allocate nothing.
unsafe impl std::alloc::GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        held(layout.size() as isize);
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        held(-(layout.size() as isize));
        // SAFETY: `ptr` came from the system allocator with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        held(size as isize - layout.size() as isize);
        // SAFETY: `ptr` came from the system allocator with this layout.
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static TRACKING: Tracking = Tracking;

/// Cases of each fuzz run: 4,000 in `make test`, more with `PROPTEST_CASES`.
fn fuzz_cases() -> u32 {
    #[allow(clippy::disallowed_methods)] // the test's own length switch
    let given = std::env::var("PROPTEST_CASES").ok();
    given.and_then(|n| n.parse().ok()).unwrap_or(4000)
}

/// Parses `raw` and checks the bounds every input must keep: an answer (no panic), within a
/// second, holding at most three times the input plus 64 KiB on the heap meanwhile.
fn parse_within_bounds(raw: &[u8]) -> Result<(), TestCaseError> {
    let before = HELD.with(std::cell::Cell::get);
    PEAK.with(|p| p.set(before));
    let started = std::time::Instant::now();
    let answer = Document::parse(raw);
    let took = started.elapsed();
    let peak = PEAK.with(std::cell::Cell::get) - before;
    drop(answer);
    prop_assert!(
        took < std::time::Duration::from_secs(1),
        "{} bytes took {took:?}",
        raw.len()
    );
    prop_assert!(
        peak <= 3 * raw.len() + 64 * 1024,
        "{} bytes held {peak} bytes of heap",
        raw.len()
    );
    Ok(())
}

proptest! {
    // The bounded fuzz run of `make test` (cargo-fuzz needs a nightly toolchain): arbitrary
    // bytes, then structured mutations of valid events. `PROPTEST_CASES=N` runs longer.
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases()))]
    #[test]
    fn fuzz_arbitrary_bytes(raw in prop::collection::vec(any::<u8>(), 0..4096)) {
        parse_within_bounds(&raw)?;
    }

    #[test]
    fn fuzz_mutated_events(
        g in gen_event(),
        rotate in 0usize..5,
        fancy in any::<bool>(),
        edits in prop::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 0..6),
    ) {
        parse_within_bounds(&generated(&g, rotate, fancy, &edits))?;
    }
}

#[test]
fn the_largest_and_deepest_inputs_stay_within_bounds() {
    // Just under the size limit, and nesting to the depth limit and one past it.
    let mut big = b"{\"a\":\"".to_vec();
    big.resize(MAX_EVENT_BYTES - 2, b'x');
    big.extend_from_slice(b"\"}");
    let deep = |n: usize| format!("{{\"a\":{}1{}}}", "[".repeat(n), "]".repeat(n)).into_bytes();
    for raw in [big, deep(MAX_DEPTH - 1), deep(MAX_DEPTH), deep(100_000)] {
        parse_within_bounds(&raw).unwrap();
    }
}
