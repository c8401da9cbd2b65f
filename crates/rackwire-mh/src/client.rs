//! The client side: how a node (or an observer such as `rackwire nodes`) talks to the
//! management host.
//!
//! The client keeps one session open, heartbeats on it from a background thread, and
//! reconnects when the management host comes back, replaying what this node told it (its
//! registration, publications and grant records) so a host that lost its state learns it
//! again. Everything resolved is cached: while the management host is down, lookups of known
//! nodes and names answer from the cache.

use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use tracing::{info, warn};

use crate::auth::{self, from_hex, to_hex};
use crate::channel::{Channel, Ephemeral};
use crate::identity::Identity;
use crate::proto::*;
use crate::server::{read_line, write_json};
use crate::{check_name, MhError, HEARTBEAT_INTERVAL, MH_REQUEST_TIMEOUT};

/// What kind of client this is.
#[derive(Clone, Debug)]
pub enum Role {
    /// A fabric node, proving it is the node it names with its key pair: gets an id (bound
    /// to its name and public key), is listed, heartbeats.
    Node(Arc<Identity>),
    /// An inspection tool: reads only, gets no id.
    Observer,
}

impl Role {
    fn is_node(&self) -> bool {
        matches!(self, Role::Node(_))
    }
}

/// What a node signs to prove to the management host that it holds its key, and that the
/// session's ephemeral keys are the ones it and the host sent.
pub(crate) fn admission_message(server_nonce: &[u8], name: &str, key: &[u8], ephemerals: [&str; 2]) -> Vec<u8> {
    let [client, server] = ephemerals;
    [
        b"rackwire-mh-node\0",
        server_nonce,
        &(name.len() as u32).to_le_bytes(),
        name.as_bytes(),
        key,
        client.as_bytes(),
        b"\0",
        server.as_bytes(),
    ]
    .concat()
}

/// Where the management host is and how to prove we belong.
#[derive(Clone)]
pub struct MhConfig {
    /// `host:port`, or several separated by commas (management hosts sharing one etcd).
    pub addr: String,
    /// The fabric's shared secret.
    pub secret: Vec<u8>,
    /// This node's name.
    pub name: String,
    /// Node or observer.
    pub role: Role,
}

impl std::fmt::Debug for MhConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MhConfig")
            .field("addr", &self.addr)
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

struct Session {
    w: TcpStream,
    r: BufReader<TcpStream>,
    /// Every request and reply after admission is authenticated.
    channel: Channel,
}

#[derive(Default)]
struct Mine {
    info: Option<NodeInfo>,
    published: BTreeMap<String, RegionEntry>,
    grants: Vec<GrantEntry>,
}

struct Inner {
    cfg: MhConfig,
    node_id: NodeId,
    session: Mutex<Option<Session>>,
    nodes: Mutex<HashMap<NodeId, NodeInfo>>,
    regions: Mutex<HashMap<String, RegionEntry>>,
    mine: Mutex<Mine>,
}

/// A session with the management host.
pub struct MhClient {
    inner: Arc<Inner>,
    stop: Arc<AtomicBool>,
    heartbeat: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MhClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MhClient").field("cfg", &self.inner.cfg).field("node_id", &self.inner.node_id).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unavailable(e: impl std::fmt::Display) -> MhError {
    MhError::Unavailable(e.to_string())
}

fn recv<T: serde::de::DeserializeOwned>(r: &mut BufReader<TcpStream>) -> Result<T, MhError> {
    let mut line = String::new();
    read_line(r, &mut line).map_err(unavailable)?.ok_or_else(|| unavailable("management host closed the session"))?;
    serde_json::from_str(&line).map_err(|e| MhError::Protocol(e.to_string()))
}

