//! The physical limit: memcpy of the same sizes, in the same run.

use crate::report::Row;
use crate::stats::{iterations, Meter};

/// Bytes each memcpy row moves (about), so rows take similar time.
const LIMIT_BUDGET_BYTES: u64 = 4 << 30;

/// Iterations of a memcpy row measured on its own.
pub(crate) fn default_iterations(size: u64) -> u64 {
    iterations(LIMIT_BUDGET_BYTES, size, 100, 2_000_000)
}

/// memcpy of the first `size` bytes of `src` into another buffer, `n` times; one row. The copy
/// goes as the data path's copies do ([`rackwire::copy_bytes`], 2 KiB calls): a whole-buffer
/// `memcpy` can be many times slower for some relative alignments of the two buffers on some
/// processors, which would understate the limit.
pub(crate) fn memcpy_row(src: &[u8], size: u64, n: u64) -> Row {
    let src = &src[..size as usize];
    let mut dst = vec![0u8; size as usize];
    for _ in 0..(n / 10).max(1) {
        rackwire::copy_bytes(&mut dst, std::hint::black_box(src));
    }
    let m = Meter::start();
    for _ in 0..n {
        rackwire::copy_bytes(&mut dst, std::hint::black_box(src));
        std::hint::black_box(&mut dst);
    }
    let (wall, cpu) = m.stop();
    let secs = wall.as_secs_f64();
    Row {
        transport: "memcpy".into(),
        pattern: "oneway".into(),
        size,
        iters: n,
        lat_us_avg: Some(secs * 1e6 / n as f64),
        mb_per_s: Some((size * n) as f64 / secs / 1e6),
        msgs_per_s: Some(n as f64 / secs),
        cpu_pct: Some(cpu),
        ..Row::default()
    }
}
