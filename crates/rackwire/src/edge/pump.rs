//! Driving the endpoint with threads: the driver's rounds (`rackwire_proto::driver`) over
//! this node's sockets and memory, run by application threads that poll and by the network
//! thread, which runs them when no application thread does and sleeps when nothing is due.

use proto::driver::limits::{PEER_CHECK_EVERY_US, RECV_BURST};
use proto::driver::{After, AppLook, Before, NetThread, Received, RoundHost, Worked, AWAKE};
use rackwire_udp::RecvLink;
use std::ops::ControlFlow;

use crate::sync::read;
use crate::watch::EdgeWatch;

use super::{
    completion, debug, lock, proto, warn, Arc, Connection, Conns, Duration, EdgeEndpoint, EdgePeer, FabricTarget, Io,
    MessageHandler, Node, Ordering, PeerTransport, Pending, Side, SocketAddr, State,
};

/// A round's I/O on this node: its sockets (the links a look found readable), its memory, and
/// what it does with what the connections did.
struct EdgeRound<'a, 'f> {
    ep: &'a EdgeEndpoint,
    io: &'a mut Io,
    target: &'a mut FabricTarget<'f>,
    side: &'a mut Side,
    /// The links to read, one bit each (a look just before found the others empty; `u64::MAX`:
    /// all).
    readable: u64,
}

impl RoundHost<SocketAddr, Pending> for EdgeRound<'_, '_> {
    fn receive(&mut self, conns: &mut Conns, now: proto::Time, stop_at_event: bool) -> Received {
        let mut got = 0;
        let mut more = false;
        let mut hand = false;
        'links: for (l, sock) in self.ep.socks.iter().enumerate() {
            // A link a look just found empty is left for the next look: a receive call for
            // nothing costs about as much as the look.
            if l < 64 && self.readable & (1 << l) == 0 {
                continue;
            }
            let mut taken = 0;
            while taken < RECV_BURST {
                let each = |frame: &[u8], from| {
                    let events = self.ep.deliver(conns, l, frame, from, now, self.target) && stop_at_event;
                    hand |= events;
                    if events {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                };
                // Through the link trait, so a wrapper (faults, tracing, capture) may sit here.
                match RecvLink::recv_batch(&mut &*sock, &mut self.io.rx, each) {
                    Ok(n) => {
                        taken += n;
                        if hand && !self.io.rx.drained() {
                            // Frames may still wait (and with them acknowledgements): no
                            // timers until they are read.
                            got += taken;
                            more = true;
                            break 'links;
                        }
                        // The socket was found empty: looking again now would cost a system
                        // call for nothing.
                        if self.io.rx.drained() {
                            break;
                        }
                    }
                    Err(e) => {
                        debug!(link = l, "receive: {e}");
                        break;
                    }
                }
            }
            got += taken;
            more |= taken >= RECV_BURST;
        }
        Received { frames: got, more }
    }

    fn dispatch(&mut self, conns: &mut Conns, hold: Option<proto::Time>) -> bool {
        self.ep.dispatch(conns, &mut self.side.closing, hold)
    }

    /// The network thread hands messages it took for the edge message handler (the virtual
    /// NIC's) over (into rw0) before it sends anything, and holds the answers for the reply
    /// that another thread (the virtual NIC's) may send within microseconds; its lockless spin
    /// (see `run`) gives that thread the lock, and the round after it sends what no reply
    /// took.
    fn relays(&self) -> bool {
        self.ep.hands_messages_over()
    }

    fn relayed(&self) -> bool {
        self.ep.handed_any.load(Ordering::Acquire)
    }

    fn timeouts(&mut self, conns: &mut Conns, now: proto::Time) -> (bool, Option<proto::Time>) {
        let (mut fired, due) = conns.handle_timeouts(now, self.target);
        if let Some(n) = self.ep.fabric.upgrade() {
            let asked = &mut self.side.gone_asked;
            for (local, s) in conns.iter_mut().filter(|(_, s)| s.is_unreachable()) {
                fired |= self.ep.unreachable(&n, local, s, asked, now);
            }
        }
        (fired, due)
    }

    fn transmit(&mut self, conns: &mut Conns, now: proto::Time) -> usize {
        self.ep.transmit(conns, self.side, now, self.io)
    }
}

impl EdgeEndpoint {
    /// One round of the driver's (see [`proto::driver::Rounds::run`]) on this node's sockets:
    /// `app` when an application thread runs it, `readable` the links to read.
    pub(super) fn round(
        &self,
        st: &mut State,
        io: &mut Io,
        target: &mut FabricTarget<'_>,
        now: proto::Time,
        app: bool,
        readable: u64,
    ) -> Worked {
        let State { conns, rounds, side } = st;
        let mut host = EdgeRound { ep: self, io, target, side, readable };
        rounds.run(&self.hand, &mut host, conns, now, app)
    }

