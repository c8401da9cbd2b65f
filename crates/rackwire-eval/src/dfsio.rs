//! Replicated block writes, as HDFS writes a file and TestDFSIO measures it (the OSU paper's
//! Fig. 6): every rank writes a file as blocks; each block goes down a pipeline of
//! [`REPLICAS`] other ranks (the writer sends its packets to the first, each forwards them to
//! the next and stores them in a block file), and every packet's acknowledgement comes back
//! up the pipeline, as HDFS's datanodes send them, once the ranks below have it. A writer
//! keeps at most [`PACKETS_IN_FLIGHT`] packets unacknowledged and starts a block's pipeline
//! once the block before is fully acknowledged.
//!
//! The figures are TestDFSIO's own: throughput (total MB over the sum of the writers' task
//! times), the average IO rate (the mean over writers of each one's MB over its time) and that
//! rate's standard deviation. The block files go to a RAM file system unless the job is told
//! to write to disk and `fsync` each finished block.
//!
//! Checked after the timed run: every replica of every block byte-identical to what its
//! writer wrote, and every block at exactly [`REPLICAS`] ranks.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rackwire_coll::Group;

use crate::job::{Phases, RunResult};
use crate::records::mix;
use crate::streams::Streams;
use crate::EvalError;

/// Replicas of every block (HDFS's default), or fewer when there are not that many other ranks.
pub const REPLICAS: usize = 3;
/// Bytes of one packet (HDFS's `dfs.client-write-packet-size`).
pub const PACKET_BYTES: usize = 64 * 1024;
/// Packets a writer leaves unacknowledged at most (HDFS's
/// `dfs.client.write.max-packets-in-flight`).
pub const PACKETS_IN_FLIGHT: usize = 80;
/// Bytes of a block at most (HDFS's default is 128 MiB; runs here are smaller).
pub const BLOCK_BYTES_MAX: u64 = 256 << 20;
/// Bytes one writer writes at most.
pub const FILE_BYTES_MAX: u64 = 4 << 30;
/// Bytes of a packet's header.
const HEADER: usize = 24;
/// The `to` field of an acknowledgement on its way to the writer.
const TO_WRITER: u8 = u8::MAX;

const DATA: u8 = 1;
const ACK: u8 = 2;

/// One replicated-write run.
#[derive(Clone, Debug)]
pub struct DfsioJob {
    /// Bytes each rank writes.
    pub file_bytes: u64,
    /// Bytes of a block.
    pub block_bytes: u64,
    /// Seed of the written bytes.
    pub seed: u64,
    /// Where the block files go.
    pub dir: PathBuf,
    /// `fsync` each finished block file.
    pub fsync: bool,
}

/// A packet's header: what it is, whose block, which packet, and the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    kind: u8,
    /// Data: the hop of its receiver (0 for the first replica). Ack: the hop it goes to, or
    /// [`TO_WRITER`].
    hop: u8,
    last: bool,
    writer: u16,
    block: u32,
    seq: u32,
    pipe: [u16; REPLICAS],
    replicas: u8,
}

impl Header {
    fn write(&self, out: &mut [u8]) {
        out[0] = self.kind;
        out[1] = self.hop;
        out[2] = u8::from(self.last);
        out[3] = self.replicas;
        out[4..6].copy_from_slice(&self.writer.to_le_bytes());
        out[8..12].copy_from_slice(&self.block.to_le_bytes());
        out[12..16].copy_from_slice(&self.seq.to_le_bytes());
        for (i, p) in self.pipe.iter().enumerate() {
            out[16 + 2 * i..18 + 2 * i].copy_from_slice(&p.to_le_bytes());
        }
    }

