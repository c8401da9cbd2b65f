//! Locks over a job's shared memory, with the write notices that travel with them.
//!
//! Lock `l` lives at rank `l % ranks` in a small symmetric region of its own: a word that
//! holds the holder (0: free; rank + 1) and, behind it, the lock's notice log — a count of
//! entries ever appended and a ring of [`LOCK_LOG_ENTRIES`] entries, each a page some rank
//! wrote, with that rank. Taking the lock is a remote compare-and-swap of the holder word
//! (retried with a growing pause); the taker then reads the entries appended since it last held
//! the lock (every page, to be safe, when more were appended than the ring holds). Releasing
//! writes the holder's diffs into their homes, appends the notices the holder knows of and has
//! not yet put in this log (its own since the last barrier, and those it learned through other
//! locks: what happened before the release, as lazy release consistency asks), and only then
//! frees the word.

use std::time::{Duration, Instant};

use rackwire::{Access as Grant, Completion, Conn, OpFlags, RemoteRegion};
use rackwire_coll::Group;

use crate::protocol::DsmError;

/// Locks of one shared memory.
pub const LOCKS_MAX: usize = 64;
/// Entries of a lock's notice log.
pub const LOCK_LOG_ENTRIES: usize = 1024;
/// Bytes of one lock: the holder word, the count, the ring.
const LOCK_BYTES: usize = 16 + LOCK_LOG_ENTRIES * 8;
/// How long taking a lock may wait before it fails.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest pause between two tries of a taken lock.
const LOCK_PAUSE_MAX: Duration = Duration::from_micros(200);

/// The locks' region and what this rank has seen of each lock's log.
pub(crate) struct Locks {
    parts: Vec<RemoteRegion>,
    region: rackwire::Region,
    /// Entries of each lock's log this rank has taken in.
    seen: Vec<u64>,
    /// The locks this rank holds.
    held: Vec<bool>,
}

impl Locks {
    /// The locks' symmetric region (a collective call).
    pub(crate) fn new(group: &mut Group) -> Result<Locks, DsmError> {
        let size = group.size();
        let per_rank = LOCKS_MAX.div_ceil(size) * LOCK_BYTES;
        let sym = group.alloc_symmetric(per_rank as u64, Grant::ALL)?;
        Ok(Locks {
            parts: sym.remotes().to_vec(),
            region: sym.region,
            seen: vec![0; LOCKS_MAX],
            held: vec![false; LOCKS_MAX],
        })
    }
}

/// Where lock `l` lives: its home rank and its offset there.
fn place(l: usize, ranks: usize) -> (usize, u64) {
    (l % ranks, ((l / ranks) * LOCK_BYTES) as u64)
}

/// Who a lock call reaches: this rank, the ranks, a connection to each other rank.
pub(crate) struct Peers<'a> {
    pub(crate) me: usize,
    pub(crate) size: usize,
    pub(crate) conns: &'a [Option<Conn>],
}

impl Peers<'_> {
    fn conn(&self, home: usize) -> Result<&Conn, DsmError> {
        self.conns
            .get(home)
            .and_then(Option::as_ref)
            .ok_or(DsmError::NoSuchRank { rank: home as u32, ranks: self.size })
    }
}

impl Locks {
    fn index(lock: usize) -> Result<usize, DsmError> {
        if lock < LOCKS_MAX {
            Ok(lock)
        } else {
            Err(DsmError::Limit { what: "lock", n: lock, max: LOCKS_MAX - 1 })
        }
    }

    /// Whether this rank holds `lock` (an error if it does not).
    pub(crate) fn check_held(&self, lock: usize) -> Result<(), DsmError> {
        let l = Self::index(lock)?;
        if self.held[l] {
            Ok(())
        } else {
            Err(DsmError::Limit { what: "lock not held", n: l, max: 0 })
        }
    }

    /// A compare-and-swap of the word at `at` of rank `home`'s part: the old value.
    fn cas(&self, p: &Peers<'_>, home: usize, at: u64, expected: u64, new: u64) -> Result<u64, DsmError> {
        if home == p.me {
            return Ok(self.region.compare_swap_u64(at, expected, new)?);
        }
        let c = p.conn(home)?.compare_swap(&self.parts[home], at, expected, new, OpFlags::NONE).wait()?;
        Ok(c.value().unwrap_or(u64::MAX))
    }

