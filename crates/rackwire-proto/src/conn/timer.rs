//! The connection's deadlines: one enum of their sources, the next deadline the minimum over
//! them, and one loop that acts on those due.
//!
//! Deadlines are not stored: each is computed from the state it is about (the oldest frame in
//! flight on a link, the oldest operation, the last time a link was heard...), so none can go
//! stale when that state changes. Some timers only wake the driver: what is due then leaves
//! in [`Connection::poll_transmit_to`] (a handshake step to repeat, an acknowledgement,
//! answers whose hold ended).

use rackwire_wire::ProbeRepr;

use super::{CloseReason, Connection, Event, State};
use crate::{OpError, Target, Time};

/// Where a connection's deadlines come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timer {
    /// Nothing heard from the peer on any link for the idle timeout (the handshake timeout
    /// while handshaking): the connection closes.
    Idle,
    /// The oldest operation ran out of time: it fails with [`OpError::Timeout`].
    OpExpiry,
    /// A handshake step gets no reply: it is sent again (wakes the driver).
    HandshakeRetry,
    /// An acknowledgement is due (wakes the driver).
    Ack,
    /// Held answers may go alone (wakes the driver).
    AnswerHold,
    /// Frames arrived: losses are looked for once all that came together are in.
    LossScan,
    /// The oldest frame in flight on some link is due to be declared lost.
    Loss,
    /// A link's probe went unanswered, or a quiet link is due to be probed.
    Probe,
}

impl Timer {
    /// Every timer, in the order they are acted on when several are due.
    pub(super) const ALL: [Timer; 8] = [
        Timer::Idle,
        Timer::OpExpiry,
        Timer::HandshakeRetry,
        Timer::Ack,
        Timer::AnswerHold,
        Timer::LossScan,
        Timer::Loss,
        Timer::Probe,
    ];
}

impl Connection {
    /// When `t` falls due, if it is set.
    pub(super) fn deadline(&self, t: Timer) -> Option<Time> {
        let established = self.state == State::Established;
        match t {
            Timer::Idle if self.state == State::Handshaking => {
                Some(self.last_heard + self.cfg.idle_timeout_us.min(self.cfg.handshake_timeout_us))
            }
            Timer::Idle => Some(self.last_heard + self.cfg.idle_timeout_us),
            Timer::OpExpiry => self.ops.next_deadline(),
            Timer::HandshakeRetry if self.state == State::Handshaking => {
                self.hs_last.map(|last| last + self.cfg.handshake_retry_us)
            }
            Timer::HandshakeRetry => None,
            Timer::Ack => self.recv.ack_deadline().filter(|_| established),
            Timer::AnswerHold => (established && !self.responses.is_empty() && self.answers_held_until > 0)
                .then_some(self.answers_held_until),
            Timer::LossScan => (established && self.losses_due).then_some(0),
            Timer::Loss if established => {
                // A link's deadlines grow with the send time: its oldest frame has the first.
                let first = (0..self.links.len())
                    .filter_map(|l| self.counted_on_link(l).next())
                    .map(|(_, s)| self.loss_due(s))
                    .min();
                // Checked against every frame in debug builds (the test suite and the simulator).
                debug_assert_eq!(
                    first,
                    self.inflight.iter().filter(|(_, s)| s.counted_on.is_some()).map(|(_, s)| self.loss_due(s)).min(),
                    "the links' send order lost track of a frame's deadline"
                );
                first
            }
            Timer::Loss => None,
            Timer::Probe if established => self
                .links
                .iter()
                .map(|l| match l.probe {
                    Some((_, sent)) => sent + self.cfg.probe_timeout_us,
                    None => l.last_heard + self.cfg.probe_interval_us,
                })
                .chain(self.path_deadline())
                .min(),
            Timer::Probe => None,
        }
    }

    /// When [`Connection::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Time> {
        if matches!(self.state, State::Closed(_)) {
            return None;
        }
        Timer::ALL.iter().filter_map(|&t| self.deadline(t)).min()
    }

    /// Time passed: act on every timer that is due.
    pub fn handle_timeout(&mut self, now: Time, _target: &mut dyn Target) {
        for t in Timer::ALL {
            if matches!(self.state, State::Closed(_)) {
                break;
            }
            if self.deadline(t).is_some_and(|d| now >= d) {
                self.on_timer(t, now);
            }
        }
        self.check_invariants();
    }

    fn on_timer(&mut self, t: Timer, now: Time) {
        match t {
            Timer::Idle if self.state == State::Handshaking => self.handshake_timed_out(),
            Timer::Idle => self.shut(CloseReason::IdleTimeout),
            Timer::OpExpiry => {
                for op in self.ops.expire(now) {
                    self.events.push_back(Event::Completed { op, result: Err(OpError::Timeout) });
                }
            }
            Timer::HandshakeRetry | Timer::Ack | Timer::AnswerHold => {}
            Timer::LossScan | Timer::Loss => self.detect_losses(now),
            Timer::Probe => {
                self.probe_links(now);
                self.path_timeouts(now);
            }
        }
    }

    /// Each link whose probe went unanswered counts a miss (and goes down after too many: its
    /// frames are declared lost and go on the others); a quiet link gets a probe.
    fn probe_links(&mut self, now: Time) {
        for i in 0..self.links.len() {
            let l = &mut self.links[i];
            match l.probe {
                Some((_, sent)) if now >= sent + self.cfg.probe_timeout_us => {
                    let went_down = l.probe_missed(self.cfg.probes_missed_max);
                    if went_down {
                        self.events.push_back(Event::LinkDown(i));
                        let seqs: Vec<u64> =
                            self.inflight.iter().filter(|(_, s)| s.counted_on == Some(i)).map(|(q, _)| q).collect();
                        for seq in seqs {
                            self.lose(now, seq, false);
                        }
                        self.trim_sent_order();
                    }
                }
                Some(_) => {}
                None if now.saturating_sub(l.last_heard) >= self.cfg.probe_interval_us => l.probe_due = true,
                None => {}
            }
        }
    }

    /// A probe's reply: the link answers (and is up again if it was down).
    pub(super) fn on_probe_reply(&mut self, now: Time, link: usize, p: ProbeRepr) {
        if self.links[link].probe_answered(p.token, now) {
            self.events.push_back(Event::LinkUp(link));
            self.path_link_up(link);
        }
    }
}
