//! The target side: where arriving operations touch memory, after the owner's checks.

use crate::refusal::Refusal;

/// This node's memory, as the connection's target side sees it. The implementation applies the
/// owner's rules (key, grant, bounds) before it touches a byte.
pub trait Target {
    /// Place `data` at `at` of `region` for `peer`. The whole operation spans
    /// `[op_offset, op_offset + op_len)`: check that span (not only this fragment), so every
    /// fragment of an out-of-bounds operation is refused alike and none is placed.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        peer: u32,
        region: u32,
        key: u128,
        op_offset: u64,
        op_len: u64,
        at: u64,
        data: &[u8],
    ) -> Result<(), Refusal>;
    /// Copy `out.len()` bytes at `offset` of `region` for `peer`.
    fn read(&mut self, peer: u32, region: u32, key: u128, offset: u64, out: &mut [u8]) -> Result<(), Refusal>;
    /// Apply a 64-bit atomic at `offset`; the old value.
    fn atomic(&mut self, peer: u32, region: u32, key: u128, offset: u64, op: crate::AtomicOp) -> Result<u64, Refusal>;
}
