//! The edge transport: peers reached over Ethernet links with the reliable multi-link protocol
//! of `rackwire-proto`, on UDP sockets from `rackwire-udp`.
//!
//! Each node has one [`EdgeEndpoint`]: a socket per link and one network thread that feeds
//! arriving frames to their connection (found by the connection id in the frame header; a first
//! handshake frame opens a new one), fires timers, sends what the connections have to send in
//! batches, and turns connection events into completed operation handles, queued messages and
//! notifications. Application threads waiting on the transport drive it themselves (sending
//! inline when they submit, polling while they wait); the network thread keeps looking for a
//! moment after its last work, then blocks until a frame, a timer or a new operation, and
//! stays off the sockets while an application thread polls them. The target side applies this
//! node's access rules to every frame through the same grant table as the shared-memory
//! transport.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rackwire_proto::{self as proto, Bytes, Connection, Event, OpError};
use rackwire_udp::{FaultInjector, LinkSocket, OutFrame, RecvBufs, Waker, SEND_BATCH_MAX};
use rackwire_wire::{FrameKind, HandshakeRepr, HEADER_LEN};
use tracing::{debug, warn};

use crate::config::LINK_MTU_MIN;
use crate::grants::Refusal as Rule;
use crate::node::Node;
use crate::op::{Drive, OpCell};
use crate::sync::lock;
use crate::transport::PeerTransport;
use crate::{
    Access, BatchOptions, Completion, ConnStats, Error, NodeId, NodeInfo, Notification, Op, OpFlags, RegionId,
    RemoteRegion, Signal, SignalOp, CONNECT_TIMEOUT,
};

/// Frames taken from one socket before the others get a turn.
const RECV_BURST: usize = 64;
/// The retransmission timer's floor on real links (µs).
const RTO_MIN_US: proto::Time = 5_000;
/// An application thread that pumped this recently (µs) is taken to be polling still, unless
/// it said it stopped ([`Drive::rest`]). Long enough that a polling thread the scheduler sets
/// aside for a moment (common on a small, shared host) is not taken to have left: the network
/// thread would then take the frames it waits for and compete with it for the core.
const PUMP_RECENT_US: u64 = 500;
/// While an application thread polls, the network thread leaves it the sockets and the core
/// and only looks, every so often, whether it still polls: first after this long, then after
/// twice as long each time it found the thread still at it, up to [`PUMP_WATCH_MAX`]. Every
/// look takes a core from a polling thread (on a small host, from the one about to answer), so
/// a thread that polls for long is looked at rarely. A thread that stops polling to sleep says
/// so ([`Drive::rest`]) and the network thread takes over at once.
const PUMP_WATCH: Duration = Duration::from_micros(200);
/// The longest look interval of [`PUMP_WATCH`]: how late, at worst, the network thread takes
/// over from an application thread that stopped polling without sleeping (it went on with
/// other work): frames for this node's memory, held answers and timers wait at most this long.
const PUMP_WATCH_MAX: Duration = Duration::from_millis(2);
/// How long answers are held for a frame to ride in after an application thread was handed a
/// notification or message (µs): it usually sends its reply at once, and one frame then carries
/// both (see [`Connection::hold_answers`]). A later round sends them sooner; if the thread
/// stops polling without sleeping, the network thread's next look (within [`PUMP_WATCH_MAX`]).
const ANSWER_HOLD_US: proto::Time = 200;
/// Longest the network thread sleeps without looking at its timers.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(10);
/// How long the network thread keeps looking after its last piece of work before it sleeps.
const NET_SPIN: Duration = Duration::from_micros(50);
/// A link's gathered frames go out once they hold this many bytes: a run of large frames
/// starts moving (and the peer starts receiving) while the rest are still being prepared.
const TX_FLUSH_BYTES: usize = 64 * 1024;
/// Bytes of messages received and not yet read, per connection, as the shared-memory
/// transport's message ring holds: a sender to a receiver that does not read is held back
/// (its frames are dropped unacknowledged and sent again later) and its sends time out as they
/// would on shared memory.
const MESSAGES_QUEUED_BYTES: usize = crate::MESSAGE_RING_BYTES as usize;
/// Notifications not yet taken, per connection (a write or read asking for one more waits).
const NOTES_QUEUED_MAX: usize = 4096;
/// The network thread is awake (not parked).
const AWAKE: u64 = 0;

/// Buffers of one thread that drives the endpoint: receive buffers, a buffer the connections
/// write frame heads into, and the frames gathered per link for one `sendmmsg`.
struct Io {
    rx: RecvBufs,
    out: Vec<u8>,
    tx: Vec<TxLink>,
}

impl Io {
    fn new(links: usize) -> Io {
        Io {
            rx: RecvBufs::default(),
            out: vec![0u8; rackwire_udp::UDP_PAYLOAD_MAX + 1],
            tx: (0..links).map(|_| TxLink::default()).collect(),
        }
    }
}

/// Frames waiting to go out on one link: their heads laid end to end in one buffer (reused
/// from batch to batch), their bodies shared with the operations they carry.
#[derive(Default)]
struct TxLink {
    heads: Vec<u8>,
    frames: Vec<(usize, usize, Option<Bytes>, SocketAddr)>,
    /// Bytes of the gathered frames.
    bytes: usize,
}

