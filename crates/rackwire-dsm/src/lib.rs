//! Shared virtual memory across the hosts of a job: a page-based distributed shared memory in
//! the manner of GeNIMA and HLRC (home-based lazy release consistency), on the fabric's
//! one-sided reads and writes.
//!
//! Every page of a shared range has a *home* rank, which keeps its master copy. A rank that
//! touches a page it has no valid copy of fetches it from the home (one one-sided read); the
//! first write to a page in an interval keeps a *twin* (a copy as it was); at a release (a lock
//! released, a barrier reached) each written page's *diff* against its twin goes to the page's
//! home (one-sided writes), and the pages written become *write notices*; at an acquire, the
//! notices of the intervals this rank has not seen invalidate its copies of those pages, so the
//! next touch fetches the home's copy, which has every diff released before. Diffs carry
//! whole 8-byte words: a program is data-race free (and sees what release consistency
//! promises) when no two ranks write the same word between synchronisations, as in TreadMarks.
//!
//! The protocol itself is a state machine free of memory protection, signals and the network
//! ([`Protocol`]): every input is an event (a fault, a page's arrival, a release, notices at an
//! acquire) and every output an action the caller carries out (fetch, protect, send a diff).
//! Its diffs ([`diff`]) come from peers when they are applied at a home, so decoding them is
//! checked like any input from the network. A [`Range`] runs it on real memory: page faults
//! tell it what the application touches, and a [`Backend`] fetches pages from their homes.
//! [`SharedMemory`] puts a range over the ranks of a job on the fabric, at one address in every
//! rank's process (ranks that share a process keep views of their own).

#![deny(unsafe_code)]

pub mod apps;
pub mod diff;
#[allow(unsafe_code)]
mod handler;
mod job;
mod lock;
#[allow(unsafe_code)]
mod memory;
mod protocol;
#[allow(unsafe_code)]
mod range;

pub use handler::{RANGES_MAX, SLOTS};
pub use job::{Placement, SharedMemory, Stats};
pub use lock::{LOCKS_MAX, LOCK_LOG_ENTRIES, LOCK_TIMEOUT};
pub use memory::SharedBytes;
pub use protocol::{
    Access, Action, Counters, DsmError, PageId, PageState, Protocol, Rank, Released, PAGES_MAX, RANKS_MAX,
};
pub use range::{Backend, Range};

/// The size of a page: the unit of fetching, twinning and invalidation (the processor's page,
/// which memory protection works in).
pub const PAGE_BYTES: usize = 4096;
