//! The canonical event form, version 1: a strict JSON reader, the canonical bytes and their
//! SHA-256 digest. A contract two programs share: the receiver's core (`result-inbox`) stores
//! and hashes these bytes, and the development platform (`orbit-dev`) refuses to emit an event
//! no receiver could read. Neither depends on the other to reach it.
//!
//! This is the first step of the flow: raw bytes off the wire become either a [`Document`]
//! whose canonical bytes are what the inbox stores and hashes, or a typed [`CanonError`]. The
//! form is written down for other implementations in `docs/canonical-json.md`; the vectors in
//! `docs/canonical-v1.json` are the contract, and the unit tests
//! read them.
//!
//! What this crate must never do: touch a database or the network, or accept anything the
//! form does not (it has no configuration).
//!
//! In short: RFC 8785 (JCS) key order and string escaping, but numbers are kept as their exact
//! input text, the top-level `occurred_at` is normalised to UTC, and the input profile is
//! strict (512 KiB, UTF-8 without BOM, no duplicate names, no lone surrogates, depth ≤ 128,
//! a top-level object).
//!
//! Nothing here may loosen silently: a change to what is accepted or to the bytes produced is
//! a new form version (see the docs), because stored digests would stop matching.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;

use sha2::{Digest as _, Sha256};

mod timestamp;

/// Days since 1970-01-01 of a proleptic Gregorian date, and back: for tools that write dates.
pub use timestamp::{date_from_epoch_days, days_from_epoch};
/// Strict RFC 3339 date-times in their UTC form (`None` for anything else), as the form
/// normalises `occurred_at`.
pub use timestamp::{normalize_rfc3339, offset_spellings, unix_micros};

/// Largest accepted event, counted on the raw bytes before parsing (whitespace included).
pub const MAX_EVENT_BYTES: usize = 512 * 1024;

/// Deepest accepted nesting of objects and arrays; the top-level object is depth 1.
pub const MAX_DEPTH: usize = 128;

/// Top-level members that hold timestamps and are normalised to UTC. Timestamps anywhere
/// else (inside `result`, say) are ordinary strings and are never touched.
pub const TIMESTAMP_MEMBERS: &[&str] = &["occurred_at"];

const NOT_A_TIMESTAMP: &str = "is not a strict RFC 3339 date-time within years 0000-9999";

/// The version of the canonical form this module produces.
pub const FORM_VERSION: u32 = 1;

/// Why an input is not a canonical-form document. Each kind is stable: it is what logs,
/// tests and other implementations match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CanonErrorKind {
    /// More than [`MAX_EVENT_BYTES`] bytes.
    TooLarge,
    /// The bytes are not well-formed UTF-8.
    InvalidUtf8,
    /// A `\u` escape names half of a surrogate pair without its other half.
    LoneSurrogate,
    /// Not strict RFC 8259 JSON (this includes a byte order mark and raw control characters).
    InvalidJson,
    /// The same member name twice in one object, compared after unescaping.
    DuplicateKey,
    /// Objects and arrays nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// The top-level value is not an object.
    NotObject,
    /// A timestamp member that is not a strict RFC 3339 date-time within years 0000–9999 UTC.
    InvalidTimestamp,
}

impl CanonErrorKind {
    /// The stable lowercase name of this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            CanonErrorKind::TooLarge => "too_large",
            CanonErrorKind::InvalidUtf8 => "invalid_utf8",
            CanonErrorKind::LoneSurrogate => "lone_surrogate",
            CanonErrorKind::InvalidJson => "invalid_json",
            CanonErrorKind::DuplicateKey => "duplicate_key",
            CanonErrorKind::TooDeep => "too_deep",
            CanonErrorKind::NotObject => "not_object",
            CanonErrorKind::InvalidTimestamp => "invalid_timestamp",
        }
    }

    /// Every kind, for tests and docs.
    pub const ALL: [CanonErrorKind; 8] = [
        CanonErrorKind::TooLarge,
        CanonErrorKind::InvalidUtf8,
        CanonErrorKind::LoneSurrogate,
        CanonErrorKind::InvalidJson,
        CanonErrorKind::DuplicateKey,
        CanonErrorKind::TooDeep,
        CanonErrorKind::NotObject,
        CanonErrorKind::InvalidTimestamp,
    ];
}

