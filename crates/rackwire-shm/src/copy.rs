//! Copy channels: threads that act as the DMA engines of the shared-memory fabric.
//!
//! A large batch is split by bytes over several channels (the caller's thread is one of them),
//! as Marlin's HRDMA spreads transactions over DMA channels; contiguous pieces of a batch are
//! first combined into one copy. The call returns when every piece has landed, so borrowed
//! source buffers are safe to use.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::mem::{MapAccess, SharedMem};

/// The most copy channels an engine may have.
pub const COPY_CHANNELS_MAX: usize = 8;
/// Batches smaller than this are copied on the caller's thread alone: handing a share to a
/// channel and waiting for it costs more than the second core saves until the batch is large.
/// Measured on a two-core machine (batches of 4 KiB pieces into a shared window, median of 7,
/// one channel against two): 1 MiB 56 against 18 GB/s, 4 MiB 49–55 against 41–42, 8 MiB 48–54
/// against 58–62, 16 MiB 35 against 55–56. (At 256 KiB, the bound before, two channels gave
/// 5.7 GB/s where one gave 99: Marlin's batched row, 40 batches of 1 MiB, ran below single
/// writes.)
pub const PARALLEL_COPY_BYTES_MIN: usize = 8 << 20;

/// One piece of a batch: `len` bytes from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyPiece {
    /// Source address.
    pub src: *const u8,
    /// Destination address.
    pub dst: *mut u8,
    /// Bytes.
    pub len: usize,
}

// SAFETY: a piece is only a description; it is dereferenced only inside `CopyEngine` while the
// submitting call blocks and the borrows it was made from are alive.
#[allow(unsafe_code)]
unsafe impl Send for CopyPiece {}

/// Merge neighbours whose source and destination both continue where the previous piece ends.
/// Returns how many pieces were merged away.
pub fn coalesce(pieces: &mut Vec<CopyPiece>) -> usize {
    let before = pieces.len();
    let mut out: Vec<CopyPiece> = Vec::with_capacity(pieces.len());
    for p in pieces.drain(..) {
        if let Some(last) = out.last_mut() {
            if last.src.wrapping_add(last.len) == p.src && last.dst.wrapping_add(last.len) == p.dst {
                last.len += p.len;
                continue;
            }
        }
        out.push(p);
    }
    *pieces = out;
    before - pieces.len()
}

struct Latch {
    left: Mutex<usize>,
    cv: Condvar,
}

impl Latch {
    fn done(&self) {
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        *left -= 1;
        if *left == 0 {
            self.cv.notify_all();
        }
    }
    fn wait(&self) {
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        while *left > 0 {
            left = self.cv.wait(left).unwrap_or_else(|e| e.into_inner());
        }
    }
}

struct Job {
    pieces: Vec<CopyPiece>,
    latch: Arc<Latch>,
}

fn run(pieces: &[CopyPiece]) {
    for p in pieces {
        // SAFETY: every piece was bounds-checked against a live destination mapping and a live
        // source slice by `CopyEngine::write_batch`, which blocks until all pieces are done.
        // Source (a caller's slice) and destination (a shared window) never overlap.
        #[allow(unsafe_code)]
        unsafe {
            crate::memcpy::copy_raw(p.src, p.dst, p.len)
        };
    }
}

/// Statistics of one batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Pieces after combining.
    pub pieces: usize,
    /// Pieces merged away by combining.
    pub combined: usize,
    /// Channels that took part.
    pub channels: usize,
}

/// A set of copy channels.
pub struct CopyEngine {
    workers: Vec<(Sender<Job>, JoinHandle<()>)>,
}

impl std::fmt::Debug for CopyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyEngine").field("channels", &self.channels()).finish()
    }
}

impl CopyEngine {
    /// An engine with `channels` channels in all (1..=[`COPY_CHANNELS_MAX`]); the caller's
    /// thread is one of them, so `channels - 1` threads are started.
    pub fn new(channels: usize) -> Self {
        let channels = channels.clamp(1, COPY_CHANNELS_MAX);
        let workers = (1..channels)
            .map(|i| {
                let (tx, rx) = channel::<Job>();
                let h = std::thread::Builder::new()
                    .name(format!("rw-copy{i}"))
                    .spawn(move || {
                        while let Ok(job) = rx.recv() {
                            run(&job.pieces);
                            job.latch.done();
                        }
                    })
                    .expect("spawn copy channel");
                (tx, h)
            })
            .collect();
        CopyEngine { workers }
    }

    /// Channels in all, the caller's included.
    pub fn channels(&self) -> usize {
        self.workers.len() + 1
    }

