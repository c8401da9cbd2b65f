//! The client side: how a node (or an observer such as `rackwire nodes`) talks to the
//! management host.
//!
//! The client keeps one session open, heartbeats on it from a background thread, and
//! reconnects when the management host comes back, naming the id it had and replaying what
//! this node told it (its registration, publications and grant records): a host that lost
//! its state gives the node its id back (unless another node has it, or it was retired) and
//! learns the rest again. Everything resolved is cached: while the management host is down, lookups of known
//! nodes and names answer from the cache.

use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use tracing::{info, warn};

use crate::auth::{self, from_hex, to_hex};
use crate::channel::{Channel, Ephemeral};
use crate::identity::Identity;
use crate::line::{read_line, write_json};
use crate::proto::*;
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
    /// Which management hosts this client takes as its own.
    pub trust: MhTrust,
    /// A node with no name of its own, whose key pair is not kept: the management host
    /// forgets it soon after it leaves (see [`crate::proto::Hello::transient`]).
    pub transient: bool,
}

/// Which management hosts a client takes as its own, besides their proof of the fabric secret:
/// every management host signs each admission with its own key, and a client can hold it to
/// that key, so that a process with the secret cannot pass for its management host.
#[derive(Clone, Debug, Default)]
pub enum MhTrust {
    /// Any host that proves the secret (tools that keep no state, tests).
    #[default]
    Secret,
    /// Each host's key is pinned at first use, per fabric (told apart by a fingerprint of its
    /// secret) and address, in this file (a node's state folder keeps it); a host of that
    /// fabric at a pinned address with another key is refused. Hosts on loopback addresses
    /// are not pinned (a launcher's own host on a port of the moment, every run a new key).
    FirstUse(std::path::PathBuf),
    /// Only hosts with one of these keys.
    Keys(Vec<crate::identity::PublicKey>),
}

impl MhTrust {
    /// Whether the host at `addr` of the fabric with `secret` may be ours with key `key`
    /// (pinning it at first use).
    fn check(
        &self,
        addr: &std::net::SocketAddr,
        secret: &[u8],
        key: &crate::identity::PublicKey,
    ) -> Result<(), MhError> {
        let hex = to_hex(key);
        match self {
            MhTrust::Secret => Ok(()),
            MhTrust::Keys(keys) if keys.contains(key) => Ok(()),
            MhTrust::Keys(_) => Err(MhError::Denied(format!(
                "the management host at {addr} signs with key {hex}, which is not one this node was given"
            ))),
            MhTrust::FirstUse(_) if addr.ip().is_loopback() => Ok(()),
            MhTrust::FirstUse(file) => pin(file, &format!("{addr}/{}", fabric_fingerprint(secret)), &hex),
        }
    }
}

/// A short fingerprint of a fabric's secret (the start of a SHA-256 of it, labelled): tells
/// fabrics apart in the pins without saying anything of the secret.
fn fabric_fingerprint(secret: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, &[b"rackwire-mh-pin\0".as_slice(), secret].concat());
    to_hex(&d.as_ref()[..8])
}

/// The key pinned for `at` in the pins' text: the first well-formed line `AT KEY` (an address
/// with no space, one space, 64 hex digits). A malformed line is no pin: a file spoiled by a
/// crash, or by an older build's interleaved writes, does not refuse a host that is genuine.
fn pinned_key<'a>(text: &'a str, at: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (a, k) = l.split_once(' ')?;
        let well_formed = k.len() == 64 && k.bytes().all(|b| b.is_ascii_hexdigit());
        (a == at && well_formed).then_some(k)
    })
}