    /// The `n` words at `at` of rank `home`'s part, in one read.
    fn read_words(&self, p: &Peers<'_>, home: usize, at: u64, n: usize) -> Result<Vec<u64>, DsmError> {
        let len = n * 8;
        let bytes = if home == p.me {
            self.region.to_vec(at, len)?
        } else {
            match p.conn(home)?.read(&self.parts[home], at, len as u64, OpFlags::NONE).wait()? {
                Completion::Data(d) => d,
                _ => Vec::new(),
            }
        };
        if bytes.len() != len {
            return Err(DsmError::BadFetch { page: u32::MAX, home: home as u32, got: bytes.len() });
        }
        Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    }

    fn read_u64(&self, p: &Peers<'_>, home: usize, at: u64) -> Result<u64, DsmError> {
        Ok(self.read_words(p, home, at, 1)?[0])
    }

    fn write(&self, p: &Peers<'_>, home: usize, entries: &[(u64, &[u8])]) -> Result<(), DsmError> {
        if home == p.me {
            for (at, b) in entries {
                self.region.write_at(*at, b)?;
            }
            return Ok(());
        }
        p.conn(home)?.write_batch(&self.parts[home], entries, OpFlags::NONE).wait()?;
        Ok(())
    }

    /// Take lock `lock` (waiting at most [`LOCK_TIMEOUT`]): the entries (`rank << 32 | page`)
    /// appended to its log since this rank last took it; `None` when more came than the ring
    /// holds (every page must then be taken as written).
    pub(crate) fn take(&mut self, lock: usize, p: &Peers<'_>) -> Result<Option<Vec<u64>>, DsmError> {
        let l = Self::index(lock)?;
        let (home, at) = place(l, p.size);
        let me = p.me as u64 + 1;
        let deadline = Instant::now() + LOCK_TIMEOUT;
        let mut pause = Duration::from_micros(1);
        loop {
            match self.cas(p, home, at, 0, me)? {
                0 => break,
                holder if holder == me => return Err(DsmError::Limit { what: "lock already held", n: l, max: 0 }),
                _ if Instant::now() > deadline => return Err(DsmError::Limit { what: "lock wait", n: l, max: 0 }),
                _ => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(LOCK_PAUSE_MAX);
                }
            }
        }
        self.held[l] = true;
        let count = self.read_u64(p, home, at + 8)?;
        let from = self.seen[l];
        self.seen[l] = count;
        if count.saturating_sub(from) > LOCK_LOG_ENTRIES as u64 {
            return Ok(None);
        }
        // The entries from..count, in one read, or two where they wrap around the ring.
        let ring = LOCK_LOG_ENTRIES as u64;
        let mut out = Vec::with_capacity((count - from) as usize);
        let mut i = from;
        while i < count {
            let n = (count - i).min(ring - i % ring);
            out.extend(self.read_words(p, home, at + 16 + (i % ring) * 8, n as usize)?);
            i += n;
        }
        Ok(Some(out))
    }

    /// Append `entries` (`rank << 32 | page`, their diffs already at their homes) to lock
    /// `lock`'s log, then free it.
    pub(crate) fn give(&mut self, lock: usize, p: &Peers<'_>, entries: &[u64]) -> Result<(), DsmError> {
        self.check_held(lock)?;
        let l = lock;
        let (home, at) = place(l, p.size);
        let count = self.read_u64(p, home, at + 8)?;
        let me = p.me as u64;
        let bytes: Vec<[u8; 8]> = entries.iter().map(|e| e.to_le_bytes()).collect();
        let mut entries: Vec<(u64, &[u8])> = bytes
            .iter()
            .enumerate()
            .map(|(i, b)| (at + 16 + ((count + i as u64) % LOCK_LOG_ENTRIES as u64) * 8, &b[..]))
            .collect();
        let new_count = (count + bytes.len() as u64).to_le_bytes();
        entries.push((at + 8, &new_count));
        self.write(p, home, &entries)?;
        self.seen[l] = count + bytes.len() as u64;
        self.held[l] = false;
        if self.cas(p, home, at, me + 1, 0)? != me + 1 {
            return Err(DsmError::Limit { what: "lock taken from its holder", n: l, max: 0 });
        }
        Ok(())
    }
}
