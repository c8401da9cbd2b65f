//! Sealed frames and node identity in the handshake, end to end between two connections:
//! forged, replayed, foreign and unsealed frames are dropped and counted and never placed, and
//! a node that claims another node's id cannot finish a handshake.

use rackwire_proto::{CloseReason, Config, Connection, Credentials, OpFlags, RegionRef, State};
use rackwire_sim::keys::{self, credentials, identity, public_key};
use rackwire_sim::pair::{connecting_as, drain, events, pump, A_NODE, B_NODE};
use rackwire_sim::MemTarget;

const MTU: usize = 1472;
const SECRET: &[u8] = b"shared-secret";
const TARGET: RegionRef = RegionRef { region: 5, key: 55 };

/// A sealed pair, established, with region 5 (key 55) at `b` granted to `a`.
fn sealed_pair() -> (Connection, Connection, MemTarget, MemTarget, u64) {
    let (mut a, mut b) = connecting_as(Config::new(1, MTU), &credentials(A_NODE, SECRET), &credentials(B_NODE, SECRET));
    let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
    tb.add_region(5, 55, 4096, &[A_NODE]);
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert_eq!((a.state(), b.state()), (State::Established, State::Established));
    assert!(a.sealed() && b.sealed());
    (a, b, ta, tb, now)
}

/// The frames `a` sends for one 100-byte write of `byte` at offset 0.
fn write_frames(a: &mut Connection, now: u64, byte: u8) -> Vec<(usize, Vec<u8>)> {
    a.write(now, TARGET, 0, &[byte; 100], OpFlags::default()).unwrap();
    drain(a, now)
}

// Checks that a sealed write's frame with one bit of its tag flipped, or of its payload, is
// dropped (counted `forged`) and places nothing; that the payload's bytes do not appear in
// clear on the wire; and that the genuine frame, handed over after its forgeries, still lands
// (a forgery does not use up the frame's counter).
#[test]
fn a_flipped_bit_is_dropped_and_counted() {
    let (mut a, mut b, _ta, mut tb, now) = sealed_pair();
    let frames = write_frames(&mut a, now, 0xab);
    assert!(frames.iter().all(|(_, f)| !f.windows(16).any(|w| w == [0xab; 16])), "payload on the wire is ciphertext");
    let (l, f) = frames[0].clone();
    for at in [f.len() - 1, rackwire_wire::HEADER_LEN + 3] {
        let mut bad = f.clone();
        bad[at] ^= 0x04;
        let before = b.stats().forged;
        b.handle_frame(now + 10, l, &bad, &mut tb);
        assert_eq!(b.stats().forged, before + 1, "flipped byte {at} counted");
    }
    assert_eq!(&tb.regions[&5].data[..100], &[0u8; 100][..], "nothing placed");
    for (l, f) in &frames {
        b.handle_frame(now + 20, *l, f, &mut tb);
    }
    assert_eq!(&tb.regions[&5].data[..100], &[0xab; 100][..], "the genuine frame lands");
}

// Checks replays: a sealed frame handed over a second time (after its write landed and the
// owner cleared the bytes) is dropped as `replayed` and places nothing.
#[test]
fn a_replayed_frame_is_dropped_and_counted() {
    let (mut a, mut b, _ta, mut tb, now) = sealed_pair();
    let frames = write_frames(&mut a, now, 0x11);
    for (l, f) in &frames {
        b.handle_frame(now + 10, *l, f, &mut tb);
    }
    tb.regions.get_mut(&5).unwrap().data[..100].fill(0);
    for (l, f) in &frames {
        b.handle_frame(now + 30, *l, f, &mut tb);
    }
    assert_eq!(b.stats().replayed, frames.len() as u64);
    assert_eq!(&tb.regions[&5].data[..100], &[0u8; 100][..], "nothing placed again");
}

// Checks frames from elsewhere: a frame sealed by another connection between the same two
// nodes (same fabric secret, same node keys, its own handshake: its own frame keys), given the
// connection id of ours, is dropped as `forged`; a frame sent unsealed on a sealed connection
// is dropped as `unsealed`. Neither places anything.
#[test]
fn frames_from_another_connection_or_unsealed_are_dropped() {
    let (_a, mut b, _ta, mut tb, now) = sealed_pair();
    // A second pair: the frames it seals carry b's connection id once rewritten.
    let (mut a2, mut b2, mut ta2, mut tb2, mut now2) = {
        let (mut a2, mut b2) =
            connecting_as(Config::new(1, MTU), &credentials(A_NODE, SECRET), &credentials(B_NODE, SECRET));
        let (mut ta2, mut tb2, mut now2) = (MemTarget::default(), MemTarget::default(), 0);
        tb2.add_region(5, 55, 4096, &[A_NODE]);
        pump(&mut a2, &mut b2, &mut now2, &mut ta2, &mut tb2);
        (a2, b2, ta2, tb2, now2)
    };
    let frames = write_frames(&mut a2, now2, 0x77);
    for (l, f) in &frames {
        // Both pairs' acceptors have connection id 22: the frame is addressed to b already.
        b.handle_frame(now + 10, *l, f, &mut tb);
    }
    assert_eq!(b.stats().forged, frames.len() as u64);
    // An unsealed pair's frame, likewise addressed.
    let (mut a3, mut b3) =
        connecting_as(Config::new(1, MTU), &keys::unsealed(A_NODE, SECRET), &keys::unsealed(B_NODE, SECRET));
    let (mut ta3, mut tb3, mut now3) = (MemTarget::default(), MemTarget::default(), 0);
    tb3.add_region(5, 55, 4096, &[A_NODE]);
    pump(&mut a3, &mut b3, &mut now3, &mut ta3, &mut tb3);
    assert!(!a3.sealed());
    let plain = write_frames(&mut a3, now3, 0x66);
    for (l, f) in &plain {
        b.handle_frame(now + 20, *l, f, &mut tb);
    }
    assert_eq!(b.stats().unsealed, plain.len() as u64);
    assert_eq!(&tb.regions[&5].data[..100], &[0u8; 100][..], "nothing placed");
    // The second pair itself works: its own frames land at its own acceptor.
    for (l, f) in &frames {
        b2.handle_frame(now2 + 10, *l, f, &mut tb2);
    }
    pump(&mut a2, &mut b2, &mut now2, &mut ta2, &mut tb2);
    assert_eq!(&tb2.regions[&5].data[..100], &[0x77; 100][..]);
}

