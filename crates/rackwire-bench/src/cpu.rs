//! How much work the whole machine did over a measurement: the time its cores were busy,
//! from the kernel's own count (`/proc/stat`), not any one process's.
//!
//! Where both ends of a path run on this machine (the hosts of a virtual rack), a stream's cost
//! is everything between the two programs: their system calls, both kernels' network stacks,
//! and whatever carries the packets between them (a veth pair's kernel work, a virtual NIC's
//! threads and the copies through its device). Busy core-seconds per byte carried compare
//! two paths' costs; where both are bound by the machine's cores, their rates stand in about
//! the inverse proportion.

/// Fields of `/proc/stat`'s `cpu` line that count busy time: user, nice, system (the next is
/// idle, then I/O wait), interrupts, soft interrupts. Steal (time the hypervisor gave to
/// others) and the guest fields (already inside user and nice) are not counted.
const BUSY_FIELDS: [usize; 5] = [0, 1, 2, 5, 6];

/// The machine's busy time so far, in clock ticks.
#[derive(Clone, Copy, Debug)]
pub struct MachineCpu {
    busy_ticks: u64,
}

impl MachineCpu {
    /// Now; `None` where `/proc/stat` cannot be read.
    pub fn now() -> Option<MachineCpu> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        busy_ticks(&text).map(|busy_ticks| MachineCpu { busy_ticks })
    }

    /// Core-seconds the machine's cores were busy since `self` (all cores together: two
    /// cores busy for one second are 2.0).
    pub fn busy_since(&self) -> Option<f64> {
        let now = MachineCpu::now()?;
        let ticks = now.busy_ticks.checked_sub(self.busy_ticks)?;
        Some(ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
    }
}

/// The busy ticks of `/proc/stat`'s text (its first line, the machine's total).
fn busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    BUSY_FIELDS.iter().map(|&i| fields.get(i).copied()).sum()
}

/// Busy core-seconds per 10^9 bytes carried (`None` when nothing was carried).
pub fn core_seconds_per_gb(busy: f64, bytes: f64) -> Option<f64> {
    (bytes > 0.0).then(|| busy / (bytes / 1e9))
}

/// Busy core-microseconds per operation (`None` when none was done).
pub fn core_us_per_op(busy: f64, ops: u64) -> Option<f64> {
    (ops > 0).then(|| busy * 1e6 / ops as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks which of `/proc/stat`'s fields count as busy: user, nice, system, interrupts and
    // soft interrupts of the machine's line, not idle, I/O wait, steal or the guest fields,
    // nor any single core's line; and that a line cut short or garbled gives nothing.
    #[test]
    fn busy_time_is_user_nice_system_and_interrupts() {
        let stat = "cpu  100 2 30 5000 7 1 4 900 50 60\ncpu0 1 1 1 1 1 1 1 1 1 1\nintr 5\n";
        assert_eq!(busy_ticks(stat), Some(100 + 2 + 30 + 1 + 4));
        assert_eq!(busy_ticks("cpu  1 2 3 4 5\n"), None);
        assert_eq!(busy_ticks("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(busy_ticks("cpu0 1 2 3 4 5 6 7 8\n"), None);
    }

    // Checks that this machine's count can be read and only grows: busy time since a moment
    // is never negative, and a loop that keeps a core busy for 50 ms shows up in it (at least
    // one clock tick of 10 ms; the kernel counts in ticks).
    #[test]
    fn the_machines_busy_time_grows_with_work() {
        let Some(start) = MachineCpu::now() else {
            eprintln!("skipped: /proc/stat cannot be read here");
            return;
        };
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let busy = start.busy_since().expect("read again");
        assert!(busy >= 0.01, "busy {busy} core-seconds over a 50 ms busy loop");
    }

    // Checks the costs per byte and per operation: 1.5 core-seconds for 3 * 10^9 bytes is 0.5
    // per 10^9, 0.25 core-seconds for 50,000 round trips 5 µs each; nothing carried or done
    // gives no figure rather than a division by zero.
    #[test]
    fn cost_per_gigabyte_and_per_operation() {
        assert_eq!(core_seconds_per_gb(1.5, 3e9), Some(0.5));
        assert_eq!(core_seconds_per_gb(1.0, 0.0), None);
        assert_eq!(core_us_per_op(0.25, 50_000), Some(5.0));
        assert_eq!(core_us_per_op(1.0, 0), None);
    }
}
