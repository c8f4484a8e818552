//! The canonical form as the first implementation wrote it: a parse into a tree of values,
//! then a serialisation. Kept only in test builds, as the oracle the single-pass writer is
//! compared with (`tests.rs`, `the_single_pass_writer_matches_the_tree_writer`).

use std::borrow::Cow;

use super::{
    timestamp, utf16_order, CanonError, CanonErrorKind, MAX_DEPTH, MAX_EVENT_BYTES,
    NOT_A_TIMESTAMP, TIMESTAMP_MEMBERS,
};

/// The canonical bytes of `raw`, as the tree writer makes them.
pub(super) fn canonical(raw: &[u8]) -> Result<Vec<u8>, CanonError> {
    Document::parse(raw).map(|d| d.to_canonical())
}

/// A parsed JSON value. Strings borrow from the input unless they contained escapes; numbers
/// are always the exact input text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Value<'a> {
    Null,
    Bool(bool),
    /// The number exactly as written (`1E+2`, `-0`, `1.50`, any number of digits).
    Number(&'a str),
    String(Cow<'a, str>),
    Array(Vec<Value<'a>>),
    /// Members already in canonical order (UTF-16 code units of the names), no duplicates.
    Object(Vec<(Cow<'a, str>, Value<'a>)>),
}


/// A top-level JSON object in canonical order, with its timestamp members normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Document<'a> {
    members: Vec<(Cow<'a, str>, Value<'a>)>,
    /// The input's length: the canonical form is never longer.
    source_len: usize,
}

impl<'a> Document<'a> {
    /// Reads `raw` strictly: size, encoding, grammar, duplicates, depth, top-level object, and
    /// the timestamp members.
    pub fn parse(raw: &'a [u8]) -> Result<Self, CanonError> {
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
        let text = std::str::from_utf8(raw).map_err(|e| {
            CanonError::at(
                CanonErrorKind::InvalidUtf8,
                "ill-formed UTF-8",
                e.valid_up_to(),
            )
        })?;
        let mut parser = Parser {
            text,
            bytes: raw,
            pos: 0,
        };
        parser.skip_ws();
        let start = parser.pos;
        let top = parser.value(0)?;
        parser.skip_ws();
        if parser.pos != raw.len() {
            return Err(CanonError::at(
                CanonErrorKind::InvalidJson,
                "unexpected data after the top-level value",
                parser.pos,
            ));
        }
        let mut members = match top {
            Value::Object(members) => members,
            _ => {
                return Err(CanonError::at(
                    CanonErrorKind::NotObject,
                    "the top-level value is not an object",
                    start,
                ))
            }
        };
        for (name, value) in members.iter_mut() {
            if TIMESTAMP_MEMBERS.contains(&name.as_ref()) {
                let normalised = match value {
                    Value::String(s) => timestamp::normalize_rfc3339(s),
                    _ => None,
                };
                let Some(utc) = normalised else {
                    return Err(CanonError::new(
                        CanonErrorKind::InvalidTimestamp,
                        format!("`{name}` {NOT_A_TIMESTAMP}"),
                    ));
                };
                *value = Value::String(Cow::Owned(utc));
            }
        }
        Ok(Document {
            members,
            source_len: raw.len(),
        })
    }

    /// The canonical bytes of the whole document.
    pub fn to_canonical(&self) -> Vec<u8> {
        self.to_canonical_with_span(None).0
    }

    /// The canonical bytes of the whole document, and where in them the value of the top-level
    /// member `member` lies (so a caller needs no second serialisation of it).
    pub fn to_canonical_with_span(
        &self,
        member: Option<&str>,
    ) -> (Vec<u8>, Option<std::ops::Range<usize>>) {
        let mut out = Vec::with_capacity(self.size_hint());
        let mut span = None;
        out.push(b'{');
        for (i, (name, value)) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(name, &mut out);
            out.push(b':');
            let start = out.len();
            write_value(value, &mut out);
            if member == Some(name.as_ref()) {
                span = Some(start..out.len());
            }
        }
        out.push(b'}');
        (out, span)
    }

    fn size_hint(&self) -> usize {
        self.source_len
    }
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    fn invalid(&self, what: &'static str) -> CanonError {
        CanonError::at(CanonErrorKind::InvalidJson, what, self.pos)
    }

    /// One value. `depth` is the number of containers already open around it; recursion is
    /// bounded by [`MAX_DEPTH`], so a deeply nested input cannot exhaust the stack.
    fn value(&mut self, depth: usize) -> Result<Value<'a>, CanonError> {
        match self.bytes.get(self.pos) {
            None => Err(self.invalid("unexpected end of input")),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
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

    fn literal(&mut self, word: &'static str, v: Value<'a>) -> Result<Value<'a>, CanonError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(v)
        } else {
            Err(self.invalid("unexpected character"))
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value<'a>, CanonError> {
        self.enter(depth)?;
        let open = self.pos;
        self.pos += 1;
        let mut members: Vec<(Cow<'a, str>, Value<'a>)> = Vec::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b'}') {
            self.pos += 1;
            return Ok(Value::Object(members));
        }
        loop {
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b'"') {
                return Err(self.invalid("expected a member name"));
            }
            let name = self.string()?;
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b':') {
                return Err(self.invalid("expected `:`"));
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value(depth)?;
            members.push((name, value));
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
        members.sort_by(|a, b| utf16_order(&a.0, &b.0));
        if members.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(CanonError::at(
                CanonErrorKind::DuplicateKey,
                "duplicate member name in the object starting",
                open,
            ));
        }
        Ok(Value::Object(members))
    }

    fn array(&mut self, depth: usize) -> Result<Value<'a>, CanonError> {
        self.enter(depth)?;
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(self.invalid("expected `,` or `]`")),
            }
        }
        Ok(Value::Array(items))
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<Value<'a>, CanonError> {
        let start = self.pos;
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
        Ok(Value::Number(&self.text[start..self.pos]))
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

    /// A string starting at the opening quote. Borrowed when it holds no escapes.
    fn string(&mut self) -> Result<Cow<'a, str>, CanonError> {
        self.pos += 1;
        let start = self.pos;
        // Fast path: scan to the closing quote; stop at the first escape.
        loop {
            match self.bytes.get(self.pos) {
                None => return Err(self.invalid("unterminated string")),
                Some(b'"') => {
                    let s = &self.text[start..self.pos];
                    self.pos += 1;
                    return Ok(Cow::Borrowed(s));
                }
                Some(b'\\') => break,
                Some(0x00..=0x1f) => return Err(self.invalid("raw control character in string")),
                Some(_) => self.pos += 1,
            }
        }
        let mut out = String::with_capacity(self.pos - start + 16);
        out.push_str(&self.text[start..self.pos]);
        loop {
            let run = self.pos;
            while let Some(&b) = self.bytes.get(self.pos) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(&self.text[run..self.pos]);
            match self.bytes.get(self.pos) {
                None => return Err(self.invalid("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(Cow::Owned(out));
                }
                Some(b'\\') => {
                    let escape_at = self.pos;
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
                            out.push(c);
                            continue;
                        }
                        _ => return Err(self.invalid("unknown escape")),
                    };
                    self.pos += 1;
                    out.push(c);
                }
                Some(_) => return Err(self.invalid("raw control character in string")),
            }
        }
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

fn write_value(v: &Value<'_>, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => out.extend_from_slice(n.as_bytes()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(members) => write_object(members, out),
    }
}

fn write_object(members: &[(Cow<'_, str>, Value<'_>)], out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (name, value)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(name, out);
        out.push(b':');
        write_value(value, out);
    }
    out.push(b'}');
}

/// RFC 8785 string escaping: `\"`, `\\`, the five short control escapes, other controls as
/// `\u00hh` in lowercase hex, everything else as raw UTF-8 (`/`, U+007F, U+2028 included).
fn write_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x09 => b't',
            0x0a => b'n',
            0x0c => b'f',
            0x0d => b'r',
            0x00..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        run = i + 1;
        if short != 0 {
            out.extend_from_slice(&[b'\\', short]);
        } else {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]);
        }
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}
