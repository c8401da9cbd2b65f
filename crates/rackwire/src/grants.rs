//! The owner's side of regions: the table of this node's regions and the access rules every
//! transport applies before it places a byte (who may do what, who holds a mapping).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

pub(crate) use rackwire_proto::Refusal;
use rackwire_proto::{OwnIdMap, OwnIdSet};
use rackwire_shm::OwnedWindow;

use crate::sync::{lock, read, write};
use crate::{Access, Error, NodeId, RegionId};

/// Who may do what to one region, and who holds a mapping of it. Node ids come from the
/// management host, and a frame's sender is only looked up, never added by the frame: the
/// tables hash them with the fast hasher for own ids.
#[derive(Debug, Default)]
pub(crate) struct Acl {
    pub grants: OwnIdMap<NodeId, Access>,
    pub revoked: OwnIdSet<NodeId>,
    pub mapped_by: OwnIdSet<NodeId>,
}

/// The owner's side of a region.
#[derive(Debug)]
pub(crate) struct RegionInner {
    pub id: RegionId,
    pub key: u128,
    pub len: u64,
    pub max_access: Access,
    pub mem: OwnedWindow,
    pub acl: Mutex<Acl>,
    /// Set while the backing moves to a new memfd (a peer was cut off, or a writer asked for
    /// memory sealed for readers); map requests are told to come back shortly.
    pub migrating: AtomicBool,
    /// After a move made for writers: the writers readers wait for.
    pub writers_first: Mutex<WritersFirst>,
    /// Served by this node: the memory is never handed to a peer, every operation on it
    /// comes as a request this node checks and carries out ([`crate::Fabric::alloc_served`]).
    pub served: bool,
}

/// After the region moved to fresh memory for a writer over shared memory: the writers that
/// had it mapped, which readers wait for (the reader's mapping seals the memory against new
/// writable mappings) until they mapped it again, or until `until` (see `shm::handover`).
#[derive(Debug, Default)]
pub(crate) struct WritersFirst {
    pub until: Option<std::time::Instant>,
    pub waiting: OwnIdSet<NodeId>,
}

/// This node's regions by id (chosen here: a frame's region id is only looked up), at most
/// [`crate::REGIONS_MAX`]. Both transports decide every access through it.
#[derive(Debug, Default)]
pub(crate) struct RegionTable {
    regions: RwLock<OwnIdMap<RegionId, Arc<RegionInner>>>,
    /// The owner's audit: refused accesses by region, peer and reason.
    audit: Mutex<HashMap<(RegionId, NodeId, &'static str), u64>>,
}

/// Distinct (region, peer, reason) entries the audit keeps; refusals past that are counted
/// under region 0, peer 0.
pub(crate) const AUDIT_ENTRIES_MAX: usize = 4096;

impl RegionTable {
    /// Add a region under its id, unless the table is full.
    pub(crate) fn insert(&self, r: Arc<RegionInner>) -> Result<(), Error> {
        let mut regions = write(&self.regions);
        if regions.len() >= crate::REGIONS_MAX {
            return Err(Error::Limit(crate::Limit::Regions));
        }
        regions.insert(r.id, r);
        Ok(())
    }

    /// Regions in the table.
    pub(crate) fn len(&self) -> usize {
        read(&self.regions).len()
    }

    /// Forget a region.
    pub(crate) fn remove(&self, id: RegionId) {
        write(&self.regions).remove(&id);
    }

    /// Count a refused access of `peer` to `region`.
    pub(crate) fn refused(&self, peer: NodeId, region: RegionId, why: Refusal) {
        let mut a = lock(&self.audit);
        let key = if a.len() < AUDIT_ENTRIES_MAX || a.contains_key(&(region, peer, why.name())) {
            (region, peer, why.name())
        } else {
            (0, 0, why.name())
        };
        *a.entry(key).or_insert(0) += 1;
    }

    /// The audit: refused accesses by region, peer and reason.
    pub(crate) fn audit(&self) -> Vec<((RegionId, NodeId, &'static str), u64)> {
        let mut v: Vec<_> = lock(&self.audit).iter().map(|(k, n)| (*k, *n)).collect();
        v.sort();
        v
    }

    /// Apply the access rules and, while they cannot change, run `then` with the region and the
    /// peer's grant: for an operation this node carries out itself (the peer maps nothing).
    pub(crate) fn with_grant<T>(
        &self,
        peer: NodeId,
        region: RegionId,
        key: u128,
        need: Access,
        then: impl FnOnce(&Arc<RegionInner>, Access) -> T,
    ) -> Result<T, Refusal> {
        self.decided(peer, region, key, need, false, then)
    }

    /// [`RegionTable::with_grant`] for a peer that is handed the memory to map: the peer is
    /// recorded as holding a mapping (a revocation then asks it to unmap and moves the memory).
    /// The shared-memory transport sends the descriptor inside `then`, so no revocation can
    /// slip between the decision and the hand-over.
    pub(crate) fn with_grant_to_map<T>(
        &self,
        peer: NodeId,
        region: RegionId,
        key: u128,
        need: Access,
        then: impl FnOnce(&Arc<RegionInner>, Access) -> T,
    ) -> Result<T, Refusal> {
        self.decided(peer, region, key, need, true, then)
    }

    fn decided<T>(
        &self,
        peer: NodeId,
        region: RegionId,
        key: u128,
        need: Access,
        maps: bool,
        then: impl FnOnce(&Arc<RegionInner>, Access) -> T,
    ) -> Result<T, Refusal> {
        let decided = self.decide(peer, region, key, need, maps, then);
        if let Err(why) = decided {
            self.refused(peer, region, why);
        }
        decided
    }

    fn decide<T>(
        &self,
        peer: NodeId,
        region: RegionId,
        key: u128,
        need: Access,
        maps: bool,
        then: impl FnOnce(&Arc<RegionInner>, Access) -> T,
    ) -> Result<T, Refusal> {
        let r = read(&self.regions).get(&region).cloned().ok_or(Refusal::UnknownRegion)?;
        if r.key != key {
            return Err(Refusal::BadKey);
        }
        let mut acl = lock(&r.acl);
        if r.migrating.load(Ordering::SeqCst) {
            return Err(Refusal::Busy);
        }
        match acl.grants.get(&peer).copied() {
            Some(g) if g.contains(need) => {
                // A served region is never handed over, so nobody holds a mapping of it.
                if maps && !r.served {
                    acl.mapped_by.insert(peer);
                }
                Ok(then(&r, g))
            }
            Some(_) => Err(Refusal::Ungranted { needed: need.bits() }),
            None if acl.revoked.contains(&peer) => Err(Refusal::Revoked),
            None => Err(Refusal::Ungranted { needed: need.bits() }),
        }
    }
}
