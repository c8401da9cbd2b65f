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

mod io;
mod peer;
mod pump;
mod target;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rackwire_proto::{self as proto, Bytes, Connection, OpError};
use rackwire_udp::{FaultInjector, LinkSocket, OutFrame, RecvBufs, Waker, SEND_BATCH_MAX};
use tracing::{debug, warn};

use io::Io;
use peer::completion;
pub(crate) use peer::EdgePeer;
use proto::driver::limits::{RTO_MIN_US, TX_FLUSH_BYTES};
use proto::driver::{HandOff, Rounds};
use target::FabricTarget;

use crate::config::LINK_MTU_MIN;
use crate::node::{MessageHandler, Node};
use crate::op::{Drive, OpCell};
use crate::sync::lock;
use crate::transport::PeerTransport;
use crate::{
    Access, BatchOptions, Completion, ConnStats, Error, NodeId, NodeInfo, Notification, Op, OpFlags, RegionId,
    RemoteRegion, Signal, SignalOp, CONNECT_TIMEOUT,
};

/// Bytes of messages received and not yet read, per connection, as the shared-memory
/// transport's message ring holds: a sender to a receiver that does not read is held back
/// (its frames are dropped unacknowledged and sent again later) and its sends time out as they
/// would on shared memory.
const MESSAGES_QUEUED_BYTES: usize = crate::MESSAGE_RING_BYTES as usize;
/// Notifications not yet taken, per connection (a write or read asking for one more waits).
const NOTES_QUEUED_MAX: usize = 4096;

/// What an operation handle needs to turn a refusal into its error.
struct Pending {
    cell: Arc<OpCell>,
    region: RegionId,
    offset: u64,
    len: u64,
    need: Access,
}

/// The connections as the endpoint keeps them.
type Conns = proto::Endpoint<SocketAddr, Pending>;

/// A notification as the API hands it over.
fn notification(peer: NodeId, n: proto::Note) -> Notification {
    Notification { from: peer, region: n.region, offset: n.offset, len: n.len, imm: n.imm }
}

struct State {
    /// The connections, by local connection id (chosen here), and how frames find them.
    conns: Conns,
    /// What rounds keep between them (the driver's).
    rounds: Rounds,
    /// What this transport keeps besides.
    side: Side,
}

