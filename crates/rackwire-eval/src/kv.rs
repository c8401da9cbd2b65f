//! A key-value get/put mix, as YCSB drives a store (the OSU paper's HBase runs, Figs. 7–8):
//! every rank serves one shard of the keys — a hash table in a registered region — and is
//! also a client running one of YCSB's core workloads over all the keys: A (50% reads, 50%
//! updates), B (95/5) or C (reads only), keys drawn from YCSB's scrambled zipfian
//! distribution, values of [`VALUE_BYTES`] bytes (YCSB's ten fields of 100 bytes).
//!
//! Over the **fabric**, a read of another rank's key is a one-sided read of the key's slot
//! in that rank's table: the serving rank's CPU takes no part. Each slot carries a version
//! before and after its value, and each value its own checksum; the owner makes both
//! versions odd while it changes the value, so a read that overlapped a change sees them
//! differ (or odd), or the checksum wrong, and reads again. Updates go to the key's
//! owner as messages over the streams ([`crate::streams`]), which applies them. Over **TCP**,
//! reads and updates are both requests to the owner over its connection.
//!
//! A client keeps one operation outstanding (as a YCSB thread does). Latency goes into an
//! HdrHistogram. In the open-loop mode, operations are due at a fixed rate and each one's
//! latency counts from when it was due, not from when a late client got to send it: the
//! correction for coordinated omission that YCSB's `measurement.interval=intended` makes.
//!
//! Checked: every value read carries its own key and an intact checksum (a torn or misplaced
//! read fails the run), and after the timed run every key is read once more over the data
//! path and must equal what its owner last applied.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rackwire::{Access, Conn, OpFlags, RemoteRegion};
use rackwire_coll::{Group, SymmetricRegion};

use crate::job::{Phases, RunResult};
use crate::records::{mix, record_crc};
use crate::streams::Streams;
use crate::EvalError;

/// Bytes of a value.
pub const VALUE_BYTES: usize = 1024;
/// Keys in the whole store at most.
pub const KEYS_MAX: u64 = 4_000_000;
/// Operations one client runs at most.
pub const OPS_MAX: u64 = 100_000_000;
/// Times a read retries a slot that was changing before it gives up.
pub const READ_RETRIES_MAX: u32 = 10_000;
/// YCSB's zipfian constant.
pub const ZIPF_THETA: f64 = 0.99;
/// How long an operation may take before the run fails.
pub const OP_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of a slot: version, key, value, version, padding to a multiple of 64.
const SLOT_BYTES: u64 = 1088;
const VER_START: u64 = 0;
const KEY_AT: u64 = 8;
const VALUE_AT: u64 = 16;
const VER_END: u64 = VALUE_AT + VALUE_BYTES as u64;
const _: () = assert!(VER_END + 8 <= SLOT_BYTES);

const GET: u8 = 1;
const PUT: u8 = 2;
const GOT: u8 = 3;
const PUT_DONE: u8 = 4;
const FINISHED: u8 = 5;

/// Which YCSB core workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// 50% reads, 50% updates.
    A,
    /// 95% reads, 5% updates.
    B,
    /// Reads only.
    C,
    /// Updates only: the OSU paper's 100% Put mix (no YCSB core workload is one).
    Put,
}

impl Mix {
    /// Its share of reads.
    pub fn reads(self) -> f64 {
        match self {
            Mix::A => 0.5,
            Mix::B => 0.95,
            Mix::C => 1.0,
            Mix::Put => 0.0,
        }
    }

    /// Its name (`A`, `B`, `C`, `put`).
    pub fn name(self) -> &'static str {
        match self {
            Mix::A => "A",
            Mix::B => "B",
            Mix::C => "C",
            Mix::Put => "put",
        }
    }

    /// The workload a name means.
    pub fn parse(s: &str) -> Result<Mix, EvalError> {
        match s.to_ascii_uppercase().as_str() {
            "A" => Ok(Mix::A),
            "B" => Ok(Mix::B),
            "C" => Ok(Mix::C),
            "PUT" => Ok(Mix::Put),
            _ => Err(EvalError::BadArgument(format!("unknown key-value mix {s:?} (A, B, C or put)"))),
        }
    }
}

