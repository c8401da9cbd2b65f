//! Point-to-point transfers between the ranks of a group, over one-sided writes into each
//! rank's window.
//!
//! # The window
//!
//! Each rank owns one region, its window, granted to every other rank. For a group of `n`
//! ranks, with `R` = [`HEADS_PER_PEER`], `S` = [`SLOTS_PER_PEER`], `B` the slot size and
//! `E` = [`HEAD_BYTES`]:
//!
//! ```text
//! offset 64·dst                  consumed[dst]  pieces rank dst took of those this rank placed
//!                                               there (dst updates it here)
//! offset H + (src·R + k)·E       head k of rank src: the number of the piece it announces (8
//!                                bytes), then the piece itself if it is small (inline)
//! offset C + (src·S + k)·B       slot k of rank src, for pieces that are not inline
//! ```
//!
//! (`H` and `C` are the ends of the areas before them, page-rounded.) Each counter has a
//! cache line of its own, so two ranks updating neighbouring counters do not fight over one
//! line.
//!
//! # One piece
//!
//! The `p`-th piece (from 1) a rank sends to `dst` is announced in head `(p - 1) mod R` of its
//! share of `dst`'s window; a piece larger than [`INLINE_BYTES`], the `q`-th such, travels in
//! slot `(q - 1) mod S`. It may go once `dst` has taken piece `p - R` (the head is free again)
//! and, for a piece in a slot, the piece that used that slot last (the sender remembers which
//! that was): the sender reads `consumed[dst]` in its *own* window, a local load, and only when
//! the credit it saw last does not cover the piece. It is one write-with-signal: the bytes into
//! the slot (or into the head right after the number), then the number `p` stored into the
//! head. The receiver waits for the head it expects to show `p` (a local load), copies the
//! piece out of its own memory, and gives heads and slots back by updating `consumed[me]` in
//! the sender's window once it has taken `R / 2` pieces, or `S / 2` pieces in slots, since the
//! last update. Pieces are taken in order, so one count frees both. A sender out of heads or
//! out of slots has a full set of them in flight, of which the receiver always gives half
//! back: acknowledging less often cannot stall it.
//!
//! A small piece thus costs one cache line the sender writes and the receiver reads: over
//! shared memory two plain stores, no atomic instruction, and the receiver's one miss brings
//! both the signal and the data; the counter's line moves once every `R / 2` small pieces.
//! The number a head must show is exact (`p`, and a head's next number is `p + R`), so an old
//! piece is never taken for a new one.
//!
//! A transfer of `len` bytes is `max(1, ⌈len / B⌉)` pieces; both ends know `len` (collectives
//! give both sides their counts, as MPI does), so pieces carry no header. A zero-length
//! transfer is one empty piece: a signal.
//!
//! Both ends run every transfer of one step together (`Channels::exchange`): a rank sends
//! what its credit allows to every peer, takes what arrived from every peer, and only then
//! waits, so no rank waits on one peer while another could move.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rackwire::{Access, Conn, Fabric, NodeId, Op, OpFlags, Pinned, Region, RemoteRegion, Signal};

use crate::wait::{Idle, Waiter};
use crate::{
    CollError, HEADS_PER_PEER, OPS_IN_FLIGHT_MAX, SLOTS_PER_PEER, SLOT_BYTES_MAX, SLOT_BYTES_MIN, WINDOW_DATA_BYTES_MAX,
};

/// How long a rank waits for a lower rank's connection before it opens one itself.
const CONNECT_WAIT: Duration = Duration::from_secs(2);
/// How often it looks meanwhile.
const CONNECT_LOOK_EVERY: Duration = Duration::from_micros(500);

/// Bytes of one counter's cache line.
const COUNTER_STRIDE: u64 = 64;
/// Bytes of one head: a piece's number, then room for a small piece.
pub const HEAD_BYTES: usize = 128;
/// The largest piece that travels in its head (in the cache lines of its signal).
pub const INLINE_BYTES: usize = HEAD_BYTES - 8;
/// Pieces a receiver takes from one sender before it gives their heads back.
const ACK_HEADS: u64 = HEADS_PER_PEER as u64 / 2;
/// Pieces in slots a receiver takes from one sender before it gives their slots back.
const ACK_SLOTS: u64 = SLOTS_PER_PEER as u64 / 2;
const _: () = assert!(SLOTS_PER_PEER >= 2 && HEADS_PER_PEER >= SLOTS_PER_PEER && SLOT_BYTES_MIN <= SLOT_BYTES_MAX);

