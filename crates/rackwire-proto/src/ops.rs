//! Operations: the initiator's table (queue, fences, fragmentation, completion) and the
//! target's table of operations arriving.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rackwire_wire::payload::{SEG_FENCE_AFTER, SEG_FENCE_BEFORE, SEG_NOTIFY, SEG_ORDERED};
use rackwire_wire::{SegKind, SegmentRepr, SEGMENT_LEN, SEGMENT_SHORT_LEN};

use bytes::Bytes;

use crate::{Refusal, Time, MESSAGE_BYTES_MAX, OPS_MAX, STASH_BYTES_MAX, WINDOW_FRAMES_MAX};

/// Messages of one connection being reassembled at most: a window of frames' worth, since a
/// sender has no more in flight.
pub const MESSAGES_OPEN_MAX: u64 = WINDOW_FRAMES_MAX as u64;

/// An operation's id, unique per connection and direction.
pub type OpId = u32;

/// A region of the peer's memory: its id and key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionRef {
    /// Region id at the peer.
    pub region: u32,
    /// Its key.
    pub key: u128,
}

/// Options of an operation (default: unordered, silent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpFlags {
    /// Notify the target with this immediate once all data is placed.
    pub notify: Option<u64>,
    /// Start only after every earlier operation completed.
    pub fence_before: bool,
    /// Later operations start only after this one completed.
    pub fence_after: bool,
    /// Take effect at the target only after every operation submitted before it has: the
    /// target holds it until every frame sent before its own has arrived. An order without the
    /// round trip a `fence_before` waits for (a signal behind its data). Only for writes of at
    /// most [`crate::ORDERED_WRITE_BYTES_MAX`] bytes and atomics.
    pub ordered: bool,
}

/// A 64-bit atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Store `new` if the word equals `expected`.
    CompareSwap {
        /// Expected value.
        expected: u64,
        /// Value to store.
        new: u64,
    },
    /// Add, wrapping.
    FetchAdd(u64),
}

/// What a completed operation yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Write or message placed.
    Done,
    /// Read data.
    Data(Vec<u8>),
    /// An atomic's old value.
    Value(u64),
}

/// Why an operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// The target refused it.
    #[error("refused by the target: {0:?}")]
    Refused(Refusal),
    /// It did not complete within the operation timeout.
    #[error("timed out")]
    Timeout,
    /// The connection closed (peer gone, all links dead, closed locally).
    #[error("connection closed")]
    Closed,
    /// Too large, or a limit reached; nothing was sent.
    #[error("operation too large or limit reached")]
    Limit,
    /// The connection is not established yet.
    #[error("connection not established")]
    NotConnected,
}

#[derive(Debug)]
pub(crate) enum Body {
    Write { target: RegionRef, offset: u64, data: Bytes },
    Read { target: RegionRef, offset: u64, len: u64, got: u64, buf: Vec<u8> },
    Atomic { target: RegionRef, offset: u64, op: AtomicOp },
    Msg { data: Bytes, seq: u64 },
}

#[derive(Debug)]
pub(crate) struct Op {
    body: Body,
    flags: OpFlags,
    deadline: Time,
    /// Bytes of the request emitted so far.
    emitted: u64,
    started: bool,
}

impl Op {
    fn request_len(&self) -> u64 {
        match &self.body {
            Body::Write { data, .. } => data.len() as u64,
            Body::Msg { data, .. } => data.len() as u64,
            Body::Read { .. } | Body::Atomic { .. } => 0,
        }
    }

    /// Bytes of its request sent whole, as one segment: the header and the body (a
    /// compare-and-swap's body is its new value).
    fn whole_len(&self) -> u64 {
        let body = match &self.body {
            Body::Atomic { op: AtomicOp::CompareSwap { .. }, .. } => 8,
            _ => self.request_len(),
        };
        SEGMENT_LEN as u64 + body
    }
}

/// The initiator's operations.
#[derive(Debug, Default)]
pub(crate) struct Ops {
    map: crate::OwnIdMap<OpId, Op>,
    /// Not fully emitted yet, in submission order.
    queue: VecDeque<OpId>,
    /// Started and not completed.
    running: usize,
    /// Started, not completed, with a forward fence.
    running_fence_after: usize,
    next_id: OpId,
    next_msg: u64,
    /// Deadlines, for timeouts.
    deadlines: BTreeMap<(Time, OpId), ()>,
    /// Operations the target completed, by kind.
    done: DoneCounts,
}

