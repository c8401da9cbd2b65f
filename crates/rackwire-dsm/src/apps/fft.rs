//! The six-step FFT (SPLASH-2's FFT, radix-√n): `n = m²` complex points as an `m` x `m`
//! matrix; transpose, `m` FFTs of `m` points on the rows, a twiddle of each point, transpose,
//! `m` FFTs on the rows, transpose. Each rank takes a block of rows in every step (a transpose
//! reads the other ranks' rows: the shared memory's traffic); barriers between steps. The
//! result is in natural order, and a shared run's is the one-process run's bit for bit.
//!
//! Layout, in words: the points (`2n`: real, imaginary), the scratch matrix (`2n`).

use std::f64::consts::PI;

use super::{share, Memory};
use crate::DsmError;

/// Words the transform needs for `n` points.
pub fn words(n: usize) -> usize {
    4 * n
}

/// The matrix side for `n` points: `n` must be a power of 4 (a square of a power of 2).
fn side(n: usize) -> Result<usize, DsmError> {
    let m = (n as f64).sqrt() as usize;
    if n == 0 || m * m != n || !m.is_power_of_two() {
        return Err(DsmError::Limit { what: "FFT points (a power of 4)", n, max: 1 << 40 });
    }
    Ok(m)
}

#[cfg(test)]
fn get(mem: &mut impl Memory, base: usize, i: usize) -> Result<(f64, f64), DsmError> {
    Ok((mem.get(base + 2 * i)?, mem.get(base + 2 * i + 1)?))
}

/// Fill the points from `seed`, each rank its rows (and zero its rows of the scratch matrix,
/// so that both matrices' rows have their homes at the rank that works on them, as SPLASH-2's
/// FFT lets each processor touch its own part first), then a barrier.
pub fn init(mem: &mut impl Memory, n: usize, seed: u64) -> Result<(), DsmError> {
    let m = side(n)?;
    let mut row = vec![0f64; 2 * m];
    for r in share(m, mem.rank(), mem.ranks()) {
        mem.write_numbers(2 * n + 2 * r * m, &row)?;
        for (c, p) in row.chunks_exact_mut(2).enumerate() {
            let i = r * m + c;
            let mut x = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            x ^= x >> 29;
            x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            p[0] = (x % 2000) as f64 / 1000.0 - 1.0;
            p[1] = ((x >> 20) % 2000) as f64 / 1000.0 - 1.0;
        }
        mem.write_numbers(2 * r * m, &row)?;
        row.fill(0.0);
    }
    mem.barrier()
}

/// Rows of `to` a transpose fills at once: it reads their piece of every row of `from` (one
/// contiguous run each), then writes the rows whole.
const TRANSPOSE_ROWS: usize = 32;

/// Transpose the `m` x `m` matrix at `from` into `to`: this rank's rows of `to`.
fn transpose(mem: &mut impl Memory, m: usize, from: usize, to: usize) -> Result<(), DsmError> {
    let mine = share(m, mem.rank(), mem.ranks());
    let mut tile = vec![0f64; 2 * TRANSPOSE_ROWS * m];
    let mut row = vec![0f64; 2 * m];
    let mut r0 = mine.start;
    while r0 < mine.end {
        let rows = (mine.end - r0).min(TRANSPOSE_ROWS);
        let spans: Vec<(usize, usize)> = (0..m).map(|c| (from + 2 * (c * m + r0), 2 * rows)).collect();
        mem.prefetch(&spans)?;
        // tile[c] holds from[c][r0..r0 + rows].
        for c in 0..m {
            mem.read_numbers(from + 2 * (c * m + r0), &mut tile[2 * rows * c..2 * rows * (c + 1)])?;
        }
        for k in 0..rows {
            for c in 0..m {
                row[2 * c] = tile[2 * (rows * c + k)];
                row[2 * c + 1] = tile[2 * (rows * c + k) + 1];
            }
            mem.write_numbers(to + 2 * (r0 + k) * m, &row)?;
        }
        r0 += rows;
    }
    mem.barrier()
}

/// Row `r` of the matrix at `base`, as points.
fn read_row(mem: &mut impl Memory, base: usize, m: usize, r: usize) -> Result<Vec<(f64, f64)>, DsmError> {
    let mut flat = vec![0f64; 2 * m];
    mem.read_numbers(base + 2 * r * m, &mut flat)?;
    Ok(flat.chunks_exact(2).map(|p| (p[0], p[1])).collect())
}

