//! The shared-memory transport: peers on hosts that share this host's memory.
//!
//! A connection is a Unix `SOCK_SEQPACKET` control socket plus, in each direction, two rings in
//! the *receiver's* memory that only the sender writes: one for messages, one for
//! notifications (the completion ring), and the receiver's doorbell. Remote regions are mapped
//! on first use: the initiator asks the owner, the owner applies its access rules and, if they
//! allow it, sends the region's descriptor (read-only, the memory sealed against writes, when
//! the grant has no store rights, so the kernel enforces it: see [`handover`]). From then on writes, reads and atomics are plain loads, stores and
//! atomic instructions on the mapping: no CPU of the target on the data path, and every
//! operation has completed when the call returns (so fences hold trivially).
//!
//! Revocation: the owner sends `Unmap`; this side drops the mapping once no operation is
//! using it and confirms. The control socket is read by one thread per connection, which
//! also installs granted mappings, so a grant and a later unmap are applied in the order the
//! owner sent them.

mod control;
mod handover;
mod ops;
mod served;

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use rackwire_mh::auth::{self, from_hex, to_hex};
use rackwire_mh::{MhError, NodeInfo};
use rackwire_shm::ring::{PushError, RingReceiver, RingSender, RingWatch};
use rackwire_shm::{ControlSocket, DoorbellRemote, MapAccess, SharedMem, CONTROL_MSG_BYTES_MAX};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use control::{
    context, recv, send, signed_by, LocalRings, PeerMsg, RemoteRings, Transcript, CONFIRM_ACCEPTOR, CONFIRM_INITIATOR,
    KIND_MESSAGE, KIND_NOTIFY, NOTIFY_RECORD_BYTES,
};

use crate::error::RefusedOp;

/// Labels of the two ends' signatures in the shared-memory handshake.
const LABEL_INITIATOR: &str = "rackwire-shm-initiator";
const LABEL_ACCEPTOR: &str = "rackwire-shm-acceptor";
use crate::grants::Refusal;
use crate::node::Node;
use crate::pin::{out_of_bounds, signal_access, store_with_signal, PinSet, Pinned};
use crate::sync::{lock, read, write};
use crate::transport::PeerTransport;
use crate::{
    Access, BatchOptions, Completion, ConnStats, Error, NodeId, Notification, Op, OpFlags, RegionId, RemoteRegion,
    Signal, SignalOp, CONNECT_TIMEOUT, MESSAGE_RING_BYTES, NOTIFY_RING_BYTES,
};

/// Where an operation on a peer's region goes.
enum Target<'a> {
    /// Our mapping of it: plain loads, stores and atomic instructions.
    Mapped(&'a Mapping),
    /// The owner serves it: each operation is a request ([`served`]).
    Served,
}

struct Mapping {
    mem: Arc<SharedMem>,
    key: u128,
    access: Access,
    /// Its pins ([`Pinned`]), retired when the mapping is dropped.
    pins: Arc<PinSet>,
}

impl Drop for Mapping {
    /// A mapping leaves the table under the table's exclusive lock (so no ordinary operation
    /// uses it); its pins are stopped here, before the unmap is confirmed.
    fn drop(&mut self) {
        self.pins.retire();
    }
}

enum MapAnswer {
    Granted,
    /// The owner serves the region: no mapping, each operation goes to it.
    Served,
    Refused(Refusal),
    Failed(Error),
}

struct PendingMap {
    region: RegionId,
    key: u128,
    reply: SyncSender<MapAnswer>,
}

#[derive(Default)]
struct Counters {
    writes: AtomicU64,
    reads: AtomicU64,
    atomics: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    notifications_sent: AtomicU64,
    refused: AtomicU64,
    ring_full_waits: AtomicU64,
    mappings: AtomicU64,
}

