//! The data path: packets from `rw0` to their peers, and from peers into `rw0`.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Weak;

use rackwire::EdgeWatch;

use super::{
    debug, ipv4_destination, warn, Arc, Conn, Counts, Duration, Instant, Ipv4Addr, Op, Ordering, OwnedFd, Shared,
    VecDeque, ANSWERS_MAX, ANSWER_BYTES_MAX, IO_SPIN, PACKET_BYTES_MAX, RING_FULL_GIVE_UP, RING_FULL_NAP,
    RING_FULL_SPIN, RX_BATCH, STOP_CHECK, TX_BATCH, TX_INFLIGHT_MAX, VNET_HDR_LEN, VNIC_NAME,
};

/// Where a packet goes: the connection to its peer, and that peer's counters.
struct Route {
    conn: Conn,
    counts: Arc<Counts>,
}

/// The datagrams of one take from `rw0` across racks: the first goes out at once (a lone
/// packet, a ping-pong's, waits for nothing), the ones after it in the same take are held to
/// go out together (see [`Conn::send_datagram_more`]): a flood of small packets costs one
/// send of the edge transport's per take, not one per packet.
#[derive(Default)]
struct Burst {
    /// A datagram of this take went out.
    started: bool,
    /// A connection the take held datagrams on (the edge transport's, which sends them all).
    held: Option<Conn>,
}

impl Burst {
    /// Send what the take held.
    fn send_held(&mut self) {
        if let Some(conn) = self.held.take() {
            conn.send_held();
        }
    }
}

/// The route the last packet sent over the edge transport took, kept for the next packets to
/// the same address (a ping-pong's, a stream's): they take it without the routing table's
/// lock, its two lookups and the counting of references to the connection, for as long as
/// the table's routes have not changed since (`version`, [`Shared::routes_version`]).
struct Recent<R = Route> {
    dst: Ipv4Addr,
    version: u64,
    route: R,
}

impl<R> Recent<R> {
    /// The route kept, if it was kept for `dst` and the table's routes are still at `version`.
    fn route(&self, dst: Ipv4Addr, version: u64) -> Option<&R> {
        (self.dst == dst && self.version == version).then_some(&self.route)
    }
}

/// What one read from `rw0` came to.
enum Read {
    /// Nothing was waiting.
    Nothing,
    /// A packet of this many bytes, read straight into the guessed peer's ring and sent.
    Sent(usize),
    /// A packet of this many bytes, in the buffer, for [`Shared::carry`].
    Here(usize),
    /// The guessed peer's connection failed before anything was read.
    Failed(rackwire::Error),
    /// The guessed peer's ring had no room: nothing was read.
    NoRoom,
}

/// What became of a packet handed to [`Shared::carry`].
enum Carried {
    /// Sent, refused or dropped (and counted); the route it took if over shared memory.
    Done(Option<Route>),
    /// Its peer's ring had no room: nothing sent, the packet waits.
    NoRoom,
}

/// The sending side's state: what reading packets from `rw0` and sending them needs. Held by
/// whichever thread reads `rw0` (the virtual NIC's, or the edge transport's network thread
/// while it looks for answers: see [`Shared::take_answers`]), so packets leave in the order
/// they were read.
pub(crate) struct Tx {
    buf: Vec<u8>,
    inflight: VecDeque<(Op, Arc<Counts>)>,
    /// The peer over shared memory the last packet went to: the next packet is read from
    /// `rw0` straight into its ring (most packets go where the last one went).
    guess: Option<Route>,
    /// A packet in `buf` whose peer's ring had no room.
    pending: Option<usize>,
    /// The route of the last packet over the edge transport.
    recent: Option<Recent>,
    /// [`Shared::delivered`] when a small packet last ended the network thread's take (see
    /// [`ANSWER_BYTES_MAX`]).
    answered_at: u64,
}

