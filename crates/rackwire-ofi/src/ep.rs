//! An endpoint's receive side: receives posted and messages that came first, matched by
//! source and tag (with ignore bits) in the order each side arrived; messages in pieces put
//! together as their pieces come; `FI_PEEK`, `FI_CLAIM` and `FI_DISCARD`.

use std::collections::{HashMap, VecDeque};

use crate::queues::Addr;
use crate::user::{scatter, Iov, Iovs};
use crate::wire::{Header, Kind};

/// Receives an endpoint holds posted at most, of each kind (its `rx_attr.size`).
pub const RX_POSTED_MAX: usize = 4096;
/// Messages an endpoint holds that no receive was posted for, at most (past it the
/// provider stops taking messages from the fabric until receives are posted).
pub const UNEXPECTED_MAX: usize = 4096;
/// Bytes of such messages an endpoint holds at most (the same).
pub const UNEXPECTED_BYTES_MAX: usize = 64 << 20;
/// The largest message (its `ep_attr.max_msg_size`).
pub const MSG_BYTES_MAX: usize = 1 << 30;
/// Unexpected messages at least this long are held in buffers kept for reuse: a fresh buffer
/// of a megabyte costs a page fault per page touched, and one freed goes back to the system
/// (MPI one-sided over `osc pt2pt` sends its puts before the target posts their receives:
/// five times the throughput with buffers reused).
pub const SPARE_MIN: usize = 32 << 10;
/// Buffers kept for reuse per endpoint at most.
pub const SPARES_MAX: usize = 8;
/// Bytes of buffers kept for reuse per endpoint at most.
pub const SPARE_BYTES_MAX: usize = 32 << 20;

/// A receive the application posted.
#[derive(Clone, Debug)]
pub struct Posted {
    /// Its context.
    pub ctx: usize,
    /// Its buffer.
    pub iov: Iovs,
    /// Only from this sender (a directed receive), or from anyone.
    pub src: Option<Addr>,
    /// The tag wanted (tagged receives).
    pub tag: u64,
    /// Tag bits that do not matter.
    pub ignore: u64,
    /// Whether its completion is written to the queue (`FI_COMPLETION` or not selective).
    pub completion: bool,
    /// A buffer for many messages (`FI_MULTI_RECV`): released once less than this many bytes
    /// are left. Each message takes the next part of it ([`Matcher::post_multi`]).
    pub multi: Option<usize>,
    /// The part of a multi-message buffer whose completion releases it (`FI_MULTI_RECV` set).
    pub release: bool,
}

impl Posted {
    fn matches(&self, src: Addr, tag: u64, tagged: bool) -> bool {
        self.src.is_none_or(|s| s == src) && (!tagged || (tag ^ self.tag) & !self.ignore == 0)
    }
}

/// A message that came before any receive matched it.
#[derive(Debug)]
struct Unexpected {
    id: u64,
    src: Addr,
    tag: u64,
    data: Option<u64>,
    bytes: Vec<u8>,
    total: usize,
    /// Claimed by the peek of this context (`FI_CLAIM`): matched by nothing else.
    claimed: Option<usize>,
    /// Its pieces' key while more are to come.
    key: Option<(Addr, u64)>,
}

/// A message being put together from its pieces.
#[derive(Debug)]
enum Assembly {
    /// Into a posted receive.
    Posted { done: RxDone, got: usize },
    /// Into a message held unexpected.
    Unexpected { class: usize, id: u64 },
}

/// A receive that completed: the engine turns it into a completion.
#[derive(Clone, Debug)]
pub struct RxDone {
    /// The receive.
    pub recv: Posted,
    /// The sender.
    pub src: Addr,
    /// The message's tag.
    pub tag: u64,
    /// Its remote CQ data.
    pub data: Option<u64>,
    /// Its length.
    pub total: usize,
    /// Bytes placed in the receive's buffer (less than `total`: truncated).
    pub copied: usize,
    /// Tagged (`FI_TAGGED`) or plain (`FI_MSG`).
    pub tagged: bool,
}

/// What a peek found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peeked {
    /// The sender.
    pub src: Addr,
    /// The tag.
    pub tag: u64,
    /// Remote CQ data.
    pub data: Option<u64>,
    /// The message's length.
    pub len: usize,
}

/// Why a message from the fabric was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// A piece of a message this endpoint holds no start of.
    Orphan,
    /// A message longer than any this provider sends.
    TooLong,
    /// A piece out of place.
    OutOfOrder,
    /// Not a message (an RMA request or answer, handled elsewhere).
    NotAMessage,
}

