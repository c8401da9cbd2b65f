//! The simulated world: nodes, their connections, the links between them, a virtual clock.

use rackwire_proto::{Config, Connection, Event, Time};

use crate::net::{Flight, LinkParams, Wire};
use crate::{MemTarget, Rng};

/// The secret the simulated fabric uses.
pub const SIM_SECRET: &[u8] = b"simulated-fabric-secret";
/// Steps one run may take before it counts as a livelock.
pub const STEPS_MAX: u64 = 50_000_000;
/// Steps at one instant of virtual time before it counts as a livelock (something claims a
/// timer is due and never clears it).
pub const STEPS_AT_ONE_INSTANT_MAX: u64 = 100_000;
/// Largest frame any simulated link carries.
const BUF_BYTES: usize = 65536;

/// Nodes, connections between every pair, and the links.
pub struct World {
    /// Virtual time, µs.
    pub now: Time,
    /// The one source of randomness.
    pub rng: Rng,
    /// Number of nodes.
    pub nodes: usize,
    /// Links per node pair.
    pub links: usize,
    wires: Vec<Wire>,
    /// Frames on their way.
    pub flight: Flight,
    /// `conns[node][peer]`.
    pub conns: Vec<Vec<Option<Connection>>>,
    /// Each node's memory.
    pub targets: Vec<MemTarget>,
    events: Vec<(Time, usize, usize, Event)>,
    /// Steps taken.
    pub steps: u64,
    /// Steps taken at the current instant.
    steps_now: u64,
    /// A livelock was detected: time stopped advancing.
    pub livelock: bool,
    buf: Vec<u8>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World").field("now", &self.now).field("nodes", &self.nodes).field("links", &self.links).finish()
    }
}

/// Node `i`'s id in the fabric.
pub fn node_id(i: usize) -> u32 {
    i as u32 + 1
}

impl World {
    /// A world of `nodes` nodes with `links` links per pair; `params(from, to, link)` gives
    /// each link direction, `cfg(mtu)` each connection's configuration.
    pub fn new(
        seed: u64,
        nodes: usize,
        links: usize,
        params: impl Fn(usize, usize, usize) -> LinkParams,
        cfg: impl Fn(Vec<usize>) -> Config,
    ) -> World {
        let mut rng = Rng::new(seed);
        let mut wires = Vec::with_capacity(nodes * nodes * links);
        for from in 0..nodes {
            for to in 0..nodes {
                for l in 0..links {
                    wires.push(Wire::new(params(from, to, l)));
                }
            }
        }
        let mut conns: Vec<Vec<Option<Connection>>> = (0..nodes).map(|_| (0..nodes).map(|_| None).collect()).collect();
        #[allow(clippy::needless_range_loop)] // pairs (i, j) index a matrix
        for i in 0..nodes {
            for j in (i + 1)..nodes {
                let mtus: Vec<usize> = (0..links).map(|l| params(i, j, l).mtu.min(params(j, i, l).mtu)).collect();
                let c = cfg(mtus);
                let conn_id = |a: usize, b: usize| (a as u32 + 1) * 1000 + b as u32 + 1;
                conns[i][j] = Some(Connection::connect(
                    c.clone(),
                    node_id(i),
                    node_id(j),
                    SIM_SECRET,
                    rng.bytes32(),
                    conn_id(i, j),
                    0,
                ));
                conns[j][i] = Some(Connection::accept(c, node_id(j), SIM_SECRET, rng.bytes32(), conn_id(j, i), 0));
            }
        }
        let targets = (0..nodes).map(|_| MemTarget::default()).collect();
        let mut w = World {
            now: 0,
            rng,
            nodes,
            links,
            wires,
            flight: Flight::default(),
            conns,
            targets,
            events: Vec::new(),
            steps: 0,
            steps_now: 0,
            livelock: false,
            buf: vec![0; BUF_BYTES],
        };
        w.flush();
        w
    }

    fn wire_index(&self, from: usize, to: usize, link: usize) -> usize {
        (from * self.nodes + to) * self.links + link
    }

