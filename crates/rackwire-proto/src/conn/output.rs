//! What leaves: control frames, retransmissions, and new data frames packed with answers and
//! small whole operations, each on the near link with the fewest frames in flight.

use bytes::Bytes;
use rackwire_wire::payload::{CLOSE_LEN, PROBE_LEN};
use rackwire_wire::{
    AckRepr, CloseRepr, FrameKind, FrameRepr, ProbeRepr, RangesRepr, SegKind, SegmentRepr, HEADER_LEN,
    SEGMENTS_PER_FRAME_MAX, SEGMENT_LEN,
};

use super::{Connection, FrameBufs, Role, Sent, SplitTransmit, State, Transmit};
use crate::chunk::{DataPayload, Piece, ANSWERS_PACKED_MAX, CHAINED_SEGMENT_MAX};
use crate::link::Link;
use crate::seal::TRAILER_LEN;
use crate::Time;

/// A link is a detour when its quickest round trip exceeds the quickest link's this many
/// times, plus [`DETOUR_RTT_SLACK_US`] (scheduling noise on a small host is tens of µs).
const DETOUR_RTT_FACTOR: Time = 4;
/// See [`DETOUR_RTT_FACTOR`] (µs).
const DETOUR_RTT_SLACK_US: Time = 200;

/// Body bytes a frame's last segment keeps room for at least when answers ride ahead of it.
pub(super) const ANSWER_RIDE_BODY_MIN: usize = 64;

/// Whether a segment may have another chained behind it in its frame: it carries its whole
/// operation (or is an answer), and is small enough to be copied.
pub(super) fn chainable(p: &Piece) -> bool {
    let body = p.1.as_ref().map_or(0, Bytes::len);
    p.0.frag_off == 0 && p.0.whole_body_len() == Some(body) && piece_len(p) <= CHAINED_SEGMENT_MAX
}

/// Bytes a segment and its body take in a frame.
pub(super) fn piece_len((s, body): &Piece) -> usize {
    s.header_len() + body.as_ref().map_or(0, Bytes::len)
}

impl Connection {
    pub(super) fn frame_repr(
        &self,
        now: Time,
        link: usize,
        kind: FrameKind,
        seq: u64,
        payload_len: usize,
    ) -> FrameRepr {
        let conn = if kind == FrameKind::Handshake && self.role == Role::Initiator && self.peer_conn == 0 {
            0
        } else {
            self.peer_conn
        };
        let ack = (self.state == State::Established && self.recv.any).then_some(self.recv.next as u32);
        FrameRepr {
            kind,
            link: link as u8,
            conn,
            seq: seq as u32,
            ack,
            ts: now as u32,
            payload_len: payload_len as u16,
        }
    }

    /// Count a frame of `len` bytes on the wire (its trailer included when sealed).
    pub(super) fn count_sent(&mut self, repr: &FrameRepr, len: usize) {
        if repr.ack.is_some() {
            self.recv.acked(repr.kind == FrameKind::Ack);
        }
        let len = len as u64;
        let link = repr.link as usize;
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += len;
        self.links[link].sent(len);
    }

    /// A control frame, whole, into the buffer `bufs` gives for `link` (sealed, on a sealed
    /// connection, unless it is a handshake frame).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit(
        &mut self,
        now: Time,
        bufs: &mut dyn FrameBufs,
        link: usize,
        kind: FrameKind,
        seq: u64,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<SplitTransmit> {
        let buf = bufs.frame_buf(link);
        let repr = self.frame_repr(now, link, kind, seq, payload_len);
        let seal = self.keys.is_some() && kind != FrameKind::Handshake;
        let len = repr.buffer_len();
        if buf.len() < len + if seal { TRAILER_LEN } else { 0 } {
            return None;
        }
        let head_len = match (&mut self.keys, seal) {
            (Some(keys), true) => {
                // The tag covers the payload: no CRC32C over it (sealing sets the header's).
                repr.emit_header(buf, 0);
                fill(&mut buf[HEADER_LEN..len]);
                keys.seal(buf, len)
            }
            _ => {
                let mut f = repr.emit(buf);
                fill(f.payload_mut());
                f.fill_checksums();
                len
            }
        };
        self.count_sent(&repr, head_len);
        Some(SplitTransmit { link, head_len, body: None })
    }

