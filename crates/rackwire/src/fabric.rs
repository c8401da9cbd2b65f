//! The fabric as one node sees it: joining, regions, connections (incoming traffic: the
//! `receive` module). The node's shared state lives in [`crate::node`]; this module chooses
//! and starts the transports on top of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use rackwire_mh::{MhClient, MhConfig, MhError, Role};
use rackwire_shm::{CopyEngine, Doorbell, Endpoint, OwnedWindow, SharedMem};
use tracing::{debug, warn};

use crate::edge::EdgeEndpoint;
use crate::grants::{Acl, RegionInner};
use crate::hooks::EdgeHooks;
use crate::node::{Node, Peer};
use crate::op::Drive;
use crate::shm::ShmPeer;
use crate::sync::lock;
use crate::{
    Access, Conn, Error, FabricConfig, NodeId, NodeStatus, Region, RemoteRegion, TransportChoice, REGIONS_MAX,
};

/// The kernel's boot id: nodes that share it share this machine's memory.
fn host_identity() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// An open connection to `node`, opened by either end, if there is one.
fn open_conn(f: &Node, node: NodeId) -> Option<Peer> {
    f.conns_of(node).into_iter().find(|p| p.is_alive())
}

/// A connection from `f` to `node`: an existing live one, or a new one over the transport the
/// configuration and the two nodes' places call for.
fn connect(f: &Arc<Node>, edge: Option<&Arc<EdgeEndpoint>>, node: NodeId) -> Result<Peer, Error> {
    if let Some(p) = open_conn(f, node) {
        return Ok(p);
    }
    let _g = lock(&f.connect_lock);
    if let Some(p) = open_conn(f, node) {
        return Ok(p);
    }
    let info = f.mh.resolve(node).map_err(|e| match e {
        MhError::NotFound(_) => Error::UnknownPeer(node),
        e => e.into(),
    })?;
    let shared_memory = info.host == f.host && info.shm_path.is_some();
    let usable = edge.filter(|_| !info.links.is_empty());
    let use_edge = match f.cfg.transport {
        TransportChoice::Edge => true,
        TransportChoice::Auto => !shared_memory,
        TransportChoice::Shm => false,
    };
    if use_edge {
        let Some(ep) = usable else {
            let why = if edge.is_none() {
                "this node has no Ethernet link configured for the edge transport"
            } else {
                "the peer published no Ethernet link"
            };
            return Err(Error::Unreachable { node, why: why.into() });
        };
        let p = ep.connect(&info, f.peer_key(&info)?)?;
        f.add_peer(p.clone())?;
        return Ok(p);
    }
    if !shared_memory {
        return Err(Error::Unreachable {
            node,
            why: "it does not share memory with this node and only shared memory is enabled".into(),
        });
    }
    let peer = match ShmPeer::connect(f, &info) {
        Ok(p) => p,
        Err(first) => {
            // The cached endpoint may be stale (the peer restarted): ask afresh once.
            debug!(node, "connect with cached endpoint failed ({first}); refreshing");
            let info = f.mh.refresh(node).map_err(|_| first.clone())?;
            ShmPeer::connect(f, &info).map_err(|e| {
                if matches!(e, Error::Sys { .. }) {
                    Error::PeerGone(node)
                } else {
                    e
                }
            })?
        }
    };
    Ok(peer)
}

/// This process's membership in a fabric.
///
/// Dropping it leaves the fabric: connections are closed and peers see this node as gone.
pub struct Fabric {
    pub(crate) inner: Arc<Node>,
    /// The edge transport, when this node has Ethernet links.
    edge: Option<Arc<EdgeEndpoint>>,
    acceptor: Option<JoinHandle<()>>,
    /// Serves [`Fabric::metrics`] when the configuration names an address.
    metrics: Option<rackwire_metrics::Exporter>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric").field("id", &self.inner.id).field("name", &self.inner.cfg.name).finish()
    }
}

