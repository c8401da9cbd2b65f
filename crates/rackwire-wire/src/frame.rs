//! The fixed frame header.
//!
//! ```text
//!  0      2    3    4     5    6        8        12       16       20       24       28      32
//! +------+----+----+-----+----+--------+--------+--------+--------+--------+--------+-------+
//! |magic |ver |kind|flags|link|pay len |  conn  |  seq   |  ack   |   ts   |pay crc |hdr crc|
//! +------+----+----+-----+----+--------+--------+--------+--------+--------+--------+-------+
//! ```
//!
//! - `conn`: the *receiver's* connection id (0 in a first handshake frame);
//! - `seq`: the frame's sequence number in its connection (data frames; 0 otherwise);
//! - `ack`: with flag `ACK`, the next sequence number the sender of this frame expects
//!   (cumulative acknowledgement, piggybacked on any frame);
//! - `ts`: the sender's clock in microseconds (low 32 bits), echoed for round-trip times;
//! - `pay crc`: CRC32C of the payload; `hdr crc`: CRC32C of bytes 0..28.
//!
//! A frame with flag `SEALED` is followed by a trailer: a 64-bit counter and a 16-byte
//! authentication tag (see `rackwire_proto`'s sealing); its payload is then ciphertext, and
//! `pay crc` is over the plaintext.

use crate::error::{need, WireError};

/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 32;
/// The largest payload a frame can carry (the length field is 16 bits).
pub const PAYLOAD_LEN_MAX: usize = u16::MAX as usize;
/// Protocol version spoken by this build (5: probes padded to prove a path's frame size; 4:
/// ordered segments, `SEG_ORDERED`; 3 sealed frames with AEGIS-128X2 already; 2 used
/// AES-128-GCM).
pub const VERSION: u8 = 5;
const MAGIC: u16 = 0x5257; // "RW"

/// Header flag: the `ack` field is valid.
pub const FLAG_ACK: u8 = 1;
/// Bytes after a sealed frame's payload: a 64-bit counter and a 16-byte tag.
pub const SEALED_TRAILER_LEN: usize = 24;
/// Header flag: the payload is sealed (encrypted and authenticated) and a trailer follows it.
pub const FLAG_SEALED: u8 = 2;

mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const KIND: usize = 3;
    pub const FLAGS: usize = 4;
    pub const LINK: usize = 5;
    pub const PAYLOAD_LEN: Range<usize> = 6..8;
    pub const CONN: Range<usize> = 8..12;
    pub const SEQ: Range<usize> = 12..16;
    pub const ACK: Range<usize> = 16..20;
    pub const TS: Range<usize> = 20..24;
    pub const PAYLOAD_CRC: Range<usize> = 24..28;
    pub const HEADER_CRC: Range<usize> = 28..32;
}

const _: () = assert!(field::HEADER_CRC.end == HEADER_LEN);

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Carries one segment of an operation.
    Data,
    /// Selective acknowledgement.
    Ack,
    /// Negative acknowledgement: these sequence numbers are missing.
    Nack,
    /// Connection set-up and authentication.
    Handshake,
    /// Link liveness probe (or its reply).
    Probe,
    /// The connection ends.
    Close,
    /// One datagram: the payload is the application's bytes, whole. Unsequenced, never
    /// acknowledged nor sent again (sealed and checked against replays as every frame is).
    Datagram,
    /// A kind this build does not know (kept, so it round-trips).
    Unknown(u8),
}

impl From<u8> for FrameKind {
    fn from(v: u8) -> Self {
        match v {
            1 => FrameKind::Data,
            2 => FrameKind::Ack,
            3 => FrameKind::Nack,
            4 => FrameKind::Handshake,
            5 => FrameKind::Probe,
            6 => FrameKind::Close,
            7 => FrameKind::Datagram,
            n => FrameKind::Unknown(n),
        }
    }
}

impl From<FrameKind> for u8 {
    fn from(k: FrameKind) -> u8 {
        match k {
            FrameKind::Data => 1,
            FrameKind::Ack => 2,
            FrameKind::Nack => 3,
            FrameKind::Handshake => 4,
            FrameKind::Probe => 5,
            FrameKind::Close => 6,
            FrameKind::Datagram => 7,
            FrameKind::Unknown(n) => n,
        }
    }
}

/// A view of a frame in a byte buffer.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

