//! One node's membership in the fabric, below the transports: its identity, configuration
//! and management-host session, its regions, its live connections, and how its threads wait.
//!
//! The transports (`shm`, `edge`), regions and connections are handed a [`Node`] and report
//! new and closed peers to it ([`Node::add_peer`], [`Node::remove_peer`]); the node knows them
//! only as [`PeerTransport`]s and the edge transport only as a [`Drive`]. [`crate::Fabric`], on
//! top, chooses and starts the transports.

use std::collections::{HashMap, HashSet};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use rackwire_mh::identity::{self, Identity, PublicKey};
use rackwire_mh::{MhClient, MhError, NodeInfo};
use rackwire_shm::{CopyEngine, Doorbell, Endpoint};

use crate::grants::{Acl, RegionInner, RegionTable};
use crate::op::Drive;
use crate::sync::{lock, read, write, CLOCK_EVERY_SPINS, YIELD_AFTER};
use crate::transport::PeerTransport;
use crate::watch::{EdgeMessageHandler, EdgeWatch};
use crate::{Error, FabricConfig, NodeId, PEERS_MAX};

/// How long a blocked receiver sleeps at most before it looks again (covers peers that
/// joined after it went to sleep).
const DOORBELL_SLICE: Duration = Duration::from_millis(10);
/// Questions to the management host of one kind (peers' keys, whether peers are gone) under
/// way at once, each on a thread of its own.
const MH_LOOKUPS_MAX: usize = 16;
/// Node ids the management host said it does not know, remembered (for
/// [`UNKNOWN_PEER_MEMORY`]) so that first frames naming them start no lookup: at most this
/// many (the oldest is forgotten first).
const UNKNOWN_PEERS_MAX: usize = 1024;
/// How long an unknown node id is remembered as unknown (a node that joins later is looked up
/// again after it).
const UNKNOWN_PEER_MEMORY: Duration = Duration::from_secs(5);
/// Lookups of peers' keys started per second at most (first frames naming ids this node does
/// not know yet, spoofed or not, cannot make it ask the management host faster).
const KEY_LOOKUPS_PER_SECOND_MAX: u32 = 64;
/// How long a freed region's peers have to confirm they unmapped it.
const FREE_UNMAP_TIMEOUT: Duration = Duration::from_millis(500);

pub(crate) type Peer = Arc<dyn PeerTransport>;

#[derive(Default)]
struct PeerTable {
    by_node: HashMap<NodeId, Vec<Peer>>,
    /// Every live connection, replaced whole on change so pollers take it without a lock
    /// held while they poll.
    all: Arc<Vec<Peer>>,
}

/// A snapshot of the peers a receive wait looks at, and the version of the table it came
/// from ([`Node::peer_view`], [`Node::refresh`]).
pub(crate) struct PeerView {
    version: u64,
    pub(crate) peers: Arc<Vec<Peer>>,
    /// Where the next look starts: each look of a wait starts one peer further, so no peer
    /// starves; each wait starts where the node's last one left off.
    pub(crate) next: usize,
}

/// The same connection (not merely one to the same node).
fn same(a: &Peer, b: &Peer) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl PeerTable {
    /// `p` is still one to reach its node by.
    fn registered(&self, p: &Peer) -> bool {
        self.by_node.get(&p.peer()).is_some_and(|v| v.iter().any(|q| same(q, p)))
    }

    /// The receive calls no longer look at `p`.
    fn drop_from_all(&mut self, p: &Peer) {
        let all: Vec<Peer> = self.all.iter().filter(|q| !same(q, p)).cloned().collect();
        self.all = Arc::new(all);
    }
}