/// One shared-memory connection.
pub(crate) struct ShmPeer {
    peer: NodeId,
    fabric: Weak<Node>,
    sock: ControlSocket,
    tx_msg: Mutex<RingSender>,
    tx_notify: Mutex<RingSender>,
    bell: DoorbellRemote,
    rx_msg: Mutex<RingReceiver>,
    rx_notify: Mutex<RingReceiver>,
    rx_msg_watch: RingWatch,
    rx_notify_watch: RingWatch,
    /// Region ids the peer handed us: looked up with the cheap hasher on every operation.
    maps: RwLock<rackwire_proto::OwnIdMap<RegionId, Mapping>>,
    /// Region ids of the peer's that it serves ([`served`]): never mapped.
    served: RwLock<rackwire_proto::OwnIdSet<RegionId>>,
    /// Operations on served regions waiting for the owner's answer, by request.
    served_waiters: Mutex<HashMap<u64, SyncSender<served::ServedReply>>>,
    pending: Mutex<HashMap<u64, PendingMap>>,
    unmap_waiters: Mutex<HashMap<u64, SyncSender<()>>>,
    next_req: AtomicU64,
    alive: AtomicBool,
    op_timeout: Duration,
    stats: Arc<Counters>,
}

impl ShmPeer {
    fn build(f: &Node, peer: NodeId, sock: ControlSocket, local: LocalRings, remote: RemoteRings) -> Arc<ShmPeer> {
        Arc::new(ShmPeer {
            peer,
            fabric: f.weak.clone(),
            sock,
            tx_msg: Mutex::new(remote.msg),
            tx_notify: Mutex::new(remote.notify),
            bell: remote.bell,
            rx_msg_watch: local.msg.watch(),
            rx_notify_watch: local.notify.watch(),
            rx_msg: Mutex::new(local.msg),
            rx_notify: Mutex::new(local.notify),
            maps: RwLock::new(Default::default()),
            served: RwLock::new(Default::default()),
            served_waiters: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            unmap_waiters: Mutex::new(HashMap::new()),
            next_req: AtomicU64::new(1),
            alive: AtomicBool::new(true),
            op_timeout: f.cfg.op_timeout,
            stats: Arc::default(),
        })
    }