    /// A data frame: header and segment into the buffer `bufs` gives for `link`, the body
    /// shared; on a sealed connection the body is sealed from where it lies into that buffer
    /// behind them (see `Keys::seal_with`).
    pub(super) fn emit_data(
        &mut self,
        now: Time,
        bufs: &mut dyn FrameBufs,
        link: usize,
        seq: u64,
        payload: &DataPayload,
    ) -> Option<SplitTransmit> {
        let buf = bufs.frame_buf(link);
        let repr = self.frame_repr(now, link, FrameKind::Data, seq, payload.len());
        let seg = payload.head();
        let head_len = HEADER_LEN + seg.len();
        let len = repr.buffer_len();
        if buf.len() < head_len || (self.keys.is_some() && buf.len() < len + TRAILER_LEN) {
            return None;
        }
        // A sealed frame's payload is covered by its tag: no CRC32C over it.
        repr.emit_header(buf, if self.keys.is_some() { 0 } else { payload.crc() });
        buf[HEADER_LEN..head_len].copy_from_slice(seg);
        if let Some(keys) = &mut self.keys {
            let sealed = keys.seal_with(buf, head_len, payload.body.as_deref().unwrap_or_default());
            self.count_sent(&repr, sealed);
            return Some(SplitTransmit { link, head_len: sealed, body: None });
        }
        self.count_sent(&repr, len);
        Some(SplitTransmit { link, head_len, body: payload.body.clone() })
    }

    /// A link for data: up, not suspect, with window left, where the frame should arrive
    /// soonest: the link's round trip grown by how full its window is (a window's worth of
    /// frames drains in about one round trip). Equal links so take turns; a slower link gets
    /// frames in proportion to what it drains, and none at the tail of a transfer that a faster
    /// link would deliver sooner. `avoid` is skipped when another qualifies (retransmissions
    /// prefer another link).
    pub(super) fn pick_link(&mut self, avoid: Option<usize>) -> Option<usize> {
        let n = self.links.len();
        // A link whose quickest round trip is far longer than the quickest link's is a detour,
        // used only while the near ones have no room. Among near links the one with the fewest
        // frames in flight goes first, ties in turn: a burst alternates over equal links
        // (rather than queueing on the one whose smoothed round trip, swollen by its own
        // queue, happens to be lower), and a faster link, whose frames leave sooner, takes
        // more of them. A link not measured yet counts as near. A frame sent while nothing is
        // in flight (a ping-pong's) takes the link of quickest round trip, not each in turn
        // (a link not measured yet counts as quickest, so it gets measured); among links
        // equally quick, the first, every time: a ping-pong keeps to one path (and its answers,
        // chosen the same way at the peer, to the same one) instead of going round links whose
        // round trips are equal only to the microsecond.
        let nearest = self.links.iter().filter_map(Link::min_rtt).min().unwrap_or(0);
        let reach = nearest.saturating_mul(DETOUR_RTT_FACTOR).saturating_add(DETOUR_RTT_SLACK_US);
        let lone = self.links.iter().all(|l| l.inflight == 0);
        let cost = |l: &Link| {
            let rtt = l.min_rtt();
            (rtt.is_some_and(|m| m > reach), l.inflight, if lone { rtt.unwrap_or(0) } else { 0 })
        };
        let pick = |strict: bool, skip: Option<usize>| -> Option<usize> {
            let mut best: Option<((bool, usize, Time), usize)> = None;
            for i in 0..n {
                let c = if lone { i } else { (self.rr + i) % n };
                let l = &self.links[c];
                if Some(c) == skip || !l.has_room() || (strict && l.suspect) {
                    continue;
                }
                let e = cost(l);
                if best.is_none_or(|(b, _)| e < b) {
                    best = Some((e, c));
                }
            }
            best.map(|(_, c)| c)
        };
        let healthy = self.links.iter().any(|l| l.up && !l.suspect);
        let chosen = pick(true, avoid.filter(|_| n > 1)).or_else(|| pick(true, None)).or_else(|| {
            if healthy {
                None
            } else {
                pick(false, None)
            }
        });
        if let Some(c) = chosen {
            self.rr = c + 1;
        }
        chosen
    }

