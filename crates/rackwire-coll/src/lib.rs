//! Jobs of ranks on a rackwire fabric, and collective operations over one-sided RMA.
//!
//! A [`Group`] is N processes that are ranks 0..N-1 of one named job. A rank finds its place
//! with [`Group::from_env`] (rackwire's own variables, or those of mpirun, PMIx, Hydra, Slurm,
//! or torchrun-style `RANK`/`WORLD_SIZE`; see [`Placement::from_env`]) or is told it with
//! [`Group::join`]. The ranks bootstrap through the management host: a rank table, then an
//! exchange of their collective windows' handles; from then on the management host is no
//! longer on the data path.
//!
//! ```no_run
//! use rackwire_coll::{Group, ReduceOp};
//! # fn main() -> Result<(), rackwire_coll::CollError> {
//! let mut group = Group::from_env()?;
//! let mut sum = [group.rank() as u64 + 1];
//! group.allreduce(&mut sum, ReduceOp::Sum)?;
//! assert_eq!(sum[0], (1..=group.size() as u64).sum::<u64>());
//! # Ok(()) }
//! ```
//!
//! # How data moves
//!
//! Every rank registers one **window**: a region granted to every other rank of the group,
//! holding, for each sending rank, [`HEADS_PER_PEER`] heads, [`SLOTS_PER_PEER`] slots, and a counter
//! (see [`channel`]). A rank sends a block to another with one write-with-signal
//! ([`rackwire::Conn::write_signal`]): the bytes straight into a free slot of the receiver's
//! window (small ones into a head), then the piece's number stored into its head.
//! The receiver sees the head show that number, takes the block out of its own memory, and
//! now and then updates a counter in the sender's window, which gives slots back. Nothing is
//! staged in messages and no target CPU takes part in placing the data; large blocks are cut
//! into slot-sized pieces that are pipelined through the slots. Over shared memory every one
//! of these steps is a load or a store on mapped memory; over the edge transport they are
//! frames of the reliable protocol.
//!
//! The collectives (`coll.rs`) are built from sets of such transfers that run together, so a
//! rank never waits on one peer while another could move. Which algorithm a collective uses
//! depends on the size and the group size; each switch point is a named constant with its
//! reason.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod channel;
mod coll;
mod element;
mod error;
mod group;
mod placed;
mod placement;
mod reuse;
mod wait;

pub use element::{Element, ReduceOp};
pub use error::CollError;
pub use group::{Group, GroupConfig, SymmetricRegion};
pub use placed::DIRECT_MIN_BYTES;
pub use placement::{Placement, PlacementSource};

/// The most ranks in one group (each rank keeps a connection to every other, and a fabric
/// node has at most [`rackwire::PEERS_MAX`] connections).
pub const RANKS_MAX: usize = 256;
const _: () = assert!(RANKS_MAX <= rackwire::PEERS_MAX);

/// Slots each sending rank has in each receiver's window: how many pieces of a transfer can
/// be in flight to one receiver before the sender waits for the receiver to take them.
pub const SLOTS_PER_PEER: usize = 4;
/// Heads each sending rank has in each receiver's window: how many pieces of any size (small
/// ones travel in their head) can be in flight to one receiver. More heads than slots: a
/// receiver gives heads back once for every half of them it took, so a stream of small
/// transfers (signals, small collectives) updates the sender's counter once every 16 pieces
/// rather than every 2, and the sender reads that counter as rarely.
pub const HEADS_PER_PEER: usize = 32;
/// Bytes of one slot at most (a piece of a transfer). Large slots mean fewer counter updates
/// per byte; [`WINDOW_DATA_BYTES_MAX`] bounds the total.
pub const SLOT_BYTES_MAX: usize = 256 * 1024;
/// Bytes of one slot at least, however many ranks share the window.
pub const SLOT_BYTES_MIN: usize = 4 * 1024;
/// The data part of one rank's window at most: slots shrink (down to [`SLOT_BYTES_MIN`]) as
/// the group grows, so a window stays within this.
pub const WINDOW_DATA_BYTES_MAX: usize = 16 * 1024 * 1024;
/// The largest block one rank contributes to, or receives from, one peer in one collective
/// (the collectives stage at most this much per call; larger data is a clear error).
pub const BLOCK_BYTES_MAX: usize = 256 * 1024 * 1024;
/// The most operations a rank leaves in flight (their outcome not yet seen) before it waits
/// for the oldest.
pub const OPS_IN_FLIGHT_MAX: usize = 4096;
