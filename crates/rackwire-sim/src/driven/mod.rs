//! The edge driver in the simulator: two nodes whose endpoints are driven, as the edge
//! transport drives them, by an application thread and a network thread that follow
//! [`rackwire_proto::driver`] — the same hand-off, rounds and network-thread steps — on the
//! virtual clock, interleaved as each seed draws.
//!
//! Each node's application thread runs a ping-pong (a write with a notification, answered by
//! one) and bursts of small writes, polls while it waits, is descheduled now and then (it
//! stops polling without saying so), and rests (says so and sleeps) when its poll runs out.
//! Each node's network thread watches a polling thread, runs rounds, spins and parks as the
//! driver says; a frame that arrives wakes a parked or spinning network thread, not a watching
//! one. The seed draws the links, the timings and the order of threads that act at one
//! instant.
//!
//! What is checked, beyond every operation completing and every notification arriving:
//! - a frame that arrives is read within [`READ_BOUND_US`], and within [`RESTED_BOUND_US`]
//!   when it arrives while the application thread rests (the network thread took over). A
//!   frame left behind by a round that ended early to hand the application thread what it
//!   waited for counts from that round: the thread reads it on its next look, or, if it went
//!   on with other work, the network thread once it sees the thread no longer polls;
//! - operations left gathered for a later frame are taken for sending, and a connection's
//!   timer fires, within [`READ_BOUND_US`].

mod host;

use std::collections::{HashSet, VecDeque};

use rackwire_proto::driver::limits::{PUMP_RECENT_US, PUMP_WATCH_MAX_US};
use rackwire_proto::driver::{wait_for, After, AppLook, Before, HandOff, NetThread, RoundHost, Rounds, Worked, AWAKE};
use rackwire_proto::{Config, Connection, OpFlags, OpId, RegionRef, Time, GATHER_IN_FLIGHT_MIN};

use crate::net::{Flight, LinkParams, Wire};
use crate::world::{node_id, SIM_SECRET};
use crate::{keys, MemTarget, Rng, SimFailure};
use host::{Conns, Host, Medium, Queued, Reads, Side};

/// Nodes in a driven world: the hand-off is within a node, the pair gives it traffic.
const NODES: usize = 2;
/// What a round costs on the virtual clock (µs).
const ROUND_US: Time = 2;
/// Between two looks of a polling or spinning thread (µs).
const LOOK_US: Time = 1;
/// What a sleeping thread's wake-up costs (µs).
const WAKE_US: Time = 5;
/// How often an application thread looks whether its connection is up, before it starts.
const CONNECT_LOOK_US: Time = 50;
/// Slack on every bound for the costs above and a link's serialisation (µs).
const SLACK_US: Time = 100;
/// The longest a frame waits to be read, or gathered operations to be taken for sending: an
/// application thread descheduled just after its last poll counts as polling for
/// [`PUMP_RECENT_US`], and the network thread may have begun its longest watch just before.
pub const READ_BOUND_US: Time = PUMP_RECENT_US + PUMP_WATCH_MAX_US + SLACK_US;
/// The longest a frame waits that arrived while the application thread rested: the network
/// thread took over when it did.
pub const RESTED_BOUND_US: Time = SLACK_US;
/// The longest a driven run may take on the virtual clock (µs).
pub const DRIVEN_US_MAX: Time = 20_000_000;
/// Events one driven run may take before it counts as a livelock.
const EVENTS_MAX: u64 = 5_000_000;
/// The region every node writes into at its peer.
const REGION: u32 = 1;
const REGION_BYTES: usize = 1 << 16;

/// What a node's application thread does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum App {
    /// At work elsewhere (thinking, or descheduled) until then: it does not poll, and did
    /// not say it stopped.
    Away { until: Time },
    /// Polling for what it waits for, since then.
    Polling { since: Time },
    /// Asleep until what it waits for comes (it said it rests).
    Resting,
    /// Its work is done.
    Done,
}

/// What a node's network thread does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Net {
    /// Acts at this time.
    Ready(Time),
    /// Watches a polling application thread until then, or a wake-up.
    Watching { until: Time },
    /// Looks until then, a frame, or operations gathered.
    Spinning { until: Time },
    /// Sleeps until then, a frame, or a wake-up.
    Parked { until: Time },
}

