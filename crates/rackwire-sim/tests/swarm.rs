//! The swarm in the normal test run: 200 seeds, each its own world, fault mix and workload,
//! with the safety and liveness checks of `rackwire_sim::swarm`. A failure names the seed;
//! `rackwire sim --seed S --stats` reproduces it.

/// Seeds the normal test run covers (`rackwire sim --seeds N` runs more).
const SEEDS: u64 = 200;

// Checks every invariant of the swarm on 200 seeds, spread over two threads, and reports
// every failing seed rather than only the first.
#[test]
fn two_hundred_seeds_pass() {
    let next = std::sync::atomic::AtomicU64::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed >= SEEDS {
                    return;
                }
                if let Err(e) = rackwire_sim::run_seed(seed) {
                    failures.lock().unwrap().push(e.to_string());
                }
            });
        }
    });
    let f = failures.into_inner().unwrap();
    assert!(f.is_empty(), "{} seeds failed:\n{}", f.len(), f.join("\n"));
}