/// YCSB's zipfian generator (Gray et al., "Quickly generating billion-record synthetic
/// databases"), over `0..n`, then scrambled by a hash as YCSB's `ScrambledZipfianGenerator`
/// does, so the popular keys are spread over the key space (and the shards).
pub struct Zipf {
    n: u64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    /// The generator over `n` keys.
    pub fn new(n: u64) -> Zipf {
        let theta = ZIPF_THETA;
        let zeta = |k: u64| (1..=k).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zetan = zeta(n);
        let zeta2 = zeta(2);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipf { n, alpha, zetan, eta }
    }

    /// The key for a uniform draw `u` in [0, 1).
    pub fn key(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        let rank = if uz < 1.0 {
            0
        } else if uz < 1.0 + 0.5f64.powf(ZIPF_THETA) {
            1
        } else {
            ((self.n as f64) * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
        };
        mix(rank.min(self.n - 1) ^ 0x2545_f491_4f6c_dd1d) % self.n
    }
}

/// A small fast random source (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The value `writer` writes for `key` in its `seq`-th update: the key, the writer and the
/// number, bytes derived from them, and a checksum of all of it.
pub fn value(key: u64, writer: u32, seq: u32, out: &mut [u8]) {
    out[..8].copy_from_slice(&key.to_le_bytes());
    out[8..12].copy_from_slice(&writer.to_le_bytes());
    out[12..16].copy_from_slice(&seq.to_le_bytes());
    let base = mix(key ^ (u64::from(writer) << 32) ^ u64::from(seq));
    for (i, c) in out[16..VALUE_BYTES - 4].chunks_mut(8).enumerate() {
        let v = mix(base ^ i as u64).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
    let crc = record_crc(&out[..VALUE_BYTES - 4]);
    out[VALUE_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
}

/// `v` is an intact value of `key`.
pub fn value_ok(key: u64, v: &[u8]) -> bool {
    v.len() == VALUE_BYTES
        && v[..8] == key.to_le_bytes()
        && record_crc(&v[..VALUE_BYTES - 4]).to_le_bytes() == v[VALUE_BYTES - 4..]
}

/// Where keys live: the owner rank and the table's geometry.
#[derive(Clone, Copy, Debug)]
struct Layout {
    ranks: usize,
    /// Slots per table (a power of two, at least twice the keys a rank holds).
    slots: u64,
}

impl Layout {
    fn new(keys: u64, ranks: usize) -> Layout {
        let per = keys.div_ceil(ranks as u64);
        Layout { ranks, slots: (2 * per).next_power_of_two().max(2) }
    }

    fn owner(&self, key: u64) -> usize {
        (mix(key ^ 0x51_7cc1_b727_220a) % self.ranks as u64) as usize
    }

    fn first_slot(&self, key: u64) -> u64 {
        mix(key ^ 0x1f83_d9ab_fb41_bd6b) & (self.slots - 1)
    }

    fn bytes(&self) -> u64 {
        self.slots * SLOT_BYTES
    }
}

/// This rank's shard: its table, with the owner's writes versioned.
struct Shard {
    table: SymmetricRegion,
    layout: Layout,
    /// Slot of each key held here.
    slot_of: HashMap<u64, u64>,
    /// Each key's version (even: stable).
    version: HashMap<u64, u64>,
}

impl Shard {
    fn insert(&mut self, key: u64, v: &[u8]) -> Result<(), EvalError> {
        let mut s = self.layout.first_slot(key);
        while self.table.region.load_u64(s * SLOT_BYTES + KEY_AT)? != 0 {
            s = (s + 1) & (self.layout.slots - 1);
        }
        let at = s * SLOT_BYTES;
        self.table.region.store_u64(at + KEY_AT, key + 1)?;
        self.table.region.write_at(at + VALUE_AT, v)?;
        self.slot_of.insert(key, s);
        self.version.insert(key, 0);
        Ok(())
    }

    /// Apply an update: both versions odd, the value, both versions even and higher.
    fn put(&mut self, key: u64, v: &[u8]) -> Result<(), EvalError> {
        let s = *self.slot_of.get(&key).ok_or_else(|| EvalError::WrongOutput(format!("kv: key {key} is not here")))?;
        let ver = self.version.get_mut(&key).expect("with its slot");
        let at = s * SLOT_BYTES;
        self.table.region.store_u64(at + VER_END, *ver + 1)?;
        self.table.region.store_u64(at + VER_START, *ver + 1)?;
        self.table.region.write_at(at + VALUE_AT, v)?;
        *ver += 2;
        self.table.region.store_u64(at + VER_START, *ver)?;
        self.table.region.store_u64(at + VER_END, *ver)?;
        Ok(())
    }

    fn get(&self, key: u64, out: &mut [u8]) -> Result<(), EvalError> {
        let s = *self.slot_of.get(&key).ok_or_else(|| EvalError::WrongOutput(format!("kv: key {key} is not here")))?;
        self.table.region.read_at(s * SLOT_BYTES + VALUE_AT, out)?;
        Ok(())
    }
}

/// One YCSB run.
#[derive(Clone, Debug)]
pub struct KvJob {
    /// Keys in the store.
    pub keys: u64,
    /// Operations each client runs.
    pub ops: u64,
    /// The workload.
    pub mix: Mix,
    /// Open loop: operations due at this rate per client (per second); none: closed loop.
    pub rate: Option<f64>,
    /// Seed.
    pub seed: u64,
    /// Reads of other ranks' keys go one-sided (the fabric), or as requests (TCP).
    pub one_sided: bool,
}

/// What a client waits for.
enum Waiting {
    Nothing,
    Reply(u32),
}

struct Server<'a> {
    me: usize,
    n: usize,
    shard: Shard,
    streams: &'a mut dyn Streams,
    /// Ranks that said they are through each stage (the client's run, the read-back): a
    /// rank ahead may say it of the next stage before this one is through the first.
    finished: [usize; 2],
    /// The reply this rank's client waits for, once here.
    reply: Option<(u32, Vec<u8>)>,
    msg: Vec<u8>,
    out: Vec<u8>,
}

impl Server<'_> {
    /// Send, serving what arrives meanwhile until there is room.
    fn send(&mut self, to: usize, m: &[u8]) -> Result<(), EvalError> {
        let deadline = Instant::now() + OP_TIMEOUT;
        while !self.streams.try_send(to, m)? {
            if !self.serve_one(&Waiting::Nothing)? {
                self.streams.idle()?;
            }
            if Instant::now() > deadline {
                return Err(EvalError::WrongOutput(format!("kv: rank {to} took no message for {OP_TIMEOUT:?}")));
            }
        }
        Ok(())
    }

    /// Serve one message if one arrived. True if one did.
    fn serve_one(&mut self, waiting: &Waiting) -> Result<bool, EvalError> {
        let mut msg = std::mem::take(&mut self.msg);
        let Some(from) = self.streams.try_recv(&mut msg)? else {
            self.msg = msg;
            return Ok(false);
        };
        let bad = || EvalError::WrongOutput(format!("kv: a bad message from rank {from}"));
        let kind = *msg.first().ok_or_else(bad)?;
        let id = msg.get(1..5).map(|b| u32::from_le_bytes(b.try_into().expect("4"))).unwrap_or(0);
        let key = msg.get(5..13).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
        match kind {
            GET => {
                let key = key.ok_or_else(bad)?;
                self.out.clear();
                self.out.push(GOT);
                self.out.extend_from_slice(&id.to_le_bytes());
                self.out.resize(5 + VALUE_BYTES, 0);
                self.shard.get(key, &mut self.out[5..])?;
                let reply = std::mem::take(&mut self.out);
                self.send(from, &reply)?;
                self.out = reply;
            }
            PUT => {
                let key = key.ok_or_else(bad)?;
                let v = msg.get(13..13 + VALUE_BYTES).ok_or_else(bad)?;
                if !value_ok(key, v) {
                    return Err(bad());
                }
                self.shard.put(key, v)?;
                self.send(
                    from,
                    &[PUT_DONE, id.to_le_bytes()[0], id.to_le_bytes()[1], id.to_le_bytes()[2], id.to_le_bytes()[3]],
                )?;
            }
            GOT | PUT_DONE => match waiting {
                Waiting::Reply(want) if *want == id && self.reply.is_none() => {
                    self.reply = Some((id, msg[5..].to_vec()));
                }
                _ => return Err(EvalError::WrongOutput(format!("kv: an unexpected reply from rank {from}"))),
            },
            FINISHED => {
                let stage = *msg.get(1).ok_or_else(bad)? as usize;
                *self.finished.get_mut(stage).ok_or_else(bad)? += 1;
            }
            _ => return Err(bad()),
        }
        self.msg = msg;
        Ok(true)
    }

    /// A request to `to` and its reply, serving meanwhile.
    fn request(&mut self, to: usize, m: &[u8], id: u32) -> Result<Vec<u8>, EvalError> {
        self.send(to, m)?;
        let deadline = Instant::now() + OP_TIMEOUT;
        loop {
            if let Some((_, r)) = self.reply.take() {
                return Ok(r);
            }
            if !self.serve_one(&Waiting::Reply(id))? {
                self.streams.idle()?;
            }
            if Instant::now() > deadline {
                return Err(EvalError::WrongOutput(format!("kv: rank {to} did not answer in {OP_TIMEOUT:?}")));
            }
        }
    }
}

/// One-sided access to every rank's table.
struct Remote {
    peers: Vec<Option<(Conn, RemoteRegion)>>,
    /// Reads taken again because a change overlapped them.
    retried: std::cell::Cell<u64>,
}

impl Remote {
    /// Read `key`'s value from its owner's table with one-sided reads, serving meanwhile.
    fn read(&self, srv: &mut Server<'_>, owner: usize, key: u64, out: &mut [u8]) -> Result<(), EvalError> {
        let (conn, remote) =
            self.peers[owner].as_ref().ok_or_else(|| EvalError::BadArgument("read from self".into()))?;
        let layout = srv.shard.layout;
        let mut slot = layout.first_slot(key);
        let mut tries = 0;
        loop {
            let mut op = conn.read(remote, slot * SLOT_BYTES, VER_END + 8, OpFlags::NONE);
            let deadline = Instant::now() + OP_TIMEOUT;
            let got = loop {
                if let Some(r) = op.poll() {
                    break r?.into_data();
                }
                if !srv.serve_one(&Waiting::Nothing)? {
                    srv.streams.idle()?;
                }
                if Instant::now() > deadline {
                    return Err(EvalError::WrongOutput(format!("kv: a read from rank {owner} took {OP_TIMEOUT:?}")));
                }
            };
            let word = |at: u64| u64::from_le_bytes(got[at as usize..at as usize + 8].try_into().expect("8"));
            let (v0, k, v1) = (word(VER_START), word(KEY_AT), word(VER_END));
            if k == 0 {
                return Err(EvalError::WrongOutput(format!("kv: key {key} not in rank {owner}'s table")));
            }
            if k != key + 1 {
                slot = (slot + 1) & (layout.slots - 1);
                continue;
            }
            let value = &got[VALUE_AT as usize..VER_END as usize];
            // Whole only if no change overlapped the read: the versions equal and even, and
            // the value's own checksum right (the copy may read the slot's words in any
            // order, so the versions alone cannot prove it: the checksum makes the value
            // self-verifying, as Pilaf's are).
            if v0 == v1 && v0 % 2 == 0 && value_ok(key, value) {
                out.copy_from_slice(value);
                return Ok(());
            }
            // The owner was changing it: again.
            tries += 1;
            self.retried.set(self.retried.get() + 1);
            if tries > READ_RETRIES_MAX {
                return Err(EvalError::WrongOutput(format!("kv: key {key} kept changing under {tries} reads")));
            }
        }
    }
}

impl KvJob {
    /// Run the mix at this rank; the result's figures are YCSB's.
    pub fn run(&self, g: &mut Group, streams: &mut dyn Streams) -> Result<RunResult, EvalError> {
        let (me, n) = (g.rank(), g.size());
        if self.keys == 0 || self.keys > KEYS_MAX || self.ops == 0 || self.ops > OPS_MAX {
            return Err(EvalError::BadArgument(format!("kv: keys 1..={KEYS_MAX}, operations 1..={OPS_MAX}")));
        }
        if self.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
            return Err(EvalError::BadArgument("kv: the open-loop rate must be positive".into()));
        }
        // Not timed: the tables, loaded with every key's first value.
        let layout = Layout::new(self.keys, n);
        let table = g.alloc_symmetric(layout.bytes(), Access::READ | Access::WRITE)?;
        let remote = Remote {
            peers: (0..n).map(|r| (r != me).then(|| Some((g.conn(r)?.clone(), *table.remote(r)?))).flatten()).collect(),
            retried: std::cell::Cell::new(0),
        };
        let mut shard = Shard { table, layout, slot_of: HashMap::new(), version: HashMap::new() };
        let mut v = vec![0u8; VALUE_BYTES];
        for key in (0..self.keys).filter(|&k| layout.owner(k) == me) {
            value(key, u32::MAX, 0, &mut v);
            shard.insert(key, &v)?;
        }
        let zipf = Zipf::new(self.keys);
        let mut rng = Rng(mix(self.seed ^ ((me as u64) << 40)));
        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
            .map_err(|e| EvalError::BadArgument(format!("histogram: {e}")))?;
        let mut srv = Server { me, n, shard, streams, finished: [0; 2], reply: None, msg: Vec::new(), out: Vec::new() };

