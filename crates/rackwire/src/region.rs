//! Regions: memory a node registers, and the rules for who may touch it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use rackwire_shm::SharedMem;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::fabric::{lock, read, FabricInner};
use crate::{Access, Error, NodeId, RegionId, RemoteRegion, REVOKE_ACK_TIMEOUT};
use rackwire_proto::{OwnIdMap, OwnIdSet};

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
    pub mem: RwLock<SharedMem>,
    pub acl: Mutex<Acl>,
    /// Set while the backing moves to a new memfd (a peer was cut off); map requests are told
    /// to come back shortly.
    pub migrating: AtomicBool,
}

/// Why the target refused an access (carried on the wire between peers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Refusal {
    Ungranted { needed: u8 },
    Revoked,
    BadKey,
    UnknownRegion,
    Busy,
}

impl Refusal {
    pub fn into_error(self, node: NodeId, region: RegionId) -> Error {
        match self {
            Refusal::Ungranted { needed } => Error::Ungranted { region, needed: Access::from_bits(needed) },
            Refusal::Revoked => Error::Revoked { region },
            Refusal::BadKey => Error::BadKey { region },
            Refusal::UnknownRegion => Error::UnknownRegion { node, region },
            Refusal::Busy => Error::Timeout,
        }
    }
}

/// The target's access rules, as every transport must apply them before it places a byte:
/// the region must exist, the key must match, and the peer must hold a grant covering the
/// operation. A revoked grant is reported as such, distinct from one never given.
#[derive(Clone, Debug)]
pub struct AccessPolicy {
    pub(crate) fabric: Weak<FabricInner>,
}

impl AccessPolicy {
    /// Decide whether `peer` may do `need` to `region` with `key`. On success, returns the
    /// peer's full grant.
    pub fn check(&self, peer: NodeId, region: RegionId, key: u128, need: Access) -> Result<Access, Error> {
        let f = self.fabric.upgrade().ok_or(Error::Closed)?;
        let me = f.id;
        f.with_grant(peer, region, key, need, |_, a| Ok(a)).map_err(|r| r.into_error(me, region))?
    }
}

impl FabricInner {
    /// Apply the access rules and, while they cannot change, run `then` with the region and the
    /// peer's grant. The shared-memory transport sends the descriptor inside `then`, so no
    /// revocation can slip between the decision and the hand-over.
    pub(crate) fn with_grant<T>(
        &self,
        peer: NodeId,
        region: RegionId,
        key: u128,
        need: Access,
        then: impl FnOnce(&RegionInner, Access) -> T,
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
                acl.mapped_by.insert(peer);
                Ok(then(&r, g))
            }
            Some(_) => Err(Refusal::Ungranted { needed: need.bits() }),
            None if acl.revoked.contains(&peer) => Err(Refusal::Revoked),
            None => Err(Refusal::Ungranted { needed: need.bits() }),
        }
    }
}

/// What a revocation had to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RevokeOutcome {
    /// The peer held no mapping; nothing to undo.
    NotMapped,
    /// The peer confirmed it unmapped the region.
    Unmapped,
    /// The peer did not answer in time: its connection was torn down and the region moved
    /// to fresh memory, so its old mapping no longer reaches it.
    CutOff,
}

/// A region of this node's memory that peers can be granted.
///
/// Dropping it frees the region: peers are asked to unmap, and its names and grant records
/// are removed from the management host.
pub struct Region {
    pub(crate) inner: Arc<RegionInner>,
    pub(crate) fabric: Arc<FabricInner>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.inner.id)
            .field("len", &self.inner.len)
            .field("access", &self.inner.max_access)
            .finish()
    }
}