impl Tx {
    pub(crate) fn new() -> Tx {
        Tx {
            buf: vec![0u8; PACKET_BYTES_MAX],
            inflight: VecDeque::new(),
            guess: None,
            pending: None,
            recent: None,
            answered_at: 0,
        }
    }
}

/// `rw0` as the edge transport's network thread watches it (see [`rackwire::EdgeWatch`]).
pub(crate) struct Answers {
    pub(crate) shared: Weak<Shared>,
    /// A descriptor of `rw0` of its own (closed when the fabric drops the watch).
    pub(crate) rw0: OwnedFd,
}

impl EdgeWatch for Answers {
    fn fd(&self) -> BorrowedFd<'_> {
        self.rw0.as_fd()
    }

    fn watching(&self, on: bool) {
        let Some(s) = self.shared.upgrade() else { return };
        s.edge_watching.store(on, Ordering::SeqCst);
        if let Err(e) = s.gate.edge_watching(&s.tun, on) {
            // The virtual NIC's thread still looks at `rw0` every `STOP_CHECK`.
            warn!("the virtual NIC's wait on {VNIC_NAME}: {e}");
            s.nudge();
        }
    }

    fn take(&self) -> bool {
        self.shared.upgrade().is_some_and(|s| s.take_answers())
    }
}

/// Whether the virtual NIC's thread, out of work `since_work` ago, looks again (yielding its
/// core) rather than sleeps: for [`IO_SPIN`] after work, unless the edge transport's network
/// thread watches `rw0` (`edge_watching`) and takes the answers itself.
fn looks_again(since_work: Duration, edge_watching: bool) -> bool {
    since_work < IO_SPIN && !edge_watching
}

/// Whether a packet of `n` bytes read from `rw0` (offload header included) ends a take of
/// `answers`, `delivered` packets having come into `rw0` so far and `answered_at` when a
/// packet last ended one (see [`ANSWER_BYTES_MAX`]).
fn ends_take(answers: bool, n: usize, delivered: u64, answered_at: u64) -> bool {
    answers && n <= VNET_HDR_LEN + ANSWER_BYTES_MAX && delivered != answered_at
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    // Checks when the virtual NIC's thread keeps looking after work: within `IO_SPIN` of its
    // last packet it does, after it it does not, and while the network thread watches `rw0`
    // it never does (it sleeps at once and leaves the answers to that thread).
    #[test]
    fn the_nic_thread_looks_again_only_while_nobody_else_watches() {
        assert!(looks_again(Duration::ZERO, false));
        assert!(looks_again(IO_SPIN / 2, false));
        assert!(!looks_again(IO_SPIN, false));
        assert!(!looks_again(Duration::ZERO, true));
        assert!(!looks_again(IO_SPIN / 2, true));
    }

    // Checks which packets end the network thread's take of answers: a small one (a 64 B
    // ping-pong's, up to an Ethernet frame's worth) read after a packet came into rw0 since
    // the last one that ended a take does; a stream's larger segment does not, nor a small one
    // with nothing come in since (a flood's), and none ends the virtual NIC thread's own
    // reading (not `answers`).
    #[test]
    fn a_small_answer_ends_the_network_threads_take() {
        let (came, last) = (8, 7);
        assert!(ends_take(true, VNET_HDR_LEN + 64, came, last));
        assert!(ends_take(true, VNET_HDR_LEN + ANSWER_BYTES_MAX, came, last));
        assert!(!ends_take(true, VNET_HDR_LEN + ANSWER_BYTES_MAX + 1, came, last));
        assert!(!ends_take(true, VNET_HDR_LEN + 65_000, came, last));
        assert!(!ends_take(true, VNET_HDR_LEN + 64, last, last));
        assert!(!ends_take(false, VNET_HDR_LEN + 64, came, last));
    }

    // Checks when a route kept from the last packet over the edge transport is taken again:
    // for the same destination while the table's routes are at the version it was kept at;
    // not for another destination, nor once the routes changed (a peer routed or forgotten
    // moves the version), when the table is asked again.
    #[test]
    fn a_kept_route_holds_only_for_its_address_while_the_routes_stand() {
        let dst = Ipv4Addr::new(198, 18, 0, 3);
        let kept = Recent { dst, version: 7, route: "to b1" };
        assert_eq!(kept.route(dst, 7), Some(&"to b1"));
        assert_eq!(kept.route(Ipv4Addr::new(198, 18, 0, 4), 7), None);
        assert_eq!(kept.route(dst, 8), None);
    }
}

