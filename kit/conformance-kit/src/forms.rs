//! Events the kit writes itself, to exercise every rule of the canonical form
//! (docs/canonical-json.md): a value is drawn from the run's seed, then written twice, once as
//! some JSON writer might send it (members in any order, whitespace, any escape a writer may
//! use) and once in the canonical form, by construction, without the receiver's code. The kit
//! checks the two against `result_inbox::canonicalize` before it sends anything, so a fault of
//! the generator is the kit's, never blamed on a receiver.
//!
//! Output rules are named as docs/canonical-json.md numbers them (O1–O7).

use fastrand::Rng;

/// A JSON value with the text of each of its two writings known.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Literal(&'static str),
    /// A number: its text, the same in both writings.
    Number(String),
    Str(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
    /// Text whose two writings are given (a published vector, a timestamp).
    Given {
        sent: String,
        canonical: String,
    },
}

/// Characters a port most often writes wrongly: non-ASCII of the BMP and beyond it (raw or as
/// escapes), `/`, U+007F, U+2028, `<>&`, every control character, quotes and backslashes, a
/// combining mark, a noncharacter.
const HARD: &[char] = &[
    'é', 'Å', '€', '中', '文', '😀', '𝄞', '\u{E000}', '\u{FFFE}', '\u{FDD0}', '\u{2028}',
    '\u{2029}', '\u{7F}', '\u{80}', '\u{30A}', '/', '<', '>', '&', '"', '\\', '\0', '\u{1}',
    '\u{8}', '\t', '\n', '\u{B}', '\u{C}', '\r', '\u{1F}', ' ', 'a', 'Z', '0',
];

/// Member names whose UTF-16 order differs from their UTF-8 order (an astral character against
/// U+E000–U+FFFF), and others a sort by bytes, by characters or case-folded gets wrong.
const NAMES: &[&str] = &[
    "\u{E000}", "😀", "\u{FFFD}", "𝄞x", "a", "A", "b", "é", "e\u{301}", "", "_", "aa", "a\u{0}",
    "Z", "/", "\u{7F}", "€", "中",
];

/// Number forms the form keeps as written.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "1.0",
    "1e0",
    "1E+2",
    "1e-7",
    "-0.0e0",
    "2E-3",
    "0.1000",
    "1.50",
    "123456789012345678901234567890",
    "-18446744073709551617",
    "1e400",
    "3.14159265358979323846264338327950288",
    "18446744073709551615",
];

impl Value {
    /// A drawn value at most `depth` levels deep.
    pub(crate) fn draw(rng: &mut Rng, depth: u32) -> Value {
        let pick = if depth == 0 {
            rng.u8(0..3)
        } else {
            rng.u8(0..5)
        };
        match pick {
            0 => Value::Str(draw_string(rng)),
            1 => Value::Number(NUMBERS[rng.usize(0..NUMBERS.len())].to_owned()),
            2 => Value::Literal(["true", "false", "null"][rng.usize(0..3)]),
            3 => Value::Array(
                (0..rng.usize(0..4))
                    .map(|_| Value::draw(rng, depth - 1))
                    .collect(),
            ),
            _ => Value::draw_object(rng, depth - 1),
        }
    }

