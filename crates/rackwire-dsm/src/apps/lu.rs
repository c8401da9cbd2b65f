//! Blocked LU factorisation without pivoting, contiguous blocks (SPLASH-2's LU, "contiguous"):
//! an `n` x `n` matrix of `b` x `b` blocks, each block's words together, block `(i, j)` owned by
//! rank `(i + j) % ranks`. Step `k`: the diagonal block's owner factorises it; barrier; the
//! owners of the blocks right of it and below it solve against it; barrier; every other
//! trailing block's owner subtracts the product of its row's and its column's blocks; barrier.
//! Every block sees the same operations in the same order whoever owns it, so a shared run's
//! result equals the one-process run's bit for bit.

use super::Memory;
use crate::DsmError;

/// The matrix's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Rows (and columns).
    pub n: usize,
    /// Block side; divides `n`.
    pub b: usize,
}

impl Shape {
    /// Blocks per row.
    pub fn blocks(self) -> usize {
        self.n / self.b
    }

    /// Words of the matrix.
    pub fn words(self) -> usize {
        self.n * self.n
    }

    /// Index of element `(r, c)` of block `(i, j)`.
    fn at(self, i: usize, j: usize, r: usize, c: usize) -> usize {
        ((i * self.blocks() + j) * self.b + r) * self.b + c
    }

    /// Index of element `(row, col)` of the matrix.
    pub fn element(self, row: usize, col: usize) -> usize {
        self.at(row / self.b, col / self.b, row % self.b, col % self.b)
    }
}

/// Why a shape is refused.
fn check(s: Shape) -> Result<(), DsmError> {
    if s.b == 0 || s.n == 0 || !s.n.is_multiple_of(s.b) {
        return Err(DsmError::Limit { what: "LU block side (must divide the matrix's)", n: s.b, max: s.n });
    }
    Ok(())
}

/// Fill the matrix with a diagonally dominant one (so no pivoting is needed), from `seed`:
/// each rank the blocks it will factorise (so first-touch placement homes them there), then a
/// barrier.
pub fn init(m: &mut impl Memory, s: Shape, seed: u64) -> Result<(), DsmError> {
    check(s)?;
    let (nb, b, me, ranks) = (s.blocks(), s.b, m.rank(), m.ranks());
    let mut blk = vec![0f64; b * b];
    for i in 0..nb {
        for j in 0..nb {
            if owner(i, j, ranks) != me {
                continue;
            }
            for r in 0..b {
                for c in 0..b {
                    let (row, col) = (i * b + r, j * b + c);
                    let v = element_value(seed, row * s.n + col);
                    blk[r * b + c] = if row == col { v + s.n as f64 } else { v };
                }
            }
            m.write_numbers(s.at(i, j, 0, 0), &blk)?;
        }
    }
    m.barrier()
}

/// The starting value of the element at `index` (row-major), in [0, 1): a hash of the seed
/// and the index, so any rank computes any element.
fn element_value(seed: u64, index: usize) -> f64 {
    let mut x = seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 29;
    (x % 1000) as f64 / 1000.0
}

fn owner(i: usize, j: usize, ranks: usize) -> usize {
    (i + j) % ranks
}

/// Factorise in place: afterwards the strictly lower part holds L (unit diagonal) and the rest U.
/// Each block step reads its blocks into private memory, computes there and writes its block
/// back (blocks are contiguous: SPLASH-2's contiguous LU), so the shared memory is touched a
/// block at a time.
pub fn factorise(m: &mut impl Memory, s: Shape) -> Result<(), DsmError> {
    check(s)?;
    let (nb, b, me, ranks) = (s.blocks(), s.b, m.rank(), m.ranks());
    let bb = b * b;
    let (mut diag, mut blk, mut left, mut up) = (vec![0f64; bb], vec![0f64; bb], vec![0f64; bb], vec![0f64; bb]);
    for k in 0..nb {
        if owner(k, k, ranks) == me {
            m.read_numbers(s.at(k, k, 0, 0), &mut diag)?;
            factorise_diagonal(&mut diag, b);
            m.write_numbers(s.at(k, k, 0, 0), &diag)?;
        }
        m.barrier()?;
        // The diagonal block, if this rank owns a block of its row or column.
        if (k + 1..nb).any(|t| owner(k, t, ranks) == me || owner(t, k, ranks) == me) {
            m.prefetch(&[(s.at(k, k, 0, 0), bb)])?;
        }
        let mut have_diag = false;
        for t in k + 1..nb {
            let (right, below) = (owner(k, t, ranks) == me, owner(t, k, ranks) == me);
            if (right || below) && !have_diag {
                m.read_numbers(s.at(k, k, 0, 0), &mut diag)?;
                have_diag = true;
            }
            if right {
                m.read_numbers(s.at(k, t, 0, 0), &mut blk)?;
                solve_right(&diag, &mut blk, b);
                m.write_numbers(s.at(k, t, 0, 0), &blk)?;
            }
            if below {
                m.read_numbers(s.at(t, k, 0, 0), &mut blk)?;
                solve_below(&diag, &mut blk, b);
                m.write_numbers(s.at(t, k, 0, 0), &blk)?;
            }
        }
        m.barrier()?;
        // Every block of column k and row k this rank's updates read, fetched together.
        let mut spans = Vec::new();
        for t in k + 1..nb {
            if (k + 1..nb).any(|j| owner(t, j, ranks) == me) {
                spans.push((s.at(t, k, 0, 0), bb));
            }
            if (k + 1..nb).any(|i| owner(i, t, ranks) == me) {
                spans.push((s.at(k, t, 0, 0), bb));
            }
        }
        m.prefetch(&spans)?;
        for i in k + 1..nb {
            let mut have_left = false;
            for j in k + 1..nb {
                if owner(i, j, ranks) != me {
                    continue;
                }
                if !have_left {
                    m.read_numbers(s.at(i, k, 0, 0), &mut left)?;
                    have_left = true;
                }
                m.read_numbers(s.at(k, j, 0, 0), &mut up)?;
                m.read_numbers(s.at(i, j, 0, 0), &mut blk)?;
                update(&mut blk, &left, &up, b);
                m.write_numbers(s.at(i, j, 0, 0), &blk)?;
            }
        }
        m.barrier()?;
    }
    Ok(())
}

