//! The protocol core driven by hand: authentication (wrong secret, replayed proof), damaged
//! input, refusals with reasons, atomics, reads and message limits.

use rackwire_proto::{
    AtomicOp, Completion, Config, Connection, Event, OpError, OpFlags, Refusal, RegionRef, State, Time,
};
use rackwire_sim::net::LinkParams;
use rackwire_sim::pair::{connecting, drain, established, events, messages, pump};
use rackwire_sim::world::node_id;
use rackwire_sim::{keys, MemTarget, World};

const MTU: usize = 1472;

// Checks that a node with the wrong secret cannot connect: the initiator finds the acceptor's
// proof wrong and closes with AuthFailed, the acceptor is told, neither is ever established.
#[test]
fn wrong_secret_fails_the_handshake_on_both_sides() {
    let cfg = Config::new(1, MTU);
    let (mut a, mut b) = connecting(cfg, b"secret-one", b"secret-two");
    let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert!(events(&mut a).contains(&Event::Closed(rackwire_proto::CloseReason::AuthFailed)));
    assert!(matches!(a.state(), State::Closed(_)));
    assert!(matches!(b.state(), State::Closed(_) | State::Handshaking));
    assert!(!events(&mut b).iter().any(|e| matches!(e, Event::Connected { .. })));
}

// Checks replay protection: the initiator's frames from a successful handshake, replayed to a
// fresh acceptor (which draws a new nonce), do not get the replayer in.
#[test]
fn replayed_handshake_is_refused() {
    let cfg = Config::new(1, MTU);
    let (mut a, mut b) = connecting(cfg.clone(), b"shared-secret", b"shared-secret");
    let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
    let recorded = pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert_eq!(a.state(), State::Established);
    assert_eq!(b.state(), State::Established);
    let mut fresh =
        Connection::accept(cfg, 2, &keys::unsealed(2, b"shared-secret"), 1, keys::public_key(1), [3; 32], 33, now);
    for (link, frame) in &recorded {
        fresh.handle_frame(now, *link, frame, &mut tb);
        let mut buf = vec![0u8; 65536];
        while fresh.poll_transmit(now, &mut buf).is_some() {}
    }
    assert_ne!(fresh.state(), State::Established, "a replayed proof must not pass against a new nonce");
    assert!(!events(&mut fresh).iter().any(|e| matches!(e, Event::Connected { .. })));
}

// Checks that damaged and foreign input is counted and dropped without effect: random bytes,
// a valid frame with one bit flipped, a frame for another connection id.
#[test]
fn damaged_frames_are_counted_and_dropped() {
    let cfg = Config::new(1, MTU);
    let (mut a, mut b) = connecting(cfg, b"shared-secret", b"shared-secret");
    let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    let before = b.stats().malformed;
    b.handle_frame(now, 0, b"definitely not a frame", &mut tb);
    a.write(now, RegionRef { region: 9, key: 9 }, 0, b"x", OpFlags::default()).unwrap();
    let mut buf = vec![0u8; 65536];
    let t = a.poll_transmit(now, &mut buf).expect("a data frame");
    let mut bad = buf[..t.len].to_vec();
    bad[40] ^= 0x04;
    b.handle_frame(now, 0, &bad, &mut tb);
    let mut foreign = buf[..t.len].to_vec();
    foreign[8..12].copy_from_slice(&999u32.to_be_bytes());
    b.handle_frame(now, 0, &foreign, &mut tb);
    b.handle_frame(now, 7, &buf[..t.len], &mut tb);
    assert_eq!(b.stats().malformed, before + 4);
    assert_eq!(b.state(), State::Established);
}

// Checks the zero-copy send path: every data frame of a `write_bytes` operation hands out, as
// its body, a range of the very allocation the caller gave (pointer inside it), the header
// part carries the rest of the frame, and the frames joined head to body are valid frames
// that place the bytes exactly at the target.
#[test]
fn write_bytes_frames_carry_the_callers_bytes() {
    let cfg = Config::new(1, MTU);
    let (mut a, mut b) = connecting(cfg, b"shared-secret", b"shared-secret");
    let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
    tb.add_region(5, 55, 16384, &[1]);
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let bytes = rackwire_proto::Bytes::from(data.clone());
    let range = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
    a.write_bytes(now, RegionRef { region: 5, key: 55 }, 100, bytes, OpFlags::default()).unwrap();
    let mut head = vec![0u8; 65536];
    let mut bodies = 0;
    while let Some(t) = a.poll_transmit_to(now, &mut &mut head[..]) {
        let mut frame = head[..t.head_len].to_vec();
        if let Some(body) = &t.body {
            assert!(range.contains(&(body.as_ptr() as usize)), "a frame body outside the caller's bytes");
            frame.extend_from_slice(body);
            bodies += 1;
        }
        assert_eq!(frame.len(), t.len());
        b.handle_frame(now + 10, t.link, &frame, &mut tb);
    }
    assert!(bodies >= 10_000 / MTU, "{bodies} data frames for 10000 bytes");
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert_eq!(&tb.regions[&5].data[100..10_100], &data[..]);
    assert!(events(&mut a).iter().any(|e| matches!(e, Event::Completed { result: Ok(Completion::Done), .. })));
}

