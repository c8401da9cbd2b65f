//! Data frames' payloads. An operation's bytes are held once, as [`Bytes`] (copied when it is
//! submitted from a borrowed slice, not at all when handed over owned); every frame that carries
//! part of them, and every retransmission of that frame, refers to its part, so a driver hands
//! the kernel the header and the body as two pieces of one datagram.

use bytes::Bytes;
use rackwire_wire::crc::{crc32c, crc32c_append};
use rackwire_wire::{SegmentRepr, SEGMENTS_PER_FRAME_MAX, SEGMENT_LEN, SEG_MORE};

/// The most answers (bodiless `Done` / `Refused` segments) packed ahead of a frame's last
/// segment.
pub(crate) const ANSWERS_PACKED_MAX: usize = 4;
const _: () = assert!(ANSWERS_PACKED_MAX < SEGMENTS_PER_FRAME_MAX);

/// Bytes of segment headers one payload holds at most: the packed answers and the last
/// segment's header.
const HEAD_MAX: usize = SEGMENT_LEN * (ANSWERS_PACKED_MAX + 1);

/// A data frame's payload: its segment headers (answers riding ahead, then the last segment's
/// full or short header) and the last segment's body, with their CRC32C computed once (a
/// retransmission only rewrites the frame header).
#[derive(Clone, Debug)]
pub(crate) struct DataPayload {
    head: [u8; HEAD_MAX],
    head_len: u16,
    pub body: Option<Bytes>,
    pub crc: u32,
}

impl DataPayload {
    /// `answers` (at most [`ANSWERS_PACKED_MAX`], bodiless; each marked as followed by more)
    /// ahead of `last` and its body.
    pub fn packed(answers: &[SegmentRepr], last: &SegmentRepr, body: Option<Bytes>) -> Self {
        debug_assert!(answers.len() <= ANSWERS_PACKED_MAX && answers.iter().all(|a| a.kind.is_answer()));
        let mut head = [0u8; HEAD_MAX];
        let mut at = 0;
        for a in answers.iter().take(ANSWERS_PACKED_MAX) {
            at += SegmentRepr { flags: a.flags | SEG_MORE, ..*a }.emit(&mut head[at..]);
        }
        at += last.emit(&mut head[at..]);
        let mut crc = crc32c(&head[..at]);
        if let Some(b) = &body {
            crc = crc32c_append(crc, b);
        }
        DataPayload { head, head_len: at as u16, body, crc }
    }

    /// The segment headers' bytes.
    pub fn head(&self) -> &[u8] {
        &self.head[..self.head_len as usize]
    }

    pub fn len(&self) -> usize {
        self.head_len as usize + self.body.as_ref().map_or(0, Bytes::len)
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
            let p = DataPayload::packed(&[], &seg, Some(body));
            let mut whole = vec![0u8; len];
            assert_eq!(seg.emit(&mut whole), len);
            assert_eq!(p.head(), &whole[..]);
            whole.extend_from_slice(b"345");
            assert_eq!(p.crc, crc32c(&whole));
            assert_eq!(p.len(), whole.len());
        }
    }

    // Checks a packed payload against the wire's own reader: the answers come back first, in
    // order, marked as followed by more, the last segment after them with its body, and the
    // CRC covers every byte laid end to end.
    #[test]
    fn packed_answers_read_back_in_order() {
        let answers = [SegmentRepr::answer(1, SegKind::Done, 3, 99), SegmentRepr::answer(2, SegKind::Refused, 3, 99)];
        let last =
            SegmentRepr { kind: SegKind::WriteMore, frag_off: 40, ..SegmentRepr::answer(5, SegKind::Done, 0, 0) };
        let p = DataPayload::packed(&answers, &last, Some(Bytes::from_static(b"xyz")));
        let mut whole = p.head().to_vec();
        whole.extend_from_slice(b"xyz");
        assert_eq!(p.crc, crc32c(&whole));
        assert_eq!(p.len(), 2 * SEGMENT_LEN + SEGMENT_SHORT_LEN + 3);
        let got: Vec<(SegmentRepr, Vec<u8>)> =
            rackwire_wire::segments(&whole).map(|r| r.map(|(s, b)| (s, b.to_vec())).unwrap()).collect();
        assert_eq!(got.len(), 3);
        for (g, a) in got.iter().zip(&answers) {
            assert_eq!(g.0, SegmentRepr { flags: SEG_MORE, ..*a });
            assert!(g.1.is_empty());
        }
        assert_eq!(got[2], (last, b"xyz".to_vec()));
    }
}
