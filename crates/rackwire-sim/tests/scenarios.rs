//! Two-node scenarios on the simulator: a link black-holed mid-transfer, all links down,
//! reordering without loss, random loss against a lossless baseline, links weighted by capacity,
//! a burst striped over links of different delay, lone frames on the quickest link, and two
//! transfers at once in opposite directions.

use rackwire_proto::{Completion, Config, Event, OpError, OpFlags, RegionRef, Time};
use rackwire_sim::net::LinkParams;
use rackwire_sim::world::node_id;
use rackwire_sim::World;

const KEY: u128 = 0x5ca1_ab1e;
const REGION: u32 = 1;

fn world(links: usize, p: LinkParams, cfg: impl Fn(Vec<usize>) -> Config, region_bytes: usize) -> World {
    let mut w = World::new(42, 2, links, |_, _, _| p.clone(), cfg);
    w.targets[1].add_region(REGION, KEY, region_bytes, &[node_id(0)]);
    assert!(w.run_while(1_000_000, |w| w.conn(0, 1).state() == rackwire_proto::State::Established), "handshake");
    w.take_events();
    w
}

fn default_cfg(mtus: Vec<usize>) -> Config {
    let mut c = Config::new(mtus.len(), mtus[0]);
    c.mtu = mtus;
    c
}

/// Write `total` bytes from node 0 into node 1 in `chunk`-byte writes, all submitted at once;
/// run until every write completed (or `deadline`). Returns (elapsed µs, events seen at node 0).
fn transfer(
    w: &mut World,
    total: usize,
    chunk: usize,
    deadline: Time,
    mid: impl FnOnce(&mut World),
) -> (Time, Vec<Event>) {
    let start = w.now;
    let data: Vec<u8> = (0..total).map(|i| (i * 7 + i / 4096) as u8).collect();
    let target = RegionRef { region: REGION, key: KEY };
    let mut pending = 0;
    for (i, c) in data.chunks(chunk).enumerate() {
        w.submit(0, 1, |conn| conn.write(start, target, (i * chunk) as u64, c, OpFlags::default())).unwrap();
        pending += 1;
    }
    w.flush();
    let mut events = Vec::new();
    let mut mid = Some(mid);
    let half = w.now + 5_000;
    let ok = w.run_while(start + deadline, |w| {
        if w.now >= half {
            if let Some(f) = mid.take() {
                f(w);
            }
        }
        for (_, node, _, e) in w.take_events() {
            if node != 0 {
                continue;
            }
            if let Event::Completed { result, .. } = &e {
                assert_eq!(result, &Ok(Completion::Done), "a write failed");
                pending -= 1;
            }
            events.push(e);
        }
        pending == 0
    });
    assert!(ok, "transfer did not complete: {pending} writes pending");
    assert!(w.targets[1].regions[&REGION].data[..total] == data[..], "target bytes differ");
    (w.now - start, events)
}

// Checks failover: with two links and one black-holed (both directions) in the middle of a
// 16 MiB transfer, the transfer completes byte-exact, the dead link is reported down, and its
// traffic moved to the other link (which carries more data frames afterwards).
#[test]
fn black_holed_link_mid_transfer_fails_over() {
    let p = LinkParams::clean(50, 1_000_000_000, 1472);
    let mut w = world(2, p, default_cfg, 16 << 20);
    let (elapsed, events) = transfer(&mut w, 16 << 20, 65536, 20_000_000, |w| {
        w.set_link(0, 1, 0, |p| p.down = true);
    });
    assert!(events.contains(&Event::LinkDown(0)), "link 0 not reported down: {events:?}");
    assert!(!w.conn(0, 1).link_up(0) && w.conn(0, 1).link_up(1));
    let s = w.conn(0, 1).stats();
    assert!(s.links[1].frames_sent > s.links[0].frames_sent, "{s:?}");
    eprintln!(
        "black-hole: {elapsed} µs, frames on link 0 / 1: {} / {}",
        s.links[0].frames_sent, s.links[1].frames_sent
    );
    // 16 MiB at 1 Gbit/s on the surviving link is about 134 ms; allow detection and slack.
    assert!(elapsed < 1_000_000, "took {elapsed} µs");
}

