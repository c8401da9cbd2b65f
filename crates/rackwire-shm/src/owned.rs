//! A window this process owns: its own loads with no lock, everything else under one.
//!
//! The owner of a window reads it all the time (a rank polls the words its peers store into
//! its window) and, rarely, moves it to fresh memory ([`SharedMem::replace_backing`], to cut
//! off a peer that did not give up a revoked mapping). Stores of its own must not race that
//! move (the copy would miss them), so they take [`OwnedWindow::lock`] shared and the move
//! takes it exclusively. Loads need no lock: the move maps the new memory over the same
//! addresses in one step, so every address of the window stays mapped, showing either the
//! old contents or the same contents copied — and taking a lock costs an atomic instruction
//! that, after stores into a peer's memory, waits until those reach the peer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

use crate::{SharedMem, ShmError};

/// A window owned by this process (see the module documentation).
#[derive(Debug)]
pub struct OwnedWindow {
    mem: RwLock<SharedMem>,
    /// The mapping's address, fixed for the life of `mem` (see the module documentation).
    base: usize,
    len: usize,
}

impl OwnedWindow {
    /// The mapping's first byte: fixed for the life of the window (a move to fresh memory
    /// maps over the same addresses). Other processes the region is granted to may write it
    /// at any time: whoever reads or writes through this pointer must expect that (as a C
    /// program sharing memory does).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base as *mut u8
    }
    /// Own `mem`.
    pub fn new(mem: SharedMem) -> OwnedWindow {
        let (base, len) = (mem.as_ptr() as usize, mem.len());
        OwnedWindow { mem: RwLock::new(mem), base, len }
    }

    /// The memory, held shared: for stores and atomics of this process, and its descriptor.
    pub fn lock(&self) -> RwLockReadGuard<'_, SharedMem> {
        self.mem.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes of the window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a window of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn range_ok(&self, offset: u64, len: usize) -> bool {
        offset.checked_add(len as u64).is_some_and(|end| end <= self.len as u64)
    }

    /// The 64-bit word at an 8-byte aligned `offset`, loaded atomically with no lock; `None`
    /// when misaligned or out of bounds.
    pub fn load_u64(&self, offset: u64) -> Option<u64> {
        if !offset.is_multiple_of(8) || !self.range_ok(offset, 8) {
            return None;
        }
        // SAFETY: in bounds of a mapping that stays at `base` for as long as `self` lives
        // (created there, moved only by `replace_backing`, which maps over the same range in
        // one step; unmapped when `mem` drops with `self`); aligned (page-aligned base, offset
        // a multiple of 8); every side of a window accesses such words atomically.
        #[allow(unsafe_code)]
        let word = unsafe { &*((self.base + offset as usize) as *const AtomicU64) };
        Some(word.load(Ordering::Acquire))
    }

    /// Copy bytes at `offset` into `out` with no lock; false, touching nothing, when the
    /// range is out of bounds.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> bool {
        if !self.range_ok(offset, out.len()) {
            return false;
        }
        // SAFETY: the range is inside a mapping that stays valid at `base` for as long as
        // `self` lives (see `load_u64`); `out` is valid for its length (foreign code may hand
        // the window's own memory as `out`: the copy allows it).
        #[allow(unsafe_code)]
        unsafe {
            crate::memcpy::copy_raw_overlapping(
                (self.base as *const u8).add(offset as usize),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        true
    }

    /// [`SharedMem::replace_backing`], excluding this process's stores meanwhile.
    pub fn replace_backing(&self, name: &str) -> Result<(), ShmError> {
        let mut mem = self.mem.write().unwrap_or_else(|e| e.into_inner());
        debug_assert_eq!(mem.as_ptr() as usize, self.base);
        mem.replace_backing(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that the lock-free loads see what is stored through the lock, before and after
    // the window moves to fresh memory, and refuse misaligned and out-of-bounds ranges.
    #[test]
    fn loads_without_the_lock_follow_a_move() {
        let w = OwnedWindow::new(SharedMem::create("own", 8192).unwrap());
        assert!(w.lock().write_at(8, &42u64.to_le_bytes()));
        assert!(w.lock().write_at(100, b"kept"));
        assert_eq!(w.load_u64(8), Some(42));
        w.replace_backing("own2").unwrap();
        assert_eq!(w.load_u64(8), Some(42));
        let mut b = [0u8; 4];
        assert!(w.read_at(100, &mut b));
        assert_eq!(&b, b"kept");
        assert!(w.lock().write_at(8, &43u64.to_le_bytes()));
        assert_eq!(w.load_u64(8), Some(43));
        assert_eq!(w.load_u64(4), None);
        assert_eq!(w.load_u64(8192), None);
        assert!(!w.read_at(8190, &mut b));
    }
}