/// The earlier of two deadlines (none is never).
fn earliest(a: Option<proto::Time>, b: Option<proto::Time>) -> Option<proto::Time> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn refusal(r: Rule) -> proto::Refusal {
    match r {
        Rule::Ungranted { .. } => proto::Refusal::Ungranted,
        Rule::Revoked => proto::Refusal::Revoked,
        Rule::BadKey => proto::Refusal::BadKey,
        Rule::UnknownRegion => proto::Refusal::UnknownRegion,
        Rule::Busy => proto::Refusal::Other(100),
    }
}

/// This node's memory as the edge transport's target sees it: every frame is checked against
/// the owner's grant table, and the operation's whole range against the region.
struct FabricTarget<'a> {
    fabric: &'a Weak<Node>,
}

impl FabricTarget<'_> {
    fn with<T>(
        &self,
        peer: u32,
        region: u32,
        key: u128,
        need: Access,
        f: impl FnOnce(&crate::grants::RegionInner) -> Result<T, proto::Refusal>,
    ) -> Result<T, proto::Refusal> {
        let fab = self.fabric.upgrade().ok_or(proto::Refusal::UnknownRegion)?;
        fab.regions.with_grant(peer, region, key, need, |r, _| f(r)).map_err(refusal)?
    }
}

fn in_bounds(len: u64, offset: u64, n: u64) -> Result<(), proto::Refusal> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(proto::Refusal::OutOfBounds),
    }
}

impl proto::Target for FabricTarget<'_> {
    fn write(
        &mut self,
        peer: u32,
        region: u32,
        key: u128,
        op_offset: u64,
        op_len: u64,
        at: u64,
        data: &[u8],
    ) -> Result<(), proto::Refusal> {
        self.with(peer, region, key, Access::WRITE, |r| {
            in_bounds(r.len, op_offset, op_len)?;
            in_bounds(r.len, at, data.len() as u64)?;
            r.mem.lock().write_at(at, data);
            Ok(())
        })
    }

    fn read(&mut self, peer: u32, region: u32, key: u128, offset: u64, out: &mut [u8]) -> Result<(), proto::Refusal> {
        self.with(peer, region, key, Access::READ, |r| {
            in_bounds(r.len, offset, out.len() as u64)?;
            r.mem.lock().read_at(offset, out);
            Ok(())
        })
    }

    fn atomic(
        &mut self,
        peer: u32,
        region: u32,
        key: u128,
        offset: u64,
        op: proto::AtomicOp,
    ) -> Result<u64, proto::Refusal> {
        if !offset.is_multiple_of(8) {
            return Err(proto::Refusal::Misaligned);
        }
        self.with(peer, region, key, Access::ATOMIC, |r| {
            let mem = r.mem.lock();
            let word = mem.atomic_u64(offset).ok_or(proto::Refusal::OutOfBounds)?;
            Ok(match op {
                proto::AtomicOp::CompareSwap { expected, new } => {
                    word.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire).unwrap_or_else(|v| v)
                }
                proto::AtomicOp::FetchAdd(a) => word.fetch_add(a, Ordering::AcqRel),
            })
        })
    }
}

/// What an operation handle needs to turn a refusal into its error.
struct Pending {
    cell: Arc<OpCell>,
    region: RegionId,
    offset: u64,
    len: u64,
    need: Access,
}

/// One connection as the endpoint keeps it.
struct Slot {
    conn: Connection,
    peer: NodeId,
    addrs: Vec<Option<SocketAddr>>,
    pending: proto::OwnIdMap<proto::OpId, Pending>,
    msgs: VecDeque<Vec<u8>>,
    /// Bytes of `msgs`.
    msg_bytes: usize,
    notes: VecDeque<Notification>,
    connected: bool,
    closed: bool,
    /// An [`EdgePeer`] for it is registered with the fabric.
    registered: bool,
}

impl Slot {
    fn new(mut conn: Connection, peer: NodeId, addrs: Vec<Option<SocketAddr>>, registered: bool) -> Slot {
        conn.set_delivery_room(MESSAGES_QUEUED_BYTES, NOTES_QUEUED_MAX);
        Slot {
            conn,
            peer,
            addrs,
            pending: Default::default(),
            msgs: VecDeque::new(),
            msg_bytes: 0,
            notes: VecDeque::new(),
            connected: false,
            closed: false,
            registered,
        }
    }

    /// The oldest message not yet read.
    fn next_message(&mut self) -> Option<Vec<u8>> {
        let m = self.msgs.pop_front()?;
        self.msg_bytes -= m.len();
        self.refresh_room();
        Some(m)
    }

    /// The oldest notification not yet taken.
    fn next_note(&mut self) -> Option<Notification> {
        let n = self.notes.pop_front()?;
        self.refresh_room();
        Some(n)
    }

    /// Tell the connection how much more the application's queues take.
    fn refresh_room(&mut self) {
        self.conn.set_delivery_room(
            MESSAGES_QUEUED_BYTES.saturating_sub(self.msg_bytes),
            NOTES_QUEUED_MAX.saturating_sub(self.notes.len()),
        );
    }
}

struct State {
    /// By local connection id (chosen here; a frame's id is only looked up).
    slots: proto::OwnIdMap<u32, Slot>,
    /// Accepted connections by (peer, the peer's connection id), so a repeated first handshake
    /// frame finds its connection.
    accepted: HashMap<(NodeId, u32), u32>,
    next_local: u32,
    faults: Vec<Option<FaultInjector>>,
    /// The last round ended early, right after handing an application thread what it waited
    /// for (the next one does not).
    shortcut: bool,
    /// Some connection holds its answers (until the next round).
    holding: bool,
    /// An application thread queued operations it left unsent (to share frames): the next
    /// round sends them.
    unsent: bool,
    /// The last round found every socket empty.
    quiet: bool,
    /// No connection has anything due before this (µs), unless `stale`: an idle round (the
    /// polling loop's usual one) then skips the look at every connection's timers.
    due: Option<proto::Time>,
    /// Something may have moved a deadline earlier since `due` was taken.
    stale: bool,
}

