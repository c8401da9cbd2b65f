//! memfd-backed shared windows.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use rustix::fs::{MemfdFlags, OFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// The largest window one region may have (16 GiB): bounds what a peer can make us map.
pub const SHM_REGION_BYTES_MAX: u64 = 16 << 30;

/// Errors of the shared-memory layer.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A system call failed.
    #[error("{op}: {source}")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The error the kernel returned.
        source: std::io::Error,
    },
    /// A window length of zero or above [`SHM_REGION_BYTES_MAX`] was asked for.
    #[error("window length {0} is outside 1..={SHM_REGION_BYTES_MAX}")]
    BadLength(u64),
    /// A descriptor from a peer is not a sealed memfd of a fixed size, so mapping it could
    /// fault later when the other side shrinks it.
    #[error("descriptor from peer is not a size-sealed memfd")]
    NotSealed,
    /// A ring's header does not describe a valid ring.
    #[error("shared ring is malformed: {0}")]
    BadRing(&'static str),
    /// The memory was sealed against new writable mappings (a read-only descriptor of it was
    /// handed out since): a writer needs the owner to move it to fresh memory first.
    #[error("the memory is sealed against new writable mappings")]
    WriteSealed,
}

impl ShmError {
    pub(crate) fn sys(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> Self {
        move |e| ShmError::Sys { op, source: e.into() }
    }
}

/// How a mapping may be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapAccess {
    /// Loads only; the descriptor itself is read-only, so the kernel refuses stores.
    ReadOnly,
    /// Loads and stores.
    ReadWrite,
}

/// A window of shared memory backed by a memfd and mapped into this process.
///
/// The owner creates it with [`SharedMem::create`]; a peer maps the descriptor it was sent
/// with [`SharedMem::from_fd`]. Both see the same bytes. The size is sealed at creation, so a
/// peer's mapping can never fault because the other side shrank the file.
pub struct SharedMem {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    access: MapAccess,
}

// SAFETY: the mapping is plain shared memory owned by this value until Drop; all access goes
// through raw-pointer copies and atomics that are valid from any thread.
#[allow(unsafe_code)]
unsafe impl Send for SharedMem {}
// SAFETY: as above; no method hands out a `&mut` into the mapping.
#[allow(unsafe_code)]
unsafe impl Sync for SharedMem {}

impl std::fmt::Debug for SharedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMem")
            .field("len", &self.len)
            .field("fd", &self.fd.as_raw_fd())
            .field("access", &self.access)
            .finish()
    }
}

fn map(fd: BorrowedFd<'_>, len: usize, access: MapAccess) -> Result<NonNull<u8>, ShmError> {
    let prot = match access {
        MapAccess::ReadOnly => ProtFlags::READ,
        MapAccess::ReadWrite => ProtFlags::READ | ProtFlags::WRITE,
    };
    // SAFETY: a fresh mapping chosen by the kernel (null hint, no MAP_FIXED) aliases no Rust
    // object; `len` is the sealed size of the file, so every byte of it is backed.
    #[allow(unsafe_code)]
    let p = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0) }
        .map_err(ShmError::sys("mmap"))?;
    NonNull::new(p.cast::<u8>()).ok_or(ShmError::BadRing("mmap returned null"))
}

fn new_memfd(name: &str, len: u64) -> Result<OwnedFd, ShmError> {
    if len == 0 || len > SHM_REGION_BYTES_MAX {
        return Err(ShmError::BadLength(len));
    }
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(ShmError::sys("memfd_create"))?;
    rustix::fs::ftruncate(&fd, len).map_err(ShmError::sys("ftruncate"))?;
    // Owner read-only (a memfd starts 0777): this descriptor stays writable. The mode is no
    // barrier to a peer of the same user (it may change the mode of what it was handed, then
    // reopen it through `/proc`): what keeps a read-only peer out is the seal that
    // [`SharedMem::readonly_fd`] adds first. The size is sealed now, so that no mapping can
    // ever fault; further seals stay possible (that one among them).
    rustix::fs::fchmod(&fd, rustix::fs::Mode::RUSR).map_err(ShmError::sys("fchmod"))?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).map_err(ShmError::sys("seal"))?;
    Ok(fd)
}