/// Operations of this end the target completed (refused, timed out and closed ones are not
/// counted), by kind, with their payload bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DoneCounts {
    /// Writes placed (each whole write once, however many frames it took).
    pub writes: u64,
    /// Their payload bytes.
    pub bytes_written: u64,
    /// Of those writes, the ones that raised a notification at the target.
    pub notified: u64,
    /// Reads answered with their data.
    pub reads: u64,
    /// Their bytes.
    pub bytes_read: u64,
    /// Atomics answered with the old value.
    pub atomics: u64,
    /// Messages delivered.
    pub messages: u64,
}

fn flag_bits(f: &OpFlags) -> u8 {
    (if f.notify.is_some() { SEG_NOTIFY } else { 0 })
        | (if f.fence_before { SEG_FENCE_BEFORE } else { 0 })
        | (if f.fence_after { SEG_FENCE_AFTER } else { 0 })
        | (if f.ordered { SEG_ORDERED } else { 0 })
}

impl Ops {
    pub fn submit(&mut self, body: Body, flags: OpFlags, now: Time, timeout: Time) -> Result<OpId, OpError> {
        if self.map.len() >= OPS_MAX {
            return Err(OpError::Limit);
        }
        let body = match body {
            Body::Msg { data, .. } => {
                let seq = self.next_msg;
                self.next_msg += 1;
                Body::Msg { data, seq }
            }
            b => b,
        };
        self.next_id = self.next_id.wrapping_add(1);
        while self.next_id == 0 || self.map.contains_key(&self.next_id) {
            self.next_id = self.next_id.wrapping_add(1);
        }
        let id = self.next_id;
        let deadline = now.saturating_add(timeout);
        self.deadlines.insert((deadline, id), ());
        self.map.insert(id, Op { body, flags, deadline, emitted: 0, started: false });
        self.queue.push_back(id);
        Ok(id)
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether the head of the queue may emit now (fences).
    pub fn can_emit(&self) -> bool {
        let Some(id) = self.queue.front() else { return false };
        let op = &self.map[id];
        op.started || (self.running_fence_after == 0 && !(op.flags.fence_before && self.running > 0))
    }

    /// Operations waiting to send (or to finish sending).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether the last operation submitted has not started and would go whole in a frame
    /// shared with others (see [`crate::chunk::CHAINED_SEGMENT_MAX`]).
    pub fn last_is_small(&self) -> bool {
        let small = |op: &Op| !op.started && op.whole_len() <= crate::chunk::CHAINED_SEGMENT_MAX as u64;
        self.queue.back().and_then(|id| self.map.get(id)).is_some_and(small)
    }

    /// The next operation whole, as one segment, if it has not started, may go now (fences)
    /// and its header and body take at most `room` bytes; otherwise nothing is taken.
    pub fn next_whole(&mut self, room: usize) -> Option<(OpId, SegmentRepr, Option<Bytes>)> {
        let op = self.map.get(self.queue.front()?)?;
        if op.started || op.whole_len() > room as u64 {
            return None;
        }
        self.next_segment(room)
    }

    /// The next request segment: header and body together at most `payload_max` bytes. A
    /// write's fragments after its first carry the short header.
    pub fn next_segment(&mut self, payload_max: usize) -> Option<(OpId, SegmentRepr, Option<Bytes>)> {
        if !self.can_emit() {
            return None;
        }
        let id = *self.queue.front()?;
        let op = self.map.get_mut(&id).expect("queued ops exist");
        // An ordered operation goes whole (the target acts on it as one segment): it waits for
        // a frame with room for it.
        if !op.started && op.flags.ordered && op.whole_len() > payload_max as u64 {
            return None;
        }
        if !op.started {
            op.started = true;
            self.running += 1;
            if op.flags.fence_after {
                self.running_fence_after += 1;
            }
        }
        let total = op.request_len();
        let frag_off = op.emitted;
        let more = frag_off > 0 && matches!(op.body, Body::Write { .. });
        let header = if more { SEGMENT_SHORT_LEN } else { SEGMENT_LEN };
        let take = (total - op.emitted).min(payload_max.saturating_sub(header) as u64);
        let mut seg = SegmentRepr {
            op: id,
            kind: SegKind::Write,
            flags: flag_bits(&op.flags),
            reason: 0,
            region: 0,
            frag_off: frag_off as u32,
            offset: 0,
            op_len: total as u32,
            key: 0,
            imm: op.flags.notify.unwrap_or(0),
        };
        let mut body: Option<Bytes> = None;
        let range = frag_off as usize..(frag_off + take) as usize;
        match &op.body {
            Body::Write { data, .. } if more => {
                seg = SegmentRepr { kind: SegKind::WriteMore, flags: 0, imm: 0, op_len: 0, ..seg };
                body = Some(data.slice(range.clone()));
            }
            Body::Write { target, offset, data } => {
                seg.region = target.region;
                seg.key = target.key;
                seg.offset = *offset;
                body = Some(data.slice(range.clone()));
            }
            Body::Read { target, offset, len, .. } => {
                seg.kind = SegKind::ReadReq;
                seg.region = target.region;
                seg.key = target.key;
                seg.offset = *offset;
                seg.op_len = *len as u32;
            }
            Body::Atomic { target, offset, op: a } => {
                seg.region = target.region;
                seg.key = target.key;
                seg.offset = *offset;
                match a {
                    AtomicOp::CompareSwap { expected, new } => {
                        seg.kind = SegKind::Cas;
                        seg.imm = *expected;
                        body = Some(Bytes::copy_from_slice(&new.to_be_bytes()));
                        seg.op_len = 8;
                    }
                    AtomicOp::FetchAdd(add) => {
                        seg.kind = SegKind::Fadd;
                        seg.imm = *add;
                    }
                }
                // The notification immediate of an atomic is not carried (imm holds the operand).
                seg.flags &= !SEG_NOTIFY;
            }
            Body::Msg { data, seq } => {
                seg.kind = SegKind::Msg;
                seg.imm = *seq;
                seg.flags = 0;
                body = Some(data.slice(range.clone()));
            }
        }
        op.emitted += take;
        if op.emitted >= total {
            self.queue.pop_front();
        }
        Some((id, seg, body))
    }

    fn finish(&mut self, id: OpId) -> Option<Op> {
        let op = self.map.remove(&id)?;
        self.deadlines.remove(&(op.deadline, id));
        self.queue.retain(|q| *q != id);
        if op.started {
            self.running -= 1;
            if op.flags.fence_after {
                self.running_fence_after -= 1;
            }
        }
        Some(op)
    }

    /// The target answered `Done` (with `imm`: an atomic's old value).
    pub fn on_done(&mut self, id: OpId, imm: u64) -> Option<Result<Completion, OpError>> {
        match self.map.get(&id)?.body {
            Body::Read { .. } => return None, // reads complete by their data
            Body::Write { .. } | Body::Msg { .. } | Body::Atomic { .. } => {}
        }
        let op = self.finish(id)?;
        let d = &mut self.done;
        Some(Ok(match op.body {
            Body::Atomic { .. } => {
                d.atomics += 1;
                Completion::Value(imm)
            }
            Body::Write { data, .. } => {
                d.writes += 1;
                d.bytes_written += data.len() as u64;
                d.notified += u64::from(op.flags.notify.is_some());
                Completion::Done
            }
            Body::Msg { .. } => {
                d.messages += 1;
                Completion::Done
            }
            // Not reached: a read completes by its data (above).
            Body::Read { .. } => Completion::Done,
        }))
    }

    /// Operations the target completed so far.
    pub fn done(&self) -> DoneCounts {
        self.done
    }

    pub fn on_refused(&mut self, id: OpId, why: Refusal) -> Option<Result<Completion, OpError>> {
        self.finish(id)?;
        Some(Err(OpError::Refused(why)))
    }

    /// A fragment of read data arrived; completes the read when it is whole.
    pub fn on_read_data(&mut self, id: OpId, frag_off: u64, data: &[u8]) -> Option<Result<Completion, OpError>> {
        let op = self.map.get_mut(&id)?;
        let Body::Read { len, got, buf, .. } = &mut op.body else { return None };
        let end = frag_off.checked_add(data.len() as u64)?;
        if end > *len {
            return None;
        }
        if buf.is_empty() && *len > 0 {
            buf.resize(*len as usize, 0);
        }
        buf[frag_off as usize..end as usize].copy_from_slice(data);
        *got += data.len() as u64;
        if *got < *len {
            return None;
        }
        let op = self.finish(id)?;
        let Body::Read { buf, .. } = op.body else { unreachable!("checked above") };
        self.done.reads += 1;
        self.done.bytes_read += buf.len() as u64;
        Some(Ok(Completion::Data(buf)))
    }

    /// Operations past their deadline, removed.
    pub fn expire(&mut self, now: Time) -> Vec<OpId> {
        let due: Vec<OpId> = self.deadlines.range(..(now.saturating_add(1), 0)).map(|(&(_, id), _)| id).collect();
        for id in &due {
            self.finish(*id);
        }
        due
    }

    pub fn next_deadline(&self) -> Option<Time> {
        self.deadlines.keys().next().map(|&(t, _)| t)
    }

    /// Every operation, removed (the connection closed).
    pub fn drain(&mut self) -> Vec<OpId> {
        let ids: Vec<OpId> = self.map.keys().copied().collect();
        for id in &ids {
            self.finish(*id);
        }
        ids
    }
}

/// One operation arriving at the target.
#[derive(Debug)]
struct Incoming {
    seen: u64,
    refused: Option<Refusal>,
    notify: Option<u64>,
    at: Placement,
}

/// Where a write's fragments go, as its first fragment said.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    pub region: u32,
    pub key: u128,
    pub offset: u64,
    pub op_len: u64,
}

