//! The collective operations of a [`Group`], built from steps of direct transfers
//! ([`crate::channel`]).
//!
//! # Algorithms, and why
//!
//! A rack has few ranks (tens at most) and, over shared memory, a transfer costs its copy and
//! two counter updates; there is no switch to be congested. So the collectives send each
//! block **straight to the rank that needs it** (one step, every pair at once) wherever that
//! moves no byte more than once, rather than routing it through other ranks over `log2 N`
//! steps as tree and butterfly algorithms do (they pay a step's latency per level and copy
//! the data at every level):
//!
//! - **barrier**: for 3 to [`BARRIER_FAN_MAX`] ranks, fan in to rank 0 and fan out from it:
//!   two hops whatever N, where dissemination needs `⌈log2 N⌉` dependent rounds — and when
//!   ranks outnumber cores each hop may wait for a process to be scheduled, so fewer hops
//!   matter more than rank 0's N−1 signals (a few stores each). Rank 0 also leaves first,
//!   so a rooted collective from rank 0 that follows finds its receivers not yet waiting.
//!   For two ranks, and above [`BARRIER_FAN_MAX`] (where one rank's signals would add up),
//!   dissemination: `⌈log2 N⌉` rounds of one empty signal each way, no root.
//! - **scatter(v), gather(v), allgather(v), alltoall(v)**: direct; the order of peers is
//!   staggered by rank so no rank is every sender's first target. A scatter's root copies a
//!   large own block after sending the others ([`SCATTER_OWN_LAST_MIN_BYTES`]).
//! - **broadcast**: direct from the root below [`BCAST_SCATTER_MIN_BYTES`]; at and above it
//!   (and for N ≥ 3) the root scatters the buffer in N segments and the ranks allgather them
//!   (van de Geijn): the root then sends the data once instead of N−1 times, which pays off
//!   as soon as the root's copying, not the extra step, is what takes the time.
//! - **reduce / allreduce**: below [`REDUCE_SEGMENTED_MIN_BYTES`] every rank sends its whole
//!   vector to the root (to every rank, for allreduce) and the receiver folds them; at and
//!   above it ([`REDUCE_SEGMENTED_PAIR_MIN_BYTES`] for two ranks), reduce-scatter then gather
//!   (allgather): rank i folds only segment i of every vector, so each rank moves about
//!   `2·(N−1)/N` of the vector and folds `1/N` of it, instead of folding all N vectors itself.
//!
//! Every fold goes in rank order (rank 0's contribution first), so every rank of an allreduce
//! gets the same bits, floating point included.

use rackwire::copy_bytes;

use crate::channel::{RecvSpec, SendSpec};
use crate::{CollError, Element, Group, ReduceOp, BLOCK_BYTES_MAX};

/// Groups of 3 up to this many ranks synchronise through rank 0 (fan in, fan out: two hops
/// whatever the size); larger groups, and pairs, by dissemination.
pub const BARRIER_FAN_MAX: usize = 16;
/// From this size (bytes) up, a broadcast scatters and allgathers instead of sending the
/// whole buffer from the root to every rank.
pub const BCAST_SCATTER_MIN_BYTES: usize = 64 * 1024;
/// From this size (bytes) up, a scatter's root copies its own block after it has sent the
/// others (when every rank has a core of its own), so its receivers copy theirs out while it
/// copies its own. Measured here, a pair of ranks (4–5 alternations a run): 0.74–0.82x the time at
/// 1 MiB, no change at 64 KiB, and 1.1–1.2x at 8 and 64 bytes (so small blocks keep the old
/// order). With four ranks on two cores the receivers cannot run beside the root, and the new
/// order took 1.24–1.30x the time at 64 KiB and 1 MiB: there the root copies its own first.
pub const SCATTER_OWN_LAST_MIN_BYTES: usize = 64 * 1024;
/// From this size (bytes) up, reduce and allreduce split the vector into one segment per rank
/// (reduce-scatter, then gather or allgather) instead of folding whole vectors.
pub const REDUCE_SEGMENTED_MIN_BYTES: usize = 16 * 1024;
/// The same switch for a pair of ranks. Split in two, each rank copies 2.5 vectors' worth and
/// folds half a vector instead of 4 and a whole one, but pays a second step: measured here
/// (five alternations, allreduce of f32), 1.07x the time at 16 KiB, 0.96x at 64 KiB, 0.77x at
/// 256 KiB and 0.73x at 1 MiB.
pub const REDUCE_SEGMENTED_PAIR_MIN_BYTES: usize = 64 * 1024;

