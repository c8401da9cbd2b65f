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

/// Fill the matrix with a diagonally dominant one (so no pivoting is needed), from `seed`; only
/// rank 0 writes, then a barrier.
pub fn init(m: &mut impl Memory, s: Shape, seed: u64) -> Result<(), DsmError> {
    check(s)?;
    if m.rank() == 0 {
        let mut x = seed | 1;
        for row in 0..s.n {
            for col in 0..s.n {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let v = (x % 1000) as f64 / 1000.0;
                m.set(s.element(row, col), if row == col { v + s.n as f64 } else { v })?;
            }
        }
    }
    m.barrier()
}

fn owner(i: usize, j: usize, ranks: usize) -> usize {
    (i + j) % ranks
}

/// Factorise in place: afterwards the strictly lower part holds L (unit diagonal) and the rest U.
pub fn factorise(m: &mut impl Memory, s: Shape) -> Result<(), DsmError> {
    check(s)?;
    let (nb, b, me, ranks) = (s.blocks(), s.b, m.rank(), m.ranks());
    for k in 0..nb {
        if owner(k, k, ranks) == me {
            // The diagonal block: LU of a b x b block.
            for p in 0..b {
                let pivot = m.get(s.at(k, k, p, p))?;
                for r in p + 1..b {
                    let l = m.get(s.at(k, k, r, p))? / pivot;
                    m.set(s.at(k, k, r, p), l)?;
                    for c in p + 1..b {
                        let v = m.get(s.at(k, k, r, c))? - l * m.get(s.at(k, k, p, c))?;
                        m.set(s.at(k, k, r, c), v)?;
                    }
                }
            }
        }
        m.barrier()?;
        for t in k + 1..nb {
            // Right of the diagonal: A(k,t) = L(k,k)^-1 A(k,t) (forward substitution, unit L).
            if owner(k, t, ranks) == me {
                for p in 0..b {
                    for r in p + 1..b {
                        let l = m.get(s.at(k, k, r, p))?;
                        for c in 0..b {
                            let v = m.get(s.at(k, t, r, c))? - l * m.get(s.at(k, t, p, c))?;
                            m.set(s.at(k, t, r, c), v)?;
                        }
                    }
                }
            }
            // Below the diagonal: A(t,k) = A(t,k) U(k,k)^-1.
            if owner(t, k, ranks) == me {
                for p in 0..b {
                    let u = m.get(s.at(k, k, p, p))?;
                    for r in 0..b {
                        let v = m.get(s.at(t, k, r, p))? / u;
                        m.set(s.at(t, k, r, p), v)?;
                        for c in p + 1..b {
                            let w = m.get(s.at(t, k, r, c))? - v * m.get(s.at(k, k, p, c))?;
                            m.set(s.at(t, k, r, c), w)?;
                        }
                    }
                }
            }
        }
        m.barrier()?;
        for i in k + 1..nb {
            for j in k + 1..nb {
                if owner(i, j, ranks) != me {
                    continue;
                }
                for r in 0..b {
                    for c in 0..b {
                        let mut v = m.get(s.at(i, j, r, c))?;
                        for p in 0..b {
                            v -= m.get(s.at(i, k, r, p))? * m.get(s.at(k, j, p, c))?;
                        }
                        m.set(s.at(i, j, r, c), v)?;
                    }
                }
            }
        }
        m.barrier()?;
    }
    Ok(())
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
