//! Radix sort of integer keys (SPLASH-2's Radix): each rank holds a contiguous slice of the
//! keys; for each digit, every rank counts its keys' digits into its row of a shared histogram;
//! barrier; every rank works out, from every row, where each of its keys goes (all smaller
//! digits of every rank first, then the same digit of the ranks before it) and writes its keys
//! there in the other array, keeping their order; barrier; the arrays trade places. The sort is
//! stable and its result the one-process run's.
//!
//! Layout, in words: the keys (`keys`), the other array (`keys`), the histogram (a row of
//! [`RADIX`] counts per rank, [`RANKS_MAX`] rows).

use super::{share, Memory};
use crate::DsmError;

/// Bits of one digit.
pub const DIGIT_BITS: u32 = 8;
/// Values of one digit.
pub const RADIX: usize = 1 << DIGIT_BITS;
/// Rows of the histogram: the most ranks a sort runs on.
pub const RANKS_MAX: usize = 16;

/// Words the sort needs for `keys` keys.
pub fn words(keys: usize) -> usize {
    2 * keys + RANKS_MAX * RADIX
}

/// Fill the keys (below `2^bits`) from `seed`: each rank its slice (and zeroes its slice of
/// the other array, so both have their homes at the rank that reads them), then a barrier.
pub fn init(m: &mut impl Memory, keys: usize, bits: u32, seed: u64) -> Result<(), DsmError> {
    let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let mine = share(keys, m.rank(), m.ranks());
    let slice: Vec<u64> = mine
        .clone()
        .map(|i| {
            // A key is a function of its index alone, so every rank's slice is the same whoever
            // fills it.
            let mut x = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            x ^= x >> 31;
            x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x ^= x >> 29;
            x & mask
        })
        .collect();
    m.write_words(mine.start, &slice)?;
    m.write_words(keys + mine.start, &vec![0; slice.len()])?;
    m.barrier()
}

/// Sort the `keys` keys (below `2^bits`). Where the sorted keys lie at the end: 0 (the keys'
/// array) or `keys` (the other), after the passes' trading of places.
pub fn sort(m: &mut impl Memory, keys: usize, bits: u32) -> Result<usize, DsmError> {
    let (me, ranks) = (m.rank(), m.ranks());
    if ranks > RANKS_MAX {
        return Err(DsmError::Limit { what: "radix sort ranks", n: ranks, max: RANKS_MAX });
    }
    let hist = 2 * keys;
    let mine = share(keys, me, ranks);
    let (mut from, mut to) = (0, keys);
    let mut own = vec![0u64; mine.len()];
    for pass in 0..bits.div_ceil(DIGIT_BITS) {
        let shift = pass * DIGIT_BITS;
        let digit = |k: u64| ((k >> shift) as usize) & (RADIX - 1);
        let mut counts = vec![0u64; RADIX];
        m.read_words(from + mine.start, &mut own)?;
        for k in &own {
            counts[digit(*k)] += 1;
        }
        m.write_words(hist + me * RADIX, &counts)?;
        m.barrier()?;
        let mut hists = vec![0u64; ranks * RADIX];
        m.read_words(hist, &mut hists)?;
        // Where this rank's keys of each digit start.
        let mut start = vec![0u64; RADIX];
        let mut below = 0u64;
        for (d, s) in start.iter_mut().enumerate() {
            let mut before_me = 0;
            let mut all = 0;
            for r in 0..ranks {
                let c = hists[r * RADIX + d];
                if r < me {
                    before_me += c;
                }
                all += c;
            }
            *s = below + before_me;
            below += all;
        }
        if below != keys as u64 {
            return Err(DsmError::Limit { what: "histogram total", n: below as usize, max: keys });
        }
        // Each digit's keys of this rank, in order, land in one run from its start.
        let mut buckets: Vec<Vec<u64>> = counts.iter().map(|&c| Vec::with_capacity(c as usize)).collect();
        for &k in &own {
            buckets[digit(k)].push(k);
        }
        for (d, b) in buckets.iter().enumerate() {
            m.write_words(to + start[d] as usize, b)?;
        }
        m.barrier()?;
        std::mem::swap(&mut from, &mut to);
    }
    Ok(from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::Plain;

    // Checks the sort on one process: 5,000 keys of 20 bits come out in order and as the same
    // multiset as went in (three passes, so the result is in the other array).
    #[test]
    fn keys_come_out_sorted() {
        let n = 5_000;
        let mut m = Plain::zeroed(words(n));
        init(&mut m, n, 20, 3).unwrap();
        let mut want: Vec<u64> = m.0[..n].to_vec();
        want.sort_unstable();
        let at = sort(&mut m, n, 20).unwrap();
        assert_eq!(at, n, "three passes end in the other array");
        assert_eq!(&m.0[at..at + n], &want[..]);
    }
}
