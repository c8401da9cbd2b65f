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

/// Run a handshake between `a` and `b`, past the handshake timeout; the end states.
fn handshake(a: &Credentials, b: &Credentials) -> (Connection, Connection) {
    let (mut ca, mut cb) = connecting_as(Config::new(1, MTU), a, b);
    let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
    pump(&mut ca, &mut cb, &mut now, &mut ta, &mut tb);
    // Steps repeat and time runs out: each end's timers fire until both are closed or
    // established (bounded: the handshake timeout is 5 s).
    for _ in 0..1000 {
        let quiet = |c: &Connection| matches!(c.state(), State::Closed(_) | State::Established);
        if quiet(&ca) && quiet(&cb) {
            break;
        }
        now = [ca.poll_timeout(), cb.poll_timeout()].into_iter().flatten().min().unwrap_or(now).max(now);
        ca.handle_timeout(now, &mut ta);
        cb.handle_timeout(now, &mut tb);
        pump(&mut ca, &mut cb, &mut now, &mut ta, &mut tb);
    }
    (ca, cb)
}

// Checks identity in the handshake: an initiator that holds the fabric secret but signs with
// a key other than the one known for the node it claims to be (node 3's key, claiming node 1)
// is refused by the acceptor (AuthFailed, counted) and told so (the acceptor holds the
// exchange's key, so its refusal is sealed and proves itself). An acceptor doing the same
// cannot be told apart from someone forging its answers: the initiator ignores its
// Challenges (counted unproven) and, when the handshake runs out of time, ends refused
// (AuthFailed, counted). Neither end gets established.
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
    assert!(a.stats().unproven >= 1, "the unsigned challenges were counted: {:?}", a.stats());
    assert_ne!(b.state(), State::Established, "the impostor never gets established");
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

/// An unsealed frame of `kind` for connection `conn`, with `payload` (checksums filled), and,
/// if given, a cumulative acknowledgement in its header: what anyone who saw the connection's
/// id in clear could send.
fn forged(kind: rackwire_wire::FrameKind, conn: u32, ack: Option<u32>, payload: &[u8]) -> Vec<u8> {
    let repr = rackwire_wire::FrameRepr { kind, link: 0, conn, seq: 0, ack, ts: 0, payload_len: payload.len() as u16 };
    let mut buf = vec![0u8; repr.buffer_len()];
    let mut f = repr.emit(&mut buf);
    f.payload_mut().copy_from_slice(payload);
    f.fill_checksums();
    buf
}

/// A handshake frame like `genuine` with `change` applied to its step (its checksums filled
/// again): a forgery made from what was seen in clear.
fn altered(genuine: &[u8], change: impl FnOnce(&mut rackwire_wire::HandshakeRepr)) -> Vec<u8> {
    use rackwire_wire::{Frame, HandshakeRepr, HEADER_LEN};
    let mut h = HandshakeRepr::parse(&genuine[HEADER_LEN..]).unwrap();
    change(&mut h);
    let mut out = genuine.to_vec();
    h.emit(&mut out[HEADER_LEN..]);
    Frame::new_unchecked(&mut out[..]).fill_checksums();
    out
}