fn be16(b: &[u8], r: std::ops::Range<usize>) -> u16 {
    u16::from_be_bytes([b[r.start], b[r.start + 1]])
}

fn be32(b: &[u8], r: std::ops::Range<usize>) -> u32 {
    u32::from_be_bytes([b[r.start], b[r.start + 1], b[r.start + 2], b[r.start + 3]])
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wrap without checking (for emitting into a buffer known to be large enough).
    pub fn new_unchecked(buffer: T) -> Self {
        Frame { buffer }
    }

    /// Wrap and check everything: length, magic, version, both checksums. After this no
    /// accessor can panic.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let f = Frame { buffer };
        f.check()?;
        Ok(f)
    }

    /// Wrap and check what [`Frame::new_checked`] does but the payload checksum: for a frame
    /// whose payload an authentication tag covered (an opened sealed frame).
    pub fn new_opened(buffer: T) -> Result<Self, WireError> {
        let f = Frame { buffer };
        f.check_header()?;
        Ok(f)
    }

    fn check(&self) -> Result<(), WireError> {
        self.check_header()?;
        let b = self.buffer.as_ref();
        let len = self.payload_len() as usize;
        if crate::crc::crc32c(&b[HEADER_LEN..HEADER_LEN + len]) != be32(b, field::PAYLOAD_CRC) {
            return Err(WireError::PayloadChecksum);
        }
        Ok(())
    }

    fn check_header(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        need("header", HEADER_LEN, b.len())?;
        let magic = be16(b, field::MAGIC);
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if b[field::VERSION] != VERSION {
            return Err(WireError::BadVersion(b[field::VERSION]));
        }
        if crate::crc::crc32c(&b[..field::HEADER_CRC.start]) != be32(b, field::HEADER_CRC) {
            return Err(WireError::HeaderChecksum);
        }
        let len = self.payload_len() as usize;
        need("payload", HEADER_LEN + len, b.len())?;
        Ok(())
    }

    /// Frame kind.
    pub fn kind(&self) -> FrameKind {
        self.buffer.as_ref()[field::KIND].into()
    }
    /// Flags.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// The sender's link index.
    pub fn link(&self) -> u8 {
        self.buffer.as_ref()[field::LINK]
    }
    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }
    /// Receiver's connection id.
    pub fn conn(&self) -> u32 {
        be32(self.buffer.as_ref(), field::CONN)
    }
    /// Sequence number.
    pub fn seq(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SEQ)
    }
    /// Cumulative acknowledgement (valid with [`FLAG_ACK`]).
    pub fn ack(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ACK)
    }
    /// Whether the frame is sealed ([`FLAG_SEALED`]).
    pub fn sealed(&self) -> bool {
        self.flags() & FLAG_SEALED != 0
    }
    /// Sender's timestamp, µs.
    pub fn ts(&self) -> u32 {
        be32(self.buffer.as_ref(), field::TS)
    }
    /// The payload (checked by `new_checked`).
    pub fn payload(&self) -> &[u8] {
        let len = self.payload_len() as usize;
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + len]
    }
    /// The whole frame's length.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.payload_len() as usize
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    fn put(&mut self, r: std::ops::Range<usize>, v: &[u8]) {
        self.buffer.as_mut()[r].copy_from_slice(v);
    }

    /// The payload, for filling before [`Frame::fill_checksums`].
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = self.payload_len() as usize;
        &mut self.buffer.as_mut()[HEADER_LEN..HEADER_LEN + len]
    }

    /// Set the receiver's connection id (then [`Frame::fill_checksums`]): for tests that forge
    /// frames.
    pub fn set_conn(&mut self, conn: u32) {
        self.put(field::CONN, &conn.to_be_bytes());
    }

    /// Set the sequence number (then [`Frame::fill_checksums`]): for tests that forge frames.
    pub fn set_seq(&mut self, seq: u32) {
        self.put(field::SEQ, &seq.to_be_bytes());
    }

    /// Mark the frame sealed and renew the header checksum (the sealing step, after
    /// [`Frame::fill_checksums`]).
    pub fn set_sealed(&mut self) {
        self.buffer.as_mut()[field::FLAGS] |= FLAG_SEALED;
        let hc = crate::crc::crc32c(&self.buffer.as_ref()[..field::HEADER_CRC.start]);
        self.put(field::HEADER_CRC, &hc.to_be_bytes());
    }

    /// Make the buffer, whatever its bytes, a frame that passes the header checks: magic,
    /// version, the payload length its size implies, both checksums. For fuzzing and tests
    /// that feed arbitrary bytes to a parser past its outer checks. False, touching nothing,
    /// when no frame has the buffer's length.
    pub fn seal(&mut self) -> bool {
        let len = self.buffer.as_ref().len();
        if !(HEADER_LEN..=HEADER_LEN + PAYLOAD_LEN_MAX).contains(&len) {
            return false;
        }
        self.put(field::MAGIC, &MAGIC.to_be_bytes());
        self.buffer.as_mut()[field::VERSION] = VERSION;
        self.put(field::PAYLOAD_LEN, &((len - HEADER_LEN) as u16).to_be_bytes());
        self.fill_checksums();
        true
    }

    /// Compute both checksums; call after the header and payload are written.
    pub fn fill_checksums(&mut self) {
        let len = self.payload_len() as usize;
        let pc = crate::crc::crc32c(&self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + len]);
        self.put(field::PAYLOAD_CRC, &pc.to_be_bytes());
        let hc = crate::crc::crc32c(&self.buffer.as_ref()[..field::HEADER_CRC.start]);
        self.put(field::HEADER_CRC, &hc.to_be_bytes());
    }
}

