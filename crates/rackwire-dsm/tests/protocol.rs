//! The page protocol in isolation: a job's ranks as plain memory, their faults, fetches,
//! twins, diffs and invalidations driven by hand and by a random program, checked against
//! one memory the program writes directly.

use proptest::prelude::*;
use rackwire_dsm::diff;
use rackwire_dsm::{Access, Action, DsmError, PageId, PageState, Protocol, Rank, PAGE_BYTES};

/// A job's ranks: each its protocol, its copy of the range and its pages' protection; the
/// homes' copies are the master copies.
struct Job {
    ranks: Vec<Protocol>,
    mem: Vec<Vec<u8>>,
    access: Vec<Vec<Access>>,
}

impl Job {
    fn new(ranks: usize, pages: usize) -> Job {
        let homes = Protocol::round_robin(pages, ranks);
        let protos: Vec<Protocol> =
            (0..ranks).map(|r| Protocol::new(r as Rank, ranks, homes.clone()).unwrap()).collect();
        let access = (0..ranks)
            .map(|r| homes.iter().map(|&h| if h as usize == r { Access::Read } else { Access::None }).collect())
            .collect();
        Job { ranks: protos, mem: vec![vec![0u8; pages * PAGE_BYTES]; ranks], access }
    }

    fn page(&self, r: usize, p: PageId) -> &[u8] {
        &self.mem[r][p as usize * PAGE_BYTES..(p as usize + 1) * PAGE_BYTES]
    }

    /// Carry out actions of rank `r`: a fetch copies the home's page in and reports it.
    fn run(&mut self, r: usize, actions: Vec<Action>) {
        let mut todo = actions;
        while let Some(a) = todo.pop() {
            match a {
                Action::Protect { page, access } => self.access[r][page as usize] = access,
                Action::Fetch { page, home } => {
                    let master = self.page(home as usize, page).to_vec();
                    let at = page as usize * PAGE_BYTES;
                    self.mem[r][at..at + PAGE_BYTES].copy_from_slice(&master);
                    let more = self.ranks[r].fetched(page, &master).unwrap();
                    todo.extend(more);
                }
            }
        }
    }

    /// Rank `r` touches byte `at` (a store of `value` when given), faulting as its page's
    /// protection says, as the memory would.
    fn touch(&mut self, r: usize, at: usize, value: Option<u8>) -> u8 {
        let p = (at / PAGE_BYTES) as PageId;
        let write = value.is_some();
        loop {
            let ok = match self.access[r][p as usize] {
                Access::None => false,
                Access::Read => !write,
                Access::ReadWrite => true,
            };
            if ok {
                break;
            }
            let copy = self.page(r, p).to_vec();
            let actions = self.ranks[r].fault(p, write, &copy).unwrap();
            assert!(!actions.is_empty(), "a fault that changes nothing would fault forever");
            self.run(r, actions);
        }
        if let Some(v) = value {
            self.mem[r][at] = v;
        }
        self.mem[r][at]
    }

    /// A barrier: every rank releases (its diffs applied at the homes), then every rank
    /// acquires every other's notices.
    fn barrier(&mut self) {
        let mut notices: Vec<(usize, Vec<PageId>)> = Vec::new();
        for r in 0..self.ranks.len() {
            let mem = self.mem[r].clone();
            let rel = self.ranks[r].release(|p| &mem[p as usize * PAGE_BYTES..(p as usize + 1) * PAGE_BYTES]);
            self.apply(rel.diffs);
            self.run(r, rel.actions);
            notices.push((r, rel.notices));
        }
        for r in 0..self.ranks.len() {
            let theirs: Vec<PageId> = notices.iter().filter(|(w, _)| *w != r).flat_map(|(_, n)| n.clone()).collect();
            let mem = self.mem[r].clone();
            let acq = self.ranks[r]
                .acquire(&theirs, |p| &mem[p as usize * PAGE_BYTES..(p as usize + 1) * PAGE_BYTES])
                .unwrap();
            self.apply(acq.diffs);
            self.run(r, acq.actions);
        }
    }