/// The receive side of one endpoint.
#[derive(Debug, Default)]
pub struct Matcher {
    posted: [VecDeque<Posted>; 2],
    unexpected: [VecDeque<Unexpected>; 2],
    assembling: HashMap<(Addr, u64), Assembly>,
    /// Bytes held in unexpected messages.
    pub unexpected_bytes: usize,
    next_id: u64,
    /// Buffers of delivered unexpected messages, kept for the next ones.
    spares: Vec<Vec<u8>>,
    spare_bytes: usize,
}

fn class(tagged: bool) -> usize {
    usize::from(tagged)
}

impl Matcher {
    /// Whether this endpoint takes no more messages until receives are posted.
    pub fn full(&self) -> bool {
        self.unexpected_bytes >= UNEXPECTED_BYTES_MAX
            || self.unexpected[0].len() + self.unexpected[1].len() >= UNEXPECTED_MAX
    }

    /// A message (or a piece of one) from `src` arrived.
    pub fn arrive(&mut self, src: Addr, h: &Header, payload: &[u8]) -> Result<Option<RxDone>, Dropped> {
        match h.kind {
            Kind::Whole | Kind::First => {
                let total = if h.kind == Kind::Whole { payload.len() } else { h.len_or_offset as usize };
                if total > MSG_BYTES_MAX || payload.len() > total {
                    return Err(Dropped::TooLong);
                }
                let c = class(h.tagged);
                let data = h.has_data.then_some(h.data);
                let key = (h.kind == Kind::First).then_some((src, h.msg_id));
                match self.posted[c].iter().position(|p| p.matches(src, h.tag, h.tagged)) {
                    Some(i) => {
                        let recv = self.part_of(c, i, total);
                        let copied = scatter(&recv.iov, 0, payload);
                        let done = RxDone { recv, src, tag: h.tag, data, total, copied, tagged: h.tagged };
                        match key {
                            Some(k) if payload.len() < total => {
                                self.assembling.insert(k, Assembly::Posted { done, got: payload.len() });
                                Ok(None)
                            }
                            _ => Ok(Some(done)),
                        }
                    }
                    None => {
                        let id = self.next_id;
                        self.next_id += 1;
                        let more = key.filter(|_| payload.len() < total);
                        if let Some(k) = more {
                            self.assembling.insert(k, Assembly::Unexpected { class: c, id });
                        }
                        self.unexpected_bytes += payload.len();
                        let mut bytes = if total >= SPARE_MIN { self.spare() } else { Vec::new() };
                        bytes.extend_from_slice(payload);
                        let u = Unexpected { id, src, tag: h.tag, data, bytes, total, claimed: None, key: more };
                        self.unexpected[c].push_back(u);
                        Ok(None)
                    }
                }
            }
            Kind::Next => self.piece(src, h.msg_id, h.len_or_offset as usize, payload),
            _ => Err(Dropped::NotAMessage),
        }
    }

    fn piece(&mut self, src: Addr, msg: u64, offset: usize, payload: &[u8]) -> Result<Option<RxDone>, Dropped> {
        let key = (src, msg);
        let finished = match self.assembling.get_mut(&key).ok_or(Dropped::Orphan)? {
            Assembly::Posted { done, got } => {
                if offset != *got || *got + payload.len() > done.total {
                    return Err(Dropped::OutOfOrder);
                }
                done.copied += scatter(&done.recv.iov, offset, payload);
                *got += payload.len();
                *got == done.total
            }
            Assembly::Unexpected { class, id } => {
                let u = self.unexpected[*class].iter_mut().find(|u| u.id == *id).ok_or(Dropped::Orphan)?;
                if offset != u.bytes.len() || offset + payload.len() > u.total {
                    return Err(Dropped::OutOfOrder);
                }
                u.bytes.extend_from_slice(payload);
                self.unexpected_bytes += payload.len();
                let complete = u.bytes.len() == u.total;
                if complete {
                    u.key = None;
                }
                complete
            }
        };
        if !finished {
            return Ok(None);
        }
        match self.assembling.remove(&key) {
            Some(Assembly::Posted { done, .. }) => Ok(Some(done)),
            _ => Ok(None),
        }
    }

