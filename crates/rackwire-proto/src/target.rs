//! The target side: where arriving operations touch memory, after the owner's checks.

use crate::refusal::Refusal;

/// Which region a peer's operation names, and the key its handle carries: what the owner's
/// rules are checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionReq {
    /// The asking peer.
    pub peer: u32,
    /// The region, as the owner numbers it.
    pub region: u32,
    /// The key of the peer's handle.
    pub key: u128,
}

/// The whole range one operation covers in its region (a fragment of it lies inside).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Where it starts.
    pub offset: u64,
    /// Its length.
    pub len: u64,
}

/// This node's memory, as the connection's target side sees it. The implementation applies the
/// owner's rules (key, grant, bounds) before it touches a byte.
pub trait Target {
    /// Place `data` at `at` of the region `req` names. The whole operation spans `whole`:
    /// check that span (not only this fragment), so every fragment of an out-of-bounds
    /// operation is refused alike and none is placed.
    fn write(&mut self, req: RegionReq, whole: Span, at: u64, data: &[u8]) -> Result<(), Refusal>;
    /// Copy `out.len()` bytes at `offset` of the region `req` names.
    fn read(&mut self, req: RegionReq, offset: u64, out: &mut [u8]) -> Result<(), Refusal>;
    /// Apply a 64-bit atomic at `offset` of the region `req` names; the old value.
    fn atomic(&mut self, req: RegionReq, offset: u64, op: crate::AtomicOp) -> Result<u64, Refusal>;
}
