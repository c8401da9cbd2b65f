//! What arrives: frames checked and dispatched, data frames' segments acted on, answers
//! queued.

use bytes::Bytes;
use rackwire_wire::payload::{SEG_NOTIFY, SEG_ORDERED};
use rackwire_wire::{
    AckRepr, CloseRepr, Frame, FrameKind, FrameRepr, HandshakeRepr, ProbeRepr, RangesRepr, SegKind, SegmentRepr,
    SEGMENT_SHORT_LEN,
};

use rackwire_wire::HEADER_LEN;

use super::{unwrap_seq, CloseReason, Connection, Event, State};
use crate::ops::WriteOutcome;
use crate::recv::Arrival;
use crate::seal::Unsealed;
use crate::{AtomicOp, Completion, OpError, OpId, Refusal, RegionReq, Span, Target, Time};

/// What a segment hands the application once it acts: message bytes, and notifications.
pub(super) fn handed_over((s, body): &(SegmentRepr, &[u8])) -> (usize, usize) {
    let bytes = if s.kind == SegKind::Msg { body.len() } else { 0 };
    let notifies = matches!(s.kind, SegKind::Write | SegKind::ReadReq) && s.flags & SEG_NOTIFY != 0;
    (bytes, notifies as usize)
}

impl Connection {
    /// A frame arrived on `link`. Damaged, malformed, foreign, forged or replayed frames are
    /// counted and dropped. Returns whether the frame proved that the peer sent it (it opened
    /// under the connection's keys, or is a handshake step only the peer can make; on a
    /// connection that does not seal, any frame once established): only such a frame may
    /// tell the driver where the peer is now.
    pub fn handle_frame(&mut self, now: Time, link: usize, bytes: &[u8], target: &mut dyn Target) -> bool {
        // On a sealed connection only handshake frames (which carry their own proofs, and
        // change nothing once the handshake is over) and, during the handshake, a close (an
        // end that refused the other before it had keys) come unsealed; everything else is
        // opened first, and what does not open is dropped unread.
        let sealed = bytes.len() >= HEADER_LEN && Frame::new_unchecked(bytes).sealed();
        let may_come_unsealed = bytes.len() >= HEADER_LEN && self.may_come_unsealed(Frame::new_unchecked(bytes).kind());
        match (&mut self.keys, sealed) {
            (Some(keys), true) => {
                let mut opened = std::mem::take(&mut self.opened);
                let proven = match keys.open(bytes, &mut opened) {
                    Ok(n) => self.handle_checked(now, link, Frame::new_opened(&opened[..n]), target, true),
                    Err(Unsealed::Forged) => {
                        self.stats.forged += 1;
                        false
                    }
                    Err(Unsealed::Replayed) => {
                        self.stats.replayed += 1;
                        false
                    }
                    Err(Unsealed::Malformed) => {
                        self.stats.malformed += 1;
                        false
                    }
                };
                self.opened = opened;
                proven
            }
            (None, true) => {
                self.stats.forged += 1;
                false
            }
            (Some(_), false) if bytes.len() >= HEADER_LEN && !may_come_unsealed => {
                self.stats.unsealed += 1;
                false
            }
            _ => {
                // Unsealed: proven only on a connection that agreed not to seal, once
                // established (nothing can be proven there: sealing off is for measuring).
                let plain_conn = self.keys.is_none() && self.state == State::Established;
                self.handle_checked(now, link, Frame::new_checked(bytes), target, plain_conn)
            }
        }
    }

    fn may_come_unsealed(&self, kind: FrameKind) -> bool {
        kind == FrameKind::Handshake || (kind == FrameKind::Close && self.state == State::Handshaking)
    }