/// What the edge transport keeps beside the connections and the driver's rounds.
struct Side {
    faults: Vec<Option<FaultInjector>>,
    /// Connections that closed, removed (or kept for their undelivered messages) after the
    /// next sending, which carries their close.
    closing: Vec<u32>,
    /// When the management host was last asked whether the peer of a connection that cannot
    /// reach it is gone, by connection.
    gone_asked: proto::OwnIdMap<u32, proto::Time>,
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
    /// The fabric secret, this node's key pair, and whether it wants frames sealed.
    creds: proto::Credentials,
    mtu: usize,
    busy_poll: Duration,
    /// The network thread's spin after work, if fixed (see [`crate::Config::net_spin`]).
    net_spin: Option<Duration>,
    /// Frames delivered in the order they were sent (see [`crate::FabricConfig::in_order`]).
    in_order: bool,
    op_timeout: Duration,
    /// The peer timeout (see [`crate::PEER_TIMEOUT_DEFAULT`]).
    peer_timeout: Duration,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Buffers for application threads (pumping, submitting).
    app_io: Mutex<Io>,
    /// Who drives the endpoint when: what application threads and the network thread tell
    /// each other without the state's lock.
    hand: HandOff,
    /// Messages taken from their connections for the fabric's edge message handler, in the
    /// order they arrived, to be handed over once the state's lock is released (at most what
    /// one round receives: whoever ran the round hands them over right after it).
    handed: Mutex<Vec<(NodeId, Vec<u8>)>>,
    /// Whether `handed` holds any (changed under its lock): every round looks, and most find
    /// none, so the look is a load, not a lock.
    handed_any: AtomicBool,
    /// Held while handing messages over, so two threads that ran rounds one after the other
    /// hand theirs over in that order; it holds the messages being handed over (it trades
    /// places with `handed`, and is empty between hand-overs).
    handing: Mutex<Vec<(NodeId, Vec<u8>)>>,
    /// The fabric's edge message handler, kept here once found there (it is set once): each
    /// message handed over asked the fabric for it several times.
    handler: OnceLock<MessageHandler>,
    /// How often a connection of this endpoint closed, or was told to: a peer's liveness,
    /// once looked up under the state's lock, holds while this count stays put (the receive
    /// calls ask on every look, and must not wait for a round to ask).
    closings: AtomicU64,
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
        let waker = Waker::new().map_err(|e| Error::sys("creating the edge transport's waker", &e))?;
        let mut conns = Conns::new(f.id, socks.len());
        conns.set_delivery_room(MESSAGES_QUEUED_BYTES, NOTES_QUEUED_MAX);
        conns.start_ids_at(rackwire_mh::auth::random_u128() as u32);
        // First frames under load get a stateless Retry first (see `Endpoint::set_retry_key`).
        let key = [rackwire_mh::auth::random_u128().to_le_bytes(), rackwire_mh::auth::random_u128().to_le_bytes()];
        let mut retry_key = [0u8; 32];
        retry_key[..16].copy_from_slice(&key[0]);
        retry_key[16..].copy_from_slice(&key[1]);
        conns.set_retry_key(retry_key);
        let ep = Arc::new_cyclic(|this| EdgeEndpoint {
            this: this.clone(),
            socks,
            waker,
            state: Mutex::new(State {
                conns,
                rounds: Rounds::new(),
                side: Side { faults, closing: Vec::new(), gone_asked: Default::default() },
            }),
            fabric: f.weak.clone(),
            start: Instant::now(),
            stop: AtomicBool::new(false),
            me: f.id,
            creds: proto::Credentials {
                seal: cfg.seal_frames,
                ..proto::Credentials::new(&cfg.secret, f.identity.clone())
            },
            mtu,
            busy_poll: cfg.busy_poll,
            net_spin: cfg.net_spin,
            in_order: cfg.in_order,
            op_timeout: cfg.op_timeout,
            peer_timeout: cfg.peer_timeout,
            thread: Mutex::new(None),
            app_io: Mutex::new(Io::new(cfg.links.len())),
            hand: HandOff::new(),
            handed: Mutex::new(Vec::new()),
            handed_any: AtomicBool::new(false),
            closings: AtomicU64::new(0),
            handing: Mutex::new(Vec::new()),
            handler: OnceLock::new(),
        });
        let runner = ep.clone();
        let h = std::thread::Builder::new()
            .name("rw-edge".into())
            .spawn(move || runner.run())
            .map_err(|e| Error::sys("starting the edge transport's thread", &e))?;
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
        c.idle_timeout_us = self.peer_timeout.as_micros() as proto::Time;
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
        c.rto_min_us = RTO_MIN_US;
        c.in_order = self.in_order;
        c
    }

    /// Send what the connections owe their peers now, answers held for a reply included (the
    /// reply will not come): before closing, so that a peer waiting for an operation's outcome
    /// learns it was done, not that the connection closed (a closing connection drops what it
    /// owes).
    pub(crate) fn send_owed(&self) {
        let mut st = lock(&self.state);
        st.conns.release_holds();
        self.transmit_here(&mut st, self.now());
    }

    /// Send the datagrams application threads held (see [`EdgeEndpoint::send_datagram_here`]),
    /// and what the connections have to send besides.
    pub(crate) fn send_held(&self) {
        let mut st = lock(&self.state);
        self.transmit_here(&mut st, self.now());
    }

    /// [`EdgeEndpoint::transmit`] from an application thread (the state's lock held), with
    /// that thread's buffers.
    fn transmit_here(&self, st: &mut State, now: proto::Time) -> usize {
        let mut io = lock(&self.app_io);
        self.transmit(&mut st.conns, &mut st.side, now, &mut io)
    }

    /// Stop the network thread and close every connection.
    pub(crate) fn shutdown(&self) {
        {
            let mut st = lock(&self.state);
            let now = self.now();
            for s in st.conns.sessions_mut() {
                s.conn_mut().close(now);
            }
            self.closings.fetch_add(1, Ordering::Release);
            st.rounds.touch();
        }
        // One last round sends the closes.
        self.stop.store(true, Ordering::SeqCst);
        self.waker.wake();
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
    }

    /// Open a connection to `info`, whose node key is `key`, and wait for its handshake.
    pub(crate) fn connect(
        self: &Arc<Self>,
        info: &NodeInfo,
        key: rackwire_mh::identity::PublicKey,
    ) -> Result<Arc<dyn PeerTransport>, Error> {
        let addrs: Vec<SocketAddr> = info.links.iter().filter_map(|a| a.parse().ok()).collect();
        let links = addrs.len().min(self.socks.len());
        if links == 0 {
            return Err(Error::Unreachable { node: info.id, why: "no Ethernet link in common".into() });
        }
        let local = {
            let mut st = lock(&self.state);
            st.rounds.touch();
            let now = self.now();
            let open = |local| {
                let cfg = self.proto_config(links);
                let nonce = rackwire_mh::auth::nonce();
                Connection::connect(cfg, self.me, info.id, &self.creds, key, nonce, local, now)
            };
            let at = addrs.iter().take(links).map(|a| Some(*a)).collect();
            st.conns.open(info.id, at, open).ok_or(Error::Limit(crate::Limit::EdgeConnections))?
        };
        self.waker.wake();
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            {
                let mut st = lock(&self.state);
                let s = st.conns.get(local).ok_or(Error::PeerGone(info.id))?;
                if s.is_connected() {
                    break;
                }
                if s.is_closed() || Instant::now() > deadline {
                    st.conns.remove(local);
                    return Err(Error::Unreachable {
                        node: info.id,
                        why: "the edge handshake did not complete (peer down, or one end refused the other's secret or node key)"
                            .into(),
                    });
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(Arc::new(EdgePeer::new(self.clone(), local, info.id)))
    }
}

impl Drive for EdgeEndpoint {
    fn drive(&self) -> bool {
        self.pump()
    }

    fn flush(&self) {
        let mut st = lock(&self.state);
        if st.rounds.take_unsent(&self.hand) {
            self.transmit_here(&mut st, self.now());
        }
    }

    /// The network thread takes over at once if it only watches (see [`HandOff::rest`]).
    fn rest(&self) {
        if self.hand.rest() {
            self.waker.wake();
        }
    }
}
