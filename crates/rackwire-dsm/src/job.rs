//! A shared range over the ranks of a job on the fabric: every rank's part of a symmetric
//! region holds the master copies of the pages homed there; a fault fetches a page with one
//! one-sided read from its home's part; a barrier writes each page's diff into its home's part
//! with one-sided writes (the home's own view of the page sees them: it is the same memory),
//! then exchanges the write notices, then invalidates what they name.

use std::time::{Duration, Instant};

use rackwire::{Access as Grant, Completion, Conn, OpFlags, Region, RemoteRegion};
use rackwire_coll::Group;

use crate::diff;
use crate::lock::{Locks, Peers};
use crate::memory::SharedBytes;
use crate::protocol::{Counters, DsmError, PageId, Protocol, Rank, Released};
use crate::range::{Backend, Range};
use crate::PAGE_BYTES;

/// A rank's part of the symmetric region, as the memory its range sits on.
struct RegionMemory(Region);

// SAFETY: a fabric region's memory is a shared mapping of its length that lives as long as
// the region (which this value owns), and its address never changes.
#[allow(unsafe_code)]
unsafe impl SharedBytes for RegionMemory {
    fn ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
    fn len(&self) -> usize {
        self.0.len() as usize
    }
}

/// The connection to rank `rank` and its part of the range.
fn reach<'a>(
    conns: &'a [Option<Conn>],
    parts: &'a [RemoteRegion],
    rank: Rank,
) -> Result<(&'a Conn, &'a RemoteRegion), DsmError> {
    match (conns.get(rank as usize), parts.get(rank as usize)) {
        (Some(Some(conn)), Some(part)) => Ok((conn, part)),
        _ => Err(DsmError::NoSuchRank { rank, ranks: parts.len() }),
    }
}

/// Fetches pages from their homes' parts with one-sided reads.
struct FabricBackend {
    conns: Vec<Option<Conn>>,
    parts: Vec<RemoteRegion>,
}

impl Backend for FabricBackend {
    fn fetch(&mut self, page: PageId, home: Rank, out: &mut [u8]) -> Result<(), DsmError> {
        let (conn, part) = reach(&self.conns, &self.parts, home)?;
        let at = page as u64 * PAGE_BYTES as u64;
        match conn.read(part, at, PAGE_BYTES as u64, OpFlags::NONE).wait()? {
            Completion::Data(d) if d.len() == out.len() => {
                out.copy_from_slice(&d);
                Ok(())
            }
            Completion::Data(d) => Err(DsmError::BadFetch { page, home, got: d.len() }),
            _ => Err(DsmError::BadFetch { page, home, got: 0 }),
        }
    }

    fn fetch_many(&mut self, pages: &[(PageId, Rank)], mut outs: Vec<&mut [u8]>) -> Result<(), DsmError> {
        // Neighbouring pages of one home go in one read (up to FETCH_RUN_PAGES_MAX): one
        // request and one answer where a read a page would cost one each.
        let mut order: Vec<usize> = (0..pages.len()).collect();
        order.sort_by_key(|&i| (pages[i].1, pages[i].0));
        let mut runs: Vec<(Rank, PageId, Vec<usize>)> = Vec::new();
        for i in order {
            let (page, home) = pages[i];
            match runs.last_mut() {
                Some((h, first, idx))
                    if *h == home && idx.len() < FETCH_RUN_PAGES_MAX && page == *first + idx.len() as PageId =>
                {
                    idx.push(i)
                }
                _ => runs.push((home, page, vec![i])),
            }
        }
        let mut reads = Vec::with_capacity(runs.len());
        for (home, first, idx) in &runs {
            let (conn, part) = reach(&self.conns, &self.parts, *home)?;
            let (at, len) = (*first as u64 * PAGE_BYTES as u64, (idx.len() * PAGE_BYTES) as u64);
            reads.push(conn.read(part, at, len, OpFlags::NONE));
        }
        for (read, (home, first, idx)) in reads.into_iter().zip(runs) {
            let want = idx.len() * PAGE_BYTES;
            match read.wait()? {
                Completion::Data(d) if d.len() == want => {
                    for (k, &i) in idx.iter().enumerate() {
                        outs[i].copy_from_slice(&d[k * PAGE_BYTES..(k + 1) * PAGE_BYTES]);
                    }
                }
                Completion::Data(d) => return Err(DsmError::BadFetch { page: first, home, got: d.len() }),
                _ => return Err(DsmError::BadFetch { page: first, home, got: 0 }),
            }
        }
        Ok(())
    }
}