    /// A checked frame; `proven`: it opened under the connection's keys (or the connection
    /// does not seal). An unproven frame may only be a handshake step, which checks its own
    /// proofs: nothing else in it (an acknowledgement in its header, that its link is alive, a
    /// close) is taken. Returns whether the frame proved its sender the peer.
    fn handle_checked(
        &mut self,
        now: Time,
        link: usize,
        checked: Result<Frame<&[u8]>, rackwire_wire::WireError>,
        target: &mut dyn Target,
        proven: bool,
    ) -> bool {
        let Ok(frame) = checked else {
            self.stats.malformed += 1;
            return false;
        };
        let Ok(repr) = FrameRepr::parse(&frame) else {
            self.stats.malformed += 1;
            return false;
        };
        if link >= self.links.len() || matches!(self.state, State::Closed(_)) {
            self.stats.malformed += 1;
            return false;
        }
        let first_hello = repr.kind == FrameKind::Handshake && repr.conn == 0;
        if repr.conn != self.local_conn && !first_hello {
            self.stats.malformed += 1;
            return false;
        }
        let payload = frame.payload();
        if !proven {
            // Before the keys (or, on a sealed connection, a handshake frame after them): only
            // a handshake step is acted on, and it proves itself or changes nothing. A close
            // that comes unsealed proves nothing either: the handshake goes on to its timeout.
            return match repr.kind {
                FrameKind::Handshake => match HandshakeRepr::parse(payload) {
                    Ok(h) => {
                        let proven = self.on_handshake(now, h);
                        if proven {
                            self.heard_on(now, link, frame.total_len() as u64);
                        }
                        proven
                    }
                    Err(_) => {
                        self.stats.malformed += 1;
                        false
                    }
                },
                _ => {
                    self.stats.unproven += 1;
                    false
                }
            };
        }
        self.heard_on(now, link, frame.total_len() as u64);
        let established = self.state == State::Established;
        if let (Some(ack), true) = (repr.ack, established) {
            let ack = unwrap_seq(self.next_seq, ack);
            self.on_cumulative_ack(now, ack);
        }
        match repr.kind {
            FrameKind::Handshake => match HandshakeRepr::parse(payload) {
                Ok(h) => {
                    self.on_handshake(now, h);
                }
                Err(_) => self.stats.malformed += 1,
            },
            FrameKind::Data if established => self.on_data(now, link, &repr, payload, target),
            FrameKind::Ack if established => match AckRepr::parse(payload) {
                Ok(a) => {
                    for (s, e) in self.widen(&a.ranges) {
                        self.on_delivered_range(now, s, e);
                    }
                    for (s, e) in self.widen(&a.dups) {
                        self.on_arrived_twice(s, e);
                    }
                }
                Err(_) => self.stats.malformed += 1,
            },
            FrameKind::Nack if established => match RangesRepr::parse(payload) {
                Ok(n) => {
                    for (s, e) in self.widen(&n.ranges) {
                        self.on_reported_missing(now, s, e);
                    }
                }
                Err(_) => self.stats.malformed += 1,
            },
            FrameKind::Probe => match ProbeRepr::parse(payload) {
                Ok(p) if !p.reply => {
                    if self.probe_replies.len() < super::PROBE_REPLIES_MAX {
                        self.probe_replies.push_back((link, p.token, repr.ts, payload.len()));
                    }
                }
                Ok(p) => {
                    if !self.on_path_reply(now, link, p.token, payload.len()) {
                        self.on_probe_reply(now, link, p);
                    }
                }
                Err(_) => self.stats.malformed += 1,
            },
            FrameKind::Close => match CloseRepr::parse(payload) {
                Ok(c) => self.shut(CloseReason::Peer(c.reason)),
                Err(_) => self.stats.malformed += 1,
            },
            FrameKind::Datagram if established => self.on_datagram(payload),
            FrameKind::Data | FrameKind::Ack | FrameKind::Nack | FrameKind::Datagram | FrameKind::Unknown(_) => {}
        }
        // Losses are looked for once the frames that arrived together are all in (at the next
        // timeout, which is due at once): acknowledgements on one link read before those on
        // another must not make the other's frames look lost. Nothing in flight, nothing to
        // lose.
        self.losses_due = !self.inflight.is_empty();
        self.check_invariants();
        true
    }

    /// A frame that proved its sender arrived on `link`: the link is alive.
    fn heard_on(&mut self, now: Time, link: usize, len: u64) {
        self.stats.frames_received += 1;
        self.stats.bytes_received += len;
        self.links[link].heard(now, len);
        self.last_heard = now;
    }

    /// Ranges of our sequence numbers from the wire, widened to 64 bits.
    pub(super) fn widen(&self, ranges: &[(u32, u32)]) -> Vec<(u64, u64)> {
        ranges
            .iter()
            .map(|&(s, e)| {
                let s64 = unwrap_seq(self.next_seq, s);
                (s64, s64 + e.wrapping_sub(s) as u64)
            })
            .collect()
    }

