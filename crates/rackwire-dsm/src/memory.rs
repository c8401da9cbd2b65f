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

/// A stretch of this process's address space held by an inaccessible anonymous mapping, so
/// nothing else lands there until a range's view replaces it (`mremap` with `MREMAP_FIXED`
/// over it) or it is let go (dropped).
pub(crate) struct Reservation {
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

impl Reservation {
    /// `len` bytes wherever the kernel puts them.
    pub(crate) fn anywhere(len: usize) -> Result<Reservation, DsmError> {
        Reservation::map(0, len, MapFlags::empty()).map(|r| r.expect("a mapping the kernel placed"))
    }

    /// `len` bytes at `addr` exactly, if nothing of this process is there (`None` otherwise).
    pub(crate) fn at(addr: usize, len: usize) -> Result<Option<Reservation>, DsmError> {
        if addr == 0 || !addr.is_multiple_of(crate::PAGE_BYTES) {
            return Ok(None);
        }
        Reservation::map(addr, len, MapFlags::FIXED_NOREPLACE)
    }

    fn map(addr: usize, len: usize, extra: MapFlags) -> Result<Option<Reservation>, DsmError> {
        let flags = MapFlags::PRIVATE | MapFlags::NORESERVE | extra;
        // SAFETY: an anonymous mapping with no access; with `FIXED_NOREPLACE` the kernel refuses
        // (EEXIST) rather than replace anything already mapped at `addr`, so no Rust object
        // is touched; without it, the kernel picks a free place.
        #[allow(unsafe_code)]
        let got = unsafe { rustix::mm::mmap_anonymous(addr as *mut _, len, ProtFlags::empty(), flags) };
        match got {
            Ok(p) if addr == 0 || p as usize == addr => Ok(Some(Reservation { addr: p as usize, len })),
            Ok(p) => {
                // A kernel that ignores FIXED_NOREPLACE (before 4.17) placed it elsewhere.
                drop(Reservation { addr: p as usize, len });
                Ok(None)
            }
            Err(rustix::io::Errno::EXIST) => Ok(None),
            Err(e) => Err(sys("mmap (reserving an address range)", e)),
        }
    }

    /// The address, now the caller's to map over (not unmapped when this goes).
    pub(crate) fn take(self) -> usize {
        let addr = self.addr;
        std::mem::forget(self);
        addr
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: the inaccessible mapping this value made; nothing refers to it.
        #[allow(unsafe_code)]
        unsafe {
            let _ = rustix::mm::munmap(self.addr as *mut _, self.len);
        }
    }
}

/// A failed system call as the shared memory's error.
pub(crate) fn sys(what: &'static str, e: rustix::io::Errno) -> DsmError {
    DsmError::System { what, errno: e.raw_os_error() }
}
