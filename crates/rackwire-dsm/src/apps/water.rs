//! All-pairs molecular dynamics in the manner of SPLASH-2's Water-nsquared: each rank computes
//! the forces between its molecules and every later one into a private array, then adds them
//! into the shared forces under one lock per block of molecules (the lock-heavy phase); a
//! barrier; each rank moves its own molecules; a barrier. The molecules interact by a soft
//! repulsion with a cutoff. Sums land in a different order at different rank counts, so a
//! shared run agrees with the one-process run to rounding, not bit for bit.
//!
//! Layout, in words: per molecule its position (3), velocity (3) and force (3).

use super::{share, Memory};
use crate::DsmError;

/// Words per molecule.
const MOLECULE_WORDS: usize = 9;
/// Locks the forces are split over (each a block of molecules).
pub const FORCE_LOCKS: usize = 16;
/// The time step.
const DT: f64 = 1e-3;
/// Pairs further apart than this do not interact.
const CUTOFF: f64 = 2.5;

/// Words for `n` molecules.
pub fn words(n: usize) -> usize {
    n * MOLECULE_WORDS
}

fn lock_of(i: usize, n: usize) -> usize {
    i * FORCE_LOCKS / n.max(1)
}

/// Place `n` molecules on a jittered cubic lattice (each rank its slice), then a barrier.
pub fn init(m: &mut impl Memory, n: usize, seed: u64) -> Result<(), DsmError> {
    let side = (n as f64).cbrt().ceil() as usize;
    for i in share(n, m.rank(), m.ranks()) {
        let mut x = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut jitter = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1000) as f64 / 10_000.0
        };
        let pos = [(i % side) as f64, ((i / side) % side) as f64, (i / (side * side)) as f64];
        for (k, p) in pos.iter().enumerate() {
            m.set(i * MOLECULE_WORDS + k, p * 1.1 + jitter())?;
            m.set(i * MOLECULE_WORDS + 3 + k, 0.0)?;
            m.set(i * MOLECULE_WORDS + 6 + k, 0.0)?;
        }
    }
    m.barrier()
}

/// Run `steps` time steps over `n` molecules.
pub fn simulate(m: &mut impl Memory, n: usize, steps: usize) -> Result<(), DsmError> {
    let (me, ranks) = (m.rank(), m.ranks());
    let mine = share(n, me, ranks);
    let mut all = vec![0f64; words(n)];
    for _ in 0..steps {
        m.read_numbers(0, &mut all)?;
        let pos: Vec<[f64; 3]> = all.chunks_exact(MOLECULE_WORDS).map(|w| [w[0], w[1], w[2]]).collect();
        let mut force = vec![[0.0f64; 3]; n];
        // As SPLASH-2's Water-nsquared: each molecule with the next half of the others (in
        // turn around the ring), so every molecule has as many pairs and ranks with equal
        // shares of molecules equal work; a pair half the ring apart is counted once.
        for i in mine.clone() {
            for step in 1..=n / 2 {
                let j = (i + step) % n;
                if 2 * step == n && i >= j {
                    continue;
                }
                let d = [pos[i][0] - pos[j][0], pos[i][1] - pos[j][1], pos[i][2] - pos[j][2]];
                let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                if r2 >= CUTOFF * CUTOFF || r2 == 0.0 {
                    continue;
                }
                // A soft repulsion: magnitude (1/r^2 - 1/cutoff^2), along d.
                let s = 1.0 / r2 - 1.0 / (CUTOFF * CUTOFF);
                for k in 0..3 {
                    force[i][k] += s * d[k];
                    force[j][k] -= s * d[k];
                }
            }
        }
        // Into the shared forces, a block of molecules per lock.
        for l in 0..FORCE_LOCKS {
            let block: Vec<usize> = (0..n).filter(|&i| lock_of(i, n) == l && force[i] != [0.0; 3]).collect();
            if block.is_empty() {
                continue;
            }
            m.lock(l)?;
            for i in block {
                for (k, f) in force[i].iter().enumerate() {
                    let at = i * MOLECULE_WORDS + 6 + k;
                    let v = m.get(at)?;
                    m.set(at, v + f)?;
                }
            }
            m.unlock(l)?;
        }
        m.barrier()?;
        // Each rank moves its own molecules: their words read and written whole.
        let mut own = vec![0f64; mine.len() * MOLECULE_WORDS];
        m.read_numbers(mine.start * MOLECULE_WORDS, &mut own)?;
        for w in own.chunks_exact_mut(MOLECULE_WORDS) {
            for k in 0..3 {
                let v = w[3 + k] + w[6 + k] * DT;
                w[k] += v * DT;
                w[3 + k] = v;
                w[6 + k] = 0.0;
            }
        }
        m.write_numbers(mine.start * MOLECULE_WORDS, &own)?;
        m.barrier()?;
    }
    Ok(())
}

/// The molecules' positions.
pub fn positions(m: &mut impl Memory, n: usize) -> Result<Vec<f64>, DsmError> {
    (0..n).flat_map(|i| (0..3).map(move |k| i * MOLECULE_WORDS + k)).map(|at| m.get(at)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::Plain;

    // Checks the physics on one process: the forces are equal and opposite, so the total
    // momentum stays zero over 20 steps of 64 molecules, and the molecules moved.
    #[test]
    fn momentum_is_kept_and_molecules_move() {
        let n = 64;
        let mut m = Plain::zeroed(words(n));
        init(&mut m, n, 1).unwrap();
        let before = positions(&mut m, n).unwrap();
        simulate(&mut m, n, 20).unwrap();
        let after = positions(&mut m, n).unwrap();
        assert!(before.iter().zip(&after).any(|(a, b)| (a - b).abs() > 1e-6), "nothing moved");
        for k in 0..3 {
            let p: f64 = (0..n).map(|i| f64::from_bits(m.0[i * MOLECULE_WORDS + 3 + k])).sum();
            assert!(p.abs() < 1e-9, "momentum {k}: {p}");
        }
    }
}