/// The shape of a window for `n` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowLayout {
    /// Where the heads start.
    pub heads: u64,
    /// Where the slots start.
    pub slots: u64,
    /// Bytes of one slot.
    pub slot: usize,
    /// Bytes of the whole window.
    pub len: u64,
}

/// The window of a rank in a group of `n`.
pub fn window_layout(n: usize) -> WindowLayout {
    let heads = (n as u64 * COUNTER_STRIDE).next_multiple_of(4096);
    let slots = heads + ((n * HEADS_PER_PEER * HEAD_BYTES) as u64).next_multiple_of(4096);
    let per_slot = WINDOW_DATA_BYTES_MAX / (n.max(2) * SLOTS_PER_PEER);
    // Whole pages, so slots start page-aligned and copies run at full speed.
    let slot = (per_slot / 4096 * 4096).clamp(SLOT_BYTES_MIN, SLOT_BYTES_MAX);
    WindowLayout { heads, slots, slot, len: slots + (n * SLOTS_PER_PEER * slot) as u64 }
}

/// One send of a step: `data` to rank `to`.
pub(crate) struct SendSpec<'a> {
    pub to: usize,
    pub data: &'a [u8],
    /// Where the data goes instead of the receiver's slots: a region of the receiver's and an
    /// offset in it, which the receiver named. The transfer is then one write of the whole
    /// block straight into place, and one empty piece (a signal) ordered behind it; the
    /// receiver takes it as a transfer of no bytes.
    pub place: Option<(&'a RemoteRegion, u64)>,
}

impl SendSpec<'_> {
    /// Bytes that travel through the receiver's slots.
    fn staged_len(&self) -> usize {
        if self.place.is_some() {
            0
        } else {
            self.data.len()
        }
    }
}

/// One receive of a step: `into.len()` bytes from rank `from`.
pub(crate) struct RecvSpec<'a> {
    pub from: usize,
    pub into: &'a mut [u8],
}

/// A job as the management host knows it: its name and, when its launcher handed the ranks
/// one, its token (see [`rackwire::Fabric::job_post`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct JobKey {
    pub name: String,
    pub token: Option<String>,
}

/// A rank's transfers: its window, the peers' windows and connections, and the counts.
pub(crate) struct Channels {
    pub fabric: Arc<Fabric>,
    pub me: usize,
    pub nodes: Vec<NodeId>,
    pub job: JobKey,
    /// The last bootstrap round (to ask the management host which ranks are down).
    pub mh_round: u64,
    pub timeout: Duration,
    pub oversubscribed: bool,
    window: Region,
    peers: Vec<Option<(Conn, RemoteRegion)>>,
    /// Each peer's window pinned, where it is mapped into this process (shared memory): a
    /// piece is then its stores alone (see [`rackwire::Pinned`]). Dropped at its first
    /// error, after which the connection's calls take over (and report the real state).
    pins: Vec<Option<Pinned>>,
    /// Whether a credit update to each rank may be a plain store (see [`Channels::give_back`]).
    ordered: Vec<bool>,
    layout: WindowLayout,
    /// Pieces sent to each rank.
    sent: Vec<u64>,
    /// Of those, the pieces that went in slots.
    slot_sent: Vec<u64>,
    /// For each rank and each of its slots, the piece that used the slot last (0: none yet).
    slot_piece: Vec<[u64; SLOTS_PER_PEER]>,
    /// The last `consumed` seen of each rank (what it had taken of ours).
    credit: Vec<u64>,
    /// Pieces taken from each rank.
    taken: Vec<u64>,
    /// Of those, the pieces that came in slots.
    slot_taken: Vec<u64>,
    /// Pieces in slots taken from each rank since the sender was last told.
    slot_unacked: Vec<u64>,
    /// Of those, how many the sender was told of.
    acked: Vec<u64>,
    /// Operations whose outcome is not yet seen (over the edge transport): the rank, the
    /// handle, and whether it gives slots back (see [`Channels::track`]).
    in_flight: VecDeque<(usize, Op, bool)>,
    /// An operation went through a connection since the last flush: the transport may hold it
    /// back to share a frame with later ones (see [`rackwire::Fabric::flush`]).
    unflushed: bool,
    scratch: Scratch,
}

