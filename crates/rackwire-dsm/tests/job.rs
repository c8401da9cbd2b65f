//! Shared memory over a job on the fabric: ranks as threads of this process, each a fabric node
//! of its own (shared memory between them, or the edge transport on loopback), their ranges'
//! pages fetched with one-sided reads and their diffs written one-sided into the homes.

use std::time::Duration;

use common::{assert_all_ok, run, run_with};
use rackwire_dsm::{DsmError, Placement, SharedMemory, PAGE_BYTES};

mod common;

/// Each rank writes its own bytes on every page (false sharing on every page), a barrier, then
/// every rank reads every byte written; twice, the second round over the first's values.
fn every_rank_sees_every_write(n: usize, edge: bool) {
    const PAGES: usize = 6;
    let results = run(&format!("dsm{n}{}", if edge { "e" } else { "s" }), n, PAGES * PAGE_BYTES, edge, move |m| {
        let (me, size) = (m.rank(), m.size());
        for round in 0..2u8 {
            for page in 0..PAGES {
                for k in 0..8 {
                    let at = page * PAGE_BYTES + (k * size + me) * 8;
                    m.range().write(at, round * 100 + (me * 10 + k) as u8 + 1)?;
                }
            }
            m.barrier()?;
            for page in 0..PAGES {
                for r in 0..size {
                    for k in 0..8 {
                        let at = page * PAGE_BYTES + (k * size + r) * 8;
                        let want = round * 100 + (r * 10 + k) as u8 + 1;
                        let got = m.range().read(at)?;
                        assert_eq!(got, want, "rank {me} round {round}: page {page}, rank {r}'s word {k}");
                    }
                }
            }
            m.barrier()?;
        }
        let c = m.range().counters();
        assert!(c.fetches > 0 && c.twins > 0 && c.diffs > 0 && c.invalidations > 0, "{c:?}");
        Ok(())
    });
    assert_all_ok(&results);
}

// Checks, at 2 and 3 ranks over shared memory, that every rank sees every other rank's writes
// after a barrier — pages written by several ranks at once (each its own words), read back by
// every rank, over two rounds — and that the run really fetched, twinned, diffed and
// invalidated (its counters).
#[test]
fn every_rank_sees_every_write_over_shared_memory() {
    every_rank_sees_every_write(2, false);
    every_rank_sees_every_write(3, false);
}

// Checks the same at 2 ranks over the edge transport (fetches and diffs as edge operations).
#[test]
fn every_rank_sees_every_write_over_the_edge_transport() {
    every_rank_sees_every_write(2, true);
}

/// Each of `n` ranks writes pages `rank, rank + n, ...` shifted by one (so none is its
/// round-robin home's), a barrier, then writes them again and passes another barrier: what the
/// second interval diffed, and every rank's check that it reads every page's second value.
fn owners_write_again(n: usize, edge: bool, placement: Placement) -> Vec<u64> {
    const PAGES: usize = 8;
    let diffs = std::sync::Arc::new(std::sync::Mutex::new(vec![0u64; n]));
    let d = diffs.clone();
    let job = format!("dsmpl{n}{}{}", if edge { "e" } else { "s" }, placement == Placement::FirstTouch);
    let results =
        common::run_with(job.as_str(), n, PAGES * PAGE_BYTES, edge, Duration::from_secs(30), placement, move |m| {
            let (me, size) = (m.rank(), m.size());
            let mine: Vec<usize> = (0..PAGES).filter(|p| (p + 1) % size == me).collect();
            for round in 1..=2u8 {
                let before = m.stats().counters.diffs;
                for &p in &mine {
                    m.range().write(p * PAGE_BYTES + 40, round * 10 + p as u8)?;
                }
                m.barrier()?;
                if round == 2 {
                    d.lock().unwrap()[me] = m.stats().counters.diffs - before;
                }
                for p in 0..PAGES {
                    assert_eq!(
                        m.range().read(p * PAGE_BYTES + 40)?,
                        round * 10 + p as u8,
                        "rank {me} round {round} page {p}"
                    );
                }
                m.barrier()?;
            }
            Ok(())
        });
    assert_all_ok(&results);
    let out = diffs.lock().unwrap().clone();
    out
}

// Checks first-touch placement against round robin, 2 ranks over shared memory and over the
// edge transport: each rank writes pages whose round-robin home is the other; with first
// touch those pages move to their writer at the first barrier, so the second round of writes
// sends no diffs at all, where round robin sends one per page; every rank reads every page's
// latest value either way (the move lost nothing).
#[test]
fn first_touch_homes_pages_at_their_writer() {
    for edge in [false, true] {
        assert_eq!(owners_write_again(2, edge, Placement::FirstTouch), vec![0, 0], "edge {edge}");
        assert_eq!(owners_write_again(2, edge, Placement::RoundRobin), vec![4, 4], "edge {edge}");
    }
    assert_eq!(owners_write_again(3, false, Placement::FirstTouch), vec![0, 0, 0]);
}