/// Write row `r` of the matrix at `base`.
fn write_row(mem: &mut impl Memory, base: usize, m: usize, r: usize, v: &[(f64, f64)]) -> Result<(), DsmError> {
    let flat: Vec<f64> = v.iter().flat_map(|&(re, im)| [re, im]).collect();
    debug_assert_eq!(flat.len(), 2 * m);
    mem.write_numbers(base + 2 * r * m, &flat)
}

/// An in-place radix-2 FFT of the `m` points `v`.
fn fft_row(v: &mut [(f64, f64)]) {
    let m = v.len();
    // Bit-reversal order, then butterflies.
    let bits = m.trailing_zeros();
    for i in 0..m {
        let j = if bits == 0 { 0 } else { i.reverse_bits() >> (usize::BITS - bits) };
        if i < j {
            v.swap(i, j);
        }
    }
    let mut len = 2;
    while len <= m {
        let ang = -2.0 * PI / len as f64;
        for start in (0..m).step_by(len) {
            for k in 0..len / 2 {
                let (wr, wi) = ((ang * k as f64).cos(), (ang * k as f64).sin());
                let (ar, ai) = v[start + k];
                let (br, bi) = v[start + k + len / 2];
                let (tr, ti) = (br * wr - bi * wi, br * wi + bi * wr);
                v[start + k] = (ar + tr, ai + ti);
                v[start + k + len / 2] = (ar - tr, ai - ti);
            }
        }
        len *= 2;
    }
}

/// Transform the `n` points in place (forward, unscaled).
pub fn transform(mem: &mut impl Memory, n: usize) -> Result<(), DsmError> {
    let m = side(n)?;
    let (x, y) = (0, 2 * n);
    let (me, ranks) = (mem.rank(), mem.ranks());
    transpose(mem, m, x, y)?;
    for r in share(m, me, ranks) {
        let mut v = read_row(mem, y, m, r)?;
        fft_row(&mut v);
        // Twiddle: point (r, c) by w_n^(r c).
        for (c, p) in v.iter_mut().enumerate() {
            let ang = -2.0 * PI * (r * c) as f64 / n as f64;
            let (wr, wi) = (ang.cos(), ang.sin());
            let (a, b) = *p;
            *p = (a * wr - b * wi, a * wi + b * wr);
        }
        write_row(mem, y, m, r, &v)?;
    }
    mem.barrier()?;
    transpose(mem, m, y, x)?;
    for r in share(m, me, ranks) {
        let mut v = read_row(mem, x, m, r)?;
        fft_row(&mut v);
        write_row(mem, x, m, r, &v)?;
    }
    mem.barrier()?;
    transpose(mem, m, x, y)?;
    // The result, in natural order, back where the points were.
    for r in share(m, me, ranks) {
        let v = read_row(mem, y, m, r)?;
        write_row(mem, x, m, r, &v)?;
    }
    mem.barrier()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::Plain;

    // Checks the six-step transform against a direct DFT for 16, 64 and 256 points (relative
    // error under 1e-9 of the largest output), and that a point count that is not a power of 4
    // is refused.
    #[test]
    fn six_steps_give_the_dft() {
        for n in [16usize, 64, 256] {
            let mut mem = Plain::zeroed(words(n));
            init(&mut mem, n, 9).unwrap();
            let input: Vec<(f64, f64)> = (0..n).map(|i| get(&mut mem, 0, i).unwrap()).collect();
            transform(&mut mem, n).unwrap();
            let mut worst = 0f64;
            let mut scale = 0f64;
            for k in 0..n {
                let (mut sr, mut si) = (0.0, 0.0);
                for (j, (xr, xi)) in input.iter().enumerate() {
                    let ang = -2.0 * PI * ((j * k) % n) as f64 / n as f64;
                    sr += xr * ang.cos() - xi * ang.sin();
                    si += xr * ang.sin() + xi * ang.cos();
                }
                let (gr, gi) = get(&mut mem, 0, k).unwrap();
                worst = worst.max((gr - sr).abs().max((gi - si).abs()));
                scale = scale.max(sr.abs().max(si.abs()));
            }
            assert!(worst < 1e-9 * scale, "{n} points: error {worst} of {scale}");
        }
        assert!(transform(&mut Plain::zeroed(words(32)), 32).is_err());
    }
}
