//! Payload formats: the data segment, acknowledgements, handshake, probe, close.

use crate::error::{need, WireError};

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(w)
}
fn be128(b: &[u8], at: usize) -> u128 {
    let mut w = [0u8; 16];
    w.copy_from_slice(&b[at..at + 16]);
    u128::from_be_bytes(w)
}
fn zero(b: &[u8], field: &'static str) -> Result<(), WireError> {
    if b.iter().all(|&x| x == 0) {
        Ok(())
    } else {
        Err(WireError::BadValue { field })
    }
}

// ---------------------------------------------------------------------------------------------
// Data segment.

/// Bytes of a full segment header.
pub const SEGMENT_LEN: usize = 56;
/// Bytes of a short segment header (op, kind, flags, two reserved bytes, fragment offset),
/// carried by the kinds whose receiver already knows the rest: a write's later fragments (the
/// target learnt region, key, offset and length from the first) and read data (the initiator
/// knows its own read). On a 1500-byte link it leaves 44 more bytes per frame for data.
pub const SEGMENT_SHORT_LEN: usize = 12;
/// Segment flag: notify the target once the whole operation is placed.
pub const SEG_NOTIFY: u8 = 1;
/// Segment flag: backward fence (informational at the target).
pub const SEG_FENCE_BEFORE: u8 = 2;
/// Segment flag: forward fence (informational at the target).
pub const SEG_FENCE_AFTER: u8 = 4;
/// Segment flag: another segment follows this one in the same frame. A segment so marked
/// carries its whole operation (`frag_off` 0) and a body of exactly
/// [`SegmentRepr::whole_body_len`] bytes; only full-header kinds may carry it. Answers
/// ([`SegKind::Done`], [`SegKind::Refused`]) ride ahead of a frame's last segment this way, and
/// small whole requests share one frame instead of taking one each.
pub const SEG_MORE: u8 = 8;
const SEG_FLAGS_ALL: u8 = SEG_NOTIFY | SEG_FENCE_BEFORE | SEG_FENCE_AFTER | SEG_MORE;
/// The most segments one data frame carries (answers ahead of its last segment).
pub const SEGMENTS_PER_FRAME_MAX: usize = 8;

mod seg {
    pub const OP: usize = 0;
    pub const KIND: usize = 4;
    pub const FLAGS: usize = 5;
    pub const REASON: usize = 6;
    pub const RESERVED_A: usize = 7;
    pub const REGION: usize = 8;
    pub const FRAG_OFF: usize = 12;
    pub const OFFSET: usize = 16;
    pub const OP_LEN: usize = 24;
    pub const RESERVED_B: usize = 28;
    pub const KEY: usize = 32;
    pub const IMM: usize = 48;
}

const _: () = assert!(seg::IMM + 8 == SEGMENT_LEN);

mod short {
    pub const RESERVED: usize = 6;
    pub const FRAG_OFF: usize = 8;
}

const _: () = assert!(short::FRAG_OFF + 4 == SEGMENT_SHORT_LEN);

/// What a segment does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SegKind {
    /// A fragment of a one-sided write.
    Write,
    /// A request to read `op_len` bytes at `offset`.
    ReadReq,
    /// A fragment of read data, back to the initiator.
    ReadData,
    /// Compare-and-swap: expected in `imm`, new value in the 8-byte body.
    Cas,
    /// Fetch-and-add: the addend in `imm`.
    Fadd,
    /// A fragment of a two-sided message.
    Msg,
    /// The target completed the operation (`imm`: an atomic's old value).
    Done,
    /// The target refused the operation (`reason`).
    Refused,
    /// A later fragment of a one-sided write (short header: placed where the first fragment
    /// said).
    WriteMore,
    /// A kind this build does not know.
    Unknown(u8),
}

impl From<u8> for SegKind {
    fn from(v: u8) -> Self {
        match v {
            1 => SegKind::Write,
            2 => SegKind::ReadReq,
            3 => SegKind::ReadData,
            4 => SegKind::Cas,
            5 => SegKind::Fadd,
            6 => SegKind::Msg,
            7 => SegKind::Done,
            8 => SegKind::Refused,
            9 => SegKind::WriteMore,
            n => SegKind::Unknown(n),
        }
    }
}

impl From<SegKind> for u8 {
    fn from(k: SegKind) -> u8 {
        match k {
            SegKind::Write => 1,
            SegKind::ReadReq => 2,
            SegKind::ReadData => 3,
            SegKind::Cas => 4,
            SegKind::Fadd => 5,
            SegKind::Msg => 6,
            SegKind::Done => 7,
            SegKind::Refused => 8,
            SegKind::WriteMore => 9,
            SegKind::Unknown(n) => n,
        }
    }
}