/// Neighbouring pages of one home fetched in one read at most (64 KiB).
const FETCH_RUN_PAGES_MAX: usize = 16;

/// Addresses rank 0 proposes, at most, for a range every rank's view can sit at.
const COMMON_ADDRESS_TRIES: usize = 8;
/// Where rank 0's later proposals go: from here up, a step apart (1 TiB), inside the 47 bits
/// of a process's own address space.
const PROPOSAL_BASE: usize = 0x2000_0000_0000;
const PROPOSAL_STEP: usize = 0x0100_0000_0000;

/// The same address for every rank's view of a range of `len` bytes, held by this rank's
/// reservation (a collective call): rank 0 reserves a place (where the kernel puts it, then at
/// addresses further up), the others try to reserve the same, and all agree or try again. A
/// pointer into the range then means the same word at every rank. `None` when ranks share a
/// process (one address space cannot hold two views at one address; each keeps its own).
fn common_address(group: &mut Group, len: usize) -> Result<Option<crate::memory::Reservation>, DsmError> {
    use crate::memory::Reservation;
    let mut pids = vec![0u8; 4 * group.size()];
    group.allgather(&std::process::id().to_le_bytes(), &mut pids)?;
    let mut seen: Vec<&[u8]> = pids.chunks_exact(4).collect();
    seen.sort_unstable();
    if seen.windows(2).any(|w| w[0] == w[1]) {
        return Ok(None);
    }
    for attempt in 0..COMMON_ADDRESS_TRIES {
        let mine = if group.rank() == 0 {
            let proposed = match attempt {
                0 => None,
                k => Reservation::at(PROPOSAL_BASE + (k - 1) * PROPOSAL_STEP, len)?,
            };
            Some(match proposed {
                Some(r) => r,
                None => Reservation::anywhere(len)?,
            })
        } else {
            None
        };
        let mut word = mine.as_ref().map_or(0u64, |r| r.addr as u64).to_le_bytes();
        group.bcast(0, &mut word)?;
        let addr = u64::from_le_bytes(word) as usize;
        let mine = match mine {
            Some(r) => Some(r),
            None => Reservation::at(addr, len)?,
        };
        let mut all = [u32::from(mine.is_some())];
        group.allreduce(&mut all, rackwire_coll::ReduceOp::Min)?;
        if all[0] == 1 {
            return Ok(mine);
        }
        // Someone has something there: every reservation of this round goes.
        drop(mine);
    }
    Err(DsmError::NoCommonAddress { tries: COMMON_ADDRESS_TRIES })
}

/// Where a shared range's pages have their homes (each page's master copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Page `p` at rank `p % ranks`, from the start.
    RoundRobin,
    /// At the rank that writes it first: homes start in turn, and at the first barrier after a
    /// page was first written, its home moves to the lowest rank that wrote it in that
    /// interval (which fetches it once, unless its copy is current); a page nobody writes
    /// stays where it started. A rank then writes the pages it owns without twins or diffs.
    #[default]
    FirstTouch,
}

/// Shared memory over a job's ranks: each rank's [`Range`], and the group it synchronises
/// with.
pub struct SharedMemory {
    group: Group,
    range: Range,
    conns: Vec<Option<Conn>>,
    parts: Vec<RemoteRegion>,
    /// The locks' words and notice logs, a part per rank (see `lock.rs`).
    locks: Locks,
    /// This rank's own notices since the last barrier (every rank learns them there).
    own: Vec<PageId>,
    /// The notices this rank knows of since the last barrier (`rank << 32 | page`): its own,
    /// and those it learned through locks; and how many of them each lock's log has had.
    known: Vec<u64>,
    appended: Vec<usize>,
    /// Where this rank's time went in the calls it made (see [`Stats`]).
    spent: Spent,
    /// With first-touch placement: which pages have been placed (the same at every rank: it
    /// follows the notices every rank sees at barriers).
    placed: Option<Vec<bool>>,
}

/// Time in the shared memory's calls so far, by what it went into.
#[derive(Debug, Default, Clone, Copy)]
struct Spent {
    lock: Duration,
    barrier: Duration,
    protocol: Duration,
    locks: u64,
    barriers: u64,
}