/// Two established connections with a region (id 5, key 55, `len` bytes) at `b`.
fn pair(cfg: Config, len: usize) -> (Connection, Connection, MemTarget, MemTarget, Time) {
    established(cfg, b"shared-secret", 5, 55, len)
}

// Checks the short segment header: a write's first frame carries the full 56-byte segment
// header and its later frames the 12-byte one (44 more body bytes each, every frame within the
// MTU, less the room of a sealed frame's trailer: these frames go unsealed); delivered last-first, the later frames are kept (counted as stashed) until the first
// arrives, then all bytes land exactly and the write completes.
#[test]
fn later_fragments_ahead_of_the_first_are_kept_and_placed() {
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(Config::new(1, MTU), 16384);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 13 + 1) as u8).collect();
    a.write(now, RegionRef { region: 5, key: 55 }, 7, &data, OpFlags::default()).unwrap();
    let frames = drain(&mut a, now);
    let lens: Vec<usize> = frames.iter().map(|(_, f)| f.len()).collect();
    let header = rackwire_wire::HEADER_LEN;
    let full = MTU - rackwire_proto::TRAILER_LEN;
    assert_eq!(lens[0], full, "first frame full: {lens:?}");
    assert_eq!(lens[1], full, "later frames full too: {lens:?}");
    let bodies: usize = lens[1..].iter().map(|l| l - header - rackwire_wire::SEGMENT_SHORT_LEN).sum::<usize>()
        + (lens[0] - header - rackwire_wire::SEGMENT_LEN);
    assert_eq!(bodies, data.len(), "body bytes add up to the write");
    for (link, f) in frames.iter().rev() {
        b.handle_frame(now + 10, *link, f, &mut tb);
    }
    assert_eq!(b.stats().stashed, frames.len() as u64 - 1);
    assert_eq!(b.stats().malformed, 0);
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert_eq!(&tb.regions[&5].data[7..10_007], &data[..]);
    assert!(events(&mut a).iter().any(|e| matches!(e, Event::Completed { result: Ok(Completion::Done), .. })));
}

/// `a` writes `data` at the start of region 5 of `b` (as `pair` sets it up) with a
/// notification, and `b` takes the frames and its events.
fn write_notified(
    a: &mut Connection,
    b: &mut Connection,
    tb: &mut MemTarget,
    now: &mut Time,
    data: &[u8],
) -> Vec<Event> {
    let notify = OpFlags { notify: Some(1), ..OpFlags::default() };
    a.write(*now, RegionRef { region: 5, key: 55 }, 0, data, notify).unwrap();
    for (link, f) in drain(a, *now) {
        b.handle_frame(*now + 10, link, &f, tb);
    }
    *now += 10;
    events(b)
}

// Checks the two ways a write is placed at the target: alone and whole in its frame it is
// placed and answered at once, in the middle of a write that comes in pieces it is tracked like
// one; both must end the same way. A 3000-byte write (three frames) is started by its first
// frame only; a whole 5-byte write with a notification, arriving then, lands, completes and
// notifies (only) with its own place and immediate; the rest of the large write then lands and
// completes it. Alone again, a whole write refused (out of bounds) answers with the reason,
// places nothing and notifies nothing, and a good one notifies once with its place.
#[test]
fn whole_writes_alone_or_beside_one_in_pieces_end_the_same() {
    let (mut a, mut b, mut ta, mut tb, now) = pair(Config::new(1, MTU), 8192);
    events(&mut a);
    events(&mut b);
    let r = RegionRef { region: 5, key: 55 };
    let big: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let big_op = a.write(now, r, 100, &big, OpFlags::default()).unwrap();
    let notify = |imm| OpFlags { notify: Some(imm), ..OpFlags::default() };
    let small_op = a.write(now, r, 5000, b"hello", notify(9)).unwrap();
    let frames = drain(&mut a, now);
    assert_eq!(frames.len(), 4, "three frames of the large write, one of the small");
    b.handle_frame(now + 10, frames[0].0, &frames[0].1, &mut tb);
    b.handle_frame(now + 10, frames[3].0, &frames[3].1, &mut tb);
    assert_eq!(&tb.regions[&5].data[5000..5005], b"hello");
    let got = events(&mut b);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(matches!(got[0], Event::Notification { region: 5, offset: 5000, len: 5, imm: 9 }), "{got:?}");
    for (link, f) in &frames[1..3] {
        b.handle_frame(now + 10, *link, f, &mut tb);
    }
    assert_eq!(&tb.regions[&5].data[100..3100], &big[..]);
    let mut now = now + 10;
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    let done: Vec<u32> = events(&mut a)
        .into_iter()
        .filter_map(|e| match e {
            Event::Completed { op, result: Ok(Completion::Done) } => Some(op),
            _ => None,
        })
        .collect();
    assert!(done.contains(&big_op) && done.contains(&small_op) && done.len() == 2, "{done:?}");

    let bad = a.write(now, r, 8190, b"past the end", notify(10)).unwrap();
    let good = a.write(now, r, 0, b"fits", notify(11)).unwrap();
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    let got = events(&mut b);
    assert_eq!(got.len(), 1, "only the good write notifies: {got:?}");
    assert!(matches!(got[0], Event::Notification { region: 5, offset: 0, len: 4, imm: 11 }), "{got:?}");
    assert!(tb.regions[&5].data[8190..].iter().all(|&x| x == 0), "the refused write placed nothing");
    assert_eq!(&tb.regions[&5].data[..4], b"fits");
    let got = events(&mut a);
    let outcome = |op| {
        got.iter().find_map(|e| match e {
            Event::Completed { op: o, result } if *o == op => Some(result.clone()),
            _ => None,
        })
    };
    assert_eq!(outcome(bad), Some(Err(OpError::Refused(Refusal::OutOfBounds { region_len: 8192 }))));
    assert_eq!(outcome(good), Some(Ok(Completion::Done)));
}

