//! The connection state machine.

use std::collections::{BTreeMap, VecDeque};

use rackwire_wire::auth;
use rackwire_wire::frame::PAYLOAD_LEN_MAX;
use rackwire_wire::payload::{CLOSE_LEN, HANDSHAKE_LEN, PROBE_LEN, SEG_NOTIFY};
use rackwire_wire::{
    AckRepr, CloseRepr, Frame, FrameKind, FrameRepr, HandshakeRepr, HandshakeStep, ProbeRepr, RangesRepr, SegKind,
    SegmentRepr, HEADER_LEN, SEGMENTS_PER_FRAME_MAX, SEGMENT_LEN, SEGMENT_SHORT_LEN,
};

use bytes::Bytes;

use crate::chunk::{DataPayload, Piece, ANSWERS_PACKED_MAX, CHAINED_SEGMENT_MAX};
use crate::link::Link;
use crate::ops::{Body, Incomings, Ops, WriteOutcome};
use crate::recv::{Arrival, RecvState};
use crate::sent::SentRing;
use crate::stats::ConnStats;
use crate::{
    AtomicOp, Completion, Config, OpError, OpFlags, OpId, Refusal, RegionRef, Target, Time, MESSAGE_BYTES_MAX,
    OP_BYTES_MAX,
};

const LABEL_ACCEPTOR: &str = "rackwire-edge-acceptor";
const LABEL_INITIATOR: &str = "rackwire-edge-initiator";
/// Close reason codes on the wire.
const CLOSE_NORMAL: u8 = 0;
const CLOSE_AUTH: u8 = 1;

/// Where a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Authenticating.
    Handshaking,
    /// Carrying operations.
    Established,
    /// Over.
    Closed(CloseReason),
}

/// Why a connection closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// Closed here.
    Local,
    /// The peer closed (with its code).
    Peer(u8),
    /// Nothing heard from the peer on any link for the idle timeout.
    IdleTimeout,
    /// The peer could not prove it holds the secret (or we could not).
    AuthFailed,
}

/// Something the caller should know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The handshake completed; operations flow.
    Connected {
        /// The peer's node id.
        peer: u32,
    },
    /// An operation completed, once.
    Completed {
        /// Its id.
        op: OpId,
        /// Its outcome.
        result: Result<Completion, OpError>,
    },
    /// A two-sided message arrived (in the order sent).
    Message {
        /// Payload.
        data: Vec<u8>,
    },
    /// An operation with a notification placed its data here.
    Notification {
        /// Region.
        region: u32,
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Immediate.
        imm: u64,
    },
    /// A link stopped answering; its traffic moved to the others.
    LinkDown(usize),
    /// A link answers again.
    LinkUp(usize),
    /// The connection ended.
    Closed(CloseReason),
}

/// A frame to send: `len` bytes at the start of the caller's buffer, on `link`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Link index.
    pub link: usize,
    /// Frame length.
    pub len: usize,
}

/// A frame to send in two parts: `head_len` bytes at the start of the caller's buffer, then
/// `body` (the operation's own bytes, not copied), as one datagram on `link`.
#[derive(Clone, Debug)]
pub struct SplitTransmit {
    /// Link index.
    pub link: usize,
    /// Length of the part in the caller's buffer.
    pub head_len: usize,
    /// The rest of the frame, if any.
    pub body: Option<Bytes>,
}

impl SplitTransmit {
    /// The whole frame's length.
    pub fn len(&self) -> usize {
        self.head_len + self.body.as_ref().map_or(0, Bytes::len)
    }

    /// Whether the frame is empty (never, for a frame from a connection).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Initiator,
    Acceptor,
}

#[derive(Debug)]
struct Sent {
    payload: DataPayload,
    /// The link it last went on, while it counts against that link's window.
    counted_on: Option<usize>,
    link: usize,
    sent_at: Time,
    retransmitted: bool,
}

/// One reliable, authenticated connection over several links. See the crate documentation
/// for how to drive it.
pub struct Connection {
    cfg: Config,
    role: Role,
    state: State,
    me: u32,
    peer: u32,
    secret: Vec<u8>,
    local_conn: u32,
    peer_conn: u32,
    my_nonce: [u8; 32],
    their_nonce: [u8; 32],
    hs_send: Option<HandshakeStep>,
    hs_last: Option<Time>,
    hs_rr: usize,
    links: Vec<Link>,
    rr: usize,
    /// Segment header and body bytes per data frame (the smallest link's).
    payload_max: usize,
    /// The windows as configured (in frames of this end's own size): the agreed frame size
    /// scales them (see [`Connection::agree_frame_size`]).
    own_windows: Windows,
    /// What the application's queues take (see [`Connection::set_delivery_room`]).
    room: Room,
    next_seq: u64,
    inflight: SentRing<Sent>,
    /// Latest send time of a frame known delivered, on any link (first transmissions only).
    rack_time: Time,
    retx: VecDeque<u64>,
    /// Frames declared lost: the link whose window they cut, and the cut's episode, until the
    /// peer reports them arrived twice (at most [`RETX_WATCH_MAX`], oldest forgotten first).
    retx_watch: BTreeMap<u64, (usize, u32)>,
    /// Frames arrived since losses were last looked for.
    losses_due: bool,
    recv: RecvState,
    ops: Ops,
    /// Segments the target owes the peer: answers, and read data.
    responses: VecDeque<(SegmentRepr, Option<Bytes>)>,
    /// Until when bodiless answers wait for a data frame to ride in rather than go alone.
    answers_held_until: Time,
    incoming: Incomings,
    events: VecDeque<Event>,
    probe_replies: VecDeque<(usize, u32, u32)>,
    close_send: Option<u8>,
    last_heard: Time,
    probe_token: u32,
    stats: ConnStats,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("me", &self.me)
            .field("peer", &self.peer)
            .field("state", &self.state)
            .field("inflight", &self.inflight.len())
            .finish_non_exhaustive()
    }
}

/// Body bytes a frame's last segment keeps room for at least when answers ride ahead of it.
const ANSWER_RIDE_BODY_MIN: usize = 64;

/// The most frames declared lost that a connection remembers, waiting for a report that they
/// arrived after all.
const RETX_WATCH_MAX: usize = 1024;

/// The payload of this end's largest frame: its smallest link's, since any frame may be sent
/// again on any link.
fn own_payload_max(cfg: &Config) -> usize {
    (0..cfg.links).map(|l| cfg.payload_max(l)).min().unwrap_or(0).min(PAYLOAD_LEN_MAX)
}

/// What a segment hands the application once it acts: message bytes, and notifications.
fn handed_over((s, body): &(SegmentRepr, &[u8])) -> (usize, usize) {
    let bytes = if s.kind == SegKind::Msg { body.len() } else { 0 };
    let notifies = matches!(s.kind, SegKind::Write | SegKind::ReadReq) && s.flags & SEG_NOTIFY != 0;
    (bytes, notifies as usize)
}

/// Room left in the application's queues (see [`Connection::set_delivery_room`]).
#[derive(Clone, Copy, Debug)]
struct Room {
    msg_bytes: usize,
    notes: usize,
}