impl fmt::Display for CanonErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected input: its kind, and where (a byte offset or a member name), never its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonError {
    kind: CanonErrorKind,
    detail: Cow<'static, str>,
}

impl CanonError {
    fn at(kind: CanonErrorKind, what: &'static str, offset: usize) -> Self {
        CanonError {
            kind,
            detail: Cow::Owned(format!("{what} at byte {offset}")),
        }
    }

    fn new(kind: CanonErrorKind, detail: impl Into<Cow<'static, str>>) -> Self {
        CanonError {
            kind,
            detail: detail.into(),
        }
    }

    /// The stable kind.
    pub fn kind(&self) -> CanonErrorKind {
        self.kind
    }
}

impl fmt::Display for CanonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

impl std::error::Error for CanonError {}

/// A SHA-256 digest of canonical bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// SHA-256 of `bytes`, no prefix.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(HEX[usize::from(b >> 4)] as char);
            s.push(HEX[usize::from(b & 0xf)] as char);
        }
        s
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A top-level JSON object in canonical form: its canonical bytes, written in one pass from the
/// input, and where each top-level member lies in them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    canonical: Vec<u8>,
    /// The top-level members in canonical order.
    members: Vec<Slot>,
}

/// A top-level member's value, read from the canonical bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Member<'d> {
    Null,
    Bool(bool),
    /// The number exactly as written (`1E+2`, `-0`, `1.50`, any number of digits).
    Number(&'d str),
    /// The string's text, unescaped (borrowed unless it held a character that needs escaping).
    String(Cow<'d, str>),
    /// An array's canonical bytes.
    Array(&'d [u8]),
    /// An object's canonical bytes.
    Object(&'d [u8]),
}

impl Document {
    /// Reads `raw` strictly (size, encoding, grammar, duplicates, depth, top-level object, the
    /// timestamp members) and writes its canonical bytes on the way.
    pub fn parse(raw: &[u8]) -> Result<Self, CanonError> {
        if raw.len() > MAX_EVENT_BYTES {
            return Err(CanonError::new(
                CanonErrorKind::TooLarge,
                format!(
                    "{} bytes is over the limit of {MAX_EVENT_BYTES} bytes",
                    raw.len()
                ),
            ));
        }
        if raw.starts_with(b"\xEF\xBB\xBF") {
            return Err(CanonError::at(
                CanonErrorKind::InvalidJson,
                "byte order mark",
                0,
            ));
        }
        if let Err(e) = std::str::from_utf8(raw) {
            return Err(CanonError::at(
                CanonErrorKind::InvalidUtf8,
                "ill-formed UTF-8",
                e.valid_up_to(),
            ));
        }
        let mut w = Writer {
            bytes: raw,
            pos: 0,
            pending: 0,
            // Never longer than the input, except where a timestamp grows to its UTC form.
            out: Vec::with_capacity(raw.len() + 16),
            slots: Vec::with_capacity(32),
            scratch: Vec::new(),
            timestamp_error: None,
        };
        w.skip_ws();
        let start = w.pos;
        let top = w.value(0, true)?;
        w.flush();
        w.skip_ws();
        if w.pos != raw.len() {
            return Err(CanonError::at(
                CanonErrorKind::InvalidJson,
                "unexpected data after the top-level value",
                w.pos,
            ));
        }
        if top != Kind::Object {
            return Err(CanonError::at(
                CanonErrorKind::NotObject,
                "the top-level value is not an object",
                start,
            ));
        }
        if let Some(e) = w.timestamp_error {
            return Err(e);
        }
        Ok(Document {
            canonical: w.out,
            members: w.slots,
        })
    }

    /// The value of a top-level member.
    pub fn get(&self, name: &str) -> Option<Member<'_>> {
        let slot = self.find(name)?;
        let value = &self.canonical[slot.value()];
        Some(match value[0] {
            b'n' => Member::Null,
            b't' => Member::Bool(true),
            b'f' => Member::Bool(false),
            b'"' => Member::String(unescape(&value[1..value.len() - 1])),
            b'[' => Member::Array(value),
            b'{' => Member::Object(value),
            // Only the number grammar's bytes, which are ASCII.
            _ => Member::Number(std::str::from_utf8(value).unwrap_or_default()),
        })
    }

    /// Where the value of the top-level member `name` lies in [`Document::canonical`].
    pub fn span(&self, name: &str) -> Option<std::ops::Range<usize>> {
        self.find(name).map(Slot::value)
    }

    fn find(&self, name: &str) -> Option<Slot> {
        // Member names are written escaped; a name a caller asks for has nothing to escape.
        self.members
            .iter()
            .copied()
            .find(|s| &self.canonical[s.name_text()] == name.as_bytes())
    }

    /// The canonical bytes of the whole document.
    pub fn canonical(&self) -> &[u8] {
        &self.canonical
    }

    /// The canonical bytes, owned.
    pub fn into_canonical(self) -> Vec<u8> {
        self.canonical
    }
}

/// The canonical bytes of `raw` and their digest.
pub fn canonicalize(raw: &[u8]) -> Result<(Vec<u8>, Digest), CanonError> {
    let bytes = Document::parse(raw)?.into_canonical();
    let digest = Digest::of(&bytes);
    Ok((bytes, digest))
}

/// Orders member names by their UTF-16 code units, as RFC 8785 does. This differs from byte
/// order only where a character above U+FFFF meets one in U+E000..U+FFFF.
pub fn utf16_order(a: &str, b: &str) -> Ordering {
    utf16_order_bytes(a.as_bytes(), b.as_bytes())
}

/// [`utf16_order`] on UTF-8 bytes.
fn utf16_order_bytes(x: &[u8], y: &[u8]) -> Ordering {
    // UTF-8 byte order is code-point order; it differs from UTF-16 order only where a
    // character above U+FFFF (lead byte F0–F4, a surrogate pair in UTF-16) meets one in
    // U+E000–U+FFFF (lead byte EE or EF): the former sorts first in UTF-16.
    match x.iter().zip(y).position(|(p, q)| p != q) {
        None => x.len().cmp(&y.len()),
        Some(i) => {
            // Back up to the first byte of the differing character.
            let mut start = i;
            while start > 0 && (x[start] & 0xC0) == 0x80 {
                start -= 1;
            }
            let (p, q) = (x[start], y[start]);
            let supplementary = |b: u8| b >= 0xF0;
            let high_bmp = |b: u8| b == 0xEE || b == 0xEF;
            if supplementary(p) && high_bmp(q) {
                Ordering::Less
            } else if high_bmp(p) && supplementary(q) {
                Ordering::Greater
            } else {
                x[i].cmp(&y[i])
            }
        }
    }
}

/// One object member as written: `"name":value` at `name..end` of the output, the name's
/// closing quote at `colon - 1`. `key` is the name's first eight bytes, big-endian, zero-padded;
/// `plain` says the name holds no escape and no byte at or above 0xEE, so that its canonical
/// order is its byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    key: u64,
    name: u32,
    colon: u32,
    end: u32,
    plain: bool,
}

impl Slot {
    /// The name's canonical text, between its quotes.
    fn name_text(self) -> std::ops::Range<usize> {
        self.name as usize + 1..self.colon as usize - 1
    }

    fn value(self) -> std::ops::Range<usize> {
        self.colon as usize + 1..self.end as usize
    }

    fn bytes(self) -> std::ops::Range<usize> {
        self.name as usize..self.end as usize
    }
}

/// What [`Writer::string`] wrote: whether its canonical form holds an escape, and whether
/// the input held one (so that its input bytes are not its canonical bytes).
#[derive(Debug, Clone, Copy)]
struct Written {
    escape: bool,
    rewritten: bool,
}

/// What kind of value was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Object,
    Other,
}

