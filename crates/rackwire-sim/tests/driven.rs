//! The edge driver in the simulator: seeds of two nodes whose application and network threads
//! follow `rackwire_proto::driver` (see `rackwire_sim::driven`). A failure names the seed.

/// Seeds the normal test run covers.
const SEEDS: u64 = 300;

// Checks, on 300 seeds (links, timings, descheduling and the order of threads at one instant
// drawn from each), that a ping-pong and bursts of small writes driven by the hand-off finish,
// that every frame is read within the hand-off's bound (and at once when the application
// thread rests), and that gathered operations never wait past it; reports every failing seed.
#[test]
fn the_hand_off_keeps_its_bounds_on_every_seed() {
    let mut failures = Vec::new();
    let (mut app_rounds, mut net_rounds, mut rests, mut gathers) = (0, 0, 0, 0);
    for seed in 0..SEEDS {
        match rackwire_sim::run_driven(seed) {
            Ok(r) => {
                app_rounds += r.app_rounds;
                net_rounds += r.net_rounds;
                rests += r.rests;
                gathers += r.gathers;
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "{} seeds failed:\n{}", failures.len(), failures.join("\n"));
    // The seeds exercise both threads, rests and gathering (a run where one never happened
    // would prove nothing about it).
    assert!(
        app_rounds > 0 && net_rounds > 0 && rests > 0 && gathers > 0,
        "{app_rounds} {net_rounds} {rests} {gathers}"
    );
}