/// LU of the diagonal block `d` (`b` x `b`, by rows) in place.
#[inline(never)]
fn factorise_diagonal(d: &mut [f64], b: usize) {
    for p in 0..b {
        let pivot = d[p * b + p];
        for r in p + 1..b {
            let l = d[r * b + p] / pivot;
            d[r * b + p] = l;
            for c in p + 1..b {
                d[r * b + c] -= l * d[p * b + c];
            }
        }
    }
}

/// A block right of the diagonal: `a = L(d)^-1 a` (forward substitution, unit L).
#[inline(never)]
fn solve_right(d: &[f64], a: &mut [f64], b: usize) {
    for p in 0..b {
        for r in p + 1..b {
            let l = d[r * b + p];
            for c in 0..b {
                a[r * b + c] -= l * a[p * b + c];
            }
        }
    }
}

/// A block below the diagonal: `a = a U(d)^-1`.
#[inline(never)]
fn solve_below(d: &[f64], a: &mut [f64], b: usize) {
    for p in 0..b {
        let u = d[p * b + p];
        for r in 0..b {
            let v = a[r * b + p] / u;
            a[r * b + p] = v;
            for c in p + 1..b {
                a[r * b + c] -= v * d[p * b + c];
            }
        }
    }
}

/// The trailing update of a block: `a -= left x up`, each element's products taken off in `p`
/// order. Row by row, the inner loop along a row of `up` and of `a` (contiguous, so the
/// compiler vectorises it; each element still sees its products in the same order). Never
/// inlined: one compiled kernel for every `Memory` the factorisation runs over, so a shared
/// run and the one-process run it is timed against compute with the same code.
#[inline(never)]
fn update(a: &mut [f64], left: &[f64], up: &[f64], b: usize) {
    for (arow, lrow) in a.chunks_exact_mut(b).zip(left.chunks_exact(b)) {
        for (&l, urow) in lrow.iter().zip(up.chunks_exact(b)) {
            for (x, &u) in arow.iter_mut().zip(urow) {
                *x -= l * u;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::Plain;

    // Checks the factorisation on one process against the matrix it came from: L x U (L with
    // a unit diagonal, from the strictly lower part; U the rest) gives back the original within
    // rounding, for a 16 x 16 matrix of 4 x 4 blocks; and a block side that does not divide the
    // matrix is refused.
    #[test]
    fn l_times_u_gives_back_the_matrix() {
        let s = Shape { n: 16, b: 4 };
        let mut m = Plain::zeroed(s.words());
        init(&mut m, s, 7).unwrap();
        let a = m.clone();
        factorise(&mut m, s).unwrap();
        for row in 0..s.n {
            for col in 0..s.n {
                let mut sum = 0.0;
                for p in 0..s.n {
                    let l = match p.cmp(&row) {
                        std::cmp::Ordering::Less => f64::from_bits(m.0[s.element(row, p)]),
                        std::cmp::Ordering::Equal => 1.0,
                        std::cmp::Ordering::Greater => 0.0,
                    };
                    let u = if p <= col { f64::from_bits(m.0[s.element(p, col)]) } else { 0.0 };
                    sum += l * u;
                }
                let want = f64::from_bits(a.0[s.element(row, col)]);
                assert!((sum - want).abs() < 1e-9 * want.abs().max(1.0), "({row},{col}): {sum} vs {want}");
            }
        }
        assert!(factorise(&mut m, Shape { n: 10, b: 4 }).is_err());
    }
}
