//! The distributed sort (HP's cluster JouleSort): every rank reads its share of the input,
//! partitions it by key range, the ranks shuffle all-to-all, each sorts what it received and
//! writes it. Rank `r`'s output holds the `r`-th key range, so the outputs in rank order are
//! one sorted run, which is then validated as `valsort` validates one.

use std::path::{Path, PathBuf};

use rackwire_coll::Group;

use crate::job::{Phases, RunResult};
use crate::net::DataPath;
use crate::records::{self, Summary, RECORDS_PER_RANK_MAX, RECORD_BYTES, SUMMARY_BYTES};
use crate::EvalError;

/// One sort run.
#[derive(Clone, Debug)]
pub struct SortJob {
    /// Records in the whole data set.
    pub records: u64,
    /// The data set's seed.
    pub seed: u64,
    /// Where the input and output files go (a RAM file system by default).
    pub dir: PathBuf,
}

/// The phases, in order (HP's Fig. 2 splits the time into the shuffle and the local sort;
/// reading and writing the files are timed apart, as are the partitioning's two passes).
pub const SORT_PHASES: [&str; 5] = ["read", "partition", "shuffle", "sort", "write"];

/// Headroom of the receive buffers registered ahead: 1/8 more than an even share.
const RECV_HEADROOM_DIV: u64 = 8;

fn input_path(dir: &Path, job: &str, rank: usize) -> PathBuf {
    dir.join(format!("{job}-sort-in-{rank}"))
}

fn output_path(dir: &Path, job: &str, rank: usize) -> PathBuf {
    dir.join(format!("{job}-sort-out-{rank}"))
}

/// The rank (of `n`) whose key range holds `key`: the 80-bit key space cut in `n` equal
/// ranges.
pub fn range_of(key: u128, n: usize) -> usize {
    ((key * n as u128) >> 80) as usize
}

/// Records packed by destination rank (one counting pass, one placing pass), with the bytes
/// for each rank.
pub fn partition(data: &[u8], n: usize) -> (Vec<u8>, Vec<usize>) {
    let mut counts = vec![0usize; n];
    for rec in data.chunks_exact(RECORD_BYTES) {
        counts[range_of(records::key_number(rec), n)] += RECORD_BYTES;
    }
    let mut next = Vec::with_capacity(n);
    let mut at = 0;
    for c in &counts {
        next.push(at);
        at += c;
    }
    let mut out = vec![0u8; data.len()];
    for rec in data.chunks_exact(RECORD_BYTES) {
        let d = range_of(records::key_number(rec), n);
        out[next[d]..next[d] + RECORD_BYTES].copy_from_slice(rec);
        next[d] += RECORD_BYTES;
    }
    (out, counts)
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> EvalError {
    EvalError::Io(format!("{what} {}: {e}", path.display()))
}

impl SortJob {
    /// Run the sort at this rank over `path`; every rank gets the result (at rank 0 checked
    /// against the input).
    pub fn run(&self, g: &mut Group, path: &mut dyn DataPath) -> Result<RunResult, EvalError> {
        let (me, n) = (g.rank(), g.size());
        let (first, count) = records::share(self.records, n, me);
        if count > RECORDS_PER_RANK_MAX {
            return Err(EvalError::BadArgument(format!(
                "{count} records per rank: at most {RECORDS_PER_RANK_MAX} (use more ranks or a smaller scale)"
            )));
        }
        // Not timed: the input, as gensort would have written it, and its count and checksum.
        let input = records::generate(self.seed, first, count);
        let (_, in_sum) = Summary::unordered_of(&input)?;
        let inp = input_path(&self.dir, g.job(), me);
        std::fs::write(&inp, &input).map_err(|e| io_err("writing", &inp, e))?;
        drop(input);
        let mut sums = vec![0u8; 16 * n];
        g.allgather(&in_sum.to_le_bytes(), &mut sums)?;
        let in_sum_all =
            sums.chunks_exact(16).fold(0u128, |a, c| a.wrapping_add(u128::from_le_bytes(c.try_into().expect("16"))));

        // Receive buffers registered ahead, as a one-sided program sets up its windows once:
        // room for this rank's share of the key range with headroom for uneven keys (a rank
        // that gets more still works, registering more inside the shuffle).
        let expect = self.records.div_ceil(n as u64) * RECORD_BYTES as u64;
        path.prepare(g, expect + expect / RECV_HEADROOM_DIV + RECORD_BYTES as u64 * 1024)?;
        let even = count as usize / n * RECORD_BYTES;
        crate::net::warm_up(path, g, &vec![even; n])?;

        let mut clock = Phases::start(g)?;
        let data = std::fs::read(&inp).map_err(|e| io_err("reading", &inp, e))?;
        clock.end(g, "read")?;
        let (packed, counts) = partition(&data, n);
        drop(data);
        clock.end(g, "partition")?;
        let got = path.exchange(g, &packed, &counts)?;
        drop(packed);
        clock.end(g, "shuffle")?;
        let sorted = records::sort_from(got.len(), |at, out| got.read_at(at, out))?;
        drop(got);
        clock.end(g, "sort")?;
        let outp = output_path(&self.dir, g.job(), me);
        std::fs::write(&outp, &sorted).map_err(|e| io_err("writing", &outp, e))?;
        clock.end(g, "write")?;
        let result = clock.finish(g)?;

        // Not timed: valsort on what was written.
        let written = std::fs::read(&outp).map_err(|e| io_err("reading", &outp, e))?;
        let mine = Summary::of(&written)?;
        drop((written, sorted));
        let _ = std::fs::remove_file(&inp);
        let _ = std::fs::remove_file(&outp);
        let mut all = vec![0u8; SUMMARY_BYTES * n];
        g.allgather(&mine.to_bytes(), &mut all)?;
        let parts: Vec<Summary> =
            all.chunks_exact(SUMMARY_BYTES).map(|c| Summary::from_bytes(c.try_into().expect("summary"))).collect();
        Summary::validate(&parts, self.records, in_sum_all)?;
        Ok(result.checked(path.transport(), self.records * RECORD_BYTES as u64, self.records))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the partitioning: every record lands in the block of the rank whose key range
    // holds it, the ranges are in key order, and no record is lost or doubled.
    #[test]
    fn partition_places_every_record_in_its_range() {
        let data = records::generate(5, 0, 2000);
        for n in [1usize, 2, 3, 7] {
            let (out, counts) = partition(&data, n);
            assert_eq!(counts.iter().sum::<usize>(), data.len());
            let mut at = 0;
            for (r, c) in counts.iter().enumerate() {
                for rec in out[at..at + c].chunks_exact(RECORD_BYTES) {
                    assert_eq!(range_of(records::key_number(rec), n), r);
                }
                at += c;
            }
            assert_eq!(Summary::unordered_of(&out).unwrap(), Summary::unordered_of(&data).unwrap());
        }
        assert_eq!(range_of(0, 4), 0);
        assert_eq!(range_of((1u128 << 80) - 1, 4), 3);
    }
}
