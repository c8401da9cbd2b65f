//! rackwire's IP-over-fabric virtual NIC.
//!
//! A node agent opens the TUN device `rw0` with a 64 KiB-class MTU and carries the IP packets
//! the kernel routes into it to the fabric peer that owns the destination address, as fabric
//! messages: through shared memory to peers in the same rack (one ring per sender in the
//! receiver's memory, managed by the sender, doorbells coalesced under load) and through the
//! edge transport to peers reached only over Ethernet. Packets from peers are written back into
//! `rw0`.
//!
//! Routing is Marlin's hybrid switch done with host routes: for every address of every peer
//! that runs a virtual NIC, a `/32` route through `rw0` (with this host's address on the same
//! rail as source), so unmodified programs that connect to a peer's ordinary address use the
//! fabric; everything else keeps the Ethernet routes. A peer whose agent goes away loses its
//! routes (its traffic falls back to Ethernet, same addresses, so TCP connections carry on);
//! when this agent stops, `rw0` and every route through it disappear with it, also after a
//! crash.

#![deny(unsafe_code)]

mod check;
mod relay;
// The TUN ioctl is the one place that needs `unsafe`.
#[allow(unsafe_code)]
mod tun;

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rackwire::{Access, Conn, Fabric, NodeId, Op, Region};
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

pub use check::{check_from_peer, ipv4_of, routable, RxRefusal};
pub use relay::{RelayEnd, TunRelay, RELAY_NAME};
pub use tun::{Tun, IFNAME_MAX, VNET_HDR_LEN};

