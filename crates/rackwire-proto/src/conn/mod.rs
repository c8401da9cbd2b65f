//! The connection state machine, by concern: the handshake ([`handshake`]), what arrives
//! ([`input`]), what leaves ([`output`]), loss detection and recovery ([`loss`]), the
//! deadlines ([`timer`]), datagrams ([`datagram`]), the path's frame size ([`path`]), and the
//! invariants checked after every step in debug builds ([`invariants`]). This file holds the
//! state and the application's calls.

mod datagram;
mod handshake;
mod input;
mod invariants;
mod loss;
mod output;
mod path;
mod timer;

use std::collections::{BTreeMap, VecDeque};

use rackwire_wire::frame::PAYLOAD_LEN_MAX;
use rackwire_wire::{HandshakeStep, SegmentRepr, SEGMENTS_PER_FRAME_MAX};

use bytes::Bytes;

pub use datagram::DATAGRAMS_QUEUED_MAX;
pub use handshake::Credentials;
use handshake::Handshake;
use path::PathSize;
pub use path::{PATH_FRAME_RUNGS, PATH_FRAME_SAFE, PATH_PROBE_TRIES};
use rackwire_wire::identity::PublicKey;

use crate::chunk::DataPayload;
use crate::link::Link;
use crate::ops::{Body, Incomings, Ops};
use crate::recv::RecvState;
use crate::sent::SentRing;
use crate::stats::ConnStats;
use crate::{AtomicOp, Completion, Config, OpError, OpFlags, OpId, RegionRef, Time, MESSAGE_BYTES_MAX, OP_BYTES_MAX};

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
    /// The peer could not prove it holds the secret or is the node it claims to be (or we
    /// could not).
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
    /// The path carries no frames as long as the handshake agreed: data frames are cut to
    /// `frame_len` bytes (see [`PATH_FRAME_RUNGS`]).
    PathCut {
        /// The frame length data now goes in.
        frame_len: usize,
        /// The length both ends' links announced.
        agreed: usize,
    },
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

/// Where a connection writes a frame it sends, asked once the frame's link is chosen
/// ([`Connection::poll_transmit_to`]): a driver that lays each link's frames end to end gives
/// the free end of that link's batch, so the frame is written where it goes out from.
pub trait FrameBufs {
    /// A buffer for a frame on `link`, at least as large as the largest frame.
    fn frame_buf(&mut self, link: usize) -> &mut [u8];
}

