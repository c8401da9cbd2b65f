//! The process's `SIGSEGV` handler and the table it finds ranges in.
//!
//! The handler (installed once) finds the range a fault lies in, posts the fault in one of the
//! range's [`SLOTS`], wakes the range's service thread and sleeps on its slot (a futex) until the
//! service thread resolved it; then the faulting instruction runs again. The handler touches
//! only atomics and the monotonic clock and makes only futex and `sched_yield` system calls:
//! nothing that is not safe in a signal handler. A fault in no range goes to the handler that
//! was installed before (the Rust runtime's stack-overflow check, or the default: the process
//! ends as it would have).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

use rustix::thread::futex;

use crate::protocol::DsmError;

/// Faults one range holds at once (threads faulting on it at the same moment); a thread that
/// finds every slot taken yields and tries again.
pub const SLOTS: usize = 64;
/// Ranges one process maps at once.
pub const RANGES_MAX: usize = 16;
/// A slot's states: free, claimed by a faulting thread, its fault posted, resolved.
pub(crate) const FREE: u32 = 0;
const CLAIMED: u32 = 1;
pub(crate) const POSTED: u32 = 2;
pub(crate) const DONE: u32 = 3;

/// One fault waiting for the service thread.
pub(crate) struct Slot {
    pub(crate) state: AtomicU32,
    pub(crate) addr: AtomicUsize,
}

/// A range's faults, shared with the signal handler.
pub(crate) struct Queue {
    pub(crate) slots: [Slot; SLOTS],
    /// Bumped for every fault posted; the service thread sleeps on it.
    pub(crate) bell: AtomicU32,
    /// Nanoseconds faulting threads waited, from the fault to its resolution (the handler
    /// reads the monotonic clock, which is safe in a signal handler).
    pub(crate) waited_ns: AtomicU64,
}

impl Queue {
    /// Free slots, nothing waited yet.
    pub(crate) fn new() -> Queue {
        Queue {
            slots: std::array::from_fn(|_| Slot { state: AtomicU32::new(FREE), addr: AtomicUsize::new(0) }),
            bell: AtomicU32::new(0),
            waited_ns: AtomicU64::new(0),
        }
    }
}

/// Where the handler finds each range: its application view's base and length, and its queue.
struct Entry {
    base: AtomicUsize,
    len: AtomicUsize,
    queue: AtomicPtr<Queue>,
}

#[allow(clippy::declare_interior_mutable_const)]
const ENTRY: Entry =
    Entry { base: AtomicUsize::new(0), len: AtomicUsize::new(0), queue: AtomicPtr::new(std::ptr::null_mut()) };
static RANGES: [Entry; RANGES_MAX] = [ENTRY; RANGES_MAX];
/// Whether the handler is installed, and the action it replaced.
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);
static mut PREVIOUS: Option<libc::sigaction> = None;

/// Enter a range (its application view at `base`, `len` bytes, and its queue, which must stay
/// where it is until [`unregister`]) in the handler's table: its slot there.
pub(crate) fn register(queue: &Queue, base: usize, len: usize) -> Result<usize, DsmError> {
    for (i, e) in RANGES.iter().enumerate() {
        let q = queue as *const Queue as *mut Queue;
        if e.queue.compare_exchange(std::ptr::null_mut(), q, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            e.base.store(base, Ordering::SeqCst);
            e.len.store(len, Ordering::SeqCst);
            return Ok(i);
        }
    }
    Err(DsmError::Limit { what: "ranges of one process", n: RANGES_MAX + 1, max: RANGES_MAX })
}

/// Take the range in `slot` out of the table: a fault in it from now on is nobody's.
pub(crate) fn unregister(slot: usize) {
    RANGES[slot].queue.store(std::ptr::null_mut(), Ordering::SeqCst);
    RANGES[slot].len.store(0, Ordering::SeqCst);
}

/// Install the process's `SIGSEGV` handler, once.
pub(crate) fn install_handler() {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed `sigaction` is a valid value to fill; `on_segv` has the signature
        // `SA_SIGINFO` asks for; the previous action is kept before ours can run (it is stored
        // once, here, and only read afterwards).
        #[allow(unsafe_code)]
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_segv as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old) == 0 {
                PREVIOUS = Some(old);
            }
            if libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut()) == 0 {
                INSTALLED.store(true, Ordering::SeqCst);
            }
        }
    });
}

/// The monotonic clock in nanoseconds (`clock_gettime`, safe in a signal handler).
pub(crate) fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

/// The `SIGSEGV` handler: only atomics, futex and `sched_yield` (see the module's text).
#[allow(unsafe_code)]
extern "C" fn on_segv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid `siginfo_t` for a `SA_SIGINFO` handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for e in &RANGES {
        let q = e.queue.load(Ordering::SeqCst);
        let (base, len) = (e.base.load(Ordering::SeqCst), e.len.load(Ordering::SeqCst));
        if q.is_null() || addr < base || addr >= base + len {
            continue;
        }
        // SAFETY: a registered queue lives until its range is dropped, which unregisters it
        // first; a range is not dropped while its own memory faults.
        let q = unsafe { &*q };
        let start = now_ns();
        loop {
            for s in &q.slots {
                if s.state.compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    s.addr.store(addr, Ordering::Relaxed);
                    s.state.store(POSTED, Ordering::Release);
                    q.bell.fetch_add(1, Ordering::SeqCst);
                    let _ = futex::wake(&q.bell, futex::Flags::PRIVATE, 1);
                    while s.state.load(Ordering::Acquire) != DONE {
                        let _ = futex::wait(&s.state, futex::Flags::PRIVATE, POSTED, None);
                    }
                    s.state.store(FREE, Ordering::Release);
                    q.waited_ns.fetch_add(now_ns().saturating_sub(start), Ordering::Relaxed);
                    return;
                }
            }
            std::thread::yield_now();
        }
    }
    // Not ours: the action before ours decides.
    // SAFETY: `PREVIOUS` was written once before the handler was installed.
    let prev = unsafe { *std::ptr::addr_of!(PREVIOUS) };
    match prev {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            // SAFETY: the previous handler, called as it was installed to be called.
            unsafe {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(p.sa_sigaction);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
                    f(sig);
                }
            }
        }
        _ => {
            // The default: the access faults again, and the process ends as it would have.
            // SAFETY: resetting a signal's action is safe in a handler.
            unsafe {
                libc::signal(libc::SIGSEGV, libc::SIG_DFL);
            }
        }
    }
}