/// A connection's window settings, in frames (see [`Config`]).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Windows {
    link_min: usize,
    link_initial: usize,
    link_max: usize,
    ack_every: u32,
}

impl Windows {
    fn of(cfg: &Config) -> Self {
        Windows {
            link_min: cfg.link_window_min,
            link_initial: cfg.link_window_initial,
            link_max: cfg.link_window_max,
            ack_every: cfg.ack_every_frames,
        }
    }

    /// Each window `scale` times larger (never smaller), within `cap` frames unless it was
    /// larger already; the order min <= initial <= max holds, as scaling keeps it.
    fn scaled(self, scale: f64, cap: usize) -> Self {
        let grow = |w: usize| ((w as f64 * scale) as usize).min(cap).max(w);
        Windows {
            link_min: grow(self.link_min),
            link_initial: grow(self.link_initial),
            link_max: grow(self.link_max),
            ack_every: grow(self.ack_every as usize) as u32,
        }
    }

    fn apply(self, cfg: &mut Config) {
        cfg.link_window_min = self.link_min;
        cfg.link_window_initial = self.link_initial;
        cfg.link_window_max = self.link_max;
        cfg.ack_every_frames = self.ack_every;
    }
}

/// Frames in flight from which [`Connection::worth_gathering`] holds small operations.
pub const GATHER_IN_FLIGHT_MIN: usize = 2;

/// Whether a segment may have another chained behind it in its frame: it carries its whole
/// operation (or is an answer), and is small enough to be copied.
fn chainable(p: &Piece) -> bool {
    let body = p.1.as_ref().map_or(0, Bytes::len);
    p.0.frag_off == 0 && p.0.whole_body_len() == Some(body) && piece_len(p) <= CHAINED_SEGMENT_MAX
}

/// Bytes a segment and its body take in a frame.
fn piece_len((s, body): &Piece) -> usize {
    s.header_len() + body.as_ref().map_or(0, Bytes::len)
}

/// Widen a 32-bit sequence number to the 64-bit one nearest `near`.
fn unwrap_seq(near: u64, wire: u32) -> u64 {
    let base = near & !0xffff_ffff;
    let cands =
        [base.wrapping_sub(1 << 32) | wire as u64, base | wire as u64, base.wrapping_add(1 << 32) | wire as u64];
    cands.into_iter().min_by_key(|c| c.abs_diff(near)).expect("three candidates")
}

fn context(initiator: u32, acceptor: u32) -> Vec<u8> {
    format!("rackwire-edge {initiator}->{acceptor}").into_bytes()
}

impl Connection {
    #[allow(clippy::too_many_arguments)]
    fn new(
        cfg: Config,
        role: Role,
        me: u32,
        peer: u32,
        secret: &[u8],
        nonce: [u8; 32],
        local_conn: u32,
        now: Time,
    ) -> Self {
        cfg.validate().expect("invalid connection config");
        let links = (0..cfg.links).map(|_| Link::new(&cfg, now)).collect();
        let payload_max = own_payload_max(&cfg);
        let stats = ConnStats { links: vec![Default::default(); cfg.links], ..Default::default() };
        Connection {
            role,
            state: State::Handshaking,
            me,
            peer,
            secret: secret.to_vec(),
            local_conn,
            peer_conn: 0,
            my_nonce: nonce,
            their_nonce: [0; 32],
            hs_send: (role == Role::Initiator).then_some(HandshakeStep::Hello),
            hs_last: None,
            hs_rr: 0,
            links,
            rr: 0,
            payload_max,
            own_windows: Windows::of(&cfg),
            room: Room { msg_bytes: usize::MAX, notes: usize::MAX },
            next_seq: 0,
            inflight: SentRing::default(),
            rack_time: 0,
            retx: VecDeque::new(),
            retx_watch: BTreeMap::new(),
            losses_due: false,
            recv: RecvState::default(),
            ops: Ops::default(),
            responses: VecDeque::new(),
            answers_held_until: 0,
            incoming: Incomings::default(),
            events: VecDeque::new(),
            probe_replies: VecDeque::new(),
            close_send: None,
            last_heard: now,
            probe_token: 0,
            stats,
            cfg,
        }
    }