/// The single-pass reader and writer: it checks the input as it goes and produces canonical
/// bytes. Wherever the canonical bytes are the input's own (everything but whitespace between
/// tokens, escapes written another way, member order and timestamps), nothing is copied as it
/// is read: `input[pending..pos]` is owed to `out` and goes in one copy when something else
/// must be written. An object's members are recorded as spans; when their input order is not
/// canonical, the object's bytes are moved once into order when it closes.
struct Writer<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// The input from here to `pos` is the next output.
    pending: usize,
    out: Vec<u8>,
    /// The members of every object still open, innermost last.
    slots: Vec<Slot>,
    /// Where an object's bytes wait while they are written back in order.
    scratch: Vec<u8>,
    /// Why a top-level timestamp member is not one, reported once the whole input is read.
    timestamp_error: Option<CanonError>,
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The canonical escape's second byte for `b`, or 0 for a control written as `\u00hh`; `None`
/// when `b` is written as itself.
fn escape_of(b: u8) -> Option<u8> {
    match b {
        b'"' => Some(b'"'),
        b'\\' => Some(b'\\'),
        0x08 => Some(b'b'),
        0x09 => Some(b't'),
        0x0a => Some(b'n'),
        0x0c => Some(b'f'),
        0x0d => Some(b'r'),
        0x00..=0x1f => Some(0),
        _ => None,
    }
}