// Checks that no forged unsealed frame ends or steers a handshake (issue: one forged frame
// with the id seen in clear aborted it): while a sealed handshake runs, an attacker who sees
// every frame sends the initiator an unsealed Close and a Challenge of its own (its own
// exchange message, the signature zeroed), and, after the initiator's Proof, a Done that is
// the acceptor's own with its confirmation zeroed; it sends the acceptor an unsealed Close and
// a Proof with a made-up confirmation. Each is ignored and counted (`unproven`); neither end
// closes, the initiator is not established by the forged Done, both ends get established from
// the genuine frames, and a write lands.
#[test]
fn forged_handshake_frames_neither_end_nor_steer_a_handshake() {
    use rackwire_wire::{FrameKind, HandshakeStep};
    let (mut a, mut b) = connecting_as(Config::new(1, MTU), &credentials(A_NODE, SECRET), &credentials(B_NODE, SECRET));
    let (mut ta, mut tb) = (MemTarget::default(), MemTarget::default());
    tb.add_region(5, 55, 4096, &[A_NODE]);
    let close = |conn| forged(FrameKind::Close, conn, None, &[1]);
    // Hello a → b; the attacker answers a first, with a Close and its own Challenge.
    let (l, hello) = drain(&mut a, 0).remove(0);
    assert!(b.handle_frame(10, l, &hello, &mut tb) || b.state() == State::Handshaking);
    let (_, challenge) = drain(&mut b, 10).remove(0);
    let fake_challenge = altered(&challenge, |h| {
        h.pake = rackwire_wire::auth::Pake::start(b"attacker-guess-1234", false, b"x").1;
        h.signature = [0; 64];
    });
    assert!(!a.handle_frame(20, 0, &close(11), &mut ta), "an unsealed close proves nothing");
    assert!(!a.handle_frame(20, 0, &fake_challenge, &mut ta), "an unsigned challenge proves nothing");
    assert_eq!(a.state(), State::Handshaking, "the initiator goes on");
    assert_eq!(a.stats().unproven, 2);
    // The genuine Challenge; then the attacker tells b a Close and a Proof of its own.
    assert!(a.handle_frame(30, 0, &challenge, &mut ta), "the genuine challenge proves the acceptor");
    let (_, proof) = drain(&mut a, 30).remove(0);
    let fake_proof = altered(&proof, |h| h.proof = [7; 32]);
    let conn_b = rackwire_wire::Frame::new_unchecked(&proof[..]).conn();
    assert!(!b.handle_frame(40, 0, &close(conn_b), &mut tb));
    assert!(!b.handle_frame(40, 0, &fake_proof, &mut tb));
    assert_eq!(b.state(), State::Handshaking, "the acceptor goes on");
    assert_eq!(b.stats().unproven, 2);
    assert!(b.handle_frame(50, 0, &proof, &mut tb), "the genuine proof proves the initiator");
    assert_eq!(b.state(), State::Established);
    // b's Done, forged (no confirmation) before the genuine one reaches a.
    let (_, done) = drain(&mut b, 50).remove(0);
    let h = rackwire_wire::HandshakeRepr::parse(&done[rackwire_wire::HEADER_LEN..]).unwrap();
    assert_eq!(h.step, HandshakeStep::Done);
    assert!(!a.handle_frame(60, 0, &altered(&done, |h| h.proof = [0; 32]), &mut ta));
    assert_eq!(a.state(), State::Handshaking, "a forged Done does not establish the initiator");
    assert!(a.handle_frame(60, 0, &done, &mut ta));
    assert_eq!(a.state(), State::Established);
    let mut now = 70;
    a.write(now, TARGET, 0, &[5; 100], OpFlags::default()).unwrap();
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert_eq!(&tb.regions[&5].data[..100], &[5u8; 100][..], "the write lands");
}

// Checks that an unsealed handshake frame on an established sealed connection changes nothing
// but what its step proves: a Challenge-shaped frame carrying a cumulative acknowledgement far
// ahead (which, acted on, would mark unsent frames delivered) and a Close are ignored and
// counted (`unproven`, `unsealed`); the write in flight is still resent and lands once the genuine frames
// flow; the connection stays up.
#[test]
fn an_unsealed_frame_after_the_handshake_acknowledges_nothing() {
    use rackwire_wire::FrameKind;
    let (mut a, mut b, _ta, mut tb, mut now) = sealed_pair();
    let mut ta = MemTarget::default();
    let frames = write_frames(&mut a, now, 0x3c);
    assert!(!frames.is_empty());
    let conn_a = 11;
    let hs = {
        let mut p = vec![0u8; rackwire_wire::payload::HANDSHAKE_LEN];
        rackwire_wire::HandshakeRepr {
            step: rackwire_wire::HandshakeStep::Challenge,
            links: 1,
            mtu: MTU as u16,
            from: B_NODE,
            to: A_NODE,
            conn: 22,
            nonce: [0; 32],
            proof: [0; 32],
            ephemeral: [0; 32],
            signature: [0; 64],
            seal: true,
            pake: [0; rackwire_wire::auth::PAKE_MSG_BYTES],
        }
        .emit(&mut p);
        p
    };
    let (unproven, unsealed) = (a.stats().unproven, a.stats().unsealed);
    assert!(!a.handle_frame(now + 5, 0, &forged(FrameKind::Handshake, conn_a, Some(1_000_000), &hs), &mut ta));
    assert!(!a.handle_frame(now + 5, 0, &forged(FrameKind::Close, conn_a, Some(1_000_000), &[0]), &mut ta));
    assert_eq!((a.stats().unproven, a.stats().unsealed), (unproven + 1, unsealed + 1));
    assert_eq!(a.state(), State::Established);
    // The write's frames were "lost": what a has in flight is resent once its timers fire,
    // which only holds if the forged acknowledgement took nothing out of flight.
    let until = now + 5_000_000;
    while now < until && tb.regions[&5].data[..100] != [0x3c; 100] {
        now = a.poll_timeout().unwrap_or(now + 1000).max(now + 1);
        a.handle_timeout(now, &mut ta);
        pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    }
    assert_eq!(&tb.regions[&5].data[..100], &[0x3c; 100][..], "the write is resent and lands");
    assert_eq!((a.state(), b.state()), (State::Established, State::Established));
}

