//! Links: one direction of one link between two nodes, with its faults.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rackwire_proto::Time;

use crate::Rng;

/// Properties of one link direction.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LinkParams {
    /// One-way delay, µs.
    pub latency_us: Time,
    /// Extra delay drawn uniformly from 0..=jitter per frame (reorders frames), µs.
    pub jitter_us: Time,
    /// Bits per second.
    pub bandwidth_bps: u64,
    /// Largest frame, bytes.
    pub mtu: usize,
    /// Probability a frame is dropped.
    pub loss: f64,
    /// Probability a frame is delivered twice.
    pub dup: f64,
    /// Probability a frame has one bit flipped.
    pub corrupt: f64,
    /// Frames that may wait to be sent before new ones are dropped.
    pub queue_frames: usize,
    /// Down: every frame vanishes.
    pub down: bool,
}

impl LinkParams {
    /// A clean link.
    pub fn clean(latency_us: Time, bandwidth_bps: u64, mtu: usize) -> Self {
        LinkParams {
            latency_us,
            jitter_us: 0,
            bandwidth_bps,
            mtu,
            loss: 0.0,
            dup: 0.0,
            corrupt: 0.0,
            queue_frames: 512,
            down: false,
        }
    }

    /// The same link with no faults (the liveness phase).
    pub fn healed(&self) -> Self {
        LinkParams { loss: 0.0, dup: 0.0, corrupt: 0.0, down: false, ..self.clone() }
    }
}

/// Counters of one link direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WireStats {
    /// Frames offered.
    pub offered: u64,
    /// Dropped by loss.
    pub lost: u64,
    /// Dropped because the link was down.
    pub blackholed: u64,
    /// Dropped at a full queue.
    pub overflow: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Corrupted.
    pub corrupted: u64,
    /// Too large for the link.
    pub oversize: u64,
}

/// One direction of a link.
#[derive(Debug)]
pub struct Wire {
    /// Its properties (change them to inject faults).
    pub params: LinkParams,
    /// When the link finishes sending what it has queued, in nanoseconds (serialisation times
    /// are fractions of a microsecond).
    busy_until_ns: u64,
    /// Its counters.
    pub stats: WireStats,
}

/// A frame on its way.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Arrival {
    /// When it arrives.
    pub at: Time,
    /// Tie-breaker, in sending order.
    pub order: u64,
    /// Receiving node.
    pub to: usize,
    /// Sending node.
    pub from: usize,
    /// Link index.
    pub link: usize,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// All frames in flight, earliest first.
#[derive(Debug, Default)]
pub struct Flight {
    heap: BinaryHeap<Reverse<Arrival>>,
    order: u64,
}

impl Flight {
    /// The time of the next arrival.
    pub fn next_at(&self) -> Option<Time> {
        self.heap.peek().map(|Reverse(a)| a.at)
    }
    /// Take the next arrival due at or before `now`.
    pub fn pop_due(&mut self, now: Time) -> Option<Arrival> {
        if self.next_at()? <= now {
            self.heap.pop().map(|Reverse(a)| a)
        } else {
            None
        }
    }
    /// Frames in flight.
    pub fn len(&self) -> usize {
        self.heap.len()
    }
    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
    fn push(&mut self, at: Time, from: usize, to: usize, link: usize, bytes: Vec<u8>) {
        self.order += 1;
        self.heap.push(Reverse(Arrival { at, order: self.order, to, from, link, bytes }));
    }
}

impl Wire {
    /// A wire with these properties.
    pub fn new(params: LinkParams) -> Self {
        Wire { params, busy_until_ns: 0, stats: WireStats::default() }
    }

    /// Offer a frame at `now`; it arrives later, or not at all, as the faults decide.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &mut self,
        now: Time,
        rng: &mut Rng,
        flight: &mut Flight,
        from: usize,
        to: usize,
        link: usize,
        mut bytes: Vec<u8>,
    ) {
        let p = &self.params;
        self.stats.offered += 1;
        if bytes.len() > p.mtu {
            self.stats.oversize += 1;
            return;
        }
        // Serialisation at the link's rate, behind what is queued.
        let ser_ns = ((bytes.len() as u128 * 8 * 1_000_000_000) / p.bandwidth_bps.max(1) as u128).max(1) as u64;
        let now_ns = now * 1000;
        let start_ns = self.busy_until_ns.max(now_ns);
        if start_ns - now_ns > ser_ns * p.queue_frames as u64 {
            self.stats.overflow += 1;
            return;
        }
        self.busy_until_ns = start_ns + ser_ns;
        if p.down {
            self.stats.blackholed += 1;
            return;
        }
        if rng.chance(p.loss) {
            self.stats.lost += 1;
            return;
        }
        if rng.chance(p.corrupt) && !bytes.is_empty() {
            let bit = rng.range(0, bytes.len() as u64 * 8);
            bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
            self.stats.corrupted += 1;
        }
        let depart = self.busy_until_ns.div_ceil(1000);
        if rng.chance(p.dup) {
            self.stats.duplicated += 1;
            let at = depart + p.latency_us + rng.range(0, p.jitter_us + 1);
            flight.push(at, from, to, link, bytes.clone());
        }
        let at = depart + p.latency_us + rng.range(0, p.jitter_us + 1);
        flight.push(at, from, to, link, bytes);
    }
}