fn block_ok(what: &str, len: usize) -> Result<(), CollError> {
    if len > BLOCK_BYTES_MAX {
        return Err(CollError::Limit(format!("{what}: a block of {len} bytes, at most {BLOCK_BYTES_MAX}")));
    }
    Ok(())
}

/// Where part `i` of `n` parts of `total` units starts (balanced: sizes differ by one at most).
fn seg_start(total: usize, n: usize, i: usize) -> usize {
    (total as u128 * i as u128 / n as u128) as usize
}

/// Peers of `me` in the staggered order: me+1, me+2, ... (mod n).
pub(crate) fn others(me: usize, n: usize) -> impl Iterator<Item = usize> {
    (1..n).map(move |k| (me + k) % n)
}

/// Cut `buf` into parts by `offs` (packed offsets, one more than ranks) and add a receive
/// into each part from its rank, but for this rank's part (returned) and `skip`'s, in the
/// staggered order: from `me - 1`, `me - 2`, ... first. Allocates nothing.
fn recvs_into<'a>(
    recvs: &mut Vec<RecvSpec<'a>>,
    mut buf: &'a mut [u8],
    offs: &[usize],
    me: usize,
    skip: Option<usize>,
) -> &'a mut [u8] {
    let n = offs.len() - 1;
    let mut mine: &'a mut [u8] = &mut [];
    for (r, w) in offs.windows(2).enumerate() {
        let (part, rest) = std::mem::take(&mut buf).split_at_mut(w[1] - w[0]);
        buf = rest;
        if r == me {
            mine = part;
        } else if Some(r) != skip {
            recvs.push(RecvSpec { from: r, into: part });
        }
    }
    recvs.sort_unstable_by_key(|r| (me + n - r.from) % n);
    mine
}

/// Offsets of `n` blocks of `len` bytes, packed, into `offs`.
fn equal_offs(offs: &mut Vec<usize>, n: usize, len: usize) {
    offs.clear();
    offs.extend((0..=n).map(|i| i * len));
}

fn as_elems<T: Element>(b: &[u8]) -> Result<&[T], CollError> {
    bytemuck::try_cast_slice(b).map_err(|e| CollError::BadArgument(format!("element view: {e:?}")))
}