impl SegKind {
    /// Whether this kind is a target's bodiless answer, which may ride ahead of another
    /// segment ([`SEG_MORE`]).
    pub fn is_answer(self) -> bool {
        matches!(self, SegKind::Done | SegKind::Refused)
    }

    /// Whether a segment of this kind may be followed by another in its frame ([`SEG_MORE`]).
    pub fn can_chain(self) -> bool {
        matches!(
            self,
            SegKind::Write
                | SegKind::ReadReq
                | SegKind::Cas
                | SegKind::Fadd
                | SegKind::Msg
                | SegKind::Done
                | SegKind::Refused
        )
    }

    /// The length of this kind's segment header: [`SEGMENT_SHORT_LEN`] for
    /// [`SegKind::WriteMore`] and [`SegKind::ReadData`], [`SEGMENT_LEN`] for the rest.
    pub fn header_len(self) -> usize {
        match self {
            SegKind::WriteMore | SegKind::ReadData => SEGMENT_SHORT_LEN,
            _ => SEGMENT_LEN,
        }
    }
}

/// A view of a segment (a data frame's payload).
#[derive(Debug, Clone)]
pub struct Segment<T: AsRef<[u8]>> {
    buffer: T,
    header_len: usize,
}

impl<T: AsRef<[u8]>> Segment<T> {
    /// Wrap and check the length (which depends on the kind).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        need("segment kind", seg::KIND + 1, b.len())?;
        let header_len = SegKind::from(b[seg::KIND]).header_len();
        need("segment header", header_len, b.len())?;
        Ok(Segment { buffer, header_len })
    }
    /// The bytes after the header.
    pub fn body(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len..]
    }
}

/// A segment header, validated. A short header ([`SegKind::header_len`]) carries `op`,
/// `kind` and `frag_off` only; its other fields read as zero and must be zero to emit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRepr {
    /// The initiator's operation id.
    pub op: u32,
    /// What it does.
    pub kind: SegKind,
    /// [`SEG_NOTIFY`], [`SEG_FENCE_BEFORE`], [`SEG_FENCE_AFTER`].
    pub flags: u8,
    /// Why a [`SegKind::Refused`] was refused.
    pub reason: u8,
    /// Target region.
    pub region: u32,
    /// Position of this fragment's body in the operation.
    pub frag_off: u32,
    /// The operation's offset in the region.
    pub offset: u64,
    /// The operation's total length.
    pub op_len: u32,
    /// The region's key.
    pub key: u128,
    /// Immediate, atomic operand, or atomic result.
    pub imm: u64,
}

impl SegmentRepr {
    /// Read a checked segment header.
    pub fn parse<T: AsRef<[u8]>>(s: &Segment<T>) -> Result<Self, WireError> {
        let b = s.buffer.as_ref();
        let kind = SegKind::from(b[seg::KIND]);
        if kind.header_len() == SEGMENT_SHORT_LEN {
            zero(&b[seg::FLAGS..seg::FLAGS + 1], "segment flags")?;
            zero(&b[short::RESERVED..short::FRAG_OFF], "segment reserved")?;
            return Ok(SegmentRepr {
                op: be32(b, seg::OP),
                kind,
                flags: 0,
                reason: 0,
                region: 0,
                frag_off: be32(b, short::FRAG_OFF),
                offset: 0,
                op_len: 0,
                key: 0,
                imm: 0,
            });
        }
        zero(&b[seg::RESERVED_A..seg::RESERVED_A + 1], "segment reserved")?;
        zero(&b[seg::RESERVED_B..seg::RESERVED_B + 4], "segment reserved")?;
        let flags = b[seg::FLAGS];
        if flags & !SEG_FLAGS_ALL != 0 || (flags & SEG_MORE != 0 && !kind.can_chain()) {
            return Err(WireError::BadValue { field: "segment flags" });
        }
        let r = SegmentRepr {
            op: be32(b, seg::OP),
            kind,
            flags,
            reason: b[seg::REASON],
            region: be32(b, seg::REGION),
            frag_off: be32(b, seg::FRAG_OFF),
            offset: be64(b, seg::OFFSET),
            op_len: be32(b, seg::OP_LEN),
            key: be128(b, seg::KEY),
            imm: be64(b, seg::IMM),
        };
        // A chained segment's body is what its header says ([`segments`] checks it); the last
        // segment's is the rest of the frame.
        let body = b.len() - SEGMENT_LEN;
        if flags & SEG_MORE == 0
            && matches!(r.kind, SegKind::Write | SegKind::Msg)
            && (r.frag_off as u64 + body as u64) > r.op_len as u64
        {
            return Err(WireError::BadValue { field: "segment frag_off" });
        }
        Ok(r)
    }

