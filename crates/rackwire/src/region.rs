//! Regions: memory a node registers and grants (the owner's handle; the access rules
//! themselves are in the grant table).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::grants::RegionInner;
use crate::node::Node;
use crate::sync::{lock, YIELD_AFTER};
use crate::{Access, Cmp, Error, NodeId, RegionId, RemoteRegion, REVOKE_ACK_TIMEOUT};

/// How long [`Region::wait_u64`] sleeps between looks once its busy polling is over: a store
/// into the region rings no doorbell, so a waiter that no longer spins looks this often.
pub const WORD_WAIT_NAP: Duration = Duration::from_micros(50);
/// A word waiter reads the clock once per this many looks: a look is one load from the cache
/// (about a nanosecond), a clock read costs twenty.
const WORD_LOOKS_PER_CLOCK: u32 = 1024;

/// What a revocation had to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RevokeOutcome {
    /// The peer held no mapping; nothing to undo.
    NotMapped,
    /// The peer confirmed it unmapped the region, and the region moved to fresh memory all the
    /// same (a peer's word proves nothing: it may have kept a duplicate of the descriptor).
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
    pub(crate) fabric: Arc<Node>,
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

    /// Whether this node serves it ([`crate::Fabric::alloc_served`]): no peer ever maps it.
    pub fn is_served(&self) -> bool {
        self.inner.served
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
    /// peer unmapped (or was cut off), as a revocation does. Over shared memory a grant with
    /// a store right lets the peer read the region too (see [`Access`]).
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
    /// cut off because it did not answer within [`REVOKE_ACK_TIMEOUT`], and, if it ever mapped
    /// the region, once the region has moved to fresh memory: whatever the peer kept of the
    /// old memory (a duplicate of its descriptor, a mapping) reaches it no longer. From then
    /// on its accesses fail with [`Error::Revoked`]. Peers still granted map the new memory on
    /// their next access; the move copies the region, so revoking a mapped peer costs about
    /// one copy of it.
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
        // The peer's word is not enough: a peer that kept a duplicate of the descriptor would
        // still reach the memory. Fresh memory is what cuts it off for sure: if a move is under
        // way (begun before the revocation), another one follows it.
        let deadline = std::time::Instant::now() + MIGRATION_WAIT_MAX;
        while !migrate(&self.fabric, &self.inner) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if cut {
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

    /// The region's memory in this process: [`Region::len`] bytes from this address, valid
    /// for as long as the region lives (a move to fresh memory keeps the address). For
    /// zero-copy use from foreign code (the C ABI, Python's buffer protocol); peers granted
    /// the region may write it at any time, so Rust code should use the copying calls.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.mem.as_ptr()
    }

    /// Copy `data` into the region at `offset` (local access).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), Error> {
        if self.inner.mem.lock().write_at(offset, data) {
            Ok(())
        } else {
            Err(self.oob(offset, data.len() as u64))
        }
    }

    /// Copy bytes at `offset` into `out` (local access).
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), Error> {
        if self.inner.mem.read_at(offset, out) {
            Ok(())
        } else {
            Err(self.oob(offset, out.len() as u64))
        }
    }

    /// `len` bytes at `offset` (local access).
    pub fn to_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        // Bounds first: a length past the region allocates nothing.
        if offset.checked_add(len as u64).is_none_or(|end| end > self.inner.len) {
            return Err(self.oob(offset, len as u64));
        }
        let mut v = vec![0u8; len];
        self.read_at(offset, &mut v)?;
        Ok(v)
    }

    /// The 64-bit word at an 8-byte aligned `offset`, read atomically (local access).
    pub fn load_u64(&self, offset: u64) -> Result<u64, Error> {
        if !offset.is_multiple_of(8) {
            return Err(Error::Misaligned { offset });
        }
        self.inner.mem.load_u64(offset).ok_or_else(|| self.oob(offset, 8))
    }

    /// Wait until the 64-bit word at an 8-byte aligned `offset` compares with `value` as `cmp`
    /// says, and return the word: the receiving end of a peer's [`crate::Conn::write_signal`]
    /// or [`crate::Pinned::write_signal`] (OpenSHMEM's `shmem_signal_wait_until`). The data a
    /// signal follows is in place when the word shows it. Polls for the fabric's busy-poll
    /// time (letting other threads of the core go first once nothing came for a while), then
    /// looks every [`WORD_WAIT_NAP`]; [`Error::Timeout`] after `timeout`.
    pub fn wait_u64(&self, offset: u64, cmp: Cmp, value: u64, timeout: Duration) -> Result<u64, Error> {
        let word = self.load_u64(offset)?;
        if cmp.holds(word, value) {
            return Ok(word);
        }
        let mem = &self.inner.mem;
        // The clock is first read after some looks (a word that changes sooner, as in a
        // ping-pong, costs no clock read); the times count from there.
        let mut times: Option<(Instant, Instant, Instant)> = None;
        let mut spins = 0u32;
        loop {
            // In bounds and aligned: the first load checked both.
            let word = mem.load_u64(offset).unwrap_or_default();
            if cmp.holds(word, value) {
                return Ok(word);
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(WORD_LOOKS_PER_CLOCK) {
                continue;
            }
            let now = Instant::now();
            let (start, deadline, spin_until) =
                *times.get_or_insert((now, now + timeout, now + self.fabric.cfg.busy_poll));
            if now >= deadline {
                return Err(Error::Timeout);
            }
            if now >= spin_until {
                std::thread::sleep(WORD_WAIT_NAP.min(deadline - now));
            } else if now >= start + YIELD_AFTER {
                std::thread::yield_now();
            }
        }
    }

    /// Store the 64-bit word at an 8-byte aligned `offset` atomically (local access).
    pub fn store_u64(&self, offset: u64, v: u64) -> Result<(), Error> {
        let mem = self.inner.mem.lock();
        if !offset.is_multiple_of(8) {
            return Err(Error::Misaligned { offset });
        }
        mem.atomic_u64(offset).map(|a| a.store(v, Ordering::Release)).ok_or_else(|| self.oob(offset, 8))
    }

    /// Compare the 64-bit word at an 8-byte aligned `offset` with `expected` and, if equal, set
    /// it to `new`, atomically (local access; atomic with the peers' compare-and-swaps on the
    /// region). Returns the word as it was.
    pub fn compare_swap_u64(&self, offset: u64, expected: u64, new: u64) -> Result<u64, Error> {
        let mem = self.inner.mem.lock();
        if !offset.is_multiple_of(8) {
            return Err(Error::Misaligned { offset });
        }
        let a = mem.atomic_u64(offset).ok_or_else(|| self.oob(offset, 8))?;
        Ok(a.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire).unwrap_or_else(|old| old))
    }
}

/// Move a region to fresh memory so that mappings held by cut-off peers no longer reach it.
/// Peers still in good standing are asked to unmap first (they map again on their next
/// access, getting the new memory), so none of their writes is lost.
/// Returns false, doing nothing, when another move of the region is under way.
pub(crate) fn migrate(fabric: &Node, r: &RegionInner) -> bool {
    if r.migrating.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        return false;
    }
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
    if let Err(e) = r.mem.replace_backing(&name) {
        warn!(region = r.id, "could not move region to fresh memory: {e}");
    } else {
        info!(region = r.id, "region moved to fresh memory; cut-off peers no longer reach it");
    }
    r.migrating.store(false, Ordering::SeqCst);
    true
}

/// The longest a revocation waits for a move already under way to end before its own: a
/// move waits for each mapped peer's answer at most [`REVOKE_ACK_TIMEOUT`], and peers are at
/// most [`crate::PEERS_MAX`]; past it the revocation returns without its own move.
const MIGRATION_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

impl Drop for Region {
    fn drop(&mut self) {
        self.fabric.free_region(&self.inner);
    }
}
