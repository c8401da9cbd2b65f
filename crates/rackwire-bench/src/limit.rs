//! The physical limit: memcpy of the same sizes, in the same run.

use crate::report::Row;
use crate::stats::{iterations, pingpong_iters, timed_pingpong, Meter};

/// Bytes each memcpy row moves (about), so rows take similar time.
const LIMIT_BUDGET_BYTES: u64 = 4 << 30;

/// Iterations of a memcpy row measured on its own.
pub(crate) fn default_iterations(size: u64) -> u64 {
    iterations(LIMIT_BUDGET_BYTES, size, 100, 2_000_000)
}

/// memcpy of the first `size` bytes of `src` into another buffer, `n` times; one row. The copy
/// goes as the data path's copies do ([`rackwire::copy_bytes`]: a vector loop with aligned
/// stores): a whole-buffer `memcpy` can be many times slower for some relative alignments of
/// the two buffers on some processors, which would understate the limit.
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
    oneway_row("memcpy", size, n, m)
}

/// A one-way limit row: `n` writes of `size` bytes timed by `m`.
fn oneway_row(transport: &str, size: u64, n: u64, m: Meter) -> Row {
    let (wall, cpu) = m.stop();
    let secs = wall.as_secs_f64();
    Row {
        transport: transport.into(),
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

/// Round trips of the cache-line ping-pong row at scale 1.
const CACHELINE_ROUNDS: u64 = 400_000;
/// Bytes each store row writes (about).
const STORE_BUDGET_BYTES: u64 = 2 << 30;

/// A cache line of its own, so the two threads' flags share nothing else.
#[repr(align(64))]
struct Line(std::sync::atomic::AtomicU64);

/// The limit of any ping-pong between two cores: one thread stores a number into a cache line
/// and waits for the other to answer with it in a second line. Measured as every ping-pong row
/// is ([`timed_pingpong`]: one clock read a round, half round trips, the median), so the ratio
/// of a row to it is the operation's cost and not the measuring's; at least [`CACHELINE_ROUNDS`]
/// at scale 1.
pub(crate) fn cacheline_row(scale: f64) -> Row {
    use std::sync::atomic::Ordering::{Acquire, Release};
    let (iters, warm) = pingpong_iters(8, scale);
    let iters = iters.max((CACHELINE_ROUNDS as f64 * scale) as u64).max(1000);
    let rounds = iters + warm;
    let (ping, pong) = (Line(0.into()), Line(0.into()));
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 1..=rounds {
                while ping.0.load(Acquire) != i {
                    std::hint::spin_loop();
                }
                pong.0.store(i, Release);
            }
        });
        timed_pingpong("cacheline", 8, iters, warm, |i| {
            ping.0.store(i + 1, Release);
            while pong.0.load(Acquire) != i + 1 {
                std::hint::spin_loop();
            }
            Ok(())
        })
    })
    .expect("a cache-line round cannot fail")
}

/// Slots of the store row's window: writes cycle through this many places, so small writes
/// stay in the cache (as a stream of small writes to a peer's buffer does) and large ones
/// stream to memory.
const STORE_SLOTS: u64 = 64;
/// The store row's window at least and at most.
const STORE_WINDOW_MIN: u64 = 64 << 10;
const STORE_WINDOW_MAX: u64 = 4 << 20;
/// Store rows are the limit of small writes: up to this size (memcpy rows cover the rest).
pub(crate) const STORE_SIZE_MAX: u64 = 64 << 10;

/// The limit of one-way writes of `size` bytes: plain stores of that many bytes into a
/// shared mapping (a memfd, as a region is), `n` times, one after another at increasing
/// offsets through a window of [`STORE_SLOTS`] slots. Returns None when the mapping cannot
/// be made.
pub(crate) fn store_row(size: u64, scale: f64) -> Option<Row> {
    let window = (size * STORE_SLOTS).clamp(STORE_WINDOW_MIN, STORE_WINDOW_MAX);
    let size = size.min(window);
    let mem = rackwire_shm::SharedMem::create("rackwire-bench-store", window).ok()?;
    let n = ((iterations(STORE_BUDGET_BYTES, size, 1000, 50_000_000) as f64 * scale) as u64).max(100);
    let data = vec![7u8; size as usize];
    let slots = window / size;
    // Touch the window first: the row measures stores, not page faults.
    for k in 0..slots {
        mem.write_at(k * size, &data);
    }
    let m = Meter::start();
    for i in 0..n {
        mem.write_at((i % slots) * size, std::hint::black_box(&data));
    }
    Some(oneway_row("store", size, n, m))
}