/// What a run of reads from `rw0` came to.
#[derive(Default)]
struct Ran {
    /// Some packet was carried.
    worked: bool,
    /// A peer's ring had no room (a packet may wait in `Tx::pending`).
    full: bool,
    /// Reading `rw0` failed.
    failed: bool,
}

impl Shared {
    /// Packets both ways, from one thread: from the kernel to their peers (read from `rw0`),
    /// and from peers to the kernel (written into `rw0` from the shared-memory ring where they
    /// lie). One thread for both, as a bare relay has one per direction: a packet written
    /// into `rw0` often makes the kernel answer at once (a TCP acknowledgement), and the same
    /// thread, still awake, carries the answer without another thread's wake-up. It sleeps
    /// in the kernel on both at once when neither has had work for [`IO_SPIN`].
    pub(crate) fn io_loop(&self) {
        let mut last_work = Instant::now();
        // Since when rings were full.
        let mut full_since: Option<Instant> = None;
        // The gate holds `rw0` since this thread last slept.
        let mut gate_held = false;
        // Datagrams of one flow from the rings, for one write into `rw0`.
        let mut run = crate::gro::UdpRun::default();
        while !self.stop.load(Ordering::Relaxed) {
            let ran = {
                let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
                self.send_some(&mut tx, TX_BATCH, false)
            };
            if ran.failed {
                std::thread::sleep(STOP_CHECK);
            }
            let mut worked = ran.worked;
            let got = self.fabric.recv_waiting_with(RX_BATCH, |from, data| {
                self.deliver_gathering(&mut run, from, data, crate::rx::Next::Unknown)
            });
            self.pass_on(&mut run);
            match got {
                Ok(n) => worked |= n > 0,
                Err(rackwire::Error::Closed) => return,
                Err(e) => debug!("fabric receive: {e}"),
            }
            if gate_held {
                // Awake and looking at `rw0` itself: the gate lets go of it, after the first
                // packets (not before them: a system call on their path).
                gate_held = false;
                if let Err(e) = self.gate.sleeping(&self.tun, false) {
                    debug!("the virtual NIC's gate: {e}");
                }
            }
            if !ran.full {
                full_since = None;
            }
            if worked {
                last_work = Instant::now();
                continue;
            }
            if ran.full {
                // The peer's ring has no room (its doorbell rang: it drains). Ours are drained
                // meanwhile (the peer may be waiting for room in them), and `rw0` is not read
                // further: its queue holds the packets, and drops past its length, as a NIC's.
                let since = *full_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= RING_FULL_GIVE_UP {
                    // A peer that stopped draining holds up the others for this long a packet
                    // at most: its packet is dropped (counted), the next ones read the plain way.
                    let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(n) = tx.pending.take() {
                        self.count_unsent(&tx.buf[..n]);
                    }
                    tx.guess = None;
                    full_since = None;
                    continue;
                }
                if since.elapsed() < RING_FULL_SPIN {
                    std::thread::yield_now();
                } else if let Err(rackwire::Error::Closed) = self.fabric.wait_input(&[], RING_FULL_NAP) {
                    return;
                }
                continue;
            }
            if looks_again(last_work.elapsed(), self.edge_watching.load(Ordering::Relaxed)) {
                std::thread::yield_now();
                continue;
            }
            // Asleep on `rw0` through its gate: while the edge transport's network thread
            // watches `rw0`, a packet there does not wake this thread (see `Shared::gate`).
            self.asleep.store(true, Ordering::SeqCst);
            if let Err(e) = self.gate.sleeping(&self.tun, true) {
                // Asleep without it, the thread still looks at `rw0` every `STOP_CHECK`.
                warn!("the virtual NIC's wait on {VNIC_NAME}: {e}");
            }
            let slept = self.fabric.wait_input(&[self.gate.fd(), self.nudge.as_fd()], STOP_CHECK);
            self.asleep.store(false, Ordering::SeqCst);
            // The gate lets go of `rw0` after the work this wake-up brought (see below).
            gate_held = true;
            match slept {
                Ok(()) => {}
                Err(rackwire::Error::Closed) => return,
                Err(e) => debug!("waiting for packets: {e}"),
            }
            if self.nudged.swap(false, Ordering::Acquire) {
                let _ = rustix::io::read(&self.nudge, &mut [0u8; 8]);
            }
        }
    }

