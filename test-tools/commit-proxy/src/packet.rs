//! MySQL packet framing: read one logical packet as the exact wire bytes of its chunks, and the
//! few fields of OK, ERR and EOF packets the proxy needs.
//!
//! A packet is a 3-byte little-endian payload length, a 1-byte sequence id and the payload.
//! A payload of 16 MiB − 1 bytes or more is split into chunks of exactly 0xFFFFFF bytes, the
//! logical packet ending at the first shorter chunk (an empty one when the size is an exact
//! multiple). The proxy forwards chunks verbatim: it never re-chunks or renumbers what it relays.

use std::borrow::Cow;
use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The largest chunk payload; a chunk this long is followed by another of the same packet.
pub const MAX_CHUNK: usize = 0xFF_FFFF;

/// Server status flag: a transaction is open.
pub const STATUS_IN_TRANS: u16 = 0x0001;
/// Server status flag: another result follows this one.
pub const STATUS_MORE_RESULTS: u16 = 0x0008;

/// One logical packet as it was on the wire.
#[derive(Clone, PartialEq, Eq)]
pub struct Packet {
    raw: Vec<u8>,
    chunks: usize,
}

impl std::fmt::Debug for Packet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Lengths and the first byte only: payloads carry data.
        f.debug_struct("Packet")
            .field("seq", &self.seq())
            .field("len", &self.payload_len())
            .field("first", &self.first())
            .field("chunks", &self.chunks)
            .finish()
    }
}

impl Packet {
    /// A single-chunk packet with `payload` and sequence id `seq`.
    pub fn new(seq: u8, payload: &[u8]) -> Packet {
        assert!(payload.len() < MAX_CHUNK, "single-chunk packets only");
        let len = payload.len() as u32;
        let mut raw = Vec::with_capacity(payload.len() + 4);
        raw.extend_from_slice(&len.to_le_bytes()[..3]);
        raw.push(seq);
        raw.extend_from_slice(payload);
        Packet { raw, chunks: 1 }
    }

    /// The wire bytes, headers included.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// Mutable access to the first chunk's payload, for in-place patches that keep its length.
    pub fn first_payload_mut(&mut self) -> &mut [u8] {
        let end = (4 + MAX_CHUNK).min(self.raw.len());
        &mut self.raw[4..end]
    }

    /// The sequence id of the first chunk.
    pub fn seq(&self) -> u8 {
        self.raw[3]
    }

    /// The sequence id of the last chunk (a reply continues from it).
    pub fn last_seq(&self) -> u8 {
        self.raw[3].wrapping_add((self.chunks - 1) as u8)
    }

    /// The number of chunks.
    #[cfg(test)]
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// The logical payload length.
    pub fn payload_len(&self) -> usize {
        self.raw.len() - 4 * self.chunks
    }

    /// The first payload byte, if any.
    pub fn first(&self) -> Option<u8> {
        self.raw.get(4).copied().filter(|_| self.payload_len() > 0)
    }

