//! Payload formats: the data segment, acknowledgements, handshake, probe, close.

mod ack;
mod control;
mod segment;

pub use ack::*;
pub use control::*;
pub use segment::*;

use crate::error::WireError;

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

    // Checks where the ordered flag may stand: on a whole write (alone in its frame, or chained
    // ahead of another segment with its own body), a compare-and-swap and a fetch-and-add the
    // segment parses; on a write not whole in its segment, a write's later part, a read request,
    // a message or an answer it is refused as malformed.
    #[test]
    fn ordered_flag_only_on_whole_writes_and_atomics() {
        let seg = |kind, frag_off, op_len| SegmentRepr {
            op: 1,
            kind,
            flags: SEG_ORDERED,
            reason: 0,
            region: 2,
            frag_off,
            offset: 8,
            op_len,
            key: 3,
            imm: 4,
        };
        let parses = |s: &SegmentRepr, body: &[u8]| {
            let buf = data_frame(s, body);
            let f = crate::Frame::new_checked(&buf[..]).unwrap();
            Segment::new_checked(f.payload()).and_then(|x| SegmentRepr::parse(&x)).is_ok()
        };
        assert!(parses(&seg(SegKind::Write, 0, 8), &[7; 8]));
        assert!(parses(&seg(SegKind::Fadd, 0, 0), &[]));
        assert!(parses(&seg(SegKind::Cas, 0, 8), &[1; 8]));
        assert!(!parses(&seg(SegKind::Write, 0, 16), &[7; 8]), "a write not whole in its segment");
        assert!(!parses(&seg(SegKind::Write, 8, 16), &[7; 8]), "a write's later part");
        for kind in [SegKind::ReadReq, SegKind::Msg, SegKind::Done, SegKind::Refused] {
            assert!(!parses(&seg(kind, 0, 0), &[]), "{kind:?} with the ordered flag");
        }
        let mut ahead = seg(SegKind::Write, 0, 8);
        ahead.flags |= SEG_MORE;
        let mut bytes = vec![0u8; SEGMENT_LEN];
        ahead.emit(&mut bytes);
        bytes.extend_from_slice(&[9; 8]);
        let at = bytes.len();
        bytes.resize(at + SEGMENT_LEN, 0);
        seg(SegKind::Fadd, 0, 0).emit(&mut bytes[at..]);
        let got: Vec<(SegmentRepr, &[u8])> = segments(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0, got[0].1), (ahead, &[9u8; 8][..]));
        assert_eq!(got[1].0.kind, SegKind::Fadd);
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
            nonce: [u8; 32], proof: [u8; 32], ephemeral: [u8; 32], sig_half: [u8; 32], seal: bool, from: u32, to: u32, conn: u32, links in 1u8..=255, mtu in FRAME_LEN_MIN as u16..=u16::MAX,
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
            for step in [HandshakeStep::Hello, HandshakeStep::Challenge, HandshakeStep::Proof, HandshakeStep::Done, HandshakeStep::Retry] {
                let mut signature = [0u8; 64];
                signature[..32].copy_from_slice(&sig_half);
                signature[32..].copy_from_slice(&nonce);
                let mut pake = [0u8; crate::auth::PAKE_MSG_BYTES];
                pake[..32].copy_from_slice(&proof);
                pake[32] = links;
                let h = HandshakeRepr { step, links, mtu, from, to, conn, nonce, proof, ephemeral, signature, seal, pake };
                let mut b = [0u8; HANDSHAKE_LEN];
                h.emit(&mut b);
                prop_assert_eq!(HandshakeRepr::parse(&b).unwrap(), h);
            }
            let p = ProbeRepr { reply, token, echo_ts: ts };
            let mut b = [0u8; PROBE_LEN];
            p.emit(&mut b);
            prop_assert_eq!(ProbeRepr::parse(&b).unwrap(), p);
            // Padded (with leftovers of an earlier frame in the buffer): zeros, and the same probe.
            let mut b = vec![0xa5u8; PROBE_LEN + (from as usize % 1500)];
            p.emit(&mut b);
            prop_assert!(b[PROBE_LEN..].iter().all(|&x| x == 0));
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

    // Checks what a probe may carry: a short one, a reply flag other than 0/1, a reserved
    // byte set and a byte of padding set are each refused with the field named; the same
    // probe padded with zeros parses.
    #[test]
    fn bad_probes_are_refused_padded_ones_parse() {
        let p = ProbeRepr { reply: true, token: 7, echo_ts: 9 };
        let mut b = vec![0u8; PROBE_LEN + 100];
        p.emit(&mut b);
        assert_eq!(ProbeRepr::parse(&b).unwrap(), p);
        assert!(matches!(ProbeRepr::parse(&b[..PROBE_LEN - 1]).unwrap_err(), WireError::Truncated { .. }));
        b[PROBE_LEN + 99] = 1;
        assert_eq!(ProbeRepr::parse(&b).unwrap_err(), WireError::BadValue { field: "probe padding" });
        b[PROBE_LEN + 99] = 0;
        b[1] = 1;
        assert_eq!(ProbeRepr::parse(&b).unwrap_err(), WireError::BadValue { field: "probe reserved" });
        b[1] = 0;
        b[0] = 2;
        assert_eq!(ProbeRepr::parse(&b).unwrap_err(), WireError::BadValue { field: "probe" });
    }
}
