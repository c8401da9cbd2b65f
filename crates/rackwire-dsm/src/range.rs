//! Page faults on a shared range: memory protection tells the protocol what a rank touches.
//!
//! Why `mprotect` and `SIGSEGV` rather than `userfaultfd`: the protocol must see the first
//! *write* to a page it holds valid (to keep its twin), not only the first touch of a missing
//! one. `userfaultfd` reports missing pages everywhere, but write-protect faults only on kernels
//! and memory types that support them, and it is often closed to unprivileged processes
//! (`vm.unprivileged_userfaultfd`); a protection fault works everywhere, as in TreadMarks and
//! GeNIMA.
//!
//! A range is one shared memory seen twice: the *service view*, always writable (the memory as
//! its owner mapped it: a memory file of the range's own, or a fabric region, whose bytes other
//! ranks then read and write one-sided), through which fetched pages are written, twins and
//! diffs are read, and diffs land at a home; and the *application's view*, a second mapping of
//! the same pages (`mremap` of the shared mapping with an old size of 0) whose pages carry the
//! protection the protocol asks for — so a page never has to be made writable in the
//! application's view while its bytes arrive.
//!
//! A raw access to a protected page faults: the process's `SIGSEGV` handler (see `handler.rs`)
//! posts it to the range's service thread and sleeps until it is resolved. The accessors
//! ([`Range::read_u64`], [`Range::read_words`], ...) look at the page's state first and resolve
//! a miss in the calling thread, without the signal and the hand-off. The word-run accessors
//! ([`Range::read_words`], [`Range::write_words`]) copy through the service view: they need the
//! protocol's leave (a valid copy; for a write, its twin kept) but no protection change, so a
//! page an application writes only through them is never made writable in its view, and its
//! release has no protection to take back (a raw write to such a page faults once, and the
//! protocol, which knows it written, only opens the view).
//!
//! Whether a fault was a read or a write is told by the page's protection, not the machine's
//! fault code: a fault on a readable page is a write; on an unreadable one it is taken as a
//! read, and a write then faults once more, on the page now readable.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::mm::MprotectFlags;
use rustix::thread::futex;

use crate::handler::{install_handler, now_ns, register, unregister, Queue, DONE, POSTED};
use crate::memory::{mappings_left, sys, OwnMemory, Reservation, SharedBytes};
use crate::protocol::{Access, Action, DsmError, PageId, PageState, Protocol, Rank, Released};
use crate::PAGE_BYTES;

/// How long the service thread sleeps before it looks whether it should stop (µs).
const STOP_CHECK_US: i64 = 100_000;

/// How a rank reaches the other ranks: the page fetched from its home.
pub trait Backend: Send + 'static {
    /// Read page `page` from its home `home` into `out` (a page long).
    fn fetch(&mut self, page: PageId, home: Rank, out: &mut [u8]) -> Result<(), DsmError>;

    /// Read several pages, `(page, home)` each into its `outs` entry: a backend that can
    /// have them on their way at once does so (by default, one after another).
    fn fetch_many(&mut self, pages: &[(PageId, Rank)], outs: Vec<&mut [u8]>) -> Result<(), DsmError> {
        for (&(page, home), out) in pages.iter().zip(outs) {
            self.fetch(page, home, out)?;
        }
        Ok(())
    }
}