    /// Make progress from a waiting application thread (busy polling), if the network thread
    /// is not at it right now and the transport is in use (see [`QUIET_AFTER_US`]). True when
    /// something was received or sent.
    pub(crate) fn pump(&self) -> bool {
        let now = self.now();
        if !self.app_may_round(now) {
            return false;
        }
        let Ok(mut st) = self.state.try_lock() else {
            // Polling all the same: the network thread stays out of the way.
            self.hand.polled(now);
            return false;
        };
        // The round's time is read under the lock, as every other round's: a time read before
        // could be older than a round another thread ran meanwhile, and frames sent with it
        // would sit in their link's send order behind later ones (whose loss deadlines then
        // come first; the protocol checks that order in debug builds).
        let moved = self.pump_locked(&mut st, self.now());
        drop(st);
        self.hand_over();
        moved
    }

    /// Give the messages the last rounds took for the fabric's edge message handler to it, in
    /// order (called with the state's lock released).
    pub(super) fn hand_over(&self) {
        if !self.handed_any.load(Ordering::Acquire) {
            return;
        }
        let Some(handler) = self.handler() else { return };
        // The two lists trade places (each keeps its room: no allocation per message).
        let mut batch = lock(&self.handing);
        {
            let mut handed = lock(&self.handed);
            self.handed_any.store(false, Ordering::Release);
            std::mem::swap(&mut *handed, &mut *batch);
        }
        if !batch.is_empty() {
            handler.messages(&batch);
        }
        batch.clear();
    }

    /// [`EdgeEndpoint::pump`] with the state in hand, at `now`.
    pub(super) fn pump_locked(&self, st: &mut State, now: proto::Time) -> bool {
        self.hand.polled(now);
        let mut io = lock(&self.app_io);
        let mut target = FabricTarget { fabric: &self.fabric };
        let w = self.round(st, &mut io, &mut target, now, true, u64::MAX);
        w.got + w.sent > 0
    }

    /// Whether an application thread's look at `now` runs a round: not when nothing came this
    /// way lately (see [`HandOff::app_look`](proto::driver::HandOff::app_look)): the network
    /// thread reads the sockets then (it sleeps until a frame comes) and the look costs no
    /// system call.
    pub(super) fn app_may_round(&self, now: proto::Time) -> bool {
        match self.hand.app_look(now) {
            AppLook::Round => true,
            AppLook::Quiet { wake } => {
                if wake {
                    self.waker.wake();
                }
                false
            }
        }
    }

    /// The transport counts as in use now, as when a frame arrives (a test drives it by hand).
    #[cfg(test)]
    pub(crate) fn mark_busy(&self) {
        self.hand.busy(self.now());
    }

    /// Make the network thread's looks while an application thread polls this far apart.
    #[cfg(test)]
    pub(crate) fn set_watch(&self, d: Duration) {
        self.hand.set_watch(d.as_micros() as proto::Time);
    }

    /// The network thread only watches a polling application thread.
    #[cfg(test)]
    pub(crate) fn is_watching(&self) -> bool {
        self.hand.is_watching()
    }

