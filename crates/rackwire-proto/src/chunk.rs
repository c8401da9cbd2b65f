//! Data frames' payloads. An operation's bytes are held once, as [`Bytes`] (copied when it is
//! submitted from a borrowed slice, not at all when handed over owned); every frame that carries
//! part of them, and every retransmission of that frame, refers to its part, so a driver hands
//! the kernel the header and the body as two pieces of one datagram.

use bytes::Bytes;
use rackwire_wire::{SegmentRepr, SEGMENT_LEN};

/// A data frame's payload: the segment header (full or short) and the body, with their CRC32C
/// computed once (a retransmission only rewrites the frame header).
#[derive(Clone, Debug)]
pub(crate) struct DataPayload {
    seg: [u8; SEGMENT_LEN],
    seg_len: u8,
    pub body: Option<Bytes>,
    pub crc: u32,
}

impl DataPayload {
    pub fn new(seg: &SegmentRepr, body: Option<Bytes>) -> Self {
        let mut head = [0u8; SEGMENT_LEN];
        let seg_len = seg.emit(&mut head);
        let mut crc = rackwire_wire::crc::crc32c(&head[..seg_len]);
        if let Some(b) = &body {
            crc = rackwire_wire::crc::crc32c_append(crc, b);
        }
        DataPayload { seg: head, seg_len: seg_len as u8, body, crc }
    }

    /// The segment header's bytes.
    pub fn seg(&self) -> &[u8] {
        &self.seg[..self.seg_len as usize]
    }

    pub fn len(&self) -> usize {
        self.seg_len as usize + self.body.as_ref().map_or(0, Bytes::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use rackwire_wire::{SegKind, SEGMENT_SHORT_LEN};

    // Checks, for a full and a short segment header, that a payload's CRC equals the CRC of
    // its emitted header and body laid end to end, and that its length counts both.
    #[test]
    fn crc_of_parts() {
        for (kind, len) in [(SegKind::Write, SEGMENT_LEN), (SegKind::WriteMore, SEGMENT_SHORT_LEN)] {
            let seg = SegmentRepr {
                op: 7,
                kind,
                flags: 0,
                reason: 0,
                region: 0,
                frag_off: 3,
                offset: 0,
                op_len: 0,
                key: 0,
                imm: 0,
            };
            let body = Bytes::from_static(b"0123456789").slice(3..6);
            let p = DataPayload::new(&seg, Some(body));
            let mut whole = vec![0u8; len];
            assert_eq!(seg.emit(&mut whole), len);
            assert_eq!(p.seg(), &whole[..]);
            whole.extend_from_slice(b"345");
            assert_eq!(p.crc, rackwire_wire::crc::crc32c(&whole));
            assert_eq!(p.len(), whole.len());
        }
    }
}