/// Shared state of one node's membership in the fabric.
pub(crate) struct Node {
    pub id: NodeId,
    pub cfg: FabricConfig,
    pub mh: MhClient,
    /// This node's key pair.
    pub identity: Arc<Identity>,
    /// Peers' node keys as the management host recorded them, kept for the node's life (so
    /// known peers connect while the management host is down).
    peer_keys: Mutex<HashMap<NodeId, PublicKey>>,
    /// Peers whose keys are being looked up.
    key_fetches: Mutex<HashSet<NodeId>>,
    /// Node ids the management host did not know, and when it said so.
    unknown_peers: Mutex<HashMap<NodeId, Instant>>,
    /// Key lookups started in the current second: the second it began, and how many.
    key_lookup_budget: Mutex<(Instant, u32)>,
    /// Key lookups not started (the id known unknown, or over the rate).
    pub(crate) key_lookups_skipped: AtomicU64,
    /// Peers being asked about, and those the management host says are gone (down, or no
    /// longer at the addresses a connection reaches them by): the transports drop them.
    gone_checks: Mutex<HashSet<NodeId>>,
    gone: Mutex<HashSet<NodeId>>,
    /// Which memory this node shares: nodes with the same string reach each other over
    /// shared memory.
    pub host: String,
    /// This node's regions and their access rules.
    pub regions: Arc<RegionTable>,
    pub next_region: AtomicU32,
    peers: RwLock<PeerTable>,
    /// Counts the changes of [`PeerTable::all`] (each made under the write lock): a receive
    /// wait keeps the snapshot it took while this stays the same (see [`PeerView`]).
    peers_version: AtomicU64,
    pub doorbell: Doorbell,
    pub copy: CopyEngine,
    pub endpoint: Arc<Endpoint>,
    /// Held while a connection is being made, so two threads do not make two.
    pub connect_lock: Mutex<()>,
    pub closed: AtomicBool,
    rr: AtomicUsize,
    pub weak: Weak<Node>,
    /// The transport that needs driving by waiting threads (the edge transport), if any.
    pub driver: OnceLock<Arc<dyn Drive>>,
    /// Where messages arriving over the edge transport go at once, if set (see
    /// [`crate::EdgeHooks::set_message_handler`]).
    pub edge_messages: OnceLock<MessageHandler>,
    /// A descriptor the edge transport's network thread watches while it looks for more
    /// work, and what takes its input (see [`crate::EdgeHooks::set_watch`]).
    pub edge_watch: RwLock<Option<Arc<dyn EdgeWatch>>>,
}

/// What takes each message (its sender and bytes) as it arrives.
pub(crate) type MessageHandler = Arc<dyn EdgeMessageHandler>;