    /// The logical payload: borrowed for one chunk, joined for several.
    pub fn payload(&self) -> Cow<'_, [u8]> {
        if self.chunks == 1 {
            return Cow::Borrowed(&self.raw[4..]);
        }
        let mut out = Vec::with_capacity(self.payload_len());
        let mut at = 0;
        for _ in 0..self.chunks {
            let len = usize::from(self.raw[at])
                | usize::from(self.raw[at + 1]) << 8
                | usize::from(self.raw[at + 2]) << 16;
            out.extend_from_slice(&self.raw[at + 4..at + 4 + len]);
            at += 4 + len;
        }
        Cow::Owned(out)
    }

    /// Whether this is an OK packet (`0x00`, at least 7 bytes).
    pub fn is_ok(&self) -> bool {
        self.first() == Some(0x00) && self.payload_len() >= 7
    }

    /// Whether this is an ERR packet.
    pub fn is_err(&self) -> bool {
        self.first() == Some(0xFF)
    }

    /// Whether this ends a result set: an EOF packet, or an OK packet with header `0xFE`
    /// (`CLIENT_DEPRECATE_EOF`). A row can only start with `0xFE` when its first value is
    /// 16 MiB or longer, and then its first chunk is a full one.
    pub fn is_terminator(&self) -> bool {
        self.first() == Some(0xFE) && self.payload_len() < MAX_CHUNK && self.chunks == 1
    }

    /// The status flags of an OK, EOF or `0xFE`-OK packet.
    pub fn status(&self) -> Option<u16> {
        let p = &self.raw[4..];
        match p.first()? {
            0xFE if p.len() < 9 => {
                // EOF: header, warnings u16, status u16.
                Some(u16::from_le_bytes([*p.get(3)?, *p.get(4)?]))
            }
            0x00 | 0xFE => {
                // OK: header, affected rows, last insert id, status u16.
                let mut at = 1;
                at += lenenc_len(p.get(at..)?)?;
                at += lenenc_len(p.get(at..)?)?;
                Some(u16::from_le_bytes([*p.get(at)?, *p.get(at + 1)?]))
            }
            _ => None,
        }
    }

    /// The error number of an ERR packet.
    pub fn error_number(&self) -> Option<u16> {
        let p = &self.raw[4..];
        (p.first() == Some(&0xFF)).then(|| u16::from_le_bytes([p[1], p[2]]))
    }
}

/// The length in bytes of the length-encoded integer at the start of `b`.
pub fn lenenc_len(b: &[u8]) -> Option<usize> {
    match *b.first()? {
        0xFC => Some(3),
        0xFD => Some(4),
        0xFE => Some(9),
        0xFB | 0xFF => None,
        _ => Some(1),
    }
}

/// The value of the length-encoded integer at the start of `b`.
pub fn lenenc_value(b: &[u8]) -> Option<u64> {
    let n = lenenc_len(b)?;
    if n == 1 {
        return Some(u64::from(b[0]));
    }
    let bytes = b.get(1..n)?;
    let mut v = 0u64;
    for (i, byte) in bytes.iter().enumerate() {
        v |= u64::from(*byte) << (8 * i);
    }
    Some(v)
}

/// An ERR packet: `0xFF`, number, `#`, SQLSTATE, message.
pub fn err_packet(seq: u8, number: u16, sqlstate: &str, message: &str) -> Packet {
    let mut payload = vec![0xFF];
    payload.extend_from_slice(&number.to_le_bytes());
    payload.push(b'#');
    payload.extend_from_slice(&sqlstate.as_bytes()[..5.min(sqlstate.len())]);
    payload.extend_from_slice(message.as_bytes());
    Packet::new(seq, &payload)
}