/// What one rank's shared memory did, and where the time of its calls went. The application's
/// own time is the rest of its run: compute.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Stats {
    /// The page protocol's counters.
    pub counters: Counters,
    /// Waiting for faults to be resolved (the fetches from homes among it).
    pub data_wait: Duration,
    /// Of `data_wait`, fetching pages from their homes.
    pub fetch: Duration,
    /// In lock calls (taking and releasing), less their protocol work.
    pub lock_wait: Duration,
    /// In barriers (diffs landing, notices going round, the ranks' meeting), less their
    /// protocol work.
    pub barrier_wait: Duration,
    /// The protocol's own work at releases and acquires: twins turned into diffs, copies
    /// invalidated, protection changed.
    pub protocol: Duration,
    /// Locks taken.
    pub locks: u64,
    /// Barriers passed.
    pub barriers: u64,
}

impl Stats {
    /// What happened between `earlier` and this (both of one rank).
    pub fn since(&self, earlier: &Stats) -> Stats {
        let c = (&self.counters, &earlier.counters);
        Stats {
            counters: Counters {
                faults: c.0.faults - c.1.faults,
                fetches: c.0.fetches - c.1.fetches,
                twins: c.0.twins - c.1.twins,
                diffs: c.0.diffs - c.1.diffs,
                diff_bytes: c.0.diff_bytes - c.1.diff_bytes,
                diffs_applied: c.0.diffs_applied - c.1.diffs_applied,
                invalidations: c.0.invalidations - c.1.invalidations,
                homes_moved: c.0.homes_moved - c.1.homes_moved,
                overwrites: c.0.overwrites - c.1.overwrites,
            },
            data_wait: self.data_wait.saturating_sub(earlier.data_wait),
            fetch: self.fetch.saturating_sub(earlier.fetch),
            lock_wait: self.lock_wait.saturating_sub(earlier.lock_wait),
            barrier_wait: self.barrier_wait.saturating_sub(earlier.barrier_wait),
            protocol: self.protocol.saturating_sub(earlier.protocol),
            locks: self.locks - earlier.locks,
            barriers: self.barriers - earlier.barriers,
        }
    }
}

impl SharedMemory {
    /// A range of `bytes` (rounded up to whole pages) over every rank of `group`, each page
    /// homed where it is first written ([`Placement::FirstTouch`]); every rank calls this with
    /// the same `bytes` (a collective call).
    pub fn new(group: Group, bytes: usize) -> Result<SharedMemory, DsmError> {
        SharedMemory::with_placement(group, bytes, Placement::FirstTouch)
    }

    /// [`SharedMemory::new`] with the pages' homes placed as `placement` says (every rank the
    /// same).
    pub fn with_placement(mut group: Group, bytes: usize, placement: Placement) -> Result<SharedMemory, DsmError> {
        let pages = bytes.div_ceil(PAGE_BYTES).max(1);
        let (rank, size) = (group.rank(), group.size());
        let sym = group.alloc_symmetric((pages * PAGE_BYTES) as u64, Grant::READ | Grant::WRITE)?;
        let parts = sym.remotes().to_vec();
        let conns: Vec<Option<Conn>> = (0..size).map(|r| group.conn(r).cloned()).collect();
        let protocol = Protocol::new(rank as Rank, size, Protocol::round_robin(pages, size))?;
        let backend = FabricBackend { conns: conns.clone(), parts: parts.clone() };
        let at = common_address(&mut group, pages * PAGE_BYTES)?;
        let range = Range::over_at(Box::new(RegionMemory(sym.region)), protocol, backend, at)?;
        let locks = Locks::new(&mut group)?;
        Ok(SharedMemory {
            group,
            range,
            conns,
            parts,
            locks,
            own: Vec::new(),
            known: Vec::new(),
            appended: vec![0; crate::LOCKS_MAX],
            spent: Spent::default(),
            placed: (placement == Placement::FirstTouch).then(|| vec![false; pages]),
        })
    }

    /// What this rank's shared memory did so far, and where the time of its calls went.
    pub fn stats(&self) -> Stats {
        let (data_wait, fetch) = self.range.fault_waits();
        let s = &self.spent;
        Stats {
            counters: self.range.counters(),
            data_wait,
            fetch,
            lock_wait: s.lock,
            barrier_wait: s.barrier,
            protocol: s.protocol,
            locks: s.locks,
            barriers: s.barriers,
        }
    }