    pub(super) fn on_data(
        &mut self,
        now: Time,
        link: usize,
        repr: &FrameRepr,
        payload: &[u8],
        target: &mut dyn Target,
    ) {
        let seq = unwrap_seq(self.recv.next, repr.seq);
        // A sender keeps every frame it sends within SEND_SPAN_MAX of its oldest one in flight,
        // which is at or below the first frame missing here: a frame further ahead is damaged
        // or forged (and would make the gap to it, which is tracked, unbounded).
        if seq >= self.recv.next + crate::SEND_SPAN_MAX {
            self.stats.malformed += 1;
            return;
        }
        // The whole chain is checked before any of it acts: whole operations and answers
        // chained ahead, each with its body, then the frame's last segment with the rest. (The
        // segments ahead, usually none, are read again to act on them.) The same pass adds up
        // what the frame hands the application.
        let mut last = None;
        let mut n = 0;
        let (mut bytes, mut notes, mut ordered) = (0, 0, 0);
        for seg in rackwire_wire::segments(payload) {
            match seg {
                Ok(x) => {
                    let (b, k) = handed_over(&x);
                    bytes += b;
                    notes += k;
                    ordered += (x.0.flags & SEG_ORDERED != 0) as usize;
                    n += last.replace(x).is_some() as usize;
                }
                Err(_) => {
                    self.stats.malformed += 1;
                    return;
                }
            }
        }
        let Some((s, body)) = last else {
            self.stats.malformed += 1;
            return;
        };
        let duplicate = self.recv.is_duplicate(seq);
        // Ordered segments act only once every frame sent before theirs has arrived; behind a
        // gap they wait (copied), and a frame that would overfill the wait is dropped
        // unacknowledged (sent again later, when the gap has likely closed). Delivering in
        // order, the whole frame waits so.
        let behind_gap = seq != self.recv.next;
        let hold = self.cfg.in_order && behind_gap && !duplicate;
        if hold && self.held.len() >= crate::IN_ORDER_HELD_MAX {
            self.stats.stash_full += 1;
            return;
        }
        if !duplicate && !hold && behind_gap && self.ordered_waiting.len() + ordered > crate::ORDERED_WAITING_MAX {
            self.stats.stash_full += 1;
            return;
        }
        // What the frame hands the application (message bytes, notifications) must fit in what
        // its queues have room for; if not, the frame is dropped unacknowledged and sent again
        // later, as the receiver reads (see [`Connection::set_delivery_room`]).
        if !duplicate {
            if !self.room.takes(bytes, notes) {
                self.stats.receiver_full += 1;
                return;
            }
            self.room.take(bytes, notes);
        }
        // A write's later fragment ahead of its first cannot be placed yet: it is kept until
        // the first arrives, or, when the stash is full, dropped unacknowledged (sent again,
        // with any answers that rode along).
        let early = !hold && s.kind == SegKind::WriteMore && !duplicate && self.incoming.placement(s.op).is_none();
        if early && !self.incoming.stash(s.op, seq, s.frag_off, body) {
            self.stats.stash_full += 1;
            return;
        }
        match self.recv.on_data(seq, repr.ts, link as u8, now, &self.cfg) {
            Arrival::Duplicate => {
                self.stats.duplicates += 1;
                return;
            }
            Arrival::New { beyond_gap } => {
                if beyond_gap {
                    self.stats.out_of_order += 1;
                }
            }
        }
        if hold {
            self.stats.held += 1;
            self.held.insert(seq, payload.to_vec());
            return;
        }
        self.act_frame(seq, behind_gap, n, payload, (!early).then_some((&s, body)), target);
        // Frames delivered in order that waited for this one, in the order they were sent. A
        // write's fragments go in order, and a frame sent again keeps its number, so none of
        // them is a fragment ahead of its first; one that is (a misbehaving sender) is dropped.
        while let Some(entry) = self.held.first_entry().filter(|e| *e.key() < self.recv.next) {
            let (held_seq, held) = entry.remove_entry();
            let n = rackwire_wire::segments(&held).count().saturating_sub(1);
            match rackwire_wire::segments(&held).last() {
                Some(Ok((s, _))) if s.kind == SegKind::WriteMore && self.incoming.placement(s.op).is_none() => {
                    self.stats.malformed += 1;
                }
                Some(Ok((s, body))) => self.act_frame(held_seq, false, n, &held, Some((&s, body)), target),
                // Checked whole when it arrived.
                _ => self.stats.malformed += 1,
            }
        }
        // The frame may have closed the gap that ordered segments wait behind.
        while self.ordered_waiting.front().is_some_and(|w| w.0 < self.recv.next) {
            let (_, w, w_body) = self.ordered_waiting.pop_front().expect("looked at");
            self.on_segment(&w, &w_body, target);
        }
        let orphans = self.incoming.drop_orphans(self.recv.next);
        self.stats.malformed += orphans as u64;
    }

