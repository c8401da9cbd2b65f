//! A connection over the edge transport as the public API sees it: operations submitted to
//! the endpoint, their outcomes turned into the API's errors.

use super::{
    lock, notification, proto, Access, Arc, AtomicU64, BatchOptions, Bytes, Completion, ConnStats, Connection,
    Duration, EdgeEndpoint, Error, NodeId, Notification, Op, OpCell, OpError, OpFlags, Ordering, PeerTransport,
    Pending, RegionId, RemoteRegion, Signal, SignalOp, SocketAddr, State,
};
use crate::error::RefusedOp;
use crate::Limit;

pub(super) fn completion(
    peer: NodeId,
    p: &Pending,
    r: Result<proto::Completion, OpError>,
) -> Result<Completion, Error> {
    match r {
        Ok(proto::Completion::Done) => Ok(Completion::Done),
        Ok(proto::Completion::Data(d)) => Ok(Completion::Data(d)),
        Ok(proto::Completion::Value(v)) => Ok(Completion::Value(v)),
        Err(OpError::Refused(why)) => {
            let op = RefusedOp { node: peer, region: p.region, offset: p.offset, len: p.len, need: p.need };
            Err(Error::refused(why, &op))
        }
        Err(OpError::Timeout) => Err(Error::Timeout),
        Err(OpError::Closed | OpError::NotConnected) => Err(Error::PeerGone(peer)),
        Err(OpError::Limit) => Err(Error::Limit(Limit::EdgeOperations)),
    }
}

/// What an operation will touch at the target, kept to turn a refusal into its error.
struct Planned {
    region: RegionId,
    offset: u64,
    len: u64,
    need: Access,
}

/// A connection over the edge transport, as the public API sees it.
pub(crate) struct EdgePeer {
    pub(super) ep: Arc<EdgeEndpoint>,
    pub(super) local: u32,
    pub(super) peer: NodeId,
    /// Liveness as last looked up: the endpoint's count of closings then, times two, plus one
    /// if alive ([`LIVENESS_UNKNOWN`] before the first look).
    liveness: AtomicU64,
}

/// [`EdgePeer::liveness`] before it was first looked up.
const LIVENESS_UNKNOWN: u64 = u64::MAX;

/// `len` bytes at `offset` lie inside the region as its handle announces it.
pub(super) fn fits(t: &RemoteRegion, offset: u64, len: usize) -> Result<(), Error> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= t.len => Ok(()),
        _ => Err(Error::OutOfBounds { region: t.region, offset, len: len as u64, region_len: t.len }),
    }
}

pub(super) fn flags(f: OpFlags) -> proto::OpFlags {
    proto::OpFlags { notify: f.notify, fence_before: f.fence_before, fence_after: f.fence_after, ordered: false }
}

impl EdgePeer {
    fn submit(
        &self,
        region: RegionId,
        offset: u64,
        len: u64,
        need: Access,
        go: impl FnOnce(&mut Connection, proto::Time) -> Result<proto::OpId, OpError>,
    ) -> Op {
        let mut st = lock(&self.ep.state);
        let now = self.ep.now();
        match self.enqueue(&mut st, now, Planned { region, offset, len, need }, go) {
            Ok(op) => {
                self.send_or_gather(&mut st, now);
                op
            }
            Err(e) => Op::ready(Err(e)),
        }
    }

    /// Queue one operation on the connection (the state's lock held): its handle, pending, or
    /// why it was refused (nothing queued then).
    fn enqueue(
        &self,
        st: &mut State,
        now: proto::Time,
        p: Planned,
        go: impl FnOnce(&mut Connection, proto::Time) -> Result<proto::OpId, OpError>,
    ) -> Result<Op, Error> {
        let cell = Arc::new(OpCell::with_driver(self.ep.clone(), self.ep.busy_poll));
        self.ep.hand.busy(now);
        let p = Pending { cell: cell.clone(), region: p.region, offset: p.offset, len: p.len, need: p.need };
        match st.conns.submit(self.local, |_| p, |c| go(c, now)) {
            Ok(_) => Ok(Op::pending(cell)),
            Err(OpError::Limit) => Err(Error::Limit(Limit::EdgeOperations)),
            Err(_) => Err(Error::PeerGone(self.peer)),
        }
    }