    /// One link direction.
    pub fn wire(&mut self, from: usize, to: usize, link: usize) -> &mut Wire {
        let i = self.wire_index(from, to, link);
        &mut self.wires[i]
    }

    /// Change both directions of link `link` between `a` and `b`.
    pub fn set_link(&mut self, a: usize, b: usize, link: usize, f: impl Fn(&mut LinkParams)) {
        f(&mut self.wire(a, b, link).params);
        f(&mut self.wire(b, a, link).params);
    }

    /// Every wire, for statistics.
    pub fn wires(&self) -> impl Iterator<Item = (usize, usize, usize, &Wire)> {
        let (n, m) = (self.nodes, self.links);
        self.wires.iter().enumerate().map(move |(i, w)| (i / (n * m), (i / m) % n, i % m, w))
    }

    /// Send everything every connection has to send now.
    pub fn flush(&mut self) {
        for i in 0..self.nodes {
            for j in 0..self.nodes {
                let now = self.now;
                while let Some(t) = self.conns[i][j].as_mut().and_then(|c| c.poll_transmit(now, &mut self.buf)) {
                    let bytes = self.buf[..t.len].to_vec();
                    let idx = self.wire_index(i, j, t.link);
                    let now = self.now;
                    self.wires[idx].send(now, &mut self.rng, &mut self.flight, i, j, t.link, bytes);
                }
                if let Some(c) = self.conns[i][j].as_mut() {
                    while let Some(e) = c.poll_event() {
                        self.events.push((self.now, i, j, e));
                    }
                }
            }
        }
    }

    fn next_event(&self) -> Option<Time> {
        let timers = self.conns.iter().flatten().flatten().filter_map(|c| c.poll_timeout());
        timers.chain(self.flight.next_at()).min()
    }

    /// Advance to the next thing that happens, if it is at or before `limit`; else move the
    /// clock to `limit`. Returns whether something happened.
    pub fn step(&mut self, limit: Time) -> bool {
        self.steps += 1;
        let next = match self.next_event() {
            Some(t) if t <= limit => t.max(self.now),
            _ => {
                self.now = self.now.max(limit);
                return false;
            }
        };
        if next == self.now {
            self.steps_now += 1;
            if self.steps_now > STEPS_AT_ONE_INSTANT_MAX {
                self.livelock = true;
                return false;
            }
        } else {
            self.steps_now = 0;
        }
        self.now = next;
        let now = self.now;
        while let Some(a) = self.flight.pop_due(now) {
            if let Some(c) = self.conns[a.to][a.from].as_mut() {
                self.targets[a.to].now = now;
                c.handle_frame(now, a.link, &a.bytes, &mut self.targets[a.to]);
            }
        }
        for i in 0..self.nodes {
            for j in 0..self.nodes {
                if let Some(c) = self.conns[i][j].as_mut() {
                    if c.poll_timeout().is_some_and(|t| t <= now) {
                        self.targets[i].now = now;
                        c.handle_timeout(now, &mut self.targets[i]);
                    }
                }
            }
        }
        self.flush();
        true
    }

    /// Run until `t` (or until the step budget is spent: then false).
    pub fn run_until(&mut self, t: Time) -> bool {
        while self.step(t) {
            if self.steps > STEPS_MAX {
                return false;
            }
        }
        !self.livelock
    }

    /// Run until `done(self)` holds or `deadline` passes; whether it held.
    pub fn run_while(&mut self, deadline: Time, mut done: impl FnMut(&mut World) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.now >= deadline || self.steps > STEPS_MAX || self.livelock {
                return false;
            }
            if !self.step(deadline) {
                return done(self);
            }
        }
    }

    /// Events since the last call: (time, node, peer, event).
    pub fn take_events(&mut self) -> Vec<(Time, usize, usize, Event)> {
        std::mem::take(&mut self.events)
    }

    /// The connection from `node` to `peer`.
    pub fn conn(&mut self, node: usize, peer: usize) -> &mut Connection {
        self.conns[node][peer].as_mut().expect("nodes are connected pairwise")
    }
}