    fn apply(&mut self, diffs: Vec<(PageId, Rank, Vec<u8>)>) {
        for (page, home, d) in diffs {
            let h = home as usize;
            let at = page as usize * PAGE_BYTES;
            let mut master = self.mem[h][at..at + PAGE_BYTES].to_vec();
            self.ranks[h].apply_diff(page, &d, &mut master).unwrap();
            self.mem[h][at..at + PAGE_BYTES].copy_from_slice(&master);
        }
    }
}

// Checks one page's life by hand at a rank that is not its home: a read fault fetches it and
// makes it readable; a write fault keeps a twin and makes it writable; the release sends a diff
// of exactly the bytes written to the home (which then holds them), notices the page and makes
// it read-only; another rank's notice at an acquire invalidates it; the next read fetches the
// home's copy again.
#[test]
fn a_page_is_fetched_twinned_diffed_and_invalidated() {
    let mut job = Job::new(2, 2);
    // Page 1 is homed at rank 1; rank 0 touches it.
    let at = PAGE_BYTES + 40;
    assert_eq!(job.ranks[0].state(1).unwrap(), PageState::Invalid);
    assert_eq!(job.touch(0, at, None), 0);
    assert_eq!(job.ranks[0].state(1).unwrap(), PageState::Read);
    assert_eq!(job.ranks[0].counters().fetches, 1);
    job.touch(0, at, Some(7));
    assert_eq!(job.ranks[0].state(1).unwrap(), PageState::Written);
    assert_eq!(job.ranks[0].counters().twins, 1);
    let mem = job.mem[0].clone();
    let rel = job.ranks[0].release(|p| &mem[p as usize * PAGE_BYTES..(p as usize + 1) * PAGE_BYTES]);
    assert_eq!(rel.notices, vec![1]);
    assert_eq!(rel.diffs.len(), 1);
    let (page, home, d) = &rel.diffs[0];
    assert_eq!((*page, *home), (1, 1));
    let runs = diff::runs(d).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].0, runs[0].1.len()), (40, 8), "the one word written");
    job.apply(rel.diffs.clone());
    assert_eq!(job.mem[1][at], 7, "the home holds the write");
    assert_eq!(job.access[0][1], Access::ReadWrite, "not yet run");
    job.run(0, rel.actions);
    assert_eq!(job.access[0][1], Access::Read);
    // Rank 1 writes the page (its home: no twin, no diff) and releases; rank 0 acquires.
    job.touch(1, at + 8, Some(9));
    let mem1 = job.mem[1].clone();
    let rel1 = job.ranks[1].release(|p| &mem1[p as usize * PAGE_BYTES..(p as usize + 1) * PAGE_BYTES]);
    assert!(rel1.diffs.is_empty(), "a home sends no diff of its own pages");
    assert_eq!(rel1.notices, vec![1]);
    let acq = job.ranks[0].acquire(&rel1.notices, |_| &[]).unwrap();
    assert_eq!(acq.actions, vec![Action::Protect { page: 1, access: Access::None }]);
    job.run(0, acq.actions);
    assert_eq!(job.touch(0, at + 8, None), 9, "fetched again, with the home's write");
    assert_eq!(job.ranks[0].counters().fetches, 2);
    assert_eq!(job.ranks[0].counters().invalidations, 1);
}

// Checks false sharing: two ranks write different words of one page homed at a third in the
// same interval; both diffs land at the home and each rank sees the other's word after the
// barrier. And a rank that has written a page when another's notice for it arrives flushes
// its diff first (acquire before its own release), its notice going out with its next release.
#[test]
fn two_writers_of_one_page_both_land() {
    let mut job = Job::new(3, 3);
    // Page 2 is homed at rank 2.
    let base = 2 * PAGE_BYTES;
    job.touch(0, base + 8, Some(1));
    job.touch(1, base + 16, Some(2));
    job.barrier();
    for r in 0..3 {
        assert_eq!((job.touch(r, base + 8, None), job.touch(r, base + 16, None)), (1, 2), "rank {r}");
    }
    // Rank 1 writes, rank 0 writes and releases; rank 1 acquires rank 0's notice before its own
    // release: its diff is flushed then, and noticed at its next release.
    job.touch(1, base + 24, Some(3));
    job.touch(0, base + 32, Some(4));
    let mem0 = job.mem[0].clone();
    let rel0 = job.ranks[0].release(|p| &mem0[p as usize * PAGE_BYTES..(p as usize + 1) * PAGE_BYTES]);
    job.apply(rel0.diffs.clone());
    let mem1 = job.mem[1].clone();
    let acq =
        job.ranks[1].acquire(&rel0.notices, |p| &mem1[p as usize * PAGE_BYTES..(p as usize + 1) * PAGE_BYTES]).unwrap();
    assert_eq!(acq.diffs.len(), 1, "the flush");
    job.apply(acq.diffs);
    job.run(1, acq.actions);
    assert_eq!(job.mem[2][base + 24], 3);
    assert_eq!(job.touch(1, base + 32, None), 4, "rank 0's write, fetched");
    let rel1 = job.ranks[1].release(|_| &[]);
    assert_eq!(rel1.notices, vec![2], "the flushed page is noticed at the next release");
}

