//! Locking and polling helpers every module of this crate uses (a leaf: it imports none of
//! them).

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A busy-polling waiter reads the clock once per this many looks.
pub(crate) const CLOCK_EVERY_SPINS: u32 = 64;

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