impl Fabric {
    /// Join the fabric: prove the secret to the management host, get an id, open this node's
    /// shared-memory endpoint and register it.
    pub fn join(mut cfg: FabricConfig) -> Result<Fabric, Error> {
        cfg.validate()?;
        let key_error = |e| Error::Config(format!("this node's key pair: {e}"));
        let identity = if cfg.transient {
            // No name of its own: a key pair in memory only, so no later process can come back
            // as this node (as one given the same process id could from a kept file, with its
            // id and its grants), and a name no other process has: the pid and the key's start.
            let (id, _) = rackwire_mh::identity::Identity::generate().map_err(key_error)?;
            let tag: String = id.public()[..4].iter().map(|b| format!("{b:02x}")).collect();
            cfg.name = format!("{}-{tag}", cfg.name);
            id
        } else {
            rackwire_mh::identity::Identity::load_or_create(&cfg.key_path()).map_err(key_error)?
        };
        let identity = Arc::new(identity);
        let mh = MhClient::join(MhConfig {
            addr: cfg.mh.clone(),
            secret: cfg.secret.clone(),
            name: cfg.name.clone(),
            role: Role::Node(identity.clone()),
            trust: cfg.mh_trust()?,
            transient: cfg.transient,
        })?;
        let id = mh.node_id();
        if cfg.private_memory {
            rackwire_shm::keep_descriptors_private()?;
        }
        // The socket's folder is this user's alone: in a shared place (/tmp) another user
        // could have made it first, to swap the socket for one of their own.
        let dir = cfg.runtime_dir();
        rackwire_mh::owner_only::create_folder(&dir, rackwire_mh::owner_only::Reach::Private)
            .map_err(|e| Error::Config(format!("runtime folder: {e}")))?;
        let path =
            dir.join(format!("n{id}-{}-{:08x}.sock", std::process::id(), rackwire_mh::auth::random_u128() as u32));
        let endpoint = Arc::new(Endpoint::bind(&path).map_err(|e| Error::Sys {
            op: "binding this node's shared-memory endpoint",
            kind: e.kind(),
            detail: format!("{}: {e}", path.display()),
        })?);
        let host = match cfg.memory_domain.as_str() {
            "" => host_identity(),
            d => format!("{}/{d}", host_identity()),
        };
        let doorbell = Doorbell::new()?;
        let copy = CopyEngine::new(cfg.copy_channels);
        let inner = Node::new(id, cfg, mh, identity, host, doorbell, copy, endpoint.clone());
        let (mut links, mut edge) = (Vec::new(), None);
        if !inner.cfg.links.is_empty() {
            let ep = EdgeEndpoint::start(&inner)?;
            links = ep.addrs();
            let driver: Arc<dyn Drive> = ep.clone();
            let _ = inner.driver.set(driver);
            edge = Some(ep);
        }
        inner.mh.register(rackwire_mh::NodeInfo {
            host: inner.host.clone(),
            shm_path: Some(path.to_string_lossy().into_owned()),
            pid: std::process::id(),
            links,
            ..Default::default()
        })?;
        let weak = Arc::downgrade(&inner);
        let acceptor = std::thread::Builder::new()
            .name("rw-accept".into())
            .spawn(move || accept_loop(weak, endpoint))
            .map_err(|e| Error::sys("starting the accepting thread", &e))?;
        let metrics = match &inner.cfg.metrics {
            Some(addr) => {
                let node = Arc::downgrade(&inner);
                let render = Arc::new(move || node.upgrade().map(|n| crate::metrics::render(&n)).unwrap_or_default());
                Some(
                    rackwire_metrics::Exporter::start(addr, render)
                        .map_err(|e| Error::Config(format!("metrics address {addr}: {e}")))?,
                )
            }
            None => None,
        };
        Ok(Fabric { inner, edge, acceptor: Some(acceptor), metrics })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    /// This node's counters in the Prometheus text format: per peer and per link, the owner's
    /// audit of refused accesses by region, peer and reason, its regions.
    pub fn metrics(&self) -> String {
        crate::metrics::render(&self.inner)
    }

    /// Where [`Fabric::metrics`] is served (`metrics` in the configuration), if anywhere.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(rackwire_metrics::Exporter::addr)
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    /// Allocate a zeroed region of `len` bytes that peers may be granted up to `access`.
    ///
    /// Peers on this host map it (see [`Access`] for what a shared-memory grant then gives);
    /// for data a grantee must not reach beyond its grant, use [`Fabric::alloc_served`].
    pub fn alloc(&self, len: u64, access: Access) -> Result<Region, Error> {
        self.alloc_region(len, access, false)
    }

    /// Allocate a zeroed region of `len` bytes that this node *serves*: its memory is never
    /// handed to a peer, on any transport. Every operation a peer asks for comes to this
    /// node as a request, is checked against that peer's grant, its key and the region's
    /// bounds, and is carried out here, so a grant holds exactly as named over shared memory
    /// as over the edge transport: a peer granted [`Access::WRITE`] cannot read, one granted
    /// [`Access::ATOMIC`] cannot store. The price over shared memory is a round trip through
    /// this node's connection thread per operation (per 60 KiB piece of a large one) instead
    /// of a plain load or store; revoking costs no copy. Pinning ([`crate::Conn::pin`]) needs
    /// a mapped region and is refused for a served one.
    pub fn alloc_served(&self, len: u64, access: Access) -> Result<Region, Error> {
        self.alloc_region(len, access, true)
    }

    fn alloc_region(&self, len: u64, access: Access, served: bool) -> Result<Region, Error> {
        if len == 0 || len > rackwire_shm::SHM_REGION_BYTES_MAX {
            return Err(Error::Config(format!(
                "region length {len} outside 1..={}",
                rackwire_shm::SHM_REGION_BYTES_MAX
            )));
        }
        if self.inner.regions.len() >= REGIONS_MAX {
            return Err(Error::Limit(crate::Limit::Regions));
        }
        let id = self.inner.next_region.fetch_add(1, Ordering::Relaxed);
        let mem = SharedMem::create(&format!("rackwire-region-{id}"), len)?;
        let inner = Arc::new(RegionInner {
            id,
            key: rackwire_mh::auth::random_u128(),
            len,
            max_access: access,
            mem: OwnedWindow::new(mem),
            acl: Mutex::new(Acl::default()),
            migrating: AtomicBool::new(false),
            writers_first: Mutex::new(Default::default()),
            served,
        });
        self.inner.regions.insert(inner.clone())?;
        Ok(Region { inner, fabric: self.inner.clone() })
    }

    /// A connection to `node` (an existing live one if there is one).
    pub fn connect(&self, node: NodeId) -> Result<Conn, Error> {
        let t = connect(&self.inner, self.edge.as_ref(), node)?;
        Ok(Conn { t, fabric: self.inner.clone() })
    }

    /// An open connection to `node` if there is one, opened by either end, without opening one.
    /// Two nodes that connect to each other at once open two connections, and each then
    /// sends on its own: answers and acknowledgements can no longer ride in the other's
    /// frames. A node that knows its peer is connecting (a group's higher rank, whose lower
    /// ranks connect to it) waits for that connection instead.
    pub fn connection_to(&self, node: NodeId) -> Option<Conn> {
        let t = open_conn(&self.inner, node)?;
        Some(Conn { t, fabric: self.inner.clone() })
    }

    /// A connection to the node called `name`.
    pub fn connect_name(&self, name: &str) -> Result<Conn, Error> {
        let info = self.inner.mh.resolve_name(name).map_err(|e| match e {
            MhError::NotFound(m) => Error::Config(format!("no node called {name:?} ({m})")),
            e => e.into(),
        })?;
        self.connect(info.id)
    }

    /// Find a published region by name.
    pub fn lookup(&self, name: &str) -> Result<RemoteRegion, Error> {
        let e = self.inner.mh.lookup(name)?;
        let key = u128::from_str_radix(&e.key, 16)
            .map_err(|_| Error::BadHandle(format!("directory entry {name:?} has a bad key")))?;
        Ok(RemoteRegion { node: e.node, region: e.region, key, len: e.len })
    }

    /// Drive the transports once from this thread (poll the edge transport's links, hand over
    /// what arrived, send what is due); true when something happened. A thread that waits for
    /// memory a peer writes (a flag set by a one-sided write, not a notification) calls this
    /// while it spins, and [`Fabric::rest`] before it sleeps. The shared-memory transport needs
    /// no driving: its operations complete in the calling thread.
    pub fn progress(&self) -> bool {
        self.inner.drive()
    }

    /// The edge transport's hooks for a relay that sits on it (its message handler and its
    /// watch, see [`EdgeHooks`]).
    pub fn edge(&self) -> EdgeHooks<'_> {
        EdgeHooks { node: &self.inner }
    }