    /// The body of a segment that carries its whole operation: a write's or message's
    /// `op_len` bytes, a compare-and-swap's 8-byte new value (`op_len` 8), nothing for a read
    /// request, a fetch-and-add or an answer; `None` for kinds that cannot be chained.
    pub fn whole_body_len(&self) -> Option<usize> {
        match self.kind {
            SegKind::Write | SegKind::Msg | SegKind::Cas => Some(self.op_len as usize),
            SegKind::ReadReq | SegKind::Fadd | SegKind::Done | SegKind::Refused => Some(0),
            _ => None,
        }
    }

    /// A target's answer to operation `op` ([`SegKind::Done`] with an atomic's old value in
    /// `imm`, or [`SegKind::Refused`] with its `reason`); every other field zero.
    pub const fn answer(op: u32, kind: SegKind, reason: u8, imm: u64) -> Self {
        SegmentRepr { op, kind, flags: 0, reason, region: 0, frag_off: 0, offset: 0, op_len: 0, key: 0, imm }
    }

    /// The length of this header on the wire.
    pub fn header_len(&self) -> usize {
        self.kind.header_len()
    }

    /// Write the header into the first [`SegmentRepr::header_len`] bytes of `buf`; that
    /// length.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        if self.header_len() == SEGMENT_SHORT_LEN {
            let b = &mut buf[..SEGMENT_SHORT_LEN];
            b[seg::OP..seg::OP + 4].copy_from_slice(&self.op.to_be_bytes());
            b[seg::KIND] = self.kind.into();
            b[seg::FLAGS..short::FRAG_OFF].fill(0);
            b[short::FRAG_OFF..short::FRAG_OFF + 4].copy_from_slice(&self.frag_off.to_be_bytes());
            return SEGMENT_SHORT_LEN;
        }
        let b = &mut buf[..SEGMENT_LEN];
        b[seg::OP..seg::OP + 4].copy_from_slice(&self.op.to_be_bytes());
        b[seg::KIND] = self.kind.into();
        b[seg::FLAGS] = self.flags;
        b[seg::REASON] = self.reason;
        b[seg::RESERVED_A] = 0;
        b[seg::REGION..seg::REGION + 4].copy_from_slice(&self.region.to_be_bytes());
        b[seg::FRAG_OFF..seg::FRAG_OFF + 4].copy_from_slice(&self.frag_off.to_be_bytes());
        b[seg::OFFSET..seg::OFFSET + 8].copy_from_slice(&self.offset.to_be_bytes());
        b[seg::OP_LEN..seg::OP_LEN + 4].copy_from_slice(&self.op_len.to_be_bytes());
        b[seg::RESERVED_B..seg::RESERVED_B + 4].fill(0);
        b[seg::KEY..seg::KEY + 16].copy_from_slice(&self.key.to_be_bytes());
        b[seg::IMM..seg::IMM + 8].copy_from_slice(&self.imm.to_be_bytes());
        SEGMENT_LEN
    }
}

/// The segments of a data frame's payload, first to last, each with its body: segments marked
/// [`SEG_MORE`] (each a whole operation with its whole body, or an answer) and then one last
/// segment whose body is the rest of the payload. Yields an error, and then nothing, at the
/// first segment that does not parse, a chained segment that is not whole or whose body runs
/// past the payload, a chain that ends on [`SEG_MORE`], or more than
/// [`SEGMENTS_PER_FRAME_MAX`] segments.
pub fn segments(payload: &[u8]) -> Segments<'_> {
    Segments { rest: Some(payload), count: 0 }
}

/// Iterator of [`segments`].
#[derive(Debug, Clone)]
pub struct Segments<'a> {
    rest: Option<&'a [u8]>,
    count: usize,
}