/// A later write fragment that arrived before its operation's first: kept (copied) until the
/// first arrives.
#[derive(Debug)]
struct Stashed {
    seq: u64,
    frag_off: u32,
    data: Vec<u8>,
}

/// A message being reassembled.
#[derive(Debug)]
struct Assembly {
    op: OpId,
    buf: Vec<u8>,
    seen: u64,
    /// Refused (already answered): skipped when its turn comes, so later messages still go.
    refused: bool,
}

/// Messages now deliverable, in order, each with the operation to acknowledge.
pub(crate) type Delivered = Vec<(OpId, Vec<u8>)>;

/// What the target learned from a write fragment.
pub(crate) enum WriteOutcome {
    /// More fragments to come.
    Partial,
    /// The operation is complete: answer with this; notify if asked.
    Complete { refused: Option<Refusal>, notify: Option<(u32, u64, u64, u64)> },
}

/// The target's operations in progress, later write fragments waiting for their first, and
/// message reassembly.
#[derive(Debug, Default)]
pub(crate) struct Incomings {
    map: HashMap<OpId, Incoming>,
    stash: HashMap<OpId, Vec<Stashed>>,
    stash_bytes: usize,
    /// The lowest sequence number stashed.
    stash_low: u64,
    msgs: BTreeMap<u64, Assembly>,
    next_msg: u64,
}