/// The virtual NIC's interface name.
pub const VNIC_NAME: &str = "rw0";
/// Its MTU, and the largest packet the kernel may hand over with segmentation offload: IP
/// packets up to this size, with their offload header, cross the fabric whole as one message
/// (which carries up to [`rackwire::MESSAGE_BYTES_MAX`]).
pub const VNIC_MTU: usize = 65_520;
const _: () = assert!(VNIC_MTU + VNET_HDR_LEN <= rackwire::MESSAGE_BYTES_MAX);
/// Messages a sender keeps in flight on the edge transport before it waits for the oldest
/// (shared-memory sends complete when they are in the receiver's ring).
pub const TX_INFLIGHT_MAX: usize = 256;
/// The most one read from `rw0` returns: a packet of up to the MTU with its offload header
/// (one byte more, so a longer one would show).
const PACKET_BYTES_MAX: usize = VNET_HDR_LEN + VNIC_MTU + 1;
/// Packets the virtual NIC's thread reads from `rw0` in a row before it looks at the rings.
pub const TX_BATCH: usize = 32;
/// Packets it takes from the rings in a row before it reads `rw0` again.
pub const RX_BATCH: usize = 32;
/// How long the virtual NIC's thread keeps looking for packets after its last one, yielding
/// its core between looks, before it sleeps: a reply (the pong of a ping-pong, a TCP
/// acknowledgement) usually comes within it, and is taken without a wake-up on either side
/// (64 B ping-pong over rw0 in one rack: 26 µs p50 against 13.4–15.2 with it, the veth's 11.5;
/// alternated three times, docs/benchmarks.md). Only after work: an idle agent sleeps.
pub const IO_SPIN: Duration = Duration::from_micros(30);
/// How long the virtual NIC's thread looks again at once (yielding its core) when a peer's
/// ring has no room, before it looks only every [`RING_FULL_NAP`].
const RING_FULL_SPIN: Duration = Duration::from_millis(1);
/// How long it then sleeps between looks (woken sooner by a packet for it).
const RING_FULL_NAP: Duration = Duration::from_millis(1);
/// How long a packet waits for room in its peer's ring before it is dropped (a peer that
/// stopped draining holds up the packets to the others no longer than this, a packet).
const RING_FULL_GIVE_UP: Duration = Duration::from_secs(1);
/// Peers one virtual NIC routes to at most.
pub const PEERS_MAX: usize = 256;
/// The busy poll of an agent that runs a virtual NIC (its fabric's `busy_poll`, unless set
/// otherwise): none. Its threads sleep in the kernel between packets (the virtual NIC's after
/// a short look for a reply, [`IO_SPIN`]) and are woken for each:
/// the edge transport's network thread for frames from other racks (it writes their packets
/// into rw0 itself), the virtual NIC's thread by `rw0` or the doorbell for packets over shared
/// memory. The
/// applications whose packets these are need the cores: with spinning receivers (200 µs), on
/// two cores, 64 B ping-pongs across racks took 48–98 µs p50 against 45–64 without, in one rack
/// 26–39 against 24–31, and TCP over rw0 gave 0.53–0.65 of the veth's against 0.49–0.68 (the
/// veth itself 1.9–3.0 GB/s; alternated five and three times, docs/benchmarks.md).
pub const BUSY_POLL: Duration = Duration::ZERO;
/// How often the agent looks for peers that came or went.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(500);
/// Name prefix under which an agent publishes that it runs a virtual NIC.
pub const VNIC_REGION_PREFIX: &str = "vnic/";
/// How long a thread blocks before it looks whether it should stop.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// What can go wrong setting up the virtual NIC.
#[derive(Debug, thiserror::Error)]
pub enum VnicError {
    /// The TUN device could not be made (needs root, or `CAP_NET_ADMIN`).
    #[error("TUN device {name}: {err} (the virtual NIC needs root or CAP_NET_ADMIN)")]
    Tun {
        /// Interface.
        name: String,
        /// Cause.
        err: std::io::Error,
    },
    /// An `ip` command failed.
    #[error("`ip {args}` failed: {err}")]
    Ip {
        /// Its arguments.
        args: String,
        /// What it said.
        err: String,
    },
    /// The fabric refused something.
    #[error("fabric: {0}")]
    Fabric(#[from] rackwire::Error),
    /// The bare TUN relay (a benchmark's limit row) could not start.
    #[error("TUN relay: {0}")]
    Relay(String),
    /// Nothing to route from: no IPv4 address among the node's links.
    #[error("the node has no IPv4 link address to route from (declare links with RACKWIRE_LINKS)")]
    NoAddress,
}

/// Counters of one peer on `rw0`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCounters {
    /// Fabric node id.
    pub node: NodeId,
    /// Node name.
    pub name: String,
    /// Its addresses routed through `rw0`.
    pub addrs: Vec<Ipv4Addr>,
    /// `shm` or `edge`.
    pub transport: String,
    /// Packets sent to it.
    pub tx_packets: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
    /// Packets received from it.
    pub rx_packets: u64,
    /// Bytes received from it.
    pub rx_bytes: u64,
    /// Packets to it that the fabric did not take (peer gone, timeout).
    pub tx_errors: u64,
}

/// The virtual NIC's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VnicCounters {
    /// Interface name.
    pub ifname: String,
    /// Per peer that has, or had, routes.
    pub peers: Vec<PeerCounters>,
    /// Packets read from `rw0` for an address no peer owns (dropped).
    pub no_route: u64,
    /// Packets that are not well-formed IPv4, in either direction (dropped).
    pub malformed: u64,
    /// Packets delivered from fabric nodes this side has not routed (yet).
    pub rx_unrouted: u64,
    /// Packets from a peer whose source is not one of its own addresses (dropped).
    #[serde(default)]
    pub rx_spoofed: u64,
    /// Packets from a peer with an offload header out of bounds (dropped).
    #[serde(default)]
    pub rx_bad_offload: u64,
    /// Addresses peers registered that are not routed: this node's own, the management
    /// host's, special ones, or another peer's.
    #[serde(default)]
    pub addr_refused: u64,
}

#[derive(Default)]
struct Counts {
    tx_packets: AtomicU64,
    tx_bytes: AtomicU64,
    rx_packets: AtomicU64,
    rx_bytes: AtomicU64,
    tx_errors: AtomicU64,
}

