//! Measuring helpers: latency histograms, process CPU time, iteration counts.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Latencies in nanoseconds, from 1 ns to 10 s at 3 significant digits.
pub(crate) struct Latencies {
    h: Histogram<u64>,
    sum_ns: u128,
}

impl Latencies {
    pub fn new() -> Self {
        Latencies { h: Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("valid histogram bounds"), sum_ns: 0 }
    }
    pub fn record(&mut self, ns: u64) {
        let _ = self.h.record(ns.max(1));
        self.sum_ns += u128::from(ns);
    }
    pub fn p_us(&self, q: f64) -> f64 {
        self.h.value_at_quantile(q) as f64 / 1000.0
    }
    pub fn avg_us(&self) -> f64 {
        if self.h.is_empty() {
            0.0
        } else {
            self.sum_ns as f64 / self.h.len() as f64 / 1000.0
        }
    }
}

/// CPU time this process used so far.
pub(crate) fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Wall time and CPU share (percent of one core) of a measured stretch.
pub(crate) struct Meter {
    wall: Instant,
    cpu: Duration,
}

impl Meter {
    pub fn start() -> Self {
        Meter { wall: Instant::now(), cpu: cpu_time() }
    }
    /// (elapsed wall time, CPU percent of one core).
    pub fn stop(&self) -> (Duration, f64) {
        let wall = self.wall.elapsed();
        let cpu = cpu_time().saturating_sub(self.cpu);
        (wall, 100.0 * cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9))
    }
}

/// Iterations for moving `budget` bytes in pieces of `size`, kept within `[lo, hi]`.
pub(crate) fn iterations(budget: u64, size: u64, lo: u64, hi: u64) -> u64 {
    (budget / size.max(1)).clamp(lo, hi)
}