/// Per-step bookkeeping, kept between steps so that a step allocates nothing.
#[derive(Default)]
struct Scratch {
    send_first: Vec<u64>,
    send_end: Vec<u64>,
    recv_first: Vec<u64>,
    recv_end: Vec<u64>,
    next: Vec<u64>,
    /// `mark[r] == stamp`: rank `r` was seen in the current look for repeats.
    mark: Vec<u64>,
    stamp: u64,
}

impl Scratch {
    /// True if a rank occurs twice in `ranks`.
    fn any_repeated(&mut self, ranks: impl Iterator<Item = usize>) -> bool {
        self.stamp += 1;
        let mut repeated = false;
        for r in ranks {
            if r >= self.mark.len() {
                self.mark.resize(r + 1, 0);
            }
            repeated |= std::mem::replace(&mut self.mark[r], self.stamp) == self.stamp;
        }
        repeated
    }
}

impl Channels {
    /// Allocate this rank's window (granted to every other rank's node); its handle goes to
    /// the others through the bootstrap.
    pub(crate) fn alloc_window(fabric: &Fabric, nodes: &[NodeId], me: usize) -> Result<Region, CollError> {
        let len = window_layout(nodes.len()).len;
        let region = fabric.alloc(len, Access::READ | Access::WRITE | Access::ATOMIC)?;
        for (r, &node) in nodes.iter().enumerate() {
            if r != me {
                region.grant(node, Access::WRITE | Access::ATOMIC)?;
            }
        }
        Ok(region)
    }

    /// Connect to every other rank, given their windows' handles.
    pub(crate) fn connect(
        fabric: Arc<Fabric>,
        me: usize,
        nodes: Vec<NodeId>,
        window: Region,
        remotes: Vec<RemoteRegion>,
        job: JobKey,
        timeout: Duration,
    ) -> Result<Channels, CollError> {
        let n = nodes.len();
        let layout = window_layout(n);
        let len = layout.len;
        for (r, remote) in remotes.iter().enumerate() {
            if r != me && (remote.node() != nodes[r] || remote.len() != len) {
                return Err(CollError::Config(format!("rank {r} posted a window that is not its own of {len} bytes")));
            }
        }
        // One connection per pair of ranks: the lower rank opens it, the higher takes it (two
        // opened at once would each carry one direction's data, and no answer could ride in a
        // reply). Connections to higher ranks first, so no rank waits on one that waits.
        let mut conns: Vec<Option<Conn>> = (0..n).map(|_| None).collect();
        let gone = |r: usize| {
            move |e| match e {
                rackwire::Error::PeerGone(node) => CollError::RankGone { rank: r, node },
                e => e.into(),
            }
        };
        for r in me + 1..n {
            conns[r] = Some(fabric.connect(nodes[r]).map_err(gone(r))?);
        }
        for r in 0..me {
            let deadline = Instant::now() + CONNECT_WAIT.min(timeout);
            let mut found = fabric.connection_to(nodes[r]);
            while found.is_none() && Instant::now() < deadline {
                std::thread::sleep(CONNECT_LOOK_EVERY);
                found = fabric.connection_to(nodes[r]);
            }
            // Not here in time (a slow peer): open one; it still works, in two halves.
            conns[r] = Some(match found {
                Some(c) => c,
                None => fabric.connect(nodes[r]).map_err(gone(r))?,
            });
        }
        let peers: Vec<Option<(Conn, RemoteRegion)>> =
            conns.into_iter().zip(remotes).map(|(c, remote)| c.map(|c| (c, remote))).collect();
        let ordered = peers.iter().map(|p| p.as_ref().is_some_and(|(c, _)| c.transport() == "shm")).collect();
        let pins = peers
            .iter()
            .map(|p| {
                let (c, remote) = p.as_ref()?;
                (c.transport() == "shm").then(|| c.pin(remote, Access::WRITE | Access::ATOMIC).ok()).flatten()
            })
            .collect();
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        Ok(Channels {
            fabric,
            me,
            nodes,
            job,
            // The windows were exchanged in round 1 of the bootstrap.
            mh_round: 1,
            timeout,
            oversubscribed: n > cores,
            window,
            peers,
            pins,
            ordered,
            layout,
            sent: vec![0; n],
            slot_sent: vec![0; n],
            slot_piece: vec![[0; SLOTS_PER_PEER]; n],
            credit: vec![0; n],
            taken: vec![0; n],
            slot_taken: vec![0; n],
            slot_unacked: vec![0; n],
            acked: vec![0; n],
            in_flight: VecDeque::new(),
            unflushed: false,
            scratch: Scratch::default(),
        })
    }