impl SharedMem {
    /// Create a zeroed window of `len` bytes, readable and writable.
    pub fn create(name: &str, len: u64) -> Result<Self, ShmError> {
        let fd = new_memfd(name, len)?;
        let len = len as usize;
        let ptr = map(fd.as_fd(), len, MapAccess::ReadWrite)?;
        Ok(SharedMem { ptr, len, fd, access: MapAccess::ReadWrite })
    }

    /// Map a descriptor received from a peer. The length is taken from the file itself, never
    /// from the peer's word, and the file must be size-sealed.
    pub fn from_fd(fd: OwnedFd, access: MapAccess) -> Result<Self, ShmError> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|_| ShmError::NotSealed)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(ShmError::NotSealed);
        }
        if access == MapAccess::ReadWrite && seals.intersects(SealFlags::WRITE | SealFlags::FUTURE_WRITE) {
            return Err(ShmError::WriteSealed);
        }
        let st = rustix::fs::fstat(&fd).map_err(ShmError::sys("fstat"))?;
        let len = st.st_size as u64;
        if len == 0 || len > SHM_REGION_BYTES_MAX {
            return Err(ShmError::BadLength(len));
        }
        let ptr = map(fd.as_fd(), len as usize, access)?;
        Ok(SharedMem { ptr, len: len as usize, fd, access })
    }

    /// The descriptor, to pass to a peer that may read and write.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A new read-only descriptor of the same memory, to pass to a peer that may only read.
    /// The memory is sealed against new writable mappings and writes first
    /// (`F_SEAL_FUTURE_WRITE`): the kernel then refuses a writable mapping, a `write`, or a
    /// hole punched into it through any descriptor, even one the peer reopened for writing
    /// through `/proc` after changing the file's mode (which a peer of the same user can do).
    /// Mappings made before the seal — this process's own, and those of peers that may write
    /// — go on working; a writer that maps it after the seal is refused
    /// ([`ShmError::WriteSealed`]) until the memory moves ([`SharedMem::replace_backing`]).
    /// Fails when the seal cannot be added (someone sealed the seals: move the memory).
    pub fn readonly_fd(&self) -> Result<OwnedFd, ShmError> {
        self.seal_future_writes()?;
        let path = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        rustix::fs::open(path.as_str(), OFlags::RDONLY | OFlags::CLOEXEC, rustix::fs::Mode::empty())
            .map_err(ShmError::sys("reopen read-only"))
    }

    /// Seal the memory against new writable mappings and writes (see
    /// [`SharedMem::readonly_fd`]); done once, kept until the memory moves.
    pub fn seal_future_writes(&self) -> Result<(), ShmError> {
        if self.write_sealed() {
            return Ok(());
        }
        rustix::fs::fcntl_add_seals(&self.fd, SealFlags::FUTURE_WRITE).map_err(ShmError::sys("seal future writes"))
    }

    /// Whether no new writable mapping of this memory can be made (a read-only descriptor was
    /// handed out, or a peer sealed it).
    pub fn write_sealed(&self) -> bool {
        rustix::fs::fcntl_get_seals(&self.fd).is_ok_and(|s| s.intersects(SealFlags::WRITE | SealFlags::FUTURE_WRITE))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Map every page of the window into this process now (the kernel's page tables filled,
    /// memory given to pages never touched), so that no access to it later takes a page fault:
    /// for memory on the fast path, such as a ring, whose first pass would otherwise pay a
    /// fault per page on each side. Best effort: a kernel without `MADV_POPULATE_*` (before
    /// Linux 5.14) leaves the pages to fault in as they are touched.
    pub fn prefault(&self) {
        let advice = match self.access {
            MapAccess::ReadOnly => rustix::mm::Advice::LinuxPopulateRead,
            MapAccess::ReadWrite => rustix::mm::Advice::LinuxPopulateWrite,
        };
        // SAFETY: the range is exactly this window's own mapping, alive while `self` is;
        // populating changes no byte of it and no mapping's protection.
        #[allow(unsafe_code)]
        let _ = unsafe { rustix::mm::madvise(self.ptr.as_ptr().cast(), self.len, advice) };
    }

    /// Always false: windows are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How this mapping may be used.
    pub fn access(&self) -> MapAccess {
        self.access
    }

    /// The base address of the mapping. Valid for `len()` bytes while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn range_ok(&self, offset: u64, len: usize) -> bool {
        offset.checked_add(len as u64).is_some_and(|end| end <= self.len as u64)
    }

    /// Copy `data` into the window at `offset`. Returns false, touching nothing, when the
    /// range is outside the window or the mapping is read-only.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> bool {
        if !self.range_ok(offset, data.len()) || self.access != MapAccess::ReadWrite {
            return false;
        }
        // An aligned word goes in one store, so a reader of it never sees a mix of old and new.
        if let (Ok(word), Some(a)) = (<[u8; 8]>::try_from(data), self.atomic_u64(offset)) {
            a.store(u64::from_le_bytes(word), std::sync::atomic::Ordering::Release);
            return true;
        }
        // SAFETY: the range was checked to lie inside the live, writable mapping; `data` is
        // valid for its length, and may overlap it (see `copy_raw_overlapping`).
        #[allow(unsafe_code)]
        unsafe {
            crate::memcpy::copy_raw_overlapping(data.as_ptr(), self.as_ptr().add(offset as usize), data.len())
        };
        true
    }

    /// Copy bytes from the window at `offset` into `out`. Returns false, touching nothing,
    /// when the range is outside the window.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> bool {
        if !self.range_ok(offset, out.len()) {
            return false;
        }
        // SAFETY: the range was checked to lie inside the live mapping; `out` is valid for its
        // length (foreign code may hand the window's own memory as `out`: the copy allows it).
        #[allow(unsafe_code)]
        unsafe {
            crate::memcpy::copy_raw_overlapping(self.as_ptr().add(offset as usize), out.as_mut_ptr(), out.len())
        };
        true
    }

    /// The 64-bit word at `offset` as an atomic, when it is 8-byte aligned, inside the window,
    /// and the mapping is writable (atomics store even when they fail to swap).
    pub fn atomic_u64(&self, offset: u64) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8) || !self.range_ok(offset, 8) || self.access != MapAccess::ReadWrite {
            return None;
        }
        // SAFETY: aligned (mapping base is page-aligned, offset is a multiple of 8), in bounds,
        // writable, and lives as long as `&self`; AtomicU64 has the layout of u64, and all
        // sides of the window use atomic instructions on such words.
        #[allow(unsafe_code)]
        Some(unsafe { &*(self.as_ptr().add(offset as usize) as *const AtomicU64) })
    }

    /// Move the window onto a fresh memfd with the same contents, at the same address in this
    /// process. Every peer mapping of the old descriptor is thereby cut off: its stores land
    /// in memory nobody reads any more. Used when a peer does not answer a revocation.
    ///
    /// The caller must make sure nothing in this process writes the window meanwhile.
    pub fn replace_backing(&mut self, name: &str) -> Result<(), ShmError> {
        let fd = new_memfd(name, self.len as u64)?;
        // SAFETY: our own live mapping of `len` bytes, read while the caller keeps this
        // process from writing it (peers' stores at this moment are exactly what we cut off).
        #[allow(unsafe_code)]
        let current = unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) };
        let mut done = 0;
        while done < self.len {
            done += rustix::io::pwrite(&fd, &current[done..], done as u64).map_err(ShmError::sys("pwrite"))?;
        }
        let prot = ProtFlags::READ | ProtFlags::WRITE;
        // SAFETY: MAP_FIXED replaces exactly our own mapping [ptr, ptr+len) in one step with a
        // mapping of a file of the same sealed size, so every address that was valid stays
        // valid and now shows the copied contents.
        #[allow(unsafe_code)]
        unsafe { rustix::mm::mmap(self.as_ptr().cast(), self.len, prot, MapFlags::SHARED | MapFlags::FIXED, &fd, 0) }
            .map_err(ShmError::sys("mmap fixed"))?;
        self.fd = fd;
        Ok(())
    }
}