/// The text of a canonical string's body: its escapes undone.
fn unescape(body: &[u8]) -> Cow<'_, str> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if !body.contains(&b'\\') {
        return match std::str::from_utf8(body) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => Cow::Owned(text(body)),
        };
    }
    Cow::Owned(text(&unescape_bytes(body)))
}

/// The bytes of a canonical string's body with its escapes undone (each is one ASCII byte).
fn unescape_bytes(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i] != b'\\' {
            out.push(body[i]);
            i += 1;
            continue;
        }
        let (b, len) = match body.get(i + 1) {
            Some(b'b') => (0x08, 2),
            Some(b't') => (0x09, 2),
            Some(b'n') => (0x0a, 2),
            Some(b'f') => (0x0c, 2),
            Some(b'r') => (0x0d, 2),
            Some(b'u') => {
                let hex = |c: u8| HEX.iter().position(|h| *h == c).unwrap_or(0) as u8;
                let (hi, lo) = (body[i + 4], body[i + 5]);
                ((hex(hi) << 4) | hex(lo), 6)
            }
            Some(&other) => (other, 2),
            None => (b'\\', 1),
        };
        out.push(b);
        i += len;
    }
    out
}

/// The bytes of `word` (eight input bytes, little-endian) that end a run of a string (`"`, `\`
/// or a control character) as a mask with the high bit of each such byte set. The classic
/// zero-byte test, on the word xor-ed with each stop byte; a borrow can only mark bytes above a
/// true stop, so the lowest marked byte is always the first stop.
fn stops_in(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let quote = zero(word ^ (ONES * u64::from(b'"')));
    let backslash = zero(word ^ (ONES * u64::from(b'\\')));
    // A byte below 0x20 (its high bit clear, and subtracting 0x20 borrows).
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    quote | backslash | control
}

impl<'a> Writer<'a> {
    /// Where the next output byte goes.
    fn out_len(&self) -> usize {
        self.out.len() + (self.pos - self.pending)
    }

    /// Pays what is owed: the input since `pending` goes to `out`.
    fn flush(&mut self) {
        self.out
            .extend_from_slice(&self.bytes[self.pending..self.pos]);
        self.pending = self.pos;
    }