    /// The edge transport's network thread, looking for more work after handing packets from
    /// other racks over (into `rw0`), found `rw0` readable: it reads and sends what is there
    /// (the answers, most likely), unless this agent's thread is awake. Never waits: not for
    /// room in a ring (a packet that finds none is left to this agent's thread, woken for it),
    /// nor for edge sends to complete (it reads no more than leaves room for in flight).
    /// True when it carried some.
    pub(crate) fn take_answers(&self) -> bool {
        // An awake virtual NIC thread reads `rw0` itself (it looks again within microseconds).
        if !self.asleep.load(Ordering::Relaxed) {
            return false;
        }
        let Ok(mut tx) = self.tx.try_lock() else { return false };
        if tx.pending.is_some() || tx.inflight.len() + ANSWERS_MAX >= TX_INFLIGHT_MAX {
            return false;
        }
        let ran = self.send_some(&mut tx, ANSWERS_MAX, true);
        if ran.full || ran.failed {
            self.nudge();
        }
        ran.worked
    }

    /// Wake the virtual NIC's thread.
    fn nudge(&self) {
        self.nudged.store(true, Ordering::Release);
        let _ = rustix::io::write(&self.nudge, &1u64.to_ne_bytes());
    }

    /// Read up to `max` packets from `rw0` (a packet waiting for room first) and send each to
    /// the peer that owns its destination, until `rw0` is empty or a ring has no room; with
    /// `answers`, also after a small answer (see [`ANSWER_BYTES_MAX`]).
    fn send_some(&self, tx: &mut Tx, max: usize, answers: bool) -> Ran {
        let mut ran = Ran::default();
        let Tx { buf, inflight, guess, pending, recent, answered_at } = tx;
        let mut burst = Burst::default();
        // Whether the packet of `n` bytes just sent ends the take (see `ends_take`).
        let mut ends = |n: usize| {
            // The virtual NIC thread's own reading never ends early: no load of the counter
            // on its path (with `delivered` at `answered_at`, `ends_take` is false anyway).
            let delivered = if answers { self.delivered.load(Ordering::Relaxed) } else { *answered_at };
            let ends = ends_take(answers, n, delivered, *answered_at);
            if ends {
                *answered_at = delivered;
            }
            ends
        };
        for _ in 0..max {
            let read = match (pending.take(), &*guess) {
                (Some(n), _) => Ok(Read::Here(n)),
                (None, Some(route)) => self.read_into(route, buf),
                (None, None) => self.tun.try_read(buf).map(|n| if n == 0 { Read::Nothing } else { Read::Here(n) }),
            };
            match read {
                Ok(Read::Nothing) => break,
                Ok(Read::NoRoom) => {
                    ran.full = true;
                    break;
                }
                Ok(Read::Sent(n)) => {
                    ran.worked = true;
                    if ends(n) {
                        break;
                    }
                }
                Ok(Read::Here(n)) => match self.carry(&buf[..n], inflight, recent, &mut burst) {
                    Carried::NoRoom => {
                        *pending = Some(n);
                        ran.full = true;
                        break;
                    }
                    Carried::Done(route) => {
                        ran.worked = true;
                        *guess = route;
                        if ends(n) {
                            break;
                        }
                    }
                },
                Ok(Read::Failed(e)) => {
                    // Its peer failed before anything was read: the packet is still in
                    // `rw0`, read the plain way next.
                    if let Some(route) = guess.take() {
                        self.send_failed(&route.conn, &route.counts, e);
                    }
                }
                Err(e) => {
                    warn!("reading {VNIC_NAME}: {e}");
                    ran.failed = true;
                    break;
                }
            }
        }
        burst.send_held();
        ran
    }

