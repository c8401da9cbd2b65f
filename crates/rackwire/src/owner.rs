//! Operations this node carries out on its own memory for a peer: every frame of the edge
//! transport, and every request on a served region ([`crate::Fabric::alloc_served`]) over
//! shared memory. Each is checked against the grant table (key, grant), then its whole range
//! against the region, before a byte moves; every refusal goes in the owner's audit.

use std::sync::atomic::{AtomicU64, Ordering};

use rackwire_proto::AtomicOp;

use crate::grants::{Refusal, RegionInner};
use crate::node::Node;
use crate::pin::signal_access;
use crate::{Access, NodeId, RegionId, Signal, SignalOp};

/// Run `f` on `region` if `peer`'s grant allows `need`; refusals past the grant (bounds,
/// alignment) are counted in the audit as well.
fn with<T>(
    fab: &Node,
    peer: NodeId,
    region: RegionId,
    key: u128,
    need: Access,
    f: impl FnOnce(&RegionInner) -> Result<T, Refusal>,
) -> Result<T, Refusal> {
    let placed = fab.regions.with_grant(peer, region, key, need, |r, _| f(r))?;
    if let Err(why) = placed {
        fab.regions.refused(peer, region, why);
    }
    placed
}

/// `offset..offset + n` lies inside a region of `len` bytes.
pub(crate) fn in_bounds(len: u64, offset: u64, n: u64) -> Result<(), Refusal> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(Refusal::OutOfBounds { region_len: len }),
    }
}

/// Place `data` at `at`, a piece of a write that spans `op_offset..op_offset + op_len` (the
/// whole operation must lie in the region, so no piece of a refused one lands).
#[allow(clippy::too_many_arguments)]
pub(crate) fn write(
    fab: &Node,
    peer: NodeId,
    region: RegionId,
    key: u128,
    op_offset: u64,
    op_len: u64,
    at: u64,
    data: &[u8],
) -> Result<(), Refusal> {
    with(fab, peer, region, key, Access::WRITE, |r| {
        in_bounds(r.len, op_offset, op_len)?;
        in_bounds(r.len, at, data.len() as u64)?;
        r.mem.lock().write_at(at, data);
        Ok(())
    })
}

/// Read `out.len()` bytes at `offset` into `out`.
pub(crate) fn read(
    fab: &Node,
    peer: NodeId,
    region: RegionId,
    key: u128,
    offset: u64,
    out: &mut [u8],
) -> Result<(), Refusal> {
    with(fab, peer, region, key, Access::READ, |r| {
        in_bounds(r.len, offset, out.len() as u64)?;
        r.mem.lock().read_at(offset, out);
        Ok(())
    })
}

/// A 64-bit atomic at an 8-byte aligned `offset`; the old value.
pub(crate) fn atomic(
    fab: &Node,
    peer: NodeId,
    region: RegionId,
    key: u128,
    offset: u64,
    op: AtomicOp,
) -> Result<u64, Refusal> {
    if !offset.is_multiple_of(8) {
        return Err(Refusal::Misaligned);
    }
    with(fab, peer, region, key, Access::ATOMIC, |r| {
        let mem = r.mem.lock();
        let word = mem.atomic_u64(offset).ok_or(Refusal::OutOfBounds { region_len: r.len })?;
        Ok(apply_atomic(word, op))
    })
}

/// Carry out `op` on `word`; the old value.
pub(crate) fn apply_atomic(word: &AtomicU64, op: AtomicOp) -> u64 {
    match op {
        AtomicOp::CompareSwap { expected, new } => {
            word.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire).unwrap_or_else(|v| v)
        }
        AtomicOp::FetchAdd(a) => word.fetch_add(a, Ordering::AcqRel),
    }
}

/// Place `data` at `offset`, then apply `signal` (both ranges checked first: nothing lands
/// when either is refused). The old value of the word for an add, 0 for a set.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_signal(
    fab: &Node,
    peer: NodeId,
    region: RegionId,
    key: u128,
    offset: u64,
    data: &[u8],
    signal: Signal,
) -> Result<u64, Refusal> {
    if !signal.offset.is_multiple_of(8) {
        return Err(Refusal::Misaligned);
    }
    with(fab, peer, region, key, signal_access(&signal, data), |r| {
        in_bounds(r.len, offset, data.len() as u64)?;
        let mem = r.mem.lock();
        let word = mem.atomic_u64(signal.offset).ok_or(Refusal::OutOfBounds { region_len: r.len })?;
        mem.write_at(offset, data);
        Ok(match signal.op {
            SignalOp::Set(v) => {
                word.store(v, Ordering::Release);
                0
            }
            SignalOp::Add(v) => word.fetch_add(v, Ordering::AcqRel),
        })
    })
}
