//! The shared-memory transport: peers on hosts that share this host's memory.
//!
//! A connection is a Unix `SOCK_SEQPACKET` control socket plus, in each direction, two rings in
//! the *receiver's* memory that only the sender writes: one for messages, one for
//! notifications (the completion ring), and the receiver's doorbell. Remote regions are mapped
//! on first use: the initiator asks the owner, the owner applies its access rules and, if they
//! allow it, sends the region's descriptor (read-only when the grant has no store rights, so
//! the kernel enforces it). From then on writes, reads and atomics are plain loads, stores and
//! atomic instructions on the mapping: no CPU of the target on the data path, and every
//! operation has completed when the call returns (so fences hold trivially).
//!
//! Revocation: the owner sends `Unmap`; this side drops the mapping once no operation is
//! using it and confirms. The control socket is read by one thread per connection, which
//! also installs granted mappings, so a grant and a later unmap are applied in the order the
//! owner sent them.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
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

use crate::grants::Refusal;
use crate::node::Node;
use crate::pin::{out_of_bounds, signal_access, store_with_signal, PinSet, Pinned};
use crate::sync::{lock, read};
use crate::transport::PeerTransport;
use crate::{
    Access, BatchOptions, Completion, ConnStats, Error, NodeId, Notification, Op, OpFlags, RegionId, RemoteRegion,
    Signal, SignalOp, CONNECT_TIMEOUT, MESSAGE_RING_BYTES, NOTIFY_RING_BYTES,
};

const KIND_MESSAGE: u32 = 1;
const KIND_NOTIFY: u32 = 2;
/// Notification payload: region u32, reserved u32, offset u64, length u64, immediate u64, and
/// 16 reserved bytes that make a record (with its 16-byte header) exactly one cache line.
const NOTIFY_RECORD_BYTES: usize = 48;
const _: () = assert!(rackwire_shm::ring::record_bytes(NOTIFY_RECORD_BYTES as u64) == 64);

/// Control messages between two nodes that share memory.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum PeerMsg {
    Hello {
        from: NodeId,
        to: NodeId,
        nonce: String,
    },
    Challenge {
        nonce: String,
        proof: String,
    },
    Proof {
        proof: String,
    },
    /// Carries four descriptors: message ring, notification ring, doorbell page, doorbell eventfd.
    Rings,
    Refused {
        reason: String,
    },
    MapRequest {
        req: u64,
        region: RegionId,
        key: String,
        want: u8,
    },
    /// Carries the region's descriptor.
    MapGranted {
        req: u64,
        access: u8,
    },
    MapRefused {
        req: u64,
        reason: Refusal,
    },
    Unmap {
        region: RegionId,
        seq: u64,
    },
    UnmapAck {
        seq: u64,
    },
}

fn send(sock: &ControlSocket, msg: &PeerMsg, fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
    let bytes = serde_json::to_vec(msg).map_err(|e| Error::Protocol(e.to_string()))?;
    sock.send(&bytes, fds).map_err(|e| Error::Sys(format!("control socket: {e}")))
}

fn recv(sock: &ControlSocket, buf: &mut [u8]) -> Result<(PeerMsg, Vec<OwnedFd>), Error> {
    let (n, fds) = sock.recv(buf).map_err(|e| Error::Sys(format!("control socket: {e}")))?;
    if n == 0 {
        return Err(Error::Protocol("peer closed the connection".into()));
    }
    let msg =
        serde_json::from_slice(&buf[..n]).map_err(|e| Error::Protocol(format!("malformed control message: {e}")))?;
    Ok((msg, fds))
}

/// Our receive side of a connection: rings the peer will write into.
struct LocalRings {
    msg: RingReceiver,
    notify: RingReceiver,
}

impl LocalRings {
    fn new() -> Result<Self, Error> {
        Ok(LocalRings {
            msg: RingReceiver::create("rackwire-msg-ring", MESSAGE_RING_BYTES)?,
            notify: RingReceiver::create("rackwire-notify-ring", NOTIFY_RING_BYTES)?,
        })
    }