        let mut clock = Phases::start(g)?;
        let t0 = Instant::now();
        let interval = self.rate.map(|r| Duration::from_secs_f64(1.0 / r));
        let (mut reads, mut next_id, mut seq) = (0u64, 0u32, 0u32);
        let mut req = Vec::with_capacity(13 + VALUE_BYTES);
        for i in 0..self.ops {
            // When this operation is due: now (closed loop), or on the schedule (open loop),
            // serving the others until then.
            let due = match interval {
                Some(d) => {
                    let due = t0 + d.mul_f64(i as f64);
                    while Instant::now() < due {
                        if !srv.serve_one(&Waiting::Nothing)? {
                            std::hint::spin_loop();
                        }
                    }
                    due
                }
                None => Instant::now(),
            };
            let key = zipf.key(rng.unit());
            let owner = layout.owner(key);
            let read = rng.unit() < self.mix.reads();
            next_id = next_id.wrapping_add(1);
            if read {
                reads += 1;
                read_value(&mut srv, &remote, owner, key, self.one_sided, next_id, &mut v)?;
                if !value_ok(key, &v) {
                    return Err(EvalError::WrongOutput(format!(
                        "kv: a read of key {key} returned a damaged or wrong value"
                    )));
                }
            } else {
                seq += 1;
                value(key, me as u32, seq, &mut v);
                if owner == me {
                    srv.shard.put(key, &v)?;
                } else {
                    req.clear();
                    req.push(PUT);
                    req.extend_from_slice(&next_id.to_le_bytes());
                    req.extend_from_slice(&key.to_le_bytes());
                    req.extend_from_slice(&v);
                    srv.request(owner, &req, next_id)?;
                }
            }
            hist.saturating_record(due.elapsed().as_nanos() as u64);
        }
        let client_secs = t0.elapsed().as_secs_f64();
        // Serve until every client is done: no request can come after that.
        serve_until_through(&mut srv, 0)?;
        clock.end(g, "run")?;
        let mut result = clock.finish(g)?;