impl Node {
    /// A node with no peers yet.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: NodeId,
        cfg: FabricConfig,
        mh: MhClient,
        identity: Arc<Identity>,
        host: String,
        doorbell: Doorbell,
        copy: CopyEngine,
        endpoint: Arc<Endpoint>,
    ) -> Arc<Node> {
        Arc::new_cyclic(|weak| Node {
            id,
            cfg,
            mh,
            identity,
            peer_keys: Mutex::new(HashMap::new()),
            key_fetches: Mutex::new(HashSet::new()),
            unknown_peers: Mutex::new(HashMap::new()),
            key_lookup_budget: Mutex::new((Instant::now(), 0)),
            key_lookups_skipped: AtomicU64::new(0),
            gone_checks: Mutex::new(HashSet::new()),
            gone: Mutex::new(HashSet::new()),
            host,
            regions: Arc::new(RegionTable::default()),
            next_region: AtomicU32::new(1),
            peers: RwLock::new(PeerTable::default()),
            peers_version: AtomicU64::new(0),
            doorbell,
            copy,
            endpoint,
            connect_lock: Mutex::new(()),
            closed: AtomicBool::new(false),
            rr: AtomicUsize::new(0),
            weak: weak.clone(),
            driver: OnceLock::new(),
            edge_messages: OnceLock::new(),
            edge_watch: RwLock::new(None),
        })
    }

    /// The node key the management host recorded for `info`'s node (remembered), or, for a
    /// record that carries none, the one remembered.
    pub(crate) fn peer_key(&self, info: &NodeInfo) -> Result<PublicKey, Error> {
        match identity::public_from_hex(&info.key) {
            Some(k) => {
                lock(&self.peer_keys).insert(info.id, k);
                Ok(k)
            }
            None => lock(&self.peer_keys).get(&info.id).copied().ok_or_else(|| Error::Unreachable {
                node: info.id,
                why: "the management host has no node key on record for it".into(),
            }),
        }
    }

    /// The node key known for `peer` without waiting; when there is none yet, a lookup starts
    /// in the background (so the peer's next attempt finds it) and the answer is `None`.
    pub(crate) fn known_peer_key(&self, peer: NodeId) -> Option<PublicKey> {
        if let Some(k) = lock(&self.peer_keys).get(&peer) {
            return Some(*k);
        }
        if lock(&self.key_fetches).contains(&peer) {
            return None;
        }
        if !self.may_look_up_key(peer) {
            self.key_lookups_skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.in_background(
            |n| &n.key_fetches,
            peer,
            "rw-peer-key",
            move |node| match node.mh.resolve(peer) {
                Ok(info) => {
                    let _ = node.peer_key(&info);
                }
                Err(rackwire_mh::MhError::NotFound(_)) => node.remember_unknown(peer),
                Err(e) => tracing::debug!(peer, "looking up a peer's node key: {e}"),
            },
        );
        None
    }

    /// Whether a lookup of `peer`'s key may start now: not an id the management host said
    /// lately it does not know, and within [`KEY_LOOKUPS_PER_SECOND_MAX`].
    fn may_look_up_key(&self, peer: NodeId) -> bool {
        if lock(&self.unknown_peers).get(&peer).is_some_and(|at| at.elapsed() < UNKNOWN_PEER_MEMORY) {
            return false;
        }
        let mut budget = lock(&self.key_lookup_budget);
        if budget.0.elapsed() >= Duration::from_secs(1) {
            *budget = (Instant::now(), 0);
        }
        budget.1 += 1;
        budget.1 <= KEY_LOOKUPS_PER_SECOND_MAX
    }

    /// The management host does not know node `peer`: no lookup of it for a while.
    fn remember_unknown(&self, peer: NodeId) {
        let mut u = lock(&self.unknown_peers);
        u.retain(|_, at| at.elapsed() < UNKNOWN_PEER_MEMORY);
        if u.len() >= UNKNOWN_PEERS_MAX {
            if let Some(oldest) = u.iter().min_by_key(|(_, at)| **at).map(|(&p, _)| p) {
                u.remove(&oldest);
            }
        }
        u.insert(peer, Instant::now());
    }

    /// Ask the management host in the background whether `peer`, unreachable over every link,
    /// is gone: its session ended from its side, or it is registered at other addresses than
    /// `addrs` (it restarted). If it says so, [`Node::reported_gone`] tells the transport; if
    /// it cannot say (unreachable too, or the peer only went silent), nothing changes and the
    /// connection's peer timeout decides.
    pub(crate) fn check_peer(&self, peer: NodeId, addrs: Vec<String>) {
        self.in_background(
            |n| &n.gone_checks,
            peer,
            "rw-peer-check",
            move |node| {
                let Ok(nodes) = node.mh.nodes() else { return };
                // Gone: its side closed its session (it left, or its process ended), or it is up
                // again at other addresses (it restarted). Down because silent says nothing: the
                // outage that cut us off may have cut it off from the management host too.
                let gone = nodes.iter().find(|n| n.info.id == peer).is_some_and(|n| {
                    n.ended || (n.up && !addrs.is_empty() && !n.info.links.iter().any(|a| addrs.contains(a)))
                });
                if gone {
                    tracing::debug!(peer, "the management host says the peer is gone");
                    lock(&node.gone).insert(peer);
                }
            },
        );
    }

    /// Run `ask` (a question to the management host about `peer`) on a thread of its own,
    /// unless one about `peer` is under way in the set `pending` picks, or
    /// [`MH_LOOKUPS_MAX`] are.
    fn in_background(
        &self,
        pending: fn(&Node) -> &Mutex<HashSet<NodeId>>,
        peer: NodeId,
        thread: &str,
        ask: impl FnOnce(&Node) + Send + 'static,
    ) {
        {
            let mut p = lock(pending(self));
            if p.len() >= MH_LOOKUPS_MAX || !p.insert(peer) {
                return;
            }
        }
        let weak = self.weak.clone();
        let spawned = std::thread::Builder::new().name(thread.into()).spawn(move || {
            let Some(node) = weak.upgrade() else { return };
            ask(&node);
            lock(pending(&node)).remove(&peer);
        });
        if spawned.is_err() {
            lock(pending(self)).remove(&peer);
        }
    }

    /// Whether the management host said `peer` is gone (the word is taken: asked once).
    pub(crate) fn reported_gone(&self, peer: NodeId) -> bool {
        let mut g = lock(&self.gone);
        !g.is_empty() && g.remove(&peer)
    }

    /// The next position for a poller that rotates over the peers.
    pub(crate) fn next_rr(&self) -> usize {
        self.rr.fetch_add(1, Ordering::Relaxed)
    }

    /// Drive the transport that needs it once; true when something happened.
    pub(crate) fn drive(&self) -> bool {
        self.driver.get().is_some_and(|d| d.drive())
    }

    /// Send what operations left gathered for a later frame (see [`Drive::flush`]).
    pub(crate) fn flush(&self) {
        if let Some(d) = self.driver.get() {
            d.flush();
        }
    }

    /// This thread stops driving (it is about to sleep).
    pub(crate) fn rest(&self) {
        if let Some(d) = self.driver.get() {
            d.rest();
        }
    }
    pub(crate) fn conns_of(&self, node: NodeId) -> Vec<Peer> {
        read(&self.peers).by_node.get(&node).cloned().unwrap_or_default()
    }

    pub(crate) fn all_peers(&self) -> Arc<Vec<Peer>> {
        read(&self.peers).all.clone()
    }

    /// The peers the receive calls look at, as of now.
    pub(crate) fn peer_view(&self) -> PeerView {
        // The version first: the snapshot is then at least as new as it says.
        let version = self.peers_version.load(Ordering::Acquire);
        PeerView { version, peers: self.all_peers(), next: self.next_rr() }
    }

    /// Bring `v` up to date if the peers changed since it was taken; otherwise it costs one
    /// load (taking a snapshot costs a lock and a reference count, each an atomic instruction
    /// on a shared cache line, on every look of a wait).
    pub(crate) fn refresh(&self, v: &mut PeerView) {
        if self.peers_version.load(Ordering::Acquire) != v.version {
            let next = v.next;
            *v = self.peer_view();
            v.next = next;
        }
    }

    /// [`PeerTable::all`] changed (its write lock held).
    fn peers_changed(&self) {
        self.peers_version.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn add_peer(&self, p: Peer) -> Result<(), Error> {
        let mut t = write(&self.peers);
        if t.all.len() >= PEERS_MAX {
            return Err(Error::Limit(crate::Limit::Peers));
        }
        t.by_node.entry(p.peer()).or_default().push(p.clone());
        let mut all = (*t.all).clone();
        all.push(p);
        t.all = Arc::new(all);
        self.peers_changed();
        Ok(())
    }

    /// A connection closed: no longer one to reach its node by. Messages and notifications it
    /// delivered before it closed are not lost: while any wait unread, it stays among the
    /// peers the receive calls look at, and [`Node::forget_drained`] drops it once they are
    /// taken.
    pub(crate) fn remove_peer(&self, p: &Peer) {
        let mut t = write(&self.peers);
        if let Some(v) = t.by_node.get_mut(&p.peer()) {
            v.retain(|q| !same(q, p));
            if v.is_empty() {
                t.by_node.remove(&p.peer());
            }
        }
        if !p.unread() {
            t.drop_from_all(p);
            self.peers_changed();
        }
    }

    /// Drop `p` from the peers the receive calls look at if it closed and nothing it
    /// delivered waits unread.
    pub(crate) fn forget_drained(&self, p: &Peer) {
        if p.is_alive() || p.unread() {
            return;
        }
        // Still registered: its transport has not let it go yet. Looked at under the read lock
        // first: a receive call passes here on every look while such a connection lingers.
        if read(&self.peers).registered(p) {
            return;
        }
        let mut t = write(&self.peers);
        if !t.registered(p) {
            t.drop_from_all(p);
            self.peers_changed();
        }
    }

    /// Refuse grants to nodes the management host has never heard of. While it is down,
    /// the check is skipped: access is still enforced at every use.
    pub(crate) fn known_peer(&self, node: NodeId) -> Result<(), Error> {
        if node == self.id {
            return Ok(());
        }
        match self.mh.resolve(node) {
            Ok(_) | Err(MhError::Unavailable(_)) => Ok(()),
            Err(MhError::NotFound(_)) => Err(Error::UnknownPeer(node)),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) fn free_region(&self, r: &RegionInner) {
        self.regions.remove(r.id);
        let mappers: Vec<NodeId> = {
            let mut acl = lock(&r.acl);
            *acl = Acl::default();
            acl.mapped_by.drain().collect()
        };
        for peer in mappers {
            for c in self.conns_of(peer) {
                c.unmap(r.id, FREE_UNMAP_TIMEOUT);
            }
        }
        if !self.closed.load(Ordering::Relaxed) {
            self.mh.drop_region(r.id);
        }
    }
}

/// Sleep until a message or notification may wait for a receive call (the doorbell rang, or
/// one waits already), one of `fds` is readable, or `timeout` passes.
pub(crate) fn wait_input(f: &Node, fds: &[BorrowedFd<'_>], timeout: Duration) -> Result<(), Error> {
    if f.closed.load(Ordering::Relaxed) {
        return Err(Error::Closed);
    }
    // This thread stops driving the edge transport while it sleeps.
    f.rest();
    f.doorbell.arm();
    // Looked at after arming: a record published before it is seen here, one after it rings.
    if !f.all_peers().iter().any(|p| p.unread()) {
        f.doorbell.wait_with(fds, Some(timeout));
    }
    f.doorbell.disarm();
    Ok(())
}

/// Busy-poll `probe` for the configured time, then sleep on the doorbell between looks, until
/// it yields, fails, or `timeout` passes ([`Error::Timeout`]). The clock is first read after
/// [`CLOCK_EVERY_SPINS`] looks found nothing (the times count from there, a few hundred
/// nanoseconds late): a wait answered sooner, as in a ping-pong, reads it never.
pub(crate) fn poll_until<T>(
    f: &Node,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, Error>,
) -> Result<T, Error> {
    let mut times: Option<(Instant, Instant, Instant)> = None;
    let mut spins = 0u32;
    let mut resting = false;
    loop {
        if let Some(v) = probe()? {
            return Ok(v);
        }
        // Reading the clock costs more than a look at the rings: do it every so often.
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(CLOCK_EVERY_SPINS) {
            std::hint::spin_loop();
            continue;
        }
        if f.closed.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        let now = Instant::now();
        let (start, deadline, spin_until) = *times.get_or_insert((now, now + timeout, now + f.cfg.busy_poll));
        if now >= deadline {
            return Err(Error::Timeout);
        }
        if now < spin_until {
            // A receiver that found nothing for a while lets the threads of its core go
            // first: on a small host the application the packets are for needs that core
            // (the virtual NIC's TCP throughput rose ~40% with it, latency held).
            if now >= start + YIELD_AFTER {
                std::thread::yield_now();
            }
            continue;
        }
        if !resting {
            // This thread stops driving the edge transport: its network thread takes over.
            resting = true;
            f.rest();
        }
        f.doorbell.arm();
        let got = probe();
        if !matches!(got, Ok(None)) {
            f.doorbell.disarm();
            return got.map(|v| v.expect("matched Some"));
        }
        // That look may have driven the edge transport, which tells its network thread that
        // this thread polls: say again that it sleeps, or the network thread leaves the
        // sockets alone for up to `PUMP_WATCH_MAX` while nobody reads them.
        f.rest();
        f.doorbell.wait(Some((deadline - now).min(DOORBELL_SLICE)));
        f.doorbell.disarm();
    }
}
