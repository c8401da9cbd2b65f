//! Driving the endpoint: a round takes in what arrived, fires timers, sends, and turns
//! connection events into completed operations, messages and notifications; the network
//! thread runs rounds when no application thread does, and sleeps when nothing is due.

use rackwire_udp::RecvLink;

use crate::sync::read;
use crate::watch::EdgeWatch;

use super::spin::Spin;

use super::{
    completion, debug, lock, proto, warn, Arc, Connection, ControlFlow, Drive, Duration, EdgeEndpoint, EdgePeer,
    FabricTarget, Instant, Io, MessageHandler, Node, Ordering, PeerTransport, Pending, SocketAddr, State,
    ANSWER_HOLD_US, AWAKE, IDLE_WAIT_MAX, PEER_CHECK_EVERY_US, PUMP_RECENT_US, RECV_BURST,
};

/// Whether a connection owes a frame at once (see `Connection::owes_now`).
fn owed(st: &State) -> bool {
    st.conns.sessions().any(|s| s.conn().owes_now())
}

/// Whether a round that hands over what it took (`frames` of them) may end early though the
/// round before did too: only for a lone frame (a ping-pong's, not a stream's: a stream whose
/// rounds end early in a row goes to the spin without a look at its sockets, and loses rate),
/// while nothing waits for a whole round (no operation
/// gathered to send and no frame owed at once, `waiting` false; no deadline known to have
/// passed, `due`), and the last whole round ran (at `whole_at`) less than [`ANSWER_HOLD_US`]
/// before `now`: an answer held, or a deadline moved earlier since `due` was taken, waits no
/// longer than a hold. A ping-pong through rw0 across racks so hands every packet over first,
/// not every other one (the whole round in between cost those packets about 0.3 µs each).
fn may_end_early_again(
    frames: usize,
    waiting: bool,
    now: proto::Time,
    whole_at: proto::Time,
    due: Option<proto::Time>,
) -> bool {
    frames == 1 && !waiting && now < whole_at + ANSWER_HOLD_US && due.is_none_or(|t| t > now)
}

