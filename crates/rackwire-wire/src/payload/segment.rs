//! The data segment: one operation (or a fragment of one, or an answer) inside a data frame;
//! up to [`SEGMENTS_PER_FRAME_MAX`] of them chained in a frame.

use super::{be128, be32, be64, zero};
use crate::error::{need, WireError};

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
/// Segment flag: the target acts on this operation only once every frame sent before the one
/// carrying it has arrived, so that every operation submitted before it has taken effect there
/// first (a signal behind its data, without waiting for the data's answer). Only on a whole
/// write (its first and only fragment) or an atomic.
pub const SEG_ORDERED: u8 = 16;
pub(super) const SEG_FLAGS_ALL: u8 = SEG_NOTIFY | SEG_FENCE_BEFORE | SEG_FENCE_AFTER | SEG_MORE | SEG_ORDERED;
/// The most segments one data frame carries (answers ahead of its last segment).
pub const SEGMENTS_PER_FRAME_MAX: usize = 8;

pub(super) mod seg {
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

pub(super) mod short {
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
        if flags & !SEG_FLAGS_ALL != 0
            || (flags & SEG_MORE != 0 && !kind.can_chain())
            || (flags & SEG_ORDERED != 0 && !matches!(kind, SegKind::Write | SegKind::Cas | SegKind::Fadd))
        {
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
        // An ordered write is whole: a chained one is (see [`SEG_MORE`]); a last one's body is
        // all of it.
        if flags & SEG_ORDERED != 0
            && r.kind == SegKind::Write
            && (r.frag_off != 0 || (flags & SEG_MORE == 0 && body as u64 != r.op_len as u64))
        {
            return Err(WireError::BadValue { field: "ordered write not whole" });
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
