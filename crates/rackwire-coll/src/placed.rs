//! Collectives whose destination is registered memory: a [`SymmetricRegion`] of the group.
//!
//! With the destination registered, a large block needs no staging: the receiver tells the
//! sender where in its region the block goes (one small transfer), and the sender writes the
//! block from its own buffer straight into place, then signals. Each byte is copied once, as
//! in UCC's one-sided alltoall and OpenSHMEM's collectives on symmetric memory. The receiver
//! naming the place is also its word that it has entered the call, so a fast sender never
//! overwrites a result the receiver may still be reading from the previous call.
//!
//! Blocks below [`DIRECT_MIN_BYTES`] still go through the window's slots (and are then copied
//! into place): for them the extra transfer would cost more than the copy it saves. Both ends
//! tell which way a block goes from its length alone, which they both know.

use crate::channel::{RecvSpec, SendSpec};
use crate::coll::others;
use crate::{CollError, Group, SymmetricRegion};

/// Blocks of at least this many bytes go straight into the receiver's region. Below it, the
/// transfer that names the place (a small exchange: about 0.3–0.5 µs between two ranks on one
/// machine, several µs when ranks share cores) costs more than the second copy it saves
/// (16 KiB copy in about 0.5–1 µs at the 20–40 GB/s this machine copies at).
pub const DIRECT_MIN_BYTES: usize = 16 * 1024;

/// Bytes of the message that names a place: the offset in the receiver's region.
const PLACE_BYTES: usize = 8;

fn direct(len: usize) -> bool {
    len >= DIRECT_MIN_BYTES
}

/// Receives from every rank but `me`, in the staggered order (`me - 1`, `me - 2`, ...).
fn from_others(me: usize, n: usize) -> impl Iterator<Item = usize> {
    (1..n).map(move |k| (me + n - k) % n)
}

impl Group {
    /// [`Group::alltoallv`] into registered memory: rank `i` sends `send_counts[j]` bytes
    /// (packed by rank in `send`) to rank `j`, and receives `recv_counts[j]` bytes from rank
    /// `j` into its part of `dest`, packed by rank from `dest_offset`. A count must equal its
    /// sender's. Blocks of [`DIRECT_MIN_BYTES`] or more are written by their sender straight
    /// into `dest` (one copy); smaller ones are staged.
    pub fn alltoallv_to(
        &mut self,
        send: &[u8],
        send_counts: &[usize],
        dest: &SymmetricRegion,
        dest_offset: u64,
        recv_counts: &[usize],
    ) -> Result<(), CollError> {
        let (me, n) = (self.rank(), self.size());
        if dest.remotes().len() != n || dest.remote(me) != Some(&dest.region.handle()) {
            return Err(CollError::BadArgument("alltoallv_to: dest is not a symmetric region of this group".into()));
        }
        let recv_total = recv_counts
            .iter()
            .try_fold(0usize, |a, &c| a.checked_add(c))
            .ok_or_else(|| CollError::Limit("alltoallv_to recv: counts overflow".into()))?;
        let (mut soffs, mut roffs) = (std::mem::take(&mut self.reuse.offs), std::mem::take(&mut self.reuse.offs_recv));
        let checked = self
            .packed("alltoallv_to send", send_counts, send.len(), &mut soffs)
            .and_then(|()| self.packed("alltoallv_to recv", recv_counts, recv_total, &mut roffs));
        let outcome = checked.and_then(|()| self.placed_alltoallv(send, &soffs, dest, dest_offset, &roffs));
        (self.reuse.offs, self.reuse.offs_recv) = (soffs, roffs);
        outcome
    }