    /// Connect to the node described by `info` (initiator side of the handshake).
    pub(crate) fn connect(f: &Arc<Node>, info: &NodeInfo) -> Result<Arc<dyn PeerTransport>, Error> {
        let path = info
            .shm_path
            .as_deref()
            .ok_or_else(|| Error::Unreachable { node: info.id, why: "no shared-memory endpoint".into() })?;
        let sock = ControlSocket::connect(std::path::Path::new(path)).map_err(|e| Error::Sys {
            op: "connecting to a node's control socket",
            kind: e.kind(),
            detail: format!("node {}: {e}", info.id),
        })?;
        sock.set_recv_timeout(Some(CONNECT_TIMEOUT)).map_err(|e| Error::sys("setting a receive timeout", &e))?;
        let mut buf = vec![0u8; CONTROL_MSG_BYTES_MAX];
        let key = f.peer_key(info)?;
        let nonce = auth::nonce();
        let (pake, my_pake) = auth::Pake::start(&f.cfg.secret, true, &context(f.id, info.id));
        let hello = PeerMsg::Hello { from: f.id, to: info.id, nonce: to_hex(&nonce), pake: to_hex(&my_pake) };
        send(&sock, &hello, &[])?;
        let (their_nonce, their_pake, shared) = match recv(&sock, &mut buf)?.0 {
            PeerMsg::Challenge { nonce: n, pake: theirs, proof, signature } => {
                let n = from_hex(&n).ok_or_else(|| Error::Protocol("bad nonce".into()))?;
                let theirs = from_hex(&theirs).ok_or_else(|| Error::Protocol("bad exchange message".into()))?;
                let t = Transcript {
                    initiator: f.id,
                    acceptor: info.id,
                    i_nonce: &nonce,
                    a_nonce: &n,
                    i_pake: &my_pake,
                    a_pake: &theirs,
                };
                let shared = pake.finish(&theirs);
                let ok = shared
                    .as_ref()
                    .zip(from_hex(&proof))
                    .is_some_and(|(k, p)| k.check(CONFIRM_ACCEPTOR, &t.bytes(LABEL_ACCEPTOR), &p));
                let Some(shared) = shared.filter(|_| ok) else {
                    return Err(Error::Protocol(format!(
                        "node {} could not prove it holds the fabric secret",
                        info.id
                    )));
                };
                if !signed_by(&key, &t.bytes(LABEL_ACCEPTOR), &signature) {
                    return Err(Error::Protocol(format!(
                        "node {} could not prove it is that node (its signature is not by the key on record)",
                        info.id
                    )));
                }
                (n, theirs, shared)
            }
            PeerMsg::Refused { reason } => return Err(Error::Protocol(format!("node {} refused: {reason}", info.id))),
            other => return Err(Error::Protocol(format!("expected a challenge, got {other:?}"))),
        };
        let t = Transcript {
            initiator: f.id,
            acceptor: info.id,
            i_nonce: &nonce,
            a_nonce: &their_nonce,
            i_pake: &my_pake,
            a_pake: &their_pake,
        };
        let proof = shared.confirm(CONFIRM_INITIATOR, &t.bytes(LABEL_INITIATOR));
        let signature = f.identity.sign(&t.bytes(LABEL_INITIATOR));
        send(&sock, &PeerMsg::Proof { proof: to_hex(&proof), signature: to_hex(&signature) }, &[])?;
        let local = LocalRings::new()?;
        local.offer(&sock, f)?;
        let (msg, fds) = recv(&sock, &mut buf)?;
        let remote = RemoteRings::take(msg, fds)?;
        sock.set_recv_timeout(None).map_err(|e| Error::sys("clearing a receive timeout", &e))?;
        let peer = ShmPeer::build(f, info.id, sock, local, remote);
        let dynp: Arc<dyn PeerTransport> = peer.clone();
        f.add_peer(dynp.clone())?;
        let reader = peer.clone();
        std::thread::Builder::new()
            .name("rw-peer".into())
            .spawn(move || reader.serve(buf))
            .map_err(|e| Error::sys("starting a peer thread", &e))?;
        debug!(peer = info.id, "connected over shared memory");
        Ok(dynp)
    }

    /// Accept a connection (acceptor side of the handshake), then serve it on this thread.
    pub(crate) fn accept(fabric: Weak<Node>, sock: ControlSocket) {
        let Some(f) = fabric.upgrade() else { return };
        let mut buf = vec![0u8; CONTROL_MSG_BYTES_MAX];
        match Self::handshake_accept(&f, sock, &mut buf) {
            Ok(peer) => {
                drop(f);
                peer.serve(buf);
            }
            Err(e) => warn!("refused an incoming connection: {e}"),
        }
    }