/// One buffer for every link.
impl FrameBufs for &mut [u8] {
    fn frame_buf(&mut self, _link: usize) -> &mut [u8] {
        self
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
    /// Credentials, the peer's key, the ephemeral keys and signatures.
    hs: Handshake,
    /// The frame keys, once agreed (none: frames go unsealed).
    keys: Option<Box<crate::seal::Keys>>,
    /// Where a sealed frame is opened.
    opened: Vec<u8>,
    local_conn: u32,
    peer_conn: u32,
    my_nonce: [u8; 32],
    their_nonce: [u8; 32],
    hs_send: Option<HandshakeStep>,
    hs_last: Option<Time>,
    hs_rr: usize,
    links: Vec<Link>,
    rr: usize,
    /// Segment header and body bytes per data frame (the smallest link's, or what the path
    /// carries: [`path`]).
    payload_max: usize,
    /// The search for the longest frame the path carries.
    path: PathSize,
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
    /// Ordered segments (see [`crate::OpFlags::ordered`]) that arrived while a frame sent
    /// before theirs was missing, with their frame's sequence number, lowest first (at most
    /// [`crate::ORDERED_WAITING_MAX`]).
    ordered_waiting: VecDeque<(u64, SegmentRepr, Vec<u8>)>,
    /// With delivery in order ([`Config::in_order`]): data frames that arrived beyond a gap,
    /// by sequence number, each its payload (at most [`crate::IN_ORDER_HELD_MAX`]).
    held: std::collections::BTreeMap<u64, Vec<u8>>,
    /// An ordered operation took effect here since [`Connection::take_signalled`] was last
    /// asked.
    signalled: bool,
    events: VecDeque<Event>,
    /// Datagrams waiting to be sent (at most [`DATAGRAMS_QUEUED_MAX`]).
    datagrams: VecDeque<Vec<u8>>,
    /// Buffers of datagrams sent, for the next ones.
    datagram_bufs: Vec<Vec<u8>>,
    /// Probes to answer: link, token, the probe's time, its payload length (at most
    /// [`PROBE_REPLIES_MAX`]).
    probe_replies: VecDeque<(usize, u32, u32, usize)>,
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

/// The payload of this end's largest frame: its smallest link's, since any frame may be sent
/// again on any link.
/// Room for a sealed frame's trailer is kept whether or not frames end up sealed (that is
/// agreed in the handshake, after this end announced its frame size).
fn own_payload_max(cfg: &Config) -> usize {
    let max = (0..cfg.links).map(|l| cfg.payload_max(l)).min().unwrap_or(0);
    max.saturating_sub(crate::seal::TRAILER_LEN).min(PAYLOAD_LEN_MAX)
}

/// Room left in the application's queues (see [`Connection::set_delivery_room`]), and the
/// most it was ever told (the room of empty queues).
#[derive(Clone, Copy, Debug)]
struct Room {
    msg_bytes: usize,
    notes: usize,
    most_msg_bytes: usize,
    most_notes: usize,
}

impl Room {
    /// Whether a frame handing over `bytes` of messages and `notes` notifications is taken:
    /// if it fits; and always when the queues are empty, so that a frame that could never
    /// fit (one carrying more than the queues' bounds) does not hold the connection back for
    /// good: the queues then hold at most one frame's worth past their bounds.
    pub(crate) fn takes(&self, bytes: usize, notes: usize) -> bool {
        let fits = bytes <= self.msg_bytes && notes <= self.notes;
        let empty = self.msg_bytes >= self.most_msg_bytes && self.notes >= self.most_notes;
        fits || empty
    }

    pub(crate) fn take(&mut self, bytes: usize, notes: usize) {
        self.msg_bytes = self.msg_bytes.saturating_sub(bytes);
        self.notes = self.notes.saturating_sub(notes);
    }
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

/// Probes waiting for their reply; past it a probe goes unanswered (the prober sends
/// another).
pub const PROBE_REPLIES_MAX: usize = 16;

/// Frames in flight from which [`Connection::worth_gathering`] holds small operations.
pub const GATHER_IN_FLIGHT_MIN: usize = 2;

/// Widen a 32-bit sequence number to the 64-bit one nearest `near`.
fn unwrap_seq(near: u64, wire: u32) -> u64 {
    let base = near & !0xffff_ffff;
    let cands =
        [base.wrapping_sub(1 << 32) | wire as u64, base | wire as u64, base.wrapping_add(1 << 32) | wire as u64];
    cands.into_iter().min_by_key(|c| c.abs_diff(near)).expect("three candidates")
}

impl Connection {
    #[allow(clippy::too_many_arguments)]
    fn new(
        cfg: Config,
        role: Role,
        me: u32,
        peer: u32,
        creds: &Credentials,
        peer_key: PublicKey,
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
            hs: Handshake::new(creds, peer_key, role, me, peer),
            keys: None,
            opened: Vec::new(),
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
            path: PathSize::default(),
            own_windows: Windows::of(&cfg),
            room: Room { msg_bytes: usize::MAX, notes: usize::MAX, most_msg_bytes: usize::MAX, most_notes: usize::MAX },
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
            ordered_waiting: VecDeque::new(),
            held: Default::default(),
            signalled: false,
            events: VecDeque::new(),
            datagrams: VecDeque::new(),
            datagram_bufs: Vec::new(),
            probe_replies: VecDeque::new(),
            close_send: None,
            last_heard: now,
            probe_token: 0,
            stats,
            cfg,
        }
    }

    /// Start a connection from node `me` to node `peer`, whose node key is `peer_key`.
    /// `nonce` must be fresh random bytes; `local_conn` is this side's connection id (nonzero),
    /// which the peer puts in its frames. Panics if `cfg` does not validate (check it first
    /// with [`Config::validate`]).
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        cfg: Config,
        me: u32,
        peer: u32,
        creds: &Credentials,
        peer_key: PublicKey,
        nonce: [u8; 32],
        local_conn: u32,
        now: Time,
    ) -> Self {
        Self::new(cfg, Role::Initiator, me, peer, creds, peer_key, nonce, local_conn, now)
    }

    /// Answer node `peer`'s connection to node `me` (its first handshake frame named both): it
    /// must prove it holds the fabric secret and the private half of `peer_key`.
    #[allow(clippy::too_many_arguments)]
    pub fn accept(
        cfg: Config,
        me: u32,
        creds: &Credentials,
        peer: u32,
        peer_key: PublicKey,
        nonce: [u8; 32],
        local_conn: u32,
        now: Time,
    ) -> Self {
        Self::new(cfg, Role::Acceptor, me, peer, creds, peer_key, nonce, local_conn, now)
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
        let d = self.ops.done();
        (s.writes, s.bytes_written, s.notifications_sent) = (d.writes, d.bytes_written, d.notified);
        (s.reads, s.bytes_read, s.atomics, s.messages_sent) = (d.reads, d.bytes_read, d.atomics, d.messages);
        for (i, l) in self.links.iter().enumerate() {
            s.links[i] = l.stats;
            s.links[i].window = l.window() as u64;
        }
        let (settled, proven) = self.path_figures();
        s.path_frame_max = settled;
        for (link, p) in s.links.iter_mut().zip(proven) {
            link.path_frame_max = p;
        }
        s
    }

    /// Whether link `l` is in use.
    pub fn link_up(&self, l: usize) -> bool {
        self.links.get(l).is_some_and(|k| k.up)
    }

    /// Whether some link answers (false once every link went down: the peer is unreachable
    /// for now, which is not yet gone; see [`Config::idle_timeout_us`]).
    pub fn reachable(&self) -> bool {
        self.links.iter().any(|l| l.up)
    }

    /// The nonce the peer opened the handshake with (zero until it is known): a first frame
    /// with another nonce is from a new incarnation of the peer, not a repeat.
    pub fn peer_nonce(&self) -> [u8; 32] {
        self.their_nonce
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
        self.ops.is_empty()
            && self.inflight.is_empty()
            && self.responses.is_empty()
            && self.retx.is_empty()
            && self.datagrams.is_empty()
    }

    // -----------------------------------------------------------------------------------------
    // Submitting operations.

    fn submit(&mut self, body: Body, flags: OpFlags, now: Time) -> Result<OpId, OpError> {
        match self.state {
            State::Closed(_) => return Err(OpError::Closed),
            State::Handshaking | State::Established => {}
        }
        let id = self.ops.submit(body, flags, now, self.cfg.op_timeout_us);
        self.check_invariants();
        id
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
        if data.len() as u64 > OP_BYTES_MAX || (flags.ordered && data.len() > crate::ORDERED_WRITE_BYTES_MAX) {
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
        if len > OP_BYTES_MAX || flags.ordered {
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
        if data.len() > MESSAGE_BYTES_MAX || flags.ordered {
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

    pub(super) fn shut(&mut self, why: CloseReason) {
        if matches!(self.state, State::Closed(_)) {
            return;
        }
        self.state = State::Closed(why);
        for op in self.ops.drain() {
            self.events.push_back(Event::Completed { op, result: Err(OpError::Closed) });
        }
        self.inflight.clear();
        for l in &mut self.links {
            l.forget_in_flight();
        }
        self.retx.clear();
        self.responses.clear();
        self.ordered_waiting.clear();
        self.held.clear();
        self.events.push_back(Event::Closed(why));
    }

    /// Whether an ordered operation took effect here since [`Connection::take_signalled`] was
    /// last called (without clearing it).
    pub fn is_signalled(&self) -> bool {
        self.signalled
    }

    /// Whether an ordered operation (a signal: see [`crate::OpFlags::ordered`]) took effect
    /// here since the last call. A driver treats it as it treats a notification it hands over:
    /// an application waits on the signalled word and usually answers at once.
    pub fn take_signalled(&mut self) -> bool {
        std::mem::take(&mut self.signalled)
    }

    /// Whether a frame is owed at once, not at a timer: an acknowledgement or a loss report the
    /// peer's sending waits for, a probe's reply, a close. A driver that puts its sending off
    /// (to hand something over first) does not put it off past a round while this holds.
    pub fn owes_now(&self) -> bool {
        self.close_send.is_some() || !self.probe_replies.is_empty() || self.recv.ack_now || self.recv.nack_due
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
    // The application's side of delivery.

    /// How much more the application's queues take: message bytes and notifications. A data
    /// frame that would hand over more is dropped unacknowledged (its sender tries again
    /// later), so a receiver that does not read holds its senders back instead of growing
    /// without bound. Lowered as frames are taken; a driver sets it again as its queues drain.
    /// Unlimited until set. The most room ever set is taken as the room of empty queues: with
    /// empty queues any frame is taken, even one that hands over more than that (a frame that
    /// could never fit must not stall the connection), so queues exceed their bounds by at most
    /// one frame's worth.
    pub fn set_delivery_room(&mut self, msg_bytes: usize, notes: usize) {
        let first = self.room.most_msg_bytes == usize::MAX && self.room.msg_bytes == usize::MAX;
        let (most_msg_bytes, most_notes) = if first {
            (msg_bytes, notes)
        } else {
            (self.room.most_msg_bytes.max(msg_bytes), self.room.most_notes.max(notes))
        };
        self.room = Room { msg_bytes, notes, most_msg_bytes, most_notes };
    }

    /// Keep bodiless answers (`Done`, `Refused`) from going in frames of their own until
    /// `until`, so they can ride in the next data frame: a driver that has just handed the
    /// application a notification or message holds them, since the application usually answers
    /// at once; a hold ends at `until` or when set again (`hold_answers(0)` ends it now).
    pub fn hold_answers(&mut self, until: Time) {
        self.answers_held_until = until;
    }
}

/// Credentials for unit tests that never complete a handshake.
#[cfg(test)]
pub(crate) fn test_credentials() -> Credentials {
    Credentials::new(b"s", std::sync::Arc::new(rackwire_wire::identity::Identity::from_seed(&[7; 32])))
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

#[cfg(test)]
mod room_tests {
    use super::*;

    // Checks the delivery room rule: a frame is taken if it fits; one that does not fit is
    // refused while the queues hold something, and taken when they are empty (a frame with
    // more notifications than the queues' bound would otherwise never be taken: found by the
    // simulator with a bound of one notification), and the room never goes below zero.
    #[test]
    fn oversize_frames_are_taken_only_by_empty_queues() {
        let mut c =
            Connection::accept(Config::new(1, 1472), 2, &crate::conn::test_credentials(), 1, [0; 32], [0; 32], 1, 0);
        c.set_delivery_room(1000, 1);
        assert!(c.room.takes(1000, 1), "what fits");
        assert!(c.room.takes(0, 2) && c.room.takes(1001, 0), "empty queues take a frame that can never fit");
        c.room.take(0, 2);
        assert_eq!(c.room.notes, 0);
        c.set_delivery_room(400, 0); // the application holds 600 bytes and a notification
        assert!(!c.room.takes(500, 0) && !c.room.takes(0, 1), "not empty: only what fits");
        assert!(c.room.takes(400, 0));
        c.set_delivery_room(1000, 1); // everything taken again
        assert!(c.room.takes(5000, 3));
    }
}
