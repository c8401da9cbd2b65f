//! Acknowledgements: selective ranges of frames received, and the ranges a receiver reports
//! missing.

use super::*;

/// The most ranges an acknowledgement or negative acknowledgement carries.
pub const ACK_RANGES_MAX: usize = 32;

/// The most duplicate-report ranges an acknowledgement carries.
pub const ACK_DUP_RANGES_MAX: usize = 4;

/// `count` ranges at `at`, which must end the payload exactly when `last`.
pub(super) fn parse_ranges(b: &[u8], at: usize, count: usize, last: bool) -> Result<Vec<(u32, u32)>, WireError> {
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

pub(super) fn emit_ranges(buf: &mut [u8], at: usize, ranges: &[(u32, u32)]) {
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