    /// Post a receive; its completion at once if a message waiting matched it whole.
    pub fn post(&mut self, recv: Posted, tagged: bool) -> Result<Option<RxDone>, i32> {
        let c = class(tagged);
        let found = self.unexpected[c].iter().position(|u| u.claimed.is_none() && recv.matches(u.src, u.tag, tagged));
        match found {
            Some(i) => Ok(self.take(c, i, recv, tagged)),
            None if self.posted[c].len() >= RX_POSTED_MAX => Err(crate::consts::FI_EAGAIN),
            None => {
                self.posted[c].push_back(recv);
                Ok(None)
            }
        }
    }

    /// Post a buffer for many messages: the messages waiting that it matches go into it at
    /// once, one part each, while it has room; their completions.
    pub fn post_multi(&mut self, recv: Posted) -> Result<Vec<RxDone>, i32> {
        if recv.iov.len() != 1 || recv.multi.is_none() {
            return Err(crate::consts::FI_EINVAL);
        }
        if self.posted[0].len() >= RX_POSTED_MAX {
            return Err(crate::consts::FI_EAGAIN);
        }
        self.posted[0].push_back(recv);
        let mut done = Vec::new();
        // The buffer is the last posted receive until it is released.
        while let Some(at) = self.posted[0].len().checked_sub(1) {
            let Some(p) = self.posted[0].get(at).filter(|p| p.multi.is_some()) else { break };
            let Some(i) = self.unexpected[0].iter().position(|u| u.claimed.is_none() && p.matches(u.src, u.tag, false))
            else {
                break;
            };
            let total = self.unexpected[0][i].total;
            let part = self.part_of(0, at, total);
            let released = part.release;
            done.extend(self.take(0, i, part, false));
            if released {
                break;
            }
        }
        Ok(done)
    }

    /// The receive a message of `total` bytes goes into: posted receive `i` of `c` itself, or
    /// for a buffer of many messages the next part of it (`total` bytes, or what is left),
    /// the buffer released when less than its minimum is left after it.
    fn part_of(&mut self, c: usize, i: usize, total: usize) -> Posted {
        let Some(min) = self.posted[c][i].multi else {
            return self.posted[c].remove(i).expect("found");
        };
        let p = &mut self.posted[c][i];
        let left = p.iov[0];
        let n = total.min(left.len);
        let mut part = Posted { iov: Iovs::one(Iov { base: left.base, len: n }), multi: None, ..p.clone() };
        p.iov[0] = Iov { base: left.base + n, len: left.len - n };
        if left.len - n < min {
            self.posted[c].remove(i);
            part.release = true;
        }
        part
    }

    /// An empty buffer for a long unexpected message: the largest kept one (its pages are
    /// touched already), or a new one.
    fn spare(&mut self) -> Vec<u8> {
        let Some(i) = (0..self.spares.len()).max_by_key(|&i| self.spares[i].capacity()) else { return Vec::new() };
        let b = self.spares.swap_remove(i);
        self.spare_bytes -= b.capacity();
        b
    }

    /// Keep `b` (the buffer of a delivered message) for a later one, within the limits.
    fn recycle(&mut self, mut b: Vec<u8>) {
        let cap = b.capacity();
        if cap >= SPARE_MIN && self.spares.len() < SPARES_MAX && self.spare_bytes + cap <= SPARE_BYTES_MAX {
            b.clear();
            self.spare_bytes += cap;
            self.spares.push(b);
        }
    }

    /// Deliver unexpected message `i` of `class` into `recv` (the rest of its pieces follow
    /// into it as they come).
    fn take(&mut self, c: usize, i: usize, recv: Posted, tagged: bool) -> Option<RxDone> {
        let mut u = self.unexpected[c].remove(i).expect("found");
        self.unexpected_bytes -= u.bytes.len();
        let copied = scatter(&recv.iov, 0, &u.bytes);
        let got = u.bytes.len();
        self.recycle(std::mem::take(&mut u.bytes));
        let done = RxDone { recv, src: u.src, tag: u.tag, data: u.data, total: u.total, copied, tagged };
        match u.key {
            Some(k) => {
                self.assembling.insert(k, Assembly::Posted { done, got });
                None
            }
            None => Some(done),
        }
    }

    /// `FI_PEEK` (with `FI_CLAIM`: keep it for this context; with `FI_DISCARD`: drop it) for a
    /// message that has arrived whole.
    pub fn peek(&mut self, recv: &Posted, tagged: bool, claim: bool, discard: bool) -> Option<Peeked> {
        let c = class(tagged);
        let i = self.unexpected[c]
            .iter()
            .position(|u| u.claimed.is_none() && u.key.is_none() && recv.matches(u.src, u.tag, tagged))?;
        let u = &mut self.unexpected[c][i];
        let seen = Peeked { src: u.src, tag: u.tag, data: u.data, len: u.total };
        if discard {
            let u = self.unexpected[c].remove(i).expect("found");
            self.unexpected_bytes -= u.bytes.len();
            self.recycle(u.bytes);
        } else if claim {
            u.claimed = Some(recv.ctx);
        }
        Some(seen)
    }

