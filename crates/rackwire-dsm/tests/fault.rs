//! Shared ranges with real page faults: ranks as ranges of one process, fetching from each
//! other's master copies, their application threads touching the memory directly (the
//! signal path) or through the range's accessors (resolved in the calling thread).

use std::sync::{Arc, OnceLock, Weak};

use rackwire_dsm::{Backend, DsmError, PageId, Protocol, Range, Rank, PAGE_BYTES};

/// Fetches from the other ranges of this process.
struct Peers(Arc<OnceLock<Vec<Weak<Range>>>>);

impl Backend for Peers {
    fn fetch(&mut self, page: PageId, home: Rank, out: &mut [u8]) -> Result<(), DsmError> {
        let ranks = self.0.get().map_or(0, Vec::len);
        let range = self.0.get().and_then(|v| v.get(home as usize)).and_then(Weak::upgrade);
        range.ok_or(DsmError::NoSuchRank { rank: home, ranks })?.read_master(page, out)
    }
}

/// `ranks` ranges of `pages` pages each, homes in turn.
fn job(ranks: usize, pages: usize) -> Vec<Arc<Range>> {
    let table = Arc::new(OnceLock::new());
    let homes = Protocol::round_robin(pages, ranks);
    let out: Vec<Arc<Range>> = (0..ranks)
        .map(|r| {
            let p = Protocol::new(r as Rank, ranks, homes.clone()).unwrap();
            Arc::new(Range::new(p, Peers(table.clone())).unwrap())
        })
        .collect();
    table.set(out.iter().map(Arc::downgrade).collect()).ok().unwrap();
    out
}

/// A barrier: every rank releases (diffs applied at their homes), then acquires the others'
/// notices.
fn barrier(job: &[Arc<Range>]) {
    let mut notices = Vec::new();
    for (r, range) in job.iter().enumerate() {
        let rel = range.release().unwrap();
        for (page, home, d) in rel.diffs {
            job[home as usize].apply_diff(page, &d).unwrap();
        }
        notices.push((r, rel.notices));
    }
    for (r, range) in job.iter().enumerate() {
        let theirs: Vec<PageId> = notices.iter().filter(|(w, _)| *w != r).flat_map(|(_, n)| n.clone()).collect();
        let acq = range.acquire(&theirs).unwrap();
        for (page, home, d) in acq.diffs {
            job[home as usize].apply_diff(page, &d).unwrap();
        }
    }
}

/// The byte at `at` of `r`, read straight through its memory (a fault, if the page is not
/// readable, goes through the signal handler).
fn peek(r: &Range, at: usize) -> u8 {
    assert!(at < r.len());
    // SAFETY (test): inside the range's application view, which `r` keeps mapped.
    #[allow(unsafe_code)]
    unsafe {
        std::ptr::read_volatile(r.as_ptr().add(at))
    }
}

/// Write the byte at `at` of `r` straight through its memory.
fn poke(r: &Range, at: usize, v: u8) {
    assert!(at < r.len());
    // SAFETY (test): as in `peek`.
    #[allow(unsafe_code)]
    unsafe {
        std::ptr::write_volatile(r.as_ptr().add(at), v)
    }
}

/// Read through the memory (`direct`) or the range's accessor.
fn get(r: &Range, at: usize, direct: bool) -> u8 {
    if direct {
        peek(r, at)
    } else {
        r.read(at).unwrap()
    }
}

/// Write through the memory (`direct`) or the range's accessor.
fn put(r: &Range, at: usize, v: u8, direct: bool) {
    if direct {
        poke(r, at, v)
    } else {
        r.write(at, v).unwrap()
    }
}

/// A rank's read of a page homed elsewhere fetches it (counted), a write to a page homed
/// elsewhere keeps a twin and its diff reaches the home at the barrier, the home's own write
/// is noticed, and the other rank sees both writes after the barrier (its stale copy
/// invalidated and fetched again).
fn writes_are_seen_after_a_barrier(direct: bool) {
    let job = job(2, 4);
    let (r0, r1) = (&job[0], &job[1]);
    // Page 0 is homed at rank 0, page 1 at rank 1.
    assert_eq!(get(r1, 10, direct), 0, "rank 1 fetches page 0");
    assert_eq!(r1.counters().fetches, 1);
    put(r0, 10, 42, direct);
    put(r0, PAGE_BYTES + 20, 7, direct);
    assert_eq!(r0.counters().twins, 1, "a twin for the page homed elsewhere only");
    barrier(&job);
    assert_eq!(get(r1, 10, direct), 42, "rank 1's stale copy was invalidated and fetched again");
    assert_eq!(get(r1, PAGE_BYTES + 20, direct), 7, "the diff landed at rank 1, page 1's home");
    assert_eq!(get(r0, PAGE_BYTES + 20, direct), 7);
    assert!(r1.counters().invalidations >= 1);
    assert_eq!(r1.counters().diffs_applied, 1);
    // Every miss was waited for, and counted as such.
    assert!(r1.fault_waits().0 > std::time::Duration::ZERO && r1.fault_waits().1 > std::time::Duration::ZERO);
}

// Checks the fault path end to end on real memory, the application touching the memory
// directly: every miss is a SIGSEGV the handler hands to the range's service thread (see
// `writes_are_seen_after_a_barrier` for what is checked).
#[test]
fn ranks_see_each_others_writes_after_a_barrier() {
    writes_are_seen_after_a_barrier(true);
}