// Checks that with every link down an operation fails with a clear error after the configured
// operation timeout (not a hang), and the connection then closes for idleness.
#[test]
fn all_links_down_fails_operations_after_timeout() {
    let p = LinkParams::clean(50, 1_000_000_000, 1472);
    let cfg = |m: Vec<usize>| {
        let mut c = default_cfg(m);
        c.op_timeout_us = 300_000;
        c.idle_timeout_us = 1_000_000;
        c
    };
    let mut w = world(2, p, cfg, 1 << 20);
    for l in 0..2 {
        w.set_link(0, 1, l, |p| p.down = true);
    }
    let t0 = w.now;
    let op = w
        .submit(0, 1, |c| c.write(t0, RegionRef { region: REGION, key: KEY }, 0, &[1u8; 1000], OpFlags::default()))
        .unwrap();
    w.flush();
    let mut failed_at = None;
    let mut closed_at = None;
    w.run_while(t0 + 5_000_000, |w| {
        for (t, node, _, e) in w.take_events() {
            match e {
                Event::Completed { op: o, result } if node == 0 && o == op => {
                    assert_eq!(result, Err(OpError::Timeout));
                    failed_at = Some(t);
                }
                Event::Closed(_) if node == 0 => closed_at = Some(t),
                _ => {}
            }
        }
        closed_at.is_some()
    });
    let failed = failed_at.expect("the operation failed") - t0;
    eprintln!("all down: op failed after {failed} µs, closed at {:?}", closed_at.map(|c| c - t0));
    assert!((300_000..=310_000).contains(&failed), "failed after {failed} µs");
    let closed = closed_at.expect("the connection closed") - t0;
    assert!(closed <= 1_010_000, "closed after {closed} µs");
    let now = w.now;
    assert!(w.conn(0, 1).write(now, RegionRef { region: REGION, key: KEY }, 0, &[1], OpFlags::default()).is_err());
}

// Checks that reordering alone (jitter as large as the latency, on two links of different
// delay) causes few extra frames: retransmissions stay under 10% of data frames.
#[test]
fn reordering_without_loss_costs_few_extra_frames() {
    let mut w = World::new(
        7,
        2,
        2,
        |_, _, l| LinkParams {
            jitter_us: 100,
            ..LinkParams::clean(if l == 0 { 100 } else { 300 }, 1_000_000_000, 1472)
        },
        default_cfg,
    );
    w.targets[1].add_region(REGION, KEY, 16 << 20, &[node_id(0)]);
    assert!(w.run_while(1_000_000, |w| w.conn(0, 1).state() == rackwire_proto::State::Established));
    w.take_events();
    transfer(&mut w, 16 << 20, 65536, 20_000_000, |_| {});
    let s = w.conn(0, 1).stats();
    let rx = w.conn(1, 0).stats();
    eprintln!(
        "reordering: out of order {} of {} received, extra share {:.4}",
        rx.out_of_order,
        rx.frames_received,
        s.extra_share()
    );
    assert!(rx.out_of_order > 1000, "the scenario should reorder: {}", rx.out_of_order);
    assert!(
        s.extra_share() < 0.10,
        "extra share {:.3} ({} retransmits of {} frames)",
        s.extra_share(),
        s.retransmits,
        s.data_frames
    );
}

// Checks that 1% random loss (each direction, each link) keeps goodput of a 32 MiB transfer at
// 90% or more of the same transfer without loss.
#[test]
fn one_percent_loss_keeps_ninety_percent_goodput() {
    let clean = LinkParams::clean(50, 1_000_000_000, 1472);
    let mut w = world(2, clean.clone(), default_cfg, 32 << 20);
    let (t_clean, _) = transfer(&mut w, 32 << 20, 65536, 20_000_000, |_| {});
    let lossy = LinkParams { loss: 0.01, ..clean };
    let mut w = world(2, lossy, default_cfg, 32 << 20);
    let (t_lossy, _) = transfer(&mut w, 32 << 20, 65536, 20_000_000, |_| {});
    let ratio = t_clean as f64 / t_lossy as f64;
    eprintln!("loss: lossless {t_clean} µs, 1% loss {t_lossy} µs, goodput ratio {ratio:.3}");
    assert!(ratio >= 0.9, "goodput with 1% loss is {ratio:.3} of lossless ({t_clean} vs {t_lossy} µs)");
}