    /// The network thread, as the driver says (see [`NetThread`]): works while there is work,
    /// looks again for a while after it (long enough to see the answer to what it sent, if
    /// answers came that soon), then blocks until a frame arrives, a timer is due or an
    /// operation is submitted. Latency comes from the waiting application threads, which poll
    /// (see [`EdgeEndpoint::pump`]); while one does, this thread leaves it the sockets and the
    /// core. While it is awake after work, it also watches the edge message handler's
    /// descriptor, if one is set ([`crate::EdgeWatch`]).
    pub(super) fn run(self: Arc<Self>) {
        let mut io = Io::new(self.socks.len());
        let mut target = FabricTarget { fabric: &self.fabric };
        let mut net = NetThread::new(&self.hand, self.now());
        net.fix_spin(self.net_spin.map(|d| d.as_micros() as proto::Time));
        // The links the next round reads: those the last look found readable, if a look came
        // just before it; else all.
        let mut readable = u64::MAX;
        // The edge watch, while this thread watches it: from its first spin after work until
        // it sleeps or leaves the work to a polling thread.
        let mut answers: Option<Arc<dyn EdgeWatch>> = None;
        // The round just handed a lone message over (into rw0) and the take right after found
        // no answer yet: the program it woke has not run. The spin's first yield most likely
        // runs it, and its answer is then taken straight away, without the look before it.
        let mut answer_due = false;
        // The spin's looks: a `ppoll` of every socket, the waker and the watched descriptor,
        // zero timeout. Not an epoll set, though a look at one costs less: a descriptor in an
        // epoll set has the set's entry on its wait queue for good, and every packet that
        // arrives there then runs the set's callback in the sender's system call (a 64 B
        // ping-pong between two cores over loopback, ten runs each: 6.65 µs a round trip,
        // median, with each side's socket in a set it looked at, 5.8 with `ppoll` looks). A
        // zero-timeout `ppoll` leaves nothing on the queues.
        let look = |answers: &Option<Arc<dyn EdgeWatch>>| {
            rackwire_udp::wait_with(&self.socks, &self.waker, answers.as_ref().map(|w| w.fd()), Some(Duration::ZERO))
        };
        let unwatch = |answers: &mut Option<Arc<dyn EdgeWatch>>| {
            if let Some(w) = answers.take() {
                w.watching(false);
            }
        };
        let us = Duration::from_micros;
        loop {
            let stopping = self.stop.load(Ordering::SeqCst);
            if let Before::Watch(watch) = net.before_round(&self.hand, self.now(), stopping) {
                unwatch(&mut answers);
                readable = u64::MAX;
                // Said before looking again: a thread that stops polling after the look below
                // sees it and wakes this one (see `Drive::rest`).
                self.hand.set_watching(true);
                if self.hand.polled_lately(self.now()) {
                    rackwire_udp::wait(&[], &self.waker, Some(us(watch)));
                    net.watched(&self.hand);
                }
                self.hand.set_watching(false);
                continue;
            }
            let mut st = lock(&self.state);
            let w = self.round(&mut st, &mut io, &mut target, self.now(), false, readable);
            readable = u64::MAX;
            let next = {
                let State { conns, rounds, .. } = &mut *st;
                rounds.next_round_due(conns)
            };
            // Whether the round handed messages over and what follows is the spin: a round
            // that ended early; or one that took a lone frame and handed its message over (a
            // ping-pong's packet, in a round that could not end early: as urgent as the
            // others). Not a round of a stream's frames: a yield then gives the core to the
            // programs that fill the stream and delays the acknowledgements and frames still
            // to come (a TCP stream across racks lost about a tenth of its rate so).
            // (Messages the round took for the handler wait in `handed` until the hand-over
            // below.)
            let relayed = st.rounds.ended_early() || (w.got == 1 && self.handed_any.load(Ordering::Acquire));
            let idle = !stopping && w.got + w.sent == 0;
            // A round that found no work says, under the state's lock, until when this thread
            // will sleep (a submission after this sees it and wakes it for an earlier timer).
            // Any other reads the clock once after the hand-over below (what the round took
            // goes first: the clock and the bookkeeping cost about 0.1 µs on that path).
            let idle_now = idle.then(|| {
                let now = self.now();
                self.hand.park_until(now + proto::driver::wait_for(next, now));
                now
            });
            drop(st);
            self.hand_over();
            let now = idle_now.unwrap_or_else(|| self.now());
            net.worked(now, w);
            if stopping {
                unwatch(&mut answers);
                return;
            }
            let mut again = false;
            if !idle {
                // Between rounds too, while the handler's own thread leaves its descriptor
                // to this one (a stream's answers come while frames keep coming).
                let answered = self.take_answers(&mut answers, unwatch);
                if answered {
                    net.answered(self.now());
                }
                answer_due = relayed && !answered && answers.is_some();
                // Another round at once, unless this one handed messages over (into rw0) and
                // has nothing gathered to send: then the lockless spin below, as a round now
                // would hold the state's lock (through a receive call per link) just when the
                // thread the handed messages woke (the virtual NIC's, with an answer) wants it
                // to send. (Skipping the round after every piece of work, not only these,
                // slowed 1 MiB transfers on a rack's rails by 4-15%.) After several frames
                // (a stream's) a look first, and another round at once if more came. After a
                // lone frame (a ping-pong's) the spin, which yields before it looks: the
                // program the handed packet woke most likely runs on this core (a small
                // host's), and when the kernel did not switch to it during the hand-over
                // (about a quarter of a cross-rack ping-pong's, traced), a look first would
                // find nothing and hold the program back by its system call.
                again = !relayed || self.hand.gathered() || (w.got > 1 && look(&answers).links);
            }
            match net.after_round(&self.hand, now, w, again, next) {
                After::Again => {
                    // An application thread that started polling does the work now (see the
                    // top).
                    self.hand.park_until(AWAKE);
                }
                After::Spin { until } => {
                    // In a stream, the next acknowledgement or frame is usually microseconds
                    // away: look again for a moment before paying for a sleep and a wake-up.
                    // The looks ask only whether a socket is readable (or the waker woken),
                    // without the state's lock: a thread that sends takes that lock, and
                    // rounds taken back to back held it off for the whole spin (each reply
                    // through rw0 across racks waited for it). A timer due meanwhile ends the
                    // spin. The edge message handler's own descriptor is watched too (see
                    // `crate::EdgeWatch`): what this thread just handed over is often answered
                    // there within the spin, and taken at once, without waking another thread.
                    self.hand.park_until(AWAKE);
                    let wake = now + proto::driver::wait_for(next, now);
                    let mut until = until;
                    if answers.is_none() {
                        answers = self.fabric.upgrade().and_then(|n| read(&n.edge_watch).clone());
                        if let Some(w) = &answers {
                            w.watching(true);
                        }
                    }
                    loop {
                        // A thread of this core that has work (the one this frame woke, on a
                        // small host) goes first.
                        std::thread::yield_now();
                        // Its answer, if it ran, taken before the look (a take that finds
                        // nothing costs about what the look would; once only, then the looks).
                        let mut took = std::mem::take(&mut answer_due) && self.take_answers(&mut answers, unwatch);
                        let ready = look(&answers);
                        took |= ready.also && self.take_answers(&mut answers, unwatch);
                        if took {
                            // What it took went out at once, or is gathered for the next
                            // round: either way, an answer to it is what comes next.
                            net.answered(self.now());
                            until = net.spin_end().min(wake);
                        }
                        if ready.links || self.hand.gathered() || self.now() >= until {
                            readable = ready.readable;
                            break;
                        }
                    }
                }
                After::Park { until } => {
                    unwatch(&mut answers);
                    let wait = us(until.saturating_sub(self.now()));
                    readable = rackwire_udp::wait_with(&self.socks, &self.waker, None, Some(wait)).readable;
                    self.hand.park_until(AWAKE);
                }
            }
        }
    }