    /// One packet read from `rw0` to the peer that owns its destination. Edge sends complete
    /// later: a bounded number stays in flight. Returns the route taken when it is over shared
    /// memory (the next packet is read straight into its ring), or that its ring had no room
    /// (nothing sent: the packet waits). A route over the edge transport is kept in `recent`.
    fn carry(
        &self,
        packet: &[u8],
        inflight: &mut VecDeque<(Op, Arc<Counts>)>,
        recent: &mut Option<Recent>,
        burst: &mut Burst,
    ) -> Carried {
        // The offload header and the packet go together.
        let Some(dst) = packet.get(VNET_HDR_LEN..).and_then(ipv4_destination) else {
            // IPv6 neighbour discovery and the like are not carried.
            self.malformed.fetch_add(1, Ordering::Relaxed);
            return Carried::Done(None);
        };
        // Read before the table: a change after this reading makes the route kept below stale.
        let version = self.routes_version.load(Ordering::Acquire);
        if let Some(route) = recent.as_ref().and_then(|r| r.route(dst, version)) {
            return self.carry_on(packet, route, inflight, burst).map_or(Carried::NoRoom, |_| Carried::Done(None));
        }
        let route = {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            match table.by_addr.get(&dst).and_then(|n| table.peers.get(n)) {
                Some(p) => Route { conn: p.conn.clone(), counts: p.counts.clone() },
                None => {
                    self.no_route.fetch_add(1, Ordering::Relaxed);
                    return Carried::Done(None);
                }
            }
        };
        let shm = route.conn.transport() == "shm";
        let carried = self.carry_on(packet, &route, inflight, burst);
        if shm {
            // The next packet is read straight into this peer's ring, if this one went there.
            return carried.map_or(Carried::NoRoom, |sent| Carried::Done(sent.then_some(route)));
        }
        *recent = Some(Recent { dst, version, route });
        Carried::Done(None)
    }

    /// [`Shared::carry`] once the packet's route is known: whether it was sent (not refused,
    /// dropped or failed), `None` when its ring had no room.
    fn carry_on(
        &self,
        packet: &[u8],
        route: &Route,
        inflight: &mut VecDeque<(Op, Arc<Counts>)>,
        burst: &mut Burst,
    ) -> Option<bool> {
        let n = packet.len();
        let shm = route.conn.transport() == "shm";
        let mut op = if shm {
            // Not waiting for room (see `Conn::send_with`): none, `None`.
            route.conn.send_with(n, |slot| {
                slot[..n].copy_from_slice(packet);
                Some(n)
            })?
        } else {
            // Finished sends leave the queue first: a packet goes as a datagram only when no
            // message sent before it is still on its way, so it never overtakes one.
            reap(inflight, usize::MAX);
            if inflight.is_empty() {
                let sent = if burst.started {
                    if burst.held.is_none() {
                        burst.held = Some(route.conn.clone());
                    }
                    route.conn.send_datagram_more(packet)
                } else {
                    route.conn.send_datagram(packet)
                };
                match sent {
                    Ok(()) => {
                        burst.started = true;
                        count_tx(&route.counts, n);
                        return Some(true);
                    }
                    // Larger than one frame: as a message (in pieces, sent again if lost).
                    Err(rackwire::Error::MessageTooLarge { .. }) => {}
                    Err(e @ rackwire::Error::Limit(_)) => {
                        // The transport's queue is full: dropped, as a NIC's full queue does.
                        debug!("datagram to {}: {e}", route.conn.peer());
                        route.counts.tx_errors.fetch_add(1, Ordering::Relaxed);
                        return Some(false);
                    }
                    Err(e) => {
                        self.send_failed(&route.conn, &route.counts, e);
                        return Some(false);
                    }
                }
            }
            // Not ahead of the datagrams held before it.
            burst.send_held();
            route.conn.send(packet)
        };
        match op.poll() {
            Some(Ok(_)) => count_tx(&route.counts, n),
            Some(Err(e)) => {
                self.send_failed(&route.conn, &route.counts, e);
                return Some(false);
            }
            None => {
                count_tx(&route.counts, n);
                inflight.push_back((op, route.counts.clone()));
            }
        }
        reap(inflight, TX_INFLIGHT_MAX);
        Some(true)
    }