    fn placed_alltoallv(
        &mut self,
        send: &[u8],
        soffs: &[usize],
        dest: &SymmetricRegion,
        dest_offset: u64,
        roffs: &[usize],
    ) -> Result<(), CollError> {
        let (me, n) = (self.rank(), self.size());
        let scount = |r: usize| soffs[r + 1] - soffs[r];
        let rcount = |r: usize| roffs[r + 1] - roffs[r];
        let recv_total = roffs[n] as u64;
        if dest_offset.checked_add(recv_total).is_none_or(|end| end > dest.region.len()) {
            return Err(CollError::BadArgument(format!(
                "alltoallv_to: {recv_total} bytes from offset {dest_offset} do not fit a region of {}",
                dest.region.len()
            )));
        }
        if scount(me) != rcount(me) {
            return Err(CollError::BadArgument(format!(
                "this rank sends itself {} bytes but receives {}",
                scount(me),
                rcount(me)
            )));
        }
        dest.region.write_at(dest_offset + roffs[me] as u64, &send[soffs[me]..soffs[me + 1]])?;

        // Step 1: every receiver names the place of each large block it expects; small blocks
        // travel through the slots in the same step, into a staging buffer.
        let mut names = std::mem::take(&mut self.reuse.place_out);
        names.clear();
        names.resize(n * PLACE_BYTES, 0);
        for r in 0..n {
            let at = dest_offset + roffs[r] as u64;
            names[r * PLACE_BYTES..(r + 1) * PLACE_BYTES].copy_from_slice(&at.to_le_bytes());
        }
        let mut named = std::mem::take(&mut self.reuse.place_in);
        named.clear();
        named.resize(n * PLACE_BYTES, 0);
        let mut stage = std::mem::take(&mut self.reuse.stage);
        let staged: usize = from_others(me, n).map(rcount).filter(|&c| !direct(c)).sum();
        stage.clear();
        stage.resize(staged, 0);
        let step1 = {
            let (mut sends, mut recvs) = self.reuse.take();
            // To one rank: the place of its block to us (if large), then our block (if small);
            // it expects them in that order, knowing both lengths.
            for to in others(me, n) {
                if direct(rcount(to)) {
                    sends.push(SendSpec { to, data: &names[to * PLACE_BYTES..(to + 1) * PLACE_BYTES], place: None });
                }
                if !direct(scount(to)) {
                    sends.push(SendSpec { to, data: &send[soffs[to]..soffs[to + 1]], place: None });
                }
            }
            // From one rank, in the same order; the buffers are cut in rank order, then the
            // receives put in staggered order (a stable sort keeps each rank's two in order).
            let mut stage_rest = &mut stage[..];
            for (from, name) in named.chunks_mut(PLACE_BYTES).enumerate() {
                if from == me {
                    continue;
                }
                if direct(scount(from)) {
                    recvs.push(RecvSpec { from, into: name });
                }
                if !direct(rcount(from)) {
                    let (part, rest) = std::mem::take(&mut stage_rest).split_at_mut(rcount(from));
                    stage_rest = rest;
                    recvs.push(RecvSpec { from, into: part });
                }
            }
            recvs.sort_by_key(|r| (me + n - r.from) % n);
            self.run(sends, recvs, "alltoallv_to")
        };
        // Step 2: the large blocks, each straight into the place its receiver named; a
        // receiver waits for their signals only.
        let step2 = step1.and_then(|()| {
            // The staged blocks into place, in rank order as `stage` was cut.
            let mut at = 0;
            for (from, w) in roffs.windows(2).enumerate() {
                let c = w[1] - w[0];
                if from != me && !direct(c) {
                    dest.region.write_at(dest_offset + w[0] as u64, &stage[at..at + c])?;
                    at += c;
                }
            }
            let (mut sends, mut recvs) = self.reuse.take();
            for to in others(me, n).filter(|&to| direct(scount(to))) {
                let target = dest.remote(to).expect("one part per rank, checked");
                let at =
                    u64::from_le_bytes(named[to * PLACE_BYTES..(to + 1) * PLACE_BYTES].try_into().expect("8 bytes"));
                let len = scount(to) as u64;
                if at.checked_add(len).is_none_or(|end| end > target.len()) {
                    self.reuse.keep(sends, recvs);
                    return Err(CollError::BadArgument(format!(
                        "alltoallv_to: rank {to} named offset {at} for {len} bytes in a region of {}",
                        target.len()
                    )));
                }
                sends.push(SendSpec { to, data: &send[soffs[to]..soffs[to + 1]], place: Some((target, at)) });
            }
            recvs.extend(
                from_others(me, n).filter(|&from| direct(rcount(from))).map(|from| RecvSpec { from, into: &mut [] }),
            );
            if sends.is_empty() && recvs.is_empty() {
                self.reuse.keep(sends, recvs);
                return Ok(());
            }
            self.run(sends, recvs, "alltoallv_to")
        });
        (self.reuse.place_out, self.reuse.place_in, self.reuse.stage) = (names, named, stage);
        step2
    }
}
