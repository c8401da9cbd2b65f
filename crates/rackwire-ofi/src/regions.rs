//! What the provider keeps of RMA: the regions the application registered, and the
//! operations in flight waiting for their target's answer ([`crate::rma`] carries them out).

use crate::queues::{Addr, TxDone};
use crate::user::{Iovs, Registered};

/// Regions registered per process at most.
pub const MRS_MAX: usize = 1 << 16;
/// RMA operations in flight per process at most (past it, calls answer `-FI_EAGAIN`).
pub const RMA_IN_FLIGHT_MAX: usize = 4096;

/// A registered region.
#[derive(Clone, Copy, Debug)]
pub struct Mr {
    /// Its memory.
    pub mem: Registered,
    /// `FI_REMOTE_READ`, `FI_REMOTE_WRITE`.
    pub access: u64,
}

/// What an RMA operation in flight waits for.
#[derive(Debug)]
pub(crate) enum Waiting {
    /// The target's answer to a write or a write-form atomic.
    Ack,
    /// A read's data, into these buffers.
    Read { into: Iovs, got: usize },
    /// The old values of a fetch or compare atomic, into these buffers.
    Old { into: Iovs },
}

/// An RMA operation in flight, by its number.
#[derive(Debug)]
pub(crate) struct RmaOp {
    pub ep: u32,
    pub dest: Addr,
    pub done: TxDone,
    pub waiting: Waiting,
    /// `FI_READ` or `FI_WRITE`: which of the endpoint's RMA counters it counts in.
    pub counts_as: u64,
}