    /// `FI_CLAIM`: receive (or with `discard`, drop) the message claimed by `recv.ctx`.
    pub fn claim(&mut self, recv: Posted, tagged: bool, discard: bool) -> Result<RxDone, i32> {
        let c = class(tagged);
        let i = self.unexpected[c].iter().position(|u| u.claimed == Some(recv.ctx)).ok_or(crate::consts::FI_EINVAL)?;
        if discard {
            let u = self.unexpected[c].remove(i).expect("found");
            self.unexpected_bytes -= u.bytes.len();
            self.recycle(u.bytes);
            return Ok(RxDone { recv, src: u.src, tag: u.tag, data: u.data, total: 0, copied: 0, tagged });
        }
        Ok(self.take(c, i, recv, tagged).expect("a claimed message has arrived whole"))
    }

    /// Take back the posted receive of context `ctx`.
    pub fn cancel(&mut self, ctx: usize) -> Option<(Posted, bool)> {
        for c in 0..2 {
            if let Some(i) = self.posted[c].iter().position(|p| p.ctx == ctx) {
                return self.posted[c].remove(i).map(|p| (p, c == 1));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: Kind, tag: u64, msg_id: u64, len_or_offset: u64) -> Header {
        Header {
            kind,
            tagged: true,
            has_data: false,
            dst_ep: 0,
            src_ep: 0,
            tag,
            data: 0,
            msg_id,
            len_or_offset,
            last: false,
        }
    }

    fn recv(buf: &mut [u8], tag: u64, ignore: u64, ctx: usize) -> Posted {
        let iov = vec![Iov { base: buf.as_mut_ptr() as usize, len: buf.len() }];
        Posted {
            ctx,
            iov: iov.as_slice().into(),
            src: None,
            tag,
            ignore,
            completion: true,
            multi: None,
            release: false,
        }
    }

    // Checks that the buffers of long unexpected messages are reused and stay within their
    // limits: a 40 KiB message that arrived before its receive is delivered whole and its
    // buffer kept; the next such message lands in that same buffer (its address) and is
    // delivered whole too; after SPARES_MAX + 4 of them delivered at once, no more than
    // SPARES_MAX buffers (and SPARE_BYTES_MAX bytes) are kept; short messages keep none.
    #[test]
    fn long_unexpected_messages_reuse_their_buffers_within_limits() {
        let mut m = Matcher::default();
        let long: Vec<u8> = (0..40 << 10).map(|i| (i % 251) as u8).collect();
        let mut out = vec![0u8; long.len()];
        m.arrive((1, 0), &header(Kind::Whole, 1, 0, 0), &long).unwrap();
        m.post(recv(&mut out, 1, 0, 1), true).unwrap().expect("delivered");
        assert_eq!(out, long);
        assert_eq!(m.spares.len(), 1, "its buffer is kept");
        let kept = m.spares[0].as_ptr();
        m.arrive((1, 0), &header(Kind::Whole, 2, 0, 0), &long).unwrap();
        assert!(m.spares.is_empty());
        assert_eq!(m.unexpected[1][0].bytes.as_ptr(), kept, "the next long message lands in it");
        out.fill(0);
        m.post(recv(&mut out, 2, 0, 2), true).unwrap().expect("delivered");
        assert_eq!(out, long);
        let n = SPARES_MAX + 4;
        for t in 0..n as u64 {
            m.arrive((1, 0), &header(Kind::Whole, 100 + t, 0, 0), &long).unwrap();
        }
        for t in 0..n as u64 {
            m.post(recv(&mut out, 100 + t, 0, 10 + t as usize), true).unwrap().expect("delivered");
        }
        assert!(m.spares.len() <= SPARES_MAX && m.spare_bytes <= SPARE_BYTES_MAX);
        assert_eq!(m.spare_bytes, m.spares.iter().map(|b| b.capacity()).sum::<usize>());
        let mut short = Matcher::default();
        short.arrive((1, 0), &header(Kind::Whole, 1, 0, 0), b"short").unwrap();
        short.post(recv(&mut out, 1, 0, 1), true).unwrap().expect("delivered");
        assert!(short.spares.is_empty(), "short messages keep no buffer");
    }

    // Checks tag matching both ways round: a message that arrives before its receive waits
    // and is delivered when a receive matching its tag (with ignore bits) is posted; a posted
    // receive takes the first matching message and not one whose tag differs in a bit that
    // matters; messages of one tag are received in the order they came.
    #[test]
    fn tags_match_with_ignore_bits_in_arrival_order() {
        let mut m = Matcher::default();
        let src = (1, 0);
        assert!(m.arrive(src, &header(Kind::Whole, 0x10, 0, 0), b"first").unwrap().is_none());
        assert!(m.arrive(src, &header(Kind::Whole, 0x11, 0, 0), b"second").unwrap().is_none());
        let mut a = [0u8; 8];
        let done = m.post(recv(&mut a, 0x17, 0x2, 1), true).unwrap();
        assert!(done.is_none(), "0x17 with bit 1 ignored matches neither 0x10 nor 0x11");
        let mut b = [0u8; 8];
        let done = m.post(recv(&mut b, 0x10, 0x1, 2), true).unwrap().expect("0x10 matches");
        assert_eq!((done.copied, done.tag, &b[..5]), (5, 0x10, &b"first"[..]));
        let mut c = [0u8; 8];
        let done = m.post(recv(&mut c, 0x10, 0x1, 3), true).unwrap().expect("0x11 matches");
        assert_eq!(&c[..6], b"second");
        assert_eq!(done.tag, 0x11);
        let got = m.arrive(src, &header(Kind::Whole, 0x15, 0, 0), b"third").unwrap().expect("posted 0x17/0x2");
        assert_eq!((got.recv.ctx, &a[..5]), (1, &b"third"[..]));
        assert_eq!(m.unexpected_bytes, 0);
    }

    // Checks a message in three pieces both ways: into a receive posted before (the pieces go
    // straight into its buffer) and into one posted after the first piece (what came is
    // copied, the rest follows); too small a buffer reports the message's whole length with
    // fewer bytes copied; a piece without a first one is dropped as an orphan.
    #[test]
    fn pieces_are_put_together_and_truncation_is_reported() {
        let mut m = Matcher::default();
        let src = (2, 1);
        let mut buf = [0u8; 9];
        assert!(m.post(recv(&mut buf, 7, 0, 1), true).unwrap().is_none());
        assert!(m.arrive(src, &header(Kind::First, 7, 1, 9), b"abc").unwrap().is_none());
        assert!(m.arrive(src, &header(Kind::Next, 7, 1, 3), b"def").unwrap().is_none());
        let done = m.arrive(src, &header(Kind::Next, 7, 1, 6), b"ghi").unwrap().expect("complete");
        assert_eq!((done.total, done.copied, &buf), (9, 9, b"abcdefghi"));

        assert!(m.arrive(src, &header(Kind::First, 8, 2, 9), b"123").unwrap().is_none());
        let mut small = [0u8; 5];
        assert!(m.post(recv(&mut small, 8, 0, 2), true).unwrap().is_none(), "two pieces still to come");
        assert!(m.arrive(src, &header(Kind::Next, 8, 2, 3), b"456").unwrap().is_none());
        let done = m.arrive(src, &header(Kind::Next, 8, 2, 6), b"789").unwrap().expect("complete");
        assert_eq!((done.total, done.copied, &small), (9, 5, b"12345"));
        assert!(matches!(m.arrive(src, &header(Kind::Next, 8, 99, 0), b"x"), Err(Dropped::Orphan)));
    }

    // Checks FI_PEEK, FI_CLAIM and FI_DISCARD: a peek sees a waiting message's tag and length
    // without taking it; a claiming peek keeps it from every other receive; the claim
    // receives it; a discarding peek drops it; a peek with nothing waiting finds nothing.
    #[test]
    fn peek_claim_and_discard() {
        let mut m = Matcher::default();
        let src = (3, 0);
        m.arrive(src, &header(Kind::Whole, 5, 0, 0), b"claimed").unwrap();
        m.arrive(src, &header(Kind::Whole, 6, 0, 0), b"dropped").unwrap();
        let mut none = [0u8; 0];
        let probe = recv(&mut none, 5, 0, 10);
        assert_eq!(m.peek(&probe, true, false, false).map(|p| (p.tag, p.len)), Some((5, 7)));
        assert!(m.peek(&probe, true, true, false).is_some());
        let mut other = [0u8; 8];
        assert!(m.post(recv(&mut other, 5, 0, 11), true).unwrap().is_none(), "a claimed message is kept");
        let mut mine = [0u8; 8];
        let done = m.claim(recv(&mut mine, 0, 0, 10), true, false).unwrap();
        assert_eq!((done.copied, &mine[..7]), (7, &b"claimed"[..]));
        let gone = recv(&mut none, 6, 0, 12);
        assert!(m.peek(&gone, true, false, true).is_some());
        assert!(m.peek(&gone, true, false, false).is_none());
        assert_eq!(m.unexpected_bytes, 0);
        assert!(m.cancel(11).is_some());
        assert!(m.cancel(11).is_none());
    }

    // Checks a buffer of many messages (FI_MULTI_RECV): messages that waited go in at once,
    // later ones as they come, each into the next part of the buffer and reported there;
    // the part after which less than the minimum is left releases the buffer (and says so);
    // a message past what is left is cut to it; tagged messages never go into it.
    #[test]
    fn a_buffer_takes_many_messages_and_is_released() {
        let mut m = Matcher::default();
        let src = (4, 0);
        let plain = |kind| Header { tagged: false, ..header(kind, 0, 0, 0) };
        m.arrive(src, &plain(Kind::Whole), b"one").unwrap();
        m.arrive(src, &plain(Kind::Whole), b"two!").unwrap();
        let mut buf = [0u8; 16];
        let iov = vec![Iov { base: buf.as_mut_ptr() as usize, len: buf.len() }];
        let multi = Posted {
            ctx: 9,
            iov: iov.as_slice().into(),
            src: None,
            tag: 0,
            ignore: 0,
            completion: true,
            multi: Some(6),
            release: false,
        };
        let done = m.post_multi(multi).unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!((done[0].copied, done[1].copied, done[1].recv.release), (3, 4, false));
        assert_eq!(done[1].recv.iov[0].base - done[0].recv.iov[0].base, 3, "the second message follows the first");
        assert!(m.arrive(src, &header(Kind::Whole, 0, 0, 0), b"tagged").unwrap().is_none(), "tagged: not into it");
        let last = m.arrive(src, &plain(Kind::Whole), b"three").unwrap().expect("fits");
        assert!(last.recv.release, "4 bytes are left, fewer than 6: released");
        assert_eq!(&buf[..12], b"onetwo!three");
        assert!(m.arrive(src, &plain(Kind::Whole), b"later").unwrap().is_none(), "released: waits");
    }

    proptest::proptest! {
        // Checks that whatever a peer sends — pieces without a start, pieces out of place or
        // past the end, lengths too large, repeated message numbers, any tags — the matcher
        // neither panics nor writes past a receive's buffer (the buffers' guard bytes stay
        // untouched), and the bytes it holds unexpected are never more than were sent.
        #[test]
        fn no_sequence_of_messages_breaks_the_matcher(
            msgs in proptest::collection::vec(
                (0u8..3, 0u64..4, 0u64..4, prop_len(), proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)),
                0..48,
            ),
            posts in 0usize..4,
        ) {
            let mut m = Matcher::default();
            let mut bufs = vec![[0u8; 48]; posts];
            for (i, b) in bufs.iter_mut().enumerate() {
                let iov = vec![Iov { base: b.as_mut_ptr() as usize + 8, len: 32 }];
                let p = Posted { ctx: i, iov: iov.as_slice().into(), src: None, tag: i as u64, ignore: 0, completion: true, multi: None, release: false };
                m.post(p, true).unwrap();
            }
            let mut sent = 0usize;
            for (kind, tag, msg_id, len_or_offset, payload) in msgs {
                let kind = [Kind::Whole, Kind::First, Kind::Next][kind as usize];
                let h = Header { kind, tagged: true, has_data: false, dst_ep: 0, src_ep: 0, tag, data: 0, msg_id, len_or_offset, last: false };
                sent += payload.len();
                let _ = m.arrive((1, 0), &h, &payload);
                proptest::prop_assert!(m.unexpected_bytes <= sent);
            }
            for b in &bufs {
                proptest::prop_assert!(b[..8].iter().chain(&b[40..]).all(|&x| x == 0), "a guard byte changed");
            }
        }
    }

    fn prop_len() -> impl proptest::strategy::Strategy<Value = u64> {
        proptest::prop_oneof![
            0u64..128,
            proptest::prelude::Just(u64::MAX),
            proptest::prelude::Just(MSG_BYTES_MAX as u64 + 1)
        ]
    }
}