/// Open a session and pass admission. Returns the session and our node id.
fn connect(cfg: &MhConfig) -> Result<(Session, NodeId), MhError> {
    // Several management hosts (one leads, the others stand by and do not listen): the first
    // that accepts is the one that leads.
    let mut addrs = Vec::new();
    for a in cfg.addr.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        addrs.extend(a.to_socket_addrs().map_err(|e| MhError::Config(format!("management host address {a:?}: {e}")))?);
    }
    let mut last = None;
    let stream = addrs
        .iter()
        .find_map(|a| TcpStream::connect_timeout(a, MH_REQUEST_TIMEOUT).map_err(|e| last = Some(e)).ok())
        .ok_or_else(|| unavailable(last.map_or_else(|| "no address".to_string(), |e| e.to_string())))?;
    stream.set_read_timeout(Some(MH_REQUEST_TIMEOUT)).map_err(unavailable)?;
    let _ = stream.set_nodelay(true);
    let mut w = stream.try_clone().map_err(unavailable)?;
    let mut r = BufReader::new(stream);
    let nonce = auth::nonce();
    let (role, key) = match &cfg.role {
        Role::Node(id) => ("node", Some(to_hex(&id.public()))),
        Role::Observer => ("observer", None),
    };
    let eph = Ephemeral::generate();
    let (pake, my_pake) = auth::Pake::start(&cfg.secret, true, &crate::proto::admission_context(&cfg.name));
    let hello = Hello {
        name: cfg.name.clone(),
        role: role.into(),
        nonce: to_hex(&nonce),
        key,
        ephemeral: eph.public.clone(),
        pake: to_hex(&my_pake),
    };
    write_json(&mut w, &hello).map_err(unavailable)?;
    let ch: Challenge = recv(&mut r)?;
    let transcript = crate::proto::admission_transcript(&hello, &ch);
    let key = from_hex(&ch.pake).and_then(|m| pake.finish(&m));
    let server_ok = key
        .as_ref()
        .zip(from_hex(&ch.proof))
        .is_some_and(|(k, p)| k.check(crate::proto::CONFIRM_SERVER, &transcript, &p));
    let Some(key) = key.filter(|_| server_ok) else {
        // Either the server does not hold our secret or we hold the wrong one; say so plainly.
        return Err(MhError::Denied("wrong secret (the management host's proof does not match ours)".into()));
    };
    let server_nonce = from_hex(&ch.nonce).ok_or_else(|| MhError::Protocol("bad server nonce".into()))?;
    let proof = key.confirm(crate::proto::CONFIRM_CLIENT, &transcript);
    let signature = match &cfg.role {
        Role::Node(id) => {
            let msg = admission_message(&server_nonce, &cfg.name, &id.public(), [&eph.public, &ch.ephemeral]);
            Some(to_hex(&id.sign(&msg)))
        }
        Role::Observer => None,
    };
    let channel = eph.channel(&ch.ephemeral, &cfg.secret, &nonce, &server_nonce, true)?;
    write_json(&mut w, &Proof { proof: to_hex(&proof), signature }).map_err(unavailable)?;
    match recv::<Admission>(&mut r)? {
        Admission::Welcome { node_id } => Ok((Session { w, r, channel }, node_id)),
        Admission::Denied { reason } => Err(MhError::Denied(reason)),
    }
}

fn exchange(s: &mut Session, req: &Request) -> Result<Reply, MhError> {
    let text = serde_json::to_string(req).map_err(|e| MhError::Protocol(e.to_string()))?;
    let line = s.channel.seal(&text) + "\n";
    std::io::Write::write_all(&mut s.w, line.as_bytes()).map_err(unavailable)?;
    let mut line = String::new();
    read_line(&mut s.r, &mut line)
        .map_err(unavailable)?
        .ok_or_else(|| unavailable("management host closed the session"))?;
    serde_json::from_str(s.channel.open(&line)?).map_err(|e| MhError::Protocol(e.to_string()))
}

fn check(reply: Reply) -> Result<Reply, MhError> {
    match reply {
        Reply::Error { kind, message } if kind == "not_found" => Err(MhError::NotFound(message)),
        Reply::Error { message, .. } => Err(MhError::Refused(message)),
        other => Ok(other),
    }
}

impl Inner {
    /// Send a request on the session, reconnecting first if there is none. A broken session
    /// is dropped, so the next call (or the heartbeat) reconnects.
    fn request(&self, req: &Request) -> Result<Reply, MhError> {
        let mut guard = lock(&self.session);
        if guard.is_none() {
            *guard = Some(self.reconnect()?);
        }
        let s = guard.as_mut().expect("set above");
        match exchange(s, req) {
            Ok(r) => check(r),
            Err(e) => {
                *guard = None;
                Err(e)
            }
        }
    }

    /// A new session, with this node's registration, publications and grants replayed.
    fn reconnect(&self) -> Result<Session, MhError> {
        let (mut s, id) = connect(&self.cfg)?;
        if id != self.node_id {
            warn!(old = self.node_id, new = id, "management host gave a different id; it lost its state");
        }
        let mine = lock(&self.mine);
        let replay = mine
            .info
            .iter()
            .map(|info| Request::Register { info: info.clone() })
            .chain(mine.published.values().map(|e| Request::Publish { entry: e.clone() }))
            .chain(mine.grants.iter().map(|g| Request::Grant { grant: g.clone() }));
        for req in replay {
            if let Err(e) = exchange(&mut s, &req).and_then(check) {
                warn!("replaying to the management host: {e}");
            }
        }
        info!(addr = %self.cfg.addr, "session with the management host (re)established");
        Ok(s)
    }
}