// Checks striping weighted by capacity: over a 1 Gbit/s and a 100 Mbit/s link, the fast link
// carries several times the frames of the slow one, and the transfer takes no more than 1.15
// times what the two capacities together allow (so the slow link neither idles nor drags).
#[test]
fn unequal_links_are_weighted_by_capacity() {
    let mut w = World::new(
        5,
        2,
        2,
        |_, _, l| LinkParams::clean(50, if l == 0 { 1_000_000_000 } else { 100_000_000 }, 1472),
        default_cfg,
    );
    w.targets[1].add_region(REGION, KEY, 16 << 20, &[node_id(0)]);
    assert!(w.run_while(1_000_000, |w| w.conn(0, 1).state() == rackwire_proto::State::Established));
    w.take_events();
    let (elapsed, _) = transfer(&mut w, 16 << 20, 65536, 20_000_000, |_| {});
    let s = w.conn(0, 1).stats();
    let (fast, slow) = (s.links[0].frames_sent, s.links[1].frames_sent);
    // Payload per 1472-byte frame is 1428 bytes (1384 in an operation's first frame, which
    // carries the full segment header); the links together carry 1.1 Gbit/s.
    let ideal_us = (16u64 << 20) as f64 * 1472.0 / 1428.0 * 8.0 / 1.1e9 * 1e6;
    eprintln!("unequal: {elapsed} µs (ideal {ideal_us:.0}), frames fast / slow: {fast} / {slow}");
    assert!(fast > 5 * slow, "fast {fast} slow {slow}");
    assert!(slow > fast / 20, "the slow link should still carry its share: fast {fast} slow {slow}");
    assert!((elapsed as f64) < 1.15 * ideal_us, "took {elapsed} µs, ideal {ideal_us:.0}");
}

/// Two nodes over two 1 Gbit/s links of 50 and 80 µs one-way delay, connected, node 1 with a
/// 1 MiB region node 0 may write.
fn near_and_far(seed: u64) -> World {
    links_of(seed, &[50, 80])
}

/// Two nodes joined by clean 1 Gbit/s links of these one-way delays (µs), node 1 holding a
/// 1 MiB region node 0 may write, the handshake done.
fn links_of(seed: u64, delays_us: &'static [u64]) -> World {
    let mut w = World::new(
        seed,
        2,
        delays_us.len(),
        |_, _, l| LinkParams::clean(delays_us[l], 1_000_000_000, 1472),
        default_cfg,
    );
    w.targets[1].add_region(REGION, KEY, 1 << 20, &[node_id(0)]);
    assert!(w.run_while(1_000_000, |w| w.conn(0, 1).state() == rackwire_proto::State::Established));
    w
}

// Checks that a burst is striped over near links even when their round trips differ: over two
// 1 Gbit/s links of 50 and 80 µs one-way delay, a lone 64 KiB write sends at least a third of
// its frames on the slower link and completes sooner than one link could serialize it (524 µs).
// Choosing the link by smoothed round trip put the whole burst on the quicker link.
#[test]
fn a_burst_is_striped_over_near_links() {
    let mut w = near_and_far(6);
    // A few small writes first, so both links have round-trip samples.
    transfer(&mut w, 64 * 100, 100, 1_000_000, |_| {});
    w.take_events();
    let before: Vec<u64> = w.conn(0, 1).stats().links.iter().map(|l| l.frames_sent).collect();
    let (elapsed, _) = transfer(&mut w, 64 * 1024, 64 * 1024, 1_000_000, |_| {});
    let s = w.conn(0, 1).stats();
    let (near, far) = (s.links[0].frames_sent - before[0], s.links[1].frames_sent - before[1]);
    assert!(far * 3 >= near + far, "frames on the 50 µs link {near}, on the 80 µs link {far}");
    assert!(elapsed < 524, "took {elapsed} µs");
}

// Checks that lone frames take the quickest link: over two links of 50 and 80 µs one-way
// delay, once both are measured (a burst, then one small write to let its answers settle),
// twenty small writes one after another (each awaited) go out on the 50 µs link only, and
// each completes within 120 µs (a round trip on it is 100 µs and change; one way on the other
// link makes it 130 or more, as taking the links in turn did).
#[test]
fn lone_frames_take_the_quickest_link() {
    let mut w = near_and_far(8);
    transfer(&mut w, 64 * 1024, 64 * 1024, 1_000_000, |_| {});
    transfer(&mut w, 64, 64, 1_000_000, |_| {});
    w.take_events();
    let before: Vec<u64> = w.conn(0, 1).stats().links.iter().map(|l| l.frames_sent).collect();
    let mut slowest = 0;
    for _ in 0..20 {
        slowest = slowest.max(transfer(&mut w, 64, 64, 1_000_000, |_| {}).0);
    }
    let s = w.conn(0, 1).stats();
    let (near, far) = (s.links[0].frames_sent - before[0], s.links[1].frames_sent - before[1]);
    assert!(near >= 20 && far == 0, "frames on the 50 µs link {near}, on the 80 µs link {far}");
    assert!(slowest < 120, "the slowest lone write took {slowest} µs");
}