    /// A packet read from `rw0` and never sent (its peer's ring stayed full): counted as a
    /// send error of the peer that owns its destination.
    fn count_unsent(&self, packet: &[u8]) {
        let Some(dst) = packet.get(VNET_HDR_LEN..).and_then(ipv4_destination) else { return };
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = table.by_addr.get(&dst).and_then(|n| table.peers.get(n)) {
            p.counts.tx_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A send to `conn`'s peer failed: counted; a peer that is gone loses its routes now
    /// (its traffic goes back to Ethernet), not at the next look for peers.
    fn send_failed(&self, conn: &Conn, counts: &Counts, e: rackwire::Error) {
        debug!("send to {}: {e}", conn.peer());
        counts.tx_errors.fetch_add(1, Ordering::Relaxed);
        if matches!(e, rackwire::Error::PeerGone(_) | rackwire::Error::Closed) {
            let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
            self.forget(&mut table, conn.peer());
        }
    }

    /// Read the next packet from `rw0` straight into the ring of `route`'s peer and send it
    /// there if that peer owns its destination; a packet for anyone else is copied into `buf`
    /// and left to [`Shared::carry`].
    fn read_into(&self, route: &Route, buf: &mut [u8]) -> std::io::Result<Read> {
        // Left as it is when `fill` is not called: the ring had no room.
        let mut read = Ok(Read::NoRoom);
        let op = route.conn.send_with(PACKET_BYTES_MAX, |slot| {
            let n = match self.tun.try_read(slot) {
                Ok(0) => {
                    read = Ok(Read::Nothing);
                    return None;
                }
                Ok(n) => n,
                Err(e) => {
                    read = Err(e);
                    return None;
                }
            };
            let packet = &slot[..n];
            let dst = packet.get(VNET_HDR_LEN..).and_then(ipv4_destination);
            let owner = dst.and_then(|d| self.table.read().unwrap_or_else(|e| e.into_inner()).by_addr.get(&d).copied());
            if owner == Some(route.conn.peer()) {
                read = Ok(Read::Sent(n));
                Some(n)
            } else {
                buf[..n].copy_from_slice(packet);
                read = Ok(Read::Here(n));
                None
            }
        });
        match op.map(|mut op| op.poll()) {
            // Over shared memory a send is done when it returns.
            Some(Some(Err(e))) => Ok(Read::Failed(e)),
            _ => {
                if let Ok(Read::Sent(n)) = &read {
                    count_tx(&route.counts, *n);
                }
                read
            }
        }
    }
}

/// Take the finished sends off the front of `inflight`, and while it holds `bound` or more,
/// wait for the oldest (counting the failed ones).
fn reap(inflight: &mut VecDeque<(Op, Arc<Counts>)>, bound: usize) {
    while let Some((op, _)) = inflight.front() {
        if inflight.len() < bound && !op.is_done() {
            break;
        }
        let (op, counts) = inflight.pop_front().expect("front exists");
        if op.wait().is_err() {
            counts.tx_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn count_tx(c: &Counts, n: usize) {
    c.tx_packets.fetch_add(1, Ordering::Relaxed);
    c.tx_bytes.fetch_add(n as u64, Ordering::Relaxed);
}