    fn handshake_accept(f: &Arc<Node>, sock: ControlSocket, buf: &mut [u8]) -> Result<Arc<ShmPeer>, Error> {
        sock.set_recv_timeout(Some(CONNECT_TIMEOUT)).map_err(|e| Error::sys("setting a receive timeout", &e))?;
        let refuse = |sock: &ControlSocket, reason: String| {
            let _ = send(sock, &PeerMsg::Refused { reason: reason.clone() }, &[]);
            Err(Error::Protocol(reason))
        };
        let (from, their_nonce, their_pake) = match recv(&sock, buf)?.0 {
            PeerMsg::Hello { from, to, nonce, pake } => {
                if to != f.id {
                    return refuse(&sock, format!("this is node {}, not node {to}", f.id));
                }
                let bad = |what: &str| Error::Protocol(format!("bad {what}"));
                (
                    from,
                    from_hex(&nonce).ok_or_else(|| bad("nonce"))?,
                    from_hex(&pake).ok_or_else(|| bad("exchange message"))?,
                )
            }
            other => return Err(Error::Protocol(format!("expected hello, got {other:?}"))),
        };
        let key = match f.mh.resolve(from) {
            Ok(info) => f.peer_key(&info)?,
            Err(MhError::NotFound(_)) => {
                return refuse(&sock, format!("node {from} is unknown to the management host"))
            }
            Err(e) => return Err(e.into()),
        };
        let my_nonce = auth::nonce();
        let (pake, my_pake) = auth::Pake::start(&f.cfg.secret, false, &context(from, f.id));
        let Some(shared) = pake.finish(&their_pake) else {
            return refuse(&sock, "malformed exchange message".into());
        };
        let t = Transcript {
            initiator: from,
            acceptor: f.id,
            i_nonce: &their_nonce,
            a_nonce: &my_nonce,
            i_pake: &their_pake,
            a_pake: &my_pake,
        };
        let proof = shared.confirm(CONFIRM_ACCEPTOR, &t.bytes(LABEL_ACCEPTOR));
        let signature = f.identity.sign(&t.bytes(LABEL_ACCEPTOR));
        let challenge = PeerMsg::Challenge {
            nonce: to_hex(&my_nonce),
            pake: to_hex(&my_pake),
            proof: to_hex(&proof),
            signature: to_hex(&signature),
        };
        send(&sock, &challenge, &[])?;
        match recv(&sock, buf)?.0 {
            PeerMsg::Proof { proof, signature } => {
                let secret_ok =
                    from_hex(&proof).is_some_and(|p| shared.check(CONFIRM_INITIATOR, &t.bytes(LABEL_INITIATOR), &p));
                if !secret_ok {
                    return refuse(&sock, "wrong secret".into());
                }
                if !signed_by(&key, &t.bytes(LABEL_INITIATOR), &signature) {
                    warn!(peer = from, "a peer's signature is not by the key on record for the node it claims to be");
                    return refuse(&sock, format!("not signed by node {from}'s key"));
                }
            }
            other => return Err(Error::Protocol(format!("expected proof, got {other:?}"))),
        }
        let (msg, fds) = recv(&sock, buf)?;
        let remote = RemoteRings::take(msg, fds)?;
        let local = LocalRings::new()?;
        local.offer(&sock, f)?;
        sock.set_recv_timeout(None).map_err(|e| Error::sys("clearing a receive timeout", &e))?;
        let peer = ShmPeer::build(f, from, sock, local, remote);
        f.add_peer(peer.clone())?;
        debug!(peer = from, "accepted a shared-memory connection");
        Ok(peer)
    }