/// Where a packet goes: the connection to its peer, and that peer's counters.
struct Route {
    conn: Conn,
    counts: Arc<Counts>,
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

struct Peer {
    name: String,
    /// Its addresses that are routed through `rw0`, and from which it may send.
    addrs: Vec<Ipv4Addr>,
    conn: Conn,
    counts: Arc<Counts>,
    /// Its routes are installed.
    routed: bool,
}

#[derive(Default)]
struct Table {
    peers: HashMap<NodeId, Peer>,
    by_addr: HashMap<Ipv4Addr, NodeId>,
    /// Who registered each address, as the management host last listed them (to tell a
    /// packet that speaks for another node; nodes of one host share its addresses).
    owners: HashMap<Ipv4Addr, Vec<NodeId>>,
    /// Counters of peers that left, kept for the record.
    gone: Vec<PeerCounters>,
}

struct Shared {
    fabric: Arc<Fabric>,
    tun: Tun,
    my_addrs: Vec<Ipv4Addr>,
    /// The management host's addresses (never routed to a peer).
    mh_addrs: Vec<Ipv4Addr>,
    table: RwLock<Table>,
    stop: AtomicBool,
    no_route: AtomicU64,
    malformed: AtomicU64,
    rx_unrouted: AtomicU64,
    rx_spoofed: AtomicU64,
    rx_bad_offload: AtomicU64,
    addr_refused: AtomicU64,
}

/// A running virtual NIC. Stopping it (or dropping it) removes its routes and `rw0`.
pub struct Vnic {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    _marker: Region,
}

/// Run `ip` with `args`; its complaint as the error.
pub fn ip(args: &[&str]) -> Result<(), VnicError> {
    let out = Command::new("ip").args(args).output().map_err(|e| VnicError::Ip {
        args: args.join(" "),
        err: format!("cannot run ip: {e} (is iproute2 installed?)"),
    })?;
    if !out.status.success() {
        return Err(VnicError::Ip {
            args: args.join(" "),
            err: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// The IPv4 addresses among a node's published link addresses (`ip:port`).
pub fn link_addrs(links: &[String]) -> Vec<Ipv4Addr> {
    let mut v: Vec<Ipv4Addr> = links
        .iter()
        .filter_map(|l| l.parse::<std::net::SocketAddr>().ok())
        .filter_map(|a| match a.ip() {
            std::net::IpAddr::V4(v4) if !v4.is_unspecified() => Some(v4),
            _ => None,
        })
        .collect();
    v.dedup();
    v
}

/// The destination of an IPv4 packet, if it is one (version 4, header and total length
/// consistent with the bytes).
pub fn ipv4_destination(packet: &[u8]) -> Option<Ipv4Addr> {
    if packet.len() < 20 || packet[0] >> 4 != 4 {
        return None;
    }
    let ihl = (packet[0] & 0x0f) as usize * 4;
    let total = u16::from_be_bytes([packet[2], packet[3]]) as usize;
    if ihl < 20 || total < ihl || total != packet.len() {
        return None;
    }
    Some(Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]))
}

impl Vnic {
    /// Create `rw0` in this network namespace and start carrying packets for `fabric`. This
    /// node's addresses are those of its links; it publishes `vnic/<name>` so peers route to it.
    /// `mh`: the management host's addresses (`ip:port`, comma-separated), never routed to a
    /// peer whatever it registers.
    pub fn start(fabric: Arc<Fabric>, links: &[String], mh: &str) -> Result<Vnic, VnicError> {
        let my_addrs = link_addrs(links);
        if my_addrs.is_empty() {
            return Err(VnicError::NoAddress);
        }
        let tun = Tun::create(VNIC_NAME).map_err(|err| VnicError::Tun { name: VNIC_NAME.into(), err })?;
        ip(&["link", "set", "dev", VNIC_NAME, "mtu", &VNIC_MTU.to_string(), "up"])?;
        // Segmentation offload only where the kernel keeps super-packets within one message;
        // else checksum offload alone.
        if ip(&["link", "set", "dev", VNIC_NAME, "gso_max_size", &VNIC_MTU.to_string()]).is_err() {
            tun.set_offload(false).map_err(|err| VnicError::Tun { name: VNIC_NAME.into(), err })?;
        }
        // Packets from peers come in on rw0 with the peer's Ethernet address as source; accept
        // them before the route back is in place. The source is checked here instead: only a
        // peer's own addresses (see `check_from_peer`).
        let _ = std::fs::write(format!("/proc/sys/net/ipv4/conf/{VNIC_NAME}/rp_filter"), "0");
        let marker = fabric.alloc(64, Access::READ)?;
        marker.publish(&format!("{VNIC_REGION_PREFIX}{}", fabric.name()))?;
        let shared = Arc::new(Shared {
            fabric,
            tun,
            my_addrs,
            mh_addrs: ipv4_of(mh),
            table: RwLock::new(Table::default()),
            stop: AtomicBool::new(false),
            no_route: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            rx_unrouted: AtomicU64::new(0),
            rx_spoofed: AtomicU64::new(0),
            rx_bad_offload: AtomicU64::new(0),
            addr_refused: AtomicU64::new(0),
        });
        // Packets over the edge transport go into rw0 from the thread that receives them (the
        // transport's network thread, or one of ours driving it), without a hand-over to the
        // virtual NIC's thread and its wake-up; packets over shared memory wait in their
        // rings for that thread. (A weak reference: the fabric holds the handler.)
        let weak = Arc::downgrade(&shared);
        shared.fabric.set_edge_message_handler(move |from, data| {
            if let Some(s) = weak.upgrade() {
                s.deliver(from, data);
            }
        })?;
        shared.refresh();
        let mut threads = Vec::new();
        for (name, f) in
            [("rw-vnic-io", Shared::io_loop as fn(&Shared)), ("rw-vnic-peers", Shared::refresh_loop as fn(&Shared))]
        {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(&s))
                .map_err(|e| rackwire::Error::sys("starting a virtual NIC thread", &e))?;
            threads.push(h);
        }
        info!(addrs = ?shared.my_addrs, "virtual NIC {VNIC_NAME} up, MTU {VNIC_MTU}");
        Ok(Vnic { shared, threads: Mutex::new(threads), _marker: marker })
    }

    /// Counters, per peer.
    pub fn counters(&self) -> VnicCounters {
        self.shared.counters()
    }

    /// Look for peers now (otherwise every [`REFRESH_INTERVAL`]).
    pub fn refresh(&self) {
        self.shared.refresh();
    }

    /// Stop: threads end, routes go, `rw0` goes when the last handle closes.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let threads: Vec<_> = self.threads.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        let mut table = self.shared.table.write().unwrap_or_else(|e| e.into_inner());
        let peers: Vec<NodeId> = table.peers.keys().copied().collect();
        for node in peers {
            self.shared.forget(&mut table, node);
        }
    }
}

impl Drop for Vnic {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    /// Packets both ways, from one thread: from the kernel to their peers (read from `rw0`),
    /// and from peers to the kernel (written into `rw0` from the shared-memory ring where they
    /// lie). One thread for both, as a bare relay has one per direction: a packet written
    /// into `rw0` often makes the kernel answer at once (a TCP acknowledgement), and the same
    /// thread, still awake, carries the answer without another thread's wake-up. It sleeps
    /// in the kernel on both at once when neither has had work for [`IO_SPIN`].
    fn io_loop(&self) {
        let mut buf = vec![0u8; PACKET_BYTES_MAX];
        let mut inflight: VecDeque<(Op, Arc<Counts>)> = VecDeque::new();
        // The peer over shared memory the last packet went to: the next packet is read from
        // `rw0` straight into its ring (most packets go where the last one went).
        let mut guess: Option<Route> = None;
        let mut last_work = Instant::now();
        // A packet in `buf` whose peer's ring had no room, and since when rings were full.
        let mut pending: Option<usize> = None;
        let mut full_since: Option<Instant> = None;
        while !self.stop.load(Ordering::Relaxed) {
            let mut worked = false;
            let mut full = false;
            for _ in 0..TX_BATCH {
                let read = match (pending.take(), &guess) {
                    (Some(n), _) => Ok(Read::Here(n)),
                    (None, Some(route)) => self.read_into(route, &mut buf),
                    (None, None) => {
                        self.tun.try_read(&mut buf).map(|n| if n == 0 { Read::Nothing } else { Read::Here(n) })
                    }
                };
                match read {
                    Ok(Read::Nothing) => break,
                    Ok(Read::NoRoom) => {
                        full = true;
                        break;
                    }
                    Ok(Read::Sent(_)) => worked = true,
                    Ok(Read::Here(n)) => match self.carry(&buf[..n], &mut inflight) {
                        Carried::NoRoom => {
                            pending = Some(n);
                            full = true;
                            break;
                        }
                        Carried::Done(route) => {
                            worked = true;
                            guess = route;
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
                        std::thread::sleep(STOP_CHECK);
                        break;
                    }
                }
            }
            match self.fabric.recv_waiting_with(RX_BATCH, |from, data| self.deliver(from, data)) {
                Ok(n) => worked |= n > 0,
                Err(rackwire::Error::Closed) => return,
                Err(e) => debug!("fabric receive: {e}"),
            }
            if !full {
                full_since = None;
            }
            if worked {
                last_work = Instant::now();
                continue;
            }
            if full {
                // The peer's ring has no room (its doorbell rang: it drains). Ours are drained
                // meanwhile (the peer may be waiting for room in them), and `rw0` is not read
                // further: its queue holds the packets, and drops past its length, as a NIC's.
                let since = *full_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= RING_FULL_GIVE_UP {
                    // A peer that stopped draining holds up the others for this long a packet
                    // at most: its packet is dropped (counted), the next ones read the plain way.
                    if let Some(n) = pending.take() {
                        self.count_unsent(&buf[..n]);
                    }
                    guess = None;
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
            if last_work.elapsed() < IO_SPIN {
                std::thread::yield_now();
                continue;
            }
            match self.fabric.wait_input(&[self.tun.as_fd()], STOP_CHECK) {
                Ok(()) => {}
                Err(rackwire::Error::Closed) => return,
                Err(e) => debug!("waiting for packets: {e}"),
            }
        }
    }

    /// One packet read from `rw0` to the peer that owns its destination. Edge sends complete
    /// later: a bounded number stays in flight. Returns the route taken when it is over shared
    /// memory (the next packet is read straight into its ring), or that its ring had no room
    /// (nothing sent: the packet waits).
    fn carry(&self, packet: &[u8], inflight: &mut VecDeque<(Op, Arc<Counts>)>) -> Carried {
        let n = packet.len();
        // The offload header and the packet go together.
        let Some(dst) = packet.get(VNET_HDR_LEN..).and_then(ipv4_destination) else {
            // IPv6 neighbour discovery and the like are not carried.
            self.malformed.fetch_add(1, Ordering::Relaxed);
            return Carried::Done(None);
        };
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
        let mut op = if shm {
            // Not waiting for room (see `Conn::send_with`).
            match route.conn.send_with(n, |slot| {
                slot[..n].copy_from_slice(packet);
                Some(n)
            }) {
                Some(op) => op,
                None => return Carried::NoRoom,
            }
        } else {
            route.conn.send(packet)
        };
        match op.poll() {
            Some(Ok(_)) => count_tx(&route.counts, n),
            Some(Err(e)) => {
                self.send_failed(&route.conn, &route.counts, e);
                return Carried::Done(None);
            }
            None => {
                count_tx(&route.counts, n);
                inflight.push_back((op, route.counts.clone()));
            }
        }
        while let Some((op, _)) = inflight.front() {
            if inflight.len() < TX_INFLIGHT_MAX && !op.is_done() {
                break;
            }
            let (op, counts) = inflight.pop_front().expect("front exists");
            if op.wait().is_err() {
                counts.tx_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        Carried::Done(shm.then_some(route))
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

    fn deliver(&self, from: NodeId, data: &[u8]) {
        // Every sender is an admitted, authenticated fabric node, and speaks for no other
        // (see `check_from_peer`). One this side has not routed yet (it saw us first) is
        // delivered too, and counted apart.
        let (checked, counts) = {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            let owners = |a: Ipv4Addr| table.owners.get(&a).map(Vec::as_slice);
            let checked = check_from_peer(data, from, owners, &self.my_addrs);
            (checked, table.peers.get(&from).map(|p| p.counts.clone()))
        };
        let refused = match checked {
            Ok(()) => None,
            Err(RxRefusal::Malformed) => Some(&self.malformed),
            Err(RxRefusal::Spoofed) => Some(&self.rx_spoofed),
            Err(RxRefusal::BadOffload) => Some(&self.rx_bad_offload),
        };
        if let Some(counter) = refused {
            counter.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.tun.write(data) {
            Ok(()) => match counts {
                Some(c) => {
                    c.rx_packets.fetch_add(1, Ordering::Relaxed);
                    c.rx_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                None => {
                    self.rx_unrouted.fetch_add(1, Ordering::Relaxed);
                }
            },
            Err(e) => debug!("writing {VNIC_NAME}: {e}"),
        }
    }

    fn refresh_loop(&self) {
        let mut last = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(STOP_CHECK);
            if last.elapsed() >= REFRESH_INTERVAL {
                self.refresh();
                last = Instant::now();
            }
        }
    }

    /// Learn which nodes run a virtual NIC now: route to the new ones, forget the gone ones.
    fn refresh(&self) {
        let nodes = match self.fabric.nodes() {
            Ok(n) => n,
            Err(e) => {
                debug!("node list: {e}");
                return;
            }
        };
        let me = self.fabric.id();
        let mut owners: HashMap<Ipv4Addr, Vec<NodeId>> = HashMap::new();
        for n in &nodes {
            for a in link_addrs(&n.info.links) {
                owners.entry(a).or_default().push(n.info.id);
            }
        }
        self.table.write().unwrap_or_else(|e| e.into_inner()).owners = owners;
        let mut live = Vec::new();
        for n in nodes.iter().filter(|n| n.up && n.info.id != me) {
            let known = self.table.read().unwrap_or_else(|e| e.into_inner()).peers.contains_key(&n.info.id);
            if known {
                live.push(n.info.id);
                continue;
            }
            if self.fabric.lookup(&format!("{VNIC_REGION_PREFIX}{}", n.info.name)).is_err() {
                continue; // no virtual NIC there: its traffic stays on Ethernet
            }
            let registered = link_addrs(&n.info.links);
            if registered.is_empty() {
                continue;
            }
            let conn = match self.fabric.connect(n.info.id) {
                Ok(c) => c,
                Err(e) => {
                    debug!(peer = n.info.id, "not routed yet: {e}");
                    continue;
                }
            };
            let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
            if table.peers.len() >= PEERS_MAX {
                warn!("virtual NIC peer limit ({PEERS_MAX}) reached; {} stays on Ethernet", n.info.name);
                continue;
            }
            // Only addresses a peer may own, and no other peer's: a node that registers this
            // node's, the management host's or another peer's address gets no route to it.
            let addrs: Vec<Ipv4Addr> = registered
                .iter()
                .copied()
                .filter(|a| routable(*a, &self.my_addrs, &self.mh_addrs) && !table.by_addr.contains_key(a))
                .collect();
            let refused = registered.len() - addrs.len();
            if refused > 0 {
                self.addr_refused.fetch_add(refused as u64, Ordering::Relaxed);
                warn!(peer = %n.info.name, registered = ?registered, "{refused} of the peer's addresses are not routed");
            }
            if addrs.is_empty() {
                continue;
            }
            let mut peer = Peer { name: n.info.name.clone(), addrs, conn, counts: Arc::default(), routed: false };
            for a in &peer.addrs {
                table.by_addr.insert(*a, n.info.id);
            }
            match self.route(&peer.addrs) {
                Ok(()) => peer.routed = true,
                Err(e) => warn!("routes to {}: {e}", peer.name),
            }
            info!(peer = %peer.name, transport = peer.conn.transport(), addrs = ?peer.addrs, "routed over {VNIC_NAME}");
            table.peers.insert(n.info.id, peer);
            live.push(n.info.id);
        }
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<NodeId> = table.peers.keys().filter(|id| !live.contains(id)).copied().collect();
        for node in gone {
            info!(peer = node, "peer left; its traffic goes back to Ethernet");
            self.forget(&mut table, node);
        }
    }

    /// A `/32` route through `rw0` for each address, from our address on the same rail.
    fn route(&self, addrs: &[Ipv4Addr]) -> Result<(), VnicError> {
        for a in addrs {
            let src = self.my_addrs.iter().find(|m| m.octets()[..3] == a.octets()[..3]).unwrap_or(&self.my_addrs[0]);
            ip(&["route", "replace", &format!("{a}/32"), "dev", VNIC_NAME, "src", &src.to_string()])?;
        }
        Ok(())
    }

    fn forget(&self, table: &mut Table, node: NodeId) {
        let Some(p) = table.peers.remove(&node) else { return };
        for a in &p.addrs {
            table.by_addr.remove(a);
            if p.routed {
                let _ = ip(&["route", "del", &format!("{a}/32"), "dev", VNIC_NAME]);
            }
        }
        table.gone.push(peer_counters(node, &p));
    }

    fn counters(&self) -> VnicCounters {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut peers: Vec<PeerCounters> = table.peers.iter().map(|(n, p)| peer_counters(*n, p)).collect();
        peers.sort_by_key(|p| p.node);
        peers.extend(table.gone.iter().cloned());
        VnicCounters {
            ifname: self.tun.name().into(),
            peers,
            no_route: self.no_route.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
            rx_unrouted: self.rx_unrouted.load(Ordering::Relaxed),
            rx_spoofed: self.rx_spoofed.load(Ordering::Relaxed),
            rx_bad_offload: self.rx_bad_offload.load(Ordering::Relaxed),
            addr_refused: self.addr_refused.load(Ordering::Relaxed),
        }
    }
}

fn count_tx(c: &Counts, n: usize) {
    c.tx_packets.fetch_add(1, Ordering::Relaxed);
    c.tx_bytes.fetch_add(n as u64, Ordering::Relaxed);
}

fn peer_counters(node: NodeId, p: &Peer) -> PeerCounters {
    PeerCounters {
        node,
        name: p.name.clone(),
        addrs: p.addrs.clone(),
        transport: p.conn.transport().into(),
        tx_packets: p.counts.tx_packets.load(Ordering::Relaxed),
        tx_bytes: p.counts.tx_bytes.load(Ordering::Relaxed),
        rx_packets: p.counts.rx_packets.load(Ordering::Relaxed),
        rx_bytes: p.counts.rx_bytes.load(Ordering::Relaxed),
        tx_errors: p.counts.tx_errors.load(Ordering::Relaxed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the IPv4 header checks a packet passes before it is carried: version, header
    // length, and total length equal to the bytes; anything else (IPv6, truncated) is refused.
    #[test]
    fn ipv4_destination_checks_the_header() {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&40u16.to_be_bytes());
        p[16..20].copy_from_slice(&[198, 18, 0, 2]);
        assert_eq!(ipv4_destination(&p), Some(Ipv4Addr::new(198, 18, 0, 2)));
        assert_eq!(ipv4_destination(&p[..39]), None, "total length disagrees");
        let mut v6 = p.clone();
        v6[0] = 0x60;
        assert_eq!(ipv4_destination(&v6), None);
        let mut short_ihl = p.clone();
        short_ihl[0] = 0x44;
        assert_eq!(ipv4_destination(&short_ihl), None);
        assert_eq!(ipv4_destination(&p[..10]), None);
    }

    // Checks that link addresses become the IPv4 addresses to route, ports and unspecified
    // addresses dropped.
    #[test]
    fn link_addresses() {
        let l = vec!["198.18.0.1:7000".to_string(), "198.18.1.1:0".into(), "0.0.0.0:9".into(), "junk".into()];
        assert_eq!(link_addrs(&l), vec![Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 1, 1)]);
    }

    // Checks that a bad interface name is refused before any system call (no root needed).
    #[test]
    fn bad_interface_name_is_refused() {
        let e = Tun::create("a-name-far-too-long-for-linux").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }
}