    /// Send now what operations of this node the edge transport holds back to share a frame
    /// with later ones: it gathers small operations submitted while frames are in flight, for
    /// the thread that drives it next (usually the submitter, polling for their outcome). A
    /// thread that goes on without driving it or waiting for them, as a collective's rank does
    /// after the sends of its last step, flushes. Cheap when nothing is held.
    pub fn flush(&self) {
        self.inner.flush();
    }

    /// This thread stops driving the transports (it is about to sleep): the edge transport's
    /// network thread takes over at once.
    pub fn rest(&self) {
        self.inner.rest();
    }

    /// Bootstrap: post `blob` (at most [`rackwire_mh::jobs::JOB_BLOB_BYTES_MAX`] bytes) as
    /// `rank` of the `size`-rank `job` in round `round` at the management host; round 0 joins
    /// the job. With the `token` its launcher handed the ranks, the job is reachable only with
    /// that token ([`rackwire_mh::jobs`]). Jobs of ranks (`rackwire-coll`) are built on this
    /// and [`Fabric::job_round`].
    pub fn job_post(
        &self,
        job: &str,
        token: Option<&str>,
        size: u32,
        rank: u32,
        round: u64,
        blob: &[u8],
    ) -> Result<(), Error> {
        Ok(self.inner.mh.job_post(job, token, size, rank, round, blob)?)
    }

