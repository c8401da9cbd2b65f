//! Pinned targets: one thread's stores into a peer's region mapped over shared memory, with
//! no lock and no atomic read-modify-write instruction on the way.
//!
//! An ordinary operation over shared memory holds the connection's map of mappings shared
//! while it stores, so that an unmap waits until no operation uses the mapping. Releasing
//! that hold is an atomic instruction, and on x86 an atomic instruction waits until the
//! stores before it have reached the other core's cache: each small operation then costs
//! the caller a cache miss it need not wait for. A [`Pinned`] target keeps the mapping by
//! itself and announces its use with plain stores instead: before an operation it marks
//! itself busy and checks that the mapping is still valid; after it, it marks itself idle.
//! Taking a mapping away ([`PinSet::retire`]) clears the valid flag, runs a barrier on every
//! thread of the process (`membarrier`, see [`rackwire_shm::barrier`]), and waits until no
//! pin is busy: from then on no pin stores into the mapping, which is what revocation needs.
//! A pinned store is thus a store, as on a hardware fabric.

use std::sync::atomic::{compiler_fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rackwire_shm::SharedMem;

use crate::sync::lock;
use crate::{Access, Error, NodeId, RegionId, Signal, SignalOp};

/// The most pins one mapping can have (each is one thread's handle).
pub const PINS_PER_MAPPING_MAX: usize = 1024;

/// The pins of one mapping: whether the mapping may still be used, and each pin's busy flag.
#[derive(Debug)]
pub(crate) struct PinSet {
    valid: AtomicBool,
    busy: Mutex<Vec<Arc<AtomicBool>>>,
}

impl PinSet {
    pub(crate) fn new() -> Arc<PinSet> {
        Arc::new(PinSet { valid: AtomicBool::new(true), busy: Mutex::new(Vec::new()) })
    }

    /// Stop every pin of the mapping from storing into it, and wait until none is in the
    /// middle of an operation.
    pub(crate) fn retire(&self) {
        self.valid.store(false, Ordering::SeqCst);
        let busy: Vec<Arc<AtomicBool>> = lock(&self.busy).clone();
        if busy.is_empty() {
            return;
        }
        // Pins exist only where the barrier is available (see `Pinned::new`).
        if let Err(e) = rackwire_shm::barrier::all_threads() {
            tracing::warn!("membarrier failed while retiring a mapping: {e}");
        }
        for b in busy {
            // An operation is a few stores: the wait is short unless the pinning thread was
            // descheduled in the middle of one.
            while b.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
    }

    fn add(&self) -> Result<Arc<AtomicBool>, Error> {
        let mut busy = lock(&self.busy);
        busy.retain(|b| Arc::strong_count(b) > 1);
        if busy.len() >= PINS_PER_MAPPING_MAX {
            return Err(Error::Limit(crate::Limit::Pins { max: PINS_PER_MAPPING_MAX }));
        }
        let b = Arc::new(AtomicBool::new(false));
        busy.push(b.clone());
        Ok(b)
    }
}

/// Where a pin's counts go when it is dropped (the connection's statistics).
pub(crate) type PinCounts = Box<dyn Fn(u64, u64) + Send + Sync>;

/// A peer's region, mapped and pinned for one thread's one-sided writes (see
/// [`crate::Conn::pin`]). Each call is a few stores into the peer's memory: done when it
/// returns, never blocking, with nothing to wait for. Once the mapping is taken away (the
/// owner revoked the grant, or the connection ended), every call fails with
/// [`Error::Revoked`]; the ordinary calls of the connection then tell the real state.
pub struct Pinned {
    mem: Arc<SharedMem>,
    set: Arc<PinSet>,
    busy: Arc<AtomicBool>,
    region: RegionId,
    peer: NodeId,
    access: Access,
    writes: u64,
    bytes: u64,
    counts: PinCounts,
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned").field("peer", &self.peer).field("region", &self.region).finish_non_exhaustive()
    }
}

impl Pinned {
    /// Pin `mem` (a mapping of `region` at `peer` allowing `access`), or fail with
    /// [`Error::Config`] where the process-wide barrier this needs is not available.
    pub(crate) fn new(
        mem: Arc<SharedMem>,
        set: &Arc<PinSet>,
        region: RegionId,
        peer: NodeId,
        access: Access,
        counts: PinCounts,
    ) -> Result<Pinned, Error> {
        if !rackwire_shm::barrier::available() {
            return Err(Error::Config("pinning needs the membarrier system call (Linux 4.14 or later)".into()));
        }
        let busy = set.add()?;
        Ok(Pinned { mem, set: set.clone(), busy, region, peer, access, writes: 0, bytes: 0, counts })
    }

    /// The peer that owns the region.
    pub fn peer(&self) -> NodeId {
        self.peer
    }

    /// The region.
    pub fn region(&self) -> RegionId {
        self.region
    }

    /// Run `f` on the mapping, announced as busy, if it is still valid.
    fn with_mem<T>(&mut self, need: Access, f: impl FnOnce(&SharedMem) -> Result<T, Error>) -> Result<T, Error> {
        if !self.access.contains(need) {
            return Err(Error::Ungranted { region: self.region, needed: need });
        }
        self.busy.store(true, Ordering::Relaxed);
        // The barrier of `retire` stands in for a fence here; the compiler must still not
        // move the check above the announcement.
        compiler_fence(Ordering::SeqCst);
        let out = if self.set.valid.load(Ordering::Relaxed) {
            f(&self.mem)
        } else {
            Err(Error::Revoked { region: self.region })
        };
        // Plain store: it leaves after the stores of `f` (stores are not reordered with each
        // other on x86, and Release orders them elsewhere) without waiting for them.
        self.busy.store(false, Ordering::Release);
        out
    }

    /// [`crate::Conn::write`]: `data` at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), Error> {
        let region = self.region;
        self.with_mem(Access::WRITE, |m| {
            if m.write_at(offset, data) {
                Ok(())
            } else {
                Err(out_of_bounds(region, m, offset, data.len() as u64))
            }
        })?;
        self.count(data.len());
        Ok(())
    }

    /// [`crate::Conn::write_signal`]: `data` at `offset`, then `signal` applied; for an add,
    /// the value the signal word held before.
    pub fn write_signal(&mut self, offset: u64, data: &[u8], signal: Signal) -> Result<u64, Error> {
        let region = self.region;
        let old =
            self.with_mem(signal_access(&signal, data), |m| store_with_signal(region, m, offset, data, signal))?;
        self.count(data.len());
        Ok(old)
    }

    fn count(&mut self, len: usize) {
        self.writes += 1;
        self.bytes += len as u64;
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        (self.counts)(self.writes, self.bytes);
    }
}