    /// Read the control socket until the connection ends, then tear down.
    fn serve(self: Arc<Self>, mut buf: Vec<u8>) {
        loop {
            let (msg, mut fds, payload) = match control::recv_with(&self.sock, &mut buf) {
                Ok(m) => m,
                Err(e) => {
                    debug!(peer = self.peer, "connection ends: {e}");
                    break;
                }
            };
            let data = payload.clone().map_or(&[][..], |r| &buf[r]);
            match msg {
                PeerMsg::Served { req, region, key, op } => self.serve_op(req, region, &key, op, data),
                PeerMsg::ServedDone { req, code, detail, value } => self.served_done(req, code, detail, value, data),
                _ if payload.is_some() => {
                    warn!(peer = self.peer, "data after a control message that carries none; closing");
                    break;
                }
                PeerMsg::MapServed { req } => {
                    if let Some(p) = lock(&self.pending).remove(&req) {
                        write(&self.served).insert(p.region);
                        let _ = p.reply.send(MapAnswer::Served);
                    }
                }
                PeerMsg::MapRequest { req, region, key, want } => self.serve_map(req, region, &key, want),
                PeerMsg::MapGranted { req, access } => {
                    let Some(p) = lock(&self.pending).remove(&req) else {
                        continue;
                    };
                    let access = Access::from_bits(access);
                    let how = if access.stores() { MapAccess::ReadWrite } else { MapAccess::ReadOnly };
                    let answer = match fds.pop().map(|fd| SharedMem::from_fd(fd, how)) {
                        // A reader sealed the memory between the owner's answer and this
                        // mapping: asked again, the owner moves it to fresh memory first.
                        Some(Err(rackwire_shm::ShmError::WriteSealed)) => MapAnswer::Refused(Refusal::Busy),
                        Some(Ok(mem)) => {
                            self.stats.mappings.fetch_add(1, Relaxed);
                            self.maps.write().unwrap_or_else(|e| e.into_inner()).insert(
                                p.region,
                                Mapping { mem: Arc::new(mem), key: p.key, access, pins: PinSet::new() },
                            );
                            MapAnswer::Granted
                        }
                        Some(Err(e)) => MapAnswer::Failed(e.into()),
                        None => MapAnswer::Failed(Error::Protocol("grant without a descriptor".into())),
                    };
                    let _ = p.reply.send(answer);
                }
                PeerMsg::MapRefused { req, code, detail } => {
                    let reason = Refusal::from_wire(code, detail);
                    if let Some(p) = lock(&self.pending).remove(&req) {
                        let _ = p.reply.send(MapAnswer::Refused(reason));
                    }
                }
                PeerMsg::Unmap { region, seq } => {
                    self.drop_mapping(region);
                    let _ = send(&self.sock, &PeerMsg::UnmapAck { seq }, &[]);
                }
                PeerMsg::UnmapAck { seq } => {
                    if let Some(w) = lock(&self.unmap_waiters).remove(&seq) {
                        let _ = w.send(());
                    }
                }
                other => {
                    warn!(peer = self.peer, "unexpected control message {other:?}; closing");
                    break;
                }
            }
        }
        self.alive.store(false, Relaxed);
        self.sock.shutdown();
        for (_, p) in lock(&self.pending).drain() {
            let _ = p.reply.send(MapAnswer::Failed(Error::PeerGone(self.peer)));
        }
        lock(&self.unmap_waiters).clear();
        lock(&self.served_waiters).clear();
        self.maps.write().unwrap_or_else(|e| e.into_inner()).clear();
        if let Some(f) = self.fabric.upgrade() {
            let me: Arc<dyn PeerTransport> = self.clone();
            f.remove_peer(&me);
        }
    }

    /// Owner side: decide a map request and answer it.
    fn serve_map(&self, req: u64, region: RegionId, key: &str, want: u8) {
        let Some(f) = self.fabric.upgrade() else {
            return;
        };
        let Some(key) = u128::from_str_radix(key, 16).ok().filter(|_| key.len() == 32) else {
            let _ = send(&self.sock, &PeerMsg::MapRefused { req, code: Refusal::BadKey.code(), detail: 0 }, &[]);
            return;
        };
        let decided = f.regions.with_grant_to_map(self.peer, region, key, Access::from_bits(want), |r, grant| {
            if r.served {
                let told = send(&self.sock, &PeerMsg::MapServed { req }, &[]).map(|()| handover::Handover::Sent);
                return (told, r.clone());
            }
            (handover::hand_over(&self.sock, r, req, self.peer, grant), r.clone())
        });
        let busy = PeerMsg::MapRefused { req, code: Refusal::Busy.code(), detail: 0 };
        match decided {
            Ok((Ok(handover::Handover::Sent), _)) => {}
            Ok((Ok(handover::Handover::Later), _)) => {
                let _ = send(&self.sock, &busy, &[]);
            }
            Ok((Ok(handover::Handover::MustMove), r)) => {
                handover::move_for(&f, &r, self.peer);
                let _ = send(&self.sock, &busy, &[]);
            }
            Ok((Err(e), _)) => {
                // A peer that reads nothing for the send timeout holds this node up no more.
                warn!(peer = self.peer, region, "could not hand over a mapping ({e}); cutting the peer off");
                self.cut_off();
            }
            Err(reason) => {
                self.stats.refused.fetch_add(1, Relaxed);
                let _ =
                    send(&self.sock, &PeerMsg::MapRefused { req, code: reason.code(), detail: reason.detail() }, &[]);
            }
        }
    }