    /// Copy each `(offset, bytes)` into `dst`. Every range is checked first; if any is out of
    /// bounds (or `dst` is read-only) nothing is copied and its index is returned as the error.
    /// `combine` merges contiguous neighbours; `channels` caps the channels used (0: all).
    pub fn write_batch(
        &self,
        dst: &SharedMem,
        entries: &[(u64, &[u8])],
        combine: bool,
        channels: usize,
    ) -> Result<BatchStats, usize> {
        let mut pieces = Vec::with_capacity(entries.len());
        let mut total = 0usize;
        for (i, (off, data)) in entries.iter().enumerate() {
            let end = off.checked_add(data.len() as u64);
            if dst.access() != MapAccess::ReadWrite || end.is_none_or(|e| e > dst.len() as u64) {
                return Err(i);
            }
            total += data.len();
            pieces.push(CopyPiece {
                src: data.as_ptr(),
                dst: dst.as_ptr().wrapping_add(*off as usize),
                len: data.len(),
            });
        }
        let combined = if combine { coalesce(&mut pieces) } else { 0 };
        let want = if channels == 0 { self.channels() } else { channels.min(self.channels()) };
        let n = if total < PARALLEL_COPY_BYTES_MIN { 1 } else { want };
        let stats = BatchStats { pieces: pieces.len(), combined, channels: n };
        if n == 1 {
            run(&pieces);
            return Ok(stats);
        }
        let shares = split(&pieces, total, n);
        let latch = Arc::new(Latch { left: Mutex::new(n - 1), cv: Condvar::new() });
        let mut shares = shares.into_iter();
        let mine = shares.next().unwrap_or_default();
        for ((tx, _), share) in self.workers.iter().zip(shares) {
            if tx.send(Job { pieces: share.clone(), latch: latch.clone() }).is_err() {
                // A channel thread is gone; do its share here.
                run(&share);
                latch.done();
            }
        }
        run(&mine);
        latch.wait();
        Ok(stats)
    }
}

/// Split pieces into `n` shares of about equal bytes, cutting a piece where a share ends.
fn split(pieces: &[CopyPiece], total: usize, n: usize) -> Vec<Vec<CopyPiece>> {
    let per = total.div_ceil(n).max(1);
    let mut shares = vec![Vec::new(); n];
    let (mut cur, mut room) = (0usize, per);
    for p in pieces {
        let mut p = *p;
        while p.len > 0 {
            let take = p.len.min(room);
            shares[cur].push(CopyPiece { src: p.src, dst: p.dst, len: take });
            p = CopyPiece { src: p.src.wrapping_add(take), dst: p.dst.wrapping_add(take), len: p.len - take };
            room -= take;
            if room == 0 && cur + 1 < n {
                cur += 1;
                room = per;
            } else if room == 0 {
                room = usize::MAX;
            }
        }
    }
    shares
}

impl Drop for CopyEngine {
    fn drop(&mut self) {
        for (tx, h) in self.workers.drain(..) {
            drop(tx);
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a batch large enough to use every channel lands byte-exact, including a
    // piece that is cut between two channels, and that combining merged the contiguous pieces.
    #[test]
    fn parallel_batch_lands_exactly() {
        let engine = CopyEngine::new(3);
        let dst = SharedMem::create("d", 12 << 20).unwrap();
        let src: Vec<u8> = (0..PARALLEL_COPY_BYTES_MIN + (1 << 20)).map(|i| (i % 251) as u8).collect();
        let entries: Vec<(u64, &[u8])> = src.chunks(4096).enumerate().map(|(i, c)| ((i * 4096) as u64, c)).collect();
        let stats = engine.write_batch(&dst, &entries, true, 0).unwrap();
        assert_eq!(stats.pieces, 1, "contiguous pieces combine to one");
        assert_eq!(stats.channels, 3);
        let mut back = vec![0u8; src.len()];
        assert!(dst.read_at(0, &mut back));
        assert_eq!(back, src);
    }

    // Checks that a batch under PARALLEL_COPY_BYTES_MIN stays on the caller's thread (one
    // channel) and lands byte-exact.
    #[test]
    fn a_smaller_batch_stays_on_the_callers_thread() {
        let engine = CopyEngine::new(3);
        let dst = SharedMem::create("d", 2 << 20).unwrap();
        let src: Vec<u8> = (0..(1 << 20)).map(|i| (i % 253) as u8).collect();
        let entries: Vec<(u64, &[u8])> = src.chunks(4096).enumerate().map(|(i, c)| ((i * 4096) as u64, c)).collect();
        let stats = engine.write_batch(&dst, &entries, false, 0).unwrap();
        assert_eq!((stats.channels, stats.pieces), (1, 256));
        let mut back = vec![0u8; src.len()];
        assert!(dst.read_at(0, &mut back));
        assert_eq!(back, src);
    }

    // Checks that one out-of-bounds entry refuses the whole batch before any byte is copied.
    #[test]
    fn out_of_bounds_entry_copies_nothing() {
        let engine = CopyEngine::new(2);
        let dst = SharedMem::create("d", 4096).unwrap();
        let a = [1u8; 16];
        assert_eq!(engine.write_batch(&dst, &[(0, &a), (4090, &a)], false, 0), Err(1));
        let mut back = [0u8; 16];
        assert!(dst.read_at(0, &mut back));
        assert_eq!(back, [0u8; 16]);
    }

    // Checks the share splitter: shares cover every byte once and are about equal.
    #[test]
    fn split_covers_every_byte_once() {
        let buf = [0u8; 1000];
        let p = CopyPiece { src: buf.as_ptr(), dst: std::ptr::null_mut::<u8>().wrapping_add(4096), len: 1000 };
        let shares = split(&[p, p], 2000, 3);
        let sizes: Vec<usize> = shares.iter().map(|s| s.iter().map(|p| p.len).sum()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 2000);
        assert!(sizes.iter().all(|&s| s <= 667));
    }
}