    fn offer(&self, sock: &ControlSocket, f: &Node) -> Result<(), Error> {
        let [page, efd] = f.doorbell.fds();
        send(sock, &PeerMsg::Rings, &[self.msg.mem().fd(), self.notify.mem().fd(), page, efd])
    }
}

/// Our send side: the peer's rings and doorbell, from the descriptors it sent.
struct RemoteRings {
    msg: RingSender,
    notify: RingSender,
    bell: DoorbellRemote,
}

impl RemoteRings {
    fn take(msg: PeerMsg, fds: Vec<OwnedFd>) -> Result<Self, Error> {
        match msg {
            PeerMsg::Rings => {}
            PeerMsg::Refused { reason } => {
                return Err(Error::Protocol(format!("peer refused the connection: {reason}")))
            }
            other => return Err(Error::Protocol(format!("expected rings, got {other:?}"))),
        }
        let [m, n, page, efd]: [OwnedFd; 4] =
            fds.try_into().map_err(|_| Error::Protocol("rings need four descriptors".into()))?;
        let ring = |fd| -> Result<RingSender, Error> {
            Ok(RingSender::attach(SharedMem::from_fd(fd, MapAccess::ReadWrite)?)?)
        };
        Ok(RemoteRings { msg: ring(m)?, notify: ring(n)?, bell: DoorbellRemote::attach(page, efd)? })
    }
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
    messages_sent: AtomicU64,
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
    pending: Mutex<HashMap<u64, PendingMap>>,
    unmap_waiters: Mutex<HashMap<u64, SyncSender<()>>>,
    next_req: AtomicU64,
    alive: AtomicBool,
    op_timeout: Duration,
    stats: Arc<Counters>,
}