    pub(super) fn any_link_up(&self) -> Option<usize> {
        (0..self.links.len()).map(|i| (self.rr + i) % self.links.len()).find(|&i| self.links[i].up)
    }

    /// The next frame to send, written whole into `buf` (at least the largest MTU). Call until
    /// `None`.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        let t = self.poll_transmit_to(now, &mut &mut *buf)?;
        let len = t.len();
        if let Some(body) = &t.body {
            buf[t.head_len..len].copy_from_slice(&body[..]);
        }
        Some(Transmit { link: t.link, len })
    }

    /// The next frame to send, as a head written into the buffer `bufs` gives for the frame's
    /// link once the link is chosen (one buffer, a `&mut [u8]`, at least the largest MTU, serves
    /// every link), and the body shared with its operation: a driver sends both without copying
    /// the body, and one that gathers each link's frames end to end has them written where they
    /// are gathered, not copied there after. Call until `None`.
    pub fn poll_transmit_to(&mut self, now: Time, bufs: &mut dyn FrameBufs) -> Option<SplitTransmit> {
        let t = self.next_transmit(now, bufs);
        self.check_invariants();
        t
    }

    fn next_transmit(&mut self, now: Time, bufs: &mut dyn FrameBufs) -> Option<SplitTransmit> {
        if let Some(code) = self.close_send.take() {
            let link = self.any_link_up().unwrap_or(0);
            return self.emit(now, bufs, link, FrameKind::Close, 0, CLOSE_LEN, |p| CloseRepr { reason: code }.emit(p));
        }
        if matches!(self.state, State::Closed(_)) {
            return None;
        }
        if let Some(t) = self.poll_handshake(now, bufs) {
            return Some(t);
        }
        if let Some((link, token, ts, len)) = self.probe_replies.pop_front() {
            // As long as the probe (a padded one asks whether the path carries that length
            // back), up to this end's own frames. Only probes that proved their sender the peer
            // are queued here (an unproven frame is acted on only as a handshake step).
            let len = len.min(self.probe_reply_len_max()).max(PROBE_LEN);
            let p = ProbeRepr { reply: true, token, echo_ts: ts };
            return self.emit(now, bufs, link, FrameKind::Probe, 0, len, |b| p.emit(b));
        }
        if self.state != State::Established {
            return None;
        }
        if let Some(t) = self.poll_path_probe(now, bufs) {
            return Some(t);
        }
        for i in 0..self.links.len() {
            if self.links[i].probe_due {
                self.probe_token = self.probe_token.wrapping_add(1);
                let token = self.probe_token;
                self.links[i].start_probe(token, now);
                let p = ProbeRepr { reply: false, token, echo_ts: 0 };
                return self.emit(now, bufs, i, FrameKind::Probe, 0, PROBE_LEN, |b| p.emit(b));
            }
        }
        if self.recv.nack_due {
            let ranges = self.recv.take_nacks(now);
            if !ranges.is_empty() {
                let n = RangesRepr { ranges };
                let link = self.any_link_up().unwrap_or(0);
                self.stats.nacks_sent += 1;
                return self.emit(now, bufs, link, FrameKind::Nack, 0, n.buffer_len(), |b| n.emit(b));
            }
        }
        while let Some(&seq) = self.retx.front() {
            let Some(s) = self.inflight.get(seq) else {
                self.retx.pop_front();
                continue;
            };
            let prev = s.link;
            // No link has window for it now: fall through (an acknowledgement may still be due).
            let Some(link) = self.pick_link(Some(prev)) else { break };
            self.retx.pop_front();
            let s = self.inflight.get_mut(seq).expect("checked");
            s.counted_on = Some(link);
            s.link = link;
            s.sent_at = now;
            s.retransmitted = true;
            let payload = s.payload.clone();
            self.links[link].count(seq, now, true);
            self.stats.retransmits += 1;
            return self.emit_data(now, bufs, link, seq, &payload);
        }
        // Datagrams next: nothing waits for them to be sent, and they need no window.
        if let Some(t) = self.poll_datagram(now, bufs) {
            return Some(t);
        }
        // New data and answers go next; they carry the cumulative acknowledgement, so an
        // explicit one is sent only when nothing else is going out (or gaps need selective
        // ranges).
        if let Some(t) = self.poll_new_data(now, bufs) {
            return Some(t);
        }
        if self.recv.ack_due(now) {
            let (ts, l) = self.recv.echo;
            let a = AckRepr { echo_ts: ts, echo_link: l, ranges: self.recv.sack_ranges(), dups: self.recv.take_dups() };
            let link = if self.links.get(l as usize).is_some_and(|k| k.up) {
                l as usize
            } else {
                self.any_link_up().unwrap_or(0)
            };
            self.stats.acks_sent += 1;
            return self.emit(now, bufs, link, FrameKind::Ack, 0, a.buffer_len(), |b| a.emit(b));
        }
        None
    }

    /// A new data frame, if the windows allow: answers the target owes ride ahead of its last
    /// segment, which is owed read data if any, else the next fragment of an operation, else
    /// one more answer. Answers alone wait while held ([`Connection::hold_answers`]).
    pub(super) fn poll_new_data(&mut self, now: Time, bufs: &mut dyn FrameBufs) -> Option<SplitTransmit> {
        if !self.path_settled()
            || self.inflight.len() >= self.cfg.window_frames_max
            || !self.inflight.has_room()
            || self.incoming.len() >= crate::OPS_MAX
        {
            return None;
        }
        let bodiless = |r: &(SegmentRepr, Option<Bytes>)| r.0.kind.is_answer() && r.1.is_none();
        if !self.ops.can_emit()
            && (self.responses.is_empty() || (now < self.answers_held_until && self.responses.iter().all(bodiless)))
        {
            return None;
        }
        let link = self.pick_link(None)?;
        // Room for answers ahead of a last segment that still carries a useful body.
        let payload_max = self.data_payload_max();
        let room =
            (payload_max.saturating_sub(SEGMENT_LEN + ANSWER_RIDE_BODY_MIN) / SEGMENT_LEN).min(ANSWERS_PACKED_MAX);
        let mut answers = [SegmentRepr::answer(0, SegKind::Done, 0, 0); ANSWERS_PACKED_MAX];
        let mut n = 0;
        while n < room && self.responses.front().is_some_and(bodiless) {
            answers[n] = self.responses.pop_front().expect("looked at").0;
            n += 1;
        }
        let packed = n * SEGMENT_LEN;
        let fits = |r: &Piece| packed + piece_len(r) <= payload_max;
        let mut last: Piece = match self.responses.front() {
            Some(r) if fits(r) => self.responses.pop_front().expect("looked at"),
            _ => match self.ops.next_segment(payload_max - packed) {
                Some((_, seg, body)) => (seg, body),
                None if n == 0 => return None,
                None => {
                    // Nothing else goes: the last answer taken ends the frame.
                    n -= 1;
                    (answers[n], None)
                }
            },
        };
        // Small whole operations (and answers) waiting behind share the frame: each one moves
        // the last ahead, while the frame has room and segments to spare. (Nothing is gathered
        // for the usual frame of one operation.)
        let mut chained: Vec<Piece> = Vec::new();
        let mut used = packed + piece_len(&last);
        while n + chained.len() + 1 < SEGMENTS_PER_FRAME_MAX && chainable(&last) {
            let room = (payload_max - used).min(CHAINED_SEGMENT_MAX);
            let from_responses = self.responses.front().is_some_and(|r| piece_len(r) <= room && chainable(r));
            let next = if from_responses {
                self.responses.pop_front()
            } else {
                let op = self.ops.next_whole(room).map(|(_, seg, body)| (seg, body));
                self.stats.ops_chained += op.is_some() as u64;
                op
            };
            let Some(next) = next else { break };
            used += piece_len(&next);
            chained.push(std::mem::replace(&mut last, next));
        }
        let (last, body) = last;
        let payload = if chained.is_empty() {
            DataPayload::packed(&answers[..n], &last, body)
        } else {
            let ahead: Vec<Piece> = answers[..n].iter().map(|a| (*a, None)).chain(chained).collect();
            DataPayload::chain(&ahead, &last, body)
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.stats.data_frames += 1;
        self.stats.answers_packed += n as u64;
        let t = self.emit_data(now, bufs, link, seq, &payload);
        let added =
            self.inflight.push(seq, Sent { payload, counted_on: Some(link), link, sent_at: now, retransmitted: false });
        debug_assert!(added, "sequence numbers only grow");
        self.links[link].count(seq, now, false);
        t
    }
}