    /// The job's group (for the caller's own collectives between the shared memory's calls).
    pub fn group(&mut self) -> &mut Group {
        &mut self.group
    }

    /// Run `f`, and how long it took less the protocol work counted meanwhile.
    fn timed<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> (T, Duration) {
        let (start, protocol) = (Instant::now(), self.spent.protocol);
        let out = f(self);
        let waited = start.elapsed().saturating_sub(self.spent.protocol - protocol);
        (out, waited)
    }

    /// A release of this rank's range, its time counted as protocol work.
    fn release(&mut self) -> Result<Released, DsmError> {
        let start = Instant::now();
        let rel = self.range.release();
        self.spent.protocol += start.elapsed();
        rel
    }

    /// An acquire of `notices`, its time counted as protocol work.
    fn acquire(&mut self, notices: &[PageId]) -> Result<Released, DsmError> {
        let start = Instant::now();
        let acq = self.range.acquire(notices);
        self.spent.protocol += start.elapsed();
        acq
    }

    /// This rank's view of the range.
    #[inline]
    pub fn range(&self) -> &Range {
        &self.range
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// Ranks sharing the range.
    pub fn size(&self) -> usize {
        self.group.size()
    }

    /// A barrier: every write any rank made before it is seen by every rank after it. This
    /// rank's diffs land at their homes first; then the write notices go round; then each rank
    /// invalidates its copies of the pages others wrote (a page this rank wrote too is flushed
    /// first, and a last group barrier lets those flushes land before anyone fetches).
    pub fn barrier(&mut self) -> Result<(), DsmError> {
        let (out, waited) = self.timed(Self::barrier_inner);
        self.spent.barrier += waited;
        self.spent.barriers += 1;
        out
    }

    fn barrier_inner(&mut self) -> Result<(), DsmError> {
        let rel = self.release()?;
        self.send_diffs(&rel.diffs)?;
        // Every notice of this rank since the last barrier: those its lock releases published
        // too (a rank that did not take those locks has not seen them).
        self.own.extend(&rel.notices);
        self.own.sort_unstable();
        self.own.dedup();
        let mine: Vec<u8> = std::mem::take(&mut self.own).iter().flat_map(|p| p.to_le_bytes()).collect();
        self.known.clear();
        self.appended.iter_mut().for_each(|a| *a = 0);
        let all = self.exchange(&mine)?;
        let me = self.group.rank();
        let theirs: Vec<PageId> = all
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != me)
            .flat_map(|(_, b)| b.chunks_exact(4).map(|c| PageId::from_le_bytes(c.try_into().expect("4 bytes"))))
            .collect();
        let acq = self.acquire(&theirs)?;
        self.send_diffs(&acq.diffs)?;
        self.group.barrier()?;
        self.place(&all)
    }

    /// First-touch placement after a barrier: each page written for the first time goes to
    /// the lowest rank that wrote it (`all`: every rank's notices, by rank); once every rank's
    /// moves are done (their fetches from the old homes), a group barrier.
    fn place(&mut self, all: &[Vec<u8>]) -> Result<(), DsmError> {
        let Some(placed) = self.placed.as_mut() else { return Ok(()) };
        let mut moves = Vec::new();
        for (rank, notices) in all.iter().enumerate() {
            for c in notices.chunks_exact(4) {
                let page = PageId::from_le_bytes(c.try_into().expect("4 bytes"));
                // Every page was checked by the acquire; one past the range is skipped.
                if let Some(done @ false) = placed.get_mut(page as usize) {
                    *done = true;
                    moves.push((page, rank as Rank));
                }
            }
        }
        // The same at every rank: every rank saw the same notices.
        if moves.is_empty() {
            return Ok(());
        }
        self.range.rehome(&moves)?;
        self.group.barrier()?;
        Ok(())
    }

