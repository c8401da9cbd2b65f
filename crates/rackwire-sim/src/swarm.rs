//! Swarm testing: each seed draws its own world, fault mix and workload, runs a safety phase
//! with faults and a liveness phase with faults healed, and checks the invariants.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rackwire_proto::{
    AtomicOp, Completion, Config, ConnStats, Event, OpError, OpFlags, OpId, Refusal, RegionRef, Time,
    ORDERED_WRITE_BYTES_MAX,
};

use crate::flap::Flap;
use crate::net::{LinkParams, WireStats};
use crate::world::node_id;
use crate::{Rng, World};

/// Length of the phase with faults, µs.
pub const SAFETY_US: Time = 1_000_000;
/// The longest the liveness phase may take, µs.
pub const LIVENESS_US_MAX: Time = 60_000_000;
/// Data region size per node.
const REGION_BYTES: u64 = 8 << 20;
const DATA_REGION: u32 = 1;
const COUNTER_REGION: u32 = 2;
/// A region nobody is granted, for refusal checks.
const CLOSED_REGION: u32 = 3;

/// Why a seed failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimFailure {
    /// The seed that reproduces it.
    pub seed: u64,
    /// What went wrong.
    pub reason: String,
}

impl std::fmt::Display for SimFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed {} failed: {}", self.seed, self.reason)
    }
}

/// What a passing seed did.
#[derive(Debug, Clone)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Nodes and links per pair.
    pub nodes: usize,
    /// Links per pair.
    pub links: usize,
    /// The fault mix drawn.
    pub faults: String,
    /// Operations run.
    pub ops: usize,
    /// Payload bytes written.
    pub bytes: u64,
    /// Virtual time the run took, µs.
    pub sim_us: Time,
    /// Connection counters: (node, peer, stats).
    pub conns: Vec<(usize, usize, ConnStats)>,
    /// Link counters: (from, to, link, stats).
    pub wires: Vec<(usize, usize, usize, WireStats)>,
}

#[derive(Clone, PartialEq)]
enum Kind {
    Write {
        slot: u64,
        data: Vec<u8>,
    },
    Read {
        slot: u64,
        expect: Vec<u8>,
    },
    Fadd,
    Msg {
        data: Vec<u8>,
    },
    /// A write the target must refuse with this reason.
    Refused {
        why: Refusal,
        region: u32,
    },
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kind::Write { slot, data } => write!(f, "write {} B at {slot}", data.len()),
            Kind::Read { slot, expect } => write!(f, "read {} B at {slot}", expect.len()),
            Kind::Fadd => write!(f, "fetch-add"),
            Kind::Msg { data } => write!(f, "message {} B", data.len()),
            Kind::Refused { why, region } => write!(f, "write to be refused ({why:?}) in region {region}"),
        }
    }
}

#[derive(Debug, Clone)]
struct OpRec {
    from: usize,
    to: usize,
    kind: Kind,
    flags: OpFlags,
    submitted: Time,
    completed: Option<(Time, Result<Completion, OpError>)>,
    completions: u32,
    notified: u32,
}

fn fail(seed: u64, reason: impl Into<String>) -> SimFailure {
    SimFailure { seed, reason: reason.into() }
}

fn pattern(seed: u64, n: usize, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed ^ (n as u64).wrapping_mul(0x9e37_79b9));
    (0..len).map(|_| r.next_u64() as u8).collect()
}

struct Mix {
    loss: f64,
    dup: f64,
    corrupt: f64,
    jitter: f64,
    downs: bool,
    partition: bool,
    flap: Option<Flap>,
}

impl Mix {
    fn draw(r: &mut Rng) -> Mix {
        let pick = |r: &mut Rng, xs: &[f64]| xs[r.range(0, xs.len() as u64) as usize];
        Mix {
            loss: pick(r, &[0.0, 0.001, 0.01, 0.05]),
            dup: pick(r, &[0.0, 0.005, 0.02]),
            corrupt: pick(r, &[0.0, 0.001, 0.01]),
            jitter: pick(r, &[0.0, 0.5, 2.0]),
            downs: r.chance(0.5),
            partition: r.chance(0.25),
            flap: r.chance(0.4).then(|| Flap::draw(r)),
        }
    }
    fn describe(&self) -> String {
        format!(
            "loss<={:.1}% dup {:.1}% corrupt {:.1}% jitter {:.1}x downs {} partition {} flap {:?}",
            self.loss * 100.0,
            self.dup * 100.0,
            self.corrupt * 100.0,
            self.jitter,
            self.downs,
            self.partition,
            self.flap
        )
    }
}