impl State {
    /// The earliest deadline of any connection.
    fn next_due(&mut self) -> Option<proto::Time> {
        if self.stale {
            self.due = self.slots.values().filter_map(|s| s.conn.poll_timeout()).min();
            self.stale = false;
        }
        self.due
    }
}

/// A node's edge transport: its links and their connections.
pub(crate) struct EdgeEndpoint {
    /// Itself, for the peers it registers.
    this: Weak<EdgeEndpoint>,
    socks: Vec<LinkSocket>,
    waker: Waker,
    state: Mutex<State>,
    fabric: Weak<Node>,
    start: Instant,
    stop: AtomicBool,
    me: NodeId,
    secret: Vec<u8>,
    mtu: usize,
    busy_poll: Duration,
    op_timeout: Duration,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Buffers for application threads (pumping, submitting).
    app_io: Mutex<Io>,
    /// When an application thread last pumped (µs), or 0 once it stopped to sleep: the network
    /// thread stays out of its way.
    last_pump_us: AtomicU64,
    /// The network thread leaves the sockets to a polling application thread and only looks
    /// now and then whether it still polls (see [`PUMP_WATCH`]).
    watching: AtomicBool,
    /// The first and the longest look interval while watching (µs): [`PUMP_WATCH`] and
    /// [`PUMP_WATCH_MAX`] (a test lengthens them).
    watch_us: [AtomicU64; 2],
    /// Until when the network thread sleeps (µs), or [`AWAKE`]: a submission that needs it
    /// sooner (a timer) wakes it.
    parked_until_us: AtomicU64,
}