// Checks that bad events get clear errors: a page past the range, a rank past the job, too
// many ranks, a page arriving that nobody fetched, a diff sent to a rank that is not the page's
// home, a malformed diff at the home (the master copy untouched).
#[test]
fn bad_events_are_refused() {
    let homes = Protocol::round_robin(4, 2);
    assert!(matches!(Protocol::new(2, 2, homes.clone()), Err(DsmError::NoSuchRank { rank: 2, ranks: 2 })));
    assert!(matches!(Protocol::new(0, 1000, vec![0]), Err(DsmError::Limit { what: "ranks", .. })));
    let mut p = Protocol::new(0, 2, homes).unwrap();
    let page = vec![0u8; PAGE_BYTES];
    assert!(matches!(p.fault(4, false, &page), Err(DsmError::NoSuchPage { page: 4, pages: 4 })));
    assert_eq!(p.fetched(1, &page), Err(DsmError::NotFetching(1)));
    assert!(matches!(
        p.apply_diff(1, &0u32.to_le_bytes(), &mut page.clone()),
        Err(DsmError::NotHome { page: 1, home: 1 })
    ));
    let mut master = vec![5u8; PAGE_BYTES];
    let bad = [1u8, 0, 0, 0, 0, 0, 0, 0];
    assert!(matches!(p.apply_diff(0, &bad, &mut master), Err(DsmError::BadDiff { page: 0, .. })));
    assert_eq!(master, vec![5u8; PAGE_BYTES]);
    assert!(matches!(p.acquire(&[9], |_| &[]), Err(DsmError::NoSuchPage { page: 9, .. })));
}

// Checks a page being fetched when an acquire names it: what arrives may predate the diffs,
// so it is fetched again, and the fault that waited for it sees the home's latest bytes.
#[test]
fn a_fetch_overtaken_by_a_notice_is_fetched_again() {
    let mut p = Protocol::new(0, 2, vec![1]).unwrap();
    let page = vec![0u8; PAGE_BYTES];
    assert_eq!(p.fault(0, false, &page).unwrap(), vec![Action::Fetch { page: 0, home: 1 }]);
    let acq = p.acquire(&[0], |_| &[]).unwrap();
    assert!(acq.actions.is_empty());
    assert_eq!(p.fetched(0, &page).unwrap(), vec![Action::Fetch { page: 0, home: 1 }], "fetched again");
    assert_eq!(p.fetched(0, &page).unwrap(), vec![Action::Protect { page: 0, access: Access::Read }]);
}

