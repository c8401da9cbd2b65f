//! Ordered operations (`OpFlags::ordered`): a signal sent at once behind its data, which the
//! target applies only after every frame sent before it has arrived.

use rackwire_proto::{
    AtomicOp, Completion, Config, Connection, Event, OpError, OpFlags, RegionRef, Time, ORDERED_WAITING_MAX,
    ORDERED_WRITE_BYTES_MAX,
};
use rackwire_sim::pair::{drain, established, events, pump};
use rackwire_sim::MemTarget;

const MTU: usize = 1472;
const REGION: RegionRef = RegionRef { region: 5, key: 55 };
const ORDERED: OpFlags = OpFlags { notify: None, fence_before: false, fence_after: false, ordered: true };

fn pair(len: usize) -> (Connection, Connection, MemTarget, MemTarget, Time) {
    established(Config::new(1, MTU), b"shared-secret", REGION.region, REGION.key, len)
}

fn word(t: &MemTarget, at: usize) -> u64 {
    u64::from_le_bytes(t.regions[&REGION.region].data[at..at + 8].try_into().unwrap())
}

// Checks the order without a round trip: a 3000-byte write (three frames) and an ordered
// 8-byte signal behind it all go out at once (no frame from the target in between). Delivered
// last first, the signal's frame is held (the word stays 0, nothing is signalled) while the
// data's frames are missing, and applied when the last of them arrives: the data is whole by
// then, the connection says a signal landed (once), and both operations complete.
#[test]
fn a_signal_waits_for_the_frames_sent_before_it() {
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(8192);
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    a.write(now, REGION, 0, &data, OpFlags::default()).unwrap();
    a.write(now, REGION, 4096, &42u64.to_le_bytes(), ORDERED).unwrap();
    let frames = drain(&mut a, now);
    assert_eq!(frames.len(), 4, "three data frames and the signal's, sent together");
    let (signal, rest) = frames.split_last().unwrap();
    b.handle_frame(now + 5, signal.0, &signal.1, &mut tb);
    for (link, f) in rest[1..].iter().rev() {
        b.handle_frame(now + 6, *link, f, &mut tb);
    }
    assert_eq!(word(&tb, 4096), 0, "held while a frame sent before it is missing");
    assert!(!b.take_signalled());
    b.handle_frame(now + 7, rest[0].0, &rest[0].1, &mut tb);
    assert_eq!(&tb.regions[&5].data[..3000], &data[..], "the data is whole");
    assert_eq!(word(&tb, 4096), 42, "the signal applied once the gap closed");
    assert!(b.take_signalled(), "a signal landed");
    assert!(!b.take_signalled(), "said once");
    now += 10;
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    let done =
        events(&mut a).iter().filter(|e| matches!(e, Event::Completed { result: Ok(Completion::Done), .. })).count();
    assert_eq!(done, 2, "both operations complete");
}

// Checks the difference from a fence: with `fence_before` the signal waits for the data's
// answer (a round trip), so the first frames out do not carry it; ordered, they do, and the
// target applies data then signal from them alone.
#[test]
fn ordered_goes_with_the_data_where_a_fence_waits_for_its_answer() {
    for (flags, with_data) in [(ORDERED, true), (OpFlags { fence_before: true, ..OpFlags::default() }, false)] {
        let (mut a, mut b, _ta, mut tb, now) = pair(4096);
        a.write(now, REGION, 0, b"some data", OpFlags::default()).unwrap();
        a.write(now, REGION, 64, &7u64.to_le_bytes(), flags).unwrap();
        for (link, f) in drain(&mut a, now) {
            b.handle_frame(now + 5, link, &f, &mut tb);
        }
        assert_eq!(&tb.regions[&5].data[..9], b"some data");
        assert_eq!(word(&tb, 64) == 7, with_data, "{flags:?}");
    }
}