    /// After operations were queued (the state's lock held): send what the windows allow now,
    /// from this thread, instead of handing the operations to the network thread: no wake-up
    /// on the way out. But a small operation submitted while frames are in flight is left for
    /// whoever drives the endpoint next, which sends the operations gathered meanwhile several
    /// to a frame (one system call, and one for the peer, instead of one each): a thread that
    /// polls (most likely this one, waiting for its operations; one that stops to sleep hands
    /// over to the network thread at once), or the network thread when it is at work. A
    /// network thread that sleeps, or only looks in now and then, gets it sent inline.
    fn send_or_gather(&self, st: &mut State, now: proto::Time) {
        let worth = st.conns.get(self.local).is_some_and(|s| s.conn().worth_gathering());
        if st.rounds.submitted(&self.ep.hand, now, worth) {
            self.ep.transmit_here(st, now);
        }
        // Wake the network thread only if this connection now needs it before it would wake
        // anyway (a timer armed by the new frames, or frames the windows held back).
        let due = st.conns.get(self.local).and_then(|s| s.conn().poll_timeout());
        if st.rounds.armed(&self.ep.hand, due) {
            self.ep.waker.wake();
        }
    }

    fn atomic(&self, t: &RemoteRegion, offset: u64, op: proto::AtomicOp, f: proto::OpFlags) -> Op {
        if !offset.is_multiple_of(8) {
            return Op::ready(Err(Error::Misaligned { offset }));
        }
        let r = match self.check(t) {
            Ok(r) => r,
            Err(e) => return Op::ready(Err(e)),
        };
        self.submit(t.region, offset, 8, Access::ATOMIC, |c, now| c.atomic(now, r, offset, op, f))
    }

    /// Something queued for the application (a message, a notification), driving the endpoint
    /// first only when nothing is queued yet: what an earlier round queued is handed over
    /// without another round (which would also send the answers held for the reply).
    /// Nor when some thread drove it within the last microsecond: a receiver looking at many
    /// peers of one endpoint drives it once per look, not once per peer. Nor when the
    /// transport has been quiet (see [`QUIET_AFTER_US`]): its network thread reads then.
    fn take<T>(&self, mut f: impl FnMut(&mut proto::Session<SocketAddr, Pending>) -> Option<T>) -> Option<T> {
        let mut st = lock(&self.ep.state);
        if let Some(v) = st.conns.get_mut(self.local).and_then(&mut f) {
            return Some(v);
        }
        let now = self.ep.now();
        if self.ep.hand.polled_at(now) || !self.ep.app_may_round(now) {
            return None;
        }
        self.ep.pump_locked(&mut st, now);
        let got = st.conns.get_mut(self.local).and_then(f);
        drop(st);
        self.ep.hand_over();
        got
    }

    /// `msg` as a datagram, out at once from this thread (a datagram is not held to share a
    /// frame) or, with `hold`, held for the datagrams that follow (see
    /// [`EdgeEndpoint::send_datagram_here`]). A connection that is gone: `Closed`, below.
    fn datagram(&self, msg: &[u8], hold: bool) -> Result<(), Error> {
        let mut st = lock(&self.ep.state);
        let now = self.ep.now();
        let sent = self.ep.send_datagram_here(&mut st, self.local, now, msg, &mut lock(&self.ep.app_io), hold);
        match sent {
            Ok(()) => {
                self.ep.hand.busy(now);
                Ok(())
            }
            Err(OpError::Limit) => {
                // Which limit: the frame's room (the largest datagram) or the queue's.
                let max = st.conns.get(self.local).map_or(usize::MAX, |s| s.conn().datagram_max());
                if msg.len() > max {
                    Err(Error::MessageTooLarge { len: msg.len(), max })
                } else {
                    Err(Error::Limit(Limit::DatagramQueue))
                }
            }
            Err(OpError::NotConnected) => Err(Error::Limit(Limit::NotEstablished)),
            Err(_) => Err(Error::PeerGone(self.peer)),
        }
    }

