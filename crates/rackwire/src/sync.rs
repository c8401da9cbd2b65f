//! Locking and polling helpers every module of this crate uses (a leaf: it imports none of
//! them).

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// A busy-polling waiter reads the clock once per this many looks.
pub(crate) const CLOCK_EVERY_SPINS: u32 = 64;

/// A thread waiting (for an operation, a message, a notification or a signal word) that has
/// found nothing for this long lets the other runnable threads of its core go first at each
/// look at the clock (`sched_yield`, which returns at once when there are none). On a host
/// with fewer cores than busy threads, a spinner otherwise holds the core that the thread it
/// waits for needs — or the next thread on a packet's way through the virtual NIC — for the
/// rest of its time slice (milliseconds). An answer that comes sooner than this, as in a
/// ping-pong, never pays for a yield.
pub(crate) const YIELD_AFTER: Duration = Duration::from_micros(20);

/// Lock `m`, taking the data over if a panicking thread poisoned it (every structure it
/// guards stays consistent between statements).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-lock `m` (see [`lock`] on poisoning).
pub(crate) fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-lock `m` (see [`lock`] on poisoning).
pub(crate) fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}