    /// Act on the segments of data frame `seq` (checked whole already): the `n` chained ahead,
    /// then the last (`last`, as the check read it; none: it was a fragment ahead of its
    /// first, stashed).
    fn act_frame(
        &mut self,
        seq: u64,
        behind_gap: bool,
        n: usize,
        payload: &[u8],
        last: Option<(&SegmentRepr, &[u8])>,
        target: &mut dyn Target,
    ) {
        for (a, a_body) in rackwire_wire::segments(payload).take(n).flatten() {
            self.act(seq, behind_gap, &a, a_body, target);
        }
        match last {
            Some((s, body)) => self.act(seq, behind_gap, s, body, target),
            None => self.stats.stashed += 1,
        }
    }

    /// Act on one segment of new data frame `seq`, or, if it is ordered and the frame came
    /// `behind_gap` (a frame sent before it is missing), keep it until the gap closes (in the
    /// order the frames were sent).
    fn act(&mut self, seq: u64, behind_gap: bool, s: &SegmentRepr, body: &[u8], target: &mut dyn Target) {
        if s.flags & SEG_ORDERED == 0 || !behind_gap {
            return self.on_segment(s, body, target);
        }
        let at = self.ordered_waiting.partition_point(|w| w.0 <= seq);
        self.ordered_waiting.insert(at, (seq, *s, body.to_vec()));
    }

    /// Act on one segment of a new data frame.
    pub(super) fn on_segment(&mut self, s: &SegmentRepr, body: &[u8], target: &mut dyn Target) {
        let req = RegionReq { peer: self.peer, region: s.region, key: s.key };
        self.signalled |= s.flags & SEG_ORDERED != 0;
        match s.kind {
            SegKind::Write
                if s.frag_off == 0 && body.len() as u64 == u64::from(s.op_len) && self.incoming.no_writes() =>
            {
                // A whole write, nothing else in progress: placed and answered at once, without
                // the bookkeeping of a write that comes in pieces.
                let r = target.write(req, Span { offset: s.offset, len: s.op_len as u64 }, s.offset, body);
                let notify = (r.is_ok() && s.flags & SEG_NOTIFY != 0).then_some((
                    s.region,
                    s.offset,
                    u64::from(s.op_len),
                    s.imm,
                ));
                self.write_finished(s.op, r.err(), notify);
            }
            SegKind::Write => {
                self.incoming.begin_write(s);
                let r = target.write(
                    req,
                    Span { offset: s.offset, len: s.op_len as u64 },
                    s.offset + s.frag_off as u64,
                    body,
                );
                self.write_done(s.op, body.len(), r);
                for (frag_off, data) in self.incoming.unstash(s.op) {
                    self.write_more(s.op, frag_off, &data, target);
                }
            }
            SegKind::WriteMore => self.write_more(s.op, s.frag_off, body, target),
            SegKind::ReadReq => {
                // Nothing is allocated for a read before the target has accepted it: a length
                // past the protocol's limit is refused, and a one-byte read of its last byte
                // checks the key, the grant and the bounds first (a peer without a grant, or
                // one asking past the region's end, costs no memory).
                let len = u64::from(s.op_len);
                let checked = if len > crate::OP_BYTES_MAX {
                    Err(Refusal::TooLarge)
                } else if len == 0 {
                    Ok(())
                } else {
                    match s.offset.checked_add(len - 1) {
                        Some(last) => target.read(req, last, &mut [0u8; 1]),
                        None => Err(Refusal::OutOfBounds { region_len: 0 }),
                    }
                };
                let mut data = Vec::new();
                let read = checked.and_then(|()| {
                    data = vec![0u8; len as usize];
                    target.read(req, s.offset, &mut data)
                });
                match read {
                    Ok(()) => {
                        let data = Bytes::from(data);
                        let mut at = 0;
                        while at < data.len() {
                            let end = (at + self.data_payload_max() - SEGMENT_SHORT_LEN).min(data.len());
                            let part = Some(data.slice(at..end));
                            self.respond(SegKind::ReadData, s.op, 0, at as u32, s.op_len, 0, part);
                            at = end;
                        }
                        if data.is_empty() {
                            self.respond(SegKind::ReadData, s.op, 0, 0, 0, 0, None);
                        }
                        if s.flags & SEG_NOTIFY != 0 {
                            self.events.push_back(Event::Notification {
                                region: s.region,
                                offset: s.offset,
                                len: s.op_len as u64,
                                imm: s.imm,
                            });
                        }
                    }
                    Err(r) => self.answer(s.op, Some(r), 0),
                }
            }
            SegKind::Cas | SegKind::Fadd => {
                let op = if s.kind == SegKind::Cas {
                    let new = body.get(..8).map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
                    match new {
                        Some(new) => AtomicOp::CompareSwap { expected: s.imm, new },
                        None => {
                            self.stats.malformed += 1;
                            return;
                        }
                    }
                } else {
                    AtomicOp::FetchAdd(s.imm)
                };
                match target.atomic(req, s.offset, op) {
                    Ok(old) => self.answer(s.op, None, old),
                    Err(r) => self.answer(s.op, Some(r), 0),
                }
            }
            SegKind::Msg => match self.incoming.msg_fragment(s, body) {
                Ok(done) => {
                    for (op, data) in done {
                        self.answer(op, None, 0);
                        self.events.push_back(Event::Message { data });
                    }
                }
                Err((op, r)) => self.answer(op, Some(r), 0),
            },
            SegKind::ReadData => {
                if let Some(result) = self.ops.on_read_data(s.op, s.frag_off as u64, body) {
                    self.completed(s.op, result);
                }
            }
            SegKind::Done => {
                if let Some(result) = self.ops.on_done(s.op, s.imm) {
                    self.completed(s.op, result);
                }
            }
            SegKind::Refused => {
                if let Some(result) = self.ops.on_refused(s.op, Refusal::from_wire(s.reason, s.imm)) {
                    self.stats.refused += 1;
                    self.completed(s.op, result);
                }
            }
            SegKind::Unknown(_) => self.stats.malformed += 1,
        }
    }

