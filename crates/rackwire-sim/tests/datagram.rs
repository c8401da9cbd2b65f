//! Datagrams between two connections: delivered once as messages, sealed, never kept for a
//! retransmission, refused past their limits, and dropped (counted) where the receiver has no
//! room.

use rackwire_proto::{Config, Connection, Delivery, FrameBufs, OpError, OpFlags, State, DATAGRAMS_QUEUED_MAX};
use rackwire_sim::keys::credentials;
use rackwire_sim::pair::{connecting_as, drain, established_as, events, messages, pump, A_NODE, B_NODE};
use rackwire_sim::MemTarget;
use rackwire_wire::{Frame, FrameKind};

const MTU: usize = 1472;
const SECRET: &[u8] = b"shared-secret";

/// A sealed pair, established (over two links).
fn sealed_pair() -> (Connection, Connection, MemTarget, MemTarget, u64) {
    let (a, b) = (credentials(A_NODE, SECRET), credentials(B_NODE, SECRET));
    let pair = established_as(Config::new(2, MTU), &a, &b, 5, 55, 4096);
    assert_eq!(pair.1.state(), State::Established);
    assert!(pair.0.sealed() && pair.1.sealed());
    pair
}

// Checks the way there: three datagrams sent on a sealed connection leave as three sealed
// datagram frames whose bytes do not show the payload, arrive as three messages in order with
// the bytes sent, are counted on both sides, and leave nothing in flight at the sender (no copy
// kept for a retransmission, no operation to complete).
#[test]
fn datagrams_arrive_once_as_messages_and_leave_nothing_in_flight() {
    let (mut a, mut b, mut ta, mut tb, mut now) = sealed_pair();
    let sent: Vec<Vec<u8>> = (0..3u8).map(|i| vec![0xa0 + i; 100 + i as usize]).collect();
    for d in &sent {
        a.send_datagram(d).unwrap();
    }
    let frames = drain(&mut a, now);
    assert_eq!(frames.len(), 3, "one frame each");
    for (link, f) in &frames {
        let frame = Frame::new_unchecked(&f[..]);
        assert_eq!(frame.kind(), FrameKind::Datagram);
        assert!(frame.sealed());
        assert!(!f.windows(16).any(|w| w.iter().all(|&x| x == 0xa0)), "the payload is not in clear");
        b.handle_frame(now + 10, *link, f, &mut tb);
    }
    assert_eq!(a.in_flight(), 0);
    assert_eq!(messages(&mut b), sent);
    assert_eq!(a.stats().datagrams_sent, 3);
    assert_eq!(b.stats().datagrams_received, 3);
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert!(a.is_idle() && b.is_idle());
}

// Checks that a lost datagram stays lost: its frame is dropped on the way, time passes far
// beyond every retransmission deadline with the timers run, and nothing more reaches the
// receiver (no datagram frame is ever sent again).
#[test]
fn a_lost_datagram_is_never_sent_again() {
    let (mut a, mut b, mut ta, mut tb, mut now) = sealed_pair();
    a.send_datagram(b"gone").unwrap();
    let lost = drain(&mut a, now);
    assert_eq!(lost.len(), 1);
    for _ in 0..50 {
        now += 100_000;
        a.handle_timeout(now, &mut ta);
        b.handle_timeout(now, &mut tb);
        for (_, f) in drain(&mut a, now) {
            assert_ne!(Frame::new_unchecked(&f[..]).kind(), FrameKind::Datagram, "sent again");
            b.handle_frame(now + 10, 0, &f, &mut tb);
        }
        for (_, f) in drain(&mut b, now) {
            a.handle_frame(now + 10, 0, &f, &mut ta);
        }
    }
    assert!(messages(&mut b).is_empty());
    assert_eq!(b.stats().datagrams_received, 0);
}

// Checks that a datagram frame taken once is refused when it comes again (replayed on the
// wire): the receiver hands it over once and counts the replay.
#[test]
fn a_replayed_datagram_is_refused() {
    let (mut a, mut b, _ta, mut tb, now) = sealed_pair();
    a.send_datagram(b"once").unwrap();
    let frames = drain(&mut a, now);
    let (link, f) = &frames[0];
    b.handle_frame(now + 10, *link, f, &mut tb);
    b.handle_frame(now + 20, *link, f, &mut tb);
    assert_eq!(messages(&mut b), vec![b"once".to_vec()]);
    assert_eq!(b.stats().replayed, 1);
}

// Checks the limits: before the handshake a datagram is refused as not connected; one byte
// more than `datagram_max` is refused as too large (and `datagram_max` itself is taken); past
// `DATAGRAMS_QUEUED_MAX` waiting, the next is refused and counted as dropped.
#[test]
fn datagrams_past_their_limits_are_refused() {
    let (mut a, _b) = connecting_as(Config::new(1, MTU), &credentials(A_NODE, SECRET), &credentials(B_NODE, SECRET));
    assert_eq!(a.send_datagram(b"early"), Err(OpError::NotConnected));
    let (mut a, _b, _ta, _tb, _now) = sealed_pair();
    let max = a.datagram_max();
    assert!(max > 1000 && max < MTU, "{max}");
    assert_eq!(a.send_datagram(&vec![1; max + 1]), Err(OpError::Limit));
    a.send_datagram(&vec![1; max]).unwrap();
    for _ in 1..DATAGRAMS_QUEUED_MAX {
        a.send_datagram(b"q").unwrap();
    }
    assert_eq!(a.send_datagram(b"q"), Err(OpError::Limit));
    assert_eq!(a.stats().datagrams_dropped, 1);
}