    /// The connection to rank `r` (none to this rank itself).
    pub(crate) fn conn(&self, r: usize) -> Option<&Conn> {
        self.peers.get(r)?.as_ref().map(|(c, _)| c)
    }

    fn pieces(&self, len: usize) -> u64 {
        len.div_ceil(self.layout.slot).max(1) as u64
    }

    fn consumed_at(r: usize) -> u64 {
        r as u64 * COUNTER_STRIDE
    }

    /// Where the head of piece `piece` from `src` lies.
    fn head_at(&self, src: usize, piece: u64) -> u64 {
        let index = (src * HEADS_PER_PEER) as u64 + (piece - 1) % HEADS_PER_PEER as u64;
        self.layout.heads + index * HEAD_BYTES as u64
    }

    /// Whether a piece of `len` bytes travels in a slot (else in its head).
    fn in_slot(len: usize) -> bool {
        len > INLINE_BYTES
    }

    /// Where piece `piece` of `len` bytes from `src` lies: in its head, or, as the `slot_piece`-th
    /// piece in a slot, in its slot.
    fn data_at(&self, src: usize, piece: u64, slot_piece: u64, len: usize) -> u64 {
        if !Self::in_slot(len) {
            return self.head_at(src, piece) + 8;
        }
        let index = (src * SLOTS_PER_PEER) as u64 + (slot_piece - 1) % SLOTS_PER_PEER as u64;
        self.layout.slots + index * self.layout.slot as u64
    }

    fn load(&self, offset: u64) -> Result<u64, CollError> {
        Ok(self.window.load_u64(offset)?)
    }

    fn gone(&self, r: usize) -> CollError {
        CollError::RankGone { rank: r, node: self.nodes[r] }
    }

    /// Keep an operation's handle until its outcome is known; an outcome known now is looked
    /// at now (over shared memory every operation completes in the call). A `give_back`
    /// operation returns slots to a sender: if that sender is gone it no longer needs them
    /// (it may have left after its last piece), so its loss is not an error here; a rank gone
    /// too early is still seen by whoever waits for it.
    fn track(&mut self, r: usize, mut op: Op, give_back: bool) -> Result<(), CollError> {
        self.unflushed = true;
        match op.poll() {
            Some(r0) => self.outcome(r, r0, give_back),
            None => {
                if self.in_flight.len() >= OPS_IN_FLIGHT_MAX {
                    let (r0, mut oldest, g) = self.in_flight.pop_front().expect("in flight is full");
                    let got = oldest.wait_timeout(self.timeout);
                    self.outcome(r0, got, g)?;
                }
                self.in_flight.push_back((r, op, give_back));
                Ok(())
            }
        }
    }

    fn outcome(
        &self,
        r: usize,
        got: Result<rackwire::Completion, rackwire::Error>,
        give_back: bool,
    ) -> Result<(), CollError> {
        match got {
            Ok(_) => Ok(()),
            Err(rackwire::Error::PeerGone(_)) if give_back => Ok(()),
            Err(rackwire::Error::PeerGone(_)) => Err(self.gone(r)),
            Err(e) => Err(e.into()),
        }
    }

    /// Send what went through a connection since the last flush, if the transport held it.
    fn flush_sent(&mut self) {
        if std::mem::take(&mut self.unflushed) {
            self.fabric.flush();
        }
    }

    /// Look at the operations in flight, oldest first, dropping the finished ones.
    fn reap(&mut self) -> Result<bool, CollError> {
        let mut any = false;
        while let Some((r, op, give_back)) = self.in_flight.front_mut() {
            let (r, give_back) = (*r, *give_back);
            let Some(got) = op.poll() else { break };
            self.outcome(r, got, give_back)?;
            any = true;
            self.in_flight.pop_front();
        }
        Ok(any)
    }