    /// Take what waits on the watched descriptor, if `answers` is still the fabric's watch;
    /// else stop watching it (`unwatch`). The fabric's watch is read-locked while the watch
    /// takes, so once [`crate::EdgeHooks::clear_watch`] (or a new watch) returns, the watch
    /// it replaced is never taken from again. True when something was taken.
    fn take_answers(
        &self,
        answers: &mut Option<Arc<dyn EdgeWatch>>,
        unwatch: impl Fn(&mut Option<Arc<dyn EdgeWatch>>),
    ) -> bool {
        let Some(mine) = answers.as_ref() else { return false };
        let current = self.fabric.upgrade().map(|n| {
            let w = read(&n.edge_watch);
            w.as_ref().filter(|w| Arc::ptr_eq(w, mine)).map(|w| w.take())
        });
        match current.flatten() {
            Some(took) => took,
            None => {
                unwatch(answers);
                false
            }
        }
    }

    /// A frame arrived on link `l` from `from`: find (or open) its connection and feed it.
    /// True when the connection has events to hand over, or a signal landed.
    pub(super) fn deliver(
        &self,
        conns: &mut Conns,
        l: usize,
        frame: &[u8],
        from: SocketAddr,
        now: proto::Time,
        target: &mut FabricTarget<'_>,
    ) -> bool {
        // A peer whose node key is not known yet is left unanswered while it is looked up:
        // its handshake repeats its first frame.
        let accept = |local, i: proto::Incoming| {
            let key = self.fabric.upgrade()?.known_peer_key(i.peer)?;
            let cfg = self.proto_config(i.links);
            let nonce = rackwire_mh::auth::nonce();
            Some(Connection::accept(cfg, self.me, &self.creds, i.peer, key, nonce, local, now))
        };
        let routed = conns.handle(now, l, from, frame, target, accept);
        // A first frame under load is answered with a Retry (nothing kept for it): sent at
        // once, from the link it came in on.
        while let Some((to, link, retry)) = conns.next_retry() {
            if let Some(sock) = self.socks.get(link) {
                let _ = sock.send_batch(&[rackwire_udp::OutFrame { head: &retry, body: &[], to }]);
            }
        }
        let local = match routed {
            proto::Routed::Conn(local) | proto::Routed::Accepted(local) => local,
            proto::Routed::Dropped => return false,
        };
        conns.get(local).is_some_and(|s| s.conn().has_events() || s.conn().is_signalled())
    }