fn context(initiator: NodeId, acceptor: NodeId) -> Vec<u8> {
    format!("rackwire-shm {initiator}->{acceptor}").into_bytes()
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
        let sock = ControlSocket::connect(std::path::Path::new(path))
            .map_err(|e| Error::Sys(format!("connect to node {}: {e}", info.id)))?;
        sock.set_recv_timeout(Some(CONNECT_TIMEOUT)).map_err(|e| Error::Sys(e.to_string()))?;
        let mut buf = vec![0u8; CONTROL_MSG_BYTES_MAX];
        let ctx = context(f.id, info.id);
        let nonce = auth::nonce();
        send(&sock, &PeerMsg::Hello { from: f.id, to: info.id, nonce: to_hex(&nonce) }, &[])?;
        let their_nonce = match recv(&sock, &mut buf)?.0 {
            PeerMsg::Challenge { nonce: n, proof } => {
                let ok = from_hex(&proof)
                    .is_some_and(|p| auth::verify(&f.cfg.secret, "rackwire-peer-acceptor", &nonce, &ctx, &p));
                if !ok {
                    return Err(Error::Protocol(format!(
                        "node {} could not prove it holds the fabric secret",
                        info.id
                    )));
                }
                from_hex(&n).ok_or_else(|| Error::Protocol("bad nonce".into()))?
            }
            PeerMsg::Refused { reason } => return Err(Error::Protocol(format!("node {} refused: {reason}", info.id))),
            other => return Err(Error::Protocol(format!("expected a challenge, got {other:?}"))),
        };
        let proof = auth::prove(&f.cfg.secret, "rackwire-peer-initiator", &their_nonce, &ctx);
        send(&sock, &PeerMsg::Proof { proof: to_hex(&proof) }, &[])?;
        let local = LocalRings::new()?;
        local.offer(&sock, f)?;
        let (msg, fds) = recv(&sock, &mut buf)?;
        let remote = RemoteRings::take(msg, fds)?;
        sock.set_recv_timeout(None).map_err(|e| Error::Sys(e.to_string()))?;
        let peer = ShmPeer::build(f, info.id, sock, local, remote);
        let dynp: Arc<dyn PeerTransport> = peer.clone();
        f.add_peer(dynp.clone())?;
        let reader = peer.clone();
        std::thread::Builder::new()
            .name("rw-peer".into())
            .spawn(move || reader.serve(buf))
            .map_err(|e| Error::Sys(e.to_string()))?;
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
        sock.set_recv_timeout(Some(CONNECT_TIMEOUT)).map_err(|e| Error::Sys(e.to_string()))?;
        let refuse = |sock: &ControlSocket, reason: String| {
            let _ = send(sock, &PeerMsg::Refused { reason: reason.clone() }, &[]);
            Err(Error::Protocol(reason))
        };
        let (from, their_nonce) = match recv(&sock, buf)?.0 {
            PeerMsg::Hello { from, to, nonce } => {
                if to != f.id {
                    return refuse(&sock, format!("this is node {}, not node {to}", f.id));
                }
                (from, from_hex(&nonce).ok_or_else(|| Error::Protocol("bad nonce".into()))?)
            }
            other => return Err(Error::Protocol(format!("expected hello, got {other:?}"))),
        };
        if let Err(MhError::NotFound(_)) = f.mh.resolve(from) {
            return refuse(&sock, format!("node {from} is unknown to the management host"));
        }
        let ctx = context(from, f.id);
        let my_nonce = auth::nonce();
        let proof = auth::prove(&f.cfg.secret, "rackwire-peer-acceptor", &their_nonce, &ctx);
        send(&sock, &PeerMsg::Challenge { nonce: to_hex(&my_nonce), proof: to_hex(&proof) }, &[])?;
        match recv(&sock, buf)?.0 {
            PeerMsg::Proof { proof }
                if from_hex(&proof)
                    .is_some_and(|p| auth::verify(&f.cfg.secret, "rackwire-peer-initiator", &my_nonce, &ctx, &p)) => {}
            PeerMsg::Proof { .. } => return refuse(&sock, "wrong secret".into()),
            other => return Err(Error::Protocol(format!("expected proof, got {other:?}"))),
        }
        let (msg, fds) = recv(&sock, buf)?;
        let remote = RemoteRings::take(msg, fds)?;
        let local = LocalRings::new()?;
        local.offer(&sock, f)?;
        sock.set_recv_timeout(None).map_err(|e| Error::Sys(e.to_string()))?;
        let peer = ShmPeer::build(f, from, sock, local, remote);
        f.add_peer(peer.clone())?;
        debug!(peer = from, "accepted a shared-memory connection");
        Ok(peer)
    }

    /// Read the control socket until the connection ends, then tear down.
    fn serve(self: Arc<Self>, mut buf: Vec<u8>) {
        loop {
            let (msg, mut fds) = match recv(&self.sock, &mut buf) {
                Ok(m) => m,
                Err(e) => {
                    debug!(peer = self.peer, "connection ends: {e}");
                    break;
                }
            };
            match msg {
                PeerMsg::MapRequest { req, region, key, want } => self.serve_map(req, region, &key, want),
                PeerMsg::MapGranted { req, access } => {
                    let Some(p) = lock(&self.pending).remove(&req) else {
                        continue;
                    };
                    let access = Access::from_bits(access);
                    let how = if access.stores() { MapAccess::ReadWrite } else { MapAccess::ReadOnly };
                    let answer = match fds.pop().map(|fd| SharedMem::from_fd(fd, how)) {
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
                PeerMsg::MapRefused { req, reason } => {
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
            let _ = send(&self.sock, &PeerMsg::MapRefused { req, reason: Refusal::BadKey }, &[]);
            return;
        };
        let decided = f.regions.with_grant(self.peer, region, key, Access::from_bits(want), |r, access| {
            let mem = r.mem.lock();
            let granted = PeerMsg::MapGranted { req, access: access.bits() };
            if access.stores() {
                send(&self.sock, &granted, &[mem.fd()])
            } else {
                let ro = mem.readonly_fd()?;
                send(&self.sock, &granted, &[ro.as_fd()])
            }
        });
        match decided {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(peer = self.peer, region, "could not hand over a mapping: {e}"),
            Err(reason) => {
                self.stats.refused.fetch_add(1, Relaxed);
                let _ = send(&self.sock, &PeerMsg::MapRefused { req, reason }, &[]);
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
    /// we have none. The map is held shared while `place` runs, so an unmap (which takes it
    /// exclusively) waits until no operation is using the mapping.
    fn with_mapping<T>(
        &self,
        t: &RemoteRegion,
        need: Access,
        place: impl FnOnce(&Mapping) -> Result<T, Error>,
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
                        return place(m);
                    }
                }
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
                Ok(MapAnswer::Granted) => return Ok(()),
                Ok(MapAnswer::Refused(Refusal::Busy)) => std::thread::sleep(Duration::from_millis(1)),
                Ok(MapAnswer::Refused(r)) => return Err(r.into_error(self.peer, t.region)),
                Ok(MapAnswer::Failed(e)) => return Err(e),
                Err(RecvTimeoutError::Timeout) => {
                    lock(&self.pending).remove(&req);
                    return Err(Error::Timeout);
                }
                Err(RecvTimeoutError::Disconnected) => return Err(Error::PeerGone(self.peer)),
            }
        }
    }

    /// Append a record to one of the peer's rings, waiting for room up to the op timeout,
    /// then ring its doorbell (a no-op while it is polling).
    fn push(&self, ring: &Mutex<RingSender>, kind: u32, parts: &[&[u8]]) -> Result<(), Error> {
        let mut deadline = None;
        loop {
            let r = lock(ring).push(kind, parts);
            match r {
                Ok(()) => {
                    self.bell.ring();
                    return Ok(());
                }
                Err(PushError::TooLarge { len, max }) => {
                    return Err(Error::MessageTooLarge { len: len as usize, max: max as usize })
                }
                Err(PushError::Full) => {
                    if !self.alive.load(Relaxed) {
                        return Err(Error::PeerGone(self.peer));
                    }
                    self.stats.ring_full_waits.fetch_add(1, Relaxed);
                    let d = *deadline.get_or_insert_with(|| Instant::now() + self.op_timeout);
                    if Instant::now() >= d {
                        return Err(Error::Timeout);
                    }
                    self.bell.ring();
                    std::thread::yield_now();
                }
            }
        }
    }

    fn notify_after(&self, region: RegionId, offset: u64, len: u64, flags: OpFlags) -> Result<(), Error> {
        let Some(imm) = flags.notify else {
            return Ok(());
        };
        let mut rec = [0u8; NOTIFY_RECORD_BYTES];
        rec[0..4].copy_from_slice(&region.to_le_bytes());
        rec[8..16].copy_from_slice(&offset.to_le_bytes());
        rec[16..24].copy_from_slice(&len.to_le_bytes());
        rec[24..32].copy_from_slice(&imm.to_le_bytes());
        self.push(&self.tx_notify, KIND_NOTIFY, &[&rec])?;
        self.stats.notifications_sent.fetch_add(1, Relaxed);
        Ok(())
    }

    fn oob(t: &RemoteRegion, m: &Mapping, offset: u64, len: u64) -> Error {
        out_of_bounds(t.region, &m.mem, offset, len)
    }

    fn refused(&self, e: Error) -> Error {
        self.stats.refused.fetch_add(1, Relaxed);
        e
    }

    fn do_write(&self, t: &RemoteRegion, offset: u64, data: &[u8], flags: OpFlags) -> Result<Completion, Error> {
        self.with_mapping(t, Access::WRITE, |m| {
            if m.mem.write_at(offset, data) {
                Ok(())
            } else {
                Err(self.refused(Self::oob(t, m, offset, data.len() as u64)))
            }
        })?;
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats.bytes_written.fetch_add(data.len() as u64, Relaxed);
        self.notify_after(t.region, offset, data.len() as u64, flags)?;
        Ok(Completion::Done)
    }

    fn do_write_signal(
        &self,
        t: &RemoteRegion,
        offset: u64,
        data: &[u8],
        signal: Signal,
        flags: OpFlags,
    ) -> Result<Completion, Error> {
        let old = self.with_mapping(t, signal_access(&signal, data), |m| {
            // Counted before the stores: an atomic instruction after them would wait for
            // them to reach the peer's cache, and this call need not.
            self.stats.writes.fetch_add(1, Relaxed);
            self.stats.bytes_written.fetch_add(data.len() as u64, Relaxed);
            store_with_signal(t.region, &m.mem, offset, data, signal).map_err(|e| self.refused(e))
        })?;
        self.notify_after(t.region, signal.offset, 8, flags)?;
        Ok(match signal.op {
            SignalOp::Set(_) => Completion::Done,
            SignalOp::Add(_) => Completion::Value(old),
        })
    }

    fn do_batch(
        &self,
        t: &RemoteRegion,
        entries: &[(u64, &[u8])],
        flags: OpFlags,
        opts: BatchOptions,
    ) -> Result<Completion, Error> {
        let f = self.fabric.upgrade().ok_or(Error::Closed)?;
        self.with_mapping(t, Access::WRITE, |m| {
            f.copy.write_batch(&m.mem, entries, opts.combine, opts.channels).map(drop).map_err(|i| {
                let (off, d) = entries[i];
                self.refused(Self::oob(t, m, off, d.len() as u64))
            })
        })?;
        let total: u64 = entries.iter().map(|(_, d)| d.len() as u64).sum();
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats.bytes_written.fetch_add(total, Relaxed);
        let (last_off, last) = entries.last().map_or((0, 0), |(o, d)| (*o, d.len() as u64));
        self.notify_after(t.region, last_off, last, flags)?;
        Ok(Completion::Done)
    }

    fn do_read(&self, t: &RemoteRegion, offset: u64, len: u64, flags: OpFlags) -> Result<Completion, Error> {
        let out = self.with_mapping(t, Access::READ, |m| {
            if offset.checked_add(len).is_none_or(|end| end > m.mem.len() as u64) {
                return Err(self.refused(Self::oob(t, m, offset, len)));
            }
            let mut out = vec![0u8; len as usize];
            m.mem.read_at(offset, &mut out);
            Ok(out)
        })?;
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.bytes_read.fetch_add(len, Relaxed);
        self.notify_after(t.region, offset, len, flags)?;
        Ok(Completion::Data(out))
    }

    fn do_atomic(
        &self,
        t: &RemoteRegion,
        offset: u64,
        flags: OpFlags,
        op: impl FnOnce(&AtomicU64) -> u64,
    ) -> Result<Completion, Error> {
        if !offset.is_multiple_of(8) {
            return Err(Error::Misaligned { offset });
        }
        let old = self.with_mapping(t, Access::ATOMIC, |m| match m.mem.atomic_u64(offset) {
            Some(word) => Ok(op(word)),
            None => Err(self.refused(Self::oob(t, m, offset, 8))),
        })?;
        self.stats.atomics.fetch_add(1, Relaxed);
        self.notify_after(t.region, offset, 8, flags)?;
        Ok(Completion::Value(old))
    }
}

impl PeerTransport for ShmPeer {
    fn peer(&self) -> NodeId {
        self.peer
    }

    fn kind(&self) -> &'static str {
        "shm"
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Relaxed)
    }

    fn write(&self, t: &RemoteRegion, offset: u64, data: &[u8], flags: OpFlags) -> Op {
        Op::ready(self.do_write(t, offset, data, flags))
    }

    fn write_batch(&self, t: &RemoteRegion, entries: &[(u64, &[u8])], flags: OpFlags, opts: BatchOptions) -> Op {
        Op::ready(self.do_batch(t, entries, flags, opts))
    }

    fn write_signal(&self, t: &RemoteRegion, offset: u64, data: &[u8], signal: Signal, flags: OpFlags) -> Op {
        Op::ready(self.do_write_signal(t, offset, data, signal, flags))
    }

    fn read(&self, t: &RemoteRegion, offset: u64, len: u64, flags: OpFlags) -> Op {
        Op::ready(self.do_read(t, offset, len, flags))
    }

    fn compare_swap(&self, t: &RemoteRegion, offset: u64, expected: u64, new: u64, flags: OpFlags) -> Op {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        Op::ready(
            self.do_atomic(t, offset, flags, |w| {
                w.compare_exchange(expected, new, AcqRel, Acquire).unwrap_or_else(|v| v)
            }),
        )
    }

    fn fetch_add(&self, t: &RemoteRegion, offset: u64, add: u64, flags: OpFlags) -> Op {
        Op::ready(self.do_atomic(t, offset, flags, |w| w.fetch_add(add, std::sync::atomic::Ordering::AcqRel)))
    }

    fn send(&self, msg: &[u8]) -> Op {
        if !self.alive.load(Relaxed) {
            return Op::ready(Err(Error::PeerGone(self.peer)));
        }
        let r = self.push(&self.tx_msg, KIND_MESSAGE, &[msg]).map(|()| {
            self.stats.messages_sent.fetch_add(1, Relaxed);
            Completion::Done
        });
        Op::ready(r)
    }

    fn try_recv(&self, out: &mut Vec<u8>) -> Result<bool, Error> {
        self.try_recv_with(&mut |payload| {
            out.clear();
            out.extend_from_slice(payload);
        })
    }

    fn try_recv_with(&self, f: &mut dyn FnMut(&[u8])) -> Result<bool, Error> {
        if !self.rx_msg_watch.pending() {
            return Ok(false);
        }
        match lock(&self.rx_msg).pop_with(|kind, payload| (kind == KIND_MESSAGE).then(|| f(payload)).is_some()) {
            Ok(Some(true)) => Ok(true),
            Ok(Some(false)) => Err(Error::Protocol("unknown record kind in message ring".into())),
            Ok(None) => Ok(false),
            Err(e) => Err(Error::Protocol(e.to_string())),
        }
    }

    fn try_notification(&self) -> Result<Option<Notification>, Error> {
        if !self.rx_notify_watch.pending() {
            return Ok(None);
        }
        let mut rec = Vec::with_capacity(NOTIFY_RECORD_BYTES);
        match lock(&self.rx_notify).pop(&mut rec) {
            Ok(Some(KIND_NOTIFY)) if rec.len() == NOTIFY_RECORD_BYTES => {
                let u64_at = |i: usize| u64::from_le_bytes(rec[i..i + 8].try_into().expect("8 bytes"));
                Ok(Some(Notification {
                    from: self.peer,
                    region: u32::from_le_bytes(rec[0..4].try_into().expect("4 bytes")),
                    offset: u64_at(8),
                    len: u64_at(16),
                    imm: u64_at(24),
                }))
            }
            Ok(Some(_)) => Err(Error::Protocol("malformed notification record".into())),
            Ok(None) => Ok(None),
            Err(e) => Err(Error::Protocol(e.to_string())),
        }
    }

    fn pin(&self, t: &RemoteRegion, need: Access) -> Result<Pinned, Error> {
        let (mem, pins, access) = self.with_mapping(t, need, |m| Ok((m.mem.clone(), m.pins.clone(), m.access)))?;
        let stats = self.stats.clone();
        let counts = Box::new(move |writes, bytes| {
            stats.writes.fetch_add(writes, Relaxed);
            stats.bytes_written.fetch_add(bytes, Relaxed);
        });
        Pinned::new(mem, &pins, t.region, self.peer, access, counts)
    }

    fn unmap(&self, region: RegionId, timeout: Duration) -> bool {
        if !self.alive.load(Relaxed) {
            return false;
        }
        let seq = self.next_req.fetch_add(1, Relaxed);
        let (tx, rx) = sync_channel(1);
        lock(&self.unmap_waiters).insert(seq, tx);
        if send(&self.sock, &PeerMsg::Unmap { region, seq }, &[]).is_err() {
            lock(&self.unmap_waiters).remove(&seq);
            return false;
        }
        let ok = rx.recv_timeout(timeout).is_ok();
        lock(&self.unmap_waiters).remove(&seq);
        ok
    }

    fn cut_off(&self) {
        self.alive.store(false, Relaxed);
        self.sock.shutdown();
    }

    fn stats(&self) -> ConnStats {
        let s = &self.stats;
        ConnStats {
            writes: s.writes.load(Relaxed),
            reads: s.reads.load(Relaxed),
            atomics: s.atomics.load(Relaxed),
            bytes_written: s.bytes_written.load(Relaxed),
            bytes_read: s.bytes_read.load(Relaxed),
            messages_sent: s.messages_sent.load(Relaxed),
            notifications_sent: s.notifications_sent.load(Relaxed),
            refused: s.refused.load(Relaxed),
            ring_full_waits: s.ring_full_waits.load(Relaxed),
            doorbells: self.bell.rings(),
            mappings: s.mappings.load(Relaxed),
            ..ConnStats::default()
        }
    }
}