    fn skip_ws(&mut self) {
        if let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.flush();
            while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
                self.pos += 1;
            }
            self.pending = self.pos;
        }
    }

    fn invalid(&self, what: &'static str) -> CanonError {
        CanonError::at(CanonErrorKind::InvalidJson, what, self.pos)
    }

    /// One value. `depth` is the number of containers already open around it; recursion is
    /// bounded by [`MAX_DEPTH`], so a deeply nested input cannot exhaust the stack. `top`
    /// marks the document's own value.
    fn value(&mut self, depth: usize, top: bool) -> Result<Kind, CanonError> {
        match self.bytes.get(self.pos) {
            None => Err(self.invalid("unexpected end of input")),
            Some(b'{') => self.object(depth + 1, top).map(|()| Kind::Object),
            Some(b'[') => self.array(depth + 1).map(|()| Kind::Other),
            Some(b'"') => self.string().map(|_| Kind::Other),
            Some(b'-' | b'0'..=b'9') => self.number().map(|()| Kind::Other),
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            Some(_) => Err(self.invalid("unexpected character")),
        }
    }

    fn enter(&self, depth: usize) -> Result<(), CanonError> {
        if depth > MAX_DEPTH {
            Err(CanonError::at(
                CanonErrorKind::TooDeep,
                "nesting deeper than 128",
                self.pos,
            ))
        } else {
            Ok(())
        }
    }

    fn literal(&mut self, word: &'static str) -> Result<Kind, CanonError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(Kind::Other)
        } else {
            Err(self.invalid("unexpected character"))
        }
    }

    fn object(&mut self, depth: usize, top: bool) -> Result<(), CanonError> {
        self.enter(depth)?;
        let open = self.pos;
        let start = self.out_len();
        self.pos += 1;
        let first = self.slots.len();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b'}') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b'"') {
                return Err(self.invalid("expected a member name"));
            }
            let name = self.out_len();
            let name_at = self.pos;
            let written = self.string()?;
            let colon = self.out_len();
            // The key and the plain flag, from the name's canonical bytes: its input bytes
            // when it held no escape, else what was written.
            if written.rewritten {
                // Paid now, so that the name lies wholly in `out` (see `view`).
                self.flush();
            }
            let (key, plain) = if written.escape {
                (0, false)
            } else {
                let body = if written.rewritten {
                    &self.out[name + 1..colon - 1]
                } else {
                    &self.bytes[name_at + 1..self.pos - 1]
                };
                let mut k = [0u8; 8];
                let n = body.len().min(8);
                k[..n].copy_from_slice(&body[..n]);
                (u64::from_be_bytes(k), body.iter().all(|b| *b < 0xEE))
            };
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b':') {
                return Err(self.invalid("expected `:`"));
            }
            self.pos += 1;
            self.skip_ws();
            self.value(depth, false)?;
            // MAX_EVENT_BYTES keeps every offset far below u32::MAX.
            self.slots.push(Slot {
                key,
                name: name as u32,
                colon: colon as u32,
                end: self.out_len() as u32,
                plain,
            });
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(self.invalid("expected `,` or `}`")),
            }
        }
        self.close(start, first, open, top)?;
        if !top {
            self.slots.truncate(first);
        }
        Ok(())
    }

    /// The output bytes at `r`: already in `out`, or still owed (a range of the input). A
    /// name is always wholly one or the other: a name with an escape is paid for when it ends.
    fn view(&self, r: std::ops::Range<usize>) -> &[u8] {
        let written = self.out.len();
        if r.start >= written {
            let shift = self.pending - written;
            &self.bytes[r.start + shift..r.end + shift]
        } else {
            &self.out[r]
        }
    }

    /// Canonical order of two members' names.
    fn name_order(&self, a: Slot, b: Slot) -> Ordering {
        if a.plain && b.plain {
            // Byte order, which the keys decide unless the first eight bytes are equal.
            return a
                .key
                .cmp(&b.key)
                .then_with(|| self.view(a.name_text()).cmp(self.view(b.name_text())));
        }
        let (x, y) = (self.view(a.name_text()), self.view(b.name_text()));
        utf16_order_bytes(&unescape_bytes(x), &unescape_bytes(y))
    }

    /// Puts the members of the object written at `start` (slots from `first` on) into
    /// canonical order, refusing duplicate names; at the top level, also normalises the
    /// timestamp members and leaves the slots where the members now are.
    fn close(
        &mut self,
        start: usize,
        first: usize,
        open: usize,
        top: bool,
    ) -> Result<(), CanonError> {
        let ordered = self.slots[first..]
            .windows(2)
            .all(|w| self.name_order(w[0], w[1]) == Ordering::Less);
        if !ordered {
            let mut members = std::mem::take(&mut self.slots);
            let short = members[first..]
                .iter()
                .all(|s| s.plain && s.colon - s.name <= 10);
            if short {
                // Names of at most eight bytes, none zero: the key is the whole name.
                members[first..].sort_unstable_by_key(|s| s.key);
            } else {
                members[first..].sort_unstable_by(|a, b| self.name_order(*a, *b));
            }
            let duplicate = members[first..]
                .windows(2)
                .any(|w| self.view(w[0].name_text()) == self.view(w[1].name_text()));
            self.slots = members;
            if duplicate {
                return Err(CanonError::at(
                    CanonErrorKind::DuplicateKey,
                    "duplicate member name in the object starting",
                    open,
                ));
            }
        }
        let mut replace = None;
        if top {
            self.flush();
            replace = self.timestamps(first);
        }
        if ordered && replace.is_none() {
            return Ok(());
        }
        if !top && self.out.len() <= start {
            // Nothing of the object is written yet, so its input bytes are its output bytes
            // (no whitespace, no escape inside it): write the members in order from there.
            let base = self.pending + (start - self.out.len());
            self.out.extend_from_slice(&self.bytes[self.pending..base]);
            self.out.push(b'{');
            for i in first..self.slots.len() {
                if i > first {
                    self.out.push(b',');
                }
                let r = self.slots[i].bytes();
                self.out
                    .extend_from_slice(&self.bytes[r.start - start + base..r.end - start + base]);
            }
            self.out.push(b'}');
            self.pending = self.pos;
            return Ok(());
        }
        // Move the members into order: the object's bytes go to scratch and come back.
        self.flush();
        self.scratch.clear();
        // Once, big enough for any object of this document.
        self.scratch.reserve(self.bytes.len());
        self.scratch.extend_from_slice(&self.out[start..]);
        self.out.truncate(start);
        self.out.push(b'{');
        for i in first..self.slots.len() {
            let slot = self.slots[i];
            if i > first {
                self.out.push(b',');
            }
            let from = slot.bytes();
            let shift = |p: u32| p as usize - start;
            let name = self.out.len();
            let colon = name + (slot.colon - slot.name) as usize;
            match &replace {
                Some((at, utc)) if *at == i => {
                    self.out
                        .extend_from_slice(&self.scratch[shift(slot.name)..shift(slot.colon)]);
                    self.out.extend_from_slice(b":\"");
                    self.out.extend_from_slice(utc.as_bytes());
                    self.out.push(b'"');
                }
                _ => self
                    .out
                    .extend_from_slice(&self.scratch[from.start - start..from.end - start]),
            }
            self.slots[i] = Slot {
                name: name as u32,
                colon: colon as u32,
                end: self.out.len() as u32,
                ..slot
            };
        }
        self.out.push(b'}');
        Ok(())
    }

    /// Checks the top-level timestamp members (slots from `first` on, in order; everything
    /// flushed); returns the one whose value must be replaced by its UTC form, and keeps the
    /// first failure for [`Document::parse`] to report once the whole input is read.
    fn timestamps(&mut self, first: usize) -> Option<(usize, String)> {
        let mut replace = None;
        for i in first..self.slots.len() {
            let slot = self.slots[i];
            let name = &self.out[slot.name_text()];
            let Some(member) = TIMESTAMP_MEMBERS.iter().find(|m| m.as_bytes() == name) else {
                continue;
            };
            let value = &self.out[slot.value()];
            // A string with nothing escaped: anything a timestamp may hold is written as itself.
            let text = value
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .filter(|v| !v.contains(&b'\\'))
                .and_then(|v| std::str::from_utf8(v).ok());
            match text.and_then(timestamp::normalize_rfc3339) {
                Some(utc) => {
                    if text != Some(utc.as_str()) {
                        replace = Some((i, utc));
                    }
                }
                None => {
                    if self.timestamp_error.is_none() {
                        self.timestamp_error = Some(CanonError::new(
                            CanonErrorKind::InvalidTimestamp,
                            format!("`{member}` {NOT_A_TIMESTAMP}"),
                        ));
                    }
                }
            }
        }
        replace
    }

    fn array(&mut self, depth: usize) -> Result<(), CanonError> {
        self.enter(depth)?;
        self.pos += 1;
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b']') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.skip_ws();
            self.value(depth, false)?;
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(self.invalid("expected `,` or `]`")),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<(), CanonError> {
        if self.bytes[self.pos] == b'-' {
            self.pos += 1;
        }
        match self.bytes.get(self.pos) {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.invalid("malformed number")),
        }
        if self.bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.invalid("malformed number"));
            }
        }
        if let Some(b'e' | b'E') = self.bytes.get(self.pos) {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.bytes.get(self.pos) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.invalid("malformed number"));
            }
        }
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, CanonError> {
        let Some(h) = self.bytes.get(self.pos..self.pos + 4) else {
            return Err(self.invalid("truncated \\u escape"));
        };
        let mut v = 0u32;
        for &b in h {
            let d = match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                b'A'..=b'F' => b - b'A' + 10,
                _ => return Err(self.invalid("malformed \\u escape")),
            };
            v = v * 16 + u32::from(d);
        }
        self.pos += 4;
        Ok(v)
    }

    /// Appends `c` as RFC 8785 writes it: `\"`, `\\`, the five short control escapes, other
    /// controls as `\u00hh` in lowercase hex, everything else as raw UTF-8 (`/`, U+007F and
    /// U+2028 included). Returns whether it wrote an escape. Everything owed is paid first.
    fn push_char(&mut self, c: char) -> bool {
        let code = c as u32;
        if code < 0x80 {
            let b = code as u8;
            match escape_of(b) {
                Some(0) => {
                    self.out.extend_from_slice(&[
                        b'\\',
                        b'u',
                        b'0',
                        b'0',
                        HEX[usize::from(b >> 4)],
                        HEX[usize::from(b & 0xf)],
                    ]);
                    true
                }
                Some(short) => {
                    self.out.extend_from_slice(&[b'\\', short]);
                    true
                }
                None => {
                    self.out.push(b);
                    false
                }
            }
        } else {
            let mut buf = [0u8; 4];
            self.out
                .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            false
        }
    }

    /// Moves `pos` past the bytes of a string that are written as themselves: up to the next
    /// `"`, `\` or control character (or the end), eight at a time where it can.
    fn run(&mut self) {
        let bytes = self.bytes;
        while let Some(chunk) = bytes.get(self.pos..self.pos + 8) {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            let stops = stops_in(word);
            if stops != 0 {
                // The first stop's byte, straight from the mask.
                self.pos += (stops.trailing_zeros() / 8) as usize;
                return;
            }
            self.pos += 8;
        }
        while let Some(&b) = bytes.get(self.pos) {
            if b == b'"' || b == b'\\' || b < 0x20 {
                break;
            }
            self.pos += 1;
        }
    }

    /// A string starting at its opening quote, written canonically. Runs without escapes
    /// stay owed, not copied.
    fn string(&mut self) -> Result<Written, CanonError> {
        self.pos += 1;
        let mut escaped = false;
        let mut rewritten = false;
        loop {
            self.run();
            match self.bytes.get(self.pos) {
                None => return Err(self.invalid("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(Written {
                        escape: escaped,
                        rewritten,
                    });
                }
                Some(b'\\') => {
                    let escape_at = self.pos;
                    rewritten = true;
                    self.pos += 1;
                    let c = match self.bytes.get(self.pos) {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.pos += 1;
                            let c = self.unicode_escape(escape_at)?;
                            self.write_escape(escape_at, c, &mut escaped);
                            continue;
                        }
                        _ => return Err(self.invalid("unknown escape")),
                    };
                    self.pos += 1;
                    self.write_escape(escape_at, c, &mut escaped);
                }
                Some(_) => return Err(self.invalid("raw control character in string")),
            }
        }
    }

    /// The escape at `escape_at..pos` stands for `c`: pay what is owed before it, write `c`'s
    /// canonical form, and owe from after it.
    fn write_escape(&mut self, escape_at: usize, c: char, escaped: &mut bool) {
        self.out
            .extend_from_slice(&self.bytes[self.pending..escape_at]);
        *escaped |= self.push_char(c);
        self.pending = self.pos;
    }

    /// The character of a `\uXXXX` escape (the `\u` already consumed), joining a surrogate
    /// pair written as two escapes. Half a pair is an error of its own kind.
    fn unicode_escape(&mut self, escape_at: usize) -> Result<char, CanonError> {
        let lone = || CanonError::at(CanonErrorKind::LoneSurrogate, "lone surrogate", escape_at);
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if self.bytes.get(self.pos..self.pos + 2) != Some(b"\\u") {
                    return Err(lone());
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(lone());
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(lone()),
            other => other,
        };
        // Every value left is a Unicode scalar value.
        char::from_u32(code).ok_or_else(lone)
    }
}

#[cfg(test)]
mod tests;
