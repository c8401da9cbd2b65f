//! The management-host server: one thread per session, state behind one lock.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{debug, info, warn};

use crate::auth::{self, from_hex, to_hex};
use crate::channel::{Channel, Ephemeral};
use crate::departed::Departed;
use crate::identity;
use crate::jobs::{Jobs, Post};
use crate::proto;
use crate::proto::*;
use crate::sessions::{Sessions, Turned, ADMISSION_LINE_BYTES_MAX, ADMISSION_TIMEOUT};
use crate::state::Store;
use crate::state::View;
use crate::{
    check_name, MhError, GRANTS_MAX, HEARTBEATS_MISSED_MAX, HEARTBEAT_INTERVAL, MH_LINE_BYTES_MAX, NODES_MAX,
    REGION_NAMES_MAX,
};

/// How long a client has to complete admission.
/// Connections the kernel queues for the accepting thread.
const LISTEN_BACKLOG: i32 = 1024;

/// A listening socket on `listen` with a backlog of [`LISTEN_BACKLOG`] (a burst of
/// connections, such as a rack's nodes starting together, is queued rather than dropped).
pub(crate) fn listen_on(listen: &str) -> Result<TcpListener, MhError> {
    use std::net::ToSocketAddrs;
    let fail = |e: std::io::Error| MhError::Config(format!("listen on {listen}: {e}"));
    let addr = listen
        .to_socket_addrs()
        .map_err(fail)?
        .next()
        .ok_or_else(|| MhError::Config(format!("listen on {listen}: no address")))?;
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None).map_err(fail)?;
    s.set_reuse_address(true).map_err(fail)?;
    s.bind(&addr.into()).map_err(fail)?;
    s.listen(LISTEN_BACKLOG).map_err(fail)?;
    Ok(s.into())
}

/// How often connections late for admission are looked for.
const REAP_EVERY: Duration = Duration::from_millis(100);
/// How often the accept loop looks for a stop request.
pub(crate) const ACCEPT_POLL: Duration = Duration::from_millis(20);

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Read one line of at most [`MH_LINE_BYTES_MAX`] bytes. `Ok(None)` at end of stream.
pub(crate) fn read_line(r: &mut impl BufRead, buf: &mut String) -> std::io::Result<Option<()>> {
    read_line_max(r, buf, MH_LINE_BYTES_MAX)
}

/// One line of at most `max` bytes.
pub(crate) fn read_line_max(r: &mut impl BufRead, buf: &mut String, max: usize) -> std::io::Result<Option<()>> {
    buf.clear();
    let n = std::io::Read::take(r, max as u64 + 1).read_line(buf)?;
    if n == 0 {
        return Ok(None);
    }
    if n > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "line too long"));
    }
    Ok(Some(()))
}