        // Figures: operations per second over all clients; latency percentiles of every
        // client's operations (each rank's histogram merged at every rank).
        let mut lat = [0u64; 3];
        let mine = [self.ops as f64 / client_secs, reads as f64, remote.retried.get() as f64];
        let mut all = vec![0f64; 3 * n];
        g.allgather(bytemuck::cast_slice(&mine), bytemuck::cast_slice_mut(&mut all))?;
        // Each histogram as its recorded (value, count) pairs, gathered at every rank.
        let pairs: Vec<u64> = hist.iter_recorded().flat_map(|b| [b.value_iterated_to(), b.count_at_value()]).collect();
        let mut lens = vec![0u64; n];
        g.allgather(bytemuck::bytes_of(&(pairs.len() as u64)), bytemuck::cast_slice_mut(&mut lens))?;
        let counts: Vec<usize> = lens.iter().map(|&l| l as usize * 8).collect();
        let mut every = vec![0u64; lens.iter().sum::<u64>() as usize];
        g.allgatherv(bytemuck::cast_slice(&pairs), &counts, bytemuck::cast_slice_mut(&mut every))?;
        let mut merged = hist.clone();
        merged.reset();
        for p in every.chunks_exact(2) {
            merged.saturating_record_n(p[0], p[1]);
        }
        lat[0] = merged.value_at_quantile(0.50);
        lat[1] = merged.value_at_quantile(0.99);
        lat[2] = merged.max();
        let ops_per_s: f64 = all.chunks_exact(3).map(|c| c[0]).sum();
        result.extra.insert("ops_per_s".into(), ops_per_s);
        result.extra.insert("lat_us_p50".into(), lat[0] as f64 / 1e3);
        result.extra.insert("lat_us_p99".into(), lat[1] as f64 / 1e3);
        result.extra.insert("lat_us_max".into(), lat[2] as f64 / 1e3);
        result
            .extra
            .insert("read_share".into(), all.chunks_exact(3).map(|c| c[1]).sum::<f64>() / (self.ops * n as u64) as f64);
        result.extra.insert("reads_retried".into(), all.chunks_exact(3).map(|c| c[2]).sum());