impl Incomings {
    /// A write's first fragment arrived (`s`, a full header): from now on its later fragments
    /// can be placed.
    pub fn begin_write(&mut self, s: &SegmentRepr) {
        self.map.entry(s.op).or_insert_with(|| Incoming {
            seen: 0,
            refused: None,
            notify: (s.flags & SEG_NOTIFY != 0).then_some(s.imm),
            at: Placement { region: s.region, key: s.key, offset: s.offset, op_len: s.op_len as u64 },
        });
    }

    /// Where a write in progress places its fragments, unless it was refused already.
    pub fn placement(&self, op: OpId) -> Option<Result<Placement, Refusal>> {
        self.map.get(&op).map(|e| match e.refused {
            Some(r) => Err(r),
            None => Ok(e.at),
        })
    }

    /// Account a fragment of `len` bytes of a write in progress (`result`: what the target did
    /// with it).
    pub fn write_fragment(&mut self, op: OpId, len: u64, result: Result<(), Refusal>) -> WriteOutcome {
        let Some(e) = self.map.get_mut(&op) else { return WriteOutcome::Partial };
        e.seen += len;
        if let Err(r) = result {
            e.refused.get_or_insert(r);
        }
        if e.seen < e.at.op_len {
            return WriteOutcome::Partial;
        }
        let e = self.map.remove(&op).expect("present");
        let notify =
            if e.refused.is_none() { e.notify.map(|imm| (e.at.region, e.at.offset, e.at.op_len, imm)) } else { None };
        WriteOutcome::Complete { refused: e.refused, notify }
    }