    /// Place a write's later fragment where its first fragment said, after the target's check.
    pub(super) fn write_more(&mut self, op: OpId, frag_off: u32, body: &[u8], target: &mut dyn Target) {
        let Some(at) = self.incoming.placement(op) else { return };
        let r = at.and_then(|p| {
            if frag_off as u64 + body.len() as u64 > p.op_len {
                return Err(Refusal::OutOfBounds { region_len: 0 });
            }
            target.write(
                RegionReq { peer: self.peer, region: p.region, key: p.key },
                Span { offset: p.offset, len: p.op_len },
                p.offset + frag_off as u64,
                body,
            )
        });
        self.write_done(op, body.len(), r);
    }

    /// Account a placed (or refused) write fragment; answer and notify once the write is whole.
    pub(super) fn write_done(&mut self, op: OpId, len: usize, r: Result<(), Refusal>) {
        match self.incoming.write_fragment(op, len as u64, r) {
            WriteOutcome::Partial => {}
            WriteOutcome::Complete { refused, notify } => self.write_finished(op, refused, notify),
        }
    }

    /// A whole write is placed (or refused): answer, and notify if asked.
    pub(super) fn write_finished(&mut self, op: OpId, refused: Option<Refusal>, notify: Option<(u32, u64, u64, u64)>) {
        self.answer(op, refused, 0);
        if let Some((region, offset, len, imm)) = notify {
            self.events.push_back(Event::Notification { region, offset, len, imm });
        }
    }

    pub(super) fn completed(&mut self, op: OpId, result: Result<Completion, OpError>) {
        self.events.push_back(Event::Completed { op, result });
    }

    /// Queue the target's answer to an operation: `Done` (with an atomic's old value in `imm`)
    /// or `Refused`.
    pub(super) fn answer(&mut self, op: OpId, refused: Option<Refusal>, value: u64) {
        match refused {
            None => self.respond(SegKind::Done, op, 0, 0, 0, value, None),
            Some(r) => {
                self.stats.refused_here += 1;
                self.respond(SegKind::Refused, op, r.code(), 0, 0, r.detail(), None);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn respond(
        &mut self,
        kind: SegKind,
        op: OpId,
        reason: u8,
        frag_off: u32,
        op_len: u32,
        imm: u64,
        body: Option<Bytes>,
    ) {
        let seg = SegmentRepr { op, kind, flags: 0, reason, region: 0, frag_off, offset: 0, op_len, key: 0, imm };
        self.responses.push_back((seg, body));
    }
}