    /// A drawn object: up to six members of distinct names.
    pub(crate) fn draw_object(rng: &mut Rng, depth: u32) -> Value {
        let mut names: Vec<String> = Vec::new();
        for _ in 0..rng.usize(1..7) {
            let name = if rng.u8(0..3) == 0 {
                draw_string(rng)
            } else {
                NAMES[rng.usize(0..NAMES.len())].to_owned()
            };
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Value::Object(
            names
                .into_iter()
                .map(|n| (n, Value::draw(rng, depth)))
                .collect(),
        )
    }

    /// The canonical writing (docs/canonical-json.md, "Output").
    pub(crate) fn canonical(&self) -> String {
        let mut out = String::new();
        self.write_canonical(&mut out);
        out
    }

    fn write_canonical(&self, out: &mut String) {
        match self {
            Value::Literal(l) => out.push_str(l),
            Value::Number(n) => out.push_str(n),
            Value::Str(s) => canonical_string(s, out),
            Value::Given { canonical, .. } => out.push_str(canonical),
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write_canonical(out);
                }
                out.push(']');
            }
            Value::Object(members) => {
                let mut sorted: Vec<&(String, Value)> = members.iter().collect();
                sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
                out.push('{');
                for (i, (n, v)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical_string(n, out);
                    out.push(':');
                    v.write_canonical(out);
                }
                out.push('}');
            }
        }
    }

    /// A writing another JSON writer might send: members shuffled, whitespace drawn, each
    /// character in any form the form accepts.
    pub(crate) fn sent(&self, rng: &mut Rng) -> String {
        let mut out = String::new();
        self.write_sent(rng, &mut out);
        out
    }

    fn write_sent(&self, rng: &mut Rng, out: &mut String) {
        let space = |rng: &mut Rng, out: &mut String| {
            out.push_str([" ", "", "", "\n  ", "\t", "\r\n"][rng.usize(0..6)]);
        };
        match self {
            Value::Literal(l) => out.push_str(l),
            Value::Number(n) => out.push_str(n),
            Value::Str(s) => sent_string(rng, s, out),
            Value::Given { sent, .. } => out.push_str(sent),
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    space(rng, out);
                    v.write_sent(rng, out);
                }
                out.push(']');
            }
            Value::Object(members) => {
                let mut order: Vec<&(String, Value)> = members.iter().collect();
                rng.shuffle(&mut order);
                out.push('{');
                for (i, (n, v)) in order.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    space(rng, out);
                    sent_string(rng, n, out);
                    space(rng, out);
                    out.push(':');
                    space(rng, out);
                    v.write_sent(rng, out);
                }
                space(rng, out);
                out.push('}');
            }
        }
    }
}

/// One to eight characters, most of them hard ones.
fn draw_string(rng: &mut Rng) -> String {
    (0..rng.usize(1..9))
        .map(|_| HARD[rng.usize(0..HARD.len())])
        .collect()
}