// Checks that a held answer rides in the next data frame: once `b` has the notification of
// `a`'s write and holds answers (as a driver does when it hands the application a
// notification), it sends nothing alone; its own write then goes as one frame that carries the
// answer too, and from that one frame `a` learns its write completed and is notified of `b`'s.
#[test]
fn a_held_answer_rides_in_the_next_write() {
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(Config::new(1, MTU), 4096);
    ta.add_region(6, 66, 4096, &[2]);
    let got = write_notified(&mut a, &mut b, &mut tb, &mut now, b"ping");
    assert!(got.iter().any(|e| matches!(e, Event::Notification { imm: 1, .. })), "{got:?}");
    b.hold_answers(now + 100);
    assert!(drain(&mut b, now).is_empty(), "a held answer does not go alone");
    assert!(b.poll_timeout().is_some_and(|t| t <= now + 100), "the hold's end is a timer");
    let notify = OpFlags { notify: Some(2), ..OpFlags::default() };
    b.write(now, RegionRef { region: 6, key: 66 }, 0, b"pong", notify).unwrap();
    let frames = drain(&mut b, now);
    assert_eq!(frames.len(), 1, "answer and write in one frame");
    assert_eq!(b.stats().answers_packed, 1);
    a.handle_frame(now + 10, frames[0].0, &frames[0].1, &mut ta);
    let got = events(&mut a);
    assert!(got.iter().any(|e| matches!(e, Event::Completed { result: Ok(Completion::Done), .. })), "{got:?}");
    assert!(got.iter().any(|e| matches!(e, Event::Notification { imm: 2, .. })), "{got:?}");
    assert_eq!(&tb.regions[&5].data[..4], b"ping");
    assert_eq!(&ta.regions[&6].data[..4], b"pong");
}

// Checks that a hold ends: `b` holds its answer and has nothing of its own to send; before
// the hold's time nothing goes, at it the answer goes alone and `a`'s write completes.
#[test]
fn a_hold_ends_and_the_answer_goes_alone() {
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(Config::new(1, MTU), 4096);
    write_notified(&mut a, &mut b, &mut tb, &mut now, b"ping");
    b.hold_answers(now + 100);
    assert!(drain(&mut b, now + 99).is_empty());
    let frames = drain(&mut b, now + 100);
    assert_eq!(frames.len(), 1);
    assert_eq!(b.stats().answers_packed, 0);
    a.handle_frame(now + 110, frames[0].0, &frames[0].1, &mut ta);
    assert!(events(&mut a).iter().any(|e| matches!(e, Event::Completed { result: Ok(Completion::Done), .. })));
}

// Checks that answers owed at once pack together: `a` sends three writes before `b` answers;
// `b`'s answers go as one frame, and each of `a`'s writes completes.
#[test]
fn answers_owed_together_share_a_frame() {
    let (mut a, mut b, mut ta, mut tb, now) = pair(Config::new(1, MTU), 4096);
    for i in 0..3u64 {
        a.write(now, RegionRef { region: 5, key: 55 }, i * 8, b"abcdefgh", OpFlags::default()).unwrap();
    }
    for (link, f) in drain(&mut a, now) {
        b.handle_frame(now + 10, link, &f, &mut tb);
    }
    let frames = drain(&mut b, now + 10);
    assert_eq!(frames.len(), 1, "three answers, one frame");
    assert_eq!(b.stats().answers_packed, 2);
    a.handle_frame(now + 20, frames[0].0, &frames[0].1, &mut ta);
    let done =
        events(&mut a).iter().filter(|e| matches!(e, Event::Completed { result: Ok(Completion::Done), .. })).count();
    assert_eq!(done, 3);
}

