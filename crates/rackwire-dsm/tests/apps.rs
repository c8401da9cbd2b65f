//! The applications over a job's shared memory, each checked against its one-process run.

use common::{assert_all_ok, run};
use rackwire_dsm::apps::{fft, lu, radix, water, Memory, Plain};

mod common;

/// LU of a 64 x 64 matrix of 8 x 8 blocks (eight blocks to a page: pages written by several
/// ranks at once) over `n` ranks; rank 0 compares every word with the one-process run's.
fn lu_matches_one_process(n: usize, edge: bool) {
    let s = lu::Shape { n: 64, b: 8 };
    let mut plain = Plain::zeroed(s.words());
    lu::init(&mut plain, s, 11).unwrap();
    lu::factorise(&mut plain, s).unwrap();
    let want = plain.0;
    let results = run(&format!("lu{n}{}", if edge { "e" } else { "s" }), n, s.words() * 8, edge, move |m| {
        lu::init(m, s, 11)?;
        lu::factorise(m, s)?;
        if m.rank() == 0 {
            for (i, w) in want.iter().enumerate() {
                let got = m.word(i)?;
                assert_eq!(
                    got,
                    *w,
                    "word {i}: {} against the one-process run's {}",
                    f64::from_bits(got),
                    f64::from_bits(*w)
                );
            }
        }
        m.barrier()
    });
    assert_all_ok(&results);
}

// Checks LU over the shared memory at 1, 2 and 3 ranks over shared memory: the factorised
// matrix equals the one-process run's bit for bit (every block takes the same operations in
// the same order whoever owns it).
#[test]
fn lu_over_shared_memory_equals_one_process() {
    for n in [1, 2, 3] {
        lu_matches_one_process(n, false);
    }
}

// Checks the same at 2 ranks over the edge transport.
#[test]
fn lu_over_the_edge_transport_equals_one_process() {
    lu_matches_one_process(2, true);
}

/// Radix sort of 20,000 keys of 24 bits (three passes) over `n` ranks; every rank checks the
/// sorted keys against the one-process run's.
fn radix_matches_one_process(n: usize, edge: bool) {
    const KEYS: usize = 20_000;
    const BITS: u32 = 24;
    let mut plain = Plain::zeroed(radix::words(KEYS));
    radix::init(&mut plain, KEYS, BITS, 5).unwrap();
    let at = radix::sort(&mut plain, KEYS, BITS).unwrap();
    let want = plain.0[at..at + KEYS].to_vec();
    assert!(want.windows(2).all(|w| w[0] <= w[1]));
    let results = run(&format!("rx{n}{}", if edge { "e" } else { "s" }), n, radix::words(KEYS) * 8, edge, move |m| {
        radix::init(m, KEYS, BITS, 5)?;
        let got_at = radix::sort(m, KEYS, BITS)?;
        assert_eq!(got_at, at);
        for (i, w) in want.iter().enumerate().step_by(if m.rank() == 0 { 1 } else { 7 }) {
            assert_eq!(m.word(at + i)?, *w, "rank {}: key {i}", m.rank());
        }
        m.barrier()
    });
    assert_all_ok(&results);
}

// Checks radix sort over the shared memory at 1, 2 and 3 ranks over shared memory: the sorted
// keys equal the one-process run's (rank 0 checks every key, the others every seventh).
#[test]
fn radix_over_shared_memory_equals_one_process() {
    for n in [1, 2, 3] {
        radix_matches_one_process(n, false);
    }
}

// Checks the same at 2 ranks over the edge transport.
#[test]
fn radix_over_the_edge_transport_equals_one_process() {
    radix_matches_one_process(2, true);
}

/// FFT of 4,096 points (a 64 x 64 matrix) over `n` ranks; rank 0 compares every word with the
/// one-process run's.
fn fft_matches_one_process(n: usize, edge: bool) {
    const POINTS: usize = 4096;
    let mut plain = Plain::zeroed(fft::words(POINTS));
    fft::init(&mut plain, POINTS, 13).unwrap();
    fft::transform(&mut plain, POINTS).unwrap();
    let want = plain.0[..2 * POINTS].to_vec();
    let results = run(&format!("fft{n}{}", if edge { "e" } else { "s" }), n, fft::words(POINTS) * 8, edge, move |m| {
        fft::init(m, POINTS, 13)?;
        fft::transform(m, POINTS)?;
        if m.rank() == 0 {
            for (i, w) in want.iter().enumerate() {
                assert_eq!(m.word(i)?, *w, "word {i}");
            }
        }
        m.barrier()
    });
    assert_all_ok(&results);
}

// Checks the six-step FFT over the shared memory at 1, 2 and 3 ranks over shared memory: the
// transform equals the one-process run's bit for bit (its transposes read the other ranks'
// rows).
#[test]
fn fft_over_shared_memory_equals_one_process() {
    for n in [1, 2, 3] {
        fft_matches_one_process(n, false);
    }
}

// Checks the same at 2 ranks over the edge transport.
#[test]
fn fft_over_the_edge_transport_equals_one_process() {
    fft_matches_one_process(2, true);
}

/// Water-like all-pairs dynamics of 128 molecules for 8 steps over `n` ranks (forces added
/// under 16 locks); every rank compares the positions with the one-process run's to rounding
/// (the sums land in another order).
fn water_matches_one_process(n: usize, edge: bool) {
    const MOLECULES: usize = 128;
    const STEPS: usize = 8;
    let mut plain = Plain::zeroed(water::words(MOLECULES));
    water::init(&mut plain, MOLECULES, 2).unwrap();
    water::simulate(&mut plain, MOLECULES, STEPS).unwrap();
    let want = water::positions(&mut plain, MOLECULES).unwrap();
    let results =
        run(&format!("wat{n}{}", if edge { "e" } else { "s" }), n, water::words(MOLECULES) * 8, edge, move |m| {
            water::init(m, MOLECULES, 2)?;
            water::simulate(m, MOLECULES, STEPS)?;
            let got = water::positions(m, MOLECULES)?;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-9 * w.abs().max(1.0), "rank {}: coordinate {i}: {g} against {w}", m.rank());
            }
            m.barrier()
        });
    assert_all_ok(&results);
}

// Checks the lock-heavy application at 1, 2 and 3 ranks over shared memory: every rank's
// positions agree with the one-process run's to rounding (a force lost or added twice under
// the locks would move molecules far more).
#[test]
fn water_over_shared_memory_matches_one_process() {
    for n in [1, 2, 3] {
        water_matches_one_process(n, false);
    }
}

// Checks the same at 2 ranks over the edge transport.
#[test]
fn water_over_the_edge_transport_matches_one_process() {
    water_matches_one_process(2, true);
}
