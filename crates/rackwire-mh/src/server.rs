//! The management-host server: it listens, takes each connection on a thread of its own
//! (bounded before admission: `sessions`), admits it (`admission`) and answers its requests
//! (`requests`) until it ends; what sessions share is in `shared`.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::auth;
use crate::line::{now_ms, read_line};
use crate::proto::*;
use crate::sessions::{Turned, ADMISSION_TIMEOUT};
use crate::shared::{io_err, lock, parse, Shared};
use crate::state::Store;
use crate::{MhError, HEARTBEATS_MISSED_MAX, HEARTBEAT_INTERVAL};

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

    /// Forget transient nodes (processes with no name of their own) down longer than `d`
    /// (default [`crate::TRANSIENT_FORGET_AFTER_DEFAULT`], at most the forget-after time).
    pub fn set_forget_transient_after(&self, d: Duration) {
        lock(&self.shared.departed).forget_transient_after = d;
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
        crate::forgetting::forget_expired(shared);
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

fn session(shared: &Shared, stream: TcpStream, session: u64) -> Result<(), MhError> {
    stream.set_read_timeout(Some(ADMISSION_TIMEOUT)).map_err(io_err)?;
    let _ = stream.set_nodelay(true);
    let mut w = stream.try_clone().map_err(io_err)?;
    let mut r = BufReader::new(stream);
    let (id, name, mut channel) = crate::admission::admit(shared, &mut r, &mut w, session)?;
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
            Ok(req) => crate::requests::handle(shared, id, req).unwrap_or_else(|e| crate::requests::error_reply(&e)),
            Err(e) => crate::requests::error_reply(&e),
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