    /// Keep a copy of a later fragment (frame `seq`) whose operation's first fragment has not
    /// arrived. False when [`STASH_BYTES_MAX`] would be passed: the frame should then be
    /// dropped unacknowledged (it is sent again).
    pub fn stash(&mut self, op: OpId, seq: u64, frag_off: u32, data: &[u8]) -> bool {
        if self.stash_bytes + data.len() > STASH_BYTES_MAX {
            return false;
        }
        if self.stash.is_empty() || seq < self.stash_low {
            self.stash_low = seq;
        }
        self.stash_bytes += data.len();
        self.stash.entry(op).or_default().push(Stashed { seq, frag_off, data: data.to_vec() });
        true
    }

    /// The fragments stashed for `op`, taken out: (fragment offset, bytes).
    pub fn unstash(&mut self, op: OpId) -> Vec<(u32, Vec<u8>)> {
        let Some(v) = self.stash.remove(&op) else { return Vec::new() };
        self.stash_bytes -= v.iter().map(|f| f.data.len()).sum::<usize>();
        v.into_iter().map(|f| (f.frag_off, f.data)).collect()
    }

    /// Every frame below `next` has arrived, so a stashed fragment below it whose first
    /// fragment never came has none coming (a first fragment is always sent before its
    /// operation's later ones): such fragments are dropped. Their count.
    pub fn drop_orphans(&mut self, next: u64) -> usize {
        if self.stash.is_empty() || next <= self.stash_low {
            return 0;
        }
        let mut dropped = 0;
        let mut low = u64::MAX;
        let mut freed = 0;
        self.stash.retain(|_, v| {
            v.retain(|f| {
                if f.seq < next {
                    dropped += 1;
                    freed += f.data.len();
                    false
                } else {
                    low = low.min(f.seq);
                    true
                }
            });
            !v.is_empty()
        });
        self.stash_bytes -= freed;
        self.stash_low = low;
        dropped
    }

    /// Operations tracked (bounded by the window).
    /// Bytes of early fragments kept (at most [`STASH_BYTES_MAX`]).
    pub fn stashed_bytes(&self) -> usize {
        self.stash_bytes
    }

    pub fn len(&self) -> usize {
        self.map.len() + self.msgs.len()
    }

    /// No write in progress and no later fragment waiting for its first.
    pub fn no_writes(&self) -> bool {
        self.map.is_empty() && self.stash.is_empty()
    }

    /// Account a message fragment; returns the messages now deliverable, in order, each with
    /// the op to acknowledge, or the op to refuse.
    pub fn msg_fragment(&mut self, s: &SegmentRepr, body: &[u8]) -> Result<Delivered, (OpId, Refusal)> {
        if s.imm < self.next_msg {
            return Ok(Vec::new());
        }
        // Messages are numbered in order and a sender has at most a window of frames in
        // flight, so one numbered a window or more ahead of the next expected is not an
        // honest one: refused without opening an assembly (the open ones stay bounded by
        // [`MESSAGES_OPEN_MAX`], each by the message limit).
        if s.imm - self.next_msg >= MESSAGES_OPEN_MAX {
            return Err((s.op, Refusal::TooLarge));
        }
        let refuse = |me: &mut Self, why: Refusal| {
            let a =
                me.msgs.entry(s.imm).or_insert_with(|| Assembly { op: s.op, buf: Vec::new(), seen: 0, refused: false });
            let first = !a.refused;
            a.refused = true;
            a.buf = Vec::new();
            if first {
                Err((s.op, why))
            } else {
                Ok(Vec::new())
            }
        };
        if s.op_len as usize > MESSAGE_BYTES_MAX {
            return refuse(self, Refusal::TooLarge);
        }
        // The usual case: the next message, whole in one segment, and no assembly open for it
        // (one holding a part sent before, or refused): handed over as it is, without one.
        if s.imm == self.next_msg
            && s.frag_off == 0
            && body.len() as u64 == u64::from(s.op_len)
            && !self.msgs.contains_key(&s.imm)
        {
            self.next_msg += 1;
            let mut out = vec![(s.op, body.to_vec())];
            self.take_assembled(&mut out);
            return Ok(out);
        }
        let a = self.msgs.entry(s.imm).or_insert_with(|| Assembly {
            op: s.op,
            buf: vec![0u8; s.op_len as usize],
            seen: 0,
            refused: false,
        });
        if a.refused {
            return Ok(Vec::new());
        }
        let start = s.frag_off as usize;
        if start + body.len() > a.buf.len() {
            return refuse(self, Refusal::OutOfBounds { region_len: 0 });
        }
        a.buf[start..start + body.len()].copy_from_slice(body);
        a.seen += body.len() as u64;
        let mut out = Vec::new();
        self.take_assembled(&mut out);
        Ok(out)
    }