    fn read(b: &[u8], n: usize) -> Result<Header, EvalError> {
        let bad = |why: &str| EvalError::WrongOutput(format!("dfsio: a bad packet ({why})"));
        if b.len() < HEADER {
            return Err(bad("short"));
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let h = Header {
            kind: b[0],
            hop: b[1],
            last: b[2] != 0,
            replicas: b[3],
            writer: u16_at(4),
            block: u32_at(8),
            seq: u32_at(12),
            pipe: [u16_at(16), u16_at(18), u16_at(20)],
        };
        let r = h.replicas as usize;
        if !(1..=REPLICAS).contains(&r) || h.pipe[..r].iter().any(|&p| p as usize >= n) || h.writer as usize >= n {
            return Err(bad("ranks"));
        }
        let hop_ok = match h.kind {
            DATA => (h.hop as usize) < r,
            ACK => (h.hop as usize) < r || h.hop == TO_WRITER,
            _ => false,
        };
        if !hop_ok {
            return Err(bad("kind or hop"));
        }
        Ok(h)
    }
}

/// The ranks that hold block `block` of writer `w`, in pipeline order: other ranks, turning
/// with the block so the replicas spread over the job.
pub fn pipeline(w: usize, block: u64, n: usize) -> Vec<usize> {
    let r = REPLICAS.min(n - 1);
    (0..r).map(|k| (w + 1 + ((block as usize + k) % (n - 1))) % n).collect()
}

/// The bytes of writer `w`'s file, from offset `at`, into `out`.
pub fn fill(seed: u64, w: usize, at: u64, out: &mut [u8]) {
    let base = mix(seed ^ ((w as u64) << 48));
    for (i, c) in out.chunks_mut(8).enumerate() {
        let v = mix(base ^ (at / 8 + i as u64)).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

fn block_path(dir: &Path, job: &str, w: usize, b: u64, me: usize) -> PathBuf {
    dir.join(format!("{job}-blk-{w}-{b}-at-{me}"))
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> EvalError {
    EvalError::Io(format!("{what} {}: {e}", path.display()))
}

/// A block this rank holds a replica of, while it arrives.
struct Hosted {
    file: Option<File>,
    path: PathBuf,
    packets: u32,
}

impl DfsioJob {
    fn blocks(&self) -> u64 {
        self.file_bytes.div_ceil(self.block_bytes)
    }

    fn block_len(&self, b: u64) -> u64 {
        self.block_bytes.min(self.file_bytes - b * self.block_bytes)
    }

    fn packets(&self, b: u64) -> u32 {
        self.block_len(b).div_ceil(PACKET_BYTES as u64).max(1) as u32
    }

    /// Run the writes at this rank over `streams`.
    pub fn run(&self, g: &mut Group, streams: &mut dyn Streams) -> Result<RunResult, EvalError> {
        let (me, n) = (g.rank(), g.size());
        if n < 2 {
            return Err(EvalError::BadArgument("dfsio needs at least 2 ranks (replicas go to other ranks)".into()));
        }
        if n > u16::MAX as usize {
            return Err(EvalError::BadArgument("dfsio: too many ranks".into()));
        }
        if !self.block_bytes.is_multiple_of(8)
            || self.block_bytes == 0
            || self.block_bytes > BLOCK_BYTES_MAX
            || self.file_bytes == 0
            || self.file_bytes > FILE_BYTES_MAX
        {
            return Err(EvalError::BadArgument(format!(
                "dfsio: block 8..={BLOCK_BYTES_MAX} bytes (a multiple of 8), file 1..={FILE_BYTES_MAX} bytes"
            )));
        }
        // Not timed: the file this rank writes, as a TestDFSIO task fills its buffer.
        let mut file = vec![0u8; self.file_bytes as usize];
        fill(self.seed, me, 0, &mut file);
        let expected_hosted: usize = (0..n)
            .filter(|&w| w != me)
            .map(|w| (0..self.blocks()).filter(|&b| pipeline(w, b, n).contains(&me)).count())
            .sum();

        let mut clock = Phases::start(g)?;
        let start = Instant::now();
        let mut task_secs = 0.0;
        let mut hosted: HashMap<(u16, u32), Hosted> = HashMap::new();
        let mut hosted_done = 0usize;
        let mut outbox: VecDeque<(usize, Vec<u8>)> = VecDeque::new();
        let (mut block, mut seq, mut acked) = (0u64, 0u32, 0u32);
        let mut msg = Vec::with_capacity(HEADER + PACKET_BYTES);
        let mut got = Vec::new();
        let blocks = self.blocks();
        loop {
            let mut moved = false;
            // What waits to go on (forwards, acknowledgements), in order.
            while let Some((to, m)) = outbox.front() {
                if !streams.try_send(*to, m)? {
                    break;
                }
                outbox.pop_front();
                moved = true;
            }
            // This rank's own packets, as the window allows.
            while block < blocks
                && seq < self.packets(block)
                && (seq - acked) < PACKETS_IN_FLIGHT as u32
                && outbox.is_empty()
            {
                let pipe = pipeline(me, block, n);
                let at = (block * self.block_bytes) as usize + seq as usize * PACKET_BYTES;
                let end = ((block * self.block_bytes + self.block_len(block)) as usize).min(at + PACKET_BYTES);
                let h = Header {
                    kind: DATA,
                    hop: 0,
                    last: seq + 1 == self.packets(block),
                    writer: me as u16,
                    block: block as u32,
                    seq,
                    pipe: pipe_array(&pipe),
                    replicas: pipe.len() as u8,
                };
                msg.clear();
                msg.resize(HEADER, 0);
                h.write(&mut msg);
                msg.extend_from_slice(&file[at..end]);
                if !streams.try_send(pipe[0], &msg)? {
                    break;
                }
                seq += 1;
                moved = true;
            }
            // What arrived.
            while outbox.len() < PACKETS_IN_FLIGHT {
                let Some(from) = streams.try_recv(&mut got)? else { break };
                moved = true;
                let h = Header::read(&got, n)?;
                let pipe = &h.pipe[..h.replicas as usize];
                match h.kind {
                    DATA => {
                        let hop = h.hop as usize;
                        if pipe[hop] != me as u16
                            || from != if hop == 0 { h.writer as usize } else { pipe[hop - 1] as usize }
                        {
                            return Err(EvalError::WrongOutput(format!(
                                "dfsio: a packet from rank {from} not meant for this rank"
                            )));
                        }
                        let key = (h.writer, h.block);
                        let entry = match hosted.entry(key) {
                            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                            std::collections::hash_map::Entry::Vacant(v) => {
                                let path = block_path(&self.dir, g.job(), h.writer as usize, u64::from(h.block), me);
                                let f = File::create(&path).map_err(|e| io_err("creating", &path, e))?;
                                v.insert(Hosted { file: Some(f), path, packets: 0 })
                            }
                        };
                        // Forward first (the next replica works meanwhile), then store.
                        if hop + 1 < pipe.len() {
                            got[1] = (hop + 1) as u8;
                            outbox.push_back((pipe[hop + 1] as usize, got.clone()));
                        }
                        let f = entry
                            .file
                            .as_mut()
                            .ok_or_else(|| EvalError::WrongOutput("dfsio: a packet after the last".into()))?;
                        f.write_all(&got[HEADER..]).map_err(|e| io_err("writing", &entry.path, e))?;
                        entry.packets += 1;
                        if h.last {
                            let f = entry.file.take().expect("open until the last packet");
                            if self.fsync {
                                f.sync_data().map_err(|e| io_err("syncing", &entry.path, e))?;
                            }
                        }
                        // The last replica acknowledges at once; the others when the one below did.
                        if hop + 1 == pipe.len() {
                            let up = ack(&h, hop, pipe);
                            outbox.push_back(up);
                            if h.last {
                                hosted_done += 1;
                            }
                        }
                    }
                    _ if h.hop == TO_WRITER => {
                        if h.writer != me as u16 || u64::from(h.block) != block {
                            return Err(EvalError::WrongOutput("dfsio: an acknowledgement for another block".into()));
                        }
                        acked += 1;
                        if acked == self.packets(block) {
                            block += 1;
                            (seq, acked) = (0, 0);
                            if block == blocks {
                                task_secs = start.elapsed().as_secs_f64();
                            }
                        }
                    }
                    _ => {
                        let hop = h.hop as usize;
                        if !hosted.contains_key(&(h.writer, h.block)) {
                            return Err(EvalError::WrongOutput(
                                "dfsio: an acknowledgement for a block not here".into(),
                            ));
                        }
                        outbox.push_back(ack(&h, hop, pipe));
                        if h.last {
                            hosted_done += 1;
                        }
                    }
                }
            }
            if block == blocks && hosted_done == expected_hosted && outbox.is_empty() {
                break;
            }
            if !moved {
                streams.idle()?;
            }
        }
        streams.flush()?;
        clock.end(g, "write")?;
        let mut result = clock.finish(g)?;

        // The writers' task times, and TestDFSIO's figures from them.
        let mb = self.file_bytes as f64 / 1e6;
        let mut times = vec![0f64; n];
        g.allgather(bytemuck::bytes_of(&task_secs), bytemuck::cast_slice_mut(&mut times))?;
        let rates: Vec<f64> = times.iter().map(|t| mb / t.max(1e-9)).collect();
        let avg_rate = rates.iter().sum::<f64>() / n as f64;
        let std = (rates.iter().map(|r| (r - avg_rate).powi(2)).sum::<f64>() / n as f64).sqrt();
        result.extra.insert("throughput_mb_per_s".into(), mb * n as f64 / times.iter().sum::<f64>().max(1e-9));
        result.extra.insert("io_rate_avg_mb_per_s".into(), avg_rate);
        result.extra.insert("io_rate_std_mb_per_s".into(), std);

        // Not timed: every replica this rank holds is its writer's bytes exactly.
        let mut bad = [0u64];
        if hosted.len() != expected_hosted {
            bad[0] += 1;
        }
        let mut want = Vec::new();
        for ((w, b), hb) in &hosted {
            let (w, b) = (*w as usize, u64::from(*b));
            let data = std::fs::read(&hb.path).map_err(|e| io_err("reading", &hb.path, e))?;
            want.resize(self.block_len(b) as usize, 0);
            fill(self.seed, w, b * self.block_bytes, &mut want);
            if data != want || hb.packets != self.packets(b) || hb.file.is_some() {
                tracing::error!(writer = w, block = b, "a replica differs from what its writer wrote");
                bad[0] += 1;
            }
            let _ = std::fs::remove_file(&hb.path);
        }
        g.allreduce(&mut bad, rackwire_coll::ReduceOp::Sum)?;
        if bad[0] != 0 {
            return Err(EvalError::WrongOutput(format!("dfsio: {} replica(s) missing or different", bad[0])));
        }
        let total = self.file_bytes * n as u64;
        Ok(result.checked(streams.transport(), total, total))
    }
}

fn pipe_array(p: &[usize]) -> [u16; REPLICAS] {
    let mut a = [0u16; REPLICAS];
    for (x, &r) in a.iter_mut().zip(p) {
        *x = r as u16;
    }
    a
}

/// The acknowledgement of packet `h` that the replica at `hop` sends up: to the replica
/// above, or to the writer.
fn ack(h: &Header, hop: usize, pipe: &[u16]) -> (usize, Vec<u8>) {
    let (to, to_hop) =
        if hop == 0 { (h.writer as usize, TO_WRITER) } else { (pipe[hop - 1] as usize, (hop - 1) as u8) };
    let a = Header { kind: ACK, hop: to_hop, ..*h };
    let mut m = vec![0u8; HEADER];
    a.write(&mut m);
    (to, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the placement: every block at min(3, n - 1) distinct ranks, never its writer,
    // and the replicas spread (each rank holds some when there are more ranks than replicas).
    #[test]
    fn pipelines_are_distinct_other_ranks() {
        for n in 2..=9 {
            let mut held = vec![0usize; n];
            for w in 0..n {
                for b in 0..12 {
                    let p = pipeline(w, b, n);
                    assert_eq!(p.len(), REPLICAS.min(n - 1));
                    assert!(!p.contains(&w));
                    let mut s = p.clone();
                    s.sort_unstable();
                    s.dedup();
                    assert_eq!(s.len(), p.len(), "n {n} w {w} b {b}: {p:?}");
                    for r in p {
                        held[r] += 1;
                    }
                }
            }
            assert!(held.iter().all(|&h| h > 0), "n {n}: {held:?}");
        }
    }

    // Checks the header: written and read back equal; a header naming a rank past the job
    // or a hop past its pipeline is refused.
    #[test]
    fn headers_round_trip_and_bad_ones_are_refused() {
        let h = Header { kind: DATA, hop: 1, last: true, writer: 2, block: 7, seq: 99, pipe: [3, 0, 1], replicas: 3 };
        let mut b = [0u8; HEADER];
        h.write(&mut b);
        assert_eq!(Header::read(&b, 4).unwrap(), h);
        assert!(Header::read(&b, 3).is_err(), "rank 3 in a job of 3");
        let mut far = b;
        far[1] = 5;
        assert!(Header::read(&far, 4).is_err());
        assert!(Header::read(&b[..10], 4).is_err());
    }

    // Checks that a writer's bytes are the same however they are cut.
    #[test]
    fn fill_is_position_independent() {
        let mut whole = vec![0u8; 4096];
        fill(5, 1, 0, &mut whole);
        let mut part = vec![0u8; 1024];
        fill(5, 1, 2048, &mut part);
        assert_eq!(&whole[2048..3072], &part[..]);
    }
}