enum Action {
    Submit(usize),
    LinkDown(usize, usize, usize),
    LinkUp(usize, usize, usize),
    Partition(bool),
}

/// Run one seed.
pub fn run_seed(seed: u64) -> Result<SeedReport, SimFailure> {
    let mut r = Rng::new(seed ^ 0x5eed_5eed_5eed_5eed);
    let nodes = if r.chance(0.3) { 3 } else { 2 };
    let links = r.range(1, 5) as usize;
    let mix = Mix::draw(&mut r);
    let mut params: HashMap<(usize, usize, usize), LinkParams> = HashMap::new();
    for a in 0..nodes {
        for b in (a + 1)..nodes {
            for l in 0..links {
                let latency = r.range(5, 300);
                let p = LinkParams {
                    latency_us: latency,
                    jitter_us: (latency as f64 * mix.jitter) as Time,
                    bandwidth_bps: [100_000_000, 1_000_000_000, 10_000_000_000][r.range(0, 3) as usize],
                    mtu: if r.chance(0.5) { 1472 } else { 8972 },
                    loss: r.unit() * mix.loss,
                    dup: mix.dup,
                    corrupt: mix.corrupt,
                    queue_frames: 512,
                    down: false,
                };
                params.insert((a, b, l), p.clone());
                params.insert((b, a, l), p);
            }
        }
    }
    // A fifth of the worlds have a narrow switch on their way: every end announces jumbo frames
    // whatever its wires carry, and finds the length that gets through (drawn apart, so the
    // other choices of a seed stay).
    let narrow = Rng::new(seed ^ 0x0a77_0a77).chance(0.2);
    let mut world = World::new(
        seed,
        nodes,
        links,
        |a, b, l| params.get(&(a, b, l)).cloned().unwrap_or_else(|| LinkParams::clean(10, 1_000_000_000, 1472)),
        |mtus| {
            let mut c = Config::new(mtus.len(), 1472);
            c.mtu = if narrow { vec![8972; mtus.len()] } else { mtus };
            c.op_timeout_us = 10 * LIVENESS_US_MAX;
            c
        },
    );
    // Some worlds bound what a connection may deliver and its application has not taken, as
    // a driver's queues do (the message room at least the largest message); half of those
    // read only now and then, so their senders are held back and must send again.
    let reading = r.chance(0.35).then(|| {
        world.set_delivery_room(r.range(20_000, 200_000) as usize, r.range(1, 16) as usize);
        Reading { slow: r.chance(0.5), looks: 0 }
    });
    // A third of the worlds hold answers after a delivery, as a driver does for the reply
    // its application is likely to send (drawn apart, so the other choices of a seed stay).
    let mut hold = Rng::new(seed ^ 0x401d_a115);
    if hold.chance(0.33) {
        world.set_answer_hold(hold.range(50, 2_000));
    }
    // Regions: data and counter regions granted to every other node, one granted to nobody.
    let mut keys = Vec::new();
    for n in 0..nodes {
        let others: Vec<u32> = (0..nodes).filter(|&o| o != n).map(node_id).collect();
        let (k1, k2, k3) = (r.next_u64() as u128 | 1, r.next_u64() as u128 | 1, r.next_u64() as u128 | 1);
        world.targets[n].add_region(DATA_REGION, k1, REGION_BYTES as usize, &others);
        world.targets[n].add_region(COUNTER_REGION, k2, 64, &others);
        world.targets[n].add_region(CLOSED_REGION, k3, 4096, &[]);
        keys.push((k1, k2, k3));
    }

    // The workload.
    let op_count = r.range(20, 120) as usize;
    let mut ops: Vec<OpRec> = Vec::with_capacity(op_count);
    let mut next_slot = vec![0u64; nodes];
    let mut written: Vec<Vec<(u64, Vec<u8>, usize)>> = vec![Vec::new(); nodes];
    let mut actions: Vec<(Time, Action)> = Vec::new();
    for n in 0..op_count {
        let from = r.range(0, nodes as u64) as usize;
        let to = (from + 1 + r.range(0, nodes as u64 - 1) as usize) % nodes;
        let at = r.range(1_000, SAFETY_US);
        let roll = r.unit();
        let mut flags = OpFlags {
            notify: r.chance(0.3).then_some(ops.len() as u64),
            fence_before: r.chance(0.1),
            fence_after: r.chance(0.1),
            ordered: false,
        };
        let kind = if roll < 0.55 {
            let len = match r.unit() {
                // Small enough to go ordered (a signal's size).
                x if x < 0.1 => r.range(1, ORDERED_WRITE_BYTES_MAX as u64 + 1),
                x if x < 0.6 => r.range(1, 4097),
                x if x < 0.95 => r.range(4097, 256 * 1024),
                _ => r.range(256 * 1024, 1 << 20),
            } as usize;
            if next_slot[to] + len as u64 > REGION_BYTES {
                continue;
            }
            let slot = next_slot[to];
            next_slot[to] += len as u64;
            let data = pattern(seed, n, len);
            flags.ordered = len <= ORDERED_WRITE_BYTES_MAX && r.chance(0.5);
            written[to].push((slot, data.clone(), ops.len()));
            Kind::Write { slot, data }
        } else if roll < 0.65 {
            // Read back a slot written by an op submitted earlier (issued later, see below).
            match written[to].last() {
                Some((slot, data, _)) => Kind::Read { slot: *slot, expect: data.clone() },
                None => continue,
            }
        } else if roll < 0.8 {
            flags.ordered = r.chance(0.3);
            Kind::Fadd
        } else if roll < 0.95 {
            flags.notify = None;
            Kind::Msg { data: pattern(seed, n, r.range(0, 20_000) as usize) }
        } else {
            let why =
                [Refusal::BadKey, Refusal::OutOfBounds { region_len: REGION_BYTES }, Refusal::Ungranted { needed: 0 }]
                    [r.range(0, 3) as usize];
            let region = if matches!(why, Refusal::Ungranted { .. }) { CLOSED_REGION } else { DATA_REGION };
            Kind::Refused { why, region }
        };
        let idx = ops.len();
        ops.push(OpRec { from, to, kind, flags, submitted: 0, completed: None, completions: 0, notified: 0 });
        actions.push((at, Action::Submit(idx)));
    }
    // Reads go after the write they read completed: give them a late time and re-check then.
    if mix.downs {
        for _ in 0..r.range(1, 4) {
            let a = r.range(0, nodes as u64) as usize;
            let b = (a + 1 + r.range(0, nodes as u64 - 1) as usize) % nodes;
            let l = r.range(0, links as u64) as usize;
            let t0 = r.range(0, SAFETY_US);
            actions.push((t0, Action::LinkDown(a, b, l)));
            actions.push((t0 + r.range(10_000, 400_000), Action::LinkUp(a, b, l)));
        }
    }
    if mix.partition {
        let t0 = r.range(0, SAFETY_US / 2);
        actions.push((t0, Action::Partition(true)));
        actions.push((t0 + r.range(10_000, 500_000), Action::Partition(false)));
    }
    if let Some(flap) = mix.flap {
        let a = r.range(0, nodes as u64) as usize;
        let b = (a + 1 + r.range(0, nodes as u64 - 1) as usize) % nodes;
        for c in flap.changes(&mut r, a, b, links, SAFETY_US / 2) {
            actions.push((
                c.at,
                if c.down { Action::LinkDown(c.a, c.b, c.link) } else { Action::LinkUp(c.a, c.b, c.link) },
            ));
        }
    }
    actions.sort_by_key(|(t, a)| (*t, matches!(a, Action::Submit(_))));

    let mut ids: HashMap<(usize, usize, OpId), usize> = HashMap::new();
    let mut msgs: HashMap<(usize, usize), VecDeque<usize>> = HashMap::new();
    let mut fadds: Vec<Vec<u64>> = vec![Vec::new(); nodes];
    let mut deferred: VecDeque<usize> = VecDeque::new();
    let mut check = Checker { seed, ops: &mut ops, ids: &mut ids, msgs: &mut msgs, fadds: &mut fadds, reading };

    let mut actions = actions.into_iter().peekable();
    while let Some((t, _)) = actions.peek() {
        let t = *t;
        if !world.run_until(t) {
            return Err(fail(seed, "step budget spent (livelock?)"));
        }
        check.events(&mut world)?;
        let (_, a) = actions.next().expect("peeked");
        match a {
            Action::Submit(i) => deferred.push_back(i),
            Action::LinkDown(x, y, l) => world.set_link(x, y, l, |p| p.down = true),
            Action::LinkUp(x, y, l) => world.set_link(x, y, l, |p| p.down = false),
            Action::Partition(on) => {
                for b in 1..nodes {
                    for l in 0..links {
                        world.set_link(0, b, l, |p| p.down = on);
                    }
                }
            }
        }
        // Submit what may go now (a read waits until the write it reads completed).
        check.submit_ready(&mut world, &mut deferred, &keys)?;
        world.flush();
    }
    // Liveness: heal everything; every operation must complete.
    if !world.run_until(SAFETY_US) {
        return Err(fail(seed, "step budget spent (livelock?)"));
    }
    for a in 0..nodes {
        for b in 0..nodes {
            for l in 0..links {
                if a != b {
                    let healed = world.wire(a, b, l).params.healed();
                    world.wire(a, b, l).params = healed;
                }
            }
        }
    }
    let deadline = SAFETY_US + LIVENESS_US_MAX;
    loop {
        check.events(&mut world)?;
        check.submit_ready(&mut world, &mut deferred, &keys)?;
        world.flush();
        let pending = check.ops.iter().any(|o| o.completed.is_none()) || !deferred.is_empty();
        if !pending {
            break;
        }
        if world.livelock {
            return Err(fail(seed, format!("livelock: time stopped at {} µs", world.now)));
        }
        if world.now >= deadline || world.steps > crate::world::STEPS_MAX {
            let n = check.ops.iter().filter(|o| o.completed.is_none()).count();
            return Err(fail(seed, format!("liveness: {n} operations still incomplete after faults healed")));
        }
        world.step(deadline);
    }
    // Let trailing acknowledgements and answers settle, then check the end state (with
    // everything delivered taken).
    world.run_until(world.now + 50_000);
    if let Some(r) = check.reading.as_mut() {
        r.slow = false;
    }
    check.events(&mut world)?;
    check.finish(&mut world)?;
    let bytes = ops.iter().map(|o| if let Kind::Write { data, .. } = &o.kind { data.len() as u64 } else { 0 }).sum();
    let mut conns = Vec::new();
    for i in 0..nodes {
        for j in 0..nodes {
            if let Some(c) = world.conn_ref(i, j) {
                conns.push((i, j, c.stats()));
            }
        }
    }
    let wires = world.wires().filter(|(a, b, _, _)| a != b).map(|(a, b, l, w)| (a, b, l, w.stats)).collect();
    Ok(SeedReport {
        seed,
        nodes,
        links,
        faults: if narrow { format!("{}, narrow switch", mix.describe()) } else { mix.describe() },
        ops: ops.len(),
        bytes,
        sim_us: world.now,
        conns,
        wires,
    })
}