    /// Move the messages complete (or refused) from the next expected one on into `out`, in
    /// order.
    fn take_assembled(&mut self, out: &mut Delivered) {
        while let Some(a) = self.msgs.get(&self.next_msg) {
            if !a.refused && a.seen < a.buf.len() as u64 {
                break;
            }
            let a = self.msgs.remove(&self.next_msg).expect("present");
            if !a.refused {
                out.push((a.op, a.buf));
            }
            self.next_msg += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(imm: u64, op: OpId, len: u32) -> SegmentRepr {
        SegmentRepr {
            op,
            kind: SegKind::Msg,
            flags: 0,
            reason: 0,
            region: 0,
            frag_off: 0,
            offset: 0,
            op_len: len,
            key: 0,
            imm,
        }
    }

    // Checks the bound on messages being reassembled: a first fragment of a message numbered a
    // window or more ahead of the next expected one is refused and opens nothing (the fuzz
    // case: a peer naming ever new message numbers, each opening a 64 KiB assembly), while
    // ones within the window are assembled and delivered in order.
    #[test]
    fn messages_far_ahead_are_refused_without_an_assembly() {
        let mut inc = Incomings::default();
        let far = msg(MESSAGES_OPEN_MAX, 7, 64 * 1024);
        assert_eq!(inc.msg_fragment(&far, &[0; 8]), Err((7, Refusal::TooLarge)));
        assert!(inc.msgs.is_empty(), "no assembly opened");
        // Within the window: message 1 waits for message 0, then both come out in order.
        assert_eq!(inc.msg_fragment(&msg(1, 2, 3), b"two"), Ok(Vec::new()));
        let out = inc.msg_fragment(&msg(0, 1, 3), b"one").unwrap();
        assert_eq!(out, vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
        assert!(inc.msgs.is_empty());
    }

    // Checks the path for a next message whole in one segment (no assembly opened): it comes
    // out at once, with the complete ones queued behind it; a copy of it later is ignored; a
    // message whose first part opened an assembly is finished by that assembly even when a
    // whole copy follows (delivered once, nothing left open); and a refused one stays refused
    // (its whole copy is not delivered).
    #[test]
    fn a_whole_next_message_skips_the_assembly_but_never_doubles_one() {
        let mut inc = Incomings::default();
        assert_eq!(inc.msg_fragment(&msg(0, 1, 3), b"one").unwrap(), vec![(1, b"one".to_vec())]);
        assert!(inc.msgs.is_empty(), "no assembly for a whole next message");
        assert_eq!(inc.msg_fragment(&msg(0, 1, 3), b"one"), Ok(Vec::new()), "a copy is ignored");
        // Message 2 waits (1 is missing); 1 arrives whole and both come out, in order.
        assert_eq!(inc.msg_fragment(&msg(2, 3, 5), b"three"), Ok(Vec::new()));
        let out = inc.msg_fragment(&msg(1, 2, 3), b"two").unwrap();
        assert_eq!(out, vec![(2, b"two".to_vec()), (3, b"three".to_vec())]);
        // Message 3: its first half opens an assembly; a whole copy then completes that one.
        let mut half = msg(3, 4, 4);
        assert_eq!(inc.msg_fragment(&half, b"fo"), Ok(Vec::new()));
        assert_eq!(inc.msg_fragment(&msg(3, 4, 4), b"four").unwrap(), vec![(4, b"four".to_vec())]);
        half.frag_off = 2;
        assert_eq!(inc.msg_fragment(&half, b"ur"), Ok(Vec::new()), "a late part of a delivered message");
        assert!(inc.msgs.is_empty(), "nothing left open");
        // Message 4 is refused (a part past its end); a whole copy after is not delivered.
        let mut bad = msg(4, 5, 2);
        bad.frag_off = 1;
        assert_eq!(inc.msg_fragment(&bad, b"xyz"), Err((5, Refusal::OutOfBounds { region_len: 0 })));
        assert_eq!(inc.msg_fragment(&msg(4, 5, 2), b"ok"), Ok(Vec::new()));
        assert_eq!(inc.msg_fragment(&msg(5, 6, 3), b"six").unwrap(), vec![(6, b"six".to_vec())]);
    }
}