        // Not timed: every key read once more over the data path (rank r the keys k with
        // k mod n == r), its checksum summed by owner; each owner compares with its own.
        let mut sums = vec![0u64; n];
        for key in (0..self.keys).filter(|k| *k as usize % n == me) {
            let owner = layout.owner(key);
            next_id = next_id.wrapping_add(1);
            read_value(&mut srv, &remote, owner, key, self.one_sided, next_id, &mut v)?;
            sums[owner] = sums[owner].wrapping_add(u64::from(record_crc(&v)));
        }
        // Serve the read-back of the others until all are through it.
        serve_until_through(&mut srv, 1)?;
        g.barrier()?;
        g.allreduce(&mut sums, rackwire_coll::ReduceOp::Sum)?;
        let mut own = 0u64;
        for (&key, _) in srv.shard.slot_of.iter() {
            srv.shard.get(key, &mut v)?;
            own = own.wrapping_add(u64::from(record_crc(&v)));
        }
        let mut bad = [u64::from(own != sums[me])];
        g.allreduce(&mut bad, rackwire_coll::ReduceOp::Sum)?;
        if bad[0] != 0 {
            return Err(EvalError::WrongOutput(format!(
                "kv: {} shard(s) read back differently than last written",
                bad[0]
            )));
        }
        let ops = self.ops * n as u64;
        Ok(result.checked(srv.streams.transport(), ops * VALUE_BYTES as u64, ops))
    }
}