/// Run a handshake between `a` and `b`; the end states.
fn handshake(a: &Credentials, b: &Credentials) -> (Connection, Connection) {
    let (mut ca, mut cb) = connecting_as(Config::new(1, MTU), a, b);
    let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
    pump(&mut ca, &mut cb, &mut now, &mut ta, &mut tb);
    (ca, cb)
}

// Checks identity in the handshake: an initiator that holds the fabric secret but signs with
// a key other than the one known for the node it claims to be (node 3's key, claiming node 1)
// is refused by the acceptor (AuthFailed, counted); an acceptor doing the same is refused by
// the initiator. Neither end gets established.
#[test]
fn a_handshake_claiming_another_nodes_id_fails() {
    let impostor = Credentials::new(SECRET, identity(3));
    let (a, b) = handshake(&impostor, &credentials(B_NODE, SECRET));
    assert_eq!(b.state(), State::Closed(CloseReason::AuthFailed));
    assert_eq!(b.stats().handshakes_refused, 1);
    assert_eq!(a.state(), State::Closed(CloseReason::Peer(1)), "the impostor is told");
    let (a, b) = handshake(&credentials(A_NODE, SECRET), &impostor);
    assert_eq!(a.state(), State::Closed(CloseReason::AuthFailed));
    assert_eq!(a.stats().handshakes_refused, 1);
    assert_eq!(b.state(), State::Closed(CloseReason::Peer(1)), "the impostor is told");
    // A wrong fabric secret with the right key fails too.
    let (_a, b) = handshake(&credentials(A_NODE, b"other-secret"), &credentials(B_NODE, SECRET));
    assert_ne!(b.state(), State::Established);
}

// Checks what is agreed about sealing: frames are sealed when either end wants it, and go
// unsealed only when both ends turned it off; each way a write lands.
#[test]
fn frames_are_sealed_unless_both_ends_turn_it_off() {
    for (sa, sb, sealed) in [(true, true, true), (true, false, true), (false, true, true), (false, false, false)] {
        let ca = Credentials { seal: sa, ..credentials(A_NODE, SECRET) };
        let cb = Credentials { seal: sb, ..credentials(B_NODE, SECRET) };
        let (mut a, mut b) = connecting_as(Config::new(1, MTU), &ca, &cb);
        let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
        tb.add_region(5, 55, 4096, &[A_NODE]);
        pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
        assert_eq!((a.sealed(), b.sealed()), (sealed, sealed), "{sa} {sb}");
        a.write(now, TARGET, 0, &[9; 3000], OpFlags::default()).unwrap();
        pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
        assert_eq!(&tb.regions[&5].data[..3000], &[9u8; 3000][..]);
        assert!(!events(&mut a).is_empty());
        assert_eq!(public_key(A_NODE), identity(A_NODE).public());
    }
}

// Checks what a spoofed first frame buys (a reflector must not amplify): an acceptor that gets
// one Hello, and never hears from the caller again, sends back at most 3x the Hello's bytes
// (one Challenge of the same size) over 15 s of timers, and drops the connection once its
// handshake timeout (5 s) passes.
#[test]
fn a_spoofed_first_frame_is_not_amplified() {
    let (mut a, mut b) = connecting_as(Config::new(2, MTU), &credentials(A_NODE, SECRET), &credentials(B_NODE, SECRET));
    let (l, hello) = drain(&mut a, 0).remove(0);
    let mut tb = MemTarget::default();
    b.handle_frame(0, l, &hello, &mut tb);
    let (mut back, mut buf) = (0, vec![0u8; 65536]);
    let mut closed_at = None;
    for now in (0..15_000_000u64).step_by(1_000) {
        if b.poll_timeout().is_some_and(|t| t <= now) {
            b.handle_timeout(now, &mut tb);
        }
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            back += t.len;
        }
        if closed_at.is_none() && matches!(b.state(), State::Closed(_)) {
            closed_at = Some(now);
        }
    }
    assert!(back > 0 && back <= 3 * hello.len(), "{back} bytes back for a {}-byte first frame", hello.len());
    let closed_at = closed_at.expect("the acceptor gives the handshake up");
    assert!((5_000_000..5_100_000).contains(&closed_at), "closed at {closed_at} µs");
}
