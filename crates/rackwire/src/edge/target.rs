//! This node's memory as the edge transport's target sees it: every frame is checked against
//! the owner's grant table (the same as the shared-memory transport's), and the operation's
//! whole range against the region, before a byte is placed.

use super::*;

/// This node's memory as the edge transport's target sees it: every frame is checked against
/// the owner's grant table, and the operation's whole range against the region.
pub(super) struct FabricTarget<'a> {
    pub(super) fabric: &'a Weak<Node>,
}

impl FabricTarget<'_> {
    fn with<T>(
        &self,
        peer: u32,
        region: u32,
        key: u128,
        need: Access,
        f: impl FnOnce(&crate::grants::RegionInner) -> Result<T, proto::Refusal>,
    ) -> Result<T, proto::Refusal> {
        let fab = self.fabric.upgrade().ok_or(proto::Refusal::UnknownRegion)?;
        let placed = fab.regions.with_grant(peer, region, key, need, |r, _| f(r))?;
        // Refusals past the grant (bounds, alignment) go in the owner's audit too.
        if let Err(why) = placed {
            fab.regions.refused(peer, region, why);
        }
        placed
    }
}

pub(super) fn in_bounds(len: u64, offset: u64, n: u64) -> Result<(), proto::Refusal> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(proto::Refusal::OutOfBounds { region_len: len }),
    }
}

impl proto::Target for FabricTarget<'_> {
    fn write(
        &mut self,
        peer: u32,
        region: u32,
        key: u128,
        op_offset: u64,
        op_len: u64,
        at: u64,
        data: &[u8],
    ) -> Result<(), proto::Refusal> {
        self.with(peer, region, key, Access::WRITE, |r| {
            in_bounds(r.len, op_offset, op_len)?;
            in_bounds(r.len, at, data.len() as u64)?;
            r.mem.lock().write_at(at, data);
            Ok(())
        })
    }

    fn read(&mut self, peer: u32, region: u32, key: u128, offset: u64, out: &mut [u8]) -> Result<(), proto::Refusal> {
        self.with(peer, region, key, Access::READ, |r| {
            in_bounds(r.len, offset, out.len() as u64)?;
            r.mem.lock().read_at(offset, out);
            Ok(())
        })
    }

    fn atomic(
        &mut self,
        peer: u32,
        region: u32,
        key: u128,
        offset: u64,
        op: proto::AtomicOp,
    ) -> Result<u64, proto::Refusal> {
        if !offset.is_multiple_of(8) {
            return Err(proto::Refusal::Misaligned);
        }
        self.with(peer, region, key, Access::ATOMIC, |r| {
            let mem = r.mem.lock();
            let word = mem.atomic_u64(offset).ok_or(proto::Refusal::OutOfBounds { region_len: r.len })?;
            Ok(match op {
                proto::AtomicOp::CompareSwap { expected, new } => {
                    word.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire).unwrap_or_else(|v| v)
                }
                proto::AtomicOp::FetchAdd(a) => word.fetch_add(a, Ordering::AcqRel),
            })
        })
    }
}