    /// Send piece `sent + 1` of `s` to its rank if its head (and slot) are free. True if it
    /// went.
    fn try_send_piece(&mut self, s: &SendSpec<'_>, first: u64) -> Result<bool, CollError> {
        let to = s.to;
        let p = self.sent[to] + 1;
        let slot = self.layout.slot;
        let idx = (p - first) as usize;
        let data = if s.place.is_some() { &[][..] } else { s.data };
        let lo = (idx * slot).min(data.len());
        let hi = (lo + slot).min(data.len());
        let piece = &data[lo..hi];
        let in_slot = Self::in_slot(piece.len());
        let q = self.slot_sent[to] + 1;
        // The last piece the receiver must have taken: the one that used this head before,
        // and for a piece in a slot, the one that used that slot before.
        let mut must_be_taken = p.saturating_sub(HEADS_PER_PEER as u64);
        if in_slot {
            must_be_taken = must_be_taken.max(self.slot_piece[to][(q - 1) as usize % SLOTS_PER_PEER]);
        }
        if must_be_taken > self.credit[to] {
            self.credit[to] = self.load(Self::consumed_at(to))?;
            if must_be_taken > self.credit[to] {
                return Ok(false);
            }
        }
        let (at, head) = (self.data_at(self.me, p, q, piece.len()), self.head_at(self.me, p));
        if s.place.is_none() && self.pinned_write_signal(to, at, piece, Signal::set(head, p)) {
            self.sent_piece(to, p, in_slot.then_some(q));
            return Ok(true);
        }
        let (conn, remote) = self.peers[to].as_ref().ok_or_else(|| CollError::BadArgument("send to self".into()))?;
        let op = match s.place {
            None => conn.write_signal(remote, at, piece, Signal::set(head, p), OpFlags::NONE),
            Some((target, offset)) => {
                // The block in one write, then the signal, which the receiver sees only once
                // the write is in place (the signal lands after every earlier operation of the
                // connection; over shared memory both are done in their calls, in order), with
                // no round trip between them. A write refused at once (over shared memory)
                // sends no signal.
                let mut write = conn.write(target, offset, s.data, OpFlags::NONE);
                let pending = match write.poll() {
                    Some(got) => self.outcome(to, got, false).map(|()| None)?,
                    None => Some(write),
                };
                let signal = conn.write_signal(remote, at, piece, Signal::set(head, p), OpFlags::NONE);
                if let Some(write) = pending {
                    self.track(to, write, false)?;
                }
                signal
            }
        };
        self.track(to, op, false)?;
        self.sent_piece(to, p, in_slot.then_some(q));
        Ok(true)
    }

    /// Count piece `p` to rank `to` as sent; `slot_piece`: its number among the pieces in
    /// slots, if it went in one.
    fn sent_piece(&mut self, to: usize, p: u64, slot_piece: Option<u64>) {
        self.sent[to] = p;
        if let Some(q) = slot_piece {
            self.slot_sent[to] = q;
            self.slot_piece[to][(q - 1) as usize % SLOTS_PER_PEER] = p;
        }
    }

    /// Take piece `taken + 1` from `from` into `into` if it has arrived. True if it had.
    fn try_recv_piece(&mut self, from: usize, into: &mut [u8], first: u64) -> Result<bool, CollError> {
        let p = self.taken[from] + 1;
        if self.load(self.head_at(from, p))? != p {
            return Ok(false);
        }
        let slot = self.layout.slot;
        let idx = (p - first) as usize;
        let lo = (idx * slot).min(into.len());
        let hi = (lo + slot).min(into.len());
        let q = self.slot_taken[from] + 1;
        if hi > lo {
            self.window.read_at(self.data_at(from, p, q, hi - lo), &mut into[lo..hi])?;
        }
        self.taken[from] = p;
        if Self::in_slot(hi - lo) {
            self.slot_taken[from] = q;
            self.slot_unacked[from] += 1;
        }
        if p - self.acked[from] >= ACK_HEADS || self.slot_unacked[from] >= ACK_SLOTS {
            self.give_back(from, p)?;
        }
        Ok(true)
    }