// Checks an ordered fetch-and-add: it waits behind a missing frame as a write does, then adds
// once (the old value comes back to the initiator).
#[test]
fn an_ordered_atomic_waits_too() {
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(8192);
    a.write(now, REGION, 0, &[1u8; 2000], OpFlags::default()).unwrap();
    a.atomic(now, REGION, 4096, AtomicOp::FetchAdd(5), ORDERED).unwrap();
    let frames = drain(&mut a, now);
    let (last, rest) = frames.split_last().unwrap();
    b.handle_frame(now + 5, last.0, &last.1, &mut tb);
    assert_eq!(word(&tb, 4096), 0);
    for (link, f) in rest {
        b.handle_frame(now + 6, *link, f, &mut tb);
    }
    assert_eq!(word(&tb, 4096), 5);
    now += 10;
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert!(events(&mut a).iter().any(|e| matches!(e, Event::Completed { result: Ok(Completion::Value(0)), .. })));
}

// Checks the limits: an ordered write past ORDERED_WRITE_BYTES_MAX, an ordered read and an
// ordered message are refused at submission, with nothing sent.
#[test]
fn ordered_is_only_for_small_writes_and_atomics() {
    let (mut a, _b, _ta, _tb, now) = pair(4096);
    let big = vec![0u8; ORDERED_WRITE_BYTES_MAX + 1];
    assert_eq!(a.write(now, REGION, 0, &big, ORDERED), Err(OpError::Limit));
    assert_eq!(a.read(now, REGION, 0, 8, ORDERED), Err(OpError::Limit));
    assert_eq!(a.send(now, b"hi", ORDERED), Err(OpError::Limit));
    assert!(a.write(now, REGION, 0, &big[1..], ORDERED).is_ok(), "at the limit it goes");
    assert!(drain(&mut a, now).len() == 1);
}

// Checks the bound on what waits: with the first of many frames missing, ordered additions
// behind it wait up to ORDERED_WAITING_MAX; frames past that are dropped unacknowledged
// (counted), and once the missing frame arrives and the connection runs its course every
// addition lands exactly once and every operation completes.
#[test]
fn the_wait_is_bounded_and_nothing_is_lost() {
    let (mut a, mut b, mut ta, mut tb, mut now) = pair(8192);
    let adds = ORDERED_WAITING_MAX + 100;
    a.write(now, REGION, 0, &[3u8; 1000], OpFlags::default()).unwrap();
    for _ in 0..adds {
        a.atomic(now, REGION, 4096, AtomicOp::FetchAdd(1), ORDERED).unwrap();
    }
    let mut frames = Vec::new();
    // The window lets only so many frames out at once: take every frame the sender has.
    for _ in 0..64 {
        let f = drain(&mut a, now);
        if f.is_empty() {
            break;
        }
        frames.extend(f);
    }
    let (first, rest) = frames.split_first().unwrap();
    for (link, f) in rest {
        b.handle_frame(now + 5, *link, f, &mut tb);
    }
    assert_eq!(word(&tb, 4096), 0, "all wait behind the missing frame");
    b.handle_frame(now + 6, first.0, &first.1, &mut tb);
    assert!(word(&tb, 4096) > 0, "the gap closed");
    assert!(b.stats().stash_full > 0, "the bound was reached");
    now += 10;
    for _ in 0..200 {
        pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
        now += 10_000;
        a.handle_timeout(now, &mut ta);
        if word(&tb, 4096) == adds as u64 {
            pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
            break;
        }
    }
    assert_eq!(word(&tb, 4096), adds as u64, "every addition once");
    let done = events(&mut a).iter().filter(|e| matches!(e, Event::Completed { result: Ok(_), .. })).count();
    assert_eq!(done, adds + 1, "every operation completes");
}

fn in_order_pair(len: usize) -> (Connection, Connection, MemTarget, MemTarget, Time) {
    established(Config { in_order: true, ..Config::new(1, MTU) }, b"shared-secret", REGION.region, REGION.key, len)
}