// Checks the stash's bound and that nothing is lost past it: with jumbo frames and a wide
// window, a 12 MiB write whose first frame is held back fills the 8 MiB stash; the frames past
// it are dropped unacknowledged (counted), the sender resends them after its timeouts, and the
// write completes with every byte in place.
#[test]
fn a_full_stash_drops_unacknowledged_and_nothing_is_lost() {
    let mtu = 65_000;
    let mut cfg = Config::new(1, mtu);
    cfg.link_window_initial = 1024;
    cfg.link_window_max = 1024;
    let len = 12 << 20;
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(cfg, len);
    let data: Vec<u8> = (0..len as u32).map(|i| (i ^ (i >> 9)) as u8).collect();
    a.write(now, RegionRef { region: 5, key: 55 }, 0, &data, OpFlags::default()).unwrap();
    let frames = drain(&mut a, now);
    assert!(frames.len() * mtu > len, "the whole write went out at once ({} frames)", frames.len());
    for (link, f) in &frames[1..] {
        b.handle_frame(now + 10, *link, f, &mut tb);
    }
    assert!(b.stats().stash_full > 0, "the stash filled");
    assert!(b.stats().stashed * (mtu as u64) <= rackwire_proto::STASH_BYTES_MAX as u64 + mtu as u64);
    b.handle_frame(now + 10, frames[0].0, &frames[0].1, &mut tb);
    let mut done = false;
    for _ in 0..200 {
        pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
        done |= events(&mut a).iter().any(|e| matches!(e, Event::Completed { result: Ok(Completion::Done), .. }));
        if done {
            break;
        }
        now += 5_000;
        a.handle_timeout(now, &mut ta);
        b.handle_timeout(now, &mut tb);
    }
    assert!(done, "the write completed");
    assert!(a.stats().retransmits > 0);
    assert!(tb.regions[&5].data == data, "every byte in place");
}

// Checks that a later fragment naming an operation whose first fragment never comes is
// dropped (counted malformed) once every frame before it has arrived, so a faulty peer cannot
// pin stash memory: a forged later fragment for op 777 is kept, then dropped when the frame
// before it arrives.
#[test]
fn orphan_later_fragments_are_dropped() {
    let (mut a, mut b, _ta, mut tb, now) = pair(Config::new(1, MTU), 16384);
    a.write(now, RegionRef { region: 5, key: 55 }, 0, &[9u8; 5000], OpFlags::default()).unwrap();
    let frames = drain(&mut a, now);
    let mut forged = frames[1].1.clone();
    {
        let mut f = rackwire_wire::Frame::new_checked(&mut forged[..]).unwrap();
        f.payload_mut()[..4].copy_from_slice(&777u32.to_be_bytes());
        f.fill_checksums();
    }
    b.handle_frame(now + 10, 0, &forged, &mut tb);
    assert_eq!(b.stats().stashed, 1);
    assert_eq!(b.stats().malformed, 0);
    b.handle_frame(now + 10, 0, &frames[0].1, &mut tb);
    assert_eq!(b.stats().malformed, 1, "the orphan is dropped once the frame before it arrived");
}

// Checks the undo of a needless window cut: a frame held back (not lost) is declared lost by
// the timeout and resent, cutting its link's window; when the original then arrives and the
// resent copy arrives second, the receiver reports the duplicate, and the sender restores the
// window it had before the cut (counted in `undone_cuts`). The write completes exactly.
#[test]
fn a_cut_for_a_frame_that_arrived_after_all_is_undone() {
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(Config::new(1, MTU), 32768);
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 5 + 2) as u8).collect();
    a.write(now, RegionRef { region: 5, key: 55 }, 0, &data, OpFlags::default()).unwrap();
    let frames = drain(&mut a, now);
    assert!(frames.len() > 8, "{} frames", frames.len());
    let before = a.stats().links[0].window;
    let held = frames[3].clone();
    for (i, (link, f)) in frames.iter().enumerate() {
        if i != 3 {
            b.handle_frame(now + 10, *link, f, &mut tb);
        }
    }
    let mut buf = vec![0u8; 65536];
    while let Some(t) = b.poll_transmit(now + 10, &mut buf) {
        a.handle_frame(now + 20, t.link, &buf[..t.len], &mut ta);
    }
    now += 2_000_000;
    a.handle_timeout(now, &mut ta);
    let resent = drain(&mut a, now);
    let stats = a.stats().links[0];
    assert_eq!(stats.losses, 1, "only the held frame was declared lost");
    assert!(stats.window < before, "the loss cut the window ({} -> {})", before, stats.window);
    b.handle_frame(now + 10, held.0, &held.1, &mut tb);
    for (link, f) in &resent {
        b.handle_frame(now + 10, *link, f, &mut tb);
    }
    assert!(b.stats().duplicates >= 1, "the resent copy arrived second");
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    let stats = a.stats().links[0];
    assert_eq!(stats.undone_cuts, 1);
    assert!(stats.window >= before, "window back to {} (was {})", stats.window, before);
    assert_eq!(&tb.regions[&5].data[..20_000], &data[..]);
    assert!(events(&mut a).iter().any(|e| matches!(e, Event::Completed { result: Ok(Completion::Done), .. })));
}