    /// Bootstrap: what round `round` of `job` (with its `token`, if it has one) holds so far,
    /// and which ranks are down.
    pub fn job_round(&self, job: &str, token: Option<&str>, round: u64) -> Result<crate::JobRound, Error> {
        Ok(self.inner.mh.job_round(job, token, round)?)
    }

    /// Every node the management host knows.
    pub fn nodes(&self) -> Result<Vec<NodeStatus>, Error> {
        Ok(self.inner.mh.nodes()?)
    }

    /// Leave the fabric now (also done on drop).
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.inner.endpoint.stop();
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        if let Some(ep) = &self.edge {
            ep.send_owed();
        }
        for p in self.inner.all_peers().iter() {
            p.cut_off();
        }
        if let Some(ep) = &self.edge {
            ep.shutdown();
        }
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(fabric: Weak<Node>, endpoint: Arc<Endpoint>) {
    loop {
        match endpoint.accept() {
            Ok(Some(sock)) => {
                let f = fabric.clone();
                let spawned =
                    std::thread::Builder::new().name("rw-peer".into()).spawn(move || ShmPeer::accept(f, sock));
                if let Err(e) = spawned {
                    warn!("could not start a peer thread: {e}");
                }
            }
            Ok(None) => return,
            Err(e) => {
                warn!("accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TransportChoice;
    use std::time::Instant;

    /// The fabric secret of these tests.
    const SECRET: &str = "fabric-test-secret-0123456789abcdef";

    /// A management host for a test's nodes.
    fn mh() -> rackwire_mh::MhHandle {
        rackwire_mh::ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap()
    }

    /// A node on `mh` using `transport` (the edge transport over one loopback link), busy
    /// polling for `busy_poll` (the default if `None`).
    fn node(mh: &rackwire_mh::MhHandle, name: &str, transport: TransportChoice, busy_poll: Option<Duration>) -> Fabric {
        let mut cfg = FabricConfig::new(mh.addr().to_string(), SECRET, name);
        cfg.transport = transport;
        cfg.links = vec!["127.0.0.1:0".into()];
        if let Some(d) = busy_poll {
            cfg.busy_poll = d;
        }
        Fabric::join(cfg).unwrap()
    }

    /// A node on the edge transport alone, busy polling for `busy_poll`, whose network thread
    /// looks at a polling thread only once an hour: a test sees whether it watches. The
    /// management host is returned to be kept alive.
    fn edge_node(name: &str, busy_poll: Duration) -> (rackwire_mh::MhHandle, Fabric) {
        let mh = mh();
        let f = node(&mh, name, TransportChoice::Edge, Some(busy_poll));
        f.edge.as_ref().expect("an edge endpoint").set_watch(Duration::from_secs(3600));
        (mh, f)
    }

    // Checks that a thread that stops polling to sleep hands the edge transport back to its
    // network thread at once: with that thread's looks an hour apart, it watches a polling
    // thread (pumping by hand) and stops watching only because a notification wait that ran
    // out of busy polling woke it.
    #[test]
    fn a_waiter_going_to_sleep_wakes_the_watching_network_thread() {
        let (_mh, f) = edge_node("rest-test", Duration::from_millis(2));
        let ep = f.edge.clone().expect("an edge endpoint");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ep.is_watching() {
            assert!(Instant::now() < deadline, "the network thread never watched the polling thread");
            // In use, as if frames came: a quiet transport's sockets stay the network thread's.
            ep.mark_busy();
            ep.drive();
            std::thread::sleep(Duration::from_micros(20));
        }
        assert!(matches!(f.wait_notification(Duration::from_millis(20)), Err(Error::Timeout)));
        let deadline = Instant::now() + Duration::from_secs(10);
        while ep.is_watching() {
            assert!(Instant::now() < deadline, "the network thread still watches a thread that sleeps");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    // Checks that a thread spinning in a receive wait on a quiet edge transport leaves the
    // sockets to the network thread (it does not make it watch, so its looks cost no system
    // call), that a notification a peer sends then still reaches it (the network thread reads
    // it), and that the wait returns it. The network thread's looks are set an hour apart, so
    // once it watches it stays so until woken. Fails when receiving looks drive a quiet
    // transport: the spinning waiter keeps the network thread watching throughout.
    #[test]
    fn a_receive_wait_on_a_quiet_edge_transport_leaves_the_sockets_to_the_network_thread() {
        use std::sync::Arc;
        let mh = mh();
        // The waiter spins for the whole test.
        let spin = Some(Duration::from_secs(10));
        let (a, b) =
            (node(&mh, "quiet-a", TransportChoice::Edge, spin), node(&mh, "quiet-b", TransportChoice::Edge, spin));
        let b = Arc::new(b);
        let region = b.alloc(64, Access::READ | Access::WRITE).unwrap();
        region.grant(a.id(), Access::WRITE).unwrap();
        let conn = a.connect(b.id()).unwrap();
        let ep = b.edge.clone().expect("an edge endpoint");
        ep.set_watch(Duration::from_secs(3600));
        // Past the quiet time after the connection's frames.
        std::thread::sleep(Duration::from_millis(50));
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || b.wait_notification(Duration::from_secs(10)))
        };
        // Link probes (every 20 ms on a silent link) make the transport busy for a moment now
        // and then; a waiter that drove a quiet transport would keep it watched all along.
        let (samples, mut watched) = (60, 0);
        for _ in 0..samples {
            std::thread::sleep(Duration::from_millis(5));
            watched += usize::from(ep.is_watching());
        }
        assert!(
            watched * 2 < samples,
            "the network thread watched a waiter on a quiet transport {watched} of {samples} times"
        );
        conn.write(&region.handle(), 0, &[1], crate::OpFlags::NONE.notify(7)).wait().unwrap();
        let n = waiter.join().unwrap().expect("the notification reaches the spinning waiter");
        assert_eq!((n.from, n.imm), (a.id(), 7));
    }

    // Checks that a wait sees peers that connect after it began: it keeps its snapshot of the
    // peers between looks and takes a new one when they change. On each transport, a thread
    // of node a waits for a message before node b exists; b then joins, connects and sends,
    // and the wait returns b's message (it would time out on a snapshot never renewed).
    #[test]
    fn a_wait_sees_a_peer_that_connects_after_it_began() {
        use std::sync::Arc;
        for transport in [TransportChoice::Shm, TransportChoice::Edge] {
            let mh = mh();
            let a = Arc::new(node(&mh, "view-a", transport, None));
            let waiter = {
                let a = a.clone();
                std::thread::spawn(move || a.recv_timeout(Duration::from_secs(10)))
            };
            std::thread::sleep(Duration::from_millis(100));
            let b = node(&mh, "view-b", transport, None);
            b.connect(a.id()).unwrap().send(b"late peer").wait().unwrap();
            let m = waiter.join().unwrap().unwrap_or_else(|e| panic!("{transport:?}: {e}"));
            assert_eq!((m.from, &m.data[..]), (b.id(), &b"late peer"[..]), "{transport:?}");
        }
    }

    // Checks that no peer starves another: two peers each queue 50 messages to node a before
    // it reads; of the first 20 a takes (each receive starting one peer further than the last),
    // each peer's make up at least a third. A receive that always began at the same peer would
    // take 20 from one of them.
    #[test]
    fn receives_take_from_every_peer_in_turn() {
        let mh = mh();
        let [a, b, c] = ["turn-a", "turn-b", "turn-c"].map(|n| node(&mh, n, TransportChoice::Shm, None));
        // a connects first, so both connections are among its peers before anything is sent;
        // the peers connect once they have taken a's connection in (else a peer's connect
        // could open a second one, which a would look at as a third peer).
        let _a_to: Vec<_> = [&b, &c].iter().map(|p| a.connect(p.id()).unwrap()).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while [&b, &c].iter().any(|p| p.inner.conns_of(a.id()).is_empty()) {
            assert!(std::time::Instant::now() < deadline, "the peers never took a's connections in");
            std::thread::sleep(Duration::from_millis(1));
        }
        for peer in [&b, &c] {
            let conn = peer.connect(a.id()).unwrap();
            for i in 0..50u8 {
                conn.send(&[i]).wait().unwrap();
            }
        }
        let froms: Vec<NodeId> = (0..20).map(|_| a.recv_timeout(Duration::from_secs(5)).unwrap().from).collect();
        for peer in [&b, &c] {
            let n = froms.iter().filter(|&&f| f == peer.id()).count();
            assert!(n >= 7, "{n} of 20 from node {}: {froms:?}", peer.id());
        }
    }

    // Checks that a thread asleep in a wait leaves the edge transport to its network thread
    // even though its last look before sleeping drove the transport: with the network
    // thread's looks an hour apart, it must not be watching while the waiter sleeps (it would
    // leave the sockets unread until the waiter's next look, milliseconds later). Fails when
    // the wait does not say again, after that look, that it sleeps.
    #[test]
    fn a_sleeping_waiter_whose_last_look_drove_the_transport_is_not_watched() {
        let (_mh, f) = edge_node("rest-sleeper", Duration::from_micros(100));
        let f = std::sync::Arc::new(f);
        let ep = f.edge.clone().expect("an edge endpoint");
        let waiter = {
            let f = f.clone();
            std::thread::spawn(move || f.wait_notification(Duration::from_millis(1500)))
        };
        // The waiter spins 100 µs, then sleeps for the rest of its 1.5 s; looked at for 1 s.
        std::thread::sleep(Duration::from_millis(200));
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            assert!(!ep.is_watching(), "the network thread watches a thread that sleeps");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(matches!(waiter.join().unwrap(), Err(Error::Timeout)));
    }
}
