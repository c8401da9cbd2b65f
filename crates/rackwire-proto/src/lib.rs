//! The rackwire edge transport, as a sans-IO state machine.
//!
//! A [`Connection`] is one reliable connection between two nodes over up to [`LINKS_MAX`]
//! lossy links. It owns no socket, thread or clock: every input carries its time, and every
//! output is polled. Time is a plain count of microseconds ([`Time`]) from any origin the caller
//! chooses, so a simulator can drive it deterministically.
//!
//! # Driving a connection
//!
//! After creating it ([`Connection::connect`] or [`Connection::accept`]):
//!
//! 1. feed every frame that arrives with [`Connection::handle_frame`] (with the link it came on
//!    and the [`Target`] that holds this node's memory);
//! 2. when the time from [`Connection::poll_timeout`] is reached, call
//!    [`Connection::handle_timeout`];
//! 3. after either, and after submitting operations, call [`Connection::poll_transmit`] until
//!    it returns `None`, sending each frame on the link it names;
//! 4. drain [`Connection::poll_event`] (completions, messages, notifications, link changes).
//!
//! # What it does
//!
//! - A handshake with mutual authentication by a shared secret (a SPAKE2 exchange over it, then
//!   each end's confirmation of the transcript under the key it gave: the secret never crosses
//!   the wire nor can be guessed offline from what does; fresh nonces, so nothing can be
//!   replayed) and by node keys (Ed25519 signatures of the transcript,
//!   checked against the key the caller knows for the peer), agreeing on keys that seal every
//!   later frame (AEGIS-128X2, each frame taken once: [`TRAILER_LEN`], [`REPLAY_WINDOW`]);
//!   then operations: write, read, compare-and-swap,
//!   fetch-and-add, messages, each cut into frames that fit the link MTU.
//! - The target places each frame's payload at its offset as it arrives, after its own check
//!   ([`Target`]); a refusal comes back to the initiator as a completion with its reason.
//! - Reliability: connection-wide sequence numbers, a cumulative acknowledgement on every
//!   frame, selective acknowledgements, negative acknowledgements for gaps, delayed
//!   acknowledgements (by count or time), and time-based loss detection: a frame is declared
//!   lost only when a frame sent after it was delivered and its own link's round trip plus a
//!   reordering allowance has passed, or its retransmission timeout fired (per-link smoothed
//!   RTT, exponential back-off, capped). Striping over links of different delay therefore does
//!   not cause spurious retransmissions.
//! - Striping: each frame goes on the link, of those that are up and have window left, with
//!   the fewest frames in flight (ties in turn), so each link carries what its capacity allows
//!   (a faster link's frames leave sooner); a link whose quickest round trip is far longer than
//!   the quickest link's is used only while the others are full.
//!   Silent links are probed; a link that misses [`Config::probes_missed_max`] probes is down,
//!   its frames are resent on the others, and it is used again when a probe is answered.
//! - Loss response per link: the window shrinks on loss (once per round trip) and grows on
//!   clean acknowledgements, with a floor, so random loss does not collapse throughput.
//! - Fences: a `fence_before` operation starts when all earlier ones completed; after a
//!   `fence_after` operation, later ones wait for it. An `ordered` operation (a small write or
//!   an atomic) goes at once but takes effect at the target only after every earlier one has
//!   (the target holds it while a frame sent before its own is missing): a signal behind its
//!   data without a round trip. Otherwise operations complete in any order. Messages are
//!   delivered in the order they were sent.
//! - Counters per connection and per link ([`ConnStats`]).

#![deny(unsafe_code)]

mod chunk;
mod config;
mod conn;
mod delivery;
pub mod driver;
mod endpoint;
mod link;
mod ops;
mod recv;
mod refusal;
mod seal;
mod sent;
mod stats;
mod target;

