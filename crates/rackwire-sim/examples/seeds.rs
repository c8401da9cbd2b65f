//! Run seeds given on the command line (`cargo run --example seeds -- 0 20`), print failures.
fn main() {
    let a: Vec<u64> = std::env::args().skip(1).filter_map(|s| s.parse().ok()).collect();
    let (lo, hi) = (a.first().copied().unwrap_or(0), a.get(1).copied().unwrap_or(10));
    let mut bad = 0;
    for seed in lo..hi {
        let t = std::time::Instant::now();
        match rackwire_sim::run_seed(seed) {
            Ok(r) => println!(
                "seed {seed} ok: {} nodes x {} links, {} ops, {} bytes, {} ms virtual, {:.0} ms real; {}",
                r.nodes,
                r.links,
                r.ops,
                r.bytes,
                r.sim_us / 1000,
                t.elapsed().as_secs_f64() * 1e3,
                r.faults
            ),
            Err(e) => {
                bad += 1;
                println!("{e} ({:.0} ms real)", t.elapsed().as_secs_f64() * 1e3)
            }
        }
    }
    println!("{bad} failed");
}
