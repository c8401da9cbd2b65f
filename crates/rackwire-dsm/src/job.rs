//! A shared range over the ranks of a job on the fabric: every rank's part of a symmetric
//! region holds the master copies of the pages homed there; a fault fetches a page with one
//! one-sided read from its home's part; a barrier writes each page's diff into its home's part
//! with one-sided writes (the home's own view of the page sees them: it is the same memory),
//! then exchanges the write notices, then invalidates what they name.

use rackwire::{Access as Grant, Completion, Conn, OpFlags, Region, RemoteRegion};
use rackwire_coll::Group;

use crate::diff;
use crate::fault::{Backend, Range, SharedBytes};
use crate::lock::{Locks, Peers};
use crate::protocol::{DsmError, PageId, Protocol, Rank};
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
}

impl SharedMemory {
    /// A range of `bytes` (rounded up to whole pages) over every rank of `group`, pages homed in
    /// turn; every rank calls this with the same `bytes` (a collective call).
    pub fn new(mut group: Group, bytes: usize) -> Result<SharedMemory, DsmError> {
        let pages = bytes.div_ceil(PAGE_BYTES).max(1);
        let (rank, size) = (group.rank(), group.size());
        let sym = group.alloc_symmetric((pages * PAGE_BYTES) as u64, Grant::READ | Grant::WRITE)?;
        let parts = sym.remotes().to_vec();
        let conns: Vec<Option<Conn>> = (0..size).map(|r| group.conn(r).cloned()).collect();
        let protocol = Protocol::new(rank as Rank, size, Protocol::round_robin(pages, size))?;
        let backend = FabricBackend { conns: conns.clone(), parts: parts.clone() };
        let range = Range::over(Box::new(RegionMemory(sym.region)), protocol, backend)?;
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
        })
    }

    /// This rank's view of the range.
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
        let rel = self.range.release()?;
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
        let acq = self.range.acquire(&theirs)?;
        self.send_diffs(&acq.diffs)?;
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
        let acq = self.range.acquire(&noticed)?;
        // A page this rank had written, flushed because another's notice named it: noticed at
        // the next release, with the rest.
        self.send_diffs(&acq.diffs)
    }

    /// Release lock `lock`, which this rank holds: its writes' diffs land at their homes, its
    /// notices go into the lock's log, then the lock is free.
    pub fn unlock(&mut self, lock: usize) -> Result<(), DsmError> {
        self.locks.check_held(lock)?;
        let rel = self.range.release()?;
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

    /// Leave the job's group together with the other ranks (see [`Group::leave`]).
    pub fn leave(self) -> Result<(), DsmError> {
        let SharedMemory { group, range, .. } = self;
        drop(range);
        group.leave()?;
        Ok(())
    }
}