pub use bytes::Bytes;
pub use config::Config;
pub use conn::{
    CloseReason, Connection, Credentials, Event, FrameBufs, SplitTransmit, State, Transmit, DATAGRAMS_QUEUED_MAX,
    GATHER_IN_FLIGHT_MIN, PATH_FRAME_RUNGS, PATH_FRAME_SAFE, PATH_PROBE_TRIES, PROBE_REPLIES_MAX,
};
pub use delivery::{Delivery, Note};
pub use endpoint::{
    earliest, Endpoint, Happened, Incoming, Polled, Routed, Session, CONNECTIONS_MAX, HANDSHAKES_ACCEPTED_MAX,
    HANDSHAKES_BEFORE_RETRY, RETRIES_QUEUED_MAX, RETRY_TOKEN_PERIOD_US,
};
pub use ops::{AtomicOp, Completion, OpError, OpFlags, OpId, RegionRef};
pub use refusal::Refusal;
pub use seal::{REPLAY_WINDOW, TRAILER_LEN};
pub use sent::SEND_SPAN_MAX;
pub use stats::{ConnStats, LinkStats};
pub use target::{RegionReq, Span, Target};

/// Microseconds since an origin the caller chooses.
pub type Time = u64;

/// The most links one connection stripes over.
pub const LINKS_MAX: usize = 8;
/// The most frames in flight on one connection.
pub const WINDOW_FRAMES_MAX: usize = 4096;
/// The largest operation, in bytes.
pub const OP_BYTES_MAX: u64 = 1 << 30;
/// The largest two-sided message, in bytes.
pub const MESSAGE_BYTES_MAX: usize = 64 * 1024;
/// The most operations queued or in progress on one connection.
pub const OPS_MAX: usize = 65536;
/// The most bytes a target keeps of later write fragments that arrived before their
/// operation's first (striping reorders frames; a lost first fragment holds the rest back for
/// a round trip). Past it, such frames are dropped unacknowledged and sent again.
pub const STASH_BYTES_MAX: usize = 8 << 20;

/// The largest write that may be ordered ([`OpFlags::ordered`]): it goes whole, in one segment.
pub const ORDERED_WRITE_BYTES_MAX: usize = 64;
/// The most ordered operations a target holds while a frame sent before theirs is missing
/// (each with at most [`ORDERED_WRITE_BYTES_MAX`] bytes). A frame that would need more room is
/// dropped unacknowledged and sent again.
pub const ORDERED_WAITING_MAX: usize = 256;

/// The most data frames a connection delivering in order ([`Config::in_order`]) keeps while a
/// frame sent before them is missing (about a link window of full frames).
pub const IN_ORDER_HELD_MAX: usize = 1024;

/// A hasher for keys this node chose itself (operation ids, connection ids: small counters),
/// cheaper than the default one, which resists keys chosen to collide. Maps keyed by what a
/// peer sends keep the default.
#[derive(Default, Clone, Copy, Debug)]
pub struct OwnIdHasher(u64);

impl std::hash::Hasher for OwnIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: a counter's consecutive values spread over the whole word.
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by ids this node chose itself (see [`OwnIdHasher`]).
pub type OwnIdMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<OwnIdHasher>>;

/// A set of ids this node chose itself, or was given by someone it trusts (see [`OwnIdHasher`]).
pub type OwnIdSet<K> = std::collections::HashSet<K, std::hash::BuildHasherDefault<OwnIdHasher>>;

#[cfg(test)]
mod own_id_tests {
    use super::*;
    use std::hash::{BuildHasher, BuildHasherDefault};

    // Checks the hasher for own ids: a counter's values hash apart (no two of 100k consecutive
    // ids share a hash, and their low bits, where a table looks first, are spread), and a map
    // keyed by them finds every entry and no others.
    #[test]
    fn counters_spread_and_maps_work() {
        let b = BuildHasherDefault::<OwnIdHasher>::default();
        let hashes: std::collections::HashSet<u64> = (0..100_000u32).map(|i| b.hash_one(i)).collect();
        assert_eq!(hashes.len(), 100_000);
        let low: std::collections::HashSet<u64> = (0..1024u32).map(|i| b.hash_one(i) & 1023).collect();
        assert!(low.len() > 600, "only {} of 1024 low-bit buckets used", low.len());
        let mut m: OwnIdMap<u32, u32> = OwnIdMap::default();
        for i in 0..10_000 {
            m.insert(i, i * 3);
        }
        assert!((0..10_000).all(|i| m.get(&i) == Some(&(i * 3))));
        assert!(!m.contains_key(&10_000));
    }
}