    /// Tell `from` that this rank has taken its first `taken` pieces. Where operations on the
    /// connection take effect in the order they are made (shared memory: each is done when
    /// the call returns), the count is simply stored; elsewhere two updates in flight could
    /// land out of order and move the count back, so the difference is added instead.
    fn give_back(&mut self, from: usize, taken: u64) -> Result<(), CollError> {
        let add = taken - self.acked[from];
        self.acked[from] = taken;
        self.slot_unacked[from] = 0;
        let at = Self::consumed_at(self.me);
        let signal = if self.ordered[from] { Signal::set(at, taken) } else { Signal::add(at, add) };
        if self.pinned_write_signal(from, 0, &[], signal) {
            return Ok(());
        }
        let (conn, remote) = self.peers[from].as_ref().expect("a peer, not this rank");
        let op = conn.write_signal(remote, 0, &[], signal, OpFlags::NONE);
        self.track(from, op, true)
    }

    /// A write-with-signal into rank `to`'s window through its pin, if it has one. True if it
    /// was placed; on an error the pin is dropped and the caller takes the connection's way,
    /// which reports what happened.
    fn pinned_write_signal(&mut self, to: usize, at: u64, data: &[u8], signal: Signal) -> bool {
        let Some(pin) = self.pins.get_mut(to).and_then(Option::as_mut) else {
            return false;
        };
        match pin.write_signal(at, data, signal) {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(rank = to, "pinned window refused a piece: {e}; using the connection");
                self.pins[to] = None;
                false
            }
        }
    }

    /// For transfers of `(rank, bytes)` following the `done` pieces per rank: the first piece
    /// of each (into `first`) and the one after its last (into `end`).
    fn spans(
        &self,
        next: &mut Vec<u64>,
        first: &mut Vec<u64>,
        end: &mut Vec<u64>,
        done: &[u64],
        transfers: impl Iterator<Item = (usize, usize)>,
    ) {
        next.clear();
        next.extend_from_slice(done);
        first.clear();
        end.clear();
        for (r, len) in transfers {
            first.push(next[r] + 1);
            next[r] += self.pieces(len);
            end.push(next[r] + 1);
        }
    }

    /// Run one step: every send and every receive, together, until all are done.
    pub(crate) fn exchange(
        &mut self,
        sends: &[SendSpec<'_>],
        recvs: &mut [RecvSpec<'_>],
        during: &'static str,
    ) -> Result<(), CollError> {
        for s in sends {
            if s.to == self.me || s.to >= self.nodes.len() {
                return Err(CollError::BadArgument(format!("send to rank {} from rank {}", s.to, self.me)));
            }
        }
        for r in recvs.iter() {
            if r.from == self.me || r.from >= self.nodes.len() {
                return Err(CollError::BadArgument(format!("receive from rank {} at rank {}", r.from, self.me)));
            }
        }
        // Where each transfer's pieces start, and where the next begins (two transfers between
        // one pair in one step follow each other). Kept between calls: a step allocates nothing.
        let mut sc = std::mem::take(&mut self.scratch);
        self.spans(
            &mut sc.next,
            &mut sc.send_first,
            &mut sc.send_end,
            &self.sent,
            sends.iter().map(|s| (s.to, s.staged_len())),
        );
        self.spans(
            &mut sc.next,
            &mut sc.recv_first,
            &mut sc.recv_end,
            &self.taken,
            recvs.iter().map(|r| (r.from, r.into.len())),
        );
        let dup_sends = sc.any_repeated(sends.iter().map(|s| s.to));
        let dup_recvs = sc.any_repeated(recvs.iter().map(|r| r.from));
        let outcome = self.run_step(sends, recvs, &sc, dup_sends, dup_recvs, during);
        self.scratch = sc;
        outcome
    }

    fn run_step(
        &mut self,
        sends: &[SendSpec<'_>],
        recvs: &mut [RecvSpec<'_>],
        sc: &Scratch,
        dup_sends: bool,
        dup_recvs: bool,
        during: &'static str,
    ) -> Result<(), CollError> {
        let (send_first, send_end, recv_first, recv_end) = (&sc.send_first, &sc.send_end, &sc.recv_first, &sc.recv_end);
        let mut waiter = Waiter::new(self.timeout, self.oversubscribed);
        // A rank found gone is reported only after one more look found nothing new: it may
        // have placed its last piece and left between our look and the check.
        let mut suspect: Option<CollError> = None;
        loop {
            let mut moved = false;
            let mut all_done = true;
            for (i, s) in sends.iter().enumerate() {
                // Two sends to one rank in one step go one after the other.
                if dup_sends && sends[..i].iter().zip(send_end).any(|(o, &e)| o.to == s.to && self.sent[s.to] + 1 < e) {
                    all_done = false;
                    continue;
                }
                while self.sent[s.to] + 1 < send_end[i] && self.try_send_piece(s, send_first[i])? {
                    moved = true;
                }
                all_done &= self.sent[s.to] + 1 >= send_end[i];
            }
            // The pieces just sent go out together now (the transport gathers small ones for
            // the next thread that drives it, whose look would read the sockets first).
            self.flush_sent();
            for i in 0..recvs.len() {
                let from = recvs[i].from;
                if dup_recvs && (0..i).any(|j| recvs[j].from == from && self.taken[from] + 1 < recv_end[j]) {
                    all_done = false;
                    continue;
                }
                while self.taken[from] + 1 < recv_end[i] {
                    let first = recv_first[i];
                    if !self.try_recv_piece(from, recvs[i].into, first)? {
                        break;
                    }
                    moved = true;
                }
                all_done &= self.taken[from] + 1 >= recv_end[i];
            }
            if all_done {
                // Nor what the receives gave back (credit) wait for this rank's next call.
                self.flush_sent();
                // Operations still in flight are looked at by the next step (or the drain at
                // leaving): a step that has every piece it waited for is done, even if a peer
                // that took ours has gone since (as the last step before leaving allows).
                return Ok(());
            }
            moved |= self.reap()?;
            if moved {
                waiter.progressed();
                suspect = None;
                continue;
            }
            if self.fabric.progress() {
                continue;
            }
            if let Some(e) = suspect.take() {
                return Err(e);
            }
            match waiter.idle(|| self.fabric.rest()) {
                Idle::Again => {}
                Idle::CheckPeers { ask_mh } => {
                    let waiting = self.waiting_for(sends, recvs, send_end, recv_end);
                    suspect = self.check_alive(&waiting, ask_mh).err();
                }
                Idle::TimedOut => {
                    let ranks = self.waiting_for(sends, recvs, send_end, recv_end);
                    return Err(CollError::Timeout { during, ranks, waited_ms: waiter.waited().as_millis() as u64 });
                }
            }
        }
    }

    /// The ranks a step still waits for.
    fn waiting_for(&self, sends: &[SendSpec<'_>], recvs: &[RecvSpec<'_>], se: &[u64], re: &[u64]) -> Vec<usize> {
        let mut v: Vec<usize> = sends
            .iter()
            .zip(se)
            .filter(|(s, &e)| self.sent[s.to] + 1 < e)
            .map(|(s, _)| s.to)
            .chain(recvs.iter().zip(re).filter(|(r, &e)| self.taken[r.from] + 1 < e).map(|(r, _)| r.from))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Fail with [`CollError::RankGone`] if one of `ranks` is gone, by its connection or, with
    /// `ask_mh`, by the management host's word.
    pub(crate) fn check_alive(&self, ranks: &[usize], ask_mh: bool) -> Result<(), CollError> {
        for &r in ranks {
            if self.conn(r).is_some_and(|c| !c.is_alive()) {
                return Err(self.gone(r));
            }
        }
        if ask_mh {
            // The management host being unreachable is not a rank's death: the transports
            // still tell, and the timeout still holds.
            // Only ranks this one waits for count: others may have finished and gone.
            if let Ok(round) = self.fabric.job_round(&self.job.name, self.job.token.as_deref(), self.mh_round) {
                if let Some(&r) = round.down.iter().find(|&&r| ranks.contains(&(r as usize))) {
                    return Err(self.gone(r as usize));
                }
            }
        }
        Ok(())
    }

    /// Wait for the outcome of every operation still in flight (before the group goes).
    pub(crate) fn drain(&mut self) -> Result<(), CollError> {
        while let Some((r, mut op, give_back)) = self.in_flight.pop_front() {
            let got = op.wait_timeout(self.timeout);
            self.outcome(r, got, give_back)?;
        }
        Ok(())
    }
}