// Checks that padded probes amplify nothing before the peer proved itself: an attacker who saw
// the acceptor's connection id sends it 100 unsealed probes padded to 1400 bytes while the
// handshake runs, on a connection whose frames are to be sealed and on one whose ends turned
// sealing off. Nothing comes back for them (a frame that has not proven its sender is acted on
// only if it is a handshake step): no frame at all, where padded answers would be 1400 bytes
// each.
#[test]
fn forged_padded_probes_get_no_padded_replies() {
    for sealed in [true, false] {
        let creds = |node| if sealed { credentials(node, SECRET) } else { keys::unsealed(node, SECRET) };
        forged_padded_probes(&creds(A_NODE), &creds(B_NODE));
    }
}

fn forged_padded_probes(ca: &Credentials, cb: &Credentials) {
    use rackwire_wire::{FrameKind, ProbeRepr};
    let (mut a, mut b) = connecting_as(Config::new(1, MTU), ca, cb);
    let (l, hello) = drain(&mut a, 0).remove(0);
    let mut tb = MemTarget::default();
    b.handle_frame(0, l, &hello, &mut tb);
    let _answers = drain(&mut b, 0);
    for token in 0..100u32 {
        let mut payload = vec![0u8; 1400];
        ProbeRepr { reply: false, token, echo_ts: 0 }.emit(&mut payload);
        b.handle_frame(10, 0, &forged(FrameKind::Probe, 22, None, &payload), &mut tb);
    }
    let back: Vec<usize> = drain(&mut b, 10).iter().map(|(_, f)| f.len()).collect();
    assert!(back.is_empty(), "frames sent back for forged probes: {back:?} bytes");
}

// Checks the answers to a proven peer's padded probes (on an established connection whose
// ends turned sealing off, where any frame of the connection counts as the peer's): 100
// probes padded to 1000 bytes, taken before the connection sends anything, get at most
// `PROBE_REPLIES_MAX` replies (the rest go unanswered), each exactly as long as its probe.
#[test]
fn padded_probes_get_replies_as_long_and_no_more_than_the_bound() {
    use rackwire_proto::PROBE_REPLIES_MAX;
    use rackwire_wire::{FrameKind, ProbeRepr, HEADER_LEN};
    let (_a, mut b, _ta, mut tb, now) = rackwire_sim::pair::established(Config::new(1, MTU), SECRET, 5, 55, 4096);
    let _ = drain(&mut b, now);
    let probe_len = HEADER_LEN + 1000;
    for token in 0..100u32 {
        let mut payload = vec![0u8; 1000];
        ProbeRepr { reply: false, token, echo_ts: 0 }.emit(&mut payload);
        b.handle_frame(now, 0, &forged(FrameKind::Probe, 22, None, &payload), &mut tb);
    }
    let back: Vec<usize> = drain(&mut b, now).iter().map(|(_, f)| f.len()).collect();
    let replies = back.iter().filter(|&&len| len == probe_len).count();
    assert_eq!(replies, PROBE_REPLIES_MAX, "replies of {probe_len} bytes among {back:?}");
    assert!(back.iter().all(|&len| len <= probe_len), "a reply longer than its probe: {back:?}");
}