/// Pin `key` (hex) for the management host `at` (its address and fabric) in `file` (lines
/// `AT KEY`), or check it against the key pinned there. The file is locked (`flock`) from the
/// look to the append, and each line goes in one write: processes joining at once (a job's
/// ranks) neither pin twice nor interleave their lines.
fn pin(file: &std::path::Path, at: &str, key: &str) -> Result<(), MhError> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| MhError::Config(format!("pinned management host keys {}: {e}", file.display()));
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::owner_only::create_folder(dir, crate::owner_only::Reach::Readable)
            .map_err(|e| MhError::Config(e.to_string()))?;
    }
    match std::fs::symlink_metadata(file) {
        Ok(_) => crate::owner_only::check_file(file).map_err(|e| MhError::Config(e.to_string()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .mode(0o600)
        .custom_flags(no_follow())
        .open(file)
        .map_err(io)?;
    // Released when `f` closes, whichever way this returns.
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).map_err(|e| io(e.into()))?;
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(io)?;
    let me = at;
    if let Some(pinned) = pinned_key(&text, me) {
        if pinned == key {
            return Ok(());
        }
        return Err(MhError::Denied(format!(
            "the management host at {at} signs with key {key}, not the key pinned for it ({pinned}): another \
             host holding the secret, or the host's key changed (if so on purpose, remove its line from {})",
            file.display()
        )));
    }
    f.write_all(format!("{me} {key}\n").as_bytes()).map_err(io)?;
    info!(at, key, "pinned the management host's key");
    Ok(())
}

/// `O_NOFOLLOW`: the pins are opened as the file itself, never through a link planted there.
fn no_follow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
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

/// Open a session and pass admission, as a node that had id `prev_id` if it is coming back.
/// Returns the session and our node id.
fn connect(cfg: &MhConfig, prev_id: Option<NodeId>) -> Result<(Session, NodeId), MhError> {
    // Several management hosts (one leads, the others stand by and do not listen): the first
    // that accepts is the one that leads.
    let mut addrs = Vec::new();
    for a in cfg.addr.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        addrs.extend(a.to_socket_addrs().map_err(|e| MhError::Config(format!("management host address {a:?}: {e}")))?);
    }
    let mut last = None;
    let (stream, peer) = addrs
        .iter()
        .find_map(|a| {
            TcpStream::connect_timeout(a, MH_REQUEST_TIMEOUT).map(|s| (s, *a)).map_err(|e| last = Some(e)).ok()
        })
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
        prev_id: prev_id.filter(|_| cfg.role.is_node()),
        transient: cfg.transient && cfg.role.is_node(),
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
    // The host signs the admission with its key; the key must be one this client takes.
    let host_key = crate::identity::public_from_hex(&ch.host_key)
        .ok_or_else(|| MhError::Protocol("the management host named no key".into()))?;
    let host_signed = from_hex(&ch.host_signature)
        .is_some_and(|sig| crate::identity::verify(&host_key, &crate::proto::host_signed(&transcript), &sig));
    if !host_signed {
        return Err(MhError::Denied("the management host's signature does not match the key it names".into()));
    }
    cfg.trust.check(&peer, &cfg.secret, &host_key)?;
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
        let (mut s, id) = connect(&self.cfg, Some(self.node_id))?;
        if id != self.node_id {
            warn!(
                old = self.node_id,
                new = id,
                "the management host gave this node another id (it lost its state, and another node has the \
                 old one, or it was retired): what this node published under the old one is refused"
            );
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
        let (session, node_id) = connect(&cfg, None)?;
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

    /// How far this machine's clock is from the management host's, in milliseconds (positive:
    /// ours is ahead), and how sure that is (half the request's round trip): one request,
    /// timed on both sides. `None` from a host that does not tell its time.
    pub fn clock_offset_ms(&self) -> Result<Option<(i64, u64)>, MhError> {
        let sent = crate::line::now_ms();
        // A page past every id: nothing but the host's time comes back.
        let reply = self.inner.request(&Request::Nodes { after: Some(NodeId::MAX) })?;
        let answered = crate::line::now_ms();
        match reply {
            Reply::Nodes { now_ms, .. } => Ok(now_ms.map(|mh| {
                let ours = sent / 2 + answered / 2;
                (ours as i64 - mh as i64, answered.saturating_sub(sent).div_ceil(2))
            })),
            other => Err(MhError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Every node the management host knows, with whether it is up.
    pub fn nodes(&self) -> Result<Vec<NodeStatus>, MhError> {
        let (mut all, mut after) = (Vec::new(), None);
        for _ in 0..crate::REPLY_PAGES_MAX {
            match self.inner.request(&Request::Nodes { after })? {
                Reply::Nodes { nodes, more_after, .. } => {
                    all.extend(nodes);
                    match more_after {
                        Some(id) => after = Some(id),
                        None => return Ok(all),
                    }
                }
                other => return Err(MhError::Protocol(format!("unexpected reply {other:?}"))),
            }
        }
        Err(MhError::Protocol(format!("the node list ran past {} pages", crate::REPLY_PAGES_MAX)))
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

    /// Post `blob` as `rank` of the `size`-rank `job` (with its launcher's `token`, if it has
    /// one) in bootstrap round `round` (round 0 joins the job). See [`crate::jobs`].
    pub fn job_post(
        &self,
        job: &str,
        token: Option<&str>,
        size: u32,
        rank: u32,
        round: u64,
        blob: &[u8],
    ) -> Result<(), MhError> {
        let token = token.map(str::to_string);
        let req = Request::JobPost { job: job.into(), token, size, rank, round, blob: to_hex(blob) };
        self.inner.request(&req).map(drop)
    }

    /// What round `round` of `job` (with its `token`, if it has one) holds so far.
    pub fn job_round(&self, job: &str, token: Option<&str>, round: u64) -> Result<JobRound, MhError> {
        let token = token.map(str::to_string);
        let mut whole: Option<JobRound> = None;
        for _ in 0..crate::REPLY_PAGES_MAX {
            let from_rank = whole.as_ref().map_or(0, |w| w.members.len() as u32);
            let req = Request::JobRound { job: job.into(), token: token.clone(), round, from_rank };
            let page = match self.inner.request(&req)? {
                Reply::Job { round } => round,
                other => return Err(MhError::Protocol(format!("unexpected reply {other:?}"))),
            };
            if page.first != from_rank || (page.members.is_empty() && from_rank < page.size) {
                return Err(MhError::Protocol(format!("a job round's page starts at rank {}", page.first)));
            }
            let w = whole.get_or_insert_with(|| JobRound { members: Vec::new(), ..page.clone() });
            w.down = page.down;
            w.members.extend(page.members);
            if w.members.len() >= w.size as usize {
                return Ok(whole.expect("set above"));
            }
        }
        Err(MhError::Protocol(format!("a job round ran past {} pages", crate::REPLY_PAGES_MAX)))
    }

    /// The region directory and grant records.
    pub fn regions(&self) -> Result<(Vec<RegionEntry>, Vec<GrantEntry>), MhError> {
        let (mut all_regions, mut all_grants) = (Vec::new(), Vec::new());
        let (mut after_name, mut from_grant, mut names_done, mut grants_done) = (None, 0, false, false);
        for _ in 0..crate::REPLY_PAGES_MAX {
            match self.inner.request(&Request::Regions { after_name: after_name.clone(), from_grant })? {
                Reply::Regions { regions, grants, more_after_name, more_from_grant } => {
                    if !names_done {
                        all_regions.extend(regions);
                    }
                    if !grants_done {
                        all_grants.extend(grants);
                    }
                    names_done |= more_after_name.is_none();
                    grants_done |= more_from_grant.is_none();
                    if names_done && grants_done {
                        return Ok((all_regions, all_grants));
                    }
                    after_name = more_after_name.or(after_name);
                    from_grant = more_from_grant.unwrap_or(from_grant);
                }
                other => return Err(MhError::Protocol(format!("unexpected reply {other:?}"))),
            }
        }
        Err(MhError::Protocol(format!("the region directory ran past {} pages", crate::REPLY_PAGES_MAX)))
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
    let mut next = Instant::now() + HEARTBEAT_INTERVAL;
    loop {
        // Parked, not asleep: dropping the client unparks it, so closing a node does not wait
        // out the interval (half a second at every exit of every process).
        std::thread::park_timeout(next.saturating_duration_since(Instant::now()));
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if Instant::now() < next {
            continue; // woken early, spuriously
        }
        next = Instant::now() + HEARTBEAT_INTERVAL;
        let Some(inner) = inner.upgrade() else { return };
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
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

#[cfg(all(test, feature = "server"))]
mod tests;