// Checks the receiver's room: with queues bounded at 10 message bytes, a first 8-byte datagram
// is taken and a second, which would pass the bound, is dropped and counted (a datagram is not
// held back for a later retransmission as a data frame is).
#[test]
fn a_receiver_without_room_drops_datagrams() {
    let (mut a, mut b, _ta, mut tb, now) = sealed_pair();
    events(&mut b); // the handshake's
    let mut delivery = Delivery::new(&mut b, 10, 4);
    a.send_datagram(&[1; 8]).unwrap();
    a.send_datagram(&[2; 8]).unwrap();
    for (link, f) in drain(&mut a, now) {
        b.handle_frame(now + 10, link, &f, &mut tb);
    }
    for e in events(&mut b) {
        assert!(delivery.keep(e).is_none(), "only messages");
    }
    assert_eq!(delivery.next_message(&mut b), Some(vec![1; 8]));
    assert_eq!(delivery.next_message(&mut b), None);
    assert_eq!((b.stats().datagrams_received, b.stats().datagrams_dropped), (1, 1));
}

// Checks what a receiver owes at once (`Connection::owes_now`: a driver puts its sending off
// for a round only while nothing is): nothing after a datagram arrives (datagrams are never
// acknowledged); after a data frame arrives past a gap (the frame before it lost), an
// acknowledgement and a loss report, which the frames the receiver then sends pay off.
#[test]
fn only_what_the_peer_waits_for_is_owed_at_once() {
    let (mut a, mut b, _ta, mut tb, now) = sealed_pair();
    a.send_datagram(b"alone").unwrap();
    for (link, f) in drain(&mut a, now) {
        b.handle_frame(now + 10, link, &f, &mut tb);
    }
    assert_eq!(messages(&mut b), vec![b"alone".to_vec()]);
    assert!(!b.owes_now(), "a datagram asks for nothing");
    a.send(now, &[1; 1000], OpFlags::default()).unwrap();
    a.send(now, &[2; 1000], OpFlags::default()).unwrap();
    let frames = drain(&mut a, now);
    assert_eq!(frames.len(), 2, "one frame each");
    let (link, second) = &frames[1];
    b.handle_frame(now + 20, *link, second, &mut tb);
    assert!(b.owes_now(), "a gap is reported at once");
    assert!(!drain(&mut b, now + 20).is_empty());
    assert!(!b.owes_now(), "what was owed went out");
}

/// One buffer for every link, as a driver without batches gives.
struct Buf(Vec<u8>);

impl FrameBufs for Buf {
    fn frame_buf(&mut self, _link: usize) -> &mut [u8] {
        &mut self.0
    }
}

// Checks `send_datagram_now`: on an established pair with a message already queued, the
// datagram's frame is written at once (a sealed datagram frame, opened by the peer into the
// bytes sent) and the queued message's frame comes after it from the next polls; with a
// datagram queued before, the new one is queued behind it (`None`) and both arrive in order;
// it is refused as `send_datagram` refuses (too large: `Limit`; before the handshake:
// `NotConnected`), with nothing written.
#[test]
fn a_datagram_sent_now_goes_out_at_once_ahead_of_what_is_queued() {
    let (mut a, mut b, _ta, mut tb, now) = sealed_pair();
    let mut buf = Buf(vec![0u8; 65536]);
    a.send(now, b"queued message", OpFlags::default()).unwrap();
    let t = a.send_datagram_now(now, b"now", &mut buf).unwrap().expect("written at once");
    let frame = &buf.0[..t.len()];
    assert_eq!(Frame::new_unchecked(frame).kind(), FrameKind::Datagram);
    assert!(Frame::new_unchecked(frame).sealed());
    b.handle_frame(now + 10, t.link, frame, &mut tb);
    assert_eq!(messages(&mut b), vec![b"now".to_vec()]);
    let after = drain(&mut a, now);
    assert!(after.iter().any(|(_, f)| Frame::new_unchecked(&f[..]).kind() == FrameKind::Data), "the message follows");
    for (link, f) in &after {
        b.handle_frame(now + 20, *link, f, &mut tb);
    }
    assert_eq!(messages(&mut b), vec![b"queued message".to_vec()]);

    a.send_datagram(b"first").unwrap();
    assert_eq!(a.send_datagram_now(now, b"second", &mut buf).unwrap().map(|t| t.len()), None, "queued behind");
    for (link, f) in drain(&mut a, now) {
        b.handle_frame(now + 30, link, &f, &mut tb);
    }
    assert_eq!(messages(&mut b), vec![b"first".to_vec(), b"second".to_vec()]);

    let big = vec![0u8; a.datagram_max() + 1];
    assert_eq!(a.send_datagram_now(now, &big, &mut buf).map(|t| t.is_some()), Err(OpError::Limit));
    let (mut c, _d) = connecting_as(Config::new(1, MTU), &credentials(A_NODE, SECRET), &credentials(B_NODE, SECRET));
    assert_eq!(c.send_datagram_now(now, b"early", &mut buf).map(|t| t.is_some()), Err(OpError::NotConnected));
    assert_eq!(a.stats().datagrams_sent, 3);
}