impl<'a> Iterator for Segments<'a> {
    type Item = Result<(SegmentRepr, &'a [u8]), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.rest.take()?;
        self.count += 1;
        if self.count > SEGMENTS_PER_FRAME_MAX {
            return Some(Err(WireError::BadValue { field: "segment count" }));
        }
        let parsed = Segment::new_checked(b).and_then(|s| Ok((SegmentRepr::parse(&s)?, s.header_len)));
        let (r, header_len) = match parsed {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        if r.flags & SEG_MORE == 0 {
            return Some(Ok((r, &b[header_len..])));
        }
        let end = r.whole_body_len().filter(|_| r.frag_off == 0).map(|n| header_len + n);
        match end {
            // Something must follow.
            Some(end) if end < b.len() => {
                self.rest = Some(&b[end..]);
                Some(Ok((r, &b[header_len..end])))
            }
            _ => Some(Err(WireError::BadValue { field: "segment chain" })),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Acknowledgements.

/// The most ranges an acknowledgement or negative acknowledgement carries.
pub const ACK_RANGES_MAX: usize = 32;

/// The most duplicate-report ranges an acknowledgement carries.
pub const ACK_DUP_RANGES_MAX: usize = 4;

/// `count` ranges at `at`, which must end the payload exactly when `last`.
fn parse_ranges(b: &[u8], at: usize, count: usize, last: bool) -> Result<Vec<(u32, u32)>, WireError> {
    if count > ACK_RANGES_MAX {
        return Err(WireError::BadValue { field: "range count" });
    }
    need("ranges", at + 8 * count, b.len())?;
    if last && b.len() != at + 8 * count {
        return Err(WireError::BadValue { field: "ranges length" });
    }
    (0..count)
        .map(|i| {
            let (s, e) = (be32(b, at + 8 * i), be32(b, at + 8 * i + 4));
            // Ranges are [start, end) in sequence space; a range may not be empty or wrap
            // more than half the space.
            let len = e.wrapping_sub(s);
            if len == 0 || len > u32::MAX / 2 {
                Err(WireError::BadValue { field: "range" })
            } else {
                Ok((s, e))
            }
        })
        .collect()
}

fn emit_ranges(buf: &mut [u8], at: usize, ranges: &[(u32, u32)]) {
    for (i, (s, e)) in ranges.iter().enumerate() {
        buf[at + 8 * i..at + 8 * i + 4].copy_from_slice(&s.to_be_bytes());
        buf[at + 8 * i + 4..at + 8 * i + 8].copy_from_slice(&e.to_be_bytes());
    }
}

/// A selective acknowledgement: ranges received beyond the cumulative acknowledgement (which
/// is in the frame header), frames that arrived twice, and the timestamp of the frame that
/// triggered it. Layout: echo_ts (4), echo_link (1), range count (1), duplicate range count
/// (1), reserved (1), then the ranges and the duplicate ranges, 8 bytes each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckRepr {
    /// `ts` of the frame being answered.
    pub echo_ts: u32,
    /// The link that frame came on.
    pub echo_link: u8,
    /// Received ranges `[start, end)` above the cumulative acknowledgement.
    pub ranges: Vec<(u32, u32)>,
    /// Frames that arrived again since the last acknowledgement, as ranges `[start, end)`: the
    /// sender learns that their retransmissions were not needed.
    pub dups: Vec<(u32, u32)>,
}

impl AckRepr {
    /// Parse an acknowledgement payload.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("ack header", 8, b.len())?;
        zero(&b[7..8], "ack reserved")?;
        let (n, d) = (b[5] as usize, b[6] as usize);
        if d > ACK_DUP_RANGES_MAX {
            return Err(WireError::BadValue { field: "duplicate range count" });
        }
        let ranges = parse_ranges(b, 8, n, false)?;
        let dups = parse_ranges(b, 8 + 8 * n, d, true)?;
        Ok(AckRepr { echo_ts: be32(b, 0), echo_link: b[4], ranges, dups })
    }
    fn counts(&self) -> (usize, usize) {
        (self.ranges.len().min(ACK_RANGES_MAX), self.dups.len().min(ACK_DUP_RANGES_MAX))
    }
    /// Bytes it takes.
    pub fn buffer_len(&self) -> usize {
        let (n, d) = self.counts();
        8 + 8 * (n + d)
    }
    /// Write it (at most [`ACK_RANGES_MAX`] ranges and [`ACK_DUP_RANGES_MAX`] duplicate ranges;
    /// extra ones are dropped).
    pub fn emit(&self, buf: &mut [u8]) {
        let (n, d) = self.counts();
        buf[0..4].copy_from_slice(&self.echo_ts.to_be_bytes());
        buf[4] = self.echo_link;
        buf[5] = n as u8;
        buf[6] = d as u8;
        buf[7] = 0;
        emit_ranges(buf, 8, &self.ranges[..n]);
        emit_ranges(buf, 8 + 8 * n, &self.dups[..d]);
    }
}

/// A list of sequence ranges (the payload of a negative acknowledgement: these are missing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangesRepr {
    /// Ranges `[start, end)`.
    pub ranges: Vec<(u32, u32)>,
}

impl RangesRepr {
    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("ranges header", 4, b.len())?;
        zero(&b[1..4], "ranges reserved")?;
        Ok(RangesRepr { ranges: parse_ranges(b, 4, b[0] as usize, true)? })
    }
    /// Bytes it takes.
    pub fn buffer_len(&self) -> usize {
        4 + 8 * self.ranges.len().min(ACK_RANGES_MAX)
    }
    /// Write it (at most [`ACK_RANGES_MAX`] ranges).
    pub fn emit(&self, buf: &mut [u8]) {
        let ranges = &self.ranges[..self.ranges.len().min(ACK_RANGES_MAX)];
        buf[0] = ranges.len() as u8;
        buf[1..4].fill(0);
        emit_ranges(buf, 4, ranges);
    }
}