impl Group {
    /// Run one step built in vectors from [`crate::reuse::Reuse::take`], and keep them.
    pub(crate) fn run<'a>(
        &mut self,
        sends: Vec<SendSpec<'a>>,
        mut recvs: Vec<RecvSpec<'a>>,
        during: &'static str,
    ) -> Result<(), CollError> {
        let outcome = self.ch.exchange(&sends, &mut recvs, during);
        self.reuse.keep(sends, recvs);
        outcome
    }

    /// Run `f` with a count of `len` for every rank (kept between calls: no allocation).
    fn with_equal_counts<R>(&mut self, len: usize, f: impl FnOnce(&mut Self, &[usize]) -> R) -> R {
        let mut counts = std::mem::take(&mut self.reuse.counts);
        counts.clear();
        counts.resize(self.size(), len);
        let out = f(self, &counts);
        self.reuse.counts = counts;
        out
    }

    fn check_root(&self, root: usize) -> Result<(), CollError> {
        if root >= self.size() {
            return Err(CollError::BadArgument(format!("root {root} outside 0..{}", self.size())));
        }
        Ok(())
    }

    /// Wait until every rank has called it.
    pub fn barrier(&mut self) -> Result<(), CollError> {
        let (me, n) = (self.rank(), self.size());
        if (3..=BARRIER_FAN_MAX).contains(&n) {
            // Fan in to rank 0, fan out from it.
            if me != 0 {
                self.ch.exchange(&[SendSpec { to: 0, data: &[], place: None }], &mut [], "barrier")?;
                return self.ch.exchange(&[], &mut [RecvSpec { from: 0, into: &mut [] }], "barrier");
            }
            let (sends, mut recvs) = self.reuse.take();
            recvs.extend(others(me, n).map(|from| RecvSpec { from, into: &mut [] }));
            self.run(sends, recvs, "barrier")?;
            let (mut sends, recvs) = self.reuse.take();
            sends.extend(others(me, n).map(|to| SendSpec { to, data: &[], place: None }));
            return self.run(sends, recvs, "barrier");
        }
        let mut k = 1;
        while k < n {
            let sends = [SendSpec { to: (me + k) % n, data: &[], place: None }];
            let mut recvs = [RecvSpec { from: (me + n - k) % n, into: &mut [] }];
            self.ch.exchange(&sends, &mut recvs, "barrier")?;
            k *= 2;
        }
        Ok(())
    }

    /// Copy `buf` of rank `root` into `buf` of every rank (every rank passes the same length).
    pub fn bcast(&mut self, root: usize, buf: &mut [u8]) -> Result<(), CollError> {
        self.check_root(root)?;
        block_ok("bcast", buf.len())?;
        let (me, n) = (self.rank(), self.size());
        if n == 1 {
            return Ok(());
        }
        if buf.len() < BCAST_SCATTER_MIN_BYTES || n < 3 {
            if me == root {
                let (mut sends, recvs) = self.reuse.take();
                sends.extend(others(me, n).map(|to| SendSpec { to, data: &*buf, place: None }));
                return self.run(sends, recvs, "bcast");
            }
            return self.ch.exchange(&[], &mut [RecvSpec { from: root, into: buf }], "bcast");
        }
        // Scatter, then allgather (see the module documentation).
        let len = buf.len();
        let bounds: Vec<usize> = (0..=n).map(|i| seg_start(len, n, i)).collect();
        let seg = |i: usize| bounds[i]..bounds[i + 1];
        if me == root {
            // Each rank gets its own segment, then the root's.
            let mut sends = Vec::with_capacity(2 * n);
            for to in others(me, n) {
                sends.push(SendSpec { to, data: &buf[seg(to)], place: None });
                sends.push(SendSpec { to, data: &buf[seg(root)], place: None });
            }
            return self.ch.exchange(&sends, &mut [], "bcast");
        }
        {
            // This rank's segment and the root's, in the order the root sends them.
            let (lo, hi) = (me.min(root), me.max(root));
            let (a, b) = buf.split_at_mut(bounds[hi]);
            let (low, high) = (&mut a[seg(lo)], &mut b[..bounds[hi + 1] - bounds[hi]]);
            let (mine, roots) = if me < root { (low, high) } else { (high, low) };
            let mut recvs = [RecvSpec { from: root, into: mine }, RecvSpec { from: root, into: roots }];
            self.ch.exchange(&[], &mut recvs, "bcast")?;
        }
        let (mut sends, mut recvs) = self.reuse.take();
        let mine = recvs_into(&mut recvs, buf, &bounds, me, Some(root));
        sends.extend(others(me, n).filter(|&to| to != root).map(|to| SendSpec { to, data: &*mine, place: None }));
        self.run(sends, recvs, "bcast")
    }

    /// Rank `root` sends block `i` of `send` (`N · recv.len()` bytes; ignored elsewhere) to
    /// rank `i`, which receives it in `recv`.
    pub fn scatter(&mut self, root: usize, send: &[u8], recv: &mut [u8]) -> Result<(), CollError> {
        self.with_equal_counts(recv.len(), |g, counts| g.scatterv(root, send, counts, recv))
    }

    /// Rank `root` sends `counts[i]` bytes to rank `i`, taken from `send` packed by rank
    /// (`counts` and `send` matter at the root only); every rank receives `recv.len()` bytes,
    /// which must equal its count at the root.
    pub fn scatterv(&mut self, root: usize, send: &[u8], counts: &[usize], recv: &mut [u8]) -> Result<(), CollError> {
        self.check_root(root)?;
        block_ok("scatterv", recv.len())?;
        let (me, n) = (self.rank(), self.size());
        if me != root {
            return self.ch.exchange(&[], &mut [RecvSpec { from: root, into: recv }], "scatterv");
        }
        let mut offs = std::mem::take(&mut self.reuse.offs);
        self.packed("scatterv", counts, send.len(), &mut offs)?;
        if counts[me] != recv.len() {
            return Err(CollError::BadArgument(format!("root's count {} but receives {}", counts[me], recv.len())));
        }
        let own = &send[offs[me]..offs[me + 1]];
        // A large own block goes last when every rank has a core: the others' blocks go
        // first, so their receivers copy them out while the root copies its own (see
        // `SCATTER_OWN_LAST_MIN_BYTES`).
        let own_last = !self.ch.oversubscribed && own.len() >= SCATTER_OWN_LAST_MIN_BYTES;
        if !own_last {
            copy_bytes(recv, own);
        }
        let (mut sends, recvs) = self.reuse.take();
        sends.extend(others(me, n).map(|to| SendSpec { to, data: &send[offs[to]..offs[to + 1]], place: None }));
        self.reuse.offs = offs;
        self.run(sends, recvs, "scatterv")?;
        if own_last {
            copy_bytes(recv, own);
        }
        Ok(())
    }

    /// Every rank sends `send` to rank `root`, which receives them in `recv` by rank
    /// (`N · send.len()` bytes; ignored elsewhere).
    pub fn gather(&mut self, root: usize, send: &[u8], recv: &mut [u8]) -> Result<(), CollError> {
        self.with_equal_counts(send.len(), |g, counts| g.gatherv(root, send, counts, recv))
    }

    /// Every rank sends `send` to rank `root`, which receives `counts[i]` bytes from rank `i`
    /// packed by rank in `recv` (`counts` and `recv` matter at the root only).
    pub fn gatherv(&mut self, root: usize, send: &[u8], counts: &[usize], recv: &mut [u8]) -> Result<(), CollError> {
        self.check_root(root)?;
        block_ok("gatherv", send.len())?;
        let me = self.rank();
        if me != root {
            return self.ch.exchange(&[SendSpec { to: root, data: send, place: None }], &mut [], "gatherv");
        }
        let mut offs = std::mem::take(&mut self.reuse.offs);
        self.packed("gatherv", counts, recv.len(), &mut offs)?;
        if counts[me] != send.len() {
            return Err(CollError::BadArgument(format!("root's count {} but sends {}", counts[me], send.len())));
        }
        let (sends, mut recvs) = self.reuse.take();
        copy_bytes(recvs_into(&mut recvs, recv, &offs, me, None), send);
        self.reuse.offs = offs;
        self.run(sends, recvs, "gatherv")
    }

    /// Every rank's `send` to every rank's `recv`, by rank (`N · send.len()` bytes).
    pub fn allgather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<(), CollError> {
        self.with_equal_counts(send.len(), |g, counts| g.allgatherv(send, counts, recv))
    }

    /// Every rank's `send` (`counts[i]` bytes from rank `i`; every rank passes the same
    /// counts) to every rank's `recv`, packed by rank.
    pub fn allgatherv(&mut self, send: &[u8], counts: &[usize], recv: &mut [u8]) -> Result<(), CollError> {
        block_ok("allgatherv", send.len())?;
        let (me, n) = (self.rank(), self.size());
        let mut offs = std::mem::take(&mut self.reuse.offs);
        self.packed("allgatherv", counts, recv.len(), &mut offs)?;
        if counts[me] != send.len() {
            return Err(CollError::BadArgument(format!(
                "count {} for this rank but it sends {}",
                counts[me],
                send.len()
            )));
        }
        let (mut sends, mut recvs) = self.reuse.take();
        copy_bytes(recvs_into(&mut recvs, recv, &offs, me, None), send);
        sends.extend(others(me, n).map(|to| SendSpec { to, data: send, place: None }));
        self.reuse.offs = offs;
        self.run(sends, recvs, "allgatherv")
    }

    /// Block `i` of every rank's `send` to rank `i`, which receives them by sender in `recv`
    /// (both `N · block` bytes).
    pub fn alltoall(&mut self, send: &[u8], recv: &mut [u8]) -> Result<(), CollError> {
        let n = self.size();
        if !send.len().is_multiple_of(n) || send.len() != recv.len() {
            return Err(CollError::BadArgument(format!(
                "alltoall of {} bytes into {}: both must be {n} equal blocks",
                send.len(),
                recv.len()
            )));
        }
        self.with_equal_counts(send.len() / n, |g, counts| g.alltoallv(send, counts, recv, counts))
    }

    /// Rank `i` sends `send_counts[j]` bytes (packed by rank in `send`) to rank `j`, and
    /// receives `recv_counts[j]` bytes from rank `j` (packed by rank in `recv`); a count must
    /// equal its sender's.
    pub fn alltoallv(
        &mut self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
    ) -> Result<(), CollError> {
        let (me, n) = (self.rank(), self.size());
        let (mut soffs, mut roffs) = (std::mem::take(&mut self.reuse.offs), std::mem::take(&mut self.reuse.offs_recv));
        self.packed("alltoallv send", send_counts, send.len(), &mut soffs)?;
        self.packed("alltoallv recv", recv_counts, recv.len(), &mut roffs)?;
        if send_counts[me] != recv_counts[me] {
            return Err(CollError::BadArgument(format!(
                "this rank sends itself {} bytes but receives {}",
                send_counts[me], recv_counts[me]
            )));
        }
        let (mut sends, mut recvs) = self.reuse.take();
        copy_bytes(recvs_into(&mut recvs, recv, &roffs, me, None), &send[soffs[me]..soffs[me + 1]]);
        sends.extend(others(me, n).map(|to| SendSpec { to, data: &send[soffs[to]..soffs[to + 1]], place: None }));
        (self.reuse.offs, self.reuse.offs_recv) = (soffs, roffs);
        self.run(sends, recvs, "alltoallv")
    }

    /// Offsets of `counts` packed (into `offs`), checked against the group size, the limits
    /// and `total`.
    pub(crate) fn packed(
        &self,
        what: &str,
        counts: &[usize],
        total: usize,
        offs: &mut Vec<usize>,
    ) -> Result<(), CollError> {
        if counts.len() != self.size() {
            return Err(CollError::BadArgument(format!("{what}: {} counts for {} ranks", counts.len(), self.size())));
        }
        offs.clear();
        let mut at = 0usize;
        offs.push(0);
        for &c in counts {
            block_ok(what, c)?;
            at = at.checked_add(c).ok_or_else(|| CollError::Limit(format!("{what}: counts overflow")))?;
            offs.push(at);
        }
        if at != total {
            return Err(CollError::BadArgument(format!("{what}: counts add up to {at} bytes, the buffer has {total}")));
        }
        Ok(())
    }

    /// Fold every rank's `data` elementwise with `op`; the result lands in `data` of rank
    /// `root`. Elsewhere `data` serves as scratch: what it holds afterwards is unspecified.
    pub fn reduce<T: Element>(&mut self, root: usize, data: &mut [T], op: ReduceOp) -> Result<(), CollError> {
        self.check_root(root)?;
        self.reduction(Some(root), data, op)
    }

    /// Fold every rank's `data` elementwise with `op`; every rank gets the result in `data`.
    pub fn allreduce<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<(), CollError> {
        self.reduction(None, data, op)
    }

    fn reduction<T: Element>(&mut self, root: Option<usize>, data: &mut [T], op: ReduceOp) -> Result<(), CollError> {
        let (_, n) = (self.rank(), self.size());
        let bytes = std::mem::size_of_val(data);
        block_ok("reduction", bytes)?;
        if n == 1 {
            return Ok(());
        }
        let segmented_from = if n == 2 { REDUCE_SEGMENTED_PAIR_MIN_BYTES } else { REDUCE_SEGMENTED_MIN_BYTES };
        if bytes < segmented_from {
            self.reduce_whole(root, data, op)
        } else {
            self.reduce_segmented(root, data, op)
        }
    }

    /// Whole vectors to the root (or to everyone), folded there in rank order.
    fn reduce_whole<T: Element>(&mut self, root: Option<usize>, data: &mut [T], op: ReduceOp) -> Result<(), CollError> {
        let (me, n) = (self.rank(), self.size());
        let len = std::mem::size_of_val(data);
        let mine: &[u8] = bytemuck::cast_slice(data);
        let receives = root.is_none_or(|r| r == me);
        // Every contribution in its rank's place, this rank's too.
        let mut scratch = std::mem::take(&mut self.scratch);
        let need = if receives { n * len } else { 0 };
        let words = need.div_ceil(8);
        if scratch.len() < words {
            scratch.resize(words, 0);
        }
        let all = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut scratch[..words])[..need];
        let mut offs = std::mem::take(&mut self.reuse.offs);
        let (mut sends, mut recvs) = self.reuse.take();
        match root {
            Some(r) if r == me => {}
            Some(r) => sends.push(SendSpec { to: r, data: mine, place: None }),
            None => sends.extend(others(me, n).map(|to| SendSpec { to, data: mine, place: None })),
        }
        if receives {
            equal_offs(&mut offs, n, len);
            copy_bytes(recvs_into(&mut recvs, &mut *all, &offs, me, None), mine);
        }
        self.reuse.offs = offs;
        let outcome = self.run(sends, recvs, if root.is_some() { "reduce" } else { "allreduce" });
        if outcome.is_ok() && receives {
            let all: &[u8] = all;
            copy_bytes(bytemuck::cast_slice_mut(data), &all[..len]);
            for r in 1..n {
                T::fold(op, data, as_elems::<T>(&all[r * len..(r + 1) * len])?);
            }
        }
        self.scratch = scratch;
        outcome
    }

    /// Reduce-scatter (rank i folds segment i of every vector), then gather the segments at
    /// the root or allgather them everywhere.
    fn reduce_segmented<T: Element>(
        &mut self,
        root: Option<usize>,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollError> {
        let (me, n) = (self.rank(), self.size());
        let esz = std::mem::size_of::<T>();
        let bounds: Vec<usize> = (0..=n).map(|i| seg_start(data.len(), n, i) * esz).collect();
        let seg_len = bounds[me + 1] - bounds[me];
        let mut scratch = std::mem::take(&mut self.scratch);
        let words = (n * seg_len).div_ceil(8);
        if scratch.len() < words {
            scratch.resize(words, 0);
        }
        let outcome = (|| {
            let all = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut scratch[..words])[..n * seg_len];
            {
                let bytes: &[u8] = bytemuck::cast_slice(&*data);
                let mut offs = std::mem::take(&mut self.reuse.offs);
                equal_offs(&mut offs, n, seg_len);
                let (mut sends, mut recvs) = self.reuse.take();
                sends.extend(others(me, n).map(|to| SendSpec {
                    to,
                    data: &bytes[bounds[to]..bounds[to + 1]],
                    place: None,
                }));
                copy_bytes(recvs_into(&mut recvs, &mut *all, &offs, me, None), &bytes[bounds[me]..bounds[me + 1]]);
                self.reuse.offs = offs;
                self.run(sends, recvs, "reduce-scatter")?;
            }
            let elems = seg_len / esz;
            let lo = bounds[me] / esz;
            let seg = &mut data[lo..lo + elems];
            copy_bytes(bytemuck::cast_slice_mut(seg), &all[..seg_len]);
            for r in 1..n {
                T::fold(op, seg, as_elems::<T>(&all[r * seg_len..(r + 1) * seg_len])?);
            }
            Ok::<(), CollError>(())
        })();
        self.scratch = scratch;
        outcome?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(data);
        if let Some(r) = root.filter(|&r| r != me) {
            let mine = &bytes[bounds[me]..bounds[me + 1]];
            return self.ch.exchange(&[SendSpec { to: r, data: mine, place: None }], &mut [], "reduce");
        }
        let (mut sends, mut recvs) = self.reuse.take();
        let mine = recvs_into(&mut recvs, bytes, &bounds, me, None);
        if root.is_none() {
            sends.extend(others(me, n).map(|to| SendSpec { to, data: &*mine, place: None }));
        }
        self.run(sends, recvs, if root.is_some() { "reduce" } else { "allreduce" })
    }
}
