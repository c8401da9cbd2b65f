//! A distributed histogram: each rank draws its share of a million numbers, counts them into
//! 16 buckets, and one allreduce adds the counts up on every rank; rank 0 prints the result
//! and checks it against the total.
//!
//! ```text
//! cargo build --release -p rackwire-coll --example histogram
//! cargo run --release --bin rackwire -- launch -n 4 -- target/release/examples/histogram
//! ```

use rackwire_coll::{CollError, Group, ReduceOp};

const SAMPLES: u64 = 1_000_000;
const BUCKETS: usize = 16;

fn main() -> Result<(), CollError> {
    let mut group = Group::from_env()?;
    let (rank, size) = (group.rank() as u64, group.size() as u64);
    // This rank's share of the samples, from a generator seeded by its rank.
    let share = SAMPLES / size + u64::from(rank < SAMPLES % size);
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ rank;
    let mut counts = [0u64; BUCKETS];
    for _ in 0..share {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        counts[(state % BUCKETS as u64) as usize] += 1;
    }
    group.allreduce(&mut counts, ReduceOp::Sum)?;
    if rank == 0 {
        println!("{SAMPLES} samples over {size} ranks, by bucket:");
        for (b, c) in counts.iter().enumerate() {
            println!("  {b:>2} {c:>8} {}", "#".repeat((c * 200 / SAMPLES) as usize));
        }
        assert_eq!(counts.iter().sum::<u64>(), SAMPLES, "every sample counted once");
    }
    group.leave()
}
