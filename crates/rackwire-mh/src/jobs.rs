//! Jobs: what a job's ranks and the management host agree on (limits, tokens); the host's
//! table of jobs is the `job_table` module (with the management host itself).
//!
//! A job is a name, a size N, and a table of which node is rank 0..N-1. Its ranks bootstrap
//! through numbered *rounds*: in each round every rank posts one small blob (its region
//! handles, or nothing at all for a barrier) and then asks for the round until every rank's
//! blob is there. The first round (0) fills the rank table. Rounds are numbered by the ranks
//! themselves, which call them in the same order, so no round needs to be closed: a rank can
//! only be one round ahead of the slowest (it cannot finish round k+1 before every rank posted
//! it, and a rank posts k+1 only after it read k), so keeping the last [`JOB_ROUNDS_KEPT`]
//! rounds is enough.
//!
//! Jobs live in memory only: they last as long as their ranks, and a restarted management host
//! makes a job in flight fail with a clear error rather than hang.
//!
//! A launcher that hands its ranks a *token* (`rackwire launch` makes one per job; a random
//! 128-bit hex string in `RACKWIRE_JOB_TOKEN`) makes the job its ranks' alone: the job is
//! known by its name and its token together, so a node without the token (even one holding the
//! fabric secret, with a guessed name) reaches another job, never this one — it can neither
//! take a rank, nor read the blobs, nor start the job afresh. Such a job is never started
//! afresh by a post at all: a new run has a new token. A job without a token is open to every
//! node, as its name is: a post of round 0 starts a stale one afresh.

use std::time::Duration;

/// The most jobs a management host holds at once (jobs whose ranks are all down are dropped
/// first to make room).
pub const JOBS_MAX: usize = 1024;
/// The most ranks in one job.
pub const JOB_RANKS_MAX: u32 = 1024;
/// The largest blob one rank posts in one round, in bytes.
pub const JOB_BLOB_BYTES_MAX: usize = 4096;
/// Rounds of one job kept (older ones are dropped; see the module documentation).
pub const JOB_ROUNDS_KEPT: u64 = 4;
/// With the table full, a job no rank posted to for this long makes room (the longest idle
/// first), even if its ranks are up (a long-lived process that ran many jobs).
pub const JOB_IDLE_DROP: Duration = Duration::from_secs(60);
/// Hex digits of a job token, at least and at most (128 to 512 bits).
pub const JOB_TOKEN_HEX_MIN: usize = 32;
/// See [`JOB_TOKEN_HEX_MIN`].
pub const JOB_TOKEN_HEX_MAX: usize = 128;

/// A short tag of a job token (the start of its SHA-256, hex): names a job's ranks (`JOB.RANK.TAG`)
/// so that nobody without the token can take their names first, and keys the job here.
pub fn token_tag(token: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    crate::auth::to_hex(&d.as_ref()[..16])
}