pub(crate) fn write_json(w: &mut impl Write, v: &impl serde::Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

pub(crate) struct Live {
    session: u64,
    last_seen_ms: u64,
    /// The address the session comes from: what the management host can verify of where a
    /// node is (see [`claims_anothers_address`]).
    from: Option<std::net::IpAddr>,
}

pub(crate) struct Shared {
    secret: Vec<u8>,
    /// This host's key pair: it signs every admission, and nodes pin its public half.
    host_key: crate::identity::Identity,
    /// Admissions by outcome (`admitted`, or why refused), for the metrics.
    pub(crate) admissions: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    pub(crate) jobs: Mutex<Jobs>,
    pub(crate) store: Mutex<Store>,
    pub(crate) live: Mutex<HashMap<NodeId, Live>>,
    /// Nodes whose last session their side closed (see [`NodeStatus::ended`]).
    pub(crate) ended: Mutex<std::collections::HashSet<NodeId>>,
    pub(crate) sessions: Mutex<Sessions>,
    /// Since when nodes are down, to forget those gone for good.
    pub(crate) departed: Mutex<Departed>,
    /// The state as last kept, for requests that only read.
    pub(crate) view: View,
    next_session: AtomicU64,
    pub(crate) stopping: AtomicBool,
}

impl Shared {
    pub(crate) fn new(secret: &[u8], store: Store, host_key: crate::identity::Identity) -> Arc<Shared> {
        let departed = Departed::new(store.state.nodes.keys().copied());
        let view = store.view();
        Arc::new(Shared {
            secret: secret.to_vec(),
            host_key,
            admissions: Mutex::new(Default::default()),
            jobs: Mutex::new(Jobs::default()),
            store: Mutex::new(store),
            live: Mutex::new(HashMap::new()),
            ended: Mutex::new(Default::default()),
            sessions: Mutex::new(Sessions::default()),
            departed: Mutex::new(departed),
            view,
            next_session: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
        })
    }

    /// Lead with `store` (read from where the leader before kept it): its nodes count as down
    /// from now.
    pub(crate) fn took_over(&self, mut store: Store) {
        let known = store.state.nodes.keys().copied();
        lock(&self.departed).restart(known);
        store.share_view(self.view.clone());
        *lock(&self.store) = store;
    }

    /// Close every session (their nodes reconnect, to whichever host leads then).
    pub(crate) fn close_sessions(&self) {
        lock(&self.sessions).shut_all();
    }
}

/// The management host. Start it with [`ManagementHost::start`]; it runs until the handle is
/// stopped or dropped.
#[derive(Debug)]
pub struct ManagementHost;

/// A running management host.
pub struct MhHandle {
    pub(crate) addr: SocketAddr,
    pub(crate) shared: Arc<Shared>,
    /// The accepting thread (with etcd: the thread that campaigns, then accepts while leading).
    pub(crate) accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MhHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MhHandle").field("addr", &self.addr).finish()
    }
}

impl ManagementHost {
    /// Listen on `listen` (for example `127.0.0.1:7700`; port 0 picks one), keep state in
    /// `state_dir` (`None`: memory only), admit nodes that hold `secret`.
    pub fn start(listen: &str, state_dir: Option<&Path>, secret: &[u8]) -> Result<MhHandle, MhError> {
        if secret.len() < auth::SECRET_BYTES_MIN {
            return Err(MhError::Config(format!("the secret must be at least {} bytes", auth::SECRET_BYTES_MIN)));
        }
        let store = Store::open(state_dir)?;
        let host_key = host_key(state_dir)?;
        let listener = listen_on(listen)?;
        let addr = listener.local_addr().map_err(|e| MhError::Config(e.to_string()))?;
        listener.set_nonblocking(true).map_err(|e| MhError::Config(e.to_string()))?;
        let shared = Shared::new(secret, store, host_key);
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("rw-mh-accept".into())
            .spawn(move || accept_loop(listener, s))
            .map_err(|e| MhError::Config(e.to_string()))?;
        info!(%addr, "management host listening");
        Ok(MhHandle { addr, shared, accept: Some(accept) })
    }
}

/// The file in a state folder that keeps the management host's key pair.
pub const HOST_KEY_FILE: &str = "host.key";

/// The host's key pair: kept in `state_dir` (made at first start), or, with no folder, a new
/// one for this run (nodes that pinned another refuse it).
pub(crate) fn host_key(state_dir: Option<&Path>) -> Result<crate::identity::Identity, MhError> {
    match state_dir {
        Some(d) => crate::identity::Identity::load_or_create(&d.join(HOST_KEY_FILE))
            .map_err(|e| MhError::Config(format!("the management host's key: {e}"))),
        None => crate::identity::Identity::generate()
            .map(|(id, _)| id)
            .map_err(|e| MhError::Config(format!("the management host's key: {e}"))),
    }
}

impl MhHandle {
    /// The management host's public key (nodes pin it: see [`crate::MhTrust`]).
    pub fn host_key(&self) -> crate::identity::PublicKey {
        self.shared.host_key.public()
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What it holds, in the Prometheus text format: nodes by state, regions, grants, sessions,
    /// jobs, admissions by outcome.
    pub fn metrics(&self) -> String {
        crate::metrics::render(&self.shared)
    }

    /// [`MhHandle::metrics`] as a function that outlives the handle's borrow (to serve it).
    pub fn metrics_source(&self) -> impl Fn() -> String + Send + Sync + 'static {
        let shared = Arc::downgrade(&self.shared);
        move || shared.upgrade().map(|s| crate::metrics::render(&s)).unwrap_or_default()
    }