/// RFC 8785's string escaping: only `"`, `\` and U+0000–U+001F, the short forms where they
/// exist, lowercase hex otherwise; everything else raw.
fn canonical_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{C}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `s` as a writer might send it: each character raw where JSON allows, or as a short escape,
/// or as `\u` escapes in either case of hex (a surrogate pair beyond the BMP), `/` also as `\/`.
fn sent_string(rng: &mut Rng, s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let code = c as u32;
        let hex = |out: &mut String, unit: u32, upper: bool| {
            if upper {
                out.push_str(&format!("\\u{unit:04X}"));
            } else {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        };
        let upper = rng.bool();
        // Escapes of plain ASCII one time in eight, of everything else three in eight.
        let draw = rng.u8(0..8);
        let escape = if c.is_ascii_alphanumeric() || c == ' ' {
            draw == 0
        } else {
            draw < 3
        };
        match c {
            '"' | '\\' if escape => hex(out, code, upper),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if draw == 0 => out.push_str("\\/"),
            '\u{8}' if !escape => out.push_str("\\b"),
            '\t' if !escape => out.push_str("\\t"),
            '\n' if !escape => out.push_str("\\n"),
            '\u{C}' if !escape => out.push_str("\\f"),
            '\r' if !escape => out.push_str("\\r"),
            c if (c as u32) < 0x20 => hex(out, code, upper),
            _ if escape && code > 0xFFFF => {
                let v = code - 0x10000;
                hex(out, 0xD800 + (v >> 10), upper);
                hex(out, 0xDC00 + (v & 0x3FF), upper);
            }
            _ if escape => hex(out, code, upper),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A drawn `occurred_at`: its sent text (an offset, 0 to 9 fraction digits, the last drawn
/// non-zero four times in five and zero the fifth, `T`/`t`, `Z`/`z`) and its canonical text
/// (UTC, trailing fraction zeros removed).
pub(crate) fn draw_timestamp(rng: &mut Rng) -> Value {
    // 1971 to 2099, so that an offset never leaves years 0000 to 9999.
    let utc_minutes = rng.i64(365 * 1440..47_480 * 1440);
    let second = rng.u8(0..60);
    let digits = rng.usize(0..10);
    let mut fraction: String = (0..digits)
        .map(|_| char::from(b'0' + rng.u8(0..10)))
        .collect();
    if digits > 0 {
        fraction.pop();
        fraction.push(if rng.u8(0..5) == 0 {
            '0'
        } else {
            char::from(b'0' + rng.u8(1..10))
        });
    }
    let offset: i64 = [
        0, 0, 60, -300, 330, -210, 540, 345, -720, 840, 1439, -1439, 59, -1,
    ][rng.usize(0..14)];
    // Drawn as four choices whatever the offset, so that a seed draws the same text as ever.
    let choice = usize::from(rng.u8(0..4));
    let spellings = canonical_form::offset_spellings(offset);
    let (t, zone) = spellings[choice % spellings.len()].clone();
    let dot = |f: &str| {
        if f.is_empty() {
            String::new()
        } else {
            format!(".{f}")
        }
    };
    let trimmed = fraction.trim_end_matches('0');
    Value::Given {
        sent: format!(
            "\"{}{}{zone}\"",
            clock(utc_minutes + offset, second, t),
            dot(&fraction)
        ),
        canonical: format!("\"{}{}Z\"", clock(utc_minutes, second, 'T'), dot(trimmed)),
    }
}

/// `YYYY-MM-DD<t>HH:MM:SS` of a minute counted from 1970-01-01T00:00.
fn clock(minutes: i64, second: u8, t: char) -> String {
    let (days, m) = (minutes.div_euclid(1440), minutes.rem_euclid(1440));
    let (year, month, day) = result_inbox::canonical::date_from_epoch_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}{t}{:02}:{:02}:{second:02}",
        m / 60,
        m % 60
    )
}

/// Why stored canonical bytes differ from the expected ones at byte `at`: the output rule of
/// docs/canonical-json.md that the stored bytes break, read from what stands there in each.
pub(crate) fn broken_rule(stored: &[u8], expected: &[u8], at: usize) -> &'static str {
    // A difference inside an escape both write (`\u001F` against `\u001f`) is read from the
    // escape's backslash.
    let from = at.saturating_sub(5);
    let at = expected
        .get(from..at)
        .and_then(|w| w.iter().rposition(|&c| c == b'\\'))
        .map(|p| from + p)
        .filter(|&p| stored.get(p) == Some(&b'\\'))
        .unwrap_or(at);
    let s = stored.get(at..).unwrap_or_default();
    let e = expected.get(at..).unwrap_or_default();
    let in_timestamp = expected
        .windows(15)
        .position(|w| w == b"\"occurred_at\":\"")
        .map(|p| p + 15)
        .is_some_and(|v| at >= v && at <= v + 30 && !expected[v..at].contains(&b'"'));
    if in_timestamp {
        return "O7: occurred_at is written in UTC, YYYY-MM-DDTHH:MM:SS[.fraction]Z, trailing fraction zeros removed";
    }
    match (s, e) {
        ([b'\\', b'u', ..], [c, ..]) if *c >= 0x80 => {
            "O4: characters outside ASCII are written as raw UTF-8, never as \\u escapes"
        }
        ([b'\\', b'/', ..], [b'/', ..]) | ([b'\\', b'u', ..], [b'/', ..]) => {
            "O4: '/' is written raw, never escaped"
        }
        ([b'\\', b'u', ..], [b'\\', b'u', ..]) => {
            "O4: an escape of U+0000–U+001F is \\u00hh with lowercase hex"
        }
        ([b'\\', b'u', ..], [b'\\', ..]) | ([b'\\', ..], [b'\\', b'u', ..]) => {
            "O4: \\b \\t \\n \\f \\r \\\" \\\\ are written short, every other control character as \\u00hh"
        }
        ([b'\\', ..], _) => "O4: only '\"', '\\' and U+0000–U+001F are escaped; everything else is raw",
        ([c, ..], _) if c.is_ascii_whitespace() => "O1: no whitespace between tokens",
        _ if in_number(expected, at) || at > 0 && in_number(expected, at - 1) => {
            "O5: numbers are kept as their exact input text"
        }
        _ if in_name(expected, at) => {
            "O2: members are sorted by their names as UTF-16 code units (U+10000 and above before U+E000–U+FFFF)"
        }
        _ => "the output rules of docs/canonical-json.md",
    }
}

/// Whether byte `at` of canonical `text` belongs to a number.
fn in_number(text: &[u8], at: usize) -> bool {
    text.get(at)
        .is_some_and(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        && !in_string(text, at)
}

/// Whether byte `at` of canonical `text` is inside a string (quotes included).
fn in_string(text: &[u8], at: usize) -> bool {
    let mut inside = false;
    let mut escaped = false;
    for (i, &c) in text.iter().enumerate() {
        if i >= at {
            return inside || c == b'"';
        }
        match (inside, escaped, c) {
            (true, false, b'\\') => escaped = true,
            (true, true, _) => escaped = false,
            (_, _, b'"') => inside = !inside,
            _ => {}
        }
    }
    false
}

/// Whether byte `at` of canonical `text` lies in a member's name, or where one begins.
fn in_name(text: &[u8], at: usize) -> bool {
    let start = text[..at.min(text.len())]
        .iter()
        .rposition(|&c| c == b',' || c == b'{');
    let Some(start) = start else {
        return false;
    };
    // From the member's start to `at`: no ':' outside the name means `at` is in the name.
    let mut inside = false;
    let mut escaped = false;
    for &c in &text[start + 1..at.min(text.len())] {
        match (inside, escaped, c) {
            (true, false, b'\\') => escaped = true,
            (true, true, _) => escaped = false,
            (_, _, b'"') => inside = !inside,
            (false, _, b':') => return false,
            _ => {}
        }
    }
    text[start] == b'{' || text[start] == b','
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_writings_agree_with_the_reference_form() {
        for seed in 0..300 {
            let mut rng = Rng::with_seed(seed);
            let v = Value::Object(vec![
                ("occurred_at".into(), draw_timestamp(&mut rng)),
                ("result".into(), Value::draw_object(&mut rng, 3)),
            ]);
            let sent = v.sent(&mut rng);
            let (canonical, _) = result_inbox::canonicalize(sent.as_bytes())
                .unwrap_or_else(|e| panic!("seed {seed}: refused: {e}: {sent}"));
            assert_eq!(
                String::from_utf8(canonical).unwrap(),
                v.canonical(),
                "seed {seed}: {sent}"
            );
        }
    }

    #[test]
    fn a_difference_names_its_rule() {
        let e =
            br#"{"a":"/","b":"\u001f","c":1.50,"occurred_at":"2026-01-01T00:00:00Z","s":"\u00e9"}"#;
        let rule = |s: &[u8]| {
            let at = s.iter().zip(e.iter()).position(|(a, b)| a != b).unwrap();
            broken_rule(s, e, at)
        };
        assert!(rule(br#"{"a":"\/","#).starts_with("O4: '/'"));
        assert!(rule(br#"{"a":"/","b":"\u001F","#).starts_with("O4: an escape"));
        assert!(rule(br#"{"a":"/","b":"\u001f","c":1.5,"#).starts_with("O5"));
        assert!(rule(
            br#"{"a":"/","b":"\u001f","c":1.50,"occurred_at":"2026-01-01T09:00:00+09:00""#
        )
        .starts_with("O7"));
        assert!(rule(br#"{"b":"\u001f","#).starts_with("O2"));
        assert!(rule(br#"{ "a""#).starts_with("O1"));
    }
}
