//! Data frames' payloads. An operation's bytes are held once, as [`Bytes`] (copied when it is
//! submitted from a borrowed slice, not at all when handed over owned); every frame that carries
//! part of them, and every retransmission of that frame, refers to its part, so a driver hands
//! the kernel the header and the body as two pieces of one datagram.

use bytes::{BufMut, Bytes, BytesMut};
use rackwire_wire::crc::{crc32c, crc32c_append};
use rackwire_wire::{SegmentRepr, SEGMENTS_PER_FRAME_MAX, SEGMENT_LEN, SEG_MORE};

/// The most answers (bodiless `Done` / `Refused` segments) packed ahead of a frame's last
/// segment when the frame carries a body that leaves room for them.
pub(crate) const ANSWERS_PACKED_MAX: usize = 4;
const _: () = assert!(ANSWERS_PACKED_MAX < SEGMENTS_PER_FRAME_MAX);

/// The largest whole operation (segment header and body) that shares a frame with others; the
/// bodies of such a frame are copied into one buffer, so only small ones share.
pub(crate) const CHAINED_SEGMENT_MAX: usize = 8 * 1024;

/// Bytes of segment headers one payload holds in its head at most: packed answers and the
/// last segment's header (chained segments past that go into the body).
const HEAD_MAX: usize = SEGMENT_LEN * (ANSWERS_PACKED_MAX + 1);

/// A segment and its body, as a frame carries it.
pub(crate) type Piece = (SegmentRepr, Option<Bytes>);

/// A data frame's payload: its segment headers (segments chained ahead, then the last
/// segment's full or short header) and the last segment's body (a retransmission only
/// rewrites the frame header). Where a segment ahead has a body,
/// the head ends with that segment's header and the body holds the rest of the frame.
#[derive(Clone, Debug)]
pub(crate) struct DataPayload {
    head: [u8; HEAD_MAX],
    head_len: u16,
    pub body: Option<Bytes>,
}

impl DataPayload {
    /// `ahead` (whole operations or answers, each with exactly its whole body; each marked as
    /// followed by more), then `last` and its body; at most [`SEGMENTS_PER_FRAME_MAX`] in all.
    /// Only bodies ahead of the last are copied: with none, the last body is kept as it is.
    pub fn chain(ahead: &[Piece], last: &SegmentRepr, body: Option<Bytes>) -> Self {
        debug_assert!(ahead.len() < SEGMENTS_PER_FRAME_MAX);
        debug_assert!(ahead
            .iter()
            .all(|(s, b)| s.frag_off == 0 && s.whole_body_len() == Some(b.as_ref().map_or(0, Bytes::len))));
        let mut head = [0u8; HEAD_MAX];
        let mut at = 0;
        // Everything after the first body ahead (or past the head's room) is laid out here.
        let mut rest: Option<BytesMut> = None;
        let new_rest = || BytesMut::with_capacity(CHAINED_SEGMENT_MAX);
        for (s, b) in ahead.iter().take(SEGMENTS_PER_FRAME_MAX - 1) {
            let s = SegmentRepr { flags: s.flags | SEG_MORE, ..*s };
            // The head keeps room for the last segment's header.
            if rest.is_none() && at + s.header_len() + SEGMENT_LEN > HEAD_MAX {
                rest = Some(new_rest());
            }
            match &mut rest {
                None => at += s.emit(&mut head[at..]),
                Some(r) => put_header(r, &s),
            }
            if let Some(b) = b.as_ref().filter(|b| !b.is_empty()) {
                rest.get_or_insert_with(new_rest).put_slice(b);
            }
        }
        let body = match rest {
            None => {
                at += last.emit(&mut head[at..]);
                body
            }
            Some(mut r) => {
                put_header(&mut r, last);
                if let Some(b) = &body {
                    r.put_slice(b);
                }
                Some(r.freeze())
            }
        };
        DataPayload { head, head_len: at as u16, body }
    }

    /// `answers` (at most [`ANSWERS_PACKED_MAX`], bodiless; each marked as followed by more)
    /// ahead of `last` and its body: the common frame, nothing copied.
    pub fn packed(answers: &[SegmentRepr], last: &SegmentRepr, body: Option<Bytes>) -> Self {
        debug_assert!(answers.len() <= ANSWERS_PACKED_MAX && answers.iter().all(|a| a.kind.is_answer()));
        let mut head = [0u8; HEAD_MAX];
        let mut at = 0;
        for a in answers.iter().take(ANSWERS_PACKED_MAX) {
            at += SegmentRepr { flags: a.flags | SEG_MORE, ..*a }.emit(&mut head[at..]);
        }
        at += last.emit(&mut head[at..]);
        DataPayload { head, head_len: at as u16, body }
    }

    /// The payload's CRC32C (for an unsealed frame's header: a sealed frame's tag covers
    /// its payload instead).
    pub fn crc(&self) -> u32 {
        let crc = crc32c(self.head());
        self.body.as_ref().map_or(crc, |b| crc32c_append(crc, b))
    }

    /// The segment headers' bytes.
    pub fn head(&self) -> &[u8] {
        &self.head[..self.head_len as usize]
    }

    pub fn len(&self) -> usize {
        self.head_len as usize + self.body.as_ref().map_or(0, Bytes::len)
    }
}

/// A segment header appended to `buf`.
fn put_header(buf: &mut BytesMut, s: &SegmentRepr) {
    let mut h = [0u8; SEGMENT_LEN];
    let n = s.emit(&mut h);
    buf.put_slice(&h[..n]);
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
            assert_eq!(p.crc(), crc32c(&whole));
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
        assert_eq!(p.crc(), crc32c(&whole));
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

    // Checks chained payloads against the wire's own reader, with seven segments ahead of the
    // last (more headers than the head holds, so some go into the body) and with bodies ahead
    // (copied into one buffer): every segment comes back in order with exactly its own body,
    // all but the last marked as followed by more, and the CRC covers every byte.
    #[test]
    fn chains_read_back_in_order() {
        let write = |op: u32, len: usize| {
            let s = SegmentRepr {
                kind: SegKind::Write,
                op_len: len as u32,
                ..SegmentRepr::answer(op, SegKind::Done, 0, 0)
            };
            (s, Some(Bytes::from(vec![op as u8; len])))
        };
        let answer = |op: u32| (SegmentRepr::answer(op, SegKind::Done, 0, op as u64), None);
        let cases: [Vec<Piece>; 3] = [
            (1..=7).map(answer).collect(),
            (1..=7).map(|op| if op % 2 == 0 { write(op, 10 * op as usize) } else { answer(op) }).collect(),
            vec![write(1, 0), write(2, 300), answer(3)],
        ];
        for ahead in cases {
            let (last, body) = write(99, 50);
            let p = DataPayload::chain(&ahead, &last, body.clone());
            let mut whole = p.head().to_vec();
            whole.extend_from_slice(p.body.as_deref().unwrap_or(&[]));
            assert_eq!(p.crc(), crc32c(&whole));
            assert_eq!(p.len(), whole.len());
            let got: Vec<(SegmentRepr, Vec<u8>)> =
                rackwire_wire::segments(&whole).map(|r| r.map(|(s, b)| (s, b.to_vec())).unwrap()).collect();
            let mut want: Vec<(SegmentRepr, Vec<u8>)> = ahead
                .iter()
                .map(|(s, b)| (SegmentRepr { flags: s.flags | SEG_MORE, ..*s }, b.as_deref().unwrap_or(&[]).to_vec()))
                .collect();
            want.push((last, body.as_deref().unwrap_or(&[]).to_vec()));
            assert_eq!(got, want);
        }
    }
}