/// What the service thread and the calls share.
struct Inner {
    protocol: Mutex<Protocol>,
    backend: Mutex<Box<dyn Backend>>,
    /// The application's view and the service view, each `len` bytes.
    app: usize,
    service: usize,
    len: usize,
    /// Each page's protection in the application's view ([`level`]), set after the
    /// protection itself changed: an accessor that finds it high enough may go ahead (and if
    /// it changed since, the access faults, as any access does).
    access: Box<[AtomicU8]>,
    /// Each page's state in the protocol as a [`level`]: what this rank may do with its copy
    /// (none: no valid copy; read; write: written in this interval, its twin kept), set under
    /// the protocol's lock after each change. The word-run accessors go by it, not by the view.
    held: Box<[AtomicU8]>,
    /// Held while master copies change (a diff applied) or are read for a fetch: taken after
    /// the protocol's lock, never before it, so ranks fetching from each other cannot wait on
    /// each other.
    master: Mutex<()>,
    queue: Box<Queue>,
    stop: AtomicBool,
    /// The first error the service thread met resolving a fault (the fault is then left to
    /// kill the process, as an access to unmapped memory would).
    failed: Mutex<Option<DsmError>>,
    /// Whether `failed` holds an error: every access looks, so the look is a load, not a lock.
    has_failed: AtomicBool,
    /// Nanoseconds spent fetching pages from their homes.
    fetch_ns: AtomicU64,
    /// The memory the service view is (kept alive for it).
    _memory: Box<dyn SharedBytes>,
}

// SAFETY: the two views are plain addresses of mappings this value owns; every access to them
// goes through the methods below, under the protocol's lock or by the application itself.
#[allow(unsafe_code)]
unsafe impl Send for Inner {}
// SAFETY: as above; the queue is atomics only.
#[allow(unsafe_code)]
unsafe impl Sync for Inner {}

/// One rank's shared range: its memory, its protocol, its service thread.
pub struct Range {
    inner: Arc<Inner>,
    slot: usize,
    thread: Option<JoinHandle<()>>,
}

impl Range {
    /// Map a range for `protocol`'s pages, fetching through `backend`, and start its service
    /// thread. Pages homed here start readable (their master copy is this rank's), the others
    /// unreadable.
    pub fn new(protocol: Protocol, backend: impl Backend) -> Result<Range, DsmError> {
        let memory = OwnMemory::new(protocol.bytes().max(PAGE_BYTES))?;
        Range::over(Box::new(memory), protocol, backend)
    }

    /// [`Range::new`] on `memory` (its first `protocol.bytes()` bytes): the service view is
    /// the memory itself, the application's view a second mapping of it.
    pub fn over(memory: Box<dyn SharedBytes>, protocol: Protocol, backend: impl Backend) -> Result<Range, DsmError> {
        Range::over_at(memory, protocol, backend, None)
    }

    /// [`Range::over`] with the application's view at the address `at` holds (a reservation
    /// of the range's length, which the view replaces), where given.
    pub(crate) fn over_at(
        memory: Box<dyn SharedBytes>,
        protocol: Protocol,
        backend: impl Backend,
        at: Option<Reservation>,
    ) -> Result<Range, DsmError> {
        let len = protocol.bytes();
        if len == 0 || len > memory.len() {
            return Err(DsmError::Limit { what: "range bytes", n: len, max: memory.len() });
        }
        let pages = len / PAGE_BYTES;
        if let Some(max) = mappings_left() {
            if pages > max {
                return Err(DsmError::Limit {
                    what: "pages of a range (each may become a mapping of its own; raise vm.max_map_count)",
                    n: pages,
                    max,
                });
            }
        }
        install_handler();
        let service = memory.ptr() as usize;
        let app = match at {
            Some(r) if r.len == len => {
                let addr = r.take();
                // SAFETY: `memory` is a shared mapping of at least `len` bytes at `service` (its
                // trait's promise): an old size of 0 makes a second mapping of the same pages;
                // `addr..addr + len` is this process's own reservation (no Rust object lives
                // there), which the new view replaces.
                #[allow(unsafe_code)]
                let moved = unsafe {
                    rustix::mm::mremap_fixed(
                        service as *mut _,
                        0,
                        len,
                        rustix::mm::MremapFlags::MAYMOVE,
                        addr as *mut _,
                    )
                };
                match moved {
                    Ok(p) => p as usize,
                    Err(e) => {
                        drop(Reservation { addr, len });
                        return Err(sys("mremap (the range's view at its address)", e));
                    }
                }
            }
            // SAFETY: as above, the second mapping where the kernel puts it.
            _ => {
                #[allow(unsafe_code)]
                let view = unsafe { rustix::mm::mremap(service as *mut _, 0, len, rustix::mm::MremapFlags::MAYMOVE) };
                view.map_err(|e| sys("mremap (a second view of the range's memory)", e))? as usize
            }
        };
        let access: Vec<Access> = (0..protocol.pages() as PageId)
            .map(|p| if protocol.home(p) == Ok(protocol.me()) { Access::Read } else { Access::None })
            .collect();
        let queue = Box::new(Queue::new());
        let inner = Arc::new(Inner {
            protocol: Mutex::new(protocol),
            backend: Mutex::new(Box::new(backend)),
            app,
            service,
            len,
            // A fresh view has the memory's own protection (read and write): every page's is
            // set below, as the protocol starts it.
            access: access.iter().map(|_| AtomicU8::new(level(Access::ReadWrite))).collect(),
            held: access.iter().map(|a| AtomicU8::new(level(*a))).collect(),
            master: Mutex::new(()),
            queue,
            stop: AtomicBool::new(false),
            failed: Mutex::new(None),
            has_failed: AtomicBool::new(false),
            fetch_ns: AtomicU64::new(0),
            _memory: memory,
        });
        inner.protect_all(access.iter().enumerate().map(|(p, a)| (p as PageId, *a)).collect())?;
        let slot = register(&inner.queue, inner.app, inner.len)?;
        let runner = inner.clone();
        let thread = std::thread::Builder::new()
            .name("rw-dsm".into())
            .spawn(move || runner.serve())
            .map_err(|_| DsmError::System { what: "spawning the service thread", errno: 0 })?;
        Ok(Range { inner, slot, thread: Some(thread) })
    }

