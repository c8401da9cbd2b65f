//! Measuring helpers: latency histograms, process CPU time, iteration counts, the ping-pong
//! method every ping-pong row and its limit share.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::report::Row;

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

/// Round trips and warm-up rounds of a ping-pong of `size` bytes at `scale` (ours and UCX's).
pub(crate) fn pingpong_iters(size: u64, scale: f64) -> (u64, u64) {
    let iters = iterations((2e9 * scale) as u64, size, 200, (100_000.0 * scale).max(1000.0) as u64);
    (iters, (iters / 10).max(10))
}

/// Run `warm` then `iters` rounds of a ping-pong (`round(i)`: one round trip, `i` from 0),
/// timing each round from the end of the one before (one clock read a round, as
/// ucx_perftest's), and make its row: half round trips, and the payload of both directions
/// over the wall time (`size` over the one-way time: ucx_perftest's and fi_pingpong's
/// ping-pong bandwidth).
pub(crate) fn timed_pingpong(
    transport: &str,
    size: u64,
    iters: u64,
    warm: u64,
    mut round: impl FnMut(u64) -> anyhow::Result<()>,
) -> anyhow::Result<Row> {
    let mut lat = Latencies::new();
    let mut meter = None;
    let mut prev = Instant::now();
    for i in 0..iters + warm {
        if i == warm {
            meter = Some(Meter::start());
        }
        round(i)?;
        let now = Instant::now();
        if i >= warm {
            lat.record((now - prev).as_nanos() as u64 / 2);
        }
        prev = now;
    }
    let (wall, cpu) = meter.expect("warm-up is shorter than the run").stop();
    Ok(Row {
        transport: transport.into(),
        pattern: "pingpong".into(),
        size,
        iters,
        lat_us_p50: Some(lat.p_us(0.5)),
        lat_us_p99: Some(lat.p_us(0.99)),
        lat_us_avg: Some(lat.avg_us()),
        mb_per_s: Some((2 * size * iters) as f64 / wall.as_secs_f64() / 1e6),
        msgs_per_s: Some((2 * iters) as f64 / wall.as_secs_f64()),
        cpu_pct: Some(cpu),
        ..Row::default()
    })
}