    /// A connection whose every link is down: the peer is unreachable, which is not gone. The
    /// management host is asked now and then whether it is gone; when it says so, the
    /// connection closes at once (its operations fail with `PeerGone`) instead of waiting out
    /// the peer timeout. True when it closed.
    fn unreachable(
        &self,
        node: &Node,
        local: u32,
        s: &mut proto::Session<SocketAddr, Pending>,
        asked: &mut proto::OwnIdMap<u32, proto::Time>,
        now: proto::Time,
    ) -> bool {
        if node.reported_gone(s.peer()) {
            debug!(peer = s.peer(), "edge connection closed: the management host says its peer is gone");
            s.conn_mut().close(now);
            self.closings.fetch_add(1, Ordering::Release);
            return true;
        }
        let last = asked.entry(local).or_insert(0);
        if *last == 0 || now >= *last + PEER_CHECK_EVERY_US {
            *last = now.max(1);
            node.check_peer(s.peer(), s.addrs().map(|a| a.to_string()).collect());
        }
        false
    }

    /// Messages go to an edge message handler as they arrive (none waits to be taken).
    pub(super) fn hands_messages_over(&self) -> bool {
        self.handler().is_some()
    }

    /// The fabric's edge message handler, if one is set.
    fn handler(&self) -> Option<&MessageHandler> {
        if let Some(h) = self.handler.get() {
            return Some(h);
        }
        let h = self.fabric.upgrade()?.edge_messages.get()?.clone();
        Some(self.handler.get_or_init(|| h))
    }

    /// With an edge message handler set, take every connection's delivered messages for it
    /// (handed over by [`EdgeEndpoint::hand_over`] once the state's lock is released).
    /// True when nothing is left for a receiving thread (no notification waits either).
    fn take_for_handler(&self, conns: &mut Conns) -> bool {
        if !self.hands_messages_over() {
            return false;
        }
        let mut handed = lock(&self.handed);
        let mut all = true;
        for (_, s) in conns.iter_mut() {
            let peer = s.peer();
            while let Some(m) = s.next_message() {
                handed.push((peer, m));
            }
            all &= s.nothing_to_take();
        }
        if !handed.is_empty() {
            self.handed_any.store(true, Ordering::Release);
        }
        all
    }

    /// Turn connection events into completed handles, messages and notifications, and ring
    /// this node's doorbell for a message or notification a receiving thread is to take (not
    /// for messages taken for the edge message handler). True when there was such a one, or a
    /// signal landed in this node's memory (a thread polling its word will see it once the
    /// round returns). With `hold`, a connection that did either holds its answers until
    /// then.
    pub(super) fn dispatch(&self, conns: &mut Conns, closing: &mut Vec<u32>, hold: Option<proto::Time>) -> bool {
        let mut register = Vec::new();
        let mut gone = Vec::new();
        let polled = conns.poll(hold, |local, peer, h| match h {
            proto::Happened::Connected { accepted } => {
                // A connection opened here is registered by whoever opened it.
                if accepted {
                    register.push((local, peer));
                }
            }
            proto::Happened::Completed { op, result } => op.cell.complete(completion(peer, &op, result)),
            // Every connection has delivery bounds: messages and notifications wait in them.
            proto::Happened::Delivered(_) => {}
            proto::Happened::LinkDown(l) => warn!(peer, link = l, "edge link down"),
            proto::Happened::LinkUp(l) => debug!(peer, link = l, "edge link up"),
            proto::Happened::PathCut { frame_len, agreed } => warn!(
                peer,
                frame_len,
                agreed,
                "the path to this node drops frames of the agreed length: frames cut to {frame_len} bytes \
                 (set link_mtu to what every switch between the hosts carries)"
            ),
            proto::Happened::Closed(why) => {
                debug!(peer, ?why, "edge connection closed");
                gone.push(local);
            }
        });
        // Closed connections go once their last frames (a close) are sent: see `transmit`.
        if !gone.is_empty() {
            self.closings.fetch_add(1, Ordering::Release);
        }
        closing.extend(gone);
        // Messages taken for the handler need no receiving thread: the doorbell rings only
        // for what still waits to be taken.
        let woke = polled.delivered && !self.take_for_handler(conns);
        let up = || Some((self.fabric.upgrade()?, self.this.upgrade()?));
        if let Some((f, ep)) = (!register.is_empty()).then(up).flatten() {
            for (local, peer) in register {
                let p: Arc<dyn PeerTransport> = Arc::new(EdgePeer::new(ep.clone(), local, peer));
                if let Err(e) = f.add_peer(p) {
                    warn!(peer, "edge connection not registered: {e}");
                }
            }
        }
        if woke {
            if let Some(f) = self.fabric.upgrade() {
                f.doorbell.ring_local();
            }
        }
        woke || polled.signalled
    }
}