    /// The application's view: `len()` bytes at this address, every access to which the
    /// protocol sees.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.app as *mut u8
    }

    /// Bytes of the range.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Never empty (a range has a page at least).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Read the byte at `at` through the application's view.
    #[inline]
    pub fn read(&self, at: usize) -> Result<u8, DsmError> {
        self.check(at)?;
        self.ready(at, false)?;
        // SAFETY: `at` lies inside the application's view, which lives as long as `self`; a
        // volatile read so the access really happens here (and faults, if the page's
        // protection changed since `ready`).
        #[allow(unsafe_code)]
        Ok(unsafe { std::ptr::read_volatile(self.as_ptr().add(at)) })
    }

    /// Write the byte at `at` through the application's view.
    #[inline]
    pub fn write(&self, at: usize, v: u8) -> Result<(), DsmError> {
        self.check(at)?;
        self.ready(at, true)?;
        // SAFETY: as for `read`.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::write_volatile(self.as_ptr().add(at), v)
        };
        Ok(())
    }

    /// Read the aligned 8-byte word at `at` through the application's view.
    #[inline]
    pub fn read_u64(&self, at: usize) -> Result<u64, DsmError> {
        self.check_word(at)?;
        self.ready(at, false)?;
        // SAFETY: an aligned word inside the application's view, which lives as long as `self`;
        // volatile, as in `read`.
        #[allow(unsafe_code)]
        Ok(unsafe { std::ptr::read_volatile(self.as_ptr().add(at) as *const u64) })
    }

    /// Write the aligned 8-byte word at `at` through the application's view.
    #[inline]
    pub fn write_u64(&self, at: usize, v: u64) -> Result<(), DsmError> {
        self.check_word(at)?;
        self.ready(at, true)?;
        // SAFETY: as for `read_u64`.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::write_volatile(self.as_ptr().add(at) as *mut u64, v)
        };
        Ok(())
    }

    /// Read `out.len()` words from the aligned offset `at` (a page's state looked at once per
    /// page), copied through the service view.
    pub fn read_words(&self, at: usize, out: &mut [u64]) -> Result<(), DsmError> {
        let service = self.inner.service as *const u8;
        self.span(at, out.len(), false, |at, chunk| {
            let dst = &mut out[chunk];
            // SAFETY: `span` checked `at..at + 8 * chunk` lies inside the range (the service
            // view is as long) and that the protocol holds the page valid here; a copy out of
            // the mapping into the caller's words, which do not overlap it (its own memory).
            #[allow(unsafe_code)]
            unsafe {
                std::ptr::copy_nonoverlapping(service.add(at) as *const u64, dst.as_mut_ptr(), dst.len())
            };
        })
    }

    /// Write `words` at the aligned offset `at`, through the service view.
    pub fn write_words(&self, at: usize, words: &[u64]) -> Result<(), DsmError> {
        let service = self.inner.service as *mut u8;
        self.span(at, words.len(), true, |at, chunk| {
            let src = &words[chunk];
            // SAFETY: as in `read_words`, the protocol holding the page written here (its twin
            // kept): the service view is always writable.
            #[allow(unsafe_code)]
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), service.add(at) as *mut u64, src.len())
            };
        })
    }

    /// Fetch the pages of `spans` (`(offset, bytes)` each) that have no valid copy here, all
    /// on their way at once: what an application about to read them asks, so that it waits
    /// for one round trip rather than one per page.
    pub fn prefetch(&self, spans: &[(usize, usize)]) -> Result<(), DsmError> {
        let mut pages = Vec::new();
        for &(at, bytes) in spans {
            if bytes == 0 {
                continue;
            }
            let end = at.saturating_add(bytes);
            self.check(end - 1)?;
            pages.extend(at / PAGE_BYTES..=(end - 1) / PAGE_BYTES);
        }
        pages.sort_unstable();
        pages.dedup();
        self.waiting(|| self.fetch_missing(pages, 1))
    }

    /// Fetch together those of `pages` with no valid copy here, if there are at least `min`.
    fn fetch_missing(&self, pages: impl IntoIterator<Item = usize>, min: usize) -> Result<(), DsmError> {
        let missing: Vec<PageId> = pages
            .into_iter()
            .filter(|&p| self.inner.held[p].load(Ordering::Acquire) == level(Access::None))
            .map(|p| p as PageId)
            .collect();
        if missing.len() < min {
            return Ok(());
        }
        self.inner.batch(missing, Opens::View, |p, page, copy| p.fault(page, false, copy))
    }

    /// Run `f`, its time counted as the application's wait for its pages.
    fn waiting<T>(&self, f: impl FnOnce() -> T) -> T {
        let start = now_ns();
        let out = f();
        self.inner.queue.waited_ns.fetch_add(now_ns().saturating_sub(start), Ordering::Relaxed);
        out
    }

    /// Check `n` words from `at`, then for each page they touch: have the protocol's leave for
    /// it, and `copy` the words on it (`copy(offset, range of the words)`).
    fn span(
        &self,
        at: usize,
        n: usize,
        write: bool,
        mut copy: impl FnMut(usize, std::ops::Range<usize>),
    ) -> Result<(), DsmError> {
        if n == 0 {
            return Ok(());
        }
        self.check_word(at)?;
        let end = n.checked_mul(8).and_then(|b| b.checked_add(at)).unwrap_or(usize::MAX);
        self.check(end - 1)?;
        // The pages of the span with no valid copy are fetched together (their fetches on the
        // way at once), before the walk readies each for the access.
        let pages = at / PAGE_BYTES..=(end - 1) / PAGE_BYTES;
        let want = level(if write { Access::ReadWrite } else { Access::Read });
        if pages.clone().any(|p| self.inner.held[p].load(Ordering::Acquire) < want) {
            self.waiting(|| self.gather(at, end, write))?;
        }
        let mut off = at;
        while off < end {
            let next = ((off / PAGE_BYTES + 1) * PAGE_BYTES).min(end);
            self.hold(off / PAGE_BYTES, want)?;
            copy(off, (off - at) / 8..(next - at) / 8);
            off = next;
        }
        Ok(())
    }

    /// Have the protocol's leave to read (`want` read) or write page `page` through the
    /// service view, asking for it in this thread if it is not held: a fetch, a twin — never a
    /// protection change of the application's view to writable.
    #[inline]
    fn hold(&self, page: usize, want: u8) -> Result<(), DsmError> {
        let held = &self.inner.held[page];
        if held.load(Ordering::Acquire) >= want {
            return Ok(());
        }
        self.waiting(|| {
            // A write to a page with no copy takes two steps (fetched, then written), as a
            // fault would.
            for _ in 0..2 {
                let now = held.load(Ordering::Acquire);
                if now >= want {
                    break;
                }
                let write = now == level(Access::Read);
                self.inner.batch([page as PageId], Opens::Protocol, |p, page, copy| p.fault(page, write, copy))?;
            }
            // Copying through the service view without the leave would read a stale copy or
            // write one no diff tracks: refused instead.
            if held.load(Ordering::Acquire) < want {
                return Err(DsmError::NotHeld(page as PageId));
            }
            Ok(())
        })
    }

    /// Before an access to `at..end` that finds pages not held: pages written whole are taken
    /// for writing without a fetch, the others missing are fetched together, and (for a write)
    /// the readable ones are taken for writing together.
    fn gather(&self, at: usize, end: usize, write: bool) -> Result<(), DsmError> {
        let pages = at / PAGE_BYTES..=(end - 1) / PAGE_BYTES;
        // A write that covers a page whole needs none of its old bytes: no fetch.
        let whole = |p: &usize| write && p * PAGE_BYTES >= at && (p + 1) * PAGE_BYTES <= end;
        let written: Vec<PageId> = pages
            .clone()
            .filter(|p| whole(p) && self.inner.held[*p].load(Ordering::Acquire) == level(Access::None))
            .map(|p| p as PageId)
            .collect();
        if !written.is_empty() {
            self.inner.batch(written, Opens::Protocol, |p, page, copy| p.overwrite(page, copy))?;
        }
        self.fetch_missing(pages.clone().filter(|p| !whole(p)), 2)?;
        if write {
            // Pages readable but not writable yet: their write faults together (one
            // protection change for neighbours).
            let upgrade: Vec<PageId> = pages
                .filter(|&p| self.inner.held[p].load(Ordering::Acquire) == level(Access::Read))
                .map(|p| p as PageId)
                .collect();
            if upgrade.len() > 1 {
                self.inner.batch(upgrade, Opens::Protocol, |p, page, copy| p.fault(page, true, copy))?;
            }
        }
        Ok(())
    }

    /// Make the page of `at` readable (or writable) for an access through the accessors: the
    /// protocol runs in the calling thread, as for a fault but without the signal and the
    /// hand-off to the service thread (whose wake-up is most of a fault's cost where cores
    /// sleep deeply). A write to an unreadable page takes two steps, as it would fault twice.
    #[inline]
    fn ready(&self, at: usize, write: bool) -> Result<(), DsmError> {
        let want = level(if write { Access::ReadWrite } else { Access::Read });
        let state = &self.inner.access[at / PAGE_BYTES];
        if state.load(Ordering::Acquire) >= want {
            return Ok(());
        }
        self.miss(at, want)
    }

    #[cold]
    fn miss(&self, at: usize, want: u8) -> Result<(), DsmError> {
        let state = &self.inner.access[at / PAGE_BYTES];
        self.waiting(|| {
            for _ in 0..2 {
                if state.load(Ordering::Acquire) >= want {
                    break;
                }
                self.inner.resolve(self.inner.app + at)?;
            }
            Ok(())
        })
    }

    #[inline]
    fn check_word(&self, at: usize) -> Result<(), DsmError> {
        if !at.is_multiple_of(8) {
            return Err(DsmError::Misaligned { at });
        }
        self.check(at.saturating_add(7))
    }

    #[inline]
    fn check(&self, at: usize) -> Result<(), DsmError> {
        if self.inner.has_failed.load(Ordering::Acquire) {
            if let Some(e) = lock(&self.inner.failed).clone() {
                return Err(e);
            }
        }
        if at >= self.inner.len {
            return Err(DsmError::NoSuchPage { page: (at / PAGE_BYTES) as PageId, pages: self.inner.len / PAGE_BYTES });
        }
        Ok(())
    }

    /// A release (see [`Protocol::release`]): the diffs to write to the homes, the notices,
    /// and the written pages read-only again.
    pub fn release(&self) -> Result<Released, DsmError> {
        let mut p = lock(&self.inner.protocol);
        let rel = p.release(|page| self.inner.service_page(page));
        self.inner.carry_out(&mut p, rel.actions.clone(), Opens::View)?;
        Ok(rel)
    }

    /// An acquire (see [`Protocol::acquire`]) of other ranks' `notices`.
    pub fn acquire(&self, notices: &[PageId]) -> Result<Released, DsmError> {
        let mut p = lock(&self.inner.protocol);
        let acq = p.acquire(notices, |page| self.inner.service_page(page))?;
        self.inner.carry_out(&mut p, acq.actions.clone(), Opens::View)?;
        Ok(acq)
    }

    /// Move pages' homes (see [`Protocol::rehome`]): `(page, new home)` each; the fetches a
    /// move needs are done when this returns.
    pub fn rehome(&self, moves: &[(PageId, Rank)]) -> Result<(), DsmError> {
        let mut homes = moves.iter().map(|&(_, home)| home);
        self.inner.batch(moves.iter().map(|&(page, _)| page), Opens::View, |p, page, _| {
            p.rehome(page, homes.next().expect("one home a move"))
        })
    }

    /// As the page's home, apply another rank's diff to the master copy.
    pub fn apply_diff(&self, page: PageId, diff: &[u8]) -> Result<(), DsmError> {
        let mut p = lock(&self.inner.protocol);
        let _m = lock(&self.inner.master);
        let master = self.inner.service_page_mut(page)?;
        p.apply_diff(page, diff, master)
    }

    /// Copy page `page` as this rank holds it into `out` (a page long): what a home serves a
    /// fetch from. Takes no protocol lock (see `Inner::master`).
    pub fn read_master(&self, page: PageId, out: &mut [u8]) -> Result<(), DsmError> {
        let _m = lock(&self.inner.master);
        let src = self.inner.service_page(page);
        if src.is_empty() || out.len() != PAGE_BYTES {
            return Err(DsmError::NoSuchPage { page, pages: self.inner.len / PAGE_BYTES });
        }
        out.copy_from_slice(src);
        Ok(())
    }

    /// The protocol's counters.
    pub fn counters(&self) -> crate::Counters {
        lock(&self.inner.protocol).counters()
    }

    /// How long this range's faults held their threads (from the fault to its resolution),
    /// and how much of that went into fetching pages from their homes.
    pub fn fault_waits(&self) -> (Duration, Duration) {
        (
            Duration::from_nanos(self.inner.queue.waited_ns.load(Ordering::Relaxed)),
            Duration::from_nanos(self.inner.fetch_ns.load(Ordering::Relaxed)),
        )
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        // Unregistered first: a fault in the range from now on is nobody's (the caller's bug,
        // as any access to memory it freed).
        unregister(self.slot);
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.queue.bell.fetch_add(1, Ordering::SeqCst);
        let _ = futex::wake(&self.inner.queue.bell, futex::Flags::PRIVATE, u32::MAX);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: the application's view is the mapping of `len` bytes this range made; nothing
        // uses it any more (the service thread ended, the handler no longer finds the range).
        // The service view is the memory's own, unmapped with it.
        #[allow(unsafe_code)]
        unsafe {
            let _ = rustix::mm::munmap(self.inner.app as *mut _, self.inner.len);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    fn service_page(&self, page: PageId) -> &[u8] {
        let at = page as usize * PAGE_BYTES;
        if at + PAGE_BYTES > self.len {
            return &[];
        }
        // SAFETY: inside the service view, which lives as long as `self`; it is only written
        // under the protocol's lock, which the caller holds.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts((self.service + at) as *const u8, PAGE_BYTES)
        }
    }

    #[allow(clippy::mut_from_ref)]
    fn service_page_mut(&self, page: PageId) -> Result<&mut [u8], DsmError> {
        let at = page as usize * PAGE_BYTES;
        if at + PAGE_BYTES > self.len {
            return Err(DsmError::NoSuchPage { page, pages: self.len / PAGE_BYTES });
        }
        // SAFETY: inside the service view; written only under the protocol's lock, which the
        // caller holds, so no other reference to these bytes is alive.
        #[allow(unsafe_code)]
        Ok(unsafe { std::slice::from_raw_parts_mut((self.service + at) as *mut u8, PAGE_BYTES) })
    }

    /// Set the protection of `n` pages from `first`.
    fn protect_run(&self, first: PageId, n: usize, access: Access) -> Result<(), DsmError> {
        let flags = match access {
            Access::None => MprotectFlags::empty(),
            Access::Read => MprotectFlags::READ,
            Access::ReadWrite => MprotectFlags::READ | MprotectFlags::WRITE,
        };
        let (at, len) = (first as usize * PAGE_BYTES, n * PAGE_BYTES);
        if at + len > self.len {
            return Err(DsmError::NoSuchPage { page: first + n as PageId - 1, pages: self.len / PAGE_BYTES });
        }
        // SAFETY: whole pages inside the application's view, which this range owns.
        #[allow(unsafe_code)]
        unsafe { rustix::mm::mprotect((self.app + at) as *mut _, len, flags) }.map_err(|e| sys("mprotect", e))?;
        for a in &self.access[first as usize..first as usize + n] {
            a.store(level(access), Ordering::Release);
        }
        Ok(())
    }

    /// Carry out the protocol's actions: fetches, all on their way at once (the page's bytes
    /// written through the service view, then reported, which may ask for more), and
    /// protection changes — gathered, and made with one `mprotect` per run of neighbouring
    /// pages that get the same protection (each call costs a system call and a flush of every
    /// core's view of the mapping).
    fn carry_out(&self, p: &mut Protocol, actions: Vec<Action>, opens: Opens) -> Result<(), DsmError> {
        let mut protects: Vec<(PageId, Access)> = Vec::new();
        let mut fetches: Vec<(PageId, Rank)> = Vec::new();
        let mut touched: Vec<PageId> = Vec::new();
        let mut sort = |a: Action, fetches: &mut Vec<(PageId, Rank)>| match a {
            // For the word-run accessors, the view is not opened for writing (see `Opens`).
            Action::Protect { page, access: Access::ReadWrite } if opens == Opens::Protocol => touched.push(page),
            Action::Protect { page, access } => {
                touched.push(page);
                protects.push((page, access));
            }
            Action::Fetch { page, home } => {
                touched.push(page);
                fetches.push((page, home));
            }
        };
        for a in actions {
            sort(a, &mut fetches);
        }
        // A page overtaken by a notice while on its way is fetched again (see `fetched`).
        while !fetches.is_empty() {
            let outs = fetches.iter().map(|&(page, _)| self.service_page_mut(page)).collect::<Result<Vec<_>, _>>()?;
            let start = Instant::now();
            lock(&self.backend).fetch_many(&fetches, outs)?;
            self.fetch_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let mut again = Vec::new();
            for (page, _) in std::mem::take(&mut fetches) {
                for a in p.fetched(page, self.service_page(page))? {
                    sort(a, &mut again);
                }
            }
            fetches = again;
        }
        self.protect_all(protects)?;
        self.note_held(p, touched);
        Ok(())
    }

    /// Record the protocol's state of `pages` for the word-run accessors (under its lock). Every
    /// change of a page's state comes with an action on that page (a fetch or a protection),
    /// so the pages [`Inner::carry_out`] is handed are all whose state may have moved.
    fn note_held(&self, p: &Protocol, pages: impl IntoIterator<Item = PageId>) {
        for page in pages {
            let Some(h) = self.held.get(page as usize) else { continue };
            let l = match p.state(page) {
                Ok(PageState::Read) => level(Access::Read),
                Ok(PageState::Written) => level(Access::ReadWrite),
                _ => level(Access::None),
            };
            h.store(l, Ordering::Release);
        }
    }

    /// Set each page's protection, the last one given for a page winning; neighbouring pages
    /// with the same protection in one call.
    fn protect_all(&self, mut protects: Vec<(PageId, Access)>) -> Result<(), DsmError> {
        // Stable: of one page's protections, the last given stays last.
        protects.sort_by_key(|&(page, _)| page);
        let mut last: Vec<(PageId, Access)> = Vec::with_capacity(protects.len());
        for (page, access) in protects {
            match last.last_mut() {
                Some(l) if l.0 == page => l.1 = access,
                _ => last.push((page, access)),
            }
        }
        // A page whose view has the protection already needs no call.
        last.retain(|&(page, access)| {
            self.access.get(page as usize).is_none_or(|a| a.load(Ordering::Acquire) != level(access))
        });
        let mut i = 0;
        while i < last.len() {
            let (first, access) = last[i];
            let mut n = 1;
            while i + n < last.len() && last[i + n] == (first + n as PageId, access) {
                n += 1;
            }
            self.protect_run(first, n, access)?;
            i += n;
        }
        Ok(())
    }

    /// Events for several pages at once (`event(protocol, page)`: a fault, a move, an
    /// overwrite), their actions carried out together: fetches on their way at once, one
    /// protection change per run of neighbours.
    fn batch(
        &self,
        pages: impl IntoIterator<Item = PageId>,
        opens: Opens,
        mut event: impl FnMut(&mut Protocol, PageId, &[u8]) -> Result<Vec<Action>, DsmError>,
    ) -> Result<(), DsmError> {
        let mut p = lock(&self.protocol);
        let mut actions = Vec::new();
        for page in pages {
            actions.extend(event(&mut p, page, self.service_page(page))?);
        }
        self.carry_out(&mut p, actions, opens)
    }

    /// Resolve the fault at `addr`.
    fn resolve(&self, addr: usize) -> Result<(), DsmError> {
        let page = ((addr - self.app) / PAGE_BYTES) as PageId;
        let mut p = lock(&self.protocol);
        // A fault on a readable page is a write; on an unreadable one it is taken as a read.
        let write = self.access.get(page as usize).map(|a| a.load(Ordering::Acquire)) == Some(level(Access::Read));
        let copy = self.service_page(page);
        let actions = p.fault(page, write, copy)?;
        self.carry_out(&mut p, actions, Opens::View)
    }

    /// The service thread: resolves posted faults, sleeps on the bell between them.
    fn serve(&self) {
        let q = &self.queue;
        let wait = rustix::time::Timespec { tv_sec: 0, tv_nsec: STOP_CHECK_US * 1_000 };
        while !self.stop.load(Ordering::SeqCst) {
            let seen = q.bell.load(Ordering::SeqCst);
            let mut any = false;
            for s in &q.slots {
                if s.state.load(Ordering::Acquire) != POSTED {
                    continue;
                }
                any = true;
                let addr = s.addr.load(Ordering::Relaxed);
                if let Err(e) = self.resolve(addr) {
                    // Left unresolved, the access faults again and reaches the handler before
                    // ours: the process ends as it would on unmapped memory; the error is kept.
                    lock(&self.failed).get_or_insert(e);
                    self.has_failed.store(true, Ordering::Release);
                }
                s.state.store(DONE, Ordering::Release);
                let _ = futex::wake(&s.state, futex::Flags::PRIVATE, 1);
            }
            if !any {
                let _ = futex::wait(&q.bell, futex::Flags::PRIVATE, seen, Some(&wait));
            }
        }
    }
}

/// What a protocol call's leave to write opens: the application's view too (a raw access, a
/// fault), or only the protocol's state (the word-run accessors, which write through the
/// service view).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opens {
    View,
    Protocol,
}

/// A protection as a number that grows with what it allows.
fn level(a: Access) -> u8 {
    match a {
        Access::None => 0,
        Access::Read => 1,
        Access::ReadWrite => 2,
    }
}