impl Region {
    /// Its id at this node.
    pub fn id(&self) -> RegionId {
        self.inner.id
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Never true: regions have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The most any grant of this region may allow.
    pub fn access(&self) -> Access {
        self.inner.max_access
    }

    /// The handle peers use to name it.
    pub fn handle(&self) -> RemoteRegion {
        RemoteRegion { node: self.fabric.id, region: self.inner.id, key: self.inner.key, len: self.inner.len }
    }

    /// Allow `peer` to do `access` (a subset of the region's access flags). Replaces an
    /// earlier grant; narrowing a grant that a peer has mapped for writing waits until the
    /// peer unmapped (or was cut off), as a revocation does.
    pub fn grant(&self, peer: NodeId, access: Access) -> Result<(), Error> {
        if !self.inner.max_access.contains(access) {
            return Err(Error::Config(format!("grant {access} exceeds the region's access {}", self.inner.max_access)));
        }
        self.fabric.known_peer(peer)?;
        let must_unmap = {
            let mut acl = lock(&self.inner.acl);
            let old = acl.grants.insert(peer, access);
            acl.revoked.remove(&peer);
            let narrowed = old.is_some_and(|o| !access.contains(o));
            narrowed && acl.mapped_by.remove(&peer)
        };
        if must_unmap {
            self.withdraw(peer);
        }
        self.fabric.mh.record_grant(rackwire_mh::GrantEntry {
            node: self.fabric.id,
            region: self.inner.id,
            peer,
            access: access.bits(),
        });
        Ok(())
    }

    /// Take back `peer`'s grant. Returns once the peer has unmapped the region, or has been
    /// cut off because it did not answer within [`REVOKE_ACK_TIMEOUT`]. From then on its
    /// accesses fail with [`Error::Revoked`].
    pub fn revoke(&self, peer: NodeId) -> Result<RevokeOutcome, Error> {
        let was_mapped = {
            let mut acl = lock(&self.inner.acl);
            if acl.grants.remove(&peer).is_none() {
                return Err(Error::Config(format!("node {peer} holds no grant of region {}", self.inner.id)));
            }
            acl.revoked.insert(peer);
            acl.mapped_by.remove(&peer)
        };
        self.fabric.mh.record_revoke(self.inner.id, peer);
        Ok(if was_mapped { self.withdraw(peer) } else { RevokeOutcome::NotMapped })
    }

    /// Ask every connection to `peer` to unmap; cut off those that do not answer.
    fn withdraw(&self, peer: NodeId) -> RevokeOutcome {
        let mut cut = false;
        for c in self.fabric.conns_of(peer) {
            if !c.unmap(self.inner.id, REVOKE_ACK_TIMEOUT) {
                warn!(peer, region = self.inner.id, "peer did not confirm unmap; cutting it off");
                c.cut_off();
                cut = true;
            }
        }
        if cut {
            migrate(&self.fabric, &self.inner);
            RevokeOutcome::CutOff
        } else {
            RevokeOutcome::Unmapped
        }
    }

    /// Make the region findable by `name` through the management host.
    pub fn publish(&self, name: &str) -> Result<(), Error> {
        let h = self.handle();
        self.fabric.mh.publish(rackwire_mh::RegionEntry {
            name: name.into(),
            node: h.node,
            region: h.region,
            key: h.key_hex(),
            len: h.len,
        })?;
        Ok(())
    }

    /// Withdraw a name published for this region.
    pub fn unpublish(&self, name: &str) -> Result<(), Error> {
        Ok(self.fabric.mh.unpublish(name)?)
    }

    fn oob(&self, offset: u64, len: u64) -> Error {
        Error::OutOfBounds { region: self.inner.id, offset, len, region_len: self.inner.len }
    }

    /// Copy `data` into the region at `offset` (local access).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), Error> {
        if read(&self.inner.mem).write_at(offset, data) {
            Ok(())
        } else {
            Err(self.oob(offset, data.len() as u64))
        }
    }

    /// Copy bytes at `offset` into `out` (local access).
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), Error> {
        if read(&self.inner.mem).read_at(offset, out) {
            Ok(())
        } else {
            Err(self.oob(offset, out.len() as u64))
        }
    }

    /// `len` bytes at `offset` (local access).
    pub fn to_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        let mut v = vec![0u8; len];
        self.read_at(offset, &mut v)?;
        Ok(v)
    }

    /// The 64-bit word at an 8-byte aligned `offset`, read atomically (local access).
    pub fn load_u64(&self, offset: u64) -> Result<u64, Error> {
        let mem = read(&self.inner.mem);
        if !offset.is_multiple_of(8) {
            return Err(Error::Misaligned { offset });
        }
        mem.atomic_u64(offset).map(|a| a.load(Ordering::Acquire)).ok_or_else(|| self.oob(offset, 8))
    }

    /// Store the 64-bit word at an 8-byte aligned `offset` atomically (local access).
    pub fn store_u64(&self, offset: u64, v: u64) -> Result<(), Error> {
        let mem = read(&self.inner.mem);
        if !offset.is_multiple_of(8) {
            return Err(Error::Misaligned { offset });
        }
        mem.atomic_u64(offset).map(|a| a.store(v, Ordering::Release)).ok_or_else(|| self.oob(offset, 8))
    }
}

/// Move a region to fresh memory so that mappings held by cut-off peers no longer reach it.
/// Peers still in good standing are asked to unmap first (they map again on their next
/// access, getting the new memory), so none of their writes is lost.
pub(crate) fn migrate(fabric: &FabricInner, r: &RegionInner) {
    r.migrating.store(true, Ordering::SeqCst);
    // Any hand-over of the old descriptor in progress finishes before we go on; later map
    // requests see `migrating` and are told to come back.
    let others: Vec<NodeId> = lock(&r.acl).mapped_by.drain().collect();
    for peer in others {
        for c in fabric.conns_of(peer) {
            if !c.unmap(r.id, REVOKE_ACK_TIMEOUT) {
                c.cut_off();
            }
        }
    }
    let name = format!("rackwire-region-{}", r.id);
    if let Err(e) = r.mem.write().unwrap_or_else(|e| e.into_inner()).replace_backing(&name) {
        warn!(region = r.id, "could not move region to fresh memory: {e}");
    } else {
        info!(region = r.id, "region moved to fresh memory; cut-off peers no longer reach it");
    }
    r.migrating.store(false, Ordering::SeqCst);
}

impl Drop for Region {
    fn drop(&mut self) {
        self.fabric.free_region(&self.inner);
    }
}