/// Reads one logical packet; `Ok(None)` on a clean end of stream before its first byte.
pub async fn read_packet<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Packet>> {
    let mut raw = Vec::new();
    let mut chunks = 0;
    loop {
        let mut header = [0u8; 4];
        if chunks == 0 {
            // Tell a clean close apart from a truncated packet.
            let n = r.read(&mut header[..1]).await?;
            if n == 0 {
                return Ok(None);
            }
            r.read_exact(&mut header[1..]).await?;
        } else {
            r.read_exact(&mut header).await?;
        }
        let len =
            usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
        let at = raw.len();
        raw.extend_from_slice(&header);
        raw.resize(at + 4 + len, 0);
        r.read_exact(&mut raw[at + 4..]).await?;
        chunks += 1;
        if len < MAX_CHUNK {
            return Ok(Some(Packet { raw, chunks }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(seq: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = (payload.len() as u32).to_le_bytes()[..3].to_vec();
        v.push(seq);
        v.extend_from_slice(payload);
        v
    }

    #[tokio::test]
    async fn reads_packets_joined_and_split_across_reads() {
        let mut wire = frame(0, b"\x03COMMIT");
        wire.extend(frame(1, &[0x00, 0, 0, 2, 0, 0, 0]));
        // Deliver the bytes one at a time: framing must not depend on read sizes.
        let mut reader = tokio_test_reader(wire, 1);
        let a = read_packet(&mut reader).await.unwrap().unwrap();
        assert_eq!((a.seq(), &a.payload()[..]), (0, &b"\x03COMMIT"[..]));
        let b = read_packet(&mut reader).await.unwrap().unwrap();
        assert!(b.is_ok());
        assert_eq!(b.status(), Some(0x0002));
        assert_eq!(b.seq(), 1);
        assert!(read_packet(&mut reader).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn sixteen_mib_payloads_span_chunks_and_keep_their_bytes() {
        for size in [
            MAX_CHUNK - 1,
            MAX_CHUNK,
            MAX_CHUNK + 1,
            2 * MAX_CHUNK,
            20 << 20,
        ] {
            let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let mut wire = Vec::new();
            let mut seq = 5u8;
            let mut rest = &payload[..];
            loop {
                let n = rest.len().min(MAX_CHUNK);
                wire.extend(frame(seq, &rest[..n]));
                rest = &rest[n..];
                seq = seq.wrapping_add(1);
                if n < MAX_CHUNK {
                    break;
                }
            }
            let expected_chunks = size / MAX_CHUNK + 1;
            let mut reader = &wire[..];
            let p = read_packet(&mut reader).await.unwrap().unwrap();
            assert_eq!(p.chunks(), expected_chunks, "{size}");
            assert_eq!(p.raw(), &wire[..], "relayed verbatim");
            assert_eq!(p.payload_len(), size);
            assert_eq!(&p.payload()[..], &payload[..]);
            assert_eq!(p.seq(), 5);
            assert_eq!(p.last_seq(), 5u8.wrapping_add(expected_chunks as u8 - 1));
            assert!(!p.is_terminator());
        }
    }

    #[tokio::test]
    async fn a_truncated_packet_is_an_error_not_an_end() {
        let wire = frame(0, b"\x03SELECT 1");
        let mut reader = &wire[..wire.len() - 2];
        assert!(read_packet(&mut reader).await.is_err());
    }

    #[test]
    fn ok_err_eof_fields() {
        // MariaDB's COMMIT OK, verified on the wire.
        let ok = Packet::new(1, &[0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00]);
        assert!(ok.is_ok() && !ok.is_err());
        assert_eq!(ok.status(), Some(0x0002));
        let ok_big = Packet::new(
            1,
            &[0x00, 0xFC, 0x10, 0x27, 0xFD, 1, 2, 3, 0x03, 0x40, 0, 0],
        );
        assert_eq!(ok_big.status(), Some(0x4003));
        let eof = Packet::new(5, &[0xFE, 0x00, 0x00, 0x02, 0x00]);
        assert!(eof.is_terminator());
        assert_eq!(eof.status(), Some(0x0002));
        let ok_fe = Packet::new(4, &[0xFE, 0x00, 0x00, 0x0A, 0x00, 0x00, 0x00]);
        assert!(ok_fe.is_terminator());
        assert_eq!(ok_fe.status(), Some(0x000A));
        let err = err_packet(1, 1213, "40001", "Deadlock found");
        assert!(err.is_err());
        assert_eq!(err.error_number(), Some(1213));
        assert_eq!(&err.payload()[3..9], b"#40001");
        assert_eq!(lenenc_value(&[0xFC, 0x10, 0x27]), Some(10000));
        assert_eq!(lenenc_value(&[0x05]), Some(5));
    }

    /// A reader that hands out at most `step` bytes per read.
    fn tokio_test_reader(data: Vec<u8>, step: usize) -> impl AsyncRead + Unpin {
        struct Trickle(Vec<u8>, usize, usize);
        impl AsyncRead for Trickle {
            fn poll_read(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<io::Result<()>> {
                let (at, step) = (self.1, self.2);
                let end = (at + step).min(self.0.len()).min(at + buf.remaining());
                buf.put_slice(&self.0[at..end]);
                self.1 = end;
                std::task::Poll::Ready(Ok(()))
            }
        }
        Trickle(data, 0, step)
    }
}