// Checks moving a page's home between intervals: to this rank with no valid copy, it is
// fetched from the old home (and the page is then read-only, the master); to this rank with a
// valid copy, nothing is fetched; away from this rank, the copy stays and a later write keeps
// a twin (it is a copy like any other now); a page being written cannot move, nor go to a
// rank past the job; every move is counted.
#[test]
fn a_page_moves_home_between_intervals() {
    let page = vec![0u8; PAGE_BYTES];
    // Rank 0 of 2; page 0 homed at 0, page 1 at 1.
    let mut p = Protocol::new(0, 2, vec![0, 1, 1]).unwrap();
    assert_eq!(p.rehome(1, 0).unwrap(), vec![Action::Fetch { page: 1, home: 1 }]);
    assert_eq!(p.fetched(1, &page).unwrap(), vec![Action::Protect { page: 1, access: Access::Read }]);
    assert_eq!(p.home(1).unwrap(), 0);
    assert_eq!(p.fault(1, true, &page).unwrap(), vec![Action::Protect { page: 1, access: Access::ReadWrite }]);
    assert_eq!(p.counters().twins, 0, "no twin for a page homed here");
    assert_eq!(p.rehome(1, 1), Err(DsmError::Busy(1)), "written in this interval");
    let _ = p.release(|_| &page[..]);
    // Page 2 fetched (valid), then moved here: nothing to fetch.
    assert_eq!(p.fault(2, false, &page).unwrap(), vec![Action::Fetch { page: 2, home: 1 }]);
    let _ = p.fetched(2, &page).unwrap();
    assert!(p.rehome(2, 0).unwrap().is_empty());
    // Page 0 moves away: the copy stays readable, and a write keeps a twin.
    assert!(p.rehome(0, 1).unwrap().is_empty());
    assert_eq!(p.state(0).unwrap(), PageState::Read);
    let _ = p.fault(0, true, &page).unwrap();
    assert_eq!(p.counters().twins, 1);
    assert!(matches!(p.rehome(0, 2), Err(DsmError::NoSuchRank { rank: 2, ranks: 2 })));
    assert_eq!(p.counters().homes_moved, 3);
}

// Checks a page written whole with no copy here: nothing is fetched and no twin kept, the page
// is writable at once, and the release sends the whole page as its diff (which, applied at the
// home over the old bytes, gives what was written); on a page with a copy it is an ordinary
// write fault (a twin).
#[test]
fn a_page_written_whole_is_not_fetched() {
    let mut p = Protocol::new(0, 2, vec![1, 1]).unwrap();
    let written = vec![3u8; PAGE_BYTES];
    assert_eq!(p.overwrite(0, &written).unwrap(), vec![Action::Protect { page: 0, access: Access::ReadWrite }]);
    assert_eq!((p.counters().fetches, p.counters().twins, p.counters().overwrites), (0, 0, 1));
    let rel = p.release(|_| &written[..]);
    assert_eq!(rel.diffs.len(), 1);
    let mut home = vec![9u8; PAGE_BYTES];
    diff::apply(&rel.diffs[0].2, &mut home).unwrap();
    assert_eq!(home, written);
    assert_eq!(rel.notices, vec![0]);
    // Page 0 is valid now: overwriting it again is a write fault with a twin.
    let _ = p.overwrite(0, &written).unwrap();
    assert_eq!(p.counters().twins, 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    // Checks the protocol against one plain memory: 2 to 4 ranks run a random data-race-free
    // program (in each interval each word is written by at most one rank — diffs carry whole
    // 8-byte words, so two ranks writing bytes of one word race, as in TreadMarks; pages are
    // shared freely) of byte writes and reads separated by barriers; every read returns what
    // the plain memory holds, as release consistency promises for such programs.
    #[test]
    fn a_data_race_free_program_reads_what_it_wrote(
        ranks in 2usize..=4,
        pages in 1usize..=4,
        intervals in proptest::collection::vec(
            proptest::collection::vec((0usize..4, 0usize..16384, any::<u8>(), any::<bool>()), 0..40),
            1..6,
        ),
    ) {
        let mut job = Job::new(ranks, pages);
        let mut truth = vec![0u8; pages * PAGE_BYTES];
        for ops in intervals {
            // Words written in this interval, by whom: a word is one rank's.
            let mut owner = std::collections::HashMap::new();
            for (r, at, v, write) in ops {
                let (r, at) = (r % ranks, at % (pages * PAGE_BYTES));
                if write && *owner.entry(at / 8).or_insert(r) == r {
                    job.touch(r, at, Some(v));
                    truth[at] = v;
                } else if owner.get(&(at / 8)).is_none_or(|&o| o == r) {
                    // A read of a word nobody else writes in this interval.
                    prop_assert_eq!(job.touch(r, at, None), truth[at], "rank {} byte {}", r, at);
                }
            }
            job.barrier();
            for r in 0..ranks {
                for at in (0..pages * PAGE_BYTES).step_by(97) {
                    prop_assert_eq!(job.touch(r, at, None), truth[at], "after the barrier, rank {} byte {}", r, at);
                }
            }
        }
    }
}