    fn check(&self, t: &RemoteRegion) -> Result<proto::RegionRef, Error> {
        if t.node != self.peer {
            return Err(Error::UnknownPeer(t.node));
        }
        Ok(proto::RegionRef { region: t.region, key: t.key })
    }
}

impl PeerTransport for EdgePeer {
    fn peer(&self) -> NodeId {
        self.peer
    }

    fn kind(&self) -> &'static str {
        "edge"
    }

    fn is_alive(&self) -> bool {
        // Looked up under the state's lock only when a connection closed since the last look.
        let closings = self.ep.closings.load(Ordering::Acquire);
        let seen = self.liveness.load(Ordering::Relaxed);
        if seen != LIVENESS_UNKNOWN && seen >> 1 == closings {
            return seen & 1 == 1;
        }
        let alive = lock(&self.ep.state).conns.get(self.local).is_some_and(|s| !s.is_closed());
        // With the count read before the look: a closing meanwhile makes the next call look.
        self.liveness.store(closings << 1 | alive as u64, Ordering::Relaxed);
        alive
    }

    fn write(&self, t: &RemoteRegion, offset: u64, data: &[u8], f: OpFlags) -> Op {
        let r = match self.check(t) {
            Ok(r) => r,
            Err(e) => return Op::ready(Err(e)),
        };
        self.submit(t.region, offset, data.len() as u64, Access::WRITE, |c, now| {
            c.write(now, r, offset, data, flags(f))
        })
    }

    fn write_bytes(&self, t: &RemoteRegion, offset: u64, data: Bytes, f: OpFlags) -> Op {
        let r = match self.check(t) {
            Ok(r) => r,
            Err(e) => return Op::ready(Err(e)),
        };
        let len = data.len() as u64;
        self.submit(t.region, offset, len, Access::WRITE, |c, now| c.write_bytes(now, r, offset, data, flags(f)))
    }

    fn write_batch(&self, t: &RemoteRegion, entries: &[(u64, &[u8])], f: OpFlags, _opts: BatchOptions) -> Op {
        // All or nothing: an entry past the region's announced end refuses the whole batch here,
        // before any entry is sent (the target still checks every frame).
        if let Some(e) = entries.iter().find_map(|(off, d)| fits(t, *off, d.len()).err()) {
            return Op::ready(Err(e));
        }
        // One write per entry, all in flight together; the last carries the notification and a
        // backward fence, so it is placed (and notifies) only after every other entry was.
        let n = entries.len();
        let ops: Vec<Op> = entries
            .iter()
            .enumerate()
            .map(|(i, (off, d))| {
                let last = i + 1 == n;
                let fl = OpFlags {
                    notify: if last { f.notify } else { None },
                    fence_before: (f.fence_before && i == 0) || (last && f.notify.is_some() && n > 1),
                    fence_after: f.fence_after && last,
                };
                self.write(t, *off, d, fl)
            })
            .collect();
        let mut result = Ok(Completion::Done);
        for op in ops {
            if let Err(e) = op.wait() {
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        Op::ready(result)
    }

    fn write_signal(&self, t: &RemoteRegion, offset: u64, data: &[u8], signal: Signal, f: OpFlags) -> Op {
        // Refused here, before anything is sent, when the data cannot fit (the target still
        // checks every frame): a signal for data that was never placed would mislead.
        if let Err(e) = fits(t, offset, data.len()) {
            return Op::ready(Err(e));
        }
        let r = match self.check(t) {
            Ok(r) => r,
            Err(e) => return Op::ready(Err(e)),
        };
        // Both queued together and sent at once, so a small piece and its signal share a
        // frame. The update is ordered: the target applies it only after the data and every
        // earlier operation of this connection (no round trip waits for the data's answer). A
        // `Set` is an aligned 8-byte write, which the target places with one store.
        // Data refused at submission sends no signal either (it would stand for data that
        // never went).
        let mut st = lock(&self.ep.state);
        let now = self.ep.now();
        let first = if data.is_empty() {
            None
        } else {
            let fl = flags(OpFlags { notify: None, fence_after: false, ..f });
            let p = Planned { region: t.region, offset, len: data.len() as u64, need: Access::WRITE };
            match self.enqueue(&mut st, now, p, |c, now| c.write(now, r, offset, data, fl)) {
                Ok(op) => Some(op),
                Err(e) => return Op::ready(Err(e)),
            }
        };
        let fl = proto::OpFlags { ordered: true, fence_before: f.fence_before && first.is_none(), ..flags(f) };
        let p = |need| Planned { region: t.region, offset: signal.offset, len: 8, need };
        let update = match signal.op {
            SignalOp::Set(v) => self
                .enqueue(&mut st, now, p(Access::WRITE), |c, now| c.write(now, r, signal.offset, &v.to_le_bytes(), fl)),
            SignalOp::Add(v) => self.enqueue(&mut st, now, p(Access::ATOMIC), |c, now| {
                c.atomic(now, r, signal.offset, proto::AtomicOp::FetchAdd(v), fl)
            }),
        };
        self.send_or_gather(&mut st, now);
        drop(st);
        let update = update.unwrap_or_else(|e| Op::ready(Err(e)));
        match first {
            Some(op) => op.then(update),
            None => update,
        }
    }

    fn read(&self, t: &RemoteRegion, offset: u64, len: u64, f: OpFlags) -> Op {
        let r = match self.check(t) {
            Ok(r) => r,
            Err(e) => return Op::ready(Err(e)),
        };
        self.submit(t.region, offset, len, Access::READ, |c, now| c.read(now, r, offset, len, flags(f)))
    }

    fn compare_swap(&self, t: &RemoteRegion, offset: u64, expected: u64, new: u64, f: OpFlags) -> Op {
        self.atomic(t, offset, proto::AtomicOp::CompareSwap { expected, new }, flags(f))
    }

    fn fetch_add(&self, t: &RemoteRegion, offset: u64, add: u64, f: OpFlags) -> Op {
        self.atomic(t, offset, proto::AtomicOp::FetchAdd(add), flags(f))
    }

    fn send(&self, msg: &[u8]) -> Op {
        self.submit(0, 0, msg.len() as u64, Access::NONE, |c, now| c.send(now, msg, proto::OpFlags::default()))
    }

    fn send_datagram(&self, msg: &[u8]) -> Result<(), Error> {
        self.datagram(msg, false)
    }

    fn send_datagram_more(&self, msg: &[u8]) -> Result<(), Error> {
        self.datagram(msg, true)
    }

    fn send_held(&self) {
        self.ep.send_held();
    }
    fn try_recv(&self, out: &mut Vec<u8>) -> Result<bool, Error> {
        // With an edge message handler set, every message goes to it as it arrives and none
        // waits here: driving the transport to look would only take its state's lock from
        // the threads that send (a virtual NIC's receiving thread, waiting for messages over
        // shared memory, did so after every wake-up).
        if self.ep.hands_messages_over() {
            return Ok(false);
        }
        match self.take(proto::Session::next_message) {
            Some(m) => {
                *out = m;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn try_notification(&self) -> Result<Option<Notification>, Error> {
        Ok(self.take(proto::Session::next_note).map(|n| notification(self.peer, n)))
    }

    /// Delivered messages or notifications wait to be taken (a waiter about to sleep looks
    /// here after arming its doorbell: what the network thread delivered before that rang no
    /// bell). Without waiting for the state: a thread that holds it is pumping, and rings the
    /// doorbell for what it hands over (a relay's waits, many a second, must not queue on it).
    fn unread(&self) -> bool {
        let st = match self.ep.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::WouldBlock) => return false,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        };
        st.conns.get(self.local).is_some_and(|s| !s.nothing_to_take())
    }

    fn unmap(&self, _region: RegionId, _timeout: Duration) -> bool {
        // Nothing is mapped: every frame is checked against the grant table as it arrives.
        true
    }

    fn cut_off(&self) {
        {
            let mut st = lock(&self.ep.state);
            let now = self.ep.now();
            if let Some(s) = st.conns.get_mut(self.local) {
                s.conn_mut().close(now);
            }
            self.ep.closings.fetch_add(1, Ordering::Release);
            st.rounds.touch();
        }
        self.ep.waker.wake();
    }

    fn stats(&self) -> ConnStats {
        let st = lock(&self.ep.state);
        let Some(s) = st.conns.get(self.local) else { return ConnStats::default() };
        let p = s.conn().stats();
        ConnStats {
            writes: p.writes,
            reads: p.reads,
            atomics: p.atomics,
            bytes_written: p.bytes_written,
            bytes_read: p.bytes_read,
            messages_sent: p.messages_sent,
            notifications_sent: p.notifications_sent,
            refused: p.refused,
            shm: None,
            edge: Some(crate::EdgeStats {
                frames_sent: p.frames_sent,
                frames_received: p.frames_received,
                data_frames: p.data_frames,
                retransmits: p.retransmits,
                out_of_order: p.out_of_order,
                held: p.held,
                duplicates: p.duplicates,
                acks_sent: p.acks_sent,
                nacks_sent: p.nacks_sent,
                malformed: p.malformed,
                receiver_full: p.receiver_full,
                losses: p.links.iter().map(|l| l.losses).sum(),
                loss_timeouts: p.links.iter().map(|l| l.timeouts).sum(),
                window_cuts: p.links.iter().map(|l| l.cuts).sum(),
                cuts_undone: p.links.iter().map(|l| l.undone_cuts).sum(),
                frame_max: s.conn().agreed_frame_max() as u64,
                path_frame_max: p.path_frame_max,
                sealed: s.conn().sealed(),
                forged: p.forged,
                replayed: p.replayed,
                unsealed: p.unsealed,
                unproven: p.unproven,
                retries: p.retries,
                datagrams_sent: p.datagrams_sent,
                datagrams_received: p.datagrams_received,
                datagrams_dropped: p.datagrams_dropped,
                conn_id: self.local,
            }),
        }
    }

    fn link_stats(&self) -> Vec<proto::LinkStats> {
        self.links()
    }
}

impl EdgePeer {
    pub(super) fn new(ep: Arc<EdgeEndpoint>, local: u32, peer: NodeId) -> EdgePeer {
        EdgePeer { ep, local, peer, liveness: AtomicU64::new(LIVENESS_UNKNOWN) }
    }

    pub(super) fn links(&self) -> Vec<proto::LinkStats> {
        let st = lock(&self.ep.state);
        st.conns.get(self.local).map(|s| s.conn().stats().links).unwrap_or_default()
    }
}

impl Drop for EdgePeer {
    fn drop(&mut self) {
        // The fabric's table holds the other reference of a registered peer; once the last
        // handle of a closed connection goes, forget its slot.
        if let Ok(mut st) = self.ep.state.try_lock() {
            if st.conns.get(self.local).is_some_and(|s| s.is_closed()) {
                st.conns.remove(self.local);
                st.side.gone_asked.remove(&self.local);
            }
        }
    }
}