    /// Drop our mapping of the peer's `region`. Operations hold the map shared while they use
    /// a mapping, so taking it exclusively waits until none is in flight.
    fn drop_mapping(&self, region: RegionId) {
        let removed = self.maps.write().unwrap_or_else(|e| e.into_inner()).remove(&region);
        drop(removed);
    }

    /// Run `place` on the mapping of `t` that allows `need`, asking the owner for it first when
    /// we have none; or, when the owner serves the region, on [`Target::Served`]. The map is
    /// held shared while `place` runs on a mapping, so an unmap (which takes it exclusively)
    /// waits until no operation is using it.
    fn with_target<T>(
        &self,
        t: &RemoteRegion,
        need: Access,
        place: impl FnOnce(Target<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        if t.node != self.peer {
            return Err(Error::UnknownPeer(t.node));
        }
        // Taken only when a mapping must be asked for: the common case (mapped) reads no clock.
        let mut deadline = None;
        loop {
            if !self.alive.load(Relaxed) {
                return Err(Error::PeerGone(self.peer));
            }
            {
                let maps = read(&self.maps);
                if let Some(m) = maps.get(&t.region) {
                    if m.key != t.key {
                        self.stats.refused.fetch_add(1, Relaxed);
                        return Err(Error::BadKey { region: t.region });
                    }
                    if m.access.contains(need) {
                        return place(Target::Mapped(m));
                    }
                }
            }
            if read(&self.served).contains(&t.region) {
                return place(Target::Served);
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.op_timeout);
            let r = self.request_mapping(t, need, deadline);
            if matches!(
                r,
                Err(Error::Ungranted { .. }
                    | Error::Revoked { .. }
                    | Error::BadKey { .. }
                    | Error::UnknownRegion { .. })
            ) {
                self.stats.refused.fetch_add(1, Relaxed);
            }
            r?;
            // Installed; unless it was unmapped again at once, the next look finds it.
        }
    }

    /// Ask the owner for a mapping of `t`; the reader thread installs it before we are told.
    fn request_mapping(&self, t: &RemoteRegion, need: Access, deadline: Instant) -> Result<(), Error> {
        loop {
            if Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            let req = self.next_req.fetch_add(1, Relaxed);
            let (tx, rx) = sync_channel(1);
            lock(&self.pending).insert(req, PendingMap { region: t.region, key: t.key, reply: tx });
            let ask = PeerMsg::MapRequest { req, region: t.region, key: t.key_hex(), want: need.bits() };
            if send(&self.sock, &ask, &[]).is_err() {
                lock(&self.pending).remove(&req);
                return Err(Error::PeerGone(self.peer));
            }
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(MapAnswer::Granted | MapAnswer::Served) => return Ok(()),
                Ok(MapAnswer::Refused(Refusal::Busy)) => std::thread::sleep(Duration::from_millis(1)),
                Ok(MapAnswer::Refused(r)) => {
                    let op = RefusedOp { node: self.peer, region: t.region, offset: 0, len: 0, need };
                    return Err(Error::refused(r, &op));
                }
                Ok(MapAnswer::Failed(e)) => return Err(e),
                Err(RecvTimeoutError::Timeout) => {
                    lock(&self.pending).remove(&req);
                    return Err(Error::Timeout);
                }
                Err(RecvTimeoutError::Disconnected) => return Err(Error::PeerGone(self.peer)),
            }
        }
    }
}
