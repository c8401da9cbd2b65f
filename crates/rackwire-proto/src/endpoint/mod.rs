//! One node's connections: frames routed by the connection id in each frame's header, the
//! operations in flight on each, what they delivered, and the answers they hold.
//!
//! Like quinn-proto's `Endpoint`, it holds no sockets, threads or clock: a driver hands it
//! each arriving frame with the link and the address it came from, and it finds the frame's
//! connection (by the id this end chose, which the peer puts in every frame), or, for a first
//! handshake frame addressed to this node, opens one — once: a repeated first frame (the
//! peer sends it again until answered) finds the connection it opened. Frames for no
//! connection of this node, handshakes meant for another node, and first frames on a link the
//! peer does not have are dropped.
//!
//! Operations are submitted through it ([`Endpoint::submit`]) with what the driver needs to
//! finish each one's handle (`P`), given back exactly once when the operation completes or its
//! connection ends ([`Endpoint::poll`]). Messages and notifications wait in bounded queues
//! ([`Endpoint::set_delivery_room`]) until the application takes them; a connection that
//! handed one over may hold its answers for the reply the application is likely to send
//! (one frame then carries both), until the driver's next round ([`Endpoint::release_holds`]).

mod session;

use std::collections::HashMap;

use rackwire_wire::payload::HANDSHAKE_LEN;
use rackwire_wire::{Frame, FrameKind, FrameRepr, HandshakeRepr, HandshakeStep, HEADER_LEN};

/// The bytes an address's `Hash` writes: what a retry token binds of where a caller is.
struct AddrBytes(Vec<u8>);

impl std::hash::Hasher for AddrBytes {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

pub use session::Session;

use crate::{CloseReason, Completion, Connection, Event, OpError, OpId, OwnIdMap, Target, Time};

/// The most connections one endpoint keeps (each is a peer on the edge transport).
pub const CONNECTIONS_MAX: usize = 4096;
/// Connections a peer's first frame opened that are still in their handshake, at most: one
/// more makes the oldest of them go (so first frames from spoofed sources, each naming a real
/// node, hold at most this many slots, each for at most the handshake timeout).
pub const HANDSHAKES_ACCEPTED_MAX: usize = 256;
/// Accepted handshakes under way past which a first frame opens a connection only with a
/// retry token (see [`Endpoint::set_retry_key`]): below it, a caller pays no extra round trip.
pub const HANDSHAKES_BEFORE_RETRY: usize = 16;
/// How long a retry token holds (it is good in the period it was made in and the next).
pub const RETRY_TOKEN_PERIOD_US: Time = 2_000_000;
/// Retry frames waiting for the driver to send them, at most (more first frames are dropped).
pub const RETRIES_QUEUED_MAX: usize = 64;

/// What [`Endpoint::poll`] found besides the events it handed over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Polled {
    /// Some connection delivered a message or a notification.
    pub delivered: bool,
    /// An ordered operation (a signal) took effect at some connection.
    pub signalled: bool,
}

/// What a connection did, as [`Endpoint::poll`] hands it to the driver.
#[derive(Debug, PartialEq)]
pub enum Happened<P> {
    /// The handshake completed; `accepted`: the peer opened the connection.
    Connected {
        /// Opened by the peer's first frame.
        accepted: bool,
    },
    /// An operation completed (or its connection ended: `Err(OpError::Closed)`), once.
    Completed {
        /// What the driver kept for it.
        op: P,
        /// Its outcome.
        result: Result<Completion, OpError>,
    },
    /// A message or notification of a connection without delivery bounds (with them, it
    /// waits in the connection's queues: [`Session::next_message`], [`Session::next_note`]).
    Delivered(Event),
    /// A link stopped answering.
    LinkDown(usize),
    /// A link answers again.
    LinkUp(usize),
    /// Data frames cut to `frame_len` bytes: the path carries no more than that of the
    /// `agreed` length (see [`crate::PATH_FRAME_RUNGS`]).
    PathCut {
        /// The frame length data now goes in.
        frame_len: usize,
        /// The length the handshake agreed on.
        agreed: usize,
    },
    /// The connection ended (after every operation pending on it completed).
    Closed(CloseReason),
}