    /// Start a connection from node `me` to node `peer`. `nonce` must be fresh random bytes;
    /// `local_conn` is this side's connection id (nonzero), which the peer puts in its frames.
    /// Panics if `cfg` does not validate (check it first with [`Config::validate`]).
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        cfg: Config,
        me: u32,
        peer: u32,
        secret: &[u8],
        nonce: [u8; 32],
        local_conn: u32,
        now: Time,
    ) -> Self {
        Self::new(cfg, Role::Initiator, me, peer, secret, nonce, local_conn, now)
    }

    /// Wait for a connection to node `me` from any node holding the secret.
    pub fn accept(cfg: Config, me: u32, secret: &[u8], nonce: [u8; 32], local_conn: u32, now: Time) -> Self {
        Self::new(cfg, Role::Acceptor, me, 0, secret, nonce, local_conn, now)
    }

    /// Where it is.
    pub fn state(&self) -> State {
        self.state
    }

    /// The peer's node id (0 until an acceptor heard from it).
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// Counters.
    pub fn stats(&self) -> ConnStats {
        let mut s = self.stats.clone();
        for (i, l) in self.links.iter().enumerate() {
            s.links[i] = l.stats;
            s.links[i].window = l.window() as u64;
        }
        s
    }

    /// Whether link `l` is in use.
    pub fn link_up(&self, l: usize) -> bool {
        self.links.get(l).is_some_and(|k| k.up)
    }

    /// Frames in flight.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Whether the operation just submitted is better sent a little later, with others: it is
    /// small enough to share a frame, [`GATHER_IN_FLIGHT_MIN`] frames are already in flight
    /// (the peer is busy with them; operations submitted meanwhile can go up to
    /// [`SEGMENTS_PER_FRAME_MAX`] to a frame), and fewer than a frame's worth wait. A lone
    /// operation is never worth holding, nor are more than a frame's worth held: whatever a
    /// caller does next, at most [`SEGMENTS_PER_FRAME_MAX`] less one wait for it.
    pub fn worth_gathering(&self) -> bool {
        self.inflight.len() >= GATHER_IN_FLIGHT_MIN
            && self.ops.queued() < SEGMENTS_PER_FRAME_MAX
            && self.ops.last_is_small()
    }

    /// True when nothing is queued, in flight, or owed to the peer.
    pub fn is_idle(&self) -> bool {
        self.ops.is_empty() && self.inflight.is_empty() && self.responses.is_empty() && self.retx.is_empty()
    }

    // -----------------------------------------------------------------------------------------
    // Submitting operations.

    fn submit(&mut self, body: Body, flags: OpFlags, now: Time) -> Result<OpId, OpError> {
        match self.state {
            State::Closed(_) => return Err(OpError::Closed),
            State::Handshaking | State::Established => {}
        }
        self.ops.submit(body, flags, now, self.cfg.op_timeout_us)
    }

    /// Write `data` at `offset` of the peer's region. The data is copied.
    pub fn write(
        &mut self,
        now: Time,
        target: RegionRef,
        offset: u64,
        data: &[u8],
        flags: OpFlags,
    ) -> Result<OpId, OpError> {
        self.write_bytes(now, target, offset, Bytes::copy_from_slice(data), flags)
    }

    /// Write `data` at `offset` of the peer's region, without copying it: its frames refer to
    /// it until they are acknowledged.
    pub fn write_bytes(
        &mut self,
        now: Time,
        target: RegionRef,
        offset: u64,
        data: Bytes,
        flags: OpFlags,
    ) -> Result<OpId, OpError> {
        if data.len() as u64 > OP_BYTES_MAX {
            return Err(OpError::Limit);
        }
        self.submit(Body::Write { target, offset, data }, flags, now)
    }

    /// Read `len` bytes at `offset` of the peer's region.
    pub fn read(
        &mut self,
        now: Time,
        target: RegionRef,
        offset: u64,
        len: u64,
        flags: OpFlags,
    ) -> Result<OpId, OpError> {
        if len > OP_BYTES_MAX {
            return Err(OpError::Limit);
        }
        self.submit(Body::Read { target, offset, len, got: 0, buf: Vec::new() }, flags, now)
    }

    /// A 64-bit atomic at `offset` (8-byte aligned) of the peer's region.
    pub fn atomic(
        &mut self,
        now: Time,
        target: RegionRef,
        offset: u64,
        op: AtomicOp,
        flags: OpFlags,
    ) -> Result<OpId, OpError> {
        self.submit(Body::Atomic { target, offset, op }, flags, now)
    }

    /// Send a message of at most [`MESSAGE_BYTES_MAX`] bytes; delivered in order. Fences in
    /// `flags` apply; a notification does not (the message itself is the notice).
    pub fn send(&mut self, now: Time, data: &[u8], flags: OpFlags) -> Result<OpId, OpError> {
        if data.len() > MESSAGE_BYTES_MAX {
            return Err(OpError::Limit);
        }
        self.submit(Body::Msg { data: Bytes::copy_from_slice(data), seq: 0 }, OpFlags { notify: None, ..flags }, now)
    }

    /// Close: operations in progress fail with [`OpError::Closed`]; the peer is told.
    pub fn close(&mut self, _now: Time) {
        if !matches!(self.state, State::Closed(_)) {
            self.close_send = Some(CLOSE_NORMAL);
            self.shut(CloseReason::Local);
        }
    }

    fn shut(&mut self, why: CloseReason) {
        if matches!(self.state, State::Closed(_)) {
            return;
        }
        self.state = State::Closed(why);
        for op in self.ops.drain() {
            self.events.push_back(Event::Completed { op, result: Err(OpError::Closed) });
        }
        self.inflight.clear();
        for l in &mut self.links {
            l.sent_order.clear();
        }
        self.retx.clear();
        self.responses.clear();
        self.events.push_back(Event::Closed(why));
    }

    /// Whether [`Connection::poll_event`] has something.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // -----------------------------------------------------------------------------------------
    // Input.

    /// A frame arrived on `link`. Damaged, malformed or foreign frames are counted and dropped.
    pub fn handle_frame(&mut self, now: Time, link: usize, bytes: &[u8], target: &mut dyn Target) {
        let Ok(frame) = Frame::new_checked(bytes) else {
            self.stats.malformed += 1;
            return;
        };
        let Ok(repr) = FrameRepr::parse(&frame) else {
            self.stats.malformed += 1;
            return;
        };
        if link >= self.links.len() || matches!(self.state, State::Closed(_)) {
            self.stats.malformed += 1;
            return;
        }
        let first_hello = repr.kind == FrameKind::Handshake && repr.conn == 0;
        if repr.conn != self.local_conn && !first_hello {
            self.stats.malformed += 1;
            return;
        }
        let len = frame.total_len() as u64;
        self.stats.frames_received += 1;
        self.stats.bytes_received += len;
        let l = &mut self.links[link];
        l.stats.frames_received += 1;
        l.stats.bytes_received += len;
        l.last_heard = now;
        self.last_heard = now;
        let established = self.state == State::Established;
        if let (Some(ack), true) = (repr.ack, established) {
            let ack = unwrap_seq(self.next_seq, ack);
            self.on_cumulative_ack(now, ack);
        }
        let payload = frame.payload();
        match repr.kind {
            FrameKind::Handshake => match HandshakeRepr::parse(payload) {
                Ok(h) => self.on_handshake(now, h),
                Err(_) => self.stats.malformed += 1,
            },
            FrameKind::Data if established => self.on_data(now, link, &repr, payload, target),
            FrameKind::Ack if established => match AckRepr::parse(payload) {
                Ok(a) => {
                    for (s, e) in self.widen(&a.ranges) {
                        self.on_delivered_range(now, s, e);
                    }
                    for (s, e) in self.widen(&a.dups) {
                        self.on_arrived_twice(s, e);
                    }
                }
                Err(_) => self.stats.malformed += 1,
            },
            FrameKind::Nack if established => match RangesRepr::parse(payload) {
                Ok(n) => {
                    for (s, e) in self.widen(&n.ranges) {
                        self.on_reported_missing(now, s, e);
                    }
                }
                Err(_) => self.stats.malformed += 1,
            },
            FrameKind::Probe => match ProbeRepr::parse(payload) {
                Ok(p) if !p.reply => self.probe_replies.push_back((link, p.token, repr.ts)),
                Ok(p) => self.on_probe_reply(now, link, p),
                Err(_) => self.stats.malformed += 1,
            },
            FrameKind::Close => match CloseRepr::parse(payload) {
                Ok(c) => self.shut(CloseReason::Peer(c.reason)),
                Err(_) => self.stats.malformed += 1,
            },
            FrameKind::Data | FrameKind::Ack | FrameKind::Nack | FrameKind::Unknown(_) => {}
        }
        // Losses are looked for once the frames that arrived together are all in (at the next
        // timeout, which is due at once): acknowledgements on one link read before those on
        // another must not make the other's frames look lost. Nothing in flight, nothing to
        // lose.
        self.losses_due = !self.inflight.is_empty();
    }

    /// Ranges of our sequence numbers from the wire, widened to 64 bits.
    fn widen(&self, ranges: &[(u32, u32)]) -> Vec<(u64, u64)> {
        ranges
            .iter()
            .map(|&(s, e)| {
                let s64 = unwrap_seq(self.next_seq, s);
                (s64, s64 + e.wrapping_sub(s) as u64)
            })
            .collect()
    }

    fn on_handshake(&mut self, now: Time, h: HandshakeRepr) {
        match (self.role, h.step) {
            (Role::Acceptor, HandshakeStep::Hello) => {
                if h.to != self.me || (self.state == State::Established && h.from != self.peer) {
                    return;
                }
                if self.state == State::Established {
                    return;
                }
                self.peer = h.from;
                self.peer_conn = h.conn;
                self.their_nonce = h.nonce;
                self.agree_frame_size(h.mtu);
                self.handshake_next(HandshakeStep::Challenge);
            }
            (Role::Acceptor, HandshakeStep::Proof) => {
                if h.from != self.peer || self.hs_send.is_none() && self.state != State::Established {
                    return;
                }
                if self.state == State::Established {
                    self.handshake_next(HandshakeStep::Done);
                    return;
                }
                let ctx = context(self.peer, self.me);
                if auth::verify(&self.secret, LABEL_INITIATOR, &self.my_nonce, &ctx, &h.proof) {
                    self.established(now);
                    self.handshake_next(HandshakeStep::Done);
                } else {
                    self.close_send = Some(CLOSE_AUTH);
                    self.shut(CloseReason::AuthFailed);
                }
            }
            (Role::Initiator, HandshakeStep::Challenge) => {
                if h.from != self.peer || h.to != self.me {
                    return;
                }
                let ctx = context(self.me, self.peer);
                if !auth::verify(&self.secret, LABEL_ACCEPTOR, &self.my_nonce, &ctx, &h.proof) {
                    self.close_send = Some(CLOSE_AUTH);
                    self.shut(CloseReason::AuthFailed);
                    return;
                }
                self.peer_conn = h.conn;
                self.their_nonce = h.nonce;
                if self.state != State::Established {
                    self.agree_frame_size(h.mtu);
                    self.handshake_next(HandshakeStep::Proof);
                }
            }
            (Role::Initiator, HandshakeStep::Done)
                if h.from == self.peer && self.state == State::Handshaking && self.peer_conn != 0 =>
            {
                self.established(now);
            }
            _ => {}
        }
    }

    /// Frames both ends can take: the smaller of this end's largest and the peer's (the parser
    /// refuses announcements under [`rackwire_wire::payload::FRAME_LEN_MIN`]). Data frames go
    /// out only once established, so every one is cut to the agreed size.
    fn agree_frame_size(&mut self, peer_mtu: u16) {
        let own = own_payload_max(&self.cfg);
        self.payload_max = own.min((peer_mtu as usize).saturating_sub(HEADER_LEN));
        // Windows count frames, and were set for frames of this end's own size: smaller agreed
        // frames carry less each, so proportionally more of them keep as many bytes in flight
        // (within the connection's window). Scaled from the configured values, so a repeated
        // handshake step scales once; no data has moved yet.
        let scale = (own + HEADER_LEN) as f64 / (self.payload_max + HEADER_LEN) as f64;
        self.own_windows.scaled(scale, self.cfg.window_frames_max).apply(&mut self.cfg);
        for l in &mut self.links {
            l.reset_window(&self.cfg);
        }
    }

    /// The largest frame this connection sends (after the handshake: what both ends take).
    pub fn frame_max(&self) -> usize {
        self.payload_max + HEADER_LEN
    }

    /// The next handshake frame to send: at once (the retry timer is for repeating a step).
    fn handshake_next(&mut self, step: HandshakeStep) {
        self.hs_send = Some(step);
        self.hs_last = None;
    }

    fn established(&mut self, now: Time) {
        self.state = State::Established;
        self.hs_send = None;
        for l in &mut self.links {
            l.last_heard = now;
        }
        self.events.push_back(Event::Connected { peer: self.peer });
    }

    fn on_data(&mut self, now: Time, link: usize, repr: &FrameRepr, payload: &[u8], target: &mut dyn Target) {
        let seq = unwrap_seq(self.recv.next, repr.seq);
        // A sender keeps every frame it sends within SEND_SPAN_MAX of its oldest one in flight,
        // which is at or below the first frame missing here: a frame further ahead is damaged
        // or forged (and would make the gap to it, which is tracked, unbounded).
        if seq >= self.recv.next + crate::SEND_SPAN_MAX {
            self.stats.malformed += 1;
            return;
        }
        // The whole chain is checked before any of it acts: whole operations and answers
        // chained ahead, each with its body, then the frame's last segment with the rest. (The
        // segments ahead, usually none, are read again to act on them.) The same pass adds up
        // what the frame hands the application.
        let mut last = None;
        let mut n = 0;
        let (mut bytes, mut notes) = (0, 0);
        for seg in rackwire_wire::segments(payload) {
            match seg {
                Ok(x) => {
                    let (b, k) = handed_over(&x);
                    bytes += b;
                    notes += k;
                    n += last.replace(x).is_some() as usize;
                }
                Err(_) => {
                    self.stats.malformed += 1;
                    return;
                }
            }
        }
        let Some((s, body)) = last else {
            self.stats.malformed += 1;
            return;
        };
        let duplicate = self.recv.is_duplicate(seq);
        // What the frame hands the application (message bytes, notifications) must fit in what
        // its queues have room for; if not, the frame is dropped unacknowledged and sent again
        // later, as the receiver reads (see [`Connection::set_delivery_room`]).
        if !duplicate {
            if bytes > self.room.msg_bytes || notes > self.room.notes {
                self.stats.receiver_full += 1;
                return;
            }
            self.room.msg_bytes -= bytes;
            self.room.notes -= notes;
        }
        // A write's later fragment ahead of its first cannot be placed yet: it is kept until
        // the first arrives, or, when the stash is full, dropped unacknowledged (sent again,
        // with any answers that rode along).
        let early = s.kind == SegKind::WriteMore && !duplicate && self.incoming.placement(s.op).is_none();
        if early && !self.incoming.stash(s.op, seq, s.frag_off, body) {
            self.stats.stash_full += 1;
            return;
        }
        match self.recv.on_data(seq, repr.ts, link as u8, now, &self.cfg) {
            Arrival::Duplicate => {
                self.stats.duplicates += 1;
                return;
            }
            Arrival::New { beyond_gap } => {
                if beyond_gap {
                    self.stats.out_of_order += 1;
                }
            }
        }
        for (a, a_body) in rackwire_wire::segments(payload).take(n).flatten() {
            self.on_segment(&a, a_body, target);
        }
        if early {
            self.stats.stashed += 1;
        } else {
            self.on_segment(&s, body, target);
        }
        let orphans = self.incoming.drop_orphans(self.recv.next);
        self.stats.malformed += orphans as u64;
    }

    /// Act on one segment of a new data frame.
    fn on_segment(&mut self, s: &SegmentRepr, body: &[u8], target: &mut dyn Target) {
        let peer = self.peer;
        match s.kind {
            SegKind::Write
                if s.frag_off == 0 && body.len() as u64 == u64::from(s.op_len) && self.incoming.no_writes() =>
            {
                // A whole write, nothing else in progress: placed and answered at once, without
                // the bookkeeping of a write that comes in pieces.
                let r = target.write(peer, s.region, s.key, s.offset, s.op_len as u64, s.offset, body);
                let notify = (r.is_ok() && s.flags & SEG_NOTIFY != 0).then_some((
                    s.region,
                    s.offset,
                    u64::from(s.op_len),
                    s.imm,
                ));
                self.write_finished(s.op, r.err(), notify);
            }
            SegKind::Write => {
                self.incoming.begin_write(s);
                let r =
                    target.write(peer, s.region, s.key, s.offset, s.op_len as u64, s.offset + s.frag_off as u64, body);
                self.write_done(s.op, body.len(), r);
                for (frag_off, data) in self.incoming.unstash(s.op) {
                    self.write_more(s.op, frag_off, &data, target);
                }
            }
            SegKind::WriteMore => self.write_more(s.op, s.frag_off, body, target),
            SegKind::ReadReq => {
                let mut data = vec![0u8; s.op_len as usize];
                match target.read(peer, s.region, s.key, s.offset, &mut data) {
                    Ok(()) => {
                        let data = Bytes::from(data);
                        let mut at = 0;
                        while at < data.len() {
                            let end = (at + self.payload_max - SEGMENT_SHORT_LEN).min(data.len());
                            let part = Some(data.slice(at..end));
                            self.respond(SegKind::ReadData, s.op, 0, at as u32, s.op_len, 0, part);
                            at = end;
                        }
                        if data.is_empty() {
                            self.respond(SegKind::ReadData, s.op, 0, 0, 0, 0, None);
                        }
                        if s.flags & SEG_NOTIFY != 0 {
                            self.events.push_back(Event::Notification {
                                region: s.region,
                                offset: s.offset,
                                len: s.op_len as u64,
                                imm: s.imm,
                            });
                        }
                    }
                    Err(r) => self.answer(s.op, Some(r), 0),
                }
            }
            SegKind::Cas | SegKind::Fadd => {
                let op = if s.kind == SegKind::Cas {
                    let new = body.get(..8).map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
                    match new {
                        Some(new) => AtomicOp::CompareSwap { expected: s.imm, new },
                        None => {
                            self.stats.malformed += 1;
                            return;
                        }
                    }
                } else {
                    AtomicOp::FetchAdd(s.imm)
                };
                match target.atomic(peer, s.region, s.key, s.offset, op) {
                    Ok(old) => self.answer(s.op, None, old),
                    Err(r) => self.answer(s.op, Some(r), 0),
                }
            }
            SegKind::Msg => match self.incoming.msg_fragment(s, body) {
                Ok(done) => {
                    for (op, data) in done {
                        self.answer(op, None, 0);
                        self.events.push_back(Event::Message { data });
                    }
                }
                Err((op, r)) => self.answer(op, Some(r), 0),
            },
            SegKind::ReadData => {
                if let Some(result) = self.ops.on_read_data(s.op, s.frag_off as u64, body) {
                    self.completed(s.op, result);
                }
            }
            SegKind::Done => {
                if let Some(result) = self.ops.on_done(s.op, s.imm) {
                    self.completed(s.op, result);
                }
            }
            SegKind::Refused => {
                if let Some(result) = self.ops.on_refused(s.op, Refusal::from_code(s.reason)) {
                    self.stats.refused += 1;
                    self.completed(s.op, result);
                }
            }
            SegKind::Unknown(_) => self.stats.malformed += 1,
        }
    }

    /// Place a write's later fragment where its first fragment said, after the target's check.
    fn write_more(&mut self, op: OpId, frag_off: u32, body: &[u8], target: &mut dyn Target) {
        let Some(at) = self.incoming.placement(op) else { return };
        let r = at.and_then(|p| {
            if frag_off as u64 + body.len() as u64 > p.op_len {
                return Err(Refusal::OutOfBounds);
            }
            target.write(self.peer, p.region, p.key, p.offset, p.op_len, p.offset + frag_off as u64, body)
        });
        self.write_done(op, body.len(), r);
    }

    /// Account a placed (or refused) write fragment; answer and notify once the write is whole.
    fn write_done(&mut self, op: OpId, len: usize, r: Result<(), Refusal>) {
        match self.incoming.write_fragment(op, len as u64, r) {
            WriteOutcome::Partial => {}
            WriteOutcome::Complete { refused, notify } => self.write_finished(op, refused, notify),
        }
    }

    /// A whole write is placed (or refused): answer, and notify if asked.
    fn write_finished(&mut self, op: OpId, refused: Option<Refusal>, notify: Option<(u32, u64, u64, u64)>) {
        self.answer(op, refused, 0);
        if let Some((region, offset, len, imm)) = notify {
            self.events.push_back(Event::Notification { region, offset, len, imm });
        }
    }

    fn completed(&mut self, op: OpId, result: Result<Completion, OpError>) {
        self.events.push_back(Event::Completed { op, result });
    }

    /// Queue the target's answer to an operation: `Done` (with an atomic's old value in `imm`)
    /// or `Refused`.
    fn answer(&mut self, op: OpId, refused: Option<Refusal>, value: u64) {
        match refused {
            None => self.respond(SegKind::Done, op, 0, 0, 0, value, None),
            Some(r) => {
                self.stats.refused_here += 1;
                self.respond(SegKind::Refused, op, r.code(), 0, 0, 0, None);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn respond(
        &mut self,
        kind: SegKind,
        op: OpId,
        reason: u8,
        frag_off: u32,
        op_len: u32,
        imm: u64,
        body: Option<Bytes>,
    ) {
        let seg = SegmentRepr { op, kind, flags: 0, reason, region: 0, frag_off, offset: 0, op_len, key: 0, imm };
        self.responses.push_back((seg, body));
    }

    fn on_cumulative_ack(&mut self, now: Time, ack: u64) {
        let Some(first) = self.inflight.first_seq() else { return };
        if ack > first {
            self.on_delivered_range(now, first, ack);
        }
    }

    fn on_delivered_range(&mut self, now: Time, start: u64, end: u64) {
        if end <= start || end > self.next_seq {
            return;
        }
        for seq in start.max(self.inflight.first_seq().unwrap_or(end))..end {
            let Some(s) = self.inflight.remove(seq) else { continue };
            if let Some(l) = s.counted_on {
                let link = &mut self.links[l];
                link.inflight -= 1;
                link.on_ack(&self.cfg);
            } else if !s.retransmitted {
                // Declared lost, yet the original arrived before any copy was sent.
                self.proved_spurious(seq);
            }
            if !s.retransmitted {
                let l = &mut self.links[s.link];
                l.rtt_sample(now.saturating_sub(s.sent_at));
                l.rack_time = l.rack_time.max(s.sent_at);
                self.rack_time = self.rack_time.max(s.sent_at);
            }
        }
        self.trim_sent_order();
    }

    /// The peer got these frames twice: those declared lost were not, so their links may undo
    /// the window cut they caused.
    fn on_arrived_twice(&mut self, start: u64, end: u64) {
        let seqs: Vec<u64> = self.retx_watch.range(start..end).map(|(&s, _)| s).collect();
        for seq in seqs {
            self.proved_spurious(seq);
        }
    }

    /// Frame `seq`, declared lost, was not: its link learns (see [`Link::on_spurious`]).
    fn proved_spurious(&mut self, seq: u64) {
        if let Some((link, episode)) = self.retx_watch.remove(&seq) {
            self.links[link].on_spurious(episode);
        }
    }

    /// The peer says these are missing: resend those that had time to arrive.
    fn on_reported_missing(&mut self, now: Time, start: u64, end: u64) {
        let seqs: Vec<u64> = self.inflight.range(start, end).map(|(s, _)| s).collect();
        for seq in seqs {
            let Some(s) = self.inflight.get(seq) else { continue };
            if s.counted_on.is_some() && self.overtaken(s) && now >= self.loss_deadline(s) {
                self.lose(now, seq, false);
            }
        }
    }

    /// The frames counted against link `l`, in the order sent (so by deadline).
    fn counted_on_link(&self, l: usize) -> impl Iterator<Item = (u64, &Sent)> + '_ {
        self.links[l].sent_order.iter().filter_map(move |&(seq, at)| {
            self.inflight.get(seq).filter(|s| s.counted_on == Some(l) && s.sent_at == at).map(|s| (seq, s))
        })
    }

    /// Drop the entries of the links' send order that no longer stand for a frame counted
    /// against that link, up to the first that does.
    fn trim_sent_order(&mut self) {
        for l in 0..self.links.len() {
            while let Some(&(seq, at)) = self.links[l].sent_order.front() {
                if self.inflight.get(seq).is_some_and(|s| s.counted_on == Some(l) && s.sent_at == at) {
                    break;
                }
                self.links[l].sent_order.pop_front();
            }
        }
    }

    /// When frame `s` counts as lost: its retransmission timer, or sooner by the overtaking
    /// rule once a later frame was delivered.
    fn loss_due(&self, s: &Sent) -> Time {
        let rto = self.rto_deadline(s);
        if self.overtaken(s) {
            self.loss_deadline(s).min(rto)
        } else {
            rto
        }
    }

    /// When a frame's retransmission timer fires: its link's timeout after it was sent.
    fn rto_deadline(&self, s: &Sent) -> Time {
        s.sent_at + self.links[s.link].rto(&self.cfg)
    }

    /// Whether a frame sent after `s` was delivered (see [`Connection::loss_deadline`]).
    fn overtaken(&self, s: &Sent) -> bool {
        s.sent_at < self.rack_time
    }

    /// When a frame overtaken by later ones counts as lost: its link's round trip plus slack,
    /// if a later frame on the same link was delivered (links keep order); one more round trip
    /// if only frames on other links overtook it (their queues differ, and a queue growing on
    /// its own link delays it past its smoothed round trip without losing it).
    fn loss_deadline(&self, s: &Sent) -> Time {
        let l = &self.links[s.link];
        let at = s.sent_at + l.srtt(&self.cfg) + self.cfg.reorder_slack_us.max(4 * l.rttvar());
        if s.sent_at < l.rack_time {
            at
        } else {
            at + l.srtt(&self.cfg)
        }
    }

    fn lose(&mut self, now: Time, seq: u64, timeout: bool) {
        let Some(s) = self.inflight.get_mut(seq) else { return };
        if let Some(l) = s.counted_on.take() {
            self.links[l].inflight -= 1;
            if timeout {
                self.links[l].on_timeout(&self.cfg, now);
            } else {
                self.links[l].on_loss(&self.cfg, now);
            }
            self.retx.push_back(seq);
            self.retx_watch.insert(seq, (l, self.links[l].episode));
            while self.retx_watch.len() > RETX_WATCH_MAX {
                self.retx_watch.pop_first();
            }
        }
    }

    fn detect_losses(&mut self, now: Time) {
        self.losses_due = false;
        if self.state != State::Established {
            return;
        }
        // Per link, oldest first, up to the first frame not yet due: the later ones are not
        // either (their deadlines grow with the send time).
        let mut lost = Vec::new();
        for l in 0..self.links.len() {
            for (seq, s) in self.counted_on_link(l) {
                if now < self.loss_due(s) {
                    break;
                }
                lost.push((seq, !(self.overtaken(s) && now >= self.loss_deadline(s))));
            }
        }
        // In sequence order, as they were first sent.
        lost.sort_unstable_by_key(|&(seq, _)| seq);
        for (seq, timeout) in lost {
            self.lose(now, seq, timeout);
        }
        self.trim_sent_order();
    }

    fn on_probe_reply(&mut self, now: Time, link: usize, p: ProbeRepr) {
        let l = &mut self.links[link];
        if let Some((token, sent)) = l.probe {
            if token == p.token {
                l.probe = None;
                l.missed = 0;
                l.suspect = false;
                l.rtt_sample(now.saturating_sub(sent));
                if !l.up {
                    l.up = true;
                    self.events.push_back(Event::LinkUp(link));
                }
            }
        }
    }

    /// Time passed: losses, probes, timeouts.
    pub fn handle_timeout(&mut self, now: Time, _target: &mut dyn Target) {
        if matches!(self.state, State::Closed(_)) {
            return;
        }
        if now.saturating_sub(self.last_heard) >= self.cfg.idle_timeout_us {
            self.shut(CloseReason::IdleTimeout);
            return;
        }
        for op in self.ops.expire(now) {
            self.events.push_back(Event::Completed { op, result: Err(OpError::Timeout) });
        }
        if self.state != State::Established {
            return;
        }
        self.detect_losses(now);
        for i in 0..self.links.len() {
            let l = &mut self.links[i];
            match l.probe {
                Some((_, sent)) if now >= sent + self.cfg.probe_timeout_us => {
                    l.probe = None;
                    l.missed += 1;
                    l.probe_due = true;
                    if l.up && l.missed >= self.cfg.probes_missed_max {
                        l.up = false;
                        l.stats.downs += 1;
                        self.events.push_back(Event::LinkDown(i));
                        let seqs: Vec<u64> =
                            self.inflight.iter().filter(|(_, s)| s.counted_on == Some(i)).map(|(q, _)| q).collect();
                        for seq in seqs {
                            self.lose(now, seq, false);
                        }
                        self.trim_sent_order();
                    }
                }
                Some(_) => {}
                None if now.saturating_sub(l.last_heard) >= self.cfg.probe_interval_us => l.probe_due = true,
                None => {}
            }
        }
    }

    /// When [`Connection::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Time> {
        if matches!(self.state, State::Closed(_)) {
            return None;
        }
        let mut t = self.last_heard + self.cfg.idle_timeout_us;
        let mut at = |x: Time| t = t.min(x);
        if let Some(d) = self.ops.next_deadline() {
            at(d);
        }
        if self.state == State::Handshaking {
            if let Some(last) = self.hs_last {
                at(last + self.cfg.handshake_retry_us);
            }
            return Some(t);
        }
        if let Some(d) = self.recv.ack_deadline() {
            at(d);
        }
        if !self.responses.is_empty() && self.answers_held_until > 0 {
            at(self.answers_held_until);
        }
        if self.losses_due {
            at(0);
        }
        // A link's deadlines grow with the send time: its oldest frame has the first.
        let first = (0..self.links.len()).filter_map(|l| self.counted_on_link(l).next()).map(|(_, s)| self.loss_due(s));
        let first = first.min();
        // Checked against every frame in debug builds (the test suite and the simulator).
        debug_assert_eq!(
            first,
            self.inflight.iter().filter(|(_, s)| s.counted_on.is_some()).map(|(_, s)| self.loss_due(s)).min(),
            "the links' send order lost track of a frame's deadline"
        );
        if let Some(d) = first {
            at(d);
        }
        for l in &self.links {
            match l.probe {
                Some((_, sent)) => at(sent + self.cfg.probe_timeout_us),
                None => at(l.last_heard + self.cfg.probe_interval_us),
            }
        }
        Some(t)
    }

    // -----------------------------------------------------------------------------------------
    // Output.

    fn frame_repr(&self, now: Time, link: usize, kind: FrameKind, seq: u64, payload_len: usize) -> FrameRepr {
        let conn = if kind == FrameKind::Handshake && self.role == Role::Initiator && self.peer_conn == 0 {
            0
        } else {
            self.peer_conn
        };
        let ack = (self.state == State::Established && self.recv.any).then_some(self.recv.next as u32);
        FrameRepr {
            kind,
            link: link as u8,
            conn,
            seq: seq as u32,
            ack,
            ts: now as u32,
            payload_len: payload_len as u16,
        }
    }

    fn count_sent(&mut self, repr: &FrameRepr) {
        if repr.ack.is_some() {
            self.recv.acked(repr.kind == FrameKind::Ack);
        }
        let len = repr.buffer_len() as u64;
        let link = repr.link as usize;
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += len;
        self.links[link].stats.frames_sent += 1;
        self.links[link].stats.bytes_sent += len;
    }

    /// A control frame, whole, into `buf`.
    #[allow(clippy::too_many_arguments)]
    fn emit(
        &mut self,
        now: Time,
        buf: &mut [u8],
        link: usize,
        kind: FrameKind,
        seq: u64,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<SplitTransmit> {
        let repr = self.frame_repr(now, link, kind, seq, payload_len);
        if buf.len() < repr.buffer_len() {
            return None;
        }
        let mut f = repr.emit(buf);
        fill(f.payload_mut());
        f.fill_checksums();
        self.count_sent(&repr);
        Some(SplitTransmit { link, head_len: repr.buffer_len(), body: None })
    }

    /// A data frame: header and segment into `buf`, the body shared.
    fn emit_data(
        &mut self,
        now: Time,
        buf: &mut [u8],
        link: usize,
        seq: u64,
        payload: &DataPayload,
    ) -> Option<SplitTransmit> {
        let repr = self.frame_repr(now, link, FrameKind::Data, seq, payload.len());
        let seg = payload.head();
        let head_len = HEADER_LEN + seg.len();
        if buf.len() < head_len {
            return None;
        }
        repr.emit_header(buf, payload.crc);
        buf[HEADER_LEN..head_len].copy_from_slice(seg);
        self.count_sent(&repr);
        Some(SplitTransmit { link, head_len, body: payload.body.clone() })
    }

    /// A link for data: up, not suspect, with window left, where the frame should arrive
    /// soonest: the link's round trip grown by how full its window is (a window's worth of
    /// frames drains in about one round trip). Equal links so take turns; a slower link gets
    /// frames in proportion to what it drains, and none at the tail of a transfer that a faster
    /// link would deliver sooner. `avoid` is skipped when another qualifies (retransmissions
    /// prefer another link).
    fn pick_link(&mut self, avoid: Option<usize>) -> Option<usize> {
        let n = self.links.len();
        let eta = |l: &Link, cfg: &Config| l.srtt(cfg) as f64 * (1.0 + l.inflight as f64 / l.window().max(1) as f64);
        let pick = |strict: bool, skip: Option<usize>| -> Option<usize> {
            let mut best: Option<(f64, usize)> = None;
            for i in 0..n {
                let c = (self.rr + i) % n;
                let l = &self.links[c];
                if Some(c) == skip || !l.has_room() || (strict && l.suspect) {
                    continue;
                }
                let e = eta(l, &self.cfg);
                if best.is_none_or(|(b, _)| e < b) {
                    best = Some((e, c));
                }
            }
            best.map(|(_, c)| c)
        };
        let healthy = self.links.iter().any(|l| l.up && !l.suspect);
        let chosen = pick(true, avoid.filter(|_| n > 1)).or_else(|| pick(true, None)).or_else(|| {
            if healthy {
                None
            } else {
                pick(false, None)
            }
        });
        if let Some(c) = chosen {
            self.rr = c + 1;
        }
        chosen
    }

    fn any_link_up(&self) -> Option<usize> {
        (0..self.links.len()).map(|i| (self.rr + i) % self.links.len()).find(|&i| self.links[i].up)
    }

    /// The next frame to send, written whole into `buf` (at least the largest MTU). Call until
    /// `None`.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        let t = self.poll_transmit_split(now, buf)?;
        let len = t.len();
        if let Some(body) = &t.body {
            buf[t.head_len..len].copy_from_slice(&body[..]);
        }
        Some(Transmit { link: t.link, len })
    }

    /// The next frame to send, as a head written into `buf` (at least the largest MTU) and the
    /// body shared with its operation, so a driver sends both without copying the body. Call
    /// until `None`.
    pub fn poll_transmit_split(&mut self, now: Time, buf: &mut [u8]) -> Option<SplitTransmit> {
        if let Some(code) = self.close_send.take() {
            let link = self.any_link_up().unwrap_or(0);
            return self.emit(now, buf, link, FrameKind::Close, 0, CLOSE_LEN, |p| CloseRepr { reason: code }.emit(p));
        }
        if matches!(self.state, State::Closed(_)) {
            return None;
        }
        if let Some(t) = self.poll_handshake(now, buf) {
            return Some(t);
        }
        if let Some((link, token, ts)) = self.probe_replies.pop_front() {
            let p = ProbeRepr { reply: true, token, echo_ts: ts };
            return self.emit(now, buf, link, FrameKind::Probe, 0, PROBE_LEN, |b| p.emit(b));
        }
        if self.state != State::Established {
            return None;
        }
        for i in 0..self.links.len() {
            if self.links[i].probe_due {
                self.links[i].probe_due = false;
                self.probe_token = self.probe_token.wrapping_add(1);
                let token = self.probe_token;
                self.links[i].probe = Some((token, now));
                self.links[i].stats.probes += 1;
                let p = ProbeRepr { reply: false, token, echo_ts: 0 };
                return self.emit(now, buf, i, FrameKind::Probe, 0, PROBE_LEN, |b| p.emit(b));
            }
        }
        if self.recv.nack_due {
            let ranges = self.recv.take_nacks(now);
            if !ranges.is_empty() {
                let n = RangesRepr { ranges };
                let link = self.any_link_up().unwrap_or(0);
                self.stats.nacks_sent += 1;
                return self.emit(now, buf, link, FrameKind::Nack, 0, n.buffer_len(), |b| n.emit(b));
            }
        }
        while let Some(&seq) = self.retx.front() {
            let Some(s) = self.inflight.get(seq) else {
                self.retx.pop_front();
                continue;
            };
            let prev = s.link;
            // No link has window for it now: fall through (an acknowledgement may still be due).
            let Some(link) = self.pick_link(Some(prev)) else { break };
            self.retx.pop_front();
            let s = self.inflight.get_mut(seq).expect("checked");
            s.counted_on = Some(link);
            s.link = link;
            s.sent_at = now;
            s.retransmitted = true;
            let payload = s.payload.clone();
            self.links[link].sent_order.push_back((seq, now));
            self.links[link].inflight += 1;
            self.links[link].stats.retransmits += 1;
            self.stats.retransmits += 1;
            return self.emit_data(now, buf, link, seq, &payload);
        }
        // New data and answers go next; they carry the cumulative acknowledgement, so an
        // explicit one is sent only when nothing else is going out (or gaps need selective
        // ranges).
        if let Some(t) = self.poll_new_data(now, buf) {
            return Some(t);
        }
        if self.recv.ack_due(now) {
            let (ts, l) = self.recv.echo;
            let a = AckRepr { echo_ts: ts, echo_link: l, ranges: self.recv.sack_ranges(), dups: self.recv.take_dups() };
            let link = if self.links.get(l as usize).is_some_and(|k| k.up) {
                l as usize
            } else {
                self.any_link_up().unwrap_or(0)
            };
            self.stats.acks_sent += 1;
            return self.emit(now, buf, link, FrameKind::Ack, 0, a.buffer_len(), |b| a.emit(b));
        }
        None
    }

    /// A new data frame, if the windows allow: answers the target owes ride ahead of its last
    /// segment, which is owed read data if any, else the next fragment of an operation, else
    /// one more answer. Answers alone wait while held ([`Connection::hold_answers`]).
    fn poll_new_data(&mut self, now: Time, buf: &mut [u8]) -> Option<SplitTransmit> {
        if self.inflight.len() >= self.cfg.window_frames_max
            || !self.inflight.has_room()
            || self.incoming.len() >= crate::OPS_MAX
        {
            return None;
        }
        let bodiless = |r: &(SegmentRepr, Option<Bytes>)| r.0.kind.is_answer() && r.1.is_none();
        if !self.ops.can_emit()
            && (self.responses.is_empty() || (now < self.answers_held_until && self.responses.iter().all(bodiless)))
        {
            return None;
        }
        let link = self.pick_link(None)?;
        // Room for answers ahead of a last segment that still carries a useful body.
        let room =
            (self.payload_max.saturating_sub(SEGMENT_LEN + ANSWER_RIDE_BODY_MIN) / SEGMENT_LEN).min(ANSWERS_PACKED_MAX);
        let mut answers = [SegmentRepr::answer(0, SegKind::Done, 0, 0); ANSWERS_PACKED_MAX];
        let mut n = 0;
        while n < room && self.responses.front().is_some_and(bodiless) {
            answers[n] = self.responses.pop_front().expect("looked at").0;
            n += 1;
        }
        let packed = n * SEGMENT_LEN;
        let fits = |r: &Piece| packed + piece_len(r) <= self.payload_max;
        let mut last: Piece = match self.responses.front() {
            Some(r) if fits(r) => self.responses.pop_front().expect("looked at"),
            _ => match self.ops.next_segment(self.payload_max - packed) {
                Some((_, seg, body)) => (seg, body),
                None if n == 0 => return None,
                None => {
                    // Nothing else goes: the last answer taken ends the frame.
                    n -= 1;
                    (answers[n], None)
                }
            },
        };
        // Small whole operations (and answers) waiting behind share the frame: each one moves
        // the last ahead, while the frame has room and segments to spare. (Nothing is gathered
        // for the usual frame of one operation.)
        let mut chained: Vec<Piece> = Vec::new();
        let mut used = packed + piece_len(&last);
        while n + chained.len() + 1 < SEGMENTS_PER_FRAME_MAX && chainable(&last) {
            let room = (self.payload_max - used).min(CHAINED_SEGMENT_MAX);
            let from_responses = self.responses.front().is_some_and(|r| piece_len(r) <= room && chainable(r));
            let next = if from_responses {
                self.responses.pop_front()
            } else {
                let op = self.ops.next_whole(room).map(|(_, seg, body)| (seg, body));
                self.stats.ops_chained += op.is_some() as u64;
                op
            };
            let Some(next) = next else { break };
            used += piece_len(&next);
            chained.push(std::mem::replace(&mut last, next));
        }
        let (last, body) = last;
        let payload = if chained.is_empty() {
            DataPayload::packed(&answers[..n], &last, body)
        } else {
            let ahead: Vec<Piece> = answers[..n].iter().map(|a| (*a, None)).chain(chained).collect();
            DataPayload::chain(&ahead, &last, body)
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.links[link].inflight += 1;
        self.stats.data_frames += 1;
        self.stats.answers_packed += n as u64;
        let t = self.emit_data(now, buf, link, seq, &payload);
        let added =
            self.inflight.push(seq, Sent { payload, counted_on: Some(link), link, sent_at: now, retransmitted: false });
        debug_assert!(added, "sequence numbers only grow");
        self.links[link].sent_order.push_back((seq, now));
        t
    }

    /// How much more the application's queues take: message bytes and notifications. A data
    /// frame that would hand over more is dropped unacknowledged (its sender tries again
    /// later), so a receiver that does not read holds its senders back instead of growing
    /// without bound. Lowered as frames are taken; a driver sets it again as its queues drain.
    /// Unlimited until set.
    pub fn set_delivery_room(&mut self, msg_bytes: usize, notes: usize) {
        self.room = Room { msg_bytes, notes };
    }

    /// Keep bodiless answers (`Done`, `Refused`) from going in frames of their own until
    /// `until`, so they can ride in the next data frame: a driver that has just handed the
    /// application a notification or message holds them, since the application usually answers
    /// at once; a hold ends at `until` or when set again (`hold_answers(0)` ends it now).
    pub fn hold_answers(&mut self, until: Time) {
        self.answers_held_until = until;
    }

    fn poll_handshake(&mut self, now: Time, buf: &mut [u8]) -> Option<SplitTransmit> {
        let step = self.hs_send?;
        let waiting_reply = matches!(step, HandshakeStep::Hello | HandshakeStep::Challenge | HandshakeStep::Proof);
        if let Some(last) = self.hs_last {
            if waiting_reply && now < last + self.cfg.handshake_retry_us {
                return None;
            }
        }
        let (proof, nonce) = match step {
            HandshakeStep::Hello => ([0u8; 32], self.my_nonce),
            HandshakeStep::Challenge => (
                auth::prove(&self.secret, LABEL_ACCEPTOR, &self.their_nonce, &context(self.peer, self.me)),
                self.my_nonce,
            ),
            HandshakeStep::Proof => {
                (auth::prove(&self.secret, LABEL_INITIATOR, &self.their_nonce, &context(self.me, self.peer)), [0u8; 32])
            }
            HandshakeStep::Done => ([0u8; 32], [0u8; 32]),
        };
        let h = HandshakeRepr {
            step,
            links: self.links.len() as u8,
            mtu: (own_payload_max(&self.cfg) + HEADER_LEN) as u16,
            from: self.me,
            to: self.peer,
            conn: self.local_conn,
            nonce,
            proof,
        };
        let link = self.hs_rr % self.links.len();
        self.hs_rr += 1;
        if step == HandshakeStep::Done {
            self.hs_send = None;
        } else {
            self.hs_last = Some(now);
        }
        self.emit(now, buf, link, FrameKind::Handshake, 0, HANDSHAKE_LEN, |b| h.emit(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks sequence-number widening across the 32-bit wrap in both directions.
    #[test]
    fn sequence_numbers_widen_across_wrap() {
        assert_eq!(unwrap_seq(5, 7), 7);
        assert_eq!(unwrap_seq((1 << 32) + 3, 0xffff_fffe), 0xffff_fffe);
        assert_eq!(unwrap_seq(0xffff_fff0, 2), (1 << 32) + 2);
    }
}
