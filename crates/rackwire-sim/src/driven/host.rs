//! A driven node's round I/O: its socket queue, its memory, the wires it sends on — the
//! simulator's [`RoundHost`], as the edge transport's is its sockets.

use std::collections::VecDeque;

use rackwire_proto::driver::{Received, RoundHost};
use rackwire_proto::{Config, Connection, Endpoint, Happened, Incoming, OpError, OpId, Routed, Time};

use super::{NODES, READ_BOUND_US, RESTED_BOUND_US};
use crate::net::{Flight, Wire};
use crate::world::{node_id, node_index, SIM_SECRET};
use crate::{keys, MemTarget, Rng};

/// A node's endpoint: a connection's operations are kept as their ids.
pub(super) type Conns = Endpoint<usize, OpId>;

/// Largest frame a simulated link carries.
pub(super) const FRAME_BYTES_MAX: usize = 65536;

/// A frame on a node's socket.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) link: usize,
    pub(super) from: usize,
    pub(super) bytes: Vec<u8>,
    pub(super) arrived: Time,
    /// Its bound counts from then: its arrival, or the round that ended early for the
    /// application thread and left it behind (that thread reads it next, if it polls on).
    pub(super) counted_from: Time,
    /// The application thread rested when it arrived.
    pub(super) rested: bool,
}

/// What a node has beside its endpoint and threads.
pub(super) struct Side {
    /// Frames arrived and not read yet (its sockets).
    pub(super) inbox: VecDeque<Queued>,
    pub(super) target: MemTarget,
    /// Operations completed, and how.
    pub(super) done: Vec<(OpId, Result<(), OpError>)>,
    /// The connection to the peer, once open here.
    pub(super) local: Option<u32>,
}

/// What joins the nodes: the wires, the frames in flight, the one source of randomness, the
/// connections' configuration.
pub(super) struct Medium {
    pub(super) wires: Vec<Wire>,
    pub(super) links: usize,
    pub(super) flight: Flight,
    pub(super) rng: Rng,
    pub(super) cfg: Config,
    /// Where the connections write each frame before it goes on its wire
    /// ([`FRAME_BYTES_MAX`] long, reused).
    pub(super) buf: Vec<u8>,
}

/// How long frames waited to be read in a round.
#[derive(Debug, Default)]
pub(super) struct Reads {
    pub(super) max: Time,
    /// Of frames that arrived while the application thread rested.
    pub(super) rested_max: Time,
    /// A frame waited past its bound: (waited, bound).
    pub(super) late: Option<(Time, Time)>,
}

/// The I/O of a round on node `me`.
pub(super) struct Host<'a> {
    pub(super) me: usize,
    pub(super) now: Time,
    pub(super) side: &'a mut Side,
    pub(super) medium: &'a mut Medium,
    pub(super) reads: Reads,
}

impl Host<'_> {
    fn send(&mut self, to: usize, link: usize, bytes: Vec<u8>) {
        let m = &mut *self.medium;
        let i = (self.me * NODES + to) * m.links + link;
        m.wires[i].send(self.now, &mut m.rng, &mut m.flight, self.me, to, link, bytes);
    }

    /// Note how long `q` waited, at `now`.
    fn waited(&mut self, q: &Queued, now: Time) {
        let waited = now - q.arrived;
        let counted = now - q.counted_from;
        let bound = if q.rested { RESTED_BOUND_US } else { READ_BOUND_US };
        if q.rested {
            self.reads.rested_max = self.reads.rested_max.max(waited);
        }
        self.reads.max = self.reads.max.max(waited);
        if counted > bound && self.reads.late.is_none() {
            self.reads.late = Some((counted, bound));
        }
    }
}

impl RoundHost<usize, OpId> for Host<'_> {
    fn receive(&mut self, conns: &mut Conns, now: Time, stop_at_event: bool) -> Received {
        let mut frames = 0;
        while let Some(q) = self.side.inbox.pop_front() {
            frames += 1;
            self.waited(&q, now);
            self.side.target.now = now;
            let me = self.me;
            let Medium { cfg, rng, .. } = &mut *self.medium;
            let accept = |local, inc: Incoming| {
                Some(Connection::accept(
                    cfg.clone(),
                    node_id(me),
                    &keys::credentials(node_id(me), SIM_SECRET),
                    inc.peer,
                    keys::public_key(inc.peer),
                    rng.bytes32(),
                    local,
                    now,
                ))
            };
            let routed = conns.handle(now, q.link, q.from, &q.bytes, &mut self.side.target, accept);
            while let Some((to, link, retry)) = conns.next_retry() {
                self.send(to, link, retry);
            }
            let local = match routed {
                Routed::Accepted(l) => {
                    self.side.local = Some(l);
                    l
                }
                Routed::Conn(l) => l,
                Routed::Dropped => continue,
            };
            let events = conns.get(local).is_some_and(|s| s.conn().has_events() || s.conn().is_signalled());
            if events && stop_at_event {
                for left in &mut self.side.inbox {
                    left.counted_from = now;
                }
                return Received { frames, more: !self.side.inbox.is_empty() };
            }
        }
        Received { frames, more: false }
    }

    fn dispatch(&mut self, conns: &mut Conns, hold: Option<Time>) -> bool {
        let done = &mut self.side.done;
        let polled = conns.poll(hold, |_, _, h| {
            if let Happened::Completed { op, result } = h {
                done.push((op, result.map(|_| ())));
            }
        });
        polled.delivered || polled.signalled
    }

    fn timeouts(&mut self, conns: &mut Conns, now: Time) -> (bool, Option<Time>) {
        self.side.target.now = now;
        conns.handle_timeouts(now, &mut self.side.target)
    }

    fn transmit(&mut self, conns: &mut Conns, now: Time) -> usize {
        let mut buf = std::mem::take(&mut self.medium.buf);
        let mut sent = 0;
        for s in conns.sessions_mut() {
            let to = node_index(s.peer());
            while let Some(t) = s.conn_mut().poll_transmit(now, &mut buf) {
                self.send(to, t.link, buf[..t.len].to_vec());
                sent += 1;
            }
        }
        self.medium.buf = buf;
        sent
    }
}