/// A first handshake frame that opens a connection: who from, their id for it, and how many
/// links it may use (the fewer of the two ends').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// The peer's node id.
    pub peer: u32,
    /// The peer's id for the connection.
    pub peer_conn: u32,
    /// Links both ends have.
    pub links: usize,
}

/// Where a frame went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routed {
    /// To the connection with this (local) id.
    Conn(u32),
    /// To a connection it opened, with this id.
    Accepted(u32),
    /// Nowhere: not for this node, or for no connection of it.
    Dropped,
}

/// The earlier of two deadlines (none is never).
pub fn earliest(a: Option<Time>, b: Option<Time>) -> Option<Time> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One node's connections (see the module documentation): `A` is a link address, `P` what
/// the driver keeps per operation in flight.
#[derive(Debug)]
pub struct Endpoint<A, P> {
    me: u32,
    links: usize,
    sessions: OwnIdMap<u32, Session<A, P>>,
    /// Connections opened by a first handshake frame, by (peer, the peer's id for it).
    accepted: HashMap<(u32, u32), u32>,
    /// Of those, the ones opened most recently, oldest first (some may have finished their
    /// handshake or gone since: see [`HANDSHAKES_ACCEPTED_MAX`]).
    handshaking: std::collections::VecDeque<u32>,
    next_local: u32,
    /// Bounds of every connection's delivery queues (bytes of messages, notifications).
    room: Option<(usize, usize)>,
    /// Some connection holds its answers.
    holding: bool,
    /// The key of retry tokens (none: first frames are never asked to retry).
    retry_key: Option<[u8; 32]>,
    /// Retry frames to send: to whom, on which link, the frame.
    retries: std::collections::VecDeque<(A, usize, Vec<u8>)>,
    /// First frames answered with a Retry instead of a connection.
    retries_sent: u64,
}

impl<A: Copy + std::hash::Hash, P> Endpoint<A, P> {
    /// An endpoint of node `me` with `links` links.
    pub fn new(me: u32, links: usize) -> Self {
        Endpoint {
            me,
            links,
            sessions: OwnIdMap::default(),
            accepted: HashMap::new(),
            handshaking: std::collections::VecDeque::new(),
            next_local: 1,
            room: None,
            holding: false,
            retry_key: None,
            retries: std::collections::VecDeque::new(),
            retries_sent: 0,
        }
    }

    /// Answer first frames with a stateless Retry once [`HANDSHAKES_BEFORE_RETRY`] accepted
    /// handshakes are under way, as QUIC's Retry does: nothing is kept, and no key exchange or
    /// signature made, for a caller until its Hello comes back with the token the Retry gave,
    /// a MAC under `key` of its address, its node and connection ids and its nonce, good for
    /// [`RETRY_TOKEN_PERIOD_US`] to two of it — which only a caller that receives at the address
    /// it sends from can return. The driver draws `key` at random and sends what
    /// [`Endpoint::next_retry`] gives.
    pub fn set_retry_key(&mut self, key: [u8; 32]) {
        self.retry_key = Some(key);
    }

    /// A Retry frame to send: to whom, on which link, the frame.
    pub fn next_retry(&mut self) -> Option<(A, usize, Vec<u8>)> {
        self.retries.pop_front()
    }

    /// First frames answered with a Retry so far.
    pub fn retries_sent(&self) -> u64 {
        self.retries_sent
    }

    /// Give this endpoint's connections ids from `first` on (0 is skipped): a driver starts
    /// them at a random point, so that a node that restarts does not reuse its predecessor's
    /// ids while its peers may still remember them.
    pub fn start_ids_at(&mut self, first: u32) {
        self.next_local = first.max(1);
    }

    /// Bound what each connection, now and later, delivers and the application has not taken:
    /// `bytes` of messages and `notes` notifications (past them, the sender is held back).
    /// Without bounds every message and notification is handed over as it comes.
    pub fn set_delivery_room(&mut self, bytes: usize, notes: usize) {
        self.room = Some((bytes, notes));
        for s in self.sessions.values_mut() {
            s.set_room(bytes, notes);
        }
    }