/// What an application thread waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wait {
    /// A notification from the peer.
    Note,
    /// These operations' completions.
    Ops(HashSet<OpId>),
}

/// One node: its endpoint, the driver's state, its two threads.
struct Node {
    conns: Conns,
    rounds: Rounds,
    hand: HandOff,
    net: NetThread,
    net_state: Net,
    /// The waker was woken and no wait has taken it yet.
    woken: bool,
    app: App,
    /// What the application thread waits for, and how many ping-pong rounds it has left.
    wait: Option<Wait>,
    rounds_left: usize,
    /// Its sockets, memory and connection.
    side: Side,
    /// Since when operations wait gathered.
    gathered_since: Option<Time>,
    /// Since when a connection's timer is due.
    timer_due_since: Option<Time>,
    /// Notifications taken.
    notes: usize,
}

/// The draws of one seed.
#[derive(Debug, Clone)]
struct Draw {
    pings: usize,
    busy_poll: Time,
    away_chance: f64,
    away_max: Time,
    think_max: Time,
    burst_chance: f64,
}

/// What a driven seed did.
#[derive(Debug, Clone)]
pub struct DrivenReport {
    /// The seed.
    pub seed: u64,
    /// Ping-pong rounds run.
    pub pings: usize,
    /// Operations completed.
    pub ops: usize,
    /// Virtual time the run took (µs).
    pub sim_us: Time,
    /// The longest a frame waited to be read (µs).
    pub read_max: Time,
    /// The longest a frame that arrived while the application thread rested waited (µs).
    pub rested_read_max: Time,
    /// Rounds run by application threads and by network threads.
    pub app_rounds: u64,
    /// Rounds run by network threads.
    pub net_rounds: u64,
    /// How often an application thread rested.
    pub rests: u64,
    /// How often operations were left gathered.
    pub gathers: u64,
}

struct Driven {
    seed: u64,
    now: Time,
    draw: Draw,
    nodes: Vec<Node>,
    medium: Medium,
    report: DrivenReport,
}

fn fail(seed: u64, reason: impl Into<String>) -> SimFailure {
    SimFailure { seed, reason: reason.into() }
}

impl Driven {
    fn new(seed: u64) -> Driven {
        let mut rng = Rng::new(seed);
        let links = rng.range(1, 3) as usize;
        let draw = Draw {
            pings: rng.range(20, 80) as usize,
            busy_poll: rng.range(10, 400),
            away_chance: [0.0, 0.001, 0.01, 0.05][rng.range(0, 4) as usize],
            away_max: rng.range(10, 4_000),
            think_max: rng.range(0, 1_500),
            burst_chance: rng.unit() * 0.4,
        };
        let mut wires = Vec::new();
        for _from in 0..NODES {
            for _to in 0..NODES {
                for _ in 0..links {
                    let mut p = LinkParams::clean(rng.range(2, 60), 1_000_000_000, 1472);
                    p.jitter_us = rng.range(0, 20);
                    p.loss = [0.0, 0.0, 0.002, 0.02][rng.range(0, 4) as usize];
                    wires.push(Wire::new(p));
                }
            }
        }
        let mut cfg = Config::new(links, 1472);
        cfg.op_timeout_us = 10 * DRIVEN_US_MAX;
        cfg.idle_timeout_us = 10 * DRIVEN_US_MAX;
        let nodes = (0..NODES)
            .map(|i| {
                let hand = HandOff::new();
                let net = NetThread::new(&hand, 0);
                let mut conns = Conns::new(node_id(i), links);
                conns.set_delivery_room(1 << 20, 1 << 12);
                let mut target = MemTarget::default();
                target.add_region(REGION, 7 + i as u128, REGION_BYTES, &[node_id(1 - i)]);
                Node {
                    conns,
                    rounds: Rounds::new(),
                    hand,
                    net,
                    net_state: Net::Ready(0),
                    woken: false,
                    app: App::Away { until: 0 },
                    wait: None,
                    rounds_left: draw.pings,
                    side: Side { inbox: VecDeque::new(), target, done: Vec::new(), local: None },
                    gathered_since: None,
                    timer_due_since: None,
                    notes: 0,
                }
            })
            .collect();
        let report = DrivenReport {
            seed,
            pings: draw.pings,
            ops: 0,
            sim_us: 0,
            read_max: 0,
            rested_read_max: 0,
            app_rounds: 0,
            net_rounds: 0,
            rests: 0,
            gathers: 0,
        };
        let medium = Medium { wires, links, flight: Flight::default(), rng, cfg, buf: vec![0; host::FRAME_BYTES_MAX] };
        let mut d = Driven { seed, now: 0, draw, nodes, medium, report };
        // Node 0 opens the connection; its first frame goes out with its first round.
        let nonce = d.medium.rng.bytes32();
        let cfg = d.medium.cfg.clone();
        let local = d.nodes[0].conns.open(node_id(1), vec![Some(1); links], |local| {
            Connection::connect(
                cfg,
                node_id(0),
                node_id(1),
                &keys::credentials(node_id(0), SIM_SECRET),
                keys::public_key(node_id(1)),
                nonce,
                local,
                0,
            )
        });
        d.nodes[0].side.local = local;
        d
    }

