//! Every collective of a group, checked against a result computed locally from inputs that
//! every rank can compute for every other (seeded patterns, seeded random counts).

use rackwire_coll::{CollError, Group, ReduceOp};

/// A small seeded generator (splitmix64): every rank draws the same numbers from one seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// The bytes rank `rank` contributes for `(len, salt)`.
pub fn pattern(rank: usize, len: usize, salt: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31) ^ rank.wrapping_mul(131) ^ salt.wrapping_mul(7)) as u8).collect()
}

fn fail(what: &str, len: usize, root: usize) -> CollError {
    CollError::BadArgument(format!("CHECK FAILED: {what} (len {len}, root {root})"))
}

/// Run every collective at each of `lens` with a rotating root, plus `random_rounds` of
/// alltoallv and gatherv with random counts up to `random_max` bytes; an `Err` whose text
/// starts with `CHECK FAILED` is a wrong result.
pub fn run_all(g: &mut Group, lens: &[usize], random_rounds: usize, random_max: usize) -> Result<(), CollError> {
    let (me, n) = (g.rank(), g.size());
    for (salt, &len) in lens.iter().enumerate() {
        let root = (salt * 7 + 1) % n;
        g.barrier()?;
        let mut buf = if me == root { pattern(root, len, salt) } else { vec![0; len] };
        g.bcast(root, &mut buf)?;
        if buf != pattern(root, len, salt) {
            return Err(fail("bcast", len, root));
        }
        let all: Vec<u8> = (0..n).flat_map(|r| pattern(r, len, salt)).collect();
        let mut got = vec![0; len];
        g.scatter(root, if me == root { &all } else { &[] }, &mut got)?;
        if got != pattern(me, len, salt) {
            return Err(fail("scatter", len, root));
        }
        let mut gathered = vec![0; if me == root { n * len } else { 0 }];
        g.gather(root, &pattern(me, len, salt), &mut gathered)?;
        if me == root && gathered != all {
            return Err(fail("gather", len, root));
        }
        let mut ag = vec![0; n * len];
        g.allgather(&pattern(me, len, salt), &mut ag)?;
        if ag != all {
            return Err(fail("allgather", len, root));
        }
        // alltoall: block j of rank i is pattern(i * n + j).
        let send: Vec<u8> = (0..n).flat_map(|j| pattern(me * n + j, len, salt)).collect();
        let mut recv = vec![0; n * len];
        g.alltoall(&send, &mut recv)?;
        let want: Vec<u8> = (0..n).flat_map(|i| pattern(i * n + me, len, salt)).collect();
        if recv != want {
            return Err(fail("alltoall", len, root));
        }
        let elems = len / 8 + 1;
        let mut v: Vec<u64> = (0..elems).map(|i| (i * 7 + me * 1000) as u64).collect();
        g.allreduce(&mut v, ReduceOp::Sum)?;
        let want: Vec<u64> = (0..elems).map(|i| (0..n).map(|r| (i * 7 + r * 1000) as u64).sum()).collect();
        if v != want {
            return Err(fail("allreduce u64 sum", len, root));
        }
        let mut v: Vec<i32> = (0..elems).map(|i| i as i32 * if me % 2 == 0 { 1 } else { -1 }).collect();
        g.allreduce(&mut v, ReduceOp::Max)?;
        if v.iter().enumerate().any(|(i, &x)| x != i as i32) {
            return Err(fail("allreduce i32 max", len, root));
        }
        let mut f: Vec<f64> = (0..elems).map(|i| i as f64 - me as f64).collect();
        g.reduce(root, &mut f, ReduceOp::Min)?;
        if me == root && f.iter().enumerate().any(|(i, &x)| x != i as f64 - (n - 1) as f64) {
            return Err(fail("reduce f64 min", len, root));
        }
        let mut p: Vec<f32> = vec![if me == 0 { 3.0 } else { 1.0 }; elems.min(1024)];
        g.allreduce(&mut p, ReduceOp::Prod)?;
        if p.iter().any(|&x| x != 3.0) {
            return Err(fail("allreduce f32 prod", len, root));
        }
        let mut u: Vec<u32> = vec![me as u32 + 1; elems];
        g.reduce(root, &mut u, ReduceOp::Sum)?;
        if me == root && u.iter().any(|&x| x as usize != n * (n + 1) / 2) {
            return Err(fail("reduce u32 sum", len, root));
        }
        let mut w: Vec<i64> = vec![-(me as i64); elems];
        g.allreduce(&mut w, ReduceOp::Min)?;
        if w.iter().any(|&x| x != -(n as i64 - 1)) {
            return Err(fail("allreduce i64 min", len, root));
        }
    }
    random_counts(g, 0x5eed_0000, random_rounds, random_max)
}

