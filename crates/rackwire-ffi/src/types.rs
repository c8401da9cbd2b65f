//! The plain C types: handles, flags, records.

use rackwire::{Completion, Conn, Error, Fabric, Op, Region};
use rackwire_coll::Group;

/// A fabric node: this process's membership of the fabric.
pub struct RwFabric(pub(crate) Fabric);
/// A region of this node's memory.
pub struct RwRegion(pub(crate) Region);
/// A connection to a peer.
pub struct RwConn(pub(crate) Conn);
/// An operation in flight, then its outcome.
pub struct RwOp {
    pub(crate) op: Option<Op>,
    pub(crate) outcome: Option<Result<Completion, Error>>,
}
/// A group of ranks of one job.
pub struct RwGroup(pub(crate) Option<Group>);

/// Access bit: read.
pub const RW_ACCESS_READ: u32 = 1;
/// Access bit: write.
pub const RW_ACCESS_WRITE: u32 = 2;
/// Access bit: atomics.
pub const RW_ACCESS_ATOMIC: u32 = 4;
/// Bytes of a remote region handle.
pub const RW_REMOTE_REGION_BYTES: usize = 36;
/// Bytes of a remote region handle as text, with its terminating NUL, at most.
pub const RW_REMOTE_REGION_TEXT_MAX: usize = 128;

/// A handle to a peer's region, as bytes: copy it, send it, store it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RwRemoteRegion {
    /// The handle's bytes.
    pub bytes: [u8; RW_REMOTE_REGION_BYTES],
}

const _: () = assert!(RW_REMOTE_REGION_BYTES == rackwire::REMOTE_REGION_BYTES);

/// How an operation behaves. The switches are 0 (off) or 1 (on; `true` from `<stdbool.h>`):
/// any other value is refused (`RW_STATUS_BAD_ARGUMENT`), never read as a boolean.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct RwOpFlags {
    /// Notify the target, with `imm`, once the operation is in place.
    pub notify: u8,
    /// The notification's 64-bit immediate.
    pub imm: u64,
    /// Start only after every earlier operation on the connection is in place.
    pub fence_before: u8,
    /// Later operations start only once this one is in place.
    pub fence_after: u8,
}

/// One entry of a batch write.
#[repr(C)]
pub struct RwBatchEntry {
    /// Where in the target region.
    pub offset: u64,
    /// The bytes.
    pub data: *const u8,
    /// How many.
    pub len: usize,
}

/// A notification: a peer's operation landed in one of this node's regions.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct RwNotification {
    /// The peer.
    pub from: u32,
    /// The region.
    pub region: u32,
    /// Where.
    pub offset: u64,
    /// How many bytes.
    pub len: u64,
    /// The peer's immediate.
    pub imm: u64,
}

/// A connection's counters.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct RwConnStats {
    /// Writes issued.
    pub writes: u64,
    /// Reads issued.
    pub reads: u64,
    /// Atomics issued.
    pub atomics: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Messages sent.
    pub messages_sent: u64,
    /// Operations the peer refused.
    pub refused: u64,
    /// Frames sent (edge transport).
    pub frames_sent: u64,
    /// Frames received (edge transport).
    pub frames_received: u64,
    /// Frames sent again (edge transport).
    pub retransmits: u64,
}

/// `RW_REDUCE_*`: the reductions (`op` of `rw_group_reduce_*` and `rw_group_allreduce_*`):
/// the sum.
pub const RW_REDUCE_SUM: u32 = 0;
/// The minimum.
pub const RW_REDUCE_MIN: u32 = 1;
/// The maximum.
pub const RW_REDUCE_MAX: u32 = 2;
/// The product.
pub const RW_REDUCE_PRODUCT: u32 = 3;

/// `rw_region_wait_u64`'s comparisons (OpenSHMEM's `SHMEM_CMP_*`): the word equals the value.
pub const RW_CMP_EQ: u32 = 0;
/// The word differs from the value.
pub const RW_CMP_NE: u32 = 1;
/// The word is greater than the value.
pub const RW_CMP_GT: u32 = 2;
/// The word is greater than or equal to the value.
pub const RW_CMP_GE: u32 = 3;
/// The word is less than the value.
pub const RW_CMP_LT: u32 = 4;
/// The word is less than or equal to the value.
pub const RW_CMP_LE: u32 = 5;