/// The 8-byte word at `at` of the range (byte by byte: each byte a touch of the memory).
fn load(m: &SharedMemory, at: usize) -> Result<u64, DsmError> {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = m.range().read(at + i)?;
    }
    Ok(u64::from_le_bytes(b))
}

fn store(m: &SharedMemory, at: usize, v: u64) -> Result<(), DsmError> {
    for (i, x) in v.to_le_bytes().into_iter().enumerate() {
        m.range().write(at + i, x)?;
    }
    Ok(())
}

/// Every rank adds 1 to two counters `ADDS` times, each under its own lock (the counters on
/// pages homed at different ranks); the ranks contend for the locks throughout.
fn counters_under_locks(n: usize, edge: bool) {
    const ADDS: u64 = 25;
    let results = run(&format!("dsml{n}{}", if edge { "e" } else { "s" }), n, 4 * PAGE_BYTES, edge, move |m| {
        for _ in 0..ADDS {
            for (lock, at) in [(0usize, 8usize), (1, PAGE_BYTES + 16)] {
                m.lock(lock)?;
                let v = load(m, at)?;
                store(m, at, v + 1)?;
                m.unlock(lock)?;
            }
        }
        m.barrier()?;
        let want = ADDS * m.size() as u64;
        assert_eq!(load(m, 8)?, want, "rank {}: counter under lock 0", m.rank());
        assert_eq!(load(m, PAGE_BYTES + 16)?, want, "rank {}: counter under lock 1", m.rank());
        Ok(())
    });
    assert_all_ok(&results);
}

// Checks mutual exclusion and the notices a lock carries: every rank increments two shared
// counters under two locks, contending, at 2 and 3 ranks over shared memory; each counter
// ends exactly at ranks x 25 (a lost update, a stale copy read under the lock, or two holders
// at once would leave it short).
#[test]
fn counters_under_locks_end_exact_over_shared_memory() {
    counters_under_locks(2, false);
    counters_under_locks(3, false);
}

// Checks the same at 2 ranks over the edge transport (the lock word's compare-and-swap and
// the notice log as edge operations).
#[test]
fn counters_under_locks_end_exact_over_the_edge_transport() {
    counters_under_locks(2, true);
}

// Checks bad lock use: a lock past the last, unlocking a lock not held, taking a lock held.
#[test]
fn bad_lock_use_is_refused() {
    let results = run("dsmbad", 1, PAGE_BYTES, false, |m| {
        assert!(matches!(m.lock(rackwire_dsm::LOCKS_MAX), Err(DsmError::Limit { what: "lock", .. })));
        assert!(matches!(m.unlock(3), Err(DsmError::Limit { what: "lock not held", .. })));
        m.lock(3)?;
        assert!(matches!(m.lock(3), Err(DsmError::Limit { what: "lock already held", .. })));
        m.unlock(3)
    });
    assert_all_ok(&results);
}

// Checks that a lock carries what happened before its release, not only what was written
// under it: rank 1 writes X under lock 0, then a flag under lock 1; rank 0, which read X before
// (a cached copy) and never takes lock 0, takes lock 1 until it sees the flag, and must then
// read the new X (both pages homed at rank 1, so rank 0 reads them from copies it fetched).
#[test]
fn a_lock_carries_what_happened_before_its_release() {
    const X: usize = PAGE_BYTES + 8;
    const FLAG: usize = 3 * PAGE_BYTES + 8;
    let results = run("dsmhb", 2, 4 * PAGE_BYTES, false, |m| {
        if m.rank() == 0 {
            assert_eq!(load(m, X)?, 0);
        }
        m.barrier()?;
        if m.rank() == 1 {
            m.lock(0)?;
            store(m, X, 5)?;
            m.unlock(0)?;
            m.lock(1)?;
            store(m, FLAG, 1)?;
            m.unlock(1)?;
        } else {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                m.lock(1)?;
                let f = load(m, FLAG)?;
                m.unlock(1)?;
                if f == 1 {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "the flag never came");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(load(m, X)?, 5, "X was written before the flag's release");
        }
        m.barrier()
    });
    assert_all_ok(&results);
}

// Checks that a rank that goes away mid-run makes the others fail with an error, not hang:
// rank 2 of 3 leaves right after the range is set up (its fabric node closed); ranks 0 and 1
// write and call a barrier, which must return an error naming the group's failure within the
// group's timeout (2 s here), well before the test's own limit.
#[test]
fn a_rank_gone_mid_run_fails_the_others() {
    let started = std::time::Instant::now();
    let results = run_with("dsmgone", 3, 4 * PAGE_BYTES, false, Duration::from_secs(2), Placement::FirstTouch, |m| {
        if m.rank() == 2 {
            return Err(DsmError::Limit { what: "this rank leaves on purpose", n: 0, max: 0 });
        }
        m.range().write(8 * m.rank(), 1)?;
        m.barrier()
    });
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    for (rank, r) in results.iter().enumerate().take(2) {
        assert!(matches!(r, Err(DsmError::Group(_))), "rank {rank}: {r:?}");
    }
}