    /// Forget nodes down longer than `d` (default [`crate::FORGET_AFTER_DEFAULT`]): their
    /// records, names, published regions and grants (see the `departed` module).
    pub fn set_forget_after(&self, d: Duration) {
        lock(&self.shared.departed).forget_after = d;
    }

    /// Stop: close the listener and every session. State is already on disk.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Block until the accept loop ends (that is, for ever unless stopped from elsewhere).
    pub fn wait(mut self) {
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }

    fn shutdown(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.close_sessions();
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

impl Drop for MhHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut reaped = std::time::Instant::now();
    while !shared.stopping.load(Ordering::SeqCst) {
        if !accept_one(&listener, &shared) {
            std::thread::sleep(ACCEPT_POLL);
        }
        reap_slow(&shared, &mut reaped);
    }
}

/// Now and then, shut the connections that did not pass admission in time.
pub(crate) fn reap_slow(shared: &Shared, last: &mut std::time::Instant) {
    if last.elapsed() >= REAP_EVERY {
        *last = std::time::Instant::now();
        lock(&shared.sessions).reap_slow();
        crate::departed::forget_expired(shared);
    }
}

/// Take one waiting client, if any, and start its session; false when none was waiting.
pub(crate) fn accept_one(listener: &TcpListener, shared: &Arc<Shared>) -> bool {
    match listener.accept() {
        Ok((stream, peer)) => {
            let s = shared.clone();
            // Before any work for it (a thread, an exchange over the secret): its source may
            // be guessing secrets, or flooding the waiting slots.
            if let Err(why) = lock(&s.sessions).admissible(peer.ip()) {
                let Turned::SourceGuessing = why;
                *lock(&s.admissions).entry("turned").or_insert(0) += 1;
                debug!(%peer, "connection closed before admission: its source is past its wrong secrets");
                return true;
            }
            let _ = stream.set_nonblocking(false);
            let id = s.next_session.fetch_add(1, Ordering::Relaxed);
            // A session the table cannot shut (no handle) is not taken.
            let Ok(clone) = stream.try_clone() else { return true };
            lock(&s.sessions).open(id, clone, Some(peer.ip()));
            let spawned = std::thread::Builder::new().name("rw-mh-session".into()).spawn(move || {
                if let Err(e) = session(&s, stream, id) {
                    debug!(%peer, "session ended: {e}");
                }
                lock(&s.sessions).close(id);
            });
            if spawned.is_err() {
                warn!("could not start a session thread");
            }
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => {
            warn!("accept: {e}");
            false
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, MhError> {
    serde_json::from_str(line).map_err(|e| MhError::Protocol(e.to_string()))
}

fn io_err(e: std::io::Error) -> MhError {
    MhError::Unavailable(e.to_string())
}

/// Admission: hello → challenge (with our proof) → client proof → welcome / denied.
fn admit(
    shared: &Shared,
    r: &mut impl BufRead,
    w: &mut TcpStream,
    session: u64,
) -> Result<(NodeId, String, Channel), MhError> {
    let mut line = String::new();
    let read_line = |r: &mut _, line: &mut String| read_line_max(r, line, ADMISSION_LINE_BYTES_MAX);
    read_line(r, &mut line).map_err(io_err)?.ok_or_else(|| MhError::Protocol("closed before hello".into()))?;
    let hello: Hello = parse(&line)?;
    let client_nonce = from_hex(&hello.nonce)
        .filter(|n| n.len() == auth::NONCE_BYTES)
        .ok_or_else(|| MhError::Protocol("bad nonce".into()))?;
    let server_nonce = auth::nonce();
    // The exchange over the secret: this side proves nothing anyone could test a guess of the
    // secret against (see `auth::Pake`).
    let (pake, server_pake) = auth::Pake::start(&shared.secret, false, &proto::admission_context(&hello.name));
    let key = from_hex(&hello.pake)
        .and_then(|m| pake.finish(&m))
        .ok_or_else(|| MhError::Protocol("a malformed exchange message".into()))?;
    let eph = Ephemeral::generate();
    let ephemerals = [hello.ephemeral.clone(), eph.public.clone()];
    let mut challenge = Challenge {
        nonce: to_hex(&server_nonce),
        proof: String::new(),
        ephemeral: eph.public.clone(),
        pake: to_hex(&server_pake),
        host_key: to_hex(&shared.host_key.public()),
        host_signature: String::new(),
    };
    let transcript = proto::admission_transcript(&hello, &challenge);
    challenge.proof = to_hex(&key.confirm(proto::CONFIRM_SERVER, &transcript));
    challenge.host_signature = to_hex(&shared.host_key.sign(&proto::host_signed(&transcript)));
    write_json(w, &challenge).map_err(io_err)?;
    // From here the client can test a guess of the secret against our proof (one, online):
    // a connection that then does not prove the secret counts as a wrong guess of its source.
    let guessed = || {
        if let Ok(from) = w.peer_addr() {
            lock(&shared.sessions).wrong_secret(from.ip());
        }
    };
    let proof_line = read_line(r, &mut line).map_err(io_err).and_then(|l| {
        l.ok_or_else(|| MhError::Protocol("closed before proof".into()))?;
        parse::<Proof>(&line)
    });
    let client_proof = match proof_line {
        Ok(p) => p,
        Err(e) => {
            guessed();
            return Err(e);
        }
    };
    let ok = from_hex(&client_proof.proof).is_some_and(|p| key.check(proto::CONFIRM_CLIENT, &transcript, &p));
    let count = |outcome: &'static str| *lock(&shared.admissions).entry(outcome).or_insert(0) += 1;
    let deny = |w: &mut TcpStream, reason: &str| {
        count("refused");
        let _ = write_json(w, &Admission::Denied { reason: reason.into() });
        Err(MhError::Denied(reason.into()))
    };
    if !ok {
        warn!(name = %hello.name, "admission refused: wrong secret");
        guessed();
        return deny(w, "wrong secret");
    }
    let Ok(channel) = eph.channel(&hello.ephemeral, &shared.secret, &client_nonce, &server_nonce, false) else {
        return deny(w, "a bad ephemeral key");
    };
    let id = match hello.role.as_str() {
        "observer" => 0,
        "node" => {
            if let Err(e) = check_name(&hello.name) {
                return deny(w, &e.to_string());
            }
            // The node proves it holds the private half of the key it names.
            let Some(key) = hello.key.as_deref().and_then(identity::public_from_hex) else {
                return deny(w, "a node must name its public key");
            };
            let signed = client_proof.signature.as_deref().and_then(from_hex).is_some_and(|sig| {
                let [c, s] = &ephemerals;
                identity::verify(
                    &key,
                    &crate::client::admission_message(&server_nonce, &hello.name, &key, [c, s]),
                    &sig,
                )
            });
            if !signed {
                warn!(name = %hello.name, "admission refused: the key's signature does not hold");
                return deny(w, "the signature does not match the key named");
            }
            let key_hex = to_hex(&key);
            // A full table makes room by forgetting the node down longest, if down long enough.
            if lock(&shared.store).state.nodes.len() >= NODES_MAX {
                crate::departed::make_room(shared);
            }
            let mut store = lock(&shared.store);
            let existing = store.state.nodes.values().find(|n| n.name == hello.name).map(|n| (n.id, n.key.clone()));
            let mut live = lock(&shared.live);
            let id = match existing {
                // A name is bound to the key it was first admitted with, whether or not its
                // node is up: another key never gets its id (and with it the node's grants).
                Some((_, bound)) if !bound.is_empty() && bound != key_hex => {
                    drop(live);
                    drop(store);
                    warn!(name = %hello.name, "admission refused: the name is bound to another key");
                    return deny(w, &format!("name {} is bound to another node's key", hello.name));
                }
                Some((id, _)) if live.contains_key(&id) => {
                    drop(live);
                    drop(store);
                    return deny(w, &format!("name {} is in use by a live node", hello.name));
                }
                Some((id, bound)) => {
                    if bound.is_empty() {
                        // Recorded before names were bound to keys: bind it now.
                        if let Some(n) = store.state.nodes.get_mut(&id) {
                            n.key = key_hex;
                        }
                        store.save()?;
                    }
                    id
                }
                None => {
                    if store.state.nodes.len() >= NODES_MAX {
                        drop(live);
                        drop(store);
                        return deny(w, "node limit reached");
                    }
                    // A node coming back to a management host that lost its state keeps the
                    // id it had (so the grants, handles and connections that name it hold),
                    // unless the id is on record or retired. Otherwise: ids only grow and are
                    // never handed out twice; past the last one, no more nodes (a state that
                    // says otherwise was tampered with).
                    let returning = hello.prev_id.filter(|&p| store.state.may_return_as(p) && !live.contains_key(&p));
                    let id = returning.unwrap_or(store.state.next_id);
                    let Some(next) = id.checked_add(1) else {
                        drop(live);
                        drop(store);
                        return deny(w, "node ids exhausted (the next id in the state is the last one)");
                    };
                    store.state.next_id = store.state.next_id.max(next);
                    if returning.is_some() {
                        info!(name = %hello.name, id, "a node came back with the id it had (the state had none for it)");
                    }
                    let info = NodeInfo { id, name: hello.name.clone(), key: key_hex, ..NodeInfo::default() };
                    store.state.nodes.insert(id, info);
                    store.save()?;
                    id
                }
            };
            let from = w.peer_addr().ok().map(|a| a.ip());
            live.insert(id, Live { session, last_seen_ms: now_ms(), from });
            lock(&shared.ended).remove(&id);
            lock(&shared.departed).up(id);
            id
        }
        other => return deny(w, &format!("unknown role {other:?}")),
    };
    write_json(w, &Admission::Welcome { node_id: id }).map_err(io_err)?;
    count("admitted");
    info!(name = %hello.name, id, "admitted");
    Ok((id, hello.name, channel))
}

fn session(shared: &Shared, stream: TcpStream, session: u64) -> Result<(), MhError> {
    stream.set_read_timeout(Some(ADMISSION_TIMEOUT)).map_err(io_err)?;
    let _ = stream.set_nodelay(true);
    let mut w = stream.try_clone().map_err(io_err)?;
    let mut r = BufReader::new(stream);
    let (id, name, mut channel) = admit(shared, &mut r, &mut w, session)?;
    lock(&shared.sessions).admitted(session);
    // A node that misses this many heartbeats is down; its session is closed.
    r.get_ref().set_read_timeout(Some(HEARTBEAT_INTERVAL * HEARTBEATS_MISSED_MAX)).map_err(io_err)?;
    let mut line = String::new();
    let result = loop {
        match read_line(&mut r, &mut line) {
            Ok(Some(())) => {}
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
        // A line whose authentication does not hold was not sent by the admitted client (or
        // was altered, replayed or reordered on the way): the session ends.
        let Ok(text) = channel.open(&line) else {
            warn!(%name, id, "a request's authentication does not hold; closing the session");
            break Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "unauthenticated request"));
        };
        let reply = match parse::<Request>(text) {
            Ok(req) => handle(shared, id, req).unwrap_or_else(|e| error_reply(&e)),
            Err(e) => error_reply(&e),
        };
        if id != 0 {
            if let Some(l) = lock(&shared.live).get_mut(&id) {
                l.last_seen_ms = now_ms();
            }
        }
        let text = serde_json::to_string(&reply).map_err(std::io::Error::other);
        if let Err(e) = text.and_then(|t| w.write_all((channel.seal(&t) + "\n").as_bytes())) {
            break Err(e);
        }
    };
    // The node's side closed the session (it left, or its process ended and the kernel closed
    // its socket), or it went silent (a partition, a dead host): only the first says the node
    // is gone; the second may pass.
    let ended = match &result {
        Ok(()) => true,
        Err(e) => matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe),
    };
    if id != 0 {
        let mut live = lock(&shared.live);
        if live.get(&id).is_some_and(|l| l.session == session) {
            live.remove(&id);
            if ended && !shared.stopping.load(Ordering::SeqCst) {
                lock(&shared.ended).insert(id);
            }
            lock(&shared.departed).down(id);
            info!(%name, id, ended, "node down");
        }
    }
    result.map_err(io_err)
}

/// Answer a request that only reads, from the state as last kept (no waiting for a change
/// being saved).
fn read(shared: &Shared, req: Request) -> Result<Reply, MhError> {
    let st = shared.view.read().unwrap_or_else(|e| e.into_inner()).clone();
    match req {
        Request::Nodes { after } => {
            let live = lock(&shared.live);
            let ended = lock(&shared.ended);
            let from = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            let all = st.nodes.range((from, std::ops::Bound::Unbounded)).map(|(&id, info)| {
                let status = NodeStatus {
                    info: info.clone(),
                    up: live.contains_key(&id),
                    last_seen_ms: live.get(&id).map_or(0, |l| l.last_seen_ms),
                    ended: !live.contains_key(&id) && ended.contains(&id),
                };
                (id, status)
            });
            let (nodes, more_after) = page(all);
            Ok(Reply::Nodes { nodes, more_after })
        }
        Request::Resolve { node } => {
            let info = st.nodes.get(&node).cloned().ok_or_else(|| MhError::NotFound(format!("node {node}")))?;
            Ok(Reply::Node { info })
        }
        Request::ResolveName { name } => {
            let info = st
                .nodes
                .values()
                .find(|n| n.name == name)
                .cloned()
                .ok_or_else(|| MhError::NotFound(format!("node {name:?}")))?;
            Ok(Reply::Node { info })
        }
        Request::Lookup { name } => {
            let entry = st.regions.get(&name).cloned().ok_or_else(|| MhError::NotFound(format!("region {name:?}")))?;
            Ok(Reply::Region { entry })
        }
        Request::Regions { after_name, from_grant } => {
            let from = after_name.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            let names = st.regions.range::<String, _>((from, std::ops::Bound::Unbounded));
            let (regions, more_after_name) = page(names.map(|(n, e)| (n.clone(), e.clone())));
            let grants = st.grants.iter().enumerate().skip(from_grant).map(|(i, g)| (i, g.clone()));
            let (grants, last) = page(grants);
            Ok(Reply::Regions { regions, grants, more_after_name, more_from_grant: last.map(|i| i + 1) })
        }
        _ => Err(MhError::Protocol("not a read".into())),
    }
}

/// The entries of `all` (each with its key) that fit one page ([`crate::REPLY_PAGE_BYTES`] of
/// their JSON; always at least one), and the key of the last one taken if more follow.
fn page<K, T: serde::Serialize>(all: impl Iterator<Item = (K, T)>) -> (Vec<T>, Option<K>) {
    let mut out = Vec::new();
    let mut bytes = 0;
    let mut all = all.peekable();
    while let Some((k, t)) = all.next() {
        bytes += serde_json::to_vec(&t).map_or(0, |v| v.len()) + 1;
        out.push(t);
        if all.peek().is_some() && bytes >= crate::REPLY_PAGE_BYTES {
            return (out, Some(k));
        }
    }
    (out, None)
}

/// Prefixes of region names that belong to the node named after the slash (`vnic/NAME`: the
/// marker of NAME's virtual NIC).
const OWNED_NAME_PREFIXES: &[&str] = &["vnic"];

/// Links a node may register, at most.
const LINKS_MAX: usize = 64;
/// The longest host identity and shared-memory path a node may register.
const HOST_BYTES_MAX: usize = 256;
const PATH_BYTES_MAX: usize = 4096;

/// Whether node `me`, registering `info`, names what is another live node's (`from` gives a
/// node's session address, `None` when it is not live): a link is one socket, so another live
/// node's link is never; an address (any port) another live node registered may be named only
/// by a node whose session comes from where that node's does (nodes of one host share its
/// addresses; a node of another host naming it would co-own the address, and on virtual NICs
/// take its traffic). The reason, when refused.
pub(crate) fn claims_anothers_address<'a>(
    info: &NodeInfo,
    me: NodeId,
    nodes: impl Iterator<Item = &'a NodeInfo>,
    from: impl Fn(NodeId) -> Option<Option<std::net::IpAddr>>,
) -> Option<String> {
    let ip = |l: &String| l.parse::<SocketAddr>().ok().map(|a| a.ip());
    let mine = from(me).flatten();
    for n in nodes.filter(|n| n.id != me) {
        let Some(theirs) = from(n.id) else { continue };
        if let Some(l) = info.links.iter().find(|l| n.links.contains(l)) {
            return Some(format!("link {l} is node {}'s", n.name));
        }
        let shared_ip = info.links.iter().find(|l| n.links.iter().any(|m| ip(m).is_some_and(|a| Some(a) == ip(l))));
        if let Some(l) = shared_ip {
            if mine.is_none() || theirs != mine {
                return Some(format!(
                    "address {} is node {}'s, which reaches the management host from another address",
                    ip(l).map_or_else(String::new, |a| a.to_string()),
                    n.name
                ));
            }
        }
    }
    None
}

/// What a node registers is within bounds: a handful of links, each an `ip:port`; a host
/// identity and a path of sane length.
fn check_registration(info: &NodeInfo) -> Result<(), MhError> {
    let refuse = |why: String| Err(MhError::Refused(why));
    if info.links.len() > LINKS_MAX {
        return refuse(format!("at most {LINKS_MAX} links"));
    }
    if let Some(bad) = info.links.iter().find(|l| l.parse::<SocketAddr>().is_err()) {
        return refuse(format!("link {:?} is not an ip:port", bad.chars().take(64).collect::<String>()));
    }
    if info.host.len() > HOST_BYTES_MAX || info.shm_path.as_ref().is_some_and(|p| p.len() > PATH_BYTES_MAX) {
        return refuse(format!("host at most {HOST_BYTES_MAX} bytes, path at most {PATH_BYTES_MAX}"));
    }
    Ok(())
}

fn error_reply(e: &MhError) -> Reply {
    let kind = match e {
        MhError::NotFound(_) => "not_found",
        _ => "refused",
    };
    let message = match e {
        MhError::NotFound(m) | MhError::Refused(m) => m.clone(),
        other => other.to_string(),
    };
    Reply::Error { kind: kind.into(), message }
}

fn handle(shared: &Shared, me: NodeId, req: Request) -> Result<Reply, MhError> {
    let need_node = || {
        if me == 0 {
            Err(MhError::Refused("observers may not change state".into()))
        } else {
            Ok(())
        }
    };
    // Jobs live in memory beside the stored state, behind their own lock.
    match req {
        Request::JobPost { job, token, size, rank, round, blob } => {
            need_node()?;
            check_name(&job).map_err(|e| MhError::Refused(e.to_string()))?;
            let blob = from_hex(&blob).ok_or_else(|| MhError::Refused("blob is not hex".into()))?;
            let live = lock(&shared.live);
            let post = Post { job: &job, token: token.as_deref(), size, rank, round, blob };
            lock(&shared.jobs).post(me, post, |n| live.get(&n).map(|l| l.session))?;
            return Ok(Reply::Ok);
        }
        Request::JobRound { job, token, round, from_rank } => {
            check_name(&job).map_err(|e| MhError::Refused(e.to_string()))?;
            let live = lock(&shared.live);
            let round = lock(&shared.jobs).round(&job, token.as_deref(), round, |n| live.get(&n).map(|l| l.session))?;
            let round = round.page_from(from_rank);
            return Ok(Reply::Job { round });
        }
        Request::Heartbeat => return Ok(Reply::Ok),
        Request::Nodes { .. }
        | Request::Resolve { .. }
        | Request::ResolveName { .. }
        | Request::Lookup { .. }
        | Request::Regions { .. } => return read(shared, req),
        _ => {}
    }
    let mut store = lock(&shared.store);
    let st = &mut store.state;
    let reply = match req {
        Request::Register { mut info } => {
            need_node()?;
            let known = st.nodes.get(&me).ok_or_else(|| MhError::NotFound(format!("node {me}")))?;
            info.id = me;
            info.name = known.name.clone();
            info.key = known.key.clone();
            check_registration(&info)?;
            let live = lock(&shared.live);
            let taken = claims_anothers_address(&info, me, st.nodes.values(), |n| live.get(&n).map(|l| l.from));
            drop(live);
            if let Some(why) = taken {
                warn!(node = me, "registration refused: {why}");
                return Err(MhError::Refused(why));
            }
            if st.nodes.get(&me) == Some(&info) {
                return Ok(Reply::Ok);
            }
            st.nodes.insert(me, info);
            Reply::Ok
        }
        Request::Publish { entry } => {
            need_node()?;
            check_name(&entry.name).map_err(|e| MhError::Refused(e.to_string()))?;
            if entry.key.len() != 32 || from_hex(&entry.key).is_none() || entry.len == 0 {
                return Err(MhError::Refused("a region entry needs a 32-hex-digit key and a length".into()));
            }
            if entry.node != me {
                return Err(MhError::Refused("a node may publish only its own regions".into()));
            }
            // Names under `node/` speak for the node named after the slash (its virtual NIC's
            // marker, `vnic/NAME`): only that node may publish them.
            if let Some((_, owner)) = entry.name.split_once('/').filter(|(p, _)| OWNED_NAME_PREFIXES.contains(p)) {
                let my_name = st.nodes.get(&me).map(|n| n.name.as_str()).unwrap_or_default();
                if owner != my_name {
                    return Err(MhError::Refused(format!("name {:?} belongs to node {owner:?}", entry.name)));
                }
            }
            match st.regions.get(&entry.name) {
                Some(old) if old.node != me => {
                    return Err(MhError::Refused(format!("name {:?} is published by node {}", entry.name, old.node)))
                }
                Some(old) if *old == entry => return Ok(Reply::Ok),
                None if st.regions.len() >= REGION_NAMES_MAX => {
                    return Err(MhError::Refused("region name limit reached".into()))
                }
                None if st.regions.values().filter(|r| r.node == me).count() >= crate::NAMES_PER_NODE_MAX => {
                    return Err(MhError::Refused(format!(
                        "this node publishes {} names already, its most",
                        crate::NAMES_PER_NODE_MAX
                    )))
                }
                _ => {}
            }
            st.regions.insert(entry.name.clone(), entry);
            Reply::Ok
        }
        Request::Unpublish { name } => {
            need_node()?;
            match st.regions.get(&name) {
                Some(e) if e.node == me => {
                    st.regions.remove(&name);
                }
                Some(_) => return Err(MhError::Refused(format!("name {name:?} belongs to another node"))),
                None => return Err(MhError::NotFound(format!("region {name:?}"))),
            }
            Reply::Ok
        }
        Request::Grant { grant } => {
            need_node()?;
            if grant.node != me {
                return Err(MhError::Refused("a node may record grants only of its own regions".into()));
            }
            if let Some(g) =
                st.grants.iter_mut().find(|g| g.node == me && g.region == grant.region && g.peer == grant.peer)
            {
                if g.access == grant.access {
                    return Ok(Reply::Ok);
                }
                g.access = grant.access;
            } else if st.grants.len() >= GRANTS_MAX {
                return Err(MhError::Refused("grant limit reached".into()));
            } else if st.grants.iter().filter(|g| g.node == me).count() >= crate::GRANTS_PER_NODE_MAX {
                return Err(MhError::Refused(format!(
                    "this node records {} grants already, its most",
                    crate::GRANTS_PER_NODE_MAX
                )));
            } else {
                st.grants.push(grant);
            }
            Reply::Ok
        }
        Request::Revoke { region, peer } => {
            need_node()?;
            st.grants.retain(|g| !(g.node == me && g.region == region && g.peer == peer));
            Reply::Ok
        }
        Request::DropRegion { region } => {
            need_node()?;
            st.grants.retain(|g| !(g.node == me && g.region == region));
            st.regions.retain(|_, e| !(e.node == me && e.region == region));
            Reply::Ok
        }
        Request::JobPost { .. }
        | Request::JobRound { .. }
        | Request::Heartbeat
        | Request::Nodes { .. }
        | Request::Resolve { .. }
        | Request::ResolveName { .. }
        | Request::Lookup { .. }
        | Request::Regions { .. } => unreachable!("answered above"),
    };
    store.save()?;
    Ok(reply)
}
