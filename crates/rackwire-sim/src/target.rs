//! Node memory in the simulator: regions with keys and grants, and a record of when every
//! tracked byte range was placed.

use std::collections::{BTreeMap, HashMap, HashSet};

use rackwire_proto::{AtomicOp, Refusal, RegionReq, Span, Target, Time};

/// A region of simulated memory.
#[derive(Debug)]
pub struct SimRegion {
    /// Key.
    pub key: u128,
    /// Contents.
    pub data: Vec<u8>,
    /// Peers allowed in.
    pub granted: HashSet<u32>,
}

/// A range the checker follows: when its bytes were placed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Slot {
    /// Length.
    pub len: u64,
    /// Bytes placed so far.
    pub placed: u64,
    /// First placement.
    pub first: Option<Time>,
    /// Last placement.
    pub last: Option<Time>,
}

/// A node's memory.
#[derive(Debug, Default)]
pub struct MemTarget {
    /// Regions by id.
    pub regions: HashMap<u32, SimRegion>,
    /// Tracked ranges: (region, start) → slot.
    pub slots: BTreeMap<(u32, u64), Slot>,
    /// The current time (set by the world before each call).
    pub now: Time,
    /// Refusals made.
    pub refusals: u64,
}

impl MemTarget {
    /// Add a region.
    pub fn add_region(&mut self, id: u32, key: u128, len: usize, granted: &[u32]) {
        self.regions.insert(id, SimRegion { key, data: vec![0; len], granted: granted.iter().copied().collect() });
    }

    /// Follow `[start, start + len)` of `region`.
    pub fn track(&mut self, region: u32, start: u64, len: u64) {
        self.slots.insert((region, start), Slot { len, ..Slot::default() });
    }

    fn check(&mut self, peer: u32, region: u32, key: u128, start: u64, len: u64) -> Result<&mut SimRegion, Refusal> {
        let r = self.regions.get_mut(&region).ok_or(Refusal::UnknownRegion)?;
        if r.key != key {
            return Err(Refusal::BadKey);
        }
        if !r.granted.contains(&peer) {
            return Err(Refusal::Ungranted { needed: 0 });
        }
        if start.checked_add(len).is_none_or(|e| e > r.data.len() as u64) {
            return Err(Refusal::OutOfBounds { region_len: r.data.len() as u64 });
        }
        Ok(r)
    }
}

impl Target for MemTarget {
    fn write(&mut self, req: RegionReq, whole: Span, at: u64, data: &[u8]) -> Result<(), Refusal> {
        let (region, op_offset, op_len) = (req.region, whole.offset, whole.len);
        let now = self.now;
        let r = match self.check(req.peer, region, req.key, op_offset, op_len) {
            Ok(r) => r,
            Err(e) => {
                self.refusals += 1;
                return Err(e);
            }
        };
        let region_len = r.data.len() as u64;
        let end = at.checked_add(data.len() as u64).ok_or(Refusal::OutOfBounds { region_len })?;
        if at < op_offset || end > op_offset + op_len {
            return Err(Refusal::OutOfBounds { region_len });
        }
        r.data[at as usize..end as usize].copy_from_slice(data);
        if let Some((_, slot)) =
            self.slots.range_mut(..=(region, at)).next_back().filter(|((rg, s), sl)| *rg == region && at < s + sl.len)
        {
            slot.placed += data.len() as u64;
            slot.first.get_or_insert(now);
            slot.last = Some(now);
        }
        Ok(())
    }

    fn read(&mut self, req: RegionReq, offset: u64, out: &mut [u8]) -> Result<(), Refusal> {
        let r = self.check(req.peer, req.region, req.key, offset, out.len() as u64)?;
        out.copy_from_slice(&r.data[offset as usize..offset as usize + out.len()]);
        Ok(())
    }

    fn atomic(&mut self, req: RegionReq, offset: u64, op: AtomicOp) -> Result<u64, Refusal> {
        if !offset.is_multiple_of(8) {
            return Err(Refusal::Misaligned);
        }
        let r = self.check(req.peer, req.region, req.key, offset, 8)?;
        let at = offset as usize;
        let old = u64::from_le_bytes(r.data[at..at + 8].try_into().expect("8 bytes"));
        let new = match op {
            AtomicOp::CompareSwap { expected, new } => {
                if old == expected {
                    new
                } else {
                    old
                }
            }
            AtomicOp::FetchAdd(a) => old.wrapping_add(a),
        };
        r.data[at..at + 8].copy_from_slice(&new.to_le_bytes());
        Ok(old)
    }
}
