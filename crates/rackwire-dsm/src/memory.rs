//! The memory a range sits on: a shared mapping of its own, or one the caller gives.

use std::os::fd::OwnedFd;

use rustix::mm::{MapFlags, ProtFlags};

use crate::protocol::DsmError;

/// Mappings left for the rest of the process when a range's pages are counted against
/// `vm.max_map_count`.
const MAPPINGS_SPARE: usize = 1024;
/// Shared memory a range sits on: a `MAP_SHARED` mapping of `len()` bytes at `ptr()`, page
/// aligned, that lives as long as the value (the range keeps it).
///
/// # Safety
///
/// `ptr()` must return the same address every time, the start of a shared mapping of at least
/// `len()` bytes (a multiple of [`crate::PAGE_BYTES`]) that stays mapped while the value lives.
#[allow(unsafe_code)]
pub unsafe trait SharedBytes: Send + Sync + 'static {
    /// Its first byte.
    fn ptr(&self) -> *mut u8;
    /// Its length.
    fn len(&self) -> usize;
    /// Whether it has no bytes (a range cannot sit on it).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A memory file of the range's own, mapped once.
pub(crate) struct OwnMemory {
    _file: OwnedFd,
    ptr: usize,
    len: usize,
}

impl OwnMemory {
    pub(crate) fn new(len: usize) -> Result<OwnMemory, DsmError> {
        let file = rustix::fs::memfd_create("rackwire-dsm", rustix::fs::MemfdFlags::CLOEXEC)
            .map_err(|e| sys("memfd_create", e))?;
        rustix::fs::ftruncate(&file, len as u64).map_err(|e| sys("ftruncate", e))?;
        // SAFETY: a fresh shared mapping of the whole file, at an address the kernel picks.
        #[allow(unsafe_code)]
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &file, 0)
        }
        .map_err(|e| sys("mmap", e))? as usize;
        Ok(OwnMemory { _file: file, ptr, len })
    }
}

impl Drop for OwnMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made, no longer used (the range that used it is gone).
        #[allow(unsafe_code)]
        unsafe {
            let _ = rustix::mm::munmap(self.ptr as *mut _, self.len);
        }
    }
}

// SAFETY: `ptr` is the start of the shared mapping of `len` bytes this value made and unmaps
// only when dropped.
#[allow(unsafe_code)]
unsafe impl SharedBytes for OwnMemory {
    fn ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Mappings this process may still make (the system's `vm.max_map_count` less those it has),
/// when the system says: a range's pages with different protections are mappings of their own.
pub(crate) fn mappings_left() -> Option<usize> {
    let max: usize = std::fs::read_to_string("/proc/sys/vm/max_map_count").ok()?.trim().parse().ok()?;
    let have = std::fs::read_to_string("/proc/self/maps").ok()?.lines().count();
    Some(max.saturating_sub(have + MAPPINGS_SPARE))
}

/// A failed system call as the shared memory's error.
pub(crate) fn sys(what: &'static str, e: rustix::io::Errno) -> DsmError {
    DsmError::System { what, errno: e.raw_os_error() }
}