// Checks that lone frames keep to one link when several are equally quick: over three clean
// links of the same delay, once all are measured, twenty small writes one after another each
// go out on the first link, and none on the others. (Taking equal links in turn sent a
// ping-pong's frames over a different path each time: through rw0 across racks, over rails
// shaped by a queueing discipline the unshaped first rail does not have.)
#[test]
fn lone_frames_keep_to_one_of_equal_links() {
    let mut w = links_of(9, &[50, 50, 50]);
    transfer(&mut w, 64 * 1024, 64 * 1024, 1_000_000, |_| {});
    transfer(&mut w, 64, 64, 1_000_000, |_| {});
    w.take_events();
    let sent = |w: &mut World| -> Vec<u64> { w.conn(0, 1).stats().links.iter().map(|l| l.frames_sent).collect() };
    let before = sent(&mut w);
    assert!(before.iter().all(|&n| n > 0), "every link measured first: {before:?}");
    for _ in 0..20 {
        transfer(&mut w, 64, 64, 1_000_000, |_| {});
    }
    let after = sent(&mut w);
    let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(delta[0] >= 20 && delta[1..].iter().all(|&d| d == 0), "frames per link: {delta:?}");
}

// Checks that two bulk transfers in opposite directions both run at the links' rate: nodes 0
// and 1 each write 8 MiB into the other over two 1 Gbit/s links at once (as a pair of ranks
// does in an alltoallv), starting at once after the handshake, 100 µs later, and 30 ms later
// (a start that once let one direction starve: 1.79 times the other's time); each direction
// must finish within 1.12 times what the links carry (measured: 1.07–1.11) and the slower
// within 1.1 times the faster (measured: 1.00–1.03). Each side's acknowledgements queue
// behind the other side's data, so each sees round trips grow with a queue that is not its
// own; the window's rule must not let one direction starve.
#[test]
fn opposite_transfers_share_the_links_evenly() {
    for start_after in [0, 100, 30_000] {
        opposite_transfers(start_after);
    }
}

fn opposite_transfers(start_after: u64) {
    const TOTAL: usize = 8 << 20;
    const CHUNK: usize = 256 << 10;
    let mut w = World::new(7, 2, 2, |_, _, _| LinkParams::clean(50, 1_000_000_000, 1472), default_cfg);
    w.targets[1].add_region(REGION, KEY, TOTAL, &[node_id(0)]);
    w.targets[0].add_region(REGION, KEY, TOTAL, &[node_id(1)]);
    assert!(w.run_while(1_000_000, |w| w.conn(0, 1).state() == rackwire_proto::State::Established), "handshake");
    let t = w.now + start_after;
    w.run_while(t, |w| w.now >= t);
    w.take_events();
    let start = w.now;
    let data: Vec<u8> = (0..TOTAL).map(|i| (i * 13 + i / 4096) as u8).collect();
    let target = RegionRef { region: REGION, key: KEY };
    let mut pending = [0usize; 2];
    for (i, c) in data.chunks(CHUNK).enumerate() {
        for (from, to) in [(0, 1), (1, 0)] {
            w.submit(from, to, |conn| conn.write(start, target, (i * CHUNK) as u64, c, OpFlags::default())).unwrap();
            pending[from] += 1;
        }
    }
    w.flush();
    let mut done_at = [None; 2];
    let ok = w.run_while(start + 1_000_000, |w| {
        for (_, node, _, e) in w.take_events() {
            if let Event::Completed { result, .. } = &e {
                assert_eq!(result, &Ok(Completion::Done), "a write failed");
                pending[node] -= 1;
                if pending[node] == 0 {
                    done_at[node] = Some(w.now - start);
                }
            }
        }
        pending == [0, 0]
    });
    assert!(ok, "transfers did not complete: {pending:?} writes pending");
    for node in 0..2 {
        assert!(w.targets[node].regions[&REGION].data[..] == data[..], "bytes at node {node} differ");
    }
    let [a, b] = done_at.map(|t| t.expect("completed") as f64);
    // 1428 bytes of a write per 1472-byte frame (a little less in each write's first frame).
    let ideal_us = TOTAL as f64 * 1472.0 / 1428.0 * 8.0 / 2e9 * 1e6;
    eprintln!("opposite, {start_after} µs in: node 0 done in {a} µs, node 1 in {b} µs, ideal {ideal_us:.0}");
    assert!(a.max(b) < 1.12 * ideal_us, "{start_after} µs in: node 0 {a} µs, node 1 {b} µs, ideal {ideal_us:.0}");
    assert!(a.max(b) < 1.1 * a.min(b), "{start_after} µs in: node 0 {a} µs, node 1 {b} µs");
}