    /// Every rank's notices, by rank: their counts first, then the notices themselves.
    fn exchange(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, DsmError> {
        let size = self.group.size();
        let mut counts = vec![0u8; 8 * size];
        self.group.allgather(&(mine.len() as u64).to_le_bytes(), &mut counts)?;
        let counts: Vec<usize> =
            counts.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize).collect();
        // Each rank notices each page once at most: more is a peer's error, refused.
        let max = self.range.len() / PAGE_BYTES * size;
        let total = counts.iter().try_fold(0usize, |a, &c| a.checked_add(c)).unwrap_or(usize::MAX);
        if total > 4 * max || counts.iter().any(|c| c % 4 != 0) {
            return Err(DsmError::Limit { what: "write notices", n: total / 4, max });
        }
        let mut all = vec![0u8; total];
        if total > 0 {
            self.group.allgatherv(mine, &counts, &mut all)?;
        }
        let mut out = Vec::with_capacity(size);
        let mut at = 0;
        for c in counts {
            out.push(all[at..at + c].to_vec());
            at += c;
        }
        Ok(out)
    }

    /// Write each diff's runs into its home's part (one batch per diff), and wait for them all.
    fn send_diffs(&self, diffs: &[(PageId, Rank, Vec<u8>)]) -> Result<(), DsmError> {
        let mut ops = Vec::with_capacity(diffs.len());
        for (page, home, d) in diffs {
            let runs = diff::runs(d).map_err(|why| DsmError::BadDiff { page: *page, why })?;
            let base = *page as u64 * PAGE_BYTES as u64;
            let entries: Vec<(u64, &[u8])> = runs.iter().map(|(off, b)| (base + *off as u64, *b)).collect();
            let (conn, part) = reach(&self.conns, &self.parts, *home)?;
            ops.push(conn.write_batch(part, &entries, OpFlags::NONE));
        }
        for op in ops {
            op.wait()?;
        }
        Ok(())
    }

    /// Take lock `lock` (below [`crate::LOCKS_MAX`]; waiting at most [`crate::LOCK_TIMEOUT`]),
    /// then see every write its earlier holders made before they released it.
    pub fn lock(&mut self, lock: usize) -> Result<(), DsmError> {
        let (out, waited) = self.timed(|m| m.lock_inner(lock));
        self.spent.lock += waited;
        self.spent.locks += 1;
        out
    }

    fn lock_inner(&mut self, lock: usize) -> Result<(), DsmError> {
        let me = self.group.rank() as u64;
        let peers = Peers { me: self.group.rank(), size: self.group.size(), conns: &self.conns };
        let noticed: Vec<PageId> = match self.locks.take(lock, &peers)? {
            Some(entries) => {
                let theirs: Vec<PageId> = entries.iter().filter(|e| *e >> 32 != me).map(|e| *e as PageId).collect();
                self.known.extend(entries.iter().filter(|e| *e >> 32 != me));
                theirs
            }
            // More than the log holds: every page.
            None => (0..(self.range.len() / PAGE_BYTES) as PageId).collect(),
        };
        let acq = self.acquire(&noticed)?;
        // A page this rank had written, flushed because another's notice named it: noticed at
        // the next release, with the rest.
        self.send_diffs(&acq.diffs)
    }

    /// Release lock `lock`, which this rank holds: its writes' diffs land at their homes, its
    /// notices go into the lock's log, then the lock is free.
    pub fn unlock(&mut self, lock: usize) -> Result<(), DsmError> {
        let (out, waited) = self.timed(|m| m.unlock_inner(lock));
        self.spent.lock += waited;
        out
    }

    fn unlock_inner(&mut self, lock: usize) -> Result<(), DsmError> {
        self.locks.check_held(lock)?;
        let rel = self.release()?;
        self.send_diffs(&rel.diffs)?;
        let me = self.group.rank() as u64;
        self.own.extend(&rel.notices);
        self.known.extend(rel.notices.iter().map(|&p| (me << 32) | u64::from(p)));
        let from = self.appended[lock].min(self.known.len());
        let peers = Peers { me: self.group.rank(), size: self.group.size(), conns: &self.conns };
        self.locks.give(lock, &peers, &self.known[from..])?;
        self.appended[lock] = self.known.len();
        Ok(())
    }

    /// Leave the job's group together with the other ranks (see [`Group::leave`]): once every
    /// rank is done reading (a group barrier: another rank may still fetch pages homed here),
    /// the range goes, then the group.
    pub fn leave(self) -> Result<(), DsmError> {
        let SharedMemory { mut group, range, .. } = self;
        group.barrier()?;
        drop(range);
        group.leave()?;
        Ok(())
    }
}