fn two(region_len: usize) -> World {
    let mut w = World::new(
        3,
        2,
        2,
        |_, _, _| LinkParams::clean(20, 1_000_000_000, MTU),
        |m| {
            let mut c = Config::new(m.len(), MTU);
            c.mtu = m;
            c
        },
    );
    w.targets[1].add_region(1, 77, region_len, &[node_id(0)]);
    w.targets[1].add_region(2, 88, 64, &[]);
    w
}

fn run_op(
    w: &mut World,
    submit: impl FnOnce(&mut Connection, Time) -> Result<u32, OpError>,
) -> Result<Completion, OpError> {
    let now = w.now;
    let op = w.submit(0, 1, |c| submit(c, now))?;
    w.flush();
    let mut out = None;
    w.run_while(w.now + 1_000_000, |w| {
        for (_, node, _, e) in w.take_events() {
            if let (0, Event::Completed { op: o, result }) = (node, e) {
                if o == op {
                    out = Some(result);
                }
            }
        }
        out.is_some()
    });
    out.expect("operation completed")
}

// Checks refusals end to end: each bad access completes with its own reason at the initiator
// (with its detail: an out-of-bounds one brings the region's length back), is counted on both
// sides, and leaves the target's bytes untouched.
#[test]
fn refusals_come_back_with_their_reason() {
    let mut w = two(4096);
    let good = RegionRef { region: 1, key: 77 };
    let cases = [
        (RegionRef { region: 1, key: 78 }, 0u64, Refusal::BadKey),
        (RegionRef { region: 5, key: 77 }, 0, Refusal::UnknownRegion),
        (RegionRef { region: 2, key: 88 }, 0, Refusal::Ungranted { needed: 0 }),
        (good, 4000, Refusal::OutOfBounds { region_len: 4096 }),
    ];
    for (target, offset, why) in cases {
        let r = run_op(&mut w, |c, now| c.write(now, target, offset, &[0xab; 200], OpFlags::default()));
        assert_eq!(r, Err(OpError::Refused(why)));
    }
    let r = run_op(&mut w, |c, now| c.atomic(now, good, 4, AtomicOp::FetchAdd(1), OpFlags::default()));
    assert_eq!(r, Err(OpError::Refused(Refusal::Misaligned)));
    assert_eq!(w.conn(0, 1).stats().refused, 5);
    assert_eq!(w.conn(1, 0).stats().refused_here, 5);
    assert!(w.targets[1].regions[&1].data.iter().all(|&b| b == 0), "refused writes placed nothing");
}

// Checks compare-and-swap (succeeds only on the expected value, returns the old one), reads of
// a multi-frame range, and the local refusal of a message over the limit.
#[test]
fn atomics_reads_and_limits() {
    let mut w = two(1 << 20);
    let r = RegionRef { region: 1, key: 77 };
    let cas = |exp, new| AtomicOp::CompareSwap { expected: exp, new };
    assert_eq!(run_op(&mut w, |c, n| c.atomic(n, r, 8, cas(0, 5), OpFlags::default())), Ok(Completion::Value(0)));
    assert_eq!(run_op(&mut w, |c, n| c.atomic(n, r, 8, cas(0, 9), OpFlags::default())), Ok(Completion::Value(5)));
    assert_eq!(
        run_op(&mut w, |c, n| c.atomic(n, r, 8, AtomicOp::FetchAdd(10), OpFlags::default())),
        Ok(Completion::Value(5))
    );
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(run_op(&mut w, |c, n| c.write(n, r, 1000, &data, OpFlags::default())), Ok(Completion::Done));
    assert_eq!(
        run_op(&mut w, |c, n| c.read(n, r, 1000, data.len() as u64, OpFlags::default())),
        Ok(Completion::Data(data))
    );
    let now = w.now;
    let too_big = vec![0u8; rackwire_proto::MESSAGE_BYTES_MAX + 1];
    assert_eq!(w.conn(0, 1).send(now, &too_big, OpFlags::default()), Err(OpError::Limit));
}

