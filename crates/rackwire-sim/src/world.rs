//! The simulated world: nodes, their connections, the links between them, a virtual clock.
//!
//! Each node has an [`Endpoint`], as a driver of the edge transport has: every frame that
//! arrives is routed by it, operations are submitted through it and handed back by it when
//! they complete, what connections deliver waits in its bounded queues (when the world has
//! them), and answers may be held for a reply as a driver holds them. So the simulator runs
//! the endpoint's routing, accepting, pending operations, delivery room and answer holding
//! too. The acceptor's end of each pair is opened by the initiator's first handshake frame,
//! handed over at the start; its later copies travel the (faulty) links like any frame, and
//! the endpoint must find the connection they belong to.

use rackwire_proto::{Config, Connection, Endpoint, Event, Happened, Incoming, OpError, OpId, Routed, Time};

use crate::net::{Flight, LinkParams, Wire};
use crate::{keys, MemTarget, Rng};

/// The secret the simulated fabric uses.
pub const SIM_SECRET: &[u8] = b"simulated-fabric-secret";
/// Steps one run may take before it counts as a livelock.
pub const STEPS_MAX: u64 = 50_000_000;
/// Steps at one instant of virtual time before it counts as a livelock (something claims a
/// timer is due and never clears it).
pub const STEPS_AT_ONE_INSTANT_MAX: u64 = 100_000;
/// Largest frame any simulated link carries.
const BUF_BYTES: usize = 65536;

/// A node's endpoint: links are addressed by node index, and an operation in flight is kept
/// as its id (which its completion then carries, as the connection's own event would).
pub type SimEndpoint = Endpoint<usize, OpId>;

/// The index of node `id`.
pub fn node_index(id: u32) -> usize {
    id as usize - 1
}

/// What an endpoint handed over, as the connection's own event (a completion carries the
/// operation's id).
fn as_event(peer: u32, h: Happened<OpId>) -> Event {
    match h {
        Happened::Connected { .. } => Event::Connected { peer },
        Happened::Completed { op, result } => Event::Completed { op, result },
        Happened::Delivered(e) => e,
        Happened::LinkDown(l) => Event::LinkDown(l),
        Happened::LinkUp(l) => Event::LinkUp(l),
        Happened::PathCut { frame_len, agreed } => Event::PathCut { frame_len, agreed },
        Happened::Closed(why) => Event::Closed(why),
    }
}

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
    /// Each node's endpoint.
    eps: Vec<SimEndpoint>,
    /// Connections that delivered a message or notification hold their answers this long
    /// (µs), or until the next step, as a driver holds them for the application's reply.
    answer_hold: Option<Time>,
    /// `index[node][peer]`: the local id of `node`'s connection to `peer`.
    index: Vec<Vec<Option<u32>>>,
    /// `cfgs[node][peer]`: the configuration of a connection between them.
    cfgs: Vec<Vec<Option<Config>>>,
    /// Each node's memory.
    pub targets: Vec<MemTarget>,
    /// Each node's credentials.
    creds: Vec<rackwire_proto::Credentials>,
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

