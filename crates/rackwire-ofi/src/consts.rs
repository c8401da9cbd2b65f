//! The libfabric values this provider uses (from `rdma/fabric.h` and friends, version 1.17).
//! The C side checks each against the headers when it is built (`provider.h`, `_Static_assert`).
//! Each keeps libfabric's name and meaning (see `fi_getinfo(3)`, `fi_errno(3)`).
#![allow(missing_docs)]

/// Capabilities and operation flags.
pub const FI_MSG: u64 = 1 << 1;
pub const FI_RMA: u64 = 1 << 2;
pub const FI_TAGGED: u64 = 1 << 3;
pub const FI_ATOMIC: u64 = 1 << 4;
pub const FI_READ: u64 = 1 << 8;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
pub const FI_MULTI_RECV: u64 = 1 << 16;
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
pub const FI_PEEK: u64 = 1 << 19;
pub const FI_COMPLETION: u64 = 1 << 24;
pub const FI_INJECT: u64 = 1 << 25;
/// `FI_CLAIM` and `FI_DISCARD` (receive flags).
pub const FI_CLAIM: u64 = 1 << 59;
pub const FI_DISCARD: u64 = 1 << 58;
/// The provider's own flag: the call is an inject, which writes no completion (`provider.h`).
pub const RW_NO_COMPLETION: u64 = 1 << 62;
/// Bind flag: only operations flagged `FI_COMPLETION` complete into the queue.
pub const FI_SELECTIVE_COMPLETION: u64 = 1 << 59;
/// Bind flags of completion queues and counters.
pub const FI_TRANSMIT: u64 = FI_SEND;
pub const FI_RECV_BIND: u64 = FI_RECV;

/// The address that stands for "any" or "not known".
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;

/// Errors (positive; calls return them negated).
pub const FI_ENOENT: i32 = 2;
pub const FI_EIO: i32 = 5;
pub const FI_EAGAIN: i32 = 11;
pub const FI_ENOMEM: i32 = 12;
pub const FI_EACCES: i32 = 13;
pub const FI_EKEYREJECTED: i32 = 129;
pub const FI_EBUSY: i32 = 16;
pub const FI_ENODEV: i32 = 19;
pub const FI_EINVAL: i32 = 22;
pub const FI_ENOSYS: i32 = 38;
pub const FI_ENOMSG: i32 = 42;
pub const FI_ENODATA: i32 = 61;
pub const FI_EMSGSIZE: i32 = 90;
pub const FI_EOPNOTSUPP: i32 = 95;
pub const FI_EADDRNOTAVAIL: i32 = 99;
pub const FI_ETIMEDOUT: i32 = 110;
pub const FI_EHOSTUNREACH: i32 = 113;
pub const FI_ECANCELED: i32 = 125;
pub const FI_EOTHER: i32 = 256;
pub const FI_ETOOSMALL: i32 = 257;
pub const FI_EOPBADSTATE: i32 = 258;
pub const FI_EAVAIL: i32 = 259;
pub const FI_ENOCQ: i32 = 263;
pub const FI_ENOAV: i32 = 267;
pub const FI_ETRUNC: i32 = 265;

/// Completion queue entry formats.
pub const FI_CQ_FORMAT_UNSPEC: i32 = 0;
pub const FI_CQ_FORMAT_CONTEXT: i32 = 1;
pub const FI_CQ_FORMAT_MSG: i32 = 2;
pub const FI_CQ_FORMAT_DATA: i32 = 3;
pub const FI_CQ_FORMAT_TAGGED: i32 = 4;

/// Address vector kinds.
pub const FI_AV_UNSPEC: i32 = 0;
pub const FI_AV_MAP: i32 = 1;
pub const FI_AV_TABLE: i32 = 2;
