//! The driver of an [`Endpoint`](crate::Endpoint): who runs its rounds, when, and what a
//! round does, as a state machine free of threads, sockets and clocks.
//!
//! A node's edge endpoint is driven by two kinds of threads: application threads that wait
//! for their operations poll it (sending inline when they submit, running rounds while they
//! wait), and one network thread takes over when none does, keeps looking for a moment after
//! its last work, then sleeps until a frame, a timer or a new operation. Every input here
//! carries its time (µs, as the connections'), every output is a decision the caller carries
//! out. The threaded runtime (the `rackwire` crate's edge transport) and the simulator
//! (`rackwire-sim`'s driven world, which interleaves the threads by seed) run this same code.
//!
//! - [`HandOff`]: what application threads and the network thread tell each other without
//!   the endpoint's lock — when an application thread last polled or rested, when the
//!   transport was last in use, whether the network thread watches or sleeps, whether
//!   operations wait gathered — and the decisions taken from it ([`HandOff::app_look`],
//!   [`HandOff::submitted`], [`HandOff::rest`], [`HandOff::wakes_for`]).
//! - [`Rounds`]: one round of work under the lock ([`Rounds::run`]) over a [`RoundHost`] that
//!   does the round's I/O: receive, hand over, timers, send.
//! - [`NetThread`]: the network thread between rounds ([`NetThread::before_round`],
//!   [`NetThread::after_round`]).
//! - [`limits`]: every tuning constant, with its reason.

pub mod limits;

mod handoff;
mod net;
mod rounds;

pub use handoff::{AppLook, HandOff, AWAKE};
pub use net::{wait_for, After, Before, NetThread, Spin};
pub use rounds::{may_end_early_again, Received, RoundHost, Rounds, Worked};