// Checks closing: the side that closes fails its pending operations with Closed, the peer
// learns of it (Closed with the normal code) and refuses new operations.
#[test]
fn close_tells_the_peer_and_fails_pending_operations() {
    let mut w = two(4096);
    assert!(w.run_while(1_000_000, |w| w.conn(1, 0).state() == State::Established));
    let now = w.now;
    let op =
        w.submit(0, 1, |c| c.write(now, RegionRef { region: 1, key: 77 }, 0, &[1; 100], OpFlags::default())).unwrap();
    w.conn(0, 1).close(now);
    w.flush();
    w.run_until(w.now + 10_000);
    let ev = w.take_events();
    assert!(ev.iter().any(|(_, n, _, e)| *n == 0 && *e == Event::Completed { op, result: Err(OpError::Closed) }));
    assert!(
        ev.iter().any(|(_, n, _, e)| *n == 1 && *e == Event::Closed(rackwire_proto::CloseReason::Peer(0))),
        "{ev:?}"
    );
    let now = w.now;
    assert_eq!(
        w.submit(1, 0, |c| c.write(now, RegionRef { region: 1, key: 1 }, 0, &[1], OpFlags::default())),
        Err(OpError::Closed),
        "the endpoint refuses operations on a closed connection"
    );
}

// Checks the frame size agreed in the handshake: an initiator whose links take 8972-byte
// frames and an acceptor whose links take 1472 both settle on 1472; the initiator's write and
// the acceptor's read answer then go in frames no larger than that (the large side alone would
// cut 8972-byte frames), and the write lands whole.
#[test]
fn ends_with_different_mtus_agree_on_the_smaller() {
    let mut a = Connection::connect(
        Config::new(2, 8972),
        1,
        2,
        &keys::unsealed(1, b"shared-secret"),
        keys::public_key(2),
        [1; 32],
        11,
        0,
    );
    let mut b = Connection::accept(
        Config::new(2, MTU),
        2,
        &keys::unsealed(2, b"shared-secret"),
        1,
        keys::public_key(1),
        [2; 32],
        22,
        0,
    );
    let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
    tb.add_region(5, 55, 65536, &[1]);
    assert_eq!(a.frame_max(), 8972, "before the handshake: its own links' size");
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert_eq!(a.state(), State::Established);
    assert_eq!((a.frame_max(), b.frame_max()), (MTU, MTU));
    let data: Vec<u8> = (0..30_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let target = RegionRef { region: 5, key: 55 };
    a.write(now, target, 0, &data, OpFlags::default()).unwrap();
    let frames = drain(&mut a, now);
    assert!(frames.len() > 20 && frames.iter().all(|(_, f)| f.len() <= MTU), "{} frames", frames.len());
    for (link, f) in &frames {
        b.handle_frame(now + 10, *link, f, &mut tb);
    }
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    events(&mut a);
    a.read(now, target, 0, data.len() as u64, OpFlags::default()).unwrap();
    for (link, f) in drain(&mut a, now) {
        b.handle_frame(now + 10, link, &f, &mut tb);
    }
    now += 10;
    let answers = drain(&mut b, now);
    assert!(answers.len() > 20 && answers.iter().all(|(_, f)| f.len() <= MTU), "{} answers", answers.len());
    for (link, f) in &answers {
        a.handle_frame(now + 10, *link, f, &mut ta);
    }
    assert_eq!(&tb.regions[&5].data[..data.len()], &data[..]);
    let got = events(&mut a).into_iter().find_map(|e| match e {
        Event::Completed { result: Ok(Completion::Data(d)), .. } => Some(d),
        _ => None,
    });
    assert_eq!(got.as_deref(), Some(&data[..]), "the read brings the bytes back");
}

// Checks that windows, counted in frames, follow the agreed frame size: an end set up for
// 8972-byte frames that agrees on 1472 with its peer starts its links' windows 8972/1472 times
// larger (64 frames become 390), so as many bytes go in flight as it was set up for: a 200 KB
// write leaves in one go (about 140 frames; 64 with the window of its own frame size). The end
// whose frames were agreed keeps its window.
#[test]
fn windows_follow_the_agreed_frame_size() {
    let mut a = Connection::connect(
        Config::new(1, 8972),
        1,
        2,
        &keys::unsealed(1, b"shared-secret"),
        keys::public_key(2),
        [1; 32],
        11,
        0,
    );
    let mut b = Connection::accept(
        Config::new(1, MTU),
        2,
        &keys::unsealed(2, b"shared-secret"),
        1,
        keys::public_key(1),
        [2; 32],
        22,
        0,
    );
    let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
    tb.add_region(5, 55, 1 << 20, &[1]);
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert_eq!(a.state(), State::Established);
    let initial = Config::new(1, MTU).link_window_initial as u64;
    assert_eq!(a.stats().links[0].window, initial * 8972 / MTU as u64);
    assert_eq!(b.stats().links[0].window, initial);
    let data = vec![0x3cu8; 200_000];
    a.write(now, RegionRef { region: 5, key: 55 }, 0, &data, OpFlags::default()).unwrap();
    let frames = drain(&mut a, now);
    let carried: usize = frames.iter().map(|(_, f)| f.len()).sum();
    assert!(frames.len() > 130 && carried > data.len(), "{} frames, {carried} bytes", frames.len());
    for (link, f) in &frames {
        b.handle_frame(now + 10, *link, f, &mut tb);
    }
    assert_eq!(&tb.regions[&5].data[..data.len()], &data[..]);
}

// Checks that a receiver that does not read holds its sender back and loses nothing. With
// room for 3000 message bytes, ten 1000-byte messages are sent at once: three are handed over,
// the frames of the other seven are dropped unacknowledged (counted as `receiver_full`) and
// their sends stay open. Once there is room again (a driver gives it back as the application
// reads), the sender's timers send them again and all seven follow, in order, and every send
// completes. Notifications likewise: with room for one, of two notifying writes (one after
// the other) the second waits, its bytes not placed, until the first is taken.
#[test]
fn a_receiver_that_does_not_read_holds_its_sender_back() {
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(Config::new(1, MTU), 4096);
    events(&mut a);
    events(&mut b);
    let completed =
        |c: &mut Connection| events(c).iter().filter(|e| matches!(e, Event::Completed { result: Ok(_), .. })).count();
    // Until quiet, firing timers as they fall due; what each side handed over.
    let settle = |a: &mut Connection, b: &mut Connection, now: &mut Time, ta: &mut MemTarget, tb: &mut MemTarget| {
        let (mut got, mut done) = (Vec::new(), 0);
        for _ in 0..200 {
            pump(a, b, now, ta, tb);
            got.extend(messages(b));
            done += completed(a);
            *now += 5_000;
            for (c, t) in [(&mut *a, &mut *ta), (&mut *b, &mut *tb)] {
                if c.poll_timeout().is_some_and(|d| d <= *now) {
                    c.handle_timeout(*now, t);
                }
            }
        }
        (got, done)
    };
    b.set_delivery_room(3000, 1);
    for i in 0..10u8 {
        a.send(now, &[i; 1000], OpFlags::default()).unwrap();
    }
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    let first = messages(&mut b);
    assert_eq!(first.len(), 3, "room for three");
    assert!(b.stats().receiver_full >= 7, "{} frames held back", b.stats().receiver_full);
    assert_eq!(completed(&mut a), 3, "only the delivered sends complete");
    b.set_delivery_room(usize::MAX, 1);
    let (rest, done) = settle(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    let all: Vec<u8> = first.iter().chain(&rest).map(|m| m[0]).collect();
    assert_eq!(all, (0..10).collect::<Vec<u8>>(), "every message once, in order");
    assert_eq!(done, 7);

    let r = RegionRef { region: 5, key: 55 };
    let notify = |imm| OpFlags { notify: Some(imm), ..OpFlags::default() };
    a.write(now, r, 0, b"one", notify(1)).unwrap();
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    a.write(now, r, 8, b"two", notify(2)).unwrap();
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    let got = events(&mut b);
    assert!(matches!(got[..], [Event::Notification { imm: 1, .. }]), "{got:?}");
    assert_eq!(&tb.regions[&5].data[8..11], &[0, 0, 0], "the second write waits");
    b.set_delivery_room(usize::MAX, 1);
    settle(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert_eq!(&tb.regions[&5].data[8..11], b"two");
}

// Checks that small whole operations share frames: twenty 100-byte writes queued together
// go out in three frames (eight segments at most to a frame), counted as chained; delivered
// last frame first, every write lands where it was aimed and completes once. Then a read, a
// fetch-and-add and a compare-and-swap queued together go in one frame and each completes
// with its own result.
#[test]
fn small_operations_share_frames() {
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(Config::new(1, MTU), 4096);
    let target = RegionRef { region: 5, key: 55 };
    let mut ids = Vec::new();
    for i in 0..20u8 {
        ids.push(a.write(now, target, i as u64 * 100, &[i + 1; 100], OpFlags::default()).unwrap());
    }
    let frames = drain(&mut a, now);
    assert_eq!(frames.len(), 3, "20 operations in frames of at most 8 segments");
    assert_eq!(a.stats().ops_chained, 17);
    for (link, f) in frames.iter().rev() {
        b.handle_frame(now + 10, *link, f, &mut tb);
    }
    assert_eq!(b.stats().malformed, 0);
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    for i in 0..20usize {
        assert!(tb.regions[&5].data[i * 100..(i + 1) * 100].iter().all(|&x| x == i as u8 + 1), "write {i}");
    }
    let completed = |a: &mut Connection| -> Vec<(u32, Result<Completion, OpError>)> {
        events(a)
            .into_iter()
            .filter_map(|e| match e {
                Event::Completed { op, result } => Some((op, result)),
                _ => None,
            })
            .collect()
    };
    let done = completed(&mut a);
    assert_eq!(done.len(), 20, "each write completes once");
    assert!(ids.iter().all(|id| done.iter().any(|(op, r)| op == id && *r == Ok(Completion::Done))));

    let read = a.read(now, target, 150, 100, OpFlags::default()).unwrap();
    let fadd = a.atomic(now, target, 2000, AtomicOp::FetchAdd(5), OpFlags::default()).unwrap();
    let cas = a.atomic(now, target, 2000, AtomicOp::CompareSwap { expected: 5, new: 9 }, OpFlags::default()).unwrap();
    assert_eq!(drain_and_deliver(&mut a, &mut b, &mut tb, now), 1, "three operations in one frame");
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    let done = completed(&mut a);
    let mut want_read = vec![2u8; 50];
    want_read.extend_from_slice(&[3; 50]);
    assert!(done.contains(&(read, Ok(Completion::Data(want_read)))));
    assert!(done.contains(&(fadd, Ok(Completion::Value(0)))));
    assert!(done.contains(&(cas, Ok(Completion::Value(5)))));
    assert_eq!(u64::from_le_bytes(tb.regions[&5].data[2000..2008].try_into().unwrap()), 9);
}

/// Every frame `a` sends now, handed to `b` in order; how many there were.
fn drain_and_deliver(a: &mut Connection, b: &mut Connection, tb: &mut MemTarget, now: Time) -> usize {
    let frames = drain(a, now);
    for (link, f) in &frames {
        b.handle_frame(now + 10, *link, f, tb);
    }
    frames.len()
}

// Checks when an operation is worth holding back to share a frame: never with nothing in
// flight (a lone operation goes at once), yes for a small one once two frames are in flight,
// never once a frame's worth (eight) wait, never for one too large to share a frame.
#[test]
fn small_operations_are_gathered_only_behind_frames_in_flight() {
    let (mut a, _b, _ta, _tb, now) = pair(Config::new(1, MTU), 65536);
    let target = RegionRef { region: 5, key: 55 };
    a.write(now, target, 0, &[1; 64], OpFlags::default()).unwrap();
    assert!(!a.worth_gathering(), "nothing in flight");
    drain(&mut a, now);
    a.write(now, target, 0, &[1; 64], OpFlags::default()).unwrap();
    drain(&mut a, now);
    assert_eq!(a.in_flight(), rackwire_proto::GATHER_IN_FLIGHT_MIN);
    for i in 1..8 {
        a.write(now, target, 0, &[2; 64], OpFlags::default()).unwrap();
        assert!(a.worth_gathering(), "small, behind two frames in flight, {i} waiting");
    }
    a.write(now, target, 0, &[2; 64], OpFlags::default()).unwrap();
    assert!(!a.worth_gathering(), "a frame's worth waits");
    drain(&mut a, now);
    a.write(now, target, 0, &[3; 20_000], OpFlags::default()).unwrap();
    assert!(!a.worth_gathering(), "too large to share a frame");
}

// Checks that a data frame whose sequence number lies far beyond anything a sender may have
// in flight (here 2^31 - 1 ahead, the most the 32-bit field can say) is dropped as malformed
// as malformed, without tracking the gap to it (that took minutes: what the fuzzer found), and
// that a frame just inside the span is taken; traffic then goes on.
#[test]
fn a_frame_beyond_the_send_span_is_dropped() {
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(Config::new(1, MTU), 4096);
    let target = RegionRef { region: 5, key: 55 };
    a.write(now, target, 0, b"probe", OpFlags::default()).unwrap();
    let (link, frame) = drain(&mut a, now).remove(0);
    let seq = rackwire_wire::Frame::new_checked(&frame[..]).unwrap().seq();
    let forged = |ahead: u32| {
        let mut f = frame.clone();
        let mut view = rackwire_wire::Frame::new_unchecked(&mut f[..]);
        view.set_seq(seq.wrapping_add(ahead));
        view.fill_checksums();
        f
    };
    b.handle_frame(now, link, &forged(i32::MAX as u32), &mut tb);
    assert_eq!(b.stats().malformed, 1);
    b.handle_frame(now, link, &forged(rackwire_proto::SEND_SPAN_MAX as u32 - 1), &mut tb);
    assert_eq!(b.stats().malformed, 1, "within the span: taken");
    assert_eq!(b.stats().out_of_order, 1);
    b.handle_frame(now, link, &frame, &mut tb);
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert_eq!(&tb.regions[&5].data[..5], b"probe");
}