/// How the application takes what its connections delivered, in a world with bounded
/// delivery queues.
struct Reading {
    /// Only at every [`SLOW_READ_EVERY`]-th look.
    slow: bool,
    looks: u64,
}

/// A slow reader takes what was delivered at one look in this many.
const SLOW_READ_EVERY: u64 = 4;

struct Checker<'a> {
    seed: u64,
    ops: &'a mut Vec<OpRec>,
    ids: &'a mut HashMap<(usize, usize, OpId), usize>,
    msgs: &'a mut HashMap<(usize, usize), VecDeque<usize>>,
    fadds: &'a mut Vec<Vec<u64>>,
    reading: Option<Reading>,
}

impl Checker<'_> {
    /// Reads wait until the write of the slot they read completed.
    fn ready(&self, i: usize) -> bool {
        match &self.ops[i].kind {
            Kind::Read { slot, .. } => {
                let to = self.ops[i].to;
                self.ops.iter().any(|o| {
                    o.to == to && matches!(&o.kind, Kind::Write { slot: s, .. } if s == slot) && o.completed.is_some()
                })
            }
            _ => true,
        }
    }

    /// Submit the deferred operations that may go now; keep the others, in order.
    fn submit_ready(
        &mut self,
        world: &mut World,
        deferred: &mut VecDeque<usize>,
        keys: &[(u128, u128, u128)],
    ) -> Result<(), SimFailure> {
        let mut still = VecDeque::new();
        while let Some(i) = deferred.pop_front() {
            if self.ready(i) {
                self.submit(world, i, keys)?;
            } else {
                still.push_back(i);
            }
        }
        *deferred = still;
        Ok(())
    }

    fn submit(&mut self, world: &mut World, i: usize, keys: &[(u128, u128, u128)]) -> Result<(), SimFailure> {
        let now = world.now;
        let o = &mut self.ops[i];
        let (k1, k2, k3) = keys[o.to];
        let data_ref = RegionRef { region: DATA_REGION, key: k1 };
        if let Kind::Write { slot, data } = &o.kind {
            world.targets[o.to].track(DATA_REGION, *slot, data.len() as u64);
        }
        if let Kind::Msg { .. } = &o.kind {
            self.msgs.entry((o.from, o.to)).or_default().push_back(i);
        }
        let r = world.submit(o.from, o.to, |c| match &o.kind {
            Kind::Write { slot, data } => c.write(now, data_ref, *slot, data, o.flags),
            Kind::Read { slot, expect } => c.read(now, data_ref, *slot, expect.len() as u64, o.flags),
            Kind::Fadd => {
                c.atomic(now, RegionRef { region: COUNTER_REGION, key: k2 }, 0, AtomicOp::FetchAdd(1), o.flags)
            }
            Kind::Msg { data } => c.send(now, data, o.flags),
            Kind::Refused { why, region } => {
                let (target, offset) = match why {
                    Refusal::BadKey => (RegionRef { region: DATA_REGION, key: k1 ^ 2 }, 0),
                    Refusal::OutOfBounds { .. } => (data_ref, REGION_BYTES - 10),
                    _ => (RegionRef { region: *region, key: k3 }, 0),
                };
                c.write(now, target, offset, &[0xee; 100], o.flags)
            }
        });
        let id = r.map_err(|e| fail(self.seed, format!("submitting op {i}: {e}")))?;
        o.submitted = now;
        self.ids.insert((o.from, o.to, id), i);
        Ok(())
    }

    fn events(&mut self, world: &mut World) -> Result<(), SimFailure> {
        for (t, node, peer, e) in world.take_events() {
            self.event(world, t, node, peer, e)?;
        }
        let take = self.reading.as_mut().is_some_and(|r| {
            r.looks += 1;
            !r.slow || r.looks.is_multiple_of(SLOW_READ_EVERY)
        });
        if take {
            for node in 0..world.nodes {
                for (peer, e) in world.take_delivered(node) {
                    self.event(world, world.now, node, peer, e)?;
                }
            }
        }
        Ok(())
    }

    fn event(&mut self, world: &mut World, t: Time, node: usize, peer: usize, e: Event) -> Result<(), SimFailure> {
        let seed = self.seed;
        {
            match e {
                Event::Completed { op, result } => {
                    let Some(&i) = self.ids.get(&(node, peer, op)) else {
                        return Err(fail(seed, format!("completion of unknown op {op} at node {node}")));
                    };
                    let o = &mut self.ops[i];
                    o.completions += 1;
                    if o.completions > 1 {
                        return Err(fail(seed, format!("op {i} completed twice")));
                    }
                    match (&o.kind, &result) {
                        (Kind::Write { slot, data }, Ok(Completion::Done)) => {
                            let s = world.targets[o.to].slots.get(&(DATA_REGION, *slot)).copied().unwrap_or_default();
                            if s.placed < data.len() as u64 || s.last.is_some_and(|l| l > t) {
                                return Err(fail(seed, format!("write op {i} reported complete at {t} before its data was placed ({} of {} bytes, last at {:?})", s.placed, data.len(), s.last)));
                            }
                        }
                        (Kind::Read { expect, .. }, Ok(Completion::Data(got))) => {
                            if got != expect {
                                return Err(fail(seed, format!("read op {i} returned wrong bytes")));
                            }
                        }
                        (Kind::Fadd, Ok(Completion::Value(v))) => self.fadds[o.to].push(*v),
                        (Kind::Msg { .. }, Ok(Completion::Done)) => {}
                        (Kind::Refused { why, .. }, Err(OpError::Refused(got))) if got == why => {}
                        (k, r) => return Err(fail(seed, format!("op {i} ({k:?}) ended with {r:?}"))),
                    }
                    o.completed = Some((t, result));
                }
                Event::Message { data } => {
                    let q = self.msgs.entry((peer, node)).or_default();
                    let Some(i) = q.pop_front() else {
                        return Err(fail(seed, format!("unexpected message at node {node} from {peer}")));
                    };
                    if !matches!(&self.ops[i].kind, Kind::Msg { data: d } if *d == data) {
                        return Err(fail(
                            seed,
                            format!("message out of order or damaged at node {node} (expected op {i})"),
                        ));
                    }
                }
                Event::Notification { region, offset, len, imm } => {
                    let i = imm as usize;
                    let o = self
                        .ops
                        .get_mut(i)
                        .ok_or_else(|| fail(seed, format!("notification with unknown immediate {imm}")))?;
                    match &o.kind {
                        Kind::Write { slot, data }
                            if region == DATA_REGION && *slot == offset && data.len() as u64 == len && o.to == node =>
                        {
                            let s = world.targets[node].slots.get(&(DATA_REGION, *slot)).copied().unwrap_or_default();
                            if s.placed < len {
                                return Err(fail(seed, format!("notification of op {i} before its data was placed")));
                            }
                        }
                        Kind::Read { .. } => {}
                        k => return Err(fail(seed, format!("notification for op {i} ({k:?}) that should not notify"))),
                    }
                    o.notified += 1;
                    if o.notified > 1 {
                        return Err(fail(seed, format!("op {i} notified twice")));
                    }
                }
                Event::Closed(why) => return Err(fail(seed, format!("connection {node}->{peer} closed: {why:?}"))),
                Event::Connected { .. } | Event::LinkDown(_) | Event::LinkUp(_) | Event::PathCut { .. } => {}
            }
        }
        Ok(())
    }

    fn finish(&mut self, world: &mut World) -> Result<(), SimFailure> {
        let seed = self.seed;
        for (i, o) in self.ops.iter().enumerate() {
            if o.completions != 1 {
                return Err(fail(seed, format!("op {i} completed {} times", o.completions)));
            }
            let wants_notify = o.flags.notify.is_some() && matches!(o.kind, Kind::Write { .. } | Kind::Read { .. });
            if wants_notify && o.notified != 1 {
                return Err(fail(seed, format!("op {i} asked for a notification and got {}", o.notified)));
            }
            if let Kind::Write { slot, data } = &o.kind {
                let mem = &world.targets[o.to].regions[&DATA_REGION].data;
                if &mem[*slot as usize..*slot as usize + data.len()] != data.as_slice() {
                    return Err(fail(seed, format!("target bytes of op {i} are wrong")));
                }
            }
        }
        for (n, olds) in self.fadds.iter_mut().enumerate() {
            let count = olds.len() as u64;
            olds.sort_unstable();
            if olds.iter().enumerate().any(|(k, &v)| v != k as u64) {
                return Err(fail(seed, format!("fetch-and-add old values at node {n} are not 0..{count}")));
            }
            let word = u64::from_le_bytes(world.targets[n].regions[&COUNTER_REGION].data[..8].try_into().expect("8"));
            if word != count {
                return Err(fail(seed, format!("counter at node {n} is {word}, expected {count}")));
            }
        }
        for n in 0..world.nodes {
            if world.targets[n].regions[&CLOSED_REGION].data.iter().any(|&b| b != 0) {
                return Err(fail(seed, format!("a refused write touched node {n}'s closed region")));
            }
        }
        if self.msgs.values().any(|q| !q.is_empty()) {
            return Err(fail(seed, "messages sent but never delivered"));
        }
        // Fences: per connection, in submission order.
        let mut by_conn: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
        let mut order: Vec<usize> = (0..self.ops.len()).collect();
        order.sort_by_key(|&i| (self.ops[i].submitted, i));
        for i in order {
            by_conn.entry((self.ops[i].from, self.ops[i].to)).or_default().push(i);
        }
        for list in by_conn.values() {
            for (k, &i) in list.iter().enumerate() {
                let o = &self.ops[i];
                let Kind::Write { slot, .. } = &o.kind else { continue };
                let Some(first) = world.targets[o.to].slots.get(&(DATA_REGION, *slot)).and_then(|s| s.first) else {
                    continue;
                };
                for &e in &list[..k] {
                    let earlier = &self.ops[e];
                    // An ordered write takes effect after every byte of each earlier write of
                    // its connection (all completed: checked above).
                    if let (true, Kind::Write { slot: es, .. }) = (o.flags.ordered, &earlier.kind) {
                        let last = world.targets[o.to].slots.get(&(DATA_REGION, *es)).and_then(|s| s.last);
                        if last.is_none_or(|l| l > first) {
                            return Err(fail(
                                seed,
                                format!("order broken: ordered op {i} took effect at {first}, before op {e}'s last byte (at {last:?})"),
                            ));
                        }
                    }
                    let done = earlier.completed.as_ref().map(|c| c.0).unwrap_or(Time::MAX);
                    if (o.flags.fence_before || earlier.flags.fence_after) && first < done {
                        return Err(fail(
                            seed,
                            format!(
                                "fence broken: op {i} ({:?}, {:?}, submitted {}) placed data at {first} before op {e} ({:?}, {:?}, submitted {}) completed at {done}",
                                o.kind, o.flags, o.submitted, earlier.kind, earlier.flags, earlier.submitted
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