// ---------------------------------------------------------------------------------------------
// Handshake, probe, close.

/// Steps of the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeStep {
    /// Initiator: who I am, who I want, my nonce.
    Hello,
    /// Acceptor: my nonce, and my proof over yours.
    Challenge,
    /// Initiator: my proof over your nonce.
    Proof,
    /// Acceptor: your proof holds; the connection is up.
    Done,
}

/// A handshake payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandshakeRepr {
    /// Step.
    pub step: HandshakeStep,
    /// Links the sender has.
    pub links: u8,
    /// The sender's largest frame.
    pub mtu: u16,
    /// Sender's node.
    pub from: u32,
    /// Receiver's node.
    pub to: u32,
    /// The sender's id for this connection (frames to it carry this in `conn`).
    pub conn: u32,
    /// Nonce (Hello, Challenge).
    pub nonce: [u8; 32],
    /// Proof (Challenge, Proof).
    pub proof: [u8; 32],
}

/// Bytes of a handshake payload.
pub const HANDSHAKE_LEN: usize = 80;

/// The smallest frame a link may carry: a header, a full segment header and 64 bytes of
/// body. A handshake announcing less is refused.
pub const FRAME_LEN_MIN: usize = crate::frame::HEADER_LEN + SEGMENT_LEN + 64;

impl HandshakeRepr {
    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("handshake", HANDSHAKE_LEN, b.len())?;
        if b.len() != HANDSHAKE_LEN {
            return Err(WireError::BadValue { field: "handshake length" });
        }
        let step = match b[0] {
            1 => HandshakeStep::Hello,
            2 => HandshakeStep::Challenge,
            3 => HandshakeStep::Proof,
            4 => HandshakeStep::Done,
            _ => return Err(WireError::BadValue { field: "handshake step" }),
        };
        if b[1] == 0 {
            return Err(WireError::BadValue { field: "handshake links" });
        }
        if (u16::from_be_bytes([b[2], b[3]]) as usize) < FRAME_LEN_MIN {
            return Err(WireError::BadValue { field: "handshake mtu" });
        }
        let mut nonce = [0u8; 32];
        nonce.copy_from_slice(&b[16..48]);
        let mut proof = [0u8; 32];
        proof.copy_from_slice(&b[48..80]);
        Ok(HandshakeRepr {
            step,
            links: b[1],
            mtu: u16::from_be_bytes([b[2], b[3]]),
            from: be32(b, 4),
            to: be32(b, 8),
            conn: be32(b, 12),
            nonce,
            proof,
        })
    }
    /// Write it into [`HANDSHAKE_LEN`] bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = match self.step {
            HandshakeStep::Hello => 1,
            HandshakeStep::Challenge => 2,
            HandshakeStep::Proof => 3,
            HandshakeStep::Done => 4,
        };
        b[1] = self.links;
        b[2..4].copy_from_slice(&self.mtu.to_be_bytes());
        b[4..8].copy_from_slice(&self.from.to_be_bytes());
        b[8..12].copy_from_slice(&self.to.to_be_bytes());
        b[12..16].copy_from_slice(&self.conn.to_be_bytes());
        b[16..48].copy_from_slice(&self.nonce);
        b[48..80].copy_from_slice(&self.proof);
    }
}

/// A link probe, or its reply (same link).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeRepr {
    /// This is the answer to a probe.
    pub reply: bool,
    /// Matches a reply to its probe.
    pub token: u32,
    /// In a reply: the probe's `ts`.
    pub echo_ts: u32,
}

/// Bytes of a probe payload.
pub const PROBE_LEN: usize = 12;

impl ProbeRepr {
    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("probe", PROBE_LEN, b.len())?;
        if b.len() != PROBE_LEN || b[0] > 1 {
            return Err(WireError::BadValue { field: "probe" });
        }
        zero(&b[1..4], "probe reserved")?;
        Ok(ProbeRepr { reply: b[0] == 1, token: be32(b, 4), echo_ts: be32(b, 8) })
    }
    /// Write it into [`PROBE_LEN`] bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.reply as u8;
        b[1..4].fill(0);
        b[4..8].copy_from_slice(&self.token.to_be_bytes());
        b[8..12].copy_from_slice(&self.echo_ts.to_be_bytes());
    }
}

/// The connection ends, with a reason code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CloseRepr {
    /// Reason (0: normal close).
    pub reason: u8,
}