/// A frame header, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRepr {
    /// Kind.
    pub kind: FrameKind,
    /// The sender's link index.
    pub link: u8,
    /// Receiver's connection id.
    pub conn: u32,
    /// Sequence number (data frames).
    pub seq: u32,
    /// Piggybacked cumulative acknowledgement.
    pub ack: Option<u32>,
    /// Sender's timestamp, µs.
    pub ts: u32,
    /// Payload length.
    pub payload_len: u16,
}

impl FrameRepr {
    /// Read a checked frame's header.
    pub fn parse<T: AsRef<[u8]>>(f: &Frame<T>) -> Result<Self, WireError> {
        let flags = f.flags();
        if flags & !(FLAG_ACK | FLAG_SEALED) != 0 {
            return Err(WireError::BadValue { field: "flags" });
        }
        Ok(FrameRepr {
            kind: f.kind(),
            link: f.link(),
            conn: f.conn(),
            seq: f.seq(),
            ack: (flags & FLAG_ACK != 0).then(|| f.ack()),
            ts: f.ts(),
            payload_len: f.payload_len(),
        })
    }

    /// Bytes the frame takes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload_len as usize
    }

    /// Write the header into `buf` (at least [`FrameRepr::buffer_len`] bytes). The caller then
    /// writes the payload and calls [`Frame::fill_checksums`].
    pub fn emit<'a>(&self, buf: &'a mut [u8]) -> Frame<&'a mut [u8]> {
        let mut f = Frame::new_unchecked(&mut buf[..HEADER_LEN + self.payload_len as usize]);
        self.put_fields(&mut f);
        f
    }

    /// Write only the header into `buf` (at least [`HEADER_LEN`] bytes), with both checksums,
    /// for a payload whose CRC32C the caller computed (the payload goes out from elsewhere, as
    /// a second part of the same datagram).
    pub fn emit_header(&self, buf: &mut [u8], payload_crc: u32) {
        let mut f = Frame::new_unchecked(&mut buf[..HEADER_LEN]);
        self.put_fields(&mut f);
        f.put(field::PAYLOAD_CRC, &payload_crc.to_be_bytes());
        let hc = crate::crc::crc32c(&f.buffer[..field::HEADER_CRC.start]);
        f.put(field::HEADER_CRC, &hc.to_be_bytes());
    }

    fn put_fields(&self, f: &mut Frame<&mut [u8]>) {
        f.put(field::MAGIC, &MAGIC.to_be_bytes());
        f.buffer[field::VERSION] = VERSION;
        f.buffer[field::KIND] = self.kind.into();
        f.buffer[field::FLAGS] = if self.ack.is_some() { FLAG_ACK } else { 0 };
        f.buffer[field::LINK] = self.link;
        f.put(field::PAYLOAD_LEN, &self.payload_len.to_be_bytes());
        f.put(field::CONN, &self.conn.to_be_bytes());
        f.put(field::SEQ, &self.seq.to_be_bytes());
        f.put(field::ACK, &self.ack.unwrap_or(0).to_be_bytes());
        f.put(field::TS, &self.ts.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (FrameRepr, Vec<u8>) {
        let repr = FrameRepr {
            kind: FrameKind::Data,
            link: 2,
            conn: 0x0102_0304,
            seq: 7,
            ack: Some(5),
            ts: 99,
            payload_len: 3,
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        let mut f = repr.emit(&mut buf);
        f.payload_mut().copy_from_slice(b"abc");
        f.fill_checksums();
        (repr, buf)
    }

    // Checks the exact bytes of a header (network order, flags, fields at their offsets), so a
    // change of layout cannot pass unnoticed, and that parsing them gives the representation back.
    #[test]
    fn header_bytes_are_as_documented() {
        let (repr, buf) = sample();
        assert_eq!(&buf[..24], &[0x52, 0x57, 5, 1, 1, 2, 0, 3, 1, 2, 3, 4, 0, 0, 0, 7, 0, 0, 0, 5, 0, 0, 0, 99]);
        assert_eq!(&buf[24..28], &crate::crc::crc32c(b"abc").to_be_bytes());
        assert_eq!(&buf[28..32], &crate::crc::crc32c(&buf[..28]).to_be_bytes());
        let f = Frame::new_checked(&buf[..]).unwrap();
        assert_eq!(FrameRepr::parse(&f).unwrap(), repr);
        assert_eq!(f.payload(), b"abc");
    }

    // Checks that a header written apart from its payload, with the payload's CRC computed in
    // two parts, is byte for byte the header of the same frame written in one piece.
    #[test]
    fn split_header_matches_whole_frame() {
        let (repr, buf) = sample();
        let mut head = [0u8; HEADER_LEN];
        let crc = crate::crc::crc32c_append(crate::crc::crc32c(b"a"), b"bc");
        repr.emit_header(&mut head, crc);
        assert_eq!(&head[..], &buf[..HEADER_LEN]);
    }

    // Checks that each kind of damage is caught and named: truncation, magic, version, a bit
    // flip in the header and one in the payload.
    #[test]
    fn damage_is_named() {
        let (_, buf) = sample();
        assert!(matches!(Frame::new_checked(&buf[..20]), Err(WireError::Truncated { field: "header", .. })));
        assert!(matches!(Frame::new_checked(&buf[..33]), Err(WireError::Truncated { field: "payload", .. })));
        let mut b = buf.clone();
        b[0] = 0;
        assert!(matches!(Frame::new_checked(&b[..]), Err(WireError::BadMagic(_))));
        let mut b = buf.clone();
        b[2] = 9;
        assert_eq!(Frame::new_checked(&b[..]).unwrap_err(), WireError::BadVersion(9));
        let mut b = buf.clone();
        b[13] ^= 0x10;
        assert_eq!(Frame::new_checked(&b[..]).unwrap_err(), WireError::HeaderChecksum);
        let mut b = buf.clone();
        b[33] ^= 1;
        assert_eq!(Frame::new_checked(&b[..]).unwrap_err(), WireError::PayloadChecksum);
    }

    // Checks that unknown kinds survive a round trip instead of failing.
    #[test]
    fn unknown_kind_round_trips() {
        assert_eq!(FrameKind::from(200), FrameKind::Unknown(200));
        assert_eq!(u8::from(FrameKind::Unknown(200)), 200);
    }

    // Checks the sealing helper: arbitrary bytes of a frame's possible length become a frame
    // that passes every header check (its payload length the rest of the buffer), and a buffer
    // too short for a header is refused and left as it was.
    #[test]
    fn sealing_makes_any_bytes_a_frame() {
        for len in [HEADER_LEN, HEADER_LEN + 1, 200] {
            let mut b: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            assert!(Frame::new_checked(&b[..]).is_err(), "random bytes are not a frame to begin with");
            assert!(Frame::new_unchecked(&mut b[..]).seal());
            let f = Frame::new_checked(&b[..]).expect("sealed");
            assert_eq!(f.payload_len() as usize, len - HEADER_LEN);
        }
        let mut short = vec![7u8; HEADER_LEN - 1];
        assert!(!Frame::new_unchecked(&mut short[..]).seal());
        assert_eq!(short, vec![7u8; HEADER_LEN - 1]);
    }
}