/// `rounds` rounds of alltoallv, gatherv, scatterv and allgatherv with random counts up to
/// `max` bytes (and a random root), drawn from `seed` (every rank passes the same), each
/// checked against the patterns every rank can compute.
pub fn random_counts(g: &mut Group, seed: u64, rounds: usize, max: usize) -> Result<(), CollError> {
    let (me, n) = (g.rank(), g.size());
    let random_max = max;
    // The destination of alltoallv_to: room for every block at the largest count, after an
    // offset of up to 63 bytes (so blocks land unaligned too).
    let dest = g.alloc_symmetric((n * max + 64) as u64, rackwire::Access::READ | rackwire::Access::WRITE)?;
    // counts[i][j] bytes from rank i to rank j, the same matrix on every rank.
    for round in 0..rounds {
        let mut rng = Rng(seed.wrapping_add(round as u64));
        let counts: Vec<Vec<usize>> = (0..n).map(|_| (0..n).map(|_| rng.below(random_max + 1)).collect()).collect();
        let root = rng.below(n);
        let send: Vec<u8> = (0..n).flat_map(|j| pattern(me * n + j, counts[me][j], round)).collect();
        let recv_counts: Vec<usize> = (0..n).map(|i| counts[i][me]).collect();
        let mut recv = vec![0; recv_counts.iter().sum()];
        g.alltoallv(&send, &counts[me], &mut recv, &recv_counts)?;
        let want: Vec<u8> = (0..n).flat_map(|i| pattern(i * n + me, counts[i][me], round)).collect();
        if recv != want {
            return Err(fail("alltoallv", random_max, root));
        }
        // The same blocks into registered memory (large ones written straight into place by
        // their senders, small ones staged): the region must hold exactly what alltoallv gave.
        let at = rng.below(64) as u64;
        g.alltoallv_to(&send, &counts[me], &dest, at, &recv_counts)?;
        if dest.region.to_vec(at, want.len())? != want {
            return Err(fail("alltoallv_to", random_max, root));
        }
        // gatherv: rank i sends counts[i][root] bytes.
        let gcounts: Vec<usize> = (0..n).map(|i| counts[i][root]).collect();
        let mine = pattern(me, gcounts[me], round);
        let mut out = vec![0; if me == root { gcounts.iter().sum() } else { 0 }];
        g.gatherv(root, &mine, &gcounts, &mut out)?;
        let want: Vec<u8> = (0..n).flat_map(|i| pattern(i, gcounts[i], round)).collect();
        if me == root && out != want {
            return Err(fail("gatherv", random_max, root));
        }
        // scatterv and allgatherv with the same counts.
        let all: Vec<u8> = (0..n).flat_map(|i| pattern(i, gcounts[i], round)).collect();
        let mut part = vec![0; gcounts[me]];
        g.scatterv(root, if me == root { &all } else { &[] }, &gcounts, &mut part)?;
        if part != mine {
            return Err(fail("scatterv", random_max, root));
        }
        let mut every = vec![0; all.len()];
        g.allgatherv(&mine, &gcounts, &mut every)?;
        if every != all {
            return Err(fail("allgatherv", random_max, root));
        }
    }
    Ok(())
}