    /// Add a connection this node opens to node `peer`, at `addrs[link]` on each link: `make`
    /// builds it from the local id it gets (the id goes into [`Connection::connect`]). None
    /// when [`CONNECTIONS_MAX`] are open.
    pub fn open(&mut self, peer: u32, addrs: Vec<Option<A>>, make: impl FnOnce(u32) -> Connection) -> Option<u32> {
        if self.sessions.len() >= CONNECTIONS_MAX {
            return None;
        }
        let local = self.next_id();
        self.sessions.insert(local, Session::new(make(local), peer, addrs, self.room, false));
        Some(local)
    }

    fn next_id(&mut self) -> u32 {
        loop {
            let id = self.next_local;
            self.next_local = self.next_local.checked_add(1).unwrap_or(1);
            // 0 is "no connection yet" on the wire; an id in use is skipped after a wrap.
            if id != 0 && !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }

    /// A frame arrived on `link` from `from`: route it (opening a connection with `accept`
    /// for a new peer's first handshake frame: it gets the local id and what the frame said,
    /// and gives `None` to leave the frame unanswered, for a peer whose node key it does not
    /// know yet) and feed it to its connection.
    #[allow(clippy::too_many_arguments)]
    pub fn handle(
        &mut self,
        now: Time,
        link: usize,
        from: A,
        frame: &[u8],
        target: &mut dyn Target,
        accept: impl FnOnce(u32, Incoming) -> Option<Connection>,
    ) -> Routed {
        let Some((local, opened)) = self.route(now, link, from, frame, accept) else { return Routed::Dropped };
        let Some(s) = self.sessions.get_mut(&local) else { return Routed::Dropped };
        // The peer's address on a link moves only on a frame that proved the peer sent it
        // (connection ids travel in clear: anyone could send a frame carrying one). Until the
        // handshake is over, a link where the peer was never heard takes the address of the
        // first frame on it, so that handshake steps can be answered there.
        let handshaking = s.conn().state() == crate::State::Handshaking;
        let proven = s.conn_mut().handle_frame(now, link, frame, target);
        s.heard_from(link, from, proven, handshaking);
        if opened {
            Routed::Accepted(local)
        } else {
            Routed::Conn(local)
        }
    }

    /// The local id of a frame's connection, and whether it was just opened.
    fn route(
        &mut self,
        now: Time,
        link: usize,
        from: A,
        frame: &[u8],
        accept: impl FnOnce(u32, Incoming) -> Option<Connection>,
    ) -> Option<(u32, bool)> {
        // Only the connection id and the kind are read here, unchecked: the connection checks
        // the whole frame (checksums included) once, and drops it if damaged.
        if frame.len() < HEADER_LEN {
            return None;
        }
        let f = Frame::new_unchecked(frame);
        if f.conn() != 0 || f.kind() != FrameKind::Handshake {
            return Some((f.conn(), false));
        }
        // A first handshake frame: whose, and how many links.
        let h = HandshakeRepr::parse(&frame[HEADER_LEN..]).ok()?;
        if h.to != self.me {
            return None;
        }
        if let Some(&local) = self.accepted.get(&(h.from, h.conn)) {
            if self.sessions.get(&local).is_some_and(|s| s.conn().peer_nonce() == h.nonce) {
                return Some((local, false));
            }
            // Another nonce: the peer restarted (and chose the same id for its connection).
            // Its new first frame opens a new connection; the old one, to a peer that is no
            // more, is found gone in its own time.
            self.accepted.remove(&(h.from, h.conn));
        }
        let links = (h.links as usize).min(self.links);
        if link >= links {
            return None;
        }
        self.make_room_for_a_handshake();
        if self.sessions.len() >= CONNECTIONS_MAX {
            return None;
        }
        if let Some(key) = self.retry_key {
            if self.handshaking.len() >= HANDSHAKES_BEFORE_RETRY && !self.token_holds(&key, now, from, &h) {
                self.queue_retry(&key, now, link, from, &h);
                return None;
            }
        }
        let local = self.next_id();
        let conn = accept(local, Incoming { peer: h.from, peer_conn: h.conn, links })?;
        self.sessions.insert(local, Session::new(conn, h.from, vec![None; links], self.room, true));
        self.accepted.insert((h.from, h.conn), local);
        self.handshaking.push_back(local);
        Some((local, true))
    }

    /// The retry token for a Hello `h` from `from` in period `period`.
    fn token(key: &[u8; 32], period: Time, from: A, h: &HandshakeRepr) -> [u8; 32] {
        let mut addr = AddrBytes(Vec::new());
        std::hash::Hash::hash(&from, &mut addr);
        let (ids, period) = ([h.from.to_be_bytes(), h.conn.to_be_bytes()].concat(), period.to_be_bytes());
        rackwire_wire::auth::mac_parts(key, &[b"rackwire-edge-retry", &addr.0, &ids, &h.nonce, &period])
    }

    /// Whether Hello `h` from `from` carries a token made for it in this period or the last.
    fn token_holds(&self, key: &[u8; 32], now: Time, from: A, h: &HandshakeRepr) -> bool {
        let period = now / RETRY_TOKEN_PERIOD_US;
        [period, period.saturating_sub(1)].into_iter().any(|p| Self::token(key, p, from, h) == h.proof)
    }

    /// Answer Hello `h` from `from` on `link` with a Retry carrying its token.
    fn queue_retry(&mut self, key: &[u8; 32], now: Time, link: usize, from: A, h: &HandshakeRepr) {
        if self.retries.len() >= RETRIES_QUEUED_MAX {
            return;
        }
        let retry = HandshakeRepr {
            step: HandshakeStep::Retry,
            from: self.me,
            to: h.from,
            conn: 0,
            proof: Self::token(key, now / RETRY_TOKEN_PERIOD_US, from, h),
            ephemeral: [0; 32],
            signature: [0; 64],
            pake: [0; rackwire_wire::auth::PAKE_MSG_BYTES],
            ..*h
        };
        let repr = FrameRepr {
            kind: FrameKind::Handshake,
            link: link as u8,
            conn: h.conn,
            seq: 0,
            ack: None,
            ts: 0,
            payload_len: HANDSHAKE_LEN as u16,
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        let mut f = repr.emit(&mut buf);
        retry.emit(f.payload_mut());
        f.fill_checksums();
        self.retries.push_back((from, link, buf));
        self.retries_sent += 1;
    }

    /// Keep the accepted connections still in their handshake under
    /// [`HANDSHAKES_ACCEPTED_MAX`], the newest aside: the oldest goes.
    fn make_room_for_a_handshake(&mut self) {
        let sessions = &self.sessions;
        self.handshaking.retain(|l| sessions.get(l).is_some_and(|s| s.conn().state() == crate::State::Handshaking));
        while self.handshaking.len() >= HANDSHAKES_ACCEPTED_MAX {
            if let Some(oldest) = self.handshaking.pop_front() {
                self.remove(oldest);
            }
        }
    }

    /// Submit an operation on connection `local` with `go`, keeping what `keep` makes of its
    /// id to hand back when it completes. `Err(OpError::Closed)` when there is no such
    /// connection or it ended.
    pub fn submit(
        &mut self,
        local: u32,
        keep: impl FnOnce(OpId) -> P,
        go: impl FnOnce(&mut Connection) -> Result<OpId, OpError>,
    ) -> Result<OpId, OpError> {
        self.sessions.get_mut(&local).ok_or(OpError::Closed)?.submit(keep, go)
    }

    /// Hand over what the connections did (see [`Happened`]) to `on`, with each connection's
    /// local id and peer. With `hold`, a connection that delivered a message or notification,
    /// or where a signal landed ([`Connection::take_signalled`]), holds its answers until then,
    /// or until [`Endpoint::release_holds`]. Says whether some connection did either.
    pub fn poll(&mut self, hold: Option<Time>, mut on: impl FnMut(u32, u32, Happened<P>)) -> Polled {
        let mut polled = Polled::default();
        for (&local, s) in self.sessions.iter_mut() {
            let mut handed = false;
            while let Some(e) = s.conn_mut().poll_event() {
                let peer = s.peer();
                match e {
                    Event::Connected { peer } => {
                        s.set_connected(peer);
                        on(local, peer, Happened::Connected { accepted: s.accepted() });
                    }
                    Event::Completed { op, result } => {
                        if let Some(p) = s.complete(op) {
                            on(local, peer, Happened::Completed { op: p, result });
                        }
                    }
                    e @ (Event::Message { .. } | Event::Notification { .. }) => {
                        handed = true;
                        if let Some(e) = match s.delivery_mut() {
                            Some(d) => d.keep(e),
                            None => Some(e),
                        } {
                            on(local, peer, Happened::Delivered(e));
                        }
                    }
                    Event::LinkDown(l) => on(local, peer, Happened::LinkDown(l)),
                    Event::LinkUp(l) => on(local, peer, Happened::LinkUp(l)),
                    Event::PathCut { frame_len, agreed } => on(local, peer, Happened::PathCut { frame_len, agreed }),
                    Event::Closed(why) => {
                        for p in s.close() {
                            on(local, peer, Happened::Completed { op: p, result: Err(OpError::Closed) });
                        }
                        on(local, peer, Happened::Closed(why));
                    }
                }
            }
            // The connection lowers its room as frames arrive by what they may hand over; what
            // they did (a refused write asks for no notification) is known from the queues.
            // Told after every look, a room lowered for nothing never holds a sender back.
            s.refresh_room();
            let signalled = s.conn_mut().take_signalled();
            polled.delivered |= handed;
            polled.signalled |= signalled;
            if handed || signalled {
                if let Some(t) = hold {
                    s.hold(t);
                    self.holding = true;
                }
            }
        }
        polled
    }

    /// End every hold (the driver's next round: the reply did not come first). True when
    /// some connection held its answers.
    pub fn release_holds(&mut self) -> bool {
        if !std::mem::take(&mut self.holding) {
            return false;
        }
        for s in self.sessions.values_mut().filter(|s| s.is_holding()) {
            s.hold(0);
        }
        true
    }

    /// Fire every timer due at `now`. Returns whether one fired, and the earliest deadline
    /// of the connections whose timers did not.
    pub fn handle_timeouts(&mut self, now: Time, target: &mut dyn Target) -> (bool, Option<Time>) {
        let mut fired = false;
        let mut due = None;
        for s in self.sessions.values_mut() {
            match s.conn().poll_timeout() {
                Some(t) if t <= now => {
                    s.conn_mut().handle_timeout(now, target);
                    fired = true;
                }
                t => due = earliest(due, t),
            }
        }
        (fired, due)
    }

    /// The earliest deadline of any connection.
    pub fn next_timeout(&self) -> Option<Time> {
        self.sessions.values().filter_map(|s| s.conn().poll_timeout()).min()
    }

    /// The connection `local`.
    pub fn get(&self, local: u32) -> Option<&Session<A, P>> {
        self.sessions.get(&local)
    }

    /// The connection `local`, to change.
    pub fn get_mut(&mut self, local: u32) -> Option<&mut Session<A, P>> {
        self.sessions.get_mut(&local)
    }

    /// Forget connection `local` (a first frame from its peer would open a new one).
    pub fn remove(&mut self, local: u32) -> Option<Session<A, P>> {
        self.accepted.retain(|_, l| *l != local);
        self.sessions.remove(&local)
    }

    /// Forget that connection `local` was opened by a peer's first frame: a repeated first
    /// frame now opens a new one (for a connection that closed).
    pub fn forget_accepted(&mut self, local: u32) {
        self.accepted.retain(|_, l| *l != local);
    }

    /// Every connection.
    pub fn sessions(&self) -> impl Iterator<Item = &Session<A, P>> {
        self.sessions.values()
    }

    /// Every connection, to change.
    pub fn sessions_mut(&mut self) -> impl Iterator<Item = &mut Session<A, P>> {
        self.sessions.values_mut()
    }

    /// Every connection with its local id, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut Session<A, P>)> {
        self.sessions.iter_mut().map(|(&l, s)| (l, s))
    }

    /// Connections open.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// No connection is open.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}