    /// Run `f` with node `n`'s round I/O, its driver state and its endpoint; a frame read
    /// past its bound fails the seed.
    fn with_host<R>(
        &mut self,
        n: usize,
        f: impl FnOnce(&mut Host<'_>, &mut Rounds, &HandOff, &mut Conns) -> R,
    ) -> Result<R, SimFailure> {
        let node = &mut self.nodes[n];
        let mut host =
            Host { me: n, now: self.now, side: &mut node.side, medium: &mut self.medium, reads: Reads::default() };
        let r = f(&mut host, &mut node.rounds, &node.hand, &mut node.conns);
        let reads = host.reads;
        self.report.read_max = self.report.read_max.max(reads.max);
        self.report.rested_read_max = self.report.rested_read_max.max(reads.rested_max);
        match reads.late {
            Some((waited, bound)) => Err(fail(
                self.seed,
                format!(
                    "node {n}: a frame waited {waited} µs to be read, counted against its bound (bound {bound} µs)"
                ),
            )),
            None => Ok(r),
        }
    }

    /// Run a round on node `n` (`app`: its application thread's).
    fn round(&mut self, n: usize, app: bool) -> Result<Worked, SimFailure> {
        let now = self.now;
        let w = self.with_host(n, |host, rounds, hand, conns| rounds.run(hand, host, conns, now, app))?;
        if app {
            self.report.app_rounds += 1;
        } else {
            self.report.net_rounds += 1;
        }
        Ok(w)
    }

    /// Send what node `n`'s connections have to send, from the thread that submitted.
    fn transmit_now(&mut self, n: usize) {
        let now = self.now;
        // Sending reads no frame: nothing can be late.
        let _sent = self.with_host(n, |host, _, _, conns| host.transmit(conns, now));
    }

    /// Wake node `n`'s network thread (its waker).
    fn wake_net(&mut self, n: usize) {
        let now = self.now;
        let node = &mut self.nodes[n];
        node.woken = true;
        if let Net::Watching { .. } | Net::Parked { .. } = node.net_state {
            node.net_state = Net::Ready(now + WAKE_US);
        }
    }

    /// Node `n`'s application thread submits a write to its peer (with a notification when
    /// `notify`), as the edge transport's submission does: sent at once from this thread, or
    /// left gathered (see [`HandOff::submitted`]).
    fn submit(&mut self, n: usize, notify: bool, slot: u64) -> Option<OpId> {
        let now = self.now;
        let node = &mut self.nodes[n];
        let local = node.side.local?;
        let data = slot.to_le_bytes();
        let offset = (slot * 8) % REGION_BYTES as u64;
        let region = RegionRef { region: REGION, key: 7 + (1 - n) as u128 };
        let flags = OpFlags { notify: notify.then_some(slot), ..OpFlags::default() };
        let id = node.conns.submit(local, |id| id, |c| c.write(now, region, offset, &data, flags)).ok()?;
        node.hand.busy(now);
        let worth = node.conns.get(local).is_some_and(|s| s.conn().worth_gathering());
        if node.rounds.submitted(&node.hand, now, worth) {
            self.transmit_now(n);
        } else {
            self.report.gathers += 1;
        }
        let node = &mut self.nodes[n];
        let due = node.conns.get(local).and_then(|s| s.conn().poll_timeout());
        if node.rounds.armed(&node.hand, due) {
            self.wake_net(n);
        }
        Some(id)
    }

    /// Whether what node `n`'s application thread waits for is there (taken if so).
    fn satisfied(&mut self, n: usize) -> bool {
        let node = &mut self.nodes[n];
        match &mut node.wait {
            None => true,
            Some(Wait::Note) => {
                let Some(local) = node.side.local else { return false };
                let got = node.conns.get_mut(local).and_then(|s| s.next_note()).is_some();
                if got {
                    node.notes += 1;
                    node.wait = None;
                }
                got
            }
            Some(Wait::Ops(ids)) => {
                for (id, _) in node.side.done.drain(..) {
                    ids.remove(&id);
                }
                if ids.is_empty() {
                    node.wait = None;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Node `n`'s application thread starts its next piece of work, or is done.
    fn next_work(&mut self, n: usize) {
        let now = self.now;
        let node = &mut self.nodes[n];
        let connected = node.side.local.and_then(|l| node.conns.get(l)).is_some_and(|s| s.is_connected());
        if !connected {
            // As the edge transport's connect, which returns once the handshake completed.
            node.app = App::Away { until: now + CONNECT_LOOK_US };
            return;
        }
        if n == 1 {
            // The answering side: wait for a ping, answer it.
            if node.rounds_left == 0 {
                node.app = App::Done;
                return;
            }
            node.wait = Some(Wait::Note);
            node.app = App::Polling { since: now };
            return;
        }
        if node.rounds_left == 0 {
            node.app = App::Done;
            return;
        }
        if self.medium.rng.chance(self.draw.burst_chance) {
            // Small writes in a row: the later ones are worth gathering.
            let count = self.medium.rng.range(2, 2 + 2 * GATHER_IN_FLIGHT_MIN as u64) as usize;
            let base = self.medium.rng.range(0, 1_000);
            let ids: HashSet<OpId> = (0..count).filter_map(|k| self.submit(n, false, base + k as u64)).collect();
            self.report.ops += ids.len();
            self.nodes[n].wait = Some(Wait::Ops(ids));
        } else {
            let slot = self.nodes[n].rounds_left as u64;
            if let Some(id) = self.submit(n, true, slot) {
                self.report.ops += 1;
                self.nodes[n].rounds_left -= 1;
                // Its completion is not waited for: the answer's notification follows it.
                let _ = id;
                self.nodes[n].wait = Some(Wait::Note);
            }
        }
        self.nodes[n].app = App::Polling { since: now };
    }

    /// Node `n`'s application thread got what it waited for at `now`.
    fn got_it(&mut self, n: usize) {
        if n == 1 && self.nodes[1].wait.is_none() {
            // Answer the ping.
            let slot = 10_000 + self.nodes[1].rounds_left as u64;
            if self.submit(1, true, slot).is_some() {
                self.report.ops += 1;
                self.nodes[1].rounds_left -= 1;
            }
        }
        let think = self.medium.rng.range(0, self.draw.think_max + 1);
        self.nodes[n].app = App::Away { until: self.now + think };
        self.nodes[n].side.done.clear();
    }

    /// One step of node `n`'s application thread, due now.
    fn app_step(&mut self, n: usize) -> Result<(), SimFailure> {
        let now = self.now;
        match self.nodes[n].app {
            App::Away { .. } => {
                if self.nodes[n].wait.is_some() {
                    // Back from being descheduled: polls on.
                    self.nodes[n].app = App::Polling { since: now };
                } else {
                    self.next_work(n);
                }
                Ok(())
            }
            App::Polling { since } => {
                if self.satisfied(n) {
                    self.got_it(n);
                    return Ok(());
                }
                // The look of a waiting thread (see the edge transport's `take`/`pump`): a
                // round, unless one ran at this instant or the transport is quiet.
                let node = &self.nodes[n];
                if !node.hand.polled_at(now) {
                    match node.hand.app_look(now) {
                        AppLook::Round => {
                            node.hand.polled(now);
                            self.round(n, true)?;
                        }
                        AppLook::Quiet { wake } => {
                            if wake {
                                self.wake_net(n);
                            }
                        }
                    }
                }
                if self.satisfied(n) {
                    self.got_it(n);
                } else if now >= since + self.draw.busy_poll {
                    // Its poll ran out: it says it rests, and sleeps.
                    if self.nodes[n].hand.rest() {
                        self.wake_net(n);
                    }
                    self.report.rests += 1;
                    self.nodes[n].app = App::Resting;
                } else if self.medium.rng.chance(self.draw.away_chance) {
                    let until = now + self.medium.rng.range(1, self.draw.away_max + 1);
                    self.nodes[n].app = App::Away { until };
                }
                Ok(())
            }
            App::Resting | App::Done => Ok(()),
        }
    }

    /// When node `n`'s application thread acts next.
    fn app_at(&self, n: usize) -> Option<Time> {
        match self.nodes[n].app {
            App::Away { until } => Some(until),
            App::Polling { .. } => Some(self.now + LOOK_US),
            App::Resting | App::Done => None,
        }
    }

    /// When node `n`'s network thread acts next (a frame or a wake-up may bring it sooner).
    fn net_at(&self, n: usize) -> Time {
        match self.nodes[n].net_state {
            Net::Ready(t) | Net::Watching { until: t } | Net::Spinning { until: t } | Net::Parked { until: t } => t,
        }
    }

    /// One step of node `n`'s network thread, due now.
    fn net_step(&mut self, n: usize) -> Result<(), SimFailure> {
        let now = self.now;
        let node = &mut self.nodes[n];
        match node.net_state {
            Net::Watching { .. } => {
                node.woken = false;
                node.net.watched(&node.hand);
                node.hand.set_watching(false);
                node.net_state = Net::Ready(now);
                return Ok(());
            }
            Net::Spinning { .. } => {
                node.net_state = Net::Ready(now);
                return Ok(());
            }
            Net::Parked { .. } => {
                node.woken = false;
                node.hand.park_until(AWAKE);
                node.net_state = Net::Ready(now);
                return Ok(());
            }
            Net::Ready(_) => {}
        }
        if let Before::Watch(watch) = node.net.before_round(&node.hand, now, false) {
            node.hand.set_watching(true);
            if node.hand.polled_lately(now) {
                if !std::mem::take(&mut node.woken) {
                    node.net_state = Net::Watching { until: now + watch };
                    return Ok(());
                }
                // Woken already: the wait returns at once, a watch all the same.
                node.net.watched(&node.hand);
            }
            node.hand.set_watching(false);
            node.net_state = Net::Ready(now);
            return Ok(());
        }
        let w = self.round(n, false)?;
        let node = &mut self.nodes[n];
        let next = node.rounds.next_round_due(&node.conns);
        let idle = w.got + w.sent == 0;
        if idle {
            node.hand.park_until(now + wait_for(next, now));
        }
        node.net.worked(now, w);
        // No edge message handler here: after work, another round at once.
        let again = !idle;
        node.net_state = match node.net.after_round(&node.hand, now, w, again, next) {
            After::Again => {
                node.hand.park_until(AWAKE);
                Net::Ready(now + ROUND_US)
            }
            After::Spin { until } => {
                node.hand.park_until(AWAKE);
                Net::Spinning { until: until.max(now + LOOK_US) }
            }
            After::Park { until } => {
                if std::mem::take(&mut node.woken) || !node.side.inbox.is_empty() {
                    node.hand.park_until(AWAKE);
                    Net::Ready(now + LOOK_US)
                } else {
                    Net::Parked { until: until.max(now + LOOK_US) }
                }
            }
        };
        Ok(())
    }

    /// A frame arrives at node `to`: it waits on the socket; a network thread that spins or
    /// sleeps sees it.
    fn arrive(&mut self, to: usize, from: usize, link: usize, bytes: Vec<u8>) {
        let now = self.now;
        let node = &mut self.nodes[to];
        let rested = node.app == App::Resting;
        node.side.inbox.push_back(Queued { link, from, bytes, arrived: now, counted_from: now, rested });
        node.net_state = match node.net_state {
            Net::Spinning { .. } => Net::Ready(now + LOOK_US),
            Net::Parked { .. } => {
                node.hand.park_until(AWAKE);
                Net::Ready(now + WAKE_US)
            }
            s => s,
        };
    }

    /// After a step: a resting application thread whose wait is over wakes; a spinning
    /// network thread sees operations gathered; gathered operations have not waited too long.
    fn after_step(&mut self) -> Result<(), SimFailure> {
        let now = self.now;
        for n in 0..NODES {
            if self.nodes[n].app == App::Resting && self.satisfied(n) {
                self.got_it(n);
                if let App::Away { until } = self.nodes[n].app {
                    self.nodes[n].app = App::Away { until: until + WAKE_US };
                }
            }
            let node = &mut self.nodes[n];
            // A deadline of 0 means "at once": a timer counts as due from when it was first
            // seen due.
            match node.conns.next_timeout() {
                Some(t) if t <= now => {
                    let since = *node.timer_due_since.get_or_insert(if t == 0 { now } else { t });
                    if now - since > READ_BOUND_US {
                        return Err(fail(
                            self.seed,
                            format!(
                                "node {n}: a timer due since {since} µs had not fired at {now} µs (bound {READ_BOUND_US} µs)"
                            ),
                        ));
                    }
                }
                _ => node.timer_due_since = None,
            }
            if node.hand.gathered() {
                if let Net::Spinning { .. } = node.net_state {
                    node.net_state = Net::Ready(now + LOOK_US);
                }
                let since = *node.gathered_since.get_or_insert(now);
                if now - since > READ_BOUND_US {
                    return Err(fail(
                        self.seed,
                        format!("node {n}: operations waited gathered {} µs (bound {READ_BOUND_US} µs)", now - since),
                    ));
                }
            } else {
                node.gathered_since = None;
            }
        }
        Ok(())
    }

    fn finished(&self) -> bool {
        self.nodes.iter().all(|n| n.app == App::Done)
    }

    fn run(mut self) -> Result<DrivenReport, SimFailure> {
        let mut events = 0u64;
        while !self.finished() {
            events += 1;
            if events > EVENTS_MAX || self.now > DRIVEN_US_MAX {
                let state: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| {
                        format!(
                            "app {:?} waiting {:?}, {} rounds left, net {:?}",
                            n.app, n.wait, n.rounds_left, n.net_state
                        )
                    })
                    .collect();
                return Err(fail(self.seed, format!("stalled at {} µs: {}", self.now, state.join("; "))));
            }
            // The next thing to happen; threads due at one instant act in an order the seed
            // draws.
            let mut due: Vec<(Time, u8, usize)> = Vec::new();
            if let Some(t) = self.medium.flight.next_at() {
                due.push((t, 0, 0));
            }
            for n in 0..NODES {
                if let Some(t) = self.app_at(n) {
                    due.push((t, 1, n));
                }
                due.push((self.net_at(n), 2, n));
            }
            let t = due.iter().map(|d| d.0).min().expect("network threads always have a time");
            self.now = self.now.max(t);
            let at_once: Vec<(u8, usize)> = due.iter().filter(|d| d.0 <= self.now).map(|d| (d.1, d.2)).collect();
            let (kind, n) = at_once[self.medium.rng.range(0, at_once.len() as u64) as usize];
            match kind {
                0 => {
                    while let Some(a) = self.medium.flight.pop_due(self.now) {
                        self.arrive(a.to, a.from, a.link, a.bytes);
                    }
                }
                1 => self.app_step(n)?,
                _ => self.net_step(n)?,
            }
            self.after_step()?;
        }
        let want = self.draw.pings;
        if self.nodes[1].notes != want || self.nodes[0].notes != want {
            return Err(fail(
                self.seed,
                format!(
                    "notifications: {} and {} taken, {want} sent each way",
                    self.nodes[1].notes, self.nodes[0].notes
                ),
            ));
        }
        self.report.sim_us = self.now;
        Ok(self.report)
    }
}

/// Run one driven seed: its ping-pong finishes, and every bound holds.
pub fn run_driven(seed: u64) -> Result<DrivenReport, SimFailure> {
    Driven::new(seed).run()
}
