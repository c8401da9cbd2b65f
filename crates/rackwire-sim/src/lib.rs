//! A deterministic simulator for the rackwire edge transport.
//!
//! [`World`] runs real [`rackwire_proto::Connection`]s between N nodes joined by M links per
//! node pair, on a virtual clock. Every link direction has its own latency, jitter (which
//! reorders), bandwidth (with a bounded queue), MTU, loss, duplication and bit-flip corruption,
//! and can go down and up; groups of nodes can be partitioned. Everything random is drawn from
//! one `u64` seed, so a seed reproduces a run exactly.
//!
//! [`swarm`] draws a different mix of faults and operations for each seed, runs a *safety*
//! phase with faults and a *liveness* phase with faults healed, and checks that every operation
//! completes exactly once, that the target's bytes are right, that fences held, and that no
//! operation was reported complete before its data was at the target.

#![deny(unsafe_code)]

pub mod driven;
pub mod flap;
pub mod fuzz;
pub mod keys;
pub mod net;
pub mod pair;
pub mod rng;
pub mod swarm;
pub mod target;
pub mod world;

pub use driven::{run_driven, DrivenReport};
pub use net::LinkParams;
pub use rng::Rng;
pub use swarm::{run_seed, SeedReport, SimFailure};
pub use target::MemTarget;
pub use world::World;