/// Bytes of a close payload.
pub const CLOSE_LEN: usize = 4;

impl CloseRepr {
    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("close", CLOSE_LEN, b.len())?;
        if b.len() != CLOSE_LEN {
            return Err(WireError::BadValue { field: "close length" });
        }
        zero(&b[1..4], "close reserved")?;
        Ok(CloseRepr { reason: b[0] })
    }
    /// Write it into [`CLOSE_LEN`] bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.reason;
        b[1..4].fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check_any, FrameKind, FrameRepr};
    use proptest::prelude::*;

    fn seg_strategy() -> impl Strategy<Value = (SegmentRepr, Vec<u8>)> {
        (
            any::<u32>(),
            1u8..=9,
            0u8..8,
            any::<u8>(),
            any::<u32>(),
            any::<u64>(),
            any::<u128>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            0u32..1000,
        )
            .prop_map(|(op, kind, flags, reason, region, offset, key, imm, body, extra)| {
                let frag_off = extra;
                let op_len = frag_off + body.len() as u32 + extra;
                let kind = SegKind::from(kind);
                let s = if kind.header_len() == SEGMENT_SHORT_LEN {
                    // A short header carries only these.
                    SegmentRepr {
                        op,
                        kind,
                        flags: 0,
                        reason: 0,
                        region: 0,
                        frag_off,
                        offset: 0,
                        op_len: 0,
                        key: 0,
                        imm: 0,
                    }
                } else {
                    SegmentRepr { op, kind, flags, reason, region, frag_off, offset, op_len, key, imm }
                };
                (s, body)
            })
    }

    /// A segment that carries its whole operation (what may be chained ahead of another) and its
    /// body.
    fn whole_strategy() -> impl Strategy<Value = (SegmentRepr, Vec<u8>)> {
        (
            any::<u32>(),
            0usize..7,
            0u8..8,
            (any::<u8>(), any::<u32>(), any::<u64>(), any::<u128>(), any::<u64>()),
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<u32>(),
        )
            .prop_map(|(op, k, flags, (reason, region, offset, key, imm), body, read_len)| {
                let kinds = [
                    SegKind::Write,
                    SegKind::ReadReq,
                    SegKind::Cas,
                    SegKind::Fadd,
                    SegKind::Msg,
                    SegKind::Done,
                    SegKind::Refused,
                ];
                let kind = kinds[k];
                let (op_len, body) = match kind {
                    SegKind::Write | SegKind::Msg => (body.len() as u32, body),
                    SegKind::Cas => (8, body.iter().copied().cycle().take(8).chain([0; 8]).take(8).collect()),
                    SegKind::ReadReq => (read_len, Vec::new()),
                    _ => (0, Vec::new()),
                };
                let s = SegmentRepr {
                    op,
                    kind,
                    flags: flags | SEG_MORE,
                    reason,
                    region,
                    frag_off: 0,
                    offset,
                    op_len,
                    key,
                    imm,
                };
                (s, body)
            })
    }

    /// A complete data frame around a segment.
    fn data_frame(seg: &SegmentRepr, body: &[u8]) -> Vec<u8> {
        let repr = FrameRepr {
            kind: FrameKind::Data,
            link: 1,
            conn: 9,
            seq: 3,
            ack: None,
            ts: 1,
            payload_len: (seg.header_len() + body.len()) as u16,
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        let mut f = repr.emit(&mut buf);
        let n = seg.emit(f.payload_mut());
        assert_eq!(n, seg.header_len());
        f.payload_mut()[n..].copy_from_slice(body);
        f.fill_checksums();
        buf
    }

    proptest! {
        // Checks that parsing arbitrary bytes never panics, with and without a valid header
        // in front (so the payload parsers see arbitrary payloads too).
        #[test]
        fn parsing_arbitrary_bytes_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300), kind in 0u8..8) {
            crate::check_sealed(&data);
            let repr = FrameRepr { kind: kind.into(), link: 0, conn: 1, seq: 2, ack: Some(3), ts: 4, payload_len: data.len() as u16 };
            let mut buf = vec![0u8; repr.buffer_len()];
            let mut f = repr.emit(&mut buf);
            f.payload_mut().copy_from_slice(&data);
            f.fill_checksums();
            check_any(&buf);
        }

        // Checks that a segment emitted into a frame parses back to what was emitted, body
        // included, through the same checked path a receiver uses.
        #[test]
        fn segment_round_trips((seg, body) in seg_strategy()) {
            let buf = data_frame(&seg, &body);
            let f = crate::Frame::new_checked(&buf[..]).unwrap();
            let s = Segment::new_checked(f.payload()).unwrap();
            prop_assert_eq!(SegmentRepr::parse(&s).unwrap(), seg);
            prop_assert_eq!(s.body(), &body[..]);
        }

        // Checks that whole segments chained ahead of a last segment (answers, whole writes,
        // messages, reads, atomics) come back out of `segments` in order, each with exactly its
        // own body, and the last with the rest, whatever the last is.
        #[test]
        fn chained_segments_round_trip(
            ahead in proptest::collection::vec(whole_strategy(), 0..SEGMENTS_PER_FRAME_MAX),
            (last, body) in seg_strategy(),
        ) {
            let mut want = Vec::new();
            let mut bytes = Vec::new();
            for (a, a_body) in ahead {
                let at = bytes.len();
                bytes.resize(at + SEGMENT_LEN, 0);
                a.emit(&mut bytes[at..]);
                bytes.extend_from_slice(&a_body);
                want.push((a, a_body));
            }
            let at = bytes.len();
            bytes.resize(at + last.header_len(), 0);
            last.emit(&mut bytes[at..]);
            bytes.extend_from_slice(&body);
            want.push((last, body));
            let got: Vec<(SegmentRepr, Vec<u8>)> =
                segments(&bytes).map(|r| r.map(|(s, b)| (s, b.to_vec()))).collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(got, want);
        }

        // Checks that acknowledgements, negative acknowledgements, handshakes, probes and
        // closes round-trip through emit and parse.
        #[test]
        fn control_payloads_round_trip(
            ts: u32, link: u8,
            starts in proptest::collection::vec(any::<u32>(), 0..ACK_RANGES_MAX),
            dup_starts in proptest::collection::vec(any::<u32>(), 0..ACK_DUP_RANGES_MAX),
            nonce: [u8; 32], proof: [u8; 32], from: u32, to: u32, conn: u32, links in 1u8..=255, mtu in FRAME_LEN_MIN as u16..=u16::MAX,
            token: u32, reply: bool, reason: u8,
        ) {
            let ranges: Vec<(u32, u32)> = starts.iter().map(|&s| (s, s.wrapping_add(1 + s % 100))).collect();
            let dups: Vec<(u32, u32)> = dup_starts.iter().map(|&s| (s, s.wrapping_add(1))).collect();
            let ack = AckRepr { echo_ts: ts, echo_link: link, ranges: ranges.clone(), dups };
            let mut b = vec![0u8; ack.buffer_len()];
            ack.emit(&mut b);
            prop_assert_eq!(AckRepr::parse(&b).unwrap(), ack);
            let nack = RangesRepr { ranges };
            let mut b = vec![0u8; nack.buffer_len()];
            nack.emit(&mut b);
            prop_assert_eq!(RangesRepr::parse(&b).unwrap(), nack);
            for step in [HandshakeStep::Hello, HandshakeStep::Challenge, HandshakeStep::Proof, HandshakeStep::Done] {
                let h = HandshakeRepr { step, links, mtu, from, to, conn, nonce, proof };
                let mut b = [0u8; HANDSHAKE_LEN];
                h.emit(&mut b);
                prop_assert_eq!(HandshakeRepr::parse(&b).unwrap(), h);
            }
            let p = ProbeRepr { reply, token, echo_ts: ts };
            let mut b = [0u8; PROBE_LEN];
            p.emit(&mut b);
            prop_assert_eq!(ProbeRepr::parse(&b).unwrap(), p);
            let c = CloseRepr { reason };
            let mut b = [0u8; CLOSE_LEN];
            c.emit(&mut b);
            prop_assert_eq!(CloseRepr::parse(&b).unwrap(), c);
        }
    }

    // Checks that bad segment chains are refused with the field named and end the iteration:
    // "more follows" on a kind that cannot chain, a chain that ends on "more follows", a
    // chained write that is not whole or whose body runs to or past the payload's end, and
    // more segments than a frame may carry.
    #[test]
    fn bad_segment_chains_are_named() {
        let answer = SegmentRepr { flags: SEG_MORE, ..SegmentRepr::answer(1, SegKind::Done, 0, 0) };
        let mut b = [0u8; SEGMENT_LEN];
        answer.emit(&mut b);
        let errors = |bytes: &[u8]| segments(bytes).filter_map(Result::err).collect::<Vec<_>>();
        assert_eq!(errors(&b), vec![WireError::BadValue { field: "segment chain" }]);
        b[4] = 99;
        let mut unknown = b.to_vec();
        unknown.extend_from_slice(&b);
        assert_eq!(errors(&unknown), vec![WireError::BadValue { field: "segment flags" }]);
        // A chained write of 100 bytes: whole, followed by an answer, it reads; cut short, or
        // followed by nothing, or a later fragment (frag_off 4), it does not.
        let write = SegmentRepr { kind: SegKind::Write, op_len: 100, ..answer };
        let mut chain = vec![0u8; SEGMENT_LEN];
        write.emit(&mut chain);
        chain.extend_from_slice(&[7; 100]);
        let last = SegmentRepr::answer(2, SegKind::Done, 0, 0);
        let mut tail = [0u8; SEGMENT_LEN];
        last.emit(&mut tail);
        let whole = [&chain[..], &tail[..]].concat();
        let got: Vec<_> = segments(&whole).collect::<Result<_, _>>().unwrap();
        assert_eq!(got, vec![(write, &[7u8; 100][..]), (last, &[][..])]);
        assert_eq!(errors(&chain), vec![WireError::BadValue { field: "segment chain" }]);
        assert_eq!(errors(&whole[..SEGMENT_LEN + 50]), vec![WireError::BadValue { field: "segment chain" }]);
        let later = SegmentRepr { frag_off: 4, ..write };
        later.emit(&mut chain);
        assert_eq!(errors(&[&chain[..], &tail[..]].concat()), vec![WireError::BadValue { field: "segment chain" }]);
        answer.emit(&mut b);
        let long: Vec<u8> = b.repeat(SEGMENTS_PER_FRAME_MAX + 1);
        assert_eq!(segments(&long).filter(Result::is_ok).count(), SEGMENTS_PER_FRAME_MAX);
        assert_eq!(errors(&long), vec![WireError::BadValue { field: "segment count" }]);
    }

    // Checks that bad values are refused with the field named: too many ranges, an empty range,
    // a fragment that runs past its operation, a nonzero reserved byte, an unknown step.
    #[test]
    fn bad_values_are_named() {
        let mut b = vec![0u8; 8 + 8 * 33];
        b[5] = 33;
        assert_eq!(AckRepr::parse(&b).unwrap_err(), WireError::BadValue { field: "range count" });
        b[5] = 0;
        b[6] = 5;
        assert_eq!(AckRepr::parse(&b).unwrap_err(), WireError::BadValue { field: "duplicate range count" });
        b[6] = 1;
        assert_eq!(AckRepr::parse(&b).unwrap_err(), WireError::BadValue { field: "ranges length" });
        let mut b = vec![0u8; 12];
        b[0] = 1;
        assert_eq!(RangesRepr::parse(&b).unwrap_err(), WireError::BadValue { field: "range" });
        let seg = SegmentRepr {
            op: 1,
            kind: SegKind::Write,
            flags: 0,
            reason: 0,
            region: 1,
            frag_off: 10,
            offset: 0,
            op_len: 12,
            key: 0,
            imm: 0,
        };
        let mut b = vec![0u8; SEGMENT_LEN + 4];
        seg.emit(&mut b);
        assert_eq!(
            SegmentRepr::parse(&Segment::new_checked(&b[..]).unwrap()).unwrap_err(),
            WireError::BadValue { field: "segment frag_off" }
        );
        let mut b = [0u8; SEGMENT_LEN];
        b[28] = 1;
        assert_eq!(
            SegmentRepr::parse(&Segment::new_checked(&b[..]).unwrap()).unwrap_err(),
            WireError::BadValue { field: "segment reserved" }
        );
        // A short header: flags and reserved bytes must be zero, and it needs its 12 bytes.
        let mut b = [0u8; SEGMENT_SHORT_LEN];
        b[4] = 9;
        b[7] = 1;
        assert_eq!(
            SegmentRepr::parse(&Segment::new_checked(&b[..]).unwrap()).unwrap_err(),
            WireError::BadValue { field: "segment reserved" }
        );
        b[7] = 0;
        b[5] = 1;
        assert_eq!(
            SegmentRepr::parse(&Segment::new_checked(&b[..]).unwrap()).unwrap_err(),
            WireError::BadValue { field: "segment flags" }
        );
        assert!(Segment::new_checked(&b[..11]).is_err());
        let mut b = [0u8; HANDSHAKE_LEN];
        b[0] = 9;
        b[1] = 1;
        assert_eq!(HandshakeRepr::parse(&b).unwrap_err(), WireError::BadValue { field: "handshake step" });
        // A frame size too small for one segment header and some body is refused.
        b[0] = 1;
        b[2..4].copy_from_slice(&(FRAME_LEN_MIN as u16 - 1).to_be_bytes());
        assert_eq!(HandshakeRepr::parse(&b).unwrap_err(), WireError::BadValue { field: "handshake mtu" });
        b[2..4].copy_from_slice(&(FRAME_LEN_MIN as u16).to_be_bytes());
        assert!(HandshakeRepr::parse(&b).is_ok());
    }
}