/// Key `key`'s value into `v`: from this rank's own shard, with one-sided reads of its owner's
/// table, or as a request to its owner (request id `id`).
fn read_value(
    srv: &mut Server<'_>,
    remote: &Remote,
    owner: usize,
    key: u64,
    one_sided: bool,
    id: u32,
    v: &mut [u8],
) -> Result<(), EvalError> {
    if owner == srv.me {
        return srv.shard.get(key, v);
    }
    if one_sided {
        return remote.read(srv, owner, key, v);
    }
    let mut req = Vec::with_capacity(13);
    req.push(GET);
    req.extend_from_slice(&id.to_le_bytes());
    req.extend_from_slice(&key.to_le_bytes());
    let r = srv.request(owner, &req, id)?;
    v.copy_from_slice(r.get(..VALUE_BYTES).ok_or_else(|| EvalError::WrongOutput("kv: a short reply".into()))?);
    Ok(())
}

/// Say this rank is through `stage`, and answer requests until every other rank said so too.
fn serve_until_through(srv: &mut Server<'_>, stage: u8) -> Result<(), EvalError> {
    let (me, n) = (srv.me, srv.n);
    for r in (0..n).filter(|&r| r != me) {
        srv.send(r, &[FINISHED, stage])?;
    }
    let mut deadline = Instant::now() + OP_TIMEOUT;
    while srv.finished[stage as usize] < n - 1 {
        if srv.serve_one(&Waiting::Nothing)? {
            // The others are still at work: the wait is for silence, not for the whole run.
            deadline = Instant::now() + OP_TIMEOUT;
        } else {
            srv.streams.idle()?;
        }
        if Instant::now() > deadline {
            return Err(EvalError::WrongOutput(format!("kv: ranks did not get through stage {stage}")));
        }
    }
    srv.streams.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the zipfian generator: every key in range, the most popular key drawn far more
    // often than a uniform draw would (YCSB's skew), and the popular keys spread over ranks.
    #[test]
    fn zipf_is_skewed_and_in_range() {
        let z = Zipf::new(10_000);
        let mut rng = Rng(7);
        let mut count = HashMap::new();
        for _ in 0..100_000 {
            let k = z.key(rng.unit());
            assert!(k < 10_000);
            *count.entry(k).or_insert(0u32) += 1;
        }
        let top = *count.values().max().unwrap();
        assert!(top > 2000, "the hottest key drawn {top} times in 100000 (uniform: 10)");
        let layout = Layout::new(10_000, 4);
        let mut hot: Vec<(u32, u64)> = count.iter().map(|(k, c)| (*c, *k)).collect();
        hot.sort_unstable_by(|a, b| b.cmp(a));
        let owners: std::collections::HashSet<usize> = hot[..20].iter().map(|(_, k)| layout.owner(*k)).collect();
        assert!(owners.len() >= 3, "the 20 hottest keys sit on {owners:?}");
    }

    // Checks values: intact ones pass; a flipped byte, another key's value, or a short one
    // fail.
    #[test]
    fn values_carry_their_key_and_checksum() {
        let mut v = vec![0u8; VALUE_BYTES];
        value(42, 3, 9, &mut v);
        assert!(value_ok(42, &v));
        assert!(!value_ok(43, &v));
        let mut torn = v.clone();
        torn[500] ^= 0x40;
        assert!(!value_ok(42, &torn));
        assert!(!value_ok(42, &v[..100]));
    }

    // Checks workload names and shares: YCSB's A, B and C, the 100% put mix, and an unknown
    // name refused.
    #[test]
    fn mixes() {
        assert_eq!(Mix::parse("a").unwrap().reads(), 0.5);
        assert_eq!(Mix::parse("B").unwrap().reads(), 0.95);
        assert_eq!(Mix::parse("C").unwrap().reads(), 1.0);
        assert_eq!(Mix::parse("put").unwrap(), Mix::Put);
        assert_eq!(Mix::Put.reads(), 0.0);
        assert!(Mix::parse("D").is_err());
    }
}