impl EdgeEndpoint {
    /// Bind the links and start the network thread.
    pub(crate) fn start(f: &Arc<Node>) -> Result<Arc<EdgeEndpoint>, Error> {
        let cfg = &f.cfg;
        let socks = cfg
            .links
            .iter()
            .map(|a| {
                let s = LinkSocket::bind(a, cfg.link_mtu).map_err(|e| Error::Config(format!("link {a}: {e}")))?;
                if s.mtu() < LINK_MTU_MIN {
                    return Err(Error::Config(format!("link {a}: its interface takes frames of {} bytes", s.mtu())));
                }
                Ok(s)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // A link's socket may take smaller frames than configured (its interface's MTU).
        let mtu = socks.iter().map(LinkSocket::mtu).min().unwrap_or(cfg.link_mtu);
        let faults =
            (0..socks.len()).map(|l| cfg.faults.filter(|s| !s.is_clean()).map(|s| FaultInjector::new(s, l))).collect();
        let waker = Waker::new().map_err(|e| Error::Sys(e.to_string()))?;
        let ep = Arc::new_cyclic(|this| EdgeEndpoint {
            this: this.clone(),
            socks,
            waker,
            state: Mutex::new(State {
                slots: Default::default(),
                accepted: HashMap::new(),
                next_local: 1,
                faults,
                shortcut: false,
                holding: false,
                unsent: false,
                quiet: true,
                due: None,
                stale: true,
            }),
            fabric: f.weak.clone(),
            start: Instant::now(),
            stop: AtomicBool::new(false),
            me: f.id,
            secret: cfg.secret.clone(),
            mtu,
            busy_poll: cfg.busy_poll,
            op_timeout: cfg.op_timeout,
            thread: Mutex::new(None),
            app_io: Mutex::new(Io::new(cfg.links.len())),
            last_pump_us: AtomicU64::new(0),
            watching: AtomicBool::new(false),
            watch_us: [PUMP_WATCH, PUMP_WATCH_MAX].map(|d| AtomicU64::new(d.as_micros() as u64)),
            parked_until_us: AtomicU64::new(AWAKE),
        });
        let runner = ep.clone();
        let h = std::thread::Builder::new()
            .name("rw-edge".into())
            .spawn(move || runner.run())
            .map_err(|e| Error::Sys(e.to_string()))?;
        *lock(&ep.thread) = Some(h);
        Ok(ep)
    }

    /// The links' bound addresses, to publish.
    pub(crate) fn addrs(&self) -> Vec<String> {
        self.socks.iter().map(|s| s.local_addr().to_string()).collect()
    }

    fn now(&self) -> proto::Time {
        self.start.elapsed().as_micros() as proto::Time
    }

    fn proto_config(&self, links: usize) -> proto::Config {
        let mut c = proto::Config::new(links, self.mtu);
        c.mtu = self.socks.iter().take(links).map(LinkSocket::mtu).collect();
        c.op_timeout_us = self.op_timeout.as_micros() as proto::Time;
        // Windows count frames: keep their byte sizes about the same whatever the MTU.
        let scale = |frames_at_1500: usize, floor: usize| (frames_at_1500 * 1472 / self.mtu).max(floor);
        c.link_window_min = scale(c.link_window_min, 2);
        c.link_window_initial = scale(c.link_window_initial, 4);
        c.link_window_max = scale(c.link_window_max, 32);
        // Acknowledge about as many bytes at a time as with small frames: with jumbo frames a
        // window holds few of them, and waiting for eight would stall the sender. At least two,
        // so a lone answer (ping-pong) is acknowledged by the next frame going back, not by a
        // frame of its own.
        c.ack_every_frames = scale(c.ack_every_frames as usize, 2) as u32;
        // A user-space transport on a shared host sees scheduling stalls of a few milliseconds;
        // frames lost between delivered ones are found sooner (by the overtaking rule and the
        // receiver's reports), so the timer, which catches tails and dead links, can wait out
        // such a stall instead of declaring a window's worth of frames lost.
        c.rto_min_us = RTO_MIN_US;
        c
    }

    /// Stop the network thread and close every connection.
    pub(crate) fn shutdown(&self) {
        {
            let mut st = lock(&self.state);
            let now = self.now();
            for s in st.slots.values_mut() {
                s.conn.close(now);
            }
            st.stale = true;
        }
        // One last round sends the closes.
        self.stop.store(true, Ordering::SeqCst);
        self.waker.wake();
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
    }

    /// Open a connection to `info` and wait for its handshake.
    pub(crate) fn connect(self: &Arc<Self>, info: &NodeInfo) -> Result<Arc<dyn PeerTransport>, Error> {
        let addrs: Vec<SocketAddr> = info.links.iter().filter_map(|a| a.parse().ok()).collect();
        let links = addrs.len().min(self.socks.len());
        if links == 0 {
            return Err(Error::Unreachable { node: info.id, why: "no Ethernet link in common".into() });
        }
        let local = {
            let mut st = lock(&self.state);
            let local = st.next_local;
            st.next_local += 1;
            st.stale = true;
            let conn = Connection::connect(
                self.proto_config(links),
                self.me,
                info.id,
                &self.secret,
                rackwire_mh::auth::nonce(),
                local,
                self.now(),
            );
            st.slots
                .insert(local, Slot::new(conn, info.id, addrs.iter().take(links).map(|a| Some(*a)).collect(), true));
            local
        };
        self.waker.wake();
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            {
                let mut st = lock(&self.state);
                let s = st.slots.get(&local).ok_or(Error::PeerGone(info.id))?;
                if s.connected {
                    break;
                }
                if s.closed || Instant::now() > deadline {
                    st.slots.remove(&local);
                    return Err(Error::Unreachable {
                        node: info.id,
                        why: "the edge handshake did not complete (peer down, or it refused our secret)".into(),
                    });
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(Arc::new(EdgePeer { ep: self.clone(), local, peer: info.id }))
    }

    /// One round of work: drain the sockets, fire due timers, dispatch events, send. `app`:
    /// an application thread runs it (polling while it waits), and answers to what it hands
    /// that thread are held for the reply it is likely to send next. Returns (frames received,
    /// frames sent).
    fn round(
        &self,
        st: &mut State,
        io: &mut Io,
        target: &mut FabricTarget<'_>,
        now: proto::Time,
        app: bool,
    ) -> (usize, usize) {
        // A hold lasts until the next round: whoever runs it, the reply did not come first.
        let released = std::mem::take(&mut st.holding);
        if released {
            for s in st.slots.values_mut() {
                s.conn.hold_answers(0);
            }
        }
        let mut got = 0;
        let mut more = false;
        // After a round that found every socket empty, a frame that gives a connection
        // something to hand over (a completion, a message, a notification) is most likely
        // alone (a ping-pong): it ends the receiving and is handed over before the look that
        // would find its socket empty (a system call). The next round, which follows at once,
        // reads every link to the end, so no link waits behind another and timers do run.
        let may_break = st.quiet;
        let mut hand = false;
        'links: for (l, sock) in self.socks.iter().enumerate() {
            let mut taken = 0;
            while taken < RECV_BURST {
                let each = |frame: &[u8], from| {
                    let events = self.deliver(st, l, frame, from, now, target) && may_break;
                    hand |= events;
                    if events {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                };
                match sock.recv_batch(&mut io.rx, each) {
                    Ok(n) => {
                        taken += n;
                        if hand && !io.rx.drained() {
                            // Frames may still wait (and with them acknowledgements): no
                            // timers until they are read.
                            got += taken;
                            more = true;
                            break 'links;
                        }
                        // The socket was found empty: looking again now would cost a system
                        // call for nothing.
                        if io.rx.drained() {
                            break;
                        }
                    }
                    Err(e) => {
                        debug!(link = l, "receive: {e}");
                        break;
                    }
                }
            }
            got += taken;
            more |= taken >= RECV_BURST;
        }
        st.quiet = got == 0;
        // Timers (and loss detection) wait while frames are still queued: after a stall, the
        // acknowledgements not yet read would otherwise make frames look lost. Connections are
        // looked at only when frames arrived, something changed, or a deadline passed.
        let look = !more && (got > 0 || st.stale || st.due.is_some_and(|t| t <= now));
        let unsent = std::mem::take(&mut st.unsent);
        if got == 0 && !look && !released && !unsent {
            // Nothing arrived, changed or fell due: no connection has anything to hand over or
            // to send (the polling loop's usual round, kept short: a frame that lands during it
            // waits for the next look).
            return (0, 0);
        }
        // What arrived is handed over first. An application thread handed a notification or a
        // message goes back to its caller at once (it usually replies, and the reply carries
        // the held answers); timers and sending wait for the next round, which follows at
        // once, as this shortcut is never taken twice in a row.
        let handed = self.dispatch(st, app.then_some(now + ANSWER_HOLD_US));
        st.holding = app && handed;
        let shortcut = app && handed && !st.shortcut;
        st.shortcut = shortcut;
        if shortcut {
            st.stale = true;
            return (got, 0);
        }
        let mut fired = false;
        let mut due = None;
        if look {
            for s in st.slots.values_mut() {
                match s.conn.poll_timeout() {
                    Some(t) if t <= now => {
                        s.conn.handle_timeout(now, target);
                        fired = true;
                    }
                    t => due = earliest(due, t),
                }
            }
            if fired {
                self.dispatch(st, None);
            }
        }
        let sent = self.transmit(st, now, io);
        if look && !fired && sent == 0 {
            st.due = due;
            st.stale = false;
        } else if look || got > 0 || sent > 0 {
            st.stale = true;
        }
        (got, sent)
    }

    /// Make progress from a waiting application thread (busy polling), if the network thread
    /// is not at it right now. True when something was received or sent.
    pub(crate) fn pump(&self) -> bool {
        let now = self.now();
        let Ok(mut st) = self.state.try_lock() else {
            // Polling all the same: the network thread stays out of the way.
            self.last_pump_us.store(now, Ordering::Relaxed);
            return false;
        };
        self.pump_locked(&mut st, now)
    }

    /// [`EdgeEndpoint::pump`] with the state in hand, at `now`.
    fn pump_locked(&self, st: &mut State, now: proto::Time) -> bool {
        self.last_pump_us.store(now, Ordering::Relaxed);
        let mut io = lock(&self.app_io);
        let mut target = FabricTarget { fabric: &self.fabric };
        let (got, sent) = self.round(st, &mut io, &mut target, now, true);
        got + sent > 0
    }

    /// Make the network thread's looks while an application thread polls this far apart.
    #[cfg(test)]
    pub(crate) fn set_watch(&self, d: Duration) {
        for w in &self.watch_us {
            w.store(d.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// The network thread only watches a polling application thread.
    #[cfg(test)]
    pub(crate) fn is_watching(&self) -> bool {
        self.watching.load(Ordering::SeqCst)
    }

    /// An application thread pumped within [`PUMP_RECENT_US`] of `now`.
    fn polled_lately(&self, now: proto::Time) -> bool {
        now.saturating_sub(self.last_pump_us.load(Ordering::SeqCst)) < PUMP_RECENT_US
    }

    /// The network thread: works while there is work, looks again for [`NET_SPIN`] after it,
    /// then blocks until a frame arrives, a timer is due or an operation is submitted. Latency
    /// comes from the waiting application threads, which poll (see [`EdgeEndpoint::pump`]);
    /// while one does, this thread leaves it the sockets and the core (see [`PUMP_WATCH`]).
    fn run(self: Arc<Self>) {
        let mut io = Io::new(self.socks.len());
        let mut target = FabricTarget { fabric: &self.fabric };
        let mut last_work = Instant::now();
        let watch_us = |i: usize| Duration::from_micros(self.watch_us[i].load(Ordering::Relaxed));
        let mut watch = watch_us(0);
        loop {
            let stopping = self.stop.load(Ordering::SeqCst);
            if !stopping && self.polled_lately(self.now()) {
                // Said before looking again: a thread that stops polling after the look below
                // sees it and wakes this one (see `Drive::rest`).
                self.watching.store(true, Ordering::SeqCst);
                if self.polled_lately(self.now()) {
                    rackwire_udp::wait(&[], &self.waker, Some(watch));
                    watch = (watch * 2).min(watch_us(1));
                }
                self.watching.store(false, Ordering::SeqCst);
                continue;
            }
            watch = watch_us(0);
            let mut st = lock(&self.state);
            let (got, sent) = self.round(&mut st, &mut io, &mut target, self.now(), false);
            let next = st.next_due();
            let now = self.now();
            let wait = next.map_or(IDLE_WAIT_MAX, |t| Duration::from_micros(t.saturating_sub(now)).min(IDLE_WAIT_MAX));
            let idle = !(stopping || got > 0 || sent > 0);
            if idle {
                // Published under the state lock: a submission after this sees it.
                self.parked_until_us.store(now + wait.as_micros() as u64, Ordering::SeqCst);
            }
            drop(st);
            if stopping {
                return;
            }
            if !idle {
                last_work = Instant::now();
                continue;
            }
            // An application thread started polling: it does the work now (see the top).
            if self.polled_lately(now) {
                self.parked_until_us.store(AWAKE, Ordering::SeqCst);
                continue;
            }
            // In a stream, the next acknowledgement or frame is usually microseconds away:
            // look again for a moment before paying for a sleep and a wake-up.
            if last_work.elapsed() < NET_SPIN {
                self.parked_until_us.store(AWAKE, Ordering::SeqCst);
                std::hint::spin_loop();
                continue;
            }
            rackwire_udp::wait(&self.socks, &self.waker, Some(wait));
            self.parked_until_us.store(AWAKE, Ordering::SeqCst);
        }
    }

    /// A frame arrived on link `l` from `from`: find (or open) its connection and feed it.
    /// True when the connection has events to hand over.
    fn deliver(
        &self,
        st: &mut State,
        l: usize,
        frame: &[u8],
        from: SocketAddr,
        now: proto::Time,
        target: &mut FabricTarget<'_>,
    ) -> bool {
        if frame.len() < HEADER_LEN {
            return false;
        }
        let conn_id = u32::from_be_bytes([frame[8], frame[9], frame[10], frame[11]]);
        let local = if conn_id == 0 && FrameKind::from(frame[3]) == FrameKind::Handshake {
            // A first handshake frame: whose, and how many links.
            let Ok(h) = HandshakeRepr::parse(&frame[HEADER_LEN..]) else { return false };
            if h.to != self.me {
                return false;
            }
            match st.accepted.get(&(h.from, h.conn)) {
                Some(&local) => local,
                None => {
                    let links = (h.links as usize).min(self.socks.len());
                    if l >= links {
                        return false;
                    }
                    let local = st.next_local;
                    st.next_local += 1;
                    let conn = Connection::accept(
                        self.proto_config(links),
                        self.me,
                        &self.secret,
                        rackwire_mh::auth::nonce(),
                        local,
                        now,
                    );
                    st.accepted.insert((h.from, h.conn), local);
                    st.slots.insert(local, Slot::new(conn, h.from, vec![None; links], false));
                    local
                }
            }
        } else {
            conn_id
        };
        let Some(s) = st.slots.get_mut(&local) else { return false };
        if let Some(a) = s.addrs.get_mut(l) {
            *a = Some(from);
        }
        s.conn.handle_frame(now, l, frame, target);
        s.conn.has_events()
    }

    /// Send what every connection has to send, batched per link (a batch goes out once it
    /// holds [`SEND_BATCH_MAX`] frames or [`TX_FLUSH_BYTES`]), through the fault injector where one is configured.
    fn transmit(&self, st: &mut State, now: proto::Time, io: &mut Io) -> usize {
        let mut sent = 0;
        let State { slots, faults, .. } = st;
        for s in slots.values_mut() {
            while let Some(t) = s.conn.poll_transmit_split(now, &mut io.out) {
                let Some(Some(addr)) = s.addrs.get(t.link) else { continue };
                let Some(q) = io.tx.get_mut(t.link) else { continue };
                let at = q.heads.len();
                q.heads.extend_from_slice(&io.out[..t.head_len]);
                q.bytes += t.head_len + t.body.as_ref().map_or(0, Bytes::len);
                q.frames.push((at, t.head_len, t.body, *addr));
                if q.frames.len() >= SEND_BATCH_MAX || q.bytes >= TX_FLUSH_BYTES {
                    sent += self.flush(t.link, q, faults);
                }
            }
        }
        for (l, q) in io.tx.iter_mut().enumerate() {
            if !q.frames.is_empty() {
                sent += self.flush(l, q, faults);
            }
        }
        sent
    }

    /// Send one link's gathered frames and empty its queue (keeping the buffers).
    fn flush(&self, l: usize, q: &mut TxLink, faults: &mut [Option<FaultInjector>]) -> usize {
        let result = match faults.get_mut(l).and_then(Option::as_mut) {
            Some(fi) => {
                // Faults act on whole frames: join the parts (a test path, not a fast one).
                let mut faulty: Vec<(Vec<u8>, SocketAddr)> = Vec::with_capacity(q.frames.len());
                for (at, len, body, addr) in &q.frames {
                    let mut f = q.heads[*at..*at + *len].to_vec();
                    if let Some(b) = body {
                        f.extend_from_slice(b);
                    }
                    let mut outs = Vec::new();
                    fi.apply(&f, &mut outs);
                    faulty.extend(outs.into_iter().map(|o| (o, *addr)));
                }
                let list: Vec<OutFrame<'_>> =
                    faulty.iter().map(|(f, a)| OutFrame { head: f, body: &[], to: *a }).collect();
                self.socks[l].send_batch(&list)
            }
            None if q.frames.len() == 1 => {
                // One frame (the latency case): nothing to gather.
                let (at, len, body, addr) = &q.frames[0];
                let f = OutFrame { head: &q.heads[*at..*at + *len], body: body.as_deref().unwrap_or(&[]), to: *addr };
                self.socks[l].send_batch(std::slice::from_ref(&f))
            }
            None => {
                let list: Vec<OutFrame<'_>> = q
                    .frames
                    .iter()
                    .map(|(at, len, body, addr)| OutFrame {
                        head: &q.heads[*at..*at + *len],
                        body: body.as_deref().unwrap_or(&[]),
                        to: *addr,
                    })
                    .collect();
                self.socks[l].send_batch(&list)
            }
        };
        q.heads.clear();
        q.frames.clear();
        q.bytes = 0;
        match result {
            Ok(n) => n,
            Err(e) => {
                warn!(link = l, "send: {e}");
                0
            }
        }
    }

    /// Turn connection events into completed handles, messages and notifications, and ring
    /// this node's doorbell for a message or notification. True when there was one. With
    /// `hold`, a connection that delivered one holds its answers until then.
    fn dispatch(&self, st: &mut State, hold: Option<proto::Time>) -> bool {
        let mut woke = false;
        let mut register = Vec::new();
        let mut gone = Vec::new();
        for (&local, s) in st.slots.iter_mut() {
            let mut handed = false;
            while let Some(e) = s.conn.poll_event() {
                match e {
                    Event::Connected { peer } => {
                        s.connected = true;
                        s.peer = peer;
                        if !s.registered {
                            s.registered = true;
                            register.push((local, peer));
                        }
                    }
                    Event::Completed { op, result } => {
                        if let Some(p) = s.pending.remove(&op) {
                            p.cell.complete(completion(s.peer, &p, result));
                        }
                    }
                    Event::Message { data } => {
                        s.msg_bytes += data.len();
                        s.msgs.push_back(data);
                        handed = true;
                    }
                    Event::Notification { region, offset, len, imm } => {
                        s.notes.push_back(Notification { from: s.peer, region, offset, len, imm });
                        handed = true;
                    }
                    Event::LinkDown(l) => warn!(peer = s.peer, link = l, "edge link down"),
                    Event::LinkUp(l) => debug!(peer = s.peer, link = l, "edge link up"),
                    Event::Closed(why) => {
                        debug!(peer = s.peer, ?why, "edge connection closed");
                        s.closed = true;
                        for (_, p) in s.pending.drain() {
                            p.cell.complete(Err(Error::PeerGone(s.peer)));
                        }
                        gone.push(local);
                    }
                }
            }
            if handed {
                s.refresh_room();
                woke = true;
                if let Some(t) = hold {
                    s.conn.hold_answers(t);
                }
            }
        }
        for local in gone {
            if let Some(s) = st.slots.get(&local) {
                // Keep queued messages readable; drop the slot once drained by the reader.
                if s.msgs.is_empty() && s.notes.is_empty() && !s.registered {
                    st.slots.remove(&local);
                }
            }
            st.accepted.retain(|_, l| *l != local);
        }
        let up = || Some((self.fabric.upgrade()?, self.this.upgrade()?));
        if let Some((f, ep)) = (!register.is_empty()).then(up).flatten() {
            for (local, peer) in register {
                let p: Arc<dyn PeerTransport> = Arc::new(EdgePeer { ep: ep.clone(), local, peer });
                if let Err(e) = f.add_peer(p) {
                    warn!(peer, "edge connection not registered: {e}");
                }
            }
        }
        if woke {
            if let Some(f) = self.fabric.upgrade() {
                f.doorbell.ring_local();
            }
        }
        woke
    }
}

impl Drive for EdgeEndpoint {
    fn drive(&self) -> bool {
        self.pump()
    }

    /// The network thread takes over at once if it only watches: it would otherwise look again
    /// only after up to [`PUMP_WATCH_MAX`].
    fn rest(&self) {
        self.last_pump_us.store(0, Ordering::SeqCst);
        if self.watching.load(Ordering::SeqCst) {
            self.waker.wake();
        }
    }
}

fn completion(peer: NodeId, p: &Pending, r: Result<proto::Completion, OpError>) -> Result<Completion, Error> {
    match r {
        Ok(proto::Completion::Done) => Ok(Completion::Done),
        Ok(proto::Completion::Data(d)) => Ok(Completion::Data(d)),
        Ok(proto::Completion::Value(v)) => Ok(Completion::Value(v)),
        Err(OpError::Refused(why)) => Err(match why {
            proto::Refusal::Ungranted => Error::Ungranted { region: p.region, needed: p.need },
            proto::Refusal::Revoked => Error::Revoked { region: p.region },
            proto::Refusal::BadKey => Error::BadKey { region: p.region },
            proto::Refusal::UnknownRegion => Error::UnknownRegion { node: peer, region: p.region },
            proto::Refusal::OutOfBounds => {
                Error::OutOfBounds { region: p.region, offset: p.offset, len: p.len, region_len: 0 }
            }
            proto::Refusal::Misaligned => Error::Misaligned { offset: p.offset },
            proto::Refusal::TooLarge => Error::MessageTooLarge { len: p.len as usize, max: crate::MESSAGE_BYTES_MAX },
            proto::Refusal::Other(_) => Error::Timeout,
        }),
        Err(OpError::Timeout) => Err(Error::Timeout),
        Err(OpError::Closed | OpError::NotConnected) => Err(Error::PeerGone(peer)),
        Err(OpError::Limit) => Err(Error::Limit("edge operation limit".into())),
    }
}

/// A connection over the edge transport, as the public API sees it.
pub(crate) struct EdgePeer {
    ep: Arc<EdgeEndpoint>,
    local: u32,
    peer: NodeId,
}

/// `len` bytes at `offset` lie inside the region as its handle announces it.
fn fits(t: &RemoteRegion, offset: u64, len: usize) -> Result<(), Error> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= t.len => Ok(()),
        _ => Err(Error::OutOfBounds { region: t.region, offset, len: len as u64, region_len: t.len }),
    }
}

fn flags(f: OpFlags) -> proto::OpFlags {
    proto::OpFlags { notify: f.notify, fence_before: f.fence_before, fence_after: f.fence_after }
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
        let cell = Arc::new(OpCell::with_driver(self.ep.clone(), self.ep.busy_poll));
        {
            let mut st = lock(&self.ep.state);
            let now = self.ep.now();
            let Some(s) = st.slots.get_mut(&self.local).filter(|s| !s.closed) else {
                return Op::ready(Err(Error::PeerGone(self.peer)));
            };
            match go(&mut s.conn, now) {
                Ok(id) => {
                    s.pending.insert(id, Pending { cell: cell.clone(), region, offset, len, need });
                }
                Err(OpError::Limit) => return Op::ready(Err(Error::Limit("edge operation limit or size".into()))),
                Err(_) => return Op::ready(Err(Error::PeerGone(self.peer))),
            }
            // Send what the windows allow now, from this thread, instead of handing the
            // operation to the network thread: no wake-up on the way out. But a small operation
            // submitted while frames are in flight is left for whoever drives the endpoint next,
            // which sends the operations gathered meanwhile several to a frame (one system
            // call, and one for the peer, instead of one each): a thread that polls (most
            // likely this one, waiting for its operations; one that stops to sleep hands over
            // to the network thread at once), or the network thread when it is at work. A
            // network thread that sleeps, or only looks in now and then, gets it sent inline.
            let gather = st.slots.get(&self.local).is_some_and(|s| s.conn.worth_gathering())
                && (self.ep.polled_lately(now)
                    || (self.ep.parked_until_us.load(Ordering::SeqCst) == AWAKE
                        && !self.ep.watching.load(Ordering::SeqCst)));
            st.unsent |= gather;
            if !gather {
                let mut io = lock(&self.ep.app_io);
                self.ep.transmit(&mut st, now, &mut io);
                drop(io);
            }
            // Wake the network thread only if this connection now needs it before it would
            // wake anyway (a timer armed by the new frames, or frames the windows held back).
            let due = st.slots.get(&self.local).and_then(|s| s.conn.poll_timeout());
            // Only this connection changed: its deadline keeps `due` a lower bound.
            st.due = earliest(st.due, due);
            let parked = self.ep.parked_until_us.load(Ordering::SeqCst);
            if parked != AWAKE && due.is_some_and(|t| t < parked) {
                self.ep.waker.wake();
            }
        }
        Op::pending(cell)
    }

    fn atomic(&self, t: &RemoteRegion, offset: u64, op: proto::AtomicOp, f: OpFlags) -> Op {
        if !offset.is_multiple_of(8) {
            return Op::ready(Err(Error::Misaligned { offset }));
        }
        let r = match self.check(t) {
            Ok(r) => r,
            Err(e) => return Op::ready(Err(e)),
        };
        self.submit(t.region, offset, 8, Access::ATOMIC, |c, now| c.atomic(now, r, offset, op, flags(f)))
    }

    /// Something queued for the application (a message, a notification), driving the endpoint
    /// first only when nothing is queued yet: what an earlier round queued is handed over
    /// without another round (which would also send the answers held for the reply).
    /// Nor when some thread drove it within the last microsecond: a receiver looking at many
    /// peers of one endpoint drives it once per look, not once per peer.
    fn take<T>(&self, mut f: impl FnMut(&mut Slot) -> Option<T>) -> Option<T> {
        let mut st = lock(&self.ep.state);
        if let Some(v) = st.slots.get_mut(&self.local).and_then(&mut f) {
            return Some(v);
        }
        let now = self.ep.now();
        if now == self.ep.last_pump_us.load(Ordering::Relaxed) {
            return None;
        }
        self.ep.pump_locked(&mut st, now);
        st.slots.get_mut(&self.local).and_then(f)
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
        lock(&self.ep.state).slots.get(&self.local).is_some_and(|s| !s.closed)
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
        let first =
            (!data.is_empty()).then(|| self.write(t, offset, data, OpFlags { notify: None, fence_after: false, ..f }));
        // The update only once the data is placed: fenced behind it. A `Set` is an aligned
        // 8-byte write, which the target places with one store.
        let fl = OpFlags { fence_before: f.fence_before || first.is_some(), ..f };
        let update = match signal.op {
            SignalOp::Set(v) => self.write(t, signal.offset, &v.to_le_bytes(), fl),
            SignalOp::Add(v) => self.fetch_add(t, signal.offset, v, fl),
        };
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
        self.atomic(t, offset, proto::AtomicOp::CompareSwap { expected, new }, f)
    }

    fn fetch_add(&self, t: &RemoteRegion, offset: u64, add: u64, f: OpFlags) -> Op {
        self.atomic(t, offset, proto::AtomicOp::FetchAdd(add), f)
    }

    fn send(&self, msg: &[u8]) -> Op {
        self.submit(0, 0, msg.len() as u64, Access::NONE, |c, now| c.send(now, msg, proto::OpFlags::default()))
    }

    fn try_recv(&self, out: &mut Vec<u8>) -> Result<bool, Error> {
        match self.take(Slot::next_message) {
            Some(m) => {
                *out = m;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn try_notification(&self) -> Result<Option<Notification>, Error> {
        Ok(self.take(Slot::next_note))
    }

    fn unmap(&self, _region: RegionId, _timeout: Duration) -> bool {
        // Nothing is mapped: every frame is checked against the grant table as it arrives.
        true
    }

    fn cut_off(&self) {
        {
            let mut st = lock(&self.ep.state);
            let now = self.ep.now();
            if let Some(s) = st.slots.get_mut(&self.local) {
                s.conn.close(now);
            }
            st.stale = true;
        }
        self.ep.waker.wake();
    }

    fn stats(&self) -> ConnStats {
        let st = lock(&self.ep.state);
        let Some(s) = st.slots.get(&self.local) else { return ConnStats::default() };
        let p = s.conn.stats();
        ConnStats {
            refused: p.refused,
            bytes_written: p.bytes_written,
            frames_sent: p.frames_sent,
            frames_received: p.frames_received,
            data_frames: p.data_frames,
            retransmits: p.retransmits,
            out_of_order: p.out_of_order,
            duplicates: p.duplicates,
            acks_sent: p.acks_sent,
            nacks_sent: p.nacks_sent,
            malformed: p.malformed,
            receiver_full: p.receiver_full,
            losses: p.links.iter().map(|l| l.losses).sum(),
            loss_timeouts: p.links.iter().map(|l| l.timeouts).sum(),
            window_cuts: p.links.iter().map(|l| l.cuts).sum(),
            cuts_undone: p.links.iter().map(|l| l.undone_cuts).sum(),
            frame_max: s.conn.frame_max() as u64,
            ..ConnStats::default()
        }
    }
}

impl Drop for EdgePeer {
    fn drop(&mut self) {
        // The fabric's table holds the other reference of a registered peer; once the last
        // handle of a closed connection goes, forget its slot.
        if let Ok(mut st) = self.ep.state.try_lock() {
            if st.slots.get(&self.local).is_some_and(|s| s.closed) {
                st.slots.remove(&self.local);
            }
        }
    }
}