// Checks the same through the range's accessors, which resolve a miss in the calling thread
// before the access (no signal): the same counters, the same bytes.
#[test]
fn accessors_see_each_others_writes_after_a_barrier() {
    writes_are_seen_after_a_barrier(false);
}

// Checks the word accessors across pages: 1,000 words written from an offset that straddles
// a page boundary by a rank whose pages are homed elsewhere land at their homes at the
// barrier and read back whole at the other rank (a page at a time, each readied once).
#[test]
fn word_runs_across_pages_land_whole() {
    let job = job(2, 4);
    let words: Vec<u64> = (0..1000u64).map(|i| i * 0x0101_0101 + 1).collect();
    let at = PAGE_BYTES - 64;
    job[1].write_words(at, &words).unwrap();
    barrier(&job);
    let mut back = vec![0u64; words.len()];
    job[0].read_words(at, &mut back).unwrap();
    assert_eq!(back, words);
    assert!(job[0].read_words(4 * PAGE_BYTES - 8, &mut [0u64; 2]).is_err(), "past the end");
    assert!(job[0].read_words(4, &mut [0u64; 1]).is_err(), "misaligned");
}

// Checks the word accessors beside raw accesses to the same pages in one interval: words
// written through the accessors (which copy through the service view and leave the
// application's view read-only), then bytes written raw on the same pages (each a fault on a
// page the protocol holds written already, which only opens the view), on a page homed here
// and on one homed at the other rank; after the barrier the other rank sees every word and
// byte, and the page homed elsewhere sent one diff with both (one twin, kept at the first
// write).
#[test]
fn word_writes_and_raw_writes_mix_in_one_interval() {
    let job = job(2, 4);
    let (r0, r1) = (&job[0], &job[1]);
    // Page 0 is homed at rank 0, page 1 at rank 1.
    for page in [0usize, 1] {
        let at = page * PAGE_BYTES;
        r0.write_words(at, &[0x1111_2222_3333_4444, 0x5555_6666_7777_8888]).unwrap();
        assert_eq!(peek(r0, at), 0x44, "a raw read sees the word written through the service view");
        poke(r0, at + 100, 0x99);
        r0.write_words(at + 200, &[7]).unwrap();
    }
    assert_eq!(r0.counters().twins, 1, "one twin, for the page homed elsewhere");
    barrier(&job);
    assert_eq!(r0.counters().diffs, 1, "one diff, with the words and the byte");
    for page in [0usize, 1] {
        let at = page * PAGE_BYTES;
        let mut w = [0u64; 2];
        r1.read_words(at, &mut w).unwrap();
        assert_eq!(w, [0x1111_2222_3333_4444, 0x5555_6666_7777_8888], "page {page}");
        assert_eq!(peek(r1, at + 100), 0x99, "page {page}: the raw byte");
        assert_eq!(r1.read_u64(at + 200).unwrap(), 7, "page {page}");
    }
}

// Checks faults from several threads at once: four threads of one rank write their own bytes
// straight into the memory on every page of a range homed at the other rank (each fault a
// signal posted in its own slot, the same page faulted by several at once); after the barrier
// the home holds every byte.
#[test]
fn threads_faulting_at_once_all_get_their_pages() {
    let job = job(2, 8);
    let writer = job[0].clone();
    std::thread::scope(|s| {
        for t in 0..4usize {
            let w = writer.clone();
            s.spawn(move || {
                for page in 0..8usize {
                    for k in 0..16usize {
                        let at = page * PAGE_BYTES + (k * 4 + t) * 8;
                        poke(&w, at, (t * 16 + k + 1) as u8);
                    }
                }
            });
        }
    });
    barrier(&job);
    for page in 0..8usize {
        for t in 0..4usize {
            for k in 0..16usize {
                let at = page * PAGE_BYTES + (k * 4 + t) * 8;
                assert_eq!(job[1].read(at).unwrap(), (t * 16 + k + 1) as u8, "page {page} thread {t} word {k}");
            }
        }
    }
}

// Checks that a bad access is refused, not turned into a fault: an address past the range.
#[test]
fn an_access_past_the_range_is_refused() {
    let job = job(1, 2);
    assert!(matches!(job[0].read(2 * PAGE_BYTES), Err(DsmError::NoSuchPage { page: 2, pages: 2 })));
    assert!(job[0].write(0, 1).is_ok());
}

// Checks that the handler does not swallow a fault outside every range: a child process with a
// range mapped dereferences an unmapped address and must die of SIGSEGV (not hang, not go on).
#[test]
fn a_stray_fault_still_ends_the_process() {
    const CHILD: &str = "RACKWIRE_DSM_TEST_STRAY_FAULT";
    if std::env::var_os(CHILD).is_some() {
        let _job = job(1, 1);
        // SAFETY (test): a deliberate access to an address nothing maps.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::read_volatile(16 as *const u8);
        }
        std::process::exit(0);
    }
    let exe = std::env::current_exe().unwrap();
    let status = std::process::Command::new(exe)
        .args(["--exact", "a_stray_fault_still_ends_the_process", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap()
        .status;
    use std::os::unix::process::ExitStatusExt;
    // SIGSEGV is 11 on Linux.
    assert_eq!(status.signal(), Some(11), "{status:?}");
}