// Checks delivery in order (`Config::in_order`, MultiEdge's ordered links): a 3000-byte write
// (three frames) then an 8-byte write with no ordering flag, delivered last frame first. Held
// behind the missing first frame, neither the small write nor the later fragments act (the
// target's bytes stay zero; three frames counted as held); when the first frame arrives every
// frame acts, in the order sent, and both operations complete. Without the setting the small
// write acts at once (the control).
#[test]
fn in_order_frames_wait_for_every_frame_sent_before_them() {
    for in_order in [true, false] {
        let (mut a, mut b, mut ta, mut tb, mut now) = if in_order { in_order_pair(8192) } else { pair(8192) };
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 5 + 1) as u8).collect();
        a.write(now, REGION, 0, &data, OpFlags::default()).unwrap();
        a.write(now, REGION, 4096, &7u64.to_le_bytes(), OpFlags::default()).unwrap();
        let frames = drain(&mut a, now);
        assert_eq!(frames.len(), 4);
        for (link, f) in frames[1..].iter().rev() {
            b.handle_frame(now + 5, *link, f, &mut tb);
        }
        if in_order {
            assert_eq!(word(&tb, 4096), 0, "the small write waits behind the gap");
            assert!(tb.regions[&5].data[1400..3000].iter().all(|&x| x == 0), "so do the later fragments");
            assert_eq!(b.stats().held, 3);
        } else {
            assert_eq!(word(&tb, 4096), 7, "without the setting it acts as it arrives");
        }
        b.handle_frame(now + 6, frames[0].0, &frames[0].1, &mut tb);
        assert_eq!(&tb.regions[&5].data[..3000], &data[..]);
        assert_eq!(word(&tb, 4096), 7);
        now += 10;
        pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
        let done = events(&mut a)
            .iter()
            .filter(|e| matches!(e, Event::Completed { result: Ok(Completion::Done), .. }))
            .count();
        assert_eq!(done, 2, "in order: {in_order}");
    }
}

// Checks the bound on frames waiting in order: a write of IN_ORDER_HELD_MAX + 100 frames
// delivered without its first frame keeps IN_ORDER_HELD_MAX of them and drops the rest
// unacknowledged; once the first arrives the held ones act, the sender sends the dropped ones
// again, and the whole write lands and completes.
#[test]
fn frames_waiting_in_order_are_bounded_and_none_is_lost() {
    let frames_n = rackwire_proto::IN_ORDER_HELD_MAX + 100;
    let len = frames_n * 1400;
    // Windows wide enough that the whole write goes out at once.
    let cfg = Config {
        in_order: true,
        window_frames_max: 2 * frames_n,
        link_window_initial: 2 * frames_n,
        link_window_max: 2 * frames_n,
        ..Config::new(1, MTU)
    };
    let (mut a, mut b, mut ta, mut tb, mut now) =
        established(cfg, b"shared-secret", REGION.region, REGION.key, len + 4096);
    let data: Vec<u8> = (0..len as u32).map(|i| (i % 251) as u8).collect();
    a.write(now, REGION, 0, &data, OpFlags::default()).unwrap();
    let frames = drain(&mut a, now);
    assert!(frames.len() > rackwire_proto::IN_ORDER_HELD_MAX + 50, "{} frames out at once", frames.len());
    let (first, rest) = frames.split_first().unwrap();
    for (link, f) in rest {
        b.handle_frame(now, *link, f, &mut tb);
    }
    assert_eq!(b.stats().held as usize, rackwire_proto::IN_ORDER_HELD_MAX);
    assert_eq!(b.stats().stash_full as usize, rest.len() - rackwire_proto::IN_ORDER_HELD_MAX, "the rest dropped");
    b.handle_frame(now, first.0, &first.1, &mut tb);
    // The dropped frames go again when the sender learns of the gap or its timer fires: time
    // moves on in steps until the write completes (bounded).
    let mut done = 0;
    for _ in 0..200 {
        now += 5_000;
        if let Some(t) = a.poll_timeout() {
            if t <= now {
                a.handle_timeout(now, &mut ta);
            }
        }
        pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
        done += events(&mut a)
            .iter()
            .filter(|e| matches!(e, Event::Completed { result: Ok(Completion::Done), .. }))
            .count();
        if done > 0 {
            break;
        }
    }
    assert_eq!(done, 1, "the write completes");
    let wrong = tb.regions[&5].data[..len].iter().zip(&data).position(|(g, w)| g != w);
    assert_eq!(wrong, None, "the whole write landed (first wrong byte)");
}