/// Whether the kernel lets `fd` be mapped writable and shared: the mapping is made and undone
/// at once. For checks that a descriptor a peer holds cannot be turned into a writable mapping
/// (tests, diagnostics); nothing is written.
pub fn probe_writable_mapping(fd: BorrowedFd<'_>) -> Result<(), ShmError> {
    let len = rustix::fs::fstat(fd).map_err(ShmError::sys("fstat"))?.st_size.max(1) as usize;
    // SAFETY: a fresh mapping chosen by the kernel (null hint, no MAP_FIXED) aliases no Rust
    // object, is never read or written, and is unmapped before returning.
    #[allow(unsafe_code)]
    let p = unsafe {
        rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, 0)
    }
    .map_err(ShmError::sys("mmap writable"))?;
    // SAFETY: the mapping just made, of `len` bytes, borrowed by nothing.
    #[allow(unsafe_code)]
    unsafe {
        let _ = rustix::mm::munmap(p, len);
    }
    Ok(())
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by us with this length and nothing borrows it any more
        // (every borrow is tied to `&self`).
        #[allow(unsafe_code)]
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a second mapping of the same descriptor sees the owner's stores, and that a
    // read-only descriptor yields a mapping that refuses writes and atomics (checked by the
    // accessors returning false / None, and the bytes staying as they were).
    #[test]
    fn two_views_share_bytes_and_readonly_refuses() {
        let owner = SharedMem::create("t", 4096).unwrap();
        assert!(owner.write_at(100, b"hello"));
        let dup = rustix::io::dup(owner.fd()).unwrap();
        let peer = SharedMem::from_fd(dup, MapAccess::ReadWrite).unwrap();
        let mut buf = [0u8; 5];
        assert!(peer.read_at(100, &mut buf));
        assert_eq!(&buf, b"hello");
        let ro = SharedMem::from_fd(owner.readonly_fd().unwrap(), MapAccess::ReadOnly).unwrap();
        assert!(!ro.write_at(0, b"x"));
        assert!(ro.atomic_u64(0).is_none());
        assert!(!owner.write_at(4095, b"ab"), "range past the end must be refused");
        assert!(owner.atomic_u64(4).is_none(), "misaligned atomic must be refused");
    }

    // Checks that a writable mapping of a read-only descriptor is refused, which is what makes
    // a read-only grant hold even against a peer that bypasses the library.
    #[test]
    fn kernel_refuses_writable_map_of_readonly_fd() {
        let owner = SharedMem::create("t", 4096).unwrap();
        let err = SharedMem::from_fd(owner.readonly_fd().unwrap(), MapAccess::ReadWrite);
        assert!(matches!(err, Err(ShmError::WriteSealed)), "{err:?}");
    }

    // Checks a read-only descriptor against a peer of the same user that attacks it as the
    // issue found (the file's mode was the only barrier): the peer changes the file's mode to
    // 0600 (allowed: it is the same user), reopens its descriptor for writing through
    // `/proc/self/fd`, then tries a writable shared mapping straight from the kernel (not
    // through the library's checks), a `pwrite`, and punching a hole (which would zero the
    // owner's bytes); each is refused (EPERM), and the owner's bytes are as the owner wrote
    // them, which it can still change through its own mapping and the reader sees.
    #[test]
    fn a_read_only_descriptor_cannot_be_made_writable() {
        use rustix::fs::{FallocateFlags, Mode};
        let owner = SharedMem::create("t", 4096).unwrap();
        assert!(owner.write_at(0, b"owner's"));
        let ro = owner.readonly_fd().unwrap();
        rustix::fs::fchmod(&ro, Mode::RUSR | Mode::WUSR).expect("the same user may change the mode");
        let path = format!("/proc/self/fd/{}", ro.as_raw_fd());
        let rw = rustix::fs::open(path.as_str(), OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .expect("reopened for writing after the mode change");
        let prot = ProtFlags::READ | ProtFlags::WRITE;
        // SAFETY: a fresh mapping chosen by the kernel (null hint); it is expected to be refused,
        // and unmapped at once if it is not.
        #[allow(unsafe_code)]
        let mapped = unsafe { rustix::mm::mmap(std::ptr::null_mut(), 4096, prot, MapFlags::SHARED, &rw, 0) };
        if let Ok(p) = mapped {
            // SAFETY: the mapping just made, of 4096 bytes, borrowed by nothing.
            #[allow(unsafe_code)]
            unsafe {
                let _ = rustix::mm::munmap(p, 4096);
            }
            panic!("a writable shared mapping was made of a read-only grant's memory");
        }
        assert_eq!(mapped.unwrap_err(), rustix::io::Errno::PERM);
        assert_eq!(rustix::io::pwrite(&rw, b"evil", 0).unwrap_err(), rustix::io::Errno::PERM);
        let punched = rustix::fs::fallocate(&rw, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, 0, 4096);
        assert_eq!(punched.unwrap_err(), rustix::io::Errno::PERM);
        let mut buf = [0u8; 7];
        assert!(owner.read_at(0, &mut buf));
        assert_eq!(&buf, b"owner's");
        let reader = SharedMem::from_fd(ro, MapAccess::ReadOnly).unwrap();
        assert!(owner.write_at(0, b"changed"), "the owner's own mapping still writes");
        assert!(reader.read_at(0, &mut buf));
        assert_eq!(&buf, b"changed");
    }

    // Checks the order a read-only grant imposes: a writer that mapped before the seal keeps
    // writing (the reader sees its stores); one that maps after it is refused
    // (`WriteSealed`) until the memory moves, after which it maps again and writes.
    #[test]
    fn writers_mapped_before_the_seal_keep_writing() {
        let mut owner = SharedMem::create("t", 4096).unwrap();
        let early = SharedMem::from_fd(rustix::io::dup(owner.fd()).unwrap(), MapAccess::ReadWrite).unwrap();
        let reader = SharedMem::from_fd(owner.readonly_fd().unwrap(), MapAccess::ReadOnly).unwrap();
        assert!(owner.write_sealed());
        assert!(early.write_at(8, b"early"));
        let mut buf = [0u8; 5];
        assert!(reader.read_at(8, &mut buf));
        assert_eq!(&buf, b"early");
        let late = SharedMem::from_fd(rustix::io::dup(owner.fd()).unwrap(), MapAccess::ReadWrite);
        assert!(matches!(late, Err(ShmError::WriteSealed)), "{late:?}");
        owner.replace_backing("t2").unwrap();
        assert!(!owner.write_sealed(), "fresh memory is not sealed");
        let late = SharedMem::from_fd(rustix::io::dup(owner.fd()).unwrap(), MapAccess::ReadWrite).unwrap();
        assert!(late.write_at(8, b"later"));
        assert!(owner.read_at(8, &mut buf));
        assert_eq!(&buf, b"later");
    }

    // Checks that replacing the backing keeps the owner's contents but cuts off an old peer
    // mapping: a store through the old mapping is no longer visible to the owner.
    #[test]
    fn replace_backing_cuts_off_old_mappings() {
        let mut owner = SharedMem::create("t", 8192).unwrap();
        assert!(owner.write_at(0, b"keep"));
        let peer = SharedMem::from_fd(rustix::io::dup(owner.fd()).unwrap(), MapAccess::ReadWrite).unwrap();
        owner.replace_backing("t2").unwrap();
        assert!(peer.write_at(0, b"evil"));
        let mut buf = [0u8; 4];
        assert!(owner.read_at(0, &mut buf));
        assert_eq!(&buf, b"keep");
    }

    // Checks that an unsealed descriptor (which its sender could shrink under us) is refused.
    #[test]
    fn unsealed_fd_is_refused() {
        let fd = rustix::fs::memfd_create("u", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        assert!(matches!(SharedMem::from_fd(fd, MapAccess::ReadWrite), Err(ShmError::NotSealed)));
    }
}