impl EdgeEndpoint {
    /// One round of work: drain the sockets, fire due timers, dispatch events, send. `app`:
    /// an application thread runs it (polling while it waits), and answers to what it hands
    /// that thread are held for the reply it is likely to send next. `readable`: the links to
    /// read, one bit each (a look just before found the others empty; `u64::MAX`: all).
    /// Returns (frames received, frames sent).
    pub(super) fn round(
        &self,
        st: &mut State,
        io: &mut Io,
        target: &mut FabricTarget<'_>,
        now: proto::Time,
        app: bool,
        readable: u64,
    ) -> (usize, usize) {
        // A hold lasts until the next round: whoever runs it, the reply did not come first.
        let released = st.conns.release_holds();
        let mut got = 0;
        let mut more = false;
        // After a round that found every socket empty, a frame that gives a connection
        // something to hand over (a completion, a message, a notification) is most likely
        // alone (a ping-pong): it ends the receiving and is handed over before the look that
        // would find its socket empty (a system call). The next round, which follows at once,
        // reads every link to the end, so no link waits behind another and timers do run.
        let may_break = st.quiet;
        let mut hand = false;
        'links: for (l, sock) in self.socks.iter().enumerate() {
            // A link a look just found empty is left for the next look: a receive call for
            // nothing costs about as much as the look.
            if l < 64 && readable & (1 << l) == 0 {
                continue;
            }
            let mut taken = 0;
            while taken < RECV_BURST {
                let each = |frame: &[u8], from| {
                    let events = self.deliver(st, l, frame, from, now, target) && may_break;
                    hand |= events;
                    if events {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                };
                // Through the link trait, so a wrapper (faults, tracing, capture) may sit here.
                match RecvLink::recv_batch(&mut &*sock, &mut io.rx, each) {
                    Ok(n) => {
                        taken += n;
                        if hand && !io.rx.drained() {
                            // Frames may still wait (and with them acknowledgements): no
                            // timers until they are read.
                            got += taken;
                            more = true;
                            break 'links;
                        }
                        // The socket was found empty: looking again now would cost a system
                        // call for nothing.
                        if io.rx.drained() {
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
        st.quiet = got == 0;
        if got > 0 {
            self.busy_at(now);
        }
        // Timers (and loss detection) wait while frames are still queued: after a stall, the
        // acknowledgements not yet read would otherwise make frames look lost. Connections are
        // looked at only when frames arrived, something changed, or a deadline passed.
        let look = !more && (got > 0 || st.stale || st.due.is_some_and(|t| t <= now));
        let unsent = std::mem::take(&mut st.unsent);
        self.gathered.store(false, Ordering::Relaxed);
        if got == 0 && !look && !released && !unsent {
            // Nothing arrived, changed or fell due: no connection has anything to hand over or
            // to send (the polling loop's usual round, kept short: a frame that lands during it
            // waits for the next look).
            return (0, 0);
        }
        // What arrived is handed over first. An application thread handed a notification or a
        // message goes back to its caller at once (it usually replies, and the reply carries
        // the held answers); timers and sending wait for the next round, which follows at
        // once.
        // The network thread does the same with messages it took for the edge message handler
        // (the virtual NIC's): it hands them over (into rw0) before it sends anything, and
        // holds the answers for the reply that another thread (the virtual NIC's) may send
        // within microseconds; its lockless spin (see `run`) gives that thread the lock, and
        // the round after it sends what no reply took.
        let relay = !app && got > 0 && self.hands_messages_over();
        let handed = self.dispatch(st, (app || relay).then_some(now + ANSWER_HOLD_US));
        let relayed = relay && self.handed_any.load(Ordering::Acquire);
        let shortcut = ((app && handed) || relayed)
            && (!st.shortcut || may_end_early_again(got, unsent || owed(st), now, st.whole_at, st.due));
        st.shortcut = shortcut;
        if shortcut {
            st.stale = true;
            // What submissions gathered still waits to go (next round, or a flush).
            st.unsent |= unsent;
            self.gathered.store(unsent, Ordering::Relaxed);
            return (got, 0);
        }
        st.whole_at = now;
        let (mut fired, due) = if look { st.conns.handle_timeouts(now, target) } else { (false, None) };
        if look {
            if let Some(n) = self.fabric.upgrade() {
                let State { conns, gone_asked, .. } = st;
                for (local, s) in conns.iter_mut().filter(|(_, s)| s.is_unreachable()) {
                    fired |= self.unreachable(&n, local, s, gone_asked, now);
                }
            }
            if fired {
                self.dispatch(st, None);
            }
        }
        let sent = self.transmit(st, now, io);
        if look && !fired && sent == 0 {
            st.due = due;
            st.stale = false;
        } else if look || got > 0 || sent > 0 {
            st.stale = true;
        }
        (got, sent)
    }

    /// Make progress from a waiting application thread (busy polling), if the network thread
    /// is not at it right now and the transport is in use (see [`QUIET_AFTER_US`]). True when
    /// something was received or sent.
    pub(crate) fn pump(&self) -> bool {
        let now = self.now();
        if self.quiet_at(now) {
            self.leave_sockets();
            return false;
        }
        let Ok(mut st) = self.state.try_lock() else {
            // Polling all the same: the network thread stays out of the way.
            self.last_pump_us.store(now, Ordering::Relaxed);
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
        self.last_pump_us.store(now, Ordering::Relaxed);
        let mut io = lock(&self.app_io);
        let mut target = FabricTarget { fabric: &self.fabric };
        let (got, sent) = self.round(st, &mut io, &mut target, now, true, u64::MAX);
        got + sent > 0
    }

    /// Nothing is coming this way lately: the network thread reads the sockets (it sleeps
    /// until a frame comes) and a polling thread's look costs no system call. Said once: a
    /// thread still marked as polling stops being so.
    pub(super) fn leave_sockets(&self) {
        if self.last_pump_us.load(Ordering::Relaxed) != 0 {
            self.rest();
        }
    }

    /// The transport counts as in use now, as when a frame arrives (a test drives it by hand).
    #[cfg(test)]
    pub(crate) fn mark_busy(&self) {
        self.busy_at(self.now());
    }

    /// Make the network thread's looks while an application thread polls this far apart.
    #[cfg(test)]
    pub(crate) fn set_watch(&self, d: Duration) {
        for w in &self.watch_us {
            w.store(d.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// The network thread only watches a polling application thread.
    #[cfg(test)]
    pub(crate) fn is_watching(&self) -> bool {
        self.watching.load(Ordering::SeqCst)
    }

    /// An application thread pumped within [`PUMP_RECENT_US`] of `now`.
    pub(super) fn polled_lately(&self, now: proto::Time) -> bool {
        now.saturating_sub(self.last_pump_us.load(Ordering::SeqCst)) < PUMP_RECENT_US
    }

    /// The network thread: works while there is work, looks again for a while after it (see
    /// [`Spin`]: long enough to see the answer to what it sent, if answers came that soon),
    /// then blocks until a frame arrives, a timer is due or an operation is submitted. Latency
    /// comes from the waiting application threads, which poll (see [`EdgeEndpoint::pump`]);
    /// while one does, this thread leaves it the sockets and the core (see [`PUMP_WATCH`]).
    /// While it is awake after work, it also watches the edge message handler's descriptor,
    /// if one is set ([`crate::EdgeWatch`]).
    pub(super) fn run(self: Arc<Self>) {
        let mut io = Io::new(self.socks.len());
        let mut target = FabricTarget { fabric: &self.fabric };
        let mut last_work = Instant::now();
        let mut spin = Spin::new();
        // The links the next round reads: those the last look found readable, if a look came
        // just before it; else all.
        let mut readable = u64::MAX;
        let watch_us = |i: usize| Duration::from_micros(self.watch_us[i].load(Ordering::Relaxed));
        let mut watch = watch_us(0);
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
        loop {
            let stopping = self.stop.load(Ordering::SeqCst);
            if !stopping && self.polled_lately(self.now()) {
                unwatch(&mut answers);
                readable = u64::MAX;
                // Said before looking again: a thread that stops polling after the look below
                // sees it and wakes this one (see `Drive::rest`).
                self.watching.store(true, Ordering::SeqCst);
                if self.polled_lately(self.now()) {
                    rackwire_udp::wait(&[], &self.waker, Some(watch));
                    watch = (watch * 2).min(watch_us(1));
                }
                self.watching.store(false, Ordering::SeqCst);
                continue;
            }
            watch = watch_us(0);
            let mut st = lock(&self.state);
            let (got, sent) = self.round(&mut st, &mut io, &mut target, self.now(), false, readable);
            readable = u64::MAX;
            // This thread's round ends early only when it handed messages to the edge message
            // handler (see `round`), and the next one ends early too only before the deadline
            // known before it (see `may_end_early_again`): that deadline bounds the spin in
            // between, and nobody waits for the connections' timers to be looked at here.
            let next = if st.shortcut { st.due } else { st.next_due() };
            // Whether the round handed messages over and what follows is the spin: a round
            // that ended early; or one that took a lone frame and handed its message over (a
            // ping-pong's packet, in a round that could not end early: as urgent as the
            // others). Not a round of a stream's frames: a yield then gives the core to the
            // programs that fill the stream and delays the acknowledgements and frames still
            // to come (a TCP stream across racks lost about a tenth of its rate so).
            // (Messages the round took for the handler wait in `handed` until the hand-over
            // below.)
            let relayed = st.shortcut || (got == 1 && self.handed_any.load(Ordering::Acquire));
            let idle = !(stopping || got > 0 || sent > 0);
            let clock = || {
                let at = Instant::now();
                (at, at.saturating_duration_since(self.start).as_micros() as proto::Time)
            };
            let wait_at = |now: proto::Time| {
                next.map_or(IDLE_WAIT_MAX, |t| Duration::from_micros(t.saturating_sub(now)).min(IDLE_WAIT_MAX))
            };
            // One reading of the clock for what follows, after the hand-over below (what the
            // round took goes first: the clock, the spin's bookkeeping and the wait cost
            // about 0.1 µs on that path); but under the state's lock in a round that found no
            // work, which publishes there when this thread wakes next (a submission after
            // this sees it).
            let idle_clock = idle.then(|| {
                let (at, now) = clock();
                self.parked_until_us.store(now + wait_at(now).as_micros() as u64, Ordering::SeqCst);
                (at, now)
            });
            drop(st);
            self.hand_over();
            let (at, now) = idle_clock.unwrap_or_else(clock);
            if got > 0 {
                spin.received(at);
            }
            if sent > 0 {
                spin.sent(at);
            }
            let wait = wait_at(now);
            if stopping {
                unwatch(&mut answers);
                return;
            }
            if !idle {
                last_work = at;
                // Between rounds too, while the handler's own thread leaves its descriptor
                // to this one (a stream's answers come while frames keep coming).
                let answered = self.take_answers(&mut answers, unwatch);
                if answered {
                    spin.sent(Instant::now());
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
                if !relayed || self.gathered.load(Ordering::Acquire) || (got > 1 && look(&answers).links) {
                    continue;
                }
            } else if self.polled_lately(now) {
                // An application thread started polling: it does the work now (see the top).
                self.parked_until_us.store(AWAKE, Ordering::SeqCst);
                continue;
            }
            // In a stream, the next acknowledgement or frame is usually microseconds away:
            // look again for a moment before paying for a sleep and a wake-up. The looks ask
            // only whether a socket is readable (or the waker woken), without the state's
            // lock: a thread that sends takes that lock, and rounds taken back to back held it
            // off for the whole spin (each reply through rw0 across racks waited for it).
            // A timer due meanwhile ends the spin.
            // The edge message handler's own descriptor is watched too (see
            // `crate::EdgeWatch`): what this thread just handed over is often answered there
            // within the spin, and taken at once, without waking another thread.
            let spin_for = spin.length();
            if last_work.elapsed() < spin_for {
                self.parked_until_us.store(AWAKE, Ordering::SeqCst);
                let due = Instant::now() + wait;
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
                        // What it took went out at once, or is gathered for the next round:
                        // either way, an answer to it is what comes next.
                        last_work = Instant::now();
                        spin.sent(last_work);
                    }
                    if ready.links
                        || self.gathered.load(Ordering::Acquire)
                        || last_work.elapsed() >= spin_for
                        || Instant::now() >= due
                    {
                        readable = ready.readable;
                        break;
                    }
                }
                continue;
            }
            unwatch(&mut answers);
            readable = rackwire_udp::wait_with(&self.socks, &self.waker, None, Some(wait)).readable;
            self.parked_until_us.store(AWAKE, Ordering::SeqCst);
        }
    }

    /// Take what waits on the watched descriptor, if `answers` is still the fabric's watch;
    /// else stop watching it (`unwatch`). The fabric's watch is read-locked while the watch
    /// takes, so once [`crate::Fabric::clear_edge_watch`] (or a new watch) returns, the watch
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
        st: &mut State,
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
        let routed = st.conns.handle(now, l, from, frame, target, accept);
        // A first frame under load is answered with a Retry (nothing kept for it): sent at
        // once, from the link it came in on.
        while let Some((to, link, retry)) = st.conns.next_retry() {
            if let Some(sock) = self.socks.get(link) {
                let _ = sock.send_batch(&[rackwire_udp::OutFrame { head: &retry, body: &[], to }]);
            }
        }
        let local = match routed {
            proto::Routed::Conn(local) | proto::Routed::Accepted(local) => local,
            proto::Routed::Dropped => return false,
        };
        st.conns.get(local).is_some_and(|s| s.conn().has_events() || s.conn().is_signalled())
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
    fn take_for_handler(&self, st: &mut State) -> bool {
        if !self.hands_messages_over() {
            return false;
        }
        let mut handed = lock(&self.handed);
        let mut all = true;
        for (_, s) in st.conns.iter_mut() {
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
    pub(super) fn dispatch(&self, st: &mut State, hold: Option<proto::Time>) -> bool {
        let mut register = Vec::new();
        let mut gone = Vec::new();
        let polled = st.conns.poll(hold, |local, peer, h| match h {
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
        st.closing.extend(gone);
        // Messages taken for the handler need no receiving thread: the doorbell rings only
        // for what still waits to be taken.
        let woke = polled.delivered && !self.take_for_handler(st);
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

#[cfg(test)]
mod tests {
    use super::*;

    // Checks when a round may end early right after one that did: with a lone frame, within
    // a hold of the last whole round, nothing waiting and no deadline passed it may; with
    // several frames (a stream's), at or past a hold since the last whole round, with
    // something waiting (operations gathered, a frame owed at once), or with a deadline
    // reached it may not (the whole round runs, with the timers and the sending).
    #[test]
    fn rounds_end_early_in_a_row_only_for_lone_frames_within_a_hold_of_a_whole_one() {
        let whole = 1_000;
        assert!(may_end_early_again(1, false, whole + 1, whole, None));
        assert!(may_end_early_again(1, false, whole + ANSWER_HOLD_US - 1, whole, Some(whole + ANSWER_HOLD_US)));
        assert!(!may_end_early_again(2, false, whole + 1, whole, None));
        assert!(!may_end_early_again(1, false, whole + ANSWER_HOLD_US, whole, None));
        assert!(!may_end_early_again(1, true, whole + 1, whole, None));
        assert!(!may_end_early_again(1, false, whole + 10, whole, Some(whole + 10)));
        assert!(!may_end_early_again(1, false, whole + 10, whole, Some(whole + 5)));
    }
}
