//! Acknowledgements: selective ranges of frames received, and the ranges a receiver reports
//! missing.

use super::{be32, zero};
use crate::error::{need, WireError};

/// The most ranges an acknowledgement or negative acknowledgement carries.
pub const ACK_RANGES_MAX: usize = 32;

/// The most duplicate-report ranges an acknowledgement carries.
pub const ACK_DUP_RANGES_MAX: usize = 4;

/// Bytes of one range: its start and its end, 4 each.
const RANGE_LEN: usize = 8;

/// Where an acknowledgement's fields lie.
mod field {
    use std::ops::Range;
    pub const ECHO_TS: Range<usize> = 0..4;
    pub const ECHO_LINK: usize = 4;
    pub const RANGE_COUNT: usize = 5;
    pub const DUP_COUNT: usize = 6;
    pub const RESERVED: Range<usize> = 7..8;
    /// The ranges, then the duplicate ranges.
    pub const RANGES: usize = 8;
}
const _: () = assert!(field::RESERVED.end == field::RANGES);

/// Where a ranges payload's fields lie.
mod ranges_field {
    use std::ops::Range;
    pub const COUNT: usize = 0;
    pub const RESERVED: Range<usize> = 1..4;
    pub const RANGES: usize = 4;
}
const _: () = assert!(ranges_field::RESERVED.end == ranges_field::RANGES);

/// `count` ranges at `at`, which must end the payload exactly when `last`.
pub(super) fn parse_ranges(b: &[u8], at: usize, count: usize, last: bool) -> Result<Vec<(u32, u32)>, WireError> {
    if count > ACK_RANGES_MAX {
        return Err(WireError::BadValue { field: "range count" });
    }
    need("ranges", at + RANGE_LEN * count, b.len())?;
    if last && b.len() != at + RANGE_LEN * count {
        return Err(WireError::BadValue { field: "ranges length" });
    }
    (0..count)
        .map(|i| {
            let (s, e) = (be32(b, at + RANGE_LEN * i), be32(b, at + RANGE_LEN * i + 4));
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

pub(super) fn emit_ranges(buf: &mut [u8], at: usize, ranges: &[(u32, u32)]) {
    for (i, (s, e)) in ranges.iter().enumerate() {
        let r = at + RANGE_LEN * i;
        buf[r..r + 4].copy_from_slice(&s.to_be_bytes());
        buf[r + 4..r + RANGE_LEN].copy_from_slice(&e.to_be_bytes());
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
        need("ack header", field::RANGES, b.len())?;
        zero(&b[field::RESERVED], "ack reserved")?;
        let (n, d) = (b[field::RANGE_COUNT] as usize, b[field::DUP_COUNT] as usize);
        if d > ACK_DUP_RANGES_MAX {
            return Err(WireError::BadValue { field: "duplicate range count" });
        }
        let ranges = parse_ranges(b, field::RANGES, n, false)?;
        let dups = parse_ranges(b, field::RANGES + RANGE_LEN * n, d, true)?;
        Ok(AckRepr { echo_ts: be32(b, field::ECHO_TS.start), echo_link: b[field::ECHO_LINK], ranges, dups })
    }
    fn counts(&self) -> (usize, usize) {
        (self.ranges.len().min(ACK_RANGES_MAX), self.dups.len().min(ACK_DUP_RANGES_MAX))
    }
    /// Bytes it takes.
    pub fn buffer_len(&self) -> usize {
        let (n, d) = self.counts();
        field::RANGES + RANGE_LEN * (n + d)
    }
    /// Write it (at most [`ACK_RANGES_MAX`] ranges and [`ACK_DUP_RANGES_MAX`] duplicate ranges;
    /// extra ones are dropped).
    pub fn emit(&self, buf: &mut [u8]) {
        let (n, d) = self.counts();
        buf[field::ECHO_TS].copy_from_slice(&self.echo_ts.to_be_bytes());
        buf[field::ECHO_LINK] = self.echo_link;
        buf[field::RANGE_COUNT] = n as u8;
        buf[field::DUP_COUNT] = d as u8;
        buf[field::RESERVED].fill(0);
        emit_ranges(buf, field::RANGES, &self.ranges[..n]);
        emit_ranges(buf, field::RANGES + RANGE_LEN * n, &self.dups[..d]);
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
        need("ranges header", ranges_field::RANGES, b.len())?;
        zero(&b[ranges_field::RESERVED], "ranges reserved")?;
        Ok(RangesRepr { ranges: parse_ranges(b, ranges_field::RANGES, b[ranges_field::COUNT] as usize, true)? })
    }
    /// Bytes it takes.
    pub fn buffer_len(&self) -> usize {
        ranges_field::RANGES + RANGE_LEN * self.ranges.len().min(ACK_RANGES_MAX)
    }
    /// Write it (at most [`ACK_RANGES_MAX`] ranges).
    pub fn emit(&self, buf: &mut [u8]) {
        let ranges = &self.ranges[..self.ranges.len().min(ACK_RANGES_MAX)];
        buf[ranges_field::COUNT] = ranges.len() as u8;
        buf[ranges_field::RESERVED].fill(0);
        emit_ranges(buf, ranges_field::RANGES, ranges);
    }
}