/// Where the wire from `from` to `to` on `link` sits in a world of `nodes` nodes and `links`
/// links per pair.
fn wire_index(nodes: usize, links: usize, from: usize, to: usize, link: usize) -> usize {
    (from * nodes + to) * links + link
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
        let mut eps: Vec<SimEndpoint> = (0..nodes).map(|i| Endpoint::new(node_id(i), links)).collect();
        let creds: Vec<_> = (0..nodes).map(|i| keys::credentials(node_id(i), SIM_SECRET)).collect();
        let mut index: Vec<Vec<Option<u32>>> = vec![vec![None; nodes]; nodes];
        let mut cfgs: Vec<Vec<Option<Config>>> = vec![vec![None; nodes]; nodes];
        #[allow(clippy::needless_range_loop)] // pairs (i, j) index a matrix
        for i in 0..nodes {
            for j in (i + 1)..nodes {
                let mtus: Vec<usize> = (0..links).map(|l| params(i, j, l).mtu.min(params(j, i, l).mtu)).collect();
                let c = cfg(mtus);
                cfgs[i][j] = Some(c.clone());
                cfgs[j][i] = Some(c.clone());
                let nonce = rng.bytes32();
                let local = eps[i].open(node_id(j), vec![Some(j); links], |local| {
                    Connection::connect(
                        c,
                        node_id(i),
                        node_id(j),
                        &creds[i],
                        keys::public_key(node_id(j)),
                        nonce,
                        local,
                        0,
                    )
                });
                index[i][j] = local;
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
            eps,
            answer_hold: None,
            index,
            cfgs,
            targets,
            creds,
            events: Vec::new(),
            steps: 0,
            steps_now: 0,
            livelock: false,
            buf: vec![0; BUF_BYTES],
        };
        w.open_acceptors();
        w.flush();
        w
    }

    /// Hand each initiator's first frame straight to its peer's endpoint, which opens the
    /// acceptor's end (so both ends exist from the start, as a test expects).
    fn open_acceptors(&mut self) {
        for i in 0..self.nodes {
            for j in (i + 1)..self.nodes {
                let Some(local) = self.index[i][j] else { continue };
                let Some(s) = self.eps[i].get_mut(local) else { continue };
                let Some(t) = s.conn_mut().poll_transmit(0, &mut self.buf) else { continue };
                let frame = self.buf[..t.len].to_vec();
                self.deliver(j, i, t.link, &frame);
            }
        }
    }

    /// Frame `frame` arrives at `to` from `from` on `link`: its endpoint routes it.
    fn deliver(&mut self, to: usize, from: usize, link: usize, frame: &[u8]) {
        let now = self.now;
        self.targets[to].now = now;
        let (rng, cfgs, creds) = (&mut self.rng, &self.cfgs, &self.creds);
        let accept = |local, inc: Incoming| {
            let cfg = cfgs[to][node_index(inc.peer)].clone().expect("a configuration for every pair");
            let creds = &creds[to];
            Some(Connection::accept(
                cfg,
                node_id(to),
                creds,
                inc.peer,
                keys::public_key(inc.peer),
                rng.bytes32(),
                local,
                now,
            ))
        };
        if let Routed::Accepted(local) = self.eps[to].handle(now, link, from, frame, &mut self.targets[to], accept) {
            let peer = self.eps[to].get(local).map(|s| node_index(s.peer())).expect("just opened");
            assert!(self.index[to][peer].is_none(), "a second connection from one peer");
            self.index[to][peer] = Some(local);
        }
    }

    /// One link direction.
    pub fn wire(&mut self, from: usize, to: usize, link: usize) -> &mut Wire {
        let i = wire_index(self.nodes, self.links, from, to, link);
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

    /// Send everything every connection has to send now, and take what they did.
    pub fn flush(&mut self) {
        let now = self.now;
        let hold = self.answer_hold.map(|h| now + h);
        for i in 0..self.nodes {
            for s in self.eps[i].sessions_mut() {
                let j = node_index(s.peer());
                while let Some(t) = s.conn_mut().poll_transmit(now, &mut self.buf) {
                    let bytes = self.buf[..t.len].to_vec();
                    let idx = wire_index(self.nodes, self.links, i, j, t.link);
                    self.wires[idx].send(now, &mut self.rng, &mut self.flight, i, j, t.link, bytes);
                }
            }
            // Messages and notifications wait in the bounded queues, if there are any, until
            // the application takes them.
            let events = &mut self.events;
            self.eps[i].poll(hold, |_, peer, h| events.push((now, i, node_index(peer), as_event(peer, h))));
        }
    }

    /// Submit an operation from `node` to `peer` with `go`, through `node`'s endpoint, which
    /// hands it back (as its id) when it completes.
    pub fn submit(
        &mut self,
        node: usize,
        peer: usize,
        go: impl FnOnce(&mut Connection) -> Result<OpId, OpError>,
    ) -> Result<OpId, OpError> {
        let local = self.index[node][peer].expect("nodes are connected pairwise");
        self.eps[node].submit(local, |id| id, go)
    }

    /// Bound what every connection may deliver and the application has not taken: at most
    /// `msg_bytes` bytes of messages and `notes` notifications, as a real driver bounds its
    /// queues (past it, the sender is held back). They are then taken with
    /// [`World::take_delivered`].
    pub fn set_delivery_room(&mut self, msg_bytes: usize, notes: usize) {
        for ep in &mut self.eps {
            ep.set_delivery_room(msg_bytes, notes);
        }
    }

    /// Connections that deliver a message or notification hold their answers for `us` (or
    /// until the next step), as a driver holds them for the application's likely reply.
    pub fn set_answer_hold(&mut self, us: Time) {
        self.answer_hold = Some(us);
    }

    /// Take what node `node`'s connections delivered (with bounded queues), as events by
    /// peer: each connection's messages in order, then its notifications in order.
    pub fn take_delivered(&mut self, node: usize) -> Vec<(usize, Event)> {
        let mut out = Vec::new();
        for s in self.eps[node].sessions_mut() {
            let peer = node_index(s.peer());
            while let Some(data) = s.next_message() {
                out.push((peer, Event::Message { data }));
            }
            while let Some(n) = s.next_note() {
                out.push((peer, Event::Notification { region: n.region, offset: n.offset, len: n.len, imm: n.imm }));
            }
        }
        out
    }

    fn next_event(&self) -> Option<Time> {
        let timers = self.eps.iter().filter_map(SimEndpoint::next_timeout);
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
        // Whatever happens next ends every hold: the reply did not come first.
        for ep in &mut self.eps {
            ep.release_holds();
        }
        while let Some(a) = self.flight.pop_due(now) {
            self.deliver(a.to, a.from, a.link, &a.bytes);
        }
        for i in 0..self.nodes {
            self.targets[i].now = now;
            self.eps[i].handle_timeouts(now, &mut self.targets[i]);
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
        let local = self.index[node][peer].expect("nodes are connected pairwise");
        self.eps[node].get_mut(local).expect("an open connection").conn_mut()
    }

    /// The connection from `node` to `peer`, to look at.
    pub fn conn_ref(&self, node: usize, peer: usize) -> Option<&Connection> {
        self.eps[node].get(self.index[node][peer]?).map(|s| s.conn())
    }
}