/// What a write-with-signal needs: data and a `Set` are stores (write access); an `Add` is an
/// atomic, and with no data it needs atomic access alone (as over the edge transport).
pub(crate) fn signal_access(signal: &Signal, data: &[u8]) -> Access {
    match signal.op {
        SignalOp::Set(_) => Access::WRITE,
        SignalOp::Add(_) if data.is_empty() => Access::ATOMIC,
        SignalOp::Add(_) => Access::WRITE | Access::ATOMIC,
    }
}

pub(crate) fn out_of_bounds(region: RegionId, m: &SharedMem, offset: u64, len: u64) -> Error {
    Error::OutOfBounds { region, offset, len, region_len: m.len() as u64 }
}

/// Place a write-with-signal on a mapping: both ranges checked first (nothing is stored when
/// either is out of bounds), then the data, then the signal word. The old value of the word
/// for an add, 0 for a set.
pub(crate) fn store_with_signal(
    region: RegionId,
    m: &SharedMem,
    offset: u64,
    data: &[u8],
    signal: Signal,
) -> Result<u64, Error> {
    let Some(word) = m.atomic_u64(signal.offset) else {
        return Err(out_of_bounds(region, m, signal.offset, 8));
    };
    if offset.checked_add(data.len() as u64).is_none_or(|end| end > m.len() as u64) {
        return Err(out_of_bounds(region, m, offset, data.len() as u64));
    }
    m.write_at(offset, data);
    Ok(match signal.op {
        SignalOp::Set(v) => {
            word.store(v, Ordering::Release);
            0
        }
        SignalOp::Add(v) => word.fetch_add(v, Ordering::AcqRel),
    })
}