impl MhClient {
    /// Join as configured: connect, pass admission, start heartbeats (nodes only).
    pub fn join(cfg: MhConfig) -> Result<Self, MhError> {
        if cfg.secret.len() < auth::SECRET_BYTES_MIN {
            return Err(MhError::Config(format!("the secret must be at least {} bytes", auth::SECRET_BYTES_MIN)));
        }
        if cfg.role.is_node() {
            check_name(&cfg.name)?;
        }
        let (session, node_id) = connect(&cfg)?;
        let node = cfg.role.is_node();
        let inner = Arc::new(Inner {
            cfg,
            node_id,
            session: Mutex::new(Some(session)),
            nodes: Mutex::new(HashMap::new()),
            regions: Mutex::new(HashMap::new()),
            mine: Mutex::new(Mine::default()),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let heartbeat = node.then(|| {
            let weak = Arc::downgrade(&inner);
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("rw-mh-heartbeat".into())
                .spawn(move || heartbeat_loop(weak, stop))
                .expect("spawn heartbeat thread")
        });
        Ok(MhClient { inner, stop, heartbeat })
    }

    /// This node's id (0 for observers).
    pub fn node_id(&self) -> NodeId {
        self.inner.node_id
    }

    /// This client's name.
    pub fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    /// Tell the management host how to reach this node.
    pub fn register(&self, info: NodeInfo) -> Result<(), MhError> {
        lock(&self.inner.mine).info = Some(info.clone());
        self.inner.request(&Request::Register { info }).map(drop)
    }

    /// How to reach `node`: from the cache if known, else from the management host.
    pub fn resolve(&self, node: NodeId) -> Result<NodeInfo, MhError> {
        if let Some(info) = lock(&self.inner.nodes).get(&node) {
            return Ok(info.clone());
        }
        self.refresh(node)
    }

    /// Ask the management host afresh how to reach `node`, updating the cache.
    pub fn refresh(&self, node: NodeId) -> Result<NodeInfo, MhError> {
        match self.inner.request(&Request::Resolve { node })? {
            Reply::Node { info } => {
                lock(&self.inner.nodes).insert(node, info.clone());
                Ok(info)
            }
            other => Err(MhError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// How to reach the node called `name` (management host first, cache when it is down).
    pub fn resolve_name(&self, name: &str) -> Result<NodeInfo, MhError> {
        match self.inner.request(&Request::ResolveName { name: name.into() }) {
            Ok(Reply::Node { info }) => {
                lock(&self.inner.nodes).insert(info.id, info.clone());
                Ok(info)
            }
            Ok(other) => Err(MhError::Protocol(format!("unexpected reply {other:?}"))),
            Err(MhError::Unavailable(e)) => {
                lock(&self.inner.nodes).values().find(|n| n.name == name).cloned().ok_or(MhError::Unavailable(e))
            }
            Err(e) => Err(e),
        }
    }

    /// Every node the management host knows, with whether it is up.
    pub fn nodes(&self) -> Result<Vec<NodeStatus>, MhError> {
        match self.inner.request(&Request::Nodes)? {
            Reply::Nodes { nodes } => Ok(nodes),
            other => Err(MhError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Publish one of this node's regions under a name.
    pub fn publish(&self, entry: RegionEntry) -> Result<(), MhError> {
        self.inner.request(&Request::Publish { entry: entry.clone() })?;
        lock(&self.inner.mine).published.insert(entry.name.clone(), entry);
        Ok(())
    }

    /// Withdraw a name this node published.
    pub fn unpublish(&self, name: &str) -> Result<(), MhError> {
        lock(&self.inner.mine).published.remove(name);
        self.inner.request(&Request::Unpublish { name: name.into() }).map(drop)
    }

    /// Find a region by name (management host first, cache when it is down).
    pub fn lookup(&self, name: &str) -> Result<RegionEntry, MhError> {
        match self.inner.request(&Request::Lookup { name: name.into() }) {
            Ok(Reply::Region { entry }) => {
                lock(&self.inner.regions).insert(name.into(), entry.clone());
                Ok(entry)
            }
            Ok(other) => Err(MhError::Protocol(format!("unexpected reply {other:?}"))),
            Err(MhError::Unavailable(e)) => lock(&self.inner.regions).get(name).cloned().ok_or(MhError::Unavailable(e)),
            Err(e) => Err(e),
        }
    }

    /// Post `blob` as `rank` of the `size`-rank `job` in bootstrap round `round` (round 0
    /// joins the job). See [`crate::jobs`].
    pub fn job_post(&self, job: &str, size: u32, rank: u32, round: u64, blob: &[u8]) -> Result<(), MhError> {
        let req = Request::JobPost { job: job.into(), size, rank, round, blob: to_hex(blob) };
        self.inner.request(&req).map(drop)
    }

    /// What round `round` of `job` holds so far.
    pub fn job_round(&self, job: &str, round: u64) -> Result<JobRound, MhError> {
        match self.inner.request(&Request::JobRound { job: job.into(), round })? {
            Reply::Job { round } => Ok(round),
            other => Err(MhError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// The region directory and grant records.
    pub fn regions(&self) -> Result<(Vec<RegionEntry>, Vec<GrantEntry>), MhError> {
        match self.inner.request(&Request::Regions)? {
            Reply::Regions { regions, grants } => Ok((regions, grants)),
            other => Err(MhError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Record a grant. The owner enforces grants itself, so while the management host is
    /// down the record is kept here and sent when it is back.
    pub fn record_grant(&self, grant: GrantEntry) {
        {
            let mut mine = lock(&self.inner.mine);
            mine.grants.retain(|g| !(g.region == grant.region && g.peer == grant.peer));
            mine.grants.push(grant.clone());
        }
        if let Err(e) = self.inner.request(&Request::Grant { grant }) {
            warn!("grant record deferred: {e}");
        }
    }

    /// Remove a grant record (deferred like [`MhClient::record_grant`]).
    pub fn record_revoke(&self, region: u32, peer: NodeId) {
        lock(&self.inner.mine).grants.retain(|g| !(g.region == region && g.peer == peer));
        if let Err(e) = self.inner.request(&Request::Revoke { region, peer }) {
            warn!("revoke record deferred: {e}");
        }
    }

    /// Forget a freed region's names and grants.
    pub fn drop_region(&self, region: u32) {
        {
            let mut mine = lock(&self.inner.mine);
            mine.grants.retain(|g| g.region != region);
            mine.published.retain(|_, e| e.region != region);
        }
        if let Err(e) = self.inner.request(&Request::DropRegion { region }) {
            warn!("region drop record deferred: {e}");
        }
    }
}

fn heartbeat_loop(inner: Weak<Inner>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(HEARTBEAT_INTERVAL);
        let Some(inner) = inner.upgrade() else { return };
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let _ = inner.request(&Request::Heartbeat);
    }
}

impl Drop for MhClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(s) = lock(&self.inner.session).take() {
            let _ = s.w.shutdown(std::net::Shutdown::Both);
        }
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fabric secret of these tests.
    const SECRET: &[u8] = b"correct-secret-0123456789";
    use crate::ManagementHost;

    /// A node key per name, the same every time.
    fn key(name: &str) -> Arc<Identity> {
        let mut seed = [0u8; 32];
        seed[..name.len().min(32)].copy_from_slice(&name.as_bytes()[..name.len().min(32)]);
        Arc::new(Identity::from_seed(&seed))
    }

    fn cfg(addr: &str, secret: &[u8], name: &str) -> MhConfig {
        MhConfig { addr: addr.into(), secret: secret.to_vec(), name: name.into(), role: Role::Node(key(name)) }
    }

    // Checks admission: the right secret gets an id, the same name gets the same id again after
    // leaving, a live name cannot be taken twice, and a wrong secret is refused with Denied.
    #[test]
    fn admission_by_secret_and_stable_ids() {
        let mh = ManagementHost::start("127.0.0.1:0", None, SECRET).unwrap();
        let addr = mh.addr().to_string();
        let a = MhClient::join(cfg(&addr, SECRET, "a")).unwrap();
        let id = a.node_id();
        assert!(id >= 1);
        assert!(matches!(MhClient::join(cfg(&addr, SECRET, "a")), Err(MhError::Denied(_))));
        assert!(matches!(MhClient::join(cfg(&addr, b"wrong-secret-0123456789", "b")), Err(MhError::Denied(_))));
        drop(a);
        // The session close is seen by the server's session thread shortly after.
        let again = (0..100).find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            MhClient::join(cfg(&addr, SECRET, "a")).ok()
        });
        assert_eq!(again.unwrap().node_id(), id);
    }

    // Checks that a name is bound to the key it was first admitted with: after its node left,
    // a client with the fabric secret but another key is refused under that name (and gets
    // no id), while the node with its own key gets its id back; the other key can join under
    // a name of its own. The bound key is what others see for the node.
    #[test]
    fn a_name_is_bound_to_its_first_key() {
        let mh = ManagementHost::start("127.0.0.1:0", None, SECRET).unwrap();
        let addr = mh.addr().to_string();
        let a = MhClient::join(cfg(&addr, SECRET, "a")).unwrap();
        let id = a.node_id();
        a.register(NodeInfo { host: "h".into(), key: "ff".repeat(32), ..NodeInfo::default() }).unwrap();
        drop(a);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let impostor = MhConfig { role: Role::Node(key("not-a")), ..cfg(&addr, SECRET, "a") };
        match MhClient::join(impostor.clone()) {
            Err(MhError::Denied(why)) => assert!(why.contains("bound to another"), "{why}"),
            other => panic!("an impostor got in: {other:?}"),
        }
        let back = (0..100).find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            MhClient::join(cfg(&addr, SECRET, "a")).ok()
        });
        assert_eq!(back.unwrap().node_id(), id, "the node with its key keeps its id");
        let other = MhClient::join(MhConfig { name: "b".into(), ..impostor }).unwrap();
        assert_ne!(other.node_id(), id);
        let seen = other.resolve(id).unwrap();
        assert_eq!(seen.key, to_hex(&key("a").public()), "the node's own key, not what it registered");
    }

    // Checks how a node's departure is recorded: a node that closes its session (it left, or
    // its process ended) is listed down and `ended`, which its peers may take as gone; once it
    // joins again it is up and no longer `ended`.
    #[test]
    fn a_closed_session_is_recorded_as_ended() {
        let mh = ManagementHost::start("127.0.0.1:0", None, SECRET).unwrap();
        let addr = mh.addr().to_string();
        let obs = MhClient::join(MhConfig { role: Role::Observer, ..cfg(&addr, SECRET, "obs") }).unwrap();
        let a = MhClient::join(cfg(&addr, SECRET, "a")).unwrap();
        let id = a.node_id();
        let status = |id| obs.nodes().unwrap().into_iter().find(|n| n.info.id == id).unwrap();
        assert!(status(id).up && !status(id).ended);
        drop(a);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while status(id).up {
            assert!(std::time::Instant::now() < deadline, "the closed session was not noticed");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(status(id).ended, "a closed session ends the node");
        let back = MhClient::join(cfg(&addr, SECRET, "a")).unwrap();
        assert_eq!(back.node_id(), id);
        assert!(status(id).up && !status(id).ended);
    }

    // Checks the bounds before admission: with 2000 connections that never say anything, a
    // node still joins at once, and the host keeps at most PRE_ADMISSION_MAX connections
    // waiting (its metrics say how many); then a connection that trickles a byte every 200 ms
    // is shut once its ADMISSION_TIMEOUT in all is over, however steadily it sends.
    #[test]
    fn slow_connections_cannot_crowd_out_joins() {
        use crate::sessions::{ADMISSION_TIMEOUT, PRE_ADMISSION_MAX};
        use std::io::Write;
        use std::time::{Duration, Instant};
        let mh = ManagementHost::start("127.0.0.1:0", None, SECRET).unwrap();
        let addr = mh.addr();
        // 2000 held open (fewer only where this process may not open that many files: said).
        let mut idle = Vec::with_capacity(2000);
        for _ in 0..2000 {
            match TcpStream::connect(addr) {
                Ok(s) => idle.push(s),
                Err(e) if e.raw_os_error() == Some(24) => {
                    eprintln!("only {} connections: this process may open no more files", idle.len());
                    break;
                }
                Err(e) => panic!("connect: {e}"),
            }
        }
        assert!(idle.len() > 2 * PRE_ADMISSION_MAX, "{} connections", idle.len());
        let t = Instant::now();
        let a = MhClient::join(cfg(&addr.to_string(), SECRET, "a")).expect("a node joins");
        assert!(t.elapsed() < Duration::from_secs(2), "joined after {:?}", t.elapsed());
        assert!(a.node_id() >= 1);
        let waiting = mh
            .metrics()
            .lines()
            .find_map(|l| l.strip_prefix("rackwire_mh_sessions_waiting ")?.parse::<usize>().ok())
            .unwrap();
        assert!(waiting <= PRE_ADMISSION_MAX, "{waiting} connections waiting");
        drop(idle);
        let opened = Instant::now();
        let mut trickler = TcpStream::connect(addr).unwrap();
        let shut = loop {
            if trickler.write_all(b"{").is_err() {
                break opened.elapsed();
            }
            assert!(opened.elapsed() < ADMISSION_TIMEOUT * 3, "the trickler was never shut");
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(shut >= ADMISSION_TIMEOUT && shut < ADMISSION_TIMEOUT + Duration::from_secs(1), "shut after {shut:?}");
    }

    // Checks recovery from a damaged state file: after three changes (a registration, a
    // publication, a grant record) the state file is overwritten with garbage; the management
    // host starts from the last good copy beside it (the state before the last change: the
    // node and its region are there). With both damaged it refuses to start, naming the file.
    #[test]
    fn a_damaged_state_file_gives_way_to_the_last_good_copy() {
        let dir = std::env::temp_dir().join(format!("rw-mh-damaged-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let mh = ManagementHost::start("127.0.0.1:0", Some(&dir), SECRET).unwrap();
            let c = MhClient::join(cfg(&mh.addr().to_string(), SECRET, "n1")).unwrap();
            c.register(NodeInfo { host: "h".into(), ..NodeInfo::default() }).unwrap();
            let key = "00".repeat(16);
            c.publish(RegionEntry { name: "r1".into(), node: c.node_id(), region: 7, key, len: 64 }).unwrap();
            c.record_grant(GrantEntry { node: c.node_id(), region: 7, peer: 9, access: 1 });
            drop(c);
            mh.stop();
        }
        std::fs::write(dir.join("state.json"), b"{ not json").unwrap();
        {
            let mh = ManagementHost::start("127.0.0.1:0", Some(&dir), SECRET).expect("starts from the copy");
            let o =
                MhClient::join(MhConfig { role: Role::Observer, ..cfg(&mh.addr().to_string(), SECRET, "o") }).unwrap();
            assert_eq!(o.lookup("r1").unwrap().region, 7);
            assert_eq!(o.nodes().unwrap()[0].info.host, "h");
            mh.stop();
        }
        std::fs::write(dir.join("state.json"), b"{ not json").unwrap();
        std::fs::write(dir.join("state.json.prev"), b"nor this").unwrap();
        match ManagementHost::start("127.0.0.1:0", Some(&dir), SECRET) {
            Err(MhError::Config(m)) => assert!(m.contains("state.json") && m.contains("damaged"), "{m}"),
            other => panic!("started on two damaged files: {other:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    // Checks that a failed save leaves nothing behind in memory: with the state folder gone
    // (a file in its place), a publication is refused and the name is not served afterwards;
    // and registrations out of bounds (a link that is no ip:port, a huge host name) and a
    // publication without a proper key are refused.
    #[test]
    fn refused_changes_leave_no_trace() {
        let dir = std::env::temp_dir().join(format!("rw-mh-nosave-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mh = ManagementHost::start("127.0.0.1:0", Some(&dir), SECRET).unwrap();
        let c = MhClient::join(cfg(&mh.addr().to_string(), SECRET, "n1")).unwrap();
        let bad_link = NodeInfo { links: vec!["not-an-address".into()], ..NodeInfo::default() };
        assert!(matches!(c.register(bad_link), Err(MhError::Refused(_))));
        assert!(matches!(
            c.register(NodeInfo { host: "h".repeat(5000), ..NodeInfo::default() }),
            Err(MhError::Refused(_))
        ));
        let entry = RegionEntry { name: "r1".into(), node: c.node_id(), region: 7, key: "xyz".into(), len: 64 };
        assert!(matches!(c.publish(entry.clone()), Err(MhError::Refused(_))));
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::write(&dir, b"a file where the folder was").unwrap();
        let entry = RegionEntry { key: "00".repeat(16), ..entry };
        assert!(c.publish(entry).is_err(), "the save failed, so did the request");
        assert!(matches!(c.lookup("r1"), Err(MhError::NotFound(_))), "and the name is not served");
        let _ = std::fs::remove_file(&dir);
    }

    // Checks that requests after admission must be authenticated: a client that passed
    // admission (here by hand, as an observer) gets an answer to a request sealed under its
    // session's key, and the session is closed, unanswered, at a request without it (as an
    // injected one would be).
    #[test]
    fn unauthenticated_requests_end_the_session() {
        use std::io::{BufRead, Write};
        let mh = ManagementHost::start("127.0.0.1:0", None, SECRET).unwrap();
        let stream = TcpStream::connect(mh.addr()).unwrap();
        stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let (mut w, mut r) = (stream.try_clone().unwrap(), BufReader::new(stream));
        let (nonce, eph) = (auth::nonce(), Ephemeral::generate());
        let (pake, msg) = auth::Pake::start(SECRET, true, &crate::proto::admission_context("o"));
        let hello = Hello {
            name: "o".into(),
            role: "observer".into(),
            nonce: to_hex(&nonce),
            key: None,
            ephemeral: eph.public.clone(),
            pake: to_hex(&msg),
        };
        write_json(&mut w, &hello).unwrap();
        let ch: Challenge = recv(&mut r).unwrap();
        let server_nonce = from_hex(&ch.nonce).unwrap();
        let key = pake.finish(&from_hex(&ch.pake).unwrap()).unwrap();
        let proof = key.confirm(crate::proto::CONFIRM_CLIENT, &crate::proto::admission_transcript(&hello, &ch));
        let mut channel = eph.channel(&ch.ephemeral, SECRET, &nonce, &server_nonce, true).unwrap();
        write_json(&mut w, &Proof { proof: to_hex(&proof), signature: None }).unwrap();
        assert!(matches!(recv::<Admission>(&mut r).unwrap(), Admission::Welcome { .. }));
        let sealed = channel.seal(r#"{"op":"nodes"}"#);
        w.write_all(format!("{sealed}\n").as_bytes()).unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(channel.open(&line).unwrap().contains("nodes"), "{line}");
        w.write_all(b"{\"op\":\"nodes\"}\n").unwrap();
        line.clear();
        assert_eq!(r.read_line(&mut line).unwrap_or(0), 0, "answered an unauthenticated request: {line}");
    }

    // Checks that admission gives a caller without the secret nothing to test guesses of it
    // offline: a caller that speaks with a wrong secret gets the management host's challenge,
    // but neither a secret-keyed HMAC of what it saw (what the host sent before) nor a fresh
    // exchange with the right secret checks against the host's proof, so even a guess that
    // happens to be right cannot be told from a wrong one. An eavesdropper sees less.
    #[test]
    fn admission_gives_no_offline_test_of_a_guessed_secret() {
        let mh = ManagementHost::start("127.0.0.1:0", None, SECRET).unwrap();
        let stream = TcpStream::connect(mh.addr()).unwrap();
        stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let (mut w, mut r) = (stream.try_clone().unwrap(), BufReader::new(stream));
        let ctx = crate::proto::admission_context("guesser");
        let (_, msg) = auth::Pake::start(b"a-wrong-guess-0123456789", true, &ctx);
        let nonce = auth::nonce();
        let hello = Hello {
            name: "guesser".into(),
            role: "observer".into(),
            nonce: to_hex(&nonce),
            key: None,
            ephemeral: Ephemeral::generate().public.clone(),
            pake: to_hex(&msg),
        };
        write_json(&mut w, &hello).unwrap();
        let ch: Challenge = recv(&mut r).unwrap();
        let proof = from_hex(&ch.proof).unwrap();
        let transcript = crate::proto::admission_transcript(&hello, &ch);
        // The right secret as an offline guess: an HMAC keyed by it, over anything seen...
        let keyed = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET);
        for seen in [&nonce[..], &transcript, ctx.as_slice()] {
            for label in [crate::proto::CONFIRM_SERVER, "rackwire-mh-server"] {
                let tag = ring::hmac::sign(&keyed, &[label.as_bytes(), &[0], seen].concat());
                assert_ne!(tag.as_ref(), &proof[..]);
            }
        }
        // ... or a whole exchange run again with it.
        let (again, _) = auth::Pake::start(SECRET, true, &ctx);
        let key = again.finish(&from_hex(&ch.pake).unwrap()).unwrap();
        assert!(!key.check(crate::proto::CONFIRM_SERVER, &transcript, &proof), "a right guess checked offline");
    }

    // Checks that a node cannot register another live node's link as its own (virtual NICs
    // would route that node's traffic to it): refused with the owner named, while its own
    // distinct link is taken; once the owner has left, the link is free.
    #[test]
    fn a_node_cannot_register_another_live_nodes_link() {
        let mh = ManagementHost::start("127.0.0.1:0", None, SECRET).unwrap();
        let addr = mh.addr().to_string();
        let a = MhClient::join(cfg(&addr, SECRET, "a")).unwrap();
        let b = MhClient::join(cfg(&addr, SECRET, "b")).unwrap();
        let links = |l: &[&str]| NodeInfo { links: l.iter().map(|s| s.to_string()).collect(), ..Default::default() };
        a.register(links(&["198.18.0.1:7000"])).unwrap();
        let refused = b.register(links(&["198.18.0.2:7000", "198.18.0.1:7000"]));
        assert!(
            matches!(&refused, Err(MhError::Refused(m)) if m.contains("198.18.0.1:7000") && m.contains('a')),
            "{refused:?}"
        );
        b.register(links(&["198.18.0.2:7000"])).unwrap();
        drop(a);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while b.register(links(&["198.18.0.1:7000"])).is_err() {
            assert!(std::time::Instant::now() < deadline, "the link stayed taken after its node left");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    // Checks that a management host that lost its state does not hand a live node's id to a
    // newcomer: a node joins, the host's state folder is lost and the host restarts empty, and
    // a new node gets another id (ids of a fresh state start at a random point).
    #[test]
    fn a_lost_state_does_not_hand_out_a_live_nodes_id_again() {
        let dir = std::env::temp_dir().join(format!("rw-mh-lost-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mh = ManagementHost::start("127.0.0.1:0", Some(&dir), SECRET).unwrap();
        let old = MhClient::join(cfg(&mh.addr().to_string(), SECRET, "old")).unwrap();
        let old_id = old.node_id();
        drop(mh);
        std::fs::remove_dir_all(&dir).unwrap();
        let mh = ManagementHost::start("127.0.0.1:0", Some(&dir), SECRET).unwrap();
        let new = MhClient::join(cfg(&mh.addr().to_string(), SECRET, "new")).unwrap();
        assert_ne!(new.node_id(), old_id, "a lost state handed out a live node's id again");
        assert!(crate::state::FIRST_ID_RANGE.contains(&new.node_id()), "the first id is drawn from the range");
        let _ = std::fs::remove_dir_all(&dir);
    }

    // Checks that a node may publish, unpublish and record grants only for its own regions:
    // each such request about another node's region is refused, and the other node's
    // publication stays.
    #[test]
    fn a_node_cannot_speak_for_another_nodes_regions() {
        let mh = ManagementHost::start("127.0.0.1:0", None, SECRET).unwrap();
        let addr = mh.addr().to_string();
        let a = MhClient::join(cfg(&addr, SECRET, "a")).unwrap();
        let b = MhClient::join(cfg(&addr, SECRET, "b")).unwrap();
        let entry = RegionEntry { name: "ra".into(), node: a.node_id(), region: 1, key: "00".repeat(16), len: 64 };
        a.publish(entry.clone()).unwrap();
        assert!(matches!(b.publish(RegionEntry { name: "rb".into(), ..entry.clone() }), Err(MhError::Refused(_))));
        assert!(matches!(b.unpublish("ra"), Err(MhError::Refused(_))));
        let grant = GrantEntry { node: a.node_id(), region: 1, peer: b.node_id(), access: 3 };
        b.record_grant(grant.clone());
        a.record_grant(GrantEntry { peer: 99, ..grant });
        let (regions, grants) = b.regions().unwrap();
        assert_eq!(grants.iter().map(|g| g.peer).collect::<Vec<_>>(), vec![99], "only the owner's grant is recorded");
        assert_eq!(regions.len(), 1);
        assert_eq!(b.lookup("ra").unwrap().node, a.node_id());
    }

    // Checks that state survives a restart: a published region and a node's registration are
    // there after the management host is stopped and started on the same state directory; the
    // state file is readable by its owner only.
    #[test]
    fn state_survives_restart() {
        let dir = std::env::temp_dir().join(format!("rw-mh-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let entry = RegionEntry { name: "r1".into(), node: 0, region: 7, key: "00".repeat(16), len: 4096 };
        {
            let mh = ManagementHost::start("127.0.0.1:0", Some(&dir), SECRET).unwrap();
            let c = MhClient::join(cfg(&mh.addr().to_string(), SECRET, "n1")).unwrap();
            c.register(NodeInfo { host: "h".into(), pid: 1, ..NodeInfo::default() }).unwrap();
            c.publish(RegionEntry { node: c.node_id(), ..entry.clone() }).unwrap();
            drop(c);
            mh.stop();
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("state.json")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the state (every region's key) is readable by its owner only");
        let mh = ManagementHost::start("127.0.0.1:0", Some(&dir), SECRET).unwrap();
        let o =
            MhClient::join(MhConfig { role: Role::Observer, ..cfg(&mh.addr().to_string(), SECRET, "obs") }).unwrap();
        let found = o.lookup("r1").unwrap();
        assert_eq!(found.region, 7);
        let nodes = o.nodes().unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].info.host, "h");
        assert!(matches!(o.lookup("nope"), Err(MhError::NotFound(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
