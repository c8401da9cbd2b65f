//! Shared-memory building blocks for the rackwire fabric between hosts that share memory.
//!
//! A host that shares memory with its peers (processes on one machine today; hosts behind
//! PCIe non-transparent bridges on rack hardware) exposes *windows* into its memory:
//!
//! - [`SharedMem`]: a memfd-backed mapping whose descriptor can be handed to a peer, which then
//!   writes into the owner's memory with plain stores — no CPU of the owner on the data path.
//! - [`ControlSocket`] / [`Endpoint`]: a Unix `SOCK_SEQPACKET` socket that carries control
//!   messages and passes descriptors (`SCM_RIGHTS`).
//! - [`ring`]: a byte ring that lives in the *receiver's* memory and is managed by the *sender*
//!   (cached consumer index, lazy update), as Marlin's virtual NIC does.
//! - [`Doorbell`]: wake a receiver that stopped polling, coalesced so a busy receiver costs
//!   the sender no system call.
//! - [`CopyEngine`]: several copy channels (threads acting as DMA engines) for large batches,
//!   and the combining of contiguous pieces.
//!
//! All `unsafe` code of the shared-memory transport lives in this crate, each block with the
//! reason it is sound.

#![warn(missing_docs)]

pub mod barrier;
pub mod copy;
pub mod doorbell;
pub mod fuzz;
pub mod mem;
pub mod memcpy;
pub mod owned;
pub mod ring;
pub mod socket;

pub use copy::{coalesce, CopyEngine, CopyPiece, COPY_CHANNELS_MAX};
pub use doorbell::{Doorbell, DoorbellRemote};
pub use mem::{MapAccess, SharedMem, ShmError, SHM_REGION_BYTES_MAX};
pub use memcpy::copy_bytes;
pub use owned::OwnedWindow;
pub use socket::{ControlSocket, Endpoint, CONTROL_FDS_MAX, CONTROL_MSG_BYTES_MAX, CONTROL_SEND_TIMEOUT};

/// Close this process's descriptors (and so its windows' memory) to other processes of the
/// same user: a process that is not dumpable has its `/proc/<pid>/fd` (and `mem`, `maps`, ...)
/// open only to itself and to processes allowed to trace any process (root). It also writes
/// no core dump and cannot be attached to by a debugger of the same user.
pub fn keep_descriptors_private() -> Result<(), ShmError> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(ShmError::sys("prctl(PR_SET_DUMPABLE)"))
}
