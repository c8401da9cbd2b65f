//! Groups whose ranks are threads of this test process, each with a fabric node of its own
//! (they reach each other over shared memory, or over the edge transport on loopback): quick
//! to start, so the check suite runs here with more sizes than across processes.

use std::sync::Arc;
use std::time::Duration;

use rackwire_coll::{CollError, Group};
use rackwire_tests::collcheck;

const SECRET: &str = "coll-thread-test-secret-0123456789";

/// Run `body` as every rank of an `n`-rank group and return each rank's result.
fn run(
    job: &str,
    n: usize,
    edge: bool,
    body: impl Fn(&mut Group) -> Result<(), CollError> + Send + Sync + 'static,
) -> Vec<Result<(), CollError>> {
    rackwire_tests::thread_ranks(SECRET, job, n, edge, Duration::from_secs(30), move |mut g| {
        body(&mut g)?;
        g.leave()
    })
}

/// Every rank of an `n`-rank group returned Ok (else the ranks' errors).
fn assert_all_ok(n: usize, results: &[Result<(), CollError>]) {
    let failures: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(rank, r)| r.as_ref().err().map(|e| format!("rank {rank}: {e}")))
        .collect();
    assert!(failures.is_empty(), "n={n}: {failures:?}");
}

fn every_collective(edge: bool, sizes: &[usize], lens: &'static [usize]) {
    for &n in sizes {
        let results = run(&format!("t{n}{}", if edge { "e" } else { "s" }), n, edge, move |g| {
            if n > 1 {
                let want = if edge { "edge" } else { "shm" };
                assert_eq!(g.transport((g.rank() + 1) % n), Some(want), "the transport asked for");
            }
            collcheck::run_all(g, lens, 4, 40_000)
        });
        assert_all_ok(n, &results);
    }
}

// Checks every collective (and the v-variants with seeded random counts) at group sizes 1, 2
// and 3 over shared memory, at lengths on both sides of each algorithm switch and of the slot
// size, against results computed locally from the same patterns every rank uses.
#[test]
fn every_collective_agrees_with_a_local_computation() {
    every_collective(false, &[1, 2, 3], &[0, 1, 8, 1000, 20_000, 70_000, 300_000]);
}

// The same over the edge transport (UDP on loopback) for three ranks.
#[test]
fn every_collective_agrees_over_the_edge_transport() {
    every_collective(true, &[3], &[0, 8, 20_000, 70_000]);
}

// Checks that bad arguments are clear errors that leave the group usable: a root outside the
// group, counts that do not add up, an alltoall that is not N equal blocks; a barrier after
// them still completes on every rank.
#[test]
fn bad_arguments_are_refused_and_the_group_goes_on() {
    let results = run("badargs", 2, false, |g| {
        let mut b = [0u8; 4];
        assert!(matches!(g.bcast(5, &mut b), Err(CollError::BadArgument(m)) if m.contains("root 5")));
        let mut out = [0u8; 3];
        assert!(matches!(g.alltoall(&[1, 2, 3], &mut out), Err(CollError::BadArgument(_))));
        let mut out = [0u8; 4];
        let e = g.allgatherv(&[1, 2], &[2, 1], &mut out).unwrap_err();
        assert!(e.to_string().contains("add up"), "{e}");
        g.barrier()
    });
    for r in results {
        r.unwrap();
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 6, failure_persistence: None, ..Default::default() })]

    // Property: for any seed, group size (2 to 4) and largest count (up to past two slots of
    // a 4-rank window), alltoallv, gatherv, scatterv and allgatherv with random counts (zero
    // included) and a random root deliver exactly the bytes every rank computes locally.
    // Bounded: six groups, two rounds each.
    #[test]
    fn random_counts_are_delivered_exactly(seed in proptest::prelude::any::<u64>(), n in 2usize..=4, max in 0usize..600_000) {
        let results = run(&format!("prop{}", seed % 1_000_000), n, false, move |g| collcheck::random_counts(g, seed, 2, max));
        for (rank, r) in results.into_iter().enumerate() {
            proptest::prop_assert!(r.is_ok(), "rank {}: {:?}", rank, r);
        }
    }
}

// Checks what a barrier promises, for both of its algorithms (dissemination for two ranks,
// fan in and out through rank 0 for three to sixteen, dissemination again above): in each
// round every rank counts itself in, one rank (a different one each round) dawdles before
// it enters, and no rank leaves the barrier before every rank of that round counted itself.
#[test]
fn no_rank_leaves_a_barrier_before_all_entered() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    const ROUNDS: usize = 6;
    for n in [2, 5, 17] {
        let entered = Arc::new(AtomicUsize::new(0));
        let e = entered.clone();
        let results = run(&format!("bar{n}"), n, false, move |g| {
            for round in 0..ROUNDS {
                if g.rank() == round % g.size() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                e.fetch_add(1, SeqCst);
                g.barrier()?;
                let seen = e.load(SeqCst);
                if seen < (round + 1) * n {
                    return Err(CollError::BadArgument(format!("round {round}: left after {seen} entries")));
                }
                // Nobody counts itself into the next round before everyone looked.
                g.barrier()?;
            }
            Ok(())
        });
        assert_all_ok(n, &results);
        assert_eq!(entered.load(SeqCst), ROUNDS * n);
    }
}

// Checks the window's flow control when small pieces (in heads) and large ones (in slots) mix
// and the sender runs ahead: the root broadcasts 240 blocks, most of a few bytes, every
// seventh of 300 000 bytes (two slots' worth), each filled from its index, while the other
// rank dawdles every fifth call so the root fills the heads and slots it has. Each block
// must arrive exactly: a head or slot reused before its last piece was taken would show
// as a wrong byte. Over shared memory and over the edge transport (whose counter updates are
// additions that may land out of order).
#[test]
fn small_and_large_pieces_mixed_arrive_exactly() {
    for edge in [false, true] {
        let results = run(if edge { "mixe" } else { "mixs" }, 2, edge, |g| {
            for i in 0..240usize {
                let len = if i % 7 == 3 { 300_000 } else { 1 + i % 110 };
                let fill = |k: usize| (i * 31 + k * 7) as u8;
                let mut buf: Vec<u8> = if g.rank() == 0 { (0..len).map(fill).collect() } else { vec![0; len] };
                if g.rank() == 1 && i % 5 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
                g.bcast(0, &mut buf)?;
                if let Some(k) = (0..len).find(|&k| buf[k] != fill(k)) {
                    return Err(CollError::BadArgument(format!("block {i} of {len} bytes: byte {k} wrong")));
                }
            }
            Ok(())
        });
        assert_all_ok(2, &results);
    }
}
