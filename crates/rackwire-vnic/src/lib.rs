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

mod arrived;
mod check;
mod gate;
mod gro;
mod io;
mod peers;
mod relay;
mod rx;
// The TUN ioctl is the one place that needs `unsafe`.
#[allow(unsafe_code)]
mod tun;
mod tunnel;

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};

use rustix::event::EventfdFlags;
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
pub use tunnel::{TunnelEnd, UdpTunnel, TUNNEL_MTU, TUNNEL_NAME, TUNNEL_SPIN};

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
/// Packets the edge transport's network thread reads from `rw0` in a row when it finds some
/// there while it looks for more work (answers to packets it wrote into `rw0`: see
/// [`rackwire::EdgeHooks::set_watch`]).
pub const ANSWERS_MAX: usize = 8;
const _: () = assert!(ANSWERS_MAX < TX_INFLIGHT_MAX);
/// A packet of at most this many bytes (offload header aside) that the network thread takes
/// from `rw0` after a packet came in (written into `rw0`) since its last such packet ends its
/// take: an answer, after which `rw0` is most likely empty until the other side answers.
/// Reading on would cost a system call that finds nothing on every such packet (a cross-rack
/// 64 B ping-pong read `rw0` 2.4-2.7 times a packet so); the thread's next look at `rw0`,
/// which comes anyway, finds any that follow. A stream's segments, larger, are read on, and so
/// are small packets with nothing coming in between (a flood of them: ending the take after
/// each cut a 64 B UDP flood across racks by a third).
pub const ANSWER_BYTES_MAX: usize = 1_500;
/// How long the virtual NIC's thread keeps looking for packets after its last one, yielding
/// its core between looks, before it sleeps: a reply (the pong of a ping-pong, a TCP
/// acknowledgement) usually comes within it, and is taken without a wake-up on either side
/// (64 B ping-pong over rw0 in one rack: 26 µs p50 against 13.4–15.2 with it, the veth's 11.5;
/// alternated three times, docs/history/measurements.md). Only after work: an idle agent sleeps. Not
/// while the edge transport's network thread watches `rw0`: that thread takes the answers.
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
/// into rw0 itself, and reads their answers from `rw0` while it looks for more work, the
/// virtual NIC's thread then sleeping without watching `rw0`: see `io::Answers`), the virtual
/// NIC's thread by `rw0` or the doorbell for packets over shared memory. The applications
/// whose packets these are need the cores: with spinning receivers (200 µs), on
/// two cores, 64 B ping-pongs across racks took 48–98 µs p50 against 45–64 without, in one rack
/// 26–39 against 24–31, and TCP over rw0 gave 0.53–0.65 of the veth's against 0.49–0.68 (the
/// veth itself 1.9–3.0 GB/s; alternated five and three times, docs/history/measurements.md).
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

struct Peer {
    name: String,
    /// Its addresses that are routed through `rw0`, and from which it may send.
    addrs: Vec<Ipv4Addr>,
    conn: Conn,
    counts: Arc<Counts>,
    /// Its routes are installed.
    routed: bool,
}

/// The routing table's maps. Looked up for every packet both ways, so with the cheap hasher
/// for ids this node was given by someone it trusts: every key in them comes from the
/// management host's lists (a packet's addresses are only looked up, never added, so they
/// cannot crowd a bucket).
type Map<K, V> = rackwire_proto::OwnIdMap<K, V>;

#[derive(Default)]
struct Table {
    peers: Map<NodeId, Peer>,
    by_addr: Map<Ipv4Addr, NodeId>,
    /// Who registered each address, as the management host last listed them (to tell a
    /// packet that speaks for another node; nodes of one host share its addresses).
    owners: Map<Ipv4Addr, Vec<NodeId>>,
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
    /// Counts the changes of `table`'s routes (a peer routed or forgotten): a route kept from
    /// an earlier packet holds while this has not moved (see `io::Recent`).
    routes_version: AtomicU64,
    /// Counts the packets written into `rw0` (from any peer): a small packet the network thread
    /// takes out after one came in is an answer (see [`ANSWER_BYTES_MAX`]).
    delivered: AtomicU64,
    /// Datagrams from the edge transport gathered for one write into `rw0` (see `rx`).
    gathered: Mutex<gro::UdpRun>,
    /// `rw0` refused a run of datagrams as one packet: each is written alone from then on.
    gathering_refused: AtomicBool,
    /// The sending side (see [`io::Tx`]).
    tx: Mutex<io::Tx>,
    /// Wakes the virtual NIC's thread (an event counter; `nudged` says it was written): for a
    /// packet another thread left it.
    nudge: OwnedFd,
    nudged: AtomicBool,
    /// `rw0` as the virtual NIC's thread sleeps on it: holding `rw0` only while the thread
    /// sleeps and the edge transport's network thread does not watch `rw0` (see
    /// `io::Answers`). The thread, asleep, is then neither woken for a packet the network
    /// thread takes nor left asleep on one it leaves (see [`gate::Gate`]).
    gate: gate::Gate,
    /// The virtual NIC's thread sleeps (or is about to): the network thread may read `rw0`.
    asleep: AtomicBool,
    /// The edge transport's network thread watches `rw0` (the gate does not hold it): the
    /// virtual NIC's thread then sleeps as soon as it runs out of work instead of looking again
    /// for [`IO_SPIN`], leaving the answers to the thread that watches (two threads of one agent
    /// taking turns at looking, on one core, each made the other's packets wait for its turn).
    edge_watching: AtomicBool,
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
    ipv4_header_destination(packet, packet.len())
}

/// [`ipv4_destination`] of a packet of `len` bytes from its first bytes `head` (at least its
/// fixed header).
pub(crate) fn ipv4_header_destination(head: &[u8], len: usize) -> Option<Ipv4Addr> {
    if head.len() < 20 || head[0] >> 4 != 4 {
        return None;
    }
    let ihl = (head[0] & 0x0f) as usize * 4;
    let total = u16::from_be_bytes([head[2], head[3]]) as usize;
    if ihl < 20 || total < ihl || total != len {
        return None;
    }
    Some(Ipv4Addr::new(head[16], head[17], head[18], head[19]))
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
        let gate = gate::Gate::new().map_err(|err| VnicError::Tun { name: VNIC_NAME.into(), err })?;
        let shared = Arc::new(Shared {
            fabric,
            tun,
            my_addrs,
            mh_addrs: ipv4_of(mh),
            table: RwLock::new(Table::default()),
            routes_version: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            gathered: Mutex::new(gro::UdpRun::default()),
            gathering_refused: AtomicBool::new(false),
            tx: Mutex::new(io::Tx::new()),
            nudge: rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(|e| {
                rackwire::Error::sys("making the virtual NIC's event counter", &std::io::Error::from(e))
            })?,
            nudged: AtomicBool::new(false),
            gate,
            asleep: AtomicBool::new(false),
            edge_watching: AtomicBool::new(false),
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
        // rings for that thread. Datagrams of one flow handed over together go in as one.
        shared.fabric.edge().set_handler(rx::EdgeRx(Arc::downgrade(&shared)))?;
        // Answers to those packets, once in `rw0`, are read by the network thread that wrote
        // them, while it looks for more work (see `io::Answers`).
        let rw0 =
            shared.tun.as_fd().try_clone_to_owned().map_err(|err| VnicError::Tun { name: VNIC_NAME.into(), err })?;
        shared.fabric.edge().set_watch(Arc::new(io::Answers { shared: Arc::downgrade(&shared), rw0 }));
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
        // The network thread lets go of `rw0` (its copy of the descriptor closes).
        self.shared.fabric.edge().clear_watch();
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
